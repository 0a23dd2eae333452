"""Training-step benchmark: tinyc (TinyJit, Adam) beside PyTorch (eager, Adam), same model shapes, one run. On the CPU, or with
CUDA=1 / GPU=1 on the GPU (PyTorch then runs on CUDA too); BEAM=2 searches every kernel during the first steps.

  python bench/bench_train.py [--steps 20]

MLP: 784-128-10, batch 128. CNN: conv3x3(1->8) relu conv3x3(8->16) relu flatten linear(9216->10), 28x28 inputs, batch 128.
Medians of replayed steps, each ending with the loss on the host; the first steps (compile, capture, BEAM search) are timed apart.
"""
from __future__ import annotations
import argparse, statistics, time
from typing import Callable
import numpy as np
from tinyc import Tensor, Device, nn
from tinyc.jit import TinyJit
from tinyc.nn.optim import Adam
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

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--steps", type=int, default=20)
  args = parser.parse_args()
  rng = np.random.default_rng(0)
  x, y = rng.random((128, 1, 28, 28), dtype=np.float32), rng.integers(0, 10, 128).astype(np.int32)
  torch_device = "cuda" if Device.DEFAULT in ("CUDA", "GPU") and torch.cuda.is_available() else "cpu"
  print(f"device {Device.DEFAULT}; torch on {torch_device} ({torch.get_num_threads()} threads); medians of {args.steps} steps")
  print(f"{'train step':12s} {'tinyc ms':>9s} {'torch ms':>9s} {'tinyc/torch':>12s} {'tinyc first 3 steps':>20s}")
  for name, model in {"MLP": TinyMLP(), "CNN": TinyCNN()}.items():
    (ours, first_s), (theirs, _) = tinyc_step_ms(model, x, y, args.steps), torch_step_ms(torch_models()[name], x, y, args.steps, torch_device)
    print(f"{name:12s} {ours:9.3f} {theirs:9.3f} {ours / theirs:11.2f}x {first_s:18.1f} s")

if __name__ == "__main__":
  main()
