//! The procfs fallback: polls /proc for the tree. It cannot see members that live and
//! die between two polls; their CPU still arrives through their parents' `cutime`
//! (when a tree member reaps them) or through the tracker's own `wait4` (when the
//! tracker is their subreaper, as under `run`). Counts of processes are lower bounds.

use tracker_common::Figures;

use super::{
    ids::{IdMap, IdSet},
    procread, taskstats,
};
use crate::model::{degraded, reading::TreeTotals};

#[derive(Clone, Copy, Debug, Default)]
struct Member {
    ppid: u32,
    starttime: u64,
    /// Its own CPU (ns): its CPU clock where that could be read, to the
    /// nanosecond, else utime+stime (whole ticks, each floored). Its reaped
    /// children's, cutime+cstime, exist in ticks only.
    own_ns: u64,
    child_ns: u64,
    user_ns: u64,
    sys_ns: u64,
    /// The process's /proc/PID/io: its threads' and its reaped children's I/O.
    io: Figures,
    /// Its CPU clock (every thread's run time, ns), read before the stat of it
    /// that `live` holds: the same now means it has not run since (`unchanged`).
    ran_ns: Option<u64>,
    /// Its page faults when its high-water mark was last read.
    hwm_faults: u64,
    /// Its reaped children's page faults at its first sighting.
    child_faults: u64,
}

impl Member {
    fn cpu(&self) -> u64 {
        self.own_ns + self.child_ns
    }

    /// Its figures: CPU and tick times from its stat, the rest from its io file.
    fn fig(&self) -> Figures {
        Figures {
            cpu_ns: self.cpu(),
            utime_ns: self.user_ns,
            stime_ns: self.sys_ns,
            ..self.io
        }
    }

    /// Its times from its stat, `tck` ns a tick, its own CPU from its CPU clock
    /// `clock` where there is one: whole ticks, each floored, leave a sighting
    /// short by up to two ticks a process (20 ms at USER_HZ 100), which an
    /// attached tree's baseline turns into an excess of as much; the clock is
    /// the scheduler's own sum, which utime+stime are that sum split and floored.
    fn set_times(&mut self, st: &procread::Stat, tck: u64, clock: Option<u64>) {
        self.own_ns = clock.unwrap_or((st.utime + st.stime) * tck);
        self.child_ns = (st.cutime + st.cstime) * tck;
        self.user_ns = (st.utime + st.cutime) * tck;
        self.sys_ns = (st.stime + st.cstime) * tck;
    }
}

pub struct ProcfsEngine {
    root: u32,
    /// The root's start time: a later process given the same pid is not the root.
    root_start: Option<u64>,
    /// The tracker's pid when it is the subreaper of the tree (`run`): its other
    /// children are orphans of the tree.
    reaper: Option<u32>,
    members: IdMap<Member>,
    /// Contributions of vanished members that no live member accounts for.
    kept: Figures,
    /// Exact usage of processes the tracker reaped itself: pid → its CPU and tick
    /// times, and whether its I/O (read as a zombie) is in them too.
    reaped: IdMap<(Figures, bool)>,
    /// Members that vanished with the tracker as their parent before the note of
    /// their reap came: their last sighting is in the kept totals until it does.
    awaiting: IdMap<Member>,
    seen: u64,
    exited: u64,
    max_rss_kib: u64,
    tck_ns: u64,
    page: u64,
    buf: String,
    /// Live (non-zombie) members at the last reading, with their stat of it.
    live: IdMap<procread::Stat>,
    /// Walk the tree through `children` files instead of scanning all of /proc.
    children_files: bool,
    /// The members' stat and io, held open and read again with `pread`: an
    /// open and a close fewer per file and member each sample. Closed when the
    /// member leaves (`forget`), not swept: a sweep needs each idle member's
    /// files marked every poll, three map lookups a member.
    files: procread::FileCache,
    /// The root's parent whose stat is held open (`parent_account`).
    parent_file: Option<u32>,
    /// Each member's threads as last listed, with their number then: listed again
    /// only when its stat shows another number, or a thread's `children` file is
    /// gone (one exited, another came).
    threads: IdMap<(u64, Vec<u32>)>,
    /// Members this poll found unchanged since the last (`unchanged`): their last
    /// stat, io and children stand.
    idle: IdSet,
    /// Processes that left since the last poll, the members that vanished then
    /// and the root's parent outside the tree: an idle member whose parent was
    /// one of them has another parent now, and its stat is read again.
    vanished: IdSet,
    /// The members' CPU clocks read this poll, before their stats: they become
    /// `Member::ran_ns` with those stats in `read`, and only there (a poll for
    /// `tree_alive` reads stats that `live` never holds).
    ran_now: IdMap<u64>,
    polls: u64,
    /// `procread::rss_movers` at the last poll that could read idle members'
    /// stats again (`restat_due`).
    movers: Option<u64>,
    /// Attached: the root's parent (outside the tree) as it was read just before
    /// the root's last sighting (`ParentAccount`).
    parent: Option<ParentAccount>,
    /// The maps and lists of a poll, kept with their capacity for the next:
    /// rebuilt each poll, they were a tenth of an attached sample of 300 idle
    /// members (rehashing, zeroing and freeing; docs/cost.md).
    scratch: Scratch,
    /// The root's figures came from its parent's account (`root_from_parent`):
    /// what to say of it.
    root_bound: Option<String>,
    /// The root's reaped children's CPU as the root last told it (ns; 0: never
    /// told): a floor for its `cutime`+`cstime` (`root_children`).
    told_children_ns: u64,
    /// The largest RSS of the root's reaped children as it first told it (KiB):
    /// a larger one told later is a child's that it reaped meanwhile.
    told_maxrss_kib: Option<u64>,
    /// The first reading is taken: a member found after it began during the run.
    first_done: bool,
    /// Attached, where the tracker may listen (CAP_NET_ADMIN): every task's exit
    /// on the host with its high-water mark (engine/taskstats.rs), for members
    /// that end between two polls.
    exits: Option<taskstats::Exits>,
    /// Exits not yet found to be members' (the parent's own exit may come
    /// later, or the parent be found at the next poll), with the poll they came
    /// in (`heard`).
    pending: Vec<(taskstats::Exit, u64)>,
    heard: u64,
    /// The peak and the parents the exits' socket filter was last set for
    /// (inner None: unfiltered).
    filtered: Option<Option<(u64, Vec<u32>)>>,
    /// The tracker's own threads as listed while its parent was a member: not
    /// the job's when they end (kernels whose records lack their process).
    own_tids: IdSet,
    /// A record heard carried its process (`ac_tgid`): `own_tids` is not needed.
    records_tgid: bool,
    /// Attached without exits or a told account: a member ended, or reaped a
    /// child, since the first reading, so the peak may lack what it reached
    /// after its last poll.
    unseen_ends: bool,
}

/// Exits kept at most for members found this many polls later.
const PENDING_POLLS: u64 = 2;
/// And at most this many (churn beside the tree is not held without end).
const PENDING_MAX: usize = 1 << 16;

/// A poll's working sets (`ProcfsEngine::scratch`): `all` and `set` are the tree
/// the last `find_tree` found.
#[derive(Default)]
struct Scratch {
    all: IdMap<procread::Stat>,
    set: IdSet,
    known: IdMap<procread::Stat>,
    members: Vec<(u32, u64)>,
    roots: Vec<u32>,
    stack: Vec<u32>,
    kids: Vec<u32>,
}

/// The account of the attached root's parent: its reaped children's CPU
/// (`cutime`, `cstime`), read before the root's stat in the same poll. A parent
/// that reaps the root at once (a shell, a job runner blocked in `wait`) leaves
/// no zombie to read: the root's figures since its last sighting (its own, and
/// the children it reaped meanwhile, often the whole job) are then in the
/// parent's account alone, which grew by at least the root's whole total
/// (`root_from_parent`).
#[derive(Clone, Copy, Debug)]
struct ParentAccount {
    pid: u32,
    starttime: u64,
    cutime: u64,
    cstime: u64,
}

/// Every this many polls the stat of each member that has not run is read again
/// where the kernel scanned for reclaim or collapsed huge pages since the last
/// such poll (`procread::rss_movers`): its RSS falls when the kernel reclaims its
/// pages, which it need not run for (`ProcfsEngine::unchanged`). On a host that
/// reclaims nothing, a tenth-poll pass of 300 idle members' stats was a tenth of
/// an attached sample (docs/cost.md).
const RESTAT_EVERY: u64 = 10;

/// Every this many polls the stats are read again whatever /proc/vmstat says:
/// what moves an idle process's RSS without a count there (another process
/// truncating a file it maps, `process_madvise(MADV_PAGEOUT)`, a debugger's
/// writes) is seen within this many polls.
const RESTAT_ANYWAY: u64 = 60;

/// Whether `pid` ignores SIGCHLD (its children are then reaped by the kernel, and
/// their times are added to no one).
fn ignores_sigchld(pid: u32) -> bool {
    let Ok(status) = std::fs::read_to_string(format!("/proc/{pid}/status")) else {
        return false;
    };
    status
        .lines()
        .find_map(|l| l.strip_prefix("SigIgn:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .is_some_and(|mask| mask & (1 << (libc::SIGCHLD - 1)) != 0)
}

/// A live member's high-water mark (KiB), through its held status file.
fn hwm_of(files: &mut procread::FileCache, buf: &mut String, pid: u32) -> Option<u64> {
    files
        .read(pid, pid, procread::Kind::Status, buf)
        .and_then(|_| procread::parse_hwm(buf))
}

/// Reads all processes of the host: pid → stat.
fn scan() -> IdMap<procread::Stat> {
    let mut out = IdMap::default();
    let mut buf = String::new();
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return out;
    };
    for e in dir.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<u32>().ok()) else {
            continue;
        };
        if let Some(st) = procread::stat(pid, &mut buf) {
            out.insert(pid, st);
        }
    }
    out
}

fn children_index(all: &IdMap<procread::Stat>) -> IdMap<Vec<u32>> {
    let mut kids: IdMap<Vec<u32>> = IdMap::default();
    for (&pid, st) in all {
        kids.entry(st.ppid).or_default().push(pid);
    }
    kids
}

/// The processes under `from` into `into`, the tracker and its own children
/// left out: attached to an ancestor of the tracker (a Python process tracking
/// itself starts the tracker as its child), the observer and what it starts
/// (the Sentinel guardian) are not part of the job.
fn walk(from: &[u32], kids: &IdMap<Vec<u32>>, into: &mut IdSet) {
    let me = std::process::id();
    let mut stack: Vec<u32> = from.to_vec();
    while let Some(p) = stack.pop() {
        if p != me && into.insert(p) {
            if let Some(k) = kids.get(&p) {
                stack.extend(k.iter().copied());
            }
        }
    }
}

/// Children of `pid` from every thread's `/proc/PID/task/TID/children`.
fn children_of(pid: u32, buf: &mut String, out: &mut Vec<u32>) {
    for tid in list_threads(pid) {
        thread_children(pid, tid, buf, out);
    }
}

/// The children a thread's `children` file lists, added to `out`; false when the
/// file is gone (the thread exited).
fn thread_children(pid: u32, tid: u32, buf: &mut String, out: &mut Vec<u32>) -> bool {
    let Ok(f) = std::fs::File::open(format!("/proc/{pid}/task/{tid}/children")) else {
        return false;
    };
    // Plain reads to the end: a `children` file is one line of pids, empty for a
    // thread without children (`read_to_string` would add an fstat and a seek per
    // file).
    let mut bytes = std::mem::take(buf).into_bytes();
    bytes.clear();
    let mut chunk = [0u8; 4096];
    while let Ok(n @ 1..) = std::io::Read::read(&mut &f, &mut chunk) {
        bytes.extend_from_slice(&chunk[..n]);
    }
    *buf = String::from_utf8(bytes).unwrap_or_default();
    out.extend(buf.split_whitespace().filter_map(|x| x.parse::<u32>().ok()));
    true
}

/// A process's threads, from /proc/PID/task.
fn list_threads(pid: u32) -> Vec<u32> {
    std::fs::read_dir(format!("/proc/{pid}/task"))
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Whether this kernel has `/proc/PID/task/TID/children` (CONFIG_PROC_CHILDREN).
fn have_children_files() -> bool {
    let me = std::process::id();
    std::path::Path::new(&format!("/proc/{me}/task/{me}/children")).exists()
}

/// The processes of the tree under `root` (root included) with their threads.
pub fn descendants_with_threads(root: u32) -> Vec<(u32, Vec<u32>)> {
    let all = scan();
    let kids = children_index(&all);
    let mut set = IdSet::default();
    if all.contains_key(&root) {
        walk(&[root], &kids, &mut set);
    }
    set.into_iter()
        .map(|pid| {
            let tids = list_threads(pid);
            (pid, if tids.is_empty() { vec![pid] } else { tids })
        })
        .collect()
}

/// Each of `pids` still running, as (pid, parent, command name).
pub fn names_and_parents(pids: impl Iterator<Item = u32>) -> Vec<(u32, u32, String)> {
    let mut buf = String::new();
    let mut out = Vec::new();
    for pid in pids {
        let Some(st) = procread::stat(pid, &mut buf) else {
            continue;
        };
        if let (Some(a), Some(b)) = (buf.find('('), buf.rfind(')')) {
            if let Some(comm) = buf.get(a + 1..b) {
                out.push((pid, st.ppid, comm.to_string()));
            }
        }
    }
    out
}

impl ProcfsEngine {
    pub fn new(root: u32, reaper: Option<u32>) -> Self {
        let mut buf = String::new();
        let root_start = procread::stat(root, &mut buf).map(|st| st.starttime);
        ProcfsEngine {
            root,
            root_start,
            reaper,
            members: IdMap::default(),
            kept: Figures::default(),
            reaped: IdMap::default(),
            awaiting: IdMap::default(),
            seen: 0,
            exited: 0,
            max_rss_kib: 0,
            tck_ns: 1_000_000_000 / crate::sys::clk_tck(),
            page: crate::sys::page_size(),
            buf,
            live: IdMap::default(),
            children_files: have_children_files(),
            files: procread::FileCache::default(),
            parent_file: None,
            threads: IdMap::default(),
            idle: IdSet::default(),
            vanished: IdSet::default(),
            ran_now: IdMap::default(),
            polls: 0,
            movers: None,
            parent: None,
            root_bound: None,
            told_children_ns: 0,
            told_maxrss_kib: None,
            first_done: false,
            scratch: Scratch::default(),
            exits: None,
            pending: Vec::new(),
            heard: 0,
            filtered: None,
            own_tids: IdSet::default(),
            records_tgid: false,
            unseen_ends: false,
        }
    }

    /// Attached: listens for every exit on the host (engine/taskstats.rs), for
    /// the high-water marks of members that end between two polls; without
    /// CAP_NET_ADMIN the tracker cannot, and says so where it matters.
    pub fn listen_exits(&mut self) {
        match taskstats::Exits::open() {
            Ok(ex) => self.exits = Some(ex),
            Err(e) => {
                log::debug!("taskstats: {e:#}; a member's peak after its last poll is unseen")
            }
        }
    }

    /// Drains the exits heard since the last poll and takes the peaks of those
    /// that were members' (`resolve_exits`).
    fn hear_exits(&mut self) {
        let Some(ex) = &mut self.exits else {
            return;
        };
        let mut got = Vec::new();
        ex.drain(&mut got);
        // Kernels before 5.19 give no record's process: the tracker's own
        // threads, children of a member when the tracker is, are told apart by
        // their ids, listed while they live. Once a record has shown its
        // process, every record will, and the listing is not needed.
        self.records_tgid |= got.iter().any(|e| e.tgid.is_some());
        if !self.records_tgid
            && self
                .members
                .contains_key(&std::os::unix::process::parent_id())
        {
            self.own_tids.extend(list_threads(std::process::id()));
        }
        self.heard += 1;
        let heard = self.heard;
        self.pending.extend(got.into_iter().map(|e| (e, heard)));
        self.resolve_exits();
        self.pending
            .retain(|(_, at)| heard.saturating_sub(*at) < PENDING_POLLS);
        if self.pending.len() > PENDING_MAX {
            let over = self.pending.len() - PENDING_MAX;
            self.pending.drain(..over);
        }
    }

    /// The kernel passes on only the records that can still matter: above the
    /// peak so far, or of a member's child (engine/taskstats.rs, `program`);
    /// set again when either changed. What it drops: a small process two or
    /// more generations below the members that ended unseen, whose large
    /// child's record then finds no member above it.
    fn refilter(&mut self) {
        let Some(ex) = &mut self.exits else {
            return;
        };
        // A tree too large to name is heard unfiltered (None), and its
        // members are not listed every poll to find that out again.
        let now = (self.members.len() < taskstats::FILTER_PARENTS).then(|| {
            let mut parents: Vec<u32> = self.members.keys().copied().collect();
            parents.sort_unstable();
            (self.max_rss_kib, parents)
        });
        if self.filtered.as_ref() == Some(&now) {
            return;
        }
        // Refused: every record comes, and the next poll tries again.
        let set = ex.filter(now.as_ref().map(|(above, parents)| (*above, &parents[..])));
        self.filtered = set.then_some(now);
    }

    /// The pending exits that were members' (a member's thread, or a process
    /// whose parent was a member or one of these): their high-water marks count,
    /// and they are dropped. The tracker's own threads, when its parent is a
    /// member (the package tracking its interpreter), are not the job's.
    fn resolve_exits(&mut self) {
        if self.pending.is_empty() {
            return;
        }
        let me = std::process::id();
        // Without a record's process, a member's thread is known by the
        // member's threads as last listed.
        let tasks: IdSet = if self.pending.iter().any(|(e, _)| e.tgid.is_none()) {
            self.threads
                .values()
                .flat_map(|(_, t)| t.iter().copied())
                .collect()
        } else {
            IdSet::default()
        };
        let mut found = IdSet::default();
        loop {
            let before = found.len();
            let mut i = 0;
            while i < self.pending.len() {
                let e = self.pending[i].0;
                let above = |p: &u32| found.contains(p) || self.members.contains_key(p);
                let ours = match e.tgid {
                    Some(g) => g != me && (above(&e.ppid) || above(&g)),
                    None => {
                        !self.own_tids.contains(&e.tid)
                            && (above(&e.ppid) || above(&e.tid) || tasks.contains(&e.tid))
                    }
                };
                if ours {
                    self.max_rss_kib = self.max_rss_kib.max(e.hiwater_rss_kib);
                    found.insert(e.tgid.unwrap_or(e.tid));
                    self.pending.swap_remove(i);
                } else {
                    i += 1;
                }
            }
            if found.len() == before {
                return;
            }
        }
    }

    /// The tracker reaped `pid` itself (wait4): its rusage is exact and includes every
    /// descendant it waited for; with `io_read`, `exact` holds its I/O as its zombie
    /// had it, which likewise holds theirs.
    pub fn note_reaped(&mut self, pid: u32, exact: Figures, io_read: bool, maxrss_kib: u64) {
        self.max_rss_kib = self.max_rss_kib.max(maxrss_kib);
        if let Some(m) = self.awaiting.remove(&pid) {
            // Vanished before this note came: its last sighting was kept meanwhile,
            // and the exact figures replace it (they are never smaller); without
            // its I/O as a zombie, its I/O as last seen stays.
            let sighting = if io_read {
                m.fig()
            } else {
                Member {
                    io: Figures::default(),
                    ..m
                }
                .fig()
            };
            self.kept.add(&exact);
            self.kept = self.kept.since(&sighting);
            return;
        }
        self.reaped.insert(pid, (exact, io_read));
    }

    /// Whether a child of the tracker (the subreaper) is a zombie: the reaper
    /// thread has yet to reap it, and its exact figures (`note_reaped`) to come.
    /// Until they do, its /proc figures are whole clock ticks read while it ran,
    /// short by up to a tick and by what it ran since; one never seen alive is not
    /// counted at all.
    pub fn zombie_children(&mut self) -> bool {
        let Some(me) = self.reaper else {
            return false;
        };
        let mut kids = Vec::new();
        children_of(me, &mut self.buf, &mut kids);
        kids.into_iter()
            .any(|k| procread::stat(k, &mut self.buf).is_some_and(|st| st.state == b'Z'))
    }

    /// Live processes of the tree at the last `read` (for the GPU attribution).
    pub fn live_pids(&self) -> impl Iterator<Item = u32> + '_ {
        self.live.keys().copied()
    }

    /// A live member's memory signature (engine/pss.rs) from the stat the last
    /// reading read.
    pub fn mem_sig(&self, pid: u32) -> Option<procread::MemSig> {
        self.live.get(&pid).map(procread::MemSig::of)
    }

    /// A process's CPU clock now, kept for this poll (`ran_now`): read before its
    /// stat, so that the same clock at the next poll means it has not run since
    /// that stat (`unchanged`).
    fn clock(&mut self, pid: u32) {
        if let Some(ns) = crate::sys::process_cpu_ns(pid) {
            self.ran_now.insert(pid, ns);
        }
    }

    /// A member's stat through the held file.
    fn stat_of(&mut self, pid: u32) -> Option<procread::Stat> {
        self.files
            .read(pid, pid, procread::Kind::Stat, &mut self.buf)
            .and_then(|_| procread::parse_stat(&self.buf))
    }

    /// A member's stat where it has not run since the last: the process had one
    /// thread and was not running then, and its CPU clock (read here before any
    /// stat of this poll, and kept for the next) is what it was before that stat
    /// was read. Its CPU, children's CPU, faults, I/O, threads and children each
    /// move only while it runs (a fork, a wait, a fault, a read), and a second
    /// thread only comes from one that runs: its io and `children` are not read
    /// again, nor its stat. One `clock_gettime` instead of a stat, an io and a
    /// `children` file (open, read, close). What moves without it running: its
    /// RSS (the kernel reclaims its pages), from its stat when `restat_due` says
    /// (a statm is a third of a stat's work, but on 6.x it sums the per-CPU
    /// counters that a stat's RSS does not, another figure), and its parent, when
    /// that exits (a member that vanished, or the root's parent outside the tree:
    /// its stat is read the poll after).
    fn unchanged(&mut self, pid: u32, restat: bool) -> Option<procread::Stat> {
        let last = *self.live.get(&pid)?;
        if last.num_threads != 1 {
            return None;
        }
        // A process that never ran has nothing to compare: it is read whole.
        let now = self.ran_now.get(&pid).copied().filter(|&ns| ns > 0);
        let before = self.members.get(&pid)?.ran_ns;
        if now.is_none() || before != now || last.state == b'R' {
            return None;
        }
        let st = if restat || self.vanished.contains(&last.ppid) {
            self.stat_of(pid)
                .filter(|st| st.starttime == last.starttime)?
        } else {
            last
        };
        self.idle.insert(pid);
        Some(st)
    }

    /// The children of a process of `num_threads` threads, added to `out`: each
    /// thread's `children` file, over the thread list kept while it holds.
    fn children(&mut self, pid: u32, num_threads: u64, out: &mut Vec<u32>) {
        let from = out.len();
        if let Some((n, tids)) = self.threads.get(&pid) {
            if *n == num_threads
                && tids
                    .iter()
                    .all(|&tid| thread_children(pid, tid, &mut self.buf, out))
            {
                return;
            }
        }
        out.truncate(from);
        let tids = list_threads(pid);
        for &tid in &tids {
            thread_children(pid, tid, &mut self.buf, out);
        }
        self.threads.insert(pid, (num_threads, tids));
    }

    /// The processes under `roots` (roots included), reading only those, into
    /// `out`: pid → stat (`known`: stats read this poll already). Costs O(tree)
    /// instead of a scan of every process of the host.
    fn tree_from(
        &mut self,
        roots: &[u32],
        known: &mut IdMap<procread::Stat>,
        out: &mut IdMap<procread::Stat>,
    ) {
        out.clear();
        let mut stack = std::mem::take(&mut self.scratch.stack);
        let mut kids = std::mem::take(&mut self.scratch.kids);
        stack.clear();
        stack.extend_from_slice(roots);
        let me = std::process::id();
        while let Some(p) = stack.pop() {
            // The tracker and its own children are not the job's (`walk`).
            if p == me || out.contains_key(&p) {
                continue;
            }
            let Some(st) = known.remove(&p).or_else(|| {
                self.clock(p);
                self.stat_of(p)
            }) else {
                continue;
            };
            out.insert(p, st);
            if self.idle.contains(&p) {
                // Its children are members, and roots of their own, already.
                continue;
            }
            kids.clear();
            self.children(p, st.num_threads, &mut kids);
            stack.extend(kids.iter().copied());
        }
        self.threads.retain(|p, _| out.contains_key(p));
        self.scratch.stack = stack;
        self.scratch.kids = kids;
    }

    /// Whether a process of the tree is running (not a zombie) now.
    pub fn tree_alive(&mut self) -> bool {
        self.find_tree();
        let Scratch { all, set, .. } = &self.scratch;
        set.iter().any(|p| {
            all.get(p)
                .is_some_and(|st| st.state != b'Z' && st.state != b'X')
        })
    }

    /// The tree now, in `scratch`: every process read (`all`: pid → stat) and the
    /// members among them (`set`). Roots: the root, known members that are still
    /// the same process (orphans keep membership) and the tracker's other children
    /// when it is the subreaper.
    fn find_tree(&mut self) {
        // The root while it is still the process first seen with its pid.
        let root_start = self.root_start;
        let same_root = |st: &procread::Stat| Some(st.starttime) == root_start;
        if self.children_files {
            // The root's parent before any sighting of the root.
            let parent = self.parent_account();
            // Once a member, the root is checked with the members below.
            let mut roots = std::mem::take(&mut self.scratch.roots);
            let mut known = std::mem::take(&mut self.scratch.known);
            let mut members = std::mem::take(&mut self.scratch.members);
            roots.clear();
            known.clear();
            members.clear();
            self.idle.clear();
            self.ran_now.clear();
            if !self.members.contains_key(&self.root) {
                self.clock(self.root);
                if let Some(st) = self.stat_of(self.root).filter(same_root) {
                    roots.push(self.root);
                    known.insert(self.root, st);
                }
            }
            members.extend(self.members.iter().map(|(&p, m)| (p, m.starttime)));
            let restat = self.restat_due();
            // The root's parent, outside the tree, exited (or its pid is
            // another process's): the root has another parent, and its stat is
            // read again.
            let orphaned = self.reaper.is_none()
                && match (parent, self.parent) {
                    (None, _) => true,
                    (Some(now), Some(was)) => now.pid == was.pid && now.starttime != was.starttime,
                    (Some(_), None) => false,
                };
            if orphaned {
                if let Some(st) = self.live.get(&self.root) {
                    self.vanished.insert(st.ppid);
                }
            }
            for &(pid, start) in &members {
                self.clock(pid);
                if let Some(st) = self.unchanged(pid, restat) {
                    roots.push(pid);
                    known.insert(pid, st);
                } else if let Some(st) = self.stat_of(pid).filter(|st| st.starttime == start) {
                    roots.push(pid);
                    known.insert(pid, st);
                }
            }
            if let Some(me) = self.reaper {
                children_of(me, &mut self.buf, &mut roots);
            }
            self.note_parent(parent, known.get(&self.root));
            let mut all = std::mem::take(&mut self.scratch.all);
            self.tree_from(&roots, &mut known, &mut all);
            let set = &mut self.scratch.set;
            set.clear();
            set.extend(all.keys().copied());
            set.remove(&std::process::id());
            self.scratch.all = all;
            self.scratch.roots = roots;
            self.scratch.known = known;
            self.scratch.members = members;
            return;
        }
        let all = scan();
        let kids = children_index(&all);
        let mut roots: Vec<u32> = Vec::new();
        if all.get(&self.root).is_some_and(same_root) {
            roots.push(self.root);
        }
        roots.extend(
            self.members
                .iter()
                .filter(|(pid, m)| all.get(pid).is_some_and(|st| st.starttime == m.starttime))
                .map(|(&pid, _)| pid),
        );
        if let Some(me) = self.reaper {
            if let Some(k) = kids.get(&me) {
                roots.extend(k.iter().copied());
            }
        }
        roots.retain(|p| all.contains_key(p));
        let mut set = IdSet::default();
        walk(&roots, &kids, &mut set);
        // Attached to an ancestor of the tracker (a Python process tracking itself
        // starts the tracker as its child): the observer is not part of the job.
        set.remove(&std::process::id());
        self.scratch.all = all;
        self.scratch.set = set;
    }

    /// Whether this poll reads the stat of each member that has not run again
    /// (`RESTAT_EVERY`, `RESTAT_ANYWAY`).
    fn restat_due(&mut self) -> bool {
        let n = self.polls;
        self.polls += 1;
        if !n.is_multiple_of(RESTAT_EVERY) {
            return false;
        }
        let now = procread::rss_movers(&mut self.buf);
        let moved = now.is_none() || now != self.movers;
        self.movers = now;
        moved || n.is_multiple_of(RESTAT_ANYWAY)
    }

    /// Attached, with the root a member: its parent's account now (the parent
    /// its last stat named), to read before the root's stat.
    fn parent_account(&mut self) -> Option<ParentAccount> {
        if self.reaper.is_some() {
            return None;
        }
        let pid = match self.members.get(&self.root) {
            Some(m) => m.ppid,
            // The first reading: the root is not a member yet.
            None => {
                procread::stat(self.root, &mut self.buf)
                    .filter(|st| Some(st.starttime) == self.root_start)?
                    .ppid
            }
        };
        // Through the held file: read every poll; a former parent's is closed.
        if let Some(old) = self.parent_file.replace(pid).filter(|&old| old != pid) {
            self.files.forget(old);
        }
        let st = self.stat_of(pid)?;
        Some(ParentAccount {
            pid,
            starttime: st.starttime,
            cutime: st.cutime,
            cstime: st.cstime,
        })
    }

    /// Keeps `parent` as the account before the root's sighting `root` when the
    /// root is still its child; a root not seen this poll keeps the last one.
    fn note_parent(&mut self, parent: Option<ParentAccount>, root: Option<&procread::Stat>) {
        if let Some(st) = root {
            self.parent = parent.filter(|p| p.pid == st.ppid);
        }
    }

    /// The vanished root `m` as its parent's account has it: what the account
    /// gained since the root's last sighting, where that is more than the
    /// sighting holds (the root's zombie was never read: its parent reaped it at
    /// once), and more than `at_least`. The gain is the root's whole total, plus
    /// any other child the parent reaped in the same stretch: a bound from above,
    /// as the sighting is one from below.
    fn root_from_parent(&mut self, m: Member, at_least: u64) -> Member {
        let Some(p) = self.parent.take() else {
            return m;
        };
        let Some(st) =
            procread::stat(p.pid, &mut self.buf).filter(|st| st.starttime == p.starttime)
        else {
            return m;
        };
        let (user, sys) = (
            st.cutime.saturating_sub(p.cutime) * self.tck_ns,
            st.cstime.saturating_sub(p.cstime) * self.tck_ns,
        );
        if user + sys <= at_least {
            return m;
        }
        let detail = format!(
            "the root {} was reaped by its parent {} before its last figures were read: its CPU since its last sighting is what the parent's account gained ({} ms), at most that",
            self.root,
            p.pid,
            (user + sys) / 1_000_000
        );
        log::info!("{detail}");
        self.root_bound = Some(detail);
        Member {
            own_ns: 0,
            child_ns: user + sys,
            user_ns: user,
            sys_ns: sys,
            ..m
        }
    }

    /// A vanished member's last sighting counts from now on.
    fn keep(&mut self, m: &Member) {
        self.kept.add(&m.fig());
    }

    /// Whether a vanished member's figures reached a member's own account: a reaped
    /// child's CPU and I/O go into its reaper's `cutime`/`cstime` and /proc/PID/io,
    /// which a live member reports, or which travel up with a vanished one to its own
    /// reaper. Counting the child too would count it twice.
    fn in_a_members_account(
        &self,
        m: &Member,
        live: &IdSet,
        gone: &IdMap<Member>,
        gone_reaped: &IdSet,
    ) -> bool {
        let mut m = *m;
        // A chain of members that vanished together (a shell and the pipeline it
        // waited for): bounded by the tree's depth, and by this.
        for _ in 0..64 {
            if live.contains(&m.ppid) {
                // A parent that ignores SIGCHLD has its children reaped by the
                // kernel, which adds nothing to the parent.
                return !ignores_sigchld(m.ppid);
            }
            if gone_reaped.contains(&m.ppid) {
                return true;
            }
            // Its parent vanished too. Under `run` the tracker is the subreaper: had
            // the child outlived its parent, the tracker would have reaped it (and
            // its exact figures are counted when they come), so its parent did.
            // Attached, a child that vanished with its parent was reaped by it (a
            // shell waits for its pipeline), and went on into whatever account
            // its parent reaches: a live member's `cutime` counts it there, so it
            // counts here only if its parent's figures are kept rather than
            // accounted (an orphan that lived past its parent stays visible, and
            // is kept when it vanishes on its own).
            let Some(parent) = gone.get(&m.ppid) else {
                return false;
            };
            if self.reaper.is_some() {
                return true;
            }
            m = *parent;
        }
        false
    }

    /// The attached root's reaped children's CPU (ns) and largest RSS (KiB) as
    /// it read them itself (`getrusage(RUSAGE_CHILDREN)`, session/told.rs),
    /// before this engine's next reading. The largest RSS holds every child the
    /// root ever reaped: one above what it first told is that of a child reaped
    /// since, which peaked then or before the tracker came (a child already
    /// running at the start), so a member's high-water mark that may have
    /// fallen between two samples; the same or less says nothing.
    pub fn tell_root_children(&mut self, ns: u64, maxrss_kib: Option<u64>) {
        self.told_children_ns = self.told_children_ns.max(ns);
        let Some(kib) = maxrss_kib else {
            return;
        };
        match self.told_maxrss_kib {
            None => self.told_maxrss_kib = Some(kib),
            Some(first) if kib > first => self.max_rss_kib = self.max_rss_kib.max(kib),
            Some(_) => {}
        }
    }

    /// The root's reaped children's CPU at this reading: its stat's, whole ticks
    /// with `cutime` and `cstime` each floored, or what it told where that is
    /// more. A told figure was read earlier, so it is at most the account now,
    /// which is less than two ticks above the stat's: it makes the first reading
    /// and the last exact, and every reading between at least what was told
    /// first, so that the tree's CPU never goes back. More than the stat's two
    /// ticks was not the root's own reading: it is said, and the stat's stands.
    fn root_children(&mut self, stat_ns: u64) -> u64 {
        let told = self.told_children_ns;
        if told <= stat_ns {
            return stat_ns;
        }
        if told >= stat_ns + 2 * self.tck_ns {
            log::warn!(
                "the root {} told {} ns of its reaped children's CPU, more than its stat's {} ns and two ticks: its stat's figures stand",
                self.root,
                told,
                stat_ns
            );
            self.told_children_ns = 0;
            return stat_ns;
        }
        told
    }

    /// The attached root has exited (its pidfd said so): until its parent, outside
    /// the tree, reaps it, its zombie holds its final figures (its own time and
    /// its reaped children's). Read now, they are its last sighting; the next poll
    /// may find it gone.
    pub fn root_exited(&mut self) {
        self.hear_exits();
        let Some(st) = procread::stat(self.root, &mut self.buf) else {
            return;
        };
        if Some(st.starttime) != self.root_start {
            return;
        }
        let io = procread::io(self.root, &mut self.buf);
        // A zombie's CPU clock holds its threads' whole run time until the reap.
        let clock = crate::sys::process_cpu_ns(self.root);
        let tck = self.tck_ns;
        let children = self.root_children((st.cutime + st.cstime) * tck);
        let Some(m) = self.members.get_mut(&self.root) else {
            return;
        };
        m.set_times(&st, tck, clock);
        m.child_ns = children;
        if let Some(io) = io {
            m.io = io;
        }
        // The zombie's figures now hold every member that the root reaped before it
        // exited, and those a vanished child of it reaped in turn: gone by now, they
        // are in its account and count through it, not with their last sightings
        // (which the next poll would keep, the root being outside every member's
        // account once reaped). Members still there are orphans from here on.
        if ignores_sigchld(self.root) {
            return;
        }
        let buf = &mut self.buf;
        let gone: IdMap<Member> = self
            .members
            .iter()
            .filter(|(&pid, _)| pid != self.root)
            .filter(|(&pid, m)| {
                procread::stat(pid, buf).is_none_or(|st| st.starttime != m.starttime)
            })
            .map(|(&p, &m)| (p, m))
            .collect();
        // The root as the one member left: a chain of vanished members that reaches
        // it is in its account.
        let root = IdSet::from_iter([self.root]);
        let in_root: Vec<u32> = gone
            .iter()
            .filter(|(_, m)| self.in_a_members_account(m, &root, &gone, &IdSet::default()))
            .map(|(&pid, _)| pid)
            .collect();
        for pid in in_root {
            self.members.remove(&pid);
            self.files.forget(pid);
            self.exited += 1;
        }
    }

    /// The reading's counts, peak and degradations once its members are summed.
    fn complete(&mut self, t: &mut TreeTotals) {
        // Reaped by the tracker but never seen alive by a poll: still exact CPU.
        for (pid, (exact, _)) in &self.reaped {
            if !self.members.contains_key(pid) {
                t.fig.add(exact);
            }
        }
        let unseen_reaped = self
            .reaped
            .keys()
            .filter(|p| !self.members.contains_key(p))
            .count() as u64;
        t.procs_spawned = self.seen + unseen_reaped;
        t.procs_exited = self.exited + unseen_reaped;
        t.threads_spawned = t.live_threads;
        // A member found this poll whose child ended before it.
        self.resolve_exits();
        self.refilter();
        t.max_rss_kib = self.max_rss_kib;
        if let Some(d) = &self.root_bound {
            t.degraded.set(degraded::ROOT_FROM_PARENT, d.clone());
        }
        self.degradations(t);
    }

    /// What the peak lacks, attached: exits the kernel dropped, or exits not
    /// heard at all (no CAP_NET_ADMIN) where no told account stands in for the
    /// root's reaped children.
    fn degradations(&mut self, t: &mut TreeTotals) {
        if self.reaper.is_some() {
            return;
        }
        self.unseen_ends |= self.exited > 0;
        match &self.exits {
            Some(ex) if ex.overflowed => t.degraded.set(
                degraded::EXITS_LOST,
                "the kernel dropped task exit records (the taskstats socket's buffer was full): the peak may lack a member that ended between two polls".to_string(),
            ),
            Some(_) => {}
            None if self.unseen_ends && self.told_maxrss_kib.is_none() => t.degraded.set(
                degraded::EXITS_UNHEARD,
                "processes of the tree ended, and without CAP_NET_ADMIN their exits are not heard: the peak is the largest high-water mark of members read alive, and lacks what a member reached after its last poll".to_string(),
            ),
            None => {}
        }
    }

    /// Members that vanished since the last poll: each counted once, with its
    /// exact figures where the tracker reaped it, else its last sighting, unless
    /// a member's account (its reaper's cutime and I/O) holds it already.
    fn retire_gone(&mut self, all: &IdMap<procread::Stat>, set: &IdSet) {
        // Members that vanished since the last poll.
        let gone: Vec<(u32, Member)> = self
            .members
            .iter()
            .filter(|(pid, m)| all.get(pid).is_none_or(|st| st.starttime != m.starttime))
            .map(|(&p, &m)| (p, m))
            .collect();
        // Vanished members the tracker reaped itself: their exact rusage already holds
        // every child they waited for, including children that vanished with them.
        let gone_reaped: IdSet = gone
            .iter()
            .map(|(p, _)| *p)
            .filter(|p| self.reaped.contains_key(p))
            .collect();
        let mut gone_map: IdMap<Member> = gone.iter().copied().collect();
        self.vanished.clear();
        self.vanished.extend(gone.iter().map(|(p, _)| *p));
        // Attached, a root its parent reaped at once counts as that parent's
        // account gained (`root_from_parent`): that holds every member that
        // vanished into the root's account since its last sighting, as a live
        // root's `cutime` would.
        // Taken only where the gain holds the root's sighting and those of the
        // members that would otherwise be kept: an orphan that died elsewhere in
        // the same stretch is not in it, and is kept as before.
        let mut accounts = std::borrow::Cow::Borrowed(set);
        if let Some(&m) = gone_map.get(&self.root).filter(|_| self.reaper.is_none()) {
            let others: u64 = gone
                .iter()
                .filter(|(p, o)| {
                    *p != self.root && !self.in_a_members_account(o, set, &gone_map, &gone_reaped)
                })
                .map(|(_, o)| o.cpu())
                .sum();
            let r = self.root_from_parent(m, m.cpu() + others);
            if r.cpu() != m.cpu() {
                gone_map.insert(self.root, r);
                accounts.to_mut().insert(self.root);
            }
        }
        for (pid, _) in gone {
            self.members.remove(&pid);
            self.files.forget(pid);
            self.exited += 1;
            let m = gone_map[&pid];
            if let Some((exact, io_read)) = self.reaped.remove(&pid) {
                // Exact, which replaces the last sighting; its I/O stays where its
                // zombie's was not read.
                self.kept.add(&exact);
                if !io_read {
                    self.kept.add(&m.io);
                }
            } else if self.reaper == Some(m.ppid) {
                // The tracker reaps it, and its exact figures are on their way: the
                // last sighting stands in until they come.
                self.keep(&m);
                self.awaiting.insert(pid, m);
            } else if pid != self.root
                && self.in_a_members_account(&m, &accounts, &gone_map, &gone_reaped)
            {
                // Its figures are in its reaper's cutime/cstime and I/O, which count.
            } else {
                self.keep(&m);
            }
        }
    }

    pub fn read(&mut self) -> anyhow::Result<TreeTotals> {
        self.find_tree();
        // Before the vanished leave the members: one the poll found gone has
        // its record queued already (the kernel sends it in `do_exit`, before
        // the task can be reaped).
        self.hear_exits();
        let all = std::mem::take(&mut self.scratch.all);
        let set = std::mem::take(&mut self.scratch.set);

        self.retire_gone(&all, &set);
        self.live.clear();
        let mut t = TreeTotals {
            fig: self.kept,
            ..Default::default()
        };
        for &pid in &set {
            let st = all[&pid];
            // An attached root is not a process the tree started.
            let started = pid != self.root || self.reaper.is_some();
            let root_children = (pid == self.root && self.reaper.is_none())
                .then(|| self.root_children((st.cutime + st.cstime) * self.tck_ns));
            let entry = self.members.entry(pid).or_insert_with(|| {
                self.seen += u64::from(started);
                Member {
                    starttime: st.starttime,
                    // A member there from the first reading has its high-water
                    // mark read once it faults again (what it held before the
                    // run is not the run's); one that began since, now.
                    hwm_faults: if self.first_done { u64::MAX } else { st.faults },
                    child_faults: st.child_faults,
                    ..Default::default()
                }
            });
            entry.ppid = st.ppid;
            self.unseen_ends |= st.child_faults != entry.child_faults;
            let clock = self.ran_now.get(&pid).copied();
            entry.ran_ns = clock;
            // Without `children` files the stats came first: the clock after them
            // is exact for its CPU, never a sign that it has not run.
            let clock = clock.or_else(|| crate::sys::process_cpu_ns(pid));
            entry.set_times(&st, self.tck_ns, clock);
            if let Some(ns) = root_children {
                entry.child_ns = ns;
            }
            // RSS grows by the process's own faults (a page mapped; the rest,
            // another process's process_vm_writev or khugepaged filling a huge
            // page, is rare): one that faulted since may have peaked between two
            // samples, and its high-water mark says so while it lives. A member
            // that exits before the next poll takes it with it (procfs sees no
            // exit).
            if st.faults != entry.hwm_faults && st.state != b'Z' {
                entry.hwm_faults = st.faults;
                if let Some(kib) = hwm_of(&mut self.files, &mut self.buf, pid) {
                    self.max_rss_kib = self.max_rss_kib.max(kib);
                }
            }
            if self.idle.contains(&pid) {
                // Its io as last read stands.
            } else if let Some(io) = self
                .files
                .read(pid, pid, procread::Kind::Io, &mut self.buf)
                .and_then(|_| procread::parse_io(&self.buf))
            {
                entry.io = io;
            }
            t.fig.add(&entry.fig());
            if st.state != b'Z' && st.state != b'X' {
                self.live.insert(pid, st);
                t.live_procs += 1;
                t.live_threads += st.num_threads;
                let rss = st.rss_pages * self.page;
                t.rss_bytes += rss;
                self.max_rss_kib = self.max_rss_kib.max(rss / 1024);
                if pid == self.root {
                    t.root_alive = true;
                }
            }
        }
        self.complete(&mut t);
        self.scratch.all = all;
        self.scratch.set = set;
        self.first_done = true;
        Ok(t)
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::{procread, ProcfsEngine};

    /// Waits up to 5 s for `done`.
    fn eventually(mut done: impl FnMut() -> bool) -> bool {
        let t0 = Instant::now();
        while t0.elapsed() < Duration::from_secs(5) {
            if done() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }

    #[test]
    fn a_zombie_child_of_the_reaper_is_seen_until_it_is_reaped() {
        let me = std::process::id();
        let mut child = std::process::Command::new("true")
            .spawn()
            .expect("spawning true");
        let pid = child.id();
        let mut buf = String::new();
        assert!(
            eventually(|| procread::stat(pid, &mut buf).is_some_and(|st| st.state == b'Z')),
            "true never became a zombie"
        );
        let mut e = ProcfsEngine::new(pid, Some(me));
        assert!(e.zombie_children(), "the zombie child {pid} was not seen");
        // Without being the subreaper, the tracker reaps nothing: nothing to wait for.
        assert!(!ProcfsEngine::new(pid, None).zombie_children());
        child.wait().expect("reaping true");
        // Another test's child may be a zombie for a moment.
        assert!(
            eventually(|| !e.zombie_children()),
            "still a zombie after the reap"
        );
    }

    /// A member that has not run since its last reading is not read again (its
    /// CPU clock says so); one that ran is read whole, its new child found, and
    /// the tree's CPU is its CPU clock, to the nanosecond, and its reaped
    /// children's time, to the tick.
    #[test]
    fn a_member_is_read_again_once_it_has_run() {
        let mut child = std::process::Command::new("sh")
            .args([
                "-c",
                "sleep 0.6; i=0; while [ $i -lt 50000 ]; do i=$((i+1)); done; exec sleep 30",
            ])
            .spawn()
            .expect("spawning sh");
        let root = child.id();
        let mut e = ProcfsEngine::new(root, None);
        let mut idle_seen = false;
        for _ in 0..4 {
            e.read().expect("a reading");
            idle_seen |= e.idle.contains(&root);
            std::thread::sleep(Duration::from_millis(100));
        }
        assert!(idle_seen, "the waiting shell was read whole every poll");
        // The loop runs, then the shell becomes `sleep 30`.
        let mut buf = String::new();
        assert!(
            eventually(|| procread::stat(root, &mut buf)
                .is_some_and(|st| st.utime + st.stime > 0 && buf.contains("(sleep)"))),
            "the shell never ran its loop"
        );
        std::thread::sleep(Duration::from_millis(100));
        let t = e.read().expect("a reading");
        assert!(!e.idle.contains(&root), "it ran, yet was kept");
        let st = procread::stat(root, &mut buf).expect("its stat");
        let tck = 1_000_000_000 / crate::sys::clk_tck();
        let clock = crate::sys::process_cpu_ns(root).expect("its CPU clock");
        assert_eq!(
            t.fig.cpu_ns,
            clock + (st.cutime + st.cstime) * tck,
            "{st:?}"
        );
        // The clock is the sum that utime and stime split and floor.
        assert!(clock >= (st.utime + st.stime) * tck, "{clock} {st:?}");
        assert!(clock < (st.utime + st.stime + 2) * tck, "{clock} {st:?}");
        child.kill().ok();
        child.wait().ok();
    }

    /// What the root told of its reaped children's CPU counts where it is above
    /// its stat's ticks by less than two, so that it could be its own reading;
    /// the most told stands for every later reading, and more than two ticks
    /// above the stat is refused for the run.
    #[test]
    fn a_told_account_is_a_floor_within_two_ticks_of_the_stat() {
        let mut e = ProcfsEngine::new(std::process::id(), None);
        let tck = e.tck_ns;
        // Nothing told: the stat's.
        assert_eq!(e.root_children(5 * tck), 5 * tck);
        e.tell_root_children(5 * tck + 7_000, None);
        assert_eq!(e.root_children(5 * tck), 5 * tck + 7_000);
        // The ticks moved past it: theirs.
        assert_eq!(e.root_children(6 * tck), 6 * tck);
        // Told later and higher, though the stat's ticks lag behind it.
        e.tell_root_children(7 * tck + 3, None);
        assert_eq!(e.root_children(6 * tck), 7 * tck + 3);
        // A lower figure told later changes nothing: a floor never falls.
        e.tell_root_children(tck, None);
        assert_eq!(e.root_children(6 * tck), 7 * tck + 3);
        // Two ticks or more above the stat was not the root's reading.
        e.tell_root_children(10 * tck, None);
        assert_eq!(e.root_children(8 * tck), 8 * tck);
        assert_eq!(e.told_children_ns, 0, "refused for the run");
        assert_eq!(e.root_children(8 * tck), 8 * tck);
    }

    /// The children's largest RSS counts where it grew since it was first told:
    /// a child reaped meanwhile had it.
    #[test]
    fn a_childs_peak_counts_where_the_told_largest_rss_grew() {
        let mut e = ProcfsEngine::new(std::process::id(), None);
        e.tell_root_children(0, Some(90_000));
        assert_eq!(e.max_rss_kib, 0, "children reaped before the tracker came");
        e.tell_root_children(0, Some(90_000));
        assert_eq!(e.max_rss_kib, 0, "unchanged: no child of the run is known");
        e.tell_root_children(0, Some(530_000));
        assert_eq!(e.max_rss_kib, 530_000);
        e.tell_root_children(0, None);
        assert_eq!(e.max_rss_kib, 530_000);
    }
}
