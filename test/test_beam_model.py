"""BEAM at model scale (issue 16): the cost model ranks a step's candidates and the search builds only the first few; a search ends
at the kernel's roofline bound; a schedule's kernels are searched once each, the heaviest first, and its negligible tail not at all.
The numpy inference of codegen/cost_model.py gives what the tinyc-trained model gives."""
from __future__ import annotations
import sys
from pathlib import Path
import numpy as np
import pytest
from tinyc import Device, Tensor
from tinyc.helpers import Context
from tinyc.ops import LoadOps
from tinyc.schedule import create_schedule
from tinyc.codegen import cost_model, search
from tinyc.codegen.features import FEATURE_NAMES, features
from tinyc.codegen.heuristic import hand_coded_optimizations
from tinyc.codegen.kernel import Kernel, Opt
from tinyc.nn.state import safe_save
from tinyc import beam, device as device_module
sys.path.insert(0, str(Path(__file__).parents[1] / "bench"))
import beam_model  # noqa: E402
from test_register_mma import H200  # noqa: E402

@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
  monkeypatch.setenv("CACHEDB", str(tmp_path / "beam.db"))
  beam._chosen.clear()

def matmul_kernel(n: int = 64) -> Kernel:
  item = next(item for item in create_schedule([(Tensor.empty(n, n) @ Tensor.empty(n, n)).lazydata]) if item.ast.op not in LoadOps)
  return Kernel(item.ast)

def by_source(opts: tuple[Opt, ...]) -> tuple[str, int]: return repr(opts), len(opts)  # a fake build (module level: workers import it)

def test_a_ranked_step_builds_only_the_top_candidates_in_the_models_order(monkeypatch):
  monkeypatch.setenv("BEAM_MAX_STEPS", "2")
  kernel, built_steps = matmul_kernel(), []
  def rank(kernels: list[Kernel]) -> list[int]:  # the candidates with the most upcast lanes first
    built_steps.append(len(kernels))
    return sorted(range(len(kernels)), key=lambda i: -kernels[i].upcast_size)
  measured: list[tuple[Opt, ...]] = []
  def measure(opts, built):
    measured.append(opts)
    return 1.0 / (1 + len(opts))
  pool = search.CompilePool(workers=2, timeout_s=30.0)
  try: search.run_search(search.beam_steps(kernel, 2, by_source, lambda opts: (opts,), measure, rank=rank, top=3), pool)
  finally: pool.close()
  assert len(built_steps) == 2 and all(count > 3 for count in built_steps)
  assert len(measured) == 1 + 3 * 2, "the start, then three candidates a step"
  first_step = measured[1:4]
  assert all(Kernel(kernel.ast).upcast_size <= _replayed(kernel, opts).upcast_size for opts in first_step)
  assert max(len(search.expansions(kernel)), 4) > 3 and len(set(measured)) == len(measured), "no candidate twice"

def test_a_ranked_step_that_gains_nothing_builds_the_next_candidates_of_its_ranking_once_before_the_search_ends():
  kernel, measured = matmul_kernel(), []
  def measure(opts, built):
    measured.append(opts)
    return 1.0
  pool = search.CompilePool(workers=2, timeout_s=30.0)
  in_order = lambda kernels: list(range(len(kernels)))  # noqa: E731
  try: search.run_search(search.beam_steps(kernel, 2, by_source, lambda opts: (opts,), measure, rank=in_order, top=3), pool)
  finally: pool.close()
  assert measured[1:] == search.expansions(kernel)[:6]

def _replayed(kernel: Kernel, opts: tuple[Opt, ...]) -> Kernel: return search._replay(kernel, opts)

def test_a_search_whose_best_reaches_the_roofline_bound_stops_after_its_starts():
  kernel, measured = matmul_kernel(), []
  def measure(opts, built):
    measured.append(opts)
    return 1e-3
  pool = search.CompilePool(workers=2, timeout_s=30.0)
  try:
    search.run_search(search.beam_steps(kernel, 2, by_source, lambda opts: (opts,), measure, good_enough_s=1e-3), pool)
    assert measured == [()]
    search.run_search(search.beam_steps(kernel, 2, by_source, lambda opts: (opts,), measure, good_enough_s=0.9e-3), pool)
    assert len(measured) > 2
  finally: pool.close()

def test_a_ranked_search_builds_its_starts_in_its_first_steps_round():
  kernel, rounds = matmul_kernel(), []
  steps = search.beam_steps(kernel, 2, by_source, lambda opts: (opts,), lambda opts, built: 1.0 / (1 + len(opts)),
                            starts=((Opt(search.OptOps.UPCAST, 0, 4),), ()), rank=lambda kernels: list(range(len(kernels))), top=3,
                            max_steps=1)
  try:
    job, arguments = next(steps)
    while True:
      rounds.append([opts for opts, in arguments])
      job, arguments = steps.send([job(*each) for each in arguments])
  except StopIteration as end: best = end.value
  assert len(rounds) == 1 and rounds[0][:2] == [(Opt(search.OptOps.UPCAST, 0, 4),), ()] and len(rounds[0]) == 5
  assert best == max(rounds[0], key=len), "the first step's best"

def nap(seconds: float, name: str) -> tuple[str, float, float]:  # a build job that takes `seconds` (module level: workers import it)
  import time
  started = time.time()
  time.sleep(seconds)
  return name, started, time.time()

def napping_search(rounds: list[list[float]], name: str, log: list):
  """A stand-in search: each round builds naps of the given seconds."""
  for round_ in rounds: log += (yield nap, [(seconds, name) for seconds in round_])
  return name

@pytest.mark.parametrize("at_once", [1, 2])
def test_searches_run_at_once_share_the_workers(at_once):
  """While one search waits for its round's slow build, another's rounds run on the free workers; one at a time, they wait."""
  log, ended = [], []
  pool = search.CompilePool(workers=2, timeout_s=30.0)
  try:
    # (a 2 s build: a margin over the time the workers take to import this file for their first job)
    searches = [napping_search([[2.0, 0.0]], "slow", log), napping_search([[0.0], [0.0], [0.0]], "quick", log)]
    search.run_searches(searches, pool, at_once, lambda number, result: ended.append((number, result)))
  finally: pool.close()
  slow_end = max(end for name, _, end in log if name == "slow")
  quick_starts = [start for name, start, _ in log if name == "quick"]
  assert len(quick_starts) == 3
  if at_once == 2: assert ended == [(1, "quick"), (0, "slow")] and max(quick_starts) < slow_end
  else: assert ended == [(0, "slow"), (1, "quick")] and min(quick_starts) >= slow_end - 0.05

def test_a_search_that_raises_leaves_the_pool_working():
  def failing():
    yield nap, [(0.5, "a"), (0.0, "b")]
    raise RuntimeError("a device error")
  pool = search.CompilePool(workers=2, timeout_s=30.0)
  try:
    with pytest.raises(RuntimeError, match="a device error"):
      search.run_searches([failing(), napping_search([[2.0]], "other", [])], pool, 2, lambda *_: None)
    assert pool.map(nap, [(0.0, "c"), (0.0, "d")])[1][0] == "d", "no earlier job's result answers a later one"
  finally: pool.close()

def test_the_roofline_bound_is_a_launch_plus_the_kernels_bytes_at_the_measured_bandwidth(tinyc_device):
  device = Device[Device.DEFAULT]
  if device.compile_binary is None: pytest.skip(f"{Device.DEFAULT} cannot build in worker processes")
  launch_s, bytes_per_s = beam.device_speed(device)
  assert 0 < launch_s < 1e-2 and 1e8 < bytes_per_s < 1e14, (launch_s, bytes_per_s)
  kernel = Kernel(matmul_kernel(256).ast, device.target)
  assert beam.roofline_seconds(device, kernel) == pytest.approx(launch_s + 3 * 256 * 256 * 4 / bytes_per_s)

def test_the_search_hands_its_workers_programs_on_instead_of_building_them_again(tinyc_device, monkeypatch):
  """The check of the winner against the unoptimized kernel, and the run after it, load what the search's workers built."""
  if Device[Device.DEFAULT].compile_binary is None: pytest.skip(f"{Device.DEFAULT} cannot build in worker processes")
  monkeypatch.setenv("BEAM_MAX_STEPS", "1")
  a, b = np.random.default_rng(0).standard_normal((2, 24, 40), dtype=np.float32)
  ta, tb = Tensor(a).realize(), Tensor(b).realize()
  beam.device_speed(Device[Device.DEFAULT])  # (its copy kernels are built in the process, once: measured first where no test did)
  monkeypatch.setattr(device_module, "build", lambda *args: pytest.fail("a program the search built was built again"))
  with Context(BEAM=2): out = (ta @ tb.T).relu().numpy()
  np.testing.assert_allclose(out, np.maximum(a @ b.T, 0), rtol=1e-5, atol=1e-5)

# ***** the model *****

def trained_like_model(path: Path) -> beam_model.Model:
  """A model of bench/beam_model.py with random weights and a feature scaling, saved where `path` says."""
  Tensor.manual_seed(1)
  model = beam_model.Model()
  model.mean, model.scale = Tensor.rand(len(FEATURE_NAMES)), Tensor.rand(len(FEATURE_NAMES)) + 0.5
  safe_save(model.state(), path, metadata={"device": "test", "features": ",".join(FEATURE_NAMES)})
  return model

def test_the_searchs_numpy_inference_gives_the_tinyc_models_predictions(tmp_path):
  model = trained_like_model(tmp_path / "m.safetensors")
  kernel = matmul_kernel()
  kernels = [_replayed(kernel, opts) for opts in [()] + search.expansions(kernel)[:30]]
  rows = np.array([features(k) for k in kernels], dtype=np.float32)
  loaded = cost_model.load(tmp_path / "m.safetensors")
  assert loaded is not None
  np.testing.assert_allclose(loaded.predict(rows), model(Tensor(rows)).numpy(), rtol=1e-4, atol=1e-4)
  assert loaded.rank(kernels) == list(np.argsort(model(Tensor(rows)).numpy(), kind="stable")) and loaded.rank([]) == []

def test_beam_model_chooses_the_packaged_model_of_the_device_class_a_file_or_none(monkeypatch, tmp_path):
  gpu, cpu = H200, Kernel(matmul_kernel().ast).target
  monkeypatch.delenv("BEAM_MODEL", raising=False)
  assert cost_model.model_path(gpu) == cost_model.MODELS / "gpu.safetensors" and cost_model.model_path(cpu) == cost_model.MODELS / "cpu.safetensors"
  monkeypatch.setenv("BEAM_MODEL", "0")
  assert cost_model.model_path(cpu) is None
  monkeypatch.setenv("BEAM_MODEL", str(tmp_path / "none.safetensors"))
  with pytest.raises(FileNotFoundError, match="BEAM_MODEL"): cost_model.load(cost_model.model_path(cpu))

@pytest.mark.parametrize("name", ["cpu", "gpu"])
def test_the_packaged_models_read_this_tinycs_features(name):
  loaded = cost_model.load(cost_model.MODELS / f"{name}.safetensors")
  assert loaded is not None, "the package ships a model for each device class"
  kernel = matmul_kernel()
  assert len(loaded.rank([_replayed(kernel, opts) for opts in search.expansions(kernel)[:10]])) == 10

# ***** a whole schedule *****

def test_a_schedules_kernels_are_searched_once_each_heaviest_first_light_ones_one_step_and_its_light_tail_not_at_all(tinyc_device, monkeypatch):
  device = Device[Device.DEFAULT]
  if device.compile_binary is None: pytest.skip(f"{Device.DEFAULT} cannot build in worker processes")
  x, w = Tensor.rand(32, 48).realize(), Tensor.rand(48, 48).realize()
  outputs = [(x @ w).relu(), (x @ w).sum(1), x.exp().max(0), (x * 2).sqrt(), (x + 1).reshape(48, 32).sum(1)]
  asts = list(dict.fromkeys(item.ast for item in create_schedule([t.lazydata for t in outputs]) if item.ast.op not in LoadOps))
  assert len(asts) == 5
  weights = dict(zip(asts, [10.0, 6.0, 3.0, 0.2, 0.1]))  # seconds of each kernel's hand-coded program
  beam.device_speed(device)  # (measured before _seconds is replaced)
  monkeypatch.setattr(beam, "_seconds", lambda device, ast, opts, runs=2: weights[ast])
  searched: list = []
  def search_steps(device, ast, max_steps=None):  # (a search that builds nothing)
    searched.append((ast, max_steps))
    return ((), True)
    yield
  monkeypatch.setattr(beam, "search_steps", search_steps)
  monkeypatch.setenv("BEAM_LIGHT_SHARE", "0.15")
  beam.beam_plan(device, asts + asts[:1])  # the first kernel twice (as a model's layers repeat one): one search, twice the weight
  assert searched == [(asts[0], None), (asts[1], None), (asts[2], 1)], "the two lightest (0.3 s of 29.3) are not searched, the "
  "third (10%, under BEAM_LIGHT_SHARE) for one step"
  assert all(beam._chosen[beam._chosen_key(device, ast)] == () for ast, _ in searched)
  for light in asts[3:]:  # each keeps its own hand-coded Opts
    assert beam._chosen[beam._chosen_key(device, light)] == tuple(hand_coded_optimizations(Kernel(light, device.target)))
  assert not beam._cached_opts(device, asts[3]), "a kernel kept by the weight of this schedule is not cached"
  monkeypatch.setattr(beam, "search_steps", lambda *args: pytest.fail("a kernel was searched twice"))
  monkeypatch.setattr(beam, "search", lambda *args: pytest.fail("a kernel was searched twice"))
  with Context(BEAM=2): assert all(beam.beam_opts(device, ast) is not None for ast in asts)

def test_a_kernel_whose_hand_coded_program_reaches_its_roofline_bound_is_not_searched_and_is_cached(tinyc_device, monkeypatch):
  device = Device[Device.DEFAULT]
  if device.compile_binary is None: pytest.skip(f"{Device.DEFAULT} cannot build in worker processes")
  x = Tensor.rand(64, 64).realize()
  asts = list(dict.fromkeys(item.ast for item in create_schedule([(x * 2).lazydata, x.sum(0).lazydata, x.exp().max(1).lazydata])))
  beam.device_speed(device)  # (measured before _seconds is replaced)
  monkeypatch.setattr(beam, "_seconds", lambda device, ast, opts, runs=2: 1e-12 if ast == asts[0] else 1.0)
  searched: list = []
  def search_steps(device, ast, max_steps=None):  # (a search that builds nothing)
    searched.append(ast)
    return ((), True)
    yield
  monkeypatch.setattr(beam, "search_steps", search_steps)
  beam.beam_plan(device, asts)
  assert len(searched) == 2 and set(searched) == set(asts[1:])
  assert beam._cached_opts(device, asts[0]) == beam._chosen[beam._chosen_key(device, asts[0])]
