"""The optional parts of the install: which packages the training stack needs, and the error when one is missing.

``pip install stalesgd`` is the core (jax, optax, numpy: the transforms, the
timing model, the engine, DC-S3GD); ``pip install 'stalesgd[train]'`` adds the
training stack that the programs need. Standard library only, so any layer may
import it.
"""

from __future__ import annotations

import importlib.util

TRAINING_STACK_MODULES = (
  "absl",
  "ml_collections",
  "flax",
  "orbax.checkpoint",
  "etils.epath",
  "tensorflow_datasets",
  "tensorboardX",
  "matplotlib",
  "sklearn",
  "PIL",
  "scipy",
)
"""What the training stack imports beyond the core: the ``train`` extra of pyproject.toml."""

TRAIN_EXTRA_INSTALL = "pip install 'stalesgd[train]'"


def _importable(name: str) -> bool:
  try:
    return importlib.util.find_spec(name) is not None
  except ImportError:  # its parent package is missing, or a finder refuses the name
    return False


def missing_training_stack() -> list[str]:
  """The packages of `TRAINING_STACK_MODULES` that cannot be imported here."""
  return [name for name in TRAINING_STACK_MODULES if not _importable(name)]


def require_training_stack(program: str) -> None:
  """Exits naming the extra to install when a package of the training stack is missing.

  The programs call it before they import anything of the training stack, so a
  core-only install gets one line that says what to do, not an ImportError from
  deep inside.

  Raises:
    SystemExit: naming the missing packages and the install command.
  """
  missing = missing_training_stack()
  if missing:
    verb = "is" if len(missing) == 1 else "are"
    raise SystemExit(
      f"{program} needs stalesgd's training stack, and {', '.join(missing)} {verb} not installed: "
      f"{TRAIN_EXTRA_INSTALL} (the core alone, pip install stalesgd, has the transforms, the timing model, the "
      "engine and DC-S3GD)"
    )
