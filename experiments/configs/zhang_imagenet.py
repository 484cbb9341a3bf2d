"""The packaged config `stalesgd.configs.zhang_imagenet` as a file:
``--config=experiments/configs/zhang_imagenet.py[:ARG]``.

From a clone's root this path and the name (``--config=zhang_imagenet[:ARG]``) select the same config; its
variants, command lines and expected results are in `stalesgd/configs/zhang_imagenet.py`.
"""

from stalesgd.configs.zhang_imagenet import *  # noqa: F401,F403  (VARIANTS and the file's other constants)
from stalesgd.configs.zhang_imagenet import get_config  # noqa: F401  (what ml_collections' config_flags calls)
