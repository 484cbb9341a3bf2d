"""Model registry: `get_model(name, *, num_classes, **kwargs) -> ModelSpec`.

The trainer and the configs name a model by string; each name maps to a factory
in its model-family module, and a ``"package.module:factory"`` import path names a
user's model (`stalesgd.models._custom`). Unknown names and keyword arguments a factory does
not take are rejected with the allowed values before anything is built.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

from stalesgd.models._alexnet import alexnet
from stalesgd.models._cifar10_full import cifar10_full
from stalesgd.models._custom import custom_model
from stalesgd.models._mlp import mlp
from stalesgd.models._resnet_cifar import resnet_cifar
from stalesgd.models._resnet_imagenet import resnet_imagenet
from stalesgd.models._small_cnn import small_cnn
from stalesgd.models._spec import ModelSpec
from stalesgd.utils._import_path import is_import_path

_FACTORIES: dict[str, Callable[..., ModelSpec]] = {
  "cifar10_full": cifar10_full,
  "resnet_cifar": resnet_cifar,
  **{f"resnet{depth}": functools.partial(resnet_cifar, depth=depth) for depth in (20, 32, 44, 56, 110)},
  "resnet_imagenet": resnet_imagenet,
  **{f"resnet{depth}": functools.partial(resnet_imagenet, depth=depth) for depth in (50, 101, 152)},
  "alexnet": alexnet,
  "mlp": mlp,
  "small_cnn": small_cnn,
}


def available_models() -> tuple[str, ...]:
  """Names accepted by `get_model`."""
  return tuple(sorted(_FACTORIES))


def _accepted_options(factory: Callable[..., ModelSpec]) -> set[str]:
  bound = factory.keywords if isinstance(factory, functools.partial) else {}
  return {name for name in inspect.signature(factory).parameters if name not in bound and name != "num_classes"}


def get_model(
  name: str, *, num_classes: int | None, data_shape: tuple[int, int, int] | None = None, **kwargs: Any
) -> ModelSpec:
  """Builds a registered model, or a user's model named by import path.

  Args:
    name: one of `available_models()`, e.g. ``"cifar10_full"``, ``"resnet20"``,
      ``"resnet_cifar"`` (with ``depth``), ``"resnet50"``, ``"alexnet"``,
      ``"mlp"``, ``"small_cnn"``; or ``"package.module:factory"``, a factory
      returning a flax module or a `ModelSpec` (`stalesgd.models._custom`).
    num_classes: number of output classes (>= 2); None (data with float
      targets) only for a user's model.
    data_shape: (height, width, channels) of the data's images: a user's
      model is checked on it (a registered model ignores it; some take an
      ``image_shape`` option of their own).
    **kwargs: options of that model's factory (e.g. ``depth``, ``shortcut``,
      ``hidden_sizes``).

  Returns:
    The model's `ModelSpec`.
  """
  if is_import_path(name) and num_classes is None:  # a user's model on float targets (a user's loss)
    return custom_model(name, num_classes=None, image_shape=data_shape, options=kwargs)
  if not isinstance(num_classes, int) or isinstance(num_classes, bool) or num_classes < 2:
    raise ValueError(
      f"num_classes must be an int >= 2; got {num_classes!r} (data without classes needs a model of your own, "
      "config.model='package.module:factory', and a loss, config.loss)"
    )
  if is_import_path(name):
    return custom_model(name, num_classes=num_classes, image_shape=data_shape, options=kwargs)
  if name not in _FACTORIES:
    raise ValueError(
      f"model name {name!r} is unknown; available models: {', '.join(available_models())}, or an import path "
      "'package.module:factory' of your own (docs/own_experiment.md)"
    )
  factory = _FACTORIES[name]
  accepted = _accepted_options(factory)
  unexpected = sorted(set(kwargs) - accepted)
  if unexpected:
    raise ValueError(
      f"model {name!r} does not take option(s) {unexpected}; its options are {sorted(accepted) or 'none'}"
    )
  return factory(num_classes=num_classes, **kwargs)
