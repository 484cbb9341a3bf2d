"""Every registered model: sizes, initialisation, gradients, training, multipliers."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from stalesgd.models import available_models, get_model

SMALL_MODELS = {
  # name: (options, image shape, input scale)
  "cifar10_full": ({}, (32, 32, 3), 60.0),  # mean-subtracted raw pixels
  "resnet20": ({}, (32, 32, 3), 1.0),
  "mlp": ({"hidden_sizes": (32,)}, (8, 8, 1), 1.0),
  "small_cnn": ({"conv_features": (8, 16), "dense_features": 16}, (8, 8, 1), 1.0),
}


def _batch(image_shape, batch_size, scale, seed=0, num_classes=10):
  rng = np.random.default_rng(seed)
  return {
    "image": jnp.asarray(rng.normal(scale=scale, size=(batch_size, *image_shape)), jnp.float32),
    "label": jnp.asarray(rng.integers(0, num_classes, batch_size), jnp.int32),
  }


def test_cifar10_full_has_exactly_the_papers_parameters():
  model = get_model("cifar10_full", num_classes=10)
  shapes = model.parameter_shapes()
  assert model.num_parameters() == 89_578
  assert {name: shapes[name]["kernel"].shape for name in shapes} == {
    "conv1": (5, 5, 3, 32),
    "conv2": (5, 5, 32, 32),
    "conv3": (5, 5, 32, 64),
    "ip1": (1024, 10),
  }  # 1024 = 4 x 4 x 64: Caffe's rounded-up pooling


@pytest.mark.slow
@pytest.mark.parametrize(
  "name, options, expected",
  [
    ("resnet20", {}, 269_722),
    ("resnet_cifar", {"depth": 110}, 1_727_962),
    ("resnet50", {}, 25_557_032),
    ("alexnet", {}, 60_965_224),
    ("alexnet", {"groups": 1}, 62_378_344),
  ],
)
def test_parameter_counts_at_full_size(name, options, expected):
  num_classes = 1000 if name in ("resnet50", "alexnet") else 10
  assert get_model(name, num_classes=num_classes, **options).num_parameters() == expected


def test_resnet_shortcut_option_b_adds_projections():
  option_a = get_model("resnet20", num_classes=10)
  option_b = get_model("resnet20", num_classes=10, shortcut="B")
  # Two projections (16->32, 32->64): 1x1 convs plus their BN scale and bias.
  assert option_b.num_parameters() - option_a.num_parameters() == 16 * 32 + 32 * 64 + 2 * (32 + 64)


@pytest.mark.slow
def test_cifar10_full_initialisation_follows_caffe():
  params = get_model("cifar10_full", num_classes=10).init(jax.random.key(0))["params"]
  assert float(jnp.std(params["conv1"]["kernel"])) == pytest.approx(1e-4, rel=0.1)
  for name in ("conv2", "conv3", "ip1"):
    assert float(jnp.std(params[name]["kernel"])) == pytest.approx(0.01, rel=0.1)
  for name in params:
    np.testing.assert_array_equal(params[name]["bias"], 0.0)


@pytest.mark.slow
@pytest.mark.parametrize(
  "name, learning_rate, steps",
  [("cifar10_full", 0.01, 14), ("resnet20", 0.05, 10), ("mlp", 0.1, 10), ("small_cnn", 0.1, 10)],
)
def test_gradients_reach_every_layer_and_sgd_decreases_the_loss(name, learning_rate, steps):
  # cifar10_full starts slowly (conv1 std 1e-4: tiny activations), hence its
  # larger plain-SGD step than the paper's 0.001 with momentum 0.9.
  options, image_shape, scale = SMALL_MODELS[name]
  model = get_model(name, num_classes=10, **options)
  params = model.init(jax.random.key(2), image_shape)["params"]
  batch = _batch(image_shape, 8, scale, seed=3)
  lr_multipliers = model.learning_rate_multipliers(params)

  @jax.jit
  def step(params):
    (loss, logits), grads = jax.value_and_grad(model.loss_fn, has_aux=True)(params, batch)
    new_params = jax.tree.map(lambda p, g, m: p - learning_rate * m * g, params, grads, lr_multipliers)
    return new_params, loss, logits, grads

  losses = []
  for index in range(steps):
    params, loss, logits, grads = step(params)
    losses.append(float(loss))
    if index == 0:
      assert logits.shape == (8, 10)
      for path, grad in jax.tree_util.tree_flatten_with_path(grads)[0]:
        assert np.all(np.isfinite(grad)), path
        assert float(jnp.max(jnp.abs(grad))) > 0.0, f"no gradient reaches {jax.tree_util.keystr(path)}"
  assert all(np.isfinite(losses))
  assert losses[-1] < 0.9 * losses[0], losses


@pytest.mark.slow
def test_cifar10_full_multipliers_default_to_rudras_release_file():
  """Rudra-org/rudra examples/cifar10.cnn: alphaW 0.001, alphaB 0.002 in every layer (conv3 too); lambdaW 0.004 on
  the convs and 1.0 on fc1, no lambdaB: decay_mult 1 / 250 on the weights (of weight_decay 0.004), 0 on biases."""
  model = get_model("cifar10_full", num_classes=10)
  params = model.init(jax.random.key(0))["params"]
  lr = model.learning_rate_multipliers(params)
  decay = model.weight_decay_multipliers(params)
  assert jax.tree.structure(lr) == jax.tree.structure(params) == jax.tree.structure(decay)
  for name in ("conv1", "conv2", "conv3", "ip1"):
    assert (lr[name]["kernel"], lr[name]["bias"]) == (0.002 / 0.001 / 2, 0.002 / 0.001)
    assert decay[name]["bias"] == 0.0
  for name in ("conv1", "conv2", "conv3"):
    assert decay[name]["kernel"] * 0.004 == 0.004
  assert decay["ip1"]["kernel"] * 0.004 == 1.0


@pytest.mark.slow
def test_cifar10_full_caffe_multipliers_follow_the_prototxt():
  """cifar10_full_train_test.prototxt: lr_mult 1 / 2 but conv3 (no param block: 1 / 1); decay_mult 250 / 0 on ip1
  and Caffe's default 1 on every conv blob, biases included."""
  model = get_model("cifar10_full", num_classes=10).with_multiplier_set("caffe")
  params = model.init(jax.random.key(0))["params"]
  lr = model.learning_rate_multipliers(params)
  decay = model.weight_decay_multipliers(params)
  for name in ("conv1", "conv2", "ip1"):
    assert (lr[name]["kernel"], lr[name]["bias"]) == (1.0, 2.0)
  assert (lr["conv3"]["kernel"], lr["conv3"]["bias"]) == (1.0, 1.0)
  for name in ("conv1", "conv2", "conv3"):
    assert (decay[name]["kernel"], decay[name]["bias"]) == (1.0, 1.0)
  assert (decay["ip1"]["kernel"], decay["ip1"]["bias"]) == (250.0, 0.0)


def test_alexnet_keeps_bvlc_alexnets_caffe_multipliers():
  """bvlc_alexnet train_val.prototxt: lr_mult 1 / 2 and decay_mult 1 / 0 (weights / biases) in all eight layers."""
  model = get_model("alexnet", num_classes=10)
  assert (
    get_model("alexnet", num_classes=10).with_multiplier_set("caffe").learning_rate_rule is model.learning_rate_rule
  )
  shapes = model.parameter_shapes((227, 227, 3))
  lr = model.learning_rate_multipliers(shapes)
  decay = model.weight_decay_multipliers(shapes)
  layers = ("conv1", "conv2", "conv3", "conv4", "conv5", "fc6", "fc7", "fc8")
  assert sorted(lr) == sorted(layers)
  for name in layers:
    assert (lr[name]["kernel"], lr[name]["bias"]) == (1.0, 2.0), name
    assert (decay[name]["kernel"], decay[name]["bias"]) == (1.0, 0.0), name


def test_an_unknown_multiplier_set_names_the_allowed_ones():
  with pytest.raises(ValueError, match="has no multiplier set 'rudra'; allowed: 'caffe'"):
    get_model("alexnet", num_classes=10).with_multiplier_set("rudra")
  with pytest.raises(ValueError, match="allowed: none"):
    get_model("resnet20", num_classes=10).with_multiplier_set("caffe")


@pytest.mark.parametrize("name", ["resnet20", "mlp", "alexnet"])
def test_multipliers_default_or_caffe_for_other_models(name):
  model = get_model(name, num_classes=10)
  shapes = model.parameter_shapes(None if name != "alexnet" else (227, 227, 3))
  lr = jax.tree.leaves(model.learning_rate_multipliers(shapes))
  decay = jax.tree.leaves(model.weight_decay_multipliers(shapes))
  assert len(lr) == len(decay) == len(jax.tree.leaves(shapes))
  if name == "alexnet":
    assert set(lr) == {1.0, 2.0} and set(decay) == {0.0, 1.0}
  else:
    assert set(lr) == set(decay) == {1.0}


@pytest.mark.slow
def test_models_without_batch_norm_have_trivial_eval_state():
  model = get_model("cifar10_full", num_classes=10)
  variables = model.init(jax.random.key(0))
  assert set(variables) == {"params"} and not model.has_batch_norm
  batch = _batch((32, 32, 3), 3, 60.0)
  assert model.batch_stats_for_eval(variables["params"], [batch]) == {}
  np.testing.assert_allclose(
    model.predict(variables, batch["image"]), model.loss_fn(variables["params"], batch)[1], rtol=1e-6
  )


def test_registry_lists_every_required_model():
  assert {"cifar10_full", "resnet20", "resnet_cifar", "resnet50", "alexnet", "mlp", "small_cnn"} <= set(
    available_models()
  )


@pytest.mark.parametrize(
  "name, options, match",
  [
    ("vgg16", {}, "model name 'vgg16' is unknown"),
    ("resnet20", {"depth": 32}, r"does not take option\(s\) \['depth'\]"),
    ("resnet_cifar", {"depth": 21}, "depth must be 6n \\+ 2"),
    ("resnet_cifar", {"shortcut": "C"}, "shortcut must be one of"),
    ("resnet_imagenet", {"depth": 34}, "depth must be one of"),
    ("alexnet", {"groups": 3}, "groups must be 1 or 2"),
    ("mlp", {"hidden_sizes": (0,)}, "hidden_sizes"),
    ("small_cnn", {"conv_features": ()}, "conv_features"),
  ],
)
def test_registry_rejects_bad_arguments(name, options, match):
  with pytest.raises(ValueError, match=match):
    get_model(name, num_classes=10, **options)


@pytest.mark.parametrize("num_classes", [1, 0, 2.5, True])
def test_registry_rejects_bad_num_classes(num_classes):
  with pytest.raises(ValueError, match="num_classes"):
    get_model("mlp", num_classes=num_classes)


@pytest.mark.parametrize("shape", [(8, 8), (8, 8, 1, 1), (0, 8, 1), (-1, 8, 1), (8, 8, 1.0)])
def test_init_rejects_bad_image_shape(shape):
  """(height, width, channels) of positive ints: two or four sides, a side of 0 or -1 or a float side are refused."""
  with pytest.raises(ValueError, match=r"image_shape must be \(height, width, channels\) of positive ints"):
    get_model("mlp", num_classes=10).init(jax.random.key(0), shape)


def test_a_model_specification_is_frozen():
  import dataclasses

  model = get_model("mlp", num_classes=10)
  with pytest.raises(dataclasses.FrozenInstanceError):
    model.name = "other"


def test_a_model_specification_is_equal_only_to_itself_and_hashable():
  """Specs compare by identity (eq=False): two specs with the same fields are different models to a cache keyed on
  them, and a spec holding dicts (its multiplier sets) still hashes."""
  import dataclasses

  model = get_model("cifar10_full", num_classes=10)
  assert model.multiplier_sets  # a dict field: a field-wise hash would raise
  copy = dataclasses.replace(model)
  assert copy != model and model == model
  assert len({model, copy}) == 2


def test_the_caffe_networks_defaults_are_their_prototxts():
  """cifar10_full: 10 outputs on 32x32x3; bvlc_alexnet: 1000 outputs on 227x227x3 crops, two towers, no dropout
  unless asked (the module's own defaults too, for a user who builds the flax module directly)."""
  from stalesgd.models._alexnet import AlexNet, alexnet
  from stalesgd.models._cifar10_full import Cifar10Full, cifar10_full

  assert Cifar10Full().num_classes == cifar10_full().num_classes == 10
  assert alexnet().num_classes == 1000
  assert (AlexNet().num_classes, AlexNet().groups, AlexNet().dropout_rate) == (1000, 2, 0.0)
  assert get_model("cifar10_full", num_classes=10).default_image_shape == (32, 32, 3)
  assert get_model("alexnet", num_classes=10).default_image_shape == (227, 227, 3)


@pytest.mark.parametrize("name, image_shape", [("cifar10_full", (32, 32, 3)), ("alexnet", (99, 99, 3))])
def test_train_is_keyword_only_in_the_caffe_networks(name, image_shape):
  """``train`` is passed by name, as everywhere in stalesgd: a positional flag after the images is refused."""
  model = get_model(name, num_classes=10)
  images = np.zeros((1, *image_shape), np.float32)
  variables = {
    "params": jax.tree.map(lambda leaf: np.zeros(leaf.shape, leaf.dtype), model.parameter_shapes(image_shape))
  }
  assert model.module.apply(variables, images, train=False).shape == (1, 10)
  with pytest.raises(TypeError, match="positional argument"):
    model.module.apply(variables, images, False)


def test_the_caffe_multiplier_rules_read_the_leaf_and_top_layer_names_at_any_depth():
  """Caffe's multipliers by blob: the leaf name decides weight or bias whatever the nesting (a user's model may nest
  layers), and any leaf other than ``bias`` is a weight; the names are compared by value, not identity."""
  from stalesgd.models import _alexnet, _cifar10_full

  bias = "".join(["b", "i", "a", "s"])  # built at run time: not the interned literal
  for leaf, lr_mult, rudra_decay, alexnet_decay in [
    (bias, 2.0, 0.0, 0.0),
    ("kernel", 1.0, 1.0, 1.0),
    ("alpha", 1.0, 1.0, 1.0),  # sorts before "bias"
    ("scale", 1.0, 1.0, 1.0),  # sorts after it
  ]:
    path = ("tower", "conv", leaf)
    assert _cifar10_full.caffe_learning_rate_multiplier(path) == lr_mult, leaf
    assert _cifar10_full.rudra_weight_decay_multiplier(path) == rudra_decay, leaf
    assert _alexnet.alexnet_weight_decay_multiplier(path) == alexnet_decay, leaf
    # Caffe's prototxt: a layer that is neither ip1 nor conv3 keeps the usual 1 / 2 and a decay of 1 on both blobs.
    assert _cifar10_full.caffe_prototxt_learning_rate_multiplier(path) == lr_mult, leaf
    assert _cifar10_full.caffe_prototxt_weight_decay_multiplier(path) == 1.0, leaf
  classifier = "".join(["i", "p", "1"])
  assert _cifar10_full.rudra_weight_decay_multiplier((classifier, "kernel")) == 250.0
  assert _cifar10_full.caffe_prototxt_weight_decay_multiplier((classifier, "kernel")) == 250.0
  assert _cifar10_full.caffe_prototxt_weight_decay_multiplier((classifier, bias)) == 0.0
  assert _cifar10_full.caffe_prototxt_weight_decay_multiplier((classifier, "alpha")) == 250.0  # a weight
  assert _cifar10_full.caffe_prototxt_weight_decay_multiplier((classifier, "dense", bias)) == 0.0
  assert _cifar10_full.caffe_prototxt_learning_rate_multiplier(("".join(["conv", "3"]), bias)) == 1.0
