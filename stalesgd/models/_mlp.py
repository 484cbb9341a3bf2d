"""A multi-layer perceptron for small images (MNIST, the embedded 8x8 digits).

logits = W_L relu(... relu(W_1 flatten(x) + b_1) ...) + b_L, flax's default
initialisation (LeCun normal weights, zero biases). No batch norm, so training
and evaluation compute the same function.
"""

from __future__ import annotations

from collections.abc import Sequence

import flax.linen as nn
import jax

from stalesgd.models._spec import ModelSpec


class MLP(nn.Module):
  """Dense ReLU layers on flattened images, then a dense classifier.

  Attributes:
    hidden_sizes: widths of the hidden layers.
    num_classes: outputs.
  """

  hidden_sizes: tuple[int, ...] = (256, 256)
  num_classes: int = 10

  @nn.compact
  def __call__(self, images: jax.Array, *, train: bool) -> jax.Array:
    del train
    x = images.reshape(images.shape[0], -1)
    for index, width in enumerate(self.hidden_sizes):
      x = nn.relu(nn.Dense(width, name=f"hidden{index + 1}")(x))
    return nn.Dense(self.num_classes, name="classifier")(x)


def mlp(
  *, num_classes: int = 10, hidden_sizes: Sequence[int] = (256, 256), image_shape: tuple[int, int, int] = (28, 28, 1)
) -> ModelSpec:
  """A ReLU MLP.

  Args:
    num_classes: number of classes.
    hidden_sizes: widths of the hidden layers (may be empty: softmax regression).
    image_shape: default input shape (any shape works; it sets `init`'s default).

  Returns:
    The `ModelSpec` (multipliers all 1).
  """
  sizes = tuple(hidden_sizes)
  if not all(isinstance(width, int) and width > 0 for width in sizes):
    raise ValueError(f"hidden_sizes must be positive ints; got {hidden_sizes!r}")
  return ModelSpec(
    name="mlp",
    module=MLP(hidden_sizes=sizes, num_classes=num_classes),
    num_classes=num_classes,
    default_image_shape=tuple(image_shape),
  )
