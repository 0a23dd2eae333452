"""Layer 3: Kernel, one AST with a ShapeTracker per buffer and the layout of its axes. Imports helpers, dtype, ops, shape/, codegen/uops,
codegen/axes (whose names it exports too).

A kernel's AST is a SINK of one or more STOREs. Every buffer's tracker has one dim per axis of `full_shape`, and in each axis
either the full size or 1. Every axis has a kind (AxisKind), and a reduce-side axis has owners: the reduces that reduce it.
A reduce's input spans its own axes, its value has size 1 there; a reduce inside another's input is computed in the other's
loop, once per trip of the loops its value depends on. An output may span reduce axes (a row: softmax stores the row it
reduced) or not (layernorm's mean): a store walks the reduce axes it spans once more. The layout, outermost first, is
[GLOBAL and SERIAL | LOCAL | GROUP | LANE and WARP | REDUCE | UPCAST, UNROLL, FRAGMENT and TC in the order they were made]:
- GLOBAL axes are loops on a CPU and work-group (block) ids on a GPU; LOCAL axes are thread ids inside a work-group. A SERIAL
  axis (PERSIST, tensor cores) is a loop of each work-group over output tiles, around its reduce and stores.
- GROUP axes split a reduce across a work-group's threads: each thread reduces its share, the partial results meet in
  local memory after a barrier, and either every thread reads the result or only those with group id 0 go on.
- LANE axes (LANES, CUDA) are one thread id among a warp's neighbouring lanes, splitting both a nested contraction's own axis
  (the partial results meet by shuffles, every lane getting the sum) and an output axis (each lane stores its part).
- REDUCE axes are loops; UPCAST (an output axis) and UNROLL (a reduce axis) are unrolled into straight-line lanes: an UPCAST
  lane has its own accumulator and store, an UNROLL lane adds another element per loop trip.
- a staged input (STAGE) is read through local memory: each reduce loop trip the work-group's threads copy the tile of it
  that the trip reads (its elements along the local and upcast axes) into local memory together, and every thread then reads
  its lanes from there. Two tiles alternate, so each thread loads the next trip's tile while it computes this one.
- tensor cores (TC): a warp's 32 threads (two WARP axes) compute 16 x 8 outputs with one mma instruction per 16 elements of the
  reduce (a TC axis), each thread holding 4 of them (two FRAGMENT axes); both operands are staged, as 16-bit values.
Every optimization is an `Opt` applied by `apply_opt`, which reshapes and permutes all trackers at once, so the layout stays
the single source of truth and a kernel's optimization is a replayable list.
"""
from __future__ import annotations
import copy
from typing import Callable, Sequence
from tinyc.dtype import dtypes
from tinyc.helpers import all_int, dedup, prod, to_function_name
from tinyc.ops import BinaryOps, BufferOps, ConstBuffer, LazyOp, MemBuffer, ReduceOps, UnaryOps
from tinyc.codegen.uops import PYTHON_ALU
from tinyc.codegen.axes import (CPU_TARGET, GPU_MAX_UPCAST, KIND_COLORS, LANES, LAYOUT_RANK, MAX_UPCAST, REDUCE_SIDE, SPLIT_KINDS, TC_DTYPES,
                                TC_SHAPE, THREADS, AxisKind, KernelOptError, KernelTarget, Opt, OptOps, TileLayout, describe_layout, partials_dtype,
                                tc_reduce)
from tinyc.shape.shapetracker import ShapeTracker
from tinyc.codegen.online import factor_invariants
from tinyc.codegen.register_mma import NESTED_TC_DTYPES, nested_tensor_core
from tinyc.codegen.tile_layout import tile_layout
from tinyc.codegen.warpgroups import check_opt, check_warpgroup
from tinyc.shape.symbolic import AndNode, Node, Variable, sym_max

MAX_OUTER_GROUPS = 65535  # work-groups a GPU launches along y and z (CUDA; NVIDIA's OpenCL alike)

class Kernel:
  def __init__(self, ast: LazyOp, target: KernelTarget = CPU_TARGET) -> None:
    assert ast.op is BufferOps.SINK and all(store.op is BufferOps.STORE for store in ast.src), "a kernel's AST is a SINK of STOREs"
    self.ast, self.target = (ast := factor_invariants(ast)), target  # (online.py: softmax's sum read after the values' sum)
    nodes = ast.walk()
    self.reduceops: list[LazyOp] = [node for node in nodes if node.op in ReduceOps]  # sources before their users
    self.stores: list[LazyOp] = list(ast.src)
    # buffers: the outputs first, then inputs and constants in the order the AST reaches them
    leaves = [node.arg for node in nodes if node.op in (BufferOps.LOAD, BufferOps.CONST)]
    self.bufs: list[MemBuffer | ConstBuffer] = dedup([store.arg for store in self.stores] + leaves)
    self.sts: list[ShapeTracker] = [buf.st for buf in self.bufs]
    assert len({len(st.shape) for st in self.sts}) == 1, f"every buffer of a kernel needs one dim per axis, got {[st.shape for st in self.sts]}"
    self.full_shape: tuple[int, ...] = tuple(next((size for size in sizes if size != 1), 1) for sizes in zip(*[st.shape for st in self.sts]))
    # the Variables of symbolic dims (and constants), each an int argument of the program, in this order
    self.vars: list[Variable] = sorted(set().union(*[st.vars() for st in self.sts], *[buf.val.vars() for buf in self.bufs
                                                     if isinstance(buf, ConstBuffer) and isinstance(buf.val, Node)]), key=lambda var: var.expr)
    self.owners: tuple[frozenset[int], ...] = tuple(frozenset(number for number, reduceop in enumerate(self.reduceops) if axis in reduceop.arg)
                                                    for axis in range(len(self.full_shape)))
    self.kinds: tuple[AxisKind, ...] = tuple(AxisKind.REDUCE if owners else AxisKind.GLOBAL for owners in self.owners)
    self.dont_use_locals = False
    self.staged: tuple[int, ...] = ()  # buffer numbers read through local memory
    self.tile_stages = 2  # the tiles of a staged input in local memory: this trip's, and those being filled for the next
    # TC's tiles computed by warpgroups (WARPGROUP); TC on nested contractions, its operands in registers (codegen/register_mma.py)
    self.warpgroups = self.nested_tc = False
    self.applied_opts: list[Opt] = []
    for step in (self._sort_layout, self._drop_size_one_axes, self._merge_adjacent_axes): step()

  def copy(self) -> Kernel:
    """An independent kernel in the same state (every field is immutable or replaced on change, except the Opt list)."""
    (copied := copy.copy(self)).applied_opts = list(self.applied_opts)
    return copied

  # ---- the layout, by kind ----
  def axes(self, *kinds: AxisKind) -> list[int]:
    """The axes of these kinds, outermost first."""
    return [axis for axis, kind in enumerate(self.kinds) if kind in kinds]
  @property
  def shape_len(self) -> int: return len(self.full_shape)
  @property
  def n_outputs(self) -> int: return len(self.stores)
  def size_of(self, *kinds: AxisKind) -> int:
    """The elements the axes of these kinds span together (e.g. UPCAST: the lanes that are separate outputs, an accumulator each)."""
    return prod(self.full_shape[axis] for axis in self.axes(*kinds))
  @property
  def upcast_size(self) -> int:  # lanes at the code's widest place, the stores' or a reduce input's (a nested reduce's are its own)
    if len(self.reduceops) < 2: return self.size_of(*LANES)
    rows = prod(self.full_shape[axis] for axis in self.axes(AxisKind.UNROLL) if any(map(lambda n: self.spans(n, axis), range(self.n_outputs))))
    inputs_axes = [self.value_axes(reduceop.src[0], memo) for memo in [dict[LazyOp, frozenset[int]]()] for reduceop in self.reduceops]  # once each
    return max([self.size_of(AxisKind.UPCAST, AxisKind.FRAGMENT) * rows] + [prod(self.full_shape[axis] for axis in self.axes(*LANES) if axis in
               inputs_axes[number] or number in self.owners[axis]) for number in range(len(self.reduceops))])
  @property
  def local_size(self) -> int: return self.size_of(*THREADS) * self.lane_count  # the threads of a work-group
  @property
  def lane_count(self) -> int: return next((self.full_shape[axis] for axis in self.axes(AxisKind.LANE)), 1)  # (one index for all: LANES)
  def nested_contractions(self) -> list[int]:
    """The reduces (by number) read inside another's input that have axes of their own (schedule rule 10: attention's scores)."""
    return [number for number, reduceop in enumerate(self.reduceops) if any(owners == {number} for owners in self.owners)
            and any(reduceop in other.src[0].walk() for other in self.reduceops if other is not reduceop)]
  def own_axis(self, number: int) -> int:
    """The last REDUCE axis that reduce `number` alone reduces (a nested contraction's head dim: what LANES splits)."""
    return max(axis for axis in self.axes(AxisKind.REDUCE) if self.owners[axis] == {number})
  def features(self) -> list[int]:
    """The GLOBAL axes no nested contraction's value varies along (attention's head dim of the values): each score serves all of them."""
    varying = set().union(*[self.value_axes(self.reduceops[number]) for number in self.nested_contractions()])
    return [axis for axis in self.axes(AxisKind.GLOBAL) if axis not in varying and self.full_shape[axis] != 1]
  def spans(self, number: int, axis: int) -> bool:
    """Whether buffer `number` moves along `axis` (has its full size there), e.g. whether an output is a row of a reduce axis."""
    return self.sts[number].shape[axis] != 1 or self.full_shape[axis] == 1
  @property
  def stores_rows(self) -> bool:
    """Whether an output spans a reduce-side axis (softmax's row), so its store walks that axis again."""
    return any(self.spans(number, axis) for number in range(self.n_outputs) for axis in self.axes(*REDUCE_SIDE))
  def value_axes(self, node: LazyOp, memo: dict[LazyOp, frozenset[int]] | None = None) -> frozenset[int]:
    """The axes `node`'s value depends on: those its loads span, less those its reduces reduce."""
    memo = {} if memo is None else memo
    if node not in memo:
      if node.op in (BufferOps.LOAD, BufferOps.CONST):
        number = self.bufs.index(node.arg)
        memo[node] = frozenset(axis for axis in range(self.shape_len) if self.spans(number, axis) and sym_max(self.full_shape[axis]) > 1)
      elif node.op in ReduceOps:
        reduce_number = self.reduceops.index(node)
        memo[node] = frozenset(axis for axis in self.value_axes(node.src[0], memo) if reduce_number not in self.owners[axis])
      else: memo[node] = frozenset().union(*[self.value_axes(src, memo) for src in node.src])
    return memo[node]
  def partial_lanes(self, reduceop: LazyOp) -> int:
    """The most results a reduce has at once: one per lane its value depends on (each needs a partial result a thread in a GROUP)."""
    return prod(self.full_shape[axis] for axis in self.value_axes(reduceop) if self.kinds[axis] in LANES)
  @property
  def local_memory_bytes(self) -> int:
    """Local memory for the group reduces (a partial result per thread and result of each reduce a GROUP splits), staged tiles and the
    barriers of tensor-core tile stages (two of 8 bytes a stage)."""
    grouped = {number for axis in self.axes(AxisKind.GROUP) for number in self.owners[axis]}
    partials = sum(self.local_size * self.partial_lanes(self.reduceops[number]) * partials_dtype(self.reduceops[number].dtype).itemsize
                   for number in grouped)
    barriers = 16 * self.tile_stages if self.axes(AxisKind.TC) else 0
    return partials + barriers + sum(self.tile_stages * layout.size * layout.dtype.itemsize for layout in map(self.tile_layout, self.staged))

  def tile_axes(self, number: int) -> list[int]:
    """The thread and lane axes along which buffer `number` moves (or is masked, but not as PADTO masks it along with the output:
    see broadcast_along): its tile of one reduce loop trip spans them."""
    return [axis for axis in self.axes(AxisKind.LOCAL, AxisKind.WARP, *LANES, AxisKind.TC) if not self.broadcast_along(number, axis)]

  def broadcast_along(self, number: int, axis: int) -> bool:
    """Whether buffer `number` has one value all along `axis` wherever the output is stored: stride 0, and masked there only as the
    output is (every condition of its validity that reads the axis is one of the output's: PADTO pads every buffer so), so reading
    it at index 0 instead changes no stored output."""
    st = self.sts[number]
    if st.real_strides(ignore_valid=True)[axis] != 0: return False
    if st.real_strides()[axis] == 0: return True
    idxs = [Variable(f"i{axis}", 0, sym_max(size) - 1) for axis, size in enumerate(self.full_shape)]
    def terms(st: ShapeTracker) -> list[Node]:  # the conditions whose AND is the validity
      valid = st.expr_idxs(idxs)[1]
      return list(valid.nodes) if isinstance(valid, AndNode) else [valid]
    output_terms = terms(self.sts[0])
    return all(term in output_terms for term in terms(st) if idxs[axis] in term.vars())

  def tile_layout(self, number: int) -> TileLayout: return tile_layout(self, number)  # (tile_layout.py)

  def describe_layout(self) -> str: return describe_layout(self.full_shape, self.kinds, self.owners)

  # ---- reshaping every tracker at once ----
  def _reshape(self, new_shape: Callable[[tuple[int, ...]], list[int]], sources: Sequence[int]) -> None:
    """Reshape every tracker (and the full shape) by `new_shape`; new axis i has the kind and owners of old axis sources[i]."""
    self.sts = [st.reshape(tuple(new_shape(st.shape))) for st in self.sts]
    self.full_shape = tuple(new_shape(self.full_shape))
    self.kinds, self.owners = tuple(self.kinds[i] for i in sources), tuple(self.owners[i] for i in sources)

  def _permute(self, order: Sequence[int]) -> None:
    if list(order) == list(range(self.shape_len)): return
    self.sts = [st.permute(tuple(order)) for st in self.sts]
    self.full_shape = tuple(self.full_shape[i] for i in order)
    self.kinds, self.owners = tuple(self.kinds[i] for i in order), tuple(self.owners[i] for i in order)

  def _sort_layout(self, moved: int | None = None) -> None:
    """Order the axes by LAYOUT_RANK, each kind's axes as they were except `moved`, which goes last among its kind."""
    self._permute(sorted(range(self.shape_len), key=lambda axis: (LAYOUT_RANK[self.kinds[axis]], axis == moved, axis)))

  def limit_global_dims(self, limit: int) -> None:
    """Merge the leading GLOBAL axes so at most `limit` remain (GPUs launch at most 3 dimensions of work-groups), and fewer where an
    outer one would be longer than MAX_OUTER_GROUPS (the innermost, x, takes up to 2^31 - 1)."""
    sizes = [self.full_shape[axis] for axis in self.axes(AxisKind.GLOBAL)]
    def outer(count: int) -> list[int | Node]: return [prod(sizes[:len(sizes) - count + 1])] + sizes[len(sizes) - count + 1:-1]
    limit = min(limit, len(sizes))
    while limit > 1 and any(isinstance(size, int) and size > MAX_OUTER_GROUPS for size in outer(limit)): limit -= 1
    if len(sizes) <= limit: return
    merged = len(sizes) - limit + 1
    if not all_int(self.full_shape[:merged]):
      raise NotImplementedError(f"a kernel of {self.full_shape} launches over more than {limit} dims, and a symbolic one is among those to merge")
    self._reshape(lambda shape: [prod(shape[:merged])] + list(shape[merged:]), range(merged - 1, self.shape_len))

  def shift_to(self, axis: int, amount: int, kind: AxisKind, top: bool = False) -> None:
    """Split `axis` into (size // amount, amount), or (amount, size // amount) with `top`; the `amount` part becomes the last `kind` axis."""
    self._split(axis, amount, top)
    moved = axis if top else axis + 1
    self.kinds = tuple(kind if i == moved else old for i, old in enumerate(self.kinds))
    self._sort_layout(moved)

  def _split(self, axis: int, amount: int, top: bool = False) -> None:
    """Split `axis` into (size // amount, amount), or (amount, size // amount) with `top`, in place: both parts keep its kind."""
    def split(shape: tuple[int, ...]) -> list[int]:
      parts = ([amount, shape[axis] // amount] if top else [shape[axis] // amount, amount]) if shape[axis] != 1 else [1, 1]
      return list(shape[:axis]) + parts + list(shape[axis + 1:])
    self._reshape(split, [*range(axis + 1), *range(axis, self.shape_len)])

  # ---- optimizations ----
  def apply_opt(self, opt: Opt) -> None:
    """Apply one optimization, or raise KernelOptError and change nothing."""
    saved = dict(vars(self))  # every field but the Opt list is replaced on change, never mutated
    try:
      self._apply(opt)
      self._check_limits(opt)
    except KernelOptError:
      vars(self).update(saved)
      raise
    self.applied_opts.append(opt)

  def _apply(self, opt: Opt) -> None:
    if opt.op in (OptOps.LOCAL, OptOps.GROUP, OptOps.GROUPTOP, OptOps.NOLOCALS, OptOps.STAGE, OptOps.TC, OptOps.LANES):
      check_opt(self.target.has_local, opt, "this device has no work-groups")
      check_opt(not self.dont_use_locals, opt, "NOLOCALS was applied")
    check_opt(not self.warpgroups or opt.op is OptOps.PERSIST, opt, "WARPGROUP comes after every Opt but PERSIST")
    if opt.op is OptOps.NOLOCALS:
      check_opt(not self.axes(*THREADS), opt, "the kernel already chose its locals")
      self.dont_use_locals = True
      return
    if not all_int(self.full_shape):
      check_opt(opt.op not in (OptOps.STAGE, OptOps.TC, OptOps.PADTO), opt, "a kernel with a symbolic axis does not take it")
    if opt.op is OptOps.STAGE: return self._stage(opt)
    if opt.op is OptOps.TC: return self._tensor_core(opt)
    if opt.op is OptOps.PERSIST: return self._persist(opt)
    if opt.op is OptOps.WARPGROUP: return self._warpgroup(opt)
    if opt.op is OptOps.LANES: return self._lanes(opt)
    global_axes, reduce_axes = self.axes(AxisKind.GLOBAL), self.axes(AxisKind.REDUCE)
    allowed = {OptOps.UPCAST: global_axes, OptOps.LOCAL: global_axes, OptOps.BLOCK: global_axes, OptOps.UNROLL: reduce_axes,
               OptOps.GROUP: reduce_axes, OptOps.GROUPTOP: reduce_axes, OptOps.PADTO: global_axes + reduce_axes}[opt.op]
    check_opt(0 <= opt.axis < len(allowed), opt,
              f"axis {opt.axis} is not one of this kernel's axes for it ({_describe(allowed)} in {self.full_shape})")
    axis = allowed[opt.axis]
    size = self.full_shape[axis]
    check_opt(isinstance(size, int), opt, f"axis {axis} has the symbolic size {size}: only concrete axes split")
    assert isinstance(size, int)
    if opt.op is OptOps.PADTO: return self._pad_to(opt, axis, size)
    amount = size if opt.amount == 0 else opt.amount
    check_opt(amount > 1 and size % amount == 0, opt, f"amount {amount} must be > 1 and divide the axis size {size}")
    if opt.op is OptOps.BLOCK: return self._block(opt, axis, amount)
    if opt.op in (OptOps.GROUP, OptOps.GROUPTOP):
      check_opt(not self.nested_tc and all(self.owners[group] == self.owners[axis] for group in self.axes(AxisKind.GROUP)), opt,
             "every GROUP axis of a kernel must split the same reduces (their threads are shared), and attention on tensor cores takes none")
    self.shift_to(axis, amount, SPLIT_KINDS[opt.op], top=opt.op is OptOps.GROUPTOP)
    if amount == size: self._drop_size_one_axes()

  def _block(self, opt: Opt, axis: int, amount: int) -> None:
    """`axis` split by `amount`, its outer part the outermost loop: the loops inside walk a block of it (axes.py's OptOps)."""
    check_opt(not self.target.has_local, opt, "a GPU runs its work-groups in no set order: BLOCK orders a CPU's loops")
    check_opt(amount < self.full_shape[axis], opt, f"amount {amount} leaves one block: use a smaller amount")
    self._split(axis, amount)
    self._permute([axis, *(other for other in range(self.shape_len) if other != axis)])

  def _pad_to(self, opt: Opt, axis: int, size: int) -> None:
    padded = -(-size // opt.amount) * opt.amount if opt.amount > 1 else size
    check_opt(padded != size, opt, f"the axis size {size} is already a multiple of {opt.amount}")
    check_opt(padded - size <= size // 2, opt, f"padding {size} to {padded} wastes more than a third of the work")
    if self.kinds[axis] is AxisKind.REDUCE:
      reduces = [self.reduceops[number] for number in self.owners[axis]]
      check_opt(not any(self.spans(number, axis) for number in range(self.n_outputs)) and
             all(reduceop.op is ReduceOps.SUM and _is_zero_where_padded(reduceop.src[0]) for reduceop in reduces), opt,
             "padding a reduce axis needs sums whose inputs are 0 wherever the loads are padded, and no output that is a row of it")
    pad = lambda shape: tuple((0, padded - size if i == axis and shape[i] == size else 0) for i in range(len(shape)))  # noqa: E731
    self.sts = [st.pad(pad(st.shape)) for st in self.sts]
    self.full_shape = tuple(padded if i == axis else s for i, s in enumerate(self.full_shape))

  def _stage(self, opt: Opt) -> None:
    number = opt.axis
    check_opt(opt.amount == 0, opt, "STAGE takes amount 0")
    check_opt(self.n_outputs <= number < len(self.bufs) and isinstance(self.bufs[number], MemBuffer), opt,
           f"buffer {number} is not an input of this kernel (its inputs are {self.n_outputs}..{len(self.bufs) - 1}, constants excluded)")
    check_opt(number not in self.staged, opt, "the buffer is staged already")
    check_opt(not self.axes(AxisKind.TC), opt, "TC stages its operands itself, and reads no other buffer in its reduce")
    check_opt(len(self.reduceops) == 1 and self.n_outputs == 1 and not self.stores_rows, opt,
           "only a kernel with one reduce and one output, storing no row, stages its inputs")
    check_opt(self.bufs[number] not in _loads_outside_reduces(self.ast), opt, "the buffer is also read after the reduce")
    check_opt(bool(self.tile_axes(number)), opt, "every thread reads the same element of the buffer a trip: there is nothing to share")
    self.staged += (number,)

  def tensor_core_operands(self) -> list[int]:
    """The buffer numbers of the two 16-bit or float32 inputs (3xTF32, or TF32 alone with ALLOW_TF32=1) whose products the kernel's
    one reduce sums, if tensor cores can compute it."""
    if len(self.reduceops) != 1 or self.n_outputs != 1 or self.stores_rows: return []
    widened = lambda node: node.src[0] if node.op is UnaryOps.CAST and node.dtype == dtypes.float32 else node  # noqa: E731 (exact)
    reduceop, product = self.reduceops[0], widened(self.reduceops[0].src[0])
    if reduceop.op is not ReduceOps.SUM or product.op is not BinaryOps.MUL: return []
    loads = [widened(src) for src in product.src]  # a product of 16-bit floats is exact in float32 registers, as in the mma
    if not all(load.op is BufferOps.LOAD and load.dtype in NESTED_TC_DTYPES and load.dtype == loads[0].dtype for load in loads): return []
    numbers = [self.bufs.index(load.arg) for load in loads]
    return numbers if numbers[0] != numbers[1] and self.bufs[numbers[0]] not in _loads_outside_reduces(self.ast) else []

  def tensor_core_choices(self) -> list[tuple[int, int, int]]:
    """The (M, N, K) axes a TC Opt can map onto one mma: a REDUCE axis both operands span, a GLOBAL axis only the first spans and
    one only the second does, sizes multiples of TC_SHAPE (PADTO first otherwise). Those with N the output's contiguous axis first
    (its padding aside), where that axis spans more than one mma tile: a 16-bit conv's columns (H200, fp16 N64 C64 56x56 against
    the batch for M and the channels for N: 51 -> 98 TFLOP/s); at 14 columns (padded to 16) the batch and channels ran 140, 93."""
    if not (operands := self.tensor_core_operands()): return []
    spans = lambda number, axis: not self.broadcast_along(number, axis)  # noqa: E731
    k_size = tc_reduce(self.bufs[operands[0]].dtype)
    choices = [(m, n, k) for k in self.axes(AxisKind.REDUCE) if self.full_shape[k] % k_size == 0 and all(spans(i, k) for i in operands)
               for first, second in (operands, operands[::-1]) for n in self.axes(AxisKind.GLOBAL) for m in self.axes(AxisKind.GLOBAL)
               if spans(first, m) and not spans(second, m) and spans(second, n) and not spans(first, n)
               and self.full_shape[m] % TC_SHAPE[0] == 0 and self.full_shape[n] % TC_SHAPE[1] == 0]
    contiguous = self.sts[0].real_strides(ignore_valid=True)
    return sorted(choices, key=lambda choice: not (contiguous[choice[1]] == 1 and sym_max(self.full_shape[choice[1]]) > TC_SHAPE[0]))

  def _tensor_core(self, opt: Opt) -> None:
    """Split M into (M/16, 2 FRAGMENT, 8 WARP), N into (N/8, 4 WARP, 2 FRAGMENT) and K into (K/16, 16 TC): the 32 threads of a warp
    are (8 rows x 4 column pairs) of each 16 x 8 output tile, as mma.sync's accumulators are. Both operands are staged, with
    `amount` tiles of each in flight (copied asynchronously: the tiles of the next amount - 1 trips load during this one's work)."""
    check_opt(self.target.tensor_cores, opt, "this device has no tensor cores")
    check_opt(opt.amount == 0 or 2 <= opt.amount <= 8, opt, f"TC's amount is the number of tile stages, 2 to 8 (0: 2), not {opt.amount}")
    check_opt(set(self.kinds) <= {AxisKind.GLOBAL, AxisKind.REDUCE}, opt, "TC comes before every Opt but PADTO")
    if self.nested_contractions(): return nested_tensor_core(self, opt)
    choices = self.tensor_core_choices()
    check_opt(0 <= opt.axis < len(choices), opt, f"choice {opt.axis} is not one of this kernel's {len(choices)} ways onto tensor cores "
           "(a sum of products of two 16-bit or float32 inputs, M, N and K multiples of 16, 8 and 16 or 8)")
    m, n, k = choices[opt.axis]
    self.staged, self.tile_stages = tuple(self.tensor_core_operands()), opt.amount or 2
    positions = [self.axes(AxisKind.GLOBAL).index(m), self.axes(AxisKind.GLOBAL).index(n), self.axes(AxisKind.REDUCE).index(k)]
    self.shift_to(self.axes(AxisKind.GLOBAL)[positions[0]], 16, AxisKind.FRAGMENT)
    self.shift_to(self.axes(AxisKind.FRAGMENT)[0], 8, AxisKind.WARP)
    self.shift_to(self.axes(AxisKind.GLOBAL)[positions[1]], 8, AxisKind.WARP)
    self.shift_to(self.axes(AxisKind.WARP)[1], 2, AxisKind.FRAGMENT)
    self.shift_to(self.axes(AxisKind.REDUCE)[positions[2]], tc_reduce(self.bufs[self.staged[0]].dtype), AxisKind.TC)
    self._drop_size_one_axes()

  def _persist(self, opt: Opt) -> None:
    """Split GLOBAL axis `opt.axis` into (amount SERIAL, size / amount): each work-group loops over `amount` tiles, whose trips
    run on as one pipeline: the copies of a tile's first trips start during the last trips of the one before (Linearizer). On
    the H200 a 128 x 256 tile cost as much as 550 steps of K besides its own (fp16 4096 x 4096 x K: 220 TFLOP/s at K 512, 298 at
    1024, 406 at 4096, 441 at 16384), the first trips' copies waited for and the outputs stored while no mma ran."""
    global_axes = self.axes(AxisKind.GLOBAL)
    check_opt(bool(self.axes(AxisKind.TC)) and not self.axes(AxisKind.SERIAL), opt, "PERSIST comes once, after TC")
    check_opt(0 <= opt.axis < len(global_axes), opt, f"axis {opt.axis} is not one of this kernel's GLOBAL axes ({_describe(global_axes)})")
    size = self.full_shape[global_axes[opt.axis]]
    check_opt(isinstance(size, int) and opt.amount > 1 and size % opt.amount == 0, opt, f"amount {opt.amount} must be > 1 and divide {size}")
    self.shift_to(global_axes[opt.axis], opt.amount, AxisKind.SERIAL, top=True)

  def _lanes(self, opt: Opt) -> None:
    """Split `amount` neighbouring threads of a warp off the last own axis of every nested contraction and off features axis
    number `axis` (features(); a kernel without features takes 0 and splits none of its outputs, which lane 0 stores), each lane
    a contiguous run of both: the lanes share each score's products, their partial sums meet by shuffles in registers
    (thread_reduce.lane_reduce), and each lane keeps its run of the outputs. Where a thread computed every score of its queries
    whole and read each key's row alone, a row is read once by the lanes together and the registers per query shrink by `amount`."""
    check_opt(self.target.warp_shuffles, opt, "this device has no warp shuffles")
    check_opt(set(self.kinds) <= {AxisKind.GLOBAL, AxisKind.REDUCE}, opt, "LANES comes before every other Opt")
    check_opt(opt.amount in (2, 4, 8, 16, 32), opt, f"the lanes are 2, 4, 8, 16 or 32 threads of a warp, not {opt.amount}")
    check_opt(bool(inner := self.nested_contractions()), opt, "no reduce is nested in another's loop with axes of its own")
    features = self.features()
    check_opt(0 <= opt.axis < max(len(features), 1), opt, f"axis {opt.axis} is not one of this kernel's {len(features)} features axes")
    splits = [self.own_axis(number) for number in inner] + features[opt.axis:][:1]
    check_opt(all(isinstance(size := self.full_shape[axis], int) and size % opt.amount == 0 for axis in splits), opt,
              f"{opt.amount} lanes must divide the axes they split, {[self.full_shape[axis] for axis in splits]}")
    for axis in sorted(set(splits), reverse=True):  # (the later first: the numbers of those before stay)
      self._split(axis, opt.amount, top=True)
      self.kinds = tuple(AxisKind.LANE if i == axis else kind for i, kind in enumerate(self.kinds))
    self._sort_layout()
    self._drop_size_one_axes()

  def _warpgroup(self, opt: Opt) -> None:
    check_warpgroup(self, opt)
    self.warpgroups = True

  def _check_limits(self, opt: Opt) -> None:
    check_opt(self.upcast_size <= self.target.max_upcast, opt,
           f"{self.upcast_size} upcast lanes is over the limit of {self.target.max_upcast}; use a smaller amount")
    check_opt(self.local_size <= self.target.max_local_size, opt,
           f"{self.local_size} threads per work-group is over this device's {self.target.max_local_size}; use a smaller amount")
    thread_axes = tuple(self.full_shape[axis] for axis in self.axes(AxisKind.LOCAL, AxisKind.GROUP))  # the last is launch dimension 0
    thread_axes += (self.size_of(AxisKind.WARP) * self.lane_count,) if self.axes(AxisKind.WARP, AxisKind.LANE) else ()  # a warp's: one dim
    limits = self.target.max_local_dim_sizes
    check_opt(len(thread_axes) <= len(limits), opt, "no launch dimension is left for another local axis; use fewer LOCAL/GROUP axes")
    check_opt(all(size <= limit for size, limit in zip(reversed(thread_axes), limits)), opt,
           f"local axes {thread_axes} exceed the device's {limits}; use a smaller amount")
    check_opt(self.local_memory_bytes <= self.target.local_memory_bytes, opt,
           f"group reduces and staged tiles need {self.local_memory_bytes} bytes of local memory, over this device's "
           f"{self.target.local_memory_bytes}; reduce the local size, the upcast or the unroll")
    if self.staged:
      check_opt(not self.axes(AxisKind.GROUP), opt, "a kernel that stages an input does not GROUP")
      check_opt(self.local_size > 1, opt, "staging shares loads between a work-group's threads: add a LOCAL axis first")
      check_opt(bool(self.axes(AxisKind.REDUCE)), opt, "staging needs a reduce loop: unroll less of the reduce")

  # ---- the canonical layout ----
  def _drop_size_one_axes(self) -> None:
    if 1 not in self.full_shape: return
    keep = [axis for axis, size in enumerate(self.full_shape) if size != 1] or [0]
    self._reshape(lambda shape: [shape[axis] for axis in keep], keep)

  def _merge_adjacent_axes(self) -> None:
    """Merge neighbouring axes of one kind and owners that every buffer walks as one (unmasked, stride[i] == stride[i+1] * size[i+1])."""
    for axis in reversed(range(self.shape_len - 1)):  # from the innermost pair: a merge leaves the axes before it where they were
      if self._can_merge(axis):
        merged = lambda shape, a=axis: list(shape[:a]) + [shape[a] * shape[a + 1]] + list(shape[a + 2:])  # noqa: E731
        self._reshape(merged, [i for i in range(self.shape_len) if i != axis + 1])

  def _can_merge(self, axis: int) -> bool:
    if (self.kinds[axis], self.owners[axis]) != (self.kinds[axis + 1], self.owners[axis + 1]) or self.kinds[axis] in LANES: return False
    if not all_int(self.full_shape[axis:axis + 2]): return False  # a symbolic axis stays an axis of its own
    for st in self.sts:
      view = st.views[-1]
      if view.mask is not None and any(view.mask[i] != (0, view.shape[i]) for i in (axis, axis + 1)): return False
      if view.strides[axis] != view.strides[axis + 1] * view.shape[axis + 1]: return False
    return True

  @property
  def name(self) -> str:
    """A readable kernel name: r_ for a reduce, E_ for elementwise, then the axis sizes (output axes, reduce axes, lanes)."""
    prefix = "r" if self.reduceops else "E"
    sizes = [str(size) if isinstance(size, int) else size.render() for size in self.full_shape]
    if self.reduceops: sizes.insert((self.axes(*REDUCE_SIDE, *LANES) or [self.shape_len])[0], "")
    if lanes := self.axes(*LANES): sizes.insert(lanes[0] + bool(self.reduceops), "")
    return to_function_name(f"{prefix}_{'_'.join(sizes)}".replace("__", "_"))

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

__all__ = ["CPU_TARGET", "GPU_MAX_UPCAST", "KIND_COLORS", "LANES", "LAYOUT_RANK", "MAX_UPCAST", "REDUCE_SIDE", "SPLIT_KINDS", "TC_DTYPES", "TC_SHAPE",
           "THREADS", "AxisKind", "Kernel", "KernelOptError", "KernelTarget", "Opt", "OptOps", "TileLayout", "partials_dtype"]
