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
        f"docs/glance.svg is stale: regenerate it with `{glance.IMAGE_COMMAND}`"


def test_every_cell_shows_the_reports_figure_in_its_row_and_column():
    """The image's numbers are the headline grid's (speedlib report --table headline): each
    cell's ratio and interval at its technique's row and its machine's column."""
    measured = load_results(ROOT / "results").measured
    picks = headline.glance(measured)
    texts = _texts(IMAGE.read_text())
    columns = {m: x for x, _, m in texts if m in set(picks["machine"])}
    first = {textwrap.wrap(t, 26)[0]: t for t in picks["title"]}  # a title wraps: its first line
    rows = {first[t]: y for _, y, t in texts if t in first}
    assert set(columns) == set(picks["machine"]) and set(rows) == set(picks["title"])
    assert list(columns) == list(dict.fromkeys(picks["machine"]))  # GPU machines first, as on the dashboard
    # each row's band: from halfway to the row above to halfway to the row below
    ys = sorted(rows.values())
    edges = [-1e9, *((a + b) / 2 for a, b in zip(ys, ys[1:], strict=False)), 1e9]  # neighbours
    band = {t: (edges[ys.index(y)], edges[ys.index(y) + 1]) for t, y in rows.items()}
    checked = 0
    for r in picks[picks["status"] == "measured"].itertuples():
        ratio, _, rest = glance.figure_text(r).partition(" ")
        low, high = band[r.title]
        near = [s for x, y, s in texts if x == columns[r.machine] and low < y < high]
        assert ratio in near or any(s.startswith(ratio + " ") for s in near), (r.technique, r.machine, near)
        if rest.startswith("["):
            assert any(s.startswith(rest.split("]")[0] + "]") for s in near), (r.technique, r.machine, near)
        checked += 1
    assert checked >= 15


def test_a_cell_without_a_number_says_why_and_how_many_other_results_its_page_has():
    """Issue 44: the CPU cells of DDP (vs DataParallel, which needs GPUs) and of the transfer
    technique said only "needs a GPU" while their pages show DDP-vs-single and embedding results.
    The embedding step does not need a GPU: it is not measured yet; DDP vs DataParallel does."""
    measured = load_results(ROOT / "results").measured
    picks = headline.glance(measured).set_index(["technique", "machine"])
    cpu = "cpu-2core-intel-xeon"
    assert picks.loc[("transfer", cpu), "status"].startswith("not measured yet")
    assert picks.loc[("parallel", cpu), "status"] == "needs a GPU"
    others = glance.elsewhere(measured)
    assert others["parallel", cpu] > 0 and others["transfer", cpu] > 0
    said = [" ".join(text for line in glance.lines(picks.loc[(t, cpu)], others[t, cpu])
                     for text, _ in line) for t in ("transfer", "parallel")]
    assert said[0].startswith("not measured yet whole step") and "needs a GPU" not in said[0]
    assert said[1].startswith("needs a GPU") and f"{others['parallel', cpu]} results on its page" in said[1]


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
