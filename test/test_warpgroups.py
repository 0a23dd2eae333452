"""Warpgroup tensor cores (the WARPGROUP Opt, wgmma on sm_90): when the heuristic takes them and when the Opt is legal, CUDA source
that NVRTC compiles to PTX in every layout (so a bad descriptor or swizzle fails CI without a GPU), and on an sm_90 device results
that match numpy."""
from __future__ import annotations
import dataclasses, re
import numpy as np
import pytest
from tinyc.codegen.cstyle import render_cuda
from tinyc.codegen.heuristic import hand_coded_optimizations
from tinyc.codegen.kernel import AxisKind, Kernel, KernelOptError, Opt, OptOps
from tinyc.codegen.linearizer import Linearizer
from tinyc.device import Buffer, Device
from tinyc.dtype import dtypes
from tinyc.helpers import Context, prod
from tinyc.ops import LoadOps
from tinyc.schedule import create_schedule
from tinyc.tensor import Tensor
from test_tensor_cores import H200, LAYOUTS, TC_DTYPES, kernel_of, matmul_item, operands

SM90 = dataclasses.replace(H200, warpgroups=True)
ONE_WARPGROUP = [Opt(OptOps.TC, 0, 2), Opt(OptOps.UNROLL, 0, 4), Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.LOCAL, 0, 4), Opt(OptOps.WARPGROUP, 0, 0)]
# (shape, plan): one warpgroup of 64 x 64; the heuristic's two of 64 x 256 or 64 x 192, with padded edges (masked copies) too.
# Shapes of a million outputs or more: fewer, with a long K, split K into two kernels on a GPU
CASES = [((64, 64, 128), ONE_WARPGROUP), ((1024, 1024, 256), None), ((1000, 1024, 1000), None), ((1024, 1536, 256), None)]

def planned(shape: tuple[int, int, int], layout: str, dtype, plan, target=SM90) -> Kernel:
  kernel = kernel_of(*shape, layout=layout, dtype=dtype, target=target)
  if plan is None: hand_coded_optimizations(kernel)
  for opt in plan or (): kernel.apply_opt(opt)
  assert kernel.warpgroups, kernel.applied_opts
  return kernel

def test_the_heuristic_takes_warpgroups_on_sm_90_only():
  for target, expected in ((SM90, True), (H200, False)):
    kernel = kernel_of(4096, 4096, 512, target=target)
    assert (OptOps.WARPGROUP in [opt.op for opt in hand_coded_optimizations(kernel)]) == expected
  kernel = kernel_of(4096, 4096, 512, target=SM90)
  hand_coded_optimizations(kernel)  # 8 warps along M (two warpgroups of 64 rows), all 256 columns in one UPCAST
  assert kernel.local_size == 8 * 32 and [kernel.full_shape[axis] for axis in kernel.axes(AxisKind.UPCAST)] == [32]

def test_3xtf32_stays_on_mma_sync():
  """wgmma reads B from local memory as it is, where 3xTF32 needs each value split in two: float32 without ALLOW_TF32 keeps to
  mma.sync (the heuristic's plan, and WARPGROUP raises), in every layout."""
  for layout in LAYOUTS:
    kernel = kernel_of(1024, 1024, 256, layout=layout, dtype=dtypes.float32, target=SM90)
    opts = hand_coded_optimizations(kernel)
    assert OptOps.TC in [opt.op for opt in opts] and OptOps.WARPGROUP not in [opt.op for opt in opts], (layout, opts)
  kernel = kernel_of(64, 64, 128, dtype=dtypes.float32, target=SM90)
  for opt in ONE_WARPGROUP[:-1]: kernel.apply_opt(opt)
  with pytest.raises(KernelOptError, match="3xTF32"): kernel.apply_opt(ONE_WARPGROUP[-1])

@pytest.mark.parametrize("why, target, dtype, before, opt", [
  ("no wgmma here", H200, dtypes.float16, ONE_WARPGROUP[:-1], ONE_WARPGROUP[-1]),
  ("before TC", SM90, dtypes.float16, [], ONE_WARPGROUP[-1]),
  ("TF32", SM90, dtypes.float32, ONE_WARPGROUP[:-1], ONE_WARPGROUP[-1]),
  ("64 bytes of K a trip", SM90, dtypes.float16, [ONE_WARPGROUP[0], Opt(OptOps.UNROLL, 0, 2), *ONE_WARPGROUP[2:4]], ONE_WARPGROUP[-1]),
  ("warps along N", SM90, dtypes.float16, [*ONE_WARPGROUP[:2], Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.LOCAL, 1, 2), Opt(OptOps.LOCAL, 0, 4)],
   ONE_WARPGROUP[-1]),
  ("an Opt after it", SM90, dtypes.float16, ONE_WARPGROUP, Opt(OptOps.UPCAST, 0, 2)),
])
def test_illegal_warpgroup_opts_raise_and_leave_the_kernel_alone(why, target, dtype, before, opt):
  with Context(ALLOW_TF32=dtype == dtypes.float32):
    kernel = kernel_of(64, 64, 128, dtype=dtype, target=target)
    for applied in before: kernel.apply_opt(applied)
    shape, opts = kernel.full_shape, list(kernel.applied_opts)
    with pytest.raises(KernelOptError): kernel.apply_opt(opt)
    assert (kernel.full_shape, kernel.applied_opts) == (shape, opts), why

@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("dtype", TC_DTYPES, ids=lambda dtype: dtype.name)
def test_warpgroup_kernels_compile_to_ptx(layout, dtype):
  try:
    from tinyc.runtime.nvrtc import compile_cuda, load_nvrtc
    load_nvrtc()
  except (ImportError, RuntimeError) as error: pytest.skip(f"NVRTC is not installed here ({error}); CI installs it")
  kind = {dtypes.float16: "f16", dtypes.bfloat16: "bf16"}[dtype]
  for shape, plan in CASES:
    kernel = planned(shape, layout, dtype, plan)
    kernel.limit_global_dims(3)
    ptx = compile_cuda(kernel.name, render_cuda(kernel.name, Linearizer(kernel, threads=True).linearize()), "sm_90a", "ptx").decode()
    n = 8 * kernel.full_shape[kernel.axes(AxisKind.UPCAST)[0]]
    transposed = f"{int(layout[0] == 'T')}, {int(layout[1] == 'N')};"  # A along M (TN, TT), B along N (NN, TN)
    assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n{n}k16\.f32\.{kind}\.{kind} .*{transposed}", ptx), f"{shape} {plan}"
    # every tile copy moves 16 bytes in the background: a thread's own stores would need a proxy fence, which waits for every copy
    assert set(re.findall(r"cp\.async\.\w+\.shared\.global \[[^]]*\], \[[^]]*\], (\d+)", ptx)) == {"16"} and "fence.proxy" not in ptx

@pytest.mark.parametrize("layout", LAYOUTS)
def test_tf32_warpgroups_read_b_along_k_and_a_from_registers_where_it_is_not(layout):
  """wgmma reads 32-bit values from local memory only along K. So the heuristic puts the operand contiguous along K on B (NN: M
  and N swapped) and reads A, where it is contiguous along M, into registers as mma.sync's fragments; in TN neither operand is,
  and the plan is mma.sync's."""
  try:
    from tinyc.runtime.nvrtc import compile_cuda, load_nvrtc
    load_nvrtc()
  except (ImportError, RuntimeError) as error: pytest.skip(f"NVRTC is not installed here ({error}); CI installs it")
  with Context(ALLOW_TF32=1):
    for shape, plan in CASES[1:]:
      kernel = kernel_of(*shape, layout=layout, dtype=dtypes.float32, target=SM90)
      hand_coded_optimizations(kernel)
      if layout == "TN":
        assert not kernel.warpgroups and kernel.axes(AxisKind.TC), kernel.applied_opts
        continue
      kernel.limit_global_dims(3)
      ptx = compile_cuda(kernel.name, render_cuda(kernel.name, Linearizer(kernel, threads=True).linearize()), "sm_90a", "ptx").decode()
      n = 8 * kernel.full_shape[kernel.axes(AxisKind.UPCAST)[0]]
      a_operand = r"\{%r\d+,%r\d+,%r\d+,%r\d+\}" if layout != "NT" else r"%rd\d+"
      assert re.search(rf"wgmma\.mma_async\.sync\.aligned\.m64n{n}k8\.f32\.tf32\.tf32 \{{[^}}]*\}}, {a_operand}, %rd\d+, p, 1, 1;", ptx), shape

@pytest.mark.parametrize("layout", LAYOUTS)
def test_warpgroups_match_numpy(layout, tinyc_device):
  """On an sm_90 device every case matches numpy in both 16-bit dtypes; elsewhere WARPGROUP is refused."""
  device = Device[Device.DEFAULT]
  for dtype in TC_DTYPES + (dtypes.float32,):
    for shape, plan in CASES:
      if dtype == dtypes.float32 and plan is not None: continue  # TF32: the heuristic's plans, B along K (in TN a copy of one operand)
      if not device.target.warpgroups:
        with pytest.raises(KernelOptError): planned(shape, layout, dtype, ONE_WARPGROUP, target=device.target)
        return
      if plan is None:  # the heuristic, end to end: on this device a long K may split into two kernels, the second adding the parts
        a, b, expected = operands(*shape, layout=layout, dtype=dtype)
        with Context(ALLOW_TF32=dtype == dtypes.float32):
          kernels = [Kernel(item.ast, device.target) for item in create_schedule([(a @ b).lazydata]) if item.ast.op not in LoadOps]
          assert any(opt.op is OptOps.WARPGROUP for kernel in kernels for opt in hand_coded_optimizations(kernel)), shape
          result = (a @ b).numpy()
      else:
        item, expected = matmul_item(*shape, layout=layout, dtype=dtype)
        kernel = Kernel(item.ast, device.target)
        for opt in plan: kernel.apply_opt(opt)
        out = Buffer(Device.DEFAULT, prod(item.outs[0].shape), item.outs[0].dtype)
        device.get_program(item.ast, tuple(kernel.applied_opts))([out] + [src.realized for src in item.inputs])
        result = out.numpy()
      tolerance = {dtypes.bfloat16: 2 ** -7, dtypes.float16: 2 ** -10, dtypes.float32: 2 ** -9}[dtype]  # TF32: 10-bit mantissas
      np.testing.assert_allclose(result.astype(np.float64).reshape(expected.shape), expected, rtol=tolerance,
                                 atol=tolerance * np.abs(expected).max(), err_msg=f"{shape} {plan} {dtype.name}")

def test_warpgroup_on_tensor_cores_without_staged_operands_is_refused():
  """WARPGROUP after a TC whose operands stay in registers (attention's, codegen/register_mma.py: nothing staged) raised ValueError
  from unpacking no staged operands, which crashed a BEAM=2 search on the H200 (bench/beam_model.py collect); it is an illegal Opt."""
  q, k, v = (Tensor.empty(1, 2, 64, 64, dtype=dtypes.float16) for _ in range(3))
  out = q.scaled_dot_product_attention(k, v, is_causal=True)
  item = next(item for item in create_schedule([out.lazydata]) if item.ast.op not in LoadOps)
  kernel = Kernel(item.ast, SM90)
  kernel.apply_opt(Opt(OptOps.TC, 0, 0))
  assert kernel.nested_tc and not kernel.staged
  with pytest.raises(KernelOptError, match="staged"): kernel.apply_opt(Opt(OptOps.WARPGROUP, 0, 0))
