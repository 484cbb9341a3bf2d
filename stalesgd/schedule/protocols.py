"""The protocol registry and `simulate`, which turns a protocol and a timing model into a `Schedule`.

Parameter-server protocols (lambda = ``learners``; docs/algorithms.md §1, §4):

=============  ==========================  ===================================
protocol       options                     server
=============  ==========================  ===================================
hardsync       (none)                      one gradient per learner, sigma = 0
softsync       n in [1, learners]          c = floor(lambda / n), no barrier
async          (none)                      c = 1 (softsync with n = lambda)
ssp            s >= 0                      one update per clock, lead <= s
backup         backup in [0, learners-1]   hardsync that waits for lambda - b
drop_stale     max_staleness >= 0,         softsync that drops sigma >
               n (default learners)        max_staleness
=============  ==========================  ===================================

Decentralized all-reduce protocols (M = ``learners`` workers; §3):
``allreduce_sync`` (S = 0), ``s3gd`` and ``dcs3gd`` (``staleness`` S >= 0,
default 1; ``overlap`` of communication and computation, default True).

Each protocol's rules live in their own module (`softsync`, `ssp`, `backup`,
`decentralized`); this module validates arguments and dispatches.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from typing import Any

from stalesgd.schedule import validation
from stalesgd.schedule.backup import BackupWorkerServer
from stalesgd.schedule.decentralized import simulate_allreduce
from stalesgd.schedule.parameter_server import ProgressCallback, ServerRule, run_parameter_server
from stalesgd.schedule.schedule import Schedule
from stalesgd.schedule.softsync import ArrivalOrderServer
from stalesgd.schedule.ssp import StaleSynchronousServer
from stalesgd.schedule.timing import TimingModel

_REQUIRED = object()
_LEARNERS = object()  # default that resolves to the number of learners


def _check_n(value: Any, learners: int) -> int:
  return validation.check_integer("n", value, 1, learners, high_label="learners")


def _check_nonnegative(name: str) -> Callable[[Any, int], int]:
  return lambda value, learners: validation.check_integer(name, value, 0)


def _check_backup(value: Any, learners: int) -> int:
  return validation.check_integer("backup", value, 0, learners - 1, high_label="learners - 1")


def _check_overlap(value: Any, learners: int) -> bool:
  return validation.check_bool("overlap", value)


@dataclasses.dataclass(frozen=True)
class _Protocol:
  """A protocol's options (name -> (default, checker)) and how to run it."""

  options: dict[str, tuple[Any, Callable[[Any, int], Any]]]
  server: Callable[..., ServerRule] | None = None  # None: decentralized

  def resolve(self, name: str, learners: int, given: dict[str, Any]) -> dict[str, Any]:
    """Checks ``given`` against the options and fills in defaults."""
    unknown = sorted(set(given) - set(self.options))
    if unknown:
      allowed = ", ".join(self.options) or "none"
      raise ValueError(f"protocol {name!r} does not take option(s) {unknown}; allowed options: {allowed}")
    resolved = {}
    for option, (default, check) in self.options.items():
      if option in given:
        value = given[option]
      elif default is _REQUIRED:
        raise ValueError(f"protocol {name!r} needs the option {option!r}")
      else:
        value = learners if default is _LEARNERS else default
      resolved[option] = check(value, learners)
    return resolved


_DECENTRALIZED_OPTIONS = {"staleness": (1, _check_nonnegative("staleness")), "overlap": (True, _check_overlap)}

_PROTOCOLS: dict[str, _Protocol] = {
    "hardsync": _Protocol({}, lambda learners: StaleSynchronousServer(learners, s=0)),
    "softsync": _Protocol({"n": (_REQUIRED, _check_n)}, ArrivalOrderServer),
    "async": _Protocol({}, lambda learners: ArrivalOrderServer(learners, n=learners)),
    "ssp": _Protocol({"s": (_REQUIRED, _check_nonnegative("s"))}, StaleSynchronousServer),
    "backup": _Protocol({"backup": (_REQUIRED, _check_backup)}, BackupWorkerServer),
    "drop_stale": _Protocol(
        {"max_staleness": (_REQUIRED, _check_nonnegative("max_staleness")), "n": (_LEARNERS, _check_n)},
        ArrivalOrderServer),
    "allreduce_sync": _Protocol({}),
    "s3gd": _Protocol(_DECENTRALIZED_OPTIONS),
    "dcs3gd": _Protocol(_DECENTRALIZED_OPTIONS),
}

PROTOCOLS = tuple(_PROTOCOLS)
"""Names `simulate` accepts."""
PARAMETER_SERVER_PROTOCOLS = tuple(name for name, spec in _PROTOCOLS.items() if spec.server is not None)
DECENTRALIZED_PROTOCOLS = tuple(name for name, spec in _PROTOCOLS.items() if spec.server is None)


def _resolve(protocol: str, learners: int, protocol_options: dict[str, Any]) -> tuple[_Protocol, dict[str, Any]]:
  """Validates the protocol name, learners and options; fills in defaults."""
  spec = _PROTOCOLS.get(protocol)
  if spec is None:
    raise ValueError(f"protocol must be one of {', '.join(map(repr, PROTOCOLS))}; got {protocol!r}")
  learners = validation.check_integer("learners", learners, 1)
  return spec, spec.resolve(protocol, learners, protocol_options)


def contributions_per_update(protocol: str, *, learners: int, **protocol_options: Any) -> int:
  """c, the gradients every update of ``protocol`` applies, without simulating.

  E.g. ``contributions_per_update("softsync", learners=30, n=4) == 7``;
  useful to size ``num_updates`` for a number of gradients.

  Raises:
    ValueError: as `simulate` does for bad arguments.
  """
  spec, options = _resolve(protocol, learners, protocol_options)
  return learners if spec.server is None else spec.server(learners, **options).contributions


def simulate(
    protocol: str,
    *,
    learners: int,
    num_updates: int,
    seed: int,
    timing: TimingModel | None = None,
    record_events: bool = False,
    progress: ProgressCallback | None = None,
    **protocol_options: Any,
) -> Schedule:
  """Simulates a synchronization protocol and returns who computed what, when.

  A seeded discrete-event simulation of ``learners`` learners and a parameter
  server (or of M all-reduce workers) under ``timing``
  (docs/algorithms.md §1, §4, §5). Same arguments, same schedule; the
  options, seed and timing model are recorded in ``Schedule.options``.

  Args:
    protocol: one of `PROTOCOLS` (see the module docstring).
    learners: lambda learners (M workers for decentralized protocols), >= 1.
    num_updates: server updates (steps) to simulate, >= 1.
    seed: non-negative integer seeding every draw.
    timing: the `TimingModel`; default: homogeneous learners with light
      log-normal jitter and free communication.
    record_events: attach an `EventTrace` (parameter-server protocols only).
    progress: optional callback ``progress(updates_done, num_updates)``.
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
  spec, options = _resolve(protocol, learners, protocol_options)
  num_updates = validation.check_integer("num_updates", num_updates, 1)
  seed = validation.check_integer("seed", seed, 0)
  validation.check_bool("record_events", record_events)
  timing = TimingModel() if timing is None else timing
  if not isinstance(timing, TimingModel):
    raise ValueError(f"timing must be a TimingModel or None; got {type(timing).__name__}")
  timing.check_learners(learners)
  provenance = json.loads(json.dumps(
      {"protocol_options": options, "seed": seed, "timing": timing.to_dict()}))
  if spec.server is not None:
    return run_parameter_server(
        spec.server(learners, **options), protocol=protocol, num_updates=num_updates, timing=timing, seed=seed,
        options=provenance, record_events=record_events, progress=progress)
  if record_events:
    raise ValueError(f"record_events is only available for {', '.join(PARAMETER_SERVER_PROTOCOLS)}; "
                     f"got protocol={protocol!r}")
  return simulate_allreduce(
      protocol=protocol, workers=learners, num_updates=num_updates, timing=timing, seed=seed,
      staleness=options.get("staleness", 0), overlap=options.get("overlap", False), options=provenance,
      progress=progress)
