"""A few steps of DC-S3GD on a small regression problem, as one process of a multi-process run.

Run by `multiprocess_harness.run_processes` (each process builds only its own
workers' batches, which are a pure function of (seed, worker, step)), and
imported by the tests to compute the single-process reference with the same
code. Writes, per protocol, the consensus weights and this process's workers'
local weights to ``--output``.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import time

import numpy as np

from tests.helpers import multiprocess_harness

PROTOCOL_CONFIGS = {
  "dcs3gd": {"protocol": "dcs3gd", "dc_lambda": 0.5, "lambda_mode": "constant"},
  "dcs3gd_adaptive_s2": {"protocol": "dcs3gd", "staleness": 2, "dc_lambda": 0.1, "lambda_mode": "adaptive"},
  "allreduce_sync": {"protocol": "allreduce_sync"},
}
INPUTS, HIDDEN, OUTPUTS, BATCH_PER_WORKER = 6, 8, 2, 4


def initial_params(seed: int) -> dict[str, np.ndarray]:
  rng = np.random.default_rng(seed)
  return {
    "hidden": (rng.normal(size=(INPUTS, HIDDEN)) / np.sqrt(INPUTS)).astype(np.float32),
    "output": (rng.normal(size=(HIDDEN, OUTPUTS)) / np.sqrt(HIDDEN)).astype(np.float32),
  }


def batch_for(seed: int, worker: int, step: int) -> dict[str, np.ndarray]:
  """Worker `worker`'s mini-batch of step `step`: depends on nothing else."""
  rng = np.random.default_rng((seed, worker, step))
  inputs = rng.normal(size=(BATCH_PER_WORKER, INPUTS)).astype(np.float32)
  targets = np.stack([np.sin(inputs[:, 0] + worker), inputs[:, 1] * inputs[:, 2]], axis=1)
  return {"inputs": inputs, "targets": targets.astype(np.float32)}


def loss_fn(params, batch):
  import jax.numpy as jnp

  hidden = jnp.tanh(batch["inputs"] @ params["hidden"])
  predictions = hidden @ params["output"]
  loss = jnp.mean(jnp.square(predictions - batch["targets"]))
  return loss, {"prediction_mean": jnp.mean(predictions)}


def train(protocol_name: str, *, steps: int, seed: int, die_at_step: int | None = None):
  """Runs `steps` steps on all devices; returns (trainer, final state)."""
  import optax

  from stalesgd.decentral import DCS3GD, settings_for_protocol
  from stalesgd.parallel import _sharding as sharding_lib

  mesh = sharding_lib.learner_mesh()
  options = dict(PROTOCOL_CONFIGS[protocol_name])
  config = settings_for_protocol(options.pop("protocol"), **options)
  trainer = DCS3GD(loss_fn, optax.sgd(0.05, momentum=0.9), config, mesh)
  state = trainer.init(initial_params(seed))
  for step in range(steps):
    if die_at_step is not None and step == die_at_step:
      print(f"killing myself at step {step} at {time.time():.3f}", flush=True)
      os.kill(os.getpid(), signal.SIGKILL)
    batch = sharding_lib.stack_learners(lambda worker: batch_for(seed, worker, step), mesh)
    state, _ = trainer.step(state, batch)
  return trainer, state


def flatten_result(protocol_name: str, trainer, state) -> dict[str, np.ndarray]:
  """The consensus weights and this process's workers' local weights, as named arrays."""
  import jax

  from stalesgd.parallel import _sharding as sharding_lib

  arrays = {}
  for name, leaf in trainer.consensus_params(state).items():
    arrays[f"{protocol_name}/consensus/{name}"] = np.asarray(leaf.addressable_data(0))
  for name, leaf in state.local_params.items():
    for worker, value in sharding_lib.local_learner_values(leaf).items():
      arrays[f"{protocol_name}/local/{name}/worker{worker}"] = value
  arrays[f"{protocol_name}/process_count"] = np.asarray(jax.process_count())
  return arrays


def main(argv: list[str]) -> None:
  parser = argparse.ArgumentParser(description=__doc__)
  multiprocess_harness.add_process_flags(parser, heartbeat_timeout=10)
  parser.add_argument("--output", help="npz file to write")
  parser.add_argument("--output_dir", help="or a directory: writes process_<id>.npz there")
  parser.add_argument("--protocols", default=",".join(PROTOCOL_CONFIGS))
  parser.add_argument("--steps", type=int, default=4)
  parser.add_argument("--seed", type=int, default=0)
  parser.add_argument("--die_process", type=int, default=None)
  parser.add_argument("--die_at_step", type=int, default=None)
  args = parser.parse_args(argv)
  if (args.output is None) == (args.output_dir is None):
    parser.error("pass exactly one of --output and --output_dir")

  import jax

  multiprocess_harness.initialize_process(args)
  die_at_step = args.die_at_step if args.process_id == args.die_process else None
  arrays = {}
  for protocol_name in args.protocols.split(","):
    trainer, state = train(protocol_name, steps=args.steps, seed=args.seed, die_at_step=die_at_step)
    arrays.update(flatten_result(protocol_name, trainer, state))
  output = args.output or os.path.join(args.output_dir, f"process_{jax.process_index()}.npz")
  np.savez(output, **arrays)
  print(f"process {args.process_id} done at {time.time():.3f}", flush=True)


if __name__ == "__main__":
  main(sys.argv[1:])
