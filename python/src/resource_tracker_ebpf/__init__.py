"""resource-tracker-ebpf: the Python face of the eBPF-assisted `resource-tracker`
binary, with the API of Spare Cores' Python resource-tracker 0.5.0.

    from resource_tracker_ebpf import ResourceTracker
    with ResourceTracker(interval=0.5) as t:
        ...  # the job
    t.stats(); t.recommend_resources(); t.report().save("report.html")

The import name differs from the PyPI package's (`resource_tracker`), so both can be
installed side by side.
"""

from ._binary import find_binary
from .errors import (
    BinaryNotFoundError,
    SnapshotError,
    TrackerDiedError,
    TrackerError,
)
from .tiny_data_frame import StatSpec, TinyDataFrame
from .tracker import (
    Report,
    ResourceTracker,
    __version__,
    aggregate_stats,
    metaflow_resources,
    recommend_from_stats,
    round_memory,
    run_command,
)

__all__ = [
    "ResourceTracker",
    "Report",
    "StatSpec",
    "TinyDataFrame",
    "TrackerError",
    "BinaryNotFoundError",
    "TrackerDiedError",
    "SnapshotError",
    "find_binary",
    "aggregate_stats",
    "recommend_from_stats",
    "round_memory",
    "metaflow_resources",
    "run_command",
    "__version__",
]
