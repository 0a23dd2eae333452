"""Layer 6: the primitive differentiable ops. Each Function computes forward on LazyBuffers and backward as more LazyBuffer
ops, so gradients are lazy graphs that fuse like anything else. Imports helpers, dtype, ops, lazy.
"""
from __future__ import annotations
import math
from typing import Any, Callable, ClassVar
from tinyc.dtype import DType, dtypes
from tinyc.helpers import argsort
from tinyc.ops import BinaryOps, ReduceOps, TernaryOps, UnaryOps
from tinyc.lazy import LazyBuffer

class Function:
  """One op of the autograd tape: forward saves what backward needs; needs_input_grad says which inputs want a gradient."""
  op: ClassVar[BinaryOps]  # Add, Sub, Mul, Div: forward is x.alu(op, y), which Tensor._binary makes alone where no input wants a gradient
  def __init__(self, device: str, needs_input_grad: list[bool | None]) -> None:
    self.device, self.needs_input_grad = device, needs_input_grad
    self.requires_grad = True if any(needs_input_grad) else None if None in needs_input_grad else False
  def forward(self, *args: Any, **kwargs: Any) -> LazyBuffer: raise NotImplementedError(f"{type(self).__name__} has no forward")
  def backward(self, grad_output: LazyBuffer) -> Any: raise RuntimeError(f"{type(self).__name__} is not differentiable")

class Freed(Function):
  """What a backward leaves on each node it went through: the graph behind it is gone, as torch frees it (without retain_graph), so
  a later backward that reaches the node raises instead of stopping there with part of the gradient."""
  parents: tuple[Any, ...] = ()
  def backward(self, grad_output: LazyBuffer) -> Any:
    raise RuntimeError("Trying to backward through the graph a second time (or directly access saved tensors after they have already "
                       "been freed). Saved intermediate values of the graph are freed when you call .backward(); tinyc keeps no graph "
                       "for a second one: compute the loss again from the leaves.")

class NonDifferentiable(Function):
  """An op whose result carries no gradient (comparisons, integer math): as in torch, its result never requires grad, so a graph
  through it (a where's condition, argmax) ends there instead of asking it for a backward."""
  def __init__(self, device: str, needs_input_grad: list[bool | None]) -> None:
    super().__init__(device, needs_input_grad)
    self.requires_grad = False
  def backward(self, grad_output: LazyBuffer) -> Any:
    raise RuntimeError(f"element 0 of tensors does not require grad and does not have a grad_fn ({type(self).__name__} is not differentiable)")

class Contiguous(Function):
  def forward(self, x: LazyBuffer) -> LazyBuffer: return x.contiguous()
  def backward(self, grad_output: LazyBuffer) -> LazyBuffer: return grad_output

class ContiguousBackward(Function):
  def forward(self, x: LazyBuffer) -> LazyBuffer: return x
  def backward(self, grad_output: LazyBuffer) -> LazyBuffer: return grad_output.contiguous()

class Cast(Function):
  def forward(self, x: LazyBuffer, dtype: DType, bitcast: bool = False) -> LazyBuffer:
    self.input_dtype, self.bitcast = x.dtype, bitcast
    return x.cast(dtype, bitcast)
  def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
    if self.bitcast: raise RuntimeError("bitcast is not differentiable")
    return grad_output.cast(self.input_dtype)

class ZeroGrad(Function):
  """`value`, a piecewise-constant function of x computed without a graph (sign, trunc, floor, ceil): it stays in x's graph with
  the zero gradient torch gives it, so backward through it works and adds nothing."""
  def forward(self, x: LazyBuffer, value: LazyBuffer) -> LazyBuffer:
    self.x = x
    return value
  def backward(self, grad_output: LazyBuffer) -> LazyBuffer: return self.x.const(0)

class Composite(Function):
  """An op composed of other ops that gives its own backward: `value` is its result, computed without recording a graph, and
  `backward` (built by the Tensor layer, which composes it from Tensor ops) maps grad_output to one gradient (or None) per input."""
  def forward(self, *inputs: LazyBuffer, value: LazyBuffer, backward: Callable[[LazyBuffer], tuple[LazyBuffer | None, ...]]) -> LazyBuffer:
    self.backward_fn = backward
    return value
  def backward(self, grad_output: LazyBuffer) -> tuple[LazyBuffer | None, ...]:
    return tuple(grad if needed else None for grad, needed in zip(self.backward_fn(grad_output), self.needs_input_grad, strict=True))

# ---- unary ----
class Neg(Function):
  def forward(self, x: LazyBuffer) -> LazyBuffer: return x.alu(UnaryOps.NEG)
  def backward(self, grad_output: LazyBuffer) -> LazyBuffer: return grad_output.alu(UnaryOps.NEG)

class Reciprocal(Function):
  def forward(self, x: LazyBuffer) -> LazyBuffer:
    self.ret = x.alu(UnaryOps.RECIP)
    return self.ret
  def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
    return grad_output.alu(UnaryOps.NEG).alu(BinaryOps.MUL, self.ret).alu(BinaryOps.MUL, self.ret)

class Sin(Function):
  def forward(self, x: LazyBuffer) -> LazyBuffer:
    self.x = x
    return x.alu(UnaryOps.SIN)
  def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
    cos = self.x.const(math.pi / 2).alu(BinaryOps.SUB, self.x).alu(UnaryOps.SIN)
    return cos.alu(BinaryOps.MUL, grad_output)

class Relu(Function):
  def forward(self, x: LazyBuffer) -> LazyBuffer:
    self.ret = x.alu(BinaryOps.MAX, x.const(0))
    return self.ret
  def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
    return self.ret.const(0).alu(BinaryOps.CMPLT, self.ret).cast(grad_output.dtype).alu(BinaryOps.MUL, grad_output)

def _in_float32(x: LazyBuffer, fn: Callable[[LazyBuffer], LazyBuffer]) -> LazyBuffer:
  """fn(x) computed in float32 for 16-bit floats: exp(x) = exp2(x * log2(e)) would round x * log2(e) to 11 bits first, an error of
  up to 0.4% at x = 7 where torch's float16 exp is correctly rounded. The casts fuse into the kernel, so this costs no memory traffic."""
  return fn(x.cast(dtypes.float32)).cast(x.dtype) if x.dtype in (dtypes.float16, dtypes.bfloat16) else fn(x)

# ln and exp scale log2 and exp2 by ln(2); base 2 calls them alone, so exp2 of an integer and log2 of a power of two are exact
class Log(Function):
  def forward(self, x: LazyBuffer, base2: bool = False) -> LazyBuffer:
    self.x, self.base2 = x, base2
    return _in_float32(x, lambda v: v.alu(UnaryOps.LOG2) if base2 else v.alu(UnaryOps.LOG2).alu(BinaryOps.MUL, v.const(math.log(2))))
  def backward(self, grad_output: LazyBuffer) -> LazyBuffer:  # d log2(x) = dx / (x ln 2)
    return grad_output.alu(BinaryOps.DIV, self.x.alu(BinaryOps.MUL, self.x.const(math.log(2))) if self.base2 else self.x)

class Exp(Function):
  def forward(self, x: LazyBuffer, base2: bool = False) -> LazyBuffer:
    self.base2 = base2
    self.ret = _in_float32(x, lambda v: (v if base2 else v.alu(BinaryOps.MUL, v.const(1 / math.log(2)))).alu(UnaryOps.EXP2))
    return self.ret
  def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
    grad = self.ret.alu(BinaryOps.MUL, grad_output)
    return grad.alu(BinaryOps.MUL, grad.const(math.log(2))) if self.base2 else grad

class Sqrt(Function):
  def forward(self, x: LazyBuffer) -> LazyBuffer:
    self.ret = x.alu(UnaryOps.SQRT)
    return self.ret
  def backward(self, grad_output: LazyBuffer) -> LazyBuffer: return grad_output.alu(BinaryOps.DIV, self.ret.alu(BinaryOps.MUL, self.ret.const(2)))

class Sigmoid(Function):
  """1 / (1 + exp(-x)), as one primitive so its backward reuses the forward value."""
  def forward(self, x: LazyBuffer) -> LazyBuffer:
    exp_neg = lambda v: v.alu(BinaryOps.MUL, v.const(-1 / math.log(2))).alu(UnaryOps.EXP2)
    self.ret = _in_float32(x, lambda v: v.const(1).alu(BinaryOps.ADD, exp_neg(v)).alu(UnaryOps.RECIP))
    return self.ret
  def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
    return self.ret.alu(BinaryOps.MUL, self.ret.const(1).alu(BinaryOps.SUB, self.ret)).alu(BinaryOps.MUL, grad_output)

# ---- binary and ternary ----
class Less(NonDifferentiable):
  def forward(self, x: LazyBuffer, y: LazyBuffer) -> LazyBuffer: return x.alu(BinaryOps.CMPLT, y)
class Eq(NonDifferentiable):
  def forward(self, x: LazyBuffer, y: LazyBuffer) -> LazyBuffer: return x.alu(BinaryOps.CMPEQ, y)
class BitwiseOp(NonDifferentiable):
  def forward(self, x: LazyBuffer, y: LazyBuffer, op: BinaryOps) -> LazyBuffer: return x.alu(op, y)
class IntegerDivisionByZero(RuntimeError, ZeroDivisionError):
  """An integer // or % by a constant 0: a RuntimeError as torch raises it, and a ZeroDivisionError as Python's ints do."""
class IntegerDiv(NonDifferentiable):
  def forward(self, x: LazyBuffer, y: LazyBuffer) -> LazyBuffer: return x.alu(BinaryOps.IDIV, y)
class Mod(NonDifferentiable):
  def forward(self, x: LazyBuffer, y: LazyBuffer) -> LazyBuffer: return x.alu(BinaryOps.MOD, y)

class Add(Function):
  op = BinaryOps.ADD
  def forward(self, x: LazyBuffer, y: LazyBuffer) -> LazyBuffer: return x.alu(self.op, y)
  def backward(self, grad_output: LazyBuffer) -> tuple[LazyBuffer | None, ...]:
    return (grad_output if self.needs_input_grad[0] else None, grad_output if self.needs_input_grad[1] else None)

class Sub(Function):
  op = BinaryOps.SUB
  def forward(self, x: LazyBuffer, y: LazyBuffer) -> LazyBuffer: return x.alu(self.op, y)
  def backward(self, grad_output: LazyBuffer) -> tuple[LazyBuffer | None, ...]:
    return (grad_output if self.needs_input_grad[0] else None, grad_output.alu(UnaryOps.NEG) if self.needs_input_grad[1] else None)

class Mul(Function):
  op = BinaryOps.MUL
  def forward(self, x: LazyBuffer, y: LazyBuffer) -> LazyBuffer:
    self.x, self.y = x, y
    return x.alu(self.op, y)
  def backward(self, grad_output: LazyBuffer) -> tuple[LazyBuffer | None, ...]:
    return (self.y.alu(BinaryOps.MUL, grad_output) if self.needs_input_grad[0] else None,
            self.x.alu(BinaryOps.MUL, grad_output) if self.needs_input_grad[1] else None)

class Div(Function):
  op = BinaryOps.DIV
  def forward(self, x: LazyBuffer, y: LazyBuffer) -> LazyBuffer:
    self.x, self.y = x, y
    return x.alu(self.op, y)
  def backward(self, grad_output: LazyBuffer) -> tuple[LazyBuffer | None, ...]:
    grad_y = grad_output.alu(UnaryOps.NEG).alu(BinaryOps.MUL, self.x).alu(BinaryOps.DIV, self.y.alu(BinaryOps.MUL, self.y))
    return (grad_output.alu(BinaryOps.DIV, self.y) if self.needs_input_grad[0] else None, grad_y if self.needs_input_grad[1] else None)

class Maximum(Function):
  """max(x, y); where x == y the gradient is split evenly, as torch does."""
  def forward(self, x: LazyBuffer, y: LazyBuffer) -> LazyBuffer:
    self.x, self.y = x, y
    self.ret = x.alu(BinaryOps.MAX, y)
    return self.ret
  def backward(self, grad_output: LazyBuffer) -> tuple[LazyBuffer | None, ...]:
    x_wins = self.y.alu(BinaryOps.CMPLT, self.x).cast(grad_output.dtype)
    tie = self.x.alu(BinaryOps.CMPEQ, self.y).cast(grad_output.dtype).alu(BinaryOps.MUL, grad_output.const(0.5))
    x_share = x_wins.alu(BinaryOps.ADD, tie)
    return (x_share.alu(BinaryOps.MUL, grad_output) if self.needs_input_grad[0] else None,
            x_share.const(1).alu(BinaryOps.SUB, x_share).alu(BinaryOps.MUL, grad_output) if self.needs_input_grad[1] else None)

class Where(Function):
  def forward(self, condition: LazyBuffer, x: LazyBuffer, y: LazyBuffer) -> LazyBuffer:
    self.condition = condition
    return condition.alu(TernaryOps.WHERE, x, y)
  def backward(self, grad_output: LazyBuffer) -> tuple[LazyBuffer | None, ...]:
    zero = grad_output.const(0)
    return (None, self.condition.alu(TernaryOps.WHERE, grad_output, zero) if self.needs_input_grad[1] else None,
            self.condition.alu(TernaryOps.WHERE, zero, grad_output) if self.needs_input_grad[2] else None)

# ---- reductions ----
class Sum(Function):
  def forward(self, x: LazyBuffer, axis: tuple[int, ...]) -> LazyBuffer:
    self.input_shape = x.shape
    return x.reduce(ReduceOps.SUM, axis)
  def backward(self, grad_output: LazyBuffer) -> LazyBuffer: return grad_output.expand(self.input_shape)

class Max(Function):
  """Reduce-max; the gradient is shared evenly between tied maxima (torch.amax's rule)."""
  def forward(self, x: LazyBuffer, axis: tuple[int, ...]) -> LazyBuffer:
    self.x, self.ret = x, x.reduce(ReduceOps.MAX, axis)
    return self.ret
  def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
    is_max = self.x.alu(BinaryOps.CMPEQ, self.ret.expand(self.x.shape)).cast(grad_output.dtype)
    count = is_max.reduce(ReduceOps.SUM, tuple(i for i, (a, b) in enumerate(zip(self.x.shape, self.ret.shape)) if a != b))
    return is_max.alu(BinaryOps.DIV, count.expand(self.x.shape)).alu(BinaryOps.MUL, grad_output.expand(self.x.shape))

# ---- movement ----
class Expand(Function):
  def forward(self, x: LazyBuffer, shape: tuple[int, ...]) -> LazyBuffer:
    self.input_shape = x.shape
    return x.expand(shape)
  def backward(self, grad_output: LazyBuffer) -> LazyBuffer:
    axis = tuple(i for i, (a, b) in enumerate(zip(self.input_shape, grad_output.shape)) if a != b)
    return grad_output.reduce(ReduceOps.SUM, axis)

class Reshape(Function):
  def forward(self, x: LazyBuffer, shape: tuple[int, ...]) -> LazyBuffer:
    self.input_shape = x.shape
    return x.reshape(shape)
  def backward(self, grad_output: LazyBuffer) -> LazyBuffer: return grad_output.reshape(self.input_shape)

class Permute(Function):
  def forward(self, x: LazyBuffer, order: tuple[int, ...]) -> LazyBuffer:
    self.order = order
    return x.permute(order)
  def backward(self, grad_output: LazyBuffer) -> LazyBuffer: return grad_output.permute(tuple(argsort(self.order)))

class Pad(Function):
  def forward(self, x: LazyBuffer, padding: tuple[tuple[int, int], ...]) -> LazyBuffer:
    self.bounds = tuple((before, before + size) for size, (before, _) in zip(x.shape, padding))
    return x.pad(padding)
  def backward(self, grad_output: LazyBuffer) -> LazyBuffer: return grad_output.shrink(self.bounds)

class Shrink(Function):
  def forward(self, x: LazyBuffer, bounds: tuple[tuple[int, int], ...]) -> LazyBuffer:
    self.padding = tuple((begin, size - end) for size, (begin, end) in zip(x.shape, bounds))
    return x.shrink(bounds)
  def backward(self, grad_output: LazyBuffer) -> LazyBuffer: return grad_output.pad(self.padding)

class Flip(Function):
  def forward(self, x: LazyBuffer, axis: tuple[int, ...]) -> LazyBuffer:
    self.steps = tuple(-1 if i in axis else 1 for i in range(len(x.shape)))
    return x.stride(self.steps)
  def backward(self, grad_output: LazyBuffer) -> LazyBuffer: return grad_output.stride(self.steps)
