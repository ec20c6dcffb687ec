"""A pytest plugin `speedlib slot` loads into its GPU-test run (`-p speedbench.run.slot_pytest`):
pytest's own tally of the run, rewritten whole to the file named by $SPEEDLIB_SLOT_TALLY
before and after every test.

Why after every test, not once at the end: a GPU test can kill the interpreter (a CUDA fault,
the OOM killer), and the slot's time limit stops pytest too. The file then still holds the
counts so far and, in `running`, the test that was running, so the slot can name it
(speedbench/run/slot.py). Counted as pytest's summary line counts: a test's call phase passed,
failed or skipped (xfail counts as skipped, xpass as passed); a failed setup or teardown, or a
module that cannot be collected, is an error; a skip in setup (a skip mark) is a skip.
No speedbench import: pytest loads it before the tests' own imports.
"""

from __future__ import annotations

import json
import os
import tempfile

TALLY = "SPEEDLIB_SLOT_TALLY"


class _Tally:
    def __init__(self, path: str):
        self.path = path
        self.state = {"passed": 0, "failed": 0, "skipped": 0, "errors": 0, "failures": [], "running": None,
                      "finished": False, "exit_status": None}

    def _write(self) -> None:
        # whole or not at all: the slot may read it after a kill at any moment
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(self.path) or ".", prefix=".tally-")
        with os.fdopen(fd, "w") as f:
            json.dump(self.state, f)
        os.replace(tmp, self.path)

    def _failed(self, nodeid: str, count: str) -> None:
        self.state[count] += 1
        if nodeid not in self.state["failures"]:
            self.state["failures"].append(nodeid)

    def pytest_collectreport(self, report) -> None:
        if report.failed:
            self._failed(report.nodeid or "(collection)", "errors")
            self._write()

    def pytest_runtest_logstart(self, nodeid, location) -> None:
        self.state["running"] = nodeid
        self._write()

    def pytest_runtest_logreport(self, report) -> None:
        if report.when == "call":
            if report.failed:
                self._failed(report.nodeid, "failed")
            else:
                self.state["passed" if report.passed else "skipped"] += 1
        elif report.failed:  # setup or teardown
            self._failed(report.nodeid, "errors")
        elif report.skipped:  # a skip mark, or pytest.skip in a fixture: the test never ran
            self.state["skipped"] += 1

    def pytest_runtest_logfinish(self, nodeid, location) -> None:
        self.state["running"] = None
        self._write()

    def pytest_sessionfinish(self, session, exitstatus) -> None:
        self.state["finished"], self.state["exit_status"] = True, int(exitstatus)
        self._write()


def pytest_configure(config) -> None:
    path = os.environ.get(TALLY)
    if path:
        config.pluginmanager.register(_Tally(path), "speedlib-slot-tally")
