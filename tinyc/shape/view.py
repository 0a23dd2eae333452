"""Layer 2 (shape): a View maps an index over `shape` to a buffer index (offset + sum(idx*stride)), valid inside `mask`.
Imports tinyc.helpers, tinyc.shape.symbolic and the stdlib.
"""
from __future__ import annotations
import functools, itertools, operator
from dataclasses import dataclass, field
from typing import Sequence
from tinyc.helpers import all_int, prod
from tinyc.shape.symbolic import Node, NumNode, Variable, create_ge_node, create_lt_node, sym_min

Mask = tuple[tuple[int, int], ...]

@functools.lru_cache(maxsize=None)
def strides_for_shape(shape: tuple[int, ...]) -> tuple[int, ...]:
  """Row-major strides; size-1 dims get stride 0."""
  strides = tuple(itertools.accumulate(reversed(shape[1:]), operator.mul, initial=1))[::-1]
  return tuple(0 if size == 1 else stride for size, stride in zip(shape, strides))

def unflatten(shape: tuple[int, ...], flat: int) -> list[int]:
  """Row-major coordinates of `flat` in `shape`; the leading dim takes whatever is left (it may fall outside the shape)."""
  coords = []
  for stride in strides_for_shape(shape):
    coord = flat // stride if stride else 0
    coords.append(coord)
    flat -= coord * stride
  return coords

@dataclass(frozen=True)
class View:
  """Index i over `shape` reads buffer[offset + sum(i*strides)]; it is valid where begin <= i < end for each (begin, end) of `mask`.
  A symbolic dimension is a Node of Variables (bound ones, in a LazyBuffer's views); strides and offset may then be Nodes too (typed
  as ints: the arithmetic and comparisons the shape code does are those of ints, and Nodes answer them)."""
  shape: tuple[int, ...]
  strides: tuple[int, ...]
  offset: int
  mask: Mask | None
  contiguous: bool
  _hash: int = field(default=0, init=False, repr=False, compare=False)
  def __post_init__(self) -> None: object.__setattr__(self, "_hash", hash((self.shape, self.strides, self.offset, self.mask)))
  def __hash__(self) -> int: return self._hash  # hashed once: Views are keys of the memoised movement ops and the scheduler's plans
  def __reduce__(self) -> tuple: return View, (self.shape, self.strides, self.offset, self.mask, self.contiguous)  # hash anew: None's varies

  @staticmethod
  @functools.lru_cache(maxsize=None)
  def create(shape: tuple[int, ...], strides: tuple[int, ...] | None = None, offset: int = 0, mask: Mask | None = None) -> View:
    """The canonical View: size-1 and single-valid-element dims get stride 0, a full mask is None, an empty one makes it all-invalid."""
    shape, offset = tuple(_plain(size) for size in shape), _plain(offset)
    assert all(isinstance(size, (int, Node)) and sym_min(size) >= 0 for size in shape), f"shape must be nonnegative sizes, got {shape}"
    if 0 in shape: return View(shape, (0,) * len(shape), 0, None, True)
    strides = strides_for_shape(shape) if strides is None else tuple(0 if size == 1 else _plain(stride) for size, stride in zip(shape, strides))
    assert len(strides) == len(shape), f"strides {strides} don't match shape {shape}"
    if mask is not None:
      assert len(mask) == len(shape), f"mask {mask} doesn't match shape {shape}"
      if any(begin >= end for begin, end in mask): return View(shape, (0,) * len(shape), 0, ((0, 0),) * len(shape), False)
      # a dim with one valid position reads one place; fold it into the offset so the stride never blocks a merge
      offset += sum(begin * stride for (begin, end), stride in zip(mask, strides) if end - begin == 1)
      strides = tuple(0 if end - begin == 1 else stride for (begin, end), stride in zip(mask, strides))
      if all(begin == 0 and end == size for (begin, end), size in zip(mask, shape)): mask = None
    contiguous = offset == 0 and mask is None and strides == strides_for_shape(shape)
    return View(shape, strides, offset, mask, contiguous)

  @property
  def size(self) -> int: return prod(self.shape)
  @property
  def all_invalid(self) -> bool: return self.mask is not None and any(begin >= end for begin, end in self.mask)

  def expr_idxs(self, idxs: Sequence[Node]) -> Node:
    """The buffer index for per-dim index nodes `idxs`."""
    assert len(idxs) == len(self.shape), f"{len(idxs)} index nodes for shape {self.shape}"
    return Node.sum([self.offset] + [idx * stride for idx, stride, size in zip(idxs, self.strides, self.shape) if stride != 0 and size != 1])

  def expr_valid(self, idxs: Sequence[Node]) -> Node:
    """1 where every idx lies inside the mask, else 0."""
    assert len(idxs) == len(self.shape), f"{len(idxs)} index nodes for shape {self.shape}"
    if self.mask is None: return NumNode(1)
    conditions: list[Node] = []
    for idx, (begin, end), size in zip(idxs, self.mask, self.shape):
      if isinstance(idx, NumNode) and all_int((begin, end)) and (begin != 0 and idx.b < begin or end != size and idx.b >= end): return NumNode(0)
      if begin != 0: conditions.append(create_ge_node(idx, begin))
      if end != size: conditions.append(create_lt_node(idx, end))
    return Node.ands(conditions)

  # ***** movement ops: each returns a new View *****

  @functools.lru_cache(maxsize=None)  # Views are immutable: memoised for the scheduler's hot path
  def reshape(self, new_shape: tuple[int, ...]) -> View | None:
    """The same elements in `new_shape` (row-major), or None when no single View can express it."""
    assert prod(new_shape) == self.size and all(size >= 0 for size in new_shape), f"can't reshape {self.shape} to {new_shape}"
    if self.shape == new_shape: return self
    if 0 in self.shape or self.contiguous: return View.create(new_shape)
    if self.all_invalid: return View.create(new_shape, mask=((0, 0),) * len(new_shape)) if new_shape else None
    return _reshape(self, new_shape) if all_int(self.shape + new_shape) else _reshape_symbolic(self, new_shape)

  def vars(self) -> set[Variable]:
    values = self.shape + self.strides + (self.offset,) + sum(self.mask or (), ())
    return set().union(*[value.vars() for value in values if isinstance(value, Node)])  # type: ignore[attr-defined]
  def substitute(self, mapping: dict[Variable, Node | int]) -> View:
    """This view with Variables replaced (bound ones by unbound ones, or by their values)."""
    def sub(value: int) -> int: return _plain(value.substitute(mapping)) if isinstance(value, Node) else value  # type: ignore[arg-type]
    mask = None if self.mask is None else tuple((sub(begin), sub(end)) for begin, end in self.mask)
    return View(tuple(map(sub, self.shape)), tuple(map(sub, self.strides)), sub(self.offset), mask, self.contiguous)

  def permute(self, order: tuple[int, ...]) -> View:
    assert sorted(order) == list(range(len(self.shape))), f"invalid permutation {order} of shape {self.shape}"
    mask = tuple(self.mask[axis] for axis in order) if self.mask is not None else None
    return View.create(tuple(self.shape[axis] for axis in order), tuple(self.strides[axis] for axis in order), self.offset, mask)

  def expand(self, new_shape: tuple[int, ...]) -> View:
    assert len(new_shape) == len(self.shape) and all(s == n or s == 1 for s, n in zip(self.shape, new_shape)), \
      f"can't expand {self.shape} to {new_shape}"
    if 0 in self.shape: return View.create(new_shape)
    mask = None
    if self.mask is not None:  # a size-1 dim's mask is (0, 1) or empty; it grows to the new size
      mask = tuple(m if s == n else ((0, 0) if m != (0, 1) else (0, n)) for m, s, n in zip(self.mask, self.shape, new_shape))
    return View.create(new_shape, self.strides, self.offset, mask)

  def pad(self, arg: tuple[tuple[int, int], ...]) -> View:
    """Add `before` invalid elements at the start and `after` at the end of each dim."""
    assert len(arg) == len(self.shape) and all(b >= 0 and e >= 0 for b, e in arg), f"invalid pad {arg} for shape {self.shape}"
    if all(b == 0 and e == 0 for b, e in arg): return self
    return self._resize(tuple((-b, size + e) for size, (b, e) in zip(self.shape, arg)), tuple((b, size + b) for size, (b, _) in zip(self.shape, arg)))

  def shrink(self, arg: tuple[tuple[int, int], ...]) -> View:
    """Keep [begin, end) of each dim."""
    assert len(arg) == len(self.shape) and all(0 <= b <= e <= s for (b, e), s in zip(arg, self.shape)), f"invalid shrink {arg} for shape {self.shape}"
    return self._resize(arg)

  def _resize(self, arg: tuple[tuple[int, int], ...], mask: Mask | None = None) -> View:
    """Window [begin, end) of each dim (begin may be negative and end past the size, for pad); `mask` is the new valid region."""
    offset = self.offset + sum(stride * begin for stride, (begin, _) in zip(self.strides, arg))
    if self.mask is not None:
      moved = tuple((max(0, min(mb - b, e - b)), max(0, min(me - b, e - b))) for (mb, me), (b, e) in zip(self.mask, arg))
      mask = moved if mask is None else tuple((max(b1, b2), min(e1, e2)) for (b1, e1), (b2, e2) in zip(moved, mask))
    return View.create(tuple(e - b for b, e in arg), self.strides, offset, mask)

  def stride(self, mul: tuple[int, ...]) -> View:
    """Every mul-th element of each dim; a negative mul walks the dim backwards (mul=-1 is a flip)."""
    assert len(mul) == len(self.shape) and all(isinstance(m, int) and m != 0 for m in mul), f"invalid stride {mul} for shape {self.shape}"
    strides = tuple(stride * m for stride, m in zip(self.strides, mul))
    new_shape = tuple((size + abs(m) - 1) // abs(m) for size, m in zip(self.shape, mul))
    offset = self.offset + sum((size - 1) * stride for size, stride, m in zip(self.shape, self.strides, mul) if m < 0)
    mask = None
    if self.mask is not None:
      mask = tuple((((mb if m > 0 else s - me) + abs(m) - 1) // abs(m), ((me if m > 0 else s - mb) + abs(m) - 1) // abs(m))
                   for (mb, me), s, m in zip(self.mask, self.shape, mul))
    return View.create(new_shape, strides, offset, mask)

  @functools.lru_cache(maxsize=None)
  def __add__(self, other: View) -> View | None:
    """One View equal to applying `other` on top of the elements `self` describes, or None when one View can't express it."""
    return _merge_views(self, other)

def _reshape(view: View, new_shape: tuple[int, ...]) -> View | None:
  # Group old and new dims (size-1 dims left out) into blocks of equal size; in each block merge the old dims into one
  # run (stride, valid interval), then split that run over the new dims.
  mask = view.mask if view.mask is not None else tuple((0, size) for size in view.shape)
  old = [(size, stride, m) for size, stride, m in zip(view.shape, view.strides, mask) if size != 1]
  new_axes = [axis for axis, size in enumerate(new_shape) if size != 1]
  new_strides, new_mask, offset = [0] * len(new_shape), [(0, 1)] * len(new_shape), view.offset
  old_at, new_at = 0, 0
  while old_at < len(old):
    old_block, new_block = [old[old_at]], [new_axes[new_at]]
    old_size, new_size = old[old_at][0], new_shape[new_axes[new_at]]
    old_at, new_at = old_at + 1, new_at + 1
    while old_size != new_size:
      if old_size < new_size: old_block.append(old[old_at]); old_size *= old[old_at][0]; old_at += 1
      else: new_block.append(new_axes[new_at]); new_size *= new_shape[new_axes[new_at]]; new_at += 1
    if (run := _merge_run(old_block)) is None: return None
    stride, offset_delta, begin, end = run
    if (split := _split_run(stride, begin, end, [new_shape[axis] for axis in new_block])) is None: return None
    offset += offset_delta
    for axis, (axis_stride, axis_mask) in zip(new_block, split): new_strides[axis], new_mask[axis] = axis_stride, axis_mask
  return View.create(new_shape, tuple(new_strides), offset, tuple(new_mask))

def _plain(value: int) -> int:
  """A size, stride or offset as the shape code keeps it: an int, or a Node only where it is symbolic (typed int, as Nodes do int math)."""
  return value.b if isinstance(value, NumNode) else value

def _reshape_symbolic(view: View, new_shape: tuple[int, ...]) -> View | None:
  """A reshape that keeps every symbolic dim a dim of its own: the concrete dims between two of them are reshaped as a view of their
  own (by the rules above), the symbolic dims keep their stride and mask. None where the symbolic dims do not match up."""
  def symbolic(shape: tuple[int, ...]) -> list[int]: return [axis for axis, size in enumerate(shape) if not isinstance(size, int)]
  def runs(shape: tuple[int, ...]) -> list[list[int]]:  # the dims of each concrete run, split at the symbolic dims
    bounds = [-1] + symbolic(shape) + [len(shape)]
    return [list(range(start + 1, end)) for start, end in zip(bounds, bounds[1:])]
  old_runs, new_runs = runs(view.shape), runs(new_shape)
  if [view.shape[a] for a in symbolic(view.shape)] != [new_shape[a] for a in symbolic(new_shape)]: return None
  mask = view.mask if view.mask is not None else tuple((0, size) for size in view.shape)
  strides, new_mask, offset = [view.strides[0]] * len(new_shape), [mask[0]] * len(new_shape), view.offset
  for old_axis, new_axis in zip(symbolic(view.shape), symbolic(new_shape)):
    strides[new_axis], new_mask[new_axis] = view.strides[old_axis], mask[old_axis]
  for old, new in zip(old_runs, new_runs):
    if prod(view.shape[a] for a in old) != prod(new_shape[a] for a in new): return None
    part = View.create(tuple(view.shape[a] for a in old), tuple(view.strides[a] for a in old), 0, tuple(mask[a] for a in old))
    if (reshaped := part.reshape(tuple(new_shape[a] for a in new))) is None: return None
    offset += reshaped.offset
    for axis, stride, axis_mask in zip(new, reshaped.strides, reshaped.mask or tuple((0, new_shape[a]) for a in new)):
      strides[axis], new_mask[axis] = stride, axis_mask
  return View.create(new_shape, tuple(strides), offset, tuple(new_mask))

def _merge_run(dims: list[tuple[int, int, tuple[int, int]]]) -> tuple[int, int, int, int] | None:
  """Merge (size, stride, mask) dims, major first, into one: (stride, offset change, valid begin, valid end), if it is one run."""
  # The valid box is an interval of the merged dim iff: dims after some k are fully valid, and dims before k have one valid element.
  first_varying = len(dims)
  while first_varying > 0 and dims[first_varying - 1][2] == (0, dims[first_varying - 1][0]): first_varying -= 1
  if first_varying > 0 and dims[first_varying - 1][2][1] - dims[first_varying - 1][2][0] > 1: first_varying -= 1
  if any(end - begin != 1 for _, _, (begin, end) in dims[:first_varying]): return None
  varying = dims[first_varying:]
  if any(stride != next_stride * next_size for (_, stride, _), (next_size, next_stride, _) in zip(varying, varying[1:])): return None
  stride = dims[-1][1] if varying else 0
  sizes_after = [prod(size for size, _, _ in dims[axis + 1:]) for axis in range(len(dims))]
  fixed_base = sum(begin * after for (_, _, (begin, _)), after in zip(dims[:first_varying], sizes_after))
  offset_delta = sum(begin * (dim_stride - stride * after) for (_, dim_stride, (begin, _)), after in zip(dims[:first_varying], sizes_after))
  if not varying: return stride, offset_delta, fixed_base, fixed_base + 1
  begin, end = varying[0][2]
  return stride, offset_delta, fixed_base + begin * sizes_after[first_varying], fixed_base + end * sizes_after[first_varying]

def _split_run(stride: int, begin: int, end: int, sizes: list[int]) -> list[tuple[int, tuple[int, int]]] | None:
  """Split a run of prod(sizes) elements valid on [begin, end) into dims `sizes`: (stride, mask) each, if the valid part is a box."""
  result = []
  for axis in range(len(sizes)):
    after = prod(sizes[axis + 1:])
    if begin // after == (end - 1) // after: mask, begin, end = (begin // after, begin // after + 1), begin % after, (end - 1) % after + 1
    elif begin % after == 0 and end % after == 0: mask, begin, end = (begin // after, end // after), 0, after
    else: return None
    result.append((stride * after, mask))
  return result

def _merge_symbolic(base: View, top: View) -> View | None:
  """The rules below are for ints; with symbolic sizes, a top view whose every moving dim walks one dim of base's (the same size, its
  row-major stride) merges, as a reshape, permute or expand of base's shape does. Else None."""
  if base.mask is not None or top.mask is not None or top.offset != 0: return None
  row_strides, strides, used = strides_for_shape(base.shape), [], set()
  for size, stride in zip(top.shape, top.strides):
    matches = [axis for axis, row in enumerate(row_strides) if stride != 0 and row == stride and base.shape[axis] == size and axis not in used]
    if stride != 0 and not matches: return None
    used.update(matches[:1])
    strides.append(base.strides[matches[0]] if matches else 0)
  return View.create(top.shape, tuple(strides), base.offset)

def _merge_views(base: View, top: View) -> View | None:
  if base.contiguous: return top
  if top.contiguous and top.shape == base.shape: return base
  if top.contiguous and top.size == base.size: return base.reshape(top.shape)
  if not all_int(base.shape + base.strides + top.shape + top.strides + (base.offset, top.offset)): return _merge_symbolic(base, top)
  if base.all_invalid or top.all_invalid or 0 in top.shape: return View.create(top.shape, mask=((0, 0),) * len(top.shape)) if top.shape else None
  if top.mask is not None:  # merge the valid window, then pad back out to the mask
    merged = base + top.shrink(top.mask)
    return None if merged is None else merged.pad(tuple((b, size - e) for (b, e), size in zip(top.mask, top.shape)))
  # Project top's offset and each of its strides onto base's dims: terms[base_axis] lists (top_axis, coordinate step).
  origin = unflatten(base.shape, top.offset)
  terms: list[list[tuple[int, int]]] = [[] for _ in base.shape]
  strides = [0] * len(top.shape)
  for top_axis, top_stride in enumerate(top.strides):
    if top_stride == 0: continue
    for base_axis, (start, moved) in enumerate(zip(origin, unflatten(base.shape, top.offset + top_stride))):
      if moved != start:
        terms[base_axis].append((top_axis, moved - start))
        strides[top_axis] += (moved - start) * base.strides[base_axis]
  def bounds(constant: int, coefficients: dict[int, int]) -> tuple[int, int]:
    spans = [c * (top.shape[axis] - 1) for axis, c in coefficients.items()]
    return constant + sum(min(0, span) for span in spans), constant + sum(max(0, span) for span in spans)
  # Each base coordinate must stay inside its dim (no carries); where one doesn't, merge it with the dims before it.
  extents, group_size, constant, coefficients = list[int](), 1, 0, dict[int, int]()
  for base_axis in reversed(range(len(base.shape))):
    constant += origin[base_axis] * group_size
    for top_axis, step in terms[base_axis]: coefficients[top_axis] = coefficients.get(top_axis, 0) + step * group_size
    group_size *= base.shape[base_axis]
    low, high = bounds(constant, coefficients)
    if low >= 0 and high < group_size: extents.append(group_size); group_size, constant, coefficients = 1, 0, dict[int, int]()
  if group_size != 1 or constant != 0 or coefficients: return None
  if (merged_shape := tuple(reversed(extents))) != base.shape:
    return None if (reshaped := base.reshape(merged_shape)) is None else reshaped + top
  if base.mask is not None:  # base's mask becomes a mask on top's dims, when each masked coordinate follows one top dim
    new_begin, new_end, bad = [0] * len(top.shape), list(top.shape), False
    for (begin, end), start, term in zip(base.mask, origin, terms):
      low, high = bounds(start, dict(term))
      if begin <= low and high < end: continue
      if not term: return View.create(top.shape, mask=((0, 0),) * len(top.shape)) if top.shape else None
      if len(term) != 1: bad = True; continue
      axis, step = term[0]  # start + step*i in [begin, end)
      low_bound, high_bound = (begin - start, end - 1 - start) if step > 0 else (end - 1 - start, begin - start)
      new_begin[axis], new_end[axis] = max(new_begin[axis], -(-low_bound // step)), min(new_end[axis], high_bound // step + 1)
    if any(b != 0 or e != size for b, e, size in zip(new_begin, new_end, top.shape)):
      return base + View.create(top.shape, top.strides, top.offset, tuple((b, max(b, e)) for b, e in zip(new_begin, new_end)))
    if bad: return None
  return View.create(top.shape, tuple(strides), base.offset + sum(o * stride for o, stride in zip(origin, base.strides)))
