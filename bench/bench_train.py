"""Training-step benchmark: tinyc (TinyJit, Adam) beside PyTorch (eager, Adam) on the CPU, same model shapes, one run.

  python bench/bench_train.py [--steps 20]

MLP: 784-128-10, batch 128. CNN: conv3x3(1->8) relu conv3x3(8->16) relu flatten linear(9216->10), 28x28 inputs, batch 128.
Medians of replayed steps (the first steps, which compile and capture, are not timed).
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

def median_ms(step: Callable[[], object], warmup: int, steps: int) -> float:
  for _ in range(warmup): step()
  times = []
  for _ in range(steps):
    start = time.perf_counter()
    step()
    times.append(time.perf_counter() - start)
  return statistics.median(times) * 1e3

def tinyc_step_ms(model: object, x: np.ndarray, y: np.ndarray, steps: int) -> float:
  optimizer = Adam(get_parameters(model), lr=1e-3)
  @TinyJit
  def step(images: Tensor, labels: Tensor) -> Tensor:
    optimizer.zero_grad()
    loss = model(images).sparse_categorical_crossentropy(labels)  # type: ignore[operator]
    loss.backward()
    optimizer.step()
    return loss
  return median_ms(lambda: step(Tensor(x), Tensor(y)), warmup=3, steps=steps)

def torch_step_ms(model: torch.nn.Module, x: np.ndarray, y: np.ndarray, steps: int) -> float:
  optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
  def step() -> torch.Tensor:
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(x)), torch.from_numpy(y).long())
    loss.backward()
    optimizer.step()
    return loss
  return median_ms(step, warmup=3, steps=steps)

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--steps", type=int, default=20)
  args = parser.parse_args()
  rng = np.random.default_rng(0)
  x, y = rng.random((128, 1, 28, 28), dtype=np.float32), rng.integers(0, 10, 128).astype(np.int32)
  print(f"device {Device.DEFAULT}; torch threads {torch.get_num_threads()}; medians of {args.steps} steps")
  print(f"{'train step':12s} {'tinyc ms':>9s} {'torch ms':>9s} {'tinyc/torch':>12s}  target")
  for (name, model), target in zip({"MLP": TinyMLP(), "CNN": TinyCNN()}.items(), (3, 6)):
    ours, theirs = tinyc_step_ms(model, x, y, args.steps), torch_step_ms(torch_models()[name], x, y, args.steps)
    print(f"{name:12s} {ours:9.2f} {theirs:9.2f} {ours / theirs:11.2f}x  <= {target}x {'met' if ours / theirs <= target else 'NOT met'}")

if __name__ == "__main__":
  main()
