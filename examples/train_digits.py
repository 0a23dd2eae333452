"""Train a small CNN on scikit-learn's bundled 8x8 handwritten digits (no download) and report the test accuracy.

  python examples/train_digits.py [--epochs 12] [--batch 64] [--seed 0]

Every training step is one TinyJit call: from the third step on, the captured kernels are replayed with the new batch.
"""
from __future__ import annotations
import argparse, sys, time
import numpy as np
from tinyc import Tensor, Device, nn
from tinyc.jit import TinyJit
from tinyc.nn.optim import Adam
from tinyc.nn.state import get_parameters

class DigitsCNN:
  """conv(1->16) relu conv(16->32) relu maxpool -> linear(512->10)."""
  def __init__(self) -> None:
    self.conv1, self.conv2 = nn.Conv2d(1, 16, 3, padding=1), nn.Conv2d(16, 32, 3, padding=1)
    self.head = nn.Linear(32 * 4 * 4, 10)
  def __call__(self, x: Tensor) -> Tensor:
    x = self.conv2(self.conv1(x).relu()).relu().max_pool2d(2)
    return self.head(x.flatten(1))

def load_digits(seed: int) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
  """(train images, train labels, test images, test labels): 80/20 split, pixels scaled to [0, 1]."""
  try:
    from sklearn.datasets import load_digits as sklearn_digits
  except ImportError:
    sys.exit("this demo needs scikit-learn for its bundled digits: pip install -e '.[examples]'")
  digits = sklearn_digits()
  images, labels = (digits.images / 16.0).astype(np.float32)[:, None], digits.target.astype(np.int32)
  order = np.random.default_rng(seed).permutation(len(labels))
  split = int(0.8 * len(labels))
  return images[order[:split]], labels[order[:split]], images[order[split:]], labels[order[split:]]

def progress(done: int, total: int, text: str) -> None:
  filled = 30 * done // total
  print(f"\r[{'#' * filled}{'.' * (30 - filled)}] {done}/{total} {text}", end="", flush=True)

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--epochs", type=int, default=12)
  parser.add_argument("--batch", type=int, default=64)
  parser.add_argument("--seed", type=int, default=0)
  args = parser.parse_args()
  Tensor.manual_seed(args.seed)
  x_train, y_train, x_test, y_test = load_digits(args.seed)
  model = DigitsCNN()
  optimizer = Adam(get_parameters(model), lr=3e-3)

  @TinyJit
  def train_step(images: Tensor, labels: Tensor) -> Tensor:
    Tensor.training = True
    optimizer.zero_grad()
    loss = model(images).sparse_categorical_crossentropy(labels)
    loss.backward()
    optimizer.step()
    Tensor.training = False
    return loss

  steps_per_epoch = len(y_train) // args.batch  # whole batches only: the jitted step has one input shape
  rng = np.random.default_rng(args.seed)
  print(f"training on {Device.DEFAULT}: {len(y_train)} train / {len(y_test)} test digits, {args.epochs} epochs of {steps_per_epoch} steps")
  started = time.perf_counter()
  for epoch in range(args.epochs):
    order = rng.permutation(len(y_train))
    losses = []
    for step in range(steps_per_epoch):
      batch = order[step * args.batch:(step + 1) * args.batch]
      losses.append(train_step(Tensor(x_train[batch]), Tensor(y_train[batch])).item())
      progress(step + 1, steps_per_epoch, f"epoch {epoch + 1}/{args.epochs} loss {np.mean(losses):.3f}")
    print()
  elapsed = time.perf_counter() - started
  predictions = model(Tensor(x_test)).argmax(-1).numpy()
  accuracy = float((predictions == y_test).mean())
  print(f"trained in {elapsed:.1f} s ({elapsed / (args.epochs * steps_per_epoch) * 1e3:.2f} ms/step); test accuracy {accuracy * 100:.2f}%")

if __name__ == "__main__":
  main()
