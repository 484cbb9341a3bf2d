"""Streaming DiLoCo over a mesh (stalesgd/decentral/_streaming.py) against a numpy reference, one inner step at a
time (tests/helpers/local_run_reference.py: written from the equations, without stalesgd).

float32 against float64 after 4 rounds: RTOL 1e-5, ATOL 1e-6 (the float32 rounding of about 50 SGD and outer
steps; measured differences are below 1e-6 relative).
"""

from __future__ import annotations

import jax
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
from tests.helpers.local_run_reference import (
  assert_tree_close,
  batch_stream,
  initial_params,
  least_squares,
  numpy_streaming_diloco,
)

RTOL, ATOL = 1e-5, 1e-6
INNER_ETA, OUTER_ETA, OUTER_BETA = 0.1, 0.7, 0.9
ROUNDS = 4


def run(learners, settings, rounds=ROUNDS):
  mesh = learner_mesh(devices=jax.devices()[:learners])
  inner, outer = optax.sgd(INNER_ETA), optax.sgd(OUTER_ETA, momentum=OUTER_BETA, nesterov=True)
  steps = settings.local_steps
  streams = [batch_stream(seed=20 + m, steps=rounds * steps) for m in range(learners)]
  state = init_streaming(inner, outer, initial_params(), learners, settings)
  step = jax.jit(
    lambda state, batches: sharded_streaming_round(least_squares, inner, outer, mesh, settings, state, batches)
  )
  for r in range(rounds):
    batches = tuple(np.stack([stream[part][r * steps : (r + 1) * steps] for stream in streams]) for part in range(2))
    state = step(state, batches).state
  expected = numpy_streaming_diloco(
    initial_params(), streams, rounds, steps, settings.fragments, settings.delay, settings.mix,
    INNER_ETA, OUTER_ETA, OUTER_BETA, eager=settings.eager,
  )  # fmt: skip
  return jax.device_get(state), expected


@pytest.mark.parametrize(
  "learners, settings",
  [
    (3, StreamingSettings(local_steps=4, fragments=2, delay=1, mix=0.5)),  # the non-degenerate case
    (3, StreamingSettings(local_steps=3, fragments=1, delay=0, mix=0.0)),  # synchronous DiLoCo
    (2, StreamingSettings(local_steps=2, fragments=1, delay=2, mix=0.0)),  # the one-round-delayed outer step
    (8, StreamingSettings(local_steps=4, fragments=2, delay=4, mix=0.25)),  # tau = H: applied at the next sync
    (3, StreamingSettings(local_steps=4, fragments=2, delay=4, mix=0.5, eager=True)),  # Kale et al., per fragment
    (2, StreamingSettings(local_steps=3, fragments=1, delay=3, mix=0.0, eager=True)),  # eager one-round-delayed
  ],
  ids=["P2-tau1-alpha0.5", "diloco", "one-round-delayed", "tau-equals-H-8-devices", "eager-P2", "eager-P1"],
)
def test_streaming_rounds_equal_the_numpy_reference(learners, settings):
  state, (outer, local) = run(learners, settings)
  for m in range(learners):
    assert_tree_close(jax.tree.map(lambda leaf, m=m: leaf[m], state.outer_params), outer[m], rtol=RTOL, atol=ATOL)
  if settings.eager:  # each learner's outer step took its own fresh pseudo-gradient: the copies differ
    assert not np.allclose(state.outer_params["w"][0], state.outer_params["w"][1], rtol=1e-4)
  for m in range(learners):
    assert_tree_close(jax.tree.map(lambda leaf, m=m: leaf[m], state.local_params), local[m], rtol=RTOL, atol=ATOL)


def test_a_round_events_are_the_syncs_in_turn_and_their_delayed_applications():
  # H = 4, P = 2, tau = 1: fragment 0 synced after step 2, applied after 3; fragment 1 synced after 4, applied
  # after step 1 of the next round (so first in a round).
  assert round_events(StreamingSettings(4, 2, 1)) == [(1, "apply", 1), (2, "sync", 0), (3, "apply", 0), (4, "sync", 1)]
  # tau = 0: applied right after its own sync; tau = H: applied before the same fragment's next sync.
  assert round_events(StreamingSettings(2, 1, 0)) == [(2, "sync", 0), (2, "apply", 0)]
  assert round_events(StreamingSettings(2, 1, 2)) == [(2, "apply", 0), (2, "sync", 0)]


@pytest.mark.parametrize(
  "settings, message",
  [
    (StreamingSettings(3, 2), "fragments=2; allowed: a divisor of local_steps=3"),
    (StreamingSettings(4, 1, 5), "delay=5"),
    (StreamingSettings(4, 1, 0, 1.5), "mix=1.5"),
    (StreamingSettings(4, 4), "fragments=4; allowed: an integer >= 1 and <= leaves=2"),  # a leaf is never split
  ],
)
def test_bad_settings_are_named(settings, message):
  with pytest.raises(ValueError, match=message):
    init_streaming(optax.sgd(0.1), optax.sgd(0.1), initial_params(), 2, settings)


def test_learners_on_the_same_batches_agree_completely():
  mesh = learner_mesh(devices=jax.devices()[:3])
  settings = StreamingSettings(local_steps=2, fragments=2, delay=1, mix=0.5)
  inner, outer = optax.sgd(INNER_ETA), optax.sgd(OUTER_ETA)
  stream = batch_stream(seed=5, steps=2)
  batches = tuple(np.stack([part] * 3) for part in stream)
  state = init_streaming(inner, outer, initial_params(), 3, settings)
  out = sharded_streaming_round(least_squares, inner, outer, mesh, settings, state, batches)
  assert float(out.agreement) == pytest.approx(1.0, abs=1e-6)


def test_eager_updates_with_one_learner_are_the_fresh_update():
  """M = 1: Delta~ = Delta_bar(prev) + (Delta - Delta(prev)) / 1 = Delta, so eager is DiLoCo; within float32
  rounding (the eager direction is computed as (prev + (Delta - prev)), not as Delta)."""
  eager, _ = run(1, StreamingSettings(local_steps=3, fragments=1, delay=3, eager=True))
  plain, _ = run(1, StreamingSettings(local_steps=3, fragments=1, delay=0))
  for a, b in zip(jax.tree.leaves(eager.outer_params), jax.tree.leaves(plain.outer_params), strict=True):
    np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)
