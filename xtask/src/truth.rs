//! The kernel's own accounting of a cgroup that holds exactly a benchmark's
//! workload: the truth the peers' and the exactness tables compare every tool with.

use std::{
    path::{Path, PathBuf},
    time::{Duration, Instant},
};

use anyhow::Context as _;

/// A cgroup in every hierarchy that keeps a truth: CPU (v1 cpuacct, else v2), storage
/// bytes (v1 blkio, else v2 io) and peak memory (v1 memory, else v2). Removed, with
/// whatever is left in it, on drop.
pub struct Truth {
    cpu: PathBuf,
    v2: bool,
    blkio: Option<PathBuf>,
    memory: Option<PathBuf>,
}

fn mkcg(base: &str, name: &str) -> anyhow::Result<PathBuf> {
    let dir = Path::new(base).join(name);
    let _ = std::fs::remove_dir(&dir);
    std::fs::create_dir(&dir).with_context(|| format!("cgroup {}", dir.display()))?;
    Ok(dir)
}

impl Truth {
    /// Every hierarchy that keeps a truth.
    pub fn new(tag: &str) -> anyhow::Result<Truth> {
        Truth::make(tag, true)
    }

    /// CPU only (v1 cpuacct, else v2).
    pub fn cpu_only(tag: &str) -> anyhow::Result<Truth> {
        Truth::make(tag, false)
    }

    fn make(tag: &str, all: bool) -> anyhow::Result<Truth> {
        let name = format!("rt-{tag}-{}", std::process::id());
        if Path::new("/sys/fs/cgroup/cpuacct/cpuacct.usage").exists() {
            let blkio = all
                .then(|| mkcg("/sys/fs/cgroup/blkio", &name).ok())
                .flatten();
            if let Some(b) = &blkio {
                // v1 blkio counts a group's bytes only where a throttling rule exists:
                // a limit no workload reaches (1 TiB/s) turns the counting on.
                for d in std::fs::read_dir("/sys/block")
                    .into_iter()
                    .flatten()
                    .flatten()
                {
                    if let Ok(dev) = std::fs::read_to_string(d.path().join("dev")) {
                        for f in [
                            "blkio.throttle.read_bps_device",
                            "blkio.throttle.write_bps_device",
                        ] {
                            let _ =
                                std::fs::write(b.join(f), format!("{} 1099511627776", dev.trim()));
                        }
                    }
                }
            }
            Ok(Truth {
                cpu: mkcg("/sys/fs/cgroup/cpuacct", &name)?,
                v2: false,
                blkio,
                memory: all
                    .then(|| mkcg("/sys/fs/cgroup/memory", &name).ok())
                    .flatten(),
            })
        } else {
            let base = if Path::new("/sys/fs/cgroup/unified/cgroup.procs").exists() {
                "/sys/fs/cgroup/unified"
            } else {
                "/sys/fs/cgroup"
            };
            if all {
                // The io and memory files exist only where the parent delegates them.
                let _ = std::fs::write(
                    Path::new(base).join("cgroup.subtree_control"),
                    "+io +memory",
                );
            }
            Ok(Truth {
                cpu: mkcg(base, &name)?,
                v2: true,
                blkio: None,
                memory: None,
            })
        }
    }

    /// `workload incgroup`'s argument: the CPU directory first (joined last).
    pub fn join_arg(&self) -> String {
        let mut dirs = vec![self.cpu.display().to_string()];
        for d in [&self.blkio, &self.memory].into_iter().flatten() {
            dirs.push(d.display().to_string());
        }
        dirs.join(":")
    }

    /// The file `cpu_secs` reads: v1 `cpuacct.usage` (ns) or v2 `cpu.stat`.
    pub fn cpu_file(&self) -> PathBuf {
        self.cpu
            .join(if self.v2 { "cpu.stat" } else { "cpuacct.usage" })
    }

    pub fn cpu_secs(&self) -> f64 {
        let (file, key, div) = if self.v2 {
            ("cpu.stat", Some("usage_usec "), 1e6)
        } else {
            ("cpuacct.usage", None, 1e9)
        };
        let text = std::fs::read_to_string(self.cpu.join(file)).unwrap_or_default();
        let v = match key {
            Some(k) => text.lines().find_map(|l| l.strip_prefix(k)),
            None => Some(text.as_str()),
        };
        v.and_then(|v| v.trim().parse::<f64>().ok())
            .map_or(f64::NAN, |v| v / div)
    }

    /// Storage bytes written by the group, all devices.
    pub fn write_bytes(&self) -> Option<u64> {
        let (text, v1) = match &self.blkio {
            Some(b) => (
                std::fs::read_to_string(b.join("blkio.throttle.io_service_bytes")).ok()?,
                true,
            ),
            None => (
                std::fs::read_to_string(self.cpu.join("io.stat")).ok()?,
                false,
            ),
        };
        let mut sum = 0;
        for line in text.lines() {
            let f: Vec<&str> = line.split_whitespace().collect();
            if f.first().is_none_or(|d| !d.contains(':')) {
                continue;
            }
            if v1 {
                if let [_, "Write", n] = f[..] {
                    sum += n.parse::<u64>().unwrap_or(0);
                }
            } else {
                for kv in &f[1..] {
                    if let Some(n) = kv.strip_prefix("wbytes=") {
                        sum += n.parse::<u64>().unwrap_or(0);
                    }
                }
            }
        }
        Some(sum)
    }

    pub fn peak_bytes(&self) -> Option<u64> {
        let f = match &self.memory {
            Some(d) => d.join("memory.max_usage_in_bytes"),
            None => self.cpu.join("memory.peak"),
        };
        std::fs::read_to_string(f).ok()?.trim().parse().ok()
    }

    fn dirs(&self) -> Vec<&PathBuf> {
        [Some(&self.cpu), self.blkio.as_ref(), self.memory.as_ref()]
            .into_iter()
            .flatten()
            .collect()
    }
}

impl Drop for Truth {
    fn drop(&mut self) {
        let t0 = Instant::now();
        for d in self.dirs() {
            loop {
                let pids: Vec<i32> = std::fs::read_to_string(d.join("cgroup.procs"))
                    .map(|s| s.lines().filter_map(|l| l.trim().parse().ok()).collect())
                    .unwrap_or_default();
                if pids.is_empty() || t0.elapsed() > Duration::from_secs(5) {
                    break;
                }
                for pid in pids {
                    // SAFETY: killing the leftovers of our own workload.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            for _ in 0..50 {
                if std::fs::remove_dir(d).is_ok() || !d.exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    }
}

/// The root's CPU before it joined its cgroup, from `workload incgroup --pre F`:
/// the middle of the readings just before and after the join (0 without them).
pub fn pre_join_secs(pre: &Path) -> f64 {
    let window: Vec<f64> = std::fs::read_to_string(pre)
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|v| v.parse().ok())
        .collect();
    if window.is_empty() {
        0.0
    } else {
        window.iter().sum::<f64>() / window.len() as f64 / 1e9
    }
}
