"""docs/benchmarks.md names every benchmark class, and no document names one that is gone.

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
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


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
