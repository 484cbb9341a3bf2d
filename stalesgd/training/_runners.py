"""One interface over the two ways a protocol runs, so the training loop is one loop.

* `ParameterServerRunner`: hardsync, softsync, async, SSP, backup workers and
  drop-stale, emulated exactly by `stalesgd.engine` from a simulated schedule;
  a block is a run of server updates whose gradients the engine computes at
  once (`stalesgd.engine.plan_blocks`).
* `DecentralizedRunner`: synchronous all-reduce SGD, S3GD and DC-S3GD, run for
  real on the mesh by `stalesgd.decentral`; a block is one step (one update,
  to which every learner contributes).

Both implement `Runner` (a typed protocol: what the training loop may ask of
a runner) and report each block with their own metrics type, `BlockMetrics`
(the engine's) or `StepMetrics`. A runner's state is a pytree of arrays
(checkpointed as is); its blocks are fixed by the schedule (and the updates after which the run
evaluates, which start blocks), so a run stopped at a block boundary resumes exactly.

Runners take typed objects only, never the run's config: the schedule, and
for a decentralized protocol its `stalesgd.decentral.DCS3GDSettings`, both derived
from the config by `stalesgd.training._config_readers` (`simulate_schedule`,
`decentral_settings`) and gathered by `stalesgd.training.build_run`, which
calls `make_runner`. The training loop needs no layer below this one.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any, NamedTuple, Protocol, TypeVar, runtime_checkable

import jax
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec

from stalesgd import decentral
from stalesgd import engine as engine_lib
from stalesgd.decentral import DCS3GDSettings  # a decentralized runner's settings; the type build_run names
from stalesgd.engine import BlockMetrics  # the parameter-server runner's report of a block
from stalesgd.models import ModelSpec
from stalesgd.parallel import _sharding as sharding_lib
from stalesgd.parallel._dispatch import DispatchLimiter
from stalesgd.schedule import Schedule  # also the type the training loop names, through this layer
from stalesgd.training._local_runs import LocalRuns


class StepMetrics(NamedTuple):
  """What one decentralized step reports: one update, to which each of the M learners contributes.

  Attributes:
    loss: float32 [1, M], each learner's loss at its own weights and batch.
    lr_scale: float32 [1], always 1 (a decentralized protocol has no staleness rule).
    diagnostics: DC-S3GD's ``correction_ratio`` and ``displacement_norm``,
      float32 [1] each, the mean over the learners.
  """

  loss: jax.Array
  lr_scale: jax.Array
  diagnostics: Mapping[str, jax.Array]


RunnerMetrics = BlockMetrics | StepMetrics
"""A block's report: rows are updates, ``loss`` is [updates, contributions]; `PendingMetrics` reads either."""

State = TypeVar("State")


@runtime_checkable
class Runner(Protocol[State]):
  """What the training loop asks of a protocol's runner, and nothing more.

  The run is a sequence of blocks; block b covers updates
  ``block_starts[b] .. block_starts[b + 1] - 1``.
  """

  @property
  def block_starts(self) -> np.ndarray:
    """First update of every block, then the number of updates."""
    ...

  def block_at(self, updates: int) -> int:
    """The block that starts at update ``updates`` (the number of blocks once all are done).

    Raises:
      ValueError: ``updates`` is inside a block (the schedule differs from the saved run's).
    """
    ...

  def resume_at(self, updates: int) -> int:
    """The block a run continues with once ``updates`` updates are applied (`block_at`), after making ``updates``
    a block start if it was inside a block: a checkpoint written by older code under another block plan
    (`ParameterServerRunner` splits that block, `stalesgd.engine.BlockPlan.split_at`; the other runners' blocks
    are single updates). Call it once, before the first `step`, and read `block_starts` after it.

    Raises:
      ValueError: ``updates`` is outside the run.
    """
    ...

  def init(self, params: Any) -> State:
    """The state before the first update."""
    ...

  def step(self, state: State, block: int) -> tuple[State, RunnerMetrics]:
    """Runs block ``block``; its metrics stay on the device until read."""
    ...

  def params(self, state: State) -> Any:
    """The weights to evaluate and to digest."""
    ...

  def updates_done(self, state: State) -> int:
    """Updates applied so far (where a resumed run continues)."""
    ...


class ParameterServerRunner:
  """Parameter-server protocols through the exact emulator."""

  def __init__(
    self,
    model: ModelSpec,
    optimizer: optax.GradientTransformation,
    schedule: Schedule,
    batches,
    mesh: jax.sharding.Mesh,
    local_runs: LocalRuns = LocalRuns(),
    boundaries: Sequence[int] | np.ndarray = (),
  ):
    """``local_runs``: the contributions' local runs (`stalesgd.training._local_runs.local_runs_of`); by default
    one gradient per contribution. ``boundaries``: updates at which a block must start (the updates after which
    the run evaluates, `stalesgd.training._config_readers.evaluation_updates`), so that no block spans one
    (`stalesgd.engine.plan_blocks`)."""
    self.engine = engine_lib.Engine(
      model.loss_fn,
      optimizer,
      has_aux=True,
      mesh=mesh,
      local_steps=local_runs.local_steps,
      inner_optimizer=local_runs.inner_optimizer,
      reset_inner_state=local_runs.reset_inner_state,
      learner_local_steps=local_runs.learner_local_steps,
      inner_step_scale=local_runs.inner_step_scale,
    )
    self.plan = self.engine.plan(schedule, boundaries=boundaries)
    self.batches = batches

  @property
  def block_starts(self) -> np.ndarray:
    """First update of every block, then the number of updates."""
    return self.plan.block_starts

  def block_at(self, updates: int) -> int:
    return engine_lib.block_starting_at(self.block_starts, updates)

  def resume_at(self, updates: int) -> int:
    self.plan = self.plan.split_at(updates)  # the same plan unless a checkpoint of another plan ends mid-block
    return self.block_at(updates)

  def init(self, params: Any) -> engine_lib.EngineState:
    return self.engine.init(params, self.plan)

  def step(self, state: engine_lib.EngineState, block: int) -> tuple[engine_lib.EngineState, BlockMetrics]:
    return self.engine.step(state, self.plan, block, self.batches)

  @staticmethod
  def params(state: engine_lib.EngineState) -> Any:
    return state.params

  @staticmethod
  def updates_done(state: engine_lib.EngineState) -> int:
    return int(state.step)


# What DCS3GD.step measures per learner and the log records carry (mean over learners and updates):
# ||g~ - g|| / ||g||, the correction's size relative to the gradient (0 without correction), and ||D||, how
# far the consensus moved the learner's weights (docs/semantics.md, DC-S3GD).
DECENTRALIZED_DIAGNOSTICS = ("correction_ratio", "displacement_norm")


class DecentralizedRunner:
  """All-reduce protocols on real collectives, one learner per device.

  Args:
    decentral_settings: the protocol's DC-S3GD settings (S, eager updates, lambda).
    model: the network.
    optimizer: each learner's local optimizer.
    num_updates: steps in the run.
    batches: every learner's k-th mini-batch.
    mesh: the devices, one learner each.
  """

  def __init__(
    self,
    decentral_settings: DCS3GDSettings,
    model: ModelSpec,
    optimizer: optax.GradientTransformation,
    num_updates: int,
    batches,
    mesh: jax.sharding.Mesh,
  ):
    self.decentral_settings = decentral_settings
    self.mesh = sharding_lib.learner_mesh(self.decentral_settings.axis_name, devices=list(mesh.devices.flat))
    self.trainer = decentral.DCS3GD(model.loss_fn, optimizer, self.decentral_settings, self.mesh)
    # Per-learner losses live on their learners' devices (possibly other
    # processes'); a separate small program replicates them for the host, so
    # the step's only collective stays the weight all-reduce.
    self._replicate = jax.jit(
      lambda values: jax.tree.map(lambda value: value.reshape(1, -1), values),
      out_shardings=NamedSharding(self.mesh, PartitionSpec()),
    )
    self._split = NamedSharding(self.mesh, PartitionSpec(self.decentral_settings.axis_name))
    self.batches = batches
    self.num_updates = num_updates
    self._dispatch = DispatchLimiter()

  @property
  def block_starts(self) -> np.ndarray:
    """One block per step: 0, 1, ..., the number of updates."""
    return np.arange(self.num_updates + 1, dtype=np.int64)

  def block_at(self, updates: int) -> int:
    return engine_lib.block_starting_at(self.block_starts, updates)

  def resume_at(self, updates: int) -> int:
    return self.block_at(updates)  # every update starts a block

  def init(self, params: Any) -> decentral.DCS3GDState:
    return self.trainer.init(params)

  def step(self, state: decentral.DCS3GDState, block: int) -> tuple[decentral.DCS3GDState, StepMetrics]:
    learners = np.arange(self.trainer.num_learners)
    batch = sharding_lib.rows_from_batch_fn(self.batches, learners, np.full_like(learners, block), self._split)
    state, metrics = self.trainer.step(state, batch)
    self._dispatch.dispatched(metrics["loss"])
    # One update, one contribution per learner; DC-S3GD's diagnostics as their mean over the learners.
    replicated = self._replicate({name: metrics[name] for name in ("loss",) + DECENTRALIZED_DIAGNOSTICS})
    diagnostics = {name: replicated[name].mean(axis=1) for name in DECENTRALIZED_DIAGNOSTICS}
    return state, StepMetrics(replicated["loss"], np.ones(1, np.float32), diagnostics)

  def params(self, state: decentral.DCS3GDState) -> Any:
    return self.trainer.consensus_params(state)

  @staticmethod
  def updates_done(state: decentral.DCS3GDState) -> int:
    return int(state.step)


def make_runner(
  model: ModelSpec,
  optimizer: optax.GradientTransformation,
  schedule: Schedule,
  batches,
  mesh: jax.sharding.Mesh,
  *,
  decentral_settings: DCS3GDSettings | None = None,
  local_runs: LocalRuns | None = None,
  boundaries: Sequence[int] | np.ndarray = (),
) -> Runner:
  """The runner for the run's protocol: DC-S3GD's given its settings, the engine's otherwise.

  Args:
    model: the network.
    optimizer: the server optimizer (decentralized: each learner's local optimizer).
    schedule: the simulated cluster's schedule; a decentralized runner takes its number of updates.
    batches: every learner's k-th mini-batch (`stalesgd.data.LearnerBatches`).
    mesh: the devices to run on.
    decentral_settings: a decentralized protocol's settings
      (`stalesgd.training._config_readers.decentral_settings`); None for a
      parameter-server protocol.
    local_runs: a parameter-server protocol's local runs (`stalesgd.training._local_runs.local_runs_of`);
      None: one gradient per contribution.
    boundaries: updates at which a parameter-server protocol's block must start (the run's evaluations,
      `stalesgd.training._config_readers.evaluation_updates`); a decentralized runner's blocks are single
      updates, which start at every update.
  """
  if decentral_settings is not None:
    return DecentralizedRunner(decentral_settings, model, optimizer, schedule.num_updates, batches, mesh)
  return ParameterServerRunner(model, optimizer, schedule, batches, mesh, local_runs or LocalRuns(), boundaries)
