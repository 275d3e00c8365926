"""From the binary's JSON-lines samples (docs/schema.md) to the Python
resource-tracker 0.5.0's tables, by the mapping docs/schema.md gives for the CSV's
first 32 columns. Values are the JSON's, unrounded; nothing is measured here."""

from __future__ import annotations

from typing import Any, Dict, Iterable, List, Optional

from .tiny_data_frame import TinyDataFrame

Row = Dict[str, Any]

# The tree's fields that fill 0.5.0's process columns (below, `process_row`): every
# other field of `process` is a column of ours after them.
PROCESS_MAPPED = frozenset(
    [
        "pid",
        "utime_secs",
        "stime_secs",
        "memory_mib",
        "read_bytes",
        "write_bytes",
        "gpu_usage",
        "gpu_vram_mib",
        "gpu_utilized",
    ]
)


def process_extra(samples: Iterable[Row]) -> List[str]:
    """The tree's columns beyond 0.5.0's: the fields of the samples' `process` that
    `PROCESS_MAPPED` does not name, in the binary's JSON order (its field registry's),
    so that a field the binary gains is a column here with no change to this package."""
    names: Dict[str, None] = {}
    for s in samples:
        p = s.get("process")
        if not p:
            continue
        for k in p:
            if k not in PROCESS_MAPPED:
                names.setdefault(k)
        # Samples of binaries before `memory_source`: `process_row` says it.
        names.setdefault("memory_source")
    return list(names)


# The Python package 0.5.0's column names and order (its SystemTracker and
# ProcessTracker), then what the binary knows beyond them.
SYSTEM_COLUMNS = [
    "timestamp",
    "processes",
    "utime",
    "stime",
    "cpu_usage",
    "memory_free_mib",
    "memory_used_mib",
    "memory_buffers_mib",
    "memory_cached_mib",
    "memory_active_mib",
    "memory_inactive_mib",
    "disk_read_bytes",
    "disk_write_bytes",
    "disk_space_total_gb",
    "disk_space_used_gb",
    "disk_space_free_gb",
    "net_recv_bytes",
    "net_sent_bytes",
    "gpu_usage",
    "gpu_vram_mib",
    "gpu_utilized",
]
SYSTEM_EXTRA = [
    "steal_time",
    "interval_secs",
    "memory_total_mib",
    "memory_available_mib",
    "swap_total_mib",
    "swap_used_mib",
    "memory_unavailable_mib",
    "cgroup_cpu_usage",
]
PROCESS_COLUMNS = [
    "timestamp",
    "pid",
    "children",
    "utime",
    "stime",
    "cpu_usage",
    "memory_mib",
    "disk_read_bytes",
    "disk_write_bytes",
    "gpu_usage",
    "gpu_vram_mib",
    "gpu_utilized",
]
# 0.5.0's human-readable names (`get_combined_metrics(human_names=True)`), after
# the "System " or "Process " prefix; a column of ours keeps its name.
HUMAN_NAMES = {
    "timestamp": "Timestamp",
    "processes": "processes",
    "utime": "CPU time (user)",
    "stime": "CPU time (system)",
    "cpu_usage": "CPU usage",
    "memory_free_mib": "free memory",
    "memory_used_mib": "used memory",
    "memory_buffers_mib": "memory buffers",
    "memory_cached_mib": "memory page/file cached",
    "memory_active_mib": "active memory",
    "memory_inactive_mib": "inactive memory",
    "disk_read_bytes": "disk read",
    "disk_write_bytes": "disk write",
    "disk_space_total_gb": "disk space total",
    "disk_space_used_gb": "disk space used",
    "disk_space_free_gb": "disk space free",
    "net_recv_bytes": "inbound network traffic",
    "net_sent_bytes": "outbound network traffic",
    "gpu_usage": "GPU usage",
    "gpu_vram_mib": "VRAM used",
    "gpu_utilized": "GPUs in use",
    "pid": "PID",
    "children": "children",
    "memory_mib": "memory usage",
}
TRACKER_COLUMNS = [
    "timestamp",
    "cpu_secs",
    "rss_mib",
    "lost_events",
    "lost_events_total",
    "bpf_run_time_secs",
]


def _sum_interval(items: Iterable[Optional[int]]) -> Optional[int]:
    """Σ of per-device interval bytes; None when no device has a reading yet (an
    empty cell in the binary's CSV)."""
    total: Optional[int] = None
    for v in items:
        if v is not None:
            total = (total or 0) + v
    return total


def system_row(s: Row) -> Row:
    cpu, mem = s.get("cpu") or {}, s.get("memory") or {}
    disks = s.get("disk") or []
    nets = s.get("network") or []
    gpus = s.get("gpu") or []
    mounts = [m for d in disks for m in d.get("mounts") or []]
    total = sum(m["total_bytes"] for m in mounts)
    avail = sum(m["available_bytes"] for m in mounts)
    return {
        "timestamp": s["timestamp_secs"],
        "processes": cpu.get("process_count"),
        "utime": cpu.get("utime_secs"),
        "stime": cpu.get("stime_secs"),
        "cpu_usage": cpu.get("utilization_pct"),
        "memory_free_mib": mem.get("free_mib"),
        "memory_used_mib": mem.get("used_mib"),
        "memory_buffers_mib": mem.get("buffers_mib"),
        "memory_cached_mib": mem.get("cached_mib"),
        "memory_active_mib": mem.get("active_mib"),
        "memory_inactive_mib": mem.get("inactive_mib"),
        "disk_read_bytes": _sum_interval(d.get("read_bytes") for d in disks),
        "disk_write_bytes": _sum_interval(d.get("write_bytes") for d in disks),
        "disk_space_total_gb": total / 1e9,
        "disk_space_used_gb": max(total - avail, 0) / 1e9,
        "disk_space_free_gb": avail / 1e9,
        "net_recv_bytes": _sum_interval(n.get("rx_bytes") for n in nets),
        "net_sent_bytes": _sum_interval(n.get("tx_bytes") for n in nets),
        "gpu_usage": sum(g.get("utilization_pct") or 0.0 for g in gpus) / 100.0,
        "gpu_vram_mib": sum((g.get("vram_used_bytes") or 0) / 1048576.0 for g in gpus),
        "gpu_utilized": sum(1 for g in gpus if (g.get("utilization_pct") or 0) > 0),
        "steal_time": cpu.get("steal_time_secs"),
        "interval_secs": s.get("interval_secs"),
        "memory_total_mib": mem.get("total_mib"),
        "memory_available_mib": mem.get("available_mib"),
        "swap_total_mib": mem.get("swap_total_mib"),
        "swap_used_mib": mem.get("swap_used_mib"),
        "memory_unavailable_mib": mem.get("unavailable_mib"),
        "cgroup_cpu_usage": cpu.get("cgroup_utilization_pct"),
    }


def memory_source(p: Row) -> str:
    """`cgroup`, `pss` or `rss`; samples of binaries before `memory_source` had PSS
    only with --pss, else RSS."""
    src = p.get("memory_source")
    if src:
        return src
    return "pss" if p.get("memory_pss_mib") is not None else "rss"


def memory_mib(p: Row) -> float:
    """The tree's memory by its source (older samples: PSS, else RSS)."""
    if p.get("memory_mib") is not None:
        return p["memory_mib"]
    pss = p.get("memory_pss_mib")
    return pss if pss is not None else p["memory_rss_mib"]


def _process_gpu(s: Row, p: Row, name: str, zero: Any) -> Any:
    """The tree's GPU figure; 0, as 0.5.0 gives, where the sample saw no GPU at
    all (the tree used none of the none there are), and None only where a GPU is
    there but its per-process figure could not be read."""
    v = p.get(name)
    if v is None and not s.get("gpu"):
        return zero
    return v


def process_row(s: Row) -> Optional[Row]:
    """None for a host-only sample (no tracked tree)."""
    p = s.get("process")
    if not p:
        return None
    cpu = s.get("cpu") or {}
    row: Row = {
        "timestamp": s["timestamp_secs"],
        "pid": p["pid"],
        "children": cpu.get("process_child_count"),
        "utime": p["utime_secs"],
        "stime": p["stime_secs"],
        "cpu_usage": cpu.get("process_cores_used"),
        # Unique pages (`memory_source`): what the summary's stats and
        # recommendation use too.
        "memory_mib": memory_mib(p),
        "disk_read_bytes": p["read_bytes"],
        "disk_write_bytes": p["write_bytes"],
        "gpu_usage": _process_gpu(s, p, "gpu_usage", 0.0),
        "gpu_vram_mib": _process_gpu(s, p, "gpu_vram_mib", 0.0),
        "gpu_utilized": _process_gpu(s, p, "gpu_utilized", 0),
    }
    # The binary's fields beyond 0.5.0's (`process_extra`), as the JSON has them.
    row.update((name, v) for name, v in p.items() if name not in PROCESS_MAPPED)
    row["memory_source"] = memory_source(p)
    return row


def tracker_row(s: Row) -> Row:
    t = s.get("tracker") or {}
    return {
        "timestamp": s["timestamp_secs"],
        "cpu_secs": t.get("cpu_secs"),
        "rss_mib": t.get("rss_mib"),
        "lost_events": t.get("lost_events"),
        "lost_events_total": t.get("lost_events_total"),
        "bpf_run_time_secs": t.get("bpf_run_time_secs"),
    }


def table(rows: List[Row], columns: List[str]) -> TinyDataFrame:
    """The rows as a TinyDataFrame of exactly `columns`, in order (0.5.0's type,
    with or without pandas; `.to_pandas()` converts it)."""
    return TinyDataFrame(rows, columns=columns)
