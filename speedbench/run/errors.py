"""`SuiteError`, the one exception `speedlib run` raises for a precondition it refuses.

A module of its own so that the parts of the run kept apart from speedbench/run/suite.py
(_checkout, _asv_process, _run_records) can raise it without importing suite.py, which
imports them; `speedbench.run.suite.SuiteError` is this class.
"""

from __future__ import annotations


class SuiteError(RuntimeError):
    """A `speedlib run` precondition failed; the message says how to fix it."""
