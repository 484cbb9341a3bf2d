"""Rudra's CIFAR-10 network: Caffe's ``cifar10_full`` (89,578 parameters).

The network of the Rudra code release (Gupta, Zhang, Wang, arXiv 1509.04210;
Zhang et al., arXiv 1511.05950), which is Caffe's ``cifar10_full`` example:

  conv1 5x5x32 pad 2 (no activation) -> max-pool 3x3 s2 -> ReLU -> LRN
  -> conv2 5x5x32 pad 2 -> ReLU -> avg-pool 3x3 s2 -> LRN
  -> conv3 5x5x64 pad 2 -> ReLU -> avg-pool 3x3 s2 -> ip1 dense 1024 -> 10

LRN is Caffe's ``WITHIN_CHANNEL`` region, local_size 3, alpha 5e-5, beta 0.75.
Pooling follows Caffe (`stalesgd.models._caffe_pooling`): sizes round up,
32 -> 16 -> 8 -> 4, and border averages divide by the clipped window. Inputs are
raw 0..255 pixels minus the per-pixel training mean (`stalesgd.data`), which
the learning rate 0.001 of the paper assumes. Initialisation: Gaussian weights,
std 1e-4 for conv1 and 0.01 elsewhere; biases 0.

Multipliers: two sources, selected by ``multipliers`` (``config.multiplier_set``).
A blob's step is lr * lr_mult * (grad + weight_decay * decay_mult * w) (Caffe
applies weight decay before the learning rate; the solver's weight_decay is
0.004 and its rate 0.001), so both are written as Caffe multipliers:

* ``"rudra"`` (default): Rudra's own release, ``Rudra-org/rudra``
  ``examples/cifar10.cnn`` ("Rudra version of the caffe's CIFAR10 model ...
  Achieves 18% error in 140 epochs"). Every layer has ``alphaW = 0.001`` and
  ``alphaB = 0.002`` (lr_mult 1 on every weight, 2 on every bias, conv3
  included); weight decay comes only from ``lambdaW`` (0.004 on conv1-3, 1.0 on
  fc1) and no layer has a bias decay (``lambdaB``): decay_mult 1 on conv
  weights, 250 on ip1's weights (250 x 0.004 = 1.0), 0 on every bias. The
  papers ran IBM's own learner on this file, so it is the closest evidence to
  their settings, and the default.
* ``"caffe"``: Caffe's ``cifar10_full_train_test.prototxt``: lr_mult 1 / 2 on
  the weights / biases of conv1, conv2 and ip1; conv3 has no ``param`` block,
  so both its blobs take Caffe's default lr_mult 1; decay_mult 250 on ip1's
  weights, 0 on its bias, and Caffe's default 1 on every conv blob, biases
  included. Run directories started before the choice existed used these
  (`stalesgd.training.check_same_run` refuses to resume them under Rudra's).
"""

from __future__ import annotations

import flax.linen as nn
import jax

from stalesgd.models._caffe_pooling import caffe_avg_pool, caffe_max_pool
from stalesgd.models._local_response_norm import lrn_within_channel
from stalesgd.models._spec import ModelSpec

LRN_SIZE, LRN_ALPHA, LRN_BETA = 3, 5e-5, 0.75
CLASSIFIER_NAME = "ip1"
DEFAULT_MULTIPLIER_LAYERS = ("conv3",)  # layers without a Caffe ``param`` block: lr_mult 1 on every blob


class Cifar10Full(nn.Module):
  """Caffe's ``cifar10_full``; see the module docstring.

  Attributes:
    num_classes: outputs of ip1.
  """

  num_classes: int = 10

  def _conv(self, features: int, std: float, name: str) -> nn.Conv:
    return nn.Conv(features, (5, 5), padding=((2, 2), (2, 2)), kernel_init=nn.initializers.normal(std), name=name)

  def _lrn(self, x: jax.Array) -> jax.Array:
    return lrn_within_channel(x, local_size=LRN_SIZE, alpha=LRN_ALPHA, beta=LRN_BETA)

  @nn.compact
  def __call__(self, images: jax.Array, *, train: bool) -> jax.Array:
    del train  # The same function in training and evaluation: no BN, no dropout.
    x = self._conv(32, 1e-4, "conv1")(images)
    x = self._lrn(nn.relu(caffe_max_pool(x, 3, 2)))
    x = self._conv(32, 0.01, "conv2")(x)
    x = self._lrn(caffe_avg_pool(nn.relu(x), 3, 2))
    x = self._conv(64, 0.01, "conv3")(x)
    x = caffe_avg_pool(nn.relu(x), 3, 2)
    x = x.reshape(x.shape[0], -1)
    return nn.Dense(self.num_classes, kernel_init=nn.initializers.normal(0.01), name=CLASSIFIER_NAME)(x)


def caffe_learning_rate_multiplier(path: tuple[str, ...]) -> float:
  """Caffe's usual lr_mult (``bvlc_alexnet``; ``cifar10.cnn``'s alphaB = 2 alphaW): 1 for weights, 2 for biases."""
  return 2.0 if path[-1] == "bias" else 1.0


def rudra_weight_decay_multiplier(path: tuple[str, ...]) -> float:
  """Rudra's ``cifar10.cnn`` as decay_mult of weight_decay 0.004: lambdaW 0.004 (conv) and 1.0 (fc1); no lambdaB."""
  if path[-1] == "bias":
    return 0.0
  return 250.0 if path[0] == CLASSIFIER_NAME else 1.0


def caffe_prototxt_learning_rate_multiplier(path: tuple[str, ...]) -> float:
  """Caffe lr_mult of cifar10_full: 1 for weights, 2 for biases, except conv3 (no ``param`` block): 1 for both."""
  if path[0] in DEFAULT_MULTIPLIER_LAYERS:
    return 1.0
  return caffe_learning_rate_multiplier(path)


def caffe_prototxt_weight_decay_multiplier(path: tuple[str, ...]) -> float:
  """Caffe decay_mult of cifar10_full: ip1 weights 250, ip1 bias 0, conv blobs (weights and biases) 1."""
  if path[0] == CLASSIFIER_NAME:
    return 0.0 if path[-1] == "bias" else 250.0
  return 1.0


MULTIPLIER_SETS = {
  "rudra": (caffe_learning_rate_multiplier, rudra_weight_decay_multiplier),
  "caffe": (caffe_prototxt_learning_rate_multiplier, caffe_prototxt_weight_decay_multiplier),
}
DEFAULT_MULTIPLIER_SET = "rudra"


def cifar10_full(*, num_classes: int = 10) -> ModelSpec:
  """Rudra's CIFAR-10 network (89,578 parameters at 32x32x3, 10 classes).

  Args:
    num_classes: number of classes.

  Returns:
    The `ModelSpec`, with Rudra's release multipliers (``multiplier_sets`` also
    holds Caffe's prototxt ones, ``"caffe"``; see the module docstring).
  """
  spec = ModelSpec(
    name="cifar10_full",
    module=Cifar10Full(num_classes=num_classes),
    num_classes=num_classes,
    default_image_shape=(32, 32, 3),
    multiplier_sets=MULTIPLIER_SETS,
  )
  return spec.with_multiplier_set(DEFAULT_MULTIPLIER_SET)
