"""`train_and_evaluate` end to end on mocked tfds data: every file a run leaves in its workdir.

tfds is mocked (`tfds.testing.mock_data`: random images of the real shapes), so
nothing is read from disk or the network; the accuracies are meaningless, the
bookkeeping is what is checked: metrics agree with the saved schedule record by
record, TensorBoard holds the same scalars as ``metrics.jsonl``, the plots and
the summary exist and agree with the metrics.
"""

from __future__ import annotations

import fnmatch
import json
import math
import pathlib
import subprocess

import jax
import matplotlib.image
import ml_collections
import numpy as np
import optax
import pytest
import tensorflow_datasets as tfds

import stalesgd
from stalesgd import schedule as schedule_lib
from stalesgd.records import _run_directory as run_directory
from stalesgd.training._config_readers import updates_per_epoch
from stalesgd.training._loop import train_and_evaluate
from stalesgd.training.checkpoint import Checkpointer
from tests.helpers.train_helpers import (
  SUMMARY_FIELDS,
  evaluation_records,
  event_scalars,
  read_metrics,
  read_summary,
  tiny_config,
)

MOCK_EXAMPLES = 48
TRAINING_FIELDS = (
  "train_loss",
  "lr_scale",
  "staleness_mean",
  "staleness_max",
  "epoch",
  "sim_time",
  "wall_time",
  "images_per_s",
)
EVALUATION_FIELDS = ("test_accuracy", "test_error", "test_loss", "train_accuracy")
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"

RUNS = {
  # Rudra's CIFAR-10 network (LRN, per-layer multipliers, Caffe mean subtraction)
  # under 2-softsync with alpha_0 / <sigma>.
  "cifar10": dict(
    dataset="cifar10",
    model="cifar10_full",
    normalization="per_pixel_mean",
    model_multipliers=True,
    protocol="softsync",
    n=2,
    learners=4,
    batch_per_learner=4,
    staleness_rule="inverse_mean",
  ),
  # MNIST with the small CNN under async with DC-ASGD-a.
  "mnist": dict(
    dataset="mnist", model="small_cnn", protocol="async", learners=8, batch_per_learner=3, delay_compensation="adaptive"
  ),
}


@pytest.fixture(scope="module", params=list(RUNS))
def finished_run(request, tmp_path_factory):
  """(config, workdir, summary) of a one-epoch run on mocked data, logging after every block."""
  workdir = tmp_path_factory.mktemp(f"run_{request.param}")
  config = tiny_config(
    "hardsync",
    data_source="tfds",
    data_dir=str(workdir / "no_tfds_here"),
    num_epochs=1.0,
    eval_every_epochs=0.5,
    log_every_updates=1,
    **RUNS[request.param],
  )
  config.model_options = ml_collections.ConfigDict()  # the tiny config's MLP width does not apply
  with tfds.testing.mock_data(num_examples=MOCK_EXAMPLES):
    summary = train_and_evaluate(config, str(workdir))
  return config, workdir, summary


@pytest.mark.slow
def test_summary_is_complete_and_written(finished_run):
  config, workdir, summary = finished_run
  total_updates = math.ceil(config.num_epochs * updates_per_epoch(config, MOCK_EXAMPLES))
  assert SUMMARY_FIELDS <= set(summary)
  assert read_summary(workdir) == json.loads(json.dumps(summary))
  assert summary["updates"] == total_updates and not summary["preempted"]
  assert (summary["protocol"], summary["learners"], summary["batch_per_learner"]) == (
    config.protocol,
    config.learners,
    config.batch_per_learner,
  )
  assert summary["epochs"] == pytest.approx(total_updates / updates_per_epoch(config, MOCK_EXAMPLES))
  assert len(summary["params_sha256"]) == 64 and int(summary["params_sha256"], 16) >= 0
  origin = summary["provenance"]
  assert (origin["backend"], origin["device_count"], origin["process_count"]) == ("cpu", 8, 1)
  assert origin["packages"]["jax"] == jax.__version__ and origin["packages"]["optax"] == optax.__version__
  assert origin["python"].startswith("3.") and origin["device_kind"]
  assert origin["stalesgd_version"] == stalesgd.__version__
  assert origin["checkpoint_format"] == 2  # stalesgd.training.checkpoint._format.FORMAT
  commit = subprocess.run(
    ["git", "-C", str(pathlib.Path(__file__).parent), "rev-parse", "HEAD"], capture_output=True, text=True
  ).stdout.strip()
  assert origin["stalesgd_commit"] is None if not commit else origin["stalesgd_commit"].startswith(commit)
  last_evaluation = evaluation_records(read_metrics(workdir))[-1]
  for field in ("test_accuracy", "test_error", "train_accuracy"):
    assert summary[field] == last_evaluation[field]


@pytest.mark.slow
def test_schedule_file_is_the_run_schedule(finished_run):
  config, workdir, summary = finished_run
  schedule = schedule_lib.Schedule.load(workdir / "schedule.npz")
  assert (schedule.protocol, schedule.learners, schedule.num_updates) == (
    config.protocol,
    config.learners,
    summary["updates"],
  )
  assert summary["sim_time"] == pytest.approx(float(schedule.update_time[-1]))
  assert summary["staleness_max"] == schedule.max_staleness
  assert summary["staleness_mean"] == pytest.approx(float(schedule.staleness.mean()))


@pytest.mark.slow
def test_metrics_records_match_the_schedule_block_by_block(finished_run):
  config, workdir, summary = finished_run
  schedule = schedule_lib.Schedule.load(workdir / "schedule.npz")
  per_epoch = updates_per_epoch(config, MOCK_EXAMPLES)
  records = read_metrics(workdir)
  steps = [record["step"] for record in records]
  assert steps == sorted(set(steps)) and steps[-1] == summary["updates"]
  previous = 0
  for record in records:  # log_every_updates=1: one record per block, covering the updates since the last
    assert set(TRAINING_FIELDS) <= set(record), record
    step = record["step"]
    assert np.isfinite(record["train_loss"]) and record["images_per_s"] > 0
    assert record["staleness_mean"] == pytest.approx(float(schedule.staleness[previous:step].mean()))
    assert record["staleness_max"] == int(schedule.staleness[previous:step].max())
    assert record["sim_time"] == pytest.approx(float(schedule.update_time[step - 1]))
    assert record["epoch"] == pytest.approx(step / per_epoch)
    previous = step
  if config.staleness_rule != "none":
    assert min(record["lr_scale"] for record in records) < 1.0  # the rule scaled stale gradients down


@pytest.mark.slow
def test_evaluations_every_half_epoch_and_at_the_end(finished_run):
  config, workdir, summary = finished_run
  per_epoch = updates_per_epoch(config, MOCK_EXAMPLES)
  evaluations = evaluation_records(read_metrics(workdir))
  assert len(evaluations) == 2
  assert evaluations[0]["step"] >= 0.5 * per_epoch and evaluations[-1]["step"] == summary["updates"]
  for record in evaluations:
    assert set(EVALUATION_FIELDS) <= set(record)
    assert 0.0 <= record["test_accuracy"] <= 1.0 and 0.0 <= record["train_accuracy"] <= 1.0
    assert record["test_error"] == pytest.approx(100.0 * (1.0 - record["test_accuracy"]))
    assert np.isfinite(record["test_loss"])


@pytest.mark.slow
def test_tensorboard_holds_the_jsonl_scalars(finished_run):
  _, workdir, _ = finished_run
  records = read_metrics(workdir)
  scalars = event_scalars(workdir)
  for field in TRAINING_FIELDS + EVALUATION_FIELDS:
    expected = [(record["step"], record[field]) for record in records if field in record]
    assert [step for step, _ in scalars[field]] == [step for step, _ in expected], field
    np.testing.assert_allclose(
      [value for _, value in scalars[field]], [value for _, value in expected], rtol=1e-6, err_msg=field
    )  # TensorBoard stores float32


@pytest.mark.slow
def test_plots_are_png_images(finished_run):
  _, workdir, _ = finished_run
  for name in ("curves.png", "staleness.png"):
    path = pathlib.Path(workdir) / name
    assert path.read_bytes()[:8] == PNG_SIGNATURE, name
    image = matplotlib.image.imread(path)
    assert image.ndim == 3 and min(image.shape[:2]) >= 100, (name, image.shape)
    assert np.ptp(image[..., :3]) > 0, f"{name} is blank"


@pytest.mark.slow
def test_final_checkpoint_is_at_the_last_update(finished_run):
  _, workdir, summary = finished_run
  checkpointer = Checkpointer(pathlib.Path(workdir) / "checkpoints")
  try:
    assert checkpointer.latest_step() == summary["updates"]
  finally:
    checkpointer.close()


@pytest.mark.slow
def test_every_file_a_run_writes_is_listed_by_the_run_directory(tmp_path):
  """stalesgd.records._run_directory is the one list of a run directory's files: a finished run holds nothing else."""
  workdir = tmp_path / "run"
  train_and_evaluate(tiny_config("hardsync", num_epochs=0.25), str(workdir))
  listed = set(run_directory.RUN_FILES)
  for path in workdir.iterdir():
    assert path.name in listed or any(fnmatch.fnmatch(path.name, name) for name in listed), path.name
  for name in (run_directory.CONFIG, run_directory.DATASET, run_directory.SUMMARY, run_directory.CHECKPOINTS):
    assert (workdir / name).exists(), name
