"""Layer 6: Tensor reductions (a mixin of Tensor): sum, max, min, mean, var, std, softmax, argmax, cumsum. Each is one
primitive reduce (SUM or MAX) plus elementwise ops, so it fuses with what surrounds it. Imports helpers, dtype, function.
"""
from __future__ import annotations
import math
from typing import Any, Sequence
from tinyc.dtype import dtypes
from tinyc.helpers import AUTOCAST, argfix, prod
from tinyc import function as F
from tinyc.tensor_movement import normalize_axis

class ReduceMixin:
  def _reduce(self: Any, function: type[F.Function], axis: int | Sequence[int] | None, keepdim: bool) -> Any:
    """One primitive reduce; over a zero-size dim it gives the reduce's identity (0, or -inf for MAX): the scheduler makes a constant."""
    axes = self._axes(axis)
    if self.ndim == 0: return type(self)._apply(F.Sum, self, axis=())  # no kernel, but a node of its own: x.sum().backward() works
    reduced = type(self)._apply(function, self, axis=axes)
    return reduced if keepdim else reduced.reshape(tuple(s for i, s in enumerate(self.shape) if i not in axes))
  def _axes(self: Any, axis: int | Sequence[int] | None) -> tuple[int, ...]:
    return tuple(range(self.ndim)) if axis is None else tuple(normalize_axis(a, self.ndim) for a in argfix(axis))
  def _check_extreme(self: Any, name: str, axis: int | Sequence[int] | None) -> None:
    """The max (min, argmax) of nothing is undefined: torch's errors for a reduce over a zero-size dim."""
    if self.numel() != 0: return
    if axis is None: raise (IndexError if name.startswith("arg") else RuntimeError)(
      f"{name}(): Expected reduction dim to be specified for input.numel() == 0. Specify the reduction dim with the 'dim' argument.")
    empty = next((a for a in argfix(axis) if self.shape[normalize_axis(a, self.ndim)] == 0), None)
    if empty is not None: raise IndexError(f"{name}(): Expected reduction dim {empty} to have non-zero size.")
  def sum(self: Any, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Any:
    """Sum over axis; bools and ints below 32 bits (unsigned too) sum in int32 where torch uses int64, 16-bit floats in float32 (stored
    back as 16 bits, except inside autocast)."""
    source = self
    if self.dtype == dtypes.bool or (dtypes.is_int(self.dtype) and self.dtype.itemsize < 4): source = self.cast(dtypes.default_int)
    elif self.dtype in (dtypes.float16, dtypes.bfloat16):
      total = self.float().sum(axis, keepdim)
      return total if AUTOCAST else total.cast(self.dtype)
    return source._reduce(F.Sum, axis, keepdim)
  def max(self: Any, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Any:
    self._check_extreme("max", axis)
    if self.dtype == dtypes.bool: return self.cast(dtypes.uint8).max(axis, keepdim).cast(dtypes.bool)
    return self._reduce(F.Max, axis, keepdim)
  def min(self: Any, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Any:
    self._check_extreme("min", axis)
    if self.dtype == dtypes.bool: return self.logical_not().max(axis, keepdim).logical_not()
    if dtypes.is_unsigned(self.dtype): return dtypes.max(self.dtype) - (dtypes.max(self.dtype) - self).max(axis, keepdim)
    return -((-self).max(axis, keepdim))
  def mean(self: Any, axis: int | Sequence[int] | None = None, keepdim: bool = False) -> Any:
    total = self._floating().sum(axis, keepdim)
    count = prod(self.shape) // max(prod(total.shape), 1) if self.numel() else 0
    return total / count if count else total * math.nan
  def var(self: Any, axis: int | Sequence[int] | None = None, keepdim: bool = False, correction: int = 1) -> Any:
    x = self._floating()
    squares = (x - x.mean(axis, keepdim=True)).square().sum(axis, keepdim)
    count = prod(x.shape) // max(prod(squares.shape), 1)
    return squares / max(count - correction, 0)  # no degrees of freedom left: inf (or nan for 0/0), as torch gives
  def std(self: Any, axis: int | Sequence[int] | None = None, keepdim: bool = False, correction: int = 1) -> Any:
    return self.var(axis, keepdim, correction).sqrt()
  def softmax(self: Any, axis: int = -1) -> Any:
    x = self._floating()  # _reduce, not max: a softmax over a zero-size dim is empty, not an error
    shifted = (x - x._reduce(F.Max, axis, True).detach()).exp()  # detached: the result does not depend on the shift
    return shifted / shifted.sum(axis, keepdim=True)
  def logsumexp(self: Any, axis: int = -1, keepdim: bool = False) -> Any:
    """log(sum(exp(x))) over axis, computed without overflow (-inf over an empty dim, as torch)."""
    x = self._floating()
    peak = x._reduce(F.Max, axis, True).detach()  # (see softmax)
    result = peak + (x - peak).exp().sum(axis, keepdim=True).log()
    return result if keepdim else result.squeeze(axis)
  def log_softmax(self: Any, axis: int = -1) -> Any:
    x = self._floating()
    shifted = x - x._reduce(F.Max, axis, True).detach()  # (see softmax)
    return shifted - shifted.exp().sum(axis, keepdim=True).log()
  def argmax(self: Any, axis: int | None = None, keepdim: bool = False) -> Any:
    """Index of the first maximum along axis (of the flattened tensor when axis is None)."""
    self._check_extreme("argmax", axis)
    if axis is None:
      flat = self.flatten()
      return flat.argmax(0).reshape((1,) * self.ndim if keepdim else ())
    axis = normalize_axis(axis, self.ndim)
    size = self.shape[axis]
    is_max = (self == self.max(axis, keepdim=True)) | (self != self)  # max is NaN where there is one, and NaN is the max, as in torch
    descending = type(self).arange(size, 0, -1, device=self.device).reshape((size,) + (1,) * (self.ndim - axis - 1))
    first = (is_max * descending).max(axis, keepdim)
    return (size - first).cast(dtypes.int32)
  def argmin(self: Any, axis: int | None = None, keepdim: bool = False) -> Any:
    self._check_extreme("argmin", axis)
    return (-self if self.dtype != dtypes.bool else self.logical_not()).argmax(axis, keepdim)
  def cumsum(self: Any, axis: int = 0) -> Any:
    """Running sum along axis."""
    axis = normalize_axis(axis, self.ndim) if self.ndim else 0
    if self.ndim == 0: return type(self)._apply(F.Sum, self, axis=())  # no kernel, but a node of its own: x.sum().backward() works
    size = self.shape[axis]
    if size == 0: return self.sum(axis, keepdim=True).expand(self.shape)  # nothing to add up, but the dtype and the graph of a sum
    moved = self.transpose(axis, -1)
    windows = moved.pad2d((size - 1, 0))._pool((size,))
    return windows.sum(-1).transpose(axis, -1)
