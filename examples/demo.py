"""The pipeline at work: a small MLP forward pass and a softmax, built lazily, fused into a few kernels, compiled for the
default device and checked against numpy. Run it as `python examples/demo.py` (`GPU=1` or `CUDA=1` for another device);
`DEBUG=2` shows each kernel, `DEBUG=4` the generated source.
"""
import numpy as np
from tinyc import Tensor, Device, GlobalCounters
from tinyc.helpers import Context
from tinyc.schedule import create_schedule

SOURCE_LANGUAGE = {"LLVM": "LLVM IR", "GPU": "OpenCL C", "CUDA": "CUDA C"}  # what each device's renderer emits

def main() -> None:
  rng = np.random.default_rng(0)
  x, w1, b1, w2 = (rng.standard_normal(shape).astype(np.float32) for shape in ((64, 32), (32, 48), (48,), (48, 10)))
  print(f"device: {Device.DEFAULT}")

  # 1. nothing runs while the graph is built
  hidden = (Tensor(x) @ Tensor(w1) + Tensor(b1)).relu()
  probs = (hidden @ Tensor(w2)).softmax(-1)
  schedule = create_schedule([probs.lazydata])
  print(f"graph built: {len(schedule)} kernels planned for matmul+bias+relu, matmul, softmax")

  # 2. realize: the schedule runs; each line is one fused kernel
  GlobalCounters.reset()
  with Context(DEBUG=2): probs.realize()
  print(f"ran {GlobalCounters.kernel_count} kernels, {GlobalCounters.global_ops / 1e6:.2f} MFLOP")

  # 3. the result matches numpy
  h = np.maximum(x @ w1 + b1, 0) @ w2
  expected = np.exp(h - h.max(-1, keepdims=True))
  expected /= expected.sum(-1, keepdims=True)
  error = np.abs(probs.numpy() - expected).max()
  print(f"max abs error vs numpy: {error:.2e}")
  assert error < 1e-5, "tinyc disagrees with numpy"

  # 4. the code of one fused kernel: relu(x @ w + b) is a single loop nest
  print(f"\n{SOURCE_LANGUAGE[Device.DEFAULT]} of relu(x @ w1 + b1) (DEBUG=4 prints this for every kernel):")
  with Context(DEBUG=4): (Tensor(x[:4, :8]) @ Tensor(w1[:8, :4]) + Tensor(b1[:4])).relu().realize()

if __name__ == "__main__":
  main()
