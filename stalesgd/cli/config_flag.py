"""``--config``: ml_collections' config-file flag, which also takes a packaged config's name.

`define_config_flag` is ``config_flags.DEFINE_config_file`` (same overrides,
``--config.<field>=value``, same locking) whose value goes through
`stalesgd.configs.resolve` first: ``--config=rudra_cifar10:quick`` loads the
packaged ``stalesgd/configs/rudra_cifar10.py`` from any directory, an existing
file path loads that file, and anything else stops the program at flag parsing
with the list of names (config_flags alone would only fail when the config is
first used).

The free-form option fields (`OPEN_FIELDS`: ``model_options``, ``optimizer_options``) take
keys the config file does not have, so a user's model or optimizer gets its options from the
command line: ``--config.model_options.width=64`` adds ``width`` (its value read as a Python
literal, else kept as a string) before config_flags applies the overrides, which then set it.
"""

from __future__ import annotations

import ast
import sys

from absl import flags
from ml_collections import config_flags

from stalesgd import configs

# Flags defined through `define_config_flag` belong to its caller (e.g. stalesgd.cli.train), as with
# config_flags' own DEFINE functions.
flags.disclaim_key_flags()


OPEN_FIELDS = ("model_options", "optimizer_options")


def _literal(text: str):
  try:
    return ast.literal_eval(text)
  except (ValueError, SyntaxError):
    return text


class NamedConfigParser(flags.ArgumentParser):
  """Resolves ``NAME[:ARG]`` (`stalesgd.configs.resolve`), then parses ``FILE[:ARG]`` with config_flags' parser.

  Wraps the parser `config_flags.DEFINE_config_file` made (its class is not
  part of ml_collections' API), so loading, ``get_config(ARG)`` and locking
  stay config_flags' own; then adds the keys that command-line overrides of
  `OPEN_FIELDS` name and the config lacks.
  """

  def __init__(self, file_parser: flags.ArgumentParser, name: str = "config", sys_argv: list[str] | None = None):
    self.file_parser = file_parser
    self.name = name
    self.sys_argv = sys_argv

  def parse(self, argument):
    config = self.file_parser.parse(configs.resolve(argument))
    for override in self.sys_argv if self.sys_argv is not None else sys.argv:
      for field in OPEN_FIELDS:
        prefix = f"--{self.name}.{field}."
        if not override.startswith(prefix) or "=" not in override:
          continue
        key, _, value = override[len(prefix) :].partition("=")
        options = config[field] if field in config else None
        if options is not None and "." not in key and key not in options:
          with options.unlocked():
            options[key] = _literal(value)
    return config

  def flag_type(self):
    return self.file_parser.flag_type()


def define_config_flag(
  name: str, help_string: str, flag_values: flags.FlagValues = flags.FLAGS, sys_argv: list[str] | None = None
) -> flags.FlagHolder:
  """Defines the locked config flag ``name`` (no default) that takes a config file's path or a packaged name.

  Args:
    name: the flag's name (``"config"``); overrides are ``--<name>.<field>=value``.
    help_string: the flag's help.
    flag_values: where to define it.
    sys_argv: the arguments config_flags scans for overrides (default ``sys.argv``).

  Returns:
    The flag's holder; its ``value`` is the config.
  """
  holder = config_flags.DEFINE_config_file(
    name, None, help_string, flag_values=flag_values, lock_config=True, sys_argv=sys_argv
  )
  flag = flag_values[name]
  flag.parser = NamedConfigParser(flag.parser, name, sys_argv)
  return holder
