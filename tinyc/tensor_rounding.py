"""Layer 6: Tensor rounding (a mixin of Tensor): trunc, floor, ceil, round_half_even, clip; piecewise-constant functions with torch's zero
gradient. Imports dtype, function.
"""
from __future__ import annotations
from typing import Any
from tinyc.dtype import DType, dtypes, least_upper_dtype, result_dtype_with_scalar
from tinyc import function as F

class RoundingMixin:
  def trunc(self: Any) -> Any:
    """Round toward zero. Values at or beyond 2**mantissa_bits are already integers, so they pass through unchanged; the rest
    round-trip through an integer type wide enough for them (and the threshold is representable in float16)."""
    if not dtypes.is_float(self.dtype): return self
    threshold, int_dtype, x = *TRUNC_VIA_INT[self.dtype], self.detach()
    return self._flat((x.abs() < threshold).where(x.cast(int_dtype).cast(self.dtype), x))
  def _flat(self: Any, value: Any) -> Any:
    """value, a piecewise-constant function of self computed without a graph, with torch's zero gradient to self."""
    return type(self)._apply(F.ZeroGrad, self, value=value.lazydata) if self.requires_grad else value
  def floor(self: Any) -> Any:
    truncated = self.trunc()
    return (truncated > self).where(truncated - 1, truncated)
  def ceil(self: Any) -> Any:
    truncated = self.trunc()
    return (truncated < self).where(truncated + 1, truncated)
  def round_half_even(self: Any) -> Any:
    """Round to the nearest integer, ties to even (torch.round)."""
    floor = self.floor()
    diff = self - floor
    floor_is_even = (floor % 2) == 0
    return (diff > 0.5).where(floor + 1, (diff < 0.5).where(floor, floor_is_even.where(floor, floor + 1)))
  def clip(self: Any, min_: int | float | None = None, max_: int | float | None = None) -> Any:
    """Clamp values to [min_, max_]."""
    if min_ is None and max_ is None: raise RuntimeError("clip: At least one of 'min' or 'max' must not be None")
    # torch: the result dtype comes from the tensor and both bounds together (int tensor, float bound -> float), before clamping
    out = self.cast(least_upper_dtype(self.dtype, *[result_dtype_with_scalar(self.dtype, b) for b in (min_, max_) if b is not None]))
    # where, not maximum/minimum: at a bound torch passes the whole gradient through, where maximum would split it in two
    out = (out < min_).where(min_, out) if min_ is not None else out
    return (out > max_).where(max_, out) if max_ is not None else out

# float dtype -> (the magnitude from which every value is an integer, the integer dtype trunc goes through below it)
TRUNC_VIA_INT: dict[DType, tuple[float, DType]] = {dtypes.float16: (2.0 ** 10, dtypes.int16), dtypes.bfloat16: (2.0 ** 7, dtypes.int16),
                                                   dtypes.float32: (2.0 ** 23, dtypes.int32), dtypes.float64: (2.0 ** 52, dtypes.int64)}
