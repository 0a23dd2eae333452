"""Layer 6: Tensor, the user API: construction, data access, autograd tape, elementwise math and reductions.
Movement/indexing lives in tensor_movement.py and network ops in tensor_nn.py (mixins). Imports every lower layer.
"""
from __future__ import annotations
import math
from typing import Any, Callable, ClassVar, Iterable, Sequence
import numpy as np
from tinyc.dtype import FLOAT_SET, DType, dtypes, least_upper_dtype, least_upper_float, result_dtype_with_scalar
from tinyc.helpers import AUTOCAST, Context, prod
from tinyc.ops import BinaryOps, LoadOps
from tinyc.shape.symbolic import Node, sym_infer
from tinyc.device import Device
from tinyc.lazy import LazyBuffer
from tinyc.realize import realize
from tinyc import index_check
from tinyc import function as F
from tinyc.tensor_movement import MovementMixin
from tinyc.tensor_index import IndexMixin
from tinyc.tensor_nn import NNMixin
from tinyc.tensor_reduce import ReduceMixin
from tinyc.tensor_create import CreationMixin
from tinyc.tensor_rounding import RoundingMixin

Scalar = int | float | bool

class Tensor(CreationMixin, MovementMixin, IndexMixin, ReduceMixin, NNMixin, RoundingMixin):
  """A lazy n-dimensional array: ops build a graph, realize()/numpy() run it as fused kernels."""
  __slots__ = ("lazydata", "requires_grad", "grad", "_ctx")
  training: ClassVar[bool] = False
  no_grad: ClassVar[bool] = False

  def __init__(self, data: Any, device: str | None = None, dtype: DType | None = None, requires_grad: bool | None = None) -> None:
    self.grad: Tensor | None = None
    self.requires_grad: bool | None = requires_grad
    self._ctx: F.Function | None = None
    if isinstance(data, LazyBuffer):  # every op's result: the device is already a canonical name unless asked for anew
      assert dtype is None or dtype == data.dtype, f"a LazyBuffer of {data.dtype} cannot become a {dtype} tensor"
      self.lazydata = data if device is None or device == data.device else data.copy_to_device(Device.canonicalize(device))
      return
    device = Device.canonicalize(device)
    if isinstance(data, Node):  # a bound Variable (or a Node of them) as a value: a constant that the kernels take as an argument
      self.lazydata = LazyBuffer.loadop(LoadOps.CONST, (), dtype or dtypes.int32, device, arg=data)
      return
    if isinstance(data, Tensor): data, dtype = data.numpy(), dtype or data.dtype  # numpy() gives bfloat16 as float32: keep the dtype
    if isinstance(data, np.generic): data = np.asarray(data)  # a numpy scalar keeps its dtype, as in torch (np.float64 is also a float)
    if isinstance(data, (bool, int, float)):
      inferred, dtype = dtype is None, dtype or dtypes.from_py(data)
      if isinstance(data, int) and dtypes.is_int(dtype) and not dtypes.min(dtype) <= data <= dtypes.max(dtype): raise _overflow(dtype, inferred)
      self.lazydata = LazyBuffer.loadop(LoadOps.CONST, (), dtype, device, arg=_cast_scalar(data, dtype))
      return
    if isinstance(data, (list, tuple)):
      inferred, dtype = dtype is None, dtype or dtypes.from_py(data)
      try: data = np.array(data, dtype=np.float32 if dtype == dtypes.bfloat16 else dtype.np)
      except ValueError as error: raise ValueError(f"cannot make a tensor from ragged nested lists: {error}") from error
      except OverflowError: raise _overflow(dtype, inferred) from None
    if not isinstance(data, np.ndarray):
      raise TypeError(f"cannot make a Tensor from {type(data).__name__}: use a number, a (nested) list or a numpy array")
    dtype = dtype or dtypes.from_np(data.dtype)
    if data.size == 0:  # no memory to fill: an empty buffer of the right shape
      self.lazydata = LazyBuffer.loadop(LoadOps.EMPTY, data.shape, dtype, device)
      return
    array = _round_to_bfloat16(data) if dtype == dtypes.bfloat16 else data.astype(dtype.np, copy=False)
    self.lazydata = LazyBuffer.from_numpy(array, device, dtype)

  # ---- properties ----
  @property
  def shape(self) -> tuple[int, ...]: return self.lazydata.shape
  @property
  def dtype(self) -> DType: return self.lazydata.dtype
  @property
  def device(self) -> str: return self.lazydata.device
  @property
  def ndim(self) -> int: return len(self.shape)
  def numel(self) -> int: return prod(self.shape)
  def element_size(self) -> int: return self.dtype.itemsize
  def nbytes(self) -> int: return self.numel() * self.element_size()
  def is_floating_point(self) -> bool: return dtypes.is_float(self.dtype)
  def __len__(self) -> int:
    if not self.shape: raise TypeError("len() of a 0-d tensor")
    return self.shape[0]
  def __repr__(self) -> str: return f"<Tensor {self.lazydata!r} on {self.device} with grad {self.grad.lazydata if self.grad is not None else None}>"
  def __hash__(self) -> int: return id(self)
  def __bool__(self) -> bool:
    if self.numel() != 1: raise RuntimeError(f"Boolean value of Tensor with {self.numel()} elements is ambiguous")
    return bool(self.item())

  # ---- realizing and data ----
  def realize(self) -> Tensor:
    """Compute this tensor now (fusing its graph into kernels); returns self."""
    realize([self.lazydata])
    return self
  @staticmethod
  def corealize(tensors: Iterable[Tensor]) -> None:
    """Compute several tensors in one schedule, so shared work runs once."""
    realize([t.lazydata for t in tensors])
  def numpy(self) -> np.ndarray:
    """The values as a numpy array of exactly this shape (bfloat16 comes back as float32). Raises IndexOutOfRangeError if an index
    tensor used since the last read of the host had a value out of range (index_check.py). A symbolic shape reads its bound sizes."""
    shape = tuple(sym_infer(size, {}) for size in self.shape)  # (a symbolic size is read at its bound value)
    if prod(shape) == 0: return np.zeros(shape, dtype=np.float32 if self.dtype == dtypes.bfloat16 else self.dtype.np)
    data = self.lazydata
    # a contiguous view of its whole base (a plain reshape) is read as it is; anything else is copied out by a kernel first
    if not (data.base is data or (data.st.contiguous and prod(data.shape) == prod(data.base.shape))): data = data.contiguous()
    realize([data])
    index_check.read_pending()
    assert data.base.realized is not None
    return data.base.realized.numpy()[:prod(shape)].reshape(shape)
  def item(self) -> Scalar:
    """The single value of a one-element tensor as a Python number."""
    if self.numel() != 1: raise RuntimeError(f"a Tensor with {self.numel()} elements cannot be converted to Scalar")
    return self.numpy().reshape(()).item()
  def tolist(self) -> Any: return self.numpy().tolist()
  def to(self, device: str) -> Tensor:
    """This tensor on another device (a copy; the graph stays differentiable through detach only)."""
    device = Device.canonicalize(device)
    if device == self.device: return self
    moved = Tensor(self.lazydata.copy_to_device(device), device, requires_grad=self.requires_grad)
    if self.grad is not None: moved.grad = self.grad.to(device)
    return moved
  def to_(self, device: str) -> None:
    """Move this tensor (and its grad) to another device in place."""
    moved = self.to(device)
    self.lazydata, self.grad = moved.lazydata, moved.grad
  def detach(self) -> Tensor: return Tensor(self.lazydata, device=self.device, requires_grad=False)
  def assign(self, x: Tensor | Any) -> Tensor:
    """Write x's values into this tensor (cast to its dtype). A realized tensor keeps its memory: the write is in place."""
    if not isinstance(x, Tensor): x = Tensor(x, device=self.device, dtype=self.dtype)
    if x.shape != self.shape: raise ValueError(f"assign needs the same shape: {self.shape} vs {x.shape}")
    if x.device != self.device: raise RuntimeError(f"assign of a tensor on {x.device} into one on {self.device}: use .to() first")
    value, target = x.cast(self.dtype).lazydata, self.lazydata
    if target.base is target and target.op is LoadOps.ASSIGN and target.realized is None: realize([target])  # the pending write lands first
    if target.base is target and target.realized is not None and value is not target:
      self.lazydata = target.assign(value.contiguous() if value.base is target else value)  # a view of itself is copied out first
    else: self.lazydata = value
    return self

  # ---- autograd ----
  @classmethod
  def _apply(cls, function: type[F.Function], *tensors: Tensor, **kwargs: Any) -> Tensor:
    needs_grad: list[bool | None] = []  # one loop, not two comprehensions (each a frame of its own): every eager op comes here
    inputs: list[LazyBuffer] = []
    for tensor in tensors:
      needs_grad.append(tensor.requires_grad)
      inputs.append(tensor.lazydata)
    context = function(inputs[0].device, needs_grad)
    # under no_grad nothing is recorded and, as in torch, the result does not require grad (else it would collect a .grad like a leaf)
    requires_grad = context.requires_grad and not Tensor.no_grad
    # on the inputs' device; requires_grad passed by position: a class called with a keyword argument builds a dict for it (0.1 us)
    result = cls(context.forward(*inputs, **kwargs), None, None, requires_grad)
    if requires_grad:
      context.parents = tensors  # type: ignore[attr-defined]
      result._ctx = context
    return result

  @staticmethod
  def _composite(forward: Callable[..., Tensor], backward: Callable[..., Sequence[Tensor | None]], *inputs: Tensor) -> Tensor:
    """forward(*inputs) as one op of the tape, differentiated by backward(grad_output, *inputs), which returns a gradient (or None) per
    input. Both see the inputs detached, so neither records a graph of its own ops; like every gradient here, theirs have no graph."""
    detached = [t.detach() for t in inputs]
    def lazy_backward(grad_output: LazyBuffer) -> tuple[LazyBuffer | None, ...]:
      with Context(AUTOCAST=""): grads = backward(Tensor(grad_output, device=grad_output.device), *detached)  # the forward's dtypes
      return tuple(None if grad is None else grad.lazydata for grad in grads)
    return Tensor._apply(F.Composite, *inputs, value=forward(*detached).lazydata, backward=lazy_backward)

  def _topological_order(self) -> list[Tensor]:
    order: list[Tensor] = []
    visited: set[int] = set()
    stack: list[tuple[Tensor, bool]] = [(self, False)]
    while stack:
      node, expanded = stack.pop()
      if expanded:
        order.append(node)
        continue
      if id(node) in visited: continue
      visited.add(id(node))
      stack.append((node, True))
      if node._ctx is not None: stack.extend((parent, False) for parent in node._ctx.parents)  # type: ignore[attr-defined]
    return order

  def backward(self) -> Tensor:
    """Accumulate d(self)/d(leaf) into every leaf's .grad; self must be a scalar."""
    if self.shape != (): raise RuntimeError(f"grad can be implicitly created only for scalar outputs, this tensor has shape {self.shape}")
    if self._ctx is None: raise RuntimeError("element 0 of tensors does not require grad and does not have a grad_fn")
    self.grad = Tensor(1.0, device=self.device, dtype=self.dtype, requires_grad=False)
    for node in reversed(self._topological_order()):
      context = node._ctx
      if context is None: continue
      assert node.grad is not None
      grads = context.backward(node.grad.lazydata)
      grads = grads if isinstance(grads, tuple) else (grads,)
      for parent, grad in zip(context.parents, grads):  # type: ignore[attr-defined]
        if grad is None or not parent.requires_grad: continue
        assert grad.shape == parent.shape, f"gradient of shape {grad.shape} for a tensor of shape {parent.shape}"
        parent.grad = Tensor(grad, device=self.device, requires_grad=False) if parent.grad is None else parent.grad + Tensor(grad, device=self.device)
      node._ctx = F.Freed(node.device, [])
    return self

  # ---- dtype ----
  def cast(self, dtype: DType) -> Tensor:
    _check_dtype(dtype, "cast")
    if self.dtype == dtype: return self
    # only floats carry gradients (as in torch): an int or bool result leaves the graph, so trunc's round trip through int is flat
    return Tensor._apply(F.Cast, self if dtypes.is_float(dtype) else self.detach(), dtype=dtype)
  def bitcast(self, dtype: DType) -> Tensor:
    _check_dtype(dtype, "bitcast")
    if dtype.itemsize != self.dtype.itemsize:
      raise ValueError(f"bitcast needs dtypes of one size: {self.dtype} is {self.dtype.itemsize} bytes, {dtype} {dtype.itemsize}")
    return self if self.dtype == dtype else Tensor._apply(F.Cast, self.detach(), dtype=dtype, bitcast=True)
  def contiguous(self) -> Tensor: return Tensor._apply(F.Contiguous, self)
  def contiguous_backward(self) -> Tensor: return Tensor._apply(F.ContiguousBackward, self)

  # ---- broadcasting binary ops ----
  def _broadcasted(self, other: Tensor | Scalar, reverse: bool = False, dtype: DType | None = None) -> tuple[Tensor, Tensor]:
    """Both operands cast to their promoted dtype (PyTorch's rules) and expanded to the broadcast shape."""
    if not isinstance(other, Tensor):
      if not isinstance(other, (int, float, bool)): raise TypeError(f"unsupported operand type {type(other).__name__} for a Tensor op")
      mine = self.lazydata
      if dtype is None and mine.dtype in FLOAT_SET: x, dtype, value = self, mine.dtype, float(other)  # what the two calls below give a float tensor
      else:
        x = self if (dtype := dtype or result_dtype_with_scalar(mine.dtype, other)) is mine.dtype else self.cast(dtype)
        value = _cast_scalar(other, dtype)
      # a constant in x's shape at once (no Tensor ops to record), not Tensor(other, dtype=...), which refuses an int that does not
      # fit: an operand keeps its value as C reads it
      y = Tensor(LazyBuffer.scalar(value, dtype, mine.device, mine.shape))
      return (y, x) if reverse else (x, y)
    mine, theirs = self.lazydata, other.lazydata
    if mine.shape == theirs.shape and mine.dtype == theirs.dtype and (dtype is None or dtype == mine.dtype) and mine.device == theirs.device:
      return (other, self) if reverse else (self, other)  # nothing to cast or expand: the common case, and every eager op asks
    if dtype is None: dtype = least_upper_dtype(self.dtype, other.dtype)
    x, y = self.cast(dtype), other.cast(dtype)
    if x.device != y.device: raise RuntimeError(f"Expected all tensors to be on the same device, but found {x.device} and {y.device}")
    if reverse: x, y = y, x
    shape = broadcast_shape(x.shape, y.shape)
    return x._broadcast_to(shape), y._broadcast_to(shape)

  def _broadcast_to(self, shape: tuple[int, ...]) -> Tensor:
    if self.shape == shape: return self
    return (self.reshape((1,) * (len(shape) - self.ndim) + self.shape) if self.ndim < len(shape) else self).expand(shape)

  def _binary(self, function: type[F.Function], other: Tensor | Scalar, reverse: bool = False) -> Tensor:
    """function(self, other) broadcast (other first if reverse): Add, Sub, Mul or Div, whose forward is x.alu(function.op, y)."""
    mine = self.lazydata
    if not self.requires_grad:  # the eager cases at once, with no _broadcasted (a frame) and no Tensor for a scalar (0.3 us an op)
      if isinstance(other, Tensor):
        theirs = other.lazydata
        if not other.requires_grad and mine.shape == theirs.shape and mine.dtype == theirs.dtype and mine.device == theirs.device:
          result = LazyBuffer.binary(function.op, theirs, mine) if reverse else LazyBuffer.binary(function.op, mine, theirs)
          return Tensor(result, None, None, None if self.requires_grad is None or other.requires_grad is None else False)
      elif isinstance(other, (int, float)) and mine.dtype in FLOAT_SET:  # (a bool is an int) the tensor's dtype, as _broadcasted gives
        const = LazyBuffer.scalar(float(other), mine.dtype, mine.device, mine.shape)
        return Tensor(LazyBuffer.binary(function.op, const, mine) if reverse else LazyBuffer.binary(function.op, mine, const), None, None, None)
    x, y = self._broadcasted(other, reverse)
    if x.requires_grad or y.requires_grad: return Tensor._apply(function, x, y)
    # no operand wants a gradient: the op at once, with no Function that nothing would keep (every eager op comes here; three calls and two
    # objects fewer), and the requires_grad _apply gives: None where an operand's is None (no_grad changes neither), else False. (The op
    # is read from the Function class: an enum member read from its own class, BinaryOps.ADD, is a Python call in Python 3.11)
    return Tensor(x.lazydata.alu(function.op, y.lazydata), None, None, None if x.requires_grad is None or y.requires_grad is None else False)
  def add(self, other: Tensor | Scalar, reverse: bool = False) -> Tensor: return self._binary(F.Add, other, reverse)
  def sub(self, other: Tensor | Scalar, reverse: bool = False) -> Tensor: return self._binary(F.Sub, other, reverse)
  def mul(self, other: Tensor | Scalar, reverse: bool = False) -> Tensor: return self._binary(F.Mul, other, reverse)
  def div(self, other: Tensor | Scalar, reverse: bool = False) -> Tensor:
    """True division: integer operands give a float result, like torch."""
    x, y = self._broadcasted(other, reverse)
    if not dtypes.is_float(x.dtype): x, y = x.cast(dtypes.default_float), y.cast(dtypes.default_float)
    return x._binary(F.Div, y)  # (y now has x's shape and dtype: it is taken as it is)
  def floordiv(self, other: Tensor | Scalar, reverse: bool = False) -> Tensor:
    """Division rounded down, like Python's // (and torch's); an integer x // 0 is 0, as in numpy (a Python 0 raises at once)."""
    x, y = self._divmod_operands(other, reverse)
    if dtypes.is_float(x.dtype): return (x / y).floor()
    return Tensor._apply(F.IntegerDiv, x, y) - x._floor_fix(y)[1].cast(x.dtype)  # it truncates toward zero: one less where it was inexact
  def mod(self, other: Tensor | Scalar, reverse: bool = False) -> Tensor:
    """Remainder with the sign of the divisor, like Python's % (and torch's); an integer x % 0 is 0, as in numpy."""
    x, y = self._divmod_operands(other, reverse)
    remainder, differs = x._floor_fix(y)
    return differs.where(remainder + y, remainder)
  def _divmod_operands(self, other: Tensor | Scalar, reverse: bool) -> tuple[Tensor, Tensor]:
    x, y = self._broadcasted(other, reverse)
    if not reverse and not isinstance(other, Tensor) and other == 0 and not dtypes.is_float(x.dtype):  # torch's CPU raises, and so can we here
      raise F.IntegerDivisionByZero("ZeroDivisionError: integer // or % by the constant 0 (a 0 in a tensor divisor gives 0 instead)")
    return x, y
  def _floor_fix(self, y: Tensor) -> tuple[Tensor, Tensor]:
    """The truncated remainder self % y (0 where y is 0) and where it is nonzero with a sign other than y's: there // rounds down one more."""
    remainder = Tensor._apply(F.Mod, self, y)
    return remainder, (remainder != 0) & ((remainder < 0) != (y < 0))
  def maximum(self, other: Tensor | Scalar) -> Tensor: return Tensor._apply(F.Maximum, *self._broadcasted(other))
  def minimum(self, other: Tensor | Scalar) -> Tensor:
    x, y = self._broadcasted(other)
    if x.dtype == dtypes.bool: return x & y
    # negation wraps around for unsigned ints (and overflows at the int minimum), so ints select; floats keep max's gradient rule
    return -((-x).maximum(-y)) if dtypes.is_float(x.dtype) else (x < y).where(x, y)
  def where(self, x: Tensor | Scalar, y: Tensor | Scalar) -> Tensor:
    """Elementwise `x if self else y` (self is the condition)."""
    if isinstance(x, Tensor): x, y = x._broadcasted(y)
    elif isinstance(y, Tensor): y, x = y._broadcasted(x)
    else:
      dtype = dtypes.from_py([x, y])
      x, y = Tensor(x, device=self.device, dtype=dtype), Tensor(y, device=self.device, dtype=dtype)
    condition = self.cast(dtypes.bool)
    shape = broadcast_shape(broadcast_shape(condition.shape, x.shape), y.shape)
    return Tensor._apply(F.Where, condition._broadcast_to(shape), x._broadcast_to(shape), y._broadcast_to(shape))

  def pow(self, exponent: Tensor | Scalar, reverse: bool = False) -> Tensor:
    """self ** exponent; a negative base works with integral exponents, like torch."""
    if not reverse and isinstance(exponent, (int, float)) and not isinstance(exponent, bool):
      if exponent == 0: return self._flat(self.ones_like(dtype=result_dtype_with_scalar(self.dtype, exponent)))
      if exponent == 1: return self.cast(result_dtype_with_scalar(self.dtype, exponent))
      if exponent == 0.5: return self.sqrt()
      if exponent == -1 and dtypes.is_float(self.dtype): return self.reciprocal()
      if dtypes.is_float(self.dtype) and math.isfinite(exponent) and exponent == int(exponent): return self._integer_pow(int(exponent))
    base, power = self._broadcasted(exponent, reverse)
    out_dtype = base.dtype
    base, power = base.cast(least_upper_float(out_dtype)), power.cast(least_upper_float(out_dtype))
    is_zero = base == 0
    # log|base| * power, with a zero base kept out of the log: its gradient there would be 0/0 = nan (its value is set below)
    exponent_term = is_zero.where(1.0, base.abs()).log() * power
    # 1 ** nan == inf ** 0 == nan ** 0 == 1, as in C and torch; only where the product is nan, so base 1 keeps its gradient
    exponent_term = (((power == 0) | (base == 1)) & (exponent_term != exponent_term)).where(0.0, exponent_term)
    is_integral = power == power.trunc()
    is_odd = is_integral & ((power.abs() % 2) == 1)
    sign = (base < 0).where(is_integral.where(is_odd.where(-1.0, 1.0), math.nan), 1.0).cast(base.dtype)
    # 0 ** p: 0 for p > 0, inf for p < 0, nan for nan; from a detached p, since an unused inf branch would still make inf * 0 = nan gradients
    zero_power = (power == 0).where(1.0, (power.detach() * -math.inf).exp())
    result = is_zero.where(zero_power, exponent_term.exp() * sign)
    return result if dtypes.is_float(out_dtype) else result.round_half_even().cast(out_dtype)
  def _integer_pow(self, n: int) -> Tensor:
    """self ** n by repeated squaring: exact gradients where exp(n * log|x|) has none (x = 0: 0/0), and fewer roundings. A negative
    n takes the reciprocal first, so that at x = 0 the gradient is torch's -inf rather than inf * 0 = nan."""
    result, square, remaining = None, self.reciprocal() if n < 0 else self, abs(n)
    while remaining:
      if remaining & 1: result = square if result is None else result * square
      remaining >>= 1
      if remaining: square = square * square
    assert result is not None, f"n = {n} must be nonzero"
    return result

  def __neg__(self) -> Tensor: return Tensor._apply(F.Neg, self) if self.dtype != dtypes.bool else self.logical_not()
  __add__ = add  # (the method itself: one call fewer for every operator)
  def __radd__(self, other: Any) -> Tensor: return self.add(other, True)
  __sub__ = sub
  def __rsub__(self, other: Any) -> Tensor: return self.sub(other, True)
  __mul__ = mul
  def __rmul__(self, other: Any) -> Tensor: return self.mul(other, True)
  __truediv__ = div
  def __rtruediv__(self, other: Any) -> Tensor: return self.div(other, True)
  __floordiv__ = floordiv
  def __rfloordiv__(self, other: Any) -> Tensor: return self.floordiv(other, True)
  __mod__ = mod
  def __rmod__(self, other: Any) -> Tensor: return self.mod(other, True)
  __pow__ = pow
  def __rpow__(self, other: Any) -> Tensor: return self.pow(other, True)
  def __matmul__(self, other: Tensor) -> Tensor: return self.matmul(other)
  def __rmatmul__(self, other: Tensor) -> Tensor: return other.matmul(self)
  # (mypy finds these unlike the operators, which are the methods with their `reverse` argument)
  def __iadd__(self, other: Tensor | Scalar) -> Tensor: return self.assign(self.add(other))  # type: ignore[misc]
  def __isub__(self, other: Tensor | Scalar) -> Tensor: return self.assign(self.sub(other))  # type: ignore[misc]
  def __imul__(self, other: Tensor | Scalar) -> Tensor: return self.assign(self.mul(other))  # type: ignore[misc]
  def __itruediv__(self, other: Tensor | Scalar) -> Tensor: return self.assign(self.div(other))  # type: ignore[misc]
  def __imatmul__(self, other: Tensor) -> Tensor: return self.assign(self.matmul(other))

  # ---- comparisons and logic (not differentiable) ----
  def __lt__(self, other: Any) -> Tensor: return Tensor._apply(F.Less, *self._broadcasted(other))
  def __gt__(self, other: Any) -> Tensor: return Tensor._apply(F.Less, *self._broadcasted(other, reverse=True))
  # not (x > y) would make NaN <= 1 true: a comparison with NaN is false, so <= is < or ==
  def __le__(self, other: Any) -> Tensor: return (self < other) | (self == other)
  def __ge__(self, other: Any) -> Tensor: return (self > other) | (self == other)
  def __eq__(self, other: Any) -> Tensor: return Tensor._apply(F.Eq, *self._broadcasted(other))  # type: ignore[override]
  def __ne__(self, other: Any) -> Tensor: return (self == other).logical_not()  # type: ignore[override]
  def logical_not(self) -> Tensor: return self.cast(dtypes.bool) ^ True
  def _bitwise(self, other: Any, op: BinaryOps, reverse: bool = False) -> Tensor:
    x, y = self._broadcasted(other, reverse)
    if dtypes.is_float(x.dtype): raise TypeError(f"bitwise {op.name.lower()} needs bool or integer tensors, not {x.dtype}")
    return Tensor._apply(F.BitwiseOp, x, y, op=op)
  def __and__(self, other: Any) -> Tensor: return self._bitwise(other, BinaryOps.AND)
  def __or__(self, other: Any) -> Tensor: return self._bitwise(other, BinaryOps.OR)
  def __xor__(self, other: Any) -> Tensor: return self._bitwise(other, BinaryOps.XOR)
  def __rand__(self, other: Any) -> Tensor: return self._bitwise(other, BinaryOps.AND, True)
  def __ror__(self, other: Any) -> Tensor: return self._bitwise(other, BinaryOps.OR, True)
  def __rxor__(self, other: Any) -> Tensor: return self._bitwise(other, BinaryOps.XOR, True)

  # ---- unary math ----
  def _floating(self) -> Tensor:
    """Self in the dtype a float op computes in: ints in the default float; 16-bit floats in float32 inside autocast (amp.py)."""
    return self.cast(dtypes.float32 if self.dtype in (dtypes.float16, dtypes.bfloat16) and AUTOCAST else least_upper_float(self.dtype))
  def neg(self) -> Tensor: return -self
  def log(self) -> Tensor: return Tensor._apply(F.Log, self._floating())
  def log2(self) -> Tensor: return Tensor._apply(F.Log, self._floating(), base2=True)
  def exp(self) -> Tensor: return Tensor._apply(F.Exp, self._floating())
  def exp2(self) -> Tensor: return Tensor._apply(F.Exp, self._floating(), base2=True)
  def sqrt(self) -> Tensor: return Tensor._apply(F.Sqrt, self._floating())
  def rsqrt(self) -> Tensor: return self.sqrt().reciprocal()
  def sin(self) -> Tensor: return Tensor._apply(F.Sin, self._floating())
  def cos(self) -> Tensor: return ((math.pi / 2) - self._floating()).sin()
  def tan(self) -> Tensor: return self.sin() / self.cos()
  def reciprocal(self) -> Tensor: return Tensor._apply(F.Reciprocal, self._floating())
  def square(self) -> Tensor: return self * self
  def abs(self) -> Tensor: return self.relu() + (-self).relu() if self.dtype != dtypes.bool and not dtypes.is_unsigned(self.dtype) else self
  def sign(self) -> Tensor: return self._flat((self > 0).cast(self.dtype) - (self < 0).cast(self.dtype))
  def relu(self) -> Tensor: return Tensor._apply(F.Relu, self) if self.dtype != dtypes.bool else self
  def sigmoid(self) -> Tensor: return Tensor._apply(F.Sigmoid, self._floating())

  # ---- casts named after builtins: last in the class, so that annotations above it (`-> bool`, `keepdim: bool`) mean the builtins ----
  def float(self) -> Tensor: return self.cast(dtypes.float32)
  def half(self) -> Tensor: return self.cast(dtypes.float16)
  def int(self) -> Tensor: return self.cast(dtypes.int32)
  def bool(self) -> Tensor: return self.cast(dtypes.bool)


def broadcast_shape(a: tuple[int, ...], b: tuple[int, ...]) -> tuple[int, ...]:
  """NumPy/PyTorch broadcasting of two shapes; names both when they do not broadcast."""
  if a == b: return a
  ndim = max(len(a), len(b))
  left, right = (1,) * (ndim - len(a)) + a, (1,) * (ndim - len(b)) + b
  for axis, (x, y) in enumerate(zip(left, right)):
    if x != y and x != 1 and y != 1:
      raise RuntimeError(f"The size of tensor a ({x}) must match the size of tensor b ({y}) at non-singleton dimension {axis}: shapes {a} and {b}")
  return tuple(y if x == 1 else x for x, y in zip(left, right))

def _round_to_bfloat16(data: np.ndarray) -> np.ndarray:
  """float32 values rounded to the nearest bfloat16 (ties to even), as torch does; storing then keeps the top 16 bits exactly."""
  values = np.asarray(data, dtype=np.float32)
  bits = values.view(np.uint32).astype(np.uint64)
  rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000).astype(np.uint32).view(np.float32)
  return np.where(np.isnan(values), values, rounded)

def _overflow(dtype: DType, inferred: bool) -> Exception:
  """torch's error for a Python int that does not fit: int64 is the widest dtype a Python int makes (uint64 only when asked for)."""
  if inferred: return ValueError("Overflow when unpacking long long: a Python int beyond int64 cannot be a tensor element; pass it as a float")
  return RuntimeError(f"value cannot be converted to type {dtype.name} without overflow")

def _cast_scalar(value: Scalar, dtype: DType) -> Scalar:
  if dtypes.is_float(dtype): return float(value)
  return bool(value) if dtype == dtypes.bool else int(value)

def _check_dtype(dtype: object, method: str) -> None:
  if not isinstance(dtype, DType):
    hint = f"tinyc.dtypes.{dtype}" if isinstance(dtype, str) else "one of tinyc.dtypes (tinyc.dtypes.int32, ...)"
    raise TypeError(f"Tensor.{method} takes a tinyc dtype, not {dtype!r}: pass {hint}")
