//! The sampling loop: samples on a fixed grid, forwards signals, takes the event
//! ring when the kernel says it fills, and writes the final sample once the tree
//! has settled.

use std::{
    collections::HashSet,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    time::{Duration, Instant},
};

use anyhow::Context as _;
use tokio::{io::unix::AsyncFd, sync::mpsc};

use super::{
    end::{self, OnSignal},
    events::EventLog,
    ready::Ready,
    signals::{self, Reaped},
    told::Told,
};
use crate::{
    collect::{
        gpu::GpuCollector,
        memcg::{TreeCgroup, TreeCpu},
        SystemCollector,
    },
    engine::{procread, pss::PssSum, Engine, ReadOpts, Ring},
    model::{
        degraded::{self, Degradations},
        reading::{unix_now, MemcgReading, Pressure, TreeTotals},
        OwnCost, Reading, Sample, Sampler, Stamp, TopCommand,
    },
    selfcost,
    settings::Settings,
    sink::Sinks,
    warn::{self, warn_once},
};

/// What the loop reads.
pub struct Tracked {
    pub engine: Option<Engine>,
    /// Root of the tracked tree (None: host only).
    pub root: Option<u32>,
    /// The root when the tracker started it as a command (its child).
    pub command_root: Option<u32>,
    pub events: EventLog,
    pub host: SystemCollector,
    pub gpus: GpuCollector,
    /// What the session knows is not exact (eBPF unavailable), for every sample.
    pub degraded: Degradations,
    /// The cgroup made for the command; None: memory is Σ PSS.
    pub memcg: Option<TreeCgroup>,
    /// Where the command's CPU is counted by a cgroup; None: the backend's sums.
    pub cpucg: Option<TreeCpu>,
    /// Told once the tree's first reading is taken.
    pub ready: Option<Ready>,
    /// What the attached root tells of its reaped children's CPU and largest RSS.
    pub told: Option<Told>,
}

/// How the loop ended.
pub struct Ended {
    pub sampler: Sampler,
    /// The command's wait status; None when attached or host-only.
    pub status: Option<i32>,
    pub top: Vec<TopCommand>,
    pub engine: Option<Engine>,
    /// To be removed once the tree is gone.
    pub memcg: Option<TreeCgroup>,
    pub cpucg: Option<TreeCpu>,
    /// How a member left the cgroup made for the command, if one did: under
    /// `--cpus`/`--memory` the limits did not hold for it.
    pub left_cgroup: Option<String>,
}

struct Loop {
    engine: Option<Engine>,
    events: EventLog,
    host: SystemCollector,
    gpus: GpuCollector,
    sampler: Sampler,
    opts: ReadOpts,
    memcg: Option<TreeCgroup>,
    /// The tree is no longer exactly the cgroup's (a member left it).
    memcg_stale: bool,
    /// How a member left the cgroup made for the command (moved out, or ran
    /// outside it), for the limits' verdict.
    left_cgroup: Option<String>,
    /// The command runs under `--cpus`/`--memory` in that cgroup.
    limited: bool,
    cpucg: Option<TreeCpu>,
    /// The CPU cgroup's last total: the tree's CPU is never below it.
    cpu_floor: u64,
    /// An adopted CPU cgroup's figure less the tree's at the first sample: what
    /// it counted before the tracker came (ns, signed).
    cpu_offset: Option<i128>,
    /// An adopted memory cgroup gave the tree's memory at least once.
    adopted_used: bool,
    /// Σ PSS, the memory figure without a cgroup that holds exactly the tree.
    pss: PssSum,
    /// Σ PSS beside the cgroup too (`--pss`).
    pss_always: bool,
    /// The run's last sample is being taken.
    last: bool,
    /// What the attached root tells of its reaped children's CPU and largest RSS
    /// (`hear_root`).
    told: Option<Told>,
}

impl Loop {
    /// The tree's reading, stamped with the middle of the time it took: a sample's
    /// time is that of its tree figures, not of when the host collectors finished.
    fn read_tree(&mut self, ring: Option<&mut Ring>) -> anyhow::Result<(TreeTotals, Stamp)> {
        let (t0, u0) = (Instant::now(), unix_now());
        let events = &mut self.events;
        let t = match &mut self.engine {
            Some(e) => {
                let opts = ReadOpts {
                    whole: self.last,
                    ..self.opts
                };
                e.read(opts, ring, &mut |ev| events.show(ev))?
            }
            None => TreeTotals::default(),
        };
        let half = t0.elapsed() / 2;
        let stamp = Stamp {
            at: t0 + half,
            unix: u0 + half.as_secs_f64(),
        };
        Ok((t, stamp))
    }

    /// The charge of the command's cgroup while it holds exactly the tree. A member
    /// found outside it (it moved itself elsewhere) ends that for the run: memory is
    /// Σ PSS from this sample on.
    fn tree_memcg(&mut self, tree: &TreeTotals, live: &mut LivePids) -> Option<MemcgReading> {
        if self.memcg_stale {
            return None;
        }
        let cg = self.memcg.as_mut()?;
        // The kernel read every live process charged to the cgroup: nothing to list.
        let stray = if tree.memcg_inside {
            None
        } else {
            cg.stray(live.get(&self.engine))
        };
        // A cgroup found holding the tree may gain other processes (a shell
        // started in the container); the tracker itself may be in it.
        let stranger = if cg.is_adopted() && stray.is_none() {
            let live = live.get(&self.engine);
            match cg.strangers(&|p| live.contains(&p)) {
                Ok(None) => None,
                Ok(Some(pid)) => Some(format!(
                    "pid {pid} in {} is not the tree's",
                    cg.dir().display()
                )),
                Err(e) => Some(e),
            }
        } else {
            None
        };
        // Whether a member left it (moved out, or ran outside it).
        let (why, left) = match (stray, stranger) {
            (_, Some(why)) => (why, false),
            (None, None) => match cg.read() {
                Some(r) if !ran_outside(tree.max_rss_kib, &r) => {
                    self.adopted_used |= cg.is_adopted();
                    return Some(less_tracker(r, cg.tracker_inside()));
                }
                Some(r) => (
                    format!(
                        "a member's RSS ({} MiB) is far above all {} was ever charged ({} MiB): members ran outside it",
                        tree.max_rss_kib / 1024,
                        cg.dir().display(),
                        r.peak.unwrap_or(r.current) >> 20
                    ),
                    true,
                ),
                None => (format!("{} cannot be read", cg.dir().display()), false),
            },
            (Some(l), None) => (
                format!(
                    "pid {} of the tree left {} (it is in {})",
                    l.pid,
                    cg.dir().display(),
                    warn::escaped(&l.cgroup)
                ),
                true,
            ),
        };
        if left {
            self.left(&why);
        }
        // A cgroup that never held only the tree (a login session's, the
        // machine's) is given up without a word; one that did is said.
        if self.adopted_used {
            warn_once(
                "adopted-cgroup",
                format!("{why}: the tree's memory is Σ PSS and its CPU the backend's from here on"),
            );
        }
        log::info!("{why}: the tree's memory is Σ PSS from here on (memory_source pss)");
        self.memcg_stale = true;
        // From here on `PssSum` reads it.
        self.opts.memcg_id = None;
        None
    }

    /// A member left the cgroup made for the command (`why`): kept for the
    /// limits' verdict and, under limits, named from this sample on.
    fn left(&mut self, why: &str) {
        if self.limited {
            self.sampler.degrade(
                degraded::LIMIT_ESCAPED,
                format!("{why}: the limits do not hold for it"),
            );
        }
        self.left_cgroup.get_or_insert_with(|| why.to_string());
    }

    /// The stall times of the v2 cgroup made for the command: the CPU one of its
    /// own, else the memory one while it holds the tree. None without one.
    fn tree_pressure(&mut self) -> Option<Pressure> {
        if let Some(cg) = self.cpucg.as_mut().and_then(|c| c.own.as_mut()) {
            return cg.is_v2().then(|| cg.pressure()).flatten();
        }
        if self.memcg_stale {
            return None;
        }
        self.memcg
            .as_mut()
            .filter(|c| c.is_v2())
            .and_then(TreeCgroup::pressure)
    }

    /// The tree's CPU from its cgroup: the scheduler's charge of every member,
    /// however it ended (`tree.fig.cpu_ns` becomes it). Whether it did.
    ///
    /// The cgroup holds only members, and both it and the backend's reads take
    /// `sum_exec_runtime` as the scheduler last brought it up to date, the cgroup
    /// read last: while the tree is wholly inside, the cgroup's figure is never
    /// below the backend's and exceeds it by what no member's own figure holds
    /// any more. A member that moves itself to another cgroup takes its CPU
    /// from then on out of the cgroup's figure and leaves it in the backend's,
    /// which then is the larger. So the larger of the two is the tree's CPU, and
    /// no per-sample check of the cgroup's members is needed (one measured ~0.1 ms
    /// a sample for 50 processes). A cgroup that can no longer be read is given up.
    fn tree_cpu(&mut self, tree: &mut TreeTotals, live: &mut LivePids) -> bool {
        let backend_ns = tree.fig.cpu_ns;
        if self.cpucg.as_ref().is_some_and(|c| c.adopted) {
            return self.adopted_cpu(tree, live);
        }
        let Some(c) = self.cpucg.as_mut() else {
            tree.fig.cpu_ns = backend_ns.max(self.cpu_floor);
            return false;
        };
        let read = match c.own.as_mut() {
            Some(cg) => cg.cpu_ns(),
            // The memory cgroup (v2) holds the CPU too.
            None => self.memcg.as_mut().and_then(TreeCgroup::cpu_ns),
        };
        let Some(ns) = read else {
            log::info!(
                "the command's CPU cgroup cannot be read: the tree's CPU is the backend's from \
                 here on (cpu_source {})",
                self.engine
                    .as_ref()
                    .map_or("none", |e| e.backend().as_str())
            );
            if let Some(mut cg) = self.cpucg.take().and_then(|c| c.own) {
                cg.remove();
            }
            tree.fig.cpu_ns = backend_ns.max(self.cpu_floor);
            return false;
        };
        let total = ns + c.pre_join_ns;
        log::trace!("tree CPU: cgroup {total} ns, backend {backend_ns} ns");
        self.cpu_floor = self.cpu_floor.max(total);
        tree.fig.cpu_ns = backend_ns.max(self.cpu_floor);
        // v2 counts whole microseconds (`usage_usec`), and so do rusage's times:
        // a backend ahead by less than one is the same figure.
        total + 1_000 >= backend_ns
    }

    /// The tree's CPU from a cgroup found holding it (attached): what the cgroup
    /// adds from the first sample on, less this tracker's own CPU where it is
    /// inside, on top of the backend's first figure. The backend's later figures
    /// are not taken over it: procfs counts again what a reaped member leaves in
    /// its reaper's `cutime`. The cgroup checked for strangers (here for v1's own
    /// CPU cgroup; with v2 the memory one is the same) and given up, with the
    /// memory one, once anything else is in it.
    fn adopted_cpu(&mut self, tree: &mut TreeTotals, live: &mut LivePids) -> bool {
        let backend_ns = tree.fig.cpu_ns;
        let Some(counted) = self.adopted_counted(live) else {
            if self.cpucg.take().is_some() {
                log::info!("the attached tree's CPU cgroup holds more than the tree, or cannot be read: its CPU is the backend's from here on");
            }
            tree.fig.cpu_ns = backend_ns.max(self.cpu_floor);
            return false;
        };
        let offset = *self
            .cpu_offset
            .get_or_insert(i128::from(backend_ns) - counted);
        let total = u64::try_from((counted + offset).max(0)).unwrap_or(0);
        self.cpu_floor = self.cpu_floor.max(total);
        tree.fig.cpu_ns = self.cpu_floor;
        true
    }

    /// What an adopted CPU cgroup has counted, less this tracker's own CPU where
    /// it is inside (ns); None once it holds anything but the tree and this
    /// tracker (checked here for v1's own CPU cgroup; v2's is the memory one,
    /// checked by `tree_memcg`) or cannot be read.
    fn adopted_counted(&mut self, live: &mut LivePids) -> Option<i128> {
        let live = live.get(&self.engine);
        let stale = self.memcg.is_some() && self.memcg_stale;
        let (ns, inside) = match self.cpucg.as_mut()?.own.as_mut() {
            Some(cg) => match cg.strangers(&|p| live.contains(&p)) {
                Ok(None) if !stale => (cg.cpu_ns()?, cg.tracker_inside()),
                _ => return None,
            },
            None if stale => return None,
            None => {
                let m = self.memcg.as_mut().filter(|m| m.is_v2())?;
                (m.cpu_ns()?, m.tracker_inside())
            }
        };
        let own = if inside {
            (selfcost::cpu_secs() * 1e9) as u64
        } else {
            0
        };
        Some(i128::from(ns.saturating_sub(own)))
    }

    /// Reads every source and turns the readings into the interval's sample.
    fn sample(&mut self, ring: Option<&mut Ring>) -> anyhow::Result<Sample> {
        let t0 = Instant::now();
        let (mut tree, stamp) = self.read_tree(ring)?;
        let mut live = LivePids(None);
        let memcg = self.tree_memcg(&tree, &mut live);
        let cpu_cgroup = self.tree_cpu(&mut tree, &mut live);
        let pressure = self.tree_pressure();
        if memcg.is_none() && self.last && matches!(self.engine, Some(Engine::Ebpf(_))) {
            // Σ PSS is seen at samples only, the probe sees a member's peak at its
            // exit: a live member's peak between samples (the tracked
            // interpreter's own array, held for half an interval) is in its
            // high-water mark. The procfs engine reads a member's at each poll
            // that finds it faulted since, this last one too.
            let mut buf = String::new();
            for &p in live.get(&self.engine) {
                if let Some(kib) = procread::hwm_kib(p, &mut buf) {
                    tree.max_rss_kib = tree.max_rss_kib.max(kib);
                }
            }
        }
        if memcg.is_none() || self.pss_always {
            if let Some(e) = &self.engine {
                let live = live.get(&self.engine);
                tree.pss_bytes = self.pss.read(live, &|p| e.mem_sig(p));
                log::trace!("Σ PSS: {:?}", self.pss.counts);
                if let (Some(d), Some(_)) = (self.pss.denied(), tree.pss_bytes) {
                    self.sampler.degrade(
                        degraded::PSS_PARTIAL,
                        format!(
                            "{} live member(s)' smaps_rollup could not be read (pid {}: {}): Σ PSS is a lower bound, short of their share",
                            d.members,
                            d.pid,
                            warn::escaped(&d.why)
                        ),
                    );
                }
            }
        }
        let mut host = self.host.sample();
        // The GPUs' readings and the tree's GPU use; nothing (not even the tree's
        // pid list) without a GPU.
        if self.gpus.active() {
            let (g, p) = self.gpus.sample(live.get(&self.engine));
            host.gpu = g;
            host.process_gpu = self.engine.is_some().then_some(p);
        }
        let own = OwnCost {
            cpu_secs: selfcost::cpu_secs(),
            rss_mib: selfcost::rss_mib(),
        };
        let bpf = self.engine.as_ref().and_then(Engine::bpf_stats);
        log::debug!("sample: read {:?}", t0.elapsed());
        Ok(self.sampler.step(Reading {
            tree,
            host,
            stamp,
            bpf,
            own,
            memcg,
            cpu_cgroup,
            pressure,
        }))
    }

    fn drain(&mut self, ring: &mut Ring) {
        let events = &mut self.events;
        if let Some(e) = &mut self.engine {
            e.drain(ring, &mut |ev| events.show(ev));
        }
    }
}

/// An adopted cgroup's reading less this tracker's own memory where the tracker
/// is inside it (the Python package's binary is its interpreter's child): its
/// resident pages, from the charge now and from its peak.
fn less_tracker(mut r: MemcgReading, inside: bool) -> MemcgReading {
    if inside {
        let own = (selfcost::rss_mib() * 1048576.0) as u64;
        r.current = r.current.saturating_sub(own);
        r.peak = r.peak.map(|p| p.saturating_sub(own));
    }
    r
}

/// Whether members evidently ran outside the cgroup: one member's own RSS (its
/// `maxrss` at exit included) far above all the cgroup was ever charged. A member
/// that moved itself out and exited between two samples is seen only this way. The
/// margin leaves room for file pages a member maps that another cgroup was charged
/// for (shared libraries, files cached before the run).
fn ran_outside(max_rss_kib: u64, r: &MemcgReading) -> bool {
    let charged = r.peak.unwrap_or(r.current);
    max_rss_kib.saturating_mul(1024) > charged.saturating_mul(4) + (64 << 20)
}

/// Takes a sample and hands it to the sinks. A reading that fails is said once
/// and the interval is skipped: the command's life cycle goes on.
fn emit(lp: &mut Loop, ring: Option<&mut Ring>, sinks: &mut Sinks) {
    for (name, detail) in sinks.degraded() {
        lp.sampler.degrade(name, detail);
    }
    match lp.sample(ring) {
        Ok(s) => sinks.write(&s),
        Err(e) => {
            warn_once("sample", format_args!("taking a sample: {e:#}; skipped"));
        }
    }
}

/// A pidfd of `pid` registered with the runtime: readable once the process has
/// exited (a zombie or gone). None where the kernel has no pidfd_open (before
/// 5.3) or the process is gone already.
fn pidfd(pid: u32) -> Option<AsyncFd<OwnedFd>> {
    let fd = open_pidfd(pid as libc::pid_t).ok()?;
    // SAFETY: a descriptor just opened, which nothing else owns; the OwnedFd the
    // AsyncFd keeps holds it open, unchanged, until it is dropped.
    unsafe { AsyncFd::register_with_interest(fd, tokio::io::Interest::READABLE) }.ok()
}

/// A pidfd of `pid`: readable once the process has exited.
fn open_pidfd(pid: libc::pid_t) -> std::io::Result<OwnedFd> {
    use std::os::fd::FromRawFd as _;
    // SAFETY: pidfd_open takes a pid and flags and returns a new descriptor or -1.
    let fd = unsafe { libc::syscall(libc::SYS_pidfd_open, pid, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a descriptor the call above just opened, which nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(fd as libc::c_int) })
}

/// The eBPF engine's event ring, registered with the runtime: the kernel wakes the
/// loop when it fills. A ring that cannot be polled is given up: totals then come
/// from the kernel's counters and live readings, and the run names `ring_unread`.
fn ring_of(engine: &mut Option<Engine>) -> Option<AsyncFd<Ring>> {
    let Some(Engine::Ebpf(e)) = engine else {
        return None;
    };
    let r = e.ring()?;
    // SAFETY: the RingBuf owns its map fd and lives inside the AsyncFd.
    match unsafe { AsyncFd::register(r) } {
        Ok(fd) => Some(fd),
        Err(err) => {
            let cause = format!("polling the event ring failed ({err})");
            log::warn!("{cause}");
            e.ring_lost(&cause);
            None
        }
    }
}

/// The sample clock: a timerfd armed at absolute CLOCK_MONOTONIC deadlines and
/// polled by the runtime, so a sample costs one wake-up. Tokio's own timer woke the
/// loop three to four times per 1 s sleep (its 64 ms wheel level, then the 1 ms
/// level, and an eventfd wake-up for each newly registered timer), each a context
/// switch and an epoll_wait: ~8 % of a sample's CPU in the profile.
struct Ticker {
    fd: AsyncFd<OwnedFd>,
}

impl Ticker {
    fn new() -> std::io::Result<Ticker> {
        // SAFETY: timerfd_create has no memory preconditions; the fd is owned at once.
        let raw = unsafe {
            libc::timerfd_create(
                libc::CLOCK_MONOTONIC,
                libc::TFD_NONBLOCK | libc::TFD_CLOEXEC,
            )
        };
        if raw < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: `raw` is a new, open descriptor nothing else owns; the OwnedFd that
        // the AsyncFd keeps holds it open, unchanged, until the AsyncFd drops it.
        let fd = unsafe {
            AsyncFd::register_with_interest(
                OwnedFd::from_raw_fd(raw),
                tokio::io::Interest::READABLE,
            )
        }
        .map_err(|e| e.into_parts().1)?;
        Ok(Ticker { fd })
    }

    /// Fires at `at` and every `period` after it, on the kernel's grid: no drift, a
    /// late wake-up skips the slots it missed, and no system call per sample to arm
    /// it again. (An `Instant` is CLOCK_MONOTONIC on Linux; the offset from now is
    /// carried over to the clock's own reading, so no conversion of its internals.)
    fn arm(&self, at: Instant, period: Duration) -> std::io::Result<()> {
        let now = crate::sys::monotonic_ns();
        let left = at.saturating_duration_since(Instant::now());
        let deadline = now.saturating_add(u64::try_from(left.as_nanos()).unwrap_or(u64::MAX));
        let (sec, nsec) = (deadline / 1_000_000_000, deadline % 1_000_000_000);
        let spec = libc::itimerspec {
            it_interval: libc::timespec {
                tv_sec: period.as_secs() as libc::time_t,
                tv_nsec: period.subsec_nanos() as libc::c_long,
            },
            // A zero value would disarm it: a deadline now is one nanosecond later.
            it_value: libc::timespec {
                tv_sec: sec as libc::time_t,
                tv_nsec: nsec.max(1) as libc::c_long,
            },
        };
        // SAFETY: valid fd and itimerspec; no old value wanted.
        let r = unsafe {
            libc::timerfd_settime(
                self.fd.as_raw_fd(),
                libc::TFD_TIMER_ABSTIME,
                &spec,
                std::ptr::null_mut(),
            )
        };
        if r < 0 {
            return Err(std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// Waits until the armed deadline has passed.
    async fn wait(&self) -> std::io::Result<()> {
        loop {
            let mut g = self.fd.readable().await?;
            let mut n = [0u8; 8];
            // SAFETY: reads 8 bytes into a local buffer of 8.
            let r = unsafe { libc::read(self.fd.as_raw_fd(), n.as_mut_ptr().cast(), 8) };
            if r == 8 {
                // Edge-triggered: the next expiry is a new edge, so the next wait
                // need not try a read that would say EAGAIN.
                g.clear_ready();
                return Ok(());
            }
            let e = std::io::Error::last_os_error();
            if e.kind() != std::io::ErrorKind::WouldBlock {
                return Err(e);
            }
            g.clear_ready();
        }
    }
}

/// Sleeps until `next`: on the ticker, or on tokio's timer when there is none.
async fn tick(ticker: &Option<Ticker>, next: tokio::time::Instant) {
    if let Some(t) = ticker {
        if t.wait().await.is_ok() {
            return;
        }
    }
    tokio::time::sleep_until(next).await;
}

/// How often the tail checks whether the tree is empty: one map read (eBPF) or a
/// walk of the members (procfs).
const TAIL_POLL: Duration = Duration::from_millis(5);

/// At the end of a procfs run, how long the tracker waits at most for the reaps of
/// its zombie children (their exact figures).
const REAP_WAIT: Duration = Duration::from_secs(2);

/// Whether any process of the tree is still running.
/// The tree's live pids, listed at most once a sample, when first asked for.
struct LivePids(Option<HashSet<u32>>);

impl LivePids {
    fn get(&mut self, engine: &Option<Engine>) -> &HashSet<u32> {
        self.0
            .get_or_insert_with(|| engine.as_ref().map(Engine::live_pids).unwrap_or_default())
    }
}

fn tree_alive(engine: &mut Option<Engine>) -> bool {
    engine.as_mut().is_some_and(Engine::tree_alive)
}

/// Runs the loop until the command exits, or until a signal when attached or
/// host-only; the final sample is written before returning.
pub fn run(
    t: Tracked,
    st: &Settings,
    started: Instant,
    sinks: &mut Sinks,
) -> anyhow::Result<Ended> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the tokio runtime")?;
    rt.block_on(run_loop(t, st, started, sinks))
}

/// The loop's state, made from what the session tracks; the loop reads it again
/// when it starts each sample.
fn start_loop(t: Tracked, st: &Settings, started: Instant) -> (Loop, Ends) {
    let backend = t.engine.as_ref().map(Engine::backend);
    let lp = Loop {
        sampler: Sampler::new(
            t.root.zip(backend),
            st.meta.job_name.clone(),
            started,
            selfcost::cpu_secs(),
        )
        .aggregate_steal(st.aggregate_cpu_steal)
        .degraded(t.degraded),
        engine: t.engine,
        events: t.events,
        host: t.host,
        gpus: t.gpus,
        opts: ReadOpts {
            memcg_id: t.memcg.as_ref().and_then(TreeCgroup::id),
            whole: false,
        },
        memcg: t.memcg,
        memcg_stale: false,
        left_cgroup: None,
        limited: st.limits.any(),
        cpucg: t.cpucg,
        cpu_floor: 0,
        cpu_offset: None,
        adopted_used: false,
        // Beside a cgroup, Σ PSS only when asked for; without one it is the source.
        pss: PssSum::default(),
        pss_always: st.engine.pss,
        last: false,
        told: t.told,
    };
    let ends = Ends {
        root: t.root,
        command_root: t.command_root,
        ready: t.ready,
    };
    (lp, ends)
}

/// What the loop keeps of `Tracked` beside its state.
struct Ends {
    root: Option<u32>,
    command_root: Option<u32>,
    ready: Option<Ready>,
}

/// How the loop stands between events: the command's wait status once it exited,
/// and how long the tail may still last.
#[derive(Default)]
struct Progress {
    status: Option<i32>,
    /// Set once the command has exited with members of its tree still running.
    tail_until: Option<tokio::time::Instant>,
}

impl Loop {
    /// A tree the tracker started begins at zero (its first instructions belong to
    /// the first interval); an attached one at what it had used already.
    fn baseline(&mut self, attached: bool, ring: Option<&mut Ring>) -> anyhow::Result<()> {
        self.hear_root();
        let base = match (&mut self.engine, attached) {
            (Some(e), true) => {
                let events = &mut self.events;
                Some(e.read(self.opts, ring, &mut |ev| events.show(ev))?)
            }
            _ => None,
        };
        // An adopted cgroup's figures count from the same moment as the
        // backend's: its CPU before it is the offset, and whether this tracker
        // is inside is known before the first sample.
        if let (Some(b), true) = (&base, self.cpucg.as_ref().is_some_and(|c| c.adopted)) {
            let mut live = LivePids(None);
            if let Some(m) = self.memcg.as_mut().filter(|m| m.is_adopted()) {
                let live = live.get(&self.engine);
                let _ = m.strangers(&|p| live.contains(&p));
            }
            self.cpu_offset = self
                .adopted_counted(&mut live)
                .map(|counted| i128::from(b.fig.cpu_ns) - counted);
        }
        let bpf = self.engine.as_ref().and_then(Engine::bpf_stats);
        self.sampler.baseline(base, bpf);
        Ok(())
    }

    /// The run's last sample, with what the attached root told before it asked
    /// the tracker to stop.
    fn last_sample(&mut self, ring: Option<&mut Ring>, sinks: &mut Sinks) {
        self.last = true;
        self.hear_root();
        emit(self, ring, sinks);
    }

    /// What the attached root told of its reaped children's CPU and largest RSS
    /// since it was last heard, for the procfs engine's next reading (eBPF sees
    /// every exit itself).
    /// The root tells it before the tracker's first reading and before it asks
    /// it to stop, so it is heard then only.
    fn hear_root(&mut self) {
        if let (Some(t), Some(Engine::Procfs(p))) = (&mut self.told, &mut self.engine) {
            if let Some(c) = t.take() {
                p.tell_root_children(c.cpu_ns, c.maxrss_kib);
            }
        }
    }

    /// A child of the tracker was reaped: its figures (procfs), and whether the run
    /// is over (the command is done and nothing of its tree is left, or it left no
    /// tail to wait for).
    fn reaped(&mut self, r: &Reaped, ends: &Ends, st: &Settings, pr: &mut Progress) -> bool {
        if let Some(Engine::Procfs(p)) = &mut self.engine {
            p.note_reaped(r.pid, r.fig, r.io_read, r.maxrss_kib);
        }
        if Some(r.pid) == ends.command_root {
            pr.status = Some(r.status);
            // The command is done; members it left running still belong to the
            // run, up to the tail's bound.
            if st.tail_timeout.is_zero() || !tree_alive(&mut self.engine) {
                return true;
            }
            pr.tail_until = Some(tokio::time::Instant::now() + st.tail_timeout);
            false
        } else {
            pr.tail_until.is_some() && !tree_alive(&mut self.engine)
        }
    }

    /// The attached root exited (procfs): its zombie's figures are read before its
    /// parent, outside the tree, reaps it.
    fn root_exited(&mut self) {
        if let Some(Engine::Procfs(p)) = &mut self.engine {
            p.root_exited();
        }
        log::debug!("the attached root exited: its zombie's figures read");
    }

    /// Whether the tail is over: its bound passed, or nothing of the tree is left.
    fn tail_over(&mut self, pr: &Progress) -> bool {
        pr.tail_until
            .is_some_and(|u| tokio::time::Instant::now() >= u)
            || !tree_alive(&mut self.engine)
    }

    /// The event ring became readable (or waiting on it failed, which ends the
    /// ring's use for the run: the engine names it).
    fn ring_ready(
        &mut self,
        guard: std::io::Result<tokio::io::unix::AsyncFdReadyMutGuard<'_, Ring>>,
    ) -> bool {
        match guard {
            Ok(mut g) => {
                self.drain(g.get_inner_mut());
                g.clear_ready();
                true
            }
            Err(e) => {
                let cause = format!("waiting on the event ring failed ({e})");
                log::warn!("{cause}");
                if let Some(Engine::Ebpf(en)) = &mut self.engine {
                    en.ring_lost(&cause);
                }
                false
            }
        }
    }

    /// Orphans the tracker reaps (procfs): their exact figures, each as its reap
    /// comes. The reaper thread reaps a zombie as soon as it runs, which on a busy
    /// host may be tens of milliseconds later: the wait lasts while a child of ours
    /// is a zombie (bounded), and otherwise ends after a short quiet gap.
    async fn last_reaps(&mut self, reap_rx: &mut mpsc::UnboundedReceiver<Reaped>) {
        let Some(Engine::Procfs(p)) = &mut self.engine else {
            return;
        };
        let until = Instant::now() + REAP_WAIT;
        loop {
            match tokio::time::timeout(Duration::from_millis(20), reap_rx.recv()).await {
                Ok(Some(r)) => p.note_reaped(r.pid, r.fig, r.io_read, r.maxrss_kib),
                // The reaper is gone: it had no child left to wait for.
                Ok(None) => break,
                Err(_) if p.zombie_children() && Instant::now() < until => {}
                Err(_) => break,
            }
        }
    }
}

/// The sample timer: a timerfd on the deadline grid from `started`, or None, where
/// tokio's timer stands in.
fn ticker(next: tokio::time::Instant, period: Duration) -> Option<Ticker> {
    match Ticker::new().and_then(|t| t.arm(next.into_std(), period).map(|()| t)) {
        Ok(t) => Some(t),
        Err(e) => {
            log::debug!("no timerfd ({e}): samples are timed by tokio");
            None
        }
    }
}

/// The signals the tracker gets, and with a command of its own, its reaps (with
/// each zombie's I/O on procfs).
fn listeners(
    command: bool,
    procfs: bool,
) -> (
    mpsc::UnboundedReceiver<(i32, bool)>,
    mpsc::UnboundedReceiver<Reaped>,
) {
    let (sig_tx, sig_rx) = mpsc::unbounded_channel();
    signals::spawn_signal_thread(sig_tx);
    let (reap_tx, reap_rx) = mpsc::unbounded_channel();
    if command {
        signals::spawn_reaper(reap_tx, procfs);
    }
    (sig_rx, reap_rx)
}

/// Attached on procfs: the root's exit wakes the tracker (its pidfd), which reads
/// the zombie's final figures before the root's parent, outside the tree, reaps it
/// and takes them along (a tree that ends within an interval of its root counted
/// nothing of its last stretch).
fn root_exit(lp: &Loop, ends: &Ends) -> Option<AsyncFd<OwnedFd>> {
    match (&lp.engine, ends.command_root, ends.root) {
        (Some(Engine::Procfs(_)), None, Some(pid)) => pidfd(pid),
        _ => None,
    }
}

/// The process an attached or host-only tracker stops with
/// (TRACKER_STOP_WITH_PARENT, set by the Python package): a killed interpreter
/// must not leave a tracker running for ever.
enum Parent {
    /// Its pidfd, readable once it has exited.
    Fd(OwnedFd),
    /// Where pidfds cannot be had (before 5.3): its pid, while it is the
    /// tracker's parent.
    Ppid(libc::pid_t),
    /// Gone before the tracker first looked.
    Gone,
}

/// The parent to watch, if any: the one TRACKER_PARENT_PID names (the Python
/// package's interpreter, which a wrapper may stand between), else the
/// tracker's parent now. Checked at each sample: a poll of its pidfd.
fn stop_with(ends: &Ends, st: &Settings) -> Option<Parent> {
    if ends.command_root.is_some() || !st.stop_with_parent {
        return None;
    }
    let pid = match st.parent_pid {
        Some(p) => p as libc::pid_t,
        // SAFETY: getppid has no preconditions.
        None => unsafe { libc::getppid() },
    };
    Some(match open_pidfd(pid) {
        Ok(fd) => Parent::Fd(fd),
        Err(e) if e.raw_os_error() == Some(libc::ESRCH) => Parent::Gone,
        Err(_) => Parent::Ppid(pid),
    })
}

/// Whether the process that started the tracker (`parent`, when it must stop
/// with it) is gone.
fn orphaned(parent: Option<&Parent>) -> bool {
    use std::os::fd::AsRawFd as _;
    let gone = match parent {
        None => false,
        Some(Parent::Gone) => true,
        // SAFETY: getppid has no preconditions.
        Some(Parent::Ppid(p)) => *p != unsafe { libc::getppid() },
        Some(Parent::Fd(fd)) => {
            let mut p = libc::pollfd {
                fd: fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd; a zero timeout never waits.
            let ready = unsafe { libc::poll(&mut p, 1, 0) };
            ready > 0
        }
    };
    if gone {
        log::info!("the process that started the tracker is gone: stopping");
    }
    gone
}

/// What a signal means once the command may have exited: true ends the loop.
fn signalled(sig: i32, from_tty: bool, command_root: Option<u32>, exited: bool) -> bool {
    match end::on_signal(command_root, from_tty) {
        // The command is gone: a signal during the tail ends the wait.
        OnSignal::Forward(_) if exited => {
            log::info!("signal {sig}: not waiting for the rest of the tree");
            true
        }
        OnSignal::Forward(root) => {
            end::forward(root, sig);
            false
        }
        OnSignal::Ignore => false,
        OnSignal::Stop => {
            log::info!("signal {sig}: stopping");
            true
        }
    }
}

async fn run_loop(
    t: Tracked,
    st: &Settings,
    started: Instant,
    sinks: &mut Sinks,
) -> anyhow::Result<Ended> {
    let procfs = matches!(t.engine, Some(Engine::Procfs(_)));
    let (mut sig_rx, mut reap_rx) = listeners(t.command_root.is_some(), procfs);
    let (mut lp, mut ends) = start_loop(t, st, started);
    let mut ring = ring_of(&mut lp.engine);
    lp.baseline(
        ends.command_root.is_none(),
        ring.as_mut().map(|r| r.get_mut()),
    )?;
    if let Some(r) = ends.ready.take() {
        r.signal();
    }
    let period = Duration::from_secs_f64(st.interval);
    let mut next = tokio::time::Instant::from_std(started) + period;
    let ticker = ticker(next, period);
    let mut root_exit = root_exit(&lp, &ends);
    // The kernel wakes us only when the ring is a quarter full; otherwise it is
    // drained at each sample. (A 100 ms drain timer cost ~1 ms of CPU a second.)
    let mut pr = Progress::default();
    let parent = stop_with(&ends, st);
    loop {
        tokio::select! {
            _ = tick(&ticker, next) => {
                // Deadline grid: no drift, and a late wake-up skips missed slots.
                let now = tokio::time::Instant::now();
                while next <= now {
                    next += period;
                }
                if orphaned(parent.as_ref()) {
                    break; // the final sample is written below
                }
                emit(&mut lp, ring.as_mut().map(|r| r.get_mut()), sinks);
            }
            _ = async {
                match &root_exit {
                    Some(fd) => fd.readable().await.map(|mut g| g.retain_ready()),
                    None => std::future::pending().await,
                }
            } => {
                lp.root_exited();
                root_exit = None;
            }
            Some(r) = reap_rx.recv() => {
                if lp.reaped(&r, &ends, st, &mut pr) {
                    break;
                }
            }
            // The last member may end without a reap of ours (a member reaps it, or
            // init): a short poll, only while the tail lasts.
            _ = async {
                match pr.tail_until {
                    Some(_) => tokio::time::sleep(TAIL_POLL).await,
                    None => std::future::pending().await,
                }
            } => {
                if lp.tail_over(&pr) {
                    break;
                }
            }
            Some((sig, from_tty)) = sig_rx.recv() => {
                if signalled(sig, from_tty, ends.command_root, pr.status.is_some()) {
                    break;
                }
            }
            guard = async {
                match ring.as_mut() {
                    Some(r) => r.readable_mut().await,
                    None => std::future::pending().await,
                }
            } => {
                if !lp.ring_ready(guard) {
                    ring = None;
                }
            }
        }
    }
    if let Some(e) = &mut lp.engine {
        e.settle();
    }
    lp.last_reaps(&mut reap_rx).await;
    lp.last_sample(ring.as_mut().map(|r| r.get_mut()), sinks);
    if let Some(e) = &mut lp.engine {
        let events = &mut lp.events;
        e.flush_events(&mut |ev| events.show(ev));
    }
    Ok(Ended {
        top: lp.events.finish(),
        sampler: lp.sampler,
        status: pr.status,
        engine: lp.engine,
        memcg: lp.memcg,
        cpucg: lp.cpucg,
        left_cgroup: lp.left_cgroup,
    })
}
