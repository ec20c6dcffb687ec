"""The public surface is pinned, and `import speedlib` stays cheap."""

from __future__ import annotations

import subprocess
import sys

import speedlib
from speedbench.results import synthetic
from speedbench.techniques import TECHNIQUES


def test_public_names_are_pinned():
    assert sorted(speedlib.__all__) == sorted(["__version__", "ContiguousParams", "FlatParameter", "InvalidBufferError",
                                                "HostTable", "HostEmbedding"])
    for name in speedlib.__all__:
        assert getattr(speedlib, name) is not None


# What each technique package's __init__ lists: what users import from it.
PACKAGES = {
    "checkpoint": ["checkpoint", "checkpoint_sequential", "BatchNorm1d", "BatchNorm2d", "BatchNorm3d",
                   "convert_batchnorm", "in_backward", "ForgottenParameterError", "NondeterministicSegmentError",
                   "SEGMENT_VARIANTS", "run_segment", "CheckpointedSequential"],
    "contiguous": ["ContiguousParams", "FlatParameter", "InvalidBufferError", "ALIGN_BYTES", "MAX_ALIGN_BYTES"],
    "transfer": ["BACKENDS", "HostTable", "HostEmbedding", "last_write_wins"],
}


def test_each_technique_package_lists_what_users_import():
    """`import speedlib.checkpoint`, `from speedlib.transfer import HostEmbedding` and the rest of
    what the docs show keep working, and each package says what it offers in __all__."""
    import importlib  # noqa: PLC0415 - loads torch, which the other tests here need none of

    for name, public in PACKAGES.items():
        package = importlib.import_module(f"speedlib.{name}")
        assert sorted(package.__all__) == sorted(public), name
        assert all(getattr(package, n) is not None for n in public), name
    checkpoint = importlib.import_module("speedlib.checkpoint")
    assert callable(checkpoint.checkpoint) and checkpoint.checkpoint.__name__ == "checkpoint"
    assert speedlib.HostTable is importlib.import_module("speedlib.transfer").HostTable
    assert speedlib.ContiguousParams is importlib.import_module("speedlib.contiguous").ContiguousParams


def test_import_does_not_load_torch():
    code = "import sys, speedlib; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_unknown_attribute_is_an_attribute_error():
    try:
        speedlib.DoesNotExist  # noqa: B018 - the attribute lookup is what is tested
    except AttributeError as e:
        assert "DoesNotExist" in str(e)
    else:
        raise AssertionError("no AttributeError")


# An import hook that makes the named packages unimportable, as on a machine without them.
_BLOCK = """
import importlib.abc, sys
class Block(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.split('.')[0] in {blocked!r}:
            raise ModuleNotFoundError(f"No module named {{name!r}} (blocked by the test)")
sys.meta_path.insert(0, Block())
"""


def _run_without(blocked: set[str], body: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _BLOCK.format(blocked=blocked) + body],
                          capture_output=True, text=True)


def test_every_technique_imports_with_torch_alone():
    """`pip install speedlib` brings torch only: no technique may need pandas, torchvision,
    Streamlit, asv or plotly at import."""
    body = ("import importlib\n"
            f"for m in {tuple(TECHNIQUES)!r}:\n"  # every technique the records hold
            "    importlib.import_module('speedlib.' + m)\n"
            "print('ok')")
    out = _run_without({"pandas", "torchvision", "streamlit", "asv", "asv_runner", "plotly"}, body)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr


def test_viewing_results_needs_no_torch(tmp_path):
    """The report side of the harness reads results and prints tables with torch absent."""
    synthetic.write_results(tmp_path, commits=2, machines=1)
    body = ("import sys\n"
            "from speedbench import cli\n"
            f"status = cli.main(['report', '--results', {str(tmp_path)!r}])\n"
            "print('torch' in sys.modules, status)")
    out = _run_without({"torch", "torchvision"}, body)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "False 0", out.stdout
