"""Argument checks shared by the timing model and the protocol simulators.

Every check raises ``ValueError`` naming the argument, the bad value and the
allowed range, so bad input fails before anything is simulated.
"""

from __future__ import annotations

import math
import numbers
from typing import Any


def check_integer(name: str, value: Any, low: int, high: int | None = None, *, high_label: str = "") -> int:
  """Returns ``value`` as an int after checking ``low <= value <= high``.

  Args:
    name: argument name used in the error message.
    value: the value to check; bools and non-integral numbers are rejected.
    low: smallest allowed value.
    high: largest allowed value, or None for no upper bound.
    high_label: how to describe ``high`` in the message, e.g. ``"learners"``.

  Returns:
    The value as a Python int.

  Raises:
    ValueError: if ``value`` is not an integer in the allowed range.
  """
  upper = "inf" if high is None else (f"{high_label}={high}" if high_label else str(high))
  allowed = f"an integer in [{low}, {upper}]"
  if isinstance(value, bool) or not isinstance(value, numbers.Integral):
    raise ValueError(f"{name} must be {allowed}; got {value!r}")
  if value < low or (high is not None and value > high):
    raise ValueError(f"{name} must be {allowed}; got {value!r}")
  return int(value)


def check_real(
  name: str,
  value: Any,
  *,
  low: float = -math.inf,
  high: float = math.inf,
  low_open: bool = False,
  allow_inf: bool = False,
) -> float:
  """Returns ``value`` as a float after checking it lies in the allowed range.

  Args:
    name: argument name used in the error message.
    value: the value to check; bools and NaN are rejected.
    low: lower bound (inclusive unless ``low_open``).
    high: upper bound (inclusive).
    low_open: whether ``low`` itself is excluded.
    allow_inf: whether ``+inf`` is allowed (e.g. an infinite bandwidth).

  Returns:
    The value as a Python float.

  Raises:
    ValueError: if ``value`` is not a real number in the allowed range.
  """
  bracket = "(" if low_open else "["
  allowed = f"a number in {bracket}{low}, {high}]" + (" (inf allowed)" if allow_inf else "")
  if isinstance(value, bool) or not isinstance(value, numbers.Real):
    raise ValueError(f"{name} must be {allowed}; got {value!r}")
  number = float(value)
  if math.isnan(number) or (math.isinf(number) and not (allow_inf and number > 0)):
    raise ValueError(f"{name} must be {allowed}; got {value!r}")
  too_low = number <= low if low_open else number < low
  if too_low or number > high:
    raise ValueError(f"{name} must be {allowed}; got {value!r}")
  return number


def check_choice(name: str, value: Any, choices: tuple[str, ...]) -> str:
  """Returns ``value`` after checking it is one of ``choices``.

  Raises:
    ValueError: naming ``name``, the value and the allowed choices.
  """
  if value not in choices:
    raise ValueError(f"{name} must be one of {', '.join(map(repr, choices))}; got {value!r}")
  return value


def check_bool(name: str, value: Any) -> bool:
  """Returns ``value`` after checking it is a bool.

  Raises:
    ValueError: if ``value`` is not ``True`` or ``False``.
  """
  if not isinstance(value, bool):
    raise ValueError(f"{name} must be True or False; got {value!r}")
  return value
