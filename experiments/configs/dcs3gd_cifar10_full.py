"""The packaged config `stalesgd.configs.dcs3gd_cifar10_full` as a file:
``--config=experiments/configs/dcs3gd_cifar10_full.py[:ARG]``.

From a clone's root this path and the name (``--config=dcs3gd_cifar10_full[:ARG]``) select the same config; its
variants, command lines and expected results are in `stalesgd/configs/dcs3gd_cifar10_full.py`.
"""

from stalesgd.configs.dcs3gd_cifar10_full import *  # noqa: F401,F403  (VARIANTS and the file's other constants)
from stalesgd.configs.dcs3gd_cifar10_full import get_config  # noqa: F401  (what ml_collections' config_flags calls)
