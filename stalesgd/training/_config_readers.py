"""What a run's config implies, each defined once: the quantities derived from it and the typed objects of the
layers below the training stack.

The config is read here and in `stalesgd.training.build_run`, nowhere below: updates per epoch and the
contributions per update, the examples applied under dynamic local updates (`applied_examples`), the updates after
which a run evaluates (`evaluation_updates`), the simulated
cluster's schedule (`simulate_schedule`, with `timing_model` and `protocol_options`), DC-S3GD's settings
(`decentral_settings`, with each mode's lambda_0, `dc_lambda`) and the run's name (`run_label`).
"""

from __future__ import annotations

import math

import ml_collections
import numpy as np

from stalesgd import decentral
from stalesgd import schedule as schedule_lib
from stalesgd.training._run_config import STORED_DC_LAMBDA


def timing_model(config: ml_collections.ConfigDict, *, parameter_bytes: int = 0) -> schedule_lib.TimingModel:
  """The run's `TimingModel`; its compute time scales with the mini-batch size.

  Args:
    config: the run's config.
    parameter_bytes: the model's size, used for messages when
      ``config.timing.model_bytes`` is 0 (only matters with a finite bandwidth).
  """
  timing = config.timing
  try:
    return schedule_lib.TimingModel(
      compute_time=timing.compute_time_per_example * config.batch_per_learner,
      jitter=timing.jitter,
      jitter_sigma=timing.jitter_sigma,
      straggler_prob=timing.straggler_prob,
      straggler_factor=timing.straggler_factor,
      speed_factor_sigma=timing.speed_factor_sigma,
      speed_factors=tuple(timing.speed_factors) or None,
      latency=timing.latency,
      bandwidth=timing.bandwidth if timing.bandwidth > 0 else math.inf,
      model_bytes=timing.model_bytes or parameter_bytes,
      server_shards=timing.server_shards,
      apply_time=timing.apply_time,
    )
  except ValueError as error:
    raise ValueError(f"config.timing: {error}") from error


def protocol_options(config: ml_collections.ConfigDict) -> dict:
  """The keyword options `stalesgd.schedule.simulate` takes for the run's protocol (its table row maps fields)."""
  return schedule_lib.protocol_row(config.protocol).config_options(config)


def contributions_per_update(config: ml_collections.ConfigDict) -> int:
  """c: gradients applied by one server update (M for decentralized protocols)."""
  return schedule_lib.contributions_per_update(config.protocol, learners=config.learners, **protocol_options(config))


def examples_per_update(config: ml_collections.ConfigDict) -> int:
  """c * mu * H: the examples one server update (decentralized: one step of all M learners) applies, H the local
  steps of a contribution (1 for a decentralized protocol)."""
  return contributions_per_update(config) * config.batch_per_learner * config.local_steps


def applied_examples(schedule: schedule_lib.Schedule, batch_per_learner: int) -> np.ndarray | None:
  """int64 [U + 1]: the examples applied by the end of each update (from 0 before the first), under dynamic local
  updates: learner m's contribution applies mu H_m examples, H_m its local steps (the schedule's
  ``learner_local_steps``). None without them: every update then applies `examples_per_update`.
  """
  local_steps = schedule.learner_local_steps
  if local_steps is None:
    return None
  per_update = local_steps[schedule.learner].sum(axis=1) * batch_per_learner
  return np.concatenate([np.zeros(1, np.int64), np.cumsum(per_update)])


EVALUATION_TOLERANCE = 1e-9
"""Relative slack with which an update's clock reaches an evaluation point (``3 x 416.67`` updates is 1250)."""


def epochs_applied(
  updates: np.ndarray | int, per_epoch: float, applied: np.ndarray | None = None, examples_per_update: int = 1
) -> np.ndarray:
  """float64, the shape of ``updates``: the epochs of examples applied by the end of each of ``updates``.

  ``u / per_epoch``, or under dynamic local updates (``applied``: `applied_examples`)
  ``applied[u] / (per_epoch x examples_per_update)``. The run's one clock: the records' ``epoch`` and the updates
  after which the run evaluates (`evaluation_updates`) both read it.
  """
  if applied is None:
    return np.asarray(updates, np.float64) / per_epoch
  return np.asarray(applied, np.float64)[updates] / (per_epoch * examples_per_update)


def evaluation_updates(
  num_updates: int,
  every_epochs: float,
  per_epoch: float,
  applied: np.ndarray | None = None,
  examples_per_update: int = 1,
) -> np.ndarray:
  """int64 [K], increasing: the updates after which a run evaluates (besides after its last update, always).

  The points are k x ``every_epochs`` (k = 1, 2, ...) on the run's clock, `epochs_applied` (``per_epoch``
  updates per epoch; ``applied``: the examples applied by each update under dynamic local updates). Evaluation
  k lands after the first update u whose clock reaches its point, epochs(u) >= k x ``every_epochs`` (up to
  `EVALUATION_TOLERANCE` relative to it). Without dynamic local updates that is u = ceil(k x ``every_epochs`` x
  ``per_epoch``): an epoch of 416.67 updates evaluates after updates 417, 834, 1250, ...; with them the point may
  fall inside an update's examples, and the evaluation comes after that update. An update that reaches several
  points evaluates once. The engine's blocks start at these updates (`stalesgd.engine.plan_blocks`'s
  ``boundaries``), so the weights evaluated are those of exactly this update.
  """
  epochs = epochs_applied(np.arange(num_updates + 1), per_epoch, applied, examples_per_update)
  reached = np.floor(epochs / every_epochs + EVALUATION_TOLERANCE)  # points reached by each update
  return (np.flatnonzero(np.diff(reached) > 0) + 1).astype(np.int64)


def updates_per_epoch(config: ml_collections.ConfigDict, num_train: int) -> float:
  """Server updates (decentralized: steps) per epoch of applied samples."""
  return num_train / examples_per_update(config)


def run_length(config: ml_collections.ConfigDict, num_train: int) -> tuple[int, int]:
  """``(num_updates, inner_steps)`` of a run of ``config.num_epochs`` epochs of applied samples.

  Without dynamic local updates every update applies c mu H examples: ceil(num_epochs x updates per epoch) updates
  and ``inner_steps`` 0 (not needed). With them (``config.inner.dynamic_min_steps``), contributions take H_m <= H
  steps, so the run is cut where its applied inner steps reach ceil(num_epochs x N / mu) (the asynchronous DiLoCo
  notebook ends where its total local steps reach the budget): ``inner_steps`` is that budget and ``num_updates``
  an upper bound on the updates it takes (every contribution at the fewest steps, H_min).
  """
  if not config.inner.dynamic_min_steps:
    return max(1, math.ceil(config.num_epochs * updates_per_epoch(config, num_train))), 0
  inner_steps = max(1, math.ceil(config.num_epochs * num_train / config.batch_per_learner))
  fewest = contributions_per_update(config) * config.inner.dynamic_min_steps
  return max(1, math.ceil(inner_steps / fewest)), inner_steps


def dc_lambda(config: ml_collections.ConfigDict) -> float:
  """lambda_0 of the run's correction: ``config.dc_lambda``, or the mode's default where it is left at 0.04.

  ``config.dc_lambda``'s stored default (`STORED_DC_LAMBDA`, DC-ASGD-c's 0.04)
  stands for "the mode's own lambda_0" (`stalesgd.decentral.DEFAULT_LAMBDA_0`):
  constant 0.04, adaptive 2.0 (DC-ASGD-a), layer-wise 0.2 (DC-S3GD). Any other
  value is taken as given. ``config.dc_lambda_default="dc_asgd"`` keeps 0.04 in
  every mode, as runs started before the per-mode defaults ran (their run
  directories resume only with it, `stalesgd.training.check_same_run`); it is
  also the way to ask for lambda_0 = 0.04 exactly with the adaptive or layer-wise mode.
  """
  per_mode = config.dc_lambda_default == "per_mode"
  if per_mode and config.dc_lambda == STORED_DC_LAMBDA and config.delay_compensation in decentral.DEFAULT_LAMBDA_0:
    return decentral.DEFAULT_LAMBDA_0[config.delay_compensation]
  return config.dc_lambda


def is_decentralized(config: ml_collections.ConfigDict) -> bool:
  """Whether the config's protocol is a decentralized all-reduce protocol (its row of the protocol table)."""
  return schedule_lib.protocol_row(config.protocol).decentralized


def decentral_settings(config: ml_collections.ConfigDict) -> decentral.DCS3GDSettings | None:
  """The `stalesgd.decentral.DCS3GDSettings` of an all-reduce run (None for a parameter-server or outer-loop protocol).

  The protocol's row fixes some fields; the config sets the staleness S, eager
  updates and (where the row allows one) the correction.
  """
  row = schedule_lib.protocol_row(config.protocol)
  if not row.decentralized or row.outer_loop:  # the outer-loop protocols have no DC-S3GD settings
    return None
  overrides = {}
  if "staleness" not in row.fixed_settings:
    overrides.update(staleness=config.allreduce_staleness)
  if row.eager:
    overrides.update(eager=config.eager_updates)
  if row.corrects and config.delay_compensation != "none":
    overrides.update(
      dc_lambda=dc_lambda(config), lambda_mode=config.delay_compensation, mean_square_decay=config.dc_decay
    )
  return decentral.settings_for_protocol(config.protocol, **overrides)


def simulate_schedule(
  config: ml_collections.ConfigDict,
  num_updates: int,
  *,
  parameter_bytes: int,
  inner_steps: int = 0,
  fragment_bytes: tuple[int, ...] | None = None,
) -> schedule_lib.Schedule:
  """The simulated cluster's schedule of a run: its protocol, options and timing model, seeded by the config
  (``num_updates`` and ``inner_steps``: `run_length`; ``fragment_bytes``: an outer loop's fragments' bytes, each
  all-reduce timed for its own, `stalesgd.schedule.simulate`)."""
  return schedule_lib.simulate(
    config.protocol,
    learners=config.learners,
    num_updates=num_updates,
    seed=config.seed,
    **protocol_options(config),
    timing=timing_model(config, parameter_bytes=parameter_bytes),
    local_steps=config.local_steps,
    dynamic_min_steps=config.inner.dynamic_min_steps,
    grace_window=config.grace_window,
    data_shards=config.inner.data_shards,
    inner_steps=inner_steps,
    fragment_bytes=fragment_bytes,
  )


def run_label(config: ml_collections.ConfigDict) -> str:
  """A run's name in logs, plots and summaries, e.g. ``"4-softsync (lambda=30, mu=4, inverse)"``."""
  row = schedule_lib.protocol_row(config.protocol)
  protocol = (row.label or row.name).format(**config)
  rule = "" if config.staleness_rule == "none" else f", {config.staleness_rule}"
  correction = config.delay_compensation
  settings = decentral_settings(config)
  if settings is not None:  # DC-S3GD corrects even with delay_compensation="none" (its own default lambda)
    correction = settings.lambda_mode if settings.corrects else "none"
  dc = "" if correction == "none" else f", DC-{correction}"
  if config.dc_mean_square_bias_correction:
    dc += " bias-corrected"
  local = "" if config.local_steps == 1 else f", H={config.local_steps}"
  return f"{protocol} (lambda={config.learners}, mu={config.batch_per_learner}{local}{rule}{dc})"
