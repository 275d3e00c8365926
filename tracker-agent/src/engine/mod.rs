//! Process-tree engines: `ebpf` (exact, kernel-side accounting) and `procfs`
//! (polling fallback). Both produce cumulative [`TreeTotals`]; the sampler turns
//! differences of consecutive totals into per-interval values.

pub mod btf;
pub mod ebpf;
pub mod procfs;
pub mod procread;

use serde::Serialize;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Backend {
    Ebpf,
    Procfs,
}

impl Backend {
    pub fn as_str(self) -> &'static str {
        match self {
            Backend::Ebpf => "ebpf",
            Backend::Procfs => "procfs",
        }
    }
}

/// Cumulative totals of one tree since tracking started. Every counter only grows
/// (except the `live_*` gauges), so interval values are plain differences.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct TreeTotals {
    /// Exact CPU time (ns) of the tree, exited members included.
    pub cpu_ns: u64,
    /// Tick-sampled user/system time (ns), used only to split `cpu_ns`.
    pub user_ticks_ns: u64,
    pub sys_ticks_ns: u64,
    /// Storage bytes (`read_bytes`/`write_bytes` of /proc's io files).
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// Bytes through read/write-like system calls, cached I/O included.
    pub rchar: u64,
    pub wchar: u64,
    pub procs_spawned: u64,
    pub procs_exited: u64,
    pub threads_spawned: u64,
    pub execs: u64,
    pub lost_events: u64,
    pub untracked_tasks: u64,
    /// Largest RSS (KiB) of any member, exited or live.
    pub max_rss_kib: u64,
    /// Gauges at the time of reading.
    pub live_procs: u64,
    pub live_threads: u64,
    pub rss_bytes: u64,
    pub pss_bytes: Option<u64>,
    pub root_alive: bool,
}

/// Options that change what a reading costs.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReadOpts {
    /// Read smaps_rollup for PSS (expensive).
    pub pss: bool,
}

/// One process-lifecycle record, from the eBPF ring buffer.
#[derive(Clone, Debug, Serialize)]
pub struct ProcEvent {
    pub kind: &'static str,
    pub pid: u32,
    pub ppid: u32,
    pub comm: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_secs: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Seconds since boot (CLOCK_MONOTONIC).
    pub monotonic_secs: f64,
}
