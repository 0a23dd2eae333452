"""Layer 3: hand_coded_optimizations, the default Opts for a kernel when no search is asked for. Imports helpers, ops,
codegen/kernel.

CPUs. Measured on this project's CPUs (AVX-512, matmul 512, one core): the naive loop nest runs at 1.5 GFLOP/s when the reduce
walks a buffer with a stride (a @ b) and 57 GFLOP/s when every buffer is contiguous along it (a @ b.T: LLVM vectorizes
the reduce loop). Upcasting the output's contiguous axis by 16 and a broadcast axis by 4 lifts a @ b to 79 GFLOP/s (the
16 lanes become vector FMAs, each load of the other operand is reused 16 times); a 4x4 tile of two broadcast axes lifts
a @ b.T to 180 GFLOP/s (on a 2-core Zen 4 guest, one thread against numpy's one, at 1024: 93 GFLOP/s, 0.94x numpy, where
16 lanes of one axis ran 28, 0.29x).
Where no input is contiguous along the output's contiguous axis (a.T @ b.T), the same tile goes along an axis an input is
contiguous along (a.T's rows) and a broadcast axis (the stored columns): 16 x 8 lanes at 1024, 8 x 10 at 1000. LLVM's SLP
vectorizer packs lanes by the stores they reach and made such a tile scalar multiplies (16 x 8: 0.08x numpy at 1024), so the
linearizer packs a CPU reduce's lanes into vectors itself (codegen/packing.py): the inner loop is one vector load of a.T and 8
FMAs with a broadcast element of b. Measured with bench_core's layout table on the 2-core Zen 4 guest (two threads against numpy's
two): a.T @ b.T at 1024 from 0.27x (51 GFLOP/s; 64 lanes along a.T's rows alone) to 0.79x (145), at 1000 from 0.25x (51) to 0.72x
(143), beside a @ b's 0.74x and 0.69x; the CNN train step 17-20 -> 13-14 ms (its conv input gradient is packed too). A 32 x 8 tile
(16 registers of accumulators) ran a @ b at 0.47x and a.T @ b.T at 0.49-0.55x against 0.38x for 16 x 8 in a busier hour: not
taken yet, untried on conv and AVX2.
The tile of a broadcast axis reaches 8 vector registers of accumulators (`vector_lanes`, 16 with AVX-512): measured on the
2-core Zen 4 guest against numpy, 16 x 8 lanes lift a @ b at 1024 from 0.39x to 0.70x and a.T @ b from 0.27x to 0.61x (16 x 4
before), 8 x 10 lanes a @ b at 1000 from 0.58x to 0.78x; the CNN train step 30.5 -> 25.0 ms; compiling a matmul takes 0.14 s
instead of 0.08. An output axis that 16, 8 and 4 do not divide and too long to take whole (more than 16) gets 2 lanes rather
than none: the input gradient of a 3x3 conv 26 pixels wide (the CNN's, 128 x 8 x 26 x 26 from 16 channels) 42 -> 9 ms.

GPUs (the kernel's target has work-groups). A thread per output with a serial loop leaves most of the GPU idle when outputs
are few, and walks memory uncoalesced when each thread reads its own row: a long reduce into fewer outputs than the GPU has
threads is split across a work-group (GROUP: neighbouring threads read neighbouring elements), after an UNROLL of 4 so each
thread reads 16-byte vectors. So is each row of a row kernel (softmax), whose threads then share the row's store. Matmul and
conv reuse loads: a 4x4 register tile of broadcast axes (each load feeds 4 FMAs), then a 16x16 work-group tile so
neighbouring threads share cache lines. Elementwise kernels get 4 lanes along their contiguous axis, for 16-byte loads and
stores, and the runtime's work-group size.
"""
from __future__ import annotations
from typing import Callable
from tinyc.dtype import dtypes
from tinyc.helpers import ALLOW_TF32, NOOPT, all_int, prod
from tinyc.ops import MemBuffer
from tinyc.codegen.kernel import AxisKind, Kernel, Opt, OptOps
from tinyc.codegen.nested_plan import nested_plan, try_opt as _try, try_upcast as _try_upcast

def hand_coded_optimizations(kernel: Kernel) -> list[Opt]:
  """Apply the heuristic's Opts to `kernel` and return them (none with NOOPT=1, nor for a kernel with a symbolic axis: its rules compare
  sizes, which a symbolic axis does not have)."""
  if NOOPT or not all_int(kernel.full_shape): return []
  inputs = [i for i, buf in enumerate(kernel.bufs) if isinstance(buf, MemBuffer) and buf.idx != 0]
  if not kernel.axes(AxisKind.REDUCE): _upcast_pieces(kernel)
  if nested_plan(kernel): return kernel.applied_opts
  if kernel.target.has_local: _gpu_optimizations(kernel, inputs)
  elif kernel.axes(AxisKind.REDUCE):
    _cpu_register_tile(kernel, inputs)
    _cpu_block(kernel, inputs)
  elif not _transpose_tile(kernel, inputs): _gathered_lanes(kernel, inputs)  # (other elementwise loops are vectorized by LLVM as they are)
  return kernel.applied_opts

PIECE_LANES = 49  # lanes of small masked axes upcast whole: Winograd's 6 x 6 transform tiles (36), each lane a different sum

def _upcast_pieces(kernel: Kernel) -> None:
  """An elementwise kernel's small axes along which an input (a constant too) is masked, leading ones first, upcast whole up to
  PIECE_LANES lanes: along a cat or stack every element is a different expression, each behind its own mask, so a loop over such
  an axis computes every piece and keeps one; upcast, each lane's masks are decided when the kernel is built and it computes only
  its own piece."""
  pieces: list[int] = []
  for axis in kernel.axes(AxisKind.GLOBAL):
    size = kernel.full_shape[axis]
    if size <= 7 and prod(kernel.full_shape[a] for a in pieces) * size <= PIECE_LANES and any(st.axis_is_masked(axis) for st in kernel.sts):
      pieces.append(axis)
  for axis in reversed(pieces): _try(kernel, Opt(OptOps.UPCAST, axis, 0))  # the last first: the axes before it keep their numbers

# input rows a CPU transposing copy's inner loop may walk before a block of it starts over: each is a cache line and a page of its
# own (the TLB's second level holds 1.5-2K pages, and no prefetcher follows the walk). Measured on an AVX-512 core, 8 x 8 lanes,
# blocks of 8-256 rows against none: 2000 x 1536 5.0 -> 2.2-2.3 ms (512 rows 3.2), 4096 x 1024 13.2 -> 3.3, 1024 x 1024 0.89 -> 0.65
TRANSPOSE_BLOCK_ROWS = 256

def _transpose_tile(kernel: Kernel, inputs: list[int]) -> bool:
  """A copy across axes (a transpose) walks its input down a column: a tile of lanes of the two axes, so each thread reads along the
  input's contiguous axis and writes along the output's. On a CPU 8 x 8 lanes, the walk blocked (above): on an AVX-512 core a 1024 x
  1024 transpose 7.3 ms -> 0.65 (rows 4 KB apart share cache sets, and no prefetcher follows them), 1000: 0.66 -> 0.54. On a GPU 4 x 4
  lanes (16-byte loads and stores) in work-groups of 8 x 8 threads, so a warp reads and writes whole 32-byte sectors: on the H200
  4096 x 4096 138 us -> 44 (970 -> 3060 GB/s; torch's copy 1060), 1024 x 8192 70 -> 25, 3000 x 3000 76 -> 32."""
  if len(global_axes := kernel.axes(AxisKind.GLOBAL)) < 2 or _strides(kernel, 0)[out := global_axes[-1]] != 1: return False
  across = [axis for axis in global_axes[:-1] for i in inputs if _strides(kernel, i)[axis] == 1 and (_strides(kernel, i)[out] or 0) >= 16]
  amounts = (4,) if kernel.target.has_local else (8, 4, 2)
  if not across or _try_upcast(kernel, across[-1:], amounts) is None: return False
  lanes = kernel.applied_opts[-1].amount if _try_upcast(kernel, [out], amounts) is not None else 1
  if not kernel.target.has_local:
    _block(kernel, out, lambda amount: amount * lanes <= TRANSPOSE_BLOCK_ROWS)
    return True
  for axis in (across[-1], out):  # the output's axis innermost: launch dimension 0
    if divisors := [a for a in range(2, 9) if kernel.full_shape[axis] % a == 0]: _try(kernel, Opt(OptOps.LOCAL, axis, divisors[-1]))
  return True

def _gathered_lanes(kernel: Kernel, inputs: list[int]) -> None:
  """A CPU elementwise kernel's output axis that an input reads with no one stride (a permute under a reshape) upcast by two vector
  registers' lanes, so each lane's index folds to a run's start plus the lane and LLVM packs the loads (its loop vectorizer gave up on
  the division and remainder). The GPT bench's cat of dq, dk and dv (2048 x 384, AVX2): 7.8 -> 1.5 ms; by 8 lanes 2.7, by 32 2.9."""
  if (global_axes := kernel.axes(AxisKind.GLOBAL)) and _strides(kernel, 0)[out := global_axes[-1]] == 1 and \
     any(_strides(kernel, i)[out] is None for i in inputs):
    _try_upcast(kernel, [out], (2 * kernel.target.vector_lanes, kernel.target.vector_lanes, 4))

def _strides(kernel: Kernel, number: int) -> tuple[int | None, ...]:
  """Buffer `number`'s strides ignoring masks: a padded input still walks memory with these strides where it is valid."""
  return kernel.sts[number].real_strides(ignore_valid=True)

CPU_STREAMS = 16  # rows of memory a CPU reduce loop tiled across broadcast axes may walk at once

def _cpu_register_tile(kernel: Kernel, inputs: list[int]) -> None:
  innermost_reduce = kernel.axes(AxisKind.REDUCE)[-1]
  if kernel.full_shape[innermost_reduce] >= 16 and all(_strides(kernel, i)[innermost_reduce] in (0, 1) for i in inputs):
    # LLVM vectorizes a long contiguous reduce loop by itself: tile two different broadcast axes for reuse. Not where the reduce loop
    # would then walk more than CPU_STREAMS rows of memory at once (each input's lanes along the tiled axes it varies along): a matmul's 4 x 4 tile
    # walks 8, but a layernorm of the GPT's residual stream (9 inputs, the position embedding broadcast along the batch) 144, and
    # its forward and backward ran 3.4-6.1 ms tiled against 1.9-4.4 untiled, 1.4-1.9x (2-core guest, runs interleaved). Each lane is
    # a vector accumulator here: 4 x (vector_lanes / 4) of them, half the vector registers (AVX2 16, AVX-512 32). 4 x 4 on AVX2 spilled:
    # a @ b.T 2048 x 512 x 128 (a linear layer's forward) 62 -> 103 GFLOP/s with 4 x 2, numpy 127 (2-core AVX2 guest)
    _broadcast_tile(kernel, inputs, max(kernel.target.vector_lanes // 4, 1))
    # a tile of 8 or more accumulators takes the reduce a vector register's lanes a trip (UNROLL), each accumulator a vector of partial
    # sums that packing.horizontal adds up for all of them at once: LLVM's own vectorizing added up each alone (4 shuffles and adds
    # a vector); a linear layer's forward x @ W.T 2048 x 128 x 512 (2-core AVX-512 guest, alternating) 2.94-3.19 -> 2.49-2.72 ms
    if kernel.upcast_size >= 8 and kernel.full_shape[innermost_reduce] % kernel.target.vector_lanes == 0:
      _try(kernel, Opt(OptOps.UNROLL, len(kernel.axes(AxisKind.REDUCE)) - 1, kernel.target.vector_lanes))
    return
  # vectorize across the output's contiguous axis, then reuse each vector load across a tile of an axis it is broadcast along.
  # Where no input runs along the output, across an axis that an input walking the reduce with a stride is contiguous along
  # instead (the linearizer packs the reduce's lanes into vectors along it)
  contiguous = [axis for axis in kernel.axes(AxisKind.GLOBAL)
                if _strides(kernel, 0)[axis] == 1 and any(_strides(kernel, i)[axis] == 1 for i in inputs)]
  # AVX-512 (32 vector registers; AVX2 has 16) where an input runs along the output: two vector registers of lanes along it and
  # accumulators in half the registers, 32 x 8 lanes (elsewhere 16 lanes and 8 registers). The GPT_CPU step's weight gradients (x.T
  # @ grad over 2048 tokens, 2-core AVX-512 guest, GFLOP/s) with 16 x 8 lanes: 512 x 128 64, 128 x 128 82, 128 x 512 70; 32 x 8: 108,
  # 89, 95 (torch 205-270); its input gradients (grad @ w) 121-193 -> 124-214; the step 111-118 -> 104-109 ms
  wide = bool(contiguous) and kernel.target.vector_lanes >= 16
  if not contiguous:
    strided = [i for i in inputs if _strides(kernel, i)[innermost_reduce] not in (0, 1)]
    contiguous = [axis for axis in kernel.axes(AxisKind.GLOBAL) if any(_strides(kernel, i)[axis] == 1 for i in strided)]
  # nothing to vectorize along (attention's output with its heads put back in a row: runs of the head dim along the reduce, times the
  # projection's weight): a tile of broadcast axes still reuses each load (examples/gpt.py's sampling, 64 x 96 x 96: 489 -> 68 us)
  if _try_upcast(kernel, contiguous, ((32,) if wide else ()) + (16, 8, 4, 0, 2)) is None: return _broadcast_tile(kernel, inputs)
  vector_loaded = [i for i in inputs if _strides(kernel, i)[-1] == 1]
  lanes_left = min((16 if wide else 8) * kernel.target.vector_lanes, kernel.target.max_upcast) // kernel.upcast_size  # accumulators
  amounts = tuple(range(lanes_left, 1, -1))
  if _try_upcast(kernel, _broadcast_axes(kernel, vector_loaded), amounts) is None: _try_upcast(kernel, _broadcast_axes(kernel, inputs), amounts)

def _broadcast_tile(kernel: Kernel, inputs: list[int], second: int = 4) -> None:
  """4 x `second` lanes of two broadcast axes (an axis upcast first keeps its place or, taken whole, goes: the axes before it keep their
  numbers), unless a 4 x 4 tile's reduce loop would walk more than CPU_STREAMS rows of memory at once (the tile that rule was measured
  with: a layernorm of several inputs is not tiled at all)."""
  def tiled(amount: int) -> Kernel:
    trial = kernel.copy()
    if (first := _try_upcast(trial, _broadcast_axes(trial, inputs), (4,))) is not None and amount > 1:
      _try_upcast(trial, [axis for axis in _broadcast_axes(trial, inputs) if axis < first], (amount,))
    return trial
  def streams(trial: Kernel) -> int:  # rows of memory the reduce loop walks at once: each input's lanes along the axes it varies along
    lanes = lambda i: prod(trial.full_shape[axis] for axis in trial.axes(AxisKind.UPCAST) if _strides(trial, i)[axis] != 0)  # noqa: E731
    return sum(map(lanes, _read_in_reduces(trial, inputs)))
  if streams(tiled(4)) <= CPU_STREAMS:
    for opt in tiled(second).applied_opts[len(kernel.applied_opts):]: kernel.apply_opt(opt)

# bytes of input that the innermost loop outside the reduce may walk before a block of it starts over: half the 1 MB L2 cache of a
# Zen 4 or Skylake-SP core (2 MB on Sapphire Rapids)
CPU_BLOCK_BYTES = 512 << 10

def _cpu_block(kernel: Kernel, inputs: list[int]) -> None:
  """BLOCK the innermost GLOBAL loop where the inputs it walks (with the reduce and lanes inside it) are over CPU_BLOCK_BYTES: each
  trip of the loops outside it then reads them from memory again."""
  if len(global_axes := kernel.axes(AxisKind.GLOBAL)) < 2: return
  inner, inside = global_axes[-1], range(global_axes[-1] + 1, kernel.shape_len)
  walked = [i for i in inputs if _strides(kernel, i)[inner] != 0]
  trip_bytes = sum(kernel.bufs[i].dtype.itemsize * prod(kernel.full_shape[a] for a in inside if _strides(kernel, i)[a] != 0) for i in walked)
  if walked: _block(kernel, inner, lambda amount: amount * trip_bytes <= CPU_BLOCK_BYTES)

def _block(kernel: Kernel, axis: int, fits: Callable[[int], bool]) -> None:
  """BLOCK the GLOBAL `axis` where all of it does not fit: to the largest block that does, one the outer loop's threads share evenly
  where there is one (an even count of blocks, or 8 or more)."""
  if fits(size := kernel.full_shape[axis]): return
  fitting = [amount for amount in range(size - 1, 1, -1) if size % amount == 0 and fits(amount)]
  shared = [amount for amount in fitting if (size // amount) % 2 == 0 or size // amount >= 8]
  if fitting: _try(kernel, Opt(OptOps.BLOCK, kernel.axes(AxisKind.GLOBAL).index(axis), (shared or fitting)[0]))

def _broadcast_axes(kernel: Kernel, inputs: list[int]) -> list[int]:
  """GLOBAL axes along which one of `inputs` stays put, so upcasting one reuses its loads (being first, each is its own Opt axis)."""
  return [axis for axis in kernel.axes(AxisKind.GLOBAL)
          if kernel.full_shape[axis] > 1 and any(_strides(kernel, i)[axis] == 0 for i in inputs)]

def _read_in_reduces(kernel: Kernel, inputs: list[int]) -> list[int]:
  """The inputs a reduce reads, the ones worth staging: a linear layer's bias is read after its sum, once an output."""
  return [i for i in inputs if kernel.bufs[i] in {node.arg for reduceop in kernel.reduceops for node in reduceop.src[0].walk()}]

GPU_THREADS = 1 << 18  # threads that keep an H200 busy (132 SMs x 2048)
# products per output from which a matmul (both axes >= 256) gets the staged plan. Measured on the H200 against cuBLAS, from 1024
# then from 128: batched 32 x 1024 x 1024 x 128 (attention scores) 0.21x -> 1.19x, 1024 x 1024 x 512 0.92x -> 1.26x, 4096 x 4096 x
# 256 0.64x -> 1.04x; the GPT train step (widths under 256) unchanged
STAGED_MIN_REDUCE = 128
# the shortest reduce a float32 matmul takes onto tensor cores as 3xTF32 (three mmas a step): H200, the float32 cores' plan -> 3xTF32,
# TFLOP/s: Winograd's 36 products of a 3x3 conv over K 64 channels (N64 C64 56x56) forward 62.1 -> 54.8, input gradient 62.8 -> 53.9;
# over K 256 (N64 C256 14x14) 89.2 -> 88.6 and 87.1 -> 85.9; the GPT bench's matmuls over K 384 and more 1.0-1.6x faster
THREE_TF32_MIN_REDUCE = 256

def _gpu_optimizations(kernel: Kernel, inputs: list[int]) -> None:
  outputs = kernel.size_of(AxisKind.GLOBAL, AxisKind.LOCAL)
  if not kernel.axes(AxisKind.REDUCE):
    if _transpose_tile(kernel, inputs): return
    contiguous = [axis for axis in kernel.axes(AxisKind.GLOBAL) if _strides(kernel, 0)[axis] == 1]
    _try_upcast(kernel, contiguous[-1:], (4,))
    return
  last_reduce, last_number = kernel.axes(AxisKind.REDUCE)[-1], len(kernel.axes(AxisKind.REDUCE)) - 1  # UNROLL and GROUP count REDUCE axes
  # a conv: a reduce over several axes (its channels and window) of an input read through a pooling window (more than one view).
  # A weight gradient of a matmul over (batch, tokens) reduces over two axes too: the conv's Opts below made the H200's
  # Embedding+Linear train step 0.31 ms against 0.28-0.29
  window = last_number >= 1 and any(len(kernel.sts[i].views) > 1 for i in inputs)
  reduce_size = kernel.size_of(AxisKind.GROUP, AxisKind.REDUCE)
  if (outputs * 16 < GPU_THREADS or kernel.stores_rows) and reduce_size >= 256:  # few outputs (or rows): each becomes a work-group
    if _column_plan(kernel, inputs): return
    if any(_strides(kernel, i)[last_reduce] == 1 for i in inputs): _try(kernel, Opt(OptOps.UNROLL, last_number, 4))
    # a row kernel walks its row several times: about 16 elements a thread each time (measured on the H200: softmax rows of 8192
    # ran in 146 us with 512 threads against 166 with 256; rows of 1024 and 512 were fastest with 64-128 and 32-64 threads)
    largest = max(32, min(512, reduce_size // 16)) if kernel.stores_rows else 256
    # the innermost REDUCE axis that a group size divides (after the unroll, the innermost may be too short: a sum over (2048, 32))
    amounts = [a for a in (512, 256, 128, 64, 32, 16) if a <= largest]
    for number in reversed(range(last_number + 1)):
      if any(_try(kernel, Opt(OptOps.GROUP, number, amount)) for amount in amounts): break
    # then a short loop left over is unrolled whole: its loads all go out at once (the H200 sum of 64M: 94% of copy against 91%)
    if (loops := kernel.axes(AxisKind.REDUCE)) and kernel.full_shape[loops[-1]] <= 16: _try(kernel, Opt(OptOps.UNROLL, len(loops) - 1, 0))
    return
  if not _broadcast_axes(kernel, inputs):  # no load is reused across outputs (a split reduce's parts meeting): as elementwise, and the
    # runtime's work-group size (the work-groups of 16 below ran the H200's sum of 4 parts into 2.4M outputs at 420 GB/s)
    _try_upcast(kernel, [axis for axis in kernel.axes(AxisKind.GLOBAL) if all(_strides(kernel, i)[axis] == 1 for i in [0, *inputs])][-1:], (4,))
    _try(kernel, Opt(OptOps.UNROLL, last_number, 0 if kernel.full_shape[last_reduce] <= 16 else 4))
    return
  if _tensor_core_plan(kernel): return
  # register tile: 4 lanes along two axes that an input is broadcast along, the axes where the most input data is reused first.
  # A big matmul (>= 1024 products per output, both axes >= 256) gets 8x8 tiles and stages its inputs (see _stage_big_matmul);
  # where that does not apply, 8x8 tiles with an unroll of 4 and 4x8 work-groups (32 TFLOP/s at 4096 on the H200, against 22.5
  # for 4x4 tiles in 16x16 work-groups).
  def reuse(axis: int) -> int: return sum(kernel.sts[i].real_size() for i in inputs if _strides(kernel, i)[axis] == 0)
  candidates = [axis for axis in _broadcast_axes(kernel, inputs) if kernel.full_shape[axis] >= 16]
  big = reduce_size >= STAGED_MIN_REDUCE and len(candidates) >= 2 and all(kernel.full_shape[axis] >= 256 for axis in candidates)
  if big and len(candidates) == 2 and _stage_big_matmul(kernel, candidates, inputs): return
  tiled: list[int] = []
  for _ in range(2):
    candidates = [axis for axis in _broadcast_axes(kernel, inputs) if kernel.full_shape[axis] >= 16 and axis not in tiled]
    if (axis := _try_upcast(kernel, sorted(candidates, key=reuse), (8, 4) if big else (4,))) is not None: tiled.append(axis)
  # unroll the innermost reduce: 4 elements a trip (16-byte loads where it is contiguous), or all of a short one (a conv's 3)
  _try(kernel, Opt(OptOps.UNROLL, last_number, 0 if kernel.full_shape[last_reduce] <= 4 else 4))
  # work-group tile: up to 16 (8) threads along each of the two innermost global axes (the largest divisor of each). They are
  # applied outermost first, so the innermost (usually the contiguous one) becomes launch dimension 0 and neighbouring threads
  # touch neighbouring memory. An axis is planned by its place from the end of the GLOBAL axes, which a LOCAL leaves as it was.
  plan: list[tuple[int, int]] = []
  budget, most = (32, 8) if big else (256, 16)  # 64 accumulators a thread leave registers for fewer threads
  global_dims = len(kernel.axes(AxisKind.GLOBAL))
  for axis in reversed(range(max(0, global_dims - 2), global_dims)):
    divisors = [a for a in range(2, min(most, budget) + 1) if kernel.full_shape[axis] % a == 0]
    if divisors:
      plan.insert(0, (global_dims - axis, divisors[-1]))
      budget //= divisors[-1]
  for from_end, amount in plan: _try(kernel, Opt(OptOps.LOCAL, len(kernel.axes(AxisKind.GLOBAL)) - from_end, amount))
  # a product with 64 times the outputs that fill the GPU and a short reduce (too short for the staged plan): its inputs staged and
  # 4 times the outputs along the broadcast axis with the most reuse, BEAM=2's plan for Winograd's 36 batched products of N64 C64
  # 56x56 (a reduce of 64 channels; 64 output channels): 240 -> 127 us on the H200
  short = not window and reduce_size < STAGED_MIN_REDUCE
  if short and outputs >= 64 * GPU_THREADS and all(_try(kernel, Opt(OptOps.STAGE, i, 0)) for i in _read_in_reduces(kernel, inputs)):
    if candidates := sorted(_broadcast_axes(kernel, inputs), key=reuse):
      for _ in range(2): _try(kernel, Opt(OptOps.UPCAST, candidates[-1], 2))
  # a conv (a reduce over its channels and window) computes twice the outputs along the two broadcast axes with the most reuse,
  # the larger first where that ties: 64 accumulators a thread. Measured on the H200, fp32 3x3 convs against cuDNN (TF32 off), heuristic
  # before -> after: forward N64 C64 56x56 0.46x -> 0.65x, N64 C256 14x14 0.30x -> 0.35x, N32 C128 28x28 0.32x -> 0.48x, N16 C96
  # 40x40 1.09x -> 1.59x; the weight gradient's partial products 0.28x -> 0.35x, 0.15x -> 0.18x, 0.19x -> 0.26x. Of every choice
  # of one or two GLOBAL axes x2, this was the best or 0.01x from it in each; x4 along one axis instead: up to 0.02x better, 0.11x worse
  if window:
    grown: list[int] = []
    for _ in range(2):
      candidates = [axis for axis in _broadcast_axes(kernel, inputs) if axis not in grown and kernel.full_shape[axis] > 2]
      if (axis := _try_upcast(kernel, sorted(candidates, key=lambda axis: (reuse(axis), kernel.full_shape[axis])), (2,))) is not None:
        grown.append(axis)
    # a work-group short of a warp (a weight gradient's 3 x 3 window) shares the reduce's innermost axis among more threads: the
    # H200 weight gradient of N64 C64 56x56 went from 0.35x to 0.90x cuDNN (fp32; fp16 0.06x -> 0.25x), the CNN train step unchanged
    if kernel.local_size < 32 and (loops := kernel.axes(AxisKind.REDUCE)):
      size = kernel.full_shape[loops[-1]]
      any(_try(kernel, Opt(OptOps.GROUP, len(loops) - 1, amount)) for amount in range(min(size, 256 // kernel.local_size), 1, -1)
          if size % amount == 0)

def _column_plan(kernel: Kernel, inputs: list[int]) -> bool:
  """A sum down columns (a bias's gradient, (tokens, features) -> features): a 32-byte sector of the columns on as many threads
  (LOCAL; the linearizer makes them launch dimension 0) and the rest of 256 along the rows (GROUP), so a warp's load reads whole
  sectors. The columns are an output axis every input that varies along it is contiguous along. H200, (4096, 1536) f32: 570 ->
  1260-2220 GB/s (torch 690-950); the GPT bench's bias gradients with AdamW's update 1.1-2.5x faster. Not where an input is read
  contiguously along the rows (a row's statistics): the GPT bench's layernorm weight gradient with AdamW's update ran 0.44 -> 1.3
  ms so (f32; 1 -> 16 ms in bfloat16), in 48 work-groups of 8 columns."""
  def wide(axis: int) -> list[int]: return [i for i in inputs if _strides(kernel, i)[axis] != 0]
  columns = [n for n, axis in enumerate(kernel.axes(AxisKind.GLOBAL)) if wide(axis) and all(_strides(kernel, i)[axis] == 1 for i in wide(axis))]
  if kernel.stores_rows or not columns or any(_strides(kernel, i)[axis] == 1 for i in inputs for axis in kernel.axes(AxisKind.REDUCE)):
    return False
  width = 32 // max(1, min(kernel.bufs[i].dtype.itemsize for i in wide(kernel.axes(AxisKind.GLOBAL)[columns[-1]])))
  trial = kernel.copy()  # both Opts or neither: threads along the columns alone would walk every row one after the other
  if not _try(trial, Opt(OptOps.LOCAL, columns[-1], width)): return False
  if not any(_try(trial, Opt(OptOps.GROUP, number, 256 // width)) for number in reversed(range(len(trial.axes(AxisKind.REDUCE))))): return False
  for opt in trial.applied_opts[len(kernel.applied_opts):]: kernel.apply_opt(opt)
  return True

def _stage_big_matmul(kernel: Kernel, axes: list[int], inputs: list[int]) -> bool:
  """The plan of a fast SGEMM, if every step applies: a work-group of 8 x 16 threads computes a 64 x 128 block of the output,
  each thread 8 x 8 of it, split 2 x 4 along each axis so neighbouring threads read neighbouring 16-byte words of a staged tile;
  16 elements of the reduce a loop trip. Measured on the H200 at 4096 (cuBLAS: about 50): 46.6 TFLOP/s, against 44.6 for an
  unroll of 8 and 45.2 for 16 x 16 threads; with 16 x 16 threads and an unroll of 8, 37.5 split, 35.6 not split and 21.0 not
  staged. The best plan without staging (below) runs 32."""
  last_reduce = len(kernel.axes(AxisKind.REDUCE)) - 1
  cols = next((axis for axis in axes if kernel.sts[0].real_strides()[axis] == 1), axes[-1])  # the output's contiguous axis
  rows = next(axis for axis in axes if axis != cols)
  plan = [Opt(OptOps.UPCAST, cols, 4), Opt(OptOps.UPCAST, rows, 4), Opt(OptOps.LOCAL, rows, 8), Opt(OptOps.LOCAL, cols, 16),
          Opt(OptOps.UPCAST, rows, 2), Opt(OptOps.UPCAST, cols, 2)]
  trial = kernel.copy()
  paddable = trial.axes(AxisKind.GLOBAL) + trial.axes(AxisKind.REDUCE)  # as PADTO counts them
  for axis, multiple in ((rows, 64), (cols, 128), (trial.axes(AxisKind.REDUCE)[last_reduce], 16)):  # whole tiles, the edges masked
    if trial.full_shape[axis] % multiple: _try(trial, Opt(OptOps.PADTO, paddable.index(axis), multiple))
  if not all(_try(trial, opt) for opt in plan): return False
  if not any(_try(trial, Opt(OptOps.UNROLL, last_reduce, amount)) for amount in (16, 8, 4)): return False
  if not all(_try(trial, Opt(OptOps.STAGE, i, 0)) for i in _read_in_reduces(kernel, inputs)): return False
  for opt in trial.applied_opts[len(kernel.applied_opts):]: kernel.apply_opt(opt)
  return True

def _tensor_core_plan(kernel: Kernel) -> bool:
  """A sum of products of 16-bit floats on tensor cores, if TC applies (after padding M and N to multiples of 128, 64 or 16 and
  K of 32 or 16, where that wastes at most a third; N to the tile _n_tile picks): warps each computing 64 x 64 outputs (4 x 8 mma
  tiles), 2 x 4 or 2 x 2 of them, or 2 x 4 of 64 x 48; 128 bytes of each row of the reduce a loop trip; 3 tile stages (2 where local
  memory is short); smaller tiles where an axis is short. The tiles come from L2, where a byte gives 128 x 256 outputs more work
  than 128 x 128; then PERSIST where work-groups outnumber SMs (_persist). Measured on the H200 at 4096 before PERSIST (fp16, cuBLAS
  about 700, with clusters sharing tiles): 388-409 TFLOP/s in every layout with 2 x 4 warps, 320-345 with 2 x 2, 310 with 2 x 2
  warps and 64 bytes a trip. Before the stages had split barriers (a barrier of every thread each trip), 2 x 4 warps gave 310."""
  if not (operands := kernel.tensor_core_operands()): return False
  if kernel.bufs[operands[0]].dtype == dtypes.float32 and not ALLOW_TF32 and kernel.size_of(AxisKind.REDUCE) < THREE_TF32_MIN_REDUCE: return False
  def padded(chosen: set[int] | None, n_width: int = 0) -> Kernel:  # M and N to whole work-group tiles where that wastes little, K to whole trips
    trial = kernel.copy()
    for position, axis in enumerate(trial.axes(AxisKind.GLOBAL) + trial.axes(AxisKind.REDUCE)):  # PADTO counts GLOBAL, then REDUCE axes
      spanned_by = sum(not trial.broadcast_along(number, axis) for number in operands)
      multiples: tuple[int, ...] = (32, 16) if trial.kinds[axis] is AxisKind.REDUCE and spanned_by == 2 else (128, 64, 16) if spanned_by == 1 else ()
      if n_width and axis == n: multiples = (n_width,)
      if multiples and trial.full_shape[axis] % multiples[0] and (chosen is None or axis in chosen):
        any(_try(trial, Opt(OptOps.PADTO, position, amount)) for amount in multiples if trial.full_shape[axis] % amount)
    return trial
  if not (choices := padded(None).tensor_core_choices()): return False
  m, n, k = _wgmma_orientation(kernel, operands, choices)  # pad only these: another is work thrown away (a conv's rows, its columns N)
  batches = prod(kernel.full_shape[axis] for axis in kernel.axes(AxisKind.GLOBAL) if axis not in (m, n))
  n_tile = _n_tile(kernel.full_shape[m], kernel.full_shape[n], batches, kernel.target.compute_units)
  if (m, n, k) not in (choices := (trial := padded({m, n, k}, 8 * prod(n_tile) if n_tile else 0)).tensor_core_choices()): return False
  # an operand contiguous along neither K nor its own output axis is copied 2 bytes a thread at a time, with a barrier each trip: a
  # 16-bit conv's weight gradient (the batch for K) ran at 0.03-0.08x cuDNN so, against 0.15-0.31x without tensor cores
  for number in operands:
    own = m if not trial.broadcast_along(number, m) else n
    if all(trial.sts[number].real_strides(ignore_valid=True)[axis] != 1 for axis in (k, own)): return False
  m_at, n_at, k_at = trial.axes(AxisKind.GLOBAL).index(m), trial.axes(AxisKind.GLOBAL).index(n), trial.axes(AxisKind.REDUCE).index(k)
  if not any(_try(trial, Opt(OptOps.TC, choices.index((m, n, k)), stages)) for stages in (3, 2)): return False
  _try(trial, Opt(OptOps.UNROLL, k_at, 4))  # 128 bytes of each row a trip: 4 mma steps of 16 16-bit or 8 float32 elements
  if (warpgroups := _warpgroup_plan(trial, m_at, n_at, n_tile)) is not None: trial = warpgroups
  else:
    n_plan = ((n_tile[0],), (n_tile[1],)) if n_tile else ((8, 4, 2), (2,))  # (upcasts, warps) along N
    for at, (amounts, warps) in sorted(((m_at, ((4, 2), (2,))), (n_at, n_plan)), reverse=True):  # the later axis first: its Opts leave
      # the other's place
      global_count = len(trial.axes(AxisKind.GLOBAL))
      any(_try(trial, Opt(OptOps.UPCAST, at, amount)) for amount in amounts)
      if len(trial.axes(AxisKind.GLOBAL)) == global_count: any(_try(trial, Opt(OptOps.LOCAL, at, amount)) for amount in warps)
    # where M and N are short (a conv's channels and columns), more warps along another axis one operand spans (the conv's rows)
    for axis in reversed(trial.axes(AxisKind.GLOBAL)):
      if trial.local_size < 4 * 32 and sum(not trial.broadcast_along(number, axis) for number in operands) == 1:
        any(_try(trial, Opt(OptOps.LOCAL, axis, amount)) for amount in (4, 2) if amount * trial.local_size <= 4 * 32)
  _persist(trial)
  for opt in trial.applied_opts[len(kernel.applied_opts):]: kernel.apply_opt(opt)
  return True

def _wgmma_orientation(kernel: Kernel, operands: list[int], choices: list[tuple[int, int, int]]) -> tuple[int, int, int]:
  """The TC choice (M, N, K) to plan: the first, but for TF32 on sm_90 the first whose B (the operand spanning N) is contiguous
  along K, as wgmma reads 32-bit B values only so (A it may take from registers): a float32 `a @ b` then has M and N swapped."""
  if not kernel.target.warpgroups or kernel.bufs[operands[0]].dtype.itemsize != 4 or not ALLOW_TF32: return choices[0]
  along_k = lambda choice: any(kernel.sts[number].real_strides(ignore_valid=True)[choice[2]] == 1  # noqa: E731
                               for number in operands if not kernel.broadcast_along(number, choice[1]))
  return next((choice for choice in choices if along_k(choice)), choices[0])

def _warpgroup_plan(kernel: Kernel, m_at: int, n_at: int, n_tile: tuple[int, int] | None) -> Kernel | None:
  """On sm_90, warpgroups (WARPGROUP) where the plan allows: 8 warps along M (128 rows; 4 where M is not a multiple of 128), each
  4 computing 64 rows and the work-group's whole N (_n_tile's width, else 128 or 64) with wgmma, reading swizzled tiles. A
  prototype on the H200 (fp16 4096, NN and TN, 128 x 256 tiles, 3 stages) ran at 526 TFLOP/s with swizzled tiles and 201 without
  (the 8 rows wgmma reads at once fell in one bank), against 406-420 for the mma.sync plan."""
  if not kernel.target.warpgroups: return None
  trial, upcasts = kernel.copy(), (prod(n_tile),) if n_tile else (16, 8)
  for at, op, amounts in sorted(((m_at, OptOps.LOCAL, (8, 4)), (n_at, OptOps.UPCAST, upcasts)), reverse=True):  # the later axis first
    if not any(_try(trial, Opt(op, at, amount)) for amount in amounts): return None
  return trial if _try(trial, Opt(OptOps.WARPGROUP, 0, 0)) else None

def _persist(kernel: Kernel) -> None:
  """Where work-groups of 8 warps (one an SM: their registers fill it) outnumber the compute units, each loops over tiles (PERSIST):
  the fewest a work-group that fit them in one wave, split off the outermost GLOBAL axis that has such a divisor. Smaller ones run
  several to an SM, and one wave of them was too few: fp16 conv wgrad N64 C64 56x56 fell from 73 to 32 TFLOP/s."""
  groups, units = prod(kernel.full_shape[axis] for axis in kernel.axes(AxisKind.GLOBAL)), kernel.target.compute_units
  if groups <= units or kernel.local_size < 8 * 32: return
  for position, axis in enumerate(kernel.axes(AxisKind.GLOBAL)):
    size = kernel.full_shape[axis]
    fitting = [tiles for tiles in range(2, size + 1) if size % tiles == 0 and groups // tiles <= units]
    if any(_try(kernel, Opt(OptOps.PERSIST, position, tiles)) for tiles in fitting): return

N_TILES = ((8, 4), (6, 4), (8, 2))  # (mma tiles of 8 a warp upcasts N by, warps along N): 256 (one work-group an SM), 192 (one), 128 (two)

def _n_tile(rows: int, cols: int, batches: int, compute_units: int) -> tuple[int, int] | None:
  """The work-group tile along N (N_TILES; None where M is under 128 or N under 256) for `batches` outputs of `rows` x `cols` (M x
  N) in work-groups of 128 rows: the most outputs a byte of L2 gives (the tile's bound, see _tensor_core_plan), times the share of the outputs padded
  to whole tiles that are real, times the share of the last wave of work-groups that is busy (128 x 128 ones run two to an SM where
  there are more of them than SMs). Measured on the H200, fp16: 3000^3 ran 128 x 192 at 285 TFLOP/s, 128 x 256 at 246-264, 128 x
  128 at 257-259; 2560 x 1536 x 3584 (120 work-groups of 128 x 256) 356 against 307 for 128 x 128."""
  def score(tile: tuple[int, int]) -> float:
    width = 8 * prod(tile)
    padded = -(-cols // width) * width
    groups = batches * -(-rows // 128) * padded // width
    slots = compute_units * (2 if tile[1] == 2 and groups > compute_units else 1)
    return 128 * width / (128 + width) * cols / padded * groups / (-(-groups // slots) * slots)
  return max(N_TILES, key=score) if rows >= 128 and cols >= 256 else None
