"""tinyc.nn layers against torch.nn: the same parameters (state-dict names and shapes, copied into the torch layer), then the forward
output and the gradients of the input and of every parameter; default initializations; BatchNorm2d's running statistics."""
from __future__ import annotations
import math
import numpy as np
import pytest
import torch
from tinyc import Tensor, dtypes, nn
from tinyc.nn.state import get_state_dict
from helpers import compare, random_array

def state_shapes(state: dict) -> dict[str, tuple[int, ...]]: return {k: tuple(v.shape) for k, v in state.items()}

def copy_into_torch(layer, torch_layer: torch.nn.Module, randomize: bool = True, seed: int = 0) -> None:
  """Give both layers the same state: tinyc's (its floats randomized first, so that weights initialized to ones still test something),
  loaded into the torch layer by name. The names and shapes must match torch's state_dict exactly."""
  state = get_state_dict(layer)
  assert state_shapes(state) == state_shapes(torch_layer.state_dict()), f"{state_shapes(state)} != torch's {state_shapes(torch_layer.state_dict())}"
  for i, (name, value) in enumerate(state.items()):
    if randomize and dtypes.is_float(value.dtype) and "running" not in name:  # a new tensor, not assign: no kernel to compile
      setattr(layer, name, Tensor(random_array(value.shape, low=-1, high=1, seed=seed + i)))
  state = get_state_dict(layer)
  torch_layer.load_state_dict({k: torch.from_numpy(v.numpy()).to(torch_layer.state_dict()[k].dtype) for k, v in state.items()})

def check_layer(layer, torch_layer: torch.nn.Module, x_shape: tuple[int, ...], atol: float = 1e-5, randomize: bool = True) -> None:
  """Same state, same input: compare the output, then backpropagate one random upstream gradient and compare the gradients of the
  input and of each of torch's parameters (tinyc's tensor of the same name)."""
  copy_into_torch(layer, torch_layer, randomize)
  x_data = random_array(x_shape, seed=11)
  x, x_torch = Tensor(x_data, requires_grad=True), torch.tensor(x_data, requires_grad=True)
  state = get_state_dict(layer)
  for name, _ in torch_layer.named_parameters(): state[name].requires_grad = True
  out, want = layer(x), torch_layer(x_torch)
  compare(out, want, atol=atol, rtol=1e-4)
  upstream = random_array(tuple(want.shape), seed=12)
  (out * Tensor(upstream)).sum().backward()
  (want * torch.from_numpy(upstream)).sum().backward()
  names = ["input"] + [name for name, _ in torch_layer.named_parameters()]
  grads, torch_grads = [x.grad] + [state[name].grad for name in names[1:]], [x_torch.grad] + [p.grad for _, p in torch_layer.named_parameters()]
  for name, grad, torch_grad in zip(names, grads, torch_grads):
    assert grad is not None and torch_grad is not None, f"{name} got no gradient"
    assert grad.shape == tuple(torch_grad.shape), f"gradient of {name}: shape {grad.shape} != torch's {tuple(torch_grad.shape)}"
  # all the gradients in one tensor: one kernel to compile, not one per parameter (on a mismatch, each is compared for the message)
  try: compare(Tensor.cat(*[g.flatten() for g in grads]), torch.cat([g.reshape(-1) for g in torch_grads]), atol=atol, rtol=1e-4)
  except AssertionError:
    for name, grad, torch_grad in zip(names, grads, torch_grads):
      try: compare(grad, torch_grad, atol=atol, rtol=1e-4)
      except AssertionError as error: raise AssertionError(f"gradient of {name}: {error}") from None
    raise

def test_linear():
  check_layer(nn.Linear(5, 3), torch.nn.Linear(5, 3), (4, 5))
  check_layer(nn.Linear(5, 3), torch.nn.Linear(5, 3), (2, 3, 5))  # leading batch dims
  check_layer(nn.Linear(4, 2, bias=False), torch.nn.Linear(4, 2, bias=False), (3, 4))

CONV = [  # in, out, kernel, kwargs, input shape (the op itself is tested in test_autograd; here: the layer's parameters and arguments)
  (3, 4, (3, 2), {"stride": 2, "padding": 1}, (2, 3, 6, 5)), (4, 6, 3, {"groups": 2, "dilation": 2, "bias": False, "padding": (1, 0)}, (1, 4, 7, 7)),
]

@pytest.mark.parametrize("cin, cout, kernel, kwargs, shape", CONV, ids=str)
def test_conv2d(cin, cout, kernel, kwargs, shape):
  check_layer(nn.Conv2d(cin, cout, kernel, **kwargs), torch.nn.Conv2d(cin, cout, kernel, **kwargs), shape, atol=1e-4)

CONV_TRANSPOSE = [  # in, out, kernel, kwargs, input shape
  (2, 3, (3, 2), {"stride": 2, "padding": 1, "output_padding": 1}, (2, 2, 3, 4)),
  (4, 2, 2, {"groups": 2, "stride": 2, "bias": False, "dilation": 2, "padding": (1, 0)}, (1, 4, 3, 3)),
]

@pytest.mark.parametrize("cin, cout, kernel, kwargs, shape", CONV_TRANSPOSE, ids=str)
def test_conv_transpose2d(cin, cout, kernel, kwargs, shape):
  check_layer(nn.ConvTranspose2d(cin, cout, kernel, **kwargs), torch.nn.ConvTranspose2d(cin, cout, kernel, **kwargs), shape, atol=1e-4)

def test_layernorm():
  check_layer(nn.LayerNorm((3, 4), eps=1e-3), torch.nn.LayerNorm((3, 4), eps=1e-3), (2, 3, 4))
  check_layer(nn.LayerNorm(4, elementwise_affine=False), torch.nn.LayerNorm(4, elementwise_affine=False), (3, 4))

def test_groupnorm():
  check_layer(nn.GroupNorm(2, 4, eps=1e-3), torch.nn.GroupNorm(2, 4, eps=1e-3), (2, 4, 3, 3))
  check_layer(nn.GroupNorm(1, 4, affine=False), torch.nn.GroupNorm(1, 4, affine=False), (2, 4, 2, 2))

def test_instancenorm():
  check_layer(nn.InstanceNorm(3), torch.nn.InstanceNorm2d(3, affine=True), (2, 3, 4, 4))
  check_layer(nn.InstanceNorm(3, affine=False), torch.nn.InstanceNorm2d(3), (2, 3, 4, 4))

def test_embedding():
  layer, torch_layer = nn.Embedding(7, 3), torch.nn.Embedding(7, 3)
  copy_into_torch(layer, torch_layer)
  idx = np.array([[0, 6, 2], [2, 2, 5]], np.int32)  # repeated indices: their gradients add up in the row
  layer.weight.requires_grad = True
  out, want = layer(Tensor(idx)), torch_layer(torch.from_numpy(idx).long())
  compare(out, want)
  upstream = random_array(tuple(want.shape), seed=3)
  (out * Tensor(upstream)).sum().backward()
  (want * torch.from_numpy(upstream)).sum().backward()
  assert layer.weight.grad is not None and torch_layer.weight.grad is not None
  compare(layer.weight.grad, torch_layer.weight.grad)

# ***** BatchNorm2d *****

def test_batchnorm_training_and_running_stats():
  """Three training steps update running_mean/var (unbiased var, momentum 0.1) and num_batches_tracked as torch does; the gradients
  flow through the batch statistics; then eval uses the running statistics."""
  layer, torch_layer = nn.BatchNorm2d(3), torch.nn.BatchNorm2d(3)
  copy_into_torch(layer, torch_layer)
  layer.weight.requires_grad = layer.bias.requires_grad = True  # type: ignore[union-attr]
  try:
    Tensor.training = True
    torch_layer.train()
    for step in range(3):
      x_data = random_array((4, 3, 2, 2), low=-1 + step, high=2 + step, seed=step)
      x, x_torch = Tensor(x_data, requires_grad=True), torch.tensor(x_data, requires_grad=True)
      out, want = layer(x), torch_layer(x_torch)
      compare(out, want, atol=1e-5)
      upstream = random_array(tuple(want.shape), seed=10 + step)
      (out * Tensor(upstream)).sum().backward()
      (want * torch.from_numpy(upstream)).sum().backward()
      compare(x.grad, x_torch.grad, atol=1e-5)
      compare(layer.running_mean, torch_layer.running_mean)
      compare(layer.running_var, torch_layer.running_var)
      assert layer.num_batches_tracked.numpy().item() == torch_layer.num_batches_tracked.item() == step + 1
    compare(layer.weight.grad, torch_layer.weight.grad, atol=1e-5)  # accumulated over the three steps
    compare(layer.bias.grad, torch_layer.bias.grad, atol=1e-5)
  finally: Tensor.training = False
  torch_layer.eval()
  x_data = random_array((2, 3, 3, 3), seed=20)
  x, x_torch = Tensor(x_data, requires_grad=True), torch.tensor(x_data, requires_grad=True)
  out, want = layer(x), torch_layer(x_torch)
  compare(out, want, atol=1e-5)
  (out * 2).sum().backward()
  (want * 2).sum().backward()
  compare(x.grad, x_torch.grad, atol=1e-5)

def test_batchnorm_eval_and_options():
  layer, torch_layer = nn.BatchNorm2d(3), torch.nn.BatchNorm2d(3).eval()
  copy_into_torch(layer, torch_layer)
  layer.running_mean.assign(Tensor([0.5, -1.0, 0.0]))
  layer.running_var.assign(Tensor([2.0, 0.5, 1.0]))
  check_layer(layer, torch_layer, (2, 3, 3, 3), randomize=False)  # in eval (Tensor.training is False) no statistics move
  np.testing.assert_equal(layer.running_mean.numpy(), [0.5, -1.0, 0.0])
  try:
    Tensor.training = True
    check_layer(nn.BatchNorm2d(2, affine=False, momentum=0.3), torch.nn.BatchNorm2d(2, affine=False, momentum=0.3), (3, 2, 2, 2))
    check_layer(nn.BatchNorm2d(2, track_running_stats=False), torch.nn.BatchNorm2d(2, track_running_stats=False), (3, 2, 2, 2))
  finally: Tensor.training = False
  check_layer(nn.BatchNorm2d(2, track_running_stats=False), torch.nn.BatchNorm2d(2, track_running_stats=False).eval(), (3, 2, 2, 2))

# ***** initialization and state dicts *****

LAYERS = {  # name: (tinyc layer, torch layer)
  "linear": (lambda: nn.Linear(6, 4), lambda: torch.nn.Linear(6, 4)),
  "linear_no_bias": (lambda: nn.Linear(6, 4, False), lambda: torch.nn.Linear(6, 4, False)),
  "conv2d": (lambda: nn.Conv2d(4, 6, 3, groups=2), lambda: torch.nn.Conv2d(4, 6, 3, groups=2)),
  "conv_transpose2d": (lambda: nn.ConvTranspose2d(4, 6, (2, 3), groups=2), lambda: torch.nn.ConvTranspose2d(4, 6, (2, 3), groups=2)),
  "batchnorm2d": (lambda: nn.BatchNorm2d(3), lambda: torch.nn.BatchNorm2d(3)),
  "batchnorm2d_no_affine": (lambda: nn.BatchNorm2d(3, affine=False), lambda: torch.nn.BatchNorm2d(3, affine=False)),
  "batchnorm2d_no_stats": (lambda: nn.BatchNorm2d(3, track_running_stats=False), lambda: torch.nn.BatchNorm2d(3, track_running_stats=False)),
  "layernorm": (lambda: nn.LayerNorm((2, 3)), lambda: torch.nn.LayerNorm((2, 3))),
  "groupnorm": (lambda: nn.GroupNorm(2, 4), lambda: torch.nn.GroupNorm(2, 4)),
  "instancenorm": (lambda: nn.InstanceNorm(3), lambda: torch.nn.InstanceNorm2d(3, affine=True)),
  "embedding": (lambda: nn.Embedding(5, 3), lambda: torch.nn.Embedding(5, 3)),
}

@pytest.mark.parametrize("name", LAYERS)
def test_state_dict_matches_torch(name):
  """Names and shapes of get_state_dict equal torch's state_dict (so checkpoints port), with torch's constant initial values."""
  make, make_torch = LAYERS[name]
  state, torch_state = get_state_dict(make()), make_torch().state_dict()
  assert state_shapes(state) == state_shapes(torch_state)
  for key, value in torch_state.items():
    if key in ("weight", "bias") and name.startswith(("linear", "conv", "embedding")): continue  # random
    np.testing.assert_equal(state[key].numpy(), value.numpy(), err_msg=key)

@pytest.mark.parametrize("make, fan_in", [(lambda: nn.Linear(200, 150), 200), (lambda: nn.Conv2d(6, 64, (5, 4), groups=3), 2 * 20),
                                          (lambda: nn.ConvTranspose2d(6, 66, 5, groups=3), 22 * 25)], ids=["linear", "conv2d", "conv_transpose2d"])
def test_default_init_is_torch_like(make, fan_in):
  """Weights and biases uniform on +-1/sqrt(fan_in), torch's default (kaiming_uniform with a = sqrt(5)); fan_in of a transposed conv
  is out/groups * kernel, as torch computes it from weight.size(1)."""
  Tensor.manual_seed(0)
  layer, bound = make(), 1 / math.sqrt(fan_in)
  for name in ["weight", "bias"]:
    values = getattr(layer, name).numpy().ravel()
    assert np.abs(values).max() <= bound and np.abs(values).max() > 0.9 * bound, f"{name}: max |x| {np.abs(values).max()} vs bound {bound}"
    if values.size > 1000:  # uniform on [-b, b]: mean 0, std b / sqrt(3)
      assert abs(values.mean()) < 0.05 * bound and abs(values.std() - bound / math.sqrt(3)) < 0.05 * bound, (values.mean(), values.std())

def test_embedding_init_is_standard_normal():
  Tensor.manual_seed(0)
  values = nn.Embedding(100, 64).weight.numpy()
  assert abs(values.mean()) < 0.05 and abs(values.std() - 1) < 0.05, (values.mean(), values.std())
  assert np.abs(values).max() > 3  # a normal, not a bounded uniform

def test_layers_are_seeded():
  Tensor.manual_seed(1)
  first = nn.Linear(3, 2).weight.numpy()
  Tensor.manual_seed(1)
  np.testing.assert_equal(nn.Linear(3, 2).weight.numpy(), first)
