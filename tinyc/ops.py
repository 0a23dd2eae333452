"""Layer 2: the primitive op enums and LazyOp, the tree a kernel is made from. Imports helpers, dtype and shape/."""
from __future__ import annotations
import functools
from dataclasses import dataclass, field
from enum import Enum, auto
from typing import Any, Callable, NamedTuple, Union
from tinyc.dtype import DType, dtypes
from tinyc.shape.shapetracker import ShapeTracker
from tinyc.shape.symbolic import Node, Variable

class OpEnum(Enum):
  """An enum of ops, hashed by identity as an object is (Enum's own hash of the name is a Python call: a graph's plan key holds
  several ops and every eager realize hashes it). Hashes differ across processes either way (str hashes are salted)."""
  __hash__ = object.__hash__

class UnaryOps(OpEnum):
  EXP2 = auto(); LOG2 = auto(); SIN = auto(); SQRT = auto(); RECIP = auto(); NEG = auto(); CAST = auto(); BITCAST = auto()  # noqa: E702
class BinaryOps(OpEnum):
  ADD = auto(); SUB = auto(); MUL = auto(); DIV = auto(); IDIV = auto(); MOD = auto(); MAX = auto()  # noqa: E702
  CMPLT = auto(); CMPEQ = auto(); AND = auto(); OR = auto(); XOR = auto()  # noqa: E702
class TernaryOps(OpEnum):
  WHERE = auto()
class ReduceOps(OpEnum):
  SUM = auto(); MAX = auto()  # noqa: E702
class MovementOps(OpEnum):
  RESHAPE = auto(); PERMUTE = auto(); EXPAND = auto(); PAD = auto(); SHRINK = auto(); STRIDE = auto()  # noqa: E702
class BufferOps(OpEnum):
  """The leaves and the root of a kernel's AST: SINK(STORE, ...) stores each of a kernel's outputs."""
  LOAD = auto(); CONST = auto(); STORE = auto(); SINK = auto()  # noqa: E702
class LoadOps(OpEnum):
  """Graph nodes that are not plain values: EMPTY allocates, CONST is a scalar, COPY moves data across devices, CONTIGUOUS
  stores srcs[0] in its own memory, ASSIGN stores srcs[0] into the buffer of srcs[1] (a realized base) in place."""
  EMPTY = auto(); CONST = auto(); COPY = auto(); CONTIGUOUS = auto(); ASSIGN = auto()  # noqa: E702

Op = Union[UnaryOps, BinaryOps, TernaryOps, ReduceOps, MovementOps, BufferOps, LoadOps]
ElementwiseOps = (UnaryOps, BinaryOps, TernaryOps)

# ops for which f(0, 0, ...) != 0: an expression containing one cannot be padded by masking its loads
UNSAFE_PAD_OPS = {UnaryOps.EXP2, UnaryOps.LOG2, UnaryOps.RECIP, BinaryOps.DIV, BinaryOps.IDIV, BinaryOps.MOD, BinaryOps.CMPEQ}

@dataclass(frozen=True)
class MemBuffer:
  """Buffer number `idx` of a kernel (the outputs first, then the inputs), read or written through `st`."""
  idx: int
  dtype: DType
  st: ShapeTracker

@dataclass(frozen=True, eq=False)
class ConstBuffer:
  """A scalar broadcast through `st` (its mask zeroes the padded area)."""
  val: Any
  dtype: DType
  st: ShapeTracker
  def __eq__(self, other: object) -> bool:
    return isinstance(other, ConstBuffer) and (const_key(self.val), self.dtype, self.st) == (const_key(other.val), other.dtype, other.st)
  def __hash__(self) -> int: return hash((const_key(self.val), self.dtype, self.st))

# What tells two constants apart: in Python -0.0 == 0.0, yet 1/-0.0 is -inf (and a NaN is not equal to itself). repr itself, not a
# function calling it: every eager realize's plan key holds one per constant.
const_key: Callable[[Any], str] = repr

@dataclass(frozen=True)
class LazyOp:
  """One node of a kernel's AST; immutable, hashed once (the AST is the key of the program caches)."""
  op: Op
  src: tuple[LazyOp, ...] = ()
  arg: Any = None
  _hash: int = field(default=0, init=False, repr=False, compare=False)
  def __post_init__(self) -> None: object.__setattr__(self, "_hash", hash((self.op, self.src, self.arg)))
  def __hash__(self) -> int: return self._hash
  def __reduce__(self) -> tuple: return LazyOp, (self.op, self.src, self.arg)  # another process hashes enums (by name) and None differently
  def __eq__(self, other: object) -> bool:
    return self is other or (isinstance(other, LazyOp) and self._hash == other._hash and self.op == other.op and self.arg == other.arg
                             and self.src == other.src)
  @functools.cached_property  # (a Winograd transform's sum of 562 loads asked it of each of its nodes: quadratic in the chain)
  def dtype(self) -> DType:
    """The dtype this node computes, following the rules every renderer uses."""
    if self.op in (BufferOps.LOAD, BufferOps.CONST, BufferOps.STORE): return self.arg.dtype
    if self.op in (UnaryOps.CAST, UnaryOps.BITCAST): return self.arg
    if self.op in (BinaryOps.CMPLT, BinaryOps.CMPEQ): return dtypes.bool
    return self.src[-1].dtype if self.op is TernaryOps.WHERE else self.src[0].dtype
  def walk(self) -> list[LazyOp]:
    """Every node of the tree once, sources before their users."""
    order: dict[LazyOp, None] = {}
    def visit(node: LazyOp) -> None:
      if node in order: return
      for s in node.src: visit(s)
      order[node] = None
    visit(self)
    return list(order)
  def map_buffers(self, fn: Any, done: dict[LazyOp, LazyOp] | None = None) -> LazyOp:
    """A copy of the tree with each LOAD/CONST/STORE arg replaced by fn(arg) (each shared subtree mapped once)."""
    done = {} if done is None else done
    if (mapped := done.get(self)) is None:
      srcs = tuple(s.map_buffers(fn, done) for s in self.src)
      done[self] = mapped = LazyOp(self.op, srcs, fn(self.arg) if self.op in BufferOps else self.arg)
    return mapped

class ScheduleItem(NamedTuple):  # a NamedTuple: an eager realize makes one per kernel, and a frozen dataclass takes 1 us to build
  """One kernel to run (or one LoadOp to perform): its AST, the buffers it writes (the SINK's STOREs in order; a LoadOp has one)
  and the buffers it reads. Its program is called with the outputs' buffers, then the inputs'."""
  ast: LazyOp
  outs: tuple[Any, ...]    # LazyBuffers (typed loosely: lazy.py sits above this layer)
  inputs: tuple[Any, ...]

def output_count(ast: LazyOp) -> int:
  """How many buffers a kernel's AST (or a LoadOp) writes: its SINK's STOREs."""
  return len(ast.src) if ast.op is BufferOps.SINK else 1

@functools.lru_cache(maxsize=4096)
def unbind_ast(ast: LazyOp) -> tuple[LazyOp, dict[Variable, int]]:
  """The AST with each bound Variable replaced by the unbound one, so one program serves every value, and their values (read-only).
  A constant may be a Node of Variables too (a value in the kernel, such as a write position)."""
  bound = {var for node in ast.walk() if node.op in (BufferOps.LOAD, BufferOps.CONST, BufferOps.STORE)
           for var in node.arg.st.vars() | (node.arg.val.vars() if isinstance(node.arg, ConstBuffer) and isinstance(node.arg.val, Node) else set())
           if var.val is not None}
  if not bound: return ast, {}
  mapping: dict[Variable, Node | int] = {var: var.unbind()[0] for var in bound}
  var_vals = {var.unbind()[0]: var.unbind()[1] for var in bound}
  if len(var_vals) != len(bound): raise ValueError(f"one kernel reads Variables bound to different values: {sorted(map(repr, bound))}")
  def unbound(buf: MemBuffer | ConstBuffer | None) -> MemBuffer | ConstBuffer | None:
    if buf is None: return None  # (the SINK)
    if isinstance(buf, MemBuffer): return MemBuffer(buf.idx, buf.dtype, buf.st.substitute(mapping))
    return ConstBuffer(buf.val.substitute(mapping) if isinstance(buf.val, Node) else buf.val, buf.dtype, buf.st.substitute(mapping))
  return ast.map_buffers(unbound), var_vals

def format_ast(node: LazyOp, depth: int = 0) -> str:
  """The AST as an indented outline, a node a line (DEBUG=3 prints each kernel's)."""
  arg = node.arg
  if isinstance(arg, (MemBuffer, ConstBuffer)):
    what = f"buf{arg.idx}" if isinstance(arg, MemBuffer) else f"const {arg.val}"
    arg = f"{what} {arg.dtype.name} {arg.st.shape} views={len(arg.st.views)}"
  lines = [f"{'  ' * depth}{node.op.name} {arg if arg is not None else ''}".rstrip()]
  lines += [format_ast(src, depth + 1) for src in node.src]
  return "\n".join(lines)
