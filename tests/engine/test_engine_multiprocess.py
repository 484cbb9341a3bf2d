"""The engine on 2 processes x 4 CPU devices (gloo, 127.0.0.1) equals the engine on 1 process x 8.

A few blocks of async and 2-softsync schedules on the oracle's small CNN, with
DC-ASGD-a and 1/sigma (so every stale gradient is computed at, and corrected
with, its own past weights from the ring buffer). The whole final state must be
bit-identical: weights, ring buffer and optimizer state. Bit-identity is
expected, not just closeness, because nothing in the engine reduces across
devices: each gradient is computed whole on one device, and the
parameter-sharded server state is moved between processes (all-to-all,
all-gather) and updated element-wise, never summed in a different order.
"""

from __future__ import annotations

import concurrent.futures

import numpy as np
import pytest

from tests.helpers import engine_oracle, multiprocess_harness
from tests.helpers.workers import engine_multiprocess_worker

pytestmark = pytest.mark.multiprocess

WORKER = engine_multiprocess_worker.__name__  # run as ``python -m`` by the harness
TIMEOUT = 180.0  # seconds for both processes; about 20 s on 2 idle cores


def single_process_reference() -> dict[str, np.ndarray]:
  """The same runs in this pytest process, on its 8 host devices."""
  arrays = {}
  for schedule_name in engine_multiprocess_worker.SCHEDULES:
    _, _, state = engine_multiprocess_worker.train(schedule_name)
    arrays.update(engine_multiprocess_worker.gather_state(schedule_name, state))
  return arrays


@pytest.mark.slow
def test_two_processes_of_four_devices_equal_one_process_of_eight(devices, tmp_path):
  with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
    launched = pool.submit(
      multiprocess_harness.run_processes,
      WORKER,
      [],
      num_processes=2,
      devices_per_process=4,
      timeout=TIMEOUT,
      output_dir=tmp_path,
    )
    reference = single_process_reference()  # while the two processes run
    results = launched.result()
  for result in results:
    assert result.returncode == 0, result.describe()
  _, init_params, _ = engine_oracle.MODELS[engine_multiprocess_worker.MODEL]
  initial = init_params(0)
  for schedule_name in engine_multiprocess_worker.SCHEDULES:
    for name, value in initial.items():
      assert np.max(np.abs(reference[f"{schedule_name}/.params['{name}']"] - value)) > 1e-3, (schedule_name, name)
  for result in results:
    outputs = result.outputs
    assert int(outputs["process_count"]) == 2 and int(outputs["device_count"]) == len(devices)
    for schedule_name in engine_multiprocess_worker.SCHEDULES:
      assert int(outputs[f"{schedule_name}/max_staleness"]) >= 2, "stale weights must matter"
      assert int(outputs[f"{schedule_name}/num_blocks"]) >= 3
      # The state spans both processes and much of it is split over parameters, not replicated.
      assert not outputs[f"{schedule_name}/fully_addressable"]
      assert int(outputs[f"{schedule_name}/split_leaves"]) >= 4
    compared = [name for name in reference if name in outputs]
    assert compared == list(reference), sorted(set(reference) - set(outputs))
    for name in compared:
      np.testing.assert_array_equal(outputs[name], reference[name], err_msg=f"process {result.process_id}: {name}")
