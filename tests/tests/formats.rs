//! The outputs read by independent parsers: `jq` and Python's `json` and `csv`
//! modules, against docs/schema.md (parsed here) and the Python package's 32 column
//! names (hard-coded here from /work/shared/docs/sentinel-protocol.md, so a doc
//! edit cannot silently change them). Also the settings layers end to end through
//! the binary: config file, TRACKER_* variables, flags, tags.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    process::{Command, Output},
};

use serde_json::{json, Value};
use tracker_tests::{e2e::*, *};

/// The Python resource-tracker 0.5.0 "combined" table, in its order, as listed in
/// sentinel-protocol.md ("CSV columns the backend computes statistics from").
const PY_COLUMNS: [&str; 32] = [
    "timestamp",
    "system_processes",
    "system_utime",
    "system_stime",
    "system_cpu_usage",
    "system_memory_free_mib",
    "system_memory_used_mib",
    "system_memory_buffers_mib",
    "system_memory_cached_mib",
    "system_memory_active_mib",
    "system_memory_inactive_mib",
    "system_disk_read_bytes",
    "system_disk_write_bytes",
    "system_disk_space_total_gb",
    "system_disk_space_used_gb",
    "system_disk_space_free_gb",
    "system_net_recv_bytes",
    "system_net_sent_bytes",
    "system_gpu_usage",
    "system_gpu_vram_mib",
    "system_gpu_utilized",
    "process_pid",
    "process_children",
    "process_utime",
    "process_stime",
    "process_cpu_usage",
    "process_memory_mib",
    "process_disk_read_bytes",
    "process_disk_write_bytes",
    "process_gpu_usage",
    "process_gpu_vram_mib",
    "process_gpu_utilized",
];

/// CSV columns holding text, not numbers.
const TEXT_COLUMNS: [&str; 6] = [
    "job_name",
    "process_backend",
    "process_cpu_source",
    "process_memory_source",
    "process_root_alive",
    "tracker_degraded",
];

fn schema_doc() -> String {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("../docs/schema.md");
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()))
}

/// The rows `| `name` | second cell | …` of the section starting with `heading`.
fn doc_table(heading: &str) -> Vec<(String, String)> {
    let doc = schema_doc();
    let start = doc
        .find(heading)
        .unwrap_or_else(|| panic!("{heading} in docs/schema.md"));
    let body = &doc[start + heading.len()..];
    let end = body.find("\n## ").unwrap_or(body.len());
    body[..end]
        .lines()
        .filter_map(|l| {
            let rest = l.strip_prefix("| `")?;
            let (name, rest) = rest.split_once('`')?;
            let second = rest.split('|').nth(1)?.trim().to_string();
            Some((name.to_string(), second))
        })
        .collect()
}

/// The CSV header docs/schema.md documents.
fn doc_csv_columns() -> Vec<String> {
    doc_table("## CSV").into_iter().map(|(n, _)| n).collect()
}

/// Runs the tracker in a scratch working directory with a clean environment.
fn tracker_in(dir: &Path, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(tracker());
    cmd.current_dir(dir).args(args);
    clean_env(&mut cmd);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let o = run(&mut cmd);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "{args:?}: {err}");
    o
}

fn ok(o: &Output) -> String {
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(0), "{err}");
    err
}

fn jq_present() -> bool {
    require(
        have("jq"),
        "jq is not installed (scripts/setup.sh installs it)",
    )
}

/// Python's json module checks every line against the Sample table of
/// docs/schema.md: the exact keys at every level of nesting and each value's type.
const PY_JSON_CHECK: &str = r#"
import json, sys
spec = json.load(open(sys.argv[1]))
TYPES = {"number": (int, float), "integer": (int,), "string": (str,),
         "boolean": (bool,), "array": (list,), "object": (dict,)}
errors = []
def type_ok(v, t):
    alts = t.split("/")
    if v is None:
        return "null" in alts
    if isinstance(v, bool):
        return "boolean" in alts
    return any(isinstance(v, TYPES[a]) for a in alts if a in TYPES)
def check(v, path, where):
    t = spec.get(path, "object")
    if not type_ok(v, t):
        errors.append(f"{where}: {path or '<top>'} is {type(v).__name__}, documented {t}")
        return
    if isinstance(v, dict):
        prefix = path + "." if path else ""
        kids = {k[len(prefix):] for k in spec if k.startswith(prefix)
                and "." not in k[len(prefix):] and "[" not in k[len(prefix):]}
        if not kids:
            return  # a free-form object (gpu[].detail)
        if set(v) != kids:
            errors.append(f"{where}: {path or '<top>'} keys: extra {sorted(set(v) - kids)}, missing {sorted(kids - set(v))}")
        for k, x in v.items():
            if k in kids:
                check(x, prefix + k, where)
    elif isinstance(v, list):
        elem = path + "[]"
        if any(k.startswith(elem + ".") for k in spec):
            for x in v:
                check(x, elem, where)
n = 0
tops = set()
for i, line in enumerate(open(sys.argv[2])):
    o = json.loads(line)
    tops |= set(o)
    check(o, "", f"line {i + 1}")
    n += 1
print(json.dumps({"lines": n, "errors": errors[:20], "top": sorted(tops)}))
"#;

/// Python's csv module reads the file: header, every row as a dict, and the cells
/// that are neither empty nor parsed by float() outside the text columns.
const PY_CSV_READ: &str = r#"
import csv, json, sys
text = set(sys.argv[2].split(","))
with open(sys.argv[1], newline="") as f:
    r = csv.DictReader(f)
    rows = list(r)
    header = r.fieldnames
bad = []
for i, row in enumerate(rows):
    if None in row or any(v is None for v in row.values()):
        bad.append(f"row {i + 2}: wrong number of cells")
    for k, v in row.items():
        if k in text or k is None or v in ("", None):
            continue
        try:
            float(v)
        except ValueError:
            bad.append(f"row {i + 2}: {k}={v!r}")
print(json.dumps({"header": header, "rows": rows, "bad": bad}))
"#;

fn python(script: &str, args: &[&str]) -> Value {
    let out = sh_out(Command::new("python3").arg("-c").arg(script).args(args));
    serde_json::from_str(&out).unwrap_or_else(|e| panic!("python said {out}: {e}"))
}

/// The documented sample fields and their types, for PY_JSON_CHECK.
fn sample_spec(dir: &Path) -> PathBuf {
    let table = doc_table("## Sample");
    assert!(
        table.len() > 50,
        "Sample table parsed: {} rows",
        table.len()
    );
    let spec: BTreeMap<String, String> = table.into_iter().collect();
    let p = dir.join("spec.json");
    std::fs::write(&p, serde_json::to_string(&spec).expect("json")).expect("write spec");
    p
}

#[test]
fn json_lines_read_by_jq_and_python() {
    let s = Scratch::new("fmt-json");
    let out = s.path("tree.jsonl");
    let o = tracker_in(
        &s.0,
        &[
            "-q",
            "-i",
            "0.2",
            "-o",
            out.to_str().expect("utf-8"),
            "--",
            "sh",
            "-c",
            "sleep 1",
        ],
        &[],
    );
    ok(&o);
    let n = line_count(&out);
    assert!(n >= 5, "{n} samples");
    if jq_present() {
        // One result per line: jq -e alone would only judge the last one.
        let cond = r#".cpu.utilization_pct >= 0 and (.gpu|type=="array") and (.memory.total_mib > 0) and (.process.pid > 0)"#;
        let res = sh_out(Command::new("jq").arg("-c").arg(cond).arg(&out));
        let lines: Vec<&str> = res.lines().collect();
        assert_eq!(lines.len(), n, "{res}");
        assert!(lines.iter().all(|l| *l == "true"), "{res}");
        let all = format!("[.[] | {cond}] | all and length == {n}");
        let o = run(Command::new("jq").args(["-e", "-s", &all]).arg(&out));
        assert!(
            o.status.success(),
            "jq -e -s: {}",
            String::from_utf8_lossy(&o.stdout)
        );
    }
    let spec = sample_spec(&s.0);
    let r = python(
        PY_JSON_CHECK,
        &[spec.to_str().expect("utf-8"), out.to_str().expect("utf-8")],
    );
    assert_eq!(r["lines"].as_u64(), Some(n as u64), "{r}");
    assert_eq!(r["errors"], json!([]), "{r}");
    assert_eq!(
        r["top"],
        json!([
            "actual_interval_ms",
            "cpu",
            "disk",
            "gpu",
            "interval_secs",
            "job_name",
            "memory",
            "network",
            "process",
            "resource-tracker-version",
            "timestamp_secs",
            "tracked_pid",
            "tracker"
        ]),
    );
    // Host-wide JSON too: process is null there, which the check accepts.
    let host = s.path("host.jsonl");
    let t = HostTracker::start(&s.0, "hostjson", &["-i", "0.2"]);
    t.wait_samples(2, std::time::Duration::from_secs(20));
    let run = t.finish_json();
    std::fs::write(
        &host,
        run.samples
            .iter()
            .map(|v| v.to_string() + "\n")
            .collect::<String>(),
    )
    .expect("write");
    assert!(run.samples.iter().all(|x| x["process"].is_null()));
    let r = python(
        PY_JSON_CHECK,
        &[spec.to_str().expect("utf-8"), host.to_str().expect("utf-8")],
    );
    assert_eq!(r["errors"], json!([]), "{r}");
}

/// Reads a CSV output with Python and checks the header and the numeric cells.
fn read_csv(p: &Path) -> Vec<BTreeMap<String, String>> {
    let r = python(
        PY_CSV_READ,
        &[p.to_str().expect("utf-8"), &TEXT_COLUMNS.join(",")],
    );
    let header: Vec<String> = r["header"]
        .as_array()
        .expect("header")
        .iter()
        .map(|v| v.as_str().expect("name").to_string())
        .collect();
    // The first 32: exactly the Python package's names in its order (hard-coded);
    // then exactly what docs/schema.md documents, ours after the 32.
    assert_eq!(header[..32], PY_COLUMNS.map(String::from), "Python columns");
    assert_eq!(header, doc_csv_columns(), "docs/schema.md CSV table");
    assert_eq!(
        r["bad"],
        json!([]),
        "cells that are not numbers: {}",
        r["bad"]
    );
    serde_json::from_value(r["rows"].clone()).expect("rows")
}

#[test]
fn csv_read_by_python() {
    // The doc's own list starts with the same 32.
    let doc = doc_csv_columns();
    assert_eq!(doc[..32], PY_COLUMNS.map(String::from), "docs/schema.md");
    let s = Scratch::new("fmt-csv");
    let tree = s.path("tree.csv");
    let o = tracker_in(
        &s.0,
        &[
            "-q",
            "-f",
            "csv",
            "-i",
            "0.2",
            "--job-name",
            "comma, \"quote\"",
            "-o",
            tree.to_str().expect("utf-8"),
            "--",
            "sh",
            "-c",
            "sleep 1",
        ],
        &[],
    );
    ok(&o);
    let rows = read_csv(&tree);
    assert!(rows.len() >= 5, "{} rows", rows.len());
    for r in &rows {
        // A tree is tracked: its pid is filled, and the text cells round-trip.
        assert!(
            r["process_pid"].parse::<u32>().is_ok_and(|p| p > 0),
            "{r:?}"
        );
        assert_eq!(r["job_name"], "comma, \"quote\"");
        assert!(["ebpf", "procfs"].contains(&r["process_backend"].as_str()));
        assert!(["true", "false"].contains(&r["process_root_alive"].as_str()));
        for c in [
            "timestamp",
            "system_cpu_usage",
            "system_memory_free_mib",
            "interval_secs",
        ] {
            assert!(!r[c].is_empty(), "{c} empty: {r:?}");
        }
    }
    assert_eq!(rows.last().expect("row")["process_root_alive"], "false");

    // Host-wide: the process cells are empty, the system ones filled.
    let t = HostTracker::start(&s.0, "hostcsv", &["-f", "csv", "-i", "0.2"]);
    // Header + 3 rows.
    t.wait_samples(4, std::time::Duration::from_secs(20));
    let out = t.out.clone();
    let (st, err) = t.stop(libc::SIGINT);
    assert_eq!(st.code(), Some(0), "{err}");
    let rows = read_csv(&out);
    assert!(rows.len() >= 3);
    for r in &rows {
        for c in doc.iter().filter(|c| c.starts_with("process_")) {
            assert_eq!(r[c.as_str()], "", "{c} for host-wide: {r:?}");
        }
        assert_eq!(r["job_name"], "");
        for c in [
            "system_processes",
            "system_utime",
            "system_memory_used_mib",
            "system_disk_space_total_gb",
        ] {
            assert!(r[c].parse::<f64>().is_ok(), "{c}: {r:?}");
        }
    }
}

/// The job object of a summary file.
fn job(p: &Path) -> Value {
    read_json(p)["job"].clone()
}

const META: [(&str, &str, &str); 11] = [
    ("job_name", "TRACKER_JOB_NAME", "--job-name"),
    ("project_name", "TRACKER_PROJECT_NAME", "--project-name"),
    ("stage_name", "TRACKER_STAGE_NAME", "--stage-name"),
    ("task_name", "TRACKER_TASK_NAME", "--task-name"),
    ("team", "TRACKER_TEAM", "--team"),
    ("env", "TRACKER_ENV", "--env"),
    ("language", "TRACKER_LANGUAGE", "--language"),
    ("orchestrator", "TRACKER_ORCHESTRATOR", "--orchestrator"),
    ("executor", "TRACKER_EXECUTOR", "--executor"),
    (
        "external_run_id",
        "TRACKER_EXTERNAL_RUN_ID",
        "--external-run-id",
    ),
    (
        "container_image",
        "TRACKER_CONTAINER_IMAGE",
        "--container-image",
    ),
];

#[test]
fn every_metadata_variable_and_flag_reaches_the_summary() {
    let s = Scratch::new("fmt-meta");
    let sum = s.path("s.json");
    let sum_s = sum.to_str().expect("utf-8");
    let env: Vec<(&str, String)> = META
        .iter()
        .map(|(f, v, _)| (*v, format!("env {f}")))
        .collect();
    let env_ref: Vec<(&str, &str)> = env.iter().map(|(k, v)| (*k, v.as_str())).collect();
    ok(&tracker_in(
        &s.0,
        &["-q", "--summary", sum_s, "--", "true"],
        &env_ref,
    ));
    let j = job(&sum);
    for (f, _, _) in META {
        assert_eq!(j[f], format!("env {f}"), "{f}: {j}");
    }
    assert_eq!(j["tags"], json!({}));
    let mut args: Vec<String> = vec!["-q".into(), "--summary".into(), sum_s.into()];
    for (f, _, flag) in META {
        args.push(flag.into());
        args.push(format!("flag {f}"));
    }
    args.extend(["--".into(), "true".into()]);
    let a: Vec<&str> = args.iter().map(String::as_str).collect();
    // Flags beat the variables, field by field.
    ok(&tracker_in(&s.0, &a, &env_ref));
    let j = job(&sum);
    for (f, _, _) in META {
        assert_eq!(j[f], format!("flag {f}"), "{f}: {j}");
    }
    // Nothing set: all null.
    ok(&tracker_in(
        &s.0,
        &["-q", "--summary", sum_s, "--", "true"],
        &[],
    ));
    let j = job(&sum);
    for (f, _, _) in META {
        assert!(j[f].is_null(), "{f}: {j}");
    }
}

#[test]
fn config_file_then_environment_then_flags() {
    let s = Scratch::new("fmt-cfg");
    let cfg_out = s.path("cfg-out.csv");
    let cfg = s.path("c.toml");
    std::fs::write(
        &cfg,
        format!(
            "[job]\nname = \"cfg-job\"\nteam = \"cfg-team\"\nproject_name = \"cfg-project\"\n\
             tags = {{ origin = \"file\", keep = \"file\" }}\n\
             [tracker]\ninterval_secs = 0.25\nformat = \"csv\"\noutput = \"{}\"\nquiet = true\n",
            cfg_out.display()
        ),
    )
    .expect("config");
    let c = cfg.to_str().expect("utf-8");
    let sum = s.path("s.json");
    let sum_s = sum.to_str().expect("utf-8");
    let tree = ["--", "sh", "-c", "sleep 1.2"];

    // The file alone: CSV (format), to its output, quiet, every 0.25 s.
    let mut a = vec!["-c", c, "--summary", sum_s];
    a.extend(tree);
    let err = ok(&tracker_in(&s.0, &a, &[]));
    assert_eq!(err, "", "quiet = true: nothing on the terminal");
    let rows = read_csv(&cfg_out);
    let iv: Vec<f64> = rows[..rows.len() - 1]
        .iter()
        .map(|r| r["interval_secs"].parse().expect("interval"))
        .collect();
    // Median within 20 % of 0.25 s (scheduling on a shared machine).
    let med = median(&iv);
    assert!((0.2..=0.3).contains(&med), "interval from the file: {iv:?}");
    assert!(rows.iter().all(|r| r["job_name"] == "cfg-job"));
    let j = job(&sum);
    assert_eq!(j["job_name"], "cfg-job");
    assert_eq!(j["team"], "cfg-team");
    assert_eq!(j["project_name"], "cfg-project");
    assert_eq!(j["tags"], json!({"origin": "file", "keep": "file"}));
    assert!(j["stage_name"].is_null(), "{j}");

    // The environment beats the file, field by field.
    let env = [
        ("TRACKER_JOB_NAME", "env-job"),
        ("TRACKER_TEAM", "env-team"),
    ];
    ok(&tracker_in(&s.0, &a, &env));
    let rows = read_csv(&cfg_out);
    assert!(rows.iter().all(|r| r["job_name"] == "env-job"));
    let j = job(&sum);
    assert_eq!(j["job_name"], "env-job");
    assert_eq!(j["team"], "env-team");
    assert_eq!(
        j["project_name"], "cfg-project",
        "the file still fills the rest"
    );

    // Flags beat both: JSON, another file, 0.5 s, a job name, tags key by key
    // (a value may hold '=' and spaces).
    let jsonl = s.path("flags.jsonl");
    let mut a = vec![
        "-c",
        c,
        "--summary",
        sum_s,
        "--job-name",
        "flag-job",
        "-f",
        "json",
        "-i",
        "0.5",
        "-o",
        jsonl.to_str().expect("utf-8"),
        "--tag",
        "origin=cli",
        "--tag",
        "extra=a=b c",
    ];
    a.extend(tree);
    ok(&tracker_in(&s.0, &a, &env));
    let samples = read_jsonl(&jsonl);
    assert!(samples.len() >= 2, "{}", samples.len());
    assert!(samples.iter().all(|x| x["job_name"] == "flag-job"));
    let full: Vec<f64> = samples[..samples.len() - 1]
        .iter()
        .map(|x| num(x, "/interval_secs"))
        .collect();
    assert!(
        full.iter().all(|i| (0.4..=0.6).contains(i)),
        "-i 0.5: {full:?}"
    );
    let j = job(&sum);
    assert_eq!(j["job_name"], "flag-job");
    assert_eq!(j["team"], "env-team");
    assert_eq!(j["project_name"], "cfg-project");
    assert_eq!(
        j["tags"],
        json!({"origin": "cli", "keep": "file", "extra": "a=b c"})
    );

    // Without -c, resource-tracker.toml of the working directory is read.
    std::fs::write(
        s.path("resource-tracker.toml"),
        "[job]\nname = \"default-file\"\n",
    )
    .expect("default config");
    ok(&tracker_in(
        &s.0,
        &["-q", "--summary", sum_s, "--", "true"],
        &[],
    ));
    assert_eq!(job(&sum)["job_name"], "default-file");
}

#[test]
fn terminal_output_and_quiet() {
    let s = Scratch::new("fmt-quiet");
    // Default: samples as JSON lines on stderr, then the summary lines.
    let err = ok(&tracker_in(&s.0, &["-i", "0.2", "--", "sleep", "0.5"], &[]));
    let samples: Vec<Value> = err
        .lines()
        .filter(|l| l.starts_with('{'))
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect();
    assert!(samples.len() >= 2, "samples on stderr: {err}");
    assert!(samples.iter().all(|x| x["timestamp_secs"].is_number()));
    assert!(err.lines().any(|l| !l.starts_with('{')), "a summary: {err}");
    assert!(
        err.contains("resource-tracker: recommended 1 CPU, 128 MiB memory"),
        "the recommendation line: {err}"
    );
    // -q: nothing on the terminal (the eBPF fallback notice aside, where eBPF is
    // not available).
    let err = ok(&tracker_in(
        &s.0,
        &["-q", "-i", "0.2", "--", "sleep", "0.5"],
        &[],
    ));
    let rest: Vec<&str> = err
        .lines()
        .filter(|l| !l.contains("falling back"))
        .collect();
    assert!(rest.is_empty(), "-q printed {err}");
    // -q with -o: the file is still written.
    let f = s.path("q.jsonl");
    ok(&tracker_in(
        &s.0,
        &[
            "-q",
            "-i",
            "0.2",
            "-o",
            f.to_str().expect("utf-8"),
            "--",
            "sleep",
            "0.5",
        ],
        &[],
    ));
    assert!(read_jsonl(&f).len() >= 2);
}
