"""Layer 6: Tensor ops for neural networks (a mixin of Tensor): matmul, convolution, pooling, activations. All are
compositions of primitive ops, so they fuse and differentiate for free; conv2d gives its own backward. Inside `tinyc.autocast`
(amp.py) matmul, linear, conv and attention cast their float inputs to its 16-bit dtype. Imports helpers, dtype, device.
"""
from __future__ import annotations
import math
from typing import Any, Callable, Sequence
from tinyc import function as F
from tinyc.device import Device
from tinyc.dtype import BY_NAME, DType, dtypes, least_upper_dtype
from tinyc.helpers import ALLOW_TF32, AUTOCAST, PACK, Context, all_int, argsort, flatten
from tinyc.tensor_winograd import winograd_applies, winograd_conv2d, winograd_weight_grad

def _pair(value: int | Sequence[int], count: int = 2) -> tuple[int, ...]:
  return (value,) * count if isinstance(value, int) else tuple(value)

# A CPU matmul's operand that the reduce walks with a stride over 2 KB is first copied contiguous along it, as BLAS packs its
# operands: no prefetcher follows such a walk (Intel's stride prefetcher takes up to 2 KB), and rows 4 KB apart share a cache
# set. Measured on one AVX-512 core at 1024 (design section 2): a @ b 49 GFLOP/s, a.T @ b 31, against 113 for a @ b.T. Not for
# operands under PACK_MIN_ELEMENTS: the copy is a kernel of its own
PACK_MIN_ELEMENTS, PACK_MAX_STRIDE_BYTES = 1 << 18, 2048

def _along_reduce(operand: Any, axis: int, max_stride_bytes: int = PACK_MAX_STRIDE_BYTES) -> Any:
  """`operand`, or a copy of it contiguous along `axis` (a matmul's reduce) where it is large and its view walks `axis` by more
  than `max_stride_bytes`."""
  stride = operand.lazydata.st.real_strides()[axis]
  if operand.numel() < PACK_MIN_ELEMENTS or (stride is not None and abs(stride) * operand.dtype.itemsize <= max_stride_bytes): return operand
  return operand.transpose(axis, -1).contiguous().transpose(axis, -1)

# Rows along the reduce that are not whole 64-byte cache lines (K = 1000 or 1500 floats) make vector loads straddle lines and leave
# a remainder loop: on a CPU both operands are then copied along K with it padded by zeros to whole lines. a @ b.T on 2 AVX-512
# cores: 1000 227 -> 270 GFLOP/s, 1500 181 -> 200 (the copies not counted). Only where each operand's other axis has
# PACK_MIN_ROWS or more: each copied element is then reused by enough products to pay for its copy
LINE_BYTES, PACK_MIN_ROWS = 64, 512

def _cpu_packed(x: Any, w: Any) -> tuple[Any, Any]:
  k, size = x.shape[-1], x.dtype.itemsize
  if k * size % LINE_BYTES == 0 or min(x.shape[-2], w.shape[-1]) < PACK_MIN_ROWS or min(x.numel(), w.numel()) < PACK_MIN_ELEMENTS:
    return _along_reduce(x, -1), _along_reduce(w, -2)
  extra = -(-k * size // LINE_BYTES) * LINE_BYTES // size - k
  def padded_along_k(operand: Any) -> Any: return operand.pad(((0, 0),) * (operand.ndim - 1) + ((0, extra),)).contiguous()
  return padded_along_k(x), padded_along_k(w.transpose(-1, -2)).transpose(-1, -2)

def _packed(x: Any, w: Any) -> tuple[Any, Any]:
  """The operands of `x @ w`, those a kernel would read badly first copied contiguous along the reduce. On a CPU: see above. On
  sm_90 with TF32: wgmma reads 32-bit values only along K, so where neither operand is (`a.T @ b`, a weight gradient) the smaller
  is copied so (H200, 4096: 181 TFLOP/s on mma.sync, against 240-263 for wgmma with B along K; the copy costs about 40 us)."""
  target = Device[x.device].target
  if not PACK or not target.has_local: return _cpu_packed(x, w) if PACK else (x, w)
  if not (target.warpgroups and ALLOW_TF32 and x.dtype == w.dtype == dtypes.float32): return x, w
  if x.lazydata.st.real_strides()[-1] == 1 or w.lazydata.st.real_strides()[-2] == 1: return x, w
  return (_along_reduce(x, -1, 0), w) if x.numel() < w.numel() else (x, _along_reduce(w, -2, 0))

def autocast_dtype() -> DType | None:
  """The 16-bit dtype matmuls and convs compute in inside `tinyc.autocast` (or with AUTOCAST set), None outside."""
  if not (name := AUTOCAST.value): return None
  if name not in ("float16", "bfloat16"): raise ValueError(f"AUTOCAST={name!r}: autocast computes in float16 or bfloat16 (or unset it)")
  return BY_NAME[name]

def _autocast(x: Any, dtype: DType, copy: bool = True) -> Any:
  """An input of an autocast matmul, conv or attention: a float32 (or other 16-bit) x cast to `dtype`; float64 and ints stay, as in
  torch. With `copy`, the cast is a kernel of its own (as torch's autocast casts a weight), keeping x's memory order (a weight's
  transposed view becomes a view of an (out, in) copy): the matmul then loads 16-bit buffers, the form the tensor cores take
  (`Kernel.tensor_core_operands`), where a cast fused into it would load float32."""
  if x.dtype in (dtype, dtypes.float64) or not dtypes.is_float(x.dtype): return x
  if not copy: return x.cast(dtype)
  strides = x.lazydata.st.real_strides()
  order = argsort([-stride for stride in strides]) if all_int(strides) else list(range(x.ndim))
  return x.permute(order).cast(dtype).contiguous().permute(argsort(order))

class NNMixin:
  # provided by Tensor
  @property
  def shape(self) -> tuple[int, ...]: raise NotImplementedError
  @property
  def ndim(self) -> int: raise NotImplementedError
  @property
  def dtype(self) -> Any: raise NotImplementedError

  def dot(self, w: Any) -> Any:
    """Matrix product with PyTorch's rules for 1-D operands and batch broadcasting."""
    x: Any = self
    if x.ndim == 0 or w.ndim == 0: raise RuntimeError(f"both arguments to matmul need to be at least 1D, but they are {x.ndim}D and {w.ndim}D")
    x_vec, w_vec, w_shape = x.ndim == 1, w.ndim == 1, w.shape
    if x_vec: x = x.reshape(1, x.shape[0])
    if w_vec: w = w.reshape(w.shape[0], 1)
    if x.shape[-1] != w.shape[-2]:
      raise RuntimeError(f"mat1 and mat2 shapes cannot be multiplied ({'x'.join(map(str, self.shape))} and {'x'.join(map(str, w_shape))})")
    batch = max(x.ndim, w.ndim) - 2
    x_batch, w_batch = (1,) * (batch - x.ndim + 2) + x.shape[:-2], (1,) * (batch - w.ndim + 2) + w.shape[:-2]
    if any(a != b and 1 not in (a, b) for a, b in zip(x_batch, w_batch)):
      raise RuntimeError(f"matmul: the batch dims of {self.shape} and {w_shape} do not broadcast")
    if (low := autocast_dtype()) is not None: x, w = _autocast(x, low), _autocast(w, low)
    dtype = least_upper_dtype(x.dtype, w.dtype)
    x, w = x.cast(_exact_products(dtype)), w.cast(_exact_products(dtype))
    x, w = _packed(x, w)
    # (..., n, 1, k) * (..., 1, m, k) summed over k: the multiply fuses into the reduce, one kernel
    product = x.reshape(*x.shape[:-1], 1, x.shape[-1]) * w.transpose(-1, -2).reshape(*w.shape[:-2], 1, w.shape[-1], w.shape[-2])
    result = product.sum(-1).cast(dtype)
    if dtype != _exact_products(dtype): result = _gradient_stored(result)
    if w_vec: result = result.reshape(result.shape[:-1])
    if x_vec: result = result.reshape(result.shape[:-2] + result.shape[-1:]) if not w_vec else result.reshape(result.shape[:-1])
    return result
  def matmul(self, w: Any) -> Any: return self.dot(w)

  def linear(self, weight: Any, bias: Any | None = None) -> Any:
    """x @ weight (+ bias); weight is (in, out) as in tinygrad, or 1-D for a per-feature scale."""
    out = self * weight if weight.ndim == 1 else self.dot(weight)
    if bias is not None and weight.ndim > 1 and (low := autocast_dtype()) is not None: bias = _autocast(bias, low, copy=False)  # as torch
    return out + bias if bias is not None else out
  def sequential(self, layers: Sequence[Callable[[Any], Any]]) -> Any:
    out: Any = self
    for layer in layers: out = layer(out)
    return out

  def conv2d(self: Any, weight: Any, bias: Any | None = None, groups: int = 1, stride: int | Sequence[int] = 1, dilation: int | Sequence[int] = 1,
             padding: int | Sequence[int] = 0) -> Any:
    """Cross-correlation like torch.nn.functional.conv2d (any number of spatial dims), built from pooling views, with its own backward."""
    if (low := autocast_dtype()) is not None:  # (no copies: the 16-bit conv copies its operands channels-last, the casts fused in)
      self, weight, bias = [t if t is None else _autocast(t, low, copy=False) for t in (self, weight, bias)]
    (batch, cin_total), (cout, cin), kernel = self.shape[:2], weight.shape[:2], weight.shape[2:]
    if self.ndim != weight.ndim or groups * cin != cin_total or cout % groups:
      raise RuntimeError(f"conv2d: input {self.shape} has {cin_total} channels, but weight {weight.shape} with groups={groups} expects "
                         f"{groups * cin} channels (and out channels divisible by groups): weight needs shape (out, in/groups, *kernel)")
    if isinstance(padding, int): pads = [padding] * (2 * len(kernel))
    elif len(padding) == 2 * len(kernel): pads = list(padding)
    else: pads = [p for p in padding[::-1] for _ in range(2)]
    nd, per_group, strides, dilations = len(kernel), cout // groups, _pair(stride, len(kernel)), _pair(dilation, len(kernel))
    pairs = list(zip(pads[::2], pads[1::2]))[::-1]  # (before, after) per spatial dim, the first dim first
    # per spatial dim, what the windows' starts range over; what stride leaves of it at the end is the gradient's output_padding
    spans = [size + before + after - d * (k - 1) - 1 for size, (before, after), d, k in zip(self.shape[2:], pairs, dilations, kernel)]
    out_dims = [span // s + 1 for span, s in zip(spans, strides)]
    dtype = least_upper_dtype(self.dtype, weight.dtype)
    def windows(x: Any) -> Any:  # (batch, groups, per_group, *out_dims, cin, *kernel): each output's window of its group's channels
      pooled = x.cast(_exact_products(dtype)).pad2d(pads)._pool(kernel, stride, dilation)
      pooled = pooled.reshape(batch, groups, cin, 1, *out_dims, *kernel)
      pooled = pooled.expand(batch, groups, cin, per_group, *out_dims, *kernel)
      return pooled.permute(0, 1, 3, *[4 + i for i in range(nd)], 2, *[4 + nd + i for i in range(nd)])
    winograd = winograd_applies(self.shape, weight.shape, groups, strides, dilations, dtype)
    def forward(x: Any, w: Any) -> Any:
      if winograd: return winograd_conv2d(x.cast(dtype), w.cast(dtype), pairs)  # (one operand may be 16-bit: the transforms run in float32)
      # (16-bit operands channels-last for the tensor cores, as in the weight gradient)
      weights = _channels_last(w, dtype).cast(_exact_products(dtype)).reshape(1, groups, per_group, *[1] * nd, cin, *kernel)
      product = windows(_channels_last(x, dtype)) * weights
      return product.sum(tuple(range(-1 - nd, 0))).reshape(batch, cout, *out_dims).cast(dtype)
    # as PyTorch: the input's gradient is a transposed convolution, one forward-style kernel; autograd through the pooling views would
    # store every window's product (batch * cin * pixels * kernel elements) and then fold them back. The weight's is one reduce.
    def backward(grad: Any, x: Any, w: Any) -> tuple[Any, Any]:
      grad_pads = [((k - 1) * d - before, (k - 1) * d - after + span % s)
                   for k, d, (before, after), span, s in zip(kernel, dilations, pairs, spans, strides)]
      grad_x = grad._conv_transpose(w, groups, strides, dilations, grad_pads).cast(x.dtype) if self.requires_grad else None
      if not weight.requires_grad: return grad_x, None
      if winograd: return grad_x, winograd_weight_grad(x.cast(dtype), grad.cast(dtype), pairs).cast(w.dtype)
      product = windows(_channels_last(x, dtype)) * _channels_last(grad, dtype).cast(_exact_products(dtype)).reshape(
        batch, groups, per_group, *out_dims, *[1] * (1 + nd))
      return grad_x, product.sum((0, *range(3, 3 + nd))).reshape(weight.shape).cast(w.dtype)
    result = type(self)._composite(forward, backward, self, weight)
    return result if bias is None else result + bias.reshape(1, -1, *[1] * nd)

  def conv_transpose2d(self: Any, weight: Any, bias: Any | None = None, groups: int = 1, stride: int | Sequence[int] = 1,
                       dilation: int | Sequence[int] = 1, padding: int | Sequence[int] = 0, output_padding: int | Sequence[int] = 0) -> Any:
    """The gradient of conv2d with respect to its input, like torch.nn.functional.conv_transpose2d (weight: (in, out/groups, *kernel))."""
    kernel = weight.shape[2:]
    if self.ndim != weight.ndim or self.shape[1] != weight.shape[0] or weight.shape[0] % groups:
      raise RuntimeError(f"conv_transpose2d: input {self.shape} and weight {weight.shape} do not fit (groups={groups}): weight needs shape "
                         f"(in, out/groups, *kernel) with in = {self.shape[1]}")
    dilations, paddings, extras = _pair(dilation, len(kernel)), _pair(padding, len(kernel)), _pair(output_padding, len(kernel))
    pads = [((k - 1) * d - p, (k - 1) * d - p + e) for k, d, p, e in zip(kernel, dilations, paddings, extras)]
    return self._conv_transpose(weight, groups, _pair(stride, len(kernel)), dilations, pads, bias)
  def _conv_transpose(self: Any, weight: Any, groups: int, strides: tuple[int, ...], dilations: tuple[int, ...], pads: list[tuple[int, int]],
                      bias: Any | None = None) -> Any:
    """Spread the input out by `strides` with zeros, pad each spatial dim by (before, after) (negative crops), then a conv2d with the
    flipped, transposed kernel."""
    trailing, x = list(range(3, weight.ndim + 1)), self
    w = weight.reshape(groups, weight.shape[0] // groups, *weight.shape[1:]).permute(0, 2, 1, *trailing).flip(trailing)
    if any(s > 1 for s in strides):
      x = x.reshape(*x.shape[:2], *flatten((size, 1) for size in x.shape[2:]))
      x = x.pad(((0, 0), (0, 0), *flatten(((0, 0), (0, s - 1)) for s in strides)))
      x = x.reshape(*x.shape[:2], *[size * s for size, s in zip(x.shape[2::2], strides)])
      x = x.shrink(((0, x.shape[0]), (0, x.shape[1]), *[(0, size - (s - 1)) for size, s in zip(x.shape[2:], strides)]))
    return x.conv2d(w.reshape(w.shape[0] * w.shape[1], *w.shape[2:]), groups=groups, bias=bias, dilation=dilations, padding=flatten(pads[::-1]))

  def max_pool2d(self: Any, kernel_size: int | Sequence[int] = (2, 2), stride: int | Sequence[int] | None = None,
                 dilation: int | Sequence[int] = 1) -> Any:
    kernel = _pair(kernel_size)
    return self._pool(kernel, stride if stride is not None else kernel, dilation).max(tuple(range(-len(kernel), 0)))
  def avg_pool2d(self: Any, kernel_size: int | Sequence[int] = (2, 2), stride: int | Sequence[int] | None = None,
                 dilation: int | Sequence[int] = 1) -> Any:
    kernel = _pair(kernel_size)
    return self._pool(kernel, stride if stride is not None else kernel, dilation).mean(tuple(range(-len(kernel), 0)))

  # ---- normalization, regularization, attention ----
  def layernorm(self: Any, axis: int | Sequence[int] = -1, eps: float = 1e-5) -> Any:
    """Normalize to zero mean and unit variance over axis (no affine part: nn.LayerNorm adds it)."""
    centered = self - self.mean(axis, keepdim=True)
    return centered * (centered.square().mean(axis, keepdim=True) + eps).rsqrt()
  def batchnorm(self: Any, weight: Any | None, bias: Any | None, mean: Any, invstd: Any) -> Any:
    """(x - mean) * invstd * weight + bias with per-channel (axis 1) statistics."""
    shape = (1, -1) + (1,) * (self.ndim - 2)
    out = (self - mean.reshape(shape)) * (invstd.reshape(shape) if weight is None else (weight * invstd).reshape(shape))
    return out + bias.reshape(shape) if bias is not None else out
  def dropout(self: Any, p: float = 0.5) -> Any:
    """Zero each element with probability p and scale the rest by 1/(1-p), in training only (Tensor.training)."""
    if not type(self).training or p == 0: return self
    if not 0 <= p <= 1: raise ValueError(f"dropout probability has to be between 0 and 1, but got {p}")
    keep = type(self).rand(*self.shape, device=self.device) >= p
    return keep.where(self * (1 / (1 - p)) if p < 1 else self * 0, 0)
  def triu(self: Any, k: int = 0) -> Any:
    """Keep the elements on and above the k-th diagonal of the last two dims."""
    if self.ndim < 2: raise RuntimeError(f"triu: input tensor must have at least 2 dimensions, got shape {self.shape}")
    return self._diagonals(k, lower=False).where(self, 0).cast(self.dtype)
  def tril(self: Any, k: int = 0) -> Any:
    """Keep the elements on and below the k-th diagonal of the last two dims."""
    if self.ndim < 2: raise RuntimeError(f"tril: input tensor must have at least 2 dimensions, got shape {self.shape}")
    return self._diagonals(k, lower=True).where(self, 0).cast(self.dtype)
  def _diagonals(self: Any, k: int, lower: bool) -> Any:
    """A (rows, cols) bool mask, True where col - row <= k (lower) or >= k, made of index math and no buffer: row i reads a line of
    the diagonals' flags from rows - 1 - i on, a view of a padded constant, so a kernel's mask is `col - row < k + 1` (a reduce loop
    over the masked columns or rows then ends or starts there, section 6)."""
    rows, cols = self.shape[-2:]
    width = rows + cols  # diagonal col - row sits at rows - 1 + col - row of the line, in [0, rows + cols - 2]
    edge = min(max(rows + k if lower else rows - 1 + k, 0), width)
    line = type(self).ones(edge if lower else width - edge, dtype=dtypes.bool, device=self.device).pad(((0, width - edge) if lower else (edge, 0),))
    windows = line.reshape(1, width).expand(rows + 1, width).flatten().shrink(((0, rows * (width + 1)),)).reshape(rows, width + 1)
    return windows.shrink(((0, rows), (0, cols))).flip(0)  # windows[i][j] = line[i + j], flipped: line[rows - 1 - i + j]
  def scaled_dot_product_attention(self: Any, key: Any, value: Any, attn_mask: Any | None = None, dropout_p: float = 0.0,
                                   is_causal: bool = False) -> Any:
    """softmax(q @ k^T / sqrt(d) + mask) @ v, like torch.nn.functional.scaled_dot_product_attention (bool masks keep True)."""
    if min(self.ndim, key.ndim, value.ndim) < 2:
      raise RuntimeError(f"Expected query, key, and value to all be at least 2 dimensional, got {self.shape}, {key.shape} and {value.shape}")
    if (low := autocast_dtype()) is not None:  # as torch: q, k, v (and a float mask) in 16 bits, then the attention of 16-bit inputs
      mask = attn_mask if attn_mask is None else _autocast(attn_mask, low, copy=False)
      with Context(AUTOCAST=""):
        return _autocast(self, low).scaled_dot_product_attention(_autocast(key, low), _autocast(value, low), mask, dropout_p, is_causal)
    if is_causal:
      if attn_mask is not None: raise ValueError("scaled_dot_product_attention: give attn_mask or is_causal, not both")
      attn_mask = type(self).ones(self.shape[-2], key.shape[-2], dtype=dtypes.bool, device=self.device).tril()
    scale = 1 / math.sqrt(self.shape[-1]) if self.shape[-1] else math.inf  # torch's scale, inf for d = 0
    def scores(q: Any, k: Any, *mask: Any) -> Any:
      product = q @ k.transpose(-2, -1) * scale
      if not mask: return product
      return mask[0].where(product, -math.inf) if mask[0].dtype == dtypes.bool else product + mask[0]
    masks = () if attn_mask is None else (attn_mask,)
    if dropout_p and type(self).training: return scores(self, key, *masks).softmax(-1).dropout(dropout_p) @ value
    # the forward is softmax(scores) @ v, which the scheduler computes in one kernel (rules 10, online softmax): no T x T matrix stored.
    # The backward recomputes the probabilities from the scores and their log-sum-exp, as flash attention does: each gradient is one
    # kernel that computes its scores (and the product of the output's gradient with v) per key in its loop, never storing them. Each
    # kernel's scores are a graph of their own: rule 10 stores a contraction that several kernels reach (an MLP's hidden layer)
    # A row whose every key is masked attends to nothing, as torch's (softmax's would be nan): its max, -inf, is taken as 0, its exps and
    # sum are 0, and its sum is then divided by 1 (any other row's is at least 1, its max's own term); its log-sum-exp, -inf, is taken
    # as +inf, so its probabilities are 0 in the backward. Online softmax reads such a max as the max itself (codegen/online.py)
    def peak(logits: Any) -> Any: return ((top := logits._reduce(F.Max, -1, True)) == -math.inf).where(0, top)  # (no keys: -inf)
    logits = scores(self, key, *[m.detach() for m in masks]).detach()
    weights = (logits - peak(logits)).exp()
    with Context(PACK=0):  # (and no split of the sum over the keys for a CPU's cache: its parts would store the probabilities)
      out = (weights / weights.sum(-1, keepdim=True).maximum(1)) @ value.detach()
    def backward(grad: Any, q: Any, k: Any, v: Any, *mask: Any) -> list[Any | None]:
      shift = peak(logits := scores(q, k, *mask))
      lse = shift + (logits - shift).exp().sum(-1, keepdim=True).log()
      lse = (lse == -math.inf).where(math.inf, lse)
      delta = (grad * out.detach()).sum(-1, keepdim=True)
      def probs() -> Any: return (scores(q, k, *mask) - lse).exp()
      def dscores() -> Any: return probs() * (grad @ v.transpose(-2, -1) - delta)
      with Context(PACK=0):  # a copy of probs or dscores along the queries (a CPU matmul's packing), or a split of a sum over them
        # for a CPU's cache, would store the T x T matrix
        grads = [(dscores() @ k) * scale, (dscores().transpose(-2, -1) @ q) * scale, probs().transpose(-2, -1) @ grad]
      return [g._sum_to(t.shape) for g, t in zip(grads, (q, k, v))] + [dscores()._sum_to(m.shape) if m.dtype != dtypes.bool else None for m in mask]
    return type(self)._composite(lambda *inputs: out, backward, self, key, value, *masks)
  def _sum_to(self: Any, shape: tuple[int, ...]) -> Any:
    """This gradient summed over the dims its input was broadcast along (the input's shape: leading dims and size-1 dims)."""
    extra = self.ndim - len(shape)
    summed = self.sum(tuple(range(extra))) if extra else self
    axes = tuple(i for i, (size, want) in enumerate(zip(summed.shape, shape)) if want == 1 and size != 1)
    return summed.sum(axes, keepdim=True) if axes else summed

  # ---- losses ----
  def binary_crossentropy(self: Any, y: Any) -> Any:
    """Mean binary cross-entropy of probabilities self against targets y as torch computes it: each log clamped at -100, and for self
    the gradient (self - y) / max(self (1 - self), 1e-12), finite where a probability saturates at 0 or 1 (there the derivative of
    the clamped log would be 0/0 = nan)."""
    x, target = self.detach(), y.detach() if isinstance(y, type(self)) else y
    loss = -(y * x.log().maximum(-100) + (1 - y) * (1 - x).log().maximum(-100))
    slope = (x - target) / (x * (1 - x)).maximum(1e-12)
    return (loss + (self - x) * slope).mean()  # self - x is 0 and carries self's gradient: it adds torch's slope and nothing else
  def binary_crossentropy_logits(self: Any, y: Any) -> Any:
    """Mean binary cross-entropy of logits: stable, never exponentiates a large positive number."""
    return (self.softplus() - y * self).mean()
  def sparse_categorical_crossentropy(self: Any, y: Any, ignore_index: int = -1, label_smoothing: float = 0.0) -> Any:
    """Mean cross-entropy of logits self (..., classes) against integer labels y (...); labels equal to ignore_index count for nothing."""
    classes = self.shape[-1]
    y._check_range(0, classes, f"sparse_categorical_crossentropy: Target {{value}} is out of bounds ({classes} classes)", ignore=ignore_index)
    log_probs = self.log_softmax(-1)
    counted = y != ignore_index
    one_hot = (y.unsqueeze(-1) == type(self).arange(classes, device=self.device)) * counted.unsqueeze(-1)
    # the loss, and the count of labels that count (one_hot.sum(), which has the same loops), sum the same elements: one kernel
    loss = (log_probs * one_hot).sum()
    if label_smoothing: loss = (1 - label_smoothing) * loss + label_smoothing * (log_probs.mean(-1) * counted).sum()
    return -loss / one_hot.sum()

  # ---- activations ----
  def tanh(self: Any) -> Any: return 2.0 * ((2.0 * self).sigmoid()) - 1.0
  def elu(self: Any, alpha: float = 1.0) -> Any: return self._exp_linear(alpha, 1.0)
  def celu(self: Any, alpha: float = 1.0) -> Any: return self._exp_linear(alpha, 1 / alpha)
  def _exp_linear(self: Any, alpha: float, scale: float) -> Any:
    """x where x > 0, else alpha * (exp(scale * x) - 1), with torch's slope alpha * scale at 0. exp only ever sees x <= 0: an exp(x)
    that overflows to inf in the unused branch would still make an inf * 0 = nan gradient."""
    negative = (self > 0).where(0, self)
    return (self > 0).where(self, alpha * ((negative * scale).exp() - 1))
  def swish(self: Any) -> Any: return self * self.sigmoid()
  def silu(self: Any) -> Any: return self.swish()
  def relu6(self: Any) -> Any: return (self >= 6).where(6, self.relu())  # not relu(x) - relu(x - 6): inf - inf at x = inf
  def hardswish(self: Any) -> Any: return self * (self + 3).relu6() * (1 / 6)
  def hardtanh(self: Any, min_val: float = -1, max_val: float = 1) -> Any:
    """clip(min_val, max_val), but (as torch) with zero gradient at the bounds themselves, where clip passes it through."""
    return (self <= min_val).where(min_val, (self >= max_val).where(max_val, self))
  def gelu(self: Any) -> Any: return 0.5 * self * (1 + (self * 0.7978845608 * (1 + 0.044715 * self * self)).tanh())
  def quick_gelu(self: Any) -> Any: return self * (self * 1.702).sigmoid()
  def leakyrelu(self: Any, neg_slope: float = 0.01) -> Any: return (self > 0).where(self, self * neg_slope)  # slope neg_slope at 0, as torch
  def mish(self: Any) -> Any: return self * self.softplus().tanh()
  def softplus(self: Any, beta: float = 1) -> Any:
    """log(1 + exp(beta x)) / beta, computed without overflow for large inputs."""
    scaled = self * beta  # maximum (not relu) splits its gradient at 0, which makes the slope there sigmoid(0) = 1/2
    return (scaled.maximum(0) + (-scaled.abs()).exp().add(1).log()) * (1 / beta)
  def softsign(self: Any) -> Any: return self / (1 + self.abs())

def _channels_last(x: Any, dtype: DType) -> Any:
  """A 16-bit conv's operand stored with its channels innermost (as cuDNN does for tensor cores): the reduce over the channels reads
  16-byte rows, at 16-byte aligned places whatever the window's offset, where NCHW rows along the image start 2 bytes apart."""
  if dtype not in (dtypes.float16, dtypes.bfloat16): return x
  inner = list(range(2, x.ndim)) + [1]
  return x.permute(0, *inner).contiguous().permute(0, x.ndim - 1, *range(1, x.ndim - 1))

def _gradient_stored(product: Any) -> Any:
  """A 16-bit product whose gradient is stored (in 16 bits, as torch's) before the backward's two products read it: fused into them,
  a gradient computed in float32 and rounded to 16 bits loads float32, which the tensor cores do not take (tensor_core_operands)."""
  return type(product)._composite(lambda value: value, lambda grad, value: [grad.contiguous()], product)

def _exact_products(dtype: DType) -> DType:
  """What a matmul or convolution multiplies in: float32 for 16-bit floats, as PyTorch and the tensor cores do (their products are
  exact there; an LLVM kernel would round each one to 16 bits), and the sums of those products stay float32 up to the result."""
  return dtypes.float32 if dtype in (dtypes.float16, dtypes.bfloat16) else dtype
