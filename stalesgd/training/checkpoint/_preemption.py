"""`PreemptionGuard`: a SIGTERM guard for preemptible jobs, agreed on by all processes.

The guard turns SIGTERM (what SLURM, Kubernetes and cloud schedulers send before killing a job) into a flag
the training loop polls at its "is it time?" checks; the loop then saves and returns, and the program exits
with status 75 (`stalesgd.training.PREEMPTED_EXIT_STATUS`). On several processes the decision to stop must be
the same everywhere, or one process would wait forever in a collective save the others never start; see
`PreemptionGuard` for how that is agreed.
"""

from __future__ import annotations

import signal
import types
from collections.abc import Callable, Sequence
from typing import Any

from stalesgd.training.checkpoint._agreement import any_process

SignalHandler = Callable[[int, types.FrameType | None], Any] | int | None


class PreemptionGuard:
  """Context manager that turns termination signals into a flag the loop polls.

  Example::

    with PreemptionGuard() as guard:
      for step in range(first_step, num_steps):
        state = train_step(state)
        if guard.should_stop(step):
          checkpointer.save(step, state, metadata, force=True)
          checkpointer.wait()
          return  # and the program exits with status 75 (preempted)

  How the stop decision is made: Python handlers for ``signals`` set a flag
  on the process that receives one; ``should_stop`` returns it, OR-ed over all
  processes (`stalesgd.training.checkpoint._agreement.any_process`: one small collective
  per call when there are several, so every process must call it at the same
  steps). The previous handlers are restored on exit.

  JAX's own preemption service (on by default in `jax.distributed.initialize`)
  is deliberately not used: it agrees on one sync step and answers True only
  when ``should_stop`` is called with exactly that step, but orbax's
  checkpoint manager queries the same service with its own step numbers (the
  server's update count, which jumps by a whole block per call in the engine),
  so the two sequences mixed and the sync point was missed: a SIGTERM'd
  multi-process parameter-server run trained on to the end. The guard's
  handlers replace JAX's for as long as the guard is active, so JAX never sees
  the notice and orbax never reports a preemption of its own.
  """

  def __init__(self, signals: Sequence[int] = (signal.SIGTERM,)):
    """Prepares the guard; handlers are installed by ``__enter__``.

    Args:
      signals: the signals that request a stop, e.g. also ``signal.SIGUSR1``
        for SLURM's ``--signal=USR1@120`` early warning.

    Raises:
      ValueError: if ``signals`` is empty or holds something that is not a
        catchable signal.
    """
    signals = tuple(signals)
    if not signals:
      raise ValueError("signals = (); allowed: a non-empty sequence of signal numbers")
    catchable = set(signal.valid_signals()) - {signal.SIGKILL, signal.SIGSTOP}
    for signal_number in signals:
      if signal_number not in catchable:
        raise ValueError(
          f"signals contains {signal_number!r}; allowed: catchable signals such as "
          "signal.SIGTERM, signal.SIGUSR1 (not SIGKILL or SIGSTOP)"
        )
    self._signals = signals
    self._received: int | None = None
    self._previous_handlers: dict[int, SignalHandler] = {}
    self._active = False

  @property
  def received_signal(self) -> int | None:
    """The signal this process received (None if none)."""
    return self._received

  def __enter__(self) -> PreemptionGuard:
    if self._active:
      raise RuntimeError("PreemptionGuard is already active; it cannot be entered twice")
    for signal_number in self._signals:
      self._previous_handlers[signal_number] = signal.signal(signal_number, self._handle)
    self._active = True
    return self

  def __exit__(self, *exc_info: object) -> None:
    for signal_number, handler in self._previous_handlers.items():
      # getsignal returns None for a handler installed outside Python; the
      # closest Python can restore is the default action.
      signal.signal(signal_number, signal.SIG_DFL if handler is None else handler)
    self._previous_handlers.clear()
    self._active = False

  def should_stop(self, step: int) -> bool:
    """Whether the loop should save and exit now.

    Args:
      step: the current step; all processes must call this at the same
        steps (it is part of the call's contract, not used to decide).

    Returns:
      True if a stop was requested (on any process, when there are several).

    Raises:
      RuntimeError: if the guard is not active (use it as a context manager).
    """
    if not self._active:
      raise RuntimeError("PreemptionGuard.should_stop called outside its `with` block")
    del step
    return any_process(self._received is not None)

  def _handle(self, signal_number: int, frame: types.FrameType | None) -> None:
    del frame  # The loop reacts at its next check; nothing to do here.
    self._received = signal_number
