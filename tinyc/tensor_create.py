"""Layer 6: Tensor construction (a mixin of Tensor): constants that take no memory until realized, ranges, identity
matrices and random tensors (made from a numpy Generator that manual_seed resets). Imports helpers, dtype, ops, device, lazy.
"""
from __future__ import annotations
import math, time
from typing import Any, ClassVar, Sequence
import numpy as np
from tinyc.dtype import DType, dtypes
from tinyc.helpers import argfix, keyword_aliases, prod
from tinyc.ops import LoadOps
from tinyc.device import Device
from tinyc.lazy import LazyBuffer

Scalar = int | float | bool

class CreationMixin:
  _rng: ClassVar[np.random.Generator] = np.random.default_rng(int(time.time()))

  @classmethod
  def _shape(cls: Any, shape: tuple[Any, ...]) -> tuple[int, ...]:
    dims = argfix(*shape)
    if not all(isinstance(d, int) and d >= 0 for d in dims): raise ValueError(f"a shape needs non-negative ints, got {dims}")
    return dims
  @classmethod
  def full(cls: Any, shape: Sequence[int] | int, fill_value: Scalar, **kwargs: Any) -> Any:
    """A tensor of `shape` filled with `fill_value` (no memory until realized)."""
    dims = cls._shape((shape,))
    return cls(fill_value, **kwargs).reshape((1,) * len(dims)).expand(dims)
  @classmethod
  def zeros(cls: Any, *shape: Any, **kwargs: Any) -> Any: return cls.full(cls._shape(shape), 0.0 if "dtype" not in kwargs else 0, **kwargs)
  @classmethod
  def ones(cls: Any, *shape: Any, **kwargs: Any) -> Any: return cls.full(cls._shape(shape), 1.0 if "dtype" not in kwargs else 1, **kwargs)
  @classmethod
  def empty(cls: Any, *shape: Any, device: str | None = None, dtype: DType | None = None, **kwargs: Any) -> Any:
    dims, dtype = cls._shape(shape), dtype or dtypes.default_float
    return cls(LazyBuffer.loadop(LoadOps.EMPTY, dims, dtype, Device.canonicalize(device)), device=device, **kwargs)
  def full_like(self: Any, fill_value: Scalar, **kwargs: Any) -> Any:
    return type(self).full(self.shape, fill_value, dtype=kwargs.pop("dtype", self.dtype), device=kwargs.pop("device", self.device), **kwargs)
  def zeros_like(self: Any, **kwargs: Any) -> Any: return self.full_like(0, **kwargs)
  def ones_like(self: Any, **kwargs: Any) -> Any: return self.full_like(1, **kwargs)
  @classmethod
  def arange(cls: Any, start: Scalar, stop: Scalar | None = None, step: Scalar = 1, **kwargs: Any) -> Any:
    """Values from start (inclusive) to stop (exclusive) by step, like torch.arange."""
    if stop is None: start, stop = 0, start
    if step == 0: raise RuntimeError("arange: step must be nonzero")
    if (stop - start) * step < 0: raise RuntimeError(f"upper bound and lower bound inconsistent with step sign: arange({start}, {stop}, {step})")
    count = math.ceil((stop - start) / step)
    dtype = kwargs.pop("dtype", dtypes.default_float if any(isinstance(v, float) for v in (start, stop, step)) else dtypes.default_int)
    if count == 0: return cls.empty(0, dtype=dtype, **kwargs)
    # made on the host: O(n) (a cumulative sum through the pooling trick would be O(n^2)); values computed in float64 like torch
    return cls(np.arange(count, dtype=np.float64) * step + start, dtype=dtype, **kwargs)
  @classmethod
  @keyword_aliases(dim="n")  # tinygrad's eye(dim)
  def eye(cls: Any, n: int, m: int | None = None, **kwargs: Any) -> Any:
    """The n x m identity matrix."""
    m = n if m is None else m
    return (cls.arange(n, **{k: v for k, v in kwargs.items() if k == "device"}).reshape(n, 1) ==
            cls.arange(m, **{k: v for k, v in kwargs.items() if k == "device"}).reshape(1, m)).cast(kwargs.get("dtype", dtypes.default_float))
  @classmethod
  def manual_seed(cls: Any, seed: int = 0) -> None:
    """Make every later random tensor reproducible."""
    CreationMixin._rng = np.random.default_rng(seed)
  @classmethod
  def rand(cls: Any, *shape: Any, **kwargs: Any) -> Any:
    """Uniform on [0, 1)."""
    dtype = kwargs.pop("dtype", dtypes.default_float)
    return cls(cls._rng.random(cls._shape(shape), dtype=np.float32), **kwargs).cast(dtype)
  @classmethod
  def randn(cls: Any, *shape: Any, **kwargs: Any) -> Any:
    """Standard normal."""
    dtype = kwargs.pop("dtype", dtypes.default_float)
    return cls(cls._rng.standard_normal(cls._shape(shape), dtype=np.float32), **kwargs).cast(dtype)
  @classmethod
  def normal(cls: Any, *shape: Any, mean: float = 0.0, std: float = 1.0, **kwargs: Any) -> Any: return cls.randn(*shape, **kwargs) * std + mean
  @classmethod
  def uniform(cls: Any, *shape: Any, low: float = 0.0, high: float = 1.0, **kwargs: Any) -> Any:
    dtype = kwargs.pop("dtype", dtypes.default_float)
    return (cls.rand(*shape, **kwargs) * (high - low) + low).cast(dtype)
  @classmethod
  def scaled_uniform(cls: Any, *shape: Any, **kwargs: Any) -> Any:
    return cls.uniform(*shape, low=-1.0, high=1.0, **kwargs) * (max(prod(cls._shape(shape)), 1) ** -0.5)
  @classmethod
  def glorot_uniform(cls: Any, *shape: Any, **kwargs: Any) -> Any:
    dims = cls._shape(shape)
    return cls.uniform(*dims, low=-1.0, high=1.0, **kwargs) * math.sqrt(6 / (dims[0] + prod(dims[1:])))
  @classmethod
  def kaiming_uniform(cls: Any, *shape: Any, a: float = 0.01, **kwargs: Any) -> Any:
    dims = cls._shape(shape)
    bound = math.sqrt(3.0) * math.sqrt(2.0 / (1 + a ** 2)) / math.sqrt(prod(dims[1:]))
    return cls.uniform(*dims, low=-bound, high=bound, **kwargs)
  @classmethod
  def kaiming_normal(cls: Any, *shape: Any, a: float = 0.01, **kwargs: Any) -> Any:
    dims = cls._shape(shape)
    return cls.normal(*dims, mean=0.0, std=math.sqrt(2.0 / (1 + a ** 2)) / math.sqrt(prod(dims[1:])), **kwargs)
