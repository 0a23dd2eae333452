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

Inputs = Sequence[tuple[int, ...] | np.ndarray]
GradCase = tuple[Inputs, Callable[..., Any], Callable[..., Any] | None]  # inputs, torch fn, tinyc fn (None: the torch fn runs on both)

def check_grad(inputs: Inputs, torch_fn: Callable[..., Any], tinyc_fn: Callable[..., Any] | None = None, atol: float = 1e-5,
               rtol: float = 1e-3, low: float = -2.0, high: float = 2.0, seed: int = 0) -> None:
  """`check` through autograd. Each input is a shape (a random float32 leaf in [low, high)) or an array: a float array is a leaf with
  those values, an int or bool array a constant (labels, masks). Compares the forward result, then backpropagates one random upstream
  gradient w, `(out * w).sum().backward()` (random rather than ones, so a backward that permutes, flips or sums the wrong axis cannot
  hide), and compares every leaf's .grad (shape, dtype, values) with torch's. An output may be a list (chunk): each gets its own w."""
  check_grads({"": (inputs, torch_fn, tinyc_fn)}, atol, rtol, low, high, seed)

def check_grads(cases: dict[str, GradCase], atol: float = 1e-5, rtol: float = 1e-3, low: float = -2.0, high: float = 2.0, seed: int = 0) -> None:
  """check_grad for many cases at once, as one graph: every output flattened into one tensor and every leaf's gradient into another,
  so that they compile into a few large kernels instead of many small ones (compiling is where the suite spends its time). When the
  group fails, each case is checked alone, to name the one that is wrong."""
  try: _check_grads(list(cases.values()), atol, rtol, low, high, seed)
  except AssertionError:
    if len(cases) == 1: raise
    for name, case in cases.items():
      try: _check_grads([case], atol, rtol, low, high, seed)
      except AssertionError as error: raise AssertionError(f"case {name!r}: {error}") from None
    raise

def _check_grads(cases: list[GradCase], atol: float, rtol: float, low: float, high: float, seed: int) -> None:
  wants: list[torch.Tensor] = []
  gots: list[Tensor] = []
  leaves: list[tuple[Tensor, torch.Tensor]] = []
  for inputs, torch_fn, tinyc_fn in cases:
    arrays = [random_array(x, low=low, high=high, seed=seed + len(leaves) + i) if isinstance(x, tuple) else x for i, x in enumerate(inputs)]
    is_leaf = [np.issubdtype(a.dtype, np.floating) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) if leaf else torch.from_numpy(np.array(a)) for a, leaf in zip(arrays, is_leaf)]
    ours = [Tensor(a, requires_grad=True) if leaf else Tensor(a) for a, leaf in zip(arrays, is_leaf)]
    want, got = torch_fn(*theirs), (tinyc_fn or torch_fn)(*ours)
    want, got = (list(want), list(got)) if isinstance(want, (list, tuple)) else ([want], [got])
    assert len(got) == len(want), f"got {len(got)} outputs, torch gave {len(want)}"
    for g, w in zip(got, want):
      assert isinstance(g, Tensor), f"tinyc returned a {type(g).__name__}, not a Tensor"
      assert g.shape == tuple(w.shape), f"shape {g.shape} != torch's {tuple(w.shape)}"
      assert g.dtype == expected_dtype(w.dtype, [t.dtype for t in ours]), f"dtype {g.dtype} != torch's {w.dtype}"
      assert g.requires_grad, "an op on a tensor that requires grad must give a result that requires grad"
    wants, gots = wants + want, gots + got
    leaves += [(o, t) for o, t, leaf in zip(ours, theirs, is_leaf) if leaf]
  got_all = gots[0].flatten().cat(*[g.flatten() for g in gots[1:]])
  want_all = torch.cat([w.reshape(-1) for w in wants])
  compare(got_all, want_all, atol, rtol)
  upstream = np.random.default_rng(seed + 100).standard_normal(want_all.shape[0]).astype(np.float32)
  (want_all * torch.from_numpy(upstream)).sum().backward()
  (got_all * Tensor(upstream)).sum().backward()
  for i, (mine, reference) in enumerate(leaves):
    assert reference.grad is None or mine.grad is not None, f"input {i} got no gradient (torch's: {reference.grad})"
    if mine.grad is not None:
      assert mine.grad.shape == mine.shape and mine.grad.dtype == mine.dtype, f"input {i}: grad {mine.grad.shape} {mine.grad.dtype}"
  got_grads = [(m.grad if m.grad is not None else m.zeros_like()).flatten() for m, _ in leaves]
  want_grads = torch.cat([(r.grad if r.grad is not None else torch.zeros_like(r)).reshape(-1) for _, r in leaves])
  try: compare(got_grads[0].cat(*got_grads[1:]), want_grads, atol, rtol)
  except AssertionError as error: raise AssertionError(f"gradients: {error}") from None
