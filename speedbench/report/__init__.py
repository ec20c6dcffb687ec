"""Tables from the tidy results and their exports: speedups, memory, paired speedups, floors,
history across commits, the sources' claims, the headline grid, machine comparisons, the
write-up. The dashboard, `speedlib report` and the tests use `report.X`. No Streamlit, no torch.
"""

from speedbench._api import lazy

__all__, __getattr__ = lazy(__name__, {
    'rows': ('Table', 'param_columns', 'latest', 'newest_runs', 'case_label', 'shared_config', 'natural', 'fmt_ratio',
             'fmt_value', 'UNDEFINED'),
    'marks': (
        'citable', 'contended', 'earlier_version', 'machine_state', 'gpu_tests_failed', 'with_earlier_note',
        'CONTENDED', 'CONTENDED_NOTE', 'EARLIER', 'EARLIER_NOTE', 'GPU_TESTS_FAILED', 'GPU_TESTS_NOTE',
    ),
    'ratios': ('speedups', 'speedup_table', 'memory_table', 'MEMORY_NOTE'),
    'paired_speedups': (
        'paired', 'paired_table', 'against', 'other_baselines', 'headline_rows', 'why_wide', 'PAIRED_NOISE_TARGET',
        'PAIRED_WIDTH_TARGET',
    ),
    'reruns': ('paired_noise', 'noise', 'noise_table', 'NOISE_TARGET'),
    'floors': ('floor_table', 'floor_figures', 'FLOOR_ABOVE_NOTE', 'FLOOR_FIGURES', 'FLOOR_ONLY', 'NOT_A_BANDWIDTH',
               'NOT_RECORDED'),
    'roofline': ('roofline_table',),
    'commits': ('history', 'history_table', 'resolve_commit', 'compare_commits', 'change_table'),
    'machines_compare': ('compare_machines', 'machine_comparison', 'same_work', 'speedup_comparison', 'machines_table',
                         'gpu_tests_table'),
    'opening': ('opening_machine', 'opening_pair', 'opening_baseline'),
    'claims': ('Claim', 'CLAIMS', 'claims_table', 'comparable', 'is_own_baseline', 'never_run', 'still_missing',
               'why_not_measured'),
    'exports': (
        'to_markdown', 'to_csv', 'to_latex', 'csv_bundle', 'csv_provenance', 'provenance', 'provenance_path',
        'reproduce_command', 'bibtex', 'md_escape', 'md_code', 'run_state', 'footer_lines',
    ),
    'speedbench.results.load': ('is_commit',),
    'speedbench.stats.significance': (
        'SIGNIFICANCE_FACTOR', 'P_THRESHOLD', 'MIN_SEGMENT', 'EXACT_MAX', 'MannWhitney', 'mann_whitney_u', 'differ',
    ),
    'speedbench.techniques': ('TECHNIQUES',),
})
