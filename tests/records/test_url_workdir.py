"""URL workdirs: which are refused before anything starts, and a round trip of a run's files on a GCS emulator.

The emulator is gcp-storage-emulator (from the package registry, in the test
extra), started on 127.0.0.1 for this module: no network. It speaks GCS's JSON
API as gcsfs (epath's backend here) and google-cloud-storage (tensorboardX's)
use it, but it keeps no object generations, which tensorstore's OCDBT driver
needs for the checkpoint manifest ("Malformed StorageGeneration" at the first
save of a run, measured by hand), so checkpoints on ``gs://`` are not exercised
here; the README's "What survives what" says what was tested where.
"""

from __future__ import annotations

import io
import json
import os
import socket
import subprocess
import sys
import time

import numpy as np
import pytest
from etils import epath

from stalesgd.records import _paths as paths
from stalesgd.records._metrics import MetricWriter, read_jsonl
from stalesgd.reports import _plots as plots
from stalesgd.reports import _tables as tables
from stalesgd.schedule import Schedule, simulate
from stalesgd.training._workdir import check_same_run, write_config
from tests.helpers.train_helpers import CONFIG_FILE, event_scalars, tiny_config

BUCKET = "stalesgd-test"
# gcsfs reads this when it is imported: without it, its first call on a bucket probes the bucket's type over
# gRPC, which the emulator does not serve (60 s timeouts, retried).
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")


# ----------------------------------------------------------------------------- refusals


@pytest.mark.parametrize(
  "workdir, expected",
  [
    ("s3://bucket/run", "cannot checkpoint to s3://"),
    ("az://container/run", "cannot checkpoint to az://"),
    ("http://example.com/run", "allowed: a local path or gs://bucket/path"),
    ("gs:/bucket/run", "allowed: a local path or gs://bucket/path"),
    ("gs://", "allowed: a local path or gs://bucket/path"),
    ("", "is empty"),
  ],
)
def test_unsupported_workdirs_are_refused_naming_the_field(workdir, expected):
  with pytest.raises(ValueError, match="--workdir") as raised:
    paths.check_workdir(workdir)
  assert expected in str(raised.value)


@pytest.mark.parametrize("workdir", ["runs/a", "/tmp/runs/a", "C:/runs/a", "runs/with:colon"])
def test_local_paths_pass(workdir):
  paths.check_workdir(workdir)
  assert not paths.is_url(workdir)


def test_gs_without_its_packages_names_what_to_install(monkeypatch):
  monkeypatch.setattr(paths, "_module_missing", lambda module: module in ("gcsfs", "tensorflow"))
  with pytest.raises(ValueError, match=r"needs gcsfs, which this environment lacks.*stalesgd\[gs\]"):
    paths.check_workdir("gs://bucket/run")
  monkeypatch.setattr(paths, "_module_missing", lambda module: module == "gcsfs")  # TensorFlow's gfile serves
  paths.check_workdir("gs://bucket/run")


@pytest.mark.slow
def test_the_program_refuses_an_s3_workdir_before_jax_starts(tmp_path):
  started = time.monotonic()
  completed = subprocess.run(
    [sys.executable, "-m", "stalesgd.cli.train", f"--config={CONFIG_FILE}:hardsync", "--workdir=s3://bucket/run"],
    capture_output=True,
    text=True,
    timeout=120,
    cwd=tmp_path,
    env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)},
  )
  assert completed.returncode != 0
  assert "cannot checkpoint to s3://" in completed.stderr
  assert "Traceback" not in completed.stderr
  assert not any(tmp_path.iterdir())  # nothing written, not even a folder named s3:
  assert time.monotonic() - started < 60


# ----------------------------------------------------------------------------- the emulator


_KEEPERS: list[subprocess.Popen] = []  # referenced until exit, so their stdin stays open


def _free_port() -> int:
  with socket.socket() as probe:
    probe.bind(("127.0.0.1", 0))
    return probe.getsockname()[1]


@pytest.fixture(scope="module")
def gcs_emulator():
  """``http://127.0.0.1:PORT`` of an in-memory GCS emulator holding the bucket `BUCKET`."""
  pytest.importorskip("gcp_storage_emulator")
  pytest.importorskip("gcsfs")
  port = _free_port()
  emulator = [sys.executable, "-m", "gcp_storage_emulator", "start", "--host=127.0.0.1", f"--port={port}"]
  emulator += [f"--default-bucket={BUCKET}", "--in-memory"]
  # The emulator lives until this process exits (its stdin closes): tensorboardX's GCS writer uploads again
  # when it is garbage-collected, even after close(), and each upload to a dead emulator retries for 120 s.
  keeper = "import subprocess, sys; emulator = subprocess.Popen(sys.argv[1:]); sys.stdin.read(); emulator.kill()"
  process = subprocess.Popen(
    [sys.executable, "-c", keeper, *emulator],
    stdin=subprocess.PIPE,
    stdout=subprocess.DEVNULL,
    stderr=subprocess.DEVNULL,
  )
  _KEEPERS.append(process)
  deadline = time.monotonic() + 60
  while True:
    try:
      socket.create_connection(("127.0.0.1", port), timeout=1).close()
      break
    except OSError:
      if time.monotonic() > deadline or process.poll() is not None:
        process.kill()
        pytest.fail("the GCS emulator did not start")
      time.sleep(0.2)
  return f"http://127.0.0.1:{port}"


@pytest.fixture
def bucket(gcs_emulator, monkeypatch, request):
  """A fresh ``gs://`` prefix on the emulator, with gcsfs and google-cloud-storage pointed at it."""
  import fsspec

  monkeypatch.setenv("STORAGE_EMULATOR_HOST", gcs_emulator)
  monkeypatch.setenv("GOOGLE_CLOUD_PROJECT", "test")
  monkeypatch.setenv("NO_GCE_CHECK", "true")
  monkeypatch.setitem(fsspec.config.conf, "gcs", {"token": "anon"})
  fsspec.AbstractFileSystem.clear_instance_cache()
  return epath.Path(f"gs://{BUCKET}/{request.node.name.replace('[', '_').replace(']', '')}")


def _download_events(directory: epath.Path, target) -> None:
  """Copies the event files to a local folder, their modification times in name (creation) order."""
  names = sorted(path.name for path in directory.iterdir() if path.name.startswith("events.out.tfevents."))
  for position, name in enumerate(names):
    local = target / name
    local.write_bytes((directory / name).read_bytes())
    os.utime(local, ns=(position * 10**9, position * 10**9))


def _write_then_resume(workdir) -> None:
  """Five records, a resume from step 3, then steps 4 and 5 again with other values."""
  with MetricWriter(workdir, enabled=True) as writer:
    for step in range(1, 6):
      writer.write_scalars(step, {"train_loss": 1.0 / step})
    writer.flush()
  with MetricWriter(workdir, enabled=True) as writer:
    writer.truncate_after(3)
    for step in (4, 5):
      writer.write_scalars(step, {"train_loss": 10.0 + step})


def test_metrics_and_tensorboard_on_gcs_resume_as_they_do_locally(bucket, tmp_path):
  _write_then_resume(tmp_path / "local")
  _write_then_resume(bucket)

  expected = [{"step": 1, "train_loss": 1.0}, {"step": 2, "train_loss": 0.5}, {"step": 3, "train_loss": 1 / 3}]
  expected += [{"step": 4, "train_loss": 14.0}, {"step": 5, "train_loss": 15.0}]
  assert read_jsonl(bucket / "metrics.jsonl") == expected
  assert read_jsonl(tmp_path / "local" / "metrics.jsonl") == expected
  downloaded = tmp_path / "downloaded"
  downloaded.mkdir()
  _download_events(bucket, downloaded)
  shown = event_scalars(downloaded, apply_purges=True)
  assert shown == event_scalars(tmp_path / "local", apply_purges=True)
  assert [step for step, _ in shown["train_loss"]] == [1, 2, 3, 4, 5]


def test_unflushed_records_on_gcs_reach_the_bucket_at_flush_not_before(bucket):
  writer = MetricWriter(bucket, enabled=True)
  writer.write_scalars(1, {"train_loss": 1.0})
  writer.flush()
  writer.write_scalars(2, {"train_loss": 2.0})
  assert [record["step"] for record in read_jsonl(bucket / "metrics.jsonl")] == [1]  # one upload per flush
  writer.close()
  assert [record["step"] for record in read_jsonl(bucket / "metrics.jsonl")] == [1, 2]


def test_config_schedule_plots_and_tables_round_trip_on_gcs(bucket):
  config = tiny_config("hardsync")
  write_config(config, bucket)
  check_same_run(config, bucket)  # the same run: accepted
  changed = tiny_config("hardsync", seed=config.seed + 1)
  with pytest.raises(ValueError, match="holds a run of another config"):
    check_same_run(changed, bucket)

  schedule = simulate("async", learners=3, num_updates=30, seed=0)
  staleness = schedule.gradient_staleness
  schedule_file = io.BytesIO()
  schedule.save(schedule_file)
  paths.write_whole(bucket / "schedule.npz", schedule_file.getvalue())
  loaded = Schedule.load(io.BytesIO((bucket / "schedule.npz").read_bytes()))
  np.testing.assert_array_equal(loaded.gradient_staleness, staleness)

  figure_path = plots.plot_staleness_histograms({"async": staleness}, bucket / "staleness.png")
  assert figure_path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
  tables.write_results_table([{"variant": "async", "test_error": 12.5}], bucket / "results.csv")
  assert (bucket / "results.csv").read_bytes() == b"variant,test_error\r\nasync,12.5\r\n"
  paths.write_whole(bucket / "summary.json", json.dumps({"preempted": False}))
  assert json.loads((bucket / "summary.json").read_text()) == {"preempted": False}
