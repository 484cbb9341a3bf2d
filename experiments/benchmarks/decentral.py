r"""Step time of DC-S3GD vs synchronous all-reduce SGD vs compute only, on real collectives.

For a conv net (default: Rudra's ``cifar10_full``, 89,578 parameters) with one
worker per device and ``--batch_per_worker`` images each, this times in one
process, interleaved round by round so that every program sees the same
machine load:

* ``compute_only``: each worker's forward/backward and local optimizer update,
  no collective at all (the floor);
* ``allreduce_sync``: synchronous all-reduce SGD (the update's all-reduce waits
  for the backward pass);
* ``s3gd``: stale-synchronous SGD, staleness 1, no correction (the all-reduce
  of the previous update is issued with no dependency on this step's compute);
* ``dcs3gd``: DC-S3GD, staleness 1, layer-wise correction (s3gd plus the
  first-order correction).

It reports the median step time of each and the ratios to ``compute_only``
(1.0 = communication fully hidden and the correction free) and
``dcs3gd / allreduce_sync`` (medians over rounds of the per-round ratios, so
that load drift on a shared host cancels), and reads the compiled DC-S3GD step: whether the
weight all-reduce depends only on the carried queue (overlap-ready) and, on
backends with asynchronous collectives, how much compute the scheduler placed
between its start and done (overlapped). On a CPU host XLA runs all-reduces
synchronously, so there the ratios mainly show the correction's cost; on a
multi-GPU host the same script shows the overlap.

Usage::

  python -m experiments.benchmarks.decentral            # 8 forced host devices on CPU
  python -m experiments.benchmarks.decentral --quick    # fewer repeats, < 1 min

On a multi-GPU host run it unchanged: it enables XLA's latency-hiding scheduler
(``XLA_FLAGS=--xla_gpu_enable_latency_hiding_scheduler=true``, appended unless
XLA_FLAGS already mentions it) so the all-reduce can overlap the backward pass.
Writes ``results/decentral_benchmark.json`` with the machine description.
"""

from __future__ import annotations

import os

# Must be set before JAX starts: eight host devices on CPU (ignored by GPU/TPU
# backends), and the latency-hiding scheduler on GPU (ignored on CPU).
os.environ.setdefault("JAX_NUM_CPU_DEVICES", "8")
if "xla_gpu_enable_latency_hiding_scheduler" not in os.environ.get("XLA_FLAGS", ""):
  os.environ["XLA_FLAGS"] = (
    os.environ.get("XLA_FLAGS", "") + " --xla_gpu_enable_latency_hiding_scheduler=true"
  ).strip()

import json
import pathlib
import statistics

import jax
import numpy as np
import optax
from absl import app, flags
from jax.sharding import PartitionSpec

from experiments.benchmarks.common import machine_description, paired_ratio, time_interleaved
from stalesgd import models
from stalesgd.decentral import DCS3GD, settings_for_protocol
from stalesgd.parallel import _sharding as sharding_lib

_MODEL = flags.DEFINE_string("model", "cifar10_full", "A stalesgd.models name (a conv net).")
_BATCH_PER_WORKER = flags.DEFINE_integer("batch_per_worker", 32, "Images per worker per step (mu).")
_STEPS_PER_ROUND = flags.DEFINE_integer("steps_per_round", 1, "Steps of one program timed together.")
_ROUNDS = flags.DEFINE_integer("rounds", 30, "Timed rounds (each runs every program once; medians reported).")
_QUICK = flags.DEFINE_bool("quick", False, "8 rounds.")
_OUTPUT = flags.DEFINE_string("output", "results/decentral_benchmark.json", "Where to write the results.")

PROTOCOLS = ("allreduce_sync", "s3gd", "dcs3gd")
IMAGE_SHAPE = (32, 32, 3)


def compute_only_step(loss_fn, optimizer, mesh):
  """Each worker's forward/backward and local update, with no collective: the floor."""
  worker = PartitionSpec(sharding_lib.LEARNERS_AXIS)

  def local_step(params, opt_state, batch):
    unstack = lambda tree: jax.tree.map(lambda leaf: leaf[0], tree)
    params, opt_state, batch = unstack(params), unstack(opt_state), unstack(batch)
    grads = jax.grad(lambda weights: loss_fn(weights, batch)[0])(params)
    updates, opt_state = optimizer.update(grads, opt_state, params)
    restack = lambda tree: jax.tree.map(lambda leaf: leaf[None], tree)
    return restack(optax.apply_updates(params, updates)), restack(opt_state)

  return jax.jit(jax.shard_map(local_step, mesh=mesh, in_specs=worker, out_specs=worker), donate_argnums=(0, 1))


def build_programs(spec, params, optimizer, mesh, batch):
  """name -> a function running one step and returning something to block on."""
  programs, reports = {}, {}
  for protocol in PROTOCOLS:
    trainer = DCS3GD(spec.loss_fn, optimizer, settings_for_protocol(protocol), mesh)
    state = trainer.init(params)
    reports[protocol] = trainer.overlap_report(state, batch)
    carry = {"state": state}

    def run(trainer=trainer, carry=carry):
      carry["state"], metrics = trainer.step(carry["state"], batch)
      return metrics["loss"]

    programs[protocol] = run
  local = compute_only_step(spec.loss_fn, optimizer, mesh)
  per_worker = lambda tree: sharding_lib.stack_learners(lambda worker: tree, mesh)
  carry = {"params": per_worker(params), "opt_state": per_worker(optimizer.init(params))}

  def run_local():
    carry["params"], carry["opt_state"] = local(carry["params"], carry["opt_state"], batch)
    return carry["params"]

  programs = {"compute_only": run_local, **programs}
  return programs, reports


def overlap_sentence(report: dict) -> str:
  if not report["overlap_ready"]:
    return "NOT overlap-ready: the weight all-reduce depends on this step's computation"
  if not report["asynchronous"]:
    return (
      "overlap-ready (the weight all-reduce reads only the carried queue), but this backend runs "
      "all-reduce synchronously: no overlap in the compiled schedule"
    )
  if report["compute_while_in_flight"]:
    return (
      f"overlapped: {report['compute_while_in_flight']} compute ops scheduled between "
      "all-reduce-start and all-reduce-done"
    )
  return "overlap-ready and asynchronous, but the scheduler placed no compute inside the all-reduce"


def main(argv):
  del argv
  steps_per_round, rounds = _STEPS_PER_ROUND.value, 8 if _QUICK.value else _ROUNDS.value
  mesh = sharding_lib.learner_mesh()
  spec = models.get_model(_MODEL.value, num_classes=10)
  params = jax.device_get(spec.init(jax.random.key(0), IMAGE_SHAPE)["params"])
  optimizer = optax.sgd(0.01, momentum=0.9)
  rng = np.random.default_rng(0)
  images = rng.normal(size=(mesh.size, _BATCH_PER_WORKER.value) + IMAGE_SHAPE).astype(np.float32)
  labels = rng.integers(0, 10, size=(mesh.size, _BATCH_PER_WORKER.value)).astype(np.int32)
  batch = sharding_lib.stack_learners(lambda worker: {"image": images[worker], "label": labels[worker]}, mesh)

  programs, reports = build_programs(spec, params, optimizer, mesh, batch)
  samples = time_interleaved(programs, steps_per_round, rounds)
  median_time = {name: statistics.median(times) for name, times in samples.items()}
  fastest_time = {name: min(times) for name, times in samples.items()}
  ratios = {f"{name}_over_compute_only": paired_ratio(samples, name, "compute_only") for name in PROTOCOLS}
  ratios["dcs3gd_over_allreduce_sync"] = paired_ratio(samples, "dcs3gd", "allreduce_sync")
  ratios["dcs3gd_over_s3gd"] = paired_ratio(samples, "dcs3gd", "s3gd")

  machine = machine_description()
  print(
    f"{machine['num_devices']} x {machine['device_kind']} ({machine['platform']}), model {_MODEL.value} "
    f"({spec.num_parameters(IMAGE_SHAPE):,} parameters), {_BATCH_PER_WORKER.value} images per worker, "
    f"{rounds} rounds x {steps_per_round} steps"
  )
  for name in programs:
    ratio = 1.0 if name == "compute_only" else ratios[f"{name}_over_compute_only"]
    print(
      f"  {name:>15}: median {median_time[name] * 1e3:8.2f} ms/step, fastest {fastest_time[name] * 1e3:8.2f}"
      f"  ({ratio:.3f} x compute only, median of per-round ratios)"
    )
  print(
    f"  dcs3gd / allreduce_sync = {ratios['dcs3gd_over_allreduce_sync']:.3f}, "
    f"dcs3gd / s3gd (cost of the correction) = {ratios['dcs3gd_over_s3gd']:.3f}"
  )
  print(f"  DC-S3GD weight all-reduce: {overlap_sentence(reports['dcs3gd'])}")

  if jax.process_index() == 0:
    output = pathlib.Path(_OUTPUT.value)
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(
      json.dumps(
        {
          "machine": machine,
          "model": _MODEL.value,
          "batch_per_worker": _BATCH_PER_WORKER.value,
          "steps_per_round": steps_per_round,
          "rounds": rounds,
          "median_step_seconds": median_time,
          "fastest_step_seconds": fastest_time,
          "ratios": ratios,
          "step_seconds_per_round": samples,
          "overlap": {name: {**report, "summary": overlap_sentence(report)} for name, report in reports.items()},
        },
        indent=2,
      )
      + "\n"
    )
    print(f"wrote {output}")


if __name__ == "__main__":
  app.run(main)
