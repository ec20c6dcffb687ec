"""Fixtures the harness's tests share across its packages."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest


@pytest.fixture
def unwritable(tmp_path) -> Path:
    """A directory this user cannot write to: a read-only one of our own, or, for root (whom
    permissions do not stop), the read-only /proc/sys."""
    if os.geteuid() != 0:
        ro = tmp_path / "read-only"
        ro.mkdir()
        ro.chmod(0o555)
        yield ro
        ro.chmod(0o755)
        return
    if Path("/proc/sys").is_dir() and not os.access("/proc/sys", os.W_OK):
        yield Path("/proc/sys")
        return
    pytest.skip("running as root, and no read-only file system (/proc/sys) to stand for a read-only directory")


@pytest.fixture
def null_device(tmp_path) -> Path:
    """A character device of the test's own (/dev/null's numbers): a regression that renames a
    file over its output replaces this one, never the system's /dev/null (old code did that)."""
    if os.geteuid() != 0:
        pytest.skip("making a device node needs root; the system's /dev/null is never used as a stand-in")
    path = tmp_path / "null"
    os.mknod(path, stat.S_IFCHR | 0o666, os.makedev(1, 3))
    return path
