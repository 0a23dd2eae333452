"""Mixed precision (tinyc/amp.py) against torch.amp on the CPU: which ops autocast runs in 16 bits and which in float32, that its
matmuls read 16-bit buffers (the tensor cores' form), gradients of float32 master weights, training under bf16 and fp16 autocast,
and GradScaler's scale, growth tracker and skipped steps, eager and inside TinyJit replays."""
from __future__ import annotations
import math
import numpy as np
import pytest
import torch
from tinyc import Tensor, autocast, dtypes, nn
from tinyc.amp import GradScaler
from tinyc.codegen.kernel import GPU_MAX_UPCAST, Kernel, KernelTarget
from tinyc.helpers import Context
from tinyc.jit import JitError, TinyJit
from tinyc.nn.optim import SGD, AdamW, Optimizer
from tinyc.schedule import create_schedule
from helpers import TORCH_DTYPE

H200 = KernelTarget(has_local=True, max_upcast=GPU_MAX_UPCAST, tensor_cores=True, local_memory_bytes=227 * 1024, compute_units=132)
HALF_DTYPES = (dtypes.bfloat16, dtypes.float16)

def _random(*shape: int, seed: int = 0) -> np.ndarray: return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)

@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_matmuls_run_in_16_bits_and_sensitive_ops_in_float32(tinyc_device: str | None, dtype) -> None:
  x, weight, bias, image, kernel = (Tensor(_random(*shape, seed=i)) for i, shape in enumerate([(4, 8), (3, 8), (3,), (1, 2, 5, 5), (4, 2, 3, 3)]))
  with autocast(dtype):
    out = x.linear(weight.T, bias)
    sixteen = {"linear": out, "matmul": x @ weight.T, "conv2d": image.conv2d(kernel, bias=Tensor.zeros(4)),
               "attention": x.reshape(1, 4, 8).scaled_dot_product_attention(x.reshape(1, 4, 8), x.reshape(1, 4, 8), is_causal=True),
               "relu": out.relu(), "add": out + 1, "max": out.max(), "cast back": out.float().cast(dtype)}
    thirty_two = {"softmax": out.softmax(), "log_softmax": out.log_softmax(), "layernorm": out.layernorm(), "sum": out.sum(),
                  "mean": out.mean(), "exp": out.exp(), "log": out.abs().log(), "16 + 32 bits": out + x[:, :3],
                  "cross-entropy": out.sparse_categorical_crossentropy(Tensor([0, 1, 2, 0])), "embedding": nn.Embedding(5, 3)(Tensor([[1, 2]])),
                  "float64 matmul": x.cast(dtypes.float64) @ weight.T}
    with autocast(enabled=False): off = {"linear": x.linear(weight.T, bias), "softmax": out.softmax(), "sum": out.sum()}
  assert {name: t.dtype for name, t in sixteen.items()} == {name: dtype for name in sixteen}
  assert {name: t.dtype for name, t in thirty_two.items()} == {name: dtypes.float32 for name in thirty_two} | {"float64 matmul": dtypes.float64}
  assert {name: t.dtype for name, t in off.items()} == {"linear": dtypes.float32, "softmax": dtype, "sum": dtype}
  assert x.linear(weight.T).dtype == dtypes.float32 and out.softmax().dtype == dtype  # outside it, nothing changes
  torch_x, torch_w = torch.from_numpy(x.numpy()), torch.from_numpy(weight.numpy())
  with torch.autocast("cpu", dtype=TORCH_DTYPE[dtype]):  # the ops torch's CPU autocast lists give the same dtypes
    torch_out = torch.nn.functional.linear(torch_x, torch_w, torch.from_numpy(bias.numpy()))
    assert torch_out.dtype == (torch_x @ torch_w.T).dtype == TORCH_DTYPE[dtype]
    assert torch.nn.functional.cross_entropy(torch_out, torch.tensor([0, 1, 2, 0])).dtype == torch.float32
  np.testing.assert_allclose(out.float().numpy(), torch_out.float().numpy(), rtol=1e-2, atol=1e-2)

def test_autocast_rejects_a_dtype_it_cannot_compute_in() -> None:
  with pytest.raises(ValueError, match="float16 or bfloat16"):
    with autocast(dtypes.float32): pass
  with autocast(dtypes.float32, enabled=False): assert (Tensor.ones(2, 2) @ Tensor.ones(2, 2)).dtype == dtypes.float32
  with Context(AUTOCAST="float8"), pytest.raises(ValueError, match="AUTOCAST='float8'"): Tensor.ones(2, 2) @ Tensor.ones(2, 2)

def test_autocast_matmul_reads_16_bit_buffers_in_the_weights_own_layout() -> None:
  x, weight = Tensor(_random(64, 32)).realize(), Tensor(_random(48, 32, seed=1)).realize()
  with autocast(), Context(PACK=0): out = x.linear(weight.T)
  *casts, matmul = create_schedule([out.lazydata])
  assert len(casts) == 2 and all(item.outs[0].dtype == dtypes.bfloat16 for item in casts)  # torch's cast weight: a kernel each
  kernel = Kernel(matmul.ast, H200)
  assert kernel.tensor_core_operands() == [1, 2] and [buf.dtype for buf in kernel.bufs] == [dtypes.bfloat16] * 3
  assert kernel.sts[2].real_strides()[-1] == 1  # the weight's copy is (out, in) as the weight is: contiguous along the reduce

def _mlp(seed: int = 0) -> tuple[list[Tensor], torch.nn.Sequential]:
  """Linear(12, 16) -> gelu -> LayerNorm(16) -> Linear(16, 5), the same weights in tinyc (a list) and in torch."""
  model = torch.nn.Sequential(torch.nn.Linear(12, 16), torch.nn.GELU(approximate="tanh"), torch.nn.LayerNorm(16), torch.nn.Linear(16, 5))
  torch.manual_seed(seed)
  for p in model.parameters(): torch.nn.init.normal_(p, std=0.5)
  return [Tensor(p.detach().numpy().copy(), requires_grad=True) for p in model.parameters()], model

def _forward(params: list[Tensor], x: Tensor) -> Tensor:
  w1, b1, w2, b2, w3, b3 = params
  return (x.linear(w1.T, b1).gelu().layernorm() * w2 + b2).linear(w3.T, b3)

@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_master_weights_get_float32_gradients_that_match_torch(tinyc_device: str | None, dtype) -> None:
  params, model = _mlp()
  x, labels = _random(16, 12), np.arange(16) % 5  # (the shapes _train uses: the same kernels)
  with autocast(dtype): loss = _forward(params, Tensor(x)).sparse_categorical_crossentropy(Tensor(labels.astype(np.int32)))
  loss.backward()
  with torch.autocast("cpu", dtype=TORCH_DTYPE[dtype]):
    torch_loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(labels))
  torch_loss.backward()
  assert loss.dtype == dtypes.float32 and all(p.dtype == p.grad.dtype == dtypes.float32 for p in params if p.grad is not None)
  np.testing.assert_allclose(loss.numpy(), torch_loss.item(), rtol=2e-2)
  for param, torch_param in zip(params, model.parameters()):
    assert param.grad is not None and torch_param.grad is not None
    expected = torch_param.grad.numpy()
    np.testing.assert_allclose(param.grad.numpy(), expected, atol=3e-2 * np.abs(expected).max(), rtol=0)  # bf16: 8 bits of mantissa

def _train(params: list[Tensor], optimizer: Optimizer, steps: int, dtype, scaler: GradScaler | None = None, jit: bool = False) -> list[float]:
  def step(x: Tensor, y: Tensor) -> Tensor:
    optimizer.zero_grad()
    with autocast(dtype, enabled=dtype != dtypes.float32): loss = _forward(params, x).sparse_categorical_crossentropy(y)
    if scaler is None:
      loss.backward()
      optimizer.step()
    else:
      scaler.scale(loss).backward()
      scaler.step(optimizer)
      scaler.update()
    return loss.realize()
  run = TinyJit(step) if jit else step
  return [run(Tensor(_random(16, 12)), Tensor(np.arange(16, dtype=np.int32) % 5)).item() for _ in range(steps)]

def _torch_train(model: torch.nn.Module, steps: int, dtype, scaler: torch.amp.GradScaler | None = None) -> list[float]:
  optimizer, losses = torch.optim.AdamW(model.parameters(), lr=1e-2), []
  for _ in range(steps):
    optimizer.zero_grad()
    with torch.autocast("cpu", dtype=TORCH_DTYPE[dtype], enabled=dtype != dtypes.float32):
      loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(_random(16, 12))), torch.arange(16) % 5)
    if scaler is None:
      loss.backward()
      optimizer.step()
    else:
      scaler.scale(loss).backward()
      scaler.step(optimizer)
      scaler.update()
    losses.append(loss.item())
  return losses

@pytest.mark.parametrize("dtype", HALF_DTYPES)
def test_training_under_autocast_follows_torch(tinyc_device: str | None, dtype) -> None:
  """bf16 without a scaler, fp16 with one (TinyJit replays it), against the same steps under torch's autocast and GradScaler."""
  params, model = _mlp()
  scaled = dtype == dtypes.float16
  scaler, torch_scaler = (GradScaler(init_scale=2.0 ** 10), torch.amp.GradScaler("cpu", init_scale=2.0 ** 10)) if scaled else (None, None)
  losses = _train(params, AdamW(params, lr=1e-2), 10, dtype, scaler, jit=True)
  expected = _torch_train(model, 10, dtype, torch_scaler)
  np.testing.assert_allclose(losses, expected, rtol=3e-2)
  assert losses[-1] < 0.6 * losses[0]
  assert all(p.dtype == dtypes.float32 for p in params)
  if scaler is not None and torch_scaler is not None: assert scaler.get_scale() == torch_scaler.get_scale()

def _linear_step(weight: Tensor, optimizer: Optimizer, scaler: GradScaler, x: Tensor) -> Tensor:
  optimizer.zero_grad()
  loss = (x @ weight).square().sum()
  scaler.scale(loss).backward()
  scaler.step(optimizer)
  scaler.update()
  return loss.realize()

# inputs of each step: a step whose input holds inf or nan makes inf/nan gradients, which the scaler must skip
BAD_STEPS = {2: math.inf, 3: math.nan, 9: -math.inf}
def _inputs(step: int) -> np.ndarray:
  x = _random(3, 4, seed=step)
  if step in BAD_STEPS: x[1, 2] = BAD_STEPS[step]
  return x

@pytest.mark.parametrize("jit", [False, True])
@pytest.mark.parametrize("optimizer_kind", ["sgd", "adamw"])
def test_grad_scaler_skips_steps_and_moves_its_scale_as_torch(tinyc_device: str | None, optimizer_kind: str, jit: bool) -> None:
  initial = _random(4, 2, seed=100)
  weight, torch_weight = Tensor(initial.copy(), requires_grad=True), torch.tensor(initial, requires_grad=True)
  make = {"sgd": (lambda p: SGD(p, lr=0.01, momentum=0.9), lambda p: torch.optim.SGD(p, lr=0.01, momentum=0.9)),
          "adamw": (lambda p: AdamW(p, lr=0.01), lambda p: torch.optim.AdamW(p, lr=0.01))}[optimizer_kind]
  optimizer, torch_optimizer = make[0]([weight]), make[1]([torch_weight])
  scaler, torch_scaler = GradScaler(init_scale=8.0, growth_interval=3), torch.amp.GradScaler("cpu", init_scale=8.0, growth_interval=3)
  step, scales = TinyJit(_linear_step) if jit else _linear_step, [8.0]
  for number in range(12):
    step(weight, optimizer, scaler, Tensor(_inputs(number)))
    torch_optimizer.zero_grad()
    torch_scaler.scale((torch.from_numpy(_inputs(number)) @ torch_weight).square().sum()).backward()
    torch_scaler.step(torch_optimizer)
    torch_scaler.update()
    assert (scaler.get_scale(), scaler.get_growth_tracker()) == (torch_scaler.get_scale(), torch_scaler._get_growth_tracker()), number
    np.testing.assert_allclose(weight.numpy(), torch_weight.detach().numpy(), rtol=1e-5, atol=1e-6, err_msg=f"step {number}")
    scales.append(scaler.get_scale())
  assert scales == [8.0, 8.0, 8.0, 4.0, 2.0, 2.0, 2.0, 4.0, 4.0, 4.0, 2.0, 2.0, 2.0]  # backed off at the bad steps, grown after 3 clean ones

def test_grad_scaler_keeps_its_scale_where_growing_it_would_overflow() -> None:
  weight = Tensor(_random(4, 2), requires_grad=True)
  scaler, optimizer = GradScaler(init_scale=3e38, growth_interval=1), SGD([weight], lr=0.0)
  _linear_step(weight, optimizer, scaler, Tensor(_random(3, 4) * 1e-30))
  torch_scaler, torch_weight = torch.amp.GradScaler("cpu", init_scale=3e38, growth_interval=1), torch.tensor(_random(4, 2), requires_grad=True)
  torch_scaler.scale((torch.from_numpy(_random(3, 4) * 1e-30) @ torch_weight).square().sum()).backward()
  torch_scaler.step(torch.optim.SGD([torch_weight], lr=0.0))
  torch_scaler.update()
  assert (scaler.get_scale(), scaler.get_growth_tracker()) == (torch_scaler.get_scale(), torch_scaler._get_growth_tracker()) == (np.float32(3e38), 0)

def test_grad_scaler_unscale_lets_gradients_be_clipped_and_states_its_order() -> None:
  weight = Tensor(np.ones((4, 2), dtype=np.float32), requires_grad=True)
  scaler, optimizer = GradScaler(init_scale=4.0), SGD([weight], lr=1.0)
  scaler.scale((Tensor(np.ones((3, 4), dtype=np.float32)) @ weight).sum()).backward()
  scaler.unscale_(optimizer)
  assert weight.grad is not None
  np.testing.assert_allclose(weight.grad.numpy(), np.full((4, 2), 3.0))  # d/dw of sum(x @ w): the column sums of x, unscaled
  with pytest.raises(RuntimeError, match="already been called"): scaler.unscale_(optimizer)
  scaler.step(optimizer)
  np.testing.assert_allclose(weight.numpy(), np.full((4, 2), -2.0))
  with pytest.raises(RuntimeError, match="step\\(\\) has already been called"): scaler.step(optimizer)
  with pytest.raises(RuntimeError, match="after step"): scaler.unscale_(optimizer)
  scaler.update()
  with pytest.raises(RuntimeError, match="No inf checks"): scaler.update()
  half = Tensor(np.ones(2, dtype=np.float16), requires_grad=True)
  half_optimizer = SGD([half], lr=1.0)
  scaler.scale(half.sum()).backward()
  with pytest.raises(ValueError, match="FP16 gradients"): scaler.unscale_(half_optimizer)

def test_disabled_grad_scaler_steps_as_the_optimizer_does() -> None:
  weight = Tensor(np.ones((4, 2), dtype=np.float32), requires_grad=True)
  scaler, optimizer = GradScaler(enabled=False), SGD([weight], lr=1.0)
  loss = (Tensor(np.ones((3, 4), dtype=np.float32)) @ weight).sum()
  assert scaler.scale(loss) is loss
  loss.backward()
  scaler.step(optimizer)
  scaler.update()
  np.testing.assert_allclose(weight.numpy(), np.full((4, 2), -2.0))
  assert scaler.get_scale() == 1.0

def test_a_step_captured_inside_autocast_replays_in_16_bits_and_only_there(tinyc_device: str | None) -> None:
  weight = Tensor(_random(8, 4)).realize()
  @TinyJit
  def project(x: Tensor) -> Tensor: return (x @ weight).realize()
  for i in range(4):  # run, capture, then two replays
    with autocast(): result = project(Tensor(_random(2, 8, seed=i)))
    expected = torch.from_numpy(_random(2, 8, seed=i)).bfloat16() @ torch.from_numpy(weight.numpy()).bfloat16()
    assert result.dtype == dtypes.bfloat16
    np.testing.assert_allclose(result.float().numpy(), expected.float().numpy(), rtol=1e-2, atol=1e-2)
  with pytest.raises(JitError, match="AUTOCAST"): project(Tensor(_random(2, 8)))

def test_autocast_training_matmuls_all_read_16_bit_buffers() -> None:
  """The forward's, the input gradient's and the weight gradient's products read 16-bit buffers (the tensor cores' form): the
  backward's gradient of the product is stored in 16 bits, and a stored 16-bit buffer widened to float32 is recomputed where read.
  (The widened copies read by two products were stored as float32, rule 2, and the three ran on float32 cores.)"""
  x, weight = Tensor(_random(64, 256), requires_grad=True).realize(), Tensor(_random(48, 256, seed=1), requires_grad=True).realize()
  with autocast(), Context(PACK=0):
    loss = (x.linear(weight.T).float() * Tensor(_random(64, 48, seed=2))).sum()
    loss.backward()
    assert x.grad is not None and weight.grad is not None
    schedule = create_schedule([x.grad.lazydata, weight.grad.lazydata, loss.lazydata])
  products = [kernel for item in schedule if len((kernel := Kernel(item.ast, H200)).full_shape) == 3]
  assert len(products) == 3 and all(kernel.tensor_core_operands() for kernel in products)
