//! The eBPF engine: loads the programs with this kernel's offsets, registers trees and
//! reads their totals.
//!
//! Every thread of the tree retires in the kernel once dead and off the CPU (the
//! sweep program, run here at each sample, or its RCU free), with an EXIT record
//! that carries its final CPU and I/O. Live threads, listed by the
//! kernel's own task map (so cost follows the tree, not the host), are read from
//! /proc. A per-thread ledger joins the two: a thread counts with its last live
//! reading until its record arrives, then with its final figures, so totals never go
//! back and nothing is counted twice, whatever the order of exits, reaping and reads.

use std::{
    collections::HashMap as StdHashMap,
    fmt,
    os::fd::OwnedFd,
    time::{Duration, Instant},
};

use aya::{
    maps::{HashMap, MapData, PerCpuArray, RingBuf},
    programs::{RawTracePoint, RawTracePointRunOptions, TestRun},
    Ebpf, EbpfLoader,
};
use tracker_common::{
    Event, Figures, TaskInfo, TreeStats, EVENT_EXEC, EVENT_EXIT, EVENT_FLAG_GROUP_DEAD,
    EVENT_FLAG_SHARED_TID, EVENT_FORK, GRAVEYARD_KEY, SWEEP_BATCH, TASK_FLAG_EXITED,
    TASK_FLAG_ROOT,
};

use super::{
    btf::Btf,
    procread::{self, Kind},
    ProcEvent, ReadOpts, TreeTotals,
};

static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tracker"));

/// Attached for the tree's life cycle. Threads retire through `SWEEP` at each sample
/// once dead and off the CPU, or at `sched_process_free` if that comes first.
const TRACEPOINTS: [&str; 4] = [
    "sched_process_fork",
    "sched_process_exec",
    "sched_process_exit",
    "sched_process_free",
];

/// Run on demand (`BPF_PROG_TEST_RUN`), never attached.
const SWEEP: &str = "sweep";

/// A PID namespace's inode that is the host's (`PROC_PID_INIT_INO`).
const INIT_PID_NS_INO: u64 = 0xEFFF_FFFC;

/// Raises each figure of `f` to at least `floor`'s.
fn at_least(f: &mut Figures, floor: &Figures) {
    f.cpu_ns = f.cpu_ns.max(floor.cpu_ns);
    f.utime_ns = f.utime_ns.max(floor.utime_ns);
    f.stime_ns = f.stime_ns.max(floor.stime_ns);
    f.read_bytes = f.read_bytes.max(floor.read_bytes);
    f.write_bytes = f.write_bytes.max(floor.write_bytes);
    f.rchar = f.rchar.max(floor.rchar);
    f.wchar = f.wchar.max(floor.wchar);
}

/// Retired threads' figures from their EXIT records, and each live thread's last
/// reading until its record arrives.
#[derive(Debug, Default)]
struct Ledger {
    retired: Figures,
    /// Live readings carry no tick times (the split comes from /proc/PID/stat).
    live: StdHashMap<u32, Figures>,
    /// CPU of a process's retired threads, until its last thread retires.
    proc_cpu: StdHashMap<u32, u64>,
}

/// The task map's members of one tree.
#[derive(Debug, Default)]
struct Listing {
    /// tgid → tids not retired.
    live: StdHashMap<u32, Vec<u32>>,
    /// Keys of members that have exited and wait to retire.
    exited: Vec<u32>,
}

/// Bounds the per-process accumulators (a thread retiring after its process's last
/// record starts one that is never closed).
const MAX_PROC_CPU: usize = 100_000;

impl Ledger {
    /// Takes one EXIT record; returns the process's total CPU when it was the last.
    fn retire(&mut self, ev: &Event) -> Option<u64> {
        self.retired.add(&ev.fig);
        if ev.flags & EVENT_FLAG_SHARED_TID == 0 {
            self.live.remove(&ev.tid);
        }
        if ev.flags & EVENT_FLAG_GROUP_DEAD != 0 {
            return Some(self.proc_cpu.remove(&ev.pid).unwrap_or(0) + ev.fig.cpu_ns);
        }
        if self.proc_cpu.len() < MAX_PROC_CPU || self.proc_cpu.contains_key(&ev.pid) {
            *self.proc_cpu.entry(ev.pid).or_default() += ev.fig.cpu_ns;
        }
        None
    }

    /// A non-leader thread exec'd and took the leader's tid: its reading moves with
    /// it, and replaces the old leader's, which retires on its own record.
    fn exec(&mut self, ev: &Event) {
        if ev.tid != ev.pid {
            if let Some(f) = self.live.remove(&ev.tid) {
                self.live.insert(ev.pid, f);
            }
        }
    }

    /// Retired plus the last reading of every thread not retired yet.
    fn total(&self) -> Figures {
        let mut t = self.retired;
        for f in self.live.values() {
            t.add(f);
        }
        t
    }
}

/// True when this process is in the host's PID namespace, where the kernel's pids and
/// /proc's agree. An unreadable namespace link (no /proc) counts as the host's.
fn in_host_pid_ns() -> bool {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/pid").map_or(true, |m| m.ino() == INIT_PID_NS_INO)
}

/// Why the eBPF engine could not start; the agent then falls back to procfs.
#[derive(Debug)]
pub enum EbpfUnavailable {
    NoBtf(String),
    NoPrivilege(String),
    /// Pids in BPF are the host's; this process sees another namespace's.
    PidNamespace,
    Load(String),
}

impl fmt::Display for EbpfUnavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EbpfUnavailable::NoBtf(s) => write!(f, "no usable kernel BTF ({s})"),
            EbpfUnavailable::NoPrivilege(s) => {
                write!(f, "not allowed to load BPF programs ({s}); run as root or with CAP_BPF+CAP_PERFMON")
            }
            EbpfUnavailable::PidNamespace => write!(
                f,
                "the tracker runs in a PID namespace other than the host's (the kernel's pids are not the ones this /proc shows)"
            ),
            EbpfUnavailable::Load(s) => write!(f, "loading the BPF programs failed: {s}"),
        }
    }
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
    _stats_fd: Option<OwnedFd>,
    /// BPF run-time statistics are being collected (ours or the sysctl).
    stats_enabled: bool,
    pub load_ms: f64,
}

fn has_cap_bpf() -> Result<(), String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        return Ok(());
    }
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    const CAP_SYS_ADMIN: u64 = 21;
    const CAP_PERFMON: u64 = 38;
    const CAP_BPF: u64 = 39;
    let has = |c: u64| eff & (1 << c) != 0;
    if has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON)) {
        Ok(())
    } else {
        Err("not root, and lacking CAP_BPF+CAP_PERFMON".into())
    }
}

impl EbpfEngine {
    /// Loads and attaches everything. `max_tasks` sizes the task map, `ring_bytes`
    /// the event ring.
    pub fn load(max_tasks: u32, ring_bytes: u32, bpf_stats: bool) -> Result<Self, EbpfUnavailable> {
        let t0 = Instant::now();
        has_cap_bpf().map_err(EbpfUnavailable::NoPrivilege)?;
        if !in_host_pid_ns() {
            return Err(EbpfUnavailable::PidNamespace);
        }
        // The programs are plain raw tracepoints: the kernel's BTF is read only for
        // the offsets they use.
        let path = "/sys/kernel/btf/vmlinux";
        let data =
            std::fs::read(path).map_err(|e| EbpfUnavailable::NoBtf(format!("{path}: {e}")))?;
        let t_read = t0.elapsed();
        let btf = Btf::parse(&data).map_err(|e| EbpfUnavailable::NoBtf(format!("{path}: {e}")))?;
        let offsets = btf
            .offsets()
            .map_err(|e| EbpfUnavailable::NoBtf(e.to_string()))?;
        drop(btf);
        drop(data);
        let t_parsed = t0.elapsed();
        log::debug!("kernel offsets: {offsets:?}");
        let mut bpf = EbpfLoader::new()
            .btf(None)
            .override_global("OFFSETS", &offsets, true)
            .map_max_entries("TASKS", max_tasks)
            .map_max_entries("EVENTS", ring_bytes)
            .load(OBJECT)
            .map_err(|e| classify(e.to_string()))?;
        for name in TRACEPOINTS.into_iter().chain([SWEEP]) {
            let prog: &mut RawTracePoint = bpf
                .program_mut(name)
                .ok_or_else(|| {
                    EbpfUnavailable::Load(format!("program {name} missing from object"))
                })?
                .try_into()
                .map_err(|e: aya::programs::ProgramError| {
                    EbpfUnavailable::Load(format!("{name}: {e}"))
                })?;
            prog.load()
                .map_err(|e| classify(format!("{name}: {e:#}")))?;
            if name != SWEEP {
                prog.attach(name)
                    .map_err(|e| classify(format!("attach {name}: {e}")))?;
            }
        }
        log::debug!(
            "eBPF load: BTF read {t_read:?}, parsed {:?}, programs loaded and attached {:?}",
            t_parsed - t_read,
            t0.elapsed() - t_parsed
        );
        let take = |bpf: &mut Ebpf, name: &str| {
            bpf.take_map(name)
                .ok_or_else(|| EbpfUnavailable::Load(format!("map {name} missing from object")))
        };
        let tasks = HashMap::try_from(take(&mut bpf, "TASKS")?)
            .map_err(|e| EbpfUnavailable::Load(format!("TASKS: {e}")))?;
        let stats = PerCpuArray::try_from(take(&mut bpf, "TREE_STATS")?)
            .map_err(|e| EbpfUnavailable::Load(format!("TREE_STATS: {e}")))?;
        let ring = RingBuf::try_from(take(&mut bpf, "EVENTS")?)
            .map_err(|e| EbpfUnavailable::Load(format!("EVENTS: {e}")))?;
        let stats_fd = if bpf_stats {
            match aya::sys::enable_stats(aya::sys::Stats::RunTime) {
                Ok(fd) => Some(fd),
                Err(e) => {
                    log::warn!("cannot enable BPF run-time statistics: {e}");
                    None
                }
            }
        } else {
            None
        };
        let stats_enabled = stats_fd.is_some()
            || std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled")
                .is_ok_and(|s| s.trim() == "1");
        // Reading and parsing the BTF left megabytes of freed heap behind; hand them
        // back so the agent's RSS reflects what it keeps.
        // SAFETY: malloc_trim has no preconditions.
        unsafe { libc::malloc_trim(0) };
        Ok(EbpfEngine {
            stats_enabled,
            bpf,
            tasks,
            stats,
            ring: Some(ring),
            tree: 1,
            root: 0,
            root_spawned: 0,
            ledger: Ledger::default(),
            reported: Figures::default(),
            tck_ns: 1_000_000_000 / procread::clk_tck(),
            page: procread::page_size(),
            buf: String::new(),
            files: procread::FileCache::default(),
            live_max_rss_kib: 0,
            _stats_fd: stats_fd,
            load_ms: t0.elapsed().as_secs_f64() * 1e3,
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
            _pad: 0,
            task: 0,
        };
        self.tasks.insert(pid, info, 0)?;
        if existing {
            // Programs are attached already: a fork after this point is seen by the
            // kernel; one before it is found here.
            for (tgid, tids) in super::procfs::descendants_with_threads(pid) {
                for tid in tids {
                    let info = TaskInfo {
                        tgid,
                        tree: self.tree,
                        flags: if tgid == pid { TASK_FLAG_ROOT } else { 0 },
                        _pad: 0,
                        task: 0,
                    };
                    // NOEXIST (1): the kernel may have inserted it already.
                    let _ = self.tasks.insert(tid, info, 1);
                }
            }
        }
        Ok(())
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
            t.max_rss_kib = t.max_rss_kib.max(s.max_rss_kib);
            t.lost_events += s.lost_events;
            t.untracked_tasks += s.untracked_tasks;
        }
        Ok(t)
    }

    /// Members not retired yet, from the kernel's task map.
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

    /// Live members as (tgid → tids).
    pub fn live_tasks(&self) -> StdHashMap<u32, Vec<u32>> {
        self.listing().live
    }

    /// Retires the given exited members that are off the CPU (their figures final);
    /// returns how many it retired. Their EXIT records are in the ring.
    fn sweep(&mut self, keys: &[u32]) -> usize {
        let Some(prog) = self.bpf.program_mut(SWEEP) else {
            return 0;
        };
        let Ok(prog) = <&mut RawTracePoint>::try_from(prog) else {
            return 0;
        };
        let mut retired = 0;
        for batch in keys.chunks(SWEEP_BATCH) {
            let mut opts = RawTracePointRunOptions::new();
            for (i, &k) in batch.iter().enumerate() {
                opts.args[i / 2] |= u64::from(k) << (32 * (i % 2));
            }
            match prog.test_run(opts) {
                Ok(r) => retired += r.return_value as usize,
                Err(e) => {
                    log::warn!("running the sweep program failed: {e}; exits are counted when the kernel frees them");
                    return retired;
                }
            }
        }
        retired
    }

    /// At the end of a run: retires every member that has exited, which is possible
    /// microseconds after its exit (its final context switch), never waiting for a
    /// reaper or RCU. Bounded, so a member stuck in its exit cannot hold the run.
    pub fn settle(&mut self, limit: Duration) -> Duration {
        let t0 = Instant::now();
        loop {
            let exited = self.listing().exited;
            if exited.is_empty() || t0.elapsed() >= limit {
                break;
            }
            // Fewer retired than listed: some are still on a CPU, or the RCU free
            // retired them meanwhile; the next listing tells which.
            if self.sweep(&exited) < exited.len() {
                std::thread::sleep(Duration::from_micros(200));
            }
        }
        t0.elapsed()
    }

    /// Takes every record the ring holds into the ledger; `shown` gets the events to
    /// show (forks, execs and process exits).
    pub fn drain(&mut self, ring: &mut RingBuf<MapData>, shown: &mut dyn FnMut(ProcEvent)) {
        while let Some(item) = ring.next() {
            if let Some(ev) = decode_event(&item).and_then(|ev| self.absorb(&ev)) {
                shown(ev);
            }
        }
    }

    /// Takes one ring record into the ledger; returns the event to show, if any
    /// (forks, execs and process exits; a thread's own retirement is internal).
    fn absorb(&mut self, ev: &Event) -> Option<ProcEvent> {
        let cpu = match ev.kind {
            EVENT_EXIT => Some(self.ledger.retire(ev)?),
            EVENT_EXEC => {
                self.ledger.exec(ev);
                None
            }
            _ => None,
        };
        proc_event(ev, cpu)
    }

    /// The tree's totals now. `ring` is drained into the ledger before the listing
    /// and again after the live members were read (a member that retires in between
    /// is then counted with its final figures, not missed); `shown` gets the events
    /// it held.
    pub fn read(
        &mut self,
        opts: ReadOpts,
        mut ring: Option<&mut RingBuf<MapData>>,
        shown: &mut dyn FnMut(ProcEvent),
    ) -> anyhow::Result<TreeTotals> {
        // Room for the sweep's records: what the ring holds now is of threads that
        // have left the map already, so taking it before the listing is safe.
        if let Some(r) = ring.as_deref_mut() {
            self.drain(r, shown);
        }
        // The kernel's totals before the listing: a thread retires into the totals
        // before it leaves the map, so each is in one of the two (used when records
        // were lost).
        let k = self.kernel_stats()?;
        let Listing { live, exited } = self.listing();
        // Exited members off the CPU retire now, into this sample.
        if !exited.is_empty() {
            self.sweep(&exited);
        }
        let mut t = TreeTotals {
            pss_bytes: opts.pss.then_some(0),
            ..Default::default()
        };
        let mut read_now = Figures::default();
        let buf = &mut self.buf;
        for (&tgid, tids) in &live {
            let files = &mut self.files;
            let st = files
                .read(tgid, tgid, Kind::Stat, buf)
                .and_then(|_| procread::parse_stat(buf));
            for &tid in tids {
                let Some(cpu_ns) = files
                    .read(tgid, tid, Kind::Schedstat, buf)
                    .and_then(|_| buf.split_ascii_whitespace().next()?.parse::<u64>().ok())
                else {
                    // Gone from /proc before retiring: its last reading stands.
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
                self.ledger.live.insert(tid, f);
                if st.is_some_and(|s| s.state != b'Z' && s.state != b'X') {
                    t.live_threads += 1;
                }
            }
            let Some(st) = st else { continue };
            // A zombie is not live, but until it retires its figures are read here.
            t.user_ticks_ns += st.utime * self.tck_ns;
            t.sys_ticks_ns += st.stime * self.tck_ns;
            if st.state == b'Z' || st.state == b'X' {
                continue;
            }
            t.live_procs += 1;
            if tgid == self.root {
                t.root_alive = true;
            }
            let rss = st.rss_pages * self.page;
            t.rss_bytes += rss;
            self.live_max_rss_kib = self.live_max_rss_kib.max(rss / 1024);
            if opts.pss {
                if let (Some(p), Some(acc)) = (procread::pss_bytes(tgid, buf), t.pss_bytes.as_mut())
                {
                    *acc += p;
                }
            }
        }
        self.files.sweep();
        if let Some(r) = ring {
            self.drain(r, shown);
        }
        let mut f = if k.lost_events == 0 {
            self.ledger.total()
        } else {
            // Records were lost: the kernel's totals of threads retired before the
            // listing, plus the threads listed. A thread retiring between the two
            // readings is missed for one sample, never counted twice.
            let mut f = read_now;
            f.add(&k.fig);
            f
        };
        at_least(&mut f, &self.reported);
        self.reported = f;
        t.cpu_ns = f.cpu_ns;
        t.read_bytes = f.read_bytes;
        t.write_bytes = f.write_bytes;
        t.rchar = f.rchar;
        t.wchar = f.wchar;
        t.user_ticks_ns += f.utime_ns;
        t.sys_ticks_ns += f.stime_ns;
        t.procs_spawned = k.procs_spawned + self.root_spawned;
        t.procs_exited = k.procs_exited;
        t.threads_spawned = k.threads_spawned;
        t.execs = k.execs;
        t.lost_events = k.lost_events;
        t.untracked_tasks = k.untracked_tasks;
        t.max_rss_kib = k.max_rss_kib.max(self.live_max_rss_kib);
        Ok(t)
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

fn classify(msg: String) -> EbpfUnavailable {
    if msg.contains("EPERM")
        || msg.contains("Operation not permitted")
        || msg.contains("os error 1)")
    {
        EbpfUnavailable::NoPrivilege(msg)
    } else {
        EbpfUnavailable::Load(msg)
    }
}

/// Decodes one ring-buffer record; `None` for a record of the wrong size or kind.
fn decode_event(bytes: &[u8]) -> Option<Event> {
    if bytes.len() < std::mem::size_of::<Event>() {
        return None;
    }
    // SAFETY: Event is repr(C) plain data and the length was checked; the read is
    // unaligned-safe.
    let ev: Event = unsafe { std::ptr::read_unaligned(bytes.as_ptr() as *const Event) };
    matches!(ev.kind, EVENT_FORK | EVENT_EXEC | EVENT_EXIT).then_some(ev)
}

/// The shown form of a record; `cpu_ns` is the whole process's CPU for an exit.
fn proc_event(ev: &Event, cpu_ns: Option<u64>) -> Option<ProcEvent> {
    let end = ev
        .comm
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(ev.comm.len());
    let kind = match ev.kind {
        EVENT_FORK => "fork",
        EVENT_EXEC => "exec",
        EVENT_EXIT => "exit",
        _ => return None,
    };
    let exit = ev.kind == EVENT_EXIT;
    Some(ProcEvent {
        kind,
        pid: ev.pid,
        ppid: ev.ppid,
        comm: String::from_utf8_lossy(&ev.comm[..end]).into_owned(),
        cpu_secs: cpu_ns.map(|c| c as f64 / 1e9),
        exit_code: exit.then_some(ev.exit_code as i32),
        monotonic_secs: ev.ts_ns as f64 / 1e9,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reading(cpu_ns: u64) -> Figures {
        Figures {
            cpu_ns,
            ..Figures::default()
        }
    }

    fn exit(tid: u32, pid: u32, cpu: u64, flags: u32) -> Event {
        Event {
            kind: EVENT_EXIT,
            pid,
            tid,
            fig: Figures {
                cpu_ns: cpu,
                write_bytes: cpu * 10,
                ..Figures::default()
            },
            flags,
            ..Event::default()
        }
    }

    /// A thread counts with its last live reading until its record, then with its
    /// final figures: once, whatever the order of readings and records.
    #[test]
    fn ledger_counts_each_thread_once() {
        let mut l = Ledger::default();
        l.live.insert(11, reading(40));
        l.live.insert(12, reading(5));
        assert_eq!(l.total().cpu_ns, 45);
        // 11 retires with 50: its reading is replaced, not added.
        assert_eq!(l.retire(&exit(11, 10, 50, 0)), None);
        assert_eq!(l.total().cpu_ns, 55);
        assert_eq!(l.total().write_bytes, 500);
        // A thread that was never read (born and dead between two readings).
        assert_eq!(l.retire(&exit(13, 13, 7, EVENT_FLAG_GROUP_DEAD)), Some(7));
        assert_eq!(l.total().cpu_ns, 62);
        // The process's last thread: the record carries its whole CPU.
        assert_eq!(l.retire(&exit(12, 10, 6, EVENT_FLAG_GROUP_DEAD)), Some(56));
        assert_eq!(l.total().cpu_ns, 63);
        assert!(l.live.is_empty() && l.proc_cpu.is_empty());
    }

    /// An exec from a non-leader thread: the thread's reading follows it to the
    /// leader's tid and replaces the old leader's, which retires on its own.
    #[test]
    fn non_leader_exec_moves_the_reading() {
        let mut l = Ledger::default();
        l.live.insert(30, reading(100));
        l.live.insert(31, reading(40));
        // The old leader retires under the exec'ing thread's tid (tids swapped).
        l.retire(&exit(31, 30, 110, EVENT_FLAG_SHARED_TID));
        l.exec(&Event {
            kind: EVENT_EXEC,
            pid: 30,
            tid: 31,
            ..Event::default()
        });
        assert_eq!(l.total().cpu_ns, 150);
        assert_eq!(l.live.len(), 1);
    }

    /// A dead task whose tid another member took (a non-leader exec) counts, but the
    /// live member's reading stays.
    #[test]
    fn shared_tid_keeps_the_live_reading() {
        let mut l = Ledger::default();
        l.live.insert(20, reading(9));
        l.retire(&exit(20, 20, 3, EVENT_FLAG_SHARED_TID));
        assert_eq!(l.total().cpu_ns, 12);
        assert!(l.live.contains_key(&20));
    }

    #[test]
    fn records_decode_by_size_and_kind() {
        fn bytes_of(ev: &Event) -> &[u8] {
            // SAFETY: Event is plain data; viewing it as bytes for the decoder.
            unsafe {
                std::slice::from_raw_parts(
                    (ev as *const Event).cast::<u8>(),
                    std::mem::size_of::<Event>(),
                )
            }
        }
        let ev = exit(5, 5, 1, EVENT_FLAG_GROUP_DEAD);
        assert_eq!(decode_event(bytes_of(&ev)), Some(ev));
        assert_eq!(decode_event(&bytes_of(&ev)[..8]), None);
        let bad = Event { kind: 99, ..ev };
        assert_eq!(decode_event(bytes_of(&bad)), None);
    }
}
