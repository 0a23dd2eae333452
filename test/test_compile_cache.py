"""Parallel, cached builds (device.py): a schedule's new kernels build at once in worker processes and compute what a serial build
computes; a second process loads every kernel from the disk cache without lowering or compiling it; the cache's key covers every
part that changes a program; the cache file is shared safely and a file tinyc did not make is refused. Runs on every device."""
from __future__ import annotations
import contextlib, json, os, sqlite3, subprocess, sys, time
import numpy as np
import pytest
from tinyc import Tensor
from tinyc.device import Device
from tinyc.helpers import Context
from tinyc.codegen.kernel import Opt, OptOps
from tinyc.codegen import search
from tinyc.ops import LoadOps
from tinyc.schedule import create_schedule
from tinyc import device as device_module

@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
  monkeypatch.setenv("CACHEDB", str(tmp_path / "cache.db"))

def several_kernels(rows: int) -> tuple[Tensor, np.ndarray]:
  """Five kernels of shapes no other test makes (a reduce, an expand of it, a matmul, a max and a cumulative sum)."""
  x = np.random.default_rng(rows).standard_normal((rows, 11)).astype(np.float32)
  t = Tensor(x)
  out = (t - t.mean(1, keepdim=True)).exp() @ Tensor(x.T) + t.max(0).sum() + t.cumsum(1)[:, -1:].sum()
  exp = np.exp(x - x.mean(1, keepdims=True))
  return out, exp @ x.T + x.max(0).sum() + x.cumsum(1)[:, -1:].sum()

def test_a_schedule_of_new_kernels_builds_in_workers_as_a_serial_build_does(tinyc_device, tmp_path, monkeypatch):
  device, results = Device[Device.DEFAULT], {}
  for parallel in (2, 0):
    monkeypatch.setenv("CACHEDB", str(tmp_path / f"cache{parallel}.db"))  # each builds anew
    device.programs.clear()
    before = dict(device.builds)
    with Context(PARALLEL_BUILD=parallel):
      out, expected = several_kernels(13)
      results[parallel] = out.numpy()
    in_workers = device.builds["in workers"] - before.get("in workers", 0)
    assert (in_workers >= 4) if parallel else (in_workers == 0), (parallel, before, device.builds)
  np.testing.assert_allclose(results[2], expected, rtol=1e-4, atol=1e-4)
  np.testing.assert_array_equal(results[2], results[0])

RUN = """
import json, sys
import numpy as np
sys.path.insert(0, sys.argv[1])
from test_compile_cache import several_kernels
from tinyc import Device
out, expected = several_kernels(int(sys.argv[2]))
np.testing.assert_allclose(out.numpy(), expected, rtol=1e-4, atol=1e-4)
print(json.dumps(dict(Device[Device.DEFAULT].builds)))
"""

def run_in_processes(rows: list[int], start_together: bool = False) -> list[dict[str, int]]:
  environment = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
  script = ("import time\nwhile time.time() < float(sys.argv[3]): time.sleep(0.005)\n" if start_together else "") + RUN
  script = script.replace("import time\n", "import sys, time\n", 1)
  start = str(time.time() + 3)  # each imports tinyc first, then they begin together
  processes = [subprocess.Popen([sys.executable, "-c", script, os.path.dirname(__file__), str(n), start], env=environment, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE) for n in rows]
  results = [process.communicate(timeout=300) for process in processes]
  assert all(process.returncode == 0 for process in processes), results
  return [json.loads(out.strip().splitlines()[-1]) for out, _ in results]

def test_a_second_process_loads_every_kernel_from_disk(tinyc_device):
  first, = run_in_processes([17])
  assert first.get("built", 0) >= 5 and first.get("from disk", 0) == 0, first
  second, = run_in_processes([17])
  assert second == {"from disk": first["built"]}, (first, second)  # nothing lowered, rendered or compiled

def test_two_processes_building_at_once_share_the_cache(tinyc_device):
  counts = run_in_processes([19, 23], start_together=True)
  with contextlib.closing(sqlite3.connect(os.environ["CACHEDB"])) as connection:
    assert connection.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    rows = connection.execute("SELECT count(*) FROM programs").fetchone()[0]
  assert rows >= max(count["built"] for count in counts), (rows, counts)
  assert run_in_processes([19]) == [{"from disk": counts[0]["built"] + counts[0].get("from disk", 0)}]

SAME_PROGRAMS = """
import sys, time
import numpy as np
from tinyc import Tensor
scale, start = float(sys.argv[1]), float(sys.argv[2])
x = np.linspace(-1, 1, 24, dtype=np.float32)
while time.time() < start: time.sleep(0.005)
for k in range(12): np.testing.assert_allclose((Tensor(x) * (scale + k)).exp2().numpy(), np.exp2(x * np.float32(scale + k)), rtol=1e-5)
print("ok")
"""

def test_processes_building_the_same_new_programs_at_once_all_finish(tinyc_device, tmp_path):
  """Each process has a cache of its own, so each builds the same twelve programs at the same moments as the others. Their constants
  are new to this run, so the driver's own caches miss too (pocl 3.1 aborted a process loading a program another was writing)."""
  scale, start = 1 + time.time_ns() % 999_983 / 1e6, time.time() + 3
  processes = [subprocess.Popen([sys.executable, "-c", SAME_PROGRAMS, str(scale), str(start)], text=True, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, env={**os.environ, "CACHEDB": str(tmp_path / f"cache{n}.db"),
                                                             "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}) for n in range(4)]
  results = [process.communicate(timeout=300) for process in processes]
  assert all(process.returncode == 0 and out.strip() == "ok" for process, (out, _) in zip(processes, results)), results

def test_the_program_key_covers_the_kernel_its_opts_the_device_the_settings_and_the_code(tinyc_device, monkeypatch):
  device = Device[Device.DEFAULT]
  asts = [next(i.ast for i in create_schedule([out.lazydata]) if i.ast.op not in LoadOps)
          for out in (Tensor.empty(16, 16).sum(1), Tensor.empty(16, 16).max(1), Tensor.empty(16, 8).sum(1))]
  keys = [device.program_key(ast, None) for ast in asts] + [device.program_key(asts[0], (Opt(OptOps.UPCAST, 0, 4),))]
  for setting in ("ALLOW_TF32", "NOOPT"):
    with Context(**{setting: 1}): keys.append(device.program_key(asts[0], None))
  monkeypatch.setattr(device_module, "code_version", lambda: "another tinyc")
  keys.append(device.program_key(asts[0], None))
  monkeypatch.undo()
  monkeypatch.setattr(device, "arch", device.arch + " another compiler")
  keys.append(device.program_key(asts[0], None))
  assert len(set(keys)) == len(keys), keys

def test_a_row_this_version_cannot_read_is_built_again(tinyc_device):
  device = Device[Device.DEFAULT]
  out, expected = several_kernels(29)
  np.testing.assert_allclose(out.numpy(), expected, rtol=1e-4, atol=1e-4)
  with contextlib.closing(sqlite3.connect(os.environ["CACHEDB"])) as connection, connection:
    connection.execute("UPDATE programs SET program = '{\"not\": \"a program\"}'")
  device.programs.clear()
  built = device.builds["built"]
  out, expected = several_kernels(29)
  np.testing.assert_allclose(out.numpy(), expected, rtol=1e-4, atol=1e-4)
  assert device.builds["built"] - built >= 5

def test_a_cache_file_tinyc_did_not_make_is_refused_and_left_untouched(tinyc_device, tmp_path):
  path = tmp_path / "cache.db"
  path.write_bytes(b"my notes, not a database\n" * 100)
  Device[Device.DEFAULT].programs.clear()
  with pytest.raises(search.CacheFileError, match=f"{path}.*CACHEDB"): several_kernels(31)[0].numpy()
  assert path.read_bytes() == b"my notes, not a database\n" * 100
