"""Per-step compute times, drawn in blocks from one seeded stream per learner.

Learner p's k-th compute time is a pure function of (timing model, seed, p, k):
each learner draws from its own generator in fixed-size blocks, so the value
does not depend on the protocol, on how many learners there are, or on the
order in which the simulator asks. Comparing protocols under the same seed
therefore compares them on the same realised step times.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np

from stalesgd.schedule._timing import TimingModel

# Steps drawn per call to the generator: large enough that drawing is
# vectorised, small enough that thousands of learners stay cheap in memory.
BLOCK_STEPS = 1024


class StepDurations:
  """Compute seconds of every learner's consecutive mini-batches.

  ``compute_time * speed_factor[p] * jitter[p, k]`` (a per-step trace replaces
  the speed factor by ``trace[k % steps, p]``); see `TimingModel`.
  """

  def __init__(self, timing: TimingModel, learners: int, seed: int):
    self._timing = timing
    self._seed = seed
    self._scales = timing.compute_time * timing.speed_factors_for(learners, seed)
    self._per_step_trace = timing.per_step_trace(learners)

  def _blocks(self, learner: int) -> Iterator[np.ndarray]:
    """Yields learner ``learner``'s step times, ``BLOCK_STEPS`` at a time."""
    generator = self._timing.step_generator(learner, self._seed)
    for block in itertools.count():
      seconds = self._scales[learner] * self._timing.draw_jitter(generator, BLOCK_STEPS)
      if self._per_step_trace is not None:
        steps = np.arange(block * BLOCK_STEPS, (block + 1) * BLOCK_STEPS) % self._per_step_trace.shape[0]
        seconds = seconds * self._per_step_trace[steps, learner]
      yield seconds

  def stream(self, learner: int) -> Iterator[float]:
    """An iterator over the learner's step times as Python floats (for event loops)."""
    return itertools.chain.from_iterable(block.tolist() for block in self._blocks(learner))

  def first(self, learner: int, count: int) -> np.ndarray:
    """The learner's first ``count`` step times, float64 [count]."""
    blocks = self._blocks(learner)
    needed = -(-count // BLOCK_STEPS)
    return np.concatenate([next(blocks) for _ in range(needed)])[:count] if count else np.zeros(0)
