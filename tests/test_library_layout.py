"""The library's layout holds for a reader: no underscore name crosses a module border in
speedlib/ (a file cut through one concept shows up as its private names imported next door),
and one `checkpoint()` call with its backward reads in at most three files."""

from __future__ import annotations

import ast
import sys
import threading
import tomllib
from pathlib import Path

import pytest
import setuptools
import torch

ROOT = Path(__file__).resolve().parents[1]
SPEEDLIB = ROOT / "speedlib"


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _module_name(path: Path, root: Path) -> str:
    parts = path.relative_to(root.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _is_module(dotted: str, root: Path) -> bool:
    """Whether `dotted` (speedlib....) names a module or package of the tree at `root`."""
    where = root.parent.joinpath(*dotted.split("."))
    return where.with_suffix(".py").is_file() or (where / "__init__.py").is_file()


def _dotted(node: ast.expr) -> str | None:
    """a.b.c for a chain of attribute reads on a name; None for anything else."""
    if isinstance(node, ast.Name):
        return node.id
    if isinstance(node, ast.Attribute):
        inner = _dotted(node.value)
        return None if inner is None else f"{inner}.{node.attr}"
    return None


def private_crossings(root: Path) -> list[str]:
    """Every place under `root` (a speedlib/ tree) where a module reaches another speedlib
    module's private part: `from speedlib.x import _y`, an import of a private module
    (`speedlib._x`), or `x._y` on a speedlib module it imported; "file:line: what" each."""
    found = []
    for path in sorted(root.rglob("*.py")):
        here = _module_name(path, root)
        package = here if path.name == "__init__.py" else here.rpartition(".")[0]
        tree = ast.parse(path.read_text(encoding="utf-8"))
        modules: dict[str, str] = {}  # a local name -> the speedlib module it is bound to
        where = f"{path.relative_to(root.parent).as_posix()}"
        for node in ast.walk(tree):
            if isinstance(node, ast.ImportFrom):
                if node.level:
                    base = package.split(".")[:len(package.split(".")) - node.level + 1]
                    source = ".".join([*base, *([node.module] if node.module else [])])
                else:
                    source = node.module or ""
                if source.split(".")[0] != "speedlib":
                    continue
                if any(map(_private, source.split("."))):
                    found.append(f"{where}:{node.lineno}: imports the private module {source}")
                for alias in node.names:
                    if _private(alias.name):
                        found.append(f"{where}:{node.lineno}: imports {alias.name} from {source}")
                    elif _is_module(f"{source}.{alias.name}", root):
                        modules[alias.asname or alias.name] = f"{source}.{alias.name}"
            elif isinstance(node, ast.Import):
                for alias in node.names:
                    if alias.name.split(".")[0] != "speedlib":
                        continue
                    if any(map(_private, alias.name.split("."))):
                        found.append(f"{where}:{node.lineno}: imports the private module {alias.name}")
                    if alias.asname:
                        modules[alias.asname] = alias.name
                    else:  # `import speedlib.x.y` binds speedlib; its attribute chain names the modules
                        modules["speedlib"] = "speedlib"
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and _private(node.attr):
                chain = _dotted(node.value)
                if chain is None or chain.split(".")[0] not in modules:
                    continue
                target = ".".join([modules[chain.split(".")[0]], *chain.split(".")[1:]])
                if target != here and _is_module(target, root):
                    found.append(f"{where}:{node.lineno}: reads {node.attr} of {target}")
    return found


def test_no_private_name_crosses_a_module_border_in_speedlib():
    assert private_crossings(SPEEDLIB) == []


def test_the_border_check_sees_each_way_of_crossing(tmp_path):
    """Each form the check looks for, in a small tree: a private name imported, a private module
    imported (by path and by name), and a private attribute of an imported module read."""
    root = tmp_path / "speedlib"
    (root / "tech").mkdir(parents=True)
    files = {
        "__init__.py": "",
        "_old.py": "x = 1\n",
        "tech/__init__.py": "from speedlib.tech.parts import Public\n",
        "tech/parts.py": "_hidden = 1\nclass Public: ...\n",
        "tech/uses.py": ("from speedlib.tech.parts import _hidden\n"
                         "from speedlib import _old\n"
                         "import speedlib._old\n"
                         "from speedlib.tech import parts\n"
                         "from . import parts as p\n"
                         "y = parts._hidden + p._hidden + parts.Public.__name__.__len__()\n"),
        "tech/fine.py": "from speedlib.tech.parts import Public\nimport torch\nz = torch._C\n",
    }
    for name, text in files.items():
        (root / name).write_text(text)
    assert private_crossings(root) == [
        "speedlib/tech/uses.py:1: imports _hidden from speedlib.tech.parts",
        "speedlib/tech/uses.py:2: imports _old from speedlib",
        "speedlib/tech/uses.py:3: imports the private module speedlib._old",
        "speedlib/tech/uses.py:6: reads _hidden of speedlib.tech.parts",
        "speedlib/tech/uses.py:6: reads _hidden of speedlib.tech.parts",
    ]


def test_every_package_of_the_library_is_in_its_distribution():
    """pyproject.toml's package list takes speedlib's technique packages too: a wheel without
    speedlib/checkpoint/ would import nowhere but in this checkout."""
    config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
    include = config["tool"]["setuptools"]["packages"]["find"]["include"]
    listed = set(setuptools.find_packages(str(ROOT), include=include))
    on_disk = {".".join(p.parent.relative_to(ROOT).parts) for p in SPEEDLIB.rglob("__init__.py")}
    assert on_disk <= listed, sorted(on_disk - listed)


# --- one checkpoint() call and its backward -------------------------------------------


def _files_entered(fn) -> set[str]:
    """The files under speedlib/ whose code runs while `fn()` runs (this thread and autograd's)."""
    root = str(SPEEDLIB) + "/"
    seen: set[str] = set()

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_filename.startswith(root):
            seen.add(Path(frame.f_code.co_filename).relative_to(SPEEDLIB.parent).as_posix())

    threading.setprofile(profile)
    sys.setprofile(profile)
    try:
        fn()
    finally:
        sys.setprofile(None)
        threading.setprofile(None)
    return seen


@pytest.mark.parametrize("use_reentrant", [False, True])
def test_one_checkpoint_call_with_its_backward_reads_in_three_files(use_reentrant):
    """The reader's walk: speedlib/checkpoint/__init__.py names where checkpoint() lives, and the
    call and its backward run in that module and the replay module alone."""
    from speedlib.checkpoint import checkpoint  # noqa: PLC0415 - the import is not part of the walk

    block = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Dropout(0.5), torch.nn.Tanh())
    x = torch.randn(3, 4, requires_grad=True)
    files = _files_entered(lambda: checkpoint(block, x, use_reentrant=use_reentrant).sum().backward())
    assert files == {"speedlib/checkpoint/recompute.py", "speedlib/checkpoint/replay.py"}
    init = (SPEEDLIB / "checkpoint" / "__init__.py").read_text(encoding="utf-8")
    assert "from speedlib.checkpoint.recompute import" in init
    assert len({"speedlib/checkpoint/__init__.py", *files}) <= 3
