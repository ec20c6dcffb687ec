"""speedbench.techniques: each technique's record is the one place the harness learns of it.

The words, claims, headline grid and the chunks that measure it are read off the record (or,
for benchmarks/chunks.py, which asv and old checkouts read without the harness, checked against
it), and nothing else names a technique the records do not hold.
"""

from __future__ import annotations

import ast
import dataclasses
import re
from pathlib import Path

import pytest

from speedbench import report, techniques, words
from speedbench.chunks import load_chunks
from speedbench.report import headline
from speedbench.techniques import TECHNIQUES

ROOT = Path(__file__).resolve().parents[3]
BENCHMARKS = ROOT / "benchmarks"
NOT_TECHNIQUES = {"dashboard"}  # bench_dashboard times the viewer itself: no variants, no record
PAGES = {"overview", "history", "machines", "cite"}  # the dashboard's page files: none is a technique's


def classes(name: str) -> list[str]:
    """The benchmark classes bench_<name>.py defines, read as text (no torch)."""
    tree = ast.parse((BENCHMARKS / f"bench_{name}.py").read_text(encoding="utf-8"))
    return [c.name for c in tree.body if isinstance(c, ast.ClassDef) and not c.name.startswith("_")]


def test_every_benchmark_module_has_a_record_and_every_record_a_module():
    modules = {p.stem.removeprefix("bench_") for p in BENCHMARKS.glob("bench_*.py")} - NOT_TECHNIQUES
    assert modules == set(TECHNIQUES)


@pytest.mark.parametrize("name", list(TECHNIQUES))
def test_a_record_holds_words_claims_and_headline_of_its_own_technique(name):
    t = TECHNIQUES[name]
    assert t.title and t.default.startswith("PyTorch's default")
    named = {t.baseline, *t.fallbacks, *t.plain, *t.former}
    assert named <= set(t.variants), f"{name}: variants without words: {named - set(t.variants)}"
    h = t.comparison
    assert h is not None and h.technique == name and (h.whole is None or h.whole.technique == name)
    for x in (h, h.whole):
        if x is not None:  # every variant a headline cell names has words and is a class's own
            assert {x.variant, x.baseline, *x.beside, *(v for _, v in x.default)} <= set(t.variants), name
            assert x.suite in classes(name) and (x.memory_suite is None or x.memory_suite in classes(name))
    for x in (h, h.whole):  # a fallback compares the same variants, unpaired
        if x is not None and x.fallback is not None:
            f = x.fallback
            assert (f.variant, f.baseline, f.default) == (x.variant, x.baseline, x.default) and not f.paired, name
            assert f.suite in classes(name) and f.metric, name
    # every row of the chart is one of its comparisons against one plain-PyTorch baseline per kind of machine
    assert t.questions and {q.technique for q in t.questions} == {name}
    for q in t.questions:
        assert q.comparison in (h, h.whole) and q.measure in ("speed", "peak memory"), q.key
        assert q.measure == "speed" or q.comparison.memory_suite, q.key
        for kind in ("gpu", "cpu"):
            assert q.baseline_on(kind) in t.plain, (q.key, kind)
    for c in t.claims:
        assert c.technique == name and {c.variant, c.baseline} <= set(t.variants), c.claim
        assert (c.measured_by or c.suite) in classes(name), c.claim


def test_the_old_registries_are_views_of_the_records_in_their_order():
    assert words.VARIANTS == {n: t.variants for n, t in TECHNIQUES.items()}
    assert list(words.DEFAULTS) == list(TECHNIQUES) and all(words.DEFAULTS[n] == t.default
                                                           for n, t in TECHNIQUES.items())
    assert report.CLAIMS == tuple(c for t in TECHNIQUES.values() for c in t.claims)
    assert headline.HEADLINES == tuple(t.comparison for t in TECHNIQUES.values())
    assert headline.QUESTIONS == tuple(q for t in TECHNIQUES.values() for q in t.questions)
    assert len({q.key for q in headline.QUESTIONS}) == len(headline.QUESTIONS)  # a key names one row
    assert report.TECHNIQUES is TECHNIQUES


def test_a_claim_or_headline_under_another_techniques_record_is_refused():
    amp = TECHNIQUES["amp"]
    with pytest.raises(ValueError, match=r"tuning: its claims or headline comparison name \['amp'\]"):
        techniques._named({"tuning": amp})


@pytest.mark.parametrize("name", list(TECHNIQUES))
def test_a_record_names_exactly_the_chunks_that_measure_its_classes_headline_first(name):
    """benchmarks/chunks.py is read without the harness (asv, a checkout of any commit), so it
    keeps its own patterns; the record names its chunks, and this holds the two together."""
    chunks = load_chunks(ROOT)
    t = TECHNIQUES[name]
    assert set(t.chunks) <= {c.name for c in chunks}, f"{name}: {t.chunks}"
    owner = {cls: next(c.name for c in chunks if re.match(c.regex, f"bench_{name}.{cls}.track_"))
             for cls in classes(name)}
    assert set(owner.values()) == set(t.chunks), f"{name}: its classes are in {sorted(set(owner.values()))}"
    # the headline chunk measures the main comparison: its paired class, or (transfer: the paired
    # Transfer class runs in transfer-parallel) the unpaired class that stands in where it has not run
    h = t.comparison
    assert t.chunks[0] in {owner[h.suite], *([owner[h.fallback.suite]] if h.fallback else [])}


def test_no_chunk_or_page_names_a_technique_without_a_record():
    text = (BENCHMARKS / "chunks.py").read_text(encoding="utf-8")
    in_chunks = set(re.findall(r"bench_(\w+?)\\\.", text))
    assert in_chunks and in_chunks <= set(TECHNIQUES) | NOT_TECHNIQUES, in_chunks - set(TECHNIQUES)
    # a technique's page is the one template (dashboard/_technique.page), not a file of its own
    assert {p.stem for p in (ROOT / "dashboard" / "views").glob("*.py")} == PAGES


def test_the_record_module_imports_nothing_of_the_harness():
    """Every package reads the records, so they import none of them."""
    tree = ast.parse((ROOT / "speedbench" / "techniques.py").read_text(encoding="utf-8"))
    imported = [n.module if isinstance(n, ast.ImportFrom) else a.name
                for n in ast.walk(tree) if isinstance(n, (ast.Import, ast.ImportFrom))
                for a in (n.names if isinstance(n, ast.Import) else [n])]
    assert imported == ["__future__", "dataclasses"]


def _strings(value) -> list[str]:
    """Every string in a record: its fields', its claims' and headline's, its dicts' keys and values."""
    if isinstance(value, str):
        return [value]
    if dataclasses.is_dataclass(value):
        return [s for f in dataclasses.fields(value) for s in _strings(getattr(value, f.name))]
    if isinstance(value, dict):
        return [s for item in value.items() for s in _strings(item)]
    if isinstance(value, (tuple, list)):
        return [s for v in value for s in _strings(v)]
    return []


# A commit hash (hex with a digit and a letter, 7 to 40 of them): a story of what ran or was
# measured where names the commits it happened at.
_HISTORY = re.compile(r"\b(?=[0-9a-f]*[0-9])(?=[0-9a-f]*[a-f])[0-9a-f]{7,40}\b")


@pytest.mark.parametrize("name", list(TECHNIQUES))
def test_a_record_holds_data_not_history(name):
    """What a variant ran at older commits, and what a run there showed, is on the technique's
    page, which the words may point to; the record says what each variant is now."""
    said = _strings(TECHNIQUES[name])
    assert [s for s in said if _HISTORY.search(s)] == []
    pages = {p for s in said for p in re.findall(r"docs/[\w/.-]+\.md", s)}
    assert all((ROOT / p).is_file() for p in pages), pages


def test_the_transfer_page_keeps_what_old_variant_names_ran():
    """The history the record's words left: `pinned`, `uva` and Packing's variants at old commits."""
    page = (ROOT / "docs" / "techniques" / "transfer.md").read_text(encoding="utf-8")
    history = " ".join(page[page.index("## What the variant names meant at older commits"):].split())
    for fact in ("before commit 1408e44 (the H100 run at bdb0cb6d: 42.4 %", "(the H200 run at 838236b: 11.3 %)",
                 "`uva`: torch's `index_select` on the mapped table before commit 1408e44", "838236b and earlier"):
        assert fact in history
    for variant in ("pinned", "uva", "index_select", "staged"):
        assert "docs/techniques/transfer.md" in words.VARIANTS["transfer"][variant], variant
