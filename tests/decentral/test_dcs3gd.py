"""DC-S3GD against its invariants and an independent reference, on 8 host devices."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from jax.sharding import Mesh

from stalesgd.decentral import DCS3GD, DCS3GDSettings, settings_for_protocol
from stalesgd.parallel import _sharding as sharding_lib
from tests.helpers import dcs3gd_reference

LEARNING_RATE, MOMENTUM = 0.1, 0.9
BATCH_PER_LEARNER, STEPS = 4, 5
# float32 implementation vs float64 oracle (different summation orders) over 5 steps.
RTOL, ATOL = 2e-5, 2e-6


def loss_fn(params, batch):
  hidden = jnp.tanh(batch["inputs"] @ params["hidden"] + params["bias"])
  predictions = hidden @ params["output"]
  return jnp.mean(jnp.square(predictions - batch["targets"])), {"predictions": predictions[:, 0]}


def initial_params(seed=0):
  rng = np.random.default_rng(seed)
  return {
    "hidden": rng.normal(size=(3, 5)).astype(np.float32) / 2,
    "bias": rng.normal(size=(5,)).astype(np.float32) / 4,
    "output": rng.normal(size=(5, 2)).astype(np.float32) / 2,
  }


def make_batches(learners, steps=STEPS, seed=1, identical_learners=False):
  """batches[t][i]: learner i's batch at step t (different data per learner unless identical_learners)."""
  batches = []
  for step in range(steps):
    row = []
    for learner in range(learners):
      source = 0 if identical_learners else learner
      rng = np.random.default_rng((seed, source, step))
      inputs = rng.normal(size=(BATCH_PER_LEARNER, 3)).astype(np.float32)
      targets = np.stack([np.sin(2 * inputs[:, 0] + source), inputs[:, 1]], axis=1).astype(np.float32)
      row.append({"inputs": inputs, "targets": targets})
    batches.append(row)
  return batches


def run(config, batches, mesh=None, optimizer=None):
  mesh = mesh or sharding_lib.learner_mesh()
  trainer = DCS3GD(loss_fn, optimizer or optax.sgd(LEARNING_RATE, momentum=MOMENTUM), config, mesh)
  state = trainer.init(initial_params())
  metrics = []
  for row in batches:
    state, step_metrics = trainer.step(state, sharding_lib.stack_learners(lambda learner: row[learner], mesh))
    metrics.append(jax.device_get(step_metrics))
  return trainer, state, metrics


def as_numpy(tree):
  return jax.tree.map(np.asarray, jax.device_get(tree))


def assert_trees_close(actual, expected, rtol=RTOL, atol=ATOL):
  for name in expected:
    np.testing.assert_allclose(actual[name], expected[name], rtol=rtol, atol=atol, err_msg=name)


# ------------------------------------------------------------------ against the oracle


@pytest.mark.slow
@pytest.mark.parametrize(
  "options",
  [
    dict(staleness=1, dc_lambda=0.0, lambda_mode="constant"),  # S3GD
    dict(staleness=3, dc_lambda=0.0, lambda_mode="constant"),
    dict(staleness=1, dc_lambda=0.5, lambda_mode="constant"),
    dict(staleness=2, dc_lambda=0.2, lambda_mode="layerwise"),
    dict(staleness=1, dc_lambda=0.05, lambda_mode="adaptive"),
    dict(staleness=1, dc_lambda=0.5, lambda_mode="constant", eager=True),
    dict(staleness=2, dc_lambda=0.0, lambda_mode="constant", eager=True),
  ],
  ids=lambda options: "-".join(f"{key}={value}" for key, value in options.items()),
)
def test_matches_independent_reference(options, devices):
  batches = make_batches(len(devices))
  trainer, state, _ = run(DCS3GDSettings(**options), batches)
  consensus, local = dcs3gd_reference.run_reference(
    loss_fn, initial_params(), batches, learning_rate=LEARNING_RATE, momentum=MOMENTUM, **options
  )
  assert_trees_close(as_numpy(trainer.consensus_params(state)), consensus)
  local_params = as_numpy(state.local_params)
  for learner in range(len(devices)):
    assert_trees_close({name: leaf[learner] for name, leaf in local_params.items()}, local[learner])


def test_local_weights_are_consensus_plus_own_pending_updates(devices):
  trainer, state, _ = run(
    DCS3GDSettings(staleness=2, dc_lambda=0.3, lambda_mode="constant"), make_batches(len(devices))
  )
  consensus, local, pending = (
    as_numpy(trainer.consensus_params(state)),
    as_numpy(state.local_params),
    as_numpy(state.in_flight),
  )
  for name in consensus:
    np.testing.assert_allclose(local[name], consensus[name][None] + pending[name].sum(axis=1), rtol=1e-5, atol=1e-6)


# ------------------------------------------------------------------ exact reductions


@pytest.mark.slow
def test_staleness_zero_is_sgd_with_batch_of_all_learners(devices):
  batches = make_batches(len(devices))
  trainer, state, metrics = run(settings_for_protocol("allreduce_sync"), batches)
  optimizer = optax.sgd(LEARNING_RATE, momentum=MOMENTUM)
  params = initial_params()
  opt_state = optimizer.init(params)
  for row in batches:
    big_batch = jax.tree.map(lambda *leaves: np.concatenate(leaves), *row)
    grads = jax.grad(lambda weights: loss_fn(weights, big_batch)[0])(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    params = optax.apply_updates(params, updates)
  # Mean of per-learner mean gradients vs one mean over M*mu samples: float32 rounding only.
  assert_trees_close(as_numpy(trainer.consensus_params(state)), as_numpy(params), rtol=1e-5, atol=1e-6)
  local = as_numpy(state.local_params)
  for name, leaf in as_numpy(trainer.consensus_params(state)).items():
    np.testing.assert_array_equal(local[name], np.broadcast_to(leaf, local[name].shape))
  assert all(np.all(step["correction_ratio"] == 0) for step in metrics)


@pytest.mark.slow
@pytest.mark.parametrize(
  "options",
  [
    dict(staleness=0, dc_lambda=0.0),
    dict(staleness=1, dc_lambda=0.5, lambda_mode="constant"),
    dict(staleness=2, dc_lambda=0.2, lambda_mode="layerwise"),
    dict(staleness=3, dc_lambda=2.0, lambda_mode="adaptive"),
  ],
  ids=lambda options: f"S={options['staleness']}-{options.get('lambda_mode', 'none')}",
)
def test_one_learner_is_sgd(options, devices):
  # With M = 1 the average is the learner's own update, so D = 0 exactly and the
  # correction vanishes exactly; the local weights follow SGD and the consensus
  # follows SGD S steps behind. The trajectories are compared to 1e-6: the two
  # programs are compiled separately and XLA fuses (and FMA-contracts) the
  # update differently, which moves the last bit of a few elements.
  mesh = Mesh(np.array(devices[:1]), ("learners",))
  batches = make_batches(1)
  trainer, state, metrics = run(DCS3GDSettings(**options), batches, mesh=mesh)
  assert all(step["displacement_norm"][0] == 0 and step["correction_ratio"][0] == 0 for step in metrics)
  optimizer = optax.sgd(LEARNING_RATE, momentum=MOMENTUM)
  step_fn = jax.jit(lambda params, opt_state, batch: _sgd_step(optimizer, params, opt_state, batch))
  params, opt_state, trajectory = initial_params(), optimizer.init(initial_params()), []
  for row in batches:
    trajectory.append(as_numpy(params))
    params, opt_state = step_fn(params, opt_state, row[0])
  trajectory.append(as_numpy(params))
  local = as_numpy(state.local_params)
  assert_trees_close({name: leaf[0] for name, leaf in local.items()}, trajectory[-1], rtol=1e-6, atol=1e-7)
  assert_trees_close(
    as_numpy(trainer.consensus_params(state)), trajectory[-1 - options["staleness"]], rtol=1e-6, atol=1e-7
  )


def _sgd_step(optimizer, params, opt_state, batch):
  grads = jax.grad(lambda weights: loss_fn(weights, batch)[0])(params)
  updates, opt_state = optimizer.update(grads, opt_state, params)
  return optax.apply_updates(params, updates), opt_state


def test_averaged_local_momentum_is_global_momentum_on_averaged_gradients(devices):
  # Momentum is linear: mean_i(-lr m_i) follows m <- beta m + mean_i g_i.
  mesh = sharding_lib.learner_mesh()
  trainer = DCS3GD(loss_fn, optax.sgd(LEARNING_RATE, momentum=MOMENTUM), settings_for_protocol("s3gd"), mesh)
  state = trainer.init(initial_params())
  gradient = jax.jit(jax.vmap(jax.grad(lambda weights, batch: loss_fn(weights, batch)[0])))
  global_momentum, expected_averages, actual_averages = None, [], []
  previous_consensus = as_numpy(trainer.consensus_params(state))
  for row in make_batches(len(devices)):
    stacked = jax.tree.map(lambda *leaves: np.stack(leaves), *row)
    grads = as_numpy(gradient(as_numpy(state.local_params), stacked))
    mean_grads = {name: leaf.astype(np.float64).mean(axis=0) for name, leaf in grads.items()}
    global_momentum = (
      mean_grads
      if global_momentum is None
      else {name: mean_grads[name] + MOMENTUM * global_momentum[name] for name in mean_grads}
    )
    expected_averages.append({name: -LEARNING_RATE * leaf for name, leaf in global_momentum.items()})
    state, _ = trainer.step(state, sharding_lib.stack_learners(lambda learner: row[learner], mesh))
    consensus = as_numpy(trainer.consensus_params(state))
    actual_averages.append({name: consensus[name].astype(np.float64) - previous_consensus[name] for name in consensus})
    previous_consensus = consensus
  # Staleness 1: the consensus moves at step t by the average of step t-1's updates.
  assert all(np.all(leaf == 0) for leaf in actual_averages[0].values())
  for actual, expected in zip(actual_averages[1:], expected_averages[:-1]):
    assert_trees_close(actual, expected, rtol=1e-4, atol=1e-6)


# ------------------------------------------------------------------ the correction


def test_correction_is_nonzero_when_learners_disagree(devices):
  batches = make_batches(len(devices))
  config = DCS3GDSettings(staleness=1, dc_lambda=0.5, lambda_mode="constant")
  corrected_trainer, corrected, metrics = run(config, batches)
  plain_trainer, plain, _ = run(settings_for_protocol("s3gd"), batches)
  assert np.all(metrics[0]["correction_ratio"] == 0)  # nothing in flight yet
  assert all(np.all(step["correction_ratio"] > 1e-4) for step in metrics[1:])
  assert all(np.all(step["displacement_norm"] > 0) for step in metrics[1:])
  difference = jax.tree.map(
    lambda a, b: np.max(np.abs(np.asarray(a) - np.asarray(b))), corrected.local_params, plain.local_params
  )
  assert max(jax.tree.leaves(difference)) > 1e-6


def test_correction_vanishes_when_learners_agree(devices):
  # Identical data on every learner: the consensus equals each learner's own
  # update, so D = 0 up to the rounding of the mean of M equal numbers, and
  # DC-S3GD equals S3GD.
  batches = make_batches(len(devices), identical_learners=True)
  _, corrected, metrics = run(DCS3GDSettings(staleness=1, dc_lambda=0.5, lambda_mode="constant"), batches)
  _, plain, _ = run(settings_for_protocol("s3gd"), batches)
  assert all(np.all(step["correction_ratio"] < 1e-6) for step in metrics)
  for actual, expected in zip(
    jax.tree.leaves(as_numpy(corrected.local_params)), jax.tree.leaves(as_numpy(plain.local_params))
  ):
    np.testing.assert_allclose(actual, expected, rtol=1e-6, atol=1e-7)


@pytest.mark.slow
def test_layerwise_correction_has_norm_lambda_times_gradient_norm(devices):
  _, _, metrics = run(DCS3GDSettings(staleness=1, dc_lambda=0.2, lambda_mode="layerwise"), make_batches(len(devices)))
  # Every leaf's correction is 0.2 ||g_leaf||, so the global ratio is 0.2 too.
  np.testing.assert_allclose(metrics[-1]["correction_ratio"], 0.2, rtol=1e-5)


@pytest.mark.slow
def test_dc_lambda_accepts_a_schedule(devices):
  batches = make_batches(len(devices), steps=3)
  schedule = lambda step: jnp.where(step < 2, 0.0, 0.5)
  _, _, metrics = run(DCS3GDSettings(staleness=1, dc_lambda=schedule, lambda_mode="constant"), batches)
  assert np.all(metrics[1]["correction_ratio"] == 0) and np.all(metrics[2]["correction_ratio"] > 0)


# ------------------------------------------------------------------ the program


def test_state_lives_on_the_learners_devices(devices):
  mesh = sharding_lib.learner_mesh()
  trainer = DCS3GD(loss_fn, optax.sgd(0.1, momentum=0.9), DCS3GDSettings(staleness=2), mesh)
  state = trainer.init(initial_params())
  assert state.in_flight["hidden"].shape == (len(devices), 2, 3, 5)
  for leaf in jax.tree.leaves((state.local_params, state.opt_state, state.in_flight)):
    assert leaf.shape[0] == len(devices)
    assert [shard.device for shard in leaf.addressable_shards] == list(mesh.devices.flat)
    assert all(shard.data.shape[0] == 1 for shard in leaf.addressable_shards)
  assert trainer.consensus_params(state)["hidden"].sharding.is_fully_replicated
  abstract = trainer.abstract_state(initial_params())
  assert jax.tree.map(lambda leaf: (leaf.shape, leaf.dtype, leaf.sharding), abstract) == jax.tree.map(
    lambda leaf: (leaf.shape, leaf.dtype, leaf.sharding), state
  )


@pytest.mark.slow
def test_step_compiles_once_and_metrics_are_per_learner(devices):
  traces = []

  def counting_loss(params, batch):
    traces.append(1)
    return loss_fn(params, batch)

  mesh = sharding_lib.learner_mesh()
  trainer = DCS3GD(counting_loss, optax.sgd(0.1), DCS3GDSettings(), mesh)
  state = trainer.init(initial_params())
  for row in make_batches(len(devices), steps=3):
    state, metrics = trainer.step(state, sharding_lib.stack_learners(lambda learner: row[learner], mesh))
  assert len(traces) == 1
  assert metrics["loss"].shape == (len(devices),)
  assert metrics["aux"]["predictions"].shape == (len(devices), BATCH_PER_LEARNER)
  assert metrics["loss"].sharding.spec == jax.sharding.PartitionSpec("learners")
  mean = trainer.mean_metrics(metrics)
  np.testing.assert_allclose(mean["loss"], np.mean(np.asarray(metrics["loss"])), rtol=1e-6)
  # Over the learners (the leading axis), not over an aux metric's own axis.
  predictions = np.asarray(metrics["aux"]["predictions"])
  np.testing.assert_allclose(mean["aux"]["predictions"], predictions.mean(axis=0), rtol=1e-6)


def test_rejects_a_mesh_without_the_learners_axis(devices):
  with pytest.raises(ValueError, match="settings.axis_name='learners'"):
    DCS3GD(loss_fn, optax.sgd(0.1), DCS3GDSettings(), jax.make_mesh((8,), ("data",)))


@pytest.mark.parametrize(
  "make_batch, shape",
  [
    (lambda m: make_batches(m, steps=1)[0][0], r"\(4, 3\)"),  # one learner's [mu, ...] batch
    (lambda m: {"inputs": np.zeros((2 * m, 4, 3), np.float32), "targets": np.zeros((2 * m, 4, 2), np.float32)}, None),
    (lambda m: {"inputs": np.float32(1.0), "targets": np.zeros((m, 4, 2), np.float32)}, r"\(\)"),  # a scalar leaf
  ],
  ids=["one-learners-batch", "more-rows-than-learners", "scalar-leaf"],
)
def test_rejects_a_batch_without_one_row_per_learner(make_batch, shape, devices):
  trainer = DCS3GD(loss_fn, optax.sgd(0.1), DCS3GDSettings(), sharding_lib.learner_mesh())
  state = trainer.init(initial_params())
  shape = shape or rf"\({2 * len(devices)}, 4, 3\)"  # 2M rows would otherwise be split two a learner
  with pytest.raises(ValueError, match=rf"batch\['inputs'\] has shape {shape}; its leading axis must be"):
    trainer.step(state, make_batch(len(devices)))


@pytest.mark.parametrize(
  "options, kept",
  [
    (dict(lambda_mode="adaptive", dc_lambda=2.0), True),
    (dict(lambda_mode="adaptive", dc_lambda=0.0), False),  # no correction: S3GD
    (dict(lambda_mode="layerwise", dc_lambda=0.2), False),
    (dict(lambda_mode="constant", dc_lambda=0.04), False),
  ],
)
def test_mean_square_is_kept_only_for_the_adaptive_correction(options, kept, devices):
  """DC-ASGD-a's MeanSquare is per learner and part of the state only where it is used (the checkpoint holds it)."""
  trainer = DCS3GD(loss_fn, optax.sgd(0.1), DCS3GDSettings(staleness=1, **options), sharding_lib.learner_mesh())
  state = trainer.init(initial_params())
  if kept:
    assert state.mean_square["hidden"].shape == (len(devices), 3, 5)
  else:
    assert state.mean_square is None


def test_modes_named_at_run_time_correct_as_the_literals(devices):
  # The mode compared by value: strings built at run time (equal to the literals, other objects).
  batches = make_batches(len(devices))
  layerwise = DCS3GDSettings(staleness=1, dc_lambda=0.2, lambda_mode="".join(["layer", "wise"]))
  np.testing.assert_allclose(run(layerwise, batches)[2][-1]["correction_ratio"], 0.2, rtol=1e-5)
  options = dict(staleness=1, dc_lambda=0.05)
  adaptive = run(DCS3GDSettings(lambda_mode="".join(["adap", "tive"]), **options), batches)[1]
  literal = run(DCS3GDSettings(lambda_mode="adaptive", **options), batches)[1]
  np.testing.assert_array_equal(as_numpy(adaptive.mean_square)["hidden"], as_numpy(literal.mean_square)["hidden"])


def test_staleness_zero_keeps_no_queue(devices):
  trainer = DCS3GD(loss_fn, optax.sgd(0.1), DCS3GDSettings(staleness=0), sharding_lib.learner_mesh())
  assert trainer.init(initial_params()).in_flight is None


@pytest.mark.parametrize("staleness", [1, 0])
def test_the_overlap_report_finds_the_one_all_reduce_and_what_it_reads(staleness, devices):
  """S = 1: one all-reduce in the step, reading exactly the in-flight queue (overlap-ready); S = 0: it reads this
  step's gradient, so the batch and the local weights, and is not."""
  trainer = DCS3GD(
    loss_fn, optax.sgd(0.1), DCS3GDSettings(staleness=staleness, dc_lambda=0.0), sharding_lib.learner_mesh()
  )
  state = trainer.init(initial_params())
  # A batch leaf the loss never reads, first in the flattened order: the step keeps it as an entry parameter, so
  # the report's parameter numbers still name the leaves they are.
  batch = sharding_lib.stack_learners(
    lambda learner: {"a_unused": np.zeros(3, np.float32), **make_batches(len(devices), steps=1)[0][learner]},
    trainer.mesh,
  )
  report = trainer.overlap_report(state, batch)
  assert report["all_reduces"] == 1
  if staleness:
    assert report["update_all_reduce_reads"] == [
      "[0].in_flight['bias']",
      "[0].in_flight['hidden']",
      "[0].in_flight['output']",
    ]
    assert report["overlap_ready"]
  else:
    reads = report["update_all_reduce_reads"]
    assert "[1]['inputs']" in reads and "[1]['a_unused']" not in reads and not report["overlap_ready"]


@pytest.mark.parametrize(
  "reads, ready",
  [
    ([{"bias"}], True),  # one all-reduce reading part of the queue: still only the queue
    ([{"bias", "hidden", "output"}, {"hidden"}], False),  # two all-reduces: the update is not one collective
  ],
  ids=["one-reading-part-of-the-queue", "two-all-reduces"],
)
def test_overlap_readiness_is_one_all_reduce_reading_only_the_queue(reads, ready, devices, monkeypatch):
  """The rule of `overlap_report`, on all-reduces given by hand in place of the compiled step's."""
  from stalesgd.decentral import _hlo as hlo

  trainer = DCS3GD(loss_fn, optax.sgd(0.1), DCS3GDSettings(staleness=1, dc_lambda=0.0), sharding_lib.learner_mesh())
  state = trainer.init(initial_params())
  batch = sharding_lib.stack_learners(lambda learner: make_batches(len(devices), steps=1)[0][learner], trainer.mesh)
  numbers = {
    jax.tree_util.keystr(path): number
    for number, (path, _) in enumerate(jax.tree_util.tree_flatten_with_path((state, batch))[0])
  }
  given = [
    hlo.AllReduce(f"all-reduce.{index}", False, frozenset(numbers[f"[0].in_flight['{leaf}']"] for leaf in leaves), ())
    for index, leaves in enumerate(reads)
  ]
  monkeypatch.setattr(hlo, "all_reduces", lambda text: given)
  report = trainer.overlap_report(state, batch)
  assert report["all_reduces"] == len(reads) and report["overlap_ready"] is ready


def test_the_batch_check_compares_the_learners_by_value(devices):
  """Hundreds of learners (a GPU cluster's count) are compared by value, not identity: ints past 256 are distinct
  objects. The learner count is set as a 300-device mesh would set it and the compiled step replaced, so only the
  check runs."""
  trainer = DCS3GD(loss_fn, optax.sgd(0.1), DCS3GDSettings(), sharding_lib.learner_mesh())
  trainer.num_learners = int("300")
  trainer._step = lambda state, batch: "stepped"
  assert trainer.step(None, {"inputs": np.zeros((300, 4, 3), np.float32)}) == "stepped"


def test_a_step_updates_the_state_in_place_and_leaves_the_batch(devices):
  trainer = DCS3GD(loss_fn, optax.sgd(0.1), DCS3GDSettings(staleness=1), sharding_lib.learner_mesh())
  state = trainer.init(initial_params())
  batch = sharding_lib.stack_learners(lambda learner: make_batches(len(devices), steps=1)[0][learner], trainer.mesh)
  new_state, _ = trainer.step(state, batch)
  assert state.local_params["hidden"].is_deleted() and not new_state.local_params["hidden"].is_deleted()
  assert not batch["inputs"].is_deleted()
