"""The device registry, buffers and their allocator cache, the LLVM backend's program cache, DEBUG output, and the errors
a user can meet there."""
import re, time
import numpy as np
import pytest
from tinyc import Tensor, Device, GlobalCounters
from tinyc.device import Buffer, CompileError
from tinyc.dtype import dtypes
from tinyc.helpers import BEAM, Context, getenv
from tinyc.ops import LoadOps
from tinyc.schedule import create_schedule

def test_default_device_and_selection(monkeypatch):
  for name in ("CUDA", "GPU", "LLVM", "DEVICE"): monkeypatch.delenv(name, raising=False)
  assert Device.DEFAULT == ("CUDA" if Device.usable("CUDA") else "LLVM")  # with nothing set: CUDA where usable
  monkeypatch.setenv("LLVM", "1")
  assert Device.DEFAULT == "LLVM"
  monkeypatch.setenv("DEVICE", "llvm")
  assert Device.DEFAULT == "LLVM"
  assert Tensor([1, 2]).device == "LLVM"

def test_unknown_device_names_the_value_and_the_choices():
  with pytest.raises(ValueError, match=r"unknown device 'TPU'.*LLVM"): Tensor([1.0], device="TPU")
  with pytest.raises(ValueError, match="unknown device 'NOPE'"): Device["NOPE"]

def test_buffer_round_trip_every_dtype():
  for dtype in (dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.int32, dtypes.uint32, dtypes.int64, dtypes.float16,
                dtypes.float32, dtypes.float64):
    data = (np.arange(12) % 3).astype(dtype.np)
    np.testing.assert_equal(Buffer("LLVM", 12, dtype).copyin(data).numpy(), data)

def test_freed_memory_is_reused_by_the_allocator():
  buffer = Buffer("LLVM", 1000, dtypes.float32)
  memory = buffer.opaque
  del buffer
  assert Buffer("LLVM", 1000, dtypes.float32).opaque is memory

def test_memory_held_by_buffers_is_counted_while_they_live():
  before = GlobalCounters.mem_used
  buffer = Buffer(Device.DEFAULT, 1000, dtypes.float32)
  assert GlobalCounters.mem_used == before, "a buffer takes memory when first used"
  buffer.opaque
  assert GlobalCounters.mem_used == before + 4000
  del buffer  # given back to the allocator's free list: no longer held
  assert GlobalCounters.mem_used == before
  again = Buffer(Device.DEFAULT, 1000, dtypes.float32).copyin(np.zeros(1000, np.float32))  # from the free list: counted again
  assert GlobalCounters.mem_used == before + 4000
  del again
  assert GlobalCounters.mem_used == before

def test_settings_follow_the_environment_and_context(monkeypatch):
  monkeypatch.delenv("BEAM", raising=False)
  assert BEAM.value == 0 and getenv("BEAM", 0) == 0 and getenv("BEAM", "x") == "x"
  monkeypatch.setenv("BEAM", "3")
  assert BEAM.value == 3 and BEAM >= 3 and getenv("BEAM", 0) == 3 and getenv("BEAM", "") == "3"
  with Context(BEAM=1): assert BEAM.value == 1
  monkeypatch.delenv("BEAM")
  assert BEAM.value == 0 and not BEAM

def test_repeated_kernel_is_compiled_once():
  device = Device[Device.DEFAULT]
  x = Tensor(np.arange(6, dtype=np.float32)).realize()
  (x * 3.25 + 1).realize()
  programs = len(device.programs)
  for _ in range(3): (x * 3.25 + 1).realize()
  assert len(device.programs) == programs

def test_debug_levels(capsys):
  x = Tensor(np.ones((4, 4), np.float32)).realize()
  with Context(DEBUG=2): (x * 7.5).realize()
  out = capsys.readouterr().out
  assert "E_" in out and "GFLOP/s" in out and "GB/s" in out
  with Context(DEBUG=3): (x * 8.5).sum(1).realize()
  assert "STORE" in (out := capsys.readouterr().out) and "SUM" in out and "LOAD buf1" in out and "opts: [" in out
  assert "layout:" in out and re.search(r"(reduce|unroll|group)\[0\]", out), "DEBUG=3 prints every axis with its kind and the reduces that own it"
  with Context(DEBUG=4): (x * 9.5).realize()
  source_start = {"LLVM": 'define void @"E_', "CUDA": '__global__ void E_', "GPU": "__kernel void E_"}[Device.DEFAULT]
  assert source_start in capsys.readouterr().out

def test_kernel_counters():
  x = Tensor(np.ones((8, 8), np.float32)).realize()
  GlobalCounters.reset()
  (x * 2 + 1).realize()
  assert GlobalCounters.kernel_count == 1
  assert GlobalCounters.global_ops == 2 * 64 and GlobalCounters.global_mem == 2 * 64 * 4

def test_compile_error_is_typed_and_shows_the_source_at_debug_4():
  # the marker is a C comment on its own line after the error: no compiler quotes it in its log, DEBUG=4 shows all of it
  compile_fn, source = Device[Device.DEFAULT].compile, "define void @broken() { not valid in any language }\n/* the whole kernel */"
  with pytest.raises(CompileError, match="(?s)rejected kernel broken.*DEBUG=4") as error: compile_fn("broken", source)
  assert "the whole kernel" not in str(error.value)
  with Context(DEBUG=4), pytest.raises(CompileError, match="the whole kernel"): compile_fn("broken", source)
  assert (Tensor([1.0, 2.0]) * 2).tolist() == [2.0, 4.0]  # the device is still usable

def test_out_of_memory_is_a_clear_error_and_the_device_stays_usable():
  with pytest.raises(MemoryError, match="bytes|memory"): Tensor.empty(1 << 42, dtype=dtypes.float32).realize().lazydata.realized.opaque
  assert (Tensor([3.0]) + 1).tolist() == [4.0]

def test_integer_division_by_zero_does_not_crash():
  x, zero = Tensor([7, -7, 3], dtype=dtypes.int32), Tensor([0, 0, 0], dtype=dtypes.int32)
  assert len((x // zero).numpy()) == 3 and len((x % zero).numpy()) == 3
  big = Tensor([-2**31], dtype=dtypes.int32)
  assert (big // -1).numpy().shape == (1,)  # INT_MIN / -1 traps on x86; it must not take the process down

def test_bitcast_to_and_from_16_bit_floats():
  # found while writing nn.state: i16 -> bfloat16 bitcast did not compile (bfloat16 lives in float registers)
  bits = np.array([0x3F80, 0xC000, 0x7F80], np.uint16)  # 1.0, -2.0, inf in bfloat16
  np.testing.assert_equal(Tensor(bits).bitcast(dtypes.bfloat16).numpy(), [1.0, -2.0, np.inf])
  np.testing.assert_equal(Tensor(bits).bitcast(dtypes.bfloat16).bitcast(dtypes.uint16).numpy(), bits)
  halves = np.array([1.0, -2.5], np.float16)
  np.testing.assert_equal(Tensor(halves).bitcast(dtypes.bfloat16).bitcast(dtypes.float16).numpy(), halves)
  np.testing.assert_equal(Tensor(halves).bitcast(dtypes.int16).numpy(), halves.view(np.int16))

def test_to_moves_data_between_devices_and_mixing_devices_raises():
  others = [name for name in ("GPU", "CUDA") if name != Device.DEFAULT and Device.usable(name)] + ["LLVM"]
  x = Tensor(np.arange(6, dtype=np.float32).reshape(2, 3))
  for name in others:
    moved = (x + 1).to(name)
    assert moved.device == name
    np.testing.assert_equal((moved * 2).to(Device.DEFAULT).numpy(), (np.arange(6).reshape(2, 3) + 1) * 2)
    if name != Device.DEFAULT:
      with pytest.raises(RuntimeError, match="same device"): _ = x + moved
  bf = Tensor(np.array([1.5, -2.0], np.float32), dtype=dtypes.bfloat16).to(others[0])
  np.testing.assert_equal(bf.numpy(), [1.5, -2.0])  # copies move raw bytes: 16-bit floats survive

def test_asking_for_a_missing_backend_says_how_to_fix_it(monkeypatch):
  if Device.usable("CUDA"): pytest.skip("this machine has CUDA")
  with pytest.raises(RuntimeError, match="CUDA") as error: Device["CUDA"]
  assert "pip install" in str(error.value) or "driver" in str(error.value) or "GPU" in str(error.value)

def test_cuda_kernels_still_run_after_torch_used_the_gpu():
  # found by bench_train on the H200: torch made the runtime's primary context current, and the next tinyc kernel failed with
  # "invalid resource handle" because it lived in a context of its own
  torch = pytest.importorskip("torch")
  if Device.DEFAULT != "CUDA" or not torch.cuda.is_available(): pytest.skip("needs CUDA=1 and a CUDA build of torch")
  x = Tensor(np.arange(10, dtype=np.float32))
  np.testing.assert_allclose((x * 2).numpy(), np.arange(10) * 2)
  assert float((torch.arange(10, device="cuda") * 3).sum().item()) == 135
  np.testing.assert_allclose((x + 5).numpy(), np.arange(10) + 5)

def test_a_program_built_without_opts_is_not_served_with_them():
  """NOOPT changes what a kernel compiles to: within one process too, the other setting gets its own program."""
  a, b = Tensor.rand(64, 64).realize(), Tensor.rand(64, 64).realize()
  (item,) = [item for item in create_schedule([(a @ b).lazydata]) if item.ast.op not in LoadOps]
  device = Device[Device.DEFAULT]
  with Context(NOOPT=1): plain = device.get_program(item.ast)
  assert device.get_program(item.ast) is not plain

def test_a_cuda_timed_run_counts_the_kernel_not_a_slow_launch(monkeypatch):
  """BEAM's timings: a launch the host makes late (a core busy with builds) does not count in the kernel's time."""
  if Device.DEFAULT != "CUDA": pytest.skip("CUDA's timed runs")
  from tinyc.runtime import ops_cuda
  out = (Tensor.empty(256).realize() + 1)
  item = create_schedule([out.lazydata])[-1]
  program = Device["CUDA"].get_program(item.ast, ())
  buffers = [Buffer("CUDA", 256, dtypes.float32) for _ in range(2)]
  run = lambda: program.run([buf.opaque for buf in buffers], global_size=program.global_size, local_size=program.local_size, wait=True)  # noqa: E731
  assert run() < 1e-3
  packer = ops_cuda._parameter_packer
  monkeypatch.setattr(ops_cuda, "_parameter_packer", lambda *sizes: (time.sleep(0.005), packer(*sizes))[1])  # 5 ms late
  assert min(run() for _ in range(3)) < 1e-3
  monkeypatch.undo()
  with pytest.raises(RuntimeError):  # a launch the driver refuses (more threads than a block may have): the gate opens again
    program.run([buf.opaque for buf in buffers], global_size=(4096, 1, 1), local_size=(4096, 1, 1), wait=True)
  started = time.perf_counter()
  run()
  assert time.perf_counter() - started < 0.05, "the next run waited for a gate left shut"
