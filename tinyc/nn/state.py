"""Layer 6: model state. Named tensors of any object (state dicts), loading them back in place, and safetensors files.
Imports helpers, dtype, tensor.

A safetensors file is an 8-byte little-endian header length N, N bytes of JSON naming each tensor's dtype, shape and byte range
(`data_offsets`, relative to the end of the header), then the data. https://github.com/huggingface/safetensors
"""
from __future__ import annotations
import json, os, secrets, types
from typing import Any, BinaryIO, NamedTuple
import numpy as np
from tinyc.dtype import DType, dtypes
from tinyc.helpers import prod
from tinyc.tensor import Tensor

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

# ***** safetensors *****

SAFETENSORS_DTYPES: dict[str, DType] = {
  "BOOL": dtypes.bool, "I8": dtypes.int8, "U8": dtypes.uint8, "I16": dtypes.int16, "U16": dtypes.uint16, "I32": dtypes.int32,
  "U32": dtypes.uint32, "I64": dtypes.int64, "U64": dtypes.uint64, "F16": dtypes.float16, "BF16": dtypes.bfloat16,
  "F32": dtypes.float32, "F64": dtypes.float64}
SAFETENSORS_NAMES = {dtype: name for name, dtype in SAFETENSORS_DTYPES.items()}

class SafetensorsError(ValueError):
  """A file that is not a valid safetensors file."""

class Entry(NamedTuple):
  """One tensor's header record: where its bytes lie in the data section."""
  dtype: DType
  shape: tuple[int, ...]
  begin: int
  end: int

def _read_header(file: BinaryIO, path: str) -> tuple[dict[str, Entry], dict[str, str], int]:
  """The validated header of an open file: (entries, metadata, data section size). Every range is checked against the file size
  before any data is read, so a bad file raises instead of reading out of bounds."""
  def bad(what: str) -> SafetensorsError: return SafetensorsError(f"{path}: not a valid safetensors file: {what}")
  file_size = os.fstat(file.fileno()).st_size
  if file_size < 8: raise bad(f"the file has {file_size} bytes, fewer than the 8-byte header length")
  header_size = int.from_bytes(file.read(8), "little")
  if header_size > file_size - 8: raise bad(f"the header length says {header_size} bytes but only {file_size - 8} follow it (truncated file?)")
  try: header = json.loads(file.read(header_size).decode("utf-8"))
  except (UnicodeDecodeError, json.JSONDecodeError) as error: raise bad(f"the {header_size}-byte header is not UTF-8 JSON ({error})") from None
  if not isinstance(header, dict): raise bad(f"the header is a JSON {type(header).__name__}, not an object")
  metadata = header.pop("__metadata__", {})
  if not isinstance(metadata, dict) or not all(isinstance(v, str) for v in metadata.values()):
    raise bad(f"__metadata__ must map strings to strings, got {metadata!r}")
  data_size = file_size - 8 - header_size
  entries: dict[str, Entry] = {}
  for name, record in header.items():
    if not isinstance(record, dict) or not {"dtype", "shape", "data_offsets"} <= record.keys():
      raise bad(f"tensor {name!r} needs an object with dtype, shape and data_offsets, got {record!r}")
    if (dtype := SAFETENSORS_DTYPES.get(record["dtype"])) is None:
      raise bad(f"tensor {name!r} has dtype {record['dtype']!r}, which tinyc does not know (known: {', '.join(SAFETENSORS_DTYPES)})")
    shape, offsets = record["shape"], record["data_offsets"]
    if not isinstance(shape, list) or not all(isinstance(d, int) and not isinstance(d, bool) and d >= 0 for d in shape):
      raise bad(f"tensor {name!r} has shape {shape!r}, not a list of non-negative integers")
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(isinstance(o, int) and not isinstance(o, bool) for o in offsets)):
      raise bad(f"tensor {name!r} has data_offsets {offsets!r}, not [begin, end]")
    begin, end = offsets
    if not 0 <= begin <= end <= data_size:
      raise bad(f"tensor {name!r} has data_offsets [{begin}, {end}], outside the {data_size}-byte data section (or end before begin)")
    if end - begin != prod(shape) * dtype.itemsize:
      raise bad(f"tensor {name!r} of {record['dtype']} {shape} needs {prod(shape) * dtype.itemsize} bytes but its data_offsets span {end - begin}")
    entries[name] = Entry(dtype, tuple(shape), begin, end)
  # the tensors must tile the data section exactly, as the reference implementation requires: no overlap, no hole, nothing after
  covered, covered_by = 0, "the start"
  for name, entry in sorted(entries.items(), key=lambda item: (item[1].begin, item[1].end)):
    if entry.begin < covered: raise bad(f"tensor {name!r} at [{entry.begin}, {entry.end}] overlaps {covered_by} (which ends at {covered})")
    if entry.begin > covered: raise bad(f"the bytes [{covered}, {entry.begin}) between {covered_by} and tensor {name!r} belong to no tensor")
    covered, covered_by = entry.end, f"tensor {name!r}"
  if covered != data_size: raise bad(f"the data section has {data_size} bytes but the tensors cover only {covered}")
  return entries, metadata, data_size

def _to_tensor(raw: bytes, dtype: DType, shape: tuple[int, ...], device: str | None) -> Tensor:
  if dtype == dtypes.bfloat16:  # bf16 bits become the top half of float32s, which tinyc stores back bit for bit (NaN payloads too)
    return Tensor((np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape), device, dtype=dtype)
  if dtype == dtypes.bool: return Tensor((np.frombuffer(raw, np.uint8) != 0).reshape(shape), device)
  return Tensor(np.frombuffer(raw, dtype.np.newbyteorder("<")).astype(dtype.np).reshape(shape), device)

def _to_bytes(tensor: Tensor) -> bytes:
  values = tensor.numpy()
  if tensor.dtype == dtypes.bfloat16: return (values.view(np.uint32) >> 16).astype("<u2").tobytes()
  return values.astype(tensor.dtype.np.newbyteorder("<")).tobytes()

def safe_load(path: str | os.PathLike, device: str | None = None) -> dict[str, Tensor]:
  """Every tensor of a safetensors file, by name, in the file's order."""
  path = os.fspath(path)
  with open(path, "rb") as file:
    entries, _, data_size = _read_header(file, path)
    data = file.read(data_size)
  if len(data) != data_size: raise SafetensorsError(f"{path}: the file shrank while being read: expected {data_size} data bytes, got {len(data)}")
  return {name: _to_tensor(data[e.begin:e.end], e.dtype, e.shape, device) for name, e in entries.items()}

def safe_load_metadata(path: str | os.PathLike) -> dict[str, str]:
  """The `__metadata__` strings of a safetensors file (empty if it has none); the header is validated, the data not read."""
  path = os.fspath(path)
  with open(path, "rb") as file: return _read_header(file, path)[1]

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
