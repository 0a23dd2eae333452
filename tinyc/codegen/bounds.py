"""Layer 3: reduce loops that skip the trips a mask of index math leaves nothing to add. Imports dtype, ops, shape/, codegen/uops; the
Linearizer is passed in. Where a masked constant (a causal mask: `col - row < 1`, tril's view of a padded line) makes a reduce's input
the reduce's identity (a max's -inf, a sum's 0: exp2(-inf) = 0, 0 times anything), the reduce's loop starts and ends where the mask's
clauses linear in the loop's index allow: a causal row of attention walks the keys up to its own, a key's gradient the queries from it
on. Values this cannot see (a nested reduce, a load) are taken to be finite, so a masked 0 times them is 0.
"""
from __future__ import annotations
import math
from typing import TYPE_CHECKING, Any, Iterable
from tinyc.dtype import dtypes
from tinyc.ops import BinaryOps, BufferOps, ConstBuffer, LazyOp, ReduceOps, TernaryOps, UnaryOps
from tinyc.shape.symbolic import AndNode, LtNode, MulNode, Node, NumNode, SumNode, Variable
from tinyc.codegen.uops import PYTHON_ALU, UOp, UOps, cast_python_value
from tinyc.codegen.axes import AxisKind
if TYPE_CHECKING:
  from tinyc.codegen.linearizer import Linearizer, Scope

def identity_masks(lin: Linearizer, reduces: Iterable[LazyOp]) -> list[ConstBuffer]:
  """The masked constants that, all masked at once where they share one mask (one read by the max, one by the sums), make every one
  of `reduces`' inputs its identity."""
  reduces = list(reduces)
  if not all(dtypes.is_float(reduce.dtype) for reduce in reduces): return []
  valids: dict[ConstBuffer, Node] = {}
  def valid(buf: ConstBuffer) -> Node:
    if buf not in valids: valids[buf] = lin.kernel.sts[lin.buffer_numbers[buf]].expr_idxs()[1]
    return valids[buf]
  def masked(buf: ConstBuffer) -> bool: return valid(buf).min == 0
  sharing: dict[Node, set[ConstBuffer]] = {}
  for node in (node for reduce in reduces for node in reduce.src[0].walk() if node.op is BufferOps.CONST and masked(node.arg)):
    sharing.setdefault(valid(node.arg), set()).add(node.arg)
  identity: dict[Any, float] = {ReduceOps.SUM: 0.0, ReduceOps.MAX: -math.inf}
  return [buf for bufs in sharing.values() if all(_value(reduce.src[0], bufs, masked) == identity[reduce.op] for reduce in reduces)
          for buf in bufs]

def _value(node: LazyOp, zeroed: set[ConstBuffer], masked: Any) -> Any:
  """`node`'s value where `zeroed` read 0 (their mask), or None where that depends on what else it reads (taken to be finite)."""
  if node.op is BufferOps.CONST:
    if node.arg in zeroed: return cast_python_value(0, node.arg.dtype)
    return None if masked(node.arg) or isinstance(node.arg.val, Node) else node.arg.val
  if node.op is BufferOps.LOAD or node.op in ReduceOps: return None
  if node.op is TernaryOps.WHERE:
    condition = _value(node.src[0], zeroed, masked)
    return None if condition is None else _value(node.src[1 if condition else 2], zeroed, masked)
  values = [_value(src, zeroed, masked) for src in node.src]
  if None not in values:
    if node.op is UnaryOps.CAST: return cast_python_value(values[0], node.arg)
    try: return PYTHON_ALU[node.op](*values) if node.op in PYTHON_ALU else None
    except (ArithmeticError, ValueError): return None  # (exp2 of a large number)
  known = [value for value in values if value is not None]
  if node.op is BinaryOps.MUL and known == [0]: return known[0]  # 0 times a finite value
  if node.op is UnaryOps.CAST or node.op is BinaryOps.MAX or not known or not math.isinf(known[0]): return None
  if node.op is BinaryOps.ADD: return known[0]  # an infinity plus a finite value
  if node.op is BinaryOps.SUB: return known[0] if values[0] is not None else -known[0]
  return None

def loop_range(lin: Linearizer, scope: Scope, axis: int, index: Variable, later: list[int], masks: list[ConstBuffer]) -> tuple[UOp, UOp] | None:
  """The start and end of the loop of `axis` (index `index`, the loops of `later` inside it) that leave out only trips where some
  mask of `masks` is 0 in every lane; None where its clauses bound nothing."""
  size = lin.kernel.full_shape[axis]
  inner = {a: Variable(f"inner{a}", 0, lin.kernel.full_shape[a] - 1) for a in later}
  # a work-group's threads share one range: each trip they read one key's row together (one broadcast load a warp), which threads
  # walking ranges of their own (a key's gradient from its own row on) would read 32 rows apart (H200: 2x slower, not faster)
  shared = {node for a in lin.kernel.axes(AxisKind.LOCAL, AxisKind.GROUP) if isinstance(node := lin.thread_idxs[a], Variable)}
  if lin.kernel.axes(AxisKind.WARP): shared.add(lin.lane)  # and a warp's lanes, which run its mma together
  probe = type(scope)(scope.bound | {axis: index} | inner, scope.lane_axes, scope.reduced)
  lanes = []  # each lane's starts and ends, one a clause that bounds anything: the lane runs from the latest start to the earliest end
  for idxs in lin.lanes(probe).idxs:
    clauses = []
    for mask in masks:
      valid = lin.kernel.sts[lin.buffer_numbers[mask]].expr_idxs(idxs)[1]
      clauses += [bound for clause in (valid.nodes if isinstance(valid, AndNode) else [valid])
                  if (bound := _clause_bound(clause, index, set(inner.values()), shared)) is not None]
    lanes.append(([node for is_start, node in clauses if is_start and node.max > 0],
                  [node for is_start, node in clauses if not is_start and node.min < size]))
  # a trip runs where any lane may be valid: from the earliest start of the lanes to the latest end
  zero, full = lin.const(0, lin.index_dtype), lin.const(size, lin.index_dtype)
  starts, ends = [s for s, _ in lanes], [e for _, e in lanes]
  start, end = _fold(lin, starts, True) if all(starts) else zero, _fold(lin, ends, False) if all(ends) else full
  if any(node.min < 0 for nodes in starts for node in nodes): start = lin.alu(BinaryOps.MAX, lin.index_dtype, start, zero)
  if any(node.max > size for nodes in ends for node in nodes): end = _smaller(lin, end, full)
  return None if start.op is UOps.CONST and end.op is UOps.CONST else (start, end)

def _clause_bound(clause: Node, index: Variable, inner: set[Variable], shared: set[Variable]) -> tuple[bool, Node] | None:
  """(True, start) or (False, end) of `index` where `c index + rest < b` holds for some value of the `shared` thread ids, for a clause
  linear in `index` with `rest` free of `inner`'s loops; None otherwise."""
  if not isinstance(clause, LtNode) or not isinstance(clause.b, int): return None
  coefficient, rest = 0, []
  for term in clause.a.nodes if isinstance(clause.a, SumNode) else [clause.a]:
    if term == index: coefficient += 1
    elif isinstance(term, MulNode) and term.a == index and isinstance(term.b, int): coefficient += term.b
    elif index in term.vars(): return None
    else: rest.append(NumNode(term.min) if term.vars() & shared else term)  # the least rest: the earliest start, the latest end
  others = Node.sum(rest)
  if coefficient == 0 or others.vars() & inner: return None
  if coefficient > 0: return False, (-others + (clause.b + coefficient - 1)) // coefficient  # index < (b - rest) / c, rounded up
  return True, (others - clause.b) // -coefficient + 1  # index > (rest - b) / -c

def _fold(lin: Linearizer, lanes: list[list[Node]], start: bool) -> UOp:
  """The earliest start (or latest end) over the lanes of each lane's latest start (or earliest end)."""
  def one(nodes: tuple[Node, ...]) -> UOp:
    uops = [lin.index(node) for node in dict.fromkeys(nodes)]
    value = uops[0]
    for uop in uops[1:]: value = lin.alu(BinaryOps.MAX, lin.index_dtype, value, uop) if start else _smaller(lin, value, uop)
    return value
  values = [one(nodes) for nodes in dict.fromkeys(tuple(nodes) for nodes in lanes)]
  value = values[0]
  for uop in values[1:]: value = _smaller(lin, value, uop) if start else lin.alu(BinaryOps.MAX, lin.index_dtype, value, uop)
  return value

def _smaller(lin: Linearizer, a: UOp, b: UOp) -> UOp:
  return lin.alu(TernaryOps.WHERE, lin.index_dtype, lin.alu(BinaryOps.CMPLT, dtypes.bool, a, b), a, b)
