"""Grouping a `Schedule` into waves: the unit of parallel work of the engine.

A gradient applied by update u was computed at the weights of an earlier
timestamp j <= u. At the start of update u0, every w_j with j <= u0 exists, so
all contributions of the updates u0, u0+1, ..., u1-1 whose timestamps are all
<= u0 can be computed at once, in one parallel pass; the updates are then
applied in order (docs/design.md, *Engine*). Such a run of updates is a *wave*.

Waves are contiguous and chosen greedily: a wave starting at u0 extends while
the next update's newest timestamp is <= u0 and the wave has fewer than
``rows_per_wave`` updates. Greedy is optimal for this constraint (if [a, b) is
a valid wave, so is [a', b) for every a' in [a, b)), so it yields the fewest
waves for a given width. Shapes are fixed per plan (``rows_per_wave`` x c
contribution slots, padded to a multiple of the number of devices) so the
engine compiles once; unused rows and slots are masked.

The width is chosen by cost: the engine computes every slot, valid or not, so
the plan picks ``rows_per_wave`` minimising (number of waves x (padded slots +
a one-slot overhead per wave)), i.e. the number of gradients computed, over a
prefix of the schedule.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from stalesgd.schedule.schedule import Schedule

# Rows-per-wave candidates are scored on at most this many updates: schedules are
# stationary, and scoring the whole of a 10^6-update schedule would be slow.
_SCORING_PREFIX_UPDATES = 50_000
# Each wave also costs a dispatch and a sequential apply pass; counted as this
# many gradient slots, it makes the planner prefer fewer, wider waves on ties.
_WAVE_OVERHEAD_SLOTS = 1


@dataclasses.dataclass(frozen=True)
class Wave:
  """Fixed-shape inputs of one wave (host numpy arrays).

  Attributes:
    index: wave number within the plan.
    first_update: server timestamp u0 of the wave's first update.
    num_updates: number of real (unmasked) updates in the wave.
    row_valid: bool [R], which of the R update rows are real.
    timestamp: int32 [R, c], timestamp of the weights of each contribution.
    staleness: int32 [R, c], its staleness u - j.
    learner: int32 [R, c], the learner that produced it.
    batch_index: int64 [R, c], that learner's mini-batch index k.
    slot_timestamp: int32 [S], timestamps of the S gradient slots (R*c rows
      flattened, then padding up to a multiple of the device count; padding
      slots reuse u0 so they read weights that exist).
    slot_learner: int32 [S] and slot_batch_index: int64 [S], likewise.
  """

  index: int
  first_update: int
  num_updates: int
  row_valid: np.ndarray
  timestamp: np.ndarray
  staleness: np.ndarray
  learner: np.ndarray
  batch_index: np.ndarray
  slot_timestamp: np.ndarray
  slot_learner: np.ndarray
  slot_batch_index: np.ndarray


@dataclasses.dataclass(frozen=True, eq=False)
class WavePlan:
  """A schedule cut into waves of fixed shape.

  Attributes:
    schedule: the schedule being executed.
    rows_per_wave: R, the number of update rows of every wave.
    slots_per_wave: S >= R*c, gradient slots per wave (a multiple of the
      number of devices the plan was made for).
    wave_starts: int64 [W+1], first update of each wave, then num_updates.
  """

  schedule: Schedule
  rows_per_wave: int
  slots_per_wave: int
  wave_starts: np.ndarray

  @property
  def num_waves(self) -> int:
    return int(self.wave_starts.shape[0] - 1)

  @property
  def contributions_per_update(self) -> int:
    return self.schedule.contributions_per_update

  @property
  def slot_utilisation(self) -> float:
    """Fraction of computed gradient slots that are applied contributions."""
    applied = self.schedule.num_updates * self.contributions_per_update
    return applied / max(1, self.num_waves * self.slots_per_wave)

  def wave_of_update(self, update: int) -> int:
    """Index of the wave that starts at ``update`` (`num_waves` at the end); raises if none does."""
    return block_starting_at(self.wave_starts, update)

  def wave(self, index: int) -> Wave:
    """The fixed-shape inputs of wave ``index``."""
    if not 0 <= index < self.num_waves:
      raise IndexError(f"wave index {index} out of range [0, {self.num_waves})")
    schedule = self.schedule
    first, stop = int(self.wave_starts[index]), int(self.wave_starts[index + 1])
    rows, contributions = self.rows_per_wave, self.contributions_per_update
    count = stop - first

    row_valid = np.zeros(rows, dtype=bool)
    row_valid[:count] = True
    timestamp = np.full((rows, contributions), first, dtype=np.int32)
    timestamp[:count] = schedule.timestamp[first:stop]
    learner = np.zeros((rows, contributions), dtype=np.int32)
    learner[:count] = schedule.learner[first:stop]
    batch_index = np.zeros((rows, contributions), dtype=np.int64)
    batch_index[:count] = schedule.batch_index[first:stop]
    staleness = np.zeros((rows, contributions), dtype=np.int32)
    staleness[:count] = schedule.staleness_of(first, stop)

    padding = self.slots_per_wave - rows * contributions
    slot_timestamp = np.concatenate([timestamp.reshape(-1), np.full(padding, first, np.int32)])
    slot_learner = np.concatenate([learner.reshape(-1), np.zeros(padding, np.int32)])
    slot_batch_index = np.concatenate([batch_index.reshape(-1), np.zeros(padding, np.int64)])
    return Wave(index, first, count, row_valid, timestamp, staleness, learner, batch_index,
                slot_timestamp, slot_learner, slot_batch_index)


def block_starting_at(starts: np.ndarray, update: int) -> int:
  """Index i with ``starts[i] == update`` in increasing block starts (the last entry
  is the end, so ``update == starts[-1]`` gives the number of blocks: all done).

  Raises:
    ValueError: ``update`` is inside a block; a run can only stop and resume at
      block (wave) boundaries, so this means the schedule or plan changed.
  """
  index = int(np.searchsorted(starts, update))
  if index >= starts.shape[0] or starts[index] != update:
    raise ValueError(
        f"update={update} is not the first update of a wave of this plan; a run can only stop and resume at "
        "wave boundaries, so the schedule or plan differs from the one the run was saved with")
  return index


def unbounded_wave_ends(schedule: Schedule) -> np.ndarray:
  """For every u0, the first update a wave starting at u0 cannot include.

  L(u0) = min{u > u0 : max_j timestamp[u] > u0} (or num_updates). Computed by
  advancing all u0 at once, one update per iteration, so the number of
  iterations is the longest possible wave, not the schedule length.
  """
  num_updates = schedule.num_updates
  newest = schedule.timestamp.max(axis=1)
  start = np.arange(num_updates, dtype=np.int64)
  end = np.minimum(start + 1, num_updates)
  active = end < num_updates
  while active.any():
    candidates = end[active]
    extend = newest[candidates] <= start[active]
    indices = np.flatnonzero(active)
    end[indices[extend]] += 1
    still = np.zeros_like(active)
    still[indices[extend]] = True
    active = still & (end < num_updates)
  return end


def _greedy_starts(reach: np.ndarray, rows_per_wave: int) -> np.ndarray:
  num_updates = reach.shape[0]
  starts = []
  update = 0
  while update < num_updates:
    starts.append(update)
    update = min(int(reach[update]), update + rows_per_wave)
  starts.append(num_updates)
  return np.asarray(starts, dtype=np.int64)


def _padded_slots(rows: int, contributions: int, num_devices: int) -> int:
  slots = rows * contributions
  return -(-slots // num_devices) * num_devices


def plan_waves(schedule: Schedule, *, num_devices: int = 1, rows_per_wave: int | None = None,
               max_slots_per_device: int | None = 32) -> WavePlan:
  """Cuts ``schedule`` into fixed-shape waves for ``num_devices`` devices.

  Args:
    schedule: the schedule to execute.
    num_devices: size of the engine's learner mesh axis; slots are padded to a
      multiple of it.
    rows_per_wave: update rows per wave; by default the value that minimises
      the number of gradient slots computed (valid or padding).
    max_slots_per_device: upper bound on the gradient slots one device computes
      per wave when ``rows_per_wave`` is chosen automatically (each slot is an
      unrolled gradient call, so this bounds compile time); None for no bound.

  Returns:
    The `WavePlan`.
  """
  if num_devices < 1:
    raise ValueError(f"num_devices must be >= 1, got {num_devices}")
  if schedule.num_updates == 0:
    raise ValueError("the schedule has no updates (num_updates == 0)")
  contributions = schedule.contributions_per_update
  reach = unbounded_wave_ends(schedule)
  if rows_per_wave is None:
    rows_per_wave = _best_rows_per_wave(reach, contributions, num_devices, max_slots_per_device)
  elif rows_per_wave < 1:
    raise ValueError(f"rows_per_wave must be >= 1, got {rows_per_wave}")
  return WavePlan(schedule=schedule, rows_per_wave=rows_per_wave,
                  slots_per_wave=_padded_slots(rows_per_wave, contributions, num_devices),
                  wave_starts=_greedy_starts(reach, rows_per_wave))


def _best_rows_per_wave(reach: np.ndarray, contributions: int, num_devices: int,
                        max_slots_per_device: int | None) -> int:
  prefix = reach[:_SCORING_PREFIX_UPDATES]
  prefix = np.minimum(prefix, prefix.shape[0])
  longest = int((prefix - np.arange(prefix.shape[0])).max())
  limit = longest
  if max_slots_per_device is not None:
    fits = max(1, (max_slots_per_device * num_devices) // contributions)
    limit = max(1, min(limit, fits))
  best_rows, best_cost = 1, None
  for rows in range(1, limit + 1):
    waves = _greedy_starts(prefix, rows).shape[0] - 1
    cost = waves * (_padded_slots(rows, contributions, num_devices) + _WAVE_OVERHEAD_SLOTS)
    if best_cost is None or cost < best_cost:
      best_rows, best_cost = rows, cost
  return best_rows
