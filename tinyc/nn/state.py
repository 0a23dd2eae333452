"""Layer 6: model state. Named tensors of any object (state dicts), loading them back in place, and safetensors files.
Imports helpers, dtype, tensor, safetensors (the file format).
"""
from __future__ import annotations
import json, os, secrets, types
from typing import Any, NamedTuple
import numpy as np
from tinyc.dtype import dtypes
from tinyc.tensor import Tensor
from tinyc.safetensors import SAFETENSORS_NAMES, SafetensorsError, read_arrays, read_header  # noqa: F401 (SafetensorsError: part of this module's API)

# ***** state dicts *****

# callables, classes and modules hold no model state; walking their __dict__ would wander through the whole program
NOT_STATE = (type, types.ModuleType, types.FunctionType, types.BuiltinFunctionType, types.MethodType)

def get_state_dict(obj: Any, prefix: str = "") -> dict[str, Tensor]:
  """Every Tensor reachable from obj (through lists, tuples, dicts and attributes) by dotted name, like `layers.0.weight`."""
  state: dict[str, Tensor] = {}
  def visit(value: Any, name: str, path: tuple[int, ...]) -> None:
    if isinstance(value, Tensor):
      state[name] = value
      return
    if id(value) in path or isinstance(value, NOT_STATE): return  # a cycle (a child pointing at its parent) adds no new names
    if hasattr(value, "_asdict"): items = list(value._asdict().items())  # a namedtuple: its field names
    elif isinstance(value, dict): items = list(value.items())
    elif isinstance(value, (list, tuple)): items = list(enumerate(value))
    elif hasattr(value, "__dict__"): items = list(vars(value).items())
    else: return
    for key, item in items: visit(item, f"{name}.{key}" if name else str(key), path + (id(value),))
  visit(obj, prefix.rstrip("."), ())
  return state

def get_parameters(obj: Any) -> list[Tensor]:
  """Every distinct Tensor reachable from obj, in state-dict order (a tensor shared by two layers appears once)."""
  return list({id(t): t for t in get_state_dict(obj).values()}.values())

class LoadResult(NamedTuple):
  """What load_state_dict left alone (only non-empty when strict=False), like torch's return value."""
  missing_keys: list[str]
  unexpected_keys: list[str]

class StateDictError(RuntimeError):
  """A state dict that does not fit the model: missing or unexpected names, or a shape mismatch."""

def load_state_dict(model: Any, state_dict: dict[str, Tensor], strict: bool = True) -> LoadResult:
  """Write state_dict's tensors into model's tensors in place (cast to the model's dtype and moved to its device).
  Everything is checked before anything is written, so a failed load leaves the model as it was."""
  model_state = get_state_dict(model)
  missing, unexpected = [k for k in model_state if k not in state_dict], [k for k in state_dict if k not in model_state]
  errors = [f"size mismatch for {k}: the state dict has shape {tuple(v.shape)}, the model {model_state[k].shape}"
            for k, v in state_dict.items() if k in model_state and tuple(v.shape) != model_state[k].shape]
  if strict and missing: errors.append(f"missing key(s) in state_dict: {', '.join(missing)}")
  if strict and unexpected: errors.append(f"unexpected key(s) in state_dict: {', '.join(unexpected)}")
  if errors:
    hint = " (pass strict=False to load only the names both have)" if strict and (missing or unexpected) else ""
    raise StateDictError(f"error(s) loading a state dict into {type(model).__name__}{hint}:\n  " + "\n  ".join(errors))
  # one assign per distinct tensor (a tied weight has several names): a second assign before realizing would not write in place
  targets = {id(model_state[k]): (model_state[k], state_dict[k]) for k in model_state if k in state_dict}
  Tensor.corealize([target.assign(value.to(target.device)) for target, value in targets.values()])
  return LoadResult(missing, unexpected)

# ***** safetensors (the format: tinyc/safetensors.py) *****

def _to_bytes(tensor: Tensor) -> bytes:
  values = tensor.numpy()
  if tensor.dtype == dtypes.bfloat16: return (values.view(np.uint32) >> 16).astype("<u2").tobytes()
  return values.astype(tensor.dtype.np.newbyteorder("<")).tobytes()

def safe_load(path: str | os.PathLike, device: str | None = None) -> dict[str, Tensor]:
  """Every tensor of a safetensors file, by name, in the file's order."""
  return {name: Tensor(array, device, dtype=dtype) for name, (array, dtype) in read_arrays(path).items()}

def safe_load_metadata(path: str | os.PathLike) -> dict[str, str]:
  """The `__metadata__` strings of a safetensors file (empty if it has none); the header is validated, the data not read."""
  path = os.fspath(path)
  with open(path, "rb") as file: return read_header(file, path)[1]

def safe_save(tensors: dict[str, Tensor], path: str | os.PathLike, metadata: dict[str, str] | None = None) -> None:
  """Write tensors to a safetensors file. The file appears whole or not at all: it is written beside the target, then renamed."""
  path = os.fspath(path)
  for name, tensor in tensors.items():
    if not isinstance(name, str) or name == "__metadata__":
      raise ValueError(f"safe_save: tensor names must be strings other than '__metadata__', got {name!r}")
    if not isinstance(tensor, Tensor): raise TypeError(f"safe_save: {name!r} is a {type(tensor).__name__}, not a Tensor")
    if tensor.dtype not in SAFETENSORS_NAMES: raise TypeError(f"safe_save: {name!r} has dtype {tensor.dtype}, which safetensors cannot store")
  if metadata is not None and not all(isinstance(k, str) and isinstance(v, str) for k, v in metadata.items()):
    raise TypeError(f"safe_save: metadata must map strings to strings (json.dumps anything else first), got {metadata!r}")
  Tensor.corealize(tensors.values())
  header: dict[str, Any] = {"__metadata__": metadata} if metadata else {}
  blobs, offset = [], 0
  for name, tensor in tensors.items():
    blobs.append(blob := _to_bytes(tensor))
    header[name] = {"dtype": SAFETENSORS_NAMES[tensor.dtype], "shape": list(tensor.shape), "data_offsets": [offset, offset + len(blob)]}
    offset += len(blob)
  header_bytes = json.dumps(header, separators=(",", ":")).encode("utf-8")
  header_bytes += b" " * (-len(header_bytes) % 8)  # the data starts 8-byte aligned, as the reference writer pads it
  temp = os.path.join(os.path.dirname(os.path.abspath(path)), f".{os.path.basename(path)}.{secrets.token_hex(4)}.tmp")
  # os.open with 0o666 gives the permissions a plain open() would (the umask applies), unlike tempfile's 0o600
  descriptor = os.open(temp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_BINARY", 0), 0o666)
  try:
    with os.fdopen(descriptor, "wb") as file:
      file.write(len(header_bytes).to_bytes(8, "little") + header_bytes)
      for blob in blobs: file.write(blob)
      file.flush()
      os.fsync(file.fileno())
    os.replace(temp, path)
  except BaseException:
    if os.path.exists(temp): os.remove(temp)
    raise
