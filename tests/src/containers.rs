//! Containers simulated with real cgroups, named as the kubelet names them, for the
//! node agent's tests (and the deployment's).

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Duration,
};

use crate::workload;

/// A container cgroup at `rel` in every hierarchy the host has (each v1 controller
/// the agent reads, or v2), removed with the ancestors it made.
pub struct FakeContainer {
    /// The container's directory in each hierarchy, the CPU accounting's first.
    pub dirs: Vec<PathBuf>,
    made: Vec<PathBuf>,
}

/// The hierarchies a container is made in: each v1 controller the agent reads
/// (cpuacct first: `workload incgroup` joins the first one last) and unified, or v2.
pub fn hierarchies() -> Vec<PathBuf> {
    let base = Path::new("/sys/fs/cgroup");
    if base.join("cgroup.controllers").exists() {
        return vec![base.to_path_buf()];
    }
    ["cpuacct", "cpu", "memory", "blkio", "pids", "unified"]
        .iter()
        .map(|c| base.join(c))
        .filter(|d| d.join("cgroup.procs").exists())
        .collect()
}

impl FakeContainer {
    pub fn new(rel: &str) -> FakeContainer {
        let mut dirs = Vec::new();
        let mut made = Vec::new();
        for h in hierarchies() {
            let mut d = h.clone();
            for part in rel.split('/') {
                d = d.join(part);
                if !d.exists() {
                    std::fs::create_dir(&d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
                    made.push(d.clone());
                }
            }
            if h.ends_with("blkio") {
                // v1 blkio counts a group's bytes only under a throttling rule.
                for dev in std::fs::read_dir("/sys/block")
                    .into_iter()
                    .flatten()
                    .flatten()
                {
                    if let Ok(n) = std::fs::read_to_string(dev.path().join("dev")) {
                        let _ = std::fs::write(
                            d.join("blkio.throttle.write_bps_device"),
                            format!("{} 1099511627776", n.trim()),
                        );
                    }
                }
            }
            dirs.push(d);
        }
        FakeContainer { dirs, made }
    }

    pub fn join_arg(&self) -> String {
        self.dirs
            .iter()
            .map(|d| d.display().to_string())
            .collect::<Vec<_>>()
            .join(":")
    }

    pub fn dir(&self, hierarchy: &str) -> Option<&PathBuf> {
        self.dirs.iter().find(|d| {
            d.strip_prefix("/sys/fs/cgroup")
                .is_ok_and(|r| r.starts_with(hierarchy))
        })
    }

    pub fn cpu_secs(&self) -> f64 {
        cpu_secs_of(&self.dirs)
    }

    /// Reads the container's CPU seconds when called, on any thread (a stand-in
    /// server that serves them).
    pub fn cpu_reader(&self) -> impl Fn() -> f64 + Send + 'static {
        let dirs = self.dirs.clone();
        move || cpu_secs_of(&dirs)
    }

    /// Runs `args` (the workload's) inside the container and waits.
    pub fn run(&self, args: &[&str]) -> std::process::ExitStatus {
        Command::new(workload())
            .arg("incgroup")
            .arg(self.join_arg())
            .arg("--")
            .arg(workload())
            .args(args)
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .unwrap()
    }
}

impl Drop for FakeContainer {
    fn drop(&mut self) {
        for d in &self.dirs {
            if let Ok(s) = std::fs::read_to_string(d.join("cgroup.procs")) {
                for pid in s.lines().filter_map(|l| l.trim().parse::<i32>().ok()) {
                    // SAFETY: signalling the test's own leftover process.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
            }
        }
        for d in self.made.iter().rev() {
            for _ in 0..50 {
                if std::fs::remove_dir(d).is_ok() || !d.exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// CPU seconds of the cgroup at `dirs` (cpuacct on v1, else v2's cpu.stat).
fn cpu_secs_of(dirs: &[PathBuf]) -> f64 {
    let cpuacct = dirs.iter().find(|d| {
        d.strip_prefix("/sys/fs/cgroup")
            .is_ok_and(|r| r.starts_with("cpuacct"))
    });
    match cpuacct {
        Some(d) => {
            let p = d.join("cpuacct.usage");
            std::fs::read_to_string(&p)
                .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
                .trim()
                .parse::<u64>()
                .expect("cpuacct.usage") as f64
                / 1e9
        }
        None => {
            let s = std::fs::read_to_string(dirs[0].join("cpu.stat")).unwrap();
            let us: u64 = s
                .lines()
                .find_map(|l| l.strip_prefix("usage_usec "))
                .and_then(|v| v.trim().parse().ok())
                .unwrap();
            us as f64 / 1e6
        }
    }
}
