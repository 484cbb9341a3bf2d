"""Tests for stalesgd.training.checkpoint: exact round trips, retention, atomicity, SIGTERM."""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import time

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from stalesgd.records import _run_directory as run_directory
from stalesgd.records._metrics import read_jsonl
from stalesgd.training.checkpoint import Checkpointer, CheckpointError, PreemptionGuard
from tests.helpers.workers import resume_loop_worker, sigkill_during_save_worker
from tests.helpers.workers.resume_loop_worker import train
from tests.helpers.workers.sigkill_during_save_worker import state_at

REPOSITORY_ROOT = pathlib.Path(__file__).resolve().parents[2]
# By name, not imported: importing it would set this process's JAX to 2 devices and gloo.
MULTIPROCESS_CHECKPOINT_WORKER = "tests.helpers.workers.multiprocess_checkpoint_worker"


def _learners_mesh(devices):
  return jax.sharding.Mesh(np.array(devices), ("learners",))


def _training_like_state(devices):
  """A pytree like the trainer's: params, ring buffer sharded by learner, optimizer state, key."""
  mesh = _learners_mesh(devices)
  by_learner = jax.sharding.NamedSharding(mesh, jax.P("learners"))
  replicated = jax.sharding.NamedSharding(mesh, jax.P())
  params = {
    "dense": {"kernel": jnp.linspace(-1.0, 1.0, 12, dtype=jnp.float32).reshape(3, 4) / 3.0},
    "bias_bf16": jnp.array([0.1, -2.5, 3.14159], dtype=jnp.bfloat16),
  }
  optimizer = optax.sgd(0.1, momentum=0.9)
  optimizer_state = optimizer.init(params)
  # One real step so the momentum is not all zeros.
  updates, optimizer_state = optimizer.update(jax.tree.map(jnp.ones_like, params), optimizer_state, params)
  return {
    "params": optax.apply_updates(params, updates),
    "optimizer": optimizer_state,
    "ring_buffer": jax.device_put(jnp.arange(8 * 5, dtype=jnp.float32).reshape(8, 5) * 0.37, by_learner),
    "lr_scale": jax.device_put(jnp.array([1.0, 0.5, 1 / 3], dtype=jnp.float32), replicated),
    "counts": jnp.array([3, -7, 2**31 - 1], dtype=jnp.int32),
    "staleness_histogram": np.array([5, 0, 9], dtype=np.int64),
    "key": jax.random.key(42),
  }


def _leaves_bits(tree):
  """Each leaf as (dtype, shape, raw bytes): equal bits, not just equal values."""

  def bits(leaf):
    if isinstance(leaf, jax.Array) and jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
      leaf = jax.random.key_data(leaf)
    array = np.asarray(leaf)
    return (str(array.dtype), array.shape, array.tobytes())

  return [bits(leaf) for leaf in jax.tree.leaves(tree)]


def _other_values_like(state):
  """A restore target: same structure, dtypes and shardings, different values."""

  def other(leaf):
    if isinstance(leaf, jax.Array) and jnp.issubdtype(leaf.dtype, jax.dtypes.prng_key):
      return jax.random.key(0)
    if isinstance(leaf, jax.Array):
      return jax.device_put(jnp.zeros_like(leaf), leaf.sharding)
    return np.zeros_like(leaf)

  return jax.tree.map(other, state)


def test_round_trip_is_bit_exact_and_keeps_shardings(tmp_path, devices):
  state = _training_like_state(devices)
  metadata = {
    "next_update": np.int64(1234),
    "seed": 7,
    "lr": np.float32(0.25),
    "history": [0.5, 0.25],
    "config": {"protocol": "softsync", "learners": 8},
  }
  with Checkpointer(tmp_path) as checkpointer:
    assert checkpointer.save(1234, state, metadata)
    checkpointer.wait()
    restored = checkpointer.restore(_other_values_like(state))
  assert restored is not None
  restored_state, restored_metadata = restored
  assert jax.tree.structure(restored_state) == jax.tree.structure(state)
  assert _leaves_bits(restored_state) == _leaves_bits(state)
  assert restored_state["ring_buffer"].sharding == state["ring_buffer"].sharding
  assert restored_state["lr_scale"].sharding == state["lr_scale"].sharding
  assert isinstance(restored_state["optimizer"][0], optax.TraceState)
  assert restored_metadata == {
    "next_update": 1234,
    "seed": 7,
    "lr": 0.25,
    "history": [0.5, 0.25],
    "config": {"protocol": "softsync", "learners": 8},
  }


def test_restore_uses_the_targets_sharding_not_the_saved_one(tmp_path, devices):
  mesh = _learners_mesh(devices)
  replicated = jax.device_put(jnp.arange(16.0).reshape(8, 2), jax.sharding.NamedSharding(mesh, jax.P()))
  by_learner = jax.sharding.NamedSharding(mesh, jax.P("learners"))
  with Checkpointer(tmp_path) as checkpointer:
    checkpointer.save(0, {"ring_buffer": replicated}, {})
    checkpointer.wait()
    target = {"ring_buffer": jax.ShapeDtypeStruct((8, 2), jnp.float32, sharding=by_learner)}
    restored_state, _ = checkpointer.restore(target)
  assert restored_state["ring_buffer"].sharding == by_learner
  np.testing.assert_array_equal(np.asarray(restored_state["ring_buffer"]), np.arange(16.0).reshape(8, 2))


def test_restore_returns_none_when_there_is_no_checkpoint(tmp_path):
  with Checkpointer(tmp_path / "not_yet_created") as checkpointer:
    assert checkpointer.latest_step() is None
    assert checkpointer.restore({"weights": jnp.zeros(3)}) is None


def test_latest_step_and_max_to_keep(tmp_path):
  with Checkpointer(tmp_path, max_to_keep=2) as checkpointer:
    for step in (10, 20, 30, 40):
      assert checkpointer.save(step, {"weights": jnp.full(3, float(step))}, {"next_update": step})
    checkpointer.wait()
    assert checkpointer.latest_step() == 40
    assert checkpointer.all_steps() == [30, 40]
    older_state, older_metadata = checkpointer.restore({"weights": jnp.zeros(3)}, step=30)
  np.testing.assert_array_equal(np.asarray(older_state["weights"]), [30.0, 30.0, 30.0])
  assert older_metadata == {"next_update": 30}
  assert sorted(entry.name for entry in tmp_path.iterdir()) == ["30", "40"]


def test_a_reopened_directory_resumes_where_it_stopped(tmp_path):
  with Checkpointer(tmp_path) as checkpointer:
    checkpointer.save(5, {"weights": jnp.arange(3.0)}, {"next_update": 5})
  with Checkpointer(tmp_path) as reopened:
    assert reopened.latest_step() == 5
    state, metadata = reopened.restore({"weights": jnp.zeros(3)})
  np.testing.assert_array_equal(np.asarray(state["weights"]), [0.0, 1.0, 2.0])
  assert metadata == {"next_update": 5}


def test_a_state_of_another_structure_is_refused_as_another_version_and_kept(tmp_path):
  """A checkpoint of today's format whose tree differs from the run's (a field that no migration of its format
  renames) is neither restored nor set aside as damaged: the error names its writer, and the files stay."""
  with Checkpointer(tmp_path) as checkpointer:
    for step in (5, 10):
      checkpointer.save(step, {"weights": jnp.arange(3.0), "applied_scale": jnp.ones(())}, {"next_update": step})
  with Checkpointer(tmp_path) as reopened:
    with pytest.raises(
      CheckpointError,
      match=r"written by stalesgd \S+ \(checkpoint format \d+\), holds a state of another structure than this "
      r"run's \(keys only in the checkpoint: \['applied_scale'\]; only in this run: \['lr_scale'\]\)",
    ):
      reopened.restore({"weights": jnp.zeros(3), "lr_scale": jnp.ones(())})
  assert sorted(entry.name for entry in tmp_path.iterdir()) == ["10", "5"]


def test_save_interval_steps_and_force(tmp_path):
  state = {"weights": jnp.zeros(2)}
  with Checkpointer(tmp_path, save_interval_steps=3) as checkpointer:
    assert [step for step in range(1, 8) if checkpointer.should_save(step)] == [3, 6]
    assert not checkpointer.save(1, state, {})
    assert checkpointer.save(3, state, {})
    assert checkpointer.save(4, state, {}, force=True)
    # Saving a step that exists (e.g. on preemption right after a regular save) is a no-op.
    assert not checkpointer.save(4, state, {}, force=True)
    checkpointer.wait()
    assert checkpointer.all_steps() == [3, 4]


def test_save_interval_seconds(tmp_path):
  state = {"weights": jnp.zeros(2)}
  with Checkpointer(tmp_path, save_interval_seconds=2) as checkpointer:
    assert checkpointer.save(1, state, {})
    checkpointer.wait()
    assert not checkpointer.save(2, state, {})
    time.sleep(2.05)
    assert checkpointer.save(3, state, {})
    checkpointer.wait()
    assert checkpointer.all_steps() == [1, 3]


def test_leftover_temporary_directory_is_ignored_and_removed(tmp_path):
  with Checkpointer(tmp_path) as checkpointer:
    checkpointer.save(1, {"weights": jnp.ones(4)}, {"next_update": 1})
  # What a save interrupted before orbax's final rename leaves behind.
  leftover = tmp_path / "2.orbax-checkpoint-tmp"
  (leftover / "state.orbax-checkpoint-tmp").mkdir(parents=True)
  (leftover / "state.orbax-checkpoint-tmp" / "garbage").write_bytes(b"\x00half written")
  with Checkpointer(tmp_path) as reopened:
    assert reopened.latest_step() == 1
    state, metadata = reopened.restore({"weights": jnp.zeros(4)})
  np.testing.assert_array_equal(np.asarray(state["weights"]), np.ones(4))
  assert metadata == {"next_update": 1}
  assert not leftover.exists()


@pytest.mark.slow
def test_a_save_killed_by_sigkill_is_never_restored(tmp_path):
  environment = dict(os.environ, PYTHONPATH=str(REPOSITORY_ROOT))
  completed = subprocess.run(
    [sys.executable, "-m", sigkill_during_save_worker.__name__, str(tmp_path)],
    env=environment,
    capture_output=True,
    text=True,
    timeout=120,
    check=False,
  )
  assert completed.returncode == -signal.SIGKILL, completed.stderr[-3000:]
  # The kill really hit the second save half-way: its temporary directory is there.
  assert (tmp_path / "2.orbax-checkpoint-tmp").is_dir()
  assert not (tmp_path / "2").exists()
  with Checkpointer(tmp_path) as checkpointer:
    assert checkpointer.latest_step() == 1
    state, metadata = checkpointer.restore({"weights": jax.ShapeDtypeStruct(state_at(1)["weights"].shape, jnp.float32)})
    assert metadata == {"next_update": 1}
    np.testing.assert_array_equal(np.asarray(state["weights"]), state_at(1)["weights"])
    # The run goes on and can save step 2 for real.
    assert checkpointer.save(2, state_at(2), {"next_update": 2})
    checkpointer.wait()
    assert checkpointer.all_steps() == [1, 2]


def _run_resume_loop(workdir, num_steps, *signal_arguments):
  environment = dict(os.environ, PYTHONPATH=str(REPOSITORY_ROOT))
  completed = subprocess.run(
    [sys.executable, "-m", resume_loop_worker.__name__, str(workdir), str(num_steps), *signal_arguments],
    env=environment,
    capture_output=True,
    text=True,
    timeout=120,
    check=False,
  )
  outcome = json.loads(completed.stdout.strip().splitlines()[-1]) if completed.stdout.strip() else None
  return completed.returncode, outcome, completed.stderr[-3000:]


@pytest.mark.slow
def test_killed_then_preempted_run_resumes_to_the_uninterrupted_result(tmp_path):
  reference = train(tmp_path / "uninterrupted", 10)
  workdir = tmp_path / "interrupted"
  returncode, _, stderr = _run_resume_loop(workdir, 10, "SIGKILL", "7")
  assert returncode == -signal.SIGKILL, stderr
  # Metrics of step 7 were written after the last checkpoint; the resumed run must drop them.
  assert read_jsonl(workdir / run_directory.METRICS)[-1]["step"] == 7
  returncode, outcome, stderr = _run_resume_loop(workdir, 10, "SIGTERM", "8")
  assert (returncode, outcome) == (0, {"ended": "preempted", "step": 8}), stderr
  returncode, outcome, stderr = _run_resume_loop(workdir, 10)
  assert returncode == 0, stderr
  assert outcome == reference
  assert read_jsonl(workdir / run_directory.METRICS) == read_jsonl(tmp_path / "uninterrupted" / run_directory.METRICS)


@pytest.mark.parametrize(
  "arguments, message",
  [
    ({"max_to_keep": 0}, "max_to_keep=0; allowed: None or an integer >= 1"),
    ({"save_interval_steps": 1.5}, r"save_interval_steps=1\.5; allowed: None or an integer >= 1"),
    ({"save_interval_seconds": -1}, "save_interval_seconds=-1; allowed: None or an integer >= 1"),
  ],
)
def test_bad_options_raise(tmp_path, arguments, message):
  with pytest.raises(ValueError, match=message):
    Checkpointer(tmp_path, **arguments)


def test_bad_save_and_restore_arguments_raise(tmp_path):
  with Checkpointer(tmp_path) as checkpointer:
    with pytest.raises(ValueError, match="step=-1; allowed: an integer >= 0"):
      checkpointer.save(-1, {"weights": jnp.zeros(1)}, {})
    with pytest.raises(ValueError, match=r"metadata\['config'\] = <object"):
      checkpointer.save(0, {"weights": jnp.zeros(1)}, {"config": object()})
    for reserved in ("_checksums", "_checkpoint_format", "_written_by"):
      with pytest.raises(ValueError, match=f"metadata keys \\['{reserved}'\\] are reserved"):
        checkpointer.save(0, {"weights": jnp.zeros(1)}, {reserved: 1})
    with pytest.raises(ValueError, match="metadata has type list"):
      checkpointer.save(0, {"weights": jnp.zeros(1)}, [1])
    checkpointer.save(0, {"weights": jnp.zeros(1)}, {})
    checkpointer.wait()
    with pytest.raises(ValueError, match=r"step = 7 is not a saved checkpoint; allowed: one of \[0\]"):
      checkpointer.restore({"weights": jnp.zeros(1)}, step=7)


def test_preemption_guard_turns_sigterm_into_a_flag_and_restores_the_handler():
  previous_handler = signal.getsignal(signal.SIGTERM)
  with PreemptionGuard() as guard:
    assert not guard.should_stop(0)
    os.kill(os.getpid(), signal.SIGTERM)
    assert guard.should_stop(1)
    assert guard.received_signal == signal.SIGTERM
  assert signal.getsignal(signal.SIGTERM) == previous_handler
  with pytest.raises(RuntimeError, match="outside its `with` block"):
    guard.should_stop(2)


def test_preemption_guard_with_several_signals():
  def sentinel_handler(signal_number, frame):
    del signal_number, frame

  previous = signal.signal(signal.SIGUSR1, sentinel_handler)
  try:
    with PreemptionGuard(signals=(signal.SIGTERM, signal.SIGUSR1)) as guard:
      os.kill(os.getpid(), signal.SIGUSR1)
      assert guard.should_stop(0)
      assert guard.received_signal == signal.SIGUSR1
    assert signal.getsignal(signal.SIGUSR1) is sentinel_handler
  finally:
    signal.signal(signal.SIGUSR1, previous)


@pytest.mark.parametrize(
  "signals, message",
  [
    ((), r"signals = \(\)"),
    ((signal.SIGKILL,), "not SIGKILL"),
    ((12345,), "signals contains 12345"),
  ],
)
def test_preemption_guard_rejects_bad_signals(signals, message):
  with pytest.raises(ValueError, match=message):
    PreemptionGuard(signals=signals)


def _free_port() -> int:
  with socket.socket() as probe:
    probe.bind(("127.0.0.1", 0))
    return probe.getsockname()[1]


def _run_checkpoint_workers(directory: pathlib.Path, *mode: str) -> tuple[list[dict], list[str]]:
  """Both processes of `multiprocess_checkpoint_worker`: their JSON results and their stderr."""
  port = _free_port()
  environment = dict(os.environ, PYTHONPATH=str(REPOSITORY_ROOT))
  environment.pop("XLA_FLAGS", None)
  workers = [
    subprocess.Popen(
      [sys.executable, "-m", MULTIPROCESS_CHECKPOINT_WORKER, str(process_id), str(port), str(directory), *mode],
      env=environment,
      stdout=subprocess.PIPE,
      stderr=subprocess.PIPE,
      text=True,
    )
    for process_id in (0, 1)
  ]
  try:
    outputs = [worker.communicate(timeout=180) for worker in workers]
  except subprocess.TimeoutExpired:
    for worker in workers:
      worker.kill()
    tails = [f"process {index}:\n{worker.communicate()[1][-3000:]}" for index, worker in enumerate(workers)]
    pytest.fail(f"checkpoint workers {mode or ('save',)} did not end within 180 s:\n" + "\n".join(tails))
  finally:
    for worker in workers:  # all of them: a survivor of a failed peer would block in a collective
      worker.kill()
  results = []
  for worker, (stdout, stderr) in zip(workers, outputs):
    assert worker.returncode == 0, stderr[-3000:]
    results.append(json.loads(stdout.strip().splitlines()[-1]))
  return results, [stderr for _, stderr in outputs]


@pytest.mark.slow
@pytest.mark.multiprocess
def test_a_read_error_on_one_process_only_falls_back_on_both_together(tmp_path):
  """Process 1's shard files of the newest step emptied: orbax's read raises on process 1 before the barrier its
  restore ends in, while process 0 reads its own shards and waits there. Both must fall back to the older step
  together (process 1 joins that barrier; without it, process 0 saw a barrier name mismatch, then both hung)."""
  _run_checkpoint_workers(tmp_path)
  for data in (tmp_path / "4" / "state" / "ocdbt.process_1" / "d").iterdir():
    data.write_bytes(b"")
  results, errors = _run_checkpoint_workers(tmp_path, "restore")
  for result in results:
    assert result["restored_metadata"] == {"next_update": 1} and result["restored_shards_equal"]
  assert "checkpoint 4" in errors[1] and "falling back" in errors[1], errors[1][-3000:]
  assert "another process could not read its part" in errors[0], errors[0][-3000:]
  assert (tmp_path / "4.unreadable").is_dir()


@pytest.mark.slow
@pytest.mark.multiprocess
def test_two_processes_save_restore_and_agree_on_preemption(tmp_path, devices):
  """Also: a bit flipped in a shard only process 1 holds makes both processes fall back to the older step."""
  results, _ = _run_checkpoint_workers(tmp_path)
  for process_id, result in enumerate(results):
    assert result["process_id"] == process_id
    assert result["restored_metadata"] == {"next_update": 1}
    assert result["restored_sharding_equal"] and result["restored_shards_equal"]
    assert result["saved_on_preemption"]
    assert result["latest_step"] == result["sync_point_stop_step"]
  # Both processes stop at the step where process 1 got SIGTERM, whether JAX's preemption service is on or off.
  assert results[0]["sync_point_stop_step"] == results[1]["sync_point_stop_step"] == 4
  assert results[0]["allgather_stop_step"] == results[1]["allgather_stop_step"] == 3
  # Shards written by the two processes form the whole array, readable by one process.
  with Checkpointer(tmp_path) as checkpointer:
    replicated = jax.sharding.NamedSharding(_learners_mesh(devices), jax.P())
    state, _ = checkpointer.restore(
      {
        "ring": jax.ShapeDtypeStruct((4, 3), jnp.float32, sharding=replicated),
        "weights": jax.ShapeDtypeStruct((4, 4096), jnp.float32, sharding=replicated),
      },
      step=1,
    )
  np.testing.assert_array_equal(np.asarray(state["ring"]), np.arange(12, dtype=np.float32).reshape(4, 3))

  # One bit flipped in the data process 1 wrote for the newest step: only process 1 can see it (its shards'
  # checksum); both processes must fall back to step 1 together. Process 1's data file holds its two weight
  # shards (compressed, about 15 kB each) one after the other, plus the small ring chunk and index node, in the
  # order the asynchronous writes finished: the middle of the file is the boundary between the two shards, where a
  # flipped bit can land in the second one's compression header, so TensorStore fails to decode it before the
  # checksum is reached. A quarter of the way in is inside the first shard's compressed bytes, whatever the
  # order: it decodes to other values, which only the checksum catches.
  [data] = sorted((tmp_path / "4" / "state" / "ocdbt.process_1" / "d").iterdir(), key=lambda path: path.stat().st_size)[
    -1:
  ]
  with open(data, "r+b") as file:
    file.seek(data.stat().st_size // 4)
    byte = file.read(1)
    file.seek(data.stat().st_size // 4)
    file.write(bytes([byte[0] ^ 1]))
  results, errors = _run_checkpoint_workers(tmp_path, "restore")
  for result in results:
    assert result["restored_metadata"] == {"next_update": 1} and result["restored_shards_equal"]
  assert "held by process 1 do not match the checksum" in errors[1], errors[1][-3000:]
  assert "another process could not read its part" in errors[0], errors[0][-3000:]
  assert (tmp_path / "4.unreadable").is_dir()
