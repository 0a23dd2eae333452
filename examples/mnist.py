"""Train a CNN on MNIST: a real IDX reader, a downloader that never leaves a partial file, and a TinyJit training loop.

  python examples/mnist.py [--data-dir ~/.cache/tinyc/mnist] [--epochs 1] [--no-download]

The four files (train/t10k images/labels, gzipped IDX) are fetched into --data-dir if they are not there yet.
"""
from __future__ import annotations
import argparse, gzip, hashlib, os, struct, sys, tempfile, time, urllib.request
from pathlib import Path
import numpy as np
from tinyc import Tensor, Device, nn
from tinyc.jit import TinyJit
from tinyc.nn.optim import Adam
from tinyc.nn.state import get_parameters

MIRROR = "https://storage.googleapis.com/cvdf-datasets/mnist/"
FILES = {"train_images": "train-images-idx3-ubyte.gz", "train_labels": "train-labels-idx1-ubyte.gz",
         "test_images": "t10k-images-idx3-ubyte.gz", "test_labels": "t10k-labels-idx1-ubyte.gz"}
IDX_TYPES = {0x08: np.uint8, 0x09: np.int8, 0x0B: np.dtype(">i2"), 0x0C: np.dtype(">i4"), 0x0D: np.dtype(">f4"), 0x0E: np.dtype(">f8")}

def read_idx(path: str | os.PathLike) -> np.ndarray:
  """An IDX file (optionally gzipped) as a numpy array; a malformed file raises ValueError naming the path and the problem."""
  path = Path(path)
  raw = path.read_bytes()
  if raw[:2] == b"\x1f\x8b":
    try: raw = gzip.decompress(raw)
    except (OSError, EOFError) as error: raise ValueError(f"{path}: not a valid gzip file: {error}") from error
  if len(raw) < 4 or raw[:2] != b"\x00\x00": raise ValueError(f"{path}: not an IDX file (bad magic number)")
  type_code, ndim = raw[2], raw[3]
  if type_code not in IDX_TYPES: raise ValueError(f"{path}: unknown IDX element type 0x{type_code:02x}")
  header = 4 + 4 * ndim
  if len(raw) < header: raise ValueError(f"{path}: truncated IDX header ({len(raw)} bytes for {ndim} dims)")
  shape = struct.unpack(f">{ndim}I", raw[4:header])
  dtype = np.dtype(IDX_TYPES[type_code])
  expected = int(np.prod(shape, dtype=np.int64)) * dtype.itemsize
  if len(raw) - header != expected:
    raise ValueError(f"{path}: IDX data is {len(raw) - header} bytes, but shape {shape} of {dtype} needs {expected}")
  return np.frombuffer(raw, dtype=dtype, offset=header).reshape(shape).astype(dtype.newbyteorder("="))

def download(url: str, destination: Path, sha256: str | None = None) -> Path:
  """Fetch url to destination through a temporary file in the same folder, so an interrupted download leaves nothing."""
  destination.parent.mkdir(parents=True, exist_ok=True)
  handle, temporary = tempfile.mkstemp(dir=destination.parent, prefix=destination.name, suffix=".part")
  try:
    with os.fdopen(handle, "wb") as out, urllib.request.urlopen(url, timeout=60) as response:
      while chunk := response.read(1 << 20): out.write(chunk)
    if sha256 is not None and hashlib.sha256(Path(temporary).read_bytes()).hexdigest() != sha256:
      raise ValueError(f"{url}: checksum mismatch; not saved")
    os.replace(temporary, destination)
  except BaseException:
    Path(temporary).unlink(missing_ok=True)
    raise
  return destination

def load_mnist(data_dir: Path, allow_download: bool = True) -> dict[str, np.ndarray]:
  """The four MNIST arrays, fetched into data_dir first where missing."""
  arrays = {}
  for key, name in FILES.items():
    path = data_dir / name
    if not path.exists():
      if not allow_download: raise FileNotFoundError(f"{path} is missing (run without --no-download to fetch it from {MIRROR})")
      print(f"downloading {MIRROR + name}")
      download(MIRROR + name, path)
    arrays[key] = read_idx(path)
  return arrays

class MnistCNN:
  """conv(1->8) relu maxpool conv(8->16) relu maxpool -> linear(400->10)."""
  def __init__(self) -> None:
    self.conv1, self.conv2, self.head = nn.Conv2d(1, 8, 3), nn.Conv2d(8, 16, 3), nn.Linear(16 * 5 * 5, 10)
  def __call__(self, x: Tensor) -> Tensor:
    x = self.conv1(x).relu().max_pool2d(2)
    return self.head(self.conv2(x).relu().max_pool2d(2).flatten(1))

def train(data: dict[str, np.ndarray], epochs: int, batch: int, seed: int = 0) -> float:
  """Train MnistCNN on data; returns the test accuracy."""
  Tensor.manual_seed(seed)
  images, labels = (data["train_images"] / 255.0).astype(np.float32)[:, None], data["train_labels"].astype(np.int32)
  model = MnistCNN()
  optimizer = Adam(get_parameters(model), lr=1e-3)
  @TinyJit
  def step(x: Tensor, y: Tensor) -> Tensor:
    Tensor.training = True
    optimizer.zero_grad()
    loss = model(x).sparse_categorical_crossentropy(y)
    loss.backward()
    optimizer.step()
    Tensor.training = False
    return loss
  rng, steps = np.random.default_rng(seed), len(labels) // batch
  for epoch in range(epochs):
    order = rng.permutation(len(labels))
    for number in range(steps):
      chosen = order[number * batch:(number + 1) * batch]
      loss = step(Tensor(images[chosen]), Tensor(labels[chosen])).item()
      if number % 50 == 0 or number == steps - 1: print(f"\repoch {epoch + 1}/{epochs} step {number + 1}/{steps} loss {loss:.3f}", end="", flush=True)
    print()
  test_images = (data["test_images"] / 255.0).astype(np.float32)[:, None]
  predictions = np.concatenate([model(Tensor(test_images[i:i + 1000])).argmax(-1).numpy() for i in range(0, len(test_images), 1000)])
  return float((predictions == data["test_labels"]).mean())

def main(argv: list[str] | None = None) -> float:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--data-dir", type=Path, default=Path.home() / ".cache" / "tinyc" / "mnist")
  parser.add_argument("--epochs", type=int, default=1)
  parser.add_argument("--batch", type=int, default=128)
  parser.add_argument("--no-download", action="store_true", help="fail instead of fetching missing files")
  args = parser.parse_args(argv)
  try: data = load_mnist(args.data_dir, allow_download=not args.no_download)
  except (OSError, ValueError) as error: sys.exit(f"could not load MNIST: {error}")
  print(f"training on {Device.DEFAULT}: {len(data['train_labels'])} train / {len(data['test_labels'])} test images")
  started = time.perf_counter()
  accuracy = train(data, args.epochs, min(args.batch, len(data["train_labels"])))
  print(f"trained in {time.perf_counter() - started:.1f} s; test accuracy {accuracy * 100:.2f}%")
  return accuracy

if __name__ == "__main__":
  main()
