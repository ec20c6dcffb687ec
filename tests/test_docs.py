"""docs/benchmarks.md names every benchmark class, and no document names one that is gone;
the README stays short, every technique has all its parts, and relative links resolve.

The benchmark modules are parsed, not imported: this test needs neither torch nor asv.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
REFERENCE = ROOT / "docs" / "benchmarks.md"


def benchmark_classes() -> dict[str, set[str]]:
    """{module: its top-level classes not starting with "_"} for every benchmarks/bench_*.py."""
    out = {}
    for path in sorted(BENCHMARKS.glob("bench_*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        out[path.stem] = {node.name for node in tree.body
                          if isinstance(node, ast.ClassDef) and not node.name.startswith("_")}
    return out


def documents() -> list[Path]:
    """README.md and every Markdown file under docs/ (docs/techniques/ included)."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]


def test_there_are_benchmark_classes():
    classes = benchmark_classes()
    assert classes and all(classes.values()), classes


def module_sections(text: str) -> dict[str, str]:
    """{module: the text of the section whose heading names `<module>.py`}."""
    sections = re.split(r"^## ", text, flags=re.M)
    out = {}
    for section in sections:
        heading = section.split("\n", 1)[0]
        for module in re.findall(r"`(bench_\w+)\.py`", heading):
            out[module] = section
    return out


def test_reference_names_every_benchmark_class():
    sections = module_sections(REFERENCE.read_text(encoding="utf-8"))
    missing = []
    for module, classes in benchmark_classes().items():
        if module not in sections:
            missing.append(f"a section for {module}.py")
            continue
        # Named in its module's own section: several modules have a TrainingStep or a PeakMemory.
        missing += [f"{module}.{name}" for name in sorted(classes)
                    if not re.search(rf"`{re.escape(name)}`", sections[module])]
    assert not missing, f"docs/benchmarks.md does not describe: {missing}"


def test_documents_name_only_existing_benchmark_classes():
    classes = benchmark_classes()
    stale = []
    for doc in documents():
        for module, name in re.findall(r"\b(bench_\w+)\.([A-Z]\w*)", doc.read_text(encoding="utf-8")):
            if name not in classes.get(module, set()):
                stale.append(f"{doc.relative_to(ROOT)}: {module}.{name}")
    assert not stale, f"named but not defined in benchmarks/: {stale}"


def _class_nodes(path: Path) -> dict[str, ast.ClassDef]:
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    return {node.name: node for node in tree.body if isinstance(node, ast.ClassDef)}


def benchmark_methods(module: str, name: str) -> set[str]:
    """The methods of benchmarks/<module>.py's class `name`, with those it inherits from
    classes of the same module or of benchmarks/common.py (`common.Paired`, ...)."""
    scopes = {"": _class_nodes(BENCHMARKS / f"{module}.py"), "common": _class_nodes(BENCHMARKS / "common.py")}
    methods, todo = set(), [("", name)]
    while todo:
        scope, cls = todo.pop()
        node = scopes[scope].get(cls)
        if node is None:
            continue
        methods |= {f.name for f in node.body if isinstance(f, ast.FunctionDef)}
        for base in node.bases:
            if isinstance(base, ast.Name):
                todo.append((scope, base.id))
            elif isinstance(base, ast.Attribute) and isinstance(base.value, ast.Name) and base.value.id == "common":
                todo.append(("common", base.attr))
    return methods


def test_documents_name_only_existing_benchmark_methods():
    """`bench_<x>.<Class>.<method>`, as asv names a benchmark, must name a method it has."""
    classes = benchmark_classes()
    stale = []
    for doc in documents():
        for module, name, method in re.findall(r"\b(bench_\w+)\.([A-Z]\w*)\.((?:time|track|mem|peakmem)_\w+)",
                                               doc.read_text(encoding="utf-8")):
            if name in classes.get(module, set()) and method not in benchmark_methods(module, name):
                stale.append(f"{doc.relative_to(ROOT)}: {module}.{name}.{method}")
    assert not stale, f"named but not defined in benchmarks/: {stale}"


README_MAX_BYTES = 10_000


def test_readme_stays_short():
    """The README is the front page: what speedlib is, the quick start, the technique table and
    pointers; the rest lives in docs/."""
    size = len((ROOT / "README.md").read_bytes())
    assert size <= README_MAX_BYTES, f"README.md is {size} bytes, more than {README_MAX_BYTES}: move detail to docs/"


def techniques() -> list[str]:
    """<name> for every benchmarks/bench_<name>.py but the dashboard's own benchmark."""
    return [path.stem.removeprefix("bench_") for path in sorted(BENCHMARKS.glob("bench_*.py"))
            if path.stem != "bench_dashboard"]


def test_every_benchmarked_technique_has_all_its_parts():
    """A technique is a library module or package, its equivalence test, its docs page and its
    record in speedbench/techniques.py's TECHNIQUES (docs/adding-a-technique.md); its dashboard
    page comes from the record. Files are read as text: nothing is imported."""
    names = techniques()
    assert names, "no benchmarks/bench_<name>.py found"
    registry = (ROOT / "speedbench" / "techniques.py").read_text(encoding="utf-8")
    missing = []
    for name in names:
        if not (ROOT / f"speedlib/{name}.py").is_file() and not (ROOT / f"speedlib/{name}/__init__.py").is_file():
            missing.append(f"speedlib/{name}.py or speedlib/{name}/__init__.py")
        for part in (f"tests/test_{name}.py", f"docs/techniques/{name}.md"):
            if not (ROOT / part).is_file():
                missing.append(part)
        if f'"{name}": Technique(' not in registry:
            missing.append(f'"{name}": Technique(...) in speedbench/techniques.py (TECHNIQUES)')
    assert not missing, f"techniques with benchmarks lack: {missing}"


# [text](target) and [text](target "title"); images too. Code spans and fenced blocks are
# removed first, so a bracket-paren inside code is not taken for a link.
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_FENCE = re.compile(r"^(```|~~~).*?^\1", flags=re.M | re.S)
_CODE_SPAN = re.compile(r"(`+)(?:(?!\1).)+?\1", flags=re.S)


def relative_links(text: str) -> list[str]:
    """The link targets of a Markdown text that are paths in this repository: no scheme
    (http:, mailto:, ...), no bare #anchor; a target's own #anchor is dropped."""
    text = _CODE_SPAN.sub("", _FENCE.sub("", text))
    out = []
    for target in _LINK.findall(text):
        if re.match(r"[a-zA-Z][a-zA-Z0-9+.-]*:", target) or target.startswith("#"):
            continue
        out.append(target.split("#", 1)[0])
    return out


def test_link_finder():
    text = ("[a](docs/a.md) [b](../b.md#part) [c](https://x.org/y.md) [d](#here) ![e](img.png)\n"
            "`[not](code.md)` and\n```\n[nor](fenced.md)\n```\n[f](g.md \"title\")")
    assert relative_links(text) == ["docs/a.md", "../b.md", "img.png", "g.md"]


def test_relative_links_point_to_existing_files():
    broken = []
    for doc in documents():
        for target in relative_links(doc.read_text(encoding="utf-8")):
            if not (doc.parent / target).exists():
                broken.append(f"{doc.relative_to(ROOT)}: {target}")
    assert not broken, f"links to files that do not exist: {broken}"


def test_the_results_page_is_generated_from_the_committed_results():
    """docs/results.md is `speedlib report --writeup` over results/ and results-rerun/: no
    figure on it is typed by hand, and it cannot fall behind the results."""
    from speedbench.report import writeup  # noqa: PLC0415 - pandas, only for this test
    from speedbench.results.load import load_results  # noqa: PLC0415 - pandas, only for this test

    expected = writeup.writeup(load_results(ROOT / "results").measured,
                               load_results(ROOT / "results-rerun").measured)
    assert (ROOT / "docs" / "results.md").read_text() == expected, \
        f"regenerate it: {writeup.REGENERATE} (or {writeup.COMMAND})"


def table_rows(text: str, header: str) -> list[list[str]]:
    """The rows of the Markdown table whose header line starts with `header`, as cell texts."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2:]:  # after the header and its |---| line
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def _code(cell: str, bold: bool = False) -> set[str]:
    """The names in code spans of a cell (`bold`: only those in **bold**)."""
    return set(re.findall(r"\*\*`([^`]+)`\*\*" if bold else r"`([^`]+)`", cell))


# These tables are checked against TECHNIQUES, not generated from it: their cells say where each
# name applies ("(GPUs)", "(Packing, up to 838236b)") and how to enter the library, which the record does not hold.


def test_the_readmes_technique_table_lists_every_record_and_its_page():
    from speedbench.techniques import TECHNIQUES  # noqa: PLC0415 - the records import nothing; tests here read text

    rows = table_rows((ROOT / "README.md").read_text(encoding="utf-8"), "| technique | entry point |")
    assert sorted(row[0].strip("`") for row in rows) == sorted(TECHNIQUES), "README.md's technique table"
    for row in rows:
        name = row[0].strip("`")
        assert f"(docs/techniques/{name}.md)" in row[-1], row


def test_the_baselines_table_says_each_records_variants():
    """docs/benchmarks.md's table of variants: every record's plain variants (its baselines in
    bold) and the others, none more and none less."""
    from speedbench.techniques import TECHNIQUES  # noqa: PLC0415 - the records import nothing; tests here read text

    rows = table_rows(REFERENCE.read_text(encoding="utf-8"), "| Technique | Plain PyTorch")
    assert sorted(row[0] for row in rows) == sorted(TECHNIQUES), "docs/benchmarks.md's variant table"
    for name, plain, speedlib, other in rows:
        t = TECHNIQUES[name]
        assert _code(plain, bold=True) == set(t.baselines), f"{name}: baselines in bold"
        assert _code(plain) == set(t.plain), f"{name}: plain PyTorch variants"
        assert _code(speedlib) | _code(other) == set(t.variants) - set(t.plain), f"{name}: the other variants"


def test_the_chunk_table_lists_every_chunk_in_order():
    from speedbench.chunks import load_chunks  # noqa: PLC0415 - reads benchmarks/chunks.py as text

    rows = table_rows(REFERENCE.read_text(encoding="utf-8"), "| Chunk | Classes |")
    assert [row[0].strip("`") for row in rows] == [c.name for c in load_chunks(ROOT)]
