"""A user's loss and metrics by import path: ``config.loss = "my_package.losses:squared_error"``.

The function is called on the model's outputs and the batch's labels and returns per-example values:

    loss_fn(outputs [B, ...], labels [B]) -> {"loss": [B], "abs_error": [B], ...}

Training minimises the batch mean of ``"loss"``; evaluation reports the test set's mean of every returned value
as ``test_<name>`` (``test_loss``, ``test_abs_error``, ...). So a task other than classification, e.g. a
regression on float targets (`stalesgd.data._python_source`), trains through every protocol. The default,
``"softmax_cross_entropy"``, is the built-in classification (test error, accuracy, loss).

`user_loss` loads and checks it on one abstract call (`jax.eval_shape`) with the model's outputs and the data's
labels, before training starts, and raises a `ValueError` naming ``config.loss`` and what is wrong.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from stalesgd.models._spec import LossFunction, ModelSpec
from stalesgd.utils._import_path import is_import_path, load_callable

DEFAULT_LOSS = "softmax_cross_entropy"
FIELD = "config.loss"
_PROBE_BATCH = 2


def is_default_loss(name: str) -> bool:
  return name == DEFAULT_LOSS


def check_loss_name(name: str) -> None:
  """The default, or an importable callable.

  Raises:
    ValueError: naming ``config.loss`` and the allowed values.
  """
  if is_default_loss(name):
    return
  if not is_import_path(name):
    raise ValueError(f"{FIELD}={name!r}; allowed: {DEFAULT_LOSS!r} or an import path 'package.module:function'")
  load_callable(name, field=FIELD)


def user_loss(
  name: str, model: ModelSpec, *, image_shape: tuple[int, int, int], label_dtype: jnp.dtype
) -> tuple[LossFunction, tuple[str, ...]]:
  """The loss function ``name`` names and the names of the values it returns (``"loss"`` first).

  Raises:
    ValueError: naming ``config.loss``: it fails on the model's outputs, returns no mapping, has no ``"loss"``,
      or a value that is not one number per example.
  """
  function = load_callable(name, field=FIELD)
  images = jnp.zeros((_PROBE_BATCH, *image_shape), jnp.float32)
  labels = jax.ShapeDtypeStruct((_PROBE_BATCH,), label_dtype)

  def probe(key, labels):
    params = model.module.init(key, images, train=False)["params"]
    rngs = {"dropout": key} if model.uses_dropout else {}
    return function(model.module.apply({"params": params}, images, train=True, rngs=rngs), labels)

  try:
    values = jax.eval_shape(probe, jax.random.key(0), labels)
  except Exception as error:
    raise ValueError(f"{FIELD}={name!r} failed on the model's outputs and the labels: {error}") from error
  if not isinstance(values, dict) or "loss" not in values:
    raise ValueError(
      f"{FIELD}={name!r} returned {type(values).__name__}; allowed: a dict of per-example values with 'loss'"
    )
  wrong = sorted(key for key, value in values.items() if getattr(value, "shape", None) != (_PROBE_BATCH,))
  if wrong:
    raise ValueError(f"{FIELD}={name!r}: values {wrong} are not one number per example, shape [B]")
  return function, ("loss",) + tuple(sorted(key for key in values if key != "loss"))
