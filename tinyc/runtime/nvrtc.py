"""Layer 4: NVRTC, NVIDIA's runtime compiler, through ctypes: CUDA C -> PTX or a cubin, with no GPU and no pycuda needed.
Imports helpers, device. Found in NVRTC_PATH, the CUDA toolkit (/usr/local/cuda/lib64) or the nvidia-cuda-nvrtc wheel.

NVRTC compiles a small kernel in ~10 ms where nvcc takes ~400 ms, which is why tinyc uses it (25-35 ms for a training step's
kernels on the H200's host). It releases the GIL while it compiles. Cubins are cached on disk with the rest of a program (device.py).
"""
from __future__ import annotations
import ctypes, functools, glob, os, sys
from tinyc.helpers import DEBUG, getenv
from tinyc.device import CompileError

def _candidates() -> list[str]:
  found = [getenv("NVRTC_PATH", "")] if getenv("NVRTC_PATH", "") else []
  for folder in ("/usr/local/cuda/lib64", "/usr/lib/x86_64-linux-gnu"): found += sorted(glob.glob(f"{folder}/libnvrtc.so*"), reverse=True)
  for site in sys.path:  # the pip wheels: nvidia/cu13/lib (CUDA 13) or nvidia/cuda_nvrtc/lib (CUDA 12)
    found += sorted(glob.glob(os.path.join(site, "nvidia", "*", "lib", "libnvrtc.so*")), reverse=True)
  return [path for path in found if "builtins" not in path]

@functools.cache
def load_nvrtc() -> ctypes.CDLL:
  """The NVRTC library, or a RuntimeError saying how to get it."""
  errors = []
  for path in _candidates():
    try:
      # the wheel's libnvrtc finds its builtins library only if it is already loaded globally
      for builtins in glob.glob(os.path.join(os.path.dirname(path), "libnvrtc-builtins.so*")): ctypes.CDLL(builtins, mode=ctypes.RTLD_GLOBAL)
      library = ctypes.CDLL(path)
      library.nvrtcGetErrorString.restype = ctypes.c_char_p
      return library
    except OSError as error: errors.append(f"{path}: {error}")
  raise RuntimeError("NVRTC not found: install the CUDA toolkit or `pip install nvidia-cuda-nvrtc`, or set NVRTC_PATH"
                     + (f" ({'; '.join(errors)})" if errors else ""))

def nvrtc_version() -> tuple[int, int]:
  major, minor = ctypes.c_int(), ctypes.c_int()
  load_nvrtc().nvrtcVersion(ctypes.byref(major), ctypes.byref(minor))
  return major.value, minor.value

def compile_cuda(name: str, source: str, arch: str, output: str = "cubin") -> bytes:
  """Compile CUDA C for `arch` (e.g. "sm_90"): output "cubin" (machine code) or "ptx". Errors show NVRTC's log."""
  assert output in ("cubin", "ptx"), f"NVRTC output is cubin or ptx, not {output}"
  nvrtc, program = load_nvrtc(), ctypes.c_void_p()
  def check(status: int, what: str) -> None:
    if status != 0: raise CompileError(f"NVRTC {what} failed for kernel {name}: {nvrtc.nvrtcGetErrorString(status).decode()}")
  check(nvrtc.nvrtcCreateProgram(ctypes.byref(program), source.encode(), f"{name}.cu".encode(), 0, None, None), "create")
  try:
    target = arch if output == "cubin" else arch.replace("sm_", "compute_")
    options = [f"--gpu-architecture={target}".encode(), b"-default-device", b"--std=c++17"]
    status = nvrtc.nvrtcCompileProgram(program, len(options), (ctypes.c_char_p * len(options))(*options))
    if status != 0:
      size = ctypes.c_size_t()
      nvrtc.nvrtcGetProgramLogSize(program, ctypes.byref(size))
      log = ctypes.create_string_buffer(size.value)
      nvrtc.nvrtcGetProgramLog(program, log)
      hint = source if DEBUG >= 4 else "(run with DEBUG=4 to see the source)"
      raise CompileError(f"NVRTC rejected kernel {name} for {arch}:\n{log.value.decode(errors='replace')}\n{hint}")
    size = ctypes.c_size_t()
    get_size, get = (nvrtc.nvrtcGetCUBINSize, nvrtc.nvrtcGetCUBIN) if output == "cubin" else (nvrtc.nvrtcGetPTXSize, nvrtc.nvrtcGetPTX)
    check(get_size(program, ctypes.byref(size)), "size query")
    data = ctypes.create_string_buffer(size.value)
    check(get(program, data), "output")
    return data.raw
  finally: nvrtc.nvrtcDestroyProgram(ctypes.byref(program))
