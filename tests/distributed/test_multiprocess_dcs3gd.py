"""Real multi-process runs on 127.0.0.1 (gloo): 2 processes x 4 devices equal 1 process x 8.

Also: a killed process brings the survivor down with an error instead of a
hang, and ``launch/local.sh`` runs, and stops, a multi-process job.
"""

from __future__ import annotations

import concurrent.futures
import os
import re
import subprocess

import numpy as np
import pytest

from tests.helpers import multiprocess_harness
from tests.helpers.workers import dcs3gd_worker

pytestmark = pytest.mark.multiprocess

STEPS = 4
# The cross-process all-reduce (gloo) sums in a different order from the
# in-process one; after 4 steps the weights differ by at most a few float32 ulps
# (measured: 6e-8 absolute).
RTOL, ATOL = 1e-6, 1e-7
HEARTBEAT_TIMEOUT = 5
LOCAL_SH = multiprocess_harness.REPOSITORY_ROOT / "launch" / "local.sh"
WORKER = dcs3gd_worker.__name__  # run as ``python -m`` (by the harness and by local.sh)


def single_process_reference(protocols):
  """The same training in this pytest process, on its 8 host devices."""
  reference = {}
  for protocol in protocols:
    trainer, state = dcs3gd_worker.train(protocol, steps=STEPS, seed=0)
    reference.update(dcs3gd_worker.flatten_result(protocol, trainer, state))
  return reference


def assert_same_weights(merged, reference):
  compared = 0
  for name, expected in reference.items():
    if name.endswith("process_count"):
      continue
    np.testing.assert_allclose(merged[name], expected, rtol=RTOL, atol=ATOL, err_msg=name)
    compared += 1
  assert compared > 0


@pytest.mark.slow
def test_two_processes_of_four_devices_match_one_process_of_eight(devices, tmp_path):
  protocols = list(dcs3gd_worker.PROTOCOL_CONFIGS)
  with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
    launched = pool.submit(
      multiprocess_harness.run_processes,
      WORKER,
      [f"--steps={STEPS}", f"--protocols={','.join(protocols)}"],
      num_processes=2,
      devices_per_process=4,
      timeout=60,
      output_dir=tmp_path,
    )
    reference = single_process_reference(protocols)  # while the two processes run
    results = launched.result()
  for result in results:
    assert result.returncode == 0, result.describe()
  merged = {**results[0].outputs, **results[1].outputs}
  assert int(merged[f"{protocols[0]}/process_count"]) == 2
  # Each process wrote only its own workers' local weights: 0-3 and 4-7.
  assert {name.rsplit("worker", 1)[1] for name in results[1].outputs if "/local/" in name} == {"4", "5", "6", "7"}
  assert_same_weights(merged, reference)


@pytest.mark.slow
@pytest.mark.parametrize("killed_process", [1, 0], ids=["peer", "coordinator"])
def test_killed_process_makes_the_survivor_exit_with_an_error(killed_process, tmp_path):
  results = multiprocess_harness.run_processes(
    WORKER,
    [
      "--steps=8",
      "--protocols=dcs3gd",
      f"--die_process={killed_process}",
      "--die_at_step=3",
      f"--heartbeat_timeout={HEARTBEAT_TIMEOUT}",
    ],
    num_processes=2,
    devices_per_process=4,
    timeout=60,
    output_dir=tmp_path,
    stop_all_on_failure=False,
  )
  killed, survivor = results[killed_process], results[1 - killed_process]
  assert killed.returncode == -9, killed.describe()
  # The survivor was not killed by the harness's timeout: it noticed the dead
  # peer and aborted with an error. A dead peer is noticed by missed
  # heartbeats, about one heartbeat timeout later (measured: 4.4 s with a 5 s
  # timeout); a dead coordinator at once, when its connection drops (measured:
  # 0.1-0.3 s), as `distributed.initialize` and launch/README.md say.
  assert survivor.returncode not in (0, None), survivor.describe()
  assert survivor.outputs is None
  assert survivor.elapsed - killed.elapsed < HEARTBEAT_TIMEOUT + 20, (survivor.elapsed, killed.elapsed)
  if killed_process == 0:
    assert survivor.elapsed - killed.elapsed < HEARTBEAT_TIMEOUT, (survivor.elapsed, killed.elapsed)
  assert "distributed service detected fatal errors" in survivor.stderr or "heartbeat" in survivor.stderr


def run_local_sh(args, tmp_path, timeout=60):
  env = multiprocess_harness.process_environment(devices_per_process=4)
  env.pop("JAX_NUM_CPU_DEVICES")  # local.sh sets it: 8 / N
  env.update({"LAUNCH_MODULE": WORKER, "LAUNCH_KILL_GRACE": "1"})
  return subprocess.run(
    [str(LOCAL_SH), "2"] + args + [f"--output_dir={tmp_path}"],
    env=env,
    capture_output=True,
    text=True,
    timeout=timeout,
    cwd=multiprocess_harness.REPOSITORY_ROOT,
  )


@pytest.mark.slow
def test_local_sh_runs_two_processes_with_four_devices_each(devices, tmp_path):
  completed = run_local_sh([f"--steps={STEPS}", "--protocols=dcs3gd"], tmp_path)
  assert completed.returncode == 0, completed.stderr[-3000:]
  assert "[process 1] process 1 done" in completed.stdout
  merged = {}
  for process_id in range(2):
    with np.load(tmp_path / f"process_{process_id}.npz") as archive:
      merged.update({name: archive[name] for name in archive.files})
  assert_same_weights(merged, single_process_reference(["dcs3gd"]))


@pytest.mark.slow
def test_local_sh_stops_everything_when_one_process_dies(tmp_path):
  # A long heartbeat timeout: only local.sh's own failure handling can end the
  # survivor quickly.
  completed = run_local_sh(
    ["--steps=50", "--protocols=dcs3gd", "--die_process=1", "--die_at_step=2", "--heartbeat_timeout=300"], tmp_path
  )
  # The survivor notices its peer's death in gloo and aborts (SIGABRT, 134) within
  # milliseconds; when both exits fall in one of local.sh's polls, the survivor's may
  # be the one reported. Either way local.sh ends with a failure naming a process.
  assert completed.returncode in (137, 134), completed.stderr[-3000:]
  reported = re.search(r"process (\d) exited with status (\d+); stopping the others", completed.stderr)
  assert reported, completed.stderr[-3000:]
  assert int(reported.group(2)) == completed.returncode
  if completed.returncode == 137:
    assert reported.group(1) == "1"
  assert not (tmp_path / "process_0.npz").exists()


def test_local_sh_rejects_a_bad_process_count(tmp_path):
  completed = subprocess.run(
    [str(LOCAL_SH), "3"], capture_output=True, text=True, timeout=10, env={**os.environ, "LAUNCH_MODULE": WORKER}
  )
  assert completed.returncode == 2 and "does not divide 8" in completed.stderr
