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
from tinyc.shape.symbolic import AndNode, DivNode, LtNode, ModNode, MulNode, Node, NumNode, SumNode, Variable, simplify_given_valid
from tinyc.codegen.kernel import Kernel
from tinyc.codegen.uops import PYTHON_ALU, UOp, UOps, cast_python_value

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
    if all(s.op is UOps.CONST for s in src) and op in PYTHON_ALU and not (op in (BinaryOps.IDIV, BinaryOps.MOD) and src[-1].arg == 0):
      return self.const(PYTHON_ALU[op](*[s.arg for s in src]), dtype)
    if op is BinaryOps.ADD:
      if _is_const(src[1], 0): return src[0]
      if _is_const(src[0], 0): return src[1]
    if op is BinaryOps.MUL:
      if _is_const(src[1], 1): return src[0]
      if _is_const(src[0], 1): return src[1]
      if dtypes.is_int(dtype) and (_is_const(src[0], 0) or _is_const(src[1], 0)): return self.const(0, dtype)
    if op is TernaryOps.WHERE and src[0].op is UOps.CONST: return src[1] if src[0].arg else src[2]
    return self.uop(UOps.ALU, dtype, tuple(src), op)

  def cast(self, value: UOp, dtype: DType) -> UOp:
    if value.dtype == dtype: return value
    if value.op is UOps.CONST: return self.const(value.arg, dtype)
    return self.uop(UOps.CAST, dtype, (value,))

  def loop(self, name: str, size: int, axis: int) -> UOp:
    bounds = (self.const(0, self.index_dtype), self.const(size, self.index_dtype))
    loop = self.uop(UOps.LOOP, self.index_dtype, bounds, (name, self._worth_vectorizing(axis)), pure=False)
    self.loop_uops[name] = loop
    self._scopes.append([])
    return loop

  def _worth_vectorizing(self, axis: int) -> bool:
    """Whether LLVM should vectorize across this loop's trips: only for a long loop along which every buffer moves by 0 or
    1 elements. Otherwise it takes gathers or masked tails, and packing the upcast lanes (SLP) is the better plan."""
    kernel = self.kernel
    return kernel.full_shape[axis] >= 16 and all(st.real_strides()[axis] in (0, 1) for st, buf in zip(kernel.sts, kernel.bufs)
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
  def load(self, buf: MemBuffer | ConstBuffer, idxs: list[Node]) -> UOp:
    buf_number = self.kernel.bufs.index(buf)
    index, valid = self.kernel.sts[buf_number].expr_idxs(idxs)
    zero = self.const(0, buf.dtype)
    if valid.max == 0: return zero
    valid_uop = None if valid.min == 1 else self.index(valid)
    if valid_uop is not None: index = simplify_given_valid(index, valid)  # the load is gated: only valid lanes use the index
    if isinstance(buf, ConstBuffer):
      value = self.const(buf.val, buf.dtype)
      return value if valid_uop is None else self.alu(TernaryOps.WHERE, buf.dtype, valid_uop, value, zero)
    src = (self.globals[buf.idx], self.index(index)) + ((valid_uop,) if valid_uop is not None else ())
    return self.uop(UOps.LOAD, buf.dtype, src)

  def parse(self, node: LazyOp, lanes: list[list[Node]], reduced: list[UOp] | None) -> list[UOp]:
    """The values of `node`, one per upcast lane (each lane is a list of per-axis index expressions)."""
    if node.op in (BufferOps.LOAD, BufferOps.CONST): return [self.load(node.arg, idxs) for idxs in lanes]
    if node.op in ReduceOps:
      assert reduced is not None and len(reduced) == len(lanes), "the reduce's value is read before it was computed"
      return reduced
    srcs = [self.parse(src, lanes, reduced) for src in node.src]
    if node.op is UnaryOps.CAST: return [self.cast(value, node.arg) for value in srcs[0]]
    if node.op is UnaryOps.BITCAST: return [self.uop(UOps.BITCAST, node.arg, (value,)) for value in srcs[0]]
    return [self.alu(node.op, node.dtype, *values) for values in zip(*srcs)]

  def lanes(self, loop_idxs: list[Node], upcast_axes: list[int], fixed: dict[int, int]) -> list[list[Node]]:
    """Index lists for every combination of the upcast axes' values (axes in `fixed` hold one value instead)."""
    kernel = self.kernel
    ranges = [[fixed[axis]] if axis in fixed else list(range(kernel.full_shape[axis])) for axis in upcast_axes]
    return [loop_idxs + [NumNode(v) for v in values] for values in itertools.product(*ranges)]

  def linearize(self) -> list[UOp]:
    kernel = self.kernel
    # one global per buffer number: a buffer read through two views is still one argument
    dtype_of_buffer = {buf.idx: buf.dtype for buf in kernel.bufs if isinstance(buf, MemBuffer)}
    self.globals = {idx: self.uop(UOps.DEFINE_GLOBAL, dtype, (), (f"data{idx}", idx == 0), pure=False)
                    for idx, dtype in sorted(dtype_of_buffer.items())}
    global_idxs: list[Node] = [Variable(f"gidx{axis}", 0, size - 1) for axis, size in enumerate(kernel.full_shape[:kernel.first_reduce])]
    if self.threads:
      for axis, size in enumerate(kernel.full_shape[:kernel.first_reduce]):
        dim = kernel.first_reduce - 1 - axis
        self.loop_uops[f"gidx{axis}"] = self.uop(UOps.SPECIAL, self.index_dtype, (), (dim, f"gidx{axis}", size), pure=False)
      global_loops = []
    else: global_loops = [self.loop(f"gidx{axis}", size, axis) for axis, size in enumerate(kernel.full_shape[:kernel.first_reduce])]
    upcast_axes = list(range(kernel.shape_len - kernel.upcasted, kernel.shape_len))
    unrolled_reduce_axes = {axis: 0 for axis in upcast_axes if kernel.output_shape[axis] != kernel.full_shape[axis]}
    reduce_loop_count = kernel.shape_len - kernel.upcasted - kernel.first_reduce
    # after the reduce (and in a kernel without one) the reduce axes read index 0: the output has size 1 there
    output_lanes = self.lanes(global_idxs + [NumNode(0)] * reduce_loop_count, upcast_axes, unrolled_reduce_axes)
    reduced = self.reduce(kernel.reduceop, global_idxs, upcast_axes, unrolled_reduce_axes) if kernel.reduceop is not None else None
    values = self.parse(kernel.ast.src[0], output_lanes, reduced)
    for idxs, value in zip(output_lanes, values):
      index, valid = kernel.sts[0].expr_idxs(idxs)
      assert valid.min == 1, f"the output must be written everywhere, its validity is {valid}"
      self.uop(UOps.STORE, None, (self.globals[0], self.index(index), self.cast(value, kernel.bufs[0].dtype)), pure=False)
    for loop in reversed(global_loops): self.end(loop)
    if DEBUG >= 5:
      for uop in self.uops: print(uop)
    return self.uops

  def reduce(self, reduceop: LazyOp, global_idxs: list[Node], upcast_axes: list[int], unrolled: dict[int, int]) -> list[UOp]:
    """Accumulate the reduce's input over the reduce loops; one accumulator per output lane. Returns their final values."""
    kernel, dtype, op = self.kernel, reduceop.dtype, cast(ReduceOps, reduceop.op)
    start = cast_python_value({ReduceOps.SUM: 0, ReduceOps.MAX: dtypes.min(dtype)}[op], dtype)
    output_lane_count = prod(kernel.full_shape[axis] for axis in upcast_axes if axis not in unrolled)
    accs = [self.uop(UOps.DEFINE_ACC, dtype, (), start, pure=False) for _ in range(output_lane_count)]
    reduce_axes = range(kernel.first_reduce, kernel.shape_len - kernel.upcasted)
    reduce_idxs: list[Node] = [Variable(f"ridx{axis}", 0, kernel.full_shape[axis] - 1) for axis in reduce_axes]
    reduce_loops = [self.loop(f"ridx{axis}", kernel.full_shape[axis], axis) for axis in reduce_axes]
    lanes = self.lanes(global_idxs + reduce_idxs, upcast_axes, {})
    values = self.parse(reduceop.src[0], lanes, None)
    # lanes enumerate the upcast axes in order; the accumulator of a lane is its position among the output (non-unrolled) axes
    sizes = [kernel.full_shape[axis] for axis in upcast_axes]
    for lane, value in enumerate(values):
      digits = [(lane // prod(sizes[i + 1:])) % sizes[i] for i in range(len(sizes))]
      acc_number = 0
      for axis, digit, size in zip(upcast_axes, digits, sizes):
        if axis not in unrolled: acc_number = acc_number * size + digit
      acc = accs[acc_number]
      current = self.uop(UOps.LOAD, dtype, (acc,), pure=False)
      self.uop(UOps.STORE, None, (acc, self.alu(REDUCE_TO_ALU[op], dtype, current, value)), pure=False)
    for loop in reversed(reduce_loops): self.end(loop)
    return [self.uop(UOps.LOAD, dtype, (acc,), pure=False) for acc in accs]

def _is_const(uop: UOp, value: Any) -> bool: return uop.op is UOps.CONST and uop.arg == value
def _fold(ctx: Linearizer, op: BinaryOps, dtype: DType, values: list[UOp]) -> UOp:
  result = values[0]
  for value in values[1:]: result = ctx.alu(op, dtype, result, value)
  return result
