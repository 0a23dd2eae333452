"""Layer 4: the LLVM backend: llvmlite compiles IR to native code for this CPU, ctypes calls it. Imports helpers, dtype,
device, codegen/; llvmlite.binding appears only here.

Facts that shaped it: llvmlite >= 0.45 has no llvm.initialize() and no legacy pass managers (the new pass builder is used);
a target machine made without the host's CPU name and features emits SSE only, so they are passed explicitly.
"""
from __future__ import annotations
import ctypes, time
from typing import Callable
import numpy as np
import llvmlite.binding as llvm
from tinyc.helpers import DEBUG
from tinyc.device import Allocator, Compiled, CompileError
from tinyc.codegen.llvmir import render_llvm

class HostMemory:
  """A block of CPU memory: a numpy byte array (64-byte aligned, for aligned vector loads) and its address for ctypes."""
  __slots__ = ("array", "pointer")
  def __init__(self, nbytes: int) -> None:
    raw = np.empty(nbytes + 64, dtype=np.uint8)
    start = (-raw.ctypes.data) % 64
    self.array = raw[start:start + nbytes]
    self.pointer = ctypes.c_void_p(raw.ctypes.data + start)

class HostAllocator(Allocator):
  def _alloc(self, nbytes: int) -> HostMemory:
    try: return HostMemory(nbytes)
    except MemoryError as error: raise MemoryError(f"out of host memory allocating {nbytes} bytes for an LLVM buffer ({error})") from error
  def copyin(self, dest: HostMemory, src: memoryview) -> None: dest.array[:] = np.frombuffer(src, dtype=np.uint8)
  def copyout(self, dest: memoryview, src: HostMemory) -> None: np.frombuffer(dest, dtype=np.uint8)[:] = src.array

class LLVMCompiler:
  """One MCJIT engine for the process; each kernel's IR is optimized at O3 and added as a module. Cached by IR text."""
  def __init__(self) -> None:
    llvm.initialize_native_target()
    llvm.initialize_native_asmprinter()
    target = llvm.Target.from_default_triple()
    self.target_machine = target.create_target_machine(cpu=llvm.get_host_cpu_name(), features=llvm.get_host_cpu_features().flatten(), opt=3)
    self.engine = llvm.create_mcjit_compiler(llvm.parse_assembly(""), self.target_machine)
    self.cache: dict[str, int] = {}

  def compile(self, name: str, source: str) -> Callable[..., float | None]:
    if source not in self.cache:
      try:
        module = llvm.parse_assembly(source)
        module.verify()
      except RuntimeError as error:
        hint = source if DEBUG >= 4 else "(run with DEBUG=4 to see the IR)"
        raise CompileError(f"LLVM rejected kernel {name}: {error}\n{hint}") from error
      module.triple, module.data_layout = self.target_machine.triple, str(self.target_machine.target_data)
      tuning = llvm.create_pipeline_tuning_options(speed_level=3)
      tuning.loop_vectorization, tuning.slp_vectorization = True, True
      pass_builder = llvm.create_pass_builder(self.target_machine, tuning)
      pass_builder.getModulePassManager().run(module, pass_builder)
      if DEBUG >= 5: print(self.target_machine.emit_assembly(module))
      self.engine.add_module(module)
      self.engine.finalize_object()
      self.cache[source] = self.engine.get_function_address(name)
    return make_runner(self.cache[source])

def make_runner(address: int) -> Callable[..., float | None]:
  function = ctypes.CFUNCTYPE(None)(address)  # no argtypes: each call passes c_void_p pointers as they are
  def run(*buffers: HostMemory, global_size: object = None, local_size: object = None, wait: bool = False) -> float | None:
    started = time.perf_counter()
    function(*[buf.pointer for buf in buffers])
    return time.perf_counter() - started if wait else None
  return run

def open_device() -> Compiled:
  compiler = LLVMCompiler()
  return Compiled("LLVM", HostAllocator(), render_llvm, compiler.compile)
