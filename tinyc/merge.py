"""Layer 5: what the scheduler does with its kernels once they are made: their order, and the kernels it merges into one (rule 9,
siblings; rule 11, shared reduces). Imports helpers, ops, shape/.
"""
from __future__ import annotations
import heapq, itertools
from tinyc.helpers import prod
from tinyc.ops import BufferOps, ConstBuffer, LazyOp, LoadOps, MemBuffer, ReduceOps, ScheduleItem

def dependencies(items: list[ScheduleItem]) -> list[set[int]]:
  """For each item, the items that must run before it: those it reads, and for an ASSIGN every other item that reads the old value."""
  producer = {out: index for index, item in enumerate(items) for out in item.outs}
  after: list[set[int]] = [{producer[src] for src in item.inputs if src in producer} for item in items]
  readers: dict[object, list[int]] = {}
  for index, item in enumerate(items):
    for src in item.inputs: readers.setdefault(src, []).append(index)
  for index, item in enumerate(items):
    for target in (out.srcs[1] for out in item.outs if out.op is LoadOps.ASSIGN):
      after[index].update(other for other in readers.get(target, ()) if other != index)
  return after

def ordered(items: list[ScheduleItem]) -> list[ScheduleItem]:
  """Reorder so each item runs after the items it must (dependencies), otherwise keeping the order."""
  after = dependencies(items)
  waiting = [len(deps) for deps in after]
  users: list[list[int]] = [[] for _ in items]
  for index, deps in enumerate(after):
    for dep in deps: users[dep].append(index)
  ready = [index for index, count in enumerate(waiting) if count == 0]
  heapq.heapify(ready)
  order: list[ScheduleItem] = []
  while ready:
    index = heapq.heappop(ready)
    order.append(items[index])
    for user in users[index]:
      waiting[user] -= 1
      if waiting[user] == 0: heapq.heappush(ready, user)
  if len(order) != len(items):
    raise RuntimeError("assign: the new value of a tensor is needed to compute something that also reads its old value; realize() one of them first")
  return order

class _Ancestry:
  """The items each item must run after, transitively (a bitset each), kept true as kernels merge."""
  def __init__(self, items: list[ScheduleItem]) -> None:
    self.after, self.known = dependencies(items), list[int | None]([None] * len(items))
  def of(self, index: int) -> int:
    if (known := self.known[index]) is None:
      known = 0
      for dep in self.after[index]: known |= (1 << dep) | self.of(dep)
      self.known[index] = known
    return known
  def join(self, indices: list[int]) -> None:
    """`indices` are now one kernel: it runs after all that any of them ran after, and whatever ran after one runs after it all."""
    bits, joined = sum(1 << index for index in indices), 0
    for index in indices: joined |= self.of(index)
    for other in range(len(self.known)):
      if self.of(other) & bits: self.known[other] = self.of(other) | joined | bits
    for index in indices: self.known[index] = joined

def _merge_siblings(items: list[ScheduleItem]) -> list[ScheduleItem]:
  """Rule 9: kernels with the same loops that read a common input at least as large as their outputs, neither running before the
  other, become one kernel with the stores of both (that input is then read once). Not contractions: a matmul's tile is chosen
  for one accumulator set."""
  ancestry, members = _Ancestry(items), dict[int, list[int]]()
  for group in _sibling_groups(items).values():
    clusters: list[int] = []
    for index in group:
      for first in clusters:
        bits = sum(1 << member for member in members[first])
        if ancestry.of(first) >> index & 1 or ancestry.of(index) & bits or not _share_input(items[first], items[index]): continue
        members[first].append(index)
        ancestry.join(members[first])
        break
      else:
        clusters.append(index)
        members[index] = [index]
  if all(len(group) == 1 for group in members.values()): return items
  merged_away = {index for group in members.values() for index in group[1:]}
  return ordered([_merged([items[m] for m in members[i]]) if i in members else item for i, item in enumerate(items) if i not in merged_away])

def _sibling_groups(items: list[ScheduleItem]) -> dict[tuple, list[int]]:
  """Kernel items by their loops: device, the shapes they store, and the frame of their reduces (contractions left out)."""
  groups: dict[tuple, list[int]] = {}
  for index, item in enumerate(items):
    if item.ast.op is not BufferOps.SINK: continue
    reduces = _top_reduces(item.ast)
    frames = {(_full_shape(reduce), reduce.arg) for reduce in reduces}
    if len(frames) > 1 or any(_is_contraction(reduce) for reduce in reduces): continue
    groups.setdefault((item.outs[0].device, tuple(store.arg.st.shape for store in item.ast.src), tuple(frames)), []).append(index)
  return groups

def _share_input(first: ScheduleItem, second: ScheduleItem) -> bool:
  size = prod(first.ast.src[0].arg.st.shape)
  return any(prod(src.shape) >= size and src in second.inputs for src in first.inputs)

def _top_reduces(node: LazyOp) -> list[LazyOp]:
  return [node] if node.op in ReduceOps else [reduce for src in node.src for reduce in _top_reduces(src)]

def _full_shape(node: LazyOp) -> tuple[int, ...]:
  return tuple(max(sizes) for sizes in zip(*[leaf.arg.st.shape for leaf in node.walk() if leaf.op in (BufferOps.LOAD, BufferOps.CONST)]))

def _is_contraction(reduce: LazyOp) -> bool:
  """A reduce none of whose loads reads values without repeating them: every input is broadcast (a matmul)."""
  loads = [leaf.arg.st for leaf in reduce.walk() if leaf.op is BufferOps.LOAD]
  return bool(loads) and all(any(stride == 0 and size > 1 for view in st.views for stride, size in zip(view.strides, view.shape)) for st in loads)

def _merged(items: list[ScheduleItem]) -> ScheduleItem:
  """One kernel storing what `items` store, its buffers numbered anew: the outputs in order, then every distinct input."""
  outs = tuple(out for item in items for out in item.outs)
  inputs = tuple(dict.fromkeys(src for item in items for src in item.inputs))
  stores: list[LazyOp] = []
  for item in items:
    numbers = [outs.index(out) for out in item.outs] + [len(outs) + inputs.index(src) for src in item.inputs]
    stores += item.ast.map_buffers(lambda buf: MemBuffer(numbers[buf.idx], buf.dtype, buf.st) if isinstance(buf, MemBuffer) else buf).src
  return ScheduleItem(LazyOp(BufferOps.SINK, tuple(stores)), outs, inputs)

def merge_kernels(items: list[ScheduleItem]) -> list[ScheduleItem]:
  """The pass's kernels with rules 11 and 9 applied."""
  return _merge_siblings(_merge_shared_reduces(items))

def _merge_shared_reduces(items: list[ScheduleItem]) -> list[ScheduleItem]:
  """Rule 11: a kernel whose every reduce another kernel computes too (or whose every nested reduce it does, its other reduces
  running over loops that kernel reduces), in the same loops but without one or two of that kernel's axes (which its outputs do not
  span), and which reads nothing that kernel does not, neither running before the other, becomes outputs of that kernel: the shared
  reduces are computed once. Attention's log-sum-exp for the backward is so stored by the forward's kernel, whose online softmax
  computes the same max and sum in a loop that also spans the values' features, and dv by dk's kernel, which computes the same
  probabilities over the same queries."""
  ancestry = _Ancestry(items)
  reducing = {index: (len(item.ast.src[0].arg.st.shape), item.outs[0].device, set(item.inputs)) for index, item in enumerate(items)
              if item.ast.op is BufferOps.SINK and _top_reduces(item.ast)}
  merged: dict[int, ScheduleItem] = {}  # the kernel that takes another's outputs -> the two as one
  used: set[int] = set()
  for absorbed, taker in itertools.permutations(reducing, 2):
    (wide, device, reads), (narrow, its_device, its_reads) = reducing[taker], reducing[absorbed]
    if not 0 < wide - narrow <= 2 or device != its_device or not its_reads <= reads or absorbed in used or taker in used \
       or ancestry.of(taker) >> absorbed & 1 or ancestry.of(absorbed) >> taker & 1: continue
    first, second = items[taker], items[absorbed]
    frame, its_frame = _full_shape(first.ast), _full_shape(second.ast)
    for positions in itertools.combinations(range(wide), wide - narrow):
      if not all(size in (1, full) for size, full in zip(_inserted(its_frame, positions), frame)): continue  # its axes are first's or 1
      if (both := _sharing_reduces(first, ScheduleItem(_with_axes(second.ast, positions), second.outs, second.inputs))) is None: continue
      merged[taker] = both
      used.update((taker, absorbed))
      ancestry.join([taker, absorbed])
      break
  if not merged: return items
  return ordered([merged.get(index, item) for index, item in enumerate(items) if index in merged or index not in used])

def _sharing_reduces(first: ScheduleItem, second: ScheduleItem) -> ScheduleItem | None:
  """`first` storing `second`'s outputs too, where every reduce of `second` is one of `first`'s, or every reduce `second` nests in
  another's loop is (attention's scores, rule 10) and the others run over loops `first` has."""
  both = _merged([first, second])
  def reduces(stores: tuple[LazyOp, ...]) -> set[LazyOp]: return {node for store in stores for node in store.walk() if node.op in ReduceOps}
  theirs, ours = reduces(both.ast.src[len(first.outs):]), reduces(both.ast.src[:len(first.outs)])
  nested = {reduce for reduce in theirs if any(reduce in other.src[0].walk() for other in theirs if other is not reduce)}
  if theirs <= ours or nested and nested <= ours and all(reduce.arg in {other.arg for other in ours} for reduce in theirs - ours): return both
  return None

def _with_axes(node: LazyOp, positions: tuple[int, ...], done: dict[LazyOp, LazyOp] | None = None) -> LazyOp:
  """A kernel's tree with size-1 axes inserted at `positions` (numbered in the wider kernel): every tracker reshaped, every reduce's
  axes renumbered. Each shared subtree once."""
  done = {} if done is None else done
  if (made := done.get(node)) is None:
    arg = node.arg
    if isinstance(arg, (MemBuffer, ConstBuffer)):
      arg = type(arg)(arg.idx if isinstance(arg, MemBuffer) else arg.val, arg.dtype, arg.st.reshape(_inserted(arg.st.shape, positions)))
    elif node.op in ReduceOps:
      kept = [axis for axis in range(len(positions) + 1 + max(arg)) if axis not in positions]
      arg = tuple(kept[axis] for axis in arg)
    done[node] = made = LazyOp(node.op, tuple(_with_axes(src, positions, done) for src in node.src), arg)
  return made

def _inserted(shape: tuple[int, ...], positions: tuple[int, ...]) -> tuple[int, ...]:
  """`shape` with a 1 inserted at each of `positions` (numbered in the result)."""
  wider = list(shape)
  for position in positions: wider.insert(position, 1)
  return tuple(wider)
