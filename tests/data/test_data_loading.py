"""load_dataset through tfds (mocked, never the network), npz files, the embedded digits, errors."""

from __future__ import annotations

import importlib.util
import io
import os

import numpy as np
import pytest
import tensorflow_datasets as tfds
from PIL import Image

from stalesgd.data import DatasetNotPreparedError, LearnerBatches, load_dataset
from stalesgd.data._embedded import load_digits_splits
from stalesgd.data._sources import LazyImageSource

SHARED_MNIST = os.path.join(os.path.dirname(__file__), "..", "..", "..", "shared", "data", "mnist")


@pytest.mark.parametrize("name, image_shape", [("cifar10", (32, 32, 3)), ("mnist", (28, 28, 1))])
def test_tfds_source_reads_mocked_data(name, image_shape):
  with tfds.testing.mock_data(num_examples=12):
    dataset = load_dataset(name, source="tfds", data_dir="/nonexistent/tfds", normalization="unit")
  assert (dataset.num_train, dataset.num_test, dataset.num_classes) == (12, 12, 10)
  assert dataset.image_shape == image_shape
  assert dataset.train.images.dtype == np.uint8 and dataset.train.labels.dtype == np.int32
  assert 0 <= dataset.train.labels.min() and dataset.train.labels.max() < 10
  batch = LearnerBatches(dataset, batch_per_learner=3, learners=2, seed=0)(np.array([0, 1]), np.array([0, 0]))
  assert batch["image"].shape == (2, 3, *image_shape)
  assert 0.0 <= batch["image"].min() and batch["image"].max() <= 1.0


def test_imagenet_from_tfds_is_a_lazy_source(monkeypatch):
  # tfds's mock cannot encode ImageNet's variable-size images without TensorFlow,
  # so the data source itself is replaced by JPEG examples of the same form.
  requests = []

  def fake_data_source(name, *, split, data_dir, download, decoders):
    requests.append(dict(name=name, split=split, data_dir=data_dir, download=download, decoders=decoders))
    rng = np.random.default_rng(0)
    return [
      [{"image": _jpeg(rng.integers(0, 256, (40 + i, 50, 3), dtype=np.uint8)), "label": 7 * i} for i in range(3)]
      for _ in split
    ]

  monkeypatch.setattr(tfds, "data_source", fake_data_source)
  dataset = load_dataset("imagenet2012", source="tfds", data_dir="/imagenet", image_size=32)
  assert requests == [
    dict(
      name="imagenet2012",
      split=["train", "validation"],
      data_dir="/imagenet",
      download=False,
      decoders={"image": requests[0]["decoders"]["image"]},
    )
  ]
  assert isinstance(requests[0]["decoders"]["image"], tfds.decode.SkipDecoding)
  assert isinstance(dataset.train, LazyImageSource) and dataset.num_classes == 1000
  assert dataset.image_shape == (32, 32, 3) and dataset.num_train == 3
  batch = LearnerBatches(dataset, batch_per_learner=3, learners=1, seed=0)(np.array([0]), np.array([0]))
  assert batch["image"].shape == (1, 3, 32, 32, 3)
  assert sorted(batch["label"][0].tolist()) == [0, 7, 14]


def _jpeg(array):
  buffer = io.BytesIO()
  Image.fromarray(array).save(buffer, format="JPEG")
  return buffer.getvalue()


def test_tfds_not_prepared_raises_without_downloading(tmp_path):
  with pytest.raises(DatasetNotPreparedError, match=r"dataset 'cifar10' is not prepared in data_dir=") as error:
    load_dataset("cifar10", source="tfds", data_dir=str(tmp_path))
  assert "download_and_prepare(file_format='array_record')" in str(error.value)
  assert list(tmp_path.iterdir()) == []  # nothing was written (no download attempt)


def _write_npz(directory, name, split, images, labels):
  np.savez(os.path.join(directory, f"{name}_{split}.npz"), images=images, labels=labels)


def test_npz_source_with_and_without_channel_axis(tmp_path):
  rng = np.random.default_rng(0)
  for split, count in (("train", 20), ("test", 6)):
    _write_npz(
      tmp_path,
      "tiny",
      split,
      rng.integers(0, 256, (count, 5, 4), dtype=np.uint8),
      rng.integers(0, 3, count).astype(np.uint8),
    )
  dataset = load_dataset("tiny", source="npz", data_dir=str(tmp_path), normalization="raw")
  assert (dataset.num_train, dataset.num_test, dataset.image_shape) == (20, 6, (5, 4, 1))
  assert dataset.num_classes == 3
  with np.load(tmp_path / "tiny_train.npz") as arrays:
    np.testing.assert_array_equal(dataset.train.images[..., 0], arrays["images"])


def test_npz_known_name_keeps_its_class_count(tmp_path):
  for split in ("train", "test"):
    _write_npz(tmp_path, "cifar10", split, np.zeros((4, 2, 2, 3), np.uint8), np.array([0, 1, 2, 1]))
  assert load_dataset("cifar10", source="npz", data_dir=str(tmp_path)).num_classes == 10


def test_npz_missing_files_name_the_data_dir(tmp_path):
  with pytest.raises(DatasetNotPreparedError, match="cifar10_train.npz does not exist"):
    load_dataset("cifar10", source="npz", data_dir=str(tmp_path))
  with pytest.raises(DatasetNotPreparedError, match="data_dir is required"):
    load_dataset("cifar10", source="npz")


def test_npz_without_required_arrays_is_rejected(tmp_path):
  for split in ("train", "test"):
    np.savez(tmp_path / f"bad_{split}.npz", x=np.zeros((2, 2, 2), np.uint8))
  with pytest.raises(ValueError, match=r"lacks array\(s\) \['images', 'labels'\]"):
    load_dataset("bad", source="npz", data_dir=str(tmp_path))


def test_embedded_digits_are_the_real_scikit_learn_images():
  dataset = load_dataset("digits", source="embedded", normalization="raw")
  assert (dataset.num_train, dataset.num_test) == (1497, 300)
  assert dataset.image_shape == (8, 8, 1) and dataset.num_classes == 10
  assert dataset.train.images.max() == 255 and dataset.train.images.min() == 0
  assert set(np.unique(dataset.test.labels)) == set(range(10))
  again = load_dataset("digits", source="embedded", normalization="raw")
  np.testing.assert_array_equal(dataset.test.images, again.test.images)  # fixed split


def test_embedded_digits_are_read_as_scikit_learn_reads_them_without_importing_it(monkeypatch):
  """The file is parsed directly (importing scikit-learn costs every run's start-up about 2 s); the images and
  labels must be scikit-learn's own ``load_digits()`` ones, scaled 0..16 -> 0..255 and split by the fixed seed."""
  from sklearn.datasets import load_digits

  train, test = load_digits_splits()
  reference = load_digits()
  order = np.random.default_rng(0).permutation(1797)
  expected = np.rint(reference.images * (255 / 16)).astype(np.uint8)[..., None]
  np.testing.assert_array_equal(test.images, expected[order[:300]])
  np.testing.assert_array_equal(train.images, expected[order[300:]])
  np.testing.assert_array_equal(test.labels, reference.target[order[:300]])
  np.testing.assert_array_equal(train.labels, reference.target[order[300:]])
  monkeypatch.setattr(importlib.util, "find_spec", lambda name: None)
  with pytest.raises(FileNotFoundError, match=r"sklearn/datasets/data/digits\.csv\.gz .*install scikit-learn"):
    load_digits_splits()


@pytest.mark.parametrize(
  "kwargs, match",
  [
    (dict(name="cifar10", source="web"), "source must be one of"),
    (dict(name="cifar10", source="tfds", normalization="zca"), "normalization must be one of"),
    (dict(name="cifar10", source="python"), r"an import path 'package.module:function' goes with source='python'"),
    (dict(name="pkg.mod:load", source="npz"), r"an import path 'package.module:function' goes with source='python'"),
    (dict(name="cifar10", source="embedded"), "dataset 'cifar10' is not embedded"),
  ],
)
def test_bad_arguments_name_the_field(kwargs, match):
  name = kwargs.pop("name")
  with pytest.raises(ValueError, match=match):
    load_dataset(name, **kwargs)


@pytest.mark.skipif(
  not os.path.isfile(os.path.join(SHARED_MNIST, "mnist_train.npz")),
  reason="shared/data (real MNIST copy) is absent on this machine",
)
def test_real_mnist_from_shared_data():
  dataset = load_dataset("mnist", source="npz", data_dir=SHARED_MNIST, normalization="per_pixel_mean")
  assert (dataset.num_train, dataset.num_test, dataset.image_shape) == (60000, 10000, (28, 28, 1))
  assert np.bincount(dataset.train.labels).tolist()[:3] == [5923, 6742, 5958]  # MNIST's class counts
  mean_image = dataset.train.images.mean(axis=0, dtype=np.float64)
  np.testing.assert_allclose(dataset.normalization.offset, mean_image, rtol=1e-5)
  batches = LearnerBatches(dataset, batch_per_learner=4, learners=32, seed=0)
  batch = batches(np.arange(32), np.zeros(32, np.int64))
  # Each learner's batch equals the raw pixels minus the mean image, no scaling.
  first = batches.sample_indices(np.array([0]), np.array([0]))[0]
  np.testing.assert_allclose(batch["image"][0], dataset.train.images[first] - mean_image, atol=1e-3)


def test_any_tfds_data_set_with_its_own_label_feature_and_class_count():
  """CIFAR-100's coarse labels: another label key, and 20 classes read from its DatasetInfo."""
  with tfds.testing.mock_data(num_examples=10):
    dataset = load_dataset("cifar100", source="tfds", data_dir="/nonexistent/tfds", label_key="coarse_label")
  assert (dataset.num_classes, dataset.num_train, dataset.image_shape) == (20, 10, (32, 32, 3))
  assert dataset.train.labels.max() < 20


@pytest.mark.parametrize(
  "options, match",
  [
    (dict(label_key="fine"), r"config.label_key='fine' is not a feature of tfds data set 'cifar100'; its features: "),
    (dict(image_key="id"), r"config.image_key='id' of tfds data set 'cifar100' is a Text, not an Image"),
    (dict(label_key="id"), r"config.label_key='id' of tfds data set 'cifar100' is a Text, not a ClassLabel"),
  ],
)
def test_tfds_features_that_are_not_an_image_and_a_class_label_are_refused(options, match):
  with tfds.testing.mock_data(num_examples=4):
    with pytest.raises(ValueError, match=match):
      load_dataset("cifar100", source="tfds", data_dir="/nonexistent/tfds", **options)


def test_an_unknown_tfds_name_lists_what_the_data_dir_holds(tmp_path):
  (tmp_path / "my_scans" / "1.0.0").mkdir(parents=True)
  (tmp_path / "my_scans" / "1.0.0" / "dataset_info.json").write_text("{}")
  (tmp_path / "not_a_dataset").mkdir()
  with pytest.raises(
    ValueError,
    match=r"config.dataset='no_such_data' is neither a tfds data set nor prepared in "
    r"data_dir=.*; prepared there: \['my_scans'\]",
  ):
    load_dataset("no_such_data", source="tfds", data_dir=str(tmp_path))


def _user_arrays(classes: int = 3, train: int = 12, test: int = 9):
  rng = np.random.default_rng(0)
  images = lambda count: rng.integers(0, 256, (count, 6, 5), dtype=np.uint8)
  return (images(train), np.arange(train) % classes), (images(test), np.array([0] * 6 + [1, 2, 2]))


def user_tuple_data():
  return _user_arrays()


def user_mapping_data():
  (train_images, train_labels), test = _user_arrays()
  return {"train": (train_images, train_labels), "test": test, "num_classes": 5}


def user_float_images():
  (train_images, train_labels), test = _user_arrays()
  return (train_images.astype(np.float64), train_labels), test


def user_float_train_uint8_test():
  (train_images, train_labels), test = _user_arrays()
  return (train_images.astype(np.float32), train_labels), test


def user_features():
  """Feature vectors [N, 1, 4] in float32, two classes by the sign of their sum."""
  rng = np.random.default_rng(1)
  features = lambda count: rng.normal(size=(count, 1, 4)).astype(np.float32)
  train, test = features(16), features(8)
  return (train, (train.sum(axis=(1, 2)) > 0).astype(int)), (test, (test.sum(axis=(1, 2)) > 0).astype(int))


def user_wrong_form():
  return [1, 2, 3]


def test_a_python_data_source_by_import_path():
  dataset = load_dataset(f"{__name__}:user_tuple_data", source="python", normalization="unit")
  assert (dataset.num_train, dataset.num_test, dataset.num_classes, dataset.image_shape) == (12, 9, 3, (6, 5, 1))
  # Chance level from the data: always predicting class 0, the most frequent test class (6 of 9).
  assert dataset.chance_test_error == pytest.approx(100.0 * (1 - 6 / 9))
  assert load_dataset(f"{__name__}:user_mapping_data", source="python").num_classes == 5


@pytest.mark.parametrize(
  "function, match",
  [
    ("user_float_images", r"config.dataset='.*:user_float_images', train split: images must be uint8"),
    ("user_float_train_uint8_test", r"one split's inputs are float32 values and the other's uint8 pixels"),
    ("user_wrong_form", r"returned a list; allowed: \(\(train_images, train_labels\), "),
    ("missing_function", r"has no attribute 'missing_function'"),
  ],
)
def test_a_bad_python_data_source_is_refused_naming_the_field(function, match):
  with pytest.raises(ValueError, match=match):
    load_dataset(f"{__name__}:{function}", source="python")


def test_float_features_are_taken_as_they_are_and_only_so():
  dataset = load_dataset(f"{__name__}:user_features", source="python", normalization="raw")
  (train, train_labels), _ = user_features()
  assert dataset.image_shape == (1, 4, 1) and dataset.num_classes == 2
  batches = LearnerBatches(dataset, batch_per_learner=4, learners=2, seed=0)
  batch = batches(learner=np.array([0]), k=np.array([0]))
  rows = batches.epoch_permutation(0)[:4]  # learner 0's first batch: global batch 0
  np.testing.assert_array_equal(batch["image"][0, ..., 0], train[rows])
  np.testing.assert_array_equal(batch["label"][0], train_labels[rows])
  with pytest.raises(ValueError, match=r"normalization='per_channel' for float32 inputs; allowed: 'raw'"):
    load_dataset(f"{__name__}:user_features", source="python", normalization="per_channel")
  with pytest.raises(ValueError, match=r"augment=True for dataset .*user_features.*float32 values, not pixels"):
    LearnerBatches(dataset, batch_per_learner=4, learners=2, seed=0, augment=True)
