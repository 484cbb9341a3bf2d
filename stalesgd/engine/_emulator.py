"""Exact execution of a `Schedule` in one jitted SPMD program per block.

Given a loss, initial weights, a server optimizer and a schedule, the engine
produces exactly the weights the emulated parameter-server cluster would have
produced (docs/design.md, *Engine*):

1. the schedule is cut into blocks (`stalesgd.engine._blocks`): runs of updates
   whose contributions were all computed at weights that already exist;
2. one jitted step per block computes every contribution of the block in
   parallel, each at its own past weights read from the ring buffer
   (`stalesgd.engine._ring_buffer`), with its learner's own mini-batch; the
   slots are spread over the mesh's learner axis with `jax.shard_map`. A
   contribution is a local run of H inner steps (`Engine`'s ``local_steps``,
   docs/algorithms.md §7), by default one step that yields the gradient;
3. the same step applies the block's updates in order with a loop over
   the precomputed gradients (cheap element-wise work): for update u it calls
   the server optimizer on the stack of its c contributions,
   ``optimizer.update(grads[c, ...], opt_state, w_u, staleness=sigma[c],
   stale_params=w_j[c, ...], learner=learner[c])``, applies the update and
   writes w_{u+1} into the ring.

The server state (weights, ring buffer, optimizer state) is sharded over
parameters along the learner axis (`Engine.state_shardings`), as ZeRO/FSDP
shard training state: each device applies 1/N of every update and holds 1/N of
the history. Between the two phases each slot's stale weights travel to its
device and its gradient back to the parameter shards (all-to-alls); nothing is
summed across devices, so results are bit-identical on any number of devices
or processes.

The optimizer receives *stacks* (the convention of `stalesgd.transforms`):
per-contribution transforms (staleness weights, delay compensation) act on each
contribution, `stalesgd.average_contributions()` reduces the stack, and the
server part (momentum, learning rate) sees one gradient. The engine checks this
before compiling: an optimizer that does not reduce the stack is rejected.

Mini-batches come from a caller-supplied ``batch_fn(learner, batch_index)``
(numpy int arrays of the same shape [S]) returning a pytree of arrays with
leading axis S, deterministic in (seed, learner, k): the engine never holds the
data set, and in a multi-process run each process builds only the slots of its
own devices.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import NamedSharding
from jax.sharding import PartitionSpec as P

from stalesgd import _validation as validation
from stalesgd import transforms
from stalesgd.engine import _ring_buffer as ring_buffer
from stalesgd.engine._blocks import Block, BlockPlan, plan_blocks
from stalesgd.parallel import _sharding as sharding_lib
from stalesgd.parallel._dispatch import DispatchLimiter
from stalesgd.schedule._schedule_arrays import Schedule
from stalesgd.transforms._local_run import agreement, init_inner_states, local_run

PyTree = Any
LossFn = Callable[[PyTree, PyTree], Any]
BatchFn = Callable[[np.ndarray, np.ndarray], PyTree]
InnerStepScale = Callable[[np.ndarray, int], np.ndarray]
"""``scale(offsets, steps) -> float [S, steps]``: the factor of inner step i of each slot's local run, whose first
step is step ``offsets[s]`` of its data stream (int64 [S]); the engine multiplies inner update u_i by it."""

GRADIENT_STRATEGIES = ("unroll", "vmap")
UNROLLED_SLOTS_PER_DEVICE = 4  # gradient slots one device unrolls per block (see `Engine.plan`)
FULLY_UNROLLED_LOCAL_STEPS = 4  # a local run of at most this many steps is unrolled (see `Engine`'s local_unroll)


def _device_varying(tree: PyTree, axis: str) -> PyTree:
  """``tree`` with every leaf that is the same on all devices of ``axis`` (inside ``jax.shard_map``) cast to
  device-varying, the others as they are."""
  varying = lambda leaf: axis in jax.typeof(leaf).manual_axis_type.varying
  cast = lambda leaf: leaf if varying(leaf) else jax.lax.pcast(leaf, axis, to="varying")
  return jax.tree_util.tree_map(cast, tree)


class EngineState(NamedTuple):
  """Everything the emulated server holds; a pytree, checkpointable as is.

  Attributes:
    params: current server weights w_t.
    opt_state: server optimizer state.
    ring: past weights w_{t-depth+1..t} (`RingBuffer`).
    step: int32 scalar, t, the number of updates applied.
    inner_states: every learner's inner-optimizer state, leaves ``[lambda, ...]``,
      kept from its previous local run (`Engine`'s ``inner_optimizer``); ``()``
      when there is none to keep (a stateless inner optimizer such as the
      default SGD at rate 1, or ``reset_inner_state``).
  """

  params: PyTree
  opt_state: PyTree
  ring: ring_buffer.RingBuffer
  step: jax.Array
  inner_states: PyTree = ()


LOCAL_RUN_DIAGNOSTICS = ("pseudo_gradient_norm", "pseudo_gradient_agreement")
"""What the engine measures per update when contributions are local runs (H > 1): the mean over the update's c
contributions of ||Delta||, and their `stalesgd.transforms._local_run.agreement` (1 when c = 1), as DiLoCo's
rounds report them. Not measured for H = 1, whose compiled block stays as it was."""


class BlockMetrics(NamedTuple):
  """Per-update measurements of one block (device arrays; rows past the block's
  ``num_updates`` are padding).

  Attributes:
    loss: float32 [R, c], loss of each contribution at its own weights and batch.
    lr_scale: float32 [R], learning-rate scale the staleness transform
      applied to the update (`stalesgd.transforms.lr_scale`; 1 without one).
    diagnostics: more float32 [R] per-update measurements, by name, that the
      log records carry as their mean over the records' updates (DC-S3GD's
      ``correction_ratio`` and ``displacement_norm``; the engine's
      `LOCAL_RUN_DIAGNOSTICS` when contributions are local runs of H > 1
      steps), or None.
  """

  loss: jax.Array
  lr_scale: jax.Array
  diagnostics: Mapping[str, jax.Array] | None = None


def default_gradient_strategy(backend: str) -> str:
  """How one device computes its several gradient slots.

  On CPU, unrolled calls are fast while `vmap` over weights turns convolutions
  into grouped convolutions, which XLA:CPU runs slower (docs/performance.md,
  *Traps measured on XLA:CPU*). On accelerators vmap is assumed to be the
  better choice (one batched kernel instead of many small launches, and a
  smaller program to compile); the GPU suite (experiments/benchmarks/gpu_suite.py)
  measures both, and has not run on a GPU yet.
  """
  return "unroll" if backend == "cpu" else "vmap"


class Engine:
  """Executes schedules exactly, at close to the cost of synchronous training
  (the README's *Performance* section; experiments/benchmarks/engine.py).

  Example::

    schedule = stalesgd.schedule.simulate("softsync", learners=8, n=4, num_updates=1000, seed=0)
    engine = Engine(loss_fn, stalesgd.staleness_aware_sgd(0.1, rule="inverse"))
    plan = engine.plan(schedule)
    state = engine.init(params, plan)
    state = engine.run(state, plan, batch_fn)
  """

  def __init__(
    self,
    loss_fn: LossFn,
    optimizer: optax.GradientTransformation,
    *,
    has_aux: bool = False,
    mesh: jax.sharding.Mesh | None = None,
    axis_name: str | None = None,
    gradient_strategy: str | None = None,
    local_steps: int = 1,
    inner_optimizer: optax.GradientTransformation | None = None,
    reset_inner_state: bool = False,
    local_unroll: int | bool | None = None,
    learner_local_steps: np.ndarray | None = None,
    inner_step_scale: InnerStepScale | None = None,
  ):
    r"""Every contribution is a local run (`stalesgd.transforms._local_run.local_run`,
    docs/algorithms.md §7): the learner runs H = ``local_steps`` steps of
    ``inner_optimizer`` from the weights it pulled, step i of its r-th
    contribution on its mini-batch r H + i, and contributes
    :math:`\Delta = -\sum_i u_i`, minus the sum of its inner updates, which the
    server optimizer receives as the contribution's gradient. The defaults, H = 1
    and inner SGD at rate 1 without state, make :math:`\Delta` the gradient bit
    for bit: today's parameter-server protocols, on the same code path.

    Args:
    loss_fn: ``loss_fn(params, batch) -> loss`` (or ``(loss, aux)`` with
      ``has_aux=True``) for one contribution's mini-batch.
    optimizer: the server optimizer; receives stacks of c contributions
      with extra args ``staleness``, ``stale_params`` and ``learner`` and
      must reduce the stack (e.g. end its per-contribution part with
      `stalesgd.average_contributions()`).
    has_aux: whether ``loss_fn`` returns ``(loss, aux)``.
    mesh: a 1-D mesh; by default all devices of all processes.
    axis_name: the mesh axis gradients are spread over (the mesh's only axis
      by default).
    gradient_strategy: "unroll" (one local run per slot) or "vmap";
      by default the faster one for the backend.
    local_steps: H >= 1, inner steps per contribution.
    inner_optimizer: the learners' inner optimizer, any optax transformation;
      by default ``optax.sgd(1.0)`` (no state).
    reset_inner_state: start every local run from ``inner_optimizer.init`` of
      the pulled weights (the asynchronous DiLoCo notebook) instead of the
      state the learner kept from its previous contribution (DiLoCo). A kept,
      non-empty state is part of `EngineState` (``inner_states``), and then a
      block holds at most one contribution per learner (`plan`).
    learner_local_steps: dynamic local updates: H_m <= H per learner
      (`stalesgd.schedule._durations.dynamic_local_steps`); learner m's k-th
      contribution takes H_m steps on its mini-batches k H_m, ..., k H_m + H_m - 1
      (the program runs H, the steps past H_m masked). None: H for everyone.
    local_unroll: ``jax.lax.scan``'s ``unroll`` for the H steps; by default all
      of them for H <= `FULLY_UNROLLED_LOCAL_STEPS` (one program without a loop,
      faster for convolutions on the CPU), else 1.
    inner_step_scale: an `InnerStepScale`, multiplying each inner update by a
      factor of the step's place in its data stream (an inner learning-rate
      schedule keyed to a data shard's step count, as the asynchronous DiLoCo
      notebook's cosine); None: no factor (the program is the one without).
    """
    self.loss_fn = loss_fn
    self.optimizer = optimizer
    self.has_aux = has_aux
    self.mesh = sharding_lib.learner_mesh() if mesh is None else mesh
    if axis_name is None:
      if len(self.mesh.axis_names) != 1:
        raise ValueError(f"mesh has axes {self.mesh.axis_names}: pass axis_name")
      axis_name = self.mesh.axis_names[0]
    if axis_name not in self.mesh.axis_names:
      raise ValueError(f"axis_name={axis_name!r} is not an axis of the mesh {self.mesh.axis_names}")
    self.axis_name = axis_name
    self.num_devices = int(self.mesh.shape[axis_name])
    strategy = gradient_strategy or default_gradient_strategy(self.mesh.devices.flat[0].platform)
    self.gradient_strategy = validation.check_choice("gradient_strategy", strategy, GRADIENT_STRATEGIES)
    self.local_steps = validation.check_integer("local_steps", local_steps, low=1)
    self.inner_optimizer = optax.sgd(1.0) if inner_optimizer is None else inner_optimizer
    self.reset_inner_state = validation.check_bool("reset_inner_state", reset_inner_state)
    self.learner_local_steps = None
    if learner_local_steps is not None:
      steps = np.asarray(learner_local_steps, np.int64)
      if steps.ndim != 1 or steps.min(initial=1) < 1 or steps.max(initial=1) > self.local_steps:
        validation.reject(
          "learner_local_steps", steps.tolist(), f"one H_m in [1, local_steps={self.local_steps}] per learner"
        )
      self.learner_local_steps = steps
    self.inner_step_scale = inner_step_scale
    self.local_unroll = (
      (True if self.local_steps <= FULLY_UNROLLED_LOCAL_STEPS else 1) if local_unroll is None else local_unroll
    )
    # Whether learners keep an inner state between contributions: a state with arrays, not reset. The structure
    # of optax states does not depend on the weights' shapes, so a one-element vector tells.
    probe = jax.eval_shape(self.inner_optimizer.init, jax.ShapeDtypeStruct((1,), jnp.float32))
    self.keeps_inner_states = not self.reset_inner_state and bool(jax.tree_util.tree_leaves(probe))
    self._replicated = NamedSharding(self.mesh, P())
    self._split = NamedSharding(self.mesh, P(axis_name))
    self.diagnose = self.local_steps > 1  # `LOCAL_RUN_DIAGNOSTICS`
    self._block_step = jax.jit(self._block_step_impl, donate_argnums=0)
    self._dispatch = DispatchLimiter()

  # ---------------------------------------------------------------- sharding
  def _parameter_sharding(self, shape: tuple[int, ...], leading: int = 0) -> NamedSharding:
    """How a server-state leaf is laid out: split over the learner axis along
    its largest parameter dimension divisible by the number of devices
    (replicated if none is), after ``leading`` unsplit axes (ring depth,
    contribution stack).

    The server state is updated once per applied gradient; sharding it over
    parameters (as ZeRO/FSDP do) makes each device apply 1/N of every update
    and hold 1/N of the ring buffer, instead of N redundant copies.
    """
    spec = [None] * len(shape)
    candidates = [
      (size, axis)
      for axis, size in enumerate(shape)
      if axis >= leading and size >= self.num_devices and size % self.num_devices == 0
    ]
    if candidates and self.num_devices > 1:
      spec[max(candidates)[1]] = self.axis_name
    return NamedSharding(self.mesh, P(*spec))

  def state_shardings(self, state: EngineState) -> EngineState:
    """The sharding of every leaf of an engine state (or of its abstract shapes)."""
    by_shape = lambda leading: lambda leaf: self._parameter_sharding(np.shape(leaf), leading)
    return EngineState(
      params=jax.tree_util.tree_map(by_shape(0), state.params),
      opt_state=jax.tree_util.tree_map(by_shape(0), state.opt_state),
      ring=jax.tree_util.tree_map(by_shape(1), state.ring),
      step=self._replicated,
      inner_states=jax.tree_util.tree_map(by_shape(0), state.inner_states),
    )

  # ---------------------------------------------------------------- planning
  def plan(self, schedule: Schedule, **options) -> BlockPlan:
    """Cuts ``schedule`` into blocks for this engine's mesh (see `plan_blocks`).

    Unless ``max_slots_per_device`` is given, on a CPU backend unrolled gradients
    are capped at `UNROLLED_SLOTS_PER_DEVICE` per device and block: on XLA:CPU a device's
    gradients run slower per gradient the more of them one program unrolls, and
    compile longer (docs/performance.md, *What was changed*). `vmap` batches its slots into one kernel, and an
    accelerator runs many small kernels in one program well, so both keep
    `plan_blocks`'s wider default.
    """
    if self.gradient_strategy == "unroll" and self.mesh.devices.flat[0].platform == "cpu":
      options.setdefault("max_slots_per_device", UNROLLED_SLOTS_PER_DEVICE)

    def as_list(steps: np.ndarray | None) -> list[int] | None:
      return None if steps is None else steps.tolist()

    recorded = (schedule.local_steps, as_list(schedule.learner_local_steps))
    mine = (self.local_steps, as_list(self.learner_local_steps))
    if recorded != mine:
      raise ValueError(
        f"the schedule was simulated with (local_steps, learner_local_steps) = {recorded} and the engine runs "
        f"{mine}: a contribution's simulated duration and its executed steps would differ; allowed: the same"
      )
    # A learner's next local run starts from the inner state its previous one left: they cannot share a block.
    options.setdefault("distinct_learners", self.keeps_inner_states)
    if self.keeps_inner_states and schedule.dropped_learner.size:
      raise ValueError(
        f"the schedule drops {schedule.dropped_learner.size} contributions (protocol {schedule.protocol!r}), whose "
        "local runs the engine does not execute, while learners keep their inner state between runs: the state "
        "after a dropped run would be missing; reset the inner state every local run (config.inner.reset_state="
        "True) or use a stateless inner optimizer (SGD without momentum)"
      )
    return plan_blocks(schedule, num_devices=self.num_devices, **options)

  # ------------------------------------------------------------------- state
  def init(self, params: PyTree, plan: BlockPlan, *, ring_depth: int | None = None) -> EngineState:
    """The state before the first update: w_0 = ``params`` everywhere.

    Args:
      params: initial weights (host or device arrays).
      plan: the plan this state will execute.
      ring_depth: slots of the staleness queue; by default max staleness + 1,
        the least that holds every version the schedule reads.
    """
    needed = plan.schedule.max_staleness + 1
    depth = needed if ring_depth is None else ring_depth
    self._check_history(depth, plan.schedule.max_staleness, "the schedule")
    self._check_optimizer(params, plan.contributions_per_update)
    params = self._replicate(params)
    learners = plan.schedule.learners

    def build(p):
      inner = init_inner_states(self.inner_optimizer, p, learners) if self.keeps_inner_states else ()
      return EngineState(p, self.optimizer.init(p), ring_buffer.ring_init(p, depth), jnp.int32(0), inner)

    shardings = self.state_shardings(jax.eval_shape(build, params))
    return jax.jit(build, out_shardings=shardings)(params)

  def _replicate(self, tree: PyTree) -> PyTree:
    def put(leaf):
      if isinstance(leaf, jax.Array) and leaf.sharding == self._replicated:
        return leaf
      return sharding_lib.global_array(jax.device_get(leaf), self._replicated)

    return jax.tree_util.tree_map(put, tree)

  @staticmethod
  def _check_history(depth: int, staleness: int, what: str) -> None:
    if staleness + 1 > depth:
      raise ValueError(
        f"{what} applies gradients with staleness up to {staleness}, which needs the last {staleness + 1} "
        f"weight versions, but the ring buffer holds ring_depth={depth}; use ring_depth >= {staleness + 1}"
      )

  def _check_optimizer(self, params: PyTree, contributions: int) -> None:
    """Rejects, before compiling, an optimizer that does not reduce a stack."""
    shapes = jax.tree_util.tree_map(lambda p: jax.ShapeDtypeStruct(np.shape(p), jnp.result_type(p)), params)
    stacked = jax.tree_util.tree_map(lambda s: jax.ShapeDtypeStruct((contributions,) + s.shape, s.dtype), shapes)

    def update(grads, stale):
      params = jax.tree_util.tree_map(lambda s: jnp.zeros(s.shape, s.dtype), shapes)
      return self.optimizer.update(
        grads,
        self.optimizer.init(params),
        params,
        staleness=jnp.zeros((contributions,), jnp.int32),
        stale_params=stale,
        learner=jnp.zeros((contributions,), jnp.int32),
      )[0]

    out = jax.eval_shape(update, stacked, stacked)
    mismatched = [
      jax.tree_util.keystr(path)
      for (path, o), s in zip(jax.tree_util.tree_flatten_with_path(out)[0], jax.tree_util.tree_leaves(shapes))
      if o.shape != s.shape
    ]
    if mismatched:
      raise ValueError(
        "the optimizer returned updates with a leading contribution axis (e.g. for "
        f"{mismatched[0]}): the engine passes stacks of c={contributions} gradients, so the optimizer must "
        "reduce them; put stalesgd.average_contributions() after the per-contribution transforms, e.g. "
        "optax.chain(stalesgd.scale_by_staleness('inverse'), stalesgd.average_contributions(), "
        "optax.sgd(lr)), or use stalesgd.staleness_aware_sgd / stalesgd.dc_asgd"
      )

  # -------------------------------------------------------------------- step
  def _local_runs(
    self,
    ring: ring_buffer.RingBuffer,
    slot_timestamp: jax.Array,
    slot_states: PyTree,
    batch: PyTree,
    slot_steps,
    slot_scales,
  ):
    """Every slot's local run from its own weights, spread over devices: (mean inner loss, Delta, inner state).

    The slots' weights are gathered from the (parameter-sharded) ring and
    redistributed so that each device holds the full weights, inner state and
    H mini-batches of its own slots. The returned inner states are ``()`` when
    the engine keeps none.
    """
    keeps = self.keeps_inner_states
    strategy, axis = self.gradient_strategy, self.axis_name

    dynamic = self.learner_local_steps is not None

    def one(weights, state, slot_batches, steps, scales):
      reset = not keeps  # without a kept state every run starts from init (empty for plain SGD)
      if reset and dynamic:
        # A fresh state's constants (Adam's count) are the same on every device, but the masked steps make them
        # per-slot: as a scan carry they must be device-varying from the start.
        state, reset = _device_varying(self.inner_optimizer.init(weights), axis), False
      run = local_run(
        self.loss_fn,
        self.inner_optimizer,
        weights,
        state,
        slot_batches,
        reset_inner_state=reset,
        has_aux=self.has_aux,
        unroll=self.local_unroll,
        active_steps=steps if dynamic else None,
        step_scales=scales,
      )
      loss = jnp.sum(run.losses) / steps if dynamic else jnp.mean(run.losses)  # over the steps taken
      return loss, run.pseudo_gradient, (run.inner_state if keeps else ())

    def per_device(weights, states, local_batch, steps, scales):
      if strategy == "vmap":
        return jax.vmap(one)(weights, states, local_batch, steps, scales)
      slots = jax.tree_util.tree_leaves(weights)[0].shape[0]
      pick = lambda tree, i: jax.tree_util.tree_map(lambda leaf: leaf[i], tree)
      results = [
        one(pick(weights, i), pick(states, i), pick(local_batch, i), steps[i], pick(scales, i)) for i in range(slots)
      ]
      return jax.tree_util.tree_map(lambda *leaves: jnp.stack(leaves), *results)

    weights = jax.lax.with_sharding_constraint(ring_buffer.ring_read(ring, slot_timestamp), self._split)
    specs = (P(axis), P(axis), P(axis))
    # Without scales (None: no leaves) the program is the one before inner step scales existed.
    return jax.shard_map(per_device, mesh=self.mesh, in_specs=specs + (P(axis), P(axis)), out_specs=specs)(
      weights, slot_states, batch, slot_steps, slot_scales
    )

  def _block_step_impl(
    self,
    state: EngineState,
    num_updates,
    timestamp,
    staleness,
    learner,
    slot_timestamp,
    slot_owner,
    slot_steps,
    batch,
    slot_scales,
  ):
    rows, contributions = timestamp.shape
    slots = slot_timestamp.shape[0]
    # [S H, ...] rows, slot-major, to [S, H, ...]: each device keeps its own slots' H mini-batches.
    batch = jax.tree_util.tree_map(
      lambda leaf: jax.lax.with_sharding_constraint(leaf.reshape((slots, -1) + leaf.shape[1:]), self._split), batch
    )
    read_state = lambda leaf: jax.lax.with_sharding_constraint(
      leaf[jnp.minimum(slot_owner, leaf.shape[0] - 1)], self._split
    )
    slot_states = jax.tree_util.tree_map(read_state, state.inner_states)
    losses, grads, slot_states = self._local_runs(
      state.ring, slot_timestamp, slot_states, batch, slot_steps, slot_scales
    )
    # A real slot's learner keeps its new inner state; padding slots (owner = lambda, out of range) write nothing.
    inner_states = jax.tree_util.tree_map(
      lambda kept, new: kept.at[slot_owner].set(new, mode="drop"), state.inner_states, slot_states
    )

    def by_row(leaf):
      # From "each device holds some slots" to "each device holds a slice of
      # every slot's parameters" (an all-to-all), like the server state.
      leaf = jax.lax.with_sharding_constraint(leaf, self._parameter_sharding(leaf.shape, leading=1))
      leaf = leaf[: rows * contributions].reshape((rows, contributions) + leaf.shape[1:])
      return jax.lax.with_sharding_constraint(leaf, self._parameter_sharding(leaf.shape, leading=2))

    grads = jax.tree_util.tree_map(by_row, grads)
    losses = jax.lax.with_sharding_constraint(losses, self._replicated)[: rows * contributions]
    losses = losses.reshape(rows, contributions)
    diagnostics = None
    if self.diagnose:
      # From the pseudo-gradients as the server receives them (after the all-to-all), so that the local runs'
      # program is the one without diagnostics.
      leaves = [leaf.astype(jnp.float32) for leaf in jax.tree_util.tree_leaves(grads)]
      squared = sum(jnp.sum(jnp.square(leaf), axis=tuple(range(2, leaf.ndim))) for leaf in leaves)  # [R, c]
      mean_squared = sum(  # ||mean_c Delta||^2 of every row, [R]
        jnp.sum(jnp.square(jnp.mean(leaf, axis=1)), axis=tuple(range(1, leaf.ndim - 1))) for leaf in leaves
      )
      diagnostics = {
        "pseudo_gradient_norm": jnp.mean(jnp.sqrt(squared), axis=1),
        "pseudo_gradient_agreement": jnp.broadcast_to(
          agreement(jnp.sum(squared, axis=1), mean_squared, contributions), (rows,)
        ),
      }

    def apply_update(row, carry):
      # Only the block's real updates run (a dynamic trip count), so padding rows
      # cost nothing and no conditional has to carry the ring buffer.
      params, opt_state, ring, step, applied = carry
      row_grads = jax.tree_util.tree_map(lambda leaf: leaf[row], grads)
      stale_params = ring_buffer.ring_read(ring, timestamp[row])
      updates, opt_state = self.optimizer.update(
        row_grads, opt_state, params, staleness=staleness[row], stale_params=stale_params, learner=learner[row]
      )
      params = optax.apply_updates(params, updates)
      step = step + 1
      ring = ring_buffer.ring_write(ring, step, params)
      new = EngineState(params, opt_state, ring, step)
      new = self._constrain(new)[:4]
      return (*new, applied.at[row].set(transforms.lr_scale(opt_state)))

    carry = (state.params, state.opt_state, state.ring, state.step, jnp.ones((rows,), jnp.float32))
    params, opt_state, ring, step, applied = jax.lax.fori_loop(0, num_updates, apply_update, carry)
    final = EngineState(params, opt_state, ring, step, inner_states)
    return self._constrain(final), BlockMetrics(losses, applied, diagnostics)

  def _constrain(self, state: EngineState) -> EngineState:
    return jax.lax.with_sharding_constraint(state, self.state_shardings(state))

  def make_batch(self, batch_fn: BatchFn, block: Block) -> PyTree:
    """The block's mini-batches as global arrays split over the learner axis: rows [S H], slot-major.

    Slot s, its learner's contribution k, reads that learner's mini-batches
    k H, ..., k H + H - 1 (H = ``local_steps``; k with H = 1); with data shards
    (`Schedule.data_stream`), ``batch_fn(shard, offset + i)`` instead: the
    shard's mini-batches from the offset its local run took.
    """
    steps = self.local_steps
    streams, offsets = self._slot_streams(block)
    taken = self._slot_steps(block)[:, None]  # H_m of each slot's learner; the steps past it read its last batch
    indices = (offsets[:, None] + np.minimum(np.arange(steps), taken - 1)).reshape(-1)
    return sharding_lib.rows_from_batch_fn(batch_fn, np.repeat(streams, steps), indices, self._split)

  def _slot_streams(self, block: Block) -> tuple[np.ndarray, np.ndarray]:
    """Each slot's data stream and the stream's step its local run starts at, int64 [S] each: its learner and
    k H_m, or its data shard and offset (`Schedule.data_stream`)."""
    if block.slot_data_stream is not None:
      return block.slot_data_stream, block.slot_data_offset
    return block.slot_learner.astype(np.int64), block.slot_batch_index * self._slot_steps(block)

  def _slot_steps(self, block: Block) -> np.ndarray:
    """H_m of every slot's learner (H without dynamic local updates), int64 [S]."""
    if self.learner_local_steps is None:
      return np.full(block.slot_learner.shape, self.local_steps, np.int64)
    return self.learner_local_steps[block.slot_learner]

  def step(
    self, state: EngineState, plan: BlockPlan, block_index: int, batch_fn: BatchFn
  ) -> tuple[EngineState, BlockMetrics]:
    """Executes block ``block_index`` of ``plan`` (asynchronously dispatched)."""
    block = plan.block(block_index)
    self._check_history(ring_buffer.ring_depth(state.ring), int(block.staleness.max(initial=0)), f"block {block_index}")
    batch = self.make_batch(batch_fn, block)
    block_inputs = [
      sharding_lib.global_array(host, self._replicated)
      for host in (np.int32(block.num_updates), block.timestamp, block.staleness, block.learner)
    ]
    slot_timestamp = sharding_lib.global_array(block.slot_timestamp, self._split)
    # Each slot's learner, whose inner state it reads and writes; lambda (out of range) for unused slots.
    real = block.num_updates * plan.contributions_per_update
    owner = np.full(block.slot_learner.shape, plan.schedule.learners, np.int32)
    owner[:real] = block.slot_learner[:real]
    slot_owner = sharding_lib.global_array(owner, self._split)
    slot_steps = sharding_lib.global_array(self._slot_steps(block).astype(np.int32), self._split)
    scales = None
    if self.inner_step_scale is not None:
      scales = np.asarray(self.inner_step_scale(self._slot_streams(block)[1], self.local_steps), np.float32)
      scales = sharding_lib.global_array(scales, self._split)
    state, metrics = self._block_step(state, *block_inputs, slot_timestamp, slot_owner, slot_steps, batch, scales)
    self._dispatch.dispatched(metrics.lr_scale)
    return state, metrics

  def iterate(
    self, state: EngineState, plan: BlockPlan, batch_fn: BatchFn, *, start_block: int = 0, stop_block: int | None = None
  ) -> Iterator[tuple[int, EngineState, BlockMetrics]]:
    """Yields ``(block_index, state, metrics)`` after dispatching each block.

    Dispatch is asynchronous: the host prepares the next block's batches while
    the devices compute; reading a metric waits for its block.
    """
    stop_block = plan.num_blocks if stop_block is None else stop_block
    for block_index in range(start_block, stop_block):
      state, metrics = self.step(state, plan, block_index, batch_fn)
      yield block_index, state, metrics

  def run(self, state: EngineState, plan: BlockPlan, batch_fn: BatchFn, **iterate_options) -> EngineState:
    """Executes the plan's blocks (all by default) and returns the final state."""
    for _, state, _ in self.iterate(state, plan, batch_fn, **iterate_options):
      pass
    return state
