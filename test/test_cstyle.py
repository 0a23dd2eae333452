"""The C-style renderer's work-group features (local thread ids, shared memory, barriers), on UOps built by hand: every thread
of a 16-thread work-group puts one input into shared memory, waits at the barrier, then sums all 16. It is compiled to PTX
wherever NVRTC is found, and run on every usable GPU backend (OpenCL on PoCL in CI; CUDA and OpenCL on an NVIDIA machine)."""
import numpy as np
import pytest
from tinyc.device import Buffer, Device
from tinyc.dtype import dtypes
from tinyc.codegen.cstyle import render_cuda, render_opencl
from tinyc.codegen.uops import GlobalBuffer, LocalBuffer, Loop, ThreadIndex, ThreadKind, UOp, UOps
from tinyc.ops import BinaryOps

def workgroup_sum_uops(threads: int = 16) -> list[UOp]:
  f32, i32 = dtypes.float32, dtypes.int32
  out, inp = (UOp(UOps.DEFINE_GLOBAL, f32, (), GlobalBuffer(f"data{number}", number, number == 0)) for number in range(2))
  lid = UOp(UOps.SPECIAL, i32, (), ThreadIndex(0, "lidx0", threads, ThreadKind.LOCAL))
  shared = UOp(UOps.DEFINE_LOCAL, f32, (), LocalBuffer("partial", 16))
  value = UOp(UOps.LOAD, f32, (inp, lid))
  store_shared = UOp(UOps.STORE, None, (shared, lid, value))
  barrier = UOp(UOps.BARRIER, None)
  acc = UOp(UOps.DEFINE_ACC, f32, (), 0.0)
  zero, sixteen = UOp(UOps.CONST, i32, (), 0), UOp(UOps.CONST, i32, (), 16)
  loop = UOp(UOps.LOOP, i32, (zero, sixteen), Loop("ridx0", False))
  current, element = UOp(UOps.LOAD, f32, (acc,)), UOp(UOps.LOAD, f32, (shared, loop))
  added = UOp(UOps.ALU, f32, (current, element), BinaryOps.ADD)
  update = UOp(UOps.STORE, None, (acc, added))
  end = UOp(UOps.END, None, (loop,))
  total = UOp(UOps.LOAD, f32, (acc,))
  return [out, inp, lid, shared, value, store_shared, barrier, acc, zero, sixteen, loop, current, element, added, update, end, total,
          UOp(UOps.STORE, None, (out, lid, total))]

def test_renders_shared_memory_and_barriers_in_both_dialects():
  cuda, opencl = render_cuda("wg_sum", workgroup_sum_uops()), render_opencl("wg_sum", workgroup_sum_uops())
  assert "__shared__ float partial[16] __attribute__((aligned(16)));" in cuda and "__syncthreads();" in cuda and "int lidx0 = threadIdx.x;" in cuda
  assert "__local float partial[16] __attribute__((aligned(16)));" in opencl
  assert "barrier(CLK_LOCAL_MEM_FENCE);" in opencl and "get_local_id(0)" in opencl

def test_workgroup_sum_compiles_to_ptx():
  from tinyc.runtime.nvrtc import compile_cuda, load_nvrtc
  try: load_nvrtc()
  except RuntimeError: pytest.skip("NVRTC is not installed here (CI installs nvidia-cuda-nvrtc)")
  assert b".shared" in compile_cuda("wg_sum", render_cuda("wg_sum", workgroup_sum_uops()), "sm_90", "ptx")

@pytest.mark.parametrize("threads, bounded", [(16, False), (256, False), (288, True), (1024, True)])
def test_a_cuda_work_group_of_over_256_threads_bounds_its_registers_by_its_size(threads, bounded):
  """ptxas keeps to the registers 288 threads may have (.maxntid): 9 warps whose threads took more failed to launch. Up to 256
  threads every register count fits, and the size is left out (naming it changed ptxas's choices, and a kernel's speed)."""
  from tinyc.runtime.nvrtc import compile_cuda, load_nvrtc
  try: load_nvrtc()
  except RuntimeError: pytest.skip("NVRTC is not installed here (CI installs nvidia-cuda-nvrtc)")
  source = render_cuda("wg_sum", workgroup_sum_uops(threads))
  assert (f"__launch_bounds__({threads}) wg_sum(" in source) == bounded
  assert (f".maxntid {threads}, 1, 1" in compile_cuda("wg_sum", source, "sm_90", "ptx").decode()) == bounded

@pytest.mark.parametrize("backend", ["GPU", "CUDA"])
def test_workgroup_sum_runs(backend):
  if not Device.usable(backend): pytest.skip(f"{backend} is not usable here")
  device = Device[backend]
  run = device.compile("wg_sum", device.render("wg_sum", workgroup_sum_uops()))
  values = np.arange(16, dtype=np.float32) * 0.5
  source, result = Buffer(backend, 16, dtypes.float32).copyin(values), Buffer(backend, 16, dtypes.float32)
  run([result.opaque, source.opaque], global_size=(16, 1, 1), local_size=(16, 1, 1), wait=True)
  np.testing.assert_allclose(result.numpy(), np.full(16, values.sum()), rtol=1e-6)  # every thread saw every other's write

def divmod_uops(divisor: int | None) -> list[UOp]:
  """out[i] = a[i] / d and out[16 + i] = a[i] % d for int32, with d = b[i] (divisor None) or the constant `divisor`."""
  i32 = dtypes.int32
  out, a, b = (UOp(UOps.DEFINE_GLOBAL, i32, (), GlobalBuffer(f"data{number}", number, number == 0)) for number in range(3))
  gid = UOp(UOps.SPECIAL, i32, (), ThreadIndex(0, "gidx0", 16, ThreadKind.GLOBAL))
  value = UOp(UOps.LOAD, i32, (a, gid))
  d = UOp(UOps.LOAD, i32, (b, gid)) if divisor is None else UOp(UOps.CONST, i32, (), divisor)
  quotient, remainder = UOp(UOps.ALU, i32, (value, d), BinaryOps.IDIV), UOp(UOps.ALU, i32, (value, d), BinaryOps.MOD)
  sixteen = UOp(UOps.CONST, i32, (), 16)
  second = UOp(UOps.ALU, i32, (gid, sixteen), BinaryOps.ADD)
  return [out, a, b, gid, value, d, quotient, remainder, sixteen, second, UOp(UOps.STORE, None, (out, gid, quotient)),
          UOp(UOps.STORE, None, (out, second, remainder))]

def test_integer_division_by_a_value_is_guarded_in_both_dialects():
  """C's x / 0 and x % 0 are undefined (OpenCL on PoCL gave -1, LLVM 0): the division runs only on a divisor that is not 0 or -1. A
  constant divisor (index math) needs no guard."""
  for render in (render_cuda, render_opencl):
    guarded, plain = render("divmod", divmod_uops(None)), render("divmod", divmod_uops(4))
    assert "(val1==0?0:val1==(-1)?" in guarded and "((val1==0||val1==(-1))?0:(val0%val1))" in guarded, guarded
    assert "= (val0/4);" in plain and "= (val0%4);" in plain, plain

def test_a_cuda_kernel_takes_one_pointer_per_buffer_in_buffer_order():
  """The CUDA runtime launches a kernel with one pointer per buffer, in the order the program is called with: the renderer declares
  one parameter per DEFINE_GLOBAL, numbered as the buffers are, and refuses any other order."""
  from tinyc.runtime.nvrtc import compile_cuda, load_nvrtc
  uops = divmod_uops(None)
  assert "(int* data0, const int* data1, const int* data2)" in render_cuda("divmod", uops)
  with pytest.raises(AssertionError, match="buffer 1 as parameter 0"): render_cuda("divmod", [uops[1], uops[0], *uops[2:]])
  try: load_nvrtc()
  except RuntimeError: pytest.skip("NVRTC is not installed here (CI installs nvidia-cuda-nvrtc)")
  ptx = compile_cuda("divmod", render_cuda("divmod", uops), "sm_90", "ptx").decode()
  assert [f".param .u64 divmod_param_{number}" in ptx for number in range(4)] == [True, True, True, False], ptx

@pytest.mark.parametrize("backend", ["GPU", "CUDA"])
def test_integer_division_by_zero_gives_zero(backend):
  if not Device.usable(backend): pytest.skip(f"{backend} is not usable here")
  device = Device[backend]
  run = device.compile("divmod", device.render("divmod", divmod_uops(None)))
  values = np.array([7, -7, 0, -2**31, -2**31, 2**31 - 1, 9, -9] * 2, dtype=np.int32)
  divisors = np.array([0, 0, 0, 0, -1, -1, 2, 2] * 2, dtype=np.int32)
  result = Buffer(backend, 32, dtypes.int32)
  inputs = [Buffer(backend, 16, dtypes.int32).copyin(array) for array in (values, divisors)]
  run([result.opaque] + [buf.opaque for buf in inputs], global_size=(16, 1, 1), local_size=(1, 1, 1), wait=True)
  np.testing.assert_equal(result.numpy(), np.concatenate([[0, 0, 0, 0, -2**31, -(2**31 - 1), 4, -4] * 2, [0, 0, 0, 0, 0, 0, 1, -1] * 2]))
