"""GPU benchmark: tinyc beside PyTorch on the same GPU, in one run. Run with CUDA=1 (or GPU=1 for OpenCL).

  CUDA=1 python bench/bench_gpu.py [--quick]

Bandwidth counts bytes read + written; the ceilings are the H200's (device copy 4.1 TB/s, cuBLAS fp32 49.5 TFLOP/s without
TF32). Times are the device's own timers, medians of repeated runs. On CUDA both sides are timed alike, by events around the
kernels as the framework launches them (on the same stream): PyTorch's eagerly, tinyc's replayed from a capture as TinyJit
does, in one CUDA graph. On OpenCL tinyc's time is the sum of its kernels' profiling times.
"""
from __future__ import annotations
import argparse, statistics, time
from typing import Callable
import numpy as np
from tinyc import Tensor, Device, GlobalCounters, dtypes
from tinyc.device import Program
from tinyc.jit import TinyJit
from tinyc.realize import steps_run
from tinyc.runtime.nvrtc import compile_cuda
from tinyc.codegen.cstyle import render_cuda
from tinyc.codegen.kernel import Kernel
from tinyc.codegen.linearizer import Linearizer
from tinyc.schedule import create_schedule
import torch

COPY_CEILING_GBS, FP32_CEILING_TFLOPS = 4100.0, 49.5

first_realize_s: list[float] = []  # wall time of each row's first realize: compiles, and with BEAM=n the search

def tinyc_kernel_seconds(make: Callable[[], Tensor], repeats: int) -> float:
  """Median device time of realizing make() (all its kernels), after a warm-up that compiles them (and searches, with BEAM)."""
  started = time.perf_counter()
  make().realize()
  first_realize_s.append(time.perf_counter() - started)
  if Device.DEFAULT == "CUDA":  # tinyc launches on the primary context's default stream, the one torch's events are recorded on
    with steps_run.record() as steps: make().realize()
    graph = Device["CUDA"].graph(steps)
    return torch_seconds(lambda: graph([]) if graph is not None else [run(buffers) for run, buffers in steps], repeats)
  times = []
  for _ in range(repeats):
    GlobalCounters.reset()
    _timed_realize(make())
    times.append(GlobalCounters.time_sum_s)
  return statistics.median(times)

def _timed_realize(out: Tensor) -> None:
  """Realize with every kernel timed by the device's events (what DEBUG=2 does, without the printing)."""
  original = Program.__call__
  def timed(self: Program, buffers: list) -> None:  # type: ignore[type-arg]
    seconds = self.run(*[b.opaque for b in buffers], global_size=self.global_size, local_size=self.local_size, wait=True)
    GlobalCounters.kernel_count += 1
    GlobalCounters.time_sum_s += seconds or 0.0
  Program.__call__ = timed  # type: ignore[method-assign]
  try: out.realize()
  finally: Program.__call__ = original  # type: ignore[method-assign]

def torch_seconds(fn: Callable[[], object], repeats: int) -> float:
  fn()
  start, end, times = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True), []
  for _ in range(repeats):
    start.record()
    fn()
    end.record()
    torch.cuda.synchronize()
    times.append(start.elapsed_time(end) * 1e-3)
  return statistics.median(times)

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--repeats", type=int, default=10)
  parser.add_argument("--only", default="", help="run only the rows whose name contains this")
  args = parser.parse_args()
  n, side, mm = (1 << 20, 1024, 1024) if args.quick else (64 << 20, 8192, 4096)
  rng = np.random.default_rng(0)
  print(f"device {Device.DEFAULT}; torch {torch.__version__} on {torch.cuda.get_device_name()}; medians of {args.repeats}")
  print(f"{'':26s} {'tinyc':>12s} {'torch':>12s} {'tinyc/ceiling':>14s} {'torch time / tinyc time':>24s}")
  def wanted(name: str) -> bool: return args.only in name  # `name`: the row's full name
  def report(name: str, unit: str, work: float, ours: float, theirs: float, ceiling: float) -> None:
    rate = lambda s: work / s / (1e9 if unit == "GB/s" else 1e12)  # noqa: E731
    print(f"{name:26s} {rate(ours):8.1f} {unit:4s}{rate(theirs):8.1f} {unit:4s} {rate(ours) / ceiling * 100:12.1f}% {theirs / ours:20.2f}x"
          f"   first realize {first_realize_s[-1]:6.2f} s")

  a, b, c = (Tensor(rng.standard_normal(n, dtype=np.float32)).realize() for _ in range(3))
  ta, tb, tc = (torch.randn(n, device="cuda") for _ in range(3))
  row = f"a*b+c {n >> 20}M f32"
  if wanted(row):
    report(row, "GB/s", 16 * n, tinyc_kernel_seconds(lambda: a * b + c, args.repeats), torch_seconds(lambda: ta * tb + tc, args.repeats),
           COPY_CEILING_GBS)
  row = f"sum {n >> 20}M f32"
  if wanted(row):
    report(row, "GB/s", 4 * n, tinyc_kernel_seconds(lambda: a.sum(), args.repeats), torch_seconds(lambda: ta.sum(), args.repeats), COPY_CEILING_GBS)
  x, tx = Tensor(rng.standard_normal((side, side), dtype=np.float32)).realize(), torch.randn(side, side, device="cuda")
  row = f"softmax ({side}, {side})"
  if wanted(row):
    report(row, "GB/s", 8 * side * side, tinyc_kernel_seconds(lambda: x.softmax(-1), args.repeats),
           torch_seconds(lambda: tx.softmax(-1), args.repeats), COPY_CEILING_GBS)
  torch.backends.cuda.matmul.allow_tf32 = False
  for dtype, torch_dtype in ((dtypes.float32, torch.float32), (dtypes.float16, torch.float16)):
    if not wanted(f"matmul {mm} {dtype.name}"): continue
    m1 = Tensor(rng.standard_normal((mm, mm), dtype=np.float32)).cast(dtype).realize()
    m2 = Tensor(rng.standard_normal((mm, mm), dtype=np.float32)).cast(dtype).realize()
    t1, t2 = torch.randn(mm, mm, device="cuda", dtype=torch_dtype), torch.randn(mm, mm, device="cuda", dtype=torch_dtype)
    report(f"matmul {mm} {dtype.name}", "TFLOP/s", 2 * mm ** 3, tinyc_kernel_seconds(lambda: m1 @ m2, max(3, args.repeats // 3)),
           torch_seconds(lambda: t1 @ t2, args.repeats), FP32_CEILING_TFLOPS)

  batch, channels, image = (8, 16, 28) if args.quick else (64, 64, 56)
  images = Tensor(rng.standard_normal((batch, channels, image, image), dtype=np.float32)).realize()
  weights = Tensor(rng.standard_normal((channels, channels, 3, 3), dtype=np.float32)).realize()
  timages, tweights = torch.randn(batch, channels, image, image, device="cuda"), torch.randn(channels, channels, 3, 3, device="cuda")
  conv_flops = 2 * batch * channels * channels * image * image * 9
  conv_name = f"conv2d {batch}x{channels}x{image}² 3x3"
  ours = tinyc_kernel_seconds(lambda: images.conv2d(weights, padding=1), max(3, args.repeats // 3)) if wanted(conv_name) else 0.0
  for tf32 in (True, False) if wanted(conv_name) else ():  # PyTorch's default lets cuDNN use TF32 tensor cores for convolutions
    torch.backends.cudnn.allow_tf32 = tf32
    report(f"{conv_name}{' (torch TF32)' if tf32 else ''}", "TFLOP/s", conv_flops, ours,
           torch_seconds(lambda: torch.nn.functional.conv2d(timages, tweights, padding=1), args.repeats), FP32_CEILING_TFLOPS)

  if args.only: return
  # NVRTC compile time per kernel: fresh sources (a new constant each), compile only
  compile_ms = []
  for k in range(15):
    item = create_schedule([((a * (k + 0.25) + b).relu()).lazydata])[-1]
    source = render_cuda("bench", Linearizer(Kernel(item.ast), threads=True).linearize())
    start = time.perf_counter()
    compile_cuda("bench", source, "sm_90", "cubin")
    compile_ms.append((time.perf_counter() - start) * 1e3)
  print(f"\nNVRTC compile to cubin, median of 15 kernels: {statistics.median(compile_ms):.1f} ms   (target <= 20 ms)")

  # launch overhead on the replay path: a jitted chain of 50 tiny kernels, wall time per kernel
  small = Tensor(rng.standard_normal(256, dtype=np.float32)).realize()
  @TinyJit
  def chain(t: Tensor) -> Tensor:
    for step in range(50): t = (t * 1.0001 + step).contiguous().realize()
    return t
  for _ in range(3): chain(small)
  start = time.perf_counter()
  for _ in range(20): chain(small)
  chain(small).numpy()
  per_kernel_us = (time.perf_counter() - start) / (21 * 50) * 1e6
  print(f"launch overhead on the TinyJit replay path: {per_kernel_us:.1f} us per kernel   (target <= 10 us)")

if __name__ == "__main__":
  main()
