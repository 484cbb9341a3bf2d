"""``stalesgd.cli.train`` (``stalesgd-train``) with a pause before every block, so a test can signal it mid-run.

Run as ``python -m tests.helpers.workers.paced_main SECONDS_PER_BLOCK <stalesgd-train flags>``, or with
``PACED_SECONDS_PER_BLOCK=SECONDS`` in the environment (for launchers that put their flags first).

The tiny test runs execute a block (a block, or a decentralized step) in a few
milliseconds, so a test that waits for a checkpoint and then sends SIGKILL or
SIGTERM could find the run already finished. Sleeping before each block (as a
slow cluster would) keeps every run in flight for seconds without changing any
number it computes: the schedule, the batches and the weights depend only on
the config, never on wall-clock time. Everything else is ``stalesgd-train``
unchanged (flags, resume, SIGTERM handling, exit status).
"""

from __future__ import annotations

import os
import sys
import time

from absl import app

SECONDS_PER_BLOCK_VARIABLE = "PACED_SECONDS_PER_BLOCK"


def pace_runners(seconds_per_block: float) -> None:
  """Makes every runner's ``step`` sleep ``seconds_per_block`` before doing its work."""
  from stalesgd.training import (
    _runners as runners,  # after stalesgd.cli.train set up JAX
  )

  for runner_class in (runners.ParameterServerRunner, runners.DecentralizedRunner):
    unpaced_step = runner_class.step

    def paced_step(self, state, block, _unpaced_step=unpaced_step):
      time.sleep(seconds_per_block)
      return _unpaced_step(self, state, block)

    runner_class.step = paced_step


def main() -> None:
  if SECONDS_PER_BLOCK_VARIABLE in os.environ:  # launchers that put their own flags first (launch/local.sh)
    seconds_per_block = float(os.environ[SECONDS_PER_BLOCK_VARIABLE])
  elif len(sys.argv) < 2:
    raise SystemExit(
      f"usage: {sys.argv[0]} SECONDS_PER_BLOCK <stalesgd-train flags>, or "
      f"{SECONDS_PER_BLOCK_VARIABLE}=SECONDS {sys.argv[0]} <stalesgd-train flags>"
    )
  else:
    seconds_per_block = float(sys.argv.pop(1))
  if not seconds_per_block >= 0:
    raise SystemExit(f"SECONDS_PER_BLOCK={seconds_per_block!r}; allowed: a number >= 0")
  from stalesgd.cli import train as train_cli  # defines the flags

  pace_runners(seconds_per_block)
  app.run(train_cli.main)


if __name__ == "__main__":
  main()
