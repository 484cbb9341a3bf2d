"""Streaming DiLoCo over a mesh (stalesgd/decentral/_streaming.py) against an oracle that shares no event order
with it (tests/helpers/streaming_oracle.py: a numpy loop, one inner step at a time, written from the algorithm's
text; it shares only the fragment rule, leaf i in fragment i mod P).

Every round is compared: Theta and theta of every learner, each learner's ||Delta|| over the round's syncs and its
mean inner loss. float32 against float64: RTOL 1e-5, ATOL 1e-5 (the float32 rounding of 40 inner steps and up to
40 outer steps on weights of size 1-5 and pseudo-gradients of 0.05-2; over every run of this file the largest
difference measured is 7.6e-6, in a mean loss of about 6, and no difference exceeds 0.08 of its tolerance
atol + rtol |oracle|).

With the order this file was written against reversed (at tau = H, the previous mean applied before the same
fragment's sync: Delta = 0 from round 1 on at alpha = 0), every tau = H case fails (and the hand-written event
order), and every tau < H case passes: a fragment's sync and its own mean's application share a boundary only at
tau = 0, which was in this order already, and at tau = H.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from stalesgd.decentral._streaming import (
  StreamingSettings,
  init_streaming,
  round_events,
  sharded_streaming_round,
)
from stalesgd.parallel import learner_mesh
from tests.helpers import streaming_oracle as oracle

RTOL, ATOL = 1e-5, 1e-5
INNER_ETA, OUTER_ETA, OUTER_BETA = 0.05, 0.7, 0.9
ROUNDS = 10
STEPS, LEARNERS = 4, 3


def linear_loss(params, batch):
  """The oracle's model (its docstring): least squares over four arrays."""
  x, y = batch
  prediction = x[:, 0:3] @ params["a"] + x[:, 3:7] @ params["b"].reshape(4) + params["c"] + x[:, 7:9] @ params["d"]
  return 0.5 * jnp.mean((prediction - y) ** 2)


@functools.cache
def run(learners, settings, inner_beta=None, rounds=ROUNDS, unroll=True):
  """The library's rounds and the oracle's, each a list of per-round dicts (the oracle's `streaming_diloco`).

  The library's rounds are one program, a `jax.lax.scan` over rounds (one compilation and one dispatch per run;
  each scan step is the round a run takes); ``unroll``: the round's option (its default: straight-line steps)."""
  mesh = learner_mesh(devices=jax.devices()[:learners])
  inner = optax.sgd(INNER_ETA, momentum=inner_beta)
  outer = optax.sgd(OUTER_ETA, momentum=OUTER_BETA, nesterov=True)
  steps = settings.local_steps
  streams = oracle.streams(learners, rounds * steps, seed=learners)
  state = init_streaming(inner, outer, oracle.initial_weights(), learners, settings)

  def one_round(state, batches):
    out = sharded_streaming_round(linear_loss, inner, outer, mesh, settings, state, batches, unroll=unroll)
    record = {
      "outer": out.state.outer_params,
      "local": out.state.local_params,
      "norms": out.pseudo_gradient_norms,
      "losses": out.losses,
      "agreement": out.agreement,
      "step": out.state.step,
    }
    return out.state, record

  # leaves [R, M, H, ...]: round r's batches of every learner, learner m's rows r H .. r H + H - 1
  batches = tuple(
    np.stack([np.stack([stream[part][r * steps : (r + 1) * steps] for stream in streams]) for r in range(rounds)])
    for part in range(2)
  )
  _, records = jax.device_get(jax.jit(lambda state, batches: jax.lax.scan(one_round, state, batches))(state, batches))
  got = [jax.tree.map(lambda leaf, r=r: leaf[r], records) for r in range(rounds)]
  expected = oracle.streaming_diloco(
    oracle.initial_weights(), streams, rounds, steps, settings.fragments, settings.delay, settings.mix,
    INNER_ETA, OUTER_ETA, OUTER_BETA, inner_beta=inner_beta, eager=settings.eager,
  )  # fmt: skip
  return got, expected


def assert_rounds_agree(got, expected, learners):
  for r, (mine, theirs) in enumerate(zip(got, expected, strict=True)):
    for m in range(learners):
      for which in ("outer", "local"):
        for key, value in theirs[which][m].items():
          np.testing.assert_allclose(
            np.asarray(mine[which][key][m], np.float64), value, rtol=RTOL, atol=ATOL, err_msg=f"round {r} {which} {key}"
          )
    np.testing.assert_allclose(mine["norms"], theirs["norms"], rtol=RTOL, atol=ATOL, err_msg=f"round {r} norms")
    np.testing.assert_allclose(mine["losses"], theirs["losses"], rtol=RTOL, atol=ATOL, err_msg=f"round {r} losses")
    np.testing.assert_allclose(mine["agreement"], theirs["agreement"], rtol=RTOL, atol=ATOL, err_msg=f"round {r}")
    assert int(mine["step"]) == r + 1, f"round {r}: the state counts {mine['step']} rounds taken"


@pytest.mark.slow  # 30 programs, about 45 s on a 2-core machine beside other work
@pytest.mark.parametrize("mix", [0.0, 0.5])
@pytest.mark.parametrize("fragments", [1, 2, 4])
@pytest.mark.parametrize("delay", range(STEPS + 1))
def test_every_delay_fragments_and_mix_agree_with_the_oracle(delay, fragments, mix):
  """H = 4, M = 3, 10 rounds: tau = 0 is synchronous DiLoCo (P = 1, alpha = 0), tau = H the one-round-delayed step.
  The unmarked tests below hold tau = H (every P and alpha) and other shapes to the oracle in the fast suite."""
  got, expected = run(LEARNERS, StreamingSettings(STEPS, fragments, delay, mix))
  assert_rounds_agree(got, expected, LEARNERS)


@pytest.mark.parametrize("mix", [0.0, 0.5])
@pytest.mark.parametrize("fragments", [1, 2, 4])
def test_at_tau_equal_to_h_every_round_takes_a_pseudo_gradient(fragments, mix):
  """The sync reads the local weights before the previous mean, landing at the same boundary, replaces them: with
  that order reversed, Delta = 0 from round 1 on at alpha = 0 (and alpha times the true one at alpha > 0)."""
  got, expected = run(LEARNERS, StreamingSettings(STEPS, fragments, STEPS, mix))
  norms = np.stack([record["norms"] for record in got])  # [rounds, M]: ||Delta_m|| over each round's syncs
  assert norms.shape == (ROUNDS, LEARNERS)
  assert np.all(norms > 1e-2), norms  # the oracle's are 0.2-1.9 here
  assert_rounds_agree(got, expected, LEARNERS)


@pytest.mark.parametrize(
  "learners, settings, inner_beta",
  [
    (8, StreamingSettings(local_steps=4, fragments=2, delay=4, mix=0.25), None),  # tau = H on 8 devices
    (3, StreamingSettings(local_steps=3, fragments=1, delay=0, mix=0.0), None),  # synchronous DiLoCo, H = 3
    # tau = 1, P = 4: fragment 2's mean lands at the round's end (this round), fragment 3's sync is carried
    (3, StreamingSettings(local_steps=4, fragments=4, delay=1, mix=0.0), None),
    (2, StreamingSettings(local_steps=2, fragments=1, delay=2, mix=0.0), None),  # one-round-delayed, H = 2
    (3, StreamingSettings(local_steps=4, fragments=2, delay=4, mix=0.5), 0.9),  # inner momentum kept across rounds
    (3, StreamingSettings(local_steps=4, fragments=2, delay=4, mix=0.5, eager=True), None),  # Kale et al.
    (2, StreamingSettings(local_steps=3, fragments=1, delay=3, mix=0.0, eager=True), None),  # eager, P = 1
    (2, StreamingSettings(local_steps=1, fragments=1, delay=1, mix=0.0), None),  # H = 1 (the least), tau = H
  ],
  ids=[
    "tau-equals-H-8-devices",
    "diloco-H3",
    "tau-1-P4",
    "one-round-delayed-H2",
    "inner-momentum",
    "eager-P2",
    "eager-P1",
    "one-round-delayed-H1",
  ],
)
def test_other_shapes_agree_with_the_oracle(learners, settings, inner_beta):
  got, expected = run(learners, settings, inner_beta, rounds=4)
  assert_rounds_agree(got, expected, learners)
  if settings.eager:  # each learner's outer step took its own fresh pseudo-gradient: the copies differ
    assert not np.allclose(got[-1]["outer"]["a"][0], got[-1]["outer"]["a"][1], rtol=1e-4)


def test_a_round_events_are_the_syncs_in_turn_and_their_delayed_applications():
  # H = 4, P = 2, tau = 1: fragment 0 synced after step 2, applied after 3; fragment 1 synced after 4, applied
  # after step 1 of the next round (so first in a round).
  assert round_events(StreamingSettings(4, 2, 1)) == [(1, "apply", 1), (2, "sync", 0), (3, "apply", 0), (4, "sync", 1)]
  # tau = 0: applied right after its own sync; tau = H: the previous round's mean is applied at the fragment's
  # next sync, after it (the sync reads the local weights first).
  assert round_events(StreamingSettings(2, 1, 0)) == [(2, "sync", 0), (2, "apply", 0)]
  assert round_events(StreamingSettings(2, 1, 2)) == [(2, "sync", 0), (2, "apply", 0)]
  assert round_events(StreamingSettings(4, 2, 4)) == [(2, "sync", 0), (2, "apply", 0), (4, "sync", 1), (4, "apply", 1)]


@pytest.mark.parametrize(
  "settings, message",
  [
    (StreamingSettings(3, 2), "fragments=2; allowed: a divisor of local_steps=3"),
    (StreamingSettings(4, 1, 5), "delay=5"),
    (StreamingSettings(4, 1, -1), r"delay=-1; allowed: an integer >= 0 and <= local_steps=4"),
    (StreamingSettings(4, 1, 0, 1.5), "mix=1.5"),
    (StreamingSettings(8, 8), "fragments=8; allowed: an integer >= 1 and <= leaves=4"),  # a leaf is never split
  ],
)
def test_bad_settings_are_named(settings, message):
  with pytest.raises(ValueError, match=message):
    init_streaming(optax.sgd(0.1), optax.sgd(0.1), oracle.initial_weights(), 2, settings)


def test_learners_on_the_same_batches_agree_completely():
  mesh = learner_mesh(devices=jax.devices()[:3])
  settings = StreamingSettings(local_steps=2, fragments=2, delay=1, mix=0.5)
  inner, outer = optax.sgd(INNER_ETA), optax.sgd(OUTER_ETA)
  (stream,) = oracle.streams(1, 2, seed=5)
  batches = tuple(np.stack([part] * 3) for part in stream)
  state = init_streaming(inner, outer, oracle.initial_weights(), 3, settings)
  # Jitted as a user's loop runs it (outside jit, shard_map runs op by op: 16 s instead of 1).
  round_fn = jax.jit(functools.partial(sharded_streaming_round, linear_loss, inner, outer, mesh, settings))
  out = round_fn(state, batches)
  assert float(out.agreement) == pytest.approx(1.0, abs=1e-6)
  # H = 2, P = 2, tau = 1: fragment 0's mean (synced after step 1) landed after step 2, in the round; fragment 1's
  # (synced after step 2) lands after step 1 of the next round: only it is in flight.
  assert out.state.pending.tolist() == [False, True]


def test_the_default_settings_are_synchronous_diloco():
  """One fragment, no delay, the local copy replaced by the outer weights (alpha = 0), no eager updates."""
  assert StreamingSettings(5) == StreamingSettings(local_steps=5, fragments=1, delay=0, mix=0.0, eager=False)


def test_eager_updates_with_one_learner_are_the_fresh_update():
  """M = 1: Delta~ = Delta_bar(prev) + (Delta - Delta(prev)) / 1 = Delta, so eager is DiLoCo; within float32
  rounding (the eager direction is computed as (prev + (Delta - prev)), not as Delta)."""
  eager, _ = run(1, StreamingSettings(local_steps=3, fragments=1, delay=3, eager=True), rounds=4)
  plain, _ = run(1, StreamingSettings(local_steps=3, fragments=1, delay=0), rounds=4)
  for a, b in zip(jax.tree.leaves(eager[-1]["outer"]), jax.tree.leaves(plain[-1]["outer"]), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


@pytest.mark.parametrize("settings", [StreamingSettings(258, 1, 0), StreamingSettings(258, 2, 129)])
def test_a_round_past_cpythons_cached_ints_compares_its_boundaries_by_value(settings):
  """H = 258: a round's boundaries are ints past 256, so two of equal value are distinct objects. A sync and an
  application share a boundary, and the last sync is at H: a segment between them must be empty by value and
  skipped (local_run refuses a segment of no steps), and at tau = 129 that sync, at the round's end, is carried to
  the next round by value (compared by identity, it is not carried, and round 2 applies a zero mean). Two rounds, M = 2,
  against the oracle (each round's inner steps a scan: unroll=1)."""
  got, expected = run(2, settings, rounds=2, unroll=1)
  assert_rounds_agree(got, expected, 2)


def test_a_state_or_batches_not_laid_out_one_learner_per_device_are_refused_naming_the_field():
  # Four learners' state over a mesh of two devices would put two learners on each, and the round, which reads one
  # per device, would return two: refused before any trace.
  settings = StreamingSettings(local_steps=2, fragments=2, delay=1, eager=True)
  mesh = learner_mesh(devices=jax.devices()[:2])
  inner, outer = optax.sgd(INNER_ETA, momentum=0.5), optax.sgd(OUTER_ETA, momentum=OUTER_BETA)  # states with leaves
  x, y = oracle.streams(1, settings.local_steps)[0]
  two = (np.stack([x, x]), np.stack([y, y]))
  round_of = lambda state, batches, **options: sharded_streaming_round(
    linear_loss, inner, outer, mesh, settings, state, batches, **options
  )
  allowed = r"allowed: leaves with a leading learners axis of size 2 \(one per device\)"
  four = init_streaming(inner, outer, oracle.initial_weights(), 4, settings)
  with pytest.raises(ValueError, match=r"^state\.outer_params=.*" + allowed):
    round_of(four, two)
  state = init_streaming(inner, outer, oracle.initial_weights(), 2, settings)
  for field in ("outer_states", "local_params", "inner_states", "own_previous", "unreduced"):
    with pytest.raises(ValueError, match=rf"^state\.{field}=.*" + allowed):
      round_of(state._replace(**{field: getattr(four, field)}), two)
  with pytest.raises(ValueError, match=r"^batches=.*" + allowed):
    round_of(state, (np.stack([x] * 4), np.stack([y] * 4)))
  with pytest.raises(ValueError, match=r"^axis_name='workers'; allowed: an axis of the mesh, one of \('learners',\)"):
    round_of(state, two, axis_name="workers")
  assert jax.eval_shape(round_of, state, two).losses.shape == (2,)  # the same state and batches at M = 2 trace


def test_by_default_a_round_runs_its_inner_steps_as_straight_line_code():
  # unroll=True (the default): no loop for XLA, the H steps written out; unroll=1: one scan over them.
  settings = StreamingSettings(local_steps=4, fragments=2, delay=1)
  mesh = learner_mesh(devices=jax.devices()[:2])
  inner, outer = optax.sgd(INNER_ETA), optax.sgd(OUTER_ETA)
  state = init_streaming(inner, outer, oracle.initial_weights(), 2, settings)
  x, y = oracle.streams(1, settings.local_steps)[0]
  batches = (np.stack([x, x]), np.stack([y, y]))
  program = lambda **options: str(
    jax.make_jaxpr(lambda s, b: sharded_streaming_round(linear_loss, inner, outer, mesh, settings, s, b, **options))(
      state, batches
    )
  )
  assert "scan" not in program() and "scan" in program(unroll=1)
