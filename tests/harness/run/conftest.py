"""What the run's tests share: a small disk of a test's own, to fill, or full already."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


@pytest.fixture
def small_disk(tmp_path):
    """A 512 KiB tmpfs of this test's own, to fill."""
    if not hasattr(os, "geteuid") or os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("filling a disk needs a small filesystem of the test's own: mounting a tmpfs needs root "
                    "and mount(8)")
    disk = tmp_path / "disk"
    disk.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=512k", "tmpfs", str(disk)],
                             capture_output=True, text=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")
    yield disk
    subprocess.run(["umount", "-l", str(disk)], capture_output=True)


@pytest.fixture
def full_disk(small_disk):
    """small_disk with no room left: a file twice its size, written as far as it goes."""
    with pytest.raises(OSError, match="No space left"), (small_disk / "ballast").open("wb") as f:
        f.write(bytes(1 << 20))
    return small_disk
