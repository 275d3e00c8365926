//! The checks `cargo xtask kernels` runs inside each guest kernel (as its /init's
//! last step, root, cgroup v2 at /sys/fs/cgroup, TMPDIR on a block device): every
//! program of `run` and `node` loaded and attached, the engine's shapes against the
//! guest's own cgroup accounting, the node agent's container CPU against its cgroup,
//! the procfs fallback, and the degraded names against this kernel's BTF.
//!
//! One line per cell on stdout, `RT-CHECK<TAB>check<TAB>ok|FAIL<TAB>figures`, then
//! `RT-DONE<TAB>failed-count`: the xtask reads them from the serial console. The
//! shapes are sized for an emulated CPU; the bounds are the host's (CPU 0.5 %,
//! bytes 1 %, counts exact).

use std::{
    collections::BTreeMap,
    ffi::CString,
    io::{Read as _, Write as _},
    os::unix::process::CommandExt as _,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;
use tracker_tests::{
    containers::FakeContainer,
    free_port, tracker,
    truth::{self, check_adds_up, cpu_ratio, f, Tracked},
    workload, Scratch,
};

/// CPU within this fraction of the cgroup's.
const CPU_TOLERANCE: f64 = 0.005;
/// Storage bytes within this fraction of the cgroup's.
const IO_TOLERANCE: f64 = 0.01;

/// One cell of the table: a check's name, whether it held, and its figures.
struct Cell {
    check: String,
    ok: bool,
    figures: String,
}

fn ok(check: &str, figures: String) -> Cell {
    Cell {
        check: check.into(),
        ok: true,
        figures,
    }
}

fn bad(check: &str, figures: String) -> Cell {
    Cell {
        check: check.into(),
        ok: false,
        figures,
    }
}

// ---------------------------------------------------------------------------------
// BPF objects the kernel holds, listed by id: proof that a program is loaded and
// that a link attaches it to its tracepoint, independent of the tracker's word.

const BPF_PROG_GET_NEXT_ID: libc::c_long = 11;
const BPF_PROG_GET_FD_BY_ID: libc::c_long = 13;
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
const BPF_LINK_GET_FD_BY_ID: libc::c_long = 30;
const BPF_LINK_GET_NEXT_ID: libc::c_long = 31;
const BPF_LINK_TYPE_RAW_TRACEPOINT: u32 = 1;

fn bpf(cmd: libc::c_long, attr: &mut [u8; 64]) -> i64 {
    // SAFETY: `attr` is a zeroed bpf_attr-sized buffer the kernel reads and writes
    // within its 64 bytes; the size is passed.
    unsafe { libc::syscall(libc::SYS_bpf, cmd, attr.as_mut_ptr(), attr.len() as u32) }
}

fn next_id(cmd: libc::c_long, start: u32) -> Option<u32> {
    let mut a = [0u8; 64];
    a[0..4].copy_from_slice(&start.to_ne_bytes());
    (bpf(cmd, &mut a) == 0).then(|| u32::from_ne_bytes([a[4], a[5], a[6], a[7]]))
}

fn fd_by_id(cmd: libc::c_long, id: u32) -> Option<i32> {
    let mut a = [0u8; 64];
    a[0..4].copy_from_slice(&id.to_ne_bytes());
    let fd = bpf(cmd, &mut a);
    (fd >= 0).then_some(fd as i32)
}

/// bpf_obj_get_info_by_fd into `info` (already holding any pointers to fill).
fn info(fd: i32, info: &mut [u8]) -> bool {
    let mut a = [0u8; 64];
    a[0..4].copy_from_slice(&(fd as u32).to_ne_bytes());
    a[4..8].copy_from_slice(&(info.len() as u32).to_ne_bytes());
    a[8..16].copy_from_slice(&(info.as_mut_ptr() as u64).to_ne_bytes());
    let r = bpf(BPF_OBJ_GET_INFO_BY_FD, &mut a);
    // SAFETY: closing the descriptor fd_by_id opened.
    unsafe { libc::close(fd) };
    r == 0
}

/// The ids of the programs and links `pid` holds open, from its descriptors' fdinfo
/// (a link's names its program too): what the checks look at, so that another
/// tracker's programs on the same kernel (the host) are not taken for this one's.
fn held_by(pid: u32) -> (Vec<u32>, Vec<u32>) {
    let (mut progs, mut links) = (Vec::new(), Vec::new());
    let dir = format!("/proc/{pid}/fdinfo");
    for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
        let Ok(text) = std::fs::read_to_string(e.path()) else {
            continue;
        };
        for l in text.lines() {
            let id = |k: &str| l.strip_prefix(k).and_then(|v| v.trim().parse::<u32>().ok());
            if let Some(id) = id("prog_id:") {
                progs.push(id);
            }
            if let Some(id) = id("link_id:") {
                links.push(id);
            }
        }
    }
    (progs, links)
}

/// (program id → name) of every program `pid` holds, and (program id → tracepoint)
/// of every raw tracepoint link it holds.
fn bpf_objects(pid: u32) -> (BTreeMap<u32, String>, BTreeMap<u32, String>) {
    let (held_progs, held_links) = held_by(pid);
    let mut progs = BTreeMap::new();
    let mut id = 0;
    while let Some(n) = next_id(BPF_PROG_GET_NEXT_ID, id) {
        id = n;
        if !held_progs.contains(&n) {
            continue;
        }
        let Some(fd) = fd_by_id(BPF_PROG_GET_FD_BY_ID, n) else {
            continue;
        };
        // bpf_prog_info: name[16] at byte 64.
        let mut buf = [0u8; 256];
        if info(fd, &mut buf) {
            let name = &buf[64..80];
            let end = name.iter().position(|&b| b == 0).unwrap_or(16);
            progs.insert(n, String::from_utf8_lossy(&name[..end]).into_owned());
        }
    }
    let mut links = BTreeMap::new();
    let mut id = 0;
    while let Some(n) = next_id(BPF_LINK_GET_NEXT_ID, id) {
        id = n;
        if !held_links.contains(&n) {
            continue;
        }
        let Some(fd) = fd_by_id(BPF_LINK_GET_FD_BY_ID, n) else {
            continue;
        };
        // bpf_link_info: type, id, prog_id, then raw_tracepoint { tp_name, tp_name_len }
        // at byte 16.
        let mut tp = [0u8; 64];
        let mut buf = [0u8; 64];
        buf[16..24].copy_from_slice(&(tp.as_mut_ptr() as u64).to_ne_bytes());
        buf[24..28].copy_from_slice(&(tp.len() as u32).to_ne_bytes());
        if info(fd, &mut buf) {
            let ty = u32::from_ne_bytes([buf[0], buf[1], buf[2], buf[3]]);
            let prog = u32::from_ne_bytes([buf[8], buf[9], buf[10], buf[11]]);
            if ty == BPF_LINK_TYPE_RAW_TRACEPOINT {
                let end = tp.iter().position(|&b| b == 0).unwrap_or(tp.len());
                links.insert(prog, String::from_utf8_lossy(&tp[..end]).into_owned());
            }
        }
    }
    (progs, links)
}

/// Waits (up to `limit`, or while `alive`) until `pid` holds every program of `want`
/// loaded and, where a tracepoint is given, attached to it; one cell per program.
/// The kernel keeps 15 bytes of a program's name.
fn programs_cells(
    pid: u32,
    prefix: &str,
    want: &[(&str, Option<&str>)],
    limit: Duration,
    alive: &mut dyn FnMut() -> bool,
) -> Vec<Cell> {
    let t0 = Instant::now();
    loop {
        let (progs, links) = bpf_objects(pid);
        let state: Vec<(String, Option<&str>, bool, Option<String>)> = want
            .iter()
            .map(|(name, tp)| {
                let short = &name[..name.len().min(15)];
                let ids: Vec<u32> = progs
                    .iter()
                    .filter(|(_, n)| *n == short)
                    .map(|(id, _)| *id)
                    .collect();
                let attached = match tp {
                    Some(tp) => ids
                        .iter()
                        .filter_map(|id| links.get(id))
                        .find(|at| at == tp)
                        .or_else(|| ids.iter().find_map(|id| links.get(id)))
                        .cloned(),
                    None => None,
                };
                (name.to_string(), *tp, !ids.is_empty(), attached)
            })
            .collect();
        let done = state
            .iter()
            .all(|(_, tp, loaded, at)| *loaded && (tp.is_none() || at.as_deref() == *tp));
        if done || t0.elapsed() > limit || !alive() {
            return state
                .into_iter()
                .map(|(name, tp, loaded, at)| {
                    let check = format!("{prefix} {name}");
                    match (tp, loaded, at) {
                        (_, false, _) => bad(&check, "not loaded".into()),
                        (None, true, _) => ok(&check, "loaded (run by BPF_PROG_TEST_RUN)".into()),
                        (Some(tp), true, Some(at)) if at == tp => {
                            ok(&check, format!("loaded, attached to {at}"))
                        }
                        (Some(tp), true, at) => bad(
                            &check,
                            format!("loaded, not attached to {tp} (link: {at:?})"),
                        ),
                    }
                })
                .collect();
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

// ---------------------------------------------------------------------------------
// This kernel's BTF, read independently of the tracker's parser: which of the
// fields whose absence has a degraded name it has.

struct BtfFacts {
    on_cpu: bool,
    ioac: bool,
    exit_args: Option<usize>,
}

/// One BTF type: (kind, name, size or type, members as (name, type)).
type BtfType = (u32, String, u32, Vec<(String, u32)>);

fn btf_facts(path: &Path) -> Result<BtfFacts, String> {
    let d = std::fs::read(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let u32_at = |at: usize| -> Result<u32, String> {
        d.get(at..at + 4)
            .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .ok_or_else(|| format!("{}: truncated at byte {at}", path.display()))
    };
    if d.get(0..2) != Some(&[0x9f, 0xeb]) {
        return Err(format!("{}: not little-endian BTF", path.display()));
    }
    let hdr = u32_at(4)? as usize;
    let (toff, tlen, soff) = (
        hdr + u32_at(8)? as usize,
        u32_at(12)? as usize,
        hdr + u32_at(16)? as usize,
    );
    let name = |off: u32| -> String {
        let s = &d[(soff + off as usize).min(d.len())..];
        let end = s.iter().position(|&b| b == 0).unwrap_or(s.len());
        String::from_utf8_lossy(&s[..end]).into_owned()
    };
    let mut types: Vec<BtfType> = vec![(0, String::new(), 0, vec![])];
    let mut at = toff;
    while at < toff + tlen {
        let (name_off, info, st) = (u32_at(at)?, u32_at(at + 4)?, u32_at(at + 8)?);
        let (kind, vlen) = ((info >> 24) & 0x1f, (info & 0xffff) as usize);
        at += 12;
        let mut members = Vec::new();
        let extra = match kind {
            1 | 14 | 17 => 4,
            3 => 12,
            4 | 5 => {
                for i in 0..vlen {
                    members.push((name(u32_at(at + 12 * i)?), u32_at(at + 12 * i + 4)?));
                }
                12 * vlen
            }
            6 => 8 * vlen,
            13 => {
                for i in 0..vlen {
                    members.push((name(u32_at(at + 8 * i)?), u32_at(at + 8 * i + 4)?));
                }
                8 * vlen
            }
            15 | 19 => 12 * vlen,
            2 | 7..=12 | 16 | 18 => 0,
            k => return Err(format!("{}: unknown BTF kind {k}", path.display())),
        };
        at += extra;
        types.push((kind, name(name_off), st, members));
    }
    let strukt = |n: &str| types.iter().find(|t| t.0 == 4 && t.1 == n);
    let has = |s: Option<&BtfType>, m: &str| s.is_some_and(|s| s.3.iter().any(|(x, _)| x == m));
    let task = strukt("task_struct");
    let io = strukt("task_io_accounting");
    let ioac = has(task, "ioac")
        && ["rchar", "wchar", "read_bytes", "write_bytes"]
            .iter()
            .all(|m| has(io, m));
    // typedef btf_trace_sched_process_exit → pointer → prototype (ctx, args…)
    let exit_args = types
        .iter()
        .find(|t| t.0 == 8 && t.1 == "btf_trace_sched_process_exit")
        .and_then(|t| types.get(t.2 as usize))
        .filter(|p| p.0 == 2)
        .and_then(|p| types.get(p.2 as usize))
        .filter(|f| f.0 == 13)
        .map(|f| f.3.len().saturating_sub(1));
    Ok(BtfFacts {
        on_cpu: has(task, "on_cpu"),
        ioac,
        exit_args,
    })
}

// ---------------------------------------------------------------------------------
// The checks.

fn cpu_figures(t: &Tracked) -> (f64, String) {
    let r = cpu_ratio(t);
    let got = f(&t.summary, "cpu_user_secs") + f(&t.summary, "cpu_system_secs");
    (
        (r - 1.0).abs(),
        format!(
            "CPU {got:.4} s vs cgroup {:.4}–{:.4} s ({:+.3} %)",
            t.truth_ns as f64 / 1e9,
            t.truth_hi_ns as f64 / 1e9,
            100.0 * (r - 1.0)
        ),
    )
}

/// A tracked shape: CPU within the bound, `counts` exact, per-interval sums add up.
fn shape(check: &str, t: Tracked, counts: &[(&str, u64)], io: bool) -> Cell {
    let mut errs = Vec::new();
    if t.code != 0 {
        errs.push(format!("exit code {}: {}", t.code, t.stderr.trim()));
    }
    if t.summary["backend"] != "ebpf" {
        errs.push(format!("backend {}", t.summary["backend"]));
    }
    if t.summary["cpu_source"] != "ebpf" {
        errs.push(format!(
            "cpu_source {} (the engine's own sums were wanted)",
            t.summary["cpu_source"]
        ));
    }
    let (err, mut figs) = cpu_figures(&t);
    // As the host's harness (`truth::assert_exact_secs`): members the tracker names
    // as freed unread count with their figures at exit, and the claim it makes of
    // them is what is checked then.
    let unread = truth::unread_members(&t.summary);
    if err >= CPU_TOLERANCE && unread > 0 {
        let got = f(&t.summary, "cpu_user_secs") + f(&t.summary, "cpu_system_secs");
        let (lo, hi) = (t.truth_ns as f64 / 1e9, t.truth_hi_ns as f64 / 1e9);
        let allowed = truth::unread_allowance_secs(&t.summary) + lo * CPU_TOLERANCE;
        figs.push_str(&format!(
            ", {unread} freed unread: {:.2} ms short, {:.2} ms allowed",
            (lo - got) * 1e3,
            allowed * 1e3
        ));
        if got > hi * (1.0 + CPU_TOLERANCE) || lo - got > allowed {
            errs.push(format!("CPU off by {:.3} %", 100.0 * err));
        }
    } else if err >= CPU_TOLERANCE {
        errs.push(format!("CPU off by {:.3} %", 100.0 * err));
    }
    for (k, want) in counts {
        let got = t.summary[*k].as_u64();
        figs.push_str(&format!(
            ", {k} {}",
            got.map_or("-".into(), |g| g.to_string())
        ));
        if got != Some(*want) {
            errs.push(format!("{k} {got:?}, want {want}"));
        }
    }
    // What the tracker itself says it missed, when it says so.
    for k in ["untracked_tasks", "lost_events"] {
        if let Some(n) = t.summary[k].as_u64().filter(|n| *n > 0) {
            figs.push_str(&format!(", {k} {n}"));
        }
    }
    if let Some(d) = t.summary["degraded"].as_array().filter(|d| !d.is_empty()) {
        let names: Vec<&str> = d.iter().filter_map(|x| x["name"].as_str()).collect();
        figs.push_str(&format!(", degraded [{}]", names.join(", ")));
        // What the kernel skipped, per copy, and what was found again: the
        // figures docs/engine.md gives for preemptible tracepoints.
        if let Some(m) = d.iter().find(|x| x["name"] == "missed_runs") {
            figs.push_str(&format!(" ({})", missed_runs_figures(&m["detail"])));
        }
    }
    if io {
        let got = t.summary["write_bytes"].as_u64().unwrap_or(0) as f64;
        let truth = t.truth_io.1 as f64;
        let r = if truth > 0.0 { got / truth } else { 0.0 };
        figs.push_str(&format!(
            ", written {got} B vs cgroup {truth} B ({:+.3} %)",
            100.0 * (r - 1.0)
        ));
        if truth <= 0.0 || (r - 1.0).abs() >= IO_TOLERANCE {
            errs.push("write_bytes outside 1 % of io.stat".into());
        }
    }
    if let Err(p) = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| check_adds_up(&t))) {
        errs.push(format!("intervals do not add up: {}", panic_text(&p)));
    }
    if errs.is_empty() {
        ok(check, figs)
    } else {
        bad(check, format!("{}; {figs}", errs.join("; ")))
    }
}

/// The numbers of a `missed_runs` detail: runs skipped per copy, members found
/// after a skipped fork, process ends counted after a skipped exit.
fn missed_runs_figures(detail: &Value) -> String {
    let text = detail.as_str().unwrap_or("");
    // The number just before `phrase`.
    let count = |phrase: &str| {
        let (before, _) = text.split_once(phrase)?;
        before.split_whitespace().last().map(str::to_string)
    };
    let mut parts = Vec::new();
    if let Some((_, rest)) = text.split_once("runs skipped per copy:") {
        parts.push(format!(
            "skipped {}",
            rest.split(')').next().unwrap_or("").trim()
        ));
    }
    for (phrase, what) in [
        (
            " member(s) whose fork was skipped",
            "found after their fork",
        ),
        (" process end(s) whose exit", "ends after their exit"),
        (" exec(s) that were skipped", "execs at exit"),
    ] {
        if let Some(n) = count(phrase) {
            parts.push(format!("{n} {what}"));
        }
    }
    parts.join("; ")
}

/// Whether the release string `release` ("7.2.13+deb14-cloud-amd64") is at least
/// `major.minor`.
fn kernel_at_least(release: &str, major: u32, minor: u32) -> bool {
    let mut it = release
        .trim()
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let (a, b) = (it.next().unwrap_or(0), it.next().unwrap_or(0));
    (a, b) >= (major, minor)
}

fn run_programs() -> Vec<Cell> {
    let s = Scratch::new("progs");
    let sum = s.path("summary.json");
    let mut c = Command::new(tracker());
    c.args(["run", "-q", "--summary"])
        .arg(&sum)
        .arg("--")
        .arg(workload())
        .args(["sleepers", "1", "4"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let mut child = match c.spawn() {
        Ok(ch) => ch,
        Err(e) => {
            return vec![bad(
                "run programs",
                format!("cannot start the tracker: {e}"),
            )]
        }
    };
    let pid = child.id();
    // The second copies are for kernels whose tracepoints are preemptible (6.19
    // on); before that they would only cost the host.
    let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
    let preemptible = kernel_at_least(&release, 6, 19);
    let copies = [
        ("again_fork", Some("sched_process_fork")),
        ("again_exec", Some("sched_process_exec")),
        ("again_exit", Some("sched_process_exit")),
        ("again_free", Some("sched_process_free")),
    ];
    let mut want = vec![
        ("sched_process_fork", Some("sched_process_fork")),
        ("sched_process_exec", Some("sched_process_exec")),
        ("sched_process_exit", Some("sched_process_exit")),
        ("sched_process_free", Some("sched_process_free")),
        ("probe", None),
    ];
    if preemptible {
        want.extend(copies);
    }
    let mut cells = {
        let mut alive = || matches!(child.try_wait(), Ok(None));
        programs_cells(pid, "run", &want, Duration::from_secs(30), &mut alive)
    };
    if !preemptible {
        let (progs, _) = bpf_objects(pid);
        for (name, _) in copies {
            let check = format!("run {name}");
            cells.push(if progs.values().any(|n| n == name) {
                bad(&check, format!("loaded on {}, before 6.19", release.trim()))
            } else {
                ok(
                    &check,
                    "not loaded: tracepoints not preemptible before 6.19".into(),
                )
            });
        }
    }
    let out = child.wait_with_output();
    let summary = std::fs::read_to_string(&sum).unwrap_or_default();
    let v: Value = serde_json::from_str(&summary).unwrap_or(Value::Null);
    let err = out
        .map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
        .unwrap_or_default();
    cells.push(if v["backend"] == "ebpf" {
        ok("run backend", "ebpf".into())
    } else {
        bad(
            "run backend",
            format!("backend {}: {}", v["backend"], err.trim()),
        )
    });
    cells
}

/// A workload mode (or with `shell` one `sh -c` script) tracked with the tracker in
/// a cgroup that may have no children: it cannot make one for the command, so its
/// CPU is the backend's own sums (`cpu_source` ebpf or procfs), what this kernel's
/// programs or /proc give, held to the truth cgroup.
fn track(tag: &str, extra: &[&str], cmd: &[&str], shell: bool) -> Tracked {
    truth::track_with(&truth::Opts {
        tag,
        extra,
        cmd,
        shell,
        backend_sums: true,
        ..truth::Opts::default()
    })
}

fn swarm() -> Cell {
    let t = track("swarm", &[], &["swarm", "120", "3000", "2", "fork"], false);
    shape(
        "shape swarm",
        t,
        &[("processes_spawned", 121), ("processes_exited", 121)],
        false,
    )
}

fn swarm_exec() -> Cell {
    let t = track("swexec", &[], &["swarm", "60", "3000", "2", "exec"], false);
    shape(
        "shape swarm exec",
        t,
        // The tracker's exec of `workload incgroup`, its exec of the mode, 60 children.
        &[
            ("processes_spawned", 61),
            ("processes_exited", 61),
            ("execs", 62),
        ],
        false,
    )
}

fn orphans() -> Cell {
    let t = track("orphans", &[], &["orphans", "100", "2", "300"], false);
    shape(
        "shape orphans of init",
        t,
        &[("processes_spawned", 201), ("processes_exited", 201)],
        false,
    )
}

fn nested_shells() -> Cell {
    let script = "sh -c 'sh -c \"sh -c \\\"dd if=/dev/zero of=f bs=1M count=32 oflag=direct 2>/dev/null\\\"\"'";
    let t = track("nest", &[], &[script], true);
    shape("shape nested-shell O_DIRECT", t, &[], true)
}

fn threads() -> Cell {
    let t = track("threads", &[], &["burner", "2", "600"], false);
    shape(
        "shape threads",
        t,
        &[("threads_spawned", 2), ("processes_spawned", 1)],
        false,
    )
}

fn thread_exec() -> Cell {
    let t = track("texec", &[], &["threadexec", "150000"], false);
    shape(
        "shape exec from a thread",
        t,
        &[
            ("processes_spawned", 1),
            ("processes_exited", 1),
            ("execs", 3),
        ],
        false,
    )
}

fn vfork() -> Cell {
    let t = track("vfork", &[], &["vfork", "60", "2000"], false);
    shape(
        "shape vfork",
        t,
        &[("processes_spawned", 61), ("processes_exited", 61)],
        false,
    )
}

/// The host's procfs bound (tests/tests/engine.rs): tick resolution bounds the
/// error, against the truth's window `lo..=hi` (the root's join of the cgroup falls
/// in between: a guest starved by its host can charge that one write a long stall).
fn procfs_within(got: f64, lo: f64, hi: f64) -> bool {
    got <= hi * 1.02 + 0.02 && got >= lo * 0.9
}

/// `got` against the window `lo..=hi`: the figures and the error to its nearer end.
fn procfs_figs(got: f64, lo: f64, hi: f64) -> String {
    let err = if got < lo {
        got / lo - 1.0
    } else if got > hi {
        got / hi - 1.0
    } else {
        0.0
    };
    format!(
        "CPU {got:.4} s vs cgroup {lo:.4}–{hi:.4} s ({:+.2} %)",
        100.0 * err
    )
}

fn procfs_no_ebpf() -> Cell {
    let t = track(
        "noebpf",
        &["--no-ebpf"],
        &["swarm", "20", "20000", "2", "fork"],
        false,
    );
    let (lo, hi) = (t.truth_ns as f64 / 1e9, t.truth_hi_ns as f64 / 1e9);
    let got = f(&t.summary, "cpu_total_secs");
    let figs = format!(
        "backend {}, {}",
        t.summary["backend"],
        procfs_figs(got, lo, hi)
    );
    if t.code == 0
        && t.summary["backend"] == "procfs"
        && t.summary["cpu_source"] == "procfs"
        && procfs_within(got, lo, hi)
    {
        ok("procfs --no-ebpf", figs)
    } else {
        bad("procfs --no-ebpf", format!("exit {}; {figs}", t.code))
    }
}

/// `--pid` on a tree of idle processes that no program will meet: the attach's
/// task walk (an `iter/task` program, loaded only here) finds every registered
/// thread, so the probe reads them in the kernel. Where the walk cannot load they
/// stay on /proc, exact and dearer; this cell names that.
fn attach_walk() -> Cell {
    const CHECK: &str = "attach task walk";
    const KIDS: usize = 20;
    let s = Scratch::new("kc-walk");
    let mut work = Command::new(workload());
    work.args(["sleepers", &KIDS.to_string(), "60"])
        .stdout(Stdio::null())
        .process_group(0);
    let work = match work.spawn() {
        Ok(w) => w,
        Err(e) => return bad(CHECK, format!("workload: {e}")),
    };
    let root = work.id();
    // SAFETY: killpg(2) has no memory preconditions; the group is the workload's.
    let end = || unsafe { libc::killpg(root as i32, libc::SIGKILL) };
    let kids = || {
        std::fs::read_to_string(format!("/proc/{root}/task/{root}/children"))
            .map(|c| c.split_whitespace().count())
            .unwrap_or(0)
    };
    let t0 = Instant::now();
    while kids() < KIDS && t0.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(50));
    }
    let out = s.path("samples.jsonl");
    let err = s.path("stderr");
    let tr = std::fs::File::create(&err).and_then(|e| {
        Command::new(tracker())
            .env("RUST_LOG", "debug")
            .args(["-q", "-i", "0.5", "--pid", &root.to_string(), "-o"])
            .arg(&out)
            .stderr(e)
            .spawn()
    });
    let mut tr = match tr {
        Ok(t) => t,
        Err(e) => {
            end();
            return bad(CHECK, format!("tracker: {e}"));
        }
    };
    let t0 = Instant::now();
    let lines = || std::fs::read_to_string(&out).map_or(0, |o| o.lines().count());
    while lines() < 2 && t0.elapsed() < Duration::from_secs(60) {
        std::thread::sleep(Duration::from_millis(50));
    }
    // SAFETY: kill(2) has no memory preconditions; the tracker is our child.
    unsafe { libc::kill(tr.id() as i32, libc::SIGTERM) };
    let code = tr.wait().ok().and_then(|st| st.code());
    end();
    let text = std::fs::read_to_string(&err).unwrap_or_default();
    let said = text
        .lines()
        .find(|l| l.contains("the task walk found") || l.contains("members stay on /proc"))
        .map(|l| l.split("] ").nth(1).unwrap_or(l).to_string());
    let want = format!("the task walk found {n} of {n} ", n = KIDS + 1);
    match said {
        Some(l) if code == Some(0) && l.contains(&want) => ok(CHECK, l),
        Some(l) => bad(CHECK, format!("exit {code:?}; {l}")),
        None => bad(
            CHECK,
            format!("exit {code:?}; the attach said nothing of the walk"),
        ),
    }
}

/// As an unprivileged user BPF is refused: the run goes on with procfs and names
/// why. The tracker starts in a cgroup delegated to that user, the workload moves to
/// a child of it, whose CPU is the truth (v1 cpuacct where the host has it, as the
/// truth harness does, else v2).
fn procfs_unprivileged() -> Cell {
    const NOBODY: u32 = 65534;
    let check = "procfs unprivileged";
    let v1 = Path::new("/sys/fs/cgroup/cpuacct/cpuacct.usage").exists();
    let root = if v1 {
        "/sys/fs/cgroup/cpuacct"
    } else {
        "/sys/fs/cgroup"
    };
    let base = PathBuf::from(format!("{root}/rt-unpriv-{}", std::process::id()));
    let inner = base.join("w");
    let s = Scratch::new("unpriv");
    if let Err(e) = delegate(&base, &inner, &s, NOBODY) {
        return bad(check, format!("cannot delegate {}: {e}", base.display()));
    }
    // The user must reach the binaries: a checkout may sit under a directory only
    // root can enter (a CI clone under `mktemp -d`), so copies in a directory of
    // the scratch are run.
    let bins = s.path("bin");
    let (tracker_bin, workload_bin) = match copy_binaries(&bins) {
        Ok(b) => b,
        Err(e) => {
            return bad(
                check,
                format!("cannot copy the binaries to {}: {e}", bins.display()),
            )
        }
    };
    let procs = CString::new(format!("{}/cgroup.procs", base.display())).unwrap_or_default();
    let (sum, pre) = (s.path("summary.json"), s.path("pre"));
    let mut c = Command::new(&tracker_bin);
    c.args(["run", "-q", "--summary"])
        .arg(&sum)
        .arg("--")
        .arg(&workload_bin)
        .arg("incgroup")
        .arg(&inner)
        .arg("--pre")
        .arg(&pre)
        .arg("--")
        .arg(&workload_bin)
        .args(["burner", "1", "400"])
        .current_dir(&s.0)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    in_cgroup_as(&mut c, procs, NOBODY);
    let o = c.output();
    let usage_ns = cgroup_usage_ns(&inner, v1);
    let window: Vec<u64> = std::fs::read_to_string(&pre)
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|v| v.parse().ok())
        .collect();
    let _ = std::fs::remove_dir(&inner);
    let _ = std::fs::remove_dir(&base);
    let o = match o {
        Ok(o) => o,
        Err(e) => return bad(check, format!("cannot run the tracker as {NOBODY}: {e}")),
    };
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    let v: Value = std::fs::read_to_string(&sum)
        .ok()
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or(Value::Null);
    let Some(&[before, after]) = window.get(..2) else {
        return bad(check, format!("the pre-join CPU window {window:?}"));
    };
    let (lo, hi) = (
        (usage_ns + before) as f64 / 1e9,
        (usage_ns + after) as f64 / 1e9,
    );
    let got = v["cpu_total_secs"].as_f64().unwrap_or(-1.0);
    let named = v["degraded"][0]["name"].as_str().unwrap_or("").to_string();
    let figs = format!(
        "backend {}, degraded {named}, cpu_source {}, {}",
        v["backend"],
        v["cpu_source"],
        procfs_figs(got, lo, hi)
    );
    if o.status.success()
        && v["backend"] == "procfs"
        && v["cpu_source"] == "procfs"
        && named == "ebpf_no_privilege"
        && procfs_within(got, lo, hi)
    {
        ok(check, figs)
    } else {
        bad(check, format!("{}; {figs}; {}", o.status, err.trim()))
    }
}

/// `base` and its child `inner` made, with their `cgroup.procs` and the scratch
/// directory given to `uid`: the user may move processes in but not make cgroups
/// (`base` stays root's), so the tracker cannot make one for the command and its
/// CPU is the procfs backend's own sums.
fn delegate(base: &Path, inner: &Path, s: &Scratch, uid: u32) -> std::io::Result<()> {
    std::fs::create_dir_all(inner)?;
    for p in [
        &s.0,
        &base.join("cgroup.procs"),
        &inner.to_path_buf(),
        &inner.join("cgroup.procs"),
    ] {
        std::os::unix::fs::chown(p, Some(uid), Some(uid))?;
    }
    Ok(())
}

/// Copies of the tracker and the workload in `bins` (made here).
fn copy_binaries(bins: &Path) -> std::io::Result<(PathBuf, PathBuf)> {
    std::fs::create_dir(bins)?;
    let (t, w) = (bins.join("resource-tracker"), bins.join("workload"));
    std::fs::copy(tracker(), &t)?;
    std::fs::copy(workload(), &w)?;
    Ok((t, w))
}

/// `c` starts in the cgroup whose `cgroup.procs` is `procs`, then as `uid` (and
/// its group) with no supplementary groups.
fn in_cgroup_as(c: &mut Command, procs: CString, uid: u32) {
    // SAFETY: only async-signal-safe calls between fork and exec: open, write,
    // close, setgroups, setgid, setuid.
    unsafe {
        c.pre_exec(move || {
            let fd = libc::open(procs.as_ptr(), libc::O_WRONLY);
            if fd < 0 || libc::write(fd, b"0".as_ptr().cast(), 1) != 1 {
                return Err(std::io::Error::last_os_error());
            }
            libc::close(fd);
            if libc::setgroups(0, std::ptr::null()) != 0
                || libc::setgid(uid) != 0
                || libc::setuid(uid) != 0
            {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
}

/// The CPU a cgroup was charged, ns: v1 `cpuacct.usage`, else v2 `usage_usec`;
/// 0 where it cannot be read.
fn cgroup_usage_ns(dir: &Path, v1: bool) -> u64 {
    if v1 {
        std::fs::read_to_string(dir.join("cpuacct.usage"))
            .ok()
            .and_then(|s| s.trim().parse::<u64>().ok())
    } else {
        std::fs::read_to_string(dir.join("cpu.stat"))
            .ok()
            .and_then(|s| {
                s.lines()
                    .find_map(|l| l.strip_prefix("usage_usec "))
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .map(|us| us * 1000)
            })
    }
    .unwrap_or(0)
}

/// The degraded names of a run equal those this kernel's BTF calls for.
fn degraded_names() -> Cell {
    let check = "degraded vs BTF";
    let facts = match btf_facts(Path::new("/sys/kernel/btf/vmlinux")) {
        Ok(f) => f,
        Err(e) => return bad(check, e),
    };
    let mut want = Vec::new();
    if !facts.ioac {
        want.push("no_task_io");
    }
    if !facts.on_cpu {
        want.push("no_on_cpu");
    }
    if facts.exit_args.unwrap_or(0) < 2 {
        want.push("no_group_dead");
    }
    let s = Scratch::new("degr");
    let sum = s.path("summary.json");
    let o = Command::new(tracker())
        .args(["run", "-q", "--summary"])
        .arg(&sum)
        .args(["--", "/bin/true"])
        .output();
    let v = std::fs::read_to_string(&sum)
        .ok()
        .and_then(|t| serde_json::from_str::<Value>(&t).ok())
        .unwrap_or(Value::Null);
    let mut got: Vec<String> = v["degraded"]
        .as_array()
        .map(|a| {
            a.iter()
                .filter_map(|d| d["name"].as_str().map(String::from))
                .filter(|n| ["no_task_io", "no_on_cpu", "no_group_dead"].contains(&n.as_str()))
                .collect()
        })
        .unwrap_or_default();
    got.sort();
    want.sort_unstable();
    let figs = format!(
        "BTF: task_struct.on_cpu {}, ioac {}, sched_process_exit args {}; named [{}]",
        if facts.on_cpu { "yes" } else { "no" },
        if facts.ioac { "yes" } else { "no" },
        facts.exit_args.map_or("?".into(), |n| n.to_string()),
        got.join(", ")
    );
    let ran = o.as_ref().is_ok_and(|o| o.status.success()) && v["backend"] == "ebpf";
    if ran && got == want {
        ok(check, figs)
    } else {
        bad(
            check,
            format!(
                "want [{}], backend {}; {figs}",
                want.join(", "),
                v["backend"]
            ),
        )
    }
}

fn get(port: u16, path: &str) -> Option<String> {
    let mut s = std::net::TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(20))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    out.contains(" 200 ")
        .then(|| out.split_once("\r\n\r\n").map(|b| b.1.to_string()))
        .flatten()
}

/// The node agent's CPU series of a container (its own names).
const CPU_SERIES: &str = "resource_tracker_container_cpu_usage_seconds_total{";

/// The node agent: its programs loaded and attached, and a container's exported CPU
/// against the container's cgroup.
fn node() -> Vec<Cell> {
    let s = Scratch::new("node");
    let port = free_port();
    let err = s.path("node.err");
    let Ok(err_file) = std::fs::File::create(&err) else {
        return vec![bad(
            "node agent",
            format!("cannot create {}", err.display()),
        )];
    };
    let mut child = match Command::new(tracker())
        .args([
            "node",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "-i",
            "0.5",
            "-o",
        ])
        .arg(s.path("node.jsonl"))
        .stdout(Stdio::null())
        .stderr(err_file)
        .spawn()
    {
        Ok(c) => c,
        Err(e) => return vec![bad("node agent", format!("cannot start: {e}"))],
    };
    let pid = child.id();
    let mut cells = {
        let mut alive = || matches!(child.try_wait(), Ok(None));
        programs_cells(
            pid,
            "node",
            &[
                ("node_fork", Some("sched_process_fork")),
                ("node_exec", Some("sched_process_exec")),
                ("node_exit", Some("sched_process_exit")),
                ("node_free", Some("sched_process_free")),
                ("node_oom", Some("mark_victim")),
            ],
            Duration::from_secs(30),
            &mut alive,
        )
    };
    let t0 = Instant::now();
    while get(port, "/healthz").is_none() && t0.elapsed() < Duration::from_secs(30) {
        std::thread::sleep(Duration::from_millis(100));
    }
    let uid = "6a1f0c8e-2b3d-4e5f-9a0b-1c2d3e4f5a6b";
    let id = "01".repeat(32);
    let label = format!("pod_uid=\"{uid}\",container_id=\"{id}\"");
    let cell = std::panic::catch_unwind(|| {
        let c = FakeContainer::new(&format!("kubepods/burstable/pod{uid}/{id}"));
        c.run(&["burner", "2", "600"]);
        let truth = c.cpu_secs();
        // Readings every 0.5 s: three more, so the last one follows the workload.
        std::thread::sleep(Duration::from_millis(2000));
        let text = get(port, "/metrics").unwrap_or_default();
        let got = text
            .lines()
            .filter(|l| l.starts_with(CPU_SERIES) && l.contains(&label))
            .find_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok());
        (got, truth)
    });
    let procs = std::panic::catch_unwind(|| node_processes(port));
    // SAFETY: signalling the agent this check started.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let st = child.wait();
    let log = std::fs::read_to_string(&err).unwrap_or_default();
    cells.push(match procs {
        Ok(c) => c,
        Err(p) => bad("node container processes", panic_text(&p)),
    });
    cells.push(match cell {
        Ok((Some(got), truth)) => {
            let figs = format!(
                "exported {got:.4} s vs cgroup {truth:.4} s ({:+.3} %)",
                100.0 * (got / truth - 1.0)
            );
            if (got / truth - 1.0).abs() < CPU_TOLERANCE {
                ok("node container CPU", figs)
            } else {
                bad("node container CPU", figs)
            }
        }
        Ok((None, truth)) => bad(
            "node container CPU",
            format!(
                "no CPU series for the container (cgroup {truth:.4} s); agent: {}",
                log.trim()
            ),
        ),
        Err(p) => bad("node container CPU", panic_text(&p)),
    });
    if !st.as_ref().is_ok_and(|s| s.success()) {
        cells.push(bad("node exit", format!("{st:?}: {}", log.trim())));
    }
    cells
}

/// The value of the first series of `metric` (its `_total` sample) whose labels
/// hold `label`, from an exposition.
fn metric(text: &str, metric: &str, label: &str) -> Option<f64> {
    text.lines()
        .filter(|l| {
            l.strip_prefix(metric)
                .is_some_and(|r| r.starts_with('{') || r.starts_with(' '))
                && l.contains(label)
        })
        .find_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
}

/// The node agent's process counts for a container under fork churn (300 children
/// forked four at a time, and the swarm itself): exact, or short by no more than the
/// runs of that program the kernel says it skipped (any task's on the host).
fn node_processes(port: u16) -> Cell {
    const CHECK: &str = "node container processes";
    let uid = "7b2e1d9f-3c4e-4f60-8b1c-2d3e4f5a6b7c";
    let id = "02".repeat(32);
    let c = FakeContainer::new(&format!("kubepods/besteffort/pod{uid}/{id}"));
    // Two of the agent's 0.5 s scans: the container is matched before it forks.
    std::thread::sleep(Duration::from_millis(1000));
    if !c.run(&["swarm", "300", "200", "4", "fork"]).success() {
        return bad(CHECK, "the swarm failed".into());
    }
    std::thread::sleep(Duration::from_millis(1500));
    let text = get(port, "/metrics").unwrap_or_default();
    let label = format!("container_id=\"{id}\"");
    let at = |m: &str| metric(&text, m, &label);
    let skipped = |tp: &str| {
        metric(
            &text,
            "resource_tracker_skipped_runs_total",
            &format!("tracepoint=\"{tp}\""),
        )
    };
    let (Some(spawned), Some(exited), Some(execs)) = (
        at("resource_tracker_container_processes_spawned_total"),
        at("resource_tracker_container_processes_exited_total"),
        at("resource_tracker_container_execs_total"),
    ) else {
        return bad(
            CHECK,
            format!("no process series for the container: {text}"),
        );
    };
    let (Some(sf), Some(sx), Some(se), Some(lost)) = (
        skipped("sched_process_fork"),
        skipped("sched_process_exit"),
        skipped("sched_process_exec"),
        metric(&text, "resource_tracker_lost_events_total", ""),
    ) else {
        return bad(CHECK, "no skipped-runs or lost-events series".into());
    };
    // The swarm's 300 children and itself (exec'd into the container).
    let within = |got: f64, want: f64, skips: f64| got <= want && got >= want - skips;
    let figs = format!(
        "spawned {spawned} of 300, exited {exited} of 301, execs {execs} of 1; \
         skipped fork {sf}, exit {sx}, exec {se}; lost {lost}"
    );
    let full = lost
        - text
            .lines()
            .filter(|l| l.starts_with("resource_tracker_skipped_runs_total{"))
            .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
            .sum::<f64>();
    if within(spawned, 300.0, sf)
        && within(exited, 301.0, sx)
        && within(execs, 1.0, se)
        && full == 0.0
    {
        ok(CHECK, figs)
    } else {
        bad(CHECK, figs)
    }
}

fn panic_text(p: &Box<dyn std::any::Any + Send>) -> String {
    p.downcast_ref::<String>()
        .cloned()
        .or_else(|| p.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "panicked".into())
        .replace(['\n', '\t'], " ")
}

fn main() {
    // Panics inside a check become its FAIL line; the default hook's report would
    // only interleave with the console's lines.
    std::panic::set_hook(Box::new(|_| {}));
    let only: Vec<String> = std::env::args().skip(1).collect();
    type Check = (&'static str, fn() -> Vec<Cell>);
    let checks: [Check; 13] = [
        ("run programs", run_programs),
        ("node", node),
        ("shape swarm", || vec![swarm()]),
        ("shape swarm exec", || vec![swarm_exec()]),
        ("shape orphans of init", || vec![orphans()]),
        ("shape nested-shell O_DIRECT", || vec![nested_shells()]),
        ("shape threads", || vec![threads()]),
        ("shape exec from a thread", || vec![thread_exec()]),
        ("shape vfork", || vec![vfork()]),
        ("attach task walk", || vec![attach_walk()]),
        ("procfs --no-ebpf", || vec![procfs_no_ebpf()]),
        ("procfs unprivileged", || vec![procfs_unprivileged()]),
        ("degraded vs BTF", || vec![degraded_names()]),
    ];
    // A name that matches no check is a mistake, not a pass.
    if let Some(o) = only
        .iter()
        .find(|o| !checks.iter().any(|(name, _)| name.contains(o.as_str())))
    {
        let names: Vec<&str> = checks.iter().map(|(n, _)| *n).collect();
        println!("RT-CHECK	--only {o}	FAIL	no check is named so; the checks: {names:?}");
        println!("RT-DONE	1");
        let _ = std::io::stdout().flush();
        return;
    }
    let mut failed = 0;
    for (name, check) in checks {
        if !only.is_empty() && !only.iter().any(|o| name.contains(o.as_str())) {
            continue;
        }
        let t0 = Instant::now();
        let cells =
            std::panic::catch_unwind(check).unwrap_or_else(|p| vec![bad(name, panic_text(&p))]);
        for c in cells {
            failed += usize::from(!c.ok);
            println!(
                "RT-CHECK\t{}\t{}\t{} [{:.1} s]",
                c.check,
                if c.ok { "ok" } else { "FAIL" },
                c.figures.replace(['\n', '\t'], " "),
                t0.elapsed().as_secs_f64()
            );
        }
        let _ = std::io::stdout().flush();
    }
    println!("RT-DONE\t{failed}");
    let _ = std::io::stdout().flush();
}
