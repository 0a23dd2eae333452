"""Layer 3: one C-style renderer from UOps; CUDA C and OpenCL C are small dialects of it. Imports helpers, dtype, ops,
codegen/uops.

The output is meant to be read: one statement per load, store and loop; an ALU value used once is written inline where it is
used, one used more often gets a named variable. float16 and bfloat16 live in memory as 16-bit values and as float in
registers (the dialect converts at loads and stores), so every backend rounds them at the same places.
"""
from __future__ import annotations
import itertools, math
from collections import defaultdict
from dataclasses import dataclass
from typing import Any, Callable, cast
from tinyc.dtype import DType, dtypes
from tinyc.helpers import all_int, prod
from tinyc.ops import BinaryOps, Op, TernaryOps, UnaryOps
from tinyc.codegen.cuda_prelude import CUDA_PRELUDE
from tinyc.codegen.uops import PACKED_16_BIT, Fragment, ThreadKind, UOp, UOps, Warpgroup

def _is_signed(dtype: DType) -> bool: return dtypes.is_int(dtype) and not dtypes.is_unsigned(dtype)
def _max(a: str, b: str) -> str: return f"((({a})!=({a}) || ({a})>({b})) ? ({a}) : ({b}))"  # NaN wins, like torch.maximum

ALU_CODE: dict[Op, Callable[..., str]] = {
  UnaryOps.NEG: lambda x: f"(-{x})", UnaryOps.EXP2: lambda x: f"exp2({x})", UnaryOps.LOG2: lambda x: f"log2({x})",
  UnaryOps.SIN: lambda x: f"sin({x})", UnaryOps.SQRT: lambda x: f"sqrt({x})", BinaryOps.ADD: lambda a, b: f"({a}+{b})",
  BinaryOps.SUB: lambda a, b: f"({a}-{b})", BinaryOps.MUL: lambda a, b: f"({a}*{b})", BinaryOps.DIV: lambda a, b: f"({a}/{b})",
  BinaryOps.MAX: _max, BinaryOps.CMPLT: lambda a, b: f"({a}<{b})",
  BinaryOps.CMPEQ: lambda a, b: f"({a}=={b})", BinaryOps.AND: lambda a, b: f"({a}&{b})", BinaryOps.OR: lambda a, b: f"({a}|{b})",
  BinaryOps.XOR: lambda a, b: f"({a}^{b})", TernaryOps.WHERE: lambda c, a, b: f"({c}?{a}:{b})"}

@dataclass(frozen=True)
class CStyleDialect:
  """What differs between C-style GPU languages."""
  name: str
  kernel_prefix: str                    # before `void name(...)`
  buffer_prefix: str                    # before each pointer parameter's type
  global_id: Callable[[int], str]       # the global thread index along a launch dimension
  local_id: Callable[[int], str]        # the thread's index inside its work-group
  group_id: Callable[[int], str]        # the work-group's index
  local_prefix: str                     # before a work-group-shared array
  barrier: str
  type_names: dict[DType, str]          # register types (memory types of 16-bit floats are in memory_names)
  memory_names: dict[DType, str]
  load_half: Callable[[str, str], str]  # (pointer, index) -> float expression
  store_half: Callable[[str, str, str], str]  # (pointer, index, float value) -> statement
  float_bits: Callable[[str], str]      # unsigned 32-bit integer expression -> float with those bits
  bits_of_float: Callable[[str], str]   # float expression -> its bits as an unsigned 32-bit integer
  vector_load: Callable[[str, str, str], str]  # (vector type, pointer, index) -> the vector at pointer + index (16-byte aligned)
  vector_store: Callable[[str, str, str, str], str]  # (vector type, pointer, index, vector) -> statement
  make_vector: Callable[[str, list[str]], str]  # (vector type, lane values) -> vector expression
  unsigned: Callable[[str], str]        # a signed integer type -> its unsigned twin
  double_bits: Callable[[str], str]     # unsigned 64-bit integer expression -> double with those bits
  bits_of_double: Callable[[str], str]  # double expression -> its bits as an unsigned 64-bit integer
  half_bits: Callable[[str, str], str]  # (float expression, name) -> statement declaring `name`, its float16 bits as unsigned short
  half_of_bits: Callable[[str], str]    # an unsigned short variable -> the float its float16 bits stand for
  shared_address: Callable[[str], str] | None = None  # local memory -> its 32-bit address in the shared window (ldmatrix, cp.async)
  load_fragment: Callable[[str, Fragment, str], str] | None = None  # (uint vector name, Fragment, shared address of this thread's row) -> statement
  mma: Callable[[DType, list[str], list[str]], str] | None = None  # (operand dtype, 4 A and 2 B registers, 4 accumulators) -> statement
  copy_async: Callable[[str, str, int, str], str] | None = None  # (shared address, global address, bytes, bytes to read of them) -> statement
  async_commit: Callable[[str], str] | None = None  # (barrier address) -> statement: the copies since the last arrive there on landing
  async_wait: Callable[[], str] | None = None  # every copy this thread issued has landed
  barrier_init: Callable[[str, int], str] | None = None  # (address of the first, count) -> statement: split barriers of all threads
  barrier_arrive: Callable[[str], str] | None = None  # (barrier address) -> statement
  launch_bounds: Callable[[int], str] | None = None  # (threads of a work-group) -> what tells the compiler, before the kernel's name
  wgmma: Callable[[Warpgroup, list[str], str, list[str]], str] | None = None  # (arg, A's shared address or registers, B's, accumulators)
  warpgroup_sync: Callable[[str], str] | None = None  # (WARPGROUP_SYNC's arg) -> statement
  barrier_wait: Callable[[str, str], str] | None = None  # (barrier address, phase parity) -> statement
  shuffle: Callable[[str, int, int], str] | None = None  # (value, offset, lanes) -> expression: SHUFFLE
  transpose: Callable[[str, str], str] | None = None  # (result name, register) -> statement: TRANSPOSE
  pack_pair: Callable[[DType, str, str], str] | None = None  # (16-bit dtype, low float, high float) -> the 32-bit word of both, rounded
  local_pointer_prefix: str = ""  # before a pointer type into work-group-shared memory
  static_local_bytes: int | None = None  # local memory a kernel may declare as arrays; more is dynamic, its size in a comment (CUDA)
  prelude: str = ""
  infinity: str = "INFINITY"
  nan: str = "NAN"

_COMMON_TYPES = {dtypes.bool: "bool", dtypes.int8: "char", dtypes.uint8: "unsigned char", dtypes.int16: "short", dtypes.uint16: "unsigned short",
                 dtypes.int32: "int", dtypes.uint32: "unsigned int", dtypes.float32: "float", dtypes.float64: "double",
                 dtypes.float16: "float", dtypes.bfloat16: "float"}
_XYZ = "xyz"
# the uops that take a local memory's address
ADDRESSED = (UOps.LOAD_FRAGMENT, UOps.COPY_ASYNC, UOps.ASYNC_COMMIT, UOps.BARRIER_INIT, UOps.BARRIER_ARRIVE, UOps.BARRIER_WAIT, UOps.WGMMA)
_VECTOR_BASE_NAMES = {dtypes.float32: "float", dtypes.int32: "int", dtypes.uint32: "uint"}

def _cuda_load_fragment(name: str, fragment: Fragment, address: str) -> str:
  registers = ", ".join(f"%{i}" for i in range(fragment.matrices))
  outputs = ", ".join(f'"=r"({name}.{"xyzw"[i]})' for i in range(fragment.matrices))
  shape = f"m8n8.x{fragment.matrices}{'.trans' if fragment.transposed else ''}"
  return f'asm volatile("ldmatrix.sync.aligned.{shape}.shared.b16 {{{registers}}}, [%{fragment.matrices}];" : {outputs} : "r"({address}) : "memory");'

def _cuda_mma(dtype: DType, registers: list[str], accs: list[str]) -> str:
  kind, k = {dtypes.float16: ("f16", 16), dtypes.bfloat16: ("bf16", 16), dtypes.float32: ("tf32", 8)}[dtype]
  outputs, inputs = ", ".join(f'"+f"({acc})' for acc in accs), ", ".join(f'"r"({register})' for register in registers)
  instruction = f"mma.sync.aligned.m16n8k{k}.row.col.f32.{kind}.{kind}.f32 {{%0,%1,%2,%3}}, {{%4,%5,%6,%7}}, {{%8,%9}}, {{%0,%1,%2,%3}};"
  return f'asm("{instruction}" : {outputs} : {inputs});'

def _cuda_wgmma(arg: Warpgroup, a: list[str], b_address: str, accs: list[str]) -> str:
  """`a`: A's shared address, or its 4 registers (arg.a_in_registers). TF32 takes no transpose flags: wgmma reads it only along K."""
  kind, k = {dtypes.float16: ("f16", 16), dtypes.bfloat16: ("bf16", 16), dtypes.float32: ("tf32", 8)}[arg.dtype]
  descriptor = lambda address, bits: f"(((unsigned long long)(({address})>>4)&0x3FFF)|0x{bits:x}ull)"  # noqa: E731
  n, a_count = len(accs), len(a) if arg.a_in_registers else 1
  a_operand = "{" + ",".join(f"%{n + i}" for i in range(a_count)) + "}" if arg.a_in_registers else f"%{n}"
  flags = "" if arg.dtype == dtypes.float32 else f", {int(arg.a_transposed)}, {int(arg.b_transposed)}"
  instruction = (f"{{ .reg .pred p; setp.ne.b32 p, 1, 0; wgmma.mma_async.sync.aligned.m64n{arg.n}k{k}.f32.{kind}.{kind} "
                 f"{{{','.join(f'%{i}' for i in range(n))}}}, {a_operand}, %{n + a_count}, p, 1, 1{flags}; }}")
  outputs = ", ".join(f'"+f"({acc})' for acc in accs)
  a_inputs = [f'"r"({register})' for register in a] if arg.a_in_registers else [f'"l"({descriptor(a[0], arg.a_bits)})']
  inputs = ", ".join(a_inputs + [f'"l"({descriptor(b_address, arg.b_bits)})'])
  return f'asm volatile("{instruction}" : {outputs} : {inputs} : "memory");'

_WARPGROUP_SYNCS = {"fence": "wgmma.fence.sync.aligned;", "commit": "wgmma.commit_group.sync.aligned;", "wait 0": "wgmma.wait_group.sync.aligned 0;",
                    "wait 1": "wgmma.wait_group.sync.aligned 1;", "proxy": "fence.proxy.async.shared::cta;"}

def _cuda_copy_async(target: str, source: str, copied: int, size: str) -> str:
  instruction = f"cp.async.{'cg' if copied == 16 else 'ca'}.shared.global [%0], [%1], {copied}, %2;"  # .cg (past L1) takes only 16
  return f'asm volatile("{instruction}" : : "r"({target}), "l"({source}), "r"({size}) : "memory");'

CUDA_DIALECT = CStyleDialect(
  "CUDA", 'extern "C" __global__ ', "", lambda d: f"(blockIdx.{_XYZ[d]}*blockDim.{_XYZ[d]}+threadIdx.{_XYZ[d]})",
  lambda d: f"threadIdx.{_XYZ[d]}", lambda d: f"blockIdx.{_XYZ[d]}", "__shared__ ", "__syncthreads();",
  {**_COMMON_TYPES, dtypes.int64: "long long", dtypes.uint64: "unsigned long long"},
  {dtypes.float16: "unsigned short", dtypes.bfloat16: "unsigned short"},
  # half <-> float with the conversion instructions directly: no header needed, so NVRTC works without a CUDA toolkit
  lambda ptr, idx: f"__half_bits_to_float({ptr}[{idx}])", lambda ptr, idx, value: f"{ptr}[{idx}] = __float_to_half_bits({value});",
  lambda bits: f"__uint_as_float({bits})", lambda value: f"__float_as_uint({value})",
  lambda vtype, ptr, idx: f"*((const {vtype}*)({ptr}+{idx}))", lambda vtype, ptr, idx, value: f"*(({vtype}*)({ptr}+{idx})) = {value};",
  lambda vtype, lanes: f"make_{vtype}({','.join(lanes)})", lambda name: f"unsigned {name}",
  lambda bits: f"__longlong_as_double((long long){bits})", lambda value: f"__double_as_longlong({value})",
  lambda value, name: f"unsigned short {name} = __float_to_half_bits({value});", lambda name: f"__half_bits_to_float({name})",
  prelude=CUDA_PRELUDE,
  shared_address=lambda name: f"__shared_address({name})",
  load_fragment=_cuda_load_fragment, mma=_cuda_mma, copy_async=_cuda_copy_async,
  async_commit=lambda barrier: f'asm volatile("cp.async.mbarrier.arrive.noinc.shared.b64 [%0];" : : "r"({barrier}) : "memory");',
  async_wait=lambda: 'asm volatile("cp.async.wait_all;" : : : "memory");',
  barrier_init=lambda first, count: (f"if (threadIdx.x + threadIdx.y + threadIdx.z == 0) for (int i = 0; i < {count}; i++) "
                                     f'asm volatile("mbarrier.init.shared.b64 [%0], %1;" : : "r"({first}+8*i), '
                                     '"r"(blockDim.x*blockDim.y*blockDim.z) : "memory");'),
  barrier_arrive=lambda barrier: (f'asm volatile("{{ .reg .b64 state; mbarrier.arrive.shared.b64 state, [%0]; }}" : : "r"({barrier}) '
                                  ': "memory");'),
  barrier_wait=lambda barrier, parity: f"__barrier_wait({barrier}, {parity});", static_local_bytes=48 * 1024,
  launch_bounds=lambda threads: f"__launch_bounds__({threads}) ", wgmma=_cuda_wgmma,
  warpgroup_sync=lambda arg: f'asm volatile("{_WARPGROUP_SYNCS[arg]}" : : : "memory");',
  shuffle=lambda value, offset, lanes: f"__shfl_xor_sync(__lane_run({lanes}), {value}, {offset}, {lanes})",
  transpose=lambda name, value: f'asm("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;" : "=r"({name}) : "r"({value}));',
  pack_pair=lambda dtype, low, high: f"__pack_{'bf16' if dtype == dtypes.bfloat16 else 'f16'}x2({low}, {high})",
  infinity="__int_as_float(0x7f800000)", nan="__int_as_float(0x7fc00000)")

OPENCL_DIALECT = CStyleDialect(
  "OpenCL", "__kernel ", "__global ", lambda d: f"(int)get_global_id({d})",
  lambda d: f"(int)get_local_id({d})", lambda d: f"(int)get_group_id({d})", "__local ", "barrier(CLK_LOCAL_MEM_FENCE);",
  {**_COMMON_TYPES, dtypes.int64: "long", dtypes.uint64: "unsigned long", dtypes.uint8: "uchar"},
  {dtypes.float16: "half", dtypes.bfloat16: "ushort", dtypes.bool: "uchar"},  # OpenCL has no bool buffers; half pointers need no extension
  lambda ptr, idx: f"vload_half({idx}, {ptr})", lambda ptr, idx, value: f"vstore_half({value}, {idx}, {ptr});",
  lambda bits: f"as_float({bits})", lambda value: f"as_uint({value})",
  lambda vtype, ptr, idx: f"vload{vtype[-1]}(0, {ptr}+{idx})", lambda vtype, ptr, idx, value: f"vstore{vtype[-1]}({value}, 0, {ptr}+{idx});",
  lambda vtype, lanes: f"({vtype})({','.join(lanes)})", lambda name: f"u{name}",
  lambda bits: f"as_double({bits})", lambda value: f"as_ulong({value})",
  lambda value, name: f"ushort {name}; vstore_half({value}, 0, (__private half*)&{name});",
  lambda name: f"vload_half(0, (__private const half*)&{name})",
  local_pointer_prefix="__local ", prelude="#pragma OPENCL EXTENSION cl_khr_fp64 : enable\n")

class CStyleRenderer:
  """Renders one kernel's UOps in a dialect. Use through render_cuda / render_opencl."""
  def __init__(self, dialect: CStyleDialect, function_name: str, uops: list[UOp]) -> None:
    self.dialect, self.function_name, self.uops = dialect, function_name, uops
    self.names: dict[UOp, str] = {}
    self.uses: dict[UOp, int] = {}
    for uop in uops:
      # max, and a division by a value (guarded), write their operands more than once: name them
      writes_twice = uop.arg is BinaryOps.MAX or uop.arg in (BinaryOps.IDIV, BinaryOps.MOD) and uop.src[1].op is not UOps.CONST
      repeats = 2 if uop.op is UOps.ALU and writes_twice else 1
      for src in uop.src: self.uses[src] = self.uses.get(src, 0) + repeats
    self.lines: list[str] = []
    self.depth = 1
    self.counters: defaultdict[str, itertools.count] = defaultdict(itertools.count)

  def fresh(self, prefix: str) -> str: return f"{prefix}{next(self.counters[prefix])}"
  def emit(self, line: str) -> None: self.lines.append("  " * self.depth + line)
  def type_name(self, dtype: DType) -> str:
    if dtype.count > 1 and dtype.scalar() in PACKED_16_BIT:  # two to a 32-bit word
      return self.dialect.type_names[dtypes.uint32] if dtype.count == 2 else f"uint{dtype.count // 2}"
    if dtype.count > 1: return f"{_VECTOR_BASE_NAMES[dtype.scalar()]}{dtype.count}"  # float4, int4, uint4 in both dialects
    return self.dialect.type_names[dtype]
  def memory_type(self, dtype: DType) -> str: return self.dialect.memory_names.get(dtype, self.dialect.type_names[dtype])

  def const(self, value: Any, dtype: DType) -> str:
    if dtypes.is_float(dtype):
      if math.isnan(value): text = self.dialect.nan
      elif math.isinf(value): text = self.dialect.infinity if value > 0 else f"(-{self.dialect.infinity})"
      else: text = repr(float(value)) + ("f" if dtype != dtypes.float64 else "")
      text = f"({text})" if text.startswith("-") else text  # `x - -2.0f` would read as `x--2.0f`
      return text if dtype != dtypes.float64 else f"(double)({text})"
    if dtype == dtypes.bool: return "1" if value else "0"
    suffix = {dtypes.int64: "ll", dtypes.uint64: "ull", dtypes.uint32: "u"}.get(dtype, "")
    if dtype in (dtypes.int32, dtypes.int64) and value == dtypes.min(dtype): return f"({value + 1}{suffix}-1)"  # the literal would overflow
    plain = dtype in (dtypes.int32, dtypes.int64, dtypes.uint64, dtypes.uint32)
    number = f"({value}{suffix})" if value < 0 else f"{value}{suffix}"
    return number if plain else f"({self.type_name(dtype)}){number}"

  def define(self, uop: UOp, expression: str, prefix: str) -> None:
    """Name `expression` as a variable unless it is used exactly once (then it is written where it is used)."""
    assert uop.dtype is not None
    if self.uses.get(uop, 0) == 1 and uop.op is UOps.ALU: self.names[uop] = expression
    else:
      self.names[uop] = self.fresh(prefix)
      self.emit(f"{self.type_name(uop.dtype)} {self.names[uop]} = {expression};")

  def load(self, uop: UOp) -> str:
    assert uop.dtype is not None
    buffer, index, zero = self.names[uop.src[0]], self.names[uop.src[1]], self.const(0, uop.dtype.scalar())
    if uop.dtype.count > 1 and uop.dtype.scalar() in PACKED_16_BIT:
      loaded, zero = f"*((const {self.pointer_type(uop.src[0], uop.dtype)})({buffer}+{index}))", self.packed_words(["0u"] * (uop.dtype.count // 2))
    elif uop.dtype.count > 1:
      vector_type = self.type_name(uop.dtype)
      loaded, zero = self.dialect.vector_load(vector_type, buffer, index), self.dialect.make_vector(vector_type, [zero] * uop.dtype.count)
    elif uop.dtype == dtypes.float16: loaded = self.dialect.load_half(buffer, index)
    elif uop.dtype == dtypes.bfloat16: loaded = self.dialect.float_bits(f"(((unsigned int){buffer}[{index}])<<16)")
    elif uop.dtype == dtypes.bool: loaded = f"({buffer}[{index}]!=0)"
    else: loaded = f"{buffer}[{index}]"
    return f"({self.names[uop.src[2]]}?{loaded}:{zero})" if len(uop.src) == 3 else loaded

  def store(self, memory: UOp, index: str, value: str, dtype: DType) -> str:
    buffer = self.names[memory]
    if dtype.count > 1 and dtype.scalar() in PACKED_16_BIT: return f"*(({self.pointer_type(memory, dtype)})({buffer}+{index})) = {value};"
    if dtype.count > 1: return self.dialect.vector_store(self.type_name(dtype), buffer, index, value)
    if dtype == dtypes.float16: return self.dialect.store_half(buffer, index, value)
    if dtype == dtypes.bfloat16: return f"{buffer}[{index}] = (unsigned short){self.bfloat16_bits(value)};"
    return f"{buffer}[{index}] = {value};"

  def bfloat16_bits(self, value: str) -> str:
    """The bfloat16 nearest to a float (ties to even, as torch rounds), as the unsigned 16 bits of an unsigned int expression."""
    bits = self.fresh("bits")
    self.emit(f"unsigned int {bits} = {self.dialect.bits_of_float(value)};")
    return f"(({bits} + 0x7FFFu + (({bits}>>16)&1u))>>16)"

  def pointer_type(self, memory: UOp, dtype: DType) -> str:
    """A pointer to `dtype`'s vector type in the memory of `memory` (global or local): packed 16-bit vectors are read and written
    through it."""
    space = self.dialect.buffer_prefix if memory.op is UOps.DEFINE_GLOBAL else self.dialect.local_pointer_prefix
    return f"{space}{self.type_name(dtype)}*"

  def packed_words(self, words: list[str]) -> str:
    """A packed 16-bit vector of these 32-bit words."""
    return words[0] if len(words) == 1 else self.dialect.make_vector(f"uint{len(words)}", words)

  def packed(self, lanes: list[UOp]) -> str:
    """16-bit floats (held as floats) as a packed vector: each rounded to its 16 bits, two to a word, the first in the low half."""
    if (pair := self.dialect.pack_pair) is not None:
      return self.packed_words([pair(cast(DType, low.dtype), self.names[low], self.names[high]) for low, high in zip(lanes[::2], lanes[1::2])])
    def bits(lane: UOp) -> str:
      if lane.dtype == dtypes.bfloat16: return self.bfloat16_bits(self.names[lane])
      return f"(unsigned int){self.to_bits(self.names[lane], dtypes.float16)}"
    words = [bits(lane) for lane in lanes]
    return self.packed_words([f"({low}|({high}<<16))" for low, high in zip(words[::2], words[1::2])])

  def unpacked(self, vector: UOp, lane: int) -> str:
    """Lane `lane` of a packed 16-bit vector, as a float."""
    word = self.names[vector] if cast(DType, vector.dtype).count == 2 else f"{self.names[vector]}.{'xyzw'[lane // 2]}"
    return self.from_bits(f"({word}>>16)" if lane % 2 else f"({word}&0xFFFFu)", cast(DType, vector.dtype).scalar())

  def alu(self, uop: UOp) -> str:
    op, operands = uop.arg, [self.names[src] for src in uop.src]
    operand_dtype = uop.src[-1].dtype
    assert operand_dtype is not None
    if op is UnaryOps.RECIP: return f"({self.const(1, operand_dtype)}/{operands[0]})"
    if op is BinaryOps.MOD and dtypes.is_float(operand_dtype): return f"fmod({operands[0]},{operands[1]})"
    if op in (BinaryOps.IDIV, BinaryOps.MOD): return self.int_divmod(op, uop.src[1], operands[0], operands[1], operand_dtype)
    if operand_dtype == dtypes.bool and op is UnaryOps.NEG: return f"(!{operands[0]})"
    if op is UnaryOps.NEG and _is_signed(operand_dtype): return self.negate_signed(operands[0], operand_dtype)
    return ALU_CODE[op](*operands)

  def negate_signed(self, value: str, dtype: DType) -> str:
    """-value through unsigned arithmetic: wraps like torch, and gives the compiler no signed overflow to reason with (NVRTC turned
    `acc > -x` into `acc + x > 0`, which is wrong from acc = INT_MIN)."""
    unsigned = self.dialect.unsigned(self.type_name(dtype))
    return f"(({self.type_name(dtype)})(({unsigned})0-({unsigned}){value}))"

  def int_divmod(self, op: Op, divisor: UOp, a: str, b: str, dtype: DType) -> str:
    """Truncating a / b or a % b with x / 0 == x % 0 == 0 (uops.py says why): C leaves a division by 0 undefined (OpenCL on PoCL gave
    -1 for x % 0), and a signed one by -1 too (INT_MIN / -1 traps), so the division runs only where the divisor is neither."""
    plain, signed = f"({a}{'/' if op is BinaryOps.IDIV else '%'}{b})", _is_signed(dtype)
    if divisor.op is UOps.CONST and divisor.arg != 0 and not (signed and divisor.arg == -1): return plain
    zero, minus_one = self.const(0, dtype), self.const(-1, dtype)
    if op is BinaryOps.MOD: return f"(({b}=={zero}{f'||{b}=={minus_one}' if signed else ''})?{zero}:{plain})"
    return f"({b}=={zero}?{zero}:{f'{b}=={minus_one}?{self.negate_signed(a, dtype)}:' if signed else ''}{plain})"

  def cast(self, value: str, dtype: DType) -> str:
    return f"({value}!=0)" if dtype == dtypes.bool else f"({self.type_name(dtype)})({value})"

  def render(self) -> str:
    dialect = self.dialect
    params: list[str] = []
    # ptxas (CUDA 13, sm_90; NVIDIA's OpenCL compiles through it too) miscompiles an unrolled chain of integer negate + max:
    # `(-x).max(1)` over 50 ints gave wrong values from correct PTX, through NVRTC and the driver's JIT alike, and right ones rolled
    rolled = any(u.op is UOps.STORE and u.src[0].op is UOps.DEFINE_ACC and u.src[1].op is UOps.ALU and u.src[1].arg is BinaryOps.MAX
                 and u.src[1].dtype is not None and not dtypes.is_float(u.src[1].dtype) for u in self.uops)
    locals_ = [uop for uop in self.uops if uop.op is UOps.DEFINE_LOCAL]
    sizes = [-(-uop.arg.size * uop.dtype.itemsize // 16) * 16 for uop in locals_]  # type: ignore[union-attr]
    dynamic_offsets = dict(zip(locals_, itertools.accumulate([0] + sizes)))
    if dynamic_bytes := sum(sizes) if dialect.static_local_bytes is not None and sum(sizes) > dialect.static_local_bytes else 0:
      declaration = f"extern {dialect.local_prefix}unsigned char dynamic_local[] __attribute__((aligned(1024)));"
      self.emit(f"{declaration}  /* dynamic local memory: {dynamic_bytes} bytes */")
    # locals read or written by address (a WGMMA's tiles)
    addressed = {src for uop in self.uops if uop.op in ADDRESSED for src in (uop.arg.tiles(uop) if uop.op is UOps.WGMMA else uop.src[:1])}
    alignment = 1024 if any(uop.op is UOps.WGMMA for uop in self.uops) else 16  # swizzled tiles: see tiles.swizzled
    for uop in self.uops:
      dtype = uop.dtype if uop.dtype is not None else dtypes.bool  # (ops without a dtype do not read it)
      if uop.op in (UOps.DEFINE_GLOBAL, UOps.SPECIAL, UOps.DEFINE_LOCAL, UOps.LOOP): self.names[uop] = uop.arg.name
      if uop.op is UOps.DEFINE_GLOBAL:
        assert uop.arg.number == len(params), f"buffer {uop.arg.number} as parameter {len(params)}"
        params.append(f"{dialect.buffer_prefix}{'' if uop.arg.is_output else 'const '}{self.memory_type(dtype)}* {uop.arg.name}")
      elif uop.op is UOps.DEFINE_VAR:  # after the buffers
        self.names[uop] = uop.arg.expr
        params.append(f"int {uop.arg.expr}")
      elif uop.op is UOps.CONST: self.names[uop] = self.const(uop.arg, dtype)
      elif uop.op is UOps.SPECIAL:
        thread_id = {ThreadKind.GLOBAL: dialect.global_id, ThreadKind.GROUP: dialect.group_id, ThreadKind.LOCAL: dialect.local_id}[uop.arg.kind]
        last = uop.arg.size - 1 if isinstance(uop.arg.size, int) else f"{uop.arg.size.render()}-1"
        self.emit(f"int {uop.arg.name} = {thread_id(uop.arg.dim)};  /* 0..{last} */")
      elif uop.op is UOps.DEFINE_LOCAL:
        if dynamic_bytes:  # a part of the dynamic memory, 16-byte aligned
          self.emit(f"{self.memory_type(dtype)}* {uop.arg.name} = ({self.memory_type(dtype)}*)(dynamic_local+{dynamic_offsets[uop]});")
        else:  # 16-byte aligned for vector reads and writes: an array of float is only 4-byte aligned, and CUDA faults on a misaligned float4
          self.emit(f"{dialect.local_prefix}{self.memory_type(dtype)} {uop.arg.name}[{uop.arg.size}] __attribute__((aligned({alignment})));")
        if uop in addressed: self.emit(f"unsigned int {uop.arg.name}_address = {self.require(dialect.shared_address, uop)(uop.arg.name)};")
      elif uop.op is UOps.BARRIER: self.emit(dialect.barrier)
      elif uop.op is UOps.LOOP:
        name = uop.arg.name
        if rolled: self.emit("#pragma unroll 1")
        self.emit(f"for (int {name} = {self.names[uop.src[0]]}; {name} < {self.names[uop.src[1]]}; {name}++) {{")
        self.depth += 1
      elif uop.op is UOps.IF:
        self.emit(f"if ({self.names[uop.src[0]]}) {{")
        self.depth += 1
      elif uop.op is UOps.END:
        self.depth -= 1
        self.emit("}")
      elif uop.op is UOps.DEFINE_ACC: self.define(uop, self.const(uop.arg, dtype), "acc")
      elif uop.op is UOps.LOAD:
        if uop.src[0].op is UOps.DEFINE_ACC: self.names[uop] = self.names[uop.src[0]]
        else: self.define(uop, self.load(uop), "val")
      elif uop.op is UOps.STORE:
        if uop.src[0].op is UOps.DEFINE_ACC: self.emit(f"{self.names[uop.src[0]]} = {self.names[uop.src[1]]};")
        else:
          assert uop.src[2].dtype is not None
          store = self.store(uop.src[0], self.names[uop.src[1]], self.names[uop.src[2]], uop.src[2].dtype)
          self.emit(f"if ({self.names[uop.src[3]]}) {store}" if len(uop.src) == 4 else store)
      elif uop.op is UOps.ALU: self.define(uop, self.alu(uop), "alu")
      elif uop.op is UOps.CAST: self.define(uop, self.cast(self.names[uop.src[0]], dtype), "cast")
      elif uop.op is UOps.BITCAST: self.define(uop, self.bitcast(uop), "cast")
      elif uop.op is UOps.GEP and dtype in PACKED_16_BIT: self.names[uop] = self.unpacked(uop.src[0], uop.arg)
      elif uop.op is UOps.GEP: self.names[uop] = f"{self.names[uop.src[0]]}.{'xyzw'[uop.arg]}"
      elif uop.op is UOps.LOAD_FRAGMENT:
        self.names[uop] = self.fresh("frag")
        self.emit(f"{self.type_name(dtype)} {self.names[uop]};")
        self.emit(self.require(dialect.load_fragment, uop)(self.names[uop], uop.arg, self.shared_address(uop.src[0], self.names[uop.src[1]])))
      elif uop.op is UOps.WMMA:
        registers, accs = [self.names[src] for src in uop.src[:6]], [self.names[src] for src in uop.src[6:]]
        self.emit(self.require(dialect.mma, uop)(uop.arg, registers, accs))
      elif uop.op is UOps.WGMMA:
        a, (b_tile, b_index), accs = uop.arg.sources(uop)
        a_operand = [self.names[src] for src in a] if uop.arg.a_in_registers else [self.shared_address(a[0], self.names[a[1]])]
        self.emit(self.require(dialect.wgmma, uop)(uop.arg, a_operand, self.shared_address(b_tile, self.names[b_index]),
                                                   [self.names[src] for src in accs]))
      elif uop.op is UOps.WARPGROUP_SYNC: self.emit(self.require(dialect.warpgroup_sync, uop)(uop.arg))
      elif uop.op is UOps.SHUFFLE: self.define(uop, self.require(dialect.shuffle, uop)(self.names[uop.src[0]], *uop.arg), "alu")
      elif uop.op is UOps.TRANSPOSE:
        self.names[uop] = self.fresh("moved")
        self.emit(f"{self.type_name(dtype)} {self.names[uop]};")
        self.emit(self.require(dialect.transpose, uop)(self.names[uop], self.names[uop.src[0]]))
      elif uop.op is UOps.COPY_ASYNC:
        target, source = self.shared_address(uop.src[0], self.names[uop.src[1]]), f"{self.names[uop.src[2]]}+{self.names[uop.src[3]]}"
        if len(uop.src) == 5: source = f"{self.names[uop.src[2]]}+({self.names[uop.src[4]]}?{self.names[uop.src[3]]}:0)"
        size = f"({self.names[uop.src[4]]}?{uop.arg}:0)" if len(uop.src) == 5 else str(uop.arg)
        self.emit(self.require(dialect.copy_async, uop)(target, source, uop.arg, size))
      elif uop.op is UOps.ASYNC_COMMIT: self.emit(self.require(dialect.async_commit, uop)(self.barrier_address(uop)))
      elif uop.op is UOps.ASYNC_WAIT: self.emit(self.require(dialect.async_wait, uop)())
      elif uop.op is UOps.BARRIER_INIT: self.emit(self.require(dialect.barrier_init, uop)(self.shared_address(uop.src[0], "0"), uop.src[0].arg.size))
      elif uop.op is UOps.BARRIER_ARRIVE: self.emit(self.require(dialect.barrier_arrive, uop)(self.barrier_address(uop)))
      elif uop.op is UOps.BARRIER_WAIT: self.emit(self.require(dialect.barrier_wait, uop)(self.barrier_address(uop), self.names[uop.src[2]]))
      elif uop.op is UOps.VECTORIZE and dtype.scalar() in PACKED_16_BIT: self.define(uop, self.packed(list(uop.src)), "vec")
      elif uop.op is UOps.VECTORIZE: self.define(uop, dialect.make_vector(self.type_name(dtype), [self.names[src] for src in uop.src]), "vec")
      else: raise NotImplementedError(f"the {dialect.name} renderer has no rule for {uop.op}")
    body = "\n".join(self.lines)
    # a fixed work-group of over 256 threads is named to ptxas, which then keeps to the registers that many may have (the launch
    # failed); up to 256, any count it uses fits, and naming the size changed its choices (fp32 NT 3000³ on the H200: 37 -> 30 TFLOP/s)
    group = [uop.arg.size for uop in self.uops if uop.op is UOps.SPECIAL and uop.arg.kind is ThreadKind.LOCAL]
    bounds = dialect.launch_bounds(prod(group)) if dialect.launch_bounds is not None and all_int(group) and prod(group) > 256 else ""
    return f"{dialect.prelude}{dialect.kernel_prefix}void {bounds}{self.function_name}({', '.join(params)}) {{\n{body}\n}}\n"

  def barrier_address(self, uop: UOp) -> str: return self.shared_address(uop.src[0], self.names[uop.src[1]])

  def shared_address(self, memory: UOp, index: str) -> str:
    """The 32-bit shared-window address of element `index` of local memory, from its base address (worked out where it is defined)."""
    return f"{self.names[memory]}_address+({index})*{cast(DType, memory.dtype).itemsize}"

  def require(self, rule: Callable[..., str] | None, uop: UOp) -> Callable[..., str]:
    if rule is None: raise NotImplementedError(f"the {self.dialect.name} renderer has no rule for {uop.op}")
    return rule

  def bitcast(self, uop: UOp) -> str:
    """Reinterpret the bits through an unsigned integer of their width (16-bit floats, float in registers, through their 16-bit form)."""
    source, target, value = uop.src[0].dtype, uop.dtype, self.names[uop.src[0]]
    assert source is not None and target is not None and source.itemsize == target.itemsize, f"bitcast {source} -> {target}"
    unsigned = self.dialect.unsigned(self.type_name({1: dtypes.int8, 2: dtypes.int16, 4: dtypes.int32, 8: dtypes.int64}[source.itemsize]))
    bits = self.fresh("bits")
    self.emit(f"{unsigned} {bits} = {self.to_bits(value, source)};")
    return self.from_bits(f"({unsigned})({bits})", target)

  def to_bits(self, value: str, dtype: DType) -> str:
    if dtype == dtypes.float32: return self.dialect.bits_of_float(value)
    if dtype == dtypes.float64: return self.dialect.bits_of_double(value)
    if dtype == dtypes.bfloat16: return f"(unsigned short)({self.dialect.bits_of_float(value)}>>16)"
    if dtype == dtypes.float16:
      half_bits = self.fresh("half_bits")
      self.emit(self.dialect.half_bits(value, half_bits))
      return half_bits
    return value

  def from_bits(self, bits: str, dtype: DType) -> str:
    if dtype == dtypes.float32: return self.dialect.float_bits(bits)
    if dtype == dtypes.float64: return self.dialect.double_bits(bits)
    if dtype == dtypes.bfloat16: return self.dialect.float_bits(f"(((unsigned int){bits})<<16)")
    if dtype == dtypes.float16:
      half_bits = self.fresh("half_bits")
      self.emit(f"{self.dialect.unsigned(self.type_name(dtypes.int16))} {half_bits} = {bits};")
      return self.dialect.half_of_bits(half_bits)
    return f"({self.type_name(dtype)})({bits})"

def render_cuda(function_name: str, uops: list[UOp]) -> str: return CStyleRenderer(CUDA_DIALECT, function_name, uops).render()
def render_opencl(function_name: str, uops: list[UOp]) -> str: return CStyleRenderer(OPENCL_DIALECT, function_name, uops).render()
