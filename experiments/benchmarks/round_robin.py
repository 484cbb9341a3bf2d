r"""A specialised emulator of deterministic round-robin schedules: the upper reference for the engine.

With ``config.timing.jitter = "deterministic"`` every learner takes the same
time per gradient, so async and n-softsync settle into a fixed rotation: update
u applies the gradients of the same learners in turn, each computed at the
weights of a fixed number of updates ago (async at lambda learners:
sigma = lambda - 1 for every update after the first lambda). Knowing that, an
emulator needs none of the engine's generality (blocks of any shape, slots
spread over devices, parameter-sharded server state, gradients moved between
devices); it can be the obvious sequential program, compiled whole:

* one process per core, each emulating the schedule on its own single device
  (no cross-device traffic at all);
* the last sigma_max + 1 weight versions in a ring, one stacked array per
  parameter, read and written in place by dynamic index;
* 8 updates per compiled call, as straight-line code (XLA:CPU runs
  convolutions inside a ``lax.scan`` over the updates badly: the figure is in
  docs/performance.md; 4 per call ran slower, 16 no faster and took longer to
  compile): per update, the c gradients at their ring versions, then
  the server optimizer, then the ring write;
* the next call's mini-batches prepared on the host while the device runs the
  current one (dispatch is asynchronous).

It applies exactly the updates the engine applies (same optimizer, same
mini-batches, same schedule; `tests/benchmarks/test_training_benchmark.py`
checks the weights agree), so the gradients-per-second of P such processes on P
cores is the throughput a general engine must match on the same cores. It is a
throughput reference: P independent runs side by side, where the engine runs
one run over all cores.

This module is for the benchmarks only (``experiments.benchmarks.training``).
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable
from typing import Any

import numpy as np

PyTree = Any


def check_round_robin(schedule) -> None:
  """Raises unless every update after the first sigma_max has the same staleness row.

  That is the deterministic rotation this emulator is the reference for
  (async at lambda learners: sigma = lambda - 1 throughout).
  """
  first = int(schedule.max_staleness)
  steady = schedule.staleness[first:]
  if steady.shape[0] < 2 or not np.all(steady == steady[0]):
    raise ValueError(
      "the schedule is not a deterministic round-robin rotation (its staleness varies after update "
      f"{first}); the specialised emulator is the reference only for config.timing.jitter='deterministic' "
      "async and n-softsync schedules"
    )


class RoundRobinEmulator:
  """The schedule's updates on one device, ``updates_per_call`` of them per compiled call.

  ``run_chunk`` executes the next ``updates_per_chunk`` updates (a multiple of
  ``updates_per_call``), the unit the benchmark times.
  """

  def __init__(
    self,
    loss_fn: Callable,
    optimizer,
    schedule,
    batch_fn: Callable,
    params: PyTree,
    *,
    updates_per_chunk: int,
    updates_per_call: int = 8,
    has_aux: bool = True,
  ):
    import jax
    import jax.numpy as jnp
    import optax

    self.schedule, self.batch_fn = schedule, batch_fn
    self.updates_per_call = max(1, min(int(updates_per_call), int(updates_per_chunk)))
    self.calls_per_chunk = max(1, int(updates_per_chunk) // self.updates_per_call)
    self.updates_per_chunk = self.calls_per_chunk * self.updates_per_call
    self.depth = int(schedule.max_staleness) + 1
    depth = self.depth
    value_and_grad = jax.value_and_grad(loss_fn, has_aux=has_aux)

    def update(carry, timestamp, staleness, learner, batch):
      params, opt_state, ring, step = carry
      grads = []
      for k in range(timestamp.shape[0]):  # the c contributions
        weights = jax.tree_util.tree_map(lambda leaf: leaf[timestamp[k] % depth], ring)
        slot_batch = jax.tree_util.tree_map(lambda leaf: leaf[k], batch)
        grads.append(value_and_grad(weights, slot_batch)[1])
      stacked = jax.tree_util.tree_map(lambda *leaves: jnp.stack(leaves), *grads)
      stale = jax.tree_util.tree_map(lambda leaf: leaf[timestamp % depth], ring)
      updates, opt_state = optimizer.update(
        stacked, opt_state, params, staleness=staleness, stale_params=stale, learner=learner
      )
      params = optax.apply_updates(params, updates)
      step = step + 1
      ring = jax.tree_util.tree_map(lambda buffer, leaf: buffer.at[step % depth].set(leaf), ring, params)
      return params, opt_state, ring, step

    def call(carry, timestamp, staleness, learner, batch):
      # Straight-line code, not lax.scan: XLA:CPU runs convolutions inside a
      # while loop much slower (docs/performance.md has the figure).
      for row in range(timestamp.shape[0]):
        carry = update(
          carry, timestamp[row], staleness[row], learner[row], jax.tree_util.tree_map(lambda leaf: leaf[row], batch)
        )
      return carry

    self._call = jax.jit(call, donate_argnums=0)
    params = jax.tree_util.tree_map(lambda leaf: jnp.array(leaf, copy=True), params)  # the calls donate it
    ring = jax.tree_util.tree_map(lambda leaf: jnp.broadcast_to(leaf, (depth,) + leaf.shape).copy(), params)
    self.carry = (params, optimizer.init(params), ring, jnp.int32(0))
    self.next_update = 0
    self._prepared: tuple[int, Any] | None = None

  def _inputs(self, first: int):
    """The device inputs of updates [first, first + updates_per_call)."""
    import jax

    stop = first + self.updates_per_call
    if stop > self.schedule.num_updates:
      raise RuntimeError(f"the schedule has {self.schedule.num_updates} updates; asked for up to {stop}")
    rows = slice(first, stop)
    learner, batch_index = self.schedule.learner[rows], self.schedule.batch_index[rows]
    batch = self.batch_fn(learner.reshape(-1), batch_index.reshape(-1))
    batch = {key: value.reshape(learner.shape + value.shape[1:]) for key, value in batch.items()}
    return jax.device_put(
      (
        self.schedule.timestamp[rows].astype(np.int32),
        self.schedule.staleness[rows].astype(np.int32),
        learner.astype(np.int32),
        batch,
      )
    )

  def run_call(self) -> None:
    """Dispatches the next call, then prepares the following one while the device works."""
    first = self.next_update
    inputs = self._prepared[1] if self._prepared and self._prepared[0] == first else self._inputs(first)
    self.carry = self._call(self.carry, *inputs)
    self.next_update = first + self.updates_per_call
    following = self.next_update + self.updates_per_call
    self._prepared = (
      (self.next_update, self._inputs(self.next_update)) if following <= self.schedule.num_updates else None
    )

  def run_chunk(self) -> None:
    for _ in range(self.calls_per_chunk):
      self.run_call()

  def params(self) -> PyTree:
    return self.carry[0]

  def wait(self) -> None:
    import jax

    jax.block_until_ready(self.carry)


# ------------------------------------------------------------------ one process per core


def _worker(connection, core: int | None, build: Callable[[], RoundRobinEmulator]) -> None:
  """A process emulating on one core; answers ("run", chunks) with the seconds they took."""
  if core is not None:
    os.sched_setaffinity(0, {core})
  os.environ["JAX_PLATFORMS"] = "cpu"
  import jax

  jax.config.update("jax_num_cpu_devices", 1)
  try:
    emulator = build()
    emulator.run_chunk()  # compiles
    emulator.wait()
    connection.send(("ready", emulator.updates_per_chunk))
    while True:
      command, chunks = connection.recv()
      if command == "stop":
        break
      start = time.perf_counter()
      for _ in range(chunks):
        emulator.run_chunk()
      emulator.wait()
      connection.send(("done", time.perf_counter() - start))
  except Exception as error:  # reported to the parent, which raises
    connection.send(("error", f"{type(error).__name__}: {error}"))
  finally:
    connection.close()


class EmulatorPool:
  """``processes`` emulator processes, each pinned to its own core, run in lockstep.

  ``build`` must be picklable (a module-level function or a `functools.partial`
  of one) and construct the `RoundRobinEmulator` inside the child process.
  """

  def __init__(self, build: Callable[[], RoundRobinEmulator], processes: int):
    """Starts the processes; they build and compile in the background until `wait_ready`."""
    context = multiprocessing.get_context("spawn")
    cores = sorted(os.sched_getaffinity(0))
    self._connections, self._processes = [], []
    for index in range(processes):
      parent, child = context.Pipe()
      core = cores[index % len(cores)] if processes <= len(cores) else None
      process = context.Process(target=_worker, args=(child, core, build), daemon=True)
      process.start()
      self._connections.append(parent)
      self._processes.append(process)
    self.updates_per_chunk: int | None = None

  def wait_ready(self) -> int:
    """Waits until every process has compiled; returns the updates in one of their chunks."""
    if self.updates_per_chunk is None:
      replies = [self._receive(connection) for connection in self._connections]
      self.updates_per_chunk = replies[0]
    return self.updates_per_chunk

  @staticmethod
  def _receive(connection):
    kind, value = connection.recv()
    if kind == "error":
      raise RuntimeError(f"a round-robin emulator process failed: {value}")
    return value

  def run(self, chunks: int) -> float:
    """Wall seconds for every process to run ``chunks`` chunks at the same time."""
    self.wait_ready()
    start = time.perf_counter()
    for connection in self._connections:
      connection.send(("run", chunks))
    for connection in self._connections:
      self._receive(connection)
    return time.perf_counter() - start

  def close(self) -> None:
    for connection in self._connections:
      try:
        connection.send(("stop", 0))
      except (BrokenPipeError, OSError):
        pass
    for process in self._processes:
      process.join(timeout=30)
      if process.is_alive():
        process.kill()


def build_from_config(config, updates_per_chunk: int) -> RoundRobinEmulator:
  """The emulator of a training config's run: the data, model, optimizer and schedule
  `stalesgd.training.train_and_evaluate` would use. With `functools.partial` it is the
  picklable ``build`` an `EmulatorPool` needs."""
  from stalesgd.training._build_run import build_run

  run = build_run(config)
  check_round_robin(run.schedule)
  return RoundRobinEmulator(
    run.model.loss_fn, run.optimizer, run.schedule, run.batches, run.params, updates_per_chunk=updates_per_chunk
  )
