"""The stale outer loops on the embedded digits: streaming DiLoCo and the one-round-delayed outer step.

The margins are fixed here before a study's runs, and never moved after (`stalesgd.studies._catalogue` registers
the studies). Both run `stalesgd.configs.diloco_digits` (small_cnn, H = 20, 30 epochs: equal inner steps in every
variant); each run also records its simulated time at the config's network (an all-reduce of the model = 5 inner
steps), which the report shows beside the error.
"""

from __future__ import annotations

import dataclasses

from stalesgd.configs.diloco_digits import STREAMING
from stalesgd.studies._study import Claim, Pilot, Study, Variant, slug_of

# Test-error points: 9 of the digits' 300 test images, as the demo's match margin. DiLoCo reaches about 2 %
# error here (one pilot run), so a variant within 3 points of it has not lost the task.
STREAMING_MATCH_MARGIN = 3.0
# Kale et al.: the naive one-round delay is worse than DiLoCo. "Worse" by more than 1 point (3 test images).
DELAYED_WORSE_MARGIN = 1.0
# Kale et al.: eager updates match DiLoCo. "Matches" within 1 point (3 test images), fixed before its runs.
EAGER_MATCH_MARGIN = 1.0
# Liu et al.'s toy (10,000 evaluation points): "worse" by more than 1 point (100 points) and "matches" within 1
# point, fixed before its runs.
LIU_TOY_MARGIN = 1.0
# The outer rate of the piloted studies, chosen per variant family before their decision runs (at DiLoCo's LLM
# rate 0.7 with momentum 0.9 eager, the delayed step and DiLoCo at M = 2 ran unstable on the digits): the grid,
# the pilot seeds and the validation share, fixed before the pilot.
OUTER_RATE_PILOT = Pilot(field="outer.learning_rate", values=(0.1, 0.2, 0.35, 0.5, 0.7), first_seed=100, seeds=2)


def _streaming_label(fragments: int, delay: int, mix: float) -> str:
  return f"streaming P={fragments} tau={delay} alpha={mix:g}"


def streaming_diloco_digits() -> Study:
  """Douillard et al. (arXiv 2501.18512): streaming keeps DiLoCo's accuracy at equal inner steps."""
  variants = (Variant("DiLoCo", "diloco_digits", "diloco"),) + tuple(
    Variant(_streaming_label(p, t, a), "diloco_digits", f"streaming_p{p}_tau{t}_alpha{a:g}") for p, t, a in STREAMING
  )
  claims = tuple(
    Claim(
      f"streaming DiLoCo (P={p}, tau={t}, alpha={a:g}) matches DiLoCo at equal inner steps (Douillard et al., "
      "Streaming DiLoCo)",
      slug_of(_streaming_label(p, t, a)),
      "diloco",
      "matches",
      STREAMING_MATCH_MARGIN,
    )
    for p, t, a in STREAMING
  )
  return Study(
    name="streaming_diloco_digits",
    title="streaming DiLoCo: M=8 learners, H=20, on the embedded digits",
    finding="Douillard et al. (Streaming DiLoCo): syncing fragments in turn, with each all-reduce overlapping tau "
    "inner steps and the local copy mixed with alpha, loses little against DiLoCo at equal inner steps while "
    "hiding the communication; here the simulated time of each variant is beside its error",
    variants=variants,
    paper_data=False,
    has_quick=False,
    claims=claims,
  )


def delayed_outer_step_digits() -> Study:
  """Kale et al. (arXiv 2502.12996): the naive one-round-delayed outer step is worse than DiLoCo, at M = 2, 4, 8."""
  return _against_diloco(
    name="delayed_outer_step_digits",
    title="one-round-delayed outer step vs DiLoCo, M in {2, 4, 8}, on the embedded digits",
    finding="Kale et al. (eager updates): applying each round's mean pseudo-gradient one round late, so that the "
    "all-reduce overlaps the next round, costs accuracy against DiLoCo; eager updates recover it",
    variant="delayed",
    label="one-round-delayed",
    claim="the one-round-delayed outer step is worse than DiLoCo at M={learners} (Kale et al.; their eager updates "
    "are the study eager_outer_step_digits)",
    relation="worse",
    margin=DELAYED_WORSE_MARGIN,
  )


def eager_outer_step_digits() -> Study:
  """Kale et al. (arXiv 2502.12996): eager updates on the one-round-delayed outer step match DiLoCo, M = 2, 4, 8."""
  return _against_diloco(
    name="eager_outer_step_digits",
    title="eager updates vs DiLoCo, M in {2, 4, 8}, on the embedded digits",
    finding="Kale et al. (eager updates): while round t's all-reduce is in flight, each learner steps with the "
    "previous round's mean in which its own part is replaced by its fresh pseudo-gradient, and so matches DiLoCo "
    "while the communication overlaps a whole round",
    variant="eager",
    label="eager",
    claim="eager updates on the one-round-delayed outer step match DiLoCo at M={learners} (Kale et al.)",
    relation="matches",
    margin=EAGER_MATCH_MARGIN,
  )


def _against_diloco(
  *, name: str, title: str, finding: str, variant: str, label: str, claim: str, relation: str, margin: float
) -> Study:
  """``diloco_digits:<variant>`` against DiLoCo at M = 2, 4 and 8, each pair with its claim (``claim`` formatted
  with ``learners``): the grid of Kale et al.'s two studies."""
  variants = []
  for learners in (2, 4, 8):
    overrides = {"learners": learners}
    variants.append(Variant(f"DiLoCo M={learners}", "diloco_digits", "diloco", overrides))
    variants.append(Variant(f"{label} M={learners}", "diloco_digits", variant, overrides))
  claims = tuple(
    Claim(
      claim.format(learners=learners),
      slug_of(f"{label} M={learners}"),
      slug_of(f"DiLoCo M={learners}"),
      relation,
      margin,
    )
    for learners in (2, 4, 8)
  )
  return Study(
    name=name, title=title, finding=finding, variants=tuple(variants), paper_data=False, has_quick=False, claims=claims
  )


def kale_outer_steps_digits() -> Study:
  """Kale et al. (arXiv 2502.12996) at piloted outer rates: DiLoCo, the one-round-delayed step and eager updates
  at M = 2, 4, 8, each family's outer rate chosen by `OUTER_RATE_PILOT` on a validation split.

  The claims and margins of `delayed_outer_step_digits` and `eager_outer_step_digits` (which ran at 0.7, the
  delayed step before its event-order fix), in one grid that shares its DiLoCo runs.
  """
  variants = []
  for learners in (2, 4, 8):
    overrides = {"learners": learners}
    for family, label, config_variant in (
      ("synchronous", "DiLoCo", "diloco"),
      ("delayed", "one-round-delayed", "delayed"),
      ("eager", "eager", "eager"),
    ):
      variants.append(
        Variant(f"{label} M={learners}", "diloco_digits", config_variant, overrides, family=f"{family} M={learners}")
      )
  claims = []
  for learners in (2, 4, 8):
    diloco = slug_of(f"DiLoCo M={learners}")
    claims.append(
      Claim(
        f"the one-round-delayed outer step is worse than DiLoCo at M={learners} (Kale et al.), each at its piloted "
        "outer rate",
        slug_of(f"one-round-delayed M={learners}"),
        diloco,
        "worse",
        DELAYED_WORSE_MARGIN,
      )
    )
    claims.append(
      Claim(
        f"eager updates on the one-round-delayed outer step match DiLoCo at M={learners} (Kale et al.), each at its "
        "piloted outer rate",
        slug_of(f"eager M={learners}"),
        diloco,
        "matches",
        EAGER_MATCH_MARGIN,
      )
    )
  return Study(
    name="kale_outer_steps_digits",
    title="DiLoCo, one-round-delayed and eager outer steps at piloted outer rates, M in {2, 4, 8}, on the digits",
    finding="Kale et al. (eager updates): applying each round's mean pseudo-gradient one round late, so that the "
    "all-reduce overlaps the next round, costs accuracy against DiLoCo; eager updates, which replace the learner's "
    "own part of the stale mean by its fresh pseudo-gradient, recover it",
    variants=tuple(variants),
    paper_data=False,
    has_quick=False,
    claims=tuple(claims),
    pilot=OUTER_RATE_PILOT,
  )


def streaming_diloco_digits_piloted() -> Study:
  """Douillard et al. (arXiv 2501.18512) at piloted outer rates: `streaming_diloco_digits`'s grid and claims, with
  one outer rate chosen for DiLoCo and one for the streaming variants by `OUTER_RATE_PILOT`."""
  study = streaming_diloco_digits()
  variants = tuple(
    dataclasses.replace(variant, family="synchronous" if variant.slug == "diloco" else "streaming")
    for variant in study.variants
  )
  return dataclasses.replace(
    study,
    name="streaming_diloco_digits_piloted",
    title="streaming DiLoCo at piloted outer rates: M=8 learners, H=20, on the embedded digits",
    variants=variants,
    claims=tuple(
      dataclasses.replace(claim, statement=claim.statement + ", each at its piloted outer rate")
      for claim in study.claims
    ),
    pilot=OUTER_RATE_PILOT,
  )


def liu_toy_async_local_sgd() -> Study:
  """Liu et al. (arXiv 2401.09135) on their toy, as DeepMind's asyncdiloco notebook sets it up (`liu_toy`)."""
  labels = {
    "sync": "DiLoCo",
    "async": "async local SGD",
    "async_dn_dylu": "async + delayed Nesterov + dynamic H",
    "sync_at_async_time": "DiLoCo at async's time",
    "sync_at_dn_dylu_time": "DiLoCo at DN+DyLU's time",
  }
  variants = tuple(Variant(label, "liu_toy", name) for name, label in labels.items())
  slug = {name: slug_of(label) for name, label in labels.items()}
  claims = (
    Claim(
      "plain asynchronous local SGD is worse than synchronous DiLoCo at equal inner steps (Liu et al.)",
      slug["async"],
      slug["sync"],
      "worse",
      LIU_TOY_MARGIN,
    ),
    Claim(
      "plain asynchronous local SGD is worse than synchronous DiLoCo in simulated time (DiLoCo stopped at the time "
      "async needs for its inner steps; Liu et al.)",
      slug["async"],
      slug["sync_at_async_time"],
      "worse",
      LIU_TOY_MARGIN,
    ),
    Claim(
      "delayed Nesterov with dynamic local updates matches synchronous DiLoCo at equal inner steps (Liu et al.)",
      slug["async_dn_dylu"],
      slug["sync"],
      "matches",
      LIU_TOY_MARGIN,
    ),
    Claim(
      "delayed Nesterov with dynamic local updates matches synchronous DiLoCo in simulated time (Liu et al.)",
      slug["async_dn_dylu"],
      slug["sync_at_dn_dylu_time"],
      "matches",
      LIU_TOY_MARGIN,
    ),
  )
  return Study(
    name="liu_toy_async_local_sgd",
    title="asynchronous local SGD vs DiLoCo on Liu et al.'s toy: 4 learners at 0.58-3.33 s per step, H=20",
    finding="Liu et al. (Asynchronous Local-SGD Training for Language Modeling): applying each learner's "
    "pseudo-gradient on arrival with Nesterov momentum does worse than synchronous DiLoCo at equal inner steps "
    "and in wall-clock time; delayed Nesterov momentum with dynamic local updates closes the gap",
    variants=variants,
    paper_data=False,
    claims=claims,
  )
