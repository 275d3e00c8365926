//! `cargo xtask bench --only-exact`: every tool against the kernel's own accounting
//! of a cgroup that holds exactly the workload — storage bytes written (blkio /
//! io.stat), peak memory (memory.max_usage_in_bytes / memory.peak) and CPU on the
//! engine's hard shapes — and the end of a run with 1,500 zombies waiting for a lazy
//! reaper. Writes the section `EXACT_MARK` of docs/benchmarks.md and leaves the rest.

use std::{
    ffi::OsString,
    fmt::Write as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::Instant,
};

use anyhow::Context as _;
use serde_json::Value;

use crate::{
    measure::{stat, Machine},
    peers::{acc_interval, run_rusage, say_tool_header, tmp, Peers, Tool},
    truth::{pre_join_secs, Truth},
};

pub const EXACT_MARK: &str = "## Exactness of every tool against the kernel's accounting";

/// One workload: `workload MODE …`, or `sh -c SCRIPT` run in a scratch directory on
/// disk (O_DIRECT needs one; a tmpfs refuses it).
struct Shape {
    name: &'static str,
    args: Vec<String>,
    script: Option<&'static str>,
    /// Processes in the tree by the workload's design, where it fixes them.
    procs: Option<u64>,
}

fn shape(name: &'static str, args: &str, procs: Option<u64>) -> Shape {
    Shape {
        name,
        args: args.split_whitespace().map(String::from).collect(),
        script: None,
        procs,
    }
}

fn script(name: &'static str, s: &'static str) -> Shape {
    Shape {
        name,
        args: Vec::new(),
        script: Some(s),
        procs: None,
    }
}

/// 50 MiB with O_DIRECT under four shells (each reaps the one below, and the kernel
/// adds the child's I/O to its reaper's), and ten writers of 5 MiB at once.
const NESTED: &str =
    "sh -c 'sh -c \"sh -c \\\"dd if=/dev/zero of=f bs=1M count=50 oflag=direct status=none\\\"\"'";
const PARALLEL: &str = "for i in 0 1 2 3 4 5 6 7 8 9; do dd if=/dev/zero of=f$i bs=1M count=5 oflag=direct status=none & done; wait";

/// One run of `s` under `t` in a fresh truth cgroup: (the tool's output file, the
/// truth's CPU, write bytes and peak bytes).
struct Outcome {
    out: PathBuf,
    cpu: f64,
    written: Option<u64>,
    peak: Option<u64>,
}

fn one(p: &Peers, t: Tool, w: &Path, s: &Shape, scratch: &Path) -> anyhow::Result<Outcome> {
    let cg = Truth::new("exact-x")?;
    let pre = tmp("exact-pre");
    let out = tmp(&format!(
        "exact-out-{}",
        t.name().replace([' ', '(', ')'], "")
    ));
    let _ = std::fs::remove_file(&out);
    let mut cmd: Vec<OsString> = vec![
        w.into(),
        "incgroup".into(),
        cg.join_arg().into(),
        "--pre".into(),
        pre.clone().into(),
        "--".into(),
    ];
    match s.script {
        Some(sc) => cmd.extend(["sh".into(), "-c".into(), sc.into()]),
        None => {
            cmd.push(w.into());
            cmd.extend(s.args.iter().map(OsString::from));
        }
    }
    let mut c = t.command(p, acc_interval(t), &out, &cmd, true);
    c.current_dir(scratch);
    run_rusage(&mut c).with_context(|| format!("{} on {}", t.name(), s.name))?;
    Ok(Outcome {
        out,
        cpu: cg.cpu_secs() + pre_join_secs(&pre),
        written: cg.write_bytes(),
        peak: cg.peak_bytes(),
    })
}

/// "median (min–max)" of percentages, or what stands for none.
/// Runs `s` under every tool, `runs` rounds with the tools interleaved, and hands
/// each run that completed to `f` with the tool's index; one that failed is said.
fn each_run(
    p: &Peers,
    tools: &[Tool],
    w: &Path,
    s: &Shape,
    scratch: &Path,
    runs: usize,
    mut f: impl FnMut(usize, Tool, Outcome),
) {
    for _ in 0..runs {
        for (i, &t) in tools.iter().enumerate() {
            match one(p, t, w, s, scratch) {
                Ok(o) => f(i, t, o),
                Err(e) => eprintln!("xtask: {e:#}"),
            }
        }
    }
}

fn pct_cell(v: Vec<f64>, none: &str) -> String {
    if v.is_empty() {
        return none.to_string();
    }
    let (m, lo, hi) = stat(v);
    if hi - lo < 1e-12 {
        format!("{m:.1}%")
    } else {
        format!("{m:.1}% ({lo:.1}–{hi:.1})")
    }
}

/// What the sections of this bench share.
struct Ctx<'a> {
    p: &'a Peers,
    tools: &'a [Tool],
    w: &'a Path,
    scratch: &'a Path,
    runs: usize,
}

/// Storage bytes written, and write-call bytes where a tool reports them; the
/// seconds it took.
fn io_section(cx: &Ctx, say: &mut dyn FnMut(String)) -> f64 {
    // (a) Storage bytes written, and write-call bytes where a tool reports them.
    say("### Storage bytes written against the cgroup's (blkio / io.stat)".into());
    say(String::new());
    say("`write_bytes` as reported (ours: the summary; py-rt: Σ `disk_write_bytes` of `process_metrics`, i.e. the tree's `/proc/PID/io` per interval; rs-rt: Σ `cpu.process_disk_write_bytes`) as a % of the bytes the cgroup wrote to disk. psrecord and pidstat (`-T CHILD`: CPU and page faults only) do not report I/O. The `wchar` row is the bytes through write calls (ours alone reports them) as a % of what dd wrote through `write(2)`, 50 MiB, plus the shells' few bytes. Ours (procfs) reads `/proc/PID/io` of live members at its polls, and of each child the tracker reaps (the root, orphans) as a zombie just before the reap, so the writers' bytes reach it through the root even when every process is gone before the first sample; the peers' accuracy form keeps a gating shell alive 1.5 intervals after the command, which ours does not get.".into());
    say(String::new());
    say_tool_header(say, "| workload | cgroup wrote (MiB) |", cx.tools);
    let io_shapes = [
        script("50 MiB O_DIRECT at the bottom of 4 nested shells", NESTED),
        script("10 parallel writers × 5 MiB O_DIRECT", PARALLEL),
    ];
    let t_io = Instant::now();
    for s in &io_shapes {
        let mut cells: Vec<Vec<f64>> = vec![vec![]; cx.tools.len()];
        let mut wchar: Vec<Vec<f64>> = vec![vec![]; cx.tools.len()];
        let mut reported = vec![false; cx.tools.len()];
        let mut truths = vec![];
        each_run(cx.p, cx.tools, cx.w, s, cx.scratch, cx.runs, |i, t, o| {
            let Some(truth) = o.written.filter(|&b| b > 0) else {
                eprintln!("xtask: the cgroup counted no writes ({})", s.name);
                return;
            };
            truths.push(truth as f64 / 1048576.0);
            let im = t.io_mem(&o.out).unwrap_or_default();
            if let Some(b) = im.write_bytes {
                reported[i] = true;
                cells[i].push(100.0 * b as f64 / truth as f64);
            }
            if let Some(c) = im.wchar {
                wchar[i].push(100.0 * c as f64 / (50u64 << 20) as f64);
            }
        });
        let (m, lo, hi) = stat(truths);
        let mut row = format!("| {} | {m:.1} ({lo:.1}–{hi:.1}) |", s.name);
        let mut wrow = "| … `wchar`, % of 50 MiB | |".to_string();
        for i in 0..cx.tools.len() {
            let none = if reported[i] {
                "failed"
            } else {
                "not reported"
            };
            let _ = write!(row, " {} |", pct_cell(std::mem::take(&mut cells[i]), none));
            let _ = write!(
                wrow,
                " {} |",
                pct_cell(std::mem::take(&mut wchar[i]), "not reported")
            );
        }
        say(row);
        say(wrow);
    }
    say(String::new());
    t_io.elapsed().as_secs_f64()
}

/// Peak memory; the seconds it took.
fn mem_section(cx: &Ctx, say: &mut dyn FnMut(String)) -> f64 {
    // (b) Peak memory.
    say(
        "### Peak memory against the cgroup's peak (memory.max_usage_in_bytes / memory.peak)"
            .into(),
    );
    say(String::new());
    say("`workload memory MIB N 2500`: N processes each write MIB of anonymous memory at once and hold it 2.5 s, so that a tool sampling every second sees the peak at least once (a shorter hold measures sampling luck; ours also takes an exited process's peak from the kernel). Ours: the summary's `peak_memory_mib` (RSS); py-rt: the most `memory_mib` (PSS) of one sample; rs-rt: the most `cpu.process_rss_mib` (whole MiB); psrecord: the most \"Real (MB)\" (RSS, children included). pidstat `-T CHILD` reports no memory. The cgroup's peak also holds page tables and the tree's other kernel memory, so a tool that sees every page reads a little under 100 %.".into());
    say(String::new());
    say_tool_header(say, "| workload | cgroup peak (MiB) |", cx.tools);
    let mem_shapes = [
        shape("one process, 256 MiB", "memory 256 1 2500", Some(1)),
        shape(
            "four processes × 64 MiB at once",
            "memory 64 4 2500",
            Some(5),
        ),
    ];
    let t_mem = Instant::now();
    for s in &mem_shapes {
        let mut cells: Vec<Vec<f64>> = vec![vec![]; cx.tools.len()];
        let mut truths = vec![];
        each_run(cx.p, cx.tools, cx.w, s, cx.scratch, cx.runs, |i, t, o| {
            let Some(truth) = o.peak.filter(|&b| b > 0) else {
                return;
            };
            let truth = truth as f64 / 1048576.0;
            truths.push(truth);
            if let Some(m) = t.io_mem(&o.out).unwrap_or_default().peak_mib {
                cells[i].push(100.0 * m / truth);
            }
        });
        let (m, lo, hi) = stat(truths);
        let mut row = format!("| {} | {m:.1} ({lo:.1}–{hi:.1}) |", s.name);
        for (i, &t) in cx.tools.iter().enumerate() {
            let none = if t == Tool::Pidstat {
                "not reported"
            } else {
                "failed"
            };
            let _ = write!(row, " {} |", pct_cell(std::mem::take(&mut cells[i]), none));
        }
        say(row);
    }
    say(String::new());
    t_mem.elapsed().as_secs_f64()
}

/// CPU on the engine's hard shapes; the seconds it took.
fn cpu_section(cx: &Ctx, say: &mut dyn FnMut(String)) -> f64 {
    // (d) CPU on the engine's hard shapes.
    say(
        "### CPU on the hard shapes against the cgroup's (rows of the peers' accuracy table)"
            .into(),
    );
    say(String::new());
    say("The tree's CPU as a % of the cgroup's usage plus the root's CPU before it joined, as in the peers' accuracy table below; processes reported / in the tree in brackets (ours: all spawned, median; py-rt and rs-rt: the most alive in one sample), the count alone where the shell decides it. A truth of 0.01 s (the nested shells: O_DIRECT writes cost little CPU) is one tick of the peers' tick-based counters, so their cells there are noise.".into());
    say(String::new());
    say_tool_header(say, "| workload | truth CPU (s) |", cx.tools);
    let cpu_shapes = [
        script(
            "nested shells doing I/O (50 MiB O_DIRECT under 4 shells)",
            NESTED,
        ),
        shape(
            "orphans reaped 1.5 s later by a lazy subreaper (`lazyreaper 400 2 1500`)",
            "lazyreaper 400 2 1500",
            Some(801),
        ),
        shape(
            "1,500 orphans reaped by init (`orphans 1500 1 300`)",
            "orphans 1500 1 300",
            Some(3001),
        ),
        shape(
            "a double-forking daemon outliving the root (`daemon 200`)",
            "daemon 200",
            Some(3),
        ),
        shape(
            "vfork + exec, 150 children (`vfork 150 2000`)",
            "vfork 150 2000",
            Some(151),
        ),
        shape(
            "CLONE_PARENT, 150 siblings (`cloneparent 150 2000`)",
            "cloneparent 150 2000",
            Some(151),
        ),
        shape(
            "exec from a non-leader thread (`threadexec 150000`)",
            "threadexec 150000",
            Some(1),
        ),
        shape(
            "leader exits before its 3 threads (`leaderexit 3 300`)",
            "leaderexit 3 300",
            Some(1),
        ),
    ];
    let t_cpu = Instant::now();
    for s in &cpu_shapes {
        let mut cells: Vec<Vec<f64>> = vec![vec![]; cx.tools.len()];
        let mut procs: Vec<Vec<f64>> = vec![vec![]; cx.tools.len()];
        let mut truths = vec![];
        each_run(
            cx.p,
            cx.tools,
            cx.w,
            s,
            cx.scratch,
            cx.runs,
            |i, t, o| match t.parse(&o.out, acc_interval(t)) {
                Ok((cpu, n)) => {
                    truths.push(o.cpu);
                    cells[i].push(100.0 * cpu / o.cpu);
                    if let Some(n) = n {
                        procs[i].push(n as f64);
                    }
                }
                Err(e) => eprintln!("xtask: {} on {}: {e:#}", t.name(), s.name),
            },
        );
        let (m, lo, hi) = stat(truths);
        let mut row = format!("| {} | {m:.2} ({lo:.2}–{hi:.2}) |", s.name);
        for i in 0..cx.tools.len() {
            let pc = if procs[i].is_empty() {
                String::new()
            } else {
                let (n, _, _) = stat(std::mem::take(&mut procs[i]));
                match s.procs {
                    Some(all) => format!(" [{n:.0}/{all}]"),
                    None => format!(" [{n:.0}]"),
                }
            };
            let _ = write!(
                row,
                " {}{pc} |",
                pct_cell(std::mem::take(&mut cells[i]), "failed")
            );
        }
        say(row);
    }
    say(String::new());
    t_cpu.elapsed().as_secs_f64()
}

/// The end of a run; the seconds it took.
fn end_section(tr: &Path, w: &Path, quick: bool, say: &mut dyn FnMut(String)) -> f64 {
    // (c) The end of a run.
    let end_runs = if quick { 2 } else { 5 };
    say("### The end of a run: 1,500 zombies waiting for a lazy reaper (goals: tracker CPU in the final interval ≤ 5 ms, final sample ≤ 50 ms after the root's exit)".into());
    say(String::new());
    say(format!("`resource-tracker run -i 1 -o SAMPLES [--no-ebpf] -- workload orphans 1500 1 300`: 1,500 children each leave a grandchild that spins 1 ms and exits as an orphan, reaped by init (which reaps lazily here) after the root has gone; the root prints its last line 300 ms after its orphans have exited. Delay: the final sample's `timestamp_secs` minus the Unix time of the root's last line; CPU: the final sample's `tracker.cpu_secs` (the tracker's user + system time over the final, partial interval, which holds the end). Median (min–max) of {end_runs} runs per backend, interleaved. The peers write no final sample at the root's exit to compare with."));
    say(String::new());
    say("| backend | final sample after the root's exit, ms | tracker CPU in the final interval, ms | processes spawned / exited |".into());
    say("|---|---|---|---|".into());
    let t_end = Instant::now();
    let mut res: [(Vec<f64>, Vec<f64>, String); 2] = Default::default();
    for _ in 0..end_runs {
        for (i, procfs) in [false, true].into_iter().enumerate() {
            match end_run(tr, w, procfs) {
                Ok((d, c, n)) => {
                    res[i].0.push(d);
                    res[i].1.push(c);
                    res[i].2 = n;
                }
                Err(e) => eprintln!("xtask: end of run: {e:#}"),
            }
        }
    }
    for (i, name) in ["ebpf", "procfs"].iter().enumerate() {
        let (d, dl, dh) = stat(std::mem::take(&mut res[i].0));
        let (c, cl, ch) = stat(std::mem::take(&mut res[i].1));
        say(format!(
            "| {name} | **{d:.1}** ({dl:.1}–{dh:.1}) | **{c:.2}** ({cl:.2}–{ch:.2}) | {} |",
            res[i].2
        ));
    }
    say(String::new());
    t_end.elapsed().as_secs_f64()
}

pub fn run(dir: &Path, quick: bool) -> anyhow::Result<String> {
    let t_all = Instant::now();
    let (tr, w, p, tools) = crate::peers::setup(dir)?;
    let runs = if quick { 1 } else { 3 };
    let scratch = std::env::temp_dir().join(format!("rt-exact-{}", std::process::id()));
    std::fs::create_dir_all(&scratch)?;
    let mut md = String::new();
    let mut say = |line: String| {
        println!("{line}");
        md.push_str(&line);
        md.push('\n');
    };
    let m = Machine::read();
    say(format!("{EXACT_MARK} (`cargo xtask bench --only-exact`)"));
    say(String::new());
    say(format!(
        "Measured on {} vCPU ({}), kernel {}, tracker {} ({}), with the peers of the section below (same commands, intervals 1 s, psrecord 0.5 s; the accuracy form, see there). Each run executes `workload incgroup DIRS --pre F -- CMD` under the tool: the root joins a fresh cgroup in every hierarchy that keeps a truth (v1 `cpuacct`, `blkio` with a 1 TiB/s throttle rule so that it counts, `memory`; else v2 `cpu.stat`, `io.stat`, `memory.peak`) before it execs the workload. A cell is the tool's figure as a % of the cgroup's: median (min–max) of {runs} run(s), the tools interleaved run by run. The machine has 2 vCPU and is shared with other work; these are ratios to the kernel's own counters of the same run, so load moves them little.",
        m.vcpus,
        m.cpu,
        m.kernel,
        env!("CARGO_PKG_VERSION"),
        m.commit,
    ));
    say(String::new());

    let cx = Ctx {
        p: &p,
        tools: &tools,
        w: &w,
        scratch: &scratch,
        runs,
    };
    let io_secs = io_section(&cx, &mut say);
    let mem_secs = mem_section(&cx, &mut say);
    let cpu_secs = cpu_section(&cx, &mut say);
    let end_secs = end_section(&tr, &w, quick, &mut say);
    say(format!(
        "This section took {:.0} s (I/O {io_secs:.0} s, memory {mem_secs:.0} s, CPU shapes {cpu_secs:.0} s, end of run {end_secs:.0} s).",
        t_all.elapsed().as_secs_f64()
    ));
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(md)
}

/// One end-of-run measurement: (delay ms, tracker CPU ms in the final interval,
/// "spawned / exited").
fn end_run(tr: &Path, w: &Path, procfs: bool) -> anyhow::Result<(f64, f64, String)> {
    let samples = tmp("end-samples");
    let sum = tmp("end-summary");
    let mut c = Command::new(tr);
    c.args(["run", "-i", "1", "-o"])
        .arg(&samples)
        .arg("--summary")
        .arg(&sum);
    if procfs {
        c.arg("--no-ebpf");
    }
    c.arg("--").arg(w).args(["orphans", "1500", "1", "300"]);
    let o = c
        .stderr(Stdio::null())
        .output()
        .context("running the tracker")?;
    let line: Value = String::from_utf8_lossy(&o.stdout)
        .lines()
        .find_map(|l| serde_json::from_str(l).ok())
        .context("no workload line")?;
    let root_done = line["unix_secs"].as_f64().context("unix_secs")?;
    let text = std::fs::read_to_string(&samples)?;
    let last: Value = serde_json::from_str(text.lines().last().context("no sample")?)?;
    let at = last["timestamp_secs"].as_f64().context("timestamp_secs")?;
    let cpu = last["tracker"]["cpu_secs"]
        .as_f64()
        .context("tracker.cpu_secs")?;
    let s: Value = serde_json::from_str(&std::fs::read_to_string(&sum)?)?;
    Ok((
        (at - root_done) * 1e3,
        cpu * 1e3,
        format!("{} / {}", s["processes_spawned"], s["processes_exited"]),
    ))
}

/// Replaces (or adds before the peers' section) this section of docs/benchmarks.md.
pub fn write(path: &Path, md: &str) -> anyhow::Result<()> {
    crate::benchdoc::write_section(path, EXACT_MARK, md)
}

/// This section of `old`, to keep through a run that does not measure it.
pub fn section(old: &str) -> Option<&str> {
    crate::benchdoc::doc_section(old, EXACT_MARK)
}
