"""One interface over the two ways a protocol runs, so the training loop is one loop.

* `ParameterServerRunner`: hardsync, softsync, async, SSP, backup workers and
  drop-stale, emulated exactly by `stalesgd.engine` from a simulated schedule;
  a block is one wave (one or more server updates).
* `DecentralizedRunner`: synchronous all-reduce SGD, S3GD and DC-S3GD, run for
  real on the mesh by `stalesgd.decentral`; a block is one step (one update,
  to which every worker contributes).

A runner's state is a pytree of arrays (checkpointed as is); its blocks are
fixed by the schedule, so a run stopped at a block boundary resumes exactly.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import ml_collections
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec

from stalesgd import decentral
from stalesgd import distributed
from stalesgd import engine as engine_lib
from stalesgd import sharding as sharding_lib
from stalesgd.config import DECENTRALIZED_PROTOCOLS
from stalesgd.dispatch import DispatchLimiter
from stalesgd.models import ModelSpec
from stalesgd.schedule import Schedule


class BlockMetrics(NamedTuple):
  """Device arrays for the updates of one block (rows past the block's updates are padding).

  Attributes:
    loss: float32 [R, c], the loss of each contribution.
    lr_scale: float32 [R], the learning-rate scale the staleness rule applied.
  """

  loss: jax.Array
  lr_scale: jax.Array


class ParameterServerRunner:
  """Parameter-server protocols through the exact emulator."""

  def __init__(self, model: ModelSpec, optimizer: optax.GradientTransformation, schedule: Schedule,
               batches, mesh: jax.sharding.Mesh):
    self.engine = engine_lib.Engine(model.loss_fn, optimizer, has_aux=True, mesh=mesh)
    self.plan = self.engine.plan(schedule)
    self.batches = batches

  @property
  def block_starts(self) -> np.ndarray:
    """First update of every block, then the number of updates."""
    return self.plan.wave_starts

  def init(self, params: Any) -> engine_lib.EngineState:
    return self.engine.init(params, self.plan)

  def step(self, state: engine_lib.EngineState, block: int) -> tuple[engine_lib.EngineState, BlockMetrics]:
    state, metrics = self.engine.step(state, self.plan, block, self.batches)
    return state, BlockMetrics(metrics.loss, metrics.applied_scale)

  @staticmethod
  def params(state: engine_lib.EngineState) -> Any:
    return state.params

  @staticmethod
  def updates_done(state: engine_lib.EngineState) -> int:
    return int(state.step)


class DecentralizedRunner:
  """All-reduce protocols on real collectives, one worker per device."""

  def __init__(self, config: ml_collections.ConfigDict, model: ModelSpec, optimizer: optax.GradientTransformation,
               num_updates: int, batches, mesh: jax.sharding.Mesh):
    overrides = {"staleness": config.allreduce_staleness, "eager": config.eager_updates}
    if config.protocol == "allreduce_sync":
      overrides = {}
    if config.protocol == "dcs3gd" and config.delay_compensation != "none":
      overrides.update(dc_lambda=config.dc_lambda, lambda_mode=config.delay_compensation,
                       mean_square_decay=config.dc_decay)
    self.protocol_config = decentral.config_for_protocol(config.protocol, **overrides)
    self.mesh = distributed.worker_mesh(self.protocol_config.axis_name, devices=list(mesh.devices.flat))
    self.trainer = decentral.DCS3GD(model.loss_fn, optimizer, self.protocol_config, self.mesh)
    # Per-worker losses live on their workers' devices (possibly other
    # processes'); a separate small program replicates them for the host, so
    # the step's only collective stays the weight all-reduce.
    self._replicate_loss = jax.jit(lambda loss: loss.reshape(1, -1),
                                   out_shardings=NamedSharding(self.mesh, PartitionSpec()))
    self._split = NamedSharding(self.mesh, PartitionSpec(self.protocol_config.axis_name))
    self.batches = batches
    self.num_updates = num_updates
    self._dispatch = DispatchLimiter()

  @property
  def block_starts(self) -> np.ndarray:
    return np.arange(self.num_updates + 1, dtype=np.int64)

  def init(self, params: Any) -> decentral.DCS3GDState:
    return self.trainer.init(params)

  def step(self, state: decentral.DCS3GDState, block: int) -> tuple[decentral.DCS3GDState, BlockMetrics]:
    workers = np.arange(self.trainer.num_workers)
    batch = sharding_lib.rows_from_batch_fn(self.batches, workers, np.full_like(workers, block), self._split)
    state, metrics = self.trainer.step(state, batch)
    self._dispatch.dispatched(metrics["loss"])
    loss = self._replicate_loss(metrics["loss"])  # one update, one contribution per worker
    return state, BlockMetrics(loss, np.ones(1, np.float32))

  def params(self, state: decentral.DCS3GDState) -> Any:
    return self.trainer.consensus_params(state)

  @staticmethod
  def updates_done(state: decentral.DCS3GDState) -> int:
    return int(state.step)


def make_runner(config: ml_collections.ConfigDict, model: ModelSpec, optimizer: optax.GradientTransformation,
                schedule: Schedule, batches, mesh: jax.sharding.Mesh):
  """The runner for the config's protocol."""
  if config.protocol in DECENTRALIZED_PROTOCOLS:
    return DecentralizedRunner(config, model, optimizer, schedule.num_updates, batches, mesh)
  return ParameterServerRunner(model, optimizer, schedule, batches, mesh)
