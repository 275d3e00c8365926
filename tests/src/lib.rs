//! Helpers shared by the end-to-end tests and the benchmarks: locating the binaries,
//! the kernel's own CPU accounting (a cgroup), and running the tracker.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

/// The target directory of the running test or tool (target/<profile>).
pub fn bin_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("current_exe");
    let dir = exe.parent().expect("exe dir").to_path_buf();
    if dir.file_name().is_some_and(|n| n == "deps") {
        dir.parent().expect("profile dir").to_path_buf()
    } else {
        dir
    }
}

/// A binary of this workspace built next to the running test, with the command
/// that builds it when it is missing.
fn built(name: &str, build: &str) -> PathBuf {
    let p = bin_dir().join(name);
    assert!(
        p.exists(),
        "{} is missing: run `{build}` first (cargo xtask test does)",
        p.display()
    );
    p
}

/// The workload generator built next to the tests.
pub fn workload() -> PathBuf {
    built("workload", "cargo build -p tracker-tests")
}

/// The tracker binary of the same profile.
pub fn tracker() -> PathBuf {
    built("resource-tracker", "cargo build -p tracker-agent")
}

/// True when eBPF tests can run here. In CI a missing capability is a failure, never
/// a silent skip.
pub fn ebpf_available() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    let btf = Path::new("/sys/kernel/btf/vmlinux").exists();
    if root && btf {
        return true;
    }
    let why = format!("eBPF tests need root and /sys/kernel/btf/vmlinux (root={root}, btf={btf})");
    assert!(std::env::var_os("CI").is_none(), "CI is set but {why}");
    eprintln!("SKIPPED: {why}");
    false
}

/// A fresh cgroup whose CPU usage is the kernel's truth for what runs inside it.
/// cgroup v1 `cpuacct.usage` (ns) where mounted, else cgroup v2 `cpu.stat`.
pub struct Cgroup {
    pub dir: PathBuf,
    v2: bool,
}

impl Cgroup {
    pub fn new(tag: &str) -> Cgroup {
        let name = format!("rt-{tag}-{}", std::process::id());
        let (base, v2) = if Path::new("/sys/fs/cgroup/cpuacct/cpuacct.usage").exists() {
            (PathBuf::from("/sys/fs/cgroup/cpuacct"), false)
        } else if Path::new("/sys/fs/cgroup/unified/cgroup.procs").exists() {
            (PathBuf::from("/sys/fs/cgroup/unified"), true)
        } else {
            (PathBuf::from("/sys/fs/cgroup"), true)
        };
        let dir = base.join(name);
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir)
            .unwrap_or_else(|e| panic!("cannot create cgroup {}: {e}", dir.display()));
        Cgroup { dir, v2 }
    }

    pub fn usage_ns(&self) -> u64 {
        if self.v2 {
            let s = std::fs::read_to_string(self.dir.join("cpu.stat")).expect("cpu.stat");
            let us: u64 = s
                .lines()
                .find_map(|l| l.strip_prefix("usage_usec "))
                .and_then(|v| v.trim().parse().ok())
                .expect("usage_usec");
            us * 1000
        } else {
            std::fs::read_to_string(self.dir.join("cpuacct.usage"))
                .expect("cpuacct.usage")
                .trim()
                .parse()
                .expect("cpuacct.usage number")
        }
    }

    /// Processes still in the group.
    pub fn procs(&self) -> usize {
        std::fs::read_to_string(self.dir.join("cgroup.procs"))
            .map(|s| s.lines().count())
            .unwrap_or(0)
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Runs a command to completion, returning its output.
pub fn run(cmd: &mut Command) -> Output {
    cmd.output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"))
}

pub fn read_json(path: &Path) -> serde_json::Value {
    let s = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    serde_json::from_str(&s).unwrap_or_else(|e| panic!("{}: {e}: {s}", path.display()))
}

pub fn read_jsonl(path: &Path) -> Vec<serde_json::Value> {
    let s = std::fs::read_to_string(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
    s.lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{}: {e}: {l}", path.display())))
        .collect()
}

static SCRATCH_SEQ: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// A scratch directory removed on drop; unique per call.
pub struct Scratch(pub PathBuf);

impl Scratch {
    pub fn new(tag: &str) -> Scratch {
        let n = SCRATCH_SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let d = std::env::temp_dir().join(format!("rt-test-{tag}-{}-{n}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).expect("scratch dir");
        Scratch(d)
    }
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// A free port on 127.0.0.1 (bound, then released).
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("local_addr").port()
}

/// A URL where nothing listens.
pub fn closed_url() -> String {
    format!("http://127.0.0.1:{}", free_port())
}

pub mod e2e;
pub mod sentinel;
