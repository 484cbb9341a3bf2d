"""Dropout keyed by the batch's seed: same (params, batch) -> same loss, in and out of vmap."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from stalesgd.models import get_model
from stalesgd.models._spec import ModelSpec


class _DenseDropout(nn.Module):
  @nn.compact
  def __call__(self, images, *, train):
    hidden = nn.relu(nn.Dense(64, name="hidden")(images.reshape(images.shape[0], -1)))
    return nn.Dense(3, name="classifier")(nn.Dropout(0.5, deterministic=not train)(hidden))


@pytest.fixture(scope="module")
def model_and_params():
  model = ModelSpec(
    name="dense_dropout", module=_DenseDropout(), num_classes=3, default_image_shape=(2, 2, 1), uses_dropout=True
  )
  return model, model.init(jax.random.key(0))["params"]


def _batch(seed):
  rng = np.random.default_rng(0)
  return {
    "image": jnp.asarray(rng.normal(size=(4, 2, 2, 1)), jnp.float32),
    "label": jnp.array([0, 1, 2, 0], jnp.int32),
    "dropout_seed": jnp.uint32(seed),
  }


@pytest.mark.slow
def test_same_seed_same_loss_other_seed_other_mask(model_and_params):
  model, params = model_and_params
  loss = jax.jit(model.loss_fn)
  assert float(loss(params, _batch(5))[0]) == float(loss(params, _batch(5))[0])
  assert float(loss(params, _batch(5))[0]) != float(loss(params, _batch(6))[0])


@pytest.mark.slow
def test_vmapped_learners_each_use_their_own_seed(model_and_params):
  model, params = model_and_params
  batches = [_batch(seed) for seed in (1, 2, 3)]
  stacked = jax.tree.map(lambda *leaves: jnp.stack(leaves), *batches)
  vmapped = jax.vmap(model.loss_fn, in_axes=(None, 0))(params, stacked)[0]
  np.testing.assert_allclose(vmapped, [float(model.loss_fn(params, batch)[0]) for batch in batches], rtol=1e-6)


def test_missing_seed_is_rejected_and_evaluation_needs_none(model_and_params):
  model, params = model_and_params
  batch = _batch(0)
  del batch["dropout_seed"]
  with pytest.raises(ValueError, match="uses dropout: its batches need a 'dropout_seed'"):
    model.loss_fn(params, batch)
  logits = model.predict({"params": params}, batch["image"])
  np.testing.assert_array_equal(logits, model.predict({"params": params}, batch["image"]))


def test_alexnet_dropout_option():
  assert get_model("alexnet", num_classes=10, dropout_rate=0.5).uses_dropout
  assert not get_model("alexnet", num_classes=10).uses_dropout
  assert not get_model("alexnet", num_classes=10, dropout_rate=0.0).uses_dropout
  for rate in (1.0, -0.5, 1.5):
    with pytest.raises(ValueError, match=r"dropout_rate must lie in \[0, 1\)"):
      get_model("alexnet", num_classes=10, dropout_rate=rate)
