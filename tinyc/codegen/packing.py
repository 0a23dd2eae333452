"""Layer 3: a CPU reduce's lanes packed into vector UOps, which the LLVM renderer emits as LLVM vectors, and its loads prefetched.
Imports dtype, ops, shape/, codegen/uops, codegen/kernel. Left to LLVM's SLP vectorizer, which packs lanes by the stores they
reach, a register tile stored across the axis its loads are contiguous along (a.T @ b.T: 16 rows of a.T x 8 stored columns)
became scalar multiplies, 0.08x numpy."""
from __future__ import annotations
from typing import TYPE_CHECKING, Any, Callable, cast
from tinyc.dtype import INTS, DType, dtypes
from tinyc.ops import BinaryOps, BufferOps, LazyOp
from tinyc.shape.symbolic import NumNode
from tinyc.codegen.uops import PYTHON_ALU, UOp, UOps
if TYPE_CHECKING:
  from tinyc.codegen.kernel import Kernel
  from tinyc.codegen.linearizer import Address, Linearizer
  from tinyc.shape.shapetracker import ShapeTracker

# what becomes vector ops: not 16-bit floats (float64 -> float16 has no one instruction), nor integer division (its guards are scalar)
PACKED_DTYPES = {dtypes.bool, dtypes.float32, dtypes.float64, *INTS}
PACKED_ALU = set(PYTHON_ALU) - {BinaryOps.IDIV, BinaryOps.MOD}
LOADED_DTYPES = PACKED_DTYPES - {dtypes.bool}  # vector loads: a bool is a bit in registers, a byte in memory

def packed_axis(kernel: Kernel, reduceop: LazyOp, key_axes: list[int]) -> int | None:
  """The key axis (one an accumulator has lanes along) whose lanes the reduce accumulates as vectors: one along which an input it
  reads is contiguous, so its loads are vector loads; of those the one the output is contiguous along (its stores too), else the
  widest (the later of equals): a.T @ b at 1000 packed along its 8 stored columns ran at 0.31x numpy, along a.T's 10 rows 0.27x."""
  if reduceop.dtype not in PACKED_DTYPES: return None
  inputs = [kernel.bufs.index(node.arg) for node in reduceop.src[0].walk() if node.op is BufferOps.LOAD]
  def stride(number: int, axis: int) -> int | None: return kernel.sts[number].real_strides(ignore_valid=True)[axis]
  contiguous = [axis for axis in key_axes if any(stride(number, axis) == 1 for number in inputs)]
  return max(reversed(contiguous), key=lambda axis: (stride(0, axis) == 1, kernel.full_shape[axis]), default=None)

def pack(make: Callable[[UOps, DType, tuple[UOp, ...], Any], UOp], lanes: list[UOp]) -> UOp:
  """These scalar values as one vector UOp (`make` makes a UOp): where every lane is the same op of packable values, that op on the
  packed sources; the lanes of one vector load, in order, that load; else a vector of the lanes (a broadcast, a gather)."""
  first, dtype = lanes[0], cast(DType, lanes[0].dtype)
  if len(lanes) == 1: return first
  if first.op is UOps.GEP and cast(DType, first.src[0].dtype).count == len(lanes) and all(
      lane.op is UOps.GEP and lane.src == first.src and lane.arg == number for number, lane in enumerate(lanes)):
    return first.src[0]
  if not all(lane is first for lane in lanes) and all(lane.op is first.op and lane.arg == first.arg and lane.dtype == dtype for lane in lanes) \
     and (first.op is UOps.CAST or first.op is UOps.ALU and first.arg in PACKED_ALU) and all(v.dtype in PACKED_DTYPES for v in (first, *first.src)):
    return make(first.op, dtype.vec(len(lanes)), tuple(pack(make, list(sources)) for sources in zip(*[lane.src for lane in lanes])), first.arg)
  return make(UOps.VECTORIZE, dtype.vec(len(lanes)), tuple(lanes), None)

# a CPU load that moves this many bytes or more a trip of its reduce loop is prefetched this many trips ahead (prefetch).
# x.T @ grad of 2048 tokens into 128 x 512 on this 2-core AVX-512 guest: its grad rows 2 KB apart, 2.40-2.61 -> 1.82-1.98 ms (8 trips;
# 4: 2.14, 16: 1.88-1.98, 32: 2.44); x's rows 512 B apart gained nothing prefetched (the hardware follows them within a page)
PREFETCH_BYTES, PREFETCH_TRIPS = 1024, 8

def prefetch(lin: Linearizer, memory: UOp, st: ShapeTracker, addresses: list[Address], itemsize: int) -> None:
  """On a CPU, where a load in a reduce's innermost loop moves PREFETCH_BYTES or more a trip, ask for each of its cache lines
  PREFETCH_TRIPS trips ahead: the hardware's prefetchers stop at a page's end, which rows 2 KB apart cross every other trip."""
  if not lin._open_loops or not (loop := lin._open_loops[-1]).arg.name.startswith("ridx"): return
  stride = st.real_strides()[int(loop.arg.name[4:].rstrip("_"))]
  if not isinstance(stride, int) or abs(stride) * itemsize < PREFETCH_BYTES: return
  lines: set[Any] = set()
  for index, valid in addresses:
    offset = index - addresses[0][0]
    if valid.max == 0 or (line := offset.b * itemsize // 64 if isinstance(offset, NumNode) else index) in lines: continue
    lines.add(line)
    lin.uop(UOps.PREFETCH, None, (memory, lin.index(index + PREFETCH_TRIPS * stride)), pure=False)
