"""The harness's packages import one way (the design's "Harness packages follow the data"):
a module imports its own package, and the packages below it, never one above or beside it.
The viewer (report/, the dashboard) never reaches the runner (run/): viewing results needs no
planner, no checkout and no asv. Read from the source, every import counted (a function's
own imports too, and the modules a package's lazy `__init__` names in full)."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# What each layer may import besides itself. "base" is speedbench's own modules (the checkout's
# path, the techniques' record, the chunks, words), which import nothing of the packages.
MAY_IMPORT = {
    "base": set(),
    "stats": {"base"},
    "measure": {"base", "stats"},
    "results": {"base", "stats"},
    "run": {"base", "stats", "measure", "results"},
    "report": {"base", "stats", "results"},
    "cli": {"base", "stats", "measure", "results", "run", "report"},
    "dashboard": {"base", "stats", "results", "report"},
}


def _layer_of_module(name: str, root: Path) -> str | None:
    """The layer of speedbench module `name` ("speedbench.run.plan" -> "run"); None outside speedbench."""
    parts = name.split(".")
    if parts[0] != "speedbench":
        return None
    if len(parts) > 1 and (root / "speedbench" / parts[1]).is_dir():
        return parts[1]
    return "base"


def _layer_of_file(path: Path, root: Path) -> str:
    rel = path.relative_to(root).parts
    if rel[0] == "dashboard":
        return "dashboard"
    return rel[1] if len(rel) > 2 else "base"


def _module_name(path: Path, root: Path) -> list[str]:
    parts = list(path.relative_to(root).with_suffix("").parts)
    return parts[:-1] if parts[-1] == "__init__" else parts


def imported(path: Path, root: Path) -> list[tuple[int, str]]:
    """(line, module) for every speedbench module `path` imports, relative imports resolved."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    package = _module_name(path, root)
    if path.name != "__init__.py":
        package = package[:-1]
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = ".".join(package[: len(package) - node.level + 1] + [node.module or ""]).strip(".") \
                if node.level else node.module or ""
            found += [(node.lineno, base)] + [(node.lineno, f"{base}.{a.name}") for a in node.names]
        elif path.name == "__init__.py" and isinstance(node, ast.Constant) and isinstance(node.value, str) \
                and node.value.startswith("speedbench."):  # a lazy API naming another package's module
            found.append((node.lineno, node.value))
    return found


def crossings(root: Path) -> list[str]:
    """Every import of `root`'s harness and dashboard that MAY_IMPORT does not allow, one line each."""
    files = sorted((root / "speedbench").rglob("*.py")) + sorted((root / "dashboard").rglob("*.py"))
    wrong = []
    for path in files:
        mine = _layer_of_file(path, root)
        for line, name in imported(path, root):
            theirs = _layer_of_module(name, root)
            if theirs is not None and theirs != mine and theirs not in MAY_IMPORT[mine]:
                wrong.append(f"{path.relative_to(root)}:{line} ({mine}) imports {name} ({theirs})")
    return sorted(set(wrong))


def test_no_package_imports_one_above_or_beside_it():
    assert crossings(ROOT) == []


def test_the_layers_have_no_cycle():
    """MAY_IMPORT itself is an order: no layer reaches itself through the others."""
    def reach(layer: str, seen: frozenset = frozenset()) -> set[str]:
        below = MAY_IMPORT[layer]
        return set(below).union(*(reach(b, seen | {layer}) for b in below if b not in seen))

    assert all(layer not in reach(layer) for layer in MAY_IMPORT)


def test_every_package_has_a_layer():
    packages = {p.name for p in (ROOT / "speedbench").iterdir() if (p / "__init__.py").is_file()}
    assert packages == set(MAY_IMPORT) - {"base", "dashboard"}


def test_the_check_sees_each_way_of_crossing(tmp_path):
    """A report module reaching the runner by each form of import, a lazy `__init__` naming a
    runner module, and a relative import from run/ into report/: each is one line."""
    for package in ("report", "run", "results", "stats", "measure", "cli"):
        (tmp_path / "speedbench" / package).mkdir(parents=True)
        (tmp_path / "speedbench" / package / "__init__.py").write_text("")
    (tmp_path / "dashboard").mkdir()
    (tmp_path / "speedbench" / "__init__.py").write_text("")
    (tmp_path / "speedbench" / "report" / "a.py").write_text(
        "import speedbench.run.plan\nfrom speedbench.run import plan\nfrom speedbench import run\n"
        "def f():\n    from speedbench.results import load\n    from speedbench.cli.run import x\n")
    (tmp_path / "speedbench" / "report" / "__init__.py").write_text("API = {'speedbench.run.plan': ('x',)}\n")
    (tmp_path / "speedbench" / "run" / "b.py").write_text("from ..report import a\nfrom .. import chunks\n")
    (tmp_path / "dashboard" / "page.py").write_text("from speedbench.run import plan\nfrom speedbench import report\n")
    assert crossings(tmp_path) == [
        "dashboard/page.py:1 (dashboard) imports speedbench.run (run)",
        "dashboard/page.py:1 (dashboard) imports speedbench.run.plan (run)",
        "speedbench/report/__init__.py:1 (report) imports speedbench.run.plan (run)",
        "speedbench/report/a.py:1 (report) imports speedbench.run.plan (run)",
        "speedbench/report/a.py:2 (report) imports speedbench.run (run)",
        "speedbench/report/a.py:2 (report) imports speedbench.run.plan (run)",
        "speedbench/report/a.py:3 (report) imports speedbench.run (run)",
        "speedbench/report/a.py:6 (report) imports speedbench.cli.run (cli)",
        "speedbench/report/a.py:6 (report) imports speedbench.cli.run.x (cli)",
        "speedbench/run/b.py:1 (run) imports speedbench.report (report)",
        "speedbench/run/b.py:1 (run) imports speedbench.report.a (report)",
    ]
