"""A tiny character-level GPT trained on the docstrings of Python's standard library (offline), then sampled.

  python examples/gpt.py [--steps 400] [--context 64] [--width 96] [--layers 2] [--heads 4] [--tokens 200]

Pre-norm transformer blocks: causal multi-head self-attention and a GELU MLP, token + learned position embeddings.
"""
from __future__ import annotations
import argparse, importlib, inspect, itertools, time, warnings
from typing import Iterator
import numpy as np
from tinyc import Tensor, Device, nn
from tinyc.jit import TinyJit
from tinyc.nn.optim import AdamW
from tinyc.nn.state import get_parameters

STDLIB_MODULES = ("json", "re", "os", "collections", "functools", "itertools", "pathlib", "string", "textwrap", "argparse", "random",
                  "statistics", "heapq", "bisect", "dataclasses", "enum", "typing", "shutil", "tempfile", "csv", "datetime", "math")

def stdlib_docstrings() -> str:
  """The docstrings of some standard-library modules and their public members, joined."""
  texts = []
  with warnings.catch_warnings():  # reading some members' docs touches deprecated attributes
    warnings.simplefilter("ignore")
    return _collect(texts)

def _collect(texts: list[str]) -> str:
  for name in STDLIB_MODULES:
    module = importlib.import_module(name)
    for obj in [module] + [getattr(module, attr) for attr in dir(module) if not attr.startswith("_")]:
      doc = inspect.getdoc(obj) if inspect.ismodule(obj) or inspect.isclass(obj) or inspect.isroutine(obj) else None
      if doc: texts.append(doc)
  return "\n\n".join(dict.fromkeys(texts))

class SelfAttention:
  def __init__(self, width: int, heads: int) -> None:
    self.heads, self.qkv, self.proj = heads, nn.Linear(width, 3 * width), nn.Linear(width, width)
  def __call__(self, x: Tensor) -> Tensor:
    batch, time_steps, width = x.shape
    q, k, v = [t.reshape(batch, time_steps, self.heads, width // self.heads).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1)]
    return self.proj(q.scaled_dot_product_attention(k, v, is_causal=True).transpose(1, 2).reshape(batch, time_steps, width))

class Block:
  def __init__(self, width: int, heads: int) -> None:
    self.norm1, self.attention, self.norm2 = nn.LayerNorm(width), SelfAttention(width, heads), nn.LayerNorm(width)
    self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)
  def __call__(self, x: Tensor) -> Tensor:
    x = x + self.attention(self.norm1(x))
    return x + self.down(self.up(self.norm2(x)).gelu())

class GPT:
  def __init__(self, vocab: int, context: int, width: int, layers: int, heads: int) -> None:
    self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(context, width)
    for table in (self.tokens, self.positions): table.weight = table.weight * 0.02  # GPT-2's small init
    self.blocks = [Block(width, heads) for _ in range(layers)]
    self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, vocab)
    self.context = context
  def __call__(self, idx: Tensor) -> Tensor:
    x = self.tokens(idx) + self.positions(Tensor.arange(idx.shape[1]).reshape(1, -1))
    for block in self.blocks: x = block(x)
    return self.head(self.norm(x))

def generate(model: GPT, prompt: np.ndarray, rng: np.random.Generator, temperature: float = 0.8) -> Iterator[int]:
  """Continue `prompt` (token ids) one token at a time, without end (the window slides once it is full)."""
  tokens = list(prompt)
  while True:
    window = np.array(tokens[-model.context:], dtype=np.int32)[None]
    logits = model(Tensor(window))[0, -1].numpy().astype(np.float64) / temperature
    probs = np.exp(logits - logits.max())
    tokens.append(int(rng.choice(len(probs), p=probs / probs.sum())))
    yield tokens[-1]

def sample(model: GPT, prompt: np.ndarray, length: int, rng: np.random.Generator, temperature: float = 0.8) -> list[int]:
  """The next `length` tokens after `prompt`."""
  return list(itertools.islice(generate(model, prompt, rng, temperature), length))

def train(text: str, steps: int, context: int, width: int, layers: int, heads: int, batch: int = 16, seed: int = 0,
          log_every: int = 50) -> tuple[GPT, list[str], list[float]]:
  """Train on `text`; returns the model, its vocabulary and the loss of every step."""
  Tensor.manual_seed(seed)
  vocab = sorted(set(text))
  data = np.array([vocab.index(c) for c in text], dtype=np.int32)
  model = GPT(len(vocab), context, width, layers, heads)
  optimizer = AdamW(get_parameters(model), lr=3e-3, weight_decay=0.01)
  @TinyJit
  def step(x: Tensor, y: Tensor) -> Tensor:
    optimizer.zero_grad()
    loss = model(x).sparse_categorical_crossentropy(y)
    loss.backward()
    optimizer.step()
    return loss
  rng, losses = np.random.default_rng(seed), []
  for number in range(steps):
    starts = rng.integers(0, len(data) - context - 1, batch)
    x = np.stack([data[s:s + context] for s in starts])
    y = np.stack([data[s + 1:s + context + 1] for s in starts])
    losses.append(step(Tensor(x), Tensor(y)).item())
    if log_every and (number % log_every == 0 or number == steps - 1): print(f"step {number + 1:4d}/{steps} loss {np.mean(losses[-log_every:]):.3f}")
  return model, vocab, losses

def main(argv: list[str] | None = None) -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--steps", type=int, default=400)
  parser.add_argument("--context", type=int, default=64)
  parser.add_argument("--width", type=int, default=96)
  parser.add_argument("--layers", type=int, default=2)
  parser.add_argument("--heads", type=int, default=4)
  parser.add_argument("--tokens", type=int, default=200, help="tokens to sample after training")
  args = parser.parse_args(argv)
  started = time.perf_counter()
  text = stdlib_docstrings()
  print(f"training on {Device.DEFAULT}: {len(text)} characters of standard-library docstrings, {len(set(text))} distinct")
  training_started = time.perf_counter()
  model, vocab, losses = train(text, args.steps, args.context, args.width, args.layers, args.heads)
  training_s = time.perf_counter() - training_started
  print(f"trained in {training_s:.1f} s ({args.steps} steps); loss {np.mean(losses[:20]):.3f} -> {np.mean(losses[-20:]):.3f}")
  # Each window length the sampler has not seen is a new shape, and a new shape is new kernels to compile (symbolic shapes, which
  # would reuse them, are for later): so time the tokens whose window length is new apart from the rest.
  prompt_text = "Return the "
  prompt, programs = np.array([vocab.index(c) for c in prompt_text], dtype=np.int32), Device[Device.DEFAULT].programs
  tokens, lengths_seen, programs_before = [], set(), len(programs)
  seconds, counts = {True: 0.0, False: 0.0}, {True: 0, False: 0}
  stream = generate(model, prompt, np.random.default_rng(1))
  for number in range(args.tokens):
    window_length = min(len(prompt) + number, args.context)
    new_length = window_length not in lengths_seen
    lengths_seen.add(window_length)
    token_started = time.perf_counter()
    tokens.append(next(stream))
    seconds[new_length] += time.perf_counter() - token_started
    counts[new_length] += 1
  print("sample:\n" + prompt_text + "".join(vocab[t] for t in tokens))
  sampling_s = seconds[True] + seconds[False]
  print(f"sampled {args.tokens} tokens in {sampling_s:.1f} s: {seconds[True]:.1f} s for the {counts[True]} whose window length was new, "
        f"{seconds[False]:.1f} s for the {counts[False]} other{'s' if counts[False] != 1 else ''}")
  print(f"  a new window length is a new shape: sampling compiled {len(programs) - programs_before} kernels "
        "(symbolic shapes, which would reuse them, come later)")
  print(f"total {time.perf_counter() - started:.1f} s (training {training_s:.1f} s, sampling {sampling_s:.1f} s)")

if __name__ == "__main__":
  main()
