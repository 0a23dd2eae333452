"""nn.optim against torch.optim (and LAMB against a numpy reference), with hand-set gradients so autograd is not under test here."""
import numpy as np
import pytest
import torch
from tinyc import Tensor
from tinyc.jit import TinyJit
from tinyc.nn.optim import LAMB, SGD, Adam, AdamW

SHAPES = [(3, 4), (5,), ()]
STEPS = 5

def make_data(seed: int = 0) -> tuple[list[np.ndarray], list[list[np.ndarray]]]:
  rng = np.random.default_rng(seed)
  inits = [rng.standard_normal(s).astype(np.float32) for s in SHAPES]
  grads = [[rng.standard_normal(s).astype(np.float32) for s in SHAPES] for _ in range(STEPS)]
  return inits, grads

def torch_optimizer(name: str, params: list[torch.Tensor], kwargs: dict) -> torch.optim.Optimizer:
  kwargs = dict(kwargs)
  if "b1" in kwargs or "b2" in kwargs: kwargs["betas"] = (kwargs.pop("b1", 0.9), kwargs.pop("b2", 0.999))
  return {"SGD": torch.optim.SGD, "Adam": torch.optim.Adam, "AdamW": torch.optim.AdamW}[name](params, **kwargs)

OURS = {"SGD": SGD, "Adam": Adam, "AdamW": AdamW}
CASES = [
  ("SGD", {}), ("SGD", {"lr": 0.1}), ("SGD", {"lr": 0.1, "momentum": 0.9}), ("SGD", {"lr": 0.1, "momentum": 0.9, "nesterov": True}),
  ("SGD", {"lr": 0.1, "weight_decay": 0.1}), ("SGD", {"lr": 0.05, "momentum": 0.5, "weight_decay": 0.2, "nesterov": True}),
  ("Adam", {}), ("Adam", {"lr": 0.1}), ("Adam", {"lr": 0.05, "weight_decay": 0.1}), ("Adam", {"lr": 0.02, "b1": 0.5, "b2": 0.9, "eps": 1e-3}),
  ("AdamW", {}), ("AdamW", {"lr": 0.1}), ("AdamW", {"lr": 0.05, "weight_decay": 0.3, "b1": 0.8, "b2": 0.99}),
]

def run_both(name: str, kwargs: dict, skip: dict[int, set[int]] | None = None) -> None:
  """Step ours and torch's side by side; skip[step] is the set of parameters whose grad is None in that step."""
  inits, grads = make_data()
  ours = [Tensor(x) for x in inits]
  theirs = [torch.tensor(x, requires_grad=True) for x in inits]
  optimizer, reference = OURS[name](ours, **kwargs), torch_optimizer(name, theirs, kwargs)
  for step in range(STEPS):
    for i, (p, q, g) in enumerate(zip(ours, theirs, grads[step])):
      skipped = skip is not None and i in skip.get(step, set())
      p.grad, q.grad = (None, None) if skipped else (Tensor(g), torch.tensor(g))
    optimizer.step(); reference.step()
    for i, (p, q) in enumerate(zip(ours, theirs)):
      np.testing.assert_allclose(p.numpy(), q.detach().numpy(), rtol=1e-5, atol=1e-6, err_msg=f"{name}{kwargs} step {step} param {i}")

@pytest.mark.parametrize("name,kwargs", CASES, ids=[f"{n}-{'-'.join(f'{k}={v}' for k, v in kw.items()) or 'default'}" for n, kw in CASES])
def test_matches_torch(name, kwargs):
  run_both(name, kwargs)

@pytest.mark.parametrize("name,kwargs", [("SGD", {"lr": 0.1, "momentum": 0.9}), ("Adam", {"lr": 0.1}), ("AdamW", {"lr": 0.1})])
def test_param_without_grad_is_skipped_like_torch(name, kwargs):
  # torch leaves such a parameter, its momentum and its step count alone: its bias correction later starts from step 1
  run_both(name, kwargs, skip={0: {1}, 1: {1, 2}, 3: {0}})

# ***** LAMB against numpy *****

def lamb_reference(inits, grads, lr, b1, b2, eps, wd, adam):
  params = [x.astype(np.float64) for x in inits]
  m, v = [np.zeros_like(p) for p in params], [np.zeros_like(p) for p in params]
  history = []
  for t, step_grads in enumerate(grads, start=1):
    for i, g in enumerate(step_grads):
      m[i] = b1 * m[i] + (1 - b1) * g
      v[i] = b2 * v[i] + (1 - b2) * g * g
      update = (m[i] / (1 - b1 ** t)) / (np.sqrt(v[i] / (1 - b2 ** t)) + eps) + wd * params[i]
      weight_norm, update_norm = np.linalg.norm(params[i]), np.linalg.norm(update)
      trust = 1.0 if adam or weight_norm == 0 or update_norm == 0 else weight_norm / update_norm
      params[i] = params[i] - lr * trust * update
    history.append([p.copy() for p in params])
  return history

@pytest.mark.parametrize("kwargs", [{}, {"lr": 0.1, "weight_decay": 0.01}, {"lr": 0.05, "b1": 0.8, "b2": 0.95, "eps": 1e-4, "weight_decay": 0.1},
                                    {"lr": 0.1, "weight_decay": 0.1, "adam": True}])
def test_lamb_matches_numpy_reference(kwargs):
  inits, grads = make_data(1)
  inits[1] = np.zeros_like(inits[1])  # |param| = 0: the trust ratio falls back to 1
  full = {"lr": 0.001, "b1": 0.9, "b2": 0.999, "eps": 1e-6, "weight_decay": 0.0, "adam": False} | kwargs
  expected = lamb_reference(inits, grads, full["lr"], full["b1"], full["b2"], full["eps"], full["weight_decay"], full["adam"])
  params = [Tensor(x) for x in inits]
  optimizer = LAMB(params, **kwargs)
  for step in range(STEPS):
    for p, g in zip(params, grads[step]): p.grad = Tensor(g)
    optimizer.step()
    for i, p in enumerate(params): np.testing.assert_allclose(p.numpy(), expected[step][i], rtol=1e-5, atol=1e-6, err_msg=f"step {step} param {i}")

# ***** in place, TinyJit, learning rate *****

def optimizers() -> list:
  return [lambda ps: SGD(ps, lr=0.1, momentum=0.9, nesterov=True), lambda ps: Adam(ps, lr=0.1), lambda ps: AdamW(ps, lr=0.1),
          lambda ps: LAMB(ps, lr=0.1, weight_decay=0.01)]

@pytest.mark.parametrize("make", optimizers(), ids=["SGD", "Adam", "AdamW", "LAMB"])
def test_step_updates_params_and_state_in_place(make):
  inits, grads = make_data()
  params = [Tensor(x) for x in inits]
  optimizer = make(params)
  state = [t for attribute in vars(optimizer).values() if isinstance(attribute, list) for t in attribute if isinstance(t, Tensor)]
  state = [t for t in state if all(t is not p for p in params)] + [optimizer.lr]
  tensors = params + state
  assert len(state) > len(params)
  buffers = [t.lazydata.base.realized for t in tensors]
  assert all(b is not None for b in buffers)
  for step in range(2):
    before = [t.numpy().copy() for t in params]
    for p, g in zip(params, grads[step]): p.grad = Tensor(g)
    optimizer.step()
    assert all(t.lazydata.base.realized is b for t, b in zip(tensors, buffers)), "step() must write into the existing buffers"
    assert all(t.lazydata.base is t.lazydata for t in tensors), "after step() every parameter and state tensor is realized"
    assert all(not np.allclose(b, p.numpy()) for b, p in zip(before, params))

@pytest.mark.parametrize("make", optimizers(), ids=["SGD", "Adam", "AdamW", "LAMB"])
def test_jitted_step_matches_unjitted(make):
  inits, grads = make_data()
  plain, jitted = [Tensor(x) for x in inits], [Tensor(x) for x in inits]
  plain_opt, jit_opt = make(plain), make(jitted)
  @TinyJit
  def train_step(*step_grads: Tensor) -> None:
    for p, g in zip(jitted, step_grads): p.grad = g
    jit_opt.step()
  for step in range(STEPS):
    for p, g in zip(plain, grads[step]): p.grad = Tensor(g)
    plain_opt.step()
    train_step(*[Tensor(g) for g in grads[step]])
    for i, (p, q) in enumerate(zip(plain, jitted)): np.testing.assert_allclose(q.numpy(), p.numpy(), rtol=1e-6, err_msg=f"step {step} param {i}")
  assert train_step.calls == 2 and train_step.steps, "the last calls must have been replays"

def test_changing_lr_reaches_jit_replays():
  inits, grads = make_data()
  params, reference = [Tensor(x) for x in inits], [torch.tensor(x, requires_grad=True) for x in inits]
  optimizer, torch_opt = Adam(params, lr=0.1), torch.optim.Adam(reference, lr=0.1)
  @TinyJit
  def train_step(*step_grads: Tensor) -> None:
    for p, g in zip(params, step_grads): p.grad = g
    optimizer.step()
  for step, lr in enumerate([0.1, 0.1, 0.1, 0.01, 0.5]):
    optimizer.lr = lr
    for group in torch_opt.param_groups: group["lr"] = lr
    for q, g in zip(reference, grads[step]): q.grad = torch.tensor(g)
    train_step(*[Tensor(g) for g in grads[step]])
    torch_opt.step()
    for p, q in zip(params, reference): np.testing.assert_allclose(p.numpy(), q.detach().numpy(), rtol=1e-5, atol=1e-6, err_msg=f"step {step}")

def test_lr_tensor_is_shared_with_the_caller():
  lr = Tensor([0.5])
  param = Tensor([1.0, 2.0])
  optimizer = SGD([param], lr=lr)
  assert optimizer.lr is lr
  lr.assign(Tensor([0.25])).realize()
  param.grad = Tensor([4.0, 8.0])
  optimizer.step()
  np.testing.assert_allclose(param.numpy(), [0.0, 0.0])
  optimizer.lr = 0.5  # a float fills the caller's (1,)-shaped tensor
  assert lr.tolist() == [0.5]

# ***** parameter handling *****

def test_params_without_requires_grad_are_left_out():
  a, b, c = Tensor([1.0]), Tensor([2.0], requires_grad=False), Tensor([3.0], requires_grad=True)
  optimizer = SGD([a, b, c, a], lr=1.0)
  assert [id(p) for p in optimizer.params] == [id(a), id(c)]  # deduplicated, b left out
  assert a.requires_grad is True and b.requires_grad is False

def test_zero_grad_and_step_without_grads():
  param = Tensor([1.0, 2.0])
  optimizer = Adam([param], lr=0.1)
  param.grad = Tensor([1.0, 1.0])
  optimizer.zero_grad()
  assert param.grad is None
  optimizer.step()
  np.testing.assert_array_equal(param.numpy(), [1.0, 2.0])
  np.testing.assert_array_equal(optimizer.t[0].numpy(), [0.0, 0.0, 0.0])  # no update, so no step counted

def test_step_counter_counts_updates():
  param = Tensor([1.0])
  optimizer = AdamW([param], b1=0.5, b2=0.75)
  for _ in range(3):
    param.grad = Tensor([1.0])
    optimizer.step()
  np.testing.assert_allclose(optimizer.t[0].numpy(), [3.0, 1 - 0.5 ** 3, 1 - 0.75 ** 3], rtol=1e-6)

def test_lazy_param_gets_its_own_memory():
  param = Tensor.zeros(2, 2) + 1  # unrealized: the optimizer realizes it so updates can be in place
  optimizer = SGD([param], lr=1.0)
  buffer = param.lazydata.base.realized
  assert buffer is not None
  param.grad = Tensor(np.ones((2, 2), dtype=np.float32))
  optimizer.step()
  assert param.lazydata.base.realized is buffer
  np.testing.assert_array_equal(param.numpy(), np.zeros((2, 2)))

def test_errors():
  with pytest.raises(ValueError, match="empty parameter list"): SGD([], lr=0.1)
  with pytest.raises(ValueError, match="empty parameter list"): SGD([Tensor([1.0], requires_grad=False)], lr=0.1)
  with pytest.raises(ValueError, match="nesterov"): SGD([Tensor([1.0])], nesterov=True)
  with pytest.raises(ValueError, match="learning rate must be one number"): SGD([Tensor([1.0])], lr=Tensor([0.1, 0.2]))
  param = Tensor([1.0, 2.0])
  optimizer = SGD([param])
  param.grad = Tensor([1.0, 2.0, 3.0])
  with pytest.raises(ValueError, match=r"gradient of shape \(3,\) for a parameter of shape \(2,\)"): optimizer.step()
