//! The eBPF engine: loads the programs with this kernel's offsets, registers trees and
//! reads their totals.
//!
//! Every thread of the tree retires in the kernel once dead and off the CPU (the
//! probe program, run here at each sample, or its RCU free), with an EXIT record
//! that carries its final CPU and I/O. Live threads are read by the same probe, which
//! sends a READING record per member with the fields /proc would show (CPU, I/O,
//! and for a leader its state and RSS): one syscall per 24 members instead of ~3
//! /proc reads each. User space knows the members from the ring's FORK records, so
//! it never walks the task map (a scan of all its buckets, 65,536 by default, took
//! ~13 % of a sample). A per-thread ledger joins readings and exits: a thread counts
//! with its last live reading until its record arrives, then with its final
//! figures, so totals never go back and nothing is counted twice, whatever the order
//! of exits, reaping and reads. Members the kernel cannot read (attached with
//! `--pid`, or a root before its exec) are read from /proc as before.

use std::{
    collections::{HashMap as StdHashMap, HashSet},
    os::fd::OwnedFd,
    time::{Duration, Instant},
};

use aya::{
    maps::{HashMap, MapData, PerCpuArray, RingBuf},
    programs::{RawTracePoint, RawTracePointRunOptions, TestRun},
    Ebpf,
};
use tracker_common::{
    Event, Figures, LiveReading, TaskInfo, TreeStats, EVENT_EXEC, EVENT_EXIT,
    EVENT_FLAG_SHARED_TID, EVENT_FORK, GRAVEYARD_KEY, PROBE_ARG_FULL, PROBE_BATCH,
    READING_FLAG_EXITED, READING_FLAG_MEMCG_ID, READING_FLAG_MEMCG_KNOWN, READING_FLAG_ZOMBIE,
    TASK_FLAG_EXITED, TASK_FLAG_ROOT,
};

mod ledger;
mod load;
pub(crate) use load::in_host_pid_ns;
pub mod node;
mod offsets_cache;
mod records;
mod roster;

use super::{
    ids::IdMap,
    procread::{self, Kind, MemSig},
    ReadOpts,
};
use crate::model::{
    degraded::{self, Degradations},
    reading::TreeTotals,
    ProcEvent,
};
use ledger::Ledger;
use load::{EbpfUnavailable, PROBE};
pub use load::{Knobs, LoadArgs};
use records::{decode, proc_event, Record};
use roster::Roster;

/// The task map's members of one tree.
#[derive(Debug, Default)]
struct Listing {
    /// tgid → tids not retired.
    live: StdHashMap<u32, Vec<u32>>,
    /// Keys of members that have exited and wait to retire.
    exited: Vec<u32>,
}

/// One process's share of a pass's readings.
#[derive(Clone, Copy, Debug, Default)]
struct ProcGauge {
    /// The leader's reading: (zombie, resident pages).
    leader: Option<(bool, u64)>,
    /// Threads read that have not exited.
    threads: u64,
    /// The leader was read charged to the memory cgroup `ReadOpts::memcg_id`.
    in_memcg: bool,
    /// Σ page faults of the threads read.
    faults: u64,
}

/// Readings between two looks at the kernel's skipped runs where tracepoints are
/// not preemptible.
const MISSES_EVERY: u32 = 8;

/// Every this many passes the probe reads every member whole, idle or not: an
/// idle member's RSS falls when the kernel reclaims its pages, and its memory
/// cgroup changes when it is moved, neither of which it need run for (the procfs
/// engine's `RESTAT_EVERY`).
const FULL_EVERY: u32 = 10;

/// The low 32 bits of a thread's start time in ticks as the kernel keeps it
/// (`task->start_boottime`), which the programs check before they take a registered
/// entry as that thread's; 0 (not checked) when it cannot be read. /proc's
/// `starttime` adds the reader's time namespace's boottime offset, taken off here.
fn start_ticks(tgid: u32, tid: u32, buf: &mut String) -> u32 {
    let Some(st) = procread::read_into(&format!("/proc/{tgid}/task/{tid}/stat"), buf)
        .and_then(|_| procread::parse_stat(buf))
    else {
        return 0;
    };
    let offset = procread::read_into("/proc/self/timens_offsets", buf)
        .and_then(|_| boottime_offset_ticks(buf))
        .unwrap_or(0);
    st.starttime.wrapping_sub(offset) as u32
}

/// The `boottime` line of /proc/PID/timens_offsets ("boottime SECS NSECS"), in ticks.
fn boottime_offset_ticks(text: &str) -> Option<u64> {
    let line = text.lines().find(|l| l.starts_with("boottime"))?;
    let mut it = line.split_whitespace().skip(1);
    let secs: i64 = it.next()?.parse().ok()?;
    let nsecs: i64 = it.next()?.parse().ok()?;
    let tck = i64::try_from(crate::sys::clk_tck()).ok()?;
    let ticks = secs.checked_mul(tck)? + nsecs / (1_000_000_000 / tck.max(1));
    Some(ticks as u64)
}

pub struct EbpfEngine {
    bpf: Ebpf,
    tasks: HashMap<MapData, u32, TaskInfo>,
    stats: PerCpuArray<MapData, TreeStats>,
    ring: Option<RingBuf<MapData>>,
    tree: u32,
    root: u32,
    /// 1 when the tracker started the root itself (it counts as spawned).
    root_spawned: u64,
    ledger: Ledger,
    /// Largest totals handed out, so that a reading after lost records never goes back.
    reported: Figures,
    tck_ns: u64,
    page: u64,
    buf: String,
    files: procread::FileCache,
    /// Largest RSS seen of live members (KiB), since they may exit between readings.
    live_max_rss_kib: u64,
    /// The tree's memory cgroup's `cgroup_subsys_state`, once a reading found a
    /// leader charged to the cgroup `ReadOpts::memcg_id` names (0 before): named in
    /// each probe run, so that a leader charged to it costs two kernel reads.
    memcg_css: u64,
    /// The programs' second copies are attached: tracepoints run preemptible, and
    /// the kernel may skip a run (`note_missed_runs`).
    preemptible: bool,
    /// Readings since the kernel's skipped runs were last read.
    misses_read_ago: u32,
    /// Members by key, from the registration and the ring's FORK and EXEC records.
    roster: Roster,
    /// Process events complete since the last reading (their last thread retired
    /// after the event's record), shown at the next.
    ready: Vec<(Event, u64)>,
    /// Bumped at each reading pass.
    pass: u32,
    /// The next pass reads every member whole (`PROBE_ARG_FULL`), idle or not.
    full_next: bool,
    /// This pass's READING records.
    readings: Vec<LiveReading>,
    /// Scratch: the roster's keys for this pass.
    keys: Vec<u32>,
    /// The keys of the probe run being drained (an IDLE record names them by
    /// their place in it).
    batch: Vec<u32>,
    /// Scratch: this pass's readings by process (kept, not rebuilt: growing it
    /// afresh rehashed it several times a sample).
    procs: IdMap<ProcGauge>,
    /// Lost records already answered by re-listing the members from the task map.
    lost_seen: u64,
    /// Processes live at the last reading (for the GPU collector).
    live_pids: HashSet<u32>,
    /// The /proc/PID/stat of the live processes the last reading read from /proc.
    proc_stats: IdMap<procread::Stat>,
    /// The memory signatures of the live processes the probe read whole (every
    /// thread in the kernel).
    kernel_sigs: IdMap<MemSig>,
    /// The running kernel's `min_flt`/`maj_flt` are known: the probe reads faults.
    faults_in_kernel: bool,
    /// The running kernel's `mm->rss_stat` layout is known: the probe reads RSS.
    rss_in_kernel: bool,
    _stats_fd: Option<OwnedFd>,
    /// BPF run-time statistics are being collected (ours or the sysctl).
    stats_enabled: bool,
    /// What is no longer exact: this kernel's layout, and what happened since.
    degraded: Degradations,
    /// The task map's and the ring's sizes, for the degradations' detail.
    max_tasks: u32,
    ring_kib: u32,
    pub load_ms: f64,
}

impl EbpfEngine {
    /// Loads and attaches everything (load.rs).
    pub fn load(args: LoadArgs) -> Result<Self, EbpfUnavailable> {
        let ring_bytes = args.ring_bytes;
        let l = load::load(args)?;
        Ok(EbpfEngine {
            stats_enabled: l.stats_enabled,
            degraded: l.degraded,
            max_tasks: l.max_tasks,
            ring_kib: ring_bytes / 1024,
            bpf: l.bpf,
            tasks: l.tasks,
            stats: l.stats,
            ring: Some(l.ring),
            tree: 1,
            root: 0,
            root_spawned: 0,
            ledger: Ledger::default(),
            reported: Figures::default(),
            tck_ns: 1_000_000_000 / crate::sys::clk_tck(),
            page: crate::sys::page_size(),
            buf: String::new(),
            files: procread::FileCache::default(),
            live_max_rss_kib: 0,
            memcg_css: 0,
            preemptible: l.preemptible,
            misses_read_ago: 0,
            roster: Default::default(),
            ready: Vec::new(),
            pass: 0,
            full_next: false,
            readings: Vec::new(),
            keys: Vec::new(),
            batch: Vec::new(),
            procs: Default::default(),
            lost_seen: 0,
            live_pids: Default::default(),
            proc_stats: Default::default(),
            kernel_sigs: Default::default(),
            faults_in_kernel: l.faults_in_kernel,
            rss_in_kernel: l.rss_in_kernel,
            _stats_fd: l.stats_fd,
            load_ms: l.load_ms,
        })
    }

    /// Registers `pid` as the root of the tree. For a process that is paused before
    /// exec (the `run` case) this is all there is; for a running tree (`--pid`) the
    /// existing descendants and threads are added from /proc.
    pub fn register_root(&mut self, pid: u32, existing: bool) -> anyhow::Result<()> {
        self.root = pid;
        self.root_spawned = u64::from(!existing);
        let info = TaskInfo {
            tgid: pid,
            tree: self.tree,
            flags: TASK_FLAG_ROOT,
            start_ticks: start_ticks(pid, pid, &mut self.buf),
            ..TaskInfo::default()
        };
        self.tasks.insert(pid, info, 0)?;
        self.enrol(pid, pid);
        if existing {
            // Programs are attached already: a fork after this point is seen by the
            // kernel; one before it is found here.
            // The tracker itself is left out when it descends from the root (a Python
            // process tracking itself starts it as its child); its later threads are
            // then forked by a non-member and stay out too.
            let me = std::process::id();
            for (tgid, tids) in super::procfs::descendants_with_threads(pid) {
                if tgid == me {
                    continue;
                }
                for tid in tids {
                    let info = TaskInfo {
                        tgid,
                        tree: self.tree,
                        flags: if tgid == pid { TASK_FLAG_ROOT } else { 0 },
                        start_ticks: start_ticks(tgid, tid, &mut self.buf),
                        ..TaskInfo::default()
                    };
                    // NOEXIST (1): the kernel may have inserted it already.
                    let _ = self.tasks.insert(tid, info, 1);
                    self.enrol(tid, tgid);
                }
            }
            // Without it, every member no program meets is read from /proc at every
            // sample: exact, three reads a thread dearer.
            let t0 = Instant::now();
            match load::walk_tasks(&mut self.bpf) {
                // The count walks the whole task map: for the debug log only.
                Ok(()) if log::log_enabled!(log::Level::Debug) => {
                    let took = t0.elapsed();
                    let (found, all) = self.registered_found();
                    log::debug!(
                        "attach: the task walk found {found} of {all} registered threads in {took:?}"
                    );
                }
                Ok(()) => {}
                Err(e) => log::info!("attach: members stay on /proc ({e})"),
            }
        }
        Ok(())
    }

    /// (members with their task address, members) of the tree in the task map.
    fn registered_found(&self) -> (usize, usize) {
        self.tasks
            .iter()
            .flatten()
            .filter(|(key, info)| info.tree == self.tree && key & GRAVEYARD_KEY == 0)
            .fold((0, 0), |(found, all), (_, info)| {
                (found + usize::from(info.task != 0), all + 1)
            })
    }

    pub fn ring(&mut self) -> Option<RingBuf<MapData>> {
        self.ring.take()
    }

    fn kernel_stats(&self) -> anyhow::Result<TreeStats> {
        let per_cpu = self.stats.get(&self.tree, 0)?;
        let mut t = TreeStats::default();
        for s in per_cpu.iter() {
            t.fig.add(&s.fig);
            t.procs_spawned += s.procs_spawned;
            t.procs_exited += s.procs_exited;
            t.threads_spawned += s.threads_spawned;
            t.threads_exited += s.threads_exited;
            t.execs += s.execs;
            t.max_rss_pages = t.max_rss_pages.max(s.max_rss_pages);
            t.lost_events += s.lost_events;
            t.untracked_tasks += s.untracked_tasks;
            t.lost_exits += s.lost_exits;
            t.adopted += s.adopted;
            t.exits_unseen += s.exits_unseen;
            t.execs_unseen += s.execs_unseen;
            t.children_unchecked += s.children_unchecked;
        }
        Ok(t)
    }

    /// Members not retired yet, from the kernel's task map. A walk of every bucket:
    /// only for the end of a run and after lost records, never per sample.
    fn listing(&self) -> Listing {
        let mut l = Listing::default();
        for item in self.tasks.iter() {
            match item {
                Ok((key, info)) if info.tree == self.tree => {
                    if info.flags & TASK_FLAG_EXITED != 0 {
                        l.exited.push(key);
                    }
                    if key & GRAVEYARD_KEY == 0 {
                        l.live.entry(info.tgid).or_default().push(key);
                    }
                }
                Ok(_) => {}
                // A key deleted while iterating: the next reading will be consistent.
                Err(_) => continue,
            }
        }
        l
    }

    fn enrol(&mut self, key: u32, tgid: u32) {
        self.roster.enrol(key, tgid);
    }

    /// A member that left the task map without a record of ours (lost on a full
    /// ring): its process's event may have waited only for it.
    fn forget(&mut self, key: u32) {
        if let Some(m) = self.roster.remove(key) {
            let none = Event {
                pid: m.tgid,
                ..Event::default()
            };
            if let Some(done) = self.roster.retired(&none, None) {
                self.ready.push(done);
            }
        }
    }

    /// Records were lost (FORKs among them, perhaps): the members are listed again
    /// from the task map.
    fn relist(&mut self) {
        self.full_next = true;
        let l = self.listing();
        for (tgid, tids) in l.live {
            for tid in tids {
                self.enrol(tid, tgid);
            }
        }
        for key in l.exited {
            if key & GRAVEYARD_KEY != 0 {
                self.enrol(key, key & !GRAVEYARD_KEY);
            }
        }
    }

    /// Whether a process of the tree has not exited: from the kernel's counts (the
    /// root is registered, not spawned in the tree). A failed read says no, so the
    /// run ends rather than waits.
    pub fn tree_alive(&self) -> bool {
        self.kernel_stats()
            .is_ok_and(|k| k.procs_spawned + self.root_spawned > k.procs_exited)
    }

    /// Processes live at the last reading.
    pub fn live_pids(&self) -> HashSet<u32> {
        self.live_pids.clone()
    }

    /// What the last reading says of a live process's memory (engine/pss.rs): from
    /// the kernel where the probe read all its threads, else from its /proc stat.
    pub fn mem_sig(&self, pid: u32) -> Option<MemSig> {
        self.kernel_sigs
            .get(&pid)
            .copied()
            .or_else(|| self.proc_stats.get(&pid).map(MemSig::of))
    }

    /// Runs the probe over `keys` (at most `PROBE_BATCH`): retires those dead and off
    /// the CPU, sends READING records for the others, and one IDLE record with
    /// those that have not run since their last (unless `full`).
    fn probe(&mut self, keys: &[u32], full: bool) -> anyhow::Result<()> {
        let prog: &mut RawTracePoint = self
            .bpf
            .program_mut(PROBE)
            .ok_or_else(|| anyhow::anyhow!("program {PROBE} missing"))?
            .try_into()?;
        let mut opts = RawTracePointRunOptions::new();
        for (i, &k) in keys.iter().take(PROBE_BATCH).enumerate() {
            opts.args[i / 2] |= u64::from(k) << (32 * (i % 2));
        }
        opts.args[PROBE_BATCH / 2] = self.memcg_css;
        opts.args[PROBE_ARG_FULL] = u64::from(full);
        prog.test_run(opts)?;
        Ok(())
    }

    /// The probe cannot run: members are read from /proc, and threads retire at
    /// their RCU free, which a lazy RCU delays by seconds; said once, and named in
    /// every sample from now on.
    fn probe_failed(&mut self, e: &anyhow::Error) {
        let detail = format!(
            "running the probe program failed ({e:#}): members are read from /proc and exits \
             are counted when the kernel frees them, seconds later with a lazy RCU, so the \
             final sample may miss the last exits"
        );
        crate::warn::warn_once("ebpf.probe", format_args!("{detail}"));
        self.degraded.set(degraded::PROBE_FAILED, detail);
    }

    /// The event ring cannot be read any more (`cause`): named from now on, and
    /// the totals come from the kernel's counters (see `read`).
    pub fn ring_lost(&mut self, cause: &str) {
        self.degraded.set(
            degraded::RING_UNREAD,
            format!(
                "{cause}: members are read from /proc and exits counted when the kernel \
                 frees them, seconds later with a lazy RCU, so a sample may miss the last \
                 exits, and --events gets no more events"
            ),
        );
    }

    /// At the end of a run: retires every member that has exited, which is possible
    /// microseconds after its exit (its final context switch), never waiting for a
    /// reaper or RCU. Bounded, so a member stuck in its exit cannot hold the run.
    pub fn settle(&mut self, limit: Duration) -> Duration {
        self.misses_read_ago = MISSES_EVERY;
        let t0 = Instant::now();
        loop {
            let exited = self.listing().exited;
            if exited.is_empty() {
                break;
            }
            if t0.elapsed() >= limit {
                // Counted with their last reading: short of their last microseconds.
                self.degraded.set(
                    degraded::SETTLE_TIMEOUT,
                    format!(
                        "{} member(s) that had exited were still on a CPU {} ms after the end: \
                         the final sample counts them with their last reading",
                        exited.len(),
                        limit.as_millis()
                    ),
                );
                break;
            }
            for batch in exited.chunks(PROBE_BATCH) {
                if let Err(e) = self.probe(batch, true) {
                    self.probe_failed(&e);
                    return t0.elapsed();
                }
            }
            // Those left are still on a CPU; the next listing tells.
            if self.listing().exited.is_empty() {
                break;
            }
            std::thread::sleep(Duration::from_micros(200));
        }
        t0.elapsed()
    }

    /// At the end of a run: process events still waiting for a thread whose record
    /// was lost, with the CPU known.
    pub fn flush_events(&mut self, shown: &mut dyn FnMut(ProcEvent)) {
        let left = self.roster.take_pending();
        for (ev, cpu) in self.ready.drain(..).chain(left) {
            if let Some(pe) = proc_event(&ev, Some(cpu)) {
                shown(pe);
            }
        }
    }

    /// Takes every record the ring holds into the ledger; `shown` gets the events to
    /// show (forks, execs and process exits).
    pub fn drain(&mut self, ring: &mut RingBuf<MapData>, shown: &mut dyn FnMut(ProcEvent)) {
        while let Some(item) = ring.next() {
            let rec = decode(&item);
            drop(item);
            match rec {
                Some(Record::Event(ev)) => {
                    if let Some(ev) = self.absorb(&ev) {
                        shown(ev);
                    }
                }
                Some(Record::Reading(r)) => self.take_reading(r),
                // The run just made (`read_kernel` drains after each).
                Some(Record::Idle(b)) if self.batch.first() == Some(&b.first) => {
                    for i in 0..self.batch.len().min(32) {
                        if b.mask & (1 << i) != 0 {
                            self.take_idle(self.batch[i]);
                        }
                    }
                }
                Some(Record::Idle(_)) => {}
                None => {}
            }
        }
    }

    /// Takes one ring record into the ledger and the roster; returns the event to
    /// show, if any (process forks, execs and process exits; a thread's own birth and
    /// retirement are internal).
    fn absorb(&mut self, ev: &Event) -> Option<ProcEvent> {
        let cpu = match ev.kind {
            EVENT_FORK => {
                self.enrol(ev.tid, ev.pid);
                None
            }
            EVENT_EXIT => {
                let key = if ev.flags & EVENT_FLAG_SHARED_TID == 0 {
                    ev.tid
                } else {
                    GRAVEYARD_KEY | ev.pid
                };
                self.roster.remove(key);
                let late = self.roster.is_pending(ev.pid);
                let last = self.ledger.retire(ev, late);
                // The process's event carries the CPU of all its threads: it waits
                // for those that retire after its last one exited.
                let (whole, cpu) = self.roster.retired(ev, last)?;
                return proc_event(&whole, Some(cpu));
            }
            EVENT_EXEC => {
                // What a reading said of the process before its exec never stands
                // for it after (the probe reads it whole: it ran).
                if let Some(m) = self.roster.get_mut(ev.pid) {
                    m.last = None;
                }
                // A non-leader exec: the exec'ing thread's entry moved to the
                // leader's tid, and the old leader waits under a key of its own.
                if ev.tid != ev.pid {
                    self.roster.remove(ev.tid);
                    self.enrol(GRAVEYARD_KEY | ev.pid, ev.pid);
                    self.enrol(ev.pid, ev.pid);
                }
                self.ledger.exec(ev);
                None
            }
            _ => None,
        };
        proc_event(ev, cpu)
    }

    fn take_reading(&mut self, r: LiveReading) {
        // A reading of a member that retired since is superseded by its EXIT record,
        // which the ring orders after it.
        if let Some(m) = self.roster.get_mut(r.tid) {
            m.read_in = self.pass;
            m.last = Some(r);
            self.ledger.reading(r.tid, r.fig);
            self.readings.push(r);
        }
    }

    /// A member the probe found idle: its last reading stands (the ledger holds
    /// it already). Without one here (listed again after lost records), it is
    /// read from /proc this pass and whole by the probe at the next.
    fn take_idle(&mut self, key: u32) {
        match self.roster.get_mut(key) {
            Some(m) if m.last.is_some() => {
                m.read_in = self.pass;
                self.readings.extend(m.last);
            }
            Some(_) => self.full_next = true,
            None => {}
        }
    }

    /// Reads every member in the roster through the probe, draining the ring after
    /// each run (so that readings never crowd out exit records). Returns the members
    /// it could not read, by tgid, for /proc; `None` when the probe cannot run.
    fn read_kernel(
        &mut self,
        ring: &mut RingBuf<MapData>,
        shown: &mut dyn FnMut(ProcEvent),
    ) -> Option<StdHashMap<u32, Vec<u32>>> {
        self.pass = self.pass.wrapping_add(1);
        self.readings.clear();
        let mut keys = std::mem::take(&mut self.keys);
        keys.clear();
        keys.extend(self.roster.keys());
        let full = std::mem::take(&mut self.full_next) || self.pass.is_multiple_of(FULL_EVERY);
        let mut ok = true;
        for batch in keys.chunks(PROBE_BATCH) {
            self.batch.clear();
            self.batch.extend_from_slice(batch);
            match self.probe(batch, full) {
                Ok(()) => {}
                Err(e) => {
                    self.probe_failed(&e);
                    ok = false;
                    break;
                }
            }
            self.drain(ring, shown);
        }
        self.batch.clear();
        self.keys = keys;
        if !ok {
            return None;
        }
        // Members still here without a reading: not seen by the kernel yet (a root
        // before its exec, members of an attached tree), missed on a full ring, or
        // retired with their EXIT record lost on a full ring. Only those still in the
        // map are read from /proc: a retired zombie's /proc files outlive it until
        // its reaper comes, and with records lost its figures are in the kernel's
        // totals already.
        let mut rest: StdHashMap<u32, Vec<u32>> = StdHashMap::new();
        let mut gone = Vec::new();
        for (key, m) in self.roster.iter() {
            if m.read_in == self.pass || key & GRAVEYARD_KEY != 0 {
                continue;
            }
            match self.tasks.get(&key, 0) {
                // A member that has exited is never read from /proc: once reaped, its
                // tid may be another task's. Its last reading stands until it retires.
                Ok(info) if info.tree == self.tree && info.flags & TASK_FLAG_EXITED != 0 => {}
                Ok(info) if info.tree == self.tree => rest.entry(info.tgid).or_default().push(key),
                _ => gone.push(key),
            }
        }
        for key in gone {
            self.forget(key);
        }
        Some(rest)
    }

    /// Reads the given members from /proc: CPU from schedstat, I/O per thread and
    /// the process's state, ticks and RSS from stat. Returns the processes found live.
    fn read_proc(
        &mut self,
        live: &StdHashMap<u32, Vec<u32>>,
        t: &mut TreeTotals,
        read_now: &mut Figures,
    ) -> HashSet<u32> {
        let mut alive = HashSet::new();
        let mut gone = Vec::new();
        let buf = &mut self.buf;
        for (&tgid, tids) in live {
            let files = &mut self.files;
            let st = files
                .read(tgid, tgid, Kind::Stat, buf)
                .and_then(|_| procread::parse_stat(buf));
            for &tid in tids {
                let Some(cpu_ns) = files
                    .read(tgid, tid, Kind::Schedstat, buf)
                    .and_then(|_| buf.split_ascii_whitespace().next()?.parse::<u64>().ok())
                else {
                    // Gone from /proc before retiring: its last reading stands, and
                    // its retirement comes as a record (or, were that lost, in the
                    // kernel's totals), so the probe need not ask for it again.
                    gone.push(tid);
                    continue;
                };
                // Each thread's own I/O: a process's /proc/PID/io also holds its
                // reaped children's, which are members counted on their own.
                let f = Figures {
                    cpu_ns,
                    ..files
                        .read(tgid, tid, Kind::ThreadIo, buf)
                        .and_then(|_| procread::parse_io(buf))
                        .unwrap_or_default()
                };
                read_now.add(&f);
                self.ledger.reading(tid, f);
                if st.is_some_and(|s| s.state != b'Z' && s.state != b'X') {
                    t.live_threads += 1;
                }
            }
            let Some(st) = st else { continue };
            // A zombie is not live, but until it retires its figures are read here.
            t.fig.utime_ns += st.utime * self.tck_ns;
            t.fig.stime_ns += st.stime * self.tck_ns;
            if st.state == b'Z' || st.state == b'X' {
                continue;
            }
            alive.insert(tgid);
            self.proc_stats.insert(tgid, st);
            t.live_procs += 1;
            if tgid == self.root {
                t.root_alive = true;
            }
            let rss = st.rss_pages * self.page;
            t.rss_bytes += rss;
            self.live_max_rss_kib = self.live_max_rss_kib.max(rss / 1024);
        }
        self.files.sweep();
        for tid in gone {
            self.forget(tid);
        }
        alive
    }

    /// The gauges of this pass's kernel readings: live processes and threads, RSS.
    /// `proc_alive` are the processes /proc found live (a thread the kernel read may
    /// belong to one whose leader it could not).
    fn gauges(
        &mut self,
        opts: ReadOpts,
        t: &mut TreeTotals,
        read_now: &mut Figures,
        proc_alive: &HashSet<u32>,
    ) {
        let mut procs = std::mem::take(&mut self.procs);
        procs.clear();
        for r in &self.readings {
            read_now.add(&r.fig);
            let g = procs.entry(r.pid).or_default();
            if r.tid == r.pid {
                g.leader = Some((r.flags & READING_FLAG_ZOMBIE != 0, r.rss_pages));
                g.in_memcg = match opts.memcg_id {
                    _ if r.flags & READING_FLAG_MEMCG_KNOWN != 0 => true,
                    Some(id) if r.flags & READING_FLAG_MEMCG_ID != 0 && r.memcg_id == id => {
                        self.memcg_css = r.memcg_css;
                        true
                    }
                    _ => false,
                };
            }
            if r.flags & READING_FLAG_EXITED == 0 {
                g.threads += 1;
            }
            g.faults = g.faults.wrapping_add(r.faults);
        }
        // Live processes whose leader was not read in the tree's memory cgroup.
        let mut outside = 0u64;
        for (&tgid, g) in &procs {
            let rss_pages = match g.leader {
                // As /proc/PID/stat would say `Z`: not live.
                Some((true, _)) => continue,
                Some((false, pages)) if self.rss_in_kernel => pages,
                Some((false, _)) => procread::stat(tgid, &mut self.buf).map_or(0, |s| s.rss_pages),
                // The leader was read from /proc, which counted the process.
                None if proc_alive.contains(&tgid) => {
                    t.live_threads += g.threads;
                    continue;
                }
                // The leader retired (its threads live on): as a zombie leader.
                None => continue,
            };
            self.live_pids.insert(tgid);
            if self.faults_in_kernel && self.rss_in_kernel && !proc_alive.contains(&tgid) {
                self.kernel_sigs.insert(
                    tgid,
                    MemSig {
                        starttime: 0,
                        rss_pages,
                        faults: g.faults,
                    },
                );
            }
            outside += u64::from(!g.in_memcg);
            t.live_procs += 1;
            t.live_threads += g.threads;
            if tgid == self.root {
                t.root_alive = true;
            }
            let rss = rss_pages * self.page;
            t.rss_bytes += rss;
            self.live_max_rss_kib = self.live_max_rss_kib.max(rss / 1024);
        }
        t.memcg_inside = opts.memcg_id.is_some() && outside == 0 && proc_alive.is_empty();
        self.procs = procs;
    }

    /// The tree's totals now. `ring` is drained into the ledger before the members
    /// are read, and after each probe run (a member that retires in between is then
    /// counted with its final figures, not missed); `shown` gets the events it held.
    pub fn read(
        &mut self,
        opts: ReadOpts,
        mut ring: Option<&mut RingBuf<MapData>>,
        shown: &mut dyn FnMut(ProcEvent),
    ) -> anyhow::Result<TreeTotals> {
        // Room for the probe's records, and the members forked since the last pass.
        let ring_read = ring.is_some();
        if let Some(r) = ring.as_deref_mut() {
            self.drain(r, shown);
        } else if !self.degraded.has(degraded::RING_UNREAD) {
            self.ring_lost("the event ring is not read");
        }
        // The kernel's totals before the reading: a thread retires into the totals
        // before it leaves the map, so each is in one of the two (used when records
        // were lost).
        let k = self.kernel_stats()?;
        if k.lost_events > self.lost_seen {
            self.lost_seen = k.lost_events;
            self.relist();
        }
        let mut t = TreeTotals::default();
        let mut read_now = Figures::default();
        self.live_pids.clear();
        self.proc_stats.clear();
        self.kernel_sigs.clear();
        self.full_next |= opts.whole;
        let rest = match ring.as_deref_mut() {
            Some(r) => self.read_kernel(r, shown),
            None => None,
        };
        let rest = match rest {
            Some(rest) => rest,
            // Without the ring (or the probe) every member is read from /proc, and
            // exited ones retire at their RCU free.
            None => {
                self.readings.clear();
                self.listing().live
            }
        };
        let proc_alive = if rest.is_empty() {
            HashSet::new()
        } else {
            self.read_proc(&rest, &mut t, &mut read_now)
        };
        self.live_pids.extend(proc_alive.iter().copied());
        self.gauges(opts, &mut t, &mut read_now, &proc_alive);
        if let Some(r) = ring {
            self.drain(r, shown);
        }
        for (ev, cpu) in self.ready.drain(..) {
            if let Some(pe) = proc_event(&ev, Some(cpu)) {
                shown(pe);
            }
        }
        let mut f = if k.lost_events == 0 && ring_read {
            self.ledger.total()
        } else {
            // Records were lost, or the ring is not read (the ledger then hears of no
            // exit): the kernel's totals of threads retired before the reading, plus
            // the threads read. A thread retiring between the two readings is missed
            // for one sample, never counted twice.
            let mut f = read_now;
            f.add(&k.fig);
            f
        };
        f.at_least(&self.reported);
        self.reported = f;
        // Members read from /proc have their tick times from /proc/PID/stat (above);
        // the probe's readings and the records carry their own.
        let (utime_ns, stime_ns) = (t.fig.utime_ns, t.fig.stime_ns);
        t.fig = f;
        t.fig.utime_ns += utime_ns;
        t.fig.stime_ns += stime_ns;
        t.procs_spawned = k.procs_spawned + self.root_spawned;
        t.procs_exited = k.procs_exited;
        t.threads_spawned = k.threads_spawned;
        t.execs = k.execs;
        t.lost_events = k.lost_events;
        t.untracked_tasks = k.untracked_tasks;
        // signal->maxrss is in pages: read as KiB it was a quarter of the truth for
        // a process whose peak fell between two samples.
        t.max_rss_kib = (k.max_rss_pages * (self.page / 1024)).max(self.live_max_rss_kib);
        self.note_counts(&k);
        // Four system calls. Where tracepoints run with preemption disabled a
        // program cannot be entered again on its CPU, so the kernel skips none:
        // looked at every 8th reading and in the final one (`settle`), in case.
        self.misses_read_ago += 1;
        if self.preemptible || self.misses_read_ago >= MISSES_EVERY {
            self.misses_read_ago = 0;
            self.note_missed_runs(&k);
        }
        t.degraded = self.degraded.clone();
        Ok(t)
    }

    /// Runs of the attached programs the kernel skipped, named: a fork, exec or exit
    /// none of them saw is missing from the counts and from the tree. With second
    /// copies attached, an event is lost only where both copies were skipped for
    /// it: at most the smaller of the two counts (both count the host's events,
    /// not only the tree's).
    fn note_missed_runs(&mut self, k: &TreeStats) {
        use std::os::fd::AsFd as _;
        let misses = |name: &str| {
            let fd = self.bpf.program(name).and_then(|p| p.fd().ok())?;
            Some(load::recursion_misses(fd.as_fd()))
        };
        let mut missed = 0;
        let mut each = Vec::new();
        for &(first, again, tp) in &load::TRACEPOINTS {
            let m = misses(first).unwrap_or(0);
            let a = misses(again);
            missed += a.map_or(m, |a| m.min(a));
            let short = tp.trim_start_matches("sched_process_");
            each.push(match a {
                Some(a) => format!("{short} {m} and {a}"),
                None => format!("{short} {m}"),
            });
        }
        let each = each.join(", ");
        if missed == 0
            && k.adopted == 0
            && k.exits_unseen == 0
            && k.execs_unseen == 0
            && k.children_unchecked == 0
        {
            return;
        }
        let text = if self.preemptible {
            format!(
                "the kernel skipped up to {missed} run(s) of the tracker's programs on the host \
                 (every copy of a program held on that CPU by a task preempted inside it; \
                 runs skipped per copy: {each}); \
                 {} member(s) whose fork was skipped were found at a later event by their \
                 ancestry and counted from their fork, {} process end(s) whose exit was \
                 skipped were counted when the leader was found dead, and {} exec(s) that \
                 were skipped were counted at the member's exit. A task is outside the \
                 tree only where every copy was skipped for its fork and for its own exec \
                 and exit and for its parent's exit{}",
                k.adopted,
                k.exits_unseen,
                k.execs_unseen,
                if k.children_unchecked > 0 {
                    format!(
                        ", or where it was beyond the {} children an exiting member's \
                         program looks at ({} such exit(s))",
                        tracker_common::ADOPT_CHILDREN,
                        k.children_unchecked
                    )
                } else {
                    String::new()
                }
            )
        } else {
            format!(
                "the kernel skipped up to {missed} run(s) of the tracker's programs (one \
                 was already running on that CPU; runs skipped: {each}): the forks, execs and exits they would have \
                 seen are missing from processes_spawned, processes_exited and execs, and a \
                 child never seen is outside the tree with its CPU, I/O and memory"
            )
        };
        self.degraded.set(degraded::MISSED_RUNS, text);
    }

    /// The kernel's counters of what it could not record, as named degradations.
    fn note_counts(&mut self, k: &TreeStats) {
        if k.untracked_tasks > 0 {
            self.degraded.set(
                degraded::MAP_FULL,
                format!(
                    "{} task(s) not tracked: the task map ({} entries, --max-tasks) was full when \
                     they were forked, so their CPU, I/O and memory are missing from the totals",
                    k.untracked_tasks, self.max_tasks
                ),
            );
        }
        if k.lost_exits > 0 {
            self.degraded.set(
                degraded::EXIT_UNREAD,
                format!(
                    "{} member(s) whose task the kernel freed before their final figures \
                     could be read (it skipped the tracker's free program, counting no missed \
                     run): each counts with its figures at its exit in its record and, unless \
                     cpu_source is cgroup, in the tree's CPU: short by up to one scheduler tick \
                     (the kernel brings sum_exec_runtime up to date at ticks and switches) and \
                     by its exit path (freeing its memory, closing its files), or with its last \
                     reading where its exit was not seen either",
                    k.lost_exits
                ),
            );
        }
        if k.lost_events > 0 {
            self.degraded.set(
                degraded::RING_FULL,
                format!(
                    "{} record(s) lost on a full event ring (--event-ring-kib {}): totals come \
                     from the kernel's counters, a thread that retires during a reading counts \
                     one sample late, and --events misses those records",
                    k.lost_events, self.ring_kib
                ),
            );
        }
    }

    /// (name, run count, run time) per program; zeros unless statistics are enabled.
    pub fn prog_stats(&self) -> Vec<(String, u64, Duration)> {
        self.bpf
            .programs()
            .filter_map(|(name, p)| {
                let info = p.info().ok()?;
                Some((name.to_string(), info.run_count(), info.run_time()))
            })
            .collect()
    }

    pub fn stats_enabled(&self) -> bool {
        self.stats_enabled
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_time_namespace_offset_in_ticks() {
        let tck = crate::sys::clk_tck();
        let text = "monotonic 0 0\nboottime 5 500000000\n";
        assert_eq!(super::boottime_offset_ticks(text), Some(5 * tck + tck / 2));
        assert_eq!(super::boottime_offset_ticks("monotonic 0 0\n"), None);
        assert_eq!(super::boottime_offset_ticks("boottime x 0\n"), None);
    }
}
