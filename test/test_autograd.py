"""Autograd against PyTorch: every differentiable op's forward value and the gradient of each input under a random upstream gradient
(check_grad in helpers.py), on broadcast, 0-d, size-1 and non-contiguous inputs, and at the kinks where the subgradient is a choice;
then the tape's rules (requires_grad, no_grad, detach, accumulation, errors) and that gradients stay lazy graphs that fuse."""
from __future__ import annotations
import numpy as np
import pytest
import torch
import torch.nn.functional as tF
from tinyc import GlobalCounters, Tensor, dtypes
from helpers import check_grad, random_array

def integers(shape: tuple[int, ...], low: int = -2, high: int = 2, seed: int = 0) -> np.ndarray:
  """Small integers as float32 leaves: plenty of ties for max/min/maximum."""
  return np.random.default_rng(seed).integers(low, high, size=shape, endpoint=True).astype(np.float32)

# ***** elementwise *****

# name: (torch fn, tinyc fn or None when the torch one runs on tinyc too, low, high)
UNARY = {
  "neg": (lambda x: -x, None, -2, 2), "log": (lambda x: x.log(), None, 0.1, 3), "log2": (lambda x: x.log2(), None, 0.1, 3),
  "exp": (lambda x: x.exp(), None, -3, 3), "exp2": (lambda x: x.exp2(), None, -3, 3), "sqrt": (lambda x: x.sqrt(), None, 0.1, 3),
  "rsqrt": (lambda x: x.rsqrt(), None, 0.1, 3), "sin": (lambda x: x.sin(), None, -5, 5), "cos": (lambda x: x.cos(), None, -5, 5),
  "tan": (lambda x: x.tan(), None, -1.2, 1.2), "square": (lambda x: x.square(), None, -3, 3), "reciprocal": (lambda x: x.reciprocal(), None, 0.5, 3),
  "abs": (lambda x: x.abs(), None, -2, 2), "sign": (lambda x: x.sign(), None, -2, 2), "trunc": (lambda x: x.trunc(), None, -5, 5),
  "floor": (lambda x: x.floor(), None, -5, 5), "ceil": (lambda x: x.ceil(), None, -5, 5), "clip": (lambda x: x.clip(-1, 1), None, -2, 2),
  "clip_min": (lambda x: x.clip(-0.5, None), None, -2, 2), "clip_max": (lambda x: x.clip(None, 0.5), None, -2, 2),
  "pow_int": (lambda x: x ** 3, None, -2, 2), "pow_neg": (lambda x: x ** -2, None, 0.5, 3), "pow_half": (lambda x: x ** 0.5, None, 0.1, 3),
  "pow_float": (lambda x: x ** 2.5, None, 0.1, 3), "pow_two": (lambda x: x ** 2, None, -2, 2), "pow_one": (lambda x: x ** 1, None, -2, 2),
  "pow_zero": (lambda x: x ** 0, None, -2, 2), "rpow": (lambda x: 2 ** x, None, -2, 2), "rpow_float": (lambda x: 1.5 ** x, None, -2, 2),
  "rsub": (lambda x: 2 - x, None, -2, 2), "rdiv": (lambda x: 2 / x, None, 0.5, 3), "div_scalar": (lambda x: x / 4, None, -2, 2),
  "cast_half": (lambda x: x.half().float() * 3, None, -2, 2), "cast_double": (lambda x: x.double() * 3, None, -2, 2),
  "contiguous": (lambda x: x.contiguous() * 2, None, -2, 2),
  "contiguous_backward": (lambda x: x * 2, lambda x: x.contiguous_backward() * 2, -2, 2),
  "relu": (lambda x: x.relu(), None, -2, 2), "sigmoid": (lambda x: x.sigmoid(), None, -4, 4), "tanh": (lambda x: x.tanh(), None, -3, 3),
  "gelu": (lambda x: tF.gelu(x, approximate="tanh"), lambda x: x.gelu(), -3, 3), "elu": (tF.elu, lambda x: x.elu(), -3, 3),
  "elu_alpha": (lambda x: tF.elu(x, 0.5), lambda x: x.elu(0.5), -3, 3), "celu": (lambda x: tF.celu(x, 0.5), lambda x: x.celu(0.5), -3, 3),
  "swish": (tF.silu, lambda x: x.swish(), -4, 4), "silu": (tF.silu, lambda x: x.silu(), -4, 4), "relu6": (tF.relu6, lambda x: x.relu6(), -2, 8),
  "hardswish": (tF.hardswish, lambda x: x.hardswish(), -5, 5), "hardtanh": (tF.hardtanh, lambda x: x.hardtanh(), -2, 2),
  "hardtanh_bounds": (lambda x: tF.hardtanh(x, -0.5, 1.5), lambda x: x.hardtanh(-0.5, 1.5), -2, 2),
  "quick_gelu": (lambda x: x * torch.sigmoid(1.702 * x), lambda x: x.quick_gelu(), -3, 3),
  "leakyrelu": (lambda x: tF.leaky_relu(x, 0.1), lambda x: x.leakyrelu(0.1), -2, 2), "mish": (tF.mish, lambda x: x.mish(), -3, 3),
  "softplus": (tF.softplus, lambda x: x.softplus(), -3, 3), "softplus_beta": (lambda x: tF.softplus(x, beta=2), lambda x: x.softplus(2), -3, 3),
  "softsign": (tF.softsign, lambda x: x.softsign(), -3, 3),
}

@pytest.mark.parametrize("name", UNARY)
def test_unary(name):
  torch_fn, tinyc_fn, low, high = UNARY[name]
  check_grad([(3, 4)], torch_fn, tinyc_fn, low=low, high=high)

@pytest.mark.parametrize("name", UNARY)
def test_unary_edge_shapes(name):
  """0-d and size-1 leaves, and leaves seen through a permute or a flipped, strided slice (the gradient must land back in place)."""
  torch_fn, tinyc_fn, low, high = UNARY[name]
  tinyc_fn = tinyc_fn or torch_fn
  check_grad([()], torch_fn, tinyc_fn, low=low, high=high, seed=1)
  check_grad([(1, 3, 1)], torch_fn, tinyc_fn, low=low, high=high, seed=2)
  check_grad([(4, 3, 2)], lambda x: torch_fn(x.permute(2, 0, 1)[:, 1:3]), lambda x: tinyc_fn(x.permute(2, 0, 1)[:, 1:3]), low=low, high=high)
  check_grad([(5, 3)], lambda x: torch_fn(x.flip(1)[::2]), lambda x: tinyc_fn(x[::2, ::-1]), low=low, high=high)

# the values where an activation bends: torch's choice of subgradient there is part of the contract
KINKS = np.array([-6.0, -3.0, -1.0, -0.5, 0.0, 0.5, 1.0, 3.0, 6.0, 7.0], dtype=np.float32)
KINK_OPS = ["relu", "leakyrelu", "abs", "sign", "clip", "clip_min", "clip_max", "hardtanh", "hardtanh_bounds", "relu6", "hardswish", "elu",
            "elu_alpha", "celu", "softplus", "softplus_beta", "softsign", "floor", "ceil", "trunc", "sqrt", "pow_int", "pow_two"]

@pytest.mark.parametrize("name", KINK_OPS)
def test_subgradient_at_kinks(name):
  """relu'(0) = 0, leakyrelu'(0) = slope, clip passes the gradient at its bounds but hardtanh/relu6 do not, elu'(0) = alpha,
  softplus'(0) = 1/2: exactly torch's choices."""
  torch_fn, tinyc_fn, _, _ = UNARY[name]
  check_grad([np.abs(KINKS) if name == "sqrt" else KINKS], torch_fn, tinyc_fn)

EXTREMES = np.array([-100.0, -30.0, -10.0, 10.0, 30.0, 100.0], dtype=np.float32)

@pytest.mark.parametrize("name", ["sigmoid", "tanh", "gelu", "elu", "elu_alpha", "celu", "swish", "quick_gelu", "mish", "softplus", "softsign"])
def test_gradient_of_large_inputs(name):
  """No inf * 0 = nan gradients where a branch that is not taken overflows (exp(100) is inf in float32)."""
  torch_fn, tinyc_fn, _, _ = UNARY[name]
  check_grad([EXTREMES], torch_fn, tinyc_fn)

BINARY = {
  "add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y, "div": lambda x, y: x / (y.abs() + 0.5),
  "pow": lambda x, y: (x.abs() + 0.1) ** y, "maximum": lambda x, y: x.maximum(y), "minimum": lambda x, y: x.minimum(y),
  "where": lambda x, y: (x > y).where(x, y) if isinstance(x, Tensor) else torch.where(x > y, x, y),
  "where_mixed": lambda x, y: (y < 0).where(x * y, x - y) if isinstance(x, Tensor) else torch.where(y < 0, x * y, x - y),
}
# broadcasting: each gradient must sum back to its own input's shape
BROADCAST = [((3, 4), (3, 4)), ((3, 4), (4,)), ((2, 1, 4), (3, 1)), ((), (3, 4)), ((3, 4), ()), ((1, 4), (3, 1)), ((1,), (2, 3))]

@pytest.mark.parametrize("name", BINARY)
def test_binary(name):
  for seed, shapes in enumerate(BROADCAST): check_grad(shapes, BINARY[name], seed=seed)

def test_binary_noncontiguous_and_same_input():
  for name, fn in BINARY.items():
    check_grad([(3, 4), (4, 3)], lambda x, y: fn(x, y.T))
    check_grad([(3, 4)], lambda x: fn(x, x.flip(0)))  # one leaf on both sides: the two gradients add up
    if name not in ("maximum", "minimum", "where"): check_grad([(3, 4)], lambda x: fn(x, x))  # (maximum(x, x) ties: below)

@pytest.mark.parametrize("name", ["maximum", "minimum"])
def test_maximum_minimum_ties(name):
  """Where x == y torch splits the gradient evenly between the two."""
  fn = BINARY[name]
  check_grad([integers((4, 5), seed=1), integers((4, 5), seed=2)], fn)
  check_grad([integers((4, 5), seed=3), integers((5,), seed=4)], fn)  # broadcast ties: shares sum back
  check_grad([integers((3, 4))], lambda x: fn(x, x))
  check_grad([integers((3, 4))], lambda x: getattr(torch, name)(x, torch.tensor(0.0)), lambda x: fn(x, 0.0))  # scalar

def test_where_broadcast_and_scalars():
  condition = random_array((3, 1), dtypes.bool, seed=5)
  check_grad([condition, (4,), (2, 1, 1)], lambda c, x, y: torch.where(c, x, y), lambda c, x, y: c.where(x, y))
  check_grad([condition, (3, 4)], lambda c, x: torch.where(c, x, 2.5), lambda c, x: c.where(x, 2.5))
  check_grad([condition, (3, 4)], lambda c, y: torch.where(c, -1.0, y), lambda c, y: c.where(-1.0, y))

# ***** reductions *****

# name: (torch fn(x, axis, keepdim), tinyc fn(x, axis, keepdim))
REDUCE = {
  "sum": (lambda x, a, k: x.sum(a, keepdim=k) if a is not None else x.sum(), lambda x, a, k: x.sum(a, keepdim=k)),
  "max": (lambda x, a, k: x.amax(a if a is not None else tuple(range(x.ndim)), keepdim=k), lambda x, a, k: x.max(a, keepdim=k)),
  "min": (lambda x, a, k: x.amin(a if a is not None else tuple(range(x.ndim)), keepdim=k), lambda x, a, k: x.min(a, keepdim=k)),
  "mean": (lambda x, a, k: x.mean(a, keepdim=k) if a is not None else x.mean(), lambda x, a, k: x.mean(a, keepdim=k)),
  "var": (lambda x, a, k: x.var(a, keepdim=k), lambda x, a, k: x.var(a, keepdim=k)),
  "var0": (lambda x, a, k: x.var(a, keepdim=k, correction=0), lambda x, a, k: x.var(a, keepdim=k, correction=0)),
  "std": (lambda x, a, k: x.std(a, keepdim=k), lambda x, a, k: x.std(a, keepdim=k)),
}
AXES = [None, 0, -1, (0, 2), (-1, 1)]

@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("name", REDUCE)
def test_reduce(name, keepdim):
  torch_fn, tinyc_fn = REDUCE[name]
  for axis in AXES: check_grad([(2, 3, 4)], lambda x: torch_fn(x, axis, keepdim), lambda x: tinyc_fn(x, axis, keepdim))
  check_grad([(1, 3, 1)], lambda x: torch_fn(x, (0, 1), keepdim), lambda x: tinyc_fn(x, (0, 1), keepdim))  # size-1 dims
  check_grad([(4, 3)], lambda x: torch_fn(x.T[:, 1:], 0, keepdim), lambda x: tinyc_fn(x.T[:, 1:], 0, keepdim))  # a view of the leaf

@pytest.mark.parametrize("name", ["sum", "max", "min", "mean"])
def test_reduce_0d(name):
  torch_fn, tinyc_fn = REDUCE[name]
  check_grad([()], lambda x: torch_fn(x, None, False), lambda x: tinyc_fn(x, None, False))

@pytest.mark.parametrize("name", ["max", "min"])
def test_max_min_ties_share_the_gradient(name):
  """Tied maxima share the gradient evenly, as torch.amax/amin do (torch.max(dim) would give it all to one index)."""
  torch_fn, tinyc_fn = REDUCE[name]
  for axis in [None, 1, (0, 2)]:
    check_grad([integers((3, 4, 2), -1, 1, seed=7)], lambda x: torch_fn(x, axis, False), lambda x: tinyc_fn(x, axis, False))
  check_grad([np.ones((2, 3), np.float32)], lambda x: torch_fn(x, None, False), lambda x: tinyc_fn(x, None, False))

AXIS_OPS = {
  "softmax": (lambda x, a: x.softmax(a), lambda x, a: x.softmax(a)), "log_softmax": (lambda x, a: x.log_softmax(a), lambda x, a: x.log_softmax(a)),
  "cumsum": (lambda x, a: x.cumsum(a), lambda x, a: x.cumsum(a)),
}

@pytest.mark.parametrize("name", AXIS_OPS)
def test_axis_ops(name):
  torch_fn, tinyc_fn = AXIS_OPS[name]
  for axis in [0, 1, -1]: check_grad([(2, 3, 4)], lambda x: torch_fn(x, axis), lambda x: tinyc_fn(x, axis), low=-4, high=4)
  check_grad([(5,)], lambda x: torch_fn(x, 0), lambda x: tinyc_fn(x, 0))
  check_grad([(4, 3)], lambda x: torch_fn(x.T, -1), lambda x: tinyc_fn(x.T, -1))
  check_grad([np.array([50.0, 0.0, -50.0, 50.0], np.float32)], lambda x: torch_fn(x, 0), lambda x: tinyc_fn(x, 0))  # large, tied

# ***** movement *****

MOVEMENT = {  # name: (input shapes, torch fn, tinyc fn or None)
  "reshape": ([(2, 3, 4)], lambda x: x.reshape(4, 6), None), "reshape_infer": ([(2, 3, 4)], lambda x: x.reshape(-1, 2), None),
  "expand": ([(3, 1)], lambda x: x.expand(2, 3, 4), None), "expand_keep": ([(1, 4)], lambda x: x.expand(3, -1), None),
  "permute": ([(2, 3, 4)], lambda x: x.permute(2, 0, 1), None), "permute_neg": ([(2, 3, 4)], lambda x: x.permute(-1, -3, -2), None),
  "flip": ([(2, 3, 4)], lambda x: x.flip(1), None), "flip_many": ([(2, 3, 4)], lambda x: x.flip((0, -1)), None),
  "shrink": ([(4, 5)], lambda x: x[1:3, 2:5], lambda x: x.shrink(((1, 3), (2, 5)))),
  "pad": ([(2, 3)], lambda x: tF.pad(x, (2, 0, 1, 1)), lambda x: x.pad(((1, 1), (2, 0)))),
  "pad_value": ([(2, 3)], lambda x: tF.pad(x, (1, 2, 0, 1), value=-3.0), lambda x: x.pad(((0, 1), (1, 2)), value=-3.0)),
  "pad2d": ([(1, 2, 3, 3)], lambda x: tF.pad(x, (1, 2, 2, 0)), lambda x: x.pad2d((1, 2, 2, 0))),
  "pad2d_crop": ([(1, 2, 4, 4)], lambda x: tF.pad(x, (-1, 2, 1, -2), value=0.5), lambda x: x.pad2d((-1, 2, 1, -2), value=0.5)),
  "cat": ([(2, 3), (1, 3), (4, 3)], lambda x, y, z: torch.cat([x, y, z]), lambda x, y, z: x.cat(y, z)),
  "cat_neg_dim": ([(2, 3), (2, 1)], lambda x, y: torch.cat([x, y], dim=-1), lambda x, y: x.cat(y, dim=-1)),
  "stack": ([(2, 3), (2, 3), (2, 3)], lambda x, y, z: torch.stack([x, y, z], 1), lambda x, y, z: Tensor.stack([x, y, z], 1)),
  "stack_neg": ([(2, 3), (2, 3)], lambda x, y: torch.stack([x, y], -1), lambda x, y: Tensor.stack([x, y], -1)),
  "repeat": ([(2, 3)], lambda x: x.repeat(2, 1, 3), None), "repeat_same": ([(2, 1)], lambda x: x.repeat(1, 4), None),
  "chunk": ([(5, 3)], lambda x: x.chunk(3), None), "chunk_dim": ([(2, 7)], lambda x: x.chunk(2, -1), None),
  "squeeze": ([(2, 1, 3, 1)], lambda x: x.squeeze(), None), "squeeze_dim": ([(2, 1, 3)], lambda x: x.squeeze(-2), None),
  "unsqueeze": ([(2, 3)], lambda x: x.unsqueeze(1), None), "unsqueeze_neg": ([(2, 3)], lambda x: x.unsqueeze(-1), None),
  "transpose": ([(2, 3, 4)], lambda x: x.transpose(0, 2), None), "T": ([(2, 3)], lambda x: x.T, None),
  "flatten": ([(2, 3, 4)], lambda x: x.flatten(), None), "flatten_start": ([(2, 3, 4)], lambda x: x.flatten(1), None),
  "getitem_int": ([(3, 4)], lambda x: x[1], None), "getitem_neg_int": ([(3, 4, 2)], lambda x: x[-1, :, 1], None),
  "getitem_slice": ([(5, 4)], lambda x: x[1:4, ::2], None), "getitem_neg_slice": ([(6, 4)], lambda x: x[-4:-1, 1:], None),
  "getitem_none_ellipsis": ([(2, 3, 4)], lambda x: x[None, ..., 1:3, None], None),
  "getitem_step_reverse": ([(6, 3)], lambda x: x.flip(0)[::2], lambda x: x[::-2]),
  "getitem_0d": ([(3,)], lambda x: x[2], None),
}

@pytest.mark.parametrize("name", MOVEMENT)
def test_movement(name):
  shapes, torch_fn, tinyc_fn = MOVEMENT[name]
  check_grad(shapes, torch_fn, tinyc_fn)

def test_movement_chain_on_view():
  """A chain of views of a view of the leaf, then math: each backward undoes its own movement."""
  check_grad([(4, 6)], lambda x: (x.T[1:5].reshape(2, 2, 4).flip(2).expand(3, 2, 2, 4) * 2).permute(3, 1, 0, 2)[..., 1:].exp())

# ***** matmul, convolution, pooling *****

MATMUL = [((4,), (4,)), ((4,), (4, 3)), ((2, 4), (4,)), ((2, 4), (4, 3)), ((2, 3, 4), (2, 4, 5)), ((2, 1, 3, 4), (5, 4, 2)), ((3, 4), (2, 4, 5)),
          ((1, 4), (4, 1))]

@pytest.mark.parametrize("shapes", MATMUL, ids=str)
def test_matmul(shapes):
  check_grad(shapes, lambda x, w: x @ w)

def test_matmul_views_and_linear():
  check_grad([(4, 3), (5, 4)], lambda x, w: x.T @ w.T)
  check_grad([(2, 3), (3, 4)], lambda x, w: x.matmul(w), lambda x, w: x.dot(w))
  check_grad([(2, 5, 3), (3, 4), (4,)], lambda x, w, b: x @ w + b, lambda x, w, b: x.linear(w, b))
  check_grad([(2, 3), (3,)], lambda x, w: x * w, lambda x, w: x.linear(w))

CONV = [  # x shape, w shape, kwargs (torch's names)
  ((2, 3, 5, 5), (4, 3, 3, 3), {}), ((1, 2, 7, 6), (3, 2, 3, 2), {"stride": 2}), ((1, 2, 5, 5), (2, 2, 3, 3), {"padding": 1}),
  ((1, 2, 5, 6), (2, 2, 3, 3), {"padding": (2, 1)}), ((1, 2, 7, 7), (2, 2, 3, 3), {"dilation": 2}), ((1, 4, 5, 5), (6, 2, 3, 3), {"groups": 2}),
  ((2, 4, 6, 6), (4, 1, 3, 3), {"groups": 4, "stride": 2, "padding": 1}), ((1, 2, 6, 5), (3, 2, 2, 3), {"stride": (2, 1), "dilation": (1, 2)}),
  ((1, 1, 4, 4), (1, 1, 1, 1), {}),
]

@pytest.mark.parametrize("x_shape, w_shape, kwargs", CONV, ids=str)
def test_conv2d(x_shape, w_shape, kwargs):
  check_grad([x_shape, w_shape, (w_shape[0],)], lambda x, w, b: tF.conv2d(x, w, b, **kwargs), lambda x, w, b: x.conv2d(w, b, **kwargs),
             atol=1e-4)

def test_conv2d_no_bias_view_input():
  check_grad([(1, 6, 6, 2), (3, 2, 3, 3)], lambda x, w: tF.conv2d(x.permute(0, 3, 1, 2), w), lambda x, w: x.permute(0, 3, 1, 2).conv2d(w),
             atol=1e-4)

CONV_TRANSPOSE = [  # x shape, w shape (in, out/groups, kh, kw), kwargs
  ((1, 2, 3, 3), (2, 3, 3, 3), {}), ((2, 2, 3, 4), (2, 2, 3, 3), {"stride": 2}), ((1, 2, 4, 4), (2, 3, 3, 3), {"stride": 2, "padding": 1}),
  ((1, 2, 3, 3), (2, 2, 3, 3), {"stride": 2, "padding": 1, "output_padding": 1}), ((1, 4, 3, 3), (4, 1, 2, 2), {"groups": 2, "stride": 2}),
  ((1, 2, 3, 3), (2, 2, 3, 3), {"dilation": 2, "padding": (1, 2)}), ((1, 2, 3, 4), (2, 2, 2, 3), {"stride": (1, 2), "output_padding": (0, 1)}),
]

@pytest.mark.parametrize("x_shape, w_shape, kwargs", CONV_TRANSPOSE, ids=str)
def test_conv_transpose2d(x_shape, w_shape, kwargs):
  out_channels = w_shape[1] * kwargs.get("groups", 1)
  check_grad([x_shape, w_shape, (out_channels,)], lambda x, w, b: tF.conv_transpose2d(x, w, b, **kwargs),
             lambda x, w, b: x.conv_transpose2d(w, b, **kwargs), atol=1e-4)

POOL = [((1, 2, 4, 4), {}), ((2, 1, 5, 6), {"kernel_size": 3, "stride": 1}), ((1, 2, 7, 7), {"kernel_size": (3, 2), "stride": (2, 3)}),
        ((1, 1, 6, 6), {"kernel_size": 2, "stride": 1, "dilation": 2})]

@pytest.mark.parametrize("shape, kwargs", POOL, ids=str)
def test_pool2d(shape, kwargs):
  torch_kwargs = {"kernel_size": 2, **kwargs}
  check_grad([shape], lambda x: tF.max_pool2d(x, **torch_kwargs), lambda x: x.max_pool2d(**kwargs))
  if "dilation" not in kwargs: check_grad([shape], lambda x: tF.avg_pool2d(x, **torch_kwargs), lambda x: x.avg_pool2d(**kwargs))

def test_max_pool2d_ties():
  """Tied maxima in a window share the gradient (torch's max_pool2d gives it to one index; amax over the windows splits it)."""
  windows = lambda x, k, s: x.unfold(2, k, s).unfold(3, k, s).amax((-2, -1))
  check_grad([integers((1, 2, 4, 4), 0, 1, seed=3)], lambda x: windows(x, 2, 2), lambda x: x.max_pool2d(2))
  check_grad([integers((1, 1, 5, 5), 0, 1, seed=4)], lambda x: windows(x, 3, 1), lambda x: x.max_pool2d(3, 1))

# ***** normalization, attention, losses *****

def test_layernorm():
  check_grad([(2, 3, 4)], lambda x: tF.layer_norm(x, (4,)), lambda x: x.layernorm())
  check_grad([(2, 3, 4)], lambda x: tF.layer_norm(x, (3, 4), eps=1e-3), lambda x: x.layernorm((-2, -1), eps=1e-3))
  check_grad([(3, 4), (4,), (4,)], lambda x, w, b: tF.layer_norm(x, (4,), w, b), lambda x, w, b: x.layernorm() * w + b)

def test_batchnorm():
  """With the statistics as inputs (eval), and computed from the batch (training: the gradient flows through mean and var too)."""
  def torch_eval(x, w, b, mean, var): return (x - mean[:, None, None]) * (var.abs() + 0.5).rsqrt()[:, None, None] * w[:, None, None] + b[:, None, None]
  def tinyc_eval(x, w, b, mean, var): return x.batchnorm(w, b, mean, (var.abs() + 0.5).rsqrt())
  check_grad([(2, 3, 4, 4), (3,), (3,), (3,), (3,)], torch_eval, tinyc_eval)
  check_grad([(2, 3, 4), (3,), (3,)], lambda x, m, v: (x - m[:, None]) * v[:, None], lambda x, m, v: x.batchnorm(None, None, m, v))
  def tinyc_train(x, w, b):
    axes = (0, 2, 3)
    return x.batchnorm(w, b, x.mean(axes), (x.var(axes, correction=0) + 1e-5).rsqrt())
  check_grad([(2, 3, 4, 4), (3,), (3,)], lambda x, w, b: tF.batch_norm(x, None, None, w, b, training=True), tinyc_train, atol=1e-4)

ATTENTION = [  # q, k, v shapes and kwargs (masks are made in the test)
  ((2, 3, 4), (2, 5, 4), (2, 5, 3), {}), ((1, 2, 3, 4), (1, 2, 3, 4), (1, 2, 3, 4), {"is_causal": True}),
  ((1, 2, 3, 4), (1, 2, 5, 4), (1, 2, 5, 2), {"is_causal": True}), ((2, 3, 4), (2, 5, 4), (2, 5, 3), {"mask": "bool"}),
  ((2, 3, 4), (2, 5, 4), (2, 5, 3), {"mask": "float"}),
]

@pytest.mark.parametrize("q, k, v, kwargs", ATTENTION, ids=str)
def test_scaled_dot_product_attention(q, k, v, kwargs):
  kwargs = dict(kwargs)
  if kwargs.pop("mask", None) == "bool":
    mask = random_array((q[-2], k[-2]), dtypes.bool, seed=9)
    mask[:, 0] = True  # no row masked out entirely (that is 0/0 = nan in torch too)
    kwargs["attn_mask"] = mask
  elif "is_causal" not in kwargs: kwargs["attn_mask"] = random_array((q[-2], k[-2]), seed=9)
  torch_mask = {"attn_mask": torch.from_numpy(kwargs.pop("attn_mask"))} if "attn_mask" in kwargs else {}
  tinyc_mask = {"attn_mask": Tensor(torch_mask["attn_mask"].numpy())} if torch_mask else {}
  check_grad([q, k, v], lambda q, k, v: tF.scaled_dot_product_attention(q, k, v, **torch_mask, **kwargs),
             lambda q, k, v: q.scaled_dot_product_attention(k, v, **tinyc_mask, **kwargs))

def test_binary_crossentropy():
  targets = random_array((3, 4), low=0, high=1, seed=11)
  check_grad([(3, 4)], lambda x: tF.binary_cross_entropy(x, torch.from_numpy(targets)), lambda x: x.binary_crossentropy(Tensor(targets)),
             low=0.05, high=0.95)
  check_grad([(3, 4)], lambda x: tF.binary_cross_entropy_with_logits(x, torch.from_numpy(targets)),
             lambda x: x.binary_crossentropy_logits(Tensor(targets)), low=-4, high=4)
  logits = np.array([-100.0, -3.0, 0.0, 0.0, 2.0, 100.0], np.float32)  # 0 (sigmoid(0) - y) and far out (no overflow)
  hard = np.array([0.0, 1.0, 0.0, 1.0, 0.5, 0.0], np.float32)
  check_grad([logits], lambda x: tF.binary_cross_entropy_with_logits(x, torch.from_numpy(hard)),
             lambda x: x.binary_crossentropy_logits(Tensor(hard)))
  # the targets as leaves too: torch differentiates both arguments
  check_grad([(2, 3), targets[:2, :3]], tF.binary_cross_entropy_with_logits, lambda x, y: x.binary_crossentropy_logits(y))

SPARSE = [  # logits shape, labels, kwargs
  ((4, 5), [0, 3, 4, 1], {}), ((4, 5), [0, -1, 4, 2], {"ignore_index": -1}), ((4, 5), [2, 3, 0, 0], {"label_smoothing": 0.1}),
  ((4, 5), [1, -1, 4, 2], {"ignore_index": -1, "label_smoothing": 0.2}), ((4, 5), [1, 7, 7, 2], {"ignore_index": 7}),
  ((2, 3, 5), [[0, 1, 2], [4, -1, 3]], {"ignore_index": -1, "label_smoothing": 0.1}),
]

@pytest.mark.parametrize("shape, labels, kwargs", SPARSE, ids=str)
def test_sparse_categorical_crossentropy(shape, labels, kwargs):
  y = np.array(labels, np.int64)
  # torch wants the classes in dim 1
  def torch_fn(x, y): return tF.cross_entropy(x if x.ndim == 2 else x.permute(0, 2, 1), y, **{"ignore_index": -100, **kwargs})
  check_grad([shape, y], torch_fn, lambda x, y: x.sparse_categorical_crossentropy(y, **kwargs), low=-3, high=3)
  check_grad([shape, y.astype(np.int32)], lambda x, y: torch_fn(x, y.long()), lambda x, y: x.sparse_categorical_crossentropy(y, **kwargs), seed=3)

def test_dropout_gradient_is_the_mask():
  Tensor.manual_seed(0)
  x = Tensor(random_array((8, 16), low=1, high=2), requires_grad=True)
  try:
    Tensor.training = True
    out = x.dropout(0.25)
  finally: Tensor.training = False
  (out * 3).sum().backward()
  assert x.grad is not None
  kept = out.numpy() != 0
  assert 0 < kept.mean() < 1
  np.testing.assert_allclose(x.grad.numpy(), kept * 3 / 0.75, rtol=1e-6)

# ***** the autograd tape *****

def test_requires_grad_propagation():
  a, b, c = Tensor([1.0, 2.0], requires_grad=True), Tensor([3.0, 4.0]), Tensor([5.0, 6.0], requires_grad=False)
  assert a.requires_grad is True and b.requires_grad is None and c.requires_grad is False
  for result in [a * b, b + a, a.exp(), (a @ b), a.sum(), a[0], a.reshape(2, 1).expand(2, 2), a.cast(dtypes.float16), c * a, a.sign()]:
    assert result.requires_grad is True, result
  for result in [b * 2, b.exp(), c + b, a.detach() * b, a < b, a == b, a.argmax(), a.cast(dtypes.int32), a.int() * a.int(), (a > 0).where(b, c)]:
    assert not result.requires_grad and result._ctx is None, result

def test_no_grad():
  a = Tensor([1.0, 2.0], requires_grad=True)
  try:
    Tensor.no_grad = True
    made = (a * 3).exp()
    assert not made.requires_grad and made._ctx is None
    with pytest.raises(RuntimeError): made.sum().backward()
  finally: Tensor.no_grad = False
  assert a.grad is None
  (made * a).sum().backward()  # made is a constant now: it gets no gradient and passes none to a
  assert made.grad is None and a.grad is not None
  np.testing.assert_allclose(a.grad.numpy(), np.exp([3.0, 6.0]), rtol=1e-6)

def test_detach():
  a = Tensor([1.0, 2.0, 3.0], requires_grad=True)
  detached = a.detach()
  assert not detached.requires_grad and detached._ctx is None
  np.testing.assert_equal(detached.numpy(), a.numpy())
  (a * a.detach()).sum().backward()  # d/da (a * const) = const, not 2a
  assert a.grad is not None
  np.testing.assert_allclose(a.grad.numpy(), [1.0, 2.0, 3.0])

def test_backward_errors():
  a, b = Tensor([1.0, 2.0], requires_grad=True), Tensor([2.0, 1.0], requires_grad=True)
  with pytest.raises(RuntimeError, match="scalar"): (a * 2).backward()
  with pytest.raises(RuntimeError): (a < b).sum().backward()
  with pytest.raises(RuntimeError): a.argmax().backward()
  with pytest.raises(RuntimeError): a.argmin(0).backward()
  with pytest.raises(RuntimeError): (a == b).where(1.0, 0.0).sum().backward()
  with pytest.raises(RuntimeError): Tensor([1.0, 2.0]).sum().backward()  # nothing requires grad
  loss = (a * b).sum()
  loss.backward()
  with pytest.raises(RuntimeError): loss.backward()  # the graph is consumed by the first backward, as in torch without retain_graph

def test_comparison_in_the_graph_passes_no_gradient():
  """A comparison used as a mask or a condition contributes nothing; the gradient reaches the leaf through the other path."""
  check_grad([(3, 4)], lambda x: x * (x > 0), low=-2, high=2)
  check_grad([(3, 4)], lambda x: x * x.argmax(1, keepdim=True), low=-2, high=2)
  check_grad([(3, 4), (3, 4)], lambda x, y: torch.where(x < y, x * y, 0.0), lambda x, y: (x < y).where(x * y, 0.0))

def test_grad_accumulates():
  a = Tensor(random_array((3, 4)), requires_grad=True)
  reference = torch.tensor(random_array((3, 4)), requires_grad=True)
  for fn in [lambda x: (x * x).sum(), lambda x: x.exp().mean(), lambda x: (x @ x.T).max()]:
    fn(a).backward()
    fn(reference).backward()
  assert a.grad is not None and reference.grad is not None
  np.testing.assert_allclose(a.grad.numpy(), reference.grad.numpy(), rtol=1e-5, atol=1e-6)

def test_shared_subexpressions():
  """A node reached by several paths (a diamond) gets the sum of their gradients before its own backward runs."""
  def fn(x, y):
    h = x * y
    g = h.exp() + h * h
    return (g * h - g.sin() * x).sum(-1)
  check_grad([(3, 4), (4,)], fn)

def test_grad_dtype_shape_and_leaves():
  a = Tensor(random_array((2, 3), dtypes.float16), dtype=dtypes.float16, requires_grad=True)
  (a.float() * 2).sum().backward()
  assert a.grad is not None and a.grad.dtype == dtypes.float16 and a.grad.shape == (2, 3) and not a.grad.requires_grad
  np.testing.assert_equal(a.grad.numpy(), np.full((2, 3), 2, np.float16))
  b = Tensor(random_array(()), requires_grad=True)
  (b * 3).backward()
  assert b.grad is not None and b.grad.shape == () and b.grad.item() == 3
  c, d = Tensor([1.0, 2.0], requires_grad=True), Tensor([3.0, 4.0])
  (c * d).sum().backward()
  assert d.grad is None  # requires_grad None: a constant, like torch's default

def test_gradients_are_lazy_and_fuse():
  """Backward builds lazy graphs: relu(x @ w + b).sum() and both gradients realize in a few fused kernels."""
  x, w, b = Tensor(random_array((4, 8))), Tensor(random_array((8, 16), seed=1), requires_grad=True), Tensor(random_array((16,), seed=2),
                                                                                                          requires_grad=True)
  x.realize(), w.realize(), b.realize()
  GlobalCounters.reset()
  (x @ w + b).relu().sum().backward()
  assert GlobalCounters.kernel_count == 0, "backward must not realize anything"
  assert w.grad is not None and b.grad is not None
  Tensor.corealize([w.grad, b.grad])
  # observed: 3 kernels (the forward matmul+bias+relu-mask, then one kernel per gradient)
  assert GlobalCounters.kernel_count <= 6, f"{GlobalCounters.kernel_count} kernels"
  reference = [torch.tensor(a.numpy(), requires_grad=True) for a in (x, w, b)]
  torch.relu(reference[0] @ reference[1] + reference[2]).sum().backward()
  np.testing.assert_allclose(w.grad.numpy(), reference[1].grad.numpy(), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(b.grad.numpy(), reference[2].grad.numpy(), rtol=1e-5, atol=1e-5)
