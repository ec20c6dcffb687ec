"""Whatever `--bench` selects, each figure it measured is in every table that shows that kind of
figure (issue 54): after `speedlib run --bench '^bench_contiguous\\.AdamStep\\.track_speedup'`
(the ratios and the interference counters the run selects with them, no seconds) the paired
table said "no paired comparison measured" and the headline "not measured yet". The baseline of
a paired class was found only among the variants timed; the ratios' own entry names it (the one
variant whose ratio it leaves empty).

The trees are the committed H200 result of 838236ba, whole and cut to what that selection
measures: the same rounds give the same figures in both."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

pd = pytest.importorskip("pandas")

from speedbench import report  # noqa: E402 - after the pandas skip above
from speedbench.report import headline  # noqa: E402 - after the pandas skip above
from speedbench.results.load import load_results  # noqa: E402 - after the pandas skip above

ROOT = Path(__file__).resolve().parents[3]
MACHINE, COMMIT = "h200-141gb", "838236ba"
CLASS = "bench_contiguous.AdamStep"
SELECTED = (f"{CLASS}.track_speedup", f"{CLASS}.track_interference", f"{CLASS}.track_preemptions",
            f"{CLASS}.track_gpu_clock", f"{CLASS}.track_gpu_neighbours")


def _tree(tmp: Path, keep) -> Path:
    source = ROOT / "results"
    root = tmp / "results"
    (root / MACHINE / "environment").mkdir(parents=True)
    shutil.copy(source / "benchmarks.json", root)
    shutil.copy(source / MACHINE / "machine.json", root / MACHINE)
    for record in (source / MACHINE / "environment").glob(f"{COMMIT}*.jsonl"):
        shutil.copy(record, root / MACHINE / "environment")
    result = next((source / MACHINE).glob(f"{COMMIT}-*.json"))
    data = json.loads(result.read_text())
    data["results"] = {k: v for k, v in data["results"].items() if keep(k)}
    (root / MACHINE / result.name).write_text(json.dumps(data))
    return root


@pytest.fixture(scope="module")
def trees(tmp_path_factory):
    whole = load_results(_tree(tmp_path_factory.mktemp("whole"), lambda k: k.startswith(f"{CLASS}."))).measured
    narrow = load_results(_tree(tmp_path_factory.mktemp("narrow"), lambda k: k in SELECTED)).measured
    assert not narrow["benchmark"].str.endswith(".track_seconds").any()
    return whole, narrow


def _paired(df):
    table = report.paired_table(df)
    rows = table.sources[table.sources["benchmark"] == f"{CLASS}.track_speedup"]
    return table, rows.set_index(["params"])[["baseline", "ratio", "ratio_low", "ratio_high", "n", "contention"]]


def test_every_ratio_a_narrow_selection_measured_is_in_the_paired_table(trees):
    whole, narrow = trees
    measured = narrow[narrow["benchmark"] == f"{CLASS}.track_speedup"]
    table, got = _paired(narrow)
    assert len(measured) > 0 and len(got) == len(measured)  # none was in the table before
    assert set(got["baseline"]) == {"forloop"} and "no paired comparison measured" not in table.notes
    _, expected = _paired(whole)
    assert got.sort_index().equals(expected.loc[got.index].sort_index())  # the same figures as from the whole run
    assert table.frame["machine state"].map(bool).all()  # each with its machine state


def test_the_narrow_selections_headline_and_exports_carry_it(trees):
    whole, narrow = trees
    # the headline's row asks against PyTorch's default Adam (foreach on a GPU, issue 51): the whole
    # run answers it; the narrow one holds only ratios against forloop, and its cell says so instead
    # of "not measured yet"
    row = {name: headline.grid(df).data.set_index("question").loc["contiguous-step"]
           for name, df in (("whole", whole), ("narrow", narrow))}
    assert row["whole"]["baseline"] == "foreach" and row["whole"]["ratio"] > 1 and row["whole"]["paired"]
    assert pd.isna(row["narrow"]["ratio"]) and "not measured yet" not in row["narrow"]["status"]
    assert row["narrow"]["status"] == f"not measured: its run at {COMMIT} gave no ratio of these two"
    csv = report.to_csv(report.paired_table(narrow))
    assert csv.count("AdamStep") == len(narrow[narrow["benchmark"] == f"{CLASS}.track_speedup"])
