"""A miniature training loop wired the way stalesgd's trainer uses checkpoints and metrics.

Run as ``python -m tests.helpers.workers.resume_loop_worker WORKDIR NUM_STEPS [SIGNAL_NAME STEP]``: it
resumes from WORKDIR if there is a checkpoint, trains to NUM_STEPS, and (when
asked) sends itself SIGNAL_NAME right after finishing STEP. On SIGTERM it saves
and exits with status 0; SIGKILL kills it wherever it is. It prints one JSON
line: how it ended and the final weights' bytes. test_checkpoint.py checks that
interrupted and resumed runs end with the same bits and the same metrics as an
uninterrupted one.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import sys

os.environ["JAX_PLATFORMS"] = "cpu"

import jax
import jax.numpy as jnp

from stalesgd.records._metrics import MetricWriter
from stalesgd.training.checkpoint import Checkpointer, PreemptionGuard

TARGET = jnp.arange(4, dtype=jnp.float32)


@jax.jit
def train_step(weights: jax.Array, key: jax.Array, step: jax.Array) -> tuple[jax.Array, jax.Array]:
  noisy_gradient = weights - TARGET + 0.3 * jax.random.normal(jax.random.fold_in(key, step), weights.shape)
  return weights - 0.1 * noisy_gradient, jnp.mean(noisy_gradient**2)


def train(workdir: pathlib.Path, num_steps: int, signal_at: tuple[int, int] | None = None) -> dict[str, object]:
  state = {"weights": jnp.zeros(4, jnp.float32), "key": jax.random.key(0)}
  completed = 0
  with (
    Checkpointer(workdir / "checkpoints", save_interval_steps=3) as checkpointer,
    MetricWriter(workdir, enabled=True) as writer,
    PreemptionGuard() as guard,
  ):
    restored = checkpointer.restore(state)
    if restored is not None:
      state, metadata = restored
      completed = metadata["completed_steps"]
      writer.truncate_after(completed)
    for step in range(completed + 1, num_steps + 1):
      weights, loss = train_step(state["weights"], state["key"], step)
      state = {**state, "weights": weights}
      writer.write_scalars(step, {"train_loss": loss})
      if signal_at is not None and step == signal_at[1]:
        os.kill(os.getpid(), signal_at[0])
      if guard.should_stop(step):
        checkpointer.save(step, state, {"completed_steps": step}, force=True)
        return {"ended": "preempted", "step": step}
      checkpointer.save(step, state, {"completed_steps": step}, force=step == num_steps)
  return {"ended": "completed", "weights": jax.device_get(state["weights"]).tobytes().hex()}


def main() -> None:
  signal_at = (int(getattr(signal, sys.argv[3])), int(sys.argv[4])) if len(sys.argv) > 3 else None
  print(json.dumps(train(pathlib.Path(sys.argv[1]), int(sys.argv[2]), signal_at)), flush=True)


if __name__ == "__main__":
  main()
