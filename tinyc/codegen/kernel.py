"""Layer 3: Kernel, one AST with a ShapeTracker per buffer and the layout of its axes. Imports helpers, dtype, ops, shape/.

Axis layout of `full_shape`: [global axes | reduce axes | upcast axes]. Every buffer's tracker has the same number of dims;
the output (and anything read after the reduce) has size 1 in the reduce axes. The last `upcasted` axes are unrolled into
straight-line code: an output axis there (UPCAST) gives each lane its own accumulator and store, a reduce axis (UNROLL)
adds several elements per loop trip. Every optimization is an `Opt` applied by `apply_opt`, which reshapes and permutes
all trackers at once, so the layout stays the single source of truth and a kernel's optimization is a replayable list.
"""
from __future__ import annotations
from dataclasses import dataclass
from enum import Enum, auto
from tinyc.helpers import DEBUG, dedup, prod, to_function_name
from tinyc.ops import BufferOps, ConstBuffer, LazyOp, MemBuffer, ReduceOps
from tinyc.shape.shapetracker import ShapeTracker

class OptOps(Enum):
  UPCAST = auto()  # unroll a global axis by `amount` (0: all of it): register tiling, vectorizable lanes
  UNROLL = auto()  # unroll a reduce axis by `amount` (0: all of it); `axis` counts from the first reduce axis

@dataclass(frozen=True)
class Opt:
  op: OptOps
  axis: int
  amount: int
  def __repr__(self) -> str: return f"Opt({self.op.name}, {self.axis}, {self.amount})"

class KernelOptError(ValueError):
  """An Opt that does not apply to this kernel; the kernel is left as it was."""

MAX_UPCAST = 64  # lanes of straight-line code per loop trip: beyond this, code size and register spills cost more than reuse saves

class Kernel:
  def __init__(self, ast: LazyOp) -> None:
    assert ast.op is BufferOps.STORE, f"a kernel's AST must end in a STORE, not {ast.op}"
    self.ast = ast
    nodes = ast.walk()
    reduceops = [node for node in nodes if node.op in ReduceOps]
    assert len(reduceops) <= 1, f"a kernel has at most one reduce, this AST has {len(reduceops)}"
    self.reduceop: LazyOp | None = reduceops[0] if reduceops else None
    # buffers: the output first, then inputs and constants in the order the AST reaches them
    self.bufs: list[MemBuffer | ConstBuffer] = dedup([ast.arg] + [node.arg for node in nodes if node.op in (BufferOps.LOAD, BufferOps.CONST)])
    self.sts: list[ShapeTracker] = [buf.st for buf in self.bufs]
    ndims = {len(st.shape) for st in self.sts}
    assert len(ndims) == 1, f"every buffer of a kernel needs the same number of dims, got shapes {[st.shape for st in self.sts]}"
    # the reduce's input has the full shape; its output (= the kernel's output) has 1 in each reduced axis
    self.full_shape: tuple[int, ...] = max((st.shape for st in self.sts), key=prod) if self.reduceop is None else self._reduce_input_shape()
    self.upcasted = 0
    self.applied_opts: list[Opt] = []
    self._move_reduce_axes_last()
    self._drop_size_one_axes()
    self._merge_adjacent_axes()

  def _reduce_input_shape(self) -> tuple[int, ...]:
    assert self.reduceop is not None
    reduce_input_loads = [node.arg for node in self.reduceop.walk() if node.op in (BufferOps.LOAD, BufferOps.CONST)]
    return max((buf.st.shape for buf in reduce_input_loads), key=prod)

  @property
  def output_shape(self) -> tuple[int, ...]: return self.sts[0].shape
  @property
  def shape_len(self) -> int: return len(self.full_shape)
  @property
  def first_reduce(self) -> int:
    """Index of the first reduce axis before the upcast axes (== shape_len - upcasted when there is none)."""
    loops = self.shape_len - self.upcasted
    return next((axis for axis, (full, out) in enumerate(zip(self.full_shape[:loops], self.output_shape)) if full != out), loops)
  @property
  def upcast_size(self) -> int: return prod(self.full_shape[self.shape_len - self.upcasted:])
  @property
  def global_dims(self) -> int: return self.first_reduce

  def reshape_and_permute(self, new_shape_fn, order: tuple[int, ...] | None) -> None:  # type: ignore[no-untyped-def]
    """Apply the same reshape (new_shape_fn maps a tracker's shape to its new shape) and permute to every buffer."""
    new_sts = []
    for st in self.sts:
      if new_shape_fn is not None: st = st.reshape(tuple(new_shape_fn(st.shape)))
      if order is not None: st = st.permute(order)
      new_sts.append(st)
    self.sts = new_sts
    if new_shape_fn is not None: self.full_shape = tuple(new_shape_fn(self.full_shape))
    if order is not None: self.full_shape = tuple(self.full_shape[i] for i in order)

  def limit_global_dims(self, limit: int) -> None:
    """Merge the leading global axes so at most `limit` remain (GPUs launch at most 3 dimensions of threads)."""
    if self.first_reduce <= limit: return
    merged = self.first_reduce - limit + 1
    self.reshape_and_permute(lambda shape: [prod(shape[:merged])] + list(shape[merged:]), None)

  def shift_to(self, axis: int, amount: int) -> None:
    """Split `axis` into (size // amount, amount) and move the `amount` part to the end (it becomes the last upcast axis)."""
    def split(shape: tuple[int, ...]) -> list[int]:
      part = amount if shape[axis] != 1 else 1  # the output and epilogue buffers have size 1 on reduce axes
      return list(shape[:axis]) + [shape[axis] // part, part] + list(shape[axis + 1:])
    self.reshape_and_permute(split, tuple(i for i in range(self.shape_len + 1) if i != axis + 1) + (axis + 1,))

  def apply_opt(self, opt: Opt) -> None:
    """Apply one optimization, or raise KernelOptError and change nothing."""
    axis = opt.axis + (self.first_reduce if opt.op is OptOps.UNROLL else 0)
    allowed = range(0, self.first_reduce) if opt.op is OptOps.UPCAST else range(self.first_reduce, self.shape_len - self.upcasted)
    if axis not in allowed: raise KernelOptError(f"{opt}: axis {opt.axis} is not one of this kernel's {opt.op.name.lower()}able axes {allowed}")
    size = self.full_shape[axis]
    amount = size if opt.amount == 0 else opt.amount
    if amount <= 1 or size % amount: raise KernelOptError(f"{opt}: amount {amount} must be > 1 and divide the axis size {size}")
    if self.upcast_size * amount > MAX_UPCAST:
      raise KernelOptError(f"{opt}: {self.upcast_size * amount} lanes is over the limit of {MAX_UPCAST}; use a smaller amount")
    self.shift_to(axis, amount)
    if amount == size: self._drop_size_one_axes()
    self.upcasted += 1
    self.applied_opts.append(opt)

  def _move_reduce_axes_last(self) -> None:
    kept = [axis for axis, (full, out) in enumerate(zip(self.full_shape, self.output_shape)) if full == out]
    reduced = [axis for axis, (full, out) in enumerate(zip(self.full_shape, self.output_shape)) if full != out]
    if reduced and kept + reduced != list(range(self.shape_len)): self.reshape_and_permute(None, tuple(kept + reduced))

  def _drop_size_one_axes(self) -> None:
    """Drop size-1 axes; upcast axes are never size 1, so the upcast count stays right."""
    if 1 not in self.full_shape: return
    keep = [axis for axis, size in enumerate(self.full_shape) if size != 1] or [0]
    self.reshape_and_permute(lambda shape: [shape[axis] for axis in keep], None)

  def _merge_adjacent_axes(self) -> None:
    """Merge neighbouring axes wherever every buffer walks them as one (stride[i] == stride[i+1] * size[i+1], unmasked)."""
    axis = self.shape_len - 2
    while axis >= 0:
      if self._can_merge(axis):
        merged = lambda shape, a=axis: list(shape[:a]) + [shape[a] * shape[a + 1]] + list(shape[a + 2:])  # noqa: E731
        self.reshape_and_permute(merged, None)
      axis -= 1

  def _can_merge(self, axis: int) -> bool:
    reduce_start = self.first_reduce
    if (axis < reduce_start) != (axis + 1 < reduce_start): return False  # never merge a global axis into a reduce axis
    if axis + 1 >= self.shape_len - self.upcasted: return False  # upcast axes stay as they are
    for st in self.sts:
      view = st.views[-1]
      if view.mask is not None and (view.mask[axis] != (0, view.shape[axis]) or view.mask[axis + 1] != (0, view.shape[axis + 1])): return False
      if view.strides[axis] != view.strides[axis + 1] * view.shape[axis + 1]: return False
    return True

  @property
  def name(self) -> str:
    """A readable kernel name: r_ for a reduce, E_ for elementwise, then the axis sizes (globals, then reduced)."""
    prefix = "r" if self.reduceop is not None else "E"
    sizes = [str(size) for size in self.full_shape]
    if self.reduceop is not None: sizes.insert(self.first_reduce, "")
    if self.upcasted: sizes.insert(self.shape_len - self.upcasted + (self.reduceop is not None), "")
    return to_function_name(f"{prefix}_{'_'.join(sizes)}".replace("__", "_"))

  def print_ast(self) -> None:
    if DEBUG >= 3: print(_format_ast(self.ast))

def _format_ast(node: LazyOp, depth: int = 0) -> str:
  arg = node.arg
  if isinstance(arg, (MemBuffer, ConstBuffer)):
    what = f"buf{arg.idx}" if isinstance(arg, MemBuffer) else f"const {arg.val}"
    arg = f"{what} {arg.dtype.name} {arg.st.shape} views={len(arg.st.views)}"
  lines = [f"{'  ' * depth}{node.op.name} {arg if arg is not None else ''}".rstrip()]
  lines += [_format_ast(src, depth + 1) for src in node.src]
  return "\n".join(lines)
