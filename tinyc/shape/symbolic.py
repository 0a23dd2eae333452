"""Layer 2 (shape): integer index expressions with [min, max] bounds, simplified as they are built. Imports tinyc.helpers and the stdlib.
`//` and `%` follow Python floor semantics. DivNode/ModNode only ever wrap a numerator with min >= 0 (a negative one is first shifted up
by a multiple of the divisor), so C's truncating `/` and `%` give the same values when rendered."""
from __future__ import annotations
import functools, math
from typing import Any, Callable, Mapping, Sequence
from tinyc.helpers import dedup, partition

class Node:
  """An integer expression; `min` and `max` are inclusive bounds. Immutable; equal (and hashed) by structure."""
  min: int
  max: int

  def render(self, ops: Mapping[type, Callable[..., Any]] | None = None, ctx: Any = None) -> Any:
    ops = render_c if ops is None else ops
    return ops[type(self)](self, ops, ctx)
  def vars(self) -> set[Variable]: return set()
  def substitute(self, mapping: Mapping[Variable, Node | int]) -> Node: raise NotImplementedError(type(self).__name__)
  @functools.cached_property
  def key(self) -> str: return self.render(ctx="DEBUG")
  def __repr__(self) -> str: return f"<{self.key}>"
  def __hash__(self) -> int: return hash(self.key)
  def __eq__(self, other: object) -> bool: return isinstance(other, Node) and not isinstance(other, NumNode) and self.key == other.key
  def __bool__(self) -> bool: return not (self.min == self.max == 0)

  def __neg__(self) -> Node: return self * -1
  def __add__(self, other: Node | int) -> Node: return Node.sum([self, other])
  def __radd__(self, other: int) -> Node: return Node.sum([other, self])
  def __sub__(self, other: Node | int) -> Node: return Node.sum([self, -other])
  def __rsub__(self, other: int) -> Node: return Node.sum([other, -self])
  def __lt__(self, other: Node | int) -> Node: return create_lt_node(self, other)  # type: ignore[override]
  def __le__(self, other: Node | int) -> Node: return create_lt_node(self, other + 1)  # type: ignore[override]
  def __gt__(self, other: Node | int) -> Node: return create_lt_node(-self, -other)  # type: ignore[override]
  def __ge__(self, other: Node | int) -> Node: return create_ge_node(self, other)  # type: ignore[override]

  def __mul__(self, other: Node | int) -> Node:
    if isinstance(other, NumNode): other = other.b
    if isinstance(other, Node): return create_node(MulNode(self, other))  # Node*Node: kept as is, no rules apply
    if other == 0: return NumNode(0)
    return self if other == 1 else self._mul(other)
  def __rmul__(self, other: int) -> Node: return self * other
  def _mul(self, b: int) -> Node: return create_node(MulNode(self, b))

  def __floordiv__(self, other: Node | int, factoring_allowed: bool = True) -> Node:
    if isinstance(other, NumNode): other = other.b
    if isinstance(other, Node):
      if self == other: return NumNode(1)
      if self.min >= 0 and (other - self).min > 0: return NumNode(0)
      raise TypeError(f"{self} // {other}: division by a non-constant Node is not supported")
    assert other != 0, f"division by zero: {self} // 0"
    if other < 0: return (-self).__floordiv__(-other, factoring_allowed)
    return self if other == 1 else self._floordiv(other, factoring_allowed)
  def __rfloordiv__(self, other: int) -> Node: return NumNode(other) // self
  def _floordiv(self, b: int, factoring_allowed: bool) -> Node:
    if self.min < 0:  # make the numerator nonnegative: x//b == (x - k*b)//b + k; no factoring again, or sums would cycle
      offset = self.min // b
      return Node.__floordiv__(self - offset * b, b, False) + offset
    return create_node(DivNode(self, b))

  def __mod__(self, other: Node | int) -> Node:
    if isinstance(other, NumNode): other = other.b
    if isinstance(other, Node):
      if self == other: return NumNode(0)
      if self.min >= 0 and (other - self).min > 0: return self
      raise TypeError(f"{self} % {other}: modulo by a non-constant Node is not supported")
    assert other > 0, f"modulo needs a positive divisor: {self} % {other}"
    if other == 1: return NumNode(0)
    if self.min >= 0 and self.max < other: return self
    if self.min // other == self.max // other: return self - other * (self.min // other)
    if self.min < 0: return (self - (self.min // other) * other) % other
    return self._mod(other)
  def __rmod__(self, other: int) -> Node: return NumNode(other) % self
  def _mod(self, b: int) -> Node: return create_node(ModNode(self, b))

  @staticmethod
  def sum(nodes: Sequence[Node | int]) -> Node:
    """Flatten nested sums, add up constants and collect like terms (x*2 + x*3 -> x*5)."""
    constant, coefficients = 0, dict[Node, int]()
    for node in nodes:
      for term in (node.nodes if isinstance(node, SumNode) else [node]):
        if isinstance(term, int): constant += term
        elif isinstance(term, NumNode): constant += term.b
        elif isinstance(term, MulNode) and isinstance(term.b, int): coefficients[term.a] = coefficients.get(term.a, 0) + term.b
        else: coefficients[term] = coefficients.get(term, 0) + 1
    terms = [node * coefficient for node, coefficient in coefficients.items() if coefficient != 0]
    if constant != 0: terms.append(NumNode(constant))
    if not terms: return NumNode(0)
    return terms[0] if len(terms) == 1 else create_node(SumNode(terms))

  @staticmethod
  def ands(nodes: Sequence[Node | int]) -> Node:
    """Logical AND of 0/1 conditions: flattens nested ands, drops always-true terms, and is 0 if any term is always 0."""
    flat: list[Node] = []
    for node in nodes:
      node = NumNode(node) if isinstance(node, int) else node
      flat.extend(node.nodes if isinstance(node, AndNode) else [node])
    if any(node.min == node.max == 0 for node in flat): return NumNode(0)
    undecided = dedup(node for node in flat if node.min <= 0 <= node.max)
    if not undecided: return NumNode(1)
    return undecided[0] if len(undecided) == 1 else AndNode(undecided)

class NumNode(Node):
  """An integer constant."""
  def __init__(self, b: int) -> None:
    assert isinstance(b, int), f"NumNode needs an int, got {b!r}"
    self.b, self.min, self.max = int(b), int(b), int(b)
  def substitute(self, mapping: Mapping[Variable, Node | int]) -> Node: return self
  def __eq__(self, other: object) -> bool:
    if isinstance(other, int): return self.b == other
    return isinstance(other, NumNode) and self.b == other.b
  def __hash__(self) -> int: return hash(self.b)
  def __mul__(self, other: Node | int) -> Node: return NumNode(self.b * other) if isinstance(other, int) else other * self.b
  def _floordiv(self, b: int, factoring_allowed: bool) -> Node: return NumNode(self.b // b)
  def _mod(self, b: int) -> Node: return NumNode(self.b % b)

class Variable(Node):
  """A named integer in [min, max]: an index variable, or a symbolic dimension (bound to its value by `bind`, for a shape). One with
  min == max is just that number."""
  def __new__(cls, expr: str, min: int, max: int) -> Any:
    assert 0 <= min <= max, f"invalid Variable {expr}: needs 0 <= min <= max, got [{min}, {max}]"
    return NumNode(min) if min == max else super().__new__(cls)
  def __init__(self, expr: str, min: int, max: int) -> None:
    self.expr, self.min, self.max = expr, min, max
    self.val: int | None = None  # the value of a bound Variable (part of its key: the same Variable bound otherwise is another Node)
  def __getnewargs__(self) -> tuple[str, int, int]: return (self.expr, self.min, self.max)
  def vars(self) -> set[Variable]: return {self}
  def bind(self, value: int) -> Variable:
    """This Variable bound to `value`, a copy (the Variable itself stays unbound): a dimension of that size, named by the Variable."""
    if not isinstance(value, int) or not self.min <= value <= self.max:
      raise ValueError(f"cannot bind {value!r} to Variable {self.expr}: it takes ints in [{self.min}, {self.max}]")
    bound = Variable(self.expr, self.min, self.max)
    bound.val = value
    return bound
  def unbind(self) -> tuple[Variable, int]:
    assert self.val is not None, f"Variable {self.expr} is not bound"
    return Variable(self.expr, self.min, self.max), self.val
  def substitute(self, mapping: Mapping[Variable, Node | int]) -> Node:
    value = mapping.get(self, self)
    return NumNode(value) if isinstance(value, int) else value

def create_node(node: Node) -> Node:
  """`node`, or its value as a NumNode when its bounds pin it down."""
  assert node.min <= node.max, f"min {node.min} > max {node.max} building {type(node).__name__}"
  return NumNode(node.min) if node.min == node.max else node

class OpNode(Node):
  """A binary node `a op b`; `b` is an int (or, for Mul and Lt, a Node)."""
  def __init__(self, a: Node, b: Node | int) -> None:
    self.a, self.b = a, b
    self.min, self.max = self.get_bounds()
  def get_bounds(self) -> tuple[int, int]: raise NotImplementedError(type(self).__name__)
  def vars(self) -> set[Variable]: return self.a.vars() | (self.b.vars() if isinstance(self.b, Node) else set())
  def _sub_b(self, mapping: Mapping[Variable, Node | int]) -> Node | int: return self.b.substitute(mapping) if isinstance(self.b, Node) else self.b

class MulNode(OpNode):
  def get_bounds(self) -> tuple[int, int]:
    if isinstance(self.b, int): return (self.a.min * self.b, self.a.max * self.b) if self.b >= 0 else (self.a.max * self.b, self.a.min * self.b)
    corners = [x * y for x in (self.a.min, self.a.max) for y in (self.b.min, self.b.max)]
    return min(corners), max(corners)
  def substitute(self, mapping: Mapping[Variable, Node | int]) -> Node: return self.a.substitute(mapping) * self._sub_b(mapping)
  def _mul(self, b: int) -> Node: return self.a * (self.b * b) if isinstance(self.b, int) else Node._mul(self, b)
  def _floordiv(self, b: int, factoring_allowed: bool) -> Node:
    if isinstance(self.b, int):
      if self.b % b == 0: return self.a * (self.b // b)
      if self.b > 0 and b % self.b == 0: return self.a // (b // self.b)  # (x*2)//6 -> x//3
    return Node._floordiv(self, b, factoring_allowed)
  def _mod(self, b: int) -> Node:
    if isinstance(self.b, int) and self.b % b != self.b: return (self.a * (self.b % b)) % b  # (x*6)%4 -> (x*2)%4
    return Node._mod(self, b)

class DivNode(OpNode):
  def get_bounds(self) -> tuple[int, int]:
    assert isinstance(self.b, int) and self.b > 0 and self.a.min >= 0, f"DivNode needs numerator >= 0 and divisor > 0: {self.a}, {self.b}"
    return self.a.min // self.b, self.a.max // self.b
  def substitute(self, mapping: Mapping[Variable, Node | int]) -> Node: return self.a.substitute(mapping) // self.b
  def _floordiv(self, b: int, factoring_allowed: bool) -> Node: return self.a // (self.b * b)  # (x//a)//b -> x//(a*b)

class ModNode(OpNode):
  def get_bounds(self) -> tuple[int, int]:
    assert isinstance(self.b, int) and self.b > 0 and self.a.min >= 0, f"ModNode needs numerator >= 0 and divisor > 0: {self.a}, {self.b}"
    a, b = self.a, self.b
    wraps = a.max - a.min >= b or a.min % b > a.max % b
    return (0, b - 1) if wraps else (a.min % b, a.max % b)
  def substitute(self, mapping: Mapping[Variable, Node | int]) -> Node: return self.a.substitute(mapping) % self.b
  def _floordiv(self, b: int, factoring_allowed: bool) -> Node:
    assert isinstance(self.b, int)
    if self.b % b == 0: return (self.a // b) % (self.b // b)  # (x%8)//4 -> (x//4)%2
    return Node._floordiv(self, b, factoring_allowed)
  def _mod(self, b: int) -> Node:
    assert isinstance(self.b, int)
    return self.a % b if self.b % b == 0 else Node._mod(self, b)  # (x%8)%4 -> x%4

class LtNode(OpNode):
  """1 if a < b else 0."""
  def get_bounds(self) -> tuple[int, int]:
    if isinstance(self.b, Node) and self.a == self.b: return (0, 0)
    b_min, b_max = (self.b, self.b) if isinstance(self.b, int) else (self.b.min, self.b.max)
    return (1, 1) if self.a.max < b_min else (0, 0) if self.a.min >= b_max else (0, 1)
  def substitute(self, mapping: Mapping[Variable, Node | int]) -> Node: return create_lt_node(self.a.substitute(mapping), self._sub_b(mapping))

class RedNode(Node):
  """A node over a list of nodes (sum or logical and)."""
  def __init__(self, nodes: list[Node]) -> None:
    self.nodes = nodes
    self.min, self.max = self.get_bounds()
  def get_bounds(self) -> tuple[int, int]: raise NotImplementedError(type(self).__name__)
  def vars(self) -> set[Variable]: return set().union(*[node.vars() for node in self.nodes])

class SumNode(RedNode):
  def get_bounds(self) -> tuple[int, int]: return sum(node.min for node in self.nodes), sum(node.max for node in self.nodes)
  def substitute(self, mapping: Mapping[Variable, Node | int]) -> Node: return Node.sum([node.substitute(mapping) for node in self.nodes])
  def _mul(self, b: int) -> Node: return Node.sum([node * b for node in self.nodes])  # distribute
  def _floordiv(self, b: int, factoring_allowed: bool) -> Node:
    if not factoring_allowed: return Node._floordiv(self, b, False)
    # terms whose coefficient is a multiple of b leave the division: (x*4 + y)//4 -> x + y//4
    divided, rest, common, divisor = [], [], b, 1
    for term in self.nodes:
      coefficient = term.b if isinstance(term, (NumNode, MulNode)) and isinstance(term.b, int) else None
      if coefficient is not None and coefficient % b == 0: divided.append(term // b)
      else:
        rest.append(term)
        common = math.gcd(common, coefficient) if coefficient is not None else 1
        if isinstance(term, MulNode) and coefficient is not None and coefficient > 1 and divisor == 1 and b % coefficient == 0: divisor = coefficient
    if not divided and common == 1 and divisor == 1: return Node._floordiv(self, b, True)
    rest_sum = Node.sum(rest)
    # floor(floor(x/c)/d) == floor(x/(c*d)): divide by a common factor of the rest first
    if common > 1: return Node.sum(divided) + (rest_sum // common) // (b // common)
    if divisor > 1: return Node.sum(divided) + (rest_sum // divisor) // (b // divisor)
    return Node.sum(divided) + rest_sum // b
  def _mod(self, b: int) -> Node:
    reduced = Node.sum([NumNode(term.b % b) if isinstance(term, NumNode) else
                        term.a * (term.b % b) if isinstance(term, MulNode) and isinstance(term.b, int) else term for term in self.nodes])
    if reduced != self: return reduced % b  # (x*4 + y)%4 -> y%4
    # a coefficient over half of b is a small negative one, and the sum may then stay within one period: (x*11 + y + 9)%12 -> y - x + 9
    centered = Node.sum([term.a * (term.b - b) if isinstance(term, MulNode) and isinstance(term.b, int) and 2 * term.b > b else term
                         for term in self.nodes])
    if centered != self and centered.min // b == centered.max // b: return centered - b * (centered.min // b)
    return create_node(ModNode(self, b))

class AndNode(RedNode):
  """1 if every node is nonzero else 0."""
  def get_bounds(self) -> tuple[int, int]: return (0, 1)
  def substitute(self, mapping: Mapping[Variable, Node | int]) -> Node: return Node.ands([node.substitute(mapping) for node in self.nodes])

def create_lt_node(lhs: Node, b: Node | int) -> Node:
  """`lhs < b` as a node, simplified: constants move right, common factors divide out; NumNode(0/1) when the bounds decide it."""
  if isinstance(b, NumNode): b = b.b
  if isinstance(b, Node): return create_node(LtNode(lhs, b))
  if isinstance(lhs, SumNode):
    constants, terms = partition(lhs.nodes, lambda node: isinstance(node, NumNode))
    b -= sum(node.min for node in constants)
    lhs = Node.sum(terms)
    if isinstance(lhs, SumNode):
      # g*K + r < b with b and every mul coefficient divisible by g, and 0 <= r < g, is exactly K < b//g; g*K < b alone is K < ceil(b/g)
      muls, others = partition(lhs.nodes, lambda node: isinstance(node, MulNode) and isinstance(node.b, int) and node.b > 0)
      if muls and not others and (common := functools.reduce(math.gcd, [node.b for node in muls])) > 1:  # type: ignore[attr-defined]
        lhs, b = Node.sum([node // common for node in muls]), -(-b // common)
      elif muls:
        common = functools.reduce(math.gcd, [node.b for node in muls], b)  # type: ignore[attr-defined]
        if common > 1 and (rest := Node.sum(others)).min >= 0 and rest.max < common:
          lhs, b = Node.sum([node // common for node in muls]), b // common
    if isinstance(lhs, SumNode): return create_node(LtNode(lhs, b))
    return create_lt_node(lhs, b)
  if isinstance(lhs, MulNode) and isinstance(lhs.b, int) and lhs.b != -1:  # x*c < b -> x < ceil(b/c), and -x < ceil(b/|c|) for c < 0
    return create_lt_node(lhs.a * (1 if lhs.b > 0 else -1), -(-b // abs(lhs.b)))
  if isinstance(lhs, DivNode): return create_lt_node(lhs.a, b * lhs.b)  # x//d < b  <->  x < b*d
  return create_node(LtNode(lhs, b))

def create_ge_node(lhs: Node, b: Node | int) -> Node:
  """`lhs >= b` as a node, written -lhs < 1-b."""
  return create_lt_node(-lhs, -b + 1)

sint = int | Node  # a size: an int, or a Node of Variables (a symbolic dimension)

def sym_max(value: sint) -> int: return value if isinstance(value, int) else value.max
def sym_min(value: sint) -> int: return value if isinstance(value, int) else value.min
def sym_int(value: sint) -> sint: return value.b if isinstance(value, NumNode) else value
def bound_values(value: sint) -> dict[Variable, int]:
  """The bound Variables in `value`, each with its value."""
  return {} if isinstance(value, int) else {var: var.val for var in value.vars() if var.val is not None}

def replace_subtree(node: Node, target: Node, replacement: Node) -> Node:
  """`node` with each occurrence of the subtree `target` replaced, rebuilt through the simplifying constructors."""
  if node == target: return replacement
  def again(child: Node) -> Node: return replace_subtree(child, target, replacement)
  def operand(b: Node | int) -> Node | int: return again(b) if isinstance(b, Node) else b
  if isinstance(node, MulNode): return again(node.a) * operand(node.b)
  if isinstance(node, DivNode): return again(node.a) // node.b
  if isinstance(node, ModNode): return again(node.a) % node.b
  if isinstance(node, LtNode): return create_lt_node(again(node.a), operand(node.b))
  if isinstance(node, SumNode): return Node.sum([again(n) for n in node.nodes])
  if isinstance(node, AndNode): return Node.ands([again(n) for n in node.nodes])
  return node

def simplify_given_valid(idx: Node, valid: Node) -> Node:
  """`idx` simplified where `valid` holds: each clause `expr < c` (expr >= 0) bounds expr by c - 1, which can fold the divs
  and mods that stacked views leave (e.g. `(i*26 + j) // 81` is 0 wherever `i*26 + j < 81`). Only for gated accesses."""
  clauses = valid.nodes if isinstance(valid, AndNode) else [valid]
  bounded = [(clause.a, clause.b) for clause in clauses if isinstance(clause, LtNode) and isinstance(clause.b, int) and clause.a.min >= 0
             and not isinstance(clause.a, (NumNode, Variable)) and clause.b - 1 < clause.a.max]
  for _ in range(3):  # a fold can expose the next clause's expression
    before = (idx, bounded)
    for number, (expr, limit) in enumerate(bounded):
      stand_in = Variable(f"valid_bound{number}", expr.min, limit - 1)
      def tighten(node: Node) -> Node: return replace_subtree(node, expr, stand_in).substitute({stand_in: expr})  # noqa: B023
      idx = tighten(idx)
      bounded = [(tighten(other) if k != number else other, other_limit) for k, (other, other_limit) in enumerate(bounded)]
    if (idx, bounded) == before: break
  return idx

def sym_render(value: Node | int, ops: Mapping[type, Callable[..., Any]] | None = None, ctx: Any = None) -> Any:
  return str(value) if isinstance(value, int) else value.render(ops, ctx)

def sym_infer(value: Node | int, var_vals: Mapping[Variable, int]) -> int:
  """Evaluate `value` with the Variables set to `var_vals` (floor semantics for // and %)."""
  return value if isinstance(value, int) else value.render(_evaluate_ops, var_vals)

def _render_sum(node: SumNode, ops: Mapping[type, Callable[..., Any]], ctx: Any) -> str:
  return "(" + "+".join(sorted(child.render(ops, ctx) for child in node.nodes)) + ")"

# The default table renders C; ctx="DEBUG" also shows Variable bounds and gives the structural key used for equality.
render_c: dict[type, Callable[..., Any]] = {
  Variable: lambda node, ops, ctx: f"{node.expr}[{node.min}-{node.max}{'' if node.val is None else f'={node.val}'}]" if ctx == "DEBUG" else node.expr,
  NumNode: lambda node, ops, ctx: str(node.b),
  MulNode: lambda node, ops, ctx: f"({node.a.render(ops, ctx)}*{sym_render(node.b, ops, ctx)})",
  DivNode: lambda node, ops, ctx: f"({node.a.render(ops, ctx)}{'//' if ctx == 'DEBUG' else '/'}{node.b})",
  ModNode: lambda node, ops, ctx: f"({node.a.render(ops, ctx)}%{node.b})",
  LtNode: lambda node, ops, ctx: f"({node.a.render(ops, ctx)}<{sym_render(node.b, ops, ctx)})",
  SumNode: _render_sum,
  AndNode: lambda node, ops, ctx: "(" + "&&".join(sorted(child.render(ops, ctx) for child in node.nodes)) + ")",
}

def _infer(value: Node | int, ops: Mapping[type, Callable[..., Any]], var_vals: Mapping[Variable, int]) -> int:
  return value if isinstance(value, int) else value.render(ops, var_vals)

_evaluate_ops: dict[type, Callable[..., int]] = {
  Variable: lambda node, ops, var_vals: var_vals[node] if node in var_vals else node.val,
  NumNode: lambda node, ops, var_vals: node.b,
  MulNode: lambda node, ops, var_vals: node.a.render(ops, var_vals) * _infer(node.b, ops, var_vals),
  DivNode: lambda node, ops, var_vals: node.a.render(ops, var_vals) // node.b,
  ModNode: lambda node, ops, var_vals: node.a.render(ops, var_vals) % node.b,
  LtNode: lambda node, ops, var_vals: int(node.a.render(ops, var_vals) < _infer(node.b, ops, var_vals)),
  SumNode: lambda node, ops, var_vals: sum(child.render(ops, var_vals) for child in node.nodes),
  AndNode: lambda node, ops, var_vals: int(all(child.render(ops, var_vals) for child in node.nodes)),
}
