//! `resource-tracker node`: every interval, find the node's container cgroups, read
//! the kernel's counters of each, turn them into samples (JSON lines) and the
//! snapshot `/metrics` exports; until SIGTERM or SIGINT.

use std::{
    io::Write as _,
    sync::{
        atomic::{AtomicU64, Ordering},
        Arc, Mutex,
    },
    time::{Duration, Instant},
};

use anyhow::Context as _;

use crate::{
    collect::containers::{scan, Hierarchies, Reader},
    discovery::kubelet::{Kubelet, Names},
    engine::ebpf::node::NodeLife,
    model::node::{Current, NodeModel, NodeSnapshot},
    selfcost,
    settings::node::NodeSettings,
    sink::{self, prometheus},
    warn::{say, warn_once},
};

/// The commands' map is read at every COMMAND_SCANS-th scan.
const COMMAND_SCANS: u64 = 5;

/// Commands by CPU exported per container (bounded cardinality).
const TOP_COMMANDS: usize = 5;

/// Commands a container's OOM-victim series are kept for (bounded cardinality).
const MAX_OOM_COMMANDS: usize = 16;

pub fn run(st: NodeSettings) -> anyhow::Result<i32> {
    let h = Hierarchies::probe(&st.roots);
    let Some(root) = h.scan_root().map(|p| p.to_path_buf()) else {
        say(format_args!(
            "no cgroup hierarchy under {}/fs/cgroup (mount the host's /sys, or set --host-sys)",
            st.roots.sys.display()
        ));
        return Ok(2);
    };
    let mut out = match &st.output {
        Some(p) => Some(std::io::BufWriter::new(sink::create(p, "output", None)?)),
        None => None,
    };
    // The process life cycle per container, from BPF; without it the cgroup figures
    // are all there is, and the endpoint says so (`resource_tracker_ebpf 0`).
    let mut life = if st.no_ebpf {
        None
    } else {
        match NodeLife::load() {
            Ok(l) => Some(l),
            Err(e) => {
                say(format_args!(
                    "eBPF: {e}; processes per container are not counted (cgroup figures go on)"
                ));
                None
            }
        }
    };
    if h.v2.is_none() && life.is_some() {
        say("eBPF: no cgroup v2 hierarchy, whose ids the counts are keyed by; processes per container are not counted");
        life = None;
    }
    let shared: prometheus::Shared = Arc::new(Mutex::new(NodeSnapshot::default()));
    // Healthy while the loop has read the cgroups within three intervals (+5 s), on
    // the monotonic clock: a step of the wall clock changes nothing.
    let start = Instant::now();
    let beat = Arc::new(AtomicU64::new(0));
    let stale = Duration::from_secs_f64(3.0 * st.interval + 5.0);
    let names = Arc::new(Mutex::new(Names::default()));
    let ask = Arc::new(tokio::sync::Notify::new());
    // The endpoint and the kubelet requests run on a runtime of their own, on their
    // own thread: the loop blocks its thread while it reads, and a scrape or a
    // health probe never waits for a scan.
    let bg = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the endpoint's runtime")?;
    if let Some(addr) = st.listen {
        // An agent without its endpoint would look dead to its probes and scrape
        // nothing: a port that cannot be had ends it at start (exit 1).
        let l = bg
            .block_on(tokio::net::TcpListener::bind(addr))
            .with_context(|| format!("--listen {addr}: cannot serve the metrics endpoint"))?;
        let at = l.local_addr().unwrap_or(addr);
        say(format_args!(
            "node: serving /metrics and /healthz on http://{at}"
        ));
        let b = beat.clone();
        let healthy = Arc::new(move || {
            start
                .elapsed()
                .saturating_sub(Duration::from_nanos(b.load(Ordering::Relaxed)))
                < stale
        });
        bg.spawn(prometheus::serve(l, shared.clone(), healthy));
    }
    // Names: refreshed every 30 s, and at most every 5 s when a container the
    // kubelet has not named shows up; the sampling never waits for them.
    if let Some(cfg) = st.kubelet.clone() {
        match Kubelet::new(cfg) {
            Ok(k) => {
                let (names, ask) = (names.clone(), ask.clone());
                bg.spawn(async move {
                    loop {
                        match k.names().await {
                            Ok(n) => match names.lock() {
                                Ok(mut g) => *g = n,
                                Err(p) => *p.into_inner() = n,
                            },
                            Err(e) => {
                                warn_once(
                                    "node.kubelet",
                                    format_args!(
                                        "kubelet: {e}; containers keep their ids until it answers"
                                    ),
                                );
                            }
                        }
                        tokio::time::sleep(Duration::from_secs(5)).await;
                        let _ = tokio::time::timeout(Duration::from_secs(25), ask.notified()).await;
                    }
                });
            }
            Err(e) => say(format_args!("kubelet: {e}; containers keep their ids")),
        }
    }
    std::thread::Builder::new()
        .name("endpoint".into())
        .spawn(move || bg.block_on(std::future::pending::<()>()))
        .context("starting the endpoint's thread")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    rt.block_on(async move {
        // Made once, before the loop: a signal that comes while the loop reads is
        // kept for the next select.
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate()).context("SIGTERM handler")?;
        let mut int = signal(SignalKind::interrupt()).context("SIGINT handler")?;
        let mut model = NodeModel::default();
        let mut tops = std::collections::HashMap::new();
        let mut id_cache: std::collections::HashMap<String, u64> = std::collections::HashMap::new();
        // NVIDIA GPUs through NVML, probed once.
        let mut gpus = crate::collect::gpu::GpuCollector::new(&st.roots);
        if gpus.active() && !crate::engine::ebpf::in_host_pid_ns() {
            // NVML's pids are the host's; /proc here is another namespace's.
            say("GPU per container needs the host's PID namespace (hostPID): not attributed");
        }
        let gpu_pids_ok = crate::engine::ebpf::in_host_pid_ns();
        // OOM kills by command per container (cgroup path), for the containers alive.
        let mut oom: std::collections::HashMap<String, std::collections::BTreeMap<String, u64>> =
            std::collections::HashMap::new();
        let mut reader = Reader::new(h);
        let mut tick = tokio::time::interval(Duration::from_secs_f64(st.interval));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let (mut scans, mut vanished) = (0u64, 0u64);
        loop {
            tokio::select! {
                _ = tick.tick() => {}
                _ = int.recv() => {
                    say("node: stopped by SIGINT");
                    break;
                }
                _ = term.recv() => {
                    say("node: stopped by SIGTERM");
                    break;
                }
            }
            let t0 = Instant::now();
            let found = scan(&root, &st.include);
            scans += 1;
            let mut read = Vec::with_capacity(found.len());
            let known = match names.lock() {
                Ok(g) => g.clone(),
                Err(p) => p.into_inner().clone(),
            };
            let mut unnamed = false;
            let mut found = found;
            if life.is_some() {
                // A directory keeps its inode for its life: looked up once.
                let mut next = std::collections::HashMap::with_capacity(found.len());
                for f in &mut found {
                    f.cgroup_id = match id_cache.get(&f.rel) {
                        Some(id) => Some(*id),
                        None => reader.cgroup_id(&f.rel),
                    };
                    if let Some(id) = f.cgroup_id {
                        next.insert(f.rel.clone(), id);
                    }
                }
                id_cache = next;
            }
            let ids: std::collections::HashSet<u64> =
                found.iter().filter_map(|f| f.cgroup_id).collect();
            let counts = life.as_mut().map(|l| l.read(&|id| ids.contains(&id)));
            let victims = life.as_mut().map(|l| l.victims()).unwrap_or_default();
            // Walking the commands' map costs two syscalls a key: every few
            // scans is enough for counters scraped every 10 s or so.
            if scans % COMMAND_SCANS == 1 {
                tops = life
                    .as_mut()
                    .map(|l| l.commands(&|id| ids.contains(&id), TOP_COMMANDS))
                    .unwrap_or_default();
            }
            // GPU processes to containers by the last component of their cgroup
            // path, which holds the container id (the rest depends on the reader's
            // cgroup namespace).
            let gpu_by = (gpus.active() && gpu_pids_ok).then(|| {
                let by_name: std::collections::HashMap<&str, &str> = found
                    .iter()
                    .filter_map(|f| Some((f.rel.rsplit('/').next()?, f.rel.as_str())))
                    .collect();
                gpus.sample_groups(&|pid| {
                    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
                    text.lines()
                        .filter_map(|l| l.rsplit('/').next())
                        .find_map(|last| by_name.get(last).map(|r| r.to_string()))
                })
            });
            oom.retain(|rel, _| found.iter().any(|f| &f.rel == rel));
            for f in found {
                match reader.read(&f.rel) {
                    Some(mut counters) => {
                        if let Some(c) = &counts {
                            // A container counted nothing yet still has its zeros.
                            counters.life = f
                                .cgroup_id
                                .map(|id| c.get(&id).copied().unwrap_or_default());
                        }
                        let n = known.of(f.pod_uid.as_deref(), f.container_id.as_deref());
                        unnamed |= n.is_none() && f.pod_uid.is_some();
                        let new: Vec<String> = victims
                            .iter()
                            .filter(|v| v.cgroup_id != 0 && Some(v.cgroup_id) == f.cgroup_id)
                            .map(|v| v.comm.clone())
                            .collect();
                        let cmds = oom.entry(f.rel.clone()).or_default();
                        for c in &new {
                            if cmds.contains_key(c) || cmds.len() < MAX_OOM_COMMANDS {
                                *cmds.entry(c.clone()).or_insert(0) += 1;
                            }
                        }
                        let oom_commands = cmds.iter().map(|(k, v)| (k.clone(), *v)).collect();
                        let gpu = gpu_by
                            .as_ref()
                            .map(|g| g.get(&f.rel).copied().unwrap_or_default());
                        let top_commands = f
                            .cgroup_id
                            .and_then(|id| tops.get(&id).cloned())
                            .unwrap_or_default();
                        read.push(Current {
                            top_commands,
                            found: f,
                            counters,
                            names: n,
                            oom_commands,
                            oom_victims: new,
                            gpu,
                        });
                    }
                    None => vanished += 1,
                }
            }
            if unnamed && st.kubelet.is_some() {
                ask.notify_one();
            }
            let now = crate::model::reading::unix_now();
            let samples = model.step(&read, Instant::now(), now);
            if let Some(w) = out.as_mut() {
                let mut ok = true;
                for s in &samples {
                    ok &= serde_json::to_writer(&mut *w, s).is_ok() && w.write_all(b"\n").is_ok();
                }
                if !(ok && w.flush().is_ok()) {
                    let name = st.output.as_deref().map(|p| p.display().to_string());
                    warn_once(
                        "node.output",
                        format_args!(
                            "cannot write {}; samples go on to /metrics only",
                            name.unwrap_or_default()
                        ),
                    );
                }
            }
            let snap = NodeSnapshot {
                containers: read,
                agent_cpu_secs: selfcost::cpu_secs(),
                agent_rss_bytes: (selfcost::rss_mib() * 1048576.0) as u64,
                ebpf: life.is_some(),
                lost_events: life.as_ref().map_or(0, |l| l.lost()),
                bpf_run_secs: life
                    .as_ref()
                    .and_then(|l| l.run_time())
                    .map(|d| d.as_secs_f64()),
                scans,
                vanished,
            };
            match shared.lock() {
                Ok(mut s) => *s = snap,
                Err(p) => *p.into_inner() = snap,
            }
            beat.store(start.elapsed().as_nanos() as u64, Ordering::Relaxed);
            log::debug!("node: {} containers in {:?}", model.len(), t0.elapsed());
        }
        anyhow::Ok(0)
    })
}
