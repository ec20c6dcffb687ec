"""The host-gather roofline (bench_transfer.Roofline and RooflineHypotheses, issue 52): where each
path leaves the pinned-copy floor, one axis at a time around the suite's point, and what the
'uva' kernel's hypotheses change there.

A point's name says its coordinates ("row 64 B", "batch 1024", "table 40 GB", "order zipf";
"default (row 512 B, batch 131072, table 5.12 GB, order random)" lies on every axis), so the
results explain themselves without the benchmark module. `figures` joins each (variant, point)'s
eight tracks into one row; `along` lays a class's figures along one axis; `roofline_table` is
`speedlib report --table roofline` and the transfer page's table; `not_measured` is what a page
says before a GPU has run the chunk. The floor table (speedbench.report.floors) leaves these
classes to this one: its rows are one % per variant, these a grid.
"""

from __future__ import annotations

import re

import pandas as pd

from speedbench import chunks
from speedbench.report.marks import _commit_label, contended, earlier_version, gpu_tests_failed, with_earlier_note
from speedbench.report.rows import Table, newest_runs
from speedbench.techniques import TECHNIQUES

__all__ = ["SUITES", "AXES", "is_roofline", "point_axis", "figures", "along", "variant_order", "point_order",
           "roofline_table", "not_measured", "MEASURE"]

SUITES = ("Roofline", "RooflineHypotheses")
# Each axis, in words, with its unit.
AXES = {"row": "row width (bytes)", "batch": "batch (rows)", "table": "table size (GB)", "order": "index order"}
ORDERS = ("random", "sorted", "zipf")
# metric -> the column of `figures` it fills
METRICS = {"roofline_gather": "gather", "roofline_scatter": "scatter",
           "roofline_gather_bandwidth": "gather_gbps", "roofline_scatter_bandwidth": "scatter_gbps",
           "roofline_h2d_floor": "h2d_floor", "roofline_d2h_floor": "d2h_floor",
           "roofline_gather_bus_bytes": "gather_bus", "roofline_scatter_bus_bytes": "scatter_bus"}
# The command that measures the roofline (its classes' chunks), as pages that lack it say.
MEASURE = "speedlib run " + " ".join(dict.fromkeys(
    chunks.how_to_measure(f"bench_transfer.{suite}.").removeprefix("speedlib run ") for suite in SUITES))
_DEFAULT = re.compile(r"default \(row (\d+) B, batch (\d+), table ([\d.]+) GB, order (\w+)\)$")
_ONE = re.compile(r"(row|batch|table|order) ([\w.]+)(?: (?:B|GB))?$")


def is_roofline(df: pd.DataFrame) -> pd.Series:
    """Per row: a result of the roofline's classes."""
    if "suite" not in df:
        return pd.Series(False, index=df.index, dtype=bool)
    return df["technique"].eq("transfer") & df["suite"].isin(SUITES)


def point_axis(point: str) -> dict[str, float | str]:
    """{axis: value} a point lies on: every axis for the default point, one for the others
    (row bytes, batch rows, table GB, order); {} for a name of no roofline point."""
    found = _DEFAULT.match(str(point))
    if found:
        row, batch, table, order = found.groups()
        return {"row": float(row), "batch": float(batch), "table": float(table), "order": order}
    found = _ONE.match(str(point))
    if not found:
        return {}
    axis, value = found.groups()
    if axis == "order":
        return {"order": value}
    try:
        return {axis: float(value)}
    except ValueError:
        return {}


def variant_order(variants) -> list[str]:
    """The transfer record's order (the benchmark's words), unknown names after, sorted."""
    known = list(TECHNIQUES["transfer"].variants)
    return sorted(dict.fromkeys(variants), key=lambda v: (known.index(v) if v in known else len(known), v))


def figures(df: pd.DataFrame) -> pd.DataFrame:
    """One row per roofline result (machine, commit, class, variant, point; its newest run):
    gather and scatter (% of the floor), gather_gbps and scatter_gbps, h2d_floor and d2h_floor
    (GB/s), gather_bus and scatter_bus (bytes a row costs on the bus), row (the row's own bytes),
    useful_gather and useful_scatter (% of the bus's bytes that are the row's), the marks of the
    tracks it is made of (earlier_version: any; contention and the GPU tests: the run's) and
    their result IDs. NaN where a track has no value."""
    s = newest_runs(df[is_roofline(df) & df["metric"].isin(list(METRICS))])
    keys = ["machine", "gpu", "commit", "commit_date", "suite", "variant", "point"]
    marks = ["earlier_version", "contention", "gpu_tests", "gpu_tests_note", "result_ids"]
    columns = [*keys, *METRICS.values(), "row", "useful_gather", "useful_scatter", *marks]
    if s.empty or "point" not in s:
        return pd.DataFrame(columns=columns)
    s = s.assign(_column=s["metric"].map(METRICS))
    for column in marks[:-1]:
        if column not in s:
            s[column] = False if column == "earlier_version" else None
    wide = s.pivot_table(index=keys, columns="_column", values="value", aggfunc="last", dropna=False,
                         observed=True).reset_index()
    wide = wide.dropna(subset=[c for c in METRICS.values() if c in wide], how="all")
    for column in METRICS.values():
        if column not in wide:
            wide[column] = float("nan")
    groups = s.assign(earlier_version=s["earlier_version"].fillna(False).astype(bool)).groupby(keys, observed=True)
    said = pd.DataFrame({"earlier_version": groups["earlier_version"].any(),
                         **{c: groups[c].first() for c in ("contention", "gpu_tests", "gpu_tests_note")},
                         "result_ids": groups["result_id"].agg(lambda r: ", ".join(map(str, r)))}).reset_index()
    wide = wide.merge(said, on=keys, how="left")
    row = wide["point"].map(lambda p: point_axis(p).get("row", 512.0))
    return wide.assign(row=row, useful_gather=100 * row / wide["gather_bus"],
                       useful_scatter=100 * row / wide["scatter_bus"])[columns].reset_index(drop=True)


def along(fig: pd.DataFrame, axis: str) -> pd.DataFrame:
    """The rows of `figures` on `axis` (its points and the default one), each with `x`, its
    value there (bytes, rows, GB, or the order's name), sorted by it."""
    xs = fig["point"].map(lambda p: point_axis(p).get(axis))
    on = fig[xs.notna()].assign(x=xs[xs.notna()])
    if on.empty:
        return on
    key = on["x"].map(ORDERS.index) if axis == "order" else on["x"]
    return on.assign(_key=key).sort_values(["_key", "variant"], kind="stable").drop(columns="_key")


def _pct(value: float) -> str:
    return "" if pd.isna(value) else f"{value:.1f} %"


def _gbps(value: float) -> str:
    return "" if pd.isna(value) else f"{value:.1f} GB/s"


def _bytes(value: float) -> str:
    return "" if pd.isna(value) else f"{value:.4g} B"


def roofline_table(df: pd.DataFrame) -> Table:
    """The roofline's figures of `df`, one row per (machine, commit, class, variant, point):
    gather and write-back as % of the pinned copy floor beside their GB/s and the floors',
    and the bytes a row costs on the bus with the share of them that is the row."""
    fig = figures(df)
    order = {p: i for i, p in enumerate(sorted(set(fig["point"]), key=point_order))}
    variants = {v: i for i, v in enumerate(variant_order(fig["variant"]))}
    fig = fig.assign(_s=fig["suite"].map(SUITES.index), _p=fig["point"].map(order), _v=fig["variant"].map(variants))
    fig = fig.sort_values(["machine", "commit_date", "_s", "_p", "_v"], kind="stable").drop(
        columns=["_s", "_p", "_v"]).reset_index(drop=True)
    sources = df[is_roofline(df) & df["metric"].isin(list(METRICS))]
    frame = pd.DataFrame({
        "machine": fig["machine"], "GPU": fig["gpu"], "commit": _commit_label(fig), "class": fig["suite"],
        "variant": fig["variant"], "point": fig["point"].where(~fig["point"].str.startswith("default"), "default"),
        "gather": fig["gather"].map(_pct), "gather GB/s": fig["gather_gbps"].map(_gbps),
        "h2d floor": fig["h2d_floor"].map(_gbps), "write-back": fig["scatter"].map(_pct),
        "write-back GB/s": fig["scatter_gbps"].map(_gbps), "d2h floor": fig["d2h_floor"].map(_gbps),
        "bus bytes a row": fig["gather_bus"].map(_bytes), "row's share": fig["useful_gather"].map(_pct),
    }).reset_index(drop=True)
    data = pd.DataFrame({
        "machine": fig["machine"], "gpu": fig["gpu"], "commit": fig["commit"], "technique": "transfer",
        "benchmark": "bench_transfer." + fig["suite"], "variant": fig["variant"], "point": fig["point"],
        "gather_pct": fig["gather"], "scatter_pct": fig["scatter"], "gather_gbps": fig["gather_gbps"],
        "scatter_gbps": fig["scatter_gbps"], "h2d_floor_gbps": fig["h2d_floor"], "d2h_floor_gbps": fig["d2h_floor"],
        "gather_bus_bytes": fig["gather_bus"], "scatter_bus_bytes": fig["scatter_bus"], "row_bytes": fig["row"],
        # the marks as columns, as every table's CSV has them: †, ‡ and §
        "earlier_version": earlier_version(fig), "contended": contended(fig), "gpu_tests_failed": gpu_tests_failed(fig),
        "gpu_tests": fig["gpu_tests"], "result_ids": fig["result_ids"]}).reset_index(drop=True)
    notes = ["gather and write-back: the point's batch moved once, median of 20 calls, as % of the bulk pinned copy "
             "in the same direction timed just before in the same process (h2d floor, d2h floor)",
             "bus bytes a row (gather): a model, not a measurement: a row the CPU packs crosses as itself; one the "
             "GPU reads in place moves the 32-byte sectors it touches (whole 128-byte lines for uva_lines) and its "
             "8-byte index; row's share: the row's bytes over those, the most of the floor the path could reach if "
             "its requests filled the bus",
             "default: row 512 B, batch 131072, table 5.12 GB, order random (the suite's point); every other point "
             "moves one axis from it"]
    return Table("The host-gather roofline", frame, sources, with_earlier_note(notes, sources), data)


def point_order(point: str) -> tuple:
    """The default point first, then each axis's points by value."""
    where = point_axis(point)
    if len(where) > 1:
        return (-1, 0.0)
    if not where:
        return (len(AXES), 0.0)
    axis, value = next(iter(where.items()))
    return (list(AXES).index(axis), ORDERS.index(value) if axis == "order" else value)


def not_measured(df: pd.DataFrame, machine: str | None = None) -> str | None:
    """What a page says where `df` (measured rows) holds no roofline figure (on `machine`):
    "not measured yet" with the command that measures it; None where there is one. The
    machine is not named (a page states it, and the text is Markdown: no name from a file in it)."""
    mine = df[is_roofline(df)]
    if machine is not None:
        mine = mine[mine["machine"] == machine]
    if not figures(mine).empty:
        return None
    where = " on this machine" if machine is not None else ""
    return (f"The host-gather roofline: not measured yet{where}. `{MEASURE}` measures it on a GPU machine (the "
            "chunks build tables up to 40 GB; on a CPU every point is a skip).")
