"""Layer 3: a CPU reduce's lanes packed into vector UOps, which the LLVM renderer emits as LLVM vectors, and its loads prefetched.
Imports dtype, ops, shape/, codegen/uops, codegen/kernel. Left to LLVM's SLP vectorizer, which packs lanes by the stores they
reach, a register tile stored across the axis its loads are contiguous along (a.T @ b.T: 16 rows of a.T x 8 stored columns)
became scalar multiplies, 0.08x numpy."""
from __future__ import annotations
import functools
from typing import TYPE_CHECKING, Any, Callable, cast
from tinyc.dtype import INTS, DType, dtypes
from tinyc.helpers import prod
from tinyc.ops import BinaryOps, BufferOps, LazyOp, ReduceOps
from tinyc.shape.symbolic import Node, NumNode, simplify_given_valid
from tinyc.codegen.axes import AxisKind
from tinyc.codegen.uops import PYTHON_ALU, UOp, UOps
if TYPE_CHECKING:
  from tinyc.codegen.kernel import Kernel
  from tinyc.codegen.linearizer import Address, Linearizer
  from tinyc.shape.shapetracker import ShapeTracker

# what becomes vector ops: not 16-bit floats (float64 -> float16 has no one instruction), nor integer division (its guards are scalar)
PACKED_DTYPES = {dtypes.bool, dtypes.float32, dtypes.float64, *INTS}
PACKED_ALU = set(PYTHON_ALU) - {BinaryOps.IDIV, BinaryOps.MOD}
LOADED_DTYPES = PACKED_DTYPES - {dtypes.bool}  # vector loads: a bool is a bit in registers, a byte in memory

def packed_axis(kernel: Kernel, reduceop: LazyOp, key_axes: list[int], unrolled: list[int] | None = None) -> int | None:
  """The key axis (one an accumulator has lanes along) whose lanes the reduce accumulates as vectors: one along which an input it
  reads is contiguous, so its loads are vector loads; of those the one the output is contiguous along (its stores too), else the
  widest (the later of equals): a.T @ b at 1000 packed along its 8 stored columns ran at 0.31x numpy, along a.T's 10 rows 0.27x.
  Where no key axis packs, one of `unrolled` (the reduce's own lanes) that an input is contiguous along: each accumulator is then a
  vector of partial sums, which horizontal() adds up after the loop."""
  if reduceop.dtype not in PACKED_DTYPES: return None
  if (rows := rows_axis(kernel, key_axes)) is not None: return rows
  inputs = [kernel.bufs.index(node.arg) for node in reduceop.src[0].walk() if node.op is BufferOps.LOAD]
  def stride(number: int, axis: int) -> int | None: return kernel.sts[number].real_strides(ignore_valid=True)[axis]
  contiguous = [axis for axis in key_axes if any(stride(number, axis) == 1 for number in inputs)]
  if contiguous: return max(reversed(contiguous), key=lambda axis: (stride(0, axis) == 1, kernel.full_shape[axis]))
  powers = [axis for axis in unrolled or [] if (size := kernel.full_shape[axis]) > 1 and size & (size - 1) == 0]  # (halves all the way)
  return next((axis for axis in powers if any(stride(number, axis) == 1 for number in inputs)), None)

def rows_axis(kernel: Kernel, key_axes: list[int]) -> int | None:
  """The key axis of rows in a vector register's lanes, if any: an UPCAST of that many lanes or more that the kernel's nested
  contractions vary along (attention's queries, nested_plan.rows_in_lanes). Every reduce of the kernel packs along it, online
  softmax's max and sums too: a key's scores, probabilities and rescaling are one vector of rows."""
  nested_rows = set().union(*[kernel.value_axes(kernel.reduceops[number]) for number in kernel.nested_contractions()])
  return next((axis for axis in reversed(key_axes) if kernel.kinds[axis] is AxisKind.UPCAST and kernel.full_shape[axis] >= kernel.target.vector_lanes
               and axis in nested_rows), None)

def packed_rows(lin: Linearizer, lane_axes: list[int], sizes: list[int], values: list[UOp]) -> list[UOp]:
  """A CPU store's values (one a lane, laid out as `sizes`) computed as vectors along the rows axis (rows_axis), each lane then read
  from its vector: after a rows-in-lanes kernel's reduces, whose results are lanes of vector accumulators, each value was scalar
  ops on them, as stored (a row's features are its neighbours in memory): attention's output divided by its sum was 512 divides
  of one float, dk times the scale 512 multiplies, each kernel's 16 rows of 32 features."""
  if (rows := rows_axis(lin.kernel, lane_axes)) is None: return values
  position = lane_axes.index(rows)
  width, stride, repacked = sizes[position], prod(sizes[position + 1:]), list(values)
  for first in (lane for lane in range(len(values)) if (lane // stride) % width == 0):
    group = [first + number * stride for number in range(width)]
    if (vector := pack(lin.uop, [values[lane] for lane in group])).op is UOps.VECTORIZE: continue  # (nothing to compute as vectors)
    for number, lane in enumerate(group): repacked[lane] = lin.uop(UOps.GEP, values[lane].dtype, (vector,), number)
  return repacked

def horizontal(lin: Linearizer, op: BinaryOps, vectors: list[UOp]) -> list[UOp]:
  """Each vector's lanes folded by `op` into one value, for many vectors at once: pairs of vectors of r keys each become one of 2r
  keys (the first halves of each key's lanes against the second halves: two shuffles and one op), up to a vector's lanes of keys,
  then each vector is halved in place until a key has one lane. 16 vectors of 16 lanes: 15 ops (and 30 shuffles); one at a time, 64."""
  width, scalar = cast(DType, vectors[0].dtype).count, cast(DType, vectors[0].dtype).scalar()
  def fold(parts: list[tuple[UOp, int]], size: int) -> UOp:  # (vector, keys) parts of `size` lanes: each key's first half op its second
    halves = [[(vector, key * (size // keys) + half * (size // keys // 2) + lane) for vector, keys in parts for key in range(keys)
               for lane in range(size // keys // 2)] for half in (0, 1)]
    low, high = ([lin.uop(UOps.GEP, scalar, (vector,), lane) for vector, lane in half] for half in halves)
    return lin.alu(op, scalar, low[0], high[0]) if len(low) == 1 else \
      lin.alu(op, scalar.vec(len(low)), *(lin.uop(UOps.VECTORIZE, scalar.vec(len(low)), tuple(lanes)) for lanes in (low, high)))
  results: list[UOp] = []
  for start in range(0, len(vectors), width):
    items = [(vector, 1) for vector in vectors[start:start + width]]  # (a vector, how many keys' lanes it holds)
    while any(a[1] == b[1] for a, b in zip(items, items[1:])):  # neighbours holding as many keys merge, in order
      merged, number = [], 0
      while number < len(items):
        together = len(pair := items[number:number + 2]) == 2 and pair[0][1] == pair[1][1]
        merged.append((fold(pair, width), 2 * pair[0][1]) if together else pair[0])
        number += 2 if together else 1
      items = merged
    for vector, keys in items:
      for size in (width >> shift for shift in range(width.bit_length()) if width >> shift > keys): vector = fold([(vector, keys)], size)
      results.extend([vector] if keys == 1 else [lin.uop(UOps.GEP, scalar, (vector,), key) for key in range(keys)])
  return results

CPU_REDUCE_CHAINS = 4

def chains(lin: Linearizer, op: BinaryOps, values: list[UOp]) -> list[UOp]:
  """A CPU reduce's steps where it has no loop (all of it unrolled: attention's scores over the head dim) folded in CPU_REDUCE_CHAINS
  independent chains: one chain's adds each wait for the last (4 cycles an FMA) and a core has two FMA units. Each chain ends in a
  CAST to its own dtype, which the LLVM renderer makes an arithmetic fence: reassociation (every float add may) folds the chains
  back into one. Causal SDPA on a 2-core AVX-512 guest, dq's kernel (two nested reduces), ms: (8,4,256,32) 2.9-3.1 -> 2.6-2.7,
  (1,6,384,80) 3.3-3.5 -> 2.8; dk-and-dv's unchanged (4.0)."""
  def fold(chain: list[UOp]) -> UOp:
    value = functools.reduce(lambda a, b: lin.alu(op, cast(DType, a.dtype), a, b), chain)
    fenced = len(values) > CPU_REDUCE_CHAINS and dtypes.is_float(cast(DType, value.dtype).scalar())
    return lin.uop(UOps.CAST, value.dtype, (value,)) if fenced else value
  return [fold(values[start::CPU_REDUCE_CHAINS]) for start in range(min(CPU_REDUCE_CHAINS, len(values)))]

def accumulate_steps(lin: Linearizer, op: ReduceOps, steps: list[tuple[UOp, list[UOp]]], unlooped: bool, fresh: bool) -> None:
  """Each (accumulator, lanes) step of a reduce's trip added to its accumulator, in order; where the reduce has no loop (`unlooped`),
  each accumulator's steps in chains first; with `fresh`, each step's broadcast elements read again (fresh_operands)."""
  folds: dict[UOp, list[UOp]] = {}
  for acc, lanes in steps:
    value = pack(lin.uop, lanes)
    folds.setdefault(acc, []).append(fresh_operands(lin, value) if fresh else value)
  alu = BinaryOps.ADD if op is ReduceOps.SUM else BinaryOps.MAX
  for acc, values in folds.items():
    for value in chains(lin, alu, values) if unlooped else values: lin.accumulate(op, acc, value)

def fresh_operands(lin: Linearizer, value: UOp) -> UOp:
  """A reduce step's op (a product) with each operand that is an element of memory broadcast to every lane read again, by a load of
  its own (volatile: LLVM merges equal loads): a CPU rows-in-lanes kernel's backward uses each element of a row twice (q's for the
  scores and for dk, dO's for dO.v and for dv), and LLVM kept each broadcast in a register from its first use to its second, then
  spilled them (dk's and dv's kernel, 4 queries unrolled: 256 broadcasts and 384 stores a trip). Read again, each folds into its
  FMA as a broadcast memory operand. The op is made anew, not shared, so what else is computed from the element is not made twice."""
  def broadcast(src: UOp) -> bool:
    return src.op is UOps.VECTORIZE and len(set(src.src)) == 1 and src.src[0].op is UOps.LOAD and src.src[0].src[0].op is UOps.DEFINE_GLOBAL
  if value.op is not UOps.ALU or not any(broadcast(src) for src in value.src): return value
  def fresh(src: UOp) -> UOp:
    load = lin.uop(UOps.LOAD, src.src[0].dtype, src.src[0].src, "volatile", pure=False)
    return lin.uop(UOps.VECTORIZE, src.dtype, (load,) * len(src.src), None, pure=False)
  return lin.uop(UOps.ALU, value.dtype, tuple(fresh(src) if broadcast(src) else src for src in value.src), value.arg, pure=False)

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

def gated_rows(dtype: DType, sizes: list[int], addresses: list[Address]) -> list[tuple[list[int], Node, Node]]:
  """On a CPU, the rows of the last lane axis as vector loads where each row's lanes are neighbours under one gate, the same for all
  of them (a cat's lanes, each row from one of its inputs): (lanes, first index, gate). The lanes' gated scalar loads became a gather
  each (dq, dk and dv put back in a row, 2048 x 384: 6 vgatherdps and 201 instructions for 32 values)."""
  width = sizes[-1] if sizes else 1
  if dtype not in LOADED_DTYPES or width < 4: return []
  rows = [list(range(first, first + width)) for first in range(0, len(addresses), width)]
  def row(lanes: list[int]) -> tuple[list[int], Node, Node] | None:
    valid = addresses[lanes[0]][1]
    if valid.max == 0 or any(addresses[lane][1] != valid for lane in lanes): return None
    starts = [simplify_given_valid(addresses[lane][0], valid) for lane in lanes]
    return (lanes, starts[0], valid) if all(start - starts[0] == number for number, start in enumerate(starts)) else None
  found = [row(lanes) for lanes in rows]
  return [group for group in found if group is not None] if all(group is not None for group in found) else []

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
