//! Bad input the tracker cannot refuse up front (a tree larger than `--max-tasks`, a
//! ring too small for the burst, a kernel BTF that lacks fields or is missing): the
//! run goes on, the tracker exits with the command's code, and every figure that can
//! no longer be exact is named in the samples, the summary, its stderr lines and the
//! CSV (docs/bad-input.md, "Degraded figures").

use std::{path::Path, process::Command};

use serde_json::Value;
use tracker_tests::*;

/// One run's outputs.
struct Run {
    code: Option<i32>,
    stderr: String,
    samples: Vec<Value>,
    summary: Value,
}

/// `run -i 0.2 --format F -o OUT --summary S EXTRA -- sh -c SCRIPT` with `env`.
fn tracked(s: &Scratch, env: &[(&str, &Path)], extra: &[&str], script: &str, csv: bool) -> Run {
    let (out, sum) = (s.path("out"), s.path("summary.json"));
    let mut cmd = Command::new(tracker());
    for (k, v) in env {
        cmd.env(k, v);
    }
    let o = run(cmd
        .args([
            "run",
            "-i",
            "0.2",
            "--format",
            if csv { "csv" } else { "json" },
            "-o",
        ])
        .arg(&out)
        .arg("--summary")
        .arg(&sum)
        .args(extra)
        .args(["--", "sh", "-c", script]));
    let stderr = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!stderr.contains("panicked"), "{stderr}");
    Run {
        code: o.status.code(),
        samples: if csv { Vec::new() } else { read_jsonl(&out) },
        summary: read_json(&sum),
        stderr,
    }
}

fn names(v: &Value) -> Vec<String> {
    v.as_array()
        .unwrap_or_else(|| panic!("an array of degradations: {v}"))
        .iter()
        .map(|d| {
            let detail = d["detail"].as_str().unwrap_or_default();
            assert!(!detail.is_empty(), "every entry says why: {d}");
            d["name"].as_str().unwrap_or_default().to_string()
        })
        .collect()
}

/// `name` is in the summary, on one stderr line, and in every sample from the first
/// that has it to the last (an entry never goes away).
fn named(r: &Run, name: &str) {
    assert!(
        names(&r.summary["degraded"]).iter().any(|n| n == name),
        "summary names {name}: {}",
        r.summary["degraded"]
    );
    let line = format!("resource-tracker: degraded: {name}: ");
    assert_eq!(
        r.stderr.lines().filter(|l| l.starts_with(&line)).count(),
        1,
        "{}",
        r.stderr
    );
    if r.samples.is_empty() {
        return;
    }
    let first = r
        .samples
        .iter()
        .position(|s| names(&s["tracker"]["degraded"]).iter().any(|n| n == name))
        .unwrap_or_else(|| panic!("no sample names {name}"));
    for s in &r.samples[first..] {
        assert!(
            names(&s["tracker"]["degraded"]).iter().any(|n| n == name),
            "{name} went away: {}",
            s["tracker"]
        );
    }
}

#[test]
fn a_tree_larger_than_max_tasks_is_named_and_the_run_goes_on() {
    if !ebpf_available() {
        return;
    }
    let s = Scratch::new("maxtasks");
    // 100 sleepers at once in a map of 64 entries.
    let script = format!("{} sleepers 100 1; exit 3", workload().display());
    let r = tracked(&s, &[], &["--max-tasks", "64"], &script, false);
    assert_eq!(r.code, Some(3), "{}", r.stderr);
    assert_eq!(r.summary["backend"], "ebpf");
    let untracked = r.summary["untracked_tasks"].as_u64().unwrap_or(0);
    assert!(untracked > 0, "{}", r.summary);
    named(&r, "map_full");
    // The detail carries the count the kernel kept.
    let d = &r.summary["degraded"][0];
    assert!(
        d["detail"]
            .as_str()
            .is_some_and(|t| t.starts_with(&format!("{untracked} task(s)"))),
        "{d}"
    );
    // A sample names it once its untracked count is above 0.
    for x in &r.samples {
        let has = names(&x["tracker"]["degraded"]).contains(&"map_full".to_string());
        assert_eq!(
            has,
            x["process"]["untracked_tasks"].as_u64().unwrap_or(0) > 0,
            "{}",
            x["process"]
        );
    }
}

#[test]
fn a_full_ring_is_named_in_json_and_csv() {
    if !ebpf_available() {
        return;
    }
    let s = Scratch::new("ringfull");
    // 8 KiB hold ~70 records; 1,000 exits in bursts overflow it.
    let script = format!("{} swarm 1000 500 2 fork; exit 5", workload().display());
    let r = tracked(&s, &[], &["--event-ring-kib", "8"], &script, false);
    assert_eq!(r.code, Some(5), "{}", r.stderr);
    assert!(r.summary["lost_events"].as_u64().unwrap_or(0) > 0);
    assert_eq!(r.summary["processes_spawned"], 1002, "{}", r.summary);
    named(&r, "ring_full");
    // The CSV's column carries the names.
    let s = Scratch::new("ringcsv");
    let r = tracked(&s, &[], &["--event-ring-kib", "8"], &script, true);
    assert_eq!(r.code, Some(5), "{}", r.stderr);
    let text = std::fs::read_to_string(s.path("out")).expect("csv");
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().expect("header").split(',').collect();
    let col = header
        .iter()
        .position(|c| *c == "tracker_degraded")
        .expect("tracker_degraded column");
    let last = lines.last().expect("a row");
    assert!(
        last.split(',')
            .nth(col)
            .is_some_and(|c| c.split(';').any(|n| n == "ring_full")),
        "{last}"
    );
}

/// A copy of this kernel's BTF in which the member names `from` are renamed `to`
/// (same length: the string section keeps its offsets), so the lookups fail as on a
/// kernel built without them.
fn btf_without(s: &Scratch, renames: &[(&str, &str)]) -> std::path::PathBuf {
    let mut data = std::fs::read("/sys/kernel/btf/vmlinux").expect("kernel BTF");
    for (from, to) in renames {
        assert_eq!(from.len(), to.len());
        let needle = format!("\0{from}\0").into_bytes();
        let mut hits = 0;
        let mut i = 0;
        while let Some(p) = data[i..].windows(needle.len()).position(|w| w == needle) {
            let at = i + p + 1;
            data[at..at + to.len()].copy_from_slice(to.as_bytes());
            i = at + to.len();
            hits += 1;
        }
        assert!(hits > 0, "{from} is in the kernel's BTF");
    }
    let p = s.path("vmlinux");
    std::fs::write(&p, data).expect("write BTF");
    p
}

#[test]
fn a_btf_without_task_io_or_on_cpu_is_named() {
    if !ebpf_available() {
        return;
    }
    let s = Scratch::new("btf");
    let btf = btf_without(&s, &[("ioac", "ioaz"), ("on_cpu", "on_cpz")]);
    let script = "dd if=/dev/zero of=/dev/null bs=64k count=16 status=none; exit 7";
    let r = tracked(&s, &[("TRACKER_KERNEL_BTF", &btf)], &[], script, false);
    assert_eq!(r.code, Some(7), "{}", r.stderr);
    assert_eq!(r.summary["backend"], "ebpf", "{}", r.stderr);
    named(&r, "no_task_io");
    named(&r, "no_on_cpu");
    // Named from the first sample on: the layout is known at load.
    for x in &r.samples {
        assert!(
            names(&x["tracker"]["degraded"]).len() >= 2,
            "{}",
            x["tracker"]
        );
    }
    // And said once at start, before any sample.
    assert_eq!(
        r.stderr
            .lines()
            .filter(|l| l.starts_with("resource-tracker: eBPF: no_task_io: "))
            .count(),
        1,
        "{}",
        r.stderr
    );
}

#[test]
fn no_btf_at_all_falls_back_to_procfs_and_names_it() {
    if !ebpf_available() {
        return;
    }
    let s = Scratch::new("nobtf");
    let missing = s.path("no-such-btf");
    let r = tracked(
        &s,
        &[("TRACKER_KERNEL_BTF", &missing)],
        &[],
        "sleep 0.3; exit 4",
        false,
    );
    assert_eq!(r.code, Some(4), "{}", r.stderr);
    assert_eq!(r.summary["backend"], "procfs");
    named(&r, "ebpf_no_btf");
    assert!(!r.samples.is_empty());
    for x in &r.samples {
        assert_eq!(names(&x["tracker"]["degraded"]), ["ebpf_no_btf"]);
    }
}

#[test]
fn an_exact_run_names_nothing() {
    if !ebpf_available() {
        return;
    }
    let s = Scratch::new("exact");
    let r = tracked(&s, &[], &[], "sleep 0.3; exit 2", false);
    assert_eq!(r.code, Some(2), "{}", r.stderr);
    assert_eq!(r.summary["degraded"], Value::Array(Vec::new()));
    assert!(!r.stderr.contains("degraded:"), "{}", r.stderr);
    for x in &r.samples {
        assert_eq!(x["tracker"]["degraded"], Value::Array(Vec::new()));
    }
    // --no-ebpf is the user's choice, not a degradation.
    let s = Scratch::new("noebpf");
    let r = tracked(&s, &[], &["--no-ebpf"], "sleep 0.3", false);
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert_eq!(r.summary["degraded"], Value::Array(Vec::new()));
}

/// A tracker in a memory cgroup too small for the BPF programs' maps (the kernel
/// would make them and then kill the tracker, 137, before the command ran): eBPF is
/// not loaded, which is said in one line naming the cgroup and named in the summary,
/// the command runs on the procfs backend and its exit code is the tracker's.
#[test]
fn a_memory_cgroup_too_small_for_ebpf_is_said_and_the_command_runs() {
    if !e2e::require(
        e2e::is_root() && ebpf_available(),
        "a memory cgroup and eBPF need root",
    ) {
        return;
    }
    let v1 = Path::new("/sys/fs/cgroup/memory");
    let (base, limit_file) = if v1.join("memory.limit_in_bytes").exists() {
        (v1.to_path_buf(), "memory.limit_in_bytes")
    } else {
        (Path::new("/sys/fs/cgroup").to_path_buf(), "memory.max")
    };
    for mib in [3u64, 9] {
        let s = Scratch::new("small-memcg");
        let cg = base.join(format!("rt-test-small-{}-{mib}", std::process::id()));
        std::fs::create_dir(&cg).expect("memory cgroup");
        let limited = std::fs::write(cg.join(limit_file), (mib << 20).to_string());
        assert!(
            limited.is_ok(),
            "{}: {limited:?}",
            cg.join(limit_file).display()
        );
        let ran = s.path("ran");
        let sum = s.path("summary.json");
        let o = run(Command::new("sh")
            .arg("-c")
            .arg(format!(
                "echo $$ > {}/cgroup.procs && exec \"$0\" \"$@\"",
                cg.display()
            ))
            .arg(tracker())
            .args(["run", "-q", "-i", "0.2", "--summary"])
            .arg(&sum)
            .args(["--", "sh", "-c"])
            .arg(format!("echo ran > {}; exit 5", ran.display())));
        let _ = std::fs::remove_dir(&cg);
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert_eq!(o.status.code(), Some(5), "{mib} MiB: {err}");
        assert!(ran.exists(), "{mib} MiB: the command did not run: {err}");
        assert!(
            err.contains("procfs")
                && (err.contains("memory cgroup") || err.contains("allocate memory")),
            "{mib} MiB: {err}"
        );
        let summary = read_json(&sum);
        assert_eq!(summary["backend"], "procfs", "{mib} MiB: {summary}");
        assert!(
            summary["degraded"].to_string().contains("ebpf_load_failed"),
            "{mib} MiB: {}",
            summary["degraded"]
        );
    }
}
