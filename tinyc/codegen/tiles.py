"""Layer 3: staged inputs (STAGE, see codegen/kernel.py), read through local memory. Two tiles alternate: a thread loads the next
trip's tile into registers before this trip's work and stores it into the other tile after, so one barrier a trip suffices.
Tensor-core operands (TC) instead keep `tile_stages` tiles, copied in the background (copy_tiles) and guarded by split barriers,
two a stage: its copies landed, and every thread done reading it. A trip starts the copies of the trip `tile_stages - 1` ahead
into the stage the last trip read, once every thread is done with it, and waits for its own; no barrier holds every thread.
Imports helpers, ops, shape/, codegen/kernel, codegen/uops; the Linearizer passes itself in.
"""
from __future__ import annotations
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, cast
from tinyc.dtype import dtypes
from tinyc.helpers import prod
from tinyc.ops import MemBuffer
from tinyc.shape.shapetracker import flatten_node, unflatten_node
from tinyc.shape.symbolic import Node, NumNode
from tinyc.codegen.uops import VECTOR_WIDTH, UOp, UOps
from tinyc.codegen.kernel import LANES, AxisKind, TileLayout
if TYPE_CHECKING: from tinyc.codegen.linearizer import Address, Linearizer

@dataclass(frozen=True)
class Tile:
  """A staged input's local memory: two tiles, one for this reduce loop trip and one being filled for the next."""
  number: int        # the buffer's number in the kernel
  memory: UOp        # DEFINE_LOCAL of 2 * size elements
  layout: TileLayout
  def index(self, idxs: list[Node], stage: Node) -> Node: return self.layout.view.expr_idxs(idxs) + stage * self.layout.size

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
  first again after the last), and 0 along the axes the buffer is broadcast along (Kernel.broadcast_along)."""
  kernel, trip_sizes = ctx.kernel, tuple(ctx.kernel.full_shape[axis] for axis in reduce_axes)
  placed = bound | dict(zip(reduce_axes, unflatten_node(trip % prod(trip_sizes), trip_sizes)))
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
      targets = [tile.index(idxs(thread, lane, width), NumNode(0)) for lane in range(width)]
      return (sources[0][0] % width == 0 and targets[0] % width == 0 and all(valid == sources[0][1] for _, valid in sources) and
              all(source - sources[0][0] == i and target - targets[0] == i for i, ((source, _), target) in enumerate(zip(sources, targets))))
    bits = tile.layout.dtype
    width, memory = 16 // bits.itemsize if moves_together(16 // bits.itemsize) else 1, ctx.globals[cast(MemBuffer, kernel.bufs[tile.number]).idx]
    for turn in range(-(-prod(sizes) // (width * kernel.local_size))):
      chunk = thread + turn * kernel.local_size
      (source, valid), target = st.expr_idxs(idxs(chunk, 0, width)), ctx.index(tile.index(idxs(chunk, 0, width), stage))
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
  for stage in range(stages - 1): copy_tiles(ctx, bound, reduce_axes, NumNode(stage), NumNode(stage), barriers)
  return barriers

def enter_trip(ctx: Linearizer, barriers: UOp, bound: dict[int, Node], reduce_axes: list[int], trip: Node) -> Node:
  """Start the copies of trip + stages - 1 into the stage trip - 1 read, once every thread has read it (the (trip - 1) // stages-th
  phase of its barrier; on the first trip the wait is for parity 1 of a fresh barrier, which holds at once), then wait for this
  trip's own tiles (phase trip // stages of theirs), and, where threads store tiles themselves, for every thread (a barrier).
  Returns this trip's stage."""
  stages = ctx.kernel.tile_stages
  ahead = (trip + stages - 1) % stages
  wait_for(ctx, barriers, ahead + stages, ((trip + stages - 1) // stages + 1) % 2)
  stored = copy_tiles(ctx, bound, reduce_axes, trip + stages - 1, ahead, barriers)
  wait_for(ctx, barriers, trip % stages, (trip // stages) % 2)
  if stored: ctx.barrier()
  return trip % stages

def leave_trip(ctx: Linearizer, barriers: UOp, trip: Node) -> None:
  """This thread is done reading the trip's stage."""
  ctx.uop(UOps.BARRIER_ARRIVE, None, (barriers, ctx.index(trip % ctx.kernel.tile_stages + ctx.kernel.tile_stages)), pure=False)

def wait_for(ctx: Linearizer, barriers: UOp, index: Node, parity: Node) -> None:
  ctx.uop(UOps.BARRIER_WAIT, None, (barriers, ctx.index(index), ctx.index(parity)), pure=False)

def store_tiles(ctx: Linearizer, shares: list[TileShare]) -> None:
  """Each thread's share into its tile, then a barrier: every thread reads the whole tile."""
  for share in shares: ctx.write(share.memory, share.sizes, share.values, share.addresses)
  ctx.barrier()
