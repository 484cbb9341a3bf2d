"""The packaged config `stalesgd.configs.dcs3gd_imagenet_resnet50` as a file:
``--config=experiments/configs/dcs3gd_imagenet_resnet50.py[:ARG]``.

From a clone's root this path and the name (``--config=dcs3gd_imagenet_resnet50[:ARG]``) select the same config; its
variants, command lines and expected results are in `stalesgd/configs/dcs3gd_imagenet_resnet50.py`.
"""

from stalesgd.configs.dcs3gd_imagenet_resnet50 import *  # noqa: F401,F403  (VARIANTS and the file's other constants)
from stalesgd.configs.dcs3gd_imagenet_resnet50 import (
  get_config,  # noqa: F401  (what ml_collections' config_flags calls)
)
