//! The command's own cgroups: the kernel's charge for exactly the tracked tree
//! (memory: shared pages once, page cache and kernel memory included, as a
//! container limit would see it; CPU: every nanosecond any member ran, however it
//! ended, as the scheduler charged it).
//!
//! CPU uses the v2 hierarchy where one is mounted (also beside v1's controllers):
//! every v2 cgroup keeps `cpu.stat`, with no controller to enable; else v1's
//! cpuacct. Where memory and CPU would both be v2, one cgroup serves both: a
//! process is in one v2 cgroup only.
//!
//! It is made as a child of the memory cgroup the tracker runs in, so the command
//! keeps every limit and the accounting of the cgroup it starts in (a child is
//! charged to its parents too); the paused command joins it before it execs. v1's
//! memory controller is used where it is mounted, else v2's when the parent already
//! delegates `memory` to its children: the tracker never changes the parent's
//! `cgroup.subtree_control`, which would change every sibling's cgroup as well.
//! Removed at the end, once the tree is gone; a member still alive then is moved
//! back to the cgroup it started in first.

use std::{
    collections::HashSet,
    fmt,
    io::{self, Read as _},
    os::unix::fs::{DirBuilderExt as _, OpenOptionsExt as _},
    path::{Path, PathBuf},
    time::Duration,
};

use super::{
    cgroup::{find, mounts},
    files::{keyed, CachedFile, Roots},
};
use crate::model::reading::{MemParts, MemcgReading, Pressure};

/// statfs magic numbers of the two cgroup file systems.
const CGROUP_SUPER_MAGIC: i64 = 0x0027_e0eb;
const CGROUP2_SUPER_MAGIC: i64 = 0x6367_7270;

/// Why no cgroup could be made for the command; said once, then the next source.
#[derive(Debug)]
pub struct Unavailable(pub String);

impl fmt::Display for Unavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// An I/O failure on `path`, in words a user can act on.
fn io_reason(what: &str, path: &Path, e: &io::Error) -> Unavailable {
    let why = match e.kind() {
        io::ErrorKind::PermissionDenied => "no rights to make cgroups there".to_string(),
        io::ErrorKind::ReadOnlyFilesystem => "the cgroup file system is read-only".to_string(),
        _ if matches!(e.raw_os_error(), Some(libc::ENOSPC | libc::EAGAIN)) => {
            "the cgroup hierarchy is full".to_string()
        }
        _ => e.to_string(),
    };
    Unavailable(format!("{what} {}: {why}", path.display()))
}

/// A member of the tree found outside the cgroup: its figures are no longer the
/// tree's.
#[derive(Clone, Debug, PartialEq)]
pub struct Left {
    pub pid: u32,
    /// Its memory cgroup now (as /proc/PID/cgroup says), or why it is unknown.
    pub cgroup: String,
}

/// What a tree cgroup is made to read.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Controller {
    Memory,
    Cpu,
    /// v1's `cpu` controller, for a CPU quota where no v2 cgroup of the command
    /// takes one (limits.rs).
    Quota,
}

impl Controller {
    /// The v1 controller's name.
    fn v1(self) -> &'static str {
        match self {
            Controller::Memory => "memory",
            Controller::Cpu => "cpuacct",
            Controller::Quota => "cpu",
        }
    }
}

pub struct TreeCgroup {
    dir: PathBuf,
    controller: Controller,
    /// The cgroup the command started in: where members go back before removal.
    parent: PathBuf,
    /// The cgroup's path as /proc/PID/cgroup shows it.
    rel: String,
    v2: bool,
    usage: CachedFile,
    peak: Option<CachedFile>,
    /// `memory.stat`, for the charge's parts (memory cgroups only).
    stat: Option<CachedFile>,
    /// `cpu.pressure`, `memory.pressure`, `io.pressure` (v2 only).
    psi: Option<[CachedFile; 3]>,
    buf: Vec<u8>,
    removed: bool,
    /// Found holding the tree rather than made for it: never moved into, never
    /// removed, and checked every sample for processes that are not the tree's.
    adopted: bool,
    /// This tracker was among the adopted cgroup's processes at the last check:
    /// its own share is in the cgroup's figures.
    tracker_inside: bool,
}

/// The tracker's own cgroup path for `controller` (v1) or, with None, its v2 path.
fn own_path(cgroups: &str, controller: Option<&str>) -> Option<String> {
    cgroups.lines().find_map(|line| {
        let mut it = line.splitn(3, ':');
        let (_, ctrls, path) = (it.next()?, it.next()?, it.next()?);
        let wanted = match controller {
            Some(c) => ctrls.split(',').any(|x| x == c),
            None => ctrls.is_empty(),
        };
        wanted.then(|| path.to_string())
    })
}

fn is_cgroupfs(dir: &Path) -> io::Result<bool> {
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir)?;
    // SAFETY: statfs is plain data filled by the kernel.
    let mut st: libc::statfs = unsafe { std::mem::zeroed() };
    // SAFETY: a valid descriptor and out pointer.
    if unsafe { libc::fstatfs(std::os::fd::AsRawFd::as_raw_fd(&f), &mut st) } != 0 {
        return Err(io::Error::last_os_error());
    }
    #[allow(clippy::unnecessary_cast)] // f_type's type differs between targets
    let magic = st.f_type as i64;
    Ok(magic == CGROUP_SUPER_MAGIC || magic == CGROUP2_SUPER_MAGIC)
}

/// This tracker's PID namespace as its cgroups' names carry it: nothing in the
/// host's (the names of every version before), `ns<inode>-` in another, so that
/// a tracker only ever takes for dead a tracker of its own namespace, where the
/// pid in the name means the same process.
fn ns_tag() -> String {
    match crate::sys::pid_ns() {
        Some(ino) if ino != crate::sys::INIT_PID_NS_INO => format!("ns{ino}-"),
        _ => String::new(),
    }
}

/// The tracker that made the cgroup `name`: its PID namespace's tag (as
/// `ns_tag` writes it) and its pid there; None for a name that is not a
/// tracker's.
fn owner_of(name: &str) -> Option<(&str, u32)> {
    let rest = name.strip_prefix("resource-tracker-")?;
    let (tag, rest) = match rest.strip_prefix("ns") {
        Some(r) => {
            let end = r.find('-')?;
            rest.split_at(end + 3)
        }
        None => ("", rest),
    };
    let pid = rest.split('-').next()?.parse().ok()?;
    Some((tag, pid))
}

/// Removes the cgroups that killed trackers left in `parent` (SIGKILL gives a
/// tracker no chance to remove its own): those named after a pid of this PID
/// namespace with no process here. A cgroup of a tracker in another namespace
/// is never taken for dead (its pid means another process here, or none). Only
/// an empty cgroup can be removed, so one that still holds a dead tracker's
/// command stays until a later sweep.
fn sweep_stale(parent: &Path) {
    let Ok(entries) = std::fs::read_dir(parent) else {
        return;
    };
    let own = ns_tag();
    for e in entries.flatten() {
        let name = e.file_name();
        let Some((tag, pid)) = name.to_str().and_then(owner_of) else {
            continue;
        };
        if tag != own || Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        match std::fs::remove_dir(e.path()) {
            Ok(()) => log::info!(
                "removed {}, left by a tracker that was killed",
                e.path().display()
            ),
            Err(err) => log::debug!("{} stays: {err}", e.path().display()),
        }
    }
}

/// Makes `resource-tracker-PID` (this tracker's pid, then `-1` … `-15`, after
/// `ns_tag`) in `parent`: its path and name. mkdir is exclusive: a cgroup of
/// that name (another tracker's, or one left by a tracker that was killed) is
/// never taken over.
fn make_dir(parent: &Path) -> Result<(PathBuf, String), Unavailable> {
    let me = std::process::id();
    let ns = ns_tag();
    for n in 0..16 {
        let name = if n == 0 {
            format!("resource-tracker-{ns}{me}")
        } else {
            format!("resource-tracker-{ns}{me}-{n}")
        };
        let dir = parent.join(&name);
        match std::fs::DirBuilder::new().mode(0o755).create(&dir) {
            Ok(()) => return Ok((dir, name)),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => continue,
            Err(e) => return Err(io_reason("cannot make a cgroup in", parent, &e)),
        }
    }
    Err(Unavailable(format!(
        "cgroups named resource-tracker-{ns}{me}* exist already in {}",
        parent.display()
    )))
}

/// Writes `pid` into `dir`'s cgroup.procs: the kernel moves that process.
fn write_procs(dir: &Path, pid: u32) -> io::Result<()> {
    use std::io::Write as _;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(dir.join("cgroup.procs"))?;
    f.write_all(pid.to_string().as_bytes())
}

/// PF_EXITING in /proc/PID/stat's flags.
const PF_EXITING: u64 = 0x4;

/// Whether `pid` is gone or exiting. v1 shows an exiting task in the root cgroup
/// ("/"), and cgroup.procs no longer lists it; the flag is set before either, and
/// never cleared, so reading it after the path tells which it was.
pub fn exiting(pid: u32) -> bool {
    let Some((state, _, flags)) = stat_of(pid) else {
        return true;
    };
    matches!(state, b'Z' | b'X' | b'x') || flags & PF_EXITING != 0
}

/// `pid`'s state, parent and flags from /proc/PID/stat; None when it is gone.
fn stat_of(pid: u32) -> Option<(u8, u32, u64)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (_, rest) = stat.rsplit_once(')')?;
    let f: Vec<&str> = rest.split_ascii_whitespace().collect();
    let state = f.first()?.bytes().next()?;
    let ppid = f.get(1)?.parse().ok()?;
    let flags = f.get(6).and_then(|v| v.parse().ok()).unwrap_or(0);
    Some((state, ppid, flags))
}

/// Whether `pid` descends from a member of the tree (`member`) or from this
/// tracker (`me`): a process forked after the backend's last reading of the tree
/// is in the cgroup before it is in the tree's list, and is no stranger (a
/// Python job's pipeline forked between the two readings gave up the cgroup
/// once in a clean-clone run).
fn of_tree(pid: u32, member: &dyn Fn(u32) -> bool, me: u32) -> bool {
    let mut p = pid;
    // Deep enough for any tree's new branch; a cycle cannot form, but a bound
    // keeps a racing reparent from walking long.
    for _ in 0..64 {
        let Some((_, ppid, _)) = stat_of(p) else {
            return false;
        };
        if ppid == me || member(ppid) {
            return true;
        }
        if ppid <= 1 {
            return false;
        }
        p = ppid;
    }
    false
}

/// `usage_usec` of a v2 `cpu.stat`, in ns.
fn usage_usec_ns(text: &[u8]) -> Option<u64> {
    let text = std::str::from_utf8(text).ok()?;
    let us: u64 = text
        .lines()
        .find_map(|l| l.strip_prefix("usage_usec "))?
        .trim()
        .parse()
        .ok()?;
    Some(us * 1000)
}

fn pids(text: &[u8]) -> impl Iterator<Item = u32> + '_ {
    text.split(|&b| b == b'\n')
        .filter_map(|l| std::str::from_utf8(l).ok()?.trim().parse().ok())
}

impl TreeCgroup {
    /// Makes `resource-tracker-PID` (this tracker's pid) under the memory cgroup
    /// the tracker is in.
    pub fn make(roots: &Roots) -> Result<TreeCgroup, Unavailable> {
        Self::make_for(roots, Controller::Memory)
    }

    /// Makes a cgroup for `controller` under the one the tracker is in.
    pub fn make_for(roots: &Roots, controller: Controller) -> Result<TreeCgroup, Unavailable> {
        let read = |p: &str| std::fs::read_to_string(roots.proc.join(p)).unwrap_or_default();
        let (cgroups, mountinfo) = (read("self/cgroup"), read("self/mountinfo"));
        let mounts = mounts(&mountinfo);
        let v1 = || {
            find(&cgroups, &mounts, Some(controller.v1()))
                .zip(own_path(&cgroups, Some(controller.v1())))
                .map(|(d, p)| (d, p, false))
        };
        let v2 = || {
            find(&cgroups, &mounts, None)
                .zip(own_path(&cgroups, None))
                .map(|(d, p)| (d, p, true))
        };
        let found = match controller {
            Controller::Memory => v1().or_else(v2),
            Controller::Cpu => v2().or_else(v1),
            // A process is in one v2 cgroup: a v2 quota goes in that one.
            Controller::Quota => v1(),
        };
        let Some((parent, parent_rel, v2)) = found else {
            return Err(Unavailable(format!(
                "no cgroup file system with the {} controller is mounted",
                controller.v1()
            )));
        };
        if v2 && controller == Controller::Memory {
            let sub = std::fs::read_to_string(parent.join("cgroup.subtree_control"))
                .map_err(|e| io_reason("cannot read the controllers of", &parent, &e))?;
            if !sub.split_whitespace().any(|c| c == "memory") {
                return Err(Unavailable(format!(
                    "the memory controller is not enabled for the children of {} (cgroup.subtree_control)",
                    parent.display()
                )));
            }
        }
        match is_cgroupfs(&parent) {
            Ok(true) => {}
            Ok(false) => {
                return Err(Unavailable(format!(
                    "{} is not a cgroup file system",
                    parent.display()
                )))
            }
            Err(e) => return Err(io_reason("cannot open", &parent, &e)),
        }
        sweep_stale(&parent);
        let (dir, name) = make_dir(&parent)?;
        let rel = format!("{}/{name}", parent_rel.trim_end_matches('/'));
        Self::open(controller, dir, parent, rel, v2, false)
    }

    /// The cgroup `pid` is in for `controller`, taken as it is (a container's, a
    /// systemd scope, a delegated subtree): the tracker never moves a process into
    /// it and never removes it, and whether it holds only the tree is checked
    /// every sample (`strangers`). A hierarchy's root holds the whole machine and
    /// is refused.
    pub fn adopt(
        roots: &Roots,
        pid: u32,
        controller: Controller,
    ) -> Result<TreeCgroup, Unavailable> {
        let file = roots.proc.join(format!("{pid}/cgroup"));
        let cgroups = std::fs::read_to_string(&file)
            .map_err(|e| Unavailable(format!("cannot read {}: {e}", file.display())))?;
        let mountinfo =
            std::fs::read_to_string(roots.proc.join("self/mountinfo")).unwrap_or_default();
        let mounts = mounts(&mountinfo);
        let v1 = find(&cgroups, &mounts, Some(controller.v1()))
            .zip(own_path(&cgroups, Some(controller.v1())))
            .map(|(d, p)| (d, p, false));
        let v2 = find(&cgroups, &mounts, None)
            .zip(own_path(&cgroups, None))
            .map(|(d, p)| (d, p, true));
        let candidates = match controller {
            Controller::Memory => [v1, v2],
            Controller::Cpu => [v2, v1],
            Controller::Quota => [v1, None],
        };
        let mut why = format!(
            "no cgroup file system with the {} controller is mounted",
            controller.v1()
        );
        for (dir, rel, v2) in candidates.into_iter().flatten() {
            if rel.trim_end_matches('/').is_empty() {
                why = format!("pid {pid} is in the root cgroup of {}", dir.display());
                continue;
            }
            match is_cgroupfs(&dir) {
                Ok(true) => {}
                Ok(false) => {
                    why = format!("{} is not a cgroup file system", dir.display());
                    continue;
                }
                Err(e) => {
                    why = format!("cannot open {}: {e}", dir.display());
                    continue;
                }
            }
            match Self::open(controller, dir.clone(), dir, rel, v2, true) {
                Ok(cg) => return Ok(cg),
                Err(e) => why = e.0,
            }
        }
        Err(Unavailable(why))
    }

    /// The tree cgroup's files, opened; `adopted` for one the tracker did not make.
    fn open(
        controller: Controller,
        dir: PathBuf,
        parent: PathBuf,
        rel: String,
        v2: bool,
        adopted: bool,
    ) -> Result<TreeCgroup, Unavailable> {
        let (usage, peak) = match (controller, v2) {
            (Controller::Memory, true) => ("memory.current", "memory.peak"),
            (Controller::Memory, false) => ("memory.usage_in_bytes", "memory.max_usage_in_bytes"),
            // No peak for CPU: the usage only grows.
            (Controller::Cpu, true) => ("cpu.stat", ""),
            (Controller::Cpu, false) => ("cpuacct.usage", ""),
            (Controller::Quota, _) => ("cpu.stat", ""),
        };
        let mut cg = TreeCgroup {
            controller,
            usage: CachedFile::whole(dir.join(usage)),
            peak: (!peak.is_empty() && dir.join(peak).exists())
                .then(|| CachedFile::whole(dir.join(peak))),
            stat: (controller == Controller::Memory)
                .then(|| CachedFile::whole(dir.join("memory.stat"))),
            psi: (v2 && dir.join("cpu.pressure").exists()).then(|| {
                ["cpu.pressure", "memory.pressure", "io.pressure"]
                    .map(|f| CachedFile::whole(dir.join(f)))
            }),
            rel,
            dir,
            parent,
            v2,
            buf: Vec::new(),
            // An adopted cgroup is not ours to remove.
            removed: adopted,
            adopted,
            tracker_inside: false,
        };
        if let Err(e) = cg.usage.read(&mut cg.buf) {
            let r = io_reason("cannot read", cg.usage.path(), &e);
            cg.remove();
            return Err(r);
        }
        Ok(cg)
    }

    /// Whether the cgroup was found holding the tree rather than made for it.
    pub fn is_adopted(&self) -> bool {
        self.adopted
    }

    /// Whether this tracker was among its processes at the last `strangers` check.
    pub fn tracker_inside(&self) -> bool {
        self.tracker_inside
    }

    /// The first process in the cgroup or any cgroup below it that is neither one
    /// of the tree's (`member`), a new child of one, nor this tracker or its own,
    /// and is not on its way out; Err
    /// when a cgroup.procs cannot be read. Notes whether the tracker is inside.
    pub fn strangers(&mut self, member: &dyn Fn(u32) -> bool) -> Result<Option<u32>, String> {
        let me = std::process::id();
        let (mut dirs, mut inside) = (vec![self.dir.clone()], false);
        while let Some(dir) = dirs.pop() {
            let procs = dir.join("cgroup.procs");
            // Opened afresh: v1 keeps a list per open file (see `stray`).
            self.buf.clear();
            std::fs::File::open(&procs)
                .and_then(|mut f| f.read_to_end(&mut self.buf))
                .map_err(|e| format!("{}: {e}", procs.display()))?;
            for pid in pids(&self.buf) {
                if pid == me {
                    inside = true;
                } else if !member(pid) && !exiting(pid) && !of_tree(pid, member, me) {
                    return Ok(Some(pid));
                }
            }
            if let Ok(entries) = std::fs::read_dir(&dir) {
                dirs.extend(
                    entries
                        .flatten()
                        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                        .map(|e| e.path()),
                );
            }
        }
        self.tracker_inside = inside;
        Ok(None)
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    pub fn is_v2(&self) -> bool {
        self.v2
    }

    /// CPU charged to the cgroup, ns: v2's `usage_usec` of `cpu.stat` (present in
    /// every v2 cgroup) or v1's `cpuacct.usage`. None when it cannot be read, or
    /// when this cgroup is v1's memory one (no CPU there).
    pub fn cpu_ns(&mut self) -> Option<u64> {
        match (self.controller, self.v2) {
            (Controller::Cpu, v2) => {
                self.usage.read(&mut self.buf).ok()?;
                if v2 {
                    usage_usec_ns(&self.buf)
                } else {
                    std::str::from_utf8(&self.buf).ok()?.trim().parse().ok()
                }
            }
            (Controller::Memory, true) => {
                self.buf.clear();
                std::fs::File::open(self.dir.join("cpu.stat"))
                    .and_then(|mut h| h.read_to_end(&mut self.buf))
                    .ok()?;
                usage_usec_ns(&self.buf)
            }
            (Controller::Memory, false) | (Controller::Quota, _) => None,
        }
    }

    /// Moves `pid` (the paused command) into the cgroup.
    pub fn place(&self, pid: u32) -> Result<(), Unavailable> {
        write_procs(&self.dir, pid)
            .map_err(|e| io_reason(&format!("cannot move pid {pid} into"), &self.dir, &e))
    }

    /// The cgroup's charge now and its peak; None when the file cannot be read.
    pub fn read(&mut self) -> Option<MemcgReading> {
        self.usage.read(&mut self.buf).ok()?;
        let current = std::str::from_utf8(&self.buf).ok()?.trim().parse().ok()?;
        let peak = self.peak.as_mut().and_then(|f| {
            f.read(&mut self.buf).ok()?;
            std::str::from_utf8(&self.buf).ok()?.trim().parse().ok()
        });
        let v2 = self.v2;
        let parts = self.stat.as_mut().and_then(|f| {
            f.read(&mut self.buf).ok()?;
            parts(std::str::from_utf8(&self.buf).ok()?, v2)
        });
        Some(MemcgReading {
            current,
            peak,
            parts,
        })
    }

    /// The cgroup's stall times (v2 with PSI); None where it keeps none or they
    /// cannot be read.
    pub fn pressure(&mut self) -> Option<Pressure> {
        let files = self.psi.as_mut()?;
        let mut totals = [(0u64, None::<u64>); 3];
        for (f, t) in files.iter_mut().zip(&mut totals) {
            f.read(&mut self.buf).ok()?;
            *t = psi_totals(std::str::from_utf8(&self.buf).ok()?)?;
        }
        pressure_of(totals)
    }

    /// The first of the tree's `live` processes found outside the cgroup (and
    /// outside any cgroup below it), if any. A member that exited in between is
    /// not one.
    pub fn stray(&mut self, live: &HashSet<u32>) -> Option<Left> {
        // Opened afresh each time: v1 keeps a cgroup.procs list per open file and
        // hands it out again on a re-read from offset 0 for a second or so.
        let procs = self.dir.join("cgroup.procs");
        self.buf.clear();
        if let Err(e) = std::fs::File::open(&procs).and_then(|mut f| f.read_to_end(&mut self.buf)) {
            return Some(Left {
                pid: 0,
                cgroup: format!("{} unreadable: {e}", procs.display()),
            });
        }
        let inside: HashSet<u32> = pids(&self.buf).collect();
        let below = format!("{}/", self.rel);
        for &pid in live.iter().filter(|p| !inside.contains(p)) {
            let Some(now) = self.cgroup_of(pid) else {
                continue; // gone
            };
            if now != self.rel && !now.starts_with(&below) && !exiting(pid) {
                return Some(Left { pid, cgroup: now });
            }
        }
        None
    }

    /// The cgroup's id, its directory's inode (what the kernel's `kernfs_node.id`
    /// holds); None where the directory cannot be looked at.
    pub fn id(&self) -> Option<u64> {
        use std::os::unix::fs::MetadataExt as _;
        std::fs::metadata(&self.dir).ok().map(|m| m.ino())
    }

    /// The memory cgroup of `pid` as /proc/PID/cgroup says; None when it is gone.
    fn cgroup_of(&self, pid: u32) -> Option<String> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).ok()?;
        Some(
            own_path(&text, (!self.v2).then_some(self.controller.v1()))
                .unwrap_or_else(|| "(none)".to_string()),
        )
    }

    /// Moves whatever is left back to the cgroup the command started in, then
    /// removes the cgroup. Bounded: members forking as they are moved are moved in
    /// the next round, and a cgroup that stays busy is said once.
    pub fn remove(&mut self) {
        if self.removed {
            return;
        }
        self.removed = true;
        let mut last = None;
        for _ in 0..50 {
            match std::fs::remove_dir(&self.dir) {
                Ok(()) => return,
                Err(e) if e.kind() == io::ErrorKind::NotFound => return,
                Err(e) => last = Some(e),
            }
            let left: Vec<u32> = std::fs::read(self.dir.join("cgroup.procs"))
                .map(|b| pids(&b).collect())
                .unwrap_or_default();
            for pid in &left {
                // A member that exits meanwhile is not an error.
                let _ = write_procs(&self.parent, *pid);
            }
            // Every try waits: a member on its way out is still listed but cannot
            // be moved, and fifty tries without a pause were over before its exit
            // left the cgroup (EBUSY, the cgroup left behind: seen in CI).
            std::thread::sleep(Duration::from_millis(2));
        }
        if let Some(e) = last {
            crate::warn::say(format_args!(
                "cannot remove the cgroup made for the command, {}: {e}",
                self.dir.display()
            ));
        }
    }
}

/// The stall times from the totals of `cpu.pressure`, `memory.pressure` and
/// `io.pressure`, in that order; None where memory or I/O lacks a `full` total.
pub(super) fn pressure_of(totals: [(u64, Option<u64>); 3]) -> Option<Pressure> {
    let [cpu, memory, io] = totals;
    Some(Pressure {
        cpu_some_us: cpu.0,
        cpu_full_us: cpu.1,
        memory_some_us: memory.0,
        memory_full_us: memory.1?,
        io_some_us: io.0,
        io_full_us: io.1?,
    })
}

/// The `some` and `full` totals (µs) of a PSI file: `some avg10=… total=N`, then
/// the `full` line where the kernel keeps one. None without a `some` total.
pub(super) fn psi_totals(text: &str) -> Option<(u64, Option<u64>)> {
    let total = |kind: &str| {
        text.lines()
            .find(|l| l.starts_with(kind))?
            .split_whitespace()
            .find_map(|w| w.strip_prefix("total="))?
            .parse::<u64>()
            .ok()
    };
    Some((total("some ")?, total("full ")))
}

/// The charge's parts from `memory.stat`: v2's `anon`, `file`, `active_file`,
/// `inactive_file`; v1's hierarchical `total_rss`, `total_cache`,
/// `total_active_file`, `total_inactive_file` (the cgroup's own and its
/// children's, as its usage counts them). None when a key is missing.
fn parts(stat: &str, v2: bool) -> Option<MemParts> {
    let get = |key: &str| keyed(stat, key);
    let [anon, file, active, inactive] = if v2 {
        ["anon", "file", "active_file", "inactive_file"]
    } else {
        [
            "total_rss",
            "total_cache",
            "total_active_file",
            "total_inactive_file",
        ]
    };
    Some(MemParts {
        anon: get(anon)?,
        file: get(file)?,
        active_file: get(active)?,
        inactive_file: get(inactive)?,
    })
}

/// The command's CPU as a cgroup counts it: its own (a v1 cpuacct or v2 cgroup),
/// or the memory one where that is v2 (`own` None). The cgroup starts counting at
/// the join; what the paused command ran between its fork and the join is kept
/// apart (`pre_join_ns`).
pub struct TreeCpu {
    pub own: Option<TreeCgroup>,
    pub pre_join_ns: u64,
    /// Found holding the tree (attached), not made for it: it counted what the
    /// tree ran before the tracker came, so only what it adds from the first
    /// sample on is the tree's.
    pub adopted: bool,
}

/// CPU `pid` has run so far, ns (`/proc/PID/schedstat`'s first field, the
/// scheduler's own sum); 0 when it cannot be read.
pub fn ran_ns(pid: u32) -> u64 {
    std::fs::read_to_string(format!("/proc/{pid}/schedstat"))
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

impl Drop for TreeCgroup {
    fn drop(&mut self) {
        self.remove();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_cgroups_owner_is_read_from_its_name() {
        assert_eq!(owner_of("resource-tracker-123"), Some(("", 123)));
        assert_eq!(owner_of("resource-tracker-123-4"), Some(("", 123)));
        assert_eq!(
            owner_of("resource-tracker-ns4026531-77-2"),
            Some(("ns4026531-", 77))
        );
        assert_eq!(owner_of("resource-tracker-ns-1"), Some(("ns-", 1)));
        assert_eq!(owner_of("resource-tracker-x"), None);
        assert_eq!(owner_of("other-123"), None);
    }

    /// A sweep takes for dead only a tracker of its own PID namespace whose pid
    /// has no process: a namespaced tracker's fresh cgroup, whose pid means
    /// nothing here, stays (it was removed under a host tracker, which then
    /// could not move its command in).
    #[test]
    fn a_sweep_leaves_another_namespaces_cgroups() {
        let parent = std::env::temp_dir().join(format!("rt-sweep-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&parent);
        std::fs::create_dir(&parent).unwrap();
        // No pid is above pid_max (at most 2^22).
        let dead = 4_999_999;
        let own = format!("resource-tracker-{}{dead}", ns_tag());
        let other = format!("resource-tracker-ns1-{dead}");
        let alive = format!("resource-tracker-{}{}", ns_tag(), std::process::id());
        for d in [&own, &other, &alive] {
            std::fs::create_dir(parent.join(d)).unwrap();
        }
        sweep_stale(&parent);
        let left = |d: &str| parent.join(d).exists();
        assert!(!left(&own), "a dead tracker's of this namespace is removed");
        assert!(left(&other), "another namespace's stays");
        assert!(left(&alive), "a live tracker's stays");
        let _ = std::fs::remove_dir_all(&parent);
    }

    #[test]
    fn stall_totals() {
        let cpu = "some avg10=0.85 avg60=5.89 avg300=13.28 total=8700561793\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=12\n";
        assert_eq!(psi_totals(cpu), Some((8_700_561_793, Some(12))));
        assert_eq!(
            psi_totals("some avg10=0.00 avg60=0.00 avg300=0.00 total=5\n"),
            Some((5, None))
        );
        assert_eq!(psi_totals("full total=1\n"), None);
    }

    #[test]
    fn the_charges_parts() {
        let v2 = "anon 1048576\nfile 8388608\nkernel 65536\nactive_file 3145728\ninactive_file 4194304\n";
        assert_eq!(
            parts(v2, true),
            Some(MemParts {
                anon: 1 << 20,
                file: 8 << 20,
                active_file: 3 << 20,
                inactive_file: 4 << 20
            })
        );
        let v1 = "cache 1\nrss 2\ninactive_file 3\ntotal_cache 10\ntotal_rss 20\ntotal_active_file 25\ntotal_inactive_file 30\n";
        assert_eq!(
            parts(v1, false),
            Some(MemParts {
                anon: 20,
                file: 10,
                active_file: 25,
                inactive_file: 30
            })
        );
        assert_eq!(parts("anon 1\n", true), None);
    }

    #[test]
    fn own_paths_of_both_versions() {
        let cg = "9:name=systemd:/\n4:memory:/a/b\n3:cpu,cpuacct:/c\n0::/u/v\n";
        assert_eq!(own_path(cg, Some("memory")).as_deref(), Some("/a/b"));
        assert_eq!(own_path(cg, Some("cpuacct")).as_deref(), Some("/c"));
        assert_eq!(own_path(cg, None).as_deref(), Some("/u/v"));
        assert_eq!(own_path("0::/x\n", Some("memory")), None);
        assert_eq!(pids(b"12\n 7\nx\n\n").collect::<Vec<_>>(), vec![12, 7]);
        assert_eq!(
            usage_usec_ns(b"usage_usec 1234567\nuser_usec 1000000\nsystem_usec 234567\n"),
            Some(1_234_567_000)
        );
        assert_eq!(usage_usec_ns(b"user_usec 5\n"), None);
    }

    #[test]
    fn no_memory_hierarchy_is_said() {
        let t = crate::collect::testroot::TestRoot::new("memcgnone");
        let e = TreeCgroup::make(&t.roots()).err().expect("nothing mounted");
        assert!(e.0.contains("memory controller"), "{e}");
    }

    /// A child forked after the tree was listed is the tree's, as is one of this
    /// process's own; a process elsewhere on the machine is not.
    #[test]
    fn a_new_child_of_a_member_is_no_stranger() {
        let mut kid = std::process::Command::new("sleep")
            .arg("5")
            .spawn()
            .expect("sleep");
        let me = std::process::id();
        let parent = std::os::unix::process::parent_id();
        let kid_pid = kid.id();
        // This process as a member, the tracker another process (pid 0: none).
        assert!(of_tree(kid_pid, &|p| p == me, 0));
        // This process as the tracker: its own child.
        assert!(of_tree(kid_pid, &|_| false, me));
        // No member above it: the test's parent is not a descendant of this one.
        assert!(!of_tree(parent, &|p| p == me, 0));
        assert!(!of_tree(kid_pid, &|_| false, 0));
        let _ = kid.kill();
        let _ = kid.wait();
    }

    /// Where this machine lets the test make cgroups (root, a writable cgroupfs
    /// with the memory controller): a child of this process's cgroup is made,
    /// charged for what a process placed in it touches, and removed.
    #[test]
    fn a_child_cgroup_charges_its_member_and_is_removed() {
        let mut cg = match TreeCgroup::make(&Roots::default()) {
            Ok(c) => c,
            Err(e) => {
                // SAFETY: geteuid has no preconditions.
                assert!(
                    unsafe { libc::geteuid() } != 0 || std::env::var_os("CI").is_none(),
                    "root in CI must be able to make a cgroup: {e}"
                );
                eprintln!("SKIPPED: {e}");
                return;
            }
        };
        let dir = cg.dir().to_path_buf();
        let mut child = std::process::Command::new("sh")
            .args([
                "-c",
                "read x; dd if=/dev/zero of=/dev/null bs=32M count=1 status=none; echo done; read y",
            ])
            .stdin(std::process::Stdio::piped())
            .stdout(std::process::Stdio::piped())
            .spawn()
            .expect("sh");
        cg.place(child.id()).expect("placed");
        let live: HashSet<u32> = [child.id()].into();
        assert_eq!(cg.stray(&live), None);
        let before = cg.read().expect("reading");
        use std::io::Write as _;
        let mut stdin = child.stdin.take().expect("stdin");
        stdin.write_all(b"go\n").expect("go");
        // Read once dd is done, however long a busy machine makes that take.
        let mut line = String::new();
        std::io::BufRead::read_line(
            &mut std::io::BufReader::new(child.stdout.take().expect("stdout")),
            &mut line,
        )
        .expect("dd done");
        assert_eq!(line, "done\n");
        let after = cg.read().expect("reading");
        // dd's 32 MiB buffer, every page written.
        assert!(
            after.peak.unwrap_or(after.current) >= before.current + (16 << 20),
            "{before:?} {after:?}"
        );
        // The command left, to the cgroup the test started in: named.
        write_procs(&cg.parent, child.id()).expect("moved out");
        let left = cg.stray(&live).expect("named");
        assert_eq!(left.pid, child.id());
        write_procs(&dir, child.id()).expect("back in");
        drop(stdin);
        // Still running at the end: moved back, and the cgroup is gone.
        cg.remove();
        assert!(!dir.exists(), "{} left behind", dir.display());
        let _ = child.wait();
    }
}
