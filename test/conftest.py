"""Runs the suite on every device, and compiles every kernel it makes as CUDA too.

- With CUDA=1, GPU=1, LLVM=1 or DEVICE=NAME set, every test runs on that device. With none set, the modules in EVERY_DEVICE run
  once per usable device: LLVM, and OpenCL where a platform is installed (CI installs PoCL); the rest runs on the default device.
  PoCL takes 0.2-0.4 s to build and first launch a kernel, and CI starts with its caches empty: OpenCL runs the op suite (what
  each op, dtype and cast renders as C, and the fuzzed Opts that only a GPU target has: locals, groups), not the modules whose
  kernels are of those kinds many times over (matmul grids, training steps, search and cache machinery). On PoCL those took
  2547 s of a cold run's 3368 s of tests; the H200 runs every module with GPU=1 and CUDA=1.
- A test of those modules marked `one_device` runs on LLVM alone: a sweep (movement, indexing, pow, scalar ops) whose pieces the
  op suite's other tests render on each device. One marked `no_cuda_check` is not also compiled as CUDA (below).
- Wherever NVRTC is found (CI installs the nvidia-cuda-nvrtc wheel) and the device is not CUDA itself, every kernel the
  suite builds is also rendered as CUDA C and compiled to PTX, so a CUDA codegen bug fails CI without a GPU.
"""
from __future__ import annotations
import hashlib, os
import pytest
from tinyc.device import Compiled, Device

EVERY_DEVICE = {"test_ops", "test_dtype", "test_tensor", "test_schedule", "test_runtime", "test_jit", "test_opt_fuzz", "test_kernel_opts",
                "test_index_checks", "test_empty", "test_transcendental"}
SELECTORS = ("CUDA", "GPU", "LLVM", "DEVICE")

def devices_to_test() -> list[str]:
  if any(os.environ.get(name) for name in SELECTORS): return [Device.DEFAULT]
  return ["LLVM"] + (["GPU"] if Device.usable("GPU") else [])

def pytest_generate_tests(metafunc: pytest.Metafunc) -> None:
  if "tinyc_device" in metafunc.fixturenames and metafunc.module.__name__.split(".")[-1] in EVERY_DEVICE:
    one_device = metafunc.definition.get_closest_marker("one_device") is not None
    metafunc.parametrize("tinyc_device", devices_to_test()[:1] if one_device else devices_to_test(), indirect=True)

@pytest.fixture
def tinyc_device(request: pytest.FixtureRequest) -> str | None: return getattr(request, "param", None)

@pytest.fixture(autouse=True, scope="session")
def _cache_dir_of_the_session(tmp_path_factory: pytest.TempPathFactory):
  """Programs and BEAM results are cached in a directory of this session, never in the user's (CACHE_DIR, CACHEDB)."""
  with pytest.MonkeyPatch.context() as patch:
    patch.setenv("CACHE_DIR", str(tmp_path_factory.mktemp("tinyc_cache")))
    patch.delenv("CACHEDB", raising=False)
    yield

@pytest.fixture(autouse=True)
def _on_device(tinyc_device: str | None, monkeypatch: pytest.MonkeyPatch) -> None:
  """Make the parametrized device the default one for this test."""
  if tinyc_device is not None and not any(os.environ.get(name) for name in SELECTORS): monkeypatch.setenv("DEVICE", tinyc_device)

CHECK_CUDA = [True]  # off in a test marked no_cuda_check

@pytest.fixture(autouse=True)
def _no_cuda_check(request: pytest.FixtureRequest):
  """A sweep of shapes marked no_cuda_check: the module's other tests check its kind of kernel as CUDA (linearizing a Winograd
  transform as for an H200 took 90% of each shape's time)."""
  CHECK_CUDA[0] = request.node.get_closest_marker("no_cuda_check") is None
  yield
  CHECK_CUDA[0] = True

def _nvrtc_available() -> bool:
  if os.environ.get("CUDA") == "1" or os.environ.get("DEVICE", "").upper() == "CUDA": return False  # the real thing runs
  try:
    from tinyc.runtime.nvrtc import load_nvrtc
    load_nvrtc()
    return True
  except (ImportError, RuntimeError): return False

@pytest.fixture(autouse=True, scope="session")
def _compile_every_kernel_as_cuda(tmp_path_factory: pytest.TempPathFactory):
  """Wrap Compiled.get_program so each new kernel is also rendered as CUDA and compiled to PTX for sm_90 by NVRTC: once a run, as a
  marker file (shared by the run's xdist workers; named by the AST, the Opts and tinyc's code) says which were checked. The LLVM and
  OpenCL cases of a test often make the same kernels in different workers (test_ops here: 2206 checks -> 1848, 103 s -> 93 s)."""
  if not _nvrtc_available():
    yield
    return
  from tinyc.codegen.search import ast_text, code_version
  checked = tmp_path_factory.getbasetemp().parent / f"cuda-checked-{code_version()[:16]}"
  checked.mkdir(exist_ok=True)
  from tinyc.codegen.cstyle import render_cuda
  from tinyc.codegen.heuristic import hand_coded_optimizations
  from tinyc.codegen.kernel import GPU_MAX_UPCAST, Kernel, KernelOptError, KernelTarget
  H200_TARGET = KernelTarget(has_local=True, tensor_cores=True, warpgroups=True, warp_shuffles=True, local_memory_bytes=227 * 1024,
                             max_upcast=GPU_MAX_UPCAST,
                             compute_units=132)
  from tinyc.codegen.linearizer import Linearizer
  from tinyc.runtime.nvrtc import compile_cuda
  original, seen = Compiled.get_program, set()
  def get_program_and_check_cuda(self, ast, opts=None):  # type: ignore[no-untyped-def]
    program = original(self, ast, opts)
    if CHECK_CUDA[0] and (ast, opts) not in seen:
      seen.add((ast, opts))
      if (marker := checked / hashlib.sha256(repr((ast_text(ast), opts)).encode()).hexdigest()[:40]).exists(): return program
      kernel = Kernel(ast, H200_TARGET)  # as on an H200: what the GPU heuristic or the Opts make of it
      if opts is None: hand_coded_optimizations(kernel)
      try:
        for opt in opts or (): kernel.apply_opt(opt)
      except KernelOptError: return program  # Opts this device allows and an H200 does not (PoCL's work-groups are larger)
      kernel.limit_global_dims(3)
      compile_cuda(program.name, render_cuda(program.name, Linearizer(kernel, threads=True).linearize()), "sm_90a", "ptx")
      marker.touch()
    return program
  Compiled.get_program = get_program_and_check_cuda
  yield
  Compiled.get_program = original
