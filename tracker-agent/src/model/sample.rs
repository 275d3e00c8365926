//! The one sample model. Every output (JSON lines, CSV, Sentinel) is written
//! from these types. Documented field by field in docs/schema.md.

use serde::Serialize;

use super::{
    degraded::Degradation,
    fields::{tree_fields, Kind, Otlp},
};

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

// One definition per field of the tree: its doc comment is its line in
// docs/schema.md; the registry (fields.rs) gives its CSV column, its Python column
// and how a recorded file's value is read back.
tree_fields! {
    /// root pid
    pid: u32 { python_csv: Some("process_pid") }
    /// `ebpf` or `procfs`
    backend: &'static str { csv: Some(1), names: &["ebpf", "procfs"] }
    /// user CPU of the tree in the interval (exact total, split by the kernel's tick ratio)
    utime_secs: f64 { unit: "s", python_csv: Some("process_utime") }
    /// system CPU of the tree in the interval
    stime_secs: f64 { unit: "s", python_csv: Some("process_stime") }
    /// tree CPU since tracking began, exited members included
    cpu_secs_total: f64 { unit: "s", csv: Some(2), otlp: Some(Otlp::new("process.cpu.time", "s", Kind::Total)) }
    /// `cgroup`: under `run`, the command joined a cgroup made for it before exec (a child
    /// of the tracker's own: v2 wherever a v2 hierarchy is mounted, `cpu.stat`'s
    /// `usage_usec`; else v1 `cpuacct.usage`), and the tree's CPU is the scheduler's charge
    /// of it plus what the command ran before it joined. Attached (`--pid`, the Python
    /// package), `cgroup` too where the cgroup the root is in holds nothing but its tree
    /// and this tracker (a container's, a systemd scope; checked every sample, the
    /// tracker's own CPU taken out): what it adds from the first sample on. Otherwise the
    /// backend's sums over the members, `ebpf` or `procfs`: no such cgroup, no rights to
    /// make one, or a sample where those sums are the larger (a member moved itself to
    /// another cgroup and ran there); the figure is always the larger of the two, and
    /// never goes back. The user/system split is the members' tick ratio either way
    cpu_source: &'static str { csv: Some(3), names: &["cgroup", "ebpf", "procfs"] }
    /// processes started in the tree in the interval (the root counts when the tracker
    /// started it)
    processes_spawned: u64 { unit: "count", csv: Some(5), otlp: Some(Otlp::new("resource_tracker.process.spawned", "{process}", Kind::Growth)) }
    /// processes of the tree whose last thread exited in the interval
    processes_exited: u64 { unit: "count", csv: Some(6), otlp: Some(Otlp::new("resource_tracker.process.exited", "{process}", Kind::Growth)) }
    /// live (non-zombie) processes of the tree, root included
    live_processes: u64 { unit: "count", csv: Some(4), otlp: Some(Otlp::new("resource_tracker.process.count", "{process}", Kind::Gauge)) }
    /// their threads
    live_threads: u64 { unit: "count", otlp: Some(Otlp::new("process.thread.count", "{thread}", Kind::Gauge)) }
    /// the tree's memory now, as a container limit would need it, by `memory_source`:
    /// shared pages count once. With `cgroup`, the charge of a cgroup made for the command
    /// (v1 `memory.usage_in_bytes`, v2 `memory.current`: anonymous memory, page cache and
    /// kernel memory); with `pss`, Σ `memory_pss_mib`; with `rss`, Σ `memory_rss_mib`
    memory_mib: f64 { unit: "MiB", python_csv: Some("process_memory_mib"), otlp: Some(Otlp::mib("process.memory.usage", Kind::Gauge)) }
    /// `cgroup`: `run` made a cgroup as a child of the one it runs in and the command
    /// joined it before exec; it holds exactly the tree (checked every sample: each live
    /// process's memory cgroup as the eBPF probe reads it, else the cgroup's `cgroup.procs`
    /// against the tree's live processes). Attached, the memory cgroup the root is in,
    /// where it holds nothing but the tree and this tracker (checked every sample; the
    /// tracker's resident memory taken out of the charge and its peak; the peak is the
    /// cgroup's since it was made, before the attach too). `pss`: no such cgroup
    /// (attached to a root whose cgroup holds other processes; no rights, a
    /// read-only cgroupfs, a full hierarchy, v2 without `memory` in the parent's
    /// `cgroup.subtree_control`: said once on stderr), or a member left it (from that
    /// sample on). `rss`: no member's PSS could be read (a kernel without `smaps_rollup`,
    /// members the tracker may not inspect)
    memory_source: &'static str { csv: Some(8), names: &["cgroup", "pss", "rss"] }
    /// the cgroup's own peak since the start (v1 `memory.max_usage_in_bytes`, v2
    /// `memory.peak`), between samples too; null unless `memory_source` is `cgroup`
    memory_peak_mib: Option<f64> { unit: "MiB", otlp: Some(Otlp::mib("resource_tracker.process.memory.peak", Kind::Gauge)) }
    /// sum of the live members' RSS (`/proc/PID/stat`): a page shared by N members counts N
    /// times
    memory_rss_mib: f64 { unit: "MiB", csv: Some(7), otlp: Some(Otlp::mib("resource_tracker.process.memory.rss_sum", Kind::Gauge)) }
    /// sum of the live members' PSS (`smaps_rollup`: a page shared by N processes counts
    /// 1/N in each; a member whose file cannot be read is left out); read when it is the
    /// source, and every sample with `--pss`
    memory_pss_mib: Option<f64> { unit: "MiB", otlp: Some(Otlp::mib("resource_tracker.process.memory.pss_sum", Kind::Gauge)) }
    /// largest RSS of any single member so far (`signal->maxrss` at exit for exited ones)
    max_process_rss_mib: f64 { unit: "MiB", otlp: Some(Otlp::mib("resource_tracker.process.memory.max_member_rss", Kind::Gauge)) }
    /// anonymous memory of the command's cgroup (v2 `memory.stat` `anon`, v1
    /// `total_rss`): what a limit cannot take back without swap; null unless
    /// `memory_source` is `cgroup`
    memory_anon_mib: Option<f64> { unit: "MiB", csv: Some(12), otlp: Some(Otlp::mib("resource_tracker.process.memory.anon", Kind::Gauge)) }
    /// page cache charged to the cgroup (v2 `file`, v1 `total_cache`; tmpfs and
    /// shared memory included): a limit reclaims it rather than fail, so it is
    /// reported beside what the job needs, not as part of it; null unless `cgroup`
    memory_page_cache_mib: Option<f64> { unit: "MiB", csv: Some(13), otlp: Some(Otlp::mib("resource_tracker.process.memory.page_cache", Kind::Gauge)) }
    /// the part of `memory_page_cache_mib` the kernel found in use more than once
    /// lately (v2 `active_file`, v1 `total_active_file`): what the working set keeps
    /// of the page cache; null unless `cgroup`
    memory_active_page_cache_mib: Option<f64> { unit: "MiB" }
    /// `memory_mib` but the cgroup's inactive page cache (`inactive_file`): the
    /// working set, as the kubelet and the Vertical Pod Autoscaler count it; null
    /// unless `cgroup`
    memory_working_set_mib: Option<f64> { unit: "MiB", csv: Some(14), otlp: Some(Otlp::mib("resource_tracker.process.memory.working_set", Kind::Gauge)) }
    /// `memory_mib` but anonymous memory and page cache: the kernel's own memory
    /// for the tree (stacks, page tables, slab, sockets); null unless `cgroup`
    memory_kernel_mib: Option<f64> { unit: "MiB" }
    /// seconds in the interval in which some of the tree's tasks waited for a CPU
    /// (PSI `cpu.pressure` `some` of the v2 cgroup made for the command); null
    /// without one
    cpu_pressure_secs: Option<f64> { unit: "s", csv: Some(15), otlp: Some(Otlp::new("resource_tracker.process.pressure.time", "s", Kind::Growth).with(&[("pressure.resource", "cpu"), ("pressure.scope", "some")])) }
    /// seconds in the interval in which all of them did at once (`full`; null
    /// before 5.13, which keeps none for CPU)
    cpu_pressure_full_secs: Option<f64> { unit: "s" }
    /// seconds in the interval in which some of the tree's tasks waited for memory
    /// (reclaim, swap-in, refaults of what was reclaimed: `memory.pressure` `some`):
    /// a job that stalls here ran short of memory, and its peak is lower than what
    /// it would take; null without a v2 cgroup
    memory_pressure_secs: Option<f64> { unit: "s", csv: Some(16), otlp: Some(Otlp::new("resource_tracker.process.pressure.time", "s", Kind::Growth).with(&[("pressure.resource", "memory"), ("pressure.scope", "some")])) }
    /// seconds in the interval in which all of them did at once (`full`)
    memory_pressure_full_secs: Option<f64> { unit: "s" }
    /// seconds in the interval in which some of the tree's tasks waited for I/O
    /// (`io.pressure` `some`); null without a v2 cgroup
    io_pressure_secs: Option<f64> { unit: "s", csv: Some(17), otlp: Some(Otlp::new("resource_tracker.process.pressure.time", "s", Kind::Growth).with(&[("pressure.resource", "io"), ("pressure.scope", "some")])) }
    /// seconds in the interval in which all of them did at once (`full`)
    io_pressure_full_secs: Option<f64> { unit: "s" }
    /// storage bytes read by the tree in the interval: each thread's own `read_bytes`
    /// (eBPF: `/proc/PID/task/TID/io` while live, `task->ioac` once it is dead and off the
    /// CPU; never a parent's count of reaped children, so nested shells count once)
    read_bytes: u64 = per_interval(read_bytes) { unit: "bytes", python_csv: Some("process_disk_read_bytes"), otlp: Some(Otlp::new("process.disk.io", "By", Kind::Growth).with(&[("disk.io.direction", "read")])) }
    /// storage bytes written by the tree in the interval; 0 for writes that stay in a tmpfs
    write_bytes: u64 = per_interval(write_bytes) { unit: "bytes", python_csv: Some("process_disk_write_bytes"), otlp: Some(Otlp::new("process.disk.io", "By", Kind::Growth).with(&[("disk.io.direction", "write")])) }
    /// bytes the tree read through read-like system calls in the interval (`rchar`:
    /// page-cache hits, pipes and sockets included)
    rchar_bytes: u64 = per_interval(rchar) { unit: "bytes", csv: Some(10), otlp: Some(Otlp::new("resource_tracker.process.io", "By", Kind::Growth).with(&[("io.direction", "read")])) }
    /// bytes the tree wrote through write-like system calls in the interval (`wchar`)
    wchar_bytes: u64 = per_interval(wchar) { unit: "bytes", csv: Some(11), otlp: Some(Otlp::new("resource_tracker.process.io", "By", Kind::Growth).with(&[("io.direction", "write")])) }
    /// read-like system calls of the tree in the interval (`syscr`: read, pread,
    /// readv, sendfile and the like, on files, pipes and sockets alike)
    read_calls: u64 = per_interval(syscr) { unit: "count" }
    /// write-like system calls of the tree in the interval (`syscw`)
    write_calls: u64 = per_interval(syscw) { unit: "count" }
    /// whether the root process is still running
    root_alive: bool { csv: Some(9) }
    /// tasks the kernel map had no room for (0 means exact; raise `--max-tasks`)
    untracked_tasks: u64 { unit: "count", otlp: Some(Otlp::new("resource_tracker.process.untracked_tasks", "{task}", Kind::Gauge)) }
    /// Σ over GPUs of the tree's utilisation fraction (0–1 per GPU); null without a GPU.
    /// NVIDIA: per live tree process the latest SM utilisation sample NVML took since the
    /// previous reading (`nvmlDeviceGetProcessUtilization`), summed per GPU (at most 1); no
    /// sample in that window counts 0, so nothing is reported beyond what NVML measured.
    /// AMD: Δ of the `drm-engine-gfx` + `drm-engine-compute` ns of the tree's DRM clients
    /// (fdinfo) ÷ elapsed ns (a client's first sighting is a baseline)
    gpu_usage: Option<f64> { unit: "GPUs", python_csv: Some("process_gpu_usage"), otlp: Some(Otlp::new("resource_tracker.process.gpu.usage", "{gpu}", Kind::Gauge)) }
    /// GPU memory of the tree's live processes: NVML running compute + graphics processes
    /// (a process in both lists counts once); AMD `drm-memory-vram` of its DRM clients,
    /// each client once
    gpu_vram_mib: Option<f64> { unit: "MiB", python_csv: Some("process_gpu_vram_mib"), otlp: Some(Otlp::mib("resource_tracker.process.gpu.memory", Kind::Gauge)) }
    /// GPUs on which the tree's utilisation (above) is > 0
    gpu_utilized: Option<u64> { unit: "count", python_csv: Some("process_gpu_utilized") }
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
    use crate::model::{
        fields::{check_block, csv_schema_rows, schema_rows, Cell},
        BpfProgram, RunStats, StreamReport, Summary, TopCommand,
    };

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
        sum.otlp = Some(crate::model::OtlpReport::default());
        sum.limits = Some(crate::model::summary::LimitsReport::default());
        sum.pressure = Some(crate::model::summary::PressureReport {
            cpu_full_secs: Some(0.0),
            ..Default::default()
        });
        let mut u = crate::model::stats::UsageAccum::default();
        u.add(&Sample {
            process: Some(ProcessSample {
                gpu_usage: Some(0.5),
                gpu_vram_mib: Some(100.0),
                gpu_utilized: Some(1),
                memory_working_set_mib: Some(1.0),
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

    #[test]
    fn schema_rows_are_the_registrys() {
        check_block(
            "docs/schema.md",
            "## Sample",
            |l| l.starts_with("| `process."),
            false,
            &schema_rows("process", TREE_FIELDS),
        );
        check_block(
            "docs/schema.md",
            "## CSV",
            |l| l.starts_with("| `process_"),
            true,
            &csv_schema_rows("process", TREE_FIELDS),
        );
    }

    /// The Python package fills 0.5.0's process columns from the fields that have
    /// one (`python_csv`) and makes every other field a column of its own
    /// (columns.py `PROCESS_MAPPED`): the two lists are one.
    #[test]
    fn python_maps_the_fields_with_a_python_column() {
        let path = format!(
            "{}/../python/src/resource_tracker_ebpf/columns.py",
            env!("CARGO_MANIFEST_DIR")
        );
        let py = std::fs::read_to_string(&path).expect("columns.py");
        let block = py
            .split("PROCESS_MAPPED = frozenset(")
            .nth(1)
            .and_then(|b| b.split(')').next())
            .expect("columns.py has PROCESS_MAPPED");
        let mut mapped: Vec<&str> = block.split('"').skip(1).step_by(2).collect();
        let mut want: Vec<&str> = TREE_FIELDS
            .iter()
            .filter(|f| f.python_csv.is_some())
            .map(|f| f.name)
            .collect();
        mapped.sort_unstable();
        want.sort_unstable();
        assert_eq!(mapped, want);
    }

    #[test]
    fn places_are_one_each() {
        let mut places: Vec<u8> = TREE_FIELDS.iter().filter_map(|f| f.csv).collect();
        places.sort_unstable();
        let want: Vec<u8> = (1..=places.len() as u8).collect();
        assert_eq!(places, want, "csv places are 1..=n, each once");
        for f in TREE_FIELDS {
            assert!(!f.doc.trim().is_empty(), "{} has no doc", f.name);
            assert_eq!(
                (f.ty)().starts_with("string"),
                !f.names.is_empty(),
                "{}",
                f.name
            );
        }
    }

    #[test]
    fn every_field_reads_back_what_it_wrote() {
        let p = ProcessSample {
            pid: 7,
            backend: "procfs",
            utime_secs: 1.25,
            cpu_source: "cgroup",
            processes_spawned: 3,
            memory_source: "pss",
            memory_peak_mib: Some(2.5),
            root_alive: true,
            gpu_utilized: Some(1),
            ..Default::default()
        };
        let mut q = ProcessSample::default();
        for f in TREE_FIELDS {
            f.read(&mut q, (f.get)(&p), f.name).expect("reads back");
        }
        assert_eq!(
            serde_json::to_string(&q).unwrap(),
            serde_json::to_string(&p).unwrap()
        );
        let mut r = ProcessSample::default();
        let bad = TREE_FIELDS.iter().find(|f| f.name == "backend").unwrap();
        assert_eq!(
            bad.read(&mut r, Cell::Text("bpf"), "process.backend"),
            Err("process.backend: 'bpf' is not one of ebpf, procfs".into())
        );
        let n = TREE_FIELDS.iter().find(|f| f.name == "read_bytes").unwrap();
        assert_eq!(
            n.read(&mut r, Cell::Text("x"), "process_disk_read_bytes"),
            Err("process_disk_read_bytes: 'x' is not a number".into())
        );
    }
}
