"""The learner mesh and building per-learner global arrays from process-local data."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from stalesgd.parallel import _sharding as sharding_lib


def test_learner_mesh_spans_all_devices_in_process_then_id_order(devices):
  mesh = sharding_lib.learner_mesh()
  assert mesh.axis_names == ("learners",)
  assert list(mesh.devices.flat) == sorted(devices, key=lambda device: (device.process_index, device.id))
  assert sharding_lib.addressable_learners(mesh) == list(range(len(devices)))


def test_learner_mesh_rejects_no_devices():
  with pytest.raises(ValueError, match="devices=\\[\\]"):
    sharding_lib.learner_mesh(devices=[])


def test_stack_learners_places_each_learners_data_on_its_device(devices):
  mesh = sharding_lib.learner_mesh()
  called = []

  def per_learner(learner):
    called.append(learner)
    return {"x": np.full((2, 3), learner, np.float32), "label": np.array([learner, -learner], np.int32)}

  stacked = sharding_lib.stack_learners(per_learner, mesh)
  assert sorted(called) == list(range(len(devices)))
  assert stacked["x"].shape == (len(devices), 2, 3) and stacked["label"].dtype == np.int32
  for learner, device in enumerate(mesh.devices.flat):
    [shard] = [shard for shard in stacked["x"].addressable_shards if shard.device == device]
    np.testing.assert_array_equal(np.asarray(shard.data), np.full((1, 2, 3), learner, np.float32))
  rows = sharding_lib.local_learner_values(stacked["label"])
  assert sorted(rows) == list(range(len(devices)))
  np.testing.assert_array_equal(rows[3], [3, -3])


def test_stack_learners_requires_a_one_dimensional_mesh_on_the_axis():
  mesh = jax.make_mesh((4, 2), ("learners", "model"))
  with pytest.raises(ValueError, match="must be exactly \\('learners',\\)"):
    sharding_lib.stack_learners(lambda learner: np.zeros(1), mesh)
