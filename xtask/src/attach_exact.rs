//! `cargo xtask bench --only-attach-exact`: the attach path (`--pid` on both
//! backends, the Python package as root and as a user) held against the kernel's
//! accounting of a cgroup that holds exactly the workload, quiet and beside
//! unrelated churn, worst of N runs.
//!
//! The tracked root is a Python interpreter (the driver below), as it is for the
//! package's users: it joins a fresh cgroup, then either waits for a tracker
//! attached to it (`--pid`) or starts one itself (`ResourceTracker`), and runs the
//! workload as a child. Truths: the cgroup's CPU from the moment the tree is
//! tracked (less the tracker's own where the package's tracker runs inside it),
//! its peak memory, and the processes the tree created (ftrace).
//!
//! Each workload runs twice per path: in a cgroup that holds only the tree, which
//! the tracker adopts as its source, and beside an idle stranger (`sleep`) in the
//! same cgroup, which makes the tracker fall back to its backend's own sums while
//! the truth stays the tree's (the stranger does not run).

use std::{
    io::{BufRead, BufReader, Write as _},
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};
use serde_json::{json, Value};

use crate::{
    measure::{Bg, Machine},
    real_bench::{Churn, Ftrace, POOL_PY},
    truth::Truth,
};

pub const ATTACH_EXACT_MARK: &str = "## Attached: exactness against the cgroup";

/// The tracked interpreter. argv: mode (`pid`: print the pid, wait for a line on
/// stdin, then run; `py`: start `ResourceTracker` here), the cgroup's CPU file,
/// the workload's shell script, the tracker binary.
const DRIVER: &str = r#"import json, os, subprocess, sys, time
mode, cpu_file, script, binary = sys.argv[1:5]

def cg():
    # The cgroup's count lacks what the task reading it has run since the
    # scheduler last charged it (up to a tick: 1-2 ms after the 500 MiB spike's
    # munmap); reading its own CPU clock charges it first.
    time.process_time_ns()
    text = open(cpu_file).read()
    if cpu_file.endswith("cpu.stat"):
        return int(next(l.split()[1] for l in text.splitlines() if l.startswith("usage_usec "))) * 1000
    return int(text)

def sched(pid):
    n = 0
    for t in os.listdir(f"/proc/{pid}/task"):
        try:
            n += int(open(f"/proc/{pid}/task/{t}/schedstat").read().split()[0])
        except OSError:
            pass
    return n

def work():
    if script == "@hold":
        # The issue's shape: the tracked interpreter itself holds 500 MiB.
        import time
        b = bytearray(500 << 20)
        time.sleep(0.5)
        del b
        return 0
    return subprocess.run(["/bin/sh", "-c", script]).returncode

if mode == "pid":
    print(os.getpid(), flush=True)
    sys.stdin.readline()
    sys.exit(work())

from resource_tracker_ebpf import ResourceTracker
t = ResourceTracker(interval=1, discover_server=False, binary=binary)
t.start()
# The truth's window is the tracker's less start()'s tail and stop()'s head:
# the cgroup read first after start() and last before stop().
c0 = cg()
tp = t._proc.pid
s0 = sched(tp)
rc = work()
s1 = sched(tp)
c1 = cg()
t.stop()
s = t.summary
print(json.dumps({
    "rc": rc,
    "summary": s,
    "stats_max": t.stats()["process_memory_mib"]["max"],
    "rec_memory": t.recommend_resources()["memory"],
    "truth_cpu": ((c1 - c0) - (s1 - s0)) / 1e9,
    # A run that counted nothing keeps its samples' tree blocks, to see why.
    "samples": [x.get("process") for x in t.samples] if not s["cpu_total_secs"] else None,
}))
"#;

/// 33 C files for `make -j2`, each 150 statements gcc -O2 takes a while over
/// (~5 s of CPU in all here).
fn c_project(dir: &Path) -> anyhow::Result<()> {
    let src = dir.join("cproj");
    if src.join("Makefile").exists() {
        return Ok(());
    }
    std::fs::create_dir_all(&src)?;
    let mut objs = vec![];
    for i in 0..33 {
        let mut c = format!("unsigned f{i}(unsigned x) {{\n");
        for j in 0..150 {
            c.push_str(&format!(
                "  x = (x * {}u + {j}u) ^ (x >> {});\n  if (x % {}u == 0) x += {i}u;\n",
                2 * j + 3,
                j % 13 + 1,
                j + 7
            ));
        }
        c.push_str("  return x;\n}\n");
        std::fs::write(src.join(format!("f{i}.c")), c)?;
        objs.push(format!("f{i}.o"));
    }
    std::fs::write(
        src.join("Makefile"),
        format!(
            "all: {o}\n%.o: %.c\n\tgcc -O2 -c $< -o $@\nclean:\n\trm -f *.o\n",
            o = objs.join(" ")
        ),
    )?;
    Ok(())
}

/// The workloads the issue names: a pipeline through nested shells, `make -j2`,
/// a multiprocessing pool, a tree that ends within one interval of its root,
/// and 500 MiB held for 0.5 s between two 1 s samples, by the tracked
/// interpreter itself (the seed's step) and by a child that lives 0.5 s.
fn workloads() -> Vec<(&'static str, &'static str)> {
    vec![
        (
            "pipeline through nested shells",
            "sh -c 'find /usr/share -type f 2>/dev/null | head -n 30000 | xargs -P2 -n 50 sha256sum 2>/dev/null | sort >/dev/null'",
        ),
        ("make -j2 (33 C files)", "make -s -B -j2 -C cproj"),
        (
            "multiprocessing.Pool(2, maxtasksperchild=2), 40 tasks",
            "/usr/bin/python3 pool.py",
        ),
        (
            "a tree that ends within one interval (0.7 s)",
            "sh -c 'head -c 200000000 /dev/zero | sha256sum >/dev/null'",
        ),
        ("500 MiB held by the tracked interpreter for 0.5 s", "@hold"),
        (
            "500 MiB held by a child for 0.5 s",
            "/usr/bin/python3 -c 'import time; b = bytearray(500 << 20); time.sleep(0.5)'",
        ),
    ]
}

#[derive(Clone, Copy, PartialEq, Eq, Debug)]
pub(crate) enum Way {
    PidEbpf,
    PidProcfs,
    PyRoot,
    PyUser,
}

impl Way {
    const ALL: [Way; 4] = [Way::PidEbpf, Way::PidProcfs, Way::PyRoot, Way::PyUser];
    fn name(self) -> &'static str {
        match self {
            Way::PidEbpf => "`--pid` (eBPF)",
            Way::PidProcfs => "`--pid --no-ebpf` (procfs)",
            Way::PyRoot => "Python package as root (eBPF)",
            Way::PyUser => "Python package as a user (procfs)",
        }
    }
    fn ebpf(self) -> bool {
        matches!(self, Way::PidEbpf | Way::PyRoot)
    }
    fn by_pid(self) -> bool {
        matches!(self, Way::PidEbpf | Way::PidProcfs)
    }
}

/// One run's figures: the tracker's summary and the truths.
#[derive(Clone, Debug)]
struct Run {
    workload: usize,
    path: Way,
    own: bool,
    churn: bool,
    truth_cpu: f64,
    truth_procs: Option<u64>,
    truth_peak_mib: Option<f64>,
    cpu: f64,
    procs: Option<u64>,
    peak_mib: f64,
    stats_max: f64,
    rec_memory: f64,
    tracker_rss: f64,
    cpu_source: String,
    memory_source: String,
    backend: String,
}

struct Setup {
    tr: PathBuf,
    w: PathBuf,
    scratch: PathBuf,
    ft: Option<Ftrace>,
}

/// The scratch directory every user can read: the driver, the package's source
/// and the binary copied there (a checkout under /root is not readable by nobody).
fn setup(dir: &Path) -> anyhow::Result<Setup> {
    let scratch = PathBuf::from(format!("/tmp/rt-attach-exact-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&scratch);
    std::fs::create_dir_all(&scratch)?;
    std::fs::write(scratch.join("driver.py"), DRIVER)?;
    std::fs::write(scratch.join("pool.py"), POOL_PY)?;
    c_project(&scratch)?;
    let tr = scratch.join("resource-tracker");
    std::fs::copy(dir.join("resource-tracker"), &tr)?;
    crate::sh(
        Command::new("cp")
            .arg("-r")
            .arg(crate::root().join("python/src/resource_tracker_ebpf"))
            .arg(&scratch),
    )?;
    crate::sh(Command::new("chmod").args(["-R", "a+rwX"]).arg(&scratch))?;
    let ft = match Ftrace::new() {
        Ok(f) => Some(f),
        Err(e) => {
            eprintln!("xtask: no ftrace, processes not counted: {e:#}");
            None
        }
    };
    Ok(Setup {
        tr,
        w: dir.join("workload"),
        scratch,
        ft,
    })
}

fn wait_until(what: &str, secs: u64, mut f: impl FnMut() -> bool) -> anyhow::Result<()> {
    let t0 = Instant::now();
    while !f() {
        if t0.elapsed() > Duration::from_secs(secs) {
            bail!("{what}: not within {secs} s");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(())
}

fn procs_of(cgdir: &str) -> usize {
    std::fs::read_to_string(Path::new(cgdir).join("cgroup.procs"))
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

/// What a run of the tracker gave: its summary, and the truth's CPU over the
/// tracker's window; the stats' memory max and the recommended memory as the
/// path gives them (the package's own `stats()` and `recommend_resources()`).
struct Outcome {
    summary: Value,
    truth_cpu: f64,
    stats_max: f64,
    rec_memory: f64,
}

/// The driver's command line: ftrace's prefix, the join, the user, the driver.
fn driver_argv(
    s: &Setup,
    way: Way,
    join: &str,
    cpu_file: &Path,
    script: &str,
) -> anyhow::Result<Vec<String>> {
    let mut argv: Vec<String> = vec![];
    if let Some(f) = &s.ft {
        f.reset()?;
        argv.extend(
            f.prefix()
                .into_iter()
                .map(|a| a.to_string_lossy().into_owned()),
        );
    }
    argv.extend([
        s.w.display().to_string(),
        "incgroup".into(),
        join.into(),
        "--".into(),
    ]);
    if way == Way::PyUser {
        argv.extend(
            [
                "setpriv",
                "--reuid=65534",
                "--regid=65534",
                "--clear-groups",
            ]
            .map(String::from),
        );
    }
    argv.extend([
        "/usr/bin/python3".into(),
        s.scratch.join("driver.py").display().to_string(),
        if way.by_pid() { "pid" } else { "py" }.into(),
        cpu_file.display().to_string(),
        script.into(),
        s.tr.display().to_string(),
    ]);
    Ok(argv)
}

/// `--pid`: the tracker attached to the waiting driver; the truth is the
/// cgroup's CPU from its first sample on.
fn by_pid(
    s: &Setup,
    way: Way,
    cg: &Truth,
    driver: &mut Bg,
    out: &mut impl BufRead,
) -> anyhow::Result<Outcome> {
    let mut line = String::new();
    out.read_line(&mut line)?;
    let pid: u32 = line
        .trim()
        .parse()
        .with_context(|| format!("driver said {line:?}"))?;
    let sum = s.scratch.join("summary.json");
    let samples = s.scratch.join("samples.jsonl");
    let _ = std::fs::remove_file(&sum);
    let _ = std::fs::remove_file(&samples);
    let mut t = Command::new(&s.tr);
    t.args(["-q", "-i", "1", "-o"])
        .arg(&samples)
        .arg("--summary")
        .arg(&sum);
    if way == Way::PidProcfs {
        t.arg("--no-ebpf");
    }
    let mut tracker = Bg(t
        .arg("--pid")
        .arg(pid.to_string())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .context("the tracker")?);
    wait_until("the tracker's first sample", 15, || {
        std::fs::metadata(&samples).is_ok_and(|m| m.len() > 0)
    })?;
    // The driver is blocked on its stdin: nothing in the cgroup runs between the
    // tracker's first reading and this one.
    let c0 = cg.cpu_secs();
    driver
        .0
        .stdin
        .take()
        .context("driver stdin")?
        .write_all(b"go\n")?;
    let rc = driver.0.wait()?;
    // Attached, the tracker samples the host on after the tree ends, until told
    // to stop, as the package's stop() tells it: at once.
    // SAFETY: a signal to the tracker this function started.
    unsafe { libc::kill(tracker.0.id() as i32, libc::SIGTERM) };
    wait_until("the tracker's end", 15, || {
        tracker.0.try_wait().is_ok_and(|x| x.is_some())
    })?;
    if !rc.success() {
        bail!("the workload failed: {rc}");
    }
    let v: Value = serde_json::from_str(&std::fs::read_to_string(&sum)?)?;
    Ok(Outcome {
        stats_max: v["stats"]["process_memory_mib"]["max"]
            .as_f64()
            .unwrap_or(f64::NAN),
        rec_memory: v["recommendation"]["memory_mib"]
            .as_f64()
            .unwrap_or(f64::NAN),
        summary: v,
        truth_cpu: cg.cpu_secs() - c0,
    })
}

/// The package: the driver started the tracker, and measured the truth itself.
fn by_package(driver: &mut Bg, out: &mut impl BufRead) -> anyhow::Result<Outcome> {
    let mut text = String::new();
    out.read_to_string(&mut text)?;
    let rc = driver.0.wait()?;
    let v: Value = serde_json::from_str(text.trim())
        .with_context(|| format!("driver ({rc}) printed {text:?}"))?;
    if v["rc"].as_i64() != Some(0) {
        bail!("the workload failed: {}", v["rc"]);
    }
    let f = |k: &str| v[k].as_f64().unwrap_or(f64::NAN);
    if !v["samples"].is_null() {
        eprintln!(
            "xtask: the package counted no CPU; its samples: {}",
            v["samples"]
        );
    }
    Ok(Outcome {
        truth_cpu: f("truth_cpu"),
        stats_max: f("stats_max"),
        rec_memory: f("rec_memory"),
        summary: v["summary"].clone(),
    })
}

fn one(s: &Setup, way: Way, own: bool, script: &str) -> anyhow::Result<Run> {
    let cg = Truth::new("attx")?;
    let join = cg.join_arg();
    let cpu_dir = join.split(':').next().unwrap_or_default().to_string();
    // An idle stranger in the same cgroup: the tracker must not adopt it.
    let _stranger = if own {
        None
    } else {
        let b = Bg(Command::new(&s.w)
            .args(["incgroup", &join, "--", "sleep", "600"])
            .process_group(0)
            .spawn()
            .context("the stranger")?);
        wait_until("the stranger joins", 5, || procs_of(&cpu_dir) == 1)?;
        Some(b)
    };
    let argv = driver_argv(s, way, &join, &cg.cpu_file(), script)?;
    let mut cmd = Command::new(&argv[0]);
    cmd.args(&argv[1..])
        .current_dir(&s.scratch)
        .env("PYTHONPATH", &s.scratch)
        .env("HOME", &s.scratch)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .process_group(0);
    let mut driver = Bg(cmd.spawn().with_context(|| format!("{argv:?}"))?);
    let mut out = BufReader::new(driver.0.stdout.take().context("driver stdout")?);
    let o = if way.by_pid() {
        by_pid(s, way, &cg, &mut driver, &mut out)?
    } else {
        by_package(&mut driver, &mut out)?
    };
    if o.summary["cpu_total_secs"].as_f64() == Some(0.0) {
        eprintln!(
            "xtask: {}: no CPU counted: {o:?}",
            way.name(),
            o = o.summary
        );
    }
    let mut truth_procs = match &s.ft {
        Some(f) => f.count()?,
        None => None,
    };
    // An attached root is not a process the tree started (`processes_spawned`
    // counts what it started); the package's tracker is one the interpreter made.
    let not_the_trees = if way.by_pid() { 1 } else { 2 };
    truth_procs = truth_procs.map(|n| n.saturating_sub(not_the_trees));
    let f = |k: &str| o.summary[k].as_f64().unwrap_or(f64::NAN);
    let st = |k: &str| o.summary[k].as_str().unwrap_or("?").to_string();
    Ok(Run {
        workload: 0,
        path: way,
        own,
        churn: false,
        truth_cpu: o.truth_cpu,
        truth_procs,
        truth_peak_mib: cg.peak_bytes().map(|b| b as f64 / 1048576.0),
        cpu: f("cpu_total_secs"),
        procs: o.summary["processes_spawned"].as_u64(),
        peak_mib: f("peak_memory_mib"),
        stats_max: o.stats_max,
        rec_memory: o.rec_memory,
        tracker_rss: f("tracker_max_rss_mib"),
        cpu_source: st("cpu_source"),
        memory_source: st("memory_source"),
        backend: st("backend"),
    })
}

/// What `run` measures: `runs` rounds of every workload whose name holds
/// `only`, quiet and/or beside churn.
pub struct Plan {
    pub runs: usize,
    pub only: Option<String>,
    pub quiet: bool,
    pub churn: bool,
}

pub fn run(dir: &Path, plan: &Plan) -> anyhow::Result<String> {
    let t0 = Instant::now();
    let s = setup(dir)?;
    let all = workloads();
    let raw = crate::root().join("target/attach-exact.jsonl");
    let mut rawf = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&raw)?;
    let mut data = vec![];
    for churn in [false, true] {
        if !(if churn { plan.churn } else { plan.quiet }) {
            continue;
        }
        let _bg = if churn {
            Some(Churn::start(&s.w)?)
        } else {
            None
        };
        for (wi, (name, script)) in all.iter().enumerate() {
            if plan
                .only
                .as_ref()
                .is_some_and(|o| !name.contains(o.as_str()))
            {
                continue;
            }
            for round in 0..plan.runs {
                for path in Way::ALL {
                    for own in [true, false] {
                        let mut r = match one(&s, path, own, script) {
                            Ok(r) => r,
                            Err(e) => {
                                eprintln!("xtask: {name}, {}, own {own}: {e:#}", path.name());
                                continue;
                            }
                        };
                        r.workload = wi;
                        r.churn = churn;
                        let line = json!({
                            "workload": name, "churn": churn, "round": round,
                            "path": path.name(), "own_cgroup": own,
                            "truth_cpu": r.truth_cpu, "cpu": r.cpu,
                            "truth_procs": r.truth_procs, "procs": r.procs,
                            "truth_peak_mib": r.truth_peak_mib, "peak_mib": r.peak_mib,
                            "stats_max": r.stats_max, "rec_memory": r.rec_memory,
                            "tracker_rss": r.tracker_rss, "cpu_source": r.cpu_source,
                            "memory_source": r.memory_source, "backend": r.backend,
                        });
                        eprintln!("xtask: attach-exact {line}");
                        let _ = writeln!(rawf, "{line}");
                        data.push(r);
                    }
                }
            }
        }
    }
    let _ = std::fs::remove_dir_all(&s.scratch);
    Ok(render(&all, &data, plan, t0.elapsed().as_secs_f64()))
}

/// The issue's "peak within 2 % of the cgroup's" for a cgroup that holds only
/// the job, as "N of M" runs: with the package, the cgroup holds the tracker
/// too, whose RSS the tracker leaves out, so the job's own peak lies between the
/// cgroup's less the tracker's largest RSS and the cgroup's.
fn peak_held(rs: &[&Run], path: Way, own: bool) -> String {
    if !own {
        return "–".to_string();
    }
    let ok = rs
        .iter()
        .filter(|r| {
            r.truth_peak_mib.is_some_and(|cg| {
                let lo = if path.by_pid() {
                    cg
                } else {
                    cg - r.tracker_rss
                };
                r.peak_mib >= 0.98 * lo && r.peak_mib <= 1.02 * cg
            })
        })
        .count();
    format!("{ok} of {}", rs.len())
}

/// The tracker's CPU against the truth, percent.
fn err_pct(r: &Run) -> f64 {
    100.0 * (r.cpu - r.truth_cpu) / r.truth_cpu
}

fn render(all: &[(&str, &str)], data: &[Run], plan: &Plan, secs: f64) -> String {
    let m = Machine::read();
    let mut md = vec![
        ATTACH_EXACT_MARK.to_string(),
        String::new(),
        format!(
            "Generated by `cargo xtask bench --only-attach-exact` (release build) on {} vCPU ({}), kernel {}, tracker {}, {} run(s) per cell, quiet{} ({:.0} s in all). The tracked root is a Python interpreter in a fresh cgroup: with `--pid` it waits until the tracker's first sample is out, then runs the workload; the Python package's `ResourceTracker(interval=1)` starts the tracker itself, inside the cgroup (its CPU is taken out of the truth, by its threads' schedstat over the same window). Truth: the cgroup's CPU from the moment the tree is tracked, its peak (v1 `memory.max_usage_in_bytes` or v2 `memory.peak`), the processes the tree made (ftrace). *own cgroup*: the cgroup holds only the tree, and the tracker takes CPU and memory from it; *beside a stranger*: an idle `sleep` shares the cgroup, so the tracker uses its backend's sums (the truth stays the tree's: the stranger does not run). CPU: the worst run's error, % of the truth and in ms (the median's in parentheses), against the issue's bound (0.5 % on eBPF and from an own cgroup, 2 % on procfs): /proc's times are whole clock ticks (10 ms here), each floored, so procfs's sums of a sub-second job are off by up to two ticks a process that reported them; the package's window holds the interpreter's own work in start()'s tail and stop()'s head (under 1 ms here), which the truth, read right after start() and right before stop(), does not (the driver reads its own CPU clock before each cgroup reading, which charges its running time to the cgroup first); processes: runs where the tracker's count equals ftrace's; peak: the tracker's `peak_memory_mib` ÷ the cgroup's peak, lowest–highest (the cgroup's holds the interpreter, and with the package the tracker, whose RSS the tracker leaves out of its own figure); in a cgroup of the job's own, the runs whose peak is within 2 % of the cgroup's, less the tracker's largest RSS where the tracker is inside it; then the lowest `peak_memory_mib`, `stats.process_memory_mib.max` and recommended memory of the runs.",
            m.vcpus, m.cpu, m.kernel, m.commit, plan.runs,
            if plan.churn { " and beside unrelated churn" } else { "" },
            secs
        ),
        String::new(),
        "| workload | path | cgroup | churn | CPU error, worst (median) | sources | processes exact | peak ÷ cgroup's | own cgroup: peak within 2 % | lowest peak / stats max / advice, MiB |".into(),
        "|---|---|---|---|---|---|---|---|---|".into(),
    ];
    for (wi, (name, _)) in all.iter().enumerate() {
        for path in Way::ALL {
            for own in [true, false] {
                for churn in [false, true] {
                    let rs: Vec<&Run> = data
                        .iter()
                        .filter(|r| {
                            r.workload == wi && r.path == path && r.own == own && r.churn == churn
                        })
                        .collect();
                    if rs.is_empty() {
                        continue;
                    }
                    let Some(w) = rs
                        .iter()
                        .max_by(|a, b| err_pct(a).abs().total_cmp(&err_pct(b).abs()))
                    else {
                        continue;
                    };
                    let (worst, worst_ms) = (err_pct(w), (w.cpu - w.truth_cpu) * 1e3);
                    let (med, _, _) = crate::measure::stat(rs.iter().map(|r| err_pct(r)).collect());
                    let mut sources: Vec<String> = rs
                        .iter()
                        .map(|r| format!("{}/{}", r.cpu_source, r.memory_source))
                        .collect();
                    sources.sort();
                    sources.dedup();
                    let exact = rs
                        .iter()
                        .filter(|r| r.truth_procs.is_some() && r.procs == r.truth_procs)
                        .count();
                    let procs = rs
                        .iter()
                        .map(|r| {
                            format!(
                                "{}/{}",
                                r.procs.unwrap_or(0),
                                r.truth_procs.map_or("?".into(), |n| n.to_string())
                            )
                        })
                        .collect::<Vec<_>>();
                    let peaks: Vec<f64> = rs
                        .iter()
                        .filter_map(|r| r.truth_peak_mib.map(|t| r.peak_mib / t))
                        .collect();
                    let (plo, phi) = peaks
                        .iter()
                        .fold((f64::INFINITY, f64::NEG_INFINITY), |(a, b), &x| {
                            (a.min(x), b.max(x))
                        });
                    let low =
                        |f: fn(&Run) -> f64| rs.iter().map(|r| f(r)).fold(f64::INFINITY, f64::min);
                    let mem = format!(
                        "{:.0} / {:.0} / {:.0}",
                        low(|r| r.peak_mib),
                        low(|r| r.stats_max),
                        low(|r| r.rec_memory)
                    );
                    let peak_held = peak_held(&rs, path, own);
                    let bound = if own || path.ebpf() { 0.5 } else { 2.0 };
                    let held = if worst.abs() <= bound {
                        "within"
                    } else {
                        "**outside**"
                    };
                    md.push(format!(
                        "| {name} | {} | {} | {} | {worst:+.2} % ({worst_ms:+.0} ms; median {med:+.2} %), {held} {bound} % | {} | {exact} of {} ({}) | {plo:.3}–{phi:.3} | {peak_held} | {mem} |",
                        path.name(),
                        if own { "own" } else { "beside a stranger" },
                        if churn { "yes" } else { "no" },
                        sources.join(", "),
                        rs.len(),
                        procs.join(" "),
                    ));
                }
            }
        }
    }
    md.push(String::new());
    md.join("\n")
}

pub fn write(path: &Path, md: &str) -> anyhow::Result<()> {
    crate::benchdoc::write_section(path, ATTACH_EXACT_MARK, md)
}
