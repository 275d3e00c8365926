//! `resource-tracker node`: every interval, find the node's container cgroups, read
//! the kernel's counters of each, turn them into samples (JSON lines) and the
//! snapshot `/metrics` exports; until SIGTERM or SIGINT.

use foldhash::{HashMap, HashMapExt as _, HashSet, HashSetExt as _};
use std::{
    collections::BTreeMap,
    path::Path,
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use anyhow::Context as _;

use crate::{
    collect::{
        containers::{scan, Hierarchies, Listings, Reader},
        gpu::GpuCollector,
    },
    discovery::kubelet::{Kubelet, Names},
    engine::ebpf::node::NodeLife,
    model::node::{Current, Found, NodeModel, NodeScan, NodeSnapshot},
    selfcost,
    settings::node::NodeSettings,
    sink::{
        self,
        jsonl::JsonLines,
        prometheus::{Endpoint, SeriesNames},
        Sink, Sinks,
    },
    warn::{say, warn_once},
};

/// Open files left to the agent's other uses (HTTP connections, outputs, /proc,
/// the BPF maps) when it keeps cgroup files open.
const FDS_SPARE: u64 = 512;
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
    let out = output_of(&st)?;
    let mut life = load_life(&st, &h);
    let names = Arc::new(Mutex::new(Names::default()));
    let ask = Arc::new(tokio::sync::Notify::new());
    let mut sinks = background(&st, out, &names, &ask)?;
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
        // An exposition is built twice over (OpenMetrics, then the text format),
        // ~4 MB each with 500 containers, on the server's thread. glibc's moving
        // mmap threshold put them in that thread's arena after the first scrape,
        // where they stayed: +8 MiB of RSS for good. Above a fixed threshold they
        // are mapped and handed back when freed.
        // SAFETY: mallopt has no preconditions.
        unsafe { libc::mallopt(libc::M_MMAP_THRESHOLD, 128 * 1024) };
        // Each container's cgroup files stay open between scans (collect/containers.rs),
        // as many as the open-file limit allows beside the agent's other files; an
        // eighth of them for the directories of the tree's listings.
        let fds = crate::sys::raise_open_files().saturating_sub(FDS_SPARE) as usize;
        let no_pressure = h.no_pressure_why();
        let mut scanner = Scanner::new(
            Reader::new(h, fds - fds / 8),
            Listings::new(fds / 8),
            GpuCollector::new(&st.roots),
            no_pressure,
        );
        let mut tick = tokio::time::interval(Duration::from_secs_f64(st.interval));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
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
            let known = match names.lock() {
                Ok(g) => g.clone(),
                Err(p) => p.into_inner().clone(),
            };
            let (read, unnamed) = scanner.scan(&root, &st.include, life.as_mut(), &known);
            if unnamed && st.kubelet.is_some() {
                ask.notify_one();
            }
            let now = crate::model::reading::unix_now();
            let samples = model.step(&read, Instant::now(), now, st.output.is_some());
            let snapshot = snapshot_of(read, life.as_ref(), &scanner);
            sinks.write(&NodeScan {
                samples,
                snapshot: Arc::new(snapshot),
            });
            log::debug!("node: {} containers in {:?}", model.len(), t0.elapsed());
            if scanner.scans == 1 {
                // The agent runs for the node's life: what only its start used
                // need not stay resident.
                let n = crate::sys::page_out_own_file();
                log::debug!("node: {n} bytes of the program's file paged out");
            }
        }
        sinks.finish(&mut ());
        anyhow::Ok(0)
    })
}

/// The scans' sinks (the output, the endpoint) and the kubelet's questions. The
/// endpoint and the kubelet requests run on a runtime of their own, on their own
/// thread: the loop blocks its thread while it reads, and a scrape or a health
/// probe never waits for a scan.
fn background(
    st: &NodeSettings,
    out: Option<JsonLines>,
    names: &Arc<Mutex<Names>>,
    ask: &Arc<tokio::sync::Notify>,
) -> anyhow::Result<Sinks<NodeScan, ()>> {
    let bg = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the endpoint's runtime")?;
    let mut list: Vec<Box<dyn Sink<NodeScan, ()>>> = Vec::new();
    list.extend(out.map(|o| Box::new(o) as Box<dyn Sink<NodeScan, ()>>));
    if let Some(addr) = st.listen {
        // Healthy while the loop has read the cgroups within three intervals (+5 s).
        let stale = Duration::from_secs_f64(3.0 * st.interval + 5.0);
        let names = if st.cadvisor_names {
            SeriesNames::Cadvisor
        } else {
            SeriesNames::Own
        };
        list.push(Box::new(Endpoint::start(&bg, addr, stale, names)?));
    }
    if let Some(cfg) = st.otlp.clone() {
        let meta = crate::model::JobMeta::default();
        list.push(Box::new(sink::otlp::Exporter::start(cfg, &meta)?));
    }
    if let Some(cfg) = st.kubelet.clone() {
        ask_kubelet(&bg, cfg, names, ask);
    }
    std::thread::Builder::new()
        .name("endpoint".into())
        .spawn(move || bg.block_on(std::future::pending::<()>()))
        .context("starting the endpoint's thread")?;
    Ok(Sinks::new(list))
}

/// The node's JSON lines, where `--output` names a file.
fn output_of(st: &NodeSettings) -> anyhow::Result<Option<JsonLines>> {
    Ok(match &st.output {
        Some(p) => Some(JsonLines::unbuffered(
            sink::create(p, "output", st.owner.as_ref())?,
            format!("the output file {}", p.display()),
            "node.jsonl",
            None,
        )),
        None => None,
    })
}

/// What the endpoint exports after a scan: the containers read, and the agent's
/// own state and cost.
fn snapshot_of(read: Vec<Current>, life: Option<&NodeLife>, scanner: &Scanner) -> NodeSnapshot {
    NodeSnapshot {
        containers: read,
        agent_cpu_secs: selfcost::cpu_secs(),
        agent_rss_bytes: (selfcost::rss_mib() * 1048576.0) as u64,
        ebpf: life.is_some(),
        lost_events: life.map_or(0, |l| l.lost()),
        skipped_runs: life.map(|l| l.skipped()).unwrap_or_default(),
        freed_unread: life.map_or(0, |l| l.freed_unread()),
        bpf_run_secs: life.and_then(|l| l.run_time()).map(|d| d.as_secs_f64()),
        scans: scanner.scans,
        vanished: scanner.vanished,
        degraded: scanner.degraded(),
    }
}

/// The process life cycle per container, from BPF; without it the cgroup figures
/// are all there is, and the endpoint says so (`resource_tracker_ebpf 0`).
fn load_life(st: &NodeSettings, h: &Hierarchies) -> Option<NodeLife> {
    if st.no_ebpf {
        return None;
    }
    let life = match NodeLife::load() {
        Ok(l) => l,
        Err(e) => {
            say(format_args!(
                "eBPF: {e}; processes per container are not counted (cgroup figures go on)"
            ));
            return None;
        }
    };
    if h.v2.is_none() {
        say("eBPF: no cgroup v2 hierarchy, whose ids the counts are keyed by; processes per container are not counted");
        return None;
    }
    Some(life)
}

/// Names from the kubelet into `names`: refreshed every 30 s, and at most every 5 s
/// when a container the kubelet has not named shows up (`ask`); the sampling never
/// waits for them.
fn ask_kubelet(
    bg: &tokio::runtime::Runtime,
    cfg: crate::discovery::kubelet::KubeletConfig,
    names: &Arc<Mutex<Names>>,
    ask: &Arc<tokio::sync::Notify>,
) {
    let k = match Kubelet::new(cfg) {
        Ok(k) => k,
        Err(e) => return say(format_args!("kubelet: {e}; containers keep their ids")),
    };
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
                        format_args!("kubelet: {e}; containers keep their ids until it answers"),
                    );
                }
            }
            tokio::time::sleep(Duration::from_secs(5)).await;
            let _ = tokio::time::timeout(Duration::from_secs(25), ask.notified()).await;
        }
    });
}

/// What a scan keeps from one to the next: cgroup ids, the commands' map read every
/// few scans, OOM kills by command, the GPU collector, and the counts the endpoint
/// exports.
struct Scanner {
    reader: Reader,
    /// A directory keeps its inode for its life: looked up once.
    id_cache: HashMap<String, u64>,
    tops: std::collections::HashMap<u64, Vec<(String, f64, u64)>>,
    /// OOM kills by command per container (cgroup path), for the containers alive.
    oom: HashMap<String, BTreeMap<String, u64>>,
    /// NVIDIA GPUs through NVML, probed once.
    gpus: GpuCollector,
    gpu_pids_ok: bool,
    scans: u64,
    vanished: u64,
    listings: Listings,
    /// What the last scan that listed anything found, with cgroup ids.
    found: Vec<Arc<Found>>,
    ids: HashSet<u64>,
    /// Why pressure is missing, where the last scan's containers had none.
    no_pressure: &'static str,
    pressure_missing: bool,
}

impl Scanner {
    fn new(
        reader: Reader,
        listings: Listings,
        gpus: GpuCollector,
        no_pressure: &'static str,
    ) -> Scanner {
        let gpu_pids_ok = crate::engine::ebpf::in_host_pid_ns();
        if gpus.active() && !gpu_pids_ok {
            // NVML's pids are the host's; /proc here is another namespace's.
            say("GPU per container needs the host's PID namespace (hostPID): not attributed");
        }
        Scanner {
            reader,
            id_cache: HashMap::new(),
            tops: std::collections::HashMap::new(),
            oom: HashMap::new(),
            gpus,
            gpu_pids_ok,
            scans: 0,
            vanished: 0,
            listings,
            found: Vec::new(),
            ids: HashSet::new(),
            no_pressure,
            pressure_missing: false,
        }
    }

    /// What the figures lack on this node, and why.
    fn degraded(&self) -> Vec<(&'static str, String)> {
        if self.pressure_missing {
            vec![("pressure", self.no_pressure.to_string())]
        } else {
            Vec::new()
        }
    }

    /// Notes whether the scan's containers have pressure; a node whose containers
    /// have none says why once (the series are absent, never zeros).
    fn note_pressure(&mut self, read: &[Current]) {
        if read.is_empty() {
            return;
        }
        self.pressure_missing = read.iter().all(|c| c.counters.pressure.is_none());
        if self.pressure_missing {
            warn_once(
                "node.pressure",
                format_args!(
                    "node: no pressure per container ({}): those series are absent",
                    self.no_pressure
                ),
            );
        }
    }

    /// Every container now, with its counters, names, life cycle, OOM victims,
    /// top commands and GPU use; and whether one with a pod had no name yet.
    fn scan(
        &mut self,
        root: &Path,
        include: &[String],
        mut life: Option<&mut NodeLife>,
        known: &Names,
    ) -> (Vec<Current>, bool) {
        if let Some(mut found) = scan(root, include, &mut self.listings) {
            let live: HashSet<&str> = found.iter().map(|f| f.rel.as_str()).collect();
            self.reader.retain(&|rel| live.contains(rel));
            self.oom.retain(|rel, _| live.contains(rel.as_str()));
            if life.is_some() {
                let mut next = HashMap::with_capacity(found.len());
                for f in &mut found {
                    f.cgroup_id = match self.id_cache.get(&f.rel) {
                        Some(id) => Some(*id),
                        None => self.reader.cgroup_id(&f.rel),
                    };
                    if let Some(id) = f.cgroup_id {
                        next.insert(f.rel.clone(), id);
                    }
                }
                self.id_cache = next;
            }
            self.ids = found.iter().filter_map(|f| f.cgroup_id).collect();
            self.found = found.into_iter().map(Arc::new).collect();
        }
        self.scans += 1;
        let found = self.found.clone();
        let ids = &self.ids;
        let counts = life.as_mut().map(|l| l.read(&|id| ids.contains(&id)));
        let victims = life.as_mut().map(|l| l.victims()).unwrap_or_default();
        // Walking the commands' map costs two syscalls a key: every few scans is
        // enough for counters scraped every 10 s or so.
        if self.scans % COMMAND_SCANS == 1 {
            self.tops = life
                .as_mut()
                .map(|l| l.commands(&|id| ids.contains(&id), TOP_COMMANDS))
                .unwrap_or_default();
        }
        let gpu_by = self.gpu_groups(&found);
        let mut read = Vec::with_capacity(found.len());
        let mut unnamed = false;
        for f in found {
            let Some(mut counters) = self.reader.read(&f.rel) else {
                self.vanished += 1;
                self.listings.vanished(root, &f.rel);
                continue;
            };
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
            // Kept only for containers that had a victim.
            if !new.is_empty() {
                let cmds = self.oom.entry(f.rel.clone()).or_default();
                for c in &new {
                    if cmds.contains_key(c) || cmds.len() < MAX_OOM_COMMANDS {
                        *cmds.entry(c.clone()).or_insert(0) += 1;
                    }
                }
            }
            // Looked up only where a container had a victim (hashing each path).
            let oom_commands = (!self.oom.is_empty())
                .then(|| self.oom.get(&f.rel))
                .flatten()
                .map(|cmds| cmds.iter().map(|(k, v)| (k.clone(), *v)).collect())
                .unwrap_or_default();
            let gpu = gpu_by
                .as_ref()
                .map(|g| g.get(&f.rel).copied().unwrap_or_default());
            let top_commands = f
                .cgroup_id
                .and_then(|id| self.tops.get(&id).cloned())
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
        self.note_pressure(&read);
        (read, unnamed)
    }

    /// GPU processes to containers by the last component of their cgroup path, which
    /// holds the container id (the rest depends on the reader's cgroup namespace).
    fn gpu_groups(
        &mut self,
        found: &[Arc<Found>],
    ) -> Option<BTreeMap<String, crate::model::ProcessGpu>> {
        if !(self.gpus.active() && self.gpu_pids_ok) {
            return None;
        }
        let by_name: HashMap<&str, &str> = found
            .iter()
            .filter_map(|f| Some((f.rel.rsplit('/').next()?, f.rel.as_str())))
            .collect();
        Some(self.gpus.sample_groups(&|pid| {
            let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
            text.lines()
                .filter_map(|l| l.rsplit('/').next())
                .find_map(|last| by_name.get(last).map(|r| r.to_string()))
        }))
    }
}
