//! Drop-in for users of the Rust sibling, `resource-tracker` 0.1.18 from crates.io
//! (scripts/setup.sh installs it under target/peers/rs): both tools run with the same
//! flags, variables and config files, side by side, and what a user can observe must
//! agree. Then the new fields against the kernel: steal against /proc/stat, the
//! cgroup fields against the tracker's own cgroup.

use std::{
    collections::BTreeSet,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;
use tracker_tests::{
    e2e::{ci, is_root},
    read_jsonl, tracker, workload, Cgroup, Scratch,
};

fn sibling() -> Option<PathBuf> {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../target/peers/rs/bin/resource-tracker");
    if p.exists() {
        return Some(p);
    }
    assert!(
        !ci(),
        "CI is set but {} is missing: run scripts/setup.sh",
        p.display()
    );
    eprintln!(
        "SKIPPED: {} missing (scripts/setup.sh installs it)",
        p.display()
    );
    None
}

/// What a user sees of one run.
#[derive(Debug, Default)]
struct Seen {
    code: Option<i32>,
    /// Samples from the file named by `-o`/`TRACKER_OUTPUT` (whichever exists) or
    /// from the terminal.
    samples: Vec<Value>,
    /// Which of the candidate output files got samples.
    file: Option<String>,
    /// Sample lines on stdout or stderr.
    on_terminal: usize,
    /// Nice value of the tracker's main thread, and of all its threads, once the
    /// command runs.
    nice: Option<i64>,
    thread_nices: Vec<i64>,
    /// Nice value of the command.
    command_nice: Option<i64>,
}

fn nice_of(stat: &str) -> Option<i64> {
    // Field 19; the command name (field 2) may hold spaces, so count after ')'.
    stat.rsplit_once(')')?
        .1
        .split_whitespace()
        .nth(16)?
        .parse()
        .ok()
}

fn read(p: impl AsRef<Path>) -> Option<String> {
    std::fs::read_to_string(p).ok()
}

/// Runs `bin ARGS -- CMD` in `dir` with only `env` of the TRACKER_* variables, and
/// reads the nice values while the command runs.
fn run(bin: &Path, dir: &Path, args: &[&str], env: &[(&str, &str)], cmd: &[&str]) -> Seen {
    let mut c = Command::new(bin);
    c.current_dir(dir).args(args).arg("--").args(cmd);
    for (k, _) in std::env::vars() {
        if k.starts_with("TRACKER_") || k.starts_with("SENTINEL_") {
            c.env_remove(k);
        }
    }
    c.envs(env.iter().copied());
    c.stdout(Stdio::piped()).stderr(Stdio::piped());
    let child = c.spawn().expect("spawn");
    let pid = child.id();
    let mut seen = Seen::default();
    // The command is the tracker's child; the sibling starts it one interval in.
    let t0 = Instant::now();
    while t0.elapsed() < Duration::from_secs(5) {
        let kids = read(format!("/proc/{pid}/task/{pid}/children")).unwrap_or_default();
        if let Some(kid) = kids.split_whitespace().next() {
            // Both renice right after starting the command.
            std::thread::sleep(Duration::from_millis(300));
            seen.nice = read(format!("/proc/{pid}/stat"))
                .as_deref()
                .and_then(nice_of);
            seen.command_nice = read(format!("/proc/{kid}/stat"))
                .as_deref()
                .and_then(nice_of);
            if let Ok(d) = std::fs::read_dir(format!("/proc/{pid}/task")) {
                seen.thread_nices = d
                    .flatten()
                    .filter_map(|t| read(t.path().join("stat")).as_deref().and_then(nice_of))
                    .collect();
            }
            break;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let out = child.wait_with_output().expect("wait");
    seen.code = out.status.code();
    let terminal: Vec<Value> = [&out.stdout, &out.stderr]
        .iter()
        .flat_map(|b| {
            String::from_utf8_lossy(b)
                .lines()
                .map(str::to_string)
                .collect::<Vec<_>>()
        })
        .filter_map(|l| serde_json::from_str::<Value>(&l).ok())
        .filter(|v| v.get("cpu").is_some())
        .collect();
    seen.on_terminal = terminal.len();
    for name in ["flag.jsonl", "env.jsonl", "file.jsonl"] {
        let p = dir.join(name);
        if p.exists() && std::fs::metadata(&p).is_ok_and(|m| m.len() > 0) {
            seen.file = Some(name.into());
            seen.samples = read_jsonl(&p);
        }
    }
    if seen.file.is_none() {
        seen.samples = terminal;
    }
    seen
}

/// Dotted paths of every field (array items as `name[]`).
fn paths(v: &Value, prefix: &str, out: &mut BTreeSet<String>) {
    match v {
        Value::Object(m) => {
            for (k, x) in m {
                let p = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                out.insert(p.clone());
                paths(x, &p, out);
            }
        }
        Value::Array(a) => a.iter().for_each(|x| paths(x, &format!("{prefix}[]"), out)),
        _ => {}
    }
}

#[test]
fn same_json_fields_and_csv_header() {
    let Some(sib) = sibling() else { return };
    let ours = tracker();
    let (a, b) = (Scratch::new("sib-a"), Scratch::new("sib-b"));
    let args = [
        "-i",
        "1",
        "--aggregate-cpu-steal",
        "false",
        "-n",
        "side",
        "-o",
        "flag.jsonl",
    ];
    let cmd = ["sleep", "2.2"];
    let (theirs, mine) = std::thread::scope(|s| {
        let t = s.spawn(|| run(&sib, &a.0, &args, &[], &cmd));
        let m = s.spawn(|| run(&ours, &b.0, &args, &[], &cmd));
        (t.join().unwrap(), m.join().unwrap())
    });
    assert!(
        theirs.samples.len() >= 2 && mine.samples.len() >= 2,
        "{theirs:?} {mine:?}"
    );
    let (mut tp, mut mp) = (BTreeSet::new(), BTreeSet::new());
    theirs.samples.iter().for_each(|v| paths(v, "", &mut tp));
    mine.samples.iter().for_each(|v| paths(v, "", &mut mp));
    let missing: Vec<_> = tp.difference(&mp).collect();
    assert!(missing.is_empty(), "0.1.18 fields we lack: {missing:?}");
    let last = mine.samples.last().unwrap();
    assert_eq!(last["job_name"], "side");
    assert!(last["resource-tracker-version"].is_string());
    assert!(last["tracked_pid"].as_u64().is_some_and(|p| p > 0));

    // CSV: the sibling's 33 columns first, in its order.
    for (bin, d) in [(&sib, &a), (&ours, &b)] {
        let st = Command::new(bin)
            .current_dir(&d.0)
            .args(["-i", "1", "-f", "csv", "-o", "c.csv", "--", "sleep", "1.2"])
            .stderr(Stdio::null())
            .status()
            .unwrap();
        assert!(st.success());
    }
    let header = |d: &Scratch| {
        read(d.path("c.csv"))
            .and_then(|t| t.lines().next().map(str::to_string))
            .unwrap_or_default()
    };
    let (th, mh) = (header(&a), header(&b));
    let tcols: Vec<&str> = th.split(',').collect();
    let mcols: Vec<&str> = mh.split(',').collect();
    assert_eq!(tcols.len(), 33, "{th}");
    assert_eq!(&mcols[..33], &tcols[..], "CSV header prefix");
}

/// One flag/variable/file combination and what it must produce in both tools.
struct Case {
    what: &'static str,
    args: &'static [&'static str],
    env: &'static [(&'static str, &'static str)],
    file: &'static str,
}

const CASES: &[Case] = &[
    Case {
        what: "job name: flag",
        args: &["-n", "flag"],
        env: &[("TRACKER_JOB_NAME", "env")],
        file: "[job]\nname = \"file\"\n",
    },
    Case {
        what: "job name: variable",
        args: &[],
        env: &[("TRACKER_JOB_NAME", "env")],
        file: "[job]\nname = \"file\"\n",
    },
    Case {
        what: "job name: file",
        args: &[],
        env: &[],
        file: "[job]\nname = \"file\"\n",
    },
    Case {
        what: "renice: bare flag",
        args: &["-r"],
        env: &[],
        file: "",
    },
    Case {
        what: "renice: negative flag",
        args: &["--renice", "-5"],
        env: &[],
        file: "",
    },
    Case {
        what: "renice: flag over variable",
        args: &["-r", "3"],
        env: &[("TRACKER_RENICE", "5")],
        file: "",
    },
    Case {
        what: "renice: variable over file",
        args: &[],
        env: &[("TRACKER_RENICE", "5")],
        file: "[tracker]\nrenice = 4\n",
    },
    Case {
        what: "renice: file",
        args: &[],
        env: &[],
        file: "[tracker]\nrenice = 4\n",
    },
    Case {
        what: "steal: default",
        args: &[],
        env: &[],
        file: "",
    },
    Case {
        what: "steal: flag",
        args: &["--aggregate-cpu-steal", "false"],
        env: &[],
        file: "",
    },
    Case {
        what: "steal: flag over variable",
        args: &["--aggregate-cpu-steal", "true"],
        env: &[("TRACKER_AGGREGATE_CPU_STEAL", "false")],
        file: "",
    },
    Case {
        what: "steal: variable over file",
        args: &[],
        env: &[("TRACKER_AGGREGATE_CPU_STEAL", "true")],
        file: "[tracker]\naggregate_cpu_steal = false\n",
    },
    Case {
        what: "steal: file",
        args: &[],
        env: &[],
        file: "[tracker]\naggregate_cpu_steal = false\n",
    },
    Case {
        what: "output: variable",
        args: &[],
        env: &[("TRACKER_OUTPUT", "env.jsonl")],
        file: "",
    },
    Case {
        what: "output: flag over variable",
        args: &["-o", "flag.jsonl"],
        env: &[("TRACKER_OUTPUT", "env.jsonl")],
        file: "",
    },
    Case {
        what: "quiet: variable",
        args: &[],
        env: &[("TRACKER_QUIET", "true")],
        file: "",
    },
    Case {
        what: "quiet: variable false",
        args: &[],
        env: &[("TRACKER_QUIET", "false")],
        file: "",
    },
    Case {
        what: "config file that does not exist",
        args: &["-c", "nowhere.toml"],
        env: &[],
        file: "",
    },
];

/// What a case is judged on: the observations that can differ between cases.
#[derive(Debug, PartialEq)]
struct Observed {
    code: Option<i32>,
    job_name: Option<String>,
    nice: Option<i64>,
    steal_aggregated: Option<bool>,
    file: Option<String>,
    on_terminal: bool,
}

fn observe(s: &Seen) -> Observed {
    let last = s.samples.last();
    Observed {
        code: s.code,
        job_name: last.and_then(|v| v["job_name"].as_str().map(str::to_string)),
        nice: s.nice,
        steal_aggregated: last.and_then(|v| {
            v["cpu"]["per_core_steal_time_pct"]
                .as_array()
                .map(|a| a.is_empty())
        }),
        file: s.file.clone(),
        on_terminal: s.on_terminal > 0,
    }
}

#[test]
fn flags_variables_and_files_resolve_alike() {
    let Some(sib) = sibling() else { return };
    let ours = tracker();
    // Every case in both tools at once: they mostly sleep.
    let results: Vec<(&Case, Seen, Seen)> = std::thread::scope(|s| {
        let handles: Vec<_> = CASES
            .iter()
            .map(|case| {
                let (sib, ours) = (&sib, &ours);
                s.spawn(move || {
                    let go = |bin: &Path, tag: &str| {
                        let d = Scratch::new(tag);
                        let mut args = vec!["-i", "1"];
                        if !case.file.is_empty() {
                            std::fs::write(d.path("rt.toml"), case.file).unwrap();
                            args.extend(["-c", "rt.toml"]);
                        }
                        args.extend(case.args);
                        run(bin, &d.0, &args, case.env, &["sleep", "1.5"])
                    };
                    (case, go(sib, "sib-t"), go(ours, "sib-o"))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    });
    let mut bad = Vec::new();
    for (case, theirs, mine) in &results {
        let (t, m) = (observe(theirs), observe(mine));
        eprintln!("{}: 0.1.18 {t:?} | ours {m:?}", case.what);
        if t != m {
            bad.push(format!("{}: 0.1.18 {t:?}, ours {m:?}", case.what));
        }
        assert!(
            !mine.samples.is_empty()
                || case.what.starts_with("quiet: variable") && !case.what.ends_with("false"),
            "{}: no samples",
            case.what
        );
        // Ours renices every thread, and never the command.
        if let Some(n) = mine.nice {
            assert!(
                mine.thread_nices.iter().all(|&x| x == n),
                "{}: {:?}",
                case.what,
                mine.thread_nices
            );
        }
        assert_eq!(
            mine.command_nice,
            Some(0),
            "{}: the command was reniced",
            case.what
        );
    }
    assert!(
        bad.is_empty(),
        "the two tools disagree:\n{}",
        bad.join("\n")
    );
    // The cases mean something: each setting took more than one value.
    let nices: BTreeSet<_> = results.iter().filter_map(|r| r.2.nice).collect();
    // A negative nice value needs root (or CAP_SYS_NICE); without, both stay at 0.
    let mut want = BTreeSet::from([0, 3, 4, 5, 19]);
    if tracker_tests::e2e::is_root() {
        want.insert(-5);
    }
    assert_eq!(nices, want);
}

fn proc_stat_steal_ticks() -> u64 {
    let s = read("/proc/stat").expect("/proc/stat");
    let line = s.lines().next().expect("cpu line");
    line.split_whitespace()
        .nth(8)
        .and_then(|v| v.parse().ok())
        .expect("steal column")
}

/// Steal is the `cpu` line's steal column, by interval: the sum over the run lies
/// within what /proc/stat counted around it (0 on a host without steal is valid),
/// and each interval's share agrees with its seconds over the interval's ticks.
#[test]
fn steal_time_is_the_kernels() {
    let s = Scratch::new("steal");
    let out = s.path("s.jsonl");
    // SAFETY: sysconf has no preconditions.
    let tck = unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64;
    // One entry per `cpuN` line of /proc/stat, whatever the affinity or quota.
    let cores = read("/proc/stat")
        .unwrap_or_default()
        .lines()
        .filter(|l| l.starts_with("cpu") && !l.starts_with("cpu "))
        .count() as f64;
    let before = proc_stat_steal_ticks();
    let st = Command::new(tracker())
        .args(["-q", "-i", "0.5", "--aggregate-cpu-steal", "false", "-o"])
        .arg(&out)
        .args(["--", "sleep", "3"])
        .status()
        .unwrap();
    let after = proc_stat_steal_ticks();
    assert!(st.success());
    let samples = read_jsonl(&out);
    assert!(samples.len() >= 5, "{}", samples.len());
    let mut sum = 0.0;
    for v in &samples {
        let secs = v["cpu"]["steal_time_secs"]
            .as_f64()
            .expect("steal_time_secs");
        let pct = v["cpu"]["steal_time_pct"].as_f64().expect("steal_time_pct");
        let per_core = v["cpu"]["per_core_steal_time_pct"]
            .as_array()
            .expect("per core");
        assert_eq!(per_core.len() as f64, cores, "{v}");
        assert!(
            (secs * tck - (secs * tck).round()).abs() < 1e-6,
            "whole ticks: {secs}"
        );
        // The share is steal over the interval's tick total, as top's `st`. A guest's
        // steal is charged at ticks, in lumps that can hold time stolen before the
        // interval, so that total lies between the wall span and the span plus the
        // steal charged (two ticks a core either side).
        let span = v["interval_secs"].as_f64().unwrap() * cores;
        let slack = 2.0 * cores / tck;
        assert!((0.0..=100.0).contains(&pct), "{pct}%");
        assert_eq!(pct == 0.0, secs == 0.0, "{pct}% vs {secs}s");
        if secs > 0.0 {
            let total = secs / (pct / 100.0);
            assert!(
                total >= span - slack && total <= span + secs + slack,
                "{pct}% of {secs}s is a tick total of {total}s, not within {span}s..{}s",
                span + secs
            );
        }
        sum += secs;
    }
    let outer = after.saturating_sub(before) as f64 / tck;
    assert!(
        sum <= outer + 1e-9,
        "Σ steal {sum} s > /proc/stat's {outer} s around the run"
    );
    eprintln!("steal: Σ samples {sum:.2} s, /proc/stat around the run {outer:.2} s");
}

/// `cpu.cgroup_*` are the tracker's own cgroup: run inside a fresh cgroup with a
/// burner, the intervals add up to the cgroup's `cpuacct.usage` (less the tracker's
/// start and end, outside the first and last reading), and the cores figure is the
/// seconds over the interval.
#[test]
fn cgroup_fields_are_the_trackers_own_cgroup() {
    if !tracker_tests::e2e::require(is_root(), "the cgroup test needs root") {
        return;
    }
    let cg = Cgroup::new("sib");
    let s = Scratch::new("sibcg");
    let out = s.path("c.jsonl");
    let w = workload();
    let st = Command::new(&w)
        .arg("incgroup")
        .arg(cg.join_arg())
        .arg("--")
        .arg(tracker())
        .args(["-q", "--no-ebpf", "-i", "0.5", "-o"])
        .arg(&out)
        .arg("--")
        .arg(&w)
        .args(["burner", "1", "1500"])
        .status()
        .unwrap();
    assert!(st.success());
    let usage = cg.usage_ns() as f64 / 1e9;
    // SAFETY: sysconf has no preconditions.
    let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) } as f64;
    let samples = read_jsonl(&out);
    let mut sum = 0.0;
    for v in &samples {
        let secs = v["cpu"]["cgroup_usage_secs"]
            .as_f64()
            .expect("cgroup_usage_secs");
        let cores = v["cpu"]["cgroup_utilization_pct"]
            .as_f64()
            .expect("cgroup_utilization_pct");
        let dt = v["interval_secs"].as_f64().unwrap();
        // The cores figure divides by the collector's own reading times, not the
        // sample's stamps. Over a whole interval their skew (a few ms) is within
        // the bound; over the short last one (the root's exit, 10 ms after the
        // sample before, say) a 6 ms skew on a busy host is half the interval
        // (seen: 0.85 cores for 4.0 ms of CPU over an 11 ms interval), so there
        // only the cap at the cores online is checked.
        assert!(
            (0.0..=online).contains(&cores),
            "{cores} cores, {online} online"
        );
        if dt >= 0.25 {
            let want = (secs / dt).min(online);
            assert!(
                (cores - want).abs() <= 0.02 * want + 0.005 / dt,
                "{cores} cores vs {secs} s / {dt} s"
            );
        }
        sum += secs;
    }
    assert!(sum <= usage + 1e-6, "Σ {sum} > cgroup {usage}");
    // The tracker runs in the cgroup too: its start before the first reading and
    // its end after the last are in the cgroup's figure only (33 ms of a debug
    // build on a busy host, seen in CI, past 2 % of 1.5 s).
    assert!(
        sum >= usage * 0.98 - 0.05,
        "Σ {sum} < 98 % of cgroup {usage} less 50 ms"
    );
    // The burner spins for 1.5 s of wall time; on a loaded machine it gets less CPU.
    assert!(usage >= 0.5, "the burner ran in the cgroup: {usage}");
    eprintln!("cgroup: Σ samples {sum:.4} s, cpuacct {usage:.4} s");
}
