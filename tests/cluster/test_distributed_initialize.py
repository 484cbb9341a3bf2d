"""stalesgd.cluster._distributed.initialize: argument validation, launcher detection, single-host no-op."""

from __future__ import annotations

import jax
import pytest

from stalesgd.cluster import _distributed as distributed

SLURM_ENV = {
  "SLURM_JOB_ID": "4242",
  "SLURM_STEP_NODELIST": "node[003-004]",
  "SLURM_NTASKS": "8",
  "SLURM_PROCID": "5",
  "SLURM_LOCALID": "1",
}
KUBERNETES_ENV = {
  "KUBERNETES_SERVICE_HOST": "10.0.0.1",
  "JOB_COMPLETION_INDEX": "2",
  "HOSTNAME": "resnet-dcs3gd-2",
  "STALESGD_K8S_SERVICE": "stalesgd-workers",
  "STALESGD_NUM_PROCESSES": "4",
}
LAUNCHER_MARKERS = (
  "SLURM_JOB_ID",
  "SLURM_STEP_NODELIST",
  "SLURM_NTASKS",
  "SLURM_PROCID",
  "SLURM_LOCALID",
  "OMPI_MCA_orte_hnp_uri",
  "OMPI_COMM_WORLD_RANK",
  "OMPI_COMM_WORLD_SIZE",
  "PMI_RANK",
  "PMI_SIZE",
  "PMIX_RANK",
  "JOB_COMPLETION_INDEX",
  "KUBERNETES_SERVICE_HOST",
  "JAX_COORDINATOR_ADDRESS",
  "STALESGD_NUM_PROCESSES",
)


# ------------------------------------------------------------------ validation


@pytest.mark.parametrize(
  "kwargs, message",
  [
    ({"process_id": 1}, "process_id=1 given without coordinator_address and num_processes"),
    ({"coordinator_address": "10.0.0.1:1234"}, "without num_processes and process_id"),
    ({"coordinator_address": "10.0.0.1:1234", "num_processes": 2}, "without process_id"),
    ({"coordinator_address": "10.0.0.1", "num_processes": 2, "process_id": 0}, "'host:port'"),
    ({"coordinator_address": "10.0.0.1:70000", "num_processes": 2, "process_id": 0}, "port in 1..65535"),
    ({"coordinator_address": "h:1", "num_processes": 0, "process_id": 0}, "num_processes=0 must be"),
    ({"coordinator_address": "h:1", "num_processes": 2, "process_id": -1}, "process_id=-1 must be"),
    ({"coordinator_address": "h:1", "num_processes": 2, "process_id": 2}, r"process_id=2 must be in \[0, "),
    ({"coordinator_address": "h:1", "num_processes": 2.0, "process_id": 0}, "num_processes=2.0"),
    ({"num_processes": 1, "process_id": 1}, r"process_id=1 must be in \[0, num_processes=1\)"),
    ({"local_device_ids": [-1]}, "local_device_ids=\\[-1\\]"),
    ({"initialization_timeout": 0}, "initialization_timeout=0"),
    ({"heartbeat_timeout": -5}, "heartbeat_timeout=-5"),
  ],
)
def test_bad_arguments_raise_value_error_naming_them(kwargs, message):
  with pytest.raises(ValueError, match=message):
    distributed.resolve_cluster(environ={}, **kwargs)


def test_environment_values_that_are_not_integers_are_named():
  with pytest.raises(ValueError, match="SLURM_NTASKS='eight'"):
    distributed.resolve_cluster(environ={**SLURM_ENV, "SLURM_NTASKS": "eight"})


# ------------------------------------------------------------------ single host


@pytest.mark.parametrize(
  "kwargs", [{}, {"num_processes": 1}, {"num_processes": 1, "process_id": 0}, {"local_device_ids": [0]}]
)
def test_single_host_resolves_to_nothing(kwargs):
  assert distributed.resolve_cluster(environ={"HOME": "/root", "PATH": "/bin"}, **kwargs) is None


def test_a_launcher_with_one_task_is_a_single_host():
  assert distributed.resolve_cluster(environ={**SLURM_ENV, "SLURM_NTASKS": "1", "SLURM_PROCID": "0"}) is None


@pytest.fixture
def clean_environment(monkeypatch):
  for name in LAUNCHER_MARKERS:
    monkeypatch.delenv(name, raising=False)
  calls = []
  monkeypatch.setattr(jax.distributed, "initialize", lambda **kwargs: calls.append(kwargs))
  monkeypatch.setattr(jax.distributed, "is_initialized", lambda: False)
  return calls


def test_initialize_on_a_single_host_does_nothing(clean_environment):
  assert distributed.initialize() is None
  assert clean_environment == []


def test_initialize_passes_explicit_arguments_and_selects_gloo(clean_environment, monkeypatch):
  updates = []
  monkeypatch.setattr(jax.config, "update", lambda name, value: updates.append((name, value)))
  cluster = distributed.initialize("127.0.0.1:1234", 2, 1, initialization_timeout=30, heartbeat_timeout=7)
  assert cluster == distributed.ClusterSpec(
    num_processes=2,
    process_id=1,
    coordinator_address="127.0.0.1:1234",
    local_device_ids=None,
    source="arguments",
    jax_detection="deactivate",
  )
  assert clean_environment == [
    {
      "coordinator_address": "127.0.0.1:1234",
      "num_processes": 2,
      "process_id": 1,
      "local_device_ids": None,
      "cluster_detection_method": "deactivate",
      "initialization_timeout": 30,
      "heartbeat_timeout_seconds": 7,
    }
  ]
  assert ("jax_cpu_collectives_implementation", "gloo") in updates


def test_initialize_validates_before_connecting(clean_environment):
  with pytest.raises(ValueError, match="process_id=3"):
    distributed.initialize(process_id=3)
  assert clean_environment == []


def test_initialize_defaults_to_a_long_initialization_timeout(clean_environment, monkeypatch):
  monkeypatch.setattr(jax.config, "update", lambda name, value: None)
  distributed.initialize("[::1]:1234", 4, 0)
  assert clean_environment[0]["initialization_timeout"] >= 600


def test_initialize_twice_does_not_initialize_again(clean_environment, monkeypatch):
  monkeypatch.setattr(jax.distributed, "is_initialized", lambda: True)
  cluster = distributed.initialize("127.0.0.1:1234", 2, 0)
  assert cluster.process_id == 0 and clean_environment == []


# ------------------------------------------------------------------ detection


def test_slurm_counts_from_environment_and_coordinator_left_to_jax():
  cluster = distributed.resolve_cluster(environ=SLURM_ENV)
  assert (cluster.num_processes, cluster.process_id, cluster.source) == (8, 5, "slurm")
  assert cluster.coordinator_address is None and cluster.jax_detection == "slurm"


def test_jax_resolves_the_slurm_coordinator_we_leave_to_it(monkeypatch):
  # The half of SLURM detection delegated to JAX: first node of the step, port from the job id.
  from jax._src import clusters

  for name, value in SLURM_ENV.items():
    monkeypatch.setenv(name, value)
  monkeypatch.delenv("JAX_COORDINATOR_PORT", raising=False)
  address, _, _, device_ids = clusters.ClusterEnv.auto_detect_unset_distributed_params(None, 8, 5, None, "slurm", 60)
  assert address == f"node003:{4242 % 4096 + 61440}" and list(device_ids) == [1]


def test_initialize_under_slurm_hands_the_coordinator_to_jax(clean_environment, monkeypatch):
  monkeypatch.setattr(jax.config, "update", lambda name, value: None)
  for name, value in SLURM_ENV.items():
    monkeypatch.setenv(name, value)
  cluster = distributed.initialize(heartbeat_timeout=9)
  assert cluster.source == "slurm"
  assert clean_environment == [
    {
      "coordinator_address": None,
      "num_processes": 8,
      "process_id": 5,
      "local_device_ids": None,
      "cluster_detection_method": "slurm",
      "initialization_timeout": 600,
      "heartbeat_timeout_seconds": 9,
    }
  ]


def test_explicit_arguments_override_the_environment():
  cluster = distributed.resolve_cluster("head:999", 16, 3, environ=SLURM_ENV)
  assert (cluster.coordinator_address, cluster.num_processes, cluster.process_id) == ("head:999", 16, 3)
  assert cluster.source == "slurm" and cluster.jax_detection == "deactivate"


def test_open_mpi_4_counts_from_environment():
  environ = {
    "OMPI_MCA_orte_hnp_uri": "1531576320.0;tcp://10.96.0.1:34911",
    "OMPI_COMM_WORLD_SIZE": "4",
    "OMPI_COMM_WORLD_RANK": "3",
    "OMPI_COMM_WORLD_LOCAL_RANK": "1",
  }
  cluster = distributed.resolve_cluster(environ=environ)
  assert (cluster.num_processes, cluster.process_id, cluster.source, cluster.jax_detection) == (4, 3, "openmpi", "ompi")


def test_kubernetes_indexed_job_coordinator_from_hostname_and_service():
  cluster = distributed.resolve_cluster(environ=KUBERNETES_ENV)
  assert cluster == distributed.ClusterSpec(
    num_processes=4,
    process_id=2,
    coordinator_address="resnet-dcs3gd-0.stalesgd-workers:55527",
    local_device_ids=None,
    source="kubernetes",
    jax_detection="deactivate",
  )


def test_kubernetes_job_name_and_port_from_environment():
  environ = {**KUBERNETES_ENV, "HOSTNAME": "unrelated", "JOB_NAME": "train", "JAX_COORDINATOR_PORT": "4000"}
  assert distributed.resolve_cluster(environ=environ).coordinator_address == "train-0.stalesgd-workers:4000"


def test_kubernetes_without_service_explains_what_to_set():
  environ = {name: value for name, value in KUBERNETES_ENV.items() if name != "STALESGD_K8S_SERVICE"}
  with pytest.raises(ValueError, match="STALESGD_K8S_SERVICE"):
    distributed.resolve_cluster(environ=environ)


def test_kubernetes_without_process_count_explains_what_to_set():
  environ = {name: value for name, value in KUBERNETES_ENV.items() if name != "STALESGD_NUM_PROCESSES"}
  with pytest.raises(ValueError, match="STALESGD_NUM_PROCESSES"):
    distributed.resolve_cluster(environ=environ)
  assert distributed.resolve_cluster(num_processes=4, environ=environ).num_processes == 4


@pytest.mark.parametrize(
  "environ",
  [
    {"PMI_RANK": "1", "PMI_SIZE": "2"},  # MPICH / Intel MPI (Hydra)
    {"OMPI_COMM_WORLD_RANK": "1", "OMPI_COMM_WORLD_SIZE": "2"},  # Open MPI 5 (PRRTE)
    {"PMIX_RANK": "1", "STALESGD_NUM_PROCESSES": "2"},  # PMIx launchers
  ],
)
def test_other_mpi_launchers_take_the_coordinator_from_jax_coordinator_address(environ, monkeypatch):
  import importlib.util

  monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: None)
  with pytest.raises(ValueError, match="JAX_COORDINATOR_ADDRESS"):
    distributed.resolve_cluster(environ=environ)
  cluster = distributed.resolve_cluster(environ={**environ, "JAX_COORDINATOR_ADDRESS": "rank0:12345"})
  assert (cluster.num_processes, cluster.process_id, cluster.coordinator_address, cluster.source) == (
    2,
    1,
    "rank0:12345",
    "mpi",
  )


def test_other_mpi_launchers_use_mpi4py_when_installed(monkeypatch):
  import importlib.util

  monkeypatch.setattr(importlib.util, "find_spec", lambda name, *args: object())
  cluster = distributed.resolve_cluster(environ={"PMI_RANK": "0", "PMI_SIZE": "3"})
  assert cluster.coordinator_address is None and cluster.jax_detection == "mpi4py"


def test_detect_environment_names_the_launcher():
  assert distributed.detect_environment({}) is None
  assert distributed.detect_environment(SLURM_ENV) == "slurm"
  assert distributed.detect_environment(KUBERNETES_ENV) == "kubernetes"
  assert distributed.detect_environment({"PMI_RANK": "0", "PMI_SIZE": "2"}) == "mpi"


# ----------------------------------------------------------------------------- --distributed=auto|off|jax


def test_auto_falls_back_to_jax_detection_only_where_a_tpu_cluster_variable_is_set():
  laptop = {"HOME": "/root", "PATH": "/usr/bin"}
  assert distributed.resolve_cluster(environ=laptop) is None
  # Any pod has KUBERNETES_SERVICE_HOST: without an Indexed Job's index it stays one process.
  assert distributed.resolve_cluster(environ={**laptop, "KUBERNETES_SERVICE_HOST": "10.0.0.1"}) is None
  for variable in distributed.JAX_CLUSTER_VARIABLES:
    cluster = distributed.resolve_cluster(environ={**laptop, variable: "t1v-n-0,t1v-n-1"})
    assert cluster.source == "jax" and cluster.jax_detection is None
    assert (cluster.num_processes, cluster.process_id, cluster.coordinator_address) == (None, None, None)


def test_stalesgds_detectors_come_before_the_jax_fallback():
  environ = {
    "SLURM_JOB_ID": "1",
    "SLURM_STEP_NODELIST": "n[1-2]",
    "SLURM_NTASKS": "2",
    "SLURM_PROCID": "1",
    "SLURM_LOCALID": "0",
    "TPU_WORKER_ID": "0",
  }
  cluster = distributed.resolve_cluster(environ=environ)
  assert (cluster.source, cluster.num_processes, cluster.process_id) == ("slurm", 2, 1)


def test_jax_mode_hands_everything_to_jax_and_keeps_explicit_arguments():
  cluster = distributed.resolve_cluster(environ={}, mode="jax")
  assert (cluster.source, cluster.jax_detection, cluster.num_processes) == ("jax", None, None)
  cluster = distributed.resolve_cluster("host:1234", 4, 2, environ={"SLURM_NTASKS": "9"}, mode="jax")
  assert (cluster.coordinator_address, cluster.num_processes, cluster.process_id) == ("host:1234", 4, 2)


def test_off_mode_is_one_process_whatever_the_environment_and_refuses_cluster_arguments():
  slurm = {
    "SLURM_JOB_ID": "1",
    "SLURM_STEP_NODELIST": "n1",
    "SLURM_NTASKS": "2",
    "SLURM_PROCID": "0",
    "SLURM_LOCALID": "0",
  }
  assert distributed.resolve_cluster(environ=slurm, mode="off") is None
  assert distributed.resolve_cluster(num_processes=1, environ=slurm, mode="off") is None
  with pytest.raises(ValueError, match="'off'.*coordinator_address"):
    distributed.resolve_cluster("host:1234", environ={}, mode="off")
  with pytest.raises(ValueError, match="distributed mode 'mpi'; allowed"):
    distributed.resolve_cluster(environ={}, mode="mpi")


def test_initialize_in_jax_mode_calls_jax_with_automatic_detection(monkeypatch):
  calls = []
  monkeypatch.setattr(distributed.jax.distributed, "is_initialized", lambda: False)
  monkeypatch.setattr(distributed.jax.distributed, "initialize", lambda **kwargs: calls.append(kwargs))
  monkeypatch.setattr(distributed.jax.config, "update", lambda *args: None)
  cluster = distributed.initialize(mode="jax")
  assert cluster.source == "jax"
  [call] = calls
  assert call["cluster_detection_method"] is None and call["coordinator_address"] is None
  assert call["num_processes"] is None and call["process_id"] is None
