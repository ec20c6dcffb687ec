"""The dashboard's charts draw one bar or box per configuration, never two stacked or pooled.

A tuning page once drew four knobs (0.43x-1.29x) as one 3.9x bar, and checkpointing's batch 4
and 16 as one 1.4x bar where both were 0.7x: a label repeated within a plotly trace stacks. The
dashboard draws them with Vega-Lite (speedbench.report.vega), the static site with plotly
(speedbench.report.charts); both from speedbench.report.chart_rows, and both are checked here.
"""

from __future__ import annotations

import base64
import json
import math
import re
import shutil
import sys
from pathlib import Path

import pytest

pd = pytest.importorskip("pandas")
pytest.importorskip("streamlit")
pytest.importorskip("plotly")

import numpy as np  # noqa: E402 - after the skips: the dashboard extra may be missing
from dashboard_bits import app_on, cell_text, frames, glance_cells, read, vega_charts  # noqa: E402 - after the skips: it needs streamlit

from speedbench import report  # noqa: E402 - after the skips: the report needs pandas
from speedbench.report import charts as _charts  # noqa: E402 - after the skips: it needs plotly
from speedbench.report import history_chart, vega  # noqa: E402 - after the skips: it needs pandas
from speedbench.report.ticks import ratio_ticks  # noqa: E402 - with its neighbours
from speedbench.results import synthetic  # noqa: E402 - after the skips: it needs pandas
from speedbench.results.load import load_results  # noqa: E402 - after the skips: it needs pandas

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "dashboard"))
import _tables  # noqa: E402 - from dashboard/, put on the path just above


def figures(results: Path, page: str, monkeypatch, **query) -> list[tuple[dict, pd.DataFrame]]:
    """Every chart `page` draws on `results` but its at-a-glance row (glance_cells reads that): its
    Vega-Lite spec and values."""
    at = app_on(results, page, monkeypatch, **query)
    assert not at.exception, at.exception
    return drawn(at)


def drawn(at) -> list[tuple[dict, pd.DataFrame]]:
    assert not at.get("plotly_chart")  # plotly.js alone cost a new tab 1.5-2 s
    return [(spec, values) for spec, values in vega_charts(at) if "technique" not in values]


def title(spec: dict) -> str:
    """A chart's title as one line (Vega-Lite draws it in lines a phone's width holds)."""
    return " ".join(spec.get("title", {}).get("text", []))


def bars_of(values: pd.DataFrame) -> list[tuple[str, str]]:
    """A chart's bars or boxes, each as (its colour's group, its label): a ratio chart's bars, a value
    chart's, a sample chart's boxes."""
    if "label" in values:
        return list(zip(values["group"], values["label"], strict=True))
    if "kind" in values:
        values = values[values["kind"] == "box"]
    return list(zip(values["variant"], values["config"], strict=True))


def values(array) -> list:
    """A plotly JSON array: a list, or a typed array ({"dtype", "bdata"}) for numbers."""
    if isinstance(array, dict):
        return np.frombuffer(base64.b64decode(array["bdata"]), dtype=array["dtype"]).tolist()
    return list(array)


def labels(trace: dict) -> list:
    """A bar trace's category labels: on the y axis where the bars lie horizontally."""
    return values(trace["y"] if trace.get("orientation") == "h" else trace["x"])


def lengths(trace: dict) -> list:
    """A bar trace's bar lengths, along whichever axis the bars grow."""
    return values(trace["x"] if trace.get("orientation") == "h" else trace["y"])


def test_a_repeated_bar_label_is_refused():
    s = pd.DataFrame({"case": ["on", "on"], "suite": ["TrainingStep"] * 2, "ratio": [0.5, 1.2],
                      "ratio_low": [0.4, 1.1], "ratio_high": [0.6, 1.3]})
    with pytest.raises(ValueError, match="repeat"):
        _charts.ratio_chart(s, "case", "suite", "t")


def test_boxes_keep_classes_and_parameters_apart():
    rows = pd.DataFrame({"suite": ["AdamStep", "Iteration", "AdamStep"], "variant": ["speedlib"] * 3,
                         "params": ["workload=mlp, variant=speedlib"] * 2 + ["workload=resnet50, variant=speedlib"],
                         "workload": ["mlp", "mlp", "resnet50"], "unit": "seconds", "value": [1.0, 2.0, 3.0],
                         "samples": [[1.0, 1.1], [2.0], [3.0]]})
    fig = _charts.spread_chart(rows, "t")
    assert sorted(set(fig.data[0].x)) == ["AdamStep: mlp", "AdamStep: resnet50", "Iteration: mlp"]
    one = _charts.spread_chart(rows[rows["suite"] == "AdamStep"], "t")  # one class: its name says nothing
    assert sorted(set(one.data[0].x)) == ["mlp", "resnet50"]


@pytest.mark.parametrize("machine", ["cpu-2core-intel-xeon", "cpu-2core-amd-epyc", "h100-sxm-80gb"])
@pytest.mark.parametrize("name", list(report.TECHNIQUES))
def test_technique_pages_draw_one_bar_per_configuration(name, machine, monkeypatch):
    for spec, values in figures(ROOT / "results", f"/{name}", monkeypatch, machine=machine):
        bars = bars_of(values)
        assert bars and len(bars) == len(set(bars)), (name, machine, title(spec), bars)


def test_the_tuning_page_shows_one_paired_bar_per_knob(monkeypatch):
    charts = figures(ROOT / "results", "/tuning", monkeypatch, machine="h100-sxm-80gb")
    paired, bars = next((s, v) for s, v in charts if "paired" in title(s))
    knobs = [x for x in bars["label"] if x.startswith("knob=")]
    assert sorted(knobs) == [f"knob={k} / on vs off" for k in
                             ("accumulation", "channels_last", "conv_bias", "zero_grad")]
    last = report.paired(report.latest(load_results(ROOT / "results").measured))
    expected = last[(last["machine"] == "h100-sxm-80gb") & (last["suite"] == "TrainingStep")
                    & (last["technique"] == "tuning")].set_index("knob")["ratio"]
    # Bars grow from the 1x line to the ratio.
    (bar,) = [layer for layer in paired["layer"] if layer["mark"]["type"] == "bar"]
    assert bar["encoding"]["x"]["field"] == "ratio" and bar["encoding"]["x2"] == {"datum": 1.0}
    ys = dict(zip(bars["label"], bars["ratio"], strict=True))
    assert len(expected) == 4
    for knob, ratio in expected.items():
        assert ys[f"knob={knob} / on vs off"] == pytest.approx(ratio)


def test_a_page_defaults_to_the_baseline_that_ran_there(monkeypatch):
    """On CPUs DataParallel cannot run: the parallel page compares against one process, the
    technique's fallback, not against whichever variant sorts first (ddp)."""
    at = app_on(ROOT / "results", "/parallel", monkeypatch, machine="cpu-2core-intel-xeon")
    assert not at.exception
    assert next(s for s in at.selectbox if s.label == "Baseline").value == "single"
    assert "driver n/a" in "\n".join(t.value for t in at.text)  # a CPU machine has no driver: not "nan"


def test_machines_chart_compares_times_only(tmp_path, monkeypatch):
    tree = tmp_path / "results"
    synthetic.write_results(tree, commits=1, machines=3)
    charts = figures(tree, "views/machines.py", monkeypatch, a="synthetic-h100", b="synthetic-h200")
    ((chart, bars),) = charts
    assert title(chart).startswith("times: ")
    names = list(bars["label"])
    assert names and all(x.endswith(")") for x in names)
    assert not [x for x in names if "(speedup)" in x or "fraction" in x or "bandwidth" in x]


def test_ratio_axes_are_logarithmic_with_ratio_ticks():
    s = pd.DataFrame({"case": ["a", "b"], "suite": ["S", "S"], "ratio": [0.03, 3.2],
                      "ratio_low": [0.025, 3.0], "ratio_high": [0.04, 3.4]})
    axis = _charts.ratio_chart(s, "case", "suite", "t").layout.xaxis
    assert axis.type == "log" and 1 in axis.tickvals
    # the range holds every bar and error bar, and every tick lies inside it (plotly hides the others)
    low, high = (10 ** r for r in axis.range)
    assert low <= 0.025 and high >= 3.4 and all(low <= t <= high for t in axis.tickvals)
    assert min(axis.tickvals) <= 0.05 and max(axis.tickvals) >= 2  # spread over the bars, not bunched at 1x
    assert list(axis.ticktext) == [f"{t:g}x" for t in axis.tickvals]


def test_ratio_bars_lie_flat_with_a_slot_for_every_label():
    """Two dozen configurations under a vertical chart overlapped diagonally: the bars lie
    horizontally, labels down the side, the first on top, with room for each bar of each trace."""
    cases = [f"densenet121, batch={b} / v{i} vs none" for b in (4, 16) for i in range(12)]
    s = pd.DataFrame({"case": cases * 2, "machine": ["a"] * 24 + ["b"] * 24, "ratio": [0.8] * 48,
                      "ratio_low": [0.7] * 48, "ratio_high": [0.9] * 48})
    fig = _charts.ratio_chart(s, "case", "machine", "t")
    assert all(t.orientation == "h" for t in fig.data)
    assert list(fig.layout.yaxis.categoryarray) == sorted(cases)[::-1]  # plotly draws the last on top
    assert fig.layout.height >= 20 * 24 * 2


def test_a_bar_whose_interval_includes_1x_is_hollow_in_its_own_colour_and_said_so():
    """Issue 44: a faded bar read as another machine's (lighter) colour. An unsure bar is white,
    dotted and outlined in its own trace's colour, which every other bar of the trace is filled with."""
    s = pd.DataFrame({"case": ["sure win", "unsure", "sure loss", "no interval"], "suite": ["S"] * 4,
                      "ratio": [2.0, 1.05, 0.5, 1.3], "ratio_low": [1.8, 0.9, 0.4, float("nan")],
                      "ratio_high": [2.2, 1.2, 0.6, float("nan")]})
    fig = _charts.ratio_chart(s, "case", "suite", "t")
    (bar,) = fig.data
    own = _charts._PALETTE[0]
    assert list(bar.marker.color) == [own, "white", own, own] and bar.marker.line.color == own
    assert list(bar.marker.line.width) == [0, 2, 0, 0] and bar.marker.pattern.fgcolor[1] == own
    two = _charts.ratio_chart(pd.concat([s, s.assign(suite="T")]), "case", "suite", "t")
    assert two.data[1].marker.line.color == _charts._PALETTE[1] != own  # each trace its own colour
    assert [c[3] for c in bar.customdata] == ["", "interval includes 1x", "", "single value, no interval"]
    assert [c[1] for c in bar.customdata] == ["[1.8, 2.2]", "[0.9, 1.2]", "[0.4, 0.6]", ""]  # hover: the interval
    # A single value (a DDP launch per variant) is hatched: drawn solid it looked as sure as 30 paired rounds.
    assert list(bar.marker.pattern.shape) == ["", ".", "", "/"]
    (note,) = fig.layout.annotations
    assert "includes 1x" in note.text and "single value per variant, no interval" in note.text
    sure = s.drop(index=[1, 3])
    assert not _charts.ratio_chart(sure, "case", "suite", "t").layout.annotations  # no note without a marked bar


def test_a_chart_of_one_machine_still_names_it():
    """plotly hides a lone trace's legend: a CPU-only chart beside CPU-and-GPU ones read as a GPU's."""
    s = pd.DataFrame({"case": ["a"], "machine": ["cpu-2core-intel-xeon (CPU only)"], "ratio": [0.7],
                      "ratio_low": [0.6], "ratio_high": [0.8]})
    fig = _charts.ratio_chart(s, "case", "machine", "t")
    assert fig.layout.showlegend and fig.data[0].name == "cpu-2core-intel-xeon (CPU only)"


@pytest.mark.parametrize("low, high", [(0.369, 1.44), (0.41, 3.4), (0.02, 3.5), (700, 45000), (1e8, 4e10)])
def test_ticks_reach_both_ends_of_the_axis_at_any_magnitude(low, high):
    """0.37x-1.44x once got "0.5x, 0.7x, 1x" with three of four bars past the last tick, and a
    38,000 MiB memory axis stopped at 5000 (ticks were only generated up to 9000)."""
    ticks = ratio_ticks(low, high)
    span = math.log(high / low)
    assert math.log(ticks[0] / low) <= span / 4 and math.log(high / ticks[-1]) <= span / 4
    if low < 0.9 and high > 1.2:
        assert any(t < 1 for t in ticks) and any(t > 1 for t in ticks)


def test_history_puts_commits_on_the_x_axis_in_date_order_with_log_y(tmp_path, monkeypatch):
    tree = tmp_path / "results"
    synthetic.write_results(tree, commits=3, machines=1)
    ((chart, points),) = vega_charts(app_on(tree, "views/history.py", monkeypatch))
    loaded = load_results(tree).measured
    dates = loaded.drop_duplicates("commit").sort_values("commit_date")
    expected = [f"{c[:8]} {d:%Y-%m-%d}" for c, d in zip(dates["commit"], dates["commit_date"], strict=True)]
    x = chart["encoding"]["x"]
    assert x["type"] == "nominal" and x["sort"] == expected  # one category per commit, oldest first
    assert all(layer["encoding"]["y"]["scale"]["type"] == "log" for layer in chart["layer"])
    for _, line in points.groupby("line"):
        assert list(line["commit"]) == expected  # every commit, never a time of day


def test_history_opens_on_one_machine(tmp_path, monkeypatch):
    """A CPU's and a GPU's lines on one log axis sit orders of magnitude apart: the history
    opens on one machine, and the link names it."""
    tree = tmp_path / "results"
    synthetic.write_results(tree, commits=3, machines=3)
    at = app_on(tree, "views/history.py", monkeypatch)
    assert not at.exception
    ((_, points),) = vega_charts(at)
    machines = {line.split(":")[0] for line in points["line"]}
    assert len(machines) == 1 and at.query_params["machine"] == machines.pop()
    # asked for two, it draws both
    at = app_on(tree, "views/history.py", monkeypatch, machine=["synthetic-cpu", "synthetic-h100"])
    ((_, points),) = vega_charts(at)
    assert {line.split(":")[0] for line in points["line"]} == {"synthetic-cpu", "synthetic-h100"}


@pytest.mark.parametrize("low, high", [(0.8, 1.1), (0.97, 1.04), (0.5, 1.0), (0.02, 3.5)])
def test_a_ratio_axis_has_at_least_three_ticks_inside_its_range(low, high):
    """A narrow range (every knob within 0.8x-1.1x) once got a lone "1x" tick."""
    ticks = ratio_ticks(low, high)
    assert len(ticks) >= 3 and all(low <= t <= high for t in ticks) and ticks == sorted(ticks)
    if high / low > 20:  # a wide range keeps the plain 1-2-5 steps
        assert {round(t / 10 ** math.floor(math.log10(t)), 6) for t in ticks} <= {1, 2, 5}


def test_a_narrow_chart_is_labelled_with_ratios_around_1x():
    s = pd.DataFrame({"case": ["a", "b"], "suite": ["S", "S"], "ratio": [0.9, 1.02],
                      "ratio_low": [0.88, 0.99], "ratio_high": [0.93, 1.05]})
    axis = _charts.ratio_chart(s, "case", "suite", "t").layout.xaxis
    assert len(axis.tickvals) >= 3 and 1 in axis.tickvals  # 1-2-5 steps gave only "1x" here
    low, high = (10 ** r for r in axis.range)
    assert low <= 0.88 and high >= 1.05 and all(low <= t <= high for t in axis.tickvals)  # all of them visible


def test_tables_leave_out_columns_no_row_has():
    frame = pd.DataFrame({"workload": ["mlp", "mlp"], "world": [None, None], "knob": ["", " "],
                          "ratio": [1.2, 0.9]})
    assert list(_tables.shown(frame).columns) == ["workload", "ratio"]
    assert list(_tables.shown(frame[["world"]]).columns) == ["world"]  # nothing left to show: keep it as it is


def test_memory_bars_put_each_variant_beside_its_own_baseline():
    """Checkpointing has 12 configurations (2 metrics x 3 workloads x 2 batches): grouped by
    configuration, a variant's bar stands next to its baseline's, one colour per variant, one
    bar per configuration and variant, and the axis in the tables' unit."""
    rows = pd.DataFrame([{"metric": m, "suite": "PeakMemory", "params": f"workload={w}, batch={b}, variant={v}",
                          "variant": v, "value": 3 * 2**30 if v == "none" else 2**30}
                         for m in ("peak_memory", "peak_activation_memory") for w in ("a", "b", "c")
                         for b in (4, 16) for v in ("none", "speedlib")])
    fig = json.loads(_charts.bars(rows, "bytes").to_json())
    traces, layout = fig["data"], fig["layout"]
    assert [t["name"] for t in traces] == ["none", "speedlib"]
    assert len({t["marker"]["color"] for t in traces}) == 2
    for trace in traces:
        assert len(labels(trace)) == 12 == len(set(labels(trace)))  # never two configurations in one bar
    assert labels(traces[0]) == labels(traces[1])
    assert set(lengths(traces[0])) == {3.0} and set(lengths(traces[1])) == {1.0}  # GiB, as the tables say
    assert layout["yaxis"]["title"]["text"].startswith("GiB") and "peak GPU memory" in layout["title"]["text"]


def test_the_machines_table_says_why_a_cpu_machine_has_no_driver(monkeypatch):
    at = app_on(ROOT / "results", "views/machines.py", monkeypatch)
    machines = frames(at)[0]
    cpu = machines[machines["machine"].str.startswith("cpu-")]
    assert (cpu["driver"] == "n/a (no GPU)").all()  # it read "None"
    assert machines["driver"].notna().all() and machines["CUDA (torch build)"].notna().all()
    assert "cpu_model" not in machines and cpu["CPU"].all()  # headers in words


def test_a_machine_is_described_by_every_environment_it_ran_in(monkeypatch):
    """cpu-2core-amd-epyc's newest commit was a dashboard-timing run with another torch build,
    and the page once described the whole machine by it; then it gave each environment a row,
    which repeated the machine (issue 51). One row per machine, described by the environment
    of its newest technique results, every other environment named in a column with its counts."""
    measured = load_results(ROOT / "results").measured
    # a machine the committed results hold under two torch builds (the Xeon timed the dashboard
    # under 2.15.0, then everything under 2.14.1); its older-version runs stay aside on the AMD
    builds = measured.groupby("machine")["torch"].nunique()
    machine = builds[builds > 1].index[0]
    cpu = measured[measured["machine"] == machine]
    at = app_on(ROOT / "results", "views/machines.py", monkeypatch)
    table = frames(at)[0]
    assert table["machine"].is_unique
    (row,) = table[table["machine"] == machine].to_dict("records")
    techniques = cpu[cpu["technique"].isin(report.TECHNIQUES)]
    assert row["torch"] == techniques.sort_values("commit_date")["torch"].iloc[-1]
    others = row["other environments"]
    assert {t for t in cpu["torch"] if t != row["torch"]} and all(
        f"torch {t}," in others for t in set(cpu["torch"]) - {row["torch"]})
    counted = sum(int(n) for n in re.findall(r"(\d+) results", others))
    assert row["results"] + counted == len(cpu)
    assert any("do not compare across them" in c.value for c in at.caption)


def test_sample_axes_write_out_their_log_ticks():
    """plotly's own log ticks read "1000, 5, 2, 100, 5, 2, 10" on the tuning page."""
    rows = pd.DataFrame({"suite": ["S", "S"], "variant": ["off", "on"], "params": ["variant=off", "variant=on"],
                         "workload": [None, None], "unit": "seconds", "value": [0.01, 1.2],
                         "samples": [[0.009, 0.011], [1.1, 1.3]]})
    axis = _charts.spread_chart(rows, "t").layout.yaxis
    assert axis.type == "log" and list(axis.ticktext) == [f"{t:g}" for t in axis.tickvals]
    assert {10, 100, 1000} <= set(axis.tickvals) and min(axis.tickvals) >= 7.5  # within the samples, padded


def test_comparing_a_cpu_with_a_gpu_warns_that_the_workloads_differ(monkeypatch):
    at = app_on(ROOT / "results", "views/machines.py", monkeypatch, a="cpu-2core-intel-xeon", b="h100-sxm-80gb")
    assert any("measure different work" in i.value for i in at.info)
    # Only each machine's speedups against its own baseline: a table once read "fp32: 107.5 ms |
    # 72.8 ms | 1.48x", an H100 "1.48x" a 2-core CPU, right under the warning.
    (machines, gpu_tests, speedups) = frames(at)  # the second: each GPU machine's GPU tests per commit
    assert list(speedups.columns[-2:]) == ["cpu-2core-intel-xeon", "h100-sxm-80gb"]
    paired = report.paired(report.latest(load_results(ROOT / "results").measured))
    h100 = paired[(paired["machine"] == "h100-sxm-80gb") & (paired["variant"] == "bf16_channels_last")
                  & (paired["technique"] == "amp") & (paired["workload"] == "resnet50")].iloc[0]
    row = speedups[(speedups["technique"] == "amp") & (speedups["variant"] == "bf16_channels_last")
                   & speedups["comparison"].str.contains("resnet50")].iloc[0]
    # the estimate every other table cites (it showed asv's median of the rounds, 3.23x against 3.18x)
    assert row["h100-sxm-80gb"].startswith(f"{h100.ratio:.3g}x [{h100.ratio_low:.3g}, {h100.ratio_high:.3g}]")


@pytest.mark.parametrize("values, expected", [([37.75, 38.4, 41.9, 42.1], [32, 34, 36, 38, 40, 42, 44, 46, 48, 50]),
                                              ([20.0, 72.8], [20, 50])])
def test_a_narrow_sample_axis_gets_a_few_even_ticks_not_dozens(values, expected):
    """DDP's H100 steps (38-42 ms) got some sixty overlapping ticks from steps meant for ratios."""
    axis = _charts.log_axis(values, "ms")
    assert 3 <= len(axis["tickvals"]) <= 10
    assert set(expected) & set(axis["tickvals"]) and axis["ticktext"] == [f"{t:g}" for t in axis["tickvals"]]
    assert min(axis["tickvals"]) <= min(values) * 1.2 and max(axis["tickvals"]) >= max(values) / 1.2


def test_history_writes_out_its_log_ticks(tmp_path, monkeypatch):
    tree = tmp_path / "results"
    synthetic.write_results(tree, commits=3, machines=1)
    ((chart, points),) = vega_charts(app_on(tree, "views/history.py", monkeypatch))
    (y,) = {json.dumps(layer["encoding"]["y"], sort_keys=True) for layer in chart["layer"] if layer["encoding"]["y"]
            ["field"] == "value"}
    y = json.loads(y)
    low, high = y["scale"]["domain"]
    ticks = y["axis"]["values"]
    assert y["scale"]["type"] == "log" and len(ticks) >= 3 and y["axis"]["format"] == "~g"  # 0.5, 1, 20: no "5e-1"
    assert low <= min(ticks) and max(ticks) <= high and low <= points["low"].min() and points["high"].max() <= high


def test_history_marks_each_point_as_the_history_flags_it(monkeypatch):
    """Each point's mark is what report.history found at that commit (the caption's x, diamond,
    square), drawn in the shape the chart's scale gives that mark."""
    at = app_on(ROOT / "results", "views/history.py", monkeypatch)
    ((chart, points),) = vega_charts(at)
    benchmark, machine = at.query_params["benchmark"], at.query_params["machine"]
    measured = load_results(ROOT / "results").measured
    h = report.history_table(measured[(measured["benchmark"] == benchmark) & (measured["machine"] == machine)],
                             benchmark).sources
    labels = history_chart.commit_labels(h)
    drawn_marks = {(r.line.split(": ", 1)[1], r.commit): r.mark for r in points.itertuples()}
    expected = {(r.params, labels[r.commit]): ("significant change" if r.significant else "no change")
                if not r.step else ("significant change and first commit of a step" if r.significant
                                    else "first commit of a step") for r in h.itertuples()}
    assert drawn_marks == expected and "significant change" in drawn_marks.values()  # the H200's d93fd5c1 gains
    (shape,) = [layer["encoding"]["shape"] for layer in chart["layer"] if "shape" in layer["encoding"]]
    assert shape["scale"]["domain"] == list(history_chart.MARKS) and len(set(shape["scale"]["range"])) == 4
    caption = " ".join(c.value for c in at.caption)  # what the shapes mean, said under the chart
    assert "x: significant change" in caption and "Diamonds: first commit" in caption and "squares: both" in caption
    assert [history_chart.MARKS[k] for k in list(history_chart.MARKS)[2:]] == ["diamond", "square"]


def test_history_draws_no_value_at_or_below_zero_and_sends_no_nan(tmp_path, monkeypatch):
    """A log axis has no 0: such a value is left out of the lines and points (clamped, it sat on
    the axis's floor as if measured there), and a missing interval is no NaN in the JSON."""
    tree = tmp_path / "results"
    synthetic.write_results(tree, commits=3, machines=1)
    measured = load_results(tree).measured
    benchmark = measured["benchmark"].iloc[0]
    h = report.history_table(measured[measured["benchmark"] == benchmark], benchmark).sources.reset_index(drop=True)
    h.loc[0, "value"], h.loc[1, "ci99_low"] = 0.0, math.nan
    chart = history_chart.spec(h, 1e3, "ms")
    assert json.dumps(chart, allow_nan=False)
    points = pd.DataFrame(chart["data"]["values"])
    assert points.loc[0, "value"] == 0 and points.loc[1, "low"] == points.loc[1, "value"]  # no interval: the value
    for layer in chart["layer"]:
        if layer["encoding"]["y"]["field"] == "value":
            assert layer["transform"] == [{"filter": "datum.value > 0"}]
    assert chart["layer"][0]["transform"] == [{"filter": "datum.high > 0"}]  # an interval wholly off the axis
    low, high = chart["layer"][1]["encoding"]["y"]["scale"]["domain"]
    assert low <= points.loc[points["value"] > 0, "value"].min() and high >= points["high"].max()


def test_history_draws_one_line_per_environment(monkeypatch):
    """cpu-2core-intel-xeon timed the dashboard with torch 2.15.0 and then 2.14.1: no line joins
    the two builds, and the table flags the boundary instead of a change."""
    benchmark, machine, params = ("bench_dashboard.FirstView.time_load_results", "cpu-2core-intel-xeon",
                                  "files=5000, cache=warm")
    at = app_on(ROOT / "results", "views/history.py", monkeypatch, benchmark=benchmark, machine=[machine],
                params=[params])
    ((_, points),) = vega_charts(at)
    lines = {name: [x.split()[0] for x in line["commit"]] for name, line in points.groupby("line", sort=False)}
    measured = load_results(ROOT / "results").measured
    rows = measured[(measured["benchmark"] == benchmark) & (measured["machine"] == machine)
                    & (measured["params"] == params)].sort_values("commit_date")
    builds = {t: [c[:8] for c in its["commit"]] for t, its in rows.groupby("torch", sort=False)}
    assert builds.keys() == {"2.15.0+cu132", "2.14.1+cu130"}  # what the committed results hold
    assert sorted(lines.values()) == sorted(builds.values())
    for name, commits in lines.items():  # each line named for its build
        (torch,) = [t for t, cs in builds.items() if cs == commits]
        assert name.startswith(f"{machine}: {params} (") and f"torch {torch}," in name
    assert any("One line per environment" in c.value for c in at.caption)
    (table,) = [d for d in frames(at) if "flag" in d.columns]
    assert table["flag"].iloc[-1] == "torch 2.15.0+cu132 -> 2.14.1+cu130, CUDA 13.2 -> 13.0: not compared"


def test_a_cpu_against_a_gpu_gets_no_chart_of_time_ratios(monkeypatch):
    """Their workloads differ in size: a chart once said the H100 ran DDP at 0.25x a 2-core CPU."""
    assert figures(ROOT / "results", "views/machines.py", monkeypatch, a="cpu-2core-intel-xeon",
                   b="h100-sxm-80gb") == []


def test_a_technique_page_opens_on_a_tab_with_results(monkeypatch):
    """The H100's transfer results are bandwidth only: the page opened on an empty Time tab."""
    at = app_on(ROOT / "results", "/transfer", monkeypatch, machine="h100-sxm-80gb")
    assert not at.exception and at.query_params["tab"] == "Bandwidth and floor"
    at = app_on(ROOT / "results", "/transfer", monkeypatch, machine="h100-sxm-80gb", tab="Memory")
    assert at.query_params["tab"] == "Memory"  # a link's tab wins
    assert any("its run did not include them" in i.value for i in at.info)


def test_the_floor_tab_draws_one_chart_per_reference(monkeypatch):
    """Gather (% of host->device) and write-back (% of device->host) once shared one axis,
    labelled with the first one's reference."""
    charts = figures(ROOT / "results", "/transfer", monkeypatch, machine="h100-sxm-80gb",
                     tab="Bandwidth and floor")
    axes = [layer["encoding"]["y"] for c, _ in charts for layer in c["layer"] if layer["mark"]["type"] == "bar"]
    titles = [y["title"] for y in axes if "% of" in y["title"]]
    assert len(titles) == len(set(titles)) >= 2
    # A % of a floor on a linear axis from 0, so that a bar's length is its share (issue 44: on a log
    # axis 11 % against 38.8 % was drawn about 1:10); bytes keep their log axis.
    for y in (y for y in axes if y["title"] in titles):
        assert y["scale"] == {"zero": True}


def test_tables_on_screen_put_the_numbers_beside_what_they_compare():
    """After a long benchmark name the speedup sat past the right edge of the screen."""
    frame = pd.DataFrame({"machine": ["m"], "GPU": ["H100"], "benchmark": ["bench_transfer.FractionOfFloor.track_x"],
                          "variant": ["cupy"], "baseline": ["pinned"], "value": ["38 %"], "speedup": ["0.914x"],
                          "N": [1], "why wider than 1.10x": ["..."]})
    shown = _tables.on_screen(frame, hide=("GPU",))
    # where it was measured after the numbers: at 1000 px the overview cut its speedups to "1."
    assert list(shown.columns) == ["benchmark", "variant", "baseline", "speedup", "N", "machine", "value",
                                   "why wider than 1.10x"]
    assert shown["benchmark"].tolist() == ["FractionOfFloor: x"]  # a metric without words keeps its name
    said = _tables.on_screen(frame.assign(benchmark="bench_transfer.FractionOfFloor.track_scatter_fraction_of_floor"))
    assert said["benchmark"].tolist() == ["FractionOfFloor: write-back, % of the pinned device->host copy"]
    assert frame["benchmark"].tolist() == ["bench_transfer.FractionOfFloor.track_x"]  # the table itself unchanged
    claims = pd.DataFrame({"technique": ["t"], "source": ["s"], "claim": ["c"], "claimed": ["3x"],
                           "measured as": ["m"], "machine": ["h"], "measured": ["1x"], "comparable": ["yes"]})
    assert list(_tables.on_screen(claims).columns) == ["technique", "source", "claim", "claimed", "measured",
                                                     "machine", "measured as", "comparable"]


def test_a_column_is_as_wide_as_its_longest_text_up_to_a_limit():
    """Streamlit sized columns from the first rows: "bf16_channels_last" further down read "bf16_channels_"."""
    frame = pd.DataFrame({"variant": ["bf16", "bf16_channels_last"], "note": ["x" * 500, ""]})
    w = {c: conf["width"] for c, conf in _tables.widths(frame).items()}
    assert w["variant"] >= 7 * len("bf16_channels_last") and w["note"] == _tables._MAX_PX


def test_every_technique_chart_names_the_machine(monkeypatch):
    """A technique page's charts had the benchmark class as their legend ("TrainingStep") and
    nothing about the machine: a screenshot of one lost which GPU it was."""
    charts = figures(ROOT / "results", "/tuning", monkeypatch, machine="h100-sxm-80gb")
    assert charts
    for chart, _ in charts:
        said = " ".join([title(chart), *chart["title"]["subtitle"]])  # a ratio chart's one machine: under its title
        assert "h100-sxm-80gb (NVIDIA H100 80GB HBM3)" in said, said


def test_the_overview_draws_checkpointings_memory_in_a_row_of_its_own(monkeypatch):
    """Checkpointing is about memory: its GPU cells were peak-memory ratios beside the CPUs' step
    times, in one row and one colour scale. Peak memory has its row (variant / baseline, exact,
    at the largest batch), the step time its own, and a CPU's memory cell says why it has none."""
    at = app_on(ROOT / "results", "views/overview.py", monkeypatch)
    said = {(c.question_id, c.machine_id): c for c in glance_cells(at).dropna(subset=["technique"]).itertuples()}
    last = report.latest(load_results(ROOT / "results").measured)
    for machine in ("h100-sxm-80gb", "h200-141gb"):
        rows = last[(last["machine"] == machine) & (last["suite"] == "PeakMemory")
                    & (last["technique"] == "checkpoint")]
        expected = report.memory_table(rows).sources
        expected = expected[(expected["metric"] == "peak_memory") & (expected["workload"] == "densenet_bc")
                            & (expected["variant"] == "speedlib")]
        row = expected[expected["batch"].astype(int) == expected["batch"].astype(int).max()].iloc[0]
        cell = said["checkpoint-memory", machine]  # the ratio in bold, the case in italics
        assert f"{row['ratio']:.3g}x" in cell.bold and f"batch={row['batch']}" in cell.italic and row["ratio"] < 1
        assert not re.search(r"\dx", said["checkpoint-time", machine].bold)  # no step time measured there: no number
    assert "needs a GPU" in cell_text(said["checkpoint-memory", "cpu-2core-intel-xeon"])
    assert re.search(r"\dx", said["checkpoint-time", "cpu-2core-intel-xeon"].bold)


def test_the_overview_claims_table_shows_every_cell_whole(monkeypatch):
    """In a grid the comparability and the machine sat past the right edge: a CPU figure stood
    beside a GPU claim with no warning in view. A static table wraps every cell."""
    at = app_on(ROOT / "results", "views/overview.py", monkeypatch)
    (claims,) = [read(t.value) for t in at.table if "comparable" in read(t.value).columns]
    assert {"claim", "claimed", "measured", "machine", "comparable"} <= set(claims.columns)
    cpu = claims[claims["machine"].astype(str).str.contains("CPU only")]
    assert len(cpu) and cpu["comparable"].astype(str).str.startswith("no:").all()


def test_a_single_device_run_of_a_several_device_comparison_says_so_on_its_page(monkeypatch):
    at = app_on(ROOT / "results", "/parallel", monkeypatch, machine="h100-sxm-80gb")
    assert any("one device only" in i.value and "headline-parallel" in i.value for i in at.info)


def test_a_technique_page_lists_what_never_ran_on_the_machine_and_how_to_run_it(monkeypatch):
    """The H100 transfer page's Not measured tab said "Nothing was skipped or failed" while its
    Time tab was empty: the classes its run never selected were listed nowhere."""
    at = app_on(ROOT / "results", "/transfer", monkeypatch, machine="h100-sxm-80gb", tab="Not measured")
    never = [d for d in frames(at) if "measured by" in d.columns]
    assert len(never) == 1
    by_chunk = never[0].groupby("measured by")["benchmark"].apply(set).to_dict()
    assert set(by_chunk) == {"speedlib run --chunk transfer-parallel", "speedlib run --chunk headline-transfer",
                             "speedlib run --chunk transfer-roofline", "speedlib run --chunk transfer-hypotheses"}
    assert "EmbeddingStep.track_seconds" in by_chunk["speedlib run --chunk transfer-parallel"]
    assert "Transfer.track_seconds" in by_chunk["speedlib run --chunk headline-transfer"]  # the paired gather
    # the roofline (issue 52), added after every committed run
    for cls, chunk in (("Roofline", "transfer-roofline"), ("RooflineHypotheses", "transfer-hypotheses")):
        assert by_chunk[f"speedlib run --chunk {chunk}"] == {
            f"{cls}.track_roofline_{t}" for t in ("gather", "scatter", "gather_bandwidth", "scatter_bandwidth",
                                                  "h2d_floor", "d2h_floor", "gather_bus_bytes", "scatter_bus_bytes")}
    # FractionOfFloor's GB/s tracks came after the H100's headline-transfer run: its chunk measures them,
    # and the paired Transfer class, which that chunk holds since the glance reads it (issue 51)
    assert {f"FractionOfFloor.track_{t}" for t in ("h2d_floor", "d2h_floor", "gather_bandwidth", "scatter_bandwidth")} \
        <= by_chunk["speedlib run --chunk headline-transfer"]
    # and the Time tab names the chunk that times the variants taking turns; a page draws its open tab alone
    assert not any("speedlib run --chunk headline-transfer" in i.value for i in at.info)
    at = app_on(ROOT / "results", "/transfer", monkeypatch, machine="h100-sxm-80gb", tab="Time")
    assert any("speedlib run --chunk headline-transfer" in i.value for i in at.info)


def test_never_run_leaves_out_what_ran_or_was_skipped():
    rows = pd.DataFrame({"machine": ["m", "m", "other"], "benchmark": ["bench_t.A.track_x", "bench_t.B.track_y",
                                                                      "bench_t.C.track_z"]})
    suite = ["bench_t.A.track_x", "bench_t.B.track_y", "bench_t.C.track_z", "bench_u.D.track_w",
             "bench_t.A.track_interference", "bench_t.A.track_gpu_clock"]  # counters: no rows of their own
    assert report.never_run(suite, rows, "t", "m")["benchmark"].tolist() == ["bench_t.C.track_z"]


def test_still_missing_is_each_benchmarks_newest_state_without_a_number():
    """An outdated result measured again at a later commit is no longer missing; a skip at every
    commit is listed once, at its newest; a later skip after a measurement is missing again."""
    day = pd.Timestamp("2026-11-01", tz="UTC")
    run = {"params": "v=a", "run_date": day}

    def rows(*at):
        return pd.DataFrame([{**run, "machine": m, "benchmark": b, "commit_date": day + pd.Timedelta(days=d),
                              "status": status} for m, b, d, status in at])
    measured = rows(("m", "bench_t.A.track_x", 2, "measured"), ("m", "bench_t.C.track_z", 1, "measured"),
                    ("other", "bench_t.B.track_y", 9, "measured"))
    missing = rows(("m", "bench_t.A.track_x", 1, "outdated"),  # measured again since
                   ("m", "bench_t.B.track_y", 1, "skipped"), ("m", "bench_t.B.track_y", 3, "skipped"),
                   ("m", "bench_t.C.track_z", 4, "failed"))  # failed after it was measured
    left = report.still_missing(missing, measured)
    assert [(r.benchmark, r.commit_date.day, r.status) for r in left.itertuples()] == [
        ("bench_t.B.track_y", 4, "skipped"), ("bench_t.C.track_z", 5, "failed")]


def test_the_not_measured_tab_leaves_out_what_a_later_run_measured(monkeypatch):
    """The H200's mixed-precision tab listed TrainingStep resnet50 fp32 as outdated at 838236ba while
    its Time tab showed that figure at d93fd5c1: an old result superseded is not missing."""
    measured = load_results(ROOT / "results").measured
    again = measured[(measured["machine"] == "h200-141gb") & (measured["benchmark"] == "bench_amp.TrainingStep"
                                                             ".track_seconds") & (measured["params"] == "workload="
                                                                                  "resnet50, variant=fp32")]
    assert again["commit"].str[:8].tolist() == ["d93fd5c1"]  # the case this guards
    at = app_on(ROOT / "results", "/amp", monkeypatch, machine="h200-141gb", tab="Not measured")
    (listed,) = [d for d in frames(at) if "why" in d.columns]
    assert not listed.empty and "outdated" not in set(listed["status"])
    assert not ((listed["benchmark"] == "TrainingStep.track_seconds")
                & (listed["params"] == "workload=resnet50, variant=fp32")).any()


def test_a_table_too_wide_for_1440px_becomes_a_static_table_that_wraps():
    """Streamlit's grid cannot wrap a cell, so a table whose columns do not fit scrolled
    sideways at 1440 px and hid its right-hand columns: _tables.show draws it as a static table."""
    narrow = pd.DataFrame({"variant": ["speedlib"], "speedup": ["1.2x [1.1, 1.3]"]})
    assert _tables.fits(narrow)
    wide = pd.DataFrame({f"column {i}": ["a value of some thirty characters"] for i in range(6)})
    assert not _tables.fits(wide)
    long_note = pd.DataFrame({"why wider than 1.10x": ["x" * 200]})  # one column, cut at _MAX_PX: wrap it
    assert not _tables.fits(long_note)


def test_the_comparison_index_links_each_technique_once_and_escapes_result_text():
    frame = pd.DataFrame({"technique": ["Mixed precision", "Mixed precision"], "page": ["amp", "amp"],
                          "comparison": ["TrainingStep: [evil](http://x) vs fp32", "TrainingStep: a|b vs fp32"],
                          "m (GPU)": ["<b>2x</b>", ""]})
    text = _tables.comparison_index(report.Table("t", frame, frame, []))
    rows = text.splitlines()
    assert rows[0] == "| technique | comparison | m (GPU) |" and len(rows) == 4
    assert rows[2].startswith("| [Mixed precision](./amp) |") and rows[3].startswith("|  |")  # linked once
    assert "[evil](" not in text and "\\[evil\\]" in text and "<b>" not in text  # no link, no HTML from a file
    assert "a\\|b" in rows[3] and rows[3].endswith("| not measured |")  # a pipe cannot add a column


def _floor_gbps_tree(tmp_path: Path) -> Path:
    """The committed results, with the H100's FractionOfFloor run as a run of today's benchmark
    records it: each % beside its GB/s and floor (cupy's gather: 12.5 GB/s over 25 GB/s, 50 %)."""
    tree = tmp_path / "results"
    shutil.copytree(ROOT / "results", tree)
    (result,) = (tree / "h100-sxm-80gb").glob("bdb0cb6d-*.json")
    data = json.loads(result.read_text())
    benchmarks = json.loads((tree / "benchmarks.json").read_text())
    cls = "bench_transfer.FractionOfFloor"
    for op, direction, floor in (("gather", "h2d", 25.0), ("scatter", "d2h", 20.0)):
        entry = data["results"][f"{cls}.track_{op}_fraction_of_floor"]
        variants = [v.strip("'") for v in entry[1][0]]
        entry[0][variants.index("cupy")] = 50.0 if op == "gather" else 40.0
        for metric, values in ((f"{op}_bandwidth", [p * floor / 100 for p in entry[0]]),
                               (f"{direction}_floor", [floor] * len(entry[0]))):
            name = f"{cls}.track_{metric}"
            data["results"][name] = [values, entry[1], "gbps-test", entry[3], 1.0]
            meta = dict(benchmarks[f"{cls}.track_{op}_fraction_of_floor"])
            benchmarks[name] = {**meta, "name": name, "unit": "GB/s", "version": "gbps-test"}
    result.write_text(json.dumps(data))
    (tree / "benchmarks.json").write_text(json.dumps(benchmarks))
    return tree


def test_the_floor_tab_shows_the_gbps_beside_each_percent(tmp_path, monkeypatch):
    """The floor table and each bar's hover give the GB/s achieved and the floor's GB/s, in the
    same words; those GB/s are no second table of speedups below it."""
    at = app_on(_floor_gbps_tree(tmp_path), "/transfer", monkeypatch, machine="h100-sxm-80gb",
                tab="Bandwidth and floor")
    assert not at.exception, at.exception
    (floor,) = [f for f in frames(at) if "floor GB/s" in f.columns]
    assert list(floor.columns[:6]) == ["benchmark", "variant", "achieved", "of", "GB/s", "floor GB/s"]
    gather = floor[floor["benchmark"].str.contains("gather") & (floor["variant"] == "cupy")]
    assert gather[["achieved", "GB/s", "floor GB/s"]].values.tolist() == [["50.0 %", "12.5 GB/s", "25.0 GB/s"]]
    scatter = floor[floor["benchmark"].str.contains("write-back") & (floor["variant"] == "cupy")]
    assert scatter[["achieved", "GB/s", "floor GB/s"]].values.tolist() == [["40.0 %", "8.0 GB/s", "20.0 GB/s"]]
    assert not (floor[["GB/s", "floor GB/s"]] == report.NOT_RECORDED).any().any()
    hovers = {}
    for chart, values in drawn(at):
        (bar,) = [layer for layer in chart["layer"] if layer["mark"]["type"] == "bar"]
        tip = [f["field"] for f in bar["encoding"]["tooltip"]]
        if "floor GB/s" in tip:
            hovers[bar["encoding"]["y"]["title"]] = (values[values["variant"] == "cupy"], tip)
    (gather, tip), = [h for axis, h in hovers.items() if "host->device" in axis]
    assert gather[["achieved", "GB/s", "floor GB/s"]].values.tolist() == [["50.0 %", "12.5 GB/s", "25.0 GB/s"]]
    assert tip[-3:] == ["achieved", "GB/s", "floor GB/s"]  # the table's own text, in its order
    shown = pd.concat(frames(at)).astype(str)
    assert not shown.apply(lambda c: c.str.contains("gather bandwidth, random rows|copy, the gather's floor")) \
        .any().any()


def test_the_floor_tab_says_not_recorded_where_a_run_kept_only_the_percent(monkeypatch):
    """The committed H100 run predates FractionOfFloor's GB/s: the page says so, and shows no
    number it did not measure; a CPU machine's floor tab (Adam's step bandwidth) still draws."""
    at = app_on(ROOT / "results", "/transfer", monkeypatch, machine="h100-sxm-80gb", tab="Bandwidth and floor")
    assert not at.exception, at.exception
    (floor,) = [f for f in frames(at) if "achieved" in f.columns]
    # no column of "not recorded": the columns are left out, and one note says why
    assert len(floor) == 10 and "GB/s" not in floor.columns and "floor GB/s" not in floor.columns
    assert any(c.value.startswith(f"{report.NOT_RECORDED}: no GB/s result exists for bdb0cb6d FractionOfFloor")
               for c in at.caption)
    for chart, values in drawn(at):
        (bar,) = [layer for layer in chart["layer"] if layer["mark"]["type"] == "bar"]
        assert [f["field"] for f in bar["encoding"]["tooltip"]][-1] == "achieved"  # no GB/s it did not measure
        assert "GB/s" not in values and "floor GB/s" not in values
    at = app_on(ROOT / "results", "/contiguous", monkeypatch, machine="cpu-2core-intel-xeon",
                tab="Bandwidth and floor")
    assert not at.exception, at.exception
    (floor,) = [f for f in frames(at) if "achieved" in f.columns]
    assert floor["GB/s"].str.endswith(" GB/s").all() and "floor GB/s" not in floor.columns
    assert any(c.value.startswith(f"floor GB/s {report.NOT_RECORDED} for bench_contiguous.AdamStep")
               for c in at.caption)
    at = app_on(ROOT / "results", "/transfer", monkeypatch, machine="cpu-2core-intel-xeon",
                tab="Bandwidth and floor")
    assert not at.exception, at.exception


def test_history_opens_on_a_gpu_series_and_flags_no_cpu_noise(tmp_path, monkeypatch):
    """Issue 44: the History page opened on a contended 2-core CPU's amp step, flagging tf32's
    "+282.9 %" at 6931fd01 as a regression while the two runs' 99 % intervals overlapped. It opens
    on a GPU machine's series measured at two commits, and that jump is no longer a flag."""
    at = app_on(ROOT / "results", "views/history.py", monkeypatch)
    assert not at.exception, at.exception
    assert (at.query_params["benchmark"], at.query_params["machine"]) == (
        "bench_contiguous.AdamStep.track_seconds", "h200-141gb")
    # the AMD's runs of that version, alone in a tree (newer versions set them aside in results/)
    tree = tmp_path / "results"
    amd = ROOT / "results" / "cpu-2core-amd-epyc"
    (tree / amd.name / "environment").mkdir(parents=True)
    shutil.copy(ROOT / "results" / "benchmarks.json", tree)
    shutil.copy(amd / "machine.json", tree / amd.name)
    for commit in ("151a8d3f", "a4218466", "6931fd01"):
        shutil.copy(next(amd.glob(f"{commit}-*.json")), tree / amd.name)
        shutil.copy(amd / "environment" / f"{commit}.jsonl", tree / amd.name / "environment")
    measured = load_results(tree).measured
    h = report.history(measured[measured["benchmark"] == "bench_amp.TrainingStep.track_seconds"])
    tf32 = h[(h["machine"] == "cpu-2core-amd-epyc") & (h["params"] == "workload=resnet50, variant=tf32")
             & h["commit"].str.startswith("6931fd01")].iloc[0]
    assert tf32["change"] > 2.8 and not tf32["significant"] and "intervals overlap" in tf32["test"]


def _marked() -> pd.DataFrame:
    """Ratios of every kind a bar can be: sure, unsure (interval includes 1x), lone (no interval),
    contended, and one with no length (a ratio over 0), on two machines."""
    s = pd.DataFrame({"case": ["sure win", "unsure", "sure loss", "no interval", "over zero"], "suite": ["S"] * 5,
                      "ratio": [2.0, 1.05, 0.5, 1.3, math.inf], "ratio_low": [1.8, 0.9, 0.4, math.nan, math.nan],
                      "ratio_high": [2.2, 1.2, 0.6, math.nan, math.nan], "n": [30, 30, 30, math.nan, 30]})
    return pd.concat([s, s.assign(suite="T")], ignore_index=True)


def test_the_dashboards_ratio_bars_are_the_sites_bar_for_bar():
    """The dashboard's Vega-Lite ratio chart and the site's plotly one draw the same bars: labels,
    lengths from 1x, which are hollow or pale, the hover's interval and N, and the notes."""
    s = _marked()
    fig = _charts.ratio_chart(s, "case", "suite", "t")
    spec = vega.ratio_spec(s, "case", "suite", "t")
    values = pd.DataFrame(spec["data"]["values"])
    assert json.dumps(spec, allow_nan=False)  # no NaN reaches the browser
    for trace in fig.data:
        mine = values[values["group"] == trace.name]
        assert list(mine["label"]) == list(trace.y)
        plotly_ratio = [None if pd.isna(x) else 1.0 + x for x in trace.x]
        assert [None if pd.isna(r) else r for r in mine["ratio"]] == pytest.approx(plotly_ratio)
        assert list(mine["unsure"]) == [c == "white" for c in trace.marker.color]
        assert list(mine["lone"]) == [p == "/" for p in trace.marker.pattern.shape]
        assert list(mine["interval"]) == [c[1] for c in trace.customdata]
        assert list(mine["n"]) == [c[2] for c in trace.customdata] and list(mine["said"]) == [c[3] for c in
                                                                                             trace.customdata]
    (note,) = fig.layout.annotations
    said = " ".join(line.strip() for line in spec["title"]["subtitle"])  # above the bars, in a phone's width
    assert note.text.count("<br>") + 1 == 2 and "includes 1x" in said and "single value per variant" in said
    assert vega.LOOKS["unsure"] in said and vega.LOOKS["lone"] in said  # in the words of what this chart draws
    assert all(len(line) <= 56 for line in spec["title"]["subtitle"])
    sure = s[s["case"].isin(["sure win", "sure loss"])]
    assert vega.ratio_spec(sure, "case", "suite", "t")["title"]["subtitle"] == []  # no note without a marked bar


def test_a_vega_ratio_bar_is_drawn_as_the_note_says():
    """Hollow with a dotted outline where the interval includes 1x, pale with a dashed outline
    where there is no interval; every colour from one scale over the groups, fill and outline alike;
    no bar for a ratio over 0; the error bar only where there is an interval."""
    spec = vega.ratio_spec(_marked(), "case", "suite", "t")
    bar, rule, marks, one = spec["layer"]
    e = bar["encoding"]
    assert e["fill"]["condition"] == {"test": "datum.unsure", "value": "white"} and e["fill"]["field"] == "group"
    assert e["stroke"]["scale"] == e["fill"]["scale"] and e["fill"]["scale"]["domain"] == ["S", "T"]
    assert e["strokeDash"]["condition"][0] == {"test": "datum.unsure", "value": [2, 2]}
    pale = {c["test"]: c["value"] for c in e["fillOpacity"]["condition"]}
    assert pale["datum.busy"] < pale["datum.lone"] < 1  # contended: paler than a lone bar
    assert bar["transform"] == [{"filter": "isValid(datum.ratio) && datum.ratio > 0"}]
    # a ratio over 0 keeps its row, empty, as in the site's chart (its label had vanished with its bar)
    assert e["y"]["scale"]["domain"] == e["y"]["sort"] and "over zero" in e["y"]["scale"]["domain"]
    assert rule["encoding"]["x"]["field"] == "low" and rule["encoding"]["x2"] == {"field": "high"}
    assert one["encoding"] == {"x": {"datum": 1.0}} and one["mark"]["strokeDash"]
    values = pd.DataFrame(spec["data"]["values"])
    assert values.loc[values["label"] == "over zero", "ratio"].isna().all()
    assert spec["height"] == {"step": 48}  # a slot per label and machine, two lines of a phone's label in each


def test_a_vega_ratio_axis_is_logarithmic_with_ratio_ticks_inside_it():
    s = pd.DataFrame({"case": ["a", "b"], "suite": ["S", "S"], "ratio": [0.03, 3.2],
                      "ratio_low": [0.025, 3.0], "ratio_high": [0.04, 3.4]})
    x = vega.ratio_spec(s, "case", "suite", "t")["layer"][0]["encoding"]["x"]
    low, high = x["scale"]["domain"]
    ticks = x["axis"]["values"]
    assert x["scale"]["type"] == "log" and x["scale"]["nice"] is False and 1 in ticks
    assert low <= 0.025 and high >= 3.4 and all(low <= t <= high for t in ticks)
    assert ticks == list(_charts.ratio_chart(s, "case", "suite", "t").layout.xaxis.tickvals)  # the site's ticks
    assert x["axis"]["labelExpr"] == "datum.label + 'x'" and x["axis"]["format"] == "~g"


def test_vega_sample_boxes_hold_every_sample_and_keep_configurations_apart():
    rows = pd.DataFrame({"suite": ["AdamStep", "Iteration", "AdamStep"], "variant": ["speedlib"] * 3,
                         "params": ["workload=mlp, variant=speedlib"] * 2 + ["workload=resnet50, variant=speedlib"],
                         "workload": ["mlp", "mlp", "resnet50"], "unit": "seconds", "value": [1.0, 2.0, 3.0],
                         "samples": [[1.0, 1.1, 1.4, 0.9], [2.0], []]})
    spec = vega.spread_spec(rows, "t")
    values = pd.DataFrame(spec["data"]["values"])
    boxes, points = values[values["kind"] == "box"], values[values["kind"] == "sample"]
    assert sorted(boxes["config"]) == ["AdamStep: mlp", "AdamStep: resnet50", "Iteration: mlp"]
    mlp = boxes[boxes["config"] == "AdamStep: mlp"].iloc[0]
    assert (mlp["low"], mlp["median"], mlp["high"], mlp["n"]) == pytest.approx((900.0, 1050.0, 1400.0, 4))  # ms
    assert (mlp["q1"], mlp["q3"]) == pytest.approx((950.0, 1250.0))  # plotly's default quartiles, as on the site
    assert sorted(points["value"]) == pytest.approx([900.0, 1000.0, 1100.0, 1400.0, 2000.0, 3000.0])  # none lost
    y = spec["layer"][-1]["encoding"]["y"]
    assert y["scale"]["type"] == "log" and y["title"] == "ms (log scale)"
    assert y["axis"]["values"] == list(_charts.spread_chart(rows, "t").layout.yaxis.tickvals)  # the site's ticks


def test_vega_memory_bars_put_each_variant_beside_its_own_baseline():
    rows = pd.DataFrame([{"metric": m, "suite": "PeakMemory", "params": f"workload={w}, batch={b}, variant={v}",
                          "variant": v, "value": 3 * 2**30 if v == "none" else 2**30}
                         for m in ("peak_memory", "peak_activation_memory") for w in ("a", "b", "c")
                         for b in (4, 64, 16) for v in ("none", "speedlib")])
    spec = vega.bars_spec(rows, "bytes")
    values = pd.DataFrame(spec["data"]["values"])
    assert len(values) == 36 and not values.duplicated(["config", "variant"]).any()  # never two in one bar
    assert set(values.loc[values["variant"] == "none", "value"]) == {3.0}  # GiB, as the tables say
    assert spec["encoding"]["xOffset"]["field"] == "variant"  # each variant beside its baseline
    order = spec["encoding"]["x"]["sort"]
    assert order.index("peak GPU memory: a, batch=4") < order.index("peak GPU memory: a, batch=16") \
        < order.index("peak GPU memory: a, batch=64")  # numbers compare as numbers
    y = spec["layer"][0]["encoding"]["y"]
    assert y["title"] == "GiB (log scale)" and "peak GPU memory" in title(spec)
    assert spec["layer"][0]["encoding"]["y2"] == {"datum": y["scale"]["domain"][0]}  # a bar stands on the floor


def test_a_vega_ratio_chart_names_its_one_machine_under_its_title_and_several_in_a_legend():
    """plotly hid a lone trace's legend, and a CPU-only chart beside CPU-and-GPU ones read as a GPU's;
    beside a phone's labels a one-entry legend ran off the screen. One machine is named under the
    title, several in a legend of two entries a row on a phone, four on a wider screen."""
    s = pd.DataFrame({"case": ["a"], "machine": ["cpu-2core-intel-xeon (CPU only)"], "ratio": [0.7],
                      "ratio_low": [0.6], "ratio_high": [0.8]})
    one = vega.ratio_spec(s, "case", "machine", "t")
    assert one["title"]["subtitle"][0] == "cpu-2core-intel-xeon (CPU only)"
    assert one["layer"][0]["encoding"]["fill"]["legend"] is None
    two = vega.ratio_spec(pd.concat([s, s.assign(machine="h100-sxm-80gb")]), "case", "machine", "t")
    assert not any("cpu-2core" in line for line in two["title"]["subtitle"])
    legend = two["layer"][0]["encoding"]["fill"]["legend"]
    assert legend["columns"] == {"expr": "containerSize()[0] < 700 ? 2 : 4"}


def test_vega_charts_draw_no_row_without_a_variant_as_the_site_does():
    """The site's plotly charts draw a trace per variant, so a row without one draws nothing; the
    Vega-Lite ones drew it as a variant named "nan"."""
    rows = pd.DataFrame({"suite": ["S"] * 2, "variant": ["on", None], "params": ["variant=on", "x=1"],
                         "metric": ["peak_memory"] * 2, "workload": [None, None], "unit": "seconds",
                         "value": [1.0, 2.0], "samples": [[1.0, 1.1], [2.0]]})
    spread = pd.DataFrame(vega.spread_spec(rows, "t")["data"]["values"])
    bars = pd.DataFrame(vega.bars_spec(rows.assign(unit="bytes"), "bytes")["data"]["values"])
    assert set(spread["variant"]) == {"on"} and len(spread) == 3  # its box and two samples
    assert list(bars["variant"]) == ["on"]
