"""The examples work end to end on small data the tests make (no network)."""
import gzip, os, struct, subprocess, sys
from pathlib import Path
import numpy as np
import pytest
from tinyc import Device

sys.path.insert(0, str(Path(__file__).parent.parent / "examples"))
import mnist  # noqa: E402
from conftest import devices_to_test  # noqa: E402

ROOT = Path(__file__).parent.parent

def run_example(script, **environment):
  """Run examples/<script> in a fresh process on tinyc from this checkout; returns its stdout."""
  path = os.pathsep.join([str(ROOT)] + ([os.environ["PYTHONPATH"]] if os.environ.get("PYTHONPATH") else []))  # keep where deps were put
  env = {**os.environ, "PYTHONPATH": path, **environment}
  proc = subprocess.run([sys.executable, str(ROOT / "examples" / script)], capture_output=True, text=True, env=env, timeout=300)
  assert proc.returncode == 0, f"{script} failed:\n{proc.stdout}\n{proc.stderr}"
  return proc.stdout

def write_idx(path, array, gzipped=True):
  codes = {np.uint8: 0x08, np.int8: 0x09, np.int16: 0x0B, np.int32: 0x0C, np.float32: 0x0D, np.float64: 0x0E}
  code = codes[array.dtype.type]
  raw = bytes([0, 0, code, array.ndim]) + struct.pack(f">{array.ndim}I", *array.shape) + array.astype(array.dtype.newbyteorder(">")).tobytes()
  path.write_bytes(gzip.compress(raw) if gzipped else raw)
  return raw

def test_read_idx_round_trips_every_type(tmp_path):
  for dtype in (np.uint8, np.int8, np.int16, np.int32, np.float32, np.float64):
    array = (np.arange(24) - 5).astype(dtype).reshape(2, 3, 4)
    for gzipped in (True, False):
      write_idx(tmp_path / "a.idx", array, gzipped)
      np.testing.assert_array_equal(mnist.read_idx(tmp_path / "a.idx"), array)

@pytest.mark.parametrize("corrupt, message", [
  (lambda raw: raw[:3], "bad magic|truncated"), (lambda raw: b"\x01\x00" + raw[2:], "bad magic"),
  (lambda raw: raw[:2] + b"\x07" + raw[3:], "unknown IDX element type"), (lambda raw: raw[:-1], "needs"),
  (lambda raw: raw + b"\x00", "needs"), (lambda raw: raw[:6], "truncated IDX header"), (lambda raw: b"\x1f\x8b" + raw, "gzip")])
def test_malformed_idx_raises_a_clear_error(tmp_path, corrupt, message):
  raw = write_idx(tmp_path / "ok.idx", np.zeros((2, 3), np.uint8), gzipped=False)
  (tmp_path / "bad.idx").write_bytes(corrupt(raw))
  with pytest.raises(ValueError, match=message): mnist.read_idx(tmp_path / "bad.idx")

def test_download_leaves_no_partial_file(tmp_path):
  with pytest.raises(Exception): mnist.download("file:///nonexistent/nothing.gz", tmp_path / "x.gz")
  assert list(tmp_path.iterdir()) == []
  source = tmp_path / "source.bin"
  source.write_bytes(b"payload")
  assert mnist.download(source.as_uri(), tmp_path / "out" / "copy.bin").read_bytes() == b"payload"
  with pytest.raises(ValueError, match="checksum"): mnist.download(source.as_uri(), tmp_path / "out" / "bad.bin", sha256="0" * 64)
  assert not (tmp_path / "out" / "bad.bin").exists() and len(list((tmp_path / "out").iterdir())) == 1

def test_mnist_trains_on_a_small_synthetic_set(tmp_path):
  # two classes that differ in where the ink is: a short run must learn them
  rng = np.random.default_rng(0)
  labels = rng.integers(0, 2, 256).astype(np.uint8)
  images = (rng.random((256, 28, 28)) * 40).astype(np.uint8)
  for i, label in enumerate(labels): images[i, :, :14] += 200 if label == 0 else 0; images[i, :, 14:] += 200 if label == 1 else 0  # noqa: E702
  for key, array in (("train_images", images[:192]), ("train_labels", labels[:192]), ("test_images", images[192:]), ("test_labels", labels[192:])):
    write_idx(tmp_path / mnist.FILES[key], array)
  accuracy = mnist.main(["--data-dir", str(tmp_path), "--no-download", "--batch", "32", "--epochs", "2"])
  assert accuracy > 0.9

def test_missing_files_without_download_say_what_to_do(tmp_path):
  with pytest.raises(SystemExit, match="missing"): mnist.main(["--data-dir", str(tmp_path), "--no-download"])

def test_gpt_loss_falls_and_it_samples():
  import gpt
  text = gpt.stdlib_docstrings()
  assert len(text) > 50_000 and "Return" in text  # real text, available offline
  model, vocab, losses = gpt.train(text[:20_000], steps=60, context=16, width=32, layers=1, heads=2, batch=8, log_every=0)
  assert np.mean(losses[-10:]) < np.mean(losses[:10]) - 0.5, losses
  tokens = gpt.sample(model, np.array([vocab.index("T")], dtype=np.int32), 20, np.random.default_rng(0))
  assert len(tokens) == 20 and all(0 <= t < len(vocab) for t in tokens)

@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_gpt_trains_in_mixed_precision(dtype, capsys):
  import gpt
  gpt.main(["--steps", "60", "--context", "16", "--width", "32", "--layers", "1", "--heads", "2", "--tokens", "4", "--dtype", dtype])
  out = capsys.readouterr().out
  first, last = map(float, out.split("loss ")[-1].split("\n")[0].split(" -> "))
  assert f"in {dtype}" in out and last < first - 0.5, out

@pytest.mark.parametrize("device", devices_to_test())
def test_demo_names_the_language_of_the_source_it_prints(device):
  out = run_example("demo.py", DEVICE=device)
  language = {"LLVM": "LLVM IR", "GPU": "OpenCL C", "CUDA": "CUDA C"}[device]
  assert f"{language} of relu(x @ w1 + b1)" in out, out
  markers = {"LLVM": "define void @", "GPU": "__kernel ", "CUDA": "__global__ "}  # what starts a kernel in each language
  assert [name for name, marker in markers.items() if marker in out] == [device], out

def test_demo_counts_the_kernels_of_the_computation_under_beam(tmp_path):
  out = run_example("demo.py", BEAM="2", BEAM_MAX_STEPS="1", CACHEDB=str(tmp_path / "beam.db"), DEVICE="LLVM")
  # the first matmul (32 products an output) is computed in the second's loop (schedule rule 10), then the softmax
  assert "2 kernels planned" in out and "ran 2 kernels" in out, out

def test_gpt_reports_where_its_time_went(capsys):
  import gpt
  gpt.main(["--steps", "3", "--context", "8", "--width", "16", "--layers", "1", "--heads", "2", "--tokens", "12"])
  out = capsys.readouterr().out
  trained = float(out.split("trained in ")[1].split(" s")[0])
  sampled = float(out.split("sampled 12 tokens in ")[1].split(" s")[0])
  total = float(out.split("total ")[1].split(" s")[0])
  assert trained + sampled <= total + 0.15 + 1e-9, out  # each figure is printed rounded to 0.1 s (6.4 + 0.8 against 7.1 happens)
  assert int(out.split("compiling ")[1].split(" kernels")[0]) > 0, out

def test_gpt_samples_with_its_caches_what_the_whole_window_gives():
  """Decoding into the key-value caches (a symbolic position, kernels compiled once) samples what running the whole window samples
  (a new shape for each length), through the growing window and on once it slides."""
  import gpt
  model, vocab, _ = gpt.train(gpt.stdlib_docstrings()[:20_000], steps=30, context=16, width=32, layers=2, heads=2, batch=8, log_every=0)
  prompt, programs = np.array([vocab.index(c) for c in "Return the "], dtype=np.int32), Device[Device.DEFAULT].programs
  whole_windows = gpt.sample(model, prompt, 24, np.random.default_rng(0), cached=False)
  before = len(programs)
  assert gpt.sample(model, prompt, 24, np.random.default_rng(0)) == whole_windows
  compiled = len(programs) - before
  assert gpt.sample(model, prompt, 30, np.random.default_rng(1)) and len(programs) == before + compiled  # nothing compiles again
