r"""A reproduction study from a clone: ``python -m experiments.reproduce --study=STUDY [--quick] ...``.

The program is `stalesgd.cli.reproduce` (installed: ``stalesgd-reproduce``),
whose docstring lists the studies and flags; this script keeps the
repository's commands (``make demo``, the README's) working unchanged.
"""

from stalesgd.cli.reproduce import main, run  # noqa: F401  (main: for wrappers, as experiments.main)

if __name__ == "__main__":
  run()
