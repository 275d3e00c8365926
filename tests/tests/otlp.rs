//! OTLP export against a receiver on 127.0.0.1 that decodes every request with
//! the official opentelemetry-proto messages (tests/fixtures/otlp_receiver.py,
//! in the venv scripts/setup.sh makes): the last cumulative figures are the
//! summary's, the resource names the job, the token goes to the endpoint only,
//! and a collector that refuses, hangs or is absent changes neither the exit code
//! nor, past the end's budget, the time.

use std::{
    io::BufRead as _,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;
use tracker_tests::{
    closed_url,
    containers::FakeContainer,
    e2e::{clean_env, is_root, require, Bg},
    ebpf_available,
    python::{fresh_venv, run_fixture_env, wheel},
    read_json, read_jsonl,
    sentinel::{moto_available, moto_python},
    tracker, workload, Scratch,
};

const TOKEN: &str = "Bearer%20otlp-s3cret";

struct Receiver {
    child: Child,
    url: String,
    out: PathBuf,
}

impl Receiver {
    fn start(s: &Scratch, mode: &str) -> Receiver {
        let out = s.path(&format!("otlp-{}.jsonl", mode.replace([':', '/'], "_")));
        let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/otlp_receiver.py");
        let mut child = Command::new(moto_python())
            .arg(script)
            .arg(&out)
            .arg(mode)
            .stdout(Stdio::piped())
            .spawn()
            .expect("the receiver starts");
        let mut line = String::new();
        std::io::BufReader::new(child.stdout.take().expect("stdout"))
            .read_line(&mut line)
            .expect("the receiver's port");
        let port: u16 = line
            .trim()
            .parse()
            .unwrap_or_else(|_| panic!("port: {line:?}"));
        Receiver {
            child,
            url: format!("http://127.0.0.1:{port}"),
            out,
        }
    }

    fn requests(&self) -> Vec<Value> {
        if !self.out.exists() {
            return Vec::new();
        }
        read_jsonl(&self.out)
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

struct Ran {
    code: Option<i32>,
    stderr: String,
    summary: Value,
    wall: Duration,
}

fn track(s: &Scratch, endpoint: &str, extra_env: &[(&str, &str)], args: &[&str], cmd: &str) -> Ran {
    let summary = s.path("summary.json");
    let _ = std::fs::remove_file(&summary);
    let mut c = Command::new(tracker());
    clean_env(&mut c)
        .args([
            "run",
            "-q",
            "-i",
            "0.2",
            "-n",
            "otlp-job",
            "--tag",
            "team=ml",
            "--summary",
        ])
        .arg(&summary)
        .args(args)
        .args(["--", "sh", "-c", cmd])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", endpoint)
        .env("OTEL_METRIC_EXPORT_INTERVAL", "400")
        .env(
            "OTEL_EXPORTER_OTLP_HEADERS",
            format!("authorization={TOKEN}"),
        )
        .env("OTEL_SERVICE_NAME", "otlp-test");
    for (k, v) in extra_env {
        c.env(k, v);
    }
    let t0 = Instant::now();
    let o = c.output().expect("the tracker runs");
    Ran {
        code: o.status.code(),
        stderr: String::from_utf8_lossy(&o.stderr).into_owned(),
        summary: read_json(&summary),
        wall: t0.elapsed(),
    }
}

/// The data points of `name` over every request, in the order sent: (attributes
/// as "k=v" joined, value).
fn points(reqs: &[Value], name: &str) -> Vec<(String, f64)> {
    let mut out = Vec::new();
    for r in reqs {
        assert!(r.get("error").is_none(), "a request did not decode: {r}");
        for rm in r["request"]["resourceMetrics"]
            .as_array()
            .into_iter()
            .flatten()
        {
            for sm in rm["scopeMetrics"].as_array().into_iter().flatten() {
                for m in sm["metrics"].as_array().into_iter().flatten() {
                    if m["name"] != name {
                        continue;
                    }
                    let data = m
                        .get("sum")
                        .or_else(|| m.get("gauge"))
                        .expect("sum or gauge");
                    for dp in data["dataPoints"].as_array().into_iter().flatten() {
                        let attrs = dp["attributes"]
                            .as_array()
                            .into_iter()
                            .flatten()
                            .map(|a| {
                                format!(
                                    "{}={}",
                                    a["key"].as_str().unwrap(),
                                    a["value"]["stringValue"].as_str().unwrap_or("")
                                )
                            })
                            .collect::<Vec<_>>()
                            .join(",");
                        // protobuf's JSON mapping writes int64 as a string.
                        let v = dp
                            .get("asDouble")
                            .and_then(Value::as_f64)
                            .or_else(|| dp.get("asInt").and_then(|i| i.as_str()?.parse().ok()))
                            .unwrap_or(0.0);
                        out.push((attrs, v));
                    }
                }
            }
        }
    }
    out
}

fn last(reqs: &[Value], name: &str, attrs: &str) -> f64 {
    points(reqs, name)
        .into_iter()
        .filter(|(a, _)| a == attrs)
        .map(|(_, v)| v)
        .next_back()
        .unwrap_or_else(|| panic!("no {name} {{{attrs}}} point exported"))
}

/// A resource's attributes as (key, string value).
fn attrs_of(resource: &Value) -> Vec<(String, String)> {
    resource["attributes"]
        .as_array()
        .expect("resource attributes")
        .iter()
        .map(|a| {
            (
                a["key"].as_str().unwrap().to_string(),
                a["value"]["stringValue"].as_str().unwrap_or("").to_string(),
            )
        })
        .collect()
}

fn resource(reqs: &[Value]) -> Vec<(String, String)> {
    attrs_of(&reqs[0]["request"]["resourceMetrics"][0]["resource"])
}

fn workload_cmd() -> String {
    let w = workload();
    let w = w.display();
    format!("for i in $(seq 40); do /bin/true; done; {w} burner 2 700; {w} memory 48 1 400")
}

fn run_exports_the_summarys_figures(no_ebpf: bool) {
    if !moto_available() {
        return;
    }
    let s = Scratch::new(if no_ebpf { "otlp-procfs" } else { "otlp-ebpf" });
    let rx = Receiver::start(&s, "ok");
    let args: &[&str] = if no_ebpf { &["--no-ebpf"] } else { &[] };
    let r = track(&s, &rx.url, &[], args, &workload_cmd());
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let reqs = rx.requests();
    assert!(
        reqs.len() >= 2,
        "{} request(s): the interval is 400 ms",
        reqs.len()
    );
    for q in &reqs {
        assert_eq!(q["path"], "/v1/metrics");
        assert_eq!(q["headers"]["content-encoding"], "gzip");
        assert_eq!(q["headers"]["authorization"], "Bearer otlp-s3cret");
    }
    let sum = &r.summary;
    let cpu = last(&reqs, "process.cpu.time", "");
    let want = sum["cpu_total_secs"].as_f64().unwrap();
    assert!(
        (cpu - want).abs() <= 0.01 * want,
        "process.cpu.time {cpu} against the summary's {want}"
    );
    assert!(want > 1.0, "the burner's 1.4 s of CPU: {want}");
    let spawned = last(&reqs, "resource_tracker.process.spawned", "");
    assert_eq!(
        spawned as u64,
        sum["processes_spawned"].as_u64().unwrap(),
        "spawned"
    );
    let exited = last(&reqs, "resource_tracker.process.exited", "");
    assert_eq!(
        exited as u64,
        sum["processes_exited"].as_u64().unwrap(),
        "exited"
    );
    let peak_mib = sum["peak_memory_mib"].as_f64().unwrap();
    let peak = match sum["memory_source"].as_str() {
        Some("cgroup") => last(&reqs, "resource_tracker.process.memory.peak", ""),
        _ => points(&reqs, "process.memory.usage")
            .into_iter()
            .map(|(_, v)| v)
            .fold(0.0, f64::max),
    } / 1_048_576.0;
    assert!(
        (peak - peak_mib).abs() < 0.01,
        "peak {peak} MiB against the summary's {peak_mib}"
    );
    assert!(peak_mib > 40.0, "the 48 MiB: {peak_mib}");
    let read = last(&reqs, "process.disk.io", "disk.io.direction=read");
    assert_eq!(
        read as u64,
        sum["read_bytes"].as_u64().unwrap(),
        "read bytes"
    );
    let res = resource(&reqs);
    let has = |k: &str, v: &str| res.iter().any(|(a, b)| a == k && b == v);
    assert!(has("service.name", "otlp-test"), "{res:?}");
    assert!(has("resource_tracker.job.job_name", "otlp-job"), "{res:?}");
    assert!(has("resource_tracker.tag.team", "ml"), "{res:?}");
    let o = &sum["otlp"];
    assert_eq!(o["points_dropped"], 0, "{o}");
    assert_eq!(o["requests"].as_u64(), Some(reqs.len() as u64), "{o}");
    let n: usize = reqs
        .iter()
        .map(|q| {
            let mut n = 0;
            for m in q["request"]["resourceMetrics"][0]["scopeMetrics"][0]["metrics"]
                .as_array()
                .unwrap()
            {
                let d = m.get("sum").or_else(|| m.get("gauge")).unwrap();
                n += d["dataPoints"].as_array().unwrap().len();
            }
            n
        })
        .sum();
    assert_eq!(o["points_exported"].as_u64(), Some(n as u64), "{o}");
    assert!(!r.stderr.contains("s3cret"), "{}", r.stderr);
    eprintln!(
        "{}: {} requests, {n} points; cpu {cpu:.4} s (summary {want:.4}), spawned {spawned}, peak {peak:.2} MiB",
        if no_ebpf { "procfs" } else { "ebpf" },
        reqs.len()
    );
}

#[test]
fn run_exports_the_summarys_figures_ebpf() {
    if require(ebpf_available(), "eBPF is not available") {
        run_exports_the_summarys_figures(false);
    }
}

#[test]
fn run_exports_the_summarys_figures_procfs() {
    run_exports_the_summarys_figures(true);
}

/// 503 for ever, an answer that never comes, nothing listening: the command's exit
/// code is kept, the end waits at most its 5 s budget, the loss is counted and
/// said once, and the token is in no line.
#[test]
fn a_refusing_hanging_or_absent_collector_keeps_the_exit_code_and_the_time() {
    if !moto_available() {
        return;
    }
    let s = Scratch::new("otlp-down");
    for mode in ["503", "hang", "absent"] {
        let rx = (mode != "absent").then(|| Receiver::start(&s, mode));
        let url = rx.as_ref().map_or_else(closed_url, |r| r.url.clone());
        let r = track(
            &s,
            &url,
            &[("OTEL_EXPORTER_OTLP_TIMEOUT", "1000")],
            &[],
            "for i in $(seq 10); do /bin/true; done; sleep 1; exit 3",
        );
        assert_eq!(r.code, Some(3), "{mode}: {}", r.stderr);
        // 1 s of command, at most 5 s of end budget, start-up and slack.
        assert!(r.wall < Duration::from_secs(8), "{mode}: {:?}", r.wall);
        let o = &r.summary["otlp"];
        assert!(o["points_dropped"].as_u64().unwrap() > 0, "{mode}: {o}");
        assert_eq!(o["requests"], 0, "{mode}: {o}");
        let lines: Vec<&str> = r.stderr.lines().filter(|l| l.contains("OTLP")).collect();
        assert_eq!(
            lines.len(),
            2,
            "{mode}: the failure once, the loss once: {lines:?}"
        );
        assert!(!r.stderr.contains("s3cret"), "{mode}: {}", r.stderr);
        if let Some(rx) = &rx {
            assert!(
                !rx.requests().is_empty(),
                "{mode}: the receiver saw no request"
            );
        }
        eprintln!("{mode}: exit 3 in {:.2} s; {o}", r.wall.as_secs_f64());
    }
}

/// A partial-success answer: accepted, and its rejected points counted.
#[test]
fn a_partial_success_is_counted() {
    if !moto_available() {
        return;
    }
    let s = Scratch::new("otlp-partial");
    let rx = Receiver::start(&s, "partial:7");
    let r = track(&s, &rx.url, &[], &[], "sleep 1");
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    let n = rx.requests().len() as u64;
    assert!(n >= 1);
    let o = &r.summary["otlp"];
    assert_eq!(o["requests"].as_u64(), Some(n), "{o}");
    assert_eq!(o["points_rejected"].as_u64(), Some(7 * n), "{o}");
}

/// A redirect is not followed: the token stays with the endpoint it was given for.
#[test]
fn a_redirect_takes_no_header_elsewhere() {
    if !moto_available() {
        return;
    }
    let s = Scratch::new("otlp-redirect");
    let other = Receiver::start(&s, "ok");
    let rx = Receiver::start(&s, &format!("redirect:{}/v1/metrics", other.url));
    let r = track(&s, &rx.url, &[], &[], "sleep 0.5");
    assert_eq!(r.code, Some(0), "{}", r.stderr);
    assert!(!rx.requests().is_empty());
    assert!(
        other.requests().is_empty(),
        "the redirect was followed: {:?}",
        other.requests()
    );
    assert!(r.summary["otlp"]["points_dropped"].as_u64().unwrap() > 0);
    assert!(!r.stderr.contains("s3cret"), "{}", r.stderr);
}

/// The Python package passes the variables through: its binary, attached to the
/// interpreter (`--pid`), exports as `run` does.
#[test]
fn the_python_package_exports_through_the_same_variables() {
    let Some(whl) = wheel() else { return };
    if !moto_available() {
        return;
    }
    let s = Scratch::new("otlp-python");
    let rx = Receiver::start(&s, "ok");
    let py = fresh_venv(&s, "plain", &whl, &[]);
    let o = run_fixture_env(
        &py,
        "otlp_run.py",
        &[],
        &s.0,
        &[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", rx.url.as_str()),
            ("OTEL_METRIC_EXPORT_INTERVAL", "300"),
            (
                "OTEL_RESOURCE_ATTRIBUTES",
                "deployment.environment.name=test",
            ),
        ],
    );
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    let sum: Value = serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {err}"));
    let reqs = rx.requests();
    assert!(!reqs.is_empty(), "no request: {err}");
    let spawned = last(&reqs, "resource_tracker.process.spawned", "");
    assert_eq!(
        spawned as u64,
        sum["processes_spawned"].as_u64().unwrap(),
        "{err}"
    );
    let cpu = last(&reqs, "process.cpu.time", "");
    let want = sum["cpu_total_secs"].as_f64().unwrap();
    assert!(
        (cpu - want).abs() <= 0.01 * want.max(0.01),
        "cpu {cpu} against {want}"
    );
    let res = resource(&reqs);
    assert!(
        res.iter()
            .any(|(k, v)| k == "deployment.environment.name" && v == "test"),
        "{res:?}"
    );
    assert!(res.iter().any(|(k, _)| k == "process.pid"), "{res:?}");
    assert_eq!(sum["otlp"]["points_dropped"], 0, "{}", sum["otlp"]);
}

/// The node agent: each container under a resource of its own (its pod's UID and
/// its container id from the cgroup's path), its CPU the cgroup's.
#[test]
fn the_node_exports_each_container_under_its_resource() {
    if !require(is_root(), "the node test makes cgroups and needs root") || !moto_available() {
        return;
    }
    let s = Scratch::new("otlp-node");
    let rx = Receiver::start(&s, "ok");
    let uid = "5e0d1c2b-3a4f-4e5d-8c6b-7a8f9e0d1c2b";
    let id = "5e".repeat(32);
    let mut c = Command::new(tracker());
    clean_env(&mut c)
        .args(["node", "-i", "0.2"])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &rx.url)
        .env("OTEL_METRIC_EXPORT_INTERVAL", "300")
        .env("OTEL_RESOURCE_ATTRIBUTES", "k8s.node.name=node-1")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(s.path("node.err")).unwrap());
    let mut bg = Bg::spawn(&mut c, "node agent");
    let fc = FakeContainer::new(&format!("kubepods/burstable/pod{uid}/{id}"));
    std::thread::sleep(Duration::from_millis(400));
    assert!(fc.run(&["burner", "2", "600"]).success());
    // Two more scans after the work, then the end's flush.
    std::thread::sleep(Duration::from_millis(600));
    let truth = fc.cpu_secs();
    bg.signal(libc::SIGTERM);
    assert!(bg.wait_for(Duration::from_secs(10)).success());
    let err = std::fs::read_to_string(s.path("node.err")).unwrap_or_default();
    let reqs = rx.requests();
    assert!(!reqs.is_empty(), "no request: {err}");
    let mut cpu = None;
    let mut attrs = Vec::new();
    for q in &reqs {
        for rm in q["request"]["resourceMetrics"].as_array().unwrap() {
            let res = attrs_of(&rm["resource"]);
            if !res.iter().any(|(k, v)| k == "container.id" && *v == id) {
                continue;
            }
            let one = serde_json::json!([{ "request": { "resourceMetrics": [rm] } }]);
            let pts = points(one.as_array().unwrap(), "container.cpu.time");
            if let Some((_, v)) = pts.last() {
                cpu = Some(*v);
            }
            attrs = res;
        }
    }
    let cpu = cpu.unwrap_or_else(|| panic!("no container.cpu.time for the container: {err}"));
    assert!(
        (cpu - truth).abs() <= 0.02 * truth,
        "container.cpu.time {cpu} s against the cgroup's {truth} s"
    );
    assert!(truth > 0.8, "the burner's 1.2 s: {truth}");
    let has = |k: &str, v: &str| attrs.iter().any(|(a, b)| a == k && b == v);
    assert!(has("k8s.pod.uid", uid), "{attrs:?}");
    assert!(has("k8s.node.name", "node-1"), "{attrs:?}");
    assert!(has("service.name", "resource-tracker"), "{attrs:?}");
    eprintln!(
        "node: container.cpu.time {cpu:.4} s, cgroup {truth:.4} s; {} requests",
        reqs.len()
    );
}

/// Host-only (no command, no pid): the host's metrics, none of a tree's, until
/// SIGTERM, and the end's flush.
#[test]
fn host_only_exports_the_hosts_metrics() {
    if !moto_available() {
        return;
    }
    let s = Scratch::new("otlp-host");
    let rx = Receiver::start(&s, "ok");
    let mut c = Command::new(tracker());
    clean_env(&mut c)
        .args(["-q", "-i", "0.2"])
        .env("OTEL_EXPORTER_OTLP_ENDPOINT", &rx.url)
        .env("OTEL_METRIC_EXPORT_INTERVAL", "60000")
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(s.path("host.err")).unwrap());
    let mut bg = Bg::spawn(&mut c, "host-only tracker");
    std::thread::sleep(Duration::from_millis(1200));
    bg.signal(libc::SIGTERM);
    assert!(bg.wait_for(Duration::from_secs(10)).success());
    let err = std::fs::read_to_string(s.path("host.err")).unwrap_or_default();
    // The interval is a minute: everything came in the end's one request.
    let reqs = rx.requests();
    assert_eq!(reqs.len(), 1, "{err}");
    let mem = points(&reqs, "system.memory.usage");
    assert!(
        mem.len() >= 4,
        "{} points of system.memory.usage: {err}",
        mem.len()
    );
    assert!(mem
        .iter()
        .all(|(a, v)| a == "system.memory.state=used" && *v > 0.0));
    assert!(!points(&reqs, "system.network.io").is_empty());
    assert!(
        points(&reqs, "process.cpu.time").is_empty(),
        "a tree's metric without a tree"
    );
    let res = resource(&reqs);
    assert!(!res.iter().any(|(k, _)| k == "process.pid"), "{res:?}");
}
