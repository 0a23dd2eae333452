"""Layer 3: staged inputs (STAGE, see codegen/kernel.py), read through local memory. Two tiles alternate: a thread loads the next
trip's tile into registers before this trip's work and stores it into the other tile after, so one barrier a trip suffices.
Imports dtype, helpers, ops, shape/, codegen/kernel, codegen/uops; the Linearizer passes itself in.
"""
from __future__ import annotations
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, NamedTuple, cast
from tinyc.dtype import dtypes
from tinyc.helpers import prod
from tinyc.ops import MemBuffer
from tinyc.shape.shapetracker import flatten_node, unflatten_node
from tinyc.shape.symbolic import Node, NumNode
from tinyc.shape.view import View, strides_for_shape
from tinyc.codegen.uops import VECTOR_WIDTH, UOp
from tinyc.codegen.kernel import LANES, AxisKind
if TYPE_CHECKING: from tinyc.codegen.linearizer import Address, Linearizer

@dataclass(frozen=True)
class Tile:
  """A staged input's local memory: two tiles, one for this reduce loop trip and one being filled for the next."""
  number: int        # the buffer's number in the kernel
  memory: UOp        # DEFINE_LOCAL of 2 * size elements
  layout: View       # the kernel's full shape -> a position in a tile (stride 0 along the axes the tile does not span)
  size: int
  load_order: list[int]  # the tile's axes in the buffer's memory order, outermost first
  def index(self, idxs: list[Node], parity: Node) -> Node: return self.layout.expr_idxs(idxs) + parity * self.size

class TileShare(NamedTuple):
  """What one thread copies into a tile: values (laid out as `sizes`) and each one's address there (index, gate)."""
  memory: UOp
  sizes: list[int]
  values: list[UOp]
  addresses: list[Address]

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

def load_tiles(ctx: Linearizer, bound: dict[int, Node], reduce_axes: list[int], trip: Node) -> list[TileShare]:
  """This thread's share of every tile for reduce loop trip `trip` over `reduce_axes` (`bound`: its GLOBAL and LOCAL indices): the
  threads take turns along the buffer's memory order, VECTOR_WIDTH neighbours each where the tile allows (a last turn gated)."""
  kernel, shares = ctx.kernel, []
  trip_sizes = tuple(kernel.full_shape[axis] for axis in reduce_axes)
  placed = bound | dict(zip(reduce_axes, unflatten_node(trip % prod(trip_sizes), trip_sizes)))  # the axes the tile does not spread over
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
        lanes.append([coords.get(axis, NumNode(0)) if axis in spread_axes else placed.get(axis, NumNode(0)) for axis in range(kernel.shape_len)])
        gates.append(run < runs)
    buf, st = cast(MemBuffer, kernel.bufs[tile.number]), kernel.sts[tile.number]  # STAGE takes only inputs
    memory, sizes = ctx.globals[buf.idx], [len(lanes) // width, width]
    sources = [st.expr_idxs(idxs) for idxs in lanes]
    if fits: values = ctx.read(memory, sizes, sources, buf.dtype)
    else: values = [ctx.load(memory, index, Node.ands([valid, gate])) for (index, valid), gate in zip(sources, gates)]
    shares.append(TileShare(tile.memory, sizes, values, [(tile.index(idxs, trip % 2), gate) for idxs, gate in zip(lanes, gates)]))
  return shares

def store_tiles(ctx: Linearizer, shares: list[TileShare]) -> None:
  """Each thread's share into its tile, then a barrier: every thread reads the whole tile."""
  for share in shares: ctx.write(share.memory, share.sizes, share.values, share.addresses)
  ctx.barrier()
