//! The truth harness: a workload runs under the tracker inside a fresh cgroup that
//! holds exactly that workload, and the tracker's figures are compared with the
//! kernel's own accounting of that cgroup.

use std::{
    process::Command,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{read_json, read_jsonl, run, tracker, workload, Cgroup, Scratch};

/// One tracked run and the kernel's accounting of it.
pub struct Tracked {
    pub summary: Value,
    pub samples: Vec<Value>,
    /// CPU of the cgroup plus what the root used before it joined, ns: the root's
    /// own join falls between `truth_ns` and `truth_hi_ns`.
    pub truth_ns: u64,
    pub truth_hi_ns: u64,
    /// Storage bytes (read, written) of the cgroup.
    pub truth_io: (u64, u64),
    /// Peak memory of the cgroup, bytes.
    pub truth_peak: Option<u64>,
    /// The workload's JSON line, or Null for a command that prints none.
    pub workload_out: Value,
    pub code: i32,
    pub stderr: String,
}

/// Runs `cmd` (a workload mode, or with `shell` a `sh -c` script) inside a fresh
/// cgroup under `resource-tracker run -i 0.2` plus `extra` flags. `settle` waits for
/// the group to empty before the truth is read (members that outlive the root).
pub fn track_cmd(tag: &str, extra: &[&str], cmd: &[&str], shell: bool, settle: bool) -> Tracked {
    let cg = Cgroup::new(tag);
    let scratch = Scratch::new(tag);
    let (sum, out) = (scratch.path("summary.json"), scratch.path("samples.jsonl"));
    let pre = scratch.path("pre-join-ns");
    let w = workload();
    let mut c = Command::new(tracker());
    c.args(["run", "-q", "-i", "0.2", "--summary"])
        .arg(&sum)
        .arg("--output")
        .arg(&out)
        .args(extra)
        .arg("--")
        .arg(&w)
        .arg("incgroup")
        .arg(cg.join_arg())
        .arg("--pre")
        .arg(&pre)
        .arg("--");
    if shell {
        c.args(["/bin/sh", "-c"]).args(cmd);
    } else {
        c.arg(&w).args(cmd);
    }
    c.current_dir(&scratch.0);
    let o = run(&mut c);
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!stderr.contains("panicked"), "{stderr}");
    if settle {
        let t0 = Instant::now();
        while cg.procs() > 0 && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(10));
        }
    }
    let stdout = String::from_utf8_lossy(&o.stdout);
    let workload_out = if shell || stdout.trim().is_empty() {
        Value::Null
    } else {
        serde_json::from_str(stdout.trim())
            .unwrap_or_else(|e| panic!("workload said {stdout:?}: {e}; tracker said {stderr}"))
    };
    let cg_ns = cg.usage_ns();
    let window: Vec<u64> = std::fs::read_to_string(&pre)
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|v| v.parse().ok())
        .collect();
    let [before, after] = window[..] else {
        panic!("pre-join CPU window: {window:?}")
    };
    Tracked {
        summary: read_json(&sum),
        samples: read_jsonl(&out),
        truth_ns: cg_ns + before,
        truth_hi_ns: cg_ns + after,
        truth_io: cg.io_bytes(),
        truth_peak: cg.peak_memory(),
        workload_out,
        code: o.status.code().unwrap_or(-1),
        stderr,
    }
}

/// A workload mode whose members have all exited once the root has.
pub fn track(tag: &str, extra: &[&str], args: &[&str]) -> Tracked {
    track_cmd(tag, extra, args, false, true)
}

pub fn f(v: &Value, k: &str) -> f64 {
    v[k].as_f64()
        .unwrap_or_else(|| panic!("{k} missing in {v}"))
}

pub fn u(v: &Value, k: &str) -> u64 {
    v[k].as_u64()
        .unwrap_or_else(|| panic!("{k} missing in {v}"))
}

/// The sum of per-interval CPU and counts equals the run total, and the last
/// sample's cumulative value equals it too.
pub fn check_adds_up(t: &Tracked) {
    let per_interval: f64 = t
        .samples
        .iter()
        .map(|s| f(&s["process"], "utime_secs") + f(&s["process"], "stime_secs"))
        .sum();
    let total = f(&t.summary, "cpu_user_secs") + f(&t.summary, "cpu_system_secs");
    assert!(
        (per_interval - total).abs() < 1e-6,
        "intervals {per_interval} vs total {total}"
    );
    let last = t.samples.last().expect("at least one sample");
    assert!((f(&last["process"], "cpu_secs_total") - total).abs() < 1e-6);
    for (per, tot) in [
        ("processes_spawned", "processes_spawned"),
        ("write_bytes", "write_bytes"),
        ("read_bytes", "read_bytes"),
        ("wchar_bytes", "wchar_bytes"),
    ] {
        let sum: u64 = t.samples.iter().map(|s| u(&s["process"], per)).sum();
        assert_eq!(sum, u(&t.summary, tot), "per-interval {per} adds up");
    }
}

/// The tracker's CPU relative to the truth (1.0 is exact): to the nearer end of the
/// truth's window, and exactly 1.0 inside it.
pub fn cpu_ratio(t: &Tracked) -> f64 {
    let got = (f(&t.summary, "cpu_user_secs") + f(&t.summary, "cpu_system_secs")) * 1e9;
    let (lo, hi) = (t.truth_ns as f64, t.truth_hi_ns as f64);
    if got < lo {
        got / lo
    } else if got > hi {
        got / hi
    } else {
        1.0
    }
}

pub fn assert_exact_cpu(t: &Tracked, what: &str, tolerance: f64) {
    let truth = t.truth_ns as f64 / 1e9;
    let got = f(&t.summary, "cpu_user_secs") + f(&t.summary, "cpu_system_secs");
    let err = (cpu_ratio(t) - 1.0).abs();
    eprintln!(
        "{what}: tracker {got:.6} s, cgroup {truth:.6}–{:.6} s, error {:.3} %",
        t.truth_hi_ns as f64 / 1e9,
        err * 100.0
    );
    assert!(
        err < tolerance,
        "{what}: tracker {got} s vs cgroup {truth} s ({:.2} % off, {:.2} % allowed)",
        err * 100.0,
        tolerance * 100.0
    );
}
