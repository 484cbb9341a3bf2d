r"""Digests of a tiny run of every protocol: what a pure refactor must leave unchanged.

Each protocol trains `tests/helpers/tiny_run_config.py` (an MLP on the embedded
digits, lambda = 8 learners, mu = 8, one epoch; the protocol's options set below)
through the command-line program, ``python -m stalesgd.cli.train``, whose name
stays put across refactors. Per run the JSON holds:

* ``params_sha256``: the final parameters (``summary.json``);
* ``metrics_sha256``: ``metrics.jsonl`` with the wall-clock and provenance
  fields removed (`MEASURED_FIELDS`);
* ``scalars_sha256``: the TensorBoard scalars (tag, step, value), the same
  fields removed.

Take the digests at the commit before a change and after it, on the same
machine and device count (a run's bits depend on both: docs/studies.md), and
compare::

  python -m experiments.run_digests --out=/tmp/before.json     # at the old commit
  python -m experiments.run_digests --out=/tmp/after.json --compare=/tmp/before.json

The JSON records the host (`COMPARED_HOST_FIELDS`: CPU model, family and vector instruction sets, jax and jaxlib
versions) beside the runs, and ``--compare`` refuses to decide between files of different hosts (exit status 2):
the same commit gives other weights for the delay-compensated runs (``async``, ``dcs3gd``) on an Intel Xeon than
on an AMD EPYC (results/front_door_refactor_digests), and other digests for every run on two generations of AMD
EPYC that a virtual machine names alike (results/golden_digests/README.md). A file without a host (written
before it was recorded) is compared with a warning.

Hardware and time: a CPU, 8 host devices; 15 runs of 10-20 s each (more beside other work): every
parameter-server protocol, DC-S3GD's, and the local-run ones (asynchronous local SGD with dynamic local updates,
DiLoCo, streaming DiLoCo, the one-round-delayed step and eager updates).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import pathlib
import subprocess
import sys
import tempfile

from stalesgd.training._provenance import BITS_HOST_FIELDS, bits_host

REPOSITORY = pathlib.Path(__file__).resolve().parent.parent
CONFIG_FILE = REPOSITORY / "tests" / "helpers" / "tiny_run_config.py"

PROTOCOL_RUNS = {
  "hardsync": ("hardsync",),
  "softsync": ("hardsync", "--config.protocol=softsync", "--config.n=2"),
  "async": ("async_dc",),
  "ssp": ("hardsync", "--config.protocol=ssp", "--config.ssp_bound=2"),
  "backup": ("hardsync", "--config.protocol=backup", "--config.backup_workers=2"),
  "drop_stale": ("hardsync", "--config.protocol=drop_stale", "--config.max_staleness=3"),
  "allreduce_sync": ("dcs3gd", "--config.protocol=allreduce_sync", "--config.delay_compensation=none"),
  "s3gd": ("dcs3gd", "--config.protocol=s3gd", "--config.delay_compensation=none"),
  "dcs3gd": ("dcs3gd",),
  "cifar10_full": ("cifar10_full",),
  "async_local": ("async_local",),
  "diloco": ("hardsync", "--config.protocol=diloco", "--config.local_steps=4"),
  "streaming_diloco": (
    "hardsync",
    "--config.protocol=streaming_diloco",
    "--config.local_steps=4",
    "--config.outer.fragments=2",
    "--config.outer.delay=1",
    "--config.outer.mix=0.5",
  ),
  "delayed_outer_step": (
    "hardsync",
    "--config.protocol=streaming_diloco",
    "--config.local_steps=4",
    "--config.outer.delay=4",
  ),
  "eager": (
    "hardsync",
    "--config.protocol=streaming_diloco",
    "--config.local_steps=4",
    "--config.outer.delay=4",
    "--config.eager_updates=True",
  ),
}
"""Protocol -> (tiny_run_config variant, overrides)."""

COMPARED_HOST_FIELDS = BITS_HOST_FIELDS
"""What must be equal for two files' digests to say anything about the code between them (CPU model, family and
vector instruction sets, jax, jaxlib): a file that lacks one was taken on a host that cannot be told apart."""

MEASURED_FIELDS = ("seconds", "wall", "time", "per_s", "provenance", "host", "compile")
"""A field whose name contains one of these is measured, not computed: left out (the simulated ``sim_time`` stays)."""


def _computed(record: dict) -> dict:
  return {
    key: value
    for key, value in record.items()
    if key.startswith("sim") or not any(part in key for part in MEASURED_FIELDS)
  }


def _sha256(value) -> str:
  return hashlib.sha256(json.dumps(value, sort_keys=True).encode()).hexdigest()


def _event_scalars(workdir: pathlib.Path) -> list[tuple[str, int, float]]:
  """The computed scalars of the run's TensorBoard event files, as sorted (tag, step, value)."""
  # The tests' reader of event files (tensorboardX's protobuf, no TensorFlow): a developer tool of a clone.
  from tests.helpers.train_helpers import event_scalars

  return sorted(
    (tag, int(step), float(value))
    for tag, points in event_scalars(workdir).items()
    if not any(part in tag for part in MEASURED_FIELDS)
    for step, value in points
  )


def run_digests(protocol: str, workdir: pathlib.Path) -> dict[str, str]:
  variant, *overrides = PROTOCOL_RUNS[protocol]
  environment = {**os.environ, "JAX_NUM_CPU_DEVICES": "8", "PYTHONPATH": str(REPOSITORY)}
  command = [
    sys.executable,
    "-m",
    "stalesgd.cli.train",
    f"--config={CONFIG_FILE}:{variant}",
    *overrides,
    f"--workdir={workdir}",
  ]
  completed = subprocess.run(command, cwd=REPOSITORY, env=environment, capture_output=True, text=True, check=False)
  if completed.returncode != 0:
    raise RuntimeError(f"{protocol}: {' '.join(command)} exited {completed.returncode}:\n{completed.stderr[-3000:]}")
  summary = json.loads((workdir / "summary.json").read_text())
  records = [_computed(json.loads(line)) for line in (workdir / "metrics.jsonl").read_text().splitlines() if line]
  return {
    "params_sha256": summary["params_sha256"],
    "metrics_sha256": _sha256(records),
    "scalars_sha256": _sha256(_event_scalars(workdir)),
    "records": len(records),
  }


def digest_host() -> dict[str, str | None]:
  """The host the digests are taken on: its CPU and the versions that compile the runs (`COMPARED_HOST_FIELDS`)."""
  return bits_host()


def compare(digests: dict, before: dict) -> tuple[int, str]:
  """(exit status, verdict) of ``digests`` against an earlier file: 0 unchanged, 1 changed, 2 not comparable."""
  runs, before_runs = digests["runs"], before.get("runs", before)  # an earlier format: the runs alone
  if "host" not in before:
    prefix = "warning: the earlier file records no host; compare only files of one host. "
  else:
    differing = [field for field in COMPARED_HOST_FIELDS if digests["host"].get(field) != before["host"].get(field)]
    if differing:
      return 2, "NOT COMPARABLE: taken on another host (" + ", ".join(
        f"{field} {before['host'].get(field)!r} -> {digests['host'].get(field)!r}" for field in differing
      ) + "): take both files on one host"
    prefix = ""
  changed = [protocol for protocol in runs if runs[protocol] != before_runs.get(protocol)]
  return (1, prefix + f"CHANGED: {', '.join(changed)}") if changed else (0, prefix + "unchanged")


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  parser.add_argument("--out", required=True, help="where to write the JSON")
  parser.add_argument(
    "--compare", help="a JSON written earlier: exit 1 if a digest changed, 2 if it was taken on another host"
  )
  parser.add_argument("--protocols", nargs="*", default=list(PROTOCOL_RUNS), choices=list(PROTOCOL_RUNS))
  arguments = parser.parse_args()
  digests = {"host": digest_host(), "runs": {}}
  with tempfile.TemporaryDirectory() as scratch:
    for protocol in arguments.protocols:
      digests["runs"][protocol] = run_digests(protocol, pathlib.Path(scratch) / protocol)
      print(protocol, digests["runs"][protocol]["params_sha256"][:16], flush=True)
  pathlib.Path(arguments.out).write_text(json.dumps(digests, indent=2) + "\n")
  if arguments.compare:
    status, verdict = compare(digests, json.loads(pathlib.Path(arguments.compare).read_text()))
    print(verdict)
    return status
  return 0


if __name__ == "__main__":
  sys.exit(main())
