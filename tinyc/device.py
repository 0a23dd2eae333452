"""Layer 4: devices. Buffer (memory on a device), the caching allocator, Compiled (a backend assembled from an allocator, a
renderer, a compiler and a program runner) and the Device registry. Imports helpers, dtype, ops, codegen/; backends live in
runtime/ops_<name>.py and are loaded by name when first asked for.

A program is built (lowered, rendered, compiled to a binary) once per machine: the result is kept on disk (codegen/search.py's
cache, table `programs`) under a key of everything that changes it, and a schedule's new kernels build at once in the worker
processes BEAM uses (`Compiled.build_all`), since lowering is Python and compilers take 10-100 ms a kernel.
"""
from __future__ import annotations
import hashlib, importlib, itertools, json, operator, threading, time
from collections import Counter, defaultdict
from dataclasses import dataclass
from typing import Any, Callable, NamedTuple
import numpy as np
from tinyc.dtype import DType, dtypes
from tinyc.helpers import ALLOW_TF32, DEBUG, NOOPT, PARALLEL_BUILD, Context, GlobalCounters, colored, getenv, rates
from tinyc import profiler
from tinyc.ops import LazyOp, MemBuffer, format_ast
from tinyc.shape.symbolic import Variable, sym_infer
from tinyc.codegen.kernel import CPU_TARGET, Kernel, KernelTarget, Opt
from tinyc.codegen.heuristic import hand_coded_optimizations
from tinyc.codegen.linearizer import Linearizer
from tinyc.codegen.uops import ThreadKind, UOps, UOp, executed, tensor_core_flops
from tinyc.codegen.cpu_split import outer_split
from tinyc.codegen.search import ast_text, cache_execute, code_version, compile_pool

class Allocator:
  """Device memory with a free list: a freed block is kept and handed out again for the next request of the same size. Taking and
  giving back a block counts it in GlobalCounters.mem_used under that counter's lock, which also guards the free list (one lock for
  both, as every eager realize takes and frees a buffer; reentrant: the garbage collector may free a Buffer in the middle); the
  device calls run outside it."""
  def __init__(self) -> None:
    self.cache: dict[int, list[Any]] = defaultdict(list)
    self.lock = GlobalCounters.lock
  def alloc(self, nbytes: int) -> Any:
    self.lock.acquire()  # (acquire and release, not `with`, here and in free: a with statement makes two bound methods, 0.07 us more)
    try:
      if blocks := self.cache.get(nbytes):
        GlobalCounters.mem_used += nbytes
        return blocks.pop()
    finally: self.lock.release()
    try: opaque = self._alloc(nbytes)
    except MemoryError:
      self.free_cache()
      opaque = self._alloc(nbytes)
    with self.lock: GlobalCounters.mem_used += nbytes
    return opaque
  def free(self, opaque: Any, nbytes: int) -> None:
    self.lock.acquire()
    try:
      GlobalCounters.mem_used -= nbytes
      self.cache[nbytes].append(opaque)
    finally: self.lock.release()
  def free_cache(self) -> None:
    with self.lock: cache, self.cache = self.cache, defaultdict(list)
    for nbytes, blocks in cache.items():
      for block in blocks: self._free(block, nbytes)
  # what a backend provides
  def _alloc(self, nbytes: int) -> Any: raise NotImplementedError
  def _free(self, opaque: Any, nbytes: int) -> None: pass
  def copyin(self, dest: Any, src: memoryview) -> None: raise NotImplementedError
  def copyout(self, dest: memoryview, src: Any) -> None: raise NotImplementedError

class Buffer:
  """`size` elements of `dtype` on `device`; the memory is taken when first needed and given back to the allocator on delete."""
  __slots__ = ("device", "size", "dtype", "allocator", "_opaque")  # (every eager realize makes one)
  def __init__(self, device: str, size: int, dtype: DType) -> None:
    self._opaque: Any = None  # first: __del__ reads it, also after Device[device] raised
    self.device, self.size, self.dtype = device, size, dtype
    self.allocator = Device[device].allocator
  @property
  def nbytes(self) -> int: return self.size * self.dtype.itemsize
  @property
  def opaque(self) -> Any:
    if self._opaque is None: self._opaque = self.allocator.alloc(self.size * self.dtype.itemsize)
    return self._opaque
  def __del__(self) -> None:
    if self._opaque is not None: self.allocator.free(self._opaque, self.size * self.dtype.itemsize)
  def __repr__(self) -> str: return f"<Buffer {self.device} {self.size} {self.dtype.name}>"
  def copyin(self, data: np.ndarray) -> Buffer:
    assert data.nbytes == self.nbytes, f"copyin of {data.nbytes} bytes into a buffer of {self.nbytes}"
    self.allocator.copyin(self.opaque, np.ascontiguousarray(data).data.cast("B"))
    return self
  def numpy(self) -> np.ndarray:
    """The buffer's contents as a flat numpy array (bfloat16 comes back as float32)."""
    storage = np.dtype(np.uint16) if self.dtype == dtypes.bfloat16 else self.dtype.np
    out = np.empty(self.size, dtype=storage)
    if self.size: self.allocator.copyout(out.data.cast("B"), self.opaque)
    if self.dtype == dtypes.bfloat16: return (out.astype(np.uint32) << 16).view(np.float32)
    return out

def copy_buffer(buffers: list[Buffer], var_vals: dict[Variable, int] | None = None, shown: profiler.Shown | None = None) -> None:
  """buffers[0] <- buffers[1], across devices, through host memory (byte for byte, so every dtype survives). (A step, as a Program:
  it takes the arguments of one, and uses neither the values nor `shown`.)"""
  dest, src = buffers
  assert dest.nbytes == src.nbytes, f"copy of {src.nbytes} bytes into a buffer of {dest.nbytes}"
  staging = np.empty(src.nbytes, dtype=np.uint8)
  if src.nbytes:
    src.allocator.copyout(staging.data, src.opaque)
    dest.allocator.copyin(dest.opaque, staging.data)

class CompileError(RuntimeError):
  """A backend's compiler rejected a kernel's source."""

@dataclass
class Program:
  """A compiled kernel, ready to launch on its buffers (GPUs: over global_size threads in work-groups of local_size). A kernel with
  symbolic sizes takes the values of its Variables (`vars`) as int arguments after the buffers; its global size may name them too."""
  name: str
  device: str
  run: Callable[..., float | None]  # run([*opaque_buffers, *var values], global_size, local_size, wait: bool) -> seconds when wait
  flops: int  # (with symbolic sizes: at the Variables' largest values)
  mem_bytes: int
  global_size: tuple[int, int, int] | None = None  # (a symbolic size is a Node here, worked out at each run)
  local_size: tuple[int, int, int] | None = None
  vars: tuple[Variable, ...] = ()
  def __call__(self, buffers: list[Buffer], var_vals: dict[Variable, int] | None = None, shown: profiler.Shown | None = None) -> None:
    """Launch on `buffers` (outputs first). `shown`: the caller's DEBUG and PROFILE, read here where not given."""
    started = time.perf_counter() if (profiling := (shown := shown or profiler.shown()).profiling) else 0.0
    args = list(map(_opaque_of, buffers))  # (not a comprehension: in 3.11 that is a call of its own, and every eager realize launches)
    global_size: tuple[int, ...] | None = self.global_size
    if self.vars:
      args += [(var_vals or {})[var] for var in self.vars]
      if global_size is not None: global_size = tuple(sym_infer(size, var_vals or {}) for size in global_size)
    seconds = self.run(args, global_size, self.local_size, shown.timed)  # (positional: keywords cost 0.15 us a launch)
    (counters := GlobalCounters).lock.acquire()  # (GlobalCounters.add inlined, and no `with`: every eager realize launches; see Allocator)
    try:
      counters.kernel_count += 1
      counters.global_ops += self.flops
      counters.global_mem += self.mem_bytes
      if seconds is not None: counters.time_sum_s += seconds
    finally: counters.lock.release()
    if seconds is not None:
      if profiling:
        profiler.record(self.name, "kernel", started, seconds, self.device, flops=self.flops, bytes=self.mem_bytes, peaks=Device[self.device].peaks)
      if shown.debug >= 2:
        gflops, gbs = rates(self.flops, self.mem_bytes, seconds)
        print(f"{colored(f'*** {self.device:5s} {GlobalCounters.kernel_count:4d}', 'magenta')} {self.name:30s} "
              f"{seconds * 1e6:9.2f} us  {gflops:8.2f} GFLOP/s  {gbs:8.2f} GB/s")

_opaque_of = operator.attrgetter("opaque")

def launch_sizes(uops: list[UOp], max_local: int = 256) -> tuple[tuple[int, int, int], tuple[int, int, int]]:
  """(global, local) thread counts from a kernel's SPECIAL uops. With explicit work-groups (group and local ids) they are the
  kernel's; with global ids only, the local size is the largest that divides the global size in every dimension (so no thread
  is out of range), dimension 0 (the contiguous axis) first, for coalesced memory access; 1 along a symbolic dimension."""
  groups, local_size = [1, 1, 1], [1, 1, 1]
  for uop in uops:
    if uop.op is UOps.SPECIAL:
      (local_size if uop.arg.kind is ThreadKind.LOCAL else groups)[uop.arg.dim] = uop.arg.size
  if any(uop.op is UOps.SPECIAL and uop.arg.kind is ThreadKind.GLOBAL for uop in uops):
    budget = max_local
    for dim in range(3):
      size = groups[dim]
      local_size[dim] = max(d for d in range(1, min(size, budget) + 1) if size % d == 0) if isinstance(size, int) else 1
      budget //= local_size[dim]
    return (groups[0], groups[1], groups[2]), (local_size[0], local_size[1], local_size[2])
  return (groups[0] * local_size[0], groups[1] * local_size[1], groups[2] * local_size[2]), (local_size[0], local_size[1], local_size[2])

def cpu_launch_sizes(uops: list[UOp]) -> tuple[tuple[int, int, int] | None, tuple[int, int, int] | None]:
  """A CPU kernel split across threads (see codegen/cpu_split.py): ((the trips of its outermost global loop, 1, 1), (the fewest of them worth a
  thread, 1, 1)). (None, None) for a kernel that runs on one thread."""
  if (split := outer_split(uops)) is None: return None, None
  return (split[0], 1, 1), (split[1], 1, 1)

class Programs(dict[tuple[LazyOp, tuple[Opt, ...] | None, bool, bool], Program]):
  """A device's programs by (AST, Opts, settings), and a generation, new when a table is made and when it is cleared: realize.py keeps
  a plan's programs while the device's table is of the same generation (a table put in another's place, as tests do, is a new one)."""
  _generations = itertools.count()
  def __init__(self) -> None:
    super().__init__()
    self.generation = next(Programs._generations)
  def clear(self) -> None:
    self.generation = next(Programs._generations)
    super().clear()

class Compiled:
  """A backend: allocator + renderer (name, uops -> source) + compiler (name, source -> runnable) + a cache from AST to Program."""
  peaks: tuple[float, float] | None = None  # (GFLOP/s, GB/s): the device's float32 and memory ceilings where known (the profiler's "of peak")
  def __init__(self, name: str, allocator: Allocator, render: Callable[[str, list[UOp]], str], compile: Callable[[str, str], Callable[..., Any]],
               *, language: str, threads: bool = False, max_local: int = 256, target: KernelTarget = CPU_TARGET,
               compile_binary: Callable[[str, str], bytes] | None = None, load: Callable[[str, str, bytes], Callable[..., Any]] | None = None,
               arch: str = "", graph: Callable[[list], Callable[[list[Buffer]], None] | None] | None = None) -> None:
    self.name, self.allocator, self.render, self.compile = name, allocator, render, compile
    self.language = language  # what render writes, e.g. "CUDA C" (part of BEAM's cache key)
    self.threads, self.max_local = threads, max_local  # threads: global axes become GPU thread ids; max_local: the automatic work-group size
    self.target, self.arch = target, arch  # arch: the device and compiler, as far as they change the code (part of BEAM's cache key)
    # for BEAM: compile_binary (name, source) -> bytes runs in a worker process (picklable, needs no device); load makes it a runner
    self.compile_binary, self.load = compile_binary, load
    # for TinyJit: graph(steps) makes a one-launch replay of captured steps (each a program of this device and its buffers), called
    # with the replay's input buffers
    self.graph = graph
    self.programs = Programs()
    self._built: dict[str, Built] = {}  # program key -> built by build_all or found on disk, for get_program to load
    self.builds: Counter[str] = Counter()  # programs "built" (lowered and compiled; of them "in workers") and found "from disk"
    # threads: one lock guards the table of programs being compiled; each program compiles under a lock of its own,
    # so a thread wanting a program another is compiling waits for it, different programs compile at once, launches never wait
    self._lock = threading.Lock()
    self._compiling: dict[tuple[LazyOp, tuple[Opt, ...] | None, bool, bool], threading.Lock] = {}

  def get_program(self, ast: LazyOp, opts: tuple[Opt, ...] | None = None) -> Program:
    """The compiled program for `ast` with these Opts (None: the hand-coded heuristic's, or none with NOOPT=1). Thread-safe: each
    is compiled once however many threads ask for it at once."""
    key = self._memory_key(ast, opts)
    if (program := self.programs.get(key)) is not None: return program
    with self._lock: compiling = self._compiling.setdefault(key, threading.Lock())
    try:
      with compiling:
        if (program := self.programs.get(key)) is None: self.programs[key] = program = self._program(ast, opts)
    finally:
      with self._lock: self._compiling.pop(key, None)
    return program

  def build_all(self, kernels: list[tuple[LazyOp, tuple[Opt, ...] | None]]) -> None:
    """Build the kernels that are neither loaded nor on disk at once in worker processes (where there are PARALLEL_BUILD or more
    of them), for get_program to load. A build that fails there is left to get_program, which raises its error."""
    wanted: dict[str, tuple[Any, ...]] = {}
    for ast, opts in kernels:
      if self._memory_key(ast, opts) in self.programs or (key := self.program_key(ast, opts)) in self._built or key in wanted: continue
      if (cached := self._cached(key)) is not None: self._built[key] = cached
      else: wanted[key] = self._build_arguments(ast, opts, key)
    if self.compile_binary is None or not PARALLEL_BUILD or len(wanted) < PARALLEL_BUILD.value: return
    for key, built in zip(wanted, compile_pool().map(build, list(wanted.values()))):
      if built is not None:
        self._built[key] = self._store(key, built)
        self.builds["in workers"] += 1

  def adopt(self, ast: LazyOp, opts: tuple[Opt, ...], built: Built) -> None:
    """A program a BEAM worker built for these Opts, for get_program to load instead of building it again (kept on disk too)."""
    key = self.program_key(ast, opts)
    if self._memory_key(ast, opts) not in self.programs: self._built[key] = self._store(key, built)

  @staticmethod
  def _memory_key(ast: LazyOp, opts: tuple[Opt, ...] | None) -> tuple[LazyOp, tuple[Opt, ...] | None, bool, bool]:
    return (ast, opts, bool(ALLOW_TF32.value), bool(NOOPT.value))  # the settings that change what the same Opts compile to (CODEGEN_SETTINGS)

  def program_key(self, ast: LazyOp, opts: tuple[Opt, ...] | None) -> str:
    """The disk cache's key of a program: the kernel, its Opts, the device and compiler, the settings that change code, tinyc's code."""
    parts = (ast_text(ast), opts, self.name, self.arch, self.language, self.target, self.threads, self.max_local, codegen_settings(), code_version())
    return hashlib.sha256(repr(parts).encode()).hexdigest()

  def _program(self, ast: LazyOp, opts: tuple[Opt, ...] | None) -> Program:
    key = self.program_key(ast, opts)
    if (built := self._built.pop(key, None) or self._cached(key)) is None:
      began = time.perf_counter()
      built = self._store(key, build(*self._build_arguments(ast, opts, key)))
      if profiler.enabled(): profiler.record(f"compile {built.name}", "compile", began, time.perf_counter() - began)
    if DEBUG >= 4: print(built.source)
    run = self.load(built.name, built.source, built.binary) if self.load is not None and built.binary else self.compile(built.name, built.source)
    return Program(built.name, self.name, run, built.flops, built.mem_bytes, built.global_size, built.local_size, built.vars)

  def _build_arguments(self, ast: LazyOp, opts: tuple[Opt, ...] | None, key: str) -> tuple[Any, ...]:
    return (ast, opts, self.target, self.threads, self.max_local, self.render, self.compile_binary, codegen_settings(), key)

  def _cached(self, key: str) -> Built | None:
    """The program built under `key` by this or an earlier process, from the disk cache (a row this version cannot read is a miss)."""
    if self.compile_binary is None or not (rows := cache_execute("SELECT program, binary FROM programs WHERE key = ?", (key,))): return None
    try:
      fields: dict[str, Any] = {field: tuple(value) if isinstance(value, list) else value for field, value in json.loads(rows[0][0]).items()}
      built = Built(**fields, binary=rows[0][1])
    except (ValueError, TypeError, AttributeError): return None
    self.builds["from disk"] += 1
    return built

  def _store(self, key: str, built: Built) -> Built:
    self.builds["built"] += 1
    if built.binary and not built.vars: cache_execute("INSERT OR REPLACE INTO programs (key, program, binary) VALUES (?, ?, ?)",
                                   (key, json.dumps(dict(zip(Built._fields[:-1], built[:-1]))), built.binary))
    return built

CODEGEN_SETTINGS = (ALLOW_TF32, NOOPT)  # the settings that change what a kernel compiles to: part of the program key, and set in build workers
def codegen_settings() -> dict[str, Any]: return {setting.key: setting.value for setting in CODEGEN_SETTINGS}

class Built(NamedTuple):
  """A kernel lowered, rendered and compiled: what a build worker returns and the disk cache keeps (the binary apart from the JSON)."""
  name: str
  source: str
  global_size: tuple[int, int, int] | None
  local_size: tuple[int, int, int] | None
  flops: int
  mem_bytes: int
  vars: tuple[Variable, ...]  # the symbolic sizes it takes as arguments (such a program is kept in memory only: its sizes are Nodes)
  binary: bytes

def build(ast: LazyOp, opts: tuple[Opt, ...] | None, target: KernelTarget, threads: bool, max_local: int, render: Callable[[str, list[UOp]], str],
          compile_binary: Callable[[str, str], bytes] | None, settings: dict[str, Any], key: str) -> Built:
  """Lower, render and compile one kernel, here or in a worker process (with the asking thread's settings). Its name carries its
  key: kernels loaded into one address space (a CPU backend) never share a name, and a name means the same kernel in every process."""
  with Context(**settings):
    kernel = Kernel(ast, target)
    if DEBUG >= 3: print(format_ast(ast))
    if opts is None: hand_coded_optimizations(kernel)
    else:
      for opt in opts: kernel.apply_opt(opt)
    if DEBUG >= 3: print(f"opts: {kernel.applied_opts}\nlayout: {kernel.describe_layout()}")
    lowered = lower(kernel, threads, max_local)
    name = f"{kernel.name}_{key[:8]}"
    source = render(name, lowered.uops)
    started = time.perf_counter()
    binary = b"" if compile_binary is None else compile_binary(name, source)
    if DEBUG >= 3: print(f"compiled {name} in {(time.perf_counter() - started) * 1e3:.2f} ms")
  return Built(name, source, lowered.global_size, lowered.local_size, lowered.flops, lowered.mem_bytes, tuple(kernel.vars), binary)

class LoweredKernel(NamedTuple):
  uops: list[UOp]
  global_size: tuple[int, int, int] | None
  local_size: tuple[int, int, int] | None
  flops: int
  mem_bytes: int

def lower(kernel: Kernel, threads: bool, max_local: int) -> LoweredKernel:
  """An optimized kernel's UOps and what its Program needs besides the code: launch sizes, FLOPs and bytes moved."""
  if threads: kernel.limit_global_dims(3)
  uops = Linearizer(kernel, threads=threads).linearize()
  global_size, local_size = launch_sizes(uops, max_local) if threads else cpu_launch_sizes(uops)
  mem_bytes = sum(buf.st.real_size() * buf.dtype.itemsize for buf in kernel.bufs if isinstance(buf, MemBuffer))
  return LoweredKernel(uops, global_size, local_size, count_flops(uops), mem_bytes)

def count_flops(uops: list[UOp]) -> int:
  """A kernel's float operations: each float ALU op (each lane of a vector) counts once per iteration of its loops."""
  alu = executed(uops, lambda uop: uop.op is UOps.ALU and uop.dtype is not None and dtypes.is_float(uop.dtype.scalar()))
  per_thread = {(uop.op, uop.arg): tensor_core_flops(uop) for uop in uops if uop.op in (UOps.WMMA, UOps.WGMMA)}
  def mmas_of(key: tuple) -> Callable[[UOp], bool]: return lambda uop: (uop.op, uop.arg) == key
  return alu + sum(flops * executed(uops, mmas_of(key)) for key, flops in per_thread.items())

BACKENDS = ("CUDA", "GPU", "LLVM")
BACKEND_MODULES = {"CUDA": "ops_cuda", "GPU": "ops_opencl", "LLVM": "ops_llvm"}
INSTALL_HINTS = {"CUDA": "pip install -e '.[cuda]' on a machine with an NVIDIA GPU and driver", "GPU": "pip install -e '.[opencl]'",
                 "LLVM": "pip install llvmlite"}

class DeviceRegistry:
  """`Device["LLVM"]` is the LLVM backend (made on first use); `Device.DEFAULT` is the name chosen by the environment:
  CUDA=1, GPU=1, LLVM=1 or DEVICE=NAME, and with none set CUDA where it is usable, else LLVM."""
  def __init__(self) -> None:
    self._opened: dict[str, Compiled] = {}
    self._usable: dict[str, bool] = {}
    self._opening = threading.Lock()  # threads that first use a device at once open it once
  def usable(self, name: str) -> bool:
    """Whether the backend opens here (probed once per process)."""
    if name not in self._usable:
      try: self._usable[name] = self[name] is not None
      except RuntimeError: self._usable[name] = False
    return self._usable[name]
  def canonicalize(self, name: str | None) -> str:
    if name is None: return self.DEFAULT
    base = name.split(":")[0].upper()
    if base not in BACKENDS: raise ValueError(f"unknown device {name!r}: tinyc has {', '.join(BACKENDS)} (set LLVM=1, GPU=1, CUDA=1 or DEVICE=NAME)")
    return base
  def __getitem__(self, name: str) -> Compiled:
    if (device := self._opened.get(name)) is not None: return device  # a canonical name (what every LazyBuffer holds) of an open device
    name = self.canonicalize(name)
    if (device := self._opened.get(name)) is not None: return device
    with self._opening:
      if name not in self._opened:
        try: module = importlib.import_module(f"tinyc.runtime.{BACKEND_MODULES[name]}")
        except ImportError as error:
          raise RuntimeError(f"device {name} is not available: {error}. To use it: {INSTALL_HINTS[name]}; or pick another with LLVM=1") from error
        self._opened[name] = module.open_device()
      return self._opened[name]
  @property
  def DEFAULT(self) -> str:
    if (chosen := getenv("DEVICE", "")): return self.canonicalize(chosen)
    for name in BACKENDS:
      if getenv(name, 0) == 1: return name
    return "CUDA" if self.usable("CUDA") else "LLVM"

Device = DeviceRegistry()
