"""The packaged config `stalesgd.configs.async_adam` as a file: ``--config=experiments/configs/async_adam.py[:ARG]``.

From a clone's root this path and the name (``--config=async_adam[:ARG]``) select the same config; its
variants, command lines and expected results are in `stalesgd/configs/async_adam.py`.
"""

from stalesgd.configs.async_adam import *  # noqa: F401,F403  (VARIANTS and the file's other constants)
from stalesgd.configs.async_adam import get_config  # noqa: F401  (what ml_collections' config_flags calls)
