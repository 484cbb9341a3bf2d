"""Bounding how far the host runs ahead of the devices.

JAX dispatches asynchronously, so a Python loop can queue many steps before the
first finishes. With several XLA:CPU host devices and a collective in every
step, a long queue deadlocked here: one device's launch waited for a free
in-flight slot while the other devices waited for it inside the collective.
Keeping at most a couple of steps in flight still overlaps the host's batch
preparation with device work, and avoids that.
"""

from __future__ import annotations

import collections
from typing import Any

import jax

DEFAULT_MAX_IN_FLIGHT = 2


class DispatchLimiter:
  """Waits for the oldest step once more than ``max_in_flight`` are queued."""

  def __init__(self, max_in_flight: int = DEFAULT_MAX_IN_FLIGHT):
    if max_in_flight < 1:
      raise ValueError(f"max_in_flight must be >= 1, got {max_in_flight}")
    self.max_in_flight = max_in_flight
    self._queued: collections.deque[Any] = collections.deque()

  def dispatched(self, output: Any) -> None:
    """Records a step by one of its (small) outputs; may block on an older one."""
    self._queued.append(output)
    while len(self._queued) > self.max_in_flight:
      jax.block_until_ready(self._queued.popleft())
