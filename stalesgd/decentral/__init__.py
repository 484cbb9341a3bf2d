"""Decentralized all-reduce protocols on real collectives: DC-S3GD, S3GD, synchronous all-reduce SGD.

Unlike the parameter-server protocols (emulated by `stalesgd.engine`), these are
synchronous SPMD programs: they run for real on many devices and hosts, one
learner per device along a ``learners`` mesh axis.
"""

from __future__ import annotations

from stalesgd.decentral._dcs3gd import DCS3GD, DCS3GDState
from stalesgd.decentral._settings import (
  DEFAULT_LAMBDA_0,
  LAMBDA_MODES,
  PROTOCOLS,
  DCS3GDSettings,
  settings_for_protocol,
)

__all__ = [
  "DCS3GD",
  "DCS3GDSettings",
  "DCS3GDState",
  "DEFAULT_LAMBDA_0",
  "LAMBDA_MODES",
  "PROTOCOLS",
  "settings_for_protocol",
]
