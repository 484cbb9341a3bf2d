"""The Caffe networks' forward passes against float64 NumPy compositions of Caffe's layers, and AlexNet's fillers.

The references are written from the networks' prototxt (layer order, kernel sizes, strides, pads, groups, LRN
constants) with the layers of `tests.helpers.caffe_reference`; the parameters are random, at a scale where every
LRN changes its input by a large factor, so a wrong constant, order, pad or stride shows at the tolerance.
Flattening before the first dense layer is NHWC, as in the models (Caffe flattens CHW: a fixed permutation of the
dense layer's input rows, the same network under other initial weights).
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from stalesgd.models import get_model
from tests.helpers import caffe_reference as ref


def _random_params(shapes, seed: int, gain: float = 1.5):
  """Weights ~ N(0, (gain / sqrt(fan_in))^2), biases ~ N(0, 1): activations of order the input's scale."""
  rng = np.random.default_rng(seed)
  params = {}
  for layer, blobs in shapes.items():
    kernel = blobs["kernel"].shape
    fan_in = int(np.prod(kernel[:-1]))
    params[layer] = {
      "kernel": rng.normal(scale=gain / np.sqrt(fan_in), size=kernel).astype(np.float32),
      "bias": rng.normal(size=blobs["bias"].shape).astype(np.float32),
    }
  return params


def _assert_close(got, want):
  got = np.asarray(got, np.float64)
  assert got.shape == want.shape
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4 * np.max(np.abs(want)))


def _cifar10_full_reference(p, x):
  """cifar10_full_train_test.prototxt: conv1 -> pool1 (max) -> relu1 -> norm1 -> conv2 -> relu2 -> pool2 (ave)
  -> norm2 -> conv3 -> relu3 -> pool3 (ave) -> ip1; convs 5x5 pad 2, pools 3x3 stride 2, LRN WITHIN_CHANNEL
  local_size 3, alpha 5e-5, beta 0.75."""
  x = ref.conv(x, **p["conv1"], pad=2)
  x = ref.lrn_within(ref.relu(ref.pool(x, 3, 2, 0, "max")), 3, 5e-5, 0.75)
  x = ref.lrn_within(ref.pool(ref.relu(ref.conv(x, **p["conv2"], pad=2)), 3, 2, 0, "avg"), 3, 5e-5, 0.75)
  x = ref.pool(ref.relu(ref.conv(x, **p["conv3"], pad=2)), 3, 2, 0, "avg")
  return ref.dense(x, **p["ip1"])


def _alexnet_features(p, x, groups):
  """bvlc_alexnet train_val.prototxt up to pool5: conv1 11x11 s4 -> relu -> norm (ACROSS_CHANNELS, 5, 1e-4, 0.75)
  -> pool 3 s2 -> conv2 5x5 pad 2 group 2 -> relu -> norm -> pool -> conv3 3x3 pad 1 -> relu -> conv4 3x3 pad 1
  group 2 -> relu -> conv5 3x3 pad 1 group 2 -> relu -> pool."""
  x = ref.pool(ref.lrn_across(ref.relu(ref.conv(x, **p["conv1"], stride=4)), 5, 1e-4, 0.75, 1.0), 3, 2, 0, "max")
  x = ref.relu(ref.conv(x, **p["conv2"], pad=2, groups=groups))
  x = ref.pool(ref.lrn_across(x, 5, 1e-4, 0.75, 1.0), 3, 2, 0, "max")
  x = ref.relu(ref.conv(x, **p["conv3"], pad=1))
  x = ref.relu(ref.conv(x, **p["conv4"], pad=1, groups=groups))
  return ref.pool(ref.relu(ref.conv(x, **p["conv5"], pad=1, groups=groups)), 3, 2, 0, "max")


def _alexnet_reference(p, x, groups):
  """The whole network without dropout: the features, then fc6 -> relu -> fc7 -> relu -> fc8."""
  x = _alexnet_features(p, x, groups)
  for layer in ("fc6", "fc7"):
    x = ref.relu(ref.dense(x, **p[layer]))
  return ref.dense(x, **p["fc8"])


def test_cifar10_full_forward_matches_the_prototxt():
  model = get_model("cifar10_full", num_classes=10)
  params = _random_params(model.parameter_shapes(), seed=0)
  images = np.random.default_rng(1).normal(scale=60.0, size=(2, 32, 32, 3)).astype(np.float32)
  for train in (False, True):  # no dropout, no batch norm: one function
    _assert_close(model.module.apply({"params": params}, images, train=train), _cifar10_full_reference(params, images))


# 99 x 99 crops keep every stage of the 227 x 227 network with fewer pixels: conv1 23, pools 11, 5 and 2.
SMALL_ALEXNET_IMAGE = (99, 99, 3)


@pytest.mark.parametrize("groups", [2, 1])
def test_alexnet_forward_matches_the_prototxt(groups):
  model = get_model("alexnet", num_classes=10, groups=groups)
  params = _random_params(model.parameter_shapes(SMALL_ALEXNET_IMAGE), seed=groups)
  images = np.random.default_rng(3).normal(scale=60.0, size=(2, *SMALL_ALEXNET_IMAGE)).astype(np.float32)
  want = _alexnet_reference(params, images, groups)
  for train in (False, True):  # dropout off by default: training and evaluation agree
    _assert_close(model.module.apply({"params": params}, images, train=train), want)


def test_alexnet_dropout_follows_relu6_and_relu7_in_training_only():
  """bvlc_alexnet's drop6 and drop7 (ratio 0.5) act on relu6 and relu7 in training, scaling the kept units by
  1 / (1 - 0.5) (Caffe's and flax's inverted dropout); evaluation is the network without them. The masks are read
  from the two dropout layers' outputs; everything else is the NumPy reference."""
  rate = 0.5
  model = get_model("alexnet", num_classes=10, dropout_rate=rate)
  params = _random_params(model.parameter_shapes(SMALL_ALEXNET_IMAGE), seed=4)
  images = np.random.default_rng(5).normal(scale=60.0, size=(2, *SMALL_ALEXNET_IMAGE)).astype(np.float32)
  _assert_close(model.module.apply({"params": params}, images, train=False), _alexnet_reference(params, images, 2))

  logits, state = model.module.apply(
    {"params": params},
    images,
    train=True,
    rngs={"dropout": jax.random.key(6)},
    capture_intermediates=True,
    mutable=["intermediates"],
  )
  dropped = [np.asarray(state["intermediates"][f"Dropout_{index}"]["__call__"][0], np.float64) for index in (0, 1)]
  # The features up to pool5 (no dropout there), then fc6 and fc7 each followed by the mask its layer drew.
  x, shares = _alexnet_features(params, images, 2), []
  for layer, out in zip(("fc6", "fc7"), dropped):
    h = ref.relu(ref.dense(x, **params[layer]))
    kept = out != 0
    _assert_close(out[kept], h[kept] / (1 - rate))
    shares.append(np.mean(kept[h > 0]))  # the share of active units kept
    x = np.where(kept, h / (1 - rate), 0.0)
  _assert_close(logits, ref.dense(x, **params["fc8"]))
  assert all(0.4 < share < 0.6 for share in shares), shares


def test_alexnet_initialisation_follows_bvlc_alexnet():
  """bvlc_alexnet's fillers: gaussian std 0.01 (fc6, fc7: 0.005); constant bias 0.1 on conv2, conv4, conv5, fc6
  and fc7, 0 on conv1, conv3 and fc8."""
  params = get_model("alexnet", num_classes=10).init(jax.random.key(0), SMALL_ALEXNET_IMAGE)["params"]
  positive_bias = {"conv2", "conv4", "conv5", "fc6", "fc7"}
  assert set(params) == {"conv1", "conv2", "conv3", "conv4", "conv5", "fc6", "fc7", "fc8"}
  for name, blobs in params.items():
    std = 0.005 if name in ("fc6", "fc7") else 0.01
    assert float(np.std(blobs["kernel"])) == pytest.approx(std, rel=0.1), name
    assert float(np.mean(blobs["kernel"])) == pytest.approx(0.0, abs=0.1 * std), name
    np.testing.assert_array_equal(blobs["bias"], np.float32(0.1) if name in positive_bias else 0.0, err_msg=name)
