"""Layer 2 (shape): a ShapeTracker is a stack of Views; it turns an index over its shape into a buffer index and a validity.
Imports tinyc.helpers, tinyc.shape and the stdlib.
"""
from __future__ import annotations
import functools
from dataclasses import dataclass, field
from typing import Sequence
from tinyc.helpers import all_int, prod
from tinyc.shape.symbolic import MulNode, Node, NumNode, SumNode, Variable, bound_values, sym_max, sym_min
from tinyc.shape.view import View, strides_for_shape

@functools.lru_cache(maxsize=None)
def index_variables(shape: tuple[int, ...]) -> tuple[Node, ...]:
  """Variables idx0, idx1, ... over `shape` (a size-1 dim gives NumNode(0); a symbolic dim's runs to its largest size)."""
  return tuple(Variable(f"idx{axis}", 0, sym_max(size) - 1) if sym_max(size) > 0 else NumNode(0) for axis, size in enumerate(shape))

def flatten_node(idxs: Sequence[Node], shape: Sequence[int]) -> Node:
  """The row-major flat index of per-dim index nodes `idxs` over `shape`."""
  return Node.sum([idx * prod(shape[i + 1:]) for i, idx in enumerate(idxs)])

# cached: a kernel's buffers often read through views of one shape, so each lane's index is divided once, not once a buffer (a
# Winograd transform's 484 buffers: its lowering for an H200 went from 18.9 s to 4.6 s)
@functools.lru_cache(maxsize=1 << 16)
def unflatten_node(flat: Node, shape: tuple[int, ...]) -> tuple[Node, ...]:
  """Per-dim index nodes of the row-major flat index `flat` over `shape`."""
  return tuple((flat // stride if stride else NumNode(0)) % size if size > 1 else NumNode(0) for size, stride in zip(shape, strides_for_shape(shape)))

@dataclass(frozen=True)
class ShapeTracker:
  """views[-1] is indexed by the user; each view's flat (row-major) index is the index into the view below; views[0] indexes the buffer."""
  views: tuple[View, ...]
  _hash: int = field(default=0, init=False, repr=False, compare=False)
  shape: tuple[int, ...] = field(default=(), init=False, repr=False, compare=False)  # views[-1]'s, kept: every LazyBuffer made reads it
  def __post_init__(self) -> None:
    object.__setattr__(self, "_hash", hash(self.views))
    object.__setattr__(self, "shape", self.views[-1].shape)
  def __hash__(self) -> int: return self._hash  # hashed once: trackers are keys of the memoised movement ops and the scheduler's plans
  def __reduce__(self) -> tuple: return ShapeTracker, (self.views,)  # unpickled in another process (a BEAM worker): hashed there anew

  @staticmethod
  def from_shape(shape: Sequence[int]) -> ShapeTracker: return _from_shape(tuple(shape))

  @property
  def size(self) -> int: return prod(self.shape)
  @property
  def contiguous(self) -> bool: return len(self.views) == 1 and self.views[0].contiguous

  @functools.lru_cache(maxsize=None)  # the scheduler asks this on every realize
  def real_size(self) -> int:
    """How many elements the buffer under views[0] must hold: the largest valid index + 1 (0 when nothing is valid), for the largest
    value of each Variable."""
    view = self.views[0]
    if 0 in view.shape or view.all_invalid: return 0
    mask = view.mask if view.mask is not None else tuple((0, size) for size in view.shape)
    return sym_max(view.offset + sum(stride * (end - 1 if sym_min(stride) > 0 else begin) for stride, (begin, end) in zip(view.strides, mask)) + 1)

  def vars(self) -> set[Variable]: return set().union(*[view.vars() for view in self.views])
  def substitute(self, mapping: dict[Variable, Node | int]) -> ShapeTracker:
    return ShapeTracker(tuple(view.substitute(mapping) for view in self.views))
  def bound(self) -> ShapeTracker:
    """This tracker with each bound Variable replaced by its value: concrete."""
    return self.substitute({var: value for view in self.views for size in view.shape for var, value in bound_values(size).items()})

  # ***** movement ops: each returns a new ShapeTracker *****

  @functools.lru_cache(maxsize=None)
  def reshape(self, new_shape: tuple[int, ...]) -> ShapeTracker:
    assert all(isinstance(size, (int, Node)) and sym_min(size) >= 0 for size in new_shape), f"reshape needs nonnegative sizes, got {new_shape}"
    if all_int(new_shape) and not all_int(self.shape): return self.bound().reshape(new_shape)  # a symbolic shape to the sizes it is bound to
    assert prod(new_shape) == self.size, f"can't reshape {self.shape} ({self.size} elements) to {new_shape} ({prod(new_shape)} elements)"
    if (new_view := self.views[-1].reshape(tuple(new_shape))) is not None: return ShapeTracker(self.views[:-1] + (new_view,))
    if not all_int(self.shape + new_shape):
      raise NotImplementedError(f"reshaping the view {self.shape} to {new_shape} needs a symbolic dim to join others: call .contiguous() first")
    return ShapeTracker(self.views + (View.create(tuple(new_shape)),))  # no single view can: index the old one through a new one

  @functools.lru_cache(maxsize=None)
  def permute(self, order: tuple[int, ...]) -> ShapeTracker:
    assert sorted(order) == list(range(len(self.shape))), f"permute order {order} is not a permutation of the {len(self.shape)} axes of {self.shape}"
    return ShapeTracker(self.views[:-1] + (self.views[-1].permute(tuple(order)),))

  @functools.lru_cache(maxsize=None)
  def expand(self, new_shape: tuple[int, ...]) -> ShapeTracker:
    assert len(new_shape) == len(self.shape) and all(old == new or old == 1 for old, new in zip(self.shape, new_shape)), \
      f"can't expand {self.shape} to {new_shape}: only size-1 dims expand"
    return ShapeTracker(self.views[:-1] + (self.views[-1].expand(tuple(new_shape)),))

  @functools.lru_cache(maxsize=None)
  def pad(self, arg: tuple[tuple[int, int], ...]) -> ShapeTracker:
    assert len(arg) == len(self.shape) and all(before >= 0 and after >= 0 for before, after in arg), f"invalid pad {arg} for shape {self.shape}"
    return ShapeTracker(self.views[:-1] + (self.views[-1].pad(tuple(arg)),))

  @functools.lru_cache(maxsize=None)
  def shrink(self, arg: tuple[tuple[int, int], ...]) -> ShapeTracker:
    assert len(arg) == len(self.shape) and all(0 <= begin <= end <= size for (begin, end), size in zip(arg, self.shape)), \
      f"invalid shrink {arg} for shape {self.shape}"
    return ShapeTracker(self.views[:-1] + (self.views[-1].shrink(tuple(arg)),))

  @functools.lru_cache(maxsize=None)
  def stride(self, mul: tuple[int, ...]) -> ShapeTracker:
    assert len(mul) == len(self.shape) and all(isinstance(m, int) and m != 0 for m in mul), f"invalid stride {mul} for shape {self.shape}"
    return ShapeTracker(self.views[:-1] + (self.views[-1].stride(tuple(mul)),))

  # ***** composing and simplifying *****

  @functools.lru_cache(maxsize=None)
  def __add__(self, other: ShapeTracker) -> ShapeTracker:
    """Index self's buffer through `other`, a tracker built on top of self.shape."""
    # other.views[0] indexes a row-major buffer of self.shape (an expanded view is larger than what it indexes)
    if all_int(other.views[0].shape) and not all_int(self.shape): return self.bound() + other  # read at the sizes it was bound to
    result = self
    for view in other.views:
      if view.shape != result.shape and view.size == result.size and view.contiguous: result = result.reshape(view.shape)
      else: result = ShapeTracker(result.views + (view,)).simplify()
    return result

  @functools.lru_cache(maxsize=None)
  def simplify(self) -> ShapeTracker:
    """Merge adjacent views wherever one View can express both, until nothing merges."""
    for at in reversed(range(len(self.views) - 1)):
      if (merged := self.views[at] + self.views[at + 1]) is not None:
        return ShapeTracker(self.views[:at] + (merged,) + self.views[at + 2:]).simplify()
    return self

  # ***** index expressions *****

  def expr_idxs(self, idxs: Sequence[Node] | None = None) -> tuple[Node, Node]:
    """(buffer index, validity) for per-dim index nodes `idxs` (default: Variables idx0, idx1, ... over the shape)."""
    return self._expr_idxs(index_variables(self.shape) if idxs is None else tuple(idxs))

  @functools.lru_cache(maxsize=None)
  def _expr_idxs(self, idxs: tuple[Node, ...]) -> tuple[Node, Node]:
    assert len(idxs) == len(self.shape), f"{len(idxs)} index nodes for shape {self.shape}"
    if (valid := self.views[-1].expr_valid(idxs)).max == 0: return NumNode(0), NumNode(0)  # (a padded piece's lanes: most of them)
    idx = self.views[-1].expr_idxs(idxs)
    for view in reversed(self.views[:-1]):
      if valid.max == 0: return NumNode(0), NumNode(0)
      if not all_int(view.shape): raise NotImplementedError(f"views {self.views} stack a symbolic shape: call .contiguous() first")
      view = _minify(view)
      view_idxs = unflatten_node(idx, view.shape)
      idx, valid = view.expr_idxs(view_idxs), Node.ands([valid, view.expr_valid(view_idxs)])
    return (NumNode(0), valid) if valid.max == 0 else (idx, valid)

  def expr_node(self, idx: Node | None = None) -> tuple[Node, Node]:
    """(buffer index, validity) for one row-major flat index over the shape (default: Variable idx)."""
    flat = Variable("idx", 0, max(self.size - 1, 0)) if idx is None else idx
    return self.expr_idxs(unflatten_node(flat, self.shape))

  @functools.lru_cache(maxsize=None)
  def real_strides(self, ignore_valid: bool = False) -> tuple[int | None, ...]:
    """Per dim: the buffer stride when the index is linear in that dim, else None (also None when the dim is masked, unless ignore_valid)."""
    if len(self.views) == 1 and self.views[0].mask is None: return self.views[0].strides
    idxs = index_variables(self.shape)
    idx, valid = self.expr_idxs(idxs)
    strides: list[int | None] = [None] * len(self.shape)
    nonlinear: set[Variable] = set()
    for term in (idx.nodes if isinstance(idx, SumNode) else [idx]):
      variable, stride = (term.a, term.b) if isinstance(term, MulNode) else (term, 1)
      if isinstance(variable, Variable) and isinstance(stride, int) and variable in idxs: strides[idxs.index(variable)] = stride
      else: nonlinear |= term.vars()
    used, masked = idx.vars(), valid.vars()
    for axis, variable in enumerate(idxs):
      if not isinstance(variable, Variable): strides[axis] = 0
      elif variable in nonlinear or (variable in masked and not ignore_valid): strides[axis] = None
      elif variable not in used: strides[axis] = 0
    return tuple(strides)

  def unit_stride_axes(self, ignore_valid: bool = False) -> list[int]:
    return [axis for axis, stride in enumerate(self.real_strides(ignore_valid)) if stride == 1]

  def axis_is_masked(self, axis: int) -> bool:
    variable = index_variables(self.shape)[axis]
    return isinstance(variable, Variable) and variable in self.expr_idxs()[1].vars()

def _minify(view: View) -> View:
  """`view` with adjacent dims that form one run merged into one dim (fewer // and % in the index expressions)."""
  if len(view.shape) < 2 or view.mask is not None or not all_int(view.shape + view.strides): return view
  shape: list[int] = []
  strides: list[int] = []
  for size, stride in zip(view.shape, view.strides):
    if size == 1: continue
    if shape and strides[-1] == stride * size: shape[-1], strides[-1] = shape[-1] * size, stride
    else: shape.append(size); strides.append(stride)
  return view if len(shape) == len(view.shape) else (view.reshape(tuple(shape)) or view)

@functools.lru_cache(maxsize=None)
def _from_shape(shape: tuple[int, ...]) -> ShapeTracker: return ShapeTracker((View.create(shape),))  # every new base asks for one
