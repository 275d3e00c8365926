//! The summary's `stats` and `recommendation` beside the Python resource-tracker
//! 0.5.0's own code run on the same run's CSV: its `stats()` specs through its
//! TinyDataFrame, Python's `round`, its allocation check's thresholds. Its one unit
//! slip (MiB divided by 1024 again before `round_memory`) is left out on purpose,
//! and so are its memory steps (128, 256, 512, 1024, 2048 MiB: up to twice the
//! peak): ours are finer (docs/schema.md, `recommendation.memory_mib`), written
//! out here in Python.

use std::process::Command;

use serde_json::Value;
use tracker_tests::{
    e2e::{ci, py_peers_python},
    read_json, tracker, workload, Scratch,
};

/// The binary's memory steps (docs/schema.md `recommendation.memory_mib`).
fn round_memory(mib: f64) -> u64 {
    if mib.is_nan() || mib <= 128.0 {
        return 128;
    }
    let step = (2f64.powi(mib.log2().floor() as i32) / 8.0).min(1024.0);
    ((mib / step).ceil() * step) as u64
}

const PY: &str = r#"
import inspect, json, sys
from statistics import mean
from resource_tracker import ResourceTracker
from resource_tracker.tiny_data_frame import TinyDataFrame
import math
def round_memory(mib):
    if not mib > 128:
        return 128
    step = min(2 ** math.floor(math.log2(mib)) / 8, 1024)
    return int(math.ceil(mib / step) * step)
from resource_tracker.column_maps import SERVER_ALLOCATION_CHECKS
csv, interval = sys.argv[1], float(sys.argv[2])
df = TinyDataFrame(csv_file_path=csv)
specs = inspect.signature(ResourceTracker.stats).parameters["specs"].default
st = df.stats(specs)
st["timestamp"]["duration"] += interval
rec = {
    "cpu": max(1, round(st["process_cpu_usage"]["mean"])),
    "memory": round_memory(mib=st["process_memory_mib"]["max"] * 1.2),
}
shared = False
for c in SERVER_ALLOCATION_CHECKS[:2]:
    sysc = "system_" + ("cpu_usage" if c["system_column"] == "cpu_usage" else "memory_used_mib")
    s, p = mean(df[sysc]), mean(df["process_" + c["process_column"]])
    absolute = 512 if c["process_column"] == "memory_mib" else c["absolute"]
    shared = shared or s > p * c["percent"] or s > p + absolute
rec["allocation"] = "shared" if shared else "dedicated"
print(json.dumps({"stats": st, "rec": rec}))
"#;

#[test]
fn stats_and_recommendation_agree_with_the_python_package() {
    let py = py_peers_python();
    if !py.exists() {
        assert!(!ci(), "CI is set but {} is missing", py.display());
        eprintln!(
            "SKIPPED: {} missing (scripts/setup.sh makes it)",
            py.display()
        );
        return;
    }
    let s = Scratch::new("recommend");
    let w = workload().display().to_string();
    let job = format!("{w} burner 1 1500 & {w} memory 300 1 1500; wait");
    let st = Command::new(tracker())
        .args(["-q", "-f", "csv", "-i", "0.5", "-o"])
        .arg(s.path("run.csv"))
        .arg("--summary")
        .arg(s.path("s.json"))
        .args(["--", "/bin/sh", "-c", &job])
        .status()
        .unwrap();
    assert!(st.success());
    let sum = read_json(&s.path("s.json"));
    let o = Command::new(&py)
        .args(["-c", PY])
        .arg(s.path("run.csv"))
        .arg("0.5")
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let py: Value = serde_json::from_slice(&o.stdout).unwrap();
    let ours = &sum["stats"];
    let close = |a: &Value, b: &Value, tol: f64, what: &str| {
        let (a, b) = (
            a.as_f64().unwrap_or(f64::NAN),
            b.as_f64().unwrap_or(f64::NAN),
        );
        assert!((a - b).abs() <= tol, "{what}: ours {a}, Python {b}");
    };
    // The memory max also holds the cgroup's own peak between samples, which the
    // CSV's column cannot show: at least Python's max of the column, at most the
    // run's peak.
    let (m, pm) = (
        ours["process_memory_mib"]["max"]
            .as_f64()
            .unwrap_or(f64::NAN),
        py["stats"]["process_memory_mib"]["max"]
            .as_f64()
            .unwrap_or(f64::NAN),
    );
    let peak = sum["peak_memory_mib"].as_f64().unwrap_or(f64::NAN);
    assert!(
        m >= pm - 0.011 && m <= peak + 0.011,
        "memory max: ours {m}, Python {pm}, the run's peak {peak}"
    );
    for (col, tol, aggs) in [
        ("process_cpu_usage", 0.011, &["mean", "max"][..]),
        ("process_memory_mib", 0.011, &["mean"][..]),
    ] {
        for &agg in aggs {
            close(
                &ours[col][agg],
                &py["stats"][col][agg],
                tol,
                &format!("{col}.{agg}"),
            );
        }
    }
    close(
        &ours["system_disk_space_used_gb"],
        &py["stats"]["system_disk_space_used_gb"]["max"],
        0.011,
        "disk used",
    );
    close(
        &ours["system_net_recv_bytes"],
        &py["stats"]["system_net_recv_bytes"]["sum"],
        0.0,
        "net recv",
    );
    close(
        &ours["system_net_sent_bytes"],
        &py["stats"]["system_net_sent_bytes"]["sum"],
        0.0,
        "net sent",
    );
    // Ours counts the first interval as measured, Python the nominal one (0.5 s):
    // they differ by the timer's lateness, which a busy machine stretches, so the
    // measured one (the first row's `interval_secs`) takes the nominal one's place.
    let csv = std::fs::read_to_string(s.path("run.csv")).unwrap();
    let mut rows = csv.lines();
    let col = rows
        .next()
        .and_then(|h| h.split(',').position(|c| c == "interval_secs"))
        .expect("interval_secs column");
    let first: f64 = rows
        .next()
        .and_then(|r| r.split(',').nth(col)?.parse().ok())
        .expect("the first row's interval");
    let py_duration = py["stats"]["timestamp"]["duration"]
        .as_f64()
        .unwrap_or(f64::NAN);
    close(
        &ours["duration_secs"],
        &serde_json::json!(py_duration - 0.5 + first),
        0.011,
        "duration",
    );
    let rec = &sum["recommendation"];
    assert_eq!(rec["cpu"], py["rec"]["cpu"], "{rec} {}", py["rec"]);
    // Memory departs from the Python package's rule on purpose: it is built on
    // the working set and the page cache the job read back (docs/advice.md), not
    // the charge, so never above the Python rule's answer.
    let basis = ours["process_memory_working_set_mib"]["max"]
        .as_f64()
        .unwrap_or(f64::NAN)
        + ours["page_cache_reread_mib"].as_f64().unwrap_or(f64::NAN);
    assert_eq!(rec["memory_basis"], "working_set", "{rec}");
    assert_eq!(
        rec["memory_mib"].as_u64(),
        Some(round_memory(basis * 1.2)),
        "{rec}"
    );
    assert!(
        rec["memory_mib"].as_u64() <= py["rec"]["memory"].as_u64(),
        "{rec} {}",
        py["rec"]
    );
    assert_eq!(
        rec["allocation"], py["rec"]["allocation"],
        "{rec} {}",
        py["rec"]
    );
    assert_eq!(rec["gpu"], 0);
    // 300 MiB held: the peak × 1.2 is over 360 MiB.
    assert!(rec["memory_mib"].as_u64().unwrap() >= 384, "{rec}");
    eprintln!("ours {ours} {rec}\nPython {}", py);
}
