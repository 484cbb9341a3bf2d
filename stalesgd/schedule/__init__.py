"""stalesgd.schedule: a seeded timing model that simulates synchronization protocols.

``simulate(protocol, *, learners, num_updates, seed, timing=None, **options)``
runs a discrete-event simulation of learners and a parameter server (hardsync,
n-softsync, async, SSP, backup workers, drop-stale) or of all-reduce learners
(synchronous, S3GD, DC-S3GD) under a `TimingModel`, and returns a `Schedule`
of plain numpy arrays saying, for every update, which learners contribute,
at which weights their gradients were computed, which mini-batch each
consumed, and when the update happened. It knows nothing about JAX or models.
"""

from stalesgd.schedule._events import EventTrace
from stalesgd.schedule._protocols import (
  CORRECTED_DECENTRALIZED_PROTOCOLS,
  DECENTRALIZED_PROTOCOLS,
  EAGER_PROTOCOLS,
  PARAMETER_SERVER_PROTOCOLS,
  PROTOCOL_TABLE,
  PROTOCOLS,
  Option,
  Protocol,
  contributions_per_update,
  protocol_row,
  simulate,
)
from stalesgd.schedule._schedule_arrays import Schedule
from stalesgd.schedule._timing import JITTERS, TimingModel

__all__ = [
  "CORRECTED_DECENTRALIZED_PROTOCOLS",
  "DECENTRALIZED_PROTOCOLS",
  "EAGER_PROTOCOLS",
  "EventTrace",
  "JITTERS",
  "PARAMETER_SERVER_PROTOCOLS",
  "PROTOCOLS",
  "PROTOCOL_TABLE",
  "Option",
  "Protocol",
  "Schedule",
  "TimingModel",
  "contributions_per_update",
  "protocol_row",
  "simulate",
]
