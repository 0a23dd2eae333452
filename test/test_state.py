"""nn.state: state-dict naming and loading, and safetensors files (round trips, the byte format, and every kind of bad file)."""
import json, os, struct
from collections import namedtuple
import numpy as np
import pytest
from tinyc import Tensor, dtypes
from tinyc.nn.state import (SafetensorsError, StateDictError, get_parameters, get_state_dict, load_state_dict, safe_load, safe_load_metadata,
                            safe_save)

# ***** state dicts *****

Pair = namedtuple("Pair", ["first", "second"])

class Linear:
  def __init__(self, n: int, m: int, bias: bool = True):
    self.weight = Tensor(np.arange(n * m, dtype=np.float32).reshape(n, m))
    self.bias = Tensor(np.zeros(m, dtype=np.float32)) if bias else None
    self.name, self.activation = "linear", np.tanh  # not state

class Model:
  def __init__(self):
    self.layers = [Linear(2, 3), Linear(3, 1, bias=False)]
    self.norms = {"pre": Linear(1, 2), 7: (Tensor([1.0]),)}
    self.pair = Pair(Tensor([2.0]), Tensor([3.0]))
    self.tied = self.layers[0].weight  # one tensor under two names
    self.layers[1].parent = self  # a cycle
    self.steps = 3

def test_state_dict_names():
  model = Model()
  state = get_state_dict(model)
  assert list(state) == ["layers.0.weight", "layers.0.bias", "layers.1.weight", "norms.pre.weight", "norms.pre.bias", "norms.7.0",
                         "pair.first", "pair.second", "tied"]
  assert state["layers.0.weight"] is model.layers[0].weight and state["tied"] is model.layers[0].weight
  assert list(get_state_dict(model.norms, prefix="model.norms.")) == ["model.norms.pre.weight", "model.norms.pre.bias", "model.norms.7.0"]
  assert get_state_dict(model.pair.first) == {"": model.pair.first}

def test_get_parameters_deduplicates():
  model = Model()
  params = get_parameters(model)
  assert len(params) == 8 and len({id(p) for p in params}) == 8
  assert params[0] is model.layers[0].weight

def test_load_state_dict_in_place():
  model, source = Model(), Model()
  for i, tensor in enumerate(get_parameters(source)): tensor.assign(Tensor(np.full(tensor.shape, i + 10.0, dtype=np.float32))).realize()
  target_buffer = model.layers[0].weight.lazydata.base.realized
  result = load_state_dict(model, get_state_dict(source))
  assert result.missing_keys == [] and result.unexpected_keys == []
  for name, tensor in get_state_dict(model).items(): np.testing.assert_array_equal(tensor.numpy(), get_state_dict(source)[name].numpy(), err_msg=name)
  assert model.layers[0].weight.lazydata.base.realized is target_buffer

def test_load_state_dict_casts_to_the_model_dtype():
  model = Linear(1, 2)
  load_state_dict(model, {"weight": Tensor([[1, 2]]), "bias": Tensor(np.array([0.5, 1.5]))})
  assert model.weight.dtype == dtypes.float32 and model.weight.tolist() == [[1.0, 2.0]] and model.bias.tolist() == [0.5, 1.5]

def test_load_state_dict_strict_names_missing_and_unexpected_keys():
  model = Linear(2, 3)
  before = model.weight.numpy().copy()
  with pytest.raises(StateDictError, match="missing key.*: bias") as info:
    load_state_dict(model, {"weight": Tensor(np.ones((2, 3), dtype=np.float32)), "scale": Tensor([1.0]), "shift": Tensor([1.0])})
  assert "unexpected key(s) in state_dict: scale, shift" in str(info.value) and "strict=False" in str(info.value)
  np.testing.assert_array_equal(model.weight.numpy(), before)  # nothing written when the load fails
  result = load_state_dict(model, {"weight": Tensor(np.ones((2, 3), dtype=np.float32)), "scale": Tensor([1.0])}, strict=False)
  assert result.missing_keys == ["bias"] and result.unexpected_keys == ["scale"]
  np.testing.assert_array_equal(model.weight.numpy(), np.ones((2, 3)))

def test_load_state_dict_shape_mismatch():
  model = Linear(2, 3)
  for strict in (True, False):
    with pytest.raises(StateDictError, match=r"size mismatch for weight: the state dict has shape \(3, 2\), the model \(2, 3\)"):
      load_state_dict(model, {"weight": Tensor(np.ones((3, 2), dtype=np.float32)), "bias": Tensor(np.ones(3, dtype=np.float32))}, strict=strict)
  np.testing.assert_array_equal(model.bias.numpy(), np.zeros(3))

# ***** safetensors round trips *****

def sample(dtype, shape, rng):
  if dtype == dtypes.bool: return rng.integers(0, 2, shape).astype(bool)
  if dtypes.is_int(dtype):
    info = np.iinfo(dtype.np)
    values = rng.integers(info.min, info.max, shape, dtype=dtype.np, endpoint=True)
    if values.size >= 2: values.reshape(-1)[:2] = [info.min, info.max]
    return values
  if dtype == dtypes.bfloat16: return np.asarray((rng.integers(0, 2 ** 16, shape).astype(np.uint32) << 16).view(np.float32))
  values = rng.standard_normal(shape).astype(dtype.np)
  if values.size >= 4: values.reshape(-1)[:4] = [np.inf, -np.inf, np.nan, -0.0]
  return values

def raw_bits(array, dtype):
  """The exact bits of an array, so NaNs and -0.0 compare exactly."""
  if dtype == dtypes.bfloat16: return array.view(np.uint32) >> 16
  return array.view(f"u{array.dtype.itemsize}") if array.dtype.kind == "f" else array

ALL_DTYPES = [dtypes.bool, dtypes.int8, dtypes.uint8, dtypes.int16, dtypes.uint16, dtypes.int32, dtypes.uint32, dtypes.int64, dtypes.uint64,
              dtypes.float16, dtypes.bfloat16, dtypes.float32, dtypes.float64]

@pytest.mark.parametrize("dtype", ALL_DTYPES, ids=[d.name for d in ALL_DTYPES])
def test_round_trip_every_dtype(tmp_path, dtype):
  rng = np.random.default_rng(0)
  shapes = {"matrix": (3, 5), "scalar": (), "empty": (0, 4), "vector": (7,)}
  arrays = {name: sample(dtype, shape, rng) for name, shape in shapes.items()}
  tensors = {name: Tensor(a, dtype=dtype) for name, a in arrays.items()}
  assert all(t.dtype == dtype for t in tensors.values())
  path = tmp_path / "model.safetensors"
  safe_save(tensors, path)
  loaded = safe_load(path)
  assert list(loaded) == list(shapes)
  for name, tensor in loaded.items():
    assert tensor.dtype == dtype and tensor.shape == shapes[name], name
    np.testing.assert_array_equal(raw_bits(tensor.numpy(), dtype), raw_bits(arrays[name], dtype), err_msg=name)

def test_bfloat16_every_bit_pattern_is_exact(tmp_path):
  bits = np.arange(2 ** 16, dtype=np.uint32)
  tensor = Tensor((bits << 16).view(np.float32), dtype=dtypes.bfloat16)
  path = tmp_path / "bf16.safetensors"
  safe_save({"all": tensor}, path)
  raw = path.read_bytes()
  data_start = 8 + struct.unpack("<Q", raw[:8])[0]
  np.testing.assert_array_equal(np.frombuffer(raw[data_start:], "<u2"), bits)  # the file holds the raw bf16 bits
  np.testing.assert_array_equal(safe_load(path)["all"].numpy().view(np.uint32) >> 16, bits)

def test_file_layout(tmp_path):
  path = tmp_path / "layout.safetensors"
  safe_save({"b": Tensor(np.array([1, 2], dtype=np.int16)), "a": Tensor(np.array([[1.5]], dtype=np.float32))}, path, metadata={"format": "pt"})
  raw = path.read_bytes()
  header_size = struct.unpack("<Q", raw[:8])[0]
  assert header_size % 8 == 0, "the data section starts 8-byte aligned"
  header = json.loads(raw[8:8 + header_size])
  assert header == {"__metadata__": {"format": "pt"}, "b": {"dtype": "I16", "shape": [2], "data_offsets": [0, 4]},
                    "a": {"dtype": "F32", "shape": [1, 1], "data_offsets": [4, 8]}}
  assert raw[8 + header_size:] == struct.pack("<hhf", 1, 2, 1.5)

def write_file(path, header, data: bytes = b"", header_bytes: bytes | None = None, header_size: int | None = None) -> str:
  body = json.dumps(header).encode() if header_bytes is None else header_bytes
  path.write_bytes(struct.pack("<Q", len(body) if header_size is None else header_size) + body + data)
  return str(path)

def test_loads_a_hand_written_file(tmp_path):
  header = {"__metadata__": {"source": "hand"}, "w": {"dtype": "F32", "shape": [2, 2], "data_offsets": [8, 24]},
            "n": {"dtype": "I64", "shape": [], "data_offsets": [0, 8]}, "e": {"dtype": "U8", "shape": [0], "data_offsets": [24, 24]}}
  path = write_file(tmp_path / "hand.safetensors", header, struct.pack("<q4f", -5, 1.0, 2.0, 3.0, 4.0))
  loaded = safe_load(path)
  assert loaded["w"].tolist() == [[1.0, 2.0], [3.0, 4.0]] and loaded["n"].dtype == dtypes.int64 and loaded["n"].item() == -5
  assert loaded["e"].shape == (0,) and loaded["e"].dtype == dtypes.uint8
  assert safe_load_metadata(path) == {"source": "hand"}

def test_metadata(tmp_path):
  path = tmp_path / "meta.safetensors"
  safe_save({"x": Tensor([1.0])}, path, metadata={"epoch": "3", "note": "héllo"})
  assert safe_load_metadata(path) == {"epoch": "3", "note": "héllo"}
  safe_save({"x": Tensor([1.0])}, path)
  assert safe_load_metadata(path) == {}
  with pytest.raises(TypeError, match="metadata must map strings to strings"): safe_save({"x": Tensor([1.0])}, path, metadata={"epoch": 3})
  with pytest.raises(ValueError, match="__metadata__"): safe_save({"__metadata__": Tensor([1.0])}, path)
  with pytest.raises(TypeError, match="not a Tensor"): safe_save({"x": np.ones(2)}, path)

def test_save_is_atomic(tmp_path, monkeypatch):
  path = tmp_path / "ckpt.safetensors"
  safe_save({"x": Tensor([1.0, 2.0])}, path)
  original = path.read_bytes()
  def crash(*args): raise OSError("disk vanished")
  monkeypatch.setattr(os, "replace", crash)
  with pytest.raises(OSError, match="disk vanished"): safe_save({"x": Tensor([3.0, 4.0, 5.0])}, path)
  monkeypatch.undo()
  assert path.read_bytes() == original, "a failed save must leave the old file alone"
  assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.safetensors"], "and no temporary file behind"
  safe_save({"x": Tensor([3.0, 4.0, 5.0])}, str(path))
  assert safe_load(path)["x"].tolist() == [3.0, 4.0, 5.0]
  assert sorted(p.name for p in tmp_path.iterdir()) == ["ckpt.safetensors"]

def test_model_round_trip_through_a_file(tmp_path):
  source, target = Model(), Model()
  for tensor in get_parameters(source): tensor.assign(tensor * 3 + 1).realize()
  safe_save(get_state_dict(source), tmp_path / "model.safetensors")
  load_state_dict(target, safe_load(tmp_path / "model.safetensors"))
  expected = get_state_dict(source)
  for name, tensor in get_state_dict(target).items(): np.testing.assert_array_equal(tensor.numpy(), expected[name].numpy(), err_msg=name)

def test_interoperates_with_the_safetensors_package(tmp_path):
  torch = pytest.importorskip("torch")
  safetensors_torch = pytest.importorskip("safetensors.torch")
  rng = np.random.default_rng(0)
  ours = {d.name: Tensor(sample(d, (2, 3), rng), dtype=d) for d in ALL_DTYPES}
  safe_save(ours, tmp_path / "ours.safetensors", metadata={"by": "tinyc"})
  theirs = safetensors_torch.load_file(tmp_path / "ours.safetensors")
  for name, tensor in ours.items():
    reference = theirs[name]
    assert str(reference.dtype) == f"torch.{name}"
    expected = reference.view(torch.int16).numpy().view(np.uint16) if name == "bfloat16" else reference.numpy()
    np.testing.assert_array_equal(raw_bits(tensor.numpy(), tensor.dtype), raw_bits(expected, tensor.dtype) if name != "bfloat16" else expected)
  safetensors_torch.save_file(theirs, tmp_path / "theirs.safetensors", metadata={"by": "safetensors"})
  loaded = safe_load(tmp_path / "theirs.safetensors")
  assert safe_load_metadata(tmp_path / "theirs.safetensors") == {"by": "safetensors"}
  for name, tensor in ours.items():
    assert loaded[name].dtype == tensor.dtype
    np.testing.assert_array_equal(raw_bits(loaded[name].numpy(), tensor.dtype), raw_bits(tensor.numpy(), tensor.dtype), err_msg=name)

# ***** malformed files: a clear ValueError naming the file, never a read out of bounds *****

GOOD = {"x": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}}
def entry(dtype="F32", shape=(2,), offsets=(0, 8)): return {"dtype": dtype, "shape": list(shape), "data_offsets": list(offsets)}

BAD_FILES = {
  "empty file": (lambda p: p.write_bytes(b""), "fewer than the 8-byte header length"),
  "truncated length": (lambda p: p.write_bytes(b"\x10\x00\x00"), "fewer than the 8-byte header length"),
  "header longer than file": (lambda p: write_file(p, GOOD, b"\0" * 8, header_size=10 ** 6), "header length says 1000000 bytes"),
  "huge header length": (lambda p: write_file(p, GOOD, b"\0" * 8, header_size=2 ** 64 - 1), "truncated file"),
  "not json": (lambda p: write_file(p, None, header_bytes=b"{not json"), "not UTF-8 JSON"),
  "not utf8": (lambda p: write_file(p, None, header_bytes=b'{"\xff": 1}'), "not UTF-8 JSON"),
  "json list": (lambda p: write_file(p, [1, 2]), "JSON list, not an object"),
  "entry not object": (lambda p: write_file(p, {"x": [0, 8]}), "needs an object with dtype, shape and data_offsets"),
  "missing offsets": (lambda p: write_file(p, {"x": {"dtype": "F32", "shape": [2]}}, b"\0" * 8), "needs an object"),
  "unknown dtype": (lambda p: write_file(p, {"x": entry("F8_E4M3", (8,))}, b"\0" * 8), "dtype 'F8_E4M3', which tinyc does not know"),
  "bad shape": (lambda p: write_file(p, {"x": entry(shape=(-2,))}, b"\0" * 8), "not a list of non-negative integers"),
  "bool in shape": (lambda p: write_file(p, {"x": entry(shape=(True, 2))}, b"\0" * 8), "not a list of non-negative integers"),
  "bad offsets": (lambda p: write_file(p, {"x": entry(offsets=(0,))}, b"\0" * 8), "not \\[begin, end\\]"),
  "offsets past the data": (lambda p: write_file(p, {"x": entry(offsets=(0, 8))}, b"\0" * 4), "outside the 4-byte data section"),
  "truncated data": (lambda p: write_file(p, {"x": entry(), "y": entry(offsets=(8, 16))}, b"\0" * 12), "outside the 12-byte data section"),
  "negative offset": (lambda p: write_file(p, {"x": entry(offsets=(-8, 0))}, b"\0" * 8), "outside the 8-byte data section"),
  "end before begin": (lambda p: write_file(p, {"x": entry(shape=(0,), offsets=(8, 0))}, b"\0" * 8), "end before begin"),
  "size not dtype*shape": (lambda p: write_file(p, {"x": entry(shape=(3,))}, b"\0" * 8), "needs 12 bytes but its data_offsets span 8"),
  "overlap": (lambda p: write_file(p, {"x": entry(), "y": entry(offsets=(4, 12))}, b"\0" * 12), "'y' at \\[4, 12\\] overlaps tensor 'x'"),
  "same range twice": (lambda p: write_file(p, {"x": entry(), "y": entry()}, b"\0" * 8), "overlaps"),
  "hole": (lambda p: write_file(p, {"x": entry(), "y": entry(offsets=(12, 20))}, b"\0" * 20), "bytes \\[8, 12\\) .* belong to no tensor"),
  "trailing bytes": (lambda p: write_file(p, GOOD, b"\0" * 16), "has 16 bytes but the tensors cover only 8"),
  "bad metadata": (lambda p: write_file(p, {"__metadata__": {"epoch": 3}, **GOOD}, b"\0" * 8), "__metadata__ must map strings to strings"),
}

@pytest.mark.parametrize("case", list(BAD_FILES))
def test_malformed_file_raises_value_error(tmp_path, case):
  make, message = BAD_FILES[case]
  path = tmp_path / "bad.safetensors"
  make(path)
  for load in (safe_load, safe_load_metadata):
    with pytest.raises(ValueError, match=message) as info: load(path)
    assert isinstance(info.value, SafetensorsError) and str(path) in str(info.value) and "not a valid safetensors file" in str(info.value)

def test_out_of_order_entries_are_fine(tmp_path):
  # JSON order need not follow the data order; only the byte ranges must tile the data section
  path = write_file(tmp_path / "order.safetensors", {"late": entry(offsets=(8, 16)), "early": entry()}, struct.pack("<4f", 1, 2, 3, 4))
  loaded = safe_load(path)
  assert list(loaded) == ["late", "early"] and loaded["late"].tolist() == [3.0, 4.0] and loaded["early"].tolist() == [1.0, 2.0]
