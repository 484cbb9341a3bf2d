"""The run config's declaration language: a field is declared once, with its default, kind and one-line doc.

A `Field` names its default (a value, or a function that makes one), its `kind` (what values it takes: `Integer`,
`Real`, `Choice`, `Flag`, `Text`, `Numbers`, `Options`, or `Described` for a field whose values only a check of
several fields can judge) and a line of documentation. A `Section` is a table of fields: the run's own fields are
flat (``config.learning_rate``) and grouped by sections for reading only; a ``nested`` section is a
`ml_collections.ConfigDict` of its own (``config.timing.jitter``). From the tables,

* `section_defaults` builds `stalesgd.training.default_config`;
* `Field.check` is the field's own check (its type and range, with `stalesgd._validation`'s messages:
  ``config.<field>=<value>; allowed: ...``); the checks that relate several fields are written by hand next to
  their section (`stalesgd.training._config_checks`);
* `describe_sections` is the field list of ``stalesgd-train --config_help``.

Numbers are Python's own int and float (``builtin_only``: the config is written as JSON), never a bool.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import ml_collections
from ml_collections import config_dict

from stalesgd import _validation as validation

INT32_MAX = 2**31 - 1  # counts end up in int32 device arrays
INT64_MAX = 2**63 - 1  # seeds (numpy and JAX take up to int64) and byte counts


def _value_of(config: ml_collections.ConfigDict, field: str) -> Any:
  value = config
  for name in field.split("."):
    value = value[name]
  return value


@dataclasses.dataclass(frozen=True)
class Integer:
  """A Python int in ``[low, high]``; ``high`` may name another field (``"local_steps"``), read from the config."""

  low: int
  high: int | str = INT32_MAX
  optional: bool = False  # None allowed (the field's default is then None)

  placeholder_type = int

  def check(self, name: str, value: Any, config: ml_collections.ConfigDict) -> None:
    high, label = (self.high, "") if isinstance(self.high, int) else (_value_of(config, self.high), self.high)
    if isinstance(high, int) and not isinstance(high, bool):
      validation.check_integer(
        name, value, low=self.low, high=high, high_label=label, optional=self.optional, builtin_only=True
      )
    else:  # the bounding field is itself bad: its own check names it
      validation.check_integer(name, value, low=self.low, optional=self.optional, builtin_only=True)

  def allowed(self) -> str:
    high = "" if self.high in (INT32_MAX, INT64_MAX) else f" and <= {self.high}"
    return f"{'None or ' if self.optional else ''}an integer >= {self.low}{high}"


@dataclasses.dataclass(frozen=True)
class Real:
  """A Python int or float within the bounds (NaN never; +inf only with ``allow_inf``)."""

  low: float | None = None
  high: float | None = None
  low_open: bool = False
  high_open: bool = False
  allow_inf: bool = False
  optional: bool = False
  note: str = ""

  placeholder_type = float

  def check(self, name: str, value: Any, config: ml_collections.ConfigDict) -> None:
    del config
    validation.check_real(
      name,
      value,
      low=self.low,
      high=self.high,
      low_open=self.low_open,
      high_open=self.high_open,
      allow_inf=self.allow_inf,
      optional=self.optional,
      builtin_only=True,
      note=self.note,
    )

  def allowed(self) -> str:
    parts = []
    if self.low is not None:
      parts.append(f"{'>' if self.low_open else '>='} {self.low}")
    if self.high is not None:
      parts.append(f"{'<' if self.high_open else '<='} {self.high}")
    bounds = f" {' and '.join(parts)}" if parts else ""
    kind = "a number" if self.allow_inf else "a finite number"
    return f"{'None or ' if self.optional else ''}{kind}{bounds}{' (inf allowed)' if self.allow_inf else ''}"


@dataclasses.dataclass(frozen=True)
class Choice:
  """One of ``choices``, a str (a misspelt one is answered with the nearest)."""

  choices: tuple[str, ...]

  def check(self, name: str, value: Any, config: ml_collections.ConfigDict) -> None:
    del config
    validation.check_choice(name, value, self.choices)

  def allowed(self) -> str:
    return "one of " + ", ".join(self.choices)


@dataclasses.dataclass(frozen=True)
class Flag:
  """True or False (not 0, 1 or numpy's bool)."""

  def check(self, name: str, value: Any, config: ml_collections.ConfigDict) -> None:
    del config
    validation.check_bool(name, value)

  def allowed(self) -> str:
    return "True or False"


@dataclasses.dataclass(frozen=True)
class Text:
  """A str (non-empty with ``nonempty``), or None with ``optional``; ``what`` says which str it is."""

  what: str
  optional: bool = False
  nonempty: bool = False

  placeholder_type = str

  def check(self, name: str, value: Any, config: ml_collections.ConfigDict) -> None:
    del config
    if self.optional and value is None:
      return
    if not isinstance(value, str) or (self.nonempty and not value):
      validation.reject(name, value, self.what)

  def allowed(self) -> str:
    return self.what


@dataclasses.dataclass(frozen=True)
class Numbers:
  """A tuple (or list) of positive numbers (finite with ``finite``); ``what`` says what they count."""

  what: str
  finite: bool = True

  def check(self, name: str, value: Any, config: ml_collections.ConfigDict) -> None:
    del config

    def good(number: Any) -> bool:
      return validation.is_real(number, builtin_only=True) and (not self.finite or math.isfinite(number)) and number > 0

    if not isinstance(value, (tuple, list)) or not all(good(number) for number in value):
      validation.reject(name, value, self.what)

  def allowed(self) -> str:
    return self.what


@dataclasses.dataclass(frozen=True)
class Options:
  """A mapping of keyword-option names (str) to values, passed to the callable another field names."""

  example: str

  def check(self, name: str, value: Any, config: ml_collections.ConfigDict) -> None:
    del config
    if not isinstance(value, (ml_collections.ConfigDict, Mapping)) or not all(isinstance(key, str) for key in value):
      validation.reject(name, value, f"a mapping of option names to values (e.g. {self.example})")

  def allowed(self) -> str:
    return f"a mapping of option names to values, e.g. {self.example}"


@dataclasses.dataclass(frozen=True)
class Described:
  """A field whose values only a check of several fields can judge (e.g. a model's name or import path): no
  check of its own; ``what`` is what the help says it takes."""

  what: str

  def check(self, name: str, value: Any, config: ml_collections.ConfigDict) -> None:
    del name, value, config

  def allowed(self) -> str:
    return self.what


Kind = Integer | Real | Choice | Flag | Text | Numbers | Options | Described


@dataclasses.dataclass(frozen=True)
class Field:
  """One config field: its name within its section, default, kind and doc.

  Attributes:
    name: the field's name in its section (``"jitter"`` in ``timing``; a flat section's fields are top-level).
    default: the value, or a function of no arguments returning it (a fresh mapping, a host-dependent count).
      None for an optional field (stored as a typed placeholder, so the command line can set it).
    kind: the values it takes, and its own check.
    doc: one line: what it does, and its source where a paper fixes it.
    resumable: whether a resumed run may change it (it decides when to log or save, or how to batch or decode,
      never a weight or a metric's value: `stalesgd.training.check_same_run`).
  """

  name: str
  default: Any
  kind: Kind
  doc: str
  resumable: bool = False

  def default_value(self) -> Any:
    value = self.default() if callable(self.default) else self.default
    if value is None:
      return config_dict.placeholder(self.kind.placeholder_type)
    return value


@dataclasses.dataclass(frozen=True)
class Section:
  """A table of fields: flat (top-level fields, grouped for reading) or ``nested`` (``config.<name>.<field>``)."""

  name: str
  doc: str
  fields: tuple[Field, ...]
  nested: bool = False

  def path(self, field: Field) -> str:
    """The field's name in the config: ``"timing.jitter"`` for a nested section, ``"seed"`` for a flat one."""
    return f"{self.name}.{field.name}" if self.nested else field.name

  def defaults(self) -> ml_collections.ConfigDict:
    """The section's fields at their defaults (a nested section's own ConfigDict)."""
    values = ml_collections.ConfigDict()
    for field in self.fields:
      values[field.name] = field.default_value()
    return values

  def check_fields(self, config: ml_collections.ConfigDict) -> None:
    """Every field's own check, in the table's order (the first bad one raises)."""
    for field in self.fields:
      path = self.path(field)
      field.kind.check(f"config.{path}", _value_of(config, path), config)


def section_defaults(sections: Sequence[Section]) -> ml_collections.ConfigDict:
  """A config with every field of ``sections`` at its default, in the tables' order."""
  config = ml_collections.ConfigDict()
  for section in sections:
    if section.nested:
      config[section.name] = section.defaults()
    else:
      for field in section.fields:
        config[field.name] = field.default_value()
  return config


def _shown(value: Any) -> str:
  if isinstance(value, ml_collections.ConfigDict):
    return repr(dict(value.items()))
  return repr(value)


def describe_sections(sections: Sequence[Section], *, defaults: ml_collections.ConfigDict) -> str:
  """Every field, section by section: ``--config.<field>``, its value in ``defaults`` (a config with the
  sections' fields), the values it takes and its doc. The text of ``--config_help``."""
  lines = []
  for section in sections:
    lines.append(f"{section.name}: {section.doc}")
    for field in section.fields:
      path = section.path(field)
      value = _value_of(defaults, path)
      lines.append(f"  --config.{path}={_shown(value)}")
      lines.append(f"      {field.doc}")
      lines.append(f"      allowed: {field.kind.allowed()}")
    lines.append("")
  return "\n".join(lines)


def field_paths(sections: Sequence[Section], *, where: Callable[[Field], bool] = lambda field: True) -> tuple[str, ...]:
  """The config names of the fields of ``sections`` for which ``where`` holds."""
  return tuple(section.path(field) for section in sections for field in section.fields if where(field))
