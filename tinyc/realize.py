"""Layer 5: runs a schedule: allocates each output, performs load ops, and launches each kernel's compiled program.
Imports helpers, dtype, ops, codegen/kernel, device, beam, lazy, schedule, index_check.

Threads may share a lazy graph (a model whose weights are still lazy, used by several threads): each base is computed by one of
them. Scheduling, claiming a kernel's outputs and publishing them (`realized` set, the graph under them dropped) happen under one
lock, so a schedule never sees half of a result; running kernels happens outside it. A thread about to compute a base another thread
is computing waits for that result instead (on `_published`, which releases the lock meanwhile).
"""
from __future__ import annotations
import operator, threading
from typing import Any, Callable, NamedTuple
from tinyc.helpers import ALLOW_TF32, BEAM, NOOPT, PARALLEL_BUILD, GlobalCounters, ThreadRecorder, prod
from tinyc.ops import LazyOp, LoadOps, ScheduleItem, unbind_ast
from tinyc.shape.symbolic import Variable, sym_max
from tinyc.codegen.kernel import Opt
from tinyc.device import Buffer, Compiled, Device, Program, copy_buffer
from tinyc.beam import beam_opts, beam_plan
from tinyc.lazy import LazyBuffer
from tinyc.schedule import create_schedule, planned_schedule
from tinyc import index_check, profiler

# something that ran (a program or a copy, called with its buffers, the values of the Variables of its symbolic sizes and what to show
# of it), its buffers and those values
Step = tuple[Callable[[list[Buffer], dict[Variable, int], profiler.Shown], None], list[Buffer], dict[Variable, int]]
steps_run: ThreadRecorder[Step] = ThreadRecorder()  # TinyJit's capture: `with steps_run.record() as steps:` (this thread's only)
_graph_lock = threading.Lock()
_published = threading.Condition(_graph_lock)  # notified when a thread publishes (or gives up) bases while another waits (_waiting > 0)
_computing: set[LazyBuffer] = set()  # bases a thread is computing
_waiting = 0
CLAIMED, COMPUTED, STALE = "claimed", "computed", "stale"  # what _claim finds

def run_schedule(schedule: list[ScheduleItem], shown: profiler.Shown | None = None, programs: list[Any] | None = None,
                 first: str | None = None) -> None:
  """Run the schedule's kernels in order. `shown`: the realize's DEBUG and PROFILE, read here where not given. `programs`: its plan's
  list of each item's Resolved, to use and fill. `first`: the first item's claim, made under the schedule's lock."""
  shown = shown or profiler.shown()
  if len(schedule) > 1: _build_all(schedule)  # (one kernel builds where it runs: a worker would only add its start; no setting read)
  for index, item in enumerate(schedule):
    if (claim := first if index == 0 else None) is None:
      _graph_lock.acquire()  # (acquire and release in try/finally, not `with`: a with statement makes two bound methods, 0.07 us more)
      try: claim = _claim(item.outs)
      finally: _graph_lock.release()
    if claim is COMPUTED: continue  # another thread computed them
    if claim is STALE:  # another thread computed some of them in a kernel of its own: compute the rest anew, reading those
      with _graph_lock: rest = create_schedule([out for out in item.outs if out.realized is None], shown)
      run_schedule(rest, shown)
      continue
    buffers: list[Buffer] | None = None
    try: buffers = _compute(item, shown, programs, index)
    finally:
      _graph_lock.acquire()
      try:
        for out, buffer in zip(item.outs, buffers or []): out.realized, out.srcs = buffer, ()  # stored: let the graph that made it be freed
        _computing.difference_update(item.outs)
        if _waiting: _published.notify_all()
      finally: _graph_lock.release()

def _claim(outs: tuple[LazyBuffer, ...]) -> str:
  """With the graph lock held: CLAIMED (marked as computing) if this thread is to compute `outs`, COMPUTED once another thread has computed
  them all, STALE once it has computed some (its schedule grouped them otherwise). Waits while another thread computes one (it may fail)."""
  global _waiting
  while True:
    computed, busy = 0, False  # a loop, not all()/any(): this runs for every kernel of every eager realize
    for out in outs:
      if out.realized is not None: computed += 1
      elif out in _computing: busy = True
    if computed: return COMPUTED if computed == len(outs) else STALE
    if not busy:
      _computing.update(outs)
      return CLAIMED
    _waiting += 1
    try: _published.wait()
    finally: _waiting -= 1

class Resolved(NamedTuple):
  """What a plan's item ran with, kept with the plan: valid while the settings are the same and its device's programs of one generation."""
  settings: tuple[int, int, int]  # BEAM, ALLOW_TF32, NOOPT: what chooses the program besides the AST (_opts, Compiled._memory_key)
  generation: int
  device: Compiled
  program: Program
  var_vals: dict[Variable, int]

def _compute(item: ScheduleItem, shown: profiler.Shown, programs: list[Any] | None, index: int) -> list[Buffer]:
  buffers = list(map(_output_buffer, item.outs))  # (map, not comprehensions, here: in 3.11 a comprehension is a call of its own)
  if item.ast.op is _COPY: _run(copy_buffer, [buffers[0], item.inputs[0].realized], {}, shown)
  elif item.ast.op is not _EMPTY:
    # a repeated realize runs its plan's program: no unbind_ast, Device[] or program key, each a Python call or more (1.2 us)
    settings = (BEAM.value, ALLOW_TF32.value, NOOPT.value)
    if programs is None or (known := programs[index]) is None or known.settings != settings or known.generation != known.device.programs.generation:
      ast, var_vals = unbind_ast(item.ast)  # one program for every value of a symbolic size: the values are its arguments
      device = Device[item.outs[0].device]
      known = Resolved(settings, device.programs.generation, device, device.get_program(ast, None if var_vals else _opts(ast, device)), var_vals)
      if programs is not None: programs[index] = known
    _run(known.program, buffers + list(map(_realized_of, item.inputs)), known.var_vals, shown)
  return buffers
_realized_of = operator.attrgetter("realized")
_COPY, _EMPTY, _ASSIGN = LoadOps.COPY, LoadOps.EMPTY, LoadOps.ASSIGN  # (module names: LoadOps.COPY is a Python call in Python 3.11, see lazy.py)

def _output_buffer(out: LazyBuffer) -> Buffer:
  """Where an output goes: the target's own memory for an assign, else a new buffer (for a symbolic shape, of its largest size, so a
  TinyJit replay with a larger value fits)."""
  if out.op is not _ASSIGN: return Buffer(out.device, sym_max(prod(out.shape)), out.dtype)
  assert (buffer := out.srcs[1].realized) is not None, f"assign into {out.srcs[1]}, which has no buffer"
  return buffer

def _opts(ast: LazyOp, device: Compiled) -> tuple[Opt, ...] | None:
  """With BEAM=n the Opts a search on the device chose (cached), else None: the hand-coded heuristic's."""
  return beam_opts(device, ast) if BEAM.value >= 1 and device.compile_binary is not None else None

def _build_all(schedule: list[ScheduleItem]) -> None:
  """Build the schedule's new kernels at once, each device's in worker processes, before the first runs (Compiled.build_all). A
  schedule shorter than PARALLEL_BUILD gets its kernels one at a time, as they run."""
  if not (least := PARALLEL_BUILD.value) or len(schedule) < least: return
  unbound: dict[str, list[tuple[LazyOp, bool]]] = {}  # device -> (AST, whether it has symbolic sizes)
  for item in schedule:
    if item.ast.op in (LoadOps.COPY, LoadOps.EMPTY): continue
    ast, var_vals = unbind_ast(item.ast)
    unbound.setdefault(item.outs[0].device, []).append((ast, bool(var_vals)))
  for device_name, asts in unbound.items():
    device = Device[device_name]
    if BEAM.value >= 1 and device.compile_binary is not None: beam_plan(device, [ast for ast, symbolic in asts if not symbolic])
    device.build_all([(ast, None if symbolic else _opts(ast, device)) for ast, symbolic in asts])

def _run(step: Callable[[list[Buffer], dict[Variable, int], profiler.Shown], None], buffers: list[Buffer | None], var_vals: dict[Variable, int],
         shown: profiler.Shown) -> None:
  assert None not in buffers, f"{step} reads an unrealized input"
  step(buffers, var_vals, shown)  # type: ignore[arg-type]
  steps_run.note((step, buffers, var_vals))  # type: ignore[arg-type]

def realize(outs: list[LazyBuffer]) -> None:
  """Compute every output that is not yet realized, fusing the graph under them into kernels. The index checks made since the last
  realize are computed in the same schedule (index_check.py)."""
  checks, shown = index_check.claim(), profiler.shown()
  try:
    _graph_lock.acquire()  # (acquire and release, not `with`: see run_schedule)
    try:
      schedule, programs = planned_schedule(outs + [check.extremes for check in checks] if checks else outs, shown)
      # one kernel (an eager realize) is claimed in the same acquisition; a longer schedule claims each kernel as it comes to it (a
      # thread holds no claim while it waits for another's, nor while it builds the schedule's kernels)
      first = _claim(schedule[0].outs) if len(schedule) == 1 else None
    finally: _graph_lock.release()
    if not schedule: return
    kernels_before = GlobalCounters.kernel_count
    run_schedule(schedule, shown, programs, first)
  except BaseException:
    index_check.release(checks)
    raise
  if shown.debug >= 1: print(f"realized {len(outs)} output(s) with {GlobalCounters.kernel_count - kernels_before} kernel(s)")
  index_check.read_pending(only_if_over_limit=True)
