//! The eBPF engine: loads the programs with this kernel's offsets, registers trees and
//! reads their totals. Exited members come from the in-kernel per-tree counters (exact,
//! independent of the event ring); live members are read from /proc, listed by the
//! kernel's own task map so that cost follows the tree, not the host.

use std::{collections::HashMap as StdHashMap, fmt, os::fd::OwnedFd, time::Duration};

use aya::{
    maps::{HashMap, MapData, PerCpuArray, RingBuf},
    programs::BtfTracePoint,
    Btf as AyaBtf, Ebpf, EbpfLoader,
};
use tracker_common::{Event, TaskInfo, TreeStats, EVENT_EXEC, EVENT_EXIT, EVENT_FORK};

use super::{
    btf::Btf,
    procread::{self, Kind},
    ProcEvent, ReadOpts, TreeTotals,
};

static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tracker"));

const PROGRAMS: [&str; 4] = [
    "sched_process_fork",
    "sched_process_exec",
    "sched_process_exit",
    "sched_process_free",
];

/// Why the eBPF engine could not start; the agent then falls back to procfs.
#[derive(Debug)]
pub enum EbpfUnavailable {
    NoBtf(String),
    NoPrivilege(String),
    Load(String),
}

impl fmt::Display for EbpfUnavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EbpfUnavailable::NoBtf(s) => write!(f, "no usable kernel BTF ({s})"),
            EbpfUnavailable::NoPrivilege(s) => {
                write!(f, "not allowed to load BPF programs ({s}); run as root or with CAP_BPF+CAP_PERFMON")
            }
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
    /// Loads and attaches everything. `max_tasks` sizes the task map.
    pub fn load(max_tasks: u32, bpf_stats: bool) -> Result<Self, EbpfUnavailable> {
        let t0 = std::time::Instant::now();
        has_cap_bpf().map_err(EbpfUnavailable::NoPrivilege)?;
        // Read once (sysfs serves it 4 KiB per read) and parse twice: ours for the
        // offsets, aya's for loading the programs.
        let path = "/sys/kernel/btf/vmlinux";
        let data =
            std::fs::read(path).map_err(|e| EbpfUnavailable::NoBtf(format!("{path}: {e}")))?;
        let btf = Btf::parse(&data).map_err(|e| EbpfUnavailable::NoBtf(format!("{path}: {e}")))?;
        let offsets = btf
            .offsets()
            .map_err(|e| EbpfUnavailable::NoBtf(e.to_string()))?;
        drop(btf);
        log::debug!("kernel offsets: {offsets:?}");
        let aya_btf = AyaBtf::parse(&data, aya::Endianness::default())
            .map_err(|e| EbpfUnavailable::NoBtf(format!("{path}: {e}")))?;
        drop(data);
        let mut bpf = EbpfLoader::new()
            .btf(Some(&aya_btf))
            .override_global("OFFSETS", &offsets, true)
            .map_max_entries("TASKS", max_tasks)
            .load(OBJECT)
            .map_err(|e| classify(e.to_string()))?;
        for name in PROGRAMS {
            let prog: &mut BtfTracePoint = bpf
                .program_mut(name)
                .ok_or_else(|| {
                    EbpfUnavailable::Load(format!("program {name} missing from object"))
                })?
                .try_into()
                .map_err(|e: aya::programs::ProgramError| {
                    EbpfUnavailable::Load(format!("{name}: {e}"))
                })?;
            prog.load(name, &aya_btf)
                .map_err(|e| classify(format!("{name}: {e:#}")))?;
            prog.attach()
                .map_err(|e| classify(format!("attach {name}: {e}")))?;
        }
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
        // Parsing BTF twice (ours and aya's) left megabytes of freed heap behind; hand
        // them back so the agent's RSS reflects what it keeps.
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
            flags: 0,
            _pad: 0,
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
                        flags: 0,
                        _pad: 0,
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
            t.cpu_ns += s.cpu_ns;
            t.utime_ns += s.utime_ns;
            t.stime_ns += s.stime_ns;
            t.read_bytes += s.read_bytes;
            t.write_bytes += s.write_bytes;
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

    /// Live members as (tgid → tids), from the kernel's task map.
    pub fn live_tasks(&self) -> StdHashMap<u32, Vec<u32>> {
        let mut m: StdHashMap<u32, Vec<u32>> = StdHashMap::new();
        for item in self.tasks.iter() {
            match item {
                Ok((tid, info)) if info.tree == self.tree => {
                    m.entry(info.tgid).or_default().push(tid)
                }
                Ok(_) => {}
                // A key deleted while iterating: the next reading will be consistent.
                Err(_) => continue,
            }
        }
        m
    }

    /// Members still on their way out, as (released, zombies). Released tasks are
    /// gone from /proc and wait for their RCU-delayed free, where their CPU becomes
    /// final. Zombies are read live, but one that has not made its final context
    /// switch yet still shows a runtime stale by up to a tick. Used to settle before
    /// the last sample.
    pub fn dying_tasks(&self) -> (usize, usize) {
        let mut buf = String::new();
        let (mut released, mut zombies) = (0, 0);
        for (tgid, tids) in self.live_tasks() {
            for tid in tids {
                let path = procread::task_path(tgid, tid, "stat");
                match procread::read_into(&path, &mut buf).and_then(|_| procread::parse_stat(&buf))
                {
                    None => released += 1,
                    Some(st) if st.state == b'Z' || st.state == b'X' => zombies += 1,
                    Some(_) => {}
                }
            }
        }
        (released, zombies)
    }

    pub fn read(&mut self, opts: ReadOpts) -> anyhow::Result<TreeTotals> {
        // Freed first, then live: a member freed in between is missed once and
        // counted next time, so the cumulative CPU never goes backwards.
        let k = self.kernel_stats()?;
        let live = self.live_tasks();
        let mut t = TreeTotals {
            cpu_ns: k.cpu_ns,
            user_ticks_ns: k.utime_ns,
            sys_ticks_ns: k.stime_ns,
            read_bytes: k.read_bytes,
            write_bytes: k.write_bytes,
            procs_spawned: k.procs_spawned + self.root_spawned,
            procs_exited: k.procs_exited,
            threads_spawned: k.threads_spawned,
            execs: k.execs,
            lost_events: k.lost_events,
            untracked_tasks: k.untracked_tasks,
            max_rss_kib: k.max_rss_kib,
            pss_bytes: opts.pss.then_some(0),
            ..Default::default()
        };
        let buf = &mut self.buf;
        for (&tgid, tids) in &live {
            let files = &mut self.files;
            let Some(st) = files
                .read(tgid, tgid, Kind::Stat, buf)
                .and_then(|_| procread::parse_stat(buf))
            else {
                continue;
            };
            // A zombie is not live, but its CPU and I/O reach the kernel's totals only
            // when it is reaped and freed: until then it is read here.
            let zombie = st.state == b'Z' || st.state == b'X';
            for &tid in tids {
                let ns = files
                    .read(tgid, tid, Kind::Schedstat, buf)
                    .and_then(|_| buf.split_ascii_whitespace().next()?.parse::<u64>().ok());
                if let Some(ns) = ns {
                    t.cpu_ns += ns;
                    t.live_threads += u64::from(!zombie);
                }
            }
            t.user_ticks_ns += st.utime * self.tck_ns;
            t.sys_ticks_ns += st.stime * self.tck_ns;
            if let Some((r, w)) = files
                .read(tgid, tgid, Kind::Io, buf)
                .and_then(|_| procread::parse_io(buf))
            {
                t.read_bytes += r;
                t.write_bytes += w;
            }
            if zombie {
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
        t.max_rss_kib = t.max_rss_kib.max(self.live_max_rss_kib);
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

/// Decodes one ring-buffer record; `None` for a record of the wrong size.
pub fn decode_event(bytes: &[u8]) -> Option<ProcEvent> {
    if bytes.len() < std::mem::size_of::<Event>() {
        return None;
    }
    // SAFETY: Event is repr(C) plain data and the length was checked; the read is
    // unaligned-safe.
    let ev: Event = unsafe { std::ptr::read_unaligned(bytes.as_ptr() as *const Event) };
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
        cpu_secs: exit.then(|| ev.cpu_ns as f64 / 1e9),
        exit_code: exit.then_some(ev.exit_code as i32),
        monotonic_secs: ev.ts_ns as f64 / 1e9,
    })
}
