"""Caffe pooling and LRN against hand-written numpy references of Caffe's loops."""

from __future__ import annotations

import numpy as np
import pytest

from stalesgd.models._caffe_pooling import caffe_avg_pool, caffe_max_pool, caffe_pooled_size
from stalesgd.models._local_response_norm import lrn_across_channels, lrn_within_channel
from tests.helpers import caffe_reference


@pytest.mark.parametrize(
  "size, window, stride, pad, expected",
  [
    (32, 3, 2, 0, 16),
    (16, 3, 2, 0, 8),
    (8, 3, 2, 0, 4),  # cifar10_full: rounds up
    (55, 3, 2, 0, 27),
    (27, 3, 2, 0, 13),
    (13, 3, 2, 0, 6),  # AlexNet
    (5, 3, 1, 1, 5),  # LRN's pooling keeps the size
    (6, 3, 3, 2, 3),  # the last window would start in the padding: dropped
  ],
)
def test_pooled_size_follows_caffe(size, window, stride, pad, expected):
  assert caffe_pooled_size(size, window, stride, pad) == expected


@pytest.mark.parametrize(
  "bad",
  [
    dict(window=0, stride=1),
    dict(window=3, stride=0),
    dict(window=3, stride=1, pad=3),
    dict(window=3, stride=1, pad=-1),
  ],
)
def test_pooled_size_rejects_bad_arguments(bad):
  with pytest.raises(ValueError, match="window"):
    caffe_pooled_size(8, **bad)


@pytest.mark.slow
@pytest.mark.parametrize("mode", ["max", "avg"])
@pytest.mark.parametrize(
  "size, window, stride, pad", [(32, 3, 2, 0), (9, 3, 2, 0), (7, 3, 2, 1), (6, 3, 3, 2), (5, 3, 1, 1), (10, 2, 2, 0)]
)
def test_pooling_matches_caffe_loops(mode, size, window, stride, pad):
  rng = np.random.default_rng(size * 100 + window * 10 + pad)
  x = rng.normal(size=(2, size, size + 1, 3)).astype(np.float32)
  pool = caffe_max_pool if mode == "max" else caffe_avg_pool
  got = np.asarray(pool(x, window, stride, pad))
  want = caffe_reference.pool(x.astype(np.float64), window, stride, pad, mode)
  np.testing.assert_allclose(got, want, rtol=1e-6, atol=1e-6)


def test_average_pool_divides_border_windows_by_clipped_size():
  ones = np.ones((1, 32, 32, 1), np.float32)
  # Every window of an all-ones image averages to exactly 1 with Caffe's divisor,
  # although the last row/column of windows covers only 2 of its 3 rows/columns.
  np.testing.assert_array_equal(np.asarray(caffe_avg_pool(ones, 3, 2)), np.ones((1, 16, 16, 1)))


def test_lrn_within_channel_matches_numpy_reference():
  # Activations of the scale cifar10_full sees (mean-subtracted 0..255 pixels),
  # with a large alpha too so that the normalisation is far from the identity.
  x = np.random.default_rng(0).normal(scale=60.0, size=(2, 7, 6, 4)).astype(np.float32)
  for alpha in (5e-5, 1e-2):
    got = np.asarray(lrn_within_channel(x, local_size=3, alpha=alpha, beta=0.75))
    np.testing.assert_allclose(got, caffe_reference.lrn_within(x, 3, alpha, 0.75), rtol=2e-5)
  assert not np.allclose(np.asarray(lrn_within_channel(x, local_size=3, alpha=1e-2, beta=0.75)), x)


def test_lrn_across_channels_matches_numpy_reference():
  x = np.random.default_rng(1).normal(scale=30.0, size=(2, 3, 3, 9)).astype(np.float32)
  got = np.asarray(lrn_across_channels(x, local_size=5, alpha=1e-3, beta=0.75, k=2.0))
  np.testing.assert_allclose(got, caffe_reference.lrn_across(x, 5, 1e-3, 0.75, 2.0), rtol=2e-5)


@pytest.mark.parametrize("local_size", [0, 2, 4])
def test_lrn_rejects_even_or_empty_windows(local_size):
  x = np.ones((1, 4, 4, 2), np.float32)
  with pytest.raises(ValueError, match="local_size"):
    lrn_within_channel(x, local_size=local_size, alpha=1e-4, beta=0.75)
