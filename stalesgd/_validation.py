"""The one vocabulary of value checks, shared by the core and the training stack.

Each check takes the name to print and the value, returns the value, and
raises ``ValueError`` in one format::

  <name>=<value!r>; allowed: <the allowed values or range>

The core names an argument (``learners=0; allowed: an integer >= 1``); the
training stack names a config field, nested ones with their section
(``config.timing.latency=-1.0; allowed: a finite number >= 0``). `reject`
raises the same message for a check no primitive expresses (a combination of
fields, a file's layout).

Standard library only, so every layer may import it. Integers and reals are
recognised as `numbers.Integral` / `numbers.Real` (numpy's scalars included),
never a bool; ``builtin_only=True`` takes only Python's own ``int`` / ``float``,
as a config that is written to JSON needs.
"""

from __future__ import annotations

import difflib
import math
import numbers
from collections.abc import Iterable
from typing import Any, NoReturn


def reject(name: str, value: Any, allowed: str) -> NoReturn:
  """Raises ``ValueError("<name>=<value!r>; allowed: <allowed>")``."""
  raise ValueError(f"{name}={value!r}; allowed: {allowed}")


def is_integer(value: Any, *, builtin_only: bool = False) -> bool:
  """Whether ``value`` is an integer: an `numbers.Integral` (only ``int`` if ``builtin_only``), not a bool."""
  kind = int if builtin_only else numbers.Integral
  return isinstance(value, kind) and not isinstance(value, bool)


def is_real(value: Any, *, builtin_only: bool = False) -> bool:
  """Whether ``value`` is a real number (NaN and infinities included): a `numbers.Real`, not a bool.

  With ``builtin_only``, an ``int`` or a ``float`` (numpy's float64 is a float; its other scalars are not).
  """
  kinds = (int, float) if builtin_only else numbers.Real
  return isinstance(value, kinds) and not isinstance(value, bool)


def _refused_for_its_type_only(check: Any, value: Any, builtin_only: bool) -> bool:
  """Whether ``builtin_only`` is what refuses ``value``: ``check`` (`is_integer`, `is_real`) admits it, but not
  its builtin form (a NumPy scalar); the message then names the Python type rather than the range."""
  return builtin_only and check(value) and not check(value, builtin_only=True)


def _finite(value: Any) -> bool:
  return isinstance(value, numbers.Integral) or math.isfinite(value)


def _bounds(low: Any, high: Any, *, low_open: bool = False, high_open: bool = False, high_label: str = "") -> str:
  parts = []
  if low is not None:
    parts.append(f"{'>' if low_open else '>='} {low}")
  if high is not None:
    parts.append(f"{'<' if high_open else '<='} {f'{high_label}={high}' if high_label else high}")
  return "".join(f" {'and ' if index else ''}{part}" for index, part in enumerate(parts))


def _allowed(what: str, *, optional: bool, note: str) -> str:
  return f"{'None or ' if optional else ''}{what}{f' {note}' if note else ''}"


def check_integer(
  name: str,
  value: Any,
  *,
  low: int | None = None,
  high: int | None = None,
  high_label: str = "",
  optional: bool = False,
  builtin_only: bool = False,
  note: str = "",
) -> int | None:
  """``value`` as an int, after checking ``low <= value <= high`` (both inclusive).

  Args:
    name: what the message calls the value.
    value: the value; a bool, a float (even 2.0) or anything else not integral is refused.
    low: the smallest allowed value, or None for no lower bound.
    high: the largest allowed value, or None for no upper bound.
    high_label: how the message names ``high``, e.g. ``"learners"`` (``<= learners=8``).
    optional: whether None is allowed (and returned).
    builtin_only: whether only Python's ``int`` is allowed, not numpy's integers.
    note: words appended to the allowed range in the message.

  Returns:
    ``int(value)``, or None for an allowed None.

  Raises:
    ValueError: ``<name>=<value!r>; allowed: an integer >= <low> and <= <high>`` (``a Python int ...`` when
      ``builtin_only`` refuses a NumPy integer: its type, not its value, is what is wrong).
  """
  if optional and value is None:
    return None
  if (
    not is_integer(value, builtin_only=builtin_only)
    or (low is not None and value < low)
    or (high is not None and value > high)
  ):
    bounds = _bounds(low, high, high_label=high_label)
    kind = "a Python int" if _refused_for_its_type_only(is_integer, value, builtin_only) else "an integer"
    reject(name, value, _allowed(f"{kind}{bounds}", optional=optional, note=note))
  return int(value)


def check_real(
  name: str,
  value: Any,
  *,
  low: float | None = None,
  high: float | None = None,
  low_open: bool = False,
  high_open: bool = False,
  allow_inf: bool = False,
  optional: bool = False,
  builtin_only: bool = False,
  note: str = "",
) -> Any:
  """``value``, after checking it is a real number within the bounds.

  NaN is always refused, and so are infinities unless ``allow_inf`` (which
  admits +inf only, for a range without ``high``). An integer counts as a real
  number (and is finite, however large).

  Args:
    name: what the message calls the value.
    value: the value; a bool or anything not real is refused.
    low: the lower bound, or None for none.
    high: the upper bound, or None for none.
    low_open: whether ``low`` itself is refused (``> low``); inclusive otherwise.
    high_open: whether ``high`` itself is refused (``< high``); inclusive otherwise.
    allow_inf: whether +inf is allowed (e.g. an infinite bandwidth).
    optional: whether None is allowed (and returned).
    builtin_only: whether only Python's ``int`` and ``float`` are allowed, not numpy's scalars.
    note: words appended to the allowed range in the message, e.g. ``"or a schedule"``.

  Returns:
    ``value`` unchanged (None for an allowed None).

  Raises:
    ValueError: ``<name>=<value!r>; allowed: a finite number >= <low> and < <high>`` (``a number ...
      (inf allowed)`` with ``allow_inf``; ``a finite Python int or float ...`` when
      ``builtin_only`` refuses a NumPy scalar).
  """
  if optional and value is None:
    return None
  ok = is_real(value, builtin_only=builtin_only) and (_finite(value) or (allow_inf and value == math.inf))
  ok = ok and (low is None or (value > low if low_open else value >= low))
  ok = ok and (high is None or (value < high if high_open else value <= high))
  if not ok:
    noun = "Python int or float" if _refused_for_its_type_only(is_real, value, builtin_only) else "number"
    kind = f"a {noun}" if allow_inf else f"a finite {noun}"
    bounds = _bounds(low, high, low_open=low_open, high_open=high_open)
    inf = " (inf allowed)" if allow_inf else ""
    reject(name, value, _allowed(f"{kind}{bounds}{inf}", optional=optional, note=note))
  return value


def check_choice(name: str, value: Any, choices: Iterable[str], *, note: str = "") -> str:
  """``value``, after checking it is a str among ``choices``.

  Raises:
    ValueError: ``<name>=<value!r>; allowed: one of (<choices>)``, then ``; did you mean '<choice>'?`` when a
      misspelt str is close to one (`difflib.get_close_matches`, its default cutoff 0.6).
  """
  choices = tuple(choices)
  if not isinstance(value, str) or value not in choices:
    nearest = difflib.get_close_matches(value, choices, n=1) if isinstance(value, str) else []
    suggestion = f"; did you mean {nearest[0]!r}?" if nearest else ""
    reject(name, value, _allowed(f"one of {choices}", optional=False, note=note) + suggestion)
  return value


def check_bool(name: str, value: Any) -> bool:
  """``value``, after checking it is ``True`` or ``False`` (not 0, 1 or numpy's bool).

  Raises:
    ValueError: ``<name>=<value!r>; allowed: True or False``.
  """
  if not isinstance(value, bool):
    reject(name, value, "True or False")
  return value
