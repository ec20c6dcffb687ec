"""The library never imports the harness: every speedlib module imports with speedbench
unimportable, as in a training script's environment (`pip install speedlib` brings torch
only) and as a commit walk needs (each commit's speedlib/ runs against today's speedbench/,
so a library that reached into the harness would be measured with an API it never knew)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]

# A meta path finder that refuses speedbench and its submodules, then a walk that imports
# every module of the speedlib package (subpackages included) and names those it reached.
_SCRIPT = """
import importlib, importlib.abc, pkgutil, sys

class NoHarness(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "speedbench" or name.startswith("speedbench."):
            raise ModuleNotFoundError(f"No module named {name!r} (the harness, blocked by the test)")

sys.meta_path.insert(0, NoHarness())
import speedlib

names = ["speedlib"]
for info in pkgutil.walk_packages(speedlib.__path__, "speedlib.", onerror=lambda name: None):
    importlib.import_module(info.name)
    names.append(info.name)
assert not any(m == "speedbench" or m.startswith("speedbench.") for m in sys.modules), "the harness was loaded"
print(" ".join(sorted(names)))
"""


def test_every_speedlib_module_imports_without_the_harness():
    done = subprocess.run([sys.executable, "-c", _SCRIPT], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    imported = set(done.stdout.split())
    on_disk = {".".join(p.relative_to(REPO).with_suffix("").parts).removesuffix(".__init__")
               for p in (REPO / "speedlib").rglob("*.py")}
    assert on_disk <= imported, f"modules the walk did not import: {sorted(on_disk - imported)}"


def test_python_m_speedlib_still_runs_the_command():
    """The thin entry point reaches the harness's CLI when it is run."""
    done = subprocess.run([sys.executable, "-m", "speedlib", "--help"], cwd=REPO, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert "usage:" in done.stdout
