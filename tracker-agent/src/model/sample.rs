//! The one sample model. Every output (JSON lines, CSV, Sentinel) is written
//! from these types. Documented field by field in docs/schema.md.

use serde::Serialize;

use super::degraded::Degradation;

#[derive(Clone, Debug, Default, Serialize)]
pub struct Sample {
    /// Unix time of the reading, microsecond precision.
    pub timestamp_secs: f64,
    /// Measured length of the interval this sample covers.
    pub interval_secs: f64,
    pub job_name: Option<String>,
    pub cpu: CpuSample,
    pub memory: MemorySample,
    pub network: Vec<NetworkSample>,
    pub disk: Vec<DiskSample>,
    /// Filled by the GPU collectors; always present, empty without GPUs.
    pub gpu: Vec<GpuSample>,
    /// The tracked process tree; null without `--pid` or a command.
    pub process: Option<ProcessSample>,
    pub tracker: TrackerSample,
    /// `interval_secs` in whole milliseconds (the Rust sibling's name).
    pub actual_interval_ms: u64,
    /// Root pid of the tracked tree; null without one.
    pub tracked_pid: Option<u32>,
    /// This tracker's version.
    #[serde(rename = "resource-tracker-version")]
    pub version: &'static str,
}

impl Sample {
    /// All mounts' (total, available to users) bytes; used is total − available,
    /// reserved blocks counting as used, as the Python package counts it.
    pub fn disk_space(&self) -> (u64, u64) {
        self.disk
            .iter()
            .flat_map(|d| &d.mounts)
            .fold((0, 0), |(t, a), m| {
                (t + m.total_bytes, a + m.available_bytes)
            })
    }

    /// All GPUs: busy GPUs (Σ utilisation ÷ 100) and VRAM used, MiB.
    pub fn gpu_totals(&self) -> (f64, f64) {
        let busy = self
            .gpu
            .iter()
            .filter_map(|g| g.utilization_pct)
            .sum::<f64>()
            / 100.0;
        let vram = self
            .gpu
            .iter()
            .filter_map(|g| g.vram_used_bytes)
            .map(|b| b as f64 / 1048576.0)
            .sum();
        (busy, vram)
    }
}

/// Σ of the values present; None when none is.
pub fn sum_present(v: impl Iterator<Item = Option<u64>>) -> Option<u64> {
    v.flatten()
        .fold(None, |a, b| Some(a.unwrap_or(0u64).saturating_add(b)))
}

/// Host CPU from /proc/stat plus the tree's share. Host fields are null when
/// /proc/stat cannot be read.
#[derive(Clone, Debug, Default, Serialize)]
pub struct CpuSample {
    /// Fractional cores busy over the interval (0..N), all non-idle time but steal.
    pub utilization_pct: Option<f64>,
    /// Busy percentage per logical core (0–100).
    pub per_core_pct: Option<Vec<f64>>,
    /// Host user+nice CPU seconds in the interval.
    pub utime_secs: Option<f64>,
    /// Host system CPU seconds in the interval.
    pub stime_secs: Option<f64>,
    /// Runnable tasks (`procs_running`).
    pub process_count: Option<u64>,
    /// Cores used by the tracked tree over the interval (null without a tree).
    pub process_cores_used: Option<f64>,
    /// Live descendants of the root, the root excluded (null without a tree).
    pub process_child_count: Option<u64>,
    /// Host CPU seconds stolen by the hypervisor in the interval (all cores).
    pub steal_time_secs: Option<f64>,
    /// Stolen share of all CPU time in the interval, 0–100.
    pub steal_time_pct: Option<f64>,
    /// Stolen share per core, 0–100; empty while steal is aggregated (the default).
    pub per_core_steal_time_pct: Option<Vec<f64>>,
    /// CPU seconds used by the tracker's own cgroup in the interval.
    pub cgroup_usage_secs: Option<f64>,
    /// Cores used by the tracker's own cgroup over the interval, at most its quota
    /// (or the cores online).
    pub cgroup_utilization_pct: Option<f64>,
    #[serde(flatten)]
    pub tree: TreeCompat,
}

/// The tracked tree's figures under `cpu`, with the Rust sibling's names and
/// integer types, copied from `process` (null without a tree).
#[derive(Clone, Debug, Default, Serialize)]
pub struct TreeCompat {
    pub process_utime_secs: Option<f64>,
    pub process_stime_secs: Option<f64>,
    /// Whole MiB, rounded down.
    pub process_rss_mib: Option<u64>,
    /// Whole MiB, rounded down; null without `--pss`.
    pub process_pss_mib: Option<u64>,
    pub process_disk_read_bytes: Option<u64>,
    pub process_disk_write_bytes: Option<u64>,
    pub process_gpu_usage: Option<f64>,
    pub process_gpu_vram_mib: Option<f64>,
    pub process_gpu_utilized: Option<u64>,
}

impl TreeCompat {
    pub fn of(p: &ProcessSample) -> TreeCompat {
        TreeCompat {
            process_utime_secs: Some(p.utime_secs),
            process_stime_secs: Some(p.stime_secs),
            process_rss_mib: Some(p.memory_rss_mib as u64),
            process_pss_mib: p.memory_pss_mib.map(|m| m as u64),
            process_disk_read_bytes: Some(p.read_bytes),
            process_disk_write_bytes: Some(p.write_bytes),
            process_gpu_usage: p.gpu_usage,
            process_gpu_vram_mib: p.gpu_vram_mib,
            process_gpu_utilized: p.gpu_utilized,
        }
    }
}

/// /proc/meminfo in MiB; each field null when its line is missing.
#[derive(Clone, Debug, Default, Serialize)]
pub struct MemorySample {
    pub total_mib: Option<f64>,
    /// total − free − buffers − cached (the guide's definition).
    pub used_mib: Option<f64>,
    pub used_pct: Option<f64>,
    pub free_mib: Option<f64>,
    pub available_mib: Option<f64>,
    pub buffers_mib: Option<f64>,
    /// Cached + SReclaimable.
    pub cached_mib: Option<f64>,
    pub active_mib: Option<f64>,
    pub inactive_mib: Option<f64>,
    pub swap_total_mib: Option<f64>,
    pub swap_used_mib: Option<f64>,
    pub swap_used_pct: Option<f64>,
    /// total − MemAvailable: what the Rust sibling 0.1.18 and procps-ng's `free`
    /// call used.
    pub unavailable_mib: Option<f64>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct NetworkSample {
    pub interface: String,
    pub mac_address: Option<String>,
    pub driver: Option<String>,
    pub operstate: Option<String>,
    /// −1 when the link reports no speed.
    pub speed_mbps: i64,
    pub mtu: Option<u32>,
    /// Null in the first reading of an interface that appeared mid-run.
    pub rx_bytes_per_sec: Option<f64>,
    pub tx_bytes_per_sec: Option<f64>,
    /// Exact bytes in the interval (the CSV's per-interval columns).
    pub rx_bytes: Option<u64>,
    pub tx_bytes: Option<u64>,
    pub rx_bytes_total: u64,
    pub tx_bytes_total: u64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct DiskSample {
    pub device: String,
    pub model: Option<String>,
    pub vendor: Option<String>,
    pub serial: Option<String>,
    /// `nvme`, `ssd` or `hdd`.
    pub device_type: Option<String>,
    pub capacity_bytes: Option<u64>,
    pub mounts: Vec<MountSample>,
    /// Null in the first reading of a device that appeared mid-run.
    pub read_bytes_per_sec: Option<f64>,
    pub write_bytes_per_sec: Option<f64>,
    /// Exact bytes in the interval (the CSV's per-interval columns).
    pub read_bytes: Option<u64>,
    pub write_bytes: Option<u64>,
    /// Null when /proc/diskstats has no line for the device.
    pub read_bytes_total: Option<u64>,
    pub write_bytes_total: Option<u64>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct MountSample {
    pub mount_point: String,
    pub filesystem: String,
    pub total_bytes: u64,
    /// (blocks − free blocks) × fragment size, as df counts it.
    pub used_bytes: u64,
    /// Available to unprivileged users.
    pub available_bytes: u64,
    pub used_pct: f64,
}

/// One accelerator, from the GPU collectors.
#[derive(Clone, Debug, Default, Serialize)]
pub struct GpuSample {
    pub uuid: Option<String>,
    pub name: Option<String>,
    pub device_type: String,
    pub host_id: Option<String>,
    pub detail: std::collections::BTreeMap<String, String>,
    pub utilization_pct: Option<f64>,
    pub vram_total_bytes: Option<u64>,
    pub vram_used_bytes: Option<u64>,
    pub vram_used_pct: Option<f64>,
    pub temperature_celsius: Option<f64>,
    pub power_watts: Option<f64>,
    pub frequency_mhz: Option<f64>,
    pub core_count: Option<u64>,
}

/// Facts about the host, read once at start (Sentinel's field names).
#[derive(Clone, Debug, Default, Serialize)]
pub struct HostInfo {
    pub host_vcpus: Option<u64>,
    pub host_cpu_model: Option<String>,
    pub host_memory_mib: Option<f64>,
    pub host_gpu_model: Option<String>,
    pub host_gpu_count: Option<u64>,
    pub host_gpu_memory_mib: Option<f64>,
    /// Sum of the listed disks' capacities, 10^9 bytes.
    pub host_storage_gb: Option<f64>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct ProcessSample {
    pub pid: u32,
    /// `ebpf` or `procfs`.
    pub backend: &'static str,
    /// CPU of the whole tree in this interval, split into user and system time.
    pub utime_secs: f64,
    pub stime_secs: f64,
    /// CPU of the whole tree since tracking started (exited members included).
    pub cpu_secs_total: f64,
    /// What the CPU figures are: `cgroup` (the scheduler's charge of a cgroup
    /// holding exactly the tree, which `run` makes for the command where it can),
    /// else the backend's sums over the members (`ebpf` or `procfs`).
    pub cpu_source: &'static str,
    pub processes_spawned: u64,
    pub processes_exited: u64,
    pub live_processes: u64,
    pub live_threads: u64,
    /// The tree's memory by `memory_source`: what a container limit would need.
    pub memory_mib: f64,
    /// `cgroup` (the charge of a cgroup holding exactly the tree), `pss` (Σ PSS of
    /// the live members) or `rss` (Σ RSS, when PSS cannot be read).
    pub memory_source: &'static str,
    /// The cgroup's own peak since the start (`cgroup` source only).
    pub memory_peak_mib: Option<f64>,
    /// Σ RSS of the live members: shared pages count once per process.
    pub memory_rss_mib: f64,
    /// Σ PSS: read when it is the source, or every sample with `--pss`.
    pub memory_pss_mib: Option<f64>,
    /// Largest RSS of any single member so far.
    pub max_process_rss_mib: f64,
    /// Storage bytes read/written by the tree in this interval.
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// Bytes the tree passed through read/write-like system calls in this interval,
    /// page-cache hits and pipes included.
    pub rchar_bytes: u64,
    pub wchar_bytes: u64,
    pub root_alive: bool,
    /// New tasks the kernel could not record (task map full); 0 when exact.
    pub untracked_tasks: u64,
    /// GPUs used by the tree (Σ of its utilisation fraction per GPU); null when no
    /// GPU collector is active.
    pub gpu_usage: Option<f64>,
    /// VRAM held by the tree's live processes, MiB.
    pub gpu_vram_mib: Option<f64>,
    /// GPUs on which the tree's utilisation was above zero.
    pub gpu_utilized: Option<u64>,
}

/// Where the tree's memory figure comes from, best first.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum MemorySource {
    /// The charge of a cgroup made for the command, holding exactly the tree.
    Cgroup,
    /// Σ PSS of the live members (`smaps_rollup`): each shared page once.
    Pss,
    /// Σ RSS, where PSS cannot be read: shared pages once per process.
    Rss,
}

impl MemorySource {
    pub fn as_str(self) -> &'static str {
        match self {
            MemorySource::Cgroup => "cgroup",
            MemorySource::Pss => "pss",
            MemorySource::Rss => "rss",
        }
    }

    /// The source a recorded name stands for (files of other versions included).
    pub fn named(s: &str) -> Option<MemorySource> {
        match s {
            "cgroup" => Some(MemorySource::Cgroup),
            "pss" => Some(MemorySource::Pss),
            "rss" => Some(MemorySource::Rss),
            _ => None,
        }
    }
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct TrackerSample {
    /// The tracker's own CPU in this interval (user + system).
    pub cpu_secs: f64,
    pub rss_mib: f64,
    /// Run time of the BPF programs in this interval; null unless BPF statistics are on.
    pub bpf_run_time_secs: Option<f64>,
    pub bpf_run_count: Option<u64>,
    /// Events dropped by the ring buffer in this interval and in total (totals stay
    /// exact regardless: they are kept in kernel maps).
    pub lost_events: u64,
    pub lost_events_total: u64,
    /// What is no longer exact, by name (empty when every figure is): from the
    /// moment it happened, in every sample.
    pub degraded: Vec<Degradation>,
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use serde_json::Value;

    use super::*;
    use crate::model::{BpfProgram, RunStats, StreamReport, Summary, TopCommand};

    /// Dotted paths of every field of a JSON value (array items as `name[]`).
    fn paths(prefix: &str, v: &Value, out: &mut BTreeSet<String>) {
        match v {
            Value::Object(m) => {
                for (k, v) in m {
                    let p = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    out.insert(p.clone());
                    paths(&p, v, out);
                }
            }
            Value::Array(a) => {
                if let Some(first) = a.first() {
                    paths(&format!("{prefix}[]"), first, out);
                }
            }
            _ => {}
        }
    }

    /// Field names in the first column of the table under `## {section}`.
    fn documented(section: &str) -> BTreeSet<String> {
        let doc = include_str!("../../../docs/schema.md");
        let start = doc.find(&format!("## {section}")).expect("section");
        let body = &doc[start + 3..];
        let end = body.find("\n## ").unwrap_or(body.len());
        body[..end]
            .lines()
            .filter_map(|l| l.strip_prefix("| `"))
            .filter_map(|l| l.split('`').next())
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn schema_doc_matches_model() {
        let s = Sample {
            job_name: Some("j".into()),
            cpu: CpuSample {
                process_cores_used: Some(1.0),
                process_child_count: Some(1),
                ..Default::default()
            },
            network: vec![NetworkSample::default()],
            disk: vec![DiskSample {
                mounts: vec![MountSample::default()],
                ..Default::default()
            }],
            gpu: vec![GpuSample::default()],
            process: Some(ProcessSample {
                memory_pss_mib: Some(1.0),
                memory_peak_mib: Some(1.0),
                gpu_usage: Some(0.0),
                gpu_vram_mib: Some(0.0),
                gpu_utilized: Some(0),
                ..Default::default()
            }),
            tracker: TrackerSample {
                bpf_run_time_secs: Some(0.0),
                bpf_run_count: Some(0),
                degraded: vec![Degradation {
                    name: "map_full",
                    detail: "d".into(),
                }],
                ..Default::default()
            },
            ..Default::default()
        };
        let mut got = BTreeSet::new();
        paths("", &serde_json::to_value(&s).unwrap(), &mut got);
        assert_eq!(
            got,
            documented("Sample"),
            "docs/schema.md (Sample) and sample.rs disagree"
        );

        let mut sum = Summary::build(
            &RunStats::default(),
            1.0,
            Some(0),
            "ebpf",
            None,
            vec![TopCommand {
                comm: "x".into(),
                processes: 1,
                cpu_secs: 0.0,
            }],
        );
        sum.bpf_programs.push(BpfProgram {
            name: "p".into(),
            run_count: 1,
            run_time_ns: 1,
        });
        sum.cloud = Some(crate::model::CloudInfo::default());
        sum.degraded.push(Degradation {
            name: "ring_full",
            detail: "d".into(),
        });
        sum.streaming = Some(StreamReport::default());
        let mut u = crate::model::stats::UsageAccum::default();
        u.add(&Sample {
            process: Some(ProcessSample {
                gpu_usage: Some(0.5),
                gpu_vram_mib: Some(100.0),
                gpu_utilized: Some(1),
                ..Default::default()
            }),
            cpu: CpuSample {
                process_cores_used: Some(1.0),
                ..Default::default()
            },
            ..Default::default()
        });
        sum.stats = u.stats();
        sum.recommendation = u.recommendation();
        sum.recommended_server = Some(crate::model::stats::ServerAdvice {
            server: Some(crate::model::stats::ServerOffer::default()),
            ..Default::default()
        });
        let mut got = BTreeSet::new();
        paths("", &serde_json::to_value(&sum).unwrap(), &mut got);
        assert_eq!(
            got,
            documented("Run summary"),
            "docs/schema.md (Run summary) and summary.rs disagree"
        );
    }
}
