"""BEAM's learned cost model (issue 16): collect a dataset, train a model on it, evaluate it on kernels held out of training.

  python bench/beam_model.py collect [--fuzz 40] [--steps 2]   search a corpus with BEAM=2, every candidate recorded (dataset.py)
  python bench/beam_model.py train [--out PATH]                 fit the model on this device's rows; safetensors, with its feature scaling
  python bench/beam_model.py eval [--model PATH]                held-out kernels: Kendall tau, top pick within 10% of the best

The corpus: the kernels of bench_train's MLP, CNN and GPT steps (the GPT at its CPU size), matmuls in four layouts and several
shapes, and random programs of the graph fuzzer (test/test_graph_fuzz.py). Rows go to the cache's sqlite file (CACHEDB). A kernel is
held out of training by its hash (one in four), so held-out kernels are other programs, not other Opt lists of trained ones.

The model predicts a candidate's log2 time relative to the mean of its kernel's candidates (what ranking them needs) from the
features of codegen/features.py (scaled by the training rows' mean and deviation): an MLP of two hidden layers of 64, trained
with tinyc (Adam, mean squared error, full batches).
"""
from __future__ import annotations
import argparse, hashlib, os, statistics, sys, time
from pathlib import Path
import numpy as np
sys.path.insert(0, str(Path(__file__).parent)); sys.path.insert(0, str(Path(__file__).parents[1] / "test"))
from tinyc import Device, Tensor
from tinyc.helpers import Context
from tinyc.ops import LoadOps
from tinyc.schedule import create_schedule
from tinyc.codegen.dataset import candidates
from tinyc.codegen.features import FEATURE_NAMES, features
from tinyc.codegen.kernel import Kernel, KernelOptError
from tinyc.nn import Linear
from tinyc.nn.optim import Adam
from tinyc.nn.state import get_parameters, safe_load, safe_save
from tinyc import beam

def corpus(fuzz: int) -> list:
  """The kernels (ASTs, deduplicated) to search."""
  import bench_train as bt
  from test_graph_fuzz import random_program
  graphs: list[Tensor] = []
  for m, n, k in ((256, 256, 256), (512, 128, 384), (1024, 64, 256), (200, 300, 100)):
    a, b = Tensor.empty(m, k), Tensor.empty(k, n)
    graphs += [a @ b, Tensor.empty(k, m).T @ b, a @ Tensor.empty(n, k).T, Tensor.empty(k, m).T @ Tensor.empty(n, k).T]
  config = bt.GPT_CPU
  model = bt.examples_gpt()(config.vocab, config.context, config.width, config.layers, config.heads)
  ids, labels = (Tensor(part.astype(np.int32)) for part in bt.gpt_batch(config))
  params = get_parameters(model)
  for p in params: p.requires_grad = True
  model(ids).sparse_categorical_crossentropy(labels).backward()
  graphs += [p.grad for p in params if p.grad is not None]
  for seed in range(fuzz): graphs += [t for t, _ in random_program(seed)]
  asts = [item.ast for item in create_schedule([t.lazydata for t in graphs]) if item.ast.op not in LoadOps]
  return list(dict.fromkeys(ast for ast in asts if not Kernel(ast).vars))

def collect(args: argparse.Namespace) -> None:
  device, asts = Device[Device.DEFAULT], corpus(args.fuzz)
  print(f"{len(asts)} kernels to search on {device.name}", flush=True)
  started = time.perf_counter()
  os.environ.update(BEAM_MAX_STEPS=str(args.steps), BEAM_PROGRESS="0", IGNORE_BEAM_CACHE="1")
  for number, ast in enumerate(asts):
    with Context(BEAM=2): beam.search(device, ast)
    print(f"  {number + 1}/{len(asts)} searched, {time.perf_counter() - started:.0f} s", flush=True)

def held_out(ast) -> bool: return hashlib.sha256(repr(ast).encode()).digest()[0] % 4 == 0

def rows(device_key_prefix: str, held: bool) -> dict:
  """{kernel AST: [(features, seconds)]} of this device's built, timed candidates, held-out kernels or the others."""
  found: dict = {}
  for ast, device, opts, built, seconds in candidates():
    if not device.startswith(device_key_prefix) or not built or not seconds or held_out(ast) != held: continue
    kernel = Kernel(ast, Device[Device.DEFAULT].target)
    try:
      for opt in opts: kernel.apply_opt(opt)
    except KernelOptError: continue  # (recorded by another version of tinyc)
    found.setdefault(ast, []).append((features(kernel), seconds))
  return {ast: items for ast, items in found.items() if len(items) >= 3}

class Model:
  def __init__(self) -> None:
    self.layers = [Linear(len(FEATURE_NAMES), 64), Linear(64, 64), Linear(64, 1)]
    self.mean, self.scale = Tensor.zeros(len(FEATURE_NAMES)), Tensor.ones(len(FEATURE_NAMES))
  def __call__(self, x: Tensor) -> Tensor:
    x = (x - self.mean) / self.scale
    for layer in self.layers[:-1]: x = layer(x).relu()
    return self.layers[-1](x).reshape(-1)
  def state(self) -> dict[str, Tensor]:
    return {"mean": self.mean, "scale": self.scale, **{f"layer{i}.{name}": getattr(layer, name) for i, layer in enumerate(self.layers)
                                                         for name in ("weight", "bias")}}

def relative_log_times(items: list) -> np.ndarray:
  logs = np.log2([seconds for _, seconds in items])
  return (logs - logs.mean()).astype(np.float32)

def train(args: argparse.Namespace) -> None:
  data = rows(Device.DEFAULT, held=False)
  x = np.array([f for items in data.values() for f, _ in items], dtype=np.float32)
  y = np.concatenate([relative_log_times(items) for items in data.values()])
  print(f"training on {len(data)} kernels, {len(x)} candidates", flush=True)
  Tensor.manual_seed(0)
  model = Model()
  model.mean, model.scale = Tensor(x.mean(0)), Tensor(x.std(0) + 1e-3)
  params = [p for layer in model.layers for p in (layer.weight, layer.bias)]
  optimizer = Adam(params, lr=1e-3)
  inputs, targets = Tensor(x), Tensor(y)
  Tensor.training = True
  for step in range(args.steps):
    optimizer.zero_grad()
    loss = ((model(inputs) - targets) ** 2).mean()
    loss.backward()
    optimizer.step()
    if step % 200 == 0 or step == args.steps - 1: print(f"  step {step}: loss {loss.item():.4f}", flush=True)
  Tensor.training = False
  safe_save(model.state(), args.out, metadata={"device": Device.DEFAULT, "features": ",".join(FEATURE_NAMES)})
  print(f"saved {args.out}")

def kendall_tau(a: list[float], b: list[float]) -> float:
  pairs = [(i, j) for i in range(len(a)) for j in range(i + 1, len(a)) if a[i] != a[j] and b[i] != b[j]]
  if not pairs: return 0.0
  return sum(1 if (a[i] - a[j]) * (b[i] - b[j]) > 0 else -1 for i, j in pairs) / len(pairs)

def evaluate(args: argparse.Namespace) -> None:
  model, state = Model(), safe_load(args.model)
  for name, tensor in model.state().items(): tensor.assign(state[name].to(tensor.device)).realize()
  data = rows(Device.DEFAULT, held=not args.trained)  # (--trained: the training kernels, to tell underfitting from overfitting)
  if not data: return print("no such kernels with 3 or more timed candidates: collect more")
  taus, within = [], []
  for ast, items in data.items():
    predicted = model(Tensor(np.array([f for f, _ in items], dtype=np.float32))).numpy().tolist()
    measured = [seconds for _, seconds in items]
    taus.append(kendall_tau(predicted, measured))
    within.append(measured[int(np.argmin(predicted))] <= 1.1 * min(measured))
  print(f"{'training' if args.trained else 'held-out'} kernels: {len(data)}, candidates {sum(len(items) for items in data.values())}")
  print(f"Kendall tau: mean {statistics.mean(taus):.3f}, median {statistics.median(taus):.3f}")
  print(f"top pick within 10% of the best: {sum(within)}/{len(within)} = {sum(within) / max(len(within), 1):.0%}")

if __name__ == "__main__":
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  commands = parser.add_subparsers(dest="command", required=True)
  c = commands.add_parser("collect"); c.add_argument("--fuzz", type=int, default=40); c.add_argument("--steps", type=int, default=2)
  default_path = f"beam_model_{Device.DEFAULT.lower()}.safetensors"
  t = commands.add_parser("train"); t.add_argument("--out", default=default_path); t.add_argument("--steps", type=int, default=1000)
  e = commands.add_parser("eval"); e.add_argument("--model", default=default_path); e.add_argument("--trained", action="store_true")
  args = parser.parse_args()
  {"collect": collect, "train": train, "eval": evaluate}[args.command](args)
