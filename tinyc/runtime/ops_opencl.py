"""Layer 4: the OpenCL backend (GPU=1): pyopencl for memory, copies, builds and launches. Imports helpers, device, codegen/;
pyopencl appears only here.

A GPU device is preferred over a CPU one; CL_PLATFORM and CL_DEVICE (an index, or part of the name) choose explicitly.
Threads: OpenCL calls are thread-safe except setting a kernel object's arguments, so a launch (set the arguments, enqueue) holds
the kernel's lock; the kernel then runs, and is waited for, without it.
Processes: a driver may keep builds in a cache directory of its own, named by the program (pocl does), and read another process's
half-written files there: pocl 3.1 aborts the process. So a build or load holds a file lock chosen by the program's source
(`_one_process_at_a_time`): processes build different programs together, and the same one in turn.
"""
from __future__ import annotations
import contextlib, fcntl, functools, hashlib, threading, time
from typing import Any, Callable, Iterator
import numpy as np
import pyopencl as cl
from tinyc.helpers import DEBUG, getenv
from tinyc.codegen.kernel import GPU_MAX_UPCAST, KernelTarget
from tinyc.device import Allocator, Compiled, CompileError
from tinyc.codegen.cstyle import render_opencl
from tinyc.codegen.search import cache_dir

class CLAllocator(Allocator):
  def __init__(self, context: Any, queue: Any) -> None:
    super().__init__()
    self.context, self.queue = context, queue
  def _alloc(self, nbytes: int) -> Any:
    try:
      buffer = cl.Buffer(self.context, cl.mem_flags.READ_WRITE, max(nbytes, 1))
      # drivers may allocate at first use (NVIDIA's does): touch it now, so running out of memory shows up here, as MemoryError
      cl.enqueue_fill_buffer(self.queue, buffer, np.zeros(1, np.uint8), 0, 1).wait()
      return buffer
    except cl.Error as error: raise MemoryError(f"OpenCL could not allocate {nbytes} bytes: {error}") from error
  def _free(self, opaque: Any, nbytes: int) -> None: opaque.release()
  def copyin(self, dest: Any, src: memoryview) -> None: cl.enqueue_copy(self.queue, dest, np.frombuffer(src, dtype=np.uint8), is_blocking=True)
  def copyout(self, dest: memoryview, src: Any) -> None: cl.enqueue_copy(self.queue, np.frombuffer(dest, dtype=np.uint8), src, is_blocking=True)

def _pick(choices: list[Any], wanted: str, what: str) -> Any:
  if wanted.isdigit() and int(wanted) < len(choices): return choices[int(wanted)]
  for choice in choices:
    if wanted.lower() in choice.name.lower(): return choice
  raise RuntimeError(f"{what}={wanted!r} matches none of {[c.name for c in choices]}: give an index or part of a name")

def choose_device() -> Any:
  """CL_PLATFORM/CL_DEVICE if set, else the first GPU of any platform, else the first device."""
  try: platforms = cl.get_platforms()
  except cl.Error as error: platforms, reason = [], str(error)
  else: reason = "no platforms"
  if not platforms:
    raise RuntimeError(f"GPU=1 asks for OpenCL, but no OpenCL platform is installed ({reason}): install a driver, e.g. Debian's pocl-opencl-icd")
  if (wanted := getenv("CL_PLATFORM", "")): platforms = [_pick(platforms, wanted, "CL_PLATFORM")]
  devices = [device for platform in platforms for device in platform.get_devices()]
  if (wanted := getenv("CL_DEVICE", "")): return _pick(devices, wanted, "CL_DEVICE")
  gpus = [device for device in devices if device.type & cl.device_type.GPU]
  return (gpus or devices)[0]

class CLCompiler:
  """Builds OpenCL C for one device; programs are cached by source for the life of the process."""
  def __init__(self, context: Any, queue: Any, device: Any) -> None:
    self.context, self.queue, self.device = context, queue, device
    self.cache: dict[str, Any] = {}

  def compile(self, name: str, source: str) -> Callable[..., float | None]:
    if source not in self.cache: self.cache[source] = _build(self.context, self.device, name, source)
    return self._runner(self.cache[source], name)

  def load(self, name: str, source: str, binary: bytes) -> Callable[..., float | None]:
    """A runner for a program binary built elsewhere (a BEAM worker, on its own context for the same device)."""
    try:
      with _one_process_at_a_time(source): program = cl.Program(self.context, [self.device], [binary]).build()
    except cl.Error as error: raise CompileError(f"OpenCL ({self.device.name}) could not load the binary of {name}: {error}") from error
    return self._runner(program, name)

  def _runner(self, program: Any, name: str) -> Callable[..., float | None]:
    kernel = getattr(program, name)
    queue, launching = self.queue, threading.Lock()
    def run(args: list[Any], global_size: tuple[int, ...], local_size: tuple[int, ...], wait: bool = False) -> float | None:
      started = time.perf_counter()
      try:  # the buffers, then the values of the kernel's Variables as ints
        with launching: event = kernel(queue, global_size, local_size, *[np.int32(arg) if isinstance(arg, int) else arg for arg in args])
      except cl.Error as error:
        raise RuntimeError(f"OpenCL could not launch kernel {name} over {global_size} in groups of {local_size}: {error}") from error
      if not wait: return None
      event.wait()
      try: return (event.profile.end - event.profile.start) * 1e-9
      except cl.Error: return time.perf_counter() - started
    return run

@contextlib.contextmanager
def _one_process_at_a_time(source: str) -> Iterator[None]:
  """Holds one of 256 lock files in the cache directory, chosen by the source's hash, while the body builds or loads it. Without a
  writable cache directory it holds none (tinyc's own caches are off then too)."""
  path = cache_dir() / "opencl-locks" / f"{hashlib.sha256(source.encode()).hexdigest()[:2]}.lock"
  with contextlib.ExitStack() as held:
    with contextlib.suppress(OSError):
      path.parent.mkdir(parents=True, exist_ok=True)
      fcntl.flock(held.enter_context(open(path, "ab")), fcntl.LOCK_EX)  # released when the file closes
    yield

def _build(context: Any, device: Any, name: str, source: str) -> Any:
  try:
    with _one_process_at_a_time(source): return cl.Program(context, source).build()
  except cl.Error as error:
    hint = source if DEBUG >= 4 else "(run with DEBUG=4 to see the source)"
    raise CompileError(f"OpenCL ({device.name}) rejected kernel {name}: {error}\n{hint}") from error

_worker_contexts: dict[tuple[str, str], Any] = {}
def compile_binary(name: str, source: str, platform_name: str, device_name: str) -> bytes:
  """Runs in a BEAM worker process: build `source` for the named device on a context of this process, return the binary."""
  if (platform_name, device_name) not in _worker_contexts:
    platform = next(p for p in cl.get_platforms() if p.name == platform_name)
    _worker_contexts[(platform_name, device_name)] = cl.Context([next(d for d in platform.get_devices() if d.name == device_name)])
  context = _worker_contexts[(platform_name, device_name)]
  return bytes(_build(context, context.devices[0], name, source).binaries[0])

def open_device() -> Compiled:
  device = choose_device()
  context = cl.Context([device])
  queue = cl.CommandQueue(context, device, properties=cl.command_queue_properties.PROFILING_ENABLE)
  compiler = CLCompiler(context, queue, device)
  if DEBUG >= 1: print(f"OpenCL device: {device.name} ({device.platform.name})")
  target = KernelTarget(has_local=True, max_upcast=GPU_MAX_UPCAST, max_local_size=device.max_work_group_size,
                        local_memory_bytes=device.local_mem_size,
                        max_local_dim_sizes=tuple(device.max_work_item_sizes[:3]), compute_units=device.max_compute_units)
  return Compiled("GPU", CLAllocator(context, queue), render_opencl, compiler.compile, language="OpenCL C", threads=True,
                  max_local=min(256, device.max_work_group_size), target=target, load=compiler.load,
                  compile_binary=functools.partial(compile_binary, platform_name=device.platform.name, device_name=device.name),
                  arch=f"{device.platform.name} {device.name} {device.driver_version}")
