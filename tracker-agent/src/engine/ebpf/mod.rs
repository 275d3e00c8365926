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
    os::fd::OwnedFd,
    time::{Duration, Instant},
};

use aya::{
    maps::{HashMap, MapData, PerCpuArray, RingBuf},
    programs::{RawTracePoint, RawTracePointRunOptions, TestRun},
    Ebpf,
};
use tracker_common::{
    Event, Figures, TaskInfo, TreeStats, EVENT_EXEC, EVENT_EXIT, GRAVEYARD_KEY, SWEEP_BATCH,
    TASK_FLAG_EXITED, TASK_FLAG_ROOT,
};

mod ledger;
mod load;
pub(crate) use load::in_host_pid_ns;
pub mod node;
mod records;

use super::{
    procread::{self, Kind},
    ProcEvent, ReadOpts, TreeTotals,
};
use ledger::{at_least, Ledger};
use records::{decode_event, proc_event};

/// Run on demand (`BPF_PROG_TEST_RUN`), never attached.
const SWEEP: &str = "sweep";

/// The task map's members of one tree.
#[derive(Debug, Default)]
struct Listing {
    /// tgid → tids not retired.
    live: StdHashMap<u32, Vec<u32>>,
    /// Keys of members that have exited and wait to retire.
    exited: Vec<u32>,
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

impl EbpfEngine {
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
                self.ledger.reading(tid, f);
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
