"""exp2, log2 and the ops built on them (exp, log, sigmoid, softmax, gelu) against numpy in float64, over a dense sweep of float32
values, as errors in ulps of the exact result. The LLVM renderer computes EXP2 and LOG2 inline (a range reduction and a polynomial);
OpenCL and CUDA call their exp2/log2 (OpenCL allows 3 ulp; PoCL's were within 1). The bounds below hold on every device."""
from __future__ import annotations
import numpy as np
import pytest
from tinyc import Tensor, Device, dtypes
from tinyc.ops import UnaryOps

# every 4099th float32 bit pattern (about a million: every exponent, both signs, denormals, inf and nan), the edges, and a grid
# of 1/64 steps over the range where exp2 goes from 0 to inf
EDGES = [0.0, -0.0, 1.0, -1.0, 2.0, 0.5, np.inf, -np.inf, np.nan, 1e-45, -1e-45, 1.17549435e-38, 1.1754942e-38, 3.4028235e38, -3.4028235e38,
         127.99999, 128.0, -126.0, -149.0, -149.5, -150.0, -151.0, 1e-7, -1e-7, 0.99999994, 1.0000001]
SWEEP = np.concatenate([np.arange(0, 2**32, 4099, dtype=np.uint64).astype(np.uint32).view(np.float32), np.array(EDGES, np.float32),
                        np.arange(-160, 140, 1 / 64, dtype=np.float32)])
SMALLEST_NORMAL = 2.0 ** -126

def ulp_error(got: np.ndarray, exact: np.ndarray) -> np.ndarray:
  """|got - exact| in ulps of float32 at exact; 0 where got is exact's rounding (inf and nan included), inf where one is not finite."""
  rounded = exact.astype(np.float32)
  with np.errstate(all="ignore"):
    error = np.abs(got.astype(np.float64) - exact) / np.spacing(np.abs(rounded)).astype(np.float64)
  same = (got == rounded) | (np.isnan(got) & np.isnan(rounded))
  return np.where(same, 0.0, np.where(np.isfinite(exact) & np.isfinite(got), error, np.inf))

def primitive(op: UnaryOps, x: np.ndarray) -> np.ndarray:
  """The UOp alone, as the renderer makes it (Tensor.exp2 and log2 are these too, but exp and log scale around them)."""
  return Tensor(Tensor(x).lazydata.alu(op)).numpy()

def assert_within(got: np.ndarray, exact: np.ndarray, bound: np.ndarray | float, x: np.ndarray, what: str) -> None:
  error = ulp_error(got, exact)
  worst = int(np.argmax(error - bound))
  assert np.all(error <= bound), f"{what}: {error[worst]:.2f} ulp at x={x.flat[worst]!r}: got {got.flat[worst]!r}, exact {exact.flat[worst]!r}"

@pytest.mark.parametrize("op, reference", [(UnaryOps.EXP2, np.exp2), (UnaryOps.LOG2, np.log2)], ids=["exp2", "log2"])
def test_primitive_within_2_ulp(tinyc_device: str, op: UnaryOps, reference) -> None:
  got = primitive(op, SWEEP)
  with np.errstate(all="ignore"): exact = reference(SWEEP.astype(np.float64))
  normal = ~(np.abs(exact) < SMALLEST_NORMAL) | (exact == 0)
  assert_within(got[normal], exact[normal], 2.0, SWEEP[normal], op.name)
  # a denormal result is within 2 ulp, or flushed to 0 (CUDA and OpenCL may flush)
  if (denormal := ~normal).any():
    assert_within(np.where(got[denormal] == 0, exact[denormal].astype(np.float32), got[denormal]), exact[denormal], 2.0, SWEEP[denormal], op.name)

def test_primitive_special_values(tinyc_device: str) -> None:
  x = np.array([0.0, -0.0, np.inf, -np.inf, np.nan, -1.0, -1e-45, 200.0, -200.0, 1.0], np.float32)
  np.testing.assert_array_equal(primitive(UnaryOps.EXP2, x), [1, 1, np.inf, 0, np.nan, 0.5, 1, np.inf, 0, 2])
  log2_200 = np.log2(np.float32(200.0))
  np.testing.assert_array_equal(primitive(UnaryOps.LOG2, x), [-np.inf, -np.inf, np.inf, np.nan, np.nan, np.nan, np.nan, log2_200, np.nan, 0])

def test_exact_powers_of_two(tinyc_device: str) -> None:
  """exp2 of an integer and log2 of a power of two are exact, through the Tensor methods too (they once went through exp and log,
  and x * ln(2) / ln(2) is not always x: exp2(127) and log2(2^-126) were off by an ulp)."""
  n = np.arange(-149, 128).astype(np.float32)
  powers = np.exp2(n.astype(np.float64)).astype(np.float32)
  # CUDA's and OpenCL's exp2 are exact for normal results only (H200: 2^-127, a denormal, came out an ulp of the denormals low)
  results = n >= (-149 if Device.DEFAULT == "LLVM" else -126)
  for got in (primitive(UnaryOps.EXP2, n), Tensor(n).exp2().numpy()): np.testing.assert_array_equal(got[results], powers[results])
  for got in (primitive(UnaryOps.LOG2, powers), Tensor(powers).log2().numpy()): np.testing.assert_array_equal(got, n)

def test_float64_within_1_ulp() -> None:
  """float64 on the device that has it for certain (the LLVM renderer's exp2 is inline in float64 too; its log2 is libm's)."""
  rng = np.random.default_rng(0)
  x = np.concatenate([rng.uniform(-1100, 1100, 1 << 16), rng.uniform(0, 4, 1 << 16), [0.0, -1075.0, 1024.0]])
  exact = np.exp2(x.astype(np.longdouble))
  got = Tensor(x, device="LLVM").exp2().numpy()
  assert got.dtype == np.float64
  error = np.where(got == exact.astype(np.float64), 0, np.abs(got - exact) / np.spacing(np.abs(exact.astype(np.float64))))
  assert error.max() <= 1.0, f"exp2 float64: {error.max():.2f} ulp"
  np.testing.assert_array_equal(Tensor(np.arange(-1074, 1024.0), device="LLVM").exp2().numpy(), np.exp2(np.arange(-1074, 1024.0)))
  positive = x[x > 0]
  error = np.abs(Tensor(positive, device="LLVM").log2().numpy() - np.log2(positive.astype(np.longdouble))) / np.spacing(np.log2(positive))
  assert error.max() <= 1.0, f"log2 float64: {error.max():.2f} ulp"

def test_exp_and_sigmoid(tinyc_device: str) -> None:
  """exp(x) = exp2(x * log2(e)): the device's exp2 (within 2 ulp on every device, test_primitive_within_2_ulp), and rounding the
  product moves the result by up to |x| * 2^-24 relative, so the bound grows with |x| (about 1 ulp per unit of |x|; torch's exp is
  within 1 ulp throughout). On the H200 CUDA's exp2 made exp(-0.054) 1.68 ulp off."""
  x = np.linspace(-87, 88, 1 << 18, dtype=np.float32)
  exact = np.exp(x.astype(np.float64))
  assert_within(Tensor(x).exp().numpy(), exact, 2 + 1.5 * np.abs(x), x, "exp")
  assert_within(Tensor(x).sigmoid().numpy(), 1 / (1 + 1 / exact), 2.5 + 2 * np.abs(x), x, "sigmoid")

def test_log(tinyc_device: str) -> None:
  x = SWEEP[np.isfinite(SWEEP) & (SWEEP > 0)]
  assert_within(Tensor(x).log().numpy(), np.log(x.astype(np.float64)), 2.0, x, "log")

def test_softmax(tinyc_device: str) -> None:
  """Each probability carries exp's error at x - max(x) and the sum's rounding."""
  x = np.random.default_rng(0).standard_normal((64, 256)).astype(np.float32) * 4
  shifted = x.astype(np.float64) - x.max(-1, keepdims=True)
  exact = np.exp(shifted) / np.exp(shifted).sum(-1, keepdims=True)
  assert_within(Tensor(x).softmax(-1).numpy(), exact, 1.5 * (1 + np.abs(shifted)) + 4, x, "softmax")

def test_gelu(tinyc_device: str) -> None:
  """The tanh form; 1 + tanh(..) cancels for negative x, so the error is bounded in ulps of max(1, |x|), not of the result."""
  x = np.linspace(-10, 10, 1 << 16, dtype=np.float32)
  xd = x.astype(np.float64)
  exact = 0.5 * xd * (1 + np.tanh(np.sqrt(2 / np.pi) * (xd + 0.044715 * xd ** 3)))
  error = np.abs(Tensor(x).gelu().numpy() - exact) / np.spacing(np.maximum(1, np.abs(x)))
  assert error.max() <= 4, f"gelu: {error.max():.2f} ulps of max(1, |x|) at x={x[np.argmax(error)]}"

def test_16_bit_floats_in_float32(tinyc_device: str) -> None:
  """float16 and bfloat16 exp2 and log2 are computed in float32 and rounded once: within one of their own ulps."""
  for dtype, mantissa_bits in ((dtypes.float16, 10), (dtypes.bfloat16, 7)):
    x = Tensor(np.linspace(-14, 15, 4001, dtype=np.float32), dtype=dtype)
    values = x.float().numpy().astype(np.float64)  # as the 16-bit type holds them
    for got, exact in ((x.exp2(), np.exp2(values)), (x.exp2().log2(), np.log2(x.exp2().float().numpy().astype(np.float64)))):
      assert got.dtype == dtype
      nonzero = exact != 0
      ulp = 2.0 ** (np.floor(np.log2(np.abs(exact[nonzero]))) - mantissa_bits)
      error = np.abs(got.float().numpy()[nonzero] - exact[nonzero]) / ulp
      assert error.max() <= 1, f"{dtype}: {error.max():.2f} ulp"
