"""Layer 4: the LLVM backend: llvmlite compiles IR to native code for this CPU, ctypes calls it. Imports helpers, dtype,
device, codegen/; llvmlite.binding appears only here.

Facts that shaped it: llvmlite >= 0.45 has no llvm.initialize() and no legacy pass managers (the new pass builder is used);
a target machine made without the host's CPU name and features emits SSE only, so they are passed explicitly. A ctypes
CFUNCTYPE call releases the GIL while native code runs; a kernel split into ranges of its outermost loop runs them on several
cores at once, the caller's thread and native workers (cpu_pool.py).

Threads: one MCJIT engine holds every kernel and llvmlite locks each call into LLVM but not a sequence of them, so each compile
(parse, optimize, add to the engine, finalize, look up the address) holds codegen/llvmir.py's LLVMLITE_LOCK. Kernels run without it.
"""
from __future__ import annotations
import concurrent.futures, ctypes, functools, os, threading, time
from typing import Any, Callable
import numpy as np
import llvmlite.binding as llvm
from tinyc.helpers import CPU_THREADS, DEBUG
from tinyc.device import Allocator, Compiled, CompileError
from tinyc.codegen.cpu_split import split_range
from tinyc.codegen.axes import CPU_MAX_UPCAST
from tinyc.codegen.kernel import KernelTarget
from tinyc.codegen.llvmir import LLVMLITE_LOCK, render_llvm
from tinyc.runtime.cpu_pool import MAX_ARGS, native_pool, pool_source

class HostMemory:
  """A block of CPU memory: a numpy byte array (64-byte aligned, for aligned vector loads) and its address, which ctypes passes for it
  (`_as_parameter_`: a kernel is called with the HostMemory objects themselves, with no list of pointers made for each call)."""
  __slots__ = ("array", "_as_parameter_")
  def __init__(self, nbytes: int) -> None:
    raw = np.empty(nbytes + 64, dtype=np.uint8)
    start = (-raw.ctypes.data) % 64
    self.array = raw[start:start + nbytes]
    self._as_parameter_ = ctypes.c_void_p(raw.ctypes.data + start)

class HostAllocator(Allocator):
  def _alloc(self, nbytes: int) -> HostMemory:
    try: return HostMemory(nbytes)
    except MemoryError as error: raise MemoryError(f"out of host memory allocating {nbytes} bytes for an LLVM buffer ({error})") from error
  def copyin(self, dest: HostMemory, src: memoryview) -> None: dest.array[:] = np.frombuffer(src, dtype=np.uint8)
  def copyout(self, dest: memoryview, src: HostMemory) -> None: np.frombuffer(dest, dtype=np.uint8)[:] = src.array

@functools.cache
def host_features() -> str:
  """The host CPU's features, and full-width vectors: LLVM's tuning for Intel's AVX-512 cores prefers 256-bit ones (against the clock
  drop of 512-bit code on Skylake-SP), which halved a matmul's FMAs (a @ b.T at 1024 on 2 cores: 206 -> 281 GFLOP/s without it)."""
  features = llvm.get_host_cpu_features()
  return features.flatten() + (",-prefer-256-bit" if features.get("avx512f") else "")

@functools.cache
def host_target_machine() -> Any:
  llvm.initialize_native_target()
  llvm.initialize_native_asmprinter()
  target = llvm.Target.from_default_triple()
  return target.create_target_machine(cpu=llvm.get_host_cpu_name(), features=host_features(), opt=3)

def optimized_module(name: str, source: str) -> Any:
  """The kernel's IR parsed, checked and optimized at O3 for this CPU."""
  try:
    module = llvm.parse_assembly(source)
    module.verify()
  except RuntimeError as error:
    hint = source if DEBUG >= 4 else "(run with DEBUG=4 to see the IR)"
    raise CompileError(f"LLVM rejected kernel {name}: {error}\n{hint}") from error
  target_machine = host_target_machine()
  module.triple, module.data_layout = target_machine.triple, str(target_machine.target_data)
  tuning = llvm.create_pipeline_tuning_options(speed_level=3)
  tuning.loop_vectorization, tuning.slp_vectorization = True, True
  pass_builder = llvm.create_pass_builder(target_machine, tuning)
  pass_builder.getModulePassManager().run(module, pass_builder)
  if DEBUG >= 5: print(target_machine.emit_assembly(module))
  return module

def compile_object(name: str, source: str) -> bytes:
  """Runs in a BEAM worker process (the same machine): the kernel as a native object file."""
  with LLVMLITE_LOCK: return bytes(host_target_machine().emit_object(optimized_module(name, source)))

class LLVMCompiler:
  """One MCJIT engine for the process; each kernel's IR is optimized at O3 and added as a module. Cached by IR text."""
  def __init__(self) -> None:
    with LLVMLITE_LOCK: self.engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), host_target_machine())
    self.cache: dict[str, int] = {}

  def compile(self, name: str, source: str) -> Callable[..., float | None]:
    with LLVMLITE_LOCK:
      if source not in self.cache:
        self.engine.add_module(optimized_module(name, source))
        self.engine.finalize_object()
        self.cache[source] = self.engine.get_function_address(name)
      return make_runner(self.cache[source])

  def load(self, name: str, source: str, native_object: bytes) -> Callable[..., float | None]:
    """A runner for an object file compiled by compile_object (here, in a worker or by an earlier process; every kernel has a name
    of its own). Loaded once per source: a second copy of a kernel's symbol in the engine would clash."""
    with LLVMLITE_LOCK:
      if source not in self.cache:
        self.engine.add_object_file(llvm.ObjectFileRef.from_data(native_object))
        self.engine.finalize_object()
        self.cache[source] = self.engine.get_function_address(name)
      return make_runner(self.cache[source])

def make_runner(address: int) -> Callable[..., float | None]:
  function = ctypes.CFUNCTYPE(None)(address)  # no argtypes: a HostMemory passes its pointer, an int a C int (and c_int64 bounds as they are)
  def run(args: list[HostMemory | int], global_size: tuple[int, int, int] | None = None, local_size: tuple[int, int, int] | None = None,
          wait: bool = False) -> float | None:
    """args: the buffers, then the values of the kernel's Variables. For a kernel split across threads (it takes [start, end) of its
    outermost global loop after those), global_size[0] is that loop's trips and local_size[0] the fewest of them worth a thread; None
    for one that runs on one thread (see codegen/cpu_split.py)."""
    started = time.perf_counter() if wait else 0.0
    if global_size is None: function(*args)
    else: run_ranges(function, args, split_range(global_size[0], (local_size or global_size)[0], cpu_threads()), address)
    return time.perf_counter() - started if wait else None
  return run

def run_ranges(function: Callable[..., None], pointers: list[Any], ranges: list[tuple[int, int]], address: int | None = None) -> None:
  """function(*pointers, start, end) for every range at once: the first on this thread, the others on other threads. Returns when
  all have finished, so no thread still writes a buffer after its kernel has returned. A compiled kernel (its `address` given)
  runs on the native workers (cpu_pool.py) where they are free; anything else, or a second caller meanwhile, on Python threads."""
  if address is not None and len(ranges) > 1 and len(pointers) <= MAX_ARGS and (native := native_pool(compile_pool)) is not None \
     and native.lock.acquire(blocking=False):
    try: return native.run(function, address, pointers, ranges)
    finally: native.lock.release()
  bounds = [(ctypes.c_int64(start), ctypes.c_int64(end)) for start, end in ranges]
  futures: list[concurrent.futures.Future] = []
  if len(bounds) > 1:
    with _pool_lock:  # no other thread replaces the pool between getting it and submitting to it
      pool = worker_pool(len(bounds) - 1)
      futures = [pool.submit(function, *pointers, *range_bounds) for range_bounds in bounds[1:]]
  try: function(*pointers, *bounds[0])
  finally: join(futures)
  for future in futures: future.result()  # raise what a worker raised

def compile_pool() -> dict[str, int]:
  """The native workers' code (cpu_pool.pool_source) in an engine of its own with a target machine of its own (an engine owns its
  machine), never freed: the workers run it until the process ends."""
  machine = host_target_machine.__wrapped__()
  with LLVMLITE_LOCK:
    module = llvm.parse_assembly(pool_source(pause=machine.triple.startswith(("x86_64", "i686"))))
    module.verify()
    engine = llvm.create_mcjit_compiler(module, machine)
    engine.finalize_object()
    ctypes.pythonapi.Py_IncRef(ctypes.py_object(engine))
    return {name: engine.get_function_address(name) for name in ("tinyc_worker", "tinyc_publish", "tinyc_finish")}

def join(futures: list[concurrent.futures.Future]) -> None:
  """Wait for every range. Ctrl-C takes effect once they have finished, as it does after a kernel run on one thread: the ranges
  write buffers that are handed out again as soon as the kernel returns."""
  try: concurrent.futures.wait(futures)
  except KeyboardInterrupt:
    concurrent.futures.wait(futures)
    raise

@functools.cache
def cores() -> int:
  """The cores this process may run on (its affinity mask, where the OS has one)."""
  return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1

def cpu_threads() -> int: return CPU_THREADS.value or cores()

_pool: concurrent.futures.ThreadPoolExecutor | None = None
_pool_size = 0
_pool_lock = threading.Lock()

def worker_pool(workers: int) -> concurrent.futures.ThreadPoolExecutor:
  """The process-wide pool of kernel threads, made on first use and made anew when CPU_THREADS asks for more than it has."""
  global _pool, _pool_size
  if _pool is None or _pool_size < workers:
    if _pool is not None: _pool.shutdown(wait=False)  # its idle threads exit; ranges already handed to it still run
    _pool, _pool_size = concurrent.futures.ThreadPoolExecutor(workers, thread_name_prefix="tinyc-cpu"), workers
  return _pool

def _forget_pool() -> None:
  global _pool, _pool_lock
  _pool, _pool_lock = None, threading.Lock()  # a lock another thread held at the fork stays held in the child
# a forked child has none of its parent's threads: a pool inherited from it would take ranges and never run them
if hasattr(os, "register_at_fork"): os.register_at_fork(after_in_child=_forget_pool)

def open_device() -> Compiled:
  compiler = LLVMCompiler()
  target = KernelTarget(vector_lanes=16 if llvm.get_host_cpu_features().get("avx512f") else 8, max_upcast=CPU_MAX_UPCAST)
  return Compiled("LLVM", HostAllocator(), render_llvm, compiler.compile, language="LLVM IR", compile_binary=compile_object, load=compiler.load,
                  arch=f"{llvm.get_host_cpu_name()} {host_features()} LLVM {llvm.llvm_version_info}", target=target)
