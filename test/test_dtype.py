"""Dtypes: PyTorch's type promotion for every pair (tensor-tensor and tensor-scalar), casts between every pair of dtypes against numpy
(float -> int truncation, bool casts, integer wrap-around), bitcasts, and the places where tinyc differs from torch on purpose."""
from __future__ import annotations
import copy, itertools, pathlib, pickle, subprocess, sys
import numpy as np
import pytest
import torch
from tinyc import Tensor, dtypes
from tinyc.dtype import ALL, DType
from helpers import TORCH_DTYPE, compare, expected_dtype, random_array, to_tinyc, to_torch

PAIRS = list(itertools.product(ALL, ALL))

def torch_promote(a: DType, b: DType) -> DType | None:
  """torch's promotion of two tensor dtypes, or None where torch refuses (uint16/32/64 with another integer type)."""
  try: return {v: k for k, v in TORCH_DTYPE.items()}[torch.promote_types(TORCH_DTYPE[a], TORCH_DTYPE[b])]
  except RuntimeError: return None

def test_promotion_table_matches_torch():
  """Every op that combines two tensors (here +, *, where, maximum, cat) computes in torch.promote_types of their dtypes."""
  mismatches = []
  for a, b in PAIRS:
    want = torch_promote(a, b)
    if want is None: continue
    x, y = Tensor.zeros(2, dtype=a), Tensor.zeros(2, dtype=b)
    for what, got in [("+", (x + y).dtype), ("*", (x * y).dtype), ("where", (x > 0).where(x, y).dtype), ("maximum", x.maximum(y).dtype)]:
      if got != want: mismatches.append(f"{a.name} {what} {b.name}: {got.name}, torch {want.name}")
  assert not mismatches, "\n".join(mismatches)

# torch refuses to promote uint16/32/64 with other integer types; tinyc documents numpy's choice for those pairs
UNSUPPORTED_BY_TORCH = [(a, b) for a, b in PAIRS if torch_promote(a, b) is None]

def test_promotion_beyond_torch_follows_numpy():
  mismatches = []
  for a, b in UNSUPPORTED_BY_TORCH:
    if dtypes.uint64 in (a, b) and any(d in (dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64) for d in (a, b)): continue
    got, want = (Tensor.zeros(1, dtype=a) + Tensor.zeros(1, dtype=b)).dtype, dtypes.from_np(np.promote_types(a.np, b.np))
    if got != want: mismatches.append(f"{a.name} + {b.name}: {got.name}, numpy {want.name}")
  assert not mismatches, "\n".join(mismatches)

def test_promotion_uint64_signed():
  for signed in (dtypes.int8, dtypes.int16, dtypes.int32, dtypes.int64):
    assert (Tensor.zeros(1, dtype=dtypes.uint64) + Tensor.zeros(1, dtype=signed)).dtype == dtypes.float64

@pytest.mark.parametrize("scalar", [True, 3, -2, 2.5], ids=repr)
def test_scalar_promotion_matches_torch(scalar):
  """A Python scalar only changes the category: int tensor + float -> default float, bool tensor + int -> default int."""
  for dtype in ALL:
    want = torch.result_type(torch.zeros(1, dtype=TORCH_DTYPE[dtype]), scalar)
    x = Tensor.zeros(2, dtype=dtype)
    for what, got in [("+", x + scalar), ("radd", scalar + x), ("*", x * scalar), ("-", x - scalar if dtype != dtypes.bool else x + scalar),
                      ("maximum", x.maximum(scalar)), ("where", (x > 0).where(x, scalar))]:
      assert got.dtype == expected_dtype(want, [dtype]), f"{dtype.name} {what} {scalar!r}: {got.dtype.name}, torch {want}"

UNARY_FLOAT_OPS = ["exp", "log", "sqrt", "sin", "cos", "reciprocal", "sigmoid", "exp2", "log2", "rsqrt", "tan"]

def test_result_dtypes_of_ops_match_torch():
  """Ops that must give a float (exp, true division, mean) turn ints and bools into the default float; comparisons give bool."""
  problems = []
  for dtype in ALL:
    t, x = torch.ones(2, dtype=TORCH_DTYPE[dtype]), Tensor.ones(2, dtype=dtype)
    cases = [(name, lambda m, name=name: getattr(m, name)()) for name in UNARY_FLOAT_OPS]
    cases += [("div", lambda m: m / m), ("rdiv", lambda m: 2 / m), ("lt", lambda m: m < m), ("eq", lambda m: m == 1), ("ne", lambda m: m != 1.5),
              ("ge", lambda m: m >= m), ("softmax", lambda m: m.softmax(0))]
    for name, fn in cases:
      try: want = fn(t).dtype
      except (RuntimeError, NotImplementedError): continue  # torch lacks this op for this dtype (e.g. uint32 division)
      got = fn(x).dtype
      if got != expected_dtype(want, [dtype]): problems.append(f"{name}({dtype.name}): {got.name}, torch {want}")
  assert not problems, "\n".join(problems)

@pytest.mark.parametrize("a", ALL, ids=str)
def test_binary_values_across_dtypes(a):
  """a + b and a * b for every b: the values of the promoted computation, against torch (numpy where torch lacks the op)."""
  for b in ALL:
    x_np, y_np = random_array((4,), a, -3, 3, seed=1), random_array((4,), b, -3, 3, seed=2)
    x, y = to_tinyc(x_np, a), to_tinyc(y_np, b)
    result = least = (x + y).dtype
    tx, ty = to_torch(x_np, a), to_torch(y_np, b)
    for fn in [lambda p, q: p + q, lambda p, q: p * q]:
      if torch_promote(a, b) is not None and result not in (dtypes.uint16, dtypes.uint32, dtypes.uint64):
        compare(fn(x, y), fn(tx, ty), atol=1e-2, rtol=1e-2, input_dtypes=[a, b])
      else:
        assert least.np is not None
        np.testing.assert_allclose(fn(x, y).numpy(), fn(x_np.astype(least.np), y_np.astype(least.np)), rtol=1e-3)

# ***** casts *****

CAST_VALUES: dict[str, list] = {
  "float": [-1e4, -130.0, -3.7, -2.5, -1.5, -0.5, -0.0, 0.0, 0.25, 0.5, 0.99, 1.0, 1.5, 2.7, 100.25, 127.9, 255.5, 300.0, 40000.0],
  "int": [-40000, -300, -129, -128, -1, 0, 1, 7, 127, 128, 255, 256, 300, 65535, 70000],
}

def cast_source(src: DType) -> np.ndarray:
  """Values that src can hold: wrapping ints where the source is narrower, every float value for floats."""
  if src == dtypes.bool: return np.array([True, False, True, True])
  if dtypes.is_float(src): return np.array([v for v in CAST_VALUES["float"] if src != dtypes.float16 or abs(v) < 60000], dtype=np.float32)
  info = np.iinfo(src.np)
  return np.array([v for v in CAST_VALUES["int"] if info.min <= v <= info.max], dtype=src.np)

@pytest.mark.parametrize("src", ALL, ids=str)
def test_cast_all_pairs(src):
  """Casts against numpy's astype (torch for bfloat16): float -> int truncates toward zero, ints wrap modulo 2**bits, anything nonzero is
  True. Float values outside the target int's range, as src holds them (bfloat16 rounds 255.5 to 256), are left out: C (and LLVM)
  leave that conversion undefined."""
  source = cast_source(src)
  held = to_torch(source, src).double().numpy() if dtypes.is_float(src) else source
  for dst in ALL:
    if (src, dst) == (dtypes.float64, dtypes.float16): continue  # crashes the process: see test_cast_float64_to_float16
    values = source
    if dtypes.is_float(src) and dtypes.is_int(dst):
      info = np.iinfo(dst.np)
      values = source[(np.trunc(held) >= info.min) & (np.trunc(held) <= info.max)]
    if dst == dtypes.float16: values = values[np.abs(values.astype(np.float64)) < 60000]
    tensor = Tensor(values, dtype=src)
    got = tensor.cast(dst)
    assert got.dtype == dst and got.shape == values.shape
    if dtypes.bfloat16 in (src, dst):
      want = to_torch(values, src).to(TORCH_DTYPE[dst])
      np.testing.assert_equal(got.numpy(), (want.float() if dst == dtypes.bfloat16 else want).numpy(), err_msg=f"{src} -> {dst}")
    else:
      np.testing.assert_equal(got.numpy(), values.astype(src.np).astype(dst.np), err_msg=f"{src} -> {dst}")

def run_isolated(code: str) -> subprocess.CompletedProcess:
  """Run code in a fresh interpreter, for repros that crash the process (a crash must fail one test, not the test worker)."""
  return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=pathlib.Path(__file__).parent.parent)

def test_cast_float64_to_float16():
  proc = run_isolated("from tinyc import Tensor, dtypes; print(Tensor([1.5, -3.7], dtype=dtypes.float64).cast(dtypes.float16).numpy().tolist())")
  assert proc.returncode == 0, f"crashed with exit code {proc.returncode}: {proc.stderr[-500:]}"
  assert proc.stdout.strip() == str(np.array([1.5, -3.7]).astype(np.float16).tolist())

def test_cast_methods_and_special_floats():
  x = Tensor([-2.7, -0.5, 0.0, 0.5, 2.7])
  assert x.int().dtype == dtypes.int32 and x.half().dtype == dtypes.float16 and x.bool().dtype == dtypes.bool
  assert x.int().float().dtype == dtypes.float32
  np.testing.assert_equal(x.int().numpy(), [-2, 0, 0, 0, 2])
  np.testing.assert_equal(x.bool().numpy(), [True, True, False, True, True])
  special = [float("nan"), float("inf"), -float("inf"), -0.0, 1e-45]
  np.testing.assert_equal(Tensor(special).bool().numpy(), torch.tensor(special).bool().numpy())
  np.testing.assert_equal(Tensor(special).half().numpy(), torch.tensor(special).half().numpy())
  big = [1e5, -1e5, 65519.0, 65520.0]  # beyond float16's range: inf, and the rounding boundary to it
  np.testing.assert_equal(Tensor(big).half().numpy(), np.array(big, np.float32).astype(np.float16))
  np.testing.assert_equal(Tensor([3.0, 4.0]).cast(dtypes.float32).numpy(), [3.0, 4.0])
  np.testing.assert_equal((Tensor([0.1, 0.2], dtype=dtypes.float64) * 3).numpy(), np.array([0.1, 0.2]) * 3)  # stays float64

def test_cast_of_views_and_expressions():
  data = np.arange(12, dtype=np.float32).reshape(3, 4) - 5.5
  np.testing.assert_equal(Tensor(data).T.int().numpy(), data.T.astype(np.int32))
  view, positive = data[::-1, 1::2], data[::-1, 1::2] > 0
  np.testing.assert_equal(Tensor(data)[::-1, 1::2].cast(dtypes.uint8).numpy()[positive], view.astype(np.uint8)[positive])
  np.testing.assert_equal((Tensor(data) * 2).cast(dtypes.int8).cast(dtypes.float16).numpy(), (data * 2).astype(np.int8).astype(np.float16))

def test_integer_overflow_wraps():
  """Integer arithmetic wraps around like torch's (two's complement), it is not promoted or saturated."""
  cases = [(dtypes.int8, [100, -100, 127], [100, -100, 1]), (dtypes.uint8, [250, 0, 128], [10, 1, 128]),
           (dtypes.int16, [30000, -30000, 1], [30000, -30000, 1]),
           (dtypes.int32, [2 ** 31 - 1, -2 ** 31, 5], [1, -1, 5]), (dtypes.int64, [2 ** 63 - 1, -2 ** 63, 5], [1, -1, 5])]
  for dtype, a, b in cases:
    x, y = Tensor(np.array(a, dtype=dtype.np)), Tensor(np.array(b, dtype=dtype.np))
    tx, ty = torch.tensor(a, dtype=TORCH_DTYPE[dtype]), torch.tensor(b, dtype=TORCH_DTYPE[dtype])
    for fn in [lambda p, q: p + q, lambda p, q: p * q, lambda p, q: p - q]: compare(fn(x, y), fn(tx, ty), input_dtypes=[dtype])

# ***** bitcast *****

BITCASTS = [(dtypes.float32, dtypes.int32), (dtypes.int32, dtypes.float32), (dtypes.float32, dtypes.uint32), (dtypes.uint32, dtypes.float32),
            (dtypes.float16, dtypes.int16), (dtypes.int16, dtypes.float16), (dtypes.float16, dtypes.uint16), (dtypes.int8, dtypes.uint8),
            (dtypes.uint8, dtypes.int8), (dtypes.float64, dtypes.int64), (dtypes.int64, dtypes.float64), (dtypes.int32, dtypes.uint32)]

@pytest.mark.parametrize("src, dst", BITCASTS, ids=str)
def test_bitcast(src, dst):
  values = random_array((2, 3), src, -100, 100, seed=3)
  np.testing.assert_equal(Tensor(values).bitcast(dst).numpy(), values.view(dst.np))
  np.testing.assert_equal(Tensor(values).T.bitcast(dst).numpy(), values.T.view(dst.np))  # through a view
  np.testing.assert_equal((Tensor(values) + Tensor(values)).bitcast(dst).numpy(), (values + values).view(dst.np))

def test_bitcast_size_mismatch():
  with pytest.raises(ValueError, match="float32 is 4 bytes, dtypes.int16 2"): Tensor([1.0]).bitcast(dtypes.int16)

def test_bitcast_bfloat16():
  values = np.array([1.0, -2.5, 3.140625], dtype=np.float32)  # exactly representable in bfloat16
  bits = Tensor(values, dtype=dtypes.bfloat16).bitcast(dtypes.int16)
  np.testing.assert_equal(bits.numpy(), torch.tensor(values).bfloat16().view(torch.int16).numpy())
  np.testing.assert_equal(bits.bitcast(dtypes.bfloat16).numpy(), values)

# ***** where tinyc differs from torch on purpose *****

def test_intentional_differences_from_torch():
  """tinyc's default int is int32 (torch: int64): it is what GPUs index with fast. So Python ints, arange, argmax/argmin and sums of bools
  and of ints narrower than 32 bits are int32. Values are unaffected while they fit in int32; cast to int64 first when they may not."""
  assert Tensor([1, 2]).dtype == dtypes.int32 and torch.tensor([1, 2]).dtype == torch.int64
  assert Tensor(3).dtype == dtypes.int32 and Tensor.arange(3).dtype == dtypes.int32 and Tensor.full((2,), 7).dtype == dtypes.int32
  assert Tensor([1.0, 3.0]).argmax().dtype == dtypes.int32 and Tensor([1.0, 3.0]).argmin(0).dtype == dtypes.int32
  assert (Tensor([True, False]) + 1).dtype == dtypes.int32
  for dtype in (dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16):
    assert Tensor.ones(3, dtype=dtype).sum().dtype == dtypes.int32, dtype
  # a sum of small ints accumulates in int32, so it does not overflow the input type
  assert Tensor(np.full(1000, 100, dtype=np.int8)).sum().item() == 100_000
  assert Tensor(np.full(600, 255, dtype=np.uint8)).sum().item() == 153_000
  assert Tensor(np.ones(70000, dtype=bool)).sum().item() == 70000
  # int32 and wider keep their dtype (torch: int64), and int64 stays int64
  assert Tensor.ones(3, dtype=dtypes.int32).sum().dtype == dtypes.int32 and Tensor.ones(3, dtype=dtypes.int64).sum().dtype == dtypes.int64
  assert Tensor(np.full(3, 2 ** 40, dtype=np.int64)).sum().item() == 3 * 2 ** 40
  # a float16 sum accumulates in float32 and stores float16, as torch does
  assert Tensor(np.full(4096, 1.0, dtype=np.float16)).sum().item() == 4096.0
  # bfloat16 has no numpy dtype: numpy() gives float32 holding the bfloat16 values
  assert Tensor([1.0, 2.5], dtype=dtypes.bfloat16).numpy().dtype == np.float32

def test_each_dtype_is_one_object():
  """dtypes compare and hash by identity (the scheduler's plan keys hash them): a vec() or an unpickled dtype (a BEAM worker's)
  must be the very object, else an equal dtype would miss every cache and compare unequal."""
  for dtype in [*ALL, dtypes.float32.vec(4), dtypes.half.vec(2)]:
    assert pickle.loads(pickle.dumps(dtype)) is dtype and copy.deepcopy(dtype) is dtype
  assert dtypes.float32.vec(4) is dtypes.float32.vec(4) and dtypes.float32.vec(4) != dtypes.int32.vec(4)
  assert dtypes.float32.vec(4).scalar() is dtypes.float32 and dtypes.float16 < dtypes.float32

@pytest.mark.parametrize("method", ["cast", "bitcast"])
def test_cast_to_something_not_a_dtype_raises_a_type_error_at_once(method):
  """A dtype's name (torch takes only torch.int32 too) raised AttributeError when the graph was realized, from deep in the kernel
  cache's key: now a TypeError at the call, naming what to pass."""
  t = Tensor([1.0, 2.0])
  with pytest.raises(TypeError, match=r"tinyc\.dtypes\.int32"): getattr(t, method)("int32")
  with pytest.raises(TypeError, match="dtype"): getattr(t, method)(np.int32)
