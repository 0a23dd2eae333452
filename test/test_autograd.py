"""Autograd against PyTorch: every differentiable op's forward value and the gradient of each input under a random upstream gradient
(check_grad/check_grads in helpers.py), on broadcast, 0-d, size-1 and non-contiguous inputs, and at the kinks where the subgradient is a choice;
then the tape's rules (requires_grad, no_grad, detach, accumulation, errors) and that gradients stay lazy graphs that fuse."""
from __future__ import annotations
import itertools
import numpy as np
import pytest
import torch
import torch.nn.functional as tF
from tinyc import GlobalCounters, Tensor, dtypes
from tinyc.ops import LoadOps, ReduceOps
from tinyc.helpers import prod
from tinyc.schedule import create_schedule
from helpers import check_grad, check_grads, random_array

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
  "cast_half": (lambda x: x.half().float() * 3, None, -2, 2), "cast_double": (lambda x: x.double() * 3, lambda x: x.cast(dtypes.float64) * 3, -2, 2),
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

def test_unary():
  check_grads({name: ([random_array((3, 4), low=low, high=high, seed=i)], torch_fn, tinyc_fn)
               for i, (name, (torch_fn, tinyc_fn, low, high)) in enumerate(UNARY.items())})

# where the leaf sits before the op: the gradient must land back in place through a view. That is the view's backward, so a few ops
# whose backwards differ in kind (none, a mask, a saved input or output, a zero gradient, a cast) stand in for all of them.
EDGE_OPS = ["exp", "sqrt", "sign", "relu", "gelu", "leakyrelu", "pow_int", "clip", "cast_half", "contiguous_backward"]
EDGE_VARIANTS = {  # variant: (leaf shape, view for torch, view for tinyc)
  "0d": ((), lambda x: x, lambda x: x), "size1": ((1, 3, 1), lambda x: x, lambda x: x),
  "permuted": ((4, 3, 2), lambda x: x.permute(2, 0, 1)[:, 1:3], lambda x: x.permute(2, 0, 1)[:, 1:3]),
  "strided": ((5, 3), lambda x: x.flip(1)[::2], lambda x: x[::2, ::-1]),
}

def test_unary_edge_shapes_and_views():
  cases = {}
  for variant, (shape, torch_view, tinyc_view) in EDGE_VARIANTS.items():
    for i, name in enumerate(EDGE_OPS):
      torch_fn, tinyc_fn, low, high = UNARY[name]
      cases[f"{name}-{variant}"] = ([random_array(shape, low=low, high=high, seed=i)], lambda x, f=torch_fn, v=torch_view: f(v(x)),
                                    lambda x, f=tinyc_fn or torch_fn, v=tinyc_view: f(v(x)))
  check_grads(cases)

# the values where an activation bends: torch's choice of subgradient there is part of the contract
KINKS = np.array([-6.0, -3.0, -1.0, -0.5, 0.0, 0.5, 1.0, 3.0, 6.0, 7.0], dtype=np.float32)
KINK_OPS = ["relu", "leakyrelu", "abs", "sign", "clip", "clip_min", "clip_max", "hardtanh", "hardtanh_bounds", "relu6", "hardswish", "elu",
            "elu_alpha", "celu", "softplus", "softplus_beta", "softsign", "floor", "ceil", "trunc", "sqrt", "pow_int", "pow_two", "pow_zero"]

def test_subgradient_at_kinks():
  """relu'(0) = 0, leakyrelu'(0) = slope, clip passes the gradient at its bounds but hardtanh/relu6 do not, elu'(0) = alpha,
  softplus'(0) = 1/2, x ** 3 at 0 is 0 (not exp(3 log|x|)'s nan): exactly torch's choices."""
  check_grads({name: ([np.abs(KINKS) if name == "sqrt" else KINKS], UNARY[name][0], UNARY[name][1]) for name in KINK_OPS})

EXTREMES = np.array([-100.0, -30.0, -10.0, 10.0, 30.0, 100.0], dtype=np.float32)

def test_gradient_of_large_inputs():
  """No inf * 0 = nan gradients where a branch that is not taken overflows (exp(100) is inf in float32)."""
  names = ["sigmoid", "tanh", "gelu", "elu", "elu_alpha", "celu", "swish", "quick_gelu", "mish", "softplus", "softsign"]
  check_grads({name: ([EXTREMES], UNARY[name][0], UNARY[name][1]) for name in names})

BINARY = {
  "add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y, "div": lambda x, y: x / (y.abs() + 0.5),
  "pow": lambda x, y: (x.abs() + 0.1) ** y, "maximum": lambda x, y: x.maximum(y), "minimum": lambda x, y: x.minimum(y),
  "where": lambda x, y: (x > y).where(x, y) if isinstance(x, Tensor) else torch.where(x > y, x, y),
  "where_mixed": lambda x, y: (y < 0).where(x * y, x - y) if isinstance(x, Tensor) else torch.where(y < 0, x * y, x - y),
}
# broadcasting: each gradient must sum back to its own input's shape
BROADCAST = [((2, 1, 4), (3, 1)), ((3, 4), ())]

@pytest.mark.parametrize("shapes", BROADCAST, ids=str)
def test_binary(shapes):
  check_grads({name: (shapes, fn, None) for name, fn in BINARY.items()})

def test_binary_noncontiguous_and_same_input():
  cases = {}
  for name, fn in BINARY.items():
    cases[f"{name}_flipped_self"] = ([(3, 4)], lambda x, fn=fn: fn(x, x.flip(0)), None)  # one leaf on both sides: the gradients add up
    if name in ("sub", "div", "pow", "maximum", "where_mixed"): cases[f"{name}_transposed"] = ([(3, 4), (4, 3)], lambda x, y, fn=fn: fn(x, y.T), None)
    if name in ("sub", "mul", "div", "pow"): cases[f"{name}_self"] = ([(3, 4)], lambda x, fn=fn: fn(x, x), None)  # (maximum's ties: below)
  check_grads(cases)

@pytest.mark.parametrize("name", ["maximum", "minimum"])
def test_maximum_minimum_ties(name):
  """Where x == y torch splits the gradient evenly between the two."""
  fn = BINARY[name]
  check_grads({"same_shape": ([integers((4, 5), seed=1), integers((4, 5), seed=2)], fn, None),
               "broadcast": ([integers((4, 5), seed=3), integers((5,), seed=4)], fn, None),  # the shares of broadcast ties sum back
               "self": ([integers((3, 4))], lambda x: fn(x, x), None),
               "scalar": ([integers((3, 4))], lambda x: getattr(torch, name)(x, torch.tensor(0.0)), lambda x: fn(x, 0.0))})

def test_pow_special_points():
  """Base 0 and 1 and exponent 0, with a tensor exponent: torch's values and gradients (exp(p log|b|) alone has 0/0 = nan at b = 0)."""
  bases = np.array([1.0, 1.0, 1.0, 2.0, 0.5, 0.0, 0.0, 0.0, 3.0], np.float32)
  powers = np.array([0.0, 2.5, -1.0, 0.0, -1.5, 2.0, 3.0, 0.0, 1.0], np.float32)
  negative, integral = np.array([-2.0, -1.5, -1.0, -0.5, 0.0], np.float32), np.array([3.0, 2.0, -1.0, 4.0, 2.0], np.float32)
  check_grads({"tensor_exponent": ([bases, powers], lambda b, p: b ** p, None),
               # a negative base with a constant integral exponent (torch's exponent gradient is nan there)
               "negative_base": ([negative], lambda b: b ** torch.from_numpy(integral), lambda b: b ** Tensor(integral)),
               "cube": ([negative], lambda b: b ** 3, None), "inverse_cube": ([negative], lambda b: b ** -3, None)})

def test_where_broadcast_and_scalars():
  condition = random_array((3, 1), dtypes.bool, seed=5)
  check_grads({"broadcast": ([condition, (4,), (2, 1, 1)], lambda c, x, y: torch.where(c, x, y), lambda c, x, y: c.where(x, y)),
               "scalar_else": ([condition, (3, 4)], lambda c, x: torch.where(c, x, 2.5), lambda c, x: c.where(x, 2.5)),
               "scalar_then": ([condition, (3, 4)], lambda c, y: torch.where(c, -1.0, y), lambda c, y: c.where(-1.0, y))})

# ***** reductions *****

# name: (torch fn(x, axis, keepdim), tinyc fn(x, axis, keepdim))
REDUCE = {
  "sum": (lambda x, a, k: x.sum(a, keepdim=k), lambda x, a, k: x.sum(a, keepdim=k)),
  "max": (lambda x, a, k: x.amax(a if a is not None else tuple(range(x.ndim)), keepdim=k), lambda x, a, k: x.max(a, keepdim=k)),
  "min": (lambda x, a, k: x.amin(a if a is not None else tuple(range(x.ndim)), keepdim=k), lambda x, a, k: x.min(a, keepdim=k)),
  "mean": (lambda x, a, k: x.mean(a, keepdim=k), lambda x, a, k: x.mean(a, keepdim=k)),
  "var": (lambda x, a, k: x.var(a, keepdim=k), lambda x, a, k: x.var(a, keepdim=k)),
  "var0": (lambda x, a, k: x.var(a, keepdim=k, correction=0), lambda x, a, k: x.var(a, keepdim=k, correction=0)),
  "std": (lambda x, a, k: x.std(a, keepdim=k), lambda x, a, k: x.std(a, keepdim=k)),
}
# each op over (leaf shape, axis, keepdim): sum and max (the two primitive reduces) over everything, the ops built on them over a few;
# 0-d, size-1 dims, negative and multiple axes, keepdim, and a view of the leaf
REDUCE_CASES = {
  "sum": [((2, 3, 4), None, False), ((2, 3, 4), -1, False), ((2, 3, 4), (0, 2), True), ((1, 3, 1), (0, 1), True), ((), None, False)],
  "max": [((2, 3, 4), None, False), ((2, 3, 4), -1, False), ((2, 3, 4), (0, 2), True), ((1, 3, 1), (0, 1), True), ((), None, False)],
  "min": [((2, 3, 4), (-1, 1), False), ((), None, False)], "mean": [((2, 3, 4), None, True), ((2, 3, 4), -1, False), ((), None, False)],
  "var": [((2, 3, 4), None, False), ((2, 3, 4), (0, 2), True)], "var0": [((2, 3, 4), -1, False)], "std": [((2, 3, 4), (0, 2), False)],
}

def test_reduce():
  cases = {f"{name}-{shape}-{axis}-{keepdim}": ([shape], lambda x, a=axis, k=keepdim, f=REDUCE[name][0]: f(x, a, k),
                                               lambda x, a=axis, k=keepdim, f=REDUCE[name][1]: f(x, a, k))
           for name, specs in REDUCE_CASES.items() for shape, axis, keepdim in specs}
  for name in ["sum", "max", "var"]:  # a view of the leaf
    cases[f"{name}-view"] = ([(4, 3)], lambda x, f=REDUCE[name][0]: f(x.T[:, 1:], 0, False), lambda x, f=REDUCE[name][1]: f(x.T[:, 1:], 0, False))
  check_grads(cases)

def test_reduce_of_0d_leaf():
  """A reduction of a 0-d leaf is a node of its own, so backward from it reaches the leaf."""
  for name in ["sum", "max", "min", "mean"]:
    leaf = Tensor(2.5, requires_grad=True)
    getattr(leaf, name)().backward()
    assert leaf.grad is not None and leaf.grad.item() == 1.0, name

@pytest.mark.parametrize("name", ["max", "min"])
def test_max_min_ties_share_the_gradient(name):
  """Tied maxima share the gradient evenly, as torch.amax/amin do (torch.max(dim) would give it all to one index)."""
  torch_fn, tinyc_fn = REDUCE[name]
  cases = {f"axis={axis}": ([integers((3, 4, 2), -1, 1, seed=7)], lambda x, a=axis: torch_fn(x, a, False), lambda x, a=axis: tinyc_fn(x, a, False))
           for axis in [None, 1, (0, 2)]}
  cases["all_equal"] = ([np.ones((2, 3), np.float32)], lambda x: torch_fn(x, None, False), lambda x: tinyc_fn(x, None, False))
  check_grads(cases)

AXIS_OPS = {
  "softmax": (lambda x, a: x.softmax(a), lambda x, a: x.softmax(a)), "log_softmax": (lambda x, a: x.log_softmax(a), lambda x, a: x.log_softmax(a)),
  "cumsum": (lambda x, a: x.cumsum(a), lambda x, a: x.cumsum(a)),
}

@pytest.mark.parametrize("name", AXIS_OPS)
def test_axis_ops(name):
  torch_fn, tinyc_fn = AXIS_OPS[name]
  cases = {f"axis={axis}": ([(2, 3, 4)], lambda x, a=axis: torch_fn(x, a), lambda x, a=axis: tinyc_fn(x, a)) for axis in [0, -1]}
  cases["view"] = ([(4, 3)], lambda x: torch_fn(x.T, -1), lambda x: tinyc_fn(x.T, -1))
  if name != "cumsum":  # the max subtracted first keeps exp finite, and tied maxima share its (cancelling) gradient
    cases["large_tied"] = ([np.array([50.0, 0.0, -50.0, 50.0], np.float32)], lambda x: torch_fn(x, 0), lambda x: tinyc_fn(x, 0))
  check_grads(cases, low=-4, high=4)

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

def test_movement():
  check_grads(MOVEMENT)

def test_movement_chain_on_view():
  """A chain of views of a view of the leaf, then math: each backward undoes its own movement."""
  check_grad([(4, 6)], lambda x: (x.T[1:5].reshape(2, 2, 4).flip(2).expand(3, 2, 2, 4) * 2).permute(3, 1, 0, 2)[..., 1:].exp())

# ***** matmul, convolution, pooling *****

MATMUL = [((4,), (4,)), ((4,), (4, 3)), ((2, 4), (4,)), ((2, 4), (4, 3)), ((2, 3, 4), (2, 4, 5)), ((2, 1, 3, 4), (5, 4, 2)), ((3, 4), (2, 4, 5)),
          ((1, 4), (4, 1))]

def test_matmul():
  check_grads({str(shapes): (shapes, lambda x, w: x @ w, None) for shapes in MATMUL})

def test_matmul_views_and_linear():
  check_grads({"transposed": ([(4, 3), (5, 4)], lambda x, w: x.T @ w.T, None),
               "dot": ([(2, 3), (3, 4)], lambda x, w: x.matmul(w), lambda x, w: x.dot(w)),
               "linear": ([(2, 5, 3), (3, 4), (4,)], lambda x, w, b: x @ w + b, lambda x, w, b: x.linear(w, b)),  # weight is (in, out)
               "linear_scale": ([(2, 3), (3,)], lambda x, w: x * w, lambda x, w: x.linear(w))})

CONV = [  # x shape, w shape, kwargs (torch's names)
  ((2, 3, 5, 5), (4, 3, 3, 3), {}), ((1, 2, 7, 6), (3, 2, 3, 2), {"stride": 2, "padding": (2, 1)}), ((1, 2, 7, 7), (2, 2, 3, 3), {"dilation": 2}),
  ((2, 4, 6, 6), (6, 2, 3, 3), {"groups": 2, "stride": 2, "padding": 1}), ((1, 2, 6, 5), (3, 2, 2, 3), {"stride": (2, 1), "dilation": (1, 2)}),
  ((1, 1, 4, 4), (1, 1, 1, 1), {}),
]

def test_conv2d():
  check_grads({f"{x}-{w}-{kw}": ([x, w, (w[0],)], lambda x, w, b, kw=kw: tF.conv2d(x, w, b, **kw), lambda x, w, b, kw=kw: x.conv2d(w, b, **kw))
               for x, w, kw in CONV}, atol=1e-4)

def test_conv2d_no_bias_view_input():
  check_grad([(1, 6, 6, 2), (3, 2, 3, 3)], lambda x, w: tF.conv2d(x.permute(0, 3, 1, 2), w), lambda x, w: x.permute(0, 3, 1, 2).conv2d(w),
             atol=1e-4)

# conv2d's own backward (a transposed conv for the input): strides that leave a remainder (the gradient's output_padding), padding past
# the kernel's reach (the transposed conv crops), asymmetric padding (torch pads first), dilation, groups, 1d and 3d, odd sizes
CONV_BACKWARD = [  # x shape, w shape, kwargs for tinyc (padding of 2 * spatial dims: torch pads x with it first)
  ((2, 3, 13, 7), (4, 3, 3, 3), {"stride": 3}), ((1, 2, 7, 13), (3, 2, 3, 2), {"stride": 2, "padding": 2}),
  ((2, 4, 13, 13), (6, 2, 3, 3), {"groups": 2, "dilation": 2, "padding": (2, 1), "stride": (1, 3)}),
  ((1, 4, 7, 7), (4, 1, 3, 3), {"groups": 4, "stride": 2, "padding": 1}), ((1, 2, 7, 7), (3, 2, 1, 1), {"padding": 1, "stride": 2}),
  ((1, 2, 7, 7), (2, 2, 2, 2), {"padding": 2, "dilation": 2}), ((1, 2, 7, 13), (3, 2, 3, 3), {"padding": [1, 2, 0, 1], "stride": 2}),
  ((2, 8, 13, 13), (8, 8, 3, 3), {"padding": 1}), ((2, 3, 13), (4, 3, 3), {"stride": 2, "padding": 1}),
  ((1, 2, 13), (2, 2, 2), {"stride": 3, "dilation": 2}), ((1, 4, 5, 7, 6), (4, 2, 3, 2, 3), {"stride": (2, 1, 3), "padding": 1, "groups": 2}),
]

def _torch_conv(x, w, b, padding=0, **kwargs):
  if isinstance(padding, list): x, padding = tF.pad(x, padding), 0
  return {3: tF.conv1d, 4: tF.conv2d, 5: tF.conv3d}[x.ndim](x, w, b, padding=padding, **kwargs)

@pytest.mark.parametrize("dtype, atol, rtol", [(dtypes.float32, 1e-4, 1e-3), (dtypes.float16, 2e-2, 1e-2)])
def test_conv2d_own_backward(dtype, atol, rtol):
  cases = {}
  for i, (x, w, kw) in enumerate(CONV_BACKWARD):
    arrays = [random_array(shape, dtype, seed=i + j) for j, shape in enumerate((x, w, w[:1]))]
    cases[f"{x}-{w}-{kw}"] = (arrays, lambda x, w, b, kw=kw: _torch_conv(x, w, b, **kw), lambda x, w, b, kw=kw: x.conv2d(w, b, **kw))
  check_grads(cases, atol=atol, rtol=rtol)

def test_conv2d_backward_of_one_input_and_mixed_dtypes():
  """Only the weight (first layer: the images need no gradient), only the input, and a float16 input with a float32 weight: each
  gradient in its input's dtype."""
  check_grad([random_array((2, 3, 7, 7), seed=1), random_array((4, 3, 3, 3), seed=2).astype(np.int32)], lambda x, w: tF.conv2d(x, w.float()),
             lambda x, w: x.conv2d(w.float()))
  check_grad([random_array((2, 3, 7, 7), seed=1).astype(np.int32), random_array((4, 3, 3, 3), seed=2)], lambda x, w: tF.conv2d(x.float(), w),
             lambda x, w: x.float().conv2d(w))
  check_grad([random_array((2, 3, 7, 7), dtypes.float16, seed=1), random_array((4, 3, 3, 3), seed=2)],
             lambda x, w: tF.conv2d(x.float(), w, stride=2), lambda x, w: x.conv2d(w, stride=2), atol=1e-3)

def test_backward_through_a_freed_graph_raises_as_torch_does():
  """A second loss built on an intermediate of a graph a backward already freed: torch raises, and tinyc, which keeps no graph
  either, used to stop at the intermediate silently (x.grad missed the second loss's share)."""
  x = Tensor([1.0, 2.0], requires_grad=True)
  y = x * 3
  y.sum().backward()
  with pytest.raises(RuntimeError, match="backward through the graph a second time"): (y * 2).sum().backward()
  np.testing.assert_equal(x.grad.numpy(), [3.0, 3.0])
  tx = torch.tensor([1.0, 2.0], requires_grad=True)
  ty = tx * 3
  ty.sum().backward()
  with pytest.raises(RuntimeError, match="backward through the graph a second time"): (ty * 2).sum().backward()

def test_conv2d_second_backward_raises():
  """The graph is freed by a backward, as torch's is without retain_graph: a second one raises instead of adding to .grad again."""
  x, w = Tensor(random_array((1, 2, 5, 5)), requires_grad=True), Tensor(random_array((3, 2, 3, 3)), requires_grad=True)
  loss = x.conv2d(w, padding=1).sum()
  loss.backward()
  assert x.grad is not None and not x.grad.requires_grad
  first = x.grad.numpy()
  with pytest.raises(RuntimeError): loss.backward()
  np.testing.assert_equal(x.grad.numpy(), first)

@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float16])
def test_conv2d_gradients_are_one_reduce_kernel_each(dtype):
  """conv2d's own backward: the input gradient is one transposed convolution, a forward-style reduce that writes only x's gradient
  (autograd through the pooling views made a (batch, cin, pixels, 9, cout) product in memory, then folded it), and the weight
  gradient one reduce over the batch and the pixels."""
  x, w, g = [Tensor.empty(*shape, dtype=dtype, requires_grad=True).realize() for shape in ((2, 8, 12, 12), (8, 8, 3, 3), (2, 8, 12, 12))]
  (x.conv2d(w, padding=1) * g).sum().backward()
  for leaf in (x, w):
    assert leaf.grad is not None and leaf.grad.dtype == dtype
    items = [item for item in create_schedule([leaf.grad.lazydata]) if item.ast.op not in LoadOps]
    reduces = [item for item in items if any(op.op in ReduceOps for op in _ast_ops(item.ast))]
    assert len(reduces) == 1, f"{len(reduces)} reduce kernels for {leaf.shape}'s gradient"
    assert all(prod(out.shape) <= x.numel() for item in items for out in item.outs), [out.shape for item in items for out in item.outs]
    # besides it, only a 16-bit conv's operands copied channels-last (tensor_nn._channels_last): the gradient and the weight for the
    # input's gradient, the input and the gradient for the weight's
    assert len(items) == (3 if dtype != dtypes.float32 else 1), f"{len(items)} kernels for {leaf.shape}'s gradient"

def _ast_ops(ast):
  yield ast
  for src in ast.src: yield from _ast_ops(src)

CONV_TRANSPOSE = [  # x shape, w shape (in, out/groups, kh, kw), kwargs
  ((2, 2, 3, 3), (2, 3, 3, 3), {}), ((1, 2, 3, 3), (2, 2, 3, 3), {"stride": 2, "padding": 1, "output_padding": 1}),
  ((1, 4, 3, 3), (4, 1, 2, 2), {"groups": 2, "stride": 2}), ((1, 2, 3, 3), (2, 2, 3, 3), {"dilation": 2, "padding": (1, 2)}),
  ((1, 2, 3, 4), (2, 2, 2, 3), {"stride": (1, 2), "output_padding": (0, 1)}),
]

def test_conv_transpose2d():
  check_grads({f"{x}-{w}-{kw}": ([x, w, (w[1] * kw.get("groups", 1),)], lambda x, w, b, kw=kw: tF.conv_transpose2d(x, w, b, **kw),
                                 lambda x, w, b, kw=kw: x.conv_transpose2d(w, b, **kw)) for x, w, kw in CONV_TRANSPOSE}, atol=1e-4)

POOL = [((1, 2, 4, 4), {}), ((2, 1, 5, 6), {"kernel_size": 3, "stride": 1}), ((1, 2, 7, 7), {"kernel_size": (3, 2), "stride": (2, 3)}),
        ((1, 1, 6, 6), {"kernel_size": 2, "stride": 1, "dilation": 2})]

def test_pool2d():
  cases = {}
  for shape, kwargs in POOL:
    torch_kwargs = {"kernel_size": 2, **kwargs}
    cases[f"max-{shape}-{kwargs}"] = ([shape], lambda x, t=torch_kwargs: tF.max_pool2d(x, **t), lambda x, k=kwargs: x.max_pool2d(**k))
    if "dilation" not in kwargs:  # torch's avg_pool2d has none
      cases[f"avg-{shape}-{kwargs}"] = ([shape], lambda x, t=torch_kwargs: tF.avg_pool2d(x, **t), lambda x, k=kwargs: x.avg_pool2d(**k))
  check_grads(cases)

def test_max_pool2d_ties():
  """Tied maxima in a window share the gradient (torch's max_pool2d gives it to one index; amax over the windows splits it)."""
  windows = lambda x, k, s: x.unfold(2, k, s).unfold(3, k, s).amax((-2, -1))
  check_grads({"2x2": ([integers((1, 2, 4, 4), 0, 1, seed=3)], lambda x: windows(x, 2, 2), lambda x: x.max_pool2d(2)),
               "3x3_overlapping": ([integers((1, 1, 5, 5), 0, 1, seed=4)], lambda x: windows(x, 3, 1), lambda x: x.max_pool2d(3, 1))})

# ***** normalization, attention, losses *****

def test_layernorm():
  check_grads({"last": ([(2, 3, 4)], lambda x: tF.layer_norm(x, (4,)), lambda x: x.layernorm()),
               "last_two": ([(2, 3, 4)], lambda x: tF.layer_norm(x, (3, 4), eps=1e-3), lambda x: x.layernorm((-2, -1), eps=1e-3)),
               "affine": ([(3, 4), (4,), (4,)], lambda x, w, b: tF.layer_norm(x, (4,), w, b), lambda x, w, b: x.layernorm() * w + b)})

def test_batchnorm():
  """With the statistics as inputs (eval), and computed from the batch (training: the gradient flows through mean and var too)."""
  def torch_eval(x, w, b, mean, var):
    return (x - mean[:, None, None]) * (var.abs() + 0.5).rsqrt()[:, None, None] * w[:, None, None] + b[:, None, None]
  def tinyc_eval(x, w, b, mean, var): return x.batchnorm(w, b, mean, (var.abs() + 0.5).rsqrt())
  def tinyc_train(x, w, b):
    axes = (0, 2, 3)
    return x.batchnorm(w, b, x.mean(axes), (x.var(axes, correction=0) + 1e-5).rsqrt())
  check_grads({"eval": ([(2, 3, 4, 4), (3,), (3,), (3,), (3,)], torch_eval, tinyc_eval),
               "no_affine": ([(2, 3, 4), (3,), (3,)], lambda x, m, v: (x - m[:, None]) * v[:, None], lambda x, m, v: x.batchnorm(None, None, m, v)),
               "train": ([(2, 3, 4, 4), (3,), (3,)], lambda x, w, b: tF.batch_norm(x, None, None, w, b, training=True), tinyc_train)}, atol=1e-4)

ATTENTION = [  # q, k, v shapes and kwargs (masks are made in the test)
  ((2, 3, 4), (2, 5, 4), (2, 5, 3), {}), ((1, 2, 3, 4), (1, 2, 5, 4), (1, 2, 5, 2), {"is_causal": True}),
  ((2, 3, 4), (2, 5, 4), (2, 5, 3), {"mask": "bool"}), ((2, 3, 4), (2, 5, 4), (2, 5, 3), {"mask": "float"}),
]

def attention_case(q: tuple[int, ...], k: tuple[int, ...], v: tuple[int, ...], kwargs: dict):
  kwargs = dict(kwargs)
  mask = kwargs.pop("mask", None)
  if mask == "bool":
    kwargs["attn_mask"] = random_array((q[-2], k[-2]), dtypes.bool, seed=9)
    kwargs["attn_mask"][:, 0] = True  # no row masked out entirely (that is 0/0 = nan in torch too)
  elif mask == "float": kwargs["attn_mask"] = random_array((q[-2], k[-2]), seed=9)  # a float mask is added to the scores
  torch_kwargs = {k: torch.from_numpy(v) if k == "attn_mask" else v for k, v in kwargs.items()}
  tinyc_kwargs = {k: Tensor(v) if k == "attn_mask" else v for k, v in kwargs.items()}
  return ([q, k, v], lambda q, k, v: tF.scaled_dot_product_attention(q, k, v, **torch_kwargs),
          lambda q, k, v: q.scaled_dot_product_attention(k, v, **tinyc_kwargs))

def test_scaled_dot_product_attention():
  check_grads({f"{q}-{k}-{v}-{kwargs}": attention_case(q, k, v, kwargs) for q, k, v, kwargs in ATTENTION})

def test_binary_crossentropy():
  targets = random_array((3, 4), low=0, high=1, seed=11)
  const = lambda fn, y: lambda x: fn(x, torch.from_numpy(y))
  logits = np.array([-100.0, -3.0, 0.0, 0.0, 2.0, 100.0], np.float32)  # 0 (sigmoid(0) - y) and far out (no overflow)
  hard = np.array([0.0, 1.0, 0.0, 1.0, 0.5, 0.0], np.float32)
  # saturated probabilities (sigmoid(20) is exactly 1.0 in float32): torch's gradient (x - y) / max(x (1 - x), 1e-12), never nan
  probabilities, labels = np.array([0.0, 1.0, 0.0, 1.0, 0.3, 1e-30, 0.999], np.float32), np.array([0, 1, 1, 0, 0.5, 1, 0], np.float32)
  check_grads({
    "bce": ([random_array((3, 4), low=0.05, high=0.95)], const(tF.binary_cross_entropy, targets), lambda x: x.binary_crossentropy(Tensor(targets))),
    "bce_logits": ([random_array((3, 4), low=-4, high=4)], const(tF.binary_cross_entropy_with_logits, targets),
                   lambda x: x.binary_crossentropy_logits(Tensor(targets))),
    "bce_logits_extremes": ([logits], const(tF.binary_cross_entropy_with_logits, hard), lambda x: x.binary_crossentropy_logits(Tensor(hard))),
    "bce_saturated": ([probabilities], const(tF.binary_cross_entropy, labels), lambda x: x.binary_crossentropy(Tensor(labels))),
    # the targets as leaves too: torch differentiates both arguments (where x saturates, torch's target gradient is an unclamped inf)
    "bce_targets": ([targets[:2, :3] * 0.9 + 0.05, targets[1:, 1:]], tF.binary_cross_entropy, lambda x, y: x.binary_crossentropy(y)),
    "bce_logits_targets": ([(2, 3), targets[:2, :3]], tF.binary_cross_entropy_with_logits, lambda x, y: x.binary_crossentropy_logits(y)),
  })

SPARSE = [  # logits shape, labels, kwargs
  ((4, 5), [0, 3, 4, 1], {}), ((4, 5), [2, 3, 0, 0], {"label_smoothing": 0.1}), ((4, 5), [1, -1, 4, 2], {"ignore_index": -1, "label_smoothing": 0.2}),
  ((4, 5), [1, 7, 7, 2], {"ignore_index": 7}), ((2, 3, 5), [[0, 1, 2], [4, -1, 3]], {"ignore_index": -1, "label_smoothing": 0.1}),
]

def test_sparse_categorical_crossentropy():
  cases = {}
  for shape, labels, kwargs in SPARSE:
    # torch wants the classes in dim 1 (and int64 labels)
    def torch_fn(x, y, kw=kwargs): return tF.cross_entropy(x if x.ndim == 2 else x.permute(0, 2, 1), y.long(), **{"ignore_index": -100, **kw})
    cases[f"{shape}-{labels}-{kwargs}"] = ([shape, np.array(labels, np.int64)], torch_fn,
                                           lambda x, y, kw=kwargs: x.sparse_categorical_crossentropy(y, **kw))
  cases["int32_labels"] = ([(4, 5), np.array([1, -1, 4, 2], np.int32)], cases[f"{SPARSE[2][0]}-{SPARSE[2][1]}-{SPARSE[2][2]}"][1],
                           lambda x, y: x.sparse_categorical_crossentropy(y, ignore_index=-1, label_smoothing=0.2))
  check_grads(cases, low=-3, high=3)

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

@pytest.mark.parametrize("no_grad", [False, True])
def test_binary_ops_requires_grad(no_grad: bool):
  # + - * / of operands none of which wants a gradient make no Function (Tensor._binary): the result's requires_grad, its tape and
  # its value must be what recording one gives, for every mix of None, False and True, scalar and reversed operands included
  ops = {"add": (lambda x, y: x + y, np.add), "sub": (lambda x, y: x - y, np.subtract), "mul": (lambda x, y: x * y, np.multiply),
         "div": (lambda x, y: x / y, np.divide), "rsub": (lambda x, y: 2 - x, lambda x, y: 2 - x), "rdiv": (lambda x, y: 3 / x, lambda x, y: 3 / x)}
  xs, ys = np.array([1.0, 2.0, -3.0], np.float32), np.array([4.0, -0.5, 2.0], np.float32)
  try:
    Tensor.no_grad = no_grad
    for (name, (op, reference)), first, second in itertools.product(ops.items(), (None, False, True), (None, False, True)):
      x, y = Tensor(xs, requires_grad=first), Tensor(ys, requires_grad=second)
      result = op(x, y)
      wants = (first, None) if name in ("rsub", "rdiv") else (first, second)  # (a scalar is a constant: requires_grad None)
      wanted = (not no_grad) if True in wants else None if None in wants else False  # Function's rule, as _apply follows it
      assert result.requires_grad is wanted and (result._ctx is not None) == bool(wanted), (name, first, second, result.requires_grad)
      np.testing.assert_allclose(result.numpy(), reference(xs, ys), rtol=1e-6)
  finally: Tensor.no_grad = False
  x, y = Tensor(xs, requires_grad=True), Tensor(ys)
  (x * y / 2 - 1).sum().backward()  # and a gradient still flows through each of them
  assert x.grad is not None and y.grad is None
  np.testing.assert_allclose(x.grad.numpy(), ys / 2, rtol=1e-6)

def test_binary_ops_at_once_match_broadcasting():
  # Tensor._binary makes a same-shaped tensor op and a float tensor's scalar op at once (no _broadcasted): each must give what the
  # broadcasting path gives, reversed operands, int and bool scalars, a half tensor and the cases that still cast or broadcast included
  xs, ys = np.array([1.5, -2.0, 3.0], np.float32), np.array([0.5, 4.0, -1.0], np.float32)
  x, y = Tensor(xs), Tensor(ys)
  cases = [(x.sub(y, reverse=True), ys - xs), (x.div(y, reverse=True), ys / xs), (x.sub(2, reverse=True), 2 - xs), (x * True, xs),
           (x - 3, xs - 3), (7 / x, 7 / xs), (x.cast(dtypes.float16) + 1, xs.astype(np.float16) + 1), (Tensor([1, 2, 3]) * 2.5, [2.5, 5.0, 7.5]),
           (x * Tensor([2.0]), xs * 2), (x + Tensor([1, 2, 3]), xs + [1, 2, 3])]
  for result, expected in cases: np.testing.assert_allclose(result.numpy(), expected, rtol=1e-3)
  assert (x.cast(dtypes.float16) * 2).dtype == dtypes.float16 and (Tensor([1, 2]) * 2.5).dtype == dtypes.float32

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
  check_grads({"mask": ([(3, 4)], lambda x: x * (x > 0), None), "argmax": ([(3, 4)], lambda x: x * x.argmax(1, keepdim=True), None),
               "condition": ([(3, 4), (3, 4)], lambda x, y: torch.where(x < y, x * y, 0.0), lambda x, y: (x < y).where(x * y, 0.0))})

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
  # observed: 3 kernels (x @ w, which both gradients read, then w's gradient x.T @ (mask * 1) and b's, each one fused reduce)
  assert GlobalCounters.kernel_count <= 6, f"{GlobalCounters.kernel_count} kernels"
  reference = [torch.tensor(a.numpy(), requires_grad=True) for a in (x, w, b)]
  torch.relu(reference[0] @ reference[1] + reference[2]).sum().backward()
  np.testing.assert_allclose(w.grad.numpy(), reference[1].grad.numpy(), rtol=1e-5, atol=1e-5)
  np.testing.assert_allclose(b.grad.numpy(), reference[2].grad.numpy(), rtol=1e-5, atol=1e-5)
