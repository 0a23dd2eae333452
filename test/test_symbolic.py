"""Symbolic index expressions: simplification rules, bounds, rendering, and a fuzz test against plain Python integers."""
from __future__ import annotations
import itertools, random
from typing import Callable
import pytest
from tinyc.helpers import getenv
from tinyc.shape.symbolic import (AndNode, DivNode, LtNode, ModNode, MulNode, Node, NumNode, SumNode, Variable, create_ge_node, create_lt_node,
                                  render_c, sym_infer)

x, y, z = Variable("x", 0, 9), Variable("y", 0, 3), Variable("z", 0, 7)

def assert_render(node: Node | int, expected: str) -> None:
  assert isinstance(node, Node), f"{node!r} is not a Node"
  assert node.render() == expected, f"{node.render()} != {expected}"

class TestSimplify:
  def test_identities(self):
    assert x * 1 is x and (x * 0) == 0 and (x + 0) == x and x // 1 is x and (x % 1) == 0 and (x - x) == 0
  def test_mul_of_mul_and_distribute(self):
    assert_render((x * 2) * 3, "(x*6)")
    assert_render((x + y) * 3, "((x*3)+(y*3))")
    assert_render(-(x + 2), "((x*-1)+-2)")
  def test_collect_like_terms(self):
    assert_render(x * 2 + x * 3, "(x*5)")
    assert_render(x + 3 + y + 4 - x, "(7+y)")
    assert_render(x * 2 + 1 + (x * -2), "1")
  def test_div_factors_out_multiples(self):
    assert (x * 4 + y) // 4 == x  # y//4 is 0 since 0 <= y < 4
    assert_render((x * 4 + z) // 4, "((z/4)+x)")
    assert ((x * 8 + z * 2) // 4) == (x * 2 + z // 2)
    assert_render((x * 6 + 3) // 3, "((x*2)+1)")
  def test_div_mod_bounds(self):
    assert x // 10 == 0 and x % 10 == x and (x + 10) % 10 == x and (x + 20) // 10 == 2
    assert ((x * 4 + y) % 4) == y and ((x * 4 + z) % 4) == z % 4
  def test_nested_div_and_mod(self):
    assert (x // 2) // 3 == x // 6
    assert (z % 8) == z and ((x % 8) % 4) == x % 4 and ((x % 8) // 4) == (x // 4) % 2
    assert_render((x * 2) // 6, "(x/3)")
    assert_render((x * 6) % 4, "((x*2)%4)")
  def test_mod_of_a_coefficient_just_under_the_divisor(self):
    # 11z = 12z - z: (11z + y + 7) % 12 is y - z + 7, which stays in [0, 12) (a flipped row of a sliding window: a causal mask)
    assert ((z * 11 + y + 7) % 12) == y - z + 7
    assert isinstance((x * 11 + y + 5) % 12, ModNode)  # y - x + 5 spans [-4, 8]: two periods, still a mod
    for a, b in itertools.product(range(10), range(4)): assert sym_infer((x * 11 + y + 5) % 12, {x: a, y: b}) == (11 * a + b + 5) % 12
  def test_negative_numerator_is_floor(self):
    # x - 5 spans [-5, 4]: Node // and % use Python floor semantics; the DivNode inside has a nonnegative numerator
    node = (x - 5) // 3
    for value in range(10): assert sym_infer(node, {x: value}) == (value - 5) // 3
    for value in range(10): assert sym_infer((x - 5) % 3, {x: value}) == (value - 5) % 3
    assert all_div_mod_numerators_nonnegative(node)
  def test_bounds(self):
    node = x * 3 + y - 2
    assert (node.min, node.max) == (-2, 28)
    assert ((x % 4).min, (x % 4).max) == (0, 3) and ((x // 4).min, (x // 4).max) == (0, 2)
    assert ((x * -2).min, (x * -2).max) == (-18, 0)
  def test_lt_ge(self):
    assert create_lt_node(x, 10) == 1 and create_lt_node(x, 0) == 0 and create_ge_node(x, 0) == 1 and create_ge_node(x, 10) == 0
    assert_render(create_lt_node(x, 5), "(x<5)")
    assert_render(create_lt_node(x * 4 + y, 8), "(x<2)")  # 4x + y < 8 with 0 <= y < 4  <->  x < 2
    assert_render(create_lt_node(x + 3, 5), "(x<2)")
    assert_render(create_lt_node(x * 3, 7), "(x<3)")
    assert_render(create_lt_node(x // 4, 2), "(x<8)")
  def test_ands(self):
    assert Node.ands([x < 5, NumNode(0)]) == 0 and Node.ands([NumNode(1), NumNode(1)]) == 1
    assert Node.ands([x < 5, NumNode(1)]) == (x < 5)
    both = Node.ands([x < 5, Node.ands([y < 2, x < 5])])
    assert isinstance(both, AndNode) and len(both.nodes) == 2
    assert_render(both, "((x<5)&&(y<2))")
  def test_variable_min_max_equal_is_number(self):
    assert isinstance(Variable("a", 3, 3), NumNode) and Variable("a", 3, 3) == 3

class TestNodeBasics:
  def test_hash_eq_dict_keys(self):
    assert Variable("x", 0, 9) == x and hash(Variable("x", 0, 9)) == hash(x) and Variable("x", 0, 8) != x
    assert (x * 4 + y) == (y + x * 4)  # sums compare independent of term order
    table = {x * 2 + 1: "a", y: "b"}
    assert table[1 + x * 2] == "a" and table[Variable("y", 0, 3)] == "b"
  def test_render_c(self):
    gidx0, ridx1 = Variable("gidx0", 0, 9), Variable("ridx1", 0, 3)
    assert_render(gidx0 * 4 + ridx1, "((gidx0*4)+ridx1)")
    assert_render((gidx0 * 4 + ridx1) // 3, "(((gidx0*4)+ridx1)/3)")
    assert_render(gidx0 % 3, "(gidx0%3)")
    assert_render(Node.ands([gidx0 < 5, ridx1 < 2]), "((gidx0<5)&&(ridx1<2))")
  def test_custom_ops_table(self):
    counts: dict[str, int] = {}
    def visit(name: str, render: Callable) -> Callable:
      def fn(node, ops, ctx):
        counts[name] = counts.get(name, 0) + 1
        return render(node, ops, ctx)
      return fn
    ops = {typ: visit(typ.__name__, fn) for typ, fn in render_c.items()}
    assert (x * 4 + y // 2).render(ops) == "((x*4)+(y/2))"
    assert counts == {"SumNode": 1, "MulNode": 1, "DivNode": 1, "Variable": 2}
  def test_vars_and_substitute(self):
    node = x * 4 + y // 2 + (z < 3)
    assert node.vars() == {x, y, z}
    assert node.substitute({x: NumNode(2), y: NumNode(3), z: NumNode(1)}) == 10
    partial = node.substitute({z: NumNode(5)})
    assert partial.vars() == {x, y} and partial == x * 4 + y // 2
    assert (x * 4 + y).substitute({x: y}) == y * 5
  def test_sym_infer(self):
    assert sym_infer(7, {}) == 7
    assert sym_infer(x * 4 + y % 3, {x: 2, y: 5}) == 10
    assert sym_infer(Node.ands([x < 5, y >= 1]), {x: 4, y: 1}) == 1 and sym_infer(Node.ands([x < 5, y >= 1]), {x: 4, y: 0}) == 0

def all_div_mod_numerators_nonnegative(node: Node) -> bool:
  """DivNode/ModNode must only wrap nonnegative numerators, so C's truncating / and % agree with floor semantics."""
  if isinstance(node, (DivNode, ModNode)) and node.a.min < 0: return False
  children = [node.a] + ([node.b] if isinstance(node.b, Node) else []) if isinstance(node, (MulNode, DivNode, ModNode, LtNode)) else \
    node.nodes if isinstance(node, (SumNode, AndNode)) else []
  return all(all_div_mod_numerators_nonnegative(child) for child in children)

# ***** fuzz: random expression trees, simplified as they are built, against the same tree evaluated on Python ints *****

FUZZ_VARIABLES = [Variable("a", 0, 7), Variable("b", 0, 5), Variable("c", 2, 6)]
Expr = tuple[Node, Callable[[dict], int]]  # (node, evaluate the unsimplified expression on a {Variable: int} assignment)

def random_expr(rng: random.Random, depth: int) -> Expr:
  if depth == 0 or rng.random() < 0.2:
    if rng.random() < 0.25:
      value = rng.randint(-8, 8)
      return NumNode(value), lambda env, value=value: value
    variable = rng.choice(FUZZ_VARIABLES)
    return variable, lambda env, variable=variable: env[variable]
  op = rng.choice(["add", "sub", "mul", "div", "mod", "neg", "lt", "ge", "and", "add_int"])
  left, left_eval = random_expr(rng, depth - 1)
  if op in ("add", "sub", "and"):
    right, right_eval = random_expr(rng, depth - 1)
    if op == "add": return left + right, lambda env: left_eval(env) + right_eval(env)
    if op == "sub": return left - right, lambda env: left_eval(env) - right_eval(env)
    # ands is a logical AND of 0/1 conditions (a lone non-boolean term is returned as is), so AND two comparisons
    left_limit, right_limit = rng.randint(-4, 12), rng.randint(-4, 12)
    return Node.ands([create_lt_node(left, left_limit), create_ge_node(right, right_limit)]), \
      lambda env: int(left_eval(env) < left_limit and right_eval(env) >= right_limit)
  if op == "neg": return -left, lambda env: -left_eval(env)
  number = rng.choice([1, 2, 3, 4, 5, 6, 8, 16]) * (rng.choice([1, -1]) if op in ("mul", "add_int", "lt", "ge") else 1)
  if op == "mul": return left * number, lambda env: left_eval(env) * number
  if op == "add_int": return left + number, lambda env: left_eval(env) + number
  if op == "div": return left // number, lambda env: left_eval(env) // number  # floor division, also for negative numerators
  if op == "mod": return left % number, lambda env: left_eval(env) % number    # floor modulo: result in [0, number)
  if op == "lt": return create_lt_node(left, number), lambda env: int(left_eval(env) < number)
  return create_ge_node(left, number), lambda env: int(left_eval(env) >= number)

PYTHON_OPS = {**render_c, DivNode: lambda node, ops, ctx: f"({node.a.render(ops, ctx)}//{node.b})",
              AndNode: lambda node, ops, ctx: "int(" + " and ".join(f"bool({child.render(ops, ctx)})" for child in node.nodes) + ")"}
def python_render(node: Node) -> str:
  """The C rendering as Python (`/` becomes `//`): the same value, because every numerator of a division is nonnegative."""
  return node.render(PYTHON_OPS)

@pytest.mark.parametrize("seed", range(4))
def test_symbolic_fuzz(seed: int):
  rng = random.Random(seed)
  count = getenv("FUZZ_COUNT", 200) // 4
  assignments = [dict(zip(FUZZ_VARIABLES, values)) for values in itertools.product(*[range(v.min, v.max + 1) for v in FUZZ_VARIABLES])]
  for _ in range(count):
    node, evaluate = random_expr(rng, rng.randint(1, 4))
    assert all_div_mod_numerators_nonnegative(node), f"{node} has a DivNode/ModNode with a possibly negative numerator"
    code = compile(python_render(node), "<node>", "eval")
    for env in rng.sample(assignments, 40):
      expected, got = evaluate(env), sym_infer(node, env)
      assert got == expected, f"{node} at {env}: simplified gives {got}, expected {expected}"
      assert node.min <= got <= node.max, f"{node} at {env}: {got} outside bounds [{node.min}, {node.max}]"
      assert int(eval(code, {v.expr: value for v, value in env.items()})) == expected, f"rendered {node.render()} at {env}"
      assert node.substitute({v: NumNode(value) for v, value in env.items()}) == expected, f"substitute of {node} at {env}"

def test_simplify_given_valid_folds_carries_and_keeps_valid_lanes():
  from tinyc.shape.symbolic import simplify_given_valid, create_lt_node, Node
  i2, i3, i4, i5 = Variable("i2", 0, 25), Variable("i3", 0, 25), Variable("i4", 0, 3), Variable("i5", 0, 3)
  inner = i5 * 26 + i3
  outer = (inner // 81) + i4 * 26 + i2
  idx = (outer // 81) * 100 + (outer % 27) * 216 + (inner % 27) * 9 + (inner // 27) % 3
  valid = Node.ands([create_lt_node(inner, 81), create_lt_node(outer, 81)])
  simpler = simplify_given_valid(idx, valid)
  assert "/81" not in simpler.render()
  checked = 0
  for values in itertools.product(range(26), range(26), range(4), range(4)):
    assignment = dict(zip((i2, i3, i4, i5), values))
    if sym_infer(valid, assignment):
      assert sym_infer(simpler, assignment) == sym_infer(idx, assignment), assignment
      checked += 1
  assert checked > 1000
