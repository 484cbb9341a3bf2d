"""The config's shape (docs/api.md, *The config's shape*): flat fields, nested sections named ``section.field``.

Overrides (a study variant's, and the study-level flags) and the HParams table
name a nested field with dots, as ``--config.section.field=VALUE`` does; a
field the config does not have is refused naming the nearest one.
"""

from __future__ import annotations

import pytest

from stalesgd.studies import Study, StudySettings, Variant, study_config
from stalesgd.training import default_config
from stalesgd.training._run_config import flatten_config, set_field


def test_a_flat_field_and_a_nested_field_are_set_by_name():
  config = default_config()
  set_field(config, "learners", 3)
  set_field(config, "timing.jitter_sigma", 0.125)
  assert config.learners == 3 and config.timing.jitter_sigma == 0.125


@pytest.mark.parametrize(
  "field, message",
  [
    ("learnrs", r"config.learnrs: no such config field; did you mean config.learners\?"),
    ("timing.jiter", r"config.timing.jiter: no such config field; did you mean config.timing.jitter\?"),
    ("timng.jitter", r"config.timng: no such config field; did you mean config.timing\?"),
    ("learners.size", r"config.learners: no such config field"),  # a flat field is no section
  ],
)
def test_an_unknown_field_is_refused_naming_the_nearest(field, message):
  with pytest.raises(ValueError, match=message):
    set_field(default_config(), field, 1)


def test_flatten_config_names_nested_fields_with_dots():
  flat = flatten_config(default_config())
  assert "timing.jitter" in flat and "learners" in flat and "timing" not in flat


def test_a_study_variant_overrides_a_nested_field_and_its_command_says_so():
  variant = Variant("jittered", "demo", "hardsync", overrides={"timing.jitter_sigma": 0.25})
  study = Study("shape", "a nested override", "a field of a section is set by name", (variant,))
  config = study_config(study, variant, StudySettings())
  assert config.timing.jitter_sigma == 0.25
  assert "--config.timing.jitter_sigma=0.25" in variant.command(quick=False)
