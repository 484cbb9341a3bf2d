"""The packaged config `stalesgd.configs.dcasgd_cifar10_resnet20` as a file:
``--config=experiments/configs/dcasgd_cifar10_resnet20.py[:ARG]``.

From a clone's root this path and the name (``--config=dcasgd_cifar10_resnet20[:ARG]``) select the same config; its
variants, command lines and expected results are in `stalesgd/configs/dcasgd_cifar10_resnet20.py`.
"""

from stalesgd.configs.dcasgd_cifar10_resnet20 import *  # noqa: F401,F403  (VARIANTS and the file's other constants)
from stalesgd.configs.dcasgd_cifar10_resnet20 import get_config  # noqa: F401  (what ml_collections' config_flags calls)
