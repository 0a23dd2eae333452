"""Layer 3: the WARPGROUP Opt's rules (codegen/kernel.py applies it) and the dense tile rows wgmma reads. Imports axes, shape/.
A function here takes the Kernel as it is being optimized (`self`: it reads the kernel's fields as its methods do)."""
from __future__ import annotations
from typing import TYPE_CHECKING, Sequence, cast
from tinyc.helpers import ALLOW_TF32, prod
from tinyc.shape.symbolic import sint
from tinyc.codegen.axes import TC_DTYPES, AxisKind, KernelOptError, Opt
if TYPE_CHECKING: from tinyc.codegen.kernel import Kernel

def check_opt(condition: bool, opt: Opt, reason: str) -> None:
  """Raise KernelOptError, saying why, unless `condition` holds (an Opt that does not apply leaves the kernel as it was)."""
  if not condition: raise KernelOptError(f"{opt}: {reason}")

def contiguous_dimension(self: Kernel, number: int) -> list[int]:
  """A tensor-core operand's K axes (UNROLL, TC) where K is its contiguous axis, else its own output axes (M or N), outermost first."""
  axes, strides = self.tile_axes(number), self.sts[number].real_strides(ignore_valid=True)
  k_axes = [axis for axis in axes if self.kinds[axis] in (AxisKind.UNROLL, AxisKind.TC)]
  chosen = k_axes if along_k(self, number) else [axis for axis in axes if axis not in k_axes]
  return sorted(chosen, key=lambda axis: -cast(int, strides[axis] or 0))

def check_warpgroup(self: Kernel, opt: Opt) -> None:
  """Raise unless WARPGROUP applies. Each 4 warps of the work-group (a warpgroup: 64 rows of M, 16 a warp, as TC split them)
  compute all of N with one wgmma m64nNk16 (k8 for TF32) a step of K, B read from its tile by a descriptor, A too or, where
  wgmma cannot read it so (`a_in_registers`), by the threads into registers. So the plan must be TC's with one LOCAL axis along
  M (4 or 8 warps), one UPCAST along N (N/8 mma tiles, N up to 256), 128 bytes of K a trip (UNROLL), nothing else; and each
  operand read by descriptor dense rows along its contiguous dimension (K, or M or N: then a multiple of 64 elements), along K
  for TF32, the only order in which wgmma reads 32-bit values."""
  check_opt(self.target.warpgroups, opt, "this device has no warpgroup mma (wgmma: CUDA sm_90)")
  check_opt(bool(self.axes(AxisKind.TC)) and not self.axes(AxisKind.SERIAL), opt, "WARPGROUP comes after TC and before PERSIST")
  check_opt(len(self.staged) == 2, opt, "WARPGROUP reads TC's two operands staged in local memory (these are in registers)")
  a, b = warpgroup_operands(self)
  local, upcast = self.axes(AxisKind.LOCAL), self.axes(AxisKind.UPCAST)
  check_opt(len(local) == 1 and self.full_shape[local[0]] in (4, 8) and local[0] in self.tile_axes(a) and local[0] not in self.tile_axes(b),
         opt, "WARPGROUP needs one LOCAL axis of 4 or 8 warps along M")
  check_opt(len(upcast) == 1 and upcast[0] in self.tile_axes(b) and upcast[0] not in self.tile_axes(a) and 8 * self.full_shape[upcast[0]] <= 256,
         opt, "WARPGROUP needs one UPCAST axis along N, of at most 32 mma tiles")
  check_opt(not self.axes(AxisKind.GROUP) and self.size_of(AxisKind.UNROLL, AxisKind.TC) * self.bufs[a].dtype.itemsize == 128, opt,
         "WARPGROUP needs 128 bytes of K a trip (UNROLL), and no GROUP")
  check_opt(self.bufs[b].dtype in TC_DTYPES or bool(ALLOW_TF32), opt, "WARPGROUP reads B from local memory, where float32 is not split "
         "into 3xTF32's two parts (TF32 alone with ALLOW_TF32=1)")
  check_opt(self.bufs[b].dtype in TC_DTYPES or along_k(self, b), opt, "WARPGROUP reads TF32 values only along K: B is not contiguous along K "
         "(the other TC choice, M and N swapped, may be)")
  for number in (a, b):
    if number == a and a_in_registers(self): continue
    contiguous, strides = contiguous_dimension(self, number), self.sts[number].real_strides(ignore_valid=True)
    check_opt(list(dense_strides(contiguous, self.full_shape).values()) == [strides[axis] for axis in contiguous] and
           prod(self.full_shape[axis] for axis in contiguous) % (128 // self.bufs[a].dtype.itemsize) == 0, opt,
           f"buffer {number} is not contiguous along K, nor along its own axes for a multiple of 128 bytes")
  self.warpgroups = True

def warpgroup_operands(self: Kernel) -> tuple[int, int]:
  """The buffer numbers of A (spanning M: WARP 8) and B."""
  a, b = sorted(self.staged, key=lambda number: -max(self.full_shape[axis] for axis in self.tile_axes(number) if self.kinds[axis] is AxisKind.WARP))
  return a, b

def along_k(self: Kernel, number: int) -> bool:
  """Whether tensor-core operand `number` is contiguous along K."""
  return self.sts[number].real_strides(ignore_valid=True)[self.axes(AxisKind.TC)[0]] == 1

def a_in_registers(self: Kernel) -> bool:
  """Whether wgmma takes A from registers, read from its tile by the threads as mma.sync's fragments are: TF32 along M, an order
  wgmma's descriptors cannot give 32-bit values in."""
  return self.bufs[a := warpgroup_operands(self)[0]].dtype not in TC_DTYPES and not along_k(self, a)

def dense_strides(order: Sequence[int], shape: Sequence[sint]) -> dict[int, int]:
  """Row-major strides of the axes in `order` (outermost first), by axis."""
  strides, size = {}, 1
  for axis in reversed(order): strides[axis], size = size, size * cast(int, shape[axis])
  return dict(reversed(strides.items()))
