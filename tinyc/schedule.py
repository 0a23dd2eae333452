"""Layer 5: the scheduler turns the lazy graph under some outputs into an ordered list of kernels. All fusion is decided here.
Imports helpers, dtype, ops, shape/, lazy.

A kernel is: elementwise prologue (any views of any inputs) -> at most one reduce -> elementwise epilogue -> one store.
The rules, each held by a test that counts kernels:
  1. Elementwise ops fuse into whoever reads them, through any view (a movement op is a view, never a kernel).
  2. Recompute, don't materialize, an elementwise value read by several kernels: re-reading its inputs costs what reading a
     stored copy would, and it saves a write and a kernel. Inside one kernel a value is computed once (the linearizer dedups).
     Except when a reduce reads it through an expand: that would recompute it once per broadcast element, so it is stored.
  3. A reduce is computed exactly once: it is materialized if several kernels read it, if it is read through anything but a
     plain reshape or a row read (rule 7), or if its reader already has a reduce.
  4. A value seen through a pad is materialized first if it contains an op that does not map 0 to 0 (exp, log, 1/x, ...):
     padding pushed into the loads would otherwise compute f(0) in the padded area.
  5. Outputs, copies and contiguous() are always materialized.
  6. assign() writes in place, after every kernel of the schedule that reads the old value; a kernel that would read
     the buffer it writes through another view (w.assign(w.T + 1)) computes the new value into a temporary first.
  7. Row kernels: a reduce read back along the axes it reduced (softmax reads its max and its sum through an expand) by a
     kernel that stores the reduce's input shape is computed inside that kernel, before the kernel's own walk of those axes:
     softmax, log_softmax and layernorm are one kernel that reads each row from memory once. Its reduces share their axes.
"""
from __future__ import annotations
import heapq, sys
from tinyc.dtype import dtypes
from tinyc.helpers import prod
from tinyc.ops import (BufferOps, ConstBuffer, ElementwiseOps, LazyOp, LoadOps, MemBuffer, ReduceOps, ScheduleItem, UNSAFE_PAD_OPS)
from tinyc.shape.shapetracker import ShapeTracker
from tinyc.lazy import LazyBuffer

sys.setrecursionlimit(max(sys.getrecursionlimit(), 20000))  # graphs are walked recursively; a long training step is deep

def _is_plain_reshape(st: ShapeTracker) -> bool: return len(st.views) == 1 and st.views[0].contiguous
def _has_mask(st: ShapeTracker) -> bool: return any(view.mask is not None for view in st.views)
def _has_expand(st: ShapeTracker) -> bool: return any(stride == 0 and size > 1 for view in st.views for stride, size in zip(view.strides, view.shape))

class Scheduler:
  def __init__(self, outs: list[LazyBuffer]) -> None:
    self.items: list[ScheduleItem] = []
    self.scheduled: set[LazyBuffer] = set()
    self.consumers: dict[LazyBuffer, int] = {}
    self.realizes: set[LazyBuffer] = set()
    targets = [out.base for out in outs if out.base.realized is None]
    self._count_consumers(targets)
    self.realizes.update(targets)
    for base in self.consumers:
      if isinstance(base.op, LoadOps) and base.op is not LoadOps.CONST: self.realizes.add(base)
      if isinstance(base.op, ReduceOps) and self.consumers[base] > 1: self.realizes.add(base)
    for target in targets: self.schedule(target)
    if any(out.op is LoadOps.ASSIGN for item in self.items for out in item.outs): self.items = _order_assigns(self.items)

  def _count_consumers(self, targets: list[LazyBuffer]) -> None:
    stack, seen = list(targets), set(targets)
    for base in targets: self.consumers.setdefault(base, 0)
    while stack:
      base = stack.pop()
      for src in dict.fromkeys(src.base for src in base.srcs):
        if src.realized is not None: continue
        self.consumers[src] = self.consumers.get(src, 0) + 1
        if src not in seen:
          seen.add(src)
          stack.append(src)

  def schedule(self, base: LazyBuffer) -> None:
    """Append the kernel (or load op) that computes `base`, after those of the inputs it needs."""
    if base in self.scheduled or base.realized is not None: return
    self.scheduled.add(base)
    if prod(base.shape) == 0:  # nothing to compute, and nothing it reads is needed
      self.items.append(ScheduleItem(LazyOp(LoadOps.EMPTY), (base,), ()))
      return
    if base.op in (LoadOps.EMPTY, LoadOps.COPY):
      srcs = tuple(src.base for src in base.srcs)
      for src in srcs: self.schedule(src)
      self.items.append(ScheduleItem(LazyOp(base.op), (base,), srcs))
      return
    kernel = KernelBuilder(self, base)
    if base.op is LoadOps.ASSIGN and kernel.reads_target_through_another_view():
      self.realizes.add(base.srcs[0].base)
      kernel = KernelBuilder(self, base)
    self.items.append(ScheduleItem(kernel.ast, (base,), tuple(kernel.inputs)))

class KernelBuilder:
  """Builds the AST of the kernel that stores `root`, inlining every value the rules allow and loading the rest."""
  def __init__(self, scheduler: Scheduler, root: LazyBuffer) -> None:
    self.scheduler, self.root = scheduler, root
    self.inputs: list[LazyBuffer] = []
    self.reduce_shape: tuple[int, ...] | None = None
    self.row_axes: tuple[int, ...] | None = None  # the axes the kernel's row reduces reduce
    value_src = root.srcs[0] if root.op in (LoadOps.CONTIGUOUS, LoadOps.ASSIGN) else root
    st = ShapeTracker.from_shape(root.shape)
    value = self.build(value_src.base, value_src.st if value_src is not root else st, shared=False, in_reduce=False)
    if self.reduce_shape is not None and self.reduce_shape != root.shape:
      # the epilogue was built in the root's shape; the kernel runs in the reduce's (same size, 1 in each reduced axis)
      value, st = self._reshape_epilogue(value, self.reduce_shape), st.reshape(self.reduce_shape)
    self.ast = LazyOp(BufferOps.SINK, (LazyOp(BufferOps.STORE, (value,), MemBuffer(0, root.dtype, st)),))

  def reads_target_through_another_view(self) -> bool:
    """Whether this ASSIGN kernel loads the buffer it overwrites at other indices than the one it stores to."""
    target = self.root.srcs[1]
    if target not in self.inputs: return False
    number, store_st = self.inputs.index(target) + 1, self.ast.src[0].arg.st
    return any(node.op is BufferOps.LOAD and node.arg.idx == number and node.arg.st != store_st for node in self.ast.walk())

  def _load(self, base: LazyBuffer, st: ShapeTracker) -> LazyOp:
    self.scheduler.schedule(base)
    if base not in self.inputs: self.inputs.append(base)
    return LazyOp(BufferOps.LOAD, (), MemBuffer(self.inputs.index(base) + 1, base.dtype, st))

  def build(self, base: LazyBuffer, st: ShapeTracker, shared: bool, in_reduce: bool) -> LazyOp:
    """The AST of `base`'s value seen through `st`. `shared`: a base between here and the root has several consumers."""
    scheduler = self.scheduler
    row_reduce = False
    if base is not self.root:
      if base.realized is not None or base in scheduler.realizes: return self._load(base, st)
      if base.op is LoadOps.CONST: return LazyOp(BufferOps.CONST, (), ConstBuffer(base.arg, base.dtype, st))
      fusable_reduce = not (shared or in_reduce or self.reduce_shape is not None or self.row_axes is not None or not _is_plain_reshape(st))
      row_reduce = isinstance(base.op, ReduceOps) and not fusable_reduce and self._is_row_reduce(base, st)
      if isinstance(base.op, ReduceOps) and not (fusable_reduce or row_reduce) and prod(base.srcs[0].shape): return self._realize(base, st)
      if base.op in UNSAFE_PAD_OPS and _has_mask(st): return self._realize(base, st)
      if in_reduce and scheduler.consumers.get(base, 0) > 1 and _has_expand(st): return self._realize(base, st)
    elif base.op is LoadOps.CONST: return LazyOp(BufferOps.CONST, (), ConstBuffer(base.arg, base.dtype, st))
    shared = shared or (base is not self.root and scheduler.consumers.get(base, 0) > 1)
    if isinstance(base.op, ReduceOps) and prod(base.srcs[0].shape) == 0:  # reducing nothing gives the reduce's identity
      return LazyOp(BufferOps.CONST, (), ConstBuffer(0 if base.op is ReduceOps.SUM else dtypes.min(base.dtype), base.dtype, st))
    if isinstance(base.op, ReduceOps):
      if not row_reduce: self.reduce_shape = base.shape
      src = base.srcs[0]
      return LazyOp(base.op, (self.build(src.base, src.st, shared, in_reduce=True),), base.arg)
    assert isinstance(base.op, ElementwiseOps), f"cannot inline {base.op} into a kernel"
    return LazyOp(base.op, tuple(self.build(src.base, src.st + st, shared, in_reduce) for src in base.srcs), base.arg)

  def _is_row_reduce(self, base: LazyBuffer, st: ShapeTracker) -> bool:
    """Whether a reduce read back along its reduced axes by a kernel that stores its input's shape is computed in that kernel
    (rule 7): exactly an expand of its result, the same reduced axes as the kernel's other row reduces, no other reduce. If so,
    records its axes as the kernel's row axes."""
    in_shape = base.srcs[0].shape
    if st.shape != in_shape or self.root.shape != in_shape or self.reduce_shape is not None or self.row_axes not in (None, base.arg): return False
    if st.views != ShapeTracker.from_shape(base.shape).expand(in_shape).views: return False
    self.row_axes = base.arg
    return True

  def _realize(self, base: LazyBuffer, st: ShapeTracker) -> LazyOp:
    self.scheduler.realizes.add(base)
    return self._load(base, st)

  def _reshape_epilogue(self, node: LazyOp, shape: tuple[int, ...]) -> LazyOp:
    if node.op in ReduceOps: return node
    if node.op in (BufferOps.LOAD, BufferOps.CONST):
      buf = node.arg
      return LazyOp(node.op, (), type(buf)(buf.idx if isinstance(buf, MemBuffer) else buf.val, buf.dtype, buf.st.reshape(shape)))
    return LazyOp(node.op, tuple(self._reshape_epilogue(src, shape) for src in node.src), node.arg)

def _order_assigns(items: list[ScheduleItem]) -> list[ScheduleItem]:
  """Reorder so each item runs after the items it reads and each ASSIGN after every item that reads the old value."""
  producer = {out: index for index, item in enumerate(items) for out in item.outs}
  after: list[set[int]] = [{producer[src] for src in item.inputs if src in producer} for item in items]
  for index, item in enumerate(items):
    for target in (out.srcs[1] for out in item.outs if out.op is LoadOps.ASSIGN):
      after[index].update(other for other, reader in enumerate(items) if other != index and target in reader.inputs)
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

def create_schedule(outs: list[LazyBuffer]) -> list[ScheduleItem]:
  """The kernels that compute `outs`, in an order where each runs after the kernels it reads."""
  return Scheduler(outs).items
