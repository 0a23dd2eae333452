"""Layer 6: Tensor movement (a mixin of Tensor). Every op here is a view: no kernel, no copy. Indexing is in tensor_index.py.
Imports helpers, dtype, function.
"""
from __future__ import annotations
import math
from typing import Any, Sequence
from tinyc.dtype import dtypes
from tinyc.helpers import all_int, argfix, flatten, keyword_aliases, prod
from tinyc.shape.symbolic import Node, sym_infer, sym_max, sym_min
from tinyc import function as F

class ShapeError(RuntimeError, ValueError):
  """Shapes that do not fit: a RuntimeError, as torch raises, and a ValueError, as numpy and tinygrad raise, so either's except catches it."""

def normalize_axis(axis: int, ndim: int) -> int:
  """A dim in [-ndim, ndim) as a non-negative dim, or PyTorch's IndexError."""
  low, high = (-ndim, ndim - 1) if ndim else (-1, 0)
  if not isinstance(axis, int) or not low <= axis <= high:
    raise IndexError(f"Dimension out of range (expected to be in range of [{low}, {high}], but got {axis})")
  return axis % ndim if ndim else 0

class MovementMixin:
  # provided by Tensor
  @property
  def shape(self) -> tuple[int, ...]: raise NotImplementedError
  @property
  def ndim(self) -> int: raise NotImplementedError
  @classmethod
  def _apply(cls, *args: Any, **kwargs: Any) -> Any: raise NotImplementedError

  # (shape, *more) rather than (*shape): reshape(2, 3), reshape((2, 3)) and tinygrad's reshape(shape=(2, 3)) all work
  def reshape(self, shape: Any, *more: int) -> Any:
    """The same elements in a new shape; one dim may be -1."""
    dims = argfix(shape, *more)
    if not all(isinstance(d, (int, Node)) for d in dims): raise TypeError(f"reshape needs ints (or bound Variables), got {dims}")
    if all_int(dims) and not all_int(self.shape):  # a symbolic shape to the sizes it is bound to: a view of its values, stored
      bound = self.contiguous()  # type: ignore[attr-defined]
      return bound.reshape(tuple(sym_infer(size, {}) for size in self.shape)).reshape(dims) if -1 in dims else \
        type(self)._apply(F.Reshape, bound, shape=self._check_size(dims, sym_infer(prod(self.shape), {})))
    if dims.count(-1) > 1: raise ShapeError(f"only one dimension can be inferred, got shape {dims}")
    if -1 in dims:
      known = prod(d for d in dims if d != -1)
      if known == 0 or prod(self.shape) % known: raise ShapeError(f"shape {dims} is invalid for input of size {prod(self.shape)}")
      dims = tuple(prod(self.shape) // known if d == -1 else d for d in dims)
    return self if dims == self.shape else type(self)._apply(F.Reshape, self, shape=self._check_size(dims, prod(self.shape)))
  def _check_size(self, dims: tuple[Any, ...], size: Any) -> tuple[Any, ...]:
    if any(sym_min(d) < 0 for d in dims) or prod(dims) != size:
      raise ShapeError(f"shape {dims} is invalid for input of size {size} (input shape {self.shape})")
    return dims

  def expand(self, shape: Any, *more: int) -> Any:
    """Broadcast size-1 dims to `shape` (-1 keeps a dim); new leading dims are allowed."""
    dims = argfix(shape, *more)
    if len(dims) < self.ndim: raise ShapeError(f"expand: the shape {dims} has fewer dims than the tensor's {self.shape}")
    current = (1,) * (len(dims) - self.ndim) + self.shape
    target = tuple(c if d == -1 else d for c, d in zip(current, dims))
    for c, d in zip(current, target):
      if c != d and c != 1: raise ShapeError(f"The expanded size of the tensor ({d}) must match the existing size ({c}): {self.shape} -> {dims}")
    base = self.reshape(current) if current != self.shape else self
    return base if target == current else type(self)._apply(F.Expand, base, shape=target)

  def permute(self, order: Any, *more: int) -> Any:
    """Reorder the dims."""
    axes = tuple(normalize_axis(a, self.ndim) for a in argfix(order, *more))
    if sorted(axes) != list(range(self.ndim)):
      raise RuntimeError(f"permute: {argfix(order, *more)} is not a permutation of the dims of {self.shape}")
    return type(self)._apply(F.Permute, self, order=axes)

  def flip(self, axis: int | Sequence[int], *more: int) -> Any:
    """Reverse the order of elements along axis (one dim or several)."""
    axes = tuple(normalize_axis(a, self.ndim) for a in argfix(axis, *more))
    return type(self)._apply(F.Flip, self, axis=axes)

  @keyword_aliases(arg="bounds")
  def shrink(self, bounds: Sequence[tuple[int, int] | None]) -> Any:
    """Keep [begin, end) in each dim (None keeps the whole dim)."""
    if len(bounds) != self.ndim: raise ValueError(f"shrink needs one (begin, end) per dim of {self.shape}, got {bounds}")
    full = tuple(b if b is not None else (0, s) for b, s in zip(bounds, self.shape))
    # (a bound may be a bound Variable, or a Node of them: it must fit for every value, and a symbolic size must be at least 1)
    if any(not (0 <= sym_min(b) and (e == s or sym_max(e) <= sym_min(s)) and sym_min(e - b) >= (1 if isinstance(e - b, Node) else 0))
           for (b, e), s in zip(full, self.shape)): raise ValueError(f"shrink bounds {full} do not fit shape {self.shape} for every value")
    return self if all(b == (0, s) for b, s in zip(full, self.shape)) else type(self)._apply(F.Shrink, self, bounds=full)

  @keyword_aliases(arg="padding")
  def pad(self, padding: Sequence[tuple[int, int] | None], value: float = 0.0) -> Any:
    """Add (before, after) elements of `value` around each dim."""
    if len(padding) != self.ndim: raise ValueError(f"pad needs one (before, after) per dim of {self.shape}, got {padding}")
    full = tuple(p if p is not None else (0, 0) for p in padding)
    if any(b < 0 or a < 0 for b, a in full): raise ValueError(f"pad amounts must be non-negative, got {full}; use shrink to cut")
    if all(p == (0, 0) for p in full): return self
    padded = type(self)._apply(F.Pad, self, padding=full)
    if value == 0: return padded
    mask = type(self)._apply(F.Pad, type(self).ones(*self.shape, device=self.device, dtype=self.dtype), padding=full)  # type: ignore[attr-defined]
    return mask.cast(dtypes.bool).where(padded, value)

  def _slice(self, ranges: Sequence[tuple[int, int]], value: float = 0.0) -> Any:
    """Take [begin, end) per dim, where begin < 0 or end > size pads with `value`."""
    padding = tuple((max(0, -b), max(0, e - s)) for (b, e), s in zip(ranges, self.shape))
    padded = self.pad(padding, value)
    return padded.shrink(tuple((b + p[0], e + p[0]) for (b, e), p in zip(ranges, padding)))

  def pad2d(self, padding: Sequence[int], value: float = 0.0) -> Any:
    """Pad the last dims, torch.nn.functional.pad order: (left, right, top, bottom, ...); negative values crop."""
    pairs = list(zip(padding[::2], padding[1::2]))[::-1]
    ranges = [(0, s) for s in self.shape[:self.ndim - len(pairs)]] + [(-b, s + a) for (b, a), s in zip(pairs, self.shape[self.ndim - len(pairs):])]
    return self._slice(ranges, value)

  @keyword_aliases(ax1="dim0", ax2="dim1")
  def transpose(self, dim0: int = 1, dim1: int = 0) -> Any:
    order = list(range(self.ndim))
    a, b = normalize_axis(dim0, self.ndim), normalize_axis(dim1, self.ndim)
    order[a], order[b] = order[b], order[a]
    return self.permute(order)
  @property
  def T(self) -> Any: return self.transpose()
  def flatten(self, start_dim: int = 0) -> Any:
    if self.ndim == 0: return self.reshape(1)
    start = normalize_axis(start_dim, self.ndim)
    return self.reshape(self.shape[:start] + (prod(self.shape[start:]),))
  def squeeze(self, dim: int | None = None) -> Any:
    if dim is None: return self.reshape(tuple(s for s in self.shape if s != 1))
    axis = normalize_axis(dim, self.ndim)
    return self if self.ndim == 0 or self.shape[axis] != 1 else self.reshape(self.shape[:axis] + self.shape[axis + 1:])
  def unsqueeze(self, dim: int) -> Any:
    axis = normalize_axis(dim, self.ndim + 1)
    return self.reshape(self.shape[:axis] + (1,) + self.shape[axis:])

  def cat(self: Any, *others: Any, dim: int = 0) -> Any:
    """Join tensors along an existing dim; all other dims must match. a.cat(b, c, dim=1), or as in torch, Tensor.cat([a, b, c], dim=1)."""
    tensors, dim = _tensors_and_dim("cat", self, others, dim, ValueError("cat(): expected a non-empty list of Tensors"))
    first = tensors[0]
    if (zero_d := next((i for i, t in enumerate(tensors) if t.ndim == 0), None)) is not None:
      raise ShapeError(f"zero-dimensional tensor (at position {zero_d}) cannot be concatenated: stack scalars along a new dim with Tensor.stack")
    axis = normalize_axis(dim, first.ndim)
    for other in tensors[1:]:
      if other.ndim != first.ndim or any(a != b for i, (a, b) in enumerate(zip(first.shape, other.shape)) if i != axis):
        raise ShapeError(f"Sizes of tensors must match except in dimension {axis}: cat of {first.shape} and {other.shape}")
    offsets = [0]
    for t in tensors: offsets.append(offsets[-1] + t.shape[axis])
    total = offsets[-1]
    parts = [t.pad(tuple((offsets[i], total - offsets[i + 1]) if d == axis else (0, 0) for d in range(first.ndim))) for i, t in enumerate(tensors)]
    result = parts[0]
    for part in parts[1:]: result = result + part
    return result
  def stack(self: Any, *others: Any, dim: int = 0) -> Any:
    """Join same-shaped tensors along a new dim: a.stack(b, dim=1), or as in torch, Tensor.stack([a, b], dim=1)."""
    tensors, dim = _tensors_and_dim("stack", self, others, dim, RuntimeError("stack expects a non-empty sequence of tensors"))
    axis = normalize_axis(dim, tensors[0].ndim + 1)
    for t in tensors[1:]:
      if t.shape != tensors[0].shape: raise ShapeError(f"stack expects each tensor to be equal size, but got {tensors[0].shape} and {t.shape}")
    expanded = [t.unsqueeze(axis) for t in tensors]
    return expanded[0].cat(*expanded[1:], dim=axis)
  def repeat(self, repeats: Any, *more: int) -> Any:
    """Tile the tensor `repeats[i]` times along dim i (like torch.Tensor.repeat); takes a sequence or ints."""
    repeats = argfix(repeats, *more)
    if len(repeats) < self.ndim:
      raise ShapeError(f"Number of dimensions of repeat dims {tuple(repeats)} can not be smaller than number of dimensions of tensor {self.shape}")
    base = self.reshape((1,) * (len(repeats) - self.ndim) + self.shape)
    spread = base.reshape(flatten((1, s) for s in base.shape)).expand(flatten((r, s) for r, s in zip(repeats, base.shape)))
    return spread.reshape(tuple(r * s for r, s in zip(repeats, base.shape)))
  @keyword_aliases(num="chunks")
  def chunk(self, chunks: int, dim: int = 0) -> list[Any]:
    axis = normalize_axis(dim, self.ndim)
    if chunks <= 0: raise RuntimeError(f"chunk expects `chunks` to be greater than 0, got: {chunks}")
    step = math.ceil(self.shape[axis] / chunks) if self.shape[axis] else 1
    bounds = [(start, min(start + step, self.shape[axis])) for start in range(0, self.shape[axis], step)] or [(0, 0)]
    return [self.shrink(tuple(b if d == axis else None for d in range(self.ndim))) for b in bounds]

  def _pool(self, kernel: Sequence[int], stride: int | Sequence[int] = 1, dilation: int | Sequence[int] = 1) -> Any:
    """Sliding windows over the last len(kernel) dims: shape (..., *output_dims, *kernel) with no data copied."""
    k_ = tuple(kernel)
    s_, d_ = _pair(stride, len(k_)), _pair(dilation, len(k_))
    batch, in_ = self.shape[:-len(k_)], self.shape[-len(k_):]
    keep = [(0, s) for s in batch]
    nb = len(batch)
    out_ = [(i - d * (k - 1) - 1) // s + 1 for i, d, k, s in zip(in_, d_, k_, s_)]
    if any(o <= 0 for o in out_): raise RuntimeError(f"pooling window {k_} (dilation {d_}) is larger than the input {in_}")
    if any(k > s for k, s in zip(k_, s_)) or any(d != 1 for d in d_):
      # repeat the input so that windows become a reshape of it: e copies cover k windows of i + d
      e_ = [math.ceil(k * (i + d) / i) for k, i, d in zip(k_, in_, d_)]
      x = self.reshape(*batch, *flatten((1, i) for i in in_)).expand(*batch, *flatten((e, i) for e, i in zip(e_, in_)))
      x = x.reshape(*batch, *[e * i for e, i in zip(e_, in_)])
      x = x._slice(keep + [(0, k * (i + d)) for k, i, d in zip(k_, in_, d_)]).reshape(*batch, *flatten((k, i + d) for k, i, d in zip(k_, in_, d_)))
      x = x._slice(keep + flatten(((0, k), (0, o * s)) for k, o, s in zip(k_, out_, s_)))
      x = x.reshape(*batch, *flatten((k, o, s) for k, o, s in zip(k_, out_, s_)))
      x = x._slice(keep + flatten(((0, k), (0, o), (0, 1)) for k, o in zip(k_, out_))).reshape(*batch, *flatten((k, o) for k, o in zip(k_, out_)))
      return x.permute(*range(nb), *[nb + i * 2 + 1 for i in range(len(k_))], *[nb + i * 2 for i in range(len(k_))])
    out_ = [(i + (s - k)) // s for i, s, k in zip(in_, s_, k_)]
    x = self._slice(keep + [(0, o * s) for o, s in zip(out_, s_)]).reshape(*batch, *flatten((o, s) for o, s in zip(out_, s_)))
    x = x._slice(keep + flatten(((0, o), (0, k)) for o, k in zip(out_, k_)))
    return x.permute(*range(nb), *[nb + i * 2 for i in range(len(k_))], *[nb + i * 2 + 1 for i in range(len(k_))])

def _tensors_and_dim(name: str, first: Any, rest: tuple[Any, ...], dim: int, empty: Exception) -> tuple[list[Any], int]:
  """The tensors and dim of cat/stack called as in torch (Tensor.cat([a, b], 1): the unbound method gets the list as self) or as in
  tinygrad (a.cat(b, c, dim=1), or a.cat([b, c]))."""
  if isinstance(first, (list, tuple)):
    if len(rest) > 1 or rest and not isinstance(rest[0], int):
      raise TypeError(f"{name}() takes a list of tensors and a dim, as Tensor.{name}([a, b], dim=0), got a list and {rest}")
    tensors, dim = list(first), rest[0] if rest else dim
  else: tensors = [first, *(rest[0] if len(rest) == 1 and isinstance(rest[0], (list, tuple)) else rest)]
  if not tensors: raise empty
  for i, t in enumerate(tensors):
    if not isinstance(t, MovementMixin): raise TypeError(f"{name}(): expected Tensor as element {i} in argument 0, but got {type(t).__name__}")
  return tensors, dim

def _pair(value: int | Sequence[int], count: int) -> tuple[int, ...]:
  return (value,) * count if isinstance(value, int) else tuple(value)
