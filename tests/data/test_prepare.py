"""`python -m stalesgd.data.prepare`: local files -> tfds ArrayRecord data set -> the same arrays back.

Small generated inputs in every accepted layout round-trip through `prepare`
and ``tfds.data_source`` (no TensorFlow, no network); bad inputs fail naming
what is missing. With real data (``STALESGD_REAL_DATA_DIR``: directories,
separated by ``os.pathsep``, holding ``<name>_{train,test}.npz`` directly or in
a ``<name>/`` sub-folder), CIFAR-10 and MNIST prepared this way load as exactly
the arrays ``source='npz'`` loads, and CIFAR-10 trains the same run from both bit for bit.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import pickle
import subprocess
import sys

import numpy as np
import pytest
import tensorflow_datasets as tfds
from PIL import Image

from stalesgd.data import load_dataset
from stalesgd.data.preparation import _cifar10 as cifar10
from stalesgd.data.preparation import _tfds_writer as tfds_writer
from stalesgd.data.preparation._layouts import MissingInputError
from stalesgd.data.prepare import PREPARABLE, prepare

REAL_DATA_VARIABLE = "STALESGD_REAL_DATA_DIR"
REPOSITORY = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _arrays(rng: np.random.Generator, count: int, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
  return rng.integers(0, 256, (count, *shape), dtype=np.uint8), rng.integers(0, 10, count)


def _cifar_splits(seed: int = 0) -> dict[str, tuple[np.ndarray, np.ndarray]]:
  rng = np.random.default_rng(seed)
  return {"train": _arrays(rng, 20, (32, 32, 3)), "test": _arrays(rng, 10, (32, 32, 3))}


def _channel_major(images: np.ndarray) -> np.ndarray:
  return images.transpose(0, 3, 1, 2).reshape(len(images), -1)


def _write_cifar(directory: str, splits: dict[str, tuple[np.ndarray, np.ndarray]], form: str) -> None:
  """CIFAR-10 as the python or binary batches (training data in five batches) or npz."""
  os.makedirs(directory, exist_ok=True)
  if form == "npz":
    for split, (images, labels) in splits.items():
      np.savez(os.path.join(directory, f"cifar10_{split}.npz"), images=images, labels=labels)
    return
  train_images, train_labels = splits["train"]
  batches = [
    (f"data_batch_{index + 1}", part, labels)
    for index, (part, labels) in enumerate(zip(np.array_split(train_images, 5), np.array_split(train_labels, 5)))
  ]
  batches.append(("test_batch", *splits["test"]))
  for batch, images, labels in batches:
    if form == "python":
      with open(os.path.join(directory, batch), "wb") as file:
        pickle.dump(
          {
            b"batch_label": batch.encode(),
            b"data": _channel_major(images),
            b"labels": [int(label) for label in labels],
          },
          file,
        )
    else:
      records = np.concatenate([labels.astype(np.uint8)[:, None], _channel_major(images)], axis=1)
      records.tofile(os.path.join(directory, f"{batch}.bin"))


def _write_idx(path: str, array: np.ndarray) -> None:
  header = bytes([0, 0, 0x08, array.ndim]) + np.asarray(array.shape, ">u4").tobytes()
  opener = gzip.open if path.endswith(".gz") else open
  with opener(path, "wb") as file:
    file.write(header + np.ascontiguousarray(array, np.uint8).tobytes())


def _read_back(name: str, data_dir: str, splits: tuple[str, ...]) -> list[list[dict]]:
  sources = tfds.data_source(name, split=list(splits), data_dir=data_dir, download=False)
  return [[source[index] for index in range(len(source))] for source in sources]


def _assert_same_arrays(name: str, data_dir: str, splits: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
  for split, examples in zip(splits, _read_back(name, data_dir, tuple(splits))):
    images, labels = splits[split]
    assert len(examples) == len(images)
    got = np.stack([example["image"] for example in examples])
    assert got.dtype == np.uint8 and got.shape == (len(images), *images.shape[1:3], got.shape[-1])
    np.testing.assert_array_equal(got.reshape(images.shape), images)
    np.testing.assert_array_equal([example["label"] for example in examples], labels)


@pytest.mark.parametrize(
  "form, folder",
  [("python", ""), ("binary", ""), ("npz", ""), ("python", "cifar-10-batches-py"), ("binary", "cifar-10-batches-bin")],
)
def test_cifar10_round_trips_in_input_order(tmp_path, form, folder):
  splits = _cifar_splits()
  _write_cifar(str(tmp_path / "in" / folder), splits, form)
  path = prepare("cifar10", str(tmp_path / "in"), str(tmp_path / "tfds"), progress=None)

  assert path == str(tmp_path / "tfds" / "cifar10" / "3.0.2")
  assert {"dataset_info.json", "features.json"} <= set(os.listdir(path))
  assert any(file.startswith("cifar10-train.array_record-") for file in os.listdir(path))
  _assert_same_arrays("cifar10", str(tmp_path / "tfds"), splits)
  info = tfds.builder("cifar10", data_dir=str(tmp_path / "tfds")).info
  assert {split: info.splits[split].num_examples for split in ("train", "test")} == {"train": 20, "test": 10}
  assert info.features["label"].names == list(cifar10.LABEL_NAMES)
  assert info.features["label"].np_dtype == np.int64 and info.features["image"].shape == (32, 32, 3)
  first_test = tfds.data_source("cifar10", split="test", data_dir=str(tmp_path / "tfds"), download=False)[0]
  assert first_test["id"] == b"test_00000"

  dataset = load_dataset("cifar10", source="tfds", data_dir=str(tmp_path / "tfds"), normalization="raw")
  np.testing.assert_array_equal(dataset.train.images, splits["train"][0])
  np.testing.assert_array_equal(dataset.test.labels, splits["test"][1])
  assert dataset.num_classes == 10


@pytest.mark.parametrize(
  "name, names",
  [
    (
      "mnist",
      (
        "train-images-idx3-ubyte.gz",
        "train-labels-idx1-ubyte.gz",
        "t10k-images-idx3-ubyte.gz",
        "t10k-labels-idx1-ubyte.gz",
      ),
    ),
    (
      "mnist",
      ("train-images-idx3-ubyte", "train-labels-idx1-ubyte", "t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
    ),
    (
      "fashion_mnist",
      ("train-images.idx3-ubyte", "train-labels.idx1-ubyte", "t10k-images.idx3-ubyte.gz", "t10k-labels.idx1-ubyte.gz"),
    ),
  ],
)
def test_mnist_idx_round_trips(tmp_path, name, names):
  rng = np.random.default_rng(1)
  splits = {"train": _arrays(rng, 12, (28, 28)), "test": _arrays(rng, 7, (28, 28))}
  arrays = [splits["train"][0], splits["train"][1], splits["test"][0], splits["test"][1]]
  os.makedirs(tmp_path / "in")
  for file_name, array in zip(names, arrays):
    _write_idx(str(tmp_path / "in" / file_name), array)
  prepare(name, str(tmp_path / "in"), str(tmp_path / "tfds"), progress=None)
  _assert_same_arrays(name, str(tmp_path / "tfds"), splits)
  dataset = load_dataset(name, source="tfds", data_dir=str(tmp_path / "tfds"), normalization="raw")
  assert dataset.image_shape == (28, 28, 1) and dataset.num_train == 12 and dataset.num_test == 7


def test_mnist_npz_round_trips(tmp_path):
  rng = np.random.default_rng(2)
  splits = {"train": _arrays(rng, 9, (28, 28)), "test": _arrays(rng, 5, (28, 28))}
  os.makedirs(tmp_path / "in")
  for split, (images, labels) in splits.items():
    np.savez(tmp_path / "in" / f"mnist_{split}.npz", images=images, labels=labels)
  prepare("mnist", str(tmp_path / "in"), str(tmp_path / "tfds"), progress=None)
  _assert_same_arrays("mnist", str(tmp_path / "tfds"), splits)


def _jpeg(image: np.ndarray, mode: str = "RGB", image_format: str = "JPEG") -> bytes:
  buffer = io.BytesIO()
  Image.fromarray(image).convert(mode).save(buffer, format=image_format)
  return buffer.getvalue()


def _imagenet_wnids(data_dir: str) -> list[str]:
  return tfds_writer.local_builder("imagenet2012", data_dir).info.features["label"].names


def test_imagenet_folder_tree_round_trips(tmp_path):
  wnids = _imagenet_wnids(str(tmp_path / "tfds"))
  classes = [wnids[0], wnids[17], wnids[999]]
  rng = np.random.default_rng(3)
  written = {"train": [], "validation": []}
  for split, folder, per_class in (("train", "train", 2), ("validation", "val", 1)):
    for wnid in classes:
      os.makedirs(tmp_path / "in" / folder / wnid)
      for index in range(per_class):
        data = _jpeg(rng.integers(0, 256, (20 + 3 * index, 30, 3), dtype=np.uint8))
        file_name = f"{wnid}_{index}.JPEG"
        (tmp_path / "in" / folder / wnid / file_name).write_bytes(data)
        written[split].append((file_name, wnids.index(wnid), data))
  # A PNG named .JPEG and a CMYK JPEG (ImageNet has both) are re-encoded as RGB JPEG.
  odd = {
    f"{classes[1]}_png.JPEG": _jpeg(np.full((9, 9, 3), 200, np.uint8), image_format="PNG"),
    f"{classes[1]}_cmyk.JPEG": _jpeg(np.full((9, 9, 3), 50, np.uint8), mode="CMYK"),
  }
  for file_name, data in odd.items():
    (tmp_path / "in" / "train" / classes[1] / file_name).write_bytes(data)
  (tmp_path / "in" / "train" / classes[0] / "notes.txt").write_text("not an image")

  prepare("imagenet2012", str(tmp_path / "in"), str(tmp_path / "tfds"), progress=None)

  train, validation = tfds.data_source(
    "imagenet2012",
    split=["train", "validation"],
    data_dir=str(tmp_path / "tfds"),
    download=False,
    decoders={"image": tfds.decode.SkipDecoding()},
  )
  assert (len(train), len(validation)) == (8, 3)
  by_name = {example["file_name"].decode(): example for example in (train[index] for index in range(len(train)))}
  assert sorted(by_name) == sorted([name for name, _, _ in written["train"]] + list(odd))
  for file_name, label, data in written["train"]:
    assert by_name[file_name]["image"] == data and by_name[file_name]["label"] == label
  for file_name in odd:
    with Image.open(io.BytesIO(by_name[file_name]["image"])) as picture:
      assert (picture.format, picture.mode, picture.size) == ("JPEG", "RGB", (9, 9))
  assert [validation[index]["image"] for index in range(3)] == [data for _, _, data in written["validation"]]
  assert [validation[index]["label"] for index in range(3)] == [0, 17, 999]

  dataset = load_dataset("imagenet2012", source="tfds", data_dir=str(tmp_path / "tfds"), image_size=16)
  images, labels = dataset.test.read(np.arange(3))
  assert images.shape == (3, 16, 16, 3) and list(labels) == [0, 17, 999] and dataset.num_classes == 1000


def test_imagenet_flat_validation_folder_uses_the_tfds_label_list(tmp_path):
  wnids = _imagenet_wnids(str(tmp_path / "tfds"))
  with open(tfds.core.tfds_path("datasets/imagenet2012/validation_labels.txt")) as file:
    validation_labels = file.read().split()
  os.makedirs(tmp_path / "in" / "train" / wnids[5])
  (tmp_path / "in" / "train" / wnids[5] / "a.JPEG").write_bytes(_jpeg(np.zeros((8, 8, 3), np.uint8)))
  os.makedirs(tmp_path / "in" / "val")
  for number in (1, 2, 50000):
    (tmp_path / "in" / "val" / f"ILSVRC2012_val_{number:08d}.JPEG").write_bytes(_jpeg(np.zeros((8, 8, 3), np.uint8)))
  prepare("imagenet2012", str(tmp_path / "in"), str(tmp_path / "tfds"), progress=None)
  (validation,) = _read_back("imagenet2012", str(tmp_path / "tfds"), ("validation",))
  assert [example["label"] for example in validation] == [
    wnids.index(validation_labels[number - 1]) for number in (1, 2, 50000)
  ]


def test_progress_lines_name_the_split_and_count(tmp_path):
  _write_cifar(str(tmp_path / "in"), _cifar_splits(), "python")
  stream = io.StringIO()
  prepare("cifar10", str(tmp_path / "in"), str(tmp_path / "tfds"), progress=stream)
  lines = stream.getvalue().splitlines()
  assert lines[0].startswith("cifar10: read CIFAR-10 python batches in ") and "(train 20, test 10 examples)" in lines[0]
  assert any(line.startswith("cifar10 train: 20/20 examples (100.0%)") for line in lines)
  assert any(line.startswith("cifar10 test: 10/10 examples (100.0%)") for line in lines)


def test_unknown_dataset_names_the_allowed_ones(tmp_path):
  with pytest.raises(
    ValueError,
    match=r"cannot prepare dataset 'svhn'; allowed: cifar10, mnist, fashion_mnist, "
    r"imagenet2012",
  ):
    prepare("svhn", str(tmp_path), str(tmp_path / "tfds"))
  assert PREPARABLE == ("cifar10", "mnist", "fashion_mnist", "imagenet2012")


def test_missing_inputs_are_named(tmp_path):
  with pytest.raises(MissingInputError, match=r"--from='.*nowhere' is not a directory"):
    prepare("cifar10", str(tmp_path / "nowhere"), str(tmp_path / "tfds"))
  os.makedirs(tmp_path / "empty")
  with pytest.raises(
    MissingInputError,
    match=r"cifar10: no input files found in .*empty\. Accepted layouts: "
    r"CIFAR-10 python batches \(data_batch_1, .*test_batch\); "
    r"CIFAR-10 binary batches .*cifar10_train\.npz, cifar10_test\.npz",
  ):
    prepare("cifar10", str(tmp_path / "empty"), str(tmp_path / "tfds"))
  _write_cifar(str(tmp_path / "partial"), _cifar_splits(), "python")
  os.remove(tmp_path / "partial" / "data_batch_3")
  with pytest.raises(MissingInputError, match=r"holds part of the CIFAR-10 python batches but lacks data_batch_3\."):
    prepare("cifar10", str(tmp_path / "partial"), str(tmp_path / "tfds"))
  os.makedirs(tmp_path / "idx")
  _write_idx(str(tmp_path / "idx" / "train-images-idx3-ubyte.gz"), np.zeros((2, 28, 28), np.uint8))
  with pytest.raises(
    MissingInputError,
    match=r"lacks train-labels-idx1-ubyte\.gz or train-labels-idx1-ubyte or "
    r"train-labels\.idx1-ubyte\.gz or train-labels\.idx1-ubyte, "
    r"t10k-images-idx3-ubyte\.gz",
  ):
    prepare("mnist", str(tmp_path / "idx"), str(tmp_path / "tfds"))
  os.makedirs(tmp_path / "imagenet" / "train")
  with pytest.raises(MissingInputError, match=r"lacks the validation folder val/ or validation/"):
    prepare("imagenet2012", str(tmp_path / "imagenet"), str(tmp_path / "tfds"))
  assert not os.path.exists(tmp_path / "tfds" / "cifar10")  # nothing half-written


def test_malformed_inputs_fail_before_writing(tmp_path):
  rng = np.random.default_rng(4)
  os.makedirs(tmp_path / "in")
  for split in ("train", "test"):  # MNIST-shaped arrays offered as CIFAR-10
    images, labels = _arrays(rng, 3, (28, 28))
    np.savez(tmp_path / "in" / f"cifar10_{split}.npz", images=images, labels=labels)
  with pytest.raises(ValueError, match=r"cifar10 train: images must be \[N, 32, 32, 3\] .*got \[N, 28, 28, 1\]"):
    prepare("cifar10", str(tmp_path / "in"), str(tmp_path / "tfds"))
  os.makedirs(tmp_path / "imagenet" / "train" / "cats")
  os.makedirs(tmp_path / "imagenet" / "val")
  with pytest.raises(
    ValueError,
    match=r"class folder\(s\) \['cats'\] are not ImageNet WordNet ids; allowed are "
    r"the 1000 ids of tfds imagenet2012, e.g. n01440764",
  ):
    prepare("imagenet2012", str(tmp_path / "imagenet"), str(tmp_path / "tfds"))
  (tmp_path / "bad.bin").write_bytes(b"\x00" * 100)
  with pytest.raises(ValueError, match=r"100 bytes is not a whole number of 3073-byte records"):
    cifar10.read_binary_batch(str(tmp_path / "bad.bin"))
  assert not os.path.exists(tmp_path / "tfds" / "cifar10")


def test_existing_data_set_is_kept_unless_overwrite(tmp_path):
  _write_cifar(str(tmp_path / "a"), _cifar_splits(0), "python")
  _write_cifar(str(tmp_path / "b"), _cifar_splits(1), "binary")
  prepare("cifar10", str(tmp_path / "a"), str(tmp_path / "tfds"), progress=None)
  with pytest.raises(FileExistsError, match=r"cifar10 3\.0\.2 is already prepared in .*pass --overwrite"):
    prepare("cifar10", str(tmp_path / "b"), str(tmp_path / "tfds"), progress=None)
  _assert_same_arrays("cifar10", str(tmp_path / "tfds"), _cifar_splits(0))
  prepare("cifar10", str(tmp_path / "b"), str(tmp_path / "tfds"), overwrite=True, progress=None)
  _assert_same_arrays("cifar10", str(tmp_path / "tfds"), _cifar_splits(1))


def _command(*arguments: str) -> subprocess.CompletedProcess:
  return subprocess.run(
    [sys.executable, "-m", "stalesgd.data.prepare", *arguments],
    cwd=REPOSITORY,
    capture_output=True,
    text=True,
    timeout=120,
    check=False,
  )


@pytest.mark.slow
def test_command_line(tmp_path):
  _write_cifar(str(tmp_path / "in"), _cifar_splits(), "binary")
  done = _command("cifar10", f"--from={tmp_path / 'in'}", f"--data_dir={tmp_path / 'tfds'}")
  assert done.returncode == 0, done.stderr
  assert f"prepared cifar10 in {tmp_path / 'tfds' / 'cifar10' / '3.0.2'}" in done.stdout
  assert "cifar10 train: 20/20 examples" in done.stderr
  _assert_same_arrays("cifar10", str(tmp_path / "tfds"), _cifar_splits())
  failed = _command("imagenet", f"--from={tmp_path / 'in'}", f"--data_dir={tmp_path / 'tfds'}")
  assert failed.returncode == 1
  assert "cannot prepare dataset 'imagenet'; allowed: cifar10, mnist, fashion_mnist, imagenet2012" in failed.stderr


def _real_npz_dir(name: str) -> str:
  for root in filter(None, os.environ.get(REAL_DATA_VARIABLE, "").split(os.pathsep)):
    for directory in (root, os.path.join(root, name)):
      if all(os.path.isfile(os.path.join(directory, f"{name}_{split}.npz")) for split in ("train", "test")):
        return directory
  pytest.skip(f"no real {name} npz files ({name}_train.npz, {name}_test.npz) in ${REAL_DATA_VARIABLE}")


@pytest.mark.slow
@pytest.mark.parametrize("name", ["cifar10", "mnist"])
def test_real_data_prepared_for_tfds_loads_as_the_npz_arrays(tmp_path, name):
  npz_dir = _real_npz_dir(name)
  prepare(name, npz_dir, str(tmp_path / "tfds"), progress=None)
  from_tfds = load_dataset(name, source="tfds", data_dir=str(tmp_path / "tfds"))
  from_npz = load_dataset(name, source="npz", data_dir=npz_dir)
  for split in ("train", "test"):
    np.testing.assert_array_equal(getattr(from_tfds, split).images, getattr(from_npz, split).images)
    np.testing.assert_array_equal(getattr(from_tfds, split).labels, getattr(from_npz, split).labels)
  assert (from_tfds.num_classes, from_tfds.image_shape) == (from_npz.num_classes, from_npz.image_shape)
  np.testing.assert_array_equal(from_tfds.normalization.offset, from_npz.normalization.offset)
  np.testing.assert_array_equal(from_tfds.normalization.scale, from_npz.normalization.scale)


@pytest.mark.slow
def test_real_cifar10_from_tfds_trains_the_same_run_as_from_npz_bit_for_bit(tmp_path):
  """The same short async run (an MLP, 40 updates of 8 learners x 16 images) on CIFAR-10 read through
  ``tfds.data_source`` after `prepare`, and from the npz arrays: the same weights and records."""
  from stalesgd.training._loop import train_and_evaluate
  from stalesgd.training._run_config import default_config

  npz_dir = _real_npz_dir("cifar10")
  prepare("cifar10", npz_dir, str(tmp_path / "tfds"), progress=None)
  summaries, records = [], []
  for source, data_dir in (("tfds", str(tmp_path / "tfds")), ("npz", npz_dir)):
    config = default_config()
    config.dataset, config.data_source, config.data_dir = "cifar10", source, data_dir
    config.model, config.protocol = "mlp", "async"
    config.num_epochs = 40 * 16 / 50_000  # 40 updates
    config.eval_every_epochs = config.num_epochs
    workdir = tmp_path / source
    summaries.append(train_and_evaluate(config, str(workdir)))
    records.append(
      [
        {key: value for key, value in json.loads(line).items() if key not in ("wall_time", "images_per_s")}
        for line in (workdir / "metrics.jsonl").read_text().splitlines()
      ]
    )
  assert summaries[0]["updates"] == summaries[1]["updates"] == 40
  assert summaries[0]["params_sha256"] == summaries[1]["params_sha256"]
  assert records[0] == records[1]
