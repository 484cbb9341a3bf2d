"""The training stack: one run from a config to a run directory (flax, orbax, tfds, ...).

* `default_config`, `validate_config` (`._run_config`): every field of a run,
  its default and its checks; `updates_per_epoch`, `contributions_per_update`.
* `build_run`, `train_and_evaluate` (`._loop`): the config turned into objects,
  and the training loop (checkpoints, preemption, metrics, summary).
* `ParameterServerRunner`, `DecentralizedRunner`, `make_runner` (`._runners`):
  the engine or DC-S3GD behind one interface.
* `build_optimizer` (`._optimizer`): the Caffe SGD solver with the staleness
  rule and delay compensation of the config.
* `Evaluator` (`._evaluator`), `PendingMetrics` (`._pending_metrics`),
  `check_same_run` (`._workdir`), `provenance` (`._provenance`).
* `stalesgd.training.checkpoint`: `Checkpointer`, `PreemptionGuard`.
"""

from stalesgd.training._evaluator import Evaluator
from stalesgd.training._loop import build_run
from stalesgd.training._loop import train_and_evaluate
from stalesgd.training._optimizer import build_optimizer
from stalesgd.training._pending_metrics import PendingMetrics
from stalesgd.training._pending_metrics import TrainingDiverged
from stalesgd.training._provenance import provenance
from stalesgd.training._run_config import contributions_per_update
from stalesgd.training._run_config import default_config
from stalesgd.training._run_config import updates_per_epoch
from stalesgd.training._run_config import validate_config
from stalesgd.training._runners import DecentralizedRunner
from stalesgd.training._runners import ParameterServerRunner
from stalesgd.training._runners import make_runner
from stalesgd.training._runners import run_label
from stalesgd.training._workdir import check_same_run
from stalesgd.training._workdir import config_changes

__all__ = [
  "DecentralizedRunner",
  "Evaluator",
  "ParameterServerRunner",
  "PendingMetrics",
  "TrainingDiverged",
  "build_optimizer",
  "build_run",
  "check_same_run",
  "config_changes",
  "contributions_per_update",
  "default_config",
  "make_runner",
  "provenance",
  "run_label",
  "train_and_evaluate",
  "updates_per_epoch",
  "validate_config",
]
