"""Models as `ModelSpec` objects: init, a pure training loss, evaluation, multipliers.

``get_model(name, num_classes=..., **options)`` builds Rudra's ``cifar10_full``,
He et al.'s CIFAR ResNets (``resnet20`` ... ``resnet110``), ImageNet ResNets
(``resnet50``), Caffe's AlexNet, and an MLP and a small CNN for small images; a
``"package.module:factory"`` import path builds a user's model (docs/own_experiment.md),
whose batch-normalised layers use `BatchNorm`.
"""

from __future__ import annotations

from stalesgd.models._batch_norm import BatchNorm
from stalesgd.models._registry import available_models, get_model
from stalesgd.models._spec import ModelSpec

__all__ = ["BatchNorm", "ModelSpec", "available_models", "get_model"]
