"""stalesgd.studies._seed_statistics and the report's decisions, against numbers computed by hand."""

from __future__ import annotations

import dataclasses
import json
import math
import pathlib

import numpy as np
import pytest

from stalesgd.studies import Claim, Study, Variant
from stalesgd.studies import _seed_statistics as statistics
from stalesgd.studies._report import write_report

# Student's t quantiles t_{0.975, 1}, t_{0.975, 2} and t_{0.975, 3}, from a printed table (e.g. NIST/SEMATECH
# e-Handbook, Table 1.3.6.7.2).
T_975_1, T_975_2, T_975_3 = 12.706, 4.303, 3.182


def test_spread_is_mean_sample_std_min_max():
  values = statistics.spread([2.0, 4.0, 9.0])
  assert values.mean == 5.0
  assert values.std == pytest.approx(math.sqrt(((2 - 5) ** 2 + (4 - 5) ** 2 + (9 - 5) ** 2) / 2))  # ddof = 1
  assert (values.low, values.high, values.count) == (2.0, 9.0, 3)
  assert values.format() == "5.00 ± 3.61"
  single = statistics.spread([7.25])
  assert single.std is None and single.format(2) == "7.25 (1 seed)"
  with pytest.raises(dataclasses.FrozenInstanceError):  # a table and a decision read the same numbers
    values.mean = 0.0
  with pytest.raises(ValueError, match="one or more finite numbers"):
    statistics.spread([1.0, float("nan")])
  with pytest.raises(ValueError, match="one or more finite numbers"):
    statistics.spread([])


def test_final_value_is_the_mean_of_the_last_evaluations():
  assert statistics.final_value([50.0, 40.0, 30.0, 20.0], 3) == 30.0
  assert statistics.final_value([50.0, 40.0], 3) == 45.0
  assert statistics.final_value([50.0, 40.0, 30.0], 1) == 30.0  # the last evaluation alone
  with pytest.raises(ValueError, match="last=0"):
    statistics.final_value([1.0], 0)


def test_paired_interval_is_the_student_t_interval():
  # d = 1, 2, 3: mean 2, s_d = 1, half-width t_{0.975,2} / sqrt(3) = 4.303 / 1.732 = 2.484.
  interval = statistics.paired_interval([1.0, 2.0, 3.0])
  assert interval.mean == 2.0 and interval.count == 3
  assert interval.low == pytest.approx(2.0 - T_975_2 / math.sqrt(3), abs=1e-3)
  assert interval.high == pytest.approx(2.0 + T_975_2 / math.sqrt(3), abs=1e-3)
  assert interval.format() == "+2.00 [-0.48, +4.48] (95% interval, 3 seeds)"
  assert interval.format(digits=1, compact=True) == "+2.0 [-0.5, +4.5] (3)"  # a table cell: its header says 95 %
  with pytest.raises(TypeError):  # compact only by name: format(1, True) would not say what True means
    interval.format(1, True)
  assert statistics.paired_interval([5.0]) is None  # one seed: no interval
  assert statistics.paired_interval([]) is None  # no seed: no interval either, not an error
  with pytest.raises(ValueError, match="one or more finite numbers"):  # a diverged run's NaN is not a gap
    statistics.paired_interval([1.0, float("nan")])
  flat = statistics.paired_interval([80.0, 80.0])
  assert (flat.low, flat.high) == (80.0, 80.0)
  with pytest.raises(dataclasses.FrozenInstanceError):  # a decision reads the interval as it was computed
    interval.low = -100.0


@pytest.mark.parametrize(
  "differences, t, sd",
  [
    ([1.0, 3.0], T_975_1, math.sqrt(2.0)),  # n = 2: n - 1 = 1 degree of freedom
    ([1.0, 3.0, 4.0, 8.0], T_975_3, math.sqrt((3**2 + 1 + 0 + 4**2) / 3)),  # n = 4: mean 4, 3 degrees
  ],
)
def test_an_even_number_of_seeds_has_n_minus_1_degrees_of_freedom(differences, t, sd):
  interval = statistics.paired_interval(differences)
  mean, half = sum(differences) / len(differences), t * sd / math.sqrt(len(differences))
  assert interval.low == pytest.approx(mean - half, abs=2e-3) and interval.high == pytest.approx(mean + half, abs=2e-3)


def _fake_run(directory: pathlib.Path, curve: list[float]) -> None:
  directory.mkdir(parents=True)
  records = [
    {
      "step": 10 * (index + 1),
      "epoch": float(index + 1),
      "sim_time": float(index + 1),
      "train_loss": 1.0 / (index + 1),
      "test_error": error,
    }
    for index, error in enumerate(curve)
  ]
  (directory / "metrics.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records))


def test_report_gives_mean_and_std_over_seeds_and_decides_the_claims(tmp_path):
  study = Study(
    "toy",
    "toy",
    "Zhang et al.: b matches a; c fails",
    (
      Variant("a", "demo", "hardsync"),
      Variant("b", "demo", "softsync_inverse"),
      Variant("c", "demo", "softsync_fixed"),
    ),
    paper_data=False,
    has_quick=False,
    last_evaluations=2,
    claims=(Claim("b matches a", "b", "a", "matches", 2.0), Claim("c fails", "c", "a", "worse", 30.0)),
  )
  # Final values (mean of the last 2): a = 10, 12, 14; b = 11, 12, 13; c = 90 (diverged), 89, 91.
  curves = {
    ("a", 0): [50, 11, 9],
    ("a", 1): [50, 13, 11],
    ("a", 2): [50, 15, 13],
    ("b", 0): [60, 12, 10],
    ("b", 1): [60, 13, 11],
    ("b", 2): [60, 14, 12],
    ("c", 1): [90, 89, 89],
    ("c", 2): [90, 91, 91],
  }
  rows = []
  for label in ("a", "b", "c"):
    for seed in range(3):
      directory = tmp_path / label / f"seed_{seed}"
      row = {"variant": label, "slug": label, "seed": seed, "n": None, "workdir": str(directory)}
      if (label, seed) in curves:
        _fake_run(directory, [float(value) for value in curves[label, seed]])
        row.update(status="ok", test_error=float(curves[label, seed][-1]), epochs=3.0)
      else:
        directory.mkdir(parents=True)
        row.update(status="diverged at update 4", test_error=90.0, epochs=None)
      rows.append(row)
  text = write_report(study, rows, tmp_path)
  assert [row["final_test_error"] for row in rows] == [10.0, 12.0, 14.0, 11.0, 12.0, 13.0, 90.0, 89.0, 91.0]
  table = {row["variant"]: row for row in _read_csv(tmp_path / "results.csv")}
  assert float(table["a"]["final_test_error"]) == 12.0 and float(table["a"]["final_test_error_std"]) == 2.0
  assert table["c"]["status"] == "1 diverged at update 4, 2 ok"
  # A diverged run is no error rate: c's mean and std are its two other seeds', and the table says so.
  assert (float(table["c"]["final_test_error"]), table["c"]["final (mean ± std)"]) == (90.0, "90.00 ± 1.41; 1 diverged")
  decided = {entry["claim"]: entry for entry in json.loads((tmp_path / "decisions.json").read_text())}
  # b - a per seed: +1, 0, -1: mean 0, s_d 1, interval 0 -+ 4.303 / sqrt(3) = [-2.48, +2.48]: crosses +-2.
  assert decided["b matches a"]["gap"] == 0.0
  assert decided["b matches a"]["high"] == pytest.approx(T_975_2 / math.sqrt(3), abs=1e-3)
  assert decided["b matches a"]["decision"] == "not decided (the interval crosses the margin)"
  # c - a without the diverged seed 0: 77, 77: interval [77, 77], above 30; the decision names the seed left out.
  assert decided["c fails"]["gap"] == 77.0 and decided["c fails"]["decision"] == "holds"
  assert decided["c fails"]["diverged_left_out"] == ["c seed 0 (diverged at update 4)"]
  assert not study.report_last_evaluation and "last_evaluation_interval" not in decided["b matches a"]  # by default
  assert "**c fails**: holds" in text and "(95% interval, 2 seeds)" in text
  assert "Left out, diverged (a diverged run is no error rate): c seed 0 (diverged at update 4)." in text
  over_seeds = _read_csv(tmp_path / "evaluations_over_seeds.csv")
  a_last = [row for row in over_seeds if row["variant"] == "a" and row["evaluation"] == "3"][0]
  assert float(a_last["epoch"]) == 3.0
  assert (float(a_last["test_error_mean"]), float(a_last["test_error_std"])) == (11.0, 2.0)
  assert a_last["seeds"] == "3"
  assert (tmp_path / "test_error.png").read_bytes()[:4] == b"\x89PNG"


def _read_csv(path):
  import csv

  with open(path, newline="", encoding="utf-8") as file:
    return list(csv.DictReader(file))


def _runtime(text: str) -> str:
  """``text`` as a string built at run time: equal to the literal, another object (for two characters or more:
  CPython keeps one object per one-character string)."""
  return "".join(list(text))


def test_a_banded_report_reads_bands_means_diagnostics_and_the_schedules(tmp_path, monkeypatch):
  """Two variants, two seeds each, bands [0, 20] and (20, 100]: va's seeds land in one band, vb's in two. A run's
  diagnostics are the mean of its records (1, 2, 4 -> 7/3); a variant's field means are over its seeds (sim_time 2
  and 5 -> 3.5); the plots' subtitle counts the seeds (max seed + 1) and each band plot gets each variant's own
  points; a run directory holding a schedule gives the staleness histograms; the coarse table is bands.md, and the
  text returned is it with one line per claim."""
  from stalesgd.reports import _plots as plots
  from stalesgd.schedule import simulate

  study = Study(
    "banded",
    "Banded toy",
    "demo: b matches a",
    (Variant("va", "demo", "hardsync"), Variant("vb", "demo", "async_dc")),
    paper_data=False,
    has_quick=False,
    last_evaluations=1,
    claims=(Claim("b matches a", "vb", "va", "matches", 50.0), Claim("a matches b", "va", "vb", "matches", 50.0)),
    bands=((0.0, 20.0, "low"), (20.0, 100.0, "high")),
  )
  finals = {("va", 0): 10.0, ("va", 1): 20.0, ("vb", 0): 15.0, ("vb", 1): 30.0}
  rows = []
  for (label, seed), final in finals.items():
    directory = tmp_path / label / f"seed_{seed}"
    directory.mkdir(parents=True)
    records = [
      {"step": 10 * (index + 1), "epoch": index + 0.5, "sim_time": 1.0, "train_loss": 1.0, "test_error": final}
      | {"correction_ratio": ratio}
      for index, ratio in enumerate((1.0, 2.0, 4.0))
    ]
    (directory / "metrics.jsonl").write_text("".join(json.dumps(record) + "\n" for record in records))
    if label == "va":
      simulate("async", learners=2, num_updates=4, seed=seed).save(directory / "schedule.npz")
    rows.append(
      {
        "variant": _runtime(label),
        "slug": _runtime(label),
        "seed": seed,
        "n": None,
        "workdir": str(directory),
        "status": "ok",
        "sim_time": 2.0 + 3.0 * seed,
        **({"published_test_error": 18.0} if label == "va" else {}),
      }
    )
  titles, plotted = [], {}
  original = plots.plot_bands

  def recording(bands, path, *, y, title):
    titles.append(title)
    plotted[y] = {band.label: (list(band.mean), list(band.std)) for band in bands}
    return original(bands, path, y=y, title=title)

  monkeypatch.setattr(plots, "plot_bands", recording)
  text = write_report(study, rows, tmp_path)

  assert [row["correction_ratio"] for row in rows] == [pytest.approx(7 / 3)] * 4
  table = {row["variant"]: row for row in _read_csv(tmp_path / "results.csv")}
  assert float(table["va"]["sim_time"]) == 3.5 and float(table["vb"]["sim_time"]) == 3.5
  assert float(table["va"]["correction_ratio"]) == pytest.approx(7 / 3)
  assert float(table["va"]["published_test_error"]) == 18.0 and table["vb"]["published_test_error"] == ""
  header = (tmp_path / "results.md").read_text().splitlines()[0]
  assert [cell.strip() for cell in header.strip("|").split("|")][:4] == [
    "variant",
    "seeds",
    "final (mean ± std)",
    "final_test_error_min",
  ]
  over_seeds = _read_csv(tmp_path / "evaluations_over_seeds.csv")
  assert [(row["variant"], row["evaluation"], row["epoch"]) for row in over_seeds] == [
    (variant, str(number), str(number - 0.5)) for variant in ("va", "vb") for number in (1, 2, 3)
  ]
  assert titles == ["Banded toy (2 seeds per variant at most; band: ± std)"] * 2
  # Each evaluation's mean over seeds: (10 + 20) / 2 and (15 + 30) / 2; the sample stds 5 sqrt(2) and 7.5 sqrt(2).
  means = {label: mean for label, (mean, _) in plotted["test_error"].items()}
  assert means == {"va": [15.0] * 3, "vb": [22.5] * 3}
  np.testing.assert_allclose(plotted["test_error"]["va"][1], [5 * 2**0.5] * 3)
  np.testing.assert_allclose(plotted["test_error"]["vb"][1], [7.5 * 2**0.5] * 3)
  assert (tmp_path / "staleness.png").read_bytes()[:4] == b"\x89PNG"
  bands_md = (tmp_path / "bands.md").read_text()
  cells = " ".join(bands_md.split())
  assert "| va | 2 | low |" in cells and "| vb | 2 | seeds in different bands: high; low |" in cells
  assert text == bands_md + "\n- b matches a: holds\n- a matches b: holds\n"
  assert (tmp_path / "decisions.json").read_text().startswith('[\n  {\n    "claim": "b matches a"')
  evaluated = _read_csv(tmp_path / "evaluations.csv")
  assert [(row["variant"], row["seed"], row["epoch"]) for row in evaluated[:4]] == [
    ("va", "0", "0.5"),
    ("va", "0", "1.5"),
    ("va", "0", "2.5"),
    ("va", "1", "0.5"),
  ]

  # A report of one variant alone (a study run with --variants va, or vb): the other has no row.
  (tmp_path / "a_only").mkdir()
  write_report(study, [dict(row) for row in rows if row["variant"] == "va"], tmp_path / "a_only")
  assert [row["variant"] for row in _read_csv(tmp_path / "a_only" / "results.csv")] == ["va"]
  decided = json.loads((tmp_path / "a_only" / "decisions.json").read_text())
  # vb never ran: both claims are "not run", naming it, and print no gap at all.
  assert [(entry["decision"], entry["not_run"]) for entry in decided] == [("not run", ["vb"])] * 2
  assert "not run. No run of `vb` in this grid. Rule:" in (tmp_path / "a_only" / "decisions.md").read_text()
  assert "Gap" not in (tmp_path / "a_only" / "decisions.md").read_text()
  (tmp_path / "b_only").mkdir()
  write_report(study, [dict(row) for row in rows if row["variant"] == "vb"], tmp_path / "b_only")
  assert [row["variant"] for row in _read_csv(tmp_path / "b_only" / "results.csv")] == ["vb"]
  decided = json.loads((tmp_path / "b_only" / "decisions.json").read_text())
  assert [(entry["decision"], entry["not_run"]) for entry in decided] == [("not run", ["va"])] * 2  # va sorts first


def test_a_one_seed_report_says_seed_in_the_singular(tmp_path, monkeypatch):
  from stalesgd.reports import _plots as plots

  study = Study(
    "one",
    "One",
    "demo: x",
    (Variant("a", "demo", "hardsync"), Variant("b", "demo", "async_dc")),
    paper_data=False,
    has_quick=False,
    last_evaluations=1,
    claims=(Claim("b matches a", "b", "a", "matches", 1.0),),
  )
  rows = []
  for label, curve in (("a", [30.0, 20.0, 10.0]), ("b", [30.0, 20.0, 12.5])):
    _fake_run(tmp_path / label, curve)
    rows.append(
      {"variant": label, "slug": label, "seed": 0, "n": None, "workdir": str(tmp_path / label), "status": "ok"}
    )
  titles, stds = [], []
  monkeypatch.setattr(
    plots, "plot_bands", lambda bands, path, *, y, title: (titles.append(title), stds.extend(b.std for b in bands))
  )
  text = write_report(study, rows, tmp_path)
  assert titles == ["One (1 seed per variant at most; band: ± std)"] * 2
  assert stds == [[0.0] * 3] * 4  # one seed: no std, drawn as a band of width 0
  with pytest.raises(TypeError):
    write_report(study, rows, tmp_path, "a command")  # the command is keyword-only
  assert "Gap +2.50 (1 seed: no interval)" in text and "not decided (1 seed: no interval)" in text


def test_band_of_includes_both_ends():
  from stalesgd.studies._report import band_of

  bands = ((10.0, 20.0, "x"), (30.0, 40.0, "y"))
  assert [band_of(value, bands) for value in (10.0, 20.0, 40.0)] == ["x", "x", "y"]
  assert band_of(5.0, bands) == "outside every band (5.0)" and band_of(25.0, bands) == "outside every band (25.0)"
  assert band_of(None, bands) == "no value"


def test_a_band_follows_its_variant_past_a_seed_that_stopped_early():
  """Seed 0 of ``va`` stopped after 2 evaluations, seed 1 ran 3: the band has 3 points, the last from seed 1
  alone (test error 10 and 20, then 30, 40, then 50)."""
  from stalesgd.studies._report import bands, seed_curves

  rows = [{"variant": _runtime("va")}, {"variant": _runtime("va")}]
  errors = {0: [10.0, 30.0], 1: [20.0, 40.0, 50.0]}
  records_of = {
    index: [{"step": step, "epoch": float(step), "test_error": error} for step, error in enumerate(curve, 1)]
    for index, curve in errors.items()
  }
  [band] = bands(seed_curves(rows, records_of), "test_error")
  assert band.label == "va" and list(band.mean) == [15.0, 35.0, 50.0]


def test_the_last_evaluation_alone_is_reported_beside_the_rule_and_decides_nothing(tmp_path):
  """Rule: the mean of the last 2 evaluations; each run also reports its last evaluation alone. Final values are 15
  for every run (gap 0: holds within +-2); the last evaluations are a = 20, 18, 16 and b = 15, 14, 13, gaps -5, -4,
  -3: mean -4, s_d 1, interval -4 -+ 4.303 / sqrt(3) = [-6.48, -1.52], outside the margin, and still the decision
  is the rule's."""
  study = Study(
    "toy_last",
    "toy",
    "b matches a",
    (Variant("a", "demo", "hardsync"), Variant("b", "demo", "softsync_inverse")),
    paper_data=False,
    has_quick=False,
    last_evaluations=2,
    report_last_evaluation=True,
    claims=(Claim("b matches a", "b", "a", "matches", 2.0),),
  )
  curves = {"a": ([50, 10, 20], [50, 12, 18], [50, 14, 16]), "b": ([50, 15, 15], [50, 16, 14], [50, 17, 13])}
  rows = []
  for label, runs in curves.items():
    for seed, curve in enumerate(runs):
      directory = tmp_path / label / f"seed_{seed}"
      _fake_run(directory, [float(value) for value in curve])
      rows.append(
        {"variant": label, "slug": label, "seed": seed, "n": None, "workdir": str(directory), "status": "ok"}
        | {"test_error": float(curve[-1]), "epochs": 3.0}
      )
  text = write_report(study, rows, tmp_path)
  assert [row["final_test_error"] for row in rows] == [15.0] * 6
  assert [row["last_test_error"] for row in rows] == [20.0, 18.0, 16.0, 15.0, 14.0, 13.0]
  (entry,) = json.loads((tmp_path / "decisions.json").read_text())
  assert (entry["gap"], entry["low"], entry["high"], entry["decision"]) == (0.0, 0.0, 0.0, "holds")
  low, high = -4 - T_975_2 / math.sqrt(3), -4 + T_975_2 / math.sqrt(3)
  interval = f"-4.00 [{low:+.2f}, {high:+.2f}] (95% interval, 3 seeds)"
  assert entry["last_evaluation_interval"] == interval
  assert f"The last evaluation alone (decides nothing): gap {interval}." in text
  # The pre-registration verdict as the results keep it: JSON indented by 2, one trailing newline.
  verdict = (tmp_path / "preregistration.json").read_text()
  assert verdict == json.dumps(json.loads(verdict), indent=2) + "\n" and json.loads(verdict)["status"]
