"""Layer 3: reduces that run in one loop. Imports dtype, ops, shape/, codegen/uops, codegen/axes; the Kernel and the
Linearizer are passed in. Softmax's reduces in one pass (online softmax): a row max and the sums that read it as exp((y - max) c) run in
one loop, a running max, and each sum rescaled by exp((old - new) c) whenever the max grows. Attention then computes its scores once per
key instead of once for the max and again for each sum (scores.softmax() @ v: the max, the softmax's sum and the sum of the values), and
reads each key and value once. And siblings, reduces over the same loops that neither reads the other, walk them together.
"""
from __future__ import annotations
import functools, itertools, math
from typing import TYPE_CHECKING, NamedTuple, cast
from tinyc.dtype import DType, dtypes
from tinyc.ops import BinaryOps, BufferOps, LazyOp, ReduceOps, TernaryOps, UnaryOps
from tinyc.shape.symbolic import Node, NumNode
from tinyc.codegen.uops import UOp, UOps
from tinyc.codegen.axes import AxisKind
from tinyc.codegen.thread_reduce import group_reduce, lane_reduce
from tinyc.codegen.register_mma import computed_by_mma, register_mma
from tinyc.codegen.packing import pack, packed_axis, rows_axis
if TYPE_CHECKING:
  from tinyc.codegen.kernel import Kernel
  from tinyc.codegen.linearizer import Linearizer, Scope

class OnlineGroup(NamedTuple):
  """A MAX reduce and the SUMs over the same axes whose inputs are proportional to exp2((y - max) * scale), one scale each."""
  peak: LazyOp
  sums: tuple[LazyOp, ...]
  scales: tuple[float, ...]

def factor_invariants(ast: LazyOp) -> LazyOp:
  """Each SUM's factors (multiplied or divided) that hold a reduce and do not vary along the SUM's axes, moved out of it:
  sum_j(exp(s_j - m) / l * v_j) = sum_j(exp(s_j - m) v_j) / l, where l, the softmax's sum, is then read after the loop, so its
  loop and the SUM's can be one (online_groups)."""
  done: dict[LazyOp, LazyOp] = {}
  def rewrite(node: LazyOp) -> LazyOp:
    if (new := done.get(node)) is None:
      new = LazyOp(node.op, tuple(rewrite(src) for src in node.src), node.arg)
      if node.op is ReduceOps.SUM and dtypes.is_float(node.dtype): new = _factored(new)
      done[node] = new
    return new
  return rewrite(ast)

def _factored(reduce: LazyOp) -> LazyOp:
  numerators, denominators = _factors(reduce.src[0])
  def outside(factor: LazyOp) -> bool:
    return any(node.op in ReduceOps for node in factor.walk()) and not _varies(factor, set(reduce.arg))
  if not any(map(outside, numerators + denominators)) or all(map(outside, numerators)): return reduce
  def product(factors: list[LazyOp], over: list[LazyOp]) -> LazyOp:
    value = functools.reduce(lambda a, b: LazyOp(BinaryOps.MUL, (a, b)), factors)
    return functools.reduce(lambda a, b: LazyOp(BinaryOps.DIV, (a, b)), over, value)
  inner = LazyOp(ReduceOps.SUM, (product([f for f in numerators if not outside(f)], [f for f in denominators if not outside(f)]),), reduce.arg)
  return product([inner] + [f for f in numerators if outside(f)], [f for f in denominators if outside(f)])

def _factors(value: LazyOp) -> tuple[list[LazyOp], list[LazyOp]]:
  """The factors a value multiplies, and those it divides by; through a cast between floats, each factor cast (16-bit attention
  rounds its probabilities: cast(exp / sum) is taken as cast(exp) / cast(sum), which only rounds them less)."""
  if _float_cast(value):
    numerators, denominators = _factors(value.src[0])
    if len(numerators) + len(denominators) > 1:
      recast = lambda factor: factor if factor.dtype == value.dtype else LazyOp(UnaryOps.CAST, (factor,), value.dtype)  # noqa: E731
      return list(map(recast, numerators)), list(map(recast, denominators))
  if value.op is BinaryOps.MUL:
    (a, b), (c, d) = _factors(value.src[0]), _factors(value.src[1])
    return a + c, b + d
  if value.op is BinaryOps.DIV:
    a, b = _factors(value.src[0])
    return a, b + [value.src[1]]
  return [value], []

def _float_cast(node: LazyOp) -> bool: return node.op is UnaryOps.CAST and dtypes.is_float(node.dtype) and dtypes.is_float(node.src[0].dtype)
def _uncast(node: LazyOp) -> LazyOp: return _uncast(node.src[0]) if _float_cast(node) else node

def _varies(node: LazyOp, axes: set[int]) -> bool:
  """Whether a value may differ along any of `axes` (its loads move there; a reduce's value never does along the axes it reduces)."""
  if not axes: return False
  if node.op in (BufferOps.LOAD, BufferOps.CONST):
    st = node.arg.st
    return any(st.shape[axis] != 1 and st.real_strides()[axis] != 0 for axis in axes)
  if node.op in ReduceOps: return _varies(node.src[0], axes - set(node.arg))
  return any(_varies(src, axes) for src in node.src)

def online_groups(kernel: Kernel) -> dict[LazyOp, OnlineGroup]:
  """Each reduce that runs in one loop with others (by every member): a float MAX of values a reduce computes, whose every reader among
  the reduces is a SUM over the same axes of a value proportional to exp2((y - max) * scale), depending beyond the max only on output
  axes. Not with staged tiles or a matmul's tensor cores (their loops are shared by a work-group's threads); a GROUP's threads each walk
  their share of the keys and meet after it, and attention on tensor cores (register_mma.py) walks so too (online_reduce)."""
  if kernel.staged or (kernel.axes(AxisKind.TC) and not kernel.nested_tc): return {}
  groups: dict[LazyOp, OnlineGroup] = {}
  memo: dict[LazyOp, frozenset[int]] = {}
  for number, peak in enumerate(kernel.reduceops):
    # only where the max's input is itself a reduce's result (attention's scores): recomputing it in each pass costs more than the
    # rescaling's exp a trip (a plain softmax row reads its values twice from cache instead)
    if peak.op is not ReduceOps.MAX or not dtypes.is_float(peak.dtype) or not any(node.op in ReduceOps for node in peak.src[0].walk()):
      continue
    side = {axis for axis, owners in enumerate(kernel.owners) if number in owners}
    readers = [reduce for reduce in kernel.reduceops if reduce is not peak and peak in reduce.src[0].walk()]
    scales = [_exp_scale(reduce.src[0], peak) if reduce.op is ReduceOps.SUM else None for reduce in readers]
    if not readers or None in scales or any(other in reduce.src[0].walk() for reduce in readers for other in readers): continue
    if any({axis for axis, owners in enumerate(kernel.owners) if kernel.reduceops.index(reduce) in owners} != side or
           any(kernel.kinds[axis] not in (AxisKind.GLOBAL, AxisKind.LOCAL, AxisKind.UPCAST, AxisKind.LANE, AxisKind.FRAGMENT) for axis in
               kernel.value_axes(reduce, memo) - kernel.value_axes(peak, memo)) for reduce in readers): continue
    group = OnlineGroup(peak, tuple(readers), tuple(cast(float, scale) for scale in scales))
    groups.update({member: group for member in (peak, *readers)})
  return groups

def _exp_scale(value: LazyOp, peak: LazyOp) -> float | None:
  """c where `value` is a product with one factor exp2((y - peak) * c), c > 0, and the peak in no other; else None (casts between
  floats around the exp and its difference are looked through: 16-bit attention rounds its scores and probabilities)."""
  numerators, denominators = _factors(value)
  holding = [factor for factor in numerators + denominators if peak in factor.walk()]
  if len(holding) != 1 or holding[0] not in numerators or (exp := _uncast(holding[0])).op is not UnaryOps.EXP2 or exp.src[0].op is not BinaryOps.MUL:
    return None
  for shifted, scale in ((_uncast(a), b) for a, b in (exp.src[0].src, exp.src[0].src[::-1])):
    if shifted.op is BinaryOps.SUB and _reads_peak(shifted.src[1], peak) and peak not in shifted.src[0].walk() and scale.op is BufferOps.CONST \
       and isinstance(scale.arg.val, float) and scale.arg.val > 0 and all(view.mask is None for view in scale.arg.st.views):
      return scale.arg.val
  return None

def online_reduce(lin: Linearizer, group: OnlineGroup, outer: Scope, grouped: list[int], looped: list[int], unrolled: list[int]) -> None:
  """The group's reduces in one walk of their axes: each trip, the new max of every row; each sum's accumulator scaled by exp2((old max
  - new max) * scale) and the trip's values (computed with the new max) added. A max still -inf (a masked key) is used as 0: no -inf -
  -inf makes a nan. Split by GROUP axes, the threads' maxes meet, then their sums scaled to the group's max. Records the results in `outer`."""
  kernel, members = lin.kernel, (group.peak, *group.sums)
  key_axes = {reduce: [axis for axis in outer.lane_axes if axis in lin.value_axes(reduce)] for reduce in members}
  keys = {reduce: list(itertools.product(*[range(kernel.full_shape[axis]) for axis in key_axes[reduce]])) for reduce in members}
  # on a CPU a sum's lanes of one key axis (the values' features) share a vector accumulator, as a plain reduce's (packing.py)
  # (an axis of the values alone: each row's rescaling multiplies the whole vector)
  # where rows are in the lanes (packing.rows_axis), every member packs along them, the max too: each lane rescales by its own row's factor
  rows = None if lin.threads or grouped else rows_axis(kernel, key_axes[group.peak])
  packed = {reduce: rows if rows is not None else None if lin.threads or computed_by_mma(kernel, reduce) else
            packed_axis(kernel, reduce, [axis for axis in key_axes[reduce] if axis not in key_axes[group.peak]]) for reduce in group.sums}
  if rows is not None: packed[group.peak] = rows
  acc_axes = {reduce: [axis for axis in key_axes[reduce] if axis != packed.get(reduce)] for reduce in members}
  acc_keys = {reduce: list(itertools.product(*[range(kernel.full_shape[axis]) for axis in acc_axes[reduce]])) for reduce in members}
  accs = {reduce: lin.define_accs(reduce, len(acc_keys[reduce]), kernel.full_shape[axis] if (axis := packed.get(reduce)) is not None else 1)
          for reduce in members}
  bound = outer.bound | {axis: lin.thread_idxs[axis] for axis in grouped}
  scope = type(outer)(bound, sorted(set(unrolled).union(*key_axes.values())), dict(outer.reduced))
  loops = lin.walk_loops(looped, group.peak.src[0], scope, members)
  dtype = group.peak.dtype
  def this_trip(reduce: LazyOp, op: BinaryOps) -> dict[tuple[int, ...], UOp]:
    """The reduce's input this trip, its unrolled lanes folded by `op` into one value per accumulator (its own lanes, not every
    member's): a vector of the packed axis's lanes where it has one."""
    lane_axes, along = sorted(key_axes[reduce] + unrolled), packed.get(reduce)
    lanes = lin.lanes(type(scope)(scope.bound, lane_axes, scope.reduced))
    if along is not None: lanes = lanes._replace(packed=lane_axes.index(along))
    steps: dict[tuple[int, ...], list[UOp]] = {}  # each accumulator's and unrolled lane's values, in the packed axis's order
    for idxs, value in zip(lanes.idxs, lin.parse(reduce.src[0], lanes, scope)):
      steps.setdefault(tuple(cast(NumNode, idxs[axis]).b for axis in lane_axes if axis != along), []).append(value)
    folded: dict[tuple[int, ...], UOp] = {}
    for step, values in steps.items():
      key, value = tuple(step[[a for a in lane_axes if a != along].index(axis)] for axis in acc_axes[reduce]), pack(lin.uop, values)
      folded[key] = lin.alu(op, cast(DType, value.dtype), folded[key], value) if key in folded else value
    return folded
  trip_max = this_trip(group.peak, BinaryOps.MAX)
  quads = [axis for axis in kernel.axes(AxisKind.LANE) if kernel.reduceops.index(group.peak) in kernel.owners[axis]]
  if quads:  # keys split among lanes (register_mma.py): their maxes meet each trip, as an mma adds up the lanes' keys together
    trip_max = {key: lane_reduce(lin, ReduceOps.MAX, value) for key, value in trip_max.items()}
  minus_inf, zero = lin.const(dtypes.min(dtype), dtype), lin.const(0.0, dtype)
  def usable(peak: UOp) -> UOp: return lin.alu(TernaryOps.WHERE, dtype, lin.alu(BinaryOps.CMPEQ, dtypes.bool, peak, minus_inf), zero, peak)
  def rescaled(value: UOp, peak: UOp, new_peak: UOp, scale: float) -> UOp:  # value * exp2((peak - new_peak) * scale), in value's dtype
    kind = cast(DType, value.dtype)
    one = kind.scalar()  # (a packed sum's rows multiply their whole vector by one factor)
    shift = lin.alu(BinaryOps.MUL, one, lin.cast(lin.alu(BinaryOps.SUB, dtype, peak, new_peak), one), lin.const(scale, one))
    factor = lin.alu(UnaryOps.EXP2, one, shift)
    return lin.alu(BinaryOps.MUL, kind, value, pack(lin.uop, [factor] * kind.count))
  def peak_key(reduce: LazyOp, key: tuple[int, ...], axes: list[int] | None = None) -> tuple[int, ...]:  # the key's row's max
    return tuple(key[(key_axes[reduce] if axes is None else axes).index(a)] for a in key_axes[group.peak])
  def full_keys(reduce: LazyOp, acc_key: tuple[int, ...]) -> list[tuple[int, ...]]:  # the keys of an accumulator's lanes, in order
    along = packed.get(reduce)
    return [tuple(lane if axis == along else acc_key[acc_axes[reduce].index(axis)] for axis in key_axes[reduce])
            for lane in range(kernel.full_shape[along] if along is not None else 1)]
  def by_key(reduce: LazyOp, vectors: dict[tuple[int, ...], UOp]) -> dict[tuple[int, ...], UOp]:  # each key's lane of its accumulator's value
    if packed.get(reduce) is None: return vectors
    return {key: lin.uop(UOps.GEP, reduce.dtype, (vector,), lane) for acc_key, vector in vectors.items()
            for lane, key in enumerate(full_keys(reduce, acc_key))}
  old = by_key(group.peak, {key: lin.uop(UOps.LOAD, acc.dtype, (acc,), pure=False) for key, acc in zip(acc_keys[group.peak], accs[group.peak])})
  trip_max = by_key(group.peak, trip_max)
  new = {key: lin.alu(BinaryOps.MAX, dtype, old[key], trip_max[key]) for key in keys[group.peak]}
  safe = {key: usable(peak) for key, peak in new.items()}
  scope.reduced[group.peak] = (tuple(key_axes[group.peak]), safe)  # the sums' inputs read the running max
  for reduce in group.sums: lin.hoist(reduce.src[0], scope)
  for reduce, scale in zip(group.sums, group.scales):
    by_mma = computed_by_mma(kernel, reduce)
    added = {} if by_mma else this_trip(reduce, BinaryOps.ADD)
    for key, acc in zip(acc_keys[reduce], accs[reduce]):
      loaded = lin.uop(UOps.LOAD, acc.dtype, (acc,), pure=False)
      if packed.get(reduce) == rows is not None:  # a lane a row: each by its own row's factor (the vector ops pack() rebuilds)
        kept = pack(lin.uop, [rescaled(value, old[row], safe[row], scale) for value, row in
                              zip(by_key(reduce, {key: loaded}).values(), (peak_key(reduce, full) for full in full_keys(reduce, key)))])
      else: kept = rescaled(loaded, old[peak_key(reduce, key, acc_axes[reduce])], safe[peak_key(reduce, key, acc_axes[reduce])], scale)
      lin.uop(UOps.STORE, None, (acc, kept if by_mma else lin.alu(BinaryOps.ADD, cast(DType, acc.dtype), kept, added[key])), pure=False)
    if by_mma: register_mma(lin, reduce, type(scope)(scope.bound, sorted(key_axes[reduce] + unrolled), scope.reduced), accs[reduce],
                            keys[reduce], key_axes[reduce])
  # the new max is stored last: C renderers name an accumulator's value by the accumulator, so every read of the old one comes first
  for key, acc in zip(acc_keys[group.peak], accs[group.peak]):
    lin.uop(UOps.STORE, None, (acc, pack(lin.uop, [new[full] for full in full_keys(group.peak, key)])), pure=False)
  for loop in reversed(loops): lin.end(loop)
  results = {reduce: [lin.uop(UOps.LOAD, acc.dtype, (acc,), pure=False) for acc in accs[reduce]] for reduce in members}
  for reduce, along in packed.items():  # each key's lane of its accumulator
    if along is not None:
      results[reduce] = [lin.uop(UOps.GEP, reduce.dtype, (results[reduce][acc_keys[reduce].index(tuple(key[key_axes[reduce].index(axis)]
                         for axis in acc_axes[reduce]))],), key[key_axes[reduce].index(along)]) for key in keys[reduce]]
  for reduce in group.sums if quads else ():  # each lane's keys' sums meet (by shuffles), but an mma's, which added all of them
    if not computed_by_mma(kernel, reduce): results[reduce] = [lane_reduce(lin, ReduceOps.SUM, value) for value in results[reduce]]
  if grouped:
    own_peaks = dict(zip(keys[group.peak], results[group.peak]))
    results[group.peak] = group_reduce(lin, group.peak, results[group.peak], everyone=True)
    peaks = {key: usable(peak) for key, peak in zip(keys[group.peak], results[group.peak])}
    for reduce, scale in zip(group.sums, group.scales):  # a thread that saw no key (its max -inf) has sums of 0, and exp2(-inf) is 0
      scaled = [rescaled(partial, own_peaks[peak_key(reduce, key)], peaks[peak_key(reduce, key)], scale)
                for key, partial in zip(keys[reduce], results[reduce])]
      results[reduce] = group_reduce(lin, reduce, scaled, everyone=True)
  for reduce in members: outer.reduced[reduce] = (tuple(key_axes[reduce]), dict(zip(keys[reduce], results[reduce])))

def _reads_peak(node: LazyOp, peak: LazyOp) -> bool:
  """Whether `node` is the max, or the max with -inf read as 0 (attention's row that keeps no key): the running max is already read so."""
  if node is peak: return True
  if node.op is not TernaryOps.WHERE or node.src[2] is not peak or not _is_const(node.src[1], 0): return False
  test = node.src[0]
  return test.op is BinaryOps.CMPEQ and test.src[0] is peak and _is_const(test.src[1], -math.inf)

def _is_const(node: LazyOp, value: float) -> bool:
  if node.op is not BufferOps.CONST or isinstance(node.arg.val, Node): return False
  return bool(node.arg.val == value) and all(view.mask is None for view in node.arg.st.views)

def siblings(lin: Linearizer, reduceop: LazyOp, outer: Scope, key_axes: list[int]) -> list[LazyOp]:
  """The reduce and those that can share its walk (Linearizer.reduce): over the same axes, with accumulators for the same lanes, none
  reading another, neither computed nor being walked, not online, and ready to be computed here."""
  kernel, ready, members = lin.kernel, set(outer.bound) | set(outer.lane_axes), [reduceop]
  if len(kernel.reduceops) == 1: return members
  def axes_of(reduce: LazyOp) -> list[bool]: return [kernel.reduceops.index(reduce) in owners for owners in kernel.owners]
  inside = {reduce: set(reduce.src[0].walk()) for reduce in kernel.reduceops}
  def joins(other: LazyOp) -> bool:
    return (other not in outer.reduced and other not in lin.walking and other not in lin.online and axes_of(other) == axes_of(reduceop)
            and all(other not in inside[member] and member not in inside[other] for member in members)
            and lin.value_axes(other) <= ready and [axis for axis in outer.lane_axes if axis in lin.value_axes(other)] == key_axes)
  for other in kernel.reduceops:
    if other is not reduceop and joins(other): members.append(other)
  return members
