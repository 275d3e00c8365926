//! `cargo xtask bench`: the engine's overhead and cost figures, measured interleaved
//! (A B A B …) in one run, reported as medians with min–max, and written to
//! docs/benchmarks.md together with the machine and the exact commands.

use std::{
    fmt::Write as _,
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};
use serde_json::Value;

use crate::{
    benchdoc::PEERS_MARK,
    measure::{count_procs, read, stat, unrelated_sleepers, workload_secs},
};

fn wall_of(cmd: &mut Command) -> anyhow::Result<f64> {
    let t = Instant::now();
    let st = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .with_context(|| format!("{cmd:?}"))?;
    if !st.success() {
        bail!("{cmd:?} failed: {st}");
    }
    Ok(t.elapsed().as_secs_f64())
}

/// Wall time (s) and peak RSS (MiB, the kernel's ru_maxrss) of one run.
/// Wall seconds, peak RSS (MiB) and CPU seconds (user + system, from wait4: the
/// command and the children it waited for) of one run.
fn wall_and_peak(cmd: &mut Command) -> anyhow::Result<(f64, f64, f64)> {
    let t = Instant::now();
    let child = cmd
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("{cmd:?}"))?;
    let mut status = 0;
    // SAFETY: rusage is plain data the kernel fills; the pid is our child's.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::wait4(child.id() as i32, &mut status, 0, &mut ru) };
    let wall = t.elapsed().as_secs_f64();
    if r < 0 || !libc::WIFEXITED(status) || libc::WEXITSTATUS(status) != 0 {
        bail!("{cmd:?} failed (wait status {status})");
    }
    let secs = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    let cpu = secs(ru.ru_utime) + secs(ru.ru_stime);
    Ok((wall, ru.ru_maxrss as f64 / 1024.0, cpu))
}

const COST_MARK: &str = "## Tracker cost per sample";
const STARTUP_MARK: &str = "## Start-up";

/// One run's cost: the tracker's CPU per sample (ms) from its samples, those other
/// than the first and the last; its CPU per second (ms) by the scheduler's clock,
/// from 2.5 s after the start to 1.5 s before the end (at `-i 1`, a sample's
/// worth); and its largest RSS (MiB).
fn cost_run(
    tr: &Path,
    w: &Path,
    backend: &str,
    secs: &str,
    otlp: &str,
) -> anyhow::Result<(Vec<f64>, Option<f64>, f64)> {
    let out = std::env::temp_dir().join("rt-bench-samples.jsonl");
    let n: u64 = secs.parse().unwrap_or(4);
    let mut cmd = Command::new(tr);
    if backend == OTLP_ROW {
        // One OTLP request a sample, the most the variables can ask at `-i 1`.
        cmd.env("OTEL_EXPORTER_OTLP_ENDPOINT", otlp)
            .env("OTEL_METRIC_EXPORT_INTERVAL", "1000");
    }
    if backend == "host only" {
        // No tree: host collectors alone, stopped with SIGTERM.
        cmd.args(["-q", "-i", "1", "-o"]).arg(&out);
    } else {
        cmd.args(["run", "-q", "-i", "1", "-o"]).arg(&out);
        if backend == "procfs" {
            cmd.arg("--no-ebpf");
        }
        cmd.arg("--").arg(w).args(["sleepers", "49", secs]);
    }
    let mut child = cmd
        .stdout(Stdio::null())
        .spawn()
        .with_context(|| format!("{cmd:?}"))?;
    let pid = child.id();
    std::thread::sleep(Duration::from_millis(2500));
    let (a, ta) = (crate::measure::sched_ns(pid), Instant::now());
    std::thread::sleep(Duration::from_secs_f64((n as f64 - 4.0).max(1.0)));
    let (b, tb) = (crate::measure::sched_ns(pid), Instant::now());
    let sched = (a > 0 && b > a).then(|| (b - a) as f64 / 1e6 / (tb - ta).as_secs_f64());
    if backend == "host only" {
        std::thread::sleep(Duration::from_millis(1500));
        // SAFETY: signalling our own child.
        unsafe { libc::kill(pid as i32, libc::SIGTERM) };
    }
    let st = child.wait().with_context(|| format!("{cmd:?}"))?;
    if !st.success() && backend != "host only" {
        bail!("{cmd:?} failed ({st})");
    }
    let text = std::fs::read_to_string(&out)?;
    let samples: Vec<Value> = text
        .lines()
        .filter_map(|l| serde_json::from_str(l).ok())
        .collect();
    let inner = &samples[1.min(samples.len())..samples.len().saturating_sub(1)];
    let cpu = inner
        .iter()
        .filter_map(|s| s["tracker"]["cpu_secs"].as_f64())
        .map(|s| s * 1e3)
        .collect();
    let rss = samples
        .iter()
        .filter_map(|s| s["tracker"]["rss_mib"].as_f64())
        .fold(0.0, f64::max);
    Ok((cpu, sched, rss))
}

/// Section 2: the cost per sample. Each cell pools the samples of several runs, the
/// backends interleaved (A B C A B C …): one run per cell moved by 40 % with what
/// else the shared machine did meanwhile.
/// The cost table's row with the OTLP export on (eBPF).
const OTLP_ROW: &str = "ebpf, OTLP export";

/// A collector that answers every OTLP/HTTP request with 200 and an empty body,
/// on 127.0.0.1, for the cost bench's OTLP row: the tracker's side of the export
/// alone. Its URL.
fn otlp_sink() -> anyhow::Result<String> {
    use std::io::{BufRead as _, Read as _, Write as _};
    let l = std::net::TcpListener::bind("127.0.0.1:0").context("binding 127.0.0.1:0")?;
    let url = format!("http://{}", l.local_addr()?);
    std::thread::spawn(move || {
        for conn in l.incoming().flatten() {
            std::thread::spawn(move || {
                let Ok(w) = conn.try_clone() else { return };
                let (mut r, mut w) = (std::io::BufReader::new(conn), w);
                loop {
                    let mut len = 0usize;
                    let mut line = String::new();
                    loop {
                        line.clear();
                        if r.read_line(&mut line).unwrap_or(0) == 0 {
                            return;
                        }
                        if line == "\r\n" {
                            break;
                        }
                        if let Some(v) = line.to_ascii_lowercase().strip_prefix("content-length:") {
                            len = v.trim().parse().unwrap_or(0);
                        }
                    }
                    let mut body = vec![0; len];
                    if r.read_exact(&mut body).is_err()
                        || w.write_all(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
                            .is_err()
                    {
                        return;
                    }
                }
            });
        }
    });
    Ok(url)
}

fn cost_section(tr: &Path, w: &Path, quick: bool) -> anyhow::Result<Vec<String>> {
    let m = crate::measure::Machine::read();
    let mut md = vec![
        format!("{COST_MARK} (goal: ≤ 0.25 ms CPU per sample at 1 s by the scheduler's clock, RSS ≤ 10 MiB)"),
        String::new(),
        format!("Measured on {} vCPU ({}), kernel {}, tracker {}.", m.vcpus, m.cpu, m.kernel, m.commit),
        String::new(),
        "Tree: `workload sleepers 49 SECS` (root + 49 children = 50 processes), `--interval 1`. Samples other than the first and the last are counted, pooled over the runs (backends interleaved run by run). Every sample includes the host collectors (cpu, memory, disk, network); `host only` runs them without a tree, which is what a system-only sample costs; `ebpf, OTLP export` is the eBPF run with the OTLP export on, one request a sample (`OTEL_METRIC_EXPORT_INTERVAL=1000`, gzip'd protobuf) to a collector on 127.0.0.1 that answers 200 at once: its difference from the `ebpf` row is the export's cost per sample. Two measures: the samples' own `tracker.cpu_secs` (user + system time, `getrusage`), and every thread's time by the scheduler's clock (`/proc/PID/task/*/schedstat`) over a steady stretch of each run, per second (a sample's worth). The `floor` row is a loop in the bench itself that makes only the kernel calls every host sample needs (the timer's wake-up and read, one read each of /proc/stat, meminfo, diskstats and net/dev, `statfs` of /, a 3 KB write), parses nothing, and is timed the same way, one sample a second: what this machine charges before any of the tracker's own work. Where the time goes: docs/cost.md.".into(),
        String::new(),
        "| unrelated host processes | backend | runs | CPU per sample, median (min–max) | by schedstat, ms per s, median (min–max) | tracker RSS (MiB) |".into(),
        "|---|---|---|---|---|---|".into(),
    ];
    let secs = if quick { "4" } else { "8" };
    let runs = if quick { 1 } else { 3 };
    const BACKENDS: [&str; 4] = ["ebpf", OTLP_ROW, "procfs", "host only"];
    let otlp = otlp_sink()?;
    for unrelated in [0usize, 3000] {
        let _bg = if unrelated > 0 {
            Some(unrelated_sleepers(w, unrelated, "600", unrelated)?)
        } else {
            None
        };
        let hostn = count_procs();
        let mut cpu: [Vec<f64>; 4] = Default::default();
        let mut sched: [Vec<f64>; 4] = Default::default();
        let mut rss = [0.0f64; 4];
        let mut floor = Vec::new();
        let floor_samples = secs.parse::<u32>().unwrap_or(4).saturating_sub(3).max(1);
        for _ in 0..runs {
            for (i, backend) in BACKENDS.iter().enumerate() {
                let (c, by_sched, r) = cost_run(tr, w, backend, secs, &otlp)?;
                cpu[i].extend(c);
                sched[i].extend(by_sched);
                rss[i] = rss[i].max(r);
            }
            floor.push(crate::floor::per_sample_ms(
                Duration::from_secs(1),
                floor_samples,
            )?);
        }
        for (i, backend) in BACKENDS.iter().enumerate() {
            let (m, lo, hi) = stat(std::mem::take(&mut cpu[i]));
            let (sm, slo, shi) = stat(std::mem::take(&mut sched[i]));
            md.push(format!(
                "| {unrelated} (host total {hostn}) | {backend} | {runs} | **{m:.3} ms** ({lo:.3}–{hi:.3}) | **{sm:.3}** ({slo:.3}–{shi:.3}) | {:.1} |",
                rss[i]
            ));
        }
        let (fm, flo, fhi) = stat(floor);
        md.push(format!(
            "| {unrelated} (host total {hostn}) | floor: a host sample's kernel calls alone | {runs} | | **{fm:.3}** ({flo:.3}–{fhi:.3}) | |"
        ));
    }
    md.push(String::new());
    Ok(md)
}

/// `--only-cost`: every other section kept as it is; the cost per sample replaced.
fn only_cost(dir: &Path, path: &Path) -> anyhow::Result<()> {
    replace_section(path, COST_MARK, || {
        cost_section(&dir.join("resource-tracker"), &dir.join("workload"), false)
    })
}

/// `--only-startup`: every other section kept as it is; the start-up's replaced,
/// 14 runs of each command (after a warm-up) as in the whole bench.
fn only_startup(dir: &Path, path: &Path) -> anyhow::Result<()> {
    replace_section(path, STARTUP_MARK, || {
        startup_section(&dir.join("resource-tracker"), 7)
    })
}

/// Replaces the section of `path` that starts with `mark` (up to the next `## `)
/// with what `measure` gives; the file is read first, so a missing section fails
/// before anything is measured.
fn replace_section(
    path: &Path,
    mark: &str,
    measure: impl FnOnce() -> anyhow::Result<Vec<String>>,
) -> anyhow::Result<()> {
    let old =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let (head, rest) = old
        .split_once(mark)
        .with_context(|| format!("no {mark:?} section in {}", path.display()))?;
    let tail = rest.find("\n## ").map_or("", |i| &rest[i + 1..]);
    let md = measure()?;
    std::fs::write(path, format!("{head}{}\n{tail}", md.join("\n")))
        .with_context(|| format!("writing {}", path.display()))?;
    eprintln!("xtask: wrote {}", path.display());
    Ok(())
}

/// The value after flag `k` in `args`.
fn flag_value(args: &[String], k: &str) -> Option<String> {
    args.iter()
        .position(|a| a == k)
        .and_then(|i| args.get(i + 1))
        .cloned()
}

/// What the real-workload benches share: `--runs N` (1 with `--quick`, else 5)
/// and `--conditions quiet|churn|both` as (runs, quiet, churn).
fn runs_and_conditions(args: &[String], quick: bool) -> anyhow::Result<(usize, bool, bool)> {
    let runs = match flag_value(args, "--runs") {
        Some(n) => n.parse().context("--runs N")?,
        None if quick => 1,
        None => 5,
    };
    let cond = flag_value(args, "--conditions").unwrap_or_else(|| "both".into());
    Ok((runs, cond != "churn", cond != "quiet"))
}

/// `--only-attach-exact`: every other section kept as it is; the attach path's
/// exactness replaced (or added).
fn only_attach_exact(dir: &Path, args: &[String], quick: bool, path: &Path) -> anyhow::Result<()> {
    let (runs, quiet, churn) = runs_and_conditions(args, quick)?;
    let plan = crate::attach_exact::Plan {
        runs,
        only: flag_value(args, "--workload"),
        quiet,
        churn,
    };
    let md = crate::attach_exact::run(dir, &plan)?;
    crate::attach_exact::write(path, &md)?;
    eprintln!("xtask: wrote {}", path.display());
    Ok(())
}

/// `--only-real`: every other section kept as it is; the real workloads' replaced
/// (or added), measured now or rendered again from an earlier run's raw file.
fn only_real(dir: &Path, args: &[String], quick: bool, path: &Path) -> anyhow::Result<()> {
    // Keep every other section as it is; replace (or add) the real workloads'.
    let val = |k: &str| flag_value(args, k);
    let (runs, quiet, churn) = runs_and_conditions(args, quick)?;
    let only = val("--workload");
    let skip = val("--skip");
    let peer_runs = match val("--peer-runs") {
        Some(n) => n.parse().context("--peer-runs N")?,
        None => runs,
    };
    let plan = crate::real_bench::Plan {
        runs,
        peer_runs,
        only: only.as_deref(),
        skip: skip.as_deref(),
        quiet,
        churn,
    };
    let raw = crate::root().join("target/realbench/raw.jsonl");
    let m = match val("--from-raw") {
        // Render again what an earlier run appended, without measuring.
        Some(f) => crate::real_bench::load(Path::new(&f))?,
        None => crate::real_bench::measure(dir, &plan, &raw)?,
    };
    let mut cmdline = "cargo xtask bench --only-real".to_string();
    for (k, v) in [
        ("--runs", val("--runs")),
        ("--peer-runs", val("--peer-runs")),
        ("--workload", only.clone()),
        ("--skip", skip.clone()),
        ("--conditions", val("--conditions")),
        ("--from-raw", val("--from-raw")),
    ] {
        if let Some(v) = v {
            cmdline.push_str(&format!(" {k} {}", crate::real_bench::quote(&v)));
        }
    }
    let md = crate::real_bench::render(&m, &cmdline);
    println!("{md}");
    crate::real_bench::write(path, &md)?;
    eprintln!(
        "xtask: wrote {} (raw runs: {})",
        path.display(),
        raw.display()
    );
    Ok(())
}

/// Overhead on the tracked workload's own elapsed time: each storm untracked, on
/// eBPF and on procfs, interleaved.
fn overhead_section(
    tr: &Path,
    w: &Path,
    storms: &[(&str, Vec<&str>)],
    reps: usize,
) -> anyhow::Result<Vec<String>> {
    let mut out: Vec<String> = vec![
        "## Overhead on the tracked workload (goal: fork/exec ≤ 1.02, context switches ≤ 1.03)"
            .into(),
        String::new(),
        "| workload | command | untracked (s) | tracked, ebpf (s) | ratio median (min–max) | tracked, procfs (s) | ratio |".into(),
        "|---|---|---|---|---|---|---|".into(),
    ];
    for (name, wargs) in storms {
        let (mut a, mut b, mut c, mut rb, mut rc) = (vec![], vec![], vec![], vec![], vec![]);
        for _ in 0..reps {
            let x = workload_secs(Command::new(w).args(wargs))?;
            let y = workload_secs(
                Command::new(tr)
                    .args(["run", "-q", "--"])
                    .arg(w)
                    .args(wargs),
            )?;
            let z = workload_secs(
                Command::new(tr)
                    .args(["run", "-q", "--no-ebpf", "--"])
                    .arg(w)
                    .args(wargs),
            )?;
            rb.push(y / x);
            rc.push(z / x);
            a.push(x);
            b.push(y);
            c.push(z);
        }
        let (ma, _, _) = stat(a);
        let (mb, _, _) = stat(b);
        let (mc, _, _) = stat(c);
        let (r, lo, hi) = stat(rb);
        let (r2, lo2, hi2) = stat(rc);
        out.push(format!(
            "| {name} | `workload {}` | {ma:.3} | {mb:.3} | **{r:.3}** ({lo:.3}–{hi:.3}) | {mc:.3} | {r2:.3} ({lo2:.3}–{hi2:.3}) |",
            wargs.join(" ")
        ));
    }
    out.push(String::new());
    Ok(out)
}

/// Wall time and peak memory of `run -q -- true`, eBPF and procfs, beside `true`.
fn startup_section(tr: &Path, reps: usize) -> anyhow::Result<Vec<String>> {
    let mut out: Vec<String> = vec![
        format!("{STARTUP_MARK}: `resource-tracker run -q -- true` (goals: CPU ≤ 15 ms, wall ≤ 25 ms, peak RSS ≤ 20 MiB)"),
        String::new(),
    ];
    let cmds: [Vec<&str>; 2] = [
        vec!["run", "-q", "--", "true"],
        vec!["run", "-q", "--no-ebpf", "--", "true"],
    ];
    let (mut a, mut walls, mut rss, mut cpus) =
        (vec![], [vec![], vec![]], [vec![], vec![]], [vec![], vec![]]);
    // One warm-up round, not counted: the first start after a build pays for the
    // page cache and the kernel's first BTF parse.
    for args in &cmds {
        wall_and_peak(Command::new(tr).args(args))?;
    }
    for _ in 0..(reps * 2) {
        a.push(wall_of(&mut Command::new("true"))? * 1e3);
        for (i, args) in cmds.iter().enumerate() {
            let (w, r, c) = wall_and_peak(Command::new(tr).args(args))?;
            walls[i].push(w * 1e3);
            rss[i].push(r);
            cpus[i].push(c * 1e3);
        }
    }
    let (ma, la, ha) = stat(a);
    out.push("| command | CPU ms, median (min–max) | wall ms, median (min–max) | peak RSS MiB, median (min–max) |".into());
    out.push("|---|---|---|---|".into());
    out.push(format!("| `true` | | {ma:.1} ({la:.1}–{ha:.1}) | |"));
    for (i, label) in [
        "`resource-tracker run -q -- true` (ebpf)",
        "`resource-tracker run -q --no-ebpf -- true`",
    ]
    .iter()
    .enumerate()
    {
        let (mc, lc, hc) = stat(cpus[i].clone());
        let (mw, lw, hw) = stat(walls[i].clone());
        let (mr, lr, hr) = stat(rss[i].clone());
        out.push(format!(
            "| {label} | **{mc:.1}** ({lc:.1}–{hc:.1}) | **{mw:.1}** ({lw:.1}–{hw:.1}) | **{mr:.1}** ({lr:.1}–{hr:.1}) |"
        ));
    }
    // Each round runs both commands back to back, so the per-round difference is
    // what eBPF adds, with most of the VM's drift between rounds taken out.
    let paired: Vec<f64> = cpus[0].iter().zip(&cpus[1]).map(|(e, p)| e - p).collect();
    let (md, ld, hd) = stat(paired);
    out.push(format!(
        "| eBPF's part: the two CPU figures' difference within each round | **{md:.1}** ({ld:.1}–{hd:.1}) | | |"
    ));
    out.push(String::new());
    out.push(format!("CPU: user + system time of the tracker and the command it waited for (`wait4`); the command here is `true`. {} runs of each command after one warm-up, the two alternated. Where it goes: docs/engine.md, \"Start-up\".", reps * 2));
    out.push(String::new());
    out.extend(verifier_lines(tr, reps)?);
    Ok(out)
}

/// The verifier's work per program at a start: the wall time of each program's
/// `BPF_PROG_LOAD` and the instructions it processed (`verified_insns`), as the
/// tracker logs them at debug level, over `reps` starts.
fn verifier_lines(tr: &Path, reps: usize) -> anyhow::Result<Vec<String>> {
    let mut progs: Vec<(String, Vec<f64>, String)> = Vec::new();
    for _ in 0..reps {
        let out = Command::new(tr)
            .args(["run", "-q", "--", "true"])
            .env("RUST_LOG", "debug")
            .stdout(Stdio::null())
            .output()
            .with_context(|| format!("{} run -q -- true", tr.display()))?;
        for line in String::from_utf8_lossy(&out.stderr).lines() {
            // "… verified NAME: 2.10 ms, 1440 instructions processed"
            let Some((_, rest)) = line.split_once("] verified ") else {
                continue;
            };
            let Some((name, rest)) = rest.split_once(": ") else {
                continue;
            };
            let Some((ms, rest)) = rest.split_once(" ms, ") else {
                continue;
            };
            let (Ok(ms), Some(insns)) = (ms.parse::<f64>(), rest.split(' ').next()) else {
                continue;
            };
            match progs.iter_mut().find(|p| p.0 == name) {
                Some(p) => p.1.push(ms),
                None => progs.push((name.to_string(), vec![ms], insns.to_string())),
            }
        }
    }
    anyhow::ensure!(
        !progs.is_empty(),
        "{} logged no program's verification at debug level",
        tr.display()
    );
    let mut out = vec![
        format!("The verifier's work per program at a start, {reps} starts (`BPF_PROG_LOAD`'s wall time, as the tracker logs it at debug level; instructions processed: `verified_insns`):"),
        String::new(),
        "| program | verification ms, median (min–max) | instructions processed |".into(),
        "|---|---|---|".into(),
    ];
    let mut total = vec![0.0; reps];
    for (name, ms, insns) in progs {
        for (t, m) in total.iter_mut().zip(&ms) {
            *t += m;
        }
        let (m, l, h) = stat(ms);
        out.push(format!("| `{name}` | {m:.2} ({l:.2}–{h:.2}) | {insns} |"));
    }
    let (m, l, h) = stat(total);
    out.push(format!("| all | **{m:.2}** ({l:.2}–{h:.2}) | |"));
    out.push(String::new());
    Ok(out)
}

/// The BPF programs' own run time per event (a pass with `--bpf-stats`).
fn bpf_section(tr: &Path, w: &Path, storms: &[(&str, Vec<&str>)]) -> anyhow::Result<Vec<String>> {
    let mut out: Vec<String> = vec![
        "## BPF programs' own cost (separate pass, `--bpf-stats`)".into(),
        String::new(),
        "| workload | program | runs | ns per run |".into(),
        "|---|---|---|---|".into(),
    ];
    for (name, wargs) in storms {
        let sum = std::env::temp_dir().join("rt-bench-summary.json");
        let mut cmd = Command::new(tr);
        cmd.args(["run", "-q", "--bpf-stats", "--summary"])
            .arg(&sum)
            .arg("--")
            .arg(w)
            .args(wargs);
        wall_of(&mut cmd)?;
        let s: Value = serde_json::from_str(&std::fs::read_to_string(&sum)?)?;
        for p in s["bpf_programs"].as_array().cloned().unwrap_or_default() {
            let runs = p["run_count"].as_u64().unwrap_or(0);
            let ns = p["run_time_ns"].as_u64().unwrap_or(0);
            let per = if runs > 0 {
                ns as f64 / runs as f64
            } else {
                0.0
            };
            out.push(format!(
                "| {name} | {} | {runs} | {per:.0} |",
                p["name"].as_str().unwrap_or("?")
            ));
        }
    }
    out.push(String::new());
    Ok(out)
}

pub fn run(dir: &Path, args: &[String]) -> anyhow::Result<()> {
    let quick = args.iter().any(|a| a == "--quick");
    let only_peers = args.iter().any(|a| a == "--only-peers");
    if args.iter().any(|a| a == "--node") {
        let baseline = flag_value(args, "--baseline").map(std::path::PathBuf::from);
        return crate::node_bench::run(dir, quick, baseline.as_deref());
    }
    let path = crate::root().join("docs/benchmarks.md");
    if args.iter().any(|a| a == "--only-cost") {
        return only_cost(dir, &path);
    }
    if args.iter().any(|a| a == "--only-startup") {
        return only_startup(dir, &path);
    }
    if args.iter().any(|a| a == "--only-real") {
        return only_real(dir, args, quick, &path);
    }
    if args.iter().any(|a| a == "--only-attach-exact") {
        return only_attach_exact(dir, args, quick, &path);
    }
    if args.iter().any(|a| a == "--only-attach") {
        // Keep every other section as it is; replace (or add) the attach one.
        let md = crate::attach_bench::run(dir, quick)?;
        crate::attach_bench::write(&path, &md)?;
        eprintln!("xtask: wrote {}", path.display());
        return Ok(());
    }
    if args.iter().any(|a| a == "--only-exact") {
        // Keep every other section as it is; replace (or add) the exactness one.
        let md = crate::exact_bench::run(dir, quick)?;
        crate::exact_bench::write(&path, &md)?;
        eprintln!("xtask: wrote {}", path.display());
        return Ok(());
    }
    if only_peers {
        // Keep the engine's sections as they are; replace the peers section.
        let old = std::fs::read_to_string(&path).unwrap_or_default();
        let keep = old
            .split(PEERS_MARK)
            .next()
            .unwrap_or("")
            .trim_end()
            .to_string();
        let md = crate::peers::run(dir, quick)?;
        std::fs::write(&path, format!("{keep}\n\n{md}"))
            .with_context(|| format!("writing {}", path.display()))?;
        eprintln!("xtask: wrote {}", path.display());
        return Ok(());
    }
    let md = engine_sections(dir, quick)?;
    let peers = args.iter().any(|a| a == "--peers");
    write_doc(dir, &path, &md, peers, quick)
}

/// The engine's own sections: overhead, cost per sample, start-up, the BPF
/// programs' cost; each line also printed as it comes.
fn engine_sections(dir: &Path, quick: bool) -> anyhow::Result<String> {
    let reps = if quick { 3 } else { 7 };
    let tr = dir.join("resource-tracker");
    let w = dir.join("workload");
    let mut md = String::new();
    let mut say = |line: String| {
        println!("{line}");
        md.push_str(&line);
        md.push('\n');
    };

    say("# Benchmarks".into());
    say(String::new());
    say("Generated by `cargo xtask bench` (release build). Runs are interleaved A B A B …; figures are medians with min–max over the repetitions. The machine is shared and noisy: read ratios, not absolute times.".into());
    say(String::new());
    let m = crate::measure::Machine::read();
    say(format!(
        "- Machine: {} vCPU, {}, {} RAM",
        m.vcpus,
        m.cpu,
        read("free -h | awk '/Mem:/{print $2}'")
    ));
    say(format!("- Kernel: {}", m.kernel));
    say(format!(
        "- Tracker: resource-tracker {} ({})",
        env!("CARGO_PKG_VERSION"),
        m.commit
    ));
    say(format!("- Repetitions: {reps}"));
    say(String::new());

    let storms: [(&str, Vec<&str>); 3] = [
        ("fork/exec storm", vec!["forkstorm", "3000"]),
        (
            "context-switch storm (pipe ping-pong)",
            vec!["pingpong", "200000"],
        ),
        ("CPU-bound control", vec!["burner", "1", "700"]),
    ];
    // 1. Overhead on the tracked workload's own wall time.
    for line in overhead_section(&tr, &w, &storms, reps)? {
        say(line);
    }

    // 2. Cost per sample with a 50-process tree and unrelated processes on the host.
    for line in cost_section(&tr, &w, quick)? {
        say(line);
    }

    // 3. Wall time and peak memory of `run -- true`.
    for line in startup_section(&tr, reps)? {
        say(line);
    }

    // 4. The BPF programs' own cost, in a separate pass with statistics enabled.
    for line in bpf_section(&tr, &w, &storms[..2])? {
        say(line);
    }
    say("Commands: the table rows name the `workload` mode (tests/src/workload.rs); tracked runs are `resource-tracker run -q [--no-ebpf] -- workload …`, and the ratio compares the workload's own elapsed time, so the tracker's start-up is not in it.".into());
    Ok(md)
}

/// docs/benchmarks.md: the engine's sections `md`, then the sections measured
/// apart as they were (node, exactness, real workloads), then the peers' (rerun
/// with `peers`, else kept).
fn write_doc(dir: &Path, path: &Path, md: &str, peers: bool, quick: bool) -> anyhow::Result<()> {
    let mut text = md.to_string();
    let old = std::fs::read_to_string(path).unwrap_or_default();
    if let Some(node) = crate::node_bench::section(&old) {
        let _ = write!(text, "\n{}\n", node.trim_end());
    }
    if let Some(attach) = crate::attach_bench::section(&old) {
        let _ = write!(text, "\n{}\n", attach.trim_end());
    }
    if let Some(exact) = crate::exact_bench::section(&old) {
        let _ = write!(text, "\n{}\n", exact.trim_end());
    }
    if let Some(real) = crate::real_bench::section(&old) {
        let _ = write!(text, "\n{}\n", real.trim_end());
    }
    if peers {
        let _ = write!(text, "\n{}", crate::peers::run(dir, quick)?);
    } else if let Some((_, kept)) = old.split_once(PEERS_MARK) {
        // Not rerun: the peers' section stays as it was measured.
        let _ = write!(text, "\n{PEERS_MARK}{kept}");
    }
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("xtask: wrote {}", path.display());
    Ok(())
}

#[cfg(test)]
mod section_tests {
    use crate::benchdoc::{doc_section, write_section};

    #[test]
    fn a_section_is_replaced_in_place_or_added_before_the_peers() {
        let doc = "# B\n\n## A\nold a\n\n## X\nold x\n\n## Peers, side by side\np\n";
        assert_eq!(doc_section(doc, "## X"), Some("## X\nold x\n\n"));
        assert_eq!(
            doc_section(doc, "## Peers"),
            Some("## Peers, side by side\np\n")
        );
        assert_eq!(doc_section(doc, "## Z"), None);
        let path = std::env::temp_dir().join(format!("xtask-section-{}.md", std::process::id()));
        std::fs::write(&path, doc).unwrap();
        write_section(&path, "## X", "## X\nnew x\n").unwrap();
        write_section(&path, "## Y", "## Y\ny\n").unwrap();
        // The last section ends the file with one newline.
        write_section(&path, "## Peers", "## Peers, side by side\nq\n").unwrap();
        let got = std::fs::read_to_string(&path).unwrap();
        let _ = std::fs::remove_file(&path);
        assert_eq!(
            got,
            "# B\n\n## A\nold a\n\n## X\nnew x\n\n## Y\ny\n\n## Peers, side by side\nq\n"
        );
    }
}

#[cfg(test)]
mod readme_tests {
    /// Figures with a unit (`53 ms`, `12.2 MiB`, `1.001×`, `0.5 %`) in `text`.
    fn figures(text: &str) -> Vec<String> {
        const UNITS: [&str; 8] = ["ms", "µs", "ns", "MiB", "KiB", "%", "×", "s "];
        let b = text.as_bytes();
        let mut found = Vec::new();
        for (i, c) in text.char_indices() {
            if !c.is_ascii_digit() || (i > 0 && (b[i - 1].is_ascii_digit() || b[i - 1] == b'.')) {
                continue;
            }
            let num_end = text[i..]
                .find(|c: char| !(c.is_ascii_digit() || c == '.'))
                .map_or(text.len(), |n| i + n);
            let rest = text[num_end..].trim_start_matches(' ');
            if let Some(u) = UNITS.iter().find(|u| rest.starts_with(*u)) {
                found.push(format!("{}{}", &text[i..num_end], u.trim_end()));
            }
        }
        found
    }

    /// docs/benchmarks.md is the one place the measured figures live: the README's
    /// Benchmarks and How-it-measures sections point to it and copy none, so the two
    /// cannot disagree.
    #[test]
    fn the_readme_copies_no_benchmark_figure() {
        let readme = std::fs::read_to_string(crate::root().join("README.md")).unwrap();
        for (from, to) in [
            ("## How it measures", "### Exactness"),
            ("## Benchmarks", "`cargo xtask soak"),
        ] {
            let start = readme
                .find(from)
                .unwrap_or_else(|| panic!("{from} missing"));
            let end = start
                + readme[start..]
                    .find(to)
                    .unwrap_or_else(|| panic!("{to} missing"));
            let found = figures(&readme[start..end]);
            assert!(found.is_empty(), "{from}: figures {found:?}");
        }
        assert_eq!(
            figures("took 53 ms, 1.001× and 12.2 MiB; 0.5 % of 2 s in 3 runs"),
            ["53ms", "1.001×", "12.2MiB", "0.5%", "2s"]
        );
    }
}
