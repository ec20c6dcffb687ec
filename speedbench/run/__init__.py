"""Running the suite: `speedlib run` (suite), its chunks and what they cost (plan), the
checkout and its commits, asv under a supervisor, Slurm job arrays and the short GPU slot.
"""

from speedbench._api import lazy

__all__, __getattr__ = lazy(__name__, {
    'suite': ('RunOptions', 'RunResult', 'run', 'check_options'),
    'errors': ('SuiteError',),
    'plan': ('PlanError', 'select_chunks'),
    'slurm': ('SlurmError',),
})
