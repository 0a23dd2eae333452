"""Layer 5: the scheduler turns the lazy graph under some outputs into an ordered list of kernels. All fusion is decided here.
Imports helpers, dtype, ops, shape/, lazy, fusion.

A kernel is: elementwise prologue (any views of any inputs) -> reduces -> elementwise epilogue -> one or more stores. Its reduces
share one frame (input shape and axes) or are row reduces over the same axes, and may nest row reduces in their loops (rule 3).
Each base a kernel reaches gets a Decision from one pure function, `fusion.decide` (LOAD, REALIZE, CONST, INLINE, REDUCE,
ROW_REDUCE, NESTED_REDUCE, EMPTY_REDUCE; and whether to store it too), with its reason, a sentence naming the rule (DEBUG>=3 prints
each); the KernelBuilder only follows decisions. The rules, each held by a test that counts kernels:
  1. Elementwise ops fuse into whoever reads them, through any view (a movement op is a view, never a kernel).
  2. Recompute, don't materialize, an elementwise value read by several kernels: re-reading its inputs costs what reading a stored
     copy would (if under 4 times its bytes: fusion.wide_values), saving a write and a kernel. In one kernel it is computed once.
     Except when a reduce reads it through an expand along one of the reduce's output axes: that would recompute it once per
     output element, so it is stored (a single value, or one repeated only along the reduce's own axes, is recomputed; so is a stored
     float widened, a 16-bit matmul operand in float32: the matmul loads 16 bits, the tensor cores' form). So is a value computing
     exp, log, sin or sqrt read that way by its one reader (gelu before a projection): per output element it costs more than the reduce.
  3. A reduce is computed once per element of its output: it is computed in a kernel that reads it through a plain reshape (as that
     kernel's reduce, or beside a reduce over the same loops), or as a row reduce (rule 7) by every kernel that reads its rows (each
     walks the rows anyway), or nested in another reduce's loop when read back exactly along its rows, reducing only axes the outer
     reduce reduces, with the axes it depends on before the others (so it runs once per trip of those loops: cross-entropy's row
     max inside the sum over rows). Otherwise it is stored, and its readers load it.
  4. A value seen through a pad is materialized first if it contains an op that does not map 0 to 0 (exp, log, 1/x, ...):
     padding pushed into the loads would otherwise compute f(0) in the padded area.
  5. Outputs, copies and contiguous() are always materialized.
  6. assign() writes in place, after every kernel of the schedule that reads the old value; a kernel that would read
     the buffer it writes through another view (w.assign(w.T + 1)) computes the new value into a temporary first.
  7. Row kernels: a reduce read back along the axes it reduced (softmax reads its max and its sum through an expand) by a
     kernel that stores the reduce's input shape is computed inside that kernel, before the kernel's own walk of those axes:
     softmax, log_softmax and layernorm are one kernel that reads each row from memory once. Its reduces share their axes, and it
     has more than one row (one row would run on one work-group).
  8. A value that must be stored (rules 2-5) is stored by the first kernel that reads it at the index it is stored at, outside every
     reduce (a plain view, or in a row kernel an expand along the row axes), as one more output, instead of by a kernel of its own:
     AdamW's moments by the kernel that updates the parameter, layernorm's row statistics by its forward kernel. Not when one of
     that kernel's inputs reads it (a cycle), nor for an assign that kernel reads through another view (rule 6).
  9. Kernels with the same loops (same stored shapes and reduce frame) that read a common input at least as large as their outputs,
     neither needing the other, are one kernel with the stores of both (layernorm's weight and bias gradients): the input is read
     once. Not contractions (every input read through an expand, a matmul), whose tiles are chosen for one accumulator set.
  10. A reduce read inside another reduce's input through a permute and expand of its result is computed in the kernel's loops, once
     per element: along loops around it that it does not vary along (softmax's max and sum inside the sum over the keys of p @ v), or,
     for a contraction of at most 128 products, along new axes of its own (the scores q.k); shared by at most 128 output elements
     (lanes). A value read through an expand along output axes that reaches such a contraction is computed there, not stored.
     softmax(q k^T) v is one kernel that stores no matrix of scores (fusion.nesting).
  11. A kernel whose every reduce another kernel computes too (or whose every nested reduce it does, its others running over loops the
     other reduces), in the same loops less one or two axes its outputs do not span, and that reads nothing the other does not,
     neither needing the other, becomes more outputs of the other (merge.py): attention's log-sum-exp for the backward is stored by
     the forward's kernel, whose online softmax computes the same max and sum, and dv by dk's kernel, which computes the same
     probabilities.
Rules 3 and 8 depend on what later kernels decide: a pass that stores a value an earlier kernel of the pass recomputed is run again,
with that value known to be stored from the start (see Scheduler).
"""
from __future__ import annotations
import functools, operator, sys, time
from typing import Any, Callable, cast
from tinyc.dtype import dtypes
from tinyc.helpers import DEBUG, prod
from tinyc import profiler
from tinyc.ops import BinaryOps, BufferOps, ConstBuffer, LazyOp, LoadOps, MemBuffer, ReduceOps, ScheduleItem, UnaryOps, const_key
from tinyc.shape.shapetracker import ShapeTracker
from tinyc.lazy import LazyBuffer
from tinyc.fusion import Decision, Fusion, Frame, Nesting, Site, decide, wide_values
from tinyc.merge import dependencies, merge_kernels, ordered

sys.setrecursionlimit(max(sys.getrecursionlimit(), 20000))  # graphs are walked recursively; a long training step is deep

def _describe(base: LazyBuffer) -> str: return f"{'realized' if base.realized is not None else getattr(base.op, 'name', base.op)} {base.shape}"

class Scheduler:
  """One pass over the graph under `targets`, appending a kernel (or load op) per base that must be stored. `realizes` and
  `no_store` carry over between passes: a pass is `stale` when it stored a base that one of its kernels had recomputed (a kernel
  made before the base was known to be stored might have stored it, rule 8), and is then run again."""
  def __init__(self, targets: list[LazyBuffer], consumers: dict[LazyBuffer, int], realizes: set[LazyBuffer], no_store: set[LazyBuffer]) -> None:
    self.consumers, self.realizes, self.no_store = consumers, realizes, no_store  # no_store: bases no other kernel may store (rule 8)
    self.items: list[ScheduleItem] = []
    self.scheduled: set[LazyBuffer] = set()
    self.storing: dict[LazyBuffer, KernelBuilder] = {}  # base -> the kernel being built that also stores it
    self.recomputed: set[LazyBuffer] = set()  # bases that kernels of this pass compute where several kernels may reach them
    self.nested_in: dict[LazyBuffer, LazyBuffer] = {}  # a contraction nested with loops of its own -> the root of the kernel nesting it
    self.stale = False
    for target in targets: self.schedule(target)

  # store `base` from now on; `stale`: kernels of this pass that computed it must be made again (as where one recomputed it, rule 8)
  def realize(self, base: LazyBuffer, stale: bool = False) -> None:
    if stale or (base not in self.realizes and base in self.recomputed): self.stale = True
    self.realizes.add(base)

  def schedule(self, base: LazyBuffer) -> None:
    """Append the kernel (or load op) that computes `base`, after those of the inputs it needs."""
    if (builder := self.storing.pop(base, None)) is not None: builder.cycles.add(base)  # its storing kernel reads it through another
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
    while True:
      kernel = KernelBuilder(self, base)
      for out in kernel.outs[1:]: self.storing.pop(out, None)
      if refused := kernel.cycles | kernel.misplaced_stores(): self.no_store.update(refused)  # store those in kernels of their own
      elif base.op is LoadOps.ASSIGN and kernel.reads_through_another_view(base):  # rule 6: the new value goes to a temporary first
        self.realize(base.srcs[0].base)
        self.no_store.add(base.srcs[0].base)
      else: break
    self.scheduled.update(kernel.outs)
    self.items.append(ScheduleItem(kernel.ast, tuple(kernel.outs), tuple(kernel.inputs)))

class KernelBuilder:
  """Builds the AST of the kernel that stores `root` (and the bases rule 8 stores with it) by following the decision for each base."""
  def __init__(self, scheduler: Scheduler, root: LazyBuffer) -> None:
    self.scheduler, self.root = scheduler, root
    self.inputs: list[LazyBuffer] = []
    self.also: dict[LazyBuffer, tuple[LazyOp, ShapeTracker]] = {}  # more outputs (rule 8): value and view in the root's shape
    self.frame: Frame | None = None  # the loops of the kernel's reduces
    self.row_axes: tuple[int, ...] | None = None  # the axes the kernel's row reduces reduce
    self.cycles: set[LazyBuffer] = set()  # bases it would store that one of its inputs reads
    self.built: dict[tuple, LazyOp] = {}  # a base reached again the same way is the same value
    self.new_axes: list[int] = []  # the sizes of the axes appended for reduces nested with loops of their own (rule 10)
    self.nested_axes: dict[LazyBuffer, tuple[int, ...]] = {}  # each such reduce's new axes, the same wherever it is reached
    self.explained: set[LazyBuffer] | None = set() if DEBUG >= 3 else None  # bases whose decision DEBUG=3 printed
    value_src = root.srcs[0] if root.op in (LoadOps.CONTIGUOUS, LoadOps.ASSIGN) else root
    st = ShapeTracker.from_shape(root.shape)
    value = self.build(value_src.base, value_src.st if value_src is not root else st, shared=False, enclosing=None, loops=())
    stores = [(root, value, st)] + [(base, value, view) for base, (value, view) in self.also.items()]
    if self.frame is not None and (reduce_shape := tuple(1 if a in self.frame.axes else s for a, s in enumerate(self.frame.shape))) != root.shape:
      # the epilogue was built in the root's shape; the kernel runs in the reduce's (same size, 1 in each reduced axis)
      reshaped: dict[LazyOp, LazyOp] = {}
      stores = [(base, _reshape_epilogue(value, reduce_shape, reshaped), view.reshape(reduce_shape)) for base, value, view in stores]
    if self.new_axes:  # every view gets the axes nested reduces appended (size 1: they run along none of them)
      rank, padded = len(self.frame.shape) + len(self.new_axes) if self.frame is not None else 0, cast(dict[LazyOp, LazyOp], {})
      stores = [(base, value.map_buffers(functools.partial(_with_rank, rank), padded), _with_rank(rank, view)) for base, value, view in stores]
    self.outs = [base for base, _, _ in stores]
    def number(buf: MemBuffer | None) -> MemBuffer | None:  # inputs were numbered from 1 as they came: they follow the outputs
      return MemBuffer(buf.idx + len(stores) - 1, buf.dtype, buf.st) if isinstance(buf, MemBuffer) else buf
    numbered: dict[LazyOp, LazyOp] = {}
    def renumbered(value: LazyOp) -> LazyOp: return value if len(stores) == 1 else value.map_buffers(number, numbered)
    self.ast = LazyOp(BufferOps.SINK, tuple(LazyOp(BufferOps.STORE, (renumbered(value),), MemBuffer(index, base.dtype, view))
                                            for index, (base, value, view) in enumerate(stores)))

  def reads_through_another_view(self, out: LazyBuffer) -> bool:
    """Whether the kernel loads the buffer the ASSIGN `out` overwrites at other indices than the one it stores to (rule 6)."""
    target = out.srcs[1]
    if target not in self.inputs: return False
    number, store_st = self.inputs.index(target) + len(self.outs), self.ast.src[self.outs.index(out)].arg.st
    return any(node.op is BufferOps.LOAD and node.arg.idx == number and node.arg.st != store_st for node in self.ast.walk())

  def misplaced_stores(self) -> set[LazyBuffer]:
    """The bases stored with the root that must not be (rule 8): read along axes that are not row axes, so computed once per element
    of a loop they do not depend on, or an assign that reads its target through another view (rule 6)."""
    misplaced = {base for base, (_, view) in self.also.items() if view.shape != self.root.shape and
                 (self.row_axes is None or any(a not in self.row_axes for a, (s, r) in enumerate(zip(view.shape, self.root.shape)) if s != r))}
    return misplaced | {base for base in self.outs[1:] if base.op is LoadOps.ASSIGN and self.reads_through_another_view(base)}

  def _load(self, base: LazyBuffer, st: ShapeTracker) -> LazyOp:
    self.scheduler.schedule(base)
    if base not in self.inputs: self.inputs.append(base)
    return LazyOp(BufferOps.LOAD, (), MemBuffer(self.inputs.index(base) + 1, base.dtype, st))

  def build(self, base: LazyBuffer, st: ShapeTracker, shared: bool, enclosing: tuple[int, ...] | None, loops: tuple[int, ...]) -> LazyOp:
    """The AST of `base`'s value seen through `st`; `enclosing`: the axes of the innermost reduce whose input this is; `loops`: the
    reduce axes whose loops run around it."""
    if self.scheduler.consumers.get(base, 0) <= 1: return self._build(base, st, shared, enclosing, loops)  # reached again only through its reader
    key = (base, st, shared, enclosing, loops, self.frame, self.row_axes)
    if (built := self.built.get(key)) is None: self.built[key] = built = self._build(base, st, shared, enclosing, loops)
    return built

  def _build(self, base: LazyBuffer, st: ShapeTracker, shared: bool, enclosing: tuple[int, ...] | None, loops: tuple[int, ...]) -> LazyOp:
    scheduler = self.scheduler
    consumers = scheduler.consumers.get(base, 0)
    stored = base in scheduler.scheduled or base in scheduler.no_store or scheduler.storing.get(base, self) is not self
    site = Site(self.root, st, shared, enclosing, self.frame, self.row_axes, loops)
    decision = decide(base, site, consumers, base in scheduler.realizes, stored, scheduler.realizes)
    self._explain(base, decision)
    fusion = decision.fusion
    if fusion is Fusion.REALIZE: scheduler.realize(base)
    if fusion in (Fusion.LOAD, Fusion.REALIZE): return self._load(base, st)
    if fusion is Fusion.CONST: return LazyOp(BufferOps.CONST, (), ConstBuffer(base.arg, base.dtype, st))
    if fusion is Fusion.EMPTY_REDUCE:
      return LazyOp(BufferOps.CONST, (), ConstBuffer(0 if base.op is ReduceOps.SUM else dtypes.min(base.dtype), base.dtype, st))
    if decision.store is not None:
      scheduler.realize(base)
      scheduler.storing[base] = self
    elif base is not self.root and (shared or consumers > 1): scheduler.recomputed.add(base)
    shared = shared or (base is not self.root and consumers > 1)
    if fusion is Fusion.REDUCE: self.frame = Frame(base.srcs[0].shape, base.arg)
    if fusion is Fusion.ROW_REDUCE: self.row_axes = base.arg
    assert base.op is not None, f"{base} is realized, so it is loaded"
    if decision.store is not None: st = decision.store  # computed once per element it stores, whatever view reads it
    if base.op in (LoadOps.ASSIGN, LoadOps.CONTIGUOUS): value = self.build(base.srcs[0].base, base.srcs[0].st + st, shared, enclosing, loops)
    elif decision.nesting is not None: value = self._nested(base, decision.nesting, shared, loops)
    elif isinstance(base.op, ReduceOps):
      around = {axis for axis in loops if axis < len(base.shape) and base.shape[axis] > 1}  # the loops it is computed in
      inner_loops = tuple(sorted(set(base.arg) | around)) if enclosing is not None else base.arg
      value = LazyOp(base.op, (self.build(base.srcs[0].base, base.srcs[0].st, shared, base.arg, inner_loops),), base.arg)
    else:
      value = _without_times_one(LazyOp(base.op, tuple(self.build(src.base, src.st + st, shared, enclosing, loops) for src in base.srcs), base.arg))
    if decision.store is not None: self.also[base] = (value, decision.store)
    return value

  def _nested(self, base: LazyBuffer, nested: Nesting, shared: bool, loops: tuple[int, ...]) -> LazyOp:
    """Rule 10: a reduce of another frame in the kernel's loops, its input seen along the kernel's axes, each reduced dim along the
    loop it shares or a new axis of its own (the same ones wherever the reduce is reached)."""
    assert self.frame is not None, "a nested reduce needs the kernel's frame"
    if nested.new and self.scheduler.nested_in.setdefault(base, self.root) is not self.root:  # a second kernel reaches it: stored once
      self.scheduler.realize(base, stale=True)
    if (own := self.nested_axes.get(base)) is None:
      first = len(self.frame.shape) + len(self.new_axes)
      own = self.nested_axes[base] = tuple(range(first, first + len(nested.new)))
      self.new_axes += [base.srcs[0].shape[dim] for dim in nested.new]
    axes = list(nested.axes)
    for dim, axis in zip(nested.new, own): axes[dim] = axis
    in_shape, rank = base.srcs[0].shape, len(self.frame.shape) + len(self.new_axes)
    dims = sorted((dim for dim in range(len(in_shape)) if in_shape[dim] > 1), key=lambda dim: cast(int, axes[dim]))
    full = [1] * rank
    for dim in dims: full[cast(int, axes[dim])] = in_shape[dim]
    squeezed = ShapeTracker.from_shape(in_shape).reshape(tuple(in_shape[dim] for dim in sorted(dims)))
    view = squeezed.permute(tuple(sorted(dims).index(dim) for dim in dims))
    reduced = tuple(sorted(cast(int, axes[dim]) for dim in base.arg))
    inner_loops = tuple(sorted(set(reduced) | (set(loops) & nested.varying)))
    value = self.build(base.srcs[0].base, base.srcs[0].st + view.reshape(tuple(full)), shared, reduced, inner_loops)
    return LazyOp(cast(ReduceOps, base.op), (value,), reduced)

  def _explain(self, base: LazyBuffer, decision: Decision) -> None:
    if self.explained is not None and base not in self.explained and decision.reason:
      self.explained.add(base)
      print(f"schedule: the kernel storing {_describe(self.root)} reads {_describe(base)}: {decision.fusion.name}, as {decision.reason}")

def _without_times_one(node: LazyOp) -> LazyOp:
  """x * 1 is x, exactly, in every dtype. A backward multiplies by ones (a sum's gradient), and a tensor-core operand must be a load."""
  if node.op is not BinaryOps.MUL: return node
  def is_one(operand: LazyOp) -> bool:
    while operand.op is UnaryOps.CAST: operand = operand.src[0]  # 1 in any dtype is 1 in any other
    return operand.op is BufferOps.CONST and operand.arg.val == 1 and all(view.mask is None for view in operand.arg.st.views)
  return node.src[0] if is_one(node.src[1]) else node.src[1] if is_one(node.src[0]) else node

def _with_rank(rank: int, buf_or_st: Any) -> Any:
  """A buffer (or view) in a kernel of `rank` axes: the axes appended after its own are 1."""
  if isinstance(buf_or_st, ShapeTracker):
    return buf_or_st if len(buf_or_st.shape) == rank else buf_or_st.reshape(buf_or_st.shape + (1,) * (rank - len(buf_or_st.shape)))
  if not isinstance(buf_or_st, (MemBuffer, ConstBuffer)) or len(buf_or_st.st.shape) == rank: return buf_or_st
  return type(buf_or_st)(buf_or_st.idx if isinstance(buf_or_st, MemBuffer) else buf_or_st.val, buf_or_st.dtype, _with_rank(rank, buf_or_st.st))

def _reshape_epilogue(node: LazyOp, shape: tuple[int, ...], done: dict[LazyOp, LazyOp] | None = None) -> LazyOp:
  """The epilogue (what lies outside every reduce) with its trackers reshaped to `shape`; each shared subtree once."""
  done = {} if done is None else done
  if node.op in ReduceOps: return node
  if (reshaped := done.get(node)) is None:
    if node.op in (BufferOps.LOAD, BufferOps.CONST):
      buf = node.arg
      reshaped = LazyOp(node.op, (), type(buf)(buf.idx if isinstance(buf, MemBuffer) else buf.val, buf.dtype, buf.st.reshape(shape)))
    else: reshaped = LazyOp(node.op, tuple(_reshape_epilogue(src, shape, done) for src in node.src), node.arg)
    done[node] = reshaped
  return reshaped

PLANS_KEPT = 4096
_CONST = LoadOps.CONST  # (a module name: LoadOps.CONST is a Python call in Python 3.11, see lazy.py)
# structure -> (each item's AST and what takes its outputs and inputs from the walk's bases; realize.py's Resolved for each)
_plans: dict[tuple, tuple[list[tuple[LazyOp, Callable[[tuple], tuple], Callable[[tuple], tuple]]], list[Any]]] = {}

def create_schedule(outs: list[LazyBuffer], shown: profiler.Shown | None = None) -> list[ScheduleItem]:
  """The kernels that compute `outs`, in an order where each runs after the kernels it reads. A graph of a structure scheduled
  before (the same ops, args, views, dtypes and devices, realized inputs aliased alike; not the data) reuses that plan. `shown`:
  the realize's DEBUG and PROFILE, read here where not given."""
  return planned_schedule(outs, shown)[0]

def planned_schedule(outs: list[LazyBuffer], shown: profiler.Shown | None = None) -> tuple[list[ScheduleItem], list[Any]]:
  """create_schedule's items, and the plan's list of what realize ran each with (None until it has; kept with the plan)."""
  targets: list[LazyBuffer] = []  # (loops, not comprehensions, here: a comprehension is a call of its own, and every eager realize comes here)
  for out in outs:
    if (base := out._base or out).realized is None: targets.append(base)  # (the base inlined: the property is a call)
  if not targets: return [], []
  if (shown := shown or profiler.shown()).debug >= 3:  # the decisions are printed as they are made
    return (made := _schedule(targets)), [None] * len(made)
  started = time.perf_counter() if (profiling := shown.profiling) else 0.0
  # the key: the graph under the targets, each base named by its position in a walk (not by identity or data)
  position: dict[LazyBuffer, int] = {}  # (in the order of the walk)
  entries: list[tuple] = []
  target_positions = []
  for target in targets: target_positions.append(_visit(target, position, entries))
  key = (tuple(target_positions), tuple(entries))
  if not (reused := (found := _plans.get(key)) is not None):
    plan = [(item.ast, _taker([position[out] for out in item.outs]), _taker([position[src] for src in item.inputs])) for item in _schedule(targets)]
    _plans[key] = found = (plan, [None] * len(plan))
    if len(_plans) > PLANS_KEPT: del _plans[next(iter(_plans))]
  bases, items = tuple(position), []
  for ast, outs_of, inputs_of in found[0]:  # (tuple.__new__: a NamedTuple's own __new__ is a Python call)
    items.append(tuple.__new__(ScheduleItem, (ast, outs_of(bases), inputs_of(bases))))
  if profiling: profiler.record("schedule", "schedule", started, time.perf_counter() - started, kernels=len(items), reused_plan=reused)
  return items, found[1]

def _taker(positions: list[int]) -> Callable[[tuple], tuple]:
  """What takes the bases at `positions` from the walk's as a tuple in one C call (a map and its tuple cost 0.9 us an eager realize)."""
  if len(positions) > 1: return operator.itemgetter(*positions)
  return operator.itemgetter(slice(positions[0], positions[0] + 1) if positions else slice(0))

def _visit(base: LazyBuffer, position: dict[LazyBuffer, int], entries: list[tuple]) -> int:
  """The position of `base` in the walk, its sources first. Every eager realize walks its graph here, so it is written for speed; and
  at module level, as a recursive closure is a reference cycle that would keep the walk's bases and buffers alive until a GC."""
  if (known := position.get(base)) is not None: return known
  if base.realized is not None: entry: tuple = (base.dtype, base.device, base.shape)  # an input: only what it holds
  elif (op := base.op) is _CONST: entry = (op, const_key(base.arg), base.dtype, base.device, base.shape)  # -0.0 == 0.0, 1 / -0.0 is not
  else:
    srcs: list[tuple[int, ShapeTracker]] = []  # a loop, not a comprehension (a frame of its own): the src's base inlined, as the property is a call
    for src in base.srcs: srcs.append((_visit(src._base or src, position, entries), src.st))
    entry = (op, base.arg, base.dtype, base.device, base.shape, tuple(srcs))
  position[base] = index = len(entries)
  entries.append(entry)
  return index

def _schedule(targets: list[LazyBuffer]) -> list[ScheduleItem]:
  consumers = _count_consumers(targets)
  realizes = set(targets) | {base for base in consumers if isinstance(base.op, LoadOps) and base.op is not _CONST} | wide_values(targets, consumers)
  no_store, dropped, graph_level = set[LazyBuffer](), set[LazyBuffer](), set(realizes)
  targets.sort(key=lambda target: consumers[target] > 0)  # readers first: a target read by another is stored by its reader (rule 8)
  while True:
    while (scheduler := Scheduler(targets, consumers, realizes, no_store)).stale: pass
    # stored by a pass's decision for a kernel that a later pass made again reading something else (a value it had recomputed, now
    # stored: an MLP's gelu derivative, where the first kernel stored its terms): scheduled again without them, once each
    if unread := _needless_stores(scheduler.items, realizes - graph_level, realizes) - dropped:
      realizes, dropped = realizes - unread, dropped | unread
      continue
    if not (crossed := _reduces_of_crossed_assigns(scheduler.items)): break
    assert not crossed <= no_store, f"assigns that read each other's targets: {crossed}"
    no_store.update(crossed)
  items = merge_kernels(scheduler.items) if len(scheduler.items) > 1 else scheduler.items
  if any(out.op is LoadOps.ASSIGN for item in items for out in item.outs): items = ordered(items)
  return items

def _needless_stores(items: list[ScheduleItem], stored: set[LazyBuffer], realizes: set[LazyBuffer]) -> set[LazyBuffer]:
  """The bases of `stored` (pass-level stores) that the items store for nothing: those none reads (load ops aside: they are their own
  items), and the elementwise ones that one kernel alone reads, a kernel without reduces that reads every stored value and buffer
  they are computed from (rule 2 stored gelu's 1 + 0.044715 h^2 for a kernel that recomputed its reader, the derivative, which is
  stored since and would compute it for nothing more)."""
  readers: dict[LazyBuffer, list[ScheduleItem]] = {}
  for item in items:
    for base in item.inputs: readers.setdefault(base, []).append(item)
  def inputs_of(value: LazyBuffer) -> set[LazyBuffer]:
    found, seen, stack = set[LazyBuffer](), set[LazyBuffer](), [src.base for src in value.srcs]
    while stack:
      if (base := stack.pop()) in seen: continue
      seen.add(base)
      if base.realized is not None or base in realizes: found.add(base)
      else: stack.extend(src.base for src in base.srcs)
    return found
  def needless(out: LazyBuffer) -> bool:
    if not (reading := readers.get(out)): return True
    return not isinstance(out.op, ReduceOps) and len(reading) == 1 and not any(op.op in ReduceOps for op in reading[0].ast.walk()) \
      and inputs_of(out) <= set(reading[0].inputs)
  return {out for item in items if not isinstance(item.ast.op, LoadOps) for out in item.outs if out in stored and needless(out)}

def _reduces_of_crossed_assigns(items: list[ScheduleItem]) -> set[LazyBuffer]:
  """Rule 6 across kernels: two kernels that assign (an optimizer's updates) may each read the other's target, through a gradient each
  stores by rule 8 (a layernorm's weight and bias, each gradient reading the other's parameter); neither can run first. The reduces such
  kernels store are then stored by kernels of their own, which run before both."""
  if not any(out.op is LoadOps.ASSIGN for item in items for out in item.outs): return set()
  after, done = dependencies(items), set[int]()
  while ready := {index for index, deps in enumerate(after) if index not in done and deps <= done}: done |= ready
  return {out for index, item in enumerate(items) if index not in done and item.outs[0].op is LoadOps.ASSIGN
          for out in item.outs[1:] if isinstance(out.op, ReduceOps)}

def _count_consumers(targets: list[LazyBuffer]) -> dict[LazyBuffer, int]:
  """How many bases read each unrealized base under `targets` (each reader once)."""
  consumers = {base: 0 for base in targets}
  stack, seen = list(targets), set(targets)
  while stack:
    base = stack.pop()
    for src in dict.fromkeys(src.base for src in base.srcs):
      if src.realized is not None: continue
      consumers[src] = consumers.get(src, 0) + 1
      if src not in seen:
        seen.add(src)
        stack.append(src)
  return consumers
