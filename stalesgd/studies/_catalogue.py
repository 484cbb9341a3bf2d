"""The papers' reproduction studies, with the numbers the papers report and the claims' margins.

Each function builds one `Study` (`stalesgd.studies._study`); `STUDIES` maps its name to it. Published numbers
(docs/algorithms.md §6) sit in each variant's ``published`` and end up in ``published_<name>`` columns beside ours
(`stalesgd.utils._plots.table_columns`); this module is their one place in the code (the config docstrings name
the study instead of repeating them). The margins are fixed here before a study's runs, and never moved after.
"""

from __future__ import annotations

import dataclasses

from stalesgd.studies._study import Claim, Study, Variant, load_config_module, slug_of

ZHANG_N = (1, 2, 4, 10, 15, 30)
ZHANG_DIVERGED_ERROR = 90.0  # Zhang et al.: n = 15 and 30 with the fixed rate "do not converge (90% error)".
RUDRA_TEST_ERROR = 18.0
DCASGD_LEARNERS = (4, 8)
# Zheng et al. (arXiv 1609.08326) Table 1: CIFAR-10 ResNet-20 test error (%), by method and M.
DCASGD_TABLE1 = {
  ("sgd", 1): 8.65,
  ("asgd", 4): 9.27,
  ("ssgd", 4): 9.17,
  ("dcasgd_c", 4): 8.67,
  ("dcasgd_a", 4): 8.19,
  ("asgd", 8): 10.26,
  ("ssgd", 8): 10.10,
  ("dcasgd_c", 8): 9.27,
  ("dcasgd_a", 8): 8.57,
}
DCASGD_METHOD_NAMES = {
  "sgd": "SGD",
  "asgd": "ASGD",
  "ssgd": "SSGD",
  "dcasgd_c": "DC-ASGD-c",
  "dcasgd_a": "DC-ASGD-a",
  "dcasgd_a_bc": "DC-ASGD-a bias-corrected",
}


# The margins of the claims (test-error points), fixed before the runs: "matches" is Zhang et al.'s "virtually
# indistinguishable" from hardsync; "fails" is worse by more than a third of the way to chance.
ZHANG_CIFAR10_MATCH_MARGIN = 2.0
ZHANG_MNIST_MATCH_MARGIN = 0.5
ZHANG_FAILURE_MARGIN = 30.0
RUDRA_MATCH_MARGIN = 2.0  # test-error points: "matches the baseline"; "worse": by more than this
DCASGD_ORDER_MARGIN = 0.25  # test-error points: the published gaps of the ordering are 0.48-0.99


def zhang_claims(match_margin: float, *, fixed_rate: bool = True) -> tuple[Claim, ...]:
  """Zhang et al.'s claims at n = 15 and 30 against hardsync (lambda = 30): alpha_0/sigma matches, fixed fails."""
  claims = [
    Claim(
      f"{n}-softsync with alpha_0/sigma matches hardsync (Zhang et al.: 'virtually indistinguishable')",
      f"{n}_softsync_a0_sigma",
      "hardsync",
      "matches",
      match_margin,
    )
    for n in (15, 30)
  ]
  if fixed_rate:
    claims += [
      Claim(
        f"{n}-softsync with the fixed alpha_0 fails (Zhang et al.: does not converge, 90 % error)",
        f"{n}_softsync_a0",
        "hardsync",
        "worse",
        ZHANG_FAILURE_MARGIN,
      )
      for n in (15, 30)
    ]
  return tuple(claims)


def zhang_cifar10() -> Study:
  """Zhang et al. (arXiv 1511.05950) Fig. 3-4: n-softsync at lambda = 30, mu = 4, fixed alpha_0 vs alpha_0/sigma."""
  variants = [
    Variant("baseline (lambda=1, mu=128)", "rudra_cifar10", "baseline", published={"test_error": RUDRA_TEST_ERROR}),
    Variant("hardsync", "rudra_cifar10", "hardsync", published={"test_error": RUDRA_TEST_ERROR}),
  ]
  for rule, rule_label in (("fixed", "a0"), ("inverse", "a0/sigma")):
    for n in ZHANG_N:
      published = (
        {"test_error": RUDRA_TEST_ERROR}
        if rule == "inverse"
        else ({"test_error": ZHANG_DIVERGED_ERROR} if n >= 15 else {})
      )
      variants.append(
        Variant(
          f"{n}-softsync, {rule_label}", "rudra_cifar10", f"softsync_{rule}", overrides={"n": n}, published=published
        )
      )
  # Rudra's protocol-level rate at the largest n (the reconstructed alpha_0/<sigma>, <sigma> tracked).
  variants.append(
    Variant(
      f"{ZHANG_N[-1]}-softsync, a0/mean(sigma)",
      "rudra_cifar10",
      "softsync_inverse_mean",
      overrides={"n": ZHANG_N[-1]},
      published={"test_error": RUDRA_TEST_ERROR},
    )
  )
  return Study(
    name="zhang_cifar10",
    title="Zhang et al.: n-softsync, lambda=30, mu=4",
    finding="Zhang et al. (CIFAR-10, 140 epochs): the fixed alpha_0 degrades as n grows and does not converge "
    "at n = 15, 30 (90 % error); with alpha_0/sigma every n reaches hardsync's ~18 % error",
    variants=tuple(variants),
    short_epochs=1.0,
    claims=zhang_claims(ZHANG_CIFAR10_MATCH_MARGIN),
  )


def zhang_mnist() -> Study:
  """Zhang et al.'s grid on MNIST with a small CNN (`stalesgd.configs.zhang_mnist`), for several seeds."""
  variants = [Variant("hardsync", "zhang_mnist", "hardsync")]
  for rule, rule_label in (("fixed", "a0"), ("inverse", "a0/sigma")):
    for n in (15, 30):
      variants.append(Variant(f"{n}-softsync, {rule_label}", "zhang_mnist", f"softsync_{rule}", overrides={"n": n}))
  return Study(
    name="zhang_mnist",
    title="Zhang et al.'s grid on MNIST: lambda=30, mu=4, small CNN",
    finding="Zhang et al. (on CIFAR-10): with the fixed alpha_0, n-softsync does not converge at n = 15, 30; "
    "with alpha_0/sigma it is virtually indistinguishable from hardsync",
    variants=tuple(variants),
    short_epochs=1.0,
    claims=zhang_claims(ZHANG_MNIST_MATCH_MARGIN),
  )


def rudra_mu_lambda(config_file: str = "rudra_cifar10", margin: float = RUDRA_MATCH_MARGIN) -> Study:
  """Rudra (arXiv 1509.04210): at a fixed alpha_0 and fixed epochs, larger mu * lambda is worse.

  ``config_file`` ``"zhang_mnist"`` with ``margin`` `ZHANG_MNIST_MATCH_MARGIN` is the study
  ``rudra_mu_lambda_mnist``: the same grid and claims on MNIST, where 3 seeds reach the end of a schedule.
  """
  variants = [
    Variant("baseline (lambda=1, mu=128)", config_file, "baseline", published={"test_error": RUDRA_TEST_ERROR})
  ]
  module = load_config_module("rudra_cifar10")
  for batch in module.MU_LAMBDA_BATCHES:
    product = module.LEARNERS * batch
    variants.append(Variant(f"1-softsync, mu*lambda={product} (mu={batch})", config_file, f"mu_lambda_{product}"))
  smallest, largest = (variants[1].slug, variants[-1].slug)
  claims = (
    Claim(
      "1-softsync at mu * lambda = 120 matches the single learner at mu = 128 (Rudra)",
      smallest,
      variants[0].slug,
      "matches",
      margin,
    ),
    Claim(
      f"at a fixed alpha_0, mu * lambda = {module.LEARNERS * module.MU_LAMBDA_BATCHES[-1]} is worse than "
      "mu * lambda = 120 (Rudra)",
      largest,
      smallest,
      "worse",
      margin,
    ),
  )
  on_mnist = config_file != "rudra_cifar10"
  if on_mnist:  # the published number is CIFAR-10's: no column beside MNIST's errors
    variants = [dataclasses.replace(variant, published={}) for variant in variants]
  return Study(
    name="rudra_mu_lambda_mnist" if on_mnist else "rudra_mu_lambda",
    title=f"Rudra: 1-softsync, lambda=30, fixed alpha_0, varying mu{' (MNIST, small CNN)' if on_mnist else ''}",
    finding="Rudra (CIFAR-10, 140 epochs): at a fixed alpha_0, test error grows with mu * lambda; "
    "mu * lambda ~ 128 matches the single learner's ~18 %",
    variants=tuple(variants),
    short_epochs=1.0,
    claims=claims,
  )


def dcasgd_ordering_claims(margin: float, evidence) -> list[Claim]:
  """Zheng et al.'s ordering at each M of `DCASGD_LEARNERS`: DC-ASGD-c beats ASGD, DC-ASGD-a beats DC-ASGD-c.

  ``evidence(worse, better, learners)`` is the statement's parenthesis (the published numbers, or where it is asked).
  """
  return [
    Claim(
      f"{DCASGD_METHOD_NAMES[better]} beats {DCASGD_METHOD_NAMES[worse]} at M = {learners} "
      f"({evidence(worse, better, learners)})",
      slug_of(f"{DCASGD_METHOD_NAMES[worse]}, M={learners}"),
      slug_of(f"{DCASGD_METHOD_NAMES[better]}, M={learners}"),
      "worse",
      margin,
    )
    for learners in DCASGD_LEARNERS
    for worse, better in (("asgd", "dcasgd_c"), ("dcasgd_c", "dcasgd_a"))
  ]


def dcasgd_table1() -> Study:
  """Zheng et al. (arXiv 1609.08326) Table 1: ResNet-20 on CIFAR-10, M in {1, 4, 8}.

  After the paper's 9 runs, one ablation per M that the paper does not have (so no published
  number): DC-ASGD-a with its MeanSquare bias-corrected (``dcasgd_a_bc``). Appended last, so the
  paper's runs keep their slugs and commands.
  """
  variants = [
    Variant(
      "SGD, M=1",
      "dcasgd_cifar10_resnet20",
      "sgd",
      overrides={"learners": 1},
      published={"test_error": DCASGD_TABLE1["sgd", 1]},
    )
  ]
  for learners in DCASGD_LEARNERS:
    for method in ("asgd", "ssgd", "dcasgd_c", "dcasgd_a"):
      variants.append(
        Variant(
          f"{DCASGD_METHOD_NAMES[method]}, M={learners}",
          "dcasgd_cifar10_resnet20",
          method,
          overrides={"learners": learners},
          published={"test_error": DCASGD_TABLE1[method, learners]},
        )
      )
  for learners in DCASGD_LEARNERS:
    variants.append(
      Variant(
        f"{DCASGD_METHOD_NAMES['dcasgd_a_bc']}, M={learners}",
        "dcasgd_cifar10_resnet20",
        "dcasgd_a_bc",
        overrides={"learners": learners},
      )
    )
  claims = dcasgd_ordering_claims(
    DCASGD_ORDER_MARGIN,
    lambda worse, better, learners: (
      f"Zheng et al.: {DCASGD_TABLE1[better, learners]} against {DCASGD_TABLE1[worse, learners]} %"
    ),
  )
  return Study(
    name="dcasgd_table1",
    title="Zheng et al. Table 1: ResNet-20, CIFAR-10",
    finding="Zheng et al. Table 1 (160 epochs): test error DC-ASGD-a <= DC-ASGD-c <= ASGD at M = 4 and 8 "
    "(8.19 / 8.67 / 9.27 and 8.57 / 9.27 / 10.26 %)",
    variants=tuple(variants),
    short_epochs=1.0,
    claims=tuple(claims),
  )


DCASGD_MNIST_ORDER_MARGIN = 0.1  # test-error points: 10 of MNIST's 10,000 test images


def dcasgd_mnist() -> Study:
  """Zheng et al.'s ordering ASGD > DC-ASGD-c > DC-ASGD-a (test error) at M = 4 and 8 on MNIST
  (`stalesgd.configs.dcasgd_mnist`; the paper's numbers are CIFAR-10's, so none stand beside these)."""
  variants = [Variant("SGD, M=1", "dcasgd_mnist", "sgd", overrides={"learners": 1})]
  for learners in DCASGD_LEARNERS:
    for method in ("asgd", "dcasgd_c", "dcasgd_a"):
      variants.append(
        Variant(
          f"{DCASGD_METHOD_NAMES[method]}, M={learners}", "dcasgd_mnist", method, overrides={"learners": learners}
        )
      )
  claims = dcasgd_ordering_claims(
    DCASGD_MNIST_ORDER_MARGIN, lambda worse, better, learners: "Zheng et al.'s ordering, on MNIST"
  )
  return Study(
    name="dcasgd_mnist",
    title="Zheng et al.'s ordering on MNIST: async, small CNN, mu=32",
    finding="Zheng et al. Table 1 (CIFAR-10, 160 epochs): test error DC-ASGD-a <= DC-ASGD-c <= ASGD at M = 4 "
    "and 8; here the same ordering is asked on MNIST",
    variants=tuple(variants),
    short_epochs=1.0,
    claims=tuple(claims),
  )


DCS3GD_STALENESS = (1, 2, 4)
DCS3GD_CLAIM_STALENESS = (1, 4)  # the claims' S: the overlap's own and the largest
DCS3GD_MATCH_MARGIN = 2.0  # test-error points: "keeps synchronous accuracy"
DCS3GD_CORRECTION_MARGIN = DCASGD_ORDER_MARGIN  # test-error points: "without the correction the error is higher"
DCS3GD_LAMBDA_MODES = {
  "constant": {"delay_compensation": "constant", "dc_lambda": 0.04},  # DC-ASGD-c's lambda
  "adaptive": {"delay_compensation": "adaptive", "dc_lambda": 2.0, "dc_decay": 0.95},
}


def dcs3gd_cifar10() -> Study:
  """Our reconstruction of Rigazzi's DC-S3GD against S3GD and synchronous all-reduce on CIFAR-10
  (`stalesgd.configs.dcs3gd_cifar10_full`: M = 8, a global batch of 1,024, linear scaling and Goyal's warm-up).

  All-reduce staleness S in {1, 2, 4} with and without the correction
  (layer-wise lambda, the reconstruction's mode), and the constant and adaptive
  lambda modes at S = 4: 9 runs. The claims (rules fixed before the runs) are
  decided at S = 1 and 4 by the five runs ``all_reduce_sgd_s_0``,
  ``s3gd_s_{1,4}`` and ``dc_s3gd_layer_wise_s_{1,4}``.
  """
  config_file = "dcs3gd_cifar10_full"
  variants = [Variant("all-reduce SGD (S=0)", config_file, "allreduce_sync")]
  for staleness in DCS3GD_STALENESS:
    variants.append(Variant(f"S3GD, S={staleness}", config_file, "s3gd", overrides={"allreduce_staleness": staleness}))
    variants.append(
      Variant(f"DC-S3GD layer-wise, S={staleness}", config_file, "dcs3gd", overrides={"allreduce_staleness": staleness})
    )
  for mode, overrides in DCS3GD_LAMBDA_MODES.items():
    variants.append(
      Variant(
        f"DC-S3GD {mode}, S={DCS3GD_STALENESS[-1]}",
        config_file,
        "dcs3gd",
        overrides={"allreduce_staleness": DCS3GD_STALENESS[-1], **overrides},
      )
    )
  claims = []
  for staleness in DCS3GD_CLAIM_STALENESS:
    claims += [
      Claim(
        f"DC-S3GD (our reconstruction, layer-wise lambda) at S = {staleness} keeps synchronous accuracy (Rigazzi)",
        f"dc_s3gd_layer_wise_s_{staleness}",
        "all_reduce_sgd_s_0",
        "matches",
        DCS3GD_MATCH_MARGIN,
      ),
      Claim(
        f"without the correction (S3GD) at S = {staleness} the error is higher than with it (our "
        "reconstruction of DC-S3GD; Rigazzi)",
        f"s3gd_s_{staleness}",
        f"dc_s3gd_layer_wise_s_{staleness}",
        "worse",
        DCS3GD_CORRECTION_MARGIN,
      ),
    ]
  return Study(
    name="dcs3gd_cifar10",
    title="DC-S3GD (reconstruction): M=8, global batch 1024, warm-up, cifar10_full",
    finding="Rigazzi (large-batch CNN training): stale-synchronous all-reduce with the first-order correction "
    "keeps the accuracy of synchronous all-reduce SGD while the all-reduce overlaps the next step (decided "
    "here for our reconstruction of the algorithm, whose paper text could not be read)",
    variants=tuple(variants),
    short_epochs=1.0,
    claims=tuple(claims),
  )


DEMO_BANDS = ((0.0, 10.0, "learns (< 10 %)"), (80.0, 100.0, "fails (> 80 %)"))
DEMO_MATCH_MARGIN = 3.0  # test-error points: 9 of the digits' 300 test images


def demo() -> Study:
  """The `make demo` comparison at lambda = 8 on the embedded digits (`stalesgd.configs.demo`)."""
  labels = {
    "hardsync": "hardsync",
    "softsync_fixed": "8-softsync, a0",
    "softsync_inverse": "8-softsync, a0/sigma",
    "async_dc": "async, DC-ASGD-a",
  }
  variants = tuple(Variant(labels[name], "demo", name) for name in load_config_module("demo").VARIANTS)
  claims = (
    Claim(
      "8-softsync with the fixed alpha_0 fails where hardsync learns (Zhang et al.)",
      "8_softsync_a0",
      "hardsync",
      "worse",
      ZHANG_FAILURE_MARGIN,
    ),
    Claim(
      "8-softsync with alpha_0/sigma matches hardsync (Zhang et al.)",
      "8_softsync_a0_sigma",
      "hardsync",
      "matches",
      DEMO_MATCH_MARGIN,
    ),
  )
  return Study(
    name="demo",
    title="demo: lambda=8 learners on the embedded digits",
    finding="Zhang et al.: with the hardsync rate alpha_0, n-softsync fails as n grows, and alpha_0/sigma "
    "restores hardsync's accuracy; Zheng et al.'s DC-ASGD-a compensates staleness to first order "
    "(the demo runs it at the same alpha_0)",
    variants=variants,
    paper_data=False,
    has_quick=False,
    claims=claims,
    bands=DEMO_BANDS,
  )


ASYNC_ADAM_MARGIN = 3.0  # test-error points: 9 of the digits' 300 test images, as the demo's


def async_adam() -> Study:
  """Does alpha_0/sigma help an asynchronous Adam server? (`stalesgd.configs.async_adam`; our question, no paper's.)"""
  labels = {"hardsync": "hardsync", "async": "async", "async_inverse": "async, a0/sigma"}
  variants = tuple(Variant(labels[name], "async_adam", name) for name in load_config_module("async_adam").VARIANTS)
  claims = (
    Claim(
      "asynchronous Adam with alpha_0/sigma on its step matches synchronous Adam (our hypothesis, after Zhang "
      "et al.'s SGD result)",
      "async_a0_sigma",
      "hardsync",
      "matches",
      ASYNC_ADAM_MARGIN,
    ),
    Claim(
      "asynchronous Adam without a staleness rule is worse than synchronous Adam (our hypothesis)",
      "async",
      "hardsync",
      "worse",
      ASYNC_ADAM_MARGIN,
    ),
  )
  return Study(
    name="async_adam",
    title="async Adam: lambda=16 learners on the embedded digits, Adam as the server's solver",
    finding="No published claim: FedBuff-style servers apply stale updates with Adam, and Zhang et al. derived "
    "alpha_0/sigma for SGD. The question is whether the rule, applied to Adam's step, keeps synchronous accuracy",
    variants=variants,
    paper_data=False,
    has_quick=False,
    claims=claims,
  )


STUDIES = {
  study.name: study
  for study in (
    zhang_cifar10(),
    zhang_mnist(),
    rudra_mu_lambda(),
    rudra_mu_lambda("zhang_mnist", ZHANG_MNIST_MATCH_MARGIN),
    dcasgd_table1(),
    dcasgd_mnist(),
    dcs3gd_cifar10(),
    demo(),
    async_adam(),
  )
}
