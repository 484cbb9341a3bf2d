"""The study grids of stalesgd/studies/_catalogue*.py: well-formed, buildable in every mode, the papers' numbers."""

from __future__ import annotations

import dataclasses
import shlex

import pytest
from absl import flags

from stalesgd.cli import config_flag
from stalesgd.studies import STUDIES, Claim, Study, StudySettings, Variant, study_config
from stalesgd.studies._study import load_config_module, slug_of
from stalesgd.studies._study_runs import compress_schedule, study_run
from stalesgd.training._config_checks import validate_config
from stalesgd.training._config_readers import is_decentralized
from stalesgd.training._run_config import default_config

NUM_DEVICES = 8
RESULT_FIELDS = {"test_error", "test_accuracy", "sim_time"}
MODES = {
  "paper": {},
  "quick": {"quick": True},
  "npz": {"data_source": "npz", "data_dir": "/data/cifar10_npz"},
  "npz_quick": {"quick": True, "data_source": "npz", "data_dir": "/data/cifar10_npz"},
}


def test_the_studies_exist():
  assert set(STUDIES) == {
    "zhang_cifar10",
    "zhang_cifar10_e140",
    "zhang_mnist",
    "rudra_mu_lambda",
    "rudra_mu_lambda_mnist",
    "dcasgd_table1",
    "dcasgd_mnist",
    "dcs3gd_cifar10",
    "streaming_diloco_digits",
    "delayed_outer_step_digits",
    "eager_outer_step_digits",
    "liu_toy_async_local_sgd",
    "kale_outer_steps_digits",
    "streaming_diloco_digits_piloted",
    "demo",
    "async_adam",
  }


@pytest.mark.parametrize("name", sorted(STUDIES))
def test_every_variant_names_a_real_config_variant_fields_and_published_results(name):
  fields = set(default_config().keys())
  for variant in STUDIES[name].variants:
    module = load_config_module(variant.config_file)
    assert variant.config_variant in module.VARIANTS, variant.label
    assert set(variant.overrides) <= fields, variant.label
    assert set(variant.published) <= RESULT_FIELDS, variant.label


@pytest.mark.parametrize(
  "name, mode",
  [
    (name, mode) for name in sorted(STUDIES) for mode in MODES if STUDIES[name].paper_data or not mode.startswith("npz")
  ],
)
def test_every_run_of_every_study_validates_in_every_mode(name, mode):
  study = STUDIES[name]
  for variant in study.variants:
    config = study_config(study, variant, StudySettings(**MODES[mode]))
    # A decentralized run gets one host device per learner (stalesgd.training._device_layout).
    validate_config(config, num_devices=config.learners if is_decentralized(config) else NUM_DEVICES)
    for field, value in variant.overrides.items():
      assert config[field] == value
    if mode == "quick" and study.paper_data:
      assert config.dataset == "digits"
    if mode.startswith("npz"):
      paper_dataset = study_config(study, variant).dataset
      assert (config.data_source, config.data_dir, config.dataset) == ("npz", "/data/cifar10_npz", paper_dataset)
    if mode == "npz_quick":
      assert config.num_epochs == study.short_epochs


def test_num_epochs_overrides_every_mode_and_keeps_a_learning_curve():
  study = STUDIES["zhang_cifar10"]
  for mode in MODES.values():
    config = study_config(study, study.variants[3], StudySettings(num_epochs=0.25, **mode))
    assert config.num_epochs == 0.25 and config.eval_every_epochs == 0.0625
  short = study_config(study, study.variants[3], StudySettings(**MODES["npz_quick"]))
  assert short.eval_every_epochs == study.short_epochs / 4
  assert study_config(study, study.variants[3]).eval_every_epochs == 5.0  # the paper's runs: unchanged


def test_a_data_source_is_refused_for_the_embedded_only_demo():
  study = STUDIES["demo"]
  with pytest.raises(ValueError, match="runs on the embedded data only"):
    study_config(study, study.variants[0], StudySettings(data_source="npz", data_dir="/somewhere"))


def test_zhang_grid_is_the_baseline_hardsync_and_the_three_rates():
  study = STUDIES["zhang_cifar10"]
  configs = [study_config(study, variant) for variant in study.variants]
  baseline, hardsync, softsync = configs[0], configs[1], configs[2:]
  assert (baseline.protocol, baseline.learners, baseline.batch_per_learner) == ("hardsync", 1, 128)
  assert hardsync.protocol == "hardsync"
  rates = [(config.staleness_rule, config.n) for config in softsync]
  assert rates == (
    [("none", n) for n in (1, 2, 4, 10, 15, 30)]
    + [("inverse", n) for n in (1, 2, 4, 10, 15, 30)]
    + [("inverse_mean", 30)]
  )
  assert all((config.learners, config.batch_per_learner) == (30, 4) for config in configs[1:])
  assert study.select(["30_softsync_a0_mean_sigma", "hardsync"]) == (study.variants[1], study.variants[-1])
  with pytest.raises(ValueError, match=r"\['30_softsync'\] not in study 'zhang_cifar10'; allowed: .*'hardsync'"):
    study.select(["30_softsync"])
  diverging = [variant.label for variant in study.variants if variant.published.get("test_error") == 90.0]
  assert diverging == ["15-softsync, a0", "30-softsync, a0"]


def test_rudra_mu_lambda_grid_grows_mu_lambda_at_fixed_alpha():
  study = STUDIES["rudra_mu_lambda"]
  configs = [study_config(study, variant) for variant in study.variants]
  products = [config.learners * config.batch_per_learner for config in configs]
  assert products == [128, 120, 240, 480, 960, 1920, 3840]
  assert {config.learning_rate for config in configs} == {0.001}
  assert {config.staleness_rule for config in configs} == {"none"}


def test_dcasgd_table1_carries_the_published_numbers():
  published = {variant.label: variant.published.get("test_error") for variant in STUDIES["dcasgd_table1"].variants}
  assert published == {
    "SGD, M=1": 8.65,
    "ASGD, M=4": 9.27,
    "SSGD, M=4": 9.17,
    "DC-ASGD-c, M=4": 8.67,
    "DC-ASGD-a, M=4": 8.19,
    "ASGD, M=8": 10.26,
    "SSGD, M=8": 10.10,
    "DC-ASGD-c, M=8": 9.27,
    "DC-ASGD-a, M=8": 8.57,
    # The ablation the paper does not have: no published number.
    "DC-ASGD-a bias-corrected, M=4": None,
    "DC-ASGD-a bias-corrected, M=8": None,
  }
  configs = {
    variant.label: study_config(STUDIES["dcasgd_table1"], variant) for variant in STUDIES["dcasgd_table1"].variants
  }
  assert configs["DC-ASGD-a, M=8"].learners == 8 and configs["DC-ASGD-a, M=8"].delay_compensation == "adaptive"
  assert configs["SSGD, M=4"].protocol == "hardsync" and configs["SGD, M=1"].learners == 1
  for learners in (4, 8):
    corrected, paper = configs[f"DC-ASGD-a bias-corrected, M={learners}"], configs[f"DC-ASGD-a, M={learners}"]
    assert corrected.dc_mean_square_bias_correction and not paper.dc_mean_square_bias_correction
    assert corrected.learners == learners
    # Otherwise the paper's DC-ASGD-a run.
    assert {**corrected.to_dict(), "dc_mean_square_bias_correction": False} == paper.to_dict()


def test_dcasgd_table1_appends_the_ablation_after_the_papers_runs():
  """The paper's 9 runs keep their directories (a sweep of them resumes) and the ablation comes last."""
  slugs = [variant.slug for variant in STUDIES["dcasgd_table1"].variants]
  assert slugs == [
    "sgd_m_1",
    "asgd_m_4",
    "ssgd_m_4",
    "dc_asgd_c_m_4",
    "dc_asgd_a_m_4",
    "asgd_m_8",
    "ssgd_m_8",
    "dc_asgd_c_m_8",
    "dc_asgd_a_m_8",
    "dc_asgd_a_bias_corrected_m_4",
    "dc_asgd_a_bias_corrected_m_8",
  ]


def _config_of_command(command: str):
  """The config ``command`` builds, parsed the way stalesgd.cli.train parses it (the config by name)."""
  words = shlex.split(command)
  assert words[:3] == ["python", "-m", "stalesgd.cli.train"]
  argv = ["main"] + words[3:]
  flag_values = flags.FlagValues()
  config_flag.define_config_flag("config", "config", flag_values=flag_values, sys_argv=argv)
  flag_values(argv)
  return flag_values.config


def test_variant_command_parsed_by_config_flags_gives_the_study_config():
  # The printed command, parsed the way stalesgd.cli.train parses it, gives the same config.
  study = STUDIES["zhang_cifar10"]
  variant = study.variants[5]
  command = variant.command(quick=True, extra={"data_dir": "/tmp/x", "lr_decay_epochs": (3.0,)})
  expected = study_config(study, variant, StudySettings(quick=True))
  expected.data_dir, expected.lr_decay_epochs = "/tmp/x", (3.0,)
  assert _config_of_command(command).to_dict() == expected.to_dict()


@pytest.mark.parametrize("mode", sorted(MODES))
@pytest.mark.parametrize("num_epochs", [None, 0.3])
def test_study_run_command_rebuilds_its_config_in_every_mode(mode, num_epochs):
  # Shortened runs included: their evaluation interval is part of the command too, so the
  # printed command can be rerun in the run's directory (which refuses another config).
  study = STUDIES["dcasgd_table1"]
  for variant in (*study.variants[:2], study.variants[-1]):
    config, command = study_run(study, variant, StudySettings(num_epochs=num_epochs, **MODES[mode]))
    assert _config_of_command(command).to_dict() == config.to_dict(), command


def test_study_rejects_duplicate_labels_and_foreign_variants():
  variant = Variant("a", "demo", "hardsync")
  with pytest.raises(ValueError, match="unique"):
    Study("s", "t", "f", (variant, Variant("a", "demo", "async_dc")))
  with pytest.raises(ValueError, match="unique"):
    Study("s", "t", "f", (variant, Variant("A", "demo", "async_dc")))  # same directory name
  with pytest.raises(ValueError, match="is not part of study"):
    study_config(Study("s", "t", "f", (variant,)), Variant("b", "demo", "hardsync"))


def test_variant_slug_is_a_safe_directory_name():
  assert Variant("15-softsync, a0/sigma", "demo", "hardsync").slug == "15_softsync_a0_sigma"
  assert Variant("1-softsync, mu*lambda=120 (mu=4)", "demo", "hardsync").slug == "1_softsync_mu_lambda_120_mu_4"


def test_schedule_compression_moves_the_warmup_with_the_decays():
  """DC-S3GD's config: 4 epochs, warm-up 5/90 of them (0.2222), decays at 120/140 and 130/140 of the run. At E = 10:
  warm-up 10 x 5/90 = 0.5556 epochs, decays at 8.571 and 9.286; 0.001 -> 0.008 over the warm-up, as configured."""
  study = STUDIES["dcs3gd_cifar10"]
  variant = next(variant for variant in study.variants if variant.slug == "dc_s3gd_layer_wise_s_4")
  config, command = study_run(study, variant, StudySettings(schedule_epochs=10.0))
  assert config.warmup_epochs == pytest.approx(10.0 * 5.0 / 90.0)
  assert config.lr_decay_epochs == pytest.approx((10.0 * 120.0 / 140.0, 10.0 * 130.0 / 140.0))
  assert (config.warmup_learning_rate, config.learning_rate) == (0.001, 0.008)
  assert _config_of_command(command).to_dict() == config.to_dict()
  # Without a warm-up the compressed fields are the two of before (recorded commands stay as they were).
  assert set(compress_schedule(study_config(STUDIES["zhang_cifar10"], STUDIES["zhang_cifar10"].variants[1]), 20.0)) == {
    "num_epochs",
    "lr_decay_epochs",
  }


def test_schedule_compression_moves_the_decays_to_the_same_fractions():
  # Zhang et al.: 140 epochs, x0.1 at 120 and 130. At 20 epochs: 120 * 20 / 140 and 130 * 20 / 140.
  study = STUDIES["zhang_cifar10"]
  hardsync = study.variants[1]
  config, command = study_run(study, hardsync, StudySettings(schedule_epochs=20.0, eval_every_epochs=1.0))
  assert config.num_epochs == 20.0 and config.eval_every_epochs == 1.0
  assert config.lr_decay_epochs == (120.0 * 20.0 / 140.0, 130.0 * 20.0 / 140.0)
  assert config.lr_decay_epochs == pytest.approx((17.142857, 18.571429))
  assert _config_of_command(command).to_dict() == config.to_dict()
  assert compress_schedule(study_config(study, hardsync), 70.0) == {"num_epochs": 70.0, "lr_decay_epochs": (60.0, 65.0)}
  # --epochs keeps its meaning: the decay epochs stay where the config puts them.
  assert study_config(study, hardsync, StudySettings(num_epochs=20.0)).lr_decay_epochs == (120.0, 130.0)
  with pytest.raises(ValueError, match="num_epochs=20.0 and schedule_epochs=20.0 given together"):
    StudySettings(num_epochs=20.0, schedule_epochs=20.0)
  with pytest.raises(ValueError, match=r"eval_every_epochs=0; allowed: a number of epochs > 0"):
    StudySettings(eval_every_epochs=0)


def test_a_seed_sets_config_seed_and_is_part_of_the_command():
  study = STUDIES["demo"]
  variant = study.variants[0]
  assert study_config(study, variant, seed=0).seed == 0
  config, command = study_run(study, variant, seed=3)
  assert config.seed == 3 and "--config.seed=3" in command
  assert _config_of_command(command).to_dict() == config.to_dict()
  assert "--config.seed" not in study_run(study, variant, seed=0)[1]  # the config's own seed


def test_claims_decide_by_their_interval():
  matches = Claim("a matches b", "a", "b", "matches", 2.0)
  assert matches.decide(-1.5, 1.9) == "holds"
  assert matches.decide(2.0, 5.0) == "does not hold"
  assert matches.decide(-6.0, -2.0) == "does not hold"
  assert matches.decide(-1.0, 2.5) == "not decided (the interval crosses the margin)"
  assert matches.decide(None, None).startswith("not decided (1 seed")
  worse = Claim("a fails", "a", "b", "worse", 30.0)
  assert worse.decide(30.5, 80.0) == "holds"
  assert worse.decide(1.0, 29.0) == "does not hold"
  assert worse.decide(20.0, 40.0).startswith("not decided")
  assert "lies inside ±2 points" in matches.rule(3) and "last 3 evaluations" in matches.rule(3)
  with pytest.raises(ValueError, match="kind='better'; allowed"):
    Claim("x", "a", "b", "better", 1.0)
  with pytest.raises(ValueError, match="claim 'x' names 'c'"):
    Study(
      "s",
      "t",
      "f",
      (Variant("a", "demo", "hardsync"), Variant("b", "demo", "async_dc")),
      claims=(Claim("x", "a", "c", "matches", 1.0),),
    )


def test_claims_decide_on_the_margins_edges():
  """The margins are strict both ways: an interval touching +-margin from inside is not inside, one reaching it
  from outside lies wholly outside (margin 1 point)."""
  matches = Claim("a matches b", "a", "b", "matches", 1.0)
  assert matches.decide(-1.0, 0.5) == "not decided (the interval crosses the margin)"
  assert matches.decide(-0.5, 1.0) == "not decided (the interval crosses the margin)"
  assert matches.decide(1.0, 3.0) == "does not hold" and matches.decide(1.5, 3.0) == "does not hold"
  assert matches.decide(-3.0, -1.0) == "does not hold" and matches.decide(-4.0, -1.5) == "does not hold"
  assert matches.decide(None, 2.0) == matches.decide(-2.0, None) == "not decided (1 seed: no interval)"
  assert matches.decide(-2.0, 0.5) == "not decided (the interval crosses the margin)"
  worse = Claim("a fails", "a", "b", "worse", 1.0)
  assert worse.decide(1.0, 3.0) == "not decided (the interval crosses the margin)"
  assert worse.decide(-2.0, 1.0) == "not decided (the interval crosses the margin)"
  assert worse.decide(-2.0, 0.99) == "does not hold"


def test_a_claims_kind_and_margin_are_checked_by_value():
  """A kind built at run time (equal to the literal, another object) decides and reads as the literal does; a
  margin must be > 0."""
  kind = "".join(["mat", "ches"])
  assert kind == "matches" and id(kind) != id("matches")  # equal, another object
  built = Claim("a matches b", "a", "b", kind, 1.0)
  assert built.decide(-0.5, 0.5) == "holds" and "lies inside ±1 points" in built.rule(3)
  worse = Claim("a fails", "a", "b", "worse", 1.0)
  assert "lies above +1 points" in worse.rule(3) and worse.decide(2.0, 3.0) == "holds"
  for margin in (0.0, -1.0):
    with pytest.raises(ValueError, match=rf"margin={margin!r}; allowed: a number of test-error points > 0"):
      Claim("x", "a", "b", "matches", margin)


def test_variants_claims_and_studies_are_frozen():
  variant = Variant("a", "demo", "hardsync")
  claim = Claim("x", "a", "a", "matches", 1.0)
  study = Study("s", "t", "f", (variant,))
  for value, field in ((variant, "label"), (claim, "margin"), (study, "name")):
    with pytest.raises(dataclasses.FrozenInstanceError):
      setattr(value, field, None)


def test_a_study_needs_variants_with_unique_labels_and_its_defaults_are_one_quick_epoch_and_three_evaluations():
  with pytest.raises(ValueError, match=r"study 's': variant labels \[\] must be non-empty and unique"):
    Study("s", "t", "f", ())
  with pytest.raises(ValueError, match="must be non-empty and unique"):
    Study("s", "t", "f", (Variant("a", "demo", "hardsync"), Variant("A", "demo", "hardsync")))  # one slug
  many = tuple(Variant(f"v{index}", "demo", "hardsync") for index in range(300))  # counts past CPython's small ints
  assert len(Study("s", "t", "f", many).variants) == 300
  one = Study("s", "t", "f", many[:1])
  assert one.short_epochs == 1.0 and one.last_evaluations == 3


def test_a_variants_command_options_are_keyword_only():
  with pytest.raises(TypeError):
    Variant("a", "demo", "hardsync").command(True)


def test_slugs_keep_letters_digits_and_dots():
  assert slug_of("15-softsync, alpha0/sigma (x0.5)") == "15_softsync_alpha0_sigma_x0.5"


@pytest.mark.parametrize("value, word", [((), "'()'"), ((4,), "'(4,)'"), ((1.0, 2.0), "'(1.0,2.0)'"), (0.5, "0.5")])
def test_a_tuple_override_is_one_shell_word_in_the_parenthesised_form(value, word):
  command = Variant("a", "demo", "hardsync", {"timing.speed_factors": value}).command(quick=False)
  assert command.endswith(f" --config.timing.speed_factors={word}")


@pytest.mark.parametrize("name", sorted(STUDIES))
def test_every_finding_states_the_published_claim(name):
  # The finding names the paper's claim (its authors), never a table of ours.
  study = STUDIES[name]
  authors = ("Zhang", "Rudra", "Zheng", "Rigazzi", "Douillard", "Kale", "Liu", "demo")
  assert any(author in study.finding for author in authors), study.finding


@pytest.mark.parametrize("name", sorted(STUDIES))
def test_every_study_decides_at_least_one_claim_between_its_own_variants(name):
  study = STUDIES[name]
  slugs = {variant.slug for variant in study.variants}
  assert study.claims
  for claim in study.claims:
    assert {claim.variant, claim.reference} <= slugs and claim.variant != claim.reference
