r"""``diloco``: synchronous DiLoCo rounds on real collectives, one learner per device (docs/algorithms.md §7).

A block is one outer round (one update): every learner m runs H local steps of the run's optimizer (its inner
optimizer) from the replicated outer weights :math:`\theta` on its mini-batches r H, ..., r H + H - 1, then
:math:`\bar\Delta = \mathrm{pmean}_m \Delta_m` and :math:`\theta \leftarrow \theta + \mathrm{OuterOpt}(\bar\Delta)`
(`stalesgd.decentral._diloco.sharded_diloco_round`; Douillard et al., arXiv 2311.08105, Algorithm 1). The
learners' inner states stay on their devices between rounds (or restart every round with ``reset_inner_state``)
and are part of the checkpointed state.

Reports per round: each learner's mean inner loss over its H steps, and ``pseudo_gradient_norm``, the mean over
learners of :math:`\|\Delta_m\|`.
"""

from __future__ import annotations

from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec

from stalesgd import engine as engine_lib
from stalesgd.decentral._diloco import sharded_diloco_round
from stalesgd.engine._emulator import FULLY_UNROLLED_LOCAL_STEPS
from stalesgd.models import ModelSpec
from stalesgd.parallel import LEARNERS_AXIS
from stalesgd.parallel import _sharding as sharding_lib
from stalesgd.parallel._dispatch import DispatchLimiter
from stalesgd.training._runners import StepMetrics
from stalesgd.transforms._local_run import init_inner_states

DILOCO_DIAGNOSTICS = ("pseudo_gradient_norm",)


class DiLoCoState(NamedTuple):
  """A ``diloco`` run's state; a pytree, checkpointed as is.

  Attributes:
    params: :math:`\theta`, the outer weights (replicated).
    outer_state: the outer optimizer's state (replicated).
    inner_states: every learner's inner-optimizer state, leaves ``[M, ...]`` split over the learners (``()`` with
      ``reset_inner_state``).
    step: int32 scalar, the outer rounds done.
  """

  params: Any
  outer_state: Any
  inner_states: Any
  step: jax.Array


class DiLoCoRunner:
  """``diloco`` on a learners mesh: the `stalesgd.training._runners.Runner` interface.

  Args:
    model: the network (its loss returns ``(loss, aux)``).
    inner_optimizer: every learner's inner optimizer (the run's optimizer fields).
    outer_optimizer: OuterOpt (``config.outer``).
    num_updates: outer rounds in the run.
    batches: every learner's i-th mini-batch (`stalesgd.data.LearnerBatches`).
    mesh: the devices, one learner each.
    local_steps: H.
    reset_inner_state: start every local run from a fresh inner state.
  """

  def __init__(
    self,
    model: ModelSpec,
    inner_optimizer: optax.GradientTransformation,
    outer_optimizer: optax.GradientTransformation,
    num_updates: int,
    batches,
    mesh: jax.sharding.Mesh,
    *,
    local_steps: int,
    reset_inner_state: bool = False,
  ):
    self.mesh = sharding_lib.learner_mesh(LEARNERS_AXIS, devices=list(mesh.devices.flat))
    self.num_learners = int(self.mesh.shape[LEARNERS_AXIS])
    self.local_steps = local_steps
    self.reset_inner_state = reset_inner_state
    self.inner_optimizer, self.outer_optimizer = inner_optimizer, outer_optimizer
    self.batches = batches
    self.num_updates = num_updates
    self._replicated = NamedSharding(self.mesh, PartitionSpec())
    self._split = NamedSharding(self.mesh, PartitionSpec(LEARNERS_AXIS))
    self._dispatch = DispatchLimiter()
    unroll = True if local_steps <= FULLY_UNROLLED_LOCAL_STEPS else 1

    def round_fn(state: DiLoCoState, batch):
      batch = jax.tree.map(
        lambda leaf: jax.lax.with_sharding_constraint(
          leaf.reshape((self.num_learners, local_steps) + leaf.shape[1:]), self._split
        ),
        batch,
      )
      out = sharded_diloco_round(
        model.loss_fn,
        inner_optimizer,
        outer_optimizer,
        self.mesh,
        state.params,
        state.outer_state,
        state.inner_states,
        batch,
        reset_inner_state=reset_inner_state,
        has_aux=True,
        unroll=unroll,
      )
      squares = sum(
        jnp.sum(jnp.square(leaf.astype(jnp.float32)), axis=tuple(range(1, leaf.ndim)))
        for leaf in jax.tree.leaves(out.pseudo_gradients)
      )
      metrics = {"loss": jnp.mean(out.losses, axis=1)[None], "pseudo_gradient_norm": jnp.mean(jnp.sqrt(squares))[None]}
      inner = () if reset_inner_state else out.inner_states
      return DiLoCoState(out.params, out.outer_state, inner, state.step + 1), metrics

    self._round = jax.jit(round_fn, donate_argnums=0, out_shardings=(self._state_shardings(), self._replicated))

  def _state_shardings(self):
    return DiLoCoState(self._replicated, self._replicated, self._split, self._replicated)

  @property
  def block_starts(self) -> np.ndarray:
    """One block per outer round: 0, 1, ..., the number of rounds."""
    return np.arange(self.num_updates + 1, dtype=np.int64)

  def block_at(self, updates: int) -> int:
    return engine_lib.block_starting_at(self.block_starts, updates)

  def init(self, params: Any) -> DiLoCoState:
    params = jax.tree.map(lambda leaf: sharding_lib.global_array(jax.device_get(leaf), self._replicated), params)

    def build(params):
      inner = () if self.reset_inner_state else init_inner_states(self.inner_optimizer, params, self.num_learners)
      return DiLoCoState(params, self.outer_optimizer.init(params), inner, jnp.int32(0))

    return jax.jit(build, out_shardings=self._state_shardings())(params)

  def step(self, state: DiLoCoState, block: int) -> tuple[DiLoCoState, StepMetrics]:
    """Outer round ``block``: learner m reads its mini-batches block H, ..., block H + H - 1."""
    learners = np.repeat(np.arange(self.num_learners), self.local_steps)
    indices = np.tile(block * self.local_steps + np.arange(self.local_steps), self.num_learners)
    batch = sharding_lib.rows_from_batch_fn(self.batches, learners, indices, self._split)
    state, metrics = self._round(state, batch)
    self._dispatch.dispatched(metrics["loss"])
    diagnostics = {name: metrics[name] for name in DILOCO_DIAGNOSTICS}
    return state, StepMetrics(metrics["loss"], np.ones(1, np.float32), diagnostics)

  @staticmethod
  def params(state: DiLoCoState) -> Any:
    return state.params

  @staticmethod
  def updates_done(state: DiLoCoState) -> int:
    return int(state.step)
