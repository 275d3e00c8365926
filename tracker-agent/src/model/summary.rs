//! The end-of-run summary: a few human lines on stderr and, with `--summary FILE`,
//! the same as one JSON object whose top-level keys scripts may rely on.

use std::path::PathBuf;

use serde::Serialize;

use super::{
    degraded::Degradation,
    reading::{Pressure, TreeTotals},
};
use super::{
    host::CloudInfo,
    meta::JobMeta,
    sample::{HostInfo, MemorySource, Sample},
    stats::{Recommendation, RunStatsOut, ServerAdvice, UsageAccum},
};

/// Accumulated over the samples of a run.
#[derive(Clone, Debug, Default)]
pub struct RunStats {
    pub samples: u64,
    pub peak_cores: f64,
    pub peak_rss_sum_mib: f64,
    /// The largest memory figure of a sample (the cgroup's own peak included).
    pub peak_memory_mib: f64,
    /// The last sample's memory source.
    pub memory_source: Option<MemorySource>,
    /// The last sample's CPU source.
    pub cpu_source: Option<&'static str>,
    pub tracker_cpu_secs: f64,
    pub bpf_run_time_secs: Option<f64>,
    pub last: TreeTotals,
    /// The tree when the run began: an attached tree's totals are counted from it.
    pub origin: TreeTotals,
    pub user_ns: u64,
    pub sys_ns: u64,
    pub max_tracker_rss_mib: f64,
    /// The tree's usage, for the statistics and the recommendation.
    pub usage: UsageAccum,
    /// The last sample's named degradations (they only accumulate).
    pub degraded: Vec<Degradation>,
    /// The stall times of the tree's v2 cgroup at the last sample.
    pub pressure: Option<Pressure>,
}

impl RunStats {
    pub fn add(&mut self, s: &Sample, now: &TreeTotals, user_ns: u64, sys_ns: u64, self_cpu: f64) {
        self.samples += 1;
        self.usage.add(s);
        if let Some(c) = s.cpu.process_cores_used {
            self.peak_cores = self.peak_cores.max(c);
        }
        if let Some(p) = &s.process {
            self.peak_rss_sum_mib = self.peak_rss_sum_mib.max(p.memory_rss_mib);
            self.peak_memory_mib = self
                .peak_memory_mib
                .max(p.memory_mib)
                .max(p.memory_peak_mib.unwrap_or(0.0));
            self.memory_source = MemorySource::named(p.memory_source);
            self.cpu_source = Some(p.cpu_source);
        }
        if let Some(t) = s.tracker.bpf_run_time_secs {
            *self.bpf_run_time_secs.get_or_insert(0.0) += t;
        }
        self.max_tracker_rss_mib = self.max_tracker_rss_mib.max(s.tracker.rss_mib);
        self.degraded.clone_from(&s.tracker.degraded);
        self.tracker_cpu_secs += self_cpu;
        self.last = now.clone();
        self.user_ns = user_ns;
        self.sys_ns = sys_ns;
    }
}

#[derive(Clone, Debug, Serialize)]
pub struct TopCommand {
    pub comm: String,
    pub processes: u64,
    pub cpu_secs: f64,
}

#[derive(Clone, Debug, Serialize)]
pub struct Summary {
    pub wall_secs: f64,
    pub cpu_user_secs: f64,
    pub cpu_system_secs: f64,
    pub processes_spawned: u64,
    pub processes_exited: u64,
    pub peak_memory_mib: f64,
    pub exit_code: Option<i32>,
    pub backend: &'static str,
    pub lost_events: u64,
    pub tracker_cpu_secs: f64,
    // Further keys; the ones above are fixed.
    /// What `peak_memory_mib` is: `cgroup`, `pss` or `rss` (as the samples'
    /// `memory_source`); null without a tree.
    pub memory_source: Option<&'static str>,
    /// What the CPU figures are, as the last sample's `cpu_source`: `cgroup` (the
    /// scheduler's charge of a cgroup holding exactly the tree) or the backend's
    /// sums (`ebpf`, `procfs`); null without a tree.
    pub cpu_source: Option<&'static str>,
    /// The peak of the samples' Σ RSS (shared pages once per process).
    pub peak_rss_sum_mib: f64,
    pub cpu_total_secs: f64,
    pub avg_cores: f64,
    pub peak_cores: f64,
    pub max_process_rss_mib: f64,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub rchar_bytes: u64,
    pub wchar_bytes: u64,
    pub execs: u64,
    pub threads_spawned: u64,
    pub still_running: u64,
    pub untracked_tasks: u64,
    /// What is no longer exact, by name, as in the samples.
    pub degraded: Vec<Degradation>,
    pub samples: u64,
    pub tracker_max_rss_mib: f64,
    pub bpf_run_time_secs: Option<f64>,
    pub backend_reason: Option<String>,
    /// `exact` (eBPF: every fork and exit of the tree) or `lower_bound` (procfs:
    /// processes that live and die between two polls are not counted; their CPU
    /// and I/O are, through their reapers).
    pub process_counts: &'static str,
    pub ebpf_load_ms: Option<f64>,
    pub bpf_programs: Vec<BpfProgram>,
    pub top_commands: Vec<TopCommand>,
    pub job: JobMeta,
    pub host: HostInfo,
    /// Cloud metadata, when discovery ran (with a token or `--discover`) and found one.
    pub cloud: Option<CloudInfo>,
    /// Sentinel streaming, when SENTINEL_API_TOKEN was set.
    pub streaming: Option<StreamReport>,
    /// OTLP export (docs/otlp.md); null without an OTLP endpoint
    pub otlp: Option<OtlpReport>,
    /// Where the samples went because stderr, their destination, was closed at
    /// start (`2>&-`); null otherwise.
    pub samples_kept_in: Option<PathBuf>,
    /// Samples that went nowhere: their output failed and no file could take
    /// them instead (0 while every sample reached a file or stderr).
    pub samples_lost: u64,
    /// The Python package's `stats()` over the tree's samples; null without a tree.
    pub stats: Option<RunStatsOut>,
    /// What the run needs (`recommend_resources()`), and whether the server was
    /// shared; null without a tree.
    pub recommendation: Option<Recommendation>,
    /// The cheapest fitting server (`--recommend-server`); null unless asked.
    pub recommended_server: Option<ServerAdvice>,
    /// The limits the command ran under (`run --cpus/--memory`) and what they did;
    /// null without them.
    pub limits: Option<LimitsReport>,
    /// How long the tree stalled, from its v2 cgroup's PSI; null without one.
    pub pressure: Option<PressureReport>,
}

/// Seconds the tree's v2 cgroup stalled over the run (PSI `total`s at the last
/// sample, the cgroup made for the command): some of its tasks (`*_secs`), or all
/// at once (`*_full_secs`), waiting for a CPU, for memory, for I/O.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct PressureReport {
    pub cpu_secs: f64,
    pub cpu_full_secs: Option<f64>,
    pub memory_secs: f64,
    pub memory_full_secs: f64,
    pub io_secs: f64,
    pub io_full_secs: f64,
}

impl PressureReport {
    pub fn of(p: &Pressure) -> PressureReport {
        let s = |us: u64| us as f64 / 1e6;
        PressureReport {
            cpu_secs: s(p.cpu_some_us),
            cpu_full_secs: p.cpu_full_us.map(s),
            memory_secs: s(p.memory_some_us),
            memory_full_secs: s(p.memory_full_us),
            io_secs: s(p.io_some_us),
            io_full_secs: s(p.io_full_us),
        }
    }
}

/// The limits a command ran under and what they did: the memory cgroup's own
/// count of OOM kills, the time the CPU quota held the tree back.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct LimitsReport {
    pub cpus: Option<f64>,
    pub memory_mib: Option<f64>,
    /// Processes the kernel killed for the memory limit; null without one.
    pub oom_kills: Option<u64>,
    /// Periods in which the quota stopped the tree, and for how long in all;
    /// null without a CPU limit.
    pub throttled_periods: Option<u64>,
    pub throttled_secs: Option<f64>,
    /// How a member of the tree left the cgroup that holds the limits; null
    /// while they held for the whole tree.
    pub escaped: Option<String>,
}

/// How the OTLP export went; in the summary as `otlp`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct OtlpReport {
    /// where the metrics went (`OTEL_EXPORTER_OTLP_ENDPOINT` and `/v1/metrics`, or
    /// `OTEL_EXPORTER_OTLP_METRICS_ENDPOINT`)
    pub endpoint: String,
    /// requests the collector accepted
    pub requests: u64,
    /// data points in them
    pub points_exported: u64,
    /// data points never delivered: refused for good, or still queued when the end's
    /// budget ran out, or dropped from a full queue
    pub points_dropped: u64,
    /// data points the collector accepted the requests of but rejected itself (its
    /// partial-success answer)
    pub points_rejected: u64,
    /// the last failure, if any
    pub last_error: Option<String>,
}

/// How streaming went; in the summary as `streaming`.
#[derive(Clone, Debug, Default, Serialize)]
pub struct StreamReport {
    pub api_url: String,
    pub run_id: Option<String>,
    pub rows: u64,
    pub rows_uploaded: u64,
    pub batches_uploaded: u64,
    pub upload_failures: u64,
    /// Registrations that got no answer in time: each may have created a run on
    /// the server that stays unfinished.
    pub registrations_timed_out: u64,
    /// Registrations answered with something that could not be used: each may
    /// have made a run on the server too. Registering stops after three.
    pub registrations_not_understood: u64,
    pub credential_refreshes: u64,
    /// Batches that waited in the spool file because memory was at its limit.
    pub spooled_batches: u64,
    /// `s3` or `inline`; null when `finish` was not accepted.
    pub data_source: Option<&'static str>,
    /// The server holds fewer rows than the run produced: nothing reached S3 and
    /// the rows did not all fit inline, or some batches never reached S3. `finish`
    /// marked the run failed; the rest is in `kept_dir`.
    pub partial: bool,
    /// Rows produced but not accepted by Sentinel (in S3 and listed, or inline).
    pub rows_not_sent: u64,
    /// Of those, rows written to `kept_dir`.
    pub rows_kept: u64,
    /// The spool failed mid-run: why, and where batches went instead.
    pub spool_failed: Option<String>,
    pub finished: bool,
    /// Where batches that could not be uploaded were written.
    pub kept_dir: Option<PathBuf>,
    pub last_error: Option<String>,
}

#[derive(Clone, Debug, Serialize)]
pub struct BpfProgram {
    pub name: String,
    pub run_count: u64,
    pub run_time_ns: u64,
}

impl Summary {
    pub fn build(
        stats: &RunStats,
        wall_secs: f64,
        exit_code: Option<i32>,
        backend: &'static str,
        backend_reason: Option<String>,
        top_commands: Vec<TopCommand>,
    ) -> Self {
        let t = &stats.last;
        let o = &stats.origin;
        let cpu_total = t.fig.cpu_ns.saturating_sub(o.fig.cpu_ns) as f64 / 1e9;
        Summary {
            wall_secs,
            cpu_user_secs: stats.user_ns as f64 / 1e9,
            cpu_system_secs: stats.sys_ns as f64 / 1e9,
            processes_spawned: t.procs_spawned,
            processes_exited: t.procs_exited,
            peak_memory_mib: peak_memory(stats),
            exit_code,
            backend,
            lost_events: t.lost_events,
            tracker_cpu_secs: stats.tracker_cpu_secs,
            memory_source: stats.memory_source.map(MemorySource::as_str),
            cpu_source: stats.cpu_source,
            peak_rss_sum_mib: stats.peak_rss_sum_mib,
            cpu_total_secs: cpu_total,
            avg_cores: if wall_secs > 0.0 {
                cpu_total / wall_secs
            } else {
                0.0
            },
            peak_cores: stats.peak_cores,
            max_process_rss_mib: t.max_rss_kib as f64 / 1024.0,
            read_bytes: t.fig.read_bytes.saturating_sub(o.fig.read_bytes),
            write_bytes: t.fig.write_bytes.saturating_sub(o.fig.write_bytes),
            rchar_bytes: t.fig.rchar.saturating_sub(o.fig.rchar),
            wchar_bytes: t.fig.wchar.saturating_sub(o.fig.wchar),
            execs: t.execs.saturating_sub(o.execs),
            threads_spawned: t.threads_spawned,
            still_running: t.live_procs,
            untracked_tasks: t.untracked_tasks,
            degraded: stats.degraded.clone(),
            samples: stats.samples,
            tracker_max_rss_mib: stats.max_tracker_rss_mib,
            bpf_run_time_secs: stats.bpf_run_time_secs,
            backend_reason,
            process_counts: if backend == "ebpf" {
                "exact"
            } else {
                "lower_bound"
            },
            ebpf_load_ms: None,
            bpf_programs: Vec::new(),
            top_commands,
            job: JobMeta::default(),
            host: HostInfo::default(),
            cloud: None,
            streaming: None,
            otlp: None,
            samples_kept_in: None,
            samples_lost: 0,
            stats: stats.usage.stats(),
            recommendation: stats.usage.recommendation(),
            recommended_server: None,
            limits: None,
            pressure: stats.pressure.as_ref().map(PressureReport::of),
        }
    }
}

impl Summary {
    /// The limits the command ran under, and what they did. A memory limit whose
    /// OOM killer ended a member leaves the peak unknown: the advice grows past the
    /// limit.
    pub fn set_limits(&mut self, limits: Option<LimitsReport>) {
        if let (Some(l), Some(r)) = (&limits, &mut self.recommendation) {
            if let (Some(kills), Some(limit)) = (l.oom_kills, l.memory_mib) {
                if kills > 0 {
                    r.after_oom_kill(limit);
                }
            }
        }
        self.limits = limits;
    }
}

/// The run's peak by its memory source. A cgroup's own peak is the kernel's, taken
/// between samples too. Σ PSS is only seen at samples: the largest RSS a single
/// member ever had (its `maxrss` at exit, between samples too) is a floor beside it.
fn peak_memory(stats: &RunStats) -> f64 {
    match stats.memory_source {
        Some(MemorySource::Cgroup) | None => stats.peak_memory_mib,
        Some(MemorySource::Pss | MemorySource::Rss) => stats
            .peak_memory_mib
            .max(stats.last.max_rss_kib as f64 / 1024.0),
    }
}
