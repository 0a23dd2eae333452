"""Layer 5: runs a schedule: allocates each output, performs load ops, and launches each kernel's compiled program.
Imports helpers, dtype, ops, device, lazy, schedule.
"""
from __future__ import annotations
from tinyc.helpers import DEBUG, GlobalCounters, prod
from tinyc.ops import LoadOps, ScheduleItem
from tinyc.device import Buffer, Device
from tinyc.lazy import LazyBuffer
from tinyc.schedule import create_schedule

def run_schedule(schedule: list[ScheduleItem]) -> None:
  for item in schedule:
    out = item.out
    out.realized = out.srcs[1].realized if out.op is LoadOps.ASSIGN else Buffer(out.device, prod(out.shape), out.dtype)
    if item.ast.op is LoadOps.COPY:
      source = item.inputs[0].realized
      assert source is not None, f"copy from an unrealized buffer {item.inputs[0]}"
      out.realized.copyin(source.numpy().view(source.dtype.np) if source.dtype.np is not None else source.numpy())
    elif item.ast.op is not LoadOps.EMPTY:
      program = Device[out.device].get_program(item.ast)
      buffers = [out.realized] + [src.realized for src in item.inputs]
      assert all(buf is not None for buf in buffers), f"kernel {program.name} reads an unrealized input"
      program(buffers)  # type: ignore[arg-type]
    out.srcs = ()  # the value is stored: let the graph that made it be freed

def realize(outs: list[LazyBuffer]) -> None:
  """Compute every output that is not yet realized, fusing the graph under them into kernels."""
  schedule = create_schedule(outs)
  if not schedule: return
  kernels_before = GlobalCounters.kernel_count
  run_schedule(schedule)
  if DEBUG >= 1: print(f"realized {len(outs)} output(s) with {GlobalCounters.kernel_count - kernels_before} kernel(s)")
