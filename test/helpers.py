"""Shared test helpers: random inputs, the tinyc <-> torch dtype map, and `check`, which runs one function on torch and on tinyc
and compares shape, dtype and values."""
from __future__ import annotations
import math
from typing import Any, Callable, Sequence
import numpy as np
import torch
from tinyc import Tensor, dtypes
from tinyc.dtype import DType

TORCH_DTYPE: dict[DType, torch.dtype] = {
  dtypes.bool: torch.bool, dtypes.int8: torch.int8, dtypes.uint8: torch.uint8, dtypes.int16: torch.int16, dtypes.uint16: torch.uint16,
  dtypes.int32: torch.int32, dtypes.uint32: torch.uint32, dtypes.int64: torch.int64, dtypes.uint64: torch.uint64,
  dtypes.float16: torch.float16, dtypes.bfloat16: torch.bfloat16, dtypes.float32: torch.float32, dtypes.float64: torch.float64}
TINYC_DTYPE: dict[torch.dtype, DType] = {v: k for k, v in TORCH_DTYPE.items()}

def random_array(shape: tuple[int, ...], dtype: DType = dtypes.float32, low: float = -2.0, high: float = 2.0, seed: int = 0) -> np.ndarray:
  """Random values in [low, high) for floats, the ints in [low, high] for ints (low clipped to 0 for unsigned), 50/50 for bool."""
  rng = np.random.default_rng(seed)
  if dtype == dtypes.bool: return np.asarray(rng.random(shape) < 0.5)
  if dtypes.is_int(dtype):
    lo = max(math.ceil(low), 0) if dtypes.is_unsigned(dtype) else math.ceil(low)
    return np.asarray(rng.integers(lo, math.floor(high), size=shape, endpoint=True), dtype=dtype.np)
  return np.asarray(rng.uniform(low, high, size=shape), dtype=np.float32 if dtype == dtypes.bfloat16 else dtype.np)

def to_torch(array: np.ndarray, dtype: DType) -> torch.Tensor: return torch.from_numpy(np.array(array)).to(TORCH_DTYPE[dtype])
def to_tinyc(array: np.ndarray, dtype: DType) -> Tensor: return Tensor(array, dtype=dtype)

def expected_dtype(torch_dtype: torch.dtype, input_dtypes: Sequence[DType]) -> DType:
  """The dtype tinyc documents for a result that torch computes as `torch_dtype`: the same, except that where torch makes int64 out of
  inputs that have no int64 (argmax, sum of ints or bools, int Python scalars), tinyc uses its default int, int32."""
  if torch_dtype == torch.int64 and dtypes.int64 not in input_dtypes: return dtypes.default_int
  return TINYC_DTYPE[torch_dtype]

def as_numpy(value: torch.Tensor) -> np.ndarray:
  value = value.detach()
  return (value.float() if value.dtype == torch.bfloat16 else value).numpy()

def compare(got: Tensor, want: torch.Tensor, atol: float = 1e-6, rtol: float = 1e-3, input_dtypes: Sequence[DType] = (),
            dtype: DType | None = None) -> None:
  """Assert tinyc's `got` matches torch's `want`: exact shape, the documented dtype (or `dtype`), values within tolerance."""
  if isinstance(want, (list, tuple)):
    assert isinstance(got, (list, tuple)) and len(got) == len(want), f"got {len(got)} outputs, torch gave {len(want)}"
    for g, w in zip(got, want): compare(g, w, atol, rtol, input_dtypes, dtype)
    return
  assert isinstance(got, Tensor), f"tinyc returned a {type(got).__name__}, not a Tensor"
  assert got.shape == tuple(want.shape), f"shape {got.shape} != torch's {tuple(want.shape)}"
  want_dtype = dtype if dtype is not None else expected_dtype(want.dtype, input_dtypes)
  assert got.dtype == want_dtype, f"dtype {got.dtype} != {want_dtype} (torch: {want.dtype})"
  values, reference = got.numpy(), as_numpy(want)
  assert values.shape == reference.shape, f"numpy() shape {values.shape} != {reference.shape}"
  if dtypes.is_float(got.dtype): np.testing.assert_allclose(values, reference, atol=atol, rtol=rtol, equal_nan=True)
  else: np.testing.assert_equal(values, reference.astype(values.dtype))

def check(shapes: Sequence[tuple[int, ...]], torch_fn: Callable[..., Any], tinyc_fn: Callable[..., Any] | None = None, atol: float = 1e-6,
          rtol: float = 1e-3, low: float = -2.0, high: float = 2.0, dtype: DType | Sequence[DType] = dtypes.float32,
          out_dtype: DType | None = None, seed: int = 0) -> None:
  """Make one random input per shape (dtype: one for all or one per input), run torch_fn on torch tensors and tinyc_fn (default:
  torch_fn, since most names match) on tinyc tensors, and compare the results. Tolerances are on the torch result."""
  dts = list(dtype) if isinstance(dtype, (list, tuple)) else [dtype] * len(shapes)
  arrays = [random_array(shape, dt, low, high, seed + i) for i, (shape, dt) in enumerate(zip(shapes, dts))]
  want = torch_fn(*[to_torch(a, dt) for a, dt in zip(arrays, dts)])
  got = (tinyc_fn or torch_fn)(*[to_tinyc(a, dt) for a, dt in zip(arrays, dts)])
  compare(got, want, atol, rtol, dts, out_dtype)

def check_grad(inputs: Sequence[tuple[int, ...] | np.ndarray], torch_fn: Callable[..., Any], tinyc_fn: Callable[..., Any] | None = None,
               atol: float = 1e-5, rtol: float = 1e-3, low: float = -2.0, high: float = 2.0, seed: int = 0) -> None:
  """`check` through autograd. Each input is a shape (a random float32 leaf in [low, high)) or an array: a float array is a leaf with
  those values, an int or bool array a constant (labels, masks). Compares the forward result, then backpropagates one random upstream
  gradient w, `(out * w).sum().backward()` (random rather than ones, so a backward that permutes, flips or sums the wrong axis cannot
  hide), and compares every leaf's .grad (shape, dtype, values) with torch's. An output may be a list (chunk): each gets its own w."""
  arrays = [random_array(x, low=low, high=high, seed=seed + i) if isinstance(x, tuple) else x for i, x in enumerate(inputs)]
  leaf = [np.issubdtype(a.dtype, np.floating) for a in arrays]
  theirs = [torch.tensor(a, requires_grad=True) if is_leaf else torch.from_numpy(np.array(a)) for a, is_leaf in zip(arrays, leaf)]
  ours = [Tensor(a, requires_grad=True) if is_leaf else Tensor(a) for a, is_leaf in zip(arrays, leaf)]
  want, got = torch_fn(*theirs), (tinyc_fn or torch_fn)(*ours)
  compare(got, want, atol, rtol, [t.dtype for t in ours])
  wants, gots = (list(want), list(got)) if isinstance(want, (list, tuple)) else ([want], [got])
  assert all(g.requires_grad for g in gots), "an op on a tensor that requires grad must give a result that requires grad"
  rng = np.random.default_rng(seed + 100)
  upstream = [rng.standard_normal(tuple(w.shape)).astype(np.float32) for w in wants]
  sum(((w * torch.from_numpy(u)).sum() for w, u in zip(wants, upstream)), torch.zeros(())).backward()
  loss = gots[0].mul(Tensor(upstream[0])).sum()
  for g, u in zip(gots[1:], upstream[1:]): loss = loss + g.mul(Tensor(u)).sum()
  loss.backward()
  for i, (mine, reference) in enumerate(zip(ours, theirs)):
    if not leaf[i]: continue
    if reference.grad is None:
      assert mine.grad is None or not mine.grad.numpy().any(), f"input {i}: torch has no gradient, tinyc has {mine.grad.numpy()}"
      continue
    assert mine.grad is not None, f"input {i} got no gradient (torch's: {reference.grad})"
    try: compare(mine.grad, reference.grad, atol, rtol, [mine.dtype])
    except AssertionError as error: raise AssertionError(f"gradient of input {i}: {error}") from None
