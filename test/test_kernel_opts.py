"""The kernel-optimization layer: what each Opt does to a Kernel's axis layout (and which Opts it refuses, leaving the kernel as it
was), the code the Opts render to in CUDA C and OpenCL C, numpy's results with hand-picked Opt lists on every device, the
hand-coded heuristic's choices, and lazy.py's split of a long reduce into two kernels."""
from __future__ import annotations
import re
import numpy as np
import pytest
import torch
from tinyc import Tensor, dtypes
from tinyc.device import Buffer, Device, count_flops
from tinyc.helpers import Context, prod
from tinyc.ops import BinaryOps, LoadOps, LazyOp
from tinyc.realize import run_schedule
from tinyc.schedule import create_schedule
from tinyc.codegen.cstyle import render_cuda, render_opencl
from tinyc.codegen.heuristic import hand_coded_optimizations
from tinyc.codegen.kernel import GPU_MAX_UPCAST, AxisKind, Kernel, KernelOptError, KernelTarget, Opt, OptOps
from tinyc.codegen.linearizer import Linearizer
from tinyc.codegen.llvmir import render_llvm
from tinyc.codegen.uops import UOps

G, L, U, GR, R, UN = AxisKind.GLOBAL, AxisKind.LOCAL, AxisKind.UPCAST, AxisKind.GROUP, AxisKind.REDUCE, AxisKind.UNROLL

GPU = KernelTarget(has_local=True)  # the defaults: 1024 threads, 48 KB of local memory

@pytest.fixture(autouse=True)
def one_kernel_matmuls():
  """The tests here read a big matmul's one kernel, built on the CPU for any target: no copy of an operand first (PACK=0; its
  tests are in test_matmul_grid.py)."""
  with Context(PACK=0): yield

def kernel_asts(out: Tensor) -> list[LazyOp]:
  return [item.ast for item in create_schedule([out.lazydata]) if item.ast.op not in LoadOps]

def the_ast(out: Tensor) -> LazyOp:
  asts = kernel_asts(out)
  assert len(asts) == 1, f"expected one kernel, the schedule has {len(asts)}"
  return asts[0]

def optimized(out: Tensor, opts: list[Opt], target: KernelTarget = GPU) -> Kernel:
  kernel = Kernel(the_ast(out), target)
  for opt in opts: kernel.apply_opt(opt)
  return kernel

def layout(kernel: Kernel) -> tuple:
  """Everything an Opt may change."""
  return (kernel.full_shape, list(kernel.sts), kernel.kinds, kernel.owners, kernel.dont_use_locals,
          list(kernel.applied_opts))

def strides(kernel: Kernel, buffer: int) -> tuple[int | None, ...]: return kernel.sts[buffer].real_strides()

def matmul_64() -> Tensor: return Tensor.empty(64, 64) @ Tensor.empty(64, 64)  # full_shape (64 rows, 64 cols, 64 reduce)
def row_sum() -> Tensor: return Tensor.empty(16, 512).sum(1)                   # full_shape (16, 512)
def transposed_add_29() -> Tensor: return Tensor.empty(29, 29) + Tensor.empty(29, 29).T  # 29x29: the axes cannot merge

# ---- 1. each Opt's effect on the layout ----

def test_upcast_splits_off_the_inner_part_as_the_last_axis():
  kernel = Kernel(the_ast(matmul_64()), GPU)
  assert kernel.full_shape == (64, 64, 64) and kernel.kinds == (G, G, R) and strides(kernel, 0) == (64, 1, 0)
  kernel.apply_opt(Opt(OptOps.UPCAST, 0, 4))
  assert kernel.full_shape == (16, 64, 64, 4) and kernel.kinds == (G, G, R, U)
  assert strides(kernel, 0) == (256, 1, 0, 64), "rows split into (16, 4): the 4 consecutive rows are the upcast lanes"
  kernel.apply_opt(Opt(OptOps.UPCAST, 1, 4))
  assert kernel.full_shape == (16, 16, 64, 4, 4) and kernel.kinds == (G, G, R, U, U)
  assert strides(kernel, 0) == (256, 4, 0, 64, 1) and kernel.size_of(U) == 16

def test_unroll_splits_a_reduce_axis_into_upcast_lanes():
  kernel = optimized(matmul_64(), [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 1, 4)])
  kernel.apply_opt(Opt(OptOps.UNROLL, 0, 4))  # axis 0 counts from the first reduce loop
  assert kernel.full_shape == (16, 16, 16, 4, 4, 4) and kernel.kinds == (G, G, R, U, U, UN) and kernel.owners[-1] == {0}
  assert strides(kernel, 0)[-1] == 0 and strides(kernel, 1)[-1] == 1, "the unrolled lanes are a reduce axis: the output stays put"
  assert kernel.upcast_size == 64 and kernel.size_of(U) == 16, "UNROLL adds lanes but no outputs"

def test_upcast_amount_0_takes_the_whole_axis():
  kernel = optimized(Tensor.empty(13, 29).sum(1), [Opt(OptOps.UPCAST, 0, 0)], KernelTarget())
  assert kernel.full_shape == (29, 13) and kernel.kinds == (R, U)

def test_local_moves_part_of_a_global_axis_before_the_reduce():
  kernel = Kernel(the_ast(matmul_64()), GPU)
  kernel.apply_opt(Opt(OptOps.LOCAL, 0, 4))
  assert kernel.full_shape == (16, 64, 4, 64) and kernel.kinds == (G, G, L, R)
  assert strides(kernel, 0) == (256, 1, 64, 0) and kernel.local_size == 4
  kernel.apply_opt(Opt(OptOps.LOCAL, 1, 16))
  assert kernel.full_shape == (16, 4, 4, 16, 64) and kernel.kinds == (G, G, L, L, R) and kernel.local_size == 64
  assert strides(kernel, 0) == (256, 16, 64, 1, 0)

def test_local_of_a_whole_axis_leaves_one_global_axis_fewer():
  kernel = Kernel(the_ast(matmul_64()), GPU)
  kernel.apply_opt(Opt(OptOps.LOCAL, 0, 64))
  assert kernel.full_shape == (64, 64, 64) and kernel.kinds == (G, L, R)
  assert strides(kernel, 0) == (1, 64, 0), "the rows are now the thread ids, the columns the only work-group axis"

@pytest.mark.parametrize("op, group_stride, loop_stride", [(OptOps.GROUP, 1, 16), (OptOps.GROUPTOP, 32, 1)])
def test_group_splits_the_reduce_across_threads(op, group_stride, loop_stride):
  kernel = Kernel(the_ast(row_sum()), GPU)
  kernel.apply_opt(Opt(op, 0, 16))
  assert kernel.full_shape == (16, 16, 32) and kernel.kinds == (G, GR, R) and kernel.local_size == 16
  assert kernel.owners == (frozenset(), {0}, {0}), "both parts of the split axis belong to the reduce"
  # GROUP: neighbouring threads read neighbouring elements; GROUPTOP: each thread reads a contiguous run of 32
  assert strides(kernel, 1) == (512, group_stride, loop_stride)
  assert strides(kernel, 0) == (1, 0, 0), "the output is the same for every thread of the group"

def test_padto_pads_an_axis_to_a_multiple_so_upcast_divides_it():
  kernel = Kernel(the_ast(transposed_add_29()), GPU)
  assert kernel.full_shape == (29, 29)
  with pytest.raises(KernelOptError, match="divide"): kernel.apply_opt(Opt(OptOps.UPCAST, 1, 4))
  kernel.apply_opt(Opt(OptOps.PADTO, 1, 32))
  assert kernel.full_shape == (29, 32) and all(st.shape == (29, 32) for st in kernel.sts)
  assert all(st.views[-1].mask is not None for st in kernel.sts), "the padding is masked in every buffer"
  kernel.apply_opt(Opt(OptOps.UPCAST, 1, 4))
  assert kernel.full_shape == (29, 8, 4) and kernel.kinds == (G, G, U)

def test_padto_refuses_useless_or_wasteful_padding():
  kernel = Kernel(the_ast(Tensor.empty(13, 32) + Tensor.empty(32, 13).T), GPU)
  assert kernel.full_shape == (13, 32)
  for opt, reason in [(Opt(OptOps.PADTO, 0, 32), "wastes"), (Opt(OptOps.PADTO, 1, 16), "already a multiple")]:
    with pytest.raises(KernelOptError, match=reason): kernel.apply_opt(opt)

def test_padto_on_a_reduce_axis_needs_a_sum_of_zeros_where_padded():
  product_sum = Kernel(the_ast((Tensor.empty(13, 29) * Tensor.empty(13, 29)).sum(1)), GPU)
  product_sum.apply_opt(Opt(OptOps.PADTO, 1, 32))
  assert product_sum.full_shape == (13, 32) and product_sum.sts[0].shape == (13, 1)
  for out in [Tensor.empty(13, 29).exp().sum(1), Tensor.empty(13, 29).max(1)]:  # exp(0) = 1; a max of padded zeros can win
    kernel = Kernel(the_ast(out), GPU)
    with pytest.raises(KernelOptError, match="sums whose inputs are 0"): kernel.apply_opt(Opt(OptOps.PADTO, 1, 32))
    assert kernel.full_shape == (13, 29)
    kernel.apply_opt(Opt(OptOps.PADTO, 0, 16))  # a global axis may always be padded: its padding is never stored
    assert kernel.full_shape == (16, 29)

def test_nolocals_forbids_later_locals_and_groups():
  kernel = Kernel(the_ast(matmul_64()), GPU)
  kernel.apply_opt(Opt(OptOps.NOLOCALS, 0, 0))
  assert kernel.dont_use_locals
  for opt in [Opt(OptOps.LOCAL, 0, 16), Opt(OptOps.GROUP, 0, 16), Opt(OptOps.GROUPTOP, 0, 16), Opt(OptOps.NOLOCALS, 0, 0)]:
    with pytest.raises(KernelOptError): kernel.apply_opt(opt)
  kernel.apply_opt(Opt(OptOps.UPCAST, 0, 4))  # register tiling is still allowed
  assert kernel.kinds == (G, G, R, U)

def test_nolocals_after_a_local_is_refused():
  kernel = optimized(matmul_64(), [Opt(OptOps.LOCAL, 0, 16)])
  with pytest.raises(KernelOptError, match="already chose its locals"): kernel.apply_opt(Opt(OptOps.NOLOCALS, 0, 0))
  assert not kernel.dont_use_locals

@pytest.mark.parametrize("opt", [Opt(OptOps.LOCAL, 0, 16), Opt(OptOps.GROUP, 0, 16), Opt(OptOps.GROUPTOP, 0, 16), Opt(OptOps.NOLOCALS, 0, 0)],
                         ids=repr)
def test_the_cpu_target_has_no_work_groups(opt):
  kernel = Kernel(the_ast(matmul_64()))
  before = layout(kernel)
  with pytest.raises(KernelOptError, match="no work-groups"): kernel.apply_opt(opt)
  assert layout(kernel) == before

def test_block_makes_the_rest_of_an_axis_the_outermost_loop():
  kernel = optimized(matmul_64(), [Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.BLOCK, 1, 4)], KernelTarget())
  assert kernel.full_shape == (4, 64, 4, 64, 4) and kernel.kinds == (G, G, G, R, U), kernel.full_shape
  assert strides(kernel, 0) == (16, 64, 4, 0, 1), "blocks of 4 x 4 columns outermost, then the rows, then a block's columns"
  with pytest.raises(KernelOptError, match="no set order"): optimized(matmul_64(), [Opt(OptOps.BLOCK, 1, 4)])  # a GPU
  before = layout(kernel)
  with pytest.raises(KernelOptError, match="leaves one block"): kernel.apply_opt(Opt(OptOps.BLOCK, 2, 4))
  assert layout(kernel) == before

def three_dim_add() -> Tensor: return Tensor.empty(8, 8, 8) + Tensor.empty(8, 8, 8).permute(2, 1, 0)  # 3 global axes

# (target, the program, Opts that fit, the Opt over the limit, what the message says)
LIMITS = {
  "max_upcast": (KernelTarget(max_upcast=64), matmul_64, [Opt(OptOps.UPCAST, 0, 8), Opt(OptOps.UPCAST, 1, 8)], Opt(OptOps.UNROLL, 0, 2),
                 "128 upcast lanes is over the limit of 64"),
  "work_group_size": (KernelTarget(has_local=True, max_local_size=128), matmul_64, [Opt(OptOps.LOCAL, 0, 16)], Opt(OptOps.LOCAL, 1, 16),
                      "256 threads per work-group is over this device's 128"),
  "local_memory": (KernelTarget(has_local=True, local_memory_bytes=1024), row_sum, [Opt(OptOps.UPCAST, 0, 4)], Opt(OptOps.GROUP, 0, 128),
                   "2048 bytes of local memory, over this device's 1024"),  # 128 threads x 4 output lanes x 4 bytes
  "local_dim_size": (KernelTarget(has_local=True, max_local_dim_sizes=(8, 8, 8)), matmul_64, [Opt(OptOps.LOCAL, 0, 8)], Opt(OptOps.LOCAL, 1, 16),
                     r"\(8, 16\)"),
  "launch_dims": (KernelTarget(has_local=True, max_local_dim_sizes=(64, 64)), three_dim_add, [Opt(OptOps.LOCAL, 0, 2), Opt(OptOps.LOCAL, 1, 2)],
                  Opt(OptOps.LOCAL, 2, 2), "launch dimension"),
}

@pytest.mark.parametrize("name", LIMITS)
def test_an_opt_over_a_limit_raises_and_leaves_the_kernel_as_it_was(name):
  target, program, fitting, too_much, message = LIMITS[name]
  kernel = optimized(program(), fitting, target)
  before = layout(kernel)
  with pytest.raises(KernelOptError, match=message): kernel.apply_opt(too_much)
  assert layout(kernel) == before, "a refused Opt changed the kernel"
  assert kernel.applied_opts == fitting

@pytest.mark.parametrize("name", LIMITS)
def test_a_limit_message_says_what_to_do(name):
  target, program, fitting, too_much, _ = LIMITS[name]
  kernel = optimized(program(), fitting, target)
  with pytest.raises(KernelOptError) as error: kernel.apply_opt(too_much)
  assert re.search(r"smaller|reduce the|fewer", str(error.value)), f"no fix-it hint in: {error.value}"

def test_a_refused_opt_after_others_changes_nothing():
  opts = [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.LOCAL, 0, 4), Opt(OptOps.GROUP, 0, 8)]
  kernel = optimized(matmul_64(), opts, KernelTarget(has_local=True, max_upcast=64))
  before = layout(kernel)
  assert kernel.full_shape == (4, 64, 4, 8, 8, 4)
  for opt in [Opt(OptOps.UPCAST, 0, 3), Opt(OptOps.UPCAST, 7, 2), Opt(OptOps.UNROLL, 0, 1), Opt(OptOps.PADTO, 0, 16), Opt(OptOps.GROUP, 0, 1024),
              Opt(OptOps.UPCAST, 1, 32)]:  # the last passes its own checks and is over the target's max_upcast only once applied
    with pytest.raises(KernelOptError): kernel.apply_opt(opt)
    assert layout(kernel) == before, f"{opt} was refused but changed the kernel"

# ---- 2. rendered code ----

def sources(kernel: Kernel) -> tuple[str, str]:
  """(CUDA C, OpenCL C) of the kernel, laid out for a GPU."""
  return render_cuda("kernel", Linearizer(kernel, threads=True).linearize()), render_opencl("kernel", Linearizer(kernel, threads=True).linearize())

def test_local_renders_work_group_and_thread_ids():
  cuda, opencl = sources(optimized(matmul_64(), [Opt(OptOps.LOCAL, 0, 16)]))
  assert re.search(r"int lidx\d+ = threadIdx\.x;", cuda) and re.search(r"int gidx\d+ = blockIdx\.[xy];", cuda) and "blockDim" not in cuda
  assert "get_local_id(0)" in opencl and "get_group_id(" in opencl and "get_global_id" not in opencl
  plain_cuda, plain_opencl = sources(optimized(matmul_64(), []))  # without LOCAL, global ids and the runtime's work-group size
  assert "blockDim" in plain_cuda and "get_global_id" in plain_opencl and "get_local_id" not in plain_opencl

@pytest.mark.parametrize("op", [OptOps.GROUP, OptOps.GROUPTOP])
def test_group_renders_local_memory_and_a_barrier(op):
  cuda, opencl = sources(optimized(row_sum(), [Opt(OptOps.UPCAST, 0, 4), Opt(op, 0, 16)]))
  # 16 threads x 4 output lanes; one barrier after the partials are written, then one per halving of the tree (16 -> 1: 4)
  assert "__shared__ float partials[64] __attribute__((aligned(16)));" in cuda and cuda.count("__syncthreads();") == 5
  assert "__local float partials[64] __attribute__((aligned(16)));" in opencl and opencl.count("barrier(CLK_LOCAL_MEM_FENCE);") == 5
  plain_cuda, plain_opencl = sources(optimized(row_sum(), [Opt(OptOps.UPCAST, 0, 4)]))
  assert "__shared__" not in plain_cuda and "__syncthreads" not in plain_cuda and "__local" not in plain_opencl and "barrier(" not in plain_opencl

def test_upcast_of_4_along_a_contiguous_axis_renders_vector_loads_and_stores():
  cuda, opencl = sources(optimized(Tensor.empty(1024) * Tensor.empty(1024), [Opt(OptOps.UPCAST, 0, 4)]))
  assert "*((const float4*)(data1+" in cuda and "*((const float4*)(data2+" in cuda and "*((float4*)(data0+" in cuda
  assert "vload4(0, data1+" in opencl and "vload4(0, data2+" in opencl and "vstore4(" in opencl
  assert not re.search(r"data\d\[", cuda + opencl), "every access should be a vector"

def test_unaligned_or_masked_lanes_get_no_vector_loads():
  # input index 1 + 4*i: contiguous, but not 16-byte aligned; the output is aligned and still gets a vector store
  cuda, opencl = sources(optimized(Tensor.empty(65)[1:] + 1, [Opt(OptOps.UPCAST, 0, 4)]))
  assert "const float4" not in cuda and "vload4" not in opencl
  assert "*((float4*)(data0+" in cuda and "vstore4(" in opencl
  # padded lanes are masked: neither the loads nor the (gated) stores are vectors
  cuda, opencl = sources(optimized(transposed_add_29(), [Opt(OptOps.PADTO, 1, 32), Opt(OptOps.UPCAST, 1, 4)]))
  assert "float4" not in cuda and "vload4" not in opencl and "vstore4" not in opencl

@pytest.mark.parametrize("dtype", [dtypes.float16, dtypes.bfloat16])
def test_16_bit_lanes_are_read_and_written_packed_two_to_a_word(dtype):
  # 8 lanes: one 16-byte access (4 words); 2 lanes (a tensor-core tile's column pair): one 4-byte word
  cuda, opencl = sources(optimized(Tensor.empty(1024, dtype=dtype) * Tensor.empty(1024, dtype=dtype), [Opt(OptOps.UPCAST, 0, 8)]))
  assert "*((const uint4*)(data1+" in cuda and "*((uint4*)(data0+" in cuda
  assert "*((const __global uint4*)(data1+" in opencl and "*((__global uint4*)(data0+" in opencl
  assert not re.search(r"data\d\[", cuda + opencl), "every access should be a vector"
  cuda, _ = sources(optimized(Tensor.empty(1024, dtype=dtype) + 1, [Opt(OptOps.UPCAST, 0, 2)]))
  assert "*((unsigned int*)(data0+" in cuda and "*((const unsigned int*)(data1+" in cuda

def test_a_16_bit_group_reduce_meets_in_float_local_memory():
  # OpenCL declares no half arrays without cl_khr_fp16 (NVIDIA's rejects `__local half`); registers hold floats anyway
  cuda, opencl = sources(optimized(Tensor.empty(16, 512, dtype=dtypes.float16).max(1), [Opt(OptOps.GROUP, 0, 16)]))
  assert "__local float partials[16]" in opencl and "__shared__ float partials[16]" in cuda, opencl

def test_padto_on_a_global_axis_gates_the_store():
  cuda, opencl = sources(optimized(transposed_add_29(), [Opt(OptOps.PADTO, 1, 32)]))
  for source in (cuda, opencl): assert re.search(r"if \(.*\) data0\[", source), source
  cuda, _ = sources(optimized(transposed_add_29(), []))
  assert "if (" not in cuda

RENDERED = {
  "matmul_tiles": (matmul_64, [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.UNROLL, 0, 4), Opt(OptOps.LOCAL, 0, 16),
                               Opt(OptOps.LOCAL, 0, 16)]),
  "group_sum": (row_sum, [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.GROUPTOP, 0, 16), Opt(OptOps.UNROLL, 0, 4)]),
  "packed_16_bit": (lambda: Tensor.empty(1024, dtype=dtypes.bfloat16) * Tensor.empty(1024, dtype=dtypes.float16), [Opt(OptOps.UPCAST, 0, 8)]),
  "padded_add": (transposed_add_29, [Opt(OptOps.PADTO, 0, 32), Opt(OptOps.PADTO, 1, 32), Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.LOCAL, 0, 8)]),
}

def test_rendered_cuda_compiles_with_nvrtc():
  from tinyc.runtime.nvrtc import compile_cuda, load_nvrtc
  try: load_nvrtc()
  except RuntimeError as error: pytest.skip(f"NVRTC is not installed: {error}")
  for name, (program, opts) in RENDERED.items():
    ptx = compile_cuda(name, sources(optimized(program(), opts))[0], "sm_90", "ptx")
    assert b".entry kernel" in ptx, f"no kernel entry in the PTX of {name}"

def test_a_cpu_reduce_packs_the_lanes_of_an_axis_an_input_is_contiguous_along_into_vectors():
  a, b = Tensor.empty(64, 64, device="LLVM"), Tensor.empty(64, 64, device="LLVM")
  kernel = optimized(a.T @ b.T, [Opt(OptOps.UPCAST, 0, 16), Opt(OptOps.UPCAST, 1, 4)], KernelTarget())  # 16 rows of a.T x 4 stored columns
  uops = Linearizer(kernel).linearize()
  vector = dtypes.float32.vec(16)
  assert [uop.dtype for uop in uops if uop.op is UOps.DEFINE_ACC] == [vector] * 4, "an accumulator a column, a vector along the rows"
  assert len([uop for uop in uops if uop.op is UOps.LOAD and uop.dtype == vector and uop.src[0].op is UOps.DEFINE_GLOBAL]) == 1, "of a.T"
  assert {uop.arg for uop in uops if uop.op is UOps.ALU and uop.dtype == vector} == {BinaryOps.MUL, BinaryOps.ADD}
  assert not [uop for uop in uops if uop.op is UOps.ALU and uop.dtype == dtypes.float32], "no scalar float math is left"
  assert "fmul reassoc contract <16 x float>" in render_llvm("kernel", uops)
  assert count_flops(uops) == 2 * 64 ** 3, "a multiply and an add for each product, a vector's lanes each"

# ---- 3. running hand-picked Opts on every device ----

def realized(*shape: int, seed: int, low: float = -1.0, high: float = 1.0) -> tuple[np.ndarray, Tensor]:
  array = np.random.default_rng(seed).uniform(low, high, size=shape).astype(np.float32)
  return array, Tensor(array).realize()

def run_with_opts(out: Tensor, opts: list[Opt]) -> np.ndarray:
  """Run the one kernel that computes `out` on the default device with exactly these Opts."""
  device, kernels = Device.DEFAULT, []
  for item in create_schedule([out.lazydata]):
    if item.ast.op in LoadOps: run_schedule([item])
    else: kernels.append(item)
  assert len(kernels) == 1, f"expected one kernel, got {len(kernels)}"
  item = kernels[0]
  program = Device[device].get_program(item.ast, tuple(opts))
  results = [Buffer(device, prod(base.shape), base.dtype) for base in item.outs]
  program(results + [src.realized for src in item.inputs])
  return results[item.outs.index(out.lazydata.base)].numpy().reshape(out.shape)

def has_local() -> bool: return Device[Device.DEFAULT].target.has_local

def test_matmul_with_register_and_work_group_tiles(tinyc_device):
  (a, ta), (b, tb) = realized(64, 64, seed=0), realized(64, 64, seed=1)
  opts = [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.UNROLL, 0, 4)]
  if has_local(): opts += [Opt(OptOps.LOCAL, 0, 16), Opt(OptOps.LOCAL, 0, 16)]  # the 16x16 threads of one work-group
  np.testing.assert_allclose(run_with_opts(ta @ tb, opts), a @ b, rtol=1e-4, atol=1e-4)
  if has_local(): assert Device[Device.DEFAULT].get_program(the_ast(ta @ tb), tuple(opts)).local_size == (16, 16, 1)

@pytest.mark.parametrize("op", [OptOps.GROUP, OptOps.GROUPTOP])
def test_row_sum_and_max_split_across_a_work_group(op, tinyc_device):
  x, tx = realized(16, 512, seed=2, low=-3.0, high=-1.0)  # all negative: a max that starts at 0 anywhere gives 0
  if not has_local():
    with pytest.raises(KernelOptError, match="no work-groups"): Device[Device.DEFAULT].get_program(the_ast(tx.sum(1)), (Opt(op, 0, 16),))
    return
  np.testing.assert_allclose(run_with_opts(tx.sum(1), [Opt(op, 0, 16)]), x.sum(1), rtol=1e-5, atol=1e-4)
  lanes_and_unroll = [Opt(OptOps.UPCAST, 0, 4), Opt(op, 0, 16), Opt(OptOps.UNROLL, 0, 4)]  # 4 partial results per thread
  np.testing.assert_allclose(run_with_opts(tx.sum(1), lanes_and_unroll), x.sum(1), rtol=1e-5, atol=1e-4)
  np.testing.assert_array_equal(run_with_opts(tx.max(1), lanes_and_unroll), x.max(1))

@pytest.mark.parametrize("op", [OptOps.GROUP, OptOps.GROUPTOP])
def test_online_softmax_split_across_a_work_group(op, tinyc_device):
  """Attention's max and sums over the keys, split among a work-group's threads, still walk each thread's keys once (online softmax);
  the threads' maxes meet first, then each sum is rescaled to the work-group's max as it meets. A causal mask leaves some threads
  of the first rows no key at all (a max of -inf, sums of 0)."""
  (q, tq), (k, tk), (v, tv) = realized(24, 8, seed=5), realized(32, 8, seed=6), realized(32, 16, seed=7)
  causal = np.where(np.tril(np.ones((24, 32), bool)), 0.0, -np.inf).astype(np.float32)
  out = (tq @ tk.T * 0.5 + Tensor(causal)).softmax(-1) @ tv
  opts = [Opt(op, 0, 8), Opt(OptOps.UPCAST, 1, 0)]
  uops = Linearizer(optimized(out, opts), threads=True).linearize()
  assert len([uop for uop in uops if uop.op is UOps.LOOP and uop.src[1].arg == 4]) == 1, "each thread walks its 4 keys once"
  if not has_local(): return
  scores = q @ k.T * 0.5 + causal
  weights = np.exp(scores - scores.max(1, keepdims=True))
  np.testing.assert_allclose(run_with_opts(out, opts), weights / weights.sum(1, keepdims=True) @ v, rtol=1e-5, atol=1e-5)

def test_padded_elementwise_with_upcast(tinyc_device):
  (a, ta), (b, tb) = realized(29, 29, seed=3), realized(29, 29, seed=4)
  opts = [Opt(OptOps.PADTO, 1, 32), Opt(OptOps.UPCAST, 1, 4)]
  if has_local(): opts += [Opt(OptOps.PADTO, 0, 32), Opt(OptOps.LOCAL, 0, 8)]
  np.testing.assert_allclose(run_with_opts(ta + tb.T, opts), a + b.T, rtol=1e-6)

def test_matmul_padded_along_the_reduce(tinyc_device):
  (a, ta), (b, tb) = realized(13, 29, seed=5), realized(29, 7, seed=6)
  opts = [Opt(OptOps.PADTO, 2, 32), Opt(OptOps.UNROLL, 0, 4)]  # PADTO's axis counts from 0: (13, 7, 29) -> (13, 7, 32)
  if has_local(): opts += [Opt(OptOps.GROUP, 0, 8)]
  np.testing.assert_allclose(run_with_opts(ta @ tb, opts), a @ b, rtol=1e-5, atol=1e-5)
  # a constant in the sum is padded too (it reads 0 in the padding), so padding the reduce of x + 1 is right
  np.testing.assert_allclose(run_with_opts((ta + 1).sum(1), [Opt(OptOps.PADTO, 1, 32), Opt(OptOps.UNROLL, 0, 8)]), (a + 1).sum(1), rtol=1e-5)

@pytest.mark.parametrize("lanes", [2, 4, 8])
def test_packed_16_bit_lanes_keep_every_value(lanes, tinyc_device):
  # through packed loads and stores (on GPUs) in both halves of each word: the same values as one lane at a time, and torch's
  x = np.random.default_rng(7).standard_normal(1024).astype(np.float32) * 100
  for dtype, torch_dtype in ((dtypes.float16, torch.float16), (dtypes.bfloat16, torch.bfloat16)):
    t = Tensor(x).cast(dtype).realize()
    one_by_one = run_with_opts(t * 3 + 1, []).astype(np.float32)
    np.testing.assert_array_equal(run_with_opts(t * 3 + 1, [Opt(OptOps.UPCAST, 0, lanes)]).astype(np.float32), one_by_one)
    np.testing.assert_allclose(one_by_one, (torch.tensor(x).to(torch_dtype) * 3 + 1).float().numpy(), rtol=1e-2)

PACKED = {  # reduces whose lanes along an input's contiguous axis a CPU packs into vectors: (program, opts, numpy)
  "matmul TT unrolled": (lambda x, i: x[:24].T @ x[:16, :24].T, [Opt(OptOps.UPCAST, 0, 8), Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.UNROLL, 0, 4)],
                         lambda x, i: x[:24].T @ x[:16, :24].T),
  "max of negatives": (lambda x, i: (x - 5).max(0), [Opt(OptOps.UPCAST, 0, 8)], lambda x, i: (x - 5).max(0)),
  "int sum": (lambda x, i: i.sum(0), [Opt(OptOps.UPCAST, 0, 16)], lambda x, i: i.sum(0)),
  "bool count and cast": (lambda x, i: ((x > 0).int() * i).sum(0) + (x.exp() * i.float()).sum(0), [Opt(OptOps.UPCAST, 0, 8)],
                          lambda x, i: ((x > 0) * i).sum(0) + (np.exp(x) * i).sum(0)),
  "padded lanes": (lambda x, i: x.pad(((0, 0), (3, 5))).sum(0), [Opt(OptOps.UPCAST, 0, 8)], lambda x, i: np.pad(x, ((0, 0), (3, 5))).sum(0)),
}

@pytest.mark.parametrize("name", PACKED)
def test_reduces_with_packed_lanes_match_numpy(name, tinyc_device):
  (x, tx), i = realized(32, 32, seed=9), np.random.default_rng(10).integers(-50, 50, size=(32, 32), dtype=np.int32)
  program, opts, reference = PACKED[name]
  out = program(tx, Tensor(i).realize())
  np.testing.assert_allclose(run_with_opts(out, opts), reference(x, i), rtol=1e-4, atol=1e-4)

# ---- 4. the hand-coded heuristic ----

def heuristic(out: Tensor, target: KernelTarget = GPU) -> tuple[Kernel, list[OptOps]]:
  kernel = Kernel(the_ast(out), target)
  return kernel, [opt.op for opt in hand_coded_optimizations(kernel)]

def test_heuristic_stages_a_short_reduce_with_64_times_the_outputs_that_fill_a_gpu():
  """Winograd's 36 batched products of an N64 C64 56x56 conv (a reduce of 64 channels): staged, 4 x 4 x 4 outputs a thread."""
  target = KernelTarget(has_local=True, max_upcast=GPU_MAX_UPCAST)
  kernel, ops = heuristic(Tensor.empty(36, 64, 64) @ Tensor.empty(36, 64, 12544), target)
  assert ops.count(OptOps.STAGE) == 2 and kernel.upcast_size == 4 * 4 * 4 * 4 and kernel.local_size == 256, kernel.applied_opts
  assert OptOps.STAGE not in heuristic(Tensor.empty(36, 64, 64) @ Tensor.empty(36, 64, 3136), target)[1], "a quarter of the outputs"

def test_heuristic_stages_a_large_matmul_on_a_gpu():
  big = Tensor.empty(4096, 4096) @ Tensor.empty(4096, 4096)
  kernel, _ = heuristic(big, KernelTarget(has_local=True, max_upcast=GPU_MAX_UPCAST))
  assert kernel.applied_opts == [Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.LOCAL, 0, 8), Opt(OptOps.LOCAL, 1, 16),
                                 Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.UPCAST, 1, 2), Opt(OptOps.UNROLL, 0, 16), Opt(OptOps.STAGE, 1, 0),
                                 Opt(OptOps.STAGE, 2, 0)]
  kernel, _ = heuristic(big)  # 256 upcast lanes at most: the same with 4 reduce elements a trip
  assert kernel.upcast_size == 256 and kernel.size_of(U) == 64 and kernel.local_size == 128 and kernel.staged == (1, 2)
  # too little local memory for the tiles: 8x8 register tiles, an unroll of 4, 4x8 work-groups, nothing staged
  kernel, ops = heuristic(big, KernelTarget(has_local=True, local_memory_bytes=4096))
  assert ops.count(OptOps.UPCAST) == 2 and ops.count(OptOps.UNROLL) == 1 and ops.count(OptOps.LOCAL) == 2, ops
  assert kernel.upcast_size == 256 and kernel.size_of(U) == 64 and kernel.local_size == 32 and not kernel.staged
  kernel, ops = heuristic(Tensor.empty(512, 64) @ Tensor.empty(64, 512))  # too short a reduce to stage: 4x4 tiles, 16x16 work-groups
  assert kernel.upcast_size == 64 and kernel.size_of(U) == 16 and kernel.local_size == 256 and len(kernel.axes(G)) == 2

def test_heuristic_stages_a_linear_layers_operands_not_its_bias():
  """A bias is read after the reduce, where staging has nothing to share: x W^T + b stages x and W, as x W^T alone does."""
  x, w, b = Tensor.empty(4096, 384), Tensor.empty(1152, 384), Tensor.empty(1152)
  kernel, _ = heuristic(x @ w.T + b, KernelTarget(has_local=True, max_upcast=GPU_MAX_UPCAST))
  assert kernel.staged == (1, 2) and kernel.local_size == 128

def test_heuristic_stages_a_matmul_from_128_products_an_output():
  for k, staged in ((128, (1, 2)), (64, ())):
    kernel, _ = heuristic(Tensor.empty(8, 512, k) @ Tensor.empty(8, k, 256), KernelTarget(has_local=True, max_upcast=GPU_MAX_UPCAST))
    assert kernel.staged == staged, k  # batched attention scores, a weight of width 512: (32, 1024, 128) x (32, 128, 1024) is staged
  kernel, ops = heuristic(Tensor.empty(3000, 3000) @ Tensor.empty(3000, 3000), KernelTarget(has_local=True, max_upcast=GPU_MAX_UPCAST))
  assert ops[:3] == [OptOps.PADTO] * 3 and kernel.staged == (1, 2) and kernel.full_shape[0] * 64 == 3008  # rows to whole 64-row tiles

def test_heuristic_gives_a_conv_64_accumulators_a_thread_on_a_gpu():
  x, w = Tensor.empty(64, 64, 56, 56), Tensor.empty(64, 64, 3, 3)
  with Context(WINOGRAD=0): conv = x.conv2d(w, padding=1)  # the direct conv (a 3x3 conv of stride 2, of 16-bit floats)
  kernel, _ = heuristic(conv, KernelTarget(has_local=True, max_upcast=GPU_MAX_UPCAST))
  # 4 x 4 lanes along output channels and columns, then x2 along the output channels (x is reused most) and the batch (the
  # larger of the axes the weight is reused along)
  assert kernel.applied_opts[-2:] == [Opt(OptOps.UPCAST, 1, 2), Opt(OptOps.UPCAST, 0, 2)] and kernel.size_of(U) == 64
  kernel, _ = heuristic(Tensor.empty(512, 64) @ Tensor.empty(64, 512))  # one reduce axis: a matmul keeps its 4 x 4 tile
  assert kernel.size_of(U) == 16
  tokens_x, tokens_grad = Tensor.empty(32, 64, 96, 1), Tensor.empty(32, 64, 1, 384)  # a weight gradient over (batch, tokens): no window
  kernel = Kernel(kernel_asts((tokens_x * tokens_grad).sum((0, 1)))[0], GPU)  # (on a GPU device: split-K's parts)
  hand_coded_optimizations(kernel)
  assert kernel.size_of(U) == 16, kernel.applied_opts

def test_heuristic_puts_a_16_bit_conv_on_4_warps_of_tensor_cores_padding_only_its_columns():
  x, w = Tensor.empty(64, 64, 56, 56, dtype=dtypes.float16), Tensor.empty(64, 64, 3, 3, dtype=dtypes.float16)
  h200 = KernelTarget(has_local=True, max_upcast=GPU_MAX_UPCAST, tensor_cores=True, local_memory_bytes=227 * 1024)
  kernel = Kernel(kernel_asts(x.conv2d(w, padding=1))[-1], h200)  # (after the copies of x and w channels-last)
  ops = [opt.op for opt in hand_coded_optimizations(kernel)]
  # M: the 64 output channels, N: the 56 columns padded to 64 (the output's contiguous axis); the rows are not padded to whole
  # tiles with them (work thrown away), and give the 4 warps
  assert kernel.applied_opts[:2] == [Opt(OptOps.PADTO, 3, 64), Opt(OptOps.TC, 0, 3)] and ops.count(OptOps.PADTO) == 1, kernel.applied_opts
  assert kernel.local_size == 4 * 32, kernel.applied_opts

@pytest.mark.parametrize("m, n, k, n_upcast, n_warps, n_padded", [
  (4096, 4096, 4096, 8, 4, 4096),  # 512 work-groups of 128 x 256: 3.9 waves of one an SM
  (3000, 3000, 3000, 6, 4, 3072),  # 128 x 256: 288 work-groups, 2.2 waves (the third mostly idle); 128 x 192: 384, 2.9 waves
  (2560, 1536, 3584, 8, 4, 1536),  # 120 work-groups of 128 x 256 fit one wave (128 x 128: 240 work-groups, two an SM, ran slower)
  (1920, 2880, 4096, 6, 4, 2880),  # 2880 is 15 x 192, and 128 x 256 would pad it to 3072
  (1024, 1024, 256, 8, 2, 1024)])  # 64 work-groups of 128 x 128 keep twice the SMs busy of 32 of 128 x 256
def test_heuristic_picks_the_tensor_core_tile_along_n_by_its_waves(m, n, k, n_upcast, n_warps, n_padded):
  h200 = KernelTarget(has_local=True, max_upcast=GPU_MAX_UPCAST, tensor_cores=True, local_memory_bytes=227 * 1024, compute_units=132)
  kernel = Kernel(the_ast(Tensor.empty(m, k, dtype=dtypes.float16) @ Tensor.empty(k, n, dtype=dtypes.float16)), h200)
  opts = hand_coded_optimizations(kernel)
  assert Opt(OptOps.UPCAST, 1, n_upcast) in opts and Opt(OptOps.LOCAL, 1, n_warps) in opts, opts
  pads_n = [opt for opt in opts if opt.op is OptOps.PADTO and opt.axis == 1]
  assert pads_n == ([Opt(OptOps.PADTO, 1, 8 * n_upcast * n_warps)] if n_padded != n else []), opts

def test_heuristic_fills_a_conv_weight_gradients_work_group_to_a_warp_with_a_group():
  x, w = Tensor.empty(8, 64, 28, 28), Tensor.empty(64, 64, 3, 3)
  w.requires_grad = True
  with Context(WINOGRAD=0): (x.conv2d(w, padding=1) * Tensor.empty(8, 64, 28, 28)).sum().backward()  # the direct conv's
  assert w.grad is not None
  kernel = Kernel(kernel_asts(w.grad)[0], KernelTarget(has_local=True, max_upcast=GPU_MAX_UPCAST))  # (on a GPU device: split-K's parts)
  ops = [opt.op for opt in hand_coded_optimizations(kernel)]
  # LOCAL along the 3 x 3 window alone makes 9 threads; the columns' reduce, shared by a GROUP, makes them 9 x 7
  assert OptOps.GROUP in ops and kernel.local_size >= 32, kernel.applied_opts

def test_heuristic_groups_a_long_row_sum_on_a_gpu():
  kernel, ops = heuristic(Tensor.empty(64, 4096).sum(1))
  assert OptOps.GROUP in ops and len(kernel.axes(GR)) == 1 and kernel.local_size >= 16

@pytest.mark.parametrize("dtype, scaled", [(dtypes.float32, False), (dtypes.bfloat16, False), (dtypes.float32, True)])
def test_heuristic_sums_columns_with_neighbouring_threads_along_them_on_a_gpu(dtype, scaled, tinyc_device):
  """A sum down the columns (a bias's gradient, (tokens, features) -> features): a 32-byte sector of a row's columns on as many
  threads, launch dimension 0, and the rest of a work-group's 256 threads along the rows (GROUP). With its threads along the rows
  alone, each read a sector of its own for 4 bytes of it (H200: (4096, 1536) 570 -> 1260-2220 GB/s). `scaled`: each row times a
  value of its own, read contiguously along the rows (layernorm's weight gradient reads a row's statistics): GROUP alone, as before
  (the plan ran the GPT bench's layernorm weight gradient 3x slower)."""
  stored = realized(4096, 384, seed=12)[1].cast(dtype).realize()
  scale = realized(4096, 1, seed=13)[1]
  out = (stored * scale).sum(0) if scaled else stored.sum(0)
  kernel, ops = heuristic(out)
  if scaled: assert OptOps.GROUP in ops and not kernel.axes(L), kernel.applied_opts
  else:
    assert OptOps.LOCAL in ops and OptOps.GROUP in ops and kernel.local_size == 256, kernel.applied_opts
    columns = kernel.axes(L)
    assert len(columns) == 1 and kernel.full_shape[columns[0]] == 32 // dtype.itemsize and strides(kernel, 1)[columns[0]] == 1
    threads = [uop.arg for uop in Linearizer(kernel, threads=True).linearize() if uop.op is UOps.SPECIAL]
    assert [index.name for index in threads if index.dim == 0 and index.name[0] == "l"] == [f"lidx{columns[0]}"], "neighbouring columns"
  if Device[Device.DEFAULT].target.has_local:
    expected = (stored.numpy().astype(np.float64) * (scale.numpy() if scaled else 1)).sum(0)
    tolerance = 1e-4 if dtype == dtypes.float32 else 1e-2
    np.testing.assert_allclose(run_with_opts(out, kernel.applied_opts).astype(np.float64), expected, rtol=tolerance, atol=tolerance)

def test_heuristic_upcasts_an_elementwise_kernel_by_4_on_a_gpu():
  kernel, _ = heuristic(Tensor.empty(64, 64) * 2 + 1)
  assert kernel.applied_opts == [Opt(OptOps.UPCAST, 0, 4)] and kernel.upcast_size == 4

def test_heuristic_treats_a_short_reduce_without_reuse_as_elementwise_on_a_gpu():
  # the second kernel of a split-K matmul: each output sums its own 4 parts; work-groups of 16 threads ran it at 420 GB/s on the H200
  parts = Tensor.empty(4, 768, 3072).sum(0)
  kernel, _ = heuristic(parts)
  assert kernel.applied_opts == [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UNROLL, 0, 0)] and kernel.local_size == 1

def test_heuristic_with_noopt_applies_nothing():
  matmul = Tensor.empty(4096, 4096) @ Tensor.empty(4096, 4096)
  for target in (GPU, KernelTarget()):
    kernel = Kernel(the_ast(matmul), target)
    before = layout(kernel)
    with Context(NOOPT=1): assert hand_coded_optimizations(kernel) == []
    assert layout(kernel) == before

def test_heuristic_on_a_cpu_upcasts_a_matmul_without_locals():
  kernel, ops = heuristic(Tensor.empty(512, 512, device="LLVM") @ Tensor.empty(512, 512, device="LLVM"), KernelTarget())  # (a GPU splits its K)
  assert ops and set(ops) == {OptOps.UPCAST, OptOps.BLOCK} and not kernel.axes(L, GR) and kernel.upcast_size > 1

def layouts(size: int) -> dict[str, tuple[Tensor, Tensor]]:
  """The four layouts of a square matmul's inputs: each contiguous (N) or a transposed view of a contiguous array (T)."""
  a, b = Tensor.empty(size, size, device="LLVM"), Tensor.empty(size, size, device="LLVM")  # (a GPU would split a long K in two kernels)
  return {"NN": (a, b), "NT": (a, b.T), "TN": (a.T, b), "TT": (a.T, b.T)}

def test_heuristic_on_a_cpu_tiles_no_rows_of_a_row_reduce(tinyc_device):
  """A layernorm of a residual stream (several inputs) with a position embedding (broadcast along the batch) and its weight and bias
  (along the rows): no register tile of the rows, whose loop would walk 4 x 4 rows of each input at once (CPU_STREAMS). Tiled 4 x 4
  (and blocked), the GPT bench's residual layernorm forward and backward ran 1.4-1.9x slower (2-core guest)."""
  x, tx = realized(8, 256, 128, seed=20)
  pos, w = realized(256, 128, seed=21)[1], realized(128, seed=22)[1]
  out = (tx + tx * 2 + pos).layernorm() * w + w
  kernel, ops = heuristic(out, KernelTarget())
  assert OptOps.UPCAST not in ops, kernel.applied_opts
  x = x * 3
  expected = (x + pos.numpy()) - (x + pos.numpy()).mean(-1, keepdims=True)
  expected = expected / np.sqrt((expected ** 2).mean(-1, keepdims=True) + 1e-5) * w.numpy() + w.numpy()
  np.testing.assert_allclose(out.numpy(), expected, rtol=1e-4, atol=1e-4)
  assert heuristic(Tensor.empty(64, 64) @ Tensor.empty(64, 64), KernelTarget())[0].upcast_size > 1, "a product is still tiled"

def test_heuristic_on_a_cpu_blocks_a_matmul_whose_inner_loop_walks_over_512_kb():
  for size, blocks in ((1024, 8), (1000, 10), (64, None)):  # 1024 x 4 rows of b.T a trip of the column loop: 16 KB
    kernel, ops = heuristic(layouts(size)["NT"][0] @ layouts(size)["NT"][1], KernelTarget())
    assert (OptOps.BLOCK in ops) == (blocks is not None) and (blocks is None or kernel.full_shape[0] == blocks), kernel.full_shape
    inner_loop_bytes = 4 * size * kernel.full_shape[2] * 4  # its trips x 4 rows of b.T
    assert blocks is None or inner_loop_bytes <= 512 << 10

def test_heuristic_on_a_cpu_tiles_a_transposing_copy_8_by_8(tinyc_device):
  (a, ta) = realized(64, 40, seed=3)
  kernel, ops = heuristic(ta.T.contiguous(), KernelTarget())
  assert ops == [OptOps.UPCAST, OptOps.UPCAST] and kernel.full_shape == (5, 8, 8, 8), kernel.full_shape
  assert strides(kernel, 0)[-1] == 1 and strides(kernel, 1)[-2] == 1, "8 lanes along the output's rows, 8 along the input's"
  np.testing.assert_allclose(run_with_opts(ta.T.contiguous(), kernel.applied_opts), a.T)
  assert heuristic(ta.contiguous() + 1, KernelTarget())[1] == [], "a copy along one axis is LLVM's to vectorize"

def test_heuristic_on_a_cpu_upcasts_an_output_axis_an_input_reads_with_no_one_stride(tinyc_device):
  """Attention's dq, dk and dv, their heads put back in a row and side by side (a permute under a reshape, then a cat): along the
  output's row an input's index divides and takes the remainder, which LLVM's loop vectorizer gives up on. Two vector registers'
  lanes a trip, each lane's index a run's start plus the lane."""
  arrays = [realized(2, 4, 16, 32, seed=seed) for seed in (10, 11, 12)]
  rows = [t.permute(0, 2, 1, 3).reshape(2, 16, 128) for _, t in arrays]
  out = rows[0].cat(rows[1], rows[2], dim=-1) * 2
  kernel, _ = heuristic(out, KernelTarget())
  assert kernel.applied_opts == [Opt(OptOps.UPCAST, 1, 16)], kernel.applied_opts
  assert heuristic(Tensor.empty(32, 384) * 2, KernelTarget())[1] == [], "one stride: LLVM's loop to vectorize"
  expected = np.concatenate([a.transpose(0, 2, 1, 3).reshape(2, 16, 128) for a, _ in arrays], -1) * 2
  np.testing.assert_allclose(run_with_opts(out, kernel.applied_opts), expected)

def test_heuristic_on_a_cpu_blocks_a_transposing_copy_whose_inner_loop_walks_over_256_rows(monkeypatch):
  monkeypatch.setenv("DEVICE", "LLVM")  # BLOCK orders a CPU's loops
  (a, ta) = realized(520, 48, seed=6)  # the output's rows are 520 of a's: 65 trips of 8
  kernel, ops = heuristic(ta.T.contiguous(), KernelTarget())
  assert ops == [OptOps.UPCAST, OptOps.UPCAST, OptOps.BLOCK] and kernel.full_shape == (13, 6, 5, 8, 8), kernel.full_shape
  assert strides(kernel, 1)[0] == 5 * 8 * 48, "the outermost loop steps through blocks of 40 rows (13 of them: the threads share them)"
  np.testing.assert_allclose(run_with_opts(ta.T.contiguous(), kernel.applied_opts), a.T)
  assert OptOps.BLOCK not in heuristic(realized(256, 48, seed=6)[1].T.contiguous(), KernelTarget())[1]

def test_heuristic_on_a_gpu_tiles_a_transposing_copy_4_by_4_in_8_by_8_threads(tinyc_device):
  (a, ta) = realized(64, 40, seed=3)
  kernel, ops = heuristic(ta.T.contiguous(), GPU)
  assert ops == [OptOps.UPCAST, OptOps.UPCAST, OptOps.LOCAL, OptOps.LOCAL] and kernel.full_shape == (2, 2, 5, 8, 4, 4), kernel.full_shape
  assert strides(kernel, 0)[-1] == strides(kernel, 1)[-2] == 1, "4 lanes along the output's rows, 4 along the input's"
  assert strides(kernel, 0)[3] == 4, "neighbouring threads along the output's rows write neighbouring 16 bytes"
  if Device[Device.DEFAULT].target.has_local: np.testing.assert_allclose(run_with_opts(ta.T.contiguous(), kernel.applied_opts), a.T)
  assert heuristic(ta.contiguous() + 1, GPU)[1] == [OptOps.UPCAST], "a copy along one axis: 4 lanes along it"

def test_blocked_matmuls_match_numpy(monkeypatch):
  monkeypatch.setenv("DEVICE", "LLVM")  # BLOCK orders a CPU's loops
  (a, ta), (b, tb) = realized(64, 48, seed=4), realized(48, 40, seed=5)
  opts = [Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.BLOCK, 0, 8), Opt(OptOps.BLOCK, 1, 4)]  # loops (2, 4, 4, 5)
  np.testing.assert_allclose(run_with_opts(ta @ tb, opts), a @ b, rtol=1e-4, atol=1e-4)

@pytest.mark.parametrize("vector_lanes, tile", [(8, 8), (16, 16)])
def test_heuristic_on_a_cpu_tiles_two_different_axes_when_the_reduce_is_contiguous(vector_lanes, tile):
  """Every input contiguous along the reduce: the heuristic tiles rows and columns, each lane a vector accumulator: half the vector
  registers, 4 x 2 with AVX2's 16 (4 x 4 spilled: a linear layer's forward 2048 x 512 x 128 ran at 62 GFLOP/s, 103 so), 4 x 4 with
  AVX-512's 32; and unrolls the reduce by a vector register's lanes, which the accumulators hold as partial sums (packing.horizontal
  adds them up together)."""
  a, b = layouts(64)["NT"]
  kernel, ops = heuristic(a @ b, KernelTarget(vector_lanes=vector_lanes))
  assert ops == [OptOps.UPCAST, OptOps.UPCAST, OptOps.UNROLL] and kernel.full_shape[:2] == (64 * 4 // tile, 16), kernel.full_shape
  assert kernel.size_of(U) == tile and kernel.applied_opts[-1].amount == vector_lanes

@pytest.mark.one_device
@pytest.mark.parametrize("opts", [[Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UNROLL, 0, 16)],
                                  [Opt(OptOps.UPCAST, 1, 3), Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.UNROLL, 0, 8)],
                                  [Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.UPCAST, 0, 8), Opt(OptOps.UNROLL, 0, 4)],
                                  [Opt(OptOps.UNROLL, 0, 16)]])
def test_a_cpu_adds_up_vector_partial_sums_of_many_accumulators_together(opts, tinyc_device):
  """A CPU reduce whose unrolled lanes an input is contiguous along keeps a vector of partial sums an accumulator (no key axis to pack)
  and adds them up after the loop for all accumulators at once (packing.horizontal: pairs of vectors, then halves); 6 accumulators of
  8 lanes, 32 of 4 and one of 16 as well as 16 of 16. Against numpy, a @ b.T with 48 rows and columns over 64."""
  (a, ta), (b, tb) = realized(48, 64, seed=11), realized(48, 64, seed=12)
  kernel = Kernel(the_ast(ta @ tb.T), KernelTarget(vector_lanes=16))
  for opt in opts: kernel.apply_opt(opt)
  uops = Linearizer(kernel).linearize()
  assert {uop.dtype.count for uop in uops if uop.op is UOps.DEFINE_ACC} == {opts[-1].amount}
  np.testing.assert_allclose(run_with_opts(ta @ tb.T, opts), a @ b.T, rtol=1e-4, atol=1e-4)

@pytest.mark.parametrize("vector_lanes, lanes", [(16, (8, 32)), (8, (4, 16))])
def test_heuristic_on_a_cpu_tiles_a_weight_gradient_in_half_the_vector_registers(vector_lanes, lanes, tinyc_device):
  """x.T @ grad (a weight gradient: both inputs and the output run along the columns, the reduce walks rows): two vector registers
  of columns and a tile of rows, accumulators in half the vector registers: 16 x 4 lanes with AVX2's 16, 32 x 8 with AVX-512's 32
  (where it had AVX2's 16 x 8, the GPT_CPU step's weight gradients ran 64-82 GFLOP/s, 89-108 so)."""
  (x, tx), (g, tg) = realized(256, 64, seed=9), realized(256, 128, seed=10)
  kernel, _ = heuristic(tx.T @ tg, KernelTarget(vector_lanes=vector_lanes))
  assert sorted(kernel.full_shape[axis] for axis in kernel.axes(U)) == sorted(lanes), kernel.full_shape
  assert strides(kernel, 0)[kernel.axes(U)[0]] == 1, "the columns' lanes are neighbours in the output"
  np.testing.assert_allclose(run_with_opts(tx.T @ tg, kernel.applied_opts), x.T @ g, rtol=1e-4, atol=1e-4)

@pytest.mark.one_device
def test_a_cpu_loads_each_row_of_a_cat_as_one_gated_vector(tinyc_device):
  """A cat's lanes come each row from one of its inputs, all under one gate: a CPU loads the row as one vector under that gate (LLVM
  had made each input's gated scalar loads a gather: dq, dk and dv put back in a row, 2048 x 384, 1.27-1.41 -> 0.46-0.57 ms).
  Against numpy."""
  rng = np.random.default_rng(0)
  parts = [rng.standard_normal((2, 4, 16, 32), dtype=np.float32) for _ in range(3)]
  out = Tensor.cat(*[Tensor(part).transpose(1, 2).reshape(2, 16, 128) * 0.5 + 1 for part in parts], dim=-1)
  kernel, _ = heuristic(out, KernelTarget(vector_lanes=16))
  loads = [uop for uop in Linearizer(kernel).linearize() if uop.op is UOps.LOAD and uop.src[0].op is UOps.DEFINE_GLOBAL]
  assert loads and all(uop.dtype.count == 32 and len(uop.src) == 3 for uop in loads), [(uop.dtype, len(uop.src)) for uop in loads]
  want = np.concatenate([part.transpose(0, 2, 1, 3).reshape(2, 16, 128) * 0.5 + 1 for part in parts], axis=-1)
  np.testing.assert_allclose(out.numpy(), want, rtol=1e-6)

@pytest.mark.one_device
def test_a_cpu_prefetches_the_rows_a_weight_gradient_walks_a_page_apart(tinyc_device):
  """x.T @ grad over 256 tokens into 128 x 512: grad's rows are 2 KB apart, so the reduce loop crosses a page every other trip and
  the hardware's prefetchers (which stop at a page's end) fall behind; the loop asks for grad's row PREFETCH_TRIPS trips ahead
  (the CPU GPT bench's weight gradients 2.40-2.61 -> 1.82-1.98 ms a call). x's rows, 512 B apart, and a forward x @ W.T (both along
  the reduce) get none. Both against numpy, and the prefetch in the LLVM IR."""
  (x, tx), (g, tg) = realized(256, 128, seed=3), realized(256, 512, seed=4)  # (256 tokens: one kernel on a GPU too, no split-K)
  kernel, _ = heuristic(tx.T @ tg, KernelTarget(vector_lanes=16))
  uops = Linearizer(kernel).linearize()
  prefetched = [uop for uop in uops if uop.op is UOps.PREFETCH]
  reduce_axis = kernel.axes(AxisKind.REDUCE)[0]
  assert {uop.src[0].arg.number for uop in prefetched} == {number for number in range(3) if strides(kernel, number)[reduce_axis] == 512}
  assert "llvm.prefetch" in render_llvm("dw", uops)
  np.testing.assert_allclose(run_with_opts(tx.T @ tg, kernel.applied_opts), x.T @ g, rtol=1e-4, atol=1e-3)
  forward, _ = heuristic(tx @ realized(512, 128, seed=5)[1].T, KernelTarget(vector_lanes=16))
  assert not [uop for uop in Linearizer(forward).linearize() if uop.op is UOps.PREFETCH]

@pytest.mark.parametrize("size, vector_lanes, lanes", [(1024, 16, (16, 8)), (1024, 8, (16, 4)), (1000, 16, (8, 10)), (40, 8, (8, 8))])
def test_heuristic_on_a_cpu_vectorizes_along_an_input_when_none_runs_along_the_output(size, vector_lanes, lanes):
  a, b = layouts(size)["TT"]  # a.T is contiguous along the rows, b.T along the reduce, the output along the columns
  kernel, _ = heuristic(a @ b, KernelTarget(vector_lanes=vector_lanes))
  assert kernel.full_shape[-2:] == lanes and kernel.size_of(U) == prod(lanes), kernel.full_shape
  assert strides(kernel, 1)[-2] == 1, "the first lanes are neighbours in a.T: one vector load"
  assert strides(kernel, 1)[-1] == 0, "then a tile of columns, which reuses it"

def test_heuristic_on_a_cpu_vectorizes_an_output_width_that_4_does_not_divide(tinyc_device):
  # found by conv2d's input gradient in the CNN train step: its 26 pixels wide rows got no Opt at all (42 ms; 2 lanes, then 8 output
  # channels reusing each vector load: 9 ms)
  (x, tx), (w, tw) = realized(2, 8, 28, 28, seed=1), realized(16, 8, 3, 3, seed=2)
  kernel, ops = heuristic(tx.conv2d(tw), KernelTarget())
  assert ops == [OptOps.UPCAST, OptOps.UPCAST] and kernel.applied_opts[0] == Opt(OptOps.UPCAST, 3, 2), kernel.applied_opts
  want = np.einsum("nchwij,ocij->nohw", np.lib.stride_tricks.sliding_window_view(x, (3, 3), axis=(2, 3)), w)
  np.testing.assert_allclose(run_with_opts(tx.conv2d(tw), kernel.applied_opts), want, rtol=1e-4, atol=1e-4)

@pytest.mark.parametrize("layout", ["NN", "NT", "TN", "TT"])
def test_the_cpu_heuristics_opts_for_each_matmul_layout_match_numpy(layout, tinyc_device):
  (a, ta), (b, tb) = realized(40, 40, seed=7), realized(40, 40, seed=8)  # 40: lanes of 8 and 5, no 16
  transpose = {"N": lambda x: x, "T": lambda x: x.T}
  left, right = (transpose[letter] for letter in layout)
  out = left(ta) @ right(tb)
  opts = hand_coded_optimizations(Kernel(the_ast(out), KernelTarget()))
  assert opts, f"{layout}: the CPU heuristic should tile this matmul"
  np.testing.assert_allclose(run_with_opts(out, opts), left(a) @ right(b), rtol=1e-4, atol=1e-4)

def test_the_cpu_heuristic_tiles_a_matmul_whose_input_has_no_one_stride_along_the_reduce(tinyc_device):
  # attention's output with its heads put back in a row (a permute under a reshape: runs of the head dim), times the projection's
  # weight: no input is contiguous along the output or along the whole reduce. Found in examples/gpt.py's sampling, where it got no
  # Opt at all (489 us; a 16 x 4 tile: 44 us)
  (o, to), (w, tw) = realized(4, 64, 24, seed=3), realized(96, 96, seed=4)
  heads_in_a_row = to.permute(1, 0, 2).reshape(64, 96)
  out = heads_in_a_row @ tw.T
  kernel = Kernel(the_ast(out), KernelTarget())
  assert kernel.sts[1].real_strides()[-1] is None, "the premise: no one stride along the reduce"
  opts = hand_coded_optimizations(kernel)
  assert len(opts) == 2 and all(opt.op is OptOps.UPCAST for opt in opts), opts
  np.testing.assert_allclose(run_with_opts(out, opts), o.transpose(1, 0, 2).reshape(64, 96) @ w.T, rtol=1e-4, atol=1e-4)

# ---- 5. a long reduce into few outputs runs as two kernels ----

def test_sum_of_a_million_is_two_kernels(tinyc_device):
  x = np.random.default_rng(7).standard_normal(1 << 20).astype(np.float32)
  out = Tensor(x).sum()
  assert len(kernel_asts(out)) == 2
  np.testing.assert_allclose(out.numpy(), x.astype(np.float64).sum(), rtol=1e-5)

def test_multiply_fuses_into_the_first_half_of_a_split_sum(tinyc_device):
  (a, ta), (b, tb) = realized(1 << 20, seed=8), realized(1 << 20, seed=9)
  out = (ta * tb).sum()
  first, second = kernel_asts(out)
  assert any(node.op is BinaryOps.MUL for node in first.walk()) and not any(node.op is BinaryOps.MUL for node in second.walk())
  np.testing.assert_allclose(out.numpy(), (a.astype(np.float64) * b).sum(), rtol=1e-5)

def test_sum_over_axis_0_of_a_tall_array(tinyc_device):
  x, tx = realized(65536, 16, seed=10)
  out = tx.sum(0)
  assert len(kernel_asts(out)) == 2
  np.testing.assert_allclose(out.numpy(), x.astype(np.float64).sum(0), rtol=1e-5, atol=1e-4)

def test_max_of_a_million_is_two_kernels(tinyc_device):
  x, tx = realized(1 << 20, seed=11)
  out = tx.max()
  assert len(kernel_asts(out)) == 2
  assert out.numpy() == x.max()

def test_short_reduces_stay_one_kernel(tinyc_device):
  x, tx = realized(1000, seed=12)
  assert len(kernel_asts(tx.sum())) == 1 and len(kernel_asts(tx.max())) == 1
  np.testing.assert_allclose(tx.sum().numpy(), x.astype(np.float64).sum(), rtol=1e-5)
  assert tx.max().numpy() == x.max()

def test_a_split_takes_up_to_4096_parts_near_the_square_root():
  from tinyc.lazy import _reduce_split
  assert _reduce_split((64 << 20,), (0,)) == (0, 4096)  # measured best on the H200
  assert _reduce_split((1 << 20,), (0,)) == (0, 1024)
  assert _reduce_split((65536, 16), (0,)) == (0, 256)
  assert _reduce_split((128, 16, 24, 24), (0, 2, 3)) is None, "no dim is long enough to split"
  assert _reduce_split((1000003,), (0,)) is None, "a prime length has no parts to split into"
  assert _reduce_split((1000, 1000), (1,)) is None, "short rows are not split"

def test_heuristic_gives_each_row_of_a_softmax_a_work_group():
  kernel, ops = heuristic(Tensor.empty(8192, 8192).softmax(-1))
  assert kernel.stores_rows and ops[:2] == [OptOps.UNROLL, OptOps.GROUP] and kernel.local_size == 512, "about 16 elements a thread"
  assert not kernel.axes(R), "the 4 trips left of each walk are unrolled whole"
  kernel, ops = heuristic(Tensor.empty(65536, 512).softmax(-1))  # many rows still group: each thread reading its own row is uncoalesced
  assert kernel.stores_rows and OptOps.GROUP in ops and kernel.local_size == 32
