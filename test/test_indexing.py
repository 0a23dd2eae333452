"""Indexing against PyTorch (numpy where torch has no negative steps): Tensor and list indices mixed with ints, slices, None and
Ellipsis, gather, and __setitem__, forward and backward, on contiguous and non-contiguous inputs; kernel counts for the one-hot
contraction; the documented differences from torch (boolean masks are refused; with CHECK_INDEX=0 out-of-range index values read 0
instead of raising: the checks themselves are tested in test_index_checks.py)."""
from __future__ import annotations
import numpy as np
import pytest
import torch
from tinyc import Context, GlobalCounters, Tensor, dtypes
from helpers import TORCH_DTYPE, random_array

DATA = random_array((3, 4, 5, 6), dtypes.float32, seed=1)
I, J, K = [2, 0, -1], [[1, 3], [0, -2]], [[1], [-2]]  # index values, negatives included; K (2, 1) broadcasts with I (3,)

def to_tinyc(index):
  """The same index for tinyc: a list marks a Tensor index (a tuple stays a tuple)."""
  if isinstance(index, tuple): return tuple(to_tinyc(i) for i in index)
  return Tensor(np.array(index, dtype=np.int32)) if isinstance(index, list) else index
def to_torch(index):
  if isinstance(index, tuple): return tuple(to_torch(i) for i in index)
  return torch.tensor(index, dtype=torch.int64) if isinstance(index, list) else index
def to_numpy(index):
  if isinstance(index, tuple): return tuple(to_numpy(i) for i in index)
  return np.array(index) if isinstance(index, list) else index

# (index, base shape): each is checked on a contiguous base and a permuted + flipped one
TENSOR_INDICES = [
  (I, (3, 4)), ([1], (3, 4)), ([[0, 2], [1, 1]], (3, 4)), ([], (3, 4)), ((slice(None), I), (3, 4)), ((I, I), (3, 4)), ((I, 1), (3, 4)),
  ((I, [[1], [2]]), (3, 4)), ((None, I, None), (3, 4)), ((Ellipsis, [0, 3, 3]), (3, 4)),
  ((0, slice(None), I), (4, 5, 6)), ((I, 0, I), (4, 5, 6)), ((I, slice(None), 0), (4, 5, 6)), ((slice(None), I, 0), (4, 5, 6)),
  ((I, None, I), (4, 5, 6)), ((None, I, I), (4, 5, 6)), ((I, Ellipsis, I), (4, 5, 6)), ((1, I, 2), (4, 5, 6)), ((slice(1, 4), J), (4, 5, 6)),
  ((J, slice(1, None, 2), [[1], [2]]), (4, 5, 6)), ((slice(None, None, 2), J, J), (4, 5, 6)), ((I, slice(0, 0)), (4, 5, 6)),
  ((slice(None), K, slice(None), I), (3, 4, 5, 6)), ((slice(None), [[0], [2]], [1, 3], slice(1, 3)), (3, 4, 5, 6)),
  ((Ellipsis, [1, -1], slice(None, None, 3)), (3, 4, 5, 6)), ((1, [0, 2], 2, [5, 4]), (3, 4, 5, 6)), ((K, None, 1, Ellipsis, I), (4, 4, 5, 6)),
]

@pytest.mark.parametrize("index, shape", TENSOR_INDICES, ids=lambda v: str(v).replace(" ", ""))
def test_getitem_tensor_index(index, shape):
  data = DATA[tuple(slice(0, s) for s in shape)] if len(shape) == 4 else random_array(shape, seed=2)
  permuted = tuple(range(len(shape)))[::-1]
  for base, base_torch in [(Tensor(data), torch.tensor(data)),
                           (Tensor(np.ascontiguousarray(data.transpose(permuted))).permute(permuted).flip(0), torch.tensor(data).flip(0))]:
    got, want = base[to_tinyc(index)], base_torch[to_torch(index)]
    assert got.shape == tuple(want.shape) and got.dtype == dtypes.float32, f"x[{index}]: {got.shape} vs torch {tuple(want.shape)}"
    np.testing.assert_equal(got.numpy(), want.numpy(), err_msg=f"x[{index}]")

def test_getitem_list_and_numpy_indices():
  x, tx = Tensor(DATA), torch.tensor(DATA)
  for index in [[0, 2], (slice(None), [1, -1, 0]), (1, [0, 1], Ellipsis, [2, 3]), ([[0, 1], [2, 2]], 0)]:
    np.testing.assert_equal(x[index].numpy(), tx[to_torch(index)].numpy(), err_msg=str(index))
  np.testing.assert_equal(x[np.array([2, 0])].numpy(), DATA[np.array([2, 0])])
  np.testing.assert_equal(x[[]].numpy(), DATA[np.array([], dtype=np.int64)])
  # a nested list is one index array, as numpy reads it (torch 2.13 still reads a non-tuple list of lists as a tuple, with a warning)
  np.testing.assert_equal(x[[[0, 1], [2, 2]]].numpy(), DATA[np.array([[0, 1], [2, 2]])])

def test_getitem_tensor_index_negative_steps():
  """numpy is the reference here (torch has no negative steps); ints sit where numpy's and torch's rules agree."""
  x = Tensor(DATA)
  for index in [(slice(None, None, -1), [1, 0, -1]), ([1, 2], slice(None, None, -2)), (slice(3, 0, -2), [0, 2], slice(None, None, -3)),
                (Ellipsis, [[3], [0]], slice(4, None, -1), [1, 2]), ([0, 1], [3, 1], slice(None, None, -1), 2)]:
    got, want = x[to_tinyc(index)], DATA[to_numpy(index)]
    assert got.shape == want.shape, f"x[{index}]: {got.shape} vs numpy {want.shape}"
    np.testing.assert_equal(got.numpy(), want, err_msg=str(index))

def test_getitem_zero_d():
  x = Tensor(DATA)
  for index in [(Tensor(1), Tensor(2), Tensor(3), Tensor(-1)), (1, Tensor(2), 3, 4), (Tensor(0),)]:
    got, want = x[index], torch.tensor(DATA)[tuple(torch.tensor(i.item()) if isinstance(i, Tensor) else i for i in index)]
    assert got.shape == tuple(want.shape)
    np.testing.assert_equal(got.numpy(), want.numpy())
  assert Tensor([4.0, 5.0])[Tensor(1)].shape == () and Tensor([4.0, 5.0])[Tensor(1)].item() == 5.0
  assert Tensor(3.0)[None][Tensor([0, 0])].tolist() == [3.0, 3.0]

@pytest.mark.parametrize("dtype", [dtypes.int8, dtypes.bool, dtypes.float16, dtypes.int64], ids=str)
def test_getitem_tensor_index_dtypes(dtype):
  data = random_array((4, 5), dtype, -100, 100)
  for index_dtype in [dtypes.int8, dtypes.uint8, dtypes.int32, dtypes.int64]:
    index = np.array([3, 0, 1] if dtypes.is_unsigned(index_dtype) else [3, -4, -1])
    got = Tensor(data, dtype=dtype)[:, Tensor(index, dtype=index_dtype)]
    want = torch.tensor(data).to(TORCH_DTYPE[dtype])[:, torch.tensor(index)]
    assert got.dtype == dtype
    np.testing.assert_equal(got.numpy(), want.float().numpy() if dtype == dtypes.float16 else want.numpy())

def test_getitem_tensor_index_is_not_poisoned_by_other_elements():
  """The contraction selects with where, so inf and nan elsewhere in the tensor do not leak into picked elements (0 * inf = nan)."""
  x = Tensor([[1.0, np.inf], [np.nan, -np.inf], [2.0, 3.0]])
  np.testing.assert_equal(x[Tensor([2, 0])].numpy(), [[2.0, 3.0], [1.0, np.inf]])
  np.testing.assert_equal(x[:, Tensor([0])].numpy(), [[1.0], [np.nan], [2.0]])

def test_getitem_out_of_range_reads_zero_without_checks():
  """torch raises for an out-of-range index value, and so does tinyc (test_index_checks.py); with CHECK_INDEX=0 they read 0."""
  x = Tensor([[1.0, 2.0], [3.0, 4.0], [5.0, 6.0]])
  with Context(CHECK_INDEX=0):
    assert x[Tensor([0, 3, -4, 100, -1])].tolist() == [[1.0, 2.0], [0.0, 0.0], [0.0, 0.0], [0.0, 0.0], [5.0, 6.0]]
    assert x[Tensor([1, 7]), Tensor([2, 0])].tolist() == [0.0, 0.0]
    assert x.gather(Tensor([[2], [-1], [0]]), 1).tolist() == [[0.0], [0.0], [5.0]]

def test_getitem_tensor_index_errors():
  x = Tensor.ones(3, 4)
  with pytest.raises(TypeError, match="data-dependent"): x[Tensor([True, False, True])]
  with pytest.raises(TypeError, match="data-dependent"): x[[True, False, True]]
  with pytest.raises(TypeError, match="data-dependent"): x[x > 0]
  with pytest.raises(IndexError, match="tensors used as indices must be long, int, byte or bool tensors"): x[Tensor([1.0])]
  with pytest.raises(IndexError, match="valid indices"): x[[0.5, 1.5]]
  with pytest.raises(IndexError, match="valid indices"): x[1.5]
  with pytest.raises(IndexError, match="valid indices"): x["a"]
  with pytest.raises(IndexError, match="a list holding tensors is not an index.*write a tuple"): x[[Tensor([0]), 1]]
  with pytest.raises(IndexError, match="a list holding tensors is not an index"): x[0, [Tensor(1), Tensor(0)]]
  with pytest.raises(IndexError, match=r"shape mismatch: indexing tensors could not be broadcast together with shapes \[2\], \[3\]"):
    x[Tensor([0, 1]), Tensor([0, 1, 2])]
  with pytest.raises(IndexError, match="too many indices for tensor of dimension 2"): x[Tensor([0]), Tensor([0]), Tensor([0])]
  with pytest.raises(IndexError, match="single ellipsis"): x[..., Tensor([0]), ...]
  with pytest.raises(IndexError, match="index 3 is out of bounds for dimension 0 with size 3"): x[3, Tensor([0])]

# ***** gather *****

GATHER = [((4, 5), (2, 5), 0), ((4, 5), (4, 3), 1), ((4, 5), (3, 2), -1), ((3, 4, 5), (3, 2, 5), 1), ((3, 4, 5), (2, 4, 7), 2),
          ((3, 4, 5), (1, 1, 1), 0), ((2, 3, 4, 5), (2, 3, 4, 2), 3), ((2, 3, 4, 5), (1, 6, 2, 3), 1), ((5,), (8,), 0), ((4, 0), (2, 0), 0)]

@pytest.mark.parametrize("shape, index_shape, dim", GATHER, ids=str)
def test_gather(shape, index_shape, dim):
  data = random_array(shape, seed=3)
  index = np.random.default_rng(4).integers(0, shape[dim], size=index_shape) if shape[dim] else np.zeros(index_shape, np.int64)
  want = torch.tensor(data).gather(dim, torch.tensor(index))
  got = Tensor(data).gather(Tensor(index), dim)
  assert got.shape == tuple(want.shape)
  np.testing.assert_equal(got.numpy(), want.numpy())
  # non-contiguous self and index, and int32 / int8 index dtypes
  permuted = tuple(range(len(shape)))[::-1]
  base = Tensor(np.ascontiguousarray(data.transpose(permuted))).permute(permuted).flip(0)
  flipped = Tensor(np.ascontiguousarray(index[::-1]), dtype=dtypes.int8).flip(0)
  np.testing.assert_equal(base.gather(flipped, dim).numpy(), torch.tensor(data).flip(0).gather(dim, torch.tensor(index)).numpy())

def test_gather_dtypes_and_0d():
  index = torch.tensor([[1, 0], [2, 2]])
  for dtype in [dtypes.int8, dtypes.bool, dtypes.float16, dtypes.int64]:
    data = random_array((3, 3), dtype, -50, 50)
    got, want = Tensor(data, dtype=dtype).gather(Tensor(index.numpy()), 1), torch.tensor(data).to(TORCH_DTYPE[dtype]).gather(1, index)
    assert got.dtype == dtype
    np.testing.assert_equal(got.numpy(), want.float().numpy() if dtype == dtypes.float16 else want.numpy())
  assert Tensor(2.5).gather(Tensor(0), 0).shape == () and Tensor(2.5).gather(Tensor(0), -1).item() == 2.5

def test_gather_takes_torch_and_tinygrad_argument_orders():
  data, index = random_array((3, 4), seed=2), np.array([[0, 3], [2, 2], [1, 0]])
  want = torch.tensor(data).gather(1, torch.tensor(index)).numpy()
  x, idx = Tensor(data), Tensor(index)
  for got in [x.gather(1, idx), x.gather(idx, 1), x.gather(dim=1, index=idx), x.gather(idx, dim=1), x.gather(1, index=idx),
              x.gather(idx=idx, dim=1), x.gather(-1, idx)]:
    np.testing.assert_equal(got.numpy(), want)
  with pytest.raises(TypeError, match="a dim and an index"): x.gather(idx)
  with pytest.raises(TypeError, match="a dim and an index"): x.gather(1, idx, dim=1)

# a tuple inside an index is a list of ints, as in torch and numpy (a list is one index array, as numpy reads it)
SEQUENCE_INDICES = {
  "tuple_item": lambda i: ((1, 0), i), "nested_tuple_item": lambda i: (((0,),),), "tuple_item_with_none": lambda i: (1, (2, 1), None, i),
  "tensor_and_tuple": lambda i: (i, (1, 1)), "tensor_and_list": lambda i: (i, [1, 1]), "tuples_around_a_tensor": lambda i: ((0, 1), i, (3, 2)),
}

@pytest.mark.parametrize("name", SEQUENCE_INDICES)
def test_getitem_sequences_like_torch(name):
  data = random_array((2, 3, 4), seed=6)
  index = SEQUENCE_INDICES[name]
  want = torch.tensor(data)[index(torch.tensor([1, 0]))]
  got = Tensor(data)[index(Tensor([1, 0]))]
  assert got.shape == tuple(want.shape)
  np.testing.assert_equal(got.numpy(), want.numpy())

def test_gather_errors():
  x = Tensor.ones(3, 4)
  with pytest.raises(IndexError, match=r"Dimension out of range \(expected to be in range of \[-2, 1\], but got 2\)"): x.gather(Tensor([[0]]), 2)
  with pytest.raises(IndexError, match=r"Dimension out of range \(expected to be in range of \[-2, 1\], but got -3\)"): x.gather(Tensor([[0]]), -3)
  with pytest.raises(RuntimeError, match="Expected an integer dtype for index, got dtypes.float32"): x.gather(Tensor([[0.0]]), 0)
  with pytest.raises(RuntimeError, match="integer dtype"): x.gather(Tensor([[True]]), 0)
  with pytest.raises(TypeError, match="index must be a Tensor"): x.gather([[0]], 0)
  with pytest.raises(RuntimeError, match="Index tensor must have the same number of dimensions as input tensor"): x.gather(Tensor([0]), 0)
  with pytest.raises(RuntimeError, match=r"Size does not match at dimension 1 expected index \[1, 5\] to be no larger than self \[3, 4\] apart from "
                                         r"dimension 0"): x.gather(Tensor([[0, 1, 2, 0, 1]]), 0)

# ***** backward *****

def grads(fn, shape, seed=5):
  """d(weighted sum of fn(x))/dx in tinyc and torch; the weights make every output element count differently."""
  data = random_array(shape, seed=seed)
  x, tx = Tensor(data, requires_grad=True), torch.tensor(data, requires_grad=True)
  out_t = fn(tx, torch)
  weights = random_array(tuple(out_t.shape), seed=seed + 1)
  (out_t * torch.tensor(weights)).sum().backward()
  out = fn(x, Tensor)
  (out * Tensor(weights)).sum().backward()
  assert x.grad is not None and tx.grad is not None
  return x.grad.numpy(), tx.grad.numpy()

@pytest.mark.parametrize("index", [[1, 1, 0, -1], (slice(None), [[2, 2], [0, 3]]), (slice(1, None), 0, [1, 1, 4]), ([0, 2], None, [1, 1], [4, 4]),
                                   ([2, 0], slice(None), [1, 3])], ids=str)
def test_getitem_tensor_index_backward(index):
  """Repeated index values accumulate their gradients, as in torch."""
  shape = (3, 4, 5, 6)[:sum(1 for i in (index if isinstance(index, tuple) else (index,)) if i is not None) + 1]
  make = lambda tensor: (lambda i: tensor(i) if isinstance(i, list) else i)
  got, want = grads(lambda x, lib: (x * 2)[tuple(make(lib.tensor if lib is torch else Tensor)(i) for i in (index if isinstance(index, tuple)
                                                                                                             else (index,)))], shape)
  np.testing.assert_allclose(got, want, atol=1e-6)

@pytest.mark.parametrize("shape, index_shape, dim", [((4, 5), (6, 5), 0), ((3, 4, 5), (3, 2, 5), 1), ((3, 4, 5), (2, 3, 7), -1)], ids=str)
def test_gather_backward(shape, index_shape, dim):
  index = np.random.default_rng(6).integers(0, shape[dim], size=index_shape)
  got, want = grads(lambda x, lib: x.exp().gather(dim, torch.tensor(index)) if lib is torch else x.exp().gather(Tensor(index), dim), shape)
  np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)

# ***** kernels *****

@pytest.fixture
def no_index_checks():
  with Context(CHECK_INDEX=0): yield  # each index check is one more kernel: test_index_checks.py counts those

def test_tensor_index_is_one_kernel(no_index_checks):
  x, idx, idx2 = Tensor(DATA).realize(), Tensor([[2, 0], [1, 1]]).realize(), Tensor([3, -1]).realize()
  for fn in [lambda: x[idx], lambda: x[:, idx2], lambda: x[idx, idx2], lambda: x[1:, idx2, ::2, 0], lambda: x.gather(idx.reshape(1, 2, 2, 1), 1),
             lambda: x[idx] * 2 + 1]:
    GlobalCounters.reset()
    fn().realize()
    assert GlobalCounters.kernel_count == 1, f"{GlobalCounters.kernel_count} kernels"

# ***** setitem *****

SET_INDICES = [0, -1, slice(1, 3), slice(None, None, 2), slice(None, None, -1), slice(3, 0, -2), (1, 2), (slice(None), -2),
               (Ellipsis, slice(None, None, -3)), (None, 1, slice(4, None, -2)), (slice(0, 0),), (slice(1, None, 3), slice(None, None, -2)),
               (Ellipsis, 0, None), (slice(None, None, -1), 3, slice(None, None, 2)), ()]

@pytest.mark.parametrize("realized", [True, False], ids=["realized", "lazy"])
@pytest.mark.parametrize("index", SET_INDICES, ids=str)
def test_setitem_basic(index, realized):
  data = random_array((4, 5, 6), seed=7)
  want_scalar, want_tensor = data.copy(), data.copy()
  want_scalar[index] = 9.0
  value = random_array(want_tensor[index].shape, seed=8)
  want_tensor[index] = value
  for want, value in [(want_scalar, 9.0), (want_tensor, Tensor(value))]:
    x = Tensor(data).realize() if realized else Tensor(data) * 1
    buffer = x.lazydata.base.realized
    x[index] = value
    x.realize()
    if realized: assert x.lazydata.base.realized is buffer, "a realized tensor is written in place"
    np.testing.assert_equal(x.numpy(), want, err_msg=f"x[{index}] = ...")

def test_setitem_broadcast_and_cast():
  data = random_array((4, 5, 6), dtypes.int32, -9, 9)
  x, want = Tensor(data).realize(), data.copy()
  for index, value in [((slice(None), 1), [1, 2, 3, 4, 5, 6]), ((slice(None, None, -2), slice(1, 3)), [[10], [20]]),
                       ((Ellipsis, 0), [[[7]]]), (1, 2.75), (2, True), ((None, slice(3, None)), [[[[-1]]]]),
                       ((slice(None), slice(None, None, -1), 2), [1.5, -2.5, 3.9, 4.0, 5.0])]:
    x[index] = Tensor(value) if isinstance(value, list) else value
    want[index] = np.array(value).astype(np.int32) if isinstance(value, list) else int(value)
    np.testing.assert_equal(x.numpy(), want, err_msg=f"x[{index}] = {value}")
  assert x.dtype == dtypes.int32

def test_setitem_realized_in_place_chain():
  """Several writes before one realize; a write whose value reads the tensor itself (shifted); sharing the buffer with a view."""
  data = np.arange(10, dtype=np.float32)
  x, want = Tensor(data).realize(), data.copy()
  buffer = x.lazydata.base.realized
  x[1:] = x[:-1]
  want[1:] = want[:-1].copy()
  x[::3] = x[::3] * 10
  want[::3] = want[::3] * 10
  x[-1] = 0
  want[-1] = 0
  np.testing.assert_equal(x.numpy(), want)
  assert x.lazydata.base.realized is buffer

def test_setitem_tensor_index():
  data = random_array((3, 4, 5), seed=9)
  for index, value in [([0, 2], 1.0), ((slice(None), [3, 1]), [[1.0], [2.0]]), (([0, 2], slice(1, 3)), [[1.0], [2.0]]), (([1, -1], 0, [4, 0]), 5.0),
                       ((0, slice(None), [[0, 1], [2, 3]]), 7.0), ((slice(None, None, 2), [0, 0, 0]), [[1.0], [2.0], [3.0]])]:
    for realized in [True, False]:
      x = Tensor(data).realize() if realized else Tensor(data) + 0
      buffer = x.lazydata.base.realized
      want = torch.tensor(data)
      x[to_tinyc(index)] = Tensor(value) if isinstance(value, list) else value
      want[to_torch(index)] = torch.tensor(value) if isinstance(value, list) else value  # repeated indices: last write wins on torch's CPU
      np.testing.assert_equal(x.numpy(), want.numpy(), err_msg=f"x[{index}] = {value}")
      if realized: assert x.lazydata.base.realized is buffer

def test_setitem_grad():
  # a leaf that requires grad refuses, as in torch; under no_grad (an optimizer step) the write goes in place
  w = Tensor([1.0, 2.0, 3.0], requires_grad=True)
  with pytest.raises(RuntimeError, match="a view of a leaf Variable that requires grad is being used in an in-place operation"): w[0] = 5.0
  Tensor.no_grad = True
  try: w[0] = 5.0
  finally: Tensor.no_grad = False
  assert w.tolist() == [5.0, 2.0, 3.0]
  # the value's gradient flows, and a non-leaf's gradient goes to the elements not overwritten
  data, value = random_array((4, 5), seed=10), random_array((2, 5), seed=11)
  a, v = Tensor(data, requires_grad=True), Tensor(value, requires_grad=True)
  ta, tv = torch.tensor(data, requires_grad=True), torch.tensor(value, requires_grad=True)
  for x, y, lib in [(a, v, Tensor), (ta, tv, torch)]:
    h = x * 3
    if lib is Tensor: h[::-2] = (y * 2)[::-1]
    else: h[torch.tensor([3, 1])] = (y * 2).flip(0)  # torch has no negative steps: the same rows
    h[[0, 1], [4, 4]] = 0.5
    (h * h).sum().backward()
  assert a.grad is not None and v.grad is not None
  np.testing.assert_allclose(a.grad.numpy(), ta.grad.numpy(), rtol=1e-5)
  np.testing.assert_allclose(v.grad.numpy(), tv.grad.numpy(), rtol=1e-5)
  # writing a grad-requiring value into a plain tensor makes it part of the graph
  target, v2 = Tensor.zeros(3), Tensor([4.0], requires_grad=True)
  target[1:2] = v2
  (target * Tensor([1.0, 2.0, 3.0])).sum().backward()
  assert v2.grad is not None and v2.grad.tolist() == [2.0]

def test_setitem_errors():
  x = Tensor.zeros(4, 5).contiguous().realize()
  with pytest.raises(RuntimeError, match=r"shape mismatch: value tensor of shape \[3, 5\] cannot be broadcast to indexing result of shape \[2, 5\]"):
    x[0:2] = Tensor.ones(3, 5)
  with pytest.raises(RuntimeError, match="shape mismatch"): x[0] = Tensor.ones(5, 1)
  with pytest.raises(RuntimeError, match="shape mismatch"): x[[0, 1]] = Tensor.ones(3)
  with pytest.raises(IndexError, match="index 9 is out of bounds for dimension 0 with size 4"): x[9] = 1.0
  with pytest.raises(IndexError, match="too many indices"): x[0, 0, 0] = 1.0
  with pytest.raises(TypeError, match="can't assign a str"): x[0] = "a"
  with pytest.raises(TypeError, match="data-dependent"): x[x > 0] = 1.0
  with pytest.raises(ValueError, match="step"): x[::0] = 1.0
  x[0:2] = Tensor.ones(1, 1, 5)  # leading size-1 dims of the value are dropped, as in torch
  x[[]] = 3.0  # nothing to write
  assert x.numpy().sum() == 10.0
