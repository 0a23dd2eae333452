"""Forward ops against PyTorch (numpy where torch has no such indexing): elementwise math with broadcasting and type promotion,
reductions, movement and indexing, matmul, convolution, pooling and activations, on edge shapes and non-contiguous views.
Tables keep it compact: each row is one op, and each test runs a row over several shapes or dtypes."""
from __future__ import annotations
import math
import numpy as np
import pytest
import torch
import torch.nn.functional as tF
from tinyc import Tensor, dtypes
from helpers import TORCH_DTYPE, check, compare, random_array, to_tinyc

f32, f16, bf16, f64, i8, u8, i16, i32, i64, boolean = (dtypes.float32, dtypes.float16, dtypes.bfloat16, dtypes.float64, dtypes.int8, dtypes.uint8,
                                                      dtypes.int16, dtypes.int32, dtypes.int64, dtypes.bool)
HALF_TOL = {"atol": 1e-2, "rtol": 1e-2}

def pair_id(pair) -> str: return f"{pair[0].name}-{pair[1].name}"

def tol(dtype) -> dict:
  return HALF_TOL if dtype in (f16, bf16) else {"atol": 1e-5, "rtol": 1e-4}

def nonzero(y):
  """y with its zeros replaced by ones, written so it runs on torch and tinyc alike (for divisors)."""
  return y + (y == 0)

# ***** unary *****

# name: (fn for torch and tinyc, low, high)
UNARY = {
  "neg": (lambda x: -x, -2, 2), "neg_method": (lambda x: x.neg(), -2, 2), "log": (lambda x: x.log(), 0.1, 3), "log2": (lambda x: x.log2(), 0.1, 3),
  "exp": (lambda x: x.exp(), -3, 3), "exp2": (lambda x: x.exp2(), -3, 3), "sqrt": (lambda x: x.sqrt(), 0, 3), "rsqrt": (lambda x: x.rsqrt(), 0.1, 3),
  "sin": (lambda x: x.sin(), -5, 5), "cos": (lambda x: x.cos(), -5, 5), "tan": (lambda x: x.tan(), -1.2, 1.2),
  "trunc": (lambda x: x.trunc(), -15, 15), "ceil": (lambda x: x.ceil(), -15, 15), "floor": (lambda x: x.floor(), -15, 15),
  "square": (lambda x: x.square(), -3, 3), "clip": (lambda x: x.clip(-1, 1), -2, 2), "clip_float_bounds": (lambda x: x.clip(-0.5, 1.5), -2, 2),
  "abs": (lambda x: x.abs(), -2, 2), "sign": (lambda x: x.sign(), -2, 2), "reciprocal": (lambda x: x.reciprocal(), 0.5, 3),
}
# bfloat16 inputs are rounded once on each side; torch computes bfloat16 math in float32 and rounds once, so allow 2 ulps
UNARY_DTYPES = [f32, f16, bf16, f64, i32, i8, u8]

@pytest.mark.parametrize("dtype", UNARY_DTYPES, ids=str)
@pytest.mark.parametrize("name", UNARY)
def test_unary(name, dtype):
  fn, low, high = UNARY[name]
  if name.startswith("neg") and dtype == u8: pytest.skip("torch has no neg for uint8")
  check([(2, 3, 4)], fn, low=low, high=high, dtype=dtype, **({"atol": 3e-2, "rtol": 2e-2} if dtype == bf16 else tol(dtype)))

@pytest.mark.parametrize("name", UNARY)
def test_unary_edge_shapes(name):
  """0-d, zero-size, size-1 dims and non-contiguous (permuted, flipped, strided) inputs."""
  fn, low, high = UNARY[name]
  for shape in [(), (0, 3), (1, 1)]: check([shape], fn, low=low, high=high)
  check([(4, 3, 2)], lambda x: fn(x.permute(2, 0, 1)), low=low, high=high)
  check([(4, 3, 2)], lambda x: fn(x.flip(1)[::2]), lambda x: fn(x[::2, ::-1]), low=low, high=high)

def test_unary_special_values():
  values = [0.0, -0.0, 1.0, -1.0, 0.5, -0.5, 2.5, -2.5, 1e-30, 3e9, -3e9, 1e30, math.inf, -math.inf, math.nan]
  want, got = torch.tensor(values), Tensor(values)
  for name in ["neg", "exp", "exp2", "sin", "trunc", "ceil", "floor", "square", "abs", "sign", "reciprocal"]:
    compare(getattr(got, name)(), getattr(want, name)(), atol=1e-6, rtol=1e-5)
  positive = [0.0, 1e-30, 0.5, 1.0, 3e9, 1e30, math.inf, -1.0, math.nan]
  for name in ["log", "log2", "sqrt"]: compare(getattr(Tensor(positive), name)(), getattr(torch.tensor(positive), name)(), atol=1e-6, rtol=1e-5)
  for big in [3e9, -3e9, 1e15, 2.0 ** 40 + 0.5]:  # beyond int32: trunc/floor/ceil must not go through a 32-bit integer
    for dtype in [f32, f64]: compare(Tensor([big, big / 7], dtype=dtype).floor(), torch.tensor([big, big / 7], dtype=torch.float64).to(
      torch.float32 if dtype == f32 else torch.float64).floor())

NAN_INF = {  # name: (fn for both, or (torch fn, tinyc fn))
  "le": lambda x: x <= 1, "ge": lambda x: x >= 1, "lt": lambda x: x < 1, "gt": lambda x: x > 1, "eq": lambda x: x == x, "ne": lambda x: x != x,
  "le_tensor": lambda x: x <= x.flip(0), "ge_tensor": lambda x: x >= x.flip(0),
  "maximum": (lambda x: torch.maximum(x, x.flip(0)), lambda x: x.maximum(x.flip(0))),
  "minimum": (lambda x: torch.minimum(x, x.flip(0)), lambda x: x.minimum(x.flip(0))), "clip": lambda x: x.clip(-0.5, 0.5), "relu": lambda x: x.relu(),
  "relu6": (tF.relu6, lambda x: x.relu6()), "hardtanh": (tF.hardtanh, lambda x: x.hardtanh()), "hardswish": (tF.hardswish, lambda x: x.hardswish()),
  "max": (lambda x: x.amax(), lambda x: x.max()), "min": (lambda x: x.amin(), lambda x: x.min()),
  "argmax": lambda x: x.argmax(), "argmin": lambda x: x.argmin(),
  "argmax_finite": lambda x: x[1:].argmax(), "argmin_finite": lambda x: x[1:].argmin(), "sum": lambda x: x[1:4].sum(), "mean": lambda x: x.mean(),
  "sign": lambda x: x.sign(), "abs": lambda x: x.abs(), "trunc": lambda x: x.trunc(), "floor": lambda x: x.floor(), "ceil": lambda x: x.ceil(),
  "sigmoid": lambda x: x.sigmoid(), "tanh": lambda x: x.tanh(), "exp": lambda x: x.exp(), "softplus": (tF.softplus, lambda x: x.softplus()),
  "pow_one_base": lambda x: 1.0 ** x, "pow_zero_exp": lambda x: x ** 0, "pow_float": lambda x: x.abs() ** 0.5,
  "softmax_finite": lambda x: x[1:3].softmax(0),
}

@pytest.mark.parametrize("dtype", [f32, f16], ids=str)
def test_nan_inf(dtype):
  """NaN and infinities: comparisons with NaN are false, NaN propagates through max/min/clip and counts as the max for argmax, as in torch."""
  values = [math.nan, 1.0, -1.0, math.inf, -math.inf, 0.0, 7.0]
  for name, fns in NAN_INF.items():
    torch_fn, tiny_fn = fns if isinstance(fns, tuple) else (fns, fns)
    want = torch_fn(torch.tensor(values, dtype=TORCH_DTYPE[dtype]))
    compare(tiny_fn(Tensor(values, dtype=dtype)), want, atol=1e-6, rtol=2e-3, input_dtypes=[dtype])

def test_negative_zero_constant_is_not_taken_for_zero():
  """-0.0 == 0.0 in Python, but 1/(x * -0.0) is -inf: a kernel (or a plan) made for one constant must not serve the other."""
  x, tx = Tensor([1.0, 2.0]), torch.tensor([1.0, 2.0])
  for zero in [0.0, -0.0, 0.0]:
    np.testing.assert_equal((1 / (x * zero)).numpy(), (1 / (tx * zero)).numpy())
    np.testing.assert_equal(Tensor.full((2,), zero).reciprocal().numpy(), torch.full((2,), zero).reciprocal().numpy())

def test_adding_zero_turns_negative_zero_positive():
  """-0.0 + 0.0 is 0.0, so x + 0.0 is not x; x + -0.0 is."""
  x, tx = Tensor([-1.0, 1.0]), torch.tensor([-1.0, 1.0])
  for zero in [0.0, -0.0]:
    np.testing.assert_equal((1 / (x * 0.0 + zero)).numpy(), (1 / (tx * 0.0 + zero)).numpy())
    np.testing.assert_equal((1 / (zero + x * 0.0)).numpy(), (1 / (zero + tx * 0.0)).numpy())

def test_rsqrt_zero():
  np.testing.assert_equal(Tensor([0.0, 4.0]).rsqrt().numpy(), [math.inf, 0.5])

# ***** binary, with broadcasting and type promotion *****

BINARY = {
  "add": lambda x, y: x + y, "sub": lambda x, y: x - y, "mul": lambda x, y: x * y, "div": lambda x, y: x / nonzero(y),
  "floordiv": lambda x, y: x // nonzero(y), "mod": lambda x, y: x % nonzero(y), "maximum": lambda x, y: x.maximum(y),
  "minimum": lambda x, y: x.minimum(y), "add_method": lambda x, y: x.add(y), "sub_method": lambda x, y: x.sub(y), "mul_method": lambda x, y: x.mul(y),
  "div_method": lambda x, y: x.div(nonzero(y)),
}
BROADCAST_SHAPES = [((3, 4), (3, 4)), ((3, 1), (1, 4)), ((4,), (2, 3, 4)), ((), (2, 3)), ((2, 3), ()), ((0, 3), (1, 3)), ((2, 1, 3), (4, 1))]
BINARY_DTYPES = [(f32, f32), (i32, i32), (f16, f16), (i8, u8), (i32, f16), (u8, u8), (i64, i32), (f32, f64), (bf16, f32)]

@pytest.mark.parametrize("dtypes_", BINARY_DTYPES, ids=pair_id)
@pytest.mark.parametrize("name", BINARY)
def test_binary(name, dtypes_):
  if name.startswith("sub") and dtypes.bool in dtypes_: pytest.skip("torch has no bool subtraction")
  fn = BINARY[name]
  for shapes in BROADCAST_SHAPES[:2] if dtypes_ != (f32, f32) else BROADCAST_SHAPES:
    check(shapes, fn, low=-9, high=9, dtype=dtypes_, **tol(dtypes_[0] if dtypes_[0] in (f16, bf16) else dtypes_[1]))

def test_binary_noncontiguous():
  for name, fn in BINARY.items():
    check([(3, 4), (4, 3)], lambda x, y: fn(x, y.T), low=-9, high=9)
    check([(4, 6), (2, 6)], lambda x, y: fn(x[::2], y.flip(1)), lambda x, y: fn(x[::2], y[:, ::-1]), low=-9, high=9)

@pytest.mark.one_device  # (test_transcendental runs exp2 and log2 on each device)
@pytest.mark.parametrize("dtype", [f32, i32, u8, f16], ids=str)
def test_pow(dtype):
  kw = {"dtype": dtype, **tol(dtype)}
  if dtypes.is_float(dtype):
    check([(3, 4), (3, 4)], lambda x, y: x.abs() ** y, low=-2, high=2, **kw)
    check([(3, 4), (1, 4)], lambda x, y: x ** (y * 3).round(), lambda x, y: x ** (y * 3).round_half_even(), **kw)  # negative base, integral power
    check([(3, 4)], lambda x: x ** 0.5, low=0, high=3, **kw)
    check([(3, 4)], lambda x: x ** -1, low=0.5, high=3, **kw)
    check([(3, 4)], lambda x: x ** -1.5, low=0.5, high=3, **kw)
    check([(3, 4)], lambda x: x.pow(3), **kw)
    check([(3, 4)], lambda x: x ** 1.5, **kw)  # nan for the negatives, as in torch
  check([(3, 4), (3, 4)], lambda x, y: x ** y, low=0, high=3, **kw)
  check([(3, 4)], lambda x: 2 ** x, low=0, high=3, **kw)
  check([(3, 4)], lambda x: 1.5 ** x, low=0, high=3, **kw)
  for exponent in [0, 1, 2, 3]: check([(3, 4)], lambda x: x ** exponent, low=0, high=3, **kw)

SCALAR_OPS = {
  "add": lambda x, s: x + s, "radd": lambda x, s: s + x, "sub": lambda x, s: x - s, "rsub": lambda x, s: s - x, "mul": lambda x, s: x * s,
  "rmul": lambda x, s: s * x, "pow": lambda x, s: x.abs() ** s, "rpow": lambda x, s: abs(s) ** x, "div": lambda x, s: x / s,
  "rdiv": lambda x, s: s / nonzero(x), "floordiv": lambda x, s: x // s,
  "rfloordiv": lambda x, s: s // nonzero(x), "mod": lambda x, s: x % s, "rmod": lambda x, s: s % nonzero(x),
  "lt": lambda x, s: x < s, "rlt": lambda x, s: s < x, "le": lambda x, s: x <= s, "gt": lambda x, s: x > s,
  "ge": lambda x, s: x >= s, "eq": lambda x, s: x == s, "ne": lambda x, s: x != s,
}

@pytest.mark.one_device  # (test_binary runs each op on each device)
@pytest.mark.parametrize("scalar", [3, -2, 2.5, -0.5], ids=str)
@pytest.mark.parametrize("dtype", [f32, i32, u8, f16], ids=str)
def test_scalar_ops(dtype, scalar):
  """tensor op Python scalar and reflected: the scalar keeps an int tensor int and a float scalar makes it float (PyTorch's rule)."""
  if dtype == u8 and scalar < 0: pytest.skip("a negative scalar wraps around in uint8, which torch treats inconsistently across ops")
  if dtype == u8 and isinstance(scalar, float): pytest.skip("torch's floordiv/mod of uint8 by a float scalar")
  for name, fn in SCALAR_OPS.items():
    if dtype == u8 and name == "rsub" or dtypes.is_int(dtype) and name == "pow" and scalar < 0: continue
    check([(2, 3)], lambda x: fn(x, scalar), low=-5, high=5, dtype=dtype, **tol(dtype))
  for name in ["maximum", "minimum"]:  # torch takes no scalar here; a 0-d tensor promotes like a scalar
    check([(2, 3)], lambda x: getattr(torch, name)(x, torch.tensor(scalar)), lambda x: getattr(x, name)(scalar), low=-5, high=5, dtype=dtype,
          **tol(dtype))
    check([(2, 3)], lambda x: x.clip(scalar, None) if name == "maximum" else x.clip(None, scalar), lambda x: getattr(x, name)(scalar), low=-5, high=5,
          dtype=dtype, **tol(dtype))

def test_scalar_bool_ops():
  check([(2, 3)], lambda x: x + True, dtype=i32)
  check([(2, 3)], lambda x: x * False, dtype=f32)
  check([(2, 3)], lambda x: x + 1, dtype=boolean)  # bool + int -> default int
  check([(2, 3)], lambda x: x * 1.5, dtype=boolean)
  check([(2, 3)], lambda x: x == True, dtype=boolean)  # noqa: E712

COMPARE = {"lt": lambda x, y: x < y, "le": lambda x, y: x <= y, "gt": lambda x, y: x > y, "ge": lambda x, y: x >= y, "eq": lambda x, y: x == y,
           "ne": lambda x, y: x != y}

@pytest.mark.parametrize("dtypes_", [(f32, f32), (i32, i32), (i8, f32), (u8, i8), (boolean, boolean), (f16, i32)], ids=pair_id)
@pytest.mark.parametrize("name", COMPARE)
def test_compare(name, dtypes_):
  for shapes in BROADCAST_SHAPES[:3] + BROADCAST_SHAPES[5:6]: check(shapes, COMPARE[name], low=-2, high=2, dtype=dtypes_)

BITWISE = {"and": lambda x, y: x & y, "or": lambda x, y: x | y, "xor": lambda x, y: x ^ y}

@pytest.mark.parametrize("dtypes_", [(boolean, boolean), (i32, i32), (u8, u8), (i8, i16), (boolean, i8)], ids=pair_id)
@pytest.mark.parametrize("name", BITWISE)
def test_bitwise(name, dtypes_):
  fn = BITWISE[name]
  for shapes in BROADCAST_SHAPES[:2]: check(shapes, fn, low=-100, high=100, dtype=dtypes_)
  check([(3, 4)], lambda x: fn(x, True), dtype=dtypes_[0])
  check([(3, 4)], lambda x: fn(True, x), dtype=dtypes_[0])
  if dtypes_[0] != boolean: check([(3, 4)], lambda x: fn(x, 6), lambda x: fn(6, x), low=0, high=100, dtype=dtypes_[0])

def test_bitwise_float_raises():
  with pytest.raises(TypeError): Tensor([1.0]) & Tensor([1.0])

def test_where():
  check([(3, 4), (3, 4), (3, 4)], lambda c, x, y: torch.where(c, x, y), lambda c, x, y: c.where(x, y), dtype=[boolean, f32, f32])
  check([(3, 1), (4,), (2, 1, 1)], lambda c, x, y: torch.where(c, x, y), lambda c, x, y: c.where(x, y), dtype=[boolean, f32, f32])
  check([(3, 4), (3, 4), (3, 4)], lambda c, x, y: torch.where(c, x, y), lambda c, x, y: c.where(x, y), dtype=[boolean, i32, f16], **HALF_TOL)
  check([(3, 4), (3, 4)], lambda c, x: torch.where(c, x, 2.5), lambda c, x: c.where(x, 2.5), dtype=[boolean, f32])
  check([(3, 4), (3, 4)], lambda c, y: torch.where(c, 7, y), lambda c, y: c.where(7, y), dtype=[boolean, i8])
  check([(3, 4)], lambda c: torch.where(c, 1.0, 0.0), lambda c: c.where(1.0, 0.0), dtype=boolean)
  check([(3, 4), (3, 4), (3, 4)], lambda c, x, y: torch.where(c != 0, x, y), lambda c, x, y: c.where(x, y), dtype=[f32, f32, f32])  # float condition
  check([(0, 4), (0, 4), (1, 4)], lambda c, x, y: torch.where(c, x, y), lambda c, x, y: c.where(x, y), dtype=[boolean, f32, f32])

def test_floordiv_mod_signs():
  """Python's rounding toward -inf for // and the divisor's sign for %, for ints and floats."""
  values = [7, -7, 6, -6, 0, 1, -1]
  divisors = [2, -2, 3, -3, 7, -7, 1]
  for dtype, tdtype in [(i32, torch.int32), (f32, torch.float32), (i8, torch.int8), (i64, torch.int64)]:
    x, y = Tensor(values, dtype=dtype).reshape(-1, 1), Tensor(divisors, dtype=dtype)
    tx, ty = torch.tensor(values, dtype=tdtype).reshape(-1, 1), torch.tensor(divisors, dtype=tdtype)
    compare(x // y, tx // ty, input_dtypes=[dtype])
    compare(x % y, tx % ty, input_dtypes=[dtype])

# integer // and % by zero: torch's CPU raises; a lazy kernel cannot, so tinyc gives 0 for both on every device, as numpy does
INT_DTYPES = [i8, u8, i16, i32, i64, dtypes.uint16, dtypes.uint32, dtypes.uint64]

@pytest.mark.parametrize("dtype", INT_DTYPES, ids=str)
def test_integer_division_and_modulo_by_zero_give_zero(dtype):
  """Tensor divisors with zeros among ordinary values, -1 (which traps on INT_MIN in hardware) and the dtype's extremes, against numpy."""
  low, high = int(dtypes.min(dtype)), int(dtypes.max(dtype))
  values = np.array([7, low, high, 0, 5, low, high, 3, 6, high], dtype=dtype.np)
  divisors = np.array([0, 0, 0, 0, high, 1 if low == 0 else -1, 1 if low == 0 else -1, high, 0, 2], dtype=dtype.np)
  x, y = Tensor(values, dtype=dtype), Tensor(divisors, dtype=dtype)
  with np.errstate(divide="ignore", over="ignore"):
    for got, want in [(x // y, np.floor_divide(values, divisors)), (x % y, np.remainder(values, divisors)),
                      (7 // y, np.floor_divide(np.array(7, dtype.np), divisors)), (7 % y, np.remainder(np.array(7, dtype.np), divisors)),
                      (x // Tensor.zeros(10, dtype=dtype), np.zeros(10, dtype.np)), (x % Tensor.zeros(10, dtype=dtype), np.zeros(10, dtype.np))]:
      assert got.dtype == dtype
      np.testing.assert_equal(got.numpy(), want)

def test_integer_division_of_constants_is_exact():
  """Kernels whose operands are both constants fold in Python: int64 quotients beyond float's 53 bits stay exact."""
  big = 2**62 + 1
  np.testing.assert_equal((Tensor.full((2,), big, dtype=i64) // Tensor.full((2,), 1, dtype=i64)).numpy(), [big, big])
  np.testing.assert_equal((Tensor.full((2,), -big, dtype=i64) % Tensor.full((2,), 2**40, dtype=i64)).numpy(), [-big % 2**40] * 2)

@pytest.mark.parametrize("dtype", [i32, i64, u8, boolean], ids=str)
def test_a_constant_zero_divisor_raises_at_once(dtype):
  """`t // 0` and `t % 0` on an integer result raise when the graph is built, as torch's CPU does (RuntimeError('ZeroDivisionError'))."""
  x = Tensor([1, 0, 1], dtype=dtype)
  for divide in [lambda: x // 0, lambda: x % 0, lambda: x // False, lambda: x.floordiv(0), lambda: x.mod(0)]:
    with pytest.raises(RuntimeError, match="ZeroDivisionError") as raised: divide()
    assert isinstance(raised.value, ZeroDivisionError)

def test_float_division_by_zero_stays_ieee():
  values = [1.0, -1.0, 0.0, 2.5]
  x, tx = Tensor(values), torch.tensor(values)
  for name, fn in {"floordiv": lambda a, s: a // s, "mod": lambda a, s: a % s, "div": lambda a, s: a / s}.items():
    compare(fn(x, 0), fn(tx, 0), input_dtypes=[f32])
    compare(fn(x, Tensor.zeros(4)), fn(tx, torch.zeros(4)), input_dtypes=[f32])
  compare(Tensor([1, -1, 0]) // 0.0, torch.tensor([1, -1, 0]) // 0.0, input_dtypes=[i32])  # a float scalar makes it float division

# ***** reductions *****

REDUCE = {
  "sum": (lambda x, ax, kd: x.sum(ax, keepdim=kd), lambda x, ax, kd: x.sum(dim=ax, keepdim=kd)),
  "max": (lambda x, ax, kd: x.max(ax, keepdim=kd), lambda x, ax, kd: torch.amax(x, dim=() if ax is None else ax, keepdim=kd)),
  "min": (lambda x, ax, kd: x.min(ax, keepdim=kd), lambda x, ax, kd: torch.amin(x, dim=() if ax is None else ax, keepdim=kd)),
  "mean": (lambda x, ax, kd: x.mean(ax, keepdim=kd), lambda x, ax, kd: x.mean(dim=ax, keepdim=kd)),
  "var": (lambda x, ax, kd: x.var(ax, keepdim=kd), lambda x, ax, kd: x.var(dim=ax, keepdim=kd)),
  "std": (lambda x, ax, kd: x.std(ax, keepdim=kd), lambda x, ax, kd: x.std(dim=ax, keepdim=kd)),
  "var0": (lambda x, ax, kd: x.var(ax, keepdim=kd, correction=0), lambda x, ax, kd: x.var(dim=ax, keepdim=kd, correction=0)),
  "std2": (lambda x, ax, kd: x.std(ax, keepdim=kd, correction=2), lambda x, ax, kd: x.std(dim=ax, keepdim=kd, correction=2)),
}
AXES = [None, 0, -1, 1, (0, 2), (-1, -3), (0, 1, 2)]

@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("name", REDUCE)
def test_reduce(name, keepdim):
  tiny_fn, torch_fn = REDUCE[name]
  for axis in AXES: check([(2, 3, 4)], lambda x: torch_fn(x, axis, keepdim), lambda x: tiny_fn(x, axis, keepdim), atol=1e-5)
  check([(4, 3)], lambda x: torch_fn(x.T, 0, keepdim), lambda x: tiny_fn(x.T, 0, keepdim), atol=1e-5)  # non-contiguous input
  check([(1, 5, 1)], lambda x: torch_fn(x, 1, keepdim), lambda x: tiny_fn(x, 1, keepdim), atol=1e-5)
  check([()], lambda x: torch_fn(x, None, keepdim), lambda x: tiny_fn(x, None, keepdim), atol=1e-5)

@pytest.mark.parametrize("dtype", [i32, i8, u8, boolean, f16, i64, bf16], ids=str)
@pytest.mark.parametrize("name", ["sum", "max", "min"])
def test_reduce_dtypes(name, dtype):
  """Sums of bools and ints below 32 bits accumulate in int32 (torch: int64), float16 sums accumulate in float32 and stay float16."""
  tiny_fn, torch_fn = REDUCE[name]
  for axis in [None, 1]: check([(3, 50)], lambda x: torch_fn(x, axis, False), lambda x: tiny_fn(x, axis, False), low=-100, high=100, dtype=dtype,
                               **({"atol": 0.5, "rtol": 1e-2} if dtype in (f16, bf16) else {}))

def test_reduce_int_mean_std():
  """torch refuses mean/var/std of integer tensors; tinyc computes them in the default float, like torch on x.float()."""
  for name in ["mean", "var", "std"]:
    tiny_fn, torch_fn = REDUCE[name]
    check([(3, 4)], lambda x: torch_fn(x.float(), 1, False), lambda x: tiny_fn(x, 1, False), low=-9, high=9, dtype=i32, atol=1e-5)

def test_reduce_zero_size():
  check([(0, 3)], lambda x: x.sum(0))
  check([(0, 3)], lambda x: x.sum())
  check([(3, 0)], lambda x: x.sum(1, keepdim=True))
  check([(0, 3)], lambda x: x.mean(1))
  check([(0, 3)], lambda x: x.mean(0))  # nan, as in torch
  check([(2, 0)], lambda x: torch.amax(x, 0), lambda x: x.max(0))
  check([(0, 2)], lambda x: torch.amax(x, 1, keepdim=True), lambda x: x.max(1, keepdim=True))
  for fn in [lambda x: x.max(1), lambda x: x.min(1), lambda x: x.max(), lambda x: x.argmax(1), lambda x: x.argmin()]:
    with pytest.raises(Exception) as torch_error: fn(torch.ones(2, 0))  # IndexError for a dim, RuntimeError for max() of everything
    with pytest.raises(torch_error.type, match=r"non-zero size|numel\(\) == 0"): fn(Tensor.ones(2, 0))

def test_reduce_axis_errors():
  x = Tensor.ones(2, 3)
  for fn in [lambda: x.sum(2), lambda: x.max(-3), lambda: x.mean((0, 5)), lambda: x.softmax(2), lambda: x.argmax(2), lambda: x.cumsum(-3)]:
    with pytest.raises(IndexError, match=r"Dimension out of range \(expected to be in range of \[-2, 1\], but got -?\d\)"): fn()

AXIS_OPS = {
  "softmax": (lambda x, ax: x.softmax(ax), lambda x, ax: x.softmax(ax)),
  "log_softmax": (lambda x, ax: x.log_softmax(ax), lambda x, ax: x.log_softmax(ax)),
  "argmax": (lambda x, ax: x.argmax(ax), lambda x, ax: x.argmax(ax)),
  "argmin": (lambda x, ax: x.argmin(ax), lambda x, ax: x.argmin(ax)),
  "argmax_keepdim": (lambda x, ax: x.argmax(ax, keepdim=True), lambda x, ax: x.argmax(ax, keepdim=True)),
  "argmin_keepdim": (lambda x, ax: x.argmin(ax, keepdim=True), lambda x, ax: x.argmin(ax, keepdim=True)),
  "cumsum": (lambda x, ax: x.cumsum(ax), lambda x, ax: x.cumsum(ax)),
}

@pytest.mark.parametrize("name", AXIS_OPS)
def test_axis_ops(name):
  tiny_fn, torch_fn = AXIS_OPS[name]
  for axis in [0, 1, 2, -1, -2]: check([(2, 3, 4)], lambda x: torch_fn(x, axis), lambda x: tiny_fn(x, axis), atol=1e-5)
  check([(5, 3)], lambda x: torch_fn(x.T, 1), lambda x: tiny_fn(x.T, 1), atol=1e-5)
  check([(1, 6)], lambda x: torch_fn(x, 0), lambda x: tiny_fn(x, 0), atol=1e-5)
  # integer input: torch has no softmax for ints, where tinyc computes in the default float
  check([(3, 4)], lambda x: torch_fn(x if "arg" in name or name == "cumsum" else x.float(), 1), lambda x: tiny_fn(x, 1), low=-9, high=9, dtype=i32,
        atol=1e-5)

def test_argmax_ties_and_none():
  """The first index of the extreme value wins; axis=None indexes the flattened tensor."""
  x = [[1.0, 3.0, 3.0, 0.0], [2.0, 2.0, -1.0, -1.0]]
  for fn in [lambda t: t.argmax(1), lambda t: t.argmin(1), lambda t: t.argmax(0), lambda t: t.argmax(), lambda t: t.argmin(),
             lambda t: t.argmax(None, keepdim=True)]:
    compare(fn(Tensor(x)), fn(torch.tensor(x)))
  compare(Tensor([False, True, True]).argmax(), torch.tensor([False, True, True]).to(torch.uint8).argmax())  # torch: no argmax of bool
  compare(Tensor([True, False, True]).argmin(), torch.tensor([True, False, True]).to(torch.uint8).argmin())
  compare(Tensor(5.0).argmax(), torch.tensor(5.0).argmax())

def test_softmax_large_values():
  check([(3, 4)], lambda x: (x * 1000).softmax(-1), atol=1e-6)
  check([(3, 4)], lambda x: (x * 1000).log_softmax(0), atol=1e-3)

def test_cumsum_dtypes():
  check([(10,)], lambda x: x.cumsum(0), dtype=i32, low=-9, high=9)
  check([()], lambda x: x.cumsum(0))

# ***** movement *****

MOVEMENT = {  # name: (torch fn, tinyc fn), on a (2, 3, 4) input
  "reshape": (lambda x: x.reshape(4, 6), None), "reshape_tuple": (lambda x: x.reshape((6, 4)), None), "reshape_-1": (lambda x: x.reshape(-1), None),
  "reshape_mid_-1": (lambda x: x.reshape(2, -1, 2), None), "reshape_1s": (lambda x: x.reshape(1, 2, 1, 12, 1), None),
  "expand": (lambda x: x[:, :1].expand(2, 5, 4), None), "expand_-1": (lambda x: x[:, :1].expand(-1, 3, -1), None),
  "expand_new_dims": (lambda x: x[:1, :1].expand(3, 2, 2, 4), None),
  "permute": (lambda x: x.permute(2, 0, 1), None), "permute_tuple": (lambda x: x.permute((1, 2, 0)), None),
  "permute_neg": (lambda x: x.permute(-1, 0, 1), None),
  "flip": (lambda x: x.flip(0), None), "flip_many": (lambda x: x.flip((0, 2)), None), "flip_neg": (lambda x: x.flip(-1), None),
  "shrink": (lambda x: x[0:1, 1:3, :], lambda x: x.shrink(((0, 1), (1, 3), None))),
  "shrink_empty": (lambda x: x[:, 1:1], lambda x: x.shrink((None, (1, 1), None))),
  "pad": (lambda x: tF.pad(x, (0, 0, 2, 1, 1, 0)), lambda x: x.pad(((1, 0), (2, 1), None))),
  "pad_value": (lambda x: tF.pad(x, (1, 2), value=-3.5), lambda x: x.pad((None, None, (1, 2)), value=-3.5)),
  "pad2d": (lambda x: tF.pad(x, (1, 2, 0, 1)), lambda x: x.pad2d((1, 2, 0, 1))),
  "pad2d_value": (lambda x: tF.pad(x, (1, 1, 1, 1), value=2.0), lambda x: x.pad2d((1, 1, 1, 1), value=2.0)),
  "pad2d_crop": (lambda x: tF.pad(x, (-1, 2, 1, -1)), lambda x: x.pad2d((-1, 2, 1, -1))),
  "transpose": (lambda x: x.transpose(0, 2), None), "transpose_neg": (lambda x: x.transpose(-1, -2), None),
  "transpose_default": (lambda x: x[0].transpose(1, 0), lambda x: x[0].transpose()), "T": (lambda x: x[0].T, None),
  "flatten": (lambda x: x.flatten(), None), "flatten_1": (lambda x: x.flatten(1), None), "flatten_-1": (lambda x: x.flatten(-1), None),
  "squeeze": (lambda x: x[:1, :, :1].squeeze(), None), "squeeze_dim": (lambda x: x[:1].squeeze(0), None),
  "squeeze_not_1": (lambda x: x.squeeze(1), None), "squeeze_neg": (lambda x: x[:, :, :1].squeeze(-1), None),
  "unsqueeze": (lambda x: x.unsqueeze(0), None), "unsqueeze_mid": (lambda x: x.unsqueeze(2), None), "unsqueeze_-1": (lambda x: x.unsqueeze(-1), None),
  "unsqueeze_-2": (lambda x: x.unsqueeze(-2), None),
  "repeat": (lambda x: x.repeat(2, 1, 3), lambda x: x.repeat((2, 1, 3))), "repeat_varargs": (lambda x: x.repeat(2, 1, 3), None),
  "repeat_new_dims": (lambda x: x.repeat(2, 1, 1, 2), lambda x: x.repeat([2, 1, 1, 2])),
  "repeat_zero": (lambda x: x.repeat(1, 0, 2), lambda x: x.repeat((1, 0, 2))),
  "chunk": (lambda x: x.chunk(2, 1), None), "chunk_uneven": (lambda x: x.chunk(3, -1), None), "chunk_more_than_size": (lambda x: x.chunk(5, 0), None),
  "cat_self": (lambda x: torch.cat([x, x * 2], 1), lambda x: x.cat(x * 2, dim=1)),
  "cat_three": (lambda x: torch.cat([x, x[:1], x.flip(0)], 0), lambda x: x.cat(x[:1], x.flip(0))),
  "cat_neg": (lambda x: torch.cat([x, x[..., :1]], -1), lambda x: x.cat(x[..., :1], dim=-1)),
  "cat_empty": (lambda x: torch.cat([x, x[:, :0]], 1), lambda x: x.cat(x[:, :0], dim=1)),
  "stack": (lambda x: torch.stack([x, -x], 0), lambda x: Tensor.stack([x, -x], 0)),
  "stack_last": (lambda x: torch.stack([x, x, x], -1), lambda x: Tensor.stack([x, x, x], dim=-1)),
  "stack_mid": (lambda x: torch.stack([x[0], x[1]], 1), lambda x: Tensor.stack([x[0], x[1]], dim=1)),
  "chain": (lambda x: x.permute(2, 0, 1).flip(1)[1:3].reshape(2, 6).T.unsqueeze(0).expand(2, 6, 2),
            lambda x: x.permute(2, 0, 1)[1:3, ::-1].reshape(2, 6).T.unsqueeze(0).expand(2, 6, 2)),
}

@pytest.mark.one_device
@pytest.mark.parametrize("dtype", [f32, i32, boolean, f16], ids=str)
@pytest.mark.parametrize("name", MOVEMENT)
def test_movement(name, dtype):
  torch_fn, tiny_fn = MOVEMENT[name]
  if dtype == boolean and name in ("stack", "chain") or dtype != f32 and "value" in name: pytest.skip("needs arithmetic")
  check([(2, 3, 4)], torch_fn, tiny_fn, dtype=dtype)
  check([(4, 3, 2)], lambda x: torch_fn(x.permute(2, 1, 0)), lambda x: (tiny_fn or torch_fn)(x.permute(2, 1, 0)), dtype=dtype)  # from a view

def test_movement_edge_shapes():
  check([()], lambda x: x.reshape(1, 1))
  check([()], lambda x: x.reshape(-1))
  check([(1,)], lambda x: x.reshape(()))
  check([()], lambda x: x.expand(2, 3))
  check([()], lambda x: x.unsqueeze(0))
  check([()], lambda x: x.flatten())
  check([()], lambda x: x.squeeze())
  check([(1, 1)], lambda x: x.squeeze())
  check([(0, 3)], lambda x: x.reshape(3, 0))
  check([(0, 3)], lambda x: x.reshape(-1, 3, 2))
  check([(0, 3)], lambda x: x.permute(1, 0))
  check([(0, 3)], lambda x: x.expand(2, 0, 3))
  check([(0, 3)], lambda x: torch.cat([x, x], 0), lambda x: x.cat(x))
  check([(0, 3)], lambda x: tF.pad(x, (1, 1, 1, 0)), lambda x: x.pad(((1, 0), (1, 1))))
  check([(2, 1, 3)], lambda x: x.expand(4, 2, 5, 3))
  check([(3,)], lambda x: x.repeat(2, 2))

def test_cat_and_stack_take_a_list_or_separate_tensors():
  a, b = random_array((2, 3), seed=1), random_array((2, 3), seed=2)
  x, y, tx_, ty = Tensor(a), Tensor(b), torch.tensor(a), torch.tensor(b)
  for dim in (0, 1, -1):
    want = torch.cat([tx_, ty, tx_], dim)
    for got in [Tensor.cat([x, y, x], dim=dim), Tensor.cat((x, y, x), dim), x.cat(y, x, dim=dim), x.cat([y, x], dim=dim),
                Tensor.cat(x, y, x, dim=dim)]:
      compare(got, want)
    want = torch.stack([tx_, ty], dim)
    for got in [Tensor.stack([x, y], dim=dim), Tensor.stack((x, y), dim), x.stack(y, dim=dim), Tensor.stack(x, y, dim=dim), x.stack([y], dim=dim)]:
      compare(got, want)
  compare(Tensor.cat([x]), torch.cat([tx_]))
  compare(Tensor.stack([x]), torch.stack([tx_]))

def test_tinygrad_keyword_names():
  """tinygrad's (late 2023) keyword names work beside torch's: reshape(shape=), expand(shape=), permute(order=), shrink(arg=), pad(arg=),
  transpose(ax1=, ax2=), chunk(num=), repeat(repeats=), flip(axis=), squeeze(dim=), unsqueeze(dim=), sum/max(axis=)."""
  data = random_array((2, 3, 4), seed=3)
  x, t = Tensor(data), torch.tensor(data)
  compare(x.reshape(shape=(4, 6)), t.reshape(4, 6))
  compare(x.reshape(shape=[4, -1]), t.reshape(4, 6))
  compare(x[:, :1].expand(shape=(2, 5, 4)), t[:, :1].expand(2, 5, 4))
  compare(x.permute(order=(2, 0, 1)), t.permute(2, 0, 1))
  compare(x.flip(0, 2), t.flip((0, 2)))
  compare(x.flip(axis=(0, 2)), t.flip((0, 2)))
  compare(x.shrink(arg=((0, 1), None, (1, 3))), t[0:1, :, 1:3])
  compare(x.pad(arg=((1, 0), None, (0, 2))), tF.pad(t, (0, 2, 0, 0, 1, 0)))
  compare(x.transpose(ax1=0, ax2=2), t.transpose(0, 2))
  compare(x.transpose(dim0=0, dim1=2), t.transpose(0, 2))
  compare(x.chunk(num=2, dim=1), list(t.chunk(2, 1)))
  compare(x.repeat(repeats=(1, 2, 1)), t.repeat(1, 2, 1))
  compare(x[:1].squeeze(dim=0), t[:1].squeeze(dim=0))
  compare(x.unsqueeze(dim=1), t.unsqueeze(dim=1))
  compare(x.sum(axis=1), t.sum(1))
  compare(x.max(axis=2), t.amax(2))
  compare(x.cumsum(axis=1), t.cumsum(1))
  compare(x.softmax(axis=0), t.softmax(0))
  compare(Tensor.eye(dim=3), torch.eye(3))

def test_movement_errors():
  x = Tensor.ones(2, 3)
  with pytest.raises(RuntimeError, match=r"\(4, 2\).*\(2, 3\)|\(2, 3\).*\(4, 2\)"): x.reshape(4, 2)
  with pytest.raises(RuntimeError, match=r"\(5, -1\)"): x.reshape(5, -1)
  with pytest.raises(RuntimeError, match="only one dimension can be inferred"): x.reshape(-1, -1)
  with pytest.raises(RuntimeError, match=r"\(2, 3\).*\(2, 4\)"): x.cat(Tensor.ones(2, 4))
  with pytest.raises(RuntimeError, match=r"\(2, 3\).*\(3,\)"): x.cat(Tensor.ones(3))
  with pytest.raises(RuntimeError, match=r"\(2,\).*\(2, 3\)"): x.repeat((2,))
  with pytest.raises(RuntimeError, match=r"\(2, 3\).*\(4, 3\)|\(4, 3\).*\(2, 3\)"): x.expand(4, 3)
  with pytest.raises(RuntimeError, match=r"\(2, 3\).*\(2, 4\)"): x + Tensor.ones(2, 4)
  with pytest.raises(RuntimeError, match=r"\(2, 3\).*\(3, 2\)"): Tensor.stack([x, Tensor.ones(3, 2)])
  with pytest.raises(IndexError, match=r"Dimension out of range \(expected to be in range of \[-2, 1\], but got 2\)"): x.permute(0, 2)
  with pytest.raises(IndexError, match=r"Dimension out of range \(expected to be in range of \[-2, 1\], but got 2\)"): x.flip(2)
  with pytest.raises(IndexError, match=r"Dimension out of range \(expected to be in range of \[-2, 1\], but got -3\)"): x.transpose(0, -3)
  with pytest.raises(IndexError, match=r"Dimension out of range \(expected to be in range of \[-3, 2\], but got 3\)"): x.unsqueeze(3)
  with pytest.raises(IndexError, match=r"Dimension out of range \(expected to be in range of \[-2, 1\], but got 2\)"): x.squeeze(2)
  with pytest.raises(IndexError, match=r"Dimension out of range \(expected to be in range of \[-2, 1\], but got 2\)"): x.cat(x, dim=2)
  with pytest.raises(IndexError, match=r"Dimension out of range \(expected to be in range of \[-2, 1\], but got 2\)"): x.flatten(2)
  with pytest.raises(IndexError, match=r"Dimension out of range \(expected to be in range of \[-2, 1\], but got -3\)"): x.chunk(2, -3)
  with pytest.raises(RuntimeError): x.permute(0, 0)
  with pytest.raises(ValueError): x.pad(((1, 1),))
  with pytest.raises(ValueError): x.shrink(((0, 3), (0, 3)))

# ***** indexing (numpy is the reference: torch has no negative steps) *****

INDICES = [
  0, -1, 3, slice(1, 3), slice(None, None, 2), slice(None, None, -1), slice(3, 0, -2), slice(-2, None), slice(10, 20), slice(-100, 100, 3),
  slice(2, 2), slice(3, 1), slice(None, None, -3), (1, 2, 3), (-1, -2, -3), (Ellipsis, 1), (None, 1, Ellipsis, None), (slice(None), None, 2),
  (1, slice(None, None, -2), None, -1), (Ellipsis,), (), (None,), (Ellipsis, None), (slice(1, None, 2), slice(None, None, -1), slice(4, 0, -3)),
  (0, Ellipsis, slice(None, None, -1)), (None, None, 0, None), (slice(None, None, 5), 0), (1, Ellipsis, 2, None),
]

@pytest.mark.one_device  # (index math, as test_movement)
@pytest.mark.parametrize("dtype", [f32, i8], ids=str)
def test_getitem(dtype):
  data = random_array((4, 5, 6), dtype, -50, 50)
  for base_np, base in [(data, to_tinyc(data, dtype)), (data.transpose(2, 0, 1)[::-1], to_tinyc(data, dtype).permute(2, 0, 1)[::-1])]:
    for index in INDICES:
      got, want = base[index], base_np[index]
      assert got.shape == want.shape, f"x[{index}]: shape {got.shape} != numpy's {want.shape}"
      assert got.dtype == dtype
      np.testing.assert_equal(got.numpy(), want, err_msg=f"x[{index}]")

def test_getitem_0d_and_chained():
  data = np.arange(24, dtype=np.float32).reshape(2, 3, 4)
  x = Tensor(data)
  for index in [(), Ellipsis, None, (None, Ellipsis)]: np.testing.assert_equal(Tensor(3.0)[index].numpy(), np.float32(3.0)[index])
  np.testing.assert_equal(x[1][2][3].numpy(), data[1][2][3])
  np.testing.assert_equal(x[:, ::-1][1, 1:][::2].numpy(), data[:, ::-1][1, 1:][::2])
  np.testing.assert_equal((x[::-1, :, 1::2] * 2 + x[:, ::-1, :2]).numpy(), data[::-1, :, 1::2] * 2 + data[:, ::-1, :2])

def test_getitem_errors():
  x = Tensor.ones(3, 4)
  with pytest.raises(IndexError, match="index 5 is out of bounds for dimension 0 with size 3"): x[5]
  with pytest.raises(IndexError, match="index -4 is out of bounds for dimension 0 with size 3"): x[-4]
  with pytest.raises(IndexError, match="index 4 is out of bounds for dimension 1 with size 4"): x[0, 4]
  with pytest.raises(IndexError, match="index 4 is out of bounds for dimension 1 with size 4"): x[..., 4]
  with pytest.raises(IndexError, match="too many indices"): x[0, 0, 0]
  with pytest.raises(IndexError, match="too many indices"): Tensor(1.0)[0]
  with pytest.raises(IndexError, match="single ellipsis"): x[..., ...]
  with pytest.raises(ValueError, match="step"): x[::0]

# ***** matmul *****

MATMUL_SHAPES = [((3,), (3,)), ((3,), (3, 4)), ((2, 3), (3,)), ((2, 3), (3, 4)), ((2, 2, 3), (3, 4)), ((3,), (2, 3, 4)), ((2, 2, 3), (3,)),
                 ((2, 1, 2, 3), (3, 3, 4)), ((1, 3), (2, 3, 4)), ((2, 2, 3), (2, 3, 4)), ((0, 3), (3, 2)), ((2, 0), (0, 3)), ((1, 1), (1, 1))]

@pytest.mark.parametrize("shapes", MATMUL_SHAPES, ids=str)
def test_matmul(shapes):
  check(shapes, lambda x, y: x @ y, atol=1e-5)
  check(shapes, lambda x, y: x.matmul(y), lambda x, y: x.dot(y), atol=1e-5)

def test_matmul_dtypes_and_views():
  check([(3, 4), (4, 5)], lambda x, y: x @ y, low=-9, high=9, dtype=i32)
  check([(3, 4), (4, 5)], lambda x, y: x.float() @ y, lambda x, y: x @ y, dtype=[f16, f32], atol=1e-2)  # torch needs one dtype
  check([(3, 4), (4, 5)], lambda x, y: x @ y, dtype=f16, atol=1e-2)
  check([(3, 4), (4, 5)], lambda x, y: x @ y, dtype=f64, atol=1e-10)
  check([(4, 3), (5, 4)], lambda x, y: x.T @ y.T, atol=1e-5)
  check([(3, 8), (4, 5)], lambda x, y: x[:, ::2] @ y.flip(0), lambda x, y: x[:, ::2] @ y[::-1], atol=1e-5)
  check([(3, 4), (4, 5)], lambda x, y: x @ y, lambda x, y: y.__rmatmul__(x), atol=1e-5)
  check([(2, 3, 4), (4, 5), (5,)], lambda x, w, b: x @ w + b, lambda x, w, b: x.linear(w, b), atol=1e-5)  # weight is (in, out), as in tinygrad
  check([(2, 3, 4), (4, 5)], lambda x, w: (x @ w).relu() @ w.T, lambda x, w: x.sequential([lambda t: t.linear(w), lambda t: t.relu() @ w.T]),
        atol=1e-5)

def test_matmul_errors():
  with pytest.raises(RuntimeError, match=r"2x3.*4x5"): Tensor.ones(2, 3) @ Tensor.ones(4, 5)
  with pytest.raises(RuntimeError, match=r"\(3 and 4\)"): Tensor.ones(3).dot(Tensor.ones(4))
  with pytest.raises(RuntimeError, match=r"\(2x3 and 2\)"): Tensor.ones(2, 3) @ Tensor.ones(2)
  with pytest.raises(RuntimeError, match="1D"): Tensor(1.0) @ Tensor.ones(3)
  with pytest.raises(RuntimeError, match=r"\(2, 2, 3\) and \(3, 3, 4\)"): Tensor.ones(2, 2, 3) @ Tensor.ones(3, 3, 4)
  with pytest.raises(RuntimeError, match=r"\(2, 3, 2, 3\) and \(4, 3, 1\)"): Tensor.ones(2, 3, 2, 3) @ Tensor.ones(4, 3, 1)

# ***** convolution and pooling *****

CONV = [  # input shape, weight shape, kwargs
  ((1, 1, 5, 5), (1, 1, 3, 3), {}), ((2, 3, 6, 5), (4, 3, 3, 2), {"stride": 2}), ((1, 2, 7, 7), (3, 2, 3, 3), {"stride": (2, 1), "padding": 1}),
  ((1, 2, 7, 7), (2, 2, 3, 3), {"dilation": 2}), ((1, 2, 8, 6), (2, 2, 2, 3), {"dilation": (1, 2), "padding": (2, 1), "stride": 3}),
  ((2, 4, 5, 5), (6, 2, 3, 3), {"groups": 2, "padding": 1}), ((1, 4, 5, 5), (4, 1, 3, 3), {"groups": 4, "bias": True}),
  ((2, 3, 5, 5), (2, 3, 1, 1), {"bias": True}), ((1, 1, 3, 3), (1, 1, 3, 3), {"padding": 2, "stride": 2, "bias": True}),
  ((1, 2, 4, 4), (2, 2, 4, 4), {}),
]

@pytest.mark.parametrize("x_shape, w_shape, kwargs", CONV, ids=[f"{i}" for i in range(len(CONV))])
def test_conv2d(x_shape, w_shape, kwargs):
  kwargs = dict(kwargs)
  shapes = [x_shape, w_shape] + ([(w_shape[0],)] if kwargs.pop("bias", False) else [])
  check(shapes, lambda x, w, *b: tF.conv2d(x, w, *b, **kwargs), lambda x, w, *b: x.conv2d(w, *b, **kwargs), atol=1e-5)

def test_conv2d_padding_list_and_view_input():
  check([(1, 2, 5, 6), (3, 2, 3, 3)], lambda x, w: tF.conv2d(tF.pad(x, (1, 2, 0, 1)), w), lambda x, w: x.conv2d(w, padding=[1, 2, 0, 1]), atol=1e-5)
  check([(1, 5, 6, 2), (3, 2, 3, 3)], lambda x, w: tF.conv2d(x.permute(0, 3, 1, 2), w, padding=1),
        lambda x, w: x.permute(0, 3, 1, 2).conv2d(w, padding=1), atol=1e-5)

def test_conv2d_errors():
  with pytest.raises(RuntimeError, match=r"\(1, 3, 5, 5\).*\(2, 2, 3, 3\)"): Tensor.ones(1, 3, 5, 5).conv2d(Tensor.ones(2, 2, 3, 3))

POOL = [((1, 1, 6, 6), {}), ((2, 3, 7, 5), {"kernel_size": 3}), ((1, 2, 7, 7), {"kernel_size": (3, 2), "stride": 1}),
        ((1, 1, 8, 8), {"kernel_size": 2, "stride": 3}), ((1, 2, 9, 9), {"kernel_size": 3, "stride": 2, "dilation": 2}),
        ((1, 1, 5, 7), {"kernel_size": (2, 3), "stride": (1, 2), "dilation": (2, 1)}), ((2, 4, 4), {"kernel_size": 2})]

@pytest.mark.parametrize("shape, kwargs", POOL, ids=[f"{i}" for i in range(len(POOL))])
def test_pool2d(shape, kwargs):
  check([shape], lambda x: tF.max_pool2d(x, **{"kernel_size": (2, 2), **kwargs}), lambda x: x.max_pool2d(**kwargs))
  kernel, dilation = kwargs.get("kernel_size", 2), kwargs.get("dilation", 1)
  stride = kwargs.get("stride", kernel)
  def torch_avg(x):  # torch's avg_pool2d has no dilation: average the unfolded windows instead
    batch = x.reshape(-1, 1, *x.shape[-2:])
    cols = tF.unfold(batch, kernel, dilation=dilation, stride=stride).mean(1)
    out = tF.max_pool2d(batch, kernel, stride, dilation=dilation).shape[-2:]
    return cols.reshape(*x.shape[:-2], *out)
  check([shape], torch_avg, lambda x: x.avg_pool2d(**kwargs), atol=1e-6)

# ***** activations *****

ACTIVATIONS = {
  "relu": (tF.relu, lambda x: x.relu()), "sigmoid": (torch.sigmoid, lambda x: x.sigmoid()), "tanh": (torch.tanh, lambda x: x.tanh()),
  "elu": (tF.elu, lambda x: x.elu()), "elu_alpha": (lambda x: tF.elu(x, 0.5), lambda x: x.elu(0.5)), "celu": (tF.celu, lambda x: x.celu()),
  "celu_alpha": (lambda x: tF.celu(x, 2.0), lambda x: x.celu(2.0)), "swish": (tF.silu, lambda x: x.swish()), "silu": (tF.silu, lambda x: x.silu()),
  "relu6": (tF.relu6, lambda x: x.relu6()), "hardswish": (tF.hardswish, lambda x: x.hardswish()), "hardtanh": (tF.hardtanh, lambda x: x.hardtanh()),
  "hardtanh_range": (lambda x: tF.hardtanh(x, -2.0, 3.0), lambda x: x.hardtanh(-2.0, 3.0)),
  "gelu": (lambda x: tF.gelu(x, approximate="tanh"), lambda x: x.gelu()),
  "quick_gelu": (lambda x: x * torch.sigmoid(1.702 * x), lambda x: x.quick_gelu()),
  "leakyrelu": (tF.leaky_relu, lambda x: x.leakyrelu()), "leakyrelu_slope": (lambda x: tF.leaky_relu(x, 0.2), lambda x: x.leakyrelu(0.2)),
  "mish": (tF.mish, lambda x: x.mish()), "softplus": (tF.softplus, lambda x: x.softplus()),
  "softplus_beta": (lambda x: tF.softplus(x, beta=2.0), lambda x: x.softplus(2.0)), "softsign": (tF.softsign, lambda x: x.softsign()),
}

@pytest.mark.parametrize("name", ACTIVATIONS)
def test_activation(name):
  torch_fn, tiny_fn = ACTIVATIONS[name]
  check([(3, 20)], torch_fn, tiny_fn, low=-8, high=8, atol=1e-5)
  check([()], torch_fn, tiny_fn, atol=1e-5)
  check([(0, 2)], torch_fn, tiny_fn)
  check([(4, 5)], lambda x: torch_fn(x.T), lambda x: tiny_fn(x.T), atol=1e-5)
  check([(3, 4)], torch_fn, tiny_fn, dtype=f16, **HALF_TOL)

def test_activation_extremes():
  values = [-1e4, -100.0, -30.0, -1.0, 0.0, 1.0, 30.0, 100.0, 1e4]
  for name, (torch_fn, tiny_fn) in ACTIVATIONS.items():
    compare(tiny_fn(Tensor(values)), torch_fn(torch.tensor(values)), atol=1e-5, rtol=1e-4)

# ***** compositions: reductions through views, odd sizes (tails of upcast/unrolled loops), reduces feeding reduces *****

COMPOSED = [  # shapes, torch fn, tinyc fn (None: the same)
  ([(7, 13)], lambda x: x.sum(1), None), ([(7, 13)], lambda x: x.sum(0), None), ([(1, 257)], lambda x: x.sum(), None),
  ([(33, 5, 3)], lambda x: x.sum((0, 2)), None),
  ([(257,)], lambda x: x.exp() * 2, None), ([(3, 65)], lambda x: x.amax(1), lambda x: x.max(1)), ([(130, 70)], lambda x: x.sum(0), None),
  ([(130, 70)], lambda x: x.sum(1), None), ([(17, 33), (33, 9)], lambda x, y: x @ y, None), ([(64, 64), (64, 64)], lambda x, y: x @ y, None),
  ([(5, 100), (100, 3)], lambda x, y: x @ y, None),
  ([(2, 3, 16, 16), (8, 3, 3, 3)], lambda x, w: tF.conv2d(x, w, padding=1), lambda x, w: x.conv2d(w, padding=1)),
  ([(5,)], lambda x: tF.pad(x, (2, 2)).amax(), lambda x: x.pad(((2, 2),)).max()),  # the padded zeros take part in the max
  ([(5,)], lambda x: (tF.pad(x, (2, 2)) - 5).amax(), lambda x: (x.pad(((2, 2),)) - 5).max()),
  ([(5,)], lambda x: tF.pad(x - 5, (2, 2)).amax(), lambda x: (x - 5).pad(((2, 2),)).max()),
  ([(5,)], lambda x: tF.pad(x.exp(), (2, 2)).sum(), lambda x: x.exp().pad(((2, 2),)).sum()),  # exp(0) != 0: the pad must not be pushed into exp
  ([(5,)], lambda x: tF.pad(x.exp(), (2, 2), value=1.5).sum(), lambda x: x.exp().pad(((2, 2),), value=1.5).sum()),
  ([(5,)], lambda x: tF.pad(1 / (x + 3), (1, 1)).sum(), lambda x: (1 / (x + 3)).pad(((1, 1),)).sum()),
  ([(4, 5)], lambda x: x.flip(1).sum(1), None), ([(4, 5)], lambda x: x[::2].flip(1)[:, ::2].sum(0), lambda x: x[::2, ::-2].sum(0)),
  ([(4, 1)], lambda x: x.expand(4, 6).sum(1), None),
  ([(4, 5), (4, 3)], lambda x, y: torch.cat([x, y], 1).amax(1), lambda x, y: x.cat(y, dim=1).max(1)),
  ([(4, 5)], lambda x: (x.sum(0) * x.amax(1, keepdim=True)).amax(), lambda x: (x.sum(0) * x.max(1, keepdim=True)).max()),
  ([(4, 5)], lambda x: x - x.mean(), None), ([(4, 5)], lambda x: x.sum(1).sum(), None),
  ([(4, 5)], lambda x: (x.exp().sum(1, keepdim=True) + x).log_softmax(0), None),
  ([(3, 4, 5)], lambda x: x.permute(2, 0, 1).contiguous().sum(0), None),
  ([(6, 6)], lambda x: x.reshape(2, 3, 2, 3).permute(0, 2, 1, 3).reshape(4, 9).sum(1), None),
  ([(4, 6)], lambda x: x[:, 1:5].reshape(8, 2).T.sum(0), None),
  ([(12,)], lambda x: x.reshape(3, 4).flip(1).reshape(12).cumsum(0), lambda x: x.reshape(3, 4)[:, ::-1].reshape(12).cumsum(0)),
  ([(3, 4)], lambda x: x.cumsum(1).cumsum(0), None), ([(50,)], lambda x: x.cumsum(0), None), ([(2, 200)], lambda x: x.softmax(1), None),
  ([(1, 1, 32, 32)], lambda x: tF.max_pool2d(x, 3, 2), lambda x: x.max_pool2d(3, 2)),
  ([(8, 16), (16, 4), (4,)], lambda x, w, b: (x @ w + b).relu(), None), ([(3, 5)], lambda x: x.std(1) + x.var(0).sum(), None),
  ([(3, 5)], lambda x: x.argmax(1) + x.argmin(0).sum(), None), ([(3, 5)], lambda x: (x > 0).sum(1) + (x < 0).float().mean(), None),
]

@pytest.mark.parametrize("i", range(len(COMPOSED)))
def test_composed(i):
  shapes, torch_fn, tiny_fn = COMPOSED[i]
  check(shapes, torch_fn, tiny_fn, atol=1e-4, rtol=1e-4)

def test_max_of_negated_ints_from_the_most_negative_start():
  # found on the H200: the CUDA compiler rewrote `acc > -x` as `acc + x > 0`, which overflows from acc = INT_MIN
  a = np.random.default_rng(0).integers(-100, 100, (3, 50)).astype(np.int32)
  np.testing.assert_equal((-Tensor(a)).max(1).numpy(), (-a).max(1))
  np.testing.assert_equal(Tensor(a).min(1).numpy(), a.min(1))
  np.testing.assert_equal((-Tensor(np.array([-2**31, 5], np.int32))).numpy(), np.array([-2**31, -5], np.int32))  # wraps like torch
