"""The README's first two commands are the ones CI and newcomers run."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
import tomllib
import urllib.request
from pathlib import Path

import pytest

from speedbench.report import TECHNIQUES

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    return re.findall(r"```bash\n(.+?)\n```", (ROOT / "README.md").read_text(), flags=re.S)


def test_ci_runs_the_readme_test_command():
    test_command = readme_commands()[1]
    assert "pytest" in test_command
    assert test_command in (ROOT / ".ci" / "run").read_text()


def test_first_command_installs_the_viewer_and_opens_the_dashboard():
    main_job = readme_commands()[0]
    assert main_job == "python3 -m pip install -r dashboard/requirements.txt && python3 -m speedlib dashboard"


def test_the_viewers_requirements_are_the_dashboard_extra_and_hold_no_torch():
    listed = [line.strip() for line in (ROOT / "dashboard" / "requirements.txt").read_text().splitlines()
              if line.strip() and not line.startswith("#")]
    extra = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]["dashboard"]
    assert listed == extra
    assert not any(re.match(r"torch", req) for req in listed)


def _without_torch(tmp_path: Path) -> dict:
    """An environment in which `import torch` fails, as after the viewer-only install."""
    blocker = tmp_path / "blocker" / "torch"
    blocker.mkdir(parents=True)
    (blocker / "__init__.py").write_text('raise ImportError("torch is blocked: the viewer must not import it")\n')
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(blocker.parent), str(ROOT)]), "HOME": str(tmp_path)}


def test_report_works_without_torch(tmp_path):
    out = subprocess.run([sys.executable, "-m", "speedlib", "report", "--table", "paired"], cwd=ROOT,
                         env=_without_torch(tmp_path), capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert "| h100-sxm-80gb |" in out.stdout and "| cpu-2core-intel-xeon |" in out.stdout


def test_every_dashboard_page_renders_without_torch(tmp_path):
    pytest.importorskip("streamlit")
    pages = ["overview", "history", "machines", "cite", *TECHNIQUES]
    script = tmp_path / "pages.py"
    script.write_text(f"""
import sys
sys.path.insert(0, {str(ROOT / "tests")!r})
from dashboard_bits import open_page
from streamlit.testing.v1 import AppTest
for page in {pages!r}:
    at = AppTest.from_file({str(ROOT / "dashboard" / "app.py")!r}, default_timeout=120)
    open_page(at, f"views/{{page}}.py" if page in ("overview", "history", "machines", "cite") else "/" + page)
    at.run()
    assert not at.exception, (page, at.exception)
    assert at.title, page
assert "torch" not in sys.modules or sys.modules["torch"] is None
print("rendered", len({pages!r}))
""")
    env = {**_without_torch(tmp_path), "SPEEDLIB_RESULTS": str(ROOT / "results")}
    out = subprocess.run([sys.executable, str(script)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"rendered {len(pages)}" in out.stdout


def test_first_command_serves_in_a_non_interactive_shell(tmp_path):
    """A fresh HOME (Streamlit's first run), no terminal, no display: no prompt, no browser,
    the URL printed once the port answers."""
    pytest.importorskip("streamlit")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = _without_torch(tmp_path)
    for name in ("DISPLAY", "WAYLAND_DISPLAY"):
        env.pop(name, None)
    proc = subprocess.Popen([sys.executable, "-m", "speedlib", "dashboard", "--port", str(port)], cwd=ROOT, env=env,
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        lines = []
        for line in proc.stdout:
            lines.append(line)
            if line.startswith("speedlib dashboard: serving"):
                break
        assert lines and lines[-1].startswith("speedlib dashboard: serving"), "".join(lines)
        assert f"on http://127.0.0.1:{port} " in lines[-1]
        # Printed only once the port is bound: the health check answers at once.
        assert urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=30).read() == b"ok"
        assert proc.poll() is None
        assert "email" not in "".join(lines).lower()
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(timeout=30)


def test_sigterm_to_the_dashboard_command_stops_streamlit_too(tmp_path):
    pytest.importorskip("streamlit")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    proc = subprocess.Popen([sys.executable, "-m", "speedlib", "dashboard", "--port", str(port), "--no-browser"],
                            cwd=ROOT, env={**os.environ, "HOME": str(tmp_path)}, stdin=subprocess.DEVNULL,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        for line in proc.stdout:
            if line.startswith("speedlib dashboard: serving"):
                break
        proc.send_signal(signal.SIGTERM)  # to speedlib alone, not its group
        proc.wait(timeout=60)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/_stcore/health", timeout=2)
            except OSError:
                break
            time.sleep(0.5)
        else:
            raise AssertionError("Streamlit still serves after speedlib dashboard got SIGTERM")
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except ProcessLookupError:
            pass  # all gone, as it should be
