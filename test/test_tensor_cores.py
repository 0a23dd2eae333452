"""Tensor cores (the TC Opt): the layout it makes, when it is legal, CUDA source that NVRTC compiles to PTX for every layout and
dtype (so a bad mma or ldmatrix fails CI without a GPU), and on a device with tensor cores results that match numpy."""
from __future__ import annotations
import re
import numpy as np
import pytest
from tinyc import Tensor
from tinyc.codegen.cstyle import render_cuda
from tinyc.codegen.heuristic import THREE_TF32_MIN_REDUCE, hand_coded_optimizations
from tinyc.codegen.kernel import GPU_MAX_UPCAST, AxisKind, Kernel, KernelOptError, KernelTarget, Opt, OptOps
from tinyc.codegen.linearizer import Linearizer
from tinyc.device import Buffer, Device
from tinyc.dtype import DType, dtypes
from tinyc.helpers import ALLOW_TF32, Context, prod
from tinyc.ops import LoadOps
from tinyc.schedule import create_schedule

H200 = KernelTarget(has_local=True, max_upcast=GPU_MAX_UPCAST, tensor_cores=True, local_memory_bytes=227 * 1024, compute_units=132)
LAYOUTS = ("NN", "NT", "TN", "TT")  # T: the operand is a transposed view of a contiguous array
TC_DTYPES = (dtypes.float16, dtypes.bfloat16)

def operands(m: int, n: int, k: int, layout: str, dtype: DType, seed: int = 0, device: str | None = None) -> tuple[Tensor, Tensor, np.ndarray]:
  """a (m x k) and b (k x n) in the layout, and their product computed in float64 from the same 16-bit values."""
  rng = np.random.default_rng(seed)
  arrays = [rng.standard_normal(shape[::-1] if transposed == "T" else shape).astype(np.float32)
            for shape, transposed in (((m, k), layout[0]), ((k, n), layout[1]))]
  tensors = [Tensor(array, device=device).cast(dtype).realize() for array in arrays]
  tensors = [tensor.T if transposed == "T" else tensor for tensor, transposed in zip(tensors, layout)]
  exact = [tensor.float().numpy().astype(np.float64) for tensor in tensors]
  return tensors[0], tensors[1], exact[0] @ exact[1]

def matmul_item(m: int, n: int, k: int, layout: str = "NN", dtype: DType = dtypes.float16, device: str | None = None):
  a, b, expected = operands(m, n, k, layout, dtype, device=device)
  return create_schedule([(a @ b).lazydata])[-1], expected

def kernel_of(m: int, n: int, k: int, layout: str = "NN", dtype: DType = dtypes.float16, target: KernelTarget = H200) -> Kernel:
  with Context(PACK=0):  # one kernel: a GPU would split a long K in two, a CPU first copies an operand strided along K
    return Kernel(matmul_item(m, n, k, layout, dtype, device="LLVM")[0].ast, target)

def test_tc_makes_a_warp_of_8_x_4_threads_with_2_x_2_accumulators_each():
  kernel = kernel_of(64, 32, 48)
  kernel.apply_opt(Opt(OptOps.TC, 0, 0))
  sizes = {kind: [kernel.full_shape[axis] for axis in kernel.axes(kind)] for kind in (AxisKind.WARP, AxisKind.FRAGMENT, AxisKind.TC)}
  assert sizes == {AxisKind.WARP: [8, 4], AxisKind.FRAGMENT: [2, 2], AxisKind.TC: [16]}
  assert kernel.full_shape[kernel.axes(AxisKind.REDUCE)[0]] == 48 // 16 and kernel.local_size == 32 and kernel.upcast_size == 4
  assert sorted(kernel.staged) == [1, 2] and kernel.tile_stages == 2

def test_float32_goes_onto_tensor_cores_as_3xtf32_and_as_tf32_alone_with_allow_tf32():
  """Float32 runs as 3xTF32 (three mmas a tile and step: small x big, big x small, big x big, each register split once), or as one
  TF32 mma with ALLOW_TF32=1: m16n8k8 either way, 16 bytes of a row as for 16-bit floats."""
  def mmas(kernel: Kernel) -> tuple[int, int]:  # (mma instructions, distinct register operands they read)
    source = render_cuda(kernel.name, Linearizer(kernel, threads=True).linearize())
    calls = re.findall(r'mma\.sync\.aligned\.m16n8k8\.row\.col\.f32\.tf32\.tf32\.f32[^:]*: [^:]*: ([^)]*\)(?:, "r"\([^)]*\))*)\);', source)
    return len(calls), len({register for call in calls for register in re.findall(r'"r"\(([^)]*)\)', call)})
  counts = {}
  for allow in (0, 1):
    with Context(ALLOW_TF32=allow):
      kernel = kernel_of(64, 32, 48, dtype=dtypes.float32)
      kernel.apply_opt(Opt(OptOps.TC, 0, 0))
      assert [kernel.full_shape[axis] for axis in kernel.axes(AxisKind.TC)] == [8]
      counts[allow] = mmas(kernel)
      # the heuristic takes them for a reduce of THREE_TF32_MIN_REDUCE or more (the float32 cores ran a conv's 64 channels faster)
      for k in (48, THREE_TF32_MIN_REDUCE):
        chosen = [opt.op for opt in hand_coded_optimizations(kernel_of(256, 128, k, dtype=dtypes.float32))]
        assert (OptOps.TC in chosen) == bool(allow or k >= THREE_TF32_MIN_REDUCE), (allow, k, chosen)
  assert counts[1][0] > 0 and counts[0][0] == 3 * counts[1][0] and counts[0][1] == 2 * counts[1][1], counts  # each register as big and small parts

def test_tc_prefers_the_outputs_contiguous_axis_as_n():
  kernel = kernel_of(64, 32, 48)
  m, n, _ = kernel.tensor_core_choices()[0]
  assert kernel.sts[0].real_strides()[n] == 1 and kernel.sts[0].real_strides()[m] == 32

@pytest.mark.parametrize("why, target, shape, dtype, before, opt", [
  ("no tensor cores", KernelTarget(has_local=True), (64, 32, 48), dtypes.float16, [], Opt(OptOps.TC, 0, 0)),
  ("float64 inputs", H200, (64, 32, 48), dtypes.float64, [], Opt(OptOps.TC, 0, 0)),
  ("neither M nor N a multiple of 16", H200, (40, 40, 48), dtypes.float16, [], Opt(OptOps.TC, 0, 0)),
  ("after another Opt", H200, (64, 32, 48), dtypes.float16, [Opt(OptOps.UPCAST, 0, 4)], Opt(OptOps.TC, 0, 0)),
  ("one tile stage", H200, (64, 32, 48), dtypes.float16, [], Opt(OptOps.TC, 0, 1)),
  ("no such choice", H200, (64, 32, 48), dtypes.float16, [], Opt(OptOps.TC, 2, 0)),
  ("STAGE after TC", H200, (64, 32, 48), dtypes.float16, [Opt(OptOps.TC, 0, 0)], Opt(OptOps.STAGE, 1, 0)),
  ("GROUP after TC", H200, (64, 32, 48), dtypes.float16, [Opt(OptOps.TC, 0, 0)], Opt(OptOps.GROUP, 0, 3)),
  ("too much local memory", KernelTarget(has_local=True, tensor_cores=True, max_upcast=GPU_MAX_UPCAST), (256, 256, 256), dtypes.float16,
   [Opt(OptOps.TC, 0, 8), Opt(OptOps.UNROLL, 0, 4)], Opt(OptOps.UPCAST, 1, 8))])
def test_illegal_tc_opts_raise_and_leave_the_kernel_alone(why, target, shape, dtype, before, opt):
  kernel = kernel_of(*shape, dtype=dtype, target=target)
  for earlier in before: kernel.apply_opt(earlier)
  state = (kernel.full_shape, kernel.sts, kernel.kinds, kernel.staged, kernel.tile_stages)
  with pytest.raises(KernelOptError): kernel.apply_opt(opt)
  assert (kernel.full_shape, kernel.sts, kernel.kinds, kernel.staged, kernel.tile_stages) == state, why

def test_the_heuristic_pads_odd_sizes_onto_tensor_cores():
  kernel = kernel_of(1000, 1000, 1000)
  opts = hand_coded_optimizations(kernel)
  assert opts[:4] == [Opt(OptOps.PADTO, 0, 128), Opt(OptOps.PADTO, 1, 128), Opt(OptOps.PADTO, 2, 32), Opt(OptOps.TC, 0, 3)]  # to 1024
  assert kernel.full_shape[kernel.axes(AxisKind.REDUCE)[0]] * 16 * 4 == 1024  # 64 elements a trip
  assert kernel.local_size == 4 * 32  # 2 x 2 warps: 8 x 4 work-groups of 2 x 4 warps would leave most of the 132 SMs idle

def test_the_weight_gradient_of_a_16_bit_conv_under_a_sum_reaches_tensor_cores():
  """The sum's gradient is ones: the conv's output gradient g * 1 must reach the kernel as the plain load g."""
  x, w, g = (Tensor.rand(*shape, dtype=dtypes.float16).realize() for shape in ((2, 32, 16, 16), (64, 32, 3, 3), (2, 64, 16, 16)))
  x.requires_grad = w.requires_grad = True
  (x.conv2d(w, padding=1) * g).sum().backward()
  # x and g are copied channels-last first (as the forward copies x): contiguous along M and N, 16-byte rows for the tiles
  # (on a GPU device the product is split along the batch first, and a second kernel sums the parts)
  kernels = [Kernel(item.ast, H200) for item in create_schedule([w.grad.lazydata]) if item.ast.op is not LoadOps.COPY]
  assert len([kernel for kernel in kernels if not kernel.reduceops]) == 2
  assert (products := [kernel for kernel in kernels if kernel.tensor_core_operands()])
  assert all(OptOps.TC in [opt.op for opt in hand_coded_optimizations(product)] for product in products)
  # read in NCHW, its operands run along the batch (K) and the channels (M, N), contiguous along neither: no 16-byte tile copies
  # (scheduled for the CPU, which does not split it along the batch first)
  x, g = Tensor.empty(2, 32, 16, 16, dtype=dtypes.float16, device="LLVM"), Tensor.empty(2, 64, 16, 16, dtype=dtypes.float16, device="LLVM")
  windows = x.pad2d((1, 1, 1, 1))._pool((3, 3)).reshape(2, 1, 32, 16, 16, 3, 3).float()
  schedule = create_schedule([(windows * g.reshape(2, 64, 1, 16, 16, 1, 1).float()).sum((0, 3, 4)).lazydata])
  (nchw,) = [item for item in schedule if item.ast.op not in LoadOps]
  assert (kernel := Kernel(nchw.ast, H200)).tensor_core_operands()
  assert OptOps.TC not in [opt.op for opt in hand_coded_optimizations(kernel)]

def test_the_heuristic_gives_big_matmuls_2_x_4_warps():
  kernel = kernel_of(4096, 4096, 512)  # 32 x 16 work-groups of 128 x 256 outputs
  hand_coded_optimizations(kernel)
  assert kernel.local_size == 8 * 32 and kernel.full_shape[kernel.axes(AxisKind.REDUCE)[0]] * 16 * 4 == 512

@pytest.mark.parametrize("shape, tiles", [((4096, 4096, 512), 4), ((2048, 8192, 1024), 4), ((3000, 3000, 3000), 3), ((2560, 1536, 3584), None),
                                          ((65536, 128, 64), None)])
def test_the_heuristic_loops_work_groups_over_tiles_where_there_are_more_than_compute_units(shape, tiles):
  """512 tiles of 128 x 256 on 132 SMs: 128 work-groups of 4 tiles each (4096 x 4096 x K); 120 work-groups stay one tile each, and
  so do work-groups of fewer than 8 warps, which run several to an SM (N 128: 512 work-groups of 4 warps)."""
  kernel = kernel_of(*shape)
  hand_coded_optimizations(kernel)
  serial = kernel.axes(AxisKind.SERIAL)
  assert [kernel.full_shape[axis] for axis in serial] == ([tiles] if tiles else [])
  assert prod(kernel.full_shape[axis] for axis in kernel.axes(AxisKind.GLOBAL)) <= H200.compute_units or kernel.local_size < 8 * 32

def test_persist_comes_after_tc_once_and_divides_its_axis():
  kernel = kernel_of(256, 256, 64)
  with pytest.raises(KernelOptError): kernel.apply_opt(Opt(OptOps.PERSIST, 0, 2))  # before TC
  kernel.apply_opt(Opt(OptOps.TC, 0, 3))
  for bad in (Opt(OptOps.PERSIST, 0, 3), Opt(OptOps.PERSIST, 0, 1), Opt(OptOps.PERSIST, 5, 2)):
    with pytest.raises(KernelOptError): kernel.apply_opt(bad)
  kernel.apply_opt(Opt(OptOps.PERSIST, 0, 2))
  with pytest.raises(KernelOptError): kernel.apply_opt(Opt(OptOps.PERSIST, 0, 2))

# Opt lists that reach each part of the TC code: 2 or more tile stages, B read two mma tiles at once (along the unroll or an
# upcast), warps side by side (LOCAL), and padding with masked copies
PLANS = {
  "heuristic": None,
  "one_warp": [Opt(OptOps.TC, 0, 2)],
  "unrolled_pairs": [Opt(OptOps.TC, 0, 3), Opt(OptOps.UNROLL, 0, 2), Opt(OptOps.UPCAST, 0, 2)],
  "upcast_pairs_warps": [Opt(OptOps.TC, 0, 4), Opt(OptOps.UPCAST, 1, 2), Opt(OptOps.LOCAL, 0, 2), Opt(OptOps.LOCAL, 0, 2)],
  "other_choice": [Opt(OptOps.TC, 1, 0), Opt(OptOps.UPCAST, 0, 2)],
  "three_warps": [Opt(OptOps.TC, 0, 3), Opt(OptOps.LOCAL, 1, 3)],  # 96 threads: the last turn of each tile's copies leaves some out
  "six_n_tiles": [Opt(OptOps.TC, 0, 3), Opt(OptOps.UPCAST, 1, 6), Opt(OptOps.LOCAL, 0, 2)],  # a warp's 48 columns (the heuristic's 128 x 192)
  # work-groups looping over 2 tiles along M or N, the copies of a tile's first trips started in the last trips of the one before
  "persistent": [Opt(OptOps.TC, 0, 3), Opt(OptOps.PERSIST, 0, 2)],
  "persistent_warps": [Opt(OptOps.TC, 0, 4), Opt(OptOps.UNROLL, 0, 2), Opt(OptOps.LOCAL, 0, 2), Opt(OptOps.PERSIST, 1, 2)],
  # 9 warps of 64 x 64 (192 x 192): more registers than 288 threads may have, unless ptxas is told the group's size (else no launch)
  "nine_warps": [Opt(OptOps.TC, 0, 3), Opt(OptOps.UNROLL, 0, 4), Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.LOCAL, 1, 3), Opt(OptOps.UPCAST, 0, 4),
                 Opt(OptOps.LOCAL, 0, 3)],
}

def apply_plan(kernel: Kernel, plan: list[Opt] | None) -> list[Opt]:
  if plan is None: return hand_coded_optimizations(kernel)
  for opt in plan: kernel.apply_opt(opt)
  return plan

@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype, allow_tf32", [(dtype, 0) for dtype in TC_DTYPES] + [(dtypes.float32, 0), (dtypes.float32, 1)],
                         ids=["float16", "bfloat16", "float32-3xtf32", "float32-tf32"])
def test_tensor_core_kernels_compile_to_ptx(layout, dtype, allow_tf32):
  try:
    from tinyc.runtime.nvrtc import compile_cuda, load_nvrtc
    load_nvrtc()
  except (ImportError, RuntimeError) as error: pytest.skip(f"NVRTC is not installed here ({error}); CI installs it")
  for name, plan in PLANS.items():
    for shape in ((64, 32, 64), (48, 40, 80), (1000, 24, 40), (64, 48, 64), (256, 128, 256)):
      if plan is None and dtype == dtypes.float32 and not allow_tf32 and shape[2] < THREE_TF32_MIN_REDUCE: continue  # (the float32 cores)
      with Context(ALLOW_TF32=allow_tf32):
        kernel = kernel_of(*shape, layout=layout, dtype=dtype)
        try: apply_plan(kernel, plan)
        except KernelOptError: continue  # (a plan for other sizes)
        kernel.limit_global_dims(3)
        ptx = compile_cuda(kernel.name, render_cuda(kernel.name, Linearizer(kernel, threads=True).linearize()), "sm_90", "ptx").decode()
      kind, k = {dtypes.float16: ("f16", 16), dtypes.bfloat16: ("bf16", 16), dtypes.float32: ("tf32", 8)}[dtype]
      assert f"mma.sync.aligned.m16n8k{k}.row.col.f32.{kind}.{kind}.f32" in ptx, f"{name} {shape}"
      # a 16-bit operand whose K is not its contiguous axis is read transposed (A in TN and TT, B in NN and TN); TF32 never is
      transposed = layout in ("NN", "TN", "TT") and dtype != dtypes.float32
      assert ("ldmatrix.sync.aligned.m8n8.x4.trans" in ptx or "ldmatrix.sync.aligned.m8n8.x2.trans" in ptx) == transposed
      assert "cp.async.c" in ptx or shape == (1000, 24, 40), f"{name} {shape}: copies in the background"
      # TF32 tiles keep the memory's order (M or N contiguous: read a value at a time), so their copies move 16 bytes each
      copied = set(re.findall(r"cp\.async\.\w+\.shared\.global \[[^]]*\], \[[^]]*\], (\d+)", ptx))
      assert dtype != dtypes.float32 or shape == (1000, 24, 40) or copied == {"16"}, f"{name} {shape}: {copied} bytes a copy"

@pytest.mark.parametrize("layout", LAYOUTS)
def test_tensor_cores_match_numpy(layout, tinyc_device):
  """On a device with tensor cores every plan matches numpy (float32 as 3xTF32, and as TF32 with ALLOW_TF32=1); elsewhere TC is
  refused."""
  for dtype, allow_tf32 in [(dtype, 0) for dtype in TC_DTYPES] + [(dtypes.float32, 0), (dtypes.float32, 1)]:
    with Context(ALLOW_TF32=allow_tf32):
      for shape in ((64, 32, 64), (48, 40, 80), (1000, 24, 40), (64, 48, 64), (192, 192, 64), (256, 128, 256)): check_plans(shape, layout, dtype)

def check_plans(shape: tuple[int, int, int], layout: str, dtype: DType) -> None:
  device = Device[Device.DEFAULT]
  item, expected = matmul_item(*shape, layout=layout, dtype=dtype)
  if not device.target.tensor_cores:
    with pytest.raises(KernelOptError): Kernel(item.ast, device.target).apply_opt(Opt(OptOps.TC, 0, 0))
    return
  for name, plan in PLANS.items():
    kernel = Kernel(item.ast, device.target)
    try: opts = tuple(apply_plan(kernel, plan))
    except KernelOptError: continue
    short = dtype == dtypes.float32 and not ALLOW_TF32 and shape[2] < THREE_TF32_MIN_REDUCE  # (3xTF32's three mmas a step)
    assert plan is not None or short or OptOps.TC in [opt.op for opt in opts], "the heuristic uses tensor cores"
    out = Buffer(Device.DEFAULT, prod(item.outs[0].shape), item.outs[0].dtype)
    device.get_program(item.ast, opts)([out] + [src.realized for src in item.inputs])
    # the output's rounding; for float32 TF32's products (10-bit mantissas), or 3xTF32's (about 21 bits)
    tolerance = {dtypes.bfloat16: 2 ** -7, dtypes.float16: 2 ** -10, dtypes.float32: 2 ** -9 if ALLOW_TF32 else 2 ** -18}[dtype]
    np.testing.assert_allclose(out.numpy().astype(np.float64).reshape(expected.shape), expected, rtol=tolerance,
                               atol=tolerance * np.abs(expected).max(), err_msg=f"{name} {shape} {dtype.name}")

@pytest.mark.parametrize("size, columns_on_n", [(56, True), (28, True), (14, False)])
def test_a_16_bit_conv_puts_its_columns_on_n_where_they_span_more_than_an_mma_tile(size, columns_on_n):
  """The output's contiguous axis goes on N (padding aside): 56 columns, padded to 64, ran 98 TFLOP/s there against 51 with the
  batch and the channels (H200, fp16 N64 C64); 14 columns, padded to 16, ran 93 against 140."""
  x, w = (Tensor.empty(*shape, dtype=dtypes.float16, device="LLVM") for shape in ((8, 64, size, size), (64, 64, 3, 3)))
  kernels = [Kernel(item.ast, H200) for item in create_schedule([x.conv2d(w, padding=1).lazydata]) if item.ast.op not in LoadOps]
  (kernel,) = [kernel for kernel in kernels if kernel.reduceops]  # (after the channels-last copies)
  columns = kernel.axes(AxisKind.GLOBAL)[-1]
  if size % 16: kernel.apply_opt(Opt(OptOps.PADTO, columns, 16))
  assert (kernel.tensor_core_choices()[0][1] == columns) == columns_on_n, kernel.tensor_core_choices()
