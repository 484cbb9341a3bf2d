"""ImageNet end to end: a tiny prepared imagenet2012 trained with the Inception crop, on decoding threads.

The data set is JPEG folders written here and prepared with `stalesgd.data.prepare`
(no network, no sibling data), read back through ``tfds.data_source`` as any run reads it.
"""

from __future__ import annotations

import io
import math

import numpy as np
import pytest
from PIL import Image

from stalesgd.data import LearnerBatches, load_dataset
from stalesgd.data.preparation import _tfds_writer as tfds_writer
from stalesgd.data.prepare import prepare
from stalesgd.training._config_checks import validate_config
from stalesgd.training._loop import train_and_evaluate
from stalesgd.training._run_config import default_config

CLASSES, PER_CLASS = 4, 8


@pytest.fixture(scope="module")
def imagenet_dir(tmp_path_factory) -> str:
  root = tmp_path_factory.mktemp("imagenet_like")
  data_dir = root / "tfds"
  wnids = tfds_writer.local_builder("imagenet2012", str(data_dir)).info.features["label"].names
  rng = np.random.default_rng(0)
  for split, folder, count in (("train", "train", PER_CLASS), ("validation", "val", 1)):
    for label in range(CLASSES):
      (root / "jpeg" / folder / wnids[label]).mkdir(parents=True)
      for index in range(count):
        width, height = int(rng.integers(30, 60)), int(rng.integers(24, 48))
        buffer = io.BytesIO()
        Image.fromarray(rng.integers(0, 256, (height, width, 3), dtype=np.uint8)).save(
          buffer, format="JPEG", quality=90
        )
        (root / "jpeg" / folder / wnids[label] / f"{split}_{index}.JPEG").write_bytes(buffer.getvalue())
  prepare("imagenet2012", str(root / "jpeg"), str(data_dir), progress=None)
  return str(data_dir)


def _config(data_dir: str, **overrides):
  config = default_config()
  config.dataset, config.data_source, config.data_dir = "imagenet2012", "tfds", data_dir
  config.image_size, config.augment, config.data_workers = 16, True, 2
  config.model = "mlp"
  config.model_options.hidden_sizes = (16,)
  config.protocol, config.learners, config.batch_per_learner = "async", 8, 2
  config.num_epochs, config.eval_every_epochs = 1.0, 1.0
  config.eval_batch_size, config.train_eval_examples, config.precise_bn_batches = 8, 8, 1
  config.update(overrides)
  return config


@pytest.mark.slow
def test_training_with_the_inception_crop_runs_end_to_end(imagenet_dir, tmp_path):
  summary = train_and_evaluate(_config(imagenet_dir), str(tmp_path / "run"))
  assert summary["updates"] == CLASSES * PER_CLASS // 2 and not summary["preempted"]
  assert summary["test_accuracy"] is not None and math.isfinite(summary["test_error"])


def test_prepared_imagenet_batches_do_not_depend_on_the_decoding_threads(imagenet_dir):
  batches = {}
  for workers in (1, 3):
    dataset = load_dataset("imagenet2012", source="tfds", data_dir=imagenet_dir, image_size=16, data_workers=workers)
    assert dataset.train.workers == workers
    batches[workers] = LearnerBatches(dataset, batch_per_learner=2, learners=8, seed=0, augment=True)
  assert batches[1].augmentation == "inception_crop_flip"
  learner, k = np.arange(8), np.array([0, 0, 0, 0, 1, 1, 1, 1])
  np.testing.assert_array_equal(batches[1](learner, k)["image"], batches[3](learner, k)["image"])
  centre = batches[1].dataset.train.read(batches[1].sample_indices(learner[:1], k[:1])[0])[0]
  assert not np.array_equal(
    batches[1](learner[:1], k[:1])["image"][0], batches[1].dataset.preprocess(centre)
  )  # training images are not the centre crops


@pytest.mark.parametrize("value", [0, -2, 257])
def test_bad_data_workers_are_refused_naming_the_field(value):
  # Other types (floats, bools, strings, None) are tried by tests/faults/test_config_fuzz.py.
  config = _config("/data", data_workers=value)
  with pytest.raises(ValueError, match=rf"config\.data_workers={value}; allowed: an integer >= 1 and <= 256"):
    validate_config(config, num_devices=8)


def test_data_workers_default_to_the_usable_cores_at_most_eight(monkeypatch):
  from stalesgd.training import _run_config as config_lib

  monkeypatch.setattr(config_lib.os, "sched_getaffinity", lambda pid: {0, 1})
  assert config_lib.default_config().data_workers == 2
  monkeypatch.setattr(config_lib.os, "sched_getaffinity", lambda pid: set(range(32)))
  assert config_lib.default_config().data_workers == 8
