"""The packaged config `stalesgd.configs.demo` as a file: ``--config=experiments/configs/demo.py[:ARG]``.

From a clone's root this path and the name (``--config=demo[:ARG]``) select the same config; its
variants, command lines and expected results are in `stalesgd/configs/demo.py`.
"""

from stalesgd.configs.demo import *  # noqa: F401,F403  (VARIANTS and the file's other constants)
from stalesgd.configs.demo import get_config  # noqa: F401  (what ml_collections' config_flags calls)
