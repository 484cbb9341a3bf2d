"""Every config in stalesgd/configs/: its argument grammar, every variant validates and builds, the papers' settings."""

from __future__ import annotations

import importlib
import pathlib

import jax
import pytest
from absl import flags
from ml_collections import config_flags

from stalesgd import models
from stalesgd import schedule as schedule_lib
from stalesgd.configs.arguments import ConfigArguments, parse_config_argument
from stalesgd.training._config_checks import validate_config
from stalesgd.training._config_readers import protocol_options, timing_model, updates_per_epoch
from stalesgd.training._optimizer import build_optimizer
from stalesgd.training._run_config import DECENTRALIZED_PROTOCOLS
from tests.helpers.packaged_configs import EXPECTED_CONFIGS

CONFIG_DIR = pathlib.Path(__file__).resolve().parents[2] / "stalesgd" / "configs"
NUM_DEVICES = 8
LIU_TOY = "stalesgd.data._gaussian_mixture:liu_toy"  # generated in Python: no download
TRAIN_EXAMPLES = {"cifar10": 50_000, "mnist": 60_000, "digits": 1_497, "imagenet2012": 1_281_167, LIU_TOY: 128_000}
NUM_CLASSES = {"cifar10": 10, "mnist": 10, "digits": 10, "imagenet2012": 1000, LIU_TOY: 4}
IMAGE_SHAPES = {"cifar10": (32, 32, 3), "mnist": (28, 28, 1), "digits": (8, 8, 1), LIU_TOY: (1, 512, 1)}


def _config_modules():
  modules = {}
  for path in sorted(CONFIG_DIR.glob("*.py")):
    module = importlib.import_module(f"stalesgd.configs.{path.stem}")
    if hasattr(module, "get_config"):
      modules[path.stem] = module
  return modules


CONFIG_MODULES = _config_modules()
# demo, async_adam and diloco_digits are quick already and have no quick token; every other file has one.
NO_QUICK = ("demo", "async_adam", "diloco_digits")
RUNS = [
  (name, variant, quick)
  for name, module in CONFIG_MODULES.items()
  for variant in module.VARIANTS
  for quick in ((False,) if name in NO_QUICK else (False, True))
]


def _argument(variant: str, quick: bool) -> str:
  return f"quick,{variant}" if quick else variant


# ----------------------------------------------------------------------------- the argument grammar


@pytest.mark.parametrize(
  "arg, expected",
  [
    (None, ConfigArguments("b", False)),
    ("", ConfigArguments("b", False)),
    ("quick", ConfigArguments("b", True)),
    ("a", ConfigArguments("a", False)),
    ("quick,a", ConfigArguments("a", True)),
    ("a,quick", ConfigArguments("a", True)),
    (" a , quick ", ConfigArguments("a", True)),
  ],
)
def test_parse_config_argument_accepts_quick_and_one_variant_in_any_order(arg, expected):
  assert parse_config_argument(arg, variants=("a", "b"), default="b") == expected


@pytest.mark.parametrize(
  "arg, message",
  [
    ("c", r"unknown token\(s\) \['c'\]"),
    ("quick,quik", r"unknown token\(s\) \['quik'\]"),
    ("a,b", "names 2 variants"),
    ("quick,quick", "repeats a token"),
  ],
)
def test_parse_config_argument_rejects_bad_tokens_naming_them_and_the_allowed_ones(arg, message):
  with pytest.raises(ValueError, match=message) as error:
    parse_config_argument(arg, variants=("a", "b"), default="b")
  assert "'quick' and at most one of ('a', 'b')" in str(error.value)


def test_parse_config_argument_rejects_a_default_that_is_not_a_variant():
  with pytest.raises(ValueError, match="default='c' is not a variant"):
    parse_config_argument(None, variants=("a", "b"), default="c")


# ----------------------------------------------------------------------------- every variant validates


def test_every_expected_config_file_exists_with_variants():
  assert EXPECTED_CONFIGS <= set(CONFIG_MODULES)
  for name, module in CONFIG_MODULES.items():
    assert module.VARIANTS and len(set(module.VARIANTS)) == len(module.VARIANTS), name
  # What each docstring says (the command, the cost, the result): test_config_docstrings.py.


@pytest.mark.parametrize("name, variant, quick", RUNS)
def test_every_variant_validates_on_eight_devices(name, variant, quick):
  config = CONFIG_MODULES[name].get_config(_argument(variant, quick))
  validate_config(config, num_devices=NUM_DEVICES)
  if config.protocol in DECENTRALIZED_PROTOCOLS:
    assert config.learners == NUM_DEVICES
  if quick and config.dataset not in ("imagenet2012", LIU_TOY):
    assert (config.dataset, config.data_source) == ("digits", "embedded")  # runs without any download
  if config.dataset == LIU_TOY:
    assert config.data_source == "python"  # generated, as the notebook does
  if quick and config.dataset == "imagenet2012":
    updates = config.num_epochs * updates_per_epoch(config, TRAIN_EXAMPLES["imagenet2012"])
    assert config.image_size < 100 and round(updates) == 4  # a few small steps only


def test_an_unknown_variant_is_rejected_by_every_file():
  for name, module in CONFIG_MODULES.items():
    with pytest.raises(ValueError, match="nonexistent"):
      module.get_config("nonexistent")


@pytest.mark.parametrize("name", ["demo", "diloco_digits", "async_adam"])
def test_a_config_without_quick_refuses_it_and_never_offers_it(name):
  with pytest.raises(ValueError, match="no 'quick' variant") as refused:
    CONFIG_MODULES[name].get_config("quick")
  assert "'quick' and" not in str(refused.value)


def test_a_misspelt_variant_is_offered_the_nearest_variant_the_config_accepts():
  with pytest.raises(ValueError) as refused:
    CONFIG_MODULES["demo"].get_config("softsnc")
  message = str(refused.value)
  assert "did you mean 'softsync_fixed'?" in message or "did you mean 'softsync_inverse'?" in message
  assert "'quick'" not in message.split("allowed:", 1)[1].replace("no 'quick' variant", "")


# ----------------------------------------------------------------------------- every file builds


def _image_shape(config):
  if config.dataset == "imagenet2012":
    return (config.image_size, config.image_size, 3)
  return IMAGE_SHAPES[config.dataset]


@pytest.mark.slow
@pytest.mark.parametrize(
  "name, quick",
  [(name, quick) for name in CONFIG_MODULES for quick in ((False,) if name in NO_QUICK else (False, True))],
)
def test_default_variant_builds_model_optimizer_and_schedule(name, quick):
  # Shapes only (jax.eval_shape): ResNet-50 and AlexNet are built without allocating their weights.
  config = CONFIG_MODULES[name].get_config("quick" if quick else None)
  model = models.get_model(config.model, num_classes=NUM_CLASSES[config.dataset], **config.model_options)
  variables = jax.eval_shape(lambda: model.init(jax.random.key(config.seed), _image_shape(config)))
  per_epoch = updates_per_epoch(config, TRAIN_EXAMPLES[config.dataset])
  optimizer = build_optimizer(config, model=model, params=variables["params"], updates_per_epoch=per_epoch)
  state = jax.eval_shape(optimizer.init, variables["params"])
  assert jax.tree.leaves(state)
  schedule = schedule_lib.simulate(
    config.protocol,
    learners=config.learners,
    num_updates=4,
    seed=config.seed,
    timing=timing_model(config),
    **protocol_options(config),
  )
  assert schedule.num_updates == 4


def test_config_files_load_through_config_flags_with_overrides():
  argv = ["main", f"--config={CONFIG_DIR / 'rudra_cifar10.py'}:quick,softsync_inverse", "--config.n=30"]
  flag_values = flags.FlagValues()
  config_flags.DEFINE_config_file("config", None, "config file", flag_values=flag_values, sys_argv=argv)
  flag_values(argv)
  config = flag_values.config
  assert (config.protocol, config.n, config.staleness_rule, config.dataset) == ("softsync", 30, "inverse", "digits")


# ----------------------------------------------------------------------------- the papers' settings


def test_rudra_cifar10_is_the_published_solver_and_protocols():
  module = CONFIG_MODULES["rudra_cifar10"]
  baseline = module.get_config("baseline")
  assert (baseline.model, baseline.model_multipliers, baseline.normalization) == (
    "cifar10_full",
    True,
    "per_pixel_mean",
  )
  assert (baseline.learning_rate, baseline.momentum, baseline.weight_decay) == (0.001, 0.9, 0.004)
  assert (tuple(baseline.lr_decay_epochs), baseline.lr_decay_factor, baseline.num_epochs) == (
    (120.0, 130.0),
    0.1,
    140.0,
  )
  assert (baseline.protocol, baseline.learners, baseline.batch_per_learner) == ("hardsync", 1, 128)
  for variant, rule in (
    ("softsync_fixed", "none"),
    ("softsync_inverse", "inverse"),
    ("async_inverse_mean", "inverse_mean"),
  ):
    config = module.get_config(variant)
    assert (config.learners, config.batch_per_learner, config.staleness_rule) == (30, 4, rule)
  products = [
    config.learners * config.batch_per_learner
    for config in (module.get_config(v) for v in module.VARIANTS if v.startswith("mu_lambda_"))
  ]
  assert products == [120, 240, 480, 960, 1920, 3840]


def test_dcasgd_configs_use_table_1_and_2_hyperparameters():
  cifar = CONFIG_MODULES["dcasgd_cifar10_resnet20"]
  config = cifar.get_config("dcasgd_c")
  assert (config.model, config.batch_per_learner, config.learning_rate, config.num_epochs) == (
    "resnet20",
    128,
    0.5,
    160.0,
  )
  assert (tuple(config.lr_decay_epochs), config.augment, config.normalization) == ((80.0, 120.0), False, "per_channel")
  assert (config.protocol, config.delay_compensation, config.dc_lambda) == ("async", "constant", 0.04)
  adaptive = cifar.get_config("dcasgd_a")
  assert (adaptive.delay_compensation, adaptive.dc_lambda, adaptive.dc_decay) == ("adaptive", 2.0, 0.95)
  assert cifar.get_config("ssgd").protocol == "hardsync" and cifar.get_config("sgd").learners == 1
  imagenet = CONFIG_MODULES["dcasgd_imagenet_resnet50"].get_config("dcasgd_a")
  assert (
    imagenet.model,
    imagenet.learners,
    imagenet.batch_per_learner,
    imagenet.learning_rate,
    imagenet.num_epochs,
    imagenet.dc_lambda,
    imagenet.dc_decay,
  ) == ("resnet50", 16, 32, 0.1, 120.0, 2.0, 0.0)


def test_zhang_imagenet_is_lambda_18_mu_16_with_the_mu_256_baseline():
  module = CONFIG_MODULES["zhang_imagenet"]
  softsync = module.get_config("softsync_inverse")
  assert (softsync.model, softsync.learners, softsync.batch_per_learner, softsync.n, softsync.staleness_rule) == (
    "alexnet",
    18,
    16,
    18,
    "inverse",
  )
  baseline = module.get_config("baseline")
  assert (baseline.learners, baseline.batch_per_learner, baseline.num_epochs) == (1, 256, 35.0)


def test_dcs3gd_configs_select_the_three_all_reduce_protocols():
  for name in ("dcs3gd_cifar10", "dcs3gd_imagenet_resnet50"):
    module = CONFIG_MODULES[name]
    configs = {variant: module.get_config(variant) for variant in module.VARIANTS}
    assert {config.protocol for config in configs.values()} == {"dcs3gd", "s3gd", "allreduce_sync"}
    assert configs["dcs3gd"].delay_compensation == "layerwise" and configs["dcs3gd"].dc_lambda == 0.2
    assert configs["s3gd"].delay_compensation == "none"


def test_dcs3gd_cifar10_full_scales_the_rate_and_warms_up_as_goyal_et_al():
  """0.001 at 128 images x 1024/128 = 0.008, reached by a linear warm-up from 0.001 over 5/90 of the 4-epoch run."""
  for variant in CONFIG_MODULES["dcs3gd_cifar10_full"].VARIANTS:
    config = CONFIG_MODULES["dcs3gd_cifar10_full"].get_config(variant)
    assert (config.warmup_learning_rate, config.learning_rate) == (0.001, 0.008)
    assert config.warmup_epochs == pytest.approx(4.0 * 5.0 / 90.0)
    assert (config.model, config.model_multipliers, config.multiplier_set) == ("cifar10_full", True, None)
  quick = CONFIG_MODULES["dcs3gd_cifar10_full"].get_config("quick")
  assert (quick.warmup_epochs, quick.warmup_learning_rate) == (0.0, None)
