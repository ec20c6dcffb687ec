"""The public surface is pinned, and `import speedlib` stays cheap."""

from __future__ import annotations

import subprocess
import sys

import speedlib


def test_public_names_are_pinned():
    assert sorted(speedlib.__all__) == sorted(["__version__", "ContiguousParams", "FlatParameter", "InvalidBufferError",
                                                "HostTable", "HostEmbedding"])
    for name in speedlib.__all__:
        assert getattr(speedlib, name) is not None


def test_import_does_not_load_torch():
    code = "import sys, speedlib; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_unknown_attribute_is_an_attribute_error():
    try:
        speedlib.DoesNotExist  # noqa: B018
    except AttributeError as e:
        assert "DoesNotExist" in str(e)
    else:
        raise AssertionError("no AttributeError")
