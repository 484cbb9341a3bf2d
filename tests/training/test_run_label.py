"""A run's label (logs, plots, summaries) names its protocol, learners, batch, rule and correction."""

from __future__ import annotations

import pytest

from stalesgd.training._config_readers import run_label
from stalesgd.training._run_config import default_config


@pytest.mark.parametrize(
  "fields, label",
  [
    ({"protocol": "hardsync"}, "hardsync (lambda=8, mu=16)"),
    ({"protocol": "softsync", "n": 4, "staleness_rule": "inverse"}, "4-softsync (lambda=8, mu=16, inverse)"),
    ({"protocol": "async", "delay_compensation": "constant"}, "async (lambda=8, mu=16, DC-constant)"),
    (
      {"protocol": "async", "delay_compensation": "adaptive", "dc_mean_square_bias_correction": True},
      "async (lambda=8, mu=16, DC-adaptive bias-corrected)",
    ),
    ({"protocol": "dcs3gd"}, "dcs3gd (lambda=8, mu=16, DC-layerwise)"),  # DC-S3GD corrects by default
    ({"protocol": "dcs3gd", "delay_compensation": "adaptive"}, "dcs3gd (lambda=8, mu=16, DC-adaptive)"),
    ({"protocol": "s3gd"}, "s3gd (lambda=8, mu=16)"),
  ],
)
def test_label(fields, label):
  config = default_config()
  config.update(fields)
  assert run_label(config) == label


def test_the_0_1_forms_of_the_moved_config_readers_and_make_runner_still_work_with_a_warning():
  """stalesgd.runners.run_label / decentral_settings / simulate_schedule moved to the config layer, and
  make_runner takes DC-S3GD settings instead of the config: the 0.1 forms warn until 0.3.0."""
  import importlib
  import sys

  import jax

  from stalesgd.parallel._sharding import learner_mesh
  from stalesgd.training import build_run
  from stalesgd.training._runners import DecentralizedRunner, make_runner
  from tests.helpers import tiny_run_config

  sys.modules.pop("stalesgd.runners", None)
  with pytest.warns(DeprecationWarning, match="stalesgd.runners moved to stalesgd.training"):
    old = importlib.import_module("stalesgd.runners")
  assert old.run_label is run_label and callable(old.decentral_settings) and callable(old.simulate_schedule)

  config = tiny_run_config.get_config("dcs3gd")
  run = build_run(config)
  mesh = learner_mesh(devices=jax.devices()[: config.learners])
  with pytest.warns(DeprecationWarning, match=r"make_runner\(config, model, optimizer, schedule, batches, mesh\)"):
    runner = make_runner(config, run.model, run.optimizer, run.schedule, run.batches, mesh)
  assert isinstance(runner, DecentralizedRunner) and runner.protocol_config == run.decentral_settings
