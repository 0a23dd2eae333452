"""Layer 6: optimizers (SGD, Adam, AdamW, LAMB) with torch.optim's semantics. Imports tensor.

Every update is an in-place `assign` into memory the optimizer or the parameter already owns, realized inside `step()`: so a
TinyJit capture of a training step replays the updates, and the learning rate, kept as a realized Tensor, can change between replays.
A step given `skip` (a bool Tensor: amp.GradScaler's found-inf flag) writes where(skip, old, new) into each, so the device decides.
"""
from __future__ import annotations
from typing import Iterable
import numpy as np
from tinyc.tensor import Tensor

def _owned(tensor: Tensor) -> Tensor:
  """The tensor made a realized base in place: `assign` writes into a tensor's memory only when it has its own."""
  if tensor.lazydata.base is not tensor.lazydata or tensor.lazydata.realized is None: tensor.lazydata = tensor.detach().contiguous().lazydata
  return tensor

def _assign(target: Tensor, value: Tensor, skip: Tensor | None) -> None:
  """target.assign(value), or where skip is True (a bool Tensor), target's old value."""
  target.assign(value if skip is None else skip.to(target.device).where(target.detach(), value))

class Optimizer:
  """The parameters to train (those with requires_grad not False), the learning rate, and the protocol: `_update` assigns new
  values and returns the state it touched; `step()` realizes all of it in one schedule."""
  def __init__(self, params: Iterable[Tensor], lr: float | Tensor) -> None:
    self.params: list[Tensor] = list({id(p): p for p in params if p.requires_grad is not False}.values())
    if not self.params: raise ValueError("optimizer got an empty parameter list (or every tensor in it has requires_grad=False)")
    for param in self.params: param.requires_grad = True
    if isinstance(lr, Tensor) and lr.numel() != 1: raise ValueError(f"the learning rate must be one number, got a tensor of shape {lr.shape}")
    # a Tensor lr is used itself (not copied), so the caller's later lr.assign(...).realize() reaches the optimizer too
    self._lr = _owned(lr if isinstance(lr, Tensor) else Tensor(np.array(lr, dtype=np.float32), device=self.params[0].device))
    Tensor.corealize([_owned(p) for p in self.params] + [self._lr])

  @property
  def lr(self) -> Tensor: return self._lr
  @lr.setter
  def lr(self, value: float | Tensor) -> None:
    """`opt.lr = x` writes x into the learning rate's memory, so captured (TinyJit) steps see it too."""
    value = value if isinstance(value, Tensor) else Tensor(float(value), device=self._lr.device, dtype=self._lr.dtype)
    self._lr.assign(value.reshape(self._lr.shape)).realize()

  def zero_grad(self) -> None:
    """Forget every parameter's gradient."""
    for param in self.params: param.grad = None

  def step(self, skip: Tensor | None = None) -> None:
    """Update every parameter that has a gradient (those without one are skipped, as in torch) and its state, in place; or, where
    `skip` (a bool Tensor, amp.GradScaler's found-inf flag) is True, leave all as it was, decided on the device without a sync."""
    updated = [i for i, p in enumerate(self.params) if p.grad is not None]
    for param in (self.params[i] for i in updated):
      if param.grad is not None and param.grad.shape != param.shape:
        raise ValueError(f"a gradient of shape {param.grad.shape} for a parameter of shape {param.shape}: .grad must have the parameter's shape")
    skipped = [] if skip is None else [skip]  # realized with the step: what reads it later (GradScaler.update) reads memory
    Tensor.corealize(self._update(updated, skip) + [self.params[i] for i in updated] + [self._lr] + skipped)

  def _lr_on(self, device: str) -> Tensor: return self._lr.to(device).reshape(())
  def _update(self, indices: list[int], skip: Tensor | None = None) -> list[Tensor]:
    """Assign (`_assign`) the new values of the parameters at these indices (each has a grad); return the state tensors assigned."""
    raise NotImplementedError

class SGD(Optimizer):
  """torch.optim.SGD (dampening 0): weight_decay is an L2 term added to the gradient; momentum keeps a buffer
  b <- momentum*b + g and steps along b, or along g + momentum*b with nesterov."""
  def __init__(self, params: Iterable[Tensor], lr: float | Tensor = 0.001, momentum: float = 0.0, weight_decay: float = 0.0, nesterov: bool = False):
    if nesterov and momentum <= 0: raise ValueError(f"nesterov momentum needs momentum > 0, got momentum={momentum}")
    super().__init__(params, lr)
    self.momentum, self.weight_decay, self.nesterov = momentum, weight_decay, nesterov
    # zero buffers give torch's first step (b = g) exactly, since momentum*0 + g == g
    self.buffers = [_owned(Tensor.zeros(*p.shape, device=p.device, dtype=p.dtype)) for p in self.params] if momentum else []
    Tensor.corealize(self.buffers)

  def _update(self, indices: list[int], skip: Tensor | None = None) -> list[Tensor]:
    touched = []
    for index in indices:
      param = self.params[index]
      assert param.grad is not None
      grad = param.grad.detach()
      if self.weight_decay: grad = grad + self.weight_decay * param.detach()
      if self.momentum:
        buffer = self.buffers[index]
        _assign(buffer, self.momentum * buffer + grad, skip)
        grad = grad + self.momentum * buffer if self.nesterov else buffer
        touched.append(buffer)
      _assign(param, param.detach() - self._lr_on(param.device) * grad, skip)
    return touched

class LAMB(Optimizer):
  """LAMB (You et al., 2019) as tinygrad has it: Adam's bias-corrected update plus decoupled weight decay, scaled per tensor by the
  trust ratio |param| / |update|. adam=True drops the trust ratio, which makes it AdamW; decoupled=False adds weight_decay*param to
  the gradient instead (an L2 penalty, torch.optim.Adam's weight_decay)."""
  def __init__(self, params: Iterable[Tensor], lr: float | Tensor = 0.001, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-6,
               weight_decay: float = 0.0, adam: bool = False, decoupled: bool = True):
    super().__init__(params, lr)
    self.b1, self.b2, self.eps, self.weight_decay, self.adam, self.decoupled = b1, b2, eps, weight_decay, adam, decoupled
    self.m = [_owned(Tensor.zeros(*p.shape, device=p.device, dtype=p.dtype)) for p in self.params]
    self.v = [_owned(Tensor.zeros(*p.shape, device=p.device, dtype=p.dtype)) for p in self.params]
    # per parameter, as torch counts steps per parameter (one skipped for lack of a grad does not advance): [t, 1 - b1**t, 1 - b2**t].
    # The bias corrections follow c <- c*b + (1-b) instead of coming from t: float32 1 - 0.999**t loses 4 digits to cancellation
    # at t=1, the recurrence loses none.
    self.t = [_owned(Tensor.zeros(3, device=p.device)) for p in self.params]
    self._decay, self._increment = Tensor([1.0, b1, b2], device=self.lr.device), Tensor([1.0, 1.0 - b1, 1.0 - b2], device=self.lr.device)
    Tensor.corealize(self.m + self.v + self.t)

  def _update(self, indices: list[int], skip: Tensor | None = None) -> list[Tensor]:
    touched = []
    for index in indices:
      param = self.params[index]
      assert param.grad is not None
      m, v, t = self.m[index], self.v[index], self.t[index]
      grad, weight = param.grad.detach(), param.detach()
      if self.weight_decay and not self.decoupled: grad = grad + self.weight_decay * weight
      _assign(t, t * self._decay.to(t.device) + self._increment.to(t.device), skip)
      _assign(m, m + (grad - m) * (1.0 - self.b1), skip)  # torch's lerp
      _assign(v, v * self.b2 + grad * grad * (1.0 - self.b2), skip)
      update = (m / t[1]) / (v.sqrt() / t[2].sqrt() + self.eps)  # t[1], t[2]: the bias corrections, in float32 for half params too
      if self.weight_decay and self.decoupled: update = update + self.weight_decay * weight
      if not self.adam:
        weight_norm, update_norm = weight.square().sum().sqrt(), update.square().sum().sqrt()
        update = update * (weight_norm > 0).where((update_norm > 0).where(weight_norm / update_norm, 1.0), 1.0)
      _assign(param, weight - self._lr_on(param.device) * update, skip)
      touched += [m, v, t]
    return touched

class Adam(LAMB):
  """torch.optim.Adam: weight_decay is an L2 penalty added to the gradient."""
  def __init__(self, params: Iterable[Tensor], lr: float | Tensor = 0.001, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
               weight_decay: float = 0.0):
    super().__init__(params, lr, b1, b2, eps, weight_decay, adam=True, decoupled=False)

class AdamW(LAMB):
  """torch.optim.AdamW: weight decay decoupled from the gradient (param -= lr * weight_decay * param)."""
  def __init__(self, params: Iterable[Tensor], lr: float | Tensor = 0.001, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8,
               weight_decay: float = 0.01):
    super().__init__(params, lr, b1, b2, eps, weight_decay, adam=True, decoupled=True)
