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

/// `setpriv` as the unprivileged user 65534, its group and no others: put
/// before a command.
pub const AS_NOBODY: &[&str] = &[
    "setpriv",
    "--reuid",
    "65534",
    "--regid",
    "65534",
    "--clear-groups",
    "--",
];

/// A copy of the tracker binary that another user can execute, in `scratch`: the
/// clone's own path may pass through a directory only root can enter (a
/// `mktemp -d` clone is 0700).
pub fn tracker_for_any_user(scratch: &Scratch) -> PathBuf {
    use std::os::unix::fs::PermissionsExt as _;
    let dir = scratch.path("bin");
    std::fs::create_dir_all(&dir).expect("scratch bin dir");
    let bin = dir.join("resource-tracker");
    std::fs::copy(tracker(), &bin).expect("copy the tracker binary");
    for (p, mode) in [(&scratch.0, 0o755), (&dir, 0o755), (&bin, 0o755)] {
        std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode)).expect("chmod");
    }
    bin
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

/// A fresh cgroup whose accounting is the kernel's truth for what runs inside it:
/// CPU (v1 `cpuacct.usage`, v2 `cpu.stat`), storage bytes (v1 blkio's
/// `throttle.io_service_bytes`, v2 `io.stat`) and peak memory (v1
/// `memory.max_usage_in_bytes`, v2 `memory.peak`). On a hybrid host each controller
/// is taken from the v1 hierarchy that has it.
pub struct Cgroup {
    pub dir: PathBuf,
    v2: bool,
    blkio: Option<PathBuf>,
    memory: Option<PathBuf>,
}

/// v1 blkio counts a group's bytes only where a throttling rule exists: give every
/// block device a limit no workload reaches (1 TiB/s), which turns the counting on.
fn enable_blkio_counting(dir: &Path) {
    let Ok(devs) = std::fs::read_dir("/sys/block") else {
        return;
    };
    for d in devs.flatten() {
        let Ok(dev) = std::fs::read_to_string(d.path().join("dev")) else {
            continue;
        };
        for f in [
            "blkio.throttle.read_bps_device",
            "blkio.throttle.write_bps_device",
        ] {
            let _ = std::fs::write(dir.join(f), format!("{} 1099511627776", dev.trim()));
        }
    }
}

fn v1_dir(controller: &str, name: &str) -> Option<PathBuf> {
    let base = Path::new("/sys/fs/cgroup").join(controller);
    if !base.join("cgroup.procs").exists() {
        return None;
    }
    let dir = base.join(name);
    let _ = std::fs::remove_dir(&dir);
    std::fs::create_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot create cgroup {}: {e}", dir.display()));
    Some(dir)
}

/// Σ of `KEY=N` (v2) or `MAJ:MIN Key N` (v1) lines of a cgroup I/O file.
fn io_sum(text: &str, v2_key: &str, v1_key: &str) -> u64 {
    let mut sum = 0;
    for line in text.lines() {
        let mut it = line.split_whitespace();
        let Some(dev) = it.next() else { continue };
        if !dev.contains(':') {
            continue;
        }
        let rest: Vec<&str> = it.collect();
        if let [k, v] = rest[..] {
            if k == v1_key {
                sum += v.parse::<u64>().unwrap_or(0);
            }
        }
        for kv in &rest {
            if let Some(v) = kv.strip_prefix(v2_key).and_then(|r| r.strip_prefix('=')) {
                sum += v.parse::<u64>().unwrap_or(0);
            }
        }
    }
    sum
}

static CGROUP_SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);

impl Cgroup {
    pub fn new(tag: &str) -> Cgroup {
        // Numbered: two tests of one binary may ask for the same tag at once.
        let n = CGROUP_SEQ.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let name = format!("rt-{tag}-{}-{n}", std::process::id());
        let (base, v2) = if Path::new("/sys/fs/cgroup/cpuacct/cpuacct.usage").exists() {
            (PathBuf::from("/sys/fs/cgroup/cpuacct"), false)
        } else if Path::new("/sys/fs/cgroup/unified/cgroup.procs").exists() {
            (PathBuf::from("/sys/fs/cgroup/unified"), true)
        } else {
            (PathBuf::from("/sys/fs/cgroup"), true)
        };
        if v2 {
            // Best effort: the io and memory files exist only where the parent
            // delegates those controllers.
            let _ = std::fs::write(base.join("cgroup.subtree_control"), "+io +memory");
        }
        let dir = base.join(&name);
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir)
            .unwrap_or_else(|e| panic!("cannot create cgroup {}: {e}", dir.display()));
        let (blkio, memory) = if v2 {
            (None, None)
        } else {
            let blkio = v1_dir("blkio", &name);
            if let Some(b) = &blkio {
                enable_blkio_counting(b);
            }
            (blkio, v1_dir("memory", &name))
        };
        Cgroup {
            dir,
            v2,
            blkio,
            memory,
        }
    }

    /// The argument of `workload incgroup`: every directory to join.
    pub fn join_arg(&self) -> String {
        let mut dirs = vec![self.dir.display().to_string()];
        for d in [&self.blkio, &self.memory].into_iter().flatten() {
            dirs.push(d.display().to_string());
        }
        dirs.join(":")
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

    /// Storage bytes (read, written) by the group's tasks, all devices.
    pub fn io_bytes(&self) -> (u64, u64) {
        let (file, text) = match &self.blkio {
            Some(d) => {
                let f = d.join("blkio.throttle.io_service_bytes");
                (f.clone(), std::fs::read_to_string(&f))
            }
            None => {
                let f = self.dir.join("io.stat");
                (f.clone(), std::fs::read_to_string(&f))
            }
        };
        let text = text.unwrap_or_else(|e| panic!("{}: {e}", file.display()));
        (
            io_sum(&text, "rbytes", "Read"),
            io_sum(&text, "wbytes", "Write"),
        )
    }

    /// Peak memory charged to the group, bytes.
    pub fn peak_memory(&self) -> Option<u64> {
        let f = match &self.memory {
            Some(d) => d.join("memory.max_usage_in_bytes"),
            None => self.dir.join("memory.peak"),
        };
        std::fs::read_to_string(f).ok()?.trim().parse().ok()
    }

    /// Makes the kernel reclaim what it can of the group's memory (v1
    /// `memory.force_empty`, v2 `memory.reclaim`); false where neither file is.
    pub fn reclaim(&self) -> bool {
        let (f, what) = match &self.memory {
            Some(d) => (d.join("memory.force_empty"), "0"),
            None => (self.dir.join("memory.reclaim"), "1G"),
        };
        if !f.exists() {
            return false;
        }
        // v2 says EAGAIN when less than asked could be reclaimed: what could was.
        let _ = std::fs::write(&f, what);
        true
    }

    /// The files that hold its CPU (v1 `cpuacct.usage`, v2 `cpu.stat`) and its
    /// peak memory.
    pub fn files(&self) -> (PathBuf, PathBuf) {
        let cpu = if self.v2 {
            self.dir.join("cpu.stat")
        } else {
            self.dir.join("cpuacct.usage")
        };
        let peak = match &self.memory {
            Some(d) => d.join("memory.max_usage_in_bytes"),
            None => self.dir.join("memory.peak"),
        };
        (cpu, peak)
    }

    /// Processes still in the group.
    pub fn procs(&self) -> usize {
        std::fs::read_to_string(self.dir.join("cgroup.procs"))
            .map(|s| s.lines().count())
            .unwrap_or(0)
    }

    /// Kills whatever is left in the group.
    pub fn kill_all(&self) {
        if let Ok(s) = std::fs::read_to_string(self.dir.join("cgroup.procs")) {
            for pid in s.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                // SAFETY: signalling a test's own leftover process.
                unsafe { libc::kill(pid, libc::SIGKILL) };
            }
        }
    }
}

impl Drop for Cgroup {
    fn drop(&mut self) {
        self.kill_all();
        for d in [Some(&self.dir), self.blkio.as_ref(), self.memory.as_ref()]
            .into_iter()
            .flatten()
        {
            for _ in 0..50 {
                if std::fs::remove_dir(d).is_ok() || !d.exists() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(20));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn io_files_of_both_versions() {
        let v1 = "8:0 Read 4096\n8:0 Write 8192\n8:0 Sync 1\n8:0 Total 12288\n8:16 Write 100\nTotal 12388\n";
        assert_eq!(super::io_sum(v1, "rbytes", "Read"), 4096);
        assert_eq!(super::io_sum(v1, "wbytes", "Write"), 8292);
        let v2 = "8:0 rbytes=10 wbytes=20 rios=1 wios=2\n253:0 rbytes=1 wbytes=2 rios=0 wios=0\n";
        assert_eq!(super::io_sum(v2, "rbytes", "Read"), 11);
        assert_eq!(super::io_sum(v2, "wbytes", "Write"), 22);
    }
}

pub mod truth;

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

pub mod churn;
pub mod containers;
pub mod e2e;
pub mod http;
pub mod python;
pub mod sentinel;

/// The administrator's policy file (`/etc/resource-tracker.toml`) as a test sets
/// it: written root's with `mode`, and on drop removed, or put back as it was.
pub struct AdminPolicy {
    before: Option<Vec<u8>>,
}

impl AdminPolicy {
    pub const PATH: &'static str = "/etc/resource-tracker.toml";

    pub fn set(text: &str, mode: u32) -> AdminPolicy {
        use std::os::unix::fs::PermissionsExt as _;
        let before = std::fs::read(Self::PATH).ok();
        std::fs::write(Self::PATH, text).expect("write the policy");
        std::fs::set_permissions(Self::PATH, std::fs::Permissions::from_mode(mode))
            .expect("chmod the policy");
        AdminPolicy { before }
    }

    /// `[sudo] allow_as_root = true`, root's alone.
    pub fn allow_as_root() -> AdminPolicy {
        AdminPolicy::set("[sudo]\nallow_as_root = true\n", 0o644)
    }
}

impl Drop for AdminPolicy {
    fn drop(&mut self) {
        match &self.before {
            Some(b) => {
                let _ = std::fs::write(Self::PATH, b);
            }
            None => {
                let _ = std::fs::remove_file(Self::PATH);
            }
        }
    }
}

/// The Python of deploy/validate.sh's virtual environment (PyYAML and
/// kubernetes-validate, pinned there), made by validate.sh where it is missing.
pub fn deploy_python() -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let py = root.join("target/kv/bin/python");
    if !py.exists() {
        let o = std::process::Command::new("bash")
            .arg(root.join("deploy/validate.sh"))
            .output()
            .expect("bash deploy/validate.sh");
        assert!(
            py.exists(),
            "deploy/validate.sh made no {}: {}",
            py.display(),
            String::from_utf8_lossy(&o.stderr)
        );
    }
    py
}
