"""speedbench.report.roofline: the host-gather roofline's figures from result files (one row per
variant and point, the eight tracks joined), laid along each axis, tabled for `speedlib report
--table roofline`, kept out of the floor table, and "not measured yet" with the command before a
GPU has run the chunk. Results: a synthetic tree (speedbench.results.synthetic.write_roofline),
labelled synthetic, shaped as the benchmark names its classes, variants and points."""

from __future__ import annotations

import io
import json
import sys
from contextlib import redirect_stdout
from pathlib import Path

import pandas as pd
import pytest

from speedbench import report
from speedbench.cli import parser as cli
from speedbench.report import roofline
from speedbench.results import synthetic
from speedbench.results.load import load_results

ROOT = Path(__file__).resolve().parents[3]
sys.path.insert(0, str(ROOT))
from benchmarks import bench_transfer as bench  # noqa: E402 - after the checkout is importable


@pytest.fixture(scope="module")
def tree(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("results")
    synthetic.write_results(root, commits=2, machines=3)
    synthetic.write_roofline(root, "synthetic-h200", commit=1)
    return root


@pytest.fixture(scope="module")
def measured(tree) -> pd.DataFrame:
    return load_results(tree).measured


def test_the_synthetic_tree_is_shaped_as_the_benchmark_names_its_results():
    assert synthetic.ROOFLINE == {"Roofline": (bench.ROOFLINE_VARIANTS, bench.ROOFLINE_POINTS),
                                  "RooflineHypotheses": (list(bench.HYPOTHESES), bench.HYPOTHESIS_POINTS)}
    assert synthetic.ROOFLINE_DEFAULT == bench.DEFAULT_POINT
    tracks = {m.removeprefix("track_") for m in dir(bench.Roofline) if m.startswith("track_roofline_")}
    assert tracks == set(roofline.METRICS)


@pytest.mark.parametrize("point", bench.ROOFLINE_POINTS)
def test_a_points_name_says_where_it_lies_as_the_benchmark_places_it(point):
    row, batch, table, order = bench.roofline_point(point)
    where = roofline.point_axis(point)
    if point == bench.DEFAULT_POINT:
        assert where == {"row": row, "batch": batch, "table": table / 1e9, "order": order}
    else:
        axis, value = next(iter(where.items()))
        assert len(where) == 1 and value == {"row": row, "batch": batch, "table": table / 1e9, "order": order}[axis]
    assert roofline.point_axis("rows 64 B") == {} and roofline.point_axis("row wide") == {}


def test_figures_join_the_eight_tracks_of_each_variant_and_point(tree, measured):
    fig = roofline.figures(measured)
    assert len(fig) == 3 * 10 + 6 * 3 and set(fig["machine"]) == {"synthetic-h200"}
    file = json.loads(next((tree / "synthetic-h200").glob("*-existing-*.json")).read_text())
    for _, r in fig.iterrows():
        variants, points = synthetic.ROOFLINE[r["suite"]]
        at = variants.index(r["variant"]) * len(points) + points.index(r["point"])
        for metric, column in roofline.METRICS.items():
            assert r[column] == file["results"][f"bench_transfer.{r['suite']}.track_{metric}"][0][at]
        assert r["row"] == bench.roofline_point(r["point"])[0]
        assert r["useful_gather"] == pytest.approx(100 * r["row"] / r["gather_bus"])
        assert len(r["result_ids"].split(", ")) == 8


def test_along_an_axis_are_its_points_and_the_default_one_in_order(measured):
    paths = roofline.figures(measured)
    paths = paths[paths["suite"] == "Roofline"]
    row = roofline.along(paths, "row")
    assert list(dict.fromkeys(row["x"])) == [64, 256, 512, 4096] and len(row) == 12
    assert list(dict.fromkeys(roofline.along(paths, "order")["x"])) == ["random", "sorted", "zipf"]
    assert list(dict.fromkeys(roofline.along(paths, "table")["x"])) == [1, 5.12, 40]
    assert list(dict.fromkeys(roofline.along(paths, "batch")["x"])) == [1024, 131072, 1048576]


def test_the_table_gives_every_figure_in_words_and_as_numbers(measured):
    t = roofline.roofline_table(measured)
    assert len(t.frame) == len(t.data) == 48
    first = t.frame.iloc[0]
    # the default point by name on screen (a note gives its coordinates), in full in the data
    assert (first["class"], first["variant"], first["point"]) == ("Roofline", "torch_pinned", "default")
    assert list(t.data["point"].iloc[:3]) == [bench.DEFAULT_POINT] * 3 and t.frame["point"].iloc[3] == "row 64 B"
    assert list(t.frame["variant"].iloc[:3]) == ["torch_pinned", "uva", "auto"]
    row = t.data.iloc[0]
    assert first["gather"] == f"{row['gather_pct']:.1f} %" and first["gather GB/s"] == f"{row['gather_gbps']:.1f} GB/s"
    assert first["bus bytes a row"] == f"{row['gather_bus_bytes']:.4g} B"
    assert any(n.startswith("bus bytes a row (gather): a model, not a measurement") for n in t.notes)
    assert set(t.sources["suite"]) == set(roofline.SUITES) and len(t.sources) == 48 * 8


def test_the_floor_table_leaves_the_roofline_to_its_own(measured):
    floor = report.floor_table(measured)
    assert len(roofline.figures(measured)) and len(floor.frame) == 36  # the synthetic AdamBandwidth's, only
    assert not floor.frame["benchmark"].str.startswith("bench_transfer.").any()
    assert not report.floor_figures(measured)["suite"].isin(roofline.SUITES).any()


def test_before_a_gpu_ran_the_chunk_the_page_says_so_with_the_command(measured):
    assert roofline.not_measured(measured) is None
    assert roofline.not_measured(measured, "synthetic-h200") is None
    said = roofline.not_measured(measured, "synthetic-h100")
    assert said.startswith("The host-gather roofline: not measured yet on this machine.")
    assert "`speedlib run --chunk transfer-roofline --chunk transfer-hypotheses` measures it on a GPU machine" in said
    assert roofline.MEASURE == "speedlib run --chunk transfer-roofline --chunk transfer-hypotheses"
    committed = load_results(ROOT / "results")
    assert roofline.not_measured(committed.measured) is not None  # no GPU has run it yet


def test_speedlib_report_prints_the_roofline_table(tree, measured):
    out = io.StringIO()
    with redirect_stdout(out):
        assert cli.main(["report", "--results", str(tree), "--table", "roofline", "--format", "csv"]) == 0
    csv = pd.read_csv(io.StringIO(out.getvalue()))
    table = roofline.roofline_table(report.latest(measured))
    assert len(csv) == 48 and list(csv["gather_pct"]) == pytest.approx(list(table.data["gather_pct"]))
