"""Layer 3: what a kernel is made of: the OptOps, the kinds of axes, an Opt, a device's KernelTarget and a staged tile's layout.
Imports dtype, helpers, shape/. The Kernel (codegen/kernel.py) and its docstring say how they fit together.
"""
from __future__ import annotations
from dataclasses import dataclass
from enum import Enum, auto
from typing import NamedTuple
from tinyc.dtype import DType, dtypes
from tinyc.helpers import colored
from tinyc.shape.view import View

class OptOps(Enum):
  UPCAST = auto()    # unroll a GLOBAL axis by `amount` (0: all of it): register tiling, vectorizable lanes; `axis` counts the GLOBAL axes
  UNROLL = auto()    # unroll a REDUCE axis by `amount` (0: all of it); `axis` counts the REDUCE axes
  LOCAL = auto()     # make `amount` of a global axis thread ids inside a work-group (GPUs)
  GROUP = auto()     # split a reduce axis across `amount` threads of a work-group, neighbouring threads reading neighbouring elements
  GROUPTOP = auto()  # the same, each thread reading a contiguous run
  PADTO = auto()     # pad a GLOBAL or REDUCE axis (counted in that order) up to a multiple of `amount` (masked), so other Opts divide it
  NOLOCALS = auto()  # no LOCAL or GROUP: the runtime picks the work-group size
  STAGE = auto()     # read input buffer number `axis` (1 is the first input) through local memory, a tile a reduce loop trip
  TC = auto()        # compute the sum of products on tensor cores; `axis` picks one of tensor_core_choices(), `amount` the tile stages (0: 2)
  PERSIST = auto()   # (after TC) a work-group computes `amount` tiles of GLOBAL axis `axis` in a loop, its copies running on into the next
  WARPGROUP = auto() # (after TC and its UPCAST, LOCAL, UNROLL) each 4 warps compute their tile with wgmma, reading swizzled tiles (sm_90)
  BLOCK = auto()     # (CPUs) split `amount` off a GLOBAL axis; the rest becomes the outermost loop, around blocks whose inputs stay in cache
  LANES = auto()     # (CUDA, first) split `amount` lanes of a warp off every nested contraction's own axis and features axis `axis` (kernel.py)

class AxisKind(Enum):
  GLOBAL = auto()    # output axis: a loop on a CPU, the work-group id on a GPU
  LOCAL = auto()     # output axis: a thread id inside the work-group
  UPCAST = auto()    # output axis: straight-line lanes, an accumulator and a store each
  GROUP = auto()     # reduce axis: a thread id inside the work-group; the threads' partial results meet in local memory
  REDUCE = auto()    # reduce axis: a loop
  UNROLL = auto()    # reduce axis: straight-line lanes, added up in one loop trip
  WARP = auto()      # output axis: a thread id inside a warp, whose 32 threads compute a tensor-core tile together
  FRAGMENT = auto()  # output axis: a thread's lanes of a tensor-core tile (an accumulator each, as UPCAST)
  TC = auto()        # reduce axis: reduced inside one tensor-core instruction (mma), by the warp together
  SERIAL = auto()    # output axis: a loop inside the work-group around its reduce and stores (PERSIST)
  LANE = auto()      # either side: a thread id among a warp's neighbouring lanes, one index for every LANE axis (LANES)

REDUCE_SIDE = (AxisKind.GROUP, AxisKind.REDUCE, AxisKind.UNROLL)
LANES = (AxisKind.UPCAST, AxisKind.UNROLL, AxisKind.FRAGMENT)
THREADS = (AxisKind.LOCAL, AxisKind.GROUP, AxisKind.WARP)  # the thread ids of a work-group
SPLIT_KINDS = {OptOps.UPCAST: AxisKind.UPCAST, OptOps.UNROLL: AxisKind.UNROLL, OptOps.LOCAL: AxisKind.LOCAL, OptOps.GROUP: AxisKind.GROUP,
               OptOps.GROUPTOP: AxisKind.GROUP}  # the kind of the axis an Opt splits off
# the layout, outermost first:
# [GLOBAL and SERIAL | LOCAL | GROUP | LANE and WARP | REDUCE | UPCAST, UNROLL, FRAGMENT and TC in the order they were made]
LAYOUT_RANK = {AxisKind.GLOBAL: 0, AxisKind.SERIAL: 0, AxisKind.LOCAL: 1, AxisKind.GROUP: 2, AxisKind.LANE: 3, AxisKind.WARP: 3,
               AxisKind.REDUCE: 4, AxisKind.UPCAST: 5,
               AxisKind.UNROLL: 5, AxisKind.FRAGMENT: 5, AxisKind.TC: 5}
KIND_COLORS = {AxisKind.GLOBAL: "blue", AxisKind.LOCAL: "cyan", AxisKind.UPCAST: "yellow", AxisKind.GROUP: "green",
               AxisKind.REDUCE: "red", AxisKind.UNROLL: "magenta", AxisKind.WARP: "cyan", AxisKind.FRAGMENT: "yellow", AxisKind.TC: "magenta",
               AxisKind.SERIAL: "white", AxisKind.LANE: "cyan"}

def describe_layout(full_shape: tuple, kinds: tuple[AxisKind, ...], owners: tuple[frozenset[int], ...]) -> str:
  """The axes, each size coloured by its kind (DEBUG>=3 prints it), then the kinds in words with each reduce-side axis's owners."""
  sizes = " ".join(colored(f"{size if isinstance(size, int) else size.render():>4}", KIND_COLORS[kind]) for size, kind in zip(full_shape, kinds))
  return sizes + "   " + " ".join(f"{kind.name.lower()}{sorted(owner) if owner else ''}" for kind, owner in zip(kinds, owners))

TC_DTYPES = (dtypes.float16, dtypes.bfloat16)  # what the tensor cores multiply (mma.sync m16n8k16, fp32 accumulate)
TC_SHAPE = (16, 8, 16)  # (M, N, K) of one mma of 16-bit floats; of TF32 (float32 inputs, ALLOW_TF32=1) K is 8: 16 bytes of a row either way
def tc_reduce(dtype: DType) -> int: return 32 // dtype.itemsize  # K of one mma of this input dtype

def partials_dtype(dtype: DType) -> DType:
  """What a group reduce's partial results are in local memory: float for 16-bit floats, as in registers (OpenCL has no half
  arrays without cl_khr_fp16)."""
  return dtypes.float32 if dtype in TC_DTYPES else dtype

@dataclass(frozen=True)
class Opt:
  op: OptOps
  axis: int
  amount: int
  def __repr__(self) -> str: return f"Opt({self.op.name}, {self.axis}, {self.amount})"

class TileLayout(NamedTuple):
  """A staged buffer's tile in local memory: `view` maps the kernel's full shape to a position (stride 0 along the axes the tile
  does not span); `size` elements of `dtype`, padding included; its axes in the buffer's memory order; `rows`: the axis whose
  stride is padded to an odd number of 16 bytes (of a tensor-core operand, the axis ldmatrix's rows step along: K when it is read
  transposed), or None. `row_length`: of a warpgroup operand (WARPGROUP), the elements of its contiguous dimension; its rows are
  stored 128 bytes at a time (a longer row's next 128 bytes after every row's first), their 16-byte chunks swizzled (tiles.py)."""
  view: View
  size: int
  dtype: DType
  load_order: list[int]
  rows: int | None
  row_length: int = 0

class KernelOptError(ValueError):
  """An Opt that does not apply to this kernel; the kernel is left as it was."""

@dataclass(frozen=True)
class KernelTarget:
  """What a device offers a kernel: work-groups of threads that share local memory (GPUs) and their limits."""
  has_local: bool = False
  max_local_size: int = 1024         # threads in one work-group
  local_memory_bytes: int = 48 * 1024
  max_local_dim_sizes: tuple[int, ...] = (1024, 1024, 64)  # threads along each launch dimension (x, y, z)
  max_upcast: int = 256              # upcast lanes an Opt list may reach (see MAX_UPCAST)
  tensor_cores: bool = False         # warp-level mma.sync m16n8k16 on 16-bit floats, operands read with ldmatrix (CUDA, sm_80 on)
  warpgroups: bool = False           # warpgroup-level wgmma m64nNk16, operands read from local memory by descriptors (CUDA sm_90)
  vector_lanes: int = 8              # 32-bit lanes of a CPU vector register (AVX2 8, AVX-512 16): CPU register tiles scale with it
  compute_units: int = 1             # work-groups that run side by side at most once each (a GPU's SMs): how many fill the device
  warp_shuffles: bool = False        # threads of a warp read each other's registers (CUDA __shfl_xor_sync): LANES

CPU_TARGET = KernelTarget()
# Upcast lanes (straight-line code per loop trip) the CPU heuristic uses at most: a safe size. Larger tiles can pay (an AVX-512
# core has 32 vector registers, a GPU thread up to 255 scalar ones) but cost compile time and can spill, so only BEAM, which
# measures, and the GPU heuristic for big matmuls (measured there) go beyond it, up to the target's max_upcast.
MAX_UPCAST = 64
# A GPU kernel may reach more: the staged matmul's 8x8 tile with 16 reduce elements a trip is 1024 lanes (64 accumulators).
GPU_MAX_UPCAST = 1024
# And a CPU's attention: 16 rows in a vector register's lanes by up to 128 features, 8 keys a trip (nested_plan.rows_in_lanes; 16
# lanes are one vector op). BEAM keeps to SEARCH_MAX_UPCAST (search.py)
CPU_MAX_UPCAST = 16384
