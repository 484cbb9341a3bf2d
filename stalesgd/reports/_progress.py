"""A progress report with rate and ETA for the training loop, on the standard library only.

On a terminal it redraws one line in place (``\\r``) at most every
``interval_seconds`` (default 0.2 s)::

  demo  1200/5000 [=======>..............]  24.0% | 41.3 updates/s, 5.29k images/s | 29.1s, ETA 1m32s | train_loss=0.412

In a log file or pipe (SLURM, Kubernetes, CI) a ``\\r`` bar is garbage, so it
prints a plain line every ``interval_seconds`` (default 30 s) instead, plus one
for the last step. Rates are measured from the first `update` call, so the
compilation before it does not distort the ETA. Only process 0 reports by
default.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable, Mapping
from typing import TextIO

from stalesgd import _validation as validation

_BAR_WIDTH = 24
_TERMINAL_REFRESH_SECONDS = 0.2
_LOG_REFRESH_SECONDS = 30.0


def format_duration(seconds: float) -> str:
  """``3725.0 -> '1h02m05s'``, ``65 -> '1m05s'``, ``4.25 -> '4.2s'``."""
  if seconds < 60:
    return f"{seconds:.1f}s"
  whole = int(round(seconds))
  hours, remainder = divmod(whole, 3600)
  minutes, secs = divmod(remainder, 60)
  return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def format_rate(per_second: float) -> str:
  """Three significant digits with a k/M suffix: ``5290.0 -> '5.29k'``."""
  for divisor, suffix in ((1e6, "M"), (1e3, "k")):
    if per_second >= divisor:
      return f"{per_second / divisor:.3g}{suffix}"
  return f"{per_second:.3g}"


def _default_enabled() -> bool:
  # JAX is imported only to answer "am I process 0?"; formatting needs nothing
  # beyond the standard library.
  import jax

  return jax.process_index() == 0


class ProgressReporter:
  """Reports step/total, updates/s, images/s, elapsed time, ETA and chosen metrics.

  Example::

    with ProgressReporter(num_updates, examples_per_step=learners * batch_per_learner) as progress:
      for step in range(restored_step + 1, num_updates + 1):
        ...
        progress.update(step, {"train_loss": loss})
  """

  def __init__(
    self,
    total_steps: int,
    *,
    examples_per_step: int | None = None,
    description: str = "",
    stream: TextIO | None = None,
    enabled: bool | None = None,
    interval_seconds: float | None = None,
    clock: Callable[[], float] = time.monotonic,
  ):
    """Creates the reporter; nothing is printed before the first `update`.

    Args:
      total_steps: the step at which training ends.
      examples_per_step: images per step (for stale SGD, gradients per update
        times the per-learner batch); None hides images/s.
      description: a short label printed first, e.g. the run's name.
      stream: where to write; default ``sys.stdout``. Its ``isatty()`` chooses
        between the in-place bar and plain lines.
      enabled: whether to print at all; None means ``jax.process_index() == 0``.
      interval_seconds: minimum seconds between reports; default 0.2 on a
        terminal and 30 otherwise.
      clock: seconds as a float; replaceable for tests.

    Raises:
      ValueError: if a count is out of range.
    """
    validation.check_integer("total_steps", total_steps, low=1, builtin_only=True)
    validation.check_integer("examples_per_step", examples_per_step, low=1, optional=True, builtin_only=True)
    validation.check_real("interval_seconds", interval_seconds, low=0, optional=True, allow_inf=True)
    self._total_steps = total_steps
    self._examples_per_step = examples_per_step
    self._description = description
    self._stream = sys.stdout if stream is None else stream
    self._enabled = _default_enabled() if enabled is None else bool(enabled)
    self._on_terminal = bool(getattr(self._stream, "isatty", lambda: False)())
    default_interval = _TERMINAL_REFRESH_SECONDS if self._on_terminal else _LOG_REFRESH_SECONDS
    self._interval_seconds = default_interval if interval_seconds is None else interval_seconds
    self._clock = clock
    self._start_step = 0
    self._start_time: float | None = None
    self._last_report_time: float | None = None
    self._step = 0
    self._reported_step: int | None = None
    self._metrics: dict[str, float] = {}
    self._drawn_width = 0

  def update(self, step: int, metrics: Mapping[str, float] | None = None) -> None:
    """Records that ``step`` is done, and reports if it is time.

    Args:
      step: the step just completed.
      metrics: values to show from now on (the latest value of each name is
        kept, so evaluation metrics stay visible between evaluations).
    """
    if not self._enabled:
      return
    now = self._clock()
    if self._start_time is None:
      # The first call anchors the rate: the steps before it include compilation
      # (and, when resuming, were done by an earlier process).
      self._start_time, self._start_step = now, step
    self._step = step
    for name, value in (metrics or {}).items():
      self._metrics[name] = float(value)
    due = self._last_report_time is None or now - self._last_report_time >= self._interval_seconds
    if due or step >= self._total_steps:
      self._report(now)

  def write(self, message: str) -> None:
    """Prints a message on its own line without breaking the bar."""
    if not self._enabled:
      return
    self._clear_bar()
    self._stream.write(message + "\n")
    if self._on_terminal and self._reported_step is not None:
      self._draw(self.status_line(self._clock()))
    self._stream.flush()

  def close(self) -> None:
    """Reports the latest step if it was not yet shown, and ends the bar's line."""
    if not self._enabled:
      return
    if self._start_time is not None and self._reported_step != self._step:
      self._report(self._clock())
    if self._on_terminal and self._drawn_width:
      self._stream.write("\n")
      self._drawn_width = 0
    self._stream.flush()

  def __enter__(self) -> ProgressReporter:
    return self

  def __exit__(self, *exc_info: object) -> None:
    self.close()

  def status_line(self, now: float) -> str:
    """The text of a report at time ``now`` (without bar when not on a terminal)."""
    fraction = min(max(self._step / self._total_steps, 0.0), 1.0)
    width = len(str(self._total_steps))
    parts = [f"{self._description} " if self._description else "", f"{self._step:>{width}}/{self._total_steps}"]
    if self._on_terminal:
      filled = int(fraction * _BAR_WIDTH)
      arrow = ">" if filled < _BAR_WIDTH else ""
      parts.append(f" [{'=' * filled}{arrow}{'.' * (_BAR_WIDTH - filled - len(arrow))}]")
    parts.append(f" {100 * fraction:5.1f}%")
    elapsed = now - self._start_time if self._start_time is not None else 0.0
    steps_done = self._step - self._start_step
    if elapsed > 0 and steps_done > 0:
      steps_per_second = steps_done / elapsed
      rates = f"{format_rate(steps_per_second)} updates/s"
      if self._examples_per_step is not None:
        rates += f", {format_rate(steps_per_second * self._examples_per_step)} images/s"
      remaining = max(self._total_steps - self._step, 0) / steps_per_second
      parts.append(f" | {rates} | {format_duration(elapsed)}, ETA {format_duration(remaining)}")
    if self._metrics:
      parts.append(" | " + " ".join(f"{name}={value:.4g}" for name, value in self._metrics.items()))
    return "".join(parts)

  def _report(self, now: float) -> None:
    line = self.status_line(now)
    if self._on_terminal:
      self._draw(line)
    else:
      self._stream.write(line + "\n")
    self._stream.flush()
    self._last_report_time = now
    self._reported_step = self._step

  def _draw(self, line: str) -> None:
    # A line wider than the terminal wraps, and \r then only returns to the
    # start of the last wrapped row: cut it to the width.
    columns = shutil.get_terminal_size(fallback=(120, 24)).columns
    line = line[: max(columns - 1, 20)]
    padding = " " * max(self._drawn_width - len(line), 0)
    self._stream.write("\r" + line + padding)
    self._drawn_width = len(line)

  def _clear_bar(self) -> None:
    if self._on_terminal and self._drawn_width:
      self._stream.write("\r" + " " * self._drawn_width + "\r")
      self._drawn_width = 0
