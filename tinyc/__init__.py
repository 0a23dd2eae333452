"""tinyc: a lazy Tensor whose graph is fused into kernels, compiled to LLVM IR / CUDA / OpenCL, and run."""
from tinyc.tensor import Tensor
from tinyc.dtype import dtypes
from tinyc.device import Device
from tinyc.helpers import Context, DEBUG, GlobalCounters
from tinyc.shape.symbolic import Variable
from tinyc.amp import autocast

__all__ = ["Tensor", "dtypes", "Device", "Context", "DEBUG", "GlobalCounters", "Variable", "autocast"]
