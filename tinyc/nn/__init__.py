"""Layer 6: neural-network layers over Tensor, with PyTorch's parameter layouts and default initializations, so state dicts
port across. Submodules: `tinyc.nn.state` (state dicts, safetensors files) and `tinyc.nn.optim` (SGD, Adam, AdamW, LAMB).
Imports tensor and lower layers only.
"""
from __future__ import annotations
import math
from tinyc.tensor import Tensor
from tinyc.dtype import dtypes
from tinyc.helpers import Context

def _pair(value: int | tuple[int, ...]) -> tuple[int, ...]: return (value, value) if isinstance(value, int) else tuple(value)
def _uniform(*shape: int, fan_in: int) -> Tensor:
  """PyTorch's default init for weights and biases (kaiming_uniform with a=sqrt(5) is this bound)."""
  bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0.0
  return Tensor.uniform(*shape, low=-bound, high=bound)

class Linear:
  def __init__(self, in_features: int, out_features: int, bias: bool = True) -> None:
    self.weight = _uniform(out_features, in_features, fan_in=in_features)
    self.bias = _uniform(out_features, fan_in=in_features) if bias else None
  def __call__(self, x: Tensor) -> Tensor: return x.linear(self.weight.T, self.bias)

class Conv2d:
  def __init__(self, in_channels: int, out_channels: int, kernel_size: int | tuple[int, ...], stride: int | tuple[int, ...] = 1,
               padding: int | tuple[int, ...] = 0, dilation: int | tuple[int, ...] = 1, groups: int = 1, bias: bool = True) -> None:
    self.kernel_size, self.stride, self.padding, self.dilation, self.groups = _pair(kernel_size), stride, padding, dilation, groups
    fan_in = in_channels // groups * math.prod(self.kernel_size)
    self.weight = _uniform(out_channels, in_channels // groups, *self.kernel_size, fan_in=fan_in)
    self.bias = _uniform(out_channels, fan_in=fan_in) if bias else None
  def __call__(self, x: Tensor) -> Tensor:
    return x.conv2d(self.weight, self.bias, groups=self.groups, stride=self.stride, dilation=self.dilation, padding=self.padding)

class ConvTranspose2d:
  def __init__(self, in_channels: int, out_channels: int, kernel_size: int | tuple[int, ...], stride: int | tuple[int, ...] = 1,
               padding: int | tuple[int, ...] = 0, output_padding: int | tuple[int, ...] = 0, groups: int = 1, bias: bool = True,
               dilation: int | tuple[int, ...] = 1) -> None:
    self.kernel_size, self.stride, self.padding, self.output_padding = _pair(kernel_size), stride, padding, output_padding
    self.dilation, self.groups = dilation, groups
    fan_in = out_channels // groups * math.prod(self.kernel_size)  # torch computes it from weight.size(1)
    self.weight = _uniform(in_channels, out_channels // groups, *self.kernel_size, fan_in=fan_in)
    self.bias = _uniform(out_channels, fan_in=fan_in) if bias else None
  def __call__(self, x: Tensor) -> Tensor:
    return x.conv_transpose2d(self.weight, self.bias, groups=self.groups, stride=self.stride, dilation=self.dilation, padding=self.padding,
                              output_padding=self.output_padding)

class BatchNorm2d:
  """Batch statistics while Tensor.training (running statistics updated in place), running statistics otherwise."""
  def __init__(self, num_features: int, eps: float = 1e-5, affine: bool = True, track_running_stats: bool = True, momentum: float = 0.1):
    self.eps, self.momentum, self.track_running_stats = eps, momentum, track_running_stats
    self.weight: Tensor | None = Tensor.ones(num_features) if affine else None
    self.bias: Tensor | None = Tensor.zeros(num_features) if affine else None
    if track_running_stats:
      self.running_mean, self.running_var = Tensor.zeros(num_features, requires_grad=False), Tensor.ones(num_features, requires_grad=False)
      self.num_batches_tracked = Tensor(0, dtype=dtypes.int32, requires_grad=False)  # 0-d, as torch's (int32: tinyc's default int)
  def __call__(self, x: Tensor) -> Tensor:
    axes = (0,) + tuple(range(2, x.ndim))
    if Tensor.training or not self.track_running_stats:
      mean = x.mean(axes)
      centered = x - mean.reshape(1, -1, *[1] * (x.ndim - 2))
      var = centered.square().mean(axes)
      if Tensor.training and self.track_running_stats:
        count = x.numel() // x.shape[1]
        self.running_mean.assign((1 - self.momentum) * self.running_mean + self.momentum * mean.detach())
        self.running_var.assign((1 - self.momentum) * self.running_var + self.momentum * count / max(count - 1, 1) * var.detach())
        self.num_batches_tracked.assign(self.num_batches_tracked + 1)
        Tensor.corealize([self.running_mean, self.running_var, self.num_batches_tracked])  # state must not pile up a graph
      return x.batchnorm(self.weight, self.bias, mean, (var + self.eps).rsqrt())
    return x.batchnorm(self.weight, self.bias, self.running_mean, (self.running_var + self.eps).rsqrt())

class LayerNorm:
  def __init__(self, normalized_shape: int | tuple[int, ...], eps: float = 1e-5, elementwise_affine: bool = True) -> None:
    self.normalized_shape = (normalized_shape,) if isinstance(normalized_shape, int) else tuple(normalized_shape)
    self.eps = eps
    self.weight = Tensor.ones(*self.normalized_shape) if elementwise_affine else None
    self.bias = Tensor.zeros(*self.normalized_shape) if elementwise_affine else None
  def __call__(self, x: Tensor) -> Tensor:
    if x.shape[-len(self.normalized_shape):] != self.normalized_shape:
      raise RuntimeError(f"LayerNorm over {self.normalized_shape} got an input of shape {x.shape}")
    out = x.layernorm(tuple(range(-len(self.normalized_shape), 0)), self.eps)
    return out if self.weight is None else out * self.weight + self.bias

class GroupNorm:
  def __init__(self, num_groups: int, num_channels: int, eps: float = 1e-5, affine: bool = True) -> None:
    if num_channels % num_groups: raise ValueError(f"num_channels ({num_channels}) must be divisible by num_groups ({num_groups})")
    self.num_groups, self.eps = num_groups, eps
    self.weight: Tensor | None = Tensor.ones(num_channels) if affine else None
    self.bias: Tensor | None = Tensor.zeros(num_channels) if affine else None
  def __call__(self, x: Tensor) -> Tensor:
    out = x.reshape(x.shape[0], self.num_groups, -1).layernorm(eps=self.eps).reshape(x.shape)
    if self.weight is None: return out
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return out * self.weight.reshape(shape) + self.bias.reshape(shape)  # type: ignore[union-attr]

class InstanceNorm:
  """Normalizes each channel of each sample (torch.nn.InstanceNorm2d; affine by default here, as in tinygrad)."""
  def __init__(self, num_features: int, eps: float = 1e-5, affine: bool = True) -> None:
    self.eps = eps
    self.weight: Tensor | None = Tensor.ones(num_features) if affine else None
    self.bias: Tensor | None = Tensor.zeros(num_features) if affine else None
  def __call__(self, x: Tensor) -> Tensor:
    out = x.reshape(x.shape[0], x.shape[1], -1).layernorm(eps=self.eps).reshape(x.shape)
    if self.weight is None: return out
    shape = (1, -1) + (1,) * (x.ndim - 2)
    return out * self.weight.reshape(shape) + self.bias.reshape(shape)  # type: ignore[union-attr]

class Embedding:
  """A lookup table: row i of `weight` for each index i (as a one-hot matmul, so it fuses and differentiates; ids are checked, see
  index_check.py)."""
  def __init__(self, vocab_size: int, embed_size: int) -> None:
    self.vocab_size = vocab_size
    self.weight = Tensor.randn(vocab_size, embed_size)  # torch: N(0, 1)
  def __call__(self, idx: Tensor) -> Tensor:
    idx._check_range(0, self.vocab_size, f"Embedding: index out of range in self (id {{value}}, with {self.vocab_size} embeddings)")
    one_hot = idx.unsqueeze(-1) == Tensor.arange(self.vocab_size, device=idx.device)
    with Context(AUTOCAST=""): return one_hot.cast(self.weight.dtype) @ self.weight  # a lookup, which torch's autocast leaves alone

__all__ = ["Linear", "Conv2d", "ConvTranspose2d", "BatchNorm2d", "LayerNorm", "GroupNorm", "InstanceNorm", "Embedding"]
