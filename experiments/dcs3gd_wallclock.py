r"""What all-reduce staleness S buys in wall-clock time at DC-S3GD's scale: a timing-model figure, not a measurement.

``python -m experiments.dcs3gd_wallclock [--steps=2000] [--output=results/dcs3gd_wallclock.json]``

For ResNet-50 (25,557,032 float32 parameters, 102 MB per all-reduce) on M GPUs, it simulates
(`stalesgd.schedule.simulate`, docs/semantics.md) synchronous all-reduce SGD (S = 0) and stale-synchronous
all-reduce with overlap (S3GD / DC-S3GD: the all-reduce of step t runs while steps t+1 .. t+S compute) and prints
seconds per step and the speed-up over S = 0. Delay compensation costs compute, not communication, so DC-S3GD has
S3GD's timing (its extra compute, measured on the CPU at 5 % of a step, `experiments.benchmarks.decentral`, is
not in these figures).

Assumptions, stated here because nothing below is measured:

* compute: 64 images per GPU at 1,000 images/s per GPU (ResNet-50 training in mixed precision on a
  current data-centre GPU is of this order), 64 ms per step, log-normal jitter sigma 0.1 per step;
* network: a ring all-reduce (bandwidth-optimal, `TimingModel.allreduce_time`) over 25 Gbit/s Ethernet
  (3.125 GB/s, 25 us per message) or 100 Gbit/s InfiniBand (12.5 GB/s, 5 us per message), one link per GPU;
* no gradient compression, no hierarchical all-reduce, no other traffic.
"""

from __future__ import annotations

import json
import pathlib

from absl import app, flags

from stalesgd.schedule import TimingModel, simulate

RESNET50_PARAMETERS = 25_557_032
IMAGES_PER_GPU, IMAGES_PER_SECOND = 64, 1000.0
NETWORKS = {"25 Gbit/s Ethernet": (3.125e9, 25e-6), "100 Gbit/s InfiniBand": (12.5e9, 5e-6)}
GPUS = (8, 32, 128)
STALENESS = (0, 1, 2, 4)

_STEPS = flags.DEFINE_integer("steps", 2000, "Steps simulated per case.")
_OUTPUT = flags.DEFINE_string("output", "results/dcs3gd_wallclock.json", "Where the JSON goes.")


def seconds_per_step(gpus: int, staleness: int, timing: TimingModel, steps: int) -> float:
  """Simulated wall-clock seconds per step of M = ``gpus`` learners at all-reduce staleness S."""
  if staleness == 0:
    schedule = simulate("allreduce_sync", learners=gpus, num_updates=steps, seed=0, timing=timing)
  else:
    schedule = simulate(
      "s3gd", learners=gpus, num_updates=steps, seed=0, timing=timing, staleness=staleness, overlap=True
    )
  return schedule.total_time / steps


def main(argv):
  del argv
  rows = []
  for network, (bandwidth, latency) in NETWORKS.items():
    timing = TimingModel(
      compute_time=IMAGES_PER_GPU / IMAGES_PER_SECOND,
      jitter="lognormal",
      jitter_sigma=0.1,
      latency=latency,
      bandwidth=bandwidth,
      model_bytes=4 * RESNET50_PARAMETERS,
    )
    for gpus in GPUS:
      base = seconds_per_step(gpus, 0, timing, _STEPS.value)
      for staleness in STALENESS:
        step = base if staleness == 0 else seconds_per_step(gpus, staleness, timing, _STEPS.value)
        rows.append(
          {
            "network": network,
            "gpus": gpus,
            "staleness": staleness,
            "seconds_per_step": step,
            "images_per_s": gpus * IMAGES_PER_GPU / step,
            "speedup_over_sync": base / step,
            "allreduce_s": timing.allreduce_time(gpus),
            "compute_s": timing.compute_time,
          }
        )
  print(
    "| network | GPUs | all-reduce (ms) | S = 0 step (ms) | "
    + " | ".join(f"S = {s} speed-up" for s in STALENESS[1:])
    + " |"
  )
  print("|---|--:|--:|--:|" + "--:|" * (len(STALENESS) - 1))
  for network in NETWORKS:
    for gpus in GPUS:
      case = [row for row in rows if row["network"] == network and row["gpus"] == gpus]
      print(
        f"| {network} | {gpus} | {1e3 * case[0]['allreduce_s']:.1f} | {1e3 * case[0]['seconds_per_step']:.1f} | "
        + " | ".join(f"{row['speedup_over_sync']:.2f}x" for row in case[1:])
        + " |"
      )
  output = pathlib.Path(_OUTPUT.value)
  output.parent.mkdir(parents=True, exist_ok=True)
  output.write_text(
    json.dumps(
      {
        "assumptions": {
          "parameters": RESNET50_PARAMETERS,
          "images_per_gpu": IMAGES_PER_GPU,
          "images_per_second_per_gpu": IMAGES_PER_SECOND,
          "jitter": "lognormal sigma 0.1",
          "networks": {
            name: {"bytes_per_s": bandwidth, "latency_s": latency} for name, (bandwidth, latency) in NETWORKS.items()
          },
          "steps": _STEPS.value,
        },
        "rows": rows,
      },
      indent=2,
    )
    + "\n"
  )
  print(f"written: {output}")


if __name__ == "__main__":
  app.run(main)
