"""The results tree on disk (its one owner: `ResultsTree`, speedbench/results/tree.py) and what
is read from it: the loader (asv result files -> one tidy frame), environment records,
machines, safekeeping of a run's files, merging trees from several hosts, synthetic trees.
No torch.
"""

from speedbench._api import lazy

__all__, __getattr__ = lazy(__name__, {
    'load': ('LoadedResults', 'Problem', 'load_results', 'printable', 'metric_kind', 'higher_is_better', 'result_id',
             'is_commit'),
    'machines': ('MachineMismatch', 'check_directory'),
    'merge': ('MergeError',),
    'safekeep': ('Snapshot', 'SnapshotError'),
    'synthetic': ('write_results',),
    'tree': ('ResultsTree', 'MachineDir', 'ResultsError', 'TreeBusy', 'check_writable'),
})
