"""Layer 4: native worker threads for CPU kernels split into ranges. Imports nothing of tinyc; ops_llvm compiles its IR.

Handing a range to a Python pool thread and joining it cost 85 us on the 2-core KVM guest (two wake-ups of a sleeping vCPU, each an
interrupt through the hypervisor), against 3.4 us for running a kernel on the calling thread: 40 split kernels a CPU GPT step paid it.
Here each worker is a pthread running a loop compiled with llvmlite, which never touches Python: it spins on its job's sequence
number (`pause` between reads) for SPIN_TRIPS reads, then sleeps between reads, longer each time (an idle process keeps no core busy).
A job is a kernel's address, its arguments (pointers and ints: each passes in a 64-bit register or stack slot, so one call site per
count of arguments calls every kernel) and a range. The caller publishes a job per worker, runs the first range itself, then claims
each job no worker has claimed yet (a compare-and-swap on the job's claim word) and runs it too: a worker asleep in its poll never
delays a kernel, it only leaves the caller the work. Every wait is native code called through ctypes, which releases the GIL.
"""
from __future__ import annotations
import atexit, ctypes, os, threading
from typing import Any, Callable

MAX_ARGS = 64
# ~1-5 ms of spinning after a job (pause takes 10-140 cycles), then sleeps: the caller's wait for a range reads every POLL_US, an
# idle worker after 0.2 ms, then 0.4... up to IDLE_POLL_US (a worker woken that often slowed torch's step in the same process 10-20%)
SPIN_TRIPS, POLL_US, IDLE_POLL_US = 1 << 15, 20, 10_000
SEQ, CLAIM, DONE, FUNCTION, COUNT, START, END, ARGS = 0, 8, 16, 24, 25, 26, 27, 32  # words of a job; the first three a cache line each
JOB_WORDS = ARGS + MAX_ARGS

def pool_source(pause: bool) -> str:
  """The IR of the worker loop (`tinyc_worker`), of claiming and running a job (`tinyc_take`) and of the caller's wait (`tinyc_finish`)."""
  word = lambda job, index: f"getelementptr i64, ptr %{job}, i64 {index}"  # noqa: E731
  loads = "".join(f"  %a{i}p = {word('job', ARGS + i)}\n  %a{i} = load i64, ptr %a{i}p\n" for i in range(MAX_ARGS))  # (all: the job holds them)
  calls = [f"call{count}:\n  call void %fn({', '.join([f'i64 %a{i}' for i in range(count)] + ['i64 %start', 'i64 %end'])})\n  br label %ran\n"
           for count in range(MAX_ARGS + 1)]
  cases = " ".join(f"i64 {count}, label %call{count}" for count in range(MAX_ARGS + 1))
  relax = "call void @llvm.x86.sse2.pause()" if pause else "fence seq_cst"
  def wait(name: str, index: int, test: str, then: str, longest: int) -> str:
    """Read a job's word until `test` (an icmp of %{name}_now) holds: SPIN_TRIPS reads apart by `relax`, then sleeping between reads,
    200 us (or `longest`) the first time, then twice as long each time up to `longest` us."""
    return f"""  br label %{name}
{name}:
  %{name}_trips = phi i64 [0, %{name}_from], [%{name}_next, %{name}_relax], [%{name}_next, %{name}_sleep]
  %{name}_us = phi i32 [{min(longest, 200)}, %{name}_from], [%{name}_us, %{name}_relax], [%{name}_longer, %{name}_sleep]
  %{name}_p = {word('job', index)}
  %{name}_now = load atomic i64, ptr %{name}_p acquire, align 8
  %{name}_test = {test}
  br i1 %{name}_test, label %{then}, label %{name}_idle
{name}_idle:
  %{name}_next = add i64 %{name}_trips, 1
  %{name}_long = icmp ugt i64 %{name}_next, {SPIN_TRIPS}
  br i1 %{name}_long, label %{name}_sleep, label %{name}_relax
{name}_relax:
  {relax}
  br label %{name}
{name}_sleep:
  %{name}_slept = call i32 @usleep(i32 %{name}_us)
  %{name}_doubled = shl i32 %{name}_us, 1
  %{name}_capped = icmp ugt i32 %{name}_doubled, {longest}
  %{name}_longer = select i1 %{name}_capped, i32 {longest}, i32 %{name}_doubled
  br label %{name}
"""
  return f"""declare i32 @usleep(i32)
{"declare void @llvm.x86.sse2.pause()" if pause else ""}
define i1 @tinyc_take(ptr %job, i64 %seq) {{
entry:
  %claimp = {word('job', CLAIM)}
  %before = sub i64 %seq, 1
  %swap = cmpxchg ptr %claimp, i64 %before, i64 %seq acq_rel acquire
  %won = extractvalue {{ i64, i1 }} %swap, 1
  br i1 %won, label %run, label %lost
lost:
  ret i1 0
run:
  %fnp = {word('job', FUNCTION)}
  %fn = load ptr, ptr %fnp
  %countp = {word('job', COUNT)}
  %count = load i64, ptr %countp
  %startp = {word('job', START)}
  %start = load i64, ptr %startp
  %endp = {word('job', END)}
  %end = load i64, ptr %endp
{loads}  switch i64 %count, label %ran [ {cases} ]
{"".join(calls)}ran:
  %donep = {word('job', DONE)}
  store atomic i64 %seq, ptr %donep release, align 8
  ret i1 1
}}
define ptr @tinyc_worker(ptr %job) {{
entry:
  br label %next
next:
  %last = phi i64 [0, %entry], [%poll_now, %taken]
  br label %poll_from
poll_from:
{wait("poll", SEQ, "icmp ne i64 %poll_now, %last", "got", IDLE_POLL_US)}got:
  %stop = icmp slt i64 %poll_now, 0
  br i1 %stop, label %exit, label %take
take:
  %took = call i1 @tinyc_take(ptr %job, i64 %poll_now)
  br label %taken
taken:
  br label %next
exit:
  ret ptr null
}}
define void @tinyc_publish(ptr %job, i64 %seq) {{
  %seqp = {word('job', SEQ)}
  store atomic i64 %seq, ptr %seqp release, align 8
  ret void
}}
define void @tinyc_finish(ptr %job, i64 %seq) {{
entry:
  %took = call i1 @tinyc_take(ptr %job, i64 %seq)
  br i1 %took, label %done, label %wait_from
wait_from:
{wait("wait", DONE, "icmp eq i64 %wait_now, %seq", "done", POLL_US)}done:
  ret void
}}
"""

class NativePool:
  """Native worker threads (as many as asked for so far), each with a job in memory that is never freed (a worker may read it until
  the process ends). `functions`: the addresses of pool_source's functions, compiled (by ops_llvm.compile_pool) in code never freed."""
  def __init__(self, functions: dict[str, int]) -> None:
    self.worker = functions["tinyc_worker"]
    self.libc = ctypes.CDLL(None, use_errno=True)
    self.libc.malloc.restype, self.libc.malloc.argtypes = ctypes.c_void_p, [ctypes.c_size_t]
    self.publish, self.finish = (ctypes.CFUNCTYPE(None, ctypes.c_void_p, ctypes.c_int64)(functions[name])
                                 for name in ("tinyc_publish", "tinyc_finish"))
    self.jobs, self.seqs, self.lock = list[Any](), list[int](), threading.Lock()  # (the lock: one caller at a time)
    atexit.register(self.stop)

  def grow(self, workers: int) -> None:
    while len(self.jobs) < workers:
      address = (self.libc.malloc(JOB_WORDS * 8 + 64) + 63) // 64 * 64
      ctypes.memset(address, 0, JOB_WORDS * 8)
      thread = ctypes.c_ulong()
      if self.libc.pthread_create(ctypes.byref(thread), None, ctypes.c_void_p(self.worker), ctypes.c_void_p(address)) != 0:
        raise OSError(ctypes.get_errno(), "pthread_create failed")
      self.libc.pthread_detach(thread)
      self.jobs.append((ctypes.c_int64 * JOB_WORDS).from_address(address))
      self.seqs.append(0)

  def run(self, function: Any, address: int, args: list[Any], ranges: list[tuple[int, int]]) -> None:
    """function(*args, start, end) for every range: the first here, the others by the workers (or here, where none took them)."""
    self.grow(len(ranges) - 1)
    values = [arg._as_parameter_.value if hasattr(arg, "_as_parameter_") else int(arg) for arg in args]
    for job, (start, end) in zip(self.jobs, ranges[1:]):
      job[FUNCTION:END + 1], job[ARGS:ARGS + len(values)] = (address, len(values), start, end), values
    for worker in (published := range(len(ranges) - 1)):
      self.seqs[worker] += 1
      self.publish(ctypes.addressof(self.jobs[worker]), self.seqs[worker])  # (a release store: the job's words are seen first)
    try: function(*args, ctypes.c_int64(ranges[0][0]), ctypes.c_int64(ranges[0][1]))
    finally:
      for worker in published: self.finish(ctypes.addressof(self.jobs[worker]), self.seqs[worker])

  def stop(self) -> None:
    for job in self.jobs: self.publish(ctypes.addressof(job), -1)

_pool: list[NativePool | None] = []  # made on first use; [None] where it could not be made

def native_pool(compile_pool: Callable[[], dict[str, int]]) -> NativePool | None:
  """The process's pool, made on first use with the code `compile_pool` returns; None where it cannot be (no pthreads)."""
  if not _pool:
    try: _pool.append(NativePool(compile_pool()))
    except (OSError, RuntimeError, AttributeError, TypeError): _pool.append(None)  # (ops_llvm.run_ranges uses Python threads then)
  return _pool[0]

# a forked child has none of its parent's threads: it makes its own pool
if hasattr(os, "register_at_fork"): os.register_at_fork(after_in_child=_pool.clear)
