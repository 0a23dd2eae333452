"""Layer 3: staged inputs (STAGE), read through local memory. Each reduce loop trip, the work-group's threads copy the tile of
a staged buffer that the trip reads into local memory together (VECTOR_WIDTH neighbours each where the tile allows), and
every thread reads its lanes from there. Two tiles alternate: a thread loads the next trip's tile into registers before this
trip's work and stores it into the other tile after, so one barrier a trip suffices. Imports dtype, helpers, ops, shape/,
codegen/kernel, codegen/uops; the Linearizer passes itself in.
"""
from __future__ import annotations
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, cast
from tinyc.dtype import DType, dtypes
from tinyc.helpers import prod
from tinyc.shape.shapetracker import flatten_node, unflatten_node
from tinyc.shape.symbolic import Node, NumNode
from tinyc.shape.view import View, strides_for_shape
from tinyc.codegen.uops import VECTOR_WIDTH, UOp, UOps
from tinyc.codegen.kernel import LANES, AxisKind
if TYPE_CHECKING: from tinyc.codegen.linearizer import Linearizer

@dataclass(frozen=True)
class Tile:
  """A staged input's local memory: two tiles, one for this reduce loop trip and one being filled for the next."""
  number: int        # the buffer's number in the kernel
  memory: UOp        # DEFINE_LOCAL of 2 * size elements
  layout: View       # the kernel's full shape -> a position in a tile (stride 0 along the axes the tile does not span)
  size: int
  load_order: list[int]  # the tile's axes in the buffer's memory order, outermost first

@dataclass
class TileShare:
  """What one thread loads of a tile: values at lanes (laid out as sizes), each only where its gate holds."""
  tile: Tile
  values: list[UOp]
  lanes: list[list[Node]]
  sizes: list[int]
  gates: list[Node]

def define_tile(ctx: Linearizer, number: int) -> Tile:
  """Local memory for two tiles of staged buffer `number`. A tile lays out the unrolled reduce axes outermost, then the other
  axes in the buffer's own order, so each thread's lanes of one reduce element sit side by side (16-byte reads)."""
  kernel = ctx.kernel
  axes, strides = kernel.tile_axes(number), kernel.sts[number].real_strides(ignore_valid=True)
  load_order = sorted(axes, key=lambda axis: -math.inf if strides[axis] is None else -cast(int, strides[axis]))
  unrolled = [axis for axis in axes if kernel.kinds[axis] is AxisKind.UNROLL]
  layout_order = unrolled + [axis for axis in load_order if axis not in unrolled]
  layout_strides = dict(zip(layout_order, strides_for_shape(tuple(kernel.full_shape[axis] for axis in layout_order))))
  layout = View.create(kernel.full_shape, tuple(layout_strides.get(axis, 0) for axis in range(kernel.shape_len)))
  size, buf = prod(kernel.full_shape[axis] for axis in axes), kernel.bufs[number]
  # 16-bit floats are floats in registers: their tiles hold those (OpenCL has no half arrays without an extension)
  dtype = dtypes.float32 if buf.dtype in (dtypes.float16, dtypes.bfloat16) else buf.dtype
  memory = ctx.define_local(dtype, f"tile{number}", 2 * size)
  return Tile(number, memory, layout, size, load_order)

def load_tiles(ctx: Linearizer, bound: dict[int, Node], trip_idxs: dict[int, Node]) -> list[TileShare]:
  """This thread's share of every tile for the reduce loop trip `trip_idxs` (an index of each REDUCE axis), `bound` giving the
  thread's GLOBAL and LOCAL indices: the work-group's threads take turns along the buffer's memory order, VECTOR_WIDTH neighbours
  each where the tile allows; in a last partial turn only some threads load."""
  kernel, shares = ctx.kernel, []
  local_axes, spread_axes = kernel.axes(AxisKind.LOCAL), kernel.axes(AxisKind.LOCAL, *LANES)  # the tile spreads over these
  thread = flatten_node([bound[axis] for axis in local_axes], [kernel.full_shape[axis] for axis in local_axes])
  for tile in ctx.tiles.values():
    inner, outer_axes = tile.load_order[-1], tile.load_order[:-1]
    fits = kernel.full_shape[inner] % VECTOR_WIDTH == 0 and tile.size % (VECTOR_WIDTH * kernel.local_size) == 0
    width = VECTOR_WIDTH if fits else 1
    runs, runs_per_row = tile.size // width, kernel.full_shape[inner] // width
    lanes, gates = [], []
    for turn in range(-(-runs // kernel.local_size)):
      run = thread + turn * kernel.local_size
      coords = dict(zip(outer_axes, unflatten_node(run // runs_per_row, tuple(kernel.full_shape[axis] for axis in outer_axes))))
      for lane in range(width):
        coords[inner] = (run % runs_per_row) * width + lane
        lanes.append([coords.get(axis, NumNode(0)) if axis in spread_axes else trip_idxs.get(axis, bound.get(axis, NumNode(0)))
                      for axis in range(kernel.shape_len)])
        gates.append(run < runs)
    share = TileShare(tile, [], lanes, [len(lanes) // width, width], gates)
    buf = kernel.bufs[tile.number]
    share.values = ctx.read(buf, lanes, share.sizes) if fits else [ctx.load(buf, idxs, gate) for idxs, gate in zip(lanes, gates)]
    shares.append(share)
  return shares

def store_tiles(ctx: Linearizer, shares: list[TileShare], parity: Node) -> None:
  """Each thread's share into the tiles of the trip of this `parity`."""
  for share in shares:
    def index_of(lane: int, share: TileShare = share) -> tuple[Node, Node]:
      return share.tile.layout.expr_idxs(share.lanes[lane]) + parity * share.tile.size, share.gates[lane]
    ctx.store_lanes(share.tile.memory, cast(DType, share.tile.memory.dtype), share.sizes, share.values, index_of)

def read_tile(ctx: Linearizer, tile: Tile, dtype: DType, lanes: list[list[Node]], sizes: list[int], parity: Node) -> list[UOp]:
  """The lanes' values (laid out as `sizes`) from the tile of the trip of this `parity`."""
  def index_of(lane: int) -> tuple[Node, Node]: return tile.layout.expr_idxs(lanes[lane]) + parity * tile.size, NumNode(1)
  tile_dtype = cast(DType, tile.memory.dtype)
  vectors = ctx.vector_loads(tile.memory, tile_dtype, sizes, index_of)
  return [ctx.cast(value if value is not None else ctx.uop(UOps.LOAD, tile_dtype, (tile.memory, ctx.index(index_of(lane)[0]))), dtype)
          for lane, value in enumerate(vectors)]
