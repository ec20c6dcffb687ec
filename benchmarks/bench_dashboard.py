"""The dashboard's first view on 500 and 5000 result files, without and with the cache of
parsed results (the project's targets: 500 files <= 3 s; 5000 files <= 4 s cold, <= 1 s warm).

`setup_cache` writes two labelled synthetic asv result trees once per run: 5 machines x 100
commits and 5 machines x 1000 commits, environment records included. Each timed sample is
a first view of a freshly started server: Streamlit's caches are cleared and the dashboard's
own modules re-imported, then the overview page runs to completion under Streamlit's AppTest
(the tables, the plotly figures and their serialisation). `cold`: the cache of parsed
results (`speedbench.results.cache`) is empty, so every file is read and parsed; `warm`: it holds
this tree, as after any earlier view. Not included: starting the server and importing
Streamlit and plotly (done once per server), and the browser's drawing.
`time_load_results` is the loading alone, the part that grows with the files.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from pathlib import Path

TREES = {500: (5, 100), 5000: (5, 1000)}  # files: machines x commits


def _app() -> Path:
    import speedlib  # noqa: PLC0415 - the library under test comes from ASV_PYTHONPATH

    return Path(speedlib.__file__).resolve().parents[1] / "dashboard" / "app.py"


def _scratch() -> Path:
    return Path(tempfile.gettempdir()) / "speedlib-bench-dashboard"


def _fresh_server() -> None:
    """As a freshly started server: no Streamlit cache, the dashboard's modules not imported."""
    import streamlit as st  # noqa: PLC0415 - streamlit: the measuring process only

    st.cache_data.clear()
    st.cache_resource.clear()
    for module in ("_view", "_technique"):
        sys.modules.pop(module, None)


class FirstView:
    version = "2"  # bumped when what it measures changes: benchmarks/versions.json
    timeout = 900
    number = 1
    repeat = 5
    rounds = 1
    warmup_time = 0
    params = ([500, 5000], ["cold", "warm"])
    param_names = ["files", "cache"]

    def setup_cache(self) -> dict:
        try:
            from speedbench.results import synthetic  # noqa: PLC0415 - pandas: the measuring process only
        except ImportError:  # a commit before the synthetic results existed
            return {}
        shutil.rmtree(_scratch(), ignore_errors=True)
        roots = {}
        for files, (machines, commits) in TREES.items():
            root = _scratch() / f"results-{files}"
            written = synthetic.write_results(root, machines=machines, commits=commits)
            assert len(written) == files
            roots[files] = str(root)
        return roots

    def setup(self, roots: dict, files: int, cache: str) -> None:
        if not roots:
            raise NotImplementedError("this commit has no speedbench.results.synthetic")
        try:
            import plotly  # noqa: F401, PLC0415 - imported once per server, not per view
            import streamlit  # noqa: F401, PLC0415 - streamlit: the measuring process only
        except ImportError as e:
            raise NotImplementedError(f"the dashboard extra is not installed: {e}") from e
        if not _app().is_file():
            raise NotImplementedError("this commit has no dashboard")
        try:
            from speedbench.results import cache as results_cache  # noqa: PLC0415 - pandas: the measuring process only
        except ImportError:
            results_cache = None
        if cache == "warm" and results_cache is None:
            raise NotImplementedError("this commit has no cache of parsed results")
        os.environ["SPEEDLIB_RESULTS"] = roots[files]
        os.environ["SPEEDLIB_CACHE_DIR"] = str(_scratch() / f"cache-{files}")
        if cache == "cold":
            shutil.rmtree(os.environ["SPEEDLIB_CACHE_DIR"], ignore_errors=True)
        else:  # what a restarted dashboard finds on disk: what the last server kept (the parsed frames, and
            # since speedbench.report.kept the Overview's tables), written by one view (later samples find it)
            _fresh_server()
            self.time_first_view(roots, files, cache)
        _fresh_server()

    def time_first_view(self, roots: dict, files: int, cache: str) -> None:
        from streamlit.testing.v1 import AppTest  # noqa: PLC0415 - streamlit: the measuring process only

        at = AppTest.from_file(str(_app()), default_timeout=300)
        at.switch_page("views/overview.py")
        at.run()
        # a broken view must not pass for a fast one (the grid and the claims are static tables)
        if at.exception or not (at.dataframe or at.table):
            raise RuntimeError(f"the overview did not render: {[e.value for e in at.exception]}")

    def time_load_results(self, roots: dict, files: int, cache: str) -> None:
        from speedbench.results import cache as results_cache  # noqa: PLC0415 - pandas: the measuring process only

        loaded = results_cache.load(roots[files])
        if loaded.problems or len(loaded.measured) == 0:
            raise RuntimeError(f"synthetic results did not load cleanly: {loaded.problems[:3]}")
