"""Layer 3: a BEAM candidate's features for a learned cost model (issue 16), read from the Kernel after its Opts, without lowering or
compiling it. Imports helpers, dtype, ops, codegen/axes, codegen/kernel.

Every feature is a float of a fixed place in one vector (`FEATURE_NAMES`); sizes and counts enter as log2(1 + x):
- the layout: the elements each axis kind spans, its axes, the upcast lanes, a work-group's threads;
- the work: outputs, reduce trips and operations per output point (from the AST), flops, the bytes of every buffer, their ratio;
- the buffers, pooled so that no feature depends on their order: their count, the widest dtype, the share of bytes masked (per-buffer
  slots, and the shares of bytes walked broadcast, contiguous or strided along each kind's innermost axis, made cross-validated
  rankings worse: they let the model tell a few training kernels apart);
- each OptOp: how often it was applied and the log2 of its amounts;
- derived, roofline-like quantities (_derived): work-groups against the target's compute units (waves, how full the last one and
  the device are), each thread's work, loop trips, accumulators and registers, loads per operation of a thread's lanes and of a
  work-group, the share of bytes strided along the fastest thread axis, the vector axis and the innermost loop, local memory used.
"""
from __future__ import annotations
import math
from tinyc.helpers import prod
from tinyc.ops import BufferOps, ConstBuffer, ReduceOps
from tinyc.codegen.axes import LANES, THREADS, AxisKind, OptOps
from tinyc.codegen.kernel import Kernel


def _log(value: float) -> float: return math.log2(1 + max(value, 0))

def _names() -> list[str]:
  names = [f"{kind.name.lower()}_{what}" for kind in AxisKind for what in ("elements", "axes")]
  names += ["upcast_lanes", "threads", "reduces", "nested", "outputs", "reduce_trips", "ops_per_point", "flops", "bytes", "intensity",
            "local_memory", "gpu", "tensor_cores"]
  names += ["buffers", "max_itemsize", "masked_bytes"]
  names += [f"opt_{op.name.lower()}_{what}" for op in OptOps for what in ("count", "amounts")]
  return names + ["groups", "waves", "wave_fill", "device_fill", "thread_work", "thread_trips", "accumulators", "lane_loads_per_op",
                  "group_loads_per_op", "registers", "uncoalesced", "unvectorized", "inner_strided", "local_memory_use", "code_size",
                  "vector_fill", "thread_bytes"]

FEATURE_NAMES = _names()

def features(kernel: Kernel) -> list[float]:
  """The candidate `kernel` (its Opts applied) as len(FEATURE_NAMES) floats."""
  shape = [size if isinstance(size, int) else 1 for size in kernel.full_shape]  # (a symbolic size: BEAM searches none)
  row: list[float] = []
  for kind in AxisKind: row += [_log(prod(shape[axis] for axis in kernel.axes(kind))), float(len(kernel.axes(kind)))]
  reduce_side = [axis for axis in range(len(shape)) if kernel.owners[axis]]
  outputs, trips = prod(size for axis, size in enumerate(shape) if axis not in reduce_side), prod(shape[axis] for axis in reduce_side)
  ops = sum(1 for node in kernel.ast.walk() if node.op not in BufferOps and node.op not in ReduceOps)
  flops = outputs * trips * max(ops, 1)
  sized = [(number, buf.dtype.itemsize * buf.st.real_size()) for number, buf in enumerate(kernel.bufs) if not isinstance(buf, ConstBuffer)]
  total = sum(size for _, size in sized)
  row += [_log(kernel.upcast_size), _log(kernel.local_size), float(len(kernel.reduceops)), float(len(kernel.nested_contractions())),
          _log(outputs), _log(trips), _log(ops), _log(flops), _log(total), math.log2((flops + 1) / (total + 1)),
          _log(kernel.local_memory_bytes), float(kernel.target.has_local), float(bool(kernel.target.tensor_cores))]
  masked = sum(size for number, size in sized if any(view.mask is not None for view in kernel.sts[number].views))
  row += [float(len(sized)), float(max(kernel.bufs[number].dtype.itemsize for number, _ in sized)), masked / max(total, 1)]
  for op in OptOps:  # (an amount of 0, "all of the axis": the layout's features hold its size)
    amounts = [opt.amount for opt in kernel.applied_opts if opt.op is op]
    row += [float(len(amounts)), sum(_log(amount) for amount in amounts)]
  return row + _derived(kernel, shape, outputs * trips, flops, sized)

def _derived(kernel: Kernel, shape: list[int], points: int, flops: int, sized: list[tuple[int, int]]) -> list[float]:
  """Roofline-like quantities that mean the same on any kernel: how the work-groups fill the device, each thread's work and
  registers, the loads per operation of a thread's lanes and of a work-group, the share of bytes read strided."""
  target, size = kernel.target, lambda axes: prod(shape[axis] for axis in axes)  # noqa: E731
  groups, threads = size(kernel.axes(AxisKind.GLOBAL)), max(kernel.local_size, 1)
  units = max(target.compute_units, 1)
  waves = groups / units
  wave_fill = groups / (math.ceil(waves) * units)
  device_fill = min(1.0, groups * threads / (units * 2048)) if target.has_local else 1.0
  thread_points = points / (groups * threads)
  trips = size(kernel.axes(AxisKind.REDUCE, AxisKind.SERIAL)) * (1 if target.has_local else groups)
  accumulators = size(kernel.axes(AxisKind.UPCAST, AxisKind.FRAGMENT)) * max(len(kernel.reduceops), 1)
  lane_axes, group_axes = kernel.axes(*LANES, AxisKind.TC), kernel.axes(*THREADS, AxisKind.LANE, *LANES, AxisKind.TC)
  fastest = (kernel.axes(AxisKind.LANE, AxisKind.WARP) or kernel.axes(AxisKind.LOCAL, AxisKind.GROUP))[-1:]
  vector = kernel.axes(AxisKind.UPCAST, AxisKind.UNROLL)[-1:]
  inner = (kernel.axes(AxisKind.REDUCE) or kernel.axes(AxisKind.GLOBAL))[-1:]
  lane_loads = group_loads = 0
  uncoalesced = unvectorized = inner_strided = 0.0
  total = sum(bytes_ for _, bytes_ in sized) or 1
  for number, bytes_ in sized:
    strides = kernel.sts[number].real_strides(ignore_valid=True)
    spanned = lambda axes: prod(shape[axis] for axis in axes if strides[axis] != 0)  # noqa: E731
    if number >= kernel.n_outputs: lane_loads, group_loads = lane_loads + spanned(lane_axes), group_loads + spanned(group_axes)
    strided = lambda axes: bool(axes) and strides[axes[0]] not in (0, 1)  # noqa: E731
    uncoalesced += bytes_ / total * strided(fastest)
    unvectorized += bytes_ / total * strided(vector)
    inner_strided += bytes_ / total * strided(inner)
  lanes, group_lanes = size(lane_axes), size(group_axes)
  upcast_lanes = size(kernel.axes(AxisKind.UPCAST, AxisKind.UNROLL))
  return [_log(groups), math.log2(waves + 1e-3), wave_fill, device_fill, _log(thread_points * flops / max(points, 1)), _log(trips),
          _log(accumulators), math.log2((lane_loads + 1) / lanes), math.log2((group_loads + 1) / group_lanes), _log(accumulators + lane_loads),
          uncoalesced, unvectorized, inner_strided, kernel.local_memory_bytes / target.local_memory_bytes,
          _log(kernel.upcast_size * flops / max(points, 1)),
          math.log2(upcast_lanes / target.vector_lanes), _log(total / (groups * threads))]
