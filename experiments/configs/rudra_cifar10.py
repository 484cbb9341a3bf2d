"""The packaged config `stalesgd.configs.rudra_cifar10` as a file:
``--config=experiments/configs/rudra_cifar10.py[:ARG]``.

From a clone's root this path and the name (``--config=rudra_cifar10[:ARG]``) select the same config; its
variants, command lines and expected results are in `stalesgd/configs/rudra_cifar10.py`.
"""

from stalesgd.configs.rudra_cifar10 import *  # noqa: F401,F403  (VARIANTS and the file's other constants)
from stalesgd.configs.rudra_cifar10 import get_config  # noqa: F401  (what ml_collections' config_flags calls)
