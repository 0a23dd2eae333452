"""The LLVM backend runs a kernel's outermost global loop on several CPU threads: results do not depend on the thread count,
the work really is split, small kernels and kernels without a global loop run on one thread, and failures do not hang."""
import ctypes, multiprocessing, signal, threading, time
import numpy as np
import pytest
import tinyc.codegen.cpu_split as cpu_split
import tinyc.runtime.ops_llvm as ops_llvm
import tinyc.runtime.cpu_pool as cpu_pool
from tinyc import Device, Tensor
from tinyc.device import Programs
from tinyc.codegen.kernel import Kernel
from tinyc.codegen.linearizer import Linearizer
from tinyc.codegen.llvmir import render_llvm
from tinyc.codegen.uops import GlobalBuffer, Loop, UOp, UOps
from tinyc.device import Buffer, cpu_launch_sizes
from tinyc.dtype import dtypes
from tinyc.ops import BinaryOps
from tinyc.helpers import Context
from tinyc.schedule import create_schedule
from tinyc.jit import TinyJit

def record_runs(monkeypatch: pytest.MonkeyPatch) -> list[list[tuple[int, int]]]:
  """The ranges each kernel run with a global loop is given, from now on (programs compiled before are forgotten)."""
  monkeypatch.setattr(Device["LLVM"], "programs", Programs())
  runs: list[list[tuple[int, int]]] = []
  original = ops_llvm.run_ranges
  def recording(function, pointers, ranges, *address):  # type: ignore[no-untyped-def]
    runs.append(ranges)
    original(function, pointers, ranges, *address)
  monkeypatch.setattr(ops_llvm, "run_ranges", recording)
  return runs

@pytest.fixture
def split_runs(monkeypatch: pytest.MonkeyPatch) -> list[list[tuple[int, int]]]:
  """Every kernel compiled in the test is worth splitting, however small; the ranges each run was given."""
  monkeypatch.setattr(cpu_split, "CPU_WORK_PER_THREAD", 1)
  return record_runs(monkeypatch)

def kernels(x: np.ndarray, w: np.ndarray) -> dict[str, tuple[Tensor, np.ndarray]]:
  """Elementwise, reductions along and across the outer axis, a matmul: (tinyc result, numpy result) by name."""
  tx, tw = Tensor(x, device="LLVM"), Tensor(w, device="LLVM")
  return {"elementwise": (tx * 2 + tx.exp(), x * 2 + np.exp(x)), "row sum": (tx.sum(1), x.sum(1)), "row max": (tx.max(1), x.max(1)),
          "column sum": (tx.sum(0), x.sum(0)), "matmul": (tx @ tw, x @ w), "full sum": (tx.sum(), x.sum()),
          "transposed": ((tx.T + 1).contiguous(), x.T + 1)}

@pytest.mark.parametrize("rows", [7, 13, 1001])
def test_results_equal_numpy_and_each_other_for_any_thread_count(rows, split_runs):
  rng = np.random.default_rng(rows)
  x, w = rng.standard_normal((rows, 19), dtype=np.float32), rng.standard_normal((19, 5), dtype=np.float32)
  results: dict[int, dict[str, np.ndarray]] = {}
  for threads in (1, 3, 0):  # 0: one per core
    with Context(CPU_THREADS=threads): results[threads] = {name: ours.numpy() for name, (ours, _) in kernels(x, w).items()}
  for name, (_, expected) in kernels(x, w).items():
    np.testing.assert_allclose(results[1][name], expected, rtol=1e-4, atol=1e-4, err_msg=name)
    for threads in (3, 0):
      # A column sum's short reduce loop is unrolled and gidx0 vectorized; with reassociation LLVM sums the scalar remainder's
      # elements as a tree, so the last bit of those where a range ends depends on the split (as it does on the size already)
      if name == "column sum": np.testing.assert_allclose(results[threads][name], results[1][name], rtol=1e-6, atol=1e-6)
      else: np.testing.assert_equal(results[threads][name], results[1][name], err_msg=f"{name}, {threads} threads")
  assert any(len(ranges) == 3 for ranges in split_runs), "CPU_THREADS=3 split no kernel in three"

def test_the_outer_loop_is_split_into_contiguous_ranges_run_on_native_workers(split_runs):
  x = np.arange(1001 * 3, dtype=np.float32).reshape(1001, 3)
  with Context(CPU_THREADS=3): np.testing.assert_equal((Tensor(x, device="LLVM") * 2).numpy(), x * 2)  # every range ran
  ranges = split_runs[-1]
  assert len(ranges) == 3 and ranges[0][0] == 0 and all(a[1] == b[0] for a, b in zip(ranges, ranges[1:])), ranges
  assert max(end - start for start, end in ranges) - min(end - start for start, end in ranges) <= 1, ranges
  pool = cpu_pool.native_pool(ops_llvm.compile_pool)  # the two ranges after the caller's were two jobs, each finished
  assert pool is not None and len(pool.jobs) >= 2 and all(job[cpu_pool.DONE] == seq > 0 for job, seq in zip(pool.jobs[:2], pool.seqs))

def test_a_job_no_worker_takes_is_run_by_the_caller():
  """The caller claims each job a worker has not (a worker asleep; here one that has stopped) and runs it itself: a kernel's ranges
  never wait for a sleeping worker. A doubling kernel split in two, its second range left to a pool whose worker has exited."""
  source = render_llvm("doubling_stolen", doubling_uops(Loop("rows", vectorize=False, outermost_global=True)))
  Device["LLVM"].compile("doubling_stolen", source)  # (a second engine would take the process's target machine with it when freed)
  pool = cpu_pool.NativePool(ops_llvm.compile_pool())
  pool.grow(1)
  pool.stop()
  time.sleep(0.05)  # the worker sees the stop within 10 ms (its longest sleep) and exits
  values = np.arange(64, dtype=np.float32)
  inp, out = Buffer("LLVM", 64, dtypes.float32).copyin(values), Buffer("LLVM", 64, dtypes.float32)
  address = Device["LLVM"].compile.__self__.cache[source]
  pool.run(ctypes.CFUNCTYPE(None)(address), address, [out.opaque, inp.opaque], [(0, 32), (32, 64)])
  np.testing.assert_equal(out.numpy(), values * 2)
  assert pool.jobs[0][cpu_pool.DONE] == pool.jobs[0][cpu_pool.CLAIM] == 1

def test_split_range_covers_the_range_with_enough_rows_each():
  for rows in (1, 2, 7, 13, 1001):
    for min_rows in (1, 3, 500):
      for threads in (1, 2, 3, 16):
        ranges = cpu_split.split_range(rows, min_rows, threads)
        assert [start for start, _ in ranges] == [0] + [end for _, end in ranges[:-1]] and ranges[-1][1] == rows
        assert all(start < end for start, end in ranges) and len(ranges) <= threads
        assert len(ranges) == 1 or all(end - start >= min_rows for start, end in ranges), (rows, min_rows, threads, ranges)

def test_small_kernels_run_on_one_thread_and_large_ones_are_split(monkeypatch):
  monkeypatch.setattr(cpu_split, "CPU_WORK_PER_THREAD", 1 << 20)
  runs = record_runs(monkeypatch)
  with Context(CPU_THREADS=2):
    (Tensor(np.ones((4, 4), np.float32), device="LLVM") + 1).realize()
    small = next(iter(Device["LLVM"].programs.values()))
    assert not runs and small.global_size is None, "a 16-element kernel must not pay for threads"
    big = np.ones((1024, 1024), np.float32)
    np.testing.assert_equal((Tensor(big, device="LLVM") * 3).numpy(), big * 3)
    assert len(runs[-1]) == 2, "a kernel of 3M ops is worth two threads of at least 1M each"

def test_only_split_kernels_take_a_range(monkeypatch):
  # constant loop bounds let LLVM unroll a small kernel instead of emitting vector code for any trip count: it compiles 2x faster
  monkeypatch.setattr(cpu_split, "CPU_WORK_PER_THREAD", 1 << 20)
  small, big = np.ones((4, 4), np.float32), np.ones((1024, 1024), np.float32)
  for array, takes_range in ((small, False), (big, True)):
    (item,) = create_schedule([(Tensor(array, device="LLVM").realize() * 3).lazydata])
    uops = Linearizer(Kernel(item.ast)).linearize()
    assert (cpu_split.outer_split(uops) is not None) == takes_range
    assert ('i64 %"start", i64 %"end"' in render_llvm("k", uops)) == takes_range

def doubling_uops(loop: Loop) -> list[UOp]:
  """out[i] = 2 * in[i] for i in [0, 64), in one loop."""
  f32, i32 = dtypes.float32, dtypes.int32
  out, inp = (UOp(UOps.DEFINE_GLOBAL, f32, (), GlobalBuffer(f"data{number}", number, number == 0)) for number in range(2))
  start, end, two = UOp(UOps.CONST, i32, (), 0), UOp(UOps.CONST, i32, (), 64), UOp(UOps.CONST, f32, (), 2.0)
  row = UOp(UOps.LOOP, i32, (start, end), loop)
  value = UOp(UOps.LOAD, f32, (inp, row))
  doubled = UOp(UOps.ALU, f32, (value, two), BinaryOps.MUL)
  return [out, inp, start, end, two, row, value, doubled, UOp(UOps.STORE, None, (out, row, doubled)), UOp(UOps.END, None, (row,))]

def test_a_gelu_backward_of_a_million_elements_runs_on_two_threads(monkeypatch):
  """About 34 ops an element (the tanh's exp inline): 35M in all, 1.6-1.8 ms on one core of the 2-core guest, 1.0 on two."""
  runs = record_runs(monkeypatch)
  x = Tensor(np.linspace(-3, 3, 1 << 20, dtype=np.float32).reshape(2048, 512), device="LLVM", requires_grad=True)
  (x.gelu() * 2).sum().backward()
  assert x.grad is not None
  with Context(CPU_THREADS=2): x.grad.realize()
  assert [len(ranges) for ranges in runs] == [2], runs

def test_a_gelu_of_a_million_elements_runs_on_two_threads(monkeypatch):
  """A bias add and tanh-gelu forward (the GPT's): 22 uops an element, but its exp2 is 20 ALU ops inline (cpu_split.INLINE_ALU_OPS),
  about 41M in all: worth two threads, where counting the exp as one op kept it on one."""
  runs = record_runs(monkeypatch)
  x = Tensor(np.linspace(-3, 3, 1 << 20, dtype=np.float32).reshape(2048, 512), device="LLVM")
  bias = Tensor(np.linspace(-1, 1, 512, dtype=np.float32), device="LLVM")
  with Context(CPU_THREADS=2): out = (x + bias).gelu().numpy()
  assert [len(ranges) for ranges in runs] == [2], runs
  y = np.linspace(-3, 3, 1 << 20, dtype=np.float32).reshape(2048, 512) + np.linspace(-1, 1, 512, dtype=np.float32)
  np.testing.assert_allclose(out, 0.5 * y * (1 + np.tanh(0.7978845608 * (y + 0.044715 * y ** 3))), rtol=1e-5, atol=1e-6)

@pytest.mark.parametrize("name, outermost_global", [("rows", True), ("gidx0", False)])
def test_the_loop_split_is_the_one_marked_outermost_global_whatever_its_name(name, outermost_global, split_runs):
  uops = doubling_uops(Loop(name, vectorize=False, outermost_global=outermost_global))
  source = render_llvm(f"doubling_{name}", uops)
  assert ('i64 %"start", i64 %"end"' in source) == outermost_global, source
  global_size, local_size = cpu_launch_sizes(uops)
  values = np.arange(64, dtype=np.float32)
  inp, out = Buffer("LLVM", 64, dtypes.float32).copyin(values), Buffer("LLVM", 64, dtypes.float32)
  run = Device["LLVM"].compile(f"doubling_{name}", source)
  with Context(CPU_THREADS=3): run([out.opaque, inp.opaque], global_size=global_size, local_size=local_size)
  np.testing.assert_equal(out.numpy(), values * 2)
  assert [len(ranges) for ranges in split_runs] == ([3] if outermost_global else [])

def test_kernel_without_a_global_loop_takes_no_range(split_runs):
  x = np.arange(100, dtype=np.float32)
  assert Tensor(x, device="LLVM").sum().item() == x.sum()
  assert not split_runs

def test_jit_replay_runs_split_kernels(split_runs):
  @TinyJit
  def step(a: Tensor, b: Tensor) -> Tensor: return (a @ b).relu() + a.sum(1, keepdim=True)
  rng = np.random.default_rng(0)
  with Context(CPU_THREADS=3):
    for call in range(4):
      a, b = rng.standard_normal((13, 8), dtype=np.float32), rng.standard_normal((8, 8), dtype=np.float32)
      np.testing.assert_allclose(step(Tensor(a, device="LLVM"), Tensor(b, device="LLVM")).numpy(), np.maximum(a @ b, 0) + a.sum(1, keepdims=True),
                                 rtol=1e-5, atol=1e-5, err_msg=f"call {call}")
  assert step.calls == 2 and split_runs and all(len(ranges) > 1 for ranges in split_runs)

def test_a_failing_range_raises_after_every_range_has_finished():
  finished: list[int] = []
  def kernel(start, end):  # type: ignore[no-untyped-def]
    if start.value == 1: raise ValueError("range 1 failed")
    threading.Event().wait(0.05)
    finished.append(start.value)
  with Context(CPU_THREADS=3), pytest.raises(ValueError, match="range 1 failed"): ops_llvm.run_ranges(kernel, [], [(0, 1), (1, 2), (2, 3)])
  assert sorted(finished) == [0, 2]

def test_ctrl_c_while_waiting_takes_effect_once_every_range_has_finished():
  finished: list[int] = []
  def kernel(start, end):  # type: ignore[no-untyped-def]
    if start.value: threading.Event().wait(0.3)  # a slow range on a pool thread, while the caller waits for it
    finished.append(start.value)
  def interrupt(signum, frame): raise KeyboardInterrupt  # type: ignore[no-untyped-def]
  previous = signal.signal(signal.SIGALRM, interrupt)
  try:
    signal.setitimer(signal.ITIMER_REAL, 0.1)
    with pytest.raises(KeyboardInterrupt): ops_llvm.run_ranges(kernel, [], [(0, 1), (1, 2)])
  finally: signal.signal(signal.SIGALRM, previous)
  assert sorted(finished) == [0, 1]

def _run_split_kernel_in_child(queue) -> None:  # type: ignore[no-untyped-def]
  x = np.arange(4096, dtype=np.float32).reshape(64, 64)
  with Context(CPU_THREADS=2): queue.put(bool(((Tensor(x, device="LLVM") + 1).numpy() == x + 1).all()))

def test_a_forked_child_makes_its_own_pool(split_runs):
  _run_split_kernel_in_child(multiprocessing.Queue())  # the parent's pool exists and the kernel is compiled
  context = multiprocessing.get_context("fork")
  queue = context.Queue()
  child = context.Process(target=_run_split_kernel_in_child, args=(queue,))
  child.start()
  try: assert queue.get(timeout=60) is True
  finally: child.join(10)
