"""Layer 5: LazyBuffer, a node of the lazy graph. A *base* is a value to compute (op, srcs) or a realized Buffer; every other
LazyBuffer is a *view*: a base seen through a ShapeTracker, which is why movement ops never make kernels.
Imports helpers, dtype, ops, shape/, device.
"""
from __future__ import annotations
import functools, math
from typing import Any
import numpy as np
from tinyc.dtype import DType, dtypes
from tinyc.helpers import PACK, all_int, prod
from tinyc.ops import BinaryOps, LoadOps, Op, ReduceOps, TernaryOps, UnaryOps
from tinyc.shape.shapetracker import ShapeTracker
from tinyc.device import Buffer, Device

class LazyBuffer:
  __slots__ = ("device", "st", "dtype", "shape", "_base", "op", "arg", "srcs", "realized", "__weakref__")  # every eager op makes one or two
  def __init__(self, device: str, st: ShapeTracker, dtype: DType, op: Op | None = None, arg: Any = None,
               srcs: tuple[LazyBuffer, ...] = (), base: LazyBuffer | None = None) -> None:
    self.device, self.st, self.dtype, self.shape = device, st, dtype, st.shape
    self._base = base
    if base is None:  # only a base has an op and can be realized
      self.op, self.arg, self.srcs = op, arg, srcs
      self.realized: Buffer | None = None

  @property
  def base(self) -> LazyBuffer: return self._base if self._base is not None else self
  def is_realized(self) -> bool: return self.base.realized is not None
  def __repr__(self) -> str:
    what = "realized" if self.base.realized is not None else self.base.op
    return f"<LB {self.device} {self.shape} {self.dtype.name} {what}{'' if self._base is None else ' view'}>"

  # ---- making bases ----
  @staticmethod
  def loadop(op: LoadOps, shape: tuple[int, ...], dtype: DType, device: str, arg: Any = None, srcs: tuple[LazyBuffer, ...] = ()) -> LazyBuffer:
    return LazyBuffer(device, ShapeTracker.from_shape(shape), dtype, op, arg, srcs)
  @staticmethod
  def from_numpy(array: np.ndarray, device: str, dtype: DType) -> LazyBuffer:
    """A realized base holding a copy of `array` (numpy data is copied at once: it may change after this call)."""
    result = LazyBuffer.loadop(LoadOps.EMPTY, array.shape, dtype, device)
    if dtype == dtypes.bfloat16: array = (np.asarray(array, dtype=np.float32).view(np.uint32) >> 16).astype(np.uint16)
    result.realized = Buffer(Device.canonicalize(device), prod(array.shape), dtype).copyin(np.asarray(array))
    return result
  def const(self, value: Any, shape: tuple[int, ...] | None = None) -> LazyBuffer:
    """A constant of this buffer's dtype and device, broadcast to `shape` (default: this shape). Costs no memory."""
    return LazyBuffer.scalar(value, self.dtype, self.device, self.shape if shape is None else shape)
  @staticmethod
  def scalar(value: Any, dtype: DType, device: str, shape: tuple[int, ...] = ()) -> LazyBuffer:
    """A constant `value` broadcast to `shape`: one CONST base whose tracker is the broadcast of a scalar (an operand of every `x + 1`;
    the only kind of base whose tracker is not from_shape(its shape): it is read, and viewed, through that broadcast)."""
    return LazyBuffer(device, _scalar_view(shape), dtype, _CONST, value)

  def is_unrealized_const(self) -> bool: return self.base.realized is None and self.base.op is LoadOps.CONST

  def alu(self, op: UnaryOps | BinaryOps | TernaryOps, *srcs: LazyBuffer, arg: Any = None) -> LazyBuffer:
    """An elementwise op over same-shaped operands (self first)."""
    operands = (self,) + srcs
    for src in srcs: assert src.shape == self.shape, f"elementwise {op} needs equal shapes, got {[x.shape for x in operands]}"
    dtype = arg if op in _CASTS else dtypes.bool if op in _COMPARISONS else operands[-1].dtype
    # (a base's tracker is from_shape(its shape), but for a broadcast constant's)
    st = self.st if self._base is None and self.op is not _CONST else ShapeTracker.from_shape(self.shape)
    return LazyBuffer(self.device, st, dtype, op, arg, operands)

  @staticmethod
  def binary(op: BinaryOps, x: LazyBuffer, y: LazyBuffer) -> LazyBuffer:
    """x.alu(op, y) for operands of one shape, dtype and device and an op of their dtype: every eager + - * / (alu's arguments, checks
    and dtype rules cost 0.3 us an op)."""
    return LazyBuffer(x.device, x.st if x._base is None and x.op is not _CONST else ShapeTracker.from_shape(x.shape), x.dtype, op, None, (x, y))

  def cast(self, dtype: DType, bitcast: bool = False) -> LazyBuffer:
    if dtype == self.dtype: return self
    return self.alu(UnaryOps.BITCAST if bitcast else UnaryOps.CAST, arg=dtype)

  def reduce(self, op: ReduceOps, axis: tuple[int, ...]) -> LazyBuffer:
    """Reduce over `axis`, keeping each reduced dim as size 1."""
    new_shape = tuple(1 if i in axis else s for i, s in enumerate(self.shape))
    if new_shape == self.shape: return self
    if all_int(self.shape) and (split := _reduce_split(self.shape, axis) or self._split_k(op, axis)) is not None:
      # a long reduce into few outputs runs as two: first each of `parts` chunks of the longest reduced dim (many outputs,
      # which GPU work-groups and CPU threads share), then the partial results
      dim, parts = split
      split_shape = self.shape[:dim] + (parts, self.shape[dim] // parts) + self.shape[dim + 1:]
      order = (dim,) + tuple(i for i in range(len(split_shape)) if i != dim)  # the parts outermost in the partial results' memory
      first_axes = tuple(order.index(a + (a >= dim)) for a in axis)
      partial = self.reshape(split_shape).permute(order).reduce(op, first_axes).permute(tuple(order.index(i) for i in range(len(order))))
      return partial.reshape(new_shape[:dim] + (parts,) + new_shape[dim + 1:]).reduce(op, (dim,))
    return LazyBuffer(self.device, ShapeTracker.from_shape(new_shape), self.dtype, op, axis, (self,))

  def _split_k(self, op: ReduceOps, axis: tuple[int, ...]) -> tuple[int, int] | None:
    """(dim, parts) to split a sum of products at on a GPU, or None: one with too many outputs for a work-group each (GROUP) and
    too few for the GPU's matmul tiles, with a long reduce (a weight gradient over 4096 tokens into 512 x 512, a conv's over the
    batch and the image), in as few parts of the longest reduced dim as make SPLIT_K_OUTPUTS outputs, each of SPLIT_K_MIN products
    or more (so the staged and tensor-core plans still apply). On a CPU, the split for the cache instead (_cache_split), unless PACK=0
    (attention's matmuls)."""
    if op is not ReduceOps.SUM or self._base is not None or self.op is not BinaryOps.MUL: return None
    per_output = prod(self.shape[a] for a in axis)
    if not Device[self.device].target.has_local: return _cache_split(self, axis, per_output) if PACK else None
    # attention's probabilities: the parts' view of them is no nesting (rule 10). Not a CPU's guard: there the operand is mostly stored
    # anyway (a GPT's MLP hidden layer, read by the forward too), and attention builds its matmuls with PACK=0
    if any(_reads_a_product(src) for src in self.srcs): return None
    if per_output < 2 * SPLIT_K_MIN or not SPLIT_K_MIN_OUTPUTS <= (outputs := prod(self.shape) // per_output) < SPLIT_K_OUTPUTS: return None
    def fits(dim: int) -> list[int]:
      return [d for d in range(2, self.shape[dim] + 1) if self.shape[dim] % d == 0 and per_output // d >= SPLIT_K_MIN]
    # the outermost reduced dim where it makes enough parts: what is left of each part reduces in one run (a weight gradient over
    # (batch, tokens) splits the batch, each part's tokens one loop); else the longest, in as many parts as make enough or fit
    outer = min(a for a in axis if self.shape[a] > 1)
    if (parts := next((d for d in fits(outer) if outputs * d >= SPLIT_K_OUTPUTS), None)) is not None: return outer, parts
    longest = fits(dim := max(axis, key=lambda a: self.shape[a]))
    return (dim, next((d for d in longest if outputs * d >= SPLIT_K_OUTPUTS), longest[-1])) if longest else None

  def contiguous(self) -> LazyBuffer:
    """This value in its own contiguous memory: a plain base that is stored anyway (a realized buffer, a load op) is itself; any other
    value is stored by a kernel (schedule.py rule 5), which also keeps it out of its readers' kernels."""
    if self._base is None and (self.realized is not None or (isinstance(self.op, LoadOps) and self.op is not LoadOps.CONST)): return self
    return LazyBuffer.loadop(LoadOps.CONTIGUOUS, self.shape, self.dtype, self.device, srcs=(self,))

  def assign(self, value: LazyBuffer) -> LazyBuffer:
    """`value` written into this buffer's memory when realized (this must be a realized base of the same shape and dtype)."""
    assert self._base is None and self.realized is not None, f"assign needs a realized base as its target, not {self}"
    assert value.shape == self.shape and value.dtype == self.dtype, f"assign of {value.shape} {value.dtype} into {self.shape} {self.dtype}"
    return LazyBuffer.loadop(LoadOps.ASSIGN, self.shape, self.dtype, self.device, srcs=(value, self))

  def copy_to_device(self, device: str) -> LazyBuffer:
    if device == self.device: return self
    return LazyBuffer.loadop(LoadOps.COPY, self.shape, self.dtype, device, srcs=(self.contiguous(),))

  # ---- movement: views ----
  def _view(self, st: ShapeTracker) -> LazyBuffer:
    if st.shape == self.base.shape and st.contiguous: return self.base
    return LazyBuffer(self.device, st, self.dtype, base=self.base)
  def reshape(self, shape: tuple[int, ...]) -> LazyBuffer: return self if shape == self.shape else self._view(self.st.reshape(shape))
  def permute(self, order: tuple[int, ...]) -> LazyBuffer: return self if order == tuple(range(len(order))) else self._view(self.st.permute(order))
  def expand(self, shape: tuple[int, ...]) -> LazyBuffer: return self if shape == self.shape else self._view(self.st.expand(shape))
  def pad(self, padding: tuple[tuple[int, int], ...]) -> LazyBuffer:
    return self if all(p == (0, 0) for p in padding) else self._view(self.st.pad(padding))
  def shrink(self, bounds: tuple[tuple[int, int], ...]) -> LazyBuffer:
    return self if all(b == (0, s) for b, s in zip(bounds, self.shape)) else self._view(self.st.shrink(bounds))
  def stride(self, steps: tuple[int, ...]) -> LazyBuffer: return self if all(s == 1 for s in steps) else self._view(self.st.stride(steps))

# what every eager op compares with, as module names: in Python 3.11 reading an enum's member from its class (LoadOps.CONST) is a Python
# call (EnumType.__getattr__ makes the class's attribute reads go through Python), 0.07 us; ten such reads were 1.1 us of an eager realize
_CASTS, _COMPARISONS, _CONST = {UnaryOps.CAST, UnaryOps.BITCAST}, {BinaryOps.CMPLT, BinaryOps.CMPEQ}, LoadOps.CONST
@functools.lru_cache(maxsize=None)
def _scalar_view(shape: tuple[int, ...]) -> ShapeTracker: return ShapeTracker.from_shape(()).reshape((1,) * len(shape)).expand(shape)

REDUCE_SPLIT_THRESHOLD = 32768  # elements per output from which a reduce is split in two
MAX_SPLIT_PARTS = 4096  # measured on the H200 at 64M: 4096 parts of 16384 read at 97% of copy bandwidth, 1024 of 65536 at 88%
SPLIT_K_MIN_OUTPUTS = 16384  # fewer outputs of a sum of products: each is a work-group of its own (GROUP, codegen/heuristic.py)
SPLIT_K_OUTPUTS = 1 << 21  # outputs of a split sum of products: 2M fill the H200's 132 SMs twice with 64 x 128 output tiles
SPLIT_K_MIN = 256  # products per output and part

def _reduce_split(shape: tuple[int, ...], axis: tuple[int, ...]) -> tuple[int, int] | None:
  """(dim, parts) to split a long reduce into few outputs at, or None: the longest reduced dim, in as many parts (at most
  MAX_SPLIT_PARTS, at most the square root of its size, at least 16) as divide it."""
  per_output = prod(shape[a] for a in axis)
  if per_output < REDUCE_SPLIT_THRESHOLD or prod(shape) // per_output >= 1024: return None
  dim = max(axis, key=lambda a: shape[a])
  parts = next((d for d in range(min(MAX_SPLIT_PARTS, math.isqrt(shape[dim])), 15, -1) if shape[dim] % d == 0), None)
  return None if parts is None else (dim, parts)

# A CPU's sum of products reduced over CPU_SPLIT_K_REDUCE or more, whose operands' rows along the reduce hold more than CPU_SPLIT_K_BYTES,
# runs in parts that each read at most that (a weight gradient over 2048 tokens, 128 x 512: 5.2 MB), so each part's operands stay in a
# core's L2 (2 MB here) while its register tiles walk them, as BLAS blocks K; each part CPU_SPLIT_K_MIN products or more. 2-core
# AVX-512 guest, GFLOP/s of the fastest of 31 runs, whole -> split: 512x128 over 2048 147 -> 189 (8 parts; 4 ran 230), 128x512
# 159 -> 198, 384x128 171 -> 202 (4), 128x128 87 -> 165 (2)
CPU_SPLIT_K_REDUCE, CPU_SPLIT_K_BYTES, CPU_SPLIT_K_MIN = 1024, 1 << 20, 256

def _cache_split(product: LazyBuffer, axis: tuple[int, ...], per_output: int) -> tuple[int, int] | None:
  """(dim, parts) to split a CPU's long sum of products at (CPU_SPLIT_K_BYTES), or None: a matmul's (each operand read again along an
  output dim), at the outermost reduced dim that has such a number of parts (a weight gradient over (batch, tokens) splits the
  batch), else the longest; the fewest parts that fit."""
  if per_output < CPU_SPLIT_K_REDUCE: return None
  outer = [[(size, stride) for dim, (size, stride) in enumerate(zip(src.shape, src.st.real_strides())) if dim not in axis] for src in product.srcs]
  # a matmul's operands are each read again along an output dim (broadcast); a sum of an elementwise product reads each element once
  if not all(any(stride == 0 and size > 1 for size, stride in dims) for dims in outer): return None
  row = sum(prod(size for size, stride in dims if stride != 0) for dims in outer)  # the operands' elements a step of the reduce: M + N
  if (total := per_output * row * product.dtype.itemsize) <= CPU_SPLIT_K_BYTES: return None
  def fitting(dim: int) -> int | None:
    return next((d for d in range(2, product.shape[dim] + 1) if product.shape[dim] % d == 0 and total // d <= CPU_SPLIT_K_BYTES
                 and per_output // d >= CPU_SPLIT_K_MIN), None)
  for dim in (min(a for a in axis if product.shape[a] > 1), max(axis, key=lambda a: product.shape[a])):
    if (parts := fitting(dim)) is not None: return dim, parts
  return None

NESTED_MAX = 128  # a contraction's products (and lanes) that a kernel reading it may compute in its own loops (schedule rule 10)

def _reads_a_product(buf: LazyBuffer, limit: int = 64) -> bool:
  """Whether a value's elementwise ops (up to `limit` of them, each once: the scores reach attention's weights through the max and
  directly) read an unrealized sum of NESTED_MAX or fewer products of operands all read through an expand (attention's scores), which
  rule 10 computes in the reader's loops; a longer one is stored by its own kernel."""
  stack, seen = [buf.base], set[LazyBuffer]()
  while stack and len(seen) < limit:
    if (node := stack.pop()) in seen: continue
    seen.add(node)
    if node.realized is not None or node.op is None or isinstance(node.op, LoadOps): continue
    if isinstance(node.op, ReduceOps):
      product = node.srcs[0].base
      if product.op is BinaryOps.MUL and prod(product.shape[axis] for axis in node.arg) <= NESTED_MAX and all(
          any(st == 0 and size > 1 for view in src.st.views for st, size in zip(view.strides, view.shape)) for src in product.srcs):
        return True
    else: stack.extend(src.base for src in node.srcs)
  return False
