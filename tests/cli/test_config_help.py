"""``stalesgd-train --config_help`` lists every config field by section, with its value, allowed values and doc."""

import os
import re
import subprocess
import sys

from stalesgd.training import default_config
from stalesgd.training._run_config import describe_config, flatten_config


def _listed(text: str) -> dict[str, str]:
  """``{"timing.jitter": "'lognormal'", ...}``: each listed ``--config.<field>=<value>`` line."""
  return dict(re.findall(r"^  --config\.([\w.]+)=(.*)$", text, flags=re.MULTILINE))


def test_every_field_of_the_default_config_is_listed_once_with_its_default():
  text = describe_config()
  listed = _listed(text)
  expected = flatten_config(default_config())
  # Written with the free-form option mappings as fields of their own, as the command line names them.
  assert set(listed) == set(expected) | {"model_options", "optimizer_options", "inner.options", "outer.options"}
  assert len(re.findall(r"^  --config\.", text, flags=re.MULTILINE)) == len(listed)
  assert listed["learning_rate"] == "0.05"
  assert listed["outer.learning_rate"] == "0.7"
  assert listed["timing.jitter"] == "'lognormal'"
  assert listed["data_dir"] == "None"


def test_a_field_shows_its_allowed_values_and_doc_under_its_section():
  text = describe_config()
  sections = re.findall(r"^(\S[^:\n]*):", text, flags=re.MULTILINE)
  for section in ("data", "staleness", "delay compensation", "evaluation", "checkpointing", "inner", "outer", "timing"):
    assert section in sections
  protocol = text[text.index("  --config.protocol=") :].splitlines()[:3]
  assert protocol[0] == "  --config.protocol='hardsync'"
  assert "softsync" in protocol[2] and protocol[2].lstrip().startswith("allowed: one of")
  momentum = text[text.index("  --config.momentum=") :].splitlines()[2]
  assert momentum.strip() == "allowed: a finite number >= 0 and < 1"
  delay = text[text.index("  --config.outer.delay=") :].splitlines()[2]
  assert delay.strip() == "allowed: an integer >= 0 and <= local_steps"


def test_the_program_prints_a_named_configs_values_without_a_workdir():
  shown = subprocess.run(
    [sys.executable, "-m", "stalesgd.cli.train", "--config=rudra_cifar10:hardsync", "--config_help"],
    capture_output=True,
    text=True,
    env={**os.environ, "JAX_PLATFORMS": "cpu"},
    timeout=300,
  )
  assert shown.returncode == 0, shown.stderr[-2000:]
  listed = _listed(shown.stdout)
  assert listed["learners"] == "30"  # the config's lambda, not the default 8
  assert listed["dataset"] == "'cifar10'"
