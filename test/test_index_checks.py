"""Out-of-range index values raise, as in torch: x[t], x[t] = v, gather, nn.Embedding and sparse_categorical_crossentropy check
their index tensors lazily and raise where data next reaches the host (numpy/item/tolist, a TinyJit call's return); lists and
numpy indices are checked at once; CHECK_INDEX=0 skips the checks."""
from __future__ import annotations
import numpy as np
import pytest
import torch
import torch.nn.functional as tF
from tinyc import Context, GlobalCounters, Tensor, nn
from tinyc.jit import TinyJit
from tinyc import index_check
from tinyc.index_check import IndexOutOfRangeError

def torch_error(fn) -> BaseException:
  try: fn()
  except Exception as error: return error
  raise AssertionError("torch did not raise")

def embedding(ids: list[int], framework=nn) -> Tensor | torch.Tensor:
  return framework.Embedding(5, 2)(Tensor(ids) if framework is nn else torch.tensor(ids))

def crossentropy(labels: list[int], framework=nn) -> Tensor | torch.Tensor:
  logits = np.linspace(-1, 1, 3 * len(labels), dtype=np.float32).reshape(len(labels), 3)
  if framework is nn: return Tensor(logits).sparse_categorical_crossentropy(Tensor(labels))
  return tF.cross_entropy(torch.tensor(logits), torch.tensor(labels))

ARANGE = np.arange(5, dtype=np.int32)
X, TX, T = Tensor(ARANGE), torch.tensor(ARANGE), torch.tensor
# name: (tinyc result, torch's call, the bad value and the size the message must name)
BAD = {
  "getitem": (lambda: X[Tensor([1, 7])], lambda: TX[T([1, 7])], "7", "size 5"),
  "getitem_negative": (lambda: X[Tensor([-9])], lambda: TX[T([-9])], "-9", "size 5"),
  "getitem_dim1": (lambda: Tensor.ones(3, 4)[:, Tensor([[0], [4]])], lambda: torch.ones(3, 4)[:, T([[0], [4]])], "4", "size 4"),
  "getitem_second_of_two": (lambda: Tensor.ones(3, 4)[Tensor([0, 2]), Tensor([1, 6])], lambda: torch.ones(3, 4)[T([0, 2]), T([1, 6])], "6", "size 4"),
  "getitem_int64": (lambda: X[Tensor(np.array([2 ** 40]))], lambda: TX[T([2 ** 40])], str(2 ** 40), "size 5"),
  "getitem_uint8": (lambda: X[Tensor(np.array([3, 200], np.uint8))], lambda: TX[T([3, 200])], "200", "size 5"),
  "gather": (lambda: Tensor([1.0, 2.0, 3.0]).gather(Tensor([0, 5]), 0), lambda: T([1.0, 2.0, 3.0]).gather(0, T([0, 5])), "5", "size 3"),
  "gather_negative": (lambda: Tensor([[1.0, 2.0, 3.0]]).gather(Tensor([[-1]]), 1), lambda: T([[1.0, 2.0, 3.0]]).gather(1, T([[-1]])), "-1", "size 3"),
  "embedding": (lambda: embedding([0, 9]), lambda: embedding([0, 9], torch.nn), "9", "5"),
  "embedding_negative": (lambda: embedding([-1]), lambda: embedding([-1], torch.nn), "-1", "5"),
  "crossentropy": (lambda: crossentropy([0, 7]), lambda: crossentropy([0, 7], torch.nn), "7", "3 classes"),
  "crossentropy_negative": (lambda: crossentropy([0, -5]), lambda: crossentropy([0, -5], torch.nn), "-5", "3 classes"),
}
READS = {"numpy": lambda t: t.numpy(), "item": lambda t: t.sum().item(), "tolist": lambda t: t.tolist()}

@pytest.mark.parametrize("read", READS)
@pytest.mark.parametrize("case", BAD)
def test_out_of_range_raises_like_torch(case, read):
  make, torch_fn, value, size = BAD[case]
  expected = torch_error(torch_fn)
  result = make()
  with pytest.raises(type(expected)) as info: READS[read](result)
  assert isinstance(info.value, IndexError) and isinstance(info.value, IndexOutOfRangeError)
  message = str(info.value)
  assert f" {value} " in f" {message.replace(',', ' ')} " and size in message and "CHECK_INDEX=0" in message, message
  assert "test_index_checks.py" in message, f"the message names the line that made the index op: {message}"
  assert index_check.pending_count() == 0
  np.testing.assert_equal(Tensor([1, 2]).numpy(), [1, 2])  # raised once: the next read is clean

def test_host_indices_raise_at_once():
  x = Tensor(ARANGE)
  for index in ([1, 7], np.array([-6])):
    expected = torch_error(lambda index=index: torch.tensor(ARANGE)[torch.tensor(index)])
    with pytest.raises(type(expected), match="out of bounds for dimension 0 with size 5"): x[index]
  assert index_check.pending_count() == 0

def test_setitem_raises():
  x = Tensor.zeros(5).realize()
  expected = torch_error(lambda: torch.zeros(5).__setitem__(torch.tensor([7]), 1.0))
  x[Tensor([1, 7])] = 1.0
  with pytest.raises(type(expected), match="index 7 is out of bounds for dimension 0 with size 5"): x.numpy()
  with pytest.raises(type(expected), match="index 9 is out of bounds"): x[[9]] = 1.0

def test_in_range_values_and_gradients_match_torch():
  data = np.arange(12, dtype=np.float32).reshape(3, 4)
  x, tx = Tensor(data, requires_grad=True), torch.tensor(data, requires_grad=True)
  rows, columns = [2, -3, 0, -1], [[3], [-4]]
  out = x[Tensor(rows)] * 2 + x.gather(Tensor([[3, 0]] * 3), 1).sum() + x[:, Tensor(columns)].sum()
  want = tx[torch.tensor(rows)] * 2 + tx.gather(1, torch.tensor([[3, 0]] * 3)).sum() + tx[:, torch.tensor(columns)].sum()
  np.testing.assert_allclose(out.numpy(), want.detach().numpy())
  out.sum().backward()
  want.sum().backward()
  np.testing.assert_allclose(x.grad.numpy(), tx.grad.numpy())
  y = Tensor.zeros(5).contiguous().realize()
  y[Tensor([-1, 0])] = 3.0
  assert y.tolist() == [3.0, 0.0, 0.0, 0.0, 3.0]

def test_ignore_index_labels_do_not_raise():
  logits = np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3)
  for labels, ignore in (([0, -1, 2, -1], -1), ([0, 7, 2, 1], 7), ([1, -100, 0, 2], -100)):
    loss = Tensor(logits).sparse_categorical_crossentropy(Tensor(labels), ignore_index=ignore).item()
    want = tF.cross_entropy(torch.tensor(logits), torch.tensor(labels), ignore_index=ignore).item()
    np.testing.assert_allclose(loss, want, rtol=1e-6)
  with pytest.raises(IndexError, match="Target -1 is out of bounds"):
    Tensor(logits).sparse_categorical_crossentropy(Tensor([0, -1, 2, 1]), ignore_index=-100).item()

def test_jit_replay_checks_every_call():
  """The check kernels are captured with the step: a bad id on the 4th call (a replay) raises at that call's return."""
  Tensor.manual_seed(0)
  table, head = nn.Embedding(6, 4), nn.Linear(4, 3)
  @TinyJit
  def step(ids: Tensor, labels: Tensor) -> Tensor: return head(table(ids)).sparse_categorical_crossentropy(labels).realize()
  good_ids, good_labels = np.array([[0, 5, 2]], np.int32), np.array([[1, 2, 0]], np.int32)
  for _ in range(3): step(Tensor(good_ids), Tensor(good_labels))
  assert step.calls == 2
  bad_ids = np.array([[0, 6, 2]], np.int32)
  with pytest.raises(IndexError, match="index out of range in self.* 6.*CHECK_INDEX=0"): step(Tensor(bad_ids), Tensor(good_labels))
  with pytest.raises(IndexError, match="Target 3 is out of bounds"): step(Tensor(good_ids), Tensor(np.array([[1, 3, 0]], np.int32)))
  step(Tensor(good_ids), Tensor(good_labels)).numpy()  # a good call after a bad one is clean
  assert step.calls == 2, "the function was replayed, not run again"

def test_check_index_0_skips_the_checks():
  with Context(CHECK_INDEX=0):
    assert Tensor(ARANGE)[Tensor([1, 7])].tolist() == [1, 0]
    assert Tensor(ARANGE)[Tensor([-9])].tolist() == [0]
    assert Tensor([1.0, 2.0, 3.0]).gather(Tensor([5]), 0).tolist() == [0.0]
    assert nn.Embedding(5, 2)(Tensor([9])).tolist() == [[0.0, 0.0]]
    assert index_check.pending_count() == 0

def test_checks_cost_one_kernel_each_in_the_same_schedule():
  x, idx = Tensor(np.arange(12, dtype=np.float32).reshape(3, 4)).realize(), Tensor([2, 0]).realize()
  counts = {}
  for check in (0, 1):
    with Context(CHECK_INDEX=check):
      GlobalCounters.reset()
      x[idx].numpy()
      counts[check] = GlobalCounters.kernel_count
  assert counts == {0: 1, 1: 2}, counts

def test_pending_checks_stay_bounded():
  """A loop that realizes but never reads the host does not pile up checks; a bad index among them still raises at a realize."""
  x, idx = Tensor(np.arange(12, dtype=np.float32)).realize(), Tensor([2, 0]).realize()
  for _ in range(3 * index_check.MAX_PENDING): x[idx].realize()
  assert 0 < index_check.pending_count() <= index_check.MAX_PENDING
  with pytest.raises(IndexError, match="index 12 is out of bounds"):
    for _ in range(2 * index_check.MAX_PENDING): x[Tensor([12])].realize()
  assert index_check.pending_count() == 0
