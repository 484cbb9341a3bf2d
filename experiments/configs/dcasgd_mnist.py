"""The packaged config `stalesgd.configs.dcasgd_mnist` as a file: ``--config=experiments/configs/dcasgd_mnist.py``.

From a clone's root this path and the name (``--config=dcasgd_mnist[:ARG]``) select the same config; its
variants, command lines and expected results are in `stalesgd/configs/dcasgd_mnist.py`.
"""

from stalesgd.configs.dcasgd_mnist import *  # noqa: F401,F403  (VARIANTS and the file's other constants)
from stalesgd.configs.dcasgd_mnist import get_config  # noqa: F401  (what ml_collections' config_flags calls)
