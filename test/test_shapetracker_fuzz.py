"""Fuzz the ShapeTracker: random movement-op sequences, checked element by element against the same ops on numpy arrays."""
from __future__ import annotations
import random
from typing import Any, Callable
import numpy as np
from tinyc.helpers import getenv, prod
from tinyc.shape.shapetracker import ShapeTracker, index_variables
from tinyc.shape.symbolic import AndNode, DivNode, Node, Variable, render_c, sym_infer

PAD = -1  # numpy's marker for padded (invalid) elements; real elements are arange values >= 0
MAX_ELEMENTS = 3000

# Render nodes as numpy expressions over index arrays: vectorised evaluation of every element at once.
NUMPY_OPS = {**render_c, DivNode: lambda node, ops, ctx: f"({node.a.render(ops, ctx)}//{node.b})",
             AndNode: lambda node, ops, ctx: "(" + "&".join(f"({child.render(ops, ctx)})" for child in node.nodes) + ")"}

def random_factorization(rng: random.Random, size: int) -> tuple[int, ...]:
  """A random shape of 1..4 dims (size-1 dims included sometimes) with the given number of elements."""
  dims, rest = [], size
  for _ in range(rng.randint(0, 3)):
    divisors = [d for d in range(1, rest + 1) if rest % d == 0]
    dims.append(rng.choice(divisors))
    rest //= dims[-1]
  dims.append(rest)
  rng.shuffle(dims)
  return tuple(dims)

Op = tuple[str, Any]

def random_op(rng: random.Random, shape: tuple[int, ...]) -> Op:
  kind = rng.choice(["reshape", "reshape", "permute", "expand", "pad", "shrink", "stride"])
  if kind == "reshape": return kind, random_factorization(rng, prod(shape))
  if kind == "permute": return kind, tuple(rng.sample(range(len(shape)), len(shape)))
  if kind == "expand":
    if 1 not in shape: return "reshape", tuple(rng.sample(shape + (1,), len(shape) + 1))  # make a size-1 dim to expand later
    return kind, tuple(rng.randint(1, 4) if size == 1 else size for size in shape)
  if kind == "pad": return kind, tuple((rng.randint(0, 2), rng.randint(0, 2)) for _ in shape)
  if kind == "shrink":
    arg = []
    for size in shape:
      begin = rng.randint(0, size - 1)
      arg.append((begin, rng.randint(begin + 1, size)))
    return kind, tuple(arg)
  return kind, tuple(rng.choice([1, 1, 2, 3, -1, -2]) for _ in shape)

def apply_numpy(array: np.ndarray, op: Op) -> np.ndarray:
  kind, arg = op
  if kind == "reshape": return array.reshape(arg)
  if kind == "permute": return array.transpose(arg)
  if kind == "expand": return np.broadcast_to(array, arg)
  if kind == "pad": return np.pad(array, arg, constant_values=PAD)
  if kind == "shrink": return array[tuple(slice(begin, end) for begin, end in arg)]
  return array[tuple(slice(None, None, 1 if m > 0 else -1) for m in arg)][tuple(slice(None, None, abs(m)) for m in arg)]

def apply_tracker(st: ShapeTracker, op: Op) -> ShapeTracker:
  kind, arg = op
  method: Callable[[Any], ShapeTracker] = getattr(st, kind)
  return method(arg)

def evaluate(st: ShapeTracker) -> tuple[np.ndarray, np.ndarray]:
  """(buffer index, valid) of every element of st.shape, evaluated with numpy."""
  idxs = index_variables(st.shape)
  idx, valid = st.expr_idxs(idxs)
  grids = np.indices(st.shape, dtype=np.int64) if st.shape else np.zeros((0,), dtype=np.int64)
  env = {v.expr: grids[axis] for axis, v in enumerate(idxs) if isinstance(v, Variable)}
  def run(node: Node) -> np.ndarray: return np.broadcast_to(np.asarray(eval(node.render(NUMPY_OPS), {}, env), dtype=np.int64), st.shape)
  return run(idx), run(valid).astype(bool)

def check(st: ShapeTracker, expected: np.ndarray, buffer_size: int, context: str) -> None:
  assert st.shape == expected.shape, f"{context}: shape {st.shape} != numpy {expected.shape}"
  idx, valid = evaluate(st)
  assert np.array_equal(valid, expected != PAD), f"{context}: validity differs\n{valid.astype(int)}\nnumpy:\n{expected}"
  assert np.all((idx[valid] >= 0) & (idx[valid] < buffer_size)), f"{context}: valid index out of the buffer: {idx[valid]}"
  assert np.array_equal(idx[valid], expected[valid]), f"{context}: index differs\n{np.where(valid, idx, PAD)}\nnumpy:\n{expected}"
  assert all(0 <= i < st.real_size() for i in idx[valid].tolist()) and st.real_size() <= buffer_size, f"{context}: real_size {st.real_size()}"
  for axis, stride in enumerate(st.real_strides()):  # a stride that is not None must be the exact step of the index along the axis
    if stride is not None and st.shape[axis] > 1:
      assert np.all(np.diff(idx, axis=axis) == stride), f"{context}: real_strides {st.real_strides()} wrong on axis {axis}"

def check_points(st: ShapeTracker, array: np.ndarray, rng: random.Random, count: int, context: str) -> None:
  """The tracker's index and validity at `count` random elements, evaluated by sym_infer (a bound Variable at its value), against numpy."""
  idx_node, valid_node = st.expr_idxs()
  for _ in range(count):
    point = tuple(rng.randrange(size) for size in array.shape)
    env = {v: i for v, i in zip(index_variables(st.shape), point) if isinstance(v, Variable)}
    assert bool(sym_infer(valid_node, env)) == (array[point] != PAD), f"{context} at {point}"
    if array[point] != PAD: assert sym_infer(idx_node, env) == array[point], f"{context} at {point}"

def test_shapetracker_fuzz():
  rng = random.Random(0)
  merged_views = 0
  for case in range(getenv("SHAPE_FUZZ_COUNT", 400)):
    shape = tuple(rng.randint(1, 6) for _ in range(rng.randint(1, 4)))
    base = np.arange(prod(shape), dtype=np.int64)
    array, st, ops = base.reshape(shape), ShapeTracker.from_shape(shape), []
    for _ in range(rng.randint(1, 8)):
      op = random_op(rng, st.shape)
      if (new_array := apply_numpy(array, op)).size > MAX_ELEMENTS: continue
      array, st = new_array, apply_tracker(st, op)
      ops.append(op)
    context = f"case {case}: shape {shape} ops {ops} -> {st}"
    check(st, array, base.size, context)
    simplified = st.simplify()
    merged_views += len(st.views) - len(simplified.views)
    check(simplified, array, base.size, f"simplified {simplified} of {context}")
    # split the ops in two and compose the halves with +: same answers
    split = rng.randint(0, len(ops))
    first = ShapeTracker.from_shape(shape)
    for op in ops[:split]: first = apply_tracker(first, op)
    second = ShapeTracker.from_shape(first.shape)
    for op in ops[split:]: second = apply_tracker(second, op)
    check(first + second, array, base.size, f"{first} + {second} of {context}")
    check_points(st, array, rng, 3, context)  # sym_infer agrees with the vectorised evaluation on a few elements
  assert merged_views > 0, "simplify() never merged a view: the fuzzer isn't exercising View.__add__"

def test_shapetracker_fuzz_symbolic():
  """Movement ops on a view with a symbolic dim (a shrink to a bound Variable, n): its index expressions, evaluated with n's value,
  and the tracker with n set to its value, give numpy's elements. The ops keep n a dim of its own, as symbolic views do; a reshape
  that one view cannot express raises NotImplementedError (a concrete one stacks a second view) and is left out."""
  rng, refused, applied = random.Random(1), 0, 0
  for case in range(getenv("SHAPE_FUZZ_COUNT", 400) // 2):
    shape = tuple(rng.randint(1, 5) for _ in range(rng.randint(1, 3)))
    axis, most = rng.randrange(len(shape)), rng.randint(2, 6)
    n = Variable("n", 1, most).bind(value := rng.randint(1, most))
    full = shape[:axis] + (most,) + shape[axis + 1:]
    base = np.arange(prod(full), dtype=np.int64)
    array = base.reshape(full)[tuple(slice(0, value) if a == axis else slice(None) for a in range(len(full)))]
    st, ops = ShapeTracker.from_shape(full).shrink(tuple((0, n) if a == axis else (0, s) for a, s in enumerate(full))), []
    for _ in range(rng.randint(1, 6)):
      at, kind = [isinstance(size, int) for size in st.shape].index(False), rng.choice(["reshape", "permute", "expand", "pad", "shrink"])
      concrete = [size for size in st.shape if isinstance(size, int)]
      if kind == "reshape": arg: Any = random_factorization(rng, prod(concrete[:at])) + (n,) + random_factorization(rng, prod(concrete[at:]))
      elif kind == "permute": arg = tuple(rng.sample(range(len(st.shape)), len(st.shape)))
      elif kind == "expand": arg = tuple(rng.randint(1, 3) if size == 1 else size for size in st.shape)
      elif kind == "pad": arg = tuple((0, 0) if not isinstance(size, int) else (rng.randint(0, 2), rng.randint(0, 1)) for size in st.shape)
      else: arg = tuple((0, size) if not isinstance(size, int) else (b := rng.randint(0, size - 1), rng.randint(b + 1, size)) for size in st.shape)
      bound_arg = arg if kind in ("permute", "pad") else tuple(value if x == n else x for x in arg) if kind != "shrink" else \
        tuple((0, value) if x == (0, n) else x for x in arg)
      try: st, array = apply_tracker(st, (kind, arg)), apply_numpy(array, (kind, bound_arg))
      except NotImplementedError:
        refused += 1
        continue
      applied += 1
      ops.append((kind, arg))
    context = f"case {case}: {full} shrunk to n={value} along {axis}, ops {ops} -> {st}"
    check(st.bound(), array, base.size, context)
    check_points(st, array, rng, 4, context)  # the symbolic expressions, n evaluated at its value
  assert refused < applied // 10, f"{refused} ops refused, {applied} applied"
