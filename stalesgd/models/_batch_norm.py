"""Batch normalisation whose training path carries no mutable state.

The emulator evaluates many learners' gradients at stale weights in parallel and
only the parameters travel between them, so a training-mode forward must be a
pure function of (params, batch). This layer therefore never updates running
averages: in training it normalises with the batch's own statistics, and the
population statistics used in evaluation are recomputed at the evaluated weights
from a few training batches ("precise BN", Wu & Johnson, arXiv 2105.07576):

  E[x] = mean_B mu_B,   Var[x] = m/(m-1) mean_B sigma_B^2,

m the number of values per channel in one batch (Ioffe & Szegedy,
arXiv 1502.03167, Algorithm 2). A training-mode forward applied with the
``MOMENTS_COLLECTION`` collection mutable records each layer's mu_B and
m/(m-1) sigma_B^2 there, under the same names as the ``batch_stats`` it will
fill (`stalesgd.models.ModelSpec.batch_stats_for_eval` averages them).
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
from jax import lax

MOMENTS_COLLECTION = "batch_moments"


class BatchNorm(nn.Module):
  """y = scale (x - mean) / sqrt(var + epsilon) + bias over all axes but the last.

  Attributes:
    epsilon: added to the variance.
  """

  epsilon: float = 1e-5

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool) -> jax.Array:
    features = x.shape[-1]
    scale = self.param("scale", nn.initializers.ones, (features,), jnp.float32)
    bias = self.param("bias", nn.initializers.zeros, (features,), jnp.float32)
    if train:
      axes = tuple(range(x.ndim - 1))
      mean = jnp.mean(x, axis=axes)
      var = jnp.mean(jnp.square(x - mean), axis=axes)
      if self.is_mutable_collection(MOMENTS_COLLECTION):
        values_per_channel = x.size // features
        self.put_variable(MOMENTS_COLLECTION, "mean", mean)
        self.put_variable(MOMENTS_COLLECTION, "var", var * values_per_channel / max(values_per_channel - 1, 1))
    else:
      mean = self.variable("batch_stats", "mean", jnp.zeros, (features,), jnp.float32).value
      var = self.variable("batch_stats", "var", jnp.ones, (features,), jnp.float32).value
    return (x - mean) * (lax.rsqrt(var + self.epsilon) * scale) + bias
