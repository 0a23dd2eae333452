"""Layer 1: data types and PyTorch's type promotion. Imports only numpy and the stdlib."""
from __future__ import annotations
import builtins, functools
from dataclasses import dataclass, field
from typing import Any
import numpy as np

@dataclass(frozen=True, order=True)
class DType:
  """A scalar type: `priority` orders promotion inside a category, `itemsize` is bytes per element. Each dtype is one object (the
  ones in `dtypes` and their vec()s, also after unpickling), so equality and hashing are by identity, in C: dtypes are compared by
  every op and hashed in every key of the scheduler's plans."""
  priority: int
  itemsize: int
  name: str
  np_name: str | None  # numpy's name for it; None where numpy has no such type (bfloat16)
  count: int = 1       # lanes of a vector type (float4 in GPU code: 16-byte loads and stores); 1 for a scalar
  scalar_type: DType | None = field(default=None, compare=False, repr=False)
  __eq__, __hash__ = object.__eq__, object.__hash__
  def __reduce__(self) -> tuple: return _named, (self.scalar().name, self.count)
  def __repr__(self) -> str: return f"dtypes.{self.name}" if self.count == 1 else f"dtypes.{self.scalar().name}.vec({self.count})"
  def vec(self, count: int) -> DType: return _vector(self, count)
  def scalar(self) -> DType: return self.scalar_type if self.scalar_type is not None else self
  @property
  def np(self) -> Any: return np.dtype(self.np_name) if self.np_name is not None else None

class dtypes:
  """The dtypes tinyc knows, with PyTorch's names."""
  bool = DType(0, 1, "bool", "bool")
  int8 = DType(1, 1, "int8", "int8")
  uint8 = DType(2, 1, "uint8", "uint8")
  int16 = DType(3, 2, "int16", "int16")
  uint16 = DType(4, 2, "uint16", "uint16")
  int32 = DType(5, 4, "int32", "int32")
  uint32 = DType(6, 4, "uint32", "uint32")
  int64 = DType(7, 8, "int64", "int64")
  uint64 = DType(8, 8, "uint64", "uint64")
  float16 = DType(9, 2, "float16", "float16")
  bfloat16 = DType(10, 2, "bfloat16", None)
  float32 = DType(11, 4, "float32", "float32")
  float64 = DType(12, 8, "float64", "float64")
  half, float, double, int, long, uint = float16, float32, float64, int32, int64, uint32
  default_float = float32
  default_int = int32  # as in tinygrad: 32-bit index math is what GPUs run fast; cast to int64 explicitly when needed

  @staticmethod
  def is_float(dtype: DType) -> builtins.bool: return dtype in FLOAT_SET
  @staticmethod
  def is_int(dtype: DType) -> builtins.bool: return dtype in INT_SET
  @staticmethod
  def is_unsigned(dtype: DType) -> builtins.bool: return dtype in UNSIGNED_SET
  @staticmethod
  def from_np(np_dtype: Any) -> DType:
    name = np.dtype(np_dtype).name
    if name not in BY_NAME: raise TypeError(f"numpy dtype {name} is not supported; supported: {', '.join(sorted(BY_NAME))}")
    return BY_NAME[name]
  @staticmethod
  def from_py(value: Any) -> DType:
    """The dtype PyTorch gives a tensor made from this Python value (nested lists look at every element)."""
    if isinstance(value, (list, tuple)): return least_upper_dtype(*[dtypes.from_py(v) for v in value]) if value else dtypes.default_float
    if isinstance(value, bool): return dtypes.bool
    if isinstance(value, int): return dtypes.default_int if -2 ** 31 <= value < 2 ** 31 else dtypes.int64  # numpy's rule: wider ints need int64
    if isinstance(value, float): return dtypes.default_float
    raise TypeError(f"cannot make a tensor from a {type(value).__name__}: use a number, a (nested) list or a numpy array")
  @staticmethod
  def min(dtype: DType) -> Any:
    if dtype == dtypes.bool: return False
    if dtypes.is_int(dtype): return 0 if dtypes.is_unsigned(dtype) else -(2 ** (8 * dtype.itemsize - 1))
    return -float("inf")
  @staticmethod
  def max(dtype: DType) -> Any:
    if dtype == dtypes.bool: return True
    if dtypes.is_int(dtype): return 2 ** (8 * dtype.itemsize) - 1 if dtypes.is_unsigned(dtype) else 2 ** (8 * dtype.itemsize - 1) - 1
    return float("inf")

FLOATS = (dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64)
UNSIGNED = (dtypes.uint8, dtypes.uint16, dtypes.uint32, dtypes.uint64)
INTS = (dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64) + UNSIGNED
ALL = (dtypes.bool,) + INTS + FLOATS
FLOAT_SET, INT_SET, UNSIGNED_SET = frozenset(FLOATS), frozenset(INTS), frozenset(UNSIGNED)  # (a tuple compares with == until it finds a match)
BY_NAME = {d.name: d for d in ALL}

@functools.cache  # one object per vector type
def _vector(scalar: DType, count: int) -> DType: return DType(scalar.priority, scalar.itemsize * count, f"{scalar.name}x{count}", None, count, scalar)
def _named(name: str, count: int) -> DType: return BY_NAME[name] if count == 1 else BY_NAME[name].vec(count)

# PyTorch's promotion as a lattice: a type promotes to its parents; two types meet at their least common ancestor.
# int64/uint64 + a float type gives that float type (like torch), uint8 + int8 gives int16.
PROMOTION_PARENTS: dict[DType, list[DType]] = {
  dtypes.bool: [dtypes.int8, dtypes.uint8], dtypes.int8: [dtypes.int16], dtypes.int16: [dtypes.int32], dtypes.int32: [dtypes.int64],
  dtypes.int64: [dtypes.float16, dtypes.bfloat16], dtypes.uint8: [dtypes.int16, dtypes.uint16], dtypes.uint16: [dtypes.int32, dtypes.uint32],
  dtypes.uint32: [dtypes.int64, dtypes.uint64], dtypes.uint64: [dtypes.float16, dtypes.bfloat16],
  dtypes.float16: [dtypes.float32], dtypes.bfloat16: [dtypes.float32], dtypes.float32: [dtypes.float64], dtypes.float64: []}

@functools.cache
def _ancestors(dtype: DType) -> frozenset[DType]:
  return frozenset([dtype]).union(*[_ancestors(parent) for parent in PROMOTION_PARENTS[dtype]])

@functools.cache  # asked by every binary op
def least_upper_dtype(*ds: DType) -> DType:
  """The dtype PyTorch computes in when tensors of these dtypes meet in one op."""
  if len(ds) == 1: return ds[0]
  meet = min(frozenset.intersection(*[_ancestors(d) for d in ds]))
  # uint64 with a signed int has no integer home: PyTorch refuses, numpy uses float64 (the lattice would say float16)
  return dtypes.float64 if dtypes.is_float(meet) and not any(dtypes.is_float(d) for d in ds) else meet

def least_upper_float(dtype: DType) -> DType:
  """The float dtype an op like exp or division gives for this input: itself if it is a float, else the default float."""
  return dtype if dtypes.is_float(dtype) else dtypes.default_float

def result_dtype_with_scalar(dtype: DType, scalar: Any) -> DType:
  """PyTorch: a Python scalar does not upcast a tensor within a category, only across (int tensor + 1.5 -> float)."""
  if isinstance(scalar, bool) or dtypes.is_float(dtype): return dtype
  if isinstance(scalar, float): return dtypes.default_float
  return dtypes.default_int if isinstance(scalar, int) and dtype == dtypes.bool else dtype
