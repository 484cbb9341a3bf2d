"""Multi-process start-up: one call that makes the same program run on 1 or many hosts.

`initialize` wraps `jax.distributed.initialize` for stalesgd's entry points. It
takes explicit arguments (the ``--coordinator_address``, ``--num_processes``,
``--process_id`` flags of `stalesgd.cli.train`) or detects the cluster from the
environment, and does nothing on a single host, so the same command line works
on a laptop, on 8 forced host devices, under ``launch/local.sh``, SLURM,
Kubernetes and MPI.

Detection, in this order (the first environment present wins; explicit
arguments always override what it finds):

* **SLURM** (``srun``): process count and id from ``SLURM_NTASKS`` /
  ``SLURM_PROCID``; the coordinator (first node of the step, a port derived
  from the job id) and one GPU per process (``SLURM_LOCALID``) are left to
  JAX's own SLURM detection, which parses node lists.
* **Open MPI 4** (``mpirun``, ``OMPI_MCA_orte_hnp_uri`` set): count and rank
  from ``OMPI_COMM_WORLD_*``; coordinator and one GPU per process left to JAX's
  Open MPI detection.
* **Kubernetes Indexed Job** (``JOB_COMPLETION_INDEX`` and
  ``KUBERNETES_SERVICE_HOST`` set): JAX 0.10.2 only detects Kubernetes through
  the API server (the ``kubernetes`` package and pod-reading RBAC). This module
  needs neither: process id = ``JOB_COMPLETION_INDEX``; process count =
  ``STALESGD_NUM_PROCESSES`` (the Job's ``completions``); coordinator = pod 0
  of the Job behind its headless service, ``<job>-0.<service>:<port>``, with
  ``<service>`` from ``STALESGD_K8S_SERVICE`` (the pod's ``subdomain``),
  ``<job>`` from ``JOB_NAME`` (downward API, label ``job-name``) or else from
  the pod's hostname ``<job>-<index>``, and ``<port>`` from
  ``JAX_COORDINATOR_PORT`` (default 55527, JAX's Kubernetes default). See
  ``launch/kubernetes.yaml``.
* **Other MPI launchers** (Open MPI 5 / PRRTE, MPICH and Intel MPI Hydra,
  PMIx): JAX 0.10.2 does not detect them without ``mpi4py``. Rank and size come
  from ``OMPI_COMM_WORLD_*``, ``PMI_RANK``/``PMI_SIZE`` or
  ``PMIX_RANK``/``STALESGD_NUM_PROCESSES``; the coordinator from
  ``JAX_COORDINATOR_ADDRESS`` (export it to every rank, e.g.
  ``mpirun -x JAX_COORDINATOR_ADDRESS=$(hostname):12345``), or else from JAX's
  ``mpi4py`` method when ``mpi4py`` is installed.

Then, only when none of these matched and no argument was given: **JAX's own
detection** (Cloud TPU pods, GKE TPU slices), where an environment variable of
a cluster JAX knows is present (`JAX_CLUSTER_VARIABLES`), so a laptop or a
single pod stays one process. ``mode`` (``--distributed`` of the programs)
chooses: ``"auto"`` (the default: stalesgd's detectors, then that fallback),
``"jax"`` (JAX's detection only, wherever it runs: JAX's Kubernetes detection
through the API server, mpi4py, TPU metadata), ``"off"`` (one process, whatever
the environment says).

A detected (or requested) world of one process is a single host: nothing is
initialized. On CPU, processes exchange collectives through gloo
(``jax_cpu_collectives_implementation``), which is what makes
``launch/local.sh`` and the multi-process tests work on one machine; the
setting is inert on GPU and TPU.
"""

from __future__ import annotations

import dataclasses
import importlib.util
import logging
import os
import re
from collections.abc import Callable, Mapping, Sequence

import jax

_LOG = logging.getLogger(__name__)

DEFAULT_KUBERNETES_PORT = 55527
DISTRIBUTED_MODES = ("auto", "off", "jax")
"""``--distributed``: stalesgd's detectors then JAX's; one process; JAX's detection only (module docstring)."""
JAX_CLUSTER_VARIABLES = (
  "TPU_WORKER_HOSTNAMES",
  "TPU_PROCESS_ADDRESSES",
  "TPU_WORKER_ID",
  "MEGASCALE_COORDINATOR_ADDRESS",
)
"""Variables of the clusters JAX detects and stalesgd does not (Cloud TPU and GKE TPU): the ``auto`` fallback runs
only where one is set. Not ``KUBERNETES_SERVICE_HOST``: every pod has it, and JAX's Kubernetes detection needs the
``kubernetes`` package and pod-reading rights (``--distributed=jax`` asks for it)."""
DEFAULT_INITIALIZATION_TIMEOUT = 600
DEFAULT_HEARTBEAT_TIMEOUT = 100


@dataclasses.dataclass(frozen=True)
class ClusterSpec:
  """Where this process sits in a multi-process run.

  Attributes:
    num_processes: number of JAX processes (> 1), or None when JAX's own
      detection finds it (``source="jax"``).
    process_id: this process's index, 0 <= process_id < num_processes, or
      None when JAX's own detection finds it.
    coordinator_address: ``host:port`` of process 0's coordination service, or
      None when JAX's own detection (``jax_detection``) derives it.
    local_device_ids: devices this process may use, or None for all (or for
      JAX's per-launcher default).
    source: where the values came from: ``"arguments"``, ``"slurm"``,
      ``"openmpi"``, ``"kubernetes"``, ``"mpi"`` or ``"jax"`` (JAX's own
      detection).
    jax_detection: the ``cluster_detection_method`` handed to
      `jax.distributed.initialize` for what is still None, ``"deactivate"``
      when everything is known, or None for JAX's automatic detection.
  """

  num_processes: int | None
  process_id: int | None
  coordinator_address: str | None
  local_device_ids: tuple[int, ...] | None
  source: str
  jax_detection: str | None


@dataclasses.dataclass(frozen=True)
class _Detected:
  """What one launcher's environment says (any field may be unknown)."""

  source: str
  num_processes: int | None
  process_id: int | None
  coordinator_address: str | None
  jax_detection: str
  # Why the coordinator address is unknown and how to provide it.
  missing_coordinator_hint: str = ""


def _env_int(environ: Mapping[str, str], name: str) -> int | None:
  value = environ.get(name)
  if value is None or value == "":
    return None
  try:
    return int(value)
  except ValueError:
    raise ValueError(f"environment variable {name}={value!r} must be an integer") from None


def _detect_slurm(environ: Mapping[str, str]) -> _Detected | None:
  # The variables JAX's SlurmCluster requires: present only inside `srun`.
  required = ("SLURM_JOB_ID", "SLURM_STEP_NODELIST", "SLURM_NTASKS", "SLURM_PROCID", "SLURM_LOCALID")
  if not all(name in environ for name in required):
    return None
  return _Detected(
    "slurm", _env_int(environ, "SLURM_NTASKS"), _env_int(environ, "SLURM_PROCID"), None, jax_detection="slurm"
  )


def _detect_open_mpi4(environ: Mapping[str, str]) -> _Detected | None:
  if "OMPI_MCA_orte_hnp_uri" not in environ:
    return None
  return _Detected(
    "openmpi",
    _env_int(environ, "OMPI_COMM_WORLD_SIZE"),
    _env_int(environ, "OMPI_COMM_WORLD_RANK"),
    None,
    jax_detection="ompi",
  )


def _detect_kubernetes(environ: Mapping[str, str]) -> _Detected | None:
  if "JOB_COMPLETION_INDEX" not in environ or "KUBERNETES_SERVICE_HOST" not in environ:
    return None
  index = _env_int(environ, "JOB_COMPLETION_INDEX")
  service = environ.get("STALESGD_K8S_SERVICE")
  job_name = environ.get("JOB_NAME")
  hostname = environ.get("HOSTNAME", "")
  if not job_name and hostname.endswith(f"-{index}"):
    # Pods of an Indexed Job are named `<job>-<index>` when the Job sets a subdomain.
    job_name = hostname[: -len(f"-{index}")]
  coordinator = None
  if service and job_name:
    port = environ.get("JAX_COORDINATOR_PORT") or str(DEFAULT_KUBERNETES_PORT)
    coordinator = f"{job_name}-0.{service}:{port}"
  hint = (
    "set STALESGD_K8S_SERVICE to the Job's headless service (the pod's subdomain) and JOB_NAME "
    "(downward API, metadata.labels['job-name']), as in launch/kubernetes.yaml"
  )
  return _Detected(
    "kubernetes",
    _env_int(environ, "STALESGD_NUM_PROCESSES"),
    index,
    coordinator,
    jax_detection="deactivate",
    missing_coordinator_hint=hint,
  )


def _detect_other_mpi(environ: Mapping[str, str]) -> _Detected | None:
  for size_name, rank_name in (
    ("OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_RANK"),
    ("PMI_SIZE", "PMI_RANK"),
    ("STALESGD_NUM_PROCESSES", "PMIX_RANK"),
  ):
    if rank_name in environ:
      break
  else:
    return None
  has_mpi4py = importlib.util.find_spec("mpi4py") is not None
  hint = (
    "export JAX_COORDINATOR_ADDRESS=<rank-0 host>:<port> to every rank "
    "(e.g. `mpirun -x JAX_COORDINATOR_ADDRESS=$(hostname):12345`) or install mpi4py"
  )
  return _Detected(
    "mpi",
    _env_int(environ, size_name),
    _env_int(environ, rank_name),
    None,
    jax_detection="mpi4py" if has_mpi4py else "deactivate",
    missing_coordinator_hint="" if has_mpi4py else hint,
  )


_DETECTORS: tuple[Callable[[Mapping[str, str]], _Detected | None], ...] = (
  _detect_slurm,
  _detect_open_mpi4,
  _detect_kubernetes,
  _detect_other_mpi,
)


def detect_environment(environ: Mapping[str, str] | None = None) -> str | None:
  """Names the cluster launcher this process runs under, or None.

  Args:
    environ: the environment to inspect; defaults to `os.environ`.

  Returns:
    ``"slurm"``, ``"openmpi"``, ``"kubernetes"``, ``"mpi"`` or None.
  """
  detected = _detect(os.environ if environ is None else environ)
  return None if detected is None else detected.source


def _detect(environ: Mapping[str, str]) -> _Detected | None:
  """What the first launcher in `_DETECTORS` whose environment is present says, or None."""
  return next((found for detector in _DETECTORS if (found := detector(environ)) is not None), None)


def _validate_coordinator_address(coordinator_address: str) -> None:
  match = re.fullmatch(r"(\[[0-9a-fA-F:.]+\]|[^:\s\[\]]+):(\d+)", coordinator_address)
  if match is None or not 1 <= int(match.group(2)) <= 65535:
    raise ValueError(
      f"coordinator_address={coordinator_address!r} must be 'host:port' (or '[ipv6]:port') with a port in 1..65535"
    )


def _validate_explicit(
  coordinator_address: str | None,
  num_processes: int | None,
  process_id: int | None,
  local_device_ids: int | Sequence[int] | None,
  initialization_timeout: int,
  heartbeat_timeout: int,
) -> tuple[int, ...] | None:
  if coordinator_address is not None:
    _validate_coordinator_address(coordinator_address)
  if num_processes is not None and (
    isinstance(num_processes, bool) or not isinstance(num_processes, int) or num_processes < 1
  ):
    raise ValueError(f"num_processes={num_processes!r} must be an integer >= 1")
  if process_id is not None and (isinstance(process_id, bool) or not isinstance(process_id, int) or process_id < 0):
    raise ValueError(f"process_id={process_id!r} must be an integer >= 0")
  for name, value in (("initialization_timeout", initialization_timeout), ("heartbeat_timeout", heartbeat_timeout)):
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
      raise ValueError(f"{name}={value!r} must be a whole number of seconds >= 1")
  if local_device_ids is None:
    return None
  ids = (local_device_ids,) if isinstance(local_device_ids, int) else tuple(local_device_ids)
  if not ids or any(isinstance(i, bool) or not isinstance(i, int) or i < 0 for i in ids):
    raise ValueError(
      f"local_device_ids={local_device_ids!r} must be a non-negative integer or a non-empty sequence of them"
    )
  return ids


def resolve_cluster(
  coordinator_address: str | None = None,
  num_processes: int | None = None,
  process_id: int | None = None,
  local_device_ids: int | Sequence[int] | None = None,
  *,
  environ: Mapping[str, str] | None = None,
  initialization_timeout: int = DEFAULT_INITIALIZATION_TIMEOUT,
  heartbeat_timeout: int = DEFAULT_HEARTBEAT_TIMEOUT,
  mode: str = "auto",
) -> ClusterSpec | None:
  """Merges explicit arguments with the detected environment, without starting anything.

  Explicit arguments win over the environment; ``JAX_COORDINATOR_ADDRESS`` (the
  variable JAX itself reads) counts as an explicit coordinator.

  Args:
    coordinator_address: ``host:port`` of process 0, or None.
    num_processes: total number of processes, or None.
    process_id: this process's index, or None.
    local_device_ids: devices this process may use, or None.
    environ: the environment to inspect; defaults to `os.environ`.
    initialization_timeout: seconds to wait for all processes (validated here).
    heartbeat_timeout: seconds without a heartbeat before a peer is declared
      dead (validated here).
    mode: one of `DISTRIBUTED_MODES` (module docstring).

  Returns:
    The cluster, or None for a single host (no launcher detected and no
    arguments, or a world of one process).

  Raises:
    ValueError: an argument is malformed, or what is known does not determine
      a cluster (e.g. a process id without a coordinator on a machine with no
      launcher).
  """
  environ = os.environ if environ is None else environ
  if mode not in DISTRIBUTED_MODES:
    raise ValueError(f"distributed mode {mode!r}; allowed: one of {DISTRIBUTED_MODES}")
  device_ids = _validate_explicit(
    coordinator_address, num_processes, process_id, local_device_ids, initialization_timeout, heartbeat_timeout
  )
  if mode == "off":
    given = {"coordinator_address": coordinator_address, "num_processes": num_processes, "process_id": process_id}
    present = [
      name for name, value in given.items() if value is not None and not (name == "num_processes" and value == 1)
    ]
    if present:
      raise ValueError(
        f"distributed mode 'off' (one process) with {', '.join(present)} given: drop them, or use 'auto'"
      )
    return None
  coordinator_address = coordinator_address or environ.get("JAX_COORDINATOR_ADDRESS") or None
  if coordinator_address is not None:
    _validate_coordinator_address(coordinator_address)
  if mode == "jax":
    return ClusterSpec(num_processes, process_id, coordinator_address, device_ids, source="jax", jax_detection=None)
  detected = _detect(environ)

  if detected is None:
    given = {"coordinator_address": coordinator_address, "num_processes": num_processes, "process_id": process_id}
    if all(value is None for value in given.values()):
      if any(environ.get(name) for name in JAX_CLUSTER_VARIABLES):
        return ClusterSpec(None, None, None, device_ids, source="jax", jax_detection=None)
      return None
    if num_processes == 1:
      if process_id not in (None, 0):
        raise ValueError(f"process_id={process_id} must be in [0, num_processes=1)")
      return None
    missing = [name for name, value in given.items() if value is None]
    if missing:
      present = ", ".join(f"{name}={value!r}" for name, value in given.items() if value is not None)
      raise ValueError(
        f"{present} given without {' and '.join(missing)}, and no cluster launcher "
        "(SLURM, Open MPI, Kubernetes Indexed Job, MPI) was detected: pass "
        "coordinator_address, num_processes and process_id together, or none of them"
      )
    source, jax_detection = "arguments", "deactivate"
  else:
    source, jax_detection = detected.source, detected.jax_detection
    num_processes = num_processes if num_processes is not None else detected.num_processes
    process_id = process_id if process_id is not None else detected.process_id
    if num_processes is None:
      raise ValueError(
        f"running under {detected.source} but the number of processes is unknown: pass "
        "num_processes (--num_processes) or set STALESGD_NUM_PROCESSES"
      )
    if process_id is None:
      raise ValueError(
        f"running under {detected.source} but this process's id is unknown: pass process_id (--process_id)"
      )
    if num_processes == 1:
      if process_id != 0:
        raise ValueError(f"process_id={process_id} must be in [0, num_processes=1)")
      return None
    if coordinator_address is None:
      coordinator_address = detected.coordinator_address
    if coordinator_address is not None:
      jax_detection = "deactivate"
    elif detected.jax_detection == "deactivate":
      raise ValueError(
        f"running under {detected.source} with num_processes={num_processes} but the "
        f"coordinator address is unknown: pass coordinator_address (--coordinator_address) "
        f"or {detected.missing_coordinator_hint}"
      )

  if not 0 <= process_id < num_processes:
    raise ValueError(f"process_id={process_id} must be in [0, num_processes={num_processes})")
  return ClusterSpec(
    num_processes=num_processes,
    process_id=process_id,
    coordinator_address=coordinator_address,
    local_device_ids=device_ids,
    source=source,
    jax_detection=jax_detection,
  )


def initialize(
  coordinator_address: str | None = None,
  num_processes: int | None = None,
  process_id: int | None = None,
  initialization_timeout: int = DEFAULT_INITIALIZATION_TIMEOUT,
  local_device_ids: int | Sequence[int] | None = None,
  *,
  heartbeat_timeout: int = DEFAULT_HEARTBEAT_TIMEOUT,
  mode: str = "auto",
) -> ClusterSpec | None:
  """Joins a multi-process JAX run, or does nothing on a single host.

  Call it first thing, before any JAX computation or device query (JAX's own
  rule). See the module docstring for the detection order. Calling it again in
  an already initialized process returns the resolved cluster without
  re-initializing.

  Args:
    coordinator_address: ``host:port`` of process 0 (all processes pass the
      same), or None to detect it.
    num_processes: total number of processes, or None to detect it.
    process_id: this process's index in [0, num_processes), or None to detect it.
    initialization_timeout: seconds to wait for every process to connect before
      failing. Large jobs on busy clusters start slowly, hence 600 by default.
    local_device_ids: restrict this process to these local devices (e.g. one
      GPU per process), or None for all (or JAX's per-launcher default under
      SLURM and Open MPI: one GPU per process).
    heartbeat_timeout: seconds after which a silent peer is declared dead and
      every surviving process aborts with an error instead of hanging in a
      collective. On one machine, a non-coordinator peer killed mid-run brings
      the others down about ``heartbeat_timeout`` seconds later; a killed
      coordinator does so within a few seconds.
    mode: one of `DISTRIBUTED_MODES` (module docstring).

  Returns:
    The cluster joined, or None on a single host.

  Raises:
    ValueError: malformed or incomplete arguments (see `resolve_cluster`),
      raised before any connection is attempted.
  """
  cluster = resolve_cluster(
    coordinator_address,
    num_processes,
    process_id,
    local_device_ids,
    initialization_timeout=initialization_timeout,
    heartbeat_timeout=heartbeat_timeout,
    mode=mode,
  )
  if cluster is None:
    if local_device_ids is not None:
      _LOG.warning(
        "single host: local_device_ids=%s is ignored (restrict devices with CUDA_VISIBLE_DEVICES instead)",
        local_device_ids,
      )
    _LOG.info("single host: jax.distributed is not initialized")
    return None
  if jax.distributed.is_initialized():
    _LOG.info("jax.distributed is already initialized; not initializing again")
    return cluster
  # CPU processes need a cross-process collectives backend; inert on GPU/TPU.
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  _LOG.info(
    "initializing jax.distributed: process %s of %s via %s (coordinator %s)",
    cluster.process_id,
    cluster.num_processes,
    cluster.source,
    cluster.coordinator_address or "detected by JAX",
  )
  jax.distributed.initialize(
    coordinator_address=cluster.coordinator_address,
    num_processes=cluster.num_processes,
    process_id=cluster.process_id,
    local_device_ids=list(cluster.local_device_ids) if cluster.local_device_ids is not None else None,
    cluster_detection_method=cluster.jax_detection,
    initialization_timeout=initialization_timeout,
    heartbeat_timeout_seconds=heartbeat_timeout,
  )
  return cluster
