"""Impossible or inconsistent configs stop `train_and_evaluate` before anything is compiled.

Each bad config must raise ValueError naming the field (``config.<field>=<value>``)
and what is allowed. "Before compiling" is observed, not assumed: JAX reports
every backend compilation to `jax.monitoring` listeners (a positive control
checks that the listener sees one), and the stages after validation (reading
data, building the model, the runner, the evaluator) are replaced by functions
that fail the test if they are reached.
"""

from __future__ import annotations

import json
import time

import ml_collections
import pytest

from stalesgd.data import DatasetNotPreparedError
from stalesgd.training import _build_run as build_lib
from stalesgd.training import _loop as train_lib
from stalesgd.training._build_run import build_run
from stalesgd.training._config_readers import dc_lambda
from stalesgd.training._loop import train_and_evaluate
from stalesgd.training._workdir import (
  FIELDS_OF_THE_PER_MODE_DEFAULTS,
  RESUMABLE_FIELDS,
  check_same_run,
  config_changes,
)
from tests.helpers.train_helpers import tiny_config

# Reading an unprepared tfds directory must fail at once; a download attempt
# (which the test conftest's socket guard would also stop) retries for minutes.
NOT_PREPARED_SECONDS = 20.0

BAD_CONFIGS = {
  "n_above_learners": (dict(protocol="softsync", n=9), r"config\.n=9; allowed: an integer >= 1 and <= 8"),
  "n_below_one": (dict(protocol="softsync", n=0), r"config\.n=0; allowed: an integer >= 1"),
  "drop_stale_n_above_learners": (dict(protocol="drop_stale", n=12), r"config\.n=12; allowed: .*<= 8"),
  "batch_per_learner_zero": (dict(batch_per_learner=0), r"config\.batch_per_learner=0; allowed: an integer >= 1"),
  "learners_zero": (dict(learners=0), r"config\.learners=0; allowed: an integer >= 1"),
  "unknown_protocol": (
    dict(protocol="gossip"),
    r"config\.protocol='gossip'; allowed: one of \(.*'hardsync'.*'dcs3gd'",
  ),
  "unknown_staleness_rule": (
    dict(staleness_rule="sqrt"),
    r"config\.staleness_rule='sqrt'; allowed: one of \(.*'inverse'.*'inverse_mean'",
  ),
  "unknown_delay_compensation": (
    dict(delay_compensation="taylor"),
    r"config\.delay_compensation='taylor'; allowed: one of \(.*'adaptive'",
  ),
  "backup_workers_equal_learners": (
    dict(protocol="backup", backup_workers=8),
    r"config\.backup_workers=8; allowed: an integer >= 0 and <= 7",
  ),
  "decentral_learners_more_than_devices": (
    dict(protocol="dcs3gd", learners=16),
    r"config\.learners=16; allowed: .*one learner per device.* 8",
  ),
  "decentral_staleness_rule": (
    dict(protocol="s3gd", staleness_rule="inverse"),
    r"config\.staleness_rule='inverse'; allowed: 'none'",
  ),
  "npz_without_data_dir": (dict(data_source="npz"), r"config\.data_dir=None; allowed: the directory"),
  "unknown_data_source": (dict(data_source="s3"), r"config\.data_source='s3'; allowed: one of \(.*'tfds'"),
  "unknown_model": (dict(model="resnet7"), r"config\.model='resnet7'; allowed: one of \(.*'small_cnn'"),
  "threshold_rule_without_threshold": (
    dict(protocol="async", staleness_rule="threshold"),
    r"config\.staleness_threshold=None; allowed",
  ),
  "negative_learning_rate": (
    dict(learning_rate=-0.1),
    r"config\.learning_rate=-0\.1; allowed: a finite number > 0",
  ),
  "bad_timing": (
    dict(**{"timing.jitter": "cauchy"}),
    r"config\.timing\.jitter='cauchy'; allowed: one of \(.*'lognormal'",
  ),
  "per_learner_mean_square_without_dc_a": (
    dict(protocol="async", delay_compensation="constant", dc_per_learner_mean_square=True),
    r"config\.dc_per_learner_mean_square=True; allowed: False unless delay_compensation='adaptive'",
  ),
  "mean_square_bias_correction_without_dc_a": (
    dict(protocol="async", delay_compensation="constant", dc_mean_square_bias_correction=True),
    r"config\.dc_mean_square_bias_correction=True; allowed: False unless "
    r"delay_compensation='adaptive'",
  ),
  "mean_square_bias_correction_with_dcs3gd": (
    dict(protocol="dcs3gd", delay_compensation="adaptive", dc_mean_square_bias_correction=True),
    r"config\.dc_mean_square_bias_correction=True; allowed: False for protocol 'dcs3gd'",
  ),
  "per_learner_mean_square_with_dcs3gd": (
    dict(protocol="dcs3gd", delay_compensation="adaptive", dc_per_learner_mean_square=True),
    r"config\.dc_per_learner_mean_square=True; allowed: False for protocol 'dcs3gd'",
  ),
  "unknown_weight_decay_placement": (
    dict(weight_decay_placement="before_dc"),
    r"config\.weight_decay_placement='before_dc'; allowed: one of "
    r"\('modulated', 'unmodulated'\)",
  ),
  "multiplier_set_without_multipliers": (
    dict(multiplier_set="caffe"),
    r"config\.multiplier_set='caffe'; allowed: None unless model_multipliers=True",
  ),
  "warmup_without_start_rate": (
    dict(warmup_epochs=0.5),
    r"config\.warmup_learning_rate=None; allowed: a number >= 0 with warmup_epochs=0\.5",
  ),
  "warmup_past_the_first_decay": (
    dict(warmup_epochs=0.5, warmup_learning_rate=0.01, lr_decay_epochs=(0.25,)),
    r"config\.warmup_epochs=0\.5; allowed: at most the first decay epoch, 0\.25",
  ),
}


def _refuse(stage):
  def reached(*args, **kwargs):
    raise AssertionError(f"train_and_evaluate reached {stage} with an invalid config")

  return reached


@pytest.fixture
def later_stages_refused(monkeypatch):
  """Reading data, building the model, the runner and the evaluator fail the test if reached."""
  monkeypatch.setattr(build_lib.data_lib, "load_dataset", _refuse("load_dataset"))
  monkeypatch.setattr(build_lib.models, "get_model", _refuse("get_model"))
  monkeypatch.setattr(build_lib, "make_runner", _refuse("make_runner"))
  monkeypatch.setattr(train_lib, "Evaluator", _refuse("Evaluator"))


@pytest.mark.parametrize("case", list(BAD_CONFIGS))
def test_bad_config_is_rejected_before_reading_data_or_compiling(case, tmp_path, compilations, later_stages_refused):
  overrides, message = BAD_CONFIGS[case]
  with pytest.raises(ValueError, match=message):
    train_and_evaluate(tiny_config("hardsync", **overrides), str(tmp_path / "run"))
  assert compilations == []
  assert not (tmp_path / "run").exists()  # nothing written either


def test_unprepared_tfds_dataset_is_reported_without_downloading(tmp_path, compilations, monkeypatch):
  monkeypatch.setattr(build_lib.models, "get_model", _refuse("get_model"))
  monkeypatch.setattr(build_lib, "make_runner", _refuse("make_runner"))
  data_dir = tmp_path / "empty_tfds_dir"
  data_dir.mkdir()
  config = tiny_config("hardsync", dataset="cifar10", data_source="tfds", data_dir=str(data_dir), model="cifar10_full")
  config.model_options = ml_collections.ConfigDict()
  started = time.monotonic()
  with pytest.raises(DatasetNotPreparedError, match=r"dataset 'cifar10' is not prepared in data_dir=") as error:
    train_and_evaluate(config, str(tmp_path / "run"))
  assert time.monotonic() - started < NOT_PREPARED_SECONDS
  assert isinstance(error.value, ValueError)
  assert "download_and_prepare(file_format='array_record')" in str(error.value)
  assert list(data_dir.iterdir()) == []  # tfds wrote nothing: no download was started
  assert compilations == []


def test_a_workdir_of_another_config_is_refused_before_anything_runs(tmp_path, compilations, later_stages_refused):
  workdir = tmp_path / "run"
  workdir.mkdir()
  (workdir / "config.json").write_text(tiny_config("hardsync").to_json())
  with pytest.raises(ValueError, match=r"holds a run of another config \(learning_rate: .* -> 0\.5\)"):
    train_and_evaluate(tiny_config("hardsync", learning_rate=0.5), str(workdir))
  assert compilations == []


def test_only_logging_and_checkpoint_cadences_may_change_on_resume():
  # Written out here, not read from the declarations: a field marked resumable by mistake fails this test.
  assert set(RESUMABLE_FIELDS) == {
    "log_every_updates",
    "checkpoint_every_seconds",
    "keep_checkpoints",
    "eval_batch_size",
    "data_workers",
  }
  saved = json.loads(tiny_config("hardsync").to_json())
  cadences = {field: 1 for field in RESUMABLE_FIELDS if field != "eval_batch_size"}
  assert config_changes(saved, tiny_config("hardsync", eval_batch_size=64, **cadences)) == []
  assert config_changes(saved, tiny_config("hardsync", seed=3)) == ["seed: 0 -> 3"]


def test_a_field_added_after_the_run_was_saved_counts_as_its_default():
  """A run saved before a field existed (config.json without it) resumes at that field's default only."""
  saved = json.loads(tiny_config("hardsync").to_json())
  del saved["dc_mean_square_bias_correction"]
  assert config_changes(saved, tiny_config("hardsync")) == []
  assert config_changes(
    saved, tiny_config("hardsync", delay_compensation="adaptive", dc_mean_square_bias_correction=True)
  ) == ["dc_mean_square_bias_correction: False -> True", "delay_compensation: 'none' -> 'adaptive'"]


def _cifar10_full_config(**fields):
  return tiny_config("hardsync", model="cifar10_full", model_multipliers=True, **fields)


def test_a_cifar10_full_run_saved_before_multiplier_sets_resumes_only_with_caffes():
  """Runs saved before config.multiplier_set ran Caffe's prototxt multipliers: under today's default (Rudra's
  release) they are refused naming the change, with multiplier_set='caffe' they resume as they began."""
  saved = json.loads(_cifar10_full_config().to_json())
  del saved["multiplier_set"]
  assert config_changes(saved, _cifar10_full_config()) == ["multiplier_set: 'caffe' -> None"]
  assert config_changes(saved, _cifar10_full_config(multiplier_set="rudra")) == ["multiplier_set: 'caffe' -> 'rudra'"]
  assert config_changes(saved, _cifar10_full_config(multiplier_set="caffe")) == []
  # A run saved with the field resumes under the same value; other models' old runs never had two sets.
  assert config_changes(json.loads(_cifar10_full_config().to_json()), _cifar10_full_config()) == []
  other = json.loads(tiny_config("hardsync", model_multipliers=True).to_json())
  del other["multiplier_set"]
  assert config_changes(other, tiny_config("hardsync", model_multipliers=True)) == []


def test_an_old_cifar10_full_workdir_is_refused_with_the_way_to_resume_it(tmp_path, compilations, later_stages_refused):
  workdir = tmp_path / "run"
  workdir.mkdir()
  saved = json.loads(_cifar10_full_config().to_json())
  del saved["multiplier_set"]
  (workdir / "config.json").write_text(json.dumps(saved))
  with pytest.raises(ValueError, match=r"multiplier_set: 'caffe' -> None.*--config\.multiplier_set=caffe resumes"):
    train_and_evaluate(_cifar10_full_config(), str(workdir))
  assert compilations == []


def _saved_before_per_mode_lambda_0(config: ml_collections.ConfigDict) -> dict:
  """``config`` as a run started before the per-mode lambda_0 defaults saved it: without the fields that came
  with them (and without dc_lambda_default, added after)."""
  saved = json.loads(config.to_json())
  for field in (*FIELDS_OF_THE_PER_MODE_DEFAULTS, "dc_lambda_default"):
    del saved[field]
  return saved


@pytest.mark.parametrize("mode, now", [("layerwise", 0.2), ("adaptive", 2.0)])
def test_a_run_saved_before_per_mode_lambda_0_resumes_only_with_0_04(mode, now):
  """An adaptive or layerwise run saved before dc_lambda left at 0.04 meant the mode's own lambda_0 ran 0.04:
  under today's default it is refused naming the change; with dc_lambda_default='dc_asgd' it resumes at 0.04."""
  old = tiny_config("dcs3gd", delay_compensation=mode, dc_lambda=0.04)
  saved = _saved_before_per_mode_lambda_0(old)
  assert dc_lambda(old) == now  # what it would silently resume under
  assert config_changes(saved, old) == ["dc_lambda_default: 'dc_asgd' -> 'per_mode'"]
  as_it_began = tiny_config("dcs3gd", delay_compensation=mode, dc_lambda=0.04, dc_lambda_default="dc_asgd")
  assert config_changes(saved, as_it_began) == []
  assert dc_lambda(as_it_began) == 0.04


def test_runs_that_the_per_mode_lambda_0_did_not_change_resume_as_they_are():
  """constant (0.04 before and now), a lambda_0 given, no correction, or a run saved after the per-mode defaults
  (config.json with their fields, without dc_lambda_default): nothing to refuse."""
  for config in (
    tiny_config("dcs3gd", delay_compensation="constant", dc_lambda=0.04),
    tiny_config("dcs3gd", delay_compensation="layerwise", dc_lambda=0.2),
    tiny_config("hardsync"),
  ):
    assert config_changes(_saved_before_per_mode_lambda_0(config), config) == []
  later = tiny_config("dcs3gd", delay_compensation="layerwise", dc_lambda=0.04)
  saved = json.loads(later.to_json())
  del saved["dc_lambda_default"]
  assert config_changes(saved, later) == []


def test_an_old_layerwise_workdir_is_refused_with_the_way_to_resume_it(tmp_path, compilations, later_stages_refused):
  """A hand-built run directory of a layerwise run from before the per-mode defaults: refused before anything runs,
  naming the field, the change (0.04, now 0.2) and the flag; with the flag the directory is accepted."""
  workdir = tmp_path / "run"
  workdir.mkdir()
  saved = _saved_before_per_mode_lambda_0(tiny_config("dcs3gd", delay_compensation="layerwise", dc_lambda=0.04))
  (workdir / "config.json").write_text(json.dumps(saved))
  with pytest.raises(
    ValueError,
    match=r"dc_lambda_default: 'dc_asgd' -> 'per_mode'.*ran lambda_0 = 0\.04 \(now adaptive 2\.0, layerwise 0\.2\)"
    r".*--config\.dc_lambda_default=dc_asgd resumes it as it began",
  ):
    train_and_evaluate(tiny_config("dcs3gd", delay_compensation="layerwise", dc_lambda=0.04), str(workdir))
  assert compilations == []
  check_same_run(
    tiny_config("dcs3gd", delay_compensation="layerwise", dc_lambda=0.04, dc_lambda_default="dc_asgd"), workdir
  )


def test_a_model_without_the_multiplier_set_is_refused_naming_the_field():
  config = tiny_config("hardsync", model_multipliers=True, multiplier_set="rudra")
  with pytest.raises(
    ValueError, match=r"config\.multiplier_set='rudra': model 'mlp' has no multiplier set 'rudra'; allowed: none"
  ):
    build_run(config)
