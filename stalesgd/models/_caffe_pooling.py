"""Max and average pooling with Caffe's output size and border rules.

The Caffe networks reproduced here (Rudra's ``cifar10_full``, Krizhevsky's
AlexNet as released with Caffe) depend on two details of Caffe's
``PoolingLayer`` that XLA's ``VALID``/``SAME`` padding does not give:

* the output size rounds **up**: ``out = ceil((size + 2 pad - window) / stride)
  + 1`` (so 32 -> 16 -> 8 -> 4 with a 3x3 window and stride 2, where ``VALID``
  gives 15 -> 7 -> 3), dropping the last window when it would start inside the
  bottom/right padding;
* an average divides by the window clipped to the padded input
  ``[-pad, size + pad)``, not by ``window**2``: a window hanging over the
  bottom/right edge of an unpadded input averages only the pixels it covers,
  while zero padding that lies inside ``[-pad, size + pad)`` is counted.

Max pooling ignores everything outside the input (padding is -inf).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax


def caffe_pooled_size(size: int, window: int, stride: int, pad: int = 0) -> int:
  """Caffe's pooled output length along one spatial axis.

  out = ceil((size + 2 pad - window) / stride) + 1, minus one when the last
  window would start at or beyond ``size + pad`` (only possible with padding).

  Args:
    size: input length.
    window: pooling window length.
    stride: step between windows.
    pad: zero padding on both sides.

  Returns:
    The number of windows.
  """
  if window < 1 or stride < 1 or pad < 0 or pad >= window:
    raise ValueError(
      f"caffe pooling needs window >= 1, stride >= 1 and 0 <= pad < window; got window={window}, "
      f"stride={stride}, pad={pad}"
    )
  if size + 2 * pad < window:
    raise ValueError(f"size={size} (with pad={pad}) is smaller than the pooling window={window}")
  pooled = math.ceil((size + 2 * pad - window) / stride) + 1
  if pad > 0 and (pooled - 1) * stride >= size + pad:
    pooled -= 1
  return pooled


def _reduce_window_padding(size: int, window: int, stride: int, pad: int) -> tuple[int, int]:
  """(low, high) padding for lax.reduce_window that yields Caffe's windows."""
  pooled = caffe_pooled_size(size, window, stride, pad)
  return pad, (pooled - 1) * stride + window - size - pad


def _average_divisors(size: int, window: int, stride: int, pad: int) -> np.ndarray:
  """Caffe's per-window divisor along one axis: the window clipped to [-pad, size + pad)."""
  starts = np.arange(caffe_pooled_size(size, window, stride, pad)) * stride - pad
  ends = np.minimum(starts + window, size + pad)
  return (ends - starts).astype(np.float32)


def _window_args(images: jax.Array, window: int, stride: int, pad: int):
  if images.ndim != 4:
    raise ValueError(f"pooling expects images [batch, height, width, channels]; got shape {images.shape}")
  height, width = images.shape[1], images.shape[2]
  padding = (
    (0, 0),
    _reduce_window_padding(height, window, stride, pad),
    _reduce_window_padding(width, window, stride, pad),
    (0, 0),
  )
  return (1, window, window, 1), (1, stride, stride, 1), padding


def caffe_max_pool(images: jax.Array, window: int, stride: int, pad: int = 0) -> jax.Array:
  """Caffe ``MAX`` pooling: y = max over the window clipped to the input.

  Args:
    images: [batch, height, width, channels].
    window: square window side.
    stride: step between windows.
    pad: padding on each side (never selected by the max).

  Returns:
    [batch, pooled_height, pooled_width, channels], sizes from
    `caffe_pooled_size`.
  """
  dims, strides, padding = _window_args(images, window, stride, pad)
  return lax.reduce_window(images, np.array(-np.inf, images.dtype), lax.max, dims, strides, padding)


def caffe_avg_pool(images: jax.Array, window: int, stride: int, pad: int = 0) -> jax.Array:
  """Caffe ``AVE`` pooling: y = sum over the window / |window clipped to [-pad, size + pad)|.

  Args:
    images: [batch, height, width, channels].
    window: square window side.
    stride: step between windows.
    pad: zero padding on each side (counted in the divisor).

  Returns:
    [batch, pooled_height, pooled_width, channels], sizes from
    `caffe_pooled_size`.
  """
  dims, strides, padding = _window_args(images, window, stride, pad)
  sums = lax.reduce_window(images, np.array(0, images.dtype), lax.add, dims, strides, padding)
  divisors = np.outer(
    _average_divisors(images.shape[1], window, stride, pad), _average_divisors(images.shape[2], window, stride, pad)
  )
  return sums / jnp.asarray(divisors[None, :, :, None], images.dtype)
