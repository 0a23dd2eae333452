"""Layer 5: runs a schedule: allocates each output, performs load ops, and launches each kernel's compiled program.
Imports helpers, dtype, ops, device, beam, lazy, schedule, index_check.

Threads may share a lazy graph (a model whose weights are still lazy, used by several threads): each base is computed by one of
them. Scheduling and publishing a result (`realized` set, the graph under it dropped) happen under one lock, so a schedule never
sees half of a result; running kernels happens outside it. A thread about to compute a base another thread is computing waits
for that result instead.
"""
from __future__ import annotations
import threading
from typing import Callable
from tinyc.helpers import BEAM, DEBUG, GlobalCounters, ThreadRecorder, prod
from tinyc.ops import LazyOp, LoadOps, ScheduleItem
from tinyc.device import Buffer, Device, Program, copy_buffer
from tinyc.beam import beam_opts
from tinyc.lazy import LazyBuffer
from tinyc.schedule import create_schedule
from tinyc import index_check

Step = tuple[Callable[[list[Buffer]], None], list[Buffer]]  # something that ran (a program or a copy) and its buffers
steps_run: ThreadRecorder[Step] = ThreadRecorder()  # TinyJit's capture: `with steps_run.record() as steps:` (this thread's only)
_graph_lock = threading.Lock()
_computing: dict[LazyBuffer, threading.Lock] = {}  # base -> a lock its computing thread holds until the result is published

def run_schedule(schedule: list[ScheduleItem]) -> None:
  for item in schedule:
    if (busy := _claim(item.out)) is None: continue  # another thread computed it
    buffer: Buffer | None = None
    try: buffer = _compute(item)
    finally:
      with _graph_lock:
        if buffer is not None: item.out.realized, item.out.srcs = buffer, ()  # the value is stored: let the graph that made it be freed
        del _computing[item.out]
      busy.release()

def _claim(base: LazyBuffer) -> threading.Lock | None:
  """A held lock to release once `base` is published, if this thread is to compute it; None once another thread has computed it."""
  while True:
    with _graph_lock:
      if base.realized is not None: return None
      if (busy := _computing.get(base)) is None:
        _computing[base] = busy = threading.Lock()
        busy.acquire()
        return busy
    with busy: pass  # another thread is computing it: wait, then look again (it may have failed)

def _compute(item: ScheduleItem) -> Buffer:
  out = item.out
  buffer = out.srcs[1].realized if out.op is LoadOps.ASSIGN else Buffer(out.device, prod(out.shape), out.dtype)
  assert buffer is not None, f"assign into {out.srcs[1]}, which has no buffer"
  if item.ast.op is LoadOps.COPY: _run(copy_buffer, [buffer, item.inputs[0].realized])
  elif item.ast.op is not LoadOps.EMPTY: _run(program_for(item.ast, out.device), [buffer] + [src.realized for src in item.inputs])
  return buffer

def program_for(ast: LazyOp, device_name: str) -> Program:
  """The kernel's program: with BEAM=n the Opts a search on the device chose (cached), else the hand-coded heuristic's."""
  device = Device[device_name]
  return device.get_program(ast, beam_opts(device, ast) if BEAM >= 1 and device.compile_binary is not None else None)

def _run(step: Callable[[list[Buffer]], None], buffers: list[Buffer | None]) -> None:
  assert all(buf is not None for buf in buffers), f"{step} reads an unrealized input"
  step(buffers)  # type: ignore[arg-type]
  steps_run.note((step, buffers))  # type: ignore[arg-type]

def realize(outs: list[LazyBuffer]) -> None:
  """Compute every output that is not yet realized, fusing the graph under them into kernels. The index checks made since the last
  realize are computed in the same schedule (index_check.py)."""
  checks = index_check.claim()
  try:
    with _graph_lock: schedule = create_schedule(outs + [check.extremes for check in checks])
    if not schedule: return
    kernels_before = GlobalCounters.kernel_count
    run_schedule(schedule)
  except BaseException:
    index_check.release(checks)
    raise
  if DEBUG >= 1: print(f"realized {len(outs)} output(s) with {GlobalCounters.kernel_count - kernels_before} kernel(s)")
  index_check.read_pending(only_if_over_limit=True)
