"""AlexNet as released with Caffe (``bvlc_alexnet``): Zhang et al.'s ImageNet model family.

Zhang, Gupta, Lian, Liu (arXiv 1511.05950) train "an AlexNet-style model, 5
conv + 3 fc layers, about 72M parameters" on ImageNet; its exact layer widths
are not available here, so this module implements the published network it is
styled on: Krizhevsky, Sutskever, Hinton (NIPS 2012) in Caffe's
``bvlc_alexnet`` form, on 227x227x3 crops:

  conv1 11x11x96 s4 -> ReLU -> LRN -> max-pool 3x3 s2
  -> conv2 5x5x256 pad 2 (groups) -> ReLU -> LRN -> max-pool 3x3 s2
  -> conv3 3x3x384 pad 1 -> ReLU -> conv4 3x3x384 pad 1 (groups) -> ReLU
  -> conv5 3x3x256 pad 1 (groups) -> ReLU -> max-pool 3x3 s2
  -> fc6 4096 -> ReLU -> fc7 4096 -> ReLU -> fc8 num_classes

LRN across channels (local_size 5, alpha 1e-4, beta 0.75, k 1); Caffe pooling
(55 -> 27 -> 13 -> 6). ``groups=2`` (default) is the original two-tower
network, 60,965,224 parameters at 1000 classes; ``groups=1`` is the single-tower
variant, 62,378,344 parameters. Both are below the ~72M the paper quotes for its
own variant. Initialisation and multipliers as in ``bvlc_alexnet``: Gaussian
weights (std 0.01; 0.005 for fc6 and fc7), biases 0.1 for conv2, conv4, conv5,
fc6 and fc7 and 0 otherwise, lr_mult 1 / 2 and decay_mult 1 / 0 for weights /
biases.

Dropout (Krizhevsky: p = 0.5 after fc6 and fc7) is off by default
(``dropout_rate=0``): with it on, the training loss needs the batch's
``"dropout_seed"`` so that the emulator, which recomputes gradients at stale
weights, gets the same mask for the same (seed, learner, k); see
`stalesgd.models._spec`. Evaluation never drops.
"""

from __future__ import annotations

import flax.linen as nn
import jax

from stalesgd.models._caffe_pooling import caffe_max_pool
from stalesgd.models._cifar10_full import caffe_learning_rate_multiplier
from stalesgd.models._local_response_norm import lrn_across_channels
from stalesgd.models._spec import ModelSpec

LRN_SIZE, LRN_ALPHA, LRN_BETA = 5, 1e-4, 0.75
POSITIVE_BIAS = 0.1  # bvlc_alexnet's bias_filler value for conv2, conv4, conv5, fc6, fc7.


class AlexNet(nn.Module):
  """Caffe's ``bvlc_alexnet``; see the module docstring.

  Attributes:
    num_classes: outputs of fc8.
    groups: 2 for the two-tower original, 1 for a single tower.
    dropout_rate: dropout after fc6 and fc7 in training (0: none).
  """

  num_classes: int = 1000
  groups: int = 2
  dropout_rate: float = 0.0

  def _conv(
    self,
    features: int,
    kernel: int,
    name: str,
    *,
    stride: int = 1,
    pad: int = 0,
    grouped: bool = False,
    bias: float = 0.0,
  ) -> nn.Conv:
    return nn.Conv(
      features,
      (kernel, kernel),
      strides=stride,
      padding=pad,
      feature_group_count=self.groups if grouped else 1,
      kernel_init=nn.initializers.normal(0.01),
      bias_init=nn.initializers.constant(bias),
      name=name,
    )

  def _lrn(self, x: jax.Array) -> jax.Array:
    return lrn_across_channels(x, local_size=LRN_SIZE, alpha=LRN_ALPHA, beta=LRN_BETA)

  @nn.compact
  def __call__(self, images: jax.Array, *, train: bool) -> jax.Array:
    x = nn.relu(self._conv(96, 11, "conv1", stride=4)(images))
    x = caffe_max_pool(self._lrn(x), 3, 2)
    x = nn.relu(self._conv(256, 5, "conv2", pad=2, grouped=True, bias=POSITIVE_BIAS)(x))
    x = caffe_max_pool(self._lrn(x), 3, 2)
    x = nn.relu(self._conv(384, 3, "conv3", pad=1)(x))
    x = nn.relu(self._conv(384, 3, "conv4", pad=1, grouped=True, bias=POSITIVE_BIAS)(x))
    x = nn.relu(self._conv(256, 3, "conv5", pad=1, grouped=True, bias=POSITIVE_BIAS)(x))
    x = caffe_max_pool(x, 3, 2).reshape(x.shape[0], -1)
    for name in ("fc6", "fc7"):
      x = nn.relu(
        nn.Dense(
          4096, kernel_init=nn.initializers.normal(0.005), bias_init=nn.initializers.constant(POSITIVE_BIAS), name=name
        )(x)
      )
      if self.dropout_rate:
        x = nn.Dropout(self.dropout_rate, deterministic=not train)(x)
    return nn.Dense(self.num_classes, kernel_init=nn.initializers.normal(0.01), name="fc8")(x)


def alexnet_weight_decay_multiplier(path: tuple[str, ...]) -> float:
  """bvlc_alexnet decay_mult: 1 for weights, 0 for biases."""
  return 0.0 if path[-1] == "bias" else 1.0


def alexnet(*, num_classes: int = 1000, groups: int = 2, dropout_rate: float = 0.0) -> ModelSpec:
  """Krizhevsky et al.'s AlexNet in Caffe's form (227x227x3 inputs).

  Args:
    num_classes: number of classes.
    groups: 2 (two towers, as published) or 1 (single tower).
    dropout_rate: dropout after fc6 and fc7 (the paper: 0.5); > 0 makes the
      training loss read ``batch["dropout_seed"]``.

  Returns:
    The `ModelSpec`, with Caffe's per-layer multipliers.
  """
  if groups not in (1, 2):
    raise ValueError(f"groups must be 1 or 2; got {groups!r}")
  if not 0.0 <= dropout_rate < 1.0:
    raise ValueError(f"dropout_rate must lie in [0, 1); got {dropout_rate!r}")
  module = AlexNet(num_classes=num_classes, groups=groups, dropout_rate=dropout_rate)
  return ModelSpec(
    name="alexnet",
    module=module,
    num_classes=num_classes,
    default_image_shape=(227, 227, 3),
    learning_rate_rule=caffe_learning_rate_multiplier,
    weight_decay_rule=alexnet_weight_decay_multiplier,
    multiplier_sets={"caffe": (caffe_learning_rate_multiplier, alexnet_weight_decay_multiplier)},
    uses_dropout=dropout_rate > 0,
  )
