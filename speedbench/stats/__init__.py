"""The statistics of a measurement, with no files and no torch: paired ratios and their
intervals, asv's significance rule and step detection, and the contention verdicts.
"""

from speedbench._api import lazy

__all__, __getattr__ = lazy(__name__, {
    'paired': ('take_turns', 'PairedRatio', 'paired_ratio', 'ratio_estimate', 'signed_rank_cutoff'),
    'significance': (
        'SIGNIFICANCE_FACTOR', 'P_THRESHOLD', 'EXACT_MAX', 'MIN_SEGMENT', 'MannWhitney', 'mann_whitney_u', 'differ',
    ),
    'contention': ('Verdict', 'judge', 'summary_line'),
})
