"""The launch files agree with what stalesgd.cluster._distributed.initialize reads."""

from __future__ import annotations

import os
import pathlib
import signal
import subprocess
import time

import pytest

from stalesgd import configs
from stalesgd.cluster import _distributed as distributed

LAUNCH = pathlib.Path(__file__).resolve().parents[2] / "launch"
PREEMPTED = 75  # stalesgd.training.PREEMPTED_EXIT_STATUS, as the launch files (YAML, bash) spell it


def _kubernetes_manifest():
  """(the PersistentVolumeClaim, the JobSet, its replicated job, the Job spec, the pod spec)."""
  yaml = pytest.importorskip("yaml")
  claim, jobset = yaml.safe_load_all((LAUNCH / "kubernetes.yaml").read_text())
  [replicated] = jobset["spec"]["replicatedJobs"]
  job = replicated["template"]["spec"]
  return claim, jobset, replicated, job, job["template"]["spec"]


def test_kubernetes_job_environment_resolves_to_pod_zero_behind_the_headless_service():
  _, jobset, replicated, job, pod = _kubernetes_manifest()
  assert jobset["kind"] == "JobSet" and jobset["apiVersion"].startswith("jobset.x-k8s.io/")
  assert jobset["spec"]["network"]["enableDNSHostnames"] is True
  service = jobset["spec"]["network"]["subdomain"]
  assert job["completionMode"] == "Indexed" and replicated["replicas"] == 1
  [container] = pod["containers"]
  # The JobSet names its child Job <jobset>-<replicated job>-<job index>, and that Job's pods
  # <job name>-<completion index>: the job-name label the downward API gives JOB_NAME.
  job_name = f"{jobset['metadata']['name']}-{replicated['name']}-0"
  environ = {"KUBERNETES_SERVICE_HOST": "10.0.0.1", "JOB_COMPLETION_INDEX": "1", "HOSTNAME": f"{job_name}-1"}
  for variable in container["env"]:
    if "value" in variable:
      environ[variable["name"]] = variable["value"]
    else:  # the downward API's job-name label
      assert variable["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['job-name']"
      environ[variable["name"]] = job_name
  assert environ["STALESGD_K8S_SERVICE"] == service
  cluster = distributed.resolve_cluster(environ=environ)
  assert cluster.num_processes == job["completions"] == job["parallelism"]
  assert cluster.process_id == 1
  port = environ["JAX_COORDINATOR_PORT"]
  assert cluster.coordinator_address == f"{job_name}-0.{service}:{port}"
  assert {"containerPort": int(port)} in container["ports"]


def test_kubernetes_preemption_restarts_the_whole_group_from_a_shared_volume():
  """Exit status 75 or a disruption fails the Job at once; the JobSet restarts every pod, uncounted."""
  claim, jobset, _, job, pod = _kubernetes_manifest()
  assert job["backoffLimit"] == 0 and pod["restartPolicy"] == "Never"
  rules = job["podFailurePolicy"]["rules"]
  [on_exit] = [rule for rule in rules if "onExitCodes" in rule]
  [container] = pod["containers"]
  assert on_exit["action"] == "FailJob" and on_exit["onExitCodes"]["values"] == [PREEMPTED]
  assert on_exit["onExitCodes"]["operator"] == "In" and on_exit["onExitCodes"]["containerName"] == container["name"]
  [on_disruption] = [rule for rule in rules if "onPodConditions" in rule]
  assert on_disruption["action"] == "FailJob"
  assert on_disruption["onPodConditions"] == [{"type": "DisruptionTarget", "status": "True"}]
  [restart] = jobset["spec"]["failurePolicy"]["rules"]
  assert restart["action"] == "RestartJobSetAndIgnoreMaxRestarts"
  assert restart["onJobFailureReasons"] == ["PodFailurePolicy"]
  assert jobset["spec"]["failurePolicy"]["maxRestarts"] >= 1
  # The run directory is on the claim, shared by every pod and outliving them.
  assert claim["kind"] == "PersistentVolumeClaim" and claim["spec"]["accessModes"] == ["ReadWriteMany"]
  [volume] = pod["volumes"]
  assert volume["persistentVolumeClaim"]["claimName"] == claim["metadata"]["name"]
  [mount] = container["volumeMounts"]
  assert mount["name"] == volume["name"]
  [workdir] = [argument.split("=", 1)[1] for argument in container["command"] if argument.startswith("--workdir=")]
  assert workdir.startswith(mount["mountPath"].rstrip("/") + "/")
  assert pod["terminationGracePeriodSeconds"] >= 60  # time to checkpoint after SIGTERM


@pytest.mark.parametrize("script", ["local.sh", "slurm.sbatch", "study_array.sbatch", "requeue_on_preemption.sh"])
def test_shell_scripts_parse(script):
  completed = subprocess.run(["bash", "-n", str(LAUNCH / script)], capture_output=True, text=True)
  assert completed.returncode == 0, completed.stderr


def test_slurm_script_uses_srun_one_task_per_gpu_and_fails_fast():
  text = (LAUNCH / "slurm.sbatch").read_text()
  assert "srun --kill-on-bad-exit=1" in text
  assert "#SBATCH --ntasks-per-node=8" in text and "#SBATCH --gpus-per-node=8" in text
  assert "--gpus-per-task" not in text.split("set -euo pipefail")[1]


def test_kubernetes_job_runs_a_config_that_exists():
  """A packaged config's name (what the image's installed stalesgd resolves), or a file of the source tree."""
  [container] = _kubernetes_manifest()[-1]["containers"]
  [config] = [argument.split("=", 1)[1] for argument in container["command"] if argument.startswith("--config=")]
  name = config.split(":")[0]
  assert name in configs.names() or (LAUNCH.parent / name).is_file(), config


def test_dockerfile_copies_what_the_install_needs_and_pins_the_tested_versions():
  """The Dockerfile cannot be built here (no Docker, no network): check it against pyproject.toml instead."""
  import tomllib

  root = LAUNCH.parent
  text = (LAUNCH / "Dockerfile").read_text()
  copied = set()
  for line in text.splitlines():
    if line.startswith("COPY "):
      *sources, _ = line.split()[1:]
      copied.update(sources)
  assert all((root / source).exists() for source in copied), copied
  project = tomllib.loads((root / "pyproject.toml").read_text())
  needed = {project["project"]["readme"], *project["project"]["license-files"], "pyproject.toml"}
  needed |= {pattern.rstrip("*") for pattern in project["tool"]["setuptools"]["packages"]["find"]["include"]}
  assert needed <= copied, needed - copied
  assert "pip install -c requirements/constraints.txt" in text
  assert "cuda12" in project["project"]["optional-dependencies"] and "EXTRAS=train,cuda12" in text


def test_the_kubernetes_image_is_the_dockerfiles_cuda_variant():
  [container] = _kubernetes_manifest()[-1]["containers"]
  assert container["image"].endswith("/stalesgd:cuda12")
  assert "-t stalesgd:cuda12" in (LAUNCH / "Dockerfile").read_text()
  assert "launch/Dockerfile" in (LAUNCH / "kubernetes.yaml").read_text()


# ----------------------------------------------------------------------------- SLURM: requeue on preemption


def _stub(path: pathlib.Path, body: str) -> None:
  path.write_text("#!/usr/bin/env bash\n" + body + "\n")
  path.chmod(0o755)


def _slurm_job(tmp_path, script: str, program_body: str):
  """The script with stubs on PATH: its program (srun, or the interpreter of the study array) and scontrol."""
  stubs = tmp_path / "bin"
  stubs.mkdir()
  _stub(stubs / "scontrol", f'echo "$@" >> {tmp_path / "scontrol_calls"}')
  _stub(stubs / "srun", program_body)
  _stub(stubs / "python", program_body)
  environ = {
    "PATH": f"{stubs}:{os.environ['PATH']}",
    "SLURM_SUBMIT_DIR": str(LAUNCH.parent),
    "SLURM_JOB_ID": "1234",
    "SLURM_ARRAY_TASK_ID": "3",
    "PYTHON": str(stubs / "python"),
  }
  return ["bash", str(LAUNCH / script), "--workdir=/shared/runs/x"], environ


def _scontrol_calls(tmp_path) -> list[str]:
  path = tmp_path / "scontrol_calls"
  return path.read_text().splitlines() if path.exists() else []


@pytest.mark.parametrize("script", ["slurm.sbatch", "study_array.sbatch"])
@pytest.mark.parametrize("status, requeued", [(PREEMPTED, True), (0, False), (1, False)])
def test_a_slurm_job_is_requeued_exactly_when_its_run_was_preempted(script, status, requeued, tmp_path):
  command, environ = _slurm_job(tmp_path, script, f"exit {status}")
  completed = subprocess.run(command, env=environ, capture_output=True, text=True, timeout=60)
  assert completed.returncode == status, completed.stderr
  assert _scontrol_calls(tmp_path) == (["requeue 1234"] if requeued else [])


@pytest.mark.parametrize("script", ["slurm.sbatch", "study_array.sbatch"])
def test_sigterm_ahead_of_the_time_limit_reaches_the_run_and_requeues_the_job(script, tmp_path):
  """SLURM's --signal=B:TERM@120 signals the batch shell only: the script passes it on to the run."""
  text = (LAUNCH / script).read_text()
  assert "#SBATCH --requeue" in text and "#SBATCH --signal=B:TERM@" in text
  started = tmp_path / "started"
  # A run that checkpoints and exits 75 on SIGTERM, as every stalesgd program does.
  body = f"trap 'exit {PREEMPTED}' TERM\ntouch {started}\nwhile true; do sleep 0.05; done"
  command, environ = _slurm_job(tmp_path, script, body)
  job = subprocess.Popen(command, env=environ, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
  deadline = time.monotonic() + 30
  while not started.exists():
    assert job.poll() is None and time.monotonic() < deadline, job.communicate()
    time.sleep(0.05)
  job.send_signal(signal.SIGTERM)
  _, stderr = job.communicate(timeout=30)
  assert job.returncode == PREEMPTED, stderr
  assert "passing it to the run" in stderr
  assert _scontrol_calls(tmp_path) == ["requeue 1234"]


def test_the_launch_files_preempted_status_is_the_programs():
  from stalesgd.training import PREEMPTED_EXIT_STATUS

  assert PREEMPTED == PREEMPTED_EXIT_STATUS
  assert f"PREEMPTED_EXIT_STATUS={PREEMPTED}" in (LAUNCH / "requeue_on_preemption.sh").read_text()
