"""docs/adding-a-technique.md's steps, followed for a toy technique in a copy of this checkout:
its library module, its tests, its benchmark module (one Measured class, its version recorded
with `speedlib versions --bump`), its record, its headline chunk and its documentation. Then
the project's checks pass there, `speedlib run --quick --bench bench_toy` measures it, and the
dashboard's page for it, which nobody wrote, shows its figures from a run saved to a scratch
results directory.

The checkout is the working tree (tracked and untracked files, as `git ls-files` lists them),
committed in a repository of its own: what is tested is what is here, not the last commit."""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from project_bits import commit_all, git

ROOT = Path(__file__).resolve().parents[1]

# Step 1: the library.
LIBRARY = '''"""A toy technique: a tensor kept in half the bytes (tests/test_adding_a_technique.py adds it)."""

from __future__ import annotations

import torch

__all__ = ["halved"]


def halved(x: torch.Tensor) -> torch.Tensor:
    """`x` in bfloat16: its values to bfloat16's precision, in half the bytes of float32."""
    return x.to(torch.bfloat16)
'''

# Step 2: its tests.
TEST = '''"""speedlib.toy keeps the values, to bfloat16's precision, in half the bytes."""

import torch

from speedlib import toy


def test_halved_keeps_the_values_in_half_the_bytes():
    x = torch.linspace(-1, 1, 1000)
    y = toy.halved(x)
    assert torch.allclose(y.float(), x, rtol=1e-2, atol=1e-2)
    assert y.element_size() * 2 == x.element_size()
'''

# Step 3: its benchmarks.
BENCH = '''"""The toy technique: bytes a 1000-element tensor holds, float32 (`plain`, plain PyTorch, the
baseline) against speedlib.toy.halved (`toy`). Metric: `track_bytes` (exact)."""

from __future__ import annotations

from benchmarks import common

PLAIN_PYTORCH = ("plain",)


class Footprint(common.Measured):
    """Bytes the tensor holds (exact, any device)."""

    version = "1"  # bumped when what it measures changes: benchmarks/versions.json

    params = (["plain", "toy"],)
    param_names = ["variant"]

    def setup_cache(self):
        return self.measure_all()

    def measure_one(self, variant: str) -> int:
        import torch  # noqa: PLC0415 - torch: the measuring process only

        x = torch.ones(1000)
        y = x if variant == "plain" else common.technique("toy").halved(x)
        return y.element_size() * y.nelement()

    def track_bytes(self, cache, variant: str) -> int:
        return self.result(cache, variant)

    track_bytes.unit = "bytes"
'''

# Step 4: its record (its Headline above TECHNIQUES, as the others'), and its headline chunk.
HEADLINE = '''_TOY = Headline("toy", "bytes a tensor holds, halved vs float32", "Footprint", "toy", "plain",
                paired=False, metric="bytes", scope="one tensor")

'''
RECORD = '''    "toy": Technique(
        "Toy footprint", "plain", "bytes", plain=("plain",),
        variants={"plain": "a float32 tensor (plain PyTorch; the baseline)",
                  "toy": "the tensor in bfloat16 (speedlib.toy.halved)"},
        default="PyTorch's default: plain (float32)",
        comparison=_TOY,
        questions=(Question("toy-bytes", "Toy: bytes vs float32", _TOY),),
        chunks=("headline-toy",),
    ),
'''
CHUNK = '''    ("headline-toy", "the toy: bytes against float32", (
        r"bench_toy\\.Footprint\\.",
    )),
'''

# Step 5: its documentation.
PAGE = "# Toy footprint\n\n`speedlib.toy.halved(x)` keeps a tensor in bfloat16: half the bytes of float32.\n"
README_ROW = "| `toy` | `speedlib.toy.halved` | a tensor in half the bytes | [toy.md](docs/techniques/toy.md) |\n"
SECTION = ("\n## `bench_toy.py`: the toy\n\n| Class | Methods | Kind | Chunk |\n|---|---|---|---|\n"
           "| `Footprint` | `track_bytes` | exact | headline-toy |\n")

# The checks docs/adding-a-technique.md names, but the slow ones that add nothing for a technique
# whose benchmarks train nothing (the baselines' training steps, the results page's regeneration).
CHECKS = ["tests/test_toy.py", "tests/harness/report/test_techniques.py", "tests/test_docs.py",
          "tests/harness/run/test_suite.py::test_every_benchmark_combination_is_in_exactly_one_chunk",
          "tests/test_public_api.py::test_every_technique_imports_with_torch_alone",
          "tests/test_baselines.py::test_every_baseline_is_a_plain_variant_its_benchmark_declares",
          "-k", "not the_results_page_is_generated"]

# The toy's page, rendered as tests/dashboard does (AppTest), by the copy's own dashboard.
SHOW_PAGE = '''
import sys
sys.path.insert(0, "tests")
from dashboard_bits import frames, open_page
from streamlit.testing.v1 import AppTest
at = open_page(AppTest.from_file("dashboard/app.py", default_timeout=120), "/toy")
at.query_params["tab"] = "Memory"
at.run()
assert not at.exception, at.exception
print("title:", *[t.value for t in at.title])
for frame in frames(at):
    print(frame.to_csv(index=False))
'''


def copy_checkout(to: Path) -> None:
    """This working tree's files (tracked, and untracked but not ignored) in a repository of their own."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=ROOT,
                            check=True, capture_output=True, text=True).stdout.split("\0")
    for name in filter(None, listed):
        if (ROOT / name).is_file():  # a tracked file deleted here is not copied
            (to / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(ROOT / name, to / name)
    git(to, "init", "-q", "-b", "main")  # asv.conf.json's branch
    commit_all(to, "the checkout")


def insert(path: Path, before: str, text: str) -> None:
    """`text` put in `path` before the first line that starts with `before`."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.startswith(before))
    path.write_text("".join([*lines[:at], text, *lines[at:]]), encoding="utf-8")


def add_row(path: Path, header: str, row: str) -> None:
    """`row` appended to the Markdown table in `path` whose header line starts with `header`."""
    lines = path.read_text(encoding="utf-8").splitlines(keepends=True)
    at = next(i for i, line in enumerate(lines) if line.startswith(header)) + 2
    while at < len(lines) and lines[at].startswith("|"):
        at += 1
    path.write_text("".join([*lines[:at], row, *lines[at:]]), encoding="utf-8")


def run(repo: Path, home: Path, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """`python3 *args` in the copy, importing the copy's code (asv keeps its machine file in $HOME)."""
    env = {**os.environ, "HOME": str(home), "PYTHONPATH": str(repo), **(env or {})}
    out = subprocess.run([sys.executable, *args], cwd=repo, env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, f"{' '.join(args)}:\n{out.stdout[-3000:]}\n{out.stderr[-3000:]}"
    return out


@pytest.mark.slow
def test_a_toy_technique_added_by_the_documented_steps_is_measured_and_shown(tmp_path):
    repo, home = tmp_path / "checkout", tmp_path / "home"
    repo.mkdir()
    home.mkdir()
    copy_checkout(repo)
    (repo / "speedlib" / "toy.py").write_text(LIBRARY)
    (repo / "tests" / "test_toy.py").write_text(TEST)
    (repo / "benchmarks" / "bench_toy.py").write_text(BENCH)
    run(repo, home, "-m", "speedlib", "versions", "--bump", "bench_toy.Footprint", "--why", "new: the toy's bytes")
    techniques = repo / "speedbench" / "techniques.py"
    insert(techniques, "TECHNIQUES = ", HEADLINE)
    insert(techniques, "})", RECORD)  # the last entry of TECHNIQUES
    insert(repo / "benchmarks" / "chunks.py", '    ("contiguous-amp",', CHUNK)  # after the headline chunks
    (repo / "docs" / "techniques" / "toy.md").write_text(PAGE)
    add_row(repo / "README.md", "| technique | entry point |", README_ROW)
    reference = repo / "docs" / "benchmarks.md"
    add_row(reference, "| Technique | Plain PyTorch", "| toy | **`plain`** | `toy` | |\n")
    insert(reference, "| `contiguous-amp` |", "| `headline-toy` | `bench_toy.Footprint` |\n")  # in chunk order
    reference.write_text(reference.read_text(encoding="utf-8") + SECTION, encoding="utf-8")
    commit_all(repo, "the toy technique")

    run(repo, home, "-m", "speedlib", "versions")  # the ledger knows the new class
    checked = run(repo, home, "-m", "pytest", "-q", "-p", "no:cacheprovider", *CHECKS)
    assert " passed" in checked.stdout and "failed" not in checked.stdout, checked.stdout[-2000:]

    quick = run(repo, home, "-m", "speedlib", "run", "--quick", "--bench", "bench_toy")
    assert "quick run, not saved" in quick.stdout
    printed = {m[0]: int(m[1]) for m in re.findall(r"track_bytes\s+variant=(\w+)\s+(\d+) bytes", quick.stdout)}
    assert printed == {"plain": 4000, "toy": 2000}, quick.stdout[-2000:]

    results = tmp_path / "results"  # a run that saves, for the page: never the copy's results/
    run(repo, home, "-m", "speedlib", "run", "--bench", "bench_toy", "--results-dir", str(results))
    page = run(repo, home, "-c", SHOW_PAGE, env={"SPEEDLIB_RESULTS": str(results)})
    assert "title: Toy footprint" in page.stdout, page.stdout
    # its memory table: toy against plain, 2000 against 4000 bytes (in MiB, as the page says them)
    line = next(line for line in page.stdout.splitlines() if line.startswith("Footprint: bytes,toy,plain,"))
    assert ",0.5x,-50.0 %," in line and f"{2000 / 2**20:.6f} MiB" in line and f"{4000 / 2**20:.6f} MiB" in line
