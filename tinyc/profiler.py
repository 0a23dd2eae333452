"""Layer 1: the profiler. With PROFILE=1 tinyc records the time it spends scheduling, compiling and searching (BEAM) and every
kernel run with its device time, and at exit writes them as a Chrome trace (open it in https://ui.perfetto.dev or chrome://tracing)
to ./tinyc_profile.json (PROFILE=path.json: to that path) and prints the kernels that took the most time. Imports helpers.

Kernels are timed as DEBUG=2 times them (the device's own timer on a GPU, the wall time of the call on a CPU), so a profiled run
waits for each kernel. Off, nothing is recorded: the hot paths read the setting once.
"""
from __future__ import annotations
import atexit, contextlib, functools, json, os, threading, time
from typing import Any, Iterator, NamedTuple
from tinyc.helpers import DEBUG, PROFILE, rates

DEFAULT_PATH = "tinyc_profile.json"

class Event(NamedTuple):
  """Something that took time: `start` and `seconds` in time.perf_counter seconds; `track` is "host" or a device's name."""
  name: str
  category: str  # schedule, compile, beam or kernel
  start: float
  seconds: float
  track: str
  args: dict[str, Any]

_events: list[Event] = []
_lock = threading.Lock()
_path: list[str] = []  # where the trace goes: the PROFILE setting when the last event was recorded (a Context may have set it)

def enabled() -> bool: return PROFILE.value not in ("", "0")

class Shown(NamedTuple):
  """What DEBUG and PROFILE ask a realize (or a TinyJit replay) to show, read once for all of it: a setting's read costs ~0.1 us, and an
  eager realize of one kernel read them five times. timed: each kernel waits and is timed (PROFILE, DEBUG>=2)."""
  debug: int
  profiling: bool
  timed: bool
def shown() -> Shown:
  debug, profiling = DEBUG.value, PROFILE.value not in ("", "0")  # (enabled() inlined)
  return _shown(debug, profiling) if debug or profiling else QUIET  # (QUIET: no cache lookup in the common case)
@functools.cache  # one of each (a NamedTuple is built in a Python call)
def _shown(debug: int, profiling: bool) -> Shown: return Shown(debug, profiling, profiling or debug >= 2)
QUIET = Shown(0, False, False)

def record(name: str, category: str, start: float, seconds: float, track: str = "host", **args: Any) -> None:
  """Note one event; the first one registers finish() to run at exit. Callers check enabled() first."""
  with _lock:
    if not _path: atexit.register(finish)
    _path[:] = [PROFILE.value if PROFILE.value != "1" else DEFAULT_PATH]
    _events.append(Event(name, category, start, seconds, track, args))

@contextlib.contextmanager
def span(name: str, category: str, **args: Any) -> Iterator[None]:
  """Record the time the block takes, when profiling."""
  if not enabled():
    yield
    return
  start = time.perf_counter()
  try: yield
  finally: record(name, category, start, time.perf_counter() - start, **args)

def events() -> list[Event]:
  with _lock: return list(_events)

def finish() -> str | None:
  """Write the trace and print the summary of what was recorded since the last finish(); the trace's path, None if nothing was."""
  with _lock:
    recorded, path = list(_events), (_path or [DEFAULT_PATH])[0]
    _events.clear()
  if not recorded: return None
  write_trace(recorded, path)
  print(summary(recorded))
  print(f"tinyc profile: {len(recorded)} events written to {os.path.abspath(path)} (open it in https://ui.perfetto.dev)")
  return path

def write_trace(recorded: list[Event], path: str) -> None:
  """The events as Chrome trace event JSON, written to a temporary file beside `path` and renamed: never a half-written trace."""
  tracks = {track: number for number, track in enumerate(dict.fromkeys(["host"] + [event.track for event in recorded]))}
  origin = min(event.start for event in recorded)
  trace: list[dict[str, Any]] = [{"name": "thread_name", "ph": "M", "pid": os.getpid(), "tid": number, "args": {"name": track}}
                                 for track, number in tracks.items()]
  trace += [{"name": event.name, "cat": event.category, "ph": "X", "pid": os.getpid(), "tid": tracks[event.track],
             "ts": (event.start - origin) * 1e6, "dur": event.seconds * 1e6, "args": event.args} for event in recorded]
  temporary = f"{path}.{os.getpid()}.{threading.get_ident()}.tmp"  # beside it (a rename within one file system), this thread's own
  try:
    with open(temporary, "w") as file:
      json.dump({"traceEvents": trace, "displayTimeUnit": "ms"}, file)
      file.flush()
      os.fsync(file.fileno())
    os.replace(temporary, path)
  except BaseException:
    with contextlib.suppress(OSError): os.unlink(temporary)
    raise

TOP_KERNELS = 20

def summary(recorded: list[Event]) -> str:
  """The kernels that took the most device time: calls, total time, GFLOP/s, GB/s and their share of the device's peak, where tinyc
  knows it; then the host time spent scheduling, compiling and searching."""
  kernels: dict[str, list[Any]] = {}  # name -> [calls, seconds, flops, bytes, device, peaks]
  for event in (event for event in recorded if event.category == "kernel"):
    total = kernels.setdefault(event.name, [0, 0.0, 0, 0, event.track, event.args.get("peaks")])
    total[0], total[1] = total[0] + 1, total[1] + event.seconds
    total[2], total[3] = total[2] + event.args["flops"], total[3] + event.args["bytes"]
  lines = [f"{'kernel':32s} {'device':6s} {'calls':>6s} {'total ms':>9s} {'share':>6s} {'GFLOP/s':>9s} {'GB/s':>9s} {'of peak':>8s}"]
  kernel_seconds = sum(total[1] for total in kernels.values()) or 1.0
  for name, (calls, seconds, flops, mem_bytes, device, peaks) in sorted(kernels.items(), key=lambda item: -item[1][1])[:TOP_KERNELS]:
    gflops, gbs = rates(flops, mem_bytes, seconds)
    # the share of the nearer ceiling: a kernel is bound by compute or by memory, whichever it comes closer to
    of_peak = f"{max(gflops / peaks[0], gbs / peaks[1]) * 100:7.1f}%" if peaks else "       -"
    share = seconds / kernel_seconds * 100
    lines.append(f"{name[:32]:32s} {device:6s} {calls:6d} {seconds * 1e3:9.3f} {share:5.1f}% {gflops:9.2f} {gbs:9.2f} {of_peak}")
  if len(kernels) > TOP_KERNELS: lines.append(f"... and {len(kernels) - TOP_KERNELS} more kernels")
  no_peaks = sorted({total[4] for total in kernels.values() if not total[5]})
  if no_peaks: lines.append(f"(of peak: tinyc has no peak figures for {', '.join(no_peaks)})")
  host = {category: sum(event.seconds for event in recorded if event.category == category) for category in ("schedule", "compile", "beam")}
  lines.append("host: " + ", ".join(f"{category} {seconds * 1e3:.1f} ms" for category, seconds in host.items()))
  return "\n".join(lines)
