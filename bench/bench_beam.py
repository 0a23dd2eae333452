"""BEAM's search time and what it finds, with the cost model and without (BEAM_MODEL=0), side by side in one run.

  python bench/bench_beam.py [--only gpt|cnn|matmul] [--steps 10]

Each row runs twice, each time in a fresh process with an empty cache (CACHEDB in a temporary folder): BEAM=2 with the packaged
cost model, then BEAM=2 with BEAM_MODEL=0 (every candidate of a step built and timed). Rows:
gpt: bench_train.py's GPT training step (fp32, AdamW; on a GPU the transformer issue's size, on the CPU its CPU size).
cnn: bench_train.py's CNN training step (Adam, batch 128).
matmul: a 1024 x 1024 float32 matmul (on the CPU beside numpy's: the issue's target is >= 0.6x numpy's speed).
Search: the seconds spent in BEAM (the whole schedule's plan and every kernel's search); step: the median of --steps replays after
three warm-up steps (the search runs in the first).
"""
from __future__ import annotations
import argparse, json, os, statistics, subprocess, sys, tempfile, time
from pathlib import Path
from typing import Any, Callable
import numpy as np
sys.path.insert(0, str(Path(__file__).parent))

WORKLOADS = ("gpt", "cnn", "matmul")

def timed_search() -> list[float]:
  """Seconds spent in BEAM from now on: realize's whole-schedule plans and beam's searches outside them (one list item, summed)."""
  from tinyc import beam, realize
  spent, depth = [0.0], [0]
  def timing(function: Callable[..., Any]) -> Callable[..., Any]:
    def timed(*args: Any) -> Any:
      depth[0] += 1
      started = time.perf_counter()
      try: return function(*args)
      finally:
        depth[0] -= 1
        if depth[0] == 0: spent[0] += time.perf_counter() - started
    return timed
  realize.beam_plan = timing(realize.beam_plan)  # type: ignore[attr-defined]
  beam._search_and_cache = timing(beam._search_and_cache)  # type: ignore[attr-defined]
  return spent

def median_ms(step: Callable[[], object], steps: int) -> float:
  times = []
  for _ in range(steps):
    started = time.perf_counter()
    step()
    times.append(time.perf_counter() - started)
  return statistics.median(times) * 1e3

def run(workload: str, steps: int) -> dict[str, float]:
  """One workload in this process (BEAM=2, the environment's BEAM_MODEL): its search seconds, step milliseconds, numpy's where it has one."""
  import bench_train as bt
  from tinyc import Context, Device, Tensor
  spent, result = timed_search(), {}
  on_gpu = Device.DEFAULT in ("CUDA", "GPU")
  if workload == "gpt":
    config = bt.GPT_GPU if on_gpu else bt.GPT_CPU
    Tensor.manual_seed(0)
    gpt_step = bt.jitted_step(bt.examples_gpt()(config.vocab, config.context, config.width, config.layers, config.heads))
    ids, labels = (Tensor(part.astype(np.int32)).realize() for part in bt.gpt_batch(config))
    step: Callable[[], object] = lambda: gpt_step(ids, labels).item()  # noqa: E731
  elif workload == "cnn":
    from tinyc.jit import TinyJit
    from tinyc.nn.optim import Adam
    from tinyc.nn.state import get_parameters
    rng = np.random.default_rng(0)
    model = bt.TinyCNN()
    optimizer = Adam(get_parameters(model), lr=1e-3)
    x, y = Tensor(rng.random((128, 1, 28, 28), dtype=np.float32)).realize(), Tensor(rng.integers(0, 10, 128).astype(np.int32)).realize()
    @TinyJit
    def cnn_step() -> Tensor:
      optimizer.zero_grad()
      loss = model(x).sparse_categorical_crossentropy(y)
      loss.backward()
      optimizer.step()
      return loss
    step = lambda: cnn_step().item()  # noqa: E731
  else:
    a, b = (np.random.default_rng(seed).random((1024, 1024), dtype=np.float32) for seed in (0, 1))
    ta, tb = Tensor(a).realize(), Tensor(b).realize()
    step = lambda: (ta @ tb).realize()  # noqa: E731
    if not on_gpu: result["numpy_ms"] = median_ms(lambda: a @ b, steps)
  with Context(BEAM=2):
    for _ in range(3): step()
    result["search_s"] = spent[0]
    result["step_ms"] = median_ms(step, steps)
  return result

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--only", choices=WORKLOADS)
  parser.add_argument("--steps", type=int, default=10)
  parser.add_argument("--run", choices=WORKLOADS, help=argparse.SUPPRESS)  # (a child process: one workload, one setting)
  args = parser.parse_args()
  if args.run: return print(json.dumps(run(args.run, args.steps)))
  from tinyc import Device
  print(f"device {Device.DEFAULT}; BEAM=2, each row in fresh processes with empty caches; step: median of {args.steps}")
  print(f"{'workload':9s} {'search s':>9s} {'BEAM_MODEL=0':>13s} {'step ms':>9s} {'BEAM_MODEL=0':>13s} {'step/plain':>11s} {'numpy ms':>9s}")
  for workload in [args.only] if args.only else WORKLOADS:
    results = []
    for model in ("1", "0"):
      with tempfile.TemporaryDirectory() as folder:
        environment = {**os.environ, "BEAM_MODEL": model, "CACHEDB": os.path.join(folder, "beam.db"), "BEAM_PROGRESS": "0"}
        child = subprocess.run([sys.executable, __file__, "--run", workload, "--steps", str(args.steps)], env=environment,
                               capture_output=True, text=True)
      if child.returncode != 0: sys.exit(f"{workload} (BEAM_MODEL={model}) failed:\n{child.stderr[-3000:]}")
      results.append(json.loads(child.stdout.strip().splitlines()[-1]))
    (ours, plain), numpy_ms = results, results[0].get("numpy_ms")
    numpy_text = f"{numpy_ms:9.3f}" if numpy_ms else f"{'-':>9s}"
    print(f"{workload:9s} {ours['search_s']:9.1f} {plain['search_s']:13.1f} {ours['step_ms']:9.3f} {plain['step_ms']:13.3f} "
          f"{ours['step_ms'] / plain['step_ms']:10.2f}x {numpy_text}", flush=True)

if __name__ == "__main__":
  main()
