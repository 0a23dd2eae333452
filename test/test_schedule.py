"""Each fusion rule of schedule.py, held by counting the kernels a realize runs (and checking the values)."""
import numpy as np
import pytest
import torch
import ast_reference
from tinyc import Tensor, GlobalCounters, nn, realize
from tinyc.device import Device
from tinyc.nn.optim import AdamW
from tinyc.helpers import Context, prod
from tinyc.codegen.kernel import Kernel
from tinyc.codegen.linearizer import Linearizer
from tinyc.codegen.uops import UOps
from tinyc.ops import ReduceOps, BinaryOps, LoadOps
from tinyc.schedule import create_schedule

def realized_inputs(*shapes, seed=0):
  rng = np.random.default_rng(seed)
  arrays = [rng.standard_normal(shape).astype(np.float32) for shape in shapes]
  return arrays, [Tensor(a).realize() for a in arrays]

def kernel_items(*tensors):
  """The kernels a realize of `tensors` would run (scheduled, not run: counts that hold whatever the code generator supports)."""
  return [item for item in create_schedule([t.lazydata for t in tensors]) if item.ast.op not in LoadOps]

@pytest.fixture(params=["compiled", "reference"])
def kernels(request, monkeypatch):
  if request.param == "reference": monkeypatch.setattr(realize, "_compute", ast_reference.compute)
  return request.param

def kernels_for(*tensors):
  GlobalCounters.reset()
  Tensor.corealize(tensors)
  return GlobalCounters.kernel_count

@pytest.mark.parametrize("length", [1, 2, 10, 50])
def test_elementwise_chain_is_one_kernel(length):
  (a, b), (ta, tb) = realized_inputs((8, 16), (8, 16))
  out, expected = ta, a
  for step in range(length):
    out, expected = (out * tb + step, expected * b + step) if step % 2 else ((out - tb).relu(), np.maximum(expected - b, 0))
  assert kernels_for(out) == 1
  np.testing.assert_allclose(out.numpy(), expected, rtol=1e-4, atol=1e-4)

@pytest.mark.parametrize("axis", [0, 1, (0, 1)])
def test_multiply_then_sum_is_one_kernel(axis):
  (a, b), (ta, tb) = realized_inputs((16, 32), (16, 32))
  out = (ta * tb).sum(axis)
  assert kernels_for(out) == 1
  np.testing.assert_allclose(out.numpy(), (a * b).sum(axis), rtol=1e-4, atol=1e-4)

def test_relu_of_matmul_plus_bias_is_one_kernel():
  (x, w, b), (tx, tw, tb) = realized_inputs((4, 8), (8, 5), (5,))
  out = (tx @ tw + tb).relu()
  assert kernels_for(out) == 1
  np.testing.assert_allclose(out.numpy(), np.maximum(x @ w + b, 0), rtol=1e-5, atol=1e-5)

def test_movement_ops_make_no_kernel():
  (a,), (ta,) = realized_inputs((4, 6))
  view = ta.reshape(6, 4).permute(1, 0)[::-1, 1:].pad(((1, 1), (0, 2))).expand(2, 6, 7)[1]
  assert kernels_for(view) == 0, "realizing a view of a realized buffer runs nothing"
  out = view * 2
  assert kernels_for(out) == 1
  expected = np.pad(a.reshape(6, 4).T[::-1, 1:], ((1, 1), (0, 2))) * 2
  np.testing.assert_allclose(out.numpy(), expected)

def test_shared_subexpression_computed_once_inside_a_kernel():
  (a, b), (ta, tb) = realized_inputs((8, 8), (8, 8))
  shared = ta * tb
  out = shared + shared.exp() * shared
  (item,) = create_schedule([out.lazydata])
  uops = Linearizer(Kernel(item.ast)).linearize()
  assert sum(1 for u in uops if u.op is UOps.ALU and u.arg is BinaryOps.MUL and {s.op for s in u.src} == {UOps.LOAD}) == 1
  np.testing.assert_allclose(out.numpy(), a * b + np.exp(a * b) * a * b, rtol=1e-5)

def test_elementwise_value_read_by_two_kernels_is_recomputed():
  (a, b), (ta, tb) = realized_inputs((8, 8), (8, 8))
  shared = ta * tb + 1
  total, largest = shared.sum(), shared.max()
  assert len(kernel_items(total, largest)) == 1  # rule 2: no kernel materializes `shared`; rule 9: the two reduces read a and b once
  np.testing.assert_allclose([total.item(), largest.item()], [(a * b + 1).sum(), (a * b + 1).max()], rtol=1e-5)

def test_sibling_reduces_share_one_walk_of_their_loop(tinyc_device):
  """Rule 9's siblings in one kernel walk their loop once together, what both read computed once a trip; a reduce that reads
  another (a softmax's sum of exp(x - max), the max over the same loop) waits for it in a walk of its own, and the max walks with
  the plain sum: over (16, 64) rows, 2 loops over 64, not 3."""
  (a,), (ta,) = realized_inputs((16, 64))
  total, exps = ta.sum(1), (ta - ta.max(1, keepdim=True)).exp().sum(1)
  (item,) = kernel_items(total, exps)
  uops = Linearizer(Kernel(item.ast)).linearize()
  assert sum(uop.op is UOps.LOOP and uop.arg.trips == 64 for uop in uops) == 2
  np.testing.assert_allclose(total.numpy(), a.sum(1), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(exps.numpy(), np.exp(a - a.max(1, keepdims=True)).sum(1), rtol=1e-5)

def test_siblings_that_each_read_a_reduce_of_their_own_walk_apart(tinyc_device):
  """Two layernorms in one row kernel: each variance reads its own mean, and a mean's siblings are the other mean, not the variance
  that reads that one (which walking with it recursed without end: a bfloat16 GPT step's layernorm)."""
  (a, b), (ta, tb) = realized_inputs((16, 64), (16, 64))
  def norm(t): return (centered := t - t.mean(1, keepdim=True)) / (centered * centered).mean(1, keepdim=True).add(1e-5).sqrt()
  def reference(x): return (x - x.mean(1, keepdims=True)) / np.sqrt(x.var(1, keepdims=True) + 1e-5)
  np.testing.assert_allclose((norm(ta) + norm(tb)).numpy(), reference(a) + reference(b), rtol=1e-4, atol=1e-5)

def test_a_value_read_by_several_kernels_from_many_buffers_is_stored_once():
  # a residual stream: each layer adds relu(linear(layernorm(stream))), and each sum is read by the next layer's layernorm and by the
  # next sum. Recomputed (rule 2), the last kernel would read the first part and all 8 linear layers' outputs; a sum whose inputs come
  # to 4 times its bytes is stored once (rule 8: by its layernorm's kernel), so no kernel reads more than 4 buffers of the stream's size
  Tensor.manual_seed(0)
  layers = [(nn.LayerNorm(32), nn.Linear(32, 32)) for _ in range(8)]
  (first,), (stream,) = realized_inputs((16, 32))
  torch_stream = torch.tensor(first)
  for norm, linear in layers:
    stream = stream + linear(norm(stream)).relu()
    weight, bias = torch.tensor(linear.weight.numpy()), torch.tensor(linear.bias.numpy())
    torch_stream = torch_stream + torch.relu(torch.nn.functional.layer_norm(torch_stream, (32,), eps=norm.eps) @ weight.T + bias)
  full_size_inputs = [sum(prod(src.shape) == 16 * 32 for src in item.inputs) for item in kernel_items(stream)]
  assert max(full_size_inputs) <= 4, full_size_inputs
  np.testing.assert_allclose(stream.numpy(), torch_stream.numpy(), rtol=1e-4, atol=1e-4)

def test_reduce_read_by_two_kernels_is_materialized_once(kernels):
  (a,), (ta,) = realized_inputs((8, 8))
  row_sums = ta.sum(1)
  first, second = row_sums + 1, row_sums * 2
  assert len(kernel_items(first, second)) == 2  # rule 3: the reduce runs once; rule 8: the kernel of `first` stores it too
  Tensor.corealize([first, second])
  np.testing.assert_allclose(first.numpy(), a.sum(1) + 1, rtol=1e-5)
  np.testing.assert_allclose(second.numpy(), a.sum(1) * 2, rtol=1e-5)

def softmax_reference(a, axis):
  expected = np.exp(a - a.max(axis, keepdims=True))
  return expected / expected.sum(axis, keepdims=True)

@pytest.mark.parametrize("axis", [-1, 0])
def test_softmax_is_one_row_kernel(axis):
  (a,), (ta,) = realized_inputs((8, 16))
  out = ta.softmax(axis)  # the max and the sum are each read back through an expand, inside the kernel that divides (rule 7)
  assert kernels_for(out) == 1
  np.testing.assert_allclose(out.numpy(), softmax_reference(a, axis), rtol=1e-5, atol=1e-6)

def test_log_softmax_and_layernorm_are_one_row_kernel_each():
  (a,), (ta,) = realized_inputs((8, 40))
  assert kernels_for(ta.log_softmax(-1)) == 1
  np.testing.assert_allclose(ta.log_softmax(-1).numpy(), np.log(softmax_reference(a, -1)), rtol=1e-5, atol=1e-5)
  out = ta.layernorm()
  assert kernels_for(out) == 1
  np.testing.assert_allclose(out.numpy(), (a - a.mean(-1, keepdims=True)) / np.sqrt(a.var(-1, keepdims=True) + 1e-5), rtol=1e-4, atol=1e-4)

def test_row_reduces_over_different_axes_are_materialized():
  (a,), (ta,) = realized_inputs((8, 16))
  out = ta - ta.max(0, keepdim=True) - ta.max(1, keepdim=True)  # one row kernel has one set of reduced axes
  assert kernels_for(out) == 2
  np.testing.assert_allclose(out.numpy(), a - a.max(0, keepdims=True) - a.max(1, keepdims=True), rtol=1e-6)

def test_reduce_read_through_an_expand_by_another_shape_is_materialized():
  (a,), (ta,) = realized_inputs((8, 16))
  out = (ta - ta.max(1, keepdim=True)).sum(0)  # the kernel stores (16,), not the max's input shape: a row kernel cannot hold it
  assert kernels_for(out) == 2
  np.testing.assert_allclose(out.numpy(), (a - a.max(1, keepdims=True)).sum(0), rtol=1e-5, atol=1e-5)
  out = ta.T * ta.sum(1)  # (16, 8) reading the (8,) sums along a permuted expand
  assert kernels_for(out) == 2
  np.testing.assert_allclose(out.numpy(), a.T * a.sum(1), rtol=1e-5, atol=1e-5)

def test_a_transcendental_value_a_matmul_reads_is_stored_even_with_one_reader():
  """Rule 2: exp in a matmul's operand would run once per output column; a cheap op (x * 2) is still computed in the matmul."""
  (x, w), (tx, tw) = realized_inputs((16, 32), (32, 24))
  assert kernels_for(tx.exp() @ tw) == 2 and kernels_for((tx * 2) @ tw) == 1
  np.testing.assert_allclose((tx.exp() @ tw).numpy(), np.exp(x) @ w, rtol=1e-4, atol=1e-4)
  np.testing.assert_allclose(tx.exp().sum(1).numpy(), np.exp(x).sum(1), rtol=1e-4)  # read by a reduce along its own axes: one kernel
  assert kernels_for(tx.exp().sum(1)) == 1

def test_reduce_of_a_reduce_is_two_kernels():
  (a,), (ta,) = realized_inputs((8, 16))
  out = ta.sum(1).sum(0)
  assert kernels_for(out) == 2
  np.testing.assert_allclose(out.numpy(), a.sum(), rtol=1e-5)

def test_two_reduces_over_the_same_loops_share_a_kernel():
  (a, b), (ta, tb) = realized_inputs((8, 16), (8, 16))
  out = ta.sum(1) + tb.max(1)
  assert kernels_for(out) == 1  # rule 3: both reduce (8, 16) over axis 1, so one kernel runs both in its loops
  np.testing.assert_allclose(out.numpy(), a.sum(1) + b.max(1), rtol=1e-5)

def test_pad_of_an_unsafe_op_is_materialized_first():
  (a,), (ta,) = realized_inputs((4, 4))
  out = ta.exp().pad(((1, 1), (2, 0))) + 1  # exp(0) != 0: the padded area must come out as 0 + 1, not exp(0) + 1
  assert kernels_for(out) == 2
  np.testing.assert_allclose(out.numpy(), np.pad(np.exp(a), ((1, 1), (2, 0))) + 1, rtol=1e-6)

def test_pad_of_a_safe_op_fuses():
  (a, b), (ta, tb) = realized_inputs((4, 4), (4, 4))
  out = (ta * tb + ta).pad(((1, 1), (2, 0))) - 3
  assert kernels_for(out) == 1
  np.testing.assert_allclose(out.numpy(), np.pad(a * b + a, ((1, 1), (2, 0))) - 3, rtol=1e-6)

def test_constants_need_no_memory_but_realize_to_one_kernel():
  out = Tensor.full((3, 4), 2.5)
  assert kernels_for(out) == 1
  np.testing.assert_equal(out.numpy(), np.full((3, 4), 2.5, np.float32))

def test_zero_size_tensors_run_no_kernel():
  out = Tensor.ones(0, 3) * 2
  assert kernels_for(out) == 0
  assert out.numpy().shape == (0, 3)

def test_a_realized_value_is_not_recomputed():
  (a,), (ta,) = realized_inputs((8, 8))
  middle = (ta * 2).realize()
  out = middle + 1
  assert kernels_for(out) == 1
  np.testing.assert_allclose(out.numpy(), a * 2 + 1)

def test_debug_1_prints_the_kernel_count(capsys):
  (a,), (ta,) = realized_inputs((8, 8))
  with Context(DEBUG=1): (ta.sum(1) + 1).realize()
  assert "with 1 kernel(s)" in capsys.readouterr().out

def test_one_buffer_read_through_two_views_is_one_kernel_argument():
  # found by test_graph_fuzz (seed 35): each view got its own pointer argument, and the kernel read garbage
  x = np.arange(18, dtype=np.float32).reshape(3, 2, 3)
  t = Tensor(x)
  out = t.flip(2) - t
  assert kernels_for(out) == 1
  np.testing.assert_equal(out.numpy(), np.flip(x, 2) - x)

def test_assign_writes_in_place():
  (a, b), (ta, tb) = realized_inputs((4, 4), (4, 4))
  memory = ta.lazydata.base.realized
  ta.assign(ta * 2 + tb)
  assert kernels_for(ta) == 1
  assert ta.lazydata.base.realized is memory
  np.testing.assert_allclose(ta.numpy(), a * 2 + b, rtol=1e-6)

def test_assign_runs_after_every_reader_of_the_old_value():
  (a, b), (ta, tb) = realized_inputs((4, 4), (4, 4))
  reads_old = (ta * tb).sum(1)  # reads ta's old value; computed in the same schedule as the write
  ta.assign(tb - 1)
  Tensor.corealize([ta, reads_old])  # the assign is listed first, yet must run last
  np.testing.assert_allclose(reads_old.numpy(), (a * b).sum(1), rtol=1e-5)
  np.testing.assert_allclose(ta.numpy(), b - 1)

def test_assign_reading_itself_through_another_view_uses_a_temporary():
  (a,), (ta,) = realized_inputs((4, 4))
  ta.assign(ta.T + 1)
  np.testing.assert_allclose(ta.numpy(), a.T + 1)
  ta.assign(ta.flip(0))
  np.testing.assert_allclose(ta.numpy(), np.flip(a.T + 1, 0))

def test_reducing_a_zero_size_axis_gives_the_identity():
  # found by the op suite: the linearizer got a reduce loop of size 0. The scheduler now folds it to a constant.
  from tinyc.lazy import LazyBuffer
  from tinyc.ops import LoadOps, ReduceOps
  from tinyc.dtype import dtypes
  empty = LazyBuffer.loadop(LoadOps.EMPTY, (0, 3), dtypes.float32, "LLVM")
  for op, expected in ((ReduceOps.SUM, 0.0), (ReduceOps.MAX, -np.inf)):
    out = Tensor(empty.reduce(op, (0,)))
    assert kernels_for(out) == 1
    np.testing.assert_equal(out.numpy(), np.full((1, 3), expected, np.float32))

def test_second_assign_before_realize_still_writes_in_place():
  # found by nn.state's tied weights: the second assign replaced the tensor instead of writing into its memory
  t = Tensor([1.0, 2.0]).realize()
  memory = t.lazydata.realized
  t.assign(t + 1)
  t.assign(t * 10)
  t.realize()
  assert t.lazydata.base.realized is memory
  np.testing.assert_equal(t.numpy(), [20.0, 30.0])

def test_shared_value_read_through_an_expand_by_a_reduce_is_materialized():
  # the relu-backward of a conv is read by both the weight-grad and the input-grad kernels, each through an expand;
  # recomputing it would repeat it once per broadcast element (16*9 times per element in the digits CNN)
  (g, h, x, w), (tg, th, tx, tw) = realized_inputs((8, 16), (8, 16), (8, 4), (4, 16))
  shared = tg * (th > 0)                         # an elementwise value with two readers...
  grad_x, grad_w = shared @ tw.T, tx.T @ shared  # ...each a reduce that reads it through an expand
  assert kernels_for(grad_x, grad_w) == 3        # `shared` once, then the two reduces load it
  np.testing.assert_allclose(grad_x.numpy(), (g * (h > 0)) @ w.T, rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(grad_w.numpy(), x.T @ (g * (h > 0)), rtol=1e-5, atol=1e-5)

def test_single_reader_through_an_expand_still_recomputes():
  (x, w), (tx, tw) = realized_inputs((8, 16), (16, 4))
  out = tx.relu() @ tw  # relu(x) is read once, through an expand: cheaper to recompute than to store and reload
  assert kernels_for(out) == 1
  np.testing.assert_allclose(out.numpy(), np.maximum(x, 0) @ w, rtol=1e-5, atol=1e-5)

def test_a_value_of_constants_read_by_several_reduces_through_an_expand_is_recomputed():
  # rule 2 stores a value several reduces read along their output axes, but a causal mask (tril of ones) reads no memory: it is
  # index math, recomputed in each kernel, where the linearizer can bound a reduce's loop by it (section 6)
  (x, y), (tx, ty) = realized_inputs((4, 16, 16), (4, 16, 16))
  mask = Tensor.ones(16, 16).tril()
  first, second = (tx * mask).sum(2), (ty * mask).max(1)
  assert len(kernel_items(first, second)) == 2
  Tensor.corealize([first, second])
  np.testing.assert_allclose(first.numpy(), (x * np.tril(np.ones((16, 16)))).sum(2), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(second.numpy(), (y * np.tril(np.ones((16, 16)))).max(1), rtol=1e-5, atol=1e-6)

def test_numpy_of_a_realized_reshape_view_runs_no_kernel():
  # found while writing the indexing tests: a reduce leaves a (2, 4, 1) base seen as (2, 4); reading it copied it first
  (a,), (ta,) = realized_inputs((2, 3, 4))
  out = ta.sum(1).realize()
  GlobalCounters.reset()
  np.testing.assert_allclose(out.numpy(), a.sum(1), rtol=1e-6)
  assert GlobalCounters.kernel_count == 0

def test_a_row_reduce_and_a_plain_reduce_never_share_a_kernel():
  # found reading the change: with the row reduce built first, a plain reduce beside it was inlined too, into one kernel
  (x, y), (tx, ty) = realized_inputs((4, 5), (4, 5, 6))
  out = tx.max(1, keepdim=True) + ty.sum(2)
  assert kernels_for(out) == 2
  np.testing.assert_allclose(out.numpy(), x.max(1, keepdims=True) + y.sum(2), rtol=1e-5, atol=1e-5)

def test_debug_3_prints_each_decision_and_its_reason(capsys):
  (a, b), (ta, tb) = realized_inputs((8, 16), (8, 16))
  with Context(DEBUG=3): create_schedule([(ta.softmax(-1) + tb.sum(0)).lazydata])
  lines = [line for line in capsys.readouterr().out.splitlines() if line.startswith("schedule:")]
  assert any("reads MAX (8, 1): ROW_REDUCE, as rule 7" in line for line in lines), lines
  assert any("reads SUM (1, 16): REALIZE, as rule 3: the row kernel has row reduces of its own" in line for line in lines), lines
  assert any("reads EXP2 (8, 16): INLINE, as rule 1" in line for line in lines), lines

# ---- several outputs and nested reduces (rules 3, 8, 9). Each fusion is counted on the schedule, and its values are checked against
# torch twice: with the kernels the code generator compiles, and with the numpy evaluator of kernel ASTs (test/ast_reference.py),
# which checks what the scheduler made whatever the code generator supports.

def test_nested_row_reduce_is_computed_in_the_outer_reduce(kernels):
  (a,), (ta,) = realized_inputs((8, 16))
  out = (ta - ta.max(1, keepdim=True)).exp().sum()  # the row max depends on axis 0, which comes first: once per row
  assert len(kernel_items(out)) == 1
  np.testing.assert_allclose(out.numpy(), np.exp(a - a.max(1, keepdims=True)).sum(), rtol=1e-5)

def test_nested_reduce_is_stored_when_its_loop_comes_after(kernels):
  (a,), (ta,) = realized_inputs((8, 16))
  out = (ta - ta.max(0, keepdim=True)).exp().sum()  # the column max depends on axis 1, inside axis 0's loop: it would run 8 times
  assert len(kernel_items(out)) == 2
  np.testing.assert_allclose(out.numpy(), np.exp(a - a.max(0, keepdims=True)).sum(), rtol=1e-5)

def test_contractions_reading_one_input_stay_apart():
  (x, w1, w2), (tx, tw1, tw2) = realized_inputs((8, 16), (16, 4), (16, 4))
  assert len(kernel_items(tx @ tw1, tx @ tw2)) == 2  # rule 9 leaves matmuls alone: each tile is chosen for one accumulator set

def torch_adamw_steps(params, grads, steps, **kwargs):
  weights = [torch.tensor(p, requires_grad=True) for p in params]
  optimizer = torch.optim.AdamW(weights, **kwargs)
  for _ in range(steps):
    for weight, grad in zip(weights, grads): weight.grad = torch.tensor(grad)
    optimizer.step()
  return [weight.detach().numpy() for weight in weights]

def test_adamw_updates_each_parameter_in_one_kernel(kernels):
  (w, b, gw, gb), (tw, tb, tgw, tgb) = realized_inputs((8, 16), (16,), (8, 16), (16,))
  optimizer = AdamW([tw, tb], lr=0.01, weight_decay=0.1)
  for step in range(2):
    tw.grad, tb.grad = tgw, tgb
    targets = optimizer._update([0, 1]) + optimizer.params + [optimizer.lr]  # what optimizer.step() realizes
    if step == 0:
      items = kernel_items(*targets)
      # one kernel per parameter stores it and its two moments; one kernel steps both counters (was 4 kernels per parameter)
      assert sorted(len(item.outs) for item in items) == [2, 3, 3], [item.outs for item in items]
    Tensor.corealize(targets)
  expected = torch_adamw_steps([w, b], [gw, gb], 2, lr=0.01, weight_decay=0.1)
  np.testing.assert_allclose(tw.numpy(), expected[0], rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(tb.numpy(), expected[1], rtol=1e-5, atol=1e-6)

def test_layernorm_train_step_is_three_kernels(kernels):
  (x, weight, bias, g), (tx, tweight, tbias, tg) = realized_inputs((8, 32), (32,), (32,), (8, 32))
  norm = nn.LayerNorm(32)
  norm.weight, norm.bias = tweight, tbias
  for tensor in (tx, tweight, tbias): tensor.requires_grad = True
  out = norm(tx)
  (out * tg).sum().backward()
  outputs = (out, tx.grad, norm.weight.grad, norm.bias.grad)
  forward, backward_x, backward_affine = kernel_items(*outputs)
  # the forward row kernel also stores the row statistics the backward reads (rule 8), instead of kernels of their own;
  # the input's gradient is one row kernel; the weight's and the bias's are sibling reduces over the rows, one kernel (rule 9)
  assert out.lazydata.base in forward.outs and len(forward.outs) > 1 and all(base.shape == (8, 1) for base in forward.outs[1:])
  assert backward_x.outs == (tx.grad.lazydata.base,)
  assert set(backward_affine.outs) == {norm.weight.grad.lazydata.base, norm.bias.grad.lazydata.base}
  Tensor.corealize(outputs)
  reference = [torch.tensor(a, requires_grad=True) for a in (x, weight, bias)]
  torch_out = torch.nn.functional.layer_norm(reference[0], (32,), reference[1], reference[2], eps=1e-5)
  (torch_out * torch.tensor(g)).sum().backward()
  np.testing.assert_allclose(out.numpy(), torch_out.detach().numpy(), rtol=1e-4, atol=1e-5)
  for got, tensor in zip(outputs[1:], reference): np.testing.assert_allclose(got.numpy(), tensor.grad.numpy(), rtol=1e-4, atol=1e-4)

def cross_entropy_case(ignore_index=-1):
  (logits,), (tlogits,) = realized_inputs((8, 10))
  labels = np.array([3, 0, 9, 4, 4, ignore_index, 1, 7], dtype=np.int32)
  tlogits.requires_grad = True
  return logits, tlogits, labels, Tensor(labels)

def torch_cross_entropy(logits, labels):
  reference = torch.tensor(logits, requires_grad=True)
  loss = torch.nn.functional.cross_entropy(reference, torch.tensor(labels, dtype=torch.long), ignore_index=-1)
  loss.backward()
  return loss.item(), reference.grad.numpy()

def test_cross_entropy_forward_and_backward_are_one_kernel_each(kernels):
  logits, tlogits, labels, tlabels = cross_entropy_case()
  with Context(CHECK_INDEX=0):  # with index checks on, the labels' check is one more small kernel of its own
    loss = tlogits.sparse_categorical_crossentropy(tlabels)
    assert len(kernel_items(loss)) == 1  # the row max and log-sum-exp nest in the sum over rows (rule 3)
    loss.backward()
    # realized together, as a train step does: the forward also stores the count of labels the backward reads (rule 8); the backward
    # recomputes the row reductions it needs in its own row walk (rule 3)
    assert len(kernel_items(loss, tlogits.grad)) == 2
    Tensor.corealize([loss, tlogits.grad])
  expected_loss, expected_grad = torch_cross_entropy(logits, labels)
  np.testing.assert_allclose(loss.item(), expected_loss, rtol=1e-5)
  np.testing.assert_allclose(tlogits.grad.numpy(), expected_grad, rtol=1e-4, atol=1e-6)

def test_cross_entropy_backward_after_the_forward_was_realized(kernels):
  logits, tlogits, labels, tlabels = cross_entropy_case()
  with Context(CHECK_INDEX=0):
    loss = tlogits.sparse_categorical_crossentropy(tlabels).realize()
    loss.backward()
    # the backward recomputes the row reductions in its row walk; the count of labels, a single value that the forward kernel computed
    # but did not store (nothing else read it then), is a small kernel of its own
    assert len(kernel_items(tlogits.grad)) == 2
    tlogits.grad.realize()
  expected_loss, expected_grad = torch_cross_entropy(logits, labels)
  np.testing.assert_allclose(loss.item(), expected_loss, rtol=1e-5)
  np.testing.assert_allclose(tlogits.grad.numpy(), expected_grad, rtol=1e-4, atol=1e-6)

@pytest.mark.parametrize("device", ["LLVM", "GPU"])
def test_the_long_reduce_of_a_weight_gradient_splits(device):
  """On a device with work-groups, x.T @ grad over 4096 tokens into 512 x 256 outputs runs as 16 partial products (parts outermost),
  then their sum (split-K: outputs to fill the GPU); on a CPU too, so that each part's operands, 256 tokens of both (768 KB), fit
  CPU_SPLIT_K_BYTES (a core's cache). A CPU's 128 x 128 over 1024 tokens (1 MB) keeps one kernel, as a matmul with many outputs
  does (a CPU copies a 2048-wide right operand contiguous along the reduce first), and a sum of an elementwise product."""
  if not Device.usable(device): pytest.skip(f"{device} is not usable here")
  x, grad, square = (Tensor.empty(*shape, device=device) for shape in ((4096, 512), (4096, 256), (2048, 2048)))
  items = kernel_items(x.T @ grad)
  assert [item.outs[0].shape for item in items] == [(16, 512, 256, 1), (512, 256, 1)]
  assert len(kernel_items(square @ square)) == (1 if device == "GPU" else 2)  # 4M outputs fill the GPU as they are
  if device == "LLVM":
    assert len(kernel_items(Tensor.empty(1024, 128, device=device).T @ Tensor.empty(1024, 128, device=device))) == 1
    # a sum of an elementwise product (layernorm's weight gradient) reads each element once: no cache to block for, one kernel
    assert len(kernel_items((Tensor.empty(4096, 384, device=device) * Tensor.empty(4096, 1, device=device)).sum(0))) == 1
  (a, g), (ta, tg) = realized_inputs((2048, 64), (2048, 256))
  np.testing.assert_allclose((ta.to(device).T @ tg.to(device)).numpy(), a.T @ g, rtol=1e-4, atol=1e-3)

@pytest.mark.one_device
def test_split_k_splits_the_batch_so_each_part_reduces_one_run_of_tokens():
  """A linear layer's weight gradient over (batch 8, tokens 512) splits the batch, the outermost reduced dim: each part's kernel
  reduces its batches' tokens in one loop (a split of the 512 tokens left two reduce loops, 8 batches around 128 tokens, and ran
  0.77-0.89x the speed on the H200). The gradient against numpy."""
  if not Device.usable("GPU"): pytest.skip("GPU is not usable here")
  x, grad = (Tensor.empty(8, 512, width, device="GPU") for width in (384, 1536))
  w = Tensor.empty(1536, 384, device="GPU", requires_grad=True)
  ((x @ w.T) * grad).sum().backward()
  partial = kernel_items(w.grad)[0]
  kernel = Kernel(partial.ast, Device["GPU"].target)
  reduced = [size for size, kind in zip(kernel.full_shape, kernel.kinds) if kind.name == "REDUCE"]
  assert partial.outs[0].shape[0] > 1 and reduced == [8 // partial.outs[0].shape[0] * 512], (partial.outs[0].shape, kernel.full_shape)
  (a, g), (ta, tg) = realized_inputs((2, 512, 64), (2, 512, 32))
  tw = Tensor.zeros(32, 64, device="GPU", requires_grad=True)
  ((ta.to("GPU") @ tw.T) * tg.to("GPU")).sum().backward()
  np.testing.assert_allclose(tw.grad.numpy(), np.einsum("bti,bto->oi", a, g), rtol=1e-4, atol=1e-3)

def test_a_gpu_splits_a_weight_gradient_that_reads_a_stored_matmul():
  """Split-K leaves alone a sum of products whose operand reads a contraction short enough to nest in its kernel (rule 10: attention's
  probabilities); one that reads a longer contraction, stored by a kernel of its own (an MLP's hidden layer over 256 inputs), splits."""
  if not Device.usable("GPU"): pytest.skip("GPU is not usable here")
  x, w, grad = (Tensor.empty(*shape, device="GPU") for shape in ((4096, 256), (256, 512), (4096, 256)))
  shapes = [item.outs[0].shape for item in kernel_items((x @ w).relu().T @ grad)]
  assert shapes == [(4096, 512, 1), (16, 512, 256, 1), (512, 256, 1)], shapes

def test_a_gpu_does_not_split_causal_attention_that_reads_its_scores_by_many_paths():
  """Split-K's walk up to the scores counts each op once: the backward's probabilities reach them through the log-sum-exp (its max, and
  the tests of a row that keeps nothing) and directly, and a walk that counted every path gave up before it got there, then split dv's
  sum over the queries and stored the T x T probabilities. A GPT block's attention, forward and backward, scheduled for a GPU."""
  if not Device.usable("GPU"): pytest.skip("GPU is not usable here")
  q, k, v = (Tensor.empty(8, 6, 512, 64, device="GPU", requires_grad=True) for _ in range(3))
  (q.scaled_dot_product_attention(k, v, is_causal=True) * Tensor.empty(8, 6, 512, 64, device="GPU")).sum().backward()
  shapes = [item.outs[0].shape for item in kernel_items(q.grad, k.grad, v.grad)]
  assert not [shape for shape in shapes if prod(shape) >= 512 * 512 * 48], shapes

@pytest.mark.one_device
def test_a_cpu_splits_a_weight_gradient_that_reads_an_mlps_hidden_layer_for_the_cache():
  """A CPU's weight gradient of an MLP's second layer reads the hidden layer relu(x @ w1), a contraction over 128 inputs short enough
  for rule 10 to nest; scheduled with the forward that reads it too, it is stored, and the gradient splits for the cache
  (CPU_SPLIT_K_BYTES) in 8 parts, as one over any stored matmul does (the split-K guard against such operands is a GPU's). Checked
  against numpy."""
  (a, w, w2, g), (ta, tw, tw2, tg) = realized_inputs((2048, 128), (128, 512), (512, 128), (2048, 128))
  ta, tw, tw2, tg = (t.to("LLVM") for t in (ta, tw, tw2, tg))
  hidden = (ta @ tw).relu()
  forward, gradient = hidden @ tw2, hidden.T @ tg
  shapes = [item.outs[0].shape for item in kernel_items(forward, gradient)]
  assert shapes == [(2048, 512), (2048, 128, 1), (8, 512, 128, 1), (512, 128, 1)], shapes
  Tensor.corealize([forward, gradient])
  np.testing.assert_allclose(gradient.numpy(), np.maximum(a @ w, 0).T @ g, rtol=1e-4, atol=1e-2)

@pytest.mark.one_device
def test_a_cpus_cross_attention_stores_no_probabilities():
  """Attention's matmuls never split for the cache (scaled_dot_product_attention builds them with PACK=0): 4096 queries over 512 keys
  would split dv's sum over the queries into parts of 9.4 MB / 16, each storing its part of the 4096 x 512 probabilities."""
  q = Tensor.empty(1, 1, 4096, 64, device="LLVM", requires_grad=True)
  k, v = (Tensor.empty(1, 1, 512, 64, device="LLVM", requires_grad=True) for _ in range(2))
  (q.scaled_dot_product_attention(k, v) * Tensor.empty(1, 1, 4096, 64, device="LLVM")).sum().backward()
  shapes = [item.outs[0].shape for item in kernel_items(q.grad, k.grad, v.grad)]
  assert not [shape for shape in shapes if prod(shape) >= 4096 * 512], shapes

def test_contiguous_of_an_unrealized_value_is_stored(kernels):
  (a, b), (ta, tb) = realized_inputs((16,), (32,))
  # rule 5: without contiguous() the single reader recomputes a + 1 inside its reduce (one kernel); with it, a + 1 is stored first
  shared = (ta + 1).contiguous()
  out = (shared.reshape(16, 1) * tb.reshape(1, 32)).sum(0)
  assert len(kernel_items(out)) == 2
  np.testing.assert_allclose(out.numpy(), ((a + 1)[:, None] * b[None, :]).sum(0), rtol=1e-5)
  assert len(kernel_items((ta * 2).contiguous())) == 1 and not kernel_items(ta.contiguous())

def test_no_kernel_stores_a_value_its_one_reader_could_compute_from_what_it_reads(tinyc_device):
  """An MLP's backward with a stored hidden layer (256 products): gelu's forward kernel also stored 1 + 0.044715 h^2, a term of
  tanh's argument that the derivative's kernel reads, once, beside h and the bias it is computed from (rule 2 stored it while the
  input gradient's kernel recomputed the derivative: a reduce reading it through an expand). Read by one kernel without reduces that
  reads all its inputs, it is recomputed there: the CPU GPT step wrote and read 2048 x 512 floats a layer for it."""
  (x, w1, b1, w2, g), tensors = realized_inputs((256, 128), (128, 512), (512,), (512, 128), (256, 128), seed=5)
  leaves = [Tensor(t.lazydata, requires_grad=True) for t in tensors[:4]]
  ((leaves[0] @ leaves[1] + leaves[2]).gelu() @ leaves[3] * tensors[4]).sum().backward()
  grads = [leaf.grad for leaf in leaves]
  items = kernel_items(*grads)
  stored = {out for item in items for out in item.outs} | {base for item in items for base in item.inputs if base.realized is not None}
  def inputs_of(value):  # the stored values and buffers a value is computed from
    found, stack = set(), [src.base for src in value.srcs]
    while stack:
      if (base := stack.pop()) in stored or base.realized is not None: found.add(base)
      else: stack.extend(src.base for src in base.srcs)
    return found
  for item in items:
    for out in item.outs:
      readers = [reader for reader in items if out in reader.inputs]
      if len(readers) == 1 and not any(op.op in ReduceOps for op in readers[0].ast.walk()):
        assert not inputs_of(out) <= set(readers[0].inputs), (out.op, out.shape)
  torch_leaves = [torch.tensor(a, requires_grad=True) for a in (x, w1, b1, w2)]
  hidden = torch.nn.functional.gelu(torch_leaves[0] @ torch_leaves[1] + torch_leaves[2], approximate="tanh")
  (hidden @ torch_leaves[3] * torch.tensor(g)).sum().backward()
  for ours, theirs in zip(grads, torch_leaves): np.testing.assert_allclose(ours.numpy(), theirs.grad.numpy(), rtol=1e-3, atol=1e-3)

def test_no_kernel_stores_a_value_that_no_kernel_reads(tinyc_device):
  """An MLP's backward, its hidden layer (128 products) nested in its readers (rule 10): the input gradient's kernel was first built
  recomputing gelu's derivative, storing its three terms that compute exp (rule 2); the derivative itself was then stored (three
  kernels read it), and the pass ran again, loading it, but the terms stayed in the stored set: the derivative's kernel stored them
  too, and nothing read them (3 x 256 x 512 floats written for nothing, the CPU GPT step's gelu backward 3.7 ms a call)."""
  (x, w1, b1, w2, g), tensors = realized_inputs((256, 128), (128, 512), (512,), (512, 128), (256, 128), seed=3)
  leaves = [Tensor(t.lazydata, requires_grad=True) for t in tensors[:4]]
  ((leaves[0] @ leaves[1] + leaves[2]).gelu() @ leaves[3] * tensors[4]).sum().backward()
  grads = [leaf.grad for leaf in leaves]
  items = kernel_items(*grads)
  read = {base for item in items for base in item.inputs}
  assert all(out in read or out in {grad.lazydata.base for grad in grads} for item in items for out in item.outs), \
    [[out.shape for out in item.outs] for item in items]
  torch_leaves = [torch.tensor(a, requires_grad=True) for a in (x, w1, b1, w2)]
  hidden = torch.nn.functional.gelu(torch_leaves[0] @ torch_leaves[1] + torch_leaves[2], approximate="tanh")
  (hidden @ torch_leaves[3] * torch.tensor(g)).sum().backward()
  for ours, theirs in zip(grads, torch_leaves): np.testing.assert_allclose(ours.numpy(), theirs.grad.numpy(), rtol=1e-3, atol=1e-3)
