"""The timing model: validation, jitter laws, speed factors, traces and communication costs."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

from stalesgd.schedule import TimingModel, _decentralized, simulate
from stalesgd.schedule._durations import BLOCK_STEPS, StepDurations, dynamic_local_steps


@pytest.mark.parametrize("count, group, blocks", [(1, 1, 1), (BLOCK_STEPS, 1, 1), (BLOCK_STEPS + 1, 1, 2), (700, 3, 3)])
def test_first_draws_exactly_the_blocks_its_steps_need(count, group, blocks, monkeypatch):
  """ceil(count H / BLOCK_STEPS) blocks, never more (a vectorised read of 10^6 contributions must not draw 10^6
  blocks of 1,024 steps), and the same sums as the event loop's stream. First in this file, and stopping at the
  first block too many: a block count that explodes would otherwise hang the tests below before failing here."""
  timing = TimingModel(jitter="exponential")
  durations = StepDurations(timing, learners=2, seed=4, local_steps=group)
  drawn = []
  original = StepDurations._blocks

  def counted(self, learner):
    for block in original(self, learner):
      drawn.append(learner)
      assert len(drawn) <= blocks, f"more than the {blocks} blocks {count} x {group} steps need"  # fail fast
      yield block

  monkeypatch.setattr(StepDurations, "_blocks", counted)
  seconds = durations.first(1, count)
  assert len(drawn) == blocks
  monkeypatch.undo()
  stream = durations.stream(1)
  np.testing.assert_array_equal(seconds, [next(stream) for _ in range(count)])


@pytest.mark.parametrize("field", ["compute_time", "latency", "apply_time", "jitter_sigma", "speed_factor_sigma"])
def test_negative_times_raise_naming_the_field(field):
  with pytest.raises(ValueError, match=rf"{field}=-1\.0; allowed: a finite number >=? 0$"):
    TimingModel(**{field: -1.0})


@pytest.mark.parametrize(
  "fields,message",
  [
    ({"compute_time": 0.0}, r"compute_time=0\.0; allowed: a finite number > 0"),
    ({"bandwidth": 0.0}, r"bandwidth=0\.0; allowed: a number > 0 \(inf allowed\)"),
    ({"model_bytes": -5}, r"model_bytes=-5; allowed: an integer >= 0"),
    ({"server_shards": 0}, r"server_shards=0; allowed: an integer >= 1"),
    (
      {"jitter": "gaussian"},
      r"jitter='gaussian'; allowed: one of \('deterministic', 'lognormal', 'exponential', 'straggler'\)$",
    ),
    ({"jitter": "straggler"}, r"straggler_prob=0\.0; allowed: a finite number > 0 and <= 1"),
    (
      {"jitter": "straggler", "straggler_prob": 0.1, "straggler_factor": 0.5},
      r"straggler_factor=0\.5; allowed: a finite number >= 1",
    ),
    ({"straggler_prob": 0.1}, r"straggler_prob and straggler_factor need jitter='straggler'"),
    ({"straggler_factor": 2.0}, r"straggler_prob and straggler_factor need jitter='straggler'"),
    ({"straggler_factor": 0.5}, r"straggler_prob and straggler_factor need jitter='straggler'"),
    ({"straggler_prob": -0.1}, r"straggler_prob and straggler_factor need jitter='straggler'"),
    ({"speed_factors": ()}, r"speed_factors must hold one factor per learner"),
    ({"speed_factors": (1.0, -2.0)}, r"speed_factors\[1\]=-2\.0; allowed: a finite number > 0"),
    ({"speed_factors": (1.0,), "speed_factor_sigma": 0.5}, r"give at most one of"),
    ({"compute_time": math.nan}, r"compute_time=nan; allowed: a finite number > 0"),
  ],
)
def test_invalid_timing_raises(fields, message):
  with pytest.raises(ValueError, match=message):
    TimingModel(**fields)


def test_empty_trace_raises(tmp_path):
  path = tmp_path / "empty.csv"
  path.write_text("# learner speed factors\n")
  with pytest.raises(ValueError, match="trace must hold at least one value"):
    TimingModel(trace=str(path))


@pytest.mark.parametrize(
  "contents,message",
  [
    ("1.0\n-2.0\n", "trace values must be finite and > 0"),
    ("1.0\n0.0\n", "has 1 that are not, the first 0.0 at"),
    ("1.0\n0.0\n-2.0\n", r"has 2 that are not, the first 0.0 at index \(1,\)"),
    ("1.0\n-inf\n", "has 1 that are not, the first -inf at"),
  ],
)
def test_bad_trace_values_raise(tmp_path, contents, message):
  path = tmp_path / "bad.csv"
  path.write_text(contents)
  with pytest.raises(ValueError, match=message):
    TimingModel(trace=str(path))


def test_trace_with_unknown_extension_raises(tmp_path):
  with pytest.raises(ValueError, match=r"trace must be a \.npy or \.csv file"):
    TimingModel(trace=str(tmp_path / "trace.txt"))


def test_trace_shape_must_fit_the_learners(tmp_path):
  path = tmp_path / "trace.npy"
  np.save(path, np.ones((5, 3)))
  with pytest.raises(ValueError, match=r"trace .* must have shape \[learners\].*learners=4; got shape \(5, 3\)"):
    simulate("async", learners=4, num_updates=10, seed=0, timing=TimingModel(trace=str(path)))


@pytest.mark.parametrize(
  "jitter,extra,mean",
  [
    ("lognormal", {"jitter_sigma": 0.3}, 1.0),
    ("exponential", {}, 1.0),
    ("straggler", {"jitter_sigma": 0.0, "straggler_prob": 0.1, "straggler_factor": 5.0}, 1.4),
  ],
)
def test_jitter_laws_have_their_means(jitter, extra, mean):
  timing = TimingModel(compute_time=2.0, jitter=jitter, **extra)
  seconds = StepDurations(timing, learners=1, seed=0).first(0, 200_000)
  assert seconds.mean() == pytest.approx(2.0 * mean, rel=0.02)


def test_lognormal_jitter_has_the_requested_sigma():
  timing = TimingModel(jitter="lognormal", jitter_sigma=0.25)
  seconds = StepDurations(timing, learners=1, seed=1).first(0, 100_000)
  assert np.log(seconds).std() == pytest.approx(0.25, rel=0.02)


def test_straggler_steps_are_exactly_factor_times_slower_with_probability_p():
  timing = TimingModel(jitter="straggler", jitter_sigma=0.0, straggler_prob=0.05, straggler_factor=7.0)
  seconds = StepDurations(timing, learners=1, seed=2).first(0, 100_000)
  assert set(np.unique(seconds)) == {1.0, 7.0}
  assert np.mean(seconds == 7.0) == pytest.approx(0.05, abs=0.003)


def test_deterministic_timing_with_fixed_speed_factors():
  timing = TimingModel(compute_time=0.5, jitter="deterministic", speed_factors=(1.0, 2.0, 4.0))
  durations = StepDurations(timing, learners=3, seed=0)
  for learner, factor in enumerate((1.0, 2.0, 4.0)):
    np.testing.assert_array_equal(durations.first(learner, 10), np.full(10, 0.5 * factor))


@pytest.mark.parametrize("sigma", [0.5, 1.0])
def test_drawn_speed_factors_are_seeded_and_mean_one(sigma):
  """exp(sigma Z - sigma^2 / 2): mean 1 and median exp(-sigma^2 / 2) (sigma = 1 tells sigma^2 from sigma / 2)."""
  timing = TimingModel(speed_factor_sigma=sigma)
  factors = timing.speed_factors_for(100_000, seed=3)
  np.testing.assert_array_equal(factors, timing.speed_factors_for(100_000, seed=3))
  assert not np.array_equal(factors, timing.speed_factors_for(100_000, seed=4))
  assert factors.mean() == pytest.approx(1.0, rel=0.02)
  assert np.median(factors) == pytest.approx(math.exp(-(sigma**2) / 2), rel=0.02)
  assert np.log(factors).std() == pytest.approx(sigma, rel=0.02)
  drawn = np.random.default_rng(np.random.SeedSequence(3, spawn_key=(0,))).standard_normal(100_000)
  np.testing.assert_allclose(factors, np.exp(sigma * drawn - sigma**2 / 2), rtol=1e-15)


def test_per_learner_csv_trace(tmp_path):
  path = tmp_path / "speeds.csv"
  path.write_text("# one row per learner\n1.0\n1.5\n3.0\n")
  timing = TimingModel(trace=str(path), jitter="deterministic")
  np.testing.assert_array_equal(timing.speed_factors_for(3, seed=0), [1.0, 1.5, 3.0])
  schedule = simulate("hardsync", learners=3, num_updates=5, seed=0, timing=timing)
  np.testing.assert_allclose(schedule.update_time, 3.0 * np.arange(1, 6))


@pytest.mark.parametrize("contents", ["2.0,3.0,5.0\n", "# one per line\n2.0\n3.0\n5.0\n"])
def test_a_trace_of_one_row_or_one_column_is_a_factor_per_learner(tmp_path, contents):
  """A one-line csv is shape [learners], a one-column csv too, and an npy of shape [learners, 1] is read the same
  way: a fixed factor per learner (not a per-step trace of one step)."""
  path = tmp_path / "speeds.csv"
  path.write_text(contents)
  for timing in (TimingModel(trace=str(path)), _npy_trace(tmp_path, [[2.0], [3.0], [5.0]])):
    assert timing.trace_layout(3) == "per_learner"
    np.testing.assert_array_equal(timing.speed_factors_for(3, seed=0), [2.0, 3.0, 5.0])
    assert timing.per_step_trace(3) is None


def test_a_square_trace_is_per_step_and_a_single_value_a_factor_for_one_learner(tmp_path):
  """[learners, learners] is one row per step (not a factor per learner); a csv of one value is shape [1]; an array
  of three dimensions, or of none (a 0-d .npy), is refused."""
  timing = _npy_trace(tmp_path, [[1.0, 2.0, 3.0], [4.0, 5.0, 6.0], [7.0, 8.0, 9.0]])
  assert timing.trace_layout(3) == "per_step"
  np.testing.assert_array_equal(timing.speed_factors_for(3, seed=0), [1.0, 1.0, 1.0])
  path = tmp_path / "one.csv"
  path.write_text("2.5\n")
  assert TimingModel(trace=str(path)).trace_layout(1) == "per_learner"
  np.save(tmp_path / "cube.npy", np.ones((2, 2, 2)))
  with pytest.raises(ValueError, match=r"trace must have 1 or 2 dimensions; .* has shape \(2, 2, 2\)"):
    TimingModel(trace=str(tmp_path / "cube.npy"))
  np.save(tmp_path / "scalar.npy", np.float64(2.5))  # a 0-d array: a csv of one value is the way to give one factor
  with pytest.raises(ValueError, match=r"trace must have 1 or 2 dimensions; .* has shape \(\)"):
    TimingModel(trace=str(tmp_path / "scalar.npy"))


def _npy_trace(tmp_path, values) -> TimingModel:
  path = tmp_path / "trace.npy"
  np.save(path, np.asarray(values, np.float64))
  return TimingModel(trace=str(path))


def test_a_per_learner_trace_of_hundreds_of_learners_and_one_of_other_length(tmp_path):
  """Lengths compared by value (300 learners), and a trace longer or shorter than the learners is refused."""
  assert _npy_trace(tmp_path, np.ones(300)).trace_layout(300) == "per_learner"
  assert _npy_trace(tmp_path, np.ones((2, 300))).trace_layout(300) == "per_step"
  TimingModel(speed_factors=(1.0,) * 300).check_learners(300)
  with pytest.raises(ValueError, match=r"must have shape \[learners\].*learners=3; got shape \(2,\)"):
    _npy_trace(tmp_path, np.ones(2)).trace_layout(3)
  with pytest.raises(ValueError, match=r"must have shape \[learners\].*learners=3; got shape \(4,\)"):
    _npy_trace(tmp_path, np.ones(4)).trace_layout(3)
  with pytest.raises(ValueError, match=r"\[steps, learners\] \(one row per step\) with learners=2; got shape \(5, 3\)"):
    _npy_trace(tmp_path, np.ones((5, 3))).trace_layout(2)
  with pytest.raises(ValueError, match=r"speed_factors must hold one factor per learner \(learners=2\); got 3"):
    TimingModel(speed_factors=(1.0, 2.0, 3.0)).check_learners(2)


def test_a_pickled_or_unreadable_trace_is_refused_naming_the_file(tmp_path, monkeypatch):
  path = tmp_path / "pickled.npy"
  np.save(path, np.array([1.0, 2.0], dtype=object), allow_pickle=True)
  with pytest.raises(ValueError, match=r"trace file .*pickled\.npy' cannot be read \(ValueError"):
    TimingModel(trace=str(path))
  np.save(path, np.ones(2))

  def failing_read(*args, **kwargs):
    raise OSError("input/output error")

  monkeypatch.setattr(np, "load", failing_read)
  with pytest.raises(ValueError, match=r"cannot be read \(OSError: input/output error\)"):
    TimingModel(trace=str(path))


def test_a_timing_model_is_frozen_and_has_one_server_shard_by_default():
  import dataclasses

  timing = TimingModel(model_bytes=1_000, bandwidth=10_000)
  assert timing.server_link_time == pytest.approx(0.1)  # one shard carries the whole message
  with pytest.raises(dataclasses.FrozenInstanceError):
    timing.latency = 1.0


def test_the_exponential_law_has_unit_spread_and_lognormal_steps_draw_no_uniforms():
  """Exponential steps: mean and std 1 (not the light log-normal's 0.1). Log-normal steps across a block boundary
  are exp(sigma Z - sigma^2 / 2) of the stream's normals alone: no uniforms drawn between blocks (only the
  straggler law draws them)."""
  seconds = StepDurations(TimingModel(jitter="exponential"), learners=1, seed=0).first(0, 100_000)
  assert seconds.std() == pytest.approx(1.0, rel=0.02)
  timing = TimingModel(compute_time=0.5, jitter="lognormal", jitter_sigma=0.3)
  generator = np.random.default_rng(np.random.SeedSequence(3, spawn_key=(1, 1)))
  normals = np.concatenate([generator.standard_normal(1024), generator.standard_normal(1024)])
  expected = 0.5 * np.exp(0.3 * normals - 0.3**2 / 2)
  np.testing.assert_allclose(StepDurations(timing, 2, 3).first(1, 2048), expected, rtol=1e-15)


def test_communication_is_free_by_default_even_over_a_finite_link():
  assert TimingModel(bandwidth=4.0).transfer_time == 0.0
  assert TimingModel(bandwidth=4.0).allreduce_time(4) == 0.0


@pytest.mark.parametrize(
  "jitter, extra",
  [("deterministic", {}), ("exponential", {}), ("straggler", {"straggler_prob": 0.5, "straggler_factor": 3.0})],
)
def test_a_jitter_name_is_compared_by_value(jitter, extra):
  """A name built at run time (e.g. read from a config) selects its law as the literal does."""
  built = TimingModel(jitter="".join(list(jitter)), **extra)
  seconds = StepDurations(built, learners=1, seed=0).first(0, 10_000)
  literal = TimingModel(jitter=jitter, **extra)
  np.testing.assert_array_equal(seconds, StepDurations(literal, learners=1, seed=0).first(0, 10_000))


def test_a_timing_models_repr_names_its_trace_file_not_its_values(tmp_path):
  timing = _npy_trace(tmp_path, np.full(3, 7.25))
  assert "trace.npy" in repr(timing) and "7.25" not in repr(timing)


def test_per_step_npy_trace_replays_step_times_cyclically(tmp_path):
  steps = np.array([[1.0, 2.0], [3.0, 0.5], [2.0, 2.0]])
  path = tmp_path / "steps.npy"
  np.save(path, steps)
  timing = TimingModel(trace=str(path), jitter="deterministic")
  durations = StepDurations(timing, learners=2, seed=0)
  expected = np.tile(steps, (BLOCK_STEPS, 1))[: BLOCK_STEPS + 5]  # crosses a block boundary
  for learner in range(2):
    np.testing.assert_array_equal(durations.first(learner, BLOCK_STEPS + 5), expected[:, learner])
  schedule = simulate("hardsync", learners=2, num_updates=3, seed=0, timing=timing)
  np.testing.assert_allclose(schedule.update_time, np.cumsum(steps.max(axis=1)))


def test_step_times_are_common_random_numbers_across_protocols_and_cluster_sizes():
  timing = TimingModel(jitter="exponential")
  small = StepDurations(timing, learners=2, seed=9)
  large = StepDurations(timing, learners=50, seed=9)
  streamed = [next(stream) for stream in [large.stream(1)] for _ in range(2 * BLOCK_STEPS + 3)]
  np.testing.assert_array_equal(small.first(1, 2 * BLOCK_STEPS + 3), streamed)
  hardsync = simulate("hardsync", learners=3, num_updates=20, seed=9, timing=timing)
  asynchronous = simulate("async", learners=3, num_updates=20, seed=9, timing=timing)
  np.testing.assert_array_equal(
    hardsync.update_time[:1], np.max([StepDurations(timing, 3, 9).first(learner, 1) for learner in range(3)])
  )
  assert asynchronous.update_time[0] == np.min([StepDurations(timing, 3, 9).first(learner, 1) for learner in range(3)])


def test_ring_allreduce_cost():
  timing = TimingModel(latency=0.01, model_bytes=4_000_000, bandwidth=1e9)
  assert timing.allreduce_time(1) == 0.0
  assert timing.allreduce_time(8) == pytest.approx(2 * 7 / 8 * 4e-3 + 2 * 7 * 0.01)


def test_one_learner_pays_push_pull_and_apply_every_step():
  timing = TimingModel(jitter="deterministic", latency=0.05, model_bytes=1_000, bandwidth=10_000, apply_time=0.02)
  schedule = simulate("async", learners=1, num_updates=10, seed=0, timing=timing)
  step = 1.0 + 2 * (0.05 + 0.1) + 0.02
  np.testing.assert_allclose(np.diff(schedule.update_time), step)
  assert schedule.update_time[0] == pytest.approx(0.05 + 0.1 + 1.0 + 0.05 + 0.1 + 0.02)


@pytest.mark.parametrize("shards,period", [(1, 1.0 + 5 * 0.1), (4, 1.0 + 2 * 0.1)])
def test_server_link_contention_and_sharding(shards, period):
  # Four learners push and pull 0.1 s messages through one server link: the
  # transfers queue (1 + (4 + 1) x 0.1 s per round); four shards carry a
  # quarter each and the learners' own links become the bottleneck.
  timing = TimingModel(jitter="deterministic", model_bytes=1_000, bandwidth=10_000, server_shards=shards)
  schedule = simulate("hardsync", learners=4, num_updates=20, seed=0, timing=timing)
  np.testing.assert_allclose(np.diff(schedule.update_time), period)


def test_a_server_shards_link_carries_its_share_of_a_message():
  """model_bytes / bandwidth / server_shards: 1,000 bytes at 10,000 bytes/s over 4 shards, 0.025 s on each."""
  timing = TimingModel(model_bytes=1_000, bandwidth=10_000, server_shards=4)
  assert timing.transfer_time == pytest.approx(0.1) and timing.server_link_time == pytest.approx(0.025)


def test_an_all_reduce_needs_a_learner():
  with pytest.raises(ValueError, match=r"^learners=0; allowed: an integer >= 1$"):
    TimingModel().allreduce_time(0)


def test_the_first_pull_is_sent_at_time_zero():
  """4 shards of 0.1 s messages (0.025 s on each server link): every pull is done at 0.1 s (the learners' own
  links), the steps end at 1.1 s and the pushes arrive at 1.2 s; a pull sent earlier would arrive sooner."""
  timing = TimingModel(jitter="deterministic", model_bytes=1_000, bandwidth=10_000, server_shards=4)
  schedule = simulate("async", learners=4, num_updates=4, seed=0, timing=timing)
  np.testing.assert_allclose(schedule.update_time, [1.2] * 4)


def test_server_apply_time_serialises_updates():
  timing = TimingModel(jitter="deterministic", apply_time=0.1)
  schedule = simulate("async", learners=20, num_updates=400, seed=0, timing=timing)
  # The server is the bottleneck: 20 learners produce 20 gradients/s, it applies 10/s.
  np.testing.assert_allclose(np.diff(schedule.update_time)[50:], 0.1)


def test_timing_round_trips_through_a_dict(tmp_path):
  path = tmp_path / "speeds.npy"
  np.save(path, np.array([1.0, 2.0]))
  for timing in (TimingModel(speed_factors=(1.0, 2.0), latency=0.1, bandwidth=math.inf), TimingModel(trace=path)):
    assert TimingModel.from_dict(timing.to_dict()) == timing


def test_outer_rounds_are_timed_step_by_step_with_each_fragments_all_reduce():
  """2 learners at 1 s and 2 s per step (deterministic), H = 2, all-reduce of the whole model 2 s (8 bytes at
  4 bytes/s, no latency; a fragment of P = 2 takes 1 s). By hand:
  DiLoCo: round 1, the slower learner ends at 4 s, the all-reduce at 6; round 2 from 6: 10, then 12.
  Streaming, P = 2, tau = 1: fragment 0's all-reduce runs 2-3 s (the slower learner's first step), applied after
  step 2 (learner 0 waits until 3); fragment 1's runs 4-5, applied after step 3 (learner 0 at 4 waits until 5);
  rounds end when the slower learner finishes its steps, at 4 and 8 s: the all-reduces hidden behind steps."""
  timing = TimingModel(compute_time=1.0, jitter="deterministic", speed_factors=(1.0, 2.0), model_bytes=8, bandwidth=4.0)
  diloco = simulate("diloco", learners=2, num_updates=2, seed=0, timing=timing, local_steps=2)
  np.testing.assert_allclose(diloco.update_time, [6.0, 12.0])
  streaming = simulate(
    "streaming_diloco", learners=2, num_updates=2, seed=0, timing=timing, local_steps=2, fragments=2, delay=1
  )
  np.testing.assert_allclose(streaming.update_time, [4.0, 8.0])
  delayed = simulate("streaming_diloco", learners=2, num_updates=2, seed=0, timing=timing, local_steps=2, delay=2)
  # One-round-delayed: the 2 s all-reduce of round 1 (4-6 s) is waited for after round 2's steps (8 s): no wait.
  np.testing.assert_allclose(delayed.update_time, [4.0, 8.0])
  with pytest.raises(ValueError, match="fragments=2, delay=0 with local_steps=3"):
    simulate("streaming_diloco", learners=2, num_updates=2, seed=0, local_steps=3, fragments=2)


def test_a_fragments_all_reduce_is_its_share_of_the_ring_plus_the_latency_hops():
  """2 learners at 1 s and 2 s per step, H = 2, P = 2, tau = 0; 12 bytes at 4 bytes/s (3 s for the model), 0.25 s
  latency: a fragment's ring all-reduce is 2 (M-1)/M x 3 s / P + 2 (M-1) x 0.25 s = 1.5 + 0.5 = 2 s. By hand: step
  1 ends at 2 s (the slower learner), fragment 0's all-reduce 2-4 s, waited for (tau = 0); step 2 ends at 6,
  fragment 1's 6-8: round 1 ends at 8, round 2 likewise 8 s later."""
  timing = TimingModel(
    compute_time=1.0, jitter="deterministic", speed_factors=(1.0, 2.0), model_bytes=12, bandwidth=4.0, latency=0.25
  )
  schedule = simulate(
    "streaming_diloco", learners=2, num_updates=2, seed=0, timing=timing, local_steps=2, fragments=2, delay=0
  )
  np.testing.assert_allclose(schedule.update_time, [8.0, 16.0])


@pytest.mark.parametrize("delay, ends", [(1, [5.0, 11.0, 17.0]), (2, [4.0, 8.0, 14.0])])
def test_a_fragments_application_waits_for_its_all_reduce_tau_steps_after_its_sync(delay, ends):
  """2 learners at 1 s and 2 s per step, H = 2, P = 2, fragment all-reduces of 3 s (24 bytes at 4 bytes/s: 6 s for
  the model, x 2 (M-1)/M / P). tau = 1: fragment 0 syncs after step 1 (2 s), all-reduce 2-5, applied after step 2
  (both wait until 5: round 1 ends at 5); fragment 1 syncs at 5, all-reduce 5-8, applied after step 3 (7 -> 8);
  fragment 0 again 8-11, applied after step 4 (10 -> 11: round 2 ends at 11); round 3 likewise at 17.
  tau = 2: fragment 0's all-reduce 2-5 is applied after step 3 (3 and 6 -> 5 and 6), fragment 1's (after step 2 at
  4 s, the link free at 5) 5-8 after step 4 (6 and 8 -> 8), fragment 0's next (the link free at 8) 8-11 after step
  5 (9, 10 -> 11), fragment 1's 11-14 after step 6 (12, 13 -> 14): rounds end at 4, 8 and 14."""
  timing = TimingModel(
    compute_time=1.0, jitter="deterministic", speed_factors=(1.0, 2.0), model_bytes=24, bandwidth=4.0
  )
  schedule = simulate(
    "streaming_diloco", learners=2, num_updates=3, seed=0, timing=timing, local_steps=2, fragments=2, delay=delay
  )
  np.testing.assert_allclose(schedule.update_time, ends)


def test_a_synchronous_all_reduce_step_waits_for_the_slowest_learner_and_the_all_reduce():
  """allreduce_sync, learners at 1 s and 2 s, a 2 s all-reduce (8 bytes at 4 bytes/s, M = 2): 2 + 2 s per step."""
  timing = TimingModel(compute_time=1.0, jitter="deterministic", speed_factors=(1.0, 2.0), model_bytes=8, bandwidth=4.0)
  schedule = simulate("allreduce_sync", learners=2, num_updates=3, seed=0, timing=timing)
  np.testing.assert_allclose(schedule.update_time, [4.0, 8.0, 12.0])


STRAGGLER = TimingModel(
  compute_time=0.5, jitter="straggler", jitter_sigma=0.3, straggler_prob=0.2, straggler_factor=4.0
)


def test_a_learners_step_times_are_drawn_in_blocks_of_normals_then_uniforms():
  # The stream's definition, across a block boundary: each block of BLOCK_STEPS (1024) steps draws 1024 standard
  # normals, then 1024 uniforms (a straggle where below p), from the learner's own generator. Changing the block
  # size would move every straggler run's schedule past step 1024. The generator is numpy's, keyed by the seed and
  # the documented spawn key (1, learner): a changed key would change every recorded schedule.
  generator = np.random.default_rng(np.random.SeedSequence(3, spawn_key=(1, 1)))
  expected = []
  for _ in range(2):
    normals, uniforms = generator.standard_normal(1024), generator.random(1024)
    multipliers = np.exp(0.3 * normals - 0.3**2 / 2) * np.where(uniforms < 0.2, 4.0, 1.0)
    expected.extend((0.5 * multipliers).tolist())
  assert BLOCK_STEPS == 1024
  np.testing.assert_array_equal(StepDurations(STRAGGLER, 2, 3).first(1, 2048), expected)


@pytest.mark.parametrize("local_steps, count", [(1, 3000), (3, 700)], ids=["H=1", "H=3"])
def test_local_runs_last_the_left_to_right_sums_of_consecutive_steps(local_steps, count):
  # first() (vectorised) and stream() (one at a time) against the H = 1 step times added in order by hand, over
  # more than two blocks of steps.
  steps = StepDurations(STRAGGLER, 2, 5).first(0, count * local_steps).tolist()
  expected = []
  for r in range(count):
    total = steps[r * local_steps]
    for i in range(1, local_steps):
      total += steps[r * local_steps + i]
    expected.append(total)
  durations = StepDurations(STRAGGLER, 2, 5, local_steps=local_steps)
  np.testing.assert_array_equal(durations.first(0, count), expected)
  stream = durations.stream(0)
  np.testing.assert_array_equal([next(stream) for _ in range(count)], expected)


def test_dynamic_local_steps_by_hand():
  # The asynchronous DiLoCo notebook's workers (0.58, 0.75, 1.51 and 3.33 s per step), H = 20, H_min = 5:
  # H_m = max(int(H * min_sec / sec_m), 5): 20, int(15.47) = 15, int(7.68) = 7, max(int(3.48), 5) = 5.
  timing = TimingModel(speed_factors=(0.58, 0.75, 1.51, 3.33), jitter="deterministic")
  np.testing.assert_array_equal(dynamic_local_steps(timing, 4, 0, 20, 5), [20, 15, 7, 5])
  three = TimingModel(speed_factors=(1.0, 1.5, 3.0), jitter="deterministic")
  np.testing.assert_array_equal(dynamic_local_steps(three, 3, 0, 6, 1), [6, 4, 2])
  np.testing.assert_array_equal(dynamic_local_steps(three, 3, 0, 6, 5), [6, 5, 5])
  # In floats, as the notebook computes it: 48 * (0.3 / 0.8) = 17.999999999999996, so 17 steps.
  two = TimingModel(speed_factors=(0.3, 0.8), jitter="deterministic")
  np.testing.assert_array_equal(dynamic_local_steps(two, 2, 0, 48, 1), [48, 17])


def test_first_of_no_contributions_is_empty():
  seconds = StepDurations(TimingModel(), learners=1, seed=0, local_steps=3).first(0, 0)
  assert seconds.shape == (0,) and seconds.dtype == np.float64


@pytest.mark.parametrize("group", [2, 3, 4])
def test_a_contribution_of_h_steps_lasts_the_sum_of_h_consecutive_step_times(group):
  timing = TimingModel(jitter="exponential")
  single = StepDurations(timing, learners=1, seed=6).first(0, 5 * group).reshape(5, group)
  expected = single[:, 0].copy()
  for column in range(1, group):
    expected += single[:, column]
  stream = StepDurations(timing, learners=1, seed=6, local_steps=group).stream(0)
  np.testing.assert_array_equal([next(stream) for _ in range(5)], expected)


# Learners at 0.25 s and 0.5 s per step, a 3 s ring all-reduce (12 bytes at 4 bytes/s, M = 2): A[t] waits.
_SLOW_NETWORK = TimingModel(
  compute_time=0.25, jitter="deterministic", speed_factors=(1.0, 2.0), model_bytes=12, bandwidth=4.0
)


@pytest.mark.parametrize(
  "staleness, overlap, ends",
  [
    # S = 0 (overlap or not): each step 0.5 s of compute then the 3 s all-reduce.
    (0, True, [3.5, 7.0, 10.5, 14.0]),
    (0, False, [3.5, 7.0, 10.5, 14.0]),
    # S = 1 without overlap: a step starts when the previous all-reduce is done and ends 0.5 s later.
    (1, False, [0.5, 4.0, 7.5, 11.0]),
    # S = 1 with overlap: step 0 ends at 0.5, A[0] = 3.5; step 1 computes to 0.5 / 1.0 and waits for A[0]: 3.5,
    # A[1] = 6.5; step 2 waits for A[1]: 6.5; step 3 for A[2] = 9.5.
    (1, True, [0.5, 3.5, 6.5, 9.5]),
    # S = 2 with overlap: steps 0 and 1 wait for nothing (0.5, 1.0; A[0] = 3.5, A[1] = 3.5 + 3 = 6.5); step 2
    # computes to 0.75 / 1.5 and waits for A[0]: 3.5 (A[2] = 9.5); step 3 to 3.75 / 4.0, waits for A[1]: 6.5.
    (2, True, [0.5, 1.0, 3.5, 6.5]),
  ],
)
def test_stale_all_reduce_steps_by_hand(staleness, overlap, ends):
  """The decentralized recurrence (`stalesgd.schedule._decentralized`) where the all-reduce, 3 s, is six times the
  slowest step: E[i, t] = max(C[i, t], A[t - S]), A[t] = max(max_i E[i, t], A[t - 1]) + 3 s."""
  schedule = simulate(
    "s3gd", learners=2, num_updates=4, seed=0, timing=_SLOW_NETWORK, staleness=staleness, overlap=overlap
  )
  np.testing.assert_allclose(schedule.update_time, ends)


def test_simulate_allreduces_defaults_are_one_local_step_no_outer_loop_one_fragment_no_delay():
  """`simulate_allreduce` called without its last four arguments. S = 1 with overlap, learners at 1 s and 2 s, a
  2.5 s all-reduce (8 bytes at 4 bytes/s plus 2 (M-1) x 0.25 s): 2; 4.5 (A[0] = 4.5); 7 (A[1] = 7). With
  ``outer_loop=True`` and H = 2 (DiLoCo): rounds of 4 s plus the 2.5 s all-reduce: 6.5, 13. A negative delay is
  refused."""
  from stalesgd.schedule._decentralized import simulate_allreduce

  timing = TimingModel(
    compute_time=1.0, jitter="deterministic", speed_factors=(1.0, 2.0), model_bytes=8, bandwidth=4.0, latency=0.25
  )
  common = dict(protocol="s3gd", learners=2, timing=timing, seed=0, staleness=1, overlap=True, options={})
  np.testing.assert_allclose(simulate_allreduce(num_updates=3, **common).update_time, [2.0, 4.5, 7.0])
  rounds = simulate_allreduce(num_updates=2, local_steps=2, outer_loop=True, **common)
  np.testing.assert_allclose(rounds.update_time, [6.5, 13.0])
  with pytest.raises(ValueError, match="0 <= delay <= local_steps"):
    simulate_allreduce(num_updates=2, local_steps=2, outer_loop=True, delay=-1, **common)


def test_a_fragments_ring_all_reduce_at_four_learners():
  """M = 4, 16 bytes at 4 bytes/s (4 s for the model), 0.25 s latency, P = 2: a fragment's all-reduce is
  2 (M-1)/M x 4 s / 2 + 2 (M-1) x 0.25 s = 3 + 1.5 = 4.5 s; with P = 1 it is the timing model's ring all-reduce.
  Steps of 0.25 s, tau = 0. P = 2: fragment 0 syncs at 0.25 s, done at 4.75; step 2 ends at 5.0, fragment 1 done
  at 9.5, the round's end. P = 1: 0.5 s of steps, then the whole model's all-reduce."""
  timing = TimingModel(model_bytes=16, bandwidth=4.0, latency=0.25)
  steps = np.full((2, 4), 0.25)
  np.testing.assert_allclose(_decentralized.outer_round_ends(steps, timing, 2, 2, 0), [9.5])
  np.testing.assert_allclose(_decentralized.outer_round_ends(steps, timing, 2, 1, 0), [0.5 + timing.allreduce_time(4)])
  assert 0.5 + timing.allreduce_time(4) == pytest.approx(0.5 + 6.0 + 1.5)


@pytest.mark.parametrize(
  "local_steps, fragments, delay, model_bytes, step, ends",
  [
    # H = P = 4, tau = 3, 2 s per fragment, 1 s steps: three fragments in flight at once. Fragment k syncs after
    # step k + 1 and is applied after step k + 4; the link sends one all-reduce at a time (1-3, 3-5, 5-7, 7-9,
    # 9-11, ...), so from the second round every application waits: round 2 ends at 11, round 3 at 19.
    (4, 4, 3, 32, 1.0, [4.0, 11.0, 19.0]),
    # H = 10, P = 2, tau = 6, 7 s per fragment: fragment 0 syncs at 5 (5-12) and is applied after step 11,
    # fragment 1 syncs at 10 (the link free at 12: 12-19) and is applied after step 16 (17 -> 19); round 2's
    # fragment 0 runs 19-26 (applied 24 -> 26), fragment 1 26-33: rounds end at 10, 23 and 37.
    (10, 2, 6, 56, 1.0, [10.0, 23.0, 37.0]),
    # H = P = 3, tau = 3, 1 s per fragment, 0.5 s steps: fragment k syncs after step k + 1 and is applied after
    # step k + 4, the link busy back to back (0.5-1.5, 1.5-2.5, 2.5-3.5, 3.5-4.5, ...): round 1 ends at 1.5 with
    # nothing to wait for, round 2's last step waits for fragment 2's 3.5 (round 2's fragment 1, synced just
    # before, must not stand in for it), round 3's steps wait for 4.5, 5.5 and 6.5.
    (3, 3, 3, 12, 0.5, [1.5, 3.5, 6.5]),
  ],
)
def test_fragments_in_flight_together_keep_their_own_all_reduces(
  local_steps, fragments, delay, model_bytes, step, ends
):
  """Two learners at `step` s per step; a fragment's all-reduce is 2 (M-1)/M x model_bytes / (4 bytes/s) / P."""
  timing = TimingModel(model_bytes=model_bytes, bandwidth=4.0)
  steps = np.full((3 * local_steps, 2), step)
  np.testing.assert_allclose(_decentralized.outer_round_ends(steps, timing, local_steps, fragments, delay), ends)


def test_a_delayed_application_is_waited_for_past_the_256th_step():
  """H = 2, P = 1, tau = 1, 1 s steps, a 3 s all-reduce (12 bytes at 4 bytes/s): each round's all-reduce starts
  at its end and is applied after the next round's first step, which waits 2 s: rounds end at 2, 6, 10, ..., 4r - 2
  for all 300 rounds (600 steps: step boundaries past 256, where CPython's small ints end)."""
  timing = TimingModel(model_bytes=12, bandwidth=4.0)
  ends = _decentralized.outer_round_ends(np.ones((600, 2)), timing, 2, 1, 1)
  np.testing.assert_allclose(ends, 4.0 * np.arange(1, 301) - 2.0)


# -- each fragment's all-reduce moves its own bytes (Streaming DiLoCo's fragments of whole layers)


@pytest.mark.parametrize(
  "fragment_bytes, ends",
  [
    # M = 2, 16 model bytes at 4 bytes/s: the ring moves 2 (M-1)/M x 16 = 16 bytes, 4 s for the whole model.
    # H = P = 2, tau = 1, steps of 1 s. Fragment 0 of 4 bytes (1 s), fragment 1 of 12 (3 s): f0 1-2 (applied
    # after step 2, at 2), f1 2-5; step 3 ends at 3, waits for f1 (5); f0 5-6; step 4 ends at 6 (f0 done at 6),
    # f1 6-9; step 5 waits until 9, f0 9-10; step 6 ends at 10, f1 10-13. Rounds end at 2, 6, 10.
    ((4, 12), [2.0, 6.0, 10.0]),
    # reversed, 3 s then 1 s: f0 1-4, step 2 waits until 4, f1 4-5; step 3 at 5, f0 5-8; step 4 at 6 waits until
    # 8, f1 8-9; step 5 at 9, f0 9-12; step 6 at 10 waits until 12. Rounds end at 4, 8, 12.
    ((12, 4), [4.0, 8.0, 12.0]),
    # equal halves, 2 s each (as without fragment_bytes): f0 1-3, step 2 waits until 3, f1 3-5; step 3 at 4 waits
    # until 5, f0 5-7; step 4 at 6 waits until 7, f1 7-9; ... Rounds end at 3, 7, 11.
    ((8, 8), [3.0, 7.0, 11.0]),
    (None, [3.0, 7.0, 11.0]),
  ],
)
def test_each_fragments_all_reduce_is_timed_for_its_own_bytes(fragment_bytes, ends):
  timing = TimingModel(model_bytes=16, bandwidth=4.0)
  steps = np.ones((6, 2))
  np.testing.assert_allclose(_decentralized.outer_round_ends(steps, timing, 2, 2, 1, fragment_bytes), ends)


def test_fragment_bytes_are_shares_of_a_model_bytes_set_otherwise():
  """model_bytes 32 (the timing model's, not the weights' 16): fragments of (4, 12) bytes move 8 and 24."""
  timing = TimingModel(model_bytes=32, bandwidth=4.0)
  steps = np.ones((2, 2))
  # H = P = 2, tau = 0: f0 (2 s) 1-3, step 2 ends 4, f1 (6 s) 4-10
  np.testing.assert_allclose(_decentralized.outer_round_ends(steps, timing, 2, 2, 0, (4, 12)), [10.0])


@pytest.mark.parametrize("delay", [0, 1, 2])
def test_one_fragment_is_timed_as_before_to_the_bit(delay):
  timing = TimingModel(model_bytes=212_008, bandwidth=1e6, latency=1e-4, jitter="lognormal")
  steps = np.random.default_rng(0).uniform(0.005, 0.01, size=(40, 3))
  before = _decentralized.outer_round_ends(steps, timing, 2, 1, delay)
  np.testing.assert_array_equal(_decentralized.outer_round_ends(steps, timing, 2, 1, delay, (212_008,)), before)


@pytest.mark.parametrize(
  "fragment_bytes",
  [(16,), (4, 4, 8), (-1, 17), (0, 0)],
  ids=["too-few", "too-many", "negative", "all-zero"],
)
def test_fragment_bytes_are_one_count_per_fragment_none_negative_not_all_zero(fragment_bytes):
  timing = TimingModel(model_bytes=16, bandwidth=4.0)
  message = f"fragment_bytes={list(fragment_bytes)}; allowed: 2 byte counts (one per fragment), >= 0, not all 0"
  with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
    _decentralized.outer_round_ends(np.ones((2, 2)), timing, 2, 2, 0, fragment_bytes)


def test_a_fragment_of_no_bytes_is_synced_for_its_latency_alone():
  """M = 2, 16 bytes at 4 bytes/s, 1 s latency (a hop each way: 2 s a fragment), H = P = 2, tau = 0, 1 s steps:
  fragment 0 of 0 bytes takes its 2 s of latency (1-3), step 2 ends at 4, fragment 1 of all 16 bytes takes 4 s of
  transfer and 2 s of latency (4-10): the round ends at 10."""
  timing = TimingModel(model_bytes=16, bandwidth=4.0, latency=1.0)
  np.testing.assert_allclose(_decentralized.outer_round_ends(np.ones((2, 2)), timing, 2, 2, 0, (0, 16)), [10.0])
  # Only the shares count: a byte count of 1 in all is as good as the model's 16.
  np.testing.assert_allclose(_decentralized.outer_round_ends(np.ones((2, 2)), timing, 2, 2, 0, (0, 1)), [10.0])


def test_three_fragments_of_unequal_bytes_each_take_their_own_share():
  """M = 2, 24 model bytes at 4 bytes/s (6 s for the whole model), H = P = 3, tau = 0, 1 s steps, fragments of
  4, 8 and 12 bytes (1, 2 and 3 s). Step 1 ends at 1, f0 1-2; step 2 ends at 3, f1 3-5; step 3 ends at 6, f2 6-9:
  round 1 ends at 9. Round 2: f0 10-11, f1 12-14, f2 15-18: it ends at 18. Each fragment's all-reduce is its own
  (fragment p after step p + 1), not its neighbour's."""
  timing = TimingModel(model_bytes=24, bandwidth=4.0)
  ends = _decentralized.outer_round_ends(np.ones((6, 2)), timing, 3, 3, 0, (4, 8, 12))
  np.testing.assert_allclose(ends, [9.0, 18.0])
