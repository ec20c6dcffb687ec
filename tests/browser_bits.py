"""What the browser tests share (tests/dashboard/test_dashboard.py, test_publish.py): Debian's chromium
and playwright, or a skip that says how to get them; a failure instead where SPEEDLIB_REQUIRE_BROWSER
is set (CI)."""

from __future__ import annotations

import os
import shutil

import pytest

# Debian's chromium is flagged this way in every browser test: no sandbox in a container, no GPU.
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking"]


def browser():
    chromium = shutil.which("chromium")
    try:
        from playwright.sync_api import sync_playwright  # noqa: PLC0415 - optional: the test skips without it
    except ImportError:
        sync_playwright = None
    if chromium is None or sync_playwright is None:
        why = "Debian's chromium (apt-get install chromium) and playwright are needed for the browser test"
        if os.environ.get("SPEEDLIB_REQUIRE_BROWSER"):
            pytest.fail(why)
        pytest.skip(why)
    return chromium, sync_playwright
