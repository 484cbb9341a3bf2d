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
