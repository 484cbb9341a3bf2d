"""The launch files agree with what stalesgd.utils._distributed.initialize reads."""

from __future__ import annotations

import pathlib
import subprocess

import pytest

from stalesgd.utils import _distributed as distributed

LAUNCH = pathlib.Path(__file__).resolve().parents[2] / "launch"


def test_kubernetes_job_environment_resolves_to_pod_zero_behind_the_headless_service():
  yaml = pytest.importorskip("yaml")
  service, job = yaml.safe_load_all((LAUNCH / "kubernetes.yaml").read_text())
  assert service["spec"]["clusterIP"] == "None"
  assert service["spec"]["selector"] == {"job-name": job["metadata"]["name"]}
  assert job["spec"]["completionMode"] == "Indexed"
  pod = job["spec"]["template"]["spec"]
  assert pod["subdomain"] == service["metadata"]["name"]
  [container] = pod["containers"]
  environ = {
    "KUBERNETES_SERVICE_HOST": "10.0.0.1",
    "JOB_COMPLETION_INDEX": "1",
    "HOSTNAME": f"{job['metadata']['name']}-1",
  }
  for variable in container["env"]:
    if "value" in variable:
      environ[variable["name"]] = variable["value"]
    else:  # the downward API's job-name label
      assert variable["valueFrom"]["fieldRef"]["fieldPath"] == "metadata.labels['job-name']"
      environ[variable["name"]] = job["metadata"]["name"]
  cluster = distributed.resolve_cluster(environ=environ)
  assert cluster.num_processes == job["spec"]["completions"] == job["spec"]["parallelism"]
  assert cluster.process_id == 1
  port = environ["JAX_COORDINATOR_PORT"]
  assert cluster.coordinator_address == f"{job['metadata']['name']}-0.{service['metadata']['name']}:{port}"
  assert {"containerPort": int(port)} in container["ports"]


@pytest.mark.parametrize("script", ["local.sh", "slurm.sbatch"])
def test_shell_scripts_parse(script):
  completed = subprocess.run(["bash", "-n", str(LAUNCH / script)], capture_output=True, text=True)
  assert completed.returncode == 0, completed.stderr


def test_slurm_script_uses_srun_one_task_per_gpu_and_fails_fast():
  text = (LAUNCH / "slurm.sbatch").read_text()
  assert "srun --kill-on-bad-exit=1" in text
  assert "#SBATCH --ntasks-per-node=8" in text and "#SBATCH --gpus-per-node=8" in text
  assert "--gpus-per-task" not in text.split("set -euo pipefail")[1]


def test_kubernetes_job_runs_a_config_file_that_exists():
  yaml = pytest.importorskip("yaml")
  _, job = yaml.safe_load_all((LAUNCH / "kubernetes.yaml").read_text())
  [container] = job["spec"]["template"]["spec"]["containers"]
  [config] = [argument.split("=", 1)[1] for argument in container["command"] if argument.startswith("--config=")]
  assert (LAUNCH.parent / config.split(":")[0]).is_file(), config


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
  yaml = pytest.importorskip("yaml")
  _, job = yaml.safe_load_all((LAUNCH / "kubernetes.yaml").read_text())
  [container] = job["spec"]["template"]["spec"]["containers"]
  assert container["image"].endswith("/stalesgd:cuda12")
  assert "-t stalesgd:cuda12" in (LAUNCH / "Dockerfile").read_text()
  assert "launch/Dockerfile" in (LAUNCH / "kubernetes.yaml").read_text()
