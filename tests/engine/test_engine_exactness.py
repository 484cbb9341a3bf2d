"""The engine reproduces the naive event-by-event oracle, for every protocol.

Tolerance: 1e-5 relative (max abs difference over max abs value, per leaf),
float32, after >= 100 server updates (several times the deepest staleness, 12
at 8 learners, so every ring slot and pending contribution is reused many
times). Differences come only from XLA fusing the same arithmetic differently
in the two programs.
"""

from __future__ import annotations

import jax
import numpy as np
import optax
import pytest

import stalesgd
from stalesgd import engine as engine_lib
from stalesgd import schedule as schedule_lib
from stalesgd.parallel import _sharding as sharding_lib
from tests.helpers.engine_oracle import MODELS, Data, max_relative_error, run_oracle

NUM_UPDATES = 100
TOLERANCE = 1e-5
LEARNING_RATE = 0.05

PROTOCOLS = {
  "hardsync": ("hardsync", {}),
  "1-softsync": ("softsync", {"n": 1}),
  "2-softsync": ("softsync", {"n": 2}),
  "lambda-softsync": ("softsync", "n=learners"),
  "async": ("async", {}),
  "ssp": ("ssp", {"s": 2}),
  "backup": ("backup", {"backup": 1}),
  "drop_stale": ("drop_stale", {"max_staleness": 2}),
}


def make_optimizer(kind: str) -> optax.GradientTransformation:
  if kind == "plain":
    return optax.chain(stalesgd.average_contributions(), optax.sgd(LEARNING_RATE, momentum=0.9))
  if kind == "staleness_dc":
    # Zhang et al.'s per-gradient alpha0/sigma and DC-ASGD-a's adaptive correction
    # together, so both per-contribution extra args matter.
    return optax.chain(
      stalesgd.scale_by_delay_compensation(dc_lambda=2.0, adaptive=True, decay=0.95),
      stalesgd.scale_by_staleness("inverse"),
      stalesgd.average_contributions(),
      optax.sgd(LEARNING_RATE, momentum=0.9),
    )
  raise ValueError(kind)


def simulate(protocol_name: str, learners: int, seed: int = 0):
  protocol, options = PROTOCOLS[protocol_name]
  if options == "n=learners":
    options = {"n": learners}
  return schedule_lib.simulate(
    protocol, learners=learners, num_updates=NUM_UPDATES, seed=seed, record_events=True, **options
  )  # the oracle reads each gradient's version from the recorded pulls


def run_engine(model: str, optimizer_kind: str, schedule, *, devices=None, plan_options=None, **engine_options):
  loss_fn, init_params, input_shape = MODELS[model]
  mesh = sharding_lib.learner_mesh(devices=devices)
  engine = engine_lib.Engine(loss_fn, make_optimizer(optimizer_kind), mesh=mesh, **engine_options)
  plan = engine.plan(schedule, **(plan_options or {}))
  state = engine.run(engine.init(init_params(), plan), plan, Data(input_shape))
  assert int(state.step) == schedule.num_updates
  return jax.tree_util.tree_map(np.asarray, state.params)


# make_optimizer's chains as the oracle's numpy server step writes them (tests/helpers/engine_oracle.py).
ORACLE_OPTIMIZERS = {
  "plain": {"learning_rate": LEARNING_RATE, "momentum": 0.9},
  "staleness_dc": {
    "learning_rate": LEARNING_RATE,
    "momentum": 0.9,
    "staleness_rule": "inverse",
    "dc_lambda": 2.0,
    "dc_decay": 0.95,
  },
}


def oracle(model: str, optimizer_kind: str, schedule):
  loss_fn, init_params, input_shape = MODELS[model]
  return run_oracle(loss_fn, init_params(), schedule, Data(input_shape), **ORACLE_OPTIMIZERS[optimizer_kind])


# One of the cheapest cases (about 2 s in the full suite) runs in `make test-fast`; the whole matrix in `make test`.
FAST_CASES = ("mlp-staleness_dc-async-3",)


def _case(model: str, optimizer_kind: str, protocol: str, learners: int):
  case = f"{model}-{optimizer_kind}-{protocol}-{learners}"
  return pytest.param(
    model, optimizer_kind, protocol, learners, id=case, marks=() if case in FAST_CASES else pytest.mark.slow
  )


# Every protocol at 1, 3 and 8 learners with the optimizer that reads every per-contribution argument (the MLP);
# the other optimizer and model each at the protocols whose contributions differ in kind: one per update
# (hardsync's average of lambda at staleness 0, async's one stale gradient), several stale ones (2-softsync), and
# some dropped (backup). The protocol logic is the schedule's, the same for every model and optimizer.
KIND_PROTOCOLS = ("hardsync", "2-softsync", "async", "backup")


def _cases():
  for learners in (1, 3, 8):
    for protocol in PROTOCOLS:
      if learners == 1 and protocol in ("2-softsync", "backup"):
        continue  # n > lambda and b >= lambda are invalid with one learner
      yield _case("mlp", "staleness_dc", protocol, learners)
  for protocol in KIND_PROTOCOLS:
    yield _case("mlp", "plain", protocol, 8)
    yield _case("cnn", "staleness_dc", protocol, 3)
  yield _case("cnn", "plain", "async", 8)
  yield _case("cnn", "staleness_dc", "2-softsync", 8)


@pytest.mark.parametrize("model, optimizer_kind, protocol, learners", list(_cases()))
def test_engine_equals_event_by_event_oracle(model, optimizer_kind, protocol, learners):
  schedule = simulate(protocol, learners)
  assert schedule.num_updates >= NUM_UPDATES
  expected = oracle(model, optimizer_kind, schedule)
  actual = run_engine(model, optimizer_kind, schedule)
  assert max_relative_error(actual, expected) <= TOLERANCE


@pytest.mark.slow
def test_delay_compensation_reaches_the_engine():
  """The engine passes each contribution's own stale weights: DC changes the result."""
  schedule = simulate("async", 8)
  assert schedule.max_staleness > 0
  with_dc = run_engine("mlp", "staleness_dc", schedule)
  plain = run_engine("mlp", "plain", schedule)
  assert max_relative_error(with_dc, plain) > 1e-3


@pytest.mark.slow
def test_hardsync_equals_sgd_with_batch_mu_lambda():
  learners = 8
  schedule = simulate("hardsync", learners)
  actual = run_engine("mlp", "plain", schedule)

  loss_fn, init_params, input_shape = MODELS["mlp"]
  data = Data(input_shape)
  sgd = optax.sgd(LEARNING_RATE, momentum=0.9)
  params = jax.tree_util.tree_map(np.asarray, init_params())
  state = sgd.init(params)

  @jax.jit
  def sgd_step(params, state, batch):
    grads = jax.grad(loss_fn)(params, batch)
    updates, state = sgd.update(grads, state, params)
    return optax.apply_updates(params, updates), state

  for update in range(schedule.num_updates):
    batch = data(np.arange(learners), np.full(learners, update))  # every learner's update-th mini-batch
    big_batch = {key: value.reshape((-1,) + value.shape[2:]) for key, value in batch.items()}
    params, state = sgd_step(params, state, big_batch)
  assert max_relative_error(actual, params) <= TOLERANCE


@pytest.mark.slow
@pytest.mark.parametrize("model", ["mlp", "cnn"])
def test_one_device_and_eight_devices_give_identical_weights(model, devices):
  schedule = simulate("2-softsync", 8)
  on_one = run_engine(model, "staleness_dc", schedule, devices=devices[:1])
  on_eight = run_engine(model, "staleness_dc", schedule, devices=devices)
  jax.tree_util.tree_map(np.testing.assert_array_equal, on_one, on_eight)


def test_blocks_cut_at_required_boundaries_give_identical_weights():
  """Cutting blocks where the training loop evaluates (every 7 updates here, which greedy blocks of async at 8
  learners cross) changes which rows are masked, not the arithmetic: the weights are bit-identical."""
  schedule = simulate("async", 8)
  greedy = engine_lib.plan_blocks(schedule).block_starts
  boundaries = np.arange(7, schedule.num_updates, 7)
  assert not set(boundaries.tolist()) <= set(greedy.tolist())  # the greedy plan crosses some of them
  plain = run_engine("mlp", "staleness_dc", schedule)
  cut = run_engine("mlp", "staleness_dc", schedule, plan_options={"boundaries": boundaries})
  jax.tree_util.tree_map(np.testing.assert_array_equal, plain, cut)


@pytest.mark.slow
def test_two_runs_with_the_same_seed_are_identical():
  first = run_engine("cnn", "staleness_dc", simulate("async", 8, seed=3))
  second = run_engine("cnn", "staleness_dc", simulate("async", 8, seed=3))
  jax.tree_util.tree_map(np.testing.assert_array_equal, first, second)


@pytest.mark.slow
def test_vmap_strategy_equals_oracle():
  schedule = simulate("2-softsync", 3)
  expected = oracle("cnn", "staleness_dc", schedule)
  actual = run_engine("cnn", "staleness_dc", schedule, gradient_strategy="vmap")
  assert max_relative_error(actual, expected) <= TOLERANCE
