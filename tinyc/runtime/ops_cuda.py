"""Layer 4: the CUDA backend (CUDA=1, the default where a CUDA GPU is usable): pycuda for the driver (context, memory,
copies, launches, events), NVRTC for compiling to a cubin of the device's own architecture. Imports helpers, device,
codegen/, runtime/nvrtc; pycuda appears only here.

Compiled cubins are cached on disk with the rest of each program (device.py).

Threads: a new Python thread has no current CUDA context, and pycuda refuses every call without one, so every entry point that
touches the driver (allocation, copies, module loads, launches, events, graphs) first makes the device's primary context
current on its thread (PRIMARY.make_current(): once per thread, then one attribute lookup).
"""
from __future__ import annotations
import atexit, ctypes, ctypes.util, functools, re, struct, threading
from typing import Any, Callable
import numpy as np
import pycuda.driver as cuda
from tinyc.helpers import DEBUG, GlobalCounters, getenv
from tinyc.codegen.kernel import GPU_MAX_UPCAST, KernelTarget
from tinyc.device import Allocator, Buffer, Compiled, CompileError, Program
from tinyc.codegen.cstyle import render_cuda
from tinyc.runtime.nvrtc import compile_cuda, nvrtc_version

class PrimaryContext:
  """The device's primary context, the one the CUDA runtime (and so PyTorch) uses: a context of our own would be swapped out
  whenever torch runs on the GPU in the same process, and our kernels would then fail with "invalid resource handle".
  make_current() pushes it on the calling thread once. A thread must pop it before it ends (pycuda aborts the process when a
  thread ends with a context pushed): the main thread does so at exit, any other thread when its thread-local data is freed,
  which Python does on that thread as it ends."""
  def __init__(self) -> None:
    self.context: Any = None
    self.threads = threading.local()  # .pushed: this thread has pushed the context

  def open(self, device: Any) -> None:
    self.context = device.retain_primary_context()
    self.make_current()

  def make_current(self) -> None:
    if getattr(self.threads, "pushed", None) is not None: return
    self.context.push()
    if threading.current_thread() is threading.main_thread():
      atexit.register(cuda.Context.pop)
      self.threads.pushed = True
    else: self.threads.pushed = _PopWhenFreed()

class _PopWhenFreed:
  """Kept in a thread's thread-local data: freed on that thread as it ends, and then pops the context it pushed."""
  def __del__(self) -> None:
    try: cuda.Context.pop()
    except cuda.Error as error:
      if DEBUG >= 1: print(f"tinyc: could not pop the CUDA context of an ending thread: {error}")

PRIMARY = PrimaryContext()

class CUDAAllocator(Allocator):
  def _alloc(self, nbytes: int) -> Any:
    PRIMARY.make_current()
    try: return cuda.mem_alloc(max(nbytes, 1))
    except cuda.MemoryError as error: raise MemoryError(f"CUDA out of memory allocating {nbytes} bytes: {error}") from error
  def _free(self, opaque: Any, nbytes: int) -> None:
    PRIMARY.make_current()
    opaque.free()
  def copyin(self, dest: Any, src: memoryview) -> None:
    PRIMARY.make_current()
    cuda.memcpy_htod(dest, np.frombuffer(src, dtype=np.uint8))
  def copyout(self, dest: memoryview, src: Any) -> None:
    PRIMARY.make_current()
    cuda.memcpy_dtoh(np.frombuffer(dest, dtype=np.uint8), src)

class CUDACompiler:
  def __init__(self, device: Any) -> None:
    self.arch = "sm_%d%d" % device.compute_capability() + ("a" if device.compute_capability() == (9, 0) else "")  # sm_90a: wgmma
    self.modules: dict[str, Any] = {}

  def compile(self, name: str, source: str) -> Callable[..., float | None]:
    PRIMARY.make_current()
    if source not in self.modules: self.modules[source] = _load_module(name, compile_cuda(name, source, self.arch))
    return _runner(self.modules[source], name, source)

  def load(self, name: str, source: str, cubin: bytes) -> Callable[..., float | None]:
    """A runner for a cubin compiled elsewhere (a BEAM worker)."""
    PRIMARY.make_current()
    return _runner(_load_module(name, cubin), name, source)

def _load_module(name: str, cubin: bytes) -> Any:
  try: return cuda.module_from_buffer(cubin)
  except cuda.Error as error: raise CompileError(f"CUDA could not load kernel {name}: {error}") from error

def _runner(module: Any, name: str, source: str) -> Callable[..., float | None]:
  function = module.get_function(name)
  # local memory over the 48 KB a kernel may declare statically is dynamic, its size in a comment the renderer writes (cstyle.py)
  dynamic_local = int(found.group(1)) if (found := re.search(r"dynamic local memory: (\d+) bytes", source)) else 0
  if dynamic_local: function.set_attribute(cuda.function_attribute.MAX_DYNAMIC_SHARED_SIZE_BYTES, dynamic_local)
  # pycuda's prepared_call ends in _launch_kernel: called directly, a launch took 4.5 us on the H200 machine instead of 5.5
  launch = function._launch_kernel
  def run(args: list[Any], global_size: tuple[int, int, int], local_size: tuple[int, int, int], wait: bool = False,
          stream: Any = None) -> float | None:
    grid = tuple(g // l for g, l in zip(global_size, local_size))
    values = [arg for arg in args if isinstance(arg, int)]  # the Variables' values follow the buffers
    buffers = args[:len(args) - len(values)]
    PRIMARY.make_current()
    try:
      if wait:
        start, end = cuda.Event(), cuda.Event()  # this run's own: threads may time one kernel at once
        (gate := _gate()).close()
        start.record()
      launch(grid, local_size, _parameter_packer(len(buffers), len(values))(*map(int, buffers), *values), dynamic_local, stream)
      if not wait: return None
      end.record()
      gate.open()
      end.synchronize()
    except cuda.Error as error:
      if wait: _gate().open()  # (a refused launch: the stream is not held for the gate's 0.1 s)
      raise RuntimeError(f"CUDA kernel {name} failed (grid {grid}, block {local_size}): {error}") from error
    return start.time_till(end) * 1e-3
  return run

class _Gate:
  """Holds the stream until a timed run is launched: its start event would otherwise be reached at once, and its time would count
  the host's launch (4.5 us; more while builds busy the cores) besides the kernel's (OpenCL's profiling counts the kernel alone). A
  one-thread kernel spins until a flag in host memory the GPU reads is set, or for 0.1 s at most."""
  SOURCE = """extern "C" __global__ void tinyc_gate(volatile int *open, long long most_cycles) {
  long long start = clock64();
  while (*open == 0 && clock64() - start < most_cycles) {}
}"""
  def __init__(self) -> None:
    device = cuda.Context.get_device()
    arch = "sm_%d%d" % device.compute_capability()
    self.flag = cuda.pagelocked_zeros(1, np.int32, mem_flags=cuda.host_alloc_flags.DEVICEMAP)
    self.kernel = _load_module("tinyc_gate", compile_cuda("tinyc_gate", self.SOURCE, arch)).get_function("tinyc_gate")
    self.arguments = (np.intp(self.flag.base.get_device_pointer()), np.int64(device.get_attribute(cuda.device_attribute.CLOCK_RATE) * 100))
  def close(self) -> None:
    self.flag[0] = 0
    self.kernel(*self.arguments, block=(1, 1, 1), grid=(1, 1))
  def open(self) -> None: self.flag[0] = 1

@functools.cache
def _gate() -> _Gate: return _Gate()

@functools.cache
def _parameter_packer(count: int, values: int) -> Callable[..., bytes]:
  """Packs a kernel's parameters, one pointer per buffer in the order the program is called with (as every renderer declares them),
  then an int for each Variable of its symbolic sizes."""
  return struct.Struct("P" * count + "i" * values).pack

class CUDAGraph:
  """TinyJit's replay as one launch of a CUDA graph, instead of about 10 us of Python and driver work for each kernel. A graph
  bakes in buffer addresses, so one is recorded for each set of input addresses; a replay's new inputs mostly get one of a
  few addresses back from the allocator's cache (the JIT holds the last inputs, so two alternate)."""
  def __init__(self, steps: list[tuple[Program, list[Buffer], dict]]) -> None:
    self.steps = steps
    self.executables: dict[tuple[int, ...], ctypes.c_void_p] = {}  # input addresses -> instantiated graph, oldest first
    self.recordings = 0
    PRIMARY.make_current()
    self.stream = cuda.Stream(flags=1)  # CU_STREAM_NON_BLOCKING: a capturing stream must not wait on the legacy stream
    self.flops, self.mem_bytes = sum(step[0].flops for step in steps), sum(step[0].mem_bytes for step in steps)

  def __call__(self, input_buffers: list[Buffer]) -> None:
    PRIMARY.make_current()
    addresses = tuple(int(buf.opaque) for buf in input_buffers)
    if addresses not in self.executables:
      if len(self.executables) >= GRAPHS_KEPT: _check(_driver.cuGraphExecDestroy(self.executables.pop(next(iter(self.executables)))))
      self.executables[addresses] = self._record()
    _check(_driver.cuGraphLaunch(self.executables[addresses], None))  # on the legacy default stream: ordered with every launch and copy
    GlobalCounters.add(kernels=len(self.steps), ops=self.flops, mem=self.mem_bytes)

  def _record(self) -> ctypes.c_void_p:
    graph, executable = ctypes.c_void_p(), ctypes.c_void_p()
    _check(_driver.cuStreamBeginCapture_v2(ctypes.c_void_p(self.stream.handle), 2))  # CU_STREAM_CAPTURE_MODE_RELAXED
    try:
      for program, buffers, _ in self.steps:  # (no symbolic sizes: jit.py launches those steps one by one)
        program.run([buf.opaque for buf in buffers], global_size=program.global_size, local_size=program.local_size, stream=self.stream)
    finally: _check(_driver.cuStreamEndCapture(ctypes.c_void_p(self.stream.handle), ctypes.byref(graph)))
    _check(_driver.cuGraphInstantiateWithFlags(ctypes.byref(executable), graph, ctypes.c_ulonglong(0)))
    _check(_driver.cuGraphDestroy(graph))
    self.recordings += 1
    return executable

  def __del__(self) -> None:
    if self.executables: PRIMARY.make_current()
    for executable in self.executables.values(): _driver.cuGraphExecDestroy(executable)

GRAPHS_KEPT = 4  # recorded graphs a CUDAGraph keeps, for as many sets of input addresses

_driver = ctypes.CDLL(ctypes.util.find_library("cuda") or "libcuda.so.1")  # the driver pycuda uses: graphs are not in pycuda

def _check(status: int) -> None:
  if status != 0:
    message = ctypes.c_char_p()
    _driver.cuGetErrorString(status, ctypes.byref(message))
    raise RuntimeError(f"CUDA graph call failed: {(message.value or b'unknown error').decode()} ({status})")

def open_device() -> Compiled:
  try:
    cuda.init()
    count = cuda.Device.count()
  except cuda.Error as error:
    raise RuntimeError(f"CUDA=1 but the CUDA driver is not usable ({error}): check the NVIDIA driver, or use LLVM=1") from error
  if count == 0: raise RuntimeError("CUDA=1 but no CUDA GPU is visible: check CUDA_VISIBLE_DEVICES, or use LLVM=1")
  device = cuda.Device(getenv("CUDA_DEVICE", 0))
  PRIMARY.open(device)
  if DEBUG >= 1: print(f"CUDA device: {device.name()} (sm_{''.join(map(str, device.compute_capability()))})")
  compiler = CUDACompiler(device)
  attribute = lambda name: device.get_attribute(getattr(cuda.device_attribute, name))  # noqa: E731
  target = KernelTarget(has_local=True, max_upcast=GPU_MAX_UPCAST, max_local_size=attribute("MAX_THREADS_PER_BLOCK"),
                        local_memory_bytes=attribute("MAX_SHARED_MEMORY_PER_BLOCK_OPTIN"),
                        max_local_dim_sizes=(attribute("MAX_BLOCK_DIM_X"), attribute("MAX_BLOCK_DIM_Y"), attribute("MAX_BLOCK_DIM_Z")),
                        tensor_cores=device.compute_capability() >= (8, 0), warpgroups=device.compute_capability() == (9, 0),
                        compute_units=attribute("MULTIPROCESSOR_COUNT"), warp_shuffles=True)
  backend = Compiled("CUDA", CUDAAllocator(), render_cuda, compiler.compile, language="CUDA C", threads=True,
                     max_local=min(256, attribute("MAX_THREADS_PER_BLOCK")), target=target,
                     compile_binary=functools.partial(compile_cuda, arch=compiler.arch, output="cubin"), load=compiler.load,
                     arch=f"{device.name()} {compiler.arch} NVRTC {nvrtc_version()}", graph=CUDAGraph)
  # the profiler's ceilings from the driver: float32 FMA lanes x 2 x SM clock (64 lanes an SM on sm_70 to sm_80, 128 from sm_86), and
  # the memory's transfers a second (2 per clock) x its bus width
  lanes = 64 if device.compute_capability() <= (8, 0) else 128
  backend.peaks = (attribute("MULTIPROCESSOR_COUNT") * lanes * 2 * attribute("CLOCK_RATE") * 1e-6,
                   2 * attribute("MEMORY_CLOCK_RATE") * attribute("GLOBAL_MEMORY_BUS_WIDTH") / 8 * 1e-6)
  return backend
