"""How many host devices a CPU run should emulate its learners on.

On a CPU backend JAX's device count is a knob (``JAX_NUM_CPU_DEVICES``): every
device is a share of the same cores, and the engine's results do not depend on
it (the same weights bit for bit on 1 or 8 devices; `tests/engine`). What it
changes is speed. A block computes about lambda gradients (one per learner of
the emulated cluster), and this module gives each device about
`SLOTS_PER_DEVICE` of them, the count that ran fastest in
`experiments.benchmarks.layout` (its figures, per protocol, lambda and device
count: `results/layout_benchmark.json`). Fewer learners than that per device
leave devices idle in every collective; more make each device's program
slower per gradient.

Decentralized protocols (all-reduce SGD, S3GD, DC-S3GD, DiLoCo) need one device
per learner, so they get ``learners`` devices; in a one-process run with more
devices (a study's 8) they use the first M (`runner_mesh`): each learner's
program runs on its own device, so the bits do not depend on the devices left
idle.

A single learner (lambda = 1) in a process with more devices
(``stalesgd-reproduce`` gives every run of a study 8) trains and evaluates on
the first device only (`runner_mesh`). On 8 devices the engine padded its one
gradient slot per update to 8 and computed all of them, 5x slower per image;
on one device the weights are the same bit for bit (one gradient, and
element-wise server updates whose parameter sharding does not change their
values; `tests/training/test_device_layout.py`). With lambda >= 2 the average
over a stack of contributions is laid out by the device count, which can move
the last bits, so those runs keep every device (a study's runs then compute
the same bits whatever runs beside them).
"""

from __future__ import annotations

import jax
import ml_collections

from stalesgd.parallel import _sharding as sharding_lib
from stalesgd.training._config_readers import is_decentralized

SLOTS_PER_DEVICE = 4
MAX_CPU_DEVICES = 8  # the most results/layout_benchmark.json tries; more cores may want more


def cpu_device_count(config: ml_collections.ConfigDict) -> int:
  """The number of host devices for ``config`` on a CPU: a power of two in [1, 8], or ``learners``."""
  if is_decentralized(config):
    return int(config.learners)
  wanted = -(-int(config.learners) // SLOTS_PER_DEVICE)  # ceil(lambda / 4)
  count = 1
  while count < min(wanted, MAX_CPU_DEVICES):  # the smallest power of two that holds them, at most 8
    count *= 2
  return count


def runner_mesh(config: ml_collections.ConfigDict, mesh: jax.sharding.Mesh) -> jax.sharding.Mesh:
  """The devices a run trains and evaluates on: the first device of ``mesh`` for a single learner on a one-process
  CPU run (the same weights as on all of them, see the module docstring), else ``mesh``."""
  devices = list(mesh.devices.flat)
  if is_decentralized(config) and jax.process_count() == 1 and config.learners < len(devices):
    return sharding_lib.learner_mesh(mesh.axis_names[0], devices[: config.learners])
  single = not is_decentralized(config) and config.learners == 1
  if not single or jax.process_count() > 1 or devices[0].platform != "cpu" or len(devices) == 1:
    return mesh
  return sharding_lib.learner_mesh(mesh.axis_names[0], devices[:1])
