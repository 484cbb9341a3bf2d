"""Tests for stalesgd.records._metrics: JSON lines, TensorBoard event files (read back without TensorFlow), resume."""

from __future__ import annotations

import json
import math
import pathlib
import struct

import jax.numpy as jnp
import numpy as np
import pytest
from tensorboardX.proto import event_pb2

from stalesgd.records import _run_directory as run_directory
from stalesgd.records._metrics import MetricWriter, integer_bins, read_jsonl, to_json_value
from tests.helpers.train_helpers import event_hparams


def _crc32c(data: bytes) -> int:
  """CRC-32C (Castagnoli), bit by bit: an implementation independent of tensorboardX's."""
  crc = 0xFFFFFFFF
  for byte in data:
    crc ^= byte
    for _ in range(8):
      crc = (crc >> 1) ^ (0x82F63B78 if crc & 1 else 0)
  return crc ^ 0xFFFFFFFF


def _masked_crc32c(data: bytes) -> int:
  crc = _crc32c(data)
  return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def _read_events(path: pathlib.Path) -> list[event_pb2.Event]:
  """Parses TFRecord framing (length, masked CRCs) and the Event protos of one file."""
  data = path.read_bytes()
  events, offset = [], 0
  while offset < len(data):
    header = data[offset : offset + 8]
    (length,) = struct.unpack("<Q", header)
    (header_crc,) = struct.unpack("<I", data[offset + 8 : offset + 12])
    assert header_crc == _masked_crc32c(header)
    payload = data[offset + 12 : offset + 12 + length]
    (payload_crc,) = struct.unpack("<I", data[offset + 12 + length : offset + 16 + length])
    assert payload_crc == _masked_crc32c(payload)
    events.append(event_pb2.Event.FromString(payload))
    offset += 16 + length
  return events


def _event_files(workdir: pathlib.Path) -> list[pathlib.Path]:
  return sorted(workdir.glob("events.out.tfevents.*"), key=lambda path: path.stat().st_mtime_ns)


def _scalars(events) -> dict[str, list[tuple[int, float]]]:
  found: dict[str, list[tuple[int, float]]] = {}
  for event in events:
    for value in event.summary.value:
      if value.WhichOneof("value") == "simple_value":
        found.setdefault(value.tag, []).append((event.step, value.simple_value))
  return found


def test_jsonl_records_hold_python_numbers(tmp_path):
  with MetricWriter(tmp_path, enabled=True) as writer:
    writer.write_scalars(0, {"train_loss": jnp.float32(2.5), "staleness_max": np.int64(7), "lr_scale": 0.125})
    writer.write_scalars(np.int32(1), {"test_error": jnp.array([12.5]), "diverged": np.bool_(False)})
    writer.write_scalars(2, {"train_loss": float("nan")})
  lines = (tmp_path / run_directory.METRICS).read_text().splitlines()
  assert [json.loads(line)["step"] for line in lines] == [0, 1, 2]
  records = read_jsonl(tmp_path / run_directory.METRICS)
  assert records[:2] == [
    {"step": 0, "train_loss": 2.5, "staleness_max": 7, "lr_scale": 0.125},
    {"step": 1, "test_error": 12.5, "diverged": 0},
  ]
  assert isinstance(records[0]["staleness_max"], int)
  assert math.isnan(records[2]["train_loss"])


def test_event_file_holds_the_scalars_and_histograms(tmp_path):
  staleness = np.array([0, 1, 1, 2, 2, 2, 9], dtype=np.int64)
  with MetricWriter(tmp_path, enabled=True) as writer:
    writer.write_scalars(10, {"train_loss": 0.75, "images_per_s": np.float64(1500.0)})
    writer.write_scalars(20, {"train_loss": jnp.float32(0.5)})
    writer.write_histograms(20, {"staleness": staleness})
  (event_file,) = _event_files(tmp_path)
  events = _read_events(event_file)
  assert events[0].file_version.startswith("brain.Event")
  assert _scalars(events) == {"train_loss": [(10, 0.75), (20, 0.5)], "images_per_s": [(10, 1500.0)]}
  (histogram,) = [value.histo for event in events for value in event.summary.value if value.HasField("histo")]
  assert (histogram.num, histogram.min, histogram.max, histogram.sum) == (7, 0, 9, staleness.sum())
  # One bin per integer: the counts of 0, 1, 2 and 9 land in separate buckets.
  assert sorted(count for count in histogram.bucket if count) == [1, 1, 2, 3]


def test_truncate_after_makes_a_resumed_run_equal_an_uninterrupted_one(tmp_path):
  def loss(step, run):
    return 1.0 / (step + 1) + (0.001 if run == "dead" else 0.0)

  uninterrupted_dir, resumed_dir = tmp_path / "uninterrupted", tmp_path / "resumed"
  with MetricWriter(uninterrupted_dir, enabled=True) as writer:
    for step in range(10):
      writer.write_scalars(step, {"train_loss": loss(step, "live")})
  with MetricWriter(resumed_dir, enabled=True) as writer:
    for step in range(8):
      writer.write_scalars(step, {"train_loss": loss(step, "live" if step <= 5 else "dead")})
  # The dead run's last write was cut short by the kill.
  with open(resumed_dir / run_directory.METRICS, "a", encoding="utf-8") as file:
    file.write('{"step": 8, "train_lo')
  with MetricWriter(resumed_dir, enabled=True) as writer:
    writer.truncate_after(5)
    assert [record["step"] for record in read_jsonl(resumed_dir / run_directory.METRICS)] == list(range(6))
    for step in range(6, 10):
      writer.write_scalars(step, {"train_loss": loss(step, "live")})
  assert read_jsonl(resumed_dir / run_directory.METRICS) == read_jsonl(uninterrupted_dir / run_directory.METRICS)
  _, resumed_file = _event_files(resumed_dir)
  purge_markers = [event.step for event in _read_events(resumed_file) if event.HasField("session_log")]
  assert purge_markers == [6]
  assert _scalars(_read_events(resumed_file))["train_loss"][0][0] == 6


def test_disabled_writer_writes_nothing(tmp_path):
  workdir = tmp_path / "process_1"
  with MetricWriter(workdir, enabled=False) as writer:
    writer.write_scalars(0, {"train_loss": 1.0})
    writer.write_histograms(0, {"staleness": np.arange(3)})
    writer.truncate_after(0)
    assert not writer.enabled
  assert not workdir.exists()


def test_default_is_enabled_on_process_zero(tmp_path):
  assert MetricWriter(tmp_path).enabled


def test_bad_records_raise_before_writing(tmp_path):
  with MetricWriter(tmp_path, enabled=True) as writer:
    with pytest.raises(ValueError, match="step=-1; allowed: an integer >= 0"):
      writer.write_scalars(-1, {"train_loss": 1.0})
    with pytest.raises(ValueError, match=r"step=1\.5; allowed: an integer >= 0"):
      writer.write_scalars(1.5, {"train_loss": 1.0})
    with pytest.raises(ValueError, match="scalar name 'step'"):
      writer.write_scalars(0, {"step": 3})
    with pytest.raises(ValueError, match="scalar train_loss = .* is not a single number"):
      writer.write_scalars(0, {"train_loss": np.ones(2)})
    with pytest.raises(ValueError, match="scalar protocol = 'async' is not a single number"):
      writer.write_scalars(0, {"protocol": "async"})
    with pytest.raises(ValueError, match="histogram 'staleness' has no values"):
      writer.write_histograms(0, {"staleness": np.array([], dtype=np.int64)})
    with pytest.raises(ValueError, match="histogram 'update_norm' holds non-finite values"):
      writer.write_histograms(0, {"update_norm": np.array([1.0, np.inf])})
  assert not (tmp_path / run_directory.METRICS).exists()
  with pytest.raises(ValueError, match=r"flush_every_seconds=0; allowed: a number > 0 \(inf allowed\)"):
    MetricWriter(tmp_path, enabled=True, flush_every_seconds=0)


def test_to_json_value_converts_nested_arrays_and_rejects_objects():
  converted = to_json_value(
    {"seeds": (np.int64(1), 2), "lr": jnp.float32(0.5), "grid": np.eye(2, dtype=np.int32), "note": None, "flag": True}
  )
  assert converted == {"seeds": [1, 2], "lr": 0.5, "grid": [[1, 0], [0, 1]], "note": None, "flag": True}
  assert json.loads(json.dumps(converted)) == converted
  with pytest.raises(ValueError, match=r"config\['learners'\] has key 3"):
    to_json_value({"learners": {3: "x"}}, name="config")
  with pytest.raises(ValueError, match="has dtype complex64"):
    to_json_value(np.ones(2, np.complex64))


def test_read_jsonl_rejects_a_malformed_complete_line(tmp_path):
  path = tmp_path / "broken.jsonl"
  path.write_text('{"step": 0}\nnot json\n{"step": 2}\n')
  with pytest.raises(ValueError, match="line 2, is not valid JSON"):
    read_jsonl(path)
  path.write_text('{"step": 0}\n[1, 2]\n')
  with pytest.raises(ValueError, match="line 2, holds a list"):
    read_jsonl(path)


def test_integer_bins_put_each_integer_in_its_own_bin():
  values = np.array([3, 3, 5, 7])
  counts, _ = np.histogram(values, integer_bins(values))
  np.testing.assert_array_equal(counts, [2, 0, 1, 0, 1])


def test_hparams_go_into_the_runs_own_event_file_in_the_given_order(tmp_path):
  with MetricWriter(tmp_path, enabled=True) as writer:
    writer.write_scalars(10, {"test_error": 12.5})
    writer.write_hparams(
      {"protocol": "async", "learners": 8, "learning_rate": 0.1, "nesterov": False, "hidden_sizes": (32,)},
      {"test_error": 12.5, "test_loss": None},
    )
  hparams, names, metrics = event_hparams(tmp_path)
  assert names == ["protocol", "learners", "learning_rate", "nesterov", "hidden_sizes"]
  assert hparams == {
    "protocol": "async",
    "learners": 8.0,
    "learning_rate": 0.1,
    "nesterov": False,
    "hidden_sizes": "(32,)",
  }
  assert metrics == ["test_error"]
  assert len(list(tmp_path.glob("events.out.tfevents.*"))) == 1  # no sub-directory run of its own


def test_a_disabled_writer_writes_no_hparams(tmp_path):
  with MetricWriter(tmp_path, enabled=False) as writer:
    writer.write_hparams({"a": 1}, {"test_error": 1.0})
  assert list(tmp_path.iterdir()) == []
