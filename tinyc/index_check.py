"""Layer 5: index checks that wait for their values. Imports helpers, lazy.

An op that indexes with a Tensor (x[t], x[t] = v, gather, nn.Embedding, a loss's labels) cannot check the index values when
it is built: they are lazy. So it registers an IndexCheck, a small lazy value holding the index's extremes. Every realize
computes the checks made since the last one in its own schedule (one small reduce kernel each, beside the op that reads the
index), and the next point where data reaches the host (Tensor.numpy, and so item and tolist; a TinyJit call's return) reads
them and raises IndexOutOfRangeError for a value out of range. TinyJit captures the check kernels with the step, and re-reads
their results after each replay. The registry is process-wide and locked; a check is dropped once read, and once more than
MAX_PENDING computed checks wait, a realize reads them, so a loop that never reads the host does not pile them up. The registry
is not per thread: a bad index one thread made may raise at the next host read of another.
"""
from __future__ import annotations
import os, sys, threading
from typing import NamedTuple
import numpy as np
from tinyc.helpers import ThreadRecorder
from tinyc.lazy import LazyBuffer

MAX_PENDING = 64
TINYC_DIR = os.path.dirname(os.path.abspath(__file__)) + os.sep

class IndexOutOfRangeError(IndexError, RuntimeError):
  """An index value outside its dimension: an IndexError, as torch's x[t], embedding and cross_entropy raise, and a RuntimeError,
  as torch's gather raises."""

class IndexCheck(NamedTuple):
  """low <= every value of an index tensor < high, to be verified through `extremes`."""
  extremes: LazyBuffer  # 2 values: the largest index, then the bitwise NOT of the smallest (no overflow, unlike -x) or -smallest for floats
  low: int
  high: int
  message: str          # what to raise, with {value} where the bad value goes

  def bad_value(self) -> int | float | None:
    buffer = self.extremes.base.realized
    assert buffer is not None, f"an index check is read before a realize computed it: {self.extremes}"
    largest, encoded = buffer.numpy()
    smallest = ~encoded if np.issubdtype(encoded.dtype, np.integer) else -encoded
    return largest.item() if largest >= self.high else smallest.item() if smallest < self.low else None

_lock = threading.Lock()
_unscheduled: list[IndexCheck] = []     # made since the last realize
_scheduled: list[IndexCheck] = []       # handed to a realize, not yet read
checks_made: ThreadRecorder[IndexCheck] = ThreadRecorder()  # TinyJit's capture: `with checks_made.record() as checks:`

def add(extremes: LazyBuffer, low: int, high: int, message: str) -> None:
  """Check low <= index < high through the index's `extremes` (see IndexCheck); message names the op, with {value} for the bad value."""
  hint = ("index values are checked where data reaches the host; CHECK_INDEX=0 skips the check for speed, and an out-of-range index "
          "then reads 0")
  check = IndexCheck(extremes, low, high, f"{message} (made at {_user_line()}; {hint})")
  with _lock:
    _unscheduled.append(check)
  checks_made.note(check)

def claim() -> list[IndexCheck]:
  """The checks no realize has computed yet, for the caller's realize to compute."""
  if not _unscheduled: return []  # nearly always, in an eager loop (a check another thread adds meanwhile goes to the next realize)
  with _lock:
    claimed = _unscheduled[:]
    _unscheduled.clear()
    _scheduled.extend(claimed)
  return claimed

def release(checks: list[IndexCheck]) -> None:
  """Hand back checks whose realize failed, so that the next realize computes them."""
  ids = {id(check) for check in checks}
  with _lock:
    _scheduled[:] = [check for check in _scheduled if id(check) not in ids]
    _unscheduled.extend(checks)

def read_pending(only_if_over_limit: bool = False) -> None:
  """Read every computed check (dropping it) and raise for the first index out of range."""
  if only_if_over_limit and len(_scheduled) <= MAX_PENDING: return  # every realize asks; a check added meanwhile waits for the next
  with _lock:
    if only_if_over_limit and len(_scheduled) <= MAX_PENDING: return
    ready = [check for check in _scheduled if check.extremes.is_realized()]
    _scheduled[:] = [check for check in _scheduled if not check.extremes.is_realized()]
  raise_if_out_of_range(ready)

def raise_if_out_of_range(checks: list[IndexCheck]) -> None:
  for check in checks:
    if (value := check.bad_value()) is not None: raise IndexOutOfRangeError(check.message.replace("{value}", str(value), 1))

def pending_count() -> int:
  with _lock: return len(_unscheduled) + len(_scheduled)

def _user_line() -> str:
  """file:line of the innermost caller outside tinyc: where the user's code made the indexing op."""
  frame = sys._getframe(1)
  while frame.f_back is not None and frame.f_code.co_filename.startswith(TINYC_DIR): frame = frame.f_back
  return f"{frame.f_code.co_filename}:{frame.f_lineno}"
