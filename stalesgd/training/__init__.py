"""The training stack: one run from a config to a run directory (flax, orbax, tfds, ...).

* `default_config` (`._run_config`), `validate_config` (`._config_checks`): every field of a run,
  its default and its checks; the quantities derived from it, each defined once:
  `contributions_per_update` (c), `examples_per_update` (c mu), `updates_per_epoch`,
  `is_decentralized`, and the run's name, `run_label`.
* `build_run`, `train_and_evaluate` (`._loop`): the one place that turns the config
  into objects (data, model, optimizer, schedule, DC-S3GD settings, runner), and
  the training loop (checkpoints, preemption, metrics, summary).
* `ParameterServerRunner`, `DecentralizedRunner`, `make_runner` (`._runners`):
  the engine or DC-S3GD behind one typed interface, `Runner`, each reporting a block
  with its own metrics type (`BlockMetrics` of the engine, `StepMetrics`); they take
  those objects, never the config.
* `build_optimizer` (`._optimizer`): the Caffe SGD solver with the staleness
  rule and delay compensation of the config.
* `Evaluator` (`._evaluator`), `PendingMetrics` (`._pending_metrics`),
  `check_same_run` (`._workdir`), `provenance` (`._provenance`).
* `stalesgd.training.checkpoint`: `Checkpointer`, `PreemptionGuard`.
"""

from stalesgd.training._build_run import build_run
from stalesgd.training._config_checks import validate_config
from stalesgd.training._config_readers import (
  contributions_per_update,
  examples_per_update,
  is_decentralized,
  run_label,
  updates_per_epoch,
)
from stalesgd.training._loop import PREEMPTED_EXIT_STATUS, train_and_evaluate
from stalesgd.training._optimizer import build_optimizer
from stalesgd.training._pending_metrics import TrainingDiverged
from stalesgd.training._run_config import default_config
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
  "examples_per_update",
  "is_decentralized",
  "make_runner",
  "run_label",
  "train_and_evaluate",
  "updates_per_epoch",
  "validate_config",
]
