"""TinyJit: capture on the second call, replay afterwards with new inputs; never silently wrong."""
import numpy as np
import pytest
from tinyc import Tensor, GlobalCounters
from tinyc.jit import TinyJit, JitError

def test_replay_uses_the_new_inputs():
  @TinyJit
  def step(a, b): return (a * b + 1).sum(0)
  rng = np.random.default_rng(0)
  for call in range(5):
    a, b = rng.standard_normal((3, 4)).astype(np.float32), rng.standard_normal((3, 4)).astype(np.float32)
    np.testing.assert_allclose(step(Tensor(a), Tensor(b)).numpy(), (a * b + 1).sum(0), rtol=1e-5, err_msg=f"call {call}")
  assert step.calls == 2 and len(step.steps) == 1

def test_replay_skips_scheduling_and_runs_the_captured_kernels():
  calls = []
  @TinyJit
  def step(x):
    calls.append(1)
    return (x + 1).relu() * 2
  for _ in range(4): step(Tensor([1.0, -3.0]))
  assert len(calls) == 2  # the Python function ran for the first two calls only
  GlobalCounters.reset()
  assert step(Tensor([5.0, -7.0])).tolist() == [12.0, 0.0]
  assert GlobalCounters.kernel_count == 1

def test_in_place_updates_persist_across_replays():
  weight = Tensor([1.0, 2.0]).realize()
  @TinyJit
  def update(grad):
    weight.assign(weight - grad)
    weight.realize()
    return weight
  for _ in range(5): update(Tensor([0.5, 1.0]))
  np.testing.assert_allclose(weight.numpy(), [1.0 - 2.5, 2.0 - 5.0])

def test_different_shape_or_dtype_raises():
  @TinyJit
  def step(x): return x * 2
  for _ in range(3): step(Tensor([1.0, 2.0]))
  with pytest.raises(JitError, match="differ from the captured"): step(Tensor([1.0, 2.0, 3.0]))
  with pytest.raises(JitError, match="differ from the captured"): step(Tensor([1, 2]))
  step.reset()
  assert step(Tensor([1.0, 2.0, 3.0])).tolist() == [2.0, 4.0, 6.0]

def test_changed_python_argument_raises():
  @TinyJit
  def scale(x, k): return x * k
  for _ in range(3): scale(Tensor([1.0]), 2.0)
  with pytest.raises(JitError): scale(Tensor([1.0]), 3.0)

def test_non_contiguous_input_is_made_contiguous():
  @TinyJit
  def step(x): return x + 1
  base = np.arange(6, dtype=np.float32).reshape(2, 3)
  for k in range(4): np.testing.assert_allclose(step(Tensor(base + k).T).numpy(), (base + k).T + 1)

def test_replay_uses_a_graph_where_the_device_has_one():
  from tinyc import Device
  @TinyJit
  def step(a, b): return ((a * b).relu() + 1).sum(0) * 2
  rng = np.random.default_rng(3)
  kept = []  # inputs kept alive land at new addresses: each replay then records the graph again
  for call in range(6):
    a, b = rng.standard_normal((64, 8)).astype(np.float32), rng.standard_normal((64, 8)).astype(np.float32)
    inputs = (Tensor(a), Tensor(b))
    if call >= 4: kept.append(inputs)
    np.testing.assert_allclose(step(*inputs).numpy(), ((a * b).clip(0, None) + 1).sum(0) * 2, rtol=1e-5, err_msg=f"call {call}")
  assert (step.graph is not None) == (Device.DEFAULT == "CUDA"), "CUDA replays through a graph; other devices launch one by one"
  GlobalCounters.reset()
  step(*kept[0])
  assert GlobalCounters.kernel_count == len(step.steps) >= 1

def test_a_cuda_graph_is_recorded_once_per_input_address():
  # found by bench_train on the H200: the JIT holds the last call's inputs, so new inputs alternate between two addresses, and
  # a graph kept only for the last addresses was recorded again on every replay, slower than launching the kernels one by one
  from tinyc import Device
  if Device.DEFAULT != "CUDA": pytest.skip("CUDA graphs need CUDA=1")
  @TinyJit
  def step(a): return (a * 2 + 1).sum()
  x = np.arange(256, dtype=np.float32)
  for _ in range(10): assert step(Tensor(x)).item() == (x * 2 + 1).sum()
  assert step.graph is not None and 1 <= step.graph.recordings <= 3, f"recorded {step.graph.recordings} times for 8 replays"
