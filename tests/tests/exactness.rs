//! The eBPF engine against the kernel's own accounting of a cgroup that holds exactly
//! the workload, on the shapes where trackers go wrong: I/O through nested shells,
//! orphans reaped late (by a lazy subreaper and by the real init), daemons that
//! outlive the root, exec from a non-leader thread, vfork, CLONE_PARENT, a leader
//! that leaves before its threads, pid reuse, a ring too small for the burst, and
//! the peak memory of one process and of several at once.
//! Each shape runs several times; the worst run is the one that counts.

use std::process::Command;

use serde_json::Value;
use tracker_tests::{
    truth::{
        assert_exact_cpu, assert_exact_secs, cgroup_cpu_at, check_adds_up, cpu_ratio,
        exit_records_cpu_secs, f, ratio_of, track, track_cmd, track_with, u, unread_members, Opts,
        Tracked,
    },
    *,
};

/// CPU within this fraction of the cgroup's, in every run.
const CPU_TOLERANCE: f64 = 0.005;
/// Storage bytes within this fraction of the cgroup's.
const IO_TOLERANCE: f64 = 0.01;
/// Peak memory within this fraction of the cgroup's.
const MEM_TOLERANCE: f64 = 0.02;

/// Runs `one` `n` times and checks every run; returns the worst CPU error seen.
fn worst_of(n: usize, what: &str, mut one: impl FnMut(usize) -> Tracked) -> f64 {
    let mut worst: f64 = 0.0;
    for i in 0..n {
        let t = one(i);
        assert_eq!(t.code, 0, "{what} run {i}: {}", t.stderr);
        assert_eq!(t.summary["backend"], "ebpf", "{what}: {}", t.summary);
        let r = cpu_ratio(&t);
        eprintln!(
            "{what} run {i}: CPU {:.4} % of the truth ({:.4}–{:.4} s), written {} of {} bytes, {} records lost, degraded {}",
            100.0 * r,
            t.truth_ns as f64 / 1e9,
            t.truth_hi_ns as f64 / 1e9,
            u(&t.summary, "write_bytes"),
            t.truth_io.1,
            u(&t.summary, "lost_events"),
            t.summary["degraded"]
        );
        if unread_members(&t.summary) > 0 {
            // Held to what the tracker says of the members it names.
            assert_exact_cpu(&t, &format!("{what} run {i}"), CPU_TOLERANCE);
        } else {
            worst = worst.max((r - 1.0).abs());
        }
        check_adds_up(&t);
    }
    assert!(
        worst < CPU_TOLERANCE,
        "{what}: worst CPU error {:.3} % (allowed {:.1} %)",
        100.0 * worst,
        100.0 * CPU_TOLERANCE
    );
    worst
}

fn io_within(t: &Tracked, what: &str) {
    let got = u(&t.summary, "write_bytes") as f64;
    let truth = t.truth_io.1 as f64;
    assert!(truth > 0.0, "{what}: the cgroup saw no storage writes");
    let r = got / truth;
    assert!(
        (r - 1.0).abs() < IO_TOLERANCE,
        "{what}: write_bytes {got} vs cgroup {truth} ({:.2} %)",
        100.0 * r
    );
}

fn sh(tag: &str, script: &str) -> Tracked {
    track_cmd(tag, &[], &[script], true, true)
}

/// Each 0.5 s interval's CPU equals the cgroup's over the same span (polled every
/// 2 ms, interpolated at the samples' timestamps), within 2 % plus one tick: exits
/// are counted in the interval they happen in, not when the kernel frees them.
/// The shapes keep the CPUs busy without queueing hundreds of runnable tasks: there,
/// the tracker itself waits its turn mid-reading (83–148 ms measured with 400
/// spinning orphans on 2 CPUs) and figures shift between neighbouring intervals,
/// while totals stay exact.
/// Peak memory against the cgroup's own peak (v1 `memory.max_usage_in_bytes`, v2
/// `memory.peak`): one process writing 256 MiB, and four at once writing 64 MiB
/// each, held 800 ms; the worst of three runs of each.
#[test]
fn peak_memory_follows_the_cgroup() {
    for (mib, n) in [("256", "1"), ("64", "4")] {
        let mut worst: f64 = 0.0;
        for i in 0..3 {
            let t = track_with(&Opts {
                tag: "mem",
                cmd: &["memory", mib, n, "800"],
                interval: "0.1",
                ..Opts::default()
            });
            assert_eq!(t.code, 0, "{}", t.stderr);
            let truth = t.truth_peak.expect("the cgroup keeps a peak") as f64 / 1048576.0;
            let ours = f(&t.summary, "peak_memory_mib");
            eprintln!(
                "memory {n} x {mib} MiB run {i}: ours {ours:.1} MiB, cgroup {truth:.1} MiB ({:.2} %)",
                100.0 * ours / truth
            );
            worst = worst.max((ours / truth - 1.0).abs());
        }
        assert!(
            worst <= MEM_TOLERANCE,
            "{n} x {mib} MiB: peak memory off by {:.2} %",
            100.0 * worst
        );
    }
}

/// A peak no sample sees (a process that writes 128 MiB and exits within 300 ms,
/// sampled every 5 s) comes from the kernel's `signal->maxrss` at exit, which is in
/// pages: read as KiB it was a quarter of the cgroup's peak.
#[test]
fn peak_memory_between_samples_comes_from_the_exit() {
    if !ebpf_available() {
        return;
    }
    for i in 0..2 {
        let t = track_with(&Opts {
            tag: "memexit",
            cmd: &["memory", "128", "1", "300"],
            interval: "5",
            ..Opts::default()
        });
        assert_eq!(t.code, 0, "{}", t.stderr);
        let truth = t.truth_peak.expect("the cgroup keeps a peak") as f64 / 1048576.0;
        let ours = f(&t.summary, "peak_memory_mib");
        eprintln!(
            "memory at exit run {i}: ours {ours:.1} MiB, cgroup {truth:.1} MiB ({:.2} %)",
            100.0 * ours / truth
        );
        assert!(
            (ours / truth - 1.0).abs() <= MEM_TOLERANCE,
            "peak memory {ours} MiB vs the cgroup's {truth} MiB"
        );
    }
}

#[test]
fn per_interval_cpu_follows_the_cgroup() {
    if !ebpf_available() {
        return;
    }
    for (tag, cmd) in [
        ("ivswarm", &["swarm", "500", "4000", "2", "fork"][..]),
        ("ivexec", &["swarm", "400", "4000", "2", "exec"][..]),
        ("ivburn", &["burner", "2", "1500"][..]),
    ] {
        let t = track_with(&Opts {
            tag,
            cmd,
            interval: "0.5",
            poll: true,
            ..Opts::default()
        });
        assert_eq!(t.code, 0, "{}", t.stderr);
        let mut checked = 0;
        for w in t.samples.windows(2) {
            let (from, to) = (f(&w[0], "timestamp_secs"), f(&w[1], "timestamp_secs"));
            let (Some(a), Some(b)) = (cgroup_cpu_at(&t.series, from), cgroup_cpu_at(&t.series, to))
            else {
                continue;
            };
            let truth = (b - a) / 1e9;
            let p = &w[1]["process"];
            let got = f(p, "utime_secs") + f(p, "stime_secs");
            // Each end is read a scheduling delay after its timestamp, the tracker's
            // and this test's poll of the cgroup alike, while the workload holds
            // both vCPUs: the ends' skews differ by up to 25 ms, at the rate the
            // tree uses CPU (CI: 33 ms at 1.8 cores against 2 % + 10 ms).
            let rate = truth / (to - from).max(1e-3);
            let allowed = 0.02 * truth + 0.01 + rate * 0.025;
            eprintln!(
                "{tag}: interval of {:.3} s: tracker {got:.4} s, cgroup {truth:.4} s",
                to - from
            );
            assert!(
                (got - truth).abs() <= allowed,
                "{tag}: tracker {got} s vs cgroup {truth} s in one interval"
            );
            checked += 1;
        }
        assert!(checked >= 2, "{tag}: {checked} intervals compared");
    }
}

#[test]
fn io_at_the_bottom_of_nested_shells_counts_once() {
    if !ebpf_available() {
        return;
    }
    // 50 MiB with O_DIRECT under four shells: each shell reaps the one below, and
    // the kernel adds the child's I/O to the reaper's; counted once all the same.
    let script = "sh -c 'sh -c \"sh -c \\\"dd if=/dev/zero of=f bs=1M count=50 oflag=direct status=none\\\"\"'";
    worst_of(3, "nested shells", |i| {
        let t = sh(&format!("nest{i}"), script);
        io_within(&t, "nested shells");
        let w = u(&t.summary, "write_bytes");
        assert!(w >= 50 << 20, "at least the 50 MiB: {w}");
        // dd's own write calls: exactly 50 MiB of them, plus the shells' few bytes.
        let wchar = u(&t.summary, "wchar_bytes");
        assert!(
            (50 << 20..(50 << 20) + 65536).contains(&wchar),
            "wchar {wchar}"
        );
        t
    });
}

#[test]
fn ten_parallel_writers_count_once() {
    if !ebpf_available() {
        return;
    }
    let script = "for i in 0 1 2 3 4 5 6 7 8 9; do dd if=/dev/zero of=f$i bs=1M count=5 oflag=direct status=none & done; wait";
    worst_of(3, "parallel writers", |i| {
        let t = sh(&format!("par{i}"), script);
        io_within(&t, "parallel writers");
        t
    });
}

#[test]
fn orphans_left_as_zombies_by_a_lazy_subreaper() {
    if !ebpf_available() {
        return;
    }
    // 400 grandchildren spin 2 ms each and wait 1.5 s as zombies before the
    // subreaper reaps them; RCU frees them later still.
    worst_of(3, "lazy subreaper", |i| {
        let t = track(
            &format!("lazy{i}"),
            &[],
            &["lazyreaper", "400", "2", "1500"],
        );
        assert_eq!(u(&t.workload_out, "reaped"), 800);
        assert_eq!(u(&t.summary, "processes_spawned"), 801);
        assert_eq!(u(&t.summary, "processes_exited"), 801);
        t
    });
}

/// The final sample follows the root's exit at once and costs the tracker almost
/// nothing, though 1,500 orphans wait for init to reap them. (The root holds 300 ms
/// after its orphans have exited: while 1,500 spinners are runnable at once, the
/// tracker gets its share of 2 CPUs like any task, and a sample then takes tenths of
/// a second of wall time, which a root exiting meanwhile waits for.)
#[test]
fn orphans_reaped_by_init_and_a_prompt_cheap_end() {
    if !ebpf_available() {
        return;
    }
    let mut worst_delay: f64 = 0.0;
    let mut worst_end_cpu: f64 = 0.0;
    worst_of(3, "orphans of init", |i| {
        let t = track(&format!("init{i}"), &[], &["orphans", "1500", "1", "300"]);
        assert_eq!(u(&t.summary, "processes_spawned"), 3001);
        assert_eq!(u(&t.summary, "processes_exited"), 3001);
        let last = t.samples.last().expect("a final sample");
        let delay = f(last, "timestamp_secs") - f(&t.workload_out, "unix_secs");
        let end_cpu = f(&last["tracker"], "cpu_secs");
        eprintln!(
            "final sample {:.1} ms after the root's last line, tracker CPU in the final interval {:.2} ms",
            delay * 1e3,
            end_cpu * 1e3
        );
        worst_delay = worst_delay.max(delay);
        worst_end_cpu = worst_end_cpu.max(end_cpu);
        t
    });
    // Without retiring the exited members itself, the end would wait for the
    // kernel to free them, seconds later under a lazy RCU. The goal of 50 ms (measured
    // 0.7–1.3 ms) lives in the bench (`cargo xtask bench --only-exact`); this bound
    // only tells a prompt end from one that waits, and holds beside parallel tests.
    assert!(
        worst_delay < 0.25,
        "final sample {worst_delay} s after the root"
    );
    // The end adds no polling: retiring the waiting orphans is one map listing and
    // a sweep per 16 of them (1.2–1.6 ms measured on an idle machine, release
    // build). The suite runs the debug build: 2.0–7.3 ms there in 12 runs on this
    // VM, 8–14 ms in 6 right after a killed suite had left it busy. Polling for the
    // kernel's frees instead would wake every few ms for seconds: tens of ms. The
    // bound tells the two apart; the cost goal itself lives in the bench.
    assert!(
        worst_end_cpu < 0.02,
        "tracker CPU in the final interval {worst_end_cpu} s"
    );
}

#[test]
fn a_daemon_that_outlives_the_root_is_still_running() {
    if !ebpf_available() {
        return;
    }
    worst_of(3, "daemon", |i| {
        // The daemon spins 200 ms within the tail's bound, then sleeps past it.
        let t = track_cmd(
            &format!("daemon{i}"),
            &["--tail-timeout", "0.6"],
            &["daemon", "200"],
            false,
            false,
        );
        assert_eq!(u(&t.summary, "still_running"), 1, "{}", t.summary);
        assert_eq!(u(&t.summary, "processes_spawned"), 3);
        assert_eq!(u(&t.summary, "processes_exited"), 2);
        t
    });
}

#[test]
fn exec_from_a_non_leader_thread() {
    if !ebpf_available() {
        return;
    }
    worst_of(3, "thread exec", |i| {
        let t = track(&format!("texec{i}"), &[], &["threadexec", "150000"]);
        assert_eq!(t.workload_out, Value::Null, "spin prints nothing");
        assert_eq!(u(&t.summary, "processes_spawned"), 1);
        assert_eq!(u(&t.summary, "processes_exited"), 1);
        // incgroup → threadexec → spin.
        assert_eq!(u(&t.summary, "execs"), 3);
        t
    });
}

#[test]
fn vfork_children() {
    if !ebpf_available() {
        return;
    }
    worst_of(3, "vfork", |i| {
        let t = track(&format!("vfork{i}"), &[], &["vfork", "150", "2000"]);
        assert_eq!(u(&t.summary, "processes_spawned"), 151);
        assert_eq!(u(&t.summary, "processes_exited"), 151);
        t
    });
}

#[test]
fn clone_parent_siblings_stay_in_the_tree() {
    if !ebpf_available() {
        return;
    }
    worst_of(3, "CLONE_PARENT", |i| {
        let t = track(&format!("cpar{i}"), &[], &["cloneparent", "150", "2000"]);
        assert_eq!(u(&t.summary, "processes_spawned"), 151);
        assert_eq!(u(&t.summary, "processes_exited"), 151);
        t
    });
}

#[test]
fn leader_that_exits_before_its_threads() {
    if !ebpf_available() {
        return;
    }
    worst_of(3, "leader exit", |i| {
        let t = track(&format!("lexit{i}"), &[], &["leaderexit", "3", "300"]);
        assert_eq!(u(&t.summary, "threads_spawned"), 3);
        assert_eq!(u(&t.summary, "processes_exited"), 1);
        t
    });
}

#[test]
fn pids_reused_within_one_run() {
    if !ebpf_available() {
        return;
    }
    let pid_max: u64 = std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .expect("pid_max")
        .trim()
        .parse()
        .expect("pid_max number");
    // Wrapping a large pid space takes minutes; this shape needs a small one.
    if !e2e::require(
        pid_max <= 70_000,
        &format!("pid_max {pid_max} is too large"),
    ) {
        return;
    }
    // More processes than there are pids: every pid comes round again.
    let n = (pid_max + 1000).to_string();
    worst_of(1, "pid reuse", |_| {
        let t = track("reuse", &[], &["swarm", &n, "0", "2", "fork"]);
        assert_eq!(u(&t.summary, "processes_spawned"), pid_max + 1001);
        assert_eq!(u(&t.summary, "processes_exited"), pid_max + 1001);
        t
    });
}

#[test]
fn a_ring_too_small_loses_records_not_totals() {
    if !ebpf_available() {
        return;
    }
    worst_of(2, "small ring", |i| {
        // 8 KiB hold ~70 records; 1,000 exits in bursts overflow it.
        let t = track(
            &format!("ring{i}"),
            &["--event-ring-kib", "8"],
            &["swarm", "1000", "500", "2", "fork"],
        );
        assert!(
            u(&t.summary, "lost_events") > 0,
            "the ring did overflow: {}",
            t.summary
        );
        assert!(
            t.summary["degraded"]
                .as_array()
                .is_some_and(|d| d.iter().any(|x| x["name"] == "ring_full")),
            "named: {}",
            t.summary
        );
        assert_eq!(u(&t.summary, "processes_spawned"), 1001);
        t
    });
    // Short-lived orphans retiring while the tracker reads: with records lost, the
    // kernel's totals stand in for them, and no thread may count twice.
    worst_of(2, "small ring, orphans", |i| {
        let t = track(
            &format!("ringorph{i}"),
            &["--event-ring-kib", "16"],
            &["orphans", "1500", "1"],
        );
        assert!(u(&t.summary, "lost_events") > 0, "{}", t.summary);
        assert_eq!(u(&t.summary, "processes_spawned"), 3001);
        t
    });
}

#[test]
fn bad_ring_sizes_are_refused() {
    for bad in ["3", "1000", "0", "x", "524288"] {
        let o = run(Command::new(tracker()).args(["run", "--event-ring-kib", bad, "--", "true"]));
        assert_eq!(o.status.code(), Some(2), "{bad}");
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(err.contains("event-ring-kib"), "{bad}: {err}");
    }
}

/// In a PID namespace of its own the kernel's pids are not the tracker's: one line
/// says so, and the procfs backend counts right.
#[test]
fn in_a_pid_namespace_it_says_so_and_counts_with_procfs() {
    if !ebpf_available() {
        return;
    }
    let s = Scratch::new("pidns");
    let sum = s.path("s.json");
    let o = run(Command::new("unshare")
        .args(["-p", "-f", "--mount-proc"])
        .arg(tracker())
        .args(["run", "-q", "--summary"])
        .arg(&sum)
        .args([
            "--",
            "sh",
            "-c",
            "for i in $(seq 50); do /bin/true; done; sleep 0.3",
        ]));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("PID namespace"))
        .collect();
    assert_eq!(lines.len(), 1, "one line says why: {err}");
    assert!(lines[0].contains("procfs"), "{}", lines[0]);
    let summary = read_json(&sum);
    assert_eq!(summary["backend"], "procfs");
    // Named in the summary, for scripts that read no stderr.
    assert_eq!(
        summary["degraded"][0]["name"], "ebpf_pid_namespace",
        "{summary}"
    );
    assert!(f(&summary, "cpu_total_secs") > 0.0, "{summary}");
    assert!(u(&summary, "processes_spawned") >= 1, "{summary}");
}

/// Which backend a shape runs on, and its CPU tolerance against the cgroup.
#[derive(Clone, Copy)]
enum Backend {
    Ebpf,
    Procfs,
}

impl Backend {
    fn flags(self) -> &'static [&'static str] {
        match self {
            Backend::Ebpf => &[],
            Backend::Procfs => &["--no-ebpf"],
        }
    }
    fn name(self) -> &'static str {
        match self {
            Backend::Ebpf => "ebpf",
            Backend::Procfs => "procfs",
        }
    }
    /// eBPF within 0.5 %, procfs within 1 % (its live members' times are whole ticks
    /// between two samples; the final figures come from the tracker's own `wait4`).
    fn tolerance(self) -> f64 {
        match self {
            Backend::Ebpf => CPU_TOLERANCE,
            Backend::Procfs => 0.01,
        }
    }
}

/// Every exit event is of a process forked inside the tree (or the root): a record
/// of anything else means a task outside the tree was taken for a member.
fn no_foreign_exits(events: &[Value], what: &str) {
    let mut ours: std::collections::HashSet<u64> = events
        .iter()
        .filter(|e| e["kind"] == "fork")
        .map(|e| e["pid"].as_u64().expect("pid"))
        .collect();
    // The root: the first exec's process, registered before it ran.
    if let Some(root) = events.iter().find(|e| e["kind"] == "exec") {
        ours.insert(root["pid"].as_u64().expect("pid"));
    }
    let foreign: Vec<&Value> = events
        .iter()
        .filter(|e| e["kind"] == "exit" && !ours.contains(&e["pid"].as_u64().expect("pid")))
        .collect();
    assert!(
        foreign.is_empty(),
        "{what}: {} exit record(s) of processes never forked in the tree: {foreign:?}",
        foreign.len()
    );
    let names: std::collections::HashSet<&str> =
        events.iter().filter_map(|e| e["comm"].as_str()).collect();
    assert!(
        !names.contains("foreignspin"),
        "{what}: a process outside the tree is among its events: {names:?}"
    );
    // Each exit record is the member's own: a command it had (at its fork or an
    // exec) and a parent in the tree, the tracker (the root's parent), or the
    // reaper of orphans: the nearest subreaper above the tracker, else init, so an
    // ancestor of this test process (never the test itself, which is no subreaper
    // and the parent of the churn's shells). A record read through a task the
    // kernel had freed and given to a host process names that process's command
    // and parent.
    let mut comms: std::collections::HashMap<u64, Vec<&str>> = Default::default();
    for e in events
        .iter()
        .filter(|e| e["kind"] == "fork" || e["kind"] == "exec")
    {
        let pid = e["pid"].as_u64().expect("pid");
        comms
            .entry(pid)
            .or_default()
            .push(e["comm"].as_str().unwrap_or(""));
    }
    let mut parents = ours.clone();
    if let Some(root) = events.iter().find(|e| e["kind"] == "exec") {
        parents.insert(root["ppid"].as_u64().expect("ppid"));
    }
    parents.extend(reapers_above_us());
    for e in events.iter().filter(|e| e["kind"] == "exit") {
        let pid = e["pid"].as_u64().expect("pid");
        let comm = e["comm"].as_str().unwrap_or("");
        assert!(
            comms.get(&pid).is_some_and(|c| c.contains(&comm)),
            "{what}: the exit record of {pid} names {comm:?}, a command it never ran ({:?}): {e}",
            comms.get(&pid)
        );
        let ppid = e["ppid"].as_u64().expect("ppid");
        assert!(
            parents.contains(&ppid),
            "{what}: the exit record of {pid} names parent {ppid}, outside the tree: {e}"
        );
    }
}

/// The strict ancestors of this test process, init included: the only processes
/// an orphan of the tree can be reparented to (the tracker is a subreaper only on
/// procfs, whose runs write no events).
fn reapers_above_us() -> Vec<u64> {
    let parent_of = |pid: u64| -> Option<u64> {
        let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        status
            .lines()
            .find_map(|l| l.strip_prefix("PPid:"))
            .and_then(|v| v.trim().parse().ok())
    };
    let mut out = vec![1];
    let mut pid = u64::from(std::process::id());
    while let Some(p) = parent_of(pid).filter(|&p| p > 1) {
        out.push(p);
        pid = p;
    }
    out
}

/// Runs one shape on one backend; the events file is checked on eBPF.
fn shape_run(tag: &str, backend: Backend, cmd: &[&str], shell: bool) -> Tracked {
    let scratch = Scratch::new(tag);
    let events = scratch.path("events.jsonl");
    let events_arg = events.to_string_lossy().into_owned();
    let mut extra: Vec<&str> = backend.flags().to_vec();
    if matches!(backend, Backend::Ebpf) {
        extra.extend(["--events", &events_arg]);
    }
    // procfs is what a user without eBPF privileges gets, usually without rights
    // to make cgroups too: its own sums are held to the truth, the tracker kept
    // from making the command a cgroup. On eBPF the summary is the cgroup's and
    // the engine's own figures are the exit records' (below).
    let procfs = matches!(backend, Backend::Procfs);
    let t = track_with(&Opts {
        tag,
        extra: &extra,
        cmd,
        shell,
        backend_sums: procfs,
        ..Opts::default()
    });
    assert_eq!(t.code, 0, "{tag}: {}", t.stderr);
    assert_eq!(t.summary["backend"], backend.name(), "{tag}: {}", t.stderr);
    // `run` as root puts the command in a cgroup of its own; its CPU is that
    // cgroup's, which the truth (another hierarchy's accounting) must equal.
    if procfs {
        assert_eq!(t.summary["cpu_source"], "procfs", "{tag}: {}", t.stderr);
    } else if cpu_cgroup_expected() {
        assert_eq!(t.summary["cpu_source"], "cgroup", "{tag}: {}", t.stderr);
    }
    if matches!(backend, Backend::Ebpf) {
        let events = read_jsonl(&events);
        no_foreign_exits(&events, tag);
        // The engine's own figures, member by member, held to the same truth.
        assert_exact_secs(
            &t,
            exit_records_cpu_secs(&events),
            true,
            &format!("{tag} (Σ exit records)"),
            backend.tolerance(),
        );
    }
    t
}

/// Whether the command keeps the CPU cgroup `run` makes for it here: root, where
/// the truth is v1's cpuacct and the tracker's cgroup v2's (both mounted). With
/// one hierarchy only, the workload's joining the truth cgroup takes it out of
/// the tracker's, which then hands over to the backend (tested apart).
fn cpu_cgroup_expected() -> bool {
    // SAFETY: geteuid has no preconditions.
    let root = unsafe { libc::geteuid() } == 0;
    root && std::path::Path::new("/sys/fs/cgroup/cpuacct/cpuacct.usage").exists()
        && std::path::Path::new("/sys/fs/cgroup/unified/cgroup.procs").exists()
}

/// A member that moves itself to another v2 cgroup mid-run and burns 0.4 s there:
/// the tracker's cgroup no longer sees that CPU, the backend's sums then are the
/// larger and the figure (named in `cpu_source`), still exact against the truth
/// (v1's cpuacct, which the member never leaves).
#[test]
fn a_member_leaving_the_cpu_cgroup_hands_over_to_the_backend() {
    if !cpu_cgroup_expected() {
        panic!("this test needs root with v1 cpuacct and a v2 hierarchy (hybrid cgroups)");
    }
    let away = std::path::PathBuf::from(format!(
        "/sys/fs/cgroup/unified/rt-away-{}",
        std::process::id()
    ));
    let _ = std::fs::remove_dir(&away);
    std::fs::create_dir(&away).expect("a v2 cgroup to move to");
    let w = workload().to_string_lossy().into_owned();
    let script = format!(
        "{w} spin 300000; sh -c 'echo $$ > {}/cgroup.procs && exec {w} spin 400000'; {w} spin 200000",
        away.display()
    );
    for backend in [Backend::Ebpf, Backend::Procfs] {
        let tag = format!("cpuaway-{}", backend.name());
        let t = track_cmd(&tag, backend.flags(), &[&script], true, true);
        assert_eq!(t.code, 0, "{tag}: {}", t.stderr);
        assert_eq!(
            t.summary["cpu_source"],
            backend.name(),
            "{tag}: {}",
            t.stderr
        );
        let first = t.samples.first().expect("samples");
        assert_eq!(first["process"]["cpu_source"], "cgroup", "{tag}: {first}");
        assert_exact_cpu(&t, &tag, backend.tolerance());
    }
    let _ = std::fs::remove_dir(&away);
}

/// The shapes where trees go wrong, as workload commands (shell scripts where the
/// second item is true), each with the processes it makes when counts are exact.
fn shapes(w: &str) -> Vec<(&'static str, Vec<String>, bool, u64)> {
    vec![
        (
            // The inner shell reaps the burner and exits at once: both vanish
            // between two polls, and the outer shell's cutime holds them both.
            "nested",
            vec![format!("sh -c '{w} spin 500000; true'; sleep 0.3")],
            true,
            4,
        ),
        (
            "swarm",
            vec!["swarm", "150", "3000", "2", "fork"]
                .into_iter()
                .map(String::from)
                .collect(),
            false,
            151,
        ),
        (
            "orphans",
            vec!["orphans", "40", "8"]
                .into_iter()
                .map(String::from)
                .collect(),
            false,
            81,
        ),
        (
            "threadexec",
            vec!["threadexec", "150000"]
                .into_iter()
                .map(String::from)
                .collect(),
            false,
            1,
        ),
        (
            "vfork",
            vec!["vfork", "40", "4000"]
                .into_iter()
                .map(String::from)
                .collect(),
            false,
            41,
        ),
    ]
}

fn run_shapes(backend: Backend, churn: bool, runs: usize) {
    let w = workload().to_string_lossy().into_owned();
    let _churn = churn.then(|| tracker_tests::churn::Churn::start("shapes"));
    let mut worst: f64 = 0.0;
    for (name, cmd, shell, procs) in shapes(&w) {
        let cmd: Vec<&str> = cmd.iter().map(String::as_str).collect();
        for i in 0..runs {
            let tag = format!("{name}-{}-{i}", backend.name());
            let t = shape_run(&tag, backend, &cmd, shell);
            let r = cpu_ratio(&t);
            eprintln!(
                "{name} on {} (churn {churn}) run {i}: CPU {:.3} % of the cgroup, {} processes, lost {}, degraded {}",
                backend.name(),
                100.0 * r,
                u(&t.summary, "processes_spawned"),
                u(&t.summary, "lost_events"),
                t.summary["degraded"]
            );
            assert_exact_cpu(&t, &tag, backend.tolerance());
            worst = worst.max((r - 1.0).abs());
            match backend {
                Backend::Ebpf => {
                    assert_eq!(u(&t.summary, "processes_spawned"), procs, "{tag}");
                    assert_eq!(u(&t.summary, "processes_exited"), procs, "{tag}");
                    assert_eq!(t.summary["process_counts"], "exact");
                }
                Backend::Procfs => {
                    assert!(u(&t.summary, "processes_spawned") <= procs, "{tag}");
                    assert_eq!(t.summary["process_counts"], "lower_bound");
                }
            }
        }
    }
    eprintln!(
        "shapes on {} (churn {churn}): worst CPU error {:.3} %",
        backend.name(),
        100.0 * worst
    );
}

/// Runs per shape: `TRACKER_EXACT_RUNS` for a longer measurement, else `ci`.
fn runs(ci: usize) -> usize {
    std::env::var("TRACKER_EXACT_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(ci)
}

#[test]
fn shapes_on_procfs_count_each_process_once() {
    run_shapes(Backend::Procfs, false, runs(3));
}

#[test]
fn shapes_on_ebpf_quiet() {
    if !ebpf_available() {
        return;
    }
    run_shapes(Backend::Ebpf, false, runs(1));
}

#[test]
fn shapes_beside_unrelated_churn() {
    if !ebpf_available() {
        return;
    }
    run_shapes(Backend::Ebpf, true, runs(3));
    run_shapes(Backend::Procfs, true, runs(2));
}

/// A member's tid is freed when it is reaped, while its entry waits for the sweep
/// or the kernel's free; a task outside the tree given that tid (the test asks the
/// kernel for it through ns_last_pid) must be neither a member nor read as one.
#[test]
fn a_reused_pid_is_never_a_member() {
    if !ebpf_available() {
        return;
    }
    use std::io::{BufRead, Write};
    let w = workload().to_string_lossy().into_owned();
    let scratch = Scratch::new("reuse-foreign");
    let (out, back) = (scratch.path("out.fifo"), scratch.path("back.fifo"));
    for p in [&out, &back] {
        let c = std::ffi::CString::new(p.to_string_lossy().as_bytes()).expect("path");
        // SAFETY: a NUL-terminated path of our own scratch directory.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0, "mkfifo");
    }
    // A distinctive name for the foreign task, so that its records are told apart.
    let foreign = scratch.path("foreignspin");
    std::fs::copy(&w, &foreign).expect("copy the workload");
    let rounds = 30;
    let script = format!(
        "exec 3>{o} 4<{b}; for i in $(seq {rounds}); do {w} spin 4000 & p=$!; wait $p; echo $p >&3; read a <&4; done",
        o = out.display(),
        b = back.display()
    );
    let hits = std::cell::Cell::new(0);
    let during = || {
        let mut rd = std::io::BufReader::new(std::fs::File::open(&out).expect("open out.fifo"));
        let mut wr = std::fs::OpenOptions::new()
            .write(true)
            .open(&back)
            .expect("open back.fifo");
        let mut line = String::new();
        for _ in 0..rounds {
            line.clear();
            if rd.read_line(&mut line).unwrap_or(0) == 0 {
                break;
            }
            let pid: u32 = line.trim().parse().expect("a pid");
            // The next pid the kernel hands out is the member's, just freed.
            let _ = std::fs::write("/proc/sys/kernel/ns_last_pid", (pid - 1).to_string());
            let mut c = Command::new("/bin/sh")
                .arg("-c")
                .arg(format!(
                    "{f} spin 20000; {f} spin 2000",
                    f = foreign.display()
                ))
                .spawn()
                .expect("foreign");
            if c.id() == pid {
                hits.set(hits.get() + 1);
            }
            let _ = c.wait();
            writeln!(wr).expect("ack");
        }
    };
    let events = scratch.path("events.jsonl");
    let events_arg = events.to_string_lossy().into_owned();
    let t = track_with(&Opts {
        tag: "reuse-foreign",
        // No sample while it runs: the dead members' entries wait for their free.
        extra: &["--events", &events_arg],
        cmd: &[&script],
        shell: true,
        interval: "30",
        during: Some(&during),
        ..Opts::default()
    });
    assert_eq!(t.code, 0, "{}", t.stderr);
    eprintln!(
        "{} of {rounds} foreign processes got a member's freed pid",
        hits.get()
    );
    assert!(
        hits.get() >= rounds / 2,
        "the kernel did not hand out the freed pids ({} of {rounds})",
        hits.get()
    );
    no_foreign_exits(&read_jsonl(&events), "reused pids");
    // The shell, its `seq` and one child a round.
    assert_eq!(u(&t.summary, "processes_spawned"), rounds as u64 + 2);
    assert_eq!(u(&t.summary, "processes_exited"), rounds as u64 + 2);
    assert_exact_cpu(&t, "reused pids", CPU_TOLERANCE);
}

/// Members that finish after the root (a script's background job) are waited for up
/// to the tail's bound and counted whole; with a bound of 0 the run ends with the
/// root, as a daemon's does.
#[test]
fn children_that_finish_after_the_root() {
    let w = workload().to_string_lossy().into_owned();
    let script = format!("{w} spin 80000 & {w} spin 150000 & exit 0");
    let script = script.as_str();
    for backend in [Backend::Ebpf, Backend::Procfs] {
        if matches!(backend, Backend::Ebpf) && !ebpf_available() {
            continue;
        }
        for i in 0..3 {
            let tag = format!("tail-{}-{i}", backend.name());
            let t = shape_run(&tag, backend, &[script], true);
            assert_eq!(u(&t.summary, "still_running"), 0, "{tag}: {}", t.summary);
            if matches!(backend, Backend::Ebpf) {
                assert_eq!(u(&t.summary, "processes_exited"), 3, "{tag}");
            }
            assert_exact_cpu(&t, &tag, backend.tolerance());
        }
    }
    if ebpf_available() {
        let t = track_cmd("tail-zero", &["--tail-timeout", "0"], &[script], true, true);
        assert_eq!(t.code, 0, "{}", t.stderr);
        assert!(
            u(&t.summary, "still_running") >= 1,
            "with no tail the run ends with the root: {}",
            t.summary
        );
    }
}

/// A process's exit event carries the CPU of all its threads, whichever of them
/// retires last: the same figure run after run, equal to the cgroup's.
#[test]
fn a_threaded_exit_record_carries_every_thread() {
    if !ebpf_available() {
        return;
    }
    for i in 0..5 {
        let tag = format!("threxit{i}");
        let scratch = Scratch::new(&tag);
        let events = scratch.path("events.jsonl");
        let events_arg = events.to_string_lossy().into_owned();
        let t = track(&tag, &["--events", &events_arg], &["burner", "2", "300"]);
        assert_eq!(t.code, 0, "{}", t.stderr);
        let ev = read_jsonl(&events);
        let exits: Vec<&Value> = ev.iter().filter(|e| e["kind"] == "exit").collect();
        assert_eq!(exits.len(), 1, "{exits:?}");
        // The record holds the process's CPU since its fork, the part before it
        // joined the cgroup too: the truth is the cgroup's plus that part, known to
        // within the join's window.
        let cpu = f(exits[0], "cpu_secs");
        let (lo, hi) = (t.truth_ns as f64 / 1e9, t.truth_hi_ns as f64 / 1e9);
        let err = ratio_of(&t, cpu) - 1.0;
        eprintln!(
            "2-thread burner run {i}: exit record {cpu:.6} s, cgroup {lo:.6}–{hi:.6} s ({:+.3} %)",
            100.0 * err
        );
        assert!(
            err.abs() < CPU_TOLERANCE,
            "exit record {cpu} s vs the cgroup's {lo}–{hi} s"
        );
    }
}

/// A tracker in a time namespace (a container's, say) reads start times from /proc
/// shifted by the namespace's boottime offset; the root it registers is still known
/// by the kernel's own start time, so the tree is followed whole.
#[test]
fn a_tracker_in_a_time_namespace_follows_the_tree() {
    if !ebpf_available() {
        return;
    }
    let scratch = Scratch::new("timens");
    let sum = scratch.path("summary.json");
    let o = run(Command::new("unshare")
        .args(["--time", "--boottime", "100000", "--fork"])
        .arg(tracker())
        .args(["run", "-q", "--summary"])
        .arg(&sum)
        .args([
            "--",
            "/bin/sh",
            "-c",
            "for i in 1 2 3 4 5; do /bin/true; done",
        ]));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let s = read_json(&sum);
    assert_eq!(s["backend"], "ebpf", "{s}");
    assert_eq!(u(&s, "processes_spawned"), 6, "{s}");
    assert_eq!(u(&s, "processes_exited"), 6, "{s}");
    assert_eq!(u(&s, "execs"), 6, "{s}");
}

/// The tree's read-like and write-like system calls (`read_calls`, `write_calls`,
/// summed over the samples) against the kernel's own count: the root shell runs dd
/// through a nested shell (2,000 one-byte reads and writes) and another dd beside
/// it, waits, then execs `cat /proc/self/io`. That file's `syscr`/`syscw` then
/// hold every member's calls: the root's own before and after its exec (a task's
/// counts survive exec) and those of the children it reaped. Only cat's last few
/// calls, after it read the file, come after it. procfs too: it reads the I/O of
/// each child the tracker reaps from the zombie's /proc/PID/io, before the reap
/// (without that it missed the root's calls after its last poll: cat's start-up
/// here, 10 reads). Both backends, three runs each.
#[test]
fn read_and_write_calls_equal_the_kernels_count() {
    let backends: &[&[&str]] = if ebpf_available() {
        &[&[], &["--no-ebpf"]]
    } else {
        &[&["--no-ebpf"]]
    };
    let key = |io: &str, k: &str| -> u64 {
        io.lines()
            .find_map(|l| l.strip_prefix(k)?.strip_prefix(':')?.trim().parse().ok())
            .unwrap_or_else(|| panic!("no {k} in {io}"))
    };
    for extra in backends {
        for i in 0..3 {
            let file = std::env::temp_dir().join(format!("rt-calls-{}-{i}", std::process::id()));
            let script = format!(
                "sh -c 'dd if=/dev/zero of=/dev/null bs=1 count=2000 status=none' & \
                 dd if=/dev/zero of=/dev/null bs=1 count=500 status=none; wait; \
                 exec cat /proc/self/io > {}",
                file.display()
            );
            let t = track_cmd(&format!("calls{i}"), extra, &[&script], true, true);
            assert_eq!(t.code, 0, "{}", t.stderr);
            let io = std::fs::read_to_string(&file).expect("cat's /proc/self/io");
            let _ = std::fs::remove_file(&file);
            let sum = |k: &str| -> u64 {
                t.samples
                    .iter()
                    .filter_map(|s| s["process"][k].as_u64())
                    .sum()
            };
            let backend = t.summary["backend"].as_str().unwrap_or("?").to_string();
            for (field, k) in [("read_calls", "syscr"), ("write_calls", "syscw")] {
                let (got, kernel) = (sum(field), key(&io, k));
                eprintln!("{backend} run {i}: {field} {got}, the kernel's {k} {kernel}");
                assert!(kernel >= 2500, "{backend}: {k} {kernel} in {io}");
                assert!(
                    (kernel..=kernel + 8).contains(&got),
                    "{backend} run {i}: {field} {got} against the kernel's {k} {kernel}"
                );
            }
        }
    }
}
