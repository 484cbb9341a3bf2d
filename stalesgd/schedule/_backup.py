"""Synchronous SGD with b backup workers (Chen et al., arXiv 1604.00981).

The server runs hardsync rounds but applies update u as soon as lambda - b
gradients computed at w_u have arrived (c = lambda - b, in arrival order); the
b slowest gradients of the round arrive later, are stale, and are dropped
(recorded in the schedule's ``dropped_*`` arrays), as TensorFlow's
``SyncReplicasOptimizer`` does with ``replicas_to_aggregate = lambda - b``.

Learners: a learner whose gradient was accepted waits for the round's update,
then pulls (the barrier of hardsync). A slow learner is not interrupted: it
finishes its gradient, which is dropped on arrival, and its pull is answered
at once with the newest weights, so it joins the round in progress late and
may make that round's cut. b = 0 is hardsync exactly.
"""

from __future__ import annotations

from collections.abc import Sequence

from stalesgd.schedule._parameter_server import ServerRule


class BackupWorkerServer(ServerRule):
  """Hardsync rounds that close after lambda - b fresh gradients.

  Args:
    learners: lambda.
    backup: b, the number of gradients per round that are not waited for.
  """

  def __init__(self, learners: int, backup: int):
    super().__init__(learners, contributions=learners - backup)
    self._round: list[tuple[int, int, int]] = []
    self._waiting: list[int] = []

  def receive(self, learner: int, timestamp: int, batch_index: int) -> Sequence[int]:
    if timestamp < self.updates:  # computed at weights a closed round replaced
      self._drop(learner, timestamp, batch_index)
      return (learner,)
    self._round.append((learner, timestamp, batch_index))
    if len(self._round) < self.contributions:
      self._waiting.append(learner)
      return ()
    self._apply(self._round)
    released = self._waiting + [learner]
    self._round, self._waiting = [], []
    return released
