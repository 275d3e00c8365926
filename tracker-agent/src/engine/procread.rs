//! Small, allocation-light readers for the per-process /proc files both engines use.
//! Every reader returns `None` when the process vanished or the file is unreadable:
//! members come and go between listing and reading.

use std::{collections::HashMap, fs::File, hash::BuildHasherDefault, os::unix::fs::FileExt};

use tracker_common::Figures;

use super::ids::IdHasher;

/// Reads a small /proc file into `buf` (cleared first). One `read` usually returns
/// the whole file: unlike `read_to_string`, no `statx` for a size hint (always 0 on
/// procfs) and no second `read` to see EOF, which matters at 3 files per member.
pub fn read_into(path: &str, buf: &mut String) -> Option<()> {
    pread_into(&File::open(path).ok()?, buf).ok()
}

/// The kernel's count of what moves a process's RSS while it does not run, from
/// /proc/vmstat: pages scanned for reclaim (a page is scanned before reclaim
/// unmaps it, whether or not it is then freed) and pages collapsed into huge
/// pages (khugepaged fills a range's holes). A sum, to compare with the last.
pub fn rss_movers(buf: &mut String) -> Option<u64> {
    read_into("/proc/vmstat", buf)?;
    Some(
        buf.lines()
            .filter(|l| {
                l.starts_with("pgscan_")
                    || l.starts_with("pgsteal_")
                    || l.starts_with("thp_collapse_alloc ")
            })
            .filter_map(|l| l.split_ascii_whitespace().nth(1)?.parse::<u64>().ok())
            .fold(0u64, u64::wrapping_add),
    )
}

/// The fields of /proc/PID/stat that the engines use.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Stat {
    pub state: u8,
    pub ppid: u32,
    pub utime: u64,
    pub stime: u64,
    pub cutime: u64,
    pub cstime: u64,
    pub num_threads: u64,
    pub starttime: u64,
    pub rss_pages: u64,
    /// The kernel's `PF_*` bits (`PF_EXITING` once it has begun to exit).
    pub flags: u64,
    /// Minor and major page faults of its threads, live and dead: any change to
    /// its own page tables (a page mapped, a copy-on-write broken) is one.
    pub faults: u64,
    /// Those of its reaped children (`cminflt` + `cmajflt`).
    pub child_faults: u64,
}

/// What a member's PSS was read beside (engine/pss.rs): any change to its own
/// page tables is a page fault or a change of its RSS. From its /proc stat, with
/// its start time (the identity of a pid there), or from the kernel's readings
/// (start time 0: the probe's task address is the identity; faults of its live
/// threads). The two never compare equal, so a member read from the other source
/// than before is read again.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemSig {
    pub starttime: u64,
    pub rss_pages: u64,
    pub faults: u64,
}

impl MemSig {
    pub fn of(st: &Stat) -> MemSig {
        MemSig {
            starttime: st.starttime,
            rss_pages: st.rss_pages,
            faults: st.faults,
        }
    }
}

/// `PF_EXITING` in `Stat::flags`.
pub const PF_EXITING: u64 = 0x4;

/// Parses /proc/PID/stat content; the comm field may contain spaces and parentheses.
pub fn parse_stat(s: &str) -> Option<Stat> {
    let close = s.rfind(')')?;
    let mut it = s.get(close + 2..)?.split_ascii_whitespace();
    // Fields from 3 (state) on; nth is 0-based over the remaining fields.
    let state = it.next()?.bytes().next()?;
    let ppid = it.next()?.parse().ok()?;
    let mut it = it.skip(4); // pgrp, session, tty_nr, tpgid (fields 5..8)
    let flags = it.next()?.parse().ok()?; // 9
    let minflt: u64 = it.next()?.parse().ok()?; // 10
    let cminflt: u64 = it.next()?.parse().ok()?; // 11
    let majflt: u64 = it.next()?.parse().ok()?; // 12
    let cmajflt: u64 = it.next()?.parse().ok()?; // 13
    let utime = it.next()?.parse().ok()?; // 14
    let stime = it.next()?.parse().ok()?; // 15
    let cutime: i64 = it.next()?.parse().ok()?; // 16
    let cstime: i64 = it.next()?.parse().ok()?; // 17
    let mut it = it.skip(2); // priority, nice
    let num_threads = it.next()?.parse().ok()?; // 20
    let mut it = it.skip(1); // itrealvalue
    let starttime = it.next()?.parse().ok()?; // 22
    let mut it = it.skip(1); // vsize
    let rss_pages: i64 = it.next()?.parse().ok()?; // 24
    Some(Stat {
        state,
        ppid,
        utime,
        stime,
        cutime: cutime.max(0) as u64,
        cstime: cstime.max(0) as u64,
        num_threads,
        starttime,
        rss_pages: rss_pages.max(0) as u64,
        flags,
        faults: minflt + majflt,
        child_faults: cminflt + cmajflt,
    })
}

pub fn stat(pid: u32, buf: &mut String) -> Option<Stat> {
    read_into(&format!("/proc/{pid}/stat"), buf)?;
    parse_stat(buf)
}

/// A process's high-water mark of resident memory (`VmHWM`, KiB): the most it
/// ever held, between any two samples too, since it began (an exec begins anew).
pub fn hwm_kib(pid: u32, buf: &mut String) -> Option<u64> {
    read_into(&format!("/proc/{pid}/status"), buf)?;
    parse_hwm(buf)
}

/// `VmHWM` (KiB) of a process's status; None for a zombie or a kernel thread.
pub fn parse_hwm(status: &str) -> Option<u64> {
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmHWM:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

/// I/O of a process: its threads, live and dead, and its reaped children.
pub fn io(pid: u32, buf: &mut String) -> Option<Figures> {
    read_into(&format!("/proc/{pid}/io"), buf)?;
    parse_io(buf)
}

/// Parses a /proc io file into the I/O fields of `Figures` (the others stay 0);
/// `None` unless the storage counters are there (`rchar` and `wchar` are 0 where the
/// kernel lacks CONFIG_TASK_XACCT).
pub fn parse_io(s: &str) -> Option<Figures> {
    let mut io = Figures::default();
    let (mut rd, mut wr) = (false, false);
    for line in s.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let Ok(v) = v.trim().parse::<u64>() else {
            continue;
        };
        match k {
            "rchar" => io.rchar = v,
            "wchar" => io.wchar = v,
            "syscr" => io.syscr = v,
            "syscw" => io.syscw = v,
            "read_bytes" => (io.read_bytes, rd) = (v, true),
            "write_bytes" => (io.write_bytes, wr) = (v, true),
            _ => {}
        }
    }
    (rd && wr).then_some(io)
}

/// What smaps_rollup says of a process's memory, in bytes.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Rollup {
    /// Proportional set size: each page divided by the number of processes mapping it.
    pub pss: u64,
    /// Resident pages that another process maps too (`Shared_Clean` + `Shared_Dirty`):
    /// the pages through which a change elsewhere moves this process's PSS.
    pub shared: u64,
}

/// Parses smaps_rollup content; `None` without its `Pss:` line.
pub fn parse_rollup(s: &str) -> Option<Rollup> {
    let mut r = Rollup::default();
    let mut pss = false;
    for line in s.lines() {
        let Some((k, v)) = line.split_once(':') else {
            continue;
        };
        let kib = || -> Option<u64> { v.split_ascii_whitespace().next()?.parse().ok() };
        match k {
            "Pss" => (r.pss, pss) = (kib()? * 1024, true),
            "Shared_Clean" | "Shared_Dirty" => r.shared += kib().unwrap_or(0) * 1024,
            _ => {}
        }
    }
    pss.then_some(r)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn stat_with_odd_comm() {
        let s = "1234 (a) b (c)) S 1 1234 1234 0 -1 4194564 100 9 5 8 7 3 2 1 20 0 4 0 5555 1000 250 18446744073709551615";
        let st = parse_stat(s).unwrap();
        assert_eq!((st.flags & PF_EXITING, st.faults), (PF_EXITING, 105));
        assert_eq!(st.state, b'S');
        assert_eq!(
            (st.ppid, st.utime, st.stime, st.cutime, st.cstime),
            (1, 7, 3, 2, 1)
        );
        assert_eq!((st.num_threads, st.starttime, st.rss_pages), (4, 5555, 250));
        assert!(parse_stat("garbage").is_none());
        assert!(parse_stat("1 (x) S 1").is_none());
    }

    #[test]
    fn rollup_pss_and_shared() {
        let s = "55d0c0a4e000-7ffd8b5f4000 ---p 00000000 00:00 0 [rollup]\n\
                 Rss:                3968 kB\nPss:                 962 kB\n\
                 Pss_Dirty:           160 kB\nShared_Clean:       3520 kB\n\
                 Shared_Dirty:         16 kB\nPrivate_Clean:        0 kB\n";
        let r = parse_rollup(s).unwrap();
        assert_eq!((r.pss, r.shared), (962 * 1024, 3536 * 1024));
        assert!(parse_rollup("Rss: 1 kB\n").is_none());
        let (mut c, mut buf, me) = (FileCache::default(), String::new(), std::process::id());
        c.read(me, me, Kind::Rollup, &mut buf).expect("own rollup");
        let first = parse_rollup(&buf).expect("own rollup parses");
        assert!(first.pss > 0);
        // Held open, read again: a fresh walk, which sees 64 MiB more.
        let held = vec![1u8; 64 << 20];
        c.read(me, me, Kind::Rollup, &mut buf)
            .expect("own rollup again");
        let second = parse_rollup(&buf).expect("own rollup parses");
        assert!(
            second.pss >= first.pss + (60 << 20),
            "{first:?} then {second:?}"
        );
        drop(held);
    }

    #[test]
    fn cached_files_reread_fresh_content() {
        let mut c = FileCache::default();
        let mut buf = String::new();
        let me = std::process::id();
        // This test's own thread: its runtime grows while it spins.
        // SAFETY: gettid has no preconditions.
        let tid = unsafe { libc::gettid() } as u32;
        let thread_cpu_ns = crate::sys::thread_cpu_ns;
        let ticks = |buf: &str| parse_stat(buf).map(|st| st.utime + st.stime).unwrap();
        c.read(me, tid, Kind::Stat, &mut buf).unwrap();
        let a = ticks(&buf);
        let start = thread_cpu_ns();
        while thread_cpu_ns() < start + 60_000_000 {}
        c.read(me, tid, Kind::Stat, &mut buf).unwrap();
        let b = ticks(&buf);
        // 60 ms is six ticks at 100 Hz: more than three however they fall.
        assert!(b >= a + 3, "pread at 0 must regenerate: {a} then {b} ticks");
        assert!(c
            .read(u32::MAX - 1, u32::MAX - 1, Kind::Stat, &mut buf)
            .is_none());
        c.sweep();
        c.sweep();
        assert!(c.files.is_empty());
    }

    #[test]
    fn io_file_with_character_counts() {
        let s = "rchar: 12\nwchar: 34\nsyscr: 1\nsyscw: 2\nread_bytes: 4096\nwrite_bytes: 8192\ncancelled_write_bytes: 0\n";
        assert_eq!(
            parse_io(s),
            Some(Figures {
                rchar: 12,
                wchar: 34,
                syscr: 1,
                syscw: 2,
                read_bytes: 4096,
                write_bytes: 8192,
                ..Figures::default()
            })
        );
        assert_eq!(parse_io("rchar: 1\n"), None);
    }

    #[test]
    fn self_files() {
        let mut buf = String::new();
        let me = std::process::id();
        let st = stat(me, &mut buf).unwrap();
        assert!(st.num_threads >= 1 && st.rss_pages > 0);
        assert!(io(me, &mut buf).is_some());
        let hwm = hwm_kib(me, &mut buf).unwrap();
        assert!(
            hwm * 1024 >= st.rss_pages * crate::sys::page_size(),
            "{hwm} KiB"
        );
        assert!(stat(u32::MAX - 1, &mut buf).is_none());
    }
}

/// `/proc/TGID/NAME` for a process's leader, `/proc/TGID/task/TID/NAME` for a thread.
pub fn task_path(tgid: u32, tid: u32, name: &str) -> String {
    if tgid == tid {
        format!("/proc/{tgid}/{name}")
    } else {
        format!("/proc/{tgid}/task/{tid}/{name}")
    }
}

/// Open /proc files of the tracked members, re-read with `pread` at offset 0 (which
/// regenerates a seq_file's content): a third of the syscalls of open+read+close
/// and no path lookup. Bounded, so a huge tree cannot exhaust descriptors.
#[derive(Default)]
pub struct FileCache {
    /// (tid, kind) → the file and the sweep it was last used in. A tid names one
    /// live task, so the tgid need not be in the key; keyed as one integer, hashed
    /// as it is (SipHash of the tuple and a second map of the keys used showed in
    /// an attached sample's profile).
    files: HashMap<u64, (File, u64), BuildHasherDefault<IdHasher>>,
    sweeps: u64,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Kind {
    Stat,
    /// A process's I/O (`/proc/PID/io`: its threads, live and dead, and its reaped
    /// children).
    Io,
    /// One thread's own I/O (`/proc/TGID/task/TID/io`, for the leader too).
    ThreadIo,
    Schedstat,
    /// A process's smaps_rollup: held open, it is read again at a walk of its
    /// page tables without the open's path lookup and permission check. The file
    /// holds the mm it was opened on: after an exec or an exit it reads nothing,
    /// and is opened again.
    Rollup,
    /// A process's status (its `VmHWM`, `parse_hwm`).
    Status,
}

impl Kind {
    /// Every kind, for `FileCache::forget`: the key has room for eight.
    const ALL: [Kind; 6] = [
        Kind::Stat,
        Kind::Io,
        Kind::ThreadIo,
        Kind::Schedstat,
        Kind::Rollup,
        Kind::Status,
    ];
}

const MAX_CACHED: usize = 3000;

fn key(tid: u32, kind: Kind) -> u64 {
    (u64::from(tid) << 3) | kind as u64
}

impl FileCache {
    /// Reads the file for (tgid, tid, kind) into `buf`.
    pub fn read(&mut self, tgid: u32, tid: u32, kind: Kind, buf: &mut String) -> Option<()> {
        self.read_or_why(tgid, tid, kind, buf).ok()
    }

    /// As `read`, with why it could not: the open's or the read's error, or
    /// `UnexpectedEof` for a file that read nothing (a process past its memory
    /// map: exiting, a zombie, a kernel thread).
    pub fn read_or_why(
        &mut self,
        tgid: u32,
        tid: u32,
        kind: Kind,
        buf: &mut String,
    ) -> std::io::Result<()> {
        let k = key(tid, kind);
        if let Some((f, used)) = self.files.get_mut(&k) {
            *used = self.sweeps;
            if pread_into(f, buf).is_ok() {
                return Ok(());
            }
            // The process is gone (or the pid was reused): open afresh.
            self.files.remove(&k);
        }
        let path = match kind {
            Kind::Stat => task_path(tgid, tid, "stat"),
            Kind::ThreadIo => format!("/proc/{tgid}/task/{tid}/io"),
            Kind::Io => format!("/proc/{tgid}/io"),
            Kind::Schedstat => task_path(tgid, tid, "schedstat"),
            Kind::Rollup => format!("/proc/{tgid}/smaps_rollup"),
            Kind::Status => format!("/proc/{tgid}/status"),
        };
        let f = File::open(path)?;
        pread_into(&f, buf)?;
        if self.files.len() < MAX_CACHED {
            self.files.insert(k, (f, self.sweeps));
        }
        Ok(())
    }

    /// Closes every file held for `tid` (a member that left), for a reader that
    /// knows when its members leave instead of sweeping.
    pub fn forget(&mut self, tid: u32) {
        for kind in Kind::ALL {
            self.files.remove(&key(tid, kind));
        }
    }

    /// Closes the files not read since the last sweep (members that left).
    pub fn sweep(&mut self) {
        let now = self.sweeps;
        self.files.retain(|_, (_, used)| *used == now);
        self.sweeps += 1;
    }
}

/// Reads the whole file from offset 0 into `buf`; an empty file is
/// `UnexpectedEof`.
fn pread_into(f: &File, buf: &mut String) -> std::io::Result<()> {
    let mut bytes = std::mem::take(buf).into_bytes();
    bytes.clear();
    bytes.resize(4096, 0);
    let mut len = 0;
    loop {
        let n = f.read_at(&mut bytes[len..], len as u64)?;
        len += n;
        if n == 0 || len < bytes.len() {
            break;
        }
        bytes.resize(bytes.len() * 2, 0);
    }
    bytes.truncate(len);
    *buf = String::from_utf8(bytes)
        .map_err(|e| std::io::Error::new(std::io::ErrorKind::InvalidData, e))?;
    if len == 0 {
        return Err(std::io::ErrorKind::UnexpectedEof.into());
    }
    Ok(())
}
