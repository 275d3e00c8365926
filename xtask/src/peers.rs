//! `cargo xtask bench --peers`: the same measurements for the peer trackers, side by
//! side with ours, in one run on one machine. The peers are installed here, under
//! target/peers/ (idempotent: a stamp file or the binary says it is done).

use std::{
    ffi::OsString,
    fmt::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};
use serde_json::Value;

use crate::measure::{count_procs, read, stat, unrelated_sleepers};

const PY_RT: &str = "0.5.0";
const RS_RT: &str = "0.1.18";

/// The Python resource-tracker has no command-line wrapper: this is the one the bench
/// uses, written after its README (`ResourceTracker(pid=…, interval=…)`, `.start()`,
/// `.stop()`, then `process_metrics`). In `gate` mode the command waits until the
/// tracker has taken its baseline and dropped its first interval (the library drops
/// it by design), and the shell that runs it stays alive one interval and a half after
/// it, so that the last interval is sampled too: the accuracy runs measure what the
/// sampler misses, not its warm-up. `plain` mode starts the command at once.
const PY_WRAPPER: &str = r#"import json, subprocess, sys, time
from resource_tracker import ResourceTracker
from resource_tracker.helpers import is_psutil_available
interval, out, mode, cmd = float(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4:]
if mode == "gate":
    p = subprocess.Popen(["sh", "-c", 'read _; "$@"; echo "rc=$?"; read _', "sh", *cmd],
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE)
else:
    p = subprocess.Popen(cmd)
t = ResourceTracker(pid=p.pid, interval=interval, discover_server=False, discover_cloud=False)
t.start()
if mode == "gate":
    time.sleep(max(0.0, t.start_time + interval + 0.05 - time.time()))
    p.stdin.write(b"\n"); p.stdin.flush()
    for line in p.stdout:
        line = line.decode()
        if line.startswith("rc="):
            break
        sys.stdout.write(line)
    time.sleep(1.5 * interval + 0.1)
    p.stdin.write(b"\n"); p.stdin.flush()
rc = p.wait()
time.sleep(0.05)
t.stop()
m = t.process_metrics
n = len(m)
cpu = sum(m["utime"]) + sum(m["stime"]) if n else 0.0
kids = max([c or 0 for c in m["children"]], default=0) if n else 0
if mode == "gate" and kids:
    kids -= 1  # the gating shell is the tracked root, the command its child
wbytes = sum(m["disk_write_bytes"]) if n else 0
peak = max(m["memory_mib"], default=0.0) if n else 0.0
with open(out, "w") as f:
    json.dump({"cpu_secs": cpu, "max_children": kids, "samples": n,
               "write_bytes": wbytes, "peak_memory_mib": peak,
               "psutil": is_psutil_available()}, f)
sys.exit(rc)
"#;

#[derive(Clone, Copy, PartialEq, Debug)]
pub(crate) enum Tool {
    Ours,
    OursProcfs,
    PyProcfs,
    PyPsutil,
    Rs,
    Psrecord,
    Pidstat,
}

pub(crate) const TOOLS: [Tool; 7] = [
    Tool::Ours,
    Tool::OursProcfs,
    Tool::PyProcfs,
    Tool::PyPsutil,
    Tool::Rs,
    Tool::Psrecord,
    Tool::Pidstat,
];

pub(crate) struct Peers {
    pub(crate) dir: PathBuf,
    tr: PathBuf,
    pub(crate) pidstat: bool,
    /// The virtual environment of py-rt's procfs form (psutil absent).
    py_procfs: PathBuf,
}

/// What a tool reports beside CPU: storage bytes written, bytes through write
/// calls and the tree's peak memory (MiB), each None where it does not report it.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct IoMem {
    pub(crate) write_bytes: Option<u64>,
    pub(crate) wchar: Option<u64>,
    pub(crate) peak_mib: Option<f64>,
}

impl Tool {
    pub(crate) fn name(self) -> &'static str {
        match self {
            Tool::Ours => "ours (ebpf)",
            Tool::OursProcfs => "ours (procfs)",
            Tool::PyProcfs => "py-rt procfs",
            Tool::PyPsutil => "py-rt psutil",
            Tool::Rs => "rs-rt",
            Tool::Psrecord => "psrecord",
            Tool::Pidstat => "pidstat",
        }
    }

    /// The smallest interval the tool accepts (rs-rt and pidstat take whole seconds).
    fn min_interval(self) -> f64 {
        match self {
            Tool::Rs | Tool::Pidstat => 1.0,
            _ => 0.1,
        }
    }

    pub(crate) fn available(self, p: &Peers) -> bool {
        self != Tool::Pidstat || p.pidstat
    }

    /// The command that runs `cmd` under the tool, writing its data to `out`.
    /// `gate`: the accuracy form (see PY_WRAPPER; pidstat then reports one total at the
    /// command's end instead of per interval).
    pub(crate) fn command(
        self,
        p: &Peers,
        interval: f64,
        out: &Path,
        cmd: &[OsString],
        gate: bool,
    ) -> Command {
        let iv = format!("{interval}");
        match self {
            Tool::Ours | Tool::OursProcfs => {
                let mut c = Command::new(&p.tr);
                c.args(["run", "-q", "-i", &iv, "--summary"]).arg(out);
                if self == Tool::OursProcfs {
                    c.arg("--no-ebpf");
                }
                c.arg("--").args(cmd);
                c
            }
            Tool::PyProcfs | Tool::PyPsutil => {
                let venv = if self == Tool::PyProcfs {
                    p.py_procfs.clone()
                } else {
                    p.dir.join("py-psutil")
                };
                let mut c = Command::new(venv.join("bin/python"));
                c.arg(p.dir.join("pyrt.py"))
                    .arg(&iv)
                    .arg(out)
                    .arg(if gate { "gate" } else { "plain" })
                    .args(cmd);
                c
            }
            Tool::Rs => {
                let mut c = Command::new(p.dir.join("rs/bin/resource-tracker"));
                c.args(["--interval", &format!("{}", interval.max(1.0) as u64), "-o"])
                    .arg(out)
                    .arg("--")
                    .args(cmd);
                c
            }
            Tool::Psrecord => {
                let line: Vec<String> = cmd
                    .iter()
                    .map(|a| shell_quote(&a.to_string_lossy()))
                    .collect();
                let mut c = Command::new(p.dir.join("psrecord/bin/psrecord"));
                c.arg(line.join(" "))
                    .args(["--include-children", "--interval", &iv, "--log"])
                    .arg(out);
                c
            }
            Tool::Pidstat => {
                // pidstat writes its report to stdout: through sh, into `out`.
                let mut line = String::from("pidstat -h -u -T CHILD -e");
                for a in cmd {
                    line.push(' ');
                    line.push_str(&shell_quote(&a.to_string_lossy()));
                }
                if !gate {
                    let _ = write!(line, " {}", interval.max(1.0) as u64);
                }
                let mut c = Command::new("sh");
                c.args([
                    "-c",
                    // The filter keeps the workload's line; a command that prints
                    // none (a shell, `threadexec`) is no failure of pidstat's.
                    &format!("{line} | tee {} | {{ grep '^{{' || true; }}", out.display()),
                ]);
                c
            }
        }
    }

    /// Tree CPU seconds and processes (ours: spawned in all; the peers: the most
    /// descendants alive in one sample, where they report it) from the tool's output.
    pub(crate) fn parse(self, out: &Path, interval: f64) -> anyhow::Result<(f64, Option<u64>)> {
        let text = std::fs::read_to_string(out).with_context(|| format!("{}", out.display()))?;
        Ok(match self {
            Tool::Ours | Tool::OursProcfs => {
                let v: Value = serde_json::from_str(&text)?;
                (
                    v["cpu_total_secs"].as_f64().context("cpu_total_secs")?,
                    v["processes_spawned"].as_u64(),
                )
            }
            Tool::PyProcfs | Tool::PyPsutil => {
                let v: Value = serde_json::from_str(&text)?;
                (
                    v["cpu_secs"].as_f64().context("cpu_secs")?,
                    v["max_children"].as_u64().map(|k| k + 1),
                )
            }
            Tool::Rs => {
                let (mut cpu, mut kids) = (0.0, 0u64);
                for l in text.lines() {
                    let Ok(v) = serde_json::from_str::<Value>(l) else {
                        continue;
                    };
                    let c = &v["cpu"];
                    cpu += c["process_utime_secs"].as_f64().unwrap_or(0.0)
                        + c["process_stime_secs"].as_f64().unwrap_or(0.0);
                    kids = kids.max(c["process_child_count"].as_u64().unwrap_or(0));
                }
                (cpu, Some(kids + 1))
            }
            Tool::Psrecord => {
                // Columns: elapsed time, CPU %, real MB, virtual MB; integrate CPU % over
                // the time between samples.
                let (mut cpu, mut last) = (0.0, 0.0);
                for l in text.lines().filter(|l| !l.trim_start().starts_with('#')) {
                    let f: Vec<f64> = l
                        .split_whitespace()
                        .filter_map(|x| x.parse().ok())
                        .collect();
                    if f.len() >= 2 {
                        cpu += f[1] / 100.0 * (f[0] - last).max(0.0);
                        last = f[0];
                    }
                }
                let _ = interval;
                (cpu, None)
            }
            Tool::Pidstat => {
                let (mut cpu, mut cols) = (0.0, None);
                for l in text.lines() {
                    let f: Vec<&str> = l.split_whitespace().collect();
                    if let Some(u) = f.iter().position(|x| *x == "usr-ms") {
                        cols = Some((u, u + 1));
                        continue;
                    }
                    if let Some((u, s)) = cols {
                        // Data lines have one field fewer than the header ('#').
                        if l.starts_with('#') || f.len() < s {
                            continue;
                        }
                        let (a, b): (f64, f64) = (
                            f[u - 1].parse().unwrap_or(0.0),
                            f[s - 1].parse().unwrap_or(0.0),
                        );
                        cpu += (a + b) / 1e3;
                    }
                }
                (cpu, None)
            }
        })
    }
}

impl Tool {
    /// Storage writes, write-call bytes and peak memory from the tool's output (the
    /// accuracy form). ours: the summary's `write_bytes`, `wchar_bytes` and
    /// `peak_memory_mib`; py-rt: Σ `disk_write_bytes` and the most `memory_mib` (PSS)
    /// of its `process_metrics`; rs-rt: Σ `cpu.process_disk_write_bytes` and the most
    /// `cpu.process_rss_mib`; psrecord: the most "Real (MB)" (RSS, MiB, children
    /// included). pidstat `-T CHILD` reports CPU and page faults only.
    pub(crate) fn io_mem(self, out: &Path) -> anyhow::Result<IoMem> {
        let text = std::fs::read_to_string(out).with_context(|| format!("{}", out.display()))?;
        Ok(match self {
            Tool::Ours | Tool::OursProcfs => {
                let v: Value = serde_json::from_str(&text)?;
                IoMem {
                    write_bytes: v["write_bytes"].as_u64(),
                    wchar: v["wchar_bytes"].as_u64(),
                    peak_mib: v["peak_memory_mib"].as_f64(),
                }
            }
            Tool::PyProcfs | Tool::PyPsutil => {
                let v: Value = serde_json::from_str(&text)?;
                IoMem {
                    write_bytes: v["write_bytes"].as_f64().map(|b| b as u64),
                    wchar: None,
                    peak_mib: v["peak_memory_mib"].as_f64(),
                }
            }
            Tool::Rs => {
                let (mut w, mut peak) = (0u64, 0.0f64);
                for l in text.lines() {
                    let Ok(v) = serde_json::from_str::<Value>(l) else {
                        continue;
                    };
                    let c = &v["cpu"];
                    w += c["process_disk_write_bytes"].as_u64().unwrap_or(0);
                    peak = peak.max(c["process_rss_mib"].as_f64().unwrap_or(0.0));
                }
                IoMem {
                    write_bytes: Some(w),
                    wchar: None,
                    peak_mib: Some(peak),
                }
            }
            Tool::Psrecord => {
                let mut peak = 0.0f64;
                for l in text.lines().filter(|l| !l.trim_start().starts_with('#')) {
                    let f: Vec<f64> = l
                        .split_whitespace()
                        .filter_map(|x| x.parse().ok())
                        .collect();
                    if f.len() >= 3 {
                        peak = peak.max(f[2]);
                    }
                }
                IoMem {
                    peak_mib: Some(peak),
                    ..IoMem::default()
                }
            }
            Tool::Pidstat => IoMem::default(),
        })
    }
}

fn shell_quote(s: &str) -> String {
    if s.bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"/._-=:".contains(&b))
    {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

fn sh_ok(cmd: &mut Command) -> anyhow::Result<()> {
    crate::sh(cmd)
}

fn version_of(cmd: &str) -> String {
    read(cmd)
}

/// Installs the peers under target/peers/ (quick when present).
pub(crate) fn install(tr: &Path) -> anyhow::Result<Peers> {
    let dir = crate::root().join("target/peers");
    std::fs::create_dir_all(&dir)?;
    let venv = |name: &str, pkgs: &[&str]| -> anyhow::Result<()> {
        let v = dir.join(name);
        let stamp = v.join(format!(".stamp-{}", pkgs.join("+")));
        if stamp.exists() {
            return Ok(());
        }
        let _ = std::fs::remove_dir_all(&v);
        sh_ok(Command::new("python3").args(["-m", "venv"]).arg(&v))?;
        sh_ok(
            Command::new(v.join("bin/pip"))
                .args(["install", "-q"])
                .args(pkgs),
        )?;
        std::fs::write(&stamp, "")?;
        Ok(())
    };
    venv("py", &[&format!("resource-tracker=={PY_RT}")])?;
    venv(
        "py-psutil",
        &[&format!("resource-tracker=={PY_RT}"), "psutil"],
    )?;
    venv("psrecord", &["psrecord"])?;
    let rs = dir.join("rs/bin/resource-tracker");
    let rs_ok = rs.exists() && version_of(&format!("{} --version", rs.display())).ends_with(RS_RT);
    if !rs_ok {
        sh_ok(
            Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()))
                .args([
                    "install",
                    "--locked",
                    "resource-tracker",
                    "--version",
                    RS_RT,
                    "--root",
                ])
                .arg(dir.join("rs")),
        )?;
    }
    let has = |c: &str| {
        Command::new("sh")
            .args(["-c", &format!("command -v {c}")])
            .stdout(Stdio::null())
            .status()
            .is_ok_and(|s| s.success())
    };
    // SAFETY: geteuid has no preconditions.
    if !has("pidstat") && unsafe { libc::geteuid() } == 0 {
        let ok = Command::new("apt-get")
            .args(["install", "-y", "sysstat"])
            .status()
            .is_ok_and(|s| s.success());
        if !ok {
            let _ = Command::new("apt-get").arg("update").status();
            let _ = Command::new("apt-get")
                .args(["install", "-y", "sysstat"])
                .status();
        }
    }
    std::fs::write(dir.join("pyrt.py"), PY_WRAPPER)?;
    Ok(Peers {
        py_procfs: dir.join("py"),
        dir,
        tr: tr.to_path_buf(),
        pidstat: has("pidstat"),
    })
}

/// The peers as they are already set up, installing nothing: py-rt (procfs) from
/// scripts/setup.sh's `target/py-peers`, rs-rt from `target/peers/rs`; with the tools
/// among `want` that are present.
pub(crate) fn existing(tr: &Path, want: &[Tool]) -> anyhow::Result<(Peers, Vec<Tool>)> {
    let dir = crate::root().join("target/peers");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("pyrt.py"), PY_WRAPPER)?;
    let p = Peers {
        py_procfs: crate::root().join("target/py-peers"),
        dir,
        tr: tr.to_path_buf(),
        pidstat: false,
    };
    let present = |t: Tool| match t {
        Tool::Ours | Tool::OursProcfs => true,
        Tool::PyProcfs => p.py_procfs.join("bin/python").exists(),
        Tool::PyPsutil => p.dir.join("py-psutil/bin/python").exists(),
        Tool::Rs => p.dir.join("rs/bin/resource-tracker").exists(),
        Tool::Psrecord => p.dir.join("psrecord/bin/psrecord").exists(),
        Tool::Pidstat => false,
    };
    let tools = want.iter().copied().filter(|&t| present(t)).collect();
    Ok((p, tools))
}

/// Spawns `cmd`, waits with wait4, and returns (wall secs, rusage CPU secs of the
/// process and the descendants it reaped, peak RSS MiB of the largest of them, stdout).
pub(crate) fn run_rusage(cmd: &mut Command) -> anyhow::Result<(f64, f64, f64, String)> {
    let out = tmp("stdout");
    let f = std::fs::File::create(&out)?;
    let t = Instant::now();
    let child = cmd
        .stdout(f)
        .stderr(Stdio::null())
        .stdin(Stdio::null())
        .spawn()
        .with_context(|| format!("{cmd:?}"))?;
    let mut st = 0;
    // SAFETY: rusage is plain data; waiting for our own child.
    let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
    let r = unsafe { libc::wait4(child.id() as i32, &mut st, 0, &mut ru) };
    let wall = t.elapsed().as_secs_f64();
    if r < 0 {
        bail!("wait4 {cmd:?}: {}", std::io::Error::last_os_error());
    }
    if !(libc::WIFEXITED(st) && libc::WEXITSTATUS(st) == 0) {
        bail!("{cmd:?} failed: status {st:#x}");
    }
    let tv = |t: libc::timeval| t.tv_sec as f64 + t.tv_usec as f64 / 1e6;
    let cpu = tv(ru.ru_utime) + tv(ru.ru_stime);
    let text = std::fs::read_to_string(&out).unwrap_or_default();
    Ok((wall, cpu, ru.ru_maxrss as f64 / 1024.0, text))
}

/// (ppid, comm) of every process.
fn process_table() -> Vec<(i32, i32, String)> {
    let mut v = vec![];
    let Ok(d) = std::fs::read_dir("/proc") else {
        return v;
    };
    for e in d.flatten() {
        let Some(pid) = e.file_name().to_str().and_then(|s| s.parse::<i32>().ok()) else {
            continue;
        };
        let Ok(st) = std::fs::read_to_string(format!("/proc/{pid}/stat")) else {
            continue;
        };
        // comm is in parentheses and may hold spaces: split after the last ')'.
        let (Some(a), Some(b)) = (st.find('('), st.rfind(')')) else {
            continue;
        };
        let comm = st[a + 1..b].to_string();
        let ppid = st[b + 1..]
            .split_whitespace()
            .nth(1)
            .and_then(|x| x.parse().ok())
            .unwrap_or(0);
        v.push((pid, ppid, comm));
    }
    v
}

/// The tool's own processes: `root` and its descendants, minus the workload's
/// subtree (processes named `workload` and everything under them).
fn tool_pids(root: i32) -> Vec<i32> {
    let table = process_table();
    let mut out = vec![root];
    let mut i = 0;
    while i < out.len() {
        let p = out[i];
        for (pid, ppid, comm) in &table {
            if *ppid == p && comm != "workload" {
                out.push(*pid);
            }
        }
        i += 1;
    }
    out
}

/// Run time of every thread of `pids`, ns (schedstat: exact, unlike 10 ms ticks).
fn run_time_ns(pids: &[i32]) -> u64 {
    pids.iter()
        .map(|&p| crate::measure::sched_ns(p as u32))
        .sum()
}

fn rss_mib(pids: &[i32]) -> f64 {
    let mut kib = 0u64;
    for p in pids {
        if let Ok(s) = std::fs::read_to_string(format!("/proc/{p}/status")) {
            kib += s
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.split_whitespace().next()?.parse().ok())
                .unwrap_or(0);
        }
    }
    kib as f64 / 1024.0
}

/// (CPU ms per sample, rows the tool wrote, RSS MiB) of `t` tracking 50 idle
/// processes, in steady state.
fn steady_cost(
    p: &Peers,
    t: Tool,
    w: &Path,
    iv: f64,
    warm: f64,
    win: f64,
) -> anyhow::Result<(f64, usize, f64)> {
    let cmd: Vec<OsString> = vec![
        w.to_path_buf().into(),
        "sleepers".into(),
        "49".into(),
        format!("{}", warm + win + 1.0).into(),
    ];
    let out = tmp("out");
    let mut child = t
        .command(p, iv, &out, &cmd, false)
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .with_context(|| format!("starting {}", t.name()))?;
    let root = child.id() as i32;
    std::thread::sleep(Duration::from_secs_f64(warm));
    let pids = tool_pids(root);
    let a = run_time_ns(&pids);
    std::thread::sleep(Duration::from_secs_f64(win));
    let pids_b = tool_pids(root);
    let b = run_time_ns(&pids);
    let mib = rss_mib(&pids_b);
    let status = child.wait()?;
    if !status.success() {
        bail!("{} exited with {status}", t.name());
    }
    if pids_b.len() != pids.len() {
        eprintln!(
            "bench: {}: its processes changed during the window ({} → {})",
            t.name(),
            pids.len(),
            pids_b.len()
        );
    }
    // Rows of output, to tell a tool that samples from one that reports only at exit
    // (pidstat -e … -T CHILD ignores its interval).
    let rows = std::fs::read_to_string(&out)
        .map(|t| {
            t.lines()
                .filter(|l| !l.trim().is_empty() && !l.starts_with('#') && !l.starts_with('{'))
                .count()
        })
        .unwrap_or(usize::MAX);
    let rows = if t == Tool::Pidstat {
        rows.saturating_sub(1)
    } else {
        usize::MAX
    };
    Ok((b.saturating_sub(a) as f64 / 1e6 / (win / iv), rows, mib))
}

fn elapsed_of(stdout: &str) -> anyhow::Result<f64> {
    stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<Value>(l.trim()).ok())
        .find_map(|v| v["elapsed_secs"].as_f64())
        .with_context(|| format!("no workload line in {stdout:?}"))
}

pub(crate) fn tmp(name: &str) -> PathBuf {
    std::env::temp_dir().join(format!("rt-peers-{}-{name}", std::process::id()))
}

struct Acc {
    name: &'static str,
    args: Vec<String>,
    /// Processes in the tree (the root included), from the workload's own design.
    procs: u64,
    /// Runs through `sh -c`, with a background process outliving the root.
    outlives: bool,
}

fn acc_workloads(quick: bool) -> Vec<Acc> {
    let a = |name, args: &str, procs, outlives| Acc {
        name,
        args: args.split_whitespace().map(String::from).collect(),
        procs,
        outlives,
    };
    let all = vec![
        a(
            "swarm, 2000 × 2 ms (fork)",
            "swarm 2000 2000 2 fork",
            2001,
            false,
        ),
        a(
            "swarm, 8000 × 0.1 ms (fork)",
            "swarm 8000 100 2 fork",
            8001,
            false,
        ),
        a(
            "exec swarm, 1000 × 2 ms",
            "swarm 1000 2000 2 exec",
            1001,
            false,
        ),
        a(
            "tree depth 3 × width 6, 20 ms each",
            "tree 3 6 20000",
            259,
            false,
        ),
        a("threads: 4 × 1.5 s", "burner 4 1500", 1, false),
        a(
            "orphans: 100 grandchildren × 1.5 s",
            "orphans 100 1500",
            201,
            false,
        ),
        a(
            "long-lived swarm, 6 × 1 s",
            "swarm 6 1000000 2 fork",
            7,
            false,
        ),
        a("still running at the end (4 s bg, 2 s root)", "", 2, true),
    ];
    if quick {
        all.into_iter()
            .filter(|w| {
                w.args.first().map(String::as_str) == Some("orphans")
                    || w.args == ["swarm", "2000", "2000", "2", "fork"]
                    || w.args == ["swarm", "8000", "100", "2", "fork"]
                    || w.outlives
            })
            .collect()
    } else {
        all
    }
}

pub(crate) fn acc_interval(t: Tool) -> f64 {
    if t == Tool::Psrecord {
        0.5
    } else {
        1.0
    }
}

/// A table header: the leading columns, then one per tool.
pub(crate) fn say_tool_header(say: &mut (impl FnMut(String) + ?Sized), lead: &str, tools: &[Tool]) {
    let mut head = lead.to_string();
    let mut sep = "|---".repeat(lead.matches('|').count() - 1) + "|";
    for t in tools {
        let _ = write!(head, " {} |", t.name());
        sep.push_str("---|");
    }
    say(head);
    say(sep);
}

/// What the sections of the peers' comparison share.
struct Ctx<'a> {
    p: &'a Peers,
    tools: &'a [Tool],
    w: &'a Path,
    quick: bool,
}

/// Accuracy: each tool's CPU of the tree against the kernel's truth; the seconds
/// it took.
fn accuracy_section(cx: &Ctx, say: &mut dyn FnMut(String)) -> anyhow::Result<f64> {
    say("### Accuracy: the tree's CPU per tool against the kernel's truth".into());
    say(String::new());
    say("Each run executes `workload incgroup DIR --pre F -- workload MODE …` under the tool: the root joins a fresh cgroup (v1 `cpuacct.usage`, else v2 `cpu.stat`) before it execs the workload, and the truth is the cgroup's usage when the tool returns plus the root's CPU before it joined (`--pre`, the middle of the readings just before and after the join). The cell is the tool's CPU as a % of that truth, with the processes it reports / the processes in the tree in parentheses where it reports them (ours: all spawned; py-rt and rs-rt: the most alive in one sample). Intervals: 1 s, psrecord 0.5 s. One run per cell; repeated runs differ by about ±2 points for the tools that see every process.".into());
    say(String::new());
    say_tool_header(say, "| workload | truth CPU (s) |", cx.tools);
    let t_acc = Instant::now();
    for wl in acc_workloads(cx.quick) {
        let mut row = format!("| {} |", wl.name);
        let mut cells = String::new();
        let mut truths = vec![];
        for &t in cx.tools {
            let cg = crate::truth::Truth::cpu_only("peers-acc")?;
            let pre = tmp("pre");
            let out = tmp("out");
            let _ = std::fs::remove_file(&out);
            let mut cmd: Vec<OsString> = vec![
                cx.w.to_path_buf().into(),
                "incgroup".into(),
                cg.join_arg().into(),
                "--pre".into(),
                pre.clone().into(),
                "--".into(),
            ];
            if wl.outlives {
                let ws = cx.w.display().to_string();
                cmd.extend([
                    "sh".into(),
                    "-c".into(),
                    format!("{ws} burner 1 4000 >/dev/null & exec {ws} burner 1 2000").into(),
                ]);
            } else {
                cmd.push(cx.w.to_path_buf().into());
                cmd.extend(wl.args.iter().map(OsString::from));
            }
            let mut c = t.command(cx.p, acc_interval(t), &out, &cmd, true);
            let r = run_rusage(&mut c);
            // `--pre` gives the root's CPU just before and just after it joined:
            // the join itself is the truth's only uncertainty; take its middle.
            let truth = cg.cpu_secs() + crate::truth::pre_join_secs(&pre);
            drop(cg);
            let cell = match r.and_then(|_| t.parse(&out, acc_interval(t))) {
                Ok((cpu, procs)) => {
                    truths.push(truth);
                    let pc = procs
                        .map(|n| format!(" ({n}/{})", wl.procs))
                        .unwrap_or_default();
                    format!(" {:.1}%{pc} |", 100.0 * cpu / truth)
                }
                Err(e) => {
                    eprintln!("xtask: {} on {}: {e:#}", t.name(), wl.name);
                    " failed |".into()
                }
            };
            cells.push_str(&cell);
        }
        let (m, lo, hi) = stat(truths);
        let _ = write!(row, " {m:.2} ({lo:.2}–{hi:.2}) |{cells}");
        say(row);
    }
    say(String::new());
    say("Workloads (`workload …`; a child spins for wall time, so N × SPIN_US is not its CPU when more run than there are CPUs): `swarm N SPIN_US 2 fork|exec` (N children, 2 at a time), `tree 3 6 20000`, `burner 4 1500` (threads), `orphans 100 1500` (each middle process exits at once, so the grandchildren are reparented to init and never waited for by the tree), `swarm 6 1000000 2 fork`, and `sh -c 'workload burner 1 4000 & exec workload burner 1 2000'` (the truth is read when the tool returns; the leftover is then killed).".into());
    say(String::new());
    Ok(t_acc.elapsed().as_secs_f64())
}

/// Overhead on the tracked workload's own elapsed time; the seconds it took.
fn overhead_section(cx: &Ctx, say: &mut dyn FnMut(String)) -> anyhow::Result<f64> {
    let reps = if cx.quick { 3 } else { 5 };
    say(format!(
        "### Overhead on the tracked workload ({reps} interleaved repetitions, interval 1 s)"
    ));
    say(String::new());
    say("Ratio of the workload's own `elapsed_secs` under the tool to the untracked run of the same round (none, tool 1, tool 2, …, repeated), so a tool's start-up is not in it; median (min–max).".into());
    say(String::new());
    say_tool_header(say, "| workload | none (s) |", cx.tools);
    let t_ovh = Instant::now();
    let storms: [(&str, &[&str]); 3] = [
        ("fork/exec storm", &["forkstorm", "3000"]),
        ("context switches", &["pingpong", "200000"]),
        ("CPU-bound", &["burner", "1", "700"]),
    ];
    for (name, wargs) in storms {
        let mut base = vec![];
        let mut ratios: Vec<Vec<f64>> = vec![vec![]; cx.tools.len()];
        let cmd: Vec<OsString> = std::iter::once(cx.w.to_path_buf().into_os_string())
            .chain(wargs.iter().map(OsString::from))
            .collect();
        for _ in 0..reps {
            // One untracked run per round (none, tool 1, tool 2, …).
            let x = elapsed_of(&run_rusage(Command::new(cx.w).args(wargs))?.3)?;
            base.push(x);
            for (i, &t) in cx.tools.iter().enumerate() {
                let out = tmp("out");
                match run_rusage(&mut t.command(cx.p, 1.0, &out, &cmd, false))
                    .and_then(|r| elapsed_of(&r.3))
                {
                    Ok(y) => ratios[i].push(y / x),
                    Err(e) => eprintln!("xtask: {} on {name}: {e:#}", t.name()),
                }
            }
        }
        let (mb, _, _) = stat(base);
        let mut row = format!("| {name} (`workload {}`) | {mb:.3} |", wargs.join(" "));
        for r in ratios {
            let (m, lo, hi) = stat(r);
            let _ = write!(row, " {m:.3} ({lo:.2}–{hi:.2}) |");
        }
        say(row);
    }
    say(String::new());
    Ok(t_ovh.elapsed().as_secs_f64())
}

/// Each tool's own CPU per sample and RSS in steady state; the seconds it took.
fn cost_section(cx: &Ctx, say: &mut dyn FnMut(String)) -> anyhow::Result<f64> {
    say("### Each tracker's own CPU per sample and RSS, 50-process tree".into());
    say(String::new());
    let (warm, win) = if cx.quick { (2.0, 3.0) } else { (2.0, 6.0) };
    let reps = 3;
    say(format!("Method: the tool runs `workload sleepers 49 T` (50 idle processes). After {warm} s (start-up, BPF load and the first samples are over) the bench takes the CPU time of the tool's own tasks — the tool's process and every descendant outside the workload's subtree (py-rt's helper processes, pidstat's shell and tee), every thread of each — from `/proc/PID/task/TID/schedstat` (nanoseconds of run time), and again {win} s later; the difference divided by the samples in the window ({win} s ÷ interval) is the CPU per sample. RSS is the sum of those processes' VmRSS at the end of the window (steady state, not the start-up peak). Median (min–max) of {reps} runs per cell, tools interleaved."));
    say(String::new());
    say("| host processes | interval | tool | CPU per sample (ms) | RSS (MiB) |".into());
    say("|---|---|---|---|---|".into());
    let t_cost = Instant::now();
    for target in [100usize, 3000] {
        let have = count_procs();
        let _bg = if have + 50 < target {
            Some(unrelated_sleepers(
                cx.w,
                target - have - 50,
                "900",
                target - 50,
            )?)
        } else {
            None
        };
        let hostn = count_procs() + 50;
        for iv in [1.0, 0.1] {
            let active: Vec<Tool> = cx
                .tools
                .iter()
                .copied()
                .filter(|t| iv >= t.min_interval())
                .collect();
            let mut per: Vec<Vec<(f64, usize)>> = vec![vec![]; active.len()];
            let mut rss: Vec<Vec<f64>> = vec![vec![]; active.len()];
            for _ in 0..reps {
                for (i, &t) in active.iter().enumerate() {
                    let (ms, rows, mib) = steady_cost(cx.p, t, cx.w, iv, warm, win)?;
                    per[i].push((ms, rows));
                    rss[i].push(mib);
                }
            }
            for &t in cx.tools {
                let Some(i) = active.iter().position(|&a| a == t) else {
                    say(format!(
                        "| ~{hostn} | {iv} s | {} | n/a (interval ≥ 1 s only) | |",
                        t.name()
                    ));
                    continue;
                };
                let (m, lo, hi) = stat(per[i].iter().map(|x| x.0).collect());
                let (r, rlo, rhi) = stat(rss[i].clone());
                // A tool that wrote no row inside the window took no samples there.
                let cell = if per[i].iter().all(|x| x.1 <= 1) {
                    format!("no samples taken ({m:.3} ms per interval; it reports once at exit)")
                } else {
                    format!("**{m:.2}** ({lo:.2}–{hi:.2})")
                };
                say(format!(
                    "| ~{hostn} | {iv} s | {} | {cell} | {r:.1} ({rlo:.1}–{rhi:.1}) |",
                    t.name()
                ));
            }
        }
    }
    say(String::new());
    Ok(t_cost.elapsed().as_secs_f64())
}

/// The wall time each wrapper adds to `true`.
fn wrapper_section(cx: &Ctx, say: &mut dyn FnMut(String)) -> anyhow::Result<()> {
    say("### Wall time each `-- cmd` wrapper adds to `true` (interval 1 s)".into());
    say(String::new());
    say("| tool | wall ms, median (min–max) |".into());
    say("|---|---|".into());
    let n = if cx.quick { 3 } else { 5 };
    let mut walls: Vec<Vec<f64>> = vec![vec![]; cx.tools.len() + 1];
    let tru: Vec<OsString> = vec!["true".into()];
    for _ in 0..n {
        walls[0].push(run_rusage(&mut Command::new("true"))?.0 * 1e3);
        for (i, &t) in cx.tools.iter().enumerate() {
            let out = tmp("out");
            let mut c = t.command(cx.p, 1.0, &out, &tru, false);
            if t == Tool::Pidstat {
                // no workload line to filter: keep the exit status of pidstat.
                c = Command::new("pidstat");
                c.args(["-h", "-u", "-T", "CHILD", "-e", "true", "1"]);
            }
            walls[i + 1].push(run_rusage(&mut c)?.0 * 1e3);
        }
    }
    for (i, v) in walls.into_iter().enumerate() {
        let name = if i == 0 {
            "none (`true`)"
        } else {
            cx.tools[i - 1].name()
        };
        let (m, lo, hi) = stat(v);
        say(format!("| {name} | **{m:.0}** ({lo:.0}–{hi:.0}) |"));
    }
    say(String::new());
    Ok(())
}

/// The tracker and workload built in `dir`, the peers (installed when missing) and
/// the tools that can run here.
pub(crate) fn setup(dir: &Path) -> anyhow::Result<(PathBuf, PathBuf, Peers, Vec<Tool>)> {
    let tr = dir.join("resource-tracker");
    let w = dir.join("workload");
    let p = install(&tr)?;
    let tools: Vec<Tool> = TOOLS.iter().copied().filter(|t| t.available(&p)).collect();
    Ok((tr, w, p, tools))
}

pub fn run(dir: &Path, quick: bool) -> anyhow::Result<String> {
    let t_all = Instant::now();
    let (_, w, p, tools) = setup(dir)?;
    let mut md = String::new();
    let mut say = |line: String| {
        println!("{line}");
        md.push_str(&line);
        md.push('\n');
    };
    let pyv = |v: &str| {
        version_of(&format!(
            "{}/{v}/bin/python -c 'import importlib.metadata as m; print(m.version(\"resource-tracker\"))'",
            p.dir.display()
        ))
    };
    say("## Peers, side by side (`cargo xtask bench --peers`)".into());
    say(String::new());
    say(format!("Measured in the same run on the same machine as above{}. The peers are installed by the bench into `target/peers/` (stamp files; skipped when present):", if quick { " (`--quick`: fewer workloads, 3 repetitions, shorter runs)" } else { "" }));
    say(String::new());
    say("- **ours**: `target/release/resource-tracker run -q -i I --summary S [--no-ebpf] -- CMD`, CPU = the summary's `cpu_total_secs`, processes = `processes_spawned`.".into());
    say(format!("- **py-rt**: Python `resource-tracker` {} from PyPI (`pip install resource-tracker=={PY_RT}` in `target/peers/py`, whose backend is procfs since psutil is absent; and with `psutil` {} in `target/peers/py-psutil`). It has no command-line wrapper: the bench's wrapper `target/peers/pyrt.py` (written by xtask/src/peers.rs) runs `ResourceTracker(pid=CHILD, interval=I, discover_server=False, discover_cloud=False).start()`, waits for the command, `.stop()`s, and sums the `utime` + `stime` columns of `process_metrics` (per-interval deltas of the tree's CPU, which includes the waited-for children's `cutime`/`cstime`); processes = the most `children` in one sample + 1.", pyv("py"), version_of(&format!("{}/py-psutil/bin/python -c 'import psutil; print(psutil.__version__)'", p.dir.display()))));
    say(format!("- **rs-rt**: Rust `resource-tracker` {} (`cargo install --locked resource-tracker --version {RS_RT} --root target/peers/rs`), run as `resource-tracker --interval I -o FILE -- CMD` (whole seconds only, ≥ 1); CPU = Σ `cpu.process_utime_secs + cpu.process_stime_secs` over its JSON lines; processes = the most `cpu.process_child_count` in one sample + 1. It sleeps one interval before it starts the command.", version_of(&format!("{}/rs/bin/resource-tracker --version | awk '{{print $2}}'", p.dir.display()))));
    say(format!("- **psrecord** {} (PyPI, `target/peers/psrecord`, psutil {}): `psrecord \"CMD\" --include-children --interval I --log FILE`; CPU = Σ CPU% × the time since the previous sample.", version_of(&format!("{}/psrecord/bin/pip show psrecord 2>/dev/null | awk '/^Version/{{print $2}}'", p.dir.display())), version_of(&format!("{}/psrecord/bin/python -c 'import psutil; print(psutil.__version__)'", p.dir.display()))));
    if p.pidstat {
        say(format!("- **pidstat** (Debian sysstat {}): `pidstat -h -u -T CHILD -e CMD [I]`. `-T CHILD` is the root's own CPU plus that of the children it has waited for (the kernel's `cutime`/`cstime`), so pidstat sees no process that has not been reaped by the tree, and counts no processes. It applies to one PID or one command, not to a tree it discovers. For accuracy it runs without an interval (one total when the command ends).", version_of("pidstat -V 2>&1 | awk '/version/{print $3}'")));
    } else {
        say("- **pidstat**: not installed (sysstat unavailable here); left out.".into());
    }
    say("- **none**: the command alone (the baseline).".into());
    say(String::new());

    let cx = Ctx {
        p: &p,
        tools: &tools,
        w: &w,
        quick,
    };
    let acc_secs = accuracy_section(&cx, &mut say)?;
    let ovh_secs = overhead_section(&cx, &mut say)?;
    let cost_secs = cost_section(&cx, &mut say)?;
    wrapper_section(&cx, &mut say)?;
    say(format!(
        "Peers part took {:.0} s (accuracy {acc_secs:.0} s, overhead {ovh_secs:.0} s, cost per sample {cost_secs:.0} s).",
        t_all.elapsed().as_secs_f64()
    ));
    Ok(md)
}
