"""A graph of a structure scheduled before reuses that plan (schedule.py): the same items as scheduling it anew, and never a plan
made for another structure."""
import gc
import weakref
import numpy as np
import pytest
from tinyc import Tensor, dtypes, schedule
from tinyc.schedule import create_schedule

def fresh(shape=(4, 6), seed=0, dtype=dtypes.float32):
  return Tensor(np.random.default_rng(seed).standard_normal(shape).astype(np.float32), dtype=dtype).realize()

def described(items):
  """A schedule as plain values: each item's AST, and its outputs and inputs by identity."""
  return [(item.ast, [id(out) for out in item.outs], [id(src) for src in item.inputs]) for item in items]

def scheduled_anew(outs, monkeypatch):
  with monkeypatch.context() as patch:
    patch.setattr(schedule, "_plans", {})
    return create_schedule(outs)

def test_the_same_structure_reuses_the_plan_with_its_own_buffers():
  first_in, second_in = fresh(seed=1), fresh(seed=2)
  first, second = (first_in + 1).exp().sum(1), (second_in + 1).exp().sum(1)
  (item_a,), (item_b,) = create_schedule([first.lazydata]), create_schedule([second.lazydata])
  assert item_b.ast is item_a.ast
  assert item_b.outs == (second.lazydata.base,) and item_b.inputs == (second_in.lazydata,)
  np.testing.assert_allclose(second.numpy(), np.exp(second_in.numpy() + 1).sum(1), rtol=1e-5)

def shared_twice(a):
  value = (a + 1) * 3
  return value.sum(1, keepdim=True) + value

# each pair differs in one thing the scheduler or the kernel depends on; the second must get its own plan
CHANGES = {
  "constant": lambda a, b: ((a + 1) * b, (a + 2) * b),
  "view": lambda a, b: (a.T.reshape(4, 6) * b, a * b),
  "op": lambda a, b: (a * b, a + b),
  "reduce axis": lambda a, b: ((a * b).sum(0), (a * b).sum(1)),
  "dtype": lambda a, b: (a.cast(dtypes.float16) * 2, a.cast(dtypes.int32) * 2),
  "the same input twice": lambda a, b: (a * b, a * a),
  "one value read twice or two alike": lambda a, b: (shared_twice(a), ((a + 1) * 3).sum(1, keepdim=True) + (a + 1) * 3),
  "an intermediate realized": lambda a, b: ((a.exp() * b).sum(1), (a.exp().realize() * b).sum(1)),
}

@pytest.mark.parametrize("change", CHANGES)
def test_a_changed_structure_gets_its_own_plan(change, monkeypatch):
  a, b = fresh(seed=3), fresh(seed=4)
  first, second = CHANGES[change](a, b)
  create_schedule([first.lazydata])
  assert described(create_schedule([second.lazydata])) == described(scheduled_anew([second.lazydata], monkeypatch))

def test_an_assign_reading_its_target_through_another_view_is_not_taken_for_one_that_does_not():
  target, other = fresh((5, 5), seed=5), fresh((5, 5), seed=6)
  expected_other = other.numpy().T + 1
  target.assign(other.T + 1).realize()  # no alias: one kernel writes in place
  np.testing.assert_allclose(target.numpy(), expected_other)
  aliased = fresh((5, 5), seed=7)
  expected_aliased = aliased.numpy().T + 1
  aliased.assign(aliased.T + 1).realize()  # the same structure but aliased: rule 6 computes into a temporary first
  np.testing.assert_allclose(aliased.numpy(), expected_aliased)

def test_many_structures_agree_with_scheduling_anew(monkeypatch):
  a, b = fresh((6, 8), seed=8), fresh((6, 8), seed=9)
  graphs = [lambda: a.softmax(-1), lambda: (a @ b.T).relu(), lambda: a.T.softmax(0) * 2, lambda: (a * b).mean(), lambda: a.log_softmax(-1)]
  for _ in range(2):
    for graph in graphs:
      out = graph()
      assert described(create_schedule([out.lazydata])) == described(scheduled_anew([out.lazydata], monkeypatch))

def test_a_plan_keeps_no_buffer_alive():
  data = fresh(seed=10)
  out = (data * 3).sum()
  create_schedule([out.lazydata])
  alive = weakref.ref(data.lazydata)
  del data, out
  gc.collect()
  assert alive() is None
