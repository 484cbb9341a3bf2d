"""Checks of one run-config field: its type and range, with an error that names the field.

Every check raises ``ValueError("config.<field>=<value> is not allowed: <what is>")``,
so `stalesgd.training.validate_config` reads as a list of fields and their ranges.
An int field takes a Python int (not a float or a bool); a number field an int
or a finite float.
"""

from __future__ import annotations

import math

INT32_MAX = 2**31 - 1  # counts end up in int32 device arrays
INT64_MAX = 2**63 - 1  # seeds (numpy and JAX take up to int64) and byte counts


def fail(field: str, value, allowed: str) -> None:
  raise ValueError(f"config.{field}={value!r} is not allowed: {allowed}")


def field_value(config, field: str):
  """``config.a.b`` for ``field = "a.b"``."""
  for name in field.split("."):
    config = config[name]
  return config


def is_int(value) -> bool:
  return isinstance(value, int) and not isinstance(value, bool)


def is_number(value) -> bool:
  """A Python int or float (numpy float64 is a float; bools and other numpy scalars are not)."""
  return isinstance(value, (int, float)) and not isinstance(value, bool)


def require_int(config, field: str, *, minimum: int, maximum: int = INT32_MAX, optional: bool = False) -> None:
  value = field_value(config, field)
  if optional and value is None:
    return
  if not is_int(value) or value < minimum or value > maximum:
    prefix = "None or " if optional else ""
    fail(field, value, f"{prefix}an integer >= {minimum} and <= {maximum}")


def require_number(
  config,
  field: str,
  *,
  minimum: float,
  strict: bool = False,
  maximum: float | None = None,
  maximum_inclusive: bool = False,
  optional: bool = False,
  allow_inf: bool = False,
  because: str = "",
) -> None:
  value = field_value(config, field)
  if optional and value is None:
    return
  ok = is_number(value) and (isinstance(value, int) or math.isfinite(value) or (allow_inf and value == math.inf))
  ok = ok and (value > minimum if strict else value >= minimum)
  ok = ok and (maximum is None or (value <= maximum if maximum_inclusive else value < maximum))
  if not ok:
    upper = "" if maximum is None else f" and {'<=' if maximum_inclusive else '<'} {maximum}"
    kind = "a number (inf allowed)" if allow_inf else "a finite number"
    fail(
      field,
      value,
      f"{'None or ' if optional else ''}{kind} {'>' if strict else '>='} {minimum}{upper}"
      + (f" {because}" if because else ""),
    )


def require_bool(config, field: str) -> None:
  value = field_value(config, field)
  if not isinstance(value, bool):
    fail(field, value, "True or False")


def require_choice(config, field: str, choices) -> None:
  value = field_value(config, field)
  if not isinstance(value, str) or value not in choices:
    fail(field, value, f"one of {tuple(choices)}")
