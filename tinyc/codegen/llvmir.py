"""Layer 3: renders UOps to LLVM IR text with llvmlite's IR builder (pure Python; compiling is runtime/ops_llvm.py's job).
Imports helpers, dtype, ops, codegen/uops, codegen/cpu_split; llvmlite.ir only (the IR builder, no native code).

Loops are do-while blocks with a phi for the counter (every loop runs at least once); an accumulator is an alloca that
LLVM's mem2reg turns into phis. bfloat16 lives in memory as i16 and in registers as float. In a kernel large enough to split
across CPU threads, the outermost global loop (Loop.outermost_global) runs over [start, end) given as two trailing i64 arguments.
"""
from __future__ import annotations
import contextlib
import math
import threading
from typing import Any, Callable, NamedTuple
import llvmlite.ir as ir
from tinyc.dtype import DType, dtypes
from tinyc.ops import BinaryOps, Op, TernaryOps, UnaryOps
from tinyc.codegen.uops import UOp, UOps
from tinyc.codegen.cpu_split import outer_split, outermost_global_loop

# reassociation lets LLVM vectorize reductions; no nnan/ninf (inf and NaN keep their meaning), no nsz (x + 0.0 is not x where x is
# -0.0; matmul, sum and softmax ran as fast without it), and no arcp/afn: those let LLVM turn 1/sqrt(x) into an approximation that
# gives nan at 0
FAST_MATH = ("reassoc", "contract")

def register_type(dtype: DType) -> ir.Type:
  """The LLVM type a value of `dtype` has in registers."""
  if dtype.count > 1: return ir.VectorType(register_type(dtype.scalar()), dtype.count)
  if dtype == dtypes.bool: return ir.IntType(1)
  if dtype in (dtypes.float32, dtypes.bfloat16): return ir.FloatType()
  if dtype == dtypes.float16: return ir.HalfType()
  if dtype == dtypes.float64: return ir.DoubleType()
  return ir.IntType(8 * dtype.itemsize)

def memory_type(dtype: DType) -> ir.Type:
  """The LLVM type a value of `dtype` has in a buffer."""
  return ir.IntType(8) if dtype == dtypes.bool else ir.IntType(16) if dtype == dtypes.bfloat16 else register_type(dtype)

def _intrinsic(builder: ir.IRBuilder, name: str, dtype: DType, *args: ir.Value, flags: tuple[str, ...] = FAST_MATH) -> ir.Value:
  ty = args[0].type  # a float, or a vector of them
  full_name = f"llvm.{name}.{f'v{ty.count}' if isinstance(ty, ir.VectorType) else ''}f{_float_bits(dtype)}"
  fn = builder.module.globals.get(full_name) or ir.Function(builder.module, ir.FunctionType(ty, [ty] * len(args)), name=full_name)
  return builder.call(fn, list(args), fastmath=flags)

class FloatFormat(NamedTuple):
  """What exp2 and log2 need of a float type: its fields, and near-minimax polynomials (mpmath.chebyfit) for each."""
  mantissa_bits: int
  bias: int
  exp2_poly: tuple[float, ...]  # q(f), 2^f = 1 + f*q(f) on [-1/2, 1/2]: off by 7.8e-9 (float32), 1.3e-17 (float64), < 1/10 ulp
  log2_poly: tuple[float, ...] | None  # p(t), log2(1+t) = t*log2(e) + t*t*p(t) on [sqrt(1/2)-1, sqrt(2)-1]: 1.3e-8 relative
  log2e: tuple[float, float]  # log2(e) as this float type holds it, and what it leaves out

# float64 log2 stays libm's: as accurate, it would take a polynomial of degree 20 or a division in double-double
FLOAT_FORMATS = {
  32: FloatFormat(23, 127, (0.6931471880262288, 0.24022650760568126, 0.05550357114219078, 0.009618082557277852, 0.0013390863364671234,
                            0.0001545316294512069),
                  (-0.7213474865378442, 0.4808982992822264, -0.36068503113027606, 0.28855681768676966, -0.2398717919576035, 0.20493275239316275,
                   -0.1893905943710658, 0.18354936938116376, -0.11070724540024855), (1.4426950216293335, 1.9259629911266175e-08)),
  64: FloatFormat(52, 1023, (0.6931471805599453, 0.24022650695910097, 0.0555041086648216, 0.009618129107606888, 0.0013333558146416936,
                             0.0001540353044173605, 1.525273382983612e-05, 1.321544258792169e-06, 1.0178062445845774e-07, 7.072585949269223e-09,
                             4.4549605981865186e-10), None, (0.0, 0.0))}

# exp2 and log2 are computed inline rather than called (llvm.exp2 is a call to libm's exp2f per element, which LLVM vectorizes only
# with a vector math library): ALU ops and selects over the value's type, scalar or vector, that the loop and SLP vectorizers pack.
# Their ops carry no fast-math flags: reassociating (p * 2^a) * 2^b or x - rint(x) would break the range reduction.
def _exp2(builder: ir.IRBuilder, dtype: DType, x: ir.Value) -> ir.Value:
  """2^x = 2^f * 2^n with n = rint(x): exact at integers, within 1 ulp elsewhere, denormal results rounded, inf and nan kept."""
  if (fmt := FLOAT_FORMATS.get(bits := _float_bits(dtype))) is None: return _intrinsic(builder, "exp2", dtype, x)
  const, int_const, int_type = _constants(x.type, bits)
  lowest, highest = -(fmt.bias + fmt.mantissa_bits + 1), fmt.bias + 1  # 2^lowest rounds to 0, 2^highest is inf
  clamped = builder.select(builder.fcmp_unordered("<", x, const(lowest)), const(lowest), x)  # nan too: the select at the end fixes it
  clamped = builder.select(builder.fcmp_ordered(">", clamped, const(highest)), const(highest), clamped)
  n = _intrinsic(builder, "rint", dtype, clamped, flags=())
  f = builder.fsub(clamped, n)  # exact
  power_of_f = _intrinsic(builder, "fmuladd", dtype, f, _horner(builder, dtype, f, fmt.exp2_poly), const(1.0), flags=())
  # 2^n as two factors 2^(n>>1) * 2^(n - (n>>1)), each a normal float, so a result below the normal range rounds once
  whole = builder.fptosi(n, int_type)
  half = builder.ashr(whole, int_const(1))
  power_of_2 = lambda k: builder.bitcast(builder.shl(builder.add(k, int_const(fmt.bias)), int_const(fmt.mantissa_bits)), x.type)
  result = builder.fmul(builder.fmul(power_of_f, power_of_2(half)), power_of_2(builder.sub(whole, half)))
  return builder.select(builder.fcmp_unordered("uno", x, x), x, result)

def _log2(builder: ir.IRBuilder, dtype: DType, x: ir.Value) -> ir.Value:
  """log2(x) = e + log2(1+t), x = (1+t) * 2^e with 1+t in [sqrt(1/2), sqrt(2)), within 1 ulp: t*log2(e) and e + t*log2(e) are
  carried as a sum of two floats, the largest errors otherwise. Exact at powers of two; log2(0) = -inf, log2(x < 0) = nan."""
  fmt = FLOAT_FORMATS.get(bits := _float_bits(dtype))
  if fmt is None or fmt.log2_poly is None: return _intrinsic(builder, "log2", dtype, x)
  const, int_const, int_type = _constants(x.type, bits)
  fma = lambda a, b, c: _intrinsic(builder, "fma", dtype, a, b, c, flags=())
  denormal = builder.fcmp_ordered("<", x, const(2.0 ** (1 - fmt.bias)))  # scaled by 2^mantissa_bits into the normal range
  x_bits = builder.bitcast(builder.select(denormal, builder.fmul(x, const(2.0 ** fmt.mantissa_bits)), x), int_type)
  mantissa = builder.and_(x_bits, int_const((1 << fmt.mantissa_bits) - 1))
  above_sqrt2 = builder.zext(builder.icmp_signed(">", mantissa, int_const(int((math.sqrt(2) - 1) * 2 ** fmt.mantissa_bits))), int_type)
  exponent_field = builder.shl(builder.sub(int_const(fmt.bias), above_sqrt2), int_const(fmt.mantissa_bits))  # 2^0, or 2^-1 above sqrt(2)
  one_plus_t = builder.bitcast(builder.or_(mantissa, exponent_field), x.type)
  exponent = builder.add(builder.sub(builder.lshr(x_bits, int_const(fmt.mantissa_bits)), int_const(fmt.bias)), above_sqrt2)
  exponent = builder.sitofp(builder.sub(exponent, builder.select(denormal, int_const(fmt.mantissa_bits), int_const(0))), x.type)
  t = builder.fsub(one_plus_t, const(1.0))  # exact
  product = builder.fmul(t, const(fmt.log2e[0]))
  low = fma(t, const(fmt.log2e[1]), fma(t, const(fmt.log2e[0]), builder.fneg(product)))  # what product leaves out of t*log2(e)
  low = fma(builder.fmul(t, t), _horner(builder, dtype, t, fmt.log2_poly), low)
  high = builder.fadd(exponent, product)  # exponent + product = high + its error exactly, since |exponent| >= |product| or exponent = 0
  result = builder.fadd(high, builder.fadd(builder.fadd(builder.fsub(exponent, high), product), low))
  special = builder.select(builder.fcmp_ordered("==", x, const(0.0)), const(-math.inf),
                           builder.select(builder.fcmp_ordered("==", x, const(math.inf)), x, const(math.nan)))
  finite_positive = builder.and_(builder.fcmp_ordered(">", x, const(0.0)), builder.fcmp_ordered("<", x, const(math.inf)))
  return builder.select(finite_positive, result, special)

def _horner(builder: ir.IRBuilder, dtype: DType, x: ir.Value, coefficients: tuple[float, ...]) -> ir.Value:
  """c0 + c1*x + c2*x^2 + ... with one fused multiply-add a coefficient."""
  result: ir.Value = ir.Constant(x.type, coefficients[-1])
  for coefficient in reversed(coefficients[:-1]):
    result = _intrinsic(builder, "fmuladd", dtype, result, x, ir.Constant(x.type, coefficient), flags=())
  return result

def _constants(float_type: ir.Type, bits: int) -> tuple[Callable[[float], ir.Constant], Callable[[int], ir.Constant], ir.Type]:
  """Makers of float and integer constants in every lane of float_type, and the integer type of as many lanes and bits."""
  int_type = ir.VectorType(ir.IntType(bits), float_type.count) if isinstance(float_type, ir.VectorType) else ir.IntType(bits)
  return (lambda value: ir.Constant(float_type, value)), (lambda value: ir.Constant(int_type, value)), int_type

def _int_divmod(builder: ir.IRBuilder, dtype: DType, a: ir.Value, b: ir.Value, div: bool) -> ir.Value:
  """Truncating a / b or a % b with x / 0 == x % 0 == 0 (uops.py says why). The hardware divides by 1 instead of 0 (and, signed,
  of -1: INT_MIN / -1 traps), and a select puts in the defined value: LLVM may assume a divisor is never 0, so it must not be."""
  signed = not _is_unsigned(dtype)
  divide = (builder.sdiv if div else builder.srem) if signed else (builder.udiv if div else builder.urem)
  if isinstance(b, ir.Constant) and b.constant != 0 and not (signed and b.constant == -1): return divide(a, b)
  is_zero = traps = builder.icmp_unsigned("==", b, ir.Constant(b.type, 0))
  if signed: traps = builder.or_(is_zero, is_minus_one := builder.icmp_signed("==", b, ir.Constant(b.type, -1)))
  result = divide(a, builder.select(traps, ir.Constant(b.type, 1), b))
  if not div: return result  # x % 1 == 0: already right for 0 and -1
  if signed: result = builder.select(is_minus_one, builder.neg(a), result)  # x / -1 == -x, wrapping
  return builder.select(is_zero, ir.Constant(a.type, 0), result)

def _max(builder: ir.IRBuilder, dtype: DType, a: ir.Value, b: ir.Value) -> ir.Value:
  if dtypes.is_float(dtype): return _intrinsic(builder, "maximum", dtype, a, b)  # NaN-propagating, like torch.maximum
  return builder.select(_compare(builder, dtype, ">", a, b), a, b)

def _compare(builder: ir.IRBuilder, dtype: DType, predicate: str, a: ir.Value, b: ir.Value) -> ir.Value:
  if dtypes.is_float(dtype): return builder.fcmp_ordered(predicate, a, b)
  return builder.icmp_unsigned(predicate, a, b) if _is_unsigned(dtype) else builder.icmp_signed(predicate, a, b)

def _is_unsigned(dtype: DType) -> bool: return dtypes.is_unsigned(dtype) or dtype == dtypes.bool

def _float_or_int(float_fn: str, int_fn: str) -> Callable[..., ir.Value]:
  def render(builder: ir.IRBuilder, dtype: DType, a: ir.Value, b: ir.Value) -> ir.Value:
    if dtypes.is_float(dtype): return getattr(builder, float_fn)(a, b, flags=FAST_MATH)
    return getattr(builder, int_fn)(a, b)
  return render

# op -> fn(builder, dtype of the operands, *operands)
ALU_RENDERERS: dict[Op, Callable[..., ir.Value]] = {
  UnaryOps.NEG: lambda b, dt, x: b.fneg(x, flags=FAST_MATH) if dtypes.is_float(dt) else (b.xor(x, ir.Constant(x.type, 1)) if dt == dtypes.bool
                                                                                         else b.neg(x)),
  UnaryOps.EXP2: lambda b, dt, x: _exp2(b, dt, x), UnaryOps.LOG2: lambda b, dt, x: _log2(b, dt, x),
  UnaryOps.SIN: lambda b, dt, x: _intrinsic(b, "sin", dt, x), UnaryOps.SQRT: lambda b, dt, x: _intrinsic(b, "sqrt", dt, x),
  UnaryOps.RECIP: lambda b, dt, x: b.fdiv(ir.Constant(x.type, 1.0), x, flags=FAST_MATH),
  BinaryOps.ADD: _float_or_int("fadd", "add"), BinaryOps.SUB: _float_or_int("fsub", "sub"), BinaryOps.MUL: _float_or_int("fmul", "mul"),
  BinaryOps.DIV: lambda b, dt, x, y: b.fdiv(x, y, flags=FAST_MATH),
  BinaryOps.IDIV: lambda b, dt, x, y: _int_divmod(b, dt, x, y, div=True),
  BinaryOps.MOD: lambda b, dt, x, y: b.frem(x, y) if dtypes.is_float(dt) else _int_divmod(b, dt, x, y, div=False),
  BinaryOps.MAX: _max,
  BinaryOps.CMPLT: lambda b, dt, x, y: _compare(b, dt, "<", x, y), BinaryOps.CMPEQ: lambda b, dt, x, y: _compare(b, dt, "==", x, y),
  BinaryOps.AND: lambda b, dt, x, y: b.and_(x, y), BinaryOps.OR: lambda b, dt, x, y: b.or_(x, y), BinaryOps.XOR: lambda b, dt, x, y: b.xor(x, y),
  TernaryOps.WHERE: lambda b, dt, c, x, y: b.select(c, x, y),
}

def cast(builder: ir.IRBuilder, value: ir.Value, src: DType, dst: DType) -> ir.Value:
  """`value` of `src` as `dst`: scalars, or vectors of as many lanes."""
  src_ty, dst_ty = register_type(src), register_type(dst)
  src, dst = src.scalar(), dst.scalar()
  if src_ty == dst_ty: return value
  if dst == dtypes.bool: return builder.fcmp_unordered("!=", value, ir.Constant(src_ty, 0)) if dtypes.is_float(src) else \
    builder.icmp_unsigned("!=", value, ir.Constant(src_ty, 0))
  if dtypes.is_float(src) and dtypes.is_float(dst):
    if src == dtypes.float64 and dst == dtypes.float16:  # no instruction does this: LLVM would call __truncdfhf2, absent in-process
      value = builder.fptrunc(value, ir.FloatType())
    return builder.fpext(value, dst_ty) if _float_bits(src) < _float_bits(dst) else builder.fptrunc(value, dst_ty)
  if dtypes.is_float(dst): return builder.uitofp(value, dst_ty) if _is_unsigned(src) else builder.sitofp(value, dst_ty)
  if dtypes.is_float(src): return builder.fptoui(value, dst_ty) if dtypes.is_unsigned(dst) else builder.fptosi(value, dst_ty)
  if src.itemsize > dst.itemsize: return builder.trunc(value, dst_ty)
  return builder.zext(value, dst_ty) if _is_unsigned(src) else builder.sext(value, dst_ty)

def bitcast(builder: ir.IRBuilder, value: ir.Value, src: DType, dst: DType) -> ir.Value:
  """Reinterpret the bits: through the memory representation, since bfloat16 is a float in registers and an i16 in memory."""
  bits = _to_memory(builder, value, src)
  if dst == dtypes.bfloat16: return _from_memory(builder, builder.bitcast(bits, ir.IntType(16)), dst)
  return builder.bitcast(bits, register_type(dst))

def _float_bits(dtype: DType) -> int: return 32 if dtype == dtypes.bfloat16 else 8 * dtype.itemsize

def _constant(value: Any, dtype: DType) -> ir.Constant:
  """`value` as `dtype`, in every lane of a vector type."""
  if dtypes.is_float(dtype.scalar()) and math.isnan(value): return ir.Constant(register_type(dtype), float("nan"))
  return ir.Constant(register_type(dtype), int(value) if not dtypes.is_float(dtype.scalar()) else value)

def _from_memory(builder: ir.IRBuilder, raw: ir.Value, dtype: DType) -> ir.Value:
  if dtype == dtypes.bool: return builder.trunc(raw, ir.IntType(1))
  if dtype == dtypes.bfloat16: return builder.bitcast(builder.shl(builder.zext(raw, ir.IntType(32)), ir.Constant(ir.IntType(32), 16)), ir.FloatType())
  return raw

def _to_memory(builder: ir.IRBuilder, value: ir.Value, dtype: DType) -> ir.Value:
  if dtype == dtypes.bool: return builder.zext(value, ir.IntType(8))
  if dtype == dtypes.bfloat16:  # round to nearest even, as torch does
    bits = builder.bitcast(value, ir.IntType(32))
    lsb = builder.and_(builder.lshr(bits, ir.Constant(ir.IntType(32), 16)), ir.Constant(ir.IntType(32), 1))
    rounded = builder.add(bits, builder.add(lsb, ir.Constant(ir.IntType(32), 0x7FFF)))
    return builder.trunc(builder.lshr(rounded, ir.Constant(ir.IntType(32), 16)), ir.IntType(16))
  return value

# llvmlite is not thread-safe as a whole: llvmlite.ir fills tables on first use (its string-escape map), and llvmlite.binding locks
# each call into LLVM but not a sequence of them. Every use of llvmlite, here and in runtime/ops_llvm.py, holds this lock.
LLVMLITE_LOCK = threading.Lock()

class _VolatileLoad(ir.LoadInstr):  # (llvmlite writes no volatile loads)
  def descr(self, buf: list[str]) -> None:
    text: list[str] = []
    super().descr(text)
    buf.append("".join(text).replace("load ", "load volatile ", 1))

def _load(builder: ir.IRBuilder, pointer: Any, typ: Any, volatile: bool) -> Any:
  """A scalar load; volatile: LLVM neither merges it with an equal load nor moves it (packing.fresh_operands), and still folds it into
  the instruction that uses it."""
  if not volatile: return builder.load(pointer, typ=typ)
  builder._insert(load := _VolatileLoad(builder.block, pointer, typ=typ))
  return load

def render_llvm(function_name: str, uops: list[UOp]) -> str:
  """LLVM IR of `void function_name(ptr data0, ptr data1, ..., i64 start, i64 end)` for these UOps; start and end (only for a
  kernel that cpu_split.outer_split splits) bound its outermost global loop, and the caller must keep start < end (loops are do-while)."""
  with LLVMLITE_LOCK: return _render_llvm(function_name, uops)

def _render_llvm(function_name: str, uops: list[UOp]) -> str:
  module = ir.Module(name=function_name)
  buffers = [uop for uop in uops if uop.op is UOps.DEFINE_GLOBAL]
  variables = [uop for uop in uops if uop.op is UOps.DEFINE_VAR]  # i32 arguments after the buffers
  outer_loop = outermost_global_loop(uops) if outer_split(uops) else None
  range_types = [ir.IntType(64)] * 2 if outer_loop is not None else []
  argument_types = [ir.PointerType()] * len(buffers) + [ir.IntType(32)] * len(variables) + range_types
  function = ir.Function(module, ir.FunctionType(ir.VoidType(), argument_types), name=function_name)
  for arg in function.args[:len(buffers)]: arg.add_attribute("noalias")
  for arg, name in zip(function.args[len(buffers):], [variable.arg.expr for variable in variables] + ["start", "end"]): arg.name = name
  allocas = ir.IRBuilder(function.append_basic_block("entry"))  # allocas and the loop range, then a branch to the body
  builder = ir.IRBuilder(function.append_basic_block("body"))
  if outer_loop is not None:
    # clamped to the loop's constant end: knowing the counter < end LLVM proves the index math cannot overflow, which it needs to
    # vectorize loads (without it a 512x512 matmul runs 5x slower). Truncated here where the index type is i32.
    index_type, trips = register_type(_dtype_of(outer_loop)), ir.Constant(ir.IntType(64), outer_loop.src[1].arg)
    outer_bounds = []
    for arg in function.args[len(buffers) + len(variables):]:
      clamped = allocas.select(allocas.icmp_unsigned("<", arg, trips), arg, trips)
      outer_bounds.append(clamped if clamped.type == index_type else allocas.trunc(clamped, index_type))
  values: dict[UOp, Any] = {}  # UOp -> its llvmlite value
  no_vectorize_option = module.add_metadata(["llvm.loop.vectorize.enable", ir.Constant(ir.IntType(1), 0)])
  loop_ids: list[Any] = []
  loop_state: dict[UOp, tuple[ir.Block, ir.PhiInstr, ir.Value, ir.Block]] = {}  # LOOP -> (its body block, its counter, its end, after it)
  for uop in uops:
    src: list[Any] = [values.get(s) for s in uop.src]
    dtype = uop.dtype if uop.dtype is not None else dtypes.bool  # (ops without a dtype do not read it)
    if uop.op is UOps.DEFINE_GLOBAL: values[uop] = function.args[uop.arg.number]
    elif uop.op is UOps.DEFINE_VAR: values[uop] = function.args[len(buffers) + variables.index(uop)]
    elif uop.op is UOps.CONST: values[uop] = _constant(uop.arg, dtype)
    elif uop.op is UOps.DEFINE_ACC:
      values[uop] = allocas.alloca(register_type(dtype))  # in the entry block, where mem2reg promotes it
      builder.store(_constant(uop.arg, dtype), values[uop])  # reset each time the enclosing loops reach it
    elif uop.op is UOps.LOOP:
      preheader, body = builder.block, function.append_basic_block(f"loop_{uop.arg.name}")
      exit_block = function.append_basic_block(f"after_{uop.arg.name}")
      start, end = outer_bounds if uop is outer_loop else src[:2]
      if uop is not outer_loop and not (uop.src[0].op is uop.src[1].op is UOps.CONST and uop.src[0].arg < uop.src[1].arg):
        builder.cbranch(builder.icmp_signed("<", start, end), body, exit_block)  # a loop of bounds.py may have no trips
      else: builder.branch(body)  # (a loop of constant bounds has trips: the test is at its end)
      builder.position_at_end(body)
      counter = builder.phi(register_type(dtype), name=uop.arg.name)
      counter.add_incoming(start, preheader)
      values[uop], loop_state[uop] = counter, (body, counter, end, exit_block)
    elif uop.op is UOps.END:
      body, counter, end, exit_block = loop_state[uop.src[0]]
      following = builder.add(counter, ir.Constant(counter.type, 1))
      loop = uop.src[0].arg
      latch = builder.cbranch(builder.icmp_signed("<", following, end), body, exit_block)
      if not loop.vectorize:
        loop_ids.append(module.add_metadata([no_vectorize_option, module.add_metadata(["tinyc.loop", loop.name])]))  # one id a loop
        latch.set_metadata("llvm.loop", loop_ids[-1])
      counter.add_incoming(following, builder.block)
      builder.position_at_end(exit_block)
    elif uop.op is UOps.LOAD:
      if uop.src[0].op is UOps.DEFINE_ACC: values[uop] = builder.load(src[0], typ=register_type(dtype))
      elif dtype.count > 1:  # neighbouring elements from any index (the vector types here are the same in memory); gated as one
        index = builder.select(src[2], src[1], ir.Constant(src[1].type, 0)) if len(src) == 3 else src[1]
        pointer = builder.gep(src[0], [index], source_etype=memory_type(dtype.scalar()))
        loaded = builder.load(pointer, typ=register_type(dtype), align=dtype.scalar().itemsize)
        values[uop] = builder.select(src[2], loaded, ir.Constant(register_type(dtype), None)) if len(src) == 3 else loaded
      else:  # a gated load clamps the index so a masked-out lane never reads out of bounds, then zeroes the value
        index = builder.select(src[2], src[1], ir.Constant(src[1].type, 0)) if len(src) == 3 else src[1]
        pointer = builder.gep(src[0], [index], source_etype=memory_type(dtype))
        loaded = _from_memory(builder, _load(builder, pointer, memory_type(dtype), volatile=uop.arg == "volatile"), dtype)
        values[uop] = builder.select(src[2], loaded, _constant(0, dtype)) if len(src) == 3 else loaded
    elif uop.op is UOps.PREFETCH:  # llvm.prefetch(address, read, locality 3 (keep in every cache), data)
      int32 = ir.IntType(32)
      prefetch = module.globals.get("llvm.prefetch.p0") or ir.Function(module, ir.FunctionType(ir.VoidType(), [ir.PointerType()] + [int32] * 3),
                                                                       name="llvm.prefetch.p0")
      address = builder.gep(src[0], [src[1]], source_etype=memory_type(_dtype_of(uop.src[0])))
      builder.call(prefetch, [address] + [ir.Constant(int32, n) for n in (0, 3, 1)])
    elif uop.op is UOps.STORE:
      if uop.src[0].op is UOps.DEFINE_ACC: builder.store(src[1], src[0])
      else:
        value_dtype = _dtype_of(uop.src[2])
        stored = _to_memory(builder, src[2], value_dtype)
        with builder.if_then(src[3]) if len(src) == 4 else contextlib.nullcontext():  # a gated store writes only where valid
          builder.store(stored, builder.gep(src[0], [src[1]], source_etype=memory_type(value_dtype)))
    elif uop.op is UOps.ALU: values[uop] = ALU_RENDERERS[uop.arg](builder, _dtype_of(uop.src[-1]).scalar(), *src)
    elif uop.op is UOps.VECTORIZE:
      values[uop] = ir.Constant(register_type(dtype), ir.Undefined)
      for lane, value in enumerate(src): values[uop] = builder.insert_element(values[uop], value, ir.Constant(ir.IntType(32), lane))
    elif uop.op is UOps.GEP: values[uop] = builder.extract_element(src[0], ir.Constant(ir.IntType(32), uop.arg))
    elif uop.op is UOps.CAST and uop.src[0].dtype == dtype and dtypes.is_float(dtype.scalar()):  # a fence (see packing.chains)
      values[uop] = _intrinsic(builder, "arithmetic.fence", dtype.scalar(), src[0], flags=())
    elif uop.op is UOps.CAST: values[uop] = cast(builder, src[0], _dtype_of(uop.src[0]), dtype)
    elif uop.op is UOps.BITCAST: values[uop] = bitcast(builder, src[0], _dtype_of(uop.src[0]), dtype)
    else: raise NotImplementedError(f"the LLVM renderer has no rule for {uop.op}")
  allocas.branch(function.basic_blocks[1])
  builder.ret_void()
  # LLVM only honours loop metadata whose first operand is the node itself, which llvmlite cannot build: make it so in the text
  text = str(module)
  for loop_id in loop_ids: text = text.replace(f"!{loop_id.name} = !{{", f"!{loop_id.name} = distinct !{{ !{loop_id.name},", 1)
  return text

def _dtype_of(uop: UOp) -> DType:
  assert uop.dtype is not None, f"{uop.op} has no dtype"
  return uop.dtype
