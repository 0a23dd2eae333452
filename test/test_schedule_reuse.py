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
  "a constant's side": lambda a, b: ((a - 1) * b, (1 - a) * b),  # the constant is the first operand: its op reads it through its broadcast
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

@pytest.fixture
def scheduler_calls(monkeypatch):
  """The graphs the scheduler itself scheduled (a reused plan does not count), each as the ids of its targets."""
  calls = []
  original = schedule._schedule
  monkeypatch.setattr(schedule, "_plans", {})
  monkeypatch.setattr(schedule, "_schedule", lambda targets: calls.append([id(target) for target in targets]) or original(targets))
  return calls

def numpy_pad_rows(x, before, after): return np.pad(x, ((before, after), (0, 0)))

# (tinyc, numpy) pairs for two graphs that differ in one thing: each must be scheduled anew and give numpy's values
DIFFERING = {
  "constant": ((lambda a, b: a * b + 1, lambda a, b: a * b + 1), (lambda a, b: a * b + 2, lambda a, b: a * b + 2)),
  "negative zero": ((lambda a, b: 1 / (a * 0.0), lambda a, b: 1 / (a * 0.0)),
                    (lambda a, b: 1 / (a * -0.0), lambda a, b: 1 / (a * -0.0))),
  "dtype": ((lambda a, b: (a * 4).cast(dtypes.int32) + 1, lambda a, b: (a * 4).astype(np.int32) + 1),
            (lambda a, b: (a * 4).cast(dtypes.int16) + 1, lambda a, b: (a * 4).astype(np.int16) + 1)),
  "shape": ((lambda a, b: a[:2] * b[:2] + 1, lambda a, b: a[:2] * b[:2] + 1), (lambda a, b: a[:3] * b[:3] + 1, lambda a, b: a[:3] * b[:3] + 1)),
  "permute": ((lambda a, b: a.T * 2 + b.T, lambda a, b: a.T * 2 + b.T),
              (lambda a, b: a.T * 2 + b.reshape(6, 4), lambda a, b: a.T * 2 + b.reshape(6, 4))),
  "expand": ((lambda a, b: a[0:1].expand(4, 6) * b, lambda a, b: a[0:1] * b), (lambda a, b: a[0:4] * b, lambda a, b: a * b)),
  "pad": ((lambda a, b: a.pad(((1, 0), (0, 0)))[:4] * b, lambda a, b: numpy_pad_rows(a, 1, 0)[:4] * b),
          (lambda a, b: a.pad(((0, 1), (0, 0)))[:4] * b, lambda a, b: numpy_pad_rows(a, 0, 1)[:4] * b)),
  "a realized input or the graph that makes it": ((lambda a, b: (a.exp() * b).sum(1), lambda a, b: (np.exp(a) * b).sum(1)),
                                                   (lambda a, b: (a.exp().realize() * b).sum(1), lambda a, b: (np.exp(a) * b).sum(1))),
  "one input twice or two inputs": ((lambda a, b: a * b + 1, lambda a, b: a * b + 1), (lambda a, b: a * a + 1, lambda a, b: a * a + 1)),
}

@pytest.mark.parametrize("change", DIFFERING)
def test_a_changed_structure_is_scheduled_anew_and_computes_the_right_values(change, scheduler_calls):
  a, b = fresh(seed=11), fresh(seed=12)
  for graph, reference in DIFFERING[change]:
    out = graph(a, b).realize()
    assert id(out.lazydata.base) in scheduler_calls[-1], f"{change}: a graph reused the plan of the one before"
    with np.errstate(divide="ignore"): np.testing.assert_allclose(out.numpy(), reference(a.numpy(), b.numpy()), rtol=1e-5, atol=1e-6)

def test_an_eager_loop_schedules_once(scheduler_calls):
  for step in range(5):  # new inputs and a new graph every call: only the structure repeats
    a, b = fresh(seed=20 + step), fresh(seed=40 + step)
    np.testing.assert_allclose((a * b + 1).realize().numpy(), a.numpy() * b.numpy() + 1, rtol=1e-5, atol=1e-6)
  assert len(scheduler_calls) == 1

def test_an_assign_reuses_the_plan_with_its_own_target(scheduler_calls):
  first, second, value = fresh(seed=16), fresh(seed=17), fresh(seed=18)
  first.assign(value * 2 + first).realize()
  expected_second = value.numpy() * 2 + second.numpy()
  second.assign(value * 2 + second).realize()  # the same structure, another target: the plan's write goes to second's memory
  np.testing.assert_allclose(second.numpy(), expected_second, rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(first.numpy(), value.numpy() * 2 + fresh(seed=16).numpy(), rtol=1e-5, atol=1e-6)
  assert len(scheduler_calls) == 1
  (value * 2 + second).realize()  # the same value without the assign: another structure
  assert len(scheduler_calls) == 2

def test_another_device_is_another_structure(scheduler_calls):
  from tinyc import Device
  other = next((name for name in ("LLVM", "GPU") if name != Device.DEFAULT and Device.usable(name)), None)
  if other is None: pytest.skip("only one device opens here")
  data = np.arange(24, dtype=np.float32).reshape(4, 6)
  here, there = Tensor(data).realize(), Tensor(data, device=other).realize()
  np.testing.assert_allclose((here * 2 + 1).numpy(), data * 2 + 1)
  result = (there * 2 + 1).realize()
  assert result.device == other and len(scheduler_calls) == 2
  np.testing.assert_allclose(result.numpy(), data * 2 + 1)

def test_a_reused_plan_runs_the_program_of_the_settings_in_force_and_builds_again_once_programs_are_cleared():
  from tinyc import Device
  from tinyc.helpers import Context
  from tinyc.realize import steps_run
  a, b = fresh(seed=50), fresh(seed=51)
  def program_run():
    with steps_run.record() as steps: out = (a * b + 1).realize()
    np.testing.assert_allclose(out.numpy(), a.numpy() * b.numpy() + 1, rtol=1e-5, atol=1e-6)
    ((program, _, _),) = steps
    return program
  first = program_run()
  assert program_run() is first  # realize.py keeps it with the plan
  with Context(NOOPT=1): unoptimized = program_run()
  assert unoptimized is not first, "NOOPT=1 ran the program built without it"
  assert program_run() is first
  Device[Device.DEFAULT].programs.clear()
  rebuilt = program_run()
  assert rebuilt is not first and rebuilt in Device[Device.DEFAULT].programs.values(), "a cleared program table was not built again"

def test_a_reused_plan_builds_again_once_the_program_table_is_replaced(monkeypatch):
  """A device's program table replaced by a new one (as tests do to forget what was compiled) is a table of no programs: a kept plan
  builds its program again into it, not runs the one it kept."""
  from tinyc import Device
  from tinyc.device import Programs
  from tinyc.realize import steps_run
  a, b = fresh(seed=52), fresh(seed=53)
  def program_run():
    with steps_run.record() as steps: (a * b + 1).realize()
    return steps[0][0]
  first = program_run()
  monkeypatch.setattr(Device[Device.DEFAULT], "programs", Programs())
  rebuilt = program_run()
  assert rebuilt is not first and rebuilt in Device[Device.DEFAULT].programs.values(), "the replaced table was not built into"
