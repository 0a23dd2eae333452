"""Layer 6: Tensor indexing (a mixin of Tensor). Basic indices (int, slice with any step, None, Ellipsis) are views; Tensor and list
indices and gather() are one-hot contractions (index == arange, select, sum) with no data-dependent shape, so they fuse and differentiate;
__setitem__ runs the view backwards (pads) and writes through a mask. Index values are checked: a list or numpy index at once, a Tensor
index when data next reaches the host (index_check.py). Imports helpers, dtype, index_check, tensor_movement.
"""
from __future__ import annotations
from typing import Any, NamedTuple
import numpy as np
from tinyc.dtype import dtypes
from tinyc.helpers import CHECK_INDEX, argsort, prod
from tinyc import index_check
from tinyc.index_check import IndexOutOfRangeError
from tinyc.tensor_movement import normalize_axis

BAD_INDEX = "only integers, slices (`:`), ellipsis (`...`), None and integer tensors or lists are valid indices"
TENSORS_IN_LIST = ("a list holding tensors is not an index: a list is one index array (as numpy reads it, and torch says it will); to index "
                   "several dims, write a tuple, x[i, 1] or x[(i, 1)], not x[[i, 1]]")
USE_GATHER = "as x.gather(dim, index) (torch's order) or x.gather(index, dim) (tinygrad's)"
MASK_INDEX = ("indexing with a boolean mask makes a data-dependent shape, which a lazy tinyc graph cannot have: use mask.where(x, 0), "
              "or compute the indices on the host: x[tuple(Tensor(i) for i in np.nonzero(mask.numpy()))]")

class IndexPlan(NamedTuple):
  """An index resolved against a shape: a basic view (shrink, flip, stride, reshape), then Tensor indices over dims of that view."""
  bounds: tuple[tuple[int, int], ...]   # per dim of the tensor: [begin, end) kept
  steps: tuple[int, ...]                # per dim of the tensor: the step (1 where at most one element is kept)
  strided_shape: tuple[int, ...]        # after shrink, flip and stride: still one dim per dim of the tensor
  view_shape: tuple[int, ...]           # then int-indexed dims dropped and None dims added
  tensors: tuple[tuple[int, Any], ...]  # (dim of the view, int index Tensor) per Tensor index, in index order

class OneHot(NamedTuple):
  """Tensor indices over dims of a view, as a contraction: result[o] = sum over j of hit[o, j] * data[o, j], j ranging over the
  indexed dims. Both live in one layout: the result's dims (`out_shape`) then one dim per index (`sizes`)."""
  order: list[int]              # the view permuted to (non-indexed dims..., indexed dims...)
  out_shape: tuple[int, ...]    # the result: non-indexed dims, with the broadcast index shape in place of the indexed ones
  data_shape: tuple[int, ...]   # where the permuted view goes: out_shape with 1 in the index dims, then sizes
  batch_axes: tuple[int, ...]   # the dims of out_shape that come from the indices
  hit: Any                      # bool, out_shape with 1 in the non-index dims, then sizes: True where an index picks the element

class IndexMixin:
  # ---- parsing ----
  def _index_item(self: Any, item: Any) -> Any:
    """One index item checked, with lists and numpy arrays made into int numpy arrays (checked against their dim in _plan_index)."""
    if item is None or item is Ellipsis or isinstance(item, slice): return item
    if isinstance(item, (int, np.integer)) and not isinstance(item, (bool, np.bool_)): return int(item)
    if isinstance(item, (list, tuple, np.ndarray)):  # a tuple inside an index is a list of ints, as in torch
      if not isinstance(item, np.ndarray) and any(isinstance(i, type(self)) for i in item): raise IndexError(TENSORS_IN_LIST)
      array = np.asarray(item)
      if array.dtype == np.bool_: raise TypeError(MASK_INDEX)
      if array.size and array.dtype.kind not in "iu": raise IndexError(f"{BAD_INDEX} (got a list of {array.dtype})")
      fits_int32 = array.size == 0 or -2 ** 31 <= array.min() and array.max() < 2 ** 31
      return array.astype(np.int32 if fits_int32 else np.int64)
    if isinstance(item, type(self)):
      if item.dtype == dtypes.bool: raise TypeError(MASK_INDEX)
      if not dtypes.is_int(item.dtype): raise IndexError(f"tensors used as indices must be long, int, byte or bool tensors (got {item.dtype})")
      return item.to(self.device)
    raise IndexError(f"{BAD_INDEX} (got {type(item).__name__})")

  def _plan_index(self: Any, indices: Any) -> IndexPlan:
    """Resolve x[indices] against self's shape, with torch's errors for bad indices."""
    items = [self._index_item(item) for item in (indices if isinstance(indices, tuple) else (indices,))]
    # no list.count / `in` here: they compare with ==, which is elementwise for Tensors
    if sum(1 for item in items if item is Ellipsis) > 1: raise IndexError("an index can only have a single ellipsis ('...')")
    used = sum(1 for item in items if item is not None and item is not Ellipsis)
    if used > self.ndim: raise IndexError(f"too many indices for tensor of dimension {self.ndim}")
    at = next((i for i, item in enumerate(items) if item is Ellipsis), len(items))
    items = items[:at] + [slice(None)] * (self.ndim - used) + items[at + 1:]
    bounds, steps, strided, view, tensors, dim = [], [], [], [], [], 0
    for item in items:
      if item is None:
        view.append(1)
        continue
      size = self.shape[dim]
      if isinstance(item, int):
        if not -size <= item < size: raise IndexError(f"index {item} is out of bounds for dimension {dim} with size {size}")
        bounds.append((item % size, item % size + 1))
        steps.append(1)
        strided.append(1)
      else:
        if isinstance(item, slice): start, stop, step = item.indices(size)
        else:  # a Tensor index keeps the whole dim in the view; _one_hot picks from it
          start, stop, step = 0, size, 1
          tensors.append((len(view), self._checked_index(item, dim, size)))
        count = len(range(start, stop, step))
        if count == 0: bounds.append((0, 0))
        elif step > 0: bounds.append((start, start + (count - 1) * step + 1))
        else: bounds.append((start + (count - 1) * step, start + 1))
        steps.append(step if count > 1 else 1)
        strided.append(count)
        view.append(count)
      dim += 1
    return IndexPlan(tuple(bounds), tuple(steps), tuple(strided), tuple(view), tuple(tensors))

  def _checked_index(self: Any, index: Any, dim: int, size: int) -> Any:
    """A Tensor or numpy index into dim `dim` (of `size`) as a Tensor on self's device, its values checked: numpy's at once."""
    message = f"index {{value}} is out of bounds for dimension {dim} with size {size}"
    if isinstance(index, np.ndarray):
      bad = index[(index < -size) | (index >= size)]
      if bad.size: raise IndexOutOfRangeError(message.replace("{value}", str(bad.flat[0])))
      return type(self)(index, device=self.device)
    index._check_range(-size, size, f"Tensor index: {message}")
    return index

  def _check_range(self: Any, low: int, high: int, message: str, ignore: int | None = None) -> None:
    """Check that low <= every value of this index tensor < high (values equal to `ignore` pass) where data next reaches the host,
    raising IndexOutOfRangeError(message with {value} replaced by a bad value). One small reduce kernel: the largest and smallest value."""
    if not CHECK_INDEX or self.numel() == 0: return
    flat = self.detach().reshape(-1)
    if flat.dtype == dtypes.bool: flat = flat.cast(dtypes.int32)
    is_int = dtypes.is_int(flat.dtype)
    def counted(values: Any, in_range: int) -> Any:  # != as < or >: CMPEQ under the stack's pad would be stored first (schedule rule 4)
      return values if ignore is None else ((flat < ignore) | (flat > ignore)).where(values, in_range)
    # the smallest value as the largest of its bitwise NOT (-x would overflow at the dtype's minimum), so that one reduce finds both;
    # each row is built on its own, as a value both read through the stack's pad would be stored by a kernel of its own first
    extremes = type(self).stack([counted(flat, low), counted(flat ^ -1, ~low) if is_int else counted(-flat, -low)]).max(1)
    index_check.add(extremes.lazydata, low, high, message)

  def _one_hot(self: Any, plan: IndexPlan) -> OneHot:
    """The one-hot layout of plan's Tensor indices over its view (numpy/torch rules: the index shapes broadcast together; their
    dims replace the indexed dims if those are adjacent, else they go first). Negative values wrap; out-of-range ones hit nothing
    (and raise through their index check)."""
    positions = [position for position, _ in plan.tensors]
    indices = [index for _, index in plan.tensors]
    try: batch = tuple(np.broadcast_shapes(*[index.shape for index in indices]))
    except ValueError: raise IndexError("shape mismatch: indexing tensors could not be broadcast together with shapes " +
                                        ", ".join(str(list(index.shape)) for index in indices)) from None
    rest = [d for d in range(len(plan.view_shape)) if d not in positions]
    rest_shape = tuple(plan.view_shape[d] for d in rest)
    sizes = tuple(plan.view_shape[p] for p in positions)
    first = positions[0] if positions == list(range(positions[0], positions[0] + len(positions))) else 0
    out_shape = rest_shape[:first] + batch + rest_shape[first:]
    hit: Any = None
    for i, (index, size) in enumerate(zip(indices, sizes)):
      along = type(self).arange(size, device=self.device).reshape((1,) * len(batch) + tuple(size if j == i else 1 for j in range(len(sizes))))
      index = index.reshape((1,) * (len(batch) - index.ndim) + index.shape + (1,) * len(sizes))
      # two compares rather than index + size, which could overflow a small index dtype
      matches = (index == along) | (index == along - size)
      hit = matches if hit is None else hit & matches
    hit = hit.expand(batch + sizes).reshape((1,) * first + batch + (1,) * (len(rest) - first) + sizes)
    data_shape = rest_shape[:first] + (1,) * len(batch) + rest_shape[first:] + sizes
    return OneHot(rest + positions, out_shape, data_shape, tuple(range(first, first + len(batch))), hit)

  # ---- reading ----
  def __getitem__(self: Any, indices: Any) -> Any:
    """x[indices] as in torch: ints, slices (any step, negative too), None, Ellipsis, int Tensors and lists of ints. Basic indices
    make a view; Tensor indices a one-hot contraction (one kernel, and one more to check the index values; see index_check.py)."""
    plan = self._plan_index(indices)
    view = self._basic_view(plan)
    if not plan.tensors: return view
    one_hot = view._one_hot(plan)
    data = view.permute(one_hot.order).reshape(one_hot.data_shape)
    # where, not multiply: 0 * inf would be nan; the sum adds the one selected element and zeros
    picked = one_hot.hit.where(data, 0).sum(tuple(range(len(one_hot.out_shape), len(one_hot.data_shape))))
    return picked.cast(self.dtype)

  def _basic_view(self: Any, plan: IndexPlan) -> Any:
    x = self.shrink(plan.bounds)
    if any(step < 0 for step in plan.steps): x = x.flip(tuple(i for i, step in enumerate(plan.steps) if step < 0))
    return x._stride(tuple(abs(step) for step in plan.steps)).reshape(plan.view_shape)

  def _stride(self: Any, steps: tuple[int, ...]) -> Any:
    """Every steps[i]-th element along dim i (positive steps), as a reshape + shrink so it stays differentiable."""
    x = self
    for axis, step in enumerate(steps):
      if step == 1: continue
      size = x.shape[axis]
      count = (size + step - 1) // step
      x = x._slice([(0, s) if i != axis else (0, count * step) for i, s in enumerate(x.shape)])
      x = x.reshape(x.shape[:axis] + (count, step) + x.shape[axis + 1:])
      x = x.shrink(tuple((0, s) if i != axis + 1 else (0, 1) for i, s in enumerate(x.shape))).reshape(x.shape[:axis] + (count,) + x.shape[axis + 2:])
    return x

  def gather(self: Any, *args: Any, **kwargs: Any) -> Any:
    """out[i][j] = self[idx[i][j]][j] for dim=0 (torch.gather), as a one-hot contraction; idx values must be in [0, size of dim).
    Takes torch's gather(dim, index) and tinygrad's gather(idx, dim), positional (the Tensor is the index) or by keyword."""
    idx, dim = self._gather_arguments(args, kwargs)
    if not isinstance(idx, type(self)): raise TypeError(f"gather(): index must be a Tensor, got {type(idx).__name__}")
    axis = normalize_axis(dim, self.ndim)
    if not dtypes.is_int(idx.dtype): raise RuntimeError(f"gather(): Expected an integer dtype for index, got {idx.dtype}: cast it with .int()")
    if self.ndim == 0:
      if idx.ndim > 1: raise RuntimeError("Index tensor must have the same number of dimensions as input tensor")
      return self.reshape(1).gather(idx.reshape(-1), 0).reshape(idx.shape)
    if idx.ndim != self.ndim: raise RuntimeError("Index tensor must have the same number of dimensions as input tensor")
    for d, (want, have) in enumerate(zip(idx.shape, self.shape)):
      if d != axis and want > have:
        raise RuntimeError(f"Size does not match at dimension {d} expected index {list(idx.shape)} to be no larger than self {list(self.shape)} "
                           f"apart from dimension {axis}")
    size, others = self.shape[axis], [d for d in range(self.ndim) if d != axis]
    idx._check_range(0, size, f"gather(): index {{value}} is out of bounds for dimension {axis} with size {size}")
    data = self.shrink(tuple(None if d == axis else (0, s) for d, s in enumerate(idx.shape))).permute(others + [axis])
    data = data.reshape(tuple(1 if d == axis else s for d, s in enumerate(idx.shape)) + (size,))
    hit = idx.to(self.device).reshape(idx.shape + (1,)) == type(self).arange(size, device=self.device)
    return hit.where(data, 0).sum(-1).cast(self.dtype)

  def _gather_arguments(self: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[Any, Any]:
    """(index, dim) from gather's arguments: keywords dim=, index= (torch) or idx= (tinygrad); a positional Tensor is the index."""
    given = {"index" if name == "idx" else name: value for name, value in kwargs.items()}
    for arg in args:
      name = "index" if isinstance(arg, type(self)) or "dim" in given else "dim"
      if name in given or len(given) == 2: raise TypeError(f"gather() got {name} twice: it takes a dim and an index, {USE_GATHER}")
      given[name] = arg
    if len(kwargs) != len(given) - len(args) or set(given) != {"dim", "index"}:
      raise TypeError(f"gather() takes a dim and an index, {USE_GATHER}; got {len(args)} positional and keywords {sorted(kwargs)}")
    return given["index"], given["dim"]

  # ---- writing ----
  def __setitem__(self: Any, indices: Any, value: Any) -> None:
    """x[indices] = value: a scalar or a Tensor broadcastable to x[indices], cast to x's dtype. A realized x is written in place
    (other tensors sharing its buffer see the write), unless the write is part of an autograd graph; then x gets the new value out of
    place. Unlike torch, writing into a temporary view such as x[0][1] = v does not reach x: write x[0, 1] = v."""
    if self.requires_grad and self._ctx is None and not type(self).no_grad:
      raise RuntimeError("a view of a leaf Variable that requires grad is being used in an in-place operation.")
    plan = self._plan_index(indices)
    one_hot = self._one_hot(plan) if plan.tensors else None
    placed = self._fit_value(value, one_hot.out_shape if one_hot is not None else plan.view_shape)
    if prod(plan.strided_shape) == 0 or prod(placed.shape) == 0: return  # nothing is written
    if one_hot is None: mask = type(self).ones(plan.view_shape, dtype=dtypes.bool, device=self.device)
    else: placed, mask = self._scatter(placed, one_hot, plan)
    placed, mask = placed._unview(plan, self.shape), mask._unview(plan, self.shape)
    old = type(self)(self.lazydata, device=self.device, requires_grad=self.requires_grad)  # its own node, so the graph has no cycle
    old._ctx = self._ctx
    new = mask.where(placed, old)
    if new._ctx is None: self.assign(new)
    else: self.lazydata, self._ctx, self.requires_grad = new.lazydata, new._ctx, new.requires_grad

  def _fit_value(self: Any, value: Any, shape: tuple[int, ...]) -> Any:
    """value as a Tensor of self's dtype broadcast to `shape` (leading size-1 dims of value are dropped, as torch does)."""
    if isinstance(value, type(self)): fitted = value.to(self.device).cast(self.dtype)
    elif isinstance(value, (bool, int, float, np.generic)): fitted = type(self)(value, device=self.device, dtype=self.dtype)
    else: raise TypeError(f"can't assign a {type(value).__name__} to a {self.dtype.name} tensor: use a number or a Tensor")
    while fitted.ndim > len(shape) and fitted.shape[0] == 1: fitted = fitted.reshape(fitted.shape[1:])
    padded = (1,) * (len(shape) - fitted.ndim) + fitted.shape
    if fitted.ndim > len(shape) or any(have not in (1, want) for have, want in zip(padded, shape)):
      raise RuntimeError(f"shape mismatch: value tensor of shape {list(fitted.shape)} cannot be broadcast to indexing result of shape {list(shape)}")
    return fitted.reshape(padded).expand(shape)

  def _scatter(self: Any, value: Any, one_hot: OneHot, plan: IndexPlan) -> tuple[Any, Any]:
    """value (in the result's shape) placed into the view's shape through Tensor indices, and the mask of the places written.
    Where an index repeats, the last write wins, as on torch's CPU backend (torch leaves it undefined)."""
    batch = tuple(one_hot.out_shape[a] for a in one_hot.batch_axes)
    count = prod(batch)
    number = type(self).arange(1, count + 1, device=self.device).reshape(tuple(1 if a not in one_hot.batch_axes else s for a, s in
                                                                                enumerate(one_hot.out_shape)) + (1,) * len(plan.tensors))
    ranked = one_hot.hit.where(number, 0)  # each hit numbered by its position in the (flattened) index shape
    keep = one_hot.hit & (ranked == ranked.max(one_hot.batch_axes, keepdim=True))
    placed = keep.where(value.reshape(value.shape + (1,) * len(plan.tensors)), 0).sum(one_hot.batch_axes, keepdim=True).cast(self.dtype)
    mask = one_hot.hit.max(one_hot.batch_axes, keepdim=True).expand(one_hot.data_shape)
    rest_and_sizes = tuple(s for a, s in enumerate(one_hot.data_shape) if a not in one_hot.batch_axes)
    inverse = argsort(one_hot.order)
    return placed.reshape(rest_and_sizes).permute(inverse), mask.reshape(rest_and_sizes).permute(inverse)

  def _unview(self: Any, plan: IndexPlan, shape: tuple[int, ...]) -> Any:
    """The inverse of _basic_view: self (in the view's shape) put where the view reads from, in a tensor of `shape`, zero elsewhere."""
    x = self.reshape(plan.strided_shape)
    for axis, step in enumerate(plan.steps):
      if abs(step) == 1: continue
      count, stride = x.shape[axis], abs(step)
      x = x.reshape(x.shape[:axis] + (count, 1) + x.shape[axis + 1:])
      x = x.pad(tuple((0, stride - 1) if d == axis + 1 else None for d in range(x.ndim)))
      x = x.reshape(x.shape[:axis] + (count * stride,) + x.shape[axis + 2:])
      x = x.shrink(tuple((0, (count - 1) * stride + 1) if d == axis else None for d in range(x.ndim)))
    if any(step < 0 for step in plan.steps): x = x.flip(tuple(i for i, step in enumerate(plan.steps) if step < 0))
    return x.pad(tuple((begin, size - end) for (begin, end), size in zip(plan.bounds, shape)))
