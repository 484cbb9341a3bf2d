"""Caffe's local response normalisation (LRN), both normalisation regions.

Krizhevsky et al. (2012) introduced LRN; Caffe's ``LRNLayer`` defines the two
variants the reproduced networks use:

* ``ACROSS_CHANNELS`` (AlexNet): y = x (k + alpha/n sum_{c' in window(c)} x_{c'}^2)^-beta,
  the window n channels wide, centred, zero-padded;
* ``WITHIN_CHANNEL`` (``cifar10_full``): y = x (1 + alpha/n^2 sum_{n x n window} x^2)^-beta
  over a centred spatial window with zero padding of (n-1)/2. Caffe builds it
  from an ``AVE`` pooling of x^2 (pad (n-1)/2, stride 1), whose divisor is
  always n^2 because the padding is counted; `caffe_avg_pool` implements that
  rule and is reused here.
"""

from __future__ import annotations

import jax
import numpy as np
from jax import lax

from stalesgd.models._caffe_pooling import caffe_avg_pool


def _check(local_size: int) -> None:
  if local_size < 1 or local_size % 2 == 0:
    raise ValueError(f"local_size must be a positive odd number (Caffe's rule); got {local_size}")


def lrn_within_channel(x: jax.Array, *, local_size: int, alpha: float, beta: float) -> jax.Array:
  """Caffe ``WITHIN_CHANNEL`` LRN: y = x (1 + alpha mean_{n x n}(x^2))^-beta.

  Args:
    x: [batch, height, width, channels].
    local_size: spatial window side n (odd).
    alpha: scale of the mean of squares.
    beta: exponent.

  Returns:
    Normalised activations, same shape as ``x``.
  """
  _check(local_size)
  mean_square = caffe_avg_pool(x * x, local_size, stride=1, pad=(local_size - 1) // 2)
  return x * (1.0 + alpha * mean_square) ** (-beta)


def lrn_across_channels(x: jax.Array, *, local_size: int, alpha: float, beta: float, k: float = 1.0) -> jax.Array:
  """Caffe ``ACROSS_CHANNELS`` LRN: y = x (k + alpha/n sum_{n channels} x^2)^-beta.

  Args:
    x: [batch, height, width, channels].
    local_size: channel window n (odd), centred on each channel.
    alpha: scale of the sum of squares (divided by n, as in Caffe).
    beta: exponent.
    k: additive constant.

  Returns:
    Normalised activations, same shape as ``x``.
  """
  _check(local_size)
  half = (local_size - 1) // 2
  sum_square = lax.reduce_window(
    x * x, np.array(0, x.dtype), lax.add, (1, 1, 1, local_size), (1, 1, 1, 1), ((0, 0), (0, 0), (0, 0), (half, half))
  )
  return x * (k + (alpha / local_size) * sum_square) ** (-beta)
