//! Host-wide collectors, one module per source. Each keeps its previous reading so
//! that rates are deltas over the measured elapsed time between two readings.
//! A source that cannot be read makes its fields null with one warning per field
//! for the whole run (see `crate::warn`), never an error.

pub mod cgroup;
pub mod containers;
pub mod cpu;
pub mod disk;
pub mod gpu;
pub mod host;
pub mod limits;
pub mod memcg;
pub mod memory;
pub mod mountinfo;
pub mod network;

use std::{
    fs::File,
    io,
    os::unix::fs::FileExt,
    path::{Path, PathBuf},
};

use crate::model::sample::HostInfo;
use crate::model::HostReading;

/// Where /proc and /sys are; tests point these at trees they lay out.
#[derive(Clone, Debug)]
pub struct Roots {
    pub proc: PathBuf,
    pub sys: PathBuf,
}

impl Default for Roots {
    fn default() -> Self {
        Roots {
            proc: PathBuf::from("/proc"),
            sys: PathBuf::from("/sys"),
        }
    }
}

/// All host sources. Per sample it only re-reads files it keeps open (no /proc/PID
/// scan, no directory listing unless the set of devices or mounts changed).
pub struct SystemCollector {
    cpu: cpu::CpuCollector,
    cgroup: cgroup::CgroupCpu,
    memory: memory::MemoryCollector,
    network: network::NetworkCollector,
    disk: disk::DiskCollector,
    host: HostInfo,
}

impl SystemCollector {
    /// Takes the baseline reading of every source, so that the first `sample`
    /// (one interval later) already has rates.
    pub fn new(roots: Roots) -> SystemCollector {
        let mut c = SystemCollector {
            cpu: cpu::CpuCollector::new(&roots),
            cgroup: cgroup::CgroupCpu::new(&roots),
            memory: memory::MemoryCollector::new(&roots),
            network: network::NetworkCollector::new(&roots),
            disk: disk::DiskCollector::new(&roots),
            host: HostInfo::default(),
        };
        let base = c.sample();
        c.host = host::host_info(&roots, &base.memory, &base.disk);
        c
    }

    /// Reads all sources; rates cover the time since the previous call.
    pub fn sample(&mut self) -> HostReading {
        let mut cpu = self.cpu.sample();
        let cg = self.cgroup.sample();
        cpu.cgroup_usage_secs = cg.usage_secs;
        cpu.cgroup_utilization_pct = cg.cores_used;
        HostReading {
            cpu,
            memory: self.memory.sample(),
            disk: self.disk.sample(),
            network: self.network.sample(),
            gpu: Vec::new(),
            process_gpu: None,
        }
    }

    /// Host facts read once, at `new`.
    pub fn host_info(&self) -> HostInfo {
        self.host.clone()
    }
}

/// A file read every sample: opened once and re-read with `pread` at offset 0, which
/// makes procfs and sysfs generate fresh content (no path lookup, no open/close).
pub(crate) struct CachedFile {
    path: PathBuf,
    file: Option<File>,
    end: End,
}

/// How a read shows that the file's end was reached.
#[derive(Clone, Copy, Debug)]
pub(crate) enum End {
    /// Single-record files (/proc/stat, meminfo, sysfs attributes) are complete
    /// after a short read.
    Short,
    /// A seq_file of many records (mountinfo) fills at most its buffer per read, a
    /// page at first, and stops before a record that would overflow it: only a
    /// 0-byte read means the end.
    Zero,
    /// A seq_file whose records are each shorter than this many bytes (a line of
    /// /proc/net/dev or diskstats: under 512): a read that comes back with less than
    /// a page minus that had room for the next record, so there was none. That
    /// saves the read that would return 0, a system call per file and sample;
    /// hosts whose file is longer than that read on.
    LinesUnder(usize),
}

/// The smallest buffer a seq_file fills per read.
const SEQ_PAGE: usize = 4096;

impl CachedFile {
    /// A single-record file (sysfs attribute, /proc/stat, /proc/meminfo).
    pub(crate) fn whole(path: PathBuf) -> CachedFile {
        CachedFile {
            path,
            file: None,
            end: End::Short,
        }
    }

    /// A seq_file of many records.
    pub(crate) fn records(path: PathBuf) -> CachedFile {
        CachedFile {
            path,
            file: None,
            end: End::Zero,
        }
    }

    /// A seq_file of lines each shorter than `max` bytes.
    pub(crate) fn lines_under(path: PathBuf, max: usize) -> CachedFile {
        CachedFile {
            path,
            file: None,
            end: End::LinesUnder(max),
        }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The open file, once a read has opened it.
    pub(crate) fn file(&self) -> Option<&File> {
        self.file.as_ref()
    }

    /// Fresh content into `buf`.
    pub(crate) fn read(&mut self, buf: &mut Vec<u8>) -> io::Result<()> {
        if let Some(f) = &self.file {
            match pread_all(f, buf, self.end) {
                Ok(()) => return Ok(()),
                // The attribute has no value now (speed of a down link); a new fd
                // would say the same.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return Err(e),
                // The node was removed (device gone or re-created): reopen below.
                Err(_) => self.file = None,
            }
        }
        let f = File::open(&self.path)?;
        let r = pread_all(&f, buf, self.end);
        self.file = Some(f);
        r
    }

    /// `read`, and when it fails a warning given once per `key` for the whole
    /// run, saying what the sample goes without (`lacking`); whether it read.
    pub(crate) fn read_or_warn(&mut self, buf: &mut Vec<u8>, key: &str, lacking: &str) -> bool {
        match self.read(buf) {
            Ok(()) => true,
            Err(e) => {
                crate::warn::warn_once(
                    key,
                    format_args!("cannot read {}: {e}; {lacking}", self.path.display()),
                );
                false
            }
        }
    }
}

/// Reads from offset 0 to the end into `buf` (keeping its capacity between calls).
pub(crate) fn pread_all(f: &File, buf: &mut Vec<u8>, end: End) -> io::Result<()> {
    let cap = buf.capacity().max(SEQ_PAGE);
    buf.clear();
    buf.resize(cap, 0);
    let mut len = 0;
    loop {
        // Room for a whole seq_file buffer at each read, so that a short read is
        // the file's doing, not the room's.
        if buf.len() - len < SEQ_PAGE {
            buf.resize((len * 2).max(len + SEQ_PAGE), 0);
        }
        let want = buf.len() - len;
        let n = match f.read_at(&mut buf[len..], len as u64) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                buf.clear();
                return Err(e);
            }
        };
        len += n;
        let done = match end {
            End::Short => n < want,
            End::Zero => false,
            End::LinesUnder(max) => n < want && n + max <= SEQ_PAGE,
        };
        if n == 0 || done {
            break;
        }
    }
    buf.truncate(len);
    Ok(())
}

/// Undoes mountinfo's octal escapes (`\040` space, `\011` tab, `\012`, `\134`).
pub(crate) fn unescape(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'\\'
            && i + 3 < s.len()
            && s[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = s[i + 1..i + 4]
                .iter()
                .fold(0u32, |a, &c| a * 8 + u32::from(c - b'0'));
            out.push(v as u8);
            i += 4;
        } else {
            out.push(s[i]);
            i += 1;
        }
    }
    out
}

/// A small attribute read once (static device facts): trimmed, empty → None.
pub(crate) fn read_attr(path: &Path) -> Option<String> {
    let bytes = std::fs::read(path).ok()?;
    let s = String::from_utf8_lossy(&bytes);
    let s = s.trim();
    (!s.is_empty()).then(|| s.to_string())
}

#[cfg(test)]
pub(crate) mod testroot {
    //! Temporary /proc and /sys trees laid out by tests.

    use std::{
        path::{Path, PathBuf},
        sync::atomic::{AtomicUsize, Ordering},
    };

    use super::Roots;

    static NEXT: AtomicUsize = AtomicUsize::new(0);

    /// Removed on drop.
    pub(crate) struct TestRoot {
        pub dir: PathBuf,
    }

    impl TestRoot {
        pub(crate) fn new(name: &str) -> TestRoot {
            let dir = std::env::temp_dir().join(format!(
                "collect-{name}-{}-{}",
                std::process::id(),
                NEXT.fetch_add(1, Ordering::Relaxed)
            ));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir_all(dir.join("proc")).unwrap();
            std::fs::create_dir_all(dir.join("sys")).unwrap();
            TestRoot { dir }
        }

        pub(crate) fn roots(&self) -> Roots {
            Roots {
                proc: self.dir.join("proc"),
                sys: self.dir.join("sys"),
            }
        }

        pub(crate) fn path(&self, rel: &str) -> PathBuf {
            self.dir.join(rel)
        }

        /// Writes `rel` (relative to the tree, e.g. `proc/stat`), creating parents.
        pub(crate) fn write(&self, rel: &str, content: &str) {
            let p = self.dir.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, content).unwrap();
        }

        pub(crate) fn mkdir(&self, rel: &str) {
            std::fs::create_dir_all(self.dir.join(rel)).unwrap();
        }

        /// A symlink at `rel` pointing to `target` (relative, as sysfs has them).
        pub(crate) fn symlink(&self, rel: &str, target: &str) {
            let p = self.dir.join(rel);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            let _ = std::fs::remove_file(&p);
            std::os::unix::fs::symlink(Path::new(target), p).unwrap();
        }

        pub(crate) fn remove(&self, rel: &str) {
            let p = self.dir.join(rel);
            if p.is_dir() && !p.is_symlink() {
                std::fs::remove_dir_all(p).unwrap();
            } else {
                std::fs::remove_file(p).unwrap();
            }
        }
    }

    impl Drop for TestRoot {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cached_file_rereads_and_reopens() {
        let t = testroot::TestRoot::new("cached");
        t.write("proc/x", "one\n");
        let mut f = CachedFile::whole(t.path("proc/x"));
        let mut buf = Vec::new();
        f.read(&mut buf).unwrap();
        assert_eq!(buf, b"one\n");
        // Rewritten in place: the cached fd sees the new content.
        t.write("proc/x", "two!\n");
        f.read(&mut buf).unwrap();
        assert_eq!(buf, b"two!\n");
        let big = "a".repeat(10_000);
        t.write("proc/y", &big);
        let mut g = CachedFile::records(t.path("proc/y"));
        g.read(&mut buf).unwrap();
        assert_eq!(buf.len(), 10_000);
        assert!(CachedFile::whole(t.path("proc/none"))
            .read(&mut buf)
            .is_err());
    }

    /// `read` gives all of `name`: compared with two whole reads around it that
    /// agree (kallsyms changes as BPF programs load, diskstats' counters grow a
    /// digit), tried again where they do not.
    fn reads_whole(name: &str, read: impl Fn() -> Vec<u8>) {
        for _ in 0..20 {
            let before = std::fs::read(name).unwrap();
            let got = read();
            if std::fs::read(name).unwrap() == before {
                assert_eq!(got.len(), before.len(), "{name}");
                return;
            }
        }
        panic!("{name} changed under every one of 20 reads");
    }

    #[test]
    fn pread_of_real_seq_files_is_complete() {
        // A seq_file returns at most a page per read: all of a 5 MB file must come.
        let whole = |name: &str, f: fn(PathBuf) -> CachedFile| {
            let name = name.to_string();
            move || {
                let mut buf = Vec::new();
                f(PathBuf::from(&name)).read(&mut buf).unwrap();
                buf
            }
        };
        if std::path::Path::new("/proc/kallsyms").exists() {
            reads_whole(
                "/proc/kallsyms",
                whole("/proc/kallsyms", CachedFile::records),
            );
            // Read to the end without the 0-byte read, where each read but the last
            // comes back nearly a page long: kallsyms' lines (a name under 512
            // bytes) stand in for net/dev's and diskstats' here, as they span many
            // pages.
            reads_whole(
                "/proc/kallsyms",
                whole("/proc/kallsyms", |p| CachedFile::lines_under(p, 1024)),
            );
        }
        for name in ["/proc/diskstats", "/proc/self/net/dev"] {
            reads_whole(name, whole(name, |p| CachedFile::lines_under(p, 512)));
        }
        let mut buf = Vec::new();
        let mut s = CachedFile::whole(PathBuf::from("/proc/stat"));
        s.read(&mut buf).unwrap();
        assert!(buf.ends_with(b"\n") && buf.starts_with(b"cpu "));
        s.read(&mut buf).unwrap();
        assert!(buf.ends_with(b"\n") && buf.starts_with(b"cpu "));
    }

    /// The collector against this machine's own /proc and /sys.
    #[test]
    fn real_machine() {
        let mut c = SystemCollector::new(Roots::default());
        std::thread::sleep(std::time::Duration::from_millis(200));
        let r = c.sample();

        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
        let total_kb: f64 = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap();
        assert_eq!(r.memory.total_mib, Some(total_kb / 1024.0));
        assert_eq!(c.host_info().host_memory_mib, Some(total_kb / 1024.0));

        let stat = std::fs::read_to_string("/proc/stat").unwrap();
        let cores = stat
            .lines()
            .filter(|l| l.starts_with("cpu") && !l.starts_with("cpu "))
            .count();
        let per_core = r.cpu.per_core_pct.as_ref().unwrap();
        assert_eq!(per_core.len(), cores);
        assert!(per_core.iter().all(|p| (0.0..=100.0).contains(p)));
        let util = r.cpu.utilization_pct.unwrap();
        assert!((0.0..=cores as f64).contains(&util));
        assert!(r.cpu.utime_secs.is_some() && r.cpu.process_count.is_some());

        // The disk holding / is listed (with size > 0, not loop/zram) with "/".
        let disks: Vec<String> = std::fs::read_dir("/sys/block")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| !["loop", "ram", "zram"].iter().any(|p| n.starts_with(p)))
            .filter(|n| {
                std::fs::read_to_string(format!("/sys/block/{n}/size"))
                    .is_ok_and(|s| s.trim() != "0")
            })
            .collect();
        for d in &disks {
            if std::fs::read_dir(format!("/sys/block/{d}/slaves"))
                .is_ok_and(|mut s| s.next().is_none())
            {
                assert!(r.disk.iter().any(|x| &x.device == d), "{d} not listed");
            }
        }
        // / on a block device (not a container's overlay): listed on its disk.
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let slash_on_disk = mountinfo.lines().any(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let source = l.split(" - ").nth(1).and_then(|r| r.split(' ').nth(1));
            f.len() > 4
                && f[4] == "/"
                && (!f[2].starts_with("0:") || source.is_some_and(|s| s.starts_with("/dev/")))
        });
        let root = r
            .disk
            .iter()
            .find(|d| d.mounts.iter().any(|m| m.mount_point == "/"));
        if slash_on_disk {
            let root = root.unwrap_or_else(|| panic!("no disk with /: {:?}", r.disk));
            assert!(root.read_bytes_per_sec.is_some() && root.read_bytes_total > Some(0));
            let slash = root.mounts.iter().find(|m| m.mount_point == "/").unwrap();
            assert!(slash.total_bytes > 0 && slash.used_pct > 0.0 && slash.used_pct <= 100.0);
        }
        // Each filesystem at most once.
        let mut mps: Vec<_> = r.disk.iter().flat_map(|d| &d.mounts).collect();
        let n = mps.len();
        mps.dedup_by(|a, b| a.mount_point == b.mount_point);
        assert_eq!(mps.len(), n);
        let host = c.host_info();
        let cap: u64 = r.disk.iter().filter_map(|d| d.capacity_bytes).sum();
        assert_eq!(host.host_storage_gb, Some(cap as f64 / 1e9));
        assert!(host.host_vcpus.unwrap() >= 1);

        let dev = std::fs::read_to_string("/proc/net/dev").unwrap();
        if dev.contains("eth0:") {
            let eth0 = r.network.iter().find(|n| n.interface == "eth0").unwrap();
            assert!(eth0.rx_bytes_per_sec.is_some() && eth0.mtu.is_some());
            assert!(eth0.mac_address.is_some() && eth0.operstate.is_some());
        }
        assert!(r.network.iter().all(|n| n.interface != "lo"));
        eprintln!("{r:#?}\n{host:#?}");
    }
}
