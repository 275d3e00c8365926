//! What the sources hand to the model for one sample.

use std::time::{Instant, SystemTime, UNIX_EPOCH};

use super::sample::{CpuSample, DiskSample, GpuSample, MemorySample, NetworkSample};
use serde::Serialize;
use tracker_common::Figures;

use super::degraded::Degradations;

/// The host part of one sample (the tree's fields of `cpu` stay None here).
#[derive(Clone, Debug, Default)]
pub struct HostReading {
    pub cpu: CpuSample,
    pub memory: MemorySample,
    pub disk: Vec<DiskSample>,
    pub network: Vec<NetworkSample>,
    /// Empty without GPUs.
    pub gpu: Vec<GpuSample>,
    /// The tree's GPU use; None when no GPU collector is active.
    pub process_gpu: Option<ProcessGpu>,
}

/// GPU use of the tracked tree in one sample.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ProcessGpu {
    /// Σ over GPUs of the tree's utilisation fraction (0..1 per GPU), in GPUs.
    pub gpu_usage: f64,
    /// VRAM held by the tree's processes, MiB.
    pub gpu_vram_mib: f64,
    /// GPUs on which the tree's utilisation was above zero.
    pub gpu_utilized: u64,
}

impl ProcessGpu {
    pub fn add(&mut self, o: ProcessGpu) {
        self.gpu_usage += o.gpu_usage;
        self.gpu_vram_mib += o.gpu_vram_mib;
        self.gpu_utilized += o.gpu_utilized;
    }
}

/// When a sample's figures were read.
#[derive(Clone, Copy, Debug)]
pub struct Stamp {
    pub at: Instant,
    /// Unix time of `at`, seconds.
    pub unix: f64,
}

/// Unix time now, microsecond precision.
pub fn unix_now() -> f64 {
    let d = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default();
    (d.as_micros() as f64) / 1e6
}

/// The tracker's own cost so far.
#[derive(Clone, Copy, Debug, Default)]
pub struct OwnCost {
    /// User + system CPU seconds since the tracker started.
    pub cpu_secs: f64,
    pub rss_mib: f64,
}

/// Everything one sample is made of.
#[derive(Clone, Debug)]
pub struct Reading {
    /// The tree's totals (default without a tree), taken at `stamp`.
    pub tree: TreeTotals,
    pub host: HostReading,
    pub stamp: Stamp,
    /// (run count, run time ns) of the BPF programs, when known.
    pub bpf: Option<(u64, u64)>,
    pub own: OwnCost,
    /// The charge of the cgroup made for the command, while it holds exactly the
    /// tree; None otherwise (memory is then Σ PSS, or Σ RSS).
    pub memcg: Option<MemcgReading>,
    /// Whether `tree.cpu_ns` is the charge of a cgroup holding exactly the tree
    /// (else the backend's sums).
    pub cpu_cgroup: bool,
    /// The stall times of the v2 cgroup holding the tree; None without one.
    pub pressure: Option<Pressure>,
}

/// Stall times of a v2 cgroup (PSI: `cpu.pressure`, `memory.pressure`,
/// `io.pressure`), µs since it was made: how long some of its tasks waited for a
/// CPU, for memory (reclaim, swap-in, thrashing) or for I/O, and how long all of
/// its tasks did at once (`full`; the kernel keeps none for CPU before 5.13).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Pressure {
    pub cpu_some_us: u64,
    pub cpu_full_us: Option<u64>,
    pub memory_some_us: u64,
    pub memory_full_us: u64,
    pub io_some_us: u64,
    pub io_full_us: u64,
}

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
    /// The figures the kernel keeps per thread, summed over the tree, exited
    /// members included: exact CPU (ns), the tick times that split it, storage
    /// bytes and bytes through read/write-like calls. Both backends fill the
    /// kernel↔user ABI's own struct, so a figure added there reaches the model
    /// with no copy field by field.
    pub fig: Figures,
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
    /// Every live process's leader was read in the kernel charged to the memory
    /// cgroup `ReadOpts::memcg_id` names. False where that is not known (any other
    /// cgroup, a process read from /proc, the procfs backend).
    pub memcg_inside: bool,
    /// What is no longer exact, by name, since the run began.
    pub degraded: Degradations,
}

/// One reading of the tree's cgroup, bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MemcgReading {
    pub current: u64,
    /// Highest charge since the cgroup was made; None where the kernel keeps none
    /// (v2 before 5.19).
    pub peak: Option<u64>,
    /// The charge's parts (`memory.stat`); None where it cannot be read.
    pub parts: Option<MemParts>,
}

/// The parts of a memory cgroup's charge that a limit treats differently, bytes:
/// anonymous memory stays (without swap); page cache is reclaimed under a limit,
/// its inactive part first; the rest of the charge is the kernel's own (stacks,
/// page tables, slab, sockets).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct MemParts {
    pub anon: u64,
    /// Page cache, tmpfs and shared memory included.
    pub file: u64,
    /// Page cache the kernel found in use more than once lately: a limit reclaims
    /// it after the inactive part.
    pub active_file: u64,
    pub inactive_file: u64,
}

/// One level of the tracker's own memory cgroup, from its own up: its limit (None:
/// none), its charge and the file pages in it, which the kernel reclaims before it
/// kills (bytes).
#[derive(Clone, Debug, PartialEq)]
pub struct MemoryLevel {
    pub dir: String,
    pub limit: Option<u64>,
    pub usage: u64,
    pub file: u64,
}

/// What the tightest limited level of the tracker's memory cgroup leaves for what
/// it has yet to allocate: its directory and the bytes free (limit less the charge
/// that cannot be reclaimed). None when no level has a limit.
pub fn memory_room(levels: &[MemoryLevel]) -> Option<(String, u64)> {
    levels
        .iter()
        .filter_map(|l| {
            let limit = l.limit?;
            Some((
                l.dir.clone(),
                limit.saturating_sub(l.usage.saturating_sub(l.file)),
            ))
        })
        .min_by_key(|(_, free)| *free)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_tightest_limited_level_gives_the_room_file_pages_counted_free() {
        let l = |dir: &str, limit, usage, file| MemoryLevel {
            dir: dir.into(),
            limit,
            usage,
            file,
        };
        let levels = [
            l("/a/b", Some(100), 90, 30),
            l("/a", Some(1000), 950, 0),
            l("/", None, 5000, 0),
        ];
        assert_eq!(memory_room(&levels), Some(("/a/b".into(), 40)));
        assert_eq!(memory_room(&levels[2..]), None);
        // A charge past the limit (a limit lowered below it) leaves nothing.
        assert_eq!(
            memory_room(&[l("/x", Some(10), 50, 0)]),
            Some(("/x".into(), 0))
        );
    }
}
