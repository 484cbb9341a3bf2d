"""Batch norm without mutable training state, and precise-BN evaluation statistics."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from stalesgd.models import get_model
from stalesgd.models._batch_norm import BatchNorm
from stalesgd.models._spec import ModelSpec


class _DenseBatchNorm(nn.Module):
  @nn.compact
  def __call__(self, images, *, train):
    hidden = nn.Dense(3, name="dense")(images.reshape(images.shape[0], -1))
    return nn.Dense(2, name="classifier")(BatchNorm(name="bn")(hidden, train=train))


def _images(seed, shape):
  return jnp.asarray(np.random.default_rng(seed).normal(size=shape), jnp.float32)


def test_precise_bn_is_mean_of_batch_means_and_of_unbiased_batch_variances():
  model = ModelSpec(name="dense_bn", module=_DenseBatchNorm(), num_classes=2, default_image_shape=(2, 2, 1))
  params = model.init(jax.random.key(0))["params"]
  batches = [{"image": _images(seed, (5, 2, 2, 1))} for seed in range(3)]
  stats = model.batch_stats_for_eval(params, batches)

  kernel, bias = np.asarray(params["dense"]["kernel"], np.float64), np.asarray(params["dense"]["bias"])
  hidden = [np.asarray(batch["image"], np.float64).reshape(5, -1) @ kernel + bias for batch in batches]
  np.testing.assert_allclose(stats["bn"]["mean"], np.mean([h.mean(0) for h in hidden], 0), rtol=1e-5)
  np.testing.assert_allclose(stats["bn"]["var"], np.mean([h.var(0, ddof=1) for h in hidden], 0), rtol=1e-5)


@pytest.fixture(scope="module")
def resnet_and_params():
  model = get_model("resnet20", num_classes=10)
  variables = model.init(jax.random.key(0))
  return model, variables


@pytest.mark.slow
def test_precise_bn_statistics_replace_the_initial_ones(resnet_and_params):
  model, variables = resnet_and_params
  batches = [{"image": _images(seed, (4, 32, 32, 3)) * 2.0 + 0.5} for seed in range(2)]
  stats = model.batch_stats_for_eval(variables["params"], batches)
  assert jax.tree.structure(stats) == jax.tree.structure(variables["batch_stats"])
  init_leaves, new_leaves = jax.tree.leaves(variables["batch_stats"]), jax.tree.leaves(stats)
  assert all(not np.allclose(new, old) for new, old in zip(new_leaves, init_leaves))
  assert all(np.all(np.isfinite(leaf)) for leaf in new_leaves)


@pytest.mark.slow
def test_evaluation_is_deterministic_and_per_example(resnet_and_params):
  model, variables = resnet_and_params
  batches = [{"image": _images(7, (4, 32, 32, 3))}]
  eval_variables = {
    "params": variables["params"],
    "batch_stats": model.batch_stats_for_eval(variables["params"], batches),
  }
  images = _images(8, (6, 32, 32, 3))
  logits = model.predict(eval_variables, images)
  np.testing.assert_array_equal(logits, model.predict(eval_variables, images))
  # Population statistics: an example's logits do not depend on its batch mates ...
  np.testing.assert_allclose(model.predict(eval_variables, images[:2]), logits[:2], rtol=1e-4, atol=1e-5)
  # ... while the training-mode forward normalises with the batch's own statistics.
  train_logits = model.loss_fn(variables["params"], {"image": images, "label": jnp.zeros(6, jnp.int32)})[1]
  train_logits_pair = model.loss_fn(variables["params"], {"image": images[:2], "label": jnp.zeros(2, jnp.int32)})[1]
  assert not np.allclose(train_logits[:2], train_logits_pair, atol=1e-4)


@pytest.mark.slow
def test_training_loss_needs_only_params(resnet_and_params):
  model, variables = resnet_and_params
  batch = {"image": _images(9, (2, 32, 32, 3)), "label": jnp.array([1, 2], jnp.int32)}
  loss, _ = jax.jit(model.loss_fn)(variables["params"], batch)
  assert np.isfinite(float(loss))


@pytest.mark.slow
def test_predict_without_batch_stats_and_empty_batches_are_rejected(resnet_and_params):
  model, variables = resnet_and_params
  with pytest.raises(ValueError, match="batch_stats"):
    model.predict({"params": variables["params"]}, _images(0, (1, 32, 32, 3)))
  with pytest.raises(ValueError, match="batches is empty"):
    model.batch_stats_for_eval(variables["params"], [])
