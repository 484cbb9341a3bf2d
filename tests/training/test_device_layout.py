"""`stalesgd.training._device_layout`: about four learners per forced host device, a power of two, at most 8."""

from __future__ import annotations

import jax
import ml_collections
import numpy as np
import pytest

from stalesgd.parallel._sharding import learner_mesh
from stalesgd.training._build_run import build_run
from stalesgd.training._config_checks import validate_config
from stalesgd.training._device_layout import cpu_device_count, runner_mesh
from stalesgd.training._run_config import default_config
from tests.helpers.train_helpers import tiny_config


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


def test_a_single_learner_runs_on_one_device_of_the_studys_eight():
  mesh = learner_mesh()
  assert mesh.size == 8
  single = tiny_config("hardsync", learners=1)
  assert runner_mesh(single, mesh).devices.tolist() == [jax.devices()[0]]
  assert runner_mesh(tiny_config("hardsync"), mesh) is mesh  # lambda >= 2 keeps every device: its bits use them
  assert runner_mesh(tiny_config("dcs3gd"), mesh) is mesh


def test_fewer_decentralized_learners_than_devices_use_the_first_devices():
  """A one-process run of M = 2 all-reduce or DiLoCo learners among a study's 8 devices trains on 2 of them."""
  mesh = learner_mesh()
  for protocol in ("allreduce_sync", "diloco"):
    config = tiny_config("hardsync", protocol=protocol, learners=2)
    validate_config(config, num_devices=8)
    assert runner_mesh(config, mesh).devices.tolist() == jax.devices()[:2]
  with pytest.raises(ValueError, match="config.learners=9; allowed: protocol 'diloco' runs one learner per device"):
    validate_config(tiny_config("hardsync", protocol="diloco", learners=9), num_devices=8)
  # Before JAX starts (stalesgd-train's check of its flags) the count is unknown and only that check waits.
  validate_config(tiny_config("hardsync", protocol="diloco", learners=9), num_devices=None)
  with pytest.raises(ValueError, match="config.staleness_rule='inverse'; allowed: 'none'/False: protocol 'diloco'"):
    validate_config(tiny_config("hardsync", protocol="diloco", learners=9, staleness_rule="inverse"), num_devices=None)


def test_two_diloco_learners_among_eight_devices_compute_what_they_do_on_two():
  """Each learner's program runs on its own device: the bits do not depend on the idle devices."""
  config = tiny_config("hardsync", protocol="diloco", learners=2, local_steps=2, num_epochs=0.1)
  among_eight = _final_params(config, runner_mesh(config, learner_mesh()))
  on_two = _final_params(config, learner_mesh(devices=jax.devices()[:2]))
  for a, b in zip(jax.tree.leaves(among_eight), jax.tree.leaves(on_two), strict=True):
    np.testing.assert_array_equal(a, b)


def _final_params(config, mesh):
  run = build_run(config, mesh)
  state = run.runner.init(run.params)
  for block in range(len(run.runner.block_starts) - 1):
    state, _ = run.runner.step(state, block)
  return jax.tree.map(np.asarray, run.runner.params(state))


@pytest.mark.slow
def test_a_single_learner_gets_the_same_weights_on_one_device_as_on_eight():
  """What lets runner_mesh drop 7 devices: a small CNN (convolutions, Caffe momentum, weight decay, Caffe
  multipliers off and on) trained by lambda = 1 on 1 and on 8 devices ends in the same weights, bit for bit."""
  for multipliers in (False, True):
    config = tiny_config(
      "hardsync",
      learners=1,
      batch_per_learner=16,
      model="small_cnn",
      num_epochs=0.2,
      weight_decay=0.01,
      model_multipliers=multipliers,
    )
    config.model_options = ml_collections.ConfigDict()
    mesh = learner_mesh()
    one, eight = _final_params(config, learner_mesh(devices=mesh.devices.flat[:1])), _final_params(config, mesh)
    for a, b in zip(jax.tree.leaves(one), jax.tree.leaves(eight)):
      np.testing.assert_array_equal(a, b)
