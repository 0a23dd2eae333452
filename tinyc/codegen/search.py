"""Layer 3: BEAM search over Opts, the worker processes that build kernels and tinyc's on-disk cache. Imports helpers, ops,
codegen/kernel; the device passes in the functions that build (render + compile, in a worker process) and time (on the device) a candidate.

The search keeps the `width` fastest Opt lists, expands each by every legal action, builds the new candidates in parallel
worker processes (a candidate whose build fails, crashes its worker or runs past the timeout is dropped, and the worker
replaced), times them, and stops when a step improves the best time by less than BEAM_MIN_PROGRESS. Candidates that render
to the same source are timed once. The cache maps a key of (AST, device, settings, tinyc's code) to the winning Opt list as JSON text in
sqlite: data only, in a file tinyc marks as its own (it refuses any other file, and rebuilds its own when damaged). The same file
keeps the programs device.py builds (table `programs`: the rendered source and launch sizes as JSON, and the compiled binary).
"""
from __future__ import annotations
import atexit, contextlib, functools, hashlib, heapq, itertools, json, math, os, pickle, sqlite3, subprocess, sys, threading, time
from multiprocessing.connection import wait
from pathlib import Path
from typing import Any, Callable, Generator, Iterable, Sequence
from tinyc.helpers import DEBUG, getenv, warn_once
from tinyc.ops import ConstBuffer, LazyOp, MemBuffer
from tinyc.codegen.kernel import Kernel, KernelOptError, Opt, OptOps

# the action space: each OptOp over the first axes (STAGE: the first input buffers), with the amounts that pay on real kernels
# (powers of two for tiles, the odd sizes of image dims, 0 for a whole axis)
ACTIONS: list[Opt] = [Opt(op, axis, amount) for op, axes, amounts in [
  (OptOps.UPCAST, range(6), (0, 2, 3, 4, 5, 7, 8, 16)), (OptOps.UNROLL, range(5), (0, 2, 4, 7, 8, 16)),
  (OptOps.LOCAL, range(6), (2, 3, 4, 7, 8, 13, 16, 29, 32)), (OptOps.GROUPTOP, range(3), (13, 16, 28, 29, 32, 49, 64, 256)),
  (OptOps.GROUP, range(3), (0, 4, 8, 16, 32, 64, 128, 256, 512)), (OptOps.PADTO, range(7), (32,)), (OptOps.NOLOCALS, range(1), (0,)),
  (OptOps.STAGE, range(1, 4), (0,)), (OptOps.TC, range(2), (2, 3, 4)),
  (OptOps.PERSIST, range(2), (2, 3, 4, 8)), (OptOps.WARPGROUP, range(1), (0,)),
  (OptOps.BLOCK, range(3), (4, 5, 8, 16, 25, 32)), (OptOps.LANES, range(1), (4, 8, 16))] for amount in amounts for axis in axes]

# upcast lanes a search step may grow a kernel to. A GPU target allows 1024 (the heuristic's staged matmul), but every kernel
# searched up to that many had so many slow-compiling candidates that the CNN train step's search took 96 s instead of 32.
SEARCH_MAX_UPCAST = 256

def expansions(kernel: Kernel) -> list[tuple[Opt, ...]]: return list(expanded(kernel))

def expanded(kernel: Kernel) -> dict[tuple[Opt, ...], Kernel]:
  """Each Opt list that is `kernel`'s plus one legal action (apply_opt prunes too many upcasts and locals over the limits), and
  that grows the upcast lanes to at most SEARCH_MAX_UPCAST (or keeps them), with its kernel."""
  found = {}
  for action in ACTIONS:
    candidate = kernel.copy()
    try: candidate.apply_opt(action)
    except KernelOptError: continue
    if candidate.upcast_size > max(SEARCH_MAX_UPCAST, kernel.upcast_size): continue
    found[tuple(candidate.applied_opts)] = candidate
  return found

# ***** worker processes *****

class JobQueue:
  """Build jobs waiting for a worker: (job, arguments, then), the lowest priority number first, in the order added within one."""
  def __init__(self) -> None: self.heap: list[tuple[int, int, Callable[..., Any], tuple[Any, ...], Callable[[Any], Any]]] = []
  def __len__(self) -> int: return len(self.heap)
  def add(self, priority: int, job: Callable[..., Any], arguments: tuple[Any, ...], then: Callable[[Any], Any]) -> None:
    heapq.heappush(self.heap, (priority, next(_job_numbers), job, arguments, then))
  def pop(self) -> tuple[Callable[..., Any], tuple[Any, ...], Callable[[Any], Any]]: return heapq.heappop(self.heap)[2:]
_job_numbers = itertools.count()

class CompilePool:
  """Worker processes that run build jobs: `job(*args)` for a picklable module-level function. A job that raises gives None; a
  worker that crashes or runs past `timeout_s` is killed and replaced, and its job gives None too. Workers are fresh Python
  processes (`python -c ...worker_main()`) talking pickle over pipes: not forks (the parent may hold a GPU context and
  thread-pool locks) and not multiprocessing's spawn (which re-runs the user's unguarded __main__ script). One map at a time:
  beam.py runs one search at a time in a process, and threads asking at once take turns."""
  def __init__(self, workers: int, timeout_s: float) -> None:
    self.size, self.timeout_s = workers, timeout_s
    self.workers: list[subprocess.Popen] = []
    self.lock = threading.Lock()

  def _start(self) -> subprocess.Popen:
    environment = {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in sys.path if path)}  # what the parent can import
    command = [sys.executable, "-c", "from tinyc.codegen.search import worker_main; worker_main()"]
    return subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=environment)

  def map(self, job: Callable[..., Any], argument_lists: Sequence[tuple[Any, ...]]) -> list[Any]:
    results: list[Any] = [None] * len(argument_lists)
    jobs = JobQueue()
    for index, arguments in enumerate(argument_lists): jobs.add(0, job, arguments, functools.partial(results.__setitem__, index))
    self.run(jobs)
    return results

  def run(self, jobs: JobQueue) -> None:
    """Runs the queued jobs, the first by priority first, and tells each one's `then` its result in this thread as it comes (where
    it may queue more jobs); returns once none is queued or running. Should a `then` raise, the running jobs' workers are replaced."""
    with self.lock:
      while len(self.workers) < self.size: self.workers.append(self._start())
      busy: dict[int, tuple[Callable[[Any], Any], float]] = {}  # worker number -> (the job's then, its start time)
      try: self._run(jobs, busy)
      except BaseException:
        for number in busy: self._replace(number)  # (its result would answer the next job sent to it)
        raise

  def _run(self, jobs: JobQueue, busy: dict[int, tuple[Callable[[Any], Any], float]]) -> None:
    while jobs or busy:
      for number, worker in enumerate(self.workers):
        if number not in busy and jobs:
          job, arguments, then = jobs.pop()
          try: message = pickle.dumps((job, arguments))
          except (pickle.PicklingError, AttributeError, TypeError):  # a job a worker cannot import (a local function) gives None
            then(None)
            continue
          try:
            assert worker.stdin is not None
            worker.stdin.write(message)
            worker.stdin.flush()
          except (OSError, ValueError):  # it had died: the job is dropped
            self._replace(number)
            then(None)
          else: busy[number] = (then, time.monotonic())
      ready = wait([self.workers[number].stdout for number in busy], timeout=0.05)  # type: ignore[misc]
      for number in list(busy):
        worker, result = self.workers[number], None
        if worker.stdout in ready:
          try: result = pickle.load(worker.stdout)  # type: ignore[arg-type]
          except (EOFError, OSError, pickle.UnpicklingError): self._replace(number)  # it crashed (in a compiler): the job is dropped
        elif time.monotonic() - busy[number][1] > self.timeout_s:
          if DEBUG >= 2: print(f"BEAM: a candidate's build ran past {self.timeout_s} s and was dropped", file=sys.stderr)
          self._replace(number)
        else: continue
        busy.pop(number)[0](result)

  def _replace(self, number: int) -> None:
    self._stop(self.workers[number])
    self.workers[number] = self._start()

  @staticmethod
  def _stop(worker: subprocess.Popen) -> None:
    worker.kill()
    worker.wait()
    for pipe in (worker.stdin, worker.stdout):
      if pipe is not None: pipe.close()

  def close(self) -> None:
    for worker in self.workers: self._stop(worker)
    self.workers = []

# builds yield the cores to the process that times candidates: with searches at once it times one while the workers build others'
# (on a GPU; a CUDA timing is gated besides, so a late launch does not count: ops_cuda._Gate)
WORKER_NICENESS = 10

def worker_main() -> None:
  """A worker's loop: read (job, arguments), write the result; stdout is the protocol, so prints go to stderr."""
  protocol_in, protocol_out = os.fdopen(os.dup(0), "rb"), os.fdopen(os.dup(1), "wb")
  os.dup2(2, 1)
  with contextlib.suppress(OSError): os.nice(WORKER_NICENESS)
  while True:
    try: job, arguments = pickle.load(protocol_in)
    except (EOFError, OSError): return
    try: result = job(*arguments)
    except Exception as error:  # a candidate the compiler rejects is dropped, not fatal
      if DEBUG >= 3: print(f"BEAM: a candidate failed to build: {type(error).__name__}: {error}", file=sys.stderr)
      result = None
    pickle.dump(result, protocol_out)
    protocol_out.flush()

_pool: CompilePool | None = None
def compile_pool() -> CompilePool:
  """The process's pool, started on the first search or parallel build: one worker per core (BEAM_WORKERS overrides), BEAM_TIMEOUT seconds a build."""
  global _pool
  if _pool is None:
    _pool = CompilePool(getenv("BEAM_WORKERS", 0) or len(os.sched_getaffinity(0)), getenv("BEAM_TIMEOUT", 30.0))
    atexit.register(_pool.close)
  return _pool

# ***** the search *****

# a search as a generator: it yields a round of builds, (job, each candidate's arguments), is sent their results (None where one
# failed) and returns the fastest Opt list. run_searches runs several at once
SearchSteps = Generator[tuple[Callable[..., Any], list[tuple[Any, ...]]], list[Any], Any]

def run_search(steps: SearchSteps, pool: CompilePool | None = None) -> Any:
  """What one search returns, run alone."""
  found: list[Any] = []
  run_searches([steps], pool, 1, lambda _, result: found.append(result))
  return found[0]

def beam_steps(kernel: Kernel, width: int, build: Callable[..., Any], build_arguments: Callable[[tuple[Opt, ...]], tuple[Any, ...]],
               measure: Callable[[tuple[Opt, ...], Any], float], starts: Sequence[tuple[Opt, ...]] = ((),), name: str = "",
               record: Callable[[tuple[Opt, ...], bool, float | None], Any] | None = None, rank: Callable[[list[Kernel]], list[int]] | None = None,
               top: int = 0, good_enough_s: float = 0.0, max_steps: int | None = None,
               on_build: Callable[[tuple[Opt, ...], Any], Any] | None = None) -> SearchSteps:
  """The search. `build(*build_arguments(opts))` runs in a worker and returns (source, anything picklable) or None; `measure(opts,
  built)` times it on the device in seconds (math.inf when it fails). `record(opts, built, seconds)` is told of each candidate:
  whether it built, and its time (None: not built, or it failed to run); one of the same source as an earlier, not. With `rank` (a
  cost model: the candidates' positions, the one predicted fastest first) a step builds only the `top` it ranks first, and the
  first step builds the starts with them (without, the starts are built and timed first, and a step grows the beam's). The search
  ends once the best takes `good_enough_s` or less (a roofline bound: nothing can gain much on it), or after `max_steps` steps
  (default BEAM_MAX_STEPS). `on_build(opts, built)` is told of each candidate that built, one of the same source as an earlier too."""
  min_progress = getenv("BEAM_MIN_PROGRESS", 0.01)  # stop when no new candidate beats a beam entry by this fraction
  seen_sources: set[str] = set()
  def timed(candidates: list[tuple[Opt, ...]], built: list[Any]) -> list[tuple[float, tuple[Opt, ...]]]:
    entries = []
    for opts, result in zip(candidates, built):
      if result is None and record is not None: record(opts, False, None)
      if result is not None and on_build is not None: on_build(opts, result)
      if result is None or result[0] in seen_sources: continue
      seen_sources.add(result[0])
      entries.append((seconds := measure(opts, result), opts))
      if record is not None: record(opts, True, seconds if math.isfinite(seconds) else None)
    return [entry for entry in entries if math.isfinite(entry[0])]
  by_time: Callable[[tuple[float, tuple[Opt, ...]]], float] = lambda entry: entry[0]  # noqa: E731
  tried, beam = set(starts), []
  if rank is None:
    beam = sorted(timed(list(starts), (yield build, [build_arguments(opts) for opts in starts])), key=by_time)[:width]
    if not beam: return tuple(starts[0])
  def improves(new: list[tuple[float, tuple[Opt, ...]]]) -> bool:  # whether a new candidate beats some kernel in the beam
    return bool(new) and min(new, key=by_time)[0] <= beam[-1][0] * (1 - min_progress)
  for step in range(1, (max_steps or getenv("BEAM_MAX_STEPS", 20)) + 1):
    if beam:
      _progress(name, step, beam[0][0], len(seen_sources))
      if beam[0][0] <= good_enough_s: break
    grown = {opts: found for start in ([opts for _, opts in beam] or starts) for opts, found in expanded(_replay(kernel, start)).items()
             if opts not in tried}
    candidates = list(grown)
    if rank is not None: candidates = [candidates[i] for i in rank(list(grown.values()))]
    # go on while a new candidate beats some kernel in the beam: one that starts from the unoptimized kernel often overtakes
    # the hand-coded one only after a few steps. A ranked step builds its `top` candidates, and in the first step, where none of
    # them beats one, the next `top` of its ranking (a model's first picks can all miss)
    new: list[tuple[float, tuple[Opt, ...]]] = []
    for chunk in [candidates] if rank is None else [candidates[:top], candidates[top:2 * top]][:2 if step == 1 else 1]:
      tried.update(chunk)
      if not (with_starts := chunk if beam else list(starts) + chunk): break  # (a ranked search's first round: its starts too, timed first)
      entries = timed(with_starts, (yield build, [build_arguments(opts) for opts in with_starts]))
      if not beam:
        beam = sorted((entry for entry in entries if entry[1] in starts), key=by_time)[:width]
        if not beam: return tuple(starts[0])
      new += [entry for entry in entries if entry[1] not in starts]
      if improves(new): break
    if not improves(new): break
    beam = sorted(beam + new, key=by_time)[:width]
  _progress(name, -1, beam[0][0], len(seen_sources))
  return beam[0][1]

def run_searches(searches: Iterable[SearchSteps], pool: CompilePool | None, at_once: int, on_end: Callable[[int, Any], Any]) -> None:
  """Runs the searches (beam_steps, or a generator that yields from one), `at_once` at a time in the order given, their builds
  sharing the pool's workers: while one waits for its round's slowest build, the others' builds run. A search's builds go before
  those of searches after it. `on_end(number, result)` is told of each as it ends."""
  pool, jobs, waiting = pool or compile_pool(), JobQueue(), enumerate(searches)
  def advance(number: int, steps: SearchSteps, results: list[Any] | None) -> None:
    try: job, argument_lists = steps.send(results)  # type: ignore[arg-type]
    except StopIteration as end:
      on_end(number, end.value)
      return start_next()
    if not argument_lists: return advance(number, steps, [])
    got: list[Any] = [None] * len(argument_lists)
    left = [len(argument_lists)]
    def then(index: int, result: Any) -> None:
      got[index], left[0] = result, left[0] - 1
      if left[0] == 0: advance(number, steps, got)
    for index, arguments in enumerate(argument_lists): jobs.add(number, job, arguments, functools.partial(then, index))
  def start_next() -> None:
    if (item := next(waiting, None)) is not None: advance(*item, None)
  for _ in range(at_once): start_next()
  pool.run(jobs)

def _replay(kernel: Kernel, opts: Sequence[Opt]) -> Kernel:
  replayed = kernel.copy()
  for opt in opts: replayed.apply_opt(opt)
  return replayed

def _progress(name: str, step: int, best_s: float, tried: int) -> None:
  """One line, rewritten in place while the search runs (kernel, step, best time so far)."""
  if DEBUG < 1 and not getenv("BEAM_PROGRESS", 1): return
  line = f"BEAM {name:30s} step {step:2d}  best {best_s * 1e6:10.2f} us  ({tried} candidates timed)" if step >= 0 else ""
  if sys.stderr.isatty(): print(f"\r{line:90s}\r", end="", file=sys.stderr, flush=True)
  elif line: print(line, file=sys.stderr)

# ***** the cache *****

def ast_text(ast: LazyOp) -> str:
  """A canonical text of a kernel's AST (ops, args, every buffer's views and dtype): the part of the cache key that is the kernel."""
  arg = ast.arg
  if isinstance(arg, (MemBuffer, ConstBuffer)):
    what = f"buf{arg.idx}" if isinstance(arg, MemBuffer) else f"const {arg.val!r}"
    arg = f"{what} {arg.dtype.name} {[(v.shape, v.strides, v.offset, v.mask) for v in arg.st.views]}"
  elif hasattr(arg, "name") and hasattr(arg, "itemsize"): arg = arg.name  # a dtype (casts)
  return f"{ast.op}({arg!r}; {', '.join(ast_text(src) for src in ast.src)})"

def cache_key(ast: LazyOp, device_key: str) -> str:
  """The cache key: the AST, the device (its name, architecture and renderer), every setting that changes the search, tinyc's code."""
  settings = {name: getenv(name, "") for name in ("BEAM", "BEAM_MIN_PROGRESS", "BEAM_MAX_STEPS", "NOLOCALS")}
  return hashlib.sha256(f"{ast_text(ast)}|{device_key}|{sorted(settings.items())}|{code_version()}".encode()).hexdigest()

@functools.cache
def code_version() -> str:
  """A hash of tinyc's source files: an Opt list searched, or a program built, by other code (whose Opts may mean other things) is not reused."""
  return hashlib.sha256(b"".join(path.read_bytes() for path in sorted(Path(__file__).parents[1].rglob("*.py")))).hexdigest()

def cache_dir() -> Path: return Path(getenv("CACHE_DIR", str(Path.home() / ".cache" / "tinyc")))
def cache_path() -> Path: return Path(getenv("CACHEDB", str(cache_dir() / "beam.db")))

# the cache's own sqlite database: marked by an application id in its header, so that tinyc never reads, rebuilds or deletes a
# file it did not make; in WAL mode (readers do not wait for a writer), each write one transaction, so processes share it safely
APPLICATION_ID = 0x74696E63  # "tinc"
TABLES = {"beam": "CREATE TABLE IF NOT EXISTS beam (key TEXT PRIMARY KEY, opts TEXT NOT NULL)",
          "programs": "CREATE TABLE IF NOT EXISTS programs (key TEXT PRIMARY KEY, program TEXT NOT NULL, binary BLOB NOT NULL)",
          "kernels": "CREATE TABLE IF NOT EXISTS kernels (kernel TEXT PRIMARY KEY, ast TEXT NOT NULL)",
          "devices": "CREATE TABLE IF NOT EXISTS devices (device TEXT PRIMARY KEY, target TEXT NOT NULL)",
          "candidates": "CREATE TABLE IF NOT EXISTS candidates (kernel TEXT NOT NULL, device TEXT NOT NULL, opts TEXT NOT NULL, "
                        "built INTEGER NOT NULL, seconds REAL, PRIMARY KEY (kernel, device, opts))"}
_checked: set[Path] = set()  # caches whose every page this process has read once (damage shows there)

class CacheFileError(RuntimeError):
  """The cache path names a file that tinyc did not make."""

def _made_by_tinyc(path: Path) -> bool:
  """Whether `path` is tinyc's cache (False: absent, new, or an older tinyc's unmarked cache to adopt); CacheFileError otherwise."""
  if not path.is_file(): return False
  refuse = f"The cache {path} is not a tinyc cache ({{}}): tinyc neither reads nor replaces it. Set CACHEDB to another file."
  # SQLite reads the header, never a file object of tinyc's: closing any descriptor of a file drops every POSIX lock the process
  # holds on it, its connections' too, after which another process closing the cache thinks itself the last user and deletes the
  # WAL and its index under them (what they write next can overwrite page 1). SQLite keeps its own descriptors open while any of
  # its connections holds a lock. A file another process is making (empty, zeros while an SQLite that maps files grows it, a
  # part of page 1) is read under SQLite's lock, so waited for.
  try:
    with contextlib.closing(sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro", uri=True, timeout=30)) as connection:
      if connection.execute("PRAGMA application_id").fetchone()[0] == APPLICATION_ID: return True  # (damage further in: _connect)
      tables = {name for (name,) in connection.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
  except sqlite3.OperationalError: raise
  except sqlite3.DatabaseError as error: raise CacheFileError(refuse.format(f"not a readable sqlite database: {error}")) from error
  if not tables <= set(TABLES): raise CacheFileError(refuse.format(f"an sqlite database with the tables {sorted(tables)}"))
  return False

def _connect(path: Path) -> sqlite3.Connection:
  path.parent.mkdir(parents=True, exist_ok=True)
  _opened.add(path.resolve())
  made = _made_by_tinyc(path)
  connection = sqlite3.connect(path, timeout=30, isolation_level=None)  # autocommit: one statement is one transaction
  try:
    connection.execute("PRAGMA synchronous = NORMAL")  # in WAL mode no fsync at each commit: a power cut may lose the last rows, never the file
    if not made:  # new (or adopted): mark it, make the tables and switch to WAL, racing safely with another process doing the same
      connection.execute("BEGIN IMMEDIATE")
      connection.execute(f"PRAGMA application_id = {APPLICATION_ID}")
      for table in TABLES.values(): connection.execute(table)
      connection.execute("COMMIT")
      connection.execute("PRAGMA journal_mode = WAL")
    if path not in _checked:  # an older tinyc's file lacks the newer tables; reading every page of each shows damage
      for name, table in TABLES.items(): connection.execute(table).execute(f"SELECT count(*) FROM {name}").fetchone()
      _checked.add(path)
  except BaseException:
    connection.close()
    raise
  return connection

# each thread keeps its connection open: closing the last one checkpoints the WAL into the file, 12 ms a statement. It is opened
# anew for another path, process or file, and when the file changed under it (a checkpoint, or something else writing it);
# _connect checks then that tinyc made the file
_held = threading.local()
# A forked child inherits SQLite's record of each file its parent had open (one per file, shared by every connection to it in
# the process: which locks the process holds, the WAL index it maps). A new connection of the child's to such a file believes
# the parent's lock on it its own and takes none, so the parent, closing its last connection, deletes the WAL and its index
# under the child, and the child's checkpoint then writes pages the parent's rows no longer match. The child works without
# those files, and leaves the inherited connections open (closing one acts on that record too).
_opened: set[Path] = set()  # the files this process has connected to
_forked_from: set[Path] = set()  # the files this process's parent (or an earlier ancestor) had connected to at the fork
_inherited: list[threading.local] = []

def _run(path: Path, statement: str, parameters: tuple[Any, ...]) -> list[Any]:
  if getattr(_held, "identity", None) != _identity(path):
    _forget()
    _held.connection = _connect(path)
    _held.identity = _identity(path)
  return _held.connection.execute(statement, parameters).fetchall()

def _identity(path: Path) -> tuple[Any, ...]:
  stat = path.stat() if path.exists() else None
  return (path, os.getpid()) + ((stat.st_ino, stat.st_mtime_ns, stat.st_size) if stat else ())

def _forget() -> None:
  if getattr(_held, "connection", None) is not None: _held.connection.close()
  _held.identity = _held.connection = None

def _keep_inherited() -> None:
  global _held
  _inherited.append(_held)
  _held = threading.local()
  _forked_from.update(_opened)
if hasattr(os, "register_at_fork"): os.register_at_fork(after_in_child=_keep_inherited)

def cache_execute(statement: str, parameters: tuple[Any, ...]) -> list[Any]:
  """The rows of one statement run on the cache in its own transaction (the cache made where absent, rebuilt where damaged); none
  (after one warning) where the cache cannot be used."""
  path = cache_path()
  if _forked_from and path.resolve() in _forked_from:
    if DEBUG >= 1: warn_once(f"the cache {path} was open in the process this one was forked from: working without it (see search.py)")
    return []
  try:
    try: return _run(path, statement, parameters)
    except sqlite3.OperationalError:  # cannot open or write (or locked past the timeout): not damage
      _forget()
      raise
    except sqlite3.DatabaseError as error:  # the header says tinyc made it, its contents are damaged
      _forget()
      _checked.discard(path)
      print(f"tinyc: the cache {path} is damaged ({error}); starting a new one", file=sys.stderr)
      for leftover in (path, Path(f"{path}-wal"), Path(f"{path}-shm")): leftover.unlink(missing_ok=True)
      return _run(path, statement, parameters)
  except (OSError, sqlite3.Error) as error:  # an unwritable location, a read-only file, a lock held past the timeout: tinyc goes on
    warn_once(f"cannot use the cache {path} ({error}): working without it. Set CACHEDB to a writable file to keep BEAM's and the compiler's results.")
    return []

def cache_get(key: str) -> tuple[Opt, ...] | None:
  if getenv("IGNORE_BEAM_CACHE", 0): return None
  rows = cache_execute("SELECT opts FROM beam WHERE key = ?", (key,))
  if not rows: return None
  try: return tuple(Opt(OptOps[op], axis, amount) for op, axis, amount in json.loads(rows[0][0]))
  except (ValueError, KeyError, TypeError): return None  # a row this version cannot read is a miss

def opts_text(opts: Sequence[Opt]) -> str: return json.dumps([[opt.op.name, opt.axis, opt.amount] for opt in opts])
def cache_put(key: str, opts: Sequence[Opt]) -> None: cache_execute("INSERT OR REPLACE INTO beam (key, opts) VALUES (?, ?)", (key, opts_text(opts)))
