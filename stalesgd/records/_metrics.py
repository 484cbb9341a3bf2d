"""Training metrics on disk: a JSON-lines file and TensorBoard event files.

Every record the training loop emits goes to two places in the run's workdir:

* ``metrics.jsonl``: one JSON object per line, ``{"step": u, "train_loss": ...}``,
  the format the plotting code (`stalesgd.reports._plots`) and any notebook read back
  with `read_jsonl`. Locally, lines are written whole and flushed at once, so a
  run killed with SIGKILL loses at most the line being written. On a URL workdir
  (``gs://``, `stalesgd.records._paths`), where objects cannot be appended to, the
  lines are kept in memory and the whole file is uploaded at every `flush`
  (the loop flushes before each checkpoint) and at `close`.
* TensorBoard event files (written with tensorboardX, no TensorFlow needed):
  the same scalars, plus histograms such as the staleness distribution.

Resuming: after restoring the checkpoint of update u, call
``writer.truncate_after(u)``. It drops the JSON lines of later updates (they
were written after the checkpoint by the run that died) and makes the next event
file purge events from step u + 1 on in TensorBoard, so the resumed run's
metrics equal those of a run that was never interrupted.

Only one process writes: by default the writer is enabled on
``jax.process_index() == 0`` and is a silent no-op elsewhere, so every process
can call it unconditionally.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import time
from collections.abc import Mapping
from typing import Any

import numpy as np
from etils import epath

from stalesgd import _validation as validation
from stalesgd.records import _run_directory as run_directory
from stalesgd.records._paths import is_url, write_whole


def to_json_value(value: Any, *, name: str = "value") -> Any:
  """Converts numpy / JAX scalars and arrays, nested in dicts and lists, to JSON.

  Numpy and JAX scalars (and 0-d arrays) become Python ``int``, ``float`` or
  ``bool``; arrays become (nested) lists; mappings need string keys; tuples
  become lists. Non-finite floats are kept (written as ``NaN`` / ``Infinity``,
  which Python's `json` reads back) because a diverged loss is information.

  Args:
    value: the object to convert.
    name: how to refer to ``value`` in error messages (e.g. its key path).

  Returns:
    An object made only of dict, list, str, int, float, bool and None.

  Raises:
    ValueError: if some leaf is not a number, string, bool, None, array,
      sequence or mapping with string keys.
  """
  if value is None or isinstance(value, (str, bool)):
    return value
  if isinstance(value, np.generic) or _is_array(value):
    array = np.asarray(value)
    if array.dtype.kind not in "biuf":
      raise ValueError(f"{name} has dtype {array.dtype}; allowed: bool, integer or float arrays")
    return array.tolist()
  if isinstance(value, numbers.Integral):
    return int(value)
  if isinstance(value, numbers.Real):
    return float(value)
  if isinstance(value, Mapping):
    converted = {}
    for key, item in value.items():
      if not isinstance(key, str):
        raise ValueError(f"{name} has key {key!r} of type {type(key).__name__}; allowed: str keys")
      converted[key] = to_json_value(item, name=f"{name}[{key!r}]")
    return converted
  if isinstance(value, (list, tuple)):
    return [to_json_value(item, name=f"{name}[{index}]") for index, item in enumerate(value)]
  raise ValueError(
    f"{name} = {value!r} has type {type(value).__name__}; allowed: numbers, str, bool, None,"
    " numpy/JAX arrays, lists, tuples and mappings with str keys (convert e.g. a ConfigDict"
    " with .to_dict() first)"
  )


def _is_array(value: Any) -> bool:
  # jax.Array and numpy arrays both expose __array__, shape and dtype; checking
  # the protocol avoids importing JAX here.
  return hasattr(value, "__array__") and hasattr(value, "shape") and hasattr(value, "dtype")


def _to_scalar(value: Any, *, name: str) -> int | float:
  """A Python number from a Python/numpy/JAX scalar or a one-element array."""
  converted = to_json_value(value, name=name)
  while isinstance(converted, list) and len(converted) == 1:
    converted = converted[0]
  if isinstance(converted, bool):
    return int(converted)
  if not isinstance(converted, (int, float)):
    raise ValueError(
      f"scalar {name} = {value!r} is not a single number; allowed: int, float, bool,"
      " or a numpy/JAX array with one element"
    )
  return converted


def _drain_event_queues(summary_writer: Any) -> None:
  """Waits until tensorboardX's background thread has written every event queued so far.

  tensorboardX queues events for a thread, and its ``flush()`` only flushes
  what that thread has already written: events still queued when a SIGKILL
  follows a checkpoint were lost (tests/faults/test_kill_resume.py). The stop
  signal queues behind them, so stopping the thread writes them all; a new
  thread then serves the same queue and file.
  """
  for file_writer in (getattr(summary_writer, "all_writers", None) or {}).values():
    events = getattr(file_writer, "event_writer", None)
    worker = getattr(events, "_worker", None)
    if worker is None or not hasattr(worker, "stop") or getattr(events, "_closed", True):
      continue  # another tensorboardX layout: only its own flush
    worker.stop()
    events._worker = type(worker)(events._event_queue, events._ev_writer, events._flush_secs)
    events._worker.start()


def read_jsonl(path: str | os.PathLike[str]) -> list[dict[str, Any]]:
  """Reads the records of a JSON-lines metrics file.

  A last line without its newline is the remains of a write interrupted by a
  kill; it is ignored. Any other malformed line raises.

  Args:
    path: the ``metrics.jsonl`` file (or any JSON-lines file of objects).

  Returns:
    The records, in file order.

  Raises:
    ValueError: if a complete line is not a JSON object.
  """
  text = epath.Path(path).read_text(encoding="utf-8")
  lines = text.split("\n")
  complete_lines = lines[:-1]  # The last element is "" or an interrupted line.
  records = []
  for number, line in enumerate(complete_lines, start=1):
    if not line.strip():
      continue
    try:
      record = json.loads(line)
    except json.JSONDecodeError as error:
      raise ValueError(f"{path}, line {number}, is not valid JSON: {error}") from error
    if not isinstance(record, dict):
      raise ValueError(f"{path}, line {number}, holds a {type(record).__name__}; allowed: a JSON object")
    records.append(record)
  return records


def integer_bins(values: np.ndarray) -> np.ndarray:
  """Histogram bin edges centred on each integer from min(values) to max(values).

  For integer data such as staleness, ``np.histogram(values, integer_bins(values))``
  counts each value in its own bin: edges k - 0.5, k + 0.5 for every k.
  """
  low, high = int(np.min(values)), int(np.max(values))
  return np.arange(low, high + 2, dtype=np.float64) - 0.5


class MetricWriter:
  """Writes scalar records to ``metrics.jsonl`` and TensorBoard event files.

  Example::

    with MetricWriter(workdir) as writer:
      writer.truncate_after(restored_step)   # only when resuming
      for step in ...:
        writer.write_scalars(step, {"train_loss": loss, "lr_scale": scale})
        writer.write_histograms(step, {"staleness": staleness})
  """

  def __init__(
    self,
    workdir: str | os.PathLike[str],
    *,
    enabled: bool | None = None,
    flush_every_seconds: float = 10.0,
    max_histogram_bins: int = 512,
  ):
    """Creates the writer; files are created at the first write.

    Args:
      workdir: the run's directory, a local path or a URL such as ``gs://bucket/run``;
        created if missing.
      enabled: whether this process writes. None means
        ``jax.process_index() == 0``.
      flush_every_seconds: how often TensorBoard events are flushed to disk
        (JSON lines are flushed at every record).
      max_histogram_bins: histograms with more bins are coarsened to at most
        this many (TensorBoard draws a few dozen anyway).

    Raises:
      ValueError: if ``flush_every_seconds`` or ``max_histogram_bins`` is not
        positive.
    """
    validation.check_real("flush_every_seconds", flush_every_seconds, low=0, low_open=True, allow_inf=True)
    validation.check_integer("max_histogram_bins", max_histogram_bins, low=1, builtin_only=True)
    if enabled is None:
      import jax  # only needed for the default

      enabled = jax.process_index() == 0
    self._enabled = bool(enabled)
    self._workdir = epath.Path(workdir)
    self._flush_every_seconds = flush_every_seconds
    self._max_histogram_bins = max_histogram_bins
    self._jsonl_file = None
    self._event_writer = None
    self._purge_step: int | None = None

  @property
  def enabled(self) -> bool:
    return self._enabled

  @property
  def jsonl_path(self) -> epath.Path:
    return self._workdir / run_directory.METRICS

  def write_scalars(self, step: int, scalars: Mapping[str, Any]) -> None:
    """Appends one record ``{"step": step, **scalars}``.

    Args:
      step: the server update the values belong to (the x axis in TensorBoard).
      scalars: name -> number (Python, numpy or JAX scalar, or one-element
        array). Names must not be ``"step"``.

    Raises:
      ValueError: if ``step`` is not a non-negative int, a name is ``"step"``
        or not a str, or a value is not a single number.
    """
    step = validation.check_integer("step", step, low=0)
    record: dict[str, Any] = {"step": step}
    for name, value in scalars.items():
      if not isinstance(name, str) or name == "step":
        raise ValueError(f"scalar name {name!r}; allowed: str names other than 'step'")
      record[name] = _to_scalar(value, name=name)
    if not self._enabled:
      return
    self._open_jsonl().write(json.dumps(record) + "\n")
    event_writer = self._open_event_writer()
    for name, value in record.items():
      if name != "step":
        event_writer.add_scalar(name, value, global_step=step)

  def write_histograms(
    self, step: int, arrays: Mapping[str, Any], *, bins: str | int | np.ndarray | None = None
  ) -> None:
    """Writes a TensorBoard histogram of each array's values (not to JSON lines).

    Args:
      step: the server update the values belong to.
      arrays: name -> array of finite numbers, any shape, at least one element.
      bins: anything `np.histogram` accepts. None gives one bin per integer for
        integer arrays (`integer_bins`, right for staleness) and ``"auto"``
        for floats.

    Raises:
      ValueError: if an array is empty or holds a non-finite value.
    """
    step = validation.check_integer("step", step, low=0)
    checked = {}
    for name, values in arrays.items():
      values = np.asarray(values).reshape(-1)
      if values.size == 0:
        raise ValueError(f"histogram {name!r} has no values; allowed: at least one value")
      if values.dtype.kind == "f" and not np.all(np.isfinite(values)):
        raise ValueError(f"histogram {name!r} holds non-finite values; allowed: finite numbers")
      checked[name] = values
    if not self._enabled:
      return
    event_writer = self._open_event_writer()
    for name, values in checked.items():
      if bins is not None:
        histogram_bins = bins
      elif values.dtype.kind in "biu":
        histogram_bins = integer_bins(values)
      else:
        histogram_bins = "auto"
      event_writer.add_histogram(
        name, values.astype(np.float64), global_step=step, bins=histogram_bins, max_bins=self._max_histogram_bins
      )

  def write_hparams(self, hparams: Mapping[str, Any], metrics: Mapping[str, Any]) -> None:
    """Writes the run's hyperparameters and final metrics for TensorBoard's HParams dashboard.

    The summaries go into the run's own event file, so the run directory is one session of the HParams
    table (a study's runs line up in one table when TensorBoard is pointed at the study's directory), and the
    dashboard reads each metric's value from the run's scalars of that tag.

    Args:
      hparams: name -> a bool, int, float or str (anything else is written as its ``str``); the table
        shows them in this order.
      metrics: metric tag -> its final value (None values are left out).
    """
    from tensorboardX.summary import hparams as hparams_summaries  # tensorboardX's own HParams protobufs

    if not self._enabled:
      return
    values = {
      name: value if isinstance(value, (bool, int, float, str)) else str(value) for name, value in hparams.items()
    }
    finals = {name: _to_scalar(value, name=name) for name, value in metrics.items() if value is not None}
    experiment, session_start, session_end = hparams_summaries(values, finals)
    event_writer = self._open_event_writer()
    for summary in (experiment, session_start, session_end):
      event_writer.file_writer.add_summary(summary)

  def truncate_after(self, step: int) -> None:
    """Forgets everything written for steps after ``step``, to resume from it.

    JSON lines of later steps (and an interrupted last line) are removed by
    rewriting the file atomically. TensorBoard files cannot be edited, so the
    next event file starts with a purge marker at ``step + 1`` that makes
    TensorBoard hide older events of later steps.

    Args:
      step: the step of the checkpoint the run resumes from.
    """
    step = validation.check_integer("step", step, low=0)
    if not self._enabled:
      return
    self._close_files()
    self._purge_step = step + 1
    if not self.jsonl_path.exists():
      return
    kept = [record for record in read_jsonl(self.jsonl_path) if record["step"] <= step]
    write_whole(self.jsonl_path, "".join(json.dumps(record) + "\n" for record in kept))

  def flush(self) -> None:
    """Pushes everything written so far to the operating system."""
    if self._jsonl_file is not None:
      self._jsonl_file.flush()
    if self._event_writer is not None:
      _drain_event_queues(self._event_writer)
      self._event_writer.flush()

  def close(self) -> None:
    """Flushes and closes the files; a later write reopens them."""
    self._close_files()

  def __enter__(self) -> MetricWriter:
    return self

  def __exit__(self, *exc_info: object) -> None:
    self.close()

  def _open_jsonl(self):
    if self._jsonl_file is None:
      self._workdir.mkdir(parents=True, exist_ok=True)
      if is_url(self._workdir):
        self._jsonl_file = _UploadedLines(self.jsonl_path)
      else:
        # Line buffering: every record reaches the OS when written, so records up
        # to a checkpoint survive a SIGKILL that follows it.
        self._jsonl_file = open(  # closed in close()
          os.fspath(self.jsonl_path), "a", encoding="utf-8", buffering=1
        )
    return self._jsonl_file

  def _open_event_writer(self):
    if self._event_writer is None:
      # Imported here: tensorboardX pulls in protobuf, which processes that
      # never write do not need.
      from tensorboardX import SummaryWriter

      self._workdir.mkdir(parents=True, exist_ok=True)
      self._event_writer = SummaryWriter(
        logdir=str(self._workdir),
        purge_step=self._purge_step,
        flush_secs=max(1, math.ceil(self._flush_every_seconds)),
        # A unique suffix per writer: a resumed run in the same second must
        # not append to the dead run's file.
        filename_suffix=f".{os.getpid()}.{time.monotonic_ns()}",
      )
      self._purge_step = None
    return self._event_writer

  def _close_files(self) -> None:
    if self._jsonl_file is not None:
      self._jsonl_file.close()
      self._jsonl_file = None
    if self._event_writer is not None:
      self._event_writer.close()
      self._event_writer = None


class _UploadedLines:
  """An append-only text file on an object store: lines kept in memory, the whole object uploaded at `flush`.

  Object stores cannot append, so each `flush` uploads every line so far
  (`write_whole`); a reader sees the file as of some flush, never a part of a line.
  """

  def __init__(self, path: epath.Path):
    self._path = path
    self._lines = [path.read_text(encoding="utf-8")] if path.exists() else []
    self._unsaved = False

  def write(self, text: str) -> None:
    self._lines.append(text)
    self._unsaved = True

  def flush(self) -> None:
    if self._unsaved:
      write_whole(self._path, "".join(self._lines))
      self._unsaved = False

  def close(self) -> None:
    self.flush()
