"""What touches the device and the machine while measuring: the synchronising timer and
memory counters (instruments), the machine's record and name (hardware), the standard
workloads, the DDP launcher, the interference counters and the pre-flight check. The only
package that loads torch.
"""

from speedbench._api import lazy

__all__, __getattr__ = lazy(__name__, {
    'instruments': (
        'device', 'synchronize', 'timer', 'peak_memory', 'saved_tensor_bytes', 'count_syncs', 'allocator_segments',
        'release_cached_memory', 'best_seconds', 'memory_bandwidth', 'host_copy_bandwidth', 'host_memory',
        'device_memory_in_use',
    ),
    'hardware': ('environment', 'gpu_state', 'machine_name', 'cpu_model', 'cpu_slug', 'identity'),
    'host_settings': ('cpu_frequency_policy', 'benchmark_threads', 'usable_cores'),
    'workloads': ('Workload', 'WORKLOADS', 'EmbeddingBatch'),
    'ddp_launch': ('Recipe', 'RunConfig', 'RunResult', 'RunFailed', 'RunTimedOut'),
    'interference': ('Snapshot', 'snapshot', 'window', 'load_average'),
    'preflight': ('Finding', 'Report', 'check', 'wait_until_quiet'),
    'batch_curve': ('CurvePoint', 'batch_size_curve'),
})
