"""Bad input, side by side with PyTorch: for each row, tinyc raises an instance of the exception class torch raises for the same
mistake, with a message that names the problem. Most errors are found while the graph is built; an out-of-range index value is
found where data reaches the host (numpy, item, tolist), so those rows read it back."""
from __future__ import annotations
from pathlib import Path
from typing import Any, Callable
import pytest
import safetensors.torch
import torch
import torch.nn.functional as tF
from tinyc import Tensor, dtypes, nn
from tinyc.nn.state import safe_load

def tx(*shape: int) -> Tensor: return Tensor.ones(*shape)
def th(*shape: int) -> torch.Tensor: return torch.ones(*shape)
def index_t(rows: list[list[int]]) -> Tensor: return Tensor(rows)
def index_h(rows: list[list[int]]) -> torch.Tensor: return torch.tensor(rows)

def not_safetensors(path: Path) -> Path:
  path.write_bytes(b"abc")
  return path

# name: (tinyc callable, torch callable, a substring tinyc's message must contain). A callable taking `path` gets a fresh file path.
ERRORS: dict[str, tuple[Callable[..., Any], Callable[..., Any], str]] = {
  # ---- PyTorch habits (issue 12) ----
  "cat_0d": (lambda: Tensor(1.0).cat(Tensor(2.0)), lambda: torch.cat([torch.tensor(1.0), torch.tensor(2.0)]),
             "zero-dimensional tensor (at position 0) cannot be concatenated"),
  "cat_0d_second": (lambda: Tensor.cat([tx(1), Tensor(2.0)]), lambda: torch.cat([th(1), torch.tensor(2.0)]),
                    "zero-dimensional tensor (at position 1) cannot be concatenated"),
  "cat_empty_list": (lambda: Tensor.cat([]), lambda: torch.cat([]), "expected a non-empty list of Tensors"),
  "stack_empty_list": (lambda: Tensor.stack([]), lambda: torch.stack([]), "non-empty"),
  "cat_not_a_tensor": (lambda: Tensor.cat([tx(2), 3]), lambda: torch.cat([th(2), 3]), "expected Tensor as element 1"),
  "int_beyond_int64": (lambda: Tensor([1, 2 ** 70]), lambda: torch.tensor([1, 2 ** 70]), "Overflow"),
  "int_beyond_int64_scalar": (lambda: Tensor(2 ** 64), lambda: torch.tensor(2 ** 64), "Overflow"),
  "int_beyond_given_dtype": (lambda: Tensor([2 ** 40], dtype=dtypes.int32), lambda: torch.tensor([2 ** 40], dtype=torch.int32),
                             "cannot be converted to type int32 without overflow"),
  "int_scalar_beyond_given_dtype": (lambda: Tensor(300, dtype=dtypes.int8), lambda: torch.tensor(300, dtype=torch.int8),
                                    "cannot be converted to type int8 without overflow"),
  "gather_dim_out_of_range": (lambda: tx(2, 3).gather(2, index_t([[0]])), lambda: th(2, 3).gather(2, index_h([[0]])), "Dimension out of range"),
  "gather_float_index": (lambda: tx(2, 3).gather(1, tx(2, 2)), lambda: th(2, 3).gather(1, th(2, 2)), "for index"),
  "gather_no_index": (lambda: tx(2, 3).gather(1, [[0]]), lambda: th(2, 3).gather(1, [[0]]), "index"),
  "max_of_empty_dim": (lambda: tx(0, 3).max(0), lambda: th(0, 3).amax(0), "Expected reduction dim 0 to have non-zero size"),
  "min_of_empty_dim": (lambda: tx(3, 0).min(-1), lambda: th(3, 0).amin(-1), "Expected reduction dim -1 to have non-zero size"),
  "max_of_nothing": (lambda: tx(0, 3).max(), lambda: th(0, 3).max(), "Expected reduction dim to be specified for input.numel() == 0"),
  "argmax_of_nothing": (lambda: tx(0).argmax(), lambda: th(0).argmax(), "Expected reduction dim to be specified for input.numel() == 0"),
  "argmin_of_empty_dim": (lambda: tx(2, 0).argmin(1), lambda: th(2, 0).argmin(1), "argmin(): Expected reduction dim 1 to have non-zero size"),
  "tril_of_1d": (lambda: tx(3).tril(), lambda: th(3).tril(), "at least 2 dimensions"),
  "attention_of_1d": (lambda: tx(3).scaled_dot_product_attention(tx(3), tx(3)), lambda: tF.scaled_dot_product_attention(th(3), th(3), th(3)),
                      "at least 2 dimensional"),
  "item_of_many": (lambda: tx(2).item(), lambda: th(2).item(), "a Tensor with 2 elements cannot be converted to Scalar"),
  "clip_without_bounds": (lambda: tx(2).clip(), lambda: th(2).clip(), "At least one of 'min' or 'max' must not be None"),
  "chunk_zero": (lambda: tx(4).chunk(0), lambda: th(4).chunk(0), "chunk expects `chunks` to be greater than 0"),
  "arange_zero_step": (lambda: Tensor.arange(0, 5, 0), lambda: torch.arange(0, 5, 0), "step must be nonzero"),
  # ---- already right before issue 12 ----
  "add_shapes": (lambda: tx(2, 3) + tx(4), lambda: th(2, 3) + th(4), "The size of tensor a (3) must match the size of tensor b (4)"),
  "where_shapes": (lambda: tx(2, 3).where(tx(2, 3), tx(2, 2)), lambda: torch.where(th(2, 3) > 0, th(2, 3), th(2, 2)), "must match the size"),
  "matmul_shapes": (lambda: tx(2, 3) @ tx(2, 3), lambda: th(2, 3) @ th(2, 3), "cannot be multiplied (2x3 and 2x3)"),
  "matmul_0d": (lambda: Tensor(2.0) @ tx(2), lambda: torch.tensor(2.0) @ th(2), "at least 1D"),
  "cat_shapes": (lambda: tx(2, 3).cat(tx(2, 4)), lambda: torch.cat([th(2, 3), th(2, 4)]), "Sizes of tensors must match except in dimension 0"),
  "cat_ndims": (lambda: tx(2, 3).cat(tx(3)), lambda: torch.cat([th(2, 3), th(3)]), "(2, 3)"),
  "stack_shapes": (lambda: Tensor.stack([tx(2, 3), tx(3, 2)]), lambda: torch.stack([th(2, 3), th(3, 2)]),
                   "stack expects each tensor to be equal size"),
  "reshape_size": (lambda: tx(2, 3).reshape(7), lambda: th(2, 3).reshape(7), "is invalid for input of size 6"),
  "reshape_two_inferred": (lambda: tx(2, 3).reshape(-1, -1), lambda: th(2, 3).reshape(-1, -1), "only one dimension can be inferred"),
  "expand_size": (lambda: tx(2, 3).expand(4, 3), lambda: th(2, 3).expand(4, 3),
                  "The expanded size of the tensor (4) must match the existing size (2)"),
  "repeat_too_few": (lambda: tx(2, 3).repeat(2), lambda: th(2, 3).repeat(2), "Number of dimensions of repeat dims"),
  "permute_duplicate": (lambda: tx(2, 3).permute(0, 0), lambda: th(2, 3).permute(0, 0), "is not a permutation of the dims"),
  "permute_too_few": (lambda: tx(2, 3).permute(0), lambda: th(2, 3).permute(0), "is not a permutation of the dims"),
  "dim_out_of_range": (lambda: tx(2, 3).sum(2), lambda: th(2, 3).sum(2), "Dimension out of range (expected to be in range of [-2, 1], but got 2)"),
  "int_index_out_of_range": (lambda: tx(2, 3)[:, 3], lambda: th(2, 3)[:, 3], "index 3 is out of bounds for dimension 1 with size 3"),
  "negative_int_index_out_of_range": (lambda: tx(2, 3)[-3], lambda: th(2, 3)[-3], "index -3 is out of bounds for dimension 0 with size 2"),
  "too_many_indices": (lambda: tx(2, 3)[0, 0, 0], lambda: th(2, 3)[0, 0, 0], "too many indices for tensor of dimension 2"),
  "conv_channels": (lambda: tx(1, 3, 5, 5).conv2d(tx(4, 2, 3, 3)), lambda: tF.conv2d(th(1, 3, 5, 5), th(4, 2, 3, 3)), "channels"),
  "pool_window_too_large": (lambda: tx(1, 1, 2, 2).max_pool2d(3), lambda: tF.max_pool2d(th(1, 1, 2, 2), 3), "larger than the input"),
  "backward_non_scalar": (lambda: (Tensor.ones(2, 3, requires_grad=True) * 2).backward(),
                          lambda: (torch.ones(2, 3, requires_grad=True) * 2).backward(), "grad can be implicitly created only for scalar outputs"),
  "backward_without_grad": (lambda: tx(2).sum().backward(), lambda: th(2).sum().backward(), "does not require grad"),
  "bool_of_many": (lambda: bool(tx(2)), lambda: bool(th(2)), "ambiguous"),
  "bad_safetensors": (lambda path: safe_load(not_safetensors(path)), lambda path: safetensors.torch.load_file(not_safetensors(path)), "header"),
  # ---- out-of-range index values (Tensor indices, gather, Embedding, labels): raised where data reaches the host ----
  "tensor_index_too_high": (lambda: Tensor.arange(5)[Tensor([1, 7])].numpy(), lambda: torch.arange(5)[torch.tensor([1, 7])],
                            "index 7 is out of bounds for dimension 0 with size 5"),
  "tensor_index_too_low": (lambda: Tensor.arange(5)[Tensor([-9])].tolist(), lambda: torch.arange(5)[torch.tensor([-9])],
                           "index -9 is out of bounds for dimension 0 with size 5"),
  "gather_index": (lambda: tx(3).gather(0, Tensor([5])).numpy(), lambda: th(3).gather(0, torch.tensor([5])),
                   "index 5 is out of bounds for dimension 0 with size 3"),
  "embedding_id": (lambda: nn.Embedding(5, 2)(Tensor([9])).numpy(), lambda: torch.nn.Embedding(5, 2)(torch.tensor([9])), "id 9"),
  "label_out_of_range": (lambda: tx(2, 3).sparse_categorical_crossentropy(Tensor([7, 0])).item(),
                         lambda: tF.cross_entropy(th(2, 3), torch.tensor([7, 0])), "Target 7 is out of bounds"),
  # ---- integer division and modulo by a constant zero: raised when the graph is built ----
  "floordiv_by_zero": (lambda: Tensor([1, 2]) // 0, lambda: torch.tensor([1, 2]) // 0, "ZeroDivisionError"),
  "mod_by_zero": (lambda: Tensor([1, 2]) % 0, lambda: torch.tensor([1, 2]) % 0, "ZeroDivisionError"),
}

def builtin_class(error: BaseException) -> type[BaseException]:
  """The first builtin class of a torch exception (torch's own classes, like SafetensorError, derive from the builtins)."""
  return next(c for c in type(error).__mro__ if c.__module__ == "builtins")

@pytest.mark.parametrize("name", ERRORS)
def test_error_like_torch(name: str, tmp_path: Path) -> None:
  tinyc_fn, torch_fn, words = ERRORS[name]
  args = [tmp_path / "file"] if tinyc_fn.__code__.co_argcount else []
  with pytest.raises(Exception) as torch_error: torch_fn(*args)
  with pytest.raises(builtin_class(torch_error.value)) as tinyc_error: tinyc_fn(*args)
  assert words in str(tinyc_error.value), f"{name}: {tinyc_error.value!r} does not say {words!r} (torch: {torch_error.value!r})"

# a shape that does not fit is a RuntimeError as in torch and also a ValueError, as numpy (and tinygrad) raise for it
SHAPE_ERRORS = ["cat_0d", "cat_shapes", "cat_ndims", "stack_shapes", "reshape_size", "reshape_two_inferred", "expand_size", "repeat_too_few"]

@pytest.mark.parametrize("name", SHAPE_ERRORS)
def test_shape_errors_are_also_value_errors(name: str) -> None:
  with pytest.raises(ValueError) as error: ERRORS[name][0]()
  assert isinstance(error.value, RuntimeError)
