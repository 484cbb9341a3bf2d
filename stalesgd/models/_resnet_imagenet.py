"""ImageNet ResNets with bottleneck blocks (ResNet-50/101/152): DC-ASGD's ImageNet model.

He, Zhang, Ren, Sun, arXiv 1512.03385, Table 1: a 7x7/2 conv with 64 filters
and BN, a 3x3/2 max-pool, four stages of bottleneck blocks (1x1, 3x3, 1x1
convs with 64/128/256/512 and 4x as many output channels; (3, 4, 6, 3) blocks
for ResNet-50), global average pooling and a 1000-way dense layer. Zheng et al.
(DC-ASGD, arXiv 1609.08326, Table 2) train ResNet-50.

Choices: projection shortcuts (option B) where the shape changes; the stride
of a downsampling block sits on the 3x3 conv ("ResNet v1.5", as in the common
public implementations; the original puts it on the first 1x1); 25,557,032
parameters for ResNet-50 at 1000 classes. Global average pooling makes the
network valid at any resolution that survives the 32x downsampling, which the
tests use to run a step cheaply. Batch norm uses batch statistics in training
and precise-BN population statistics in evaluation (`stalesgd.models._batch_norm`).
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from stalesgd.models._batch_norm import BatchNorm
from stalesgd.models._resnet_cifar import he_normal
from stalesgd.models._spec import ModelSpec

STAGE_WIDTHS = (64, 128, 256, 512)
BLOCKS_PER_DEPTH = {50: (3, 4, 6, 3), 101: (3, 4, 23, 3), 152: (3, 8, 36, 3)}
EXPANSION = 4


class BottleneckBlock(nn.Module):
  """relu(x' + BN(conv1x1(relu(BN(conv3x3(relu(BN(conv1x1(x))))))))).

  Attributes:
    width: channels of the 3x3 conv; the block outputs 4x as many.
    stride: stride of the 3x3 conv and of the projection.
  """

  width: int
  stride: int

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool) -> jax.Array:
    conv = functools.partial(nn.Conv, use_bias=False, kernel_init=he_normal)
    out_features = self.width * EXPANSION
    y = nn.relu(BatchNorm(name="bn1")(conv(self.width, (1, 1), name="conv1")(x), train=train))
    y = conv(self.width, (3, 3), strides=self.stride, padding=1, name="conv2")(y)
    y = nn.relu(BatchNorm(name="bn2")(y, train=train))
    y = BatchNorm(name="bn3")(conv(out_features, (1, 1), name="conv3")(y), train=train)
    if self.stride != 1 or x.shape[-1] != out_features:
      x = conv(out_features, (1, 1), strides=self.stride, name="projection")(x)
      x = BatchNorm(name="projection_bn")(x, train=train)
    return nn.relu(x + y)


class ImageNetResNet(nn.Module):
  """Bottleneck ResNet.

  Attributes:
    blocks_per_stage: blocks in each of the four stages.
    num_classes: outputs.
  """

  blocks_per_stage: tuple[int, ...]
  num_classes: int = 1000

  @nn.compact
  def __call__(self, images: jax.Array, *, train: bool) -> jax.Array:
    x = nn.Conv(STAGE_WIDTHS[0], (7, 7), strides=2, padding=3, use_bias=False, kernel_init=he_normal, name="conv_init")(
      images
    )
    x = nn.relu(BatchNorm(name="bn_init")(x, train=train))
    x = nn.max_pool(x, (3, 3), strides=(2, 2), padding=((1, 1), (1, 1)))
    for stage, (width, blocks) in enumerate(zip(STAGE_WIDTHS, self.blocks_per_stage)):
      for block in range(blocks):
        stride = 2 if stage > 0 and block == 0 else 1
        x = BottleneckBlock(width, stride, name=f"stage{stage + 1}_block{block + 1}")(x, train=train)
    x = jnp.mean(x, axis=(1, 2))
    return nn.Dense(self.num_classes, name="classifier")(x)


def resnet_imagenet(*, num_classes: int = 1000, depth: int = 50) -> ModelSpec:
  """ImageNet bottleneck ResNet (default ResNet-50).

  Args:
    num_classes: number of classes.
    depth: 50, 101 or 152.

  Returns:
    The `ModelSpec` (multipliers all 1), designed for 224x224x3 inputs.
  """
  if depth not in BLOCKS_PER_DEPTH:
    raise ValueError(f"depth must be one of {sorted(BLOCKS_PER_DEPTH)}; got {depth!r}")
  module = ImageNetResNet(blocks_per_stage=BLOCKS_PER_DEPTH[depth], num_classes=num_classes)
  return ModelSpec(name=f"resnet{depth}", module=module, num_classes=num_classes, default_image_shape=(224, 224, 3))
