"""Shared test setup: the cache of parsed results goes to a scratch directory, never to the
home of whoever runs the tests (and one test's cache cannot answer another's load)."""

from __future__ import annotations

import pytest


@pytest.fixture(autouse=True)
def _scratch_results_cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("SPEEDLIB_CACHE_DIR", str(tmp_path_factory.mktemp("speedlib-cache")))
