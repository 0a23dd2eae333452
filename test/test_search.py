"""BEAM search: results equal the unoptimized kernel's, the cache is hit on a second run and survives corruption, and broken
candidates (a compiler error, a crashed worker, a hung worker) are dropped without harm. Runs on every device of the op suite."""
from __future__ import annotations
import contextlib, multiprocessing, os, sqlite3, subprocess, sys, threading, time
import numpy as np
import pytest
from tinyc import Tensor, dtypes
from tinyc.device import Device, codegen_settings
from tinyc.helpers import Context, GlobalCounters
from tinyc.codegen.kernel import Kernel, Opt, OptOps
from tinyc.codegen import search
from tinyc.ops import LoadOps
from tinyc.schedule import create_schedule
from tinyc import beam

@pytest.fixture(autouse=True)
def fresh_cache(tmp_path, monkeypatch):
  monkeypatch.setenv("CACHEDB", str(tmp_path / "beam.db"))
  monkeypatch.setenv("BEAM_MAX_STEPS", "1")  # one step of the search is enough to test it, and keeps PoCL's compiles few
  beam._chosen.clear()

def matmul_inputs():
  rng = np.random.default_rng(0)
  return rng.standard_normal((16, 24), dtype=np.float32), rng.standard_normal((24, 8), dtype=np.float32)

def test_beam_matches_numpy_and_the_second_run_searches_nothing(tinyc_device, monkeypatch):
  if Device[Device.DEFAULT].compile_binary is None: pytest.skip(f"{Device.DEFAULT} cannot build in worker processes")
  a, b = matmul_inputs()
  with Context(BEAM=2): out = (Tensor(a) @ Tensor(b)).relu().numpy()
  np.testing.assert_allclose(out, np.maximum(a @ b, 0), rtol=1e-5, atol=1e-5)
  with sqlite3.connect(os.environ["CACHEDB"]) as connection: rows = connection.execute("SELECT opts FROM beam").fetchall()
  assert len(rows) == 1, rows
  beam._chosen.clear()
  Device[Device.DEFAULT].programs.clear()
  monkeypatch.setattr(beam, "search", lambda *args: pytest.fail("the cached kernel was searched again"))
  with Context(BEAM=2): again = (Tensor(a) @ Tensor(b)).relu().numpy()
  np.testing.assert_array_equal(again, out)

def test_every_candidate_a_search_times_is_recorded_as_data(tinyc_device, monkeypatch):
  """The dataset (issue 16): each candidate BEAM builds is a row of the cache's sqlite file, table candidates (the kernel's key, the
  device, the Opt list as JSON, whether it built, its time), and the kernel's AST text a row of table kernels. BEAM_RECORD=0
  records nothing."""
  if Device[Device.DEFAULT].compile_binary is None: pytest.skip(f"{Device.DEFAULT} cannot build in worker processes")
  monkeypatch.setattr(beam, "ROOFLINE_SLACK", 0.0)  # (a GPU launch takes about what this small kernel does: the search would end at once)
  a, b = matmul_inputs()
  with Context(BEAM=2): (Tensor(a) @ Tensor(b)).exp().realize()  # (a kernel no other test made: its plan is not kept in the process)
  with contextlib.closing(sqlite3.connect(os.environ["CACHEDB"])) as connection:
    kernels = connection.execute("SELECT kernel, ast FROM kernels").fetchall()
    rows = connection.execute("SELECT kernel, device, opts, built, seconds FROM candidates").fetchall()
    chosen = connection.execute("SELECT opts FROM beam").fetchall()
  assert len(kernels) == 1 and "ReduceOps.SUM" in kernels[0][1], kernels
  assert len(rows) >= 3 and all(row[0] == kernels[0][0] and row[1].startswith(Device.DEFAULT) for row in rows), rows
  assert all(row[4] > 0 for row in rows if row[3]) and chosen[0][0] in {row[2] for row in rows}, (rows, chosen)
  assert len({row[2] for row in rows}) == len(rows), "one row a candidate"
  with contextlib.closing(sqlite3.connect(os.environ["CACHEDB"])) as connection, connection: connection.execute("DELETE FROM candidates")
  searches = []
  monkeypatch.setattr(beam, "beam_steps", lambda *args, **kwargs: searches.append(1) or search.beam_steps(*args, **kwargs))
  monkeypatch.setenv("IGNORE_BEAM_CACHE", "1")
  monkeypatch.setenv("BEAM_RECORD", "0")
  with Context(BEAM=2): (Tensor(b).T @ Tensor(a).T).exp().realize()
  with contextlib.closing(sqlite3.connect(os.environ["CACHEDB"])) as connection:
    assert searches and connection.execute("SELECT count(*) FROM candidates").fetchone()[0] == 0

def test_a_winner_that_differs_from_the_unoptimized_kernel_is_neither_used_nor_cached(tinyc_device, monkeypatch):
  if Device[Device.DEFAULT].compile_binary is None: pytest.skip(f"{Device.DEFAULT} cannot build in worker processes")
  monkeypatch.setattr(beam, "outputs_match", lambda *args: False)
  x = np.arange(64, dtype=np.float32).reshape(8, 8)
  with Context(BEAM=2): np.testing.assert_allclose(Tensor(x).sum(1).numpy(), x.sum(1))
  assert not os.path.exists(os.environ["CACHEDB"]) or sqlite3.connect(os.environ["CACHEDB"]).execute("SELECT * FROM beam").fetchall() == []

def test_a_long_reductions_reordered_sum_passes_the_check_and_a_wrong_kernel_does_not(tinyc_device):
  """The winner's check allows the rounding of a long reduction split another way (a conv weight gradient: sums of 73728 products
  of about 270 whose outputs near 0 moved by 0.01 under GROUP, which the H200's CNN search took for a wrong kernel), not a wrong
  output."""
  device = Device[Device.DEFAULT]
  if not device.target.has_local: pytest.skip(f"{Device.DEFAULT} has no local memory: GROUP does not apply")
  x, w, upstream = Tensor.empty(128, 8, 26, 26), Tensor.empty(16, 8, 3, 3, requires_grad=True), Tensor.empty(128, 16, 24, 24)
  (x.conv2d(w) * upstream).sum().backward()
  ast = next(item.ast for item in create_schedule([w.grad.lazydata]) if item.ast.op not in LoadOps)
  opts = (Opt(OptOps.GROUP, 2, 0), Opt(OptOps.GROUP, 1, 8), Opt(OptOps.UPCAST, 2, 0), Opt(OptOps.LOCAL, 2, 3))
  buffers = beam._random_buffers(Device.DEFAULT, Kernel(ast, device.target), 1)
  assert len(buffers) == 3
  assert beam.outputs_match(device, ast, opts, buffers, 1)
  assert np.sqrt(np.mean(buffers[0].numpy() ** 2)) > 100, "sums large enough that rounding moves those near 0 past 1e-3"

def test_the_winners_check_allows_rounding_on_the_outputs_scale_not_a_wrong_value():
  expected = np.random.default_rng(0).standard_normal(1152).astype(np.float32) * 265
  expected[7] = 0.82
  for dtype, tolerance in ((dtypes.float32, 1e-3), (dtypes.float16, 1e-2)):
    rounded, wrong, wrong_big = expected.copy(), expected.copy(), expected.copy()
    rounded[7] += 0.5 * tolerance * 265
    wrong[7] += 2 * tolerance * 265  # off by more than rounding on the output's scale
    wrong_big[np.argmax(np.abs(expected))] *= 1 + 3 * tolerance  # the largest output off by more than the relative tolerance
    assert beam.outputs_close(rounded, expected, dtype) and not beam.outputs_close(wrong, expected, dtype)
    assert not beam.outputs_close(wrong_big, expected, dtype)
  small = np.full(64, 1e-3, np.float32)  # outputs under 1: the tolerance is absolute, as before
  assert not beam.outputs_close(small + 2e-3, small, dtypes.float32) and beam.outputs_close(small + 5e-4, small, dtypes.float32)
  assert beam.outputs_close(np.array([np.inf, np.nan, 1.0]), np.array([np.inf, np.nan, 1.0]), dtypes.float32)

def test_a_search_fills_each_input_with_values_of_its_own(tinyc_device):
  """The winner's check compares outputs on random inputs: two inputs with equal values would hide a kernel that swaps them. The
  values are drawn once a process and sliced: the same kernel gets the same inputs again."""
  x, y = Tensor.empty(4, 300), Tensor.empty(4, 300)
  ast = create_schedule([(x - y * 2).lazydata])[-1].ast
  kernel = Kernel(ast, Device[Device.DEFAULT].target)
  first, again = (beam._random_buffers(Device.DEFAULT, kernel, 1) for _ in range(2))
  inputs = [buf.numpy() for buf in first[1:]]
  assert len(inputs) == 2 and not np.allclose(inputs[0], inputs[1]) and all(values.std() > 0.5 for values in inputs)
  for buf, same in zip(first[1:], again[1:]): np.testing.assert_array_equal(buf.numpy(), same.numpy())

def test_a_search_adds_nothing_to_the_global_counters(tinyc_device):
  # the counters tell what the computation ran: the search's timing and verification runs are not part of it
  if Device[Device.DEFAULT].compile_binary is None: pytest.skip(f"{Device.DEFAULT} cannot build in worker processes")
  a, b = matmul_inputs()
  counts = []
  for level in (0, 2):
    Device[Device.DEFAULT].programs.clear()
    GlobalCounters.reset()
    with Context(BEAM=level): (Tensor(a) @ Tensor(b)).relu().softmax(-1).realize()
    counts.append((GlobalCounters.kernel_count, GlobalCounters.global_mem))
  assert counts[1] == counts[0], f"(kernels, bytes) with BEAM=2 {counts[1]} against {counts[0]} without"

# ***** broken candidates: a fake build whose behaviour depends on the candidate (module-level, so workers can import it) *****

def flaky_build(opts: tuple[Opt, ...]) -> tuple[str, int]:
  last = opts[-1] if opts else None
  if last == Opt(OptOps.UPCAST, 0, 2): os._exit(3)  # the worker dies, as if a compiler crashed
  if last == Opt(OptOps.UPCAST, 0, 4): time.sleep(60)  # the worker hangs
  if last == Opt(OptOps.UNROLL, 0, 4): raise RuntimeError("the compiler rejected it")
  return repr(opts), len(opts)

def same_source_build(opts: tuple[Opt, ...]) -> tuple[str, int]: return "one source", len(opts)

def test_crashed_hung_and_rejected_candidates_are_dropped():
  item = next(item for item in create_schedule([(Tensor.empty(16, 16) @ Tensor.empty(16, 16)).lazydata]) if item.ast.op not in LoadOps)
  kernel = Kernel(item.ast)
  pool = search.CompilePool(workers=2, timeout_s=3.0)
  measured: dict[tuple[Opt, ...], float] = {}
  def measure(opts, built):
    measured[opts] = 1.0 / (1 + built[1]) + (0.5 if opts and opts[-1].op is OptOps.UPCAST else 0.0)  # an UNROLL wins
    return measured[opts]
  recorded: dict[tuple[Opt, ...], tuple[bool, float | None]] = {}
  try:
    started = time.monotonic()
    best = search.run_search(search.beam_steps(kernel, 2, flaky_build, lambda opts: (opts,), measure, name="flaky",
                                               record=lambda opts, built, seconds: recorded.setdefault(opts, (built, seconds))), pool)
    assert time.monotonic() - started < 40, "a hung worker held the search up"
    assert best and best[-1].op is OptOps.UNROLL and best[-1] != Opt(OptOps.UNROLL, 0, 4)
    broken = {Opt(OptOps.UPCAST, 0, 2), Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.UNROLL, 0, 4)}
    assert measured and not any(opts and opts[-1] in broken for opts in measured)
    # every candidate is recorded for the dataset: the timed ones with their time, the broken ones as not built
    assert {opts: seconds for opts, (built, seconds) in recorded.items() if built} == measured
    assert {opts[-1] for opts, (built, seconds) in recorded.items() if not built} == broken and all(
      seconds is None for built, seconds in recorded.values() if not built)
    assert pool.map(flaky_build, [((),)]) == [("()", 0)], "the pool works after its workers were replaced"
    # each candidate that built, one of an earlier's source too (the check of a winner loads what the workers built for it)
    built: list = []
    search.run_search(search.beam_steps(kernel, 2, same_source_build, lambda opts: (opts,), measure, starts=((), (Opt(OptOps.UNROLL, 0, 2),)),
                                        on_build=lambda opts, result: built.append(opts), max_steps=1), pool)
    assert built[:2] == [(), (Opt(OptOps.UNROLL, 0, 2),)] and len(measured) > 0
  finally: pool.close()

# ***** the cache *****

def other_programs_database(path):
  with contextlib.closing(sqlite3.connect(path)) as connection, connection:
    connection.execute("CREATE TABLE accounts (name TEXT, balance INTEGER)")
    connection.execute("INSERT INTO accounts VALUES ('alice', 100)")

SQLITE_HEADER = b"SQLite format 3\x00"  # the first 16 bytes of every sqlite database

@pytest.mark.parametrize("make", [lambda path: path.write_bytes(b"my notes, not a database\n" * 100), other_programs_database,
                                  lambda path: path.write_bytes(bytes(8192)), lambda path: path.write_bytes(SQLITE_HEADER + b"cut")],
                         ids=["text file", "another program's sqlite database", "zeros", "a cut sqlite header"])
def test_a_file_that_is_not_a_tinyc_cache_is_refused_and_left_untouched(tmp_path, make):
  path = tmp_path / "beam.db"
  make(path)
  before = path.read_bytes()
  for use in (lambda: search.cache_get("some key"), lambda: search.cache_put("some key", [Opt(OptOps.UPCAST, 0, 4)])):
    with pytest.raises(search.CacheFileError, match=f"{path}.*CACHEDB"): use()
  assert isinstance(search.CacheFileError("x"), RuntimeError)
  assert path.read_bytes() == before and sorted(p.name for p in tmp_path.iterdir()) == ["beam.db"]

def test_a_relative_cache_path_is_used(tmp_path, monkeypatch):
  monkeypatch.chdir(tmp_path)
  monkeypatch.setenv("CACHEDB", "beam.db")
  search.cache_put("some key", [Opt(OptOps.UPCAST, 0, 4)])
  search._forget()
  assert search.cache_get("some key") == (Opt(OptOps.UPCAST, 0, 4),) and (tmp_path / "beam.db").is_file()

def test_a_damaged_tinyc_cache_is_rebuilt_with_a_warning(tmp_path, capsys):
  path = tmp_path / "beam.db"
  search.cache_put("some key", [Opt(OptOps.UPCAST, 0, 4)])
  with contextlib.closing(sqlite3.connect(path)) as connection: connection.execute("PRAGMA wal_checkpoint(TRUNCATE)")
  damaged = bytearray(path.read_bytes())
  damaged[100:4096] = b"\xff" * (4096 - 100)  # the header (which says tinyc made it) survives; the table of tables does not
  path.write_bytes(bytes(damaged))
  assert search.cache_get("some key") is None
  assert str(path) in capsys.readouterr().err  # at the default DEBUG level
  search.cache_put("some key", [Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.LOCAL, 1, 16)])
  assert search.cache_get("some key") == (Opt(OptOps.UPCAST, 0, 4), Opt(OptOps.LOCAL, 1, 16))

def test_an_empty_file_and_an_older_tinyc_cache_are_used(tmp_path):
  path = tmp_path / "beam.db"
  path.write_bytes(b"")
  search.cache_put("key", [Opt(OptOps.UPCAST, 0, 4)])
  assert search.cache_get("key") == (Opt(OptOps.UPCAST, 0, 4),)
  path.unlink()
  with contextlib.closing(sqlite3.connect(path)) as connection, connection:  # as tinyc wrote it before it marked its files
    connection.execute("CREATE TABLE beam (key TEXT PRIMARY KEY, opts TEXT NOT NULL)")
    connection.execute("INSERT INTO beam VALUES ('old key', '[[\"UPCAST\", 0, 2]]')")
  assert search.cache_get("old key") == (Opt(OptOps.UPCAST, 0, 2),)

# another process making a new cache: it holds SQLite's lock (a write lock on its lock bytes) while the file is in `state`, for a second
MAKER = """
import fcntl, sys, time
path, state, made = sys.argv[1:]
with open(path, "wb") as file:
  fcntl.lockf(file, fcntl.LOCK_EX, 512, 0x40000000)
  file.write(bytes.fromhex(state))
  file.flush()
  print("ready", flush=True)
  time.sleep(1)
  file.seek(0)
  file.write(open(made, "rb").read())
"""

@pytest.mark.parametrize("state", [lambda made: bytes(len(made)), lambda made: made[:50], lambda made: b""],
                         ids=["grown to its size before page 1 is written (an SQLite that maps files)", "page 1 written in part", "empty"])
def test_a_cache_another_process_is_making_is_waited_for(tmp_path, state):
  path, made = tmp_path / "beam.db", tmp_path / "made.db"
  search.cache_put("key", [Opt(OptOps.UPCAST, 0, 4)])
  search._forget()  # the last connection closed: everything is in the file, no WAL beside it
  path.rename(made)
  maker = subprocess.Popen([sys.executable, "-c", MAKER, str(path), state(made.read_bytes()).hex(), str(made)], stdout=subprocess.PIPE, text=True)
  assert maker.stdout is not None and maker.stdout.readline() == "ready\n"
  assert search.cache_get("key") == (Opt(OptOps.UPCAST, 0, 4),)
  assert maker.wait() == 0
  search.cache_put("another key", [Opt(OptOps.LOCAL, 1, 16)])
  assert search.cache_get("another key") == (Opt(OptOps.LOCAL, 1, 16),)
  with contextlib.closing(sqlite3.connect(path)) as connection: assert connection.execute("PRAGMA integrity_check").fetchall() == [("ok",)]

# another process writing the cache and closing it: SQLite deletes the WAL (and its index) when the last connection closes, which it
# knows by getting an exclusive POSIX lock on the database. Every connection of this process must stay in use for it meanwhile.
WRITER = """
import contextlib, os, sqlite3, sys
with contextlib.closing(sqlite3.connect(sys.argv[1], isolation_level=None)) as connection:
  for row in range(int(sys.argv[3])): connection.execute("INSERT INTO programs VALUES (?, '{}', ?)", (f"{sys.argv[2]} {row}", os.urandom(4000)))
"""

def test_a_process_that_closes_the_cache_leaves_this_one_s_connections_working(tmp_path, capsys):
  """A thread keeps its connection (as every thread that used the cache does) while this one writes, other processes write and close,
  and this one writes enough to checkpoint: every row stays, nothing is damaged (the GPU suite's session caches lost page 1 so)."""
  path, write = tmp_path / "beam.db", lambda key: search.cache_execute("INSERT INTO programs VALUES (?, '{}', ?)", (key, os.urandom(4000)))
  def other_process(name: str, rows: int) -> None: subprocess.run([sys.executable, "-c", WRITER, str(path), name, str(rows)], check=True)
  opened, finish = threading.Event(), threading.Event()
  def hold() -> None:
    write("thread")
    opened.set()
    finish.wait()
  holder = threading.Thread(target=hold)
  holder.start()
  try:
    opened.wait()
    for key in ("this 0", "this 1"): write(key)
    other_process("first", 1)
    other_process("second", 5)
    for row in range(2, 300): write(f"this {row}")
  finally:
    finish.set()
    holder.join()
  search._forget()
  assert "damaged" not in capsys.readouterr().err and path.read_bytes()[:16] == SQLITE_HEADER
  with contextlib.closing(sqlite3.connect(path)) as connection:
    assert connection.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    assert connection.execute("SELECT count(*) FROM programs").fetchone() == (1 + 300 + 1 + 5,)

def _write_in_a_fork(resume, rows: int) -> None:
  """A forked child's work: a row, then (once the parent has closed its connection and written more) rows and a checkpoint."""
  search.cache_execute("INSERT INTO programs VALUES ('child 0', '{}', x'00')", ())
  resume.send("written")
  resume.recv()
  for row in range(1, rows): search.cache_execute("INSERT INTO programs VALUES (?, '{}', ?)", (f"child {row}", os.urandom(4000)))
  search.cache_execute("PRAGMA wal_checkpoint", ())

def test_a_forked_child_leaves_the_parents_cache_intact(tmp_path, capsys):
  """A child forked while this process holds the cache open inherits SQLite's record of the file (its locks, its WAL index):
  it must not use the file through it. Here this process then closes its connection (as it does when the file changed), which
  deletes the WAL if no other process holds the file, and writes on; the child writes on and checkpoints."""
  path, write = tmp_path / "beam.db", lambda key: search.cache_execute("INSERT INTO programs VALUES (?, '{}', ?)", (key, os.urandom(4000)))
  for row in range(20): write(f"parent {row}")
  context = multiprocessing.get_context("fork")
  resume, resume_child = context.Pipe()
  child = context.Process(target=_write_in_a_fork, args=(resume_child, 50))
  child.start()
  assert resume.poll(60) and resume.recv() == "written"
  search._forget()
  for row in range(20, 60): write(f"parent {row}")
  resume.send(True)
  child.join(timeout=60)
  assert child.exitcode == 0
  for row in range(60, 80): write(f"parent {row}")
  search._forget()
  assert "damaged" not in capsys.readouterr().err and path.read_bytes()[:16] == SQLITE_HEADER
  with contextlib.closing(sqlite3.connect(path)) as connection:
    assert connection.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    assert connection.execute("SELECT count(*) FROM programs WHERE key LIKE 'parent %'").fetchone() == (80,)

def unwritable_locations(tmp_path):
  (tmp_path / "a_file").write_text("x")
  (tmp_path / "a_directory").mkdir()
  return {"under a regular file": tmp_path / "a_file" / "beam.db", "a directory": tmp_path / "a_directory"}

@pytest.mark.parametrize("where", ["under a regular file", "a directory", "a read-only directory"])
def test_a_cache_location_that_cannot_be_written_warns_once_and_searches_without_it(tinyc_device, tmp_path, monkeypatch, capsys, where):
  if Device[Device.DEFAULT].compile_binary is None: pytest.skip(f"{Device.DEFAULT} cannot build in worker processes")
  if where == "a read-only directory":
    if os.geteuid() == 0: pytest.skip("root writes to read-only directories")
    (tmp_path / "read_only").mkdir(mode=0o500)
    path = tmp_path / "read_only" / "beam.db"
  else: path = unwritable_locations(tmp_path)[where]
  monkeypatch.setenv("CACHEDB", str(path))
  # kernels of a shape of their own: a kernel this process already searched (another case here) runs the program its plan kept
  x = np.arange(8 * (9 + len(where)), dtype=np.float32).reshape(8, 9 + len(where))
  with Context(BEAM=2):
    np.testing.assert_allclose(Tensor(x).sum(1).numpy(), x.sum(1))
    np.testing.assert_allclose((Tensor(x) * 2).max(0).numpy(), (x * 2).max(0))
  warnings = [line for line in capsys.readouterr().err.splitlines() if str(path) in line]
  assert len(warnings) == 1 and "CACHEDB" in warnings[0], warnings

SEARCHER = """
import sys, time
import numpy as np
from tinyc import Tensor
start, rows = float(sys.argv[1]), int(sys.argv[2])
while time.time() < start: time.sleep(0.005)
a = np.arange(rows * 8, dtype=np.float32).reshape(rows, 8)
np.testing.assert_allclose(Tensor(a).sum(1).numpy(), a.sum(1))  # a kernel of its own
b = np.arange(64, dtype=np.float32).reshape(8, 8)
np.testing.assert_allclose((Tensor(b) * 3).sum(0).numpy(), (b * 3).sum(0))  # the same kernel as the other process
print("ok")
"""

def test_two_processes_searching_at_once_share_the_cache(tmp_path):
  environment = {**os.environ, "BEAM": "2", "BEAM_WORKERS": "1", "BEAM_PROGRESS": "0", "PYTHONPATH": os.pathsep.join(p for p in sys.path if p)}
  start = time.time() + 3  # both import tinyc first, then begin together
  processes = [subprocess.Popen([sys.executable, "-c", SEARCHER, str(start), str(rows)], env=environment, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True) for rows in (16, 24)]
  results = [process.communicate(timeout=300) for process in processes]
  assert all(process.returncode == 0 and out.strip() == "ok" for process, (out, _) in zip(processes, results)), results
  with contextlib.closing(sqlite3.connect(os.environ["CACHEDB"])) as connection:
    assert connection.execute("PRAGMA integrity_check").fetchall() == [("ok",)]
    assert connection.execute("PRAGMA journal_mode").fetchone() == ("wal",)
    assert connection.execute("SELECT count(*) FROM beam").fetchone() == (3,)

def test_a_row_this_version_cannot_read_is_a_miss():
  search.cache_put("key", [Opt(OptOps.UPCAST, 0, 4)])
  with sqlite3.connect(os.environ["CACHEDB"]) as connection: connection.execute("UPDATE beam SET opts = '[[\"NOT_AN_OPT\", 0, 4]]'")
  assert search.cache_get("key") is None

def test_ignore_beam_cache_bypasses_it(monkeypatch):
  search.cache_put("key", [Opt(OptOps.UPCAST, 0, 4)])
  monkeypatch.setenv("IGNORE_BEAM_CACHE", "1")
  assert search.cache_get("key") is None

def test_the_cache_key_covers_the_kernel_the_device_and_the_settings(monkeypatch):
  asts = [next(i.ast for i in create_schedule([out.lazydata]) if i.ast.op not in LoadOps)
          for out in (Tensor.empty(16, 16).sum(1), Tensor.empty(16, 16).max(1), Tensor.empty(16, 8).sum(1))]
  keys = {search.cache_key(ast, "CUDA|sm_90") for ast in asts} | {search.cache_key(asts[0], "GPU|pocl")}
  monkeypatch.setenv("NOLOCALS", "1")
  keys.add(search.cache_key(asts[0], "CUDA|sm_90"))
  monkeypatch.setattr(search, "code_version", lambda: "another version of tinyc")  # whose Opts may mean other things
  keys.add(search.cache_key(asts[0], "CUDA|sm_90"))
  assert len(keys) == 6

def test_the_cache_key_names_the_device_language(monkeypatch):
  keys: list[str] = []
  monkeypatch.setattr(beam, "cache_get", lambda key: keys.append(key) or ())  # a hit (an empty Opt list is one): no search
  monkeypatch.setattr(beam, "search", lambda *args, **kwargs: pytest.fail("a cache hit was searched again"))
  ast = next(i.ast for i in create_schedule([Tensor.empty(16, 16).sum(1).lazydata]) if i.ast.op not in LoadOps)
  device = Device[Device.DEFAULT]
  for language in ("C", "another language"):
    monkeypatch.setattr(device, "language", language)
    beam._chosen.clear()
    assert beam.beam_opts(device, ast) == ()
  assert len(set(keys)) == 2, keys

def test_a_cached_opt_list_that_no_longer_applies_is_searched_again(tinyc_device, monkeypatch):
  # a cache written by another version of tinyc can hold Opts that this kernel refuses: the entry is a miss, not a crash
  if Device[Device.DEFAULT].compile_binary is None: pytest.skip(f"{Device.DEFAULT} cannot build in worker processes")
  a, b = matmul_inputs()
  out = Tensor(a) @ Tensor(b)
  ast = next(i.ast for i in create_schedule([out.lazydata]) if i.ast.op not in LoadOps)
  device = Device[Device.DEFAULT]
  with Context(BEAM=2):
    key = search.cache_key(ast, f"{device.name}|{device.arch}|{device.language}")
    search.cache_put(key, [Opt(OptOps.UPCAST, 7, 4)])
    np.testing.assert_allclose(out.numpy(), a @ b, rtol=1e-5, atol=1e-5)
    fixed = search.cache_get(key)
  assert fixed is not None and fixed != (Opt(OptOps.UPCAST, 7, 4),)
  kernel = Kernel(ast, device.target)
  for opt in fixed: kernel.apply_opt(opt)  # the new entry applies

def test_the_search_grows_a_kernel_to_at_most_256_upcast_lanes_and_may_stage_inputs():
  from tinyc.codegen.heuristic import hand_coded_optimizations
  from tinyc.codegen.kernel import GPU_MAX_UPCAST, KernelTarget
  a, b = Tensor.empty(1024, 1024, device="LLVM"), Tensor.empty(1024, 1024, device="LLVM")  # (a GPU would split its K in two kernels)
  with Context(PACK=0): ast = next(item.ast for item in create_schedule([(a @ b).lazydata]) if item.ast.op not in LoadOps)  # (no copy of b)
  target = KernelTarget(has_local=True, max_upcast=GPU_MAX_UPCAST)
  def upcast_sizes(opts):
    kernel = Kernel(ast, target)
    for opt in opts: kernel.apply_opt(opt)
    return kernel.upcast_size
  tiled = Kernel(ast, target)
  for opt in [Opt(OptOps.UPCAST, 0, 16), Opt(OptOps.UPCAST, 1, 16), Opt(OptOps.LOCAL, 0, 4)]: tiled.apply_opt(opt)  # 256 lanes
  grown = search.expansions(tiled)
  assert grown and max(upcast_sizes(opts) for opts in grown) == 256, "the target allows 1024 lanes; the search stops at 256"
  assert any(opts[-1].op is OptOps.STAGE for opts in grown)
  staged = Kernel(ast, target)
  hand_coded_optimizations(staged)
  assert staged.upcast_size == 1024 and staged.staged  # the heuristic's plan is above the search's limit: it may still change it
  assert search.expansions(staged) and all(upcast_sizes(opts) == 1024 for opts in search.expansions(staged))

def test_candidates_that_differ_only_in_their_program_key_compare_equal():
  """Built names carry the program key, which differs with the Opts: the search must compare sources without them, or it times
  every candidate, duplicates too."""
  item = next(item for item in create_schedule([(Tensor.empty(16, 16) @ Tensor.empty(16, 16)).lazydata]) if item.ast.op not in LoadOps)
  device = Device["LLVM"]
  arguments = lambda key: (item.ast, (), device.target, device.threads, device.max_local, device.render, device.compile_binary,  # noqa: E731
                           codegen_settings(), key)
  first, second = beam.build_candidate(*arguments("1" * 64)), beam.build_candidate(*arguments("2" * 64))
  assert first[1].name != second[1].name and first[0] == second[0]
