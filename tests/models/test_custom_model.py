"""A user's model by import path (`stalesgd.models.get_model("package.module:factory")`): the contract and its errors.

The factories below are the "user's code": the tests name them by import path, as a config would.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from stalesgd import models

HERE = __name__  # this module's import name under pytest
IMAGE_SHAPE = (8, 8, 1)


class TinyNet(nn.Module):
  width: int
  num_classes: int
  batch_norm: str = "none"  # none | stalesgd | flax

  @nn.compact
  def __call__(self, images, *, train: bool):
    x = nn.Dense(self.width)(images.reshape(images.shape[0], -1))
    if self.batch_norm == "stalesgd":
      x = models.BatchNorm()(x, train=train)
    elif self.batch_norm == "flax":
      x = nn.BatchNorm(use_running_average=not train)(x)
    return nn.Dense(self.num_classes)(nn.relu(x))


def tiny_net(num_classes: int, width: int = 4, batch_norm: str = "none") -> nn.Module:
  return TinyNet(width=width, num_classes=num_classes, batch_norm=batch_norm)


def fixed_ten_classes(width: int = 4) -> nn.Module:  # takes no num_classes: always 10 outputs
  return TinyNet(width=width, num_classes=10)


def a_spec(num_classes: int) -> models.ModelSpec:
  return models.ModelSpec("mine", TinyNet(3, num_classes), num_classes, IMAGE_SHAPE, learning_rate_rule=lambda _: 2.0)


def ten_class_spec() -> models.ModelSpec:
  return a_spec(10)


def not_a_model():
  return 42


NOT_CALLABLE = 3


@pytest.mark.slow
def test_a_factory_returning_a_module_gives_a_spec_with_the_datas_classes():
  spec = models.get_model(f"{HERE}:tiny_net", num_classes=7, data_shape=IMAGE_SHAPE, width=5)
  assert (spec.name, spec.num_classes, spec.default_image_shape) == (f"{HERE}:tiny_net", 7, IMAGE_SHAPE)
  params = spec.init(jax.random.key(0), IMAGE_SHAPE)["params"]
  assert params["Dense_0"]["kernel"].shape == (64, 5)
  batch = {"image": jnp.ones((3, *IMAGE_SHAPE)), "label": jnp.array([0, 1, 6])}
  loss, logits = spec.loss_fn(params, batch)
  assert logits.shape == (3, 7) and np.isfinite(float(loss))
  assert not spec.has_batch_norm


def test_a_factory_returning_a_model_spec_is_used_as_it_is():
  spec = models.get_model(f"{HERE}:a_spec", num_classes=10, data_shape=IMAGE_SHAPE)
  assert spec.name == "mine"
  assert spec.learning_rate_multipliers({"a": jnp.zeros(2)}) == {"a": 2.0}


@pytest.mark.slow
def test_stalesgd_batch_norm_gets_precise_bn_like_the_built_in_models():
  spec = models.get_model(f"{HERE}:tiny_net", num_classes=3, data_shape=IMAGE_SHAPE, batch_norm="stalesgd")
  assert spec.has_batch_norm
  params = spec.init(jax.random.key(1), IMAGE_SHAPE)["params"]
  images = jax.random.normal(jax.random.key(2), (4, *IMAGE_SHAPE))
  stats = spec.batch_stats_for_eval(params, [{"image": images}])
  hidden = images.reshape(4, -1) @ params["Dense_0"]["kernel"] + params["Dense_0"]["bias"]
  np.testing.assert_allclose(stats["BatchNorm_0"]["mean"], hidden.mean(axis=0), rtol=1e-5, atol=1e-6)
  np.testing.assert_allclose(stats["BatchNorm_0"]["var"], hidden.var(axis=0, ddof=1), rtol=1e-4, atol=1e-6)
  assert spec.predict({"params": params, "batch_stats": stats}, images).shape == (4, 3)


@pytest.mark.parametrize(
  ("name", "options", "message"),
  [
    ("no_such_package.nets:make", {}, r"config.model='no_such_package.nets:make': cannot import module "),
    (f"{HERE}:missing", {}, rf"'{HERE}' has no attribute 'missing'"),
    (f"{HERE}:NOT_CALLABLE", {}, r"is a int, not callable"),
    (
      f"{HERE}:tiny_net",
      {"depth": 3},
      r"config.model_options.depth: config.model='.*:tiny_net' does not take option\(s\) \['depth'\]; its options are "
      r"\['batch_norm', ",
    ),
    (f"{HERE}:not_a_model", {}, r"returned a int; allowed: a flax.linen.Module or a stalesgd.models.ModelSpec"),
    (
      f"{HERE}:fixed_ten_classes",
      {},
      r"returns outputs of shape \(2, 10\) .*allowed: logits \[B, num_classes\] = \(2, 3\)",
    ),
    (f"{HERE}:ten_class_spec", {}, r"built a model of 10 classes; the data has 3"),
    (
      f"{HERE}:tiny_net",
      {"batch_norm": "flax"},
      r"training forward .* failed .*flax.linen.BatchNorm's running averages\): use stalesgd.models.BatchNorm",
    ),
    (":tiny_net", {}, r"allowed: a registered name or an import path 'package.module:attribute'"),
  ],
)
def test_a_bad_user_model_is_refused_naming_the_path_and_the_problem(name, options, message):
  with pytest.raises(ValueError, match=message):
    models.get_model(name, num_classes=3, data_shape=IMAGE_SHAPE, **options)


def test_an_unknown_registered_name_mentions_import_paths():
  with pytest.raises(ValueError, match=r"available models: .*mlp.*or an import path 'package.module:factory'"):
    models.get_model("nonet", num_classes=10)
