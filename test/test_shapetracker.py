"""View and ShapeTracker unit tests: each movement op, view stacking and merging, index/validity expressions, real_strides."""
from __future__ import annotations
import itertools
import numpy as np
import pytest
from tinyc.shape.shapetracker import ShapeTracker, index_variables
from tinyc.shape.symbolic import NumNode, Variable, sym_infer
from tinyc.shape.view import View, strides_for_shape

def elements(st: ShapeTracker) -> np.ndarray:
  """What st reads from the buffer arange(n): buffer[idx] where valid, else -1."""
  idx, valid = st.expr_idxs()
  out = np.full(st.shape, -1, dtype=np.int64)
  variables = index_variables(st.shape)
  for point in itertools.product(*[range(size) for size in st.shape]):
    env = {v: i for v, i in zip(variables, point) if isinstance(v, Variable)}
    if sym_infer(valid, env): out[point] = sym_infer(idx, env)
  return out

class TestView:
  def test_strides_for_shape(self):
    assert strides_for_shape((2, 3, 4)) == (12, 4, 1) and strides_for_shape((2, 1, 4)) == (4, 0, 1) and strides_for_shape(()) == ()
  def test_create_canonicalises(self):
    view = View.create((3, 1, 4))
    assert view.strides == (4, 0, 1) and view.contiguous and view.mask is None
    assert View.create((3, 4), (4, 1), 0, ((0, 3), (0, 4))).mask is None  # a full mask is no mask
    assert View.create((3, 4), (4, 1), 0, ((0, 3), (0, 4))).contiguous
    assert not View.create((3, 4), (1, 3)).contiguous and not View.create((3, 4), (4, 1), 2).contiguous
    empty = View.create((3, 4), (4, 1), 5, ((1, 1), (0, 4)))
    assert empty.all_invalid and empty.strides == (0, 0) and empty.offset == 0 and empty.mask == ((0, 0), (0, 0))
    one = View.create((3, 4), (4, 1), 0, ((1, 2), (0, 4)))  # one valid row: its stride folds into the offset
    assert one.strides == (0, 1) and one.offset == 4 and one.mask == ((1, 2), (0, 4))
  def test_create_is_memoised(self):
    assert View.create((2, 3)) is View.create((2, 3))
  def test_expr(self):
    view = View.create((3, 4), (1, 3), 2, ((1, 3), (0, 4)))
    i, j = Variable("i", 0, 2), Variable("j", 0, 3)
    assert view.expr_idxs([i, j]) == i + j * 3 + 2
    assert view.expr_valid([i, j]) == (i >= 1)
    assert View.create((3, 4)).expr_valid([i, j]) == 1
  def test_reshape_split_and_merge(self):
    assert View.create((6, 4)).permute((1, 0)).reshape((2, 2, 6)) == View.create((2, 2, 6), (2, 1, 4))
    assert View.create((6, 4)).permute((1, 0)).reshape((24,)) is None  # not one run
    assert View.create((4, 1)).expand((4, 3)).reshape((2, 2, 3)) == View.create((2, 2, 3), (2, 1, 0))
  def test_reshape_masks(self):
    padded = View.create((4, 4)).pad(((1, 1), (0, 0)))  # (6, 4), rows 1..4 valid
    flat = padded.reshape((24,))
    assert flat is not None and flat.mask == ((4, 20),) and flat.strides == (1,) and flat.offset == -4
    assert View.create((4,)).pad(((1, 1),)).reshape((2, 3)) is None  # the valid elements 1..4 aren't a box in (2, 3)
    split = View.create((4,)).pad(((2, 2),)).reshape((2, 4))  # valid 2..5 of 8 -> rows 0..1, but columns 2..3 then 0..1: not a box
    assert split is None
    boxed = View.create((4,)).pad(((4, 0),)).reshape((2, 4))
    assert boxed is not None and boxed.mask == ((1, 2), (0, 4))
  def test_pad_shrink_stride(self):
    view = View.create((3, 4)).pad(((1, 0), (0, 2)))
    assert view.shape == (4, 6) and view.mask == ((1, 4), (0, 4)) and view.offset == -4
    assert view.shrink(((1, 4), (0, 4))) == View.create((3, 4))
    flipped = View.create((3, 4)).stride((-1, 2))
    assert flipped.shape == (3, 2) and flipped.strides == (-4, 2) and flipped.offset == 8
  def test_merge_views(self):
    base = View.create((4, 6)).permute((1, 0))
    assert base + View.create((6, 4)) == base                       # contiguous on top of the same shape
    assert View.create((24,)) + base == base                         # contiguous base
    assert base + View.create((6, 4)).permute((1, 0)) == View.create((4, 6))  # permute back
    assert base + View.create((24,)) is None                         # flattening a transposed view needs two views

class TestShapeTracker:
  def test_from_shape(self):
    st = ShapeTracker.from_shape((2, 3))
    assert st.shape == (2, 3) and st.size == 6 and st.real_size() == 6 and st.contiguous
    assert elements(st).tolist() == [[0, 1, 2], [3, 4, 5]]
  def test_reshape_after_permute_stacks_a_view(self):
    st = ShapeTracker.from_shape((2, 3, 4)).permute((1, 0, 2)).reshape((3, 8))
    assert len(st.views) == 2 and st.simplify() == st
    expected = np.arange(24).reshape(2, 3, 4).transpose(1, 0, 2).reshape(3, 8)
    assert np.array_equal(elements(st), expected)
    back = st.reshape((3, 2, 4))
    assert len(back.views) == 2 and len(back.simplify().views) == 1  # the top view became contiguous over the same shape: it merges
    assert np.array_equal(elements(back.simplify()), expected.reshape(3, 2, 4))
  def test_expand_then_reshape(self):
    st = ShapeTracker.from_shape((1, 4)).expand((3, 4)).reshape((3, 2, 2))
    assert len(st.views) == 1 and st.views[0].strides == (0, 2, 1) and st.real_strides() == (0, 2, 1)
    assert np.array_equal(elements(st), np.broadcast_to(np.arange(4), (3, 4)).reshape(3, 2, 2))
    assert st.real_size() == 4
  def test_pad_then_shrink_is_contiguous(self):
    st = ShapeTracker.from_shape((4, 6)).pad(((1, 1), (2, 0)))
    assert not st.contiguous and st.real_size() == 24
    assert np.array_equal(elements(st), np.pad(np.arange(24).reshape(4, 6), ((1, 1), (2, 0)), constant_values=-1))
    assert st.shrink(((1, 5), (2, 8))).contiguous
  def test_shrink_into_padding_is_all_invalid(self):
    st = ShapeTracker.from_shape((4,)).pad(((3, 0),)).shrink(((0, 2),))
    idx, valid = st.expr_idxs()
    assert valid == 0 and st.real_size() == 0 and (elements(st) == -1).all()
  def test_flip(self):
    st = ShapeTracker.from_shape((2, 3)).stride((1, -1))
    assert elements(st).tolist() == [[2, 1, 0], [5, 4, 3]] and st.real_strides() == (3, -1)
  def test_real_strides(self):
    st = ShapeTracker.from_shape((4, 6)).pad(((1, 1), (0, 0)))
    assert st.real_strides() == (None, 1) and st.real_strides(ignore_valid=True) == (6, 1)
    assert st.unit_stride_axes() == [1] and st.axis_is_masked(0) and not st.axis_is_masked(1)
    stacked = ShapeTracker.from_shape((2, 3, 4)).permute((1, 0, 2)).reshape((3, 8))
    assert stacked.real_strides() == (4, None)  # idx1 feeds a // and a %: not linear
  def test_expr_node(self):
    st = ShapeTracker.from_shape((3, 4)).permute((1, 0))
    idx, valid = st.expr_node(Variable("i", 0, 11))
    assert valid == 1 and [sym_infer(idx, {Variable("i", 0, 11): i}) for i in range(12)] == np.arange(12).reshape(3, 4).T.ravel().tolist()
  def test_add_composes(self):
    producer = ShapeTracker.from_shape((4, 6)).permute((1, 0))
    consumer = ShapeTracker.from_shape((6, 4)).reshape((24,)).shrink(((2, 10),))
    combined = producer + consumer
    assert combined.shape == (8,) and len(combined.views) == 2
    assert np.array_equal(elements(combined), np.arange(24).reshape(4, 6).T.ravel()[2:10])
    assert producer + ShapeTracker.from_shape((6, 4)) == producer
    padded = ShapeTracker.from_shape((2, 2)).pad(((1, 1), (1, 1)))
    combined = padded + ShapeTracker.from_shape((4, 4)).permute((1, 0)).shrink(((1, 4), (0, 2)))
    assert len(combined.views) == 1
    assert np.array_equal(elements(combined), np.pad(np.arange(4).reshape(2, 2), 1, constant_values=-1).T[1:4, 0:2])
  def test_expr_idxs_custom_nodes(self):
    st = ShapeTracker.from_shape((4, 8))
    gidx0, ridx0 = Variable("gidx0", 0, 3), Variable("ridx0", 0, 7)
    idx, valid = st.expr_idxs([gidx0, ridx0])
    assert idx.render() == "((gidx0*8)+ridx0)" and valid == NumNode(1)
  def test_movement_ops_are_memoised(self):
    st = ShapeTracker.from_shape((4, 6))
    assert st.reshape((6, 4)) is st.reshape((6, 4)) and st.permute((1, 0)) is st.permute((1, 0))
  def test_bad_arguments_assert(self):
    st = ShapeTracker.from_shape((4, 6))
    with pytest.raises(AssertionError, match="can't reshape"): st.reshape((5, 5))
    with pytest.raises(AssertionError, match="not a permutation"): st.permute((0, 0))
    with pytest.raises(AssertionError, match="only size-1 dims expand"): st.expand((8, 6))
    with pytest.raises(AssertionError, match="invalid shrink"): st.shrink(((0, 5), (0, 6)))
    with pytest.raises(AssertionError, match="invalid pad"): st.pad(((0, -1), (0, 0)))
    with pytest.raises(AssertionError, match="invalid stride"): st.stride((0, 1))

def test_a_constant_index_is_checked_only_against_the_dims_the_mask_bounds():
  """A lane's constant index outside a masked dim's range is invalid at once; one past an unmasked dim's size is not judged by the
  mask (a PADTO lane: the kernel's own view masks it). The shortcut once read the full range as a bound and zeroed such lanes."""
  view = View.create((4, 3), mask=((1, 3), (0, 3)))
  assert view.expr_valid([NumNode(0), NumNode(1)]).max == 0 and view.expr_valid([NumNode(3), NumNode(1)]).max == 0
  assert view.expr_valid([NumNode(2), NumNode(5)]).min == 1
  row = Variable("row", 0, 3)
  assert (view.expr_valid([row, NumNode(5)]).min, view.expr_valid([row, NumNode(5)]).max) == (0, 1)
