"""Grouping a `Schedule` into blocks: the unit of parallel work of the engine.

A gradient applied by update u was computed at the weights of an earlier
timestamp j <= u. At the start of update u0, every w_j with j <= u0 exists, so
all contributions of the updates u0, u0+1, ..., u1-1 whose timestamps are all
<= u0 can be computed at once, in one parallel pass; the updates are then
applied in order (docs/design.md, *Engine*). Such a run of updates is a *block*.

Blocks are contiguous and chosen greedily: a block starting at u0 extends while
the next update's newest timestamp is <= u0 and the block has fewer than
``rows_per_block`` updates. Greedy is optimal for this constraint (if [a, b) is
a valid block, so is [a', b) for every a' in [a, b)), so it yields the fewest
blocks for a given width. Shapes are fixed per plan (``rows_per_block`` x c
contribution slots, padded to a multiple of the number of devices) so the
engine compiles once; unused rows and slots are masked.

The width is chosen by cost: the engine computes every slot, valid or not, so
the plan picks ``rows_per_block`` minimising (number of blocks x (padded slots +
a one-slot overhead per block)), i.e. the number of gradients computed, over a
prefix of the schedule.

Required boundaries (``plan_blocks(..., boundaries=)``): updates at which a block must start, so that no block
spans them; the training loop gives the updates after which it evaluates, so an evaluation sees the weights of
exactly its update, not of the end of the block that crosses it. A block stops early at a boundary and the
next one starts there (greedy again); the width is still chosen on the schedule alone, so boundaries change
neither the shapes nor the compiled program, only how many rows of some blocks are masked. Any block may be
split at any update (`BlockPlan.split_at`): its two parts satisfy the constraint above, as it did.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

import numpy as np

from stalesgd.schedule._schedule_arrays import Schedule

# Rows-per-block candidates are scored on at most this many updates: schedules are
# stationary, and scoring the whole of a 10^6-update schedule would be slow.
_SCORING_PREFIX_UPDATES = 50_000
# Each block also costs a dispatch and a sequential apply pass; counted as this
# many gradient slots, it makes the planner prefer fewer, wider blocks on ties.
_BLOCK_OVERHEAD_SLOTS = 1


@dataclasses.dataclass(frozen=True)
class Block:
  """Fixed-shape inputs of one block (host numpy arrays).

  Attributes:
    index: block number within the plan.
    first_update: server timestamp u0 of the block's first update.
    num_updates: number of real (unmasked) updates in the block.
    row_valid: bool [R], which of the R update rows are real.
    timestamp: int32 [R, c], timestamp of the weights of each contribution.
    staleness: int32 [R, c], its staleness u - j.
    learner: int32 [R, c], the learner that produced it.
    batch_index: int64 [R, c], that learner's mini-batch index k.
    slot_timestamp: int32 [S], timestamps of the S gradient slots (R*c rows
      flattened, then padding up to a multiple of the device count; padding
      slots reuse u0 so they read weights that exist).
    slot_learner: int32 [S] and slot_batch_index: int64 [S], likewise.
    slot_data_stream, slot_data_offset: int64 [S] each, likewise from the
      schedule's data shards (`Schedule.data_stream`), or None without them.
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
  slot_data_stream: np.ndarray | None = None
  slot_data_offset: np.ndarray | None = None


@dataclasses.dataclass(frozen=True, eq=False)
class BlockPlan:
  """A schedule cut into blocks of fixed shape.

  Attributes:
    schedule: the schedule being executed.
    rows_per_block: R, the number of update rows of every block.
    slots_per_block: S >= R*c, gradient slots per block (a multiple of the
      number of devices the plan was made for).
    block_starts: int64 [W+1], first update of each block, then num_updates.
  """

  schedule: Schedule
  rows_per_block: int
  slots_per_block: int
  block_starts: np.ndarray

  @property
  def num_blocks(self) -> int:
    return int(self.block_starts.shape[0] - 1)

  @property
  def contributions_per_update(self) -> int:
    return self.schedule.contributions_per_update

  @property
  def slot_utilisation(self) -> float:
    """Fraction of computed gradient slots that are applied contributions."""
    applied = self.schedule.num_updates * self.contributions_per_update
    return applied / max(1, self.num_blocks * self.slots_per_block)

  def split_at(self, update: int) -> BlockPlan:
    """This plan with a block starting at ``update``: the block that holds it cut in two (itself when one starts
    there). Both parts are valid blocks (a part of a block computes at weights that exist at its start), of the
    same fixed shape; the other blocks stay as they are. A run resumed from a checkpoint at ``update`` (written
    under another plan, whose blocks ended elsewhere) continues on the split plan.

    Raises:
      ValueError: ``update`` is outside [0, num_updates].
    """
    num_updates = self.schedule.num_updates
    if not 0 <= update <= num_updates:
      raise ValueError(f"update={update} is outside this plan's updates [0, {num_updates}]")
    starts = self.block_starts
    index = int(np.searchsorted(starts, update))
    if starts[index] == update:
      return self
    return dataclasses.replace(self, block_starts=np.insert(starts, index, update).astype(np.int64))

  def block_of_update(self, update: int) -> int:
    """Index of the block that starts at ``update`` (`num_blocks` at the end); raises if none does."""
    return block_starting_at(self.block_starts, update)

  def block(self, index: int) -> Block:
    """The fixed-shape inputs of block ``index``."""
    if not 0 <= index < self.num_blocks:
      raise IndexError(f"block index {index} out of range [0, {self.num_blocks})")
    schedule = self.schedule
    first, stop = int(self.block_starts[index]), int(self.block_starts[index + 1])
    rows, contributions = self.rows_per_block, self.contributions_per_update
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

    padding = self.slots_per_block - rows * contributions
    slot_timestamp = np.concatenate([timestamp.reshape(-1), np.full(padding, first, np.int32)])
    slot_learner = np.concatenate([learner.reshape(-1), np.zeros(padding, np.int32)])
    slot_batch_index = np.concatenate([batch_index.reshape(-1), np.zeros(padding, np.int64)])
    data = {}
    if schedule.data_stream is not None:
      for name, column in (("slot_data_stream", schedule.data_stream), ("slot_data_offset", schedule.data_offset)):
        rows_of = np.zeros((rows, contributions), dtype=np.int64)
        rows_of[:count] = column[first:stop]
        data[name] = np.concatenate([rows_of.reshape(-1), np.zeros(padding, np.int64)])
    return Block(
      index,
      first,
      count,
      row_valid,
      timestamp,
      staleness,
      learner,
      batch_index,
      slot_timestamp,
      slot_learner,
      slot_batch_index,
      **data,
    )


def block_starting_at(starts: np.ndarray, update: int) -> int:
  """Index i with ``starts[i] == update`` in increasing block starts (the last entry
  is the end, so ``update == starts[-1]`` gives the number of blocks: all done).

  Raises:
    ValueError: ``update`` is inside a block; a run can only stop and resume at
      block boundaries, so this means the schedule or plan changed.
  """
  index = int(np.searchsorted(starts, update))
  if index >= starts.shape[0] or starts[index] != update:
    raise ValueError(
      f"update={update} is not the first update of a block of this plan; a run can only stop and resume at "
      "block boundaries, so the schedule or plan differs from the one the run was saved with"
    )
  return index


def previous_update_of_learner(schedule: Schedule) -> np.ndarray:
  """For every update u, the latest earlier update to which one of u's learners also contributed (-1 if none).

  Raises:
    ValueError: a learner contributes twice to one update, so its second local run would start from the inner
      state its first leaves, inside one block.
  """
  learners = schedule.learner.reshape(-1)
  contributions = schedule.contributions_per_update
  order = np.argsort(learners, kind="stable")  # by learner, then by position (update-major)
  same = learners[order[1:]] == learners[order[:-1]]
  previous = np.full(learners.shape[0], -1, np.int64)
  previous[order[1:][same]] = order[:-1][same]
  previous_update = np.where(previous >= 0, previous // contributions, -1).reshape(schedule.learner.shape)
  update = np.arange(schedule.num_updates)
  twice = np.flatnonzero((previous_update == update[:, None]).any(axis=1))
  if twice.size:
    raise ValueError(
      f"update {int(twice[0])} applies two contributions of one learner, whose second local run starts from the "
      "inner state the first leaves; with an inner state kept across contributions such a schedule cannot be "
      "executed in blocks: reset the inner state every local run (config.inner.reset_state=True), use a "
      "stateless inner optimizer (SGD without momentum), or a protocol where a learner contributes at most once "
      "per update (hardsync, async, ssp)"
    )
  return previous_update.max(axis=1)


def unbounded_block_ends(schedule: Schedule, *, distinct_learners: bool = False) -> np.ndarray:
  """For every u0, the first update a block starting at u0 cannot include.

  L(u0) = min{u > u0 : max_j timestamp[u] > u0} (or num_updates); with
  ``distinct_learners`` also the first u > u0 one of whose learners already
  contributed to an update in [u0, u) (`previous_update_of_learner`). Computed by
  advancing all u0 at once, one update per iteration, so the number of
  iterations is the longest possible block, not the schedule length.
  """
  num_updates = schedule.num_updates
  newest = schedule.timestamp.max(axis=1)
  if distinct_learners:
    # Update u may join a block starting at u0 only if its learners' previous contributions precede u0: the
    # same condition as for timestamps, so it folds into them.
    newest = np.maximum(newest, previous_update_of_learner(schedule) + 1)
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


def _greedy_starts(reach: np.ndarray, rows_per_block: int, boundaries: np.ndarray | None = None) -> np.ndarray:
  """Greedy block starts; a block also ends at the next of the increasing ``boundaries`` (if any) after its start."""
  num_updates = reach.shape[0]
  starts = []
  update = 0
  cut = 0  # index of the first boundary > update
  while update < num_updates:
    starts.append(update)
    end = min(int(reach[update]), update + rows_per_block)
    if boundaries is not None:
      while cut < boundaries.shape[0] and boundaries[cut] <= update:
        cut += 1
      if cut < boundaries.shape[0]:
        end = min(end, int(boundaries[cut]))
    update = end
  starts.append(num_updates)
  return np.asarray(starts, dtype=np.int64)


def _required_boundaries(boundaries, num_updates: int) -> np.ndarray:
  """The increasing distinct updates in (0, num_updates) of ``boundaries`` (0 and the end are always boundaries)."""
  values = np.asarray(boundaries, dtype=np.int64).reshape(-1)
  return np.unique(values[(values > 0) & (values < num_updates)])


def _padded_slots(rows: int, contributions: int, num_devices: int) -> int:
  slots = rows * contributions
  return -(-slots // num_devices) * num_devices


def plan_blocks(
  schedule: Schedule,
  *,
  num_devices: int = 1,
  rows_per_block: int | None = None,
  max_slots_per_device: int | None = 32,
  distinct_learners: bool = False,
  boundaries: Sequence[int] | np.ndarray = (),
) -> BlockPlan:
  """Cuts ``schedule`` into fixed-shape blocks for ``num_devices`` devices.

  Args:
    schedule: the schedule to execute.
    num_devices: size of the engine's learner mesh axis; slots are padded to a
      multiple of it.
    rows_per_block: update rows per block; by default the value that minimises
      the number of gradient slots computed (valid or padding).
    max_slots_per_device: upper bound on the gradient slots one device computes
      per block when ``rows_per_block`` is chosen automatically (each slot is an
      unrolled gradient call, so this bounds compile time); None for no bound.
    distinct_learners: a block holds at most one contribution per learner
      (the engine asks for it when learners keep an inner state between local
      runs).
    boundaries: updates at which a block must start (no block spans one), e.g. the updates after which the
      training loop evaluates (`stalesgd.training._config_readers.evaluation_updates`); values <= 0 or >=
      the schedule's updates are ignored. The width (``rows_per_block``, by default) is chosen without them, so
      they do not change the blocks' shapes.

  Returns:
    The `BlockPlan`.
  """
  if num_devices < 1:
    raise ValueError(f"num_devices must be >= 1, got {num_devices}")
  if schedule.num_updates == 0:
    raise ValueError("the schedule has no updates (num_updates == 0)")
  contributions = schedule.contributions_per_update
  reach = unbounded_block_ends(schedule, distinct_learners=distinct_learners)
  if rows_per_block is None:
    rows_per_block = _best_rows_per_block(reach, contributions, num_devices, max_slots_per_device)
  elif rows_per_block < 1:
    raise ValueError(f"rows_per_block must be >= 1, got {rows_per_block}")
  return BlockPlan(
    schedule=schedule,
    rows_per_block=rows_per_block,
    slots_per_block=_padded_slots(rows_per_block, contributions, num_devices),
    block_starts=_greedy_starts(reach, rows_per_block, _required_boundaries(boundaries, schedule.num_updates)),
  )


def _best_rows_per_block(
  reach: np.ndarray, contributions: int, num_devices: int, max_slots_per_device: int | None
) -> int:
  prefix = reach[:_SCORING_PREFIX_UPDATES]
  prefix = np.minimum(prefix, prefix.shape[0])
  longest = int((prefix - np.arange(prefix.shape[0])).max())
  limit = longest
  if max_slots_per_device is not None:
    fits = max(1, (max_slots_per_device * num_devices) // contributions)
    limit = max(1, min(limit, fits))
  best_rows, best_cost = 1, None
  for rows in range(1, limit + 1):
    blocks = _greedy_starts(prefix, rows).shape[0] - 1
    cost = blocks * (_padded_slots(rows, contributions, num_devices) + _BLOCK_OVERHEAD_SLOTS)
    if best_cost is None or cost < best_cost:
      best_rows, best_cost = rows, cost
  return best_rows
