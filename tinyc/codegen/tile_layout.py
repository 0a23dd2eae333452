"""Layer 3: where a staged buffer's tile (STAGE, TC, WARPGROUP) puts each element in local memory. Imports dtype, helpers, shape/,
codegen/axes, codegen/warpgroups; Kernel.tile_layout calls it.
"""
from __future__ import annotations
import math
from typing import TYPE_CHECKING, cast
from tinyc.dtype import dtypes
from tinyc.helpers import prod
from tinyc.shape.view import View
from tinyc.codegen.axes import TC_DTYPES, AxisKind, TileLayout
from tinyc.codegen.warpgroups import a_in_registers, contiguous_dimension, dense_strides, warpgroup_operands
if TYPE_CHECKING: from tinyc.codegen.kernel import Kernel

def tile_layout(kernel: Kernel, number: int) -> TileLayout:
  """Where staged buffer `number`'s tile puts each element: the unrolled reduce axes outermost, then the others in the buffer's
  memory order. A tensor-core operand keeps its values in rows along K (all of a trip's K) or, where K is not the contiguous
  axis, along M or N (`rows`: the axis the rows step along); a row's stride is made an odd number of 16 bytes, so the 8 rows
  ldmatrix reads at once fall in different banks (32 for TF32 rows along M or N: a warp reads 8 values from each of 4 rows)."""
  axes, strides = kernel.tile_axes(number), kernel.sts[number].real_strides(ignore_valid=True)
  stride = lambda axis: math.inf if strides[axis] is None else cast(int, strides[axis])  # noqa: E731
  load_order = sorted(axes, key=lambda axis: -stride(axis))
  unrolled = [axis for axis in axes if kernel.kinds[axis] is AxisKind.UNROLL]
  dtype, rows, order = kernel.bufs[number].dtype, None, unrolled + [axis for axis in load_order if axis not in unrolled]
  if kernel.warpgroups and not (number == warpgroup_operands(kernel)[0] and a_in_registers(kernel)):  # rows of the contiguous dimension
    # (K, or M or N), dense: tiles.py stores them as wgmma reads them
    contiguous = contiguous_dimension(kernel, number)
    order = [axis for axis in load_order if axis not in contiguous] + contiguous
    view = View.create(kernel.full_shape, tuple(dense_strides(order, kernel.full_shape).get(axis, 0) for axis in range(kernel.shape_len)))
    size = prod(kernel.full_shape[axis] for axis in order)
    return TileLayout(view, size, {2: dtypes.uint16, 4: dtypes.uint32}[dtype.itemsize], load_order, None,
                      prod(kernel.full_shape[axis] for axis in contiguous))
  if kernel.axes(AxisKind.TC):  # the 8 rows and columns of ldmatrix's matrices: along M (WARP 8) or N (WARP 4 x FRAGMENT 2), and K
    tc, warp = kernel.axes(AxisKind.TC)[0], next(axis for axis in axes if kernel.kinds[axis] is AxisKind.WARP)
    outer = [warp] if kernel.full_shape[warp] == 8 else [warp, next(a for a in axes if kernel.kinds[a] is AxisKind.FRAGMENT and a > warp)]
    others = [axis for axis in load_order if axis not in unrolled + outer + [tc]]
    # rows along M or N where K is not the contiguous axis: read by ldmatrix .trans (16-bit), or a value at a time (TF32)
    if stride(tc) > stride(outer[-1]): order, rows = unrolled + [tc] + others + outer, tc
    else: order, rows = others + outer + unrolled + [tc], outer[-1]
    dtype = {2: dtypes.uint16, 4: dtypes.uint32}[dtype.itemsize]  # the values' bits, moved and read as they are
  else:
    dtype = dtypes.float32 if dtype in TC_DTYPES else dtype  # 16-bit floats are floats in registers, and in these tiles
    # a buffer contiguous along the unrolled axis is copied across the tile's rows: pad them, so a thread's 4 stores hit 4 banks
    rows = unrolled[-1] if unrolled and load_order[-1] == unrolled[-1] else None
  layout_strides, size = {}, 1
  spread = 32 if dtype.itemsize == 4 and rows is not None and kernel.kinds[rows] is AxisKind.TC else 16  # bytes of a row read at once
  for axis in reversed(order):
    if axis == rows and (size * dtype.itemsize // spread) % 2 == 0: size += spread // dtype.itemsize
    layout_strides[axis], size = size, size * kernel.full_shape[axis]
  view = View.create(kernel.full_shape, tuple(layout_strides.get(axis, 0) for axis in range(kernel.shape_len)))
  return TileLayout(view, size, dtype, load_order, rows)
