"""Ticks of a log axis, written out: the coarsest 1-2-5 (or finer) steps that leave neither end
of the axis bare, and a tick each side of 1x on a ratio axis. The site's plotly charts
(speedbench.report.charts) and the dashboard's Vega-Lite ones (speedbench.report.vega,
history_chart) use them; no chart library here."""

from __future__ import annotations

import math

__all__ = ["ratio_ticks", "log_span"]

# Tick steps per decade, coarse to fine: a chart of 0.8x-1.1x gets 0.8, 0.9, 1, 1.1 rather than
# a lone "1x" (its 1-2-5 steps would all fall outside).
_TICK_STEPS = ((1, 2, 5), (1, 1.5, 2, 3, 5, 7), (1, 1.2, 1.5, 2, 3, 4, 5, 7),
               (1, 1.1, 1.2, 1.3, 1.5, 1.7, 2, 2.5, 3, 4, 5, 6, 7, 8, 9))
# The most of the (log) axis left without a tick at either end: 0.37x-1.44x once got only
# "0.5x, 0.7x, 1x", with three of four bars beyond the last tick, and a 2.6 % bar sat
# below a lowest tick of 5 %.
_UNTICKED_END = 0.15


def _covers(ticks: list[float], low: float, high: float) -> bool:
    span = math.log(high / low)
    return (len(ticks) >= 3 and math.log(ticks[0] / low) <= _UNTICKED_END * span
            and math.log(high / ticks[-1]) <= _UNTICKED_END * span)


def ratio_ticks(low: float, high: float) -> list[float]:
    """Log-axis ticks between `low` and `high`: the coarsest steps that give at least three
    and leave neither end of the axis bare; for a range narrower still (0.97x-1.04x), even
    steps of 0.01, 0.02 or 0.05. Any magnitude: bytes reach 10^10, ratios 10^-3."""
    decades = range(math.floor(math.log10(low)), math.ceil(math.log10(high)) + 1)

    def candidates(steps) -> list[float]:
        return [round(m * 10.0 ** e, 6 - e) for e in decades for m in steps if low <= m * 10.0 ** e <= high]

    for steps in _TICK_STEPS:
        ticks = candidates(steps)
        if _covers(ticks, low, high):
            return _both_sides_of_1x(ticks, candidates(_TICK_STEPS[-1]), low, high)
    span = high - low
    if span > 0:  # even steps a quarter of the span or so: 38-42 ms gets 38, 39, ..., 42
        base = 10.0 ** math.floor(math.log10(span / 4))
        for step in (base, 2 * base, 5 * base, 10 * base):
            ticks = [round(k * step, 10) for k in range(math.ceil(low / step), math.floor(high / step) + 1)]
            if 3 <= len(ticks) <= 8:
                return ticks
    return ticks


def _both_sides_of_1x(ticks: list[float], fine: list[float], low: float, high: float) -> list[float]:
    """Where the axis reaches past 1x on both sides (a ratio axis padded by 10 % either way),
    a tick on each: a 0.989x bar once stood left of 1x with its nearest tick at 1x and the
    next at 1.5x. The tick added is the finest step nearest 1x on the bare side."""
    if not (low < 1 / 1.08 and high > 1.08):
        return ticks
    below = [t for t in fine if t < 1]
    above = [t for t in fine if t > 1]
    if below and not any(t < 1 for t in ticks):
        ticks = sorted([*ticks, below[-1]])
    if above and not any(t > 1 for t in ticks):
        ticks = sorted([*ticks, above[0]])
    return ticks


def log_span(values) -> tuple[float, float, list[float]] | None:
    """A log axis over `values`: (low, high, ticks), a fifth of the range beyond the extremes so
    that every tick shows; None where no value is above 0 (a log axis has no 0)."""
    shown = [v for v in values if v > 0 and math.isfinite(v)]
    if not shown:
        return None
    low, high = min(shown) / 1.2, max(shown) * 1.2
    return low, high, ratio_ticks(low, high)
