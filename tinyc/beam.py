"""Layer 4: BEAM=n on a device: builds candidates in worker processes, times them on real-size buffers, checks the winner
against the unoptimized kernel and caches it. Imports helpers, dtype, ops, codegen/, device.

codegen/search.py owns the search, its workers and its cache; this module gives it the two device-specific functions it needs:
device.py's `build` (run in a worker: lower, render and compile to a binary, no device needed) and a `measure` closure (run here: load the
binary, launch it on the device, take the fastest of a few runs).

One search runs at a time in a process: searches from several threads would share the worker pool (whose pipes carry one job
at a time) and time their candidates against each other's kernels. A thread that needs a kernel another is searching waits for it.
"""
from __future__ import annotations
import math, sys, threading, time
from typing import Any
import numpy as np
from tinyc.dtype import DType, dtypes
from tinyc.helpers import ALLOW_TF32, BEAM, DEBUG, getenv, prod
from tinyc import profiler
from tinyc.ops import BufferOps, ConstBuffer, LazyOp, MemBuffer, output_count
from tinyc.shape.shapetracker import ShapeTracker
from tinyc.codegen.heuristic import hand_coded_optimizations
from tinyc.codegen.kernel import Kernel, KernelOptError, KernelTarget, Opt
from tinyc.codegen.search import SearchSteps, beam_steps, cache_get, cache_key, cache_put, compile_pool, run_search, run_searches
from tinyc.codegen.dataset import record_candidates
from tinyc.codegen.cost_model import load as load_model, model_path
from tinyc.device import Buffer, Built, Compiled, Program, build, codegen_settings

ROOFLINE_SLACK = 1.1  # a search ends once its best is within this factor of the kernel's roofline bound (roofline_seconds)
COPY_ELEMENTS = 1 << 24  # the float32s of the copy that measures a device's bandwidth (device_speed)
# the fewest candidates a step with the cost model builds (more where there are more build workers: a round costs about one build).
# The CPU CNN step with 4 ran 1.39-1.46x slower than BEAM_MODEL=0's (the model's first 4 never led to a conv weight gradient's unroll and
# block), with 8 1.01-1.05x, its search 13-15 s against 16-19 (BEAM_MODEL=0: 35 s); the CPU matmuls the same either way
MODEL_TOP = 8
TIMING_GROUPS = 2048  # a compute-bound GPU candidate is timed on at most this many work-groups (several waves on an H200), the time scaled up

_chosen: dict[tuple[str, LazyOp, bool], tuple[Opt, ...]] = {}
_searching = threading.Lock()

def beam_opts(device: Compiled, ast: LazyOp) -> tuple[Opt, ...]:
  """The Opts BEAM=n chose for this kernel: from this process's memory, the on-disk cache, or a new search."""
  if (opts := _chosen.get(chosen_key := _chosen_key(device, ast))) is not None: return opts
  with _searching:
    if (opts := _chosen.get(chosen_key)) is None:
      if (opts := _cached_opts(device, ast)) is None: opts = _search_and_cache(device, ast)  # (an empty Opt list is a hit)
      _chosen[chosen_key] = opts
  return opts

def _chosen_key(device: Compiled, ast: LazyOp) -> tuple[str, LazyOp, bool]:
  return (device.name, ast, bool(ALLOW_TF32))  # TF32 changes what the Opts may do

def _cached_opts(device: Compiled, ast: LazyOp) -> tuple[Opt, ...] | None:
  opts = cache_get(cache_key(ast, device_key(device)))
  return opts if opts is not None and _applies(ast, opts, device.target) else None  # (written by another version of tinyc: search again)

def _search_and_cache(device: Compiled, ast: LazyOp, max_steps: int | None = None) -> tuple[Opt, ...]:
  with profiler.span("BEAM search", "beam", device=device.name): opts, verified = search(device, ast, max_steps)
  if verified: cache_put(cache_key(ast, device_key(device)), opts)
  return opts

def beam_plan(device: Compiled, asts: list[LazyOp]) -> None:
  """BEAM=n over a whole schedule (a model's step) before it runs. Kernels equal up to their buffers are one search. Each new kernel's
  hand-coded program is timed once: one within ROOFLINE_SLACK of its roofline bound is kept (a search would end there at once); the
  lightest, counting repeats, that together take at most BEAM_SKIP_SHARE of the schedule's time keep their hand-coded Opts unsearched
  (in this process's memory only: another schedule may weigh them otherwise); the others are searched, the heaviest first, under one
  progress line for the schedule, for one step where a kernel takes under BEAM_LIGHT_SHARE of the schedule's time."""
  with _searching:
    counts: dict[LazyOp, int] = {}
    for ast in asts:
      if (chosen_key := _chosen_key(device, ast)) in _chosen: continue
      if (opts := _cached_opts(device, ast)) is not None: _chosen[chosen_key] = opts
      else: counts[ast] = counts.get(ast, 0) + 1
    if len(counts) < 2: return
    hand_coded = {ast: tuple(hand_coded_optimizations(Kernel(ast, device.target))) for ast in counts}
    device.build_all(list(hand_coded.items()))
    seconds = {ast: _seconds(device, ast, hand_coded[ast]) for ast in counts}
    weights = {ast: count * seconds[ast] for ast, count in counts.items()}
    total, skipped = sum(weight for weight in weights.values() if math.isfinite(weight)), 0.0
    order = []
    for ast in sorted(counts, key=weights.__getitem__):  # a hand-coded program at the roofline bound is what a search would end with
      if seconds[ast] <= ROOFLINE_SLACK * roofline_seconds(device, Kernel(ast, device.target)):
        cache_put(cache_key(ast, device_key(device)), _chosen.setdefault(_chosen_key(device, ast), hand_coded[ast]))
      else: order.append(ast)
    while order and skipped + weights[order[0]] <= getenv("BEAM_SKIP_SHARE", 0.05) * total:
      ast = order.pop(0)
      skipped += weights[ast]
      _chosen[_chosen_key(device, ast)] = hand_coded[ast]
    order.reverse()
    started, skipped_count, done = time.perf_counter(), len(counts) - len(order), [0]
    def progress() -> None: _plan_progress(done[0], len(order), time.perf_counter() - started, skipped_count, skipped / max(total, 1e-12))
    def ended(number: int, result: tuple[tuple[Opt, ...], bool]) -> None:
      (opts, verified), ast = result, order[number]
      if verified: cache_put(cache_key(ast, device_key(device)), opts)
      _chosen[_chosen_key(device, ast)], done[0] = opts, done[0] + 1
      progress()
    progress()
    # one step of the search for a light kernel: it can gain the step little
    searches = (search_steps(device, ast, 1 if weights[ast] < getenv("BEAM_LIGHT_SHARE", 0.02) * total else None) for ast in order)
    # on a GPU 8 searches at once keep the build workers busy while one waits for its round's slowest build (H200 CNN step: 4 at
    # once 9.3 s, 8 5.9 s); on a CPU one at a time, so that no build runs on the cores while a candidate is timed there
    at_once = getenv("BEAM_AT_ONCE", 0) or (8 if device.target.has_local else 1)
    with profiler.span("BEAM search", "beam", device=device.name): run_searches(searches, None, at_once, ended)

def _seconds(device: Compiled, ast: LazyOp, opts: tuple[Opt, ...], runs: int = 2) -> float:
  """One program's time on random real-size buffers (math.inf where it fails to build or run: searched first)."""
  try:
    program = device.get_program(ast, opts)
    return time_program(program, _random_buffers(device.name, Kernel(ast, device.target), output_count(ast)), device.threads, math.inf, runs)
  except (RuntimeError, OSError, ValueError): return math.inf

def _plan_progress(done: int, total: int, elapsed: float, skipped: int, skipped_share: float) -> None:
  if DEBUG < 1 and not getenv("BEAM_PROGRESS", 1): return
  left = f", about {elapsed / done * (total - done):.0f} s left" if 0 < done < total else ""
  print(f"BEAM: {done}/{total} kernels searched in {elapsed:.1f} s{left} ({skipped} more kept hand-coded: "
        f"{skipped_share:.1%} of the step's time)", file=sys.stderr, flush=True)

def device_key(device: Compiled) -> str: return f"{device.name}|{device.arch}|{device.language}" + ("|tf32" if ALLOW_TF32 else "")

def _applies(ast: LazyOp, opts: tuple[Opt, ...], target: KernelTarget) -> bool:
  kernel = Kernel(ast, target)
  try:
    for opt in opts: kernel.apply_opt(opt)
  except KernelOptError: return False
  return True

def search(device: Compiled, ast: LazyOp, max_steps: int | None = None) -> tuple[tuple[Opt, ...], bool]:
  """(the winner, whether it may be cached). A winner whose output differs from the unoptimized kernel's is not used."""
  return run_search(search_steps(device, ast, max_steps))

def search_steps(device: Compiled, ast: LazyOp, max_steps: int | None = None) -> SearchSteps:
  """`search` as a generator of build rounds (search.beam_steps), to run with others (search.run_searches)."""
  kernel = Kernel(ast, device.target)
  hand_coded = tuple(hand_coded_optimizations(kernel.copy()))
  buffers = _random_buffers(device.name, kernel, outputs := output_count(ast))
  times: dict[tuple[Opt, ...], float] = {}
  built_of: dict[tuple[Opt, ...], Built] = {}  # what the workers built: the winner and the unoptimized kernel are not built again
  def measure(opts: tuple[Opt, ...], candidate: tuple[str, Built]) -> float:
    built = candidate[1]
    assert device.load is not None, f"{device.name} cannot load binaries, so it cannot search"
    try:
      program = Program(built.name, device.name, device.load(built.name, built.source, built.binary), built.flops, built.mem_bytes,
                        built.global_size, built.local_size)
      times[opts] = seconds = time_program(program, buffers, device.threads, min(times.values(), default=math.inf))
    except (RuntimeError, OSError, ValueError) as error:  # a launch the device refuses (too many registers for the work-group...)
      if DEBUG >= 3: print(f"BEAM: {built.name} failed to run: {error}", file=sys.stderr)
      return math.inf
    return seconds
  started = time.perf_counter()
  settings = codegen_settings()
  arguments = lambda opts: (ast, opts, device.target, device.threads, device.max_local, device.render, device.compile_binary,  # noqa: E731
                            settings, device.program_key(ast, opts))
  recorded: list[tuple[tuple[Opt, ...], bool, float | None]] = []  # every candidate, for the dataset (BEAM_RECORD=0: none)
  model = load_model(path) if (path := model_path(device.target)) is not None else None
  best = yield from beam_steps(kernel, BEAM.value, build_candidate, arguments, measure, starts=(hand_coded, ()), name=kernel.name,
                               record=(lambda *row: recorded.append(row)) if getenv("BEAM_RECORD", 1) else None,
                               rank=model.rank if model is not None else None, top=getenv("BEAM_MODEL_TOP", 0) or max(MODEL_TOP, compile_pool().size),
                               good_enough_s=ROOFLINE_SLACK * roofline_seconds(device, kernel), max_steps=max_steps,
                               on_build=lambda opts, candidate: built_of.__setitem__(opts, candidate[1]))
  if recorded: record_candidates(ast, device_key(device), device.target, recorded)
  for opts in {(), best}:
    if opts in built_of: device.adopt(ast, opts, built_of[opts])
  verified = not getenv("BEAM_VERIFY", 1) or outputs_match(device, ast, best, buffers, outputs)
  if DEBUG >= 2 or not verified:
    print(f"BEAM {kernel.name}: {list(best)} {times.get(best, math.nan) * 1e6:.2f} us against the hand-coded "
          f"{times.get(hand_coded, math.nan) * 1e6:.2f} us after a {time.perf_counter() - started:.1f} s search"
          + ("" if verified else "; ITS OUTPUT DIFFERS, using the hand-coded Opts"), file=sys.stderr)
  return (best, True) if verified else (hand_coded, False)

def build_candidate(*arguments: Any) -> tuple[str, Built]:
  """A candidate built in a worker, with its source under a name common to all (a built name carries its program key, which
  differs with the Opts): the search times candidates with equal sources once."""
  built = build(*arguments)
  return built.source.replace(built.name, "kernel"), built

def roofline_seconds(device: Compiled, kernel: Kernel) -> float:
  """The least time the kernel could take: a launch plus reading and writing each of its buffers once at the device's bandwidth,
  both measured (`device_speed`). Compute is not bounded: tensor cores outrun any float32 ceiling."""
  launch_s, bytes_per_s = device_speed(device)
  return launch_s + sum(buf.dtype.itemsize * buf.st.real_size() for buf in kernel.bufs if not isinstance(buf, ConstBuffer)) / bytes_per_s

_speeds: dict[str, tuple[float, float]] = {}
def device_speed(device: Compiled) -> tuple[float, float]:
  """(seconds a launch takes, bytes a second a copy moves), measured once a process on the device, as candidates are timed: a
  one-element copy kernel and a 64 MiB one, their hand-coded programs."""
  if device.name not in _speeds:
    def copy(elements: int) -> float:
      st = ShapeTracker.from_shape((elements,))
      load = LazyOp(BufferOps.LOAD, (), MemBuffer(1, dtypes.float32, st))
      ast = LazyOp(BufferOps.SINK, (LazyOp(BufferOps.STORE, (load,), MemBuffer(0, dtypes.float32, st)),))
      return _seconds(device, ast, tuple(hand_coded_optimizations(Kernel(ast, device.target))), runs=5)
    launch_s = copy(1)
    _speeds[device.name] = (launch_s, 2 * 4 * COPY_ELEMENTS / max(copy(COPY_ELEMENTS) - launch_s, 1e-9))
  return _speeds[device.name]

def time_program(program: Program, buffers: list[Buffer], scale_down: bool, best_s: float, runs: int = 3) -> float:
  """The fastest of a few runs, in seconds. A compute-bound GPU kernel with more than TIMING_GROUPS work-groups runs on fewer (they
  compute a part of the output) and its time is scaled up; a candidate far slower than the best so far is not run again."""
  global_size, local_size, factor = program.global_size, program.local_size, 1.0
  # only compute-bound kernels: a memory-bound one on a part of its data would run from the L2 cache and mislead the search
  if scale_down and global_size is not None and local_size is not None and program.flops > 16 * program.mem_bytes:
    groups = [g // l for g, l in zip(global_size, local_size)]
    while prod(groups) > TIMING_GROUPS:
      dim = groups.index(max(groups))
      factor *= groups[dim] / (groups[dim] // 2)
      groups[dim] //= 2
    global_size = (groups[0] * local_size[0], groups[1] * local_size[1], groups[2] * local_size[2])
  opaques, fastest = [buf.opaque for buf in buffers], math.inf
  for _ in range(runs):
    seconds = program.run(opaques, global_size=global_size, local_size=local_size, wait=True)
    assert seconds is not None, "a timed run returns its time"
    fastest = min(fastest, seconds * factor)
    if fastest > 3 * best_s: break
  return fastest

def _random_buffers(device: str, kernel: Kernel, outputs: int) -> list[Buffer]:
  """One real-size buffer per buffer number of the kernel (the first `outputs` are its outputs), inputs filled with random values
  of their dtype."""
  sizes: dict[int, tuple[int, Any]] = {}
  for buf in kernel.bufs:
    if isinstance(buf, MemBuffer): sizes[buf.idx] = (max(sizes.get(buf.idx, (0, None))[0], buf.st.real_size(), 1), buf.dtype)
  buffers = []
  for idx in sorted(sizes):
    size, dtype = sizes[idx]
    buffer = Buffer(device, size, dtype)
    if idx >= outputs:
      values = _random_values(size, idx) if dtypes.is_float(dtype) else _random_values(size, idx, integers=True) % (2 if dtype == dtypes.bool else 8)
      buffer.copyin((values.view(np.uint32) >> 16).astype(np.uint16) if dtype == dtypes.bfloat16 else values.astype(dtype.np))
    buffers.append(buffer)
  return buffers

_random_pools: dict[bool, np.ndarray] = {}
def _random_values(size: int, number: int, integers: bool = False) -> np.ndarray:
  """`size` standard-normal float32s (or small non-negative int32s) for buffer `number`: a slice, starting at a point of its own
  (buffers that differ show a swapped input), of one array drawn once a process and grown when too short. A whole model's plan fills
  every new kernel's buffers: drawing anew each time took 7 s of the H200 GPT's search."""
  start = number * 7919
  pool = _random_pools.get(integers)
  if pool is None or len(pool) < start + size:
    rng, length = np.random.default_rng(0), max(start + size, 2 * len(pool) if pool is not None else 0)
    _random_pools[integers] = pool = rng.integers(0, 1 << 30, length, dtype=np.int32) if integers else rng.standard_normal(length, dtype=np.float32)
  return pool[start:start + size]

def outputs_match(device: Compiled, ast: LazyOp, opts: tuple[Opt, ...], buffers: list[Buffer], outputs: int) -> bool:
  """Whether `opts` give the unoptimized kernel's outputs (the first `outputs` buffers) on the random inputs (BEAM_VERIFY). Like the
  timing runs, these runs are launched directly, not through Program.__call__: they are the search's, so GlobalCounters does not
  count them."""
  results = []
  for candidate in ((), opts):
    program = device.get_program(ast, candidate)
    program.run([buf.opaque for buf in buffers], global_size=program.global_size, local_size=program.local_size, wait=True)
    results.append([buf.numpy().astype(np.float64) for buf in buffers[:outputs]])
  return all(outputs_close(got, expected, out.dtype) for out, got, expected in zip(buffers, results[1], results[0]))

def outputs_close(got: np.ndarray, expected: np.ndarray, dtype: DType) -> bool:
  """Whether an output equals the unoptimized kernel's up to rounding: each element within a tolerance relative to the larger of
  itself and the output's root mean square. A reduction split or unrolled another way sums in another order, and an output near 0
  of a long sum keeps the rounding of its large partial sums (a conv weight gradient: sums of 73728 products, about 265 on
  average, one of 0.82 moved by 0.002); a wrong kernel is off by about the output's own values."""
  tolerance = 1e-2 if dtype in (dtypes.float16, dtypes.bfloat16) else 1e-3
  finite = expected[np.isfinite(expected)]
  scale = max(float(np.sqrt(np.mean(np.square(finite)))) if finite.size else 0.0, 1.0)
  return bool(np.allclose(got, expected, rtol=tolerance, atol=tolerance * scale, equal_nan=True))
