"""A reference evaluator of kernel ASTs in numpy, following the AST convention (a SINK of STOREs; each tracker has the kernel's
dims, full or 1 in each; a reduce's output is its input with 1 in the dims it reduces; sizes broadcast). The scheduler's tests
use it to check the values of fused kernels independently of the code generator."""
from __future__ import annotations
from typing import Any
import numpy as np
from tinyc import realize
from tinyc.ops import BinaryOps, BufferOps, LazyOp, ReduceOps, TernaryOps, UnaryOps
from tinyc.shape.shapetracker import ShapeTracker, index_variables
from tinyc.shape.symbolic import AndNode, DivNode, LtNode, ModNode, MulNode, NumNode, SumNode, Variable

_INDEX_OPS: dict[type, Any] = {
  Variable: lambda node, ops, grid: grid[node.expr], NumNode: lambda node, ops, grid: node.b,
  MulNode: lambda node, ops, grid: node.a.render(ops, grid) * (node.b if isinstance(node.b, int) else node.b.render(ops, grid)),
  DivNode: lambda node, ops, grid: node.a.render(ops, grid) // node.b, ModNode: lambda node, ops, grid: node.a.render(ops, grid) % node.b,
  LtNode: lambda node, ops, grid: node.a.render(ops, grid) < (node.b if isinstance(node.b, int) else node.b.render(ops, grid)),
  SumNode: lambda node, ops, grid: sum(child.render(ops, grid) for child in node.nodes),
  AndNode: lambda node, ops, grid: np.logical_and.reduce([np.asarray(child.render(ops, grid)) for child in node.nodes]),
}

def _indices(st: ShapeTracker) -> tuple[np.ndarray, np.ndarray]:
  """The buffer index and validity of every element of `st`'s shape."""
  grid = {var.expr: np.arange(size).reshape([-1 if d == axis else 1 for d in range(len(st.shape))])
          for axis, (var, size) in enumerate(zip(index_variables(st.shape), st.shape)) if isinstance(var, Variable)}
  index, valid = st.expr_idxs()
  index_values, valid_values = np.asarray(index.render(_INDEX_OPS, grid)), np.asarray(valid.render(_INDEX_OPS, grid)).astype(bool)
  return np.broadcast_to(index_values, st.shape), np.broadcast_to(valid_values, st.shape)

_compiled_compute = realize._compute

_ALU: dict[Any, Any] = {
  UnaryOps.NEG: np.negative, UnaryOps.EXP2: np.exp2, UnaryOps.LOG2: np.log2, UnaryOps.SIN: np.sin, UnaryOps.SQRT: np.sqrt,
  UnaryOps.RECIP: lambda x: np.float32(1) / x, BinaryOps.ADD: np.add, BinaryOps.SUB: np.subtract, BinaryOps.MUL: np.multiply,
  BinaryOps.DIV: np.divide, BinaryOps.MAX: np.maximum, BinaryOps.CMPLT: np.less, BinaryOps.CMPEQ: np.equal, BinaryOps.AND: np.logical_and,
  BinaryOps.OR: np.logical_or, BinaryOps.XOR: np.not_equal, BinaryOps.IDIV: np.floor_divide, BinaryOps.MOD: np.mod,
  TernaryOps.WHERE: np.where,
}

def evaluate(node: LazyOp, arrays: list[np.ndarray]) -> np.ndarray:
  """The value of `node` over the kernel's dims (size 1 where it does not vary), buffers given as flat arrays."""
  if node.op is BufferOps.CONST: return np.where(_indices(node.arg.st)[1], np.array(node.arg.val, node.arg.dtype.np), 0).astype(node.arg.dtype.np)
  if node.op is BufferOps.LOAD:
    index, valid = _indices(node.arg.st)
    data = arrays[node.arg.idx]
    return np.where(valid, data[np.where(valid, index, 0)], 0).astype(data.dtype)
  sources = [evaluate(src, arrays) for src in node.src]
  with np.errstate(all="ignore"):
    if node.op is ReduceOps.SUM: return sources[0].sum(axis=node.arg, keepdims=True, dtype=sources[0].dtype)
    if node.op is ReduceOps.MAX: return sources[0].max(axis=node.arg, keepdims=True)
    if node.op in (UnaryOps.CAST, UnaryOps.BITCAST):
      return sources[0].astype(node.arg.np) if node.op is UnaryOps.CAST else sources[0].view(node.arg.np)
    return np.asarray(_ALU[node.op](*sources)).astype(node.dtype.np)

def run(ast: LazyOp, buffers: list[Any]) -> None:
  """Compute a kernel with the evaluator: `buffers` are its outputs' then its inputs' (every read before any write, as one kernel)."""
  outputs = len(ast.src)
  arrays = [np.zeros(buffer.size, buffer.dtype.np) for buffer in buffers[:outputs]] + [buffer.numpy().reshape(-1) for buffer in buffers[outputs:]]
  results = [(store, evaluate(store.src[0], arrays)) for store in ast.src]
  for store, value in results:
    index, valid = _indices(store.arg.st)
    arrays[store.arg.idx][index[valid]] = np.broadcast_to(value, store.arg.st.shape)[valid]
  for buffer, array in zip(buffers[:outputs], arrays): buffer.copyin(array)

def compute(item: Any, shown: Any, *plan: Any) -> list[Any]:
  """A stand-in for tinyc.realize._compute: kernels are evaluated here (recorded like a program, so TinyJit replays them too). `plan`:
  the plan's programs and the item's index in it, which a kernel evaluated here neither uses nor fills."""
  if item.ast.op is not BufferOps.SINK: return _compiled_compute(item, shown, *plan)
  buffers = [realize._output_buffer(out) for out in item.outs]
  realize._run(lambda all_buffers, var_vals, shown, ast=item.ast: run(ast, all_buffers), buffers + [src.realized for src in item.inputs], {}, shown)
  return buffers
