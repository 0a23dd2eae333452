"""Layer 3: the heuristic's plan for kernels with reduces nested in another's loop (schedule rule 10: attention, an MLP's hidden layer
recomputed), and the steps every plan takes (an Opt tried, an axis upcast). Imports helpers, ops, codegen/kernel, codegen/online;
heuristic.py calls nested_plan before its other plans.
"""
from __future__ import annotations
import math
from tinyc.helpers import prod
from tinyc.ops import MemBuffer
from tinyc.codegen.kernel import AxisKind, Kernel, KernelOptError, Opt, OptOps
from tinyc.codegen.online import online_groups

# threads of a work-group along the queries of a kernel with nested contractions: 64 or 128 ran alike on the H200, none (the runtime's
# choice) up to 1.3x slower
NESTED_THREADS = 64
# lanes a key's nested reduces unroll together on a GPU: one by 8 (float32 16-byte loads; by 4 ran slower), two by 4 each (the
# backward's dq and dk, bfloat16, causal 8x16x2048x64 on the H200: by 8 each 40 ms, by 4 each 17-22; float32 alike)
NESTED_UNROLL = 8
# threads a nested kernel's keys (its outer reduce) are split among where softmax's max and sums run in one loop, or the inputs are 16-bit
# (attention's backward). H200, causal attention, ms before -> after at 8x6x512x64 / 8x16x2048x64. float32: log-sum-exp 0.40 -> 0.22 /
# 7.4 -> 7.1, output 0.59 -> 0.46 / 22.7 -> 21.2; bfloat16: log-sum-exp 0.81 -> under 0.33 / 9.5 -> 8.8, output 1.54 -> 0.71 / 39.2
# -> 29.0, dq, dk and dv 0.54, 0.63, 0.47 -> 0.44, 0.38, 0.27 / 17.1, 20.2, 12.9 -> 14.0, 17.7, 12.5. Not the float32 backward's (0.45-0.57
# -> 0.65-0.67 / 19.3-20.7 -> 22.9-25.9), nor by 4 (slower than by 2 in all but the log-sum-exp)
NESTED_GROUP = 2
# threads a compute unit of a wave: a nested kernel with fewer threads splits its keys in any case (its rows, causal ones above all,
# are long chains), by 2 NESTED_GROUPs where no features make its threads' partials many. H200 8x6x512x64 (a wave of 384 work-groups)
# ms: float32 dv 0.505 -> 0.393, log-sum-exp 0.212 -> 0.184 by 4 (bfloat16 0.313 -> 0.196); at 8x16x2048x64 (waves of them) dv by 2
# ran 7.70 -> 9.59, the log-sum-exp by 4 4.64 -> 4.75. Not dq and dk, two nested reduces (by 2 at 512: 0.463, 0.415 -> 0.448, 0.457)
NESTED_WAVE = 256
# elements of a head dim a GPU unrolls whole in each nested reduce: a query's row is then read once a thread, into registers, where a loop
# of NESTED_UNROLL lanes read it for every key. ptxas unrolls and hoists that loop itself for a float32 row of up to 8 trips (168
# registers either way; whole ran within 1% and the output 5% slower at 2048), so those keep it. H200, causal, ms, NESTED_UNROLL lanes
# -> whole: bfloat16 8x6x512x64 output 0.73 -> 0.47, dv 0.26 -> 0.22, dq 0.37 -> 0.29, log-sum-exp 0.20 -> 0.18; 8x16x2048x64 output
# 23.4 -> 16.9, dq 8.4 -> 6.9; 8x8x1024x128 log-sum-exp 3.3 -> 1.5, output 10.0 -> 5.4, dq and dk 7.6-7.7 -> 6.7-7.1, dv 3.6 -> 2.8;
# float32 8x8x1024x128: dq and dk 15.3 and 14.9 -> 8.3 and 8.9, dv 8.6 -> 6.4, log-sum-exp 3.3 -> 2.5, but the output 6.2 -> 7.6
# (128 accumulators and the row: 112 bytes spilled)
NESTED_ROW = 128
# features and head dim up to which a float32 kernel of one nested reduce gives 2 threads a pair of queries (each thread half the features
# of both, LOCAL 2): each key's loaded rows serve 2 queries (the scores are computed by both threads). H200 causal, ms: 8x6x512x64 output
# 0.393 -> 0.349, dv 0.404 -> 0.299; 8x16x2048x64 9.5 and 6.3 against 12.1 and 7.6. Not bfloat16 (output 0.48 -> 0.83), nor dq and
# dk (4 rows in registers: 0.44 -> 1.5), nor 4 threads a pair or a quad (slower)
NESTED_PAIR = 64

# products of a key's scores (rows a thread x a head dim) below which a CPU nested kernel also upcasts an outer row axis (heads, batch)
# by 2: more independent chains of exp, max and rescaling a key. Causal SDPA forward + backward on a 2-core AVX-512 guest, ms
# (fresh caches): 8x4x256x32 (4 queries x 32) 20.7-21.0 -> 16.7-17.5, 4x6x197x40 (197 queries take no upcast: 1 x 40) 29.4 ->
# 11.4; not at 4 x 64 (2x4x256x64 6.1 against 6.2, 1x2x512x64 5.8 against 6.0)
NESTED_CPU_PRODUCTS = 256

def nested_plan(kernel: Kernel) -> bool:
  """A kernel with reduces nested in another's loop with loops of their own (schedule rule 10: attention's scores q.k, the backward's
  dO.v, an MLP's hidden layer) gets a plan of its own, and returns whether it did (the other plans were made for one reduce):
  - the output axes those reduces do not vary along (the values' features, 128 or fewer) upcast whole, so each score is computed
    once per element: upcast 4 of 40 features, the scores were computed 10 times over (CPU, causal 3x5x197x40 forward and
    backward: 1775 ms against 68 stored);
  - the last axis they do vary along (the queries) upcast by 4 on a CPU, so each key's loads serve 4 queries (causal SDPA
    1x2x128x64 backward kernels 1.1 -> 0.53 ms); by 8 where no features were upcast (the log-sum-exp): causal 8x4x256x32 on a 2-core
    AVX2 guest 3.3 -> 2.5 ms alone (interleaved), 64-92 -> 55-64 ms over the CPU GPT bench's profiled steps (the output and dv by 8 ran
    16-21% faster alone but no faster in the GPT's steps; dq and dk no faster alone); and an outer row axis by 2 where those queries
    times a head dim are few products (NESTED_CPU_PRODUCTS);
  - on a GPU, the nested reduces' own axes (the head dim) unrolled by NESTED_UNROLL lanes in all, so they read 16-byte
    vectors (a bf16 score read one 2-byte element a load from a row per thread: 10x slower than float32), or whole (NESTED_ROW);
    float32 features split between 2 threads that share a pair of queries (NESTED_PAIR); the queries split across
    NESTED_THREADS threads, and where no features were upcast, the queries upcast by 2. H200, causal 8x16x2048x64, ms before ->
    after, float32 / bfloat16: log-sum-exp 78 -> 7.5 / 143 -> 9.9, output 36 -> 24 / 437 -> 39, dv 38 -> 21 / 145 -> 13, dq and dk
    29-32 -> 19-20 / 288 -> 17-22."""
  if not (inner := kernel.nested_contractions()): return False
  if kernel.target.tensor_cores and kernel.target.warp_shuffles and tensor_core_plan(kernel): return True
  if kernel.target.warp_shuffles and lanes_plan(kernel): return True
  varying = set().union(*[kernel.value_axes(kernel.reduceops[number]) for number in inner])
  shared = [axis for axis in kernel.axes(AxisKind.GLOBAL) if axis not in varying and kernel.full_shape[axis] > 1]
  own = [index for index, axis in enumerate(kernel.axes(AxisKind.REDUCE)) if len(kernel.owners[axis]) == 1 and kernel.owners[axis] <= set(inner)]
  rows_of = [kernel.full_shape[kernel.axes(AxisKind.REDUCE)[index]] for index in own]
  sixteen_bit = any(buf.dtype.itemsize == 2 for buf in kernel.bufs[kernel.n_outputs:] if isinstance(buf, MemBuffer))
  paired = (kernel.target.has_local and not sixteen_bit and len(inner) == 1 and len(shared) == 1 and kernel.full_shape[shared[0]] % 2 == 0
            and max(kernel.full_shape[shared[0]], *rows_of) <= NESTED_PAIR and try_opt(kernel, Opt(OptOps.UPCAST, (features := kernel.axes(
            AxisKind.GLOBAL).index(shared[0])), kernel.full_shape[shared[0]] // 2)) and try_opt(kernel, Opt(OptOps.LOCAL, features, 0)))
  if not paired and not all([upcast_whole(kernel, axis) for axis in reversed(shared)]): return False  # (the last first: numbers stay)
  def rows() -> list[int]: return [axis for axis in kernel.axes(AxisKind.GLOBAL) if kernel.full_shape[axis] > 1]
  if not kernel.target.has_local:
    if rows_in_lanes(kernel, rows()[-1:], own): return True  # (AVX-512; the plan below otherwise)
    before = kernel.upcast_size
    try_upcast(kernel, rows()[-1:], (4, 2) if kernel.upcast_size > 1 else (8, 4, 2))
    if kernel.upcast_size // before * max(rows_of) < NESTED_CPU_PRODUCTS: try_upcast(kernel, rows()[:-1], (2,))
    return True
  whole = max(rows_of) <= NESTED_ROW and (sixteen_bit or paired or max(rows_of) > 8 * NESTED_UNROLL)
  amounts = [0] if whole else [amount for amount in (8, 4, 2) if amount * len(own) <= NESTED_UNROLL] or [2]
  for index in reversed(own): next((amount for amount in amounts if try_opt(kernel, Opt(OptOps.UNROLL, index, amount))), None)
  if not shared or paired: try_upcast(kernel, rows()[-1:], (2,))
  outer = [index for index, axis in enumerate(kernel.axes(AxisKind.REDUCE)) if not kernel.owners[axis] <= set(inner)]
  short = prod(kernel.full_shape[axis] for axis in kernel.axes(AxisKind.GLOBAL)) < kernel.target.compute_units * NESTED_WAVE
  split = NESTED_GROUP * (2 if short and not shared else 1)
  splits = online_groups(kernel) or sixteen_bit or short and len(inner) == 1
  grouped = len(outer) == 1 and bool(splits) and try_opt(kernel, Opt(OptOps.GROUP, outer[0], split))
  threads = NESTED_THREADS // (NESTED_GROUP if grouped else 1) // (2 if paired else 1)
  if rows() and (divisors := [d for d in range(2, threads + 1) if kernel.full_shape[rows()[-1]] % d == 0]):
    try_opt(kernel, Opt(OptOps.LOCAL, rows()[-1], divisors[-1]))
  return True

# lanes of a warp a nested kernel's scores and features are split among on CUDA (LANES): 4, or 8 where its threads would fall short of
# NESTED_WAVE a compute unit; queries a thread upcasts (2 of 16-bit inputs); query groups of lanes a work-group; keys (the outer
# reduce) unrolled, so a trip's scores are independent chains and the online max rescales its sums once per NESTED_LANE_KEYS keys.
# H200, causal attention, ms, the plan before (a thread a query, section 5 of the design) -> the best of 37 LANES plans (lanes 4 or
# 8, queries 2, 4 or 8, 64 or 128 threads, keys by 1, 2 or 4); these rules take the best or one within 10% of it: 8x16x2048x64
# float32 log-sum-exp 4.86 -> 2.18, output 9.73 -> 3.98, dq 11.48 -> 6.32, dk 8.80 -> 5.77, dv 6.38 -> 3.37; bfloat16 4.61 -> 3.31,
# 16.83 -> 13.04, 7.24 -> 5.36, 6.77 -> 4.96, 5.06 -> 2.95; 8x6x512x64 float32 0.190 -> 0.123, 0.331 -> 0.166, 0.492 -> 0.244, 0.435
# -> 0.241, 0.320 -> 0.161; bfloat16 0.203 -> 0.151, 0.483 -> 0.406, 0.292 -> 0.192, 0.284 -> 0.200, 0.220 -> 0.140. Keys by 1
# gained 20-35% in float32 and nothing in bfloat16
NESTED_LANES = 4
NESTED_LANE_QUERIES = 4
NESTED_LANE_GROUPS = 16
NESTED_LANE_KEYS = 4
# values of its queries' rows and accumulators a thread may hold before more lanes share them: float32 dq and dk at 8x16x2048x64 (two
# rows and the features: 192 values with 4 lanes) 8.75 and 7.98 ms with 4 lanes, 6.32 and 5.97 with 8
NESTED_LANE_VALUES = 128
# threads a compute unit below which a LANES kernel splits its keys among 2 or 4 threads (GROUP, each a run of lanes), so a causal row's
# keys are walked in 2 or 4 chains at once: H200 causal attention, ms of each kernel (log-sum-exp, output, dq, dk, dv) without -> with,
# the work-group's threads kept: 8x6x512x64 (372 threads a compute unit) float32 0.136, 0.167, 0.268, 0.261, 0.158 -> 0.088, 0.152,
# 0.194, 0.200, 0.131 by 4; bfloat16 0.116, 0.169, 0.211, 0.221, 0.192 -> 0.079, 0.137, 0.165, 0.182, under 0.14. At 8x16x2048x64
# (about 2000 threads a compute unit and more) float32 by 2 ran 0.94-1.16x the time, so not there
NESTED_LANE_WAVE = 1024

def lanes_plan(kernel: Kernel, lanes: int = 0, queries: int = 0, groups: int = NESTED_LANE_GROUPS, keys: int = NESTED_LANE_KEYS,
               split: int = 0) -> bool:
  """On CUDA, a nested kernel's scores computed by `lanes` neighbouring threads together (LANES), each lane a run of the head dim
  (unrolled whole) and of the features (upcast whole); the keys split among `split` threads (GROUP), the queries upcast by
  `queries`, `groups` of lanes a work-group along them, and the keys unrolled by `keys`. Where a thread computed every score of its
  queries alone and read each key's row alone, the lanes read a row together, 16 bytes each, and each lane holds a share of the
  accumulators (0: the amounts the rules above pick; the split's threads then come out of the groups)."""
  sixteen_bit = any(buf.dtype.itemsize == 2 for buf in kernel.bufs[kernel.n_outputs:] if isinstance(buf, MemBuffer))
  queries = queries or NESTED_LANE_QUERIES // (2 if sixteen_bit else 1)
  query_rows = prod(kernel.full_shape[axis] for axis in kernel.axes(AxisKind.GLOBAL) if axis not in kernel.features())
  if not lanes:
    lanes = NESTED_LANES * (2 if query_rows // queries * NESTED_LANES < kernel.target.compute_units * NESTED_WAVE else 1)
    own = [kernel.full_shape[kernel.own_axis(number)] for number in kernel.nested_contractions()]
    row = sum(own) + sum(kernel.full_shape[axis] for axis in kernel.features())  # values a query's rows and accumulators hold
    while queries * row // lanes > NESTED_LANE_VALUES and lanes < 32: lanes *= 2
  while lanes > 1 and not try_opt(kernel, Opt(OptOps.LANES, 0, lanes)): lanes //= 2
  if lanes == 1: return False
  for axis in reversed(kernel.features()): upcast_whole(kernel, axis)
  inner = kernel.nested_contractions()
  for index in reversed(range(len(kernel.axes(AxisKind.REDUCE)))):
    if kernel.owners[kernel.axes(AxisKind.REDUCE)[index]] <= set(inner): try_opt(kernel, Opt(OptOps.UNROLL, index, 0))
  if not split:
    split = next((split for split in (1, 2) if query_rows // queries * lanes * split >= kernel.target.compute_units * NESTED_LANE_WAVE), 4)
    groups = max(groups // split, 1)
  if split > 1 and (outer := kernel.axes(AxisKind.REDUCE)): try_opt(kernel, Opt(OptOps.GROUP, len(outer) - 1, split))
  if keys > 1 and (outer := kernel.axes(AxisKind.REDUCE)): try_opt(kernel, Opt(OptOps.UNROLL, len(outer) - 1, keys))
  def rows() -> list[int]: return [axis for axis in kernel.axes(AxisKind.GLOBAL) if kernel.full_shape[axis] > 1]
  if rows() and queries > 1: try_upcast(kernel, rows()[-1:], (queries, 2))
  if rows() and (divisors := [d for d in range(2, groups + 1) if kernel.full_shape[rows()[-1]] % d == 0]):
    try_opt(kernel, Opt(OptOps.LOCAL, rows()[-1], divisors[-1]))
  return True

# warps of a work-group along the rows of a nested kernel on tensor cores (each warp 16 rows: register_mma.py), and the 16-key steps
# a trip of its keys' loop takes. H200, bfloat16 causal attention, ms of the forward, dq, and dk with dv, operands read 4 bytes a load:
# 1 and 1 were the fastest of 1, 2, 4 or 8 warps and 1, 2 or 4 steps at 8x6x512x64 (0.067, 0.077, 0.097; 4 warps 0.072, 0.101, 0.114)
# and within 2.4% of it at 8x16x2048x64 (1.371, 1.910, 2.554); 8 bytes a load, 1-4 warps and 1-2 steps: within 2.4% of the best at 512
# and 0.8% at 2048. Not measured again since operands load 16 bytes
NESTED_TC_WARPS = 1
NESTED_TC_KEYS = 1

def tensor_core_plan(kernel: Kernel, warps: int = NESTED_TC_WARPS, keys: int = NESTED_TC_KEYS) -> bool:
  """A nested kernel of 16-bit or float32 (3xTF32) contractions on tensor cores (TC, register_mma.py): the head dims unrolled whole,
  so each warp loads its rows' A fragments once, before the loop over the keys, `keys` steps of 16 keys a trip, and `warps` warps a
  work-group along the rows (or 2 where they do not divide them). Float32 as 16 bits: 2 and 4 warps, 2 key steps and two 16-row
  tiles a warp ran within 5% of it or slower (H200 causal SDPA forward + backward 8x16x2048x64: 7.45 ms; 7.10-7.33 with 2-4
  warps or 2 steps, 10.0 with two row tiles; 8x6x512x64 0.355-0.384 all)."""
  if not try_opt(kernel, Opt(OptOps.TC, 0, 0)): return False
  inner = set(kernel.nested_contractions())
  for index in reversed(range(len(kernel.axes(AxisKind.REDUCE)))):
    if kernel.owners[kernel.axes(AxisKind.REDUCE)[index]] <= inner: try_opt(kernel, Opt(OptOps.UNROLL, index, 0))
    elif keys > 1: try_opt(kernel, Opt(OptOps.UNROLL, index, keys))
  varying = set().union(*[kernel.value_axes(kernel.reduceops[number]) for number in inner])
  rows = [index for index, axis in enumerate(kernel.axes(AxisKind.GLOBAL)) if axis in varying and kernel.full_shape[axis] > 1]
  if rows and warps > 1: next((amount for amount in (warps, 2) if try_opt(kernel, Opt(OptOps.LOCAL, rows[-1], amount))), None)
  return True

# keys a trip of a CPU rows-in-lanes kernel's loop over them takes (UNROLL) where online softmax rescales its sums, once a trip (the
# forward): the rescaling is then shared by 8 keys. Causal SDPA (8,4,256,32) forward on a 2-core AVX-512 guest 2.9-3.1 -> 1.4-1.6 ms (by
# 4 1.6-1.9, by 16 1.4-2.2; in the CPU GPT step too); fwd+bwd (2,4,256,64) 5.0 -> 4.5, (1,6,384,80) 11.6 -> 9.0, (4,6,192,40) 7.7 ->
# 6.5. The backward's kernels (dq's keys, dk's and dv's queries) by NESTED_CPU_BACKWARD_KEYS, with each broadcast element read again for
# each product (packing.fresh_operands): causal SDPA in the GPT's layout (q, k and v views of one buffer), 2-core AVX-512 guest, ms
# (medians of 3 alternating runs) dk-and-dv, dq, fwd+bwd: (8,4,256,32) 2.80, 2.07, 7.17 -> 1.96, 1.59, 5.80; (2,4,256,64) 1.40, 0.99,
# 3.68 -> 0.92, 0.76, 2.84; (1,6,384,80) 2.91, 2.06, 7.03 -> 1.87, 1.48, 5.59; (4,6,192,40) 1.50, 1.12, 4.41 -> 1.18, 0.92, 3.75. With
# q, k and v contiguous, (8,4,256,32): 3.57, 2.40 -> by 4 1.97, 1.55; by 2 2.40, 1.80; by 8 2.43, 1.57; by 4 without the fresh reads
# 3.48, 2.53 (the broadcast elements, each used twice, were kept in registers and spilled: 384 stores a trip)
NESTED_CPU_KEYS, NESTED_CPU_BACKWARD_KEYS = 8, 4

def rows_in_lanes(kernel: Kernel, rows: list[int], own: list[int]) -> bool:
  """A CPU kernel of nested contractions (attention, forward and backward) puts a vector register's lanes of rows (its last row
  axis, the queries; dk's and dv's keys) in the lanes: the linearizer packs every reduce along them (packing.rows_axis), online
  softmax's max and sums too, so a key's scores, probabilities, rescaling and gradients are vector ops, one lane a row, and each
  product takes the other operand's element (a key's row) broadcast, where a row's scores were dot products added up across lanes
  and its exp scalar; the head dims are unrolled whole, so the rows' elements, read across rows (gathered), are read once, before
  the loop over the keys, which the forward unrolls (NESTED_CPU_KEYS), the backward too (NESTED_CPU_BACKWARD_KEYS). Causal SDPA on a
  2-core AVX-512 guest, ms, 4 queries x 2 heads -> 16 queries: (8,4,256,32) dq 5.5 -> 2.4, dk 5.4 -> 2.5, dv 4.6 -> 1.9, the output 3.5
  -> 3.0; fwd+bwd (4,6,192,40) 21.0 -> 5.6."""
  trial, lanes = kernel.copy(), kernel.target.vector_lanes
  # AVX-512's 32 vector registers hold a row vector's 32 features; AVX2's 16 would spill them (not measured: this plan needs 16 lanes)
  # rows that do not divide by the lanes keep the plan below: padded (masked), 197 queries ran 10.2 -> 13.8 ms (208 real ones 6.2)
  if lanes < 16 or not rows or not try_opt(trial, Opt(OptOps.UPCAST, rows[0], lanes)): return False
  for index in reversed(own):
    if not try_opt(trial, Opt(OptOps.UNROLL, index, 0)): return False
  if keys := trial.axes(AxisKind.REDUCE):  # the loop over the keys (what is left of the reduces; dk's and dv's: the queries)
    amounts = (NESTED_CPU_KEYS, 4, 2) if online_groups(trial) else (NESTED_CPU_BACKWARD_KEYS, 2)
    next((amount for amount in amounts if try_opt(trial, Opt(OptOps.UNROLL, len(keys) - 1, amount))), None)
  for opt in trial.applied_opts[len(kernel.applied_opts):]: kernel.apply_opt(opt)
  return True

def upcast_whole(kernel: Kernel, axis: int) -> bool:
  """Upcast a GLOBAL axis whole. On a CPU, a size that is not a power of two is first upcast by the largest power of two up to a vector
  register's lanes that divides it: the linearizer packs the lanes of one axis into one vector, and LLVM builds a vector of another
  width lane by lane (an attention kernel of 80 features: 963 vinsertps, dv 42 -> 8.3 ms; 48 features 19 -> 6.5, 96 27 -> 10)."""
  size = kernel.full_shape[axis]
  if not kernel.target.has_local and size & (size - 1) and (width := math.gcd(size, kernel.target.vector_lanes)) > 1:
    try_opt(kernel, Opt(OptOps.UPCAST, axis, width))
  return try_opt(kernel, Opt(OptOps.UPCAST, axis, 0))

def try_upcast(kernel: Kernel, axes: list[int], amounts: tuple[int, ...]) -> int | None:
  """Upcast the last of `axes` that takes one of `amounts` (the first that divides it; 0, the whole axis, only up to 16): that axis."""
  for axis in reversed(axes):
    for amount in amounts:
      if (amount != 0 or kernel.full_shape[axis] <= 16) and try_opt(kernel, Opt(OptOps.UPCAST, axis, amount)): return axis
  return None

def try_opt(kernel: Kernel, opt: Opt) -> bool:
  try: kernel.apply_opt(opt)
  except KernelOptError: return False
  return True
