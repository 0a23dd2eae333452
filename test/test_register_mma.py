"""Tensor cores inside attention's kernels (TC on a kernel of nested contractions, codegen/register_mma.py): the layout TC makes, where
it is refused, CUDA source that NVRTC compiles to PTX with mma, shuffles and register transposes (so CI checks it without a GPU), and
16-bit attention forward and backward against torch on every device (on tensor cores where the device has them)."""
from __future__ import annotations
import numpy as np
import pytest
import torch
from tinyc import Device, Tensor
from tinyc.dtype import DType, dtypes
from tinyc.ops import BinaryOps, LoadOps
from tinyc.schedule import create_schedule
from tinyc.codegen.cstyle import render_cuda
from tinyc.codegen.heuristic import hand_coded_optimizations
from tinyc.codegen.kernel import GPU_MAX_UPCAST, AxisKind, Kernel, KernelOptError, KernelTarget, Opt, OptOps
from tinyc.codegen.linearizer import Linearizer
from tinyc.codegen.register_mma import computed_by_mma, mma_roles
from tinyc.codegen.uops import UOps

H200 = KernelTarget(has_local=True, max_upcast=GPU_MAX_UPCAST, tensor_cores=True, warp_shuffles=True, local_memory_bytes=227 * 1024,
                    compute_units=132)

def sdpa_kernels(dtype: DType, shape=(1, 2, 256, 64), mask: str | None = "causal") -> list[Kernel]:
  """The kernels of nested contractions of SDPA's forward and backward, as an H200 would get them: the forward, dq, and dk with dv."""
  q, k, v, g = (Tensor.empty(*shape, dtype=dtype) for _ in range(4))
  leaves = [Tensor(t.lazydata, requires_grad=True) for t in (q, k, v)]
  kwargs = {"is_causal": True} if mask == "causal" else {"attn_mask": Tensor.empty(shape[-2], shape[-2], dtype=dtype)} if mask else {}
  out = leaves[0].scaled_dot_product_attention(leaves[1], leaves[2], **kwargs)
  (out * g).sum().backward()
  items = [item for item in create_schedule([t.lazydata for t in (out, *[leaf.grad for leaf in leaves])]) if item.ast.op not in LoadOps]
  return [kernel for item in items if (kernel := Kernel(item.ast, H200)).nested_contractions()]

def test_tc_lays_a_warp_over_the_fragments_of_each_attention_kernel():
  """Rows (2 FRAGMENT x 8 WARP), keys (2 halves x 4 LANE x 2, unrolled), each head dim (16 TC) and the features (8 upcast n-tiles
  x 4 LANE x 2 FRAGMENT): one warp of 32 threads, the LANE index (lane % 4) the keys' quad and the features' alike."""
  kernels = sdpa_kernels(dtypes.bfloat16)
  assert [len(kernel.nested_contractions()) for kernel in kernels] == [1, 2, 2]  # the forward, dq, dk and dv
  for kernel in kernels:
    kernel.apply_opt(Opt(OptOps.TC, 0, 0))
    sizes = lambda kind: [kernel.full_shape[axis] for axis in kernel.axes(kind)]  # noqa: E731
    assert kernel.nested_tc and sizes(AxisKind.WARP) == [8] and sizes(AxisKind.FRAGMENT) == [2, 2] and sizes(AxisKind.UPCAST) == [8]
    assert sizes(AxisKind.TC) == [16] * len(kernel.nested_contractions()) and kernel.local_size == 32
    roles = mma_roles(kernel)
    assert sorted(bool(kernel.owners[axis]) for axis in kernel.axes(AxisKind.LANE)) == [False, True] and sizes(AxisKind.LANE) == [4, 4]
    assert roles.feature_quad is not None and not kernel.owners[roles.feature_quad] and kernel.owners[roles.key_quad]
    assert kernel.owners[roles.key_pair] == kernel.owners[roles.key_half] == kernel.owners[roles.key_quad]
    assert [kernel.full_shape[axis] for axis in (roles.row_pair, roles.key_pair, roles.key_half)] == [2, 2, 2]

@pytest.mark.parametrize("dtype,shape,target,opts,message", [
  (dtypes.float64, (1, 2, 256, 64), H200, [Opt(OptOps.TC, 0, 0)], "16-bit or float32 inputs"),
  (dtypes.bfloat16, (1, 2, 256, 40), H200, [Opt(OptOps.TC, 0, 0)], "multiples of 16"),
  (dtypes.bfloat16, (1, 2, 256, 64), KernelTarget(has_local=True, warp_shuffles=True), [Opt(OptOps.TC, 0, 0)], "no tensor cores"),
  (dtypes.bfloat16, (1, 2, 256, 64), H200, [Opt(OptOps.LANES, 0, 4), Opt(OptOps.TC, 0, 0)], "before every Opt"),
  (dtypes.bfloat16, (1, 2, 256, 64), H200, [Opt(OptOps.TC, 0, 2)], "axis 0 and amount 0"),
  # a group reduce's partials have a slot per LOCAL id and LANE index, which the warp's 8 rows would share
  (dtypes.bfloat16, (1, 2, 256, 64), H200, [Opt(OptOps.TC, 0, 0), Opt(OptOps.GROUP, 0, 2)], "tensor cores takes none"),
])
def test_tc_on_attention_is_refused_where_it_cannot_apply(dtype, shape, target, opts, message):
  for kernel in sdpa_kernels(dtype, shape):
    kernel = Kernel(kernel.ast, target)
    for opt in opts[:-1]: kernel.apply_opt(opt)
    before = (kernel.full_shape, kernel.kinds)
    with pytest.raises(KernelOptError, match=message): kernel.apply_opt(opts[-1])
    assert (kernel.full_shape, kernel.kinds, kernel.nested_tc) == before + (opts[0].op is OptOps.TC and len(opts) > 1,)

@pytest.mark.parametrize("dtype", [dtypes.bfloat16, dtypes.float16], ids=lambda dtype: dtype.name)
@pytest.mark.parametrize("mask", ["causal", None, "additive"])
def test_attention_kernels_on_tensor_cores_compile_to_ptx(dtype, mask):
  """The heuristic puts every 16-bit attention kernel on tensor cores: an mma a 16 x 8 tile of scores per 16 of the head dim and
  a 16 x 8 tile of outputs per 16 keys, the maxes of the keys' quads meeting by shuffles, and B's fragments of the values (strided
  along the keys) read a word of two features a lane and transposed in registers (movmatrix)."""
  try:
    from tinyc.runtime.nvrtc import compile_cuda, load_nvrtc
    load_nvrtc()
  except (ImportError, RuntimeError) as error: pytest.skip(f"NVRTC is not installed here ({error}); CI installs it")
  kind = {dtypes.bfloat16: "bf16", dtypes.float16: "f16"}[dtype]
  for number, kernel in enumerate(sdpa_kernels(dtype, mask=mask)):
    assert hand_coded_optimizations(kernel)[0] == Opt(OptOps.TC, 0, 0)
    kernel.limit_global_dims(3)
    uops = Linearizer(kernel, threads=True).linearize()
    # per 16 keys: the forward 2 score tiles x 4 steps of the head dim, then 8 tiles of outputs; dq two contractions and dq's 8
    # tiles; dk and dv two contractions and 8 tiles each
    assert sum(uop.op is UOps.WMMA for uop in uops) == [16, 24, 32][number]
    assert sum(uop.op is UOps.TRANSPOSE for uop in uops) == [16, 16, 32][number]
    assert (sum(uop.op is UOps.SHUFFLE for uop in uops) > 0) == (number == 0)  # the forward's max and sum meet across the quads
    # every operand the mmas load is read 16 bytes a load (a thread's elements of a row side by side)
    def loads(uop):
      if uop.op is UOps.LOAD: return [uop]
      return [load for src in uop.src for load in loads(src)] if uop.op in (UOps.GEP, UOps.TRANSPOSE) else []
    read = [load for uop in uops if uop.op is UOps.WMMA for src in uop.src[:6] for load in loads(src)]
    assert read and {load.dtype.itemsize for load in read} == {16}
    ptx = compile_cuda(kernel.name, render_cuda(kernel.name, uops), "sm_90", "ptx").decode()
    assert f"mma.sync.aligned.m16n8k16.row.col.f32.{kind}.{kind}.f32" in ptx and "movmatrix.sync.aligned.m8n8.trans.b16" in ptx
    assert f"cvt.rn.{kind}x2.f32" in ptx  # the probabilities (or their gradients) packed two a word by one instruction

@pytest.mark.parametrize("extra", [[Opt(OptOps.UNROLL, 0, 2), Opt(OptOps.LOCAL, 1, 2)], [Opt(OptOps.UPCAST, 1, 2)]], ids=["keys_by_2", "rows_by_2"])
def test_other_plans_on_tensor_cores_compile_to_ptx(extra):
  """Plans BEAM may reach from the heuristic's: 32 keys a trip (the values' mma takes two steps of K) on 2 warps, or two 16-row tiles
  a warp (A's fragments read for each): one mma per tile and step, every one in the PTX."""
  try:
    from tinyc.runtime.nvrtc import compile_cuda, load_nvrtc
    load_nvrtc()
  except (ImportError, RuntimeError) as error: pytest.skip(f"NVRTC is not installed here ({error}); CI installs it")
  for number, kernel in enumerate(sdpa_kernels(dtypes.bfloat16)):
    for opt in [Opt(OptOps.TC, 0, 0)] + extra: kernel.apply_opt(opt)
    kernel.limit_global_dims(3)
    uops = Linearizer(kernel, threads=True).linearize()
    # a trip (the head dims' steps looped): 2 x 2 score tiles a contraction, 2 x 8 output tiles a sum of values: the forward 4 + 16,
    # dq 4 + 4 + 16, dk and dv 4 + 4 + 16 + 16
    assert sum(uop.op is UOps.WMMA for uop in uops) == [20, 24, 40][number]
    assert "mma.sync.aligned.m16n8k16" in compile_cuda(kernel.name, render_cuda(kernel.name, uops), "sm_90", "ptx").decode()

def mlp_weight_gradient_kernel(x_shape=(64, 32), hidden=96, features=24) -> Kernel:
  """The kernel of an MLP's second weight gradient under a sum's upstream of ones: gelu(x w1 + b1) summed over the tokens, x w1
  nested (rule 10). The reduce's product is gelu's own (0.5 (h + b) times 1 + tanh(...)), expanded along the features by its constants."""
  x, w1, b1, w2 = (Tensor.empty(*shape) for shape in (x_shape, (x_shape[1], hidden), (hidden,), (hidden, features)))
  leaves = [Tensor(t.lazydata, requires_grad=True) for t in (w1, b1, w2)]
  ((x @ leaves[0] + leaves[1]).gelu() @ leaves[2]).sum().backward()
  return next(kernel for item in create_schedule([leaves[2].grad.lazydata]) if item.ast.op not in LoadOps
              and (kernel := Kernel(item.ast, H200)).nested_contractions())

def test_a_product_whose_factors_both_span_the_rows_is_no_mma(monkeypatch):
  """A sum over the keys whose value is one along the features (only its constants are expanded there) is added lane by lane, not by
  an mma: neither of gelu's factors is B (broadcast along the rows). The bug: the mma read one factor as B, each thread's own row
  for every feature (wrong weight gradients, float32 on the H200)."""
  monkeypatch.setattr(Device[Device.DEFAULT], "target", H200)  # the GPU's schedule: x w1 nested
  kernel = mlp_weight_gradient_kernel()
  kernel.apply_opt(Opt(OptOps.TC, 0, 0))
  assert [computed_by_mma(kernel, reduceop) for reduceop in kernel.reduceops] == [True, False]
  uops = Linearizer(kernel, threads=True).linearize()
  assert sum(uop.op is UOps.WMMA for uop in uops) == 2 * 2 * 3  # x w1 only, a 16-step of its loop: 2 tiles of 8 keys x 2 TF32 steps x 3

def _mma_loads(uop):
  """The loads an mma's register is made of: through vector lanes, register transposes and the 3xTF32 split's bit operations."""
  if uop.op is UOps.LOAD: return [uop]
  splits = uop.op is UOps.ALU and uop.arg in (BinaryOps.ADD, BinaryOps.SUB, BinaryOps.AND)
  return [load for src in uop.src for load in _mma_loads(src)] if uop.op in (UOps.GEP, UOps.TRANSPOSE, UOps.BITCAST) or splits else []

@pytest.mark.parametrize("mask", ["causal", None, "additive"])
def test_float32_attention_on_tensor_cores_is_3xtf32(mask):
  """The heuristic puts float32 attention on tensor cores too, as 3xTF32 (as torch's memory-efficient kernel does): each value split
  into a TF32 part and the TF32 of what remains, and big x big + big x small + small x big added by three mma m16n8k8 a step of 8
  (two a 16-bit step), so the products keep about 21 of float32's 24 bits. B's fragments of the values (strided along the keys) are
  read 16 bytes a load too: a thread's features of the n-tiles lie side by side (the features split quad, pair, tiles)."""
  try:
    from tinyc.runtime.nvrtc import compile_cuda, load_nvrtc
    load_nvrtc()
  except (ImportError, RuntimeError) as error: pytest.skip(f"NVRTC is not installed here ({error}); CI installs it")
  for number, kernel in enumerate(sdpa_kernels(dtypes.float32, mask=mask)):
    assert hand_coded_optimizations(kernel)[0] == Opt(OptOps.TC, 0, 0)
    kernel.limit_global_dims(3)
    uops = Linearizer(kernel, threads=True).linearize()
    # the 16-bit plan's mmas (above), each in two TF32 steps of three mmas
    assert sum(uop.op is UOps.WMMA for uop in uops) == [16, 24, 32][number] * 2 * 3 and not any(uop.op is UOps.TRANSPOSE for uop in uops)
    read = [load for uop in uops if uop.op is UOps.WMMA for src in uop.src[:6] for load in _mma_loads(src)]
    assert read and {load.dtype.itemsize for load in read} == {16}
    ptx = compile_cuda(kernel.name, render_cuda(kernel.name, uops), "sm_90", "ptx").decode()
    assert "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in ptx

def test_each_16_row_tile_of_a_warp_multiplies_its_own_probabilities():
  """Two 16-row tiles a warp (rows upcast by 2): the values' mma of each tile takes that tile's probabilities as A. The bug: the row
  tiles counted among the n-tiles of the features (an axis no reduce owns), so A was parsed once, at tile 0, for both (a plan BEAM
  reaches)."""
  kernel = sdpa_kernels(dtypes.bfloat16)[0]
  for opt in (Opt(OptOps.TC, 0, 0), Opt(OptOps.UPCAST, 1, 2)): kernel.apply_opt(opt)
  kernel.limit_global_dims(3)
  wmmas = [uop for uop in Linearizer(kernel, threads=True).linearize() if uop.op is UOps.WMMA]
  # A of the scores: the query rows of 2 row tiles (a step of the head dim a trip of its loop); of the values: their probabilities
  assert len({uop.src[:4] for uop in wmmas}) == 2 + 2

def arrays(shape, seed=0):
  return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)

@pytest.mark.parametrize("dtype,shape,mask", [(dtypes.bfloat16, (1, 2, 256, 64), "causal"), (dtypes.float16, (2, 1, 256, 32), "additive"),
                                              (dtypes.bfloat16, (1, 1, 256, 128), None)])
def test_16_bit_attention_matches_torch_on_tensor_cores(dtype, shape, mask, tinyc_device):
  """16-bit SDPA forward and backward against torch's float32 of the same 16-bit inputs, within the 16-bit rounding of the
  probabilities (2^-8 of bfloat16, 2^-11 of float16, times a few); where the device has tensor cores, every kernel of nested
  contractions runs there."""
  torch_dtype = {dtypes.bfloat16: torch.bfloat16, dtypes.float16: torch.float16}[dtype]
  q, k, v, g = (torch.tensor(arrays(shape, seed)).to(torch_dtype) for seed in range(4))
  bias = torch.tensor(arrays((shape[-2], shape[-2]), 4)).to(torch_dtype) if mask == "additive" else None
  leaves = [Tensor(t.float().numpy()).cast(dtype).realize() for t in (q, k, v)]
  leaves = [Tensor(t.lazydata, requires_grad=True) for t in leaves]
  kwargs = {"is_causal": True} if mask == "causal" else {"attn_mask": Tensor(bias.float().numpy()).cast(dtype)} if mask else {}
  out = leaves[0].scaled_dot_product_attention(leaves[1], leaves[2], **kwargs)
  (out * Tensor(g.float().numpy()).cast(dtype)).sum().backward()
  if Device[Device.DEFAULT].target.tensor_cores:
    items = [item for item in create_schedule([t.lazydata for t in (out, *[leaf.grad for leaf in leaves])]) if item.ast.op not in LoadOps]
    kernels = [kernel for item in items if (kernel := Kernel(item.ast, Device[Device.DEFAULT].target)).nested_contractions()]
    assert kernels and all(hand_coded_optimizations(kernel)[0].op is OptOps.TC for kernel in kernels)
  rq, rk, rv = (t.float().requires_grad_() for t in (q, k, v))
  torch_kwargs = {"is_causal": True} if mask == "causal" else {"attn_mask": bias.float()} if mask else {}
  reference = torch.nn.functional.scaled_dot_product_attention(rq, rk, rv, **torch_kwargs)
  (reference * g.float()).sum().backward()
  tolerance = {dtypes.bfloat16: 3e-2, dtypes.float16: 5e-3}[dtype]
  for got, want in zip((out, *[leaf.grad for leaf in leaves]), (reference, rq.grad, rk.grad, rv.grad)):
    want = want.detach().numpy()
    np.testing.assert_allclose(got.float().numpy(), want, atol=tolerance * np.abs(want).max(), rtol=0)
