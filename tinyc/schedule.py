"""Layer 5: the scheduler turns the lazy graph under some outputs into an ordered list of kernels. All fusion is decided here.
Imports helpers, dtype, ops, shape/, lazy.

A kernel is: elementwise prologue (any views of any inputs) -> at most one reduce -> elementwise epilogue -> one store.
Each base a kernel reaches gets a Decision from one pure function, `decide` (LOAD, REALIZE, CONST, INLINE, REDUCE, ROW_REDUCE,
EMPTY_REDUCE), with its reason, a sentence naming the rule (DEBUG>=3 prints each); the KernelBuilder only follows decisions.
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
from enum import Enum, auto
from typing import NamedTuple
from tinyc.dtype import dtypes
from tinyc.helpers import DEBUG, prod
from tinyc.ops import (BufferOps, ConstBuffer, ElementwiseOps, LazyOp, LoadOps, MemBuffer, ReduceOps, ScheduleItem, UNSAFE_PAD_OPS)
from tinyc.shape.shapetracker import ShapeTracker
from tinyc.lazy import LazyBuffer

sys.setrecursionlimit(max(sys.getrecursionlimit(), 20000))  # graphs are walked recursively; a long training step is deep

def _is_plain_reshape(st: ShapeTracker) -> bool: return len(st.views) == 1 and st.views[0].contiguous
def _has_mask(st: ShapeTracker) -> bool: return any(view.mask is not None for view in st.views)
def _has_expand(st: ShapeTracker) -> bool: return any(stride == 0 and size > 1 for view in st.views for stride, size in zip(view.strides, view.shape))

def _describe(base: LazyBuffer) -> str: return f"{'realized' if base.realized is not None else getattr(base.op, 'name', base.op)} {base.shape}"

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

class Fusion(Enum):
  """What a kernel does with a base it reaches."""
  LOAD = auto()          # read it from memory: it is realized, or stored by a kernel of its own
  REALIZE = auto()       # store it in a kernel of its own first, then read it from memory
  CONST = auto()         # a scalar broadcast: no memory at all
  INLINE = auto()        # compute it here (an elementwise op)
  REDUCE = auto()        # compute it here as the kernel's reduce: the store follows it
  ROW_REDUCE = auto()    # compute it here and read it back along the axes it reduced (rule 7)
  EMPTY_REDUCE = auto()  # a reduce of nothing: the reduce's identity, a constant

class Decision(NamedTuple):
  fusion: Fusion
  reason: str  # a sentence naming the rule

class Site(NamedTuple):
  """Where the kernel being built reaches a base: the view it reads it through and what lies between it and the store."""
  root: LazyBuffer                        # the base the kernel stores
  st: ShapeTracker                        # the view through which the base is read
  shared: bool                            # a base between here and the root has several consumers
  in_reduce: bool                         # the base is read inside a reduce's input
  reduce_shape: tuple[int, ...] | None    # the output shape of the kernel's reduce, once it has one
  row_axes: tuple[int, ...] | None        # the axes the kernel's row reduces reduce, once it has one

def decide(base: LazyBuffer, site: Site, consumers: int, realize: bool) -> Decision:
  """What the kernel at `site` does with `base`, and why: a pure function of the base, the site, how many bases read it
  (`consumers`) and whether the graph-level rules (rules 3 and 5) already store it (`realize`)."""
  if base is site.root:
    if base.op is LoadOps.CONST: return Decision(Fusion.CONST, "the kernel stores a constant")
  else:
    if base.realized is not None: return Decision(Fusion.LOAD, "it is realized")
    if realize: return Decision(Fusion.LOAD, "it is stored by a kernel of its own (an output, a load op, or a reduce several kernels read)")
    if base.op is LoadOps.CONST: return Decision(Fusion.CONST, "a constant needs no memory")
    if isinstance(base.op, ReduceOps):
      if (why := _why_not_fused(site)) is None: return _reduce(base, Fusion.REDUCE, "rule 3: the kernel's one reduce, read through a plain reshape")
      if _is_row_read(base, site): return _reduce(base, Fusion.ROW_REDUCE, "rule 7: a reduce read back along the axes it reduced, by a kernel "
                                                  "that stores its input's shape: computed in the row kernel before the row's store")
      if prod(base.srcs[0].shape): return Decision(Fusion.REALIZE, f"rule 3: a reduce is computed once, and {why}")
    if base.op in UNSAFE_PAD_OPS and _has_mask(site.st):
      return Decision(Fusion.REALIZE, f"rule 4: it is seen through a pad and f(0) != 0 for {base.op.name}")
    if site.in_reduce and consumers > 1 and _has_expand(site.st):
      return Decision(Fusion.REALIZE, "rule 2: several kernels read it and a reduce reads it through an expand, which would recompute it "
                                      "once per broadcast element")
  if isinstance(base.op, ReduceOps):
    return _reduce(base, Fusion.REDUCE, "rule 5: the kernel stores this reduce") if base is site.root else _reduce(base, Fusion.ROW_REDUCE, "")
  assert isinstance(base.op, ElementwiseOps), f"cannot inline {base.op} into a kernel"
  return Decision(Fusion.INLINE, "rule 1: an elementwise op fuses into its reader" + (", and rule 2: recomputed rather than stored"
                                                                                        if consumers > 1 else ""))

def _reduce(base: LazyBuffer, fusion: Fusion, reason: str) -> Decision:
  if prod(base.srcs[0].shape) == 0: return Decision(Fusion.EMPTY_REDUCE, "a reduce of nothing is its identity, a constant")
  return Decision(fusion, reason)

def _why_not_fused(site: Site) -> str | None:
  """Why a reduce reached at `site` cannot be the kernel's one reduce (rule 3), or None if it can."""
  if site.shared: return "several kernels read a value between it and the store"
  if site.in_reduce: return "its reader is a reduce"
  if site.reduce_shape is not None or site.row_axes is not None: return "the kernel already has a reduce"
  if not _is_plain_reshape(site.st): return "it is read through a view other than a plain reshape"
  return None

def _is_row_read(base: LazyBuffer, site: Site) -> bool:
  """Rule 7: the reduce is read exactly through an expand of its result, by a kernel that stores its input's shape and has no other
  reduce but row reduces over the same axes."""
  in_shape = base.srcs[0].shape
  if site.st.shape != in_shape or site.root.shape != in_shape or site.reduce_shape is not None or site.row_axes not in (None, base.arg): return False
  return site.st.views == ShapeTracker.from_shape(base.shape).expand(in_shape).views

class KernelBuilder:
  """Builds the AST of the kernel that stores `root` by following the decision for each base it reaches."""
  def __init__(self, scheduler: Scheduler, root: LazyBuffer) -> None:
    self.scheduler, self.root = scheduler, root
    self.inputs: list[LazyBuffer] = []
    self.reduce_shape: tuple[int, ...] | None = None
    self.row_axes: tuple[int, ...] | None = None  # the axes the kernel's row reduces reduce
    self.explained: set[LazyBuffer] = set()  # bases whose decision DEBUG=3 printed
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
    """The AST of `base`'s value seen through `st`."""
    scheduler = self.scheduler
    consumers = scheduler.consumers.get(base, 0)
    decision = decide(base, Site(self.root, st, shared, in_reduce, self.reduce_shape, self.row_axes), consumers, base in scheduler.realizes)
    if DEBUG >= 3 and base not in self.explained and decision.reason:
      self.explained.add(base)
      print(f"schedule: the kernel storing {_describe(self.root)} reads {_describe(base)}: {decision.fusion.name}, as {decision.reason}")
    fusion = decision.fusion
    if fusion is Fusion.REALIZE: scheduler.realizes.add(base)
    if fusion in (Fusion.LOAD, Fusion.REALIZE): return self._load(base, st)
    if fusion is Fusion.CONST: return LazyOp(BufferOps.CONST, (), ConstBuffer(base.arg, base.dtype, st))
    if fusion is Fusion.EMPTY_REDUCE:
      return LazyOp(BufferOps.CONST, (), ConstBuffer(0 if base.op is ReduceOps.SUM else dtypes.min(base.dtype), base.dtype, st))
    shared = shared or (base is not self.root and consumers > 1)
    if fusion is Fusion.REDUCE: self.reduce_shape = base.shape
    if fusion is Fusion.ROW_REDUCE: self.row_axes = base.arg
    assert base.op is not None, f"{base} is realized, so it is loaded"
    if fusion in (Fusion.REDUCE, Fusion.ROW_REDUCE):
      src = base.srcs[0]
      return LazyOp(base.op, (self.build(src.base, src.st, shared, in_reduce=True),), base.arg)
    return LazyOp(base.op, tuple(self.build(src.base, src.st + st, shared, in_reduce) for src in base.srcs), base.arg)

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
