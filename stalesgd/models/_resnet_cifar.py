"""He et al.'s CIFAR ResNets (ResNet-20/32/44/56/110): DC-ASGD's CIFAR-10 model.

He, Zhang, Ren, Sun, "Deep Residual Learning for Image Recognition",
arXiv 1512.03385, §4.2: a 3x3 conv with 16 filters, then 3 stages of n basic
blocks (two 3x3 convs, BN after each conv, ReLU after the first and after the
addition) with 16, 32 and 64 filters, stride 2 at the first block of stages 2
and 3, global average pooling and a dense classifier: depth = 6n + 2. Zheng et
al. (DC-ASGD, arXiv 1609.08326, Table 1) train ResNet-20 (n = 3).

Shortcuts: option "A" (He et al.'s choice for CIFAR, and the default) is
parameter-free: the identity, subsampled by 2 and zero-padded with the new
channels when a stage widens; ResNet-20 has 0.27M parameters (269,722 with 10
classes). Option "B" uses a 1x1 conv + BN projection where the shape changes.
Convolutions have no bias (BN follows); weights use He et al.'s normal
initialisation (arXiv 1502.01852). Batch norm uses batch statistics in training
and precise-BN population statistics in evaluation (`stalesgd.models._batch_norm`).
"""

from __future__ import annotations

import functools

import flax.linen as nn
import jax
import jax.numpy as jnp

from stalesgd.models._batch_norm import BatchNorm
from stalesgd.models._spec import ModelSpec

STAGE_WIDTHS = (16, 32, 64)
SHORTCUT_OPTIONS = ("A", "B")
he_normal = nn.initializers.variance_scaling(2.0, "fan_out", "normal")


class BasicBlock(nn.Module):
  """relu(x' + BN(conv(relu(BN(conv(x)))))), x' the shortcut.

  Attributes:
    features: output channels.
    stride: stride of the first conv (and of the shortcut).
    shortcut: "A" (zero-padded identity) or "B" (1x1 projection).
  """

  features: int
  stride: int
  shortcut: str

  @nn.compact
  def __call__(self, x: jax.Array, *, train: bool) -> jax.Array:
    conv = functools.partial(nn.Conv, use_bias=False, kernel_init=he_normal)
    y = conv(self.features, (3, 3), strides=self.stride, padding=1, name="conv1")(x)
    y = nn.relu(BatchNorm(name="bn1")(y, train=train))
    y = conv(self.features, (3, 3), padding=1, name="conv2")(y)
    y = BatchNorm(name="bn2")(y, train=train)
    if self.stride != 1 or x.shape[-1] != self.features:
      if self.shortcut == "A":
        x = x[:, :: self.stride, :: self.stride, :]
        x = jnp.pad(x, ((0, 0), (0, 0), (0, 0), (0, self.features - x.shape[-1])))
      else:
        x = conv(self.features, (1, 1), strides=self.stride, name="projection")(x)
        x = BatchNorm(name="projection_bn")(x, train=train)
    return nn.relu(x + y)


class CifarResNet(nn.Module):
  """ResNet-(6n+2) for 32x32 images.

  Attributes:
    blocks_per_stage: n.
    num_classes: outputs.
    shortcut: "A" or "B".
  """

  blocks_per_stage: int
  num_classes: int = 10
  shortcut: str = "A"

  @nn.compact
  def __call__(self, images: jax.Array, *, train: bool) -> jax.Array:
    x = nn.Conv(STAGE_WIDTHS[0], (3, 3), padding=1, use_bias=False, kernel_init=he_normal, name="conv_init")(images)
    x = nn.relu(BatchNorm(name="bn_init")(x, train=train))
    for stage, features in enumerate(STAGE_WIDTHS):
      for block in range(self.blocks_per_stage):
        stride = 2 if stage > 0 and block == 0 else 1
        x = BasicBlock(features, stride, self.shortcut, name=f"stage{stage + 1}_block{block + 1}")(x, train=train)
    x = jnp.mean(x, axis=(1, 2))
    return nn.Dense(self.num_classes, name="classifier")(x)


def resnet_cifar(*, num_classes: int = 10, depth: int = 20, shortcut: str = "A") -> ModelSpec:
  """He et al.'s CIFAR ResNet of the given depth.

  Args:
    num_classes: number of classes.
    depth: 6n + 2 layers, e.g. 20, 32, 44, 56 or 110.
    shortcut: "A" (parameter-free, He et al.'s CIFAR choice) or "B" (projection).

  Returns:
    The `ModelSpec` (multipliers all 1).
  """
  if not isinstance(depth, int) or depth < 8 or (depth - 2) % 6:
    raise ValueError(f"depth must be 6n + 2 with n >= 1 (e.g. 20, 32, 44, 56, 110); got {depth!r}")
  if shortcut not in SHORTCUT_OPTIONS:
    raise ValueError(f"shortcut must be one of {SHORTCUT_OPTIONS}; got {shortcut!r}")
  module = CifarResNet(blocks_per_stage=(depth - 2) // 6, num_classes=num_classes, shortcut=shortcut)
  return ModelSpec(name=f"resnet{depth}", module=module, num_classes=num_classes, default_image_shape=(32, 32, 3))
