"""The marks on a table's rows and their notes (earlier benchmark version †, contended ‡, GPU tests failed §),
the machine state in words, the citable results, and the columns every per-result table starts and ends with.
"""

from __future__ import annotations

import pandas as pd

from speedbench.report.rows import _shown, latest, shared_config
from speedbench.results import gpu_tests as gpu_verdicts
from speedbench.stats import contention

__all__ = ["EARLIER", "EARLIER_NOTE", "earlier_version", "CONTENDED", "CONTENDED_NOTE", "contended",
           "GPU_TESTS_FAILED", "GPU_TESTS_NOTE", "gpu_tests_failed", "with_earlier_note", "machine_state", "citable"]


# Marks a row or cell measured with an earlier version of its benchmark (speedbench.results.load
# keeps a machine's newest results until it measures the current version).
EARLIER = "†"
EARLIER_NOTE = (f"{EARLIER}: measured with an earlier version of the benchmark, whose code has changed since "
                "(the machine's newest results; its next run of the benchmark replaces them)")


def earlier_version(s: pd.DataFrame) -> pd.Series:
    """Per row: measured with an earlier version of its benchmark (speedbench.results.load flags it)."""
    if "earlier_version" not in s:
        return pd.Series(False, index=s.index)
    return s["earlier_version"].fillna(False).astype(bool)


# Marks a row measured while something else kept the machine busy (speedbench.stats.contention).
CONTENDED = contention.MARK
CONTENDED_NOTE = (f"{CONTENDED}: contended: other work disturbed more than "
                  f"{contention.MAX_DISTURBED_SHARE:.0%} of the rounds (or left fewer than "
                  f"{contention.MIN_CLEAN_ROUNDS} undisturbed), so the figure is shown but is not a clean one: "
                  "rerun it on a quiet machine (speedlib env --check says what is busy; speedlib run --require-quiet "
                  "refuses to measure on a busy one)")


def contended(s: pd.DataFrame) -> pd.Series:
    """Per row: measured on a machine busy enough that the figure is not a clean one; for a
    row that divides two results (one machine against another: `contention_base`), either."""
    busy = pd.Series(False, index=s.index)
    for column in ("contention", "contention_base"):
        if column in s:
            busy |= s[column].eq(contention.CONTENDED)
    return busy


# Marks a row measured at a commit whose GPU-only tests failed on its machine (the verdict
# `speedlib slot` keeps in results/<machine>/gpu-tests/: speedbench.results.gpu_tests).
GPU_TESTS_FAILED = "§"
GPU_TESTS_NOTE = (f"{GPU_TESTS_FAILED}: the GPU-only tests failed on that machine at that commit (speedlib slot's "
                  "verdict): the figure was measured, but the code behind it did not pass its own GPU tests there; "
                  "the failing tests are named below")


def gpu_tests_failed(s: pd.DataFrame) -> pd.Series:
    """Per row: measured at a commit whose GPU tests failed on its machine; for a row that
    divides two results (`gpu_tests_base`: one machine against another), on either."""
    failed = pd.Series(False, index=s.index)
    for column in ("gpu_tests", "gpu_tests_base"):
        if column in s:
            failed |= s[column].eq(gpu_verdicts.FAILED)
    return failed


def _gpu_tests_notes(s: pd.DataFrame) -> list[str]:
    """The section mark's note and each failing verdict (machine, commit, the tests that
    failed); then, in one line, the verdicts of the other GPU machines' commits here, "not
    recorded" included: a GPU figure with no verdict must not read as one that passed. CPU
    machines (not applicable) are left out."""
    seen: dict[tuple[str, str], tuple[str, str]] = {}
    for suffix in ("", "_base"):
        if f"gpu_tests{suffix}" not in s:
            continue
        machine = s[f"machine{suffix}"] if f"machine{suffix}" in s else s["machine"]
        commit = s[f"commit{suffix}"] if f"commit{suffix}" in s else s["commit"]
        for m, c, state, note in zip(machine, commit, s[f"gpu_tests{suffix}"],
                                     s[f"gpu_tests_note{suffix}"], strict=True):
            if isinstance(state, str) and state != gpu_verdicts.NOT_APPLICABLE:
                seen.setdefault((m, c), (state, note))
    failed = [f"{GPU_TESTS_FAILED} {m} {c[:8]}: GPU tests {note}"
              for (m, c), (state, note) in sorted(seen.items()) if state == gpu_verdicts.FAILED]
    others: dict[str, list[str]] = {}
    for (m, c), (state, _) in sorted(seen.items()):
        if state != gpu_verdicts.FAILED:
            others.setdefault(state, []).append(f"{m} {c[:8]}")
    said = "; ".join(f"{state}: {', '.join(where)}" for state, where in others.items())
    return ([GPU_TESTS_NOTE, *failed] if failed else []) + ([f"GPU tests (speedlib slot) at these commits: {said}"]
                                                             if said else [])


def _commit_label(s: pd.DataFrame) -> pd.Series:
    """The short commit, with the dagger where the row comes from an earlier benchmark version,
    the double dagger where the machine was contended while it was measured, and the section
    mark where the commit's GPU tests failed on that machine."""
    return (s["commit"].str[:8] + earlier_version(s).map({True: f" {EARLIER}", False: ""})
            + contended(s).map({True: f" {CONTENDED}", False: ""})
            + gpu_tests_failed(s).map({True: f" {GPU_TESTS_FAILED}", False: ""}))


def with_earlier_note(notes: list[str], s: pd.DataFrame) -> list[str]:
    """`notes` and the notes of the marks that `s` carries: the dagger's, the double dagger's
    and each contended result's counters, the section mark's and the GPU tests' verdicts."""
    out = notes + [EARLIER_NOTE] if earlier_version(s).any() else list(notes)
    out += _gpu_tests_notes(s)
    busy = s[contended(s)]
    if not busy.empty:
        out.append(CONTENDED_NOTE)
        where = busy["benchmark"].str.rsplit(".", n=1).str[0] + busy["params"].map(
            # the configuration: which of a class's rounds
            lambda p: f" ({shared_config(p)})" if shared_config(p) else "")
        for (machine, commit, bench, note), _ in busy.groupby(["machine", "commit", where, "contention_note"],
                                                              sort=True):
            out.append(f"{CONTENDED} {machine} {commit[:8]} {bench}: {note}")
    return out


_STATE_WORDS = {contention.CLEAN: "quiet: no round disturbed", contention.UNKNOWN: "not recorded", "": "not recorded"}


def machine_state(s: pd.DataFrame) -> pd.Series:
    """Per row, what the interference counters said, in a few words: "quiet: no round
    disturbed", "2 disturbed rounds left out of 15 (...)", "‡ contended: ...", or "not
    recorded" (measured before speedlib recorded them). The CSV's `contention` column holds
    the same verdict as clean, dropped, contended or unknown."""
    if "contention" not in s:
        return pd.Series("not recorded", index=s.index, dtype=object)
    notes = s["contention_note"] if "contention_note" in s else pd.Series("", index=s.index)
    # an exact count (bytes) keeps no counters: interference cannot change it
    exact = s["kind"].eq("memory") if "kind" in s else pd.Series(False, index=s.index)
    return pd.Series(["exact count" if is_exact else _STATE_WORDS.get(state)
                      or (f"{CONTENDED} {note}" if state == contention.CONTENDED else note)
                      for state, note, is_exact in zip(s["contention"].fillna(""), notes.fillna(""), exact,
                                                       strict=True)],
                     index=s.index, dtype=object)


def citable(df: pd.DataFrame) -> pd.DataFrame:
    """`latest(df)`, but where its result is contended and the same machine measured the same
    benchmark and parameters without contention at an earlier commit, the newest such result
    instead: what a headline or a claim cites. The commit column shows which was taken; a
    contended result stays (marked) where no clean one exists."""
    last = latest(df)
    busy = last[contended(last)]
    if busy.empty:
        return last
    keys = ["machine", "benchmark", "params"]
    clean = df[~contended(df)].merge(busy[keys].drop_duplicates(), on=keys, how="inner", suffixes=("", ""))
    if clean.empty:
        return last
    # the newest clean result of each key (clean keeps df's columns; merge resets the index)
    newest = clean.sort_values("commit_date", ascending=False, kind="stable").drop_duplicates(keys)
    replaced = last.merge(newest[keys], on=keys, how="left", indicator=True)["_merge"].eq("both").to_numpy()
    return pd.concat([last[~(contended(last).to_numpy() & replaced)], newest[last.columns]], ignore_index=True)


def _identity(s: pd.DataFrame) -> dict:
    """The leading columns every per-result table shows: where and what was measured."""
    return {"machine": s["machine"], "GPU": s["gpu"], "commit": _commit_label(s), "benchmark": s["benchmark"],
            **{p: s[p] for p in _shown(s)}}


def _numbers(s: pd.DataFrame, **columns) -> pd.DataFrame:
    """A table's rows as numbers: where and what was measured (full commit hash), then
    `columns`, then N and the result ID that names the measured result."""
    def column(name: str):  # frames built by hand (tests, other tools) may lack some
        return s[name] if name in s else pd.Series([""] * len(s), index=s.index, dtype=object)

    return pd.DataFrame({
        "machine": column("machine"), "gpu": column("gpu"), "commit": column("commit"),
        "technique": column("technique"), "benchmark": column("benchmark"), **{p: s[p] for p in _shown(s)},
        **({"variant": s["variant"]} if "variant" in s else {}),
        **columns, "N": column("n"),
        # the marks as columns, so a script can filter on them: †, ‡ and §
        "earlier_version": earlier_version(s), "contended": contended(s),
        "contention": column("contention"), "gpu_tests_failed": gpu_tests_failed(s),
        # the commit's GPU tests on the machine: passed, failed, incomplete, none ran, not recorded, not applicable
        "gpu_tests": column("gpu_tests"), "result_id": column("result_id"),
    }).reset_index(drop=True)
