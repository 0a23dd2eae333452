"""Layer 5: the scheduler's decisions: what the kernel being built does with each base it reaches, and why (the rules are stated
in schedule.py's docstring; each reason names its rule). A pure function of the base and the site. Imports helpers, ops, shape/, lazy.
"""
from __future__ import annotations
from enum import Enum, auto
from typing import Container, NamedTuple, cast
from tinyc.dtype import dtypes
from tinyc.helpers import prod
from tinyc.ops import ElementwiseOps, LoadOps, ReduceOps, UnaryOps, UNSAFE_PAD_OPS
from tinyc.shape.shapetracker import ShapeTracker
from tinyc.shape.view import strides_for_shape
from tinyc.lazy import NESTED_MAX, LazyBuffer

# a reduce of another frame nested in a kernel's loops (rule 10) sums at most this many elements a trip in loops of its own, and is
# shared by at most this many output elements it does not depend on (the heuristic makes them lanes): attention's head dim (NESTED_MAX,
# in lazy.py, whose split-K leaves alone a sum of products that reads such a contraction)
TRANSCENDENTAL = (UnaryOps.EXP2, UnaryOps.LOG2, UnaryOps.SIN, UnaryOps.SQRT)

WIDE_READ = 4  # rule 2: a value several bases read whose inputs come to this many times its own bytes is stored once (wide_values)

def wide_values(targets: list[LazyBuffer], consumers: dict[LazyBuffer, int]) -> set[LazyBuffer]:
  """Rule 2's exception by bytes: an elementwise value that several bases read, and that reads (through elementwise ops) buffers of at
  least WIDE_READ times its own bytes, is stored once rather than computed again from them all by each reader: a transformer's residual
  stream, the sum of every layer's output, which each layernorm and its backward read. Walked sources first, so a value stored so is
  one buffer to the values above it; a buffer, a reduce or a load op is one buffer, a constant none."""
  stored: set[LazyBuffer] = set()
  reads: dict[LazyBuffer, frozenset[LazyBuffer]] = {}
  stack = [(target, False) for target in targets]
  while stack:
    base, sources_done = stack.pop()
    if base in reads: continue
    if base.realized is None and not sources_done:
      stack.extend([(base, True)] + [(src.base, False) for src in base.srcs if src.base not in reads])
      continue
    if base.realized is not None or not isinstance(base.op, ElementwiseOps):
      reads[base] = frozenset() if base.op is LoadOps.CONST and base.realized is None else frozenset((base,))
      continue
    read = frozenset().union(*(reads[src.base] for src in base.srcs))
    if consumers.get(base, 0) > 1 and sum(map(_bytes, read)) >= WIDE_READ * _bytes(base) > 0:
      stored.add(base)
      read = frozenset((base,))
    reads[base] = read
  return stored

def _bytes(base: LazyBuffer) -> int: return size * base.dtype.itemsize if isinstance(size := prod(base.shape), int) else 0

class Fusion(Enum):
  """What a kernel does with a base it reaches."""
  LOAD = auto()           # read it from memory: it is realized, or another kernel stores it
  REALIZE = auto()        # store it in a kernel of its own first, then read it from memory
  CONST = auto()          # a scalar broadcast: no memory at all
  INLINE = auto()         # compute it here (an elementwise op; an assign or contiguous stored here: its value)
  REDUCE = auto()         # compute it here as a reduce of the kernel's own, before the stores
  ROW_REDUCE = auto()     # compute it here and read it back along the axes it reduced (rule 7)
  NESTED_REDUCE = auto()  # compute it inside another reduce's loop, once per trip of the loops it depends on (rules 3 and 10)
  EMPTY_REDUCE = auto()   # a reduce of nothing: the reduce's identity, a constant

class Decision(NamedTuple):
  fusion: Fusion
  reason: str                      # a sentence naming the rule
  store: ShapeTracker | None = None  # also store it through this view, as one more output of the kernel (rule 8)
  nesting: Nesting | None = None     # how a reduce of another frame runs in the kernel's loops (rule 10)

class Frame(NamedTuple):
  """The loops of a reduce: its input's shape and the axes it reduces."""
  shape: tuple[int, ...]
  axes: tuple[int, ...]

class Site(NamedTuple):
  """Where the kernel being built reaches a base: the view it reads it through and what lies between it and the stores."""
  root: LazyBuffer                   # the base the kernel was made for (its first output)
  st: ShapeTracker                   # the view through which the base is read
  shared: bool                       # a base between here and the store has several consumers
  enclosing: tuple[int, ...] | None  # the axes of the innermost reduce whose input this is (None: outside every reduce)
  frame: Frame | None                # the frame of the kernel's reduces, once it has one (a row kernel has none)
  row_axes: tuple[int, ...] | None   # the axes the kernel's row reduces reduce, once it has one
  loops: tuple[int, ...] = ()        # the reduce axes whose loops run around this place

class Nesting(NamedTuple):
  """A reduce of another frame computed inside the kernel's loops (rule 10): for each dim of its input, the kernel axis it runs along
  (None for a dim of size 1), and the reduced dims that become loops of their own (new axes, appended to the kernel's)."""
  axes: tuple[int | None, ...]
  new: tuple[int, ...]
  varying: frozenset[int]  # the kernel axes its result varies along

def decide(base: LazyBuffer, site: Site, consumers: int, realize: bool, stored: bool, realizes: Container[LazyBuffer] = ()) -> Decision:
  """What the kernel at `site` does with `base`: `consumers` bases read it, `realize` says the graph-level rules (3, 5) store it,
  `stored` that another kernel already does; `realizes`: the bases stored so far (loaded, not computed, where this kernel reaches them)."""
  if base is site.root:
    if base.op is LoadOps.CONST: return Decision(Fusion.CONST, "the kernel stores a constant")
    if isinstance(base.op, ReduceOps): return _reduce(base, Fusion.REDUCE, "rule 5: the kernel stores this reduce")
    return Decision(Fusion.INLINE, "rule 5: the kernel stores it")
  if base.realized is not None: return Decision(Fusion.LOAD, "it is realized")
  if realize: return _also_store(base, site, consumers, stored)
  if base.op is LoadOps.CONST: return Decision(Fusion.CONST, "a constant needs no memory")
  if isinstance(base.op, ReduceOps) and prod(base.srcs[0].shape):
    if (how := _fuse_reduce(base, site, consumers, storing=False)).fusion is Fusion.REALIZE and not stored:
      if (here := _also_store(base, site, consumers, stored)).store is not None: return here  # rule 8: this kernel stores it
    return how
  if base.op in UNSAFE_PAD_OPS and _has_mask(site.st):
    return Decision(Fusion.REALIZE, f"rule 4: it is seen through a pad and f(0) != 0 for {base.op.name}")
  if (site.enclosing is not None and prod(base.shape) > 1 and _expanded_outside(site.st, site.enclosing) and _reads_memory(base)
      and not _feeds_nesting(base, site, realizes) and not _widens_stored(base, realizes)):
    if consumers > 1:
      return Decision(Fusion.REALIZE, "rule 2: several kernels read it and a reduce reads it through an expand along an output axis, "
                                      "which would recompute it once per output element (a single value is recomputed)")
    if _transcendental(base):
      return Decision(Fusion.REALIZE, "rule 2: a reduce reads it through an expand along an output axis, and it computes exp, log, sin or "
                                      "sqrt: once per output element that costs more than the reduce (gelu before a projection)")
  if isinstance(base.op, ReduceOps): return _reduce(base, Fusion.REDUCE, "")
  assert isinstance(base.op, ElementwiseOps), f"cannot inline {base.op} into a kernel"
  return Decision(Fusion.INLINE, "rule 1: an elementwise op fuses into its reader" + (", and rule 2: recomputed rather than stored"
                                                                                        if consumers > 1 else ""))

def _also_store(base: LazyBuffer, site: Site, consumers: int, stored: bool) -> Decision:
  """Rule 8: a value that must be stored is computed and stored by the first kernel that reads it at the index it is stored at."""
  if site.enclosing is not None and not stored and isinstance(base.op, ReduceOps) and _why_not_nested(base, site) is None:
    return Decision(Fusion.NESTED_REDUCE, "rule 3: it must be stored, but a row reduce read inside another reduce over its rows is computed "
                                          "in that reduce's loop (the kernel that reads it outside the reduce stores it)")
  if stored: return Decision(Fusion.LOAD, "another kernel stores it")
  if (store := _store_view(base, site)) is None:
    return Decision(Fusion.LOAD, "it is stored (an output, a load op, or a value rules 2-4 store) by a kernel of its own, as this kernel "
                                 "does not read it at the index it is stored at")
  if base.op in (LoadOps.ASSIGN, LoadOps.CONTIGUOUS): how = Decision(Fusion.INLINE, f"its value is computed here ({base.op.name})")
  elif isinstance(base.op, LoadOps): return Decision(Fusion.LOAD, f"a {base.op.name} is a load op of its own")
  elif isinstance(base.op, ReduceOps) and prod(base.srcs[0].shape): how = _fuse_reduce(base, site, consumers, storing=True)
  else: how = decide(base, site, consumers, realize=False, stored=False)
  if how.fusion not in (Fusion.INLINE, Fusion.REDUCE, Fusion.ROW_REDUCE): return Decision(Fusion.LOAD, "it is stored by a kernel of its own")
  return Decision(how.fusion, f"rule 8: it must be stored, and this kernel reads it at the index it is stored at, so it stores it as one "
                              f"more output ({how.reason})", store)

def _store_view(base: LazyBuffer, site: Site) -> ShapeTracker | None:
  """The view, in the kernel's dims, through which a kernel that reads `base` through `site.st` would store it: each element once,
  outside every reduce (a plain reshape of it, or in a row kernel its expand along the row axes). None if there is none."""
  if site.enclosing is not None or prod(base.shape) == 0: return None
  if _is_plain_reshape(site.st) and site.st.size == prod(base.shape): return site.st
  if _is_expand_of(base.shape, site.st):
    return ShapeTracker.from_shape(base.shape)  # the kernel checks that the expanded axes are its row axes (KernelBuilder._check)
  return None

def _fuse_reduce(base: LazyBuffer, site: Site, consumers: int, storing: bool) -> Decision:
  """How a kernel computes a reduce it reaches (`storing`: it also stores it, so other kernels reading it does not matter)."""
  frame = Frame(base.srcs[0].shape, base.arg)
  if site.enclosing is not None:
    if (why := _why_not_nested(base, site)) is None:
      return Decision(Fusion.NESTED_REDUCE, "rule 3: a row reduce read by another reduce over its rows, computed in that reduce's loop once "
                                            "per row")
    if isinstance(nested := nesting(base, site), Nesting) and not (nested.new and consumers > 1):  # (its other readers would store it)
      return Decision(Fusion.NESTED_REDUCE, "rule 10: a reduce of another frame read by another reduce, computed in its loops once per element"
                                            + (" with loops of its own" if nested.new else ""), nesting=nested)
    return Decision(Fusion.REALIZE, f"rule 3: a reduce read by another reduce is stored first, as {why}; and rule 10: {nested}")
  if _is_row_read(base, site):
    return Decision(Fusion.ROW_REDUCE, "rule 7: a reduce read back along the axes it reduced, by a kernel that stores its input's shape: "
                                       "computed in the row kernel before the row's store" + (", by every kernel that reads its rows"
                                                                                              if consumers > 1 else ""))
  if consumers > 1 and not storing:
    return Decision(Fusion.REALIZE, "rule 3: a reduce is computed once, and several kernels read it, not all by its rows")
  if site.shared and not storing:
    return Decision(Fusion.REALIZE, "rule 3: a reduce is computed once, and several kernels read a value between it and the store")
  if storing and site.frame is None and _is_contraction(base):
    return Decision(Fusion.REALIZE, "rule 8: a matmul is not stored by its reader: its own kernel's tile is chosen for it alone")
  if storing and site.frame is None and site.row_axes is None and _row_reduces_under(site.root) - {base}:
    return Decision(Fusion.REALIZE, "rule 8: its reader is a row kernel (rule 7), which a reduce over other loops would break")
  if site.row_axes is not None: return Decision(Fusion.REALIZE, "rule 3: the row kernel has row reduces of its own")
  if site.frame is not None and site.frame != frame:
    return Decision(Fusion.REALIZE, "rule 3: the kernel already has a reduce over other loops")
  if not _is_plain_reshape(site.st): return Decision(Fusion.REALIZE, "rule 3: it is read through a view other than a plain reshape")
  if site.frame == frame: return Decision(Fusion.REDUCE, "rule 3: a reduce over the same loops as the kernel's reduce joins it")
  return Decision(Fusion.REDUCE, "rule 3: the kernel's reduce, read through a plain reshape")

def _why_not_nested(base: LazyBuffer, site: Site) -> str | None:
  """Rule 3: a reduce inside another reduce's input is computed in its loop if it is read exactly along its rows, reduces only axes
  the outer reduce reduces, and the axes it depends on come before the others (so it runs once per trip of those loops)."""
  outer = site.enclosing
  assert outer is not None
  if base.srcs[0].shape != site.st.shape or not _is_expand_of(base.shape, site.st):
    return "it is not read back exactly along its rows"
  if not set(base.arg) <= set(outer): return "it reduces axes the outer reduce does not"
  depends = [axis for axis in outer if base.shape[axis] > 1]
  if depends and max(depends) > min((axis for axis in outer if axis not in depends), default=len(base.shape)):
    return "an axis it depends on comes after one it does not: it would be computed once per trip of that loop"
  return None

def nesting(base: LazyBuffer, site: Site) -> Nesting | str:
  """Rule 10: how a reduce read inside another reduce's input through a permute and expand of its result is computed in the kernel's
  loops (or why it is not): each reduced dim runs along a loop around it that it does not vary along, or, for a contraction, along a
  new loop of its own (at most NESTED_MAX elements); it varies along every other loop around it (so it is computed once per element),
  and is shared by at most NESTED_MAX output elements. Not in a row kernel, whose rows are stored anyway. Attention's scores, a sum over the head dim,
  computed in the loop over the keys of the row max, the softmax's sum and the sum of the values."""
  if site.frame is None or site.row_axes is not None: return "the kernel is a row kernel, or has no reduce of its own"
  in_shape, shape = base.srcs[0].shape, site.st.shape
  if not all(isinstance(size, int) for size in in_shape + shape): return "its shape is symbolic"
  if (dims := _axis_map(base.shape, site.st)) is None: return "it is read through a view other than a permute and expand of its result"
  varying = set(dims.values())
  axes: list[int | None] = [dims.get(dim) for dim in range(len(in_shape))]
  shared: list[int] = []
  for dim in base.arg:
    if in_shape[dim] == 1: return "it reduces a dim of size 1"
    axes[dim] = next((axis for axis in site.loops if axis not in varying and axis not in shared and shape[axis] == in_shape[dim]), None)
    if axes[dim] is not None: shared.append(cast(int, axes[dim]))
  new = tuple(dim for dim in base.arg if axes[dim] is None)
  if new and not _is_contraction(base): return "it would need loops of its own, and it is not a contraction (attention's scores)"
  if (own := prod(in_shape[dim] for dim in new)) > NESTED_MAX:
    return f"it would sum {own} elements in loops of its own each trip, over {NESTED_MAX}"
  if any(axis not in varying and axis not in shared for axis in site.loops):
    return "it would be computed again in each trip of a loop it does not vary along"
  if shared and (depends := varying & set(site.loops)) and max(depends) > min(shared):
    return "an axis it depends on comes after one it reduces along: it would be computed once per trip of that loop"
  if (lanes := prod(size for axis, size in enumerate(shape) if size > 1 and axis not in varying and axis not in site.loops)) > NESTED_MAX:
    return f"it would be computed again for each of {lanes} output elements, over {NESTED_MAX}"
  return Nesting(tuple(axes), new, frozenset(varying))

def _axis_map(out_shape: tuple[int, ...], st: ShapeTracker) -> dict[int, int] | None:
  """For a view that only permutes and expands a contiguous buffer of `out_shape`: each dim of the buffer (of size over 1) -> its axis."""
  if len(st.views) != 1 or (view := st.views[0]).mask is not None or view.offset != 0: return None
  strides, dims = strides_for_shape(out_shape), {}
  for axis, (size, stride) in enumerate(zip(view.shape, view.strides)):
    if size == 1 or stride == 0: continue
    dim = next((dim for dim, (own, step) in enumerate(zip(out_shape, strides)) if own == size and step == stride and dim not in dims), None)
    if dim is None: return None
    dims[dim] = axis
  return dims if all(size == 1 or dim in dims for dim, size in enumerate(out_shape)) else None

def _feeds_nesting(base: LazyBuffer, site: Site, realizes: Container[LazyBuffer], limit: int = 64) -> bool:
  """Rule 10: whether an elementwise value read through an expand along output axes reaches, through elementwise ops, a reduce that is
  computed in the kernel's loops with loops of its own (attention's probabilities, of the scores): the value is then computed once per
  element of the loops and shared by the output elements it does not depend on (lanes), and storing it would store the matrix of scores."""
  stack, seen = [(base, site.st)], 0
  while stack and seen < limit:
    node, st = stack.pop()
    seen += 1
    if node.realized is not None or node in realizes: continue  # (a stored contraction is loaded: the value is no matrix of scores)
    if isinstance(node.op, ReduceOps):
      if isinstance(nested := nesting(node, site._replace(st=st)), Nesting) and nested.new: return True
    elif isinstance(node.op, ElementwiseOps): stack.extend((src.base, src.st + st) for src in node.srcs)
  return False

def _is_contraction(base: LazyBuffer) -> bool:
  """Whether a reduce sums products of broadcast inputs (a matmul): every operand of its input is read through an expand."""
  value = base.srcs[0]
  operands = value.base.srcs if value.base is value and isinstance(value.op, ElementwiseOps) else (value,)
  return all(any(stride == 0 and size > 1 for view in src.st.views for stride, size in zip(view.strides, view.shape)) for src in operands)

def _row_reduces_under(root: LazyBuffer) -> set[LazyBuffer]:
  """The reduces of more than one row over an input of the root's shape that the root's elementwise graph reads: its rule 7 candidates."""
  found: set[LazyBuffer] = set()
  stack, seen = [root.srcs[0].base if root.op in (LoadOps.ASSIGN, LoadOps.CONTIGUOUS) else root], set()
  while stack:
    base = stack.pop()
    if base in seen or base.realized is not None: continue
    seen.add(base)
    if isinstance(base.op, ReduceOps):
      if base.srcs[0].shape == root.shape and prod(base.shape) > 1: found.add(base)
    elif isinstance(base.op, ElementwiseOps): stack.extend(src.base for src in base.srcs)
  return found

def _reduce(base: LazyBuffer, fusion: Fusion, reason: str) -> Decision:
  if prod(base.srcs[0].shape) == 0: return Decision(Fusion.EMPTY_REDUCE, "a reduce of nothing is its identity, a constant")
  return Decision(fusion, reason)

def _is_row_read(base: LazyBuffer, site: Site) -> bool:
  """Rule 7: read exactly through an expand of its result (along some of the axes it reduced), by a kernel that stores its input's
  shape and has no reduce but row reduces over the same axes; and more than one row."""
  in_shape = base.srcs[0].shape
  if site.root.shape != in_shape or site.frame is not None or site.row_axes not in (None, base.arg) or prod(base.shape) == 1: return False
  return all(size in (out, full) for size, out, full in zip(site.st.shape, base.shape, in_shape)) and _is_expand_of(base.shape, site.st)

def _is_expand_of(shape: tuple[int, ...], st: ShapeTracker) -> bool:
  """Whether `st` is exactly a contiguous buffer of `shape` expanded along its size-1 dims."""
  if len(shape) != len(st.shape) or any(size not in (1, full) for size, full in zip(shape, st.shape)): return False
  return st.views == ShapeTracker.from_shape(shape).expand(st.shape).views

def _is_plain_reshape(st: ShapeTracker) -> bool: return len(st.views) == 1 and st.views[0].contiguous
def _has_mask(st: ShapeTracker) -> bool: return any(view.mask is not None for view in st.views)

def _transcendental(base: LazyBuffer, limit: int = 64) -> bool:
  """Whether computing `base` where it is read evaluates exp, log, sin or sqrt: an op of its elementwise chain, up to values stored or
  reduced (and no further than `limit` ops)."""
  stack, seen = [base], set[LazyBuffer]()
  while stack and len(seen) < limit:
    if (node := stack.pop()) in seen or node.realized is not None or not isinstance(node.op, ElementwiseOps): continue
    if node.op in TRANSCENDENTAL: return True
    seen.add(node)
    stack.extend(src.base for src in node.srcs)
  return False

def _widens_stored(base: LazyBuffer, realizes: Container[LazyBuffer]) -> bool:
  """Whether `base` is a stored float widened (autocast's 16-bit operands in float32, the form its matmuls multiply in): reading it
  costs what reading a stored copy would, and a matmul that loads the 16-bit buffer itself can run on tensor cores."""
  if base.op is not UnaryOps.CAST or not (dtypes.is_float(base.dtype) and dtypes.is_float((src := base.srcs[0].base).dtype)): return False
  return base.dtype.itemsize > src.dtype.itemsize and (src.realized is not None or isinstance(src.op, LoadOps) or src in realizes)

def _reads_memory(base: LazyBuffer, limit: int = 64) -> bool:
  """Whether computing `base` reads a stored value or a reduce: not a value of constants and their views alone (a causal mask), which
  rule 2 recomputes wherever it is read, as index math (and a reduce's loop may end where such a mask does, section 6)."""
  stack, seen = [base], set[LazyBuffer]()
  while stack:
    if (node := stack.pop()) in seen or node.realized is None and node.op is LoadOps.CONST: continue
    if node.realized is not None or not isinstance(node.op, ElementwiseOps) or len(seen) >= limit: return True
    seen.add(node)
    stack.extend(src.base for src in node.srcs)
  return False

def _expanded_outside(st: ShapeTracker, axes: tuple[int, ...]) -> bool:
  """Whether `st` repeats values along an axis not in `axes` (an output axis of the reduce reading through it). A value repeated only
  along the reduce's own axes is loop-invariant there: computing it in the loop costs no more than loading it."""
  if len(st.views) > 1: return any(stride == 0 and size > 1 for view in st.views for stride, size in zip(view.strides, view.shape))
  return any(stride == 0 and size > 1 and axis not in axes for axis, (stride, size) in enumerate(zip(st.views[0].strides, st.shape)))
