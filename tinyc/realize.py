"""Layer 5: runs a schedule: allocates each output, performs load ops, and launches each kernel's compiled program.
Imports helpers, dtype, ops, device, beam, lazy, schedule, index_check.
"""
from __future__ import annotations
from typing import Callable
from tinyc.helpers import BEAM, DEBUG, GlobalCounters, prod
from tinyc.ops import LazyOp, LoadOps, ScheduleItem
from tinyc.device import Buffer, Device, Program, copy_buffer
from tinyc.beam import beam_opts
from tinyc.lazy import LazyBuffer
from tinyc.schedule import create_schedule
from tinyc import index_check

Step = tuple[Callable[[list[Buffer]], None], list[Buffer]]  # something that ran (a program or a copy) and its buffers
capturing: list[list[Step]] = []  # while TinyJit captures, every step run is also appended to capturing[-1]

def run_schedule(schedule: list[ScheduleItem]) -> None:
  for item in schedule:
    out = item.out
    out.realized = out.srcs[1].realized if out.op is LoadOps.ASSIGN else Buffer(out.device, prod(out.shape), out.dtype)
    if item.ast.op is LoadOps.EMPTY: pass
    elif item.ast.op is LoadOps.COPY: _run(copy_buffer, [out.realized, item.inputs[0].realized])
    else: _run(program_for(item.ast, out.device), [out.realized] + [src.realized for src in item.inputs])
    out.srcs = ()  # the value is stored: let the graph that made it be freed

def program_for(ast: LazyOp, device_name: str) -> Program:
  """The kernel's program: with BEAM=n the Opts a search on the device chose (cached), else the hand-coded heuristic's."""
  device = Device[device_name]
  return device.get_program(ast, beam_opts(device, ast) if BEAM >= 1 and device.compile_binary is not None else None)

def _run(step: Callable[[list[Buffer]], None], buffers: list[Buffer | None]) -> None:
  assert all(buf is not None for buf in buffers), f"{step} reads an unrealized input"
  step(buffers)  # type: ignore[arg-type]
  if capturing: capturing[-1].append((step, buffers))  # type: ignore[arg-type]

def realize(outs: list[LazyBuffer]) -> None:
  """Compute every output that is not yet realized, fusing the graph under them into kernels. The index checks made since the last
  realize are computed in the same schedule (index_check.py)."""
  checks = index_check.claim()
  try:
    schedule = create_schedule(outs + [check.extremes for check in checks])
    if not schedule: return
    kernels_before = GlobalCounters.kernel_count
    run_schedule(schedule)
  except BaseException:
    index_check.release(checks)
    raise
  if DEBUG >= 1: print(f"realized {len(outs)} output(s) with {GlobalCounters.kernel_count - kernels_before} kernel(s)")
  index_check.read_pending(only_if_over_limit=True)
