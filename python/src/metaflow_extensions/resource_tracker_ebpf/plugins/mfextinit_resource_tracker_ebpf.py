"""Metaflow extension of resource-tracker-ebpf.

`@track_resources_ebpf` always; `@track_resources` as well unless Spare Cores'
`resource-tracker` package (whose Metaflow extension defines that name) is installed
too: Metaflow would silently let one of the two win, so the shared name is left to it
and ours stays reachable under its own name.
"""

from importlib.metadata import PackageNotFoundError, distribution

STEP_DECORATORS_DESC = [
    (
        "track_resources_ebpf",
        ".track_resources_ebpf.decorator.TrackResourcesEbpfDecorator",
    ),
]
try:
    distribution("resource-tracker")
except PackageNotFoundError:
    STEP_DECORATORS_DESC.append(
        ("track_resources", ".track_resources_ebpf.decorator.TrackResourcesDecorator")
    )
