"""Test-suite set-up that must run before JAX starts.

* Eight host CPU devices, so sharded code paths (one learner per device) are
  exercised on any machine.
* JAX's persistent compilation cache in a temporary directory for the session,
  shared with the subprocesses tests start: many tests compile the same
  programs (the same model and engine step in a fresh `Engine`), which are then
  read back instead of compiled again. A cached executable is the program a
  fresh compilation produces, so no result changes.
* No network: tensorflow-datasets retries a download for minutes when it cannot
  reach the internet, so every test that touches tfds uses
  ``tfds.testing.mock_data``; as a guard, sockets to anything but loopback
  raise immediately.
"""

import atexit
import os
import pathlib
import shutil
import socket
import tempfile

os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
if "JAX_COMPILATION_CACHE_DIR" not in os.environ:
  _cache_dir = tempfile.mkdtemp(prefix="stalesgd_test_jax_cache_")
  atexit.register(shutil.rmtree, _cache_dir, ignore_errors=True)
  os.environ["JAX_COMPILATION_CACHE_DIR"] = _cache_dir
  os.environ.setdefault("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", "0.25")

import jax  # configured above, before its first use

jax.config.update("jax_num_cpu_devices", 8)

import numpy as np
import pytest

NUM_TEST_DEVICES = 8

_LOOPBACK_HOSTS = {"127.0.0.1", "localhost", "::1", "0.0.0.0", ""}
_original_connect = socket.socket.connect


def _loopback_only_connect(self, address):
  host = address[0] if isinstance(address, tuple) else address
  if isinstance(host, str) and host not in _LOOPBACK_HOSTS and self.family != socket.AF_UNIX:
    raise RuntimeError(f"tests must not use the network (tried to connect to {address!r})")
  return _original_connect(self, address)


@pytest.fixture(autouse=True, scope="session")
def _no_network():
  socket.socket.connect = _loopback_only_connect
  yield
  socket.socket.connect = _original_connect


@pytest.fixture(scope="session")
def devices():
  found = jax.devices()
  assert len(found) == NUM_TEST_DEVICES, f"expected {NUM_TEST_DEVICES} host devices, got {len(found)}"
  return found


@pytest.fixture(scope="session")
def compilation_cache():
  """The session's persistent JAX compilation cache (above), for the ``stalesgd-train`` subprocesses too.

  One directory for the test processes (both pytest-xdist workers inherit it) and every subprocess: a program
  compiled in one of them is read back by the others. The subprocesses write every program to it
  (``main_environment``); these processes only those that took 0.25 s or more to compile, so the `compilations`
  fixture's positive control (a function compiled in milliseconds) is never read back.
  """
  return pathlib.Path(os.environ["JAX_COMPILATION_CACHE_DIR"])


BACKEND_COMPILE_EVENT = "/jax/core/compile/backend_compile_duration"


@pytest.fixture
def compilations():
  """The functions JAX compiles while the test runs (names from `jax.monitoring`)."""
  compiled = []

  def listener(event, duration, **metadata):
    del duration
    if event == BACKEND_COMPILE_EVENT:
      compiled.append(metadata.get("fun_name", "?"))

  jax.monitoring.register_event_duration_secs_listener(listener)
  # Positive control: a function never compiled before is reported.
  jax.jit(lambda x: x * 3.0 + 0.125)(np.float32(1.0)).block_until_ready()
  assert compiled, "jax.monitoring reported no compilation: the check below would prove nothing"
  compiled.clear()
  yield compiled
  jax.monitoring.unregister_event_duration_listener(listener)


# The files that take longest, longest first (seconds of `--durations=0` in a full run on the 2-core development
# machine, an AMD EPYC, nothing else running, 2026-12-07: 10:56 wall, 1,270 s of tests).
# pytest-xdist (`make test`: `-n 2 --dist loadfile --no-loadscope-reorder`) hands out whole files in collection
# order, the next one to a worker whose queue is down to 2 tests. By default xdist would first order files by their
# number of tests, most first: the long files of one or two tests (the demo, 71 s) then start last, while the
# other worker runs dry (a quiet run: 1,398 s of tests in 762 s on 2 workers, about 120 s idle). So the files that
# take longest go first, and the many short files fill the end.
LONG_FILES = (
  "tests/engine/test_engine_exactness.py",  # 93 s, 39 tests
  "tests/decentral/test_streaming_diloco.py",  # 87 s, 49 tests (the oracle grid)
  "tests/faults/test_kill_two_processes.py",  # 85 s, 2 tests (SIGTERM, SIGKILL and resume of 2 processes)
  "tests/benchmarks/test_training_benchmark.py",  # 83 s, 18 tests (the GPU suite at tiny size: 67 s)
  "tests/studies/test_demo_robustness.py",  # 71 s, 1 test
  "tests/cli/test_experiment_reproduce.py",  # 43 s, 4 tests
  "tests/models/test_models_zoo.py",  # 37 s, 44 tests
  "tests/training/test_checkpoint.py",  # 35 s, 22 tests
  "tests/studies/test_study_parallel.py",  # 34 s, 6 tests
  "tests/training/test_train_protocols.py",  # 33 s, 14 tests
  "tests/transforms/test_transforms_contract.py",  # 33 s, 220 tests
  "tests/faults/test_kill_resume.py",  # 31 s, 3 tests
  "tests/training/test_train_resume.py",  # 31 s, 2 tests
  "tests/training/test_own_experiment.py",  # 31 s, 13 tests
  "tests/cli/test_train_command_line.py",  # 28 s, 7 tests
  "tests/models/test_models_imagenet_step.py",  # 26 s, 2 tests
  "tests/decentral/test_dcs3gd.py",  # 24 s, 36 tests
  "tests/distributed/test_multiprocess_dcs3gd.py",  # 23 s, 6 tests
  "tests/training/test_train_outputs.py",  # 22 s, 15 tests
  "tests/training/test_diloco_protocol.py",  # 20 s, 6 tests
  "tests/repository/test_packaging.py",  # 19 s, 25 tests
  "tests/repository/test_doc_examples.py",  # 18 s, 4 tests
  "tests/transforms/test_delayed.py",  # 17 s, 16 tests
  "tests/benchmarks/test_decentral_benchmark.py",  # 17 s, 1 test
  "tests/training/test_device_layout.py",  # 16 s, 17 tests
)


def pytest_collection_modifyitems(config, items):
  """Puts the tests of `LONG_FILES` first, in that order (a stable sort: the rest keep theirs)."""
  del config
  rank = {path: index for index, path in enumerate(LONG_FILES)}
  items.sort(key=lambda item: rank.get(item.nodeid.split("::")[0], len(LONG_FILES)))
