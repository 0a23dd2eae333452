"""Layer 3: tensor cores inside a kernel of nested contractions (attention, schedule rule 10), their operands in registers. Imports
dtype, ops, shape/, codegen/axes, codegen/uops; the Kernel and the Linearizer are passed in.

TC on such a kernel (`nested_tensor_core`) lays a warp's 32 threads over mma.sync m16n8k16's fragments, as FlashAttention-2 does:
- the rows (M: the queries of the forward, the keys of dk and dv) split (M/16, 2 FRAGMENT, 8 WARP): row g or g + 8 of a 16-row
  tile, g = lane // 4;
- the outer reduce's axis (the keys a row walks) split (T/16, 2 UNROLL "half", 4 LANE "quad", 2 UNROLL "pair"): key 8 half + 2 quad
  + pair of 16, quad = lane % 4. That is where an mma's accumulators (C) hold a score of a 16 x 8 tile, both halves together
  where its A operand holds the 16 x 16 probabilities that multiply the values, so a probability is computed in the registers
  that hold its score and no thread exchanges them;
- each nested contraction's own axis (the head dim) split (D/16, 16 TC): the K of the scores' mma;
- the features (the values' head dim, the N of the second mma) split (4 LANE, F/8 UPCAST, 2 FRAGMENT): feature F/4 quad + 2 tile
  + pair, the C fragment of the output, its quad the keys' quad (one LANE index for both), a quad's features side by side.
A nested contraction, and every outer sum of a product of two 16-bit values that spans the features, is computed by mma: each
thread builds its registers of A and B by computing the operands' elements where the fragment layouts put them (`register_mma`);
the other reduces over the keys (softmax's max and sum) are added lane by lane, their quads meeting by shuffles.
Float32 contractions run as 3xTF32, as torch's memory-efficient attention does: each element x split into big = x rounded to TF32
(10 mantissa bits) and small = x - big (exact), and big x big + big x small + small x big added by three mma.sync m16n8k8 (K 8:
a 16-bit step's half "high" a step, its two elements e two registers), so a product keeps about 21 of float32's 24 bits. There
the features split (4 LANE, 2 FRAGMENT, F/8 UPCAST) instead: a thread's features of the n-tiles side by side, so B's fragments
of the values (strided along the keys, no 32-bit transpose) load 16 bytes a load too.
"""
from __future__ import annotations
import itertools
from typing import TYPE_CHECKING, NamedTuple, cast
from tinyc.dtype import DType, dtypes
from tinyc.ops import BinaryOps, BufferOps, LazyOp, ReduceOps, UnaryOps
from tinyc.shape.symbolic import Node, NumNode
from tinyc.codegen.axes import TC_DTYPES, AxisKind, KernelOptError, Opt
from tinyc.codegen.uops import UOp, UOps
if TYPE_CHECKING:
  from tinyc.codegen.kernel import Kernel
  from tinyc.codegen.linearizer import Linearizer, Scope

NESTED_TC_DTYPES = TC_DTYPES + (dtypes.float32,)  # float32 as 3xTF32 (module docstring)
THREE_TF32 = ((1, 0), (0, 1), (0, 0))  # (A's part, B's part) of each mma of 3xTF32, 0 big and 1 small: the small products first

def _check(condition: bool, opt: Opt, why: str) -> None:
  if not condition: raise KernelOptError(f"{opt}: {why}")

def _widened(node: LazyOp) -> LazyOp:  # a float32 cast of a 16-bit float is exact: the mma multiplies the 16-bit values
  return node.src[0] if node.op is UnaryOps.CAST and node.dtype == dtypes.float32 and node.src[0].dtype in TC_DTYPES else node

def mma_factors(reduceop: LazyOp) -> tuple[LazyOp, LazyOp] | None:
  """The two 16-bit or float32 factors (of one dtype) whose products a SUM adds, or None."""
  product = reduceop.src[0].src[0] if reduceop.src[0].op is UnaryOps.CAST and reduceop.src[0].dtype == dtypes.float32 else reduceop.src[0]
  if reduceop.op is not ReduceOps.SUM or product.op is not BinaryOps.MUL: return None
  a, b = map(_widened, product.src)
  return (a, b) if a.dtype in NESTED_TC_DTYPES and a.dtype == b.dtype else None

def _broadcast(kernel: Kernel, node: LazyOp, axis: int) -> bool:
  """Whether `node` has one value all along `axis`: every load and constant it reads is broadcast there (value_axes counts an
  expanded one, a constant's above all, as spanning it)."""
  return all(kernel.broadcast_along(kernel.bufs.index(leaf.arg), axis) for leaf in node.walk() if leaf.op in (BufferOps.LOAD, BufferOps.CONST))

def mma_operands(kernel: Kernel, reduceop: LazyOp, rows: int, n: int) -> tuple[LazyOp, LazyOp] | None:
  """(A, B) of a sum an mma computes with M along axis `rows` and N along `n`: A broadcast along N, B along the rows; or None."""
  if (factors := mma_factors(reduceop)) is None: return None
  return next(((a, b) for a, b in (factors, factors[::-1]) if _broadcast(kernel, a, n) and _broadcast(kernel, b, rows)), None)

def nested_tensor_core(kernel: Kernel, opt: Opt) -> None:
  """TC (choice 0, amount 0) on a kernel of nested contractions: the splits of the module's docstring, the features upcast whole."""
  inner = kernel.nested_contractions()
  _check(opt.axis == 0 and opt.amount == 0, opt, "TC on a kernel of nested contractions takes axis 0 and amount 0")
  outer = [axis for axis in kernel.axes(AxisKind.REDUCE) if not kernel.owners[axis] <= set(inner)]
  features, varying = kernel.features(), set().union(*[kernel.value_axes(kernel.reduceops[number]) for number in inner])
  rows = [axis for axis in kernel.axes(AxisKind.GLOBAL) if axis in varying and kernel.full_shape[axis] != 1]
  _check(len(outer) == 1 and len(features) <= 1 and bool(rows), opt, "it needs one outer reduce axis, rows, and one features axis or none")
  _check(all(mma_operands(kernel, kernel.reduceops[number], rows[-1], outer[0]) for number in inner), opt,
         "each nested contraction must sum products of two 16-bit or float32 inputs, one along the rows, one along the keys")
  own = [kernel.own_axis(number) for number in inner]
  sizes = [(rows[-1], 16), (outer[0], 16)] + [(axis, 16) for axis in own] + [(axis, 8) for axis in features]
  _check(all(isinstance(kernel.full_shape[axis], int) and kernel.full_shape[axis] % size == 0 for axis, size in sizes), opt,
         f"rows, keys and head dims must be multiples of 16 and features of 8, not {[kernel.full_shape[axis] for axis, _ in sizes]}")
  # every reduce over the keys that varies along the features is an mma, which adds the keys of all 4 quads together
  along = [reduceop for number in kernel.owners[outer[0]] if features and not _broadcast(kernel, reduceop := kernel.reduceops[number], features[0])]
  _check(all(mma_operands(kernel, reduceop, rows[-1], features[0]) for reduceop in along), opt, "a sum over the keys along the features "
         "must be of products of two 16-bit or float32 values, one along the rows, one along the features")
  # float32 values' B fragments read along the features (no transpose): (quad, pair, tiles), each thread's n-tiles side by side
  wide = not any(cast(tuple, mma_factors(reduceop))[0].dtype in TC_DTYPES for reduceop in along)
  # positions among each kind stay put while axes split (a split's remainder keeps its kind and place)
  row, key = kernel.axes(AxisKind.GLOBAL).index(rows[-1]), kernel.axes(AxisKind.REDUCE).index(outer[0])
  feature = [kernel.axes(AxisKind.GLOBAL).index(axis) for axis in features]
  heads = [kernel.axes(AxisKind.REDUCE).index(axis) for axis in own]
  kernel.shift_to(kernel.axes(AxisKind.GLOBAL)[row], 16, AxisKind.FRAGMENT)
  kernel.shift_to(kernel.axes(AxisKind.FRAGMENT)[-1], 8, AxisKind.WARP)
  for position in feature:
    if not wide: kernel.shift_to(kernel.axes(AxisKind.GLOBAL)[position], 2, AxisKind.FRAGMENT)
    kernel.shift_to(kernel.axes(AxisKind.GLOBAL)[position], 4, AxisKind.LANE, top=True)  # a quad's features side by side: wide loads
    if wide: kernel.shift_to(kernel.axes(AxisKind.GLOBAL)[position], 2, AxisKind.FRAGMENT, top=True)
    if (tiles := kernel.full_shape[kernel.axes(AxisKind.GLOBAL)[position]]) > 1:
      kernel.shift_to(kernel.axes(AxisKind.GLOBAL)[position], tiles, AxisKind.UPCAST)
  kernel.shift_to(kernel.axes(AxisKind.REDUCE)[key], 2, AxisKind.UNROLL)
  kernel.shift_to(kernel.axes(AxisKind.REDUCE)[key], 4, AxisKind.LANE)
  kernel.shift_to(kernel.axes(AxisKind.REDUCE)[key], 2, AxisKind.UNROLL)
  for position in heads: kernel.shift_to(kernel.axes(AxisKind.REDUCE)[position], 16, AxisKind.TC)
  kernel.nested_tc = True

class MmaRoles(NamedTuple):
  """The axes a nested TC kernel's fragments are laid over (module docstring)."""
  warp: int                    # row g of a 16-row tile (lane // 4)
  row_pair: int                # rows g and g + 8 (FRAGMENT)
  key_quad: int                # the outer reduce's keys 2 quad and 2 quad + 1 (LANE: lane % 4)
  key_pair: int                # of those two (UNROLL)
  key_half: int                # keys 0-7 or 8-15 (UNROLL)
  feature_quad: int | None     # the features' quad (LANE, the same index)
  feature_pair: int | None     # and pair (FRAGMENT)

def mma_roles(kernel: Kernel) -> MmaRoles:
  """Where nested_tensor_core put them: lane axes of one kind keep the order they were made in."""
  lanes, fragments = kernel.axes(AxisKind.LANE), kernel.axes(AxisKind.FRAGMENT)
  key_quad = next(axis for axis in lanes if kernel.owners[axis])
  pair, half = [axis for axis in kernel.axes(AxisKind.UNROLL) if kernel.owners[axis] == kernel.owners[key_quad]][:2]
  feature_quad = next((axis for axis in lanes if not kernel.owners[axis]), None)
  return MmaRoles(kernel.axes(AxisKind.WARP)[0], fragments[0], key_quad, pair, half, feature_quad, fragments[1] if len(fragments) > 1 else None)

def computed_by_mma(kernel: Kernel, reduceop: LazyOp) -> bool:
  """Whether a nested TC kernel computes this reduce on tensor cores: a nested contraction, or an outer sum of products that varies
  along the features' quad (the keys of its rows summed by each mma over the quads; one that does not, each lane adds up alone)."""
  if not kernel.nested_tc or mma_factors(reduceop) is None: return False
  number, roles = kernel.reduceops.index(reduceop), mma_roles(kernel)
  if any(number in kernel.owners[axis] for axis in kernel.axes(AxisKind.TC)): return True
  return number in kernel.owners[roles.key_quad] and roles.feature_quad is not None and not _broadcast(kernel, reduceop, roles.feature_quad)

def register_mma(lin: Linearizer, reduceop: LazyOp, scope: Scope, accs: list[UOp], keys: list[tuple[int, ...]], key_axes: list[int]) -> None:
  """Add this trip's products to the reduce's accumulators: one mma for each n-tile and step of K among the scope's lanes. Registers
  of A (rows x K): row g + 8 (r % 2), K 2 quad + e + 8 (r // 2); of B (K x N): K 2 quad + e + 8 r, N g; each two 16-bit elements
  e = 0, 1. K is a TC axis (a nested contraction: N the keys) or the keys (N the features); the accumulators are C's, row g + 8 r,
  N 2 quad + e. Each operand's words of a trip are read by one parse, so neighbours in memory load together (16 bytes)."""
  kernel, roles = lin.kernel, mma_roles(lin.kernel)
  number, g, quad = kernel.reduceops.index(reduceop), lin.lane // 4, lin.lane % 4
  tc = next((axis for axis in kernel.axes(AxisKind.TC) if number in kernel.owners[axis]), None)
  a_node, b_node = cast(tuple, mma_operands(kernel, reduceop, roles.warp, roles.key_quad if tc is not None else cast(int, roles.feature_quad)))
  if tc is not None: n_quad, n_pair, covered = roles.key_quad, roles.key_pair, {roles.row_pair, roles.key_pair}
  else:
    n_quad, n_pair = cast(int, roles.feature_quad), cast(int, roles.feature_pair)
    covered = {roles.row_pair, n_pair, roles.key_half, roles.key_pair}
  others = [axis for axis in scope.lane_axes if axis not in covered]
  # the head dim's unrolled 16-steps: each a step of K (one mma each); the other lanes A is one value along are n-tiles (N), and
  # the rest (a warp's row tiles, the keys' unrolled steps) each an A of its own
  steps = next((axis for axis in others if tc is not None and kernel.owners[axis] == kernel.owners[tc] and kernel.kinds[axis] is AxisKind.UNROLL),
               None)
  size = kernel.full_shape[steps] if steps is not None else 1
  n_tiles = [axis for axis in others if axis != steps and _broadcast(kernel, a_node, axis)]
  rest = [axis for axis in others if axis != steps and axis not in n_tiles]
  def k_index(q: Node, e: Node, high: int, step: int) -> dict[int, Node]:
    """K's element of quarter q, e, of half `high` (the mma's 2 q + e + 8 high) of step `step`. A head dim is summed in any order, A
    and B in the same: 4 size q + 4 step + 2 high + e puts a thread's elements of a row side by side in memory; the keys' order is
    the scores' C fragment's (the probabilities stay in their registers)."""
    if tc is None: return {roles.key_half: NumNode(high), roles.key_quad: q, roles.key_pair: e}
    place = q * (4 * size) + 4 * step + 2 * high + e
    return {tc: place % 16} | ({steps: place // 16} if steps is not None else {})
  dtype, ranges = a_node.dtype, lambda axes: itertools.product(*[range(kernel.full_shape[axis]) for axis in axes])  # noqa: E731
  tile_values, tf32 = list(ranges(n_tiles)), dtype == dtypes.float32
  mma_steps = size * (2 if tf32 else 1)  # TF32: each half its own step, its elements e a register each (module docstring)
  for values in ranges(rest):
    at = scope.bound | dict(zip(rest, map(NumNode, values)))
    def words(node: LazyOp, places: list[dict[int, Node]], sizes: list[int]) -> list[UOp]:  # the elements (laid out as sizes), two a word
      elements = lin.parse_at(node, [[(at | place).get(axis, NumNode(0)) for axis in range(kernel.shape_len)] for place in places], sizes, scope)
      return elements if tf32 else [_packed(lin, dtype, elements[i], elements[i + 1]) for i in range(0, len(elements), 2)]
    # A: (row, step, half) words, a row's steps and halves side by side; B: (tile, step, half), or read along N and transposed
    a = words(a_node, [{roles.row_pair: NumNode(row)} | k_index(quad, NumNode(e), high, step)
                       for row in range(2) for step in range(size) for high in range(2) for e in range(2)], [2, 4 * size])
    def tile_at(tile: tuple[int, ...]) -> dict[int, Node]: return dict(zip(n_tiles, map(NumNode, tile)))
    b = words(b_node, [tile_at(tile) | {n_quad: g // 2, n_pair: g % 2} | k_index(quad, NumNode(e), high, step)
                       for tile in tile_values for step in range(size) for high in range(2) for e in range(2)], [len(tile_values), 4 * size])
    if not tf32 and not all(map(_loaded, b)):  # B's elements of a register lie apart in memory (V: its keys), but neighbours along N: each
      # 8 x 8 block read with K along the lanes' quarters (a row of N a quarter, two neighbours a lane) and transposed in registers
      rows = words(b_node, [tile_at(tile) | {n_pair: NumNode(e)} | k_index(g // 2, g % 2, high, step)
                            for step in range(size) for high in range(2) for tile in tile_values for e in range(2)], [2 * size, 2 * len(tile_values)])
      if all(map(_loaded, rows)):  # (step, half, tile) -> (tile, step, half)
        moved = [lin.uop(UOps.TRANSPOSE, word.dtype, (word,)) for word in rows]
        b = [moved[(step * 2 + high) * len(tile_values) + t] for t in range(len(tile_values)) for step in range(size) for high in range(2)]
    # the mma's registers: 16-bit words of (step, high), or TF32 elements of (step and high, e): the same places either way
    a_parts, b_parts = ([tf32_split(lin, x) for x in a], [tf32_split(lin, x) for x in b]) if tf32 else ([(x,) for x in a], [(x,) for x in b])
    for t, tile in enumerate(tile_values):
      corners = [at | tile_at(tile) | {roles.row_pair: NumNode(r), n_pair: NumNode(e)} for r in range(2) for e in range(2)]
      quad_accs = [accs[keys.index(tuple(cast(NumNode, corner[axis]).b for axis in key_axes))] for corner in corners]
      for step in range(mma_steps):
        registers = [a_parts[row * 2 * mma_steps + step * 2 + high] for high in range(2) for row in range(2)]  # (g, low), (g + 8, low), ...
        b_registers = b_parts[(t * mma_steps + step) * 2:][:2]
        for a_part, b_part in THREE_TF32 if tf32 else ((0, 0),):
          operands = [part[a_part] for part in registers] + [part[b_part] for part in b_registers]
          lin.uop(UOps.WMMA, None, (*operands, *quad_accs), dtype, pure=False)

def _packed(lin: Linearizer, dtype: DType, low: UOp, high: UOp) -> UOp:
  """Two 16-bit values as one 32-bit register: a word of the vector loaded, where they are its two halves."""
  if low.op is UOps.GEP and high.op is UOps.GEP and low.src == high.src and low.arg % 2 == 0 and high.arg == low.arg + 1:
    vector = low.src[0]
    if vector.dtype == dtype.vec(2): return vector
    return lin.uop(UOps.GEP, dtype.vec(2), (vector,), low.arg // 2)  # (a 16-bit vector is 32-bit words)
  return lin.uop(UOps.VECTORIZE, dtype.vec(2), (lin.cast(low, dtype), lin.cast(high, dtype)))

def tf32_split(lin: Linearizer, value: UOp) -> tuple[UOp, UOp]:
  """A float32 value (or its bits, as a fragment register holds them) as two TF32 registers (module docstring): big, rounded to
  nearest (ties away, as cvt.rna) by adding half of the 13 dropped bits' place, and small = value - big, which the mma truncates."""
  bits = value if value.dtype == dtypes.uint32 else lin.uop(UOps.BITCAST, dtypes.uint32, (value,))
  number = value if value.dtype == dtypes.float32 else lin.uop(UOps.BITCAST, dtypes.float32, (value,))
  rounded = lin.alu(BinaryOps.ADD, dtypes.uint32, bits, lin.const(0x1000, dtypes.uint32))
  big = lin.alu(BinaryOps.AND, dtypes.uint32, rounded, lin.const(0xFFFFE000, dtypes.uint32))
  small = lin.alu(BinaryOps.SUB, dtypes.float32, number, lin.uop(UOps.BITCAST, dtypes.float32, (big,)))
  return big, lin.uop(UOps.BITCAST, dtypes.uint32, (small,))

def _loaded(word: UOp) -> bool: return word.op is UOps.LOAD or (word.op is UOps.GEP and word.src[0].op is UOps.LOAD)
