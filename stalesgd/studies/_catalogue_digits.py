"""The studies that run on the embedded digits in minutes: the demo and the staleness rule on Adam's step.

The margins are fixed here before a study's runs, and never moved after (`stalesgd.studies._catalogue`
registers the studies).
"""

from __future__ import annotations

from stalesgd.studies._catalogue_zhang_rudra import ZHANG_FAILURE_MARGIN
from stalesgd.studies._study import Claim, Study, Variant, load_config_module

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
