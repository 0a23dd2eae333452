"""Layer 3: a BEAM candidate's features for a learned cost model (issue 16), read from the Kernel after its Opts, without lowering or
compiling it. Imports helpers, dtype, ops, codegen/axes, codegen/kernel.

Every feature is a float of a fixed place in one vector (`FEATURE_NAMES`); sizes and counts enter as log2(1 + x):
- the layout: the elements each axis kind spans, its axes, the upcast lanes, a work-group's threads;
- the work: outputs, reduce trips and operations per output point (from the AST), flops, the bytes of every buffer, their ratio;
- each of the first MAX_BUFFERS buffers (outputs first): its itemsize, bytes, mask, and how it walks the innermost axis of each kind
  (broadcast, contiguous, strided: what decides vector loads, reuse and cache lines);
- each OptOp: how often it was applied and the log2 of its amounts.
"""
from __future__ import annotations
import math
from tinyc.helpers import prod
from tinyc.ops import BufferOps, ConstBuffer, ReduceOps
from tinyc.codegen.axes import AxisKind, OptOps
from tinyc.codegen.kernel import Kernel

MAX_BUFFERS = 6
WALKED_KINDS = (AxisKind.GLOBAL, AxisKind.LOCAL, AxisKind.UPCAST, AxisKind.GROUP, AxisKind.REDUCE, AxisKind.UNROLL)

def _log(value: float) -> float: return math.log2(1 + max(value, 0))

def _names() -> list[str]:
  names = [f"{kind.name.lower()}_{what}" for kind in AxisKind for what in ("elements", "axes")]
  names += ["upcast_lanes", "threads", "reduces", "nested", "outputs", "reduce_trips", "ops_per_point", "flops", "bytes", "intensity",
            "local_memory", "gpu", "tensor_cores"]
  for number in range(MAX_BUFFERS):
    names += [f"buf{number}_{what}" for what in ("present", "itemsize", "bytes", "masked")]
    names += [f"buf{number}_{kind.name.lower()}_{walk}" for kind in WALKED_KINDS for walk in ("broadcast", "contiguous", "strided")]
  return names + [f"opt_{op.name.lower()}_{what}" for op in OptOps for what in ("count", "amounts")]

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
  for number in range(MAX_BUFFERS):
    if number >= len(sized):
      row += [0.0] * (4 + 3 * len(WALKED_KINDS))
      continue
    index, size = sized[number]
    st, strides = kernel.sts[index], kernel.sts[index].real_strides(ignore_valid=True)
    row += [1.0, float(kernel.bufs[index].dtype.itemsize), _log(size), float(any(view.mask is not None for view in st.views))]
    for kind in WALKED_KINDS:
      innermost = kernel.axes(kind)[-1:]
      stride = strides[innermost[0]] if innermost else None
      row += [float(stride == 0), float(stride == 1), float(bool(innermost) and stride not in (0, 1))]
  for op in OptOps:  # (an amount of 0, "all of the axis": the layout's features hold its size)
    amounts = [opt.amount for opt in kernel.applied_opts if opt.op is op]
    row += [float(len(amounts)), sum(_log(amount) for amount in amounts)]
  return row
