"""BEAM's dataset (codegen/dataset.py): a kernel stored as JSON reads back as the same AST, and what a search recorded reads back
as (AST, device, Opts, built, seconds) rows whose Opts apply to that AST."""
from __future__ import annotations
import math, os
import pytest
from tinyc import Device, Tensor
from tinyc.dtype import dtypes
from tinyc.helpers import Context
from tinyc.ops import LoadOps
from tinyc.schedule import create_schedule
from tinyc.codegen.dataset import ast_from_json, ast_json, candidates
from tinyc.codegen.kernel import Kernel
from tinyc import beam
from test_graph_fuzz import random_program

def kernels_of(*tensors):
  return [item.ast for item in create_schedule([t.lazydata for t in tensors]) if item.ast.op not in LoadOps]

def special_kernels():
  """Kernels whose ASTs hold what random programs lack: -inf and bool constants, index masks, padding, 16-bit casts, several outputs."""
  q, k, v = (Tensor.empty(1, 2, 20, 8, requires_grad=True) for _ in range(3))
  (q.scaled_dot_product_attention(k, v, is_causal=True) * Tensor.empty(1, 2, 20, 8)).sum().backward()
  conv = Tensor.empty(2, 3, 9, 9).conv2d(Tensor.empty(4, 3, 3, 3), padding=1)
  low = Tensor.empty(16, 24).cast(dtypes.bfloat16) @ Tensor.empty(24, 8).cast(dtypes.bfloat16)
  return kernels_of(q.grad, k.grad, v.grad, conv, low.cast(dtypes.float32), Tensor.empty(5, 7).max(1))

@pytest.mark.parametrize("seed", range(40))
def test_a_random_programs_kernels_read_back_from_json_as_the_same_asts(seed):
  for ast in kernels_of(*[t for t, _ in random_program(seed)]): assert ast_from_json(ast_json(ast)) == ast, ast

def test_attention_conv_and_16_bit_kernels_read_back_from_json_as_the_same_asts():
  asts = special_kernels()
  assert len(asts) >= 8
  for ast in asts: assert ast_from_json(ast_json(ast)) == ast, ast

def test_the_dataset_reads_back_what_a_search_recorded(tinyc_device, tmp_path, monkeypatch):
  if Device[Device.DEFAULT].compile_binary is None: pytest.skip(f"{Device.DEFAULT} cannot build in worker processes")
  monkeypatch.setenv("CACHEDB", str(tmp_path / "beam.db"))
  monkeypatch.setenv("BEAM_MAX_STEPS", "1")
  beam._chosen.clear()
  a, b = Tensor.rand(12, 20).realize(), Tensor.rand(20, 28).realize()
  searched = kernels_of((a @ b).sqrt())
  with Context(BEAM=2): (a @ b).sqrt().realize()
  rows = list(candidates())
  assert rows and {row[0] for row in rows} == set(searched), [row[0] for row in rows]
  assert all(row[1].startswith(Device.DEFAULT) for row in rows) and any(row[3] and row[4] > 0 for row in rows)
  for ast, _, opts, _, _ in rows:
    kernel = Kernel(ast, Device[Device.DEFAULT].target)
    for opt in opts: kernel.apply_opt(opt)
  assert list(candidates("no such device")) == [] and os.path.exists(tmp_path / "beam.db")

@pytest.mark.parametrize("target", ["cpu", "h200"])
def test_every_candidate_has_a_finite_feature_vector_that_its_opts_change(target):
  """codegen/features.py: a fixed-length vector of finite floats for every candidate of a step of the search (the matmul's, and
  attention's kernels on a GPU target with tensor cores too), computed from the Kernel alone; candidates with other layouts differ."""
  from tinyc.codegen.features import FEATURE_NAMES, features
  from tinyc.codegen.search import _replay, expansions
  from test_register_mma import H200
  kernel_target = H200 if target == "h200" else Device[Device.DEFAULT].target
  asts = kernels_of(Tensor.empty(64, 48) @ Tensor.empty(48, 32)) + special_kernels()[:3]
  for ast in asts:
    start = Kernel(ast, kernel_target)
    vectors = {tuple(features(_replay(start, opts))) for opts in [()] + expansions(start)[:40]}
    assert all(len(vector) == len(FEATURE_NAMES) and all(math.isfinite(value) for value in vector) for vector in vectors)
    assert len(vectors) > 1, ast
