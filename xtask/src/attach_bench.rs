//! `cargo xtask bench --only-attach`: what a sample costs when the tracker attaches
//! to a running tree (`--pid`, the Python package's path), ours beside the peers in
//! one run: trees of idle sleepers, every thread's run time by the scheduler's clock.

use std::{
    os::unix::process::CommandExt as _,
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::Context as _;

use crate::measure::{sched_ns, stat, Bg, Machine};

pub const ATTACH_MARK: &str = "## Attached: cost per sample";

/// One tool's command line, the tree's root appended where it takes one.
struct Tool {
    name: &'static str,
    argv: Vec<String>,
    takes_pid: bool,
}

/// `exe` and its arguments, given as one space-separated string.
fn argv(exe: &str, args: &str) -> Vec<String> {
    std::iter::once(exe)
        .chain(args.split_whitespace())
        .map(str::to_string)
        .collect()
}

fn tools(dir: &Path) -> Vec<Tool> {
    let tr = dir.join("resource-tracker").display().to_string();
    let root = crate::root();
    let tool = |name, argv| Tool {
        name,
        argv,
        takes_pid: true,
    };
    let mut v = vec![
        tool(
            "ours, eBPF (`--pid`)",
            argv(&tr, "-q -i 1 -o /dev/null --pid"),
        ),
        tool(
            "ours, procfs (`--pid --no-ebpf`)",
            argv(&tr, "-q --no-ebpf -i 1 -o /dev/null --pid"),
        ),
        // The flags the Python package starts the binary with (tracker.py).
        tool(
            "ours as the Python package starts it (eBPF, JSON lines, events)",
            argv(
                &tr,
                "-i 1 -f json -q -o /dev/null --summary /dev/null --events /dev/null --pid",
            ),
        ),
    ];
    let rs = root.join("target/peers/rs/bin/resource-tracker");
    if rs.exists() {
        v.push(tool(
            "Rust resource-tracker 0.1.18 (`--pid`)",
            argv(&rs.display().to_string(), "-i 1 -o /dev/null --pid"),
        ));
    }
    let py = root.join("target/py-peers/bin/python");
    if py.exists() {
        let script = "import sys\nfrom resource_tracker import ProcessTracker\n\
                      ProcessTracker(pid=int(sys.argv[1]), interval=1, output_file='/dev/null')";
        v.push(tool(
            "Python resource-tracker 0.5.0 (`ProcessTracker(pid)`)",
            vec![py.display().to_string(), "-c".into(), script.into()],
        ));
    }
    v.push(Tool {
        name: "ours, host only (no tree)",
        argv: argv(&tr, "-q -i 1 -o /dev/null"),
        takes_pid: false,
    });
    v
}

/// The tool's run time per second (ms) over `window` after `warm`, every thread
/// of it by schedstat, attached to a fresh tree of `members` idle processes.
fn one(w: &Path, tool: &Tool, members: usize, warm: f64, window: f64) -> anyhow::Result<f64> {
    let tree = Bg(Command::new(w)
        .args(["sleepers", &(members - 1).to_string(), "120"])
        .process_group(0)
        .stdout(Stdio::null())
        .spawn()
        .context("workload sleepers")?);
    // Every sleeper forked before anything attaches.
    let t0 = Instant::now();
    while children(tree.0.id()) + 1 < members && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let mut cmd = Command::new(&tool.argv[0]);
    cmd.args(&tool.argv[1..]);
    if tool.takes_pid {
        cmd.arg(tree.0.id().to_string());
    }
    let t = Bg(cmd
        .process_group(0)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("{cmd:?}"))?);
    std::thread::sleep(Duration::from_secs_f64(warm));
    let (a, ta) = (sched_ns(t.0.id()), Instant::now());
    std::thread::sleep(Duration::from_secs_f64(window));
    let (b, tb) = (sched_ns(t.0.id()), Instant::now());
    anyhow::ensure!(b > a, "{}: not running after {warm} s ({cmd:?})", tool.name);
    Ok((b - a) as f64 / 1e6 / (tb - ta).as_secs_f64())
}

/// Each round's `a` over the same round's `b`: a tool's cells and its reference's
/// were measured minutes apart at most, where this VM's level moves 3× in an hour.
fn per_round(a: &[f64], b: &[f64]) -> Vec<f64> {
    a.iter().zip(b).map(|(a, b)| a / b).collect()
}

fn children(pid: u32) -> usize {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .map(|s| s.split_whitespace().count())
        .unwrap_or(0)
}

pub fn run(dir: &Path, quick: bool) -> anyhow::Result<String> {
    let w = dir.join("workload");
    let tools = tools(dir);
    let rounds = if quick { 1 } else { 3 };
    // Thirty samples, quick or not: Σ PSS reads each idle member again once
    // every 120 samples, a few each sample (engine/pss.rs `REFRESH_EVERY`), and
    // the probe reads every member whole every tenth (engine/ebpf `FULL_EVERY`),
    // so that every window holds its share of both.
    let (warm, window) = (3.0, 30.0);
    let sizes = [50usize, 300];
    let mut cells: Vec<Vec<Vec<f64>>> = vec![vec![Vec::new(); tools.len()]; sizes.len()];
    for _ in 0..rounds {
        for (si, &n) in sizes.iter().enumerate() {
            for (ti, tool) in tools.iter().enumerate() {
                let ms = one(&w, tool, n, warm, window)?;
                eprintln!("attach: {n} members, {}: {ms:.3} ms/s", tool.name);
                cells[si][ti].push(ms);
            }
        }
    }
    let m = Machine::read();
    let mut md = vec![
        ATTACH_MARK.to_string(),
        String::new(),
        format!(
            "Generated by `cargo xtask bench --only-attach` (release build) on {} vCPU ({}), kernel {}, tracker {}. A tree of N idle processes (`workload sleepers N-1 120`) is made, then a tool attaches to its root at `-i 1`; its cost is every thread's run time by the scheduler's clock (`/proc/PID/task/*/schedstat`) over {window} s after {warm} s, per second (a sample's worth). The tools take turns, tree by tree, {rounds} round(s); median (min–max). `ratio` is the median over rounds of the row's cell over ours on eBPF at that size in the same round; `× host only` the same over our host-only sample, with its min–max: this VM's level moves 3× within an hour, and a round's cells are minutes apart. Where the time goes: docs/cost.md, \"Attached\".",
            m.vcpus, m.cpu, m.kernel, m.commit
        ),
        String::new(),
        "| members | tool | ms per sample, median (min–max) | ratio to ours (eBPF) | × host only (min–max) |".into(),
        "|---|---|---|---|---|".into(),
    ];
    for (si, &n) in sizes.iter().enumerate() {
        let row = &cells[si];
        let host = tools.len() - 1;
        for (ti, tool) in tools.iter().enumerate() {
            let (med, lo, hi) = stat(row[ti].clone());
            let (vs_ours, _, _) = stat(per_round(&row[ti], &row[0]));
            let (x, xlo, xhi) = stat(per_round(&row[ti], &row[host]));
            md.push(format!(
                "| {n} | {} | **{med:.2}** ({lo:.2}–{hi:.2}) | {vs_ours:.2} | {x:.1} ({xlo:.1}–{xhi:.1}) |",
                tool.name,
            ));
        }
    }
    md.push(String::new());
    Ok(md.join("\n"))
}

pub fn write(path: &Path, md: &str) -> anyhow::Result<()> {
    crate::benchdoc::write_section(path, ATTACH_MARK, md)
}

/// This section of `old`, to keep through a run that does not measure it.
pub fn section(old: &str) -> Option<&str> {
    crate::benchdoc::doc_section(old, ATTACH_MARK)
}
