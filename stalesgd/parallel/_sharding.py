"""The learners' mesh, and global arrays from host data, the same way on one process or many.

Every protocol lays its learners out one per device along one mesh axis,
``"learners"`` (`learner_mesh`): the engine's gradient slots and the
decentralized protocols' per-learner state are split along it.

In a multi-process run a `jax.Array` spans devices of several processes; each
process may only provide the shards of its own devices. These helpers build
such arrays from host data that every process can compute (the schedule, the
weights at initialisation, an evaluation batch), and from per-process slices of
a leading axis (each process's own learners' mini-batches).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from stalesgd import _validation as validation

LEARNERS_AXIS = "learners"


def learner_mesh(axis_name: str = LEARNERS_AXIS, devices: Sequence[jax.Device] | None = None) -> Mesh:
  """A 1-D mesh with one learner per device, over all processes' devices.

  Devices are ordered by (process index, device id), so the learners of one
  process are contiguous and learner ``l`` lives on the same device in every
  run with the same topology (2 processes x 4 devices gives learners 0-3 on
  process 0 and 4-7 on process 1).

  Args:
    axis_name: the mesh axis name.
    devices: the devices to use; defaults to `jax.devices()` (all processes).

  Returns:
    A `jax.sharding.Mesh` of shape ``[len(devices)]``.
  """
  devices = list(jax.devices() if devices is None else devices)
  if not devices:
    raise ValueError("devices=[] must hold at least one device")
  devices.sort(key=lambda device: (device.process_index, device.id))
  return Mesh(np.array(devices), (axis_name,))


def global_array(host: np.ndarray, sharding: NamedSharding) -> jax.Array:
  """A global array from a host array that every process holds in full."""
  host = np.asarray(host)
  return jax.make_array_from_callback(host.shape, sharding, lambda index: host[index])


def local_row_range(sharding: NamedSharding, rows: int) -> tuple[int, int]:
  """[low, high): the rows of a leading axis of size ``rows`` this process's devices hold.

  Assumes, as a 1-D mesh ordered by process guarantees, that they are contiguous.
  """
  index_map = sharding.addressable_devices_indices_map((rows,))
  starts = [index[0].start or 0 for index in index_map.values()]
  stops = [rows if index[0].stop is None else index[0].stop for index in index_map.values()]
  return min(starts), max(stops)


def from_local_rows(local: np.ndarray, low: int, rows: int, sharding: NamedSharding) -> jax.Array:
  """A global array of ``rows`` rows, given only this process's rows ``local`` = rows[low:high]."""
  local = np.asarray(local)

  def shard(index):
    first = index[0]
    start = (first.start or 0) - low
    stop = (rows if first.stop is None else first.stop) - low
    return local[(slice(start, stop),) + tuple(index[1:])]

  return jax.make_array_from_callback((rows,) + local.shape[1:], sharding, shard)


def rows_from_batch_fn(
  batch_fn: Callable[[np.ndarray, np.ndarray], Any],
  learner: np.ndarray,
  batch_index: np.ndarray,
  sharding: NamedSharding,
) -> Any:
  """Mini-batches for rows (learner[i], batch_index[i]) as global arrays split along the rows.

  Each process calls ``batch_fn`` once, with only the rows its own devices hold,
  so no process reads another's data.
  """
  rows = learner.shape[0]
  low, high = local_row_range(sharding, rows)
  local = batch_fn(learner[low:high], batch_index[low:high])

  def to_global(leaf):
    if np.shape(leaf)[0] != high - low:
      raise ValueError(
        f"batch_fn returned a leaf with leading axis {np.shape(leaf)[0]}, expected {high - low} "
        "(one entry per requested (learner, batch_index) pair)"
      )
    return from_local_rows(leaf, low, rows, sharding)

  return jax.tree_util.tree_map(to_global, local)


def _check_one_dimensional(mesh: Mesh, axis_name: str) -> None:
  if tuple(mesh.axis_names) != (axis_name,):
    raise ValueError(f"mesh axes {tuple(mesh.axis_names)} must be exactly ({axis_name!r},)")


def mesh_learners(mesh: Mesh, axis_name: str = LEARNERS_AXIS) -> int:
  """M, the size of the mesh's ``axis_name`` axis, one learner per device along it.

  Raises:
    ValueError: naming ``axis_name`` and the mesh's axes, when the mesh has no such axis.
  """
  if axis_name not in mesh.axis_names:
    validation.reject("axis_name", axis_name, f"an axis of the mesh, one of {tuple(mesh.axis_names)}")
  return int(mesh.shape[axis_name])


def check_learners_axis(name: str, tree: Any, learners: int) -> None:
  """Refuses a tree some leaf of which has no leading learners axis of size ``learners`` (one learner per device):
  split over a mesh of fewer devices, each device would hold several learners and a per-device program, which
  reads one, would drop the rest.

  Raises:
    ValueError: naming ``name``, the leaves' shapes and the size allowed.
  """
  shapes = [jax.numpy.shape(leaf) for leaf in jax.tree.leaves(tree)]
  if any(not shape or shape[0] != learners for shape in shapes):
    validation.reject(name, shapes, f"leaves with a leading learners axis of size {learners} (one per device)")


def addressable_learners(mesh: Mesh, axis_name: str = LEARNERS_AXIS) -> list[int]:
  """The learners (positions along ``axis_name`` of a 1-D mesh) whose devices this process holds, sorted."""
  _check_one_dimensional(mesh, axis_name)
  return [learner for learner, device in enumerate(mesh.devices.flat) if device.process_index == jax.process_index()]


def stack_learners(per_learner: Callable[[int], Any], mesh: Mesh, axis_name: str = LEARNERS_AXIS) -> Any:
  """A global array ``[learners, ...]``, calling ``per_learner`` only for this process's learners.

  With data that is a pure function of (seed, learner, step), no process
  loads another's batches, and the result is identical whatever the number
  of processes.

  Args:
    per_learner: learner index -> a pytree of numpy-compatible arrays, the
      same structure, shapes and dtypes for every learner.
    mesh: a 1-D mesh such as `learner_mesh` builds.
    axis_name: the mesh axis the leading dimension is split along.

  Returns:
    The pytree with every leaf stacked to ``[learners, ...]``, a global
    `jax.Array` split along ``axis_name``.
  """
  local = addressable_learners(mesh, axis_name)
  if not local:
    raise ValueError(f"mesh holds none of process {jax.process_index()}'s devices")
  learners = np.arange(mesh.size)
  stack = lambda rows, _: jax.tree.map(
    lambda *leaves: np.stack([np.asarray(leaf) for leaf in leaves]), *[per_learner(int(learner)) for learner in rows]
  )
  return rows_from_batch_fn(stack, learners, learners, NamedSharding(mesh, PartitionSpec(axis_name)))


def local_learner_values(array: jax.Array) -> dict[int, np.ndarray]:
  """This process's rows of a ``[learners, ...]`` array split one learner per device: learner -> numpy row."""
  values = {}
  for shard in array.addressable_shards:
    rows = range(*shard.index[0].indices(array.shape[0]))
    data = np.asarray(shard.data)
    for offset, learner in enumerate(rows):
      values[learner] = data[offset]
  return values
