"""Layer 6: 3x3 stride-1 convolutions by Winograd's minimal filtering F(4x4, 3x3) (Lavin and Gray, 2015), as cuDNN runs them in
fp32. Each 4x4 block of outputs comes from a 6x6 tile of the input: the tile is transformed (B^T d B), multiplied elementwise with
the transformed kernel (G g G^T) and summed over the input channels - 36 batched matmuls - and the sum is transformed back
(A^T m A). That is 36 products per 16 outputs and channel pair where the direct conv has 144. The transforms are stacks of short
sums, one kernel each, whose 6x6 (4x4) pieces the heuristic upcasts whole (heuristic._upcast_pieces). Operates on Tensors it is given.
"""
from __future__ import annotations
from typing import Any, Sequence
from tinyc.dtype import DType, dtypes
from tinyc.helpers import WINOGRAD, all_int, prod

B_T = ((4, 0, -5, 0, 1, 0), (0, -4, -4, 1, 1, 0), (0, 4, -4, -1, 1, 0), (0, -2, -1, 2, 1, 0), (0, 2, -1, -2, 1, 0), (0, 4, 0, -5, 0, 1))
G = ((1 / 4, 0, 0), (-1 / 6, -1 / 6, -1 / 6), (-1 / 6, 1 / 6, -1 / 6), (1 / 24, 1 / 12, 1 / 6), (1 / 24, -1 / 12, 1 / 6), (0, 0, 1))
A_T = ((1, 1, 1, 1, 1, 0), (0, 1, -1, 2, -2, 0), (0, 1, 1, 4, 4, 0), (0, 1, -1, 8, -8, 1))
# channels from which the 36 matmuls beat the direct conv: below, the transforms' memory traffic costs more than the products saved;
# and the direct conv's products from which the transforms' three kernels and their graph (about 2 ms of Python a conv) pay: on a
# 2-core CPU, fwd + bwd, Winograd against direct: 8x64x28² 23 ms against 154, 32x16x28² (to 32) 29 against 72, 16x32x14² 27 against 17
WINOGRAD_MIN_CHANNELS, WINOGRAD_MIN_PRODUCTS = 16, 100_000_000

def _transposed(matrix: Sequence[Sequence[float]]) -> tuple[tuple[float, ...], ...]: return tuple(zip(*matrix))

def winograd_applies(x_shape: tuple[int, ...], weight_shape: tuple[int, ...], groups: int, strides: tuple[int, ...], dilations: tuple[int, ...],
                     dtype: DType) -> bool:
  """Whether conv2d takes the Winograd path: a 2-D 3x3 kernel, stride and dilation 1, one group, float32, enough channels each way
  and enough work (counted at the input's size)."""
  return (bool(WINOGRAD) and len(weight_shape) == 4 and tuple(weight_shape[2:]) == (3, 3) and strides == (1, 1) and dilations == (1, 1)
          and groups == 1 and dtype == dtypes.float32 and all_int(x_shape + weight_shape) and min(weight_shape[:2]) >= WINOGRAD_MIN_CHANNELS
          and 2 * prod(x_shape) * prod(weight_shape) // x_shape[1] >= WINOGRAD_MIN_PRODUCTS)

def _transform(matrix: Sequence[Sequence[float]], t: Any) -> Any:
  """matrix @ t @ matrix^T over t's last two dims, as a Tensor (len(matrix), len(matrix), *t's leading dims): along each dim a stack
  of short sums of slices (about 100 ops for a 6x6 tile, where one sum per element would be 600)."""
  def along(t: Any, dim: int) -> Any:  # matrix @ t along `dim`, the result's new dim first
    keep = [(0, size) for size in t.shape]
    picks = [t.shrink(tuple(keep[:dim] + [(k, k + 1)] + keep[dim + 1:])).reshape(t.shape[:dim] + t.shape[dim + 1:]) for k in range(t.shape[dim])]
    sums = []
    for row in matrix:
      terms = [picks[k] if c == 1 else -picks[k] if c == -1 else picks[k] * c for k, c in enumerate(row) if c]
      sums.append(terms[0])
      for term in terms[1:]: sums[-1] = sums[-1] + term
    return type(t).stack(*sums)
  return along(along(t, t.ndim - 2), t.ndim - 1).transpose(0, 1)

def _tiles(x: Any, pairs: list[tuple[int, int]]) -> tuple[Any, int, int]:
  """x's transformed 6x6 tiles (36, channels, batch * tiles), one tile per 4x4 outputs, x padded by `pairs` (and to whole tiles)."""
  (top, bottom), (left, right) = pairs
  rows, cols = -(-(x.shape[2] + top + bottom - 2) // 4), -(-(x.shape[3] + left + right - 2) // 4)
  windows = x.pad2d((left, 4 * cols + 2 - x.shape[3] - left, top, 4 * rows + 2 - x.shape[2] - top))._pool((6, 6), 4)
  tiles = _transform(B_T, windows.permute(1, 0, 2, 3, 4, 5)).contiguous()  # (6, 6, channels, batch, rows, cols)
  return tiles.reshape(36, x.shape[1], -1), rows, cols

def winograd_conv2d(x: Any, w: Any, pairs: list[tuple[int, int]]) -> Any:
  """The cross-correlation of x (batch, channels, height, width) with w (out, channels, 3, 3), x padded by `pairs` ((top, bottom),
  (left, right)): conv2d's value."""
  (batch, _, height, width), out = x.shape, w.shape[0]
  tiles, rows, cols = _tiles(x, pairs)
  kernels = _transform(G, w).contiguous().reshape(36, out, -1)
  sums = (kernels @ tiles).reshape(6, 6, out, batch, rows, cols).permute(3, 2, 4, 5, 0, 1)
  blocks = _transform(A_T, sums).permute(2, 3, 4, 0, 5, 1).contiguous()  # (batch, out, rows, 4, cols, 4): each 4x4 block in place
  out_height, out_width = height + sum(pairs[0]) - 2, width + sum(pairs[1]) - 2
  return blocks.reshape(batch, out, 4 * rows, 4 * cols)[:, :, :out_height, :out_width]

def winograd_weight_grad(x: Any, grad: Any, pairs: list[tuple[int, int]]) -> Any:
  """conv2d's weight gradient through the same transforms: G^T (sum over tiles of (A g A^T) * (B^T d B)) G, where g is a 4x4 block of
  the output's gradient."""
  tiles, rows, cols = _tiles(x, pairs)
  (batch, out, height, width) = grad.shape
  blocks = grad.pad2d((0, 4 * cols - width, 0, 4 * rows - height)).reshape(batch, out, rows, 4, cols, 4).permute(1, 0, 2, 4, 3, 5)
  spread = _transform(_transposed(A_T), blocks).contiguous().reshape(36, out, -1)
  products = (spread @ tiles.transpose(-1, -2)).reshape(6, 6, out, x.shape[1]).permute(2, 3, 0, 1)
  return _transform(_transposed(G), products).permute(2, 3, 0, 1)
