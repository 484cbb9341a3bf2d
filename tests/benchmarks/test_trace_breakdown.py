"""The trace breakdown's arithmetic on hand-made profiler events (the script itself needs minutes)."""

from __future__ import annotations

import pytest

from experiments.benchmarks.trace_analysis import category, device_seconds, per_gradient

MODULE = "jit__block_step_impl"


def _op(name, ts, dur, device="0", tid=1, module=MODULE):
  return {
    "ph": "X",
    "name": name,
    "ts": ts,
    "dur": dur,
    "tid": tid,
    "args": {"hlo_module": module, "hlo_op": name, "device_ordinal": device},
  }


def test_categories():
  assert [
    category(name)
    for name in (
      "ynn_fusion.3",
      "wrapped_reduce-window.1",
      "dot.2",
      "all-to-all.17",
      "all-gather",
      "add_power_fusion",
      "while.4",
      "wrapped_scatter",
    )
  ] == [
    "convolution",
    "convolution",
    "convolution",
    "collective",
    "collective",
    "elementwise",
    "elementwise",
    "elementwise",
  ]


def test_nested_thunks_count_once_and_the_uncovered_wall_clock_is_idle():
  events = [
    _op("ynn_fusion.1", 0, 100),
    _op("while.2", 100, 100),
    _op("add_fusion.3", 120, 30),  # the loop's own time is 100 - 30
    _op("all-to-all.4", 250, 50),  # 200..250 is idle
    _op("ynn_fusion.1", 10, 50, device="1", tid=2),
    _op("ynn_fusion.9", 400, 1000, module="jit_other"),  # another program: not counted
    {"ph": "M", "name": "thread_name", "tid": 1, "args": {"name": "python"}},
  ]
  seconds = device_seconds(events, MODULE)
  assert seconds == {
    "convolution": 150.0,
    "elementwise": 100.0,
    "collective": 50.0,
    "idle": 50.0,
    "wall_us": 300.0,
    "devices": 2,
    "thunks": 5,
  }


def test_processes_side_by_side_add_up_per_gradient():
  one = {
    "convolution": 300.0,
    "elementwise": 100.0,
    "collective": 0.0,
    "idle": 20.0,
    "devices": 1,
    "thunks": 40,
    "gradients": 10,
    "seconds": 0.5,
  }
  two = {**one, "convolution": 500.0, "gradients": 30, "seconds": 1.0}
  row = per_gradient([one, two])
  assert row["convolution"] == pytest.approx(800 / 40) and row["idle"] == pytest.approx(1.0)
  assert row["devices"] == 2 and row["thunks_per_gradient"] == pytest.approx(2.0)
  assert row["traced_grads_per_s"] == pytest.approx(10 / 0.5 + 30 / 1.0)


def test_a_trace_without_the_program_says_so():
  with pytest.raises(ValueError, match="no thunk of module 'jit_call'"):
    device_seconds([_op("ynn_fusion.1", 0, 1)], "jit_call")
