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
  """Compute seconds of every learner's consecutive contributions.

  Step k of learner p lasts ``compute_time * speed_factor[p] * jitter[p, k]``
  (a per-step trace replaces the speed factor by ``trace[k % steps, p]``); see
  `TimingModel`. A contribution of H local steps (``local_steps``) lasts the
  sum of its H consecutive step times: learner p's r-th contribution covers its
  steps r H, ..., r H + H - 1, added left to right (with H = 1, step r itself).
  """

  def __init__(self, timing: TimingModel, learners: int, seed: int, *, local_steps: int | np.ndarray = 1):
    """``local_steps``: H for every learner, or one H_m per learner (dynamic local updates)."""
    self._timing = timing
    self._seed = seed
    self._local_steps = np.broadcast_to(np.asarray(local_steps, np.int64), (learners,))
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

  def _steps(self, learner: int) -> Iterator[float]:
    return itertools.chain.from_iterable(block.tolist() for block in self._blocks(learner))

  def stream(self, learner: int) -> Iterator[float]:
    """An iterator over the learner's contribution times as Python floats (for event loops)."""
    steps, group = self._steps(learner), int(self._local_steps[learner])
    return (_sum_left_to_right(steps, group) for _ in itertools.repeat(None))

  def first(self, learner: int, count: int) -> np.ndarray:
    """The learner's first ``count`` contribution times, float64 [count] (vectorised; the same sums as `stream`)."""
    group = int(self._local_steps[learner])
    needed = -(-count * group // BLOCK_STEPS)
    blocks = self._blocks(learner)
    steps = np.concatenate([next(blocks) for _ in range(needed)])[: count * group] if count else np.zeros(0)
    steps = steps.reshape(count, group)
    total = steps[:, 0].copy()
    for column in range(1, group):  # left to right, as `stream` adds them
      total += steps[:, column]
    return total


def dynamic_local_steps(timing: TimingModel, learners: int, seed: int, local_steps: int, min_steps: int) -> np.ndarray:
  """Dynamic local updates (Liu et al., arXiv 2401.09135; DeepMind's asynchronous DiLoCo notebook): learner m's
  local run has H_m = max(floor(H v_m / v_max), H_min) steps, v_m its mean simulated speed, here the inverse of its
  speed factor (the jitter has mean 1), so the fastest learner runs H. int64 [learners].

  Computed in floats as the notebook does, H * (f_min / f_m) truncated: for factors 0.3 and 0.8 and H = 48 that is
  17 (48 * 0.375 = 17.999999999999996), where H * (1 / f_m) / (1 / f_min) would give 18.
  """
  factors = timing.speed_factors_for(learners, seed)
  return np.maximum(np.floor(local_steps * (factors.min() / factors)).astype(np.int64), min_steps)


def _sum_left_to_right(steps: Iterator[float], count: int) -> float:
  """The next ``count`` values of an endless ``steps``, added in order (one value: itself)."""
  total = next(steps)
  for _ in range(count - 1):
    total += next(steps)
  return total
