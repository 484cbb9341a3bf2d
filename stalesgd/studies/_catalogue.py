"""The papers' reproduction studies, with the numbers the papers report and the claims' margins.

`STUDIES` maps each study's name to its `Study` (`stalesgd.studies._study`), built by one function per study in
``_catalogue_zhang_rudra`` (Zhang et al., Rudra), ``_catalogue_delay_compensation`` (DC-ASGD, DC-S3GD) and
``_catalogue_digits`` (the demo, Adam's step) and ``_catalogue_outer_loops`` (streaming DiLoCo, the delayed
outer step, Liu et al.'s toy). Published numbers
(docs/algorithms.md §6) sit in each variant's ``published`` and end up in ``published_<name>`` columns beside ours
(`stalesgd.reports._tables.table_columns`); these modules are their one place in the code (the config docstrings name
the study instead of repeating them). The margins are fixed here before a study's runs, and never moved after.
"""

from __future__ import annotations

from stalesgd.studies._catalogue_delay_compensation import dcasgd_mnist, dcasgd_table1, dcs3gd_cifar10
from stalesgd.studies._catalogue_digits import async_adam, demo
from stalesgd.studies._catalogue_outer_loops import (
  delayed_outer_step_digits,
  eager_outer_step_digits,
  kale_outer_steps_digits,
  liu_toy_async_local_sgd,
  streaming_diloco_digits,
  streaming_diloco_digits_piloted,
)
from stalesgd.studies._catalogue_zhang_rudra import (
  ZHANG_MNIST_MATCH_MARGIN,
  rudra_mu_lambda,
  zhang_cifar10,
  zhang_mnist,
  zhang_rudra_cifar10_e140,
)

STUDIES = {
  study.name: study
  for study in (
    zhang_cifar10(),
    zhang_rudra_cifar10_e140(),
    zhang_mnist(),
    rudra_mu_lambda(),
    rudra_mu_lambda("zhang_mnist", ZHANG_MNIST_MATCH_MARGIN),
    dcasgd_table1(),
    dcasgd_mnist(),
    dcs3gd_cifar10(),
    demo(),
    async_adam(),
    streaming_diloco_digits(),
    delayed_outer_step_digits(),
    eager_outer_step_digits(),
    kale_outer_steps_digits(),
    streaming_diloco_digits_piloted(),
    liu_toy_async_local_sgd(),
  )
}
