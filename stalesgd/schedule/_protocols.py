"""The protocol table, and `simulate`, which turns a protocol and a timing model into a `Schedule`.

Every protocol is one row of `PROTOCOL_TABLE` (a `Protocol`): its options with
their ranges, defaults and the run-config field that sets each, its server
rule (parameter-server protocols) or the DC-S3GD settings it fixes
(decentralized all-reduce protocols), and its label. The simulator, the run
config's validation (`stalesgd.training._config_checks`), the training loop's runners
(`stalesgd.training._runners`) and the decentralized configuration
(`stalesgd.decentral.settings_for_protocol`) all read that row; adding a protocol
is one row plus, for a parameter-server protocol, one `ServerRule`
(docs/protocols.md shows an example).

Parameter-server protocols (lambda = ``learners``; docs/algorithms.md §1, §4):

=============  ==========================  ===================================
protocol       options (config field)      server
=============  ==========================  ===================================
hardsync       (none)                      one gradient per learner, sigma = 0
softsync       n in [1, learners] (n)      c = floor(lambda / n), no barrier
async          (none)                      c = 1 (softsync with n = lambda)
ssp            s >= 0 (ssp_bound)          one update per clock, lead <= s
backup         backup in [0, learners-1]   hardsync that waits for lambda - b
               (backup_workers)
drop_stale     max_staleness >= 0,         softsync that drops sigma >
               n (default learners)        max_staleness
=============  ==========================  ===================================

Decentralized all-reduce protocols (M = ``learners``; §3):
``dcs3gd`` and ``s3gd`` (``staleness`` S >= 0, default 1, config field
``allreduce_staleness``; ``overlap`` of communication and computation, default
True) and ``allreduce_sync`` (S = 0); ``diloco`` (§7: synchronous rounds of H
local steps per learner, then the outer step on the mean pseudo-gradient) and
``streaming_diloco`` (its fragments synced in turn, each mean applied tau inner
steps later: ``config.outer.fragments``, ``delay``, ``mix``).

Each parameter-server rule lives in its own module (`softsync`, `ssp`,
`backup`), the all-reduce simulation in `decentralized`; this module holds the
table, validates arguments and dispatches.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Mapping
from typing import Any

from stalesgd import _validation as validation
from stalesgd.schedule._backup import BackupWorkerServer
from stalesgd.schedule._decentralized import simulate_allreduce
from stalesgd.schedule._durations import dynamic_local_steps
from stalesgd.schedule._parameter_server import ProgressCallback, ServerRule, run_parameter_server
from stalesgd.schedule._schedule_arrays import Schedule
from stalesgd.schedule._softsync import ArrivalOrderServer
from stalesgd.schedule._ssp import StaleSynchronousServer
from stalesgd.schedule._timing import TimingModel

REQUIRED = object()
"""`Option.default` of an option the caller must give."""
LEARNERS = object()
"""`Option.default` that resolves to the number of learners."""


@dataclasses.dataclass(frozen=True)
class Option:
  """One option of a protocol: its range and default, and the run-config field that sets it.

  Attributes:
    config_field: the field of `stalesgd.training.default_config` that sets the
      option in a training run, or None if a run leaves it at its default.
    low: the smallest allowed integer, or None for a True/False option.
    high: the largest allowed integer as a function of the learners, or None
      for no upper bound.
    high_label: how an error message names ``high``, e.g. ``"learners"``.
    default: a value, `REQUIRED` or `LEARNERS`.
  """

  config_field: str | None
  low: int | None = 0
  high: Callable[[int], int] | None = None
  high_label: str = ""
  default: Any = REQUIRED

  def upper_bound(self, learners: int) -> int | None:
    return None if self.high is None else self.high(learners)

  def check(self, name: str, value: Any, learners: int) -> Any:
    """``value`` after checking it (``ValueError`` naming ``name`` if it is out of range)."""
    if self.low is None:
      return validation.check_bool(name, value)
    return validation.check_integer(
      name, value, low=self.low, high=self.upper_bound(learners), high_label=self.high_label
    )


@dataclasses.dataclass(frozen=True)
class Protocol:
  """One row of `PROTOCOL_TABLE`: everything the library knows about a protocol.

  Attributes:
    name: the protocol's name (``config.protocol``).
    options: simulator option name -> `Option`.
    server: parameter-server protocols: learners, **options -> the
      `ServerRule` the simulator runs; None for decentralized protocols.
    label: a run's label, formatted with the run config's fields
      (``"{n}-softsync"``); the name if empty.
    fixed_settings: decentralized protocols: the `stalesgd.decentral.DCS3GDSettings`
      fields the protocol fixes (e.g. ``dc_lambda=0`` for S3GD).
    eager: decentralized protocols: whether the protocol takes eager updates
      (``config.eager_updates``).
    outer_loop: decentralized protocols: whether each step is an outer round of
      H local steps per learner with an outer optimizer (DiLoCo) instead of one
      DC-S3GD step.
    streaming: outer-loop protocols: whether the fragments, delay and mixing
      of streaming DiLoCo may be set (``config.outer``).
  """

  name: str
  options: Mapping[str, Option] = dataclasses.field(default_factory=dict)
  server: Callable[..., ServerRule] | None = None
  label: str = ""
  fixed_settings: Mapping[str, Any] = dataclasses.field(default_factory=dict)
  eager: bool = False
  outer_loop: bool = False
  streaming: bool = False

  @property
  def decentralized(self) -> bool:
    """Whether it runs on real all-reduce collectives (one learner per device) instead of a parameter server."""
    return self.server is None

  @property
  def corrects(self) -> bool:
    """Whether a run may choose its delay compensation: every parameter-server protocol, and the
    decentralized protocols that do not fix DC-S3GD's ``dc_lambda``."""
    return "dc_lambda" not in self.fixed_settings

  def config_options(self, config: Mapping[str, Any]) -> dict[str, Any]:
    """The simulator options a run config sets: ``{option: config[option.config_field]}``."""
    return {
      name: config[option.config_field] for name, option in self.options.items() if option.config_field is not None
    }

  def resolve(self, learners: int, given: Mapping[str, Any]) -> dict[str, Any]:
    """Checks ``given`` against the options and fills in defaults."""
    unknown = sorted(set(given) - set(self.options))
    if unknown:
      allowed = ", ".join(self.options) or "none"
      raise ValueError(f"protocol {self.name!r} does not take option(s) {unknown}; allowed options: {allowed}")
    resolved = {}
    for name, option in self.options.items():
      if name in given:
        value = given[name]
      elif option.default is REQUIRED:
        raise ValueError(f"protocol {self.name!r} needs the option {name!r}")
      else:
        value = learners if option.default is LEARNERS else option.default
      resolved[name] = option.check(name, value, learners)
    return resolved


_N = Option("n", low=1, high=lambda learners: learners, high_label="learners")
_ALLREDUCE_STALENESS = {
  "staleness": Option("allreduce_staleness", default=1),
  "overlap": Option(None, low=None, default=True),
}
_UNCORRECTED = {"dc_lambda": 0.0, "lambda_mode": "constant"}

PROTOCOL_TABLE: dict[str, Protocol] = {
  row.name: row
  for row in (
    Protocol("hardsync", server=lambda learners: StaleSynchronousServer(learners, s=0)),
    Protocol("softsync", {"n": _N}, ArrivalOrderServer, label="{n}-softsync"),
    Protocol("async", server=lambda learners: ArrivalOrderServer(learners, n=learners)),
    Protocol("ssp", {"s": Option("ssp_bound")}, StaleSynchronousServer),
    Protocol(
      "backup",
      {"backup": Option("backup_workers", high=lambda learners: learners - 1, high_label="learners - 1")},
      BackupWorkerServer,
    ),
    Protocol(
      "drop_stale",
      {"max_staleness": Option("max_staleness"), "n": dataclasses.replace(_N, default=LEARNERS)},
      ArrivalOrderServer,
    ),
    Protocol("allreduce_sync", fixed_settings={"staleness": 0, **_UNCORRECTED}),
    Protocol("s3gd", _ALLREDUCE_STALENESS, fixed_settings=_UNCORRECTED, eager=True),
    Protocol("dcs3gd", _ALLREDUCE_STALENESS, eager=True),
    Protocol("diloco", fixed_settings={"staleness": 0, **_UNCORRECTED}, outer_loop=True),
    Protocol(
      "streaming_diloco",
      {"fragments": Option("outer.fragments", low=1, default=1), "delay": Option("outer.delay", default=0)},
      fixed_settings={"staleness": 0, **_UNCORRECTED},
      eager=True,
      outer_loop=True,
      streaming=True,
    ),
  )
}
"""Every protocol, by name (see the module docstring)."""

PROTOCOLS = tuple(PROTOCOL_TABLE)
"""Names `simulate` accepts."""
PARAMETER_SERVER_PROTOCOLS = tuple(name for name, row in PROTOCOL_TABLE.items() if not row.decentralized)
DECENTRALIZED_PROTOCOLS = tuple(name for name, row in PROTOCOL_TABLE.items() if row.decentralized)
OUTER_LOOP_PROTOCOLS = tuple(name for name, row in PROTOCOL_TABLE.items() if row.outer_loop)
"""The decentralized protocols whose step is an outer round of local runs (DiLoCo)."""
EAGER_PROTOCOLS = tuple(name for name, row in PROTOCOL_TABLE.items() if row.eager)
"""The protocols that take eager updates (``config.eager_updates``)."""
CORRECTED_DECENTRALIZED_PROTOCOLS = tuple(name for name in DECENTRALIZED_PROTOCOLS if PROTOCOL_TABLE[name].corrects)
"""The decentralized protocols that take a delay compensation (DC-S3GD)."""


def protocol_row(name: str) -> Protocol:
  """The table row of protocol ``name``; ``ValueError`` listing the protocols if there is none."""
  return PROTOCOL_TABLE[validation.check_choice("protocol", name, PROTOCOLS)]


def _resolve(name: str, learners: int, protocol_options: dict[str, Any]) -> tuple[Protocol, dict[str, Any]]:
  """Validates the protocol name, learners and options; fills in defaults."""
  row = protocol_row(name)
  learners = validation.check_integer("learners", learners, low=1)
  return row, row.resolve(learners, protocol_options)


def contributions_per_update(protocol: str, *, learners: int, **protocol_options: Any) -> int:
  """c, the gradients every update of ``protocol`` applies, without simulating.

  E.g. ``contributions_per_update("softsync", learners=30, n=4) == 7``;
  useful to size ``num_updates`` for a number of gradients.

  Raises:
    ValueError: as `simulate` does for bad arguments.
  """
  row, options = _resolve(protocol, learners, protocol_options)
  return learners if row.decentralized else row.server(learners, **options).contributions


def simulate(
  protocol: str,
  *,
  learners: int,
  num_updates: int,
  seed: int,
  timing: TimingModel | None = None,
  record_events: bool = False,
  progress: ProgressCallback | None = None,
  local_steps: int = 1,
  dynamic_min_steps: int = 0,
  grace_window: float = 0.0,
  data_shards: int = 0,
  inner_steps: int = 0,
  fragment_bytes: Any = None,
  **protocol_options: Any,
) -> Schedule:
  """Simulates a synchronization protocol and returns who computed what, when.

  A seeded discrete-event simulation of ``learners`` learners and a parameter
  server (or of M all-reduce learners) under ``timing``
  (docs/algorithms.md §1, §4, §5). Same arguments, same schedule; the
  options, seed and timing model are recorded in ``Schedule.options``.

  Args:
    protocol: one of `PROTOCOLS` (see the module docstring).
    learners: lambda learners (M for decentralized protocols), >= 1.
    num_updates: server updates (steps) to simulate, >= 1.
    seed: non-negative integer seeding every draw.
    timing: the `TimingModel`; default: homogeneous learners with light
      log-normal jitter and free communication.
    record_events: attach an `EventTrace` (parameter-server protocols only).
    progress: optional callback ``progress(updates_done, num_updates)``.
    local_steps: H >= 1, the local steps of one contribution (a local run,
      docs/algorithms.md §7): its compute time is the sum of the learner's H
      consecutive step times. Parameter-server protocols and ``diloco``.
    dynamic_min_steps: H_min >= 1 turns on dynamic local updates (parameter-server
      protocols): learner m's contributions have H_m steps
      (`stalesgd.schedule.dynamic_local_steps`); 0 (default) keeps H for all.
    grace_window: T_g >= 0 simulated seconds, ``async`` only: the learners whose
      contributions arrive within T_g of the first are answered together when
      it ends, so they restart from the same version (each contribution is
      still applied on arrival); 0 (default): none.
    data_shards: S >= 1 (parameter-server protocols): each starting local run
      takes the least-visited of S data shards and reads its next H_m
      mini-batches (the asynchronous DiLoCo notebook; `Schedule.data_stream`);
      0 (default): every learner reads its own mini-batches.
    inner_steps: > 0 (parameter-server protocols): end at the first update at
      which the applied contributions' inner steps reach it, ``num_updates``
      being then an upper bound (equal inner steps under dynamic local
      updates); 0 (default): exactly ``num_updates`` updates.
    fragment_bytes: outer-loop protocols: each fragment's bytes, P of them (``streaming_diloco``'s fragments of
      whole layers differ in size), each fragment's all-reduce moving its share of the timing model's
      ``model_bytes`` (`stalesgd.schedule._decentralized.outer_round_ends`); None (default): P equal shares.
    **protocol_options: the protocol's options, e.g. ``n=15`` for softsync.

  Returns:
    The `Schedule`.

  Raises:
    ValueError: for an unknown protocol or option, or an argument out of
      range; raised before anything is simulated.

  Example:
    >>> from stalesgd.schedule import simulate
    >>> run = simulate("softsync", learners=30, n=15, num_updates=10_000, seed=0)
    >>> run.learner.shape
    (10000, 2)
  """
  row, options = _resolve(protocol, learners, protocol_options)
  num_updates = validation.check_integer("num_updates", num_updates, low=1)
  seed = validation.check_integer("seed", seed, low=0)
  validation.check_bool("record_events", record_events)
  timing = TimingModel() if timing is None else timing
  if not isinstance(timing, TimingModel):
    raise ValueError(f"timing must be a TimingModel or None; got {type(timing).__name__}")
  timing.check_learners(learners)
  local_steps = validation.check_integer("local_steps", local_steps, low=1)
  recorded = {"protocol_options": options, "seed": seed, "timing": timing.to_dict()}
  if local_steps != 1:  # recorded only where it differs, so that H = 1 schedules keep their provenance
    recorded["local_steps"] = local_steps
  dynamic_min_steps = validation.check_integer("dynamic_min_steps", dynamic_min_steps, low=0, high=local_steps)
  grace_window = float(validation.check_real("grace_window", grace_window, low=0))
  if grace_window > 0:
    if protocol != "async":
      raise ValueError(f"grace_window={grace_window} with protocol={protocol!r}; allowed: 0, or a window with 'async'")
    recorded["grace_window"] = grace_window
  per_learner: int | Any = local_steps
  if dynamic_min_steps:
    if row.decentralized:
      raise ValueError(
        f"dynamic_min_steps={dynamic_min_steps} with protocol={protocol!r}; allowed: 0 (dynamic "
        "local updates are for the parameter-server protocols)"
      )
    per_learner = dynamic_local_steps(timing, learners, seed, local_steps, dynamic_min_steps)
    recorded["learner_local_steps"] = per_learner.tolist()
  data_shards = validation.check_integer("data_shards", data_shards, low=0)
  inner_steps = validation.check_integer("inner_steps", inner_steps, low=0)
  for name, value in (("data_shards", data_shards), ("inner_steps", inner_steps)):
    if value and row.decentralized:
      raise ValueError(f"{name}={value} with protocol={protocol!r}; allowed: 0 (a parameter-server protocol's option)")
    if value:  # recorded only when set, so that earlier schedules keep their provenance
      recorded[name] = value
  if fragment_bytes is not None:
    if not row.outer_loop:
      raise ValueError(
        f"fragment_bytes with protocol={protocol!r}; allowed: None, or byte counts with one of "
        f"{', '.join(OUTER_LOOP_PROTOCOLS)}"
      )
    fragment_bytes = [int(size) for size in fragment_bytes]
    if len(fragment_bytes) != options.get("fragments", 1):
      raise ValueError(
        f"fragment_bytes={fragment_bytes}; allowed: one byte count per fragment, {options.get('fragments', 1)}"
      )
    if len(fragment_bytes) > 1:  # recorded only for P > 1, so that P = 1 schedules keep their provenance
      recorded["fragment_bytes"] = fragment_bytes
  provenance = json.loads(json.dumps(recorded))
  if row.decentralized and not row.outer_loop and local_steps != 1:
    raise ValueError(
      f"local_steps={local_steps} with protocol={protocol!r}: local runs of H > 1 steps are simulated for the "
      "parameter-server protocols and the outer-loop protocols only; allowed: 1, or local_steps >= 1 with one "
      f"of {', '.join(PARAMETER_SERVER_PROTOCOLS + OUTER_LOOP_PROTOCOLS)}"
    )
  if not row.decentralized:
    return run_parameter_server(
      row.server(learners, **options),
      protocol=protocol,
      num_updates=num_updates,
      timing=timing,
      seed=seed,
      options=provenance,
      record_events=record_events,
      progress=progress,
      local_steps=per_learner,
      grace_window=grace_window,
      data_shards=data_shards,
      inner_steps=inner_steps,
    )
  if record_events:
    raise ValueError(
      f"record_events is only available for {', '.join(PARAMETER_SERVER_PROTOCOLS)}; got protocol={protocol!r}"
    )
  return simulate_allreduce(
    protocol=protocol,
    learners=learners,
    num_updates=num_updates,
    timing=timing,
    seed=seed,
    staleness=options.get("staleness", row.fixed_settings.get("staleness")),
    overlap=options.get("overlap", False),
    options=provenance,
    progress=progress,
    local_steps=local_steps,
    outer_loop=row.outer_loop,
    fragments=options.get("fragments", 1),
    delay=options.get("delay", 0),
    fragment_bytes=fragment_bytes,
  )
