"""The at-a-glance chart as an image (docs/glance.svg): the README and docs/results.md show it,
`speedlib publish --chart PATH` draws it from a results tree, and the committed image is what
that command draws from the committed results now (issue 44, item 4)."""

from __future__ import annotations

import contextlib
import io
import textwrap
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

pd = pytest.importorskip("pandas")
plotly_colors = pytest.importorskip("plotly.colors")

from speedbench.cli.parser import main  # noqa: E402 - after the skip: pandas is needed
from speedbench.report import glance, headline  # noqa: E402 - after the skip: pandas is needed
from speedbench.results import synthetic  # noqa: E402 - after the skip: pandas is needed
from speedbench.results.load import load_results  # noqa: E402 - after the skip: pandas is needed

ROOT = Path(__file__).resolve().parents[2]
IMAGE = ROOT / "docs" / "glance.svg"
SVG = "{http://www.w3.org/2000/svg}"


def _draw(results: Path, out: Path) -> int:
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        return main(["publish", "--results", str(results), "--chart", str(out)])


def _texts(svg: str) -> list[tuple[float, float, str]]:
    """Every text of the image: (x, y, its pieces joined), in document order."""
    root = ET.fromstring(svg)
    return [(float(t.get("x")), float(t.get("y")), "".join(s.text or "" for s in t))
            for t in root.iter(f"{SVG}text")]


def test_the_committed_image_is_what_the_command_draws_from_the_committed_results(tmp_path):
    assert _draw(ROOT / "results", tmp_path / "glance.svg") == 0
    assert IMAGE.read_bytes() == (tmp_path / "glance.svg").read_bytes(), \
        f"docs/glance.svg is stale: regenerate it with `python3 tools/regenerate_docs.py` ({glance.IMAGE_COMMAND})"


def test_every_cell_shows_the_reports_figure_in_its_row_and_column():
    """The image's numbers are the headline grid's (speedlib report --table headline): each
    cell's ratio and interval at its question's row and its machine's column."""
    measured = load_results(ROOT / "results").measured
    picks = headline.glance(measured)
    texts = _texts(IMAGE.read_text())
    columns = {m: x for x, _, m in texts if m in set(picks["machine"])}
    said = [t for _, _, t in texts]
    rows = {}
    for label in set(picks["label"]):  # a label wraps: where its lines stand one under the other
        lines = textwrap.wrap(label, 28)
        (rows[label],) = [texts[i][1] for i in range(len(texts)) if said[i:i + len(lines)] == lines]
    assert set(columns) == set(picks["machine"]) and set(rows) == set(picks["label"])
    assert list(columns) == glance.order_machines(picks)  # GPU machines first, as on the dashboard
    # each row's band: from its label's first line to the next row's
    ys = sorted(rows.values())
    edges = [*ys[1:], 1e9]
    band = {t: (y - 40, edges[ys.index(y)] - 1) for t, y in rows.items()}
    checked = 0
    for r in picks[picks["status"] == headline.MEASURED].itertuples():
        ratio, _, rest = glance.figure_text(r).partition(" ")
        low, high = band[r.label]
        near = [s for x, y, s in texts if x == columns[r.machine] and low < y < high]
        assert ratio in near or any(s.startswith(ratio + " ") for s in near), (r.question, r.machine, near)
        if rest.startswith("["):
            assert any(s.startswith(rest.split("]")[0] + "]") for s in near), (r.question, r.machine, near)
        checked += 1
    assert checked >= 15


def test_a_cell_without_an_answer_says_why_and_is_grey():
    """Issue 51: a cell whose machine lacks its row's comparison is empty with its reason; the
    CPU's DDP cell says what DDP against DataParallel needs, not "needs a GPU" beside "11
    results on its page" (another comparison's results)."""
    measured = load_results(ROOT / "results").measured
    picks = headline.glance(measured).set_index(["question", "machine"])
    cpu = "cpu-2core-intel-xeon"
    assert picks.loc[("transfer-step", cpu), "status"].startswith("not measured")
    assert picks.loc[("parallel", cpu), "status"] == "needs 2 or more GPUs"
    said = [" ".join(text for line in glance.lines(picks.loc[(q, cpu)]) for text, _ in line)
            for q in ("transfer-step", "parallel")]
    assert said[0].startswith("not measured") and "results on its page" not in said[0]
    assert said[1] == "needs 2 or more GPUs"
    svg = IMAGE.read_text()
    for q in ("transfer-step", "parallel"):
        assert glance.colour(glance._gain(picks.loc[(q, cpu)])) == glance._NO_NUMBER
    assert f'fill="{glance._NO_NUMBER}"' in svg


def test_the_images_colours_are_the_charts(tmp_path):
    """The dashboard's chart lets plotly interpolate its colour scale; the image computes the
    same colours itself."""
    for gain in (-1.0, -0.6, -0.1, 0.0, 0.35, 0.8, 1.0):
        expected = plotly_colors.sample_colorscale(glance._SCALE, [(gain + 1) / 2])[0]
        r, g, b = (int(v) for v in expected.removeprefix("rgb(").rstrip(")").split(","))
        got = glance.colour(gain)
        assert all(abs(int(got[i:i + 2], 16) - c) <= 1 for i, c in zip((1, 3, 5), (r, g, b), strict=True)), \
            (gain, got, expected)


def test_the_readme_and_the_results_page_show_the_image():
    assert "](docs/glance.svg)" in (ROOT / "README.md").read_text()
    assert "](glance.svg)" in (ROOT / "docs" / "results.md").read_text()
    assert glance.IMAGE_COMMAND in (ROOT / "README.md").read_text()


def test_names_from_result_files_are_text_in_the_image(tmp_path):
    """A machine or GPU name with markup stays text: the image parses, and no element comes from a name."""
    synthetic.write_results(tmp_path / "results", commits=1, machines=1)
    evil = '<img src=x onerror="alert(1)">&amp;'
    (tmp_path / "results" / "synthetic-h100").rename(tmp_path / "results" / evil)
    assert _draw(tmp_path / "results", tmp_path / "glance.svg") == 0
    svg = (tmp_path / "glance.svg").read_text()
    root = ET.fromstring(svg)
    assert not list(root.iter("img")) and not list(root.iter(f"{SVG}img"))
    assert any("<img" in s for _, _, s in _texts(svg)) and "&amp;amp;" in svg  # shown as text, escaped


def test_publish_says_what_to_write(tmp_path, capsys):
    assert main(["publish", "--results", str(ROOT / "results")]) == 2
    assert "--chart PATH" in capsys.readouterr().err
