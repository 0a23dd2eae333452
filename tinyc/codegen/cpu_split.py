"""Layer 3: which CPU kernels run their outermost global loop on several threads, and in what pieces. Imports codegen/uops.
One rule for three users: the LLVM renderer gives such a kernel [start, end) arguments for that loop, device.py reports its size
as the kernel's global size, and runtime/ops_llvm.py calls the kernel on ranges of it from a thread pool.

Only kernels worth it are split: a kernel with constant loop bounds compiles about twice as fast (LLVM unrolls it instead of
emitting vector code with remainder loops and runtime checks), and waking a pool thread costs more than a small kernel runs.
"""
from __future__ import annotations
from tinyc.ops import UnaryOps
from tinyc.codegen.uops import UOp, UOps, executed

# Waking a pool thread for a range and joining it costs 30-90 us (measured on a 2-core KVM guest), so a thread's share should be
# several times that. There, two threads ran a 384x384 matmul (265M ops) 1.2-1.5x faster, a 256x256 one (79M) no faster, and
# made a 1M-element a*a+a (4M) or a 4x4 kernel slower. 16M ops is ~0.1 ms of one core in a matmul, ~0.5 ms in exp or copies: from
# 32M to 16M, a GELU's backward of 1M elements (35M) ran 1.5-1.8 -> 1.0 ms, a softmax (2048, 512) 1.5-1.6 -> 1.2-1.4, a tanh-gelu
# of 1M 0.9-1.1 -> 0.86-0.94 (a*a+a of 1M and a 256 matmul unchanged; 8M was no better than 16M).
CPU_WORK_PER_THREAD = 16 << 20  # ALU ops, loads and stores executed

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
