"""Layer 1: small utilities, environment configuration (read at use time) and global counters. Imports nothing from tinyc.

Glossary of the abbreviations used across tinyc:
  st    ShapeTracker          buf   buffer            idx   index expression      acc  accumulator (of a reduce)
  alu   arithmetic UOp/op     uop   one linearized IR op  ast  a kernel's LazyOp tree  lb   LazyBuffer
  ptr   pointer to a buffer   np    numpy             gidx  global loop index     ridx reduce loop index
"""
from __future__ import annotations
import contextlib, contextvars, functools, itertools, math, os, sys, threading, time
from typing import Any, Callable, Generic, Iterable, Iterator, Sequence, TypeVar

T = TypeVar("T")

prod: Callable[[Iterable[Any]], Any] = math.prod  # (itself, not a function calling it: every buffer made asks for its size)
def dedup(xs: Iterable[T]) -> list[T]: return list(dict.fromkeys(xs))
def argsort(xs: Sequence[Any]) -> list[int]: return sorted(range(len(xs)), key=xs.__getitem__)
def all_int(xs: Iterable[Any]) -> bool: return all(isinstance(x, int) for x in xs)
def all_same(xs: Sequence[Any]) -> bool: return all(x == xs[0] for x in xs)
def flatten(xss: Iterable[Iterable[T]]) -> list[T]: return [x for xs in xss for x in xs]
def round_up(n: int, multiple: int) -> int: return (n + multiple - 1) // multiple * multiple
def partition(xs: Iterable[T], keep: Callable[[T], bool]) -> tuple[list[T], list[T]]:
  yes: list[T] = []
  no: list[T] = []
  for x in xs: (yes if keep(x) else no).append(x)
  return yes, no
def argfix(*xs: Any) -> tuple[Any, ...]:
  """Accept both f(1, 2) and f((1, 2)) / f([1, 2])."""
  return tuple(xs[0]) if len(xs) == 1 and isinstance(xs[0], (tuple, list)) else tuple(xs)
def unique_counter() -> Iterator[int]: return itertools.count()

Fn = TypeVar("Fn", bound=Callable[..., Any])
def keyword_aliases(**aliases: str) -> Callable[[Fn], Fn]:
  """Let a function take other names for its keyword arguments: @keyword_aliases(arg="bounds") makes f(arg=x) mean f(bounds=x)
  (tinygrad's names beside tinyc's, which follow torch's)."""
  def decorate(fn: Fn) -> Fn:
    @functools.wraps(fn)
    def call(*args: Any, **kwargs: Any) -> Any:
      for alias, name in aliases.items():
        if alias in kwargs:
          if name in kwargs: raise TypeError(f"{fn.__name__}() got both {alias}= and {name}=, two names for one argument")
          kwargs[name] = kwargs.pop(alias)
      return fn(*args, **kwargs)
    return call  # type: ignore[return-value]
  return decorate

# os.environ.get takes ~0.7 us (an unset name raises and catches a KeyError inside) and an eager realize reads several settings: on
# POSIX, names are looked up in the dict of encoded names that os.environ keeps and updates in place on every change
_posix_environ = getattr(os.environ, "_data", None) if os.name == "posix" else None
_ENVIRON: Any = _posix_environ if isinstance(_posix_environ, dict) else os.environ
def _environ_name(key: str) -> bytes | str: return key.encode() if _ENVIRON is not os.environ else key

def getenv(key: str, default: Any = 0) -> Any:
  """The environment variable `key` converted to the type of `default`; read each call so changes take effect at once."""
  return default if (raw := _ENVIRON.get(_environ_name(key))) is None else type(default)(os.fsdecode(raw))

class ContextVar:
  """A setting read from the environment at use time, which `Context(...)` can override for a block. An override holds in the
  thread (and asyncio task) that made it, as torch.no_grad() does: another thread's `with Context(BEAM=2)` does not change this one's."""
  _registry: dict[str, ContextVar] = {}
  def __new__(cls, key: str, default: Any) -> ContextVar:
    if key in cls._registry: return cls._registry[key]
    instance = super().__new__(cls)
    instance.key, instance.default, instance.overrides = key, default, contextvars.ContextVar(f"tinyc.{key}", default=())
    instance.name = _environ_name(key)
    cls._registry[key] = instance
    return instance
  key: str
  name: bytes | str  # the key as _ENVIRON names it
  default: Any
  overrides: contextvars.ContextVar[tuple[Any, ...]]  # this thread's stack of overrides, innermost last
  @property
  def value(self) -> Any:
    # read several times by every eager realize: one frame fewer than getenv
    if overrides := self.overrides.get(): return overrides[-1]
    return self.default if (raw := _ENVIRON.get(self.name)) is None else type(self.default)(os.fsdecode(raw))
  def __bool__(self) -> bool: return bool(self.value)
  def __ge__(self, other: Any) -> bool: return self.value >= other
  def __gt__(self, other: Any) -> bool: return self.value > other
  def __le__(self, other: Any) -> bool: return self.value <= other
  def __lt__(self, other: Any) -> bool: return self.value < other
  def __repr__(self) -> str: return f"ContextVar({self.key}={self.value!r})"

@contextlib.contextmanager
def Context(**settings: Any) -> Iterator[None]:
  """Override settings for a block: `with Context(DEBUG=2, NOOPT=1): ...`."""
  variables = [ContextVar(key, type(value)()) for key, value in settings.items()]
  tokens = [var.overrides.set(var.overrides.get() + (value,)) for var, value in zip(variables, settings.values())]
  try: yield
  finally:
    for var, token in reversed(list(zip(variables, tokens))): var.overrides.reset(token)

DEBUG, BEAM, NOOPT, CI = ContextVar("DEBUG", 0), ContextVar("BEAM", 0), ContextVar("NOOPT", 0), ContextVar("CI", "")
CPU_THREADS = ContextVar("CPU_THREADS", 0)  # threads a CPU kernel may use; 0: one per core this process may run on, 1: serial
ALLOW_TF32 = ContextVar("ALLOW_TF32", 0)  # 1: float32 matmuls may run on TF32 tensor cores (10-bit mantissas in the products), as torch's allow_tf32
PROFILE = ContextVar("PROFILE", "")  # 1: record a trace and print a summary at exit (profiler.py); a path other than 1: the trace goes there
PARALLEL_BUILD = ContextVar("PARALLEL_BUILD", 4)  # a schedule with this many new kernels builds them in worker processes at once; 0: never
PACK = ContextVar("PACK", 1)  # 0: a matmul reads its operands as they are (tensor_nn.py), never through a copy contiguous along
# the reduce, and a CPU does not split its sum for the cache (lazy.py)
WINOGRAD = ContextVar("WINOGRAD", 1)  # 0: float32 3x3 convs run directly, never by Winograd's transforms (tensor_winograd.py)
AUTOCAST = ContextVar("AUTOCAST", "")  # float16 or bfloat16: matmuls and convs compute in it, as inside `tinyc.autocast(...)` (amp.py)
CHECK_INDEX = ContextVar("CHECK_INDEX", 1)  # 0: index tensors are not checked for out-of-range values (index_check.py), which then read 0

class ThreadRecorder(Generic[T]):
  """Nested per-thread recordings: inside `with recorder.record() as items:`, everything this thread passes to `note` lands in items
  (TinyJit records a step's kernels and index checks this way, so other threads' work stays out)."""
  class _Local(threading.local):
    stack: list[list[Any]] | tuple[()] = ()  # this thread's recordings, innermost last (a class default: getattr's miss raises inside)
  def __init__(self) -> None: self._local = ThreadRecorder._Local()
  @contextlib.contextmanager
  def record(self) -> Iterator[list[T]]:
    stack: list[list[T]] = self._local.__dict__.setdefault("stack", [])  # (this thread's own)
    items: list[T] = []
    stack.append(items)
    try: yield items
    finally: stack.pop()
  def note(self, item: T) -> None:
    if (stack := self._local.stack): stack[-1].append(item)

class _Counters:
  """What the realizes since the last reset() ran: kernels, FLOPs, bytes moved, seconds spent in kernels. Totals of the process:
  with several threads they count every thread's kernels (updates take a lock, so none is lost). One object with slots, not class
  attributes: every kernel launch counts, and writing a class attribute costs ~0.1 us (it invalidates the type's caches)."""
  __slots__ = ("kernel_count", "global_ops", "global_mem", "time_sum_s", "mem_used", "lock")
  def __init__(self) -> None:
    self.kernel_count, self.global_ops, self.global_mem, self.time_sum_s = 0, 0, 0, 0.0
    self.mem_used = 0  # bytes held by live device buffers (not reset; counted by device.py's Allocator)
    self.lock = threading.RLock()  # reentrant: a Buffer freed by the garbage collector while this thread holds it updates mem_used too
  def reset(self) -> None: self.kernel_count, self.global_ops, self.global_mem, self.time_sum_s = 0, 0, 0, 0.0
  def add(self, kernels: int = 0, ops: int = 0, mem: int = 0, seconds: float = 0.0) -> None:
    with self.lock:
      self.kernel_count += kernels
      self.global_ops += ops
      self.global_mem += mem
      self.time_sum_s += seconds
GlobalCounters = _Counters()

def rates(flops: int, mem_bytes: int, seconds: float) -> tuple[float, float]:
  """(GFLOP/s, GB/s) of a kernel that took `seconds`: what DEBUG=2 prints and the profiler sums."""
  return flops / seconds * 1e-9, mem_bytes / seconds * 1e-9

class Timing(contextlib.ContextDecorator):
  """Print how long a block took: `with Timing("schedule: "): ...`."""
  def __init__(self, prefix: str = "", enabled: bool = True) -> None: self.prefix, self.enabled = prefix, enabled
  def __enter__(self) -> Timing:
    self.start = time.perf_counter_ns()
    return self
  def __exit__(self, *exc: Any) -> None:
    self.elapsed_ns = time.perf_counter_ns() - self.start
    if self.enabled: print(f"{self.prefix}{self.elapsed_ns * 1e-6:.2f} ms")

@functools.lru_cache(maxsize=None)
def warn_once(message: str) -> None:
  """Print `message` to stderr the first time this process gives it (a cache location that cannot be used, for one)."""
  print(f"tinyc: {message}", file=sys.stderr)

def colored(text: str, color: str | None) -> str:
  codes = {"red": 31, "green": 32, "yellow": 33, "blue": 34, "magenta": 35, "cyan": 36, "white": 37}
  return f"\u001b[{codes[color]}m{text}\u001b[0m" if color else text
def to_function_name(text: str) -> str: return "".join(c if c.isalnum() or c == "_" else f"{ord(c):02X}" for c in text)
