//! Every container cgroup on the node and the kernel's own accounting of each
//! (`resource-tracker node`). The cost follows the number of containers, not of
//! processes: a few small cgroup files per container, no /proc/PID.
//!
//! Containers are found by the kubelet's cgroup names, for both drivers:
//! systemd `kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod<UID>.slice/
//! cri-containerd-<ID>.scope` (also `crio-`, `docker-`), and cgroupfs
//! `kubepods/burstable/pod<UID>/<ID>`; Guaranteed pods sit directly under kubepods.
//! Other cgroups join by `--include` patterns. On a hybrid host each controller is
//! read from the v1 hierarchy that has it, else from v2 (the same relative path).

use std::{
    path::{Path, PathBuf},
    rc::Rc,
};

use foldhash::{HashMap, HashMapExt as _, HashSet, HashSetExt as _};

use super::files::{keyed, pread_all, End, Roots};
use super::memcg::{pressure_of, psi_totals};
use crate::model::{
    node::{CgroupCounters, DeviceIo, Found},
    reading::Pressure,
};

/// Where each controller's hierarchy is mounted.
#[derive(Clone, Debug, Default)]
pub struct Hierarchies {
    pub v2: Option<PathBuf>,
    pub cpuacct: Option<PathBuf>,
    pub cpu: Option<PathBuf>,
    pub memory: Option<PathBuf>,
    pub blkio: Option<PathBuf>,
    pub pids: Option<PathBuf>,
    /// The host's /sys/dev/block, where a device number is named.
    pub dev_block: PathBuf,
    /// Whether BFQ schedules a block device of the host (v1's BFQ counters
    /// count those only), as at the start.
    pub bfq: bool,
}

impl Hierarchies {
    /// Probed under `roots.sys`/fs/cgroup rather than read from mountinfo, so that a
    /// host's /sys mounted elsewhere (`--host-sys`) is read the same way: a v2-only
    /// host has `cgroup.controllers` there; v1 and hybrid hosts a directory per
    /// controller (and v2 at `unified`).
    pub fn probe(roots: &Roots) -> Hierarchies {
        let base = roots.sys.join("fs/cgroup");
        let dir = |d: PathBuf| d.join("cgroup.procs").exists().then_some(d);
        let dev_block = roots.sys.join("dev/block");
        let bfq = std::fs::read_dir(roots.sys.join("block"))
            .into_iter()
            .flatten()
            .flatten()
            .any(|d| {
                std::fs::read_to_string(d.path().join("queue/scheduler"))
                    .is_ok_and(|t| t.contains("[bfq]"))
            });
        if base.join("cgroup.controllers").exists() {
            return Hierarchies {
                v2: Some(base),
                dev_block,
                ..Default::default()
            };
        }
        Hierarchies {
            v2: dir(base.join("unified")),
            cpuacct: dir(base.join("cpuacct")),
            cpu: dir(base.join("cpu")),
            memory: dir(base.join("memory")),
            blkio: dir(base.join("blkio")),
            pids: dir(base.join("pids")),
            dev_block,
            bfq,
        }
    }

    /// Why no container's cgroup would have pressure files, said where none has.
    pub fn no_pressure_why(&self) -> &'static str {
        if self.v2.is_none() {
            "no cgroup v2 hierarchy: the kernel keeps pressure per cgroup in v2 only"
        } else if !Path::new("/proc/pressure/cpu").exists() {
            "PSI is off in this kernel (boot it with psi=1)"
        } else {
            "the containers' v2 cgroups have no *.pressure files"
        }
    }

    /// The hierarchy whose tree is scanned for containers: v1 cpuacct where it is
    /// mounted (the kubelet makes its cgroups in every v1 controller), else v2.
    pub fn scan_root(&self) -> Option<&Path> {
        self.cpuacct.as_deref().or(self.v2.as_deref())
    }
}

/// The QoS class and pod UID a path component names, for either driver.
fn pod_of(component: &str, parent: &str) -> Option<(String, &'static str)> {
    let qos_of = |s: &str| {
        if s.contains("burstable") {
            "burstable"
        } else if s.contains("besteffort") {
            "besteffort"
        } else {
            "guaranteed"
        }
    };
    // systemd: kubepods-burstable-pod<uid_with_underscores>.slice
    if let Some(stem) = component.strip_suffix(".slice") {
        let (_, uid) = stem.rsplit_once("-pod")?;
        return valid_uid(&uid.replace('_', "-")).map(|u| (u, qos_of(stem)));
    }
    // cgroupfs: pod<uid> under kubepods, kubepods/burstable or kubepods/besteffort
    let uid = component.strip_prefix("pod")?;
    valid_uid(uid).map(|u| (u, qos_of(parent)))
}

/// A UID is 36 characters of hex and dashes (8-4-4-4-12).
fn valid_uid(u: &str) -> Option<String> {
    let parts: Vec<&str> = u.split('-').collect();
    let ok = parts.iter().map(|p| p.len()).eq([8, 4, 4, 4, 12])
        && parts
            .iter()
            .all(|p| p.bytes().all(|b| b.is_ascii_hexdigit()));
    ok.then(|| u.to_ascii_lowercase())
}

/// The runtime's container id in a container cgroup's name.
fn container_of(component: &str) -> Option<String> {
    // systemd scopes end in .scope; CRI-O's cgroupfs manager writes `crio-<ID>`
    // without it, and containerd's and Docker's write the bare id.
    let stem = component.strip_suffix(".scope").unwrap_or(component);
    // The runtime's monitor process is not a container.
    if stem.starts_with("crio-conmon-") {
        return None;
    }
    let id = ["cri-containerd-", "crio-", "docker-", "libpod-"]
        .iter()
        .find_map(|p| stem.strip_prefix(p))
        .unwrap_or(stem);
    (id.len() >= 12 && id.bytes().all(|b| b.is_ascii_hexdigit())).then(|| id.to_string())
}

/// The subdirectories of `dir`, sorted; None when it cannot be listed (missing).
fn subdirs(dir: &Path) -> Option<Vec<String>> {
    let rd = std::fs::read_dir(dir).ok()?;
    let mut v: Vec<String> = rd
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    v.sort();
    Some(v)
}

/// How a kept listing learns that its directory changed.
enum Watch {
    /// An inotify watch: the kernel queues an event at each mkdir, rmdir or rename
    /// in the directory, and a scan with none queued makes no system call for it.
    Notified(inotify::WatchDescriptor),
    /// Its link count, which the cgroup filesystem keeps at 2 + its
    /// subdirectories, by a stat of a kept `O_PATH` descriptor (no path walk, no
    /// buffer): where inotify is not to be had (out of watches, or found not to
    /// see this mount's changes).
    Counted(std::fs::File, u64),
    /// Missing when listed (the top directory of the driver a node does not use):
    /// looked for at each scan.
    Absent,
}

struct Dir {
    watch: Watch,
    list: Rc<[String]>,
    /// The scan that last reached it.
    seen: u64,
}

/// Listings of the kubepods tree kept from one scan to the next, and whether any
/// changed. Listing a pod's directory (open, stat, two getdents, close) was a
/// third of the agent's CPU with 100 containers, and a stat of each kept one a
/// tenth with 500 (perf, 2 vCPU); a scan in which no kept directory changed is
/// the last one's, at the cost of one `read` of the inotify queue. A directory is
/// listed again when it changed, when a container below it vanished (its read
/// failed), and every RELIST_SCANS scans whatever it shows; a watched directory
/// found changed then with no event queued means inotify does not see this
/// mount's changes (another superblock's), and every listing is counted instead.
pub struct Listings {
    dirs: HashMap<PathBuf, Dir>,
    by_wd: HashMap<inotify::WatchDescriptor, PathBuf>,
    stale: HashSet<PathBuf>,
    notify: Option<inotify::Inotify>,
    scans: u64,
    /// How many directories may be kept by descriptor (`Counted`) at once.
    max_kept: usize,
    n_counted: usize,
    /// Containers the last scan found.
    found: usize,
    /// A directory listed in this scan could not be kept: the next scan is a full one.
    unkept: bool,
}

/// Scans after which every directory is listed again.
const RELIST_SCANS: u64 = 30;

fn nlink(f: &std::fs::File) -> u64 {
    use std::os::unix::fs::MetadataExt as _;
    f.metadata().map_or(0, |m| m.nlink())
}

impl Listings {
    /// `max_kept`: how many directories may stay open at once where inotify
    /// cannot watch them.
    pub fn new(max_kept: usize) -> Listings {
        let notify = inotify::Inotify::init()
            .inspect_err(|e| log::info!("inotify: {e}; pod directories are stat'ed each scan"))
            .ok();
        Listings {
            notify,
            ..Listings::counted(max_kept)
        }
    }

    /// Without inotify: each kept directory's link count is checked at each scan.
    pub fn counted(max_kept: usize) -> Listings {
        Listings {
            dirs: HashMap::new(),
            by_wd: HashMap::new(),
            stale: HashSet::new(),
            notify: None,
            scans: 0,
            max_kept,
            n_counted: 0,
            found: 0,
            unkept: false,
        }
    }

    /// Whether the listings are watched by inotify (for the tests).
    #[cfg(test)]
    fn notified(&self) -> bool {
        self.notify.is_some()
    }

    /// Marks the directories that have events queued as stale, and drops the
    /// kept state of those that are gone.
    fn drain(&mut self) {
        let Some(n) = &mut self.notify else {
            return;
        };
        let mut buf = [0u8; 4096];
        loop {
            let events = match n.read_events(&mut buf) {
                Ok(ev) => ev,
                Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => return,
                Err(e) => {
                    log::info!("inotify: {e}; pod directories are stat'ed each scan");
                    self.distrust();
                    return;
                }
            };
            for e in events {
                if e.mask.contains(inotify::EventMask::Q_OVERFLOW) {
                    self.stale.extend(self.dirs.keys().cloned());
                } else if e.mask.contains(inotify::EventMask::IGNORED) {
                    // Removed where the file system says so (not cgroupfs, whose
                    // directories `prune` unwatches), or unmounted.
                    if let Some(p) = self.by_wd.remove(&e.wd) {
                        self.dirs.remove(&p);
                        self.stale.insert(p);
                    }
                } else if let Some(p) = self.by_wd.get(&e.wd) {
                    self.stale.insert(p.clone());
                }
            }
        }
    }

    /// inotify is given up: every watched directory is listed again and counted.
    fn distrust(&mut self) {
        self.notify = None;
        self.by_wd.clear();
        self.dirs
            .retain(|_, d| !matches!(d.watch, Watch::Notified(_)));
        self.unkept = true;
    }

    /// Whether no kept listing can have changed since the last scan, whose output
    /// then stands.
    fn quiet(&mut self) -> bool {
        self.drain();
        for (p, d) in &self.dirs {
            let moved = match &d.watch {
                Watch::Notified(_) => false,
                Watch::Counted(f, n) => {
                    // A file system that keeps no such count (1, as btrfs has) is
                    // listed always.
                    let now = nlink(f);
                    now < 2 || now != *n
                }
                Watch::Absent => p.exists(),
            };
            if moved {
                self.stale.insert(p.clone());
            }
        }
        self.stale.is_empty() && !self.unkept && !self.scans.is_multiple_of(RELIST_SCANS)
    }

    /// A watch on `dir`, made before it is listed: a change during the listing
    /// shows at the next scan.
    fn watch(&mut self, dir: &Path) -> Option<Watch> {
        use std::os::unix::fs::OpenOptionsExt as _;
        if let Some(n) = &self.notify {
            use inotify::WatchMask as M;
            let mask = M::CREATE | M::DELETE | M::MOVE | M::ONLYDIR | M::DONT_FOLLOW;
            match n.watches().add(dir, mask) {
                Ok(wd) => {
                    // The same directory renamed keeps its descriptor.
                    self.by_wd.insert(wd.clone(), dir.to_path_buf());
                    return Some(Watch::Notified(wd));
                }
                Err(e) if e.raw_os_error() == Some(libc::ENOSPC) => {
                    log::debug!("inotify: out of watches at {}", dir.display());
                }
                Err(_) => return None,
            }
        }
        if self.n_counted >= self.max_kept {
            return None;
        }
        let f = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_PATH | libc::O_DIRECTORY | libc::O_CLOEXEC)
            .open(dir)
            .ok()?;
        self.n_counted += 1;
        let n = nlink(&f);
        Some(Watch::Counted(f, n))
    }

    fn subdirs(&mut self, dir: &Path) -> Rc<[String]> {
        let stale = self.stale.remove(dir);
        let relist = self.scans.is_multiple_of(RELIST_SCANS);
        if let Some(d) = self.dirs.get_mut(dir) {
            d.seen = self.scans;
            if !stale && !relist {
                return Rc::clone(&d.list);
            }
        }
        let prev = self.dirs.remove(dir);
        let (watch, before, notified) = match prev {
            Some(Dir {
                watch: Watch::Notified(wd),
                list,
                ..
            }) => (Some(Watch::Notified(wd)), Some(list), !stale),
            Some(Dir {
                watch: Watch::Counted(f, _),
                list,
                ..
            }) => {
                let n = nlink(&f);
                (Some(Watch::Counted(f, n)), Some(list), false)
            }
            Some(Dir { list, .. }) => (self.watch(dir), Some(list), false),
            None => (self.watch(dir), None, false),
        };
        let (list, watch): (Rc<[String]>, _) = match (subdirs(dir), watch) {
            (Some(v), Some(w)) => (v.into(), w),
            (Some(v), None) => {
                self.unkept = true;
                return v.into();
            }
            (None, w) => {
                if let Some(Watch::Counted(..)) = w {
                    self.n_counted -= 1;
                }
                (Rc::from(Vec::new()), Watch::Absent)
            }
        };
        // A watched directory that changed with no event seen, once the queue is
        // read again (the change may be newer than the last read).
        if notified && before.as_deref() != Some(&*list) {
            self.drain();
            if self.notify.is_some() && !self.stale.contains(dir) {
                log::info!(
                    "inotify saw no change to {}, which changed; pod directories are stat'ed each scan",
                    dir.display()
                );
                self.distrust();
                return list;
            }
        }
        let keep = match watch {
            // distrust() may have come between.
            Watch::Notified(_) if self.notify.is_none() => {
                self.unkept = true;
                return list;
            }
            w => w,
        };
        self.dirs.insert(
            dir.to_path_buf(),
            Dir {
                watch: keep,
                list: Rc::clone(&list),
                seen: self.scans,
            },
        );
        list
    }

    /// After a full scan: the state of directories it did not reach goes.
    fn prune(&mut self) {
        let (scans, by_wd, notify, n_counted) = (
            self.scans,
            &mut self.by_wd,
            &self.notify,
            &mut self.n_counted,
        );
        self.dirs.retain(|p, d| {
            if d.seen == scans {
                return true;
            }
            match &d.watch {
                Watch::Notified(wd) => {
                    // Unless the directory was renamed to a path still kept.
                    if by_wd.get(wd) == Some(p) {
                        by_wd.remove(wd);
                        if let Some(n) = notify {
                            let _ = n.watches().remove(wd.clone());
                        }
                    }
                }
                Watch::Counted(..) => *n_counted -= 1,
                Watch::Absent => {}
            }
            false
        });
        let dirs = &self.dirs;
        self.stale.retain(|p| dirs.contains_key(p));
    }

    /// A container at `rel` (under `root`) vanished: its pod and the level above
    /// are listed again at the next scan.
    pub fn vanished(&mut self, root: &Path, rel: &str) {
        let mut d = root.join(rel);
        for _ in 0..2 {
            if !d.pop() {
                break;
            }
            self.stale.insert(d.clone());
        }
    }
}

/// Matches `pattern` against a relative cgroup path: `*` is any run of characters
/// within one component.
fn matches(pattern: &str, rel: &str) -> bool {
    let (p, r): (Vec<&str>, Vec<&str>) = (pattern.split('/').collect(), rel.split('/').collect());
    p.len() == r.len()
        && p.iter()
            .zip(&r)
            .all(|(p, r)| glob(p.as_bytes(), r.as_bytes()))
}

/// `*` matches any run of bytes. Greedy with one backtrack point, so the cost is
/// linear per `*`, not exponential in their number.
fn glob(p: &[u8], s: &[u8]) -> bool {
    let (mut pi, mut si) = (0, 0);
    let mut star: Option<(usize, usize)> = None;
    while si < s.len() {
        if pi < p.len() && p[pi] == b'*' {
            star = Some((pi, si));
            pi += 1;
        } else if pi < p.len() && p[pi] == s[si] {
            pi += 1;
            si += 1;
        } else if let Some((sp, ss)) = star {
            pi = sp + 1;
            si = ss + 1;
            star = Some((sp, ss + 1));
        } else {
            return false;
        }
    }
    p[pi..].iter().all(|&c| c == b'*')
}

/// Every container cgroup under `root`, and the cgroups `include` patterns name;
/// None when no listing changed since the last scan (its output stands).
pub fn scan(root: &Path, include: &[String], kept: &mut Listings) -> Option<Vec<Found>> {
    if kept.quiet() && include.is_empty() {
        kept.scans += 1;
        return None;
    }
    kept.unkept = false;
    // Sized as the last scan found: growing it by doubling made glibc consolidate
    // its freed small chunks at each step (~10 % of the agent's CPU at 500).
    let mut out = Vec::with_capacity(kept.found);
    for top in ["kubepods.slice", "kubepods"] {
        let base = root.join(top);
        let tops = kept.subdirs(&base);
        for a in tops.iter() {
            // a: a pod (Guaranteed) or a QoS level.
            let level = if pod_of(a, top).is_some() {
                None
            } else {
                Some(kept.subdirs(&base.join(a)))
            };
            let pods: Vec<(&str, &str)> = match &level {
                None => vec![(a.as_str(), top)],
                Some(l) => l.iter().map(|b| (b.as_str(), a.as_str())).collect(),
            };
            for (name, parent) in pods {
                let Some((uid, qos)) = pod_of(name, parent) else {
                    continue;
                };
                let rel = if level.is_some() {
                    format!("{top}/{parent}/{name}")
                } else {
                    format!("{top}/{name}")
                };
                for c in kept.subdirs(&root.join(&rel)).iter() {
                    if let Some(id) = container_of(c) {
                        out.push(Found {
                            rel: format!("{rel}/{c}"),
                            pod_uid: Some(uid.clone()),
                            container_id: Some(id),
                            qos: Some(qos),
                            cgroup_id: None,
                        });
                    }
                }
            }
        }
    }
    kept.prune();
    kept.scans += 1;
    if !include.is_empty() {
        let known: HashSet<String> = out.iter().map(|f| f.rel.clone()).collect();
        walk(root, "", 0, &mut |rel| {
            if include.iter().any(|p| matches(p, rel)) && !known.contains(rel) {
                out.push(Found {
                    rel: rel.to_string(),
                    pod_uid: None,
                    container_id: None,
                    qos: None,
                    cgroup_id: None,
                });
            }
        });
    }
    out.sort();
    kept.found = out.len();
    Some(out)
}

/// Calls `f` with every cgroup below `dir` (relative paths), to depth 6.
fn walk(dir: &Path, rel: &str, depth: usize, f: &mut dyn FnMut(&str)) {
    if depth >= 6 {
        return;
    }
    for d in subdirs(dir).unwrap_or_default() {
        let r = if rel.is_empty() {
            d.clone()
        } else {
            format!("{rel}/{d}")
        };
        f(&r);
        walk(&dir.join(&d), &r, depth + 1, f);
    }
}

/// Reads cgroup files with one reused buffer, keeping each container's files open
/// from one read to the next while `max_kept` allows: an open, read and close of a
/// cgroup file costs ~8 µs of CPU here and a read at offset 0 of a kept one ~1.5 µs
/// (2 vCPU, 6.18, 10 files of a v1 container); a node reads about ten a container
/// an interval. A kept file holds ~4.4 KiB of kernel memory (its seq_file page,
/// charged to the agent's cgroup): 4.4 MiB for 100 containers (docs/node.md).
pub struct Reader {
    h: Hierarchies,
    bytes: Vec<u8>,
    /// Boxed: a read moves its container's entry out and back (~300 bytes
    /// each way unboxed, 7 % of the agent's CPU at 500 containers).
    kept: HashMap<String, Box<Kept>>,
    /// The files of the container being read (out of `kept` meanwhile).
    cur: Box<Kept>,
    n_kept: usize,
    max_kept: usize,
    /// Block devices' names by `MAJ:MIN`, looked up once each.
    dev_names: HashMap<Box<str>, std::sync::Arc<str>>,
}

/// One container's files: open, or found missing (None), by name (a file name
/// the reader reads from one hierarchy only).
#[derive(Default)]
struct Kept {
    files: HashMap<&'static str, Option<std::fs::File>>,
    reads: u32,
    /// What the last read found.
    last: Option<CgroupCounters>,
    /// The CPU the container had used when its stall totals were last read.
    pressure_cpu: Option<u64>,
}

/// Every FULL_READS-th read of a container reads all its files, moved or not.
const FULL_READS: u32 = 10;

/// Reads after which a container's missing files are looked for again (a v2
/// controller enabled later).
const RETRY_MISSING: u32 = 30;

/// Every SELDOM_READS-th read of a container reads its limits and its stall
/// totals, moved or not.
const SELDOM_READS: u32 = 30;

/// Bytes read and written, from an I/O file's lines: in all, and by device.
fn io_bytes(c: &mut CgroupCounters, t: &str) {
    c.read_bytes = Some(io_into(c, t, "rbytes", "Read", |d| &mut d.read_bytes));
    c.write_bytes = Some(io_into(c, t, "wbytes", "Write", |d| &mut d.write_bytes));
}

/// Read and write operations, from an I/O file's lines: in all, and by device.
fn io_ops(c: &mut CgroupCounters, t: &str) {
    c.reads = Some(io_into(c, t, "rios", "Read", |d| &mut d.reads));
    c.writes = Some(io_into(c, t, "wios", "Write", |d| &mut d.writes));
}

/// Each device's `KEY=N` (v2 `io.stat`) or `MAJ:MIN Key N` (v1 blkio) into the
/// field `at` picks of its entry in `c.devices` (by `MAJ:MIN` until named); their
/// sum. A device at zero makes no entry.
fn io_into(
    c: &mut CgroupCounters,
    text: &str,
    v2_key: &str,
    v1_key: &str,
    at: fn(&mut DeviceIo) -> &mut u64,
) -> u64 {
    let mut sum = 0u64;
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let Some(dev) = it.next().filter(|d| d.contains(':')) else {
            continue;
        };
        let rest: Vec<&str> = it.collect();
        let v1 = match rest[..] {
            [k, v] if k == v1_key => v.parse().ok(),
            _ => None,
        };
        let v2 = rest
            .iter()
            .find_map(|kv| kv.strip_prefix(v2_key)?.strip_prefix('=')?.parse().ok());
        let Some(n) = v1.or(v2).filter(|&n: &u64| n > 0) else {
            continue;
        };
        sum = sum.saturating_add(n);
        let i = match c.devices.iter().position(|d| &*d.device == dev) {
            Some(i) => i,
            None => {
                c.devices.push(DeviceIo {
                    device: dev.into(),
                    ..Default::default()
                });
                c.devices.len() - 1
            }
        };
        *at(&mut c.devices[i]) = n;
    }
    sum
}

impl Reader {
    /// `max_kept`: how many files may stay open at once (0: each read opens and
    /// closes its file).
    pub fn new(h: Hierarchies, max_kept: usize) -> Reader {
        Reader {
            h,
            bytes: Vec::with_capacity(4096),
            kept: HashMap::new(),
            cur: Box::default(),
            n_kept: 0,
            max_kept,
            dev_names: HashMap::new(),
        }
    }

    /// Closes the files of every container `live` no longer names.
    pub fn retain(&mut self, live: &dyn Fn(&str) -> bool) {
        let n_kept = &mut self.n_kept;
        self.kept.retain(|rel, k| {
            let keep = live(rel);
            if !keep {
                *n_kept -= k.files.values().filter(|f| f.is_some()).count();
            }
            keep
        });
    }

    /// The v2 id of the cgroup at `rel`: its directory's inode number.
    pub fn cgroup_id(&self, rel: &str) -> Option<u64> {
        use std::os::unix::fs::MetadataExt as _;
        std::fs::metadata(self.h.v2.as_ref()?.join(rel))
            .ok()
            .map(|m| m.ino())
    }

    /// The file's text, or None (gone, not enabled).
    fn text(&mut self, base: Option<&PathBuf>, rel: &str, file: &'static str) -> Option<&str> {
        let base = base?;
        let k = &mut self.cur;
        match k.files.get(file) {
            Some(Some(f)) => {
                if pread_all(f, &mut self.bytes, End::Short).is_ok() {
                    return std::str::from_utf8(&self.bytes).ok();
                }
                // Gone with its cgroup (ENODEV): opened again below, or missing.
                k.files.remove(file);
                self.n_kept -= 1;
            }
            Some(None) if !k.reads.is_multiple_of(RETRY_MISSING) => return None,
            _ => {}
        }
        // open, one read, close where not kept: `read_to_string` would add a statx
        // and an lseek per file (6 system calls a file, now 3).
        let Ok(f) = std::fs::File::open(base.join(rel).join(file)) else {
            k.files.insert(file, None);
            return None;
        };
        pread_all(&f, &mut self.bytes, End::Short).ok()?;
        if self.n_kept < self.max_kept {
            k.files.insert(file, Some(f));
            self.n_kept += 1;
        } else {
            k.files.remove(file);
        }
        std::str::from_utf8(&self.bytes).ok()
    }

    fn number(&mut self, base: Option<&PathBuf>, rel: &str, file: &'static str) -> Option<u64> {
        self.text(base, rel, file)?.trim().parse().ok()
    }

    /// The counters of one cgroup; None when its directory is gone (it vanished
    /// between the scan and the read).
    pub fn read(&mut self, rel: &str) -> Option<CgroupCounters> {
        // The container's files are looked up once here, not at each of its ~10
        // files (hashing its ~100-byte path was ~5 % of the agent's CPU).
        let (key, mut k) = self
            .kept
            .remove_entry(rel)
            .unwrap_or_else(|| (rel.to_string(), Box::default()));
        k.reads = k.reads.wrapping_add(1);
        std::mem::swap(&mut self.cur, &mut k);
        let h = std::mem::take(&mut self.h);
        let out = self.counters(&h, rel);
        self.h = h;
        self.cur.last = out.clone();
        std::mem::swap(&mut self.cur, &mut k);
        self.kept.insert(key, k);
        out
    }

    /// The container's bytes of I/O into `c`, and the file that keeps its
    /// operations where that is another (v1), read only on a full read. v1: BFQ's
    /// recursive counters where that scheduler runs; else the throttling layer's,
    /// which the kernel fills only for devices that have a throttle rule
    /// (docs/node.md). v2 keeps bytes and operations in one file.
    fn io_bytes(
        &mut self,
        h: &Hierarchies,
        rel: &str,
        c: &mut CgroupCounters,
    ) -> Option<&'static str> {
        if h.blkio.is_some() {
            let b = h.blkio.as_ref();
            // BFQ's file is there wherever the scheduler is built, and counts only
            // the devices it schedules: "Total 0" alone where it runs on none, or
            // on none the container used. Not read on a host where it schedules
            // no device (it would be one more file per container and interval).
            let bfq = if h.bfq {
                self.text(b, rel, "blkio.bfq.io_service_bytes_recursive")
                    .filter(|t| {
                        t.lines()
                            .any(|l| l.split(' ').next().is_some_and(|d| d.contains(':')))
                    })
            } else {
                None
            };
            return Some(match bfq {
                Some(t) => {
                    io_bytes(c, t);
                    "blkio.bfq.io_serviced_recursive"
                }
                None => {
                    if let Some(t) = self.text(b, rel, "blkio.throttle.io_service_bytes") {
                        io_bytes(c, t);
                    }
                    "blkio.throttle.io_serviced"
                }
            });
        }
        if let Some(t) = self.text(h.v2.as_ref(), rel, "io.stat") {
            io_bytes(c, t);
            io_ops(c, t);
        }
        None
    }

    /// v1's user and system CPU (`cpuacct.stat`, in ticks) and its CFS throttling
    /// (`cpu.stat` of the `cpu` hierarchy) into `c`.
    fn v1_cpu(&mut self, h: &Hierarchies, rel: &str, c: &mut CgroupCounters) {
        let tck = crate::sys::clk_tck().max(1);
        if let Some(t) = self.text(h.cpuacct.as_ref(), rel, "cpuacct.stat") {
            let ns = |ticks: u64| {
                (u128::from(ticks) * 1_000_000_000 / u128::from(tck)).min(u128::from(u64::MAX))
                    as u64
            };
            c.cpu_user_ns = keyed(t, "user").map(ns);
            c.cpu_system_ns = keyed(t, "system").map(ns);
        }
        if let Some(t) = self.text(h.cpu.as_ref(), rel, "cpu.stat") {
            c.cfs_periods = keyed(t, "nr_periods");
            c.cfs_throttled_periods = keyed(t, "nr_throttled");
            c.cfs_throttled_ns = keyed(t, "throttled_time");
        }
    }

    fn counters(&mut self, h: &Hierarchies, rel: &str) -> Option<CgroupCounters> {
        let mut c = CgroupCounters::default();
        // First what moves whenever anything of the container moves: its CPU (a
        // task of it ran: forks, exits, allocations, OOM kills all run in its
        // tasks), its memory charge (reclaim lowers it from outside) and its bytes
        // of I/O (writeback runs in the kernel's threads). v2's cpu.stat and
        // io.stat hold the rest of their controller too.
        if h.cpuacct.is_some() {
            c.cpu_usage_ns = self.number(h.cpuacct.as_ref(), rel, "cpuacct.usage");
            c.cpu_usage_ns?;
        } else {
            let t = self.text(h.v2.as_ref(), rel, "cpu.stat")?;
            let us = |k: &str| keyed(t, k).map(|v| v.saturating_mul(1000));
            c.cpu_usage_ns = us("usage_usec");
            c.cpu_user_ns = us("user_usec");
            c.cpu_system_ns = us("system_usec");
            c.cfs_periods = keyed(t, "nr_periods");
            c.cfs_throttled_periods = keyed(t, "nr_throttled");
            c.cfs_throttled_ns = us("throttled_usec");
        }
        let (mem, usage, peak, stat, inactive_key) = match &h.memory {
            Some(m) => (
                Some(m),
                "memory.usage_in_bytes",
                "memory.max_usage_in_bytes",
                "memory.stat",
                "total_inactive_file",
            ),
            None => (
                h.v2.as_ref(),
                "memory.current",
                "memory.peak",
                "memory.stat",
                "inactive_file",
            ),
        };
        c.memory_bytes = self.number(mem, rel, usage);
        let ops_file = self.io_bytes(h, rel, &mut c);
        // Where none of them moved since the last read, nothing else did: the
        // other files (5 or 6 of 9 on v1, 4 of 7 on v2) are read at every
        // FULL_READS-th read only, which bounds what this misses (inactive pages
        // aged without a charge changing, for the working set).
        if let Some(last) = &self.cur.last {
            let same = last.cpu_usage_ns == c.cpu_usage_ns
                && last.memory_bytes == c.memory_bytes
                && (last.read_bytes, last.write_bytes) == (c.read_bytes, c.write_bytes);
            if same && !self.cur.reads.is_multiple_of(FULL_READS) {
                return Some(last.clone());
            }
        }
        if h.cpuacct.is_some() {
            self.v1_cpu(h, rel, &mut c);
        }
        c.memory_peak_bytes = self.number(mem, rel, peak);
        let inactive = self
            .text(mem, rel, stat)
            .and_then(|t| keyed(t, inactive_key));
        c.working_set_bytes = c
            .memory_bytes
            .map(|u| u.saturating_sub(inactive.unwrap_or(0)));
        if h.memory.is_some() {
            if let Some(t) = self.text(mem, rel, "memory.oom_control") {
                c.oom_kills = keyed(t, "oom_kill");
            }
            // v1 keeps no count of OOM events apart from its kills.
            c.oom_events = c.oom_kills;
        } else if let Some(t) = self.text(mem, rel, "memory.events") {
            c.oom_events = keyed(t, "oom");
            c.oom_kills = keyed(t, "oom_kill");
        }
        if let Some(t) = ops_file.and_then(|f| self.text(h.blkio.as_ref(), rel, f)) {
            io_ops(&mut c, t);
        }
        let pids = h.pids.as_ref().or(h.v2.as_ref());
        c.tasks = self.number(pids, rel, "pids.current");
        self.seldom(h, rel, &mut c);
        self.name_devices(h, &mut c);
        Some(c)
    }

    /// Each device of `c` by its name in /dev (the kernel's DEVNAME), as
    /// cAdvisor's `device` label has it; `MAJ:MIN` where the kernel gives none.
    fn name_devices(&mut self, h: &Hierarchies, c: &mut CgroupCounters) {
        for d in &mut c.devices {
            if let Some(n) = self.dev_names.get(&*d.device) {
                d.device = n.clone();
                continue;
            }
            let named = std::fs::read_to_string(h.dev_block.join(&*d.device).join("uevent"))
                .ok()
                .and_then(|u| {
                    u.lines()
                        .find_map(|l| l.strip_prefix("DEVNAME="))
                        .map(|n| format!("/dev/{}", n.trim()))
                });
            let name: std::sync::Arc<str> = named.map_or_else(|| d.device.clone(), Into::into);
            self.dev_names
                .insert(d.device.as_ref().into(), name.clone());
            d.device = name;
        }
    }

    /// What is read less often than each full read, into `c`: the limits, which
    /// are settings the kubelet changes on a resize only, at every SELDOM_READS-th
    /// read; the stall totals at every FULL_READS-th read where the container's
    /// CPU moved since they were read, else at every SELDOM_READS-th: a PSI file
    /// is dear to show, the kernel sums every CPU's stall times (docs/node.md).
    /// Totals lose nothing by being read late; a stall needs
    /// a task that waits, and a task blocked on I/O for long moves no CPU, so its
    /// `io.pressure` shows within SELDOM_READS reads.
    fn seldom(&mut self, h: &Hierarchies, rel: &str, c: &mut CgroupCounters) {
        let reads = self.cur.reads;
        let Some(last) = self.cur.last.clone() else {
            self.limits(h, rel, c);
            c.pressure = self.pressure(h, rel);
            self.cur.pressure_cpu = c.cpu_usage_ns;
            return;
        };
        let seldom = reads.is_multiple_of(SELDOM_READS);
        if seldom {
            self.limits(h, rel, c);
        } else {
            (c.memory_limit_bytes, c.cpu_quota_us) = (last.memory_limit_bytes, last.cpu_quota_us);
        }
        let moved = self.cur.pressure_cpu != c.cpu_usage_ns;
        if seldom || (moved && reads.is_multiple_of(FULL_READS)) {
            c.pressure = self.pressure(h, rel);
            self.cur.pressure_cpu = c.cpu_usage_ns;
        } else {
            c.pressure = last.pressure;
        }
    }

    /// The memory limit and the CPU quota in place, as the kernel keeps them
    /// (none: unlimited). v1 writes "no limit" as the largest multiple of the page
    /// size it can count, v2 as `max`.
    fn limits(&mut self, h: &Hierarchies, rel: &str, c: &mut CgroupCounters) {
        c.memory_limit_bytes = match &h.memory {
            Some(m) => self
                .number(Some(m), rel, "memory.limit_in_bytes")
                .filter(|&b| b < V1_UNLIMITED),
            None => self.number(h.v2.as_ref(), rel, "memory.max"),
        };
        c.cpu_quota_us = if h.cpuacct.is_some() {
            let quota = self
                .text(h.cpu.as_ref(), rel, "cpu.cfs_quota_us")
                .and_then(|t| t.trim().parse::<u64>().ok());
            quota.and_then(|q| Some((q, self.number(h.cpu.as_ref(), rel, "cpu.cfs_period_us")?)))
        } else {
            self.text(h.v2.as_ref(), rel, "cpu.max").and_then(|t| {
                let (q, p) = t.trim().split_once(' ')?;
                Some((q.parse().ok()?, p.parse().ok()?))
            })
        };
    }

    /// The cgroup's stall times from its v2 `*.pressure` files: the v2 tree's
    /// cgroup at the same path on a hybrid host too. None where the kernel keeps
    /// none (no v2 directory for it, PSI off).
    fn pressure(&mut self, h: &Hierarchies, rel: &str) -> Option<Pressure> {
        let mut totals = [(0u64, None::<u64>); 3];
        for (file, t) in ["cpu.pressure", "memory.pressure", "io.pressure"]
            .into_iter()
            .zip(&mut totals)
        {
            *t = psi_totals(self.text(h.v2.as_ref(), rel, file)?)?;
        }
        pressure_of(totals)
    }
}

/// v1's "no limit": PAGE_COUNTER_MAX pages, ~2^63 bytes; any limit a host can
/// set is far below 2^62.
const V1_UNLIMITED: u64 = 1 << 62;

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collect::testroot::TestRoot;

    const UID: &str = "0b7c3f2e-1d2a-4c5b-8e9f-a0b1c2d3e4f5";
    const ID: &str = "4f9e2b7a1c3d5e6f7a8b9c0d1e2f3a4b5c6d7e8f9a0b1c2d3e4f5a6b7c8d9e0f";

    #[test]
    fn both_drivers_and_every_qos() {
        let t = TestRoot::new("kubepods");
        let u = UID.replace('-', "_");
        for rel in [
            format!("kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{u}.slice/cri-containerd-{ID}.scope"),
            format!("kubepods.slice/kubepods-pod{u}.slice/crio-{ID}.scope"),
            format!("kubepods.slice/kubepods-pod{u}.slice/crio-conmon-{ID}.scope"),
            format!("kubepods/besteffort/pod{UID}/{ID}"),
            format!("kubepods/pod{UID}/{ID}"),
            "kubepods/burstable/podnot-a-uid/abc".to_string(),
            "system.slice/ssh.service".into(),
            "system.slice/cron.service".into(),
            "user.slice".into(),
        ] {
            t.mkdir(&format!("cg/{rel}"));
        }
        let found = scan(
            &t.path("cg"),
            &["system.slice/ssh.*".into()],
            &mut Listings::new(64),
        )
        .expect("a first scan");
        let got: Vec<(Option<&str>, Option<&str>, bool)> = found
            .iter()
            .map(|f| {
                (
                    f.qos,
                    f.pod_uid.as_deref(),
                    f.container_id.as_deref() == Some(ID),
                )
            })
            .collect();
        assert_eq!(
            got,
            vec![
                (Some("burstable"), Some(UID), true),
                (Some("guaranteed"), Some(UID), true),
                (Some("besteffort"), Some(UID), true),
                (Some("guaranteed"), Some(UID), true),
                (None, None, false),
            ],
            "{found:#?}"
        );
        assert_eq!(found[4].rel, "system.slice/ssh.service");
    }

    #[test]
    fn hybrid_counters_from_each_hierarchy() {
        let t = TestRoot::new("cgcount");
        let rel = "kubepods/pod1/c";
        for (c, files) in [
            (
                "cpuacct",
                vec![
                    ("cpuacct.usage", "2500000000\n"),
                    ("cpuacct.stat", "user 150\nsystem 50\n"),
                ],
            ),
            (
                "cpu",
                vec![(
                    "cpu.stat",
                    "nr_periods 10\nnr_throttled 2\nthrottled_time 300000000\n",
                )],
            ),
            (
                "memory",
                vec![
                    ("memory.usage_in_bytes", "1048576\n"),
                    ("memory.max_usage_in_bytes", "2097152\n"),
                    ("memory.stat", "cache 0\ntotal_inactive_file 4096\n"),
                    (
                        "memory.oom_control",
                        "oom_kill_disable 0\nunder_oom 0\noom_kill 3\n",
                    ),
                ],
            ),
            (
                "blkio",
                vec![
                    (
                        "blkio.throttle.io_service_bytes",
                        "8:0 Read 100\n8:0 Write 200\n8:0 Total 300\nTotal 300\n",
                    ),
                    ("blkio.throttle.io_serviced", "8:0 Read 1\n8:0 Write 2\n"),
                ],
            ),
            ("pids", vec![("pids.current", "5\n")]),
        ] {
            for (f, body) in files {
                t.write(&format!("sys/fs/cgroup/{c}/{rel}/{f}"), body);
            }
            t.write(&format!("sys/fs/cgroup/{c}/cgroup.procs"), "");
        }
        let h = Hierarchies::probe(&t.roots());
        assert!(h.v2.is_none());
        assert_eq!(
            h.scan_root(),
            Some(t.path("sys/fs/cgroup/cpuacct").as_path())
        );
        let mut r = Reader::new(h, 64);
        let c = r.read(rel).unwrap();
        let tck = crate::sys::clk_tck();
        assert_eq!(c.cpu_usage_ns, Some(2_500_000_000));
        assert_eq!(c.cpu_user_ns, Some(150 * 1_000_000_000 / tck));
        assert_eq!(
            (c.cfs_periods, c.cfs_throttled_periods, c.cfs_throttled_ns),
            (Some(10), Some(2), Some(300_000_000))
        );
        assert_eq!(
            (c.memory_bytes, c.working_set_bytes, c.memory_peak_bytes),
            (Some(1048576), Some(1048576 - 4096), Some(2097152))
        );
        assert_eq!(c.oom_kills, Some(3));
        assert_eq!(
            (c.read_bytes, c.write_bytes, c.reads, c.writes),
            (Some(100), Some(200), Some(1), Some(2))
        );
        assert_eq!(c.tasks, Some(5));
        // Gone between the scan and the read.
        assert_eq!(r.read("kubepods/pod1/gone"), None);
    }

    #[test]
    fn v2_counters() {
        let t = TestRoot::new("cgv2count");
        let rel = "kubepods.slice/p/c";
        for (f, body) in [
            ("cpu.stat", "usage_usec 1500\nuser_usec 1000\nsystem_usec 500\nnr_periods 4\nnr_throttled 1\nthrottled_usec 20\n"),
            ("memory.current", "8192\n"),
            ("memory.peak", "16384\n"),
            ("memory.stat", "anon 1\ninactive_file 4096\n"),
            ("memory.events", "low 0\nhigh 0\nmax 2\noom 1\noom_kill 1\n"),
            ("io.stat", "8:0 rbytes=10 wbytes=20 rios=1 wios=2 dbytes=0 dios=0\n253:0 rbytes=0 wbytes=0 rios=0 wios=0 dbytes=0 dios=0\n259:1 rbytes=5 wbytes=0 rios=1 wios=0 dbytes=0 dios=0\n"),
            ("pids.current", "3\n"),
            ("memory.max", "max\n"),
            ("cpu.max", "50000 100000\n"),
            ("cpu.pressure", "some avg10=0.00 avg60=0.00 avg300=0.00 total=700\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=30\n"),
            ("memory.pressure", "some avg10=0.00 avg60=0.00 avg300=0.00 total=60\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=50\n"),
            ("io.pressure", "some avg10=0.00 avg60=0.00 avg300=0.00 total=9\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=8\n"),
        ] {
            t.write(&format!("sys/fs/cgroup/{rel}/{f}"), body);
        }
        t.write("sys/fs/cgroup/cgroup.controllers", "cpu io memory pids\n");
        t.write(
            "sys/dev/block/8:0/uevent",
            "MAJOR=8\nMINOR=0\nDEVNAME=sda\nDEVTYPE=disk\n",
        );
        let mut r = Reader::new(Hierarchies::probe(&t.roots()), 64);
        let c = r.read(rel).unwrap();
        // By device, named as in /dev (MAJ:MIN where /sys names none); none at zero.
        let dev = |device: &str, rb, wb, r, w| DeviceIo {
            device: device.into(),
            read_bytes: rb,
            write_bytes: wb,
            reads: r,
            writes: w,
        };
        assert_eq!(
            c.devices,
            [dev("/dev/sda", 10, 20, 1, 2), dev("259:1", 5, 0, 1, 0)]
        );
        // Unlimited memory is no limit; the quota and its period as written.
        assert_eq!(
            (c.memory_limit_bytes, c.cpu_quota_us),
            (None, Some((50_000, 100_000)))
        );
        assert_eq!(
            c.pressure,
            Some(Pressure {
                cpu_some_us: 700,
                cpu_full_us: Some(30),
                memory_some_us: 60,
                memory_full_us: 50,
                io_some_us: 9,
                io_full_us: 8,
            })
        );
        assert_eq!(
            (c.cpu_usage_ns, c.cpu_user_ns, c.cpu_system_ns),
            (Some(1_500_000), Some(1_000_000), Some(500_000))
        );
        assert_eq!(
            (c.cfs_periods, c.cfs_throttled_periods, c.cfs_throttled_ns),
            (Some(4), Some(1), Some(20_000))
        );
        assert_eq!(
            (c.memory_bytes, c.working_set_bytes, c.memory_peak_bytes),
            (Some(8192), Some(4096), Some(16384))
        );
        assert_eq!((c.oom_events, c.oom_kills), (Some(1), Some(1)));
        assert_eq!(
            (c.read_bytes, c.write_bytes, c.reads, c.writes),
            (Some(15), Some(20), Some(2), Some(2))
        );
        assert_eq!(c.tasks, Some(3));
    }

    /// v1's BFQ counters where BFQ schedules a device the container used; the
    /// throttling layer's where its file holds no device (BFQ built, scheduling
    /// none the container used), and alone on a host where BFQ schedules none.
    #[test]
    fn v1_io_from_bfq_only_where_it_schedules() {
        for (scheduler, bfq_file, want) in [
            (
                "none [mq-deadline] kyber bfq\n",
                "8:0 Read 7\nTotal 7\n",
                100,
            ),
            ("mq-deadline kyber [bfq] none\n", "8:0 Read 7\nTotal 7\n", 7),
            ("mq-deadline kyber [bfq] none\n", "Total 0\n", 100),
        ] {
            let t = TestRoot::new("cgbfq");
            let rel = "kubepods/pod1/c";
            let b = |f: &str| format!("sys/fs/cgroup/blkio/{rel}/{f}");
            t.write(&format!("sys/fs/cgroup/cpuacct/{rel}/cpuacct.usage"), "1\n");
            t.write(b("blkio.bfq.io_service_bytes_recursive").as_str(), bfq_file);
            t.write(
                b("blkio.throttle.io_service_bytes").as_str(),
                "8:0 Read 100\nTotal 100\n",
            );
            for c in ["cpuacct", "blkio"] {
                t.write(&format!("sys/fs/cgroup/{c}/cgroup.procs"), "");
            }
            t.write("sys/block/sda/queue/scheduler", scheduler);
            let mut r = Reader::new(Hierarchies::probe(&t.roots()), 64);
            let c = r.read(rel).unwrap();
            assert_eq!(c.read_bytes, Some(want), "{scheduler} {bfq_file:?}");
        }
    }

    /// Kept files are read again from their start; a file found missing is looked
    /// for again after RETRY_MISSING reads; no more than `max_kept` stay open, and
    /// a container's go when it does.
    #[test]
    fn kept_files_read_afresh_within_their_bound() {
        let t = TestRoot::new("cgkept");
        t.write("sys/fs/cgroup/cgroup.controllers", "cpu memory pids\n");
        for c in ["a", "b"] {
            t.write(&format!("sys/fs/cgroup/k/{c}/cpu.stat"), "usage_usec 1\n");
            t.write(&format!("sys/fs/cgroup/k/{c}/memory.current"), "4096\n");
        }
        let mut r = Reader::new(Hierarchies::probe(&t.roots()), 3);
        assert_eq!(r.read("k/a").unwrap().memory_bytes, Some(4096));
        assert_eq!(r.read("k/b").unwrap().memory_bytes, Some(4096));
        assert_eq!(r.n_kept, 3);
        // Rewritten in place, as the kernel regenerates a cgroup file at offset 0.
        t.write("sys/fs/cgroup/k/a/cpu.stat", "usage_usec 123456\n");
        t.write("sys/fs/cgroup/k/b/memory.current", "8192\n");
        assert_eq!(r.read("k/a").unwrap().cpu_usage_ns, Some(123_456_000));
        assert_eq!(r.read("k/b").unwrap().memory_bytes, Some(8192));
        assert_eq!(r.read("k/a").unwrap().tasks, None);
        t.write("sys/fs/cgroup/k/a/pids.current", "7\n");
        let mut seen = 0;
        for i in 0..RETRY_MISSING {
            if r.read("k/a").unwrap().tasks == Some(7) {
                seen = i;
                break;
            }
        }
        assert!(seen > 0 && seen < RETRY_MISSING, "seen at read {seen}");
        assert_eq!(r.n_kept, 3);
        r.retain(&|rel| rel == "k/b");
        assert_eq!(
            (r.kept.len(), r.n_kept),
            (1, r.kept["k/b"].files.values().flatten().count())
        );
        assert_eq!(r.read("k/b").unwrap().memory_bytes, Some(8192));
    }

    /// A container whose CPU, memory charge and I/O bytes did not move keeps its
    /// other figures until one of them moves or the FULL_READS-th read.
    #[test]
    fn an_unmoved_container_reads_three_files() {
        let t = TestRoot::new("cgprobe");
        t.write("sys/fs/cgroup/cgroup.controllers", "cpu io memory pids\n");
        let f = |n: &str| format!("sys/fs/cgroup/k/a/{n}");
        t.write(&f("cpu.stat"), "usage_usec 1\n");
        t.write(&f("memory.current"), "4096\n");
        t.write(&f("io.stat"), "8:0 rbytes=1 wbytes=2 rios=1 wios=1\n");
        t.write(&f("pids.current"), "1\n");
        let mut r = Reader::new(Hierarchies::probe(&t.roots()), 64);
        assert_eq!(r.read("k/a").unwrap().tasks, Some(1));
        t.write(&f("pids.current"), "2\n");
        assert_eq!(r.read("k/a").unwrap().tasks, Some(1));
        // Writeback: bytes written with no task of it running.
        t.write(&f("io.stat"), "8:0 rbytes=1 wbytes=4098 rios=1 wios=2\n");
        let c = r.read("k/a").unwrap();
        assert_eq!((c.tasks, c.write_bytes), (Some(2), Some(4098)));
        t.write(&f("pids.current"), "3\n");
        let mut n = 0;
        while r.read("k/a").unwrap().tasks != Some(3) {
            n += 1;
            assert!(n < FULL_READS, "never read in full");
        }
        assert!(n > 0);
    }

    /// An active container's stall totals are read at every FULL_READS-th read,
    /// an idle one's and the limits at every SELDOM_READS-th.
    #[test]
    fn stalls_and_limits_are_read_at_their_cadence() {
        let t = TestRoot::new("cgseldom");
        t.write("sys/fs/cgroup/cgroup.controllers", "cpu io memory pids\n");
        let f = |n: &str| format!("sys/fs/cgroup/k/a/{n}");
        let psi = |us: u64| {
            format!("some avg10=0.00 avg60=0.00 avg300=0.00 total={us}\nfull avg10=0.00 avg60=0.00 avg300=0.00 total=0\n")
        };
        t.write(&f("cpu.stat"), "usage_usec 1\n");
        t.write(&f("memory.current"), "4096\n");
        t.write(&f("memory.max"), "max\n");
        for p in ["cpu", "memory", "io"] {
            t.write(&f(&format!("{p}.pressure")), &psi(1));
        }
        let mut r = Reader::new(Hierarchies::probe(&t.roots()), 64);
        let cpu_stall = |r: &mut Reader| r.read("k/a").unwrap().pressure.map(|p| p.cpu_some_us);
        assert_eq!(cpu_stall(&mut r), Some(1));
        // Active: its CPU moves at every read; its stalls show at the 10th.
        t.write(&f("cpu.pressure"), &psi(2));
        for n in 2..=FULL_READS {
            t.write(&f("cpu.stat"), &format!("usage_usec {n}\n"));
            let want = if n < FULL_READS { 1 } else { 2 };
            assert_eq!(cpu_stall(&mut r), Some(want), "read {n}");
        }
        // Idle (and a limit set): both show at the 30th read.
        t.write(&f("cpu.pressure"), &psi(3));
        t.write(&f("memory.max"), "1048576\n");
        for n in FULL_READS + 1..=SELDOM_READS {
            let c = r.read("k/a").unwrap();
            let (stall, limit) = (c.pressure.map(|p| p.cpu_some_us), c.memory_limit_bytes);
            if n < SELDOM_READS {
                assert_eq!((stall, limit), (Some(2), None), "read {n}");
            } else {
                assert_eq!((stall, limit), (Some(3), Some(1048576)), "read {n}");
            }
        }
    }

    /// The containers' ids after one more scan, the last scan's where it says
    /// that nothing changed.
    fn rescan(root: &Path, l: &mut Listings, last: &mut Vec<Found>) -> Vec<String> {
        if let Some(f) = scan(root, &[], l) {
            *last = f;
        }
        last.iter().filter_map(|f| f.container_id.clone()).collect()
    }

    fn cid(n: u8) -> String {
        format!("{:064x}", n)
    }

    /// Counted: a pod is listed again when its count of subdirectories changes,
    /// when one of its containers vanished, and every RELIST_SCANS scans.
    #[test]
    fn listings_follow_link_counts_and_vanished_containers() {
        let t = TestRoot::new("cglist");
        let pod = format!("kubepods/burstable/pod{UID}");
        let c = cid;
        t.mkdir(&format!("cg/{pod}/{}", c(1)));
        let root = t.path("cg");
        let mut l = Listings::counted(64);
        let last = &mut Vec::new();
        assert_eq!(rescan(&root, &mut l, last), [c(1)]);
        t.mkdir(&format!("cg/{pod}/{}", c(2)));
        assert_eq!(rescan(&root, &mut l, last), [c(1), c(2)]);
        // One removed and one made within an interval: the count is the same.
        std::fs::remove_dir(root.join(format!("{pod}/{}", c(1)))).unwrap();
        t.mkdir(&format!("cg/{pod}/{}", c(3)));
        assert_eq!(rescan(&root, &mut l, last), [c(1), c(2)]);
        // Its read fails: listed again.
        l.vanished(&root, &format!("{pod}/{}", c(1)));
        assert_eq!(rescan(&root, &mut l, last), [c(2), c(3)]);
        std::fs::remove_dir(root.join(format!("{pod}/{}", c(2)))).unwrap();
        t.mkdir(&format!("cg/{pod}/{}", c(4)));
        let mut n = 0;
        while rescan(&root, &mut l, last) != [c(3), c(4)] {
            n += 1;
            assert!(n <= RELIST_SCANS, "never listed again");
        }
        assert!(n > 0);
    }

    /// Watched: a scan with no event queued is the last one's (None); a pod,
    /// a QoS level and the driver's top directory made or removed show at the
    /// next scan, a removal and a creation in one interval included, and a
    /// missing top directory is looked for at each scan.
    #[test]
    fn listings_follow_inotify_events() {
        let t = TestRoot::new("cgnotify");
        let c = cid;
        let pod = |p: u8| format!("kubepods/burstable/pod{}{p:02x}", &UID[..UID.len() - 2]);
        t.mkdir(&format!("cg/{}/{}", pod(1), c(1)));
        let root = t.path("cg");
        let mut l = Listings::new(64);
        assert!(l.notified(), "no inotify here");
        let last = &mut Vec::new();
        assert_eq!(rescan(&root, &mut l, last), [c(1)]);
        assert!(scan(&root, &[], &mut l).is_none(), "nothing changed");
        std::fs::remove_dir(root.join(format!("{}/{}", pod(1), c(1)))).unwrap();
        t.mkdir(&format!("cg/{}/{}", pod(1), c(3)));
        assert_eq!(rescan(&root, &mut l, last), [c(3)]);
        // A new pod, then a new QoS level with a pod, then the systemd driver's tree.
        t.mkdir(&format!("cg/{}/{}", pod(2), c(4)));
        assert_eq!(rescan(&root, &mut l, last), [c(3), c(4)]);
        let u = UID.replace('-', "_");
        t.mkdir(&format!("cg/kubepods/besteffort/pod{UID}/{}", c(5)));
        assert_eq!(rescan(&root, &mut l, last), [c(5), c(3), c(4)]);
        t.mkdir(&format!(
            "cg/kubepods.slice/kubepods-pod{u}.slice/cri-containerd-{}.scope",
            c(6)
        ));
        assert_eq!(rescan(&root, &mut l, last), [c(6), c(5), c(3), c(4)]);
        assert!(scan(&root, &[], &mut l).is_none(), "nothing changed");
        std::fs::remove_dir(root.join(format!("{}/{}", pod(2), c(4)))).unwrap();
        std::fs::remove_dir(root.join(pod(2))).unwrap();
        assert_eq!(rescan(&root, &mut l, last), [c(6), c(5), c(3)]);
        assert!(l.notified(), "inotify given up");
        // The directories of the removed pod are no longer kept.
        assert!(!l.dirs.keys().any(|d| d.ends_with(pod(2))));
    }

    #[test]
    fn patterns() {
        assert!(matches(
            "system.slice/*.service",
            "system.slice/ssh.service"
        ));
        assert!(!matches(
            "system.slice/*.service",
            "system.slice/a/b.service"
        ));
        assert!(matches("*", "x"));
        assert!(!matches("a*b", "ac"));
        assert!(matches("a*b*c", "axxbyyc") && !matches("a*b*c", "axxbyy"));
        assert!(matches("**", "") && matches("*.service", ".service"));
        // Many stars stay cheap.
        let s = "a".repeat(200);
        assert!(!glob(&b"*a".repeat(30), format!("{s}b").as_bytes()));
    }
}
