"""Delayed Nesterov (`stalesgd.delayed_nesterov`), pinned by hand and against optax's Nesterov SGD.

The equation, for the t-th pseudo-gradient g_t, buffer Delta and momentum m (both 0 at first):
Delta += g_t; if (t+1) mod N == 0: m = beta m + Delta / N, d_t = (1 - cN + c) beta m + g_t / N, Delta = 0;
else d_t = c beta m + g_t / N. The expected values below are worked out by hand from it.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import stalesgd


def _directions(transform, grads):
  state = transform.init({"w": jnp.zeros(())})
  out = []
  for g in grads:
    d, state = transform.update({"w": jnp.asarray(g, jnp.float32)}, state)
    out.append(float(d["w"]))
  return out, state


def test_buffer_two_activation_half_by_hand():
  """beta = 0.9, N = 2, c = 0.5, so 1 - cN + c = 0.5; g = 1, 2, -1, 4:
  t=0 (no momentum update): d = 0.5*0.9*0 + 1/2 = 0.5;
  t=1: Delta = 3, m = 0 + 3/2 = 1.5, d = 0.5*0.9*1.5 + 2/2 = 1.675;
  t=2: Delta = -1, d = 0.5*0.9*1.5 - 1/2 = 0.175;
  t=3: Delta = 3, m = 0.9*1.5 + 3/2 = 2.85, d = 0.5*0.9*2.85 + 4/2 = 3.2825."""
  directions, state = _directions(stalesgd.scale_by_delayed_nesterov(0.9, buffer_size=2, activation=0.5), [1, 2, -1, 4])
  np.testing.assert_allclose(directions, [0.5, 1.675, 0.175, 3.2825], rtol=1e-6)
  assert int(state.count) == 4 and float(state.buffer["w"]) == 0.0
  np.testing.assert_allclose(float(state.momentum["w"]), 2.85, rtol=1e-6)


def test_buffer_three_without_activation_applies_no_momentum_between_updates():
  """beta = 0.5, N = 3, c = 0 (1 - cN + c = 1); g = 3, 6, 9, 3:
  t=0, 1: d = g/3 = 1, 2 (no momentum); t=2: Delta = 18, m = 6, d = 0.5*6 + 9/3 = 6;
  t=3: Delta = 3, d = 0*0.5*6 + 3/3 = 1."""
  directions, _ = _directions(stalesgd.scale_by_delayed_nesterov(0.5, buffer_size=3, activation=0.0), [3, 6, 9, 3])
  np.testing.assert_allclose(directions, [1.0, 2.0, 6.0, 1.0], rtol=1e-6)


def test_one_buffer_without_activation_is_optax_nesterov_sgd():
  """N = 1, c = 0 is Nesterov SGD; optax's implementation is the independent reference."""
  rng = np.random.default_rng(0)
  params = {"w": jnp.asarray(rng.normal(size=(3, 2)), jnp.float32), "b": jnp.asarray(rng.normal(size=2), jnp.float32)}
  ours, reference = stalesgd.delayed_nesterov(0.7, momentum=0.9), optax.sgd(0.7, momentum=0.9, nesterov=True)
  ours_state, reference_state = ours.init(params), reference.init(params)
  for _ in range(6):
    grads = jax.tree.map(lambda p: jnp.asarray(rng.normal(size=p.shape), jnp.float32), params)
    ours_update, ours_state = ours.update(grads, ours_state, params)
    reference_update, reference_state = reference.update(grads, reference_state, params)
    for a, b in zip(jax.tree.leaves(ours_update), jax.tree.leaves(reference_update)):
      np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7)


def test_jitted_updates_equal_eager_ones():
  tx = stalesgd.delayed_nesterov(0.1, momentum=0.9, buffer_size=2, activation=0.25)
  params = {"w": jnp.ones(3)}
  eager_state = jitted_state = tx.init(params)
  update = jax.jit(tx.update)
  for step in range(5):
    grads = {"w": jnp.full(3, float(step) - 1.5)}
    eager, eager_state = tx.update(grads, eager_state)
    jitted, jitted_state = update(grads, jitted_state)
    np.testing.assert_array_equal(eager["w"], jitted["w"])


@pytest.mark.parametrize(
  "kwargs, message",
  [
    ({"buffer_size": 0}, r"buffer_size=0; allowed: an integer >= 1"),
    ({"buffer_size": 2.0}, r"buffer_size=2\.0; allowed: an integer >= 1"),
    # A Python int only: N is static (a numpy integer could be an inject_hyperparams array's stand-in).
    ({"buffer_size": np.int64(2)}, r"buffer_size=np\.int64\(2\); allowed: a Python int >= 1"),
    ({"activation": 1.5}, r"activation=1\.5; allowed: a finite number >= 0 and <= 1"),
    ({"momentum": -0.1}, r"momentum=-0\.1; allowed: a finite number >= 0 and <= 1"),
    ({"momentum": True}, r"momentum=True; allowed: a finite number >= 0 and <= 1"),  # a bool is not a number
  ],
)
def test_bad_arguments_are_refused_naming_them(kwargs, message):
  with pytest.raises(ValueError, match=message):
    stalesgd.scale_by_delayed_nesterov(**kwargs)


def test_buffer_three_with_a_quarter_activation_by_hand():
  """beta = 0.5, N = 3, c = 0.25: 1 - cN + c = 0.5, so the momentum applied over one cycle, c beta m twice and
  0.5 beta m once, is beta m. g = 1, 2, 3, 4, 5, 6:
  t=0, 1: d = g/3 (m = 0); t=2: Delta = 6, m = 2, d = 0.5*0.5*2 + 3/3 = 1.5;
  t=3, 4: d = 0.25*0.5*2 + g/3 = 0.25 + 4/3, 0.25 + 5/3; t=5: Delta = 15, m = 0.5*2 + 5 = 6, d = 0.5*0.5*6 + 2 = 3.5."""
  directions, state = _directions(
    stalesgd.scale_by_delayed_nesterov(0.5, buffer_size=3, activation=0.25), [1, 2, 3, 4, 5, 6]
  )
  np.testing.assert_allclose(directions, [1 / 3, 2 / 3, 1.5, 0.25 + 4 / 3, 0.25 + 5 / 3, 3.5], rtol=1e-6)
  np.testing.assert_allclose(float(state.momentum["w"]), 6.0, rtol=1e-6)


def test_defaults_are_momentum_point_nine_one_buffer_and_no_activation():
  """Defaults beta = 0.9, N = 1, c = 0. g = 1, 2: m = 1, d = 0.9 + 1 = 1.9; m = 0.9 + 2 = 2.9, d = 2.61 + 2 = 4.61.
  With N = 2 and the default c = 0, g = 1, 2, 4: d = 1/2; Delta = 3, m = 1.5, d = 0.9*1.5 + 1 = 2.35;
  d = 0*0.9*1.5 + 4/2 = 2. delayed_nesterov(0.5) takes the same defaults and steps -0.5 d."""
  directions, _ = _directions(stalesgd.scale_by_delayed_nesterov(), [1, 2])
  np.testing.assert_allclose(directions, [1.9, 4.61], rtol=1e-6)
  directions, _ = _directions(stalesgd.scale_by_delayed_nesterov(buffer_size=2), [1, 2, 4])
  np.testing.assert_allclose(directions, [0.5, 2.35, 2.0], rtol=1e-6)
  steps, _ = _directions(stalesgd.delayed_nesterov(0.5), [1, 2])
  np.testing.assert_allclose(steps, [-0.95, -2.305], rtol=1e-6)
  steps, _ = _directions(stalesgd.delayed_nesterov(0.5, buffer_size=2), [1, 2, 4])
  np.testing.assert_allclose(steps, [-0.25, -1.175, -1.0], rtol=1e-6)


def test_inject_hyperparams_passes_arrays_that_are_not_checked_and_give_the_same_directions():
  """optax.inject_hyperparams rebuilds the transform with momentum and activation as arrays (buffer_size static);
  the directions are those of test_buffer_three_with_a_quarter_activation_by_hand."""
  injected = optax.inject_hyperparams(stalesgd.scale_by_delayed_nesterov, static_args=("buffer_size",))
  directions, _ = _directions(injected(momentum=0.5, buffer_size=3, activation=0.25), [1, 2, 3, 4, 5, 6])
  np.testing.assert_allclose(directions, [1 / 3, 2 / 3, 1.5, 0.25 + 4 / 3, 0.25 + 5 / 3, 3.5], rtol=1e-6)


@pytest.mark.parametrize("buffer_size", [1, 2, 3, 7])
def test_the_buffer_phase_is_never_negative_for_any_int32_count(buffer_size):
  """(count + 1) mod N, which decides a momentum update (== 0), lies in [0, N) for every int32 count, a wrapped
  negative one included (the remainder takes the divisor's sign), so `== 0` and `<= 0` decide alike."""
  rng = np.random.default_rng(0)
  edges = [np.iinfo(np.int32).min, -2, -1, 0, 1, np.iinfo(np.int32).max - 1, np.iinfo(np.int32).max]
  counts = jnp.asarray(
    np.concatenate([edges, rng.integers(np.iinfo(np.int32).min, np.iinfo(np.int32).max, 1000)]), jnp.int32
  )
  phase = np.asarray((counts + 1) % buffer_size)
  assert phase.min() >= 0 and phase.max() < buffer_size
