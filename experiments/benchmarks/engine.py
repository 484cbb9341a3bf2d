r"""Engine throughput: exact stale-gradient emulation vs synchronous training vs a naive event loop.

For the Rudra CIFAR-10 network (`cifar10_full`, 89,578 parameters; ``--model``
names another of the zoo's networks for 32x32 images, e.g. the MLP of the GPU
suite's ``--tiny`` check) on random
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
  write an emulator without the block/ring-buffer design;

and prints the ratios ``cost_ratio_vs_sync = sync / engine`` (time per gradient
relative to synchronous training; 1.0 = as cheap) and ``speedup_vs_naive``.
The three methods are timed in turn, one chunk (about 256 gradients) each per
round, after compilation; rates are medians over rounds and ratios are medians
of the per-round ratios, so a slow phase of a shared machine affects all alike.

Usage::

  python -m experiments.benchmarks.engine            # lambda in {8, 32, 128}
  python -m experiments.benchmarks.engine --quick    # lambda in {8, 32}, < 1 min
  python -m experiments.benchmarks.engine --scaling  # lambda in {8, 32, 128, 512, 1024}, + a plot

Writes ``results/engine_benchmark.json`` (one row per protocol and lambda, plus
the machine description; ``--scaling`` writes ``results/engine_scaling.json``
and ``docs/engine_scaling.png``: time per gradient, its ratio to synchronous
training, and the ring buffer's size against (sigma_max + 1) x parameters).
Each row also records the engine state's bytes and the process's resident
memory after the row. On a CPU host the script forces 8 host devices
(one learner slot group per device), the configuration the targets refer to.
"""

from __future__ import annotations

import os

# Eight host devices when running on CPU (ignored by accelerator backends); must
# be set before JAX starts.
os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")

import json
import statistics

import jax
import jax.numpy as jnp
import numpy as np
import optax
from absl import app, flags

import stalesgd
from experiments.benchmarks.common import CIFAR_SIZED_MODELS, machine_description, paired_ratio, time_interleaved
from stalesgd import engine as engine_lib
from stalesgd import models
from stalesgd import schedule as schedule_lib
from stalesgd.parallel import _sharding as sharding_lib

_QUICK = flags.DEFINE_bool("quick", False, "Small version (lambda in {8, 32}, fewer gradients), < 1 minute.")
_LEARNERS = flags.DEFINE_list("learners", None, "Override the list of learner counts.")
_BATCH_PER_LEARNER = flags.DEFINE_integer("batch_per_learner", 4, "mu, Rudra's CIFAR-10 setting.")
_OUTPUT = flags.DEFINE_string("output", "results/engine_benchmark.json", "Where to write the JSON rows.")
_REPEATS = flags.DEFINE_integer(
  "repeats", 7, "Timed rounds (each method once per round; medians reported); 3 with --quick unless given."
)
_GRADIENTS_PER_CHUNK = flags.DEFINE_integer(
  "gradients_per_chunk", None, "Gradients per timed chunk (default 256, 96 with --quick).", lower_bound=1
)
_SCALING = flags.DEFINE_bool(
  "scaling",
  False,
  "lambda in {8, 32, 128, 512, 1024}; writes engine_scaling.json and a plot (unless --output/--plot say otherwise).",
)
_PLOT = flags.DEFINE_string(
  "plot",
  None,
  "Where to draw the per-gradient cost and memory against lambda "
  "(default docs/engine_scaling.png with --scaling, none otherwise).",
)
_MODEL = flags.DEFINE_enum(
  "model",
  "cifar10_full",
  CIFAR_SIZED_MODELS,
  "The network timed, on 32x32x3 random images: Rudra's CIFAR-10 network, or a smaller one for a quicker check.",
)
_PROTOCOLS = flags.DEFINE_list("protocols", ["async", "softsync"], "Which of async and (4-)softsync to run.")
_NAIVE = flags.DEFINE_bool("naive", True, "Also time the naive event loop.")
_GRADIENT_STRATEGY = flags.DEFINE_enum(
  "gradient_strategy",
  None,
  list(engine_lib.GRADIENT_STRATEGIES),
  "How a device computes its slots (default: the backend's default).",
)

SCALING_LEARNERS = (8, 32, 128, 512, 1024)

IMAGE_SHAPE = (32, 32, 3)
NUM_EXAMPLES = 4096
PROTOCOLS = (("async", {}), ("softsync", {"n": 4}))


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


def engine_chunks(
  spec, params, optimizer, schedule, data, gradients_per_chunk: int, gradient_strategy: str | None = None
):
  """The engine executing consecutive blocks of ``schedule``, about ``gradients_per_chunk`` at a time."""
  engine = engine_lib.Engine(spec.loss_fn, optimizer, has_aux=True, gradient_strategy=gradient_strategy)
  plan = engine.plan(schedule)
  per_block = np.diff(plan.block_starts) * schedule.contributions_per_update
  blocks_per_chunk = max(1, int(round(gradients_per_chunk / per_block.mean())))
  position = {"block": 0, "state": engine.init(params, plan), "gradient_strategy": engine.gradient_strategy}

  def chunk():
    stop = position["block"] + blocks_per_chunk
    if stop > plan.num_blocks:
      raise RuntimeError("the benchmark schedule is too short for the requested rounds")
    position["state"] = engine.run(position["state"], plan, data, start_block=position["block"], stop_block=stop)
    jax.block_until_ready(position["state"].params)
    position["block"] = stop

  # Blocks in the middle of the schedule are representative; every chunk has the same count.
  applied = int(per_block[plan.num_blocks // 2 : plan.num_blocks // 2 + blocks_per_chunk].sum())
  return (chunk, applied), plan, position


def sync_chunks(spec, params, optimizer, learners, data, gradients_per_chunk: int):
  """Synchronous data-parallel SGD: lambda x mu samples per step over all devices,
  one gradient call per device (the strictest baseline: no per-learner split)."""
  mesh = sharding_lib.learner_mesh()
  devices = mesh.size
  split = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec("learners"))
  replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
  samples = learners * data.batch_per_learner
  per_step = -(-samples // devices) * devices  # pad to the device count, as the engine pads slots

  def local_gradient(params, batch):
    params = jax.lax.pcast(params, "learners", to="varying")
    grads = jax.grad(lambda p: spec.loss_fn(p, batch)[0])(params)
    return jax.lax.pmean(grads, "learners")

  gradient = jax.shard_map(
    local_gradient,
    mesh=mesh,
    in_specs=(jax.sharding.PartitionSpec(), jax.sharding.PartitionSpec("learners")),
    out_specs=jax.sharding.PartitionSpec(),
  )

  @jax.jit
  def train_step(params, opt_state, batch):
    grads = jax.tree_util.tree_map(lambda g: g[None], gradient(params, batch))  # a stack of one
    updates, opt_state = optimizer.update(grads, opt_state, params, staleness=jnp.zeros((1,), jnp.int32))
    return optax.apply_updates(params, updates), opt_state

  groups = per_step // data.batch_per_learner + 1
  batch = data(np.arange(groups), np.zeros(groups, np.int64))
  batch = {k: jax.device_put(v.reshape((-1,) + v.shape[2:])[:per_step], split) for k, v in batch.items()}
  carry = {
    "params": jax.device_put(params, replicated),
    "opt_state": jax.device_put(optimizer.init(params), replicated),
  }
  steps = max(1, gradients_per_chunk // learners)

  def chunk():
    for _ in range(steps):
      carry["params"], carry["opt_state"] = train_step(carry["params"], carry["opt_state"], batch)
    jax.block_until_ready(carry["params"])

  return chunk, steps * learners


def naive_chunks(spec, params, optimizer, schedule, data, events: int = 48):
  """One gradient per event in a Python loop (the obvious emulator, and the tests' oracle)."""
  grad_fn = jax.jit(jax.grad(lambda p, b: spec.loss_fn(p, b)[0]))
  apply = jax.jit(lambda p, s, g, sigma, stale: _apply(optimizer, p, s, g, sigma, stale))
  history = {0: jax.tree_util.tree_map(jnp.asarray, params)}
  position = {"update": 0, "params": history[0], "state": optimizer.init(history[0])}
  updates_per_chunk = max(1, events // schedule.contributions_per_update)
  stack = lambda trees: jax.tree_util.tree_map(lambda *leaves: jnp.stack(leaves), *trees)

  def chunk():
    for _ in range(updates_per_chunk):
      update = position["update"] % schedule.num_updates
      grads, stale = [], []
      for slot in range(schedule.contributions_per_update):
        weights = history.get(int(schedule.timestamp[update, slot]), position["params"])
        batch = data(schedule.learner[update, slot : slot + 1], schedule.batch_index[update, slot : slot + 1])
        grads.append(grad_fn(weights, {k: v[0] for k, v in batch.items()}))
        stale.append(weights)
      position["params"], position["state"] = apply(
        position["params"],
        position["state"],
        stack(grads),
        jnp.asarray(schedule.staleness[update], jnp.int32),
        stack(stale),
      )
      position["update"] += 1
      history[position["update"]] = position["params"]
      history.pop(position["update"] - schedule.max_staleness - 1, None)
    jax.block_until_ready(position["params"])

  return chunk, updates_per_chunk * schedule.contributions_per_update


def _apply(optimizer, params, state, grads, staleness, stale_params):
  updates, state = optimizer.update(grads, state, params, staleness=staleness, stale_params=stale_params)
  return optax.apply_updates(params, updates), state


def resident_bytes() -> int | None:
  """This process's resident memory now (Linux), or None where /proc is absent."""
  try:
    with open("/proc/self/statm") as statm:
      return int(statm.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
  except (OSError, ValueError, IndexError):
    return None


def plot_scaling(rows: list[dict], path: str) -> None:
  """Time per gradient and ring memory against lambda, one line per protocol."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  figure, (cost, ratio, memory) = plt.subplots(1, 3, figsize=(15, 4.2))
  for protocol in dict.fromkeys(row["protocol"] for row in rows):
    mine = [row for row in rows if row["protocol"] == protocol]
    learners = [row["learners"] for row in mine]
    cost.plot(learners, [1e3 / row["engine_grads_per_s"] for row in mine], "o-", label=f"{protocol}: engine")
    cost.plot(learners, [1e3 / row["sync_grads_per_s"] for row in mine], "x--", label=f"{protocol}: synchronous")
    ratio.plot(learners, [row["cost_ratio_vs_sync"] for row in mine], "o-", label=protocol)
    memory.plot(learners, [row["ring_buffer_bytes"] / 2**20 for row in mine], "o-", label=f"{protocol}: ring")
    memory.plot(
      learners,
      [(row["max_staleness"] + 1) * row["param_bytes"] / 2**20 for row in mine],
      "k:",
      label=f"{protocol}: (sigma_max + 1) x parameters",
    )
  for axis, label in ((cost, "ms per gradient"), (ratio, "engine / synchronous, per gradient"), (memory, "MiB")):
    axis.set_xscale("log", base=2)
    axis.set_xlabel("learners (lambda)")
    axis.set_ylabel(label)
    axis.grid(alpha=0.3)
    axis.legend(fontsize=8)
  memory.set_yscale("log")
  ratio.axhline(1.0, color="grey", lw=0.8)
  machine = rows[0].get("machine_label", "")
  figure.suptitle(f"Engine cost as lambda grows ({rows[0]['model']}, mu = {rows[0]['batch_per_learner']}) {machine}")
  figure.tight_layout()
  os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
  figure.savefig(path, dpi=110)
  plt.close(figure)


def main(argv):
  del argv
  quick = _QUICK.value
  default_learners = SCALING_LEARNERS if _SCALING.value else ([8, 32] if quick else [8, 32, 128])
  learner_counts = [int(x) for x in _LEARNERS.value] if _LEARNERS.value else list(default_learners)
  output = _OUTPUT.value
  if _SCALING.value and not flags.FLAGS["output"].present:
    output = "results/engine_scaling.json"
  plot_path = _PLOT.value or ("docs/engine_scaling.png" if _SCALING.value else None)
  repeats = 3 if quick and not flags.FLAGS["repeats"].present else _REPEATS.value
  gradients_per_chunk = _GRADIENTS_PER_CHUNK.value or (96 if quick else 256)
  mu = _BATCH_PER_LEARNER.value
  machine = machine_description()
  print(f"machine: {machine}")

  spec = models.get_model(_MODEL.value, num_classes=10)
  params = spec.init(jax.random.key(0), IMAGE_SHAPE)["params"]
  param_bytes = sum(leaf.size * leaf.dtype.itemsize for leaf in jax.tree_util.tree_leaves(params))
  optimizer = stalesgd.staleness_aware_sgd(0.001, momentum=0.9, rule="inverse")
  data = RandomData(mu)

  rows = []
  header = (
    f"{'protocol':>10} {'lambda':>6} {'engine g/s':>10} {'sync g/s':>9} {'naive g/s':>9} "
    f"{'cost/sync':>9} {'vs naive':>8} {'max sigma':>9} {'ring MB':>8} {'slot use':>8}"
  )
  print(header)
  for learners in learner_counts:
    for protocol, options in PROTOCOLS:
      if protocol not in _PROTOCOLS.value:
        continue
      contributions = schedule_lib.contributions_per_update(protocol, learners=learners, **options)
      # Warm-up + `repeats` chunks, with a block of slack per chunk.
      num_updates = (repeats + 2) * (gradients_per_chunk + 2 * learners) // contributions
      schedule = schedule_lib.simulate(protocol, learners=learners, seed=0, num_updates=num_updates, **options)
      engine, plan, engine_position = engine_chunks(
        spec, params, optimizer, schedule, data, gradients_per_chunk, _GRADIENT_STRATEGY.value
      )
      chunks = {"engine": engine, "sync": sync_chunks(spec, params, optimizer, learners, data, gradients_per_chunk)}
      if _NAIVE.value:
        chunks["naive"] = naive_chunks(spec, params, optimizer, schedule, data)
      seconds = time_interleaved({name: run for name, (run, _) in chunks.items()}, 1, repeats)
      gradients = {name: count for name, (_, count) in chunks.items()}
      rate = {name: gradients[name] / statistics.median(seconds[name]) for name in chunks}
      # Time per gradient of one method over another's, round by round.
      per_gradient = lambda top, bottom: paired_ratio(seconds, top, bottom) * gradients[bottom] / gradients[top]
      row = {
        "protocol": protocol if protocol == "async" else f"{options['n']}-softsync",
        "model": _MODEL.value,
        "learners": learners,
        "batch_per_learner": mu,
        "engine_grads_per_s": rate["engine"],
        "sync_grads_per_s": rate["sync"],
        "naive_grads_per_s": rate.get("naive"),
        "cost_ratio_vs_sync": per_gradient("engine", "sync"),
        "speedup_vs_naive": per_gradient("naive", "engine") if "naive" in rate else None,
        "ring_buffer_bytes": engine_lib.ring_bytes(engine_position["state"].ring),
        "engine_state_bytes": sum(leaf.nbytes for leaf in jax.tree_util.tree_leaves(engine_position["state"])),
        "resident_bytes": resident_bytes(),
        "param_bytes": param_bytes,
        "max_staleness": schedule.max_staleness,
        "gradient_strategy": engine_position["gradient_strategy"],
        "slot_utilisation": plan.slot_utilisation,
        "slots_per_block": plan.slots_per_block,
        "rounds": repeats,
      }
      rows.append(row)
      naive = f"{rate['naive']:>9.1f}" if "naive" in rate else f"{'-':>9}"
      speedup = f"{row['speedup_vs_naive']:>8.1f}" if "naive" in rate else f"{'-':>8}"
      print(
        f"{row['protocol']:>10} {learners:>6} {rate['engine']:>10.1f} {rate['sync']:>9.1f} {naive} "
        f"{row['cost_ratio_vs_sync']:>9.2f} {speedup} {row['max_staleness']:>9} "
        f"{row['ring_buffer_bytes'] / 2**20:>8.2f} {row['slot_utilisation']:>8.2f}",
        flush=True,
      )
      assert row["ring_buffer_bytes"] <= (row["max_staleness"] + 1) * param_bytes

  os.makedirs(os.path.dirname(output) or ".", exist_ok=True)
  with open(output, "w") as f:
    json.dump({"machine": machine, "quick": quick, "rows": rows}, f, indent=2)
  print(f"wrote {output}")
  if plot_path:
    for row in rows:
      row["machine_label"] = (
        f"({machine['num_devices']} {machine['device_kind']} devices, {machine['host_cpus']} cores)"
      )
    plot_scaling(rows, plot_path)
    print(f"wrote {plot_path}")


if __name__ == "__main__":
  app.run(main)
