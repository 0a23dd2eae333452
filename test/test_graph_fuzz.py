"""Fuzz the scheduler, linearizer and LLVM renderer together: random programs of elementwise ops, reductions and movement
ops on small tensors, realized by tinyc and compared with numpy. GRAPH_FUZZ_COUNT=500 for a longer run."""
import random
import numpy as np
import pytest
from tinyc import Tensor
from tinyc.helpers import getenv

def random_factorization(size, rng):
  dims = []
  for factor in (2, 3, 5):
    while size % factor == 0 and rng.random() < 0.6:
      dims.append(factor)
      size //= factor
  dims.append(size)
  rng.shuffle(dims)
  return tuple(dims)

def unary(rng, t, a):
  choice = rng.randrange(6)
  if choice == 0: return -t, -a
  if choice == 1: return t.relu(), np.maximum(a, 0)
  if choice == 2: return t.clip(-3, 3).exp(), np.exp(np.clip(a, -3, 3))
  if choice == 3: return (t.abs() + 1).sqrt(), np.sqrt(np.abs(a) + 1)
  if choice == 4: return t.sin(), np.sin(a)
  return t * 0.5 + 1.25, a * 0.5 + 1.25

def binary(rng, t, a, u, b):
  choice = rng.randrange(5)
  if choice == 0: return t + u, a + b
  if choice == 1: return t * u, a * b
  if choice == 2: return t - u, a - b
  if choice == 3: return t.maximum(u), np.maximum(a, b)
  return (t < u).where(t, u * 2), np.where(a < b, a, b * 2)

def reduce(rng, t, a):
  axis, keepdim = rng.randrange(a.ndim), rng.random() < 0.5
  if rng.random() < 0.5: return t.sum(axis, keepdim), a.sum(axis, keepdims=keepdim)
  return t.max(axis, keepdim), a.max(axis, keepdims=keepdim)

def row_read(rng, t, a):
  """A reduce read back along the axis it reduced (softmax's pattern): several reduces, and outputs that are rows, in one kernel."""
  axis = rng.randrange(a.ndim)
  if rng.random() < 0.5: return t - t.max(axis, keepdim=True), a - a.max(axis, keepdims=True)
  return t * t.sum(axis, keepdim=True), a * a.sum(axis, keepdims=True)

def movement(rng, t, a):
  choice = rng.randrange(6)
  if choice == 0:
    order = list(range(a.ndim))
    rng.shuffle(order)
    return t.permute(order), a.transpose(order)
  if choice == 1:
    shape = random_factorization(a.size, rng)
    return t.reshape(shape), a.reshape(shape)
  if choice == 2:
    axis = rng.randrange(a.ndim)
    return t.flip(axis), np.flip(a, axis)
  if choice == 3:
    padding = tuple((rng.randrange(2), rng.randrange(2)) for _ in a.shape)
    return t.pad(padding), np.pad(a, padding)
  if choice == 4:
    index = tuple(slice(rng.randrange(s), None, rng.choice([1, 2, -1])) for s in a.shape)
    return t[index], a[index]
  axis = rng.randrange(a.ndim + 1)
  repeated = 1 + rng.randrange(3)
  t, a = t.unsqueeze(axis), np.expand_dims(a, axis)
  shape = a.shape[:axis] + (repeated,) + a.shape[axis + 1:]
  return t.expand(shape), np.broadcast_to(a, shape)

def random_program(seed):
  """A random program's outputs, each (tensor, numpy's result), unrealized."""
  rng = random.Random(seed)
  shape = tuple(rng.randrange(1, 6) for _ in range(rng.randrange(1, 4)))
  arrays = [np.random.default_rng(seed + i).standard_normal(shape).astype(np.float32) for i in range(2)]
  pool = [(Tensor(a), a) for a in arrays]
  for _ in range(rng.randrange(2, 9)):
    t, a = rng.choice(pool)
    kind = rng.random()
    if kind < 0.25: t, a = unary(rng, t, a)
    elif kind < 0.5:
      same = [(u, b) for u, b in pool if b.shape == a.shape or b.ndim == 0]
      u, b = rng.choice(same)
      t, a = binary(rng, t, a, u, b)
    elif kind < 0.6 and a.ndim > 0 and a.size > 0: t, a = reduce(rng, t, a)
    elif kind < 0.7 and a.ndim > 0 and a.size > 0: t, a = row_read(rng, t, a)
    elif a.ndim > 0 and a.size > 0: t, a = movement(rng, t, a)
    pool.append((t, a))
  return rng.sample(pool[2:], min(len(pool) - 2, 3))

def run_program(seed):
  outputs = random_program(seed)
  Tensor.corealize([t for t, _ in outputs])
  for t, a in outputs:
    assert t.shape == a.shape, f"seed {seed}: shape {t.shape} vs numpy {a.shape}"
    np.testing.assert_allclose(t.numpy(), a, rtol=1e-4, atol=1e-4, err_msg=f"seed {seed}")

@pytest.mark.parametrize("seed", range(getenv("GRAPH_FUZZ_COUNT", 60)))
def test_random_program_matches_numpy(seed): run_program(seed)
