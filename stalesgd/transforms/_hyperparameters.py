"""Numeric hyperparameters of the transforms: schedules and validation.

Every numeric hyperparameter is an `optax.ScalarOrSchedule`: a number, an
array, or a function of the transform's update count. Validation happens when
the transform is built and only for plain Python numbers, because
`optax.inject_hyperparams` rebuilds the transform with (possibly traced) arrays
inside `update`.
"""

from __future__ import annotations

import numbers
from typing import Any

import jax
import optax


def value_at(hyperparameter: optax.ScalarOrSchedule, count: jax.Array) -> Any:
  """The hyperparameter's value at update `count` (schedules are called with it)."""
  if callable(hyperparameter):
    return hyperparameter(count)
  return hyperparameter


def check_nonnegative(name: str, value: Any) -> None:
  """Raises ValueError if `value` is a plain number below 0.

  Args:
    name: The argument's name, quoted in the error.
    value: The argument (schedules and arrays are not checked).
  """
  if isinstance(value, numbers.Real) and not isinstance(value, bool) and value < 0:
    raise ValueError(f"{name} must be >= 0 (or a schedule); got {value!r}.")


def check_in_unit_interval(name: str, value: Any, *, include_one: bool = True) -> None:
  """Raises ValueError if `value` is a plain number outside [0, 1] (or [0, 1)).

  Args:
    name: The argument's name, quoted in the error.
    value: The argument (schedules and arrays are not checked).
    include_one: Whether 1 is allowed; False checks [0, 1).
  """
  if not isinstance(value, numbers.Real) or isinstance(value, bool):
    return
  if not (0 <= value <= 1 if include_one else 0 <= value < 1):
    interval = "[0, 1]" if include_one else "[0, 1)"
    raise ValueError(f"{name} must lie in {interval} (or be a schedule); got {value!r}.")
