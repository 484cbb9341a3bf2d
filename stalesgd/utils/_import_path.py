"""Objects named by import path, ``"package.module:attribute"``: a user's model, data, loss or optimizer factory.

A config field that takes a registered name also takes an import path, told apart by its colon
(`is_import_path`). `load_callable` imports the module and returns the attribute, or raises a `ValueError`
that names the config field, the path and what is wrong (no such module, no such attribute, not callable),
before anything expensive starts. `check_options` refuses keyword options a factory does not take.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Callable, Iterable
from typing import Any


def is_import_path(value: Any) -> bool:
  """Whether ``value`` is a ``"module:attribute"`` string rather than a registered name."""
  return isinstance(value, str) and ":" in value


def load_callable(path: str, *, field: str) -> Callable[..., Any]:
  """The callable that ``path`` (``"package.module:attribute"``, attribute may be dotted) names.

  Raises:
    ValueError: naming ``field`` and ``path``: malformed, the module cannot be imported (with the import's
      own error), it has no such attribute, or the attribute is not callable.
  """
  module_name, _, attribute = path.partition(":")
  if not module_name or not attribute or ":" in attribute:
    raise ValueError(f"{field}={path!r}; allowed: a registered name or an import path 'package.module:attribute'")
  try:
    target: Any = importlib.import_module(module_name)
  except Exception as error:  # the user's module may raise anything while importing
    raise ValueError(
      f"{field}={path!r}: cannot import module {module_name!r} ({type(error).__name__}: {error}); it must be "
      "importable from the program's sys.path (install the package, or start the program from its directory)"
    ) from error
  for part in attribute.split("."):
    if not hasattr(target, part):
      raise ValueError(f"{field}={path!r}: {getattr(target, '__name__', target)!r} has no attribute {part!r}")
    target = getattr(target, part)
  if not callable(target):
    raise ValueError(f"{field}={path!r} is a {type(target).__name__}, not callable; allowed: a factory function")
  return target


def accepted_options(factory: Callable[..., Any]) -> tuple[set[str], bool]:
  """(keyword parameters ``factory`` takes, whether it also takes ``**kwargs``)."""
  try:
    parameters = inspect.signature(factory).parameters.values()
  except (TypeError, ValueError):  # a builtin without a signature: let the call decide
    return set(), True
  names = {p.name for p in parameters if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)}
  return names, any(p.kind is p.VAR_KEYWORD for p in parameters)


def check_options(
  factory: Callable[..., Any], options: Iterable[str], *, field: str, path: str, options_field: str
) -> None:
  """Refuses keyword ``options`` that ``factory`` does not take, naming them and the ones it does.

  Raises:
    ValueError: naming ``options_field`` (e.g. ``config.model_options``), the unexpected options, ``field``
      and ``path``, and the accepted options.
  """
  names, takes_any = accepted_options(factory)
  unexpected = sorted(set(options) - names)
  if unexpected and not takes_any:
    raise ValueError(
      f"{options_field}.{unexpected[0]}: {field}={path!r} does not take option(s) {unexpected}; its options are "
      f"{sorted(names) or 'none'}"
    )
