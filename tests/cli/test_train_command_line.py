"""``stalesgd-train``: config-file arguments, ``--config.<field>`` overrides, and bad overrides.

Overrides of top-level and nested fields reach the run (its summary, the saved
schedule and the checkpointed weights' shapes say so); a misspelt field, a value
of the wrong type, or a value the config checks reject ends the process with a
non-zero status and a message naming the field, in seconds (nothing compiled).
"""

from __future__ import annotations

import re
import subprocess

import orbax.checkpoint as ocp
import pytest

from stalesgd import schedule as schedule_lib
from tests.helpers.train_helpers import (
  REPOSITORY_ROOT,
  complete_checkpoints,
  main_command,
  main_environment,
  read_summary,
  run_main,
)

RUN_TIMEOUT = 180.0
FAILURE_TIMEOUT = 60.0


@pytest.mark.slow
def test_overrides_reach_the_run(tmp_path, compilation_cache):
  workdir = tmp_path / "run"
  completed = run_main(
    main_command(
      workdir,
      "hardsync",
      "--config.protocol=softsync",
      "--config.learners=4",
      "--config.n=2",
      "--config.batch_per_learner=4",
      "--config.num_epochs=0.05",
      "--config.model_options.hidden_sizes=(16,)",
    ),
    compilation_cache,
    timeout=RUN_TIMEOUT,
  )
  assert completed.returncode == 0, completed.stderr[-3000:]
  summary = read_summary(workdir)
  assert (summary["protocol"], summary["learners"], summary["batch_per_learner"]) == ("softsync", 4, 4)
  assert summary["label"].startswith("2-softsync (lambda=4, mu=4")
  # 0.05 epochs of 1,497 images at c * mu = 2 * 4 images per update.
  assert summary["updates"] == 10 and not summary["preempted"]
  assert summary["provenance"]["device_count"] == 8  # JAX_NUM_CPU_DEVICES (set by the helpers) wins
  schedule = schedule_lib.Schedule.load(workdir / "schedule.npz")
  assert (schedule.protocol, schedule.learners, schedule.contributions_per_update) == ("softsync", 4, 2)
  final = complete_checkpoints(workdir)[-1]
  state = ocp.StandardCheckpointer().restore(workdir / "checkpoints" / str(final) / "state")
  assert state["params"]["hidden1"]["kernel"].shape == (64, 16)  # 8x8 digits into the overridden width


@pytest.mark.slow
@pytest.mark.parametrize(
  "override, message",
  [
    (
      "--config.learnrs=4",
      r"^FATAL Flags parsing error: --config\.learnrs: no such config field; did you mean "
      r"--config\.learners\?$",
    ),
    ("--config.learners=four", r"--config\.learners=four: invalid literal for int"),
    ("--config.protocol=gossip", r"^FATAL config\.protocol='gossip'; allowed: one of \(.*'hardsync'"),
    ("--config.n=9", r"^FATAL config\.n=9; allowed: an integer >= 1 and <= 8$"),
  ],
  ids=["misspelt_field", "wrong_type", "unknown_protocol", "n_above_learners"],
)
def test_bad_override_fails_naming_the_field(override, message, tmp_path, compilation_cache):
  workdir = tmp_path / "run"
  variant_overrides = ["--config.protocol=softsync"] if override == "--config.n=9" else []
  completed = run_main(
    main_command(workdir, "hardsync", *variant_overrides, override), compilation_cache, timeout=FAILURE_TIMEOUT
  )
  assert completed.returncode != 0
  assert re.search(message, completed.stderr, re.MULTILINE), completed.stderr[-3000:]
  assert not (workdir / "checkpoints").exists()
  # Refused while parsing flags, or by the config's checks before JAX starts: one line and the hint to --helpshort,
  # absl's usage status, no traceback and no help text.
  assert completed.returncode == 1
  assert "Traceback" not in completed.stderr and len(completed.stderr.strip().splitlines()) == 2, completed.stderr


def test_an_unknown_config_argument_is_one_line_not_a_traceback(tmp_path, compilation_cache):
  completed = run_main(main_command(tmp_path / "run", "nonsense"), compilation_cache, timeout=FAILURE_TIMEOUT)
  assert completed.returncode == 1
  lines = completed.stderr.strip().splitlines()
  assert "Traceback" not in completed.stderr and len(lines) == 2, completed.stderr
  assert re.match(
    r"FATAL Flags parsing error: flag --config=.*tiny_run_config\.py:nonsense: ValueError: "
    r"tiny_run_config variant 'nonsense'; allowed: one of",
    lines[0],
  ), lines[0]


@pytest.mark.slow
def test_without_a_device_count_the_run_gets_the_fastest_layout(tmp_path, compilation_cache):
  # lambda = 8 learners: 2 host devices of about 4 learners each (stalesgd.training._device_layout).
  env = {name: value for name, value in main_environment(compilation_cache).items() if name != "JAX_NUM_CPU_DEVICES"}
  workdir = tmp_path / "run"
  completed = subprocess.run(
    main_command(workdir, "async_dc", "--config.num_epochs=0.05"),
    cwd=REPOSITORY_ROOT,
    env=env,
    capture_output=True,
    text=True,
    timeout=RUN_TIMEOUT,
  )
  assert completed.returncode == 0, completed.stderr[-3000:]
  assert read_summary(workdir)["provenance"]["device_count"] == 2
