"""n-softsync, async and drop-stale: the server applies gradients in arrival order.

n-softsync (Zhang et al., arXiv 1511.05950, §3; Rudra, arXiv 1509.04210): the
server applies an update as soon as c = floor(lambda / n) gradients have
arrived, from any learners, with no barrier:

    w <- w - (1/c) sum_{k=1..c} alpha(sigma_k) g_k.

Every pull is answered at once, so each learner's next gradient is computed
while about lambda other gradients arrive, i.e. about lambda / c = n updates:
<sigma> ~ n, and 1-softsync gives sigma in {0, 1, 2}. n = lambda (c = 1) is
asynchronous SGD (Downpour; Dean et al., NIPS 2012).

Drop-stale (TensorFlow's ``DropStaleGradientOptimizer``): the same server
discards a gradient whose staleness on arrival exceeds ``max_staleness``; the
learner pulls the newest weights and carries on. A gradient's staleness on
arrival is the staleness it would be applied with, because it joins the update
being formed at the current timestamp.
"""

from __future__ import annotations

from collections.abc import Sequence

from stalesgd.schedule._parameter_server import ServerRule


class ArrivalOrderServer(ServerRule):
  """Applies every c arriving gradients as one update; optionally drops stale ones.

  Args:
    learners: lambda.
    n: softsync parameter, 1 <= n <= learners; c = floor(learners / n).
    max_staleness: discard gradients with sigma > max_staleness (None: keep all).
  """

  def __init__(self, learners: int, n: int, max_staleness: int | None = None):
    super().__init__(learners, contributions=learners // n)
    self._max_staleness = max_staleness
    self._pending: list[tuple[int, int, int]] = []

  def receive(self, learner: int, timestamp: int, batch_index: int) -> Sequence[int]:
    if self._max_staleness is not None and self.updates - timestamp > self._max_staleness:
      self._drop(learner, timestamp, batch_index)
      return (learner,)
    self._pending.append((learner, timestamp, batch_index))
    if len(self._pending) == self.contributions:
      self._apply(self._pending)
      self._pending = []
    return (learner,)
