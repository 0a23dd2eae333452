"""Layer 3: Kernel, one AST with a ShapeTracker per buffer and the layout of its axes. Imports helpers, ops, shape/, codegen/uops.

Axis layout of `full_shape`: [global | local | group | reduce | upcast]. Every buffer's tracker has the same number of dims;
the output (and anything read after the reduce) has size 1 in the group and reduce axes, except in a row kernel (softmax):
there the reduces run one after another over the reduce axes, every thread of the group gets each result, and the store
walks the reduce axes once more.
- global axes are loops on a CPU and work-group (block) ids on a GPU; local axes are thread ids inside a work-group.
- group axes split a reduce across a work-group's threads: each thread reduces its share, the partial results meet in
  local memory after a barrier, and the threads with group id 0 finish the reduce and store.
- reduce axes are loops; the last `upcasted` axes are unrolled into straight-line code: an output axis there (UPCAST) gives
  each lane its own accumulator and store, a reduce axis (UNROLL) adds several elements per loop trip.
- a staged input (STAGE) is read through local memory: each reduce loop trip the work-group's threads copy the tile of it
  that the trip reads (its elements along the local and upcast axes) into local memory together, and every thread then reads
  its lanes from there. Two tiles alternate, so each thread loads the next trip's tile while it computes this one.
Every optimization is an `Opt` applied by `apply_opt`, which reshapes and permutes all trackers at once, so the layout stays
the single source of truth and a kernel's optimization is a replayable list.
"""
from __future__ import annotations
import copy
from dataclasses import dataclass
from enum import Enum, auto
from typing import Callable, Sequence
from tinyc.helpers import DEBUG, dedup, prod, to_function_name
from tinyc.ops import BufferOps, ConstBuffer, LazyOp, MemBuffer, ReduceOps, UnaryOps
from tinyc.codegen.uops import PYTHON_ALU
from tinyc.shape.shapetracker import ShapeTracker

class OptOps(Enum):
  UPCAST = auto()    # unroll a global axis by `amount` (0: all of it): register tiling, vectorizable lanes
  UNROLL = auto()    # unroll a reduce axis by `amount` (0: all of it); `axis` counts from the first reduce loop
  LOCAL = auto()     # make `amount` of a global axis thread ids inside a work-group (GPUs)
  GROUP = auto()     # split a reduce axis across `amount` threads of a work-group, neighbouring threads reading neighbouring elements
  GROUPTOP = auto()  # the same, each thread reading a contiguous run
  PADTO = auto()     # pad a global or reduce axis up to a multiple of `amount` (the padding is masked), so other Opts divide it
  NOLOCALS = auto()  # no LOCAL or GROUP: the runtime picks the work-group size
  STAGE = auto()     # read input buffer number `axis` (1 is the first input) through local memory, a tile a reduce loop trip

@dataclass(frozen=True)
class Opt:
  op: OptOps
  axis: int
  amount: int
  def __repr__(self) -> str: return f"Opt({self.op.name}, {self.axis}, {self.amount})"

class KernelOptError(ValueError):
  """An Opt that does not apply to this kernel; the kernel is left as it was."""

@dataclass(frozen=True)
class KernelTarget:
  """What a device offers a kernel: work-groups of threads that share local memory (GPUs) and their limits."""
  has_local: bool = False
  max_local_size: int = 1024         # threads in one work-group
  local_memory_bytes: int = 48 * 1024
  max_local_dim_sizes: tuple[int, ...] = (1024, 1024, 64)  # threads along each launch dimension (x, y, z)
  max_upcast: int = 256              # upcast lanes an Opt list may reach (see MAX_UPCAST)

CPU_TARGET = KernelTarget()
# Upcast lanes (straight-line code per loop trip) the CPU heuristic uses at most: a safe size. Larger tiles can pay (an AVX-512
# core has 32 vector registers, a GPU thread up to 255 scalar ones) but cost compile time and can spill, so only BEAM, which
# measures, and the GPU heuristic for big matmuls (measured there) go beyond it, up to the target's max_upcast.
MAX_UPCAST = 64
# A GPU kernel may reach more: the staged matmul's 8x8 tile with 16 reduce elements a trip is 1024 lanes (64 accumulators).
GPU_MAX_UPCAST = 1024

class Kernel:
  def __init__(self, ast: LazyOp, target: KernelTarget = CPU_TARGET) -> None:
    if ast.op is BufferOps.SINK and len(ast.src) == 1: ast = ast.src[0]  # TEMPORARY SHIM (sched branch)
    nests = any(inner.op in ReduceOps and inner.arg != node.arg for node in ast.walk() if node.op in ReduceOps for inner in node.src[0].walk())
    assert not nests, "TEMPORARY SHIM (sched branch): this kernel cannot nest a reduce over other axes"
    assert ast.op is BufferOps.STORE, f"a kernel's AST must end in a STORE, not {ast.op}"
    self.ast, self.target = ast, target
    nodes = ast.walk()
    self.reduceops: list[LazyOp] = [node for node in nodes if node.op in ReduceOps]  # sources before their users
    self.reduceop: LazyOp | None = self.reduceops[-1] if self.reduceops else None
    # buffers: the output first, then inputs and constants in the order the AST reaches them
    self.bufs: list[MemBuffer | ConstBuffer] = dedup([ast.arg] + [node.arg for node in nodes if node.op in (BufferOps.LOAD, BufferOps.CONST)])
    self.sts: list[ShapeTracker] = [buf.st for buf in self.bufs]
    ndims = {len(st.shape) for st in self.sts}
    assert len(ndims) == 1, f"every buffer of a kernel needs the same number of dims, got shapes {[st.shape for st in self.sts]}"
    # the reduce's input has the full shape; its output (= the kernel's output) has 1 in each reduced axis
    self.full_shape: tuple[int, ...] = max((st.shape for st in self.sts), key=prod) if self.reduceop is None else self._reduce_input_shape()
    # a row kernel stores the full shape: its reduces' results are read back along the reduced axes. A tracker of the reduces'
    # output shape, kept after the buffers' (no buffer has it), marks the reduce axes through every reshape and permute.
    self.row_kernel = self.reduceop is not None and any(self.full_shape[a] > 1 and self.sts[0].shape[a] > 1 for a in self.reduceop.arg)
    if self.row_kernel:
      assert self.reduceop is not None
      self.sts.append(ShapeTracker.from_shape(tuple(1 if axis in self.reduceop.arg else size for axis, size in enumerate(self.full_shape))))
    self.upcasted, self.local_dims, self.group_for_reduce = 0, 0, 0
    self.dont_use_locals = False
    self.staged: tuple[int, ...] = ()  # buffer numbers read through local memory
    self.applied_opts: list[Opt] = []
    self._move_reduce_axes_last()
    self._drop_size_one_axes()
    self._merge_adjacent_axes()

  def copy(self) -> Kernel:
    """An independent kernel in the same state (every field is immutable or replaced on change, except the Opt list)."""
    copied = copy.copy(self)
    copied.applied_opts = list(self.applied_opts)
    return copied

  def _reduce_input_shape(self) -> tuple[int, ...]:
    assert self.reduceop is not None
    reduce_input_loads = [node.arg for node in self.reduceop.walk() if node.op in (BufferOps.LOAD, BufferOps.CONST)]
    return max((buf.st.shape for buf in reduce_input_loads), key=prod)

  @property
  def output_shape(self) -> tuple[int, ...]: return self.sts[0].shape
  @property
  def reduced_shape(self) -> tuple[int, ...]:
    """The reduces' output shape: 1 in the group and reduce axes (a row kernel's output has them in full)."""
    return self.sts[-1].shape if self.row_kernel else self.sts[0].shape
  @property
  def shape_len(self) -> int: return len(self.full_shape)
  @property
  def first_reduce(self) -> int:
    """Index of the first group or reduce axis (== shape_len - upcasted when there is none)."""
    loops = self.shape_len - self.upcasted
    return next((axis for axis, (full, out) in enumerate(zip(self.full_shape[:loops], self.reduced_shape)) if full != out), loops)
  @property
  def global_dims(self) -> int: return self.first_reduce - self.local_dims
  @property
  def first_reduce_loop(self) -> int: return self.first_reduce + self.group_for_reduce
  @property
  def upcast_axes(self) -> range: return range(self.shape_len - self.upcasted, self.shape_len)
  @property
  def upcast_size(self) -> int: return prod(self.full_shape[self.shape_len - self.upcasted:])
  @property
  def output_lanes(self) -> int:
    """Upcast lanes that are separate outputs (UPCAST, not UNROLL): one accumulator each."""
    return prod(self.full_shape[axis] for axis in self.upcast_axes if self.full_shape[axis] == self.reduced_shape[axis])
  @property
  def local_size(self) -> int:
    """Threads in a work-group: the product of the local and group axes."""
    return prod(self.full_shape[self.global_dims:self.first_reduce_loop])
  @property
  def local_memory_bytes(self) -> int:
    """Local memory the group reduces need (one partial result per thread and output lane, for each reduce) and the two tiles
    of each staged input."""
    partials = sum(self.local_size * self.output_lanes * reduceop.dtype.itemsize for reduceop in self.reduceops) if self.group_for_reduce else 0
    return partials + sum(2 * prod(self.full_shape[axis] for axis in self.tile_axes(number)) * self.bufs[number].dtype.itemsize
                          for number in self.staged)

  def tile_axes(self, number: int) -> list[int]:
    """The local and upcast axes along which buffer `number` moves (or is masked): its tile of one reduce loop trip spans them."""
    strides = self.sts[number].real_strides()
    return [axis for axis in [*range(self.global_dims, self.first_reduce), *self.upcast_axes] if strides[axis] != 0]

  def reshape_and_permute(self, new_shape_fn: Callable[[tuple[int, ...]], list[int]] | None, order: tuple[int, ...] | None) -> None:
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
    """Merge the leading global axes so at most `limit` remain (GPUs launch at most 3 dimensions of work-groups)."""
    if self.global_dims <= limit: return
    merged = self.global_dims - limit + 1
    self.reshape_and_permute(lambda shape: [prod(shape[:merged])] + list(shape[merged:]), None)

  def shift_to(self, axis: int, amount: int, top: bool = False, insert_before: int | None = None) -> None:
    """Split `axis` into (size // amount, amount), or (amount, size // amount) with `top`, and move the `amount` part to just
    before axis `insert_before` (default: the end, where it becomes the last upcast axis). Axes of size 1 split into (1, 1)."""
    if insert_before is None: insert_before = self.shape_len
    moved = axis if top else axis + 1
    if moved < insert_before: insert_before += 1
    def split(shape: tuple[int, ...]) -> list[int]:
      parts = ([amount, shape[axis] // amount] if top else [shape[axis] // amount, amount]) if shape[axis] != 1 else [1, 1]
      return list(shape[:axis]) + parts + list(shape[axis + 1:])
    order = [i for i in range(insert_before) if i != moved] + [moved] + [i for i in range(insert_before, self.shape_len + 1) if i != moved]
    self.reshape_and_permute(split, tuple(order))

  # ---- optimizations ----
  def apply_opt(self, opt: Opt) -> None:
    """Apply one optimization, or raise KernelOptError and change nothing."""
    saved = (self.sts, self.full_shape, self.upcasted, self.local_dims, self.group_for_reduce, self.dont_use_locals, self.staged)
    try:
      self._apply(opt)
      self._check_limits(opt)
    except KernelOptError:
      self.sts, self.full_shape, self.upcasted, self.local_dims, self.group_for_reduce, self.dont_use_locals, self.staged = saved
      raise
    self.applied_opts.append(opt)

  def _apply(self, opt: Opt) -> None:
    if opt.op is OptOps.NOLOCALS:
      _check(self.target.has_local, opt, "this device has no work-groups")
      _check(not self.dont_use_locals and not self.local_dims and not self.group_for_reduce, opt, "the kernel already chose its locals")
      self.dont_use_locals = True
      return
    if opt.op is OptOps.STAGE: return self._stage(opt)
    first_loop = self.first_reduce_loop
    loop_axes = range(first_loop, self.shape_len - self.upcasted)
    allowed = {OptOps.UPCAST: range(self.global_dims), OptOps.LOCAL: range(self.global_dims), OptOps.UNROLL: loop_axes,
               OptOps.GROUP: loop_axes, OptOps.GROUPTOP: loop_axes, OptOps.PADTO: [*range(self.global_dims), *loop_axes]}[opt.op]
    axis = opt.axis + (first_loop if opt.op in (OptOps.UNROLL, OptOps.GROUP, OptOps.GROUPTOP) else 0)
    _check(axis in allowed, opt, f"axis {opt.axis} is not one of this kernel's axes for it ({_describe(allowed)} in {self.full_shape})")
    size = self.full_shape[axis]
    if opt.op is OptOps.PADTO: return self._pad_to(opt, axis, size)
    amount = size if opt.amount == 0 else opt.amount
    _check(amount > 1 and size % amount == 0, opt, f"amount {amount} must be > 1 and divide the axis size {size}")
    if opt.op in (OptOps.LOCAL, OptOps.GROUP, OptOps.GROUPTOP):
      _check(self.target.has_local, opt, "this device has no work-groups")
      _check(not self.dont_use_locals, opt, "NOLOCALS was applied")
    if opt.op in (OptOps.GROUP, OptOps.GROUPTOP): _check(self.reduceop is not None, opt, "the kernel has no reduce")
    if opt.op is OptOps.LOCAL:
      self.shift_to(axis, amount, insert_before=self.first_reduce)
      self.local_dims += 1
    elif opt.op in (OptOps.GROUP, OptOps.GROUPTOP):
      self.shift_to(axis, amount, top=opt.op is OptOps.GROUPTOP, insert_before=first_loop)
      self.group_for_reduce += 1
    else:
      self.shift_to(axis, amount)
      self.upcasted += 1
    if amount == size: self._drop_size_one_axes()

  def _pad_to(self, opt: Opt, axis: int, size: int) -> None:
    padded = -(-size // opt.amount) * opt.amount if opt.amount > 1 else size
    _check(padded != size, opt, f"the axis size {size} is already a multiple of {opt.amount}")
    _check(padded - size <= size // 2, opt, f"padding {size} to {padded} wastes more than a third of the work")
    if axis >= self.first_reduce:
      assert self.reduceop is not None
      _check(not self.row_kernel and self.reduceop.op is ReduceOps.SUM and _is_zero_where_padded(self.reduceop.src[0]), opt,
             "padding a reduce axis needs a sum whose input is 0 wherever the loads are padded, and a kernel that stores no row")
    pad = lambda shape: tuple((0, padded - size if i == axis and shape[i] == size else 0) for i in range(len(shape)))  # noqa: E731
    self.sts = [st.pad(pad(st.shape)) for st in self.sts]
    self.full_shape = tuple(padded if i == axis else s for i, s in enumerate(self.full_shape))

  def _stage(self, opt: Opt) -> None:
    number = opt.axis
    _check(self.target.has_local and not self.dont_use_locals, opt, "staging needs work-groups")
    _check(opt.amount == 0, opt, "STAGE takes amount 0")
    _check(0 < number < len(self.bufs) and isinstance(self.bufs[number], MemBuffer), opt,
           f"buffer {number} is not an input of this kernel (its inputs are 1..{len(self.bufs) - 1}, constants excluded)")
    _check(number not in self.staged, opt, "the buffer is staged already")
    _check(len(self.reduceops) == 1 and not self.row_kernel, opt, "only a kernel with one reduce, storing no row, stages its inputs")
    _check(self.bufs[number] not in _loads_outside_reduces(self.ast), opt, "the buffer is also read after the reduce")
    _check(bool(self.tile_axes(number)), opt, "every thread reads the same element of the buffer a trip: there is nothing to share")
    self.staged += (number,)

  def _check_limits(self, opt: Opt) -> None:
    _check(self.upcast_size <= self.target.max_upcast, opt,
           f"{self.upcast_size} upcast lanes is over the limit of {self.target.max_upcast}; use a smaller amount")
    _check(self.local_size <= self.target.max_local_size, opt,
           f"{self.local_size} threads per work-group is over this device's {self.target.max_local_size}; use a smaller amount")
    thread_axes = self.full_shape[self.global_dims:self.first_reduce_loop]  # the last is launch dimension 0
    limits = self.target.max_local_dim_sizes
    _check(len(thread_axes) <= len(limits), opt, "no launch dimension is left for another local axis; use fewer LOCAL/GROUP axes")
    _check(all(size <= limit for size, limit in zip(reversed(thread_axes), limits)), opt,
           f"local axes {thread_axes} exceed the device's {limits}; use a smaller amount")
    _check(self.local_memory_bytes <= self.target.local_memory_bytes, opt,
           f"group reduces and staged tiles need {self.local_memory_bytes} bytes of local memory, over this device's "
           f"{self.target.local_memory_bytes}; reduce the local size, the upcast or the unroll")
    if self.staged:
      _check(not self.group_for_reduce, opt, "a kernel that stages an input does not GROUP")
      _check(self.local_size > 1, opt, "staging shares loads between a work-group's threads: add a LOCAL axis first")
      _check(self.first_reduce_loop < self.shape_len - self.upcasted, opt, "staging needs a reduce loop: unroll less of the reduce")

  # ---- the canonical layout ----
  def _move_reduce_axes_last(self) -> None:
    kept = [axis for axis, (full, out) in enumerate(zip(self.full_shape, self.reduced_shape)) if full == out]
    reduced = [axis for axis, (full, out) in enumerate(zip(self.full_shape, self.reduced_shape)) if full != out]
    if reduced and kept + reduced != list(range(self.shape_len)): self.reshape_and_permute(None, tuple(kept + reduced))

  def _drop_size_one_axes(self) -> None:
    """Drop size-1 axes; local, group and upcast axes are never size 1, so their counts stay right."""
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

def _check(condition: bool, opt: Opt, reason: str) -> None:
  if not condition: raise KernelOptError(f"{opt}: {reason}")

def _describe(axes: Sequence[int]) -> str: return f"axes {list(axes)}" if len(axes) else "no axes"

def _loads_outside_reduces(node: LazyOp) -> set[MemBuffer | ConstBuffer]:
  if node.op in ReduceOps: return set()
  if node.op is BufferOps.LOAD: return {node.arg}
  return set().union(*[_loads_outside_reduces(src) for src in node.src])

def _is_zero_where_padded(node: LazyOp) -> bool:
  """Whether `node` is 0 where every load reads padding (a padded load reads 0): only then may a sum's axis be padded."""
  def value(node: LazyOp) -> object:
    if node.op in (BufferOps.LOAD, BufferOps.CONST): return 0
    sources = [value(src) for src in node.src]
    if node.op in (UnaryOps.CAST, UnaryOps.BITCAST): return sources[0]
    return PYTHON_ALU[node.op](*sources)
  try: return value(node) == 0
  except (KeyError, ArithmeticError, ValueError): return False
