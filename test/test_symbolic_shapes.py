"""Symbolic shapes: a dim that is a Variable bound to a value computes what the concrete shape computes, with one program for every
value (the value is a kernel argument), and TinyJit replays a capture across values."""
import numpy as np
import pytest
from tinyc import Device, Tensor, Variable
from tinyc.codegen.heuristic import hand_coded_optimizations
from tinyc.codegen.kernel import Kernel, KernelOptError, Opt, OptOps
from tinyc.jit import TinyJit
from tinyc.ops import unbind_ast
from tinyc.schedule import create_schedule

VALUES = (1, 2, 7, 16)  # the Variable's min and max, and values between
rng = np.random.default_rng(0)

def programs() -> int: return len(Device[Device.DEFAULT].programs)

def compiled_once(compute, reference) -> None:
  """compute(bound Variable) against reference(k) for every value, and no new program after the first value."""
  n = Variable("n", 1, 16)
  np.testing.assert_allclose(compute(n.bind(VALUES[0])).numpy(), reference(VALUES[0]), rtol=1e-5, atol=1e-5)
  before = programs()
  for k in VALUES[1:]: np.testing.assert_allclose(compute(n.bind(k)).numpy(), reference(k), rtol=1e-5, atol=1e-5, err_msg=f"n={k}")
  assert programs() == before, "a new value of the Variable compiled new programs"

def test_elementwise_and_reduces():
  x = rng.standard_normal((16, 5)).astype(np.float32)
  t = Tensor(x).realize()
  def rows(n: Variable) -> Tensor: return t.shrink(((0, n), None))
  compiled_once(lambda n: rows(n) * 2 + rows(n).exp(), lambda k: x[:k] * 2 + np.exp(x[:k]))
  compiled_once(lambda n: rows(n).sum(0), lambda k: x[:k].sum(0))  # a reduce over the symbolic dim: a loop to n
  compiled_once(lambda n: rows(n).max(1), lambda k: x[:k].max(1))  # a reduce along the other
  compiled_once(lambda n: rows(n).T.reshape(1, 5, n, 1).sum((0, 3)), lambda k: x[:k].T)

def test_matmul_and_softmax_along_the_symbolic_dim():
  a, b = rng.standard_normal((3, 16)).astype(np.float32), rng.standard_normal((16, 4)).astype(np.float32)
  ta, tb = Tensor(a).realize(), Tensor(b).realize()
  compiled_once(lambda n: ta.shrink((None, (0, n))) @ tb.shrink(((0, n), None)), lambda k: a[:, :k] @ b[:k])
  def softmax(z: np.ndarray) -> np.ndarray: return np.exp(z - z.max(-1, keepdims=True)) / np.exp(z - z.max(-1, keepdims=True)).sum(-1, keepdims=True)
  compiled_once(lambda n: ta.shrink((None, (0, n))).softmax(-1), lambda k: softmax(a[:, :k]))

def test_attention_over_a_kv_cache():
  heads, context, dim = 2, 16, 8
  keys, values, query = (rng.standard_normal(shape).astype(np.float32) for shape in ((heads, context, dim), (heads, context, dim), (heads, 1, dim)))
  cache_k, cache_v, q = Tensor(keys).realize(), Tensor(values).realize(), Tensor(query).realize()
  def attention(n: Variable) -> Tensor:
    k, v = cache_k.shrink((None, (0, n), None)), cache_v.shrink((None, (0, n), None))
    return (q @ k.transpose(-2, -1) / np.sqrt(dim)).softmax(-1) @ v
  def reference(k: int) -> np.ndarray:
    scores = query @ keys[:, :k].transpose(0, 2, 1) / np.sqrt(dim)
    weights = np.exp(scores - scores.max(-1, keepdims=True))
    return weights / weights.sum(-1, keepdims=True) @ values[:, :k]
  compiled_once(attention, reference)
  compiled_once(lambda n: q.scaled_dot_product_attention(cache_k.shrink((None, (0, n), None)), cache_v.shrink((None, (0, n), None))), reference)

def test_write_at_a_symbolic_position():
  cache = Tensor.zeros(4, 3).contiguous().realize()
  position, expected = Variable("position", 0, 3), np.zeros((4, 3), np.float32)
  before = None
  for step in range(4):
    row = Tensor(np.full((1, 3), step + 1, np.float32))
    hit = Tensor.arange(4).reshape(4, 1) == Tensor(position.bind(step))  # a bound Variable as a value: a kernel argument
    cache.assign(hit.where(row.expand(4, 3), cache)).realize()
    expected[step] = step + 1
    np.testing.assert_array_equal(cache.numpy(), expected)
    if before is None: before = programs()
  assert programs() == before

def test_a_value_outside_the_range_raises():
  n = Variable("n", 1, 16)
  with pytest.raises(ValueError, match=r"cannot bind 17 to Variable n: it takes ints in \[1, 16\]"): n.bind(17)
  with pytest.raises(ValueError): n.bind(0)
  with pytest.raises(ValueError, match="do not fit"): Tensor.zeros(8, 2).shrink(((0, n.bind(4)), None))  # 16 > 8 for some values
  assert n.val is None and n.bind(3).val == 3  # binding makes a bound copy

def test_opts_refuse_the_symbolic_axis_and_the_heuristic_adds_none():
  n = Variable("n", 1, 16).bind(8)
  x = Tensor.rand(16, 32).realize().shrink(((0, n), None))
  (item,) = create_schedule([(x * 2).sum(1).lazydata])
  ast, var_vals = unbind_ast(item.ast)
  assert list(var_vals.values()) == [8] and [var.val for var in var_vals] == [None]
  kernel = Kernel(ast)
  assert hand_coded_optimizations(kernel.copy()) == []
  with pytest.raises(KernelOptError, match="symbolic"): kernel.apply_opt(Opt(OptOps.UPCAST, 0, 2))
  kernel.apply_opt(Opt(OptOps.UNROLL, 0, 4))  # the concrete reduce axis still splits

def test_tinyjit_replays_across_values():
  weights = Tensor(rng.standard_normal((16, 4)).astype(np.float32)).realize()
  @TinyJit
  def step(x: Tensor, n: Variable) -> Tensor: return (x @ weights.shrink(((0, n), None)).T.sum(0, keepdim=True).T).sum(1)
  x = rng.standard_normal((3, 16)).astype(np.float32)
  tx = Tensor(x).realize()
  length = Variable("length", 1, 16)
  for k in (5, 9, 2, 16, 1):
    sliced = tx.shrink((None, (0, length.bind(k))))
    np.testing.assert_allclose(step(sliced.contiguous().realize(), length.bind(k)).numpy(), x[:, :k] @ weights.numpy()[:k].sum(1),
                               rtol=1e-4, err_msg=f"length={k}")
  assert step.calls == 2
