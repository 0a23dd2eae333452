"""3x3 stride-1 convolutions by Winograd's F(4x4, 3x3) (tensor_winograd.py): values and both gradients against torch, which convs take
the path, and its kernels: three transforms and a batched matmul, the transforms' pieces upcast whole."""
import numpy as np
import pytest
import torch
from tinyc import Tensor, dtypes
from tinyc.helpers import Context
from tinyc.ops import LoadOps
from tinyc.schedule import create_schedule
from tinyc.codegen.kernel import Kernel, KernelTarget, Opt, OptOps, GPU_MAX_UPCAST
from tinyc.codegen.heuristic import hand_coded_optimizations
from tinyc import tensor_winograd

@pytest.fixture(autouse=True)
def small_convs_too(monkeypatch):
  """These convs are small, for speed: below WINOGRAD_MIN_PRODUCTS they would run directly (test_a_small_conv_runs_directly)."""
  monkeypatch.setattr(tensor_winograd, "WINOGRAD_MIN_PRODUCTS", 0)

def conv_and_grads(x_shape, w_shape, padding, winograd=1, seed=0):
  rng = np.random.default_rng(seed)
  x, w = rng.standard_normal(x_shape, dtype=np.float32), rng.standard_normal(w_shape, dtype=np.float32)
  tx, tw = torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True)
  expected = torch.nn.functional.conv2d(tx, tw, padding=padding)
  grad = rng.standard_normal(expected.shape, dtype=np.float32)
  (expected * torch.tensor(grad)).sum().backward()
  ours_x, ours_w = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
  with Context(WINOGRAD=winograd):
    out = ours_x.conv2d(ours_w, padding=padding)
    (out * Tensor(grad)).sum().backward()
  return [(out, expected), (ours_x.grad, tx.grad), (ours_w.grad, tw.grad)]

@pytest.mark.no_cuda_check
@pytest.mark.parametrize("x_shape, w_shape, padding", [
  ((2, 16, 9, 9), (16, 16, 3, 3), 1),     # 9 outputs a side: the last tile is partly outside
  ((2, 32, 14, 11), (16, 32, 3, 3), 1),   # not square, more input than output channels
  ((1, 16, 7, 5), (24, 16, 3, 3), 0),     # no padding: 5 x 3 outputs, one tile a column
  ((3, 16, 4, 4), (16, 16, 3, 3), 2),     # padding wider than the kernel's reach
  ((2, 20, 16, 16), (17, 20, 3, 3), (0, 2)),  # odd channels, different padding per dim
  ((1, 16, 1, 1), (16, 16, 3, 3), 1)])    # one pixel
def test_winograd_conv_matches_torch_forward_and_backward(tinyc_device, x_shape, w_shape, padding):
  for ours, expected in conv_and_grads(x_shape, w_shape, padding):
    expected = expected.detach().numpy()
    assert ours is not None and ours.shape == expected.shape
    # F(4x4, 3x3) rounds a few times more than the direct sum (its transforms scale by up to 8): relative to the largest value
    np.testing.assert_allclose(ours.numpy(), expected, rtol=0, atol=3e-5 * np.abs(expected).max())

def kernel_asts(out):
  return [item.ast for item in create_schedule([out.lazydata]) if item.ast.op not in LoadOps]

@pytest.mark.parametrize("where, x_shape, w_shape, kwargs, dtype", [
  ("direct", (1, 16, 8, 8), (16, 16, 3, 3), {"stride": 2}, dtypes.float32),
  ("direct", (1, 16, 8, 8), (16, 16, 3, 3), {"dilation": 2}, dtypes.float32),
  ("direct", (1, 16, 8, 8), (16, 8, 3, 3), {"groups": 2}, dtypes.float32),
  ("direct", (1, 16, 8, 8), (16, 16, 5, 5), {}, dtypes.float32),
  ("direct", (1, 8, 8, 8), (16, 8, 3, 3), {}, dtypes.float32),        # too few input channels to pay for the transforms
  ("direct", (1, 16, 8, 8), (16, 16, 3, 3), {}, dtypes.float16),      # 16-bit transforms would round too much
  ("winograd", (1, 16, 8, 8), (16, 16, 3, 3), {"padding": 1}, dtypes.float32)])
def test_which_convs_take_winograd(where, x_shape, w_shape, kwargs, dtype):
  out = Tensor.empty(*x_shape, dtype=dtype).conv2d(Tensor.empty(*w_shape, dtype=dtype), **kwargs)
  # Winograd: the kernel's transform, the input's, 36 matmuls, the output's transform; direct: one kernel (16-bit: two copies first)
  assert len(kernel_asts(out)) == (4 if where == "winograd" else 3 if dtype == dtypes.float16 else 1)
  with Context(WINOGRAD=0): assert len(kernel_asts(Tensor.empty(*x_shape).conv2d(Tensor.empty(*w_shape), **kwargs))) == 1

def test_winograd_off_gives_the_direct_conv_values(tinyc_device):
  winograd, direct = conv_and_grads((2, 16, 6, 6), (16, 16, 3, 3), 1), conv_and_grads((2, 16, 6, 6), (16, 16, 3, 3), 1, winograd=0)
  for (ours, _), (theirs, expected) in zip(winograd, direct):
    np.testing.assert_allclose(theirs.numpy(), expected.detach().numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(ours.numpy(), theirs.numpy(), rtol=0, atol=3e-5 * np.abs(theirs.numpy()).max())

def test_the_transforms_upcast_their_pieces_whole():
  out = Tensor.empty(2, 16, 12, 12).conv2d(Tensor.empty(32, 16, 3, 3), padding=1)
  kernels = [Kernel(ast, KernelTarget(has_local=True, max_upcast=GPU_MAX_UPCAST)) for ast in kernel_asts(out)]
  transforms = [kernel for kernel in kernels if not kernel.reduceops]
  assert len(transforms) == 3
  for kernel, pieces in zip(transforms, [(1, 0), (1, 0), (5, 3)]):  # the kernel's and the input's 6 x 6, the output's 4 x 4 blocks
    opts = hand_coded_optimizations(kernel)
    assert opts[:2] == [Opt(OptOps.UPCAST, pieces[0], 0), Opt(OptOps.UPCAST, pieces[1], 0)], opts

def test_winograd_conv_in_a_train_step_counts_its_kernels():
  x, w = Tensor.empty(2, 16, 8, 8), Tensor.empty(16, 16, 3, 3)
  w.requires_grad = True
  out = x.conv2d(w, padding=1).relu().realize()
  out.sum().backward()
  assert w.grad is not None
  # the weight gradient: the input's transform again, the output gradient's, 36 matmuls, the transform back to 3x3
  assert len(kernel_asts(w.grad)) == 4

def test_the_transforms_of_a_constant_gradient_upcast_their_pieces_whole():
  x, w = Tensor.empty(2, 16, 12, 12), Tensor.empty(32, 16, 3, 3)
  x.requires_grad = w.requires_grad = True
  x.conv2d(w, padding=1).sum().backward()  # the output's gradient is a constant, masked by the transforms' stacks
  for grad in (x.grad, w.grad):
    kernels = [Kernel(ast, KernelTarget(has_local=True, max_upcast=GPU_MAX_UPCAST)) for ast in kernel_asts(grad)]
    for kernel in [kernel for kernel in kernels if not kernel.reduceops]:
      opts = hand_coded_optimizations(kernel)
      assert [(opt.op, opt.amount) for opt in opts[:2]] == [(OptOps.UPCAST, 0)] * 2, (kernel.full_shape, opts)

def test_a_small_conv_runs_directly(monkeypatch):
  monkeypatch.undo()
  small, large = Tensor.empty(1, 16, 8, 8), Tensor.empty(8, 64, 28, 28)  # 2.4M products against 231M
  assert len(kernel_asts(small.conv2d(Tensor.empty(16, 16, 3, 3), padding=1))) == 1
  assert len(kernel_asts(large.conv2d(Tensor.empty(64, 64, 3, 3), padding=1))) == 4

def test_a_16_bit_input_with_a_float32_kernel_transforms_in_float32():
  rng = np.random.default_rng(1)
  x, w = rng.standard_normal((2, 16, 8, 8)).astype(np.float16), rng.standard_normal((16, 16, 3, 3), dtype=np.float32)
  ours_x, ours_w = Tensor(x, requires_grad=True), Tensor(w, requires_grad=True)
  out = ours_x.conv2d(ours_w, padding=1)
  out.sum().backward()
  expected = torch.nn.functional.conv2d(torch.tensor(x, dtype=torch.float32), torch.tensor(w), padding=1).numpy()
  assert out.dtype == dtypes.float32 and ours_w.grad is not None and ours_w.grad.dtype == dtypes.float32
  np.testing.assert_allclose(out.numpy(), expected, rtol=0, atol=3e-5 * np.abs(expected).max())
