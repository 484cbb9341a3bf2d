"""Bad input files and a changed config, refused with a ValueError naming the file (or field) before any work.

* npz data (`stalesgd.data._npz_source`): each kind of damage or mismatch is
  written into an otherwise good copy of the digits and loaded; the error must
  be a ValueError naming the damaged file and the problem. One of them goes
  through `train_and_evaluate`, which must stop before compiling anything.
* timing trace files (`stalesgd.schedule.TimingModel` ``trace=``): missing,
  unreadable, wrong columns, non-positive or NaN durations.
* a workdir holding a real run, restarted with another config: refused,
  naming the field, with nothing in the workdir changed.
* a workdir whose run started on other data (``dataset.json``'s sha256 differs
  from the data read now): refused naming both digests and the data dir.
"""

from __future__ import annotations

import json
import pathlib
import re
import shutil

import numpy as np
import pytest

from stalesgd.data import DatasetNotPreparedError, load_dataset
from stalesgd.schedule import TimingModel, simulate
from stalesgd.training._workdir import check_same_data
from tests.helpers.fault_helpers import fault_config, train_in_process
from tests.helpers.train_helpers import complete_checkpoints, read_metrics


def _arrays(directory: pathlib.Path, split: str) -> dict[str, np.ndarray]:
  with np.load(directory / f"digits_{split}.npz") as arrays:
    return {name: arrays[name] for name in arrays.files}


def _rewrite(directory: pathlib.Path, split: str, **arrays: np.ndarray) -> None:
  np.savez(directory / f"digits_{split}.npz", **arrays)


def wrong_image_rank(directory):
  arrays = _arrays(directory, "train")
  _rewrite(directory, "train", images=arrays["images"].reshape(len(arrays["images"]), -1), labels=arrays["labels"])


def float_images_with_nan(directory):
  arrays = _arrays(directory, "train")
  images = arrays["images"].astype(np.float32)
  images[3, 0, 0, 0] = np.nan
  _rewrite(directory, "train", images=images, labels=arrays["labels"])


def too_few_labels(directory):
  arrays = _arrays(directory, "test")
  _rewrite(directory, "test", images=arrays["images"], labels=arrays["labels"][:-1])


def float_labels(directory):
  arrays = _arrays(directory, "train")
  _rewrite(directory, "train", images=arrays["images"], labels=arrays["labels"].astype(np.float32))


def label_out_of_range(directory):
  arrays = _arrays(directory, "test")
  labels = arrays["labels"].copy()
  labels[7] = 10  # the digits have classes 0-9
  _rewrite(directory, "test", images=arrays["images"], labels=labels)


def negative_label(directory):
  arrays = _arrays(directory, "train")
  labels = arrays["labels"].copy()
  labels[0] = -1
  _rewrite(directory, "train", images=arrays["images"], labels=labels)


def empty_split(directory):
  arrays = _arrays(directory, "test")
  _rewrite(directory, "test", images=arrays["images"][:0], labels=arrays["labels"][:0])


def other_image_size(directory):
  arrays = _arrays(directory, "test")
  _rewrite(
    directory, "test", images=np.pad(arrays["images"], ((0, 0), (0, 1), (0, 1), (0, 0))), labels=arrays["labels"]
  )


def truncated(directory):
  path = directory / "digits_train.npz"
  path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def flipped_byte(directory):
  path = directory / "digits_train.npz"
  data = bytearray(path.read_bytes())
  data[len(data) // 2] ^= 0xFF  # inside the images array: the member's CRC-32 no longer matches
  path.write_bytes(bytes(data))


def pickled_object_array(directory):
  arrays = _arrays(directory, "train")
  images = np.empty(len(arrays["images"]), dtype=object)
  _rewrite(directory, "train", images=images, labels=arrays["labels"])


def not_an_archive(directory):
  np.save(directory / "digits_train.npy", np.zeros(3))
  (directory / "digits_train.npy").rename(directory / "digits_train.npz")


def missing_labels(directory):
  arrays = _arrays(directory, "train")
  _rewrite(directory, "train", images=arrays["images"])


# damage -> (file it is in, what the message must say)
NPZ_DAMAGE = {
  wrong_image_rank: ("train", r"'images' has shape \(1497, 64\); allowed: \[N, H, W\] or \[N, H, W, C\]"),
  float_images_with_nan: (
    "train",
    r"'images' has dtype float32 \(1 of its pixels are NaN or infinite\); "
    r"allowed: uint8",
  ),
  too_few_labels: ("test", r"'labels' has shape \(299,\); allowed: \[N\] = \(300,\)"),
  float_labels: ("train", r"'labels' has dtype float32; allowed: integers"),
  label_out_of_range: ("test", r"'labels' range from 0 to 10; allowed: 0 to 9"),
  negative_label: ("train", r"'labels' range from -1 to 9; allowed: 0 to 9"),
  empty_split: ("test", r"'images' holds no example"),
  other_image_size: ("test", r"images of shape \(9, 9, 1\) \(H, W, C\), but .*digits_train\.npz has \(8, 8, 1\)"),
  truncated: ("train", r"is not a readable npz file, truncated or corrupt\?"),
  flipped_byte: ("train", r"is not a readable npz file, truncated or corrupt\? \(BadZipFile: Bad CRC-32"),
  pickled_object_array: ("train", r"cannot be read as an npz file \(.*allow_pickle"),
  not_an_archive: ("train", r"is not a readable npz file"),
  missing_labels: ("train", r"lacks array\(s\) \['labels'\]"),
}


@pytest.fixture
def damaged_copy(digits_npz, tmp_path) -> pathlib.Path:
  directory = tmp_path / "data"
  shutil.copytree(digits_npz, directory)
  return directory


@pytest.mark.parametrize("damage", list(NPZ_DAMAGE), ids=lambda damage: damage.__name__)
def test_bad_npz_data_is_refused_naming_the_file(damage, damaged_copy):
  split, message = NPZ_DAMAGE[damage]
  damage(damaged_copy)
  path = damaged_copy / f"digits_{split}.npz"
  with pytest.raises(ValueError, match=rf"^{re.escape(str(path))}:? .*{message}") as error:
    load_dataset("digits", source="npz", data_dir=str(damaged_copy))
  assert not isinstance(error.value, DatasetNotPreparedError)


def test_the_good_copy_loads(damaged_copy):
  dataset = load_dataset("digits", source="npz", data_dir=str(damaged_copy))
  assert (dataset.num_train, dataset.num_test, dataset.num_classes) == (1497, 300, 10)


def test_a_truncated_npz_stops_a_run_before_anything_is_compiled(damaged_copy, tmp_path, compilations):
  truncated(damaged_copy)
  with pytest.raises(ValueError, match=r"digits_train\.npz is not a readable npz file"):
    train_in_process(fault_config("hardsync", damaged_copy), tmp_path / "run")
  assert compilations == []


TRACE_CASES = {
  "missing_npy": (None, "trace.npy", r"trace file '.*trace\.npy' does not exist"),
  "missing_csv": (None, "trace.csv", r"trace file '.*trace\.csv' does not exist"),
  "ragged_csv": (
    "1.0,2.0\n1.0\n",
    "trace.csv",
    r"trace file '.*trace\.csv' cannot be read \(ValueError: .*"
    r"same number of columns on every row",
  ),
  "text_in_csv": ("1.0,fast\n", "trace.csv", r"trace file '.*trace\.csv' cannot be read"),
  "negative_duration": (
    "1.0,2.0\n-3.0,1.0\n",
    "trace.csv",
    r"trace values must be finite and > 0; '.*trace\.csv' has 1 that are not, the first "
    r"-3\.0 at index \(1, 0\)",
  ),
  "zero_duration": ("0\n1\n", "trace.csv", r"trace values must be finite and > 0; .* the first 0\.0 at index"),
  "nan_duration": (
    "1.0\nnan\n",
    "trace.csv",
    r"trace values must be finite and > 0; .* the first nan at index "
    r"\(1,\)",
  ),
  "nan_in_npy": (np.array([[1.0, np.nan]]), "trace.npy", r"the first nan at index \(0, 1\)"),
  "three_dimensions": (np.ones((2, 2, 2)), "trace.npy", r"trace must have 1 or 2 dimensions; .* shape \(2, 2, 2\)"),
  "strings_in_npy": (np.array(["1.0", "2.0"]), "trace.npy", r"holds <U3 values; allowed: real numbers"),
  "complex_in_npy": (np.array([1 + 2j]), "trace.npy", r"holds complex128 values; allowed: real numbers"),
  "truncated_npy": ("truncated", "trace.npy", r"trace file '.*trace\.npy' cannot be read"),
  "pickled_npy": ("pickled", "trace.npy", r"trace file '.*trace\.npy' cannot be read .*allow_pickle"),
}


@pytest.mark.parametrize("case", list(TRACE_CASES))
def test_bad_trace_files_are_refused_naming_the_file(case, tmp_path):
  contents, name, message = TRACE_CASES[case]
  path = tmp_path / name
  if isinstance(contents, str) and contents == "truncated":
    np.save(path, np.ones((4, 8)))
    path.write_bytes(path.read_bytes()[:100])
  elif isinstance(contents, str) and contents == "pickled":
    np.save(path, np.array([{"learner": 1.0}], dtype=object), allow_pickle=True)
  elif isinstance(contents, str):
    path.write_text(contents)
  elif contents is not None:
    np.save(path, contents)
  with pytest.raises(ValueError, match=message):
    TimingModel(trace=str(path))


def test_a_trace_with_the_wrong_number_of_columns_is_refused_before_simulating(tmp_path):
  path = tmp_path / "trace.csv"
  path.write_text("1.0,1.1,0.9\n1.2,1.0,1.0\n")  # 3 learners' step times
  with pytest.raises(
    ValueError,
    match=r"trace '.*trace\.csv' must have shape \[learners\].*learners=8; "
    r"got shape \(2, 3\)",
  ):
    simulate("async", learners=8, num_updates=10, seed=0, timing=TimingModel(trace=str(path)))


@pytest.mark.slow
def test_a_real_run_restarted_with_another_config_is_refused_and_its_workdir_left_alone(
  tmp_path, digits_npz, reference_run
):
  _, reference_dir = reference_run("async_dc")
  workdir = tmp_path / "run"
  shutil.copytree(reference_dir, workdir)
  before = {path.relative_to(workdir): path.read_bytes() for path in workdir.rglob("*") if path.is_file()}
  for changed, message in (
    (dict(learning_rate=0.05), r"learning_rate: 0\.02 -> 0\.05"),
    (dict(dc_lambda=1.0), r"dc_lambda: 2\.0 -> 1\.0"),
    (dict(num_epochs=2.0), r"num_epochs: 1\.0 -> 2\.0"),
  ):
    with pytest.raises(ValueError, match=rf"holds a run of another config \({message}\); allowed: the same config"):
      train_in_process(fault_config("async_dc", digits_npz, **changed), workdir)
  after = {path.relative_to(workdir): path.read_bytes() for path in workdir.rglob("*") if path.is_file()}
  assert after == before
  assert complete_checkpoints(workdir) == [8, 188] and read_metrics(workdir)


def _started_on(data: pathlib.Path, workdir: pathlib.Path) -> dict:
  """A hand-built run directory of the hardsync config, as its start on ``data`` leaves it: config and dataset."""
  workdir.mkdir()
  (workdir / "config.json").write_text(fault_config("hardsync", data).to_json())
  description = load_dataset("digits", source="npz", data_dir=str(data)).description()
  (workdir / "dataset.json").write_text(json.dumps(description))
  return description


def test_a_run_resumed_on_other_data_is_refused_naming_both_digests_and_the_data_dir(damaged_copy, tmp_path):
  """One pixel of the train split changed since the run started: the same config would continue on other
  examples, so the resume is refused naming the split's recorded and current sha256 and where the data is."""
  workdir = tmp_path / "run"
  recorded = _started_on(damaged_copy, workdir)["content_sha256"]
  before = (workdir / "dataset.json").read_bytes()
  arrays = _arrays(damaged_copy, "train")
  arrays["images"][0, 0, 0] ^= 1
  _rewrite(damaged_copy, "train", **arrays)
  now = load_dataset("digits", source="npz", data_dir=str(damaged_copy)).description()["content_sha256"]
  assert now["train"] != recorded["train"] and now["test"] == recorded["test"]
  message = (
    rf"{re.escape(str(workdir))} holds a run started on other data: the sha256 of 'digits' \(npz, data_dir "
    rf"{re.escape(str(damaged_copy))}\) differs from dataset\.json's \(train: recorded {recorded['train']} -> "
    rf"now {now['train']}\); allowed: the data the run started with"
  )
  with pytest.raises(ValueError, match=message):
    train_in_process(fault_config("hardsync", damaged_copy), workdir)
  assert (workdir / "dataset.json").read_bytes() == before  # the record of what the run started on is kept
  assert not (workdir / "checkpoints").exists()


def test_the_same_data_or_no_recorded_digest_resumes(damaged_copy, tmp_path):
  """The data the run started on passes; so does a dataset.json from before digests were recorded (nothing to
  compare) and a workdir without one."""
  workdir = tmp_path / "run"
  config = fault_config("hardsync", damaged_copy)
  description = _started_on(damaged_copy, workdir)
  check_same_data(config, description, workdir)
  (workdir / "dataset.json").write_text(json.dumps({**description, "content_sha256": None}))
  check_same_data(config, {**description, "content_sha256": {"train": "0" * 64, "test": "0" * 64}}, workdir)
  check_same_data(config, description, tmp_path / "empty")
