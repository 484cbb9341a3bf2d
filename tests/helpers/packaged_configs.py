"""The packaged run configs (``stalesgd/configs/*.py`` minus its helper modules), written out once for the tests.

A config added or removed without updating this set fails the packaging and config tests: the set is what a
release ships, not what the code finds.
"""

EXPECTED_CONFIGS = frozenset(
  {
    "demo",
    "rudra_cifar10",
    "zhang_imagenet",
    "dcasgd_cifar10_resnet20",
    "dcasgd_imagenet_resnet50",
    "dcs3gd_cifar10",
    "dcs3gd_cifar10_full",
    "dcs3gd_imagenet_resnet50",
    "zhang_mnist",
    "dcasgd_mnist",
    "async_adam",
    "diloco_digits",
    "liu_toy",
  }
)
