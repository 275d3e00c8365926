//! The node agent's model: one sample per container per interval, from the
//! kernel's cumulative cgroup counters. The Prometheus sink exports the totals; the
//! JSON-lines sink writes the samples.

use serde::Serialize;

/// A cgroup found on the node: where it is (relative to each hierarchy's root) and
/// what its name says.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Found {
    /// Path below the hierarchy root, without a leading slash.
    pub rel: String,
    /// Pod UID as Kubernetes writes it (dashes), when the path names a pod.
    pub pod_uid: Option<String>,
    /// The runtime's full container id, when the path names one.
    pub container_id: Option<String>,
    /// guaranteed, burstable or besteffort.
    pub qos: Option<&'static str>,
    /// The cgroup's v2 id (its directory's inode), what BPF's
    /// `bpf_get_current_cgroup_id` returns; None without a v2 directory for it.
    pub cgroup_id: Option<u64>,
}

/// One container's counters, as the kernel keeps them; None where the file is
/// missing (a controller not enabled, an older kernel).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct CgroupCounters {
    pub cpu_usage_ns: Option<u64>,
    pub cpu_user_ns: Option<u64>,
    pub cpu_system_ns: Option<u64>,
    pub cfs_periods: Option<u64>,
    pub cfs_throttled_periods: Option<u64>,
    pub cfs_throttled_ns: Option<u64>,
    pub memory_bytes: Option<u64>,
    /// memory − inactive file pages (cAdvisor's working set).
    pub working_set_bytes: Option<u64>,
    pub memory_peak_bytes: Option<u64>,
    pub oom_events: Option<u64>,
    pub oom_kills: Option<u64>,
    pub read_bytes: Option<u64>,
    pub write_bytes: Option<u64>,
    pub reads: Option<u64>,
    pub writes: Option<u64>,
    /// Tasks (threads) in the cgroup (`pids.current`).
    pub tasks: Option<u64>,
    /// The storage I/O above, by device (those with any).
    pub devices: Vec<DeviceIo>,
    /// The memory limit (`memory.max`, `memory.limit_in_bytes`); None when unlimited.
    pub memory_limit_bytes: Option<u64>,
    /// The CPU quota and its period, µs (`cpu.max`, `cpu.cfs_quota_us`); None
    /// without a quota.
    pub cpu_quota_us: Option<(u64, u64)>,
    /// Stall times from the cgroup's v2 `*.pressure` files (PSI); None without them.
    pub pressure: Option<crate::model::reading::Pressure>,
    /// The process life cycle from the node's BPF programs (None without them).
    pub life: Option<tracker_common::NodeCounts>,
}

/// One block device's part of a container's storage I/O.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct DeviceIo {
    /// As in /dev (`/dev/sda`), or `MAJ:MIN` where the kernel names none.
    pub device: std::sync::Arc<str>,
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub reads: u64,
    pub writes: u64,
}

/// What the kubelet says of one container.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ContainerName {
    pub namespace: String,
    pub pod: String,
    pub container: String,
    pub image: String,
}

/// One container in one interval (`resource-tracker node -o FILE`, one line each).
#[derive(Clone, Debug, Serialize)]
pub struct ContainerSample {
    pub timestamp_secs: f64,
    pub interval_secs: f64,
    /// The cgroup's path below the hierarchy root, from its `/`: the form of the
    /// Prometheus label `id` and of cAdvisor's.
    pub id: String,
    pub pod_uid: Option<String>,
    pub container_id: Option<String>,
    pub qos: Option<&'static str>,
    /// From the kubelet, once it has named the container.
    pub namespace: Option<String>,
    pub pod: Option<String>,
    pub container: Option<String>,
    pub image: Option<String>,
    /// CPU seconds in the interval, and since the cgroup was made.
    pub cpu_secs: Option<f64>,
    pub cpu_secs_total: Option<f64>,
    /// Cores used over the interval.
    pub cores_used: Option<f64>,
    pub cpu_throttled_secs: Option<f64>,
    pub memory_bytes: Option<u64>,
    pub working_set_bytes: Option<u64>,
    pub memory_peak_bytes: Option<u64>,
    /// OOM kills in the interval, and in total.
    pub oom_kills: Option<u64>,
    pub oom_kills_total: Option<u64>,
    /// Storage bytes in the interval.
    pub read_bytes: Option<u64>,
    pub write_bytes: Option<u64>,
    pub tasks: Option<u64>,
    /// Processes started, ended (of which with a non-zero status, and by a signal)
    /// and execs in the interval; null without the BPF programs or a v2 cgroup.
    pub processes_spawned: Option<u64>,
    pub processes_exited: Option<u64>,
    pub nonzero_exits: Option<u64>,
    pub signal_kills: Option<u64>,
    pub execs: Option<u64>,
    /// Commands of the processes the OOM killer chose in the interval (eBPF).
    pub oom_victims: Vec<String>,
    /// GPUs used (Σ of the utilisation fraction per GPU), VRAM held and GPUs with
    /// use above zero; null without an NVIDIA GPU.
    pub gpu_usage: Option<f64>,
    pub gpu_vram_mib: Option<f64>,
    pub gpu_utilized: Option<u64>,
    /// The commands whose ended processes used the most CPU since the agent began
    /// (eBPF): at most 5, most first.
    pub top_commands: Vec<TopCommand>,
}

#[derive(Clone, Debug, Serialize)]
pub struct TopCommand {
    pub command: String,
    pub cpu_secs: f64,
    pub processes: u64,
}

/// A container as last read: what it is and its counters.
#[derive(Clone, Debug)]
pub struct Current {
    /// Shared with the scans that find it again unchanged.
    pub found: std::sync::Arc<Found>,
    pub counters: CgroupCounters,
    pub names: Option<ContainerName>,
    /// OOM kills by the victim's command since the agent began (eBPF).
    pub oom_commands: Vec<(String, u64)>,
    /// Commands of the processes OOM-killed since the previous reading.
    pub oom_victims: Vec<String>,
    /// The container's GPU use (NVIDIA); None without a GPU collector.
    pub gpu: Option<crate::model::reading::ProcessGpu>,
    /// The commands whose ended processes used the most CPU: (command, CPU
    /// seconds, processes), since the agent began (eBPF).
    pub top_commands: Vec<(String, f64, u64)>,
}

/// The node now: every container's latest counters (what `/metrics` exports; a
/// container that is gone is not in it), and the agent's own cost.
#[derive(Clone, Debug, Default)]
pub struct NodeSnapshot {
    pub containers: Vec<Current>,
    pub agent_cpu_secs: f64,
    pub agent_rss_bytes: u64,
    /// Whether the node's BPF programs count the process life cycle.
    pub ebpf: bool,
    /// Counts the programs could not keep (a full map or ring, or a run the kernel
    /// skipped), since the start.
    pub lost_events: u64,
    /// Of those, the runs the kernel skipped, per tracepoint (`sched_process_fork`,
    /// …): what each container's count of that event may lack, at most.
    pub skipped_runs: Vec<(&'static str, u64)>,
    /// Exited threads the kernel freed without the free program: their commands'
    /// CPU is as of their exit, each short by at most a scheduler tick and its exit
    /// path.
    pub freed_unread: u64,
    /// The programs' run time so far, when the kernel's BPF statistics are on.
    pub bpf_run_secs: Option<f64>,
    pub scans: u64,
    /// Containers that vanished between their scan and their read, since the start.
    pub vanished: u64,
    /// What the agent cannot measure on this node, and why: (part, reason).
    pub degraded: Vec<(&'static str, String)>,
}

/// What one scan gives the outputs: its samples (none for a container's first
/// reading) and the node as it is now.
#[derive(Debug, Default)]
pub struct NodeScan {
    pub samples: Vec<ContainerSample>,
    pub snapshot: std::sync::Arc<NodeSnapshot>,
}

/// Turns successive readings into samples; forgets containers that are gone.
#[derive(Default)]
pub struct NodeModel {
    /// Each container's last reading, and the step that made it.
    prev: foldhash::HashMap<String, (CgroupCounters, std::time::Instant, u64)>,
    steps: u64,
}

/// The counter's growth; a counter below its previous value belongs to a cgroup
/// made again at the same path, whose whole count is new.
fn delta(now: Option<u64>, before: Option<u64>) -> Option<u64> {
    let (now, before) = (now?, before?);
    Some(if now >= before { now - before } else { now })
}

/// A life-cycle count's growth over the interval. A cgroup first counted in this
/// interval (no previous entry) grew from zero.
fn life(
    c: &CgroupCounters,
    p: &CgroupCounters,
    f: fn(&tracker_common::NodeCounts) -> u64,
) -> Option<u64> {
    let now = c.life.as_ref().map(f)?;
    delta(Some(now), Some(p.life.as_ref().map_or(0, f)))
}

impl NodeModel {
    /// Samples of the containers read at `at` (monotonic, for the intervals) and
    /// `unix` (the timestamp); the first reading of a container is its baseline and
    /// gives no sample. With `samples` false only the baselines move (no output
    /// takes samples; building them was ~5 % of the agent's CPU at 500).
    pub fn step(
        &mut self,
        read: &[Current],
        at: std::time::Instant,
        unix: f64,
        samples: bool,
    ) -> Vec<ContainerSample> {
        self.steps += 1;
        let mut out = Vec::new();
        for cur in read {
            let c = &cur.counters;
            if let Some((p, before, _)) = self.prev.get(&cur.found.rel).filter(|_| samples) {
                let dt = at
                    .saturating_duration_since(*before)
                    .as_secs_f64()
                    .max(1e-9);
                let cpu = delta(c.cpu_usage_ns, p.cpu_usage_ns).map(|n| n as f64 / 1e9);
                out.push(ContainerSample {
                    timestamp_secs: (unix * 1e6).round() / 1e6,
                    interval_secs: dt,
                    id: format!("/{}", cur.found.rel),
                    pod_uid: cur.found.pod_uid.clone(),
                    container_id: cur.found.container_id.clone(),
                    qos: cur.found.qos,
                    namespace: cur
                        .names
                        .as_ref()
                        .map(|n| n.namespace.clone())
                        .filter(|c| !c.is_empty()),
                    pod: cur
                        .names
                        .as_ref()
                        .map(|n| n.pod.clone())
                        .filter(|c| !c.is_empty()),
                    container: cur
                        .names
                        .as_ref()
                        .map(|n| n.container.clone())
                        .filter(|c| !c.is_empty()),
                    image: cur
                        .names
                        .as_ref()
                        .map(|n| n.image.clone())
                        .filter(|c| !c.is_empty()),
                    cpu_secs: cpu,
                    cpu_secs_total: c.cpu_usage_ns.map(|n| n as f64 / 1e9),
                    cores_used: cpu.map(|s| s / dt),
                    cpu_throttled_secs: delta(c.cfs_throttled_ns, p.cfs_throttled_ns)
                        .map(|n| n as f64 / 1e9),
                    memory_bytes: c.memory_bytes,
                    working_set_bytes: c.working_set_bytes,
                    memory_peak_bytes: c.memory_peak_bytes,
                    oom_kills: delta(c.oom_kills, p.oom_kills),
                    oom_kills_total: c.oom_kills,
                    read_bytes: delta(c.read_bytes, p.read_bytes),
                    write_bytes: delta(c.write_bytes, p.write_bytes),
                    tasks: c.tasks,
                    processes_spawned: life(c, p, |l| l.spawned),
                    processes_exited: life(c, p, |l| l.exited),
                    nonzero_exits: life(c, p, |l| l.nonzero_exits),
                    signal_kills: life(c, p, |l| l.signal_kills),
                    execs: life(c, p, |l| l.execs),
                    oom_victims: cur.oom_victims.clone(),
                    gpu_usage: cur.gpu.map(|g| g.gpu_usage),
                    gpu_vram_mib: cur.gpu.map(|g| g.gpu_vram_mib),
                    gpu_utilized: cur.gpu.map(|g| g.gpu_utilized),
                    top_commands: cur
                        .top_commands
                        .iter()
                        .map(|(c, s, n)| TopCommand {
                            command: c.clone(),
                            cpu_secs: *s,
                            processes: *n,
                        })
                        .collect(),
                });
            }
            // Updated in place: no key made again for a container already known.
            match self.prev.get_mut(&cur.found.rel) {
                Some(e) => *e = (c.clone(), at, self.steps),
                None => {
                    self.prev
                        .insert(cur.found.rel.clone(), (c.clone(), at, self.steps));
                }
            }
        }
        // Containers not read this time are gone: nothing of them is kept.
        let step = self.steps;
        self.prev.retain(|_, e| e.2 == step);
        out
    }

    /// Containers the model holds a baseline for.
    pub fn len(&self) -> usize {
        self.prev.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cur(rel: &str, cpu_ns: u64, oom: u64) -> Current {
        Current {
            found: std::sync::Arc::new(Found {
                rel: rel.into(),
                pod_uid: Some("u".into()),
                container_id: Some("c".into()),
                qos: Some("burstable"),
                cgroup_id: None,
            }),
            counters: CgroupCounters {
                cpu_usage_ns: Some(cpu_ns),
                oom_kills: Some(oom),
                ..Default::default()
            },
            names: None,
            oom_commands: Vec::new(),
            oom_victims: Vec::new(),
            gpu: None,
            top_commands: Vec::new(),
        }
    }

    #[test]
    fn intervals_and_churn() {
        let mut m = NodeModel::default();
        let t = std::time::Instant::now();
        let after = |s: f64| t + std::time::Duration::from_secs_f64(s);
        assert!(m
            .step(&[cur("a", 1_000_000_000, 0)], t, 10.0, true)
            .is_empty());
        // The wall clock stepped back: the interval is the monotonic one.
        let s = m.step(
            &[cur("a", 1_500_000_000, 1), cur("b", 5, 0)],
            after(0.5),
            3.0,
            true,
        );
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].id, "/a", "the Prometheus label's form");
        assert_eq!(s[0].cpu_secs, Some(0.5));
        assert_eq!(s[0].cores_used, Some(1.0));
        assert_eq!((s[0].oom_kills, s[0].oom_kills_total), (Some(1), Some(1)));
        // a is gone: forgotten; b gets its first sample.
        let s = m.step(&[cur("b", 10, 0)], after(1.0), 11.0, true);
        assert_eq!(s.len(), 1);
        assert_eq!(m.len(), 1);
        // b made again at the same path: its counter restarted, all of it is new.
        let s = m.step(&[cur("b", 4, 0)], after(1.5), 11.5, true);
        assert_eq!(s[0].cpu_secs, Some(4e-9));
        // With no output taking samples the baselines still move.
        assert!(m
            .step(&[cur("b", 6, 0)], after(2.0), 12.0, false)
            .is_empty());
        let s = m.step(&[cur("b", 9, 0)], after(3.0), 13.0, true);
        assert_eq!((s[0].cpu_secs, s[0].interval_secs), (Some(3e-9), 1.0));
    }
}
