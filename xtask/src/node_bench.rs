//! `cargo xtask bench --node`: the node agent's own cost with 100 and 500 simulated
//! containers (real cgroups named as the kubelet names them, each holding real
//! sleeping processes), against the number of processes inside them, beside
//! `run --pid 1` over the same host. Rewrites the "Node agent" section of
//! docs/benchmarks.md and leaves the rest of it as it is.

use std::{
    fmt::Write as _,
    io::{Read as _, Write as _},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};

use crate::measure::{count_procs, sched_ns, stat, Bg, Machine};

const MARK: &str = "## Node agent (`resource-tracker node`)";

/// The node section of `doc` as measured last (up to the next `## ` heading).
pub fn section(doc: &str) -> Option<&str> {
    crate::benchdoc::doc_section(doc, MARK)
}

/// The hierarchies a container's cgroup is made in: each v1 controller the agent
/// reads, cpuacct first (`workload incgroup` joins the first one last), or v2.
fn hierarchies() -> Vec<PathBuf> {
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

/// Containers made for one measurement; their processes killed and their cgroups
/// removed on drop.
struct Pods {
    dirs: Vec<PathBuf>,
    procs: Vec<Bg>,
}

impl Pods {
    fn new(w: &Path, containers: usize, procs_each: usize) -> anyhow::Result<Pods> {
        let mut p = Pods {
            dirs: Vec::new(),
            procs: Vec::new(),
        };
        for i in 0..containers {
            let rel = format!(
                "kubepods/burstable/pod{:08x}-0000-4000-8000-{:012x}/{:064x}",
                i, i, i
            );
            let mut join = Vec::new();
            for h in hierarchies() {
                let d = h.join(&rel);
                std::fs::create_dir_all(&d).with_context(|| format!("{}", d.display()))?;
                p.dirs.push(d.clone());
                join.push(d.display().to_string());
            }
            let mut c = Command::new(w);
            c.arg("incgroup").arg(join.join(":")).arg("--");
            if procs_each == 0 {
                // Active: a short process every 0.5 s, so that every container's
                // CPU moves in every interval and each is read in full.
                c.args(["/bin/sh", "-c", "while :; do sleep 0.5; done"]);
            } else {
                c.arg(w);
                c.args(["sleepers", &(procs_each - 1).to_string(), "600"]);
            }
            p.procs
                .push(Bg(std::os::unix::process::CommandExt::process_group(
                    c.stdout(Stdio::null()).stderr(Stdio::null()),
                    0,
                )
                .spawn()
                .context("workload sleepers")?));
        }
        Ok(p)
    }
}

impl Drop for Pods {
    fn drop(&mut self) {
        self.procs.clear();
        std::thread::sleep(Duration::from_millis(300));
        // Deepest first: the container, its pod, then the shared levels.
        let mut all: Vec<PathBuf> = Vec::new();
        for d in &self.dirs {
            let mut x = d.clone();
            for _ in 0..4 {
                all.push(x.clone());
                if !x.pop() {
                    break;
                }
            }
        }
        all.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        all.dedup();
        for d in all {
            let _ = std::fs::remove_dir(&d);
        }
    }
}

fn rss_mib(pid: u32) -> Option<f64> {
    let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let kb: f64 = s
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    Some(kb / 1024.0)
}

fn scrape(port: u16) -> usize {
    let Ok(mut s) = TcpStream::connect(("127.0.0.1", port)) else {
        return 0;
    };
    let _ = s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out.len()
}

/// CPU share of one core and RSS of `cmd` over `secs` after a 3 s warm-up,
/// scraping `port` every 10 s when given.
fn cost(cmd: &mut Command, secs: u64, port: Option<u16>) -> anyhow::Result<(f64, f64, usize)> {
    let child = Bg(std::os::unix::process::CommandExt::process_group(
        cmd.stdout(Stdio::null()).stderr(Stdio::null()),
        0,
    )
    .spawn()
    .context("the agent")?);
    let pid = child.0.id();
    std::thread::sleep(Duration::from_secs(3));
    let t0 = Instant::now();
    let c0 = sched_ns(pid);
    let mut bytes = 0;
    let mut next = Instant::now();
    while t0.elapsed() < Duration::from_secs(secs) {
        if let Some(p) = port {
            if Instant::now() >= next {
                bytes = scrape(p);
                next += Duration::from_secs(10);
            }
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let c1 = sched_ns(pid);
    let el = t0.elapsed().as_secs_f64();
    let rss = rss_mib(pid).context("the agent exited")?;
    drop(child);
    Ok((c1.saturating_sub(c0) as f64 / 1e9 / el * 100.0, rss, bytes))
}

/// A fork/exec storm's own elapsed time, s, without and with the agent running
/// (its programs on every process of the host), interleaved `reps` times.
fn storm(tr: &Path, w: &Path, reps: usize) -> anyhow::Result<(Vec<f64>, Vec<f64>)> {
    let (mut off, mut on) = (Vec::new(), Vec::new());
    for _ in 0..reps {
        off.push(crate::measure::workload_secs(
            Command::new(w).args(["forkstorm", "3000"]),
        )?);
        let agent = Bg(std::os::unix::process::CommandExt::process_group(
            Command::new(tr)
                .args(["node", "-i", "1"])
                .stdout(Stdio::null())
                .stderr(Stdio::null()),
            0,
        )
        .spawn()
        .context("the agent")?);
        std::thread::sleep(Duration::from_millis(1500));
        on.push(crate::measure::workload_secs(
            Command::new(w).args(["forkstorm", "3000"]),
        )?);
        drop(agent);
    }
    Ok((off, on))
}

/// The cases, by name, containers and processes each (0: active), with the
/// baseline's beside the two it is measured on.
fn cases(baseline: Option<&Path>) -> Vec<(String, usize, usize)> {
    let mut cases: Vec<(String, usize, usize)> = [
        ("node agent", 500, 1),
        ("node agent, each container active", 100, 0),
        ("node agent", 100, 30),
        ("node agent", 100, 1),
        ("node agent", 10, 1),
        ("`run --pid 1` (ebpf)", 100, 30),
    ]
    .into_iter()
    .map(|(name, n, each)| (name.to_string(), n, each))
    .collect();
    if let Some(b) = baseline {
        // Named by its file: a build kept as, say, rt-48bdb9e says what it is.
        let b = b.file_name().unwrap_or(b.as_os_str()).to_string_lossy();
        cases.insert(1, (format!("baseline agent `{b}`"), 500, 1));
        cases.insert(
            3,
            (
                format!("baseline agent `{b}`, each container active"),
                100,
                0,
            ),
        );
    }
    cases
}

/// `baseline`: another build of the agent (`--baseline BIN`), measured beside
/// this one on the cases a change of the agent moves most (500 idle containers,
/// 100 active), interleaved with them.
pub fn run(dir: &Path, quick: bool, baseline: Option<&Path>) -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("the node benchmark makes cgroups: run it as root");
    }
    let tr = dir.join("resource-tracker");
    let w = dir.join("workload");
    let secs = if quick { 20 } else { 60 };
    let reps = if quick { 1 } else { 3 };
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0")?;
        l.local_addr()?.port()
    };
    let m = Machine::read();
    let mut md = String::new();
    let _ = writeln!(md, "{MARK}\n");
    let _ = writeln!(
        md,
        "Generated by `cargo xtask bench --node` (release build) on {} vCPU, kernel {}. Simulated containers are real cgroups named `kubepods/burstable/pod<UID>/<ID>` in every hierarchy the host has, each holding `workload sleepers` processes (idle), or, where the case says active, a shell that starts `sleep 0.5` again and again (its CPU moves every interval, so the agent reads each container in full: docs/node.md). The agent runs `node --listen 127.0.0.1:P -i 1` and is scraped every 10 s; its CPU is every thread's run time by the scheduler's clock (`/proc/PID/task/*/schedstat`) over {secs} s after a 3 s warm-up, as a share of one core; RSS is its VmRSS at the end. `run --pid 1` is today's alternative for a whole node, measured the same way at `-i 1`. Median (min–max) of {reps} run(s), cases interleaved.\n",
        m.vcpus,
        m.kernel
    );
    let _ = writeln!(md, "| case | containers | processes on the host | CPU, % of one core | RSS (MiB) | /metrics size |");
    let _ = writeln!(md, "|---|---|---|---|---|---|");
    let cases = cases(baseline);
    let mut res: Vec<(Vec<f64>, Vec<f64>, usize, usize)> =
        vec![(vec![], vec![], 0, 0); cases.len()];
    for _ in 0..reps {
        for (i, (name, n, each)) in cases.iter().enumerate() {
            let pods = Pods::new(&w, *n, *each)?;
            std::thread::sleep(Duration::from_secs(2));
            let procs = count_procs();
            let (cpu, rss, bytes) = if !name.starts_with('`') {
                let bin = match baseline {
                    Some(b) if name.starts_with("baseline") => b,
                    _ => tr.as_path(),
                };
                cost(
                    Command::new(bin).args([
                        "node",
                        "--listen",
                        &format!("127.0.0.1:{port}"),
                        "-i",
                        "1",
                    ]),
                    secs,
                    Some(port),
                )?
            } else {
                cost(
                    Command::new(&tr).args(["-q", "--pid", "1", "-i", "1"]),
                    secs,
                    None,
                )?
            };
            eprintln!("xtask: node bench {name} {n}×{each}: {cpu:.3} % of a core, {rss:.1} MiB");
            res[i].0.push(cpu);
            res[i].1.push(rss);
            res[i].2 = procs;
            res[i].3 = bytes;
            drop(pods);
        }
    }
    for ((name, n, _), (cpu, rss, procs, bytes)) in cases.iter().zip(res) {
        let (c, clo, chi) = stat(cpu);
        let (r, _, _) = stat(rss);
        let size = if bytes > 0 {
            format!("{:.0} KiB", bytes as f64 / 1024.0)
        } else {
            "—".into()
        };
        let _ = writeln!(
            md,
            "| {name} | {n} | {procs} | **{c:.2}** ({clo:.2}–{chi:.2}) | {r:.1} | {size} |"
        );
    }
    // The programs run on every fork, exec and exit of the host: a fork/exec storm's
    // own elapsed time with the agent running against without, interleaved.
    let storm_reps = if quick { 3 } else { 7 };
    let (off, on) = storm(&tr, &w, storm_reps)?;
    let ratios: Vec<f64> = on.iter().zip(&off).map(|(a, b)| a / b).collect();
    let (r, rlo, rhi) = stat(ratios);
    let (a, _, _) = stat(off);
    let (b, _, _) = stat(on);
    let _ = writeln!(
        md,
        "\nOn every process of the host: `workload forkstorm 3000` (3,000 fork + exec + exit) took {a:.3} s alone and {b:.3} s with the agent's BPF programs attached: ratio **{r:.3}** ({rlo:.3}–{rhi:.3}), median of {storm_reps}, interleaved."
    );
    let path = crate::root().join("docs/benchmarks.md");
    crate::benchdoc::write_section(&path, MARK, &md)?;
    eprintln!("xtask: wrote the node section of {}", path.display());
    Ok(())
}
