"""Run configurations: one ``get_config(arg)`` per module, selected with ``--config=NAME[:ARG]``.

Each config module's docstring says, in about 20 lines, what it reproduces (the paper, its table or figure), its
``stalesgd-train --config=NAME`` command (and ``stalesgd-reproduce --study=...`` where a study runs it), its
cost on named hardware and the result it reaches, each citing the ``results/`` directory that holds the number
or saying "not measured"; its ``RESULTS`` holds the numbers that *Result* quotes as data
(`ConfigResult`: directory, variant, statistic, value; a test checks them against each
directory's ``results.csv``); its ``get_config`` gives the setting and the variants. ``arguments.py`` defines the
``[quick,]VARIANT`` argument grammar they share, ``quick.py`` what their ``quick`` variants share and
``imagenet.py`` the ImageNet configs' input pipeline (those three are helpers, not configs).

The configs ship in the wheel, so ``stalesgd-train`` finds them by name from any directory (`resolve`,
`names`): ``--config=rudra_cifar10:quick`` (or ``rudra_cifar10.py:quick``) is this package's
``rudra_cifar10.py``. ``--config`` also takes the path of a config file of your own
(``--config=path/to/my_config.py:ARG``), which wins over a packaged name.
"""

from __future__ import annotations

import os
import pathlib

from stalesgd.configs._results import ConfigResult

_CONFIG_DIR = pathlib.Path(__file__).resolve().parent
# Modules of this package that configs import, and that are no config themselves.
_HELPER_MODULES = ("arguments", "imagenet", "quick")

__all__ = ["ConfigResult", "config_path", "names", "resolve"]


def names() -> tuple[str, ...]:
  """The packaged configs' names (module names, sorted), e.g. ``"demo"``, ``"rudra_cifar10"``."""
  return tuple(
    sorted(
      path.stem
      for path in _CONFIG_DIR.glob("*.py")
      if path.stem not in _HELPER_MODULES and not path.stem.startswith("_")
    )
  )


def config_path(name: str) -> pathlib.Path:
  """The file of the packaged config ``name`` (one of `names`; a ``.py`` suffix is allowed).

  Raises:
    ValueError: for a name that is not a packaged config, listing the names.
  """
  stem = name[: -len(".py")] if name.endswith(".py") else name
  if stem not in names():
    raise ValueError(f"no packaged config named {name!r}; allowed: one of {list(names())}")
  return _CONFIG_DIR / f"{stem}.py"


def resolve(value: str) -> str:
  """A ``--config`` value (``FILE_OR_NAME[:ARG]``) as ``FILE[:ARG]`` for ml_collections' config_flags.

  * An existing file (a path relative to the working directory, or absolute)
    is kept as it is: your own config files work as they always did, and a
    file wins over a name.
  * Otherwise a bare name, with or without ``.py`` (no directory part), is the
    packaged config of that name (`config_path`).

  Everything after the first ``:`` (the argument of ``get_config``) is kept.

  Raises:
    ValueError: for anything else, naming the packaged configs.
  """
  location, colon, argument = value.partition(":")
  if os.path.isfile(location):
    return value
  if location and os.sep not in location and "/" not in location:
    try:
      return f"{config_path(location)}{colon}{argument}"
    except ValueError:
      pass
  raise ValueError(
    f"{location!r} is neither a config file (from {os.getcwd()}) nor a packaged config's name; "
    f"allowed: a file's path or one of {list(names())} (optionally NAME.py), then optionally :ARG"
  )
