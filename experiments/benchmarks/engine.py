r"""Engine throughput: exact stale-gradient emulation vs synchronous training vs a naive event loop.

For the Rudra CIFAR-10 network (`cifar10_full`, 89,578 parameters) on random
data, for each protocol (async, 4-softsync) and number of learners lambda, this
measures in one process, side by side:

* ``engine_grads_per_s``: gradients applied per second by `stalesgd.engine`
  executing a simulated schedule exactly (each gradient at its own stale
  weights, with its learner's own mini-batch of mu samples);
* ``sync_grads_per_s``: plain synchronous data-parallel SGD computing the same
  number of gradients of the same batch size (one step = lambda learners x mu
  samples, split over the same devices, one gradient call per device);
* ``naive_grads_per_s``: a Python event loop applying one gradient at a time
  (a jitted gradient and a jitted optimizer step per event), as one would
  write an emulator without the wave/ring-buffer design;

and prints the ratios ``cost_ratio_vs_sync = sync / engine`` (time per gradient
relative to synchronous training; 1.0 = as cheap) and ``speedup_vs_naive``.
Timings are medians over repeated timed chunks after compilation.

Usage::

  python -m experiments.benchmarks.engine            # lambda in {8, 32, 128}
  python -m experiments.benchmarks.engine --quick    # lambda in {8, 32}, < 1 min

Writes ``results/engine_benchmark.json`` (one row per protocol and lambda, plus
the machine description). On a CPU host the script forces 8 host devices
(one learner slot group per device), the configuration the targets refer to.
"""

from __future__ import annotations

import os

# Eight host devices when running on CPU (ignored by accelerator backends); must
# be set before JAX starts.
os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")

import json
import platform
import statistics
import time

from absl import app
from absl import flags
import jax
import jax.numpy as jnp
import numpy as np
import optax

import stalesgd
from stalesgd import engine as engine_lib
from stalesgd import models
from stalesgd import schedule as schedule_lib

_QUICK = flags.DEFINE_bool("quick", False, "Small version (lambda in {8, 32}, fewer gradients), < 1 minute.")
_LEARNERS = flags.DEFINE_list("learners", None, "Override the list of learner counts.")
_BATCH_PER_LEARNER = flags.DEFINE_integer("batch_per_learner", 4, "mu, Rudra's CIFAR-10 setting.")
_OUTPUT = flags.DEFINE_string("output", "results/engine_benchmark.json", "Where to write the JSON rows.")
_REPEATS = flags.DEFINE_integer("repeats", 5, "Timed chunks per measurement (the median is reported).")

IMAGE_SHAPE = (32, 32, 3)
NUM_EXAMPLES = 4096
PROTOCOLS = (("async", {}), ("softsync", {"n": 4}))


def machine_description() -> dict:
  devices = jax.devices()
  return {
      "platform": devices[0].platform,
      "device_kind": devices[0].device_kind,
      "num_devices": len(devices),
      "host_cpus": os.cpu_count(),
      "processor": platform.processor() or platform.machine(),
      "python": platform.python_version(),
      "jax": jax.__version__,
  }


def median_rate(run_chunk, items_per_chunk: int, repeats: int) -> float:
  """Median items per second over ``repeats`` timed calls of ``run_chunk``."""
  rates = []
  for _ in range(repeats):
    start = time.perf_counter()
    run_chunk()
    rates.append(items_per_chunk / (time.perf_counter() - start))
  return statistics.median(rates)


class RandomData:
  """Random CIFAR-shaped images; mini-batches are a pure function of (learner, k)."""

  def __init__(self, batch_per_learner: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    self.images = rng.normal(size=(NUM_EXAMPLES,) + IMAGE_SHAPE).astype(np.float32)
    self.labels = rng.integers(0, 10, size=NUM_EXAMPLES).astype(np.int32)
    self.batch_per_learner = batch_per_learner

  def __call__(self, learner: np.ndarray, batch_index: np.ndarray) -> dict:
    first = (batch_index.astype(np.int64) * 7919 + learner.astype(np.int64) * 104729) % NUM_EXAMPLES
    indices = (first[:, None] + np.arange(self.batch_per_learner)[None]) % NUM_EXAMPLES
    return {"image": self.images[indices], "label": self.labels[indices]}


def measure_engine(spec, params, optimizer, schedule, data, repeats):
  engine = engine_lib.Engine(spec.loss_fn, optimizer, has_aux=True)
  plan = engine.plan(schedule)
  state = engine.init(params, plan)
  waves_per_chunk = max(1, plan.num_waves // (repeats + 1))
  # The first chunk compiles and warms up; the next `repeats` are timed.
  position = {"wave": 0, "state": state}

  def chunk():
    stop = position["wave"] + waves_per_chunk
    position["state"] = engine.run(position["state"], plan, data, start_wave=position["wave"], stop_wave=stop)
    jax.block_until_ready(position["state"].params)
    position["wave"] = stop

  chunk()
  applied = int(np.diff(plan.wave_starts)[position["wave"]:position["wave"] + waves_per_chunk].sum())
  rate = median_rate(chunk, applied * schedule.contributions_per_update, repeats)
  return rate, plan, position["state"]


def measure_sync(spec, params, optimizer, learners, data, repeats):
  """Synchronous data-parallel SGD: lambda x mu samples per step over all devices."""
  mesh = engine_lib.learner_mesh()
  devices = mesh.size
  split = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("learners"))
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  samples = learners * data.batch_per_learner
  per_step = -(-samples // devices) * devices  # pad to the device count, as the engine pads slots
  opt_state = optimizer.init(params)

  def local_gradient(params, batch):
    params = jax.lax.pcast(params, "learners", to="varying")
    grads = jax.grad(lambda p: spec.loss_fn(p, batch)[0])(params)
    return jax.lax.pmean(grads, "learners")

  gradient = jax.shard_map(local_gradient, mesh=mesh, in_specs=(jax.sharding.PartitionSpec(),
                                                               jax.sharding.PartitionSpec("learners")),
                           out_specs=jax.sharding.PartitionSpec())

  @jax.jit
  def train_step(params, opt_state, batch):
    grads = gradient(params, batch)
    grads = jax.tree_util.tree_map(lambda g: g[None], grads)  # a stack of one
    updates, opt_state = optimizer.update(grads, opt_state, params, staleness=jnp.zeros((1,), jnp.int32))
    return optax.apply_updates(params, updates), opt_state

  batch = data(np.arange(per_step // data.batch_per_learner + 1), np.zeros(per_step // data.batch_per_learner + 1,
                                                                         np.int64))
  batch = {k: jax.device_put(v.reshape((-1,) + v.shape[2:])[:per_step], split) for k, v in batch.items()}
  params = jax.device_put(params, replicated)
  opt_state = jax.device_put(opt_state, replicated)
  steps = 4
  carry = {"params": params, "opt_state": opt_state}

  def chunk():
    for _ in range(steps):
      carry["params"], carry["opt_state"] = train_step(carry["params"], carry["opt_state"], batch)
    jax.block_until_ready(carry["params"])

  chunk()
  return median_rate(chunk, steps * learners, repeats)


def measure_naive(spec, params, optimizer, schedule, data, repeats, events=48):
  """One gradient per event in a Python loop (the obvious emulator)."""
  grad_fn = jax.jit(jax.grad(lambda p, b: spec.loss_fn(p, b)[0]))
  apply = jax.jit(lambda p, s, g, sigma, stale: _apply(optimizer, p, s, g, sigma, stale))
  history = {0: jax.tree_util.tree_map(jnp.asarray, params)}
  position = {"update": 0, "params": history[0], "state": optimizer.init(history[0])}

  def chunk():
    for _ in range(events // schedule.contributions_per_update):
      update = position["update"] % schedule.num_updates
      grads, stale = [], []
      for slot in range(schedule.contributions_per_update):
        version = int(schedule.timestamp[update, slot])
        weights = history.get(version, position["params"])
        batch = data(schedule.learner[update, slot:slot + 1], schedule.batch_index[update, slot:slot + 1])
        grads.append(grad_fn(weights, {k: v[0] for k, v in batch.items()}))
        stale.append(weights)
      stack = lambda trees: jax.tree_util.tree_map(lambda *leaves: jnp.stack(leaves), *trees)
      position["params"], position["state"] = apply(
          position["params"], position["state"], stack(grads),
          jnp.asarray(schedule.staleness[update], jnp.int32), stack(stale))
      position["update"] += 1
      history[position["update"]] = position["params"]
      history.pop(position["update"] - schedule.max_staleness - 1, None)
    jax.block_until_ready(position["params"])

  chunk()
  return median_rate(chunk, (events // schedule.contributions_per_update) * schedule.contributions_per_update,
                     repeats)


def _apply(optimizer, params, state, grads, staleness, stale_params):
  updates, state = optimizer.update(grads, state, params, staleness=staleness, stale_params=stale_params)
  return optax.apply_updates(params, updates), state


def main(argv):
  del argv
  quick = _QUICK.value
  learner_counts = [int(x) for x in _LEARNERS.value] if _LEARNERS.value else ([8, 32] if quick else [8, 32, 128])
  repeats = 3 if quick else _REPEATS.value
  gradients_per_run = 512 if quick else 2048
  mu = _BATCH_PER_LEARNER.value
  machine = machine_description()
  print(f"machine: {machine}")

  spec = models.get_model("cifar10_full", num_classes=10)
  params = spec.init(jax.random.key(0), IMAGE_SHAPE)["params"]
  param_bytes = sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree_util.tree_leaves(params))
  optimizer = stalesgd.staleness_aware_sgd(0.001, momentum=0.9, rule="inverse")
  data = RandomData(mu)

  rows = []
  header = (f"{'protocol':>10} {'lambda':>6} {'engine g/s':>10} {'sync g/s':>9} {'naive g/s':>9} "
            f"{'cost/sync':>9} {'vs naive':>8} {'max sigma':>9} {'ring MB':>8} {'slot use':>8}")
  print(header)
  for learners in learner_counts:
    for protocol, options in PROTOCOLS:
      schedule = schedule_lib.simulate(protocol, learners=learners, seed=0,
                                       num_updates=max(1, gradients_per_run // (learners // options.get("n", learners))),
                                       **options)
      engine_rate, plan, state = measure_engine(spec, params, optimizer, schedule, data, repeats)
      sync_rate = measure_sync(spec, params, optimizer, learners, data, repeats)
      naive_rate = measure_naive(spec, params, optimizer, schedule, data, repeats)
      row = {
          "protocol": protocol if protocol == "async" else f"{options['n']}-softsync",
          "learners": learners,
          "batch_per_learner": mu,
          "engine_grads_per_s": engine_rate,
          "sync_grads_per_s": sync_rate,
          "naive_grads_per_s": naive_rate,
          "cost_ratio_vs_sync": sync_rate / engine_rate,
          "speedup_vs_naive": engine_rate / naive_rate,
          "ring_buffer_bytes": engine_lib.ring_bytes(state.ring),
          "param_bytes": param_bytes,
          "max_staleness": schedule.max_staleness,
          "slot_utilisation": plan.slot_utilisation,
          "slots_per_wave": plan.slots_per_wave,
      }
      rows.append(row)
      print(f"{row['protocol']:>10} {learners:>6} {engine_rate:>10.1f} {sync_rate:>9.1f} {naive_rate:>9.1f} "
            f"{row['cost_ratio_vs_sync']:>9.2f} {row['speedup_vs_naive']:>8.1f} {row['max_staleness']:>9} "
            f"{row['ring_buffer_bytes'] / 2**20:>8.2f} {row['slot_utilisation']:>8.2f}", flush=True)
      assert row["ring_buffer_bytes"] <= (row["max_staleness"] + 1) * param_bytes

  os.makedirs(os.path.dirname(_OUTPUT.value) or ".", exist_ok=True)
  with open(_OUTPUT.value, "w") as f:
    json.dump({"machine": machine, "quick": quick, "rows": rows}, f, indent=2)
  print(f"wrote {_OUTPUT.value}")


if __name__ == "__main__":
  app.run(main)
