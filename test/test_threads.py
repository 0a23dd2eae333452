"""tinyc called from several Python threads at once, on every device: kernels compile and run concurrently and give numpy's results;
the program cache, the allocator, values shared between threads, TinyJit's capture, BEAM and Context settings stay correct."""
from __future__ import annotations
import os, signal, subprocess, sys, threading, time
from typing import Any, Callable
import numpy as np
import pytest
from tinyc import Device, GlobalCounters, Tensor
from tinyc.helpers import BEAM, Context
from tinyc.jit import TinyJit
from tinyc.ops import LoadOps
from tinyc.schedule import create_schedule
from tinyc import beam

def run_threads(work: Callable[[int], None], count: int, timeout_s: float = 120.0) -> None:
  """work(0), ..., work(count - 1) on as many threads released together; re-raises the first exception a thread raised."""
  errors: list[BaseException] = []
  start = threading.Barrier(count)
  def body(number: int) -> None:
    try:
      start.wait()
      work(number)
    except BaseException as error:  # noqa: BLE001 - every failure of a thread is the test's failure
      errors.append(error)
  threads = [threading.Thread(target=body, args=(number,), name=f"test-thread-{number}") for number in range(count)]
  for thread in threads: thread.start()
  for thread in threads: thread.join(timeout_s)
  assert not any(thread.is_alive() for thread in threads), f"a thread still runs after {timeout_s} s"
  if errors: raise errors[0]

@pytest.fixture(autouse=True)
def frequent_switches():
  """Switch threads every 10 us instead of every 5 ms, so that races show up in a short test."""
  interval = sys.getswitchinterval()
  sys.setswitchinterval(1e-5)
  yield
  sys.setswitchinterval(interval)

# ***** the stress test: mixed ops on mixed shapes from many threads, from a fresh process *****

DIMS = (3, 7, 12)  # an op's dims come from these, except that some ops get a number of rows no other op has (a kernel to compile)
FRESH_EVERY = {"LLVM": 16}  # one op in this many has fresh rows: LLVM compiles in ~30 ms, PoCL in ~400 ms (the default, 1 in 100)
SHARED_SHAPE = (4, 6)

def random_op(rng: np.random.Generator, shared: tuple[Tensor, np.ndarray], fresh_rows: int | None) -> tuple[str, Tensor, np.ndarray]:
  """One op of a random kind on random dims (`fresh_rows` rows if given): (kind, tinyc result, numpy result)."""
  rows, cols, inner = (int(rng.choice(DIMS)) for _ in range(3))
  rows = fresh_rows or rows
  a, b = rng.standard_normal((rows, cols), dtype=np.float32), rng.standard_normal((1, cols), dtype=np.float32)
  kind = str(rng.choice(["elementwise", "reduce", "matmul", "movement", "softmax", "shared"]))
  if kind == "elementwise":  # kernels of one name with different code: a name given twice runs the wrong code on LLVM
    variant = int(rng.integers(3))
    ta, tb = Tensor(a), Tensor(b)
    if variant == 0: return kind, (ta * tb + 1).relu(), np.maximum(a * b + 1, 0)
    return (kind, ta * tb - 1, a * b - 1) if variant == 1 else (kind, (ta + tb) * 0.5, (a + b) * 0.5)
  if kind == "reduce":
    axis = int(rng.integers(2))
    return kind, (Tensor(a).sum(axis) if axis else Tensor(a).max(axis)), (a.sum(axis) if axis else a.max(axis))
  if kind == "matmul":
    w = rng.standard_normal((cols, inner), dtype=np.float32)
    return kind, Tensor(a) @ Tensor(w), a @ w
  if kind == "movement":
    return kind, Tensor(a).T.pad(((1, 0), (0, 2))).flip(0) + 1, np.flip(np.pad(a.T, ((1, 0), (0, 2))), 0) + 1
  if kind == "softmax":
    exp = np.exp(a - a.max(1, keepdims=True))
    return kind, Tensor(a).softmax(1), exp / exp.sum(1, keepdims=True)
  x = rng.standard_normal(SHARED_SHAPE, dtype=np.float32)  # a value other threads compute at the same time
  return kind, (Tensor(x) + shared[0]).sum(1), (x + shared[1]).sum(1)

def stress(threads: int = 8, ops: int = 300) -> None:
  """`threads` threads each run `ops` random ops and check them against numpy. Nothing has opened the device when they start;
  op number i of every thread also reads shared[i], a lazy value the main thread makes meanwhile and no thread has computed."""
  sys.setswitchinterval(1e-5)  # switch threads every 10 us instead of every 5 ms, so that races show up
  fresh_every = FRESH_EVERY.get(Device.DEFAULT, 100)
  shared: list[tuple[Tensor, np.ndarray]] = []
  shared_made = threading.Event()
  def work(number: int) -> None:
    rng = np.random.default_rng(number)
    for op in range(ops):
      fresh_rows = 20 + number * ops + op if rng.integers(fresh_every) == 0 else None
      if op: shared_made.wait()  # the first op of each thread runs before (the threads open the device at once)
      kind, ours, expected = random_op(rng, shared[op] if op else (Tensor.ones(*SHARED_SHAPE), np.ones(SHARED_SHAPE)), fresh_rows)
      np.testing.assert_allclose(ours.numpy(), expected, rtol=1e-4, atol=1e-5, err_msg=f"thread {number}, op {op} ({kind})")
  def make_shared() -> None:
    arrays = [np.random.default_rng(1000 + op).standard_normal(SHARED_SHAPE[::-1], dtype=np.float32) for op in range(ops)]
    shared.extend(((Tensor(array) * 2).T.contiguous(), array.T * 2) for array in arrays)  # a kernel of its own, read by the op's
    shared_made.set()
  threading.Thread(target=make_shared).start()
  run_threads(work, threads)

def test_many_threads_run_mixed_ops_from_a_fresh_process(tinyc_device):
  """The stress test, in a new interpreter (a crash there fails this test instead of ending the run)."""
  environment = {**os.environ, "DEVICE": Device.DEFAULT, "PYTHONPATH": os.pathsep.join(path for path in sys.path if path)}
  started = time.perf_counter()
  done = subprocess.run([sys.executable, __file__], env=environment, capture_output=True, text=True, timeout=600)
  output = (done.stdout + done.stderr)[-3000:]
  assert done.returncode != -signal.SIGSEGV, f"the interpreter crashed (segmentation fault):\n{output}"
  assert done.returncode == 0, f"exit status {done.returncode}:\n{output}"
  print(f"stress test on {Device.DEFAULT}: {time.perf_counter() - started:.1f} s")

# ***** focused tests *****

def fresh_asts(count: int) -> list[Any]:
  """`count` kernels of one shape (so of one kernel name) that no other test makes: different constants."""
  shape = (5, 11)
  return [next(item.ast for item in create_schedule([(Tensor.empty(*shape) * (0.25 + number)).lazydata]) if item.ast.op not in LoadOps)
          for number in range(count)]

def test_the_program_cache_compiles_each_kernel_once_and_names_them_apart(tinyc_device, monkeypatch):
  device = Device[Device.DEFAULT]
  compiled: list[str] = []
  original = device.compile_binary or device.compile
  def counting_compile(name: str, source: str) -> Any:
    compiled.append(name)
    time.sleep(0.01)  # a slow compiler: every thread asks before the first is done
    return original(name, source)
  monkeypatch.setattr(device, "compile_binary" if device.compile_binary else "compile", counting_compile)
  asts = fresh_asts(4)
  programs: dict[int, list[Any]] = {number: [] for number in range(8)}
  run_threads(lambda number: programs[number].extend(device.get_program(ast) for ast in asts), 8)
  assert sorted(compiled) == sorted(set(compiled)) and len(compiled) == len(asts), compiled
  for number in range(8): assert all(program is first for program, first in zip(programs[number], programs[0])), f"thread {number}"
  assert len({program.name for program in programs[0]}) == len(asts), [program.name for program in programs[0]]

def test_a_value_shared_by_threads_is_computed_once(tinyc_device):
  array = np.arange(24, dtype=np.float32).reshape(6, 4)
  shared = (Tensor(array) * 3).T.contiguous()  # a kernel of its own (schedule.py rule 5)
  kernels_before = GlobalCounters.kernel_count
  results: dict[int, np.ndarray] = {}
  def work(number: int) -> None: results[number] = (shared + (number + 1)).numpy()
  run_threads(work, 8)
  for number in range(8): np.testing.assert_array_equal(results[number], (array * 3).T + number + 1)
  # the first thread's kernel also stores the shared value (schedule.py rule 8); a thread that scheduled it too finds it computed and
  # schedules its own output again, reading it (realize.py's STALE): computed twice, this would be 9 kernels or more
  assert GlobalCounters.kernel_count - kernels_before == 8, "the shared value was computed more than once"

def test_concurrent_allocations_never_hand_out_a_block_twice(tinyc_device):
  allocator = Device[Device.DEFAULT].allocator
  live: set[int] = set()
  live_lock = threading.Lock()
  def work(number: int) -> None:
    for step in range(300):
      nbytes = 64 * (1 + step % 3)
      blocks = [allocator.alloc(nbytes) for _ in range(2)]
      with live_lock:
        assert not any(id(block) in live for block in blocks), "one block handed to two owners"
        live.update(id(block) for block in blocks)
      with live_lock: live.difference_update(id(block) for block in blocks)
      for block in blocks: allocator.free(block, nbytes)
      if number == 0 and step % 50 == 0: allocator.free_cache()
  run_threads(work, 8)

def test_tinyjit_captures_only_its_own_threads_kernels(tinyc_device):
  @TinyJit
  def step(x: Tensor) -> Tensor:
    out = (x * 2 + 1).realize()
    time.sleep(0.05)  # the other thread runs kernels meanwhile, also while this call captures
    return out
  done = threading.Event()
  def work(number: int) -> None:
    if number == 0:
      try:
        for call in range(4):
          x = np.full(8, call, dtype=np.float32)
          np.testing.assert_array_equal(step(Tensor(x)).numpy(), x * 2 + 1, err_msg=f"call {call}")
      finally: done.set()
    else:
      while not done.is_set(): (Tensor(np.ones(3, np.float32)) - 5).numpy()
  run_threads(work, 2)
  assert len(step.steps) == 1, f"the capture holds {len(step.steps)} kernels: it recorded another thread's"

def test_context_settings_stay_in_their_thread():
  entered, checked = threading.Event(), threading.Event()
  seen: dict[str, Any] = {}
  def work(number: int) -> None:
    if number == 0:
      with Context(BEAM=3):
        entered.set()
        checked.wait(10)
        seen["inside"] = BEAM.value
    else:
      entered.wait(10)
      seen["other thread"] = BEAM.value
      checked.set()
  with Context(BEAM=0): run_threads(work, 2)
  assert seen == {"inside": 3, "other thread": 0}, seen

def test_beam_from_two_threads_at_once_searches_each_kernel_once(tinyc_device, tmp_path, monkeypatch):
  if Device[Device.DEFAULT].compile_binary is None: pytest.skip(f"{Device.DEFAULT} cannot build in worker processes")
  monkeypatch.setenv("CACHEDB", str(tmp_path / "beam.db"))
  monkeypatch.setenv("BEAM_MAX_STEPS", "1")
  monkeypatch.setattr(beam, "_chosen", {})
  searched: list[Any] = []
  original = beam.search
  def counting_search(device: Any, ast: Any, max_steps: int | None = None) -> Any:
    searched.append(ast)
    return original(device, ast, max_steps)
  monkeypatch.setattr(beam, "search", counting_search)
  array = np.random.default_rng(0).standard_normal((6, 10), dtype=np.float32)
  results: dict[tuple[int, int], np.ndarray] = {}
  def work(number: int) -> None:
    with Context(BEAM=1):  # both threads need the same two kernels at the same time
      for scale in (5, 6): results[(number, scale)] = (Tensor(array) * scale).sum(1).numpy()
  run_threads(work, 2, timeout_s=300)
  for (number, scale), result in results.items(): np.testing.assert_allclose(result, (array * scale).sum(1), rtol=1e-5, err_msg=f"{number} {scale}")
  assert len(results) == 4 and len(searched) == len(set(searched)) == 2, f"{len(searched)} searches of {len(set(searched))} kernels"

if __name__ == "__main__": stress()
