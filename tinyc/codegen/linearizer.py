"""Layer 3: the Linearizer turns a Kernel into a list of typed UOps (loops, loads, ALU, stores). Imports helpers, dtype, ops, shape/,
codegen/kernel, codegen/uops.

Equal pure UOps are made once (common-subexpression elimination) and constant operands are folded as UOps are built.
A UOp made inside a loop is only reused inside that loop, so every renderer can scope variables by loop.
"""
from __future__ import annotations
import itertools
from typing import Any, Callable, cast
from tinyc.dtype import DType, dtypes
from tinyc.helpers import DEBUG, prod
from tinyc.ops import BinaryOps, BufferOps, ConstBuffer, LazyOp, MemBuffer, Op, ReduceOps, TernaryOps, UnaryOps
from tinyc.shape.shapetracker import flatten_node, unflatten_node
from tinyc.shape.symbolic import AndNode, DivNode, LtNode, ModNode, MulNode, Node, NumNode, SumNode, Variable, simplify_given_valid
from tinyc.codegen.kernel import Kernel
from tinyc.codegen.uops import PYTHON_ALU, VECTOR_WIDTH, GlobalBuffer, Loop, ThreadIndex, ThreadKind, UOp, UOps, cast_python_value
from tinyc.codegen.tiles import define_tile, load_tiles, read_tile, store_tiles

REDUCE_TO_ALU = {ReduceOps.SUM: BinaryOps.ADD, ReduceOps.MAX: BinaryOps.MAX}

class Linearizer:
  """`threads`: the global axes become thread ids (SPECIAL, for GPUs; the last axis is dimension 0 so neighbouring threads
  touch neighbouring memory), else loops (CPUs)."""
  def __init__(self, kernel: Kernel, threads: bool = False) -> None:
    self.kernel, self.threads = kernel, threads
    self.uops: list[UOp] = []
    self._made: dict[tuple, UOp] = {}
    self._scopes: list[list[tuple]] = [[]]  # keys made inside each open loop, forgotten when it ends
    self.loop_uops: dict[str, UOp] = {}
    self.lane_sizes: list[int] = []
    self.index_dtype = dtypes.int32 if max(st.real_size() for st in kernel.sts) < 2**31 else dtypes.int64

  # ---- making UOps ----
  def uop(self, op: UOps, dtype: DType | None, src: tuple[UOp, ...] = (), arg: Any = None, pure: bool = True) -> UOp:
    key = (op, dtype, src, arg)
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
    if op is BinaryOps.ADD:
      if _is_const(src[1], 0): return src[0]
      if _is_const(src[0], 0): return src[1]
    if op is BinaryOps.MUL:
      if _is_const(src[1], 1): return src[0]
      if _is_const(src[0], 1): return src[1]
      if dtypes.is_int(dtype) and (_is_const(src[0], 0) or _is_const(src[1], 0)): return self.const(0, dtype)
    if op is TernaryOps.WHERE and src[0].op is UOps.CONST: return src[1] if src[0].arg else src[2]
    if op in (BinaryOps.IDIV, BinaryOps.MOD) and not dtypes.is_float(dtype) and _is_const(src[1], 0): return self.const(0, dtype)  # see uops.py
    return self.uop(UOps.ALU, dtype, tuple(src), op)

  def cast(self, value: UOp, dtype: DType) -> UOp:
    if value.dtype == dtype: return value
    if value.op is UOps.CONST: return self.const(value.arg, dtype)
    return self.uop(UOps.CAST, dtype, (value,))

  def loop(self, name: str, size: int, axis: int | None, outermost_global: bool = False) -> UOp:
    bounds = (self.const(0, self.index_dtype), self.const(size, self.index_dtype))
    loop = self.uop(UOps.LOOP, self.index_dtype, bounds, Loop(name, self._worth_vectorizing(axis), outermost_global), pure=False)
    self.loop_uops[name] = loop
    self._scopes.append([])
    return loop

  def _worth_vectorizing(self, axis: int | None) -> bool:
    """Whether LLVM should vectorize across this loop's trips: only for a long loop along which every buffer moves by 0 or
    1 elements. Otherwise it takes gathers or masked tails, and packing the upcast lanes (SLP) is the better plan."""
    kernel = self.kernel
    return axis is not None and kernel.full_shape[axis] >= 16 and all(st.real_strides()[axis] in (0, 1) for st, buf in zip(kernel.sts, kernel.bufs)
                                                 if isinstance(buf, MemBuffer))

  def end(self, loop: UOp) -> None:
    self.uop(UOps.END, None, (loop,), pure=False)
    for key in self._scopes.pop(): self._made.pop(key, None)

  # ---- index math: symbolic Nodes -> UOps ----
  def index(self, node: Node) -> UOp: return node.render(self._index_ops, self)

  _index_ops: dict[type, Callable[[Any, Any, Linearizer], UOp]] = {
    Variable: lambda node, ops, ctx: ctx.loop_uops[node.expr],
    NumNode: lambda node, ops, ctx: ctx.const(node.b, ctx.index_dtype),
    MulNode: lambda node, ops, ctx: ctx.alu(BinaryOps.MUL, ctx.index_dtype, node.a.render(ops, ctx), ctx.const(node.b, ctx.index_dtype)),
    DivNode: lambda node, ops, ctx: ctx.alu(BinaryOps.IDIV, ctx.index_dtype, node.a.render(ops, ctx), ctx.const(node.b, ctx.index_dtype)),
    ModNode: lambda node, ops, ctx: ctx.alu(BinaryOps.MOD, ctx.index_dtype, node.a.render(ops, ctx), ctx.const(node.b, ctx.index_dtype)),
    LtNode: lambda node, ops, ctx: ctx.alu(BinaryOps.CMPLT, dtypes.bool, node.a.render(ops, ctx), ctx.const(node.b, ctx.index_dtype)),
    SumNode: lambda node, ops, ctx: _fold(ctx, BinaryOps.ADD, ctx.index_dtype, [n.render(ops, ctx) for n in node.nodes]),
    AndNode: lambda node, ops, ctx: _fold(ctx, BinaryOps.AND, dtypes.bool, [n.render(ops, ctx) for n in node.nodes]),
  }

  # ---- the AST -> UOps ----
  def load(self, buf: MemBuffer | ConstBuffer, idxs: list[Node], gate: Node = NumNode(1)) -> UOp:
    """One element of `buf` (0 where the view is masked or `gate` is 0)."""
    buf_number = self.kernel.bufs.index(buf)
    index, valid = self.kernel.sts[buf_number].expr_idxs(idxs)
    valid = Node.ands([valid, gate])
    zero = self.const(0, buf.dtype)
    if valid.max == 0: return zero
    valid_uop = None if valid.min == 1 else self.index(valid)
    if valid_uop is not None: index = simplify_given_valid(index, valid)  # the load is gated: only valid lanes use the index
    if isinstance(buf, ConstBuffer):
      value = self.const(buf.val, buf.dtype)
      return value if valid_uop is None else self.alu(TernaryOps.WHERE, buf.dtype, valid_uop, value, zero)
    src = (self.globals[buf.idx], self.index(index)) + ((valid_uop,) if valid_uop is not None else ())
    return self.uop(UOps.LOAD, buf.dtype, src)

  def parse(self, node: LazyOp, lanes: list[list[Node]], reduced: dict[LazyOp, list[UOp]]) -> list[UOp]:
    """The values of `node`, one per upcast lane (each lane is a list of per-axis index expressions)."""
    if node.op in (BufferOps.LOAD, BufferOps.CONST):
      if (tile := self.tiles.get(node.arg)) is not None: return read_tile(self, tile, node.arg.dtype, lanes)
      return self.read(node.arg, lanes, self.lane_sizes)
    if node.op in ReduceOps:
      assert node in reduced, "the reduce's value is read before it was computed"
      return [reduced[node][acc] for acc in self.accumulator_numbers()]
    srcs = [self.parse(src, lanes, reduced) for src in node.src]
    if node.op is UnaryOps.CAST: return [self.cast(value, node.arg) for value in srcs[0]]
    if node.op is UnaryOps.BITCAST: return [self.uop(UOps.BITCAST, node.arg, (value,)) for value in srcs[0]]
    return [self.alu(node.op, node.dtype, *values) for values in zip(*srcs)]

  def lanes(self, loop_idxs: list[Node], upcast_axes: list[int], fixed: dict[int, int]) -> list[list[Node]]:
    """Index lists for every combination of the upcast axes' values (axes in `fixed` hold one value instead)."""
    kernel = self.kernel
    ranges = [[fixed[axis]] if axis in fixed else list(range(kernel.full_shape[axis])) for axis in upcast_axes]
    self.lane_sizes = [len(r) for r in ranges]  # of the lanes being parsed: vector_groups and accumulator_numbers read them
    return [loop_idxs + [NumNode(v) for v in values] for values in itertools.product(*ranges)]

  def accumulator_numbers(self) -> list[int]:
    """For each lane being parsed, its reduce accumulator: its position among the output (not unrolled) upcast axes."""
    kernel, sizes = self.kernel, self.lane_sizes
    output_axes = [position for position, axis in enumerate(kernel.upcast_axes) if kernel.reduced_shape[axis] == kernel.full_shape[axis]]
    numbers = []
    for lane in range(prod(sizes)):
      digits = [(lane // prod(sizes[i + 1:])) % sizes[i] for i in range(len(sizes))]
      numbers.append(sum(digits[position] * prod(sizes[p] for p in output_axes if p > position) for position in output_axes))
    return numbers

  def read(self, buf: MemBuffer | ConstBuffer, lanes: list[list[Node]], sizes: list[int]) -> list[UOp]:
    """The values of a buffer at `lanes` (laid out as `sizes`): vector loads where lanes are neighbours, else one load each."""
    if not isinstance(buf, MemBuffer): return [self.load(buf, idxs) for idxs in lanes]
    st = self.kernel.sts[self.kernel.bufs.index(buf)]
    vectors = self.vector_loads(self.globals[buf.idx], buf.dtype, sizes, lambda lane: st.expr_idxs(lanes[lane]))
    return [value if value is not None else self.load(buf, idxs) for value, idxs in zip(vectors, lanes)]

  def vector_loads(self, memory: UOp, dtype: DType, sizes: list[int], index_of: Callable[[int], tuple[Node, Node]]) -> list[UOp | None]:
    """Each lane's value where a 16-byte load of `memory` reads it (see vector_groups), else None."""
    values: list[UOp | None] = [None] * prod(sizes)
    for group, index in self.vector_groups(dtype, sizes, index_of):
      vector = self.uop(UOps.LOAD, dtype.vec(len(group)), (memory, self.index(index)))
      for lane_number, lane in enumerate(group): values[lane] = self.uop(UOps.GEP, dtype, (vector,), lane_number)
    return values

  def store_lanes(self, memory: UOp, dtype: DType, sizes: list[int], values: list[UOp], index_of: Callable[[int], tuple[Node, Node]]) -> None:
    """Store each lane's value (cast to `dtype`) where `index_of` puts it: 16-byte stores where vector_groups finds them, the
    rest one by one, each only where its validity holds."""
    stored: set[int] = set()
    for group, start in self.vector_groups(dtype, sizes, index_of):
      vector = self.uop(UOps.VECTORIZE, dtype.vec(len(group)), tuple(self.cast(values[lane], dtype) for lane in group))
      self.uop(UOps.STORE, None, (memory, self.index(start), vector), pure=False)
      stored.update(group)
    for lane, value in enumerate(values):
      if lane in stored: continue
      index, valid = index_of(lane)
      gate: tuple[UOp, ...] = ()
      if valid.max == 0: continue  # e.g. a lane that is all PADTO padding
      if valid.min == 0: gate, index = (self.index(valid),), simplify_given_valid(index, valid)
      self.uop(UOps.STORE, None, (memory, self.index(index), self.cast(value, dtype)) + gate, pure=False)

  def vector_groups(self, dtype: DType, sizes: list[int], index_of: Callable[[int], tuple[Node, Node]]) -> list[tuple[list[int], Node]]:
    """Groups of VECTOR_WIDTH lanes (laid out as `sizes`) that read (or write) neighbouring elements from an aligned index, with
    that index (`index_of` gives a lane's index and validity): each group becomes one 16-byte load or store. Only on GPUs, for
    4-byte types, unmasked, along one upcast axis."""
    lanes = prod(sizes)
    width = VECTOR_WIDTH
    if not self.threads or dtype not in (dtypes.float32, dtypes.int32, dtypes.uint32) or lanes < width: return []
    for position, size in enumerate(sizes):
      if size % width: continue
      stride = prod(sizes[position + 1:])
      groups = []
      for first in (lane for lane in range(lanes) if (lane // stride) % width == 0):
        members = [first + i * stride for i in range(width)]
        indexes = [index_of(member) for member in members]
        if any(valid.min != 1 for _, valid in indexes): break
        start = indexes[0][0]
        if not _is_number(start % width, 0) or not all(_is_number(index - start, i) for i, (index, _) in enumerate(indexes)): break
        groups.append((members, start))
      else: return groups
    return []

  def linearize(self) -> list[UOp]:
    kernel = self.kernel
    # one global per buffer number: a buffer read through two views is still one argument
    dtype_of_buffer = {buf.idx: buf.dtype for buf in kernel.bufs if isinstance(buf, MemBuffer)}
    self.globals = {idx: self.uop(UOps.DEFINE_GLOBAL, dtype, (), GlobalBuffer(f"data{idx}", idx, idx == 0), pure=False)
                    for idx, dtype in sorted(dtype_of_buffer.items())}
    self.tiles = {kernel.bufs[number]: define_tile(self, number) for number in kernel.staged}
    outer_idxs, group_idxs, global_loops = self.outer_indices()
    upcast_axes = list(kernel.upcast_axes)
    reduced: dict[LazyOp, list[UOp]] = {}
    for reduceop in kernel.reduceops:  # in a row kernel every thread of the group gets each result: the store needs them all
      everyone = kernel.row_kernel or reduceop is not kernel.reduceop
      reduced[reduceop] = self.reduce(reduceop, outer_idxs, group_idxs, upcast_axes, reduced, everyone)
    if kernel.row_kernel:  # the store walks the reduce axes once more, each thread its share
      store_loops, loop_idxs = self.reduce_loops()
      output_lanes = self.lanes(outer_idxs + group_idxs + loop_idxs, upcast_axes, {})
    else:  # after the reduce (and in a kernel without one) the group and reduce axes read index 0: the output has size 1 there
      store_loops = []
      unrolled_reduce_axes = {axis: 0 for axis in upcast_axes if kernel.reduced_shape[axis] != kernel.full_shape[axis]}
      output_lanes = self.lanes(outer_idxs + [NumNode(0)] * (kernel.shape_len - kernel.upcasted - kernel.first_reduce), upcast_axes,
                                unrolled_reduce_axes)
    values = self.parse(kernel.ast.src[0], output_lanes, reduced)
    output = cast(MemBuffer, kernel.bufs[0])
    self.store_lanes(self.globals[0], output.dtype, self.lane_sizes, values, lambda lane: kernel.sts[0].expr_idxs(output_lanes[lane]))
    for block in reversed(global_loops + self.open_ifs + store_loops): self.end(block)
    if DEBUG >= 5:
      for uop in self.uops: print(uop)
    return self.uops

  def outer_indices(self) -> tuple[list[Node], list[Node], list[UOp]]:
    """Index variables of the global and local axes, of the group axes, and the loops opened for them (on a CPU).
    On a GPU with local or group axes, global axes are work-group ids and the others thread ids inside the work-group;
    without them, global axes are global thread ids and the runtime picks the work-group size. The last axis of each kind is
    launch dimension 0, so neighbouring threads touch neighbouring memory."""
    kernel = self.kernel
    self.open_ifs: list[UOp] = []
    idxs: list[Node] = []
    explicit_locals = kernel.local_dims + kernel.group_for_reduce > 0
    for axis, size in enumerate(kernel.full_shape[:kernel.first_reduce_loop]):
      is_local = axis >= kernel.global_dims
      name = f"{'l' if is_local else 'g'}idx{axis}"
      idxs.append(Variable(name, 0, size - 1))
      if not self.threads: continue
      dim = kernel.first_reduce_loop - 1 - axis if is_local else kernel.global_dims - 1 - axis
      kind = ThreadKind.LOCAL if is_local else (ThreadKind.GROUP if explicit_locals else ThreadKind.GLOBAL)
      self.loop_uops[name] = self.uop(UOps.SPECIAL, self.index_dtype, (), ThreadIndex(dim, name, size, kind), pure=False)
    assert self.threads or not explicit_locals, "local and group axes need a GPU"
    loops = [] if self.threads else [self.loop(f"gidx{axis}", size, axis, outermost_global=axis == 0)
                                     for axis, size in enumerate(kernel.full_shape[:kernel.first_reduce])]
    return idxs[:kernel.first_reduce], idxs[kernel.first_reduce:], loops

  def reduce_loops(self) -> tuple[list[UOp], list[Node]]:
    """Open a loop for each reduce axis (not the group or upcast ones); returns the loops and their index variables."""
    kernel, reduce_axes = self.kernel, range(self.kernel.first_reduce_loop, self.kernel.shape_len - self.kernel.upcasted)
    loops = [self.loop(f"ridx{axis}", kernel.full_shape[axis], axis) for axis in reduce_axes]
    return loops, [Variable(f"ridx{axis}", 0, kernel.full_shape[axis] - 1) for axis in reduce_axes]

  def reduce(self, reduceop: LazyOp, outer_idxs: list[Node], group_idxs: list[Node], upcast_axes: list[int],
             reduced: dict[LazyOp, list[UOp]], everyone: bool) -> list[UOp]:
    """Accumulate the reduce's input over the reduce loops; one accumulator per output lane. Returns their final values (in every
    thread of the group with `everyone`, else only in those with group id 0)."""
    dtype, op = reduceop.dtype, cast(ReduceOps, reduceop.op)
    accs = self.define_accs(reduceop, self.kernel.output_lanes)
    sizes = tuple(self.kernel.full_shape[self.kernel.first_reduce_loop:self.kernel.shape_len - self.kernel.upcasted])
    if self.tiles:  # the first trip's tiles (staged inputs), before the loops
      store_tiles(self, load_tiles(self, outer_idxs, [NumNode(0)] * len(sizes)), NumNode(0))
      self.uop(UOps.BARRIER, None, (), None, pure=False)
    reduce_loops, reduce_idxs = self.reduce_loops()
    if self.tiles:  # load the next trip's tiles (the first again after the last) now, store them after this trip's work
      trip = flatten_node(reduce_idxs, list(sizes))
      self.tile_parity = trip % 2
      upcoming = load_tiles(self, outer_idxs, unflatten_node((trip + 1) % prod(sizes), sizes))
    values = self.parse(reduceop.src[0], self.lanes(outer_idxs + group_idxs + reduce_idxs, upcast_axes, {}), reduced)
    for acc_number, value in zip(self.accumulator_numbers(), values): self.accumulate(op, accs[acc_number], value)
    if self.tiles:  # into the other tile, which every thread finished reading before the last barrier
      store_tiles(self, upcoming, (trip + 1) % 2)
      self.uop(UOps.BARRIER, None, (), None, pure=False)
    for loop in reversed(reduce_loops): self.end(loop)
    partials = [self.uop(UOps.LOAD, dtype, (acc,), pure=False) for acc in accs]
    return self.group_reduce(reduceop, partials, group_idxs, everyone) if group_idxs else partials

  def group_reduce(self, reduceop: LazyOp, partials: list[UOp], group_idxs: list[Node], everyone: bool) -> list[UOp]:
    """Finish a reduce split across the work-group: every thread writes its partial results to local memory; then a tree (for a
    power-of-two group: half the threads add the other half's partials, barrier, and again) or, for other sizes, the threads
    with group id 0 alone reduce their group's partials. The rest of the kernel runs only in the threads with group id 0, or,
    with `everyone`, every thread reads the result (each walks the partials itself for other sizes)."""
    kernel, lanes, op = self.kernel, len(partials), cast(ReduceOps, reduceop.op)
    local_axes = range(kernel.global_dims, kernel.first_reduce)
    local_sizes, group_sizes = [kernel.full_shape[axis] for axis in local_axes], list(kernel.full_shape[kernel.first_reduce:kernel.first_reduce_loop])
    local_idxs: list[Node] = [Variable(f"lidx{axis}", 0, kernel.full_shape[axis] - 1) for axis in local_axes]
    group_count, member = prod(group_sizes), flatten_node(group_idxs, group_sizes)
    first_slot = flatten_node(local_idxs, local_sizes) * group_count  # this thread's group starts here
    name = "partials" + str(sum(uop.op is UOps.DEFINE_LOCAL for uop in self.uops) or "")  # one buffer a reduce: no barrier between
    memory = self.uop(UOps.DEFINE_LOCAL, reduceop.dtype, (), (name, kernel.local_size * lanes), pure=False)
    def slot(index: Node, lane: int) -> UOp: return self.index(index * lanes + lane)
    def read(index: Node, lane: int) -> UOp:  # not pure: a value read before a barrier is stale after it
      return self.uop(UOps.LOAD, reduceop.dtype, (memory, slot(index, lane)), pure=False)
    for lane, partial in enumerate(partials): self.uop(UOps.STORE, None, (memory, slot(first_slot + member, lane), partial), pure=False)
    self.uop(UOps.BARRIER, None, (), None, pure=False)
    tree = group_count & (group_count - 1) == 0
    half = group_count // 2 if tree else 0
    while half >= 1:  # a few steps of log2(group) instead of one thread walking all partials
      step = self.open_if(member < half)
      for lane in range(lanes):
        added = self.alu(REDUCE_TO_ALU[op], reduceop.dtype, read(first_slot + member, lane), read(first_slot + member + half, lane))
        self.uop(UOps.STORE, None, (memory, slot(first_slot + member, lane), added), pure=False)
      self.end(step)
      self.uop(UOps.BARRIER, None, (), None, pure=False)
      half //= 2
    if not everyone: self.open_ifs.append(self.open_if(member < 1))
    if tree: return [read(first_slot, lane) for lane in range(lanes)]
    accs = self.define_accs(reduceop, lanes)
    loop = self.loop("group_member", group_count, None)
    for lane, acc in enumerate(accs): self.accumulate(op, acc, read(first_slot + Variable("group_member", 0, group_count - 1), lane))
    self.end(loop)
    return [self.uop(UOps.LOAD, reduceop.dtype, (acc,), pure=False) for acc in accs]

  def open_if(self, condition: Node) -> UOp:
    block = self.uop(UOps.IF, None, (self.index(condition),), None, pure=False)
    self._scopes.append([])
    return block

  def define_accs(self, reduceop: LazyOp, count: int) -> list[UOp]:
    start = cast_python_value({ReduceOps.SUM: 0, ReduceOps.MAX: dtypes.min(reduceop.dtype)}[cast(ReduceOps, reduceop.op)], reduceop.dtype)
    return [self.uop(UOps.DEFINE_ACC, reduceop.dtype, (), start, pure=False) for _ in range(count)]

  def accumulate(self, op: ReduceOps, acc: UOp, value: UOp) -> None:
    current = self.uop(UOps.LOAD, acc.dtype, (acc,), pure=False)
    self.uop(UOps.STORE, None, (acc, self.alu(REDUCE_TO_ALU[op], cast(DType, acc.dtype), current, value)), pure=False)

def _is_number(node: Node, value: int) -> bool: return isinstance(node, NumNode) and node.b == value
def _is_const(uop: UOp, value: Any) -> bool: return uop.op is UOps.CONST and uop.arg == value
def _fold(ctx: Linearizer, op: BinaryOps, dtype: DType, values: list[UOp]) -> UOp:
  result = values[0]
  for value in values[1:]: result = ctx.alu(op, dtype, result, value)
  return result
