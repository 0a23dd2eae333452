"""Layer 3: the Linearizer turns a Kernel into a list of typed UOps (loops, loads, ALU, stores). Imports helpers, dtype, ops, shape/,
codegen/kernel, codegen/uops.

Equal pure UOps are made once (common-subexpression elimination) and constant operands are folded as UOps are built.
A UOp made inside a loop is only reused inside that loop, so every renderer can scope variables by loop.
"""
from __future__ import annotations
import functools, itertools
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple, cast
from tinyc.dtype import DType, dtypes
from tinyc.helpers import DEBUG, prod
from tinyc.ops import BinaryOps, BufferOps, ConstBuffer, LazyOp, MemBuffer, Op, ReduceOps, TernaryOps, UnaryOps, const_key
from tinyc.shape.shapetracker import flatten_node
from tinyc.shape.symbolic import AndNode, DivNode, LtNode, ModNode, MulNode, Node, NumNode, SumNode, Variable, simplify_given_valid, sint, sym_max
from tinyc.codegen.kernel import REDUCE_SIDE, AxisKind, Kernel
from tinyc.codegen.uops import (PACKED_16_BIT, PYTHON_ALU, VECTOR_WIDTH, GlobalBuffer, LocalBuffer, Loop, ThreadIndex, ThreadKind,
                               UOp, UOps, cast_python_value, is_const, is_identity, without_unused)
from tinyc.codegen.tiles import Tile, define_tile, enter_trip, leave_trip, load_tiles, mma, start_tile_copies, store_tiles, wgmma
from tinyc.codegen.packing import LOADED_DTYPES, accumulate_steps, gated_rows, horizontal, packed_axis, packed_rows, prefetch
from tinyc.codegen.online import online_groups, online_reduce, siblings
from tinyc.codegen.bounds import identity_masks, loop_range
from tinyc.codegen.thread_reduce import group_reduce, lane_reduce
from tinyc.codegen.register_mma import computed_by_mma, register_mma

REDUCE_TO_ALU = {ReduceOps.SUM: BinaryOps.ADD, ReduceOps.MAX: BinaryOps.MAX}
Address = tuple[Node, Node]  # where a lane reads or writes memory: (index, validity)

@dataclass
class Scope:
  """What code at one place of the kernel knows: each bound axis's index (a thread id or open loop), the lane axes, the reduces
  computed so far (-> the lane axes their results are keyed by, and the results), and which tile a staged reduce trip reads."""
  bound: dict[int, Node]
  lane_axes: list[int]
  reduced: dict[LazyOp, tuple[tuple[int, ...], dict[tuple[int, ...], UOp]]]
  tile_stage: Node | None = None

class Lanes(NamedTuple):
  """The lanes of one computation: each lane's index of every axis, laid out row-major over `sizes` (one size a lane axis);
  `packed`: the position in `sizes` of the axis whose lanes a CPU reduce packs into vectors (packing.py), if any."""
  idxs: list[list[Node]]
  sizes: list[int]
  packed: int | None = None

# the rule of a Node type for Node.render: (node, rules, linearizer) -> its UOp. `a <op> b` with a number b is one ALU UOp (of
# the index dtype unless `dtype` is given); a SumNode or AndNode folds its terms with `op`
RenderRule = Callable[[Any, Any, "Linearizer"], UOp]
def _with_number(op: BinaryOps, dtype: DType | None = None) -> RenderRule:  # (b is a Node too in a product or comparison of symbolic sizes)
  return lambda node, ops, ctx: ctx.alu(op, dtype or ctx.index_dtype, node.a.render(ops, ctx),
                                        node.b.render(ops, ctx) if isinstance(node.b, Node) else ctx.const(node.b, ctx.index_dtype))
def _folded(op: BinaryOps, dtype: DType | None = None) -> RenderRule:
  return lambda node, ops, ctx: functools.reduce(functools.partial(ctx.alu, op, dtype or ctx.index_dtype), [n.render(ops, ctx) for n in node.nodes])

class Linearizer:
  """`threads`: the GLOBAL axes become thread ids (SPECIAL, for GPUs; see thread_indices), else loops (CPUs)."""
  def __init__(self, kernel: Kernel, threads: bool = False) -> None:
    self.kernel, self.threads = kernel, threads
    self.fresh_reads = not threads and bool(kernel.nested_contractions())  # packing.fresh_operands; its loops' invariants: invariant_loop
    self.uops: list[UOp] = []
    self._made: dict[tuple, UOp] = {}
    self._scopes: list[list[tuple]] = [[]]  # keys made inside each open loop, forgotten when it ends
    self.loop_uops: dict[str, UOp] = {}
    self.thread_idxs: dict[int, Node] = {}  # the index variable of each GLOBAL, LOCAL and GROUP axis
    self.lane_index: Node = NumNode(0)  # the one index of the LANE axes (thread_indices)
    self.open_ifs: list[UOp] = []  # blocks that close at the kernel's end (the threads with group id 0 going on alone)
    self._value_axes: dict[LazyOp, frozenset[int]] = {}
    self._partials: dict[LazyOp, UOp] = {}  # each group reduce's local memory
    self._stage_barriers: UOp | None = None  # a persistent kernel's tile stage barriers (made before the loop over its tiles)
    self.tiles_stored = False  # whether threads store tensor-core tiles themselves (not all copies in the background)
    self._locals: list[UOp] = []  # defined right after the parameters, at the kernel's scope, wherever they are used
    self._open_loops: list[UOp] = []  # the loops around the code being made
    self._scope_depth: dict[UOp, int] = {}  # each loop's place in _scopes (the scopes before it are those around it)
    self.index_dtype = dtypes.int32 if max(st.real_size() for st in kernel.sts) < 2**31 else dtypes.int64
    # one global per buffer number: a buffer read through two views is still one argument
    dtype_of_buffer = {buf.idx: buf.dtype for buf in kernel.bufs if isinstance(buf, MemBuffer)}
    self.globals = {idx: self.uop(UOps.DEFINE_GLOBAL, dtype, (), GlobalBuffer(f"data{idx}", idx, idx < kernel.n_outputs), pure=False)
                    for idx, dtype in sorted(dtype_of_buffer.items())}
    for var in kernel.vars:  # a symbolic size is an int argument, read wherever the index math names its Variable
      self.loop_uops[var.expr] = self.cast(self.uop(UOps.DEFINE_VAR, dtypes.int32, (), var, pure=False), self.index_dtype)
    self.tiles: dict[MemBuffer | ConstBuffer, Tile] = {kernel.bufs[number]: define_tile(self, number) for number in kernel.staged}
    # each buffer's number (its first, where one repeats): a Winograd transform reads 562 buffers, and list.index compared them one by one
    self.buffer_numbers = {buf: number for number, buf in reversed(list(enumerate(kernel.bufs)))}
    self.online = online_groups(kernel)  # softmax's max and the sums that read it, each group in one loop
    self.walking: set[LazyOp] = set()  # the reduces whose loops are open (their siblings among them: online.siblings)

  # ---- making UOps ----
  def uop(self, op: UOps, dtype: DType | None, src: tuple[UOp, ...] = (), arg: Any = None, pure: bool = True) -> UOp:
    key = (op, dtype, src, const_key(arg) if op is UOps.CONST else arg)  # (-0.0 == 0.0 in Python, but 1 / -0.0 is -inf)
    if pure and key in self._made: return self._made[key]
    made = UOp(op, dtype, src, arg)
    self.uops.append(made)
    if pure:
      self._made[key] = made
      self._scopes[-1].append(key)
    return made

  def const(self, value: Any, dtype: DType) -> UOp: return self.uop(UOps.CONST, dtype, (), cast_python_value(value, dtype))

  def alu(self, op: Op, dtype: DType, *src: UOp) -> UOp:
    if all(s.op is UOps.CONST for s in src) and op in PYTHON_ALU and not (op is BinaryOps.MOD and dtypes.is_float(dtype) and src[-1].arg == 0):
      return self.const(PYTHON_ALU[op](*[s.arg for s in src]), dtype)
    if op in (BinaryOps.ADD, BinaryOps.MUL):  # x * 1 and x + 0 are x (for floats x + -0.0 only: -0.0 + 0.0 is 0.0)
      if is_identity(cast(BinaryOps, op), src[1], dtype): return src[0]
      if is_identity(cast(BinaryOps, op), src[0], dtype): return src[1]
    if op is BinaryOps.MUL and dtypes.is_int(dtype) and any(is_const(value, 0) for value in src): return self.const(0, dtype)
    if op is TernaryOps.WHERE and src[0].op is UOps.CONST: return src[1] if src[0].arg else src[2]
    if op in (BinaryOps.IDIV, BinaryOps.MOD) and not dtypes.is_float(dtype) and is_const(src[1], 0): return self.const(0, dtype)  # see uops.py
    return self.uop(UOps.ALU, dtype, tuple(src), op)

  def cast(self, value: UOp, dtype: DType) -> UOp:
    if value.dtype == dtype: return value
    if value.op is UOps.CONST: return self.const(value.arg, dtype)
    return self.uop(UOps.CAST, dtype, (value,))

  def loop(self, name: str, size: sint, axis: int | None, outermost_global: bool = False, bounds: tuple[UOp, UOp] | None = None) -> UOp:
    # LLVM should vectorize across the trips only of a long loop along which every buffer moves by 0 or 1 elements: otherwise
    # it takes gathers or masked tails, and packing the upcast lanes (SLP) is the better plan
    vectorize = axis is not None and sym_max(size) >= 16 and all(
      st.real_strides()[axis] in (0, 1) for st, buf in zip(self.kernel.sts, self.kernel.bufs) if isinstance(buf, MemBuffer))
    bounds = bounds or (self.const(0, self.index_dtype), self.index(size) if isinstance(size, Node) else self.const(size, self.index_dtype))
    loop = self.uop(UOps.LOOP, self.index_dtype, bounds, Loop(name, vectorize, outermost_global, size), pure=False)
    self.loop_uops[name] = loop
    self._scope_depth[loop] = len(self._scopes)
    self._open_loops.append(loop)
    self._scopes.append([])
    return loop

  def end(self, loop: UOp) -> None:
    self.uop(UOps.END, None, (loop,), pure=False)
    if loop in self._open_loops: self._open_loops.remove(loop)
    for key in self._scopes.pop(): self._made.pop(key, None)

  # ---- index math: symbolic Nodes -> UOps ----
  def index(self, node: Node) -> UOp: return node.render(self._index_ops, self)

  _index_ops: dict[type, RenderRule] = {
    Variable: lambda node, ops, ctx: ctx.loop_uops[node.expr],
    NumNode: lambda node, ops, ctx: ctx.const(node.b, ctx.index_dtype),
    MulNode: _with_number(BinaryOps.MUL), DivNode: _with_number(BinaryOps.IDIV), ModNode: _with_number(BinaryOps.MOD),
    LtNode: _with_number(BinaryOps.CMPLT, dtypes.bool), SumNode: _folded(BinaryOps.ADD), AndNode: _folded(BinaryOps.AND, dtypes.bool)}

  # ---- memory: each lane's element at its address, (index, validity); 16 bytes at once where lanes are neighbours ----
  def access(self, index: Node, valid: Node) -> tuple[UOp, tuple[UOp, ...]]:
    """A load's or store's index and its gate, none where `valid` always holds (a gated index need only be right where valid)."""
    if valid.min == 1: return self.index(index), ()
    gate = self.index(valid)
    return self.index(simplify_given_valid(index, valid)), (gate,)

  def load(self, memory: UOp, index: Node, valid: Node) -> UOp:
    """One element of `memory`, 0 where `valid` is 0."""
    dtype = cast(DType, memory.dtype)
    if valid.max == 0: return self.const(0, dtype)
    index_uop, gate = self.access(index, valid)
    return self.uop(UOps.LOAD, dtype, (memory, index_uop) + gate)

  def read(self, memory: UOp, sizes: list[int], addresses: list[Address], dtype: DType, packed: int | None = None) -> list[UOp]:
    """Each lane's element of `memory` (lanes laid out as `sizes`) as `dtype`: vector loads where vector_groups finds them, else one by one."""
    memory_dtype = cast(DType, memory.dtype)
    values: list[UOp | None] = [None] * len(addresses)
    groups = [(group, start, NumNode(1)) for group, start in self.vector_groups(memory_dtype, sizes, addresses, packed)]
    for group, start, valid in groups or ([] if self.threads else gated_rows(memory_dtype, sizes, addresses)):
      index, gate = self.access(start, valid)
      vector = self.uop(UOps.LOAD, memory_dtype.vec(len(group)), (memory, index) + gate)
      for lane_number, lane in enumerate(group): values[lane] = self.uop(UOps.GEP, memory_dtype, (vector,), lane_number)
    return [self.cast(value if value is not None else self.load(memory, *address), dtype) for value, address in zip(values, addresses)]

  def write(self, memory: UOp, sizes: list[int], values: list[UOp], addresses: list[Address]) -> None:
    """Store each lane's value in `memory` (cast to its type) as `read` loads: none where invalid, gated where it may be."""
    dtype = cast(DType, memory.dtype)
    stored: set[int] = set()
    for group, start in self.vector_groups(dtype, sizes, addresses):
      vector = self.uop(UOps.VECTORIZE, dtype.vec(len(group)), tuple(self.cast(values[lane], dtype) for lane in group))
      self.uop(UOps.STORE, None, (memory, self.index(start), vector), pure=False)
      stored.update(group)
    for lane, (value, (index, valid)) in enumerate(zip(values, addresses)):
      if lane in stored or valid.max == 0: continue  # valid.max == 0: e.g. a lane that is all PADTO padding
      index_uop, gate = self.access(index, valid)
      self.uop(UOps.STORE, None, (memory, index_uop, self.cast(value, dtype)) + gate, pure=False)

  def vector_groups(self, dtype: DType, sizes: list[int], addresses: list[Address], packed: int | None = None) -> list[tuple[list[int], Node]]:
    """Groups of lanes (laid out as `sizes`) at neighbouring valid addresses, with the first one's index: each is one load or store.
    On GPUs along one upcast axis, from an aligned index: VECTOR_WIDTH lanes of a 4-byte type (16 bytes), or 8, 4 or 2 lanes of a
    16-bit float (16, 8 or 4 bytes: a thread's two columns of a tensor-core tile are stored as one 4-byte word). On CPUs all the
    lanes of the `packed` axis (see packing.py), from any index."""
    if self.threads:
      widths = (VECTOR_WIDTH,) if dtype in (dtypes.float32, dtypes.int32, dtypes.uint32) else (8, 4, 2) if dtype in PACKED_16_BIT else ()
      choices = [(position, width) for width in widths for position, size in enumerate(sizes) if size % width == 0]
    else: choices = [(packed, sizes[packed])] if packed is not None and dtype in LOADED_DTYPES else []
    for position, width in choices:
      stride = prod(sizes[position + 1:])
      groups = [[first + i * stride for i in range(width)] for first in range(len(addresses)) if (first // stride) % width == 0]
      if all(_neighbours(addresses, group, aligned=self.threads) for group in groups): return [(group, addresses[group[0]][0]) for group in groups]
    return []

  # ---- the AST -> UOps ----
  def parse(self, node: LazyOp, lanes: Lanes, scope: Scope) -> list[UOp]:
    """The values of `node`, one per lane."""
    if node.op in (BufferOps.LOAD, BufferOps.CONST):
      buf, st = node.arg, self.kernel.sts[self.buffer_numbers[node.arg]]
      if isinstance(buf, ConstBuffer):  # its value (a Node: of the kernel's Variables), 0 where its view is masked (padding)
        value = self.cast(self.index(buf.val), buf.dtype) if isinstance(buf.val, Node) else self.const(buf.val, buf.dtype)
        zero = self.const(0, buf.dtype)
        return [self.alu(TernaryOps.WHERE, buf.dtype, self.index(st.expr_idxs(idxs)[1]), value, zero) for idxs in lanes.idxs]
      if (tile := self.tiles.get(buf)) is not None:
        assert scope.tile_stage is not None, "a staged buffer is read inside its reduce loop"
        return self.read(tile.memory, lanes.sizes, [(tile.index(idxs, scope.tile_stage), NumNode(1)) for idxs in lanes.idxs], buf.dtype)
      addresses = [st.expr_idxs(idxs) for idxs in lanes.idxs]
      def read() -> list[UOp]: return self.read(self.globals[buf.idx], lanes.sizes, addresses, buf.dtype, lanes.packed)
      if not self.threads: prefetch(self, self.globals[buf.idx], st, addresses, buf.dtype.itemsize)
      if (loop := self.invariant_loop(buf, addresses)) is not None: return self.before(loop, read)
      return read()
    if node.op in ReduceOps:
      if node not in scope.reduced: self.reduce(node, scope)  # a reduce that depends on an axis bound here and no further out
      key_axes, results = scope.reduced[node]
      return [results[tuple(cast(NumNode, idxs[axis]).b for axis in key_axes)] for idxs in lanes.idxs]
    srcs = [self.parse(src, lanes, scope) for src in node.src]
    if node.op is UnaryOps.CAST: return [self.cast(value, node.arg) for value in srcs[0]]
    if node.op is UnaryOps.BITCAST: return [self.uop(UOps.BITCAST, node.arg, (value,)) for value in srcs[0]]
    return [self.alu(node.op, node.dtype, *values) for values in zip(*srcs)]

  def parse_at(self, node: LazyOp, idxs: list[list[Node]], sizes: list[int], scope: Scope) -> list[UOp]:
    """The values of `node` at lanes given by their indices (laid out as `sizes`): a tensor core's fragments (register_mma.py)."""
    return self.parse(node, Lanes(idxs, sizes), scope)

  def invariant_loop(self, buf: MemBuffer, addresses: list[Address]) -> UOp | None:
    """On a GPU or where fresh_reads, the outermost reduce loop around here whose trips, and those of every loop inside it, read an
    input's elements at the same addresses: attention's query row in the loop over the keys, which ptxas left there for 16-bit
    values, and LLVM past volatile loads (no load moves past one: the GPT's dq gathered its 16 rows of q a trip, 384 inserts)."""
    if not (self.threads or self.fresh_reads) or buf.idx < self.kernel.n_outputs: return None
    used = {var.expr for index, valid in addresses for var in index.vars() | valid.vars()}
    loops = list(itertools.takewhile(lambda loop: loop.arg.name not in used and loop.arg.name.startswith("ridx"), reversed(self._open_loops)))
    return loops[-1] if loops else None

  def before(self, loop: UOp, make: Callable[[], list[UOp]]) -> list[UOp]:
    """What `make` makes (pure UOps: loads and their index math), placed just before `loop` and reused there by the code after it."""
    depth, scopes, mark = self._scope_depth[loop], self._scopes, len(self.uops)
    hidden = {key: self._made.pop(key) for scope in scopes[depth:] for key in scope if key in self._made}  # made inside: not before it
    self._scopes = scopes[:depth]
    try: made = make()
    finally: self._scopes = scopes
    self._made.update(hidden)
    moved = self.uops[mark:]
    del self.uops[mark:]
    at = next(position for position, uop in enumerate(self.uops) if uop is loop)
    self.uops[at:at] = moved
    return made

  def lanes(self, scope: Scope) -> Lanes:
    """Every combination of the scope's lane axes' values, each as one index per axis (an axis not bound reads index 0)."""
    sizes = [self.kernel.full_shape[axis] for axis in scope.lane_axes]
    lane_values = [dict(zip(scope.lane_axes, map(NumNode, values))) for values in itertools.product(*map(range, sizes))]
    return Lanes([[at.get(axis, scope.bound.get(axis, NumNode(0))) for axis in range(self.kernel.shape_len)] for at in lane_values], sizes)

  def linearize(self) -> list[UOp]:
    kernel = self.kernel
    global_loops = self.thread_indices()
    bound = kernel.axes(AxisKind.GLOBAL, AxisKind.SERIAL, AxisKind.LOCAL, AxisKind.WARP, AxisKind.LANE)
    top = Scope({axis: self.thread_idxs[axis] for axis in bound},
                kernel.axes(AxisKind.UPCAST, AxisKind.FRAGMENT), {})
    if serial_axes := kernel.axes(AxisKind.SERIAL):  # a persistent kernel: its tile stages start once, before the loop over its tiles
      self._stage_barriers = start_tile_copies(self, top.bound, kernel.axes(AxisKind.REDUCE))
      global_loops += [self.loop(cast(Variable, self.thread_idxs[axis]).expr, kernel.full_shape[axis], None) for axis in serial_axes]
    for store in kernel.stores: self.hoist(store.src[0], top)
    # outputs that are rows walk their reduce axes once more, every thread of a group its share; the others are stored once,
    # by the threads with group id 0
    rows = [store for store in kernel.stores if any(kernel.spans(kernel.bufs.index(store.arg), axis) for axis in kernel.axes(*REDUCE_SIDE))]
    for store in rows: self.store(store, top)
    if (singles := [store for store in kernel.stores if store not in rows]) and kernel.axes(AxisKind.GROUP) and not self.open_ifs:
      self.open_ifs.append(self.open_if(self.group_member() < 1))
    # with LANES, the outputs each lane has a part of first, then the others by lane 0 alone
    lane_parts = {store for store in singles if any(kernel.spans(kernel.bufs.index(store.arg), axis) for axis in kernel.axes(AxisKind.LANE))}
    for number, store in enumerate(sorted(singles, key=lambda store: store not in lane_parts)):
      if kernel.axes(AxisKind.LANE) and number == len(lane_parts): self.open_ifs.append(self.open_if(self.lane_index < 1))
      self.store(store, top)
    for block in reversed(global_loops + self.open_ifs): self.end(block)
    if serial_axes: self.uop(UOps.ASYNC_WAIT, None, pure=False)  # no copy left running (they were for tiles past the last)
    self.uops = without_unused(self.uops)  # such as the scalar lanes packed into vectors
    if DEBUG >= 5: print("\n".join(map(str, self.uops)))
    return self.uops

  def thread_indices(self) -> list[UOp]:
    """Index variables of the GLOBAL, LOCAL, GROUP and WARP axes (in `thread_idxs`); returns the loops of the GLOBAL axes on a CPU.
    With thread axes GLOBAL axes are work-group ids, else global thread ids; the last axis is dimension 0 (neighbouring memory),
    except that a warp's 32 threads (its WARP axes: 8 rows x 4 columns of a tensor-core tile) are dimension 0 together, and that
    with GROUP axes, where the last is read with a stride, those every input reads contiguously (or not at all) come last: a sum down
    columns has its LOCAL columns, not its GROUP rows, on neighbouring threads."""
    kernel = self.kernel
    global_axes, thread_axes, warp_axes = kernel.axes(AxisKind.GLOBAL), kernel.axes(AxisKind.LOCAL, AxisKind.GROUP), kernel.axes(AxisKind.WARP)
    lane_axes = kernel.axes(AxisKind.LANE)
    def clean(axis: int) -> bool:  # some input reads it contiguously, none with a stride
      strides = {st.real_strides(True)[axis] for st in kernel.sts[kernel.n_outputs:]} - {0}
      return strides == {1}
    if kernel.axes(AxisKind.GROUP) and not warp_axes and not clean(thread_axes[-1]): thread_axes = sorted(thread_axes, key=clean)  # (stable)
    for axes, prefix, kind in ((global_axes, "g", ThreadKind.GROUP if thread_axes or warp_axes or lane_axes else ThreadKind.GLOBAL),
                               (thread_axes, "l", ThreadKind.LOCAL)):
      for position, axis in enumerate(axes):
        name, size, dim = f"{prefix}idx{axis}", kernel.full_shape[axis], len(axes) - 1 - position + (prefix == "l" and bool(warp_axes or lane_axes))
        self.thread_idxs[axis] = Variable(name, 0, sym_max(size) - 1)
        if self.threads: self.loop_uops[name] = self.uop(UOps.SPECIAL, self.index_dtype, (), ThreadIndex(dim, name, size, kind), pure=False)
    for axis in kernel.axes(AxisKind.SERIAL): self.thread_idxs[axis] = Variable(f"sidx{axis}", 0, kernel.full_shape[axis] - 1)  # (linearize's loop)
    if warp_axes:  # a tensor-core tile's 8 rows x 4 column pairs; with LANE axes (register_mma.py), the LANE index is the pair
      self.loop_uops["lane"] = self.uop(UOps.SPECIAL, self.index_dtype, (), ThreadIndex(0, "lane", 32, ThreadKind.LOCAL), pure=False)
      self.thread_idxs.update(zip(warp_axes + lane_axes[:1], (self.lane // 4, self.lane % 4)))
      if lane_axes: self.lane_index = self.lane % 4
    elif lane_axes:  # one index for all of them, the neighbouring threads of dimension 0
      self.lane_index = Variable("lane", 0, kernel.lane_count - 1)
      self.loop_uops["lane"] = self.uop(UOps.SPECIAL, self.index_dtype, (), ThreadIndex(0, "lane", kernel.lane_count, ThreadKind.LOCAL), pure=False)
    self.thread_idxs.update({axis: self.lane_index for axis in lane_axes})
    assert self.threads or not thread_axes + warp_axes + lane_axes, "LOCAL, GROUP, WARP and LANE axes need a GPU"
    return [] if self.threads else [self.loop(f"gidx{axis}", kernel.full_shape[axis], axis, outermost_global=axis == global_axes[0])
                                    for axis in global_axes]

  lane = Variable("lane", 0, 31)  # a thread's place in its warp

  def work_group_thread(self) -> Node:
    """This thread's number in its work-group, over its LOCAL axes and its place in the warp."""
    local_axes = self.kernel.axes(AxisKind.LOCAL)
    return flatten_node([self.thread_idxs[axis] for axis in local_axes] + [self.lane], [self.kernel.full_shape[axis] for axis in local_axes] + [32])

  def group_member(self) -> Node:
    """This thread's position among the threads that share a group reduce."""
    group_axes = self.kernel.axes(AxisKind.GROUP)
    return flatten_node([self.thread_idxs[axis] for axis in group_axes], [self.kernel.full_shape[axis] for axis in group_axes])

  def value_axes(self, node: LazyOp) -> frozenset[int]: return self.kernel.value_axes(node, self._value_axes)

  def hoist(self, node: LazyOp, scope: Scope) -> None:
    """Compute now the reduces in `node` whose value depends only on what `scope` binds: once per trip of the loops it needs."""
    ready, inside = set(scope.bound) | set(scope.lane_axes), set(node.walk())
    for reduceop in self.kernel.reduceops:  # sources first: a reduce another one reads is computed out here, once
      if reduceop in inside and reduceop not in scope.reduced and self.value_axes(reduceop) <= ready: self.reduce(reduceop, scope)

  def walk_loops(self, axes: list[int], hoisted: LazyOp, scope: Scope, reduces: tuple[LazyOp, ...] = ()) -> list[UOp]:
    """Open a loop for each axis (binding its index in `scope`), computing the reduces of `hoisted` as soon as they can be. The loops
    of `reduces` leave out the trips where a mask makes each of their inputs its identity (bounds.py)."""
    loops, masks = [], identity_masks(self, reduces) if reduces and not self.tiles else []
    self.hoist(hoisted, scope)
    for number, axis in enumerate(axes):
      name, size = f"ridx{axis}", self.kernel.full_shape[axis]
      while any(loop.arg.name == name for loop in self._open_loops): name += "_"  # a loop nested in another over the same axis
      index = Variable(name, 0, sym_max(size) - 1)
      bounds = loop_range(self, scope, axis, index, axes[number + 1:], masks) if masks and isinstance(size, int) else None
      loops.append(self.loop(name, size, axis, bounds=bounds))
      scope.bound[axis] = index
      self.hoist(hoisted, scope)
    return loops

  def store(self, store: LazyOp, outer: Scope) -> None:
    """Store one output: along the output axes, and, for a row, the reduce-side axes it spans."""
    kernel, number = self.kernel, self.kernel.bufs.index(store.arg)
    grouped, looped, unrolled = ([axis for axis in kernel.axes(kind) if kernel.spans(number, axis)] for kind in REDUCE_SIDE)
    scope = Scope(outer.bound | {axis: self.thread_idxs[axis] for axis in grouped}, sorted(outer.lane_axes + unrolled), dict(outer.reduced))
    loops = self.walk_loops(looped, store.src[0], scope)
    lanes = self.lanes(scope)
    values = self.parse(store.src[0], lanes, scope)
    if not self.threads: values = packed_rows(self, scope.lane_axes, lanes.sizes, values)
    self.write(self.globals[store.arg.idx], lanes.sizes, values, [kernel.sts[number].expr_idxs(idxs) for idxs in lanes.idxs])
    for loop in reversed(loops): self.end(loop)

  def reduce(self, reduceop: LazyOp, outer: Scope) -> None:
    """Accumulate the reduce's input over its axes, one accumulator per lane of `outer` it depends on, and record the results
    in `outer`. After a GROUP, every thread gets them, except after the last reduce, outside loops, with no row to store. Its
    siblings (reduces over the same axes with the same accumulators, neither reading the other: rules 9 and 11 merge such kernels)
    share the walk, so what they both read is computed once a trip (attention's scores, by its dk and dv kernel)."""
    kernel, number = self.kernel, self.kernel.reduceops.index(reduceop)
    grouped, looped, unrolled = ([axis for axis in kernel.axes(kind) if number in kernel.owners[axis]] for kind in REDUCE_SIDE)
    if (group := self.online.get(reduceop)) is not None: return online_reduce(self, group, outer, grouped, looped, unrolled)
    key_axes = [axis for axis in outer.lane_axes if axis in self.value_axes(reduceop)]  # an accumulator for each of their lanes
    keys = list(itertools.product(*[range(kernel.full_shape[axis]) for axis in key_axes]))
    # on a CPU the lanes of one key axis may share an accumulator, a vector (packing.py): accumulators are keyed by the other axes
    packed = None if self.threads else packed_axis(kernel, reduceop, key_axes, unrolled)  # (one of `unrolled`: partial sums, horizontal)
    acc_axes = [axis for axis in key_axes if axis != packed]
    acc_keys = list(itertools.product(*[range(kernel.full_shape[axis]) for axis in acc_axes]))
    tensor_cores, serial = bool(kernel.axes(AxisKind.TC)) and not kernel.nested_tc, kernel.axes(AxisKind.SERIAL)
    members = [reduceop] if tensor_cores or serial or self.tiles else [  # (on a CPU, those whose lanes pack alike: packing.py)
      member for member in siblings(self, reduceop, outer, key_axes) if self.threads or packed_axis(kernel, member, key_axes, unrolled) == packed]
    accs = {member: self.define_accs(member, len(acc_keys), kernel.full_shape[packed] if packed is not None else 1) for member in members}
    scope = Scope(outer.bound | {axis: self.thread_idxs[axis] for axis in grouped}, sorted(key_axes + unrolled), dict(outer.reduced))
    if serial: barriers = cast(UOp, self._stage_barriers)  # (started before the loop over the tiles)
    elif tensor_cores: barriers = start_tile_copies(self, scope.bound, looped)  # the first stages - 1 trips' tiles, before the loops
    elif self.tiles: store_tiles(self, load_tiles(self, scope.bound, looped, NumNode(0)))  # the first trip's, before the loops
    sources = reduceop.src[0] if len(members) == 1 else LazyOp(BufferOps.SINK, tuple(member.src[0] for member in members))
    self.walking.update(members)
    loops = self.walk_loops(looped, sources, scope, tuple(members))
    counted = serial + looped  # trips count on across a persistent kernel's tiles
    trip = flatten_node([scope.bound[axis] for axis in counted], [kernel.full_shape[axis] for axis in counted])
    if tensor_cores: scope.tile_stage = enter_trip(self, barriers, scope.bound, looped, trip)
    elif self.tiles:  # load the next trip's tiles (the first again after the last) now, store them after this trip's work
      scope.tile_stage = trip % 2
      upcoming = load_tiles(self, scope.bound, looped, trip + 1)
    if tensor_cores:
      (wgmma if kernel.warpgroups else mma)(self, scope, accs[reduceop], keys, key_axes)
      leave_trip(self, barriers, scope.bound, looped, trip)
    else:
      lanes = self.lanes(scope)
      if packed is not None: lanes = lanes._replace(packed=scope.lane_axes.index(packed))
      for member in members:
        if computed_by_mma(kernel, member):
          register_mma(self, member, scope, accs[member], keys, key_axes)
          continue
        steps: dict[tuple[int, ...], tuple[UOp, list[UOp]]] = {}  # (accumulator, lanes along the packed axis) of each unrolled step
        for idxs, value in zip(lanes.idxs, self.parse(member.src[0], lanes, scope)):
          at = {axis: cast(NumNode, idxs[axis]).b for axis in scope.lane_axes}
          acc = accs[member][acc_keys.index(tuple(at[axis] for axis in acc_axes))]
          steps.setdefault(tuple(at[axis] for axis in scope.lane_axes if axis != packed), (acc, []))[1].append(value)
        accumulate_steps(self, cast(ReduceOps, member.op), list(steps.values()), not (looped or grouped or self.threads), self.fresh_reads)
    if self.tiles and not tensor_cores: store_tiles(self, upcoming)  # into the other tile, which every thread read before the last barrier
    for loop in reversed(loops): self.end(loop)
    self.walking.difference_update(members)
    if kernel.warpgroups: self.uop(UOps.WARPGROUP_SYNC, None, (), "wait 0", pure=False)  # the accumulators are final
    if tensor_cores and not serial: self.uop(UOps.ASYNC_WAIT, None, pure=False)  # no copy left running (they were for trips past the last)
    for member in members:
      partials = [self.uop(UOps.LOAD, acc.dtype, (acc,), pure=False) for acc in accs[member]]
      if packed in unrolled: partials = horizontal(self, REDUCE_TO_ALU[cast(ReduceOps, member.op)], partials)
      elif packed is not None:  # each key's lane of its accumulator
        partials = [self.uop(UOps.GEP, member.dtype, (partials[acc_keys.index(tuple(key[key_axes.index(axis)] for axis in acc_axes))],),
                             key[key_axes.index(packed)]) for key in keys]
      if any(number in kernel.owners[axis] for axis in kernel.axes(AxisKind.LANE)) and not computed_by_mma(kernel, member):
        partials = [lane_reduce(self, cast(ReduceOps, member.op), value) for value in partials]
      if grouped:
        last = member is kernel.reduceops[-1] and all(other in outer.reduced for other in kernel.reduceops[:-1])
        partials = group_reduce(self, member, partials, everyone=bool(self._open_loops) or not last or kernel.stores_rows)
      outer.reduced[member] = (tuple(key_axes), dict(zip(keys, partials)))

  def define_local(self, dtype: DType, name: str, size: int) -> UOp:
    """Local memory, defined at the kernel's scope (OpenCL allows no other) wherever it is used."""
    memory = UOp(UOps.DEFINE_LOCAL, dtype, (), LocalBuffer(name, size))
    self.uops.insert(len(self.globals) + len(self._locals), memory)
    self._locals.append(memory)
    return memory

  def barrier(self) -> None: self.uop(UOps.BARRIER, None, pure=False)

  def open_if(self, condition: Node) -> UOp:
    block = self.uop(UOps.IF, None, (self.index(condition),), None, pure=False)
    self._scopes.append([])
    return block

  def define_accs(self, reduceop: LazyOp, count: int, width: int = 1) -> list[UOp]:
    """`count` accumulators for the reduce, each a vector of `width` lanes if it is over 1."""
    start = cast_python_value({ReduceOps.SUM: 0, ReduceOps.MAX: dtypes.min(reduceop.dtype)}[cast(ReduceOps, reduceop.op)], reduceop.dtype)
    dtype = reduceop.dtype.vec(width) if width > 1 else reduceop.dtype
    return [self.uop(UOps.DEFINE_ACC, dtype, (), start, pure=False) for _ in range(count)]

  def accumulate(self, op: ReduceOps, acc: UOp, value: UOp) -> None:
    current = self.uop(UOps.LOAD, acc.dtype, (acc,), pure=False)
    self.uop(UOps.STORE, None, (acc, self.alu(REDUCE_TO_ALU[op], cast(DType, acc.dtype), current, value)), pure=False)

def _neighbours(addresses: list[Address], lanes: list[int], aligned: bool) -> bool:
  """Whether these lanes' addresses are valid and neighbouring, in order (and, if `aligned`, from a multiple of their number)."""
  start = addresses[lanes[0]][0]
  if aligned and start % len(lanes): return False
  return all(addresses[lane][1].min == 1 and addresses[lane][0] - start == i for i, lane in enumerate(lanes))
