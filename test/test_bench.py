"""bench/bench_train.py's GPT and attention rows run end to end at tiny sizes, and its torch.nn GPT is examples/gpt.py's model."""
import contextlib, sys
from pathlib import Path
import numpy as np
import pytest
import torch
import tinyc
from tinyc import Tensor
from tinyc.nn.state import get_state_dict

sys.path.insert(0, str(Path(__file__).parent.parent / "bench"))
import bench_train  # noqa: E402

TINY_GPT, TINY_SDPA = bench_train.GPTConfig(layers=1, width=32, heads=2, context=16, batch=2), (1, 2, 16, 8)

def test_torch_gpt_computes_what_examples_gpt_computes():
  """Given tinyc's weights (same names, same shapes), the torch.nn GPT gives the same logits: the same architecture on both sides."""
  config = bench_train.GPTConfig(layers=2, width=32, heads=2, context=16, batch=2)
  Tensor.manual_seed(0)
  ours = bench_train.examples_gpt()(config.vocab, config.context, config.width, config.layers, config.heads)
  theirs = bench_train.TorchGPT(config)
  theirs.load_state_dict({name: torch.from_numpy(t.numpy()) for name, t in get_state_dict(ours).items()})  # strict: every name matches
  ids, _ = bench_train.gpt_batch(config)
  expected = theirs(torch.from_numpy(ids.astype(np.int64))).detach().numpy()
  np.testing.assert_allclose(ours(Tensor(ids.astype(np.int32))).numpy(), expected, atol=1e-5, rtol=1e-4)

def test_gpt_rows_run_and_a_failing_torch_compile_is_reported(monkeypatch, capsys):
  def no_compiler(*args, **kwargs): raise RuntimeError("no C++ compiler here\nmore detail")
  monkeypatch.setattr(torch, "compile", no_compiler)  # also keeps this test from spending seconds in inductor
  for size in ("GPT_CPU", "GPT_GPU"): monkeypatch.setattr(bench_train, size, TINY_GPT)
  monkeypatch.setattr(sys, "argv", ["bench_train.py", "--only", "gpt", "--steps", "2"])
  bench_train.main()
  out = capsys.readouterr().out
  assert "MLP" not in out and "index checks" not in out and "SDPA" not in out, out  # --only gpt: that table alone
  assert "1 layers, width 32, 2 heads, context 16, batch 2, vocab 256" in out, out
  rows = {line[:25].strip(): line[25:].split() for line in out.splitlines() if line.startswith(("tinyc ", "torch"))}
  assert int(rows["tinyc fp32"][-1]) > 10, out  # the kernels of one replayed step
  assert float(rows["tinyc fp32"][-2]) < np.log(256) + 0.5 and float(rows["torch eager fp32"][-2]) < np.log(256) + 0.5, out  # losses
  assert rows["torch eager fp32"][1].endswith("x"), out
  assert " ".join(rows["torch.compile fp32"]) == "unavailable: RuntimeError: no C++ compiler here", out
  assert rows["tinyc bf16 autocast"][0] == "pending:" or rows["tinyc bf16 autocast"][-1].isdigit(), out
  assert float(rows["torch eager bf16 autocast"][0]) > 0, out

def test_sdpa_rows_run_and_count_the_forwards_bytes(monkeypatch, capsys):
  for size in ("SDPA_CPU", "SDPA_GPU"): monkeypatch.setattr(bench_train, size, TINY_SDPA)
  monkeypatch.setattr(sys, "argv", ["bench_train.py", "--only", "sdpa", "--steps", "2"])
  bench_train.main()
  out = capsys.readouterr().out
  assert "q k v 1 x 2 x 16 x 8" in out and "GPT" not in out and "MLP" not in out, out
  for name, itemsize in (("fp32", 4), ("bf16", 2)):
    row = next(line for line in out.splitlines() if line.startswith(name)).split()
    assert row[3].endswith("x") and row[-1] in ("default", "flash"), row  # torch's flash backend for bf16 on CUDA
    moved, qkvo = float(row[4]), float(row[6])
    assert qkvo == pytest.approx(4 * 16 * 16 * itemsize / 1e6, abs=0.05) and moved >= qkvo, row  # at least q, k, v read, out written

def test_the_bf16_row_runs_tinycs_step_under_an_autocast_once_tinyc_has_one(monkeypatch, capsys):
  entered = []
  @contextlib.contextmanager
  def autocast(dtype):  # a stand-in: records what the row asked for, computes in fp32
    entered.append(dtype)
    yield
  monkeypatch.setattr(tinyc, "autocast", autocast, raising=False)
  monkeypatch.setattr(torch, "compile", lambda model: model)
  bench_train.gpt_table(TINY_GPT, 2, "cpu")
  out = capsys.readouterr().out
  rows = {line[:25].strip(): line[25:].split() for line in out.splitlines() if line.startswith(("tinyc ", "torch"))}
  assert entered and set(entered) == {tinyc.dtypes.bfloat16}, entered  # the forward ran under it, while captured
  assert int(rows["tinyc bf16 autocast"][-1]) > 10 and rows["torch eager bf16 autocast"][1].endswith("x"), out

def test_the_beam_model_tool_collects_trains_and_evaluates(tmp_path, monkeypatch, capsys):
  """bench/beam_model.py end to end on four small kernels: each searched and recorded, a model trained on them and saved, its
  ranking of their candidates scored; and its Kendall tau is 1 for the same order, -1 for the reverse."""
  from tinyc import Device
  if Device[Device.DEFAULT].compile_binary is None: pytest.skip(f"{Device.DEFAULT} cannot build in worker processes")
  import beam_model
  from tinyc.ops import LoadOps
  from tinyc.schedule import create_schedule
  assert beam_model.kendall_tau([1, 2, 3, 4], [10, 20, 30, 40]) == 1 and beam_model.kendall_tau([1, 2, 3], [3, 2, 1]) == -1
  for name, value in (("CACHEDB", str(tmp_path / "beam.db")), ("BEAM_MAX_STEPS", "1"), ("BEAM_PROGRESS", "0"), ("IGNORE_BEAM_CACHE", "1"),
                      ("BEAM_MODEL", "0")):
    monkeypatch.setenv(name, value)  # (collect sets the last four: restored after the test)
  graphs = [Tensor.empty(m, 32) @ Tensor.empty(32, n) for m, n in ((16, 24), (24, 40), (40, 16), (8, 64))]
  asts = [item.ast for item in create_schedule([t.lazydata for t in graphs]) if item.ast.op not in LoadOps]
  monkeypatch.setattr(beam_model, "corpus", lambda fuzz: asts)
  monkeypatch.setattr(beam_model.beam, "ROOFLINE_SLACK", 0.0)  # (kernels this small are at their bound: the search would end at once)
  monkeypatch.setattr(beam_model, "held_out", lambda ast: False)  # (all four trained on, and scored with --trained)
  beam_model.collect(beam_model.parser().parse_args(["collect", "--fuzz", "0", "--steps", "1"]))
  beam_model.train(beam_model.parser().parse_args(["train", "--out", str(tmp_path / "model.safetensors"), "--steps", "20", "--ensemble", "2"]))
  beam_model.evaluate(beam_model.parser().parse_args(["eval", "--model", str(tmp_path / "model.safetensors"), "--trained"]))
  out = capsys.readouterr().out
  assert "4 kernels to search" in out and "training on 4 kernels" in out and "training kernels" in out and "all: 4 kernels: tau mean" in out, out
