"""A user's model by import path: ``config.model = "my_package.nets:make_model"``.

The contract (docs/own_experiment.md says it for users):

* the factory is called with the config's ``model_options`` as keyword arguments, plus ``num_classes`` (the
  data's class count) when it has a parameter of that name;
* it returns a flax linen module, called as ``module.apply(variables, images, train=...)`` on float32 images
  [B, H, W, C] and returning logits [B, num_classes]; or a `ModelSpec`, for full control (learning-rate and
  weight-decay multipliers, dropout);
* its training forward is a pure function of its ``params``: the emulator differentiates many learners'
  losses at stale weights, and only the weights travel. A module with batch normalisation uses
  `stalesgd.models.BatchNorm`, which normalises with the batch's statistics in training and gets population
  statistics recomputed at the evaluated weights ("precise BN"), as the built-in models do. flax's
  ``nn.BatchNorm`` updates running averages in its training forward, so a module with it is refused, naming
  the reason.

`custom_model` checks all of this on one abstract forward (`jax.eval_shape`, no compilation) before any
training starts, and raises a `ValueError` naming the path and what is wrong.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from stalesgd.models._batch_norm import MOMENTS_COLLECTION
from stalesgd.models._spec import ModelSpec
from stalesgd.utils._import_path import accepted_options, check_options, load_callable

FIELD = "config.model"
_PROBE_BATCH = 2


def custom_model(
  path: str, *, num_classes: int | None, image_shape: tuple[int, int, int] | None, options: dict
) -> ModelSpec:
  """The `ModelSpec` of the model the factory at ``path`` builds (module docstring: the contract).

  Args:
    path: ``"package.module:factory"``.
    num_classes: the data's class count, passed as ``num_classes`` where the factory takes it; None for
      float targets (the outputs are then whatever the user's loss reads).
    image_shape: (height, width, channels) of the data; the output shape is checked on it. None: the
      factory must return a `ModelSpec` (which knows its own image shape).
    options: keyword arguments for the factory (``config.model_options``).

  Raises:
    ValueError: naming the path: cannot import, not callable, options it does not take, it returned neither
      a module nor a `ModelSpec`, its forward fails, the output is not [B, num_classes], or its training
      forward updates state.
  """
  factory = load_callable(path, field=FIELD)
  check_options(factory, options, field=FIELD, path=path, options_field="config.model_options")
  names, takes_any = accepted_options(factory)
  arguments = dict(options)
  if num_classes is not None and ("num_classes" in names or takes_any):
    arguments.setdefault("num_classes", num_classes)
  built = factory(**arguments)
  if isinstance(built, ModelSpec):
    spec = built
  elif isinstance(built, nn.Module):
    if image_shape is None:
      raise ValueError(f"{FIELD}={path!r} returned a module: the data's image shape is needed to check it")
    spec = ModelSpec(name=path, module=built, num_classes=num_classes, default_image_shape=tuple(image_shape))
  else:
    raise ValueError(
      f"{FIELD}={path!r} returned a {type(built).__name__}; allowed: a flax.linen.Module or a stalesgd.models.ModelSpec"
    )
  _check_forward(spec, path=path, num_classes=num_classes, image_shape=image_shape or spec.default_image_shape)
  return spec


def _check_forward(spec: ModelSpec, *, path: str, num_classes: int | None, image_shape: tuple[int, int, int]) -> None:
  """One abstract init and training/evaluation forward: output shapes (logits [B, num_classes] for class
  labels; any shape for float targets, which a user's loss reads), and a training path without state."""
  if spec.num_classes != num_classes:
    raise ValueError(f"{FIELD}={path!r} built a model of {spec.num_classes} classes; the data has {num_classes}")
  images = jax.ShapeDtypeStruct((_PROBE_BATCH, *image_shape), jnp.float32)
  try:
    variables = jax.eval_shape(
      lambda key: spec.module.init(key, jnp.zeros(images.shape), train=False), jax.random.key(0)
    )
  except Exception as error:
    raise ValueError(
      f"{FIELD}={path!r}: init(images [B, *{tuple(image_shape)}], train=False) failed: {error}"
    ) from error
  params = variables.get("params", {})
  extra = sorted(set(variables) - {"params", "batch_stats"})
  if extra:
    raise ValueError(
      f"{FIELD}={path!r} has variable collections {extra} besides params and batch_stats; the emulator "
      "differentiates a pure function of the params, so other state is not carried between updates"
    )
  rngs = {"dropout": jax.random.key(0)} if spec.uses_dropout else {}
  try:
    logits = jax.eval_shape(
      lambda p: spec.module.apply({"params": p}, jnp.zeros(images.shape), train=True, rngs=rngs), params
    )
  except Exception as error:
    why = (
      " It keeps batch statistics that its training forward updates (flax.linen.BatchNorm's running averages): "
      "use stalesgd.models.BatchNorm, which normalises with the batch's own statistics in training and gets "
      "population statistics by precise BN at evaluation"
      if variables.get("batch_stats")
      else ""
    )
    raise ValueError(
      f"{FIELD}={path!r}: the training forward apply({{'params': ...}}, images, train=True) failed "
      f"({type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}).{why}"
    ) from error
  expected = (_PROBE_BATCH, num_classes)
  if num_classes is not None and tuple(logits.shape) != expected:
    raise ValueError(
      f"{FIELD}={path!r} returns outputs of shape {tuple(logits.shape)} for {_PROBE_BATCH} images of shape "
      f"{tuple(image_shape)}; allowed: logits [B, num_classes] = {expected}"
    )
  if variables.get("batch_stats"):
    moments = jax.eval_shape(
      lambda p: spec.module.apply(
        {"params": p}, jnp.zeros(images.shape), train=True, rngs=rngs, mutable=[MOMENTS_COLLECTION]
      )[1],
      params,
    ).get(MOMENTS_COLLECTION, {})
    if jax.tree.structure(moments) != jax.tree.structure(variables["batch_stats"]):
      raise ValueError(
        f"{FIELD}={path!r} has batch_stats that stalesgd.models.BatchNorm does not fill: precise BN at "
        "evaluation could not recompute them. Use stalesgd.models.BatchNorm for every batch-normalised layer"
      )
