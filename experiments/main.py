r"""One training run from a clone: ``python -m experiments.main --config=CONFIG[:ARG] --workdir=DIR``.

The program is `stalesgd.cli.train` (installed: ``stalesgd-train``); this
script keeps the repository's commands working unchanged, e.g.::

  python -m experiments.main --config=experiments/configs/rudra_cifar10.py:quick --workdir=runs/rudra

``--config`` takes a config file's path (``experiments/configs/*.py``, or your
own) or a packaged config's name (``rudra_cifar10:quick``); ``--helpfull``
lists every flag.
"""

from stalesgd.cli.train import main, run  # noqa: F401  (main: for wrappers such as tests/helpers/workers/paced_main.py)

if __name__ == "__main__":
  run()
