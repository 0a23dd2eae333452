"""Layer 1: the safetensors file format, read into numpy arrays: nn/state.py makes Tensors of them, BEAM's cost model
(codegen/cost_model.py) reads its weights with it. Imports dtype, helpers.

A safetensors file is an 8-byte little-endian header length N, N bytes of JSON naming each tensor's dtype, shape and byte range
(`data_offsets`, relative to the end of the header), then the data. https://github.com/huggingface/safetensors
"""
from __future__ import annotations
import json, os
from typing import BinaryIO, NamedTuple
import numpy as np
from tinyc.dtype import DType, dtypes
from tinyc.helpers import prod

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

def read_header(file: BinaryIO, path: str) -> tuple[dict[str, Entry], dict[str, str], int]:
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

def read_arrays(path: str | os.PathLike) -> dict[str, tuple[np.ndarray, DType]]:
  """Every tensor of a safetensors file as (numpy array, dtype), by name, in the file's order: a bfloat16 one as float32 values, a
  bool one as numpy bools."""
  path = os.fspath(path)
  with open(path, "rb") as file:
    entries, _, data_size = read_header(file, path)
    data = file.read(data_size)
  if len(data) != data_size: raise SafetensorsError(f"{path}: the file shrank while being read: expected {data_size} data bytes, got {len(data)}")
  return {name: (_decode(data[e.begin:e.end], e.dtype, e.shape), e.dtype) for name, e in entries.items()}

def _decode(raw: bytes, dtype: DType, shape: tuple[int, ...]) -> np.ndarray:
  if dtype == dtypes.bfloat16:  # bf16 bits become the top half of float32s, which tinyc stores back bit for bit (NaN payloads too)
    return (np.frombuffer(raw, "<u2").astype(np.uint32) << 16).view(np.float32).reshape(shape)
  if dtype == dtypes.bool: return (np.frombuffer(raw, np.uint8) != 0).reshape(shape)
  return np.frombuffer(raw, dtype.np.newbyteorder("<")).astype(dtype.np).reshape(shape)
