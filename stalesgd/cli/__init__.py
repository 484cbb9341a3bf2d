"""The command-line programs, installed as console scripts (``[project.scripts]`` in pyproject.toml).

* ``stalesgd-train``: `stalesgd.cli.train` (one training run; ``python -m experiments.main`` in a clone);
* ``stalesgd-reproduce``: `stalesgd.cli.reproduce` (a study's grid; ``python -m experiments.reproduce``);
* ``stalesgd-prepare``: `stalesgd.data.prepare` (local data files -> a tfds data directory).

Each module defines its absl flags at import and has a ``run()`` that parses
``sys.argv`` (`run_main`); importing this package imports none of them (flags
are defined once, by the program that runs).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from types import ModuleType

__all__ = ["run_main"]


def run_main(main: Callable[[list[str]], None], module: ModuleType) -> None:
  """``absl.app.run(main)``, with ``module``'s flags listed by ``--helpshort``.

  absl's short help lists the flags of the module ``sys.argv[0]`` names: the
  console script or ``experiments/main.py`` rather than the module that
  defines them, so they are declared key flags of that program as well.
  """
  from absl import (
    app,
    flags,
  )

  for flag in flags.FLAGS.get_key_flags_for_module(module):
    flags.FLAGS.register_key_flag_for_module(sys.argv[0], flag)
  app.run(main)
