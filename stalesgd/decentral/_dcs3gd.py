"""DC-S3GD: decentralized stale-synchronous SGD with delay compensation, on real collectives.

M learners, one per device along a ``learners`` mesh axis, each keep local
weights, a local optimizer state and a queue of the last S updates whose
all-reduce has not completed. There is no parameter server: every step
all-reduces (averages) a weight update, and the all-reduce of the update
carried in the queue is issued in the same jitted step as the next
forward/backward with no data dependency on it, so XLA can overlap
communication with computation.

Per-learner step t (Rigazzi, arXiv 1911.02516; **reconstructed**: the paper's
text could not be read, this is the simplest algorithm consistent with its
abstract and with secondary sources, docs/algorithms.md section 3)::

    g   = grad L_i(w_i)                                 # at the local weights
    Dbar = mean_j Delta_j(t-S)                          # all-reduce issued this step
    wbar <- wbar + Dbar                                 # consensus weights
    D   = Dbar - omega * Delta_i(t-S)                   # consensus minus what w_i assumed
    g~  = g + lambda * g * g * D                        # first-order correction
    Delta_i(t) = OPT(g~)                                # local optimizer (momentum is local)
    w_i <- w_i + D + omega * Delta_i(t)                 # = wbar + omega * own pending updates

with omega = 1 (DC-S3GD) or omega = 1/M (eager updates, Kale et al., arXiv
2502.12996: Delta~ = Dbar(t-1) + (Delta_i(t) - Delta_i(t-1))/M, which is
the same local weights for S = 1). The first S steps average zero updates
(the queue starts empty), so D = 0 there. lambda (`DCS3GDSettings.lambda_mode`):

* ``constant``: lambda = lambda_0;
* ``adaptive``: lambda = lambda_0 / sqrt(MeanSquare + eps) elementwise with
  MeanSquare <- m MeanSquare + (1-m) g*g kept per learner (DC-ASGD-a, Zheng et
  al., arXiv 1609.08326); MeanSquare includes the current g;
* ``layerwise`` (**reconstructed**, attributed to the DC-S3GD paper by a
  secondary source, lambda_0 = 0.2): lambda = lambda_0 ||g|| / ||g*g*D|| per
  parameter leaf (a kernel and its bias are separate "layers"), so the
  correction's norm is lambda_0 ||g||.

The correction itself is `stalesgd.transforms.delay_compensated_gradient`.
Staleness S = 0 skips the queue: the step's own update is all-reduced after
the backward pass (synchronous all-reduce SGD, identical to SGD with batch
M*mu). dc_lambda = 0 skips the correction (S3GD). For S >= 2 the all-reduce of
Delta(t-S) is issued at step t, where a hand-written implementation would issue
it at t-S+1 and let it span S steps; the arithmetic is identical, only a single
step of compute is available to hide it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from stalesgd.decentral import _hlo as hlo
from stalesgd.decentral._settings import DCS3GDSettings
from stalesgd.transforms import delay_compensated_gradient, update_mean_square
from stalesgd.transforms._hyperparameters import value_at

LossFn = Callable[[Any, Any], tuple[jax.Array, Any]]


class DCS3GDState(NamedTuple):
  """Everything DC-S3GD carries between steps (a pytree of arrays: checkpoint it as is).

  Per-learner fields have a leading axis of size M sharded along the learners
  axis, so each learner's slice lives on its device.
  """

  step: jax.Array  # int32 [], replicated: steps taken (t).
  consensus_params: Any  # replicated: initial weights plus every averaged update applied so far.
  local_params: Any  # [M, ...]: the weights each learner computes its gradient at.
  opt_state: Any  # [M, ...]: each learner's optimizer state.
  in_flight: Any  # [M, S, ...]: own updates Delta_i(t-S..t-1) not yet averaged, oldest first; None if S = 0.
  mean_square: Any  # [M, ...]: per-learner MeanSquare of the adaptive lambda; None otherwise.


class DCS3GD:
  """DC-S3GD (and S3GD, synchronous all-reduce SGD, eager updates) over a mesh axis.

  Example::

    mesh = stalesgd.parallel.learner_mesh()             # one learner per device
    trainer = DCS3GD(loss_fn, optax.sgd(0.1, momentum=0.9), DCS3GDSettings(), mesh)
    state = trainer.init(params)
    for step in range(num_steps):
      batch = stalesgd.parallel.stack_learners(lambda w: batch_for(seed, w, step), mesh)
      state, metrics = trainer.step(state, batch)          # batch leaves are [M, mu, ...]
    final = trainer.consensus_params(state)

  ``metrics`` are per learner (leading axis M, sharded) and are never reduced
  inside the step, because a metric all-reduce would be merged with the weight
  all-reduce and serialize it behind the backward pass; `mean_metrics` reduces
  them in a separate program.
  """

  def __init__(self, loss_fn: LossFn, optimizer: optax.GradientTransformation, settings: DCS3GDSettings, mesh: Mesh):
    """Builds the trainer; nothing is compiled until the first step.

    Args:
      loss_fn: ``loss_fn(params, batch) -> (loss, aux)`` for one learner's
        batch (leaves ``[mu, ...]``); ``aux`` is any pytree of arrays (or None),
        returned per learner in the metrics.
      optimizer: the local optimizer (any optax transform, e.g.
        ``optax.sgd(lr, momentum=0.9)``); its updates are what is averaged.
      settings: the protocol's hyperparameters.
      mesh: a mesh with ``settings.axis_name`` among its axes; one learner per
        device along it.

    Raises:
      ValueError: the mesh has no ``settings.axis_name`` axis.
    """
    if settings.axis_name not in mesh.axis_names:
      raise ValueError(f"mesh axes {tuple(mesh.axis_names)} do not include settings.axis_name={settings.axis_name!r}")
    self.loss_fn = loss_fn
    self.optimizer = optimizer
    self.settings = settings
    self.mesh = mesh
    self.num_learners = int(mesh.shape[settings.axis_name])
    self._replicated = NamedSharding(mesh, PartitionSpec())
    # keep_unused fixes the entry parameters to the flattened (state, batch)
    # leaves, which `overlap_report` relies on; donation updates state in place.
    self._step = jax.jit(self._sharded_step, donate_argnums=0, keep_unused=True)
    self._mean_metrics = jax.jit(lambda metrics: jax.tree.map(lambda leaf: jnp.mean(leaf, axis=0), metrics))

  # ---------------------------------------------------------------- state

  def _state_specs(self, state: DCS3GDState) -> DCS3GDState:
    learner = PartitionSpec(self.settings.axis_name)
    per_learner = lambda tree: jax.tree.map(lambda _: learner, tree)
    return DCS3GDState(
      step=PartitionSpec(),
      consensus_params=jax.tree.map(lambda _: PartitionSpec(), state.consensus_params),
      local_params=per_learner(state.local_params),
      opt_state=per_learner(state.opt_state),
      in_flight=per_learner(state.in_flight),
      mean_square=per_learner(state.mean_square),
    )

  def _build_state(self, params: Any) -> DCS3GDState:
    learners, staleness = self.num_learners, self.settings.staleness
    per_learner = lambda tree: jax.tree.map(lambda leaf: jnp.broadcast_to(leaf, (learners,) + leaf.shape), tree)
    update_shapes = jax.eval_shape(self.optimizer.update, params, self.optimizer.init(params), params)[0]
    in_flight = None
    if staleness > 0:
      in_flight = jax.tree.map(lambda leaf: jnp.zeros((learners, staleness) + leaf.shape, leaf.dtype), update_shapes)
    mean_square = None
    if self.settings.lambda_mode == "adaptive" and self.settings.corrects:
      mean_square = jax.tree.map(lambda leaf: jnp.zeros((learners,) + leaf.shape, leaf.dtype), params)
    return DCS3GDState(
      step=jnp.zeros([], jnp.int32),
      consensus_params=params,
      local_params=per_learner(params),
      opt_state=per_learner(self.optimizer.init(params)),
      in_flight=in_flight,
      mean_square=mean_square,
    )

  def _shardings(self, state: DCS3GDState) -> DCS3GDState:
    to_sharding = lambda spec: NamedSharding(self.mesh, spec)
    return jax.tree.map(to_sharding, self._state_specs(state), is_leaf=lambda node: isinstance(node, PartitionSpec))

  def state_shardings(self, params: Any) -> DCS3GDState:
    """The `NamedSharding` of every state leaf (e.g. to restore a checkpoint onto the mesh)."""
    return self._shardings(jax.eval_shape(self._build_state, params))

  def abstract_state(self, params: Any) -> DCS3GDState:
    """Shapes, dtypes and shardings of the state, without allocating it (a restore target)."""
    abstract = jax.eval_shape(self._build_state, params)
    return jax.tree.map(
      lambda leaf, sharding: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding),
      abstract,
      self._shardings(abstract),
    )

  def init(self, params: Any) -> DCS3GDState:
    """The state before step 0: every learner's local weights and the consensus equal ``params``.

    Args:
      params: the initial weights, identical on every process (host arrays or
        jax arrays).

    Returns:
      The state, sharded over the mesh.
    """
    params = jax.device_put(jax.device_get(params), self._replicated)
    return jax.jit(self._build_state, out_shardings=self.state_shardings(params))(params)

  # ---------------------------------------------------------------- step

  def step(self, state: DCS3GDState, batch: Any) -> tuple[DCS3GDState, dict[str, Any]]:
    """One synchronous step of every learner (jitted once per batch shape).

    Args:
      state: the current state (donated: do not use it afterwards).
      batch: a pytree whose leaves are ``[M, mu, ...]``, sharded along the
        learners axis (see `stalesgd.parallel.stack_learners`).

    Returns:
      ``(new_state, metrics)``. ``metrics`` (every leaf ``[M, ...]``, per
      learner): ``loss``, ``aux`` (the loss function's), ``correction_ratio``
      (||g~ - g|| / ||g||, 0 without correction) and ``displacement_norm``
      (||D||, how far the consensus moved the local weights).

    Raises:
      ValueError: a batch leaf's leading axis is not the number of learners.
    """
    for path, leaf in jax.tree_util.tree_flatten_with_path(batch)[0]:
      if jnp.ndim(leaf) == 0 or jnp.shape(leaf)[0] != self.num_learners:
        raise ValueError(
          f"batch{jax.tree_util.keystr(path)} has shape {jnp.shape(leaf)}; its leading axis "
          f"must be the number of learners, {self.num_learners} ([learners, mu, ...])"
        )
    return self._step(state, batch)

  def lower(self, state: DCS3GDState, batch: Any) -> jax.stages.Lowered:
    """The lowered step program, e.g. to inspect its compiled HLO."""
    return self._step.lower(state, batch)

  def _sharded_step(self, state: DCS3GDState, batch: Any) -> tuple[DCS3GDState, dict[str, Any]]:
    state_specs = self._state_specs(state)
    learner = PartitionSpec(self.settings.axis_name)
    step_fn = jax.shard_map(
      self._learner_step,
      mesh=self.mesh,
      in_specs=(state_specs, jax.tree.map(lambda _: learner, batch)),
      out_specs=(state_specs, learner),
    )
    return step_fn(state, batch)

  def _learner_step(self, state: DCS3GDState, batch: Any) -> tuple[DCS3GDState, dict[str, Any]]:
    """One learner's step, inside shard_map (per-learner leaves have a leading axis of 1)."""
    unstack = lambda tree: jax.tree.map(lambda leaf: leaf[0], tree)
    restack = lambda tree: jax.tree.map(lambda leaf: leaf[None], tree)
    local = state._replace(
      local_params=unstack(state.local_params),
      opt_state=unstack(state.opt_state),
      in_flight=unstack(state.in_flight),
      mean_square=unstack(state.mean_square),
    )
    if self.settings.staleness == 0:
      new_local, grads, corrected, displacement, (loss, aux) = self._synchronous_update(local, unstack(batch))
    else:
      new_local, grads, corrected, displacement, (loss, aux) = self._stale_update(local, unstack(batch))
    metrics = {
      "loss": loss,
      "aux": aux,
      "correction_ratio": _global_norm(jax.tree.map(jnp.subtract, corrected, grads))
      / jnp.maximum(_global_norm(grads), jnp.finfo(jnp.float32).tiny),
      "displacement_norm": _global_norm(displacement),
    }
    new_state = new_local._replace(
      step=state.step + 1,
      local_params=restack(new_local.local_params),
      opt_state=restack(new_local.opt_state),
      in_flight=restack(new_local.in_flight),
      mean_square=restack(new_local.mean_square),
    )
    return new_state, restack(metrics)

  def _gradient(self, params: Any, batch: Any) -> tuple[tuple[jax.Array, Any], Any]:
    # Local weights are sharded per learner (device-varying), so this gradient is
    # the learner's own, not already summed over the axis as it would be for
    # replicated weights.
    return jax.value_and_grad(self.loss_fn, has_aux=True)(params, batch)

  def _synchronous_update(self, local: DCS3GDState, batch: Any):
    """S = 0: the step's own update is averaged after the backward pass."""
    loss_and_aux, grads = self._gradient(local.local_params, batch)
    updates, opt_state = self.optimizer.update(grads, local.opt_state, local.local_params)
    averaged = jax.lax.pmean(updates, self.settings.axis_name)
    new_local = local._replace(
      consensus_params=_add(local.consensus_params, averaged),
      local_params=_add(local.local_params, averaged),
      opt_state=opt_state,
    )
    return new_local, grads, grads, jax.tree.map(jnp.zeros_like, averaged), loss_and_aux

  def _stale_update(self, local: DCS3GDState, batch: Any):
    """S >= 1: average the oldest in-flight update, correct this step's gradient toward it."""
    axis_name = self.settings.axis_name
    # Issued before the backward pass and reading only carried state: XLA may
    # run it concurrently with the forward/backward below.
    oldest = jax.tree.map(lambda queue: queue[0], local.in_flight)
    averaged = jax.lax.pmean(oldest, axis_name)
    loss_and_aux, grads = self._gradient(local.local_params, batch)
    own_weight = 1.0 / self.num_learners if self.settings.eager else 1.0
    displacement = jax.tree.map(lambda mean, own: mean - own_weight * own, averaged, oldest)
    corrected, mean_square = self._correct(grads, displacement, local.mean_square, local.step)
    updates, opt_state = self.optimizer.update(corrected, local.opt_state, local.local_params)
    local_params = jax.tree.map(
      lambda param, jump, update: param + jump + own_weight * update, local.local_params, displacement, updates
    )
    in_flight = jax.tree.map(lambda queue, update: jnp.concatenate([queue[1:], update[None]]), local.in_flight, updates)
    new_local = local._replace(
      consensus_params=_add(local.consensus_params, averaged),
      local_params=local_params,
      opt_state=opt_state,
      in_flight=in_flight,
      mean_square=mean_square,
    )
    return new_local, grads, corrected, displacement, loss_and_aux

  def _correct(self, grads: Any, displacement: Any, mean_square: Any, step: jax.Array) -> tuple[Any, Any]:
    """g~ = g + lambda g g D with the configured lambda; returns (g~, updated MeanSquare)."""
    settings = self.settings
    if not settings.corrects:
      return grads, mean_square
    dc_lambda = value_at(settings.dc_lambda, step)
    if settings.lambda_mode == "adaptive":
      mean_square = update_mean_square(mean_square, grads, settings.mean_square_decay)
      corrected = delay_compensated_gradient(grads, displacement, dc_lambda, mean_square=mean_square, eps=settings.eps)
      return corrected, mean_square
    corrected = delay_compensated_gradient(
      grads, displacement, dc_lambda, layerwise=settings.lambda_mode == "layerwise"
    )
    return corrected, mean_square

  # ---------------------------------------------------------------- reading the state

  def consensus_params(self, state: DCS3GDState) -> Any:
    """The consensus weights (replicated): the initial weights plus all averaged updates so far.

    With S >= 1 the last S steps' updates are still in flight; the consensus
    excludes them, and every learner's local weights equal it plus the learner's
    own pending updates.
    """
    return state.consensus_params

  def mean_metrics(self, metrics: dict[str, Any]) -> dict[str, Any]:
    """Averages per-learner metrics over learners, in a program separate from the step."""
    return self._mean_metrics(metrics)

  def overlap_report(self, state: DCS3GDState, batch: Any) -> dict[str, Any]:
    """Checks the compiled step for overlap-readiness (see `stalesgd.decentral._hlo`).

    Args:
      state: a state (only its shapes and shardings are used).
      batch: a batch (likewise).

    Returns:
      A dict: ``all_reduces`` (the count in the compiled step),
      ``update_all_reduce_reads`` (names of the state/batch leaves the weight
      all-reduce transitively reads), ``overlap_ready`` (exactly one
      all-reduce, reading only the in-flight queue), ``asynchronous`` and
      ``compute_while_in_flight`` (from the compiled schedule; asynchronous
      collectives exist on GPU/TPU, not on CPU).
    """
    paths = [path for path, _ in jax.tree_util.tree_flatten_with_path((state, batch))[0]]
    queue_parameters = {
      number
      for number, path in enumerate(paths)
      if path[:2] == (jax.tree_util.SequenceKey(0), jax.tree_util.GetAttrKey("in_flight"))
    }
    compiled_text = self.lower(state, batch).compile().as_text()
    found = hlo.all_reduces(compiled_text)
    read = sorted({number for reduce in found for number in reduce.parameters})
    reads = [jax.tree_util.keystr(paths[number]) for number in read]
    ready = len(found) == 1 and bool(read) and set(read) <= queue_parameters
    return {
      "all_reduces": len(found),
      "update_all_reduce_reads": reads,
      "overlap_ready": ready,
      "asynchronous": any(reduce.asynchronous for reduce in found),
      "compute_while_in_flight": sum(len(reduce.compute_while_in_flight) for reduce in found),
    }


def _add(tree: Any, other: Any) -> Any:
  return jax.tree.map(jnp.add, tree, other)


def _global_norm(tree: Any) -> jax.Array:
  leaves = jax.tree.leaves(tree)
  if not leaves:
    return jnp.zeros([], jnp.float32)
  return jnp.sqrt(sum(jnp.sum(jnp.square(leaf.astype(jnp.float32))) for leaf in leaves))
