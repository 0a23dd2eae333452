"""Kernel-optimization fuzzer: random kernels (elementwise, reductions, matmul, conv, odd sizes such as 7, 13, 29) with random
legal Opt lists must give the same output as the unoptimized kernel. Runs on every device the op suite runs on (LLVM and
OpenCL in CI, CUDA with CUDA=1); OPT_FUZZ_LISTS=n tries n Opt lists per kernel instead of 4."""
from __future__ import annotations
import dataclasses, os, random
import numpy as np
import pytest
from tinyc import Tensor
from tinyc.device import Buffer, Device
from tinyc.dtype import dtypes
from tinyc.helpers import prod
from tinyc.codegen.kernel import Kernel, KernelOptError, Opt, OptOps
from tinyc.ops import LoadOps
from tinyc.realize import run_schedule
from tinyc.schedule import create_schedule

AMOUNTS = (0, 2, 3, 4, 7, 8, 13, 16, 29, 32)
ACTIONS = [Opt(op, axis, amount) for op in (OptOps.UPCAST, OptOps.UNROLL, OptOps.LOCAL, OptOps.GROUP, OptOps.GROUPTOP)
           for axis in range(4) for amount in AMOUNTS]
ACTIONS += [Opt(OptOps.PADTO, axis, amount) for axis in range(5) for amount in (4, 8, 16, 32)] + [Opt(OptOps.NOLOCALS, 0, 0)]
ACTIONS += [Opt(OptOps.STAGE, buffer, 0) for buffer in range(1, 4)]
ACTIONS += [Opt(OptOps.BLOCK, axis, amount) for axis in range(3) for amount in (2, 3, 4, 13)]
ACTIONS += [Opt(OptOps.TC, choice, stages) for choice in range(2) for stages in (0, 3)]  # TC comes first or never: tried first half the time

def rand(*shape, seed, dtype=np.float32):
  rng = np.random.default_rng(seed)
  if dtype == np.int32: return Tensor(rng.integers(-50, 50, size=shape, dtype=np.int32)).realize()
  return Tensor(rng.standard_normal(shape).astype(dtype)).realize()

PROGRAMS = {
  "elementwise_7x13x29": lambda: rand(7, 13, 29, seed=1) * rand(7, 13, 29, seed=2) + rand(29, seed=3),
  "sum_rows_13x29": lambda: rand(13, 29, seed=4).sum(1),
  "sum_cols_29x13": lambda: rand(29, 13, seed=5).sum(0),
  "max_7x13x29": lambda: rand(7, 13, 29, seed=6).max(axis=(0, 2)),
  "sum_all_1000": lambda: rand(1000, seed=7).sum(),
  "int_sum_29x16": lambda: rand(29, 16, seed=8, dtype=np.int32).sum(0),
  "matmul_13x29x7": lambda: rand(13, 29, seed=9) @ rand(29, 7, seed=10),
  "matmul_32x64x16_relu": lambda: (rand(32, 64, seed=11) @ rand(64, 16, seed=12) + rand(16, seed=13)).relu(),
  "matvec_64x128": lambda: rand(64, 128, seed=14) @ rand(128, seed=15),
  "conv_2x3x9x9_4x3x3x3": lambda: rand(2, 3, 9, 9, seed=16).conv2d(rand(4, 3, 3, 3, seed=17), padding=1),
  "softmax_13x29": lambda: rand(13, 29, seed=18).softmax(-1),
  "softmax_cols_29x16": lambda: rand(29, 16, seed=21).softmax(0),
  "layernorm_7x4x32": lambda: rand(7, 4, 32, seed=22).layernorm(axis=(1, 2)),
  "padded_input_sum": lambda: rand(13, 13, seed=19).pad(((1, 2), (0, 3))).sum(1),
  "half_sum_16x32": lambda: rand(16, 32, seed=20, dtype=np.float16).sum(1),
  # 16-bit matmuls: tensor cores where the device has them (in every layout)
  "half_matmul_64x48x32": lambda: rand(64, 32, seed=27, dtype=np.float16) @ rand(32, 48, seed=28, dtype=np.float16),
  "half_matmul_tt_32x64x48": lambda: rand(48, 32, seed=29, dtype=np.float16).T @ rand(64, 48, seed=30, dtype=np.float16).T,
  "bfloat16_matmul_tn_batched": lambda: (rand(2, 64, 32, seed=31).cast(dtypes.bfloat16).transpose(1, 2) @
                                         rand(2, 64, 16, seed=32).cast(dtypes.bfloat16)),
  # several reduces and several outputs in one kernel
  "row_stats_13x29": lambda: (lambda x: [x.sum(1), x.max(1), (x * x).sum(1)])(rand(13, 29, seed=23)),
  "layernorm_train_7x32": lambda: _trained(rand(7, 32, seed=24), lambda x: x.layernorm()),
  "cross_entropy_train_24x17": lambda: _trained(rand(24, 17, seed=25), lambda x: x.sparse_categorical_crossentropy(Tensor(np.arange(24) % 17))),
}

def _trained(x: Tensor, f) -> list[Tensor]:
  """f(x) and the gradient of a weighted sum of it: the forward and backward kernels of a train step."""
  x.requires_grad = True
  out = f(x)
  (out * rand(*out.shape, seed=26)).sum().backward()
  assert x.grad is not None
  return [out, x.grad]

FUZZ_MAX_UPCAST = 128  # PoCL took 37-42 s to build a staged kernel of 1024 lanes (UNROLL 32 x UPCAST 32); test_matmul_grid has those

def random_opts(ast, target, rng: random.Random, actions: list[Opt] = ACTIONS) -> list[Opt]:
  """A random list of Opts from `actions`, each legal after the ones before it, of at most FUZZ_MAX_UPCAST upcast lanes."""
  kernel, opts = Kernel(ast, dataclasses.replace(target, max_upcast=min(target.max_upcast, FUZZ_MAX_UPCAST))), []
  if (tensor_cores := [opt for opt in actions if opt.op is OptOps.TC]) and rng.random() < 0.5 and _applies(kernel, tc := rng.choice(tensor_cores)):
    opts.append(tc)
  for _ in range(rng.randint(1, 5)):
    for opt in rng.sample(actions, len(actions)):
      try: kernel.apply_opt(opt)
      except KernelOptError: continue
      opts.append(opt)
      break
  return opts

def _applies(kernel: Kernel, opt: Opt) -> bool:
  try: kernel.apply_opt(opt)
  except KernelOptError: return False
  return True

def run_kernel(device: str, item, opts: tuple[Opt, ...]) -> np.ndarray:
  """Every output of the item's kernel, flattened into one array."""
  program = Device[device].get_program(item.ast, opts)
  outs = [Buffer(device, prod(base.shape), base.dtype) for base in item.outs]
  program(outs + [src.realized for src in item.inputs])
  return np.concatenate([out.numpy().astype(np.float64).reshape(-1) for out in outs])

@pytest.mark.parametrize("name", PROGRAMS)
def test_random_opts_match_unoptimized(name, tinyc_device):
  device = Device.DEFAULT
  lists = int(os.environ.get("OPT_FUZZ_LISTS", "4"))
  rng = random.Random(name)
  outs = PROGRAMS[name]()
  schedule = create_schedule([out.lazydata for out in (outs if isinstance(outs, list) else [outs])])
  tried = 0
  for item in schedule:
    if item.ast.op not in LoadOps:
      expected = run_kernel(device, item, ())
      for _ in range(lists):
        opts = tuple(random_opts(item.ast, Device[device].target, rng))
        got = run_kernel(device, item, opts)
        if any(out.dtype in (dtypes.float16, dtypes.bfloat16) for out in item.outs):
          np.testing.assert_allclose(got, expected, rtol=1e-2, atol=1e-2, err_msg=f"{opts}")
        else: np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-5, err_msg=f"{opts}")
        tried += len(opts) > 0
    run_schedule([item])
  assert tried > 0, "no Opt applied to any kernel: the fuzzer tested nothing"

def test_illegal_opts_raise_and_leave_the_kernel_alone():
  item = [item for item in create_schedule([(rand(13, 32, seed=0) @ rand(32, 8, seed=1)).lazydata]) if item.ast.op not in LoadOps][0]
  kernel = Kernel(item.ast)
  before = (kernel.full_shape, kernel.sts, kernel.kinds, kernel.owners)
  for opt in [Opt(OptOps.UPCAST, 0, 5), Opt(OptOps.UPCAST, 9, 2), Opt(OptOps.LOCAL, 0, 13), Opt(OptOps.GROUP, 0, 4), Opt(OptOps.NOLOCALS, 0, 0),
              Opt(OptOps.UNROLL, 0, 128), Opt(OptOps.PADTO, 0, 13), Opt(OptOps.UPCAST, 0, 1), Opt(OptOps.BLOCK, 0, 13), Opt(OptOps.BLOCK, 1, 3),
              Opt(OptOps.BLOCK, 2, 2)]:
    # the CPU has no work-groups; 5 does not divide 13; 13 is already a multiple...; BLOCK 13 leaves one block; 3 does not divide 8
    with pytest.raises(KernelOptError): kernel.apply_opt(opt)
    assert (kernel.full_shape, kernel.sts, kernel.kinds, kernel.owners) == before and kernel.applied_opts == []

def test_the_programs_include_kernels_with_several_reduces_and_outputs():
  kernels = [Kernel(item.ast) for name in ("row_stats_13x29", "layernorm_train_7x32", "cross_entropy_train_24x17")
             for item in create_schedule([out.lazydata for out in PROGRAMS[name]()]) if item.ast.op not in LoadOps]
  assert any(kernel.n_outputs > 1 for kernel in kernels) and any(len(kernel.reduceops) > 2 for kernel in kernels)
  nested = [kernel for kernel in kernels if any(other in reduceop.src[0].walk() for reduceop in kernel.reduceops for other in kernel.reduceops
                                                if other is not reduceop)]
  assert nested, "a reduce inside another's input (cross-entropy's mean over rows of row reduces)"
