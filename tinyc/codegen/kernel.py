"""Layer 3: Kernel, one AST with a ShapeTracker per buffer and the layout of its axes. Imports helpers, dtype, ops, shape/.

Axis layout of `full_shape`: [global axes | reduce axes]. Every buffer's tracker has the same number of dims; the output
(and anything read after the reduce) has size 1 in the reduce axes. Optimizations (a later issue) reshape and permute all
trackers at once, so the layout stays the single source of truth.
"""
from __future__ import annotations
from tinyc.helpers import DEBUG, dedup, prod, to_function_name
from tinyc.ops import BufferOps, ConstBuffer, LazyOp, MemBuffer, ReduceOps
from tinyc.shape.shapetracker import ShapeTracker

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
    """Index of the first reduce axis (== shape_len when there is no reduce)."""
    return next((axis for axis, (full, out) in enumerate(zip(self.full_shape, self.output_shape)) if full != out), self.shape_len)
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

  def _move_reduce_axes_last(self) -> None:
    kept = [axis for axis, (full, out) in enumerate(zip(self.full_shape, self.output_shape)) if full == out]
    reduced = [axis for axis, (full, out) in enumerate(zip(self.full_shape, self.output_shape)) if full != out]
    if reduced and kept + reduced != list(range(self.shape_len)): self.reshape_and_permute(None, tuple(kept + reduced))

  def _drop_size_one_axes(self) -> None:
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
