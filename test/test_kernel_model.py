"""The kernel model beyond one reduce and one output: kernels written as ASTs by hand (attention's nested reduces, layernorm's
three outputs, cross-entropy's row reduces inside a sum over rows, two reduces over different axes) give numpy's values on
every device, unoptimized, with the heuristic's Opts and with random legal Opts."""
from __future__ import annotations
import os, random
from typing import Callable, cast
import numpy as np
import pytest
from tinyc import Tensor
from tinyc.device import Buffer, Device
from tinyc.dtype import DType, dtypes
from tinyc.helpers import prod
from tinyc.ops import BinaryOps, BufferOps, ConstBuffer, LazyOp, MemBuffer, ReduceOps, UnaryOps
from tinyc.shape.shapetracker import ShapeTracker
from tinyc.codegen.kernel import AxisKind, Kernel, KernelTarget
from tinyc.codegen.linearizer import Linearizer
from tinyc.codegen.uops import UOps
from test_opt_fuzz import random_opts
from test_kernel_opts import the_ast

F32 = dtypes.float32

def view(shape: tuple[int, ...], dims: tuple[int, ...], ndim: int, order: tuple[int, ...] | None = None) -> ShapeTracker:
  """A contiguous buffer of `shape` (permuted by `order`) seen in the kernel's `ndim` dims, its i-th dim being dim `dims[i]`."""
  st = ShapeTracker.from_shape(shape)
  if order is not None: st = st.permute(order)
  full = [1] * ndim
  for size, dim in zip(st.shape, dims): full[dim] = size
  if list(dims) != sorted(dims): st = st.permute(tuple(sorted(range(len(dims)), key=lambda i: dims[i])))
  return st.reshape(tuple(full))

def load(number: int, st: ShapeTracker) -> LazyOp: return LazyOp(BufferOps.LOAD, (), MemBuffer(number, F32, st))
def const(value: float, ndim: int) -> LazyOp: return LazyOp(BufferOps.CONST, (), ConstBuffer(value, F32, ShapeTracker.from_shape((1,) * ndim)))
def alu(op, *srcs: LazyOp) -> LazyOp: return LazyOp(op, srcs)
def total(op: ReduceOps, src: LazyOp, *dims: int) -> LazyOp: return LazyOp(op, (src,), dims)
def store(number: int, value: LazyOp, st: ShapeTracker) -> LazyOp: return LazyOp(BufferOps.STORE, (value,), MemBuffer(number, F32, st))
def exp(x: LazyOp, ndim: int) -> LazyOp: return alu(UnaryOps.EXP2, alu(BinaryOps.MUL, x, const(1 / np.log(2), ndim)))

def attention(rows: int = 12, keys: int = 20, width: int = 8, features: int = 6, features_first: bool = False):
  """dims [i, f, j, e] ([f, i, j, e] with `features_first`): scores = q.k over e, a row max over j, then o = sum_j exp(s - max) v /
  sum_j exp(s - max). The scores are a reduce nested in three reduces' loops over j; the kernel stores o, the max and the sum."""
  rng = np.random.default_rng(0)
  q, k, v = rng.standard_normal((rows, width)), rng.standard_normal((keys, width)), rng.standard_normal((keys, features))
  i, f = (1, 0) if features_first else (0, 1)
  scores = total(ReduceOps.SUM, alu(BinaryOps.MUL, load(3, view(q.shape, (i, 3), 4)), load(4, view(k.shape, (2, 3), 4))), 3)
  peak = total(ReduceOps.MAX, scores, 2)
  weights = exp(alu(BinaryOps.SUB, scores, peak), 4)
  norm = total(ReduceOps.SUM, weights, 2)
  out = alu(BinaryOps.DIV, total(ReduceOps.SUM, alu(BinaryOps.MUL, weights, load(5, view(v.shape, (2, f), 4))), 2), norm)
  ast = LazyOp(BufferOps.SINK, (store(0, out, view((rows, features), (i, f), 4)), store(1, peak, view((rows,), (i,), 4)),
                                store(2, norm, view((rows,), (i,), 4))))
  s = q @ k.T
  p = np.exp(s - s.max(1, keepdims=True))
  return ast, [q, k, v], [p @ v / p.sum(1, keepdims=True), s.max(1), p.sum(1)]

def layernorm(rows: int = 9, width: int = 40):
  """dims [n, d]: mean and inverse std as row reduces; the output (a row), the mean and the inverse std stored by one kernel."""
  x = np.random.default_rng(1).standard_normal((rows, width))
  xs = load(3, view(x.shape, (0, 1), 2))
  mean = alu(BinaryOps.MUL, total(ReduceOps.SUM, xs, 1), const(1 / width, 2))
  centered = alu(BinaryOps.SUB, xs, mean)
  variance = alu(BinaryOps.MUL, total(ReduceOps.SUM, alu(BinaryOps.MUL, centered, centered), 1), const(1 / width, 2))
  invstd = alu(UnaryOps.RECIP, alu(UnaryOps.SQRT, alu(BinaryOps.ADD, variance, const(1e-5, 2))))
  ast = LazyOp(BufferOps.SINK, (store(0, alu(BinaryOps.MUL, centered, invstd), view(x.shape, (0, 1), 2)),
                                store(1, mean, view((rows,), (0,), 2)), store(2, invstd, view((rows,), (0,), 2))))
  m = x.mean(1, keepdims=True)
  s = 1 / np.sqrt(((x - m) ** 2).mean(1, keepdims=True) + 1e-5)
  return ast, [x], [(x - m) * s, m[:, 0], s[:, 0]]

def cross_entropy(rows: int = 24, classes: int = 17):
  """dims [b, c]: the mean over rows of logsumexp(row) - row[label], one sum over (b, c) around the row reduces over c; the
  kernel also stores the sum of the one-hot weights (a sibling reduce)."""
  rng = np.random.default_rng(2)
  x, labels = rng.standard_normal((rows, classes)), rng.integers(0, classes, rows)
  one_hot = np.eye(classes)[labels]
  xs, hot = load(2, view(x.shape, (0, 1), 2)), load(3, view(x.shape, (0, 1), 2))
  peak = total(ReduceOps.MAX, xs, 1)
  logsumexp = alu(BinaryOps.ADD, alu(BinaryOps.MUL, alu(UnaryOps.LOG2, total(ReduceOps.SUM, exp(alu(BinaryOps.SUB, xs, peak), 2), 1)),
                                     const(np.log(2), 2)), peak)
  loss = total(ReduceOps.SUM, alu(BinaryOps.MUL, alu(BinaryOps.SUB, logsumexp, xs), hot), 0, 1)
  count = total(ReduceOps.SUM, hot, 0, 1)
  ast = LazyOp(BufferOps.SINK, (store(0, alu(BinaryOps.DIV, loss, count), view((1,), (0,), 2)), store(1, count, view((1,), (0,), 2))))
  lse = np.log(np.exp(x - x.max(1, keepdims=True)).sum(1)) + x.max(1)
  return ast, [x, one_hot], [np.array([(lse - x[np.arange(rows), labels]).mean()]), np.array([float(rows)])]

def crossed_sums(rows: int = 7, cols: int = 13):
  """dims [r, c]: sums of the rows and of the columns: two reduces over different axes, each output a row of the other's axis."""
  x = np.random.default_rng(3).standard_normal((rows, cols))
  xs = load(2, view(x.shape, (0, 1), 2))
  ast = LazyOp(BufferOps.SINK, (store(0, total(ReduceOps.SUM, xs, 1), view((rows,), (0,), 2)),
                                store(1, total(ReduceOps.SUM, xs, 0), view((cols,), (1,), 2))))
  return ast, [x], [x.sum(1), x.sum(0)]

KERNELS: dict[str, Callable] = {"attention": attention, "layernorm": layernorm, "cross_entropy": cross_entropy, "crossed_sums": crossed_sums}

def run(ast: LazyOp, inputs: list[np.ndarray], expected: list[np.ndarray], opts: tuple | None) -> list[np.ndarray]:
  device = Device.DEFAULT
  outs = [Buffer(device, prod(e.shape), F32) for e in expected]
  program = Device[device].get_program(ast, opts)
  program(outs + [Buffer(device, a.size, F32).copyin(a.astype(np.float32)) for a in inputs])
  return [out.numpy().reshape(e.shape) for out, e in zip(outs, expected)]

@pytest.mark.parametrize("name", KERNELS)
def test_hand_written_kernels_match_numpy(name, tinyc_device):
  ast, inputs, expected = KERNELS[name]()
  rng = random.Random(name)
  lists = [(), None] + [tuple(random_opts(ast, Device[Device.DEFAULT].target, rng)) for _ in range(int(os.environ.get("OPT_FUZZ_LISTS", "6")))]
  for opts in lists:
    for got, want in zip(run(ast, inputs, expected, opts), expected):
      np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4, err_msg=f"{name} with {opts}")

def test_axes_know_their_reduces():
  ast, _, _ = attention()
  kernel = Kernel(ast)
  assert kernel.full_shape == (12, 6, 20, 8) and kernel.kinds == (AxisKind.GLOBAL, AxisKind.GLOBAL, AxisKind.REDUCE, AxisKind.REDUCE)
  names = {number: reduceop.op for number, reduceop in enumerate(kernel.reduceops)}
  assert [sorted(names[n].name for n in owners) for owners in kernel.owners[2:]] == [["MAX", "SUM", "SUM"], ["SUM"]]
  assert kernel.n_outputs == 3 and kernel.stores_rows is False

@pytest.mark.parametrize("name", KERNELS)
def test_local_memory_estimate_covers_what_the_code_defines(name):
  """apply_opt refuses Opts whose local memory is over the device's: its estimate must cover every DEFINE_LOCAL the code makes
  (a nested reduce split by a GROUP is computed in several loops, with as many results as the lanes its value depends on)."""
  ast, _, _ = KERNELS[name]()
  target, rng = KernelTarget(has_local=True), random.Random(name)
  for _ in range(40):
    kernel = Kernel(ast, target)
    for opt in random_opts(ast, target, rng): kernel.apply_opt(opt)
    kernel.limit_global_dims(3)
    uops = Linearizer(kernel, threads=True).linearize()
    defined = sum(uop.arg.size * cast(DType, uop.dtype).itemsize for uop in uops if uop.op is UOps.DEFINE_LOCAL)
    assert defined <= kernel.local_memory_bytes, (kernel.applied_opts, defined, kernel.local_memory_bytes)

def test_outer_launch_dimensions_stay_within_the_grid_limit(tinyc_device):
  """A GPU launches at most 65535 work-groups along y and z (CUDA; NVIDIA's OpenCL alike): a kernel whose outer GLOBAL axes are
  longer has them merged into fewer launch dimensions (Winograd's output-gradient transform: 147456 x 14 x 14 failed to launch)."""
  data = np.arange(5 * 3 * 70000, dtype=np.float32).reshape(5, 3, 70000)
  out = Tensor(data).permute(2, 1, 0) + 1  # (70000, 3, 5): no two axes merge, the longest is outermost
  kernel = Kernel(the_ast(out), KernelTarget(has_local=True))
  kernel.limit_global_dims(3)
  assert all(kernel.full_shape[axis] <= 65535 for axis in kernel.axes(AxisKind.GLOBAL)[:-1]), kernel.full_shape
  np.testing.assert_array_equal(out.numpy(), data.transpose(2, 1, 0) + 1)
