//! The tracking session: picks the engine, starts or attaches to the tree, samples on
//! a fixed grid, forwards signals, and writes the final sample and summary.

use std::{
    collections::{HashMap, HashSet},
    ffi::OsString,
    io::Write,
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context as _};
use tokio::{io::unix::AsyncFd, sync::mpsc};

use crate::{
    cli::Opts,
    collect::{gpu::GpuCollector, HostReading, Roots, SystemCollector},
    config::Settings,
    csv, discovery,
    engine::{ebpf::EbpfEngine, procfs::ProcfsEngine, Backend, ProcEvent, ReadOpts, TreeTotals},
    launcher, output,
    sampler::{Sampler, Stamp},
    stream,
    summary::{BpfProgram, Summary, TopCommand},
};

pub struct Plan {
    pub opts: Opts,
    pub settings: Settings,
    pub cmd: Vec<OsString>,
}

enum Engine {
    Ebpf(Box<EbpfEngine>),
    Procfs(Box<ProcfsEngine>),
}

impl Engine {
    fn backend(&self) -> Backend {
        match self {
            Engine::Ebpf(_) => Backend::Ebpf,
            Engine::Procfs(_) => Backend::Procfs,
        }
    }
    fn read(
        &mut self,
        o: ReadOpts,
        ring: Option<&mut Ring>,
        log: &mut EventLog,
    ) -> anyhow::Result<TreeTotals> {
        match self {
            Engine::Ebpf(e) => e.read(o, ring, &mut |ev| log.show(ev)),
            Engine::Procfs(e) => e.read(o),
        }
    }
    /// Live processes of the tree (eBPF: the task map; procfs: the last walk).
    fn live_pids(&self) -> HashSet<u32> {
        match self {
            Engine::Ebpf(e) => e.live_tasks().into_keys().collect(),
            Engine::Procfs(e) => e.live_pids().collect(),
        }
    }
    fn bpf_stats(&self) -> Option<(u64, u64)> {
        match self {
            Engine::Ebpf(e) if e.stats_enabled() => {
                let v = e.prog_stats();
                Some(v.iter().fold((0, 0), |(c, t), (_, rc, rt)| {
                    (c + rc, t + rt.as_nanos() as u64)
                }))
            }
            _ => None,
        }
    }
}

type Ring = aya::maps::RingBuf<aya::maps::MapData>;

/// Where the tree's process events go: the `--events` file and the top commands.
struct EventLog {
    file: Option<std::io::BufWriter<std::fs::File>>,
    tops: HashMap<String, (u64, u64)>,
}

impl EventLog {
    fn show(&mut self, ev: ProcEvent) {
        if let Some(w) = self.file.as_mut() {
            if let Ok(line) = serde_json::to_string(&ev) {
                let _ = writeln!(w, "{line}");
            }
        }
        if ev.kind == "exit" && (self.tops.len() < 10_000 || self.tops.contains_key(&ev.comm)) {
            let e = self.tops.entry(ev.comm).or_default();
            e.0 += 1;
            e.1 += (ev.cpu_secs.unwrap_or(0.0) * 1e9) as u64;
        }
    }

    /// Takes what the ring holds between two samples.
    fn drain(&mut self, ring: &mut Ring, engine: &mut Option<Engine>) {
        if let Some(Engine::Ebpf(e)) = engine {
            e.drain(ring, &mut |ev| self.show(ev));
        }
    }
}

/// A child the reaper thread collected.
struct Reaped {
    pid: u32,
    status: i32,
    user_ns: u64,
    sys_ns: u64,
    maxrss_kib: u64,
}

const FORWARDED: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

fn forwarded_set() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data initialised by sigemptyset.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in FORWARDED {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

/// Blocks the forwarded signals in this thread and every thread started after it;
/// one thread then takes them with sigwaitinfo, which also tells who sent them.
fn block_signals() {
    let set = forwarded_set();
    // SAFETY: valid set, no old mask wanted.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
}

fn spawn_signal_thread(tx: mpsc::UnboundedSender<(i32, bool)>) {
    std::thread::spawn(move || {
        let set = forwarded_set();
        loop {
            // SAFETY: siginfo_t is plain data filled by the kernel.
            let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
            let sig = unsafe { libc::sigwaitinfo(&set, &mut info) };
            if sig < 0 {
                continue;
            }
            // SI_KERNEL: sent by the terminal to the whole foreground group, so the
            // child has it already; anything sent with kill(2) must be forwarded.
            let from_tty = info.si_code == libc::SI_KERNEL;
            if tx.send((sig, from_tty)).is_err() {
                return;
            }
        }
    });
}

fn spawn_reaper(tx: mpsc::UnboundedSender<Reaped>) {
    std::thread::spawn(move || loop {
        let mut status = 0;
        // SAFETY: rusage is plain data filled by the kernel.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        let pid = unsafe { libc::wait4(-1, &mut status, 0, &mut ru) };
        if pid < 0 {
            match std::io::Error::last_os_error().raw_os_error() {
                Some(libc::EINTR) => continue,
                _ => return, // ECHILD: nothing left to wait for
            }
        }
        let ns = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
        let r = Reaped {
            pid: pid as u32,
            status,
            user_ns: ns(ru.ru_utime),
            sys_ns: ns(ru.ru_stime),
            maxrss_kib: ru.ru_maxrss.max(0) as u64,
        };
        if tx.send(r).is_err() {
            return;
        }
    });
}

fn exit_code_of(status: i32) -> i32 {
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else if libc::WIFSIGNALED(status) {
        128 + libc::WTERMSIG(status)
    } else {
        1
    }
}

fn config_name(st: &Settings) -> String {
    st.config_file
        .as_ref()
        .map_or_else(String::new, |p| p.display().to_string())
}

/// The tree's reading, stamped with the middle of the time it took: a sample's time
/// is that of its tree figures, not of when the host collectors finished after them.
fn read_tree(
    engine: &mut Option<Engine>,
    o: ReadOpts,
    ring: Option<&mut Ring>,
    log: &mut EventLog,
) -> anyhow::Result<(TreeTotals, Stamp)> {
    let (t0, u0) = (Instant::now(), crate::sampler::unix_now());
    let t = match engine {
        Some(e) => e.read(o, ring, log)?,
        None => TreeTotals::default(),
    };
    let half = t0.elapsed() / 2;
    Ok((
        t,
        Stamp {
            at: t0 + half,
            unix: u0 + half.as_secs_f64(),
        },
    ))
}

/// The GPUs' readings and the tree's GPU use into `h`; nothing (not even the tree's
/// pid list) without a GPU.
fn read_gpu(gpus: &mut GpuCollector, engine: &Option<Engine>, h: &mut HostReading) {
    if !gpus.active() {
        return;
    }
    let pids = engine.as_ref().map(Engine::live_pids).unwrap_or_default();
    let (g, p) = gpus.sample(&pids);
    h.gpu = g;
    h.process_gpu = engine.is_some().then_some(p);
}

fn pid_exists(pid: u32) -> bool {
    std::path::Path::new(&format!("/proc/{pid}")).exists()
}

/// Runs the whole session; returns the exit code the tracker should exit with.
pub fn execute(plan: Plan) -> anyhow::Result<i32> {
    let o = &plan.opts;
    let st = &plan.settings;
    if let Some(c) = &st.config_file {
        log::info!("settings from config file {}", c.display());
    }
    // Everything that can fail on bad input fails here, before anything starts.
    let resolved = match plan.cmd.first() {
        Some(c) => match launcher::resolve(c, std::env::var_os("PATH").as_deref()) {
            Ok(p) => Some(p),
            Err(e) => {
                eprintln!("resource-tracker: {e}");
                return Ok(e.exit_code());
            }
        },
        None => None,
    };
    let attach_pid = match (st.pid, resolved.is_some()) {
        (Some(_), true) if o.pid.is_some() => {
            bail!("--pid and a command cannot be used together")
        }
        (Some(_), true) => {
            log::info!("tracking the command; [job] pid of the config file is ignored");
            None
        }
        (Some(p), false) => {
            let origin = if o.pid.is_some() {
                "--pid".to_string()
            } else {
                format!("[job] pid in {}", config_name(st))
            };
            let p = u32::try_from(p)
                .ok()
                .filter(|&p| p > 0)
                .ok_or_else(|| anyhow!("{origin}: '{p}' is not a valid process id"))?;
            if !pid_exists(p) {
                bail!("{origin}: no process with id {p}");
            }
            Some(p)
        }
        (None, _) => None,
    };
    let track_tree = attach_pid.is_some() || resolved.is_some();
    let run_as = launcher::sudo_identity(o.as_root).map_err(|e| anyhow!(e))?;
    let mut sink = output::Sink::open(st.output.as_deref(), st.quiet, st.format)?;
    let mut summary_file = o
        .summary
        .as_deref()
        .map(|p| output::create(p, "summary"))
        .transpose()?;
    let events_file = o
        .events
        .as_deref()
        .map(|p| output::create(p, "events").map(std::io::BufWriter::new))
        .transpose()?;

    block_signals();
    // Cloud discovery for the local summary only (streaming runs its own); it runs
    // beside the command and never delays it.
    let discovery =
        (st.discover && st.sentinel.is_none()).then(|| discovery::spawn(st.metadata.clone()));

    // Engine.
    let mut backend_reason = None;
    let mut engine = if !track_tree {
        None
    } else if o.no_ebpf {
        backend_reason = Some("--no-ebpf".to_string());
        None
    } else {
        match EbpfEngine::load(o.max_tasks, o.event_ring_kib * 1024, o.bpf_stats) {
            Ok(e) => {
                log::info!("eBPF engine loaded in {:.0} ms", e.load_ms);
                Some(e)
            }
            Err(e) => {
                eprintln!("resource-tracker: eBPF unavailable: {e}; falling back to /proc polling (backend procfs)");
                backend_reason = Some(e.to_string());
                None
            }
        }
    };
    if engine.is_none() && resolved.is_some() {
        // Orphans of the tree come back to us, and wait4 gives their exact usage.
        // SAFETY: prctl with integer arguments.
        unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    }

    // GPUs: probed once (NVML's initialisation is not the command's time).
    let mut gpus = GpuCollector::new(&Roots::default());
    // Baseline of the host counters: the first sample, one interval on, has rates.
    let mut host = SystemCollector::new(Roots::default());
    let host_facts = |host: &SystemCollector, gpus: &GpuCollector| {
        let mut h = host.host_info();
        gpus.host_fields(&mut h);
        h
    };
    // Read at start only when streaming registers with them; the summary reuses them.
    let mut host_info = None;
    let streamer = match &st.sentinel {
        Some(cfg) => {
            let info = host_info.insert(host_facts(&host, &gpus)).clone();
            let run = stream::RunInfo {
                meta: st.meta.clone(),
                command: plan
                    .cmd
                    .iter()
                    .map(|c| c.to_string_lossy().into_owned())
                    .collect(),
                host: info,
                share_identity: st.share_identity,
            };
            Some(stream::Streamer::start(
                cfg.clone(),
                st.upload_interval,
                csv::header() + "\n",
                run,
                st.metadata.clone(),
            )?)
        }
        None => None,
    };
    let emit = |sink: &mut output::Sink, s: &crate::sample::Sample| -> anyhow::Result<()> {
        sink.write(s)?;
        if let Some(up) = &streamer {
            up.push(csv::row(s));
        }
        Ok(())
    };
    let start = Instant::now();
    let (root, mut engine) = if !track_tree {
        (None, None)
    } else if let (Some(path), Some(_)) = (&resolved, plan.cmd.first()) {
        let paused = match launcher::spawn_paused(path, &plan.cmd, run_as.as_ref()) {
            Ok(p) => p,
            Err(e) => {
                eprintln!("resource-tracker: {e}");
                return Ok(e.exit_code());
            }
        };
        let pid = paused.pid;
        let engine = match engine.take() {
            Some(mut e) => {
                if let Err(err) = e.register_root(pid, false) {
                    paused.abort();
                    // SAFETY: reaping our own child.
                    unsafe { libc::waitpid(pid as i32, std::ptr::null_mut(), 0) };
                    return Err(err.context("registering the command with the eBPF engine"));
                }
                Engine::Ebpf(Box::new(e))
            }
            None => Engine::Procfs(Box::new(ProcfsEngine::new(pid, Some(std::process::id())))),
        };
        let engine = Some(engine);
        if let Err(e) = paused.release() {
            eprintln!("resource-tracker: {e}");
            // SAFETY: reaping our own child.
            unsafe { libc::waitpid(pid as i32, std::ptr::null_mut(), 0) };
            return Ok(e.exit_code());
        }
        (Some(pid), engine)
    } else {
        let pid = attach_pid.ok_or_else(|| anyhow!("no root process"))?;
        let engine = match engine.take() {
            Some(mut e) => {
                e.register_root(pid, true)?;
                Engine::Ebpf(Box::new(e))
            }
            None => Engine::Procfs(Box::new(ProcfsEngine::new(pid, None))),
        };
        (Some(pid), Some(engine))
    };
    let backend = engine.as_ref().map(Engine::backend);
    let is_run = resolved.is_some();

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    let result = rt.block_on(async {
        let (sig_tx, mut sig_rx) = mpsc::unbounded_channel();
        spawn_signal_thread(sig_tx);
        let (reap_tx, mut reap_rx) = mpsc::unbounded_channel();
        if is_run {
            spawn_reaper(reap_tx);
        } else {
            drop(reap_tx);
        }
        let ring = match &mut engine {
            Some(Engine::Ebpf(e)) => match e.ring() {
                // SAFETY: the RingBuf owns its map fd and lives inside the AsyncFd.
                Some(r) => Some(unsafe { AsyncFd::register(r) }.map_err(|e| anyhow!("polling the event ring: {e}"))?),
                None => None,
            },
            _ => None,
        };
        let mut ring = ring;
        let mut log = EventLog { file: events_file, tops: HashMap::new() };

        let read_opts = ReadOpts { pss: o.pss };
        let mut sampler = Sampler::new(root.zip(backend), st.meta.job_name.clone(), start);
        let base = match &mut engine {
            Some(e) if !is_run => Some(e.read(read_opts, ring.as_mut().map(|r| r.get_mut()), &mut log)?),
            _ => None,
        };
        sampler.baseline(base, engine.as_ref().and_then(Engine::bpf_stats));
        let period = Duration::from_secs_f64(st.interval);
        let mut next = tokio::time::Instant::from_std(start) + period;
        // The kernel wakes us only when the ring is a quarter full; otherwise it is
        // drained at each sample. (A 100 ms drain timer cost ~1 ms of CPU a second.)
        let mut exit_status: Option<i32> = None;
        loop {
            tokio::select! {
                _ = tokio::time::sleep_until(next) => {
                    // Deadline grid: no drift, and a late wake-up skips missed slots.
                    let now = tokio::time::Instant::now();
                    while next <= now { next += period; }
                    let t0 = Instant::now();
                    let (t, stamp) = read_tree(&mut engine, read_opts, ring.as_mut().map(|r| r.get_mut()), &mut log)?;
                    let mut h = host.sample();
                    read_gpu(&mut gpus, &engine, &mut h);
                    let t1 = Instant::now();
                    let s = sampler.step(t, h, stamp, engine.as_ref().and_then(Engine::bpf_stats));
                    emit(&mut sink, &s)?;
                    log::debug!("sample: read {:?}, step+write {:?}", t1 - t0, t1.elapsed());
                }
                Some(r) = reap_rx.recv() => {
                    if let Some(Engine::Procfs(p)) = &mut engine {
                        p.note_reaped(r.pid, r.user_ns, r.sys_ns, r.maxrss_kib);
                    }
                    if Some(r.pid) == root {
                        exit_status = Some(r.status);
                        break;
                    }
                }
                Some((sig, from_tty)) = sig_rx.recv() => {
                    if let (true, Some(root)) = (is_run, root) {
                        if !from_tty {
                            // SAFETY: signalling our own child.
                            unsafe { libc::kill(root as i32, sig) };
                        }
                    } else {
                        log::info!("signal {sig}: stopping");
                        break;
                    }
                }
                guard = async { match ring.as_mut() { Some(r) => r.readable_mut().await, None => std::future::pending().await } } => {
                    let mut guard = guard.context("waiting on the event ring")?;
                    log.drain(guard.get_inner_mut(), &mut engine);
                    guard.clear_ready();
                }
            }
        }
        // Members that have exited are retired by the sweep once off the CPU,
        // microseconds later: wait for those, never for reapers or RCU.
        if let Some(Engine::Ebpf(e)) = &mut engine {
            let waited = e.settle(Duration::from_millis(50));
            log::debug!("settled in {waited:?}");
        }
        // Orphans the tracker reaped (procfs): collect what is already there.
        // Zombies are reaped at once, so a short quiet gap means none is left.
        if let Some(Engine::Procfs(p)) = &mut engine {
            while let Ok(Some(r)) = tokio::time::timeout(Duration::from_millis(20), reap_rx.recv()).await {
                p.note_reaped(r.pid, r.user_ns, r.sys_ns, r.maxrss_kib);
            }
        }
        let (t, stamp) = read_tree(&mut engine, read_opts, ring.as_mut().map(|r| r.get_mut()), &mut log)?;
        let mut h = host.sample();
        read_gpu(&mut gpus, &engine, &mut h);
        let s = sampler.step(t, h, stamp, engine.as_ref().and_then(Engine::bpf_stats));
        emit(&mut sink, &s)?;
        if let Some(w) = log.file.as_mut() {
            w.flush().context("writing the events file")?;
        }
        let mut top: Vec<TopCommand> = log.tops
            .into_iter()
            .map(|(comm, (n, ns))| TopCommand { comm, processes: n, cpu_secs: ns as f64 / 1e9 })
            .collect();
        top.sort_by(|a, b| b.cpu_secs.total_cmp(&a.cpu_secs));
        top.truncate(5);
        Ok::<_, anyhow::Error>((sampler, exit_status, top))
    });
    let (sampler, exit_status, top) = result?;
    let wall = start.elapsed().as_secs_f64();
    let code = exit_status.map(exit_code_of);
    let streamed = streamer.map(|s| s.finish(code.unwrap_or(0)));
    let mut summary = Summary::build(
        &sampler.stats,
        wall,
        code,
        backend.map_or("none", Backend::as_str),
        backend_reason,
        top,
    );
    summary.job = st.meta.clone();
    summary.host = host_info.unwrap_or_else(|| host_facts(&host, &gpus));
    summary.cloud = discovery.and_then(|d| d.join().ok().flatten());
    if let Some(r) = streamed {
        summary.cloud = r.cloud.clone();
        summary.streaming = Some(r);
    }
    if let Some(Engine::Ebpf(e)) = &engine {
        summary.ebpf_load_ms = Some(e.load_ms);
        if e.stats_enabled() {
            summary.bpf_programs = e
                .prog_stats()
                .into_iter()
                .map(|(name, run_count, t)| BpfProgram {
                    name,
                    run_count,
                    run_time_ns: t.as_nanos() as u64,
                })
                .collect();
        }
    }
    if !st.quiet {
        eprint!("{}", summary.human());
    }
    if let Some(f) = summary_file.as_mut() {
        let name = o
            .summary
            .as_ref()
            .map(|p| p.display().to_string())
            .unwrap_or_default();
        serde_json::to_writer_pretty(&mut *f, &summary)
            .with_context(|| format!("writing summary file {name}"))?;
        writeln!(f).with_context(|| format!("writing summary file {name}"))?;
    }
    Ok(code.unwrap_or(0))
}
