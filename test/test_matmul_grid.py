"""The two GEMMs, matmul and conv2d, over a grid: layouts NN/NT/TN/TT (transposed views of contiguous arrays), the odd sizes
{1, 7, 127, 1000} covered pairwise, batched and broadcast batches, float32/float16/bfloat16, forward against numpy and forward and
backward (both operands' gradients) against torch.

Every reference is computed in float64 from the very inputs tinyc gets (16-bit values are exact in float64) and rounded once to the
dtype, which is what "accumulate in float32, round at the end" aims at. The tolerance is the worst case of that contract, element by
element: a sum of n products computed in float32 (products of 16-bit floats are exact in float32) is off by at most n * eps32 * the
sum of the products' magnitudes (n roundings of products and n - 1 of partial sums, each at most eps32 / 2 of that sum), and the one
rounding to the dtype adds at most one ulp (eps_dtype * |value|, or the dtype's smallest subnormal near zero). n and the magnitudes
are computed by the same torch function on all-ones and on absolute inputs, so the bound holds for conv2d and batched gradients too.
"""
from __future__ import annotations
import dataclasses
from typing import Any, Callable
import numpy as np
import pytest
import torch
import torch.nn.functional as tF
from tinyc import Tensor, dtypes
from tinyc.device import Device
from tinyc.dtype import DType
from tinyc.helpers import Context, prod
from tinyc.ops import LoadOps
from tinyc.schedule import create_schedule
from helpers import TORCH_DTYPE

SIZES = (1, 7, 127, 1000)
LAYOUTS = ("NN", "NT", "TN", "TT")  # NT: a @ b.T with b stored (N, K) contiguous; TN: a.T @ b with a stored (K, M)
FLOATS = (dtypes.float32, dtypes.float16, dtypes.bfloat16)
EPS32 = float(torch.finfo(torch.float32).eps)

# A 16-run orthogonal array over GF(4): for rows i, j the columns i, j, i+j, i+2j (GF(4) addition is xor) put every pair of levels
# of every two columns together exactly once, so 16 cases cover each pair of (M, K, N, layout) instead of 4^4 = 256.
GF4_TIMES_2 = (0, 2, 3, 1)
PAIRWISE = [(SIZES[i], SIZES[j], SIZES[i ^ j], LAYOUTS[i ^ GF4_TIMES_2[j]]) for i in range(4) for j in range(4)]
EXTRA_SHAPES = [(1000, 1000, 1000), (127, 1000, 7)]
# shapes a tensor-core tile divides (16-bit matmuls on CUDA use mma.sync there), in every layout
TILED_SHAPES = [(256, 256, 256), (128, 512, 64)]

def transposed(x: Any, flag: bool) -> Any: return (x.T if x.ndim == 2 else x.transpose(-1, -2)) if flag else x
def stored(shape: tuple[int, ...], flag: bool) -> tuple[int, ...]: return shape[:-2] + (shape[-1], shape[-2]) if flag else shape

def matmul_in(layout: str) -> Callable[[Any, Any], Any]:
  """a @ b through the views the layout names, for torch and tinyc alike."""
  return lambda a, b: transposed(a, layout[0] == "T") @ transposed(b, layout[1] == "T")

def operand_shapes(a_shape: tuple[int, ...], b_shape: tuple[int, ...], layout: str) -> list[tuple[int, ...]]:
  return [stored(a_shape, layout[0] == "T"), stored(b_shape, layout[1] == "T")]

def rounded(values: np.ndarray, dtype: DType) -> np.ndarray: return torch.from_numpy(values).to(TORCH_DTYPE[dtype]).to(torch.float64).numpy()
def representable(shape: tuple[int, ...], dtype: DType, seed: int) -> np.ndarray:
  """Uniform values in [-1, 1) rounded to dtype, as float64: both sides start from exactly these numbers."""
  return rounded(np.random.default_rng(seed).uniform(-1, 1, size=shape), dtype)

def assert_within_bound(what: str, got: Tensor, exact: np.ndarray, magnitude: np.ndarray, terms: np.ndarray, dtype: DType) -> None:
  """got (a tinyc tensor of dtype) against the float64 `exact`, within the accumulate-in-float32, round-once bound above."""
  assert got.shape == exact.shape and got.dtype == dtype, f"{what}: {got.shape} {got.dtype}, want {exact.shape} {dtype}"
  info = torch.finfo(TORCH_DTYPE[dtype])
  want, values = rounded(exact, dtype), got.numpy().astype(np.float64)
  accumulation = terms * EPS32 * magnitude
  bound = accumulation + info.eps * (np.abs(want) + accumulation) + info.tiny * info.eps
  error = np.abs(values - want)
  if not np.all(error <= bound):  # nan fails here too
    worst = np.unravel_index(np.nanargmax(np.where(np.isnan(error), np.inf, error / bound)), error.shape)
    raise AssertionError(f"{what} ({dtype.name}): {np.sum(~(error <= bound))} of {error.size} elements off the bound; worst at "
                         f"{tuple(map(int, worst))}: got {values[worst]!r}, want {want[worst]!r} (exact {exact[worst]!r}), error {error[worst]:.3g} "
                         f"= {error[worst] / bound[worst]:.3g}x the bound {bound[worst]:.3g} ({int(terms[worst])} terms of total magnitude "
                         f"{magnitude[worst]:.4g}); largest error {np.nanmax(error):.3g}")

def check_bilinear(shapes: list[tuple[int, ...]], torch_fn: Callable[..., Any], tinyc_fn: Callable[..., Any], dtype: DType, seed: int = 0) -> None:
  """Forward and the gradients of both operands, through .backward() of sum(out * upstream), against torch in float64."""
  arrays = [representable(shape, dtype, seed + i) for i, shape in enumerate(shapes)]
  def torch_run(inputs: list[np.ndarray], upstream: np.ndarray | None) -> tuple[np.ndarray, ...]:
    leaves = [torch.tensor(x, requires_grad=True) for x in inputs]
    out = torch_fn(*leaves)
    (out * torch.from_numpy(upstream if upstream is not None else np.ones(out.shape))).sum().backward()
    return (out.detach().numpy(), *[leaf.grad.numpy() for leaf in leaves])  # type: ignore[union-attr]
  upstream = representable(tuple(torch_fn(*[torch.empty(x.shape, device="meta") for x in arrays]).shape), dtype, seed + 100)
  exact = torch_run(arrays, upstream)
  magnitude = torch_run([np.abs(x) for x in arrays], np.abs(upstream))
  terms = torch_run([np.ones_like(x) for x in arrays], None)
  leaves = [Tensor(x.astype(np.float32), dtype=dtype, requires_grad=True) for x in arrays]
  out = tinyc_fn(*leaves)
  (out * Tensor(upstream.astype(np.float32), dtype=dtype)).sum().backward()
  Tensor.corealize([out, *[leaf.grad for leaf in leaves]])
  for what, got, *reference in zip(["forward", *[f"gradient of input {i}" for i in range(len(leaves))]], [out, *[x.grad for x in leaves]],
                                   exact, magnitude, terms):
    assert_within_bound(what, got, *reference, dtype)

def case_id(shape: tuple[int, int, int], layout: str, dtype: DType | None = None) -> str:
  return f"{layout}-{'x'.join(map(str, shape))}" + (f"-{dtype.name}" if dtype is not None else "")

# ***** forward against numpy: every layout, sizes pairwise *****

NUMPY_CASES = [(shape, layout) for shape in [(m, k, n) for m, k, n, _ in PAIRWISE] + EXTRA_SHAPES for layout in LAYOUTS]

@pytest.mark.parametrize("shape, layout", NUMPY_CASES, ids=[case_id(*case) for case in NUMPY_CASES])
def test_matmul_numpy(shape, layout):
  (m, k, n), fn = shape, matmul_in(layout)
  a, b = (representable(s, dtypes.float32, i) for i, s in enumerate(operand_shapes((m, k), (k, n), layout)))
  got = fn(Tensor(a.astype(np.float32)), Tensor(b.astype(np.float32)))
  assert_within_bound("forward", got, fn(a, b), fn(np.abs(a), np.abs(b)), np.full((m, n), k), dtypes.float32)

# ***** forward and backward against torch *****

GRAD_CASES = [((m, k, n), layout, dtype) for m, k, n, layout in PAIRWISE for dtype in FLOATS]
GRAD_CASES += [(shape, layout, dtype) for shape in EXTRA_SHAPES for layout, dtype in zip(LAYOUTS, FLOATS)]
GRAD_CASES += [(shape, layout, dtype) for shape in TILED_SHAPES for layout in LAYOUTS for dtype in (dtypes.float16, dtypes.bfloat16)]

@pytest.mark.parametrize("shape, layout, dtype", GRAD_CASES, ids=[case_id(*case) for case in GRAD_CASES])
def test_matmul_grad(shape, layout, dtype):
  (m, k, n), fn = shape, matmul_in(layout)
  check_bilinear(operand_shapes((m, k), (k, n), layout), fn, fn, dtype, seed=m + k + n)

BATCHED = {  # name: shapes of a and b before the layout's transposes
  "batched": ((5, 7, 127), (5, 127, 33)), "broadcast": ((5, 33, 127), (127, 7)), "broadcast_left": ((127, 7), (3, 7, 1)),
  "4d": ((2, 3, 7, 127), (2, 3, 127, 9)), "4d_broadcast": ((2, 1, 7, 33), (1, 3, 33, 127)),
}

# every (batch shape, layout) pair, with the dtypes rotated so that each batch shape and each layout also meets every dtype
BATCHED_CASES = [(name, layout, FLOATS[(i + j) % len(FLOATS)]) for i, name in enumerate(BATCHED) for j, layout in enumerate(LAYOUTS)]

@pytest.mark.parametrize("name, layout, dtype", BATCHED_CASES, ids=[f"{name}-{layout}-{dtype.name}" for name, layout, dtype in BATCHED_CASES])
def test_matmul_batched_grad(name, layout, dtype):
  fn = matmul_in(layout)
  check_bilinear(operand_shapes(*BATCHED[name], layout), fn, fn, dtype)

# ***** conv2d, the other GEMM: forward, input gradient, weight gradient *****

CONV = {  # name: input shape, weight shape, stride, padding
  "3to127_3x3_pad1": ((2, 3, 9, 9), (127, 3, 3, 3), 1, 1), "127to7_1x1_stride2": ((2, 127, 7, 7), (7, 127, 1, 1), 2, 0),
  "7to7_3x3_stride2_pad1": ((1, 7, 10, 9), (7, 7, 3, 3), 2, 1), "127to127_3x3_pad1": ((1, 127, 6, 6), (127, 127, 3, 3), 1, 1),
  "7to3_1x1_pad1": ((2, 7, 5, 5), (3, 7, 1, 1), 1, 1),
}

@pytest.mark.parametrize("dtype", [dtypes.float32, dtypes.float16], ids=str)
@pytest.mark.parametrize("name", CONV)
def test_conv2d_grad(name, dtype):
  x_shape, w_shape, stride, padding = CONV[name]
  check_bilinear([x_shape, w_shape], lambda x, w: tF.conv2d(x, w, stride=stride, padding=padding),
                 lambda x, w: x.conv2d(w, stride=stride, padding=padding), dtype)

def copies_made(build: Callable[[], Tensor]) -> list[int]:
  """The sizes of the kernels the matmul `build` makes beyond those it makes built with PACK=0: its copies, which run first."""
  kernels = lambda: [item for item in create_schedule([build().lazydata]) if item.ast.op not in LoadOps]  # noqa: E731
  with Context(PACK=0): unpacked = len(kernels())
  made = kernels()
  return [prod(item.outs[0].shape) for item in made[:len(made) - unpacked]]
def copies_before(build: Callable[[], Tensor]) -> int: return len(copies_made(build))

def test_a_cpu_matmul_copies_an_operand_strided_along_the_reduce_contiguous_first(tinyc_device):
  """On a CPU, an operand of 2^18 elements or more that the reduce walks with a stride over 2 KB is copied contiguous along the
  reduce in a kernel of its own (the grid's 1000 x 1000 cases check the values, forward and backward); a GPU stages tiles instead."""
  cpu = int(not Device[Device.DEFAULT].target.has_local)
  a, b = Tensor.empty(528, 528), Tensor.empty(528, 528)  # rows of 2112 bytes (whole cache lines)
  assert [copies_before(lambda: matmul_in(layout)(a, b)) for layout in LAYOUTS] == [cpu, 0, 2 * cpu, cpu]
  narrow, small = Tensor.empty(528, 512), Tensor.empty(500, 500)  # rows of 2048 bytes, which the prefetcher follows; 250000 elements
  assert copies_before(lambda: narrow.T @ narrow) == copies_before(lambda: small.T @ small) == 0

def test_a_cpu_matmul_pads_a_reduce_of_partial_cache_lines_to_whole_ones(tinyc_device):
  """On a CPU, where the reduce's rows are not whole 64-byte lines (1000 floats) and both operands have 512 rows or more, both are
  copied with it padded by zeros to whole lines (1008). The values: the grid's 1000 x 1000 cases, forward and backward."""
  cpu = int(not Device[Device.DEFAULT].target.has_local)
  a, b, thin = Tensor.empty(1000, 1000), Tensor.empty(1000, 1000), Tensor.empty(1000, 500)
  assert [copies_made(lambda: matmul_in(layout)(a, b)) for layout in LAYOUTS] == [[1000 * 1008] * 2 * cpu] * 4
  assert copies_before(lambda: a @ thin) == copies_before(lambda: a[:, :992] @ b[:, :992].T) == 0  # 500 columns; 992 floats: 62 lines

def test_a_tf32_matmul_on_sm90_copies_the_smaller_operand_along_k_where_neither_operand_is(monkeypatch):
  """wgmma reads 32-bit values only along K: with TF32 on a warpgroup target, `a.T @ b` (neither operand along K) copies the
  smaller one so; the other layouts, 16-bit operands and TF32 off copy nothing. Values: the TF32 tests on the H200."""
  device = Device[Device.DEFAULT]
  monkeypatch.setattr(device, "target", dataclasses.replace(device.target, has_local=True, warpgroups=True))
  def copied(a: Tensor, b: Tensor, layout: str) -> list[int]: return copies_made(lambda: matmul_in(layout)(a, b))
  square, a, b = Tensor.empty(1024, 1024), Tensor.empty(1024, 512), Tensor.empty(1024, 2048)
  with Context(ALLOW_TF32=1):
    assert [copied(square, square, layout) for layout in LAYOUTS] == [[], [], [1024 * 1024], []]
    assert copied(a, b, "TN") == copied(b, a, "TN") == [512 * 1024]  # x = a.T, then w = a: the smaller
    assert copied(a.half(), b.half(), "TN") == []
  assert copied(a, b, "TN") == []

def test_a_padded_cpu_matmul_broadcasts_an_operand_of_more_dims(tinyc_device):
  """The padding of K (1000 floats: partial cache lines) applies to operands of different ranks too."""
  rng = np.random.default_rng(7)
  x, w = rng.standard_normal((512, 1000), dtype=np.float32), rng.standard_normal((2, 1000, 512), dtype=np.float32)
  for a, b in ((x, w), (w.transpose(0, 2, 1), x.T)):
    np.testing.assert_allclose((Tensor(a) @ Tensor(b)).numpy(), a @ b, rtol=1e-3, atol=1e-3)
