r"""``diloco`` and ``streaming_diloco`` on real collectives, one learner per device (docs/algorithms.md §7).

A block is one outer round (one update) of `stalesgd.decentral._streaming.sharded_streaming_round`: every learner
runs H local steps of the run's optimizer (its inner optimizer) on its mini-batches r H, ..., r H + H - 1, and the P
fragments of the weights are synced in turn, each all-reduce mean applied by the outer optimizer tau inner steps
later and mixed into the local weights with alpha. ``diloco`` is the corner P = 1, tau = 0, alpha = 0 (Douillard
et al., arXiv 2311.08105): the same program. The learners' local weights and inner states stay on their devices
between rounds and are part of the checkpointed state.

Reports per round: each learner's mean inner loss over its H steps; ``pseudo_gradient_norm``, the mean over
learners of :math:`\|\Delta_m\|` (over the round's syncs); and ``pseudo_gradient_agreement``, the learners' mean
pairwise dot product over their mean squared norm (`stalesgd.decentral._streaming.agreement`: 1 identical, 0
orthogonal).
"""

from __future__ import annotations

from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding, PartitionSpec

from stalesgd import engine as engine_lib
from stalesgd.decentral._streaming import StreamingSettings, StreamingState, init_streaming, sharded_streaming_round
from stalesgd.engine._emulator import FULLY_UNROLLED_LOCAL_STEPS
from stalesgd.models import ModelSpec
from stalesgd.parallel import LEARNERS_AXIS
from stalesgd.parallel import _sharding as sharding_lib
from stalesgd.parallel._dispatch import DispatchLimiter
from stalesgd.training._runners import StepMetrics

DILOCO_DIAGNOSTICS = ("pseudo_gradient_norm", "pseudo_gradient_agreement")


class DiLoCoRunner:
  """``diloco`` and ``streaming_diloco`` on a learners mesh: the `stalesgd.training._runners.Runner` interface.

  Args:
    model: the network (its loss returns ``(loss, aux)``).
    inner_optimizer: every learner's inner optimizer (the run's optimizer fields).
    outer_optimizer: OuterOpt (``config.outer``).
    num_updates: outer rounds in the run.
    batches: every learner's i-th mini-batch (`stalesgd.data.LearnerBatches`).
    mesh: the devices, one learner each.
    settings: H, and the fragments, delay and mixing of streaming DiLoCo (P = 1, tau = 0, alpha = 0: DiLoCo).
    reset_inner_state: start every round's local run from a fresh inner state.
    fragment_of_leaf: each leaf's fragment in ``jax.tree`` leaf order (`stalesgd.decentral._fragments`); None:
      leaf i in fragment i mod P.
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
    settings: StreamingSettings,
    reset_inner_state: bool = False,
    fragment_of_leaf: tuple[int, ...] | None = None,
  ):
    self.mesh = sharding_lib.learner_mesh(LEARNERS_AXIS, devices=list(mesh.devices.flat))
    self.num_learners = int(self.mesh.shape[LEARNERS_AXIS])
    self.settings = settings
    self.local_steps = local_steps = settings.local_steps
    self.reset_inner_state = reset_inner_state
    self.fragment_of_leaf = fragment_of_leaf
    self.inner_optimizer, self.outer_optimizer = inner_optimizer, outer_optimizer
    self.batches = batches
    self.num_updates = num_updates
    self._replicated = NamedSharding(self.mesh, PartitionSpec())
    self._split = NamedSharding(self.mesh, PartitionSpec(LEARNERS_AXIS))
    self._dispatch = DispatchLimiter()
    unroll = True if local_steps <= FULLY_UNROLLED_LOCAL_STEPS else 1

    def round_fn(state: StreamingState, batch):
      batch = jax.tree.map(
        lambda leaf: jax.lax.with_sharding_constraint(
          leaf.reshape((self.num_learners, local_steps) + leaf.shape[1:]), self._split
        ),
        batch,
      )
      out = sharded_streaming_round(
        model.loss_fn,
        inner_optimizer,
        outer_optimizer,
        self.mesh,
        settings,
        state,
        batch,
        reset_inner_state=reset_inner_state,
        has_aux=True,
        unroll=unroll,
        fragment_of_leaf=fragment_of_leaf,
      )
      metrics = {
        "loss": out.losses[None],
        "pseudo_gradient_norm": jnp.mean(out.pseudo_gradient_norms)[None],
        "pseudo_gradient_agreement": out.agreement[None],
      }
      return out.state, metrics

    self._round = jax.jit(round_fn, donate_argnums=0, out_shardings=(self._state_shardings(), self._replicated))

  def _state_shardings(self) -> StreamingState:
    replicated, split = self._replicated, self._split
    return StreamingState(split, split, split, split, replicated, replicated, replicated, split, split)

  @property
  def block_starts(self) -> np.ndarray:
    """One block per outer round: 0, 1, ..., the number of rounds."""
    return np.arange(self.num_updates + 1, dtype=np.int64)

  def block_at(self, updates: int) -> int:
    return engine_lib.block_starting_at(self.block_starts, updates)

  def resume_at(self, updates: int) -> int:
    return self.block_at(updates)  # every round starts a block

  def init(self, params: Any) -> StreamingState:
    params = jax.tree.map(lambda leaf: sharding_lib.global_array(jax.device_get(leaf), self._replicated), params)

    def build(params):
      return init_streaming(
        self.inner_optimizer,
        self.outer_optimizer,
        params,
        self.num_learners,
        self.settings,
        reset_inner_state=self.reset_inner_state,
        fragment_of_leaf=self.fragment_of_leaf,
      )

    return jax.jit(build, out_shardings=self._state_shardings())(params)

  def step(self, state: StreamingState, block: int) -> tuple[StreamingState, StepMetrics]:
    """Outer round ``block``: learner m reads its mini-batches block H, ..., block H + H - 1."""
    learners = np.repeat(np.arange(self.num_learners), self.local_steps)
    indices = np.tile(block * self.local_steps + np.arange(self.local_steps), self.num_learners)
    batch = sharding_lib.rows_from_batch_fn(self.batches, learners, indices, self._split)
    state, metrics = self._round(state, batch)
    self._dispatch.dispatched(metrics["loss"])
    diagnostics = {name: metrics[name] for name in DILOCO_DIAGNOSTICS}
    return state, StepMetrics(metrics["loss"], np.ones(1, np.float32), diagnostics)

  @staticmethod
  def params(state: StreamingState) -> Any:
    """The outer weights Theta (what DiLoCo evaluates): learner 0's copy (with eager updates the copies differ)."""
    return jax.tree.map(lambda leaf: leaf[0], state.outer_params)

  @staticmethod
  def updates_done(state: StreamingState) -> int:
    return int(state.step)
