"""Old call forms of the transform factories that keep working, with a DeprecationWarning, for one release.

stalesgd 0.2 made the flags of the factories keyword-only (optax's newer
transforms do the same) and renamed the exponential rule's rate ``decay`` to
``rate`` (``decay`` is a moving-average factor in [0, 1) everywhere else, as in
optax). Calls written for 0.1 still run; they warn and name `REMOVED_IN`.
"""

from __future__ import annotations

import functools
import inspect
import warnings
from collections.abc import Callable
from typing import Any, TypeVar

REMOVED_IN = "0.3.0"

Function = TypeVar("Function", bound=Callable[..., Any])


def positional_up_to(count: int) -> Callable[[Function], Function]:
  """Accepts, with a warning, the 0.1 calls that pass the keyword-only parameters after the first ``count`` by position.

  The decorated function declares ``*`` after its first ``count`` parameters,
  in the 0.1 order, so a positional argument beyond them maps to the name it
  had then.
  """

  def decorate(function: Function) -> Function:
    names = list(inspect.signature(function).parameters)

    @functools.wraps(function)
    def accept_old_positions(*args, **kwargs):
      if len(args) > count:
        moved = names[count : len(args)]
        warnings.warn(
          f"{function.__name__}: passing {', '.join(moved)} by position is deprecated: they are keyword-only "
          f"from stalesgd 0.2, and the positional form is removed in {REMOVED_IN}",
          DeprecationWarning,
          stacklevel=2,
        )
        for name, value in zip(moved, args[count:]):
          if name in kwargs:
            raise TypeError(f"{function.__name__}() got multiple values for argument {name!r}")
          kwargs[name] = value
        args = args[:count]
      return function(*args, **kwargs)

    return accept_old_positions  # type: ignore[return-value]

  return decorate


def renamed_keyword(old: str, new: str) -> Callable[[Function], Function]:
  """Accepts, with a warning, the keyword ``old`` for what is now ``new``."""

  def decorate(function: Function) -> Function:
    @functools.wraps(function)
    def accept_old_name(*args, **kwargs):
      if old in kwargs:
        if new in kwargs:
          raise TypeError(f"{function.__name__}() got both {old!r} (its 0.1 name) and {new!r}")
        warnings.warn(
          f"{function.__name__}: the keyword {old!r} is now {new!r} (stalesgd 0.2); {old!r} is removed in {REMOVED_IN}",
          DeprecationWarning,
          stacklevel=2,
        )
        kwargs[new] = kwargs.pop(old)
      return function(*args, **kwargs)

    return accept_old_name  # type: ignore[return-value]

  return decorate
