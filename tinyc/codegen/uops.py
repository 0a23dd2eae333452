"""Layer 3: UOps, the typed linear IR that every renderer turns into source. Imports helpers, dtype, ops, shape/."""
from __future__ import annotations
import math, operator
from dataclasses import dataclass
from enum import Enum, auto
from typing import Any, Callable, NamedTuple
from tinyc.dtype import DType, dtypes
from tinyc.ops import BinaryOps, Op, TernaryOps, UnaryOps
from tinyc.shape.symbolic import sint, sym_max

class UOps(Enum):
  DEFINE_GLOBAL = auto()  # arg: a GlobalBuffer; dtype: element type of the buffer
  DEFINE_VAR = auto()     # arg: a Variable (of a symbolic dim), an int parameter after the buffers, in Kernel.vars' order
  DEFINE_ACC = auto()     # a mutable local scalar, or vector (CPUs); arg: its start value (each lane's). LOAD(acc) reads it, STORE(acc, v) writes it
  SPECIAL = auto()        # a thread id on GPUs; arg: a ThreadIndex
  DEFINE_LOCAL = auto()   # memory shared by a work-group (CUDA __shared__, OpenCL __local); arg: LocalBuffer
  BARRIER = auto()        # every thread of the work-group waits here, and sees the others' local-memory writes
  LOOP = auto()           # src: (start, end); arg: a Loop
  IF = auto()             # src: (condition,); what follows runs only where it holds, up to the END
  END = auto()            # src: (loop or if,)
  LOAD = auto()           # src: (buffer, index[, valid]) or (acc,); arg "volatile": read afresh (CPU, packing.fresh_operands)
  STORE = auto()          # src: (buffer, index, value[, valid]) or (acc, value); with `valid`, only where it holds
  CONST = auto()          # arg: the Python value
  ALU = auto()            # arg: the UnaryOps/BinaryOps/TernaryOps member; on vectors (CPUs), lane by lane
  CAST = auto()           # src: (value,); dtype: the target
  BITCAST = auto()
  VECTORIZE = auto()      # src: the lanes; dtype: their vector type (a LOAD or STORE of a vector moves all lanes at once)
  GEP = auto()            # src: (vector,); arg: the lane it reads
  LOAD_FRAGMENT = auto()  # src: (local memory, this thread's row index); arg: a Fragment; dtype: a uint32 vector, a register a matrix
  WMMA = auto()           # src: (4 A registers, 2 B registers, 4 accumulators); arg: the operands' DType; adds A @ B to the accumulators
  COPY_ASYNC = auto()     # src: (local memory, index, global memory, index[, valid]); arg: bytes (4 or 16) copied in the background
  ASYNC_COMMIT = auto()   # src: (barriers, index): this thread's copies since the last commit arrive at that barrier once they land
  ASYNC_WAIT = auto()     # wait until every copy this thread issued has landed
  BARRIER_INIT = auto()   # src: (barriers,): local memory of split barriers (CUDA mbarriers), each awaiting every thread of the work-group
  BARRIER_ARRIVE = auto() # src: (barriers, index): this thread is done with what the barrier guards (its reads and writes come first)
  BARRIER_WAIT = auto()   # src: (barriers, index, parity): wait until the barrier's phase of that parity (0 or 1) has completed
  WGMMA = auto()          # src: A's tile and index or registers, B's tile, index, accumulators; arg: a Warpgroup; starts a warpgroup's m64nNk16 mma
  SHUFFLE = auto()        # src: (value,); arg: (offset, lanes): the value of the lane whose place among `lanes` neighbours is this one's ^ offset
  TRANSPOSE = auto()      # src: (register,): of the 8 x 8 16-bit matrix a warp's registers hold (a row a lane quarter, two columns a
                          # lane), this lane's register of its transpose (movmatrix.trans)
  PREFETCH = auto()       # src: (buffer, index): a hint (CPUs) that the element is read soon; it moves no value and never faults
  WARPGROUP_SYNC = auto() # arg: "fence" (registers ready for wgmma), "commit" (the wgmmas since are a group), "wait N" (at most N
                          # groups still running) or "proxy" (local memory stored by threads is seen by wgmma)

class GlobalBuffer(NamedTuple):
  """DEFINE_GLOBAL's arg: a buffer the kernel takes as a pointer parameter. Parameters are in buffer-number order, outputs first."""
  name: str
  number: int
  is_output: bool

class LocalBuffer(NamedTuple):
  """DEFINE_LOCAL's arg: `size` elements of work-group memory, defined at the kernel's scope."""
  name: str
  size: int

class ThreadKind(Enum):
  GLOBAL = auto()  # the global thread id (the runtime picks the work-group size)
  GROUP = auto()   # the work-group id
  LOCAL = auto()   # the thread's id inside its work-group

class ThreadIndex(NamedTuple):
  """SPECIAL's arg: a GPU thread index along launch dimension `dim`, from 0 to size - 1."""
  dim: int
  name: str
  size: sint  # symbolic for a symbolic axis: the launch size is worked out from the Variables' values at each run
  kind: ThreadKind

class Loop(NamedTuple):
  """LOOP's arg. `vectorize`: SIMD across its trips pays. `outermost_global`: a CPU kernel may run it in ranges on several threads (cpu_split.py)."""
  name: str
  vectorize: bool
  outermost_global: bool = False
  trips: sint = 0  # a symbolic loop's trip count (src[1] holds it as a UOp): executed() counts it at its largest

class Fragment(NamedTuple):
  """LOAD_FRAGMENT's arg: `matrices` 8 x 8 matrices of 16-bit values read by a warp together (ldmatrix), each thread giving the
  address of one row of 8 and getting 2 values of each matrix packed in a register; `transposed`: the rows in memory are columns."""
  matrices: int
  transposed: bool

class Warpgroup(NamedTuple):
  """WGMMA's arg: the operands' DType, N, and each operand's descriptor bits besides its address (where its rows of 128 bytes
  lie, swizzled) and whether it is transposed (contiguous along M or N, not K); `a_in_registers`: WGMMA's sources begin with A's
  4 registers (TF32: rows g and g + 8 at K t and t + 4, as mma.sync's), not A's tile and index."""
  dtype: DType
  n: int
  a_bits: int
  b_bits: int
  a_transposed: bool
  b_transposed: bool
  a_in_registers: bool = False
  def sources(self, uop: UOp) -> tuple[tuple[UOp, ...], tuple[UOp, UOp], tuple[UOp, ...]]:
    """A WGMMA's sources: A's (tile and index, or registers), B's tile and index, the accumulators."""
    a_count = 4 if self.a_in_registers else 2
    return uop.src[:a_count], (uop.src[a_count], uop.src[a_count + 1]), uop.src[a_count + 2:]
  def tiles(self, uop: UOp) -> tuple[UOp, ...]:  # the local memories a WGMMA reads by address
    return self.sources(uop)[1][:1] + (() if self.a_in_registers else uop.src[:1])

def tensor_core_flops(uop: UOp) -> int:
  """A thread's share of the products an mma (m16n8k16, k8 for TF32, by 32 threads) or a wgmma (m64nNk16, k8 for TF32, by 128) adds up."""
  if uop.op is UOps.WGMMA: return 2 * 64 * uop.arg.n * (32 // uop.arg.dtype.itemsize) // 128
  return 2 * 16 * 8 * (32 // uop.arg.itemsize) // 32

VECTOR_WIDTH = 4  # lanes of a GPU vector load or store: 4 x 4 bytes is the widest single memory instruction
PACKED_16_BIT = (dtypes.float16, dtypes.bfloat16)  # a vector of these is their bits, two to a 32-bit word (registers hold floats)

@dataclass(frozen=True, eq=False)
class UOp:
  """One linearized op. Identity is the object: the linearizer dedups equal pure UOps before making them."""
  op: UOps
  dtype: DType | None
  src: tuple[UOp, ...] = ()
  arg: Any = None
  def __repr__(self) -> str:
    return f"{self.op.name:13s} {str(self.dtype.name if self.dtype else ''):8s} {[id(s) % 10007 for s in self.src]} {self.arg!r} #{id(self) % 10007}"

# IDIV and MOD truncate toward zero, as C does. x / 0 and x % 0 give 0 on every device, as numpy's // and % do: torch's CPU
# raises, but a lazy kernel cannot, and 0 costs one select (every renderer divides only by a divisor that is not 0, or -1 if
# signed: both trap in hardware). INT_MIN / -1 wraps to INT_MIN.
def _int_div(a: int, b: int) -> int:
  if b == 0: return 0
  quotient = abs(a) // abs(b)  # in ints: int(a / b) rounds through a float and loses int64's low bits
  return quotient if (a < 0) == (b < 0) else -quotient
def _int_mod(a: int, b: int) -> int: return a - b * _int_div(a, b) if b != 0 else 0

# what each ALU op computes, in Python: constant folding uses it, and so can a reference interpreter
PYTHON_ALU: dict[Op, Callable[..., Any]] = {
  UnaryOps.NEG: operator.neg, UnaryOps.SQRT: lambda x: math.sqrt(x) if x >= 0 else math.nan, UnaryOps.EXP2: lambda x: math.exp2(x),
  UnaryOps.LOG2: lambda x: math.log2(x) if x > 0 else (-math.inf if x == 0 else math.nan), UnaryOps.SIN: math.sin,
  UnaryOps.RECIP: lambda x: 1 / x if x != 0 else math.copysign(math.inf, x),
  BinaryOps.ADD: operator.add, BinaryOps.SUB: operator.sub, BinaryOps.MUL: operator.mul, BinaryOps.MAX: max,
  BinaryOps.DIV: lambda a, b: a / b if b != 0 else (math.nan if a == 0 else math.copysign(math.inf, a) * math.copysign(1, b)),
  BinaryOps.IDIV: _int_div, BinaryOps.MOD: _int_mod, BinaryOps.CMPLT: operator.lt, BinaryOps.CMPEQ: operator.eq,
  BinaryOps.AND: operator.and_, BinaryOps.OR: operator.or_, BinaryOps.XOR: operator.xor, TernaryOps.WHERE: lambda c, a, b: a if c else b}

def cast_python_value(value: Any, dtype: DType) -> Any:
  """A Python number as it is when stored in `dtype` (ints wrap around, bools are 0/1)."""
  if dtype == dtypes.bool: return bool(value)
  if dtypes.is_float(dtype): return float(value)
  bits = 8 * dtype.itemsize
  wrapped = int(value) & ((1 << bits) - 1)
  return wrapped - (1 << bits) if not dtypes.is_unsigned(dtype) and wrapped >= 1 << (bits - 1) else wrapped

def loop_trips(loop: UOp) -> int:
  """A LOOP's trip count: its end where that is a constant, else the largest its Variables allow."""
  return loop.src[1].arg if loop.src[1].op is UOps.CONST else sym_max(loop.arg.trips)

def executed(uops: list[UOp], counted: Callable[[UOp], int]) -> int:
  """How often the `counted` uops run, times their weight (a bool counts 1): each once per iteration of the loops around it (and per
  GPU thread), once a lane of a vector."""
  total, trips = 0, 1
  for uop in uops:
    if uop.op is UOps.LOOP: trips *= loop_trips(uop)
    elif uop.op is UOps.END and uop.src[0].op is UOps.LOOP: trips //= loop_trips(uop.src[0])
    elif uop.op is UOps.SPECIAL: trips *= sym_max(uop.arg.size)  # one GPU thread per index
    elif weight := counted(uop): total += trips * (uop.dtype.count if uop.dtype is not None else 1) * weight
  return total

VALUE_ONLY = (UOps.CONST, UOps.ALU, UOps.CAST, UOps.BITCAST, UOps.GEP, UOps.VECTORIZE, UOps.LOAD)  # ops that do nothing but make a value

def without_unused(uops: list[UOp]) -> list[UOp]:
  """`uops` without those that only make a value that nothing uses."""
  used: set[UOp] = set()
  for uop in reversed(uops):  # a UOp comes after its sources
    if uop.op not in VALUE_ONLY or uop in used: used.update(uop.src)
  return [uop for uop in uops if uop.op not in VALUE_ONLY or uop in used]

def is_const(uop: UOp, value: Any) -> bool: return uop.op is UOps.CONST and uop.arg == value
def is_identity(op: BinaryOps, uop: UOp, dtype: DType) -> bool:
  """Whether `uop` is op's identity (x * 1, x + 0; for a float's add only -0.0: -0.0 + 0.0 is 0.0)."""
  if not is_const(uop, {BinaryOps.ADD: 0, BinaryOps.MUL: 1}[op]): return False
  return op is not BinaryOps.ADD or not dtypes.is_float(dtype) or math.copysign(1.0, uop.arg) < 0
