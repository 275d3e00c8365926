//! The truth harness: a workload runs under the tracker inside a fresh cgroup that
//! holds exactly that workload, and the tracker's figures are compared with the
//! kernel's own accounting of that cgroup.

use std::{
    process::Command,
    time::{Duration, Instant},
};

use serde_json::Value;

use crate::{e2e::unix_now, read_json, read_jsonl, run, tracker, workload, Cgroup, Scratch};

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
    /// (Unix time, cgroup CPU ns) every ~2 ms while the tracker ran, with `poll`.
    pub series: Vec<(f64, u64)>,
}

/// How to run one tracked workload.
pub struct Opts<'a> {
    pub tag: &'a str,
    pub extra: &'a [&'a str],
    /// A workload mode and its arguments, or with `shell` one `sh -c` script.
    pub cmd: &'a [&'a str],
    pub shell: bool,
    /// Wait for the group to empty before reading the truth (off for members that
    /// outlive the root).
    pub settle: bool,
    pub interval: &'a str,
    /// Record the cgroup's CPU over time (`Tracked::series`).
    pub poll: bool,
    /// Runs beside the tracker, from its start; the tracker is waited for after.
    pub during: Option<&'a dyn Fn()>,
    /// The tracker runs in a v2 cgroup that may have no children
    /// (`cgroup.max.descendants` 0), so it cannot make one for the command: its
    /// CPU is then the backend's own sums, what a user without rights to make
    /// cgroups gets.
    pub backend_sums: bool,
    /// Set in the tracker's environment.
    pub env: &'a [(&'a str, &'a str)],
}

impl Default for Opts<'_> {
    fn default() -> Self {
        Opts {
            tag: "run",
            extra: &[],
            cmd: &[],
            shell: false,
            settle: true,
            interval: "0.2",
            poll: false,
            during: None,
            backend_sums: false,
            env: &[],
        }
    }
}

/// Runs `cmd` (a workload mode, or with `shell` a `sh -c` script) inside a fresh
/// cgroup under `resource-tracker run -i 0.2` plus `extra` flags. `settle` waits for
/// the group to empty before the truth is read (members that outlive the root).
pub fn track_cmd(tag: &str, extra: &[&str], cmd: &[&str], shell: bool, settle: bool) -> Tracked {
    track_with(&Opts {
        tag,
        extra,
        cmd,
        shell,
        settle,
        ..Opts::default()
    })
}

pub fn track_with(opts: &Opts) -> Tracked {
    let Opts {
        tag,
        extra,
        cmd,
        shell,
        settle,
        interval,
        poll,
        during,
        backend_sums,
        env,
    } = *opts;
    let cg = Cgroup::new(tag);
    let scratch = Scratch::new(tag);
    let (sum, out) = (scratch.path("summary.json"), scratch.path("samples.jsonl"));
    let pre = scratch.path("pre-join-ns");
    let w = workload();
    let full = backend_sums.then(|| FullCgroup::new(tag));
    let mut c = match &full {
        // `workload incgroup` joins it and execs the tracker.
        Some(f) => {
            let mut c = Command::new(&w);
            c.arg("incgroup").arg(&f.0).arg("--").arg(tracker());
            c
        }
        None => Command::new(tracker()),
    };
    c.args(["run", "-q", "-i", interval, "--summary"])
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
    c.envs(env.iter().copied());
    let mut series = Vec::new();
    let o = if poll {
        poll_while_running(&mut c, &cg, &mut series)
    } else if let Some(during) = during {
        let child = c
            .stdout(std::process::Stdio::piped())
            .stderr(std::process::Stdio::piped())
            .spawn()
            .unwrap_or_else(|e| panic!("cannot run {c:?}: {e}"));
        during();
        child.wait_with_output().expect("tracker output")
    } else {
        run(&mut c)
    };
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
    drop(full);
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
        series,
    }
}

/// Runs the tracker `c`, recording the cgroup's CPU in `series` every ~2 ms until
/// it exits.
fn poll_while_running(
    c: &mut Command,
    cg: &Cgroup,
    series: &mut Vec<(f64, u64)>,
) -> std::process::Output {
    let child = c
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {c:?}: {e}"));
    let pid = child.id() as i32;
    loop {
        series.push((unix_now(), cg.usage_ns()));
        // SAFETY: a non-reaping look at our own child.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let r = unsafe {
            libc::waitid(
                libc::P_PID,
                pid as libc::id_t,
                &mut info,
                libc::WEXITED | libc::WNOHANG | libc::WNOWAIT,
            )
        };
        // SAFETY: si_pid is set by waitid when a child changed state.
        if r != 0 || unsafe { info.si_pid() } == pid {
            break;
        }
        std::thread::sleep(Duration::from_millis(2));
    }
    child.wait_with_output().expect("tracker output")
}

/// A v2 cgroup that may have no children, removed when dropped (once its
/// processes are gone).
struct FullCgroup(std::path::PathBuf);

impl FullCgroup {
    fn new(tag: &str) -> FullCgroup {
        let base = if std::path::Path::new("/sys/fs/cgroup/unified/cgroup.procs").exists() {
            std::path::Path::new("/sys/fs/cgroup/unified")
        } else {
            std::path::Path::new("/sys/fs/cgroup")
        };
        let dir = base.join(format!("rt-full-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir(&dir);
        std::fs::create_dir(&dir)
            .unwrap_or_else(|e| panic!("cannot create cgroup {}: {e}", dir.display()));
        std::fs::write(dir.join("cgroup.max.descendants"), "0")
            .unwrap_or_else(|e| panic!("{}: {e}", dir.display()));
        FullCgroup(dir)
    }
}

impl Drop for FullCgroup {
    fn drop(&mut self) {
        for _ in 0..500 {
            if std::fs::remove_dir(&self.0).is_ok() {
                return;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

/// A workload mode whose members have all exited once the root has.
pub fn track(tag: &str, extra: &[&str], args: &[&str]) -> Tracked {
    track_cmd(tag, extra, args, false, true)
}

/// The cgroup's CPU (ns) at Unix time `t`, interpolated between the polls around it.
pub fn cgroup_cpu_at(series: &[(f64, u64)], t: f64) -> Option<f64> {
    let i = series.iter().position(|&(at, _)| at >= t)?;
    if i == 0 {
        return None;
    }
    let ((t0, c0), (t1, c1)) = (series[i - 1], series[i]);
    let w = if t1 > t0 { (t - t0) / (t1 - t0) } else { 1.0 };
    Some(c0 as f64 + w * (c1 as f64 - c0 as f64))
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
    ratio_of(t, summary_cpu_secs(t))
}

/// The summary's CPU, s.
pub fn summary_cpu_secs(t: &Tracked) -> f64 {
    f(&t.summary, "cpu_user_secs") + f(&t.summary, "cpu_system_secs")
}

/// `got` seconds relative to the truth, as `cpu_ratio`.
pub fn ratio_of(t: &Tracked, got: f64) -> f64 {
    let got = got * 1e9;
    let (lo, hi) = (t.truth_ns as f64, t.truth_hi_ns as f64);
    if got < lo {
        got / lo
    } else if got > hi {
        got / hi
    } else {
        1.0
    }
}

/// Σ CPU of the exit records of an `--events` file, s: every member's own figures
/// as the eBPF engine retired them (a process's threads in its record).
pub fn exit_records_cpu_secs(events: &[Value]) -> f64 {
    events
        .iter()
        .filter(|e| e["kind"] == "exit")
        .map(|e| e["cpu_secs"].as_f64().unwrap_or(0.0))
        .sum()
}

/// Members the summary names as freed unread (`exit_unread`): the kernel freed
/// their tasks without running the tracker's free program, and they count with
/// their figures at exit.
pub fn unread_members(summary: &Value) -> u64 {
    summary["degraded"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|d| d["name"] == "exit_unread")
        .filter_map(|d| {
            d["detail"]
                .as_str()?
                .split_whitespace()
                .next()?
                .parse::<u64>()
                .ok()
        })
        .sum()
}

/// How far short the tracker says its CPU may be, in seconds: each member it names
/// as freed unread counts with its figures at exit, which lag by up to one tick,
/// and its exit path (1 ms is far more than the test workloads' exit paths take)
/// comes on top.
pub fn unread_allowance_secs(summary: &Value) -> f64 {
    unread_members(summary) as f64 * (tick_secs() + 0.001)
}

/// The scheduler tick (CONFIG_HZ) of the running kernel, from its config; 10 ms
/// (HZ=100, the longest) when the config cannot be read.
fn tick_secs() -> f64 {
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let config = std::process::Command::new("sh")
        .args([
            "-c",
            "zcat /proc/config.gz 2>/dev/null || cat /boot/config-\"$1\"",
            "sh",
        ])
        .arg(release.trim())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).into_owned())
        .unwrap_or_default();
    config
        .lines()
        .find_map(|l| l.strip_prefix("CONFIG_HZ="))
        .and_then(|v| v.trim().parse::<f64>().ok())
        .map_or(0.01, |hz| 1.0 / hz)
}

/// Exact within `tolerance` of the cgroup's CPU. Where the figure is the backend's
/// sums (not `cpu_source` `cgroup`) and the summary names members freed unread
/// (`exit_unread`), the tracker says they count with their figures at exit:
/// `sum_exec_runtime` there lags by up to one tick, and the exit path (1 ms is far
/// more than these small workloads' exit paths take) comes on top. That claim is
/// checked instead: never above the cgroup, short by no more than that per named
/// member.
pub fn assert_exact_cpu(t: &Tracked, what: &str, tolerance: f64) {
    let from_cgroup = t.summary["cpu_source"] == "cgroup";
    assert_exact_secs(t, summary_cpu_secs(t), !from_cgroup, what, tolerance);
}

/// `got` seconds exact within `tolerance` of the cgroup's CPU; with `unread_allowed`,
/// held to what the summary says of members freed unread where it names them.
pub fn assert_exact_secs(t: &Tracked, got: f64, unread_allowed: bool, what: &str, tolerance: f64) {
    let truth = t.truth_ns as f64 / 1e9;
    let err = (ratio_of(t, got) - 1.0).abs();
    eprintln!(
        "{what}: tracker {got:.6} s, cgroup {truth:.6}–{:.6} s, error {:.3} %",
        t.truth_hi_ns as f64 / 1e9,
        err * 100.0
    );
    let unread = unread_members(&t.summary);
    if unread_allowed && unread > 0 && err >= tolerance {
        let hi = t.truth_hi_ns as f64 / 1e9;
        let allowed = unread_allowance_secs(&t.summary) + truth * tolerance;
        eprintln!(
            "{what}: {unread} member(s) freed unread: {:.2} ms short, at most {:.2} ms allowed",
            (truth - got) * 1e3,
            allowed * 1e3
        );
        assert!(
            got <= hi * (1.0 + tolerance) && truth - got <= allowed,
            "{what}: tracker {got} s vs cgroup {truth} s with {unread} member(s) freed unread \
             ({:.2} ms short, {:.2} ms allowed)",
            (truth - got) * 1e3,
            allowed * 1e3
        );
        return;
    }
    assert!(
        err < tolerance,
        "{what}: tracker {got} s vs cgroup {truth} s ({:.2} % off, {:.2} % allowed)",
        err * 100.0,
        tolerance * 100.0
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unread_members_are_read_from_the_named_degradation() {
        let none = serde_json::json!({"degraded": []});
        assert_eq!(unread_members(&none), 0);
        let two = serde_json::json!({"degraded": [
            {"name": "ring_full", "detail": "9 records lost"},
            {"name": "exit_unread", "detail": "2 member(s) whose task the kernel freed"},
        ]});
        assert_eq!(unread_members(&two), 2);
        assert!(tick_secs() > 0.0 && tick_secs() <= 0.01);
    }
}
