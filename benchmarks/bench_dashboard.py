"""The dashboard's first view on 500 result files (the project's target: <= 3 s).

`setup_cache` writes 500 labelled synthetic asv result files (5 machines x 100 commits,
environment records included) once per run. Each timed sample is a cold first view: the
Streamlit data cache is cleared and the dashboard's own modules are re-imported, then the
overview page runs to completion under Streamlit's AppTest (reading and parsing every
file, the tables, the plotly figures and their serialisation). Not included: starting the
server and importing Streamlit and plotly (done once per server), and the browser's
drawing. `time_load_results` is the loader alone, the part that grows with the files.
"""

from __future__ import annotations

import shutil
import sys
import tempfile
from pathlib import Path

FILES = (5, 100)  # machines x commits


def _app() -> Path:
    import speedlib  # noqa: PLC0415 - the library under test comes from ASV_PYTHONPATH

    return Path(speedlib.__file__).resolve().parents[1] / "dashboard" / "app.py"


class FirstView:
    timeout = 600
    number = 1
    repeat = 5
    rounds = 1
    warmup_time = 0

    def setup_cache(self) -> str:
        try:
            from speedbench import synthetic  # noqa: PLC0415
        except ImportError:  # a commit before the synthetic results existed
            return ""
        root = Path(tempfile.gettempdir()) / "speedlib-bench-dashboard"
        shutil.rmtree(root, ignore_errors=True)
        machines, commits = FILES
        written = synthetic.write_results(root, machines=machines, commits=commits)
        assert len(written) == machines * commits
        return str(root)

    def setup(self, root: str) -> None:
        if not root:
            raise NotImplementedError("this commit has no speedbench.synthetic")
        try:
            import plotly  # noqa: F401, PLC0415 - imported once per server, not per view
            import streamlit  # noqa: F401, PLC0415
        except ImportError as e:
            raise NotImplementedError(f"the dashboard extra is not installed: {e}") from e
        if not _app().is_file():
            raise NotImplementedError("this commit has no dashboard")
        import os  # noqa: PLC0415

        os.environ["SPEEDLIB_RESULTS"] = root
        import streamlit as st  # noqa: PLC0415

        st.cache_data.clear()
        for module in ("_view", "_technique"):
            sys.modules.pop(module, None)

    def time_first_view(self, root: str) -> None:
        from streamlit.testing.v1 import AppTest  # noqa: PLC0415

        at = AppTest.from_file(str(_app()), default_timeout=120)
        at.switch_page("pages/overview.py")
        at.run()
        if at.exception or not at.dataframe:  # a broken view must not pass for a fast one
            raise RuntimeError(f"the overview did not render: {[e.value for e in at.exception]}")

    def time_load_results(self, root: str) -> None:
        from speedbench.results import load_results  # noqa: PLC0415

        loaded = load_results(root)
        if loaded.problems or len(loaded.measured) == 0:
            raise RuntimeError(f"synthetic results did not load cleanly: {loaded.problems[:3]}")
