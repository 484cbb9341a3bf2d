r"""Local runs of a parameter-server run: ``config.local_steps`` and the learners' inner optimizer, ``config.inner``.

With ``config.local_steps = H`` every contribution of a parameter-server protocol is a local run
(docs/algorithms.md §7): the learner runs H steps of its inner optimizer from the weights it pulled and
contributes :math:`\Delta = -\sum_i u_i`, which the server's optimizer (the run's ``learning_rate``,
``momentum``, staleness rule, ...) receives as a gradient. Which optimizer each field configures, per protocol
family (docs/api.md, *The config's shape*):

=========================  ============================================  =========================================
protocols                  the run's optimizer fields                    ``config.inner``
=========================  ============================================  =========================================
parameter server           the server's (outer) optimizer                each learner's inner optimizer
decentralized (all-reduce) each learner's local optimizer                not used (must stay at its defaults)
=========================  ============================================  =========================================

``config.inner``'s fields: ``optimizer`` (``"sgd"``: ``optax.sgd``; another optax optimizer by name, or
``"package.module:factory"``), ``learning_rate`` (constant), ``momentum`` and ``nesterov`` (SGD's, or the
solver's own arguments of those names), ``options`` (further keyword arguments) and ``reset_state`` (start
every local run from a fresh state, as DeepMind's asynchronous DiLoCo notebook re-creates its inner AdamW,
instead of the state the learner kept from its previous run, as DiLoCo keeps it). The defaults, H = 1 and inner
SGD at rate 1 without momentum, make :math:`\Delta` the gradient bit for bit: every run configured before
these fields existed computes what it computed.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import ml_collections
import optax

from stalesgd import _validation as validation
from stalesgd import schedule as schedule_lib
from stalesgd.training._solvers import solver_factory
from stalesgd.utils._import_path import accepted_options, check_options

INNER_SGD = "sgd"  # config.inner.optimizer's default: optax.sgd (no schedule: the inner rate is constant)
FIELD = "config.inner.optimizer"


def _inner_solver_call(inner: ml_collections.ConfigDict) -> tuple[Any, dict[str, Any]]:
  """The factory ``config.inner.optimizer`` names and its keyword arguments besides the rate.

  Raises:
    ValueError: naming the ``config.inner`` field: an unknown optimizer, an option it does not take, a momentum
      or nesterov it has no argument for, or a learning rate among the options.
  """
  name = inner.optimizer
  factory = optax.sgd if name == INNER_SGD else solver_factory(name, field=FIELD)
  arguments = dict(inner.options.items())
  check_options(factory, arguments, field=FIELD, path=name, options_field="config.inner.options")
  names, _ = accepted_options(factory)
  for field in ("learning_rate", "momentum", "nesterov"):
    if field in arguments:
      raise ValueError(f"config.inner.options.{field}: set config.inner.{field} instead")
  for field, value, off in (("momentum", inner.momentum, 0), ("nesterov", inner.nesterov, False)):
    if field in names:
      arguments[field] = value
    elif value != off:
      validation.reject(f"config.inner.{field}", value, f"{off!r}: {FIELD}={name!r} takes no {field} argument")
  if name == INNER_SGD and inner.momentum == 0:
    arguments["momentum"] = None  # optax.sgd without momentum keeps no state: nothing to carry between runs
  return factory, arguments


def build_inner_optimizer(inner: ml_collections.ConfigDict) -> optax.GradientTransformation:
  """The learners' inner optimizer that ``config.inner`` describes, at its constant learning rate."""
  factory, arguments = _inner_solver_call(inner)
  optimizer = factory(inner.learning_rate, **arguments)
  if not isinstance(optimizer, optax.GradientTransformation):
    raise ValueError(
      f"{FIELD}={inner.optimizer!r} returned a {type(optimizer).__name__}; allowed: an optax GradientTransformation"
    )
  return optimizer


def local_run_options(config: ml_collections.ConfigDict) -> dict[str, Any]:
  """The `stalesgd.engine.Engine` keyword arguments of a parameter-server run's local runs."""
  return {
    "local_steps": config.local_steps,
    "inner_optimizer": build_inner_optimizer(config.inner),
    "reset_inner_state": config.inner.reset_state,
  }


def default_inner() -> ml_collections.ConfigDict:
  """``config.inner``'s fields and defaults (module docstring)."""
  inner = ml_collections.ConfigDict()
  inner.optimizer = INNER_SGD
  inner.learning_rate = 1.0
  inner.momentum = 0.0
  inner.nesterov = False
  inner.options = ml_collections.ConfigDict()
  inner.reset_state = False
  return inner


def check_local_runs(config: ml_collections.ConfigDict, defaults: Mapping[str, Any] | None = None) -> None:
  """``config.local_steps`` and ``config.inner``, each bad value named with what is allowed.

  Raises:
    ValueError: naming the field; also for a decentralized protocol with H != 1 or ``config.inner`` changed
      (its local optimizer is the run's optimizer fields; local runs there are not emulated yet).
  """
  validation.check_integer("config.local_steps", config.local_steps, low=1, high=2**31 - 1, builtin_only=True)
  inner = config.inner
  if not isinstance(inner.optimizer, str):
    validation.reject(FIELD, inner.optimizer, "'sgd', an optax optimizer's name, or 'package.module:factory'")
  validation.check_real("config.inner.learning_rate", inner.learning_rate, low=0, low_open=True, builtin_only=True)
  validation.check_real("config.inner.momentum", inner.momentum, low=0, high=1, high_open=True, builtin_only=True)
  validation.check_bool("config.inner.nesterov", inner.nesterov)
  validation.check_bool("config.inner.reset_state", inner.reset_state)
  if not isinstance(inner.options, (ml_collections.ConfigDict, Mapping)) or not all(
    isinstance(key, str) for key in inner.options
  ):
    validation.reject("config.inner.options", inner.options, "a mapping of option names to values (e.g. b1=0.9)")
  _inner_solver_call(inner)
  if not schedule_lib.protocol_row(config.protocol).decentralized:
    return
  if config.local_steps != 1:
    validation.reject(
      "config.local_steps",
      config.local_steps,
      f"1 for protocol {config.protocol!r}: local runs of H > 1 steps run with the parameter-server protocols "
      f"({', '.join(schedule_lib.PARAMETER_SERVER_PROTOCOLS)})",
    )
  defaults = default_inner() if defaults is None else defaults
  for field in sorted(defaults.keys()):
    if field != "options" and inner[field] != defaults[field] or field == "options" and inner.options.keys():
      validation.reject(
        f"config.inner.{field}",
        inner[field] if field != "options" else dict(inner.options.items()),
        f"its default, {defaults[field]!r}, for protocol {config.protocol!r}: a decentralized learner's optimizer "
        "is the run's own optimizer fields (learning_rate, momentum, optimizer, ...)",
      )
