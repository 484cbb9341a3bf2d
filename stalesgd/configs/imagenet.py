"""The ImageNet input pipeline the ImageNet config files share.

``zhang_imagenet.py``, ``dcasgd_imagenet_resnet50.py`` and
``dcs3gd_imagenet_resnet50.py`` read the same data the same way and differ
only in the network and its crop size.
"""

from __future__ import annotations

import ml_collections


def use_imagenet(config: ml_collections.ConfigDict, *, model: str, image_size: int) -> ml_collections.ConfigDict:
  """Switches ``config`` (in place) to tfds ``imagenet2012`` and ``model``.

  Training images are Inception random-resized crops of ``image_size`` with
  flips (``augment=True`` on the lazily decoded tfds split,
  `stalesgd.data._inception_crop`), evaluation images centre crops
  (`stalesgd.data._sources.LazyImageSource`), with per-channel normalisation: the
  per-pixel mean image of Caffe is not computed for a data set read lazily
  (`stalesgd.data._normalization.fit_normalization` refuses it).

  Args:
    config: a config from `stalesgd.training.default_config`.
    model: the network's registry name.
    image_size: the crop side the network is designed for.

  Returns:
    ``config``, for chaining.
  """
  config.dataset, config.data_source = "imagenet2012", "tfds"
  config.image_size = image_size
  config.normalization = "per_channel"
  config.augment = True
  config.model = model
  return config
