"""A few blocks of the engine with delay compensation, as one process of a multi-process run.

Run by `multiprocess_harness.run_processes` (``--coordinator_address``,
``--num_processes``, ``--process_id``, ``--output``), and imported by
test_engine_multiprocess.py to compute the single-process reference with the
same code. The engine's mesh spans every device of every process; the server
state (weights, ring buffer of past weights, optimizer state) is sharded over
parameters, so every update moves data between processes; each process builds
only its own devices' mini-batches. The final state is gathered from all
processes and written whole, one array per leaf.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

# The shared N-process harness: the flags it passes and how a child joins the run.
from tests.helpers.multiprocess_harness import add_process_flags, initialize_process

MODEL = "cnn"  # engine_oracle's 3x3 conv, 2x2 max-pool and dense classifier
LEARNERS = 8
NUM_UPDATES = 40
LEARNING_RATE = 0.05
# (protocol, options) for `stalesgd.schedule.simulate`: gradients up to ~10
# versions stale (async) and 2-softsync's stacks of 4 contributions per update.
SCHEDULES = {
  "async": ("async", {}),
  "2-softsync": ("softsync", {"n": 2}),
}


def make_optimizer():
  """DC-ASGD-a then Zhang et al.'s 1/sigma per contribution, averaged, then server SGD with momentum."""
  import optax

  import stalesgd

  return optax.chain(
    stalesgd.scale_by_delay_compensation(dc_lambda=2.0, adaptive=True, decay=0.95),
    stalesgd.scale_by_staleness("inverse"),
    stalesgd.average_contributions(),
    optax.sgd(LEARNING_RATE, momentum=0.9),
  )


def train(schedule_name: str, *, seed: int = 0):
  """Runs every block of a NUM_UPDATES-update schedule on all devices; returns (schedule, plan, final state)."""
  from stalesgd import engine as engine_lib
  from stalesgd import schedule as schedule_lib
  from tests.helpers.engine_oracle import MODELS, Data

  protocol, options = SCHEDULES[schedule_name]
  schedule = schedule_lib.simulate(protocol, learners=LEARNERS, num_updates=NUM_UPDATES, seed=seed, **options)
  loss_fn, init_params, input_shape = MODELS[MODEL]
  engine = engine_lib.Engine(loss_fn, make_optimizer())
  plan = engine.plan(schedule)
  state = engine.run(engine.init(init_params(seed), plan), plan, Data(input_shape, seed=seed))
  return schedule, plan, state


def gather_state(schedule_name: str, state) -> dict[str, np.ndarray]:
  """Every leaf of the engine state, whole (gathered from all processes), named ``<schedule>/<path>``."""
  import jax
  from jax.experimental import multihost_utils

  arrays = {}
  for path, leaf in jax.tree_util.tree_flatten_with_path(state)[0]:
    arrays[f"{schedule_name}/{jax.tree_util.keystr(path)}"] = np.asarray(
      multihost_utils.process_allgather(leaf, tiled=True)
    )
  return arrays


def main(argv: list[str]) -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  add_process_flags(parser, heartbeat_timeout=20)
  parser.add_argument("--output", required=True, help="npz file to write")
  parser.add_argument("--schedules", default=",".join(SCHEDULES))
  args = parser.parse_args(argv)

  import jax

  initialize_process(args)
  arrays = {"process_count": np.asarray(jax.process_count()), "device_count": np.asarray(jax.device_count())}
  for schedule_name in args.schedules.split(","):
    schedule, plan, state = train(schedule_name)
    arrays.update(gather_state(schedule_name, state))
    arrays[f"{schedule_name}/max_staleness"] = np.asarray(schedule.max_staleness)
    arrays[f"{schedule_name}/num_blocks"] = np.asarray(plan.num_blocks)
    leaves = jax.tree_util.tree_leaves(state)
    # Leaves this process holds only part of: the parameter-sharded server state.
    arrays[f"{schedule_name}/split_leaves"] = np.asarray(
      sum(leaf.addressable_shards[0].data.shape != leaf.shape for leaf in leaves)
    )
    arrays[f"{schedule_name}/fully_addressable"] = np.asarray(all(leaf.is_fully_addressable for leaf in leaves))
  np.savez(args.output, **arrays)


if __name__ == "__main__":
  main(sys.argv[1:])
