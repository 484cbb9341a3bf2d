"""Numeric hyperparameters of the transforms: their value at an update.

Every numeric hyperparameter is an `optax.ScalarOrSchedule`: a number, an
array, or a function of the transform's update count. Each transform checks
its plain numbers when it is built (with `stalesgd._validation`), not schedules
or arrays, because `optax.inject_hyperparams` rebuilds the transform with
(possibly traced) arrays inside `update`.
"""

from __future__ import annotations

from typing import Any

import jax
import optax


def value_at(hyperparameter: optax.ScalarOrSchedule, count: jax.Array) -> Any:
  """The hyperparameter's value at update `count` (schedules are called with it)."""
  if callable(hyperparameter):
    return hyperparameter(count)
  return hyperparameter
