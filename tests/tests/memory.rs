//! Memory against the kernel's own accounting of a cgroup that holds the workload,
//! on the shapes where a sum of RSS counts shared pages several times: 300 MiB
//! written once and read by three forked children, by four threads, and by three
//! exec'd children mapping it from an inherited memfd; 200 MiB that three forked
//! children read, then write (their copy-on-write breaks leave every RSS as it was). Both backends, each shape
//! five times; the worst run is the one that counts.
//!
//! Two ways to hold the truth, because the tracker's own cgroup for the command and
//! a truth cgroup the workload joins cannot both hold the workload:
//! - the tracker runs inside the truth cgroup (it joins before it execs), so the
//!   cgroup it makes for the command is a child of the truth: its figure
//!   (`memory_source` `cgroup`) is the workload's, the truth's peak is the
//!   workload's plus the tracker's own memory (heap, BPF maps), so ours may be
//!   below the truth by the tracker's share, never above it;
//! - the workload joins the truth cgroup itself (the harness's `incgroup`), leaving
//!   the cgroup the tracker made for it: the tracker sees a member outside and
//!   falls back to Σ PSS (`pss`), compared with a truth that holds exactly the
//!   workload.
//!
//! Then what must never happen: a cgroup left behind (normal end, a daemon that
//! outlives the root, SIGTERM to the tracker), and a cgroup that cannot be made
//! ending the run or going unsaid.

use std::{
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;
use tracker_tests::{
    e2e,
    truth::{f, track_with, Opts},
    *,
};

/// Peak memory within this fraction of the cgroup's, in every run.
const MEM_TOLERANCE: f64 = 0.15;
/// The recommendation's memory at most this many times the cgroup's peak.
const REC_LIMIT: f64 = 1.5;
const RUNS: usize = 5;

const SHAPES: [(&str, [&str; 5]); 4] = [
    ("fork", ["shared", "300", "3", "1200", "fork"]),
    // Σ PSS moves with no member's RSS moving: only their faults say so.
    ("cow", ["shared", "200", "3", "1200", "cow"]),
    ("threads", ["shared", "300", "4", "1200", "thread"]),
    ("exec", ["shared", "300", "3", "1200", "exec"]),
];

fn need_root() -> bool {
    e2e::require(e2e::is_root(), "root is needed to make cgroups")
}

/// Where `cg` keeps its memory accounting: the v1 memory hierarchy's directory of
/// the same name, else the v2 directory.
fn memory_dir(cg: &Cgroup) -> PathBuf {
    let v1 = Path::new("/sys/fs/cgroup/memory").join(cg.dir.file_name().expect("name"));
    if v1.exists() {
        v1
    } else {
        cg.dir.clone()
    }
}

/// Whether the memory controller is a v1 hierarchy here: the tracker can then make a
/// child of any memory cgroup it runs in (on v2 only where the parent delegates
/// `memory`, which a parent holding the tracker cannot).
fn v1_memory() -> bool {
    Path::new("/sys/fs/cgroup/memory/cgroup.procs").exists()
}

/// The cgroups the tracker made under `dir` (none may be left).
fn ours_under(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .map(|d| {
            d.flatten()
                .filter_map(|e| e.file_name().to_str().map(str::to_string))
                .filter(|n| n.starts_with("resource-tracker-"))
                .collect()
        })
        .unwrap_or_default()
}

struct MemRun {
    ours: f64,
    truth: f64,
    source: String,
    rec: f64,
    summary: Value,
    samples: Vec<Value>,
}

/// The tracker itself inside a fresh truth cgroup, running `shape`.
fn tracker_inside(tag: &str, extra: &[&str], shape: &[&str]) -> MemRun {
    let cg = Cgroup::new(tag);
    let s = Scratch::new(tag);
    let w = workload();
    let o = run(Command::new(&w)
        .arg("incgroup")
        .arg(cg.join_arg())
        .arg("--")
        .arg(tracker())
        .args(["run", "-q", "-i", "0.2", "--summary"])
        .arg(s.path("s.json"))
        .arg("-o")
        .arg(s.path("s.jsonl"))
        .args(extra)
        .arg("--")
        .arg(&w)
        .args(shape)
        .current_dir(&s.0));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let left = ours_under(&memory_dir(&cg));
    assert!(left.is_empty(), "cgroups left behind: {left:?}");
    let summary = read_json(&s.path("s.json"));
    MemRun {
        ours: f(&summary, "peak_memory_mib"),
        truth: cg.peak_memory().expect("the truth cgroup keeps a peak") as f64 / 1048576.0,
        source: summary["memory_source"].as_str().unwrap_or("").to_string(),
        rec: summary["recommendation"]["memory_mib"]
            .as_f64()
            .expect("a recommendation"),
        samples: read_jsonl(&s.path("s.jsonl")),
        summary,
    }
}

/// The workload joins the truth cgroup itself (the harness's runs).
fn workload_inside(tag: &str, extra: &[&str], shape: &[&str]) -> MemRun {
    let t = track_with(&Opts {
        tag,
        extra,
        cmd: shape,
        ..Opts::default()
    });
    assert_eq!(t.code, 0, "{}", t.stderr);
    MemRun {
        ours: f(&t.summary, "peak_memory_mib"),
        truth: t.truth_peak.expect("the truth cgroup keeps a peak") as f64 / 1048576.0,
        source: t.summary["memory_source"]
            .as_str()
            .unwrap_or("")
            .to_string(),
        rec: t.summary["recommendation"]["memory_mib"]
            .as_f64()
            .expect("a recommendation"),
        summary: t.summary,
        samples: t.samples,
    }
}

/// Every shape `RUNS` times with `one`; each run's source is `source`, its peak
/// within MEM_TOLERANCE of the truth (and, with `at_most_truth`, not above it),
/// its recommendation at most REC_LIMIT × the truth.
fn shapes(
    what: &str,
    backend: &str,
    source: &str,
    at_most_truth: bool,
    one: impl Fn(&str, &[&str], &[&str]) -> MemRun,
) {
    let extra: &[&str] = if backend == "procfs" {
        &["--no-ebpf"]
    } else {
        &[]
    };
    let mut failures = Vec::new();
    for (name, shape) in SHAPES {
        let (mut worst, mut worst_rec): (f64, f64) = (0.0, 0.0);
        for i in 0..RUNS {
            let r = one(&format!("mem{name}{i}"), extra, &shape);
            assert_eq!(r.summary["backend"], backend, "{}", r.summary);
            assert_eq!(r.source, source, "{what} {name}: {}", r.summary);
            assert!(
                r.samples
                    .iter()
                    .filter_map(|s| s["process"]["memory_source"].as_str())
                    .any(|s| s == source),
                "{what} {name}: the samples name {source}"
            );
            let ratio = r.ours / r.truth;
            eprintln!(
                "{what} {backend} {name} run {i}: {source} peak {:.1} MiB, cgroup {:.1} MiB ({:.1} %), Σ RSS {:.1} MiB, recommended {} MiB ({:.2}×)",
                r.ours,
                r.truth,
                100.0 * ratio,
                f(&r.summary, "peak_rss_sum_mib"),
                r.rec,
                r.rec / r.truth
            );
            worst = worst.max((ratio - 1.0).abs());
            worst_rec = worst_rec.max(r.rec / r.truth);
            if at_most_truth && ratio > 1.005 {
                failures.push(format!(
                    "{name} run {i}: {:.1} MiB above the cgroup holding it ({:.1})",
                    r.ours, r.truth
                ));
            }
        }
        eprintln!(
            "{what} {backend} {name}: worst of {RUNS}: {:.1} % off, recommendation {worst_rec:.2}× the peak",
            100.0 * worst
        );
        if worst > MEM_TOLERANCE {
            failures.push(format!("{name}: peak off by {:.1} %", 100.0 * worst));
        }
        if worst_rec > REC_LIMIT {
            failures.push(format!(
                "{name}: recommendation {worst_rec:.2}× the cgroup's peak"
            ));
        }
    }
    assert!(failures.is_empty(), "{what} {backend}: {failures:?}");
}

fn in_its_cgroup(backend: &str) {
    let source = if v1_memory() { "cgroup" } else { "pss" };
    shapes(
        "tracker inside the truth",
        backend,
        source,
        true,
        tracker_inside,
    );
}

fn left_its_cgroup(backend: &str) {
    shapes(
        "workload inside the truth",
        backend,
        "pss",
        false,
        workload_inside,
    );
}

#[test]
fn shared_pages_once_in_the_cgroup_ebpf() {
    if !need_root() || !ebpf_available() {
        return;
    }
    in_its_cgroup("ebpf");
}

#[test]
fn shared_pages_once_in_the_cgroup_procfs() {
    if !need_root() {
        return;
    }
    in_its_cgroup("procfs");
}

#[test]
fn shared_pages_once_in_pss_when_the_tree_leaves_its_cgroup_ebpf() {
    if !need_root() || !ebpf_available() {
        return;
    }
    left_its_cgroup("ebpf");
}

#[test]
fn shared_pages_once_in_pss_when_the_tree_leaves_its_cgroup_procfs() {
    if !need_root() {
        return;
    }
    left_its_cgroup("procfs");
}

/// A member that moves itself out of the command's cgroup mid-run, after samples
/// in which the whole tree was in it (where the eBPF backend no longer lists the
/// cgroup's processes, its probe reading each leader's memory cgroup instead): the
/// samples from the next one on take Σ PSS and name it.
fn a_member_that_leaves_mid_run(backend: &str) {
    let away = Cgroup::new(&format!("memaway{backend}"));
    let adir = memory_dir(&away);
    let s = Scratch::new(&format!("memaway{backend}"));
    let moved = s.path("moved");
    let script = format!(
        "{w} sleepers 2 4 >/dev/null & sleep 1.5; echo $! > {procs} || exit 99; \
         date +%s.%N > {moved}; wait",
        w = workload().display(),
        procs = adir.join("cgroup.procs").display(),
        moved = moved.display(),
    );
    let mut c = Command::new(tracker());
    c.args(["run", "-q", "-i", "0.2", "--summary"])
        .arg(s.path("s.json"))
        .arg("-o")
        .arg(s.path("s.jsonl"));
    if backend == "procfs" {
        c.arg("--no-ebpf");
    }
    let o = run(c.args(["--", "sh", "-c", &script]));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let at: f64 = std::fs::read_to_string(&moved)
        .expect("the move's time")
        .trim()
        .parse()
        .expect("a time");
    let samples = read_jsonl(&s.path("s.jsonl"));
    let seen: Vec<(f64, String)> = samples
        .iter()
        .filter_map(|x| {
            Some((
                x["timestamp_secs"].as_f64()?,
                x["process"]["memory_source"].as_str()?.to_string(),
            ))
        })
        .collect();
    let before = seen.iter().filter(|(t, m)| *t < at - 0.3 && m == "cgroup");
    assert!(before.count() >= 4, "{backend}: {seen:?}");
    let late: Vec<_> = seen
        .iter()
        .filter(|(t, m)| *t > at + 0.45 && m != "pss")
        .collect();
    assert!(
        late.is_empty(),
        "{backend}: moved at {at:.3}, still read from the cgroup: {late:?}"
    );
    assert!(seen.iter().any(|(t, _)| *t > at + 0.45), "{seen:?}");
    let sum = read_json(&s.path("s.json"));
    assert_eq!(sum["memory_source"], "pss", "{sum}");
}

#[test]
fn a_member_that_leaves_mid_run_is_seen_in_the_next_sample_ebpf() {
    if !need_root() || !ebpf_available() {
        return;
    }
    a_member_that_leaves_mid_run("ebpf");
}

#[test]
fn a_member_that_leaves_mid_run_is_seen_in_the_next_sample_procfs() {
    if !need_root() {
        return;
    }
    a_member_that_leaves_mid_run("procfs");
}

/// A read-only cgroupfs (a bind remounted read-only in a mount namespace of the
/// tracker's own): one line says the cgroup could not be made, memory is Σ PSS,
/// named, and the command's exit code is the tracker's.
#[test]
fn a_cgroup_that_cannot_be_made_is_said_once_and_the_run_goes_on() {
    if !need_root() || !e2e::require(e2e::have("unshare"), "unshare is needed") {
        return;
    }
    let cg = Cgroup::new("memro");
    let mdir = memory_dir(&cg);
    let s = Scratch::new("memro");
    let mount = if v1_memory() {
        "/sys/fs/cgroup/memory"
    } else {
        "/sys/fs/cgroup"
    };
    // Into the truth cgroup first, then the cgroupfs becomes read-only for the
    // tracker.
    let script = format!(
        "for d in $(echo {} | tr : ' '); do echo $$ > $d/cgroup.procs || exit 99; done; \
         mount -o remount,bind,ro {mount} && exec \"$@\"",
        cg.join_arg()
    );
    let w = workload();
    let o = run(Command::new("unshare")
        .args(["-m", "--propagation", "private", "sh", "-c", &script, "sh"])
        .arg(tracker())
        .args(["run", "-q", "-i", "0.2", "--summary"])
        .arg(s.path("s.json"))
        .arg("-o")
        .arg(s.path("s.jsonl"))
        .args(["--", "sh", "-c"])
        .arg(format!(
            "{} shared 100 2 600 fork >/dev/null; exit 3",
            w.display()
        ))
        .current_dir(&s.0));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    let said: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("no cgroup for the command's memory"))
        .collect();
    assert_eq!(said.len(), 1, "said once: {err}");
    assert!(
        said[0].contains("read-only") && said[0].contains("pss"),
        "{}",
        said[0]
    );
    let sum = read_json(&s.path("s.json"));
    assert_eq!(sum["memory_source"], "pss", "{sum}");
    assert_eq!(sum["exit_code"], 3);
    let samples = read_jsonl(&s.path("s.jsonl"));
    assert!(samples
        .iter()
        .all(|x| x["process"]["memory_source"] == "pss"));
    // Σ PSS of 100 MiB shared by three processes: once, not three times.
    let truth = cg.peak_memory().expect("peak") as f64 / 1048576.0;
    let ours = f(&sum, "peak_memory_mib");
    eprintln!(
        "read-only cgroupfs: pss peak {ours:.1} MiB, cgroup (with the tracker) {truth:.1} MiB"
    );
    assert!(ours > 90.0 && ours < truth * 1.05, "{ours} vs {truth}");
    assert!(ours_under(&mdir).is_empty());
}

/// No rights to make cgroups (the tracker as an unprivileged user): the same.
/// The tracker (a copy it may execute) as the unprivileged user 65534
/// (`setpriv`), in the scratch directory, which it may write:
/// `run -q -i 0.2 --summary s.json -- sh -c SCRIPT`.
fn run_as_nobody(s: &Scratch, script: &str) -> std::process::Output {
    use std::os::unix::fs::PermissionsExt as _;
    let (bin, dir) = (tracker_for_any_user(s), &s.0);
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    run(Command::new(AS_NOBODY[0])
        .args(&AS_NOBODY[1..])
        .arg(&bin)
        .args(["run", "-q", "-i", "0.2", "--summary", "s.json", "--"])
        .args(["sh", "-c", script])
        .current_dir(dir))
}

#[test]
fn without_rights_memory_is_pss_said_once() {
    if !need_root() || !e2e::require(e2e::have("setpriv"), "setpriv is needed") {
        return;
    }
    let s = Scratch::new("memnobody");
    let o = run_as_nobody(&s, "exit 5");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(5), "{err}");
    let said = err
        .lines()
        .filter(|l| l.contains("no cgroup for the command's memory"))
        .count();
    assert_eq!(said, 1, "{err}");
    let sum = read_json(&s.path("s.json"));
    assert_eq!(sum["memory_source"], "pss", "{sum}");
}

/// A member this tracker may not read (a set-user-ID process in a user's tree):
/// Σ PSS is short of it, and says so (`pss_partial`, naming why), instead of
/// passing the sum off as whole; the members it can read are counted.
#[test]
fn a_member_whose_rollup_cannot_be_read_makes_pss_a_named_lower_bound() {
    if !need_root() || !e2e::require(e2e::have("setpriv"), "setpriv is needed") {
        return;
    }
    let s = Scratch::new("mempartial");
    use std::os::unix::fs::PermissionsExt as _;
    let sleep = ["/bin/sleep", "/usr/bin/sleep"]
        .into_iter()
        .find(|p| Path::new(p).exists())
        .expect("sleep");
    // A root-owned copy with the set-user-ID bit: run by the user, it runs as
    // root, and its /proc files are not the user's to read.
    let suid = s.path("suidsleep");
    std::fs::copy(sleep, &suid).expect("copy of sleep");
    std::fs::set_permissions(&suid, std::fs::Permissions::from_mode(0o4755)).expect("chmod u+s");
    let o = run_as_nobody(&s, "./suidsleep 1.2 & sleep 1.2; wait");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let sum = read_json(&s.path("s.json"));
    assert_eq!(sum["memory_source"], "pss", "{sum}");
    let partial = sum["degraded"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|d| d["name"] == "pss_partial")
        .unwrap_or_else(|| panic!("pss_partial named: {sum}"));
    let detail = partial["detail"].as_str().unwrap_or_default();
    assert!(
        detail.contains("lower bound") && detail.contains("ermission denied"),
        "{detail}"
    );
    assert!(f(&sum, "peak_memory_mib") > 0.0, "{sum}");
}

/// The cgroup the tracker makes is gone after the run however it ends: normally,
/// with a daemon that outlives the root (moved back to the cgroup it started in),
/// and on SIGTERM to the tracker.
/// The charge's parts, each sample: 96 MiB written to a file (page cache, which a
/// limit reclaims), then 80 MiB of anonymous memory held. The parts add up to the
/// charge, the working set leaves the inactive page cache out, and the page cache
/// the samples saw is what the kernel still charges once the run is over (the
/// cgroup made for the command gives its pages to its parent, the truth).
#[test]
fn the_charges_parts_follow_the_workload() {
    if !need_root() {
        return;
    }
    let cg = Cgroup::new("parts");
    let s = Scratch::new("parts");
    let script = "dd if=/dev/zero of=f bs=1M count=96 status=none && sync && \
                  python3 -c 'import time; x = bytearray(80 << 20); time.sleep(0.8)'";
    let o = run(Command::new(workload())
        .arg("incgroup")
        .arg(cg.join_arg())
        .arg("--")
        .arg(tracker())
        .args(["run", "-q", "-i", "0.2", "-o"])
        .arg(s.path("s.jsonl"))
        .args(["--", "/bin/sh", "-c", script])
        .current_dir(&s.0));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let samples = read_jsonl(&s.path("s.jsonl"));
    let mib = |p: &Value, k: &str| p[k].as_f64().unwrap_or_else(|| panic!("{k}: {p}"));
    let (mut anon_max, mut cache_max, mut cache_last) = (0.0f64, 0.0f64, 0.0);
    let mut caches = Vec::new();
    for smp in &samples {
        let p = &smp["process"];
        assert_eq!(p["memory_source"], "cgroup", "{p}");
        let (all, anon, cache, ws, kernel) = (
            mib(p, "memory_mib"),
            mib(p, "memory_anon_mib"),
            mib(p, "memory_page_cache_mib"),
            mib(p, "memory_working_set_mib"),
            mib(p, "memory_kernel_mib"),
        );
        assert!((anon + cache + kernel - all).abs() < 0.01, "parts {p}");
        assert!(ws <= all && ws >= anon, "working set {p}");
        anon_max = anon_max.max(anon);
        cache_max = cache_max.max(cache);
        cache_last = cache;
        caches.push(format!("{cache:.1}"));
    }
    assert!(
        anon_max >= 80.0,
        "80 MiB held: anonymous at most {anon_max} MiB"
    );
    // The file's pages in the samples. The kernel may let some of them go while
    // the tree runs, with no reclaim in /proc/vmstat (a last sample of 87.2 MiB
    // here, beside a release build): the last sample is held to the kernel's
    // figure below, not to what was written.
    assert!(
        cache_max >= 90.0,
        "96 MiB written: page cache by sample {caches:?} MiB"
    );
    // The truth's page cache now: the file's pages, reparented, and the tracker's
    // own few (its binary, its outputs).
    let stat = std::fs::read_to_string(memory_dir(&cg).join("memory.stat")).expect("stat");
    let key = if v1_memory() { "total_cache" } else { "file" };
    let truth_cache = stat
        .lines()
        .find_map(|l| l.strip_prefix(key)?.trim().parse::<f64>().ok())
        .expect("page cache")
        / 1048576.0;
    assert!(
        truth_cache >= cache_last - 1.0 && truth_cache <= cache_last + 24.0,
        "the kernel's page cache {truth_cache:.1} MiB, the last sample's {cache_last:.1} MiB (by sample {caches:?})"
    );
}

/// A tracker in a PID namespace of its own (with its own /proc) sweeps the
/// cgroups killed trackers left beside its own, and must not take a host
/// tracker's for one: the host tracker's pid names no process in its namespace.
/// The host tracker's cgroup, made and still empty (its command not moved in
/// yet), stays; the namespaced tracker's run makes and removes its own.
#[test]
fn a_namespaced_tracker_leaves_a_host_trackers_cgroup() {
    if !need_root() || !e2e::require(e2e::have("unshare"), "unshare is needed") {
        return;
    }
    let cg = Cgroup::new("memns");
    let mdir = memory_dir(&cg);
    // As a host tracker names its cgroup: after its pid, one alive on the host
    // (this test's) and unseen in the new namespace.
    let host = mdir.join(format!("resource-tracker-{}", std::process::id()));
    std::fs::create_dir(&host).expect("a host tracker's cgroup");
    // Removed however the test ends, so that the truth cgroup can go too.
    struct Gone<'a>(&'a Path);
    impl Drop for Gone<'_> {
        fn drop(&mut self) {
            let _ = std::fs::remove_dir(self.0);
        }
    }
    let _gone = Gone(&host);
    let s = Scratch::new("memns");
    let o = run(Command::new(workload())
        .arg("incgroup")
        .arg(cg.join_arg())
        .arg("--")
        .args(["unshare", "--pid", "--fork", "--mount-proc"])
        .arg(tracker())
        .args(["run", "-q", "-i", "0.2", "--summary"])
        .arg(s.path("s.json"))
        .args(["--", "sleep", "0.3"])
        .current_dir(&s.0));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        host.exists(),
        "the namespaced tracker removed {}: {err}",
        host.display()
    );
    // The namespaced tracker's own cgroup is gone; the host tracker's stays.
    let left: Vec<String> = ours_under(&mdir)
        .into_iter()
        .filter(|n| Some(n.as_str()) != host.file_name().and_then(|f| f.to_str()))
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn no_cgroup_is_left_behind() {
    if !need_root() {
        return;
    }
    let cg = Cgroup::new("memleft");
    let mdir = memory_dir(&cg);
    let s = Scratch::new("memleft");
    let tracked = |args: &[&str]| {
        let mut c = Command::new(workload());
        c.arg("incgroup")
            .arg(cg.join_arg())
            .arg("--")
            .arg(tracker())
            .args(["run", "-q", "-i", "0.2", "--summary"])
            .arg(s.path("s.json"))
            .arg("--")
            .args(args)
            .current_dir(&s.0);
        c
    };
    // A daemon outliving the root: the run ends, the daemon goes back to the
    // cgroup the command started in, the tracker's cgroup is removed.
    let o = run(&mut tracked(&[
        "sh",
        "-c",
        "sleep 5 </dev/null >/dev/null 2>&1 & echo $! > daemon.pid",
    ]));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    assert!(ours_under(&mdir).is_empty(), "{:?}", ours_under(&mdir));
    let daemon: i32 = std::fs::read_to_string(s.path("daemon.pid"))
        .expect("daemon pid")
        .trim()
        .parse()
        .expect("pid");
    let where_now = std::fs::read_to_string(format!("/proc/{daemon}/cgroup")).unwrap_or_default();
    let name = mdir.file_name().and_then(|n| n.to_str()).unwrap_or("");
    if v1_memory() {
        let line = where_now
            .lines()
            .find(|l| {
                l.split(':')
                    .nth(1)
                    .is_some_and(|c| c.split(',').any(|x| x == "memory"))
            })
            .unwrap_or("");
        assert!(line.ends_with(&format!("/{name}")), "{where_now}");
    }
    // SAFETY: our own test's leftover daemon.
    unsafe { libc::kill(daemon, libc::SIGKILL) };

    // SIGTERM to the tracker while the command runs.
    let child = tracked(&["sleep", "30"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("tracker");
    let t0 = Instant::now();
    while ours_under(&mdir).is_empty() && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let made = ours_under(&mdir);
    if v1_memory() {
        assert_eq!(made.len(), 1, "the tracker's cgroup: {made:?}");
    }
    // The CPU one, v2's (`incgroup` execs the tracker: its pid is the child's).
    let cpu_dir = v2_own_dir().map(|d| d.join(format!("resource-tracker-{}", child.id())));
    if let Some(d) = &cpu_dir {
        // Made right after the memory one.
        while !d.exists() && t0.elapsed() < Duration::from_secs(10) {
            std::thread::sleep(Duration::from_millis(20));
        }
        assert!(d.exists(), "{} was not made", d.display());
    }
    // SAFETY: signalling our own child.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let o = child.wait_with_output().expect("tracker");
    assert_eq!(
        o.status.code(),
        Some(128 + libc::SIGTERM),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(ours_under(&mdir).is_empty(), "{:?}", ours_under(&mdir));
    if let Some(d) = &cpu_dir {
        assert!(!d.exists(), "{} left behind", d.display());
    }

    // SIGKILL leaves a tracker no chance to remove its cgroups: the next tracker
    // made in the same place removes them once the killed one's command is gone.
    let mut child = tracked(&["sh", "-c", "echo $$ > cmd.pid; exec sleep 30"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("tracker");
    let killed = child.id();
    let t0 = Instant::now();
    while !s.path("cmd.pid").exists() && t0.elapsed() < Duration::from_secs(10) {
        std::thread::sleep(Duration::from_millis(20));
    }
    let left: Vec<PathBuf> = std::iter::once(mdir.join(format!("resource-tracker-{killed}")))
        .chain(v2_own_dir().map(|d| d.join(format!("resource-tracker-{killed}"))))
        .collect();
    // SAFETY: signalling our own child.
    unsafe { libc::kill(killed as i32, libc::SIGKILL) };
    let _ = child.wait();
    let cmd: i32 = std::fs::read_to_string(s.path("cmd.pid"))
        .expect("command pid")
        .trim()
        .parse()
        .expect("pid");
    // SAFETY: the killed tracker's command, the test's own grandchild.
    unsafe { libc::kill(cmd, libc::SIGKILL) };
    std::thread::sleep(Duration::from_millis(200));
    if v1_memory() {
        assert!(
            left.iter().any(|d| d.exists()),
            "{left:?}: the killed tracker's cgroups"
        );
    }
    let o = run(&mut tracked(&["true"]));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    for d in &left {
        assert!(
            !d.exists(),
            "{} left behind by a killed tracker",
            d.display()
        );
    }
}

/// This process's v2 cgroup beside v1's controllers (hybrid), where the tracker
/// makes the command's CPU cgroup; None elsewhere.
fn v2_own_dir() -> Option<PathBuf> {
    let base = Path::new("/sys/fs/cgroup/unified");
    if !v1_memory() || !base.join("cgroup.procs").exists() {
        return None;
    }
    let text = std::fs::read_to_string("/proc/self/cgroup").ok()?;
    let rel = text.lines().find_map(|l| l.strip_prefix("0::"))?;
    Some(base.join(rel.trim_start_matches('/')))
}
