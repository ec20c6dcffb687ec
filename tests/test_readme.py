"""The README's first two commands are the ones CI and newcomers run."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def readme_commands() -> list[str]:
    return re.findall(r"```bash\n(.+?)\n```", (ROOT / "README.md").read_text(), flags=re.S)


def test_ci_runs_the_readme_test_command():
    test_command = readme_commands()[1]
    assert "pytest" in test_command
    assert test_command in (ROOT / ".ci" / "run").read_text()


def test_first_command_installs_and_opens_the_dashboard():
    main_job = readme_commands()[0]
    assert 'pip install -e ".[dashboard]"' in main_job and main_job.endswith("speedlib dashboard")
