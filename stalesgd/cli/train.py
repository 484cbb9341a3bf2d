r"""Runs one training job: ``stalesgd-train --config=CONFIG[:ARG] --workdir=DIR``.

The same program is ``python -m stalesgd.cli.train``. The only entry point
that defines the run's flags (flax-examples style):

* ``--config``: a config whose ``get_config(arg)`` returns the run's
  `ml_collections.ConfigDict`: the name of a packaged config
  (`stalesgd.configs`, e.g. ``--config=rudra_cifar10:quick``; ``.py`` optional)
  or the path of a config file of your own (e.g. ``--config=my_config.py:ARG``);
  an existing file wins over a name, and an unknown name is refused with the
  list of names. Any field can be overridden on the
  command line, e.g. ``--config.learners=30 --config.protocol=async``;
* ``--workdir``: metrics, checkpoints, plots and the summary; a job restarted
  with the same workdir resumes from its latest checkpoint;
* ``--config_help``: every config field by section, with its value, the values it
  takes and what it does (with ``--config``, that config's values), then exits;
* on a CPU, unless ``JAX_NUM_CPU_DEVICES`` is set, a single-process run
  emulates its learners on the number of host devices it runs fastest on
  (`stalesgd.training._device_layout`: about 4 learners per device, at most 8;
  results do not depend on it); processes of a multi-process run get 8 each;
* ``--compilation_cache_dir``: JAX's persistent compilation cache
  (`stalesgd.cluster._compilation_cache`; on by default, '' turns it off);
* the multi-host flags ``--coordinator_address``, ``--num_processes``,
  ``--process_id``, ``--initialization_timeout``; without them the cluster is
  detected from SLURM / Kubernetes / MPI environment variables, and a single
  host needs none (see launch/README.md).

Examples (a packaged config by name; a config file of your own by its path)::

  stalesgd-train --config=rudra_cifar10:quick \
      --config.protocol=softsync --config.n=4 --workdir=runs/rudra_quick
  stalesgd-train --config=path/to/my_config.py:ARG --workdir=runs/mine
  stalesgd-train --config=rudra_cifar10:quick --config_help   # every field and its value
"""

from __future__ import annotations

import os
import sys

# Whether the user chose the number of host CPU devices; if not, `main` picks the
# fastest for the run (`stalesgd.training._device_layout`) before JAX starts.
_DEVICES_CHOSEN = "JAX_NUM_CPU_DEVICES" in os.environ

from stalesgd._extras import require_training_stack

require_training_stack("stalesgd-train")  # before the first import of the training stack

import jax
from absl import app, flags, logging

from stalesgd import configs
from stalesgd.cli import _program as program
from stalesgd.cli import config_flag
from stalesgd.cluster import _compilation_cache as compilation_cache
from stalesgd.cluster import _distributed as distributed
from stalesgd.records import _paths as paths
from stalesgd.training import _device_layout as device_layout
from stalesgd.training._config_checks import validate_config
from stalesgd.training._run_config import describe_config

_CONFIG = config_flag.define_config_flag(
  "config",
  "A packaged config's name (one of " + ", ".join(configs.names()) + ") or a config "
  "file's path, optionally followed by :ARG, the argument of its get_config.",
)
_WORKDIR = flags.DEFINE_string(
  "workdir",
  None,
  "Directory for metrics, checkpoints, plots and the summary: a local path, or gs://bucket/path with the gcs "
  "extra installed. A multi-process run needs one that every process reaches (a shared file system or gs://).",
)
_COORDINATOR_ADDRESS = flags.DEFINE_string(
  "coordinator_address", None, "host:port of process 0 in a multi-process run."
)
_NUM_PROCESSES = flags.DEFINE_integer("num_processes", None, "Number of processes in a multi-process run.")
_PROCESS_ID = flags.DEFINE_integer("process_id", None, "Index of this process, in [0, num_processes).")
_INITIALIZATION_TIMEOUT = flags.DEFINE_integer(
  "initialization_timeout", 600, "Seconds to wait for every process to join before failing."
)
_HEARTBEAT_TIMEOUT = flags.DEFINE_integer(
  "heartbeat_timeout",
  distributed.DEFAULT_HEARTBEAT_TIMEOUT,
  "Seconds without a heartbeat after which a peer process is declared dead and every survivor exits with an "
  "error instead of waiting in a collective (multi-process runs).",
)
_DISTRIBUTED = flags.DEFINE_enum(
  "distributed",
  "auto",
  distributed.DISTRIBUTED_MODES,
  "Multi-process start-up: 'auto' detects SLURM, Open MPI, a Kubernetes Indexed Job and other MPIs, then JAX's "
  "own detection where a TPU cluster's variables are set; 'jax' uses JAX's detection only; 'off' runs one "
  "process whatever the environment says.",
)
_COMPILATION_CACHE_DIR = compilation_cache.define_flag()
_CONFIG_HELP = flags.DEFINE_bool(
  "config_help",
  False,
  "Print every config field by section (its --config.<field> flag, value, allowed values and doc) and exit; "
  "with --config, that config's values, else the defaults.",
)


def main(argv):
  if len(argv) > 1:
    raise app.UsageError(f"unexpected arguments: {argv[1:]}")
  if _CONFIG_HELP.value:
    print(describe_config(_CONFIG.value))
    return
  for flag in (_CONFIG, _WORKDIR):  # required, except with --config_help
    if flag.value is None:
      raise app.UsageError(f"--{flag.name} is required (e.g. --config=demo --workdir=runs/demo)")
  try:  # before JAX starts, the data loads or the step compiles
    paths.check_workdir(_WORKDIR.value)
    validate_config(_CONFIG.value, num_devices=None)
  except ValueError as error:
    raise app.UsageError(str(error)) from error
  if not flags.FLAGS["verbosity"].present:
    # orbax logs every checkpoint step at INFO; the run's own progress goes to stdout.
    logging.set_verbosity(logging.WARNING)
  compilation_cache.enable_compilation_cache(_COMPILATION_CACHE_DIR.value)
  if not _DEVICES_CHOSEN:
    # One process: the layout the engine runs fastest on (ignored by GPU/TPU backends). Several
    # processes keep 8 each, as launch/local.sh and the cluster launchers expect.
    single = _DISTRIBUTED.value == "off" or (
      _DISTRIBUTED.value == "auto"
      and (_NUM_PROCESSES.value or 1) == 1
      and _COORDINATOR_ADDRESS.value is None
      and distributed.detect_environment() is None
    )
    jax.config.update("jax_num_cpu_devices", device_layout.cpu_device_count(_CONFIG.value) if single else 8)
  distributed.initialize(
    coordinator_address=_COORDINATOR_ADDRESS.value,
    num_processes=_NUM_PROCESSES.value,
    process_id=_PROCESS_ID.value,
    initialization_timeout=_INITIALIZATION_TIMEOUT.value,
    heartbeat_timeout=_HEARTBEAT_TIMEOUT.value,
    mode=_DISTRIBUTED.value,
  )
  from stalesgd.training import _loop as train  # after jax.distributed is initialized: importing it touches no devices,

  # but keeping all JAX work after initialize() is JAX's rule.
  summary = train.train_and_evaluate(_CONFIG.value, _WORKDIR.value)
  logging.info("summary: %s", summary)
  if summary["preempted"]:
    print(
      f"preempted at update {summary['updates']}: checkpointed; run the same command to resume "
      f"(exit status {train.PREEMPTED_EXIT_STATUS})",
      flush=True,
    )
    raise SystemExit(train.PREEMPTED_EXIT_STATUS)


def run() -> None:
  """The ``stalesgd-train`` console script: parses ``sys.argv`` and runs `main`."""
  program.run_main(main, sys.modules[__name__])


if __name__ == "__main__":
  run()
