"""Hostile inputs (issue 19): what anyone can drop into results/ or name a benchmark.

The loader (`load_results`) must never raise, block or change a file; every row of an
untouched file must survive; and whatever it leaves out must be reported as a Problem that
names the file. Each case below starts from a fresh synthetic tree (two machines, one commit
each), damages it one way, fingerprints every entry of the tree (contents, links, modes,
times), loads it, and checks all of that. The cases are generated: every field of a result
file, of one of its entries, of benchmarks.json and of an environment record, set to each of
a list of hostile values; whole-file contents; and the file system's odd entries (FIFOs,
devices, links that loop or leave the tree, unreadable directories, oversized files).

The exports get the same treatment: every hostile text in a cell, a column name, the title,
a note and the provenance footer, in each format, checked by parsing the output the way its
reader would.
"""

from __future__ import annotations

import csv
import datetime as dt
import errno
import hashlib
import io
import json
import os
import re
import shutil
import socket
import stat
import threading
import types
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pandas as pd
import pytest

from speedbench import report as speedbench_report
from speedbench.results.listing import combinations
from speedbench.results import files as _results_files
from speedbench.results import load as results_module
from speedbench.results import machines, synthetic
from speedbench.results.load import COLUMNS, format_table, load_results

TIME = "bench_contiguous.OptimizerStep.time_adam_step"
TRACK = "bench_contiguous.IterationMemory.track_peak_memory"
VICTIM_MACHINE = "synthetic-h100"
DEEP = "__deep__"  # stands for a value nested too deeply for json.dumps itself to write


# --- the tree, its fingerprint and the checks every case makes ----------------------------

@pytest.fixture(scope="module")
def template(tmp_path_factory) -> Path:
    tree = tmp_path_factory.mktemp("template") / "results"
    synthetic.write_results(tree, commits=1, machines=2)
    return tree


@pytest.fixture(scope="module")
def baseline(template) -> pd.DataFrame:
    loaded = load_results(template)
    assert loaded.problems == [] and len(loaded.measured) == 36
    return loaded.measured


def victim_file(tree: Path) -> Path:
    return next((tree / VICTIM_MACHINE).glob("*-existing-*.json"))


def victim_env(tree: Path) -> Path:
    return next((tree / VICTIM_MACHINE / "environment").glob("*.jsonl"))


def fingerprint(tree: Path) -> dict:
    """Every entry under `tree`, never opening anything but regular files (a FIFO would block)."""
    out = {}
    for top, dirs, files in os.walk(tree, followlinks=False):
        for name in dirs + files:
            path = os.path.join(top, name)
            try:
                st = os.lstat(path)
            except OSError as e:  # inside a directory without search permission
                out[path] = e.errno
                continue
            entry = [stat.S_IFMT(st.st_mode), stat.S_IMODE(st.st_mode), st.st_mtime_ns, st.st_size]
            if stat.S_ISLNK(st.st_mode):
                entry.append(os.readlink(path))
            elif stat.S_ISREG(st.st_mode) and os.access(path, os.R_OK):
                entry.append(hashlib.sha256(Path(path).read_bytes()).hexdigest())
            out[path] = entry
    return out


def dump(data) -> str:
    """json.dumps, with DEEP replaced by 20 000 nested lists (json.dumps would recurse)."""
    return json.dumps(data).replace(json.dumps(DEEP), "[" * 20_000 + "]" * 20_000)


# Which baseline rows a case may cost (never silently): those of the damaged result file,
# every row (benchmarks.json damaged), or none (an environment record, a stray entry).
VICTIM_ROWS, ANY_ROW, NO_ROW = "victim", "any", "none"


@dataclass
class Case:
    damage: Callable[[Path], None]
    where: Callable[[Path], Path]  # the path a problem must name (or start with)
    reason: str | None = None  # a regex the problem's reason must match, where it is known
    may_lose: str = VICTIM_ROWS


def check(tmp_path: Path, template: Path, baseline: pd.DataFrame, case: Case, always_problem: bool) -> None:
    tree = tmp_path / "results"
    shutil.copytree(template, tree, symlinks=True)
    case.damage(tree)
    before = fingerprint(tree)
    loaded = load_results(tree)  # nothing may escape
    assert fingerprint(tree) == before, "the loader changed the results tree"

    where = str(case.where(tree))
    named = [p for p in loaded.problems if p.path.startswith(where)]
    if case.reason is not None:
        assert any(re.search(case.reason, p.reason) for p in named), (case.reason, loaded.problems)
    if always_problem:
        assert named, f"nothing reported for {where}: {loaded.problems}"

    # Good rows survive: every row the case did not touch, with its value. A row it touched
    # may go (or move to the not-measured rows), but never without a problem reported.
    victim = str(victim_file(tree))
    now = loaded.measured.set_index("result_id")
    everything = pd.concat([loaded.measured, loaded.not_measured])
    # A damaged file's rows are found by what they measure: their IDs may change with it.
    seen = set(zip(everything["file"], everything["benchmark"], everything["params"], strict=True))
    for _, row in baseline.iterrows():
        file = row["file"].replace(str(template), str(tree))
        touched = case.may_lose == ANY_ROW or (case.may_lose == VICTIM_ROWS and file == victim)
        if touched:
            if (file, row["benchmark"], row["params"]) not in seen:
                assert loaded.problems, f"row {row['result_id']} vanished without a problem"
            continue
        assert row["result_id"] in now.index, f"good row {row['benchmark']} {row['params']} lost"
        assert now.loc[row["result_id"], "value"] == row["value"]

    # What was loaded can be shown: sane values, text where text is expected, a printable table.
    m = loaded.measured
    assert set(COLUMNS) <= set(m.columns)
    assert m["value"].map(lambda v: isinstance(v, float) and v == v and abs(v) != float("inf")).all()
    assert (m[m["kind"] == "time"]["value"] > 0).all()
    assert m["gpu"].map(lambda g: isinstance(g, str)).all()
    assert m["machine"].isin(["synthetic-h100", "synthetic-h200"]).all()
    assert m["result_id"].is_unique, "a result loaded twice"
    assert not any(c in format_table(m) for c in "\x1b\r\x07")
    assert not any(ord(c) < 32 for p in loaded.problems for c in str(p))


# --- generated cases: every field x every hostile value ------------------------------------

HOSTILE = {
    "null": None, "true": True, "negative": -1, "zero": 0, "inf": float("inf"), "-inf": float("-inf"),
    "nan": float("nan"), "int_overflow": 10**400, "empty_str": "", "escape": "x\x1b[2J\x07",
    "list": [], "object": {}, "nested_list": [[1, [2]]], "deep": DEEP,
}


def _rewrite_json(locate: Callable[[Path], Path], change: Callable[[dict], None],
                  end: str = "") -> Callable[[Path], None]:
    """A damage that reads the JSON file `locate` finds in the tree, changes it, writes it back."""
    def damage(tree: Path) -> None:
        path = locate(tree)
        data = json.loads(path.read_text())
        change(data)
        path.write_text(dump(data) + end)
    return damage


def _edit(change: Callable[[dict], None]) -> Callable[[Path], None]:
    return _rewrite_json(victim_file, change)


def _set_top(field: str, value) -> Callable[[Path], None]:
    return _edit(lambda data: data.__setitem__(field, value))


def _set_entry(index: int, value) -> Callable[[Path], None]:
    def change(data: dict) -> None:
        entry = data["results"][TIME]
        entry += [None] * (index + 1 - len(entry))
        entry[index] = value
    return _edit(change)


def _set_value(value) -> Callable[[Path], None]:
    return _edit(lambda data: data["results"][TIME][0].__setitem__(1, value))


def _set_benchmark(field: str, value) -> Callable[[Path], None]:
    def change(data: dict) -> None:
        if field == "<entry>":
            data[TIME] = value
        else:
            data[TIME][field] = value
    return _rewrite_json(lambda tree: tree / "benchmarks.json", change)


def _set_environment(field: str, value) -> Callable[[Path], None]:
    return _rewrite_json(victim_env, lambda record: record.__setitem__(field, value), end="\n")


TOP_FIELDS = ("version", "commit_hash", "result_columns", "results", "date", "env_name", "params")
ENTRY_COLUMNS = ("result", "params", "version", "started_at", "duration", "stats_ci_99_a", "stats_ci_99_b",
                 "stats_q_25", "stats_q_75", "stats_number", "stats_repeat", "samples")  # as asv writes them
BENCHMARK_FIELDS = ("type", "unit", "version", "param_names", "params", "name", "<entry>")
ENV_FIELDS = ("commit", "recorded_at", "gpu_model", "gpu_count", "driver", "cuda", "cudnn", "torch", "command")

GRID = (
    [pytest.param(Case(_set_top(f, v), victim_file), id=f"file.{f}={k}")
     for f in TOP_FIELDS for k, v in HOSTILE.items()]
    + [pytest.param(Case(_set_entry(i, v), victim_file), id=f"entry.{c}={k}")
       for i, c in enumerate(ENTRY_COLUMNS) for k, v in HOSTILE.items()]
    + [pytest.param(Case(_set_value(v), victim_file), id=f"value={k}") for k, v in HOSTILE.items()]
    + [pytest.param(Case(_set_benchmark(f, v), lambda t: t, may_lose=ANY_ROW), id=f"benchmarks.{f}={k}")
       for f in BENCHMARK_FIELDS for k, v in HOSTILE.items()]
    + [pytest.param(Case(_set_environment(f, v), victim_env, may_lose=NO_ROW), id=f"environment.{f}={k}")
       for f in ENV_FIELDS for k, v in HOSTILE.items()]
)


@pytest.mark.parametrize("case", GRID)
def test_a_hostile_field_value_never_escapes_nor_silently_drops_rows(tmp_path, template, baseline, case):
    # Whether a problem is due depends on the value (a commit hash may be any string, a
    # duration is not read): the check is that no row goes without one.
    check(tmp_path, template, baseline, case, always_problem=False)


# --- cases with a known reason ------------------------------------------------------------

def _write(relative: str, content: bytes | str) -> Callable[[Path], None]:
    def damage(tree: Path) -> None:
        path = tree / relative.replace("VICTIM", victim_file(tree).name)
        path.write_bytes(content.encode() if isinstance(content, str) else content)
    return damage


def _named(relative: str) -> Callable[[Path], Path]:
    return lambda tree: tree / relative.replace("VICTIM", victim_file(tree).name)


def _time_value(value) -> Callable[[dict], None]:
    return lambda d: d["results"][TIME][0].__setitem__(2, value)


# Years a date can name that pandas' nanosecond times cannot hold (they end at 1677 and 2262;
# pandas 2 and later still parse them, in a coarser unit).
OUT_OF_RANGE_YEARS = (1, 1600, 2300, 9999)


def _year_ms(year: int) -> float:
    """1 January of `year` as asv writes a time: milliseconds since the epoch."""
    utc = dt.timezone.utc
    return (dt.datetime(year, 1, 1, tzinfo=utc) - dt.datetime(1970, 1, 1, tzinfo=utc)).total_seconds() * 1000


V = f"{VICTIM_MACHINE}/VICTIM"
MACHINE_JSON = f"{VICTIM_MACHINE}/machine.json"
KNOWN = {
    # whole result files
    "deep list": (_write(V, "[" * 100_000), V, "nested too deeply"),
    "deep object": (_write(V, '{"a":' * 100_000), V, "nested too deeply"),
    "deep inside results": (_edit(lambda d: d["results"].__setitem__(TIME, DEEP)), V, "nested too deeply"),
    "invalid utf-8": (_write(V, b'{"version": 2, "x": "\xff\xfe"}'), V, "not UTF-8 text"),
    "latin-1 text": (_write(V, '{"commit_hash": "caf\xe9"}'.encode("latin-1")), V, "not UTF-8 text"),
    "empty file": (_write(V, ""), V, "not valid JSON"),
    "null": (_write(V, "null"), V, "top level is NoneType"),
    "a number": (_write(V, "1e400"), V, "top level is float"),
    "5000 digits": (_write(V, "1" * 5000), V, "not valid JSON"),
    "nul bytes": (_write(V, b"\x00" * 64), V, "not valid JSON"),
    "date 1e20": (_edit(lambda d: d.__setitem__("date", 1e20)), V, "'date' 1e\\+20 is out of the range of dates"),
    "date -1e20": (_edit(lambda d: d.__setitem__("date", -1e20)), V, "out of the range of dates"),
    "date inf": (_edit(lambda d: d.__setitem__("date", float("inf"))), V, "not a finite time"),
    "date string": (_edit(lambda d: d.__setitem__("date", "2026-01-01")), V, "'date' is '2026-01-01', not a number"),
    "started_at 1e300": (_edit(lambda d: d["results"][TIME].__setitem__(3, 1e300)), V,
                         "'started_at'.*out of the range"),
    "started_at overflow": (_edit(lambda d: d["results"][TIME].__setitem__(3, 10**400)), V, "not a finite time"),
    "repeat inf": (_edit(lambda d: d["results"][TIME].__setitem__(10, [float("inf")] * 6)), V,
                   "'stats_repeat' holds an infinite"),
    "number overflow": (_edit(lambda d: d["results"][TIME].__setitem__(9, [10**400] * 6)), V,
                        "'stats_number' holds an infinite"),
    "negative repeat": (_edit(lambda d: d["results"][TIME].__setitem__(10, [-3] * 6)), V,
                        "negative or implausibly large"),
    "huge repeat": (_edit(lambda d: d["results"][TIME].__setitem__(10, [1e300] * 6)), V,
                    "negative or implausibly large"),
    "a string entry": (_edit(lambda d: d["results"].__setitem__(TIME, "fast")), V, "entry is str, not a list"),
    "list in result_columns": (_edit(lambda d: d["result_columns"].__setitem__(0, ["result"])), V,
                               "'result_columns' is not a list of strings"),
    "int params": (_edit(lambda d: d["results"][TIME].__setitem__(1, 5)), V, "'params' is not a list"),
    "empty parameter": (_edit(lambda d: d["results"][TIME].__setitem__(1, [[], ["'x'"]])), V, "0 parameter sets"),
    "time inf": (_edit(_time_value(float("inf"))), V, "set aside as not measured"),
    "time overflow": (_edit(_time_value(10**400)), V, "set aside as not measured"),
    "time zero": (_edit(_time_value(0)), V, "set aside as not measured"),
    "time negative": (_edit(_time_value(-0.5)), V, "set aside as not measured"),
    "time -inf": (_edit(_time_value(float("-inf"))), V, "set aside as not measured"),
    "bool result": (_edit(_time_value(True)), V, "neither a number nor null"),
    **{f"date year {y}": (_edit(lambda d, y=y: d.__setitem__("date", _year_ms(y))), V,
                          "'date' .* is out of the range of dates") for y in OUT_OF_RANGE_YEARS},
    **{f"started_at year {y}": (_edit(lambda d, y=y: d["results"][TIME].__setitem__(3, _year_ms(y))), V,
                                "'started_at'.* is out of the range of dates") for y in OUT_OF_RANGE_YEARS},
    # without a 'result' column every entry would read as failed
    "no result column": (_edit(lambda d: d["result_columns"].__setitem__(0, "value")), V,
                         "'result_columns' does not name 'result'"),
    "commit hash not hex": (_set_top("commit_hash", "g" * 40), V, "'commit_hash' 'g+' is not a commit hash"),
    "commit hash 100k": (_set_top("commit_hash", "a" * 100_000), V,
                         r"'commit_hash' 'a{24}\.\.\.a{13}' \(100000 characters\) is not a commit hash"),
    "commit hash with a command after it": (_set_top("commit_hash", "1f8674ca" * 5 + ";id"), V,
                                            r"'commit_hash' '1f8674ca.*\.\.\..*;id' \(43 characters\)"),
    "commit hash short": (_set_top("commit_hash", "abc123"), V, "'commit_hash' 'abc123' is not a commit hash"),
    "commit hash with a space": (_set_top("commit_hash", "0123456 89"), V, "is not a commit hash"),
    "commit hash with a newline": (_set_top("commit_hash", "0123456789\n"), V, "is not a commit hash"),
    # machine.json: reported, the machine's results loaded all the same
    "machine.json torn": (_write(MACHINE_JSON, '{"machine": '), MACHINE_JSON, "not valid JSON.*loaded all the same"),
    "machine.json a list": (_write(MACHINE_JSON, "[]"), MACHINE_JSON, "not a JSON object.*loaded all the same"),
    "machine.json invalid utf-8": (_write(MACHINE_JSON, b"\xff"), MACHINE_JSON, "not UTF-8"),
    # benchmarks.json
    "benchmarks deep": (_write("benchmarks.json", "[" * 100_000), "benchmarks.json", "nested too deeply"),
    "benchmarks invalid utf-8": (_write("benchmarks.json", b"{\"a\": \"\xff\"}"), "benchmarks.json", "not UTF-8"),
    "benchmarks a list": (_write("benchmarks.json", "[]"), "benchmarks.json", "not a JSON object"),
    "benchmark a string": (_set_benchmark("<entry>", "time"), "benchmarks.json", "is 'time', not an object"),
    "int unit": (_set_benchmark("unit", 5), "benchmarks.json", "'unit' is 5, not a string"),
    "int param_names": (_set_benchmark("param_names", 5), "benchmarks.json", "'param_names' is not a list of strings"),
    "list type": (_set_benchmark("type", ["time"]), "benchmarks.json", "'type' is a list, not a string"),
    # environment records
    "env invalid utf-8": (_write(f"{VICTIM_MACHINE}/environment/x.jsonl", b"\xff\n"),
                          f"{VICTIM_MACHINE}/environment/x.jsonl", "not UTF-8 text"),
    "env deep": (_write(f"{VICTIM_MACHINE}/environment/x.jsonl", "[" * 100_000 + "\n"),
                 f"{VICTIM_MACHINE}/environment/x.jsonl", "nested too deeply"),
    "env naive time": (_set_environment("recorded_at", "2026-09-21T16:13:20"), None, "recorded_at"),
    "env year 99999": (_set_environment("recorded_at", "99999-01-01T00:00:00+00:00"), None, "recorded_at"),
    "env int gpu": (_set_environment("gpu_model", 5), None, "gpu_model"),
    "env list torch": (_set_environment("torch", ["2.1"]), None, "torch"),
    "env inf count": (_set_environment("gpu_count", float("inf")), None, "gpu_count"),
    "env no commit": (_set_environment("commit", 5), None, "not an object with a 'commit'"),
    **{f"env year {y}": (_set_environment("recorded_at", f"{y:04d}-01-01T00:00:00+00:00"), None, "recorded_at")
       for y in OUT_OF_RANGE_YEARS},
}


def _may_lose(name: str, where: str | None) -> str:
    if name.startswith(("env", "machine.json")):
        return NO_ROW
    return ANY_ROW if where == "benchmarks.json" else VICTIM_ROWS


@pytest.mark.parametrize("name", KNOWN)
def test_a_known_bad_input_is_reported_with_its_reason(tmp_path, template, baseline, name):
    damage, where, reason = KNOWN[name]
    locate = victim_env if where is None else _named(where)
    check(tmp_path, template, baseline, Case(damage, locate, reason, _may_lose(name, where)), always_problem=True)


# --- the file system's odd entries --------------------------------------------------------

def _fifo(relative: str) -> Callable[[Path], None]:
    return lambda tree: os.mkfifo(tree / relative)


def _link(relative: str, target) -> Callable[[Path], None]:
    def damage(tree: Path) -> None:
        os.symlink(target(tree) if callable(target) else target, tree / relative)
    return damage


def _socket(relative: str) -> Callable[[Path], None]:
    def damage(tree: Path) -> None:
        path = tree / relative
        cwd = os.getcwd()
        os.chdir(path.parent)  # a socket's path is limited to 108 bytes: bind the bare name
        try:
            with socket.socket(socket.AF_UNIX) as s:
                s.bind(path.name)
        finally:
            os.chdir(cwd)
    return damage


def _both(*damages) -> Callable[[Path], None]:
    def damage(tree: Path) -> None:
        for d in damages:
            d(tree)
    return damage


def _outside(tree: Path) -> Path:
    """A valid result file outside the tree: the loader must still refuse to follow a link to it."""
    out = tree.parent / "outside.json"
    shutil.copy(victim_file(tree), out)
    return out


M = VICTIM_MACHINE
FILESYSTEM = {
    "fifo result": (_fifo(f"{M}/fifo.json"), f"{M}/fifo.json", "a FIFO, not a regular file"),
    "fifo environment": (_both(_fifo(f"{M}/environment/fifo.jsonl")), f"{M}/environment/fifo.jsonl", "a FIFO"),
    "fifo benchmarks.json": (_both(lambda t: (t / "benchmarks.json").unlink(), _fifo("benchmarks.json")),
                             "benchmarks.json", "a FIFO"),
    "socket result": (_socket(f"{M}/sock.json"), f"{M}/sock.json", "a socket"),
    "directory named .json": (lambda t: (t / M / "dir.json").mkdir(), f"{M}/dir.json",
                              "a directory, not a regular file"),
    "link to /dev/zero": (_link(f"{M}/zero.json", "/dev/zero"), f"{M}/zero.json", "out of the results tree"),
    "link to /dev/null": (_link(f"{M}/null.json", "/dev/null"), f"{M}/null.json", "out of the results tree"),
    "link out of the tree": (_link(f"{M}/out.json", _outside), f"{M}/out.json", "out of the results tree"),
    "link to /etc/passwd": (_link(f"{M}/passwd.json", "/etc/passwd"), f"{M}/passwd.json", "out of the results tree"),
    "link loop": (_both(_link(f"{M}/a.json", "b.json"), _link(f"{M}/b.json", "a.json")), f"{M}/a.json", "symlink loop"),
    "self link": (_link(f"{M}/self.json", "self.json"), f"{M}/self.json", "symlink loop"),
    "dangling link": (_link(f"{M}/gone.json", "nowhere.json"), f"{M}/gone.json", "cannot be resolved"),
    "machine dir out of the tree": (_link("elsewhere", "/"), "elsewhere", "out of the results tree"),
    "machine dir loop": (_link("loop", "loop"), "loop", "cannot be examined"),
    "environment dir out of the tree": (
        _both(lambda t: shutil.rmtree(t / "synthetic-h200" / "environment"),
              _link("synthetic-h200/environment", "/etc")),
        "synthetic-h200/environment", "out of the results tree"),
    "link to /dev/tty": (_link(f"{M}/tty.json", "/dev/tty"), f"{M}/tty.json", "out of the results tree"),
    "benchmarks.json out of the tree": (
        _both(lambda t: shutil.move(t / "benchmarks.json", t.parent / "b.json"),
              _link("benchmarks.json", lambda t: t.parent / "b.json")), "benchmarks.json", "out of the results tree"),
    # one file reached twice is loaded once; a link sorting first does not rename the machine
    "machine dir linked inside the tree": (_link("a-alias", M), "a-alias", f"the same directory as .*{M}"),
    "result file hard-linked to another machine": (
        lambda t: os.link(victim_file(t), t / "synthetic-h200" / "linked.json"), "synthetic-h200/linked.json",
        "the same file as .*-existing-"),
    "result file hard-linked beside it": (
        lambda t: os.link(victim_file(t), t / M / "zz-linked.json"), f"{M}/zz-linked.json", "the same file as"),
    "result file linked inside the tree": (_link(f"{M}/zz-alias.json", lambda t: victim_file(t).name),
                                           f"{M}/zz-alias.json", "the same file as"),
}


@pytest.mark.parametrize("name", FILESYSTEM)
def test_an_odd_file_system_entry_is_reported_without_being_opened(tmp_path, template, baseline, name):
    damage, where, reason = FILESYSTEM[name]
    may_lose = ANY_ROW if where == "benchmarks.json" else NO_ROW
    check(tmp_path, template, baseline, Case(damage, _named(where), reason, may_lose), always_problem=True)


def test_a_device_node_in_the_tree_is_not_opened(tmp_path, template, baseline):
    def damage(tree: Path) -> None:
        try:
            os.mknod(tree / M / "zero.json", stat.S_IFCHR | 0o600, os.makedev(1, 5))  # /dev/zero's numbers
        except PermissionError:
            pytest.skip("creating a device node needs privileges")
    check(tmp_path, template, baseline, Case(damage, _named(f"{M}/zero.json"), "a character device", NO_ROW),
          always_problem=True)


@pytest.mark.parametrize("relative", [f"{M}/big.json", f"{M}/environment/big.jsonl", "benchmarks.json"])
def test_a_file_over_the_size_limit_is_not_read(tmp_path, template, baseline, monkeypatch, relative):
    monkeypatch.setattr(_results_files, "MAX_FILE_BYTES", 20_000)  # the synthetic files are far smaller
    damage = _write(relative, " " * 20_001)
    may_lose = ANY_ROW if relative == "benchmarks.json" else NO_ROW
    check(tmp_path, template, baseline, Case(damage, _named(relative), "over the limit of 20000 bytes", may_lose),
          always_problem=True)


# 30 values in each of 8 parameters: 30**8 = 6.6e11 parameter combinations from 2 KB of JSON.
EXPLODING_PARAMS = [[repr(str(i)) for i in range(30)]] * 8


@pytest.fixture
def memory_cap():
    """This process's address space capped at 1 GiB above its size for the test, so that code
    building every one of billions of combinations fails with a MemoryError instead of taking
    the machine's memory (which the loader once did)."""
    resource = pytest.importorskip("resource", reason="capping memory needs the resource module (POSIX)")
    try:
        pages = int(Path("/proc/self/statm").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        pytest.skip("capping memory needs this process's size from /proc/self/statm (Linux)")
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = pages * os.sysconf("SC_PAGE_SIZE") + 2**30
    if hard != resource.RLIM_INFINITY and hard < cap:
        pytest.skip(f"this process's hard address-space limit ({hard} bytes) leaves no room to cap it")
    resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _explode_entry(data: dict) -> None:
    """The entry of a benchmark that failed (null: one null spread over every combination)."""
    data["results"][TIME][:2] = [None, EXPLODING_PARAMS]


@pytest.mark.parametrize("where", ["result file", "benchmarks.json"])
def test_parameter_combinations_over_the_limit_are_reported_not_built(tmp_path, template, baseline, memory_cap, where):
    if where == "result file":
        case = Case(_edit(_explode_entry), victim_file, rf"{TIME}: 6.56e\+11 parameter combinations, over the limit")
    else:
        case = Case(_set_benchmark("params", EXPLODING_PARAMS), lambda t: t / "benchmarks.json",
                    rf"{TIME} \(6.56e\+11 parameter combinations, over the limit", ANY_ROW)
    check(tmp_path, template, baseline, case, always_problem=True)
    # Only that benchmark is skipped (in the one file, or everywhere): the rest loads.
    loaded = load_results(tmp_path / "results")
    lost = baseline["benchmark"] == TIME
    if where == "result file":
        lost &= baseline["file"] == str(victim_file(template))
    assert len(loaded.measured) == len(baseline) - lost.sum()
    assert len(loaded.not_measured) == len(load_results(template).not_measured)


def _many_entries_each_under_the_limit(data: dict) -> None:
    """Entries that each stay under MAX_COMBINATIONS but together multiply out past the file's
    limit: a 64 MiB file of such entries would otherwise build 10^8 rows."""
    params = [[repr(str(i)) for i in range(10)]] * 3  # 1000 combinations: at the per-benchmark limit
    template_entry = data["results"][TIME]
    for i in range(results_module.MAX_FILE_COMBINATIONS // 1000 + 1):
        entry = list(template_entry)
        entry[:2] = [None, params]
        data["results"][f"{TIME}_{i}"] = entry


def test_a_result_file_over_the_limit_in_all_is_reported_not_built(tmp_path, template, baseline, memory_cap):
    case = Case(_edit(_many_entries_each_under_the_limit), victim_file,
                r"parameter combinations in all, over the limit of \d+ for one result file")
    check(tmp_path, template, baseline, case, always_problem=True)
    # The whole file is skipped, the other files load.
    loaded = load_results(tmp_path / "results")
    assert len(loaded.measured) == len(baseline) - (baseline["file"] == str(victim_file(template))).sum()


# A few long values crossed with many others: each row carries its combination as text, so a
# 300 KB file once took gigabytes while staying under the combination limit.
LONG_VALUE_PARAMS = [[repr("x" * 200_000)], [repr(str(i)) for i in range(1000)]]


@pytest.mark.parametrize("where", ["result file", "benchmarks.json"])
def test_a_parameter_value_over_the_length_limit_is_reported_not_copied(tmp_path, template, baseline, memory_cap,
                                                                         where):
    reason = rf"a parameter value of 200002 characters, over the limit of {results_module.MAX_PARAM_CHARS}"
    if where == "result file":
        def long_entry(data: dict) -> None:
            data["results"][TIME][:2] = [None, LONG_VALUE_PARAMS]
        case = Case(_edit(long_entry), victim_file, reason)
    else:
        case = Case(_set_benchmark("params", LONG_VALUE_PARAMS), lambda t: t / "benchmarks.json", reason, ANY_ROW)
    check(tmp_path, template, baseline, case, always_problem=True)


def test_a_plan_leaves_out_long_values_and_entries_that_describe_no_benchmark(tmp_path, template):
    tree = tmp_path / "results"
    shutil.copytree(template, tree, symlinks=True)
    _set_benchmark("params", LONG_VALUE_PARAMS)(tree)
    listing = json.loads((tree / "benchmarks.json").read_text())
    listing["bench_x.Y.time_z"] = 5
    (tree / "benchmarks.json").write_text(json.dumps(listing))
    skipped: list[str] = []
    names = combinations(tree / "benchmarks.json", skipped)
    assert TIME not in names and "bench_x.Y.time_z" not in names
    assert sorted(line.split(":")[0] for line in skipped) == sorted([TIME, "bench_x.Y.time_z"]), skipped


def test_a_plan_skips_a_benchmark_over_the_limit_and_says_so(tmp_path, template, memory_cap):
    tree = tmp_path / "results"
    shutil.copytree(template, tree, symlinks=True)
    _set_benchmark("params", EXPLODING_PARAMS)(tree)
    assert TIME not in combinations(tree / "benchmarks.json")  # as `speedlib run --plan` calls it
    skipped: list[str] = []
    names = combinations(tree / "benchmarks.json", skipped)
    everything = combinations(template / "benchmarks.json")
    assert names == {name: combos for name, combos in everything.items() if name != TIME}
    assert len(skipped) == 1 and re.fullmatch(rf"{TIME}: 6.56e\+11 parameter combinations, over the limit .*",
                                              skipped[0]), skipped


# The loader's modules that call `os` themselves (speedbench.results.files reads the tree for
# speedbench.results.load): a fake `os` stands in for the loader's in each.
LOADER_MODULES_USING_OS = (results_module, _results_files)


def _unreadable_directory(monkeypatch, path_of: Callable[[Path], Path]) -> Callable[[Path], None]:
    """As root no mode bit stops a read, so the loader's listing of the directory is made to
    fail as it would (its own `os` only: the test's copying and fingerprinting are unaffected)."""
    def damage(tree: Path) -> None:
        blocked = str(path_of(tree))

        def scandir(path="."):
            if str(path) == blocked:
                raise PermissionError(errno.EACCES, "Permission denied", str(path))
            return os.scandir(path)
        fake_os = types.ModuleType("os")
        fake_os.__dict__.update(os.__dict__)
        fake_os.scandir = scandir
        for module in LOADER_MODULES_USING_OS:
            monkeypatch.setattr(module, "os", fake_os)
    return damage


@pytest.mark.parametrize("which", ["machine", "environment"])
def test_an_unreadable_directory_is_reported(tmp_path, template, baseline, monkeypatch, which):
    path_of = {"machine": lambda t: t / M, "environment": lambda t: t / M / "environment"}[which]
    case = Case(_unreadable_directory(monkeypatch, path_of), path_of, "unreadable directory",
                VICTIM_ROWS if which == "machine" else NO_ROW)
    check(tmp_path, template, baseline, case, always_problem=True)


def test_an_unreadable_results_directory_is_reported(tmp_path, template, monkeypatch):
    tree = tmp_path / "results"
    shutil.copytree(template, tree, symlinks=True)
    _unreadable_directory(monkeypatch, lambda t: t)(tree)
    loaded = load_results(tree)
    assert loaded.measured.empty and [p.path for p in loaded.problems] == [str(tree)]
    assert "unreadable directory (Permission denied)" in loaded.problems[0].reason


def _without_permission(monkeypatch, tree: Path) -> None:
    """`tree` as a user without read and search permission on it meets it (no mode bit stops
    root, who runs the tests): it can be examined from outside, but not listed, and nothing
    in it examined or opened. For the loader's `os` and `os.path` only, as above."""
    inside = os.path.join(str(tree), "")

    def refused(call, blocked):
        def guarded(path, *args, **kwargs):
            if blocked(os.fsdecode(path)):
                raise PermissionError(errno.EACCES, "Permission denied", str(path))
            return call(path, *args, **kwargs)
        return guarded

    def answers_false_on_error(call):  # os.path's tests say False, whatever the error
        def test(path):
            try:
                return bool(call(path))
            except (OSError, ValueError):
                return False
        return test

    fake_os = types.ModuleType("os")
    fake_os.__dict__.update(os.__dict__)
    fake_os.scandir = refused(os.scandir, lambda p: p == str(tree) or p.startswith(inside))
    for name in ("stat", "lstat", "open"):
        setattr(fake_os, name, refused(getattr(os, name), lambda p: p.startswith(inside)))
    fake_path = types.ModuleType("posixpath")
    fake_path.__dict__.update(os.path.__dict__)
    fake_path.lexists = answers_false_on_error(fake_os.lstat)
    fake_path.exists = answers_false_on_error(fake_os.stat)
    fake_path.islink = answers_false_on_error(lambda p: stat.S_ISLNK(fake_os.lstat(p).st_mode))
    fake_os.path = fake_path
    for module in LOADER_MODULES_USING_OS:
        monkeypatch.setattr(module, "os", fake_os)


@pytest.mark.parametrize("entry", ["deep record", "fifo", "directory"])
def test_a_run_checking_its_machine_passes_over_odd_environment_entries(tmp_path, template, entry):
    """`speedlib run` reads the machine directory's environment records before it measures
    (machines.check_directory): an entry the loader reports must neither stop nor hang it."""
    tree = tmp_path / "results"
    shutil.copytree(template, tree, symlinks=True)
    env = tree / M / "environment"
    if entry == "deep record":
        (env / "deep.jsonl").write_text("[" * 100_000 + "\n")
    elif entry == "fifo":
        os.mkfifo(env / "fifo.jsonl")
    else:
        (env / "dir.jsonl").mkdir()
    found = []
    # A daemon thread: opening a FIFO waits for a writer, and the test must fail, not hang.
    reader = threading.Thread(target=lambda: found.append(machines.directory_records(tree / M)), daemon=True)
    reader.start()
    reader.join(timeout=20)
    assert not reader.is_alive(), f"blocked reading {entry}"
    assert found == [machines.directory_records(template / M)] and found[0]


def test_a_results_directory_without_permission_is_not_called_missing(tmp_path, template, monkeypatch):
    tree = tmp_path / "results"
    shutil.copytree(template, tree, symlinks=True)
    _without_permission(monkeypatch, tree)
    loaded = load_results(tree)
    assert loaded.measured.empty and loaded.not_measured.empty and len(loaded.problems) == 1
    problem = loaded.problems[0]
    assert problem.path.startswith(str(tree)) and "missing" not in problem.reason
    assert re.search(r"unreadable \(Permission denied\).*no result file was read", problem.reason), problem


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads through any mode bits")
@pytest.mark.parametrize("mode", [0o000, 0o400])  # unreadable; listable but not searchable
def test_a_directory_without_permissions_is_reported(tmp_path, template, baseline, mode):
    def damage(tree: Path) -> None:
        os.chmod(tree / M, mode)
    try:
        check(tmp_path, template, baseline, Case(damage, lambda t: t / M), always_problem=True)
    finally:
        os.chmod(tmp_path / "results" / M, 0o755)


@pytest.mark.parametrize("column", ["machine", "value", "status", "file", "gpu", "params", "commit", "result_id"])
def test_a_parameter_named_like_a_column_keeps_the_column(tmp_path, template, baseline, column):
    case = Case(_set_benchmark("param_names", [column, "variant"]), lambda t: t / "benchmarks.json",
                f"param_<name>: {TIME}: {column}$", NO_ROW)
    check(tmp_path, template, baseline, case, always_problem=True)
    rows = load_results(tmp_path / "results").measured
    rows = rows[rows["benchmark"] == TIME]
    assert set(rows[f"param_{column}"]) == {"mlp", "resnet50"} and f"{column}=mlp, variant=fused" in set(rows["params"])


def test_a_machine_directory_name_that_is_not_utf8_is_skipped(tmp_path, template, baseline):
    def damage(tree: Path) -> None:
        os.rename(tree / "synthetic-h200", os.fsdecode(os.fsencode(tree) + b"/h200\xff"))

    def odd(t: Path) -> Path:
        return Path(os.fsdecode(os.fsencode(t) + b"/h200\xff"))

    check(tmp_path, template, baseline, Case(damage, odd, "not UTF-8", ANY_ROW), always_problem=True)
    loaded = load_results(tmp_path / "results")
    assert set(loaded.measured["machine"]) == {M} and "h200\\xff" in str(loaded.problems[0])


def test_a_result_file_name_that_is_not_utf8_is_skipped(tmp_path, template, baseline):
    def odd(t: Path) -> Path:
        return Path(os.fsdecode(os.fsencode(t) + b"/synthetic-h200/existing-\xff.json"))

    def damage(t: Path) -> None:
        shutil.copy(victim_file(t), odd(t))

    check(tmp_path, template, baseline, Case(damage, odd, "file name is not UTF-8", NO_ROW), always_problem=True)
    loaded = load_results(tmp_path / "results")
    files = pd.concat([loaded.measured, loaded.not_measured])["file"]
    assert len(files) and not any("\udcff" in f for f in files)  # no page or export could encode it
    assert "existing-\\xff" in " ".join(map(str, loaded.problems))


def test_names_with_control_characters_are_escaped(tmp_path, template):
    tree = tmp_path / "results"
    shutil.copytree(template, tree, symlinks=True)
    (tree / M).rename(tree / "h100\x1b]0;pwned\x07")
    (tree / "h100\x1b]0;pwned\x07" / "bad\r\n.json").write_text("{")
    loaded = load_results(tree)
    assert "h100\\x1b]0;pwned\\x07" in format_table(loaded.measured)
    assert len(loaded.problems) == 1
    text = str(loaded.problems[0])
    assert "h100\\x1b]0;pwned\\x07/bad\\r\\n.json: not valid JSON" in text
    assert not any(ord(c) < 32 for c in text)


# --- exports ------------------------------------------------------------------------------

INJECTIONS = {
    "formula =": '=HYPERLINK("http://x.example","click")', "formula +": "+cmd|' /C calc'!A0",
    "formula -": "-2+3+cmd|' /C calc'!A0", "formula @": "@SUM(1+1)*cmd|' /C calc'!A0", "tab formula": "\t=1+1",
    "cr formula": "\r=1+1", "newline": "a\nb", "crlf": "a\r\nb", "fake footer": "x\n# Reproduce: rm -rf ~",
    "html": "<script>alert(1)</script>", "img": '<img src=x onerror="alert(1)">',
    "link": "[click](javascript:alert(1))",
    "image": "![x](http://x.example/t.png)", "autolink": "<http://x.example>", "reference": "[x][1]",
    "pipe": "a|b", "backticks": "`code` ``more``", "entity": "&lt;b&gt;", "latex input": "\\input{/etc/passwd}",
    "latex write18": "\\immediate\\write18{id}", "latex specials": "100% & $x$ _ ^ ~ # { }", "optional arg": "[1cm]",
    "blank line": "a\n\nb", "end table": "\n\\end{table}\n", "escape": "\x1b[2J\x07", "rtl override": "abc\u202edef",
    "backslash pipe": "\\|", "hash": "#1, then more", "quote": 'say "hi", ok',
}


def _hostile_table(report, text: str, sources: pd.DataFrame):
    # No column holds one value in every row: Markdown and LaTeX would move it to the footer.
    frame = pd.DataFrame({text: [text, "-3.2 %", "+1.6 %"], "N": [10, 20, 30], "plain": ["ok", text, "-"]})
    src = sources.head(3).assign(machine=text, benchmark=text + ".S.time_x", gpu_model=text, torch=text,
                                 commit=text, command=text)
    return report.Table(text, frame, src, notes=[text])


def _footer_count(report, table) -> int:
    return len(table.notes) + 2 * len(report.provenance(table.sources)) + 1


SIGNED_NUMBER = re.compile(r"[+-]?(\d+\.?\d*|\.\d+)([eE][+-]?\d+)?\s?%?")


@pytest.mark.parametrize("name", INJECTIONS)
def test_csv_cells_cannot_run_as_formulas_nor_break_rows(baseline, name):
    table = _hostile_table(speedbench_report, INJECTIONS[name], baseline)
    text = speedbench_report.to_csv(table)
    lines = text.split("\n")
    assert lines[-1] == ""
    body = lines[:-1]  # plain data: the footer travels beside it (csv_provenance), a line each
    footer = speedbench_report.csv_provenance(table).split("\n")[2:-1]
    assert len(footer) == _footer_count(speedbench_report, table) and len(body) == 1 + len(table.frame)
    assert not any(ord(c) < 32 for line in footer for c in line)
    rows = list(csv.reader(io.StringIO("\n".join(body))))
    assert all(len(r) == 3 for r in rows)
    for cell in (c for r in rows for c in r):
        assert (not cell.startswith(("=", "+", "-", "@", "\t", "\r")) or SIGNED_NUMBER.fullmatch(cell)
                or cell == "'"), cell
        assert not any(ord(c) < 32 for c in cell)
    assert rows[2][0] == "-3.2 %" and rows[3][0] == "+1.6 %"  # a signed number stays a number
    back = pd.read_csv(io.StringIO(text), comment="#", dtype=str, keep_default_na=False)
    assert back.shape == (3, 3)  # a '#' in a cell is quoted: read_csv(comment='#') keeps the rest of the row


LATEX_ESCAPE = re.compile(r"\\(textbackslash|textasciitilde|textasciicircum|textless|textgreater|textbar)\{\}"
                          r"|\\[&%$#_{}]|^\{\}")


def _plain_latex(cell: str) -> str:
    return LATEX_ESCAPE.sub("", cell)


@pytest.mark.parametrize("name", INJECTIONS)
def test_latex_escapes_every_cell_title_and_footer(baseline, name):
    table = _hostile_table(speedbench_report, INJECTIONS[name], baseline)
    lines = speedbench_report.to_latex(table).split("\n")
    assert lines[-1] == "" and "" not in lines[:-1]  # no blank line: no paragraph break, no early end
    assert len(lines) == 8 + len(table.frame) + 4 + _footer_count(speedbench_report, table) + 2
    assert lines[0].startswith("% speedlib export: ")
    rows = lines[6:7 + len(table.frame) + 1]
    rows = [r for r in rows if r != r"\hline"]
    assert len(rows) == 1 + len(table.frame)
    for row in rows:
        assert row.endswith(r" \\")
        cells = row[:-3].split(" & ")
        assert len(cells) == 3
        for cell in cells:
            assert not re.search(r"[\\{}&%$#_^~<>|]", _plain_latex(cell)), cell
            assert not cell.startswith("[")
    caption = next(line for line in lines if line.startswith(r"\caption{"))
    assert not re.search(r"[\\{}&%$#_^~<>|]", _plain_latex(caption[len(r"\caption{"):-1]))
    footer = lines[lines.index(r"\par\scriptsize") + 1:-2]
    assert all(line.endswith(r"\\") and not re.search(r"[\\{}&%$#_^~<>|]", _plain_latex(line[:-2])) for line in footer)


MARKDOWN_ESCAPE = re.compile(r"\\[\\|`\[\]*]|&(lt|gt|amp);")


@pytest.mark.parametrize("name", INJECTIONS)
def test_markdown_escapes_html_links_and_newlines(baseline, name):
    table = _hostile_table(speedbench_report, INJECTIONS[name], baseline)
    lines = speedbench_report.to_markdown(table).split("\n")
    assert len(lines) == 4 + len(table.frame) + 1 + _footer_count(speedbench_report, table) + 1
    assert lines[0].startswith("## ") and not re.search(r"[<>\[\]`|&]", MARKDOWN_ESCAPE.sub("", lines[0][3:]))
    for row in lines[2:4 + len(table.frame)]:
        if row.startswith("|---"):
            continue
        assert row.startswith("| ") and row.endswith(" |")
        cells = row[2:-2].split(" | ")
        assert len(cells) == 3
        for cell in cells:
            assert not re.search(r"[<>\[\]`|&\\*]", MARKDOWN_ESCAPE.sub("", cell)), cell
    for line in lines[5 + len(table.frame):-1]:
        assert line.startswith("- ")
        if line.startswith("- Reproduce: "):
            span = line[len("- Reproduce: "):]
            fence = re.match("`+", span).group()
            assert span.endswith(fence) and fence not in span[len(fence):-len(fence)]
        else:
            assert not re.search(r"[<>\[\]`|&\\*]", MARKDOWN_ESCAPE.sub("", line[2:])), line

