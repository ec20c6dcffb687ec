"""What a page opens on when its link names nothing: the machine (a technique page), the two
machines (the Machine comparison) and the baseline. The dashboard and the static site open the
same view, so a reader of either sees the same figures first.

A GPU first: the question is which GPU, and the CPUs' small workloads are a smoke check (a page
that opened on the 2-core CPU machine showed CPU numbers to a GPU reader). The newest first: a
page that opened on the oldest GPU machine showed an earlier benchmark version's figures. The
baseline: what PyTorch does by default on that kind of machine.
"""

from __future__ import annotations

import pandas as pd

from speedbench.report.headline import machine_kind
from speedbench.techniques import Technique

__all__ = ["opening_machine", "opening_pair", "opening_baseline"]


def _ranked(rows: pd.DataFrame, current: pd.Series | None = None) -> pd.DataFrame:
    """Per machine: whether it has a GPU, whether `current` holds for any of its rows, its newest run."""
    flags = rows.assign(_gpu=rows["gpu"].map(lambda g: machine_kind(g) == "gpu"),
                        _current=True if current is None else current)
    ranked = flags.groupby("machine").agg(gpu=("_gpu", "any"), current=("_current", "any"),
                                          newest=("run_date", "max"))
    ranked["newest"] = ranked["newest"].fillna(pd.Timestamp(0, tz="UTC"))
    return ranked.sort_values(["gpu", "current", "newest"], kind="stable")


def opening_machine(rows: pd.DataFrame) -> str | None:
    """The machine a technique page opens on (`rows`: the technique's results): a GPU's, one
    with current results (not only an earlier benchmark version's), the newest measured."""
    if rows.empty:
        return None
    from speedbench.report.marks import earlier_version  # noqa: PLC0415 - the marks' one rule

    return _ranked(rows, ~earlier_version(rows)).index[-1]


def opening_pair(df: pd.DataFrame) -> tuple[str, str] | None:
    """The two machines the Machine comparison opens on: the two newest measured GPU machines
    (A the older, so B against A reads newer against older), else the two newest machines;
    None with fewer than two."""
    if df["machine"].nunique() < 2:
        return None
    two = _ranked(df).index[-2:]
    return two[0], two[1]


def opening_baseline(technique: Technique, variants: list[str], gpu) -> str:
    """The baseline a technique page opens on: what PyTorch does by default on this kind of
    machine (foreach Adam on a GPU, TF32 convolutions) where it ran, else the technique's
    baseline or the fallback that ran here (a single process where DataParallel cannot run)."""
    h = technique.comparison
    default = dict(h.default).get(machine_kind(gpu)) if h is not None else None
    if default in variants:
        return default
    return next((b for b in technique.baselines if b in variants), technique.baseline)
