"""A technique page's paired speedups follow its Baseline selector: the rows against the baseline
picked, as `speedlib report --table paired` holds them; all of them, said so, where none is."""

from __future__ import annotations

from pathlib import Path

import pytest

pd = pytest.importorskip("pandas")
pytest.importorskip("streamlit")
from dashboard_bits import app_on, frames, vega_charts  # noqa: E402 - after the skips: it needs streamlit

from speedbench import report  # noqa: E402 - after the skips: the report needs pandas
from speedbench.results.load import load_results  # noqa: E402 - after the skips: it needs pandas

ROOT = Path(__file__).resolve().parents[2]
MACHINE = "h200-141gb"  # contiguous there: AdamStep against forloop, and speedlib against foreach and fused
SHOWN = ["comparison", "variant", "baseline", "speedup"]
NONE_AGAINST = "None was paired against"


def _page(monkeypatch, **query):
    """The contiguous page on MACHINE: its paired table, the labels of its paired chart, its captions and
    the `speedlib report --table paired` rows of the commit it shows (the report's latest there)."""
    at = app_on(ROOT / "results", "/contiguous", monkeypatch, machine=MACHINE, **query)
    assert not at.exception, at.exception
    (paired,) = [f for f in frames(at) if "comparison" in f.columns]  # the separately timed tables name benchmarks
    (bars,) = [values for spec, values in vega_charts(at) if " ".join(spec.get("title", {}).get("text", []))
               .startswith("paired speedup")]
    labels = list(bars["label"])
    commit = next(s for s in at.selectbox if s.label.startswith("Commit")).value
    t = report.paired_table(report.latest(load_results(ROOT / "results").measured)).frame
    t = t[(t["machine"] == MACHINE) & (t["technique"] == "contiguous") & t["commit"].str.startswith(commit)]
    return paired, labels, [c.value for c in at.caption], t


def _rows(frame: pd.DataFrame) -> list[tuple]:
    return sorted(frame[SHOWN].itertuples(index=False, name=None))


def _wide(frame: pd.DataFrame) -> int:
    """Rows that say why their interval is wider than 1.10x (a page leaves the column out where none does)."""
    return int((frame["why wider than 1.10x"] != "").sum()) if "why wider than 1.10x" in frame else 0


def test_a_paired_baseline_picked_shows_only_the_paired_rows_against_it(monkeypatch):
    _, _, _, every = _page(monkeypatch)
    baselines = sorted(set(every["baseline"]))
    assert {"forloop", "foreach", "fused"} <= set(baselines), baselines
    for baseline in baselines:
        paired, labels, captions, _ = _page(monkeypatch, baseline=baseline)
        expected = every[every["baseline"] == baseline]
        assert 0 < len(expected) < len(every)
        assert _rows(paired) == _rows(expected), baseline  # the report's rows and numbers, no other
        assert len(labels) == len(expected) and all(x.endswith(f" vs {baseline}") for x in labels), labels
        assert not any(c.startswith(NONE_AGAINST) for c in captions)
        wide = [c for c in captions if "intervals wider than" in c]  # the table's note, counting its own rows
        assert wide == [f"{_wide(paired)} of {len(expected)} intervals wider than 1.10x (high / low)"], wide


def test_a_variant_picked_to_compare_with_shows_every_paired_row_and_says_none_is_against_it(monkeypatch):
    paired, labels, captions, every = _page(monkeypatch, baseline="speedlib")
    assert "speedlib" not in set(every["baseline"]) and len(set(every["baseline"])) > 1
    assert _rows(paired) == _rows(every)
    assert len(labels) == len(every)
    said = [c for c in captions if c.startswith(NONE_AGAINST)]
    assert said == [f"{NONE_AGAINST} speedlib: every paired speedup is shown, each against its own baseline."]
    assert f"{_wide(every)} of {len(every)} intervals wider than 1.10x (high / low)" in captions
