//! The node agent's Prometheus endpoint: `/metrics` (the text format 0.0.4, or
//! OpenMetrics when the scraper asks for it) and `/healthz`, over the latest
//! [`NodeSnapshot`]. cAdvisor's names and units where cAdvisor has the metric, so that
//! existing dashboards work; `resource_tracker_*` for the rest. Only containers in
//! the snapshot are exported, so a container that is gone stops being a series.
//!
//! Encoded with prometheus-client (a [`Collector`] over the snapshot, values set
//! from the kernel's counters at each scrape). The HTTP side is a few lines on
//! tokio and httparse: two GET routes need no framework, and a bounded number of
//! connections, each with a deadline, keeps a scrape flood from costing more than
//! that.

use std::{
    net::SocketAddr,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use anyhow::Context as _;

use prometheus_client::{
    collector::Collector,
    encoding::{DescriptorEncoder, EncodeMetric},
    metrics::{counter::ConstCounter, gauge::ConstGauge},
    registry::Registry,
};
use tokio::{
    io::{AsyncReadExt as _, AsyncWriteExt as _},
    net::{TcpListener, TcpStream},
    sync::Semaphore,
};

use super::base::Sink;
use crate::{
    model::node::{Current, DeviceIo, NodeScan, NodeSnapshot},
    warn::say,
};

/// Connections served at once (8 KiB each); past it a new one is answered 503.
const MAX_CONNECTIONS: usize = 512;
/// Each read of a request may wait this long; a client silent for longer is
/// closed.
const READ_DEADLINE: Duration = Duration::from_secs(2);
/// A connection is closed by then, whatever it is doing.
const REQUEST_DEADLINE: Duration = Duration::from_secs(5);

/// The latest scan's snapshot; a scrape takes its own reference and encodes
/// without holding the lock.
pub type Shared = Arc<Mutex<Arc<NodeSnapshot>>>;

/// The endpoint as the node agent's sink: each scan's snapshot is what scrapes
/// export from then on, and the time of the last one is the agent's health.
pub struct Endpoint {
    shared: Shared,
    /// When the last scan was written, in ns after `start` (monotonic: a step of
    /// the wall clock changes nothing).
    beat: Arc<AtomicU64>,
    start: Instant,
}

impl Endpoint {
    /// `/metrics` and `/healthz` on `addr`, served on the runtime `bg`; healthy
    /// while a scan was written within `stale`. An agent without its endpoint
    /// would look dead to its probes and scrape nothing: a port that cannot be had
    /// is an error.
    pub fn start(
        bg: &tokio::runtime::Runtime,
        addr: SocketAddr,
        stale: Duration,
        names: SeriesNames,
    ) -> anyhow::Result<Endpoint> {
        let l = bg
            .block_on(TcpListener::bind(addr))
            .with_context(|| format!("--listen {addr}: cannot serve the metrics endpoint"))?;
        let at = l.local_addr().unwrap_or(addr);
        say(format_args!(
            "node: serving /metrics and /healthz on http://{at}"
        ));
        let start = Instant::now();
        let beat = Arc::new(AtomicU64::new(0));
        let b = beat.clone();
        let healthy = Arc::new(move || {
            start
                .elapsed()
                .saturating_sub(Duration::from_nanos(b.load(Ordering::Relaxed)))
                < stale
        });
        let shared = Shared::default();
        bg.spawn(serve(l, shared.clone(), healthy, names));
        Ok(Endpoint {
            shared,
            beat,
            start,
        })
    }
}

impl Sink<NodeScan, ()> for Endpoint {
    fn write(&mut self, scan: &NodeScan) -> anyhow::Result<()> {
        let snap = scan.snapshot.clone();
        match self.shared.lock() {
            Ok(mut s) => *s = snap,
            Err(p) => *p.into_inner() = snap,
        }
        self.beat
            .store(self.start.elapsed().as_nanos() as u64, Ordering::Relaxed);
        Ok(())
    }

    fn finish(&mut self, _: &mut ()) -> anyhow::Result<()> {
        Ok(())
    }
}

#[derive(Debug)]
struct Exported {
    shared: Shared,
    names: SeriesNames,
}

/// How the series cAdvisor also serves are named.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub enum SeriesNames {
    /// `resource_tracker_container_*`: scraped beside the kubelet's cAdvisor, no
    /// series of ours is one of its, and no `sum()` counts a container twice.
    #[default]
    Own,
    /// cAdvisor's own `container_*`, for a Prometheus that scrapes no kubelet.
    Cadvisor,
}

impl SeriesNames {
    fn of(self, name: &str) -> std::borrow::Cow<'_, str> {
        match self {
            SeriesNames::Own if name.starts_with("container_") => {
                format!("resource_tracker_{name}").into()
            }
            _ => name.into(),
        }
    }
}

/// Label value escaping of the exposition formats (the encoder writes values as
/// given).
fn esc(v: &str) -> String {
    v.replace('\\', "\\\\")
        .replace('"', "\\\"")
        .replace('\n', "\\n")
}

/// Every series has every label; an empty value is Prometheus's "absent" (names
/// the kubelet has not given yet).
fn labels(c: &Current) -> Vec<(&'static str, String)> {
    let f = &c.found;
    let n = c.names.clone().unwrap_or_default();
    vec![
        ("id", esc(&format!("/{}", f.rel))),
        ("pod_uid", esc(f.pod_uid.as_deref().unwrap_or(""))),
        ("container_id", esc(f.container_id.as_deref().unwrap_or(""))),
        ("qos", f.qos.unwrap_or("").to_string()),
        ("namespace", esc(&n.namespace)),
        ("pod", esc(&n.pod)),
        ("container", esc(&n.container)),
        ("image", esc(&n.image)),
    ]
}

type Get = fn(&Current) -> Option<f64>;

/// (name without `_total`, help, counter?, value).
const CONTAINER_METRICS: &[(&str, &str, bool, Get)] = &[
    (
        "container_cpu_usage_seconds",
        "Cumulative CPU time consumed (cgroup cpuacct.usage / cpu.stat usage_usec).",
        true,
        |c| c.counters.cpu_usage_ns.map(|n| n as f64 / 1e9),
    ),
    (
        "container_cpu_user_seconds",
        "Cumulative user CPU time.",
        true,
        |c| c.counters.cpu_user_ns.map(|n| n as f64 / 1e9),
    ),
    (
        "container_cpu_system_seconds",
        "Cumulative system CPU time.",
        true,
        |c| c.counters.cpu_system_ns.map(|n| n as f64 / 1e9),
    ),
    (
        "container_cpu_cfs_periods",
        "Elapsed enforcement periods.",
        true,
        |c| c.counters.cfs_periods.map(|n| n as f64),
    ),
    (
        "container_cpu_cfs_throttled_periods",
        "Throttled period intervals.",
        true,
        |c| c.counters.cfs_throttled_periods.map(|n| n as f64),
    ),
    (
        "container_cpu_cfs_throttled_seconds",
        "Total time the container was throttled.",
        true,
        |c| c.counters.cfs_throttled_ns.map(|n| n as f64 / 1e9),
    ),
    (
        "container_memory_usage_bytes",
        "Current memory usage, page cache included.",
        false,
        |c| c.counters.memory_bytes.map(|n| n as f64),
    ),
    (
        "container_memory_working_set_bytes",
        "Current working set: usage less inactive file pages.",
        false,
        |c| c.counters.working_set_bytes.map(|n| n as f64),
    ),
    (
        "container_memory_max_usage_bytes",
        "Maximum memory usage recorded.",
        false,
        |c| c.counters.memory_peak_bytes.map(|n| n as f64),
    ),
    (
        "container_oom_events",
        "OOM events of the container's memory cgroup.",
        true,
        |c| c.counters.oom_events.map(|n| n as f64),
    ),
    (
        "resource_tracker_container_oom_kills",
        "Processes of the container killed by the OOM killer.",
        true,
        |c| c.counters.oom_kills.map(|n| n as f64),
    ),
    (
        "container_spec_memory_limit_bytes",
        "Memory limit (memory.max, memory.limit_in_bytes); absent when unlimited.",
        false,
        |c| c.counters.memory_limit_bytes.map(|n| n as f64),
    ),
    (
        "container_spec_cpu_quota",
        "CPU quota, µs per period (cpu.max, cpu.cfs_quota_us); absent without one.",
        false,
        |c| c.counters.cpu_quota_us.map(|(q, _)| q as f64),
    ),
    (
        "container_spec_cpu_period",
        "The period of the CPU quota, µs; absent without a quota.",
        false,
        |c| c.counters.cpu_quota_us.map(|(_, p)| p as f64),
    ),
    (
        "container_pressure_cpu_waiting_seconds",
        "Time some of the container's tasks waited for a CPU (cpu.pressure some total).",
        true,
        |c| c.counters.pressure.map(|p| p.cpu_some_us as f64 / 1e6),
    ),
    (
        "container_pressure_cpu_stalled_seconds",
        "Time all of the container's tasks waited for a CPU at once (cpu.pressure full total).",
        true,
        |c| {
            c.counters
                .pressure
                .and_then(|p| p.cpu_full_us)
                .map(|us| us as f64 / 1e6)
        },
    ),
    (
        "container_pressure_memory_waiting_seconds",
        "Time some of the container's tasks waited for memory (memory.pressure some total).",
        true,
        |c| c.counters.pressure.map(|p| p.memory_some_us as f64 / 1e6),
    ),
    (
        "container_pressure_memory_stalled_seconds",
        "Time all of the container's tasks waited for memory at once (memory.pressure full total).",
        true,
        |c| c.counters.pressure.map(|p| p.memory_full_us as f64 / 1e6),
    ),
    (
        "container_pressure_io_waiting_seconds",
        "Time some of the container's tasks waited for I/O (io.pressure some total).",
        true,
        |c| c.counters.pressure.map(|p| p.io_some_us as f64 / 1e6),
    ),
    (
        "container_pressure_io_stalled_seconds",
        "Time all of the container's tasks waited for I/O at once (io.pressure full total).",
        true,
        |c| c.counters.pressure.map(|p| p.io_full_us as f64 / 1e6),
    ),
    (
        "container_threads",
        "Tasks (threads) in the container (pids.current).",
        false,
        |c| c.counters.tasks.map(|n| n as f64),
    ),
    (
        "resource_tracker_container_gpu_usage",
        "GPUs the container used: the sum over GPUs of its utilisation fraction (NVML).",
        false,
        |c| c.gpu.map(|g| g.gpu_usage),
    ),
    (
        "container_accelerator_memory_used_bytes",
        "GPU memory held by the container's processes, all GPUs (NVML).",
        false,
        |c| c.gpu.map(|g| g.gpu_vram_mib * 1048576.0),
    ),
    (
        "resource_tracker_container_gpus_utilized",
        "GPUs on which the container's utilisation was above zero (NVML).",
        false,
        |c| c.gpu.map(|g| g.gpu_utilized as f64),
    ),
    (
        "resource_tracker_container_processes_spawned",
        "Processes started in the container (eBPF, every fork of a process).",
        true,
        |c| c.counters.life.map(|l| l.spawned as f64),
    ),
    (
        "resource_tracker_container_processes_exited",
        "Processes of the container whose last thread exited (eBPF).",
        true,
        |c| c.counters.life.map(|l| l.exited as f64),
    ),
    (
        "resource_tracker_container_nonzero_exits",
        "Processes of the container that exited with a non-zero status (eBPF).",
        true,
        |c| c.counters.life.map(|l| l.nonzero_exits as f64),
    ),
    (
        "resource_tracker_container_signal_kills",
        "Processes of the container ended by a signal (eBPF).",
        true,
        |c| c.counters.life.map(|l| l.signal_kills as f64),
    ),
    (
        "resource_tracker_container_execs",
        "Execs in the container (eBPF).",
        true,
        |c| c.counters.life.map(|l| l.execs as f64),
    ),
];

type DeviceGet = fn(&DeviceIo) -> u64;

/// Storage I/O by device, cAdvisor's `container_fs_*` with their `device` label:
/// (name without `_total`, help, value).
const FS_METRICS: &[(&str, &str, DeviceGet)] = &[
    (
        "container_fs_reads_bytes",
        "Cumulative bytes read from the block device.",
        |d| d.read_bytes,
    ),
    (
        "container_fs_writes_bytes",
        "Cumulative bytes written to the block device.",
        |d| d.write_bytes,
    ),
    (
        "container_fs_reads",
        "Cumulative completed reads from the block device.",
        |d| d.reads,
    ),
    (
        "container_fs_writes",
        "Cumulative completed writes to the block device.",
        |d| d.writes,
    ),
];

/// Labelled values of one metric.
type Series<'a> = Vec<(Vec<(&'a str, String)>, f64)>;

/// One metric family, a counter or a gauge, with a sample per labelled value; none
/// when there is no value.
fn family(
    enc: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    counter: bool,
    series: &Series,
) -> Result<(), std::fmt::Error> {
    if series.is_empty() {
        return Ok(());
    }
    let kind = if counter {
        ConstCounter::new(0f64).metric_type()
    } else {
        ConstGauge::new(0f64).metric_type()
    };
    let mut m = enc.encode_descriptor(name, help, None, kind)?;
    for (l, v) in series {
        if counter {
            ConstCounter::new(*v).encode(m.encode_family(l)?)?;
        } else {
            ConstGauge::new(*v).encode(m.encode_family(l)?)?;
        }
    }
    Ok(())
}

impl Collector for Exported {
    fn encode(&self, mut enc: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let snap = match self.shared.lock() {
            Ok(s) => s.clone(),
            Err(p) => p.into_inner().clone(),
        };
        for (name, help, counter, get) in CONTAINER_METRICS {
            let series: Series = snap
                .containers
                .iter()
                .filter_map(|c| get(c).map(|v| (labels(c), v)))
                .collect();
            family(&mut enc, &self.names.of(name), help, *counter, &series)?;
        }
        for (name, help, get) in FS_METRICS {
            let series: Series = snap
                .containers
                .iter()
                .flat_map(|c| {
                    c.counters.devices.iter().map(move |d| {
                        let mut l = labels(c);
                        l.push(("device", esc(&d.device)));
                        (l, get(d) as f64)
                    })
                })
                .collect();
            family(&mut enc, &self.names.of(name), help, true, &series)?;
        }
        // The OOM killer's victims by command: one series per command seen, at most
        // MAX_OOM_COMMANDS per container (the session keeps the first ones).
        let by_cmd: Series = snap
            .containers
            .iter()
            .flat_map(|c| {
                c.oom_commands.iter().map(move |(cmd, n)| {
                    let mut l = labels(c);
                    l.push(("command", esc(cmd)));
                    (l, *n as f64)
                })
            })
            .collect();
        family(
            &mut enc,
            "resource_tracker_container_oom_victims",
            "Processes of the container the OOM killer chose, by command (eBPF).",
            true,
            &by_cmd,
        )?;
        // The top commands by CPU of ended processes (at most 5 per container).
        for (name, help, pick) in [
            (
                "resource_tracker_container_command_cpu_seconds",
                "CPU of the container's ended processes, by command, for its top commands (eBPF).",
                0usize,
            ),
            (
                "resource_tracker_container_command_processes",
                "The container's ended processes, by command, for its top commands (eBPF).",
                1,
            ),
        ] {
            let series: Series = snap
                .containers
                .iter()
                .flat_map(|c| {
                    c.top_commands.iter().map(move |(cmd, secs, n)| {
                        let mut l = labels(c);
                        l.push(("command", esc(cmd)));
                        (l, if pick == 0 { *secs } else { *n as f64 })
                    })
                })
                .collect();
            family(&mut enc, name, help, true, &series)?;
        }
        encode_agent(&mut enc, &snap)
    }
}

/// The agent's own metrics: its cost, what its programs lost, what it tracks.
fn encode_agent(enc: &mut DescriptorEncoder, snap: &NodeSnapshot) -> Result<(), std::fmt::Error> {
    if let Some(t) = snap.bpf_run_secs {
        let c = ConstCounter::new(t);
        c.encode(enc.encode_descriptor(
            "resource_tracker_agent_bpf_run_seconds",
            "Run time of the agent's BPF programs (kernel BPF statistics on).",
            None,
            c.metric_type(),
        )?)?;
    }
    let skipped: Series = snap
        .skipped_runs
        .iter()
        .map(|(tp, n)| (vec![("tracepoint", tp.to_string())], *n as f64))
        .collect();
    let degraded: Series = snap
        .degraded
        .iter()
        .map(|(part, why)| (vec![("part", part.to_string()), ("reason", esc(why))], 1.0))
        .collect();
    family(
        enc,
        "resource_tracker_degraded",
        "1 for each part of the figures the agent cannot measure on this node, with why.",
        false,
        &degraded,
    )?;
    family(
        enc,
        "resource_tracker_skipped_runs",
        "Runs of the agent's BPF programs the kernel skipped, per tracepoint (6.19 on): \
         each container's count of that event may lack up to this many.",
        true,
        &skipped,
    )?;
    let agent: [(&str, &str, bool, f64); 8] = [
        (
            "resource_tracker_freed_unread",
            "Exited threads the kernel freed without running the agent's free program: their \
             commands' CPU (resource_tracker_container_command_cpu_seconds_total) is as of their \
             exit, each short by at most one scheduler tick and its exit path.",
            true,
            snap.freed_unread as f64,
        ),
        (
            "resource_tracker_lost_events",
            "Counts the BPF programs could not keep (a full map or ring, or a run the kernel skipped).",
            true,
            snap.lost_events as f64,
        ),
        (
            "resource_tracker_ebpf",
            "1 when the node's BPF programs count each container's process life cycle.",
            false,
            f64::from(u8::from(snap.ebpf)),
        ),
        (
            "resource_tracker_containers",
            "Containers tracked now.",
            false,
            snap.containers.len() as f64,
        ),
        (
            "resource_tracker_agent_cpu_seconds",
            "The agent's own CPU time.",
            true,
            snap.agent_cpu_secs,
        ),
        (
            "resource_tracker_agent_rss_bytes",
            "The agent's resident memory.",
            false,
            snap.agent_rss_bytes as f64,
        ),
        (
            "resource_tracker_scans",
            "Scans of the cgroup hierarchy.",
            true,
            snap.scans as f64,
        ),
        (
            "resource_tracker_vanished_containers",
            "Containers gone between their scan and their read.",
            true,
            snap.vanished as f64,
        ),
    ];
    for (name, help, counter, v) in agent {
        if counter {
            let c = ConstCounter::new(v);
            c.encode(enc.encode_descriptor(name, help, None, c.metric_type())?)?;
        } else {
            let g = ConstGauge::new(v);
            g.encode(enc.encode_descriptor(name, help, None, g.metric_type())?)?;
        }
    }
    Ok(())
}

/// The exposition of `shared` now: OpenMetrics, or the text format 0.0.4 derived
/// from it (no `# EOF` and `# UNIT`, counters' HELP/TYPE named as their samples).
pub fn encode(shared: &Shared, openmetrics: bool, names: SeriesNames) -> String {
    let mut reg = Registry::default();
    reg.register_collector(Box::new(Exported {
        shared: shared.clone(),
        names,
    }));
    let mut om = String::new();
    if prometheus_client::encoding::text::encode(&mut om, &reg).is_err() {
        return String::new();
    }
    if openmetrics {
        return om;
    }
    let counters: std::collections::HashSet<String> = om
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.strip_suffix(" counter"))
        .map(str::to_string)
        .collect();
    let mut out = String::with_capacity(om.len());
    for line in om.lines() {
        if line == "# EOF" || line.starts_with("# UNIT ") {
            continue;
        }
        let meta = ["# HELP ", "# TYPE "].iter().find_map(|p| {
            let rest = line.strip_prefix(p)?;
            let (name, tail) = rest.split_once(' ')?;
            counters
                .contains(name)
                .then(|| format!("{p}{name}_total {tail}"))
        });
        out.push_str(meta.as_deref().unwrap_or(line));
        out.push('\n');
    }
    out
}

/// `/healthz`'s body while the loop is alive: `ok`, then a line for each part of
/// the figures the agent cannot measure here.
fn health(shared: &Shared) -> String {
    let snap = match shared.lock() {
        Ok(s) => s.clone(),
        Err(p) => p.into_inner().clone(),
    };
    let mut out = String::from("ok\n");
    for (part, why) in &snap.degraded {
        out.push_str(&format!("degraded: {part}: {why}\n"));
    }
    out
}

/// Serves `/metrics` and `/healthz` on `listener` until the task is dropped.
/// `healthy` says whether the sampling loop is alive (it read the cgroups lately).
/// Accepting never waits for a connection in progress: each has READ_DEADLINE to
/// send its request and REQUEST_DEADLINE in all, so idle or slow clients cannot
/// queue a health probe behind them; past MAX_CONNECTIONS at once, a new one is
/// answered 503 at once.
async fn serve(
    listener: TcpListener,
    shared: Shared,
    healthy: Arc<dyn Fn() -> bool + Send + Sync>,
    names: SeriesNames,
) {
    let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
    loop {
        let (mut stream, _) = match listener.accept().await {
            Ok(c) => c,
            Err(e) => {
                crate::warn::warn_once("node.accept", format_args!("metrics endpoint: {e}"));
                tokio::time::sleep(Duration::from_millis(100)).await;
                continue;
            }
        };
        let Ok(permit) = slots.clone().try_acquire_owned() else {
            tokio::spawn(async move {
                let busy = "HTTP/1.1 503 Service Unavailable\r\nContent-Length: 5\r\nConnection: close\r\n\r\nbusy\n";
                let _ =
                    tokio::time::timeout(READ_DEADLINE, stream.write_all(busy.as_bytes())).await;
            });
            continue;
        };
        let (shared, healthy) = (shared.clone(), healthy.clone());
        tokio::spawn(async move {
            let _ =
                tokio::time::timeout(REQUEST_DEADLINE, answer(stream, &shared, &*healthy, names))
                    .await;
            drop(permit);
        });
    }
}

async fn answer(
    mut s: TcpStream,
    shared: &Shared,
    healthy: &(dyn Fn() -> bool + Send + Sync),
    names: SeriesNames,
) -> std::io::Result<()> {
    let mut buf = vec![0u8; 8192];
    let mut len = 0;
    let (status, ctype, body, head_only) = loop {
        let n = match tokio::time::timeout(READ_DEADLINE, s.read(&mut buf[len..])).await {
            Ok(r) => r?,
            // Too slow to say what it wants: the slot goes to someone else.
            Err(_) => return Ok(()),
        };
        if n == 0 {
            return Ok(());
        }
        len += n;
        let mut headers = [httparse::EMPTY_HEADER; 32];
        let mut req = httparse::Request::new(&mut headers);
        match req.parse(&buf[..len]) {
            Ok(httparse::Status::Complete(_)) => {}
            Ok(httparse::Status::Partial) if len < buf.len() => continue,
            _ => {
                break (
                    "400 Bad Request",
                    "text/plain",
                    "bad request\n".to_string(),
                    false,
                )
            }
        }
        let head_only = req.method == Some("HEAD");
        if !matches!(req.method, Some("GET" | "HEAD")) {
            break (
                "405 Method Not Allowed",
                "text/plain",
                "GET only\n".into(),
                false,
            );
        }
        let path = req.path.unwrap_or("/").split('?').next().unwrap_or("/");
        let accept = req
            .headers
            .iter()
            .find(|h| h.name.eq_ignore_ascii_case("accept"))
            .map(|h| String::from_utf8_lossy(h.value).into_owned())
            .unwrap_or_default();
        break match path {
            "/metrics" => {
                let om = accept.contains("application/openmetrics-text");
                let ctype = if om {
                    "application/openmetrics-text; version=1.0.0; charset=utf-8"
                } else {
                    "text/plain; version=0.0.4; charset=utf-8"
                };
                ("200 OK", ctype, encode(shared, om, names), head_only)
            }
            "/healthz" if healthy() => ("200 OK", "text/plain", health(shared), head_only),
            "/healthz" => (
                "503 Service Unavailable",
                "text/plain",
                "sampling stalled\n".into(),
                head_only,
            ),
            _ => (
                "404 Not Found",
                "text/plain",
                "not found\n".into(),
                head_only,
            ),
        };
    };
    let head = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {ctype}\r\nContent-Length: {}\r\nConnection: close\r\n\r\n",
        body.len()
    );
    s.write_all(head.as_bytes()).await?;
    if !head_only {
        s.write_all(body.as_bytes()).await?;
    }
    s.shutdown().await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::node::{CgroupCounters, DeviceIo, Found};

    fn snap() -> Shared {
        Arc::new(Mutex::new(Arc::new(NodeSnapshot {
            containers: vec![Current {
                found: Arc::new(Found {
                    rel: "kubepods/pod\"x/abc".into(),
                    pod_uid: Some("u-1".into()),
                    container_id: Some("abc".into()),
                    qos: Some("burstable"),
                    cgroup_id: None,
                }),
                counters: CgroupCounters {
                    cpu_usage_ns: Some(1_500_000_000),
                    memory_bytes: Some(4096),
                    devices: vec![DeviceIo {
                        device: "/dev/sda".into(),
                        read_bytes: 10,
                        ..Default::default()
                    }],
                    ..Default::default()
                },
                names: None,
                oom_commands: vec![("work\"er".into(), 2)],
                oom_victims: Vec::new(),
                gpu: None,
                top_commands: vec![("make".into(), 1.5, 3)],
            }],
            agent_cpu_secs: 0.25,
            skipped_runs: vec![("sched_process_fork", 3), ("sched_process_exit", 0)],
            freed_unread: 2,
            ..Default::default()
        })))
    }

    #[test]
    fn text_and_openmetrics() {
        let s = snap();
        let text = encode(&s, false, SeriesNames::Cadvisor);
        assert!(
            text.contains("# TYPE container_cpu_usage_seconds_total counter\n"),
            "{text}"
        );
        assert!(text.contains("container_cpu_usage_seconds_total{id=\"/kubepods/pod\\\"x/abc\",pod_uid=\"u-1\",container_id=\"abc\",qos=\"burstable\",namespace=\"\",pod=\"\",container=\"\",image=\"\"} 1.5\n"), "{text}");
        assert!(text.contains("container_memory_usage_bytes{"), "{text}");
        // Storage by device, as cAdvisor labels it.
        assert!(
            text.contains("image=\"\",device=\"/dev/sda\"} 10.0\n")
                && text.contains("# TYPE container_fs_reads_bytes_total counter\n"),
            "{text}"
        );
        assert!(
            !text.contains("# EOF") && !text.contains("container_cpu_user_seconds"),
            "{text}"
        );
        let om = encode(&s, true, SeriesNames::Cadvisor);
        assert!(
            om.ends_with("# EOF\n") && om.contains("# TYPE container_cpu_usage_seconds counter\n"),
            "{om}"
        );
        assert!(
            text.contains("resource_tracker_container_oom_victims_total{")
                && text.contains("command=\"work\\\"er\"} 2"),
            "{text}"
        );
        // The skips are named per tracepoint, each a bound on its own count.
        assert!(
            text.contains(
                "resource_tracker_skipped_runs_total{tracepoint=\"sched_process_fork\"} 3.0\n"
            ) && text.contains(
                "resource_tracker_skipped_runs_total{tracepoint=\"sched_process_exit\"} 0.0\n"
            ),
            "{text}"
        );
        assert!(
            text.contains("resource_tracker_freed_unread_total 2.0\n"),
            "{text}"
        );
        // Ours by default: never a series of the kubelet's cAdvisor.
        let own = encode(&s, false, SeriesNames::Own);
        assert!(
            own.contains("\nresource_tracker_container_cpu_usage_seconds_total{id=")
                && own.contains("\nresource_tracker_container_oom_victims_total{"),
            "{own}"
        );
        assert!(!own.lines().any(|l| l.starts_with("container_")), "{own}");
        // Gone from the snapshot: gone from the endpoint.
        *s.lock().unwrap() = Arc::default();
        assert!(!encode(&s, false, SeriesNames::Cadvisor)
            .contains("container_cpu_usage_seconds_total{"));
    }
}
