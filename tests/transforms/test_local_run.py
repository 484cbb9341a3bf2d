"""Local runs and DiLoCo's synchronous outer step (stalesgd/transforms/_local_run.py) against numpy.

The equations pinned (module docstring of `_local_run`; Douillard et al., arXiv 2311.08105, Algorithm 1):

  theta_{m,0} = theta_j;  u_i, s_{i+1} = InnerOpt(grad L(theta_{m,i}; b_i), s_i);  theta_{m,i+1} = theta_{m,i} + u_i
  Delta_m = -(u_0 + ... + u_{H-1});  losses_i = L(theta_{m,i}; b_i)
  s_0 = the state kept from the previous round, or InnerOpt.init (reset_inner_state)
  Delta_bar = (1/M) sum_m Delta_m;  theta <- theta + OuterOpt(Delta_bar)

The references (tests/helpers/local_run_reference.py) are written out in float64 numpy from these equations and
optax's documented updates, never by calling the code under test: SGD u = -eta g; momentum SGD (optax.trace)
v <- g + beta v, u = -eta v; Nesterov SGD v <- g + beta v, u = -eta (g + beta v). The loss is linear least squares,
L(w, b; x, y) = 0.5 mean((x w + b - y)^2), whose gradient is (x^T r / n, mean r) with r = x w + b - y.

Tolerances: the library runs in float32 and the references in float64, so a float32 result carries the rounding
of its few dozen operations (each within 2^-24 relative); rtol 1e-6 with atol 1e-7 (for entries near zero) holds
that with margin, and each one-token change to the equations tried (the sign of Delta, a sum for the mean, a
difference for the sum of updates, reset for keep, the batches in reverse, the gradient at theta_j instead of
theta_{m,i}, Delta_bar applied without OuterOpt) fails a test here. Where the claim is exactness (H = 1 at unit
rate, the hand-computed dyadic numbers, the reset ignoring the state passed), the check is bit for bit; jit and
vmap against a loop over learners are compared to rtol 1e-6 (that test says why).
"""

from __future__ import annotations

import doctest
import functools

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from stalesgd.transforms import _local_run as local_run_lib
from stalesgd.transforms._local_run import agreement, diloco_round, init_inner_states, local_run, local_steps
from tests.helpers.local_run_reference import (
  RTOL,
  as_float64,
  assert_tree_close,
  assert_trees_equal,
  batch_stream,
  initial_params,
  learner_batches,
  least_squares,
  numpy_diloco,
  numpy_inner_run,
  numpy_loss_and_gradient,
)


def test_one_step_of_unit_sgd_without_state_is_the_gradient_bit_for_bit():
  """H = 1, InnerOpt = SGD at rate 1 without state: Delta = -(0 + (-1 * g)) = g exactly, g = grad L(theta; b_0)."""
  params = initial_params()
  batches = batch_stream(1, 1)
  first_batch = jax.tree.map(lambda leaf: leaf[0], batches)
  inner = optax.sgd(1.0)
  run = local_run(least_squares, inner, params, inner.init(params), batches)
  loss, grads = jax.value_and_grad(least_squares)(params, first_batch)
  assert_trees_equal(run.pseudo_gradient, grads)
  np.testing.assert_array_equal(run.losses, [loss])
  # The same under jit, against the jitted gradient; and the gradient is the numpy one.
  jitted = jax.jit(functools.partial(local_run, least_squares, inner))(params, inner.init(params), batches)
  assert_trees_equal(jitted.pseudo_gradient, jax.jit(jax.grad(least_squares))(params, first_batch))
  _, numpy_grads = numpy_loss_and_gradient(as_float64(params), first_batch)
  assert_tree_close(run.pseudo_gradient, numpy_grads)


def test_one_step_keeps_the_sign_of_a_zero_gradient():
  """Delta = -(-0.0 + u_0) reproduces g's bits for signed zeros too: g = +0.0 gives u_0 = -0.0 and Delta = +0.0
  (a sum started at +0.0 would give -0.0); g = -0.0 gives u_0 = +0.0 and Delta = -0.0."""
  gradient = np.array([0.0, -0.0, 1.5], np.float32)
  inner = optax.sgd(1.0)
  params = jnp.zeros(3)
  run = local_run(lambda w, b: jnp.sum(w * b), inner, params, inner.init(params), gradient[None])
  np.testing.assert_array_equal(np.asarray(run.pseudo_gradient).view(np.uint32), gradient.view(np.uint32))


def test_three_sgd_steps_by_hand():
  """L(w; b) = 0.5 (w - b)^2, so g = w - b; SGD(0.5) from w = 0 on b = 2, 4, -2:
  w: 0 -> 0 - 0.5 (0 - 2) = 1 -> 1 - 0.5 (1 - 4) = 2.5 -> 2.5 - 0.5 (2.5 + 2) = 0.25;
  Delta = -(1 + 1.5 - 2.25) = -0.25; losses 0.5 * (2^2, 3^2, 4.5^2) = 2, 4.5, 10.125 (all exact in float32)."""
  loss = lambda w, b: 0.5 * (w - b) ** 2
  inner = optax.sgd(0.5)
  run = local_run(loss, inner, jnp.float32(0), inner.init(jnp.float32(0)), jnp.array([2.0, 4.0, -2.0]))
  np.testing.assert_array_equal(run.pseudo_gradient, -0.25)
  np.testing.assert_array_equal(run.params, 0.25)
  np.testing.assert_array_equal(run.losses, [2.0, 4.5, 10.125])


def test_step_factors_scale_each_update_by_hand():
  """The same three steps with factors 1, 0.5, 2: w: 0 -> 0 - 1 * 0.5 (0 - 2) = 1 -> 1 - 0.5 * 0.5 (1 - 4) = 1.75
  -> 1.75 - 2 * 0.5 (1.75 + 2) = -2; Delta = 0 - (-2) = 2 (all exact in float32), in the scan and unrolled."""
  loss = lambda w, b: 0.5 * (w - b) ** 2
  inner = optax.sgd(0.5)
  for unroll in (1, True):
    run = local_run(
      loss,
      inner,
      jnp.float32(0),
      inner.init(jnp.float32(0)),
      jnp.array([2.0, 4.0, -2.0]),
      step_scales=jnp.array([1.0, 0.5, 2.0]),
      unroll=unroll,
    )
    np.testing.assert_array_equal(run.params, -2.0)
    np.testing.assert_array_equal(run.pseudo_gradient, 2.0)


def test_three_momentum_steps_by_hand():
  """Same loss and batches, momentum SGD(0.5, 0.5): v <- g + 0.5 v, w <- w - 0.5 v.
  i=0: g = -2, v = -2, w = 1; i=1: g = -3, v = -4, w = 3; i=2: g = 5, v = 3, w = 1.5.
  Delta = -(1 + 2 - 1.5) = -1.5; losses 0.5 * (4, 9, 25) = 2, 4.5, 12.5; the velocity kept is 3."""
  loss = lambda w, b: 0.5 * (w - b) ** 2
  inner = optax.sgd(0.5, momentum=0.5)
  run = local_run(loss, inner, jnp.float32(0), inner.init(jnp.float32(0)), jnp.array([2.0, 4.0, -2.0]))
  np.testing.assert_array_equal(run.pseudo_gradient, -1.5)
  np.testing.assert_array_equal(run.losses, [2.0, 4.5, 12.5])
  np.testing.assert_array_equal(jax.tree.leaves(run.inner_state)[0], 3.0)


@pytest.mark.parametrize(
  "beta, nesterov", [(None, False), (0.9, False), (0.9, True)], ids=["sgd", "momentum", "nesterov"]
)
def test_three_inner_steps_against_numpy(beta, nesterov):
  """H = 3 from theta_0: Delta = theta_0 - theta_3 of the numpy loop, theta_3, and L(theta_i; b_i), i = 0, 1, 2."""
  eta = 0.05
  params, batches = initial_params(), batch_stream(2, 3)
  inner = optax.sgd(eta) if beta is None else optax.sgd(eta, momentum=beta, nesterov=nesterov)
  run = local_run(least_squares, inner, params, inner.init(params), batches)
  zeros = {k: np.zeros_like(v, np.float64) for k, v in params.items()}
  delta, weights, _, losses = numpy_inner_run(params, zeros, batches, eta, beta, nesterov)
  assert_tree_close(run.pseudo_gradient, delta)
  assert_tree_close(run.params, weights)
  np.testing.assert_allclose(run.losses, losses, rtol=RTOL)


@pytest.mark.parametrize("reset", [False, True], ids=["kept", "reset"])
def test_inner_state_is_kept_or_reset_across_two_rounds(reset):
  """Momentum SGD(0.05, 0.9), H = 3, two rounds; round 2 starts from theta_1 = theta_0 - 0.5 Delta_1 and reads
  batches 3..5. Kept: round 2's velocity starts where round 1's ended; reset: at 0 (InnerOpt.init)."""
  eta, beta, steps = 0.05, 0.9, 3
  params, stream = initial_params(), batch_stream(3, 2 * steps)
  first, second = (jax.tree.map(lambda leaf, r=r: leaf[r * steps : (r + 1) * steps], stream) for r in range(2))
  inner = optax.sgd(eta, momentum=beta)
  run = functools.partial(local_run, least_squares, inner, reset_inner_state=reset)
  round_1 = run(params, inner.init(params), first)
  pulled = jax.tree.map(lambda theta, delta: theta - 0.5 * delta, params, round_1.pseudo_gradient)
  round_2 = run(pulled, round_1.inner_state, second)

  zeros = {k: np.zeros_like(v, np.float64) for k, v in params.items()}
  delta_1, _, velocity_1, _ = numpy_inner_run(params, zeros, first, eta, beta)
  pulled_64 = {k: np.float64(params[k]) - 0.5 * delta_1[k] for k in params}
  delta_2, _, velocity_2, losses_2 = numpy_inner_run(pulled_64, zeros if reset else velocity_1, second, eta, beta)
  assert_tree_close(round_2.pseudo_gradient, delta_2)
  assert_tree_close(round_2.inner_state[0].trace, velocity_2)
  np.testing.assert_allclose(round_2.losses, losses_2, rtol=RTOL)
  # The option matters here: the other choice's Delta is far from this one's.
  other_delta = numpy_inner_run(pulled_64, velocity_1 if reset else zeros, second, eta, beta)[0]
  assert np.abs(other_delta["w"] - delta_2["w"]).max() > 1e-3


def test_synchronous_diloco_against_numpy():
  """M = 3, H = 2, inner SGD(0.1), OuterOpt = optax.sgd(0.7, momentum=0.9, nesterov=True), 3 rounds:
  Delta_bar = (1/3) sum_m Delta_m; v <- Delta_bar + 0.9 v; theta <- theta - 0.7 (Delta_bar + 0.9 v)."""
  learners, steps, rounds = 3, 2, 3
  params = initial_params()
  streams = [batch_stream(10 + m, rounds * steps) for m in range(learners)]
  inner, outer = optax.sgd(0.1), optax.sgd(0.7, momentum=0.9, nesterov=True)
  step = jax.jit(functools.partial(diloco_round, least_squares, inner, outer))
  outer_state, inner_states = outer.init(params), init_inner_states(inner, params, learners)
  reference = numpy_diloco(params, streams, rounds, steps, 0.1, 0.7, 0.9)
  for r in range(rounds):
    out = step(params, outer_state, inner_states, learner_batches(streams, r, steps))
    params, outer_state, inner_states = out.params, out.outer_state, out.inner_states
    theta, deltas, losses = reference[r]
    for m in range(learners):
      assert_tree_close(jax.tree.map(lambda leaf, m=m: leaf[m], out.pseudo_gradients), deltas[m])
    np.testing.assert_allclose(out.losses, losses, rtol=RTOL)
    assert_tree_close(params, theta)


@pytest.mark.parametrize("reset", [False, True], ids=["kept", "reset"])
def test_one_learner_with_outer_unit_sgd_is_the_inner_optimizer_alone(reset):
  """M = 1, OuterOpt = SGD(1) without momentum: theta <- theta - Delta_1 = theta_{1,H}, so R rounds of H steps are
  the inner optimizer alone for R H steps on the same batches; with momentum SGD(0.05, 0.9) inside, only when the
  inner state is kept (reset zeroes the velocity at every round: numpy's reference does the same)."""
  steps, rounds, eta, beta = 3, 3, 0.05, 0.9
  params = initial_params()
  stream = batch_stream(20, rounds * steps)
  inner, outer = optax.sgd(eta, momentum=beta), optax.sgd(1.0)
  step = jax.jit(functools.partial(diloco_round, least_squares, inner, outer, reset_inner_state=reset))
  outer_state, inner_states = outer.init(params), init_inner_states(inner, params, 1)
  theta, velocity = as_float64(params), {k: np.zeros_like(v, np.float64) for k, v in params.items()}
  for r in range(rounds):
    out = step(params, outer_state, inner_states, learner_batches([stream], r, steps))
    params, outer_state, inner_states = out.params, out.outer_state, out.inner_states
    start = {k: np.zeros_like(v) for k, v in velocity.items()} if reset else velocity
    rows = jax.tree.map(lambda leaf, r=r: leaf[r * steps : (r + 1) * steps], stream)
    _, theta, velocity, _ = numpy_inner_run(theta, start, rows, eta, beta)
  assert_tree_close(params, theta)
  if not reset:  # the whole run is one numpy loop of R H momentum steps
    zeros = {k: np.zeros_like(v, np.float64) for k, v in theta.items()}
    _, alone, _, _ = numpy_inner_run(initial_params(), zeros, stream, eta, beta)
    assert_tree_close(params, alone)


def test_jit_vmap_and_a_loop_over_learners_give_the_same_numbers():
  """The round's numbers do not depend on how it is run: eager, jitted, and the learners axis vmapped (inside
  diloco_round) or a Python loop of jitted local_run over learners with the mean and the outer step written out.

  Equal to rtol 1e-6, not bit for bit: XLA:CPU compiles the vmapped program (leaves [M, ...], batched dot
  products) differently from the one-learner program. It contracts a * b + c into one fused multiply-add (one
  rounding instead of two) in some loops and not others (on a separable loss, the vmapped momentum step matched a
  float32 numpy emulation with FMA and the one-learner step one without), and a batched dot product may sum in
  another order; so the last bits can differ (observed: at most 3 ulp after a round). The sum, the mean over
  learners and the outer step are the same ops in both."""
  learners, steps = 3, 2
  params = initial_params()
  streams = [batch_stream(30 + m, steps) for m in range(learners)]
  batches = learner_batches(streams, 0, steps)
  inner, outer = optax.sgd(0.1, momentum=0.9), optax.sgd(0.7, momentum=0.9, nesterov=True)
  args = (params, outer.init(params), init_inner_states(inner, params, learners), batches)
  eager = diloco_round(least_squares, inner, outer, *args)
  jitted = jax.jit(functools.partial(diloco_round, least_squares, inner, outer))(*args)

  runs = [
    jax.jit(functools.partial(local_run, least_squares, inner))(
      params, inner.init(params), jax.tree.map(lambda leaf, m=m: leaf[m], batches)
    )
    for m in range(learners)
  ]
  deltas = {k: np.stack([run.pseudo_gradient[k] for run in runs]) for k in params}
  mean = jax.tree.map(lambda leaf: jnp.mean(leaf, axis=0), deltas)
  updates, _ = outer.update(mean, outer.init(params), params)
  looped = optax.apply_updates(params, updates)

  for other in (jitted, eager):
    assert_tree_close(other.pseudo_gradients, deltas)
    assert_tree_close(other.params, looped)
    np.testing.assert_allclose(other.losses, np.stack([run.losses for run in runs]), rtol=RTOL)


def test_reset_ignores_the_inner_state_passed():
  """With reset_inner_state, s_0 = InnerOpt.init(theta_j) whatever state is passed (None included)."""
  params, batches = initial_params(), batch_stream(4, 2)
  inner = optax.sgd(0.05, momentum=0.9)
  busy = jax.tree.map(lambda leaf: leaf + 7.0, inner.init(params))
  fresh = local_run(least_squares, inner, params, inner.init(params), batches)
  for state in (busy, None):
    assert_trees_equal(local_run(least_squares, inner, params, state, batches, reset_inner_state=True), fresh)


def test_aux_is_returned_per_step():
  """With has_aux, aux_i is loss_fn's second output at theta_{m,i}: here the residual's mean."""
  params, batches = initial_params(), batch_stream(5, 2)

  def loss_with_aux(p, batch):
    x, y = batch
    residual = x @ p["w"] + p["b"] - y
    return 0.5 * jnp.mean(residual**2), jnp.mean(residual)

  inner = optax.sgd(0.05)
  run = local_run(loss_with_aux, inner, params, inner.init(params), batches, has_aux=True)
  plain = local_run(least_squares, inner, params, inner.init(params), batches)
  assert_trees_equal(run.pseudo_gradient, plain.pseudo_gradient)
  weights = as_float64(params)
  for i in range(2):
    _, grads = numpy_loss_and_gradient(weights, (batches[0][i], batches[1][i]))
    residual = batches[0][i] @ weights["w"] + weights["b"] - batches[1][i]
    np.testing.assert_allclose(run.aux[i], np.mean(residual), rtol=1e-5, atol=1e-6)
    weights = {k: weights[k] - 0.05 * grads[k] for k in weights}


@pytest.mark.parametrize(
  "kwargs, message",
  [
    (
      {"batches": (np.zeros((2, 4, 3)), np.zeros((3, 4)))},
      r"batches=\[\(2, 4, 3\), \(3, 4\)\]; allowed: leaves sharing",
    ),
    ({"batches": np.zeros((0, 4))}, r"batches=\[\(0, 4\)\]; allowed"),
    ({"reset_inner_state": 1}, r"reset_inner_state=1; allowed: True or False"),
  ],
)
def test_bad_arguments_are_refused_naming_them(kwargs, message):
  inner = optax.sgd(0.1)
  arguments = {"batches": np.zeros((2, 4))} | kwargs
  batches = arguments.pop("batches")
  with pytest.raises(ValueError, match=message):
    local_run(lambda p, b: jnp.sum(p * b), inner, jnp.zeros(4), inner.init(jnp.zeros(4)), batches, **arguments)


def test_init_inner_states_refuses_no_learners():
  with pytest.raises(ValueError, match=r"num_learners=0; allowed: an integer >= 1"):
    init_inner_states(optax.sgd(0.1), jnp.zeros(2), 0)


def test_agreement_by_hand():
  # Delta_1 = (1, 0), Delta_2 = (0, 1): orthogonal; mean (0.5, 0.5), ||mean||^2 = 0.5: (4 * 0.5 - 2) / (1 * 2) = 0.
  assert float(agreement(jnp.float32(2.0), jnp.float32(0.5), 2)) == 0.0
  # Delta_2 = Delta_1 = (3, 4): (4 * 25 - 50) / 50 = 1; Delta_2 = -Delta_1: (0 - 50) / 50 = -1.
  assert float(agreement(jnp.float32(50.0), jnp.float32(25.0), 2)) == 1.0
  assert float(agreement(jnp.float32(50.0), jnp.float32(0.0), 2)) == -1.0
  # Three learners, (1, 0), (1, 0), (-1, 0): the ordered pairs' dots sum to 2 (1 - 1 - 1) = -2, the squared norms
  # to 3: -2 / (2 * 3) = -1/3; the mean (1/3, 0), so by the formula (9 * 1/9 - 3) / (2 * 3) = -1/3.
  assert float(agreement(jnp.float32(3.0), jnp.float32(1 / 9), 3)) == pytest.approx(-1 / 3)
  # Norms below 1: Delta_1 = (0.5, 0), Delta_2 = (0, 0.5), sum of squares 0.5, mean (0.25, 0.25):
  # (4 x 0.125 - 0.5) / 0.5 = 0.
  assert float(agreement(jnp.float32(0.5), jnp.float32(0.125), 2)) == 0.0
  # One learner, or pseudo-gradients that are all zero: 1 by definition (the formula would divide by zero).
  assert float(agreement(jnp.float32(4.0), jnp.float32(4.0), 1)) == 1.0
  assert float(agreement(jnp.float32(0.0), jnp.float32(0.0), 2)) == 1.0


def test_a_scalar_batch_has_no_steps():
  """H is the batches' leading axis: a scalar leaf has none, so it is refused, alone or beside a leaf of H = 1; no
  leaf at all is refused too."""
  with pytest.raises(ValueError, match=r"batches=\[\]; allowed: leaves sharing"):
    local_steps({})
  for batches in (np.float32(0.0), (np.zeros((1, 4)), np.float32(0.0))):
    with pytest.raises(ValueError, match=r"batches=\[.*\(\)\]; allowed: leaves sharing"):
      local_steps(batches)
  assert local_steps((np.zeros((3, 4)), np.zeros((3,)))) == 3


def test_local_runs_options_are_keyword_only():
  inner = optax.sgd(0.1)
  loss = lambda p, b: jnp.sum(p * b)
  with pytest.raises(TypeError):
    local_run(loss, inner, jnp.zeros(4), inner.init(jnp.zeros(4)), np.zeros((2, 4)), True)
  states = init_inner_states(inner, jnp.zeros(4), 2)
  with pytest.raises(TypeError):
    diloco_round(loss, inner, inner, jnp.zeros(4), inner.init(jnp.zeros(4)), states, np.zeros((2, 2, 4)), True)


def test_steps_past_active_steps_change_nothing_and_report_a_zero_loss():
  """H = 4 with active_steps = 2, loss 0.5 (w - b)^2, SGD at 0.5 from w = 0 on b = 2, 4, 8, 16: w 0 -> 1 -> 2.5
  and stops; Delta = -2.5; losses 0.5 (0 - 2)^2 = 2, 0.5 (1 - 4)^2 = 4.5 and 0 for the two steps not taken."""
  loss = lambda w, b: 0.5 * (w - b) ** 2
  inner = optax.sgd(0.5)
  theta = jnp.float32(0.0)
  out = local_run(loss, inner, theta, inner.init(theta), jnp.array([2.0, 4.0, 8.0, 16.0]), active_steps=2)
  assert float(out.params) == 2.5 and float(out.pseudo_gradient) == -2.5
  assert out.losses.tolist() == [2.0, 4.5, 0.0, 0.0]


def test_a_round_keeps_the_inner_state_by_default():
  """One learner, H = 1, SGD at 0.5 with momentum 0.5 whose trace holds 4 from an earlier round, loss 0.5 (w - 2)^2
  at w = 0 (gradient -2): kept (DiLoCo's default), trace -2 + 0.5 x 4 = 0 and Delta = 0; reset, trace -2 and
  Delta = -1."""
  loss = lambda w, b: 0.5 * (w - b) ** 2
  inner, outer = optax.sgd(0.5, momentum=0.5), optax.sgd(1.0)
  theta = jnp.float32(0.0)
  states = jax.tree.map(lambda leaf: jnp.full_like(leaf, 4.0), init_inner_states(inner, theta, 1))
  batches = jnp.array([[2.0]])
  kept = diloco_round(loss, inner, outer, theta, outer.init(theta), states, batches)
  assert kept.pseudo_gradients.tolist() == [0.0]
  reset = diloco_round(loss, inner, outer, theta, outer.init(theta), states, batches, reset_inner_state=True)
  assert reset.pseudo_gradients.tolist() == [-1.0]


def _scans(function, theta):
  """The unroll parameters of the scans in the program of ``function(theta)``, outermost first."""
  found = []

  def visit(jaxpr):
    for equation in jaxpr.eqns:
      if equation.primitive.name == "scan":
        found.append(equation.params["unroll"])
      for sub in jax.extend.core.jaxprs_in_params(equation.params):
        visit(sub)

  visit(jax.make_jaxpr(function)(theta).jaxpr)
  return found


def test_unroll_true_is_straight_line_code_and_the_default_a_rolled_scan():
  """``unroll=True`` writes the H steps out (no scan in the program: the docstring's exactness argument); the
  default, 1, is one `jax.lax.scan` over the steps that XLA does not unroll, for `local_run` and `diloco_round`."""
  loss = lambda w, b: jnp.sum((w - b) ** 2)
  inner, outer = optax.sgd(0.5), optax.sgd(1.0)
  batches, round_batches = jnp.ones((3, 2)), jnp.ones((2, 3, 2))
  run = lambda theta, **options: local_run(loss, inner, theta, inner.init(theta), batches, **options)
  rounds = lambda theta, **options: diloco_round(
    loss, inner, outer, theta, outer.init(theta), init_inner_states(inner, theta, 2), round_batches, **options
  )
  for function in (run, rounds):
    assert _scans(function, jnp.zeros(2)) == [1]
    assert _scans(functools.partial(function, unroll=True), jnp.zeros(2)) == []


def test_docstring_examples():
  result = doctest.testmod(local_run_lib, optionflags=doctest.NORMALIZE_WHITESPACE)
  assert result.attempted > 0
  assert result.failed == 0
