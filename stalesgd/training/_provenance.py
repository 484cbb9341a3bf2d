"""Where a result came from: package versions, the source commit, the backend and devices.

`summary.json` records `provenance()` so that a number can be traced to the
software and hardware that produced it (the exact versions tested are in
``requirements/constraints.txt``).
"""

from __future__ import annotations

import functools
import hashlib
import importlib.metadata
import os
import pathlib
import platform
import re
import subprocess
from typing import Any

import jax

from stalesgd.training.checkpoint import _format as checkpoint_format
from stalesgd.training.checkpoint._format import stalesgd_version

PACKAGES = (
  "jax",
  "jaxlib",
  "flax",
  "optax",
  "orbax-checkpoint",
  "numpy",
  "tensorflow-datasets",
  "ml-collections",
  "scikit-learn",
)
SOURCE_ROOT = pathlib.Path(__file__).resolve().parents[1]


def package_versions(packages: tuple[str, ...] = PACKAGES) -> dict[str, str | None]:
  """The installed version of each package (None where it is not installed)."""
  versions = {}
  for package in packages:
    try:
      versions[package] = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
      versions[package] = None
  return versions


@functools.cache
def source_commit(root: pathlib.Path = SOURCE_ROOT) -> str | None:
  """The git commit of the stalesgd source tree, with ``-dirty`` for uncommitted changes; None outside git.

  Read once per process (the first call, at the first session's start, after the imports), as `source_digest` is:
  a process keeps running the code it imported, whatever is committed or edited later, and git is not run again
  for every run of a long-lived process.
  """

  def git(*args: str) -> str | None:
    try:
      result = subprocess.run(["git", "-C", str(root), *args], capture_output=True, text=True, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired):
      return None
    return result.stdout.strip() if result.returncode == 0 else None

  commit = git("rev-parse", "HEAD")
  if not commit:
    return None
  dirty = git("status", "--porcelain", "--untracked-files=no")
  return commit + ("-dirty" if dirty else "")


@functools.cache
def source_digest(root: pathlib.Path = SOURCE_ROOT) -> str:
  """sha256 of the stalesgd package's Python sources (each ``*.py`` file's path and bytes, in path order).

  Read once per process, at the first call (a session records it at its start, after the imports, so a file edited
  in between would be counted as edited): two trees of one commit with other uncommitted changes give other
  digests, where `source_commit` gives both ``<commit>-dirty``.
  """
  digest = hashlib.sha256()
  for path in sorted(root.rglob("*.py")):
    digest.update(path.relative_to(root).as_posix().encode() + b"\0" + path.read_bytes() + b"\0")
  return digest.hexdigest()


# The vector instruction sets among the CPU's flags, which XLA:CPU's code generator (LLVM) may use: SSE, AVX,
# AVX-512, FMA, F16C, AMX. A virtual machine may hide some of a CPU's.
_VECTOR_ISA = re.compile(r"(sse\d\w*|ssse3|avx\w*|fma\w*|f16c|amx\w*)")


def _first_processor(cpuinfo: str) -> dict[str, str]:
  """The fields of the first processor of a /proc/cpuinfo text (name -> value)."""
  fields = {}
  for line in cpuinfo.splitlines():
    if not line.strip():
      break
    name, _, value = line.partition(":")
    fields[name.strip()] = value.strip()
  return fields


def cpu_identity(cpuinfo: str | None = None) -> dict[str, str | None]:
  """What decides the machine code XLA:CPU compiles for this CPU, as far as the host can tell.

  ``cpu_model``: the model name (a virtual machine may show only a family name, e.g. ``AMD EPYC``, which CPUs of
  different generations share, and they give runs other bits); ``cpu_id``: vendor, family and model numbers (the
  microarchitecture; LLVM names the host CPU from them); ``cpu_isa``: the vector instruction sets among its flags
  (`_VECTOR_ISA`), sorted. From ``cpuinfo`` (default: /proc/cpuinfo, Linux); elsewhere only ``cpu_model``, from
  `platform.processor`. A field the host does not show is None.
  """
  if cpuinfo is None:
    try:
      cpuinfo = pathlib.Path("/proc/cpuinfo").read_text()
    except OSError:
      cpuinfo = ""
  fields = _first_processor(cpuinfo)
  numbers = [fields.get(name) for name in ("vendor_id", "cpu family", "model")]
  flags = sorted(flag for flag in fields.get("flags", "").split() if _VECTOR_ISA.fullmatch(flag))
  return {
    "cpu_model": fields.get("model name") or platform.processor() or None,
    "cpu_id": "{} family {} model {}".format(*numbers) if all(numbers) else None,
    "cpu_isa": " ".join(flags) or None,
  }


CPU_IDENTITY_FIELDS = ("cpu_model", "cpu_id", "cpu_isa")
"""The fields of `cpu_identity`."""

BITS_HOST_FIELDS = (*CPU_IDENTITY_FIELDS, "jax", "jaxlib")
"""What two hosts must share for the same run to be expected to give the same bits (`bits_host`)."""


def bits_host() -> dict[str, str | None]:
  """The running host's `BITS_HOST_FIELDS`: its `cpu_identity` and the jax and jaxlib that compile the runs."""
  return {**cpu_identity(), **package_versions(("jax", "jaxlib"))}


def host() -> dict[str, Any]:
  """The machine a session ran on: its name, `cpu_identity`, the cores this process may use and the load average
  (1, 5, 15 min) when the session started, which says whether the wall times were measured on a quiet machine."""
  cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
  load = list(os.getloadavg()) if hasattr(os, "getloadavg") else None
  return {"hostname": platform.node(), **cpu_identity(), "cores": cores, "load_average": load}


def provenance() -> dict[str, Any]:
  """Python, stalesgd's version and commit, the checkpoint format, package versions, the JAX backend, devices.

  ``stalesgd_version`` is the running code's ``stalesgd.__version__`` (not the
  installed distribution's metadata, which an editable install leaves at the
  version it was installed with); from a wheel, ``stalesgd_commit`` is None and
  the version is what identifies the code.
  """
  devices = jax.devices()
  return {
    "python": platform.python_version(),
    "stalesgd_version": stalesgd_version(),
    "checkpoint_format": checkpoint_format.FORMAT,
    "packages": package_versions(),
    "stalesgd_commit": source_commit(),
    "backend": jax.default_backend(),
    "device_kind": devices[0].device_kind if devices else None,
    "device_count": jax.device_count(),
    "process_count": jax.process_count(),
    "host": host(),
  }
