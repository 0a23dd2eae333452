"""GPU benchmark: tinyc beside PyTorch on the same GPU, in one run. Run with CUDA=1 (or GPU=1 for OpenCL).

  CUDA=1 python bench/bench_gpu.py [--quick] [--only NAME-PART]

Rows come in groups, each under a header line: bandwidth, the square matmul and conv2d rows, matmul in every layout and dtype,
batched and weight-gradient matmuls, conv2d forward and both gradients, and TF32.

The GEMM groups compare like with like: fp32 at float32's accuracy on both sides (torch.backends.cuda.matmul.allow_tf32 and
torch.backends.cudnn.allow_tf32 off; cuBLAS's reduced-precision-reduction settings left at their defaults; tinyc on CUDA runs
float32 products on tensor cores as 3xTF32, about 21 bits a product, where cuBLAS uses the float32 cores), fp16/bf16 against
torch's own fp16/bf16 matmul and cuDNN convolution (tinyc accumulates 16-bit sums in fp32), and the TF32 row with TF32 on both.

Bandwidth counts bytes read + written; the ceilings are the H200's (device copy 4.1 TB/s, cuBLAS fp32 49.5 TFLOP/s without
TF32). Times are the device's own timers, medians of repeated runs. On CUDA both sides are timed alike, by events around the
kernels as the framework launches them (on the same stream): PyTorch's eagerly, tinyc's replayed from a capture as TinyJit
does, in one CUDA graph. On OpenCL tinyc's time is the sum of its kernels' profiling times.
"""
from __future__ import annotations
import argparse, contextlib, math, statistics, time
from typing import Any, Callable, NamedTuple
import numpy as np
import tinyc.helpers
from tinyc import Tensor, Device, GlobalCounters, dtypes
from tinyc.device import Program
from tinyc.helpers import Context
from tinyc.jit import TinyJit
from tinyc.realize import steps_run
from tinyc.runtime.nvrtc import compile_cuda
from tinyc.codegen.cstyle import render_cuda
from tinyc.codegen.kernel import Kernel
from tinyc.codegen.linearizer import Linearizer
from tinyc.schedule import create_schedule
import torch
from torch.nn.grad import conv2d_input, conv2d_weight

COPY_CEILING_GBS, FP32_CEILING_TFLOPS = 4100.0, 49.5
TF32_CEILING_TFLOPS, FP16_CEILING_TFLOPS = 494.7, 989.4  # the H200's dense tensor-core peaks (data sheet): TF32, and fp16/bf16
NAME_WIDTH = 42  # the row-name column
TORCH_DEVICE = "cuda"  # where torch's side runs (a check of the tinyc side on a machine without CUDA may set "cpu")
DTYPES = {"fp32": (dtypes.float32, torch.float32, FP32_CEILING_TFLOPS), "fp16": (dtypes.float16, torch.float16, FP16_CEILING_TFLOPS),
          "bf16": (dtypes.bfloat16, torch.bfloat16, FP16_CEILING_TFLOPS)}

first_realize_s: list[float] = []  # wall time of each row's first realize: compiles, and with BEAM=n the search

def tinyc_kernel_seconds(make: Callable[[], Tensor], repeats: int) -> float:
  """Median device time of realizing make() (all its kernels), after a warm-up that compiles them (and searches, with BEAM)."""
  started = time.perf_counter()
  make().realize()
  first_realize_s.append(time.perf_counter() - started)
  if Device.DEFAULT == "CUDA":  # tinyc launches on the primary context's default stream, the one torch's events are recorded on
    with steps_run.record() as steps: make().realize()
    make_graph = Device["CUDA"].graph
    graph = make_graph(steps) if make_graph is not None else None
    if graph is not None: return torch_seconds(lambda: graph([]), repeats)
    return torch_seconds(lambda: [run(buffers, var_vals) for run, buffers, var_vals in steps], repeats)
  times = []
  for _ in range(repeats):
    GlobalCounters.reset()
    _timed_realize(make())
    times.append(GlobalCounters.time_sum_s)
  return statistics.median(times)

def _timed_realize(out: Tensor) -> None:
  """Realize with every kernel timed by the device's events (what DEBUG=2 does, without the printing)."""
  original = Program.__call__
  def timed(self: Program, buffers: list, var_vals: dict | None = None, shown: Any = None) -> None:  # type: ignore[type-arg]
    seconds = self.run([b.opaque for b in buffers], global_size=self.global_size, local_size=self.local_size, wait=True)
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

# ***** GEMM rows: each side makes its own inputs, and the function it times, from the row's shapes *****

class Row(NamedTuple):
  """One TFLOP/s line: a setup per side makes (and realizes) its inputs and returns what to time; tinyc's returns the lazy result,
  which the timer realizes. tf32: both sides may use TF32 (tinyc through Context(ALLOW_TF32=1), torch through its two flags)."""
  name: str
  flops: float
  tinyc: Callable[[], Callable[[], Tensor]]
  torch: Callable[[], Callable[[], object]]
  ceiling: float
  tf32: bool = False

def transposed(x: Any, flag: bool) -> Any: return x.transpose(-1, -2) if flag else x
def stored(shape: tuple[int, ...], flag: bool) -> tuple[int, ...]: return shape[:-2] + (shape[-1], shape[-2]) if flag else shape

def matmul_row(name: str, batch: tuple[int, ...], m: int, n: int, k: int, layout: str, dtype_name: str, tf32: bool = False) -> Row:
  """(batch, m, k) @ (batch, k, n) in a layout: "NT" is a @ b.T with b stored (batch, n, k), contiguous, and so on."""
  dtype, torch_dtype, ceiling = DTYPES[dtype_name]
  shapes = [stored((*batch, m, k), layout[0] == "T"), stored((*batch, k, n), layout[1] == "T")]
  def tinyc_setup() -> Callable[[], Tensor]:
    a, b = (Tensor.randn(*shape, dtype=dtype).realize() for shape in shapes)
    return lambda: transposed(a, layout[0] == "T") @ transposed(b, layout[1] == "T")
  def torch_setup() -> Callable[[], object]:
    a, b = (torch.randn(*shape, device=TORCH_DEVICE, dtype=torch_dtype) for shape in shapes)
    return lambda: transposed(a, layout[0] == "T") @ transposed(b, layout[1] == "T")
  return Row(name, 2.0 * math.prod(batch) * m * n * k, tinyc_setup, torch_setup, TF32_CEILING_TFLOPS if tf32 else ceiling, tf32)

def gradient(fn: Callable[..., Tensor], inputs: list[Tensor], wrt: int, upstream: Tensor) -> Tensor:
  """d sum(fn(*inputs) * upstream) / d inputs[wrt] as .backward() builds it in training, lazy: realizing it runs exactly the kernels
  of that gradient (it reads upstream, not fn's output; the other inputs get no gradient)."""
  leaves = [Tensor(x.lazydata, requires_grad=i == wrt) for i, x in enumerate(inputs)]
  (fn(*leaves) * upstream).sum().backward()
  grad = leaves[wrt].grad
  assert grad is not None, f"input {wrt} got no gradient"
  return grad

CONV_PASSES = ("fwd", "dgrad", "wgrad")  # forward, the gradient of the input, the gradient of the weight

def conv_row(name: str, batch: int, channels: int, size: int, conv_pass: str, dtype_name: str) -> Row:
  """A 3x3 conv2d with padding 1, channels -> channels on size x size images: its forward or one of its gradients."""
  dtype, torch_dtype, ceiling = DTYPES[dtype_name]
  x_shape, w_shape = (batch, channels, size, size), (channels, channels, 3, 3)  # the output has x's shape
  def tinyc_setup() -> Callable[[], Tensor]:
    x, w, upstream = (Tensor.randn(*shape, dtype=dtype).realize() for shape in (x_shape, w_shape, x_shape))
    conv = lambda x, w: x.conv2d(w, padding=1)  # noqa: E731
    if conv_pass == "fwd": return lambda: conv(x, w)
    return lambda: gradient(conv, [x, w], CONV_PASSES.index(conv_pass) - 1, upstream)
  def torch_setup() -> Callable[[], object]:
    x, w, upstream = (torch.randn(*shape, device=TORCH_DEVICE, dtype=torch_dtype) for shape in (x_shape, w_shape, x_shape))
    if conv_pass == "fwd": return lambda: torch.nn.functional.conv2d(x, w, padding=1)
    if conv_pass == "dgrad": return lambda: conv2d_input(x.shape, w, upstream, padding=1)
    return lambda: conv2d_weight(x, w.shape, upstream, padding=1)
  return Row(name, 2.0 * batch * channels * channels * size * size * 9, tinyc_setup, torch_setup, ceiling)

def gemm_groups(quick: bool) -> list[tuple[str, list[Row]]]:
  """The GEMM tables, each a header line and its rows; --quick shrinks every shape."""
  square, wide, odd = ((512,) * 3, (256, 1024, 128), (375,) * 3) if quick else ((4096,) * 3, (2048, 8192, 1024), (3000,) * 3)
  layouts = [matmul_row(f"matmul {layout} M{m} N{n} K{k} {name}", (), m, n, k, layout, name)
             for m, n, k in (square, wide, odd) for name in DTYPES for layout in ("NN", "NT", "TN", "TT")]
  batch, seq, head_dim = (4, 128, 32) if quick else (32, 1024, 128)
  others = [matmul_row(f"batched q@k.T B{batch} M{seq} N{seq} K{head_dim} {name}", (batch,), seq, seq, head_dim, "NT", name)
            for name in ("fp32", "fp16")]
  tokens, widths = (512, (64, 256)) if quick else (4096, (512, 2048))
  others += [matmul_row(f"wgrad x.T@grad M{d_in} N{d_out} K{tokens} {name}", (), d_in, d_out, tokens, "TN", name)
             for d_in, d_out in ((widths[0], widths[0]), (widths[0], widths[1]), (widths[1], widths[0])) for name in ("fp32", "fp16")]
  conv_shapes = ((8, 8, 28), (8, 32, 14)) if quick else ((64, 64, 56), (64, 256, 14))  # (batch, channels, size): ResNet stages
  convs = [conv_row(f"conv3x3 {conv_pass} N{batch} C{channels} {size}x{size} {name}", batch, channels, size, conv_pass, name)
           for batch, channels, size in conv_shapes for name in ("fp32", "fp16") for conv_pass in CONV_PASSES]
  ceilings = f"ceiling {FP32_CEILING_TFLOPS} fp32, {FP16_CEILING_TFLOPS} fp16/bf16"
  return [(f"matmul by layout (NT: a @ b.T with b stored (N, K)), shape M x N x K; {ceilings}", layouts),
          (f"batched (attention scores q @ k.T) and weight-gradient (x.T @ grad over K tokens) matmuls; {ceilings}", others),
          (f"conv2d 3x3 padding 1, C -> C channels: forward, input gradient (dgrad), weight gradient (wgrad); {ceilings}", convs),
          (f"TF32: tinyc with Context(ALLOW_TF32=1), torch with allow_tf32; ceiling {TF32_CEILING_TFLOPS}",
           [matmul_row(f"matmul {layout} M{m} N{n} K{k} fp32 ALLOW_TF32", (), m, n, k, layout, "fp32", tf32=True)
            for m, n, k in (square, odd) for layout in ("NN", "NT", "TN", "TT")])]

def time_row(row: Row, repeats: int) -> tuple[float, float]:
  """tinyc's and torch's seconds for a row, each side under the row's TF32 setting."""
  torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = row.tf32
  with Context(ALLOW_TF32=1) if row.tf32 else contextlib.nullcontext():
    ours = tinyc_kernel_seconds(row.tinyc(), max(3, repeats // 3))
  return ours, torch_seconds(row.torch(), repeats)

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--quick", action="store_true")
  parser.add_argument("--repeats", type=int, default=10)
  parser.add_argument("--only", default="", help="run only the rows whose name contains this")
  args = parser.parse_args()
  n, side, mm = (1 << 20, 1024, 1024) if args.quick else (64 << 20, 8192, 4096)
  rng = np.random.default_rng(0)
  print(f"device {Device.DEFAULT}; torch {torch.__version__} on {torch.cuda.get_device_name()}; medians of {args.repeats}")
  print(f"{'':{NAME_WIDTH}s} {'tinyc':>12s} {'torch':>12s} {'tinyc/ceiling':>14s} {'torch time / tinyc time':>24s}")
  def wanted(name: str) -> bool: return args.only in name  # `name`: the row's full name
  def header(title: str, names: list[str]) -> None:
    if any(wanted(name) for name in names): print(f"\n-- {title}")
  def report(name: str, unit: str, work: float, ours: float, theirs: float, ceiling: float) -> None:
    rate = lambda s: work / s / (1e9 if unit == "GB/s" else 1e12)  # noqa: E731
    print(f"{name:{NAME_WIDTH}s} {rate(ours):8.1f} {unit:4s}{rate(theirs):8.1f} {unit:4s} {rate(ours) / ceiling * 100:12.1f}% {theirs / ours:20.2f}x"
          f"   first realize {first_realize_s[-1]:6.2f} s")

  a, b, c = (Tensor(rng.standard_normal(n, dtype=np.float32)).realize() for _ in range(3))
  ta, tb, tc = (torch.randn(n, device=TORCH_DEVICE) for _ in range(3))
  rows, cols = (1024, 384) if args.quick else (4096, 1536)  # a bias's gradient: (tokens, features) summed down the columns
  header(f"bandwidth, ceiling {COPY_CEILING_GBS} GB/s", [f"a*b+c {n >> 20}M f32", f"sum {n >> 20}M f32", f"softmax ({side}, {side})",
                                                       f"column sum ({rows}, {cols}) f32"])
  row = f"a*b+c {n >> 20}M f32"
  if wanted(row):
    report(row, "GB/s", 16 * n, tinyc_kernel_seconds(lambda: a * b + c, args.repeats), torch_seconds(lambda: ta * tb + tc, args.repeats),
           COPY_CEILING_GBS)
  row = f"sum {n >> 20}M f32"
  if wanted(row):
    report(row, "GB/s", 4 * n, tinyc_kernel_seconds(lambda: a.sum(), args.repeats), torch_seconds(lambda: ta.sum(), args.repeats), COPY_CEILING_GBS)
  row = f"column sum ({rows}, {cols}) f32"
  if wanted(row):
    y, ty = Tensor(rng.standard_normal((rows, cols), dtype=np.float32)).realize(), torch.randn(rows, cols, device=TORCH_DEVICE)
    report(row, "GB/s", 4 * rows * cols, tinyc_kernel_seconds(lambda: y.sum(0), args.repeats), torch_seconds(lambda: ty.sum(0), args.repeats),
           COPY_CEILING_GBS)
  x, tx = Tensor(rng.standard_normal((side, side), dtype=np.float32)).realize(), torch.randn(side, side, device=TORCH_DEVICE)
  row = f"softmax ({side}, {side})"
  if wanted(row):
    report(row, "GB/s", 8 * side * side, tinyc_kernel_seconds(lambda: x.softmax(-1), args.repeats),
           torch_seconds(lambda: tx.softmax(-1), args.repeats), COPY_CEILING_GBS)
  conv_shape = (8, 16, 28) if args.quick else (64, 64, 56)
  conv_name = f"conv2d {conv_shape[0]}x{conv_shape[1]}x{conv_shape[2]}² 3x3"
  header(f"square matmul and conv2d 3x3, fp32 ceiling {FP32_CEILING_TFLOPS} (conv: torch with and without TF32)",
         [f"matmul {mm} float32", f"matmul {mm} float16", conv_name])
  torch.backends.cuda.matmul.allow_tf32 = False
  for dtype, torch_dtype in ((dtypes.float32, torch.float32), (dtypes.float16, torch.float16)):
    if not wanted(f"matmul {mm} {dtype.name}"): continue
    m1 = Tensor(rng.standard_normal((mm, mm), dtype=np.float32)).cast(dtype).realize()
    m2 = Tensor(rng.standard_normal((mm, mm), dtype=np.float32)).cast(dtype).realize()
    t1, t2 = (torch.randn(mm, mm, device=TORCH_DEVICE, dtype=torch_dtype) for _ in range(2))
    report(f"matmul {mm} {dtype.name}", "TFLOP/s", 2 * mm ** 3, tinyc_kernel_seconds(lambda: m1 @ m2, max(3, args.repeats // 3)),
           torch_seconds(lambda: t1 @ t2, args.repeats), FP32_CEILING_TFLOPS)

  batch, channels, image = conv_shape
  images = Tensor(rng.standard_normal((batch, channels, image, image), dtype=np.float32)).realize()
  weights = Tensor(rng.standard_normal((channels, channels, 3, 3), dtype=np.float32)).realize()
  timages, tweights = torch.randn(batch, channels, image, image, device=TORCH_DEVICE), torch.randn(channels, channels, 3, 3, device=TORCH_DEVICE)
  conv_flops = 2 * batch * channels * channels * image * image * 9
  ours = tinyc_kernel_seconds(lambda: images.conv2d(weights, padding=1), max(3, args.repeats // 3)) if wanted(conv_name) else 0.0
  for tf32 in (True, False) if wanted(conv_name) else ():  # PyTorch's default lets cuDNN use TF32 tensor cores for convolutions
    torch.backends.cudnn.allow_tf32 = tf32
    report(f"{conv_name}{' (torch TF32)' if tf32 else ''}", "TFLOP/s", conv_flops, ours,
           torch_seconds(lambda: torch.nn.functional.conv2d(timages, tweights, padding=1), args.repeats), FP32_CEILING_TFLOPS)

  for title, gemms in gemm_groups(args.quick):
    header(title, [gemm.name for gemm in gemms])
    for gemm in gemms:
      if not wanted(gemm.name): continue
      if gemm.tf32 and not hasattr(tinyc.helpers, "ALLOW_TF32"):
        print(f"{gemm.name:{NAME_WIDTH}s} skipped: tinyc.helpers has no ALLOW_TF32 setting yet")
        continue
      report(gemm.name, "TFLOP/s", gemm.flops, *time_row(gemm, args.repeats), gemm.ceiling)
  torch.backends.cuda.matmul.allow_tf32 = torch.backends.cudnn.allow_tf32 = False

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
