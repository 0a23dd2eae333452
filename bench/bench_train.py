"""Training-step benchmark: tinyc (TinyJit, Adam) beside PyTorch (eager, Adam), same model shapes, one run. On the CPU, or with
CUDA=1 / GPU=1 on the GPU (PyTorch then runs on CUDA too); BEAM=2 searches every kernel during the first steps.

  python bench/bench_train.py [--steps 20] [--only train|checks]

MLP: 784-128-10, batch 128. CNN: conv3x3(1->8) relu conv3x3(8->16) relu flatten linear(9216->10), 28x28 inputs, batch 128.
Medians of replayed steps, each ending with the loss on the host; the first steps (compile, capture, BEAM search) are timed apart.

The second table is the cost of the index checks (CHECK_INDEX=1 against 0, tinyc/index_check.py), the two steps' replays alternating:
a lookup step (Embedding(512, 64) -> Linear(64, 512) -> sparse_categorical_crossentropy, 32 x 64 tokens), all its kernels being the
ones an index check rides beside, and examples/gpt.py's GPT (vocab 96, context 64, width 96, 2 layers, 4 heads, batch 16), with AdamW.
"""
from __future__ import annotations
import argparse, os, statistics, sys, time
from typing import Any, Callable
import numpy as np
from tinyc import Context, GlobalCounters, Tensor, Device, nn
from tinyc.jit import TinyJit
from tinyc.nn.optim import Adam, AdamW
from tinyc.nn.state import get_parameters
import torch

class TinyMLP:
  def __init__(self) -> None: self.l1, self.l2 = nn.Linear(784, 128), nn.Linear(128, 10)
  def __call__(self, x: Tensor) -> Tensor: return self.l2(self.l1(x.flatten(1)).relu())

class TinyCNN:
  def __init__(self) -> None: self.c1, self.c2, self.head = nn.Conv2d(1, 8, 3), nn.Conv2d(8, 16, 3), nn.Linear(16 * 24 * 24, 10)
  def __call__(self, x: Tensor) -> Tensor: return self.head(self.c2(self.c1(x).relu()).relu().flatten(1))

def torch_models() -> dict[str, torch.nn.Module]:
  return {"MLP": torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(784, 128), torch.nn.ReLU(), torch.nn.Linear(128, 10)),
          "CNN": torch.nn.Sequential(torch.nn.Conv2d(1, 8, 3), torch.nn.ReLU(), torch.nn.Conv2d(8, 16, 3), torch.nn.ReLU(), torch.nn.Flatten(),
                                     torch.nn.Linear(16 * 24 * 24, 10))}

def median_ms(step: Callable[[], object], warmup: int, steps: int) -> tuple[float, float]:
  """(median milliseconds of a step, seconds the warm-up steps took)."""
  started = time.perf_counter()
  for _ in range(warmup): step()
  warmup_s, times = time.perf_counter() - started, []
  for _ in range(steps):
    start = time.perf_counter()
    step()
    times.append(time.perf_counter() - start)
  return statistics.median(times) * 1e3, warmup_s

def tinyc_step_ms(model: object, x: np.ndarray, y: np.ndarray, steps: int) -> tuple[float, float]:
  optimizer = Adam(get_parameters(model), lr=1e-3)
  @TinyJit
  def step(images: Tensor, labels: Tensor) -> Tensor:
    optimizer.zero_grad()
    loss = model(images).sparse_categorical_crossentropy(labels)  # type: ignore[operator]
    loss.backward()
    optimizer.step()
    return loss
  return median_ms(lambda: step(Tensor(x), Tensor(y)).numpy(), warmup=3, steps=steps)

def torch_step_ms(model: torch.nn.Module, x: np.ndarray, y: np.ndarray, steps: int, device: str) -> tuple[float, float]:
  model = model.to(device)
  optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
  def step() -> float:
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(x).to(device)), torch.from_numpy(y).long().to(device))
    loss.backward()
    optimizer.step()
    return loss.item()
  return median_ms(step, warmup=3, steps=steps)

class Lookup:
  def __init__(self, vocab: int, width: int) -> None: self.table, self.head = nn.Embedding(vocab, width), nn.Linear(width, vocab)
  def __call__(self, ids: Tensor) -> Tensor: return self.head(self.table(ids))

def jitted_step(model: Any) -> Callable[[Tensor, Tensor], Tensor]:
  optimizer = AdamW(get_parameters(model), lr=1e-3)
  @TinyJit
  def step(ids: Tensor, labels: Tensor) -> Tensor:
    optimizer.zero_grad()
    loss = model(ids).sparse_categorical_crossentropy(labels)
    loss.backward()
    optimizer.step()
    return loss
  return step

def index_check_row(name: str, make_model: Callable[[], Any], vocab: int, tokens: tuple[int, int], steps: int) -> None:
  """Replays of the same step captured with CHECK_INDEX=1 and =0, alternating; medians, and the kernels one replay runs."""
  rng = np.random.default_rng(0)
  ids, labels = rng.integers(0, vocab, tokens).astype(np.int32), rng.integers(0, vocab, tokens).astype(np.int32)
  medians, kernels, runs = {}, {}, {}
  for check in (1, 0):
    with Context(CHECK_INDEX=check):
      Tensor.manual_seed(0)
      step = jitted_step(make_model())
      for _ in range(3): step(Tensor(ids), Tensor(labels)).numpy()  # run, capture, first replay
    GlobalCounters.reset()
    step(Tensor(ids), Tensor(labels)).numpy()
    kernels[check], runs[check] = GlobalCounters.kernel_count, step
  times: dict[int, list[float]] = {1: [], 0: []}
  for _ in range(steps):
    for check in (1, 0):
      start = time.perf_counter()
      runs[check](Tensor(ids), Tensor(labels)).numpy()
      times[check].append(time.perf_counter() - start)
  for check in (1, 0): medians[check] = statistics.median(times[check]) * 1e3
  print(f"{name:22s} {medians[1]:12.3f} {medians[0]:12.3f} {medians[1] / medians[0]:8.3f}x {kernels[1]:6d} {kernels[0]:6d}")

def index_check_table(steps: int) -> None:
  sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
  from gpt import GPT  # noqa: E402 (examples/ is not a package)
  print(f"\n{'index checks':22s} {'CHECK_INDEX=1':>12s} {'CHECK_INDEX=0':>12s} {'ratio':>9s} {'kernels 1 / 0':>13s}")
  index_check_row("Embedding+Linear+loss", lambda: Lookup(512, 64), 512, (32, 64), steps)
  index_check_row("GPT (examples/gpt.py)", lambda: GPT(96, 64, 96, 2, 4), 96, (16, 64), steps)

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--only", choices=("train", "checks"), help="print one of the two tables")
  args = parser.parse_args()
  print(f"device {Device.DEFAULT}; medians of {args.steps} steps")
  if args.only != "checks": train_table(args.steps)
  if args.only != "train": index_check_table(args.steps)

def train_table(steps: int) -> None:
  rng = np.random.default_rng(0)
  x, y = rng.random((128, 1, 28, 28), dtype=np.float32), rng.integers(0, 10, 128).astype(np.int32)
  torch_device = "cuda" if Device.DEFAULT in ("CUDA", "GPU") and torch.cuda.is_available() else "cpu"
  print(f"torch on {torch_device} ({torch.get_num_threads()} threads)")
  print(f"{'train step':12s} {'tinyc ms':>9s} {'torch ms':>9s} {'tinyc/torch':>12s} {'tinyc first 3 steps':>20s}")
  for name, model in {"MLP": TinyMLP(), "CNN": TinyCNN()}.items():
    (ours, first_s), (theirs, _) = tinyc_step_ms(model, x, y, steps), torch_step_ms(torch_models()[name], x, y, steps, torch_device)
    print(f"{name:12s} {ours:9.3f} {theirs:9.3f} {ours / theirs:11.2f}x {first_s:18.1f} s")

if __name__ == "__main__":
  main()
