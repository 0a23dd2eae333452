"""Layer 3: staged inputs (STAGE, see codegen/kernel.py), read through local memory. Two tiles alternate: a thread loads the next
trip's tile into registers before this trip's work and stores it into the other tile after, so one barrier a trip suffices.
Tensor-core operands (TC) instead keep `tile_stages` tiles, copied in the background (copy_tiles) and guarded by split barriers,
two a stage: its copies landed, and every thread done reading it. A trip starts the copies of the trip `tile_stages - 1` ahead
into the stage the last trip read, once every thread is done with it, and waits for its own; no barrier holds every thread.
In a persistent kernel (PERSIST) the trips count on across its tiles. `mma` reads the operands' fragments from the stages and
accumulates on tensor cores. Imports helpers, ops, shape/, codegen/kernel, codegen/uops, codegen/warpgroups; the Linearizer passes itself in.
"""
from __future__ import annotations
import itertools
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, cast
from tinyc.dtype import dtypes
from tinyc.helpers import ALLOW_TF32, prod
from tinyc.ops import BinaryOps, MemBuffer
from tinyc.shape.shapetracker import flatten_node, unflatten_node
from tinyc.shape.symbolic import Node, NumNode
from tinyc.codegen.uops import VECTOR_WIDTH, Fragment, UOp, UOps, Warpgroup
from tinyc.codegen.kernel import LANES, AxisKind, TileLayout
from tinyc.codegen.warpgroups import a_in_registers
from tinyc.codegen.register_mma import THREE_TF32, tf32_split
if TYPE_CHECKING: from tinyc.codegen.linearizer import Address, Linearizer, Scope

@dataclass(frozen=True)
class Tile:
  """A staged input's local memory: two tiles, one for this reduce loop trip and one being filled for the next."""
  number: int        # the buffer's number in the kernel
  memory: UOp        # DEFINE_LOCAL of 2 * size elements
  layout: TileLayout
  def index(self, idxs: list[Node], stage: Node) -> Node:
    """An element's place (unswizzled: see swizzled). A warpgroup operand's rows longer than 128 bytes go on after every row's first 128."""
    position, length, run = self.layout.view.expr_idxs(idxs), self.layout.row_length, 128 // self.layout.dtype.itemsize
    if length > run: position = (position % length) // run * (self.layout.size // length * run) + position // length * run + position % run
    return position + stage * self.layout.size

def swizzled(ctx: Linearizer, tile: Tile, index: Node) -> UOp:
  """An element's index in its tile as stored: in a warpgroup operand's tile, the 16-byte chunks of each row of 128 bytes are
  swizzled (chunk c of row r lies at c ^ (r % 8)), as wgmma reads them: the 8 rows it reads at once fall in different banks."""
  if not tile.layout.row_length: return ctx.index(index)
  run, chunk = 128 // tile.layout.dtype.itemsize, 16 // tile.layout.dtype.itemsize
  return ctx.alu(BinaryOps.XOR, ctx.index_dtype, ctx.index(index), ctx.index((index // run) % 8 * chunk))

class TileShare(NamedTuple):
  """What one thread copies into a tile: values (laid out as `sizes`) and each one's address there (index, gate)."""
  memory: UOp
  sizes: list[int]
  values: list[UOp]
  addresses: list[Address]

def define_tile(ctx: Linearizer, number: int) -> Tile:
  """Local memory for two tiles of staged buffer `number`, laid out as Kernel.tile_layout says."""
  layout = ctx.kernel.tile_layout(number)
  return Tile(number, ctx.define_local(layout.dtype, f"tile{number}", ctx.kernel.tile_stages * layout.size), layout)

def _placed(ctx: Linearizer, tile: Tile, bound: dict[int, Node], reduce_axes: list[int], trip: Node) -> dict[int, Node]:
  """The indices of a tile's copy along the axes it does not spread over: the thread's own, the trip's along the reduce axes (the
  first again after the last) and, in a persistent kernel, along its SERIAL axis (trips count on across its tiles: the next tile's
  first trips follow a tile's last; the first tile again after the last), and 0 along the axes the buffer is broadcast along."""
  kernel, trip_sizes = ctx.kernel, tuple(ctx.kernel.full_shape[axis] for axis in reduce_axes)
  placed = bound | dict(zip(reduce_axes, unflatten_node(trip % prod(trip_sizes), trip_sizes)))
  placed |= {axis: (trip // prod(trip_sizes)) % kernel.full_shape[axis] for axis in kernel.axes(AxisKind.SERIAL)}
  return placed | {axis: NumNode(0) for axis in range(kernel.shape_len) if kernel.broadcast_along(tile.number, axis)}

def load_tiles(ctx: Linearizer, bound: dict[int, Node], reduce_axes: list[int], trip: Node) -> list[TileShare]:
  """This thread's share of every tile for reduce loop trip `trip` over `reduce_axes` (`bound`: its GLOBAL and LOCAL indices): the
  threads take turns along the buffer's memory order, VECTOR_WIDTH neighbours each where the tile allows (a last turn gated)."""
  kernel, shares = ctx.kernel, []
  local_axes, spread_axes = kernel.axes(AxisKind.LOCAL), kernel.axes(AxisKind.LOCAL, *LANES)  # the tile spreads over these
  thread = flatten_node([bound[axis] for axis in local_axes], [kernel.full_shape[axis] for axis in local_axes])
  for tile in ctx.tiles.values():
    at = _placed(ctx, tile, bound, reduce_axes, trip)
    inner, outer_axes = tile.layout.load_order[-1], tile.layout.load_order[:-1]
    elements = prod(kernel.full_shape[axis] for axis in tile.layout.load_order)
    fits = kernel.full_shape[inner] % VECTOR_WIDTH == 0 and elements % (VECTOR_WIDTH * kernel.local_size) == 0
    width = VECTOR_WIDTH if fits else 1
    runs, runs_per_row = elements // width, kernel.full_shape[inner] // width
    lanes, gates = [], []
    for turn in range(-(-runs // kernel.local_size)):
      run = thread + turn * kernel.local_size
      coords = dict(zip(outer_axes, unflatten_node(run // runs_per_row, tuple(kernel.full_shape[axis] for axis in outer_axes))))
      for lane in range(width):
        coords[inner] = (run % runs_per_row) * width + lane
        lanes.append([coords.get(axis, NumNode(0)) if axis in spread_axes else at.get(axis, NumNode(0)) for axis in range(kernel.shape_len)])
        gates.append(run < runs)
    buf, st = cast(MemBuffer, kernel.bufs[tile.number]), kernel.sts[tile.number]  # STAGE takes only inputs
    memory, sizes = ctx.globals[buf.idx], [len(lanes) // width, width]
    sources = [st.expr_idxs(idxs) for idxs in lanes]
    if fits: values = ctx.read(memory, sizes, sources, buf.dtype)
    else: values = [ctx.load(memory, index, Node.ands([valid, gate])) for (index, valid), gate in zip(sources, gates)]
    shares.append(TileShare(tile.memory, sizes, values, [(tile.index(idxs, trip % 2), gate) for idxs, gate in zip(lanes, gates)]))
  return shares

def copy_tiles(ctx: Linearizer, bound: dict[int, Node], reduce_axes: list[int], trip: Node, stage: Node, barriers: UOp) -> bool:
  """Copy the tensor-core operands' tiles of reduce loop trip `trip` into tile stage `stage`, as bits, the threads taking turns
  along each buffer's memory order (the last turn may leave some out): 16 bytes a turn in the background where they are neighbours
  in memory and in the tile, else one value (in the background too if it has 4 bytes). Those in the background arrive at the
  stage's barrier once landed. Returns whether any were stored by the thread itself, which that barrier does not cover."""
  kernel, thread, stored = ctx.kernel, ctx.work_group_thread(), False
  for tile in ctx.tiles.values():
    order = tile.layout.load_order
    at = _placed(ctx, tile, bound, reduce_axes, trip)
    sizes, st = [kernel.full_shape[axis] for axis in order], kernel.sts[tile.number]
    def idxs(chunk: Node, lane: int, width: int) -> list[Node]:  # the kernel's indices of element `lane` of chunk `chunk` of `width`
      inner = next(i for i in reversed(range(len(sizes))) if prod(sizes[i:]) % width == 0)  # the innermost axes hold whole chunks
      per_run = prod(sizes[inner:]) // width
      coords = unflatten_node(chunk // per_run, tuple(sizes[:inner])) + unflatten_node((chunk % per_run) * width + lane, tuple(sizes[inner:]))
      return [dict(zip(order, coords)).get(axis, at.get(axis, NumNode(0))) for axis in range(kernel.shape_len)]
    def moves_together(width: int) -> bool:
      if prod(sizes) % width: return False
      sources = [st.expr_idxs(idxs(thread, lane, width)) for lane in range(width)]
      targets = [tile.layout.view.expr_idxs(idxs(thread, lane, width)) for lane in range(width)]  # (neighbours before a long row is split)
      return (sources[0][0] % width == 0 and targets[0] % width == 0 and all(valid == sources[0][1] for _, valid in sources) and
              all(source - sources[0][0] == i and target - targets[0] == i for i, ((source, _), target) in enumerate(zip(sources, targets))))
    bits = tile.layout.dtype
    width, memory = 16 // bits.itemsize if moves_together(16 // bits.itemsize) else 1, ctx.globals[cast(MemBuffer, kernel.bufs[tile.number]).idx]
    for turn in range(-(-prod(sizes) // (width * kernel.local_size))):
      chunk = thread + turn * kernel.local_size
      (source, valid), target = st.expr_idxs(idxs(chunk, 0, width)), swizzled(ctx, tile, tile.index(idxs(chunk, 0, width), stage))
      in_range = chunk < prod(sizes) // width  # the last turn may have threads to spare
      copied = width * bits.itemsize if width > 1 or bits.itemsize == 4 else 0  # bytes copied in the background
      index, gates = ctx.access(source, valid if copied else Node.ands([valid, in_range]))
      if copied:  # on the last turn, only the threads with a chunk left copy
        block = ctx.open_if(in_range) if in_range.min == 0 else None
        ctx.uop(UOps.COPY_ASYNC, None, (tile.memory, target, memory, index) + gates, copied, pure=False)
        if block is not None: ctx.end(block)
      else:
        value = ctx.uop(UOps.LOAD, bits, (memory, index) + gates)
        ctx.uop(UOps.STORE, None, (tile.memory, target, value) + ((ctx.index(in_range),) if in_range.min == 0 else ()), pure=False)
        stored = True
  ctx.uop(UOps.ASYNC_COMMIT, None, (barriers, ctx.index(stage)), pure=False)
  return stored

def start_tile_copies(ctx: Linearizer, bound: dict[int, Node], reduce_axes: list[int]) -> UOp:
  """The stages' barriers (stage s: `s` its copies landed, `stages + s` every thread done reading it), then the copies of the first
  `stages - 1` trips."""
  stages = ctx.kernel.tile_stages
  barriers = ctx.define_local(dtypes.uint64, "stage_barriers", 2 * stages)
  ctx.uop(UOps.BARRIER_INIT, None, (barriers,), pure=False)
  ctx.barrier()
  for stage in range(stages - 1): ctx.tiles_stored = copy_tiles(ctx, bound, reduce_axes, NumNode(stage), NumNode(stage), barriers)
  return barriers

def enter_trip(ctx: Linearizer, barriers: UOp, bound: dict[int, Node], reduce_axes: list[int], trip: Node) -> Node:
  """Start the copies of trip + stages - 1 into the stage trip - 1 read, once every thread has read it (the (trip - 1) // stages-th
  phase of its barrier; on the first trip the wait is for parity 1 of a fresh barrier, which holds at once), then wait for this
  trip's own tiles (phase trip // stages of theirs), and, where threads store tiles themselves, for every thread (a barrier).
  Returns this trip's stage."""
  stages = ctx.kernel.tile_stages
  if not ctx.kernel.warpgroups: copy_ahead(ctx, barriers, bound, reduce_axes, trip)
  wait_for(ctx, barriers, trip % stages, (trip // stages) % 2)
  if ctx.tiles_stored: ctx.barrier()
  if ctx.tiles_stored and ctx.kernel.warpgroups: ctx.uop(UOps.WARPGROUP_SYNC, None, (), "proxy", pure=False)
  return trip % stages

def copy_ahead(ctx: Linearizer, barriers: UOp, bound: dict[int, Node], reduce_axes: list[int], trip: Node) -> None:
  stages = ctx.kernel.tile_stages
  ahead = (trip + stages - 1) % stages
  wait_for(ctx, barriers, ahead + stages, ((trip + stages - 1) // stages + 1) % 2)
  copy_tiles(ctx, bound, reduce_axes, trip + stages - 1, ahead, barriers)

def leave_trip(ctx: Linearizer, barriers: UOp, bound: dict[int, Node], reduce_axes: list[int], trip: Node) -> None:
  """This thread is done reading the trip's stage. With warpgroups, the wgmmas of the trip before are (this trip's still run),
  so the thread arrives for that one's stage (not on the first trip), then starts the copies of trip + stages - 1 into it."""
  stages = ctx.kernel.tile_stages
  if not ctx.kernel.warpgroups:
    ctx.uop(UOps.BARRIER_ARRIVE, None, (barriers, ctx.index(trip % stages + stages)), pure=False)
    return
  after_first = ctx.open_if(trip >= 1)
  ctx.uop(UOps.BARRIER_ARRIVE, None, (barriers, ctx.index((trip + stages - 1) % stages + stages)), pure=False)
  ctx.end(after_first)
  copy_ahead(ctx, barriers, bound, reduce_axes, trip)

def wait_for(ctx: Linearizer, barriers: UOp, index: Node, parity: Node) -> None:
  ctx.uop(UOps.BARRIER_WAIT, None, (barriers, ctx.index(index), ctx.index(parity)), pure=False)

def store_tiles(ctx: Linearizer, shares: list[TileShare]) -> None:
  """Each thread's share into its tile, then a barrier: every thread reads the whole tile."""
  for share in shares: ctx.write(share.memory, share.sizes, share.values, share.addresses)
  ctx.barrier()

def mma(ctx: Linearizer, scope: Scope, accs: list[UOp], keys: list[tuple[int, ...]], key_axes: list[int]) -> None:
  """Accumulate on tensor cores: one mma for each of the scope's other lanes (the warp's tiles along M and N, the unrolled
  steps of K), adding 16 x 8 x 16 products to the 4 accumulators of the thread's FRAGMENT lanes there. B's fragments are read
  two at once (ldmatrix.x4) along the first lane axis B spans, where it has an even size."""
  kernel, stage = ctx.kernel, cast(Node, scope.tile_stage)
  a_tile, b_tile = sorted(ctx.tiles.values(), key=lambda tile: -kernel.full_shape[_warp_axis(ctx, tile)])  # A spans WARP 8 (M)
  dtype = kernel.bufs[a_tile.number].dtype
  fragment_axes = kernel.axes(AxisKind.FRAGMENT)
  others = [axis for axis in scope.lane_axes if axis not in fragment_axes]
  paired = next((axis for axis in others if axis in kernel.tile_axes(b_tile.number) and kernel.full_shape[axis] % 2 == 0), None)
  for values in itertools.product(*[range(kernel.full_shape[axis]) for axis in others]):
    at = scope.bound | dict(zip(others, map(NumNode, values)))
    a = fragment(ctx, a_tile, at, stage)
    if paired is None: b = fragment(ctx, b_tile, at, stage)
    else:  # the pair's first place, and which of the two this is
      first, second = divmod(cast(NumNode, at[paired]).b, 2)
      b = fragment(ctx, b_tile, at | {paired: NumNode(2 * first)}, stage, paired)[2 * second:][:2]
    quad = [accs[keys.index(tuple(cast(NumNode, (at | dict(zip(fragment_axes, map(NumNode, corner))))[axis]).b for axis in key_axes))]
            for corner in ((0, 0), (0, 1), (1, 0), (1, 1))]
    if dtype != dtypes.float32 or ALLOW_TF32: ctx.uop(UOps.WMMA, None, (*a, *b, *quad), dtype, pure=False)
    else:  # float32 as 3xTF32 (register_mma.py), each register split once however many mmas read it (the linearizer dedups)
      a_parts, b_parts = [tf32_split(ctx, x) for x in a], [tf32_split(ctx, x) for x in b]
      for a_part, b_part in THREE_TF32:
        ctx.uop(UOps.WMMA, None, (*[x[a_part] for x in a_parts], *[x[b_part] for x in b_parts], *quad), dtype, pure=False)

def wgmma(ctx: Linearizer, scope: Scope, accs: list[UOp], keys: list[tuple[int, ...]], key_axes: list[int]) -> None:
  """Accumulate on tensor cores by warpgroups (WARPGROUP): for each unrolled step of K, one wgmma m64nNk16 (k8 for TF32) of the
  thread's 4 warps adds up the products of their 64 rows of A and all N columns of B, read from the stages by descriptors (address,
  the distance between 8-row blocks, SBO, and for a transposed operand between 64-element blocks of its rows, LBO), or A from
  registers (warpgroups.a_in_registers), each warp's 16 rows read as mma.sync's fragments. Its accumulators are mma.sync's, N / 8
  tiles of them: of tile i, (FRAGMENT corner) registers 4i .. 4i + 3. Then the trip's wgmmas are committed and those of the trip
  before waited for, so the next trip's copies may go into their stage; with A in registers, this trip's too, as the next trip
  loads its A into the same registers."""
  kernel, stage = ctx.kernel, cast(Node, scope.tile_stage)
  a_tile, b_tile = sorted(ctx.tiles.values(), key=lambda tile: -kernel.full_shape[_warp_axis(ctx, tile)])
  upcast, local, tc = kernel.axes(AxisKind.UPCAST)[0], kernel.axes(AxisKind.LOCAL)[0], kernel.axes(AxisKind.TC)[0]
  fragment_axes, registers = kernel.axes(AxisKind.FRAGMENT), a_in_registers(kernel)
  firsts: dict[int, Node] = {axis: NumNode(0) for axis in kernel.axes(AxisKind.WARP, AxisKind.FRAGMENT, AxisKind.UPCAST, AxisKind.TC)}
  firsts[local] = ctx.thread_idxs[local] // 4 * 4  # the warpgroup's first warp
  def descriptor_bits(tile: Tile) -> int:
    rows = tile.layout.size // tile.layout.row_length  # of 128 bytes, in a block of the transposed operand's rows
    return (rows * 128 >> 4 << 16 if _transposed(ctx, tile) else 1 << 16) | (1024 >> 4) << 32 | 1 << 62  # swizzled by 128 bytes
  arg = Warpgroup(kernel.bufs[a_tile.number].dtype, 8 * kernel.full_shape[upcast], 0 if registers else descriptor_bits(a_tile),
                  descriptor_bits(b_tile), _transposed(ctx, a_tile), _transposed(ctx, b_tile), registers)
  ordered = [accs[keys.index(tuple({upcast: i, fragment_axes[0]: corner // 2, fragment_axes[1]: corner % 2}[axis] for axis in key_axes))]
             for i in range(kernel.full_shape[upcast]) for corner in range(4)]
  steps = [axis for axis in scope.lane_axes if axis not in fragment_axes + [upcast]]
  assert tc not in steps
  operands: list[tuple[UOp, ...]] = []  # each step's A and B, A's registers all read before the fence (wgmma may not wait for them)
  for values in itertools.product(*[range(kernel.full_shape[axis]) for axis in steps]):
    at = scope.bound | dict(zip(steps, map(NumNode, values)))
    start = lambda tile: ctx.index(tile.index([(at | firsts).get(axis, NumNode(0)) for axis in range(kernel.shape_len)], stage))  # noqa: E731
    a = tuple(fragment(ctx, a_tile, at, stage)) if registers else (a_tile.memory, start(a_tile))
    operands.append((*a, b_tile.memory, start(b_tile)))
  ctx.uop(UOps.WARPGROUP_SYNC, None, (), "fence", pure=False)
  for sources in operands: ctx.uop(UOps.WGMMA, None, (*sources, *ordered), arg, pure=False)
  ctx.uop(UOps.WARPGROUP_SYNC, None, (), "commit", pure=False)
  ctx.uop(UOps.WARPGROUP_SYNC, None, (), "wait 0" if registers else "wait 1", pure=False)

def _transposed(ctx: Linearizer, tile: Tile) -> bool:  # contiguous along M or N
  return ctx.kernel.kinds[tile.layout.load_order[-1]] is not AxisKind.TC

def _warp_axis(ctx: Linearizer, tile: Tile) -> int:
  return next(axis for axis in ctx.kernel.axes(AxisKind.WARP) if axis in ctx.kernel.tile_axes(tile.number))

def fragment(ctx: Linearizer, tile: Tile, at: dict[int, Node], stage: Node, paired: int | None = None) -> list[UOp]:
  """Registers of an operand's fragment, read from its tile by one ldmatrix: of A (16 x 16 of M x K) four 8 x 8 matrices (M 0-7
  and 8-15 at K 0-7, then at K 8-15), of B (8 x 16 of N x K) two, or four with the next place along axis `paired` too. Thread
  `lane` gives the address of row lane % 8 of matrix lane // 8: a row of 8 along K or, where the tile's rows are along K
  (`transposed`: K is not the contiguous axis), a row of 8 along M or N."""
  kernel, tc = ctx.kernel, ctx.kernel.axes(AxisKind.TC)[0]
  warp = _warp_axis(ctx, tile)
  fragment = next(axis for axis in kernel.axes(AxisKind.FRAGMENT) if axis in kernel.tile_axes(tile.number))
  is_a, transposed = kernel.full_shape[warp] == 8, tile.layout.rows == tc
  count = 4 if is_a or paired is not None else 2
  matrix, row = (ctx.lane // 8) % count, ctx.lane % 8
  outer = NumNode(0) if transposed else row  # the row's place along M (0..15) or N (0..7)
  k = (matrix // 2 if is_a else matrix % 2) * (16 // tile.layout.dtype.itemsize) + (row if transposed else 0)  # a row: 16 bytes
  place = {fragment: matrix % 2, warp: outer} if is_a else {warp: outer // 2, fragment: outer % 2}
  if paired is not None: place[paired] = at[paired] + matrix // 2
  if transposed and tile.layout.dtype.itemsize == 4:  # TF32 along M or N: ldmatrix moves 16-bit values, so a value a register,
    # at (M g or g + 8, K t or t + 4) of A and (K t or t + 4, N g) of B, g and t the lane's quarter and its place in it
    g, t = ctx.lane // 4, ctx.lane % 4
    def value(j: int) -> UOp:
      at_j = {fragment: NumNode(j % 2), warp: g} if is_a else {warp: g // 2, fragment: g % 2}
      if paired is not None: at_j[paired] = at[paired] + j // 2
      idxs = [(at | at_j | {tc: t + 4 * (j // 2 if is_a else j % 2)}).get(axis, NumNode(0)) for axis in range(kernel.shape_len)]
      return ctx.uop(UOps.LOAD, dtypes.uint32, (tile.memory, ctx.index(tile.index(idxs, stage))))  # (pure, as LOAD_FRAGMENT)
    return [value(j) for j in range(count)]
  idxs = [(at | place | {tc: k}).get(axis, NumNode(0)) for axis in range(kernel.shape_len)]
  address = ctx.index(tile.index(idxs, stage))
  registers = ctx.uop(UOps.LOAD_FRAGMENT, dtypes.uint32.vec(count), (tile.memory, address), Fragment(count, transposed))
  return [ctx.uop(UOps.GEP, dtypes.uint32, (registers,), i) for i in range(count)]
