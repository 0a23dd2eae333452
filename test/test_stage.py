"""STAGE: an input read through local memory, a tile a reduce loop trip, two tiles alternating. What it does to a Kernel, the
Opts it refuses (leaving the kernel as it was), the code it renders, and numpy's results on every device: matmuls with vector
and scalar tile copies, tiles smaller than the work-group, masked (padded) inputs, several reduce loops (conv), float16, and
random Opt lists around it."""
from __future__ import annotations
import random
import re
import numpy as np
import pytest
from tinyc import Tensor
from tinyc.device import Device
from tinyc.ops import ConstBuffer, LoadOps
from tinyc.schedule import create_schedule
from tinyc.realize import run_schedule
from tinyc.codegen.kernel import AxisKind, Kernel, KernelOptError, KernelTarget, Opt, OptOps
from test_kernel_opts import GPU, has_local, layout, matmul_64, optimized, realized, run_with_opts, sources
from test_opt_fuzz import ACTIONS, PROGRAMS, random_opts, run_kernel

U, L, R, S = OptOps.UPCAST, OptOps.LOCAL, OptOps.UNROLL, OptOps.STAGE
TILED_64 = [Opt(U, 0, 4), Opt(U, 1, 4), Opt(L, 0, 4), Opt(L, 1, 4), Opt(R, 0, 4)]  # 4x4 threads, 4x4 lanes each, 4 reduce elements a trip
# the heuristic's plan for a big matmul: 8x16 threads, 8x8 lanes each split 2x4 along both axes, 16 reduce elements a trip
SGEMM = [Opt(U, 1, 4), Opt(U, 0, 4), Opt(L, 0, 8), Opt(L, 1, 16), Opt(U, 0, 2), Opt(U, 1, 2), Opt(R, 0, 16), Opt(S, 1, 0), Opt(S, 2, 0)]

def test_stage_keeps_two_tiles_of_each_input_in_local_memory():
  kernel = optimized(matmul_64(), TILED_64 + [Opt(S, 1, 0)])
  # a's tile: 4 rows of threads x 4 row lanes x 4 reduce elements, each of the 4 rows of 16 padded to 20 floats (a is contiguous
  # along the reduce, so a thread copies 4 floats down a column: 80-byte rows put them in 4 banks); b's is not staged
  assert kernel.staged == (1,) and kernel.local_memory_bytes == 2 * 4 * 20 * 4
  kernel.apply_opt(Opt(S, 2, 0))
  assert kernel.staged == (1, 2) and kernel.local_memory_bytes == 2 * 4 * 20 * 4 + 2 * 64 * 4

def read_after_the_reduce() -> Tensor: return Tensor.empty(64, 64) @ Tensor.empty(64, 64) + Tensor.empty(64, 64)

# (target, program, Opts that fit, the refused Opt, what the message says)
REFUSED = {
  "no_work_groups": (KernelTarget(), matmul_64, [Opt(U, 0, 4)], Opt(S, 1, 0), "work-groups"),
  "the_output": (GPU, matmul_64, TILED_64, Opt(S, 0, 0), "not an input"),
  "no_such_buffer": (GPU, matmul_64, TILED_64, Opt(S, 3, 0), "not an input"),
  "an_amount": (GPU, matmul_64, TILED_64, Opt(S, 1, 2), "amount 0"),
  "twice": (GPU, matmul_64, TILED_64 + [Opt(S, 1, 0)], Opt(S, 1, 0), "staged already"),
  "no_locals": (GPU, matmul_64, [Opt(U, 0, 4)], Opt(S, 1, 0), "add a LOCAL axis first"),
  "group_after": (GPU, matmul_64, [Opt(L, 0, 4), Opt(S, 1, 0)], Opt(OptOps.GROUP, 0, 4), "does not GROUP"),
  "no_reduce_loop": (GPU, matmul_64, [Opt(L, 0, 4), Opt(S, 1, 0)], Opt(R, 0, 0), "needs a reduce loop"),
  "row_kernel": (GPU, lambda: Tensor.empty(16, 64).softmax(1), [Opt(L, 0, 4)], Opt(S, 1, 0), "one reduce"),
  "read_after_reduce": (GPU, read_after_the_reduce, TILED_64, Opt(S, 3, 0), "read after the reduce"),
  "local_memory": (KernelTarget(has_local=True, local_memory_bytes=256), matmul_64, TILED_64, Opt(S, 1, 0), "bytes of local memory"),
}

@pytest.mark.parametrize("name", REFUSED)
def test_a_refused_stage_raises_and_changes_nothing(name):
  target, program, fitting, refused, message = REFUSED[name]
  kernel = optimized(program(), fitting, target)
  before = (layout(kernel), kernel.staged)
  with pytest.raises(KernelOptError, match=message): kernel.apply_opt(refused)
  assert (layout(kernel), kernel.staged) == before

def test_a_constant_is_not_staged():
  kernel = optimized((Tensor.empty(64, 64) * 3).sum(1), [Opt(L, 0, 4)])
  constant = next(number for number, buf in enumerate(kernel.bufs) if isinstance(buf, ConstBuffer))
  with pytest.raises(KernelOptError, match="not an input"): kernel.apply_opt(Opt(S, constant, 0))

def test_staged_tiles_render_local_memory_one_barrier_a_trip_and_vector_reads():
  cuda, opencl = sources(optimized(matmul_64(), TILED_64 + [Opt(S, 1, 0), Opt(S, 2, 0)]))
  # 16-byte aligned, for the vector reads (a shared array of float is only 4-byte aligned: misaligned address on the H200)
  assert "__shared__ float tile1[160] __attribute__((aligned(16)));" in cuda and "__shared__ float tile2[128] __attribute__((aligned(16)));" in cuda
  assert "__local float tile1[160] __attribute__((aligned(16)));" in opencl and "__local float tile2[128] __attribute__((aligned(16)));" in opencl
  # the first tiles before the loop, then one barrier a trip: the next trip's tiles go to the other half
  assert cuda.count("__syncthreads();") == 2 and opencl.count("barrier(CLK_LOCAL_MEM_FENCE);") == 2
  loop = cuda[cuda.index("for (int ridx"):]
  assert loop.index("__syncthreads();") > loop.index("tile1[") and "%2)" in loop
  assert re.search(r"\*\(\(const float4\*\)\(tile1\+", cuda) and re.search(r"vload4\(0, tile2\+", opencl)

def test_staged_sgemm_compiles_with_nvrtc():
  from tinyc.runtime.nvrtc import compile_cuda, load_nvrtc
  try: load_nvrtc()
  except RuntimeError as error: pytest.skip(f"NVRTC is not installed: {error}")
  kernel = optimized(Tensor.empty(256, 256) @ Tensor.empty(256, 256), SGEMM, KernelTarget(has_local=True, max_upcast=1024))
  assert b".shared" in compile_cuda("kernel", sources(kernel)[0], "sm_90", "ptx")

# ---- numpy's results on every device ----

def staged(opts: list[Opt]) -> list[Opt]:
  if not has_local(): pytest.skip("staging needs work-groups (refusal tested above)")
  return opts

@pytest.mark.parametrize("shape, opts", [
  ((256, 64, 256), SGEMM),                                                              # vector copies, a transposed tile
  ((64, 48, 32), [Opt(L, 0, 4), Opt(L, 1, 8), Opt(S, 1, 0), Opt(S, 2, 0)]),             # tiles of 4 and 8 for 32 threads
  ((64, 50, 32), [Opt(U, 0, 2), Opt(L, 0, 4), Opt(L, 1, 8), Opt(R, 0, 5), Opt(S, 1, 0), Opt(S, 2, 0)]),  # scalar copies, odd trips
], ids=["sgemm", "small_tiles", "odd_unroll"])
def test_staged_matmul_matches_numpy(shape, opts, tinyc_device):
  m, k, n = shape
  (a, ta), (b, tb) = realized(m, k, seed=1), realized(k, n, seed=2)
  np.testing.assert_allclose(run_with_opts(ta @ tb, staged(opts)), a @ b, rtol=1e-4, atol=1e-4)

def test_staged_transposed_and_half_inputs_match_numpy(tinyc_device):
  (a, ta), (b, tb) = realized(64, 64, seed=3), realized(64, 64, seed=4)
  np.testing.assert_allclose(run_with_opts(ta @ tb.T, staged(TILED_64 + [Opt(S, 1, 0), Opt(S, 2, 0)])), a @ b.T, rtol=1e-4, atol=1e-4)
  a16, b16 = a.astype(np.float16), b.astype(np.float16)
  half = run_with_opts(Tensor(a16).realize() @ Tensor(b16).realize(), staged(TILED_64 + [Opt(S, 1, 0), Opt(S, 2, 0)]))
  np.testing.assert_allclose(half.astype(np.float32), a16.astype(np.float32) @ b16.astype(np.float32), rtol=2e-2, atol=2e-2)

def test_staged_padded_conv_with_three_reduce_loops_matches_numpy(tinyc_device):
  (_, tx), (_, tw) = realized(2, 4, 9, 9, seed=5), realized(8, 4, 3, 3, seed=6)
  out = tx.conv2d(tw, padding=1)
  kernel = Kernel(_single_kernel(out).ast, Device[Device.DEFAULT].target)
  opts = staged([Opt(U, 1, 4), Opt(L, len(kernel.axes(AxisKind.GLOBAL)) - 1, 9)])  # 4 output channels a thread, 9 threads along the columns
  for opt in opts: kernel.apply_opt(opt)
  for number in range(1, len(kernel.bufs)):
    try: kernel.apply_opt(Opt(S, number, 0))
    except KernelOptError: continue
    opts.append(Opt(S, number, 0))
  assert len(opts) == 4 and len(kernel.axes(AxisKind.REDUCE)) == 3, (opts, kernel.full_shape)
  expected = out.numpy()
  np.testing.assert_allclose(run_with_opts(tx.conv2d(tw, padding=1), opts), expected, rtol=1e-4, atol=1e-4)

def _single_kernel(out: Tensor):
  items = [item for item in create_schedule([out.lazydata]) if item.ast.op not in LoadOps]
  assert len(items) == 1
  return items[0]

STAGEABLE = [opt for opt in ACTIONS if opt.op in (U, R, L, OptOps.PADTO)]  # a staged kernel does not GROUP

@pytest.mark.parametrize("name", ["matmul_13x29x7", "matmul_32x64x16_relu", "matvec_64x128", "conv_2x3x9x9_4x3x3x3", "padded_input_sum"])
def test_random_opts_with_staged_inputs_match_unoptimized(name, tinyc_device):
  if not has_local(): pytest.skip("staging needs work-groups")
  device, rng, tried = Device.DEFAULT, random.Random(name), 0
  for item in create_schedule([PROGRAMS[name]().lazydata]):
    if item.ast.op in LoadOps:
      run_schedule([item])
      continue
    expected = run_kernel(device, item, ())
    for _ in range(6):
      opts = random_opts(item.ast, Device[device].target, rng, STAGEABLE)
      kernel = Kernel(item.ast, Device[device].target)
      for opt in opts: kernel.apply_opt(opt)
      local_opts = [Opt(L, axis, amount) for axis in range(len(kernel.axes(AxisKind.GLOBAL))) for amount in (2, 3, 4, 8)]
      for opt in rng.sample(local_opts, len(local_opts)) * (kernel.local_size == 1) + [Opt(S, n, 0) for n in range(1, 4)]:
        try: kernel.apply_opt(opt)
        except KernelOptError: continue
      if not kernel.staged: continue
      got = run_kernel(device, item, tuple(kernel.applied_opts))
      np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5, err_msg=f"{kernel.applied_opts}")
      tried += 1
    run_schedule([item])
  assert tried > 0, "no Opt list staged an input: the test tested nothing"
