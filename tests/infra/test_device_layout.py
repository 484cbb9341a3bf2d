"""`stalesgd.training._device_layout`: about four learners per forced host device, a power of two, at most 8."""

from __future__ import annotations

import pytest

from stalesgd.training._device_layout import cpu_device_count
from stalesgd.training._run_config import default_config


@pytest.mark.parametrize(
  "learners, devices", [(1, 1), (4, 1), (5, 2), (8, 2), (9, 4), (16, 4), (17, 8), (30, 8), (32, 8), (128, 8), (1024, 8)]
)
def test_parameter_server_runs_get_about_four_learners_per_device(learners, devices):
  config = default_config()
  config.protocol, config.learners = "async", learners
  assert cpu_device_count(config) == devices


@pytest.mark.parametrize("protocol", ["allreduce_sync", "dcs3gd"])
def test_decentralized_runs_get_one_device_per_learner(protocol):
  config = default_config()
  config.protocol, config.learners = protocol, 6
  assert cpu_device_count(config) == 6
