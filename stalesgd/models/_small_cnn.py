"""A small convolutional network for MNIST-sized and 8x8 images.

Two blocks of [3x3 conv (SAME) -> ReLU -> 2x2 max-pool (SAME, so odd sizes
round up)], then a dense ReLU layer and a dense classifier: 8x8 -> 4x4 -> 2x2,
28x28 -> 14x14 -> 7x7. Flax's default initialisation; no batch norm.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax

from stalesgd.models._spec import ModelSpec


class SmallCNN(nn.Module):
  """conv-pool blocks, then dense layers.

  Attributes:
    conv_features: channels of each conv block.
    dense_features: width of the hidden dense layer.
    num_classes: outputs.
  """

  conv_features: tuple[int, ...] = (32, 64)
  dense_features: int = 128
  num_classes: int = 10

  @nn.compact
  def __call__(self, images: jax.Array, *, train: bool) -> jax.Array:
    del train
    x = images
    for index, features in enumerate(self.conv_features):
      x = nn.relu(nn.Conv(features, (3, 3), padding="SAME", name=f"conv{index + 1}")(x))
      x = nn.max_pool(x, (2, 2), strides=(2, 2), padding="SAME")
    x = x.reshape(x.shape[0], -1)
    x = nn.relu(nn.Dense(self.dense_features, name="hidden")(x))
    return nn.Dense(self.num_classes, name="classifier")(x)


def small_cnn(
  *,
  num_classes: int = 10,
  conv_features: Sequence[int] = (32, 64),
  dense_features: int = 128,
  image_shape: tuple[int, int, int] = (28, 28, 1),
) -> ModelSpec:
  """A two-block CNN for small images.

  Args:
    num_classes: number of classes.
    conv_features: channels of each conv block.
    dense_features: width of the hidden dense layer.
    image_shape: default input shape (any shape works; it sets `init`'s default).

  Returns:
    The `ModelSpec` (multipliers all 1).
  """
  features = tuple(conv_features)
  if not features or not all(isinstance(width, int) and width > 0 for width in features):
    raise ValueError(f"conv_features must be a non-empty sequence of positive ints; got {conv_features!r}")
  if not isinstance(dense_features, int) or dense_features < 1:
    raise ValueError(f"dense_features must be a positive int; got {dense_features!r}")
  module = SmallCNN(conv_features=features, dense_features=dense_features, num_classes=num_classes)
  return ModelSpec(name="small_cnn", module=module, num_classes=num_classes, default_image_shape=tuple(image_shape))
