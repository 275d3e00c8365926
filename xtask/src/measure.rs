//! Measuring helpers shared by the engine benchmark and the peers' comparison:
//! medians with their spread, shell reads, background process groups and the
//! host's process count.

use std::{
    os::unix::process::CommandExt as _,
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};
use serde_json::Value;

fn median(v: &mut [f64]) -> f64 {
    v.sort_by(|a, b| a.total_cmp(b));
    let n = v.len();
    if n == 0 {
        return f64::NAN;
    }
    if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

fn spread(v: &[f64]) -> (f64, f64) {
    let lo = v.iter().copied().fold(f64::INFINITY, f64::min);
    let hi = v.iter().copied().fold(f64::NEG_INFINITY, f64::max);
    (lo, hi)
}

pub fn stat(mut v: Vec<f64>) -> (f64, f64, f64) {
    let m = median(&mut v);
    let (lo, hi) = spread(&v);
    (m, lo, hi)
}

pub fn read(cmd: &str) -> String {
    Command::new("sh")
        .args(["-c", cmd])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default()
}

/// The machine a section was measured on, as docs/benchmarks.md names it.
pub struct Machine {
    pub vcpus: String,
    pub cpu: String,
    pub kernel: String,
    /// The checkout's commit, short.
    pub commit: String,
}

impl Machine {
    pub fn read() -> Machine {
        Machine {
            vcpus: read("nproc"),
            cpu: read("grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'"),
            kernel: read("uname -r"),
            commit: read("git -C . rev-parse --short HEAD 2>/dev/null"),
        }
    }
}

/// A background process group, killed whole on drop.
pub struct Bg(pub Child);
impl Drop for Bg {
    fn drop(&mut self) {
        let pgid = format!("-{}", self.0.id());
        // Quiet: the group may be gone already.
        let _ = Command::new("kill")
            .args(["-TERM", "--", &pgid])
            .stderr(Stdio::null())
            .status();
        let _ = self.0.wait();
    }
}

/// `workload sleepers N SECS` in its own process group (killed when dropped),
/// once the host has at least `until` processes (30 s at most).
pub fn unrelated_sleepers(w: &Path, n: usize, secs: &str, until: usize) -> anyhow::Result<Bg> {
    let child = Command::new(w)
        .args(["sleepers", &n.to_string(), secs])
        .process_group(0)
        .stdout(Stdio::null())
        .spawn()
        .context("unrelated sleepers")?;
    let bg = Bg(child);
    let t0 = Instant::now();
    while count_procs() < until && t0.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(100));
    }
    Ok(bg)
}

/// The CPU time every thread of `pid` has run, ns: the scheduler's own clock
/// (`/proc/PID/task/*/schedstat`), which also holds what tick-based accounting
/// misses.
pub fn sched_ns(pid: u32) -> u64 {
    let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
        return 0;
    };
    tasks
        .flatten()
        .filter_map(|t| schedstat_ns(&t.path().join("schedstat")))
        .sum()
}

/// The run time a schedstat file (`/proc/…/schedstat`) gives, ns: its first field.
pub fn schedstat_ns(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path)
        .ok()?
        .split_whitespace()
        .next()?
        .parse()
        .ok()
}

pub fn count_procs() -> usize {
    std::fs::read_dir("/proc")
        .map(|d| {
            d.flatten()
                .filter(|e| {
                    e.file_name()
                        .to_str()
                        .is_some_and(|s| s.bytes().all(|b| b.is_ascii_digit()))
                })
                .count()
        })
        .unwrap_or(0)
}

/// Runs a command and returns the workload's `elapsed_secs` from its stdout.
pub fn workload_secs(cmd: &mut Command) -> anyhow::Result<f64> {
    let o = cmd
        .stderr(Stdio::null())
        .output()
        .with_context(|| format!("{cmd:?}"))?;
    if !o.status.success() {
        bail!("{cmd:?} failed: {}", o.status);
    }
    let out = String::from_utf8_lossy(&o.stdout);
    let v: Value =
        serde_json::from_str(out.trim()).with_context(|| format!("{cmd:?} printed {out:?}"))?;
    v["elapsed_secs"].as_f64().context("elapsed_secs")
}
