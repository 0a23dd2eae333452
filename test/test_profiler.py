"""PROFILE: a Chrome trace of scheduling, compiles and kernel runs (profiler.py), written atomically, and the summary of the top kernels."""
import json
import numpy as np
import pytest
from tinyc import Tensor, profiler
from tinyc.helpers import Context

def run_graphs(scale: float) -> np.ndarray:
  data = np.arange(64, dtype=np.float32).reshape(8, 8)
  x = Tensor(data).realize()
  out = None
  for _ in range(3): out = ((x * scale + 1).sum(1)).realize()  # a new kernel (the scale is new), then the same plan twice
  np.testing.assert_allclose(out.numpy(), (data * scale + 1).sum(1), rtol=1e-6)
  return data

def test_the_trace_holds_schedules_compiles_and_kernel_runs(tmp_path, capsys):
  path = tmp_path / "trace.json"
  profiler.finish()  # whatever another test left
  with Context(PROFILE=str(path)): run_graphs(scale=0.3125)
  assert profiler.finish() == str(path)
  trace = json.loads(path.read_text())["traceEvents"]
  spans = [event for event in trace if event["ph"] == "X"]
  assert all(event["dur"] >= 0 and event["ts"] >= 0 for event in spans)
  schedules = [event for event in spans if event["cat"] == "schedule"]
  assert [event["args"]["reused_plan"] for event in schedules] == [False, True, True]
  assert any(event["cat"] == "compile" and event["name"].startswith("compile r_") for event in spans)
  kernels = [event for event in spans if event["cat"] == "kernel"]
  assert len(kernels) == 3 and len({event["name"] for event in kernels}) == 1 and all(event["dur"] > 0 for event in kernels)
  assert kernels[0]["args"]["flops"] > 0 and kernels[0]["args"]["bytes"] == (64 + 8) * 4
  tracks = {event["tid"]: event["args"]["name"] for event in trace if event["ph"] == "M"}
  assert tracks[kernels[0]["tid"]] == Tensor([1]).device and tracks[schedules[0]["tid"]] == "host"
  printed = capsys.readouterr().out
  assert kernels[0]["name"] in printed and "GFLOP/s" in printed and "of peak" in printed and str(path) in printed

def test_off_records_nothing():
  profiler.finish()
  run_graphs(scale=0.4375)
  assert profiler.events() == [] and profiler.finish() is None

def test_summary_ranks_kernels_by_total_time_with_their_rates():
  events = [profiler.Event("slow", "kernel", 0.0, 2e-3, "CUDA", {"flops": 4_000_000, "bytes": 8_000_000, "peaks": (100.0, 10.0)}),
            profiler.Event("fast", "kernel", 0.0, 1e-3, "LLVM", {"flops": 1_000_000, "bytes": 0, "peaks": None}),
            profiler.Event("slow", "kernel", 0.0, 2e-3, "CUDA", {"flops": 4_000_000, "bytes": 8_000_000, "peaks": (100.0, 10.0)}),
            profiler.Event("compile slow", "compile", 0.0, 0.5, "host", {})]
  lines = profiler.summary(events).splitlines()
  slow, fast = lines[1].split(), lines[2].split()
  assert slow[:4] == ["slow", "CUDA", "2", "4.000"] and slow[5:] == ["2.00", "4.00", "40.0%"]  # 4 GB/s of 10: the nearer ceiling
  assert fast[:4] == ["fast", "LLVM", "1", "1.000"] and fast[-1] == "-"
  assert "no peak figures for LLVM" in lines[3] and "compile 500.0 ms" in lines[4]

def test_a_failed_write_leaves_the_old_trace_whole(tmp_path, monkeypatch):
  path = tmp_path / "trace.json"
  events = [profiler.Event("k", "kernel", 1.0, 1e-6, "LLVM", {"flops": 1, "bytes": 4, "peaks": None})]
  profiler.write_trace(events, str(path))
  before = path.read_text()
  def broken_dump(value, file):
    file.write('{"traceEvents": [')
    raise OSError("disk full")
  monkeypatch.setattr(json, "dump", broken_dump)
  with pytest.raises(OSError, match="disk full"): profiler.write_trace(events * 2, str(path))
  assert path.read_text() == before and json.loads(before)["traceEvents"][-1]["name"] == "k"
  assert [child.name for child in tmp_path.iterdir()] == ["trace.json"]

def test_tinyjit_replays_are_profiled_kernel_by_kernel(tmp_path):
  from tinyc.jit import TinyJit
  step = TinyJit(lambda x: (x * 2 + 1).realize())
  profiler.finish()
  with Context(PROFILE=str(tmp_path / "jit.json")):
    for value in range(4): np.testing.assert_allclose(step(Tensor([float(value)] * 8).realize()).numpy(), [value * 2.0 + 1] * 8)
  kernels = [event for event in profiler.events() if event.category == "kernel"]
  assert len(kernels) == 4 and len({event.name for event in kernels}) == 1  # two runs, then two replays (a CUDA graph launches them one by one)
  profiler.finish()
