"""exp2 and log2 on the CPU: fused kernels that are mostly transcendentals, tinyc beside PyTorch (CPU) in one run, medians.

  CACHE_DIR=$(mktemp -d) python bench/bench_transcendental.py   # an empty program cache, so the first call's compile is timed

The first-call column is one call that builds the kernel (LLVM's O3 and machine code: what an inline polynomial could inflate).
"""
from __future__ import annotations
import statistics, time
from typing import Callable
import numpy as np
import torch
from tinyc import Tensor

def median_ms(fn: Callable[[], object], repeats: int = 15) -> tuple[float, float]:
  """(first call, median of the rest), in ms."""
  start = time.perf_counter()
  fn()
  first = time.perf_counter() - start
  times = []
  for _ in range(repeats):
    start = time.perf_counter()
    fn()
    times.append(time.perf_counter() - start)
  return first * 1e3, statistics.median(times) * 1e3

def main() -> None:
  rng = np.random.default_rng(0)
  scores, activations = rng.standard_normal((8, 4, 256, 256), np.float32), rng.standard_normal((2048, 512), np.float32)
  positive = np.abs(scores) + 1e-3
  cases = {"softmax (8,4,256,256)": (scores, lambda t: t.softmax(-1), lambda t: t.softmax(-1)),
           "exp 2M": (scores, lambda t: t.exp(), lambda t: t.exp()),
           "log 2M": (positive, lambda t: t.log(), lambda t: t.log()),
           "tanh-gelu (2048,512)": (activations, lambda t: t.gelu(), lambda t: torch.nn.functional.gelu(t, approximate="tanh")),
           "sigmoid 2M": (scores, lambda t: t.sigmoid(), lambda t: t.sigmoid())}
  print(f"{'kernel':24s} {'tinyc ms':>9s} {'torch ms':>9s} {'ratio':>6s} {'first call ms':>14s}")
  for name, (array, ours, theirs) in cases.items():
    ours_in, torch_in = Tensor(array).realize(), torch.from_numpy(array)
    first, ours_ms = median_ms(lambda: ours(ours_in).realize())
    time.sleep(0.3)  # tinyc's CPU threads and torch's OpenMP threads spin for a while after a call, on the cores the other needs
    _, torch_ms = median_ms(lambda: theirs(torch_in))
    print(f"{name:24s} {ours_ms:9.2f} {torch_ms:9.2f} {ours_ms / torch_ms:6.1f} {first:14.1f}")

if __name__ == "__main__": main()
