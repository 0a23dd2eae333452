"""Core engine benchmark: tinyc beside numpy and PyTorch (CPU) in one run, medians of repeated timings.

  python bench/bench_core.py            # the issue's sizes (16M elements, softmax 4096x4096, matmul 512/1024)
  python bench/bench_core.py --quick    # small sizes, for a smoke run

The matmul layout table multiplies square float32 arrays in each layout: N a contiguous array, T a transposed view of one
(`a.T @ b.T` is TT), at 1024 and 1000 (a power of two and not).

Throughput ratios are tinyc / reference (higher is better for tinyc). Overheads are absolute times.
"""
from __future__ import annotations
import argparse, itertools, statistics, time
from typing import Any, Callable
import numpy as np
from tinyc import Tensor, Device

try:
  import torch
except ImportError:  # the table then shows '-' for torch
  torch = None

first_call_s: list[float] = []  # tinyc's warm-up call of each row: compiles, and with BEAM=n the search

# numpy's OpenBLAS and torch's OpenMP threads spin for a while after a call, on the cores the next library's threads need: a
# matmul of tinyc's timed right after numpy's ran 15 ms against 7.8 0.2 s later (1024, 2 cores). Each timing waits it out
SPIN_PAUSE_S = 0.3

def median_seconds(fn: Callable[[], object], repeats: int, tinyc: bool = True) -> float:
  started = time.perf_counter()
  fn()  # warm-up: compiles, fills allocator caches
  if tinyc: first_call_s.append(time.perf_counter() - started)
  time.sleep(SPIN_PAUSE_S)
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return statistics.median(times)

def row(name: str, unit: str, work: float, ours: float, numpy_s: float | None, torch_s: float | None) -> str:
  rate = lambda seconds: f"{work / seconds / 1e9:9.2f}" if seconds else "        -"  # noqa: E731
  ratio = lambda seconds: f"{seconds / ours:6.2f}x" if seconds else "      -"  # noqa: E731
  first = first_call_s[-1]
  return f"{name:28s} {rate(ours)} {rate(numpy_s)} {rate(torch_s)} {unit:7s}  {ratio(numpy_s)}  {ratio(torch_s)}   first call {first:6.2f} s"

def view(array: Any, letter: str) -> Any:
  """`array` (tinyc, numpy or torch) in a matmul layout's letter: T a transposed view, N as it is."""
  return array.T if letter == "T" and array is not None else array

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--quick", action="store_true", help="small sizes")
  parser.add_argument("--repeats", type=int, default=7)
  args = parser.parse_args()
  n = 1 << 16 if args.quick else 16 << 20
  softmax_shape = (256, 256) if args.quick else (4096, 4096)
  matmul_sizes = (64, 128) if args.quick else (512, 1024)
  rng = np.random.default_rng(0)
  print(f"device {Device.DEFAULT}; torch threads {torch.get_num_threads() if torch else '-'}; medians of {args.repeats}")
  print(f"{'':28s} {'tinyc':>9s} {'numpy':>9s} {'torch':>9s} {'':7s}  {'vs numpy':>7s} {'vs torch':>7s}")

  a, b, c = (rng.standard_normal(n, dtype=np.float32) for _ in range(3))
  ta, tb, tc = (Tensor(x).realize() for x in (a, b, c))
  pa, pb, pc = (torch.from_numpy(x) for x in (a, b, c)) if torch else (None, None, None)
  bytes_fma = 4 * n * 4  # three reads and one write
  print(row(f"a*b+c  {n >> 20}M f32", "GB/s", bytes_fma, median_seconds(lambda: (ta * tb + tc).realize(), args.repeats),
            median_seconds(lambda: a * b + c, args.repeats, tinyc=False),
            median_seconds(lambda: pa * pb + pc, args.repeats, tinyc=False) if torch else None))
  print(row(f"sum    {n >> 20}M f32", "GB/s", 4 * n, median_seconds(lambda: ta.sum().realize(), args.repeats),
            median_seconds(lambda: a.sum(), args.repeats, tinyc=False),
            median_seconds(lambda: pa.sum(), args.repeats, tinyc=False) if torch else None))

  x = rng.standard_normal(softmax_shape, dtype=np.float32)
  tx, px = Tensor(x).realize(), torch.from_numpy(x) if torch else None
  def numpy_softmax() -> np.ndarray:
    e = np.exp(x - x.max(-1, keepdims=True))
    return e / e.sum(-1, keepdims=True)
  print(row(f"softmax {softmax_shape}", "GB/s", 2 * x.nbytes, median_seconds(lambda: tx.softmax(-1).realize(), args.repeats),
            median_seconds(numpy_softmax, args.repeats, tinyc=False),
            median_seconds(lambda: px.softmax(-1), args.repeats, tinyc=False) if torch else None))

  for size in matmul_sizes:
    m1, m2 = rng.standard_normal((size, size), dtype=np.float32), rng.standard_normal((size, size), dtype=np.float32)
    t1, t2 = Tensor(m1).realize(), Tensor(m2).realize()
    p1, p2 = (torch.from_numpy(m1), torch.from_numpy(m2)) if torch else (None, None)
    repeats = 3 if size >= 1024 else args.repeats
    print(row(f"matmul {size} f32", "GFLOP/s", 2 * size ** 3, median_seconds(lambda: (t1 @ t2).realize(), repeats),
              median_seconds(lambda: m1 @ m2, repeats, tinyc=False), median_seconds(lambda: p1 @ p2, repeats, tinyc=False) if torch else None))

  print("\nmatmul layouts (N: contiguous, T: a transposed view)")
  for size in (64, 100) if args.quick else (1024, 1000):
    m1, m2 = rng.standard_normal((size, size), dtype=np.float32), rng.standard_normal((size, size), dtype=np.float32)
    t1, t2 = Tensor(m1).realize(), Tensor(m2).realize()
    p1, p2 = (torch.from_numpy(m1), torch.from_numpy(m2)) if torch else (None, None)
    for layout in ("NN", "NT", "TN", "TT"):
      (l1, l2), (n1, n2), (q1, q2) = ((view(x, layout[0]), view(y, layout[1])) for x, y in ((t1, t2), (m1, m2), (p1, p2)))
      repeats = 5 if size >= 1000 else args.repeats
      print(row(f"matmul {layout} {size} f32", "GFLOP/s", 2 * size ** 3, median_seconds(lambda: (l1 @ l2).realize(), repeats),
                median_seconds(lambda: n1 @ n2, repeats, tinyc=False), median_seconds(lambda: q1 @ q2, repeats, tinyc=False) if torch else None))

  small = Tensor(rng.standard_normal((4, 4), dtype=np.float32)).realize()
  warm = median_seconds(lambda: ((small + 1) * 2).realize(), 201)
  counter = itertools.count()
  def cold_graph() -> None:
    k = next(counter) + 0.5  # new constants every time: a new AST, so schedule + codegen + compile all run
    out = small
    for step in range(10): out = (out * k + step).relu() if step % 2 else out - k * step
    out.realize()
  cold = median_seconds(cold_graph, args.repeats)
  print(f"\nrealize overhead: warm small cached graph {warm * 1e6:8.1f} us   (target <= 50 us)")
  print(f"realize overhead: cold 10-op elementwise  {cold * 1e3:8.1f} ms   (target < 100 ms; schedule + codegen + LLVM O3 compile)")
  ours, theirs, where = eager_latency(rng)
  print(f"eager (a*b+1) 1024 f32: tinyc {ours * 1e6:7.1f} us   torch ({where}) {theirs * 1e6:7.1f} us   "
        f"{ours / theirs:5.2f}x torch's latency   (target <= 4x)" if theirs else f"eager (a*b+1) 1024 f32: tinyc {ours * 1e6:7.1f} us   torch -")

def eager_latency(rng: np.random.Generator, calls: int = 200, batches: int = 10) -> tuple[float, float | None, str]:
  """Seconds per call of `(a * b + 1).realize()` on 1024 float32 elements in a loop (a new lazy graph each call, no TinyJit), and of
  torch's `a * b + 1` on the same device (torch.cuda where tinyc runs on CUDA and torch has it, else the CPU): the median of every
  call's time, in batches of `calls` calls, each ended (untimed) by waiting for the device (tinyc: reading the last result; torch:
  synchronize). A median, as on this shared machine a few calls are stalled for milliseconds by other processes."""
  a, b = rng.standard_normal(1024, dtype=np.float32), rng.standard_normal(1024, dtype=np.float32)
  ta, tb = Tensor(a).realize(), Tensor(b).realize()
  on_cuda = Device.DEFAULT == "CUDA" and torch is not None and torch.cuda.is_available()
  pa, pb = (torch.from_numpy(a).to("cuda" if on_cuda else "cpu"), torch.from_numpy(b).to("cuda" if on_cuda else "cpu")) if torch else (None, None)
  def median(step: Callable[[], Any], wait: Callable[[Any], object]) -> float:
    times: list[float] = []
    for _ in range(batches + 1):  # the first batch warms up: compiles, fills the plan and allocator caches
      for _ in range(calls):
        start = time.perf_counter()
        out = step()
        times.append(time.perf_counter() - start)
      wait(out)
    return statistics.median(times[calls:])
  ours = median(lambda: (ta * tb + 1).realize(), lambda out: out.numpy())
  theirs = median(lambda: pa * pb + 1, lambda out: torch.cuda.synchronize() if on_cuda else None) if torch else None
  return ours, theirs, "cuda" if on_cuda else "cpu"

if __name__ == "__main__":
  main()
