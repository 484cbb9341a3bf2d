"""The training-loop benchmark's reference emulator applies the engine's updates, and the GPU suite runs end to end.

The GPU suite at ``--tiny`` size runs `experiments.benchmarks.engine` (both protocols, the unroll strategy; the
vmap part's command is checked without running it), `experiments.benchmarks.training` and a short
`stalesgd.cli.train` run, so its test also checks the fields the README's engine tables are built from (one
subprocess run instead of two).
"""

from __future__ import annotations

import json

import jax
import numpy as np
import pytest

from experiments.benchmarks import gpu_suite, single_learner
from experiments.benchmarks.common import CIFAR_SIZED_MODELS, parse_case
from experiments.benchmarks.round_robin import RoundRobinEmulator, check_round_robin
from stalesgd import engine as engine_lib
from stalesgd import models
from stalesgd.configs import rudra_cifar10
from stalesgd.configs.quick import run_on_embedded_digits
from stalesgd.training._build_run import build_run
from stalesgd.training._config_readers import simulate_schedule
from tests.helpers.programs import output_tail, run_program

ENGINE_FIELDS = (
  "protocol",
  "learners",
  "engine_grads_per_s",
  "sync_grads_per_s",
  "naive_grads_per_s",
  "cost_ratio_vs_sync",
  "speedup_vs_naive",
  "ring_buffer_bytes",
  "param_bytes",
  "max_staleness",
  "engine_state_bytes",
  "gradient_strategy",
)


def digits_config(protocol: str, n: int, learners: int, jitter: str = "deterministic"):
  """Rudra's solver (momentum, weight decay, the inverse rule) on the embedded digits."""
  config = rudra_cifar10.paper_config()
  run_on_embedded_digits(config, num_epochs=0.1)
  config.protocol, config.n, config.learners, config.batch_per_learner = protocol, n, learners, 4
  config.staleness_rule, config.weight_decay = "inverse", 0.004
  config.timing.jitter = jitter
  return config


@pytest.mark.slow
def test_the_emulator_ends_with_the_engines_weights():
  # 2-softsync: two contributions per update, the emulator's general case (async's one is its loop run once).
  run = build_run(digits_config("softsync", 2, learners=4))
  check_round_robin(run.schedule)
  updates = 16
  emulator = RoundRobinEmulator(
    run.model.loss_fn,
    run.optimizer,
    run.schedule,
    run.batches,
    run.params,
    updates_per_chunk=updates,
    updates_per_call=4,
  )
  emulator.run_chunk()
  engine = engine_lib.Engine(run.model.loss_fn, run.optimizer, has_aux=True)
  plan = engine.plan(run.schedule)
  state = engine.init(run.params, plan)
  block = 0
  while plan.block_starts[block] < updates:
    state, _ = engine.step(state, plan, block, run.batches)
    block += 1
  assert plan.block_starts[block] == updates, "pick a length at a block boundary"
  # Two programs compiled differently: equal to float32 rounding, not bit for bit.
  for mine, theirs, initial in zip(
    jax.tree_util.tree_leaves(emulator.params()),
    jax.tree_util.tree_leaves(state.params),
    jax.tree_util.tree_leaves(run.params),
  ):
    assert not np.array_equal(np.asarray(mine), np.asarray(initial))
    np.testing.assert_allclose(np.asarray(mine), np.asarray(theirs), rtol=2e-5, atol=2e-6)


def test_the_emulator_refuses_a_schedule_that_is_not_a_rotation():
  # The config's schedule alone (the emulator reads nothing else here), so no model is built and compiled:
  # 200 updates of 4 learners at cifar10_full's size; the lognormal jitter, not the size, breaks the rotation.
  config = digits_config("async", 1, learners=4, jitter="lognormal")
  with pytest.raises(ValueError, match="round-robin"):
    check_round_robin(simulate_schedule(config, 200, parameter_bytes=4 * 89_578))
  check_round_robin(simulate_schedule(digits_config("async", 1, learners=4), 200, parameter_bytes=4 * 89_578))


@pytest.mark.parametrize("case,expected", [("async:8", ("async", 1, 8)), ("softsync4:32", ("softsync", 4, 32))])
def test_cases_parse(case, expected):
  assert parse_case(case) == expected


@pytest.mark.parametrize("case", ["sync:8", "softsync:8", "async:0", "async"])
def test_bad_cases_name_what_is_allowed(case):
  with pytest.raises(ValueError, match="case"):
    parse_case(case)


@pytest.mark.parametrize(
  "requested, quick, cases_given, expected",
  [
    (None, False, False, True),  # the full run measures the single learner after its cases
    (None, True, False, False),  # --quick stays short
    (None, False, True, False),  # chosen --cases (the GPU suite's tiny and full runs) stay as they were
    (True, True, True, True),
    (False, False, False, False),
  ],
)
def test_the_single_learner_is_in_the_full_training_benchmark_only(requested, quick, cases_given, expected):
  assert single_learner.in_training_benchmark(requested, quick=quick, cases_given=cases_given) is expected


def test_the_single_learner_part_times_both_runs_in_turn_and_records_the_ratio_and_the_load(tmp_path):
  """Without training (a stand-in for the two processes): the runs alternate, one at a time, in the study's
  8-device layout; medians, their ratio against the 1.5x target and the load before and after are recorded."""
  rates = {"single": iter([600.0, 700.0, 650.0]), "lambda30": iter([800.0, 900.0, 1000.0])}
  calls = []

  def run(case, data_dir, workdir, epochs_scale):
    calls.append((case, workdir.name, epochs_scale))
    return next(rates[case])

  result = single_learner.measure("data", tmp_path, rounds=3, epochs_scale=0.5, real_data=False, run=run)
  assert calls == [(case, f"{case}_{r}", 0.5) for r in range(3) for case in ("single", "lambda30")]
  assert result["cases"] == {"single": "rudra_cifar10:baseline", "lambda30": "rudra_cifar10:mu_lambda_3840"}
  assert result["devices"] == 8 and result["epochs"] == {"single": 0.15, "lambda30": 0.5}
  assert result["median_images_per_s"] == {"single": 650.0, "lambda30": 900.0}
  assert result["single_over_lambda30"] == pytest.approx(650 / 900) and result["met"]  # 0.72 >= 1 / 1.5
  load = result["load_average_1_5_15_min"]
  assert len(load["before"]) == len(load["after"]) == 3
  with pytest.raises(ValueError, match="rounds=0"):
    single_learner.measure("data", tmp_path, rounds=0, real_data=False, run=run)


def test_a_runs_rate_counts_every_contribution_of_an_update(tmp_path):
  """lambda = 30 applies 30 x 128 images per update: the steady rate counts them all, from the second record."""
  records = [{"step": 1, "wall_time": 50.0}, {"step": 2, "wall_time": 60.0}, {"step": 5, "wall_time": 66.0}]
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records))
  assert single_learner.loop_images_per_s(tmp_path, batch=30 * 128) == pytest.approx(3 * 30 * 128 / 6.0)
  (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records[:2]))
  with pytest.raises(RuntimeError, match="too few records"):
    single_learner.loop_images_per_s(tmp_path, batch=128)


@pytest.mark.slow
def test_the_gpu_suite_runs_at_tiny_size_on_cpu(tmp_path):
  output = tmp_path / "gpu_suite.json"
  completed = run_program("experiments.benchmarks.gpu_suite", "--tiny", f"--output={output}", timeout=600)
  assert completed.returncode == 0, output_tail(completed)
  report = json.loads(output.read_text())
  assert report["tiny"] and report["machine"]["platform"] == "cpu"
  assert report["engine"].keys() == {"unroll"}  # the vmap part's command: the test below
  # The engine benchmark itself (`experiments.benchmarks.engine --quick`), as the README's tables use it.
  unrolled = report["engine"]["unroll"]
  assert {row["protocol"] for row in unrolled["rows"]} == {"async", "4-softsync"}
  for row in unrolled["rows"]:
    assert set(ENGINE_FIELDS) <= set(row) and row["learners"] == 8 and row["gradient_strategy"] == "unroll"
    assert row["model"] == "mlp"
    assert min(row["engine_grads_per_s"], row["sync_grads_per_s"], row["naive_grads_per_s"]) > 0
    assert row["cost_ratio_vs_sync"] > 0
    assert row["ring_buffer_bytes"] == (row["max_staleness"] + 1) * row["param_bytes"]
  assert "cost/sync" in unrolled["output_tail"]  # the printed table
  training = report["training"]["rows"][0]
  assert training["loop_over_engine"] > 0 and training["emulator_grads_per_s"] is None
  assert report["real_run"]["summary"]["updates"] > 0 and report["real_run"]["steady_images_per_s"] > 0


def test_the_engine_benchmark_offers_the_zoos_networks_for_32x32_images_only():
  """The engine benchmark's --model: its choices and default, read from its help (its module defines absl flags
  that other benchmark modules define too, so it is not imported here)."""
  assert set(CIFAR_SIZED_MODELS) <= set(models.available_models())
  assert not {"alexnet", "resnet50"} & set(CIFAR_SIZED_MODELS)  # built for 224-227 pixels
  shown = run_program("experiments.benchmarks.engine", "--helpshort")  # absl's help exits with status 1
  text = shown.stdout + shown.stderr
  model = text[text.index("--model:") :].split("\n  --")[0]
  assert f"<{'|'.join(CIFAR_SIZED_MODELS)}>" in model and "(default: 'cifar10_full')" in model, model


@pytest.mark.parametrize("tiny, strategies", [(False, ("unroll", "vmap")), (True, ("unroll",))])
def test_the_gpu_suite_times_the_engine_once_per_gradient_strategy(tmp_path, monkeypatch, tiny, strategies):
  """On the GPU each strategy runs in its own process at lambda in {32, 128, 512}; --tiny runs unroll alone."""
  commands = []

  def run_part(name, command, timeout, env):
    commands.append(command)
    return {"status": 0}

  monkeypatch.setattr(gpu_suite, "run_part", run_part)
  results = gpu_suite.engine_part(tmp_path, tiny, timeout=1, env={})
  assert tuple(results) == strategies and len(commands) == len(strategies)
  for strategy, command in zip(strategies, commands):
    assert command[1:3] == ["-m", "experiments.benchmarks.engine"]
    assert (
      f"--gradient_strategy={strategy}" in command and f"--output={tmp_path / f'engine_{strategy}.json'}" in command
    )
    assert ("--learners=8" if tiny else "--learners=32,128,512") in command
    assert ("--quick" in command) is tiny and ("--repeats=1" if tiny else "--repeats=5") in command
