"""One of two JAX processes for test_checkpoint.py's multi-process test.

Run as ``python -m tests.helpers.workers.multiprocess_checkpoint_worker PROCESS_ID PORT DIRECTORY [restore]``.
Each process owns 2 CPU devices of a 4-device ``learners`` mesh. It saves a
state sharded across both processes, restores it, then lets process 1 receive
SIGTERM twice, with JAX's preemption service on and then off: both times the
guard's Python handlers catch it and their flags are OR-ed across processes,
so both processes stop at the step of the signal (and save it).
With ``restore``, it only restores the newest readable checkpoint of
DIRECTORY (which the test may have damaged in between).
It prints one JSON line with what it saw; the test compares the two processes.
"""

from __future__ import annotations

import json
import os
import signal
import sys
import time

os.environ["JAX_PLATFORMS"] = "cpu"

import jax

jax.config.update("jax_num_cpu_devices", 2)
jax.config.update("jax_cpu_collectives_implementation", "gloo")

import numpy as np

from stalesgd.training.checkpoint import Checkpointer, PreemptionGuard

GLOBAL_SHAPE = (4, 3)
WEIGHTS_SHAPE = (4, 4096)  # large enough that damage a quarter into a data file hits array bytes


def _global_values() -> np.ndarray:
  return np.arange(np.prod(GLOBAL_SHAPE), dtype=np.float32).reshape(GLOBAL_SHAPE)


def global_weights() -> np.ndarray:
  return np.random.default_rng(0).standard_normal(WEIGHTS_SHAPE).astype(np.float32)


def _sharded_state() -> dict[str, jax.Array]:
  mesh = jax.make_mesh((4,), ("learners",))
  sharding = jax.sharding.NamedSharding(mesh, jax.P("learners"))
  arrays = {"ring": _global_values(), "weights": global_weights()}
  return {
    name: jax.make_array_from_callback(values.shape, sharding, lambda index, values=values: values[index])
    for name, values in arrays.items()
  }


def _local_shards_match(array: jax.Array, expected: np.ndarray) -> bool:
  return all(np.array_equal(np.asarray(shard.data), expected[shard.index]) for shard in array.addressable_shards)


def _stop_step(guard: PreemptionGuard, process_id: int, signal_at: int) -> int:
  for step in range(signal_at - 1, signal_at + 500):
    if process_id == 1 and step == signal_at:
      os.kill(os.getpid(), signal.SIGTERM)
    if guard.should_stop(step):
      return step
    time.sleep(0.02)
  raise AssertionError("no stop within 500 steps of the signal")


def main() -> None:
  process_id, port, directory = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
  jax.distributed.initialize(
    coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=process_id, initialization_timeout=60
  )
  state = _sharded_state()
  result: dict[str, object] = {"process_id": process_id}
  if sys.argv[4:] == ["restore"]:
    with Checkpointer(directory) as checkpointer:
      restored_state, result["restored_metadata"] = checkpointer.restore(state)
    result["restored_shards_equal"] = _local_shards_match(
      restored_state["ring"], _global_values()
    ) and _local_shards_match(restored_state["weights"], global_weights())
    print(json.dumps(result), flush=True)
    jax.distributed.shutdown()
    return
  with Checkpointer(directory) as checkpointer:
    checkpointer.save(1, state, {"next_update": 1})
    checkpointer.wait()
    restored_state, metadata = checkpointer.restore(state)
    result["restored_metadata"] = metadata
    result["restored_sharding_equal"] = restored_state["ring"].sharding == state["ring"].sharding
    result["restored_shards_equal"] = _local_shards_match(restored_state["ring"], _global_values())

    with PreemptionGuard() as guard:
      result["sync_point_stop_step"] = stop_step = _stop_step(guard, process_id, signal_at=4)
    result["saved_on_preemption"] = checkpointer.save(stop_step, state, {"next_update": stop_step}, force=True)
    checkpointer.wait()
    result["latest_step"] = checkpointer.latest_step()

  jax.config.update("jax_enable_preemption_service", False)
  with PreemptionGuard() as guard:
    result["allgather_stop_step"] = _stop_step(guard, process_id, signal_at=3)
  print(json.dumps(result), flush=True)
  jax.distributed.shutdown()


if __name__ == "__main__":
  main()
