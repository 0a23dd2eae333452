"""Layer 6: mixed-precision training as torch.amp has it: `autocast` runs matmuls and convs in 16 bits beside float32 master weights,
and `GradScaler` scales a float16 loss, skipping the steps whose gradients overflow, decided on the device. Imports helpers, dtype,
device, tensor, nn.optim.
"""
from __future__ import annotations
import contextlib, math
from typing import Iterator
import numpy as np
from tinyc.dtype import DType, dtypes
from tinyc.helpers import Context
from tinyc.device import Device
from tinyc.tensor import Tensor
from tinyc.nn.optim import Optimizer

@contextlib.contextmanager
def autocast(dtype: DType = dtypes.bfloat16, enabled: bool = True) -> Iterator[None]:
  """As torch.autocast: inside it matmul, linear, conv and scaled_dot_product_attention cast float32 inputs to `dtype` and return
  `dtype`; exp, log, sqrt, sigmoid, softmax, log_softmax, sum, mean, var (so layernorm and the losses) take 16-bit inputs in float32
  and return float32; other ops keep their inputs' dtypes. Ops read it when they are built, so a TinyJit step captured inside replays so."""
  if enabled and dtype not in (dtypes.float16, dtypes.bfloat16):
    raise ValueError(f"autocast computes in float16 or bfloat16, not {dtype}: for float32 leave it out (or pass enabled=False)")
  with Context(AUTOCAST=dtype.name if enabled else ""): yield

class GradScaler:
  """torch.amp.GradScaler for float16 training: `scale(loss).backward()`, `step(optimizer)` divides the gradients by the scale and
  skips the step where any is inf or nan, `update()` multiplies the scale by backoff_factor after a skipped step, and by growth_factor
  after growth_interval steps in a row without one. The flag and the scale stay on the device (no sync), so TinyJit replays it all."""
  def __init__(self, device: str | None = None, init_scale: float = 2.0 ** 16, growth_factor: float = 2.0, backoff_factor: float = 0.5,
               growth_interval: int = 2000, enabled: bool = True) -> None:
    if growth_factor <= 1.0 or not 0.0 < backoff_factor < 1.0 or growth_interval < 1:
      raise ValueError(f"GradScaler needs growth_factor > 1 (got {growth_factor}), 0 < backoff_factor < 1 ({backoff_factor}) and "
                       f"growth_interval >= 1 ({growth_interval})")
    self.growth_factor, self.backoff_factor, self.growth_interval, self.enabled = growth_factor, backoff_factor, growth_interval, enabled
    device = device or Device.DEFAULT
    self._scale = Tensor(np.array(init_scale, dtype=np.float32), device=device)
    self._growth_tracker = Tensor(np.array(0, dtype=np.int32), device=device)  # steps in a row without an inf or nan
    self._found_inf: dict[int, Tensor] = {}  # per optimizer unscaled since the last update (by id): whether a gradient was inf or nan
    self._stepped: set[int] = set()

  def scale(self, outputs: Tensor) -> Tensor:
    """outputs times the scale (outputs themselves when disabled)."""
    return outputs * self._scale.to(outputs.device) if self.enabled else outputs

  def unscale_(self, optimizer: Optimizer) -> None:
    """Divide the optimizer's gradients by the scale (replacing each .grad: e.g. to clip them) and note whether any is inf or nan."""
    if not self.enabled: return
    if id(optimizer) in self._stepped: raise RuntimeError("unscale_() is being called after step().")
    if id(optimizer) in self._found_inf: raise RuntimeError("unscale_() has already been called on this optimizer since the last update().")
    params = [param for param in optimizer.params if param.grad is not None]
    if any(param.grad is not None and param.grad.dtype == dtypes.float16 for param in params):
      raise ValueError("Attempting to unscale FP16 gradients: keep the parameters float32 (master weights) and let autocast cast them")
    flags = []
    for param in params:
      assert param.grad is not None
      param.grad = param.grad * self._scale.to(param.device).reciprocal()
      flags.append((param.grad * 0).sum().to(self._scale.device))  # nan where an element is inf or nan (inf * 0, nan * 0), else 0
    self._found_inf[id(optimizer)] = Tensor.stack(flags).sum() != 0 if flags else Tensor(False, device=self._scale.device)

  def step(self, optimizer: Optimizer) -> None:
    """Unscale the gradients (unless unscale_ did) and step the optimizer, which keeps every old value if any was inf or nan."""
    if not self.enabled: return optimizer.step()
    if id(optimizer) in self._stepped: raise RuntimeError("step() has already been called since the last update().")
    if id(optimizer) not in self._found_inf: self.unscale_(optimizer)
    optimizer.step(skip=self._found_inf[id(optimizer)])
    self._stepped.add(id(optimizer))

  def update(self, new_scale: float | None = None) -> None:
    """Back off the scale if a step since the last update found an inf or nan, else count a clean step and grow the scale after
    growth_interval of them (where the grown scale is finite); or set the scale to new_scale."""
    if not self.enabled: return
    if new_scale is not None: self._scale.assign(Tensor(float(new_scale), device=self._scale.device))
    else:
      if not self._found_inf: raise RuntimeError("No inf checks were recorded prior to update: call step(optimizer) (or unscale_) first.")
      found = Tensor.stack(list(self._found_inf.values())).max()
      clean_steps = found.where(0, self._growth_tracker + 1)
      grown, grow = self._scale * self.growth_factor, clean_steps == self.growth_interval
      self._scale.assign(found.where(self._scale * self.backoff_factor, (grow & (grown < math.inf)).where(grown, self._scale)))
      self._growth_tracker.assign(grow.where(0, clean_steps))
    Tensor.corealize([self._scale, self._growth_tracker])
    self._found_inf, self._stepped = {}, set()

  def get_scale(self) -> float:
    """The current scale (1.0 when disabled); reads it from the device."""
    return self._scale.item() if self.enabled else 1.0
  def get_growth_tracker(self) -> int:
    """Steps in a row without an inf or nan since the scale last changed; reads it from the device."""
    return int(self._growth_tracker.item())
