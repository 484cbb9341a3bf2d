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

from collections.abc import Callable, Mapping
from typing import Any

import ml_collections
import numpy as np
import optax

from stalesgd import _validation as validation
from stalesgd import schedule as schedule_lib
from stalesgd.decentral._fragments import DEFAULT_FRAGMENT_PATTERN, FRAGMENT_PATTERNS
from stalesgd.decentral._streaming import StreamingSettings
from stalesgd.schedule._durations import dynamic_local_steps
from stalesgd.training._solvers import solver_factory
from stalesgd.utils._import_path import accepted_options, check_options

SGD = "sgd"  # a section's optimizer default: optax.sgd (no schedule: the rate is constant)
SECTIONS = ("inner", "outer")


def default_inner() -> ml_collections.ConfigDict:
  """``config.inner``: the parameter-server learners' inner optimizer (module docstring)."""
  inner = ml_collections.ConfigDict()
  inner.optimizer = SGD
  inner.learning_rate = 1.0
  inner.momentum = 0.0
  inner.nesterov = False
  inner.options = ml_collections.ConfigDict()
  inner.reset_state = False
  # Dynamic local updates (Liu et al.): H_min >= 1 gives learner m H_m = max(floor(H v_m / v_max), H_min) steps, v_m
  # its speed from the timing model's speed factors; 0 (default): H for every learner.
  inner.dynamic_min_steps = 0
  # Data shards (the asynchronous DiLoCo notebook): S >= 1 splits the data into S streams and gives each starting
  # local run the least-visited one, read from where the shard's earlier runs stopped; 0: each learner its own.
  inner.data_shards = 0
  # A cosine inner rate keyed to the local run's data stream (the notebook's): step n of the stream (a shard's step
  # count with data_shards, else the learner's own inner steps) runs at
  # final + (learning_rate - final) (1 + cos(pi min(n / T, 1))) / 2, T = cosine_steps; 0: a constant rate.
  inner.cosine_steps = 0
  inner.cosine_final_rate = 1e-6
  # The notebook's scheduler sets a rate only after each step, so the first step of every (re-created) inner
  # optimizer runs at learning_rate: True does the same.
  inner.restart_at_peak = False
  return inner


def default_outer() -> ml_collections.ConfigDict:
  """``config.outer``: the outer step of ``diloco`` (module docstring); DiLoCo's Nesterov SGD by default."""
  outer = ml_collections.ConfigDict()
  outer.optimizer = SGD
  outer.learning_rate = 0.7
  outer.momentum = 0.9
  outer.nesterov = True
  outer.options = ml_collections.ConfigDict()
  outer.reset_inner_state = False
  # streaming_diloco (Douillard et al., arXiv 2501.18512): P fragments synced in turn (P divides H), each mean
  # applied `delay` = tau inner steps after its sync (0 <= tau <= H), local copies mixed with `mix` = alpha.
  # diloco is P = 1, tau = 0, alpha = 0; P = 1, tau = H, alpha = 0 is the one-round-delayed outer step.
  outer.fragments = 1
  outer.delay = 0
  outer.mix = 0.0
  # How the P fragments are formed (stalesgd/decentral/_fragments.py): of whole layers in the model's order,
  # "strided" (layer j in fragment j mod P, the paper's preference) or "sequential" (contiguous runs of layers, the
  # largest as small as it can be); "array_strided": array i of jax.tree.leaves in fragment i mod P (the rule
  # before layers; a config.json saved without this field with P > 1 ran it).
  outer.fragment_pattern = DEFAULT_FRAGMENT_PATTERN
  return outer


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


def local_run_options(config: ml_collections.ConfigDict, timing: schedule_lib.TimingModel) -> dict[str, Any]:
  """The `stalesgd.engine.Engine` keyword arguments of a parameter-server run's local runs (``timing``: the run's
  timing model, whose speed factors give dynamic local updates their H_m)."""
  inner = config.inner
  steps, minimum = config.local_steps, inner.dynamic_min_steps
  per_learner = dynamic_local_steps(timing, config.learners, config.seed, steps, minimum) if minimum else None
  scale = None
  if inner.cosine_steps:
    scale = cosine_step_scale(
      inner.learning_rate, inner.cosine_final_rate, inner.cosine_steps, restart_at_peak=inner.restart_at_peak
    )
  return {
    "local_steps": steps,
    "inner_optimizer": build_inner_optimizer(inner),
    "reset_inner_state": inner.reset_state,
    "learner_local_steps": per_learner,
    "inner_step_scale": scale,
  }


def _check_section(config: ml_collections.ConfigDict, section: str, reset_field: str) -> None:
  fields = config[section]
  name = f"config.{section}"
  if not isinstance(fields.optimizer, str):
    validation.reject(
      f"{name}.optimizer", fields.optimizer, "'sgd', an optax optimizer's name, or 'package.module:factory'"
    )
  validation.check_real(f"{name}.learning_rate", fields.learning_rate, low=0, low_open=True, builtin_only=True)
  validation.check_real(f"{name}.momentum", fields.momentum, low=0, high=1, high_open=True, builtin_only=True)
  validation.check_bool(f"{name}.nesterov", fields.nesterov)
  validation.check_bool(f"{name}.{reset_field}", fields[reset_field])
  if not isinstance(fields.options, (ml_collections.ConfigDict, Mapping)) or not all(
    isinstance(key, str) for key in fields.options
  ):
    validation.reject(f"{name}.options", fields.options, "a mapping of option names to values (e.g. b1=0.9)")
  _solver_call(fields, section)


def _require_defaults(config: ml_collections.ConfigDict, section: str, why: str) -> None:
  defaults = {"inner": default_inner, "outer": default_outer}[section]()
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
  """Streaming DiLoCo's fields; a protocol that does not stream keeps P = 1, tau = 0, alpha = 0."""
  outer, steps = config.outer, config.local_steps
  validation.check_integer("config.outer.fragments", outer.fragments, low=1, high=steps, builtin_only=True)
  if steps % outer.fragments:
    validation.reject("config.outer.fragments", outer.fragments, f"a divisor of config.local_steps={steps}")
  validation.check_integer(
    "config.outer.delay", outer.delay, low=0, high=steps, high_label="local_steps", builtin_only=True
  )
  validation.check_real("config.outer.mix", outer.mix, low=0, high=1, builtin_only=True)
  validation.check_choice("config.outer.fragment_pattern", outer.fragment_pattern, FRAGMENT_PATTERNS)
  if config.eager_updates and outer.delay != steps:
    validation.reject(
      "config.outer.delay",
      outer.delay,
      f"config.local_steps={steps} with config.eager_updates: each sync's eager step uses the previous sync's mean, "
      "whose all-reduce has one round to arrive",
    )
  if streaming:
    return
  defaults = default_outer()
  for field in STREAMING_FIELDS:
    if outer[field] != defaults[field]:
      validation.reject(
        f"config.outer.{field}",
        outer[field],
        f"its default, {defaults[field]!r}, for protocol {config.protocol!r} (synchronous DiLoCo); fragments, delay, "
        "mix and fragment_pattern are streaming_diloco's",
      )


def check_local_runs(config: ml_collections.ConfigDict) -> None:
  """``config.local_steps``, ``config.inner`` and ``config.outer``, and which of them the protocol uses.

  Raises:
    ValueError: naming the field; a section a protocol does not use must keep its defaults (module docstring),
      and the all-reduce protocols take H = 1 only.
  """
  validation.check_integer("config.local_steps", config.local_steps, low=1, high=2**31 - 1, builtin_only=True)
  validation.check_integer(
    "config.inner.dynamic_min_steps",
    config.inner.dynamic_min_steps,
    low=0,
    high=config.local_steps,
    high_label="local_steps",
    builtin_only=True,
  )
  inner = config.inner
  validation.check_integer("config.inner.data_shards", inner.data_shards, low=0, high=2**31 - 1, builtin_only=True)
  validation.check_integer("config.inner.cosine_steps", inner.cosine_steps, low=0, high=2**62, builtin_only=True)
  validation.check_real("config.inner.cosine_final_rate", inner.cosine_final_rate, low=0, builtin_only=True)
  validation.check_bool("config.inner.restart_at_peak", inner.restart_at_peak)
  if inner.restart_at_peak and not inner.cosine_steps:
    validation.reject(
      "config.inner.restart_at_peak", True, "False without a cosine rate (config.inner.cosine_steps = 0: constant)"
    )
  validation.check_real("config.grace_window", config.grace_window, low=0, builtin_only=True)
  if config.grace_window and config.protocol != "async":
    validation.reject(
      "config.grace_window", config.grace_window, f"0.0 for protocol {config.protocol!r} (a window is async's)"
    )
  _check_section(config, "inner", "reset_state")
  _check_section(config, "outer", "reset_inner_state")
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
