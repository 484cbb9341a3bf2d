"""The training stack: one run from a config to a run directory (flax, orbax, tfds, ...).

* The config: `default_config` (every field at its default, declared once per section), `validate_config` (the
  fields' checks, before anything expensive), `describe_config` (every field with its value, allowed values and
  doc: ``stalesgd-train --config_help``).
* What a config implies, each defined once: `contributions_per_update` (c), `examples_per_update` (c mu H),
  `updates_per_epoch`, `run_length` (updates of ``num_epochs``), `simulate_schedule` (the simulated cluster's
  `stalesgd.schedule.Schedule`), `is_decentralized`, and the run's name, `run_label`.
* `build_run`: the one place that turns the config into objects (data, model, optimizer, schedule, DC-S3GD
  settings, runner); `train_and_evaluate`: the training loop (checkpoints, preemption, metrics, summary), which
  raises `TrainingDiverged` for a run that diverged and whose preempted program exits with
  `PREEMPTED_EXIT_STATUS`.
* `Runner`, `make_runner`: the engine or DC-S3GD behind one typed interface; runners take the objects
  `build_run` made, never the config.
* `build_optimizer`: the Caffe SGD solver with the staleness rule and delay compensation of the config.
* `check_same_run`: whether a config may resume the run a workdir holds.
* `stalesgd.training.checkpoint`: `Checkpointer`, `PreemptionGuard`.
"""

from stalesgd.training._build_run import build_run
from stalesgd.training._config_checks import validate_config
from stalesgd.training._config_readers import (
  contributions_per_update,
  examples_per_update,
  is_decentralized,
  run_label,
  run_length,
  simulate_schedule,
  updates_per_epoch,
)
from stalesgd.training._loop import PREEMPTED_EXIT_STATUS, train_and_evaluate
from stalesgd.training._optimizer import build_optimizer
from stalesgd.training._pending_metrics import TrainingDiverged
from stalesgd.training._run_config import default_config, describe_config
from stalesgd.training._runners import Runner, make_runner
from stalesgd.training._workdir import check_same_run

__all__ = [
  "PREEMPTED_EXIT_STATUS",
  "Runner",
  "TrainingDiverged",
  "build_optimizer",
  "build_run",
  "check_same_run",
  "contributions_per_update",
  "default_config",
  "describe_config",
  "examples_per_update",
  "is_decentralized",
  "make_runner",
  "run_label",
  "run_length",
  "simulate_schedule",
  "train_and_evaluate",
  "updates_per_epoch",
  "validate_config",
]
