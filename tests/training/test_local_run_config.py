"""``config.local_steps`` and ``config.inner``: defaults that keep today's runs, errors that name the field."""

from __future__ import annotations

import types

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from stalesgd.training import default_config, validate_config
from stalesgd.training._config_readers import applied_examples, run_label, timing_model, updates_per_epoch
from stalesgd.training._local_runs import build_inner_optimizer, local_runs_of
from stalesgd.training._pending_metrics import PendingMetrics


def test_the_defaults_are_one_step_of_stateless_sgd_at_rate_one():
  config = default_config()
  assert config.local_steps == 1
  inner = build_inner_optimizer(config.inner)
  gradient = jnp.array([0.5, -0.0, 3.0])
  updates, state = inner.update(gradient, inner.init(gradient))
  assert jnp.array_equal(-updates, gradient) and not jax.tree.leaves(state)  # u = -g, no state to keep
  assert local_runs_of(config, timing_model(config)).reset_inner_state is False


def test_h_local_steps_per_contribution_make_h_times_fewer_updates_per_epoch_and_show_in_the_label():
  config = default_config()
  config.protocol, config.learners, config.batch_per_learner = "async", 4, 10
  assert updates_per_epoch(config, 1200) == 120  # c mu = 10 examples per update
  config.local_steps = 3
  assert updates_per_epoch(config, 1200) == 40  # c mu H = 30
  assert run_label(config) == "async (lambda=4, mu=10, H=3)"


def test_inner_momentum_and_nesterov_reach_optax_sgd():
  config = default_config()
  config.inner.learning_rate, config.inner.momentum, config.inner.nesterov = 0.5, 0.9, True
  inner = build_inner_optimizer(config.inner)
  g = jnp.float32(2.0)
  state = inner.init(g)
  first, state = inner.update(g, state)
  second, _ = inner.update(g, state)
  # Nesterov (optax): v <- g + beta v, u = -eta (g + beta v)
  # v1 = 2, u1 = -0.5 (2 + 1.8) = -1.9; v2 = 3.8, u2 = -0.5 (2 + 3.42) = -2.71
  assert float(first) == pytest.approx(-1.9) and float(second) == pytest.approx(-2.71)


@pytest.mark.parametrize(
  "field, value, message",
  [
    ("local_steps", 0, "config.local_steps"),
    ("inner.optimizer", "sgdd", "config.inner.optimizer='sgdd'; allowed: 'sgd' (optax.sgd)"),
    ("inner.learning_rate", 0.0, "config.inner.learning_rate"),
    ("inner.momentum", 1.0, "config.inner.momentum"),
    ("inner.data_shards", -1, "config.inner.data_shards=-1; allowed: an integer >= 0"),
    ("inner.cosine_steps", -8, "config.inner.cosine_steps=-8; allowed: an integer >= 0"),
    ("inner.cosine_final_rate", -1e-6, "config.inner.cosine_final_rate=-1e-06; allowed: a finite number >= 0"),
    ("inner.restart_at_peak", True, "config.inner.restart_at_peak=True; allowed: False without a cosine rate"),
    ("timing.speed_factors", (1.0, 2.0), "config.timing.speed_factors=(1.0, 2.0); allowed: one factor per learner"),
    ("timing.speed_factors", (1.0, -2.0), "config.timing.speed_factors=(1.0, -2.0); allowed: a tuple of positive"),
  ],
)
def test_a_bad_local_run_field_is_named(field, value, message):
  config = default_config()
  section, _, name = field.rpartition(".")
  (config[section] if section else config)[name] = value
  with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
    validate_config(config, num_devices=8)


def test_options_the_inner_optimizer_does_not_take_are_named():
  config = default_config()
  config.inner.optimizer, config.inner.momentum = "adam", 0.5
  with pytest.raises(ValueError, match="config.inner.momentum.*'adam' takes no momentum"):
    validate_config(config, num_devices=8)
  config.inner.momentum = 0.0
  config.inner.options.learning_rate = 0.1
  with pytest.raises(ValueError, match="config.inner.options.learning_rate: set config.inner.learning_rate"):
    validate_config(config, num_devices=8)
  del config.inner.options["learning_rate"]
  config.inner.options.b1 = 0.8
  validate_config(config, num_devices=8)
  assert isinstance(build_inner_optimizer(config.inner), optax.GradientTransformation)


@pytest.mark.parametrize("field, value", [("local_steps", 2), ("inner.momentum", 0.5), ("inner.reset_state", True)])
def test_a_decentralized_protocol_refuses_local_run_fields(field, value):
  config = default_config()
  config.protocol, config.learners = "dcs3gd", 8
  section, _, name = field.rpartition(".")
  (config[section] if section else config)[name] = value
  with pytest.raises(ValueError, match=f"config.{field}"):
    validate_config(config, num_devices=8)


def test_each_protocol_family_refuses_the_section_it_does_not_use():
  server = default_config()
  server.outer.learning_rate = 0.5
  with pytest.raises(
    ValueError, match="config.outer.learning_rate=0.5; allowed: its default, 0.7: protocol 'hardsync'"
  ):
    validate_config(server, num_devices=8)
  diloco = default_config()
  diloco.protocol, diloco.local_steps, diloco.inner.learning_rate = "diloco", 4, 0.5
  with pytest.raises(
    ValueError, match="config.inner.learning_rate=0.5; allowed: its default, 1.0: with protocol 'diloco'"
  ):
    validate_config(diloco, num_devices=8)
  diloco.inner.learning_rate = 1.0
  diloco.outer.optimizer, diloco.outer.nesterov = "stalesgd:delayed_nesterov", False
  diloco.outer.options.buffer_size = 4
  validate_config(diloco, num_devices=8)  # H = 4 and any outer optimizer, e.g. delayed Nesterov


def test_the_outer_default_is_dilocos_nesterov_sgd():
  from stalesgd.training._local_runs import build_outer_optimizer

  outer = build_outer_optimizer(default_config().outer)
  delta = jnp.float32(1.0)
  first, state = outer.update(delta, outer.init(delta))
  second, _ = outer.update(delta, state)
  # v1 = 1, u1 = -0.7 (1 + 0.9) = -1.33; v2 = 1.9, u2 = -0.7 (1 + 1.71) = -1.897
  assert float(first) == pytest.approx(-1.33) and float(second) == pytest.approx(-1.897)


def test_a_run_saved_before_a_section_gained_a_field_resumes(tmp_path):
  """config.json of a run saved when config.inner had no dynamic_min_steps: the field counts as its default."""
  import json

  from stalesgd.training._workdir import check_same_run, config_changes

  saved = json.loads(default_config().to_json())
  del saved["inner"]["dynamic_min_steps"]
  assert config_changes(saved, default_config()) == []
  changed = default_config()
  changed.inner.dynamic_min_steps = 1
  (change,) = config_changes(saved, changed)  # set otherwise, it is a change from the default
  assert change.startswith("inner: ") and "'dynamic_min_steps': 0" in change and "'dynamic_min_steps': 1" in change
  (tmp_path / "config.json").write_text(json.dumps(saved))
  check_same_run(default_config(), tmp_path)


def test_the_keyed_cosine_by_hand():
  """eta = 2e-4 to 1e-6 over T = 8 steps, a run of 3 steps from the stream's step 2 (n = 2, 3, 4) and one from
  step 9 (past T: the final rate): eta_n = 1e-6 + 1.99e-4 (1 + cos(pi n / 8)) / 2, as factors eta_n / eta:
  n = 2: 1e-6 + 1.99e-4 * 0.853553 = 1.708571e-4 -> 0.854286; n = 3: 1e-6 + 1.99e-4 * 0.691342 = 1.385770e-4
  -> 0.692885; n = 4: 1e-6 + 1.99e-4 * 0.5 = 1.005e-4 -> 0.5025; n >= 8: 0.005. With restart_at_peak the first
  step of each run is at 1 (the notebook's re-created optimizer)."""
  from stalesgd.training._local_runs import cosine_step_scale

  plain = cosine_step_scale(2e-4, 1e-6, 8, restart_at_peak=False)(np.array([2, 9]), 3)
  np.testing.assert_allclose(plain, [[0.854286, 0.692885, 0.5025], [0.005, 0.005, 0.005]], rtol=2e-6)
  restarted = cosine_step_scale(2e-4, 1e-6, 8, restart_at_peak=True)(np.array([2, 9]), 3)
  np.testing.assert_allclose(restarted, [[1.0, 0.692885, 0.5025], [1.0, 0.005, 0.005]], rtol=2e-6)


def test_the_engine_gets_the_keyed_cosine_only_when_asked():
  config = default_config()
  assert local_runs_of(config, timing_model(config)).inner_step_scale is None
  config.inner.cosine_steps, config.inner.learning_rate = 8, 2e-4
  scale = local_runs_of(config, timing_model(config)).inner_step_scale
  np.testing.assert_allclose(scale(np.array([4]), 1), [[0.5025]], rtol=2e-6)


def test_dynamic_local_updates_end_at_equal_inner_steps():
  """128 examples, mu = 4, 2 epochs: 64 inner steps; H = 4, H_min = 2 with 2 learners of factors 1 and 2
  (H_m = 4, 2): at most 64 / 2 = 32 updates, cut where the applied steps reach 64."""
  from stalesgd.training._config_readers import run_length

  config = default_config()
  config.protocol, config.learners, config.batch_per_learner, config.num_epochs = "async", 2, 4, 2.0
  config.local_steps = 4
  assert run_length(config, 128) == (16, 0)  # without: 2 epochs of c mu H = 16 examples per update
  config.inner.dynamic_min_steps = 2
  config.timing.speed_factors = (1.0, 2.0)
  validate_config(config, num_devices=8)
  assert run_length(config, 128) == (32, 64)


def test_under_dynamic_local_updates_an_update_applies_its_learners_steps_times_mu():
  """H_m = (4, 2), mu = 3, one contribution per update from learners 0, 1, 1, 0: 12, 6, 6, 12 examples."""
  schedule = types.SimpleNamespace(
    learner_local_steps=np.array([4, 2], np.int64), learner=np.array([[0], [1], [1], [0]], np.int32)
  )
  assert applied_examples(schedule, 3).tolist() == [0, 12, 18, 24, 36]
  assert applied_examples(types.SimpleNamespace(learner_local_steps=None, learner=schedule.learner), 3) is None
  # Two contributions per update: both learners' steps.
  schedule.learner = np.array([[0, 1], [1, 1]], np.int32)
  assert applied_examples(schedule, 1).tolist() == [0, 6, 10]


def test_the_logged_epoch_and_images_per_s_count_the_applied_examples():
  """N = 48 examples (per_epoch = 4 updates of c mu H = 12), applied 12, 18, 24, 36 by updates 1-4: a record
  ending at update 3 says epoch 24 / 48 = 0.5; 12 examples from update 1 to 3 in 2 s is 6 images/s."""
  applied = np.array([0, 12, 18, 24, 36])
  pending = PendingMetrics(None, examples_per_update=12, per_epoch=4.0, applied=applied)
  assert pending.epoch(3) == 0.5 and pending.epoch(4) == 0.75
  assert pending._examples(1, 3) == 12
  fixed = PendingMetrics(None, examples_per_update=12, per_epoch=4.0)  # without: 12 per update
  assert fixed.epoch(3) == 0.75 and fixed._examples(1, 3) == 24


def test_evaluations_land_after_the_first_update_whose_applied_examples_reach_the_point():
  """c mu H = 12: applied 12, 18, 24, 36, 48 by updates 1-5 read 1, 1.5, 2, 3 and 4 updates' worth. Every 1.5
  updates' worth: point 1.5 is reached by update 2, 3.0 by update 4 and 4.5 by none; every 0.5: update 1 reaches
  0.5 and 1.0 (one evaluation), update 4 reaches 2.5 and 3.0. Without dynamic local updates the clock is the update
  count: every 416.67 updates (an epoch of 416.67) after updates 417, 834, 1250 (3 x 416.67 is 1250 up to rounding)."""
  from stalesgd.training._config_readers import evaluation_updates

  applied = np.array([0, 12, 18, 24, 36, 48])
  # Arguments: updates, every_epochs, per_epoch (, applied, c mu H); one epoch of one update's worth here.
  assert evaluation_updates(5, 1.5, 1.0, applied, 12).tolist() == [2, 4]
  assert evaluation_updates(5, 0.5, 1.0, applied, 12).tolist() == [1, 2, 3, 4, 5]
  assert evaluation_updates(1250, 1.0, 1250 / 3).tolist() == [417, 834, 1250]
  assert evaluation_updates(40, 0.25, 40.0).tolist() == [10, 20, 30, 40]
  assert evaluation_updates(9, 10.0, 1.0).tolist() == []
