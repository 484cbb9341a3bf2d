"""The disk fills, or the workdir turns read-only, during a run: a clear error, the previous checkpoint intact.

* Disk full: a command-line run, once its first checkpoint is complete, gets
  a file-size limit (``RLIMIT_FSIZE`` set from outside with `resource.prlimit`;
  Python ignores SIGXFSZ, so writes past it fail with EFBIG, "File too large",
  as on a full disk) below the size of a checkpoint's data file but above
  that of the metrics files. Its next checkpoint fails: the run must exit with
  `CheckpointError` naming the checkpoint directory and the intact step, that
  step must still be there, whole, and a restart must resume from it and end
  with the uninterrupted run's weights and records.
* Read-only: the same in this process with the checkpoint directory made
  read-only (chmod 555) after the first checkpoint. Skipped where chmod does
  not stop writes (as root).
"""

from __future__ import annotations

import pathlib
import resource
import stat
import subprocess

import pytest

from stalesgd.training import checkpoint as checkpoint_lib
from stalesgd.training.checkpoint import CheckpointError
from tests.helpers.fault_helpers import (
  assert_same_run,
  fault_config,
  npz_flags,
  train_in_process,
)
from tests.helpers.train_helpers import (
  PHASE_TIMEOUT,
  REPOSITORY_ROOT,
  complete_checkpoints,
  log_tail,
  main_command,
  main_environment,
  wait_for_checkpoint_after,
)

SECONDS_PER_BLOCK = 0.08
# A checkpoint of the tiny MLP's state writes a data file of 60-110 KB; metrics.jsonl and the
# TensorBoard file of the whole run stay under 10 KB.
FILE_SIZE_LIMIT = 32 * 1024


def _resume_and_compare(workdir: pathlib.Path, intact: int, digits_npz, reference_run, capsys) -> None:
  """Restarts in this process: it must resume from ``intact`` and end like the uninterrupted run."""
  capsys.readouterr()
  train_in_process(fault_config("async_dc", digits_npz), workdir)
  assert f"resumed from the checkpoint at update {intact} in {workdir}" in capsys.readouterr().out
  reference, reference_dir = reference_run("async_dc")
  assert_same_run(workdir, reference, reference_dir)
  leftovers = [path.name for path in (workdir / "checkpoints").iterdir() if not path.name.isdigit()]
  assert leftovers == []  # the failed save's temporary directory was cleaned up


@pytest.mark.slow
@pytest.mark.skipif(not hasattr(resource, "prlimit"), reason="resource.prlimit is Linux-only")
def test_disk_full_during_a_save_stops_the_run_naming_the_directory_and_keeps_the_previous_checkpoint(
  tmp_path, compilation_cache, digits_npz, reference_run, capsys
):
  workdir, log = tmp_path / "run", tmp_path / "run.log"
  command = main_command(
    workdir,
    "async_dc",
    "--config.checkpoint_every_seconds=1",
    *npz_flags(digits_npz),
    seconds_per_block=SECONDS_PER_BLOCK,
  )
  # Output through a pipe: the limit would stop writes to a log file too.
  process = subprocess.Popen(
    command,
    cwd=REPOSITORY_ROOT,
    env=main_environment(compilation_cache),
    stdout=subprocess.PIPE,
    stderr=subprocess.STDOUT,
    text=True,
    start_new_session=True,
  )
  try:
    intact = wait_for_checkpoint_after(workdir, -1, process, log)
    resource.prlimit(process.pid, resource.RLIMIT_FSIZE, (FILE_SIZE_LIMIT, FILE_SIZE_LIMIT))
    reference_run("async_dc")  # meanwhile
    output, _ = process.communicate(timeout=PHASE_TIMEOUT)
  except BaseException:
    process.kill()
    raise
  log.write_text(output)
  assert process.returncode == 1, log_tail(log)
  text = log.read_text()
  assert f"CheckpointError: writing a checkpoint in {workdir / 'checkpoints'} failed" in text, log_tail(log)
  assert "File too large" in text, log_tail(log)
  assert f"the newest complete checkpoint, {intact}, is intact" in text, log_tail(log)
  assert complete_checkpoints(workdir) == [intact]
  assert not (workdir / "summary.json").exists()
  _resume_and_compare(workdir, intact, digits_npz, reference_run, capsys)


def _chmod_stops_writes(directory: pathlib.Path) -> bool:
  probe = directory / "probe"
  probe.mkdir()
  probe.chmod(stat.S_IRUSR | stat.S_IXUSR)
  try:
    (probe / "file").write_text("x")
    return False
  except PermissionError:
    return True
  finally:
    probe.chmod(stat.S_IRWXU)


def test_a_read_only_checkpoint_directory_stops_the_run_and_keeps_the_previous_checkpoint(
  tmp_path, digits_npz, reference_run, monkeypatch, capsys
):
  if not _chmod_stops_writes(tmp_path):
    pytest.skip(
      "chmod does not stop this process's writes (root with CAP_DAC_OVERRIDE); the disk-full test covers a failing save"
    )
  workdir = tmp_path / "run"
  checkpoints = workdir / "checkpoints"
  unpatched_save = checkpoint_lib.Checkpointer.save

  def save_then_turn_read_only(self, step, state, metadata, *, force=False):
    started = unpatched_save(self, step, state, metadata, force=force)
    if started and not complete_checkpoints(workdir):
      self.wait()
      checkpoints.chmod(stat.S_IRUSR | stat.S_IXUSR)
    return started

  monkeypatch.setattr(checkpoint_lib.Checkpointer, "save", save_then_turn_read_only)
  try:
    with pytest.raises(
      CheckpointError,
      match=rf"writing a checkpoint in {checkpoints} failed.*"
      r"the newest complete checkpoint, \d+, is intact",
    ):
      train_in_process(fault_config("async_dc", digits_npz, checkpoint_every_seconds=1), workdir)
  finally:
    checkpoints.chmod(stat.S_IRWXU)
  monkeypatch.undo()
  intact = complete_checkpoints(workdir)
  assert len(intact) == 1
  _resume_and_compare(workdir, intact[0], digits_npz, reference_run, capsys)
