"""Attention as the compiler's own fused kernels: softmax(q k^T) v is one kernel that computes its scores in the loop over the keys
(schedule rule 10) with the max and the sums in one pass (online softmax, codegen/online.py), and scaled_dot_product_attention's
backward recomputes the probabilities in each gradient's kernel. No kernel stores a matrix of scores. Checked against torch."""
from __future__ import annotations
import numpy as np
import pytest
import torch
from tinyc import Device, Tensor, GlobalCounters
from tinyc.dtype import dtypes
from tinyc.helpers import prod
from tinyc.ops import BinaryOps, LoadOps, ReduceOps, UnaryOps
from tinyc.schedule import create_schedule
from tinyc.codegen.heuristic import hand_coded_optimizations
from tinyc.codegen.nested_plan import lanes_plan
from tinyc.codegen.axes import CPU_MAX_UPCAST
from tinyc.codegen.kernel import AxisKind, GPU_MAX_UPCAST, Kernel, KernelOptError, KernelTarget, Opt, OptOps
from tinyc.codegen.linearizer import Linearizer
from tinyc.codegen.llvmir import render_llvm
from tinyc.codegen.uops import UOps
from test_kernel_model import attention as attention_kernel, run as run_kernel

def arrays(*shapes, seed=0):
  rng = np.random.default_rng(seed)
  return [rng.standard_normal(shape).astype(np.float32) for shape in shapes]

def check_sdpa_against_torch(shape, seed, causal):
  """SDPA's output and its three gradients (of the sum of the output times a random tensor) against torch's, in float32."""
  arrays_ = arrays(*[shape] * 4, seed=seed)
  leaves = [Tensor(a, requires_grad=True) for a in arrays_[:3]]
  out = leaves[0].scaled_dot_product_attention(leaves[1], leaves[2], is_causal=causal)
  (out * Tensor(arrays_[3])).sum().backward()
  reference = [torch.tensor(a, requires_grad=True) for a in arrays_[:3]]
  want = torch.nn.functional.scaled_dot_product_attention(*reference, is_causal=causal)
  (want * torch.tensor(arrays_[3])).sum().backward()
  for got, expected in zip([out] + [leaf.grad for leaf in leaves], [want] + [r.grad for r in reference]):
    np.testing.assert_allclose(got.numpy(), expected.detach().numpy(), rtol=1e-3, atol=1e-4)

def items_of(*tensors):
  return [item for item in create_schedule([t.lazydata for t in tensors]) if item.ast.op not in LoadOps]

@pytest.mark.parametrize("mask", ["causal", "additive", None])
def test_the_forwards_kernel_stores_the_log_sum_exp_for_the_backward(mask, tinyc_device):
  """Rule 11: the backward's log-sum-exp (the max and sum of each query's scores) is stored by the forward's kernel, whose online
  softmax computes the same max and sum, not by a kernel of its own that computes every score again; the gradients match torch."""
  q, k, v, g = arrays(*[(2, 2, 24, 16)] * 4)
  keep = np.random.default_rng(1).normal(size=(24, 24)).astype(np.float32)
  tq, tk, tv = (Tensor(a, requires_grad=True) for a in (q, k, v))
  out = tq.scaled_dot_product_attention(tk, tv, attn_mask=Tensor(keep) if mask == "additive" else None, is_causal=mask == "causal")
  (out * Tensor(g)).sum().backward()
  items = items_of(out, tq.grad, tk.grad, tv.grad)
  nested = [item for item in items if sum(op.op in ReduceOps for op in item.ast.walk()) > 1]
  assert len(nested) == 3  # the output with its log-sum-exp, dq, and dk with dv (which share their scores)
  (forward,) = [item for item in nested if out.lazydata.base in item.outs]
  assert len(forward.outs) > 1 and all(other.shape[-1] == 1 for other in forward.outs if other is not out.lazydata.base)
  assert sorted(len(item.outs) for item in nested) == [1, 2, len(forward.outs)]
  rq, rk, rv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
  reference = torch.nn.functional.scaled_dot_product_attention(rq, rk, rv, attn_mask=torch.tensor(keep) if mask == "additive" else None,
                                                               is_causal=mask == "causal")
  (reference * torch.tensor(g)).sum().backward()
  np.testing.assert_allclose(out.numpy(), reference.detach().numpy(), rtol=1e-4, atol=1e-5)
  for got, want in zip((tq.grad, tk.grad, tv.grad), (rq.grad, rk.grad, rv.grad)):
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-3, atol=1e-4)

def test_softmax_of_scores_times_values_is_one_kernel(tinyc_device):
  q, k, v = arrays((2, 3, 40, 16), (2, 3, 56, 16), (2, 3, 56, 24))
  out = (Tensor(q) @ Tensor(k).transpose(-2, -1) * 0.25).softmax(-1) @ Tensor(v)
  (item,) = items_of(out)
  assert item.outs == (out.lazydata.base,)
  GlobalCounters.reset()
  got = out.numpy()
  assert GlobalCounters.kernel_count == 1
  expected = torch.softmax(torch.tensor(q) @ torch.tensor(k).transpose(-2, -1) * 0.25, -1) @ torch.tensor(v)
  np.testing.assert_allclose(got, expected.numpy(), rtol=1e-4, atol=1e-5)

def test_scores_of_a_long_contraction_are_stored():
  """Rule 10 nests a contraction of at most 128 products an element: a longer one is a matmul kernel of its own."""
  q, k, v = arrays((40, 256), (56, 256), (56, 24))
  out = (Tensor(q) @ Tensor(k).T).softmax(-1) @ Tensor(v)
  assert any(base.shape == (40, 56, 1) for item in items_of(out) for base in item.outs)

def test_a_reduce_that_is_not_a_contraction_is_not_nested_with_loops_of_its_own():
  x, = arrays((8, 16))
  out = (Tensor(x) - Tensor(x).max(1, keepdim=True)).sum(0)
  assert len(items_of(out)) == 2

def test_a_contraction_that_several_kernels_reach_is_stored_once():
  """Rule 10 nests a contraction with loops of its own in the one kernel that reads it. An MLP's hidden layer (x w1) and its
  gradient (g w2^T), which several of the backward's kernels reach (through the bias add, the activation's derivative), are each
  stored once, not computed again in each of them; alone, the forward still computes the hidden layer in the second matmul's loop."""
  x, w1, b1, w2 = arrays((64, 32), (32, 96), (96,), (96, 24))
  params = [Tensor(a, requires_grad=True) for a in (w1, b1, w2)]
  ((Tensor(x) @ params[0] + params[1]).gelu() @ params[2]).sum().backward()
  items = items_of(*[p.grad for p in params])
  stored = [base for item in items for base in item.outs if prod(base.shape) == 64 * 96]
  assert sum(base.op is ReduceOps.SUM for base in stored) == 2, [(base.op, base.shape) for base in stored]
  # and then rule 2 holds: the activation and its derivative (exp) are stored, not computed again for each weight gradient's output
  assert not any(UnaryOps.EXP2 in [op.op for op in item.ast.walk()] for item in items if len(item.outs[0].shape) == 3), items
  torch_params = [torch.tensor(a, requires_grad=True) for a in (w1, b1, w2)]
  hidden = torch.nn.functional.gelu(torch.tensor(x) @ torch_params[0] + torch_params[1], approximate="tanh")
  (hidden @ torch_params[2]).sum().backward()
  for ours, theirs in zip(params, torch_params): np.testing.assert_allclose(ours.grad.numpy(), theirs.grad.numpy(), rtol=1e-4, atol=1e-4)
  assert len(items_of((Tensor(x) @ Tensor(w1) + Tensor(b1)).relu() @ Tensor(w2))) == 1

def test_online_softmax_walks_the_keys_once():
  """The max, the softmax's sum and the values' sum over the keys run in one loop (each computing the scores again would be three)."""
  ast, _, _ = attention_kernel(rows=12, keys=20)
  uops = Linearizer(Kernel(ast)).linearize()
  assert sum(1 for uop in uops if uop.op is UOps.LOOP and uop.src[1].arg == 20) == 1

@pytest.mark.parametrize("dtype", ["float32", "bfloat16", "float16"])
def test_sdpa_forward_walks_its_keys_once_in_every_dtype(dtype):
  """scaled_dot_product_attention's output kernel is online softmax in 16-bit dtypes too, where the scores, the probabilities and
  the softmax's sum are rounded to 16 bits between the ops (casts around the exp and the division): bfloat16 had walked the keys
  three times, computing every score in each walk."""
  q, k, v = (Tensor(a).cast(getattr(dtypes, dtype)).realize() for a in arrays(*[(1, 2, 48, 16)] * 3))
  (item,) = items_of(out := q.scaled_dot_product_attention(k, v, is_causal=True))
  uops = Linearizer(Kernel(item.ast)).linearize()
  assert sum(1 for uop in uops if uop.op is UOps.LOOP and uop.arg.name.startswith("ridx") and uop.arg.trips == 48) == 1
  expected = torch.nn.functional.scaled_dot_product_attention(*(torch.tensor(t.float().numpy()) for t in (q, k, v)), is_causal=True)
  np.testing.assert_allclose(out.float().numpy(), expected.numpy(), rtol=2e-2, atol=2e-2)

@pytest.mark.parametrize("target", ["cpu", "gpu"])
def test_the_heuristic_computes_each_score_once_for_every_feature(target, tinyc_device):
  """The attention kernel's features (which the scores do not vary along) are upcast whole (on a CPU, where their count is not a power
  of two, a vector register's lanes of them first), so each score is computed once for all of them; a CPU upcasts the queries by 4
  (each key's loads serve 4). A GPU gives float32 features up to NESTED_PAIR to 2 threads, half each, and upcasts the queries by 2 (each
  key's loads serve a pair; each score is computed by both threads), unrolls the head dim whole, splits the keys between 2 threads (the
  max and the sums run in one loop) and gives the queries to 64 threads in all. Each plan still computes the kernel's values."""
  ast, inputs, expected = attention_kernel(rows=256, keys=20, width=64, features=16)
  device_target = KernelTarget(has_local=True, max_upcast=GPU_MAX_UPCAST) if target == "gpu" else KernelTarget(max_upcast=256)
  kernel = Kernel(ast, device_target)
  opts = hand_coded_optimizations(kernel)
  if target == "cpu":
    assert opts == [Opt(OptOps.UPCAST, 1, 0), Opt(OptOps.UPCAST, 0, 4)] and kernel.full_shape[kernel.axes(AxisKind.UPCAST)[0]] == 16
    ast80, _, _ = attention_kernel(rows=256, keys=20, width=64, features=80)  # 80 features: a vector register's 8 lanes, then 10 of them
    assert hand_coded_optimizations(Kernel(ast80, device_target))[:2] == [Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.UPCAST, 1, 0)]
  else: assert opts == [Opt(OptOps.UPCAST, 1, 8), Opt(OptOps.LOCAL, 1, 0), Opt(OptOps.UNROLL, 1, 0), Opt(OptOps.UPCAST, 0, 2),
                        Opt(OptOps.GROUP, 0, 2), Opt(OptOps.LOCAL, 0, 16)]
  for got, want in zip(run_kernel(ast, inputs, expected, None), expected): np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)

@pytest.mark.parametrize("features, queries", [(1, 8), (16, 4), (32, 4)])
def test_a_cpu_upcasts_the_queries_by_8_where_no_features_are_upcast(features, queries, tinyc_device):
  """A nested kernel without features to upcast (the log-sum-exp, here one feature) upcasts the queries by 8 on a CPU, one with
  features by 4: each key's loads serve 8 queries where no features' accumulators multiply with them."""
  ast, inputs, expected = attention_kernel(rows=64, keys=20, width=32, features=features)
  opts = hand_coded_optimizations(Kernel(ast, KernelTarget(max_upcast=256)))
  assert opts[-1] == Opt(OptOps.UPCAST, 0, queries), opts
  for got, want in zip(run_kernel(ast, inputs, expected, tuple(opts)), expected): np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)

@pytest.mark.parametrize("head_dim, opts", [(32, [Opt(OptOps.UPCAST, 2, 0), Opt(OptOps.UPCAST, 1, 4), Opt(OptOps.UPCAST, 0, 2)]),
                                             (64, [Opt(OptOps.UPCAST, 2, 0), Opt(OptOps.UPCAST, 1, 4)])])
def test_a_cpu_upcasts_the_heads_by_2_where_a_keys_scores_are_few_products(head_dim, opts, tinyc_device):
  """4 queries x a head dim of 32 are 128 products of a key's scores, under NESTED_CPU_PRODUCTS: the heads (the outer row axis) are
  upcast by 2 too, so a key's exp, max and rescaling run as 8 independent chains (the CPU GPT bench's attention 20.7-21.0 -> 16.7-17.5
  ms, its step 103-107 -> 93-94); at 64, 4 queries are enough. The result still matches torch (37 queries take no upcast at all)."""
  q, k, v = (Tensor.empty(2, 4, 64, head_dim) for _ in range(3))
  (item,) = items_of(q.scaled_dot_product_attention(k, v, is_causal=True))
  assert hand_coded_optimizations(Kernel(item.ast, KernelTarget(max_upcast=256))) == opts
  check_sdpa_against_torch((2, 2, 37, head_dim), seed=head_dim, causal=True)

@pytest.mark.parametrize("mask", ["causal", "none"])
def test_a_cpus_online_sums_accumulate_the_features_as_vectors(mask, tinyc_device):
  """On a CPU the forward's output sum, rescaled as the max grows (online softmax), keeps each row's features in one vector
  accumulator, as a plain reduce's packed lanes (packing.py): rescaling and adding a key's values are vector ops, where they were
  a scalar op per feature (the CPU GPT bench's forward 4.2 -> 3.8 ms). Forward and backward against torch, 40 queries, head dim 32."""
  q, k, v = (Tensor.empty(2, 4, 64, 32) for _ in range(3))
  (item,) = items_of(q.scaled_dot_product_attention(k, v, is_causal=mask == "causal"))
  kernel = Kernel(item.ast, KernelTarget(max_upcast=256))
  hand_coded_optimizations(kernel)
  widths = [uop.dtype.count for uop in Linearizer(kernel).linearize() if uop.op is UOps.DEFINE_ACC]
  assert widths.count(32) == 8 and set(widths) == {1, 32}, widths  # 2 heads x 4 queries, a vector of 32 features each
  check_sdpa_against_torch((1, 3, 40, 32), seed=7, causal=mask == "causal")

@pytest.mark.parametrize("queries, lanes", [(48, True), (40, False)])
def test_a_cpus_attention_puts_a_vector_of_queries_in_the_lanes(queries, lanes, tinyc_device):
  """On a CPU attention's kernels (nested contractions) upcast the queries (dk's and dv's keys) by a vector register's lanes and
  unroll the head dims whole: every reduce packs along those rows, so each accumulator (a key's scores, the running max and sums of
  online softmax, the probabilities' gradients, dq's features) is a vector of 16 rows (nested_plan.rows_in_lanes). 40 rows do not
  divide by 16: the plan before (padded, such rows ran slower than that). The forward, whose online softmax rescales its sums once a
  trip over the keys, unrolls them by 8, the backward's kernels by 4. Each backward kernel's loop reads every element it broadcasts
  with a load of its own for each product (volatile: LLVM would keep one in a register between the scores and the gradient, and
  spill it), and its rows (loop-invariant) before the loop. A stored row's values (the output over its sum, dk times the scale) are
  vector ops on the rows' lanes. Forward and backward against torch."""
  target = KernelTarget(vector_lanes=16, max_upcast=CPU_MAX_UPCAST)
  q, k, v, upstream = (Tensor.empty(1, 3, queries, 32) for _ in range(4))
  leaves = [Tensor(t.lazydata, requires_grad=True) for t in (q, k, v)]
  (leaves[0].scaled_dot_product_attention(leaves[1], leaves[2], is_causal=True) * upstream).sum().backward()
  kernels = [Kernel(item.ast, target) for item in items_of(*[leaf.grad for leaf in leaves])]
  nested = [kernel for kernel in kernels if kernel.nested_contractions()]
  assert len(nested) == 4 and sum(any(r.op is ReduceOps.MAX for r in kernel.reduceops) for kernel in nested) == 1  # fwd; dq, dk, dv
  for kernel in nested:
    opts = hand_coded_optimizations(kernel)
    assert (Opt(OptOps.UPCAST, 1, 16) in opts) == lanes, opts
    widths = {uop.dtype.count for uop in Linearizer(kernel).linearize() if uop.op is UOps.DEFINE_ACC}
    if lanes: assert widths == {16}, (kernel.name, widths)
    forward = any(r.op is ReduceOps.MAX for r in kernel.reduceops)
    looped = bool(kernel.axes(AxisKind.REDUCE))  # (the forward's, dq's, dk's and dv's: the keys or queries after the head dims)
    if lanes and looped: assert opts[-1] == Opt(OptOps.UNROLL, 0, 8 if forward else 4), (kernel.name, opts)
    # each score (and dO.v) over the head dim of 32 adds up in 4 independent chains, each fenced against LLVM's reassociation
    uops = Linearizer(kernel).linearize()
    volatile = [uop for uop in uops if uop.op is UOps.LOAD and uop.arg == "volatile"]
    if lanes and len(kernel.nested_contractions()) == 2:  # dq (4 keys a trip: a key's 32 elements thrice), dk and dv (4 times)
      assert len(volatile) >= 4 * 3 * 32 and "load volatile" in render_llvm("k", uops), len(volatile)
      loop = next(uop for uop in uops if uop.op is UOps.LOOP and uop.arg.name.startswith("ridx"))
      gathered = {src for uop in uops if uop.op is UOps.VECTORIZE and len(set(uop.src)) > 1 for src in uop.src if src.op is UOps.LOAD}
      assert gathered and all(uops.index(load) < uops.index(loop) for load in gathered), kernel.name
    scalar = [uop for uop in uops if uop.op is UOps.ALU and uop.arg in (BinaryOps.MUL, BinaryOps.DIV) and uop.dtype == dtypes.float32]
    if lanes: assert not scalar, (kernel.name, len(scalar))
    fences = [uop for uop in uops if uop.op is UOps.CAST and uop.src[0].dtype == uop.dtype]
    if lanes: assert len(fences) >= 4 * len(kernel.nested_contractions()) and "llvm.arithmetic.fence" in render_llvm("k", uops), len(fences)
  check_sdpa_against_torch((1, 3, queries, 32), seed=queries, causal=True)

def test_a_reduce_nested_in_anothers_loop_counts_its_own_lanes(tinyc_device):
  """The upcast limit counts the lanes of the widest place in the code: the scores, computed in the loop over the keys, are made once
  per lane of the head dim they unroll, not once per feature too, so the head dim unrolled whole beside 64 features upcast is 64
  lanes (the limit had counted 64 x 64 and refused it)."""
  ast, inputs, expected = attention_kernel(rows=32, keys=20, width=64, features=64)
  kernel = Kernel(ast, KernelTarget(has_local=True, max_upcast=GPU_MAX_UPCAST))
  for opt in (Opt(OptOps.UPCAST, 1, 0), Opt(OptOps.UNROLL, 1, 0)): kernel.apply_opt(opt)
  assert kernel.upcast_size == 64
  for got, want in zip(run_kernel(ast, inputs, expected, tuple(kernel.applied_opts)), expected):
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)

@pytest.mark.parametrize("dtype,width,lanes", [("bfloat16", 64, [[64]] + [[64, 64]] * 2), ("float32", 64, [[64]] + [[4, 4]] * 2),
                                               ("float32", 128, [[128]] + [[128, 128]] * 2), ("bfloat16", 128, [[128]] + [[128, 128]] * 2)])
def test_a_gpu_unrolls_a_head_dim_whole_where_no_compiler_would(dtype, width, lanes):
  """A GPU unrolls the head dim whole in each nested reduce of the attention kernels (up to NESTED_ROW), so the query's row is read
  once a thread, into registers, not once a key: except a float32 row of 8 loop trips, which ptxas unrolls and hoists itself, where
  the kernel does not pair queries (NESTED_PAIR: the output). The output (which stores the log-sum-exp too, rule 11), then dq and
  dk with dv (two nested reduces: otherwise by 4 each)."""
  q, k, v, g = (Tensor(a).cast(getattr(dtypes, dtype)).realize() for a in arrays(*[(1, 2, 256, width)] * 4))
  tq, tk, tv = (Tensor(t.lazydata, requires_grad=True) for t in (q, k, v))
  out = tq.scaled_dot_product_attention(tk, tv, is_causal=True)
  (out * g).sum().backward()
  nested = [item.ast for item in items_of(out, tq.grad, tk.grad, tv.grad) if sum(op.op in ReduceOps for op in item.ast.walk()) > 1]
  unrolled = []
  for ast in nested:
    kernel = Kernel(ast, KernelTarget(has_local=True, max_upcast=GPU_MAX_UPCAST, compute_units=132))
    hand_coded_optimizations(kernel)
    unrolled.append(sorted(kernel.full_shape[axis] for axis in kernel.axes(AxisKind.UNROLL)))
  assert sorted(unrolled) == sorted(lanes), unrolled

def test_a_gpu_pairs_the_features_axis_wherever_it_is_in_the_layout(tinyc_device):
  """The query pair splits the features (the axis the scores do not vary along) between 2 threads also where the features come before
  the queries in the kernel's layout, and the plan computes the kernel's values."""
  ast, inputs, expected = attention_kernel(rows=256, keys=20, width=64, features=16, features_first=True)
  kernel = Kernel(ast, KernelTarget(has_local=True, max_upcast=GPU_MAX_UPCAST))
  opts = hand_coded_optimizations(kernel)
  assert opts[:2] == [Opt(OptOps.UPCAST, 0, 8), Opt(OptOps.LOCAL, 0, 0)], opts
  if Device[Device.DEFAULT].target.has_local:
    for got, want in zip(run_kernel(ast, inputs, expected, tuple(opts)), expected): np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)

@pytest.mark.parametrize("width", [64, 128])
def test_bfloat16_attention_forward_and_backward_match_torch(width, tinyc_device):
  """bfloat16 causal attention, whose kernels a GPU plans with the head dim unrolled whole, against torch's float32 of the same inputs."""
  q, k, v, g = (torch.tensor(a).bfloat16() for a in arrays(*[(1, 2, 40, width)] * 4))
  tq, tk, tv = (Tensor(t.float().numpy()).cast(dtypes.bfloat16).realize() for t in (q, k, v))
  tq, tk, tv = (Tensor(t.lazydata, requires_grad=True) for t in (tq, tk, tv))
  out = tq.scaled_dot_product_attention(tk, tv, is_causal=True)
  (out * Tensor(g.float().numpy()).cast(dtypes.bfloat16)).sum().backward()
  rq, rk, rv = (t.float().requires_grad_() for t in (q, k, v))
  reference = torch.nn.functional.scaled_dot_product_attention(rq, rk, rv, is_causal=True)
  (reference * g.float()).sum().backward()
  for got, want in zip((out, tq.grad, tk.grad, tv.grad), (reference, rq.grad, rk.grad, rv.grad)):
    np.testing.assert_allclose(got.float().numpy(), want.detach().numpy(), rtol=5e-2, atol=5e-2)

CASES = {  # q, k, v shapes, mask kind
  "plain": ((2, 3, 17, 8), (2, 3, 23, 8), (2, 3, 23, 8), None),
  "causal": ((2, 2, 33, 16), (2, 2, 33, 16), (2, 2, 33, 16), "causal"),
  "causal_rectangular": ((1, 2, 9, 8), (1, 2, 14, 8), (1, 2, 14, 4), "causal"),
  "bool_mask": ((2, 2, 12, 8), (2, 2, 15, 8), (2, 2, 15, 8), "bool"),
  "float_mask": ((2, 2, 12, 8), (2, 2, 15, 8), (2, 2, 15, 8), "float"),
  "head_dim_128": ((1, 2, 24, 128), (1, 2, 24, 128), (1, 2, 24, 128), "causal"),
  "tril_mask": ((1, 2, 20, 8), (1, 2, 26, 8), (1, 2, 26, 8), 3),  # index-math masks: keys up to 3 past the diagonal, or from 4 before it
  "triu_mask": ((1, 2, 20, 8), (1, 2, 26, 8), (1, 2, 26, 8), -4),
  "three_dims": ((3, 10, 32), (3, 19, 32), (3, 19, 16), None),
}

@pytest.mark.parametrize("name", CASES)
def test_attention_forward_and_backward_match_torch(name, tinyc_device):
  q_shape, k_shape, v_shape, mask = CASES[name]
  q, k, v, g = arrays(q_shape, k_shape, v_shape, q_shape[:-1] + v_shape[-1:], seed=len(name))
  kwargs, torch_kwargs, masks = {}, {}, []
  if mask == "causal": kwargs = torch_kwargs = {"is_causal": True}
  elif mask == "bool":
    keep = np.random.default_rng(1).random((q_shape[-2], k_shape[-2])) < 0.6
    keep[:, 0] = True  # no row masked out entirely (0/0 in torch too)
    kwargs, torch_kwargs = {"attn_mask": Tensor(keep)}, {"attn_mask": torch.tensor(keep)}
  elif isinstance(mask, int):
    band = (lambda t: t.tril(mask)) if mask >= 0 else (lambda t: t.triu(mask))
    kwargs = {"attn_mask": band(Tensor.ones(q_shape[-2], k_shape[-2])).cast(dtypes.bool)}
    torch_kwargs = {"attn_mask": band(torch.ones(q_shape[-2], k_shape[-2])).bool()}
  elif mask == "float":
    bias, = arrays((q_shape[-2], k_shape[-2]), seed=3)
    masks = [Tensor(bias, requires_grad=True), torch.tensor(bias, requires_grad=True)]
    kwargs, torch_kwargs = {"attn_mask": masks[0]}, {"attn_mask": masks[1]}
  tq, tk, tv = (Tensor(a, requires_grad=True) for a in (q, k, v))
  out = tq.scaled_dot_product_attention(tk, tv, **kwargs)
  (out * Tensor(g)).sum().backward()
  grads = [tq.grad, tk.grad, tv.grad] + ([masks[0].grad] if masks else [])
  scores = tuple(size for size in q_shape[:-1] + k_shape[-2:-1] if size != 1)
  assert all(tuple(size for size in base.shape if size != 1) != scores for item in items_of(out, *grads) for base in item.outs)
  rq, rk, rv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
  reference = torch.nn.functional.scaled_dot_product_attention(rq, rk, rv, **torch_kwargs)
  (reference * torch.tensor(g)).sum().backward()
  np.testing.assert_allclose(out.numpy(), reference.detach().numpy(), rtol=1e-4, atol=1e-5)
  for got, want in zip(grads, [rq.grad, rk.grad, rv.grad] + ([masks[1].grad] if masks else [])):
    np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-3, atol=1e-4)

def test_a_causal_mask_bounds_each_attention_kernels_loop():
  """Causal attention's kernels skip the masked trips: the forward's and dq's loops over the keys end at the row's last key, dk's and
  dv's loops over the queries start at the key's row (bounds.py); a mask loaded from memory bounds nothing."""
  q, k, v, g = arrays((1, 2, 64, 16), (1, 2, 64, 16), (1, 2, 64, 16), (1, 2, 64, 16))
  for causal in (True, False):
    tq, tk, tv = (Tensor(a, requires_grad=True) for a in (q, k, v))
    mask = {"is_causal": True} if causal else {"attn_mask": Tensor(np.tril(np.ones((64, 64), bool)))}
    out = tq.scaled_dot_product_attention(tk, tv, **mask)
    (out * Tensor(g)).sum().backward()
    bounded = []  # of each loop over 64 keys or queries (the output's, which stores the log-sum-exp too, dq's, dk's and dv's)
    for item in items_of(out, tq.grad, tk.grad, tv.grad):
      uops = Linearizer(Kernel(item.ast)).linearize()
      loops = [uop for uop in uops if uop.op is UOps.LOOP and uop.arg.trips == 64 and uop.arg.name.startswith("ridx")]
      bounded += [not (loop.src[0].op is loop.src[1].op is UOps.CONST) for loop in loops]
    assert bounded == [causal] * 3, bounded

def test_a_work_groups_threads_share_one_bounded_range():
  """On a GPU the threads of a work-group walk one range (from the earliest start to the latest end of theirs): threads with ranges
  of their own would read rows 32 apart each trip, not one row a warp together (H200: causal SDPA 2x slower, not faster)."""
  q, k, v, g = arrays(*[(1, 2, 256, 64)] * 4)
  tq, tk, tv = (Tensor(a, requires_grad=True) for a in (q, k, v))
  out = tq.scaled_dot_product_attention(tk, tv, is_causal=True)
  (out * Tensor(g)).sum().backward()
  bounds = []
  for item in items_of(out, tq.grad, tk.grad, tv.grad):
    kernel = Kernel(item.ast, KernelTarget(has_local=True, max_upcast=GPU_MAX_UPCAST))
    hand_coded_optimizations(kernel)
    uops = Linearizer(kernel, threads=True).linearize()
    for loop in (uop for uop in uops if uop.op is UOps.LOOP and not (uop.src[0].op is uop.src[1].op is UOps.CONST)):
      assert kernel.axes(AxisKind.LOCAL)
      bounds.append({uop.arg.kind.name for src in loop.src[:2] for uop in _sources(src) if uop.op is UOps.SPECIAL})
  assert len(bounds) == 3 and all(kinds == {"GROUP"} for kinds in bounds), bounds  # work-group ids, no thread's own id

def test_a_gpu_short_of_a_waves_threads_splits_the_keys_of_more_attention_kernels():
  """Where a nested kernel's threads fall short of a wave of the device (NESTED_WAVE a compute unit), its rows are long chains that
  splitting the keys shortens: the output (one nested reduce, features upcast; it stores the log-sum-exp too) splits them between 2
  threads; dq, and dk with dv (two nested reduces), do not. On a device with one compute unit the output splits them as well (its
  max and sums run in one loop)."""
  q, k, v, g = arrays(*[(1, 2, 256, 64)] * 4)
  tq, tk, tv = (Tensor(a, requires_grad=True) for a in (q, k, v))
  out = tq.scaled_dot_product_attention(tk, tv, is_causal=True)
  (out * Tensor(g)).sum().backward()
  nested = [item.ast for item in items_of(out, tq.grad, tk.grad, tv.grad) if sum(op.op in ReduceOps for op in item.ast.walk()) > 1]
  def groups(units: int) -> list[int]:
    splits = []
    for ast in nested:
      kernel = Kernel(ast, KernelTarget(has_local=True, max_upcast=GPU_MAX_UPCAST, compute_units=units))
      splits.append(prod(kernel.full_shape[axis] for axis in kernel.axes(AxisKind.GROUP)) if hand_coded_optimizations(kernel) else 0)
    return sorted(splits)
  assert groups(1) == [1, 1, 2]  # dq, dk with dv; the output and its log-sum-exp (their max and sums in one loop)
  assert groups(132) == [1, 1, 2]

def _sources(uop):
  yield uop
  for src in uop.src: yield from _sources(src)

@pytest.mark.parametrize("diagonal", [-70, -9, 0, 5, 40])
def test_reduces_under_an_index_mask_match_numpy(diagonal, tinyc_device):
  """A sum and a max under tril/triu masks, where some rows keep nothing: a row's loop then has no trips (its start past its end)."""
  x, = arrays((2, 24, 40))
  for name in ("tril", "triu"):
    keep = getattr(np, name)(np.ones((24, 40), bool), diagonal)
    mask = getattr(Tensor.ones(24, 40), name)(diagonal)
    np.testing.assert_allclose((Tensor(x) * mask).sum(-1).numpy(), (x * keep).sum(-1), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(mask.cast(dtypes.bool).where(Tensor(x), -np.inf).max(1).numpy(), np.where(keep, x, -np.inf).max(1))

@pytest.mark.parametrize("loaded", [True, False])
def test_a_row_that_masks_every_key_attends_to_nothing_as_in_torch(loaded, tinyc_device):
  """torch's scaled_dot_product_attention gives 0, and 0 gradients, for a query whose every key is masked (not softmax's nan): a
  padding mask's rows. For a mask loaded from memory and for an index mask (triu: the last rows keep nothing), at a size the scheduler
  fuses (online softmax, the max -inf read as 0) and one it does not."""
  for shape in ((2, 2, 12, 8), (1, 2, 40, 16)):
    q, k, v, g = arrays(shape, shape, shape, shape)
    rows = shape[-2]
    keep = np.triu(np.ones((rows, rows), bool), rows - 3)
    mask = Tensor(keep) if loaded else Tensor.ones(rows, rows).triu(rows - 3).cast(dtypes.bool)
    tq, tk, tv = (Tensor(a, requires_grad=True) for a in (q, k, v))
    out = tq.scaled_dot_product_attention(tk, tv, attn_mask=mask)
    (out * Tensor(g)).sum().backward()
    rq, rk, rv = (torch.tensor(a, requires_grad=True) for a in (q, k, v))
    reference = torch.nn.functional.scaled_dot_product_attention(rq, rk, rv, attn_mask=torch.tensor(keep))
    (reference * torch.tensor(g)).sum().backward()
    np.testing.assert_allclose(out.numpy(), reference.detach().numpy(), rtol=1e-4, atol=1e-5)
    for got, want in zip((tq.grad, tk.grad, tv.grad), (rq.grad, rk.grad, rv.grad)):
      np.testing.assert_allclose(got.numpy(), want.numpy(), rtol=1e-3, atol=1e-4)

def test_logsumexp_matches_torch():
  x, = arrays((4, 7))
  tx, rx = Tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
  tx.logsumexp(1).sum().backward()
  torch.logsumexp(rx, 1).sum().backward()
  np.testing.assert_allclose(tx.logsumexp(1).numpy(), torch.logsumexp(rx, 1).detach().numpy(), rtol=1e-5)
  np.testing.assert_allclose(tx.grad.numpy(), rx.grad.numpy(), rtol=1e-5, atol=1e-7)
  assert Tensor(np.zeros((3, 0), np.float32)).logsumexp(1).tolist() == [-np.inf] * 3
  assert Tensor(x).logsumexp(0, keepdim=True).shape == (1, 7) and Tensor(x).half().logsumexp().dtype == dtypes.half

def test_backward_at_a_long_context_stores_no_scores():
  """A CPU matmul packs an operand it walks with a stride over 2 KB (tensor_nn._along_reduce): attention's backward must not, as
  a copy of the probabilities along the queries would store the matrix of scores. Scheduled only."""
  q, k, v = (Tensor.empty(1, 2, 1024, 16, requires_grad=True) for _ in range(3))
  out = q.scaled_dot_product_attention(k, v)
  out.sum().backward()
  assert all(base.shape.count(1024) < 2 for item in items_of(out, q.grad, k.grad, v.grad) for base in item.outs)

SHUFFLES = KernelTarget(has_local=True, warp_shuffles=True, max_upcast=GPU_MAX_UPCAST, compute_units=132)

@pytest.mark.parametrize("lanes,queries,keys,split", [(2, 4, 1, 1), (4, 2, 4, 1), (8, 4, 2, 1), (16, 1, 4, 1), (32, 2, 1, 1), (8, 4, 2, 2),
                                                       (4, 2, 1, 4), (32, 1, 2, 2)])
def test_lanes_share_each_score_and_split_the_features(lanes, queries, keys, split, tinyc_device):
  """LANES splits the head dim (each score's partial sums meet by shuffles, log2(lanes) a score) and the features among a warp's
  neighbouring threads; the max and the sum, of which no lane holds a part, lane 0 stores. With the keys split among `split`
  threads too (GROUP), each lane's partial sums of its features meet those of the same lane of the other threads. Run where the
  device has warp shuffles (CUDA); elsewhere CI compiles the source with NVRTC."""
  ast, inputs, expected = attention_kernel(rows=24, keys=20, width=64, features=32)
  kernel = Kernel(ast, SHUFFLES)
  assert lanes_plan(kernel, lanes, queries, 4, keys, split) and kernel.applied_opts[0] == Opt(OptOps.LANES, 0, lanes)
  assert [(kernel.full_shape[axis], kernel.owners[axis]) for axis in kernel.axes(AxisKind.LANE)] == [(lanes, frozenset()), (lanes, {0})]
  assert kernel.size_of(AxisKind.GROUP) == split and kernel.local_size == lanes * split * kernel.size_of(AxisKind.LOCAL)
  uops = Linearizer(kernel, threads=True).linearize()
  assert sum(uop.op is UOps.SHUFFLE for uop in uops) == (lanes.bit_length() - 1) * queries * keys
  if Device[Device.DEFAULT].target.warp_shuffles:
    for got, want in zip(run_kernel(ast, inputs, expected, tuple(kernel.applied_opts)), expected):
      np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)

@pytest.mark.parametrize("target,opts,message", [
  (KernelTarget(has_local=True), [Opt(OptOps.LANES, 0, 8)], "no warp shuffles"), (SHUFFLES, [Opt(OptOps.LANES, 0, 3)], "2, 4, 8, 16 or 32"),
  (SHUFFLES, [Opt(OptOps.UPCAST, 1, 0), Opt(OptOps.LANES, 0, 8)], "before every other"), (SHUFFLES, [Opt(OptOps.LANES, 1, 8)], "features axes"),
  (SHUFFLES, [Opt(OptOps.LANES, 0, 32)], "must divide")])
def test_lanes_is_refused_where_it_cannot_apply(target, opts, message):
  ast, _, _ = attention_kernel(rows=24, keys=20, width=64, features=16)
  kernel = Kernel(ast, target)
  for opt in opts[:-1]: kernel.apply_opt(opt)
  before = (kernel.full_shape, kernel.kinds)
  with pytest.raises(KernelOptError, match=message): kernel.apply_opt(opts[-1])
  assert (kernel.full_shape, kernel.kinds) == before
  matmul = Kernel(items_of(Tensor(arrays((8, 16))[0]) @ Tensor(arrays((16, 8))[0]))[0].ast, SHUFFLES)
  with pytest.raises(KernelOptError, match="no reduce is nested"): matmul.apply_opt(Opt(OptOps.LANES, 0, 4))

@pytest.mark.parametrize("context,lanes,split", [(512, [8] * 3, 4), (2048, [4, 8, 8], 1)])
def test_cuda_shares_every_attention_kernels_scores_among_lanes(context, lanes, split):
  """On a device with warp shuffles every kernel of causal SDPA's forward and backward takes LANES: 4 lanes, or 8 where the kernel's
  threads would fall short of a wave of the device (the GPT bench's 8 x 6 heads at 512 tokens, with 4 queries a thread) or a thread
  would hold over NESTED_LANE_VALUES values of its queries' rows and accumulators (float32 dq and dk: two rows and the features).
  Where its threads are still short of NESTED_LANE_WAVE a compute unit (at 512 tokens), each kernel splits its keys by 4 (GROUP)."""
  q, k, v, g = (Tensor.empty(8, 6 if context == 512 else 16, context, 64) for _ in range(4))
  tq, tk, tv = (Tensor(t.lazydata, requires_grad=True) for t in (q, k, v))
  out = tq.scaled_dot_product_attention(tk, tv, is_causal=True)
  (out * g).sum().backward()
  nested = [item.ast for item in items_of(out, tq.grad, tk.grad, tv.grad) if sum(op.op in ReduceOps for op in item.ast.walk()) > 1]
  assert len(nested) == 3
  assert sorted(hand_coded_optimizations(Kernel(ast, SHUFFLES))[0].amount for ast in nested) == lanes
  assert all(hand_coded_optimizations(Kernel(ast, SHUFFLES))[0].op is OptOps.LANES for ast in nested)
  plans = [Kernel(ast, SHUFFLES) for ast in nested]
  assert [hand_coded_optimizations(kernel) and kernel.size_of(AxisKind.GROUP) for kernel in plans] == [split] * 3
