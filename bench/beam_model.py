"""BEAM's learned cost model (issue 16): collect a dataset, train a model on it, evaluate it on kernels held out of training.

  python bench/beam_model.py collect [--fuzz 40] [--steps 2]   search a corpus with BEAM=2, every candidate recorded (dataset.py)
  python bench/beam_model.py train [--out PATH] [--device KEY]  fit the model on a device's rows; safetensors, with its feature scaling
  python bench/beam_model.py eval [--model PATH] [--device KEY] held-out kernels: Kendall tau, top pick within 10% of the best, best in top 4

--device is a prefix of the dataset's device keys (default this machine's, e.g. LLVM; CUDA for rows recorded on a GPU elsewhere).
The defaults are the shipped models' settings (`--steps 300 --mse 0 --ensemble 5`, chosen by 4-fold cross-validation over the
training kernels, not on the held-out ones): `collect` then `train` on another device makes its model (BEAM_MODEL=path uses it).

The corpus (`corpus`): matmuls in four layouts and bf16, the training steps of bench_train's GPT (three sizes), CNN and MLP, random
programs of the graph fuzzer (test/test_graph_fuzz.py) and larger random programs. Rows go to the cache's sqlite file (CACHEDB). A kernel is
held out of training by its hash (one in four), so held-out kernels are other programs, not other Opt lists of trained ones.

The model scores candidates from the features of codegen/features.py (scaled by the training rows' mean and deviation), lower
meaning faster; only the order within one kernel matters, since a search step builds just the few it ranks first. It is an MLP of
two hidden layers of 64, trained with tinyc (AdamW, full batches of all kernels, each padded to the most candidates, with a mask)
on a listwise loss (ListNet, loss_fn) plus an optional squared error; `--ensemble N` trains N seeds and saves their mean as one
MLP N times as wide (ensemble), which the search's numpy inference runs unchanged.
"""
from __future__ import annotations
import argparse, hashlib, os, statistics, sys, time
from pathlib import Path
import numpy as np
sys.path.insert(0, str(Path(__file__).parent)); sys.path.insert(0, str(Path(__file__).parents[1] / "test"))
from tinyc import Device, Tensor
from tinyc.dtype import dtypes
from tinyc.helpers import Context
from tinyc.ops import LoadOps
from tinyc.schedule import create_schedule
from tinyc.codegen.dataset import candidates, targets
from tinyc.codegen.search import ast_text
from tinyc.codegen.features import FEATURE_NAMES, features
from tinyc.codegen.kernel import Kernel, KernelOptError
from tinyc.nn import Linear
from tinyc.nn.optim import AdamW
from tinyc.nn.state import get_parameters, safe_save
from tinyc.safetensors import read_arrays
from tinyc.codegen.cost_model import CostModel
from tinyc import beam

MATMULS = ((256, 256, 256), (512, 128, 384), (1024, 64, 256), (200, 300, 100), (2048, 512, 128), (4096, 384, 384), (384, 1536, 4096))
SHAPES = ((4096,), (65536,), (512, 512), (64, 1000), (256, 384), (8, 64, 256), (16, 128, 96), (3, 224, 224), (1024, 1024), (32, 32, 32),
          (100, 3000))

def corpus(fuzz: int) -> list:
  """The kernels (ASTs, deduplicated) to search: matmuls in four layouts (and bf16), the training steps of bench_train's GPT (its GPU
  and CPU sizes and one between), CNN and MLP, `fuzz` random programs of the graph fuzzer and as many larger ones (shaped_program)."""
  import bench_train as bt
  from test_graph_fuzz import random_program
  graphs: list[Tensor] = []
  for m, n, k in MATMULS:
    a, b = Tensor.empty(m, k), Tensor.empty(k, n)
    graphs += [a @ b, Tensor.empty(k, m).T @ b, a @ Tensor.empty(n, k).T, Tensor.empty(k, m).T @ Tensor.empty(n, k).T]
    graphs.append((a.cast(dtypes.bfloat16) @ b.cast(dtypes.bfloat16)).cast(dtypes.float32))
  for config in (bt.GPT_GPU, bt.GPT_CPU, bt.GPTConfig(4, 256, 4, 256, 16)):
    model = bt.examples_gpt()(config.vocab, config.context, config.width, config.layers, config.heads)
    ids, labels = (Tensor(part.astype(np.int32)) for part in bt.gpt_batch(config))
    graphs += gradients(model, lambda model: model(ids).sparse_categorical_crossentropy(labels))
  images, classes = Tensor.empty(128, 1, 28, 28), Tensor.zeros(128, dtype=dtypes.int32)
  for small in (bt.TinyCNN(), bt.TinyMLP()): graphs += gradients(small, lambda model: model(images).sparse_categorical_crossentropy(classes))
  for seed in range(fuzz): graphs += [t for t, _ in random_program(seed)] + [shaped_program(seed)]
  asts = [item.ast for item in create_schedule([t.lazydata for t in graphs]) if item.ast.op not in LoadOps]
  return list(dict.fromkeys(ast for ast in asts if not Kernel(ast).vars))

def gradients(model, loss) -> list[Tensor]:
  params = get_parameters(model)
  for p in params: p.requires_grad = True
  loss(model).backward()
  return [p.grad for p in params if p.grad is not None]

def shaped_program(seed: int) -> Tensor:
  """A random elementwise, reduce, normalizing, transposing or softmax program on real-size data (the graph fuzzer's are tiny)."""
  rng = np.random.default_rng(seed)
  shape = SHAPES[rng.integers(len(SHAPES))]
  x = Tensor.empty(*shape) * Tensor.empty(*shape) + 1
  kind = rng.random()
  if kind < 0.3: return (x.exp() * 2).sum(int(rng.integers(len(shape))))
  if kind < 0.5: return x.max(-1) if len(shape) > 1 else x.relu()
  if kind < 0.7: return (x - x.mean(-1, keepdim=True)).square().mean(-1) if len(shape) > 1 else x.sqrt()
  if kind < 0.85 and len(shape) > 1: return x.transpose(0, -1).contiguous() * 2
  return x.softmax(-1)

def collect(args: argparse.Namespace) -> None:
  device = Device[Device.DEFAULT]
  known = {ast_text(ast) for ast, key, *_ in candidates() if key == beam.device_key(device)}
  asts = [ast for ast in corpus(args.fuzz) if ast_text(ast) not in known]  # (collect again: only the kernels not searched yet)
  print(f"{len(asts)} kernels to search on {device.name} ({len(known)} searched before)", flush=True)
  started = time.perf_counter()
  # every candidate of a step built (BEAM_MODEL=0): a model's data must not be only what a model already prefers
  os.environ.update(BEAM_MAX_STEPS=str(args.steps), BEAM_PROGRESS="0", IGNORE_BEAM_CACHE="1", BEAM_MODEL="0")
  for number, ast in enumerate(asts):
    with Context(BEAM=2): beam.search(device, ast)
    print(f"  {number + 1}/{len(asts)} searched, {time.perf_counter() - started:.0f} s", flush=True)

def held_out(ast) -> bool: return hashlib.sha256(repr(ast).encode()).digest()[0] % 4 == 0

def rows(device_key_prefix: str, held: bool) -> dict:
  """{kernel AST: [(features, seconds)]} of this device's built, timed candidates, held-out kernels or the others."""
  found: dict = {}
  device_targets = targets()
  for ast, device, opts, built, seconds in candidates():
    if not device.startswith(device_key_prefix) or not built or not seconds or held_out(ast) != held: continue
    kernel = Kernel(ast, device_targets[device])
    try:
      for opt in opts: kernel.apply_opt(opt)
    except KernelOptError: continue  # (recorded by another version of tinyc)
    found.setdefault(ast, []).append((features(kernel), seconds))
  return {ast: items for ast, items in found.items() if len(items) >= 3}

class Model:
  def __init__(self, hidden: tuple[int, ...] = (64, 64)) -> None:
    sizes = [len(FEATURE_NAMES), *hidden, 1]
    self.layers = [Linear(fan_in, fan_out) for fan_in, fan_out in zip(sizes, sizes[1:])]
    self.mean, self.scale = Tensor.zeros(len(FEATURE_NAMES)), Tensor.ones(len(FEATURE_NAMES))
  def __call__(self, x: Tensor) -> Tensor:
    x = (x - self.mean) / self.scale
    for layer in self.layers[:-1]: x = layer(x).relu()
    return self.layers[-1](x).squeeze(-1)
  def state(self) -> dict[str, Tensor]:
    return {"mean": self.mean, "scale": self.scale, **{f"layer{i}.{name}": getattr(layer, name) for i, layer in enumerate(self.layers)
                                                         for name in ("weight", "bias")}}
  def arrays(self) -> dict[str, np.ndarray]: return {name: tensor.numpy().copy() for name, tensor in self.state().items()}

def padded(data: dict) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
  """The kernels' candidates as (kernels, most candidates, features) features, log2 times and a mask of the real candidates."""
  width = max(len(items) for items in data.values())
  x = np.zeros((len(data), width, len(FEATURE_NAMES)), np.float32)
  logs, mask = np.zeros((len(data), width), np.float32), np.zeros((len(data), width), np.float32)
  for number, items in enumerate(data.values()):
    x[number, :len(items)] = [f for f, _ in items]
    logs[number, :len(items)] = np.log2([seconds for _, seconds in items])
    mask[number, :len(items)] = 1
  return x, logs, mask

def loss_fn(model: Model, x: Tensor, logs: np.ndarray, mask: np.ndarray, args: argparse.Namespace) -> Tensor:
  """ListNet: per kernel, the cross-entropy between softmax(-log2 time / T) of the measured times and softmax(-score) of the model's,
  plus `mse` times the squared error of the scores against the log2 times relative to the kernel's best, capped at `cap` (how slow
  a slow candidate is matters little), less the kernel's mean of both."""
  best = np.where(mask > 0, logs, np.inf).min(1, keepdims=True)
  target = np.exp(-(logs - best) / args.temperature) * mask
  target /= target.sum(1, keepdims=True)
  scores = model(x)
  log_q = (-scores + Tensor((mask - 1) * 1e4)).log_softmax(1)
  listnet = -(log_q * Tensor(target)).sum(1).mean()
  if not args.mse: return listnet
  rel = np.minimum(logs - best, args.cap) * mask
  rel = (rel - rel.sum(1, keepdims=True) / mask.sum(1, keepdims=True)) * mask
  m = Tensor(mask)
  centered = (scores - (scores * m).sum(1, keepdim=True) / m.sum(1, keepdim=True)) * m
  return listnet + args.mse * ((centered - Tensor(rel)) ** 2).sum() / float(mask.sum())

def fit(data: dict, args: argparse.Namespace, steps: int, validation: dict | None = None) -> tuple[Model, list]:
  """Train a model on `data` for `steps` full-batch steps; with `validation`, its metrics every 50 steps."""
  x_np, logs, mask = padded(data)
  flat = x_np[mask > 0]
  Tensor.manual_seed(args.seed)
  model = Model(tuple(args.hidden))
  model.mean, model.scale = Tensor(flat.mean(0)), Tensor(flat.std(0) + 1e-3)
  params = [p for layer in model.layers for p in (layer.weight, layer.bias)]
  optimizer = AdamW(params, lr=args.lr, weight_decay=args.wd)
  x, history = Tensor(x_np), []
  Tensor.training = True
  for step in range(steps):
    optimizer.zero_grad()
    loss = loss_fn(model, x, logs, mask, args)
    loss.backward()
    optimizer.step()
    if validation is not None and ((step + 1) % 50 == 0 or step == steps - 1):
      Tensor.training = False
      history.append((step + 1, loss.item(), metrics(CostModel(model.arrays()), validation)))
      Tensor.training = True
      print(f"  step {step + 1}: loss {history[-1][1]:.4f}, validation {describe(history[-1][2])}", flush=True)
  Tensor.training = False
  return model, history

def ensemble(members: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
  """Several MLPs of one shape (and one scaling) as one MLP computing their mean: layers side by side, hidden ones block-diagonal."""
  merged, count = {"mean": members[0]["mean"], "scale": members[0]["scale"]}, sum(1 for name in members[0] if name.endswith(".weight"))
  for i in range(count):
    weights, biases = [m[f"layer{i}.weight"] for m in members], [m[f"layer{i}.bias"] for m in members]
    if i == 0: merged[f"layer{i}.weight"] = np.concatenate(weights)
    elif i < count - 1:
      block = np.zeros((sum(w.shape[0] for w in weights), sum(w.shape[1] for w in weights)), np.float32)
      for n, w in enumerate(weights): block[n * w.shape[0]:(n + 1) * w.shape[0], n * w.shape[1]:(n + 1) * w.shape[1]] = w
      merged[f"layer{i}.weight"] = block
    else: merged[f"layer{i}.weight"] = np.concatenate(weights, 1) / len(members)
    merged[f"layer{i}.bias"] = np.concatenate(biases) if i < count - 1 else np.mean(biases, 0)
  return merged

def split(data: dict) -> tuple[dict, dict]:
  """The training kernels split for validation by another byte of their hash, one in five validating."""
  chosen = {ast: hashlib.sha256(repr(ast).encode()).digest()[1] % 5 == 0 for ast in data}
  return {a: v for a, v in data.items() if not chosen[a]}, {a: v for a, v in data.items() if chosen[a]}

def train(args: argparse.Namespace) -> None:
  started = time.perf_counter()
  data = rows(args.device, held=False)
  print(f"training on {len(data)} kernels, {sum(len(items) for items in data.values())} candidates", flush=True)
  steps = args.steps
  if args.validate:  # choose the number of steps on a fifth of the training kernels, then train on all of them
    fitting, validating = split(data)
    print(f"validating on {len(validating)} of them", flush=True)
    _, history = fit(fitting, args, args.steps, validating)
    steps = max(history, key=lambda item: (round(item[2]["tau"], 2) + item[2]["top4"], -item[0]))[0]
    print(f"best at step {steps}")
  seeds = range(args.seed, args.seed + args.ensemble)
  members = [fit(data, argparse.Namespace(**{**vars(args), "seed": seed}), steps)[0].arrays() for seed in seeds]
  state = {name: Tensor(array) for name, array in ensemble(members).items()}
  safe_save(state, args.out, metadata={"device": args.device, "features": ",".join(FEATURE_NAMES)})
  print(f"saved {args.out} ({time.perf_counter() - started:.0f} s)")

def kendall_tau(a: list[float], b: list[float]) -> float:
  pairs = [(i, j) for i in range(len(a)) for j in range(i + 1, len(a)) if a[i] != a[j] and b[i] != b[j]]
  if not pairs: return 0.0
  return sum(1 if (a[i] - a[j]) * (b[i] - b[j]) > 0 else -1 for i, j in pairs) / len(pairs)

def metrics(model: CostModel, data: dict) -> dict[str, float]:
  """Mean Kendall tau, how often the model's top pick is within 10% of the measured best, how often the best is in its top 4."""
  taus, within, top4 = [], [], []
  for items in data.values():
    predicted = model.predict(np.array([f for f, _ in items], dtype=np.float32))
    measured = [seconds for _, seconds in items]
    taus.append(kendall_tau(predicted.tolist(), measured))
    within.append(measured[int(np.argmin(predicted))] <= 1.1 * min(measured))
    top4.append(min(measured[i] for i in np.argsort(predicted, kind="stable")[:4]) <= min(measured))
  return {"kernels": len(taus), "tau": statistics.mean(taus), "median": statistics.median(taus), "top1": statistics.mean(within),
          "top4": statistics.mean(top4)}

def describe(m: dict) -> str:
  return (f"{m['kernels']} kernels: tau mean {m['tau']:.3f} (median {m['median']:.3f}), top pick within 10% of the best {m['top1']:.0%}, "
          f"best in top 4 {m['top4']:.0%}")

def evaluate(args: argparse.Namespace) -> None:
  model = CostModel({name: array.astype(np.float32) for name, (array, _) in read_arrays(args.model).items()})
  data = rows(args.device, held=not args.trained)  # (--trained: the training kernels, to tell underfitting from overfitting)
  if not data: return print("no such kernels with 3 or more timed candidates: collect more")
  spread = {ast: items for ast, items in data.items() if max(s for _, s in items) >= 1.2 * min(s for _, s in items)}
  slow = {ast: items for ast, items in data.items() if min(s for _, s in items) >= 5e-6}
  print(f"{'training' if args.trained else 'held-out'} kernels, {sum(len(items) for items in data.values())} candidates")
  print(f"  all: {describe(metrics(model, data))}")
  print(f"  times spread >= 1.2x: {describe(metrics(model, spread))}")
  if slow: print(f"  best >= 5 us: {describe(metrics(model, slow))}")

def parser() -> argparse.ArgumentParser:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  commands = parser.add_subparsers(dest="command", required=True)
  c = commands.add_parser("collect"); c.add_argument("--fuzz", type=int, default=40); c.add_argument("--steps", type=int, default=2)
  default_path = f"beam_model_{Device.DEFAULT.lower()}.safetensors"
  t = commands.add_parser("train"); t.add_argument("--out", default=default_path); t.add_argument("--steps", type=int, default=300)
  t.add_argument("--hidden", type=int, nargs="*", default=[64, 64]); t.add_argument("--lr", type=float, default=1e-3)
  t.add_argument("--wd", type=float, default=1e-2); t.add_argument("--temperature", type=float, default=0.5)
  t.add_argument("--mse", type=float, default=0.0); t.add_argument("--cap", type=float, default=3.0); t.add_argument("--seed", type=int, default=0)
  t.add_argument("--ensemble", type=int, default=5, help="train this many models (seeds) and save their mean as one wider MLP")
  t.add_argument("--validate", action="store_true", help="pick the step count on a fifth of the training kernels first")
  e = commands.add_parser("eval"); e.add_argument("--model", default=default_path); e.add_argument("--trained", action="store_true")
  for sub in (t, e): sub.add_argument("--device", default=Device.DEFAULT, help="the device keys' prefix (CUDA: the H200 rows)")
  return parser

if __name__ == "__main__":
  args = parser().parse_args()
  {"collect": collect, "train": train, "eval": evaluate}[args.command](args)
