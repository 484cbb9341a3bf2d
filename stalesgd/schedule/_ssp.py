"""Stale synchronous parallel (SSP) with bound s, and hardsync as SSP with s = 0.

SSP (Ho et al., "More Effective Distributed ML via a Stale Synchronous Parallel
Parameter Server", NIPS 2013): each learner has a clock, the number of
gradients it has pushed; a learner may start its gradient of clock k only
when the slowest learner's clock is at least k - s, so no learner leads the
slowest by more than s clocks, and every read includes all updates from clocks
older than k - s.

Convention (chosen here; the paper leaves the server's aggregation open): the
server applies one update per clock. Update k averages every learner's k-th
gradient (c = lambda, in arrival order) and is applied when the last of them
arrives. The server timestamp is then the slowest learner's clock, so a
gradient of clock k is computed at a timestamp j >= k - s and applied by
update k: Rudra's staleness sigma = k - j is exactly the SSP clock lag and
sigma <= s. Why not apply each gradient on arrival (c = 1) as Bösen does:
then sigma would count single gradients, not clocks, and s = 0 would give
sigma = 0..lambda-1 within a round instead of hardsync's sigma = 0, which
would misdirect staleness-aware learning rates. With this convention s = 0 is
hardsync exactly (same arrays, same times) and s -> infinity is
clock-ordered asynchrony.

hardsync (Rudra): the server waits for one gradient from every learner at the
current timestamp, w <- w - alpha (1/lambda) sum_l g_l; sigma = 0; identical to
SGD with batch mu * lambda. It is `StaleSynchronousServer` with ``s = 0``.
"""

from __future__ import annotations

from collections.abc import Sequence

from stalesgd.schedule._parameter_server import ServerRule


class StaleSynchronousServer(ServerRule):
  """One update per clock; a learner waits while it leads the slowest by more than s.

  Args:
    learners: lambda.
    s: staleness bound in clocks (0 is hardsync).
  """

  def __init__(self, learners: int, s: int):
    super().__init__(learners, contributions=learners)
    self._bound = s
    # Gradients of clocks whose update is still missing somebody's gradient.
    self._clock_buffers: dict[int, list[tuple[int, int, int]]] = {}
    self._waiting: list[tuple[int, int]] = []  # (learner, clock it wants to start)

  def arrivals_between_updates(self) -> int:
    """With u updates applied, a learner may push clocks u to u + s only: at most lambda (s + 1) arrivals."""
    return self.learners * (self._bound + 1)

  def receive(self, learner: int, timestamp: int, batch_index: int) -> Sequence[int]:
    clock = batch_index  # a learner's k-th gradient belongs to its clock k
    buffer = self._clock_buffers.setdefault(clock, [])
    buffer.append((learner, timestamp, batch_index))
    released: list[int] = []
    if len(buffer) == self.learners:
      # Per-learner arrivals are in order, so clock `clock` completes only
      # after every earlier clock: updates stay in clock order.
      del self._clock_buffers[clock]
      self._apply(buffer)
      released = self._release_waiting()
    if clock + 1 <= self.updates + self._bound:
      released.append(learner)
    else:
      self._waiting.append((learner, clock + 1))
    return released

  def _release_waiting(self) -> list[int]:
    """Learners whose next clock is within the bound of the new slowest clock."""
    limit = self.updates + self._bound
    released = [learner for learner, clock in self._waiting if clock <= limit]
    self._waiting = [(learner, clock) for learner, clock in self._waiting if clock > limit]
    return released
