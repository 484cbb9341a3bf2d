"""Evaluations land after exactly the requested update, whatever the protocol's blocks (issue: "Evaluations land on
block ends").

The tiny async DC-ASGD-a run (`tests.helpers.tiny_run_config`, c = 1, mu = 8: 1,497 / 8 = 187.125 updates per
epoch) for half an epoch (ceil(93.5625) = 94 updates), evaluated every eighth of an epoch (23.390625 updates):
evaluation k after update ceil(k x 23.390625), i.e. 24, 47, 71 and 94 (the last update, evaluated anyway). The
engine's greedy blocks of that schedule cross 47, so the loop used to evaluate after update 48, the first block end
past it. Under dynamic local updates (``async_local``) an evaluation lands after the first update whose
applied examples (mu H_m per contribution) reach k x eval_every_epochs epochs.

A checkpoint written by the older code sits at a block start of its plan, which may be inside a block of today's
(cut at the evaluations): the run resumes there, its block split, and ends with the weights of a run never
interrupted.
"""

from __future__ import annotations

import numpy as np
import pytest

from stalesgd import schedule as schedule_lib
from stalesgd.parallel import _sharding as sharding_lib
from stalesgd.training import _build_run as build_lib
from stalesgd.training import _device_layout as device_layout
from stalesgd.training import _loop as loop_lib
from stalesgd.training._loop import train_and_evaluate
from tests.helpers.train_helpers import evaluation_records, read_metrics, tiny_config

BUILD_RUN = build_lib.build_run
HALF_EPOCH = dict(num_epochs=0.5, eval_every_epochs=0.125)
EXPECTED_STEPS = [24, 47, 71, 94]  # ceil(k x 1497 / 8 / 8), k = 1..4


def _evaluated_steps(workdir) -> list[int]:
  return [record["step"] for record in evaluation_records(read_metrics(workdir))]


def _older_build_run(config, mesh=None):
  """`build_run` as the older code planned its blocks: no evaluation cuts one (its loop evaluated at block ends)."""
  with pytest.MonkeyPatch.context() as older:
    older.setattr(build_lib, "evaluation_updates", lambda *args: np.zeros(0, np.int64))
    return BUILD_RUN(config, mesh)


def _block_starts(config, build_run=BUILD_RUN) -> list[int]:
  """The block starts of the run's runner, on the mesh the training loop gives it."""
  mesh = device_layout.runner_mesh(config, sharding_lib.learner_mesh())
  return build_run(config, mesh).runner.block_starts.tolist()


def test_a_parameter_server_run_evaluates_at_exactly_the_requested_updates(tmp_path):
  workdir = tmp_path / "run"
  config = tiny_config("async_dc", **HALF_EPOCH)
  train_and_evaluate(config, str(workdir))
  assert _evaluated_steps(workdir) == EXPECTED_STEPS
  # The older code's greedy blocks crossed 47 (on 8 devices [40, 48); on one [44, 48)): it evaluated after 48.
  assert 47 not in _block_starts(config, _older_build_run)
  assert set(EXPECTED_STEPS) <= set(_block_starts(config))


@pytest.mark.slow
def test_under_dynamic_local_updates_evaluations_follow_the_applied_examples(tmp_path):
  """async_local: H_m = 3, 3, 3, 3, 2, 2, 1, 1 by learner (speeds 1, 1.5, 3); every quarter epoch of 1,497 examples
  applied, i.e. every 374.25 examples: after the first update whose applied examples reach 374.25 k."""
  workdir = tmp_path / "run"
  config = tiny_config("async_local")
  train_and_evaluate(config, str(workdir))
  schedule = schedule_lib.Schedule.load(workdir / "schedule.npz")
  steps_of = np.asarray(schedule.options["learner_local_steps"])
  assert steps_of.tolist() == [3, 3, 3, 3, 2, 2, 1, 1]
  applied = np.cumsum(steps_of[schedule.learner[:, 0]] * config.batch_per_learner)  # by the end of update u + 1
  expected = []
  for k in range(1, 5):
    reached = np.flatnonzero(applied >= k * 1497 / 4)
    if reached.size:
      expected.append(int(reached[0]) + 1)
  if expected[-1] != schedule.num_updates:
    expected.append(schedule.num_updates)  # the last update is always evaluated
  assert _evaluated_steps(workdir) == expected
  assert len(expected) >= 4


@pytest.mark.slow
def test_a_checkpoint_at_an_older_plans_block_start_resumes_inside_a_block_to_the_same_weights(tmp_path, monkeypatch):
  """The older code's run (greedy blocks, no cut at the evaluations) preempted at a block start that is inside one
  of today's blocks; today's code resumes it there and ends with the weights, evaluations and update count of an
  uninterrupted run of today's code."""
  config = tiny_config("async_dc", **HALF_EPOCH)
  uninterrupted = tmp_path / "uninterrupted"
  expected = train_and_evaluate(config, str(uninterrupted))
  old_starts, today = _block_starts(config, _older_build_run), _block_starts(config)
  stop_block, stop_at = next((i, start) for i, start in enumerate(old_starts) if start > 24 and start not in today)
  workdir = tmp_path / "resumed"
  with monkeypatch.context() as older:
    older.setattr(loop_lib, "build_run", _older_build_run)
    older.setattr(loop_lib.PreemptionGuard, "should_stop", lambda self, block: block == stop_block)
    preempted = train_and_evaluate(config, str(workdir))
  assert preempted["preempted"] and preempted["updates"] == stop_at
  resumed = train_and_evaluate(config, str(workdir))
  assert not resumed["preempted"] and resumed["updates"] == expected["updates"] == 94
  assert resumed["params_sha256"] == expected["params_sha256"]
  assert resumed["test_error"] == expected["test_error"]
  assert [step for step in _evaluated_steps(workdir) if step > stop_at] == [s for s in EXPECTED_STEPS if s > stop_at]
