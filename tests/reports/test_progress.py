"""Tests for stalesgd.reports._progress: plain lines in logs, an in-place bar on terminals, rates and ETA."""

from __future__ import annotations

import io

import pytest

from stalesgd.reports._progress import ProgressReporter, format_duration, format_rate


class FakeClock:
  def __init__(self):
    self.now = 0.0

  def __call__(self) -> float:
    return self.now


class FakeTerminal(io.StringIO):
  def isatty(self) -> bool:
    return True


@pytest.fixture(autouse=True)
def _wide_terminal(monkeypatch):
  monkeypatch.setenv("COLUMNS", "200")


def test_plain_lines_every_interval_with_rate_and_eta():
  stream, clock = io.StringIO(), FakeClock()
  with ProgressReporter(
    100, examples_per_step=128, description="async", stream=stream, enabled=True, interval_seconds=10, clock=clock
  ) as progress:
    for step in range(1, 101):
      clock.now = step - 1.0  # One update per second after the first.
      progress.update(step, {"train_loss": 1.0 / step} if step % 25 == 0 else None)
  assert stream.getvalue().splitlines() == [
    "async   1/100   1.0%",
    "async  11/100  11.0% | 1 updates/s, 128 images/s | 10.0s, ETA 1m29s",
    "async  21/100  21.0% | 1 updates/s, 128 images/s | 20.0s, ETA 1m19s",
    "async  31/100  31.0% | 1 updates/s, 128 images/s | 30.0s, ETA 1m09s | train_loss=0.04",
    "async  41/100  41.0% | 1 updates/s, 128 images/s | 40.0s, ETA 59.0s | train_loss=0.04",
    "async  51/100  51.0% | 1 updates/s, 128 images/s | 50.0s, ETA 49.0s | train_loss=0.02",
    "async  61/100  61.0% | 1 updates/s, 128 images/s | 1m00s, ETA 39.0s | train_loss=0.02",
    "async  71/100  71.0% | 1 updates/s, 128 images/s | 1m10s, ETA 29.0s | train_loss=0.02",
    "async  81/100  81.0% | 1 updates/s, 128 images/s | 1m20s, ETA 19.0s | train_loss=0.01333",
    "async  91/100  91.0% | 1 updates/s, 128 images/s | 1m30s, ETA 9.0s | train_loss=0.01333",
    "async 100/100 100.0% | 1 updates/s, 128 images/s | 1m39s, ETA 0.0s | train_loss=0.01",
  ]
  assert "\r" not in stream.getvalue()


def test_close_reports_the_last_step_when_it_was_not_shown():
  stream, clock = io.StringIO(), FakeClock()
  progress = ProgressReporter(1000, stream=stream, enabled=True, interval_seconds=60, clock=clock)
  progress.update(500)
  clock.now = 2.0
  progress.update(700)
  progress.close()
  assert stream.getvalue().splitlines() == [" 500/1000  50.0%", " 700/1000  70.0% | 100 updates/s | 2.0s, ETA 3.0s"]


def test_terminal_bar_redraws_in_place_and_messages_keep_it():
  stream, clock = FakeTerminal(), FakeClock()
  progress = ProgressReporter(8, stream=stream, enabled=True, interval_seconds=0, clock=clock)
  progress.update(2)
  clock.now = 2.0
  progress.update(4, {"test_error": 12.5})
  assert "\n" not in stream.getvalue()
  assert stream.getvalue().endswith(
    "\r4/8 [============>...........]  50.0% | 1 updates/s | 2.0s, ETA 4.0s | test_error=12.5"
  )
  progress.write("evaluated")
  clock.now = 6.0
  progress.update(8)
  progress.close()
  output = stream.getvalue()
  assert "\revaluated\n" in output
  assert output.endswith("\r8/8 [========================] 100.0% | 1 updates/s | 6.0s, ETA 0.0s | test_error=12.5\n")
  # Every redraw at least covers the previous line, so no stale characters remain.
  drawn = [segment for segment in output.replace("\n", "\r").split("\r") if segment]
  assert all(len(later) >= len(earlier.rstrip()) for earlier, later in zip(drawn, drawn[1:]) if later.strip())


def test_terminal_line_is_cut_to_the_terminal_width(monkeypatch):
  monkeypatch.setenv("COLUMNS", "40")
  stream = FakeTerminal()
  progress = ProgressReporter(10, stream=stream, enabled=True, interval_seconds=0, clock=FakeClock())
  progress.update(1, {"a_long_metric_name": 1.0, "another_long_one": 2.0})
  assert max(len(segment) for segment in stream.getvalue().split("\r")) <= 39


def test_disabled_reporter_prints_nothing():
  stream = FakeTerminal()
  with ProgressReporter(10, stream=stream, enabled=False) as progress:
    progress.update(5, {"train_loss": 1.0})
    progress.write("hello")
  assert stream.getvalue() == ""


def test_default_is_enabled_on_process_zero_and_plain_on_a_stringio():
  stream = io.StringIO()
  with ProgressReporter(3, stream=stream) as progress:
    progress.update(3)
  assert stream.getvalue() == "3/3 100.0%\n"


@pytest.mark.parametrize(
  "arguments, message",
  [
    ({"total_steps": 0}, "total_steps=0; allowed: an integer >= 1"),
    ({"total_steps": 10, "examples_per_step": 0}, "examples_per_step=0; allowed: None or an integer >= 1"),
    ({"total_steps": 10, "interval_seconds": -1}, r"interval_seconds=-1; allowed: None or a number >= 0"),
  ],
)
def test_bad_arguments_raise(arguments, message):
  with pytest.raises(ValueError, match=message):
    ProgressReporter(**arguments)


def test_formatting_helpers():
  assert [format_duration(seconds) for seconds in (4.25, 59.96, 65, 3725)] == ["4.2s", "60.0s", "1m05s", "1h02m05s"]
  assert [format_rate(rate) for rate in (0.5, 41.25, 5290.0, 2.5e6)] == ["0.5", "41.2", "5.29k", "2.5M"]
