"""`train_and_evaluate(config, workdir)`: the one training loop, for every protocol.

Reads top to bottom (big_vision style): config checks -> mesh -> `build_run`
(the one place that turns the config into objects: input, model, optimizer,
schedule of the simulated cluster, DC-S3GD settings, and the runner: the exact
emulator for parameter-server protocols, real collectives for decentralized
ones) -> checkpoint restore -> loop with "is it time?" checks for logs,
evaluations and checkpoints -> final evaluation, plots and summary.

Evaluations come every ``config.eval_every_epochs`` epochs of applied examples, each after exactly the first
update whose clock reaches its point (u = ceil(k x eval_every_epochs x updates per epoch) without dynamic local
updates; `stalesgd.training._config_readers.evaluation_updates`), and after the last update. The runner's
blocks start at those updates, so no block crosses an evaluation. Logs and checkpoints come at the first block
end at or past their point.

Everything the run writes into ``workdir`` (process 0 only) is listed, with what it holds, in
`stalesgd.records._run_directory`, the one owner of those names; ``summary.json`` and the record of the sessions
that computed the run are `stalesgd.training._run_summary`'s.

SIGTERM saves a checkpoint and returns a summary with ``preempted`` true (the
programs then exit with `PREEMPTED_EXIT_STATUS`, 75). A non-finite
loss stops the run with `TrainingDiverged` (a `FloatingPointError`) naming the update; checkpoints are
only written after the losses up to them were checked, so the last one is good.
"""

from __future__ import annotations

import dataclasses
import io
import json
import math
import os
import time
from collections.abc import Sequence
from typing import Any

import jax
import ml_collections
import numpy as np

from stalesgd.parallel import _sharding as sharding_lib
from stalesgd.records import _run_directory as run_directory
from stalesgd.records._metrics import MetricWriter, read_jsonl
from stalesgd.records._paths import workdir_path, write_whole
from stalesgd.reports import _plots as plots
from stalesgd.reports._progress import ProgressReporter
from stalesgd.training import _device_layout as device_layout
from stalesgd.training._build_run import build_run
from stalesgd.training._config_checks import validate_config
from stalesgd.training._config_readers import applied_examples, examples_per_update
from stalesgd.training._evaluator import Evaluator
from stalesgd.training._pending_metrics import (  # noqa: F401  (TrainingDiverged: raised by the loop)
  PendingMetrics,
  TrainingDiverged,
)
from stalesgd.training._run_config import flatten_config
from stalesgd.training._run_summary import (
  SESSIONS_KEY,
  run_summary,
  session_record,
  warn_if_code_changed,
  warn_if_cpu_changed,
)
from stalesgd.training._workdir import check_same_data, check_same_run, write_config
from stalesgd.training.checkpoint import Checkpointer, PreemptionGuard

PREEMPTED_EXIT_STATUS = 75
"""The exit status of a program whose run was preempted (SIGTERM): checkpointed, not finished.

75 is EX_TEMPFAIL of sysexits.h, "try again later": distinct from success (0),
so a scheduler can tell "preempted, rerun to resume" from "finished" (the
Kubernetes example's pod-failure policy and launch/slurm.sbatch's requeue read
it), and from a failure (1, or 128 + a signal).
"""
PENDING_METRICS_KEY = "pending_metrics"  # checkpoint metadata: per-update metrics not yet in a record


@dataclasses.dataclass
class _LoopPosition:
  """What the training loop changes as it runs, in one place: a checkpoint saves it, the summary reports it.

  Attributes:
    state: the runner's state (weights, optimizer state, ring buffer or in-flight updates).
    block: the next block to run.
    updates: updates applied (the first update of ``block``).
    evaluation_seconds, checkpoint_seconds: this session's wall time in evaluations and saves.
  """

  state: Any
  block: int
  updates: int
  evaluation_seconds: float = 0.0
  checkpoint_seconds: float = 0.0


def _save_checkpoint(
  position: _LoopPosition,
  *,
  force: bool,
  checkpointer: Checkpointer,
  writer: MetricWriter,
  pending: PendingMetrics,
  wall_time: float,
  seed: int,
  sessions: list[dict[str, Any]],
) -> None:
  """Saves ``position`` when due (or ``force``), after the records up to it are on disk."""
  if force or checkpointer.should_save(position.updates):
    began = time.monotonic()
    metadata = {
      "update": position.updates,
      "wall_time": wall_time,
      "seed": seed,
      SESSIONS_KEY: sessions,
      PENDING_METRICS_KEY: pending.snapshot(),
    }  # checks the losses before the weights are kept
    writer.flush()  # every record up to this checkpoint survives a SIGKILL (TensorBoard buffers ~10 s)
    checkpointer.save(position.updates, position.state, metadata, force=force)
    position.checkpoint_seconds += time.monotonic() - began


def _next_evaluation(evaluation_updates: np.ndarray, updates: int) -> int:
  """The first of the run's evaluation updates strictly after ``updates`` (past the run's end when none is)."""
  index = int(np.searchsorted(evaluation_updates, updates, side="right"))
  return int(evaluation_updates[index]) if index < evaluation_updates.shape[0] else np.iinfo(np.int64).max


def _next_point(value: float, interval: float) -> float:
  """The first point of the grid {k * interval, k = 1, 2, ...} strictly after ``value``."""
  return (math.floor(value / interval + 1e-9) + 1) * interval


def train_and_evaluate(
  config: ml_collections.ConfigDict, workdir: str, *, hparams_first: Sequence[str] = ()
) -> dict[str, Any]:
  """Trains and evaluates one run; returns its summary (also written to ``summary.json``).

  Args:
    config: the run's config (`stalesgd.training.default_config` and the configs in
      `stalesgd.configs`).
    workdir: where metrics, checkpoints, plots and the summary go; a run
      restarted with the same workdir resumes from its latest checkpoint.
    hparams_first: config fields (flattened, e.g. ``"timing.jitter"``) to
      show first in TensorBoard's HParams table, e.g. those a study varies.

  Returns:
    The summary: final test accuracy and error, simulated and wall-clock time,
    images/s, staleness statistics, the weights' digest, and ``preempted``.
  """
  # SIGTERM is caught from the start, so a notice that arrives while the data
  # loads or the step compiles still ends in a checkpoint and a preempted summary.
  with PreemptionGuard() as guard:
    return _train_and_evaluate(config, workdir, guard, hparams_first)


def _train_and_evaluate(
  config: ml_collections.ConfigDict, workdir: str, guard: PreemptionGuard, hparams_first: Sequence[str]
) -> dict[str, Any]:
  """`train_and_evaluate` with its preemption guard active."""
  entered = time.monotonic()
  # ----------------------------------------------------------------- checks and mesh
  workdir = workdir_path(workdir, field="workdir")
  mesh = sharding_lib.learner_mesh()
  validate_config(config, num_devices=mesh.size)
  mesh = device_layout.runner_mesh(config, mesh)  # the same weights on fewer devices, when more would idle
  check_same_run(config, workdir)
  primary = jax.process_index() == 0
  if primary:
    workdir.mkdir(parents=True, exist_ok=True)
    write_config(config, workdir)

  # ----------------------------------------------------------------- input, model, optimizer, schedule, runner
  run = build_run(config, mesh)
  dataset, model, params, schedule, runner, label = (
    run.dataset,
    run.model,
    run.params,
    run.schedule,
    run.runner,
    run.label,
  )
  per_epoch, total_updates = run.updates_per_epoch, schedule.num_updates
  description = dataset.description()
  check_same_data(config, description, workdir)  # a resume on other data is refused, as one of another config
  if primary:  # a study reads a diverged run's chance-level error here
    write_whole(workdir / run_directory.DATASET, json.dumps(description, indent=2))
  if primary and not (workdir / run_directory.SCHEDULE).exists():
    schedule_file = io.BytesIO()
    schedule.save(schedule_file)
    write_whole(workdir / run_directory.SCHEDULE, schedule_file.getvalue())
  applied = applied_examples(schedule, config.batch_per_learner)
  # Under dynamic local updates an update's examples vary (mu H_m per contribution): the bar shows no images/s,
  # the records give it from the examples applied.
  per_step = examples_per_update(config) if applied is None else None
  progress = ProgressReporter(total_updates, examples_per_step=per_step, description=label)
  progress.write(
    f"{label}: {total_updates} updates ({config.num_epochs:g} epochs of "
    f"{dataset.num_train} examples), staleness mean {schedule.gradient_staleness.mean():.2f} "
    f"max {schedule.max_staleness}, simulated time {schedule.update_time[-1]:.1f} s"
  )
  if dataset.evaluation_split != "test":
    progress.write(
      f"evaluating on a {dataset.evaluation_split} split of {dataset.num_test} examples held out of the training "
      f"data (config.validation_fraction={config.validation_fraction:g}); the test split is not read"
    )
  if run.fragments is not None and len(run.fragments.sizes) > 1:  # streaming DiLoCo: each timed for its own bytes
    progress.write(run.fragments.describe())
  if config.protocol == "drop_stale" and schedule.num_dropped == 0:
    progress.write(
      f"warning: protocol 'drop_stale' dropped no gradient: every sigma is <= config.max_staleness="
      f"{config.max_staleness} (n-softsync with config.n={config.n} has sigma of about n, at most about "
      "2n); raise config.n or lower config.max_staleness to drop stale gradients"
    )

  # ----------------------------------------------------------------- checkpoint
  state = runner.init(params)
  checkpointer = Checkpointer(
    os.fspath(workdir / run_directory.CHECKPOINTS),
    max_to_keep=config.keep_checkpoints,
    save_interval_seconds=config.checkpoint_every_seconds,
  )
  writer = MetricWriter(workdir)
  wall_offset = 0.0
  restored = checkpointer.restore(state)
  pending_snapshot = None
  sessions: list[dict[str, Any]] = []
  if restored is not None:
    state, metadata = restored
    writer.truncate_after(metadata["update"])
    pending_snapshot = metadata.get(PENDING_METRICS_KEY)
    wall_offset = metadata["wall_time"]
    # A checkpoint from before sessions were recorded: its code is unknown.
    sessions = list(
      metadata.get(SESSIONS_KEY, [{"first_update": 0, "stalesgd_version": None, "stalesgd_commit": None}])
    )
    progress.write(f"resumed from the checkpoint at update {metadata['update']} in {workdir}")
  elif (workdir / run_directory.METRICS).exists():  # killed before its first checkpoint was whole: start over
    writer.truncate_after(0)
  updates = runner.updates_done(state)
  # A checkpoint written under an older block plan may sit inside one of today's blocks: it is split there.
  position = _LoopPosition(state, runner.resume_at(updates), updates)
  block_starts = runner.block_starts
  updates_at_start = updates
  sessions.append(session_record(updates))
  warn_if_code_changed(sessions, progress)
  warn_if_cpu_changed(sessions, progress)

  # ----------------------------------------------------------------- loop
  evaluator = Evaluator(
    model,
    dataset,
    mesh,
    batch_size=config.eval_batch_size,
    train_examples=config.train_eval_examples,
    precise_bn_batches=config.precise_bn_batches,
    precise_bn_batch_size=config.batch_per_learner * config.learners,
    seed=config.seed,
    metric_names=run.metric_names,
  )
  start_time = time.monotonic()
  wall = lambda: wall_offset + time.monotonic() - start_time
  pending = PendingMetrics(schedule, examples_per_update(config), per_epoch, applied)
  pending.start(position.updates, wall())
  pending.restore(pending_snapshot)
  next_log = _next_point(position.updates, config.log_every_updates)
  # Every eval_every_epochs epochs of applied examples, after exactly the update that reaches the point (the
  # first update whose clock reaches it: `evaluation_updates`); the engine's blocks start at these updates.
  next_eval = _next_evaluation(run.evaluation_updates, position.updates)
  num_blocks = block_starts.shape[0] - 1
  preempted = False
  last_evaluation: dict[str, Any] = {}  # this session's (a run resumed at its end has none)
  save = dict(checkpointer=checkpointer, writer=writer, pending=pending, seed=config.seed, sessions=sessions)

  # Leaving these blocks closes the checkpointer (finishing a save still being written in the
  # background) and the writer, also when the loop stops on an error such as a non-finite loss:
  # otherwise the dying process loses the last good checkpoint.
  with checkpointer, writer:
    while position.block < num_blocks:
      block = position.block
      position.state, metrics = runner.step(position.state, block)
      pending.add(int(block_starts[block]), int(block_starts[block + 1]), metrics)
      position.block = block + 1
      position.updates = updates = int(block_starts[block + 1])
      finished = position.block == num_blocks
      evaluate = updates >= next_eval
      if updates >= next_log or evaluate or finished:
        record = pending.flush(wall())
        if evaluate or finished:
          began = time.monotonic()
          record.update(evaluator(runner.params(position.state)))
          last_evaluation = record
          position.evaluation_seconds += time.monotonic() - began
          next_eval = _next_evaluation(run.evaluation_updates, updates)
        writer.write_scalars(updates, record)
        progress.update(updates, {key: record[key] for key in ("train_loss", "test_error") if key in record})
        next_log = _next_point(updates, config.log_every_updates)
      else:
        progress.update(updates)
      if guard.should_stop(position.block):
        _save_checkpoint(position, force=True, wall_time=wall(), **save)
        preempted = not finished
        break
      _save_checkpoint(position, force=finished, wall_time=wall(), **save)
    if not preempted:  # TensorBoard's HParams: the config and the final metrics, in the run's own event file
      writer.write_hparams(
        flatten_config(config, first=hparams_first),
        {tag: value for tag, value in last_evaluation.items() if tag.startswith("test_") or tag == "train_accuracy"},
      )
  progress.close()
  loop_seconds = time.monotonic() - start_time

  # ----------------------------------------------------------------- summary and plots
  records = read_jsonl(workdir / run_directory.METRICS) if (workdir / run_directory.METRICS).exists() else []
  summary = run_summary(
    config,
    label=label,
    schedule=schedule,
    params=runner.params(position.state),
    updates=position.updates,
    epochs=pending.epoch(position.updates),
    wall_time=wall(),
    records=records,
    preempted=preempted,
  )
  if run.fragments is not None and len(run.fragments.sizes) > 1:
    summary["fragments"] = {
      "pattern": run.fragments.pattern,
      "parameters": list(run.fragments.sizes),
      "layers": [list(names) for names in run.fragments.layers],
    }
  summary["wall_time_breakdown"] = {
    "startup_s": start_time - entered,  # data, model, schedule, state, restore (compilation is in the loop)
    "training_s": loop_seconds - position.evaluation_seconds - position.checkpoint_seconds,
    "evaluation_s": position.evaluation_seconds,
    "checkpoint_s": position.checkpoint_seconds,
    "updates_this_session": position.updates - updates_at_start,
  }
  summary[SESSIONS_KEY] = sessions
  if primary:
    write_whole(workdir / run_directory.SUMMARY, json.dumps(summary, indent=2))
    if not preempted:
      plots.plot_curves([plots.Run(label, records)], workdir / run_directory.CURVES, title=label)
      plots.plot_staleness_histograms({label: schedule.gradient_staleness}, workdir / run_directory.STALENESS)
  return summary
