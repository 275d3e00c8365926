"""The tree's columns beyond the Python package 0.5.0's, in order: generated from
the binary's field registry (tracker-agent/src/model/sample.rs) by the test
`python_columns_match_the_registry` (TRACKER_BLESS=1 writes it). Do not edit."""

PROCESS_EXTRA = [
    "backend",
    "cpu_secs_total",
    "live_processes",
    "live_threads",
    "processes_spawned",
    "processes_exited",
    "memory_source",
    "memory_peak_mib",
    "memory_rss_mib",
    "memory_pss_mib",
    "max_process_rss_mib",
    "root_alive",
    "rchar_bytes",
    "wchar_bytes",
    "untracked_tasks",
    "memory_anon_mib",
    "memory_page_cache_mib",
    "memory_working_set_mib",
    "memory_kernel_mib",
    "cpu_pressure_secs",
    "cpu_pressure_full_secs",
    "memory_pressure_secs",
    "memory_pressure_full_secs",
    "io_pressure_secs",
    "io_pressure_full_secs",
    "memory_active_page_cache_mib",
]
