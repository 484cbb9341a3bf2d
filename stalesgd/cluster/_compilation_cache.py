"""JAX's persistent compilation cache, on by default for the command-line tools.

A run compiles its block step, its initialisation and its evaluation once per
process; a study compiles the same programs for run after run, and a resumed
run compiles them again. With the cache, those programs are read back from disk
instead (how much faster that is: docs/performance.md). A cached executable is the very program a fresh
compilation produces, so results do not change.

The directory, in order: the caller's choice (``--compilation_cache_dir`` of
`stalesgd.cli.train` and `stalesgd.cli.reproduce`), ``$JAX_COMPILATION_CACHE_DIR``,
then ``~/.cache/stalesgd/jax``. An empty string turns the cache off. Machines
with different CPUs should not share one CPU cache directory.
"""

from __future__ import annotations

import os

import jax

ENVIRONMENT_VARIABLE = "JAX_COMPILATION_CACHE_DIR"
DEFAULT_DIRECTORY = os.path.join("~", ".cache", "stalesgd", "jax")
# Programs faster than this to compile are not worth a file (JAX's own default).
MIN_COMPILE_SECONDS = 1.0


def define_flag():
  """``--compilation_cache_dir`` for a command-line tool (`stalesgd.cli.train`, `stalesgd.cli.reproduce`)."""
  from absl import flags

  return flags.DEFINE_string(
    "compilation_cache_dir",
    None,
    "JAX's persistent compilation cache (default: $JAX_COMPILATION_CACHE_DIR, "
    "else ~/.cache/stalesgd/jax); '' turns it off.",
  )


def enable_compilation_cache(directory: str | None = None) -> str | None:
  """Turns the persistent cache on (before the first compilation); returns its directory or None."""
  if directory is None:
    directory = os.environ.get(ENVIRONMENT_VARIABLE, DEFAULT_DIRECTORY)
  if not directory:
    return None
  directory = os.path.expanduser(directory)
  jax.config.update("jax_compilation_cache_dir", directory)
  jax.config.update(
    "jax_persistent_cache_min_compile_time_secs",
    float(os.environ.get("JAX_PERSISTENT_CACHE_MIN_COMPILE_TIME_SECS", MIN_COMPILE_SECONDS)),
  )
  return directory
