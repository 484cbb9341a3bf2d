"""The command-line programs, installed as console scripts (``[project.scripts]`` in pyproject.toml).

* ``stalesgd-train``: `stalesgd.cli.train` (one training run);
* ``stalesgd-reproduce``: `stalesgd.cli.reproduce` (a study's grid);
* ``stalesgd-prepare``: `stalesgd.data.prepare` (local data files -> a tfds data directory).

Each module defines its absl flags at import and has a ``run()`` that parses
``sys.argv`` (`stalesgd.cli._program.run_main`); importing this package imports none of them (flags
are defined once, by the program that runs).
"""

__all__: list[str] = []
