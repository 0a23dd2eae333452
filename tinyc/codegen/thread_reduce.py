"""Layer 3: a reduce split across threads, finished: through local memory (GROUP: the partial results meet after a barrier) or by
shuffles between a warp's lanes (LANES). Imports dtype, helpers, ops, shape/, codegen/axes, codegen/uops; the Linearizer is passed in.
"""
from __future__ import annotations
from typing import TYPE_CHECKING, cast
from tinyc.dtype import DType
from tinyc.helpers import prod
from tinyc.ops import BinaryOps, LazyOp, ReduceOps
from tinyc.shape.shapetracker import flatten_node
from tinyc.shape.symbolic import Node, Variable
from tinyc.codegen.axes import AxisKind, partials_dtype
from tinyc.codegen.uops import UOp, UOps
if TYPE_CHECKING:
  from tinyc.codegen.linearizer import Linearizer

REDUCE_TO_ALU = {ReduceOps.SUM: BinaryOps.ADD, ReduceOps.MAX: BinaryOps.MAX}

def lane_reduce(lin: Linearizer, op: ReduceOps, partial: UOp) -> UOp:
  """Finish a reduce whose own axis LANES split: each lane combines its partial result with its neighbours' by shuffles, in
  log2(lanes) exchanges of halves (a butterfly), after which every lane holds the whole."""
  lanes, dtype = lin.kernel.lane_count, cast(DType, partial.dtype)
  for offset in [lanes >> step for step in range(1, lanes.bit_length())]:
    partial = lin.alu(REDUCE_TO_ALU[op], dtype, partial, lin.uop(UOps.SHUFFLE, dtype, (partial,), (offset, lanes)))
  return partial

def group_reduce(lin: Linearizer, reduceop: LazyOp, partials: list[UOp], everyone: bool) -> list[UOp]:
  """Finish a reduce split across the work-group: the threads' partial results meet in local memory, where a tree adds them up
  (for a power-of-two group: half the threads add the other half's, barrier, and again) or each reading thread walks them all.
  Then every thread reads the results (`everyone`), or only those with group id 0 go on."""
  kernel, lanes, op = lin.kernel, len(partials), cast(ReduceOps, reduceop.op)
  local_axes, member = kernel.axes(AxisKind.LOCAL), lin.group_member()
  group_count = prod(kernel.full_shape[axis] for axis in kernel.axes(AxisKind.GROUP))
  # a slot of partials for each thread but the group's: its LOCAL ids and its lane (LANES: each lane holds its own features' sums)
  first_slot = flatten_node([lin.thread_idxs[axis] for axis in local_axes] + [lin.lane_index],
                            [kernel.full_shape[axis] for axis in local_axes] + [kernel.lane_count]) * group_count
  if (memory := lin._partials.get(reduceop)) is None:  # one buffer a reduce, however often it is computed: no barrier between reduces
    name = "partials" + str(len(lin._locals) or "")
    memory = lin._partials[reduceop] = lin.define_local(partials_dtype(reduceop.dtype), name, kernel.local_size * kernel.partial_lanes(reduceop))
  def read(index: Node, lane: int) -> UOp:  # not pure: a value read before a barrier is stale after it
    loaded = lin.uop(UOps.LOAD, partials_dtype(reduceop.dtype), (memory, lin.index(index * lanes + lane)), pure=False)
    return lin.cast(loaded, reduceop.dtype)
  def write(index: Node, lane: int, value: UOp) -> None:
    lin.uop(UOps.STORE, None, (memory, lin.index(index * lanes + lane), lin.cast(value, partials_dtype(reduceop.dtype))), pure=False)
  mine = first_slot + member
  for lane, partial in enumerate(partials): write(mine, lane, partial)
  lin.barrier()
  tree = group_count & (group_count - 1) == 0
  for half in [group_count >> step for step in range(1, group_count.bit_length())] if tree else []:  # log2(group) steps, not one walk
    step = lin.open_if(member < half)
    for lane in range(lanes):
      write(mine, lane, lin.alu(REDUCE_TO_ALU[op], reduceop.dtype, read(mine, lane), read(mine + half, lane)))
    lin.end(step)
    lin.barrier()
  if not everyone: lin.open_ifs.append(lin.open_if(member < 1))
  if tree: results = [read(first_slot, lane) for lane in range(lanes)]
  else:
    accs = lin.define_accs(reduceop, lanes)
    loop = lin.loop("group_member", group_count, None)
    for lane, acc in enumerate(accs): lin.accumulate(op, acc, read(first_slot + Variable("group_member", 0, group_count - 1), lane))
    lin.end(loop)
    results = [lin.uop(UOps.LOAD, reduceop.dtype, (acc,), pure=False) for acc in accs]
  if lin._open_loops: lin.barrier()  # the next trip of the loop around writes the partials again
  return results
