"""Layer 3: which CPU kernels run their outermost global loop on several threads, and in what pieces. Imports codegen/uops.
One rule for three users: the LLVM renderer gives such a kernel [start, end) arguments for that loop, device.py reports its size
as the kernel's global size, and runtime/ops_llvm.py calls the kernel on ranges of it from a thread pool.

Only kernels worth it are split: a kernel with constant loop bounds compiles about twice as fast (LLVM unrolls it instead of
emitting vector code with remainder loops and runtime checks), and handing a range to a thread costs more than a tiny kernel runs.
"""
from __future__ import annotations
from tinyc.ops import UnaryOps
from tinyc.codegen.uops import UOp, UOps, executed

# Handing a range to a native worker (runtime/cpu_pool.py) costs about 3 us, so a thread's share need only be a few times that: from
# 16M ops (when a Python pool thread's wake-up cost 30-90 us) to 1M, the CPU GPT bench's step 53.9-55.5 -> 46.5-47.0 ms (2-core
# AVX-512 guest; 4M 50.8-51.3, 256K 46.9-47.6). 1M ops is ~10 us of one core in a matmul, ~30 us in exp or copies.
CPU_WORK_PER_THREAD = 1 << 20  # ALU ops, loads and stores executed

# the ALU ops the LLVM renderer writes for one of these (llvmir._exp2, _log2: a range reduction, a polynomial, the special cases)
INLINE_ALU_OPS = {UnaryOps.EXP2: 20, UnaryOps.LOG2: 30}

def _work(uop: UOp) -> int:
  if uop.op is UOps.ALU: return INLINE_ALU_OPS.get(uop.arg, 1)
  return int(uop.op in (UOps.LOAD, UOps.STORE))

def outermost_global_loop(uops: list[UOp]) -> UOp | None:
  """The LOOP the linearizer marked as the kernel's outermost global loop (Loop.outermost_global); None in a kernel without one."""
  return next((uop for uop in uops if uop.op is UOps.LOOP and uop.arg.outermost_global), None)

def outer_split(uops: list[UOp]) -> tuple[int, int] | None:
  """(the outermost global loop's trips, the fewest worth a thread) for a kernel worth two threads or more, else None."""
  if (loop := outermost_global_loop(uops)) is None or loop.src[1].op is not UOps.CONST: return None  # (a symbolic loop: one thread)
  rows = loop.src[1].arg
  work = executed(uops, _work)
  min_rows = -(-CPU_WORK_PER_THREAD * rows // max(work, 1))  # rounded up
  return (rows, min_rows) if rows >= 2 * min_rows else None

def split_range(rows: int, min_rows: int, threads: int) -> list[tuple[int, int]]:
  """[0, rows) as contiguous ranges of nearly equal length, at most one per thread and none shorter than min_rows (nor empty)."""
  count = max(1, min(threads, rows // max(min_rows, 1)))
  return [(rows * i // count, rows * (i + 1) // count) for i in range(count)]
