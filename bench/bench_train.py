"""Training-step benchmark: tinyc (TinyJit, Adam/AdamW) beside PyTorch, same models, one run. On the CPU, or with CUDA=1 / GPU=1
on the GPU (PyTorch then runs on CUDA too); BEAM=2 searches every kernel during the first steps.

  python bench/bench_train.py [--steps 20] [--only train|gpt|sdpa|checks]

Tables, all by default, one with --only:
train: MLP 784-128-10 and CNN conv3x3(1->8) relu conv3x3(8->16) relu flatten linear(9216->10), 28x28 inputs, batch 128, Adam;
  tinyc against PyTorch eager.
gpt: examples/gpt.py's GPT (pre-norm blocks: causal self-attention through scaled_dot_product_attention(is_causal=True), a tanh-GELU
  MLP 4x wide; token + learned position embeddings, a final layernorm, an LM head) beside the same model in torch.nn (TorchGPT: the
  same parameter names and shapes, the same ops), AdamW(lr 1e-3, weight decay 0.01), cross-entropy over random bytes (vocab 256,
  fixed seed). On a GPU the issue's size: 6 layers, width 384, 6 heads, context 512, batch 8; on the CPU 2 layers, width 128,
  4 heads, context 256, batch 8. Rows: tinyc fp32; torch eager fp32; torch.compile fp32 (the model compiled, the optimizer eager;
  printed as unavailable, with the reason, where torch cannot compile); tinyc bf16 mixed precision (pending until tinyc has an
  autocast); torch eager under torch.autocast(bfloat16). tinyc's rows print the kernels one replayed step launches.
sdpa: causal scaled_dot_product_attention forward + backward ((out * upstream).sum().backward(), one TinyJit step on tinyc's side),
  fp32 and bf16, q k v 8 x 16 x 2048 x 64 on a GPU (torch's bf16 through the flash-attention kernel on CUDA), 2 x 4 x 256 x 64 on the
  CPU; and GlobalCounters.global_mem of tinyc's forward alone (each kernel's buffers, whole) against the bytes of q, k, v and output.
checks: the cost of the index checks (CHECK_INDEX=1 against 0, tinyc/index_check.py), the two steps' replays alternating: a lookup
  step (Embedding(512, 64) -> Linear(64, 512) -> sparse_categorical_crossentropy, 32 x 64 tokens), all its kernels being the ones
  an index check rides beside, and examples/gpt.py's GPT (vocab 96, context 64, width 96, 2 layers, 4 heads, batch 16), with AdamW.

Medians of replayed steps, each ending with a result on the host (the loss; for sdpa one element of a gradient); the first steps
(compile, capture, BEAM search; torch.compile's compiling) are timed apart.
"""
from __future__ import annotations
import argparse, contextlib, math, os, statistics, sys, time
from typing import Any, Callable, ContextManager, NamedTuple
import numpy as np
import tinyc
from tinyc import Context, GlobalCounters, Tensor, Device, dtypes, nn
from tinyc.dtype import DType
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

def jitted_step(model: Any, precision: Callable[[], ContextManager[object]] = contextlib.nullcontext) -> Callable[[Tensor, Tensor], Tensor]:
  """A TinyJit training step with AdamW; `precision`: what the forward and the loss run under (an autocast for mixed precision)."""
  optimizer = AdamW(get_parameters(model), lr=1e-3)
  @TinyJit
  def step(ids: Tensor, labels: Tensor) -> Tensor:
    optimizer.zero_grad()
    with precision(): loss = model(ids).sparse_categorical_crossentropy(labels)
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
  GPT = examples_gpt()
  print(f"\n{'index checks':22s} {'CHECK_INDEX=1':>12s} {'CHECK_INDEX=0':>12s} {'ratio':>9s} {'kernels 1 / 0':>13s}")
  index_check_row("Embedding+Linear+loss", lambda: Lookup(512, 64), 512, (32, 64), steps)
  index_check_row("GPT (examples/gpt.py)", lambda: GPT(96, 64, 96, 2, 4), 96, (16, 64), steps)

# ***** GPT training step and causal attention: examples/gpt.py's GPT beside the same model in torch.nn *****

class GPTConfig(NamedTuple):
  layers: int
  width: int
  heads: int
  context: int
  batch: int
  vocab: int = 256  # bytes

GPT_GPU, GPT_CPU = GPTConfig(6, 384, 6, 512, 8), GPTConfig(2, 128, 4, 256, 8)
SDPA_GPU, SDPA_CPU = (8, 16, 2048, 64), (2, 4, 256, 64)  # (batch, heads, sequence, head dim) of q, k and v
TABLES = ("train", "gpt", "sdpa", "checks")

def examples_gpt() -> Any:
  """examples/gpt.py's GPT class (examples/ is not a package)."""
  sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "examples"))
  from gpt import GPT  # noqa: E402
  return GPT

class TorchAttention(torch.nn.Module):
  def __init__(self, width: int, heads: int) -> None:
    super().__init__()
    self.heads, self.qkv, self.proj = heads, torch.nn.Linear(width, 3 * width), torch.nn.Linear(width, width)
  def forward(self, x: torch.Tensor) -> torch.Tensor:
    batch, time_steps, width = x.shape
    q, k, v = [t.reshape(batch, time_steps, self.heads, width // self.heads).transpose(1, 2) for t in self.qkv(x).chunk(3, dim=-1)]
    out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
    return self.proj(out.transpose(1, 2).reshape(batch, time_steps, width))

class TorchBlock(torch.nn.Module):
  def __init__(self, width: int, heads: int) -> None:
    super().__init__()
    self.norm1, self.attention, self.norm2 = torch.nn.LayerNorm(width), TorchAttention(width, heads), torch.nn.LayerNorm(width)
    self.up, self.down = torch.nn.Linear(width, 4 * width), torch.nn.Linear(4 * width, width)
  def forward(self, x: torch.Tensor) -> torch.Tensor:
    x = x + self.attention(self.norm1(x))
    return x + self.down(torch.nn.functional.gelu(self.up(self.norm2(x)), approximate="tanh"))  # tinyc's gelu is the tanh form

class TorchGPT(torch.nn.Module):
  """examples/gpt.py's GPT in torch.nn: the same shapes and ops."""
  def __init__(self, config: GPTConfig) -> None:
    super().__init__()
    self.tokens, self.positions = torch.nn.Embedding(config.vocab, config.width), torch.nn.Embedding(config.context, config.width)
    with torch.no_grad():
      for table in (self.tokens, self.positions): table.weight.mul_(0.02)  # as examples/gpt.py
    self.blocks = torch.nn.ModuleList(TorchBlock(config.width, config.heads) for _ in range(config.layers))
    self.norm, self.head = torch.nn.LayerNorm(config.width), torch.nn.Linear(config.width, config.vocab)
  def forward(self, idx: torch.Tensor) -> torch.Tensor:
    x = self.tokens(idx) + self.positions(torch.arange(idx.shape[1], device=idx.device))
    for block in self.blocks: x = block(x)
    return self.head(self.norm(x))

class StepRow(NamedTuple):
  ms: float
  first_s: float  # the first three steps (tinyc: run, capture, first replay; torch.compile: compiling)
  loss: float  # the last step's
  kernels: int | None = None  # launches of one replayed step (tinyc)

def gpt_batch(config: GPTConfig) -> tuple[np.ndarray, np.ndarray]:
  """Random bytes (a fixed seed): the inputs and, one position on, the labels."""
  tokens = np.random.default_rng(0).integers(0, 256, (config.batch, config.context + 1), dtype=np.uint8)
  return tokens[:, :-1], tokens[:, 1:]

def tinyc_autocast_bf16() -> Callable[[], ContextManager[object]] | str:
  """What the tinyc bf16 row runs its forward under (bf16 activations and matmuls, fp32 master weights), or why it cannot run."""
  autocast = getattr(tinyc, "autocast", None)
  if autocast is None: return "pending: tinyc has no autocast API yet"
  return lambda: autocast(dtypes.bfloat16)

def tinyc_gpt_row(config: GPTConfig, steps: int, precision: Callable[[], ContextManager[object]] = contextlib.nullcontext) -> StepRow:
  Tensor.manual_seed(0)
  step = jitted_step(examples_gpt()(config.vocab, config.context, config.width, config.layers, config.heads), precision)
  ids, labels = (part.astype(np.int32) for part in gpt_batch(config))
  losses: list[float] = []
  ms, first_s = median_ms(lambda: losses.append(step(Tensor(ids), Tensor(labels)).item()), warmup=3, steps=steps)
  GlobalCounters.reset()
  step(Tensor(ids), Tensor(labels)).item()
  return StepRow(ms, first_s, losses[-1], GlobalCounters.kernel_count)

def torch_gpt_row(config: GPTConfig, steps: int, device: str, compiled: bool = False, bf16: bool = False) -> StepRow:
  """torch's step: eager or with the model under torch.compile (the optimizer eager), in fp32 or under autocast to bfloat16."""
  torch.manual_seed(0)
  model = TorchGPT(config).to(device)
  forward, optimizer = torch.compile(model) if compiled else model, torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=0.01)
  ids, labels = (part.astype(np.int64) for part in gpt_batch(config))
  def step() -> float:
    optimizer.zero_grad()
    with torch.autocast(device, dtype=torch.bfloat16) if bf16 else contextlib.nullcontext():
      logits = forward(torch.from_numpy(ids).to(device))
      loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), torch.from_numpy(labels).to(device).flatten())
    loss.backward()
    optimizer.step()
    return loss.item()
  losses: list[float] = []
  ms, first_s = median_ms(lambda: losses.append(step()), warmup=3, steps=steps)
  return StepRow(ms, first_s, losses[-1])

def gpt_table(config: GPTConfig, steps: int, torch_device: str) -> None:
  """tinyc's GPT step (TinyJit, AdamW) beside torch eager and torch.compile, in fp32 and bf16 mixed precision; the ratio column is
  tinyc's time over the row's (fp32 rows against tinyc fp32, bf16 rows against tinyc bf16)."""
  print(f"\nGPT train step: {config.layers} layers, width {config.width}, {config.heads} heads, context {config.context}, batch "
        f"{config.batch}, vocab {config.vocab}, AdamW; torch on {torch_device}")
  print(f"{'GPT step':24s} {'ms':>9s} {'tinyc/this':>11s} {'first 3 steps':>14s} {'loss':>7s} {'kernels':>8s}")
  def show(name: str, row: StepRow | str, tinyc_ms: float | None) -> None:
    if isinstance(row, str): return print(f"{name:24s} {row}")
    ratio = f"{tinyc_ms / row.ms:10.2f}x" if tinyc_ms is not None else ""
    print(f"{name:24s} {row.ms:9.2f} {ratio:>11s} {row.first_s:12.1f} s {row.loss:7.3f} {'-' if row.kernels is None else row.kernels:>8}")
  ours = tinyc_gpt_row(config, steps)
  show("tinyc fp32", ours, None)
  show("torch eager fp32", torch_gpt_row(config, steps, torch_device), ours.ms)
  def reason(error: Exception) -> str: return f"{type(error).__name__}: {(str(error).strip().splitlines() or [''])[0]}"
  try: show("torch.compile fp32", torch_gpt_row(config, steps, torch_device, compiled=True), ours.ms)
  except Exception as error: show("torch.compile fp32", f"unavailable: {reason(error)}", None)  # no triton, no C++ compiler, ...
  autocast = tinyc_autocast_bf16()
  try: ours_bf16 = autocast if isinstance(autocast, str) else tinyc_gpt_row(config, steps, autocast)
  except Exception as error: ours_bf16 = f"failed: {reason(error)}"  # an autocast whose call differs from tinyc_autocast_bf16's guess
  show("tinyc bf16 autocast", ours_bf16, None)
  show("torch eager bf16 autocast", torch_gpt_row(config, steps, torch_device, bf16=True), None if isinstance(ours_bf16, str) else ours_bf16.ms)

def tinyc_sdpa_ms(shape: tuple[int, ...], dtype: DType, steps: int) -> tuple[float, int]:
  """(median ms of causal attention forward + backward as one TinyJit step, GlobalCounters.global_mem of the forward alone)."""
  Tensor.manual_seed(0)
  q, k, v, upstream = (Tensor.randn(*shape, dtype=dtype).realize() for _ in range(4))
  @TinyJit
  def forward_backward(q: Tensor, k: Tensor, v: Tensor, upstream: Tensor) -> list[Tensor]:
    leaves = [Tensor(t.lazydata, requires_grad=True) for t in (q, k, v)]
    (leaves[0].scaled_dot_product_attention(leaves[1], leaves[2], is_causal=True) * upstream).sum().backward()
    grads = [leaf.grad for leaf in leaves if leaf.grad is not None]
    return [*grads, grads[-1][:1, :1, :1, :1].contiguous()]  # the last, one element, is read on the host: the step has finished
  ms, _ = median_ms(lambda: forward_backward(q, k, v, upstream)[-1].numpy(), warmup=3, steps=steps)
  GlobalCounters.reset()
  q.scaled_dot_product_attention(k, v, is_causal=True).realize()
  return ms, GlobalCounters.global_mem

def torch_sdpa_ms(shape: tuple[int, ...], dtype: torch.dtype, steps: int, device: str) -> tuple[float, str]:
  """(median ms of torch's causal attention forward + backward, the backend): bf16 on CUDA through the flash-attention kernel."""
  torch.manual_seed(0)
  q, k, v = (torch.randn(*shape, device=device, dtype=dtype, requires_grad=True) for _ in range(3))
  upstream = torch.randn(*shape, device=device, dtype=dtype)
  flash = device == "cuda" and dtype == torch.bfloat16
  def step() -> float:
    for t in (q, k, v): t.grad = None
    with torch.nn.attention.sdpa_kernel(torch.nn.attention.SDPBackend.FLASH_ATTENTION) if flash else contextlib.nullcontext():
      (torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True) * upstream).sum().backward()
    assert v.grad is not None
    return v.grad[0, 0, 0, 0].item()
  return median_ms(step, warmup=3, steps=steps)[0], "flash" if flash else "default"

def sdpa_table(shape: tuple[int, ...], steps: int, torch_device: str) -> None:
  """Causal scaled_dot_product_attention forward + backward, (q * upstream).sum().backward() on both sides; and the bytes tinyc's
  forward moves (GlobalCounters.global_mem: each kernel's buffers, whole) against those of q, k, v and the output."""
  import torch.nn.attention  # noqa: F401 (sdpa_kernel)
  print(f"\ncausal SDPA forward+backward, q k v {' x '.join(map(str, shape))}; torch on {torch_device}")
  print(f"{'SDPA':12s} {'tinyc ms':>9s} {'torch ms':>9s} {'tinyc/torch':>12s} {'forward global_mem / qkvo bytes':>32s}  torch backend")
  for name, dtype, torch_dtype in (("fp32", dtypes.float32, torch.float32), ("bf16", dtypes.bfloat16, torch.bfloat16)):
    (ours, moved), (theirs, backend) = tinyc_sdpa_ms(shape, dtype, steps), torch_sdpa_ms(shape, torch_dtype, steps, torch_device)
    qkvo = 4 * math.prod(shape) * dtype.itemsize
    print(f"{name:12s} {ours:9.3f} {theirs:9.3f} {ours / theirs:11.2f}x {moved / 1e6:12.1f} / {qkvo / 1e6:.1f} MB = {moved / qkvo:5.1f}x  {backend}")

def main() -> None:
  parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
  parser.add_argument("--steps", type=int, default=20)
  parser.add_argument("--only", choices=TABLES, help="print one of the tables")
  args = parser.parse_args()
  print(f"device {Device.DEFAULT}; medians of {args.steps} steps")
  torch_device = "cuda" if Device.DEFAULT in ("CUDA", "GPU") and torch.cuda.is_available() else "cpu"
  on_gpu = Device.DEFAULT in ("CUDA", "GPU")
  if args.only in (None, "train"): train_table(args.steps)
  if args.only in (None, "gpt"): gpt_table(GPT_GPU if on_gpu else GPT_CPU, args.steps, torch_device)
  if args.only in (None, "sdpa"): sdpa_table(SDPA_GPU if on_gpu else SDPA_CPU, args.steps, torch_device)
  if args.only in (None, "checks"): index_check_table(args.steps)

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
