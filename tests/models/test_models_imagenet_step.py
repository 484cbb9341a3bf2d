"""The ImageNet models build and run one training step.

(Evaluation with precise BN is exercised on ResNet-20 in test_models_precise_bn.py:
the same code path, without another slow ResNet-50 compilation here.)
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from stalesgd.models import get_model

pytestmark = pytest.mark.slow  # about 10 s of XLA compilation each on a 2-core CPU


def _one_sgd_step(model, params, batch, learning_rate=0.01):
  (loss, logits), grads = jax.jit(jax.value_and_grad(model.loss_fn, has_aux=True))(params, batch)
  new_params = jax.tree.map(lambda p, g: p - learning_rate * g, params, grads)
  return loss, logits, grads, new_params


@pytest.mark.slow
def test_resnet50s_layers_train_one_step_at_reduced_resolution():
  """ResNet-50's code with one bottleneck block per stage: its stem, every stage's projection block and its
  classifier (the full depth repeats the same blocks, and its shapes and 25,557,032 parameters are checked in
  test_models_zoo.py without compiling; compiling all 16 blocks took 46 s here for nothing more)."""
  # Global average pooling makes 64x64 a legitimate input (a 2x2 final map).
  full = get_model("resnet50", num_classes=1000)
  model = dataclasses.replace(full, module=full.module.clone(blocks_per_stage=(1, 1, 1, 1)))
  variables = model.init(jax.random.key(0), (64, 64, 3))
  rng = np.random.default_rng(0)
  batch = {"image": jnp.asarray(rng.normal(size=(2, 64, 64, 3)), jnp.float32), "label": jnp.array([3, 999], jnp.int32)}
  loss, logits, grads, new_params = _one_sgd_step(model, variables["params"], batch)
  assert logits.shape == (2, 1000) and np.isfinite(float(loss))
  assert all(np.all(np.isfinite(g)) for g in jax.tree.leaves(grads))
  assert float(jnp.abs(grads["conv_init"]["kernel"]).max()) > 0.0
  assert not np.allclose(new_params["classifier"]["kernel"], variables["params"]["classifier"]["kernel"])


@pytest.mark.slow
def test_alexnet_trains_one_step_at_full_size():
  model = get_model("alexnet", num_classes=1000)
  params = model.init(jax.random.key(0))["params"]
  rng = np.random.default_rng(1)
  batch = {
    "image": jnp.asarray(rng.normal(scale=50.0, size=(2, 227, 227, 3)), jnp.float32),
    "label": jnp.array([0, 500], jnp.int32),
  }
  loss, logits, grads, _ = _one_sgd_step(model, params, batch)
  assert logits.shape == (2, 1000) and np.isfinite(float(loss))
  assert float(loss) > 0.0
  for name in ("conv1", "conv5", "fc6", "fc8"):
    assert float(jnp.abs(grads[name]["kernel"]).max()) > 0.0, name
