"""Layer 3: BEAM's learned cost model (issue 16): ranks a search step's candidates from their features before any is built, so
the search builds and times only the few it ranks first. Imports helpers, safetensors, codegen/kernel, codegen/features.

The model is a small MLP (bench/beam_model.py trains it with tinyc's Tensor API and saves it with safetensors); here it runs in
numpy, since codegen/ sits below the Tensor API. Its input is features.features(kernel) scaled by the training rows' mean and
deviation (tensors `mean`, `scale`), its layers `layer{i}.weight` (out x in) and `layer{i}.bias`, ReLU between them, its output a
candidate's log2 run time relative to its kernel's other candidates: only the order within one kernel means anything.

Two models ship in the package (codegen/models/): `gpu.safetensors` (trained on an H200 through CUDA), for targets with local memory
(CUDA, OpenCL), and `cpu.safetensors` (trained on an AVX-512 CPU through LLVM). BEAM_MODEL=path uses another file (one
`python bench/beam_model.py collect && ... train` makes on another device); BEAM_MODEL=0 none.
"""
from __future__ import annotations
import functools
from pathlib import Path
import numpy as np
from tinyc.helpers import getenv
from tinyc.safetensors import read_arrays
from tinyc.codegen.features import FEATURE_NAMES, features
from tinyc.codegen.kernel import Kernel, KernelTarget

MODELS = Path(__file__).parent / "models"

class CostModel:
  def __init__(self, tensors: dict[str, np.ndarray]) -> None:
    self.mean, self.scale = tensors["mean"], tensors["scale"]
    if self.mean.shape != (len(FEATURE_NAMES),):
      raise ValueError(f"a cost model for {self.mean.shape} features, not this tinyc's {len(FEATURE_NAMES)}: retrain it (bench/beam_model.py)")
    count = sum(1 for name in tensors if name.endswith(".weight"))
    self.layers = [(tensors[f"layer{i}.weight"].T, tensors[f"layer{i}.bias"]) for i in range(count)]

  def predict(self, rows: np.ndarray) -> np.ndarray:
    """Each row's relative log2 time (lower is faster)."""
    x = (rows - self.mean) / self.scale
    for number, (weight, bias) in enumerate(self.layers):
      x = x @ weight + bias
      if number < len(self.layers) - 1: x = np.maximum(x, 0)
    return x.reshape(-1)

  def rank(self, kernels: list[Kernel]) -> list[int]:
    """The kernels' positions, the one predicted fastest first."""
    predicted = self.predict(np.array([features(kernel) for kernel in kernels], dtype=np.float32).reshape(-1, len(FEATURE_NAMES)))
    return [int(i) for i in np.argsort(predicted, kind="stable")]

def model_path(target: KernelTarget) -> Path | None:
  """The model a search for `target` uses: BEAM_MODEL's file, else the packaged one of its device class; None with BEAM_MODEL=0."""
  chosen = str(getenv("BEAM_MODEL", ""))
  if chosen == "0": return None
  return Path(chosen) if chosen and chosen != "1" else MODELS / ("gpu.safetensors" if target.has_local else "cpu.safetensors")

@functools.cache
def load(path: Path) -> CostModel | None:
  """The model in `path`; None where the package has no model for the device class (the search then builds every candidate)."""
  if not path.exists():
    if path.parent == MODELS: return None
    raise FileNotFoundError(f"BEAM_MODEL={path}: no such file. Train one with bench/beam_model.py, or set BEAM_MODEL=0 for none")
  return CostModel({name: array.astype(np.float32) for name, (array, _) in read_arrays(path).items()})
