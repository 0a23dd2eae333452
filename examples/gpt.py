"""A tiny character-level GPT trained on the docstrings of Python's standard library (offline), then sampled.

  python examples/gpt.py [--steps 400] [--context 64] [--width 96] [--layers 2] [--heads 4] [--tokens 200] [--dtype float32]

Pre-norm transformer blocks: causal multi-head self-attention and a GELU MLP, token + learned position embeddings. Sampling
decodes one token a step into per-layer key-value caches, its position a bound Variable, so its kernels compile once.
`--dtype bfloat16` (or float16, with a GradScaler) trains in mixed precision: the forward under `tinyc.autocast`, float32 weights.
"""
from __future__ import annotations
import argparse, importlib, inspect, itertools, time, warnings
from typing import Iterator
import numpy as np
from tinyc import Tensor, Device, Variable, autocast, dtypes, nn
from tinyc.amp import GradScaler
from tinyc.dtype import DType
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
  def __init__(self, width: int, heads: int, context: int) -> None:
    self.heads, self.context, self.qkv, self.proj = heads, context, nn.Linear(width, 3 * width), nn.Linear(width, width)
    self.caches: list[Tensor] = []  # each position's key and value, made by the first decoding step (so no optimizer sees them)
  def __call__(self, x: Tensor, start: Variable | None = None) -> Tensor:
    """Attend causally over x; or, given `start` (a bound Variable), x is the one token at that position: its key and value go into
    the caches, and it attends to the positions 0..start they hold."""
    batch, time_steps, width = x.shape
    q, k, v = [t.reshape(batch, time_steps, self.heads, width // self.heads).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1)]
    if start is None: out = q.scaled_dot_product_attention(k, v, is_causal=True)
    else:
      if not self.caches: self.caches = [Tensor.zeros(1, self.heads, self.context, width // self.heads).contiguous().realize() for _ in "kv"]
      here = Tensor.arange(self.context).reshape(1, 1, -1, 1) == Tensor(start)  # the position is a kernel argument
      for cache, new in zip(self.caches, (k, v)): cache.assign(here.where(new.expand(cache.shape), cache))
      seen = (None, None, (0, start + 1), None)  # a symbolic length: one set of kernels for every position
      out = q.scaled_dot_product_attention(*[cache.shrink(seen) for cache in self.caches])
    return self.proj(out.transpose(1, 2).reshape(batch, time_steps, width))

class Block:
  def __init__(self, width: int, heads: int, context: int) -> None:
    self.norm1, self.attention, self.norm2 = nn.LayerNorm(width), SelfAttention(width, heads, context), nn.LayerNorm(width)
    self.up, self.down = nn.Linear(width, 4 * width), nn.Linear(4 * width, width)
  def __call__(self, x: Tensor, start: Variable | None = None) -> Tensor:
    x = x + self.attention(self.norm1(x), start)
    return x + self.down(self.up(self.norm2(x)).gelu())

class GPT:
  def __init__(self, vocab: int, context: int, width: int, layers: int, heads: int) -> None:
    self.tokens, self.positions = nn.Embedding(vocab, width), nn.Embedding(context, width)
    for table in (self.tokens, self.positions): table.weight = table.weight * 0.02  # GPT-2's small init
    self.blocks = [Block(width, heads, context) for _ in range(layers)]
    self.norm, self.head = nn.LayerNorm(width), nn.Linear(width, vocab)
    self.context = context
  def __call__(self, idx: Tensor) -> Tensor:
    x = self.tokens(idx) + self.positions(Tensor.arange(idx.shape[1]).reshape(1, -1))
    for block in self.blocks: x = block(x)
    return self.head(self.norm(x))
  def decode(self, token: Tensor, start: Variable) -> Tensor:
    """The next token's logits after `token` (1 x 1) at position `start`, the positions before it in the attention caches."""
    x = self.tokens(token) + self.positions.weight.shrink(((start, start + 1), None)).reshape(1, 1, -1)
    for block in self.blocks: x = block(x, start)
    return self.head(self.norm(x))[0, -1].realize()

def generate(model: GPT, prompt: np.ndarray, rng: np.random.Generator, temperature: float = 0.8, cached: bool = True) -> Iterator[int]:
  """Continue `prompt` (token ids) one token at a time, without end (the window slides once it is full). While the window grows,
  each step decodes the new token into the caches (`cached`; else it runs the whole window: each length a new shape to compile).
  A full window slides, which moves every token's position: each step then runs the whole window, always of one shape."""
  tokens, decoded, position = list(prompt), 0, Variable("position", 0, model.context - 1)
  decode, whole_window = TinyJit(model.decode), TinyJit(lambda window: model(window)[0, -1].realize())
  Tensor.no_grad, no_grad = True, Tensor.no_grad
  try:
    while True:
      if cached and len(tokens) <= model.context:
        for decoded in range(decoded, len(tokens)): logits = decode(Tensor([[tokens[decoded]]], dtype=dtypes.int32), position.bind(decoded))
        decoded += 1
      else:
        window = Tensor(np.array(tokens[-model.context:], dtype=np.int32)[None])
        logits = whole_window(window) if cached else model(window)[0, -1]
      probs = np.exp((scaled := logits.numpy().astype(np.float64) / temperature) - scaled.max())
      tokens.append(int(rng.choice(len(probs), p=probs / probs.sum())))
      yield tokens[-1]
  finally: Tensor.no_grad = no_grad

def sample(model: GPT, prompt: np.ndarray, length: int, rng: np.random.Generator, temperature: float = 0.8, cached: bool = True) -> list[int]:
  """The next `length` tokens after `prompt`."""
  return list(itertools.islice(generate(model, prompt, rng, temperature, cached), length))

def train(text: str, steps: int, context: int, width: int, layers: int, heads: int, batch: int = 16, seed: int = 0,
          log_every: int = 50, dtype: DType = dtypes.float32) -> tuple[GPT, list[str], list[float]]:
  """Train on `text`; returns the model, its vocabulary and the loss of every step. With a 16-bit `dtype` the forward runs under
  autocast (matmuls in 16 bits, softmax, layernorm and the loss in float32) and the weights stay float32; float16 scales the loss."""
  Tensor.manual_seed(seed)
  vocab = sorted(set(text))
  data = np.array([vocab.index(c) for c in text], dtype=np.int32)
  model = GPT(len(vocab), context, width, layers, heads)
  optimizer = AdamW(get_parameters(model), lr=3e-3, weight_decay=0.01)
  scaler = GradScaler(enabled=dtype == dtypes.float16)  # bfloat16 has float32's range: its gradients need no scaling
  @TinyJit
  def step(x: Tensor, y: Tensor) -> Tensor:
    optimizer.zero_grad()
    with autocast(dtype, enabled=dtype != dtypes.float32): loss = model(x).sparse_categorical_crossentropy(y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
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
  parser.add_argument("--dtype", choices=["float32", "bfloat16", "float16"], default="float32", help="what the forward computes in")
  args = parser.parse_args(argv)
  started = time.perf_counter()
  text = stdlib_docstrings()
  print(f"training on {Device.DEFAULT} in {args.dtype}: {len(text)} characters of standard-library docstrings, {len(set(text))} distinct")
  training_started = time.perf_counter()
  model, vocab, losses = train(text, args.steps, args.context, args.width, args.layers, args.heads, dtype=getattr(dtypes, args.dtype))
  training_s = time.perf_counter() - training_started
  print(f"trained in {training_s:.1f} s ({args.steps} steps); loss {np.mean(losses[:20]):.3f} -> {np.mean(losses[-20:]):.3f}")
  # While the window grows, a step decodes one token into the caches at a symbolic position: one set of kernels for every position.
  # A full window is one shape too. So sampling compiles each kernel once, however many tokens it samples.
  prompt_text = "Return the "
  prompt, programs = np.array([vocab.index(c) for c in prompt_text], dtype=np.int32), Device[Device.DEFAULT].programs
  programs_before, sampling_started = len(programs), time.perf_counter()
  tokens = sample(model, prompt, args.tokens, np.random.default_rng(1))
  sampling_s = time.perf_counter() - sampling_started
  print("sample:\n" + prompt_text + "".join(vocab[t] for t in tokens))
  print(f"sampled {args.tokens} tokens in {sampling_s:.1f} s, compiling {len(programs) - programs_before} kernels (each once: the position is "
        "a kernel argument)")
  print(f"total {time.perf_counter() - started:.1f} s (training {training_s:.1f} s, sampling {sampling_s:.1f} s)")

if __name__ == "__main__":
  main()
