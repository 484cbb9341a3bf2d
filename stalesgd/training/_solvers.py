"""The solver a run's optimizer ends in: the papers' Caffe SGD, any optax optimizer by name, or a user's factory.

``config.optimizer``:

* ``"sgd"`` (default): the Caffe SGD solver of Rudra and Zhang et al. (`stalesgd.training._optimizer`), exactly
  as before this option existed; ``config.momentum`` and ``config.nesterov`` are its momentum.
* an optax optimizer by name (``"adam"``, ``"adamw"``, ``"lamb"``, ``"rmsprop"``, ...): ``optax.<name>`` called
  with the learning-rate schedule and ``config.optimizer_options`` as keyword arguments.
* ``"package.module:factory"``: a user's factory, called the same way, returning an optax transformation.

What the config's SGD fields mean for another solver (docs/own_experiment.md):

* ``momentum`` / ``nesterov`` go to the solver's own ``momentum`` / ``nesterov`` arguments where it has them
  (``optax.rmsprop``, ``optax.sgd``, ...); a solver without them refuses a non-zero momentum (Adam's is
  ``optimizer_options.b1``), so a setting never silently does nothing.
* ``weight_decay`` stays L2 added to each contribution before the staleness weight (``"modulated"``);
  AdamW's decoupled decay is its own ``optimizer_options.weight_decay``, part of the solver's step.
* the staleness modulation and Caffe's ``lr_mult`` act on the solver's step (`stalesgd.modulated_step`).
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any, NamedTuple

import optax

from stalesgd.utils._import_path import accepted_options, check_options, is_import_path, load_callable

CAFFE_SGD = "sgd"
FIELD = "config.optimizer"


@functools.cache
def optax_optimizers() -> tuple[str, ...]:
  """The optax optimizers by name: public factories of optax with a ``learning_rate`` parameter (not ``sgd``,
  which names the Caffe solver, nor the ``scale_by_*`` building blocks)."""
  names = []
  for name in dir(optax):
    factory = getattr(optax, name)
    # "sgd" is the Caffe solver here; scale_by_* are building blocks, not optimizers.
    if name.startswith(("_", "scale_by")) or name == CAFFE_SGD or not inspect.isfunction(factory):
      continue
    try:
      parameters = inspect.signature(factory).parameters
    except (TypeError, ValueError):
      continue
    if "learning_rate" in parameters:
      names.append(name)
  return tuple(sorted(names))


def solver_factory(name: str, *, field: str = FIELD) -> Callable[..., optax.GradientTransformation]:
  """The factory ``config.optimizer`` names (not for ``"sgd"``, the Caffe solver, built by the optimizer module).

  Raises:
    ValueError: naming ``field`` (``config.optimizer``, or ``config.inner.optimizer`` where ``"sgd"`` is
      ``optax.sgd``) and the allowed values.
  """
  if is_import_path(name):
    return load_callable(name, field=field)
  if name not in optax_optimizers():
    sgd = "the papers' Caffe solver" if field == FIELD else "optax.sgd"
    raise ValueError(
      f"{field}={name!r}; allowed: 'sgd' ({sgd}), an optax optimizer "
      f"({', '.join(optax_optimizers())}), or an import path 'package.module:factory'"
    )
  return getattr(optax, name)


class SolverCall(NamedTuple):
  """How ``config.optimizer``'s factory is called: the factory, its keyword arguments besides the learning
  rate, and whether it takes the rate by the name ``learning_rate`` (else as its first argument)."""

  factory: Callable[..., optax.GradientTransformation]
  arguments: dict[str, Any]
  rate_by_name: bool


def solver_call(name: str, options: Mapping[str, Any], *, momentum: float, nesterov: bool) -> SolverCall:
  """Resolves ``config.optimizer`` and checks its options (validation calls it before anything is read).

  Raises:
    ValueError: an unknown solver, an option the factory does not take, or a momentum / nesterov it has no
      argument for.
  """
  factory = solver_factory(name)
  arguments = dict(options)
  check_options(factory, arguments, field=FIELD, path=name, options_field="config.optimizer_options")
  names, _ = accepted_options(factory)
  if "learning_rate" in arguments:
    raise ValueError("config.optimizer_options.learning_rate: set config.learning_rate instead (and its schedule)")
  for field, value, off in (("momentum", momentum, 0), ("nesterov", nesterov, False)):
    if field in arguments:
      raise ValueError(f"config.optimizer_options.{field}: set config.{field} instead (it is the solver's {field})")
    if field in names:
      arguments[field] = value
    elif value != off:
      raise ValueError(
        f"config.{field}={value!r}, but {FIELD}={name!r} takes no {field} argument; allowed: {off!r} "
        "(an adaptive optimizer's own averaging is one of its config.optimizer_options, e.g. b1 for adam)"
      )
  return SolverCall(factory, arguments, "learning_rate" in names)


def build_solver(
  name: str, learning_rate: optax.Schedule, options: Mapping[str, Any], *, momentum: float, nesterov: bool
) -> optax.GradientTransformation:
  """``config.optimizer``'s transformation at the run's learning-rate schedule (any solver but ``"sgd"``)."""
  call = solver_call(name, options, momentum=momentum, nesterov=nesterov)
  if call.rate_by_name:
    solver = call.factory(learning_rate=learning_rate, **call.arguments)
  else:
    solver = call.factory(learning_rate, **call.arguments)
  if not isinstance(solver, optax.GradientTransformation):
    raise ValueError(f"{FIELD}={name!r} returned a {type(solver).__name__}; allowed: an optax GradientTransformation")
  return solver
