"""Start-up benchmark: the first three steps of the GPT training row (TinyJit: the first call runs, the second captures, the third
replays), each start in a fresh process: tinyc with empty caches (cold: every kernel lowered and compiled, in worker processes),
tinyc again with the caches the cold start filled (warm: every kernel loaded from disk), and PyTorch's first three eager steps of
the same model. Then examples/gpt.py's sampling of 200 tokens after training (3 steps here) in a fresh process with empty caches
(its decode kernels compiled once for every position, a symbolic one), beside PyTorch sampling them from the same model untrained,
each step running its window (its time does not depend on the weights).
On the CPU, or with CUDA=1 / GPU=1 (PyTorch then runs on CUDA too).

  python bench/bench_start.py [--layers 2]

The model is examples/gpt.py's GPT (vocab 96, context 64, width 96, 4 heads, batch 16) with AdamW, as in bench_train.py.
"""
from __future__ import annotations
import argparse, json, os, subprocess, sys, tempfile, time
import numpy as np

VOCAB, CONTEXT, WIDTH, HEADS, BATCH = 96, 64, 96, 4, 16
PROMPT, TOKENS = 11, 200  # sampling: a prompt's length ("Return the "), the tokens sampled after it

def batch() -> tuple[np.ndarray, np.ndarray]:
  rng = np.random.default_rng(0)
  return rng.integers(0, VOCAB, (BATCH, CONTEXT)).astype(np.int32), rng.integers(0, VOCAB, (BATCH, CONTEXT)).astype(np.int32)

def tinyc_first_steps(layers: int) -> dict[str, object]:
  sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
  from gpt import GPT  # noqa: E402 (examples/ is not a package)
  from bench_train import jitted_step  # the GPT row's step: AdamW, TinyJit
  from tinyc import Device, GlobalCounters, Tensor
  Tensor.manual_seed(0)
  step = jitted_step(GPT(VOCAB, CONTEXT, WIDTH, layers, HEADS))
  ids, labels = batch()
  started = time.perf_counter()
  for _ in range(3): step(Tensor(ids), Tensor(labels)).numpy()
  seconds = time.perf_counter() - started
  GlobalCounters.reset()
  step(Tensor(ids), Tensor(labels)).numpy()
  device = Device[Device.DEFAULT]
  return {"seconds": seconds, "launches": GlobalCounters.kernel_count, "programs": len(device.programs), **device.builds}

def torch_gpt(layers: int) -> object:
  import torch
  class TorchGPT(torch.nn.Module):
    def __init__(self) -> None:
      super().__init__()
      self.tokens, self.positions = torch.nn.Embedding(VOCAB, WIDTH), torch.nn.Embedding(CONTEXT, WIDTH)
      self.blocks = torch.nn.ModuleList(torch.nn.TransformerEncoderLayer(WIDTH, HEADS, 4 * WIDTH, dropout=0.0, activation="gelu",
                                                                         batch_first=True, norm_first=True) for _ in range(layers))
      self.norm, self.head = torch.nn.LayerNorm(WIDTH), torch.nn.Linear(WIDTH, VOCAB)
    def forward(self, idx: torch.Tensor) -> torch.Tensor:
      x = self.tokens(idx) + self.positions(torch.arange(idx.shape[1], device=idx.device))
      mask = torch.nn.Transformer.generate_square_subsequent_mask(idx.shape[1], device=idx.device)
      for block in self.blocks: x = block(x, src_mask=mask, is_causal=True)
      return self.head(self.norm(x))
  return TorchGPT()

def torch_first_steps(layers: int, device: str) -> dict[str, object]:
  import torch
  torch.manual_seed(0)
  ids, labels = batch()
  started = time.perf_counter()
  model = torch_gpt(layers).to(device)
  optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
  for _ in range(3):
    optimizer.zero_grad()
    loss = torch.nn.functional.cross_entropy(model(torch.from_numpy(ids).long().to(device)).flatten(0, 1),
                                             torch.from_numpy(labels).long().to(device).flatten())
    loss.backward()
    optimizer.step()
    loss.item()
  return {"seconds": time.perf_counter() - started}

def tinyc_sampling(layers: int) -> dict[str, object]:
  sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
  import gpt  # noqa: E402 (examples/ is not a package)
  from tinyc import Device
  model, _, _ = gpt.train(gpt.stdlib_docstrings(), 3, CONTEXT, WIDTH, layers, HEADS, log_every=0)  # as examples/gpt.py: after training
  programs = Device[Device.DEFAULT].programs
  before, started = len(programs), time.perf_counter()
  gpt.sample(model, np.arange(PROMPT, dtype=np.int32), TOKENS, np.random.default_rng(1))
  return {"seconds": time.perf_counter() - started, "programs": len(programs) - before}

def torch_sampling(layers: int, device: str) -> dict[str, object]:
  import torch
  torch.manual_seed(0)
  model, tokens, rng = torch_gpt(layers).to(device).eval(), list(range(PROMPT)), np.random.default_rng(1)
  started = time.perf_counter()
  with torch.no_grad():
    for _ in range(TOKENS):
      logits = model(torch.tensor([tokens[-CONTEXT:]], device=device))[0, -1].double().cpu().numpy() / 0.8
      probs = np.exp(logits - logits.max())
      tokens.append(int(rng.choice(len(probs), p=probs / probs.sum())))
  return {"seconds": time.perf_counter() - started}

def in_fresh_process(what: str, layers: int, cache_dir: str) -> dict[str, object]:
  environment = {**os.environ, "CACHE_DIR": cache_dir}
  environment.pop("CACHEDB", None)  # the cache file lives in CACHE_DIR
  command = [sys.executable, os.path.abspath(__file__), "--child", what, "--layers", str(layers)]
  out = subprocess.run(command, env=environment, capture_output=True, text=True, check=True).stdout
  return json.loads(out.strip().splitlines()[-1])

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--layers", type=int, default=2)
  parser.add_argument("--child", choices=("tinyc", "torch", "tinyc-sample", "torch-sample"), help=argparse.SUPPRESS)
  args = parser.parse_args()
  from tinyc import Device
  torch_device = "cuda" if Device.DEFAULT in ("CUDA", "GPU") and __import__("torch").cuda.is_available() else "cpu"
  if args.child == "tinyc": return print(json.dumps(tinyc_first_steps(args.layers)))
  if args.child == "torch": return print(json.dumps(torch_first_steps(args.layers, torch_device)))
  if args.child == "tinyc-sample": return print(json.dumps(tinyc_sampling(args.layers)))
  if args.child == "torch-sample": return print(json.dumps(torch_sampling(args.layers, torch_device)))
  print(f"device {Device.DEFAULT}; the first three steps of GPT ({args.layers} layers, width {WIDTH}, context {CONTEXT}, batch {BATCH}), "
        "each start a fresh process")
  print(f"{'start':12s} {'seconds':>8s} {'built':>6s} {'in workers':>10s} {'from disk':>10s} {'programs':>9s} {'launches/step':>14s}")
  with tempfile.TemporaryDirectory(prefix="tinyc_start_") as cache_dir:
    for name in ("tinyc cold", "tinyc warm"):
      row = in_fresh_process("tinyc", args.layers, cache_dir)
      print(f"{name:12s} {row['seconds']:8.2f} {row.get('built', 0):6d} {row.get('in workers', 0):10d} {row.get('from disk', 0):10d} "
            f"{row['programs']:9d} {row['launches']:14d}")
    print(f"{'torch eager':12s} {in_fresh_process('torch', args.layers, cache_dir)['seconds']:8.2f}   (on {torch_device})")
  with tempfile.TemporaryDirectory(prefix="tinyc_sample_") as cache_dir:
    ours, theirs = in_fresh_process("tinyc-sample", args.layers, cache_dir), in_fresh_process("torch-sample", args.layers, cache_dir)
  print(f"\nsampling {TOKENS} tokens after a {PROMPT}-token prompt and training (empty caches): tinyc {ours['seconds']:.2f} s "
        f"({ours['programs']} programs compiled), torch eager {theirs['seconds']:.2f} s (on {torch_device})   (target <= 2 s)")

if __name__ == "__main__":
  main()
