//! `cargo xtask soak [--minutes N]`: the release binary left running N minutes (10
//! by default) in two ways at once — host-only at 10 Hz, and `run` over a
//! continuous fork loop at 10 Hz — while its resident memory and open descriptors
//! are read every 5 s. Growth is taken from the first minute (allocator and caches
//! settled) to the end, as medians of 30 s of readings on each side, so one
//! reading's noise does not decide. It fails past 256 KiB or any descriptor, and
//! writes docs/soak.md.

use std::{
    fmt::Write as _,
    path::Path,
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};

const EVERY: Duration = Duration::from_secs(5);
const RSS_LIMIT_KIB: i64 = 256;

struct Soaked {
    name: &'static str,
    args: Vec<&'static str>,
    child: Child,
    /// (seconds since start, RSS KiB, open fds)
    readings: Vec<(f64, i64, i64)>,
}

fn rss_kib(pid: u32) -> Option<i64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()?
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
}

fn fds(pid: u32) -> Option<i64> {
    Some(std::fs::read_dir(format!("/proc/{pid}/fd")).ok()?.count() as i64)
}

fn median(mut v: Vec<i64>) -> i64 {
    v.sort_unstable();
    v.get(v.len() / 2).copied().unwrap_or(0)
}

/// Growth from the readings of the 30 s after `settle` to those of the last 30 s.
fn growth(r: &[(f64, i64, i64)], settle: f64, end: f64, pick: fn(&(f64, i64, i64)) -> i64) -> i64 {
    let early: Vec<i64> = r
        .iter()
        .filter(|x| x.0 >= settle && x.0 < settle + 30.0)
        .map(pick)
        .collect();
    let late: Vec<i64> = r.iter().filter(|x| x.0 >= end - 30.0).map(pick).collect();
    median(late) - median(early)
}

pub fn run(dir: &Path, args: &[String]) -> anyhow::Result<()> {
    let minutes: f64 = match args.iter().position(|a| a == "--minutes") {
        Some(i) => args
            .get(i + 1)
            .and_then(|v| v.parse().ok())
            .filter(|m| *m >= 2.0)
            .context("--minutes: a number of minutes, at least 2")?,
        None => 10.0,
    };
    let bin = dir.join("resource-tracker");
    let plans: [(&str, Vec<&str>); 2] = [
        ("host-only, 10 Hz", vec!["-q", "-i", "0.1"]),
        (
            "run over a fork loop, 10 Hz",
            vec![
                "run",
                "-q",
                "-i",
                "0.1",
                "--summary",
                "target/soak-summary.json",
                "--",
                "sh",
                "-c",
                "while :; do /bin/true; done",
            ],
        ),
    ];
    let mut soaked = Vec::new();
    for (name, a) in plans {
        let child = Command::new(&bin)
            .current_dir(crate::root())
            .args(&a)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .with_context(|| format!("starting {}", bin.display()))?;
        soaked.push(Soaked {
            name,
            args: a,
            child,
            readings: Vec::new(),
        });
    }
    let t0 = Instant::now();
    let total = Duration::from_secs_f64(minutes * 60.0);
    eprintln!("xtask soak: {minutes} minutes, readings every {EVERY:?}");
    while t0.elapsed() < total {
        std::thread::sleep(EVERY);
        let t = t0.elapsed().as_secs_f64();
        for s in &mut soaked {
            if let Ok(Some(st)) = s.child.try_wait() {
                bail!("{} ended early: {st}", s.name);
            }
            let pid = s.child.id();
            if let (Some(r), Some(f)) = (rss_kib(pid), fds(pid)) {
                s.readings.push((t, r, f));
            }
        }
    }
    let end = t0.elapsed().as_secs_f64();
    for s in &mut soaked {
        // SAFETY: signalling a child we started and have not reaped.
        unsafe { libc::kill(s.child.id() as i32, libc::SIGTERM) };
        s.child.wait().context("waiting for the tracker")?;
    }
    let (doc, failed) = report(&soaked, minutes, end);
    print!("{doc}");
    std::fs::write(crate::root().join("docs/soak.md"), &doc).context("docs/soak.md")?;
    if !failed.is_empty() {
        bail!("soak over its limits: {}", failed.join(", "));
    }
    Ok(())
}

/// docs/soak.md's text, and the soaks over their limits.
fn report(soaked: &[Soaked], minutes: f64, end: f64) -> (String, Vec<&'static str>) {
    let mut doc = String::new();
    let _ = writeln!(
        doc,
        "# Soak\n\nWritten by `cargo xtask soak` (the release binary, {minutes} minutes, \
         both at once; RSS and open descriptors read every 5 s; growth from the 30 s \
         after the first minute to the last 30 s, medians). Limits: RSS {RSS_LIMIT_KIB} KiB, \
         descriptors 0.\n\nMachine: {} vCPU, kernel {}.\n\n\
         | Soak | Command | RSS after 1 min (KiB) | RSS growth (KiB) | Peak RSS (KiB) | fd growth | Verdict |\n\
         |---|---|---|---|---|---|---|",
        std::thread::available_parallelism().map_or(0, |n| n.get()),
        std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .unwrap_or_default()
            .trim()
    );
    let mut failed = Vec::new();
    for s in soaked {
        let r = &s.readings;
        let settled = median(
            r.iter()
                .filter(|x| x.0 >= 60.0 && x.0 < 90.0)
                .map(|x| x.1)
                .collect(),
        );
        let rss = growth(r, 60.0, end, |x| x.1);
        let fd = growth(r, 60.0, end, |x| x.2);
        let peak = r.iter().map(|x| x.1).max().unwrap_or(0);
        let ok = rss <= RSS_LIMIT_KIB && fd <= 0;
        if !ok {
            failed.push(s.name);
        }
        let _ = writeln!(
            doc,
            "| {} | `resource-tracker {}` | {settled} | {rss:+} | {peak} | {fd:+} | {} |",
            s.name,
            s.args.join(" "),
            if ok { "ok" } else { "over the limit" }
        );
    }
    // How hard the fork loop worked: the tracked tree's process count.
    let spawned = std::fs::read_to_string(crate::root().join("target/soak-summary.json"))
        .ok()
        .and_then(|t| serde_json::from_str::<serde_json::Value>(&t).ok())
        .and_then(|v| v["processes_spawned"].as_f64());
    if let Some(n) = spawned {
        let _ = writeln!(
            doc,
            "\nThe fork loop's tree: {n:.0} processes, {:.0} a second.",
            n / end
        );
    }
    (doc, failed)
}
