"""Zero-size tensors through every reduce and nn op that PyTorch allows them in, forward and backward, compared with torch; where torch
raises (a max over an empty dim), tinyc raises the same exception class."""
from __future__ import annotations
from typing import Any, Callable
import numpy as np
import pytest
import torch
import torch.nn.functional as tF
from tinyc import Tensor
from helpers import Inputs, check_grad, compare, random_array

pytestmark = pytest.mark.filterwarnings("ignore:.*degrees of freedom is <= 0")  # torch warns where var/std give nan

EMPTY_SHAPES = [(0,), (0, 3), (3, 0), (2, 0, 3)]

# name: (torch fn, tinyc fn or None where the torch fn runs on both); each runs on every shape in EMPTY_SHAPES
ONE_INPUT: dict[str, tuple[Callable[..., Any], Callable[..., Any] | None]] = {
  "sum": (lambda x: x.sum(), None), "sum_0": (lambda x: x.sum(0), None), "sum_last_keepdim": (lambda x: x.sum(-1, keepdim=True), None),
  "max": (lambda x: x.max(), None), "max_0": (lambda x: x.amax(0), lambda x: x.max(0)), "max_last": (lambda x: x.amax(-1), lambda x: x.max(-1)),
  "min": (lambda x: x.min(), None), "min_0": (lambda x: x.amin(0), lambda x: x.min(0)), "min_last": (lambda x: x.amin(-1), lambda x: x.min(-1)),
  "mean": (lambda x: x.mean(), None), "mean_0": (lambda x: x.mean(0), None), "mean_last": (lambda x: x.mean(-1), None),
  "var": (lambda x: x.var(), None), "var_0": (lambda x: x.var(0), None), "std_last": (lambda x: x.std(-1), None),
  "argmax": (lambda x: x.argmax(), None), "argmax_0": (lambda x: x.argmax(0), None), "argmax_last": (lambda x: x.argmax(-1), None),
  "argmin_last": (lambda x: x.argmin(-1), None),
  "softmax_0": (lambda x: x.softmax(0), None), "softmax_last": (lambda x: x.softmax(-1), None),
  "log_softmax_0": (lambda x: x.log_softmax(0), None), "log_softmax_last": (lambda x: x.log_softmax(-1), None),
  "cumsum_0": (lambda x: x.cumsum(0), None), "cumsum_last": (lambda x: x.cumsum(-1), None),
  "layernorm": (lambda x: tF.layer_norm(x, x.shape[-1:]), lambda x: x.layernorm()),
  "matmul_self_T": (lambda x: x @ x.transpose(-1, -2), None), "matmul_T_self": (lambda x: x.transpose(-1, -2) @ x, None),
  "relu": (lambda x: x.relu(), None), "exp": (lambda x: x.exp(), None), "gelu": (lambda x: tF.gelu(x, approximate="tanh"), lambda x: x.gelu()),
  "tril": (lambda x: x.tril(), None), "flip": (lambda x: x.flip(0), None), "pad": (lambda x: tF.pad(x, (1, 2)), lambda x: x.pad2d((1, 2))),
  "cat": (lambda x: torch.cat([x, x * 2], 0), lambda x: x.cat(x * 2)), "reshape_flat": (lambda x: x.reshape(-1), None),
  "attention": (lambda x: tF.scaled_dot_product_attention(x, x, x), lambda x: x.scaled_dot_product_attention(x, x)),
  "binary_crossentropy": (lambda x: tF.binary_cross_entropy(x.sigmoid(), x.detach().sigmoid()),
                          lambda x: x.sigmoid().binary_crossentropy(x.detach().sigmoid())),
  "binary_crossentropy_logits": (lambda x: tF.binary_cross_entropy_with_logits(x, x.detach().sigmoid()),
                                 lambda x: x.binary_crossentropy_logits(x.detach().sigmoid())),
}

def labels(shape: tuple[int, ...]) -> np.ndarray: return np.zeros(shape, dtype=np.int64)

# name: (inputs (shapes of float leaves, or int arrays), torch fn, tinyc fn or None)
MANY_INPUTS: dict[str, tuple[Inputs, Callable[..., Any], Callable[..., Any] | None]] = {
  "matmul_inner_0": ([(3, 0), (0, 4)], lambda x, w: x @ w, None), "matmul_rows_0": ([(0, 3), (3, 4)], lambda x, w: x @ w, None),
  "matmul_batch_0": ([(0, 2, 3), (3, 4)], lambda x, w: x @ w, None), "matvec_inner_0": ([(3, 0), (0,)], lambda x, w: x @ w, None),
  "linear_batch_0": ([(0, 3), (3, 4), (4,)], lambda x, w, b: x @ w + b, lambda x, w, b: x.linear(w, b)),
  "conv2d_batch_0": ([(0, 2, 5, 5), (3, 2, 3, 3), (3,)], lambda x, w, b: tF.conv2d(x, w, b), lambda x, w, b: x.conv2d(w, b)),
  "conv2d_batch_0_padded": ([(0, 2, 4, 4), (3, 2, 3, 3)], lambda x, w: tF.conv2d(x, w, padding=1, stride=2),
                            lambda x, w: x.conv2d(w, padding=1, stride=2)),
  "conv_transpose2d_batch_0": ([(0, 2, 3, 3), (2, 3, 3, 3)], lambda x, w: tF.conv_transpose2d(x, w, stride=2),
                               lambda x, w: x.conv_transpose2d(w, stride=2)),
  "max_pool2d_batch_0": ([(0, 2, 4, 4)], lambda x: tF.max_pool2d(x, 2), lambda x: x.max_pool2d(2)),
  "avg_pool2d_batch_0": ([(0, 2, 4, 4)], lambda x: tF.avg_pool2d(x, 2), lambda x: x.avg_pool2d(2)),
  "cross_entropy_0_items": ([(0, 3), labels((0,))], lambda x, y: tF.cross_entropy(x, y), lambda x, y: x.sparse_categorical_crossentropy(y)),
  "cross_entropy_0_items_smoothed": ([(0, 3), labels((0,))], lambda x, y: tF.cross_entropy(x, y, label_smoothing=0.1),
                                     lambda x, y: x.sparse_categorical_crossentropy(y, label_smoothing=0.1)),
  "attention_0_keys": ([(2, 3, 4), (2, 0, 4), (2, 0, 4)], tF.scaled_dot_product_attention, lambda q, k, v: q.scaled_dot_product_attention(k, v)),
  "attention_0_queries": ([(2, 0, 4), (2, 3, 4), (2, 3, 4)], tF.scaled_dot_product_attention, lambda q, k, v: q.scaled_dot_product_attention(k, v)),
  "gather_0_rows": ([(3, 4), labels((0, 4))], lambda x, i: x.gather(0, i), lambda x, i: x.gather(i, 0)),
  "index_with_0_indices": ([(3, 4), labels((0,))], lambda x, i: x[i], None),
  "where_0": ([(0, 3), (0, 3)], lambda x, y: (x > 0).where(x, y) if isinstance(x, Tensor) else torch.where(x > 0, x, y), None),
}

def check_like_torch(inputs: Inputs, torch_fn: Callable[..., Any], tinyc_fn: Callable[..., Any] | None) -> None:
  """torch's result (forward and, for a float result, backward) from tinyc, or torch's exception class where torch raises."""
  arrays = [random_array(x) if isinstance(x, tuple) else x for x in inputs]
  theirs = [torch.tensor(a, requires_grad=bool(np.issubdtype(a.dtype, np.floating))) for a in arrays]
  try: want = torch_fn(*theirs)
  except Exception as error:  # noqa: BLE001 - whatever torch raises, tinyc must raise an instance of its class
    with pytest.raises(type(error)): (tinyc_fn or torch_fn)(*[Tensor(a) for a in arrays])
    return
  if want.dtype.is_floating_point: check_grad(arrays, torch_fn, tinyc_fn)
  else: compare((tinyc_fn or torch_fn)(*[Tensor(a) for a in arrays]), want)

@pytest.mark.parametrize("shape", EMPTY_SHAPES, ids=str)
@pytest.mark.parametrize("name", ONE_INPUT)
def test_empty_one_input(name, shape):
  torch_fn, tinyc_fn = ONE_INPUT[name]
  check_like_torch([shape], torch_fn, tinyc_fn)

@pytest.mark.parametrize("name", MANY_INPUTS)
def test_empty_many_inputs(name):
  check_like_torch(*MANY_INPUTS[name])

def test_matmul_over_an_empty_inner_dim_is_zeros():
  np.testing.assert_equal((Tensor.ones(3, 0) @ Tensor.ones(0, 4)).numpy(), np.zeros((3, 4), np.float32))
  assert (Tensor.ones(2, 0) * 3).sum(1).tolist() == [0.0, 0.0]

def test_softmax_of_an_empty_tensor_is_empty():
  out = Tensor.zeros(0, 3).softmax(0)
  assert out.shape == (0, 3) and out.numpy().shape == (0, 3)
