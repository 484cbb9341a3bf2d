r"""Streaming DiLoCo over a mesh: fragments synced in turn, each all-reduce in flight for tau inner steps.

Douillard et al., *Streaming DiLoCo with overlapping communication* (arXiv 2501.18512), on real collectives with
one learner per device. Notation: M learners, H inner steps per round, P fragments (P divides H), tau the inner
steps an all-reduce is in flight, alpha the mixing factor, :math:`\Theta` the outer weights, :math:`\theta_m`
learner m's local weights.

* **Fragments.** Each leaf's fragment, in ``jax.tree`` leaf order: ``fragment_of_leaf`` (training runs pass whole
  layers, strided or sequential, `stalesgd.decentral._fragments`); without it, leaf i belongs to fragment i mod P
  (``array_strided``; a leaf is never split, so P is at most the number of leaves).
* **Syncs.** Every learner runs inner steps without pause, keeping its local weights and inner state across
  rounds. After inner step k H/P of a round (k = 1, ..., P), fragment k - 1 is synced:
  :math:`\Delta_{m,p} = \Theta_p - \theta_{m,p}`, and its all-reduce mean :math:`\bar\Delta_p` is in flight.
* **Applications.** tau inner steps after its sync (0 <= tau <= H; the next round when it passes the round's end):
  :math:`\Theta_p \leftarrow \Theta_p + \mathrm{OuterOpt}_p(\bar\Delta_p)` with the fragment's own outer state,
  and :math:`\theta_{m,p} \leftarrow \alpha\,\theta_{m,p} + (1 - \alpha)\,\Theta_p` at the local weights reached
  by then (alpha = 0 replaces the local copy).
* **Order within one inner-step boundary:** the sync first, then the application landing there. A sync reads the
  local weights the inner steps reached, before any application at the same boundary replaces them; the
  application is of a mean from an earlier sync (tau > 0), or, at tau = 0, of the mean of the sync just taken. At
  most one sync and one application fall on a boundary; they are of the same fragment only at tau = 0 (its own
  mean) and at tau = H, where the fragment's previous mean lands at its next sync: Delta is taken first, then the
  previous mean is applied, then the new one is in flight.

Corners: P = 1, tau = 0, alpha = 0 is synchronous DiLoCo (Douillard et al., arXiv 2311.08105): every round ends
with the outer step on :math:`\bar\Delta` and every learner restarting from :math:`\Theta`. P = 1, tau = H,
alpha = 0 is the one-round-delayed outer step (as PCCL's asynchronous DiLoCo and Kale et al.'s baseline): round
r's mean is applied at the end of round r + 1, after round r + 1's Delta was taken, and the learners continue
meanwhile. The events of a round are the same every round (H, P, tau
static), so a round is one compiled program; the mean is computed by ``jax.lax.pmean`` at the sync and carried, as
received data, until its application (the program computes what the overlapped system computes; whether the
collective overlaps the steps on a device is a property of the schedule XLA makes, not claimed here).

**A sync at the round's end whose mean is used later** (the last fragment with tau > 0 or eager updates; the
one-round-delayed step) overlaps the next round's steps, which are in the next program: its pseudo-gradients are
carried to the next round (`StreamingState.unreduced`) and all-reduced at its start, reading carried state only
(as DC-S3GD's step does), so the collective can overlap that round's steps. The same values, the same mean.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, PartitionSpec

from stalesgd import _validation as validation
from stalesgd.parallel._sharding import LEARNERS_AXIS, check_learners_axis, mesh_learners
from stalesgd.transforms._local_run import LossFn, agreement, init_inner_states, local_run


class StreamingSettings(NamedTuple):
  """P fragments, tau inner steps in flight, alpha the mixing factor, eager updates; H inner steps per round."""

  local_steps: int
  fragments: int = 1
  delay: int = 0
  mix: float = 0.0
  eager: bool = False


class StreamingState(NamedTuple):
  r"""Everything a streaming DiLoCo run carries between rounds; a pytree.

  Attributes:
    outer_params: every learner's copy of :math:`\Theta`, leaves ``[M, ...]`` split over the learners: equal
      copies (each device computes the same outer step from the same mean), except with eager updates, where
      each learner's outer step takes its own fresh pseudo-gradient.
    outer_states: one OuterOpt state per fragment (a tuple of P), per learner like ``outer_params``.
    local_params: every learner's :math:`\theta_m`, leaves ``[M, ...]`` split over the learners.
    inner_states: every learner's inner state, leaves ``[M, ...]`` (``()`` when reset every round).
    in_flight: the all-reduced :math:`\bar\Delta_p` of every fragment awaiting its application (weights' shapes;
      a leaf holds its fragment's), replicated.
    pending: bool ``[P]``, which fragments have a mean in flight.
    step: int32 scalar, rounds done.
    own_previous: eager updates: every learner's :math:`\Delta_{m,p}` of its previous sync (leaves ``[M, ...]``);
      ``()`` without.
    unreduced: where the round-end sync is carried (`carries_round_end`): every learner's pseudo-gradient of the
      last fragment at the previous round's end, to be all-reduced at the next round's start (leaves ``[M, ...]``,
      zero outside the fragment; zero before the first round); ``()`` otherwise.
  """

  outer_params: Any
  outer_states: Any
  local_params: Any
  inner_states: Any
  in_flight: Any
  pending: jax.Array
  step: jax.Array
  own_previous: Any = ()
  unreduced: Any = ()


def check_settings(settings: StreamingSettings, num_leaves: int) -> StreamingSettings:
  """The settings after checking them, each bad value named with what is allowed."""
  steps = validation.check_integer("local_steps", settings.local_steps, low=1)
  fragments = validation.check_integer("fragments", settings.fragments, low=1, high=num_leaves, high_label="leaves")
  if steps % fragments:
    validation.reject("fragments", fragments, f"a divisor of local_steps={steps} (one fragment synced every H/P steps)")
  delay = validation.check_integer("delay", settings.delay, low=0, high=steps, high_label="local_steps")
  mix = validation.check_real("mix", settings.mix, low=0, high=1)
  eager = validation.check_bool("eager", settings.eager)
  return StreamingSettings(steps, fragments, delay, float(mix), eager)


def carries_round_end(settings: StreamingSettings) -> bool:
  """Whether the last fragment's sync, at the round's end, is all-reduced at the next round's start: where its
  mean is used later than that sync (tau > 0, or eager updates, which use it at the fragment's next sync)."""
  return settings.eager or settings.delay > 0


def fragment_of_leaves(num_leaves: int, fragments: int, given: Sequence[int] | None = None) -> tuple[int, ...]:
  """Each leaf's fragment: ``given`` (checked: one per leaf, every fragment 0..P-1 holding one), else leaf i's is
  i mod P (strided over arrays, ``array_strided``)."""
  if given is None:
    return tuple(index % fragments for index in range(num_leaves))
  given = tuple(int(fragment) for fragment in given)
  if len(given) != num_leaves or sorted(set(given)) != list(range(fragments)):
    validation.reject(
      "fragment_of_leaf", given, f"one fragment per leaf ({num_leaves}), each of 0..{fragments - 1} holding one"
    )
  return given


def leaves_of_fragments(
  num_leaves: int, fragments: int, given: Sequence[int] | None = None
) -> tuple[tuple[int, ...], ...]:
  """Each fragment's leaf indices, fragments 0..P-1, each in leaf order (the assignment: `fragment_of_leaves`)."""
  members = [[] for _ in range(fragments)]
  for index, fragment in enumerate(fragment_of_leaves(num_leaves, fragments, given)):
    members[fragment].append(index)
  return tuple(tuple(indices) for indices in members)


def applied_next_round(settings: StreamingSettings, fragment: int) -> bool:
  """Whether the fragment's mean lands in the round after its sync's (sync + tau past the round's end): its
  application then takes the mean its previous round's sync put in flight."""
  return (fragment + 1) * settings.local_steps // settings.fragments + settings.delay > settings.local_steps


def round_events(settings: StreamingSettings) -> list[tuple[int, str, int]]:
  """A round's events in order, as (inner steps done in the round, kind, fragment); kind is ``"sync"`` or
  ``"apply"``; at one boundary the sync comes before the application (module docstring: the order within one
  boundary). An application of a fragment `applied_next_round` is of the mean its sync of the previous round put
  in flight."""
  steps, fragments, delay = settings.local_steps, settings.fragments, settings.delay
  events = []
  for p in range(fragments):
    sync = (p + 1) * steps // fragments
    events.append((sync, 0, "sync", p))
    if settings.eager:  # the outer step is taken at the sync itself (module docstring, *Eager updates*)
      continue
    applied = sync + delay
    events.append((applied - steps if applied > steps else applied, 1, "apply", p))
  return [(time, kind, p) for time, _, kind, p in sorted(events)]


def init_streaming(
  inner_optimizer: optax.GradientTransformation,
  outer_optimizer: optax.GradientTransformation,
  params: Any,
  num_learners: int,
  settings: StreamingSettings,
  *,
  reset_inner_state: bool = False,
  fragment_of_leaf: Sequence[int] | None = None,
) -> StreamingState:
  """The state before the first round: every copy of the weights is ``params``, nothing in flight
  (``fragment_of_leaf``: `fragment_of_leaves`; the same as the rounds')."""
  leaves, treedef = jax.tree.flatten(params)
  settings = check_settings(settings, len(leaves))
  members_of = leaves_of_fragments(len(leaves), settings.fragments, fragment_of_leaf)
  fragment = lambda p: [leaves[i] for i in members_of[p]]
  per_learner = lambda tree: jax.tree.map(lambda leaf: jnp.broadcast_to(leaf, (num_learners,) + jnp.shape(leaf)), tree)
  outer_states = tuple(per_learner(outer_optimizer.init(fragment(p))) for p in range(settings.fragments))
  inner = () if reset_inner_state else init_inner_states(inner_optimizer, params, num_learners)
  zeros = jax.tree.map(jnp.zeros_like, params)
  pending = jnp.zeros((settings.fragments,), bool)
  own = per_learner(zeros) if settings.eager else ()
  unreduced = per_learner(zeros) if carries_round_end(settings) else ()
  return StreamingState(
    per_learner(params), outer_states, per_learner(params), inner, zeros, pending, jnp.int32(0), own, unreduced
  )


class StreamingRound(NamedTuple):
  """What one round returns besides the state: per-learner mean inner loss ``[M]``, ``||Delta_m||`` over the
  round's syncs ``[M]``, and the learners' `agreement` over the pseudo-gradients all-reduced in the round's program
  (a scalar; a carried round-end sync counts in the next round, where its mean is computed)."""

  state: StreamingState
  losses: jax.Array
  pseudo_gradient_norms: jax.Array
  agreement: jax.Array


def sharded_streaming_round(
  loss_fn: LossFn,
  inner_optimizer: optax.GradientTransformation,
  outer_optimizer: optax.GradientTransformation,
  mesh: Mesh,
  settings: StreamingSettings,
  state: StreamingState,
  batches: Any,
  *,
  axis_name: str = LEARNERS_AXIS,
  reset_inner_state: bool = False,
  has_aux: bool = False,
  unroll: int | bool = True,
  fragment_of_leaf: Sequence[int] | None = None,
) -> StreamingRound:
  r"""One round of H inner steps of every learner, with its fragments' syncs and applications (module docstring).

  ``batches``: leaves ``[M, H, ...]`` split over the learners, learner m's mini-batches r H, ..., r H + H - 1 in
  round r. With ``reset_inner_state`` a learner's inner state restarts from ``inner_optimizer.init`` at the start
  of every round. ``fragment_of_leaf``: each leaf's fragment (`fragment_of_leaves`; the one `init_streaming` was
  given). Pure and jit-able with the loss, optimizers, mesh, settings and options bound.

  Raises:
    ValueError: naming the argument, when the settings are refused (`check_settings`), the mesh has no
      ``axis_name`` axis, or a leaf of ``batches`` or of the state's per-learner fields has no leading axis of M,
      the size of that axis (one learner per device).
  """
  learners = mesh_learners(mesh, axis_name)
  leaves, treedef = jax.tree.flatten(jax.tree.map(lambda leaf: leaf[0], state.outer_params))
  settings = check_settings(settings, len(leaves))
  for field in ("outer_params", "outer_states", "local_params", "inner_states", "own_previous", "unreduced"):
    check_learners_axis(f"state.{field}", getattr(state, field), learners)
  check_learners_axis("batches", batches, learners)
  members_of = leaves_of_fragments(len(leaves), settings.fragments, fragment_of_leaf)
  events = round_events(settings)
  mix, eager, carry = settings.mix, settings.eager, carries_round_end(settings)
  next_round = [applied_next_round(settings, p) for p in range(settings.fragments)]
  last = settings.fragments - 1
  square_sum = lambda arrays: sum(jnp.sum(jnp.square(array.astype(jnp.float32))) for array in arrays)

  def per_learner(outer, outer_states, local, inner_state, in_flight, pending, own_previous, unreduced, batches):
    unstack = lambda tree: jax.tree.map(lambda leaf: leaf[0], tree)
    restack = lambda tree: jax.tree.map(lambda leaf: leaf[None], tree)
    outer_leaves, local = jax.tree.leaves(unstack(outer)), jax.tree.leaves(unstack(local))
    in_flight_leaves = jax.tree.leaves(in_flight)
    own_leaves = jax.tree.leaves(unstack(own_previous)) if eager else []
    inner_state = inner_optimizer.init(treedef.unflatten(local)) if reset_inner_state else unstack(inner_state)
    batches = unstack(batches)
    outer_states, pending = [unstack(fragment_state) for fragment_state in outer_states], list(pending)
    unreduced_leaves = jax.tree.leaves(unstack(unreduced)) if carry else []
    # squares: sum_p ||Delta_m,p||^2 of this round's syncs (the norm metric); reduced_squares and mean_squares:
    # sum ||Delta_m,p||^2 and ||mean||^2 of the pseudo-gradients all-reduced in this program (the agreement metric).
    done, losses, squares = 0, [], jnp.float32(0)
    reduced_squares, mean_squares = jnp.float32(0), jnp.float32(0)
    # fresh: the means all-reduced at this round's syncs, by leaf. in_flight_leaves keeps the means of earlier
    # syncs (the previous round's, and the carried round-end one) until the loop is done: at tau = H a fragment's
    # previous mean is applied at the boundary of its next sync, after that sync.
    fresh = {}
    if carry:  # the previous round's last sync, first: it reads carried state only
      members = members_of[last]
      carried = [unreduced_leaves[i] for i in members]
      means = jax.lax.pmean(carried, axis_name)
      reduced_squares, mean_squares = square_sum(carried), square_sum(means)
      for i, mean in zip(members, means):
        in_flight_leaves[i] = mean

    def outer_step(p, members, directions, taken):
      """OuterOpt_p on the fragment's leaves, then the local copy mixed in; nothing where ``taken`` is False."""
      updates, new_state = outer_optimizer.update(directions, outer_states[p], [outer_leaves[i] for i in members])
      keep = lambda new, old: jax.tree.map(lambda n, o: jnp.where(taken, n, o), new, old)
      outer_states[p] = keep(new_state, outer_states[p])
      for i, update in zip(members, updates):
        theta = keep(optax.apply_updates(outer_leaves[i], update), outer_leaves[i])
        outer_leaves[i] = theta
        local[i] = keep((mix * local[i] + (1 - mix) * theta).astype(local[i].dtype), local[i])

    for time, kind, p in events:
      if time > done:  # the inner steps up to this boundary
        segment = jax.tree.map(lambda leaf, a=done, b=time: leaf[a:b], batches)
        run = local_run(
          loss_fn,
          inner_optimizer,
          treedef.unflatten(local),
          inner_state,
          segment,
          has_aux=has_aux,
          unroll=unroll,
        )
        local, inner_state, done = jax.tree.leaves(run.params), run.inner_state, time
        losses.append(run.losses)
      members = members_of[p]
      if kind == "sync":
        deltas = [outer_leaves[i] - local[i] for i in members]
        squares = squares + square_sum(deltas)
        carried_on = carry and time == settings.local_steps  # at the round's end: all-reduced at the next one's start
        if not carried_on:
          means = jax.lax.pmean(deltas, axis_name)
          reduced_squares, mean_squares = reduced_squares + square_sum(deltas), mean_squares + square_sum(means)
        if eager:
          # Kale et al.: the previous sync's mean with this learner's part replaced by its fresh pseudo-gradient.
          # (in_flight_leaves holds the previous sync's mean: this round's are kept in fresh.)
          directions = [
            (in_flight_leaves[i] + (delta - own_leaves[i]) / learners).astype(delta.dtype)
            for i, delta in zip(members, deltas)
          ]
          outer_step(p, members, directions, jnp.bool_(True))
          for i, delta in zip(members, deltas):
            own_leaves[i] = delta
        if carried_on:
          for i, delta in zip(members, deltas):
            unreduced_leaves[i] = delta
        else:
          for i, mean in zip(members, means):
            fresh[i] = mean
      elif next_round[p]:  # the mean of the previous round's sync (none before the first round: not pending)
        outer_step(p, members, [in_flight_leaves[i] for i in members], pending[p])
      else:  # the mean of this round's sync, tau steps ago
        outer_step(p, members, [fresh[i] for i in members], jnp.bool_(True))
    for i, mean in fresh.items():
      in_flight_leaves[i] = mean
    pending = [jnp.bool_(next_round[p] and not eager) for p in range(settings.fragments)]
    if done < settings.local_steps:  # steps after the last event of the round
      segment = jax.tree.map(lambda leaf, a=done: leaf[a:], batches)
      run = local_run(
        loss_fn, inner_optimizer, treedef.unflatten(local), inner_state, segment, has_aux=has_aux, unroll=unroll
      )
      local, inner_state = jax.tree.leaves(run.params), run.inner_state
      losses.append(run.losses)
    inner_out = () if reset_inner_state else restack(inner_state)
    return (
      restack(treedef.unflatten(outer_leaves)),
      tuple(restack(fragment_state) for fragment_state in outer_states),
      restack(treedef.unflatten(local)),
      inner_out,
      treedef.unflatten(in_flight_leaves),
      jnp.stack(pending),
      restack(treedef.unflatten(own_leaves)) if eager else (),
      restack(treedef.unflatten(unreduced_leaves)) if carry else (),
      jnp.mean(jnp.concatenate(losses))[None],
      jnp.sqrt(squares)[None],
      agreement(jax.lax.psum(reduced_squares, axis_name), mean_squares, jax.lax.axis_size(axis_name)),
    )

  replicated, split = PartitionSpec(), PartitionSpec(axis_name)
  round_fn = jax.shard_map(
    per_learner,
    mesh=mesh,
    in_specs=(split, split, split, split, replicated, replicated, split, split, split),
    out_specs=(split, split, split, split, replicated, replicated, split, split, split, split, replicated),
  )
  inner_states = state.inner_states if not reset_inner_state else ()
  out = round_fn(
    state.outer_params,
    state.outer_states,
    state.local_params,
    inner_states,
    state.in_flight,
    state.pending,
    state.own_previous,
    state.unreduced,
    batches,
  )
  outer, outer_states, local, inner, in_flight, pending, own, unreduced, losses, norms, agreed = out
  new = StreamingState(outer, outer_states, local, inner, in_flight, pending, state.step + 1, own, unreduced)
  return StreamingRound(new, losses, norms, agreed)
