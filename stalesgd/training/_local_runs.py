r"""Local runs in a run's config: ``config.local_steps`` (H), ``config.inner`` and ``config.outer``.

With ``config.local_steps = H`` a contribution is a local run (docs/algorithms.md §7): H steps of an inner
optimizer from the weights the learner holds, contributing :math:`\Delta = -\sum_i u_i`. Which optimizer each
field configures depends on the protocol family; the run's optimizer fields keep the meaning they always had:

===============================  ===============================  ===========================  =======================
protocols                        the run's optimizer fields       ``config.inner``             ``config.outer``
===============================  ===============================  ===========================  =======================
parameter server (hardsync,      the server's optimizer, fed      each learner's inner         not used (defaults)
softsync, async, ssp, ...)       :math:`\Delta` as a gradient     optimizer
``diloco``                       each learner's inner optimizer   not used (defaults)          the outer step, fed
                                                                                               :math:`\bar\Delta`
all-reduce (allreduce_sync,      each learner's local optimizer   not used (defaults)          not used (defaults)
s3gd, dcs3gd)                    (H = 1)
===============================  ===============================  ===========================  =======================

Both sections name an optimizer the same way: ``optimizer`` (``"sgd"``: ``optax.sgd``; another optax optimizer
by name; or ``"package.module:factory"``, e.g. ``"stalesgd:delayed_nesterov"``), a constant ``learning_rate``,
``momentum`` and ``nesterov`` (SGD's, or the factory's own arguments of those names) and ``options`` (further
keyword arguments, e.g. delayed Nesterov's ``buffer_size`` and ``activation``). ``config.inner.reset_state`` and
``config.outer.reset_inner_state`` start every local run from a fresh inner state (DeepMind's asynchronous DiLoCo
notebook re-creates its inner AdamW per run) instead of the state the learner kept (DiLoCo keeps it).

Defaults: H = 1 and inner SGD at rate 1 without momentum make a parameter-server contribution one gradient, bit
for bit, so every run configured before these fields computes what it did; the outer step defaults to DiLoCo's,
Nesterov SGD at rate 0.7 with momentum 0.9 (Douillard et al., arXiv 2311.08105).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import ml_collections
import numpy as np
import optax

from stalesgd import _validation as validation
from stalesgd import schedule as schedule_lib
from stalesgd.decentral._fragments import DEFAULT_FRAGMENT_PATTERN, FRAGMENT_PATTERNS
from stalesgd.decentral._streaming import StreamingSettings
from stalesgd.schedule._durations import dynamic_local_steps
from stalesgd.training._config_fields import Choice, Field, Flag, Integer, Options, Real, Section, Text
from stalesgd.training._solvers import solver_factory
from stalesgd.utils._import_path import accepted_options, check_options

SGD = "sgd"  # a section's optimizer default: optax.sgd (no schedule: the rate is constant)
_OPTIMIZER_NAMES = "'sgd', an optax optimizer's name, or 'package.module:factory'"


def _optimizer_fields(role: str, rate: float, momentum: float, nesterov: bool, rate_doc: str) -> tuple[Field, ...]:
  """The five fields by which ``inner`` and ``outer`` each name an optimizer (module docstring), at its defaults."""
  return (
    Field("optimizer", SGD, Text(_OPTIMIZER_NAMES), "'sgd' (optax.sgd), an optax optimizer's name or a factory"),
    Field("learning_rate", rate, Real(0, low_open=True), rate_doc),
    Field("momentum", momentum, Real(0, 1, high_open=True), f"the {role} momentum"),
    Field("nesterov", nesterov, Flag(), f"Nesterov {role} momentum"),
    Field("options", ml_collections.ConfigDict, Options("b1=0.9"), f"further keyword options of the {role} optimizer"),
  )


INNER = Section(
  "inner",
  "the parameter-server learners' inner optimizer and local runs (docs/algorithms.md §7)",
  (
    *_optimizer_fields("inner", 1.0, 0.0, False, "the inner rate (1 with H = 1: a contribution is a gradient)"),
    Field(
      "reset_state",
      False,
      Flag(),
      "start every local run from a fresh inner state (the asynchronous DiLoCo notebook re-creates its AdamW)",
    ),
    Field(
      "dynamic_min_steps",
      0,
      Integer(0, "local_steps"),
      "Liu et al.'s dynamic local updates: H_min >= 1 gives learner m max(floor(H v_m / v_max), H_min) steps, v_m "
      "its speed; 0: H for every learner",
    ),
    Field(
      "data_shards",
      0,
      Integer(0),
      "S >= 1 splits the data into S streams, each starting local run taking the least-visited one (the notebook's); "
      "0: each learner its own",
    ),
    Field(
      "cosine_steps",
      0,
      Integer(0, 2**62),
      "T of a cosine inner rate keyed to the local run's data stream (the notebook's); 0: a constant rate",
    ),
    Field("cosine_final_rate", 1e-6, Real(0), "the cosine rate's final value"),
    Field(
      "restart_at_peak",
      False,
      Flag(),
      "the first step of every re-created inner optimizer runs at learning_rate (the notebook's scheduler)",
    ),
  ),
  nested=True,
)

OUTER = Section(
  "outer",
  "the outer step of diloco and streaming_diloco; DiLoCo's Nesterov SGD (Douillard et al. 2023) by default",
  (
    *_optimizer_fields("outer", 0.7, 0.9, True, "the outer rate"),
    Field("reset_inner_state", False, Flag(), "start every local run from a fresh inner state (DiLoCo keeps it)"),
    Field(
      "fragments",
      1,
      Integer(1, "local_steps"),
      "streaming_diloco (Douillard et al. 2025): P fragments synced in turn; P divides H",
    ),
    Field(
      "delay",
      0,
      Integer(0, "local_steps"),
      "tau: a fragment's mean is applied tau inner steps after its sync (tau = H with P = 1: the one-round-delayed "
      "outer step)",
    ),
    Field("mix", 0.0, Real(0, 1), "alpha: a local copy becomes alpha theta + (1 - alpha) Theta"),
    Field(
      "fragment_pattern",
      DEFAULT_FRAGMENT_PATTERN,
      Choice(FRAGMENT_PATTERNS),
      "fragments of whole layers in the model's order: strided (the paper's preference) or sequential (balanced); "
      "array_strided: array i of jax.tree.leaves in fragment i mod P (the rule before layers)",
    ),
  ),
  nested=True,
)


def default_inner() -> ml_collections.ConfigDict:
  """``config.inner`` at its defaults (`INNER`)."""
  return INNER.defaults()


def default_outer() -> ml_collections.ConfigDict:
  """``config.outer`` at its defaults (`OUTER`)."""
  return OUTER.defaults()


STREAMING_FIELDS = ("fragments", "delay", "mix", "fragment_pattern")


def streaming_settings(config: ml_collections.ConfigDict) -> StreamingSettings:
  """The outer loop's `StreamingSettings` (``diloco``: its defaults, P = 1, tau = 0, alpha = 0)."""
  outer = config.outer
  return StreamingSettings(config.local_steps, outer.fragments, outer.delay, outer.mix, config.eager_updates)


def _solver_call(fields: ml_collections.ConfigDict, section: str) -> tuple[Any, dict[str, Any]]:
  """The factory ``config.<section>.optimizer`` names and its keyword arguments besides the rate.

  Raises:
    ValueError: naming the ``config.<section>`` field: an unknown optimizer, an option it does not take, a
      momentum or nesterov it has no argument for, or a learning rate, momentum or nesterov among the options.
  """
  field, name = f"config.{section}.optimizer", fields.optimizer
  factory = optax.sgd if name == SGD else solver_factory(name, field=field)
  arguments = dict(fields.options.items())
  check_options(factory, arguments, field=field, path=name, options_field=f"config.{section}.options")
  names, _ = accepted_options(factory)
  for option in ("learning_rate", "momentum", "nesterov"):
    if option in arguments:
      raise ValueError(f"config.{section}.options.{option}: set config.{section}.{option} instead")
  for option, value, off in (("momentum", fields.momentum, 0), ("nesterov", fields.nesterov, False)):
    if option in names:
      arguments[option] = value
    elif value != off:
      validation.reject(f"config.{section}.{option}", value, f"{off!r}: {field}={name!r} takes no {option} argument")
  if name == SGD and fields.momentum == 0:
    arguments["momentum"] = None  # optax.sgd without momentum keeps no state: nothing to carry between runs
  return factory, arguments


def build_section_optimizer(fields: ml_collections.ConfigDict, section: str) -> optax.GradientTransformation:
  """The optimizer ``config.<section>`` (``"inner"`` or ``"outer"``) describes, at its constant learning rate."""
  factory, arguments = _solver_call(fields, section)
  optimizer = factory(fields.learning_rate, **arguments)
  if not isinstance(optimizer, optax.GradientTransformation):
    raise ValueError(
      f"config.{section}.optimizer={fields.optimizer!r} returned a {type(optimizer).__name__}; allowed: an optax "
      "GradientTransformation"
    )
  return optimizer


def build_inner_optimizer(inner: ml_collections.ConfigDict) -> optax.GradientTransformation:
  """The parameter-server learners' inner optimizer (``config.inner``)."""
  return build_section_optimizer(inner, "inner")


def build_outer_optimizer(outer: ml_collections.ConfigDict) -> optax.GradientTransformation:
  """``diloco``'s outer optimizer (``config.outer``), fed the mean pseudo-gradient as a gradient."""
  return build_section_optimizer(outer, "outer")


def cosine_step_scale(
  learning_rate: float, final_rate: float, total_steps: int, *, restart_at_peak: bool
) -> Callable[[np.ndarray, int], np.ndarray]:
  r"""The inner steps' factors of a cosine rate keyed to the data stream (`stalesgd.engine.InnerStepScale`).

  Step i of a local run whose stream starts at step o is the stream's step n = o + i, and runs at

  .. math::
    \eta_n = \eta_{end} + (\eta - \eta_{end}) \tfrac{1}{2} (1 + \cos(\pi \min(n / T, 1)))

  (the asynchronous DiLoCo notebook's ``CosineScheduler``, its T the steps per shard of the whole run), or at
  :math:`\eta` for i = 0 with ``restart_at_peak`` (the notebook sets a rate only after each step, and re-creates
  the optimizer at :math:`\eta` for every run). Returned as factors :math:`\eta_n / \eta`, float64 [S, steps].
  """

  def scale(offsets: np.ndarray, steps: int) -> np.ndarray:
    stream_step = np.asarray(offsets, np.int64)[:, None] + np.arange(steps)
    progress = np.minimum(stream_step / total_steps, 1.0)
    rate = final_rate + (learning_rate - final_rate) * 0.5 * (1.0 + np.cos(np.pi * progress))
    if restart_at_peak:
      rate[:, 0] = learning_rate
    return rate / learning_rate

  return scale


@dataclasses.dataclass(frozen=True)
class LocalRuns:
  """A parameter-server run's local runs, as `stalesgd.engine.Engine` takes them (the default: one gradient per
  contribution).

  Attributes:
    local_steps: H, the inner steps of a contribution.
    inner_optimizer: each learner's inner optimizer (None: the engine's default, SGD at rate 1).
    reset_inner_state: whether every local run starts from a fresh inner state.
    learner_local_steps: int [learners], H_m of dynamic local updates; None: H for every learner.
    inner_step_scale: the inner steps' rate factors of a cosine rate keyed to the data stream; None: constant.
  """

  local_steps: int = 1
  inner_optimizer: optax.GradientTransformation | None = None
  reset_inner_state: bool = False
  learner_local_steps: np.ndarray | None = None
  inner_step_scale: Callable[[np.ndarray, int], np.ndarray] | None = None


def local_runs_of(config: ml_collections.ConfigDict, timing: schedule_lib.TimingModel) -> LocalRuns:
  """The `LocalRuns` of a parameter-server run (``timing``: the run's timing model, whose speed factors give
  dynamic local updates their H_m)."""
  inner = config.inner
  steps, minimum = config.local_steps, inner.dynamic_min_steps
  per_learner = dynamic_local_steps(timing, config.learners, config.seed, steps, minimum) if minimum else None
  scale = None
  if inner.cosine_steps:
    scale = cosine_step_scale(
      inner.learning_rate, inner.cosine_final_rate, inner.cosine_steps, restart_at_peak=inner.restart_at_peak
    )
  return LocalRuns(steps, build_inner_optimizer(inner), inner.reset_state, per_learner, scale)


def _require_defaults(config: ml_collections.ConfigDict, section: str, why: str) -> None:
  defaults = {"inner": INNER, "outer": OUTER}[section].defaults()
  for field in sorted(defaults.keys()):
    value = config[section][field]
    default = defaults[field]
    # True == 1 in Python, but a flag is not a count: a value of another kind (bool, numpy) counts as changed.
    kind = lambda v: "number" if type(v) in (int, float) else type(v)
    changed = bool(value.keys()) if field == "options" else value != default or kind(value) != kind(default)
    if changed:
      shown = dict(value.items()) if field == "options" else value
      validation.reject(f"config.{section}.{field}", shown, f"its default, {defaults[field]!r}: {why}")


def _check_streaming(config: ml_collections.ConfigDict, streaming: bool) -> None:
  """Streaming DiLoCo's fields together; a protocol that does not stream keeps P = 1, tau = 0, alpha = 0."""
  outer, steps = config.outer, config.local_steps
  if steps % outer.fragments:
    validation.reject("config.outer.fragments", outer.fragments, f"a divisor of config.local_steps={steps}")
  if config.eager_updates and outer.delay != steps:
    validation.reject(
      "config.outer.delay",
      outer.delay,
      f"config.local_steps={steps} with config.eager_updates: each sync's eager step uses the previous sync's mean, "
      "whose all-reduce has one round to arrive",
    )
  if streaming:
    return
  defaults = OUTER.defaults()
  for field in STREAMING_FIELDS:
    if outer[field] != defaults[field]:
      validation.reject(
        f"config.outer.{field}",
        outer[field],
        f"its default, {defaults[field]!r}, for protocol {config.protocol!r} (synchronous DiLoCo); fragments, delay, "
        "mix and fragment_pattern are streaming_diloco's",
      )


def check_local_runs(config: ml_collections.ConfigDict) -> None:
  """The checks that relate ``config.local_steps``, ``config.inner`` and ``config.outer`` to each other and to the
  protocol (each field's own range is its declaration's, `INNER` and `OUTER`).

  Raises:
    ValueError: naming the field; a section a protocol does not use must keep its defaults (module docstring),
      and the all-reduce protocols take H = 1 only.
  """
  inner = config.inner
  if inner.restart_at_peak and not inner.cosine_steps:
    validation.reject(
      "config.inner.restart_at_peak", True, "False without a cosine rate (config.inner.cosine_steps = 0: constant)"
    )
  if config.grace_window and config.protocol != "async":
    validation.reject(
      "config.grace_window", config.grace_window, f"0.0 for protocol {config.protocol!r} (a window is async's)"
    )
  _solver_call(config.inner, "inner")
  _solver_call(config.outer, "outer")
  protocol = config.protocol
  row = schedule_lib.protocol_row(protocol)
  if not row.decentralized:
    _require_defaults(config, "outer", f"protocol {protocol!r} has no outer step (it is the server's optimizer)")
    return
  own = "a decentralized learner's optimizer is the run's own optimizer fields (learning_rate, momentum, ...)"
  _require_defaults(config, "inner", f"with protocol {protocol!r}, {own}")
  if row.outer_loop:
    _check_streaming(config, row.streaming)
    return
  _require_defaults(config, "outer", f"protocol {protocol!r} has no outer step")
  if config.local_steps != 1:
    validation.reject(
      "config.local_steps",
      config.local_steps,
      f"1 for protocol {protocol!r}: local runs of H > 1 steps run with the parameter-server protocols and "
      f"{', '.join(name for name in schedule_lib.PROTOCOLS if schedule_lib.protocol_row(name).outer_loop)}",
    )
