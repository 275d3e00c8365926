//! The HTML report, opened in headless Chromium (Debian's) with no network at all:
//! charts drawn, one timeline bar per process of a real swarm, the timeline's CPU
//! against the kernel's accounting of the workload's cgroup, the size goals, the
//! Python package's own CSV read back with its own `stats()`, Keeper through a
//! stand-in server, and bad input.

use std::{
    io::{BufRead, BufReader, Write},
    net::TcpListener,
    path::Path,
    process::{Command, Output},
    sync::{Arc, Mutex},
    time::{Duration, Instant},
};

use serde_json::Value;
use tracker_tests::{
    e2e::{have, is_root, py_peers_python, require},
    ebpf_available, read_json, run, tracker,
    truth::{track_with, Opts},
    workload, Scratch,
};

/// The page's embedded data.
fn page_data(html: &str) -> Value {
    let start = html
        .find("<script id=\"report-data\" type=\"application/json\">")
        .expect("report data")
        + "<script id=\"report-data\" type=\"application/json\">".len();
    let end = start + html[start..].find("</script>").expect("end of data");
    serde_json::from_str(&html[start..end]).expect("report data is JSON")
}

/// The page after its scripts ran, Chromium's stderr and its wall time. Run in a
/// network namespace of its own (no interface but a down loopback): the page must
/// need nothing from the network.
fn open_in_chromium(page: &Path, s: &Scratch) -> (String, String, f64) {
    let profile = s.path(&format!(
        "chromium-profile-{}",
        page.file_name().unwrap().to_string_lossy()
    ));
    let mut c = Command::new("unshare");
    c.args(["-n", "chromium"]).args([
        "--headless",
        "--no-sandbox",
        "--disable-gpu",
        "--disable-quic",
        "--no-first-run",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-sync",
        "--enable-logging=stderr",
        "--v=0",
        "--window-size=1400,1000",
        "--virtual-time-budget=10000",
        "--dump-dom",
    ]);
    c.arg(format!("--user-data-dir={}", profile.display()))
        .arg(format!("file://{}", page.display()));
    let t0 = Instant::now();
    let o = c.output().expect("chromium runs");
    let wall = t0.elapsed().as_secs_f64();
    let dom = String::from_utf8_lossy(&o.stdout).into_owned();
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(o.status.success(), "chromium failed: {err}");
    (dom, err, wall)
}

/// `name="value"` of the first element carrying the attribute.
fn attr<'a>(dom: &'a str, name: &str) -> Option<&'a str> {
    let key = format!("{name}=\"");
    let i = dom.find(&key)? + key.len();
    Some(&dom[i..i + dom[i..].find('"')?])
}

/// Drawn, without an error: the scripts ran to the end and nothing was thrown or
/// logged to the console by the page. Chromium's own pages log there too (on a
/// loaded host: "Slow network is detected…", source `chrome://resources/…`);
/// those are not the report's.
fn assert_rendered(dom: &str, err: &str) {
    assert_eq!(attr(dom, "data-rendered"), Some("1"), "not rendered: {err}");
    assert_eq!(attr(dom, "data-errors"), None, "page errors: {dom}");
    let console: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("CONSOLE") || l.contains("Uncaught"))
        .filter(|l| !l.contains("source: chrome://"))
        .collect();
    assert!(console.is_empty(), "console: {console:?}");
}

fn chromium_ready() -> bool {
    require(
        have("chromium"),
        "chromium is not installed (scripts/setup.sh)",
    ) && require(
        is_root(),
        "the report tests open Chromium in a network namespace (root)",
    )
}

/// A swarm of 2,000 short-lived processes: the page holds one bar per process
/// (the workload's own count), their CPU adds up to the kernel's accounting of the
/// workload's cgroup, the charts are drawn, and the page stays under 2 MB.
#[test]
fn a_swarms_report_has_a_bar_per_process_and_the_kernels_cpu() {
    if !chromium_ready() || !require(ebpf_available(), "eBPF is not available") {
        return;
    }
    let s = Scratch::new("report-swarm");
    let (page, events) = (s.path("swarm.html"), s.path("events.jsonl"));
    let (page_s, events_s) = (page.display().to_string(), events.display().to_string());
    let mut worst: f64 = 0.0;
    for round in 0..2 {
        let t = track_with(&Opts {
            tag: "report-swarm",
            extra: &["--report", &page_s, "--events", &events_s],
            cmd: &["swarm", "2000", "1000", "2", "exec"],
            interval: "0.5",
            ..Opts::default()
        });
        assert_eq!(t.code, 0, "{}", t.stderr);
        let forked = t.workload_out["processes_forked"].as_u64().unwrap();
        let html = std::fs::read_to_string(&page).unwrap();
        assert!(
            html.len() <= 2 << 20,
            "{} processes: the page is {} bytes",
            forked + 2,
            html.len()
        );
        let d = page_data(&html);
        let tl = &d["runs"][0]["timeline"];
        let bars = tl["bars"].as_array().expect("bars");
        // The tracked root (incgroup), the workload it execs into (the same
        // process) and its forks.
        assert_eq!(bars.len() as u64, forked + 1, "bars");
        assert_eq!(tl["processes"].as_u64(), Some(forked + 1));
        assert_eq!(tl["still_running"].as_u64(), Some(0));
        for b in bars {
            let (a, e) = (b["start"].as_f64().unwrap(), b["end"].as_f64().unwrap());
            assert!(e >= a, "bar ends before it starts: {b}");
        }
        // The bars' CPU is each process's final CPU: together the cgroup's, with
        // the root's CPU before it joined (the truth's window) and the rounding of
        // each bar to 4 significant digits.
        let cpu: f64 = bars.iter().map(|b| b["cpu"].as_f64().unwrap()).sum();
        let (lo, hi) = (t.truth_ns as f64 / 1e9, t.truth_hi_ns as f64 / 1e9);
        // Members the run names as freed unread are short by what it says.
        let short = tracker_tests::truth::unread_allowance_secs(&t.summary);
        let off = if cpu < lo {
            (lo - cpu - short).max(0.0) / lo
        } else if cpu > hi {
            (cpu - hi) / hi
        } else {
            0.0
        };
        worst = worst.max(off);
        eprintln!(
            "round {round}: {} bars, Σ cpu {cpu:.4} s, cgroup {lo:.4}–{hi:.4} s, page {} KiB, degraded {}",
            bars.len(),
            html.len() / 1024,
            t.summary["degraded"]
        );
        let (dom, err, wall) = open_in_chromium(&page, &s);
        assert_rendered(&dom, &err);
        // The CLI's hints; the host's disk and network in a card of their own.
        let shown = tracker_tests::e2e::shown_text(&dom);
        assert!(
            shown.contains("run with --discover"),
            "no CLI hint for the cloud"
        );
        assert!(
            !shown.contains("ResourceTracker("),
            "a Python hint in the CLI's page"
        );
        let at = |t: &str| {
            shown
                .find(t)
                .unwrap_or_else(|| panic!("no {t:?} on the page"))
        };
        assert!(at("Usage of the process tree") < at("The host during the run"));
        assert!(at("The host during the run") < at("disk space used"));
        assert_eq!(attr(&dom, "data-bars"), Some(&*bars.len().to_string()));
        assert_eq!(attr(&dom, "data-mode"), Some("command"));
        let charts: usize = attr(&dom, "data-charts").unwrap().parse().unwrap();
        assert!(charts >= 6, "{charts} charts");
        // uPlot draws each chart on a canvas; the timeline has one more.
        assert!(dom.matches("<canvas").count() > charts, "canvases");
        eprintln!(
            "chromium: rendered in {} ms of page time, {wall:.2} s wall with start-up",
            attr(&dom, "data-render-ms").unwrap_or("?")
        );
        // Stats in the page are the summary's.
        assert_eq!(d["runs"][0]["stats"], t.summary["stats"]);
        assert_eq!(d["runs"][0]["recommendation"], t.summary["recommendation"]);
        // The advice's basis, shown as the summary gives it.
        let basis = t.summary["recommendation"]["basis"]
            .as_str()
            .expect("basis");
        assert!(dom.contains(basis), "the page does not show: {basis}");
    }
    assert!(
        worst <= 0.005,
        "Σ bar CPU off the cgroup's by {:.3} %",
        worst * 100.0
    );
}

/// A sample line of a real run, at 1 s, repeated as one hour of samples.
#[test]
fn an_hour_of_samples_stays_under_3_mb_and_opens() {
    if !chromium_ready() {
        return;
    }
    let s = Scratch::new("report-hour");
    let samples = s.path("one.jsonl");
    let o = run(Command::new(tracker())
        .args(["run", "-q", "-i", "0.3", "-o"])
        .arg(&samples)
        .args(["--", "sleep", "1"]));
    assert!(o.status.success());
    let line: Value = serde_json::from_str(
        std::fs::read_to_string(&samples)
            .unwrap()
            .lines()
            .next()
            .unwrap(),
    )
    .unwrap();
    let hour = s.path("hour.jsonl");
    let mut f = std::io::BufWriter::new(std::fs::File::create(&hour).unwrap());
    let t0 = line["timestamp_secs"].as_f64().unwrap();
    for i in 0..3600u32 {
        let mut l = line.clone();
        l["timestamp_secs"] = Value::from(t0 + f64::from(i));
        l["interval_secs"] = Value::from(1.0);
        // Values that change, as a real hour's do.
        l["cpu"]["process_cores_used"] = Value::from(f64::from(i % 97) / 37.0);
        // The recommendation sizes from the tree's memory as the kernel charges it
        // (`memory_mib`); Σ RSS is a field of its own.
        l["process"]["memory_mib"] = Value::from(100.0 + f64::from(i % 211));
        l["process"]["memory_rss_mib"] = Value::from(300.0 + f64::from(i % 211));
        writeln!(f, "{l}").unwrap();
    }
    drop(f);
    let page = s.path("hour.html");
    let o = run(Command::new(tracker())
        .arg("report")
        .arg(&hour)
        .arg("-o")
        .arg(&page));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let size = std::fs::metadata(&page).unwrap().len();
    assert!(size <= 3 << 20, "3,600 samples: {size} bytes");
    let d = page_data(&std::fs::read_to_string(&page).unwrap());
    assert_eq!(d["runs"][0]["samples"], 3600);
    assert_eq!(d["runs"][0]["t"].as_array().unwrap().len(), 3600);
    // Hand-computed: max memory 310 MiB × 1.2 = 372 → 384 MiB; cores 0..96/37,
    // mean over the hour ≈ 1.29 → 1 CPU.
    assert_eq!(d["runs"][0]["recommendation"]["memory_mib"], 384);
    assert_eq!(d["runs"][0]["recommendation"]["cpu"], 1);
    assert_eq!(d["runs"][0]["stats"]["duration_secs"], 3600.0);
    let (dom, err, wall) = open_in_chromium(&page, &s);
    assert_rendered(&dom, &err);
    eprintln!(
        "3,600 samples: page {} KiB, rendered in {} ms of page time, {wall:.2} s wall with start-up",
        size / 1024,
        attr(&dom, "data-render-ms").unwrap_or("?")
    );
}

const PY_TRACK: &str = r#"
import subprocess, sys, time
from resource_tracker import ResourceTracker
csv, interval = sys.argv[1], float(sys.argv[2])
child = subprocess.Popen(sys.argv[3:])
t = ResourceTracker(pid=child.pid, interval=interval, discover_server=False, discover_cloud=False)
t.start()
child.wait()
time.sleep(interval * 1.5)
t.stop()
t.get_combined_metrics().to_csv(csv)
st = t.stats()
import json
print(json.dumps(st))
"#;

/// The Python package tracks a job and writes its CSV; the report reads that CSV,
/// and its statistics are those the package's own `stats()` computes.
#[test]
fn the_python_packages_csv_gives_its_own_stats() {
    let py = py_peers_python();
    if !require(
        py.exists(),
        "the Python resource-tracker venv is missing (scripts/setup.sh)",
    ) {
        return;
    }
    let s = Scratch::new("report-python");
    let csv = s.path("python.csv");
    let w = workload().display().to_string();
    let o = run(Command::new(&py)
        .args(["-c", PY_TRACK])
        .arg(&csv)
        .arg("0.5")
        .args(["/bin/sh", "-c"])
        .arg(format!("{w} burner 1 2500 & {w} memory 200 1 2500; wait")));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    // The workloads print their own lines first; Python's stats are the last.
    let stdout = String::from_utf8_lossy(&o.stdout);
    let want: Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    let page = s.path("python.html");
    let o = run(Command::new(tracker())
        .arg("report")
        .arg(&csv)
        .arg("-o")
        .arg(&page));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let d = page_data(&std::fs::read_to_string(&page).unwrap());
    let rows = std::fs::read_to_string(&csv).unwrap().lines().count() - 1;
    assert_eq!(d["runs"][0]["skipped"], 0, "{}", d["runs"][0]["skips"]);
    assert_eq!(d["runs"][0]["samples"], rows as u64);
    let st = &d["runs"][0]["stats"];
    let f = |v: &Value| v.as_f64().unwrap_or(f64::NAN);
    for (ours, theirs) in [
        ("process_cpu_usage", "process_cpu_usage"),
        ("process_memory_mib", "process_memory_mib"),
        ("process_gpu_usage", "process_gpu_usage"),
        ("process_gpu_vram_mib", "process_gpu_vram_mib"),
        ("process_gpu_utilized", "process_gpu_utilized"),
    ] {
        for agg in ["mean", "max"] {
            let (a, b) = (f(&st[ours][agg]), f(&want[theirs][agg]));
            assert!((a - b).abs() < 0.006, "{ours}.{agg}: ours {a}, Python {b}");
        }
    }
    let (a, b) = (
        f(&st["system_disk_space_used_gb"]),
        f(&want["system_disk_space_used_gb"]["max"]),
    );
    assert!((a - b).abs() < 0.006, "disk used: ours {a}, Python {b}");
    for k in ["system_net_recv_bytes", "system_net_sent_bytes"] {
        assert_eq!(f(&st[k]), f(&want[k]["sum"]), "{k}");
    }
    // Both are the last timestamp − the first + one interval: Python's the
    // interval it was given, ours the first one measured from the timestamps.
    let dur = f(&want["timestamp"]["duration"]);
    let ours = f(&st["duration_secs"]);
    assert!(
        (ours - dur).abs() < 0.02,
        "duration: ours {ours}, Python {dur} over {rows} rows"
    );
    assert!(d["runs"][0]["backend"].as_str().unwrap().contains("Python"));
}

/// Several runs of one job: each its own section, and their statistics and
/// recommendation combined as the Python package does across runs.
#[test]
fn several_runs_combine() {
    let s = Scratch::new("report-runs");
    let w = workload().display().to_string();
    let mut files = Vec::new();
    for (i, mib) in [(0, "100"), (1, "700")] {
        let f = s.path(&format!("run{i}.jsonl"));
        let o = run(Command::new(tracker())
            .args(["run", "-q", "-i", "0.3", "-o"])
            .arg(&f)
            .args(["--", &w, "memory", mib, "1", "800"]));
        assert!(o.status.success());
        files.push(f);
    }
    let page = s.path("runs.html");
    let o = run(Command::new(tracker())
        .arg("report")
        .args(&files)
        .arg("-o")
        .arg(&page));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let d = page_data(&std::fs::read_to_string(&page).unwrap());
    assert_eq!(d["runs"].as_array().unwrap().len(), 2);
    let c = &d["combined"];
    assert_eq!(c["runs"], 2);
    let peak = |r: &Value| r["stats"]["process_memory_mib"]["max"].as_f64().unwrap();
    let (a, b) = (peak(&d["runs"][0]), peak(&d["runs"][1]));
    assert!(a >= 100.0 && (700.0..746.0).contains(&b), "{a} {b}");
    assert_eq!(
        c["stats"]["process_memory_mib"]["max"].as_f64().unwrap(),
        a.max(b)
    );
    // Hand-computed: the larger peak × 1.2 (840–895 MiB) rounds up to 896 MiB.
    assert_eq!(c["recommendation"]["memory_mib"], 896);
    let means = |r: &Value| r["stats"]["process_cpu_usage"]["mean"].as_f64().unwrap();
    let want = (means(&d["runs"][0]) + means(&d["runs"][1])) / 2.0;
    let got = c["stats"]["process_cpu_usage"]["mean"].as_f64().unwrap();
    assert!(
        (got - want).abs() <= 0.006,
        "mean of means: {got} vs {want}"
    );
    // The two in one file, the later run first: the time goes back, and the file
    // is read as two runs, said in one line.
    let both = s.path("both.jsonl");
    let mut text = std::fs::read_to_string(&files[1]).unwrap();
    text.push_str(&std::fs::read_to_string(&files[0]).unwrap());
    std::fs::write(&both, text).unwrap();
    let o = run(Command::new(tracker())
        .arg("report")
        .arg(&both)
        .arg("-o")
        .arg(s.path("both.html")));
    assert!(o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("the time goes back at line"), "{err}");
    let d2 = page_data(&std::fs::read_to_string(s.path("both.html")).unwrap());
    assert_eq!(d2["runs"].as_array().unwrap().len(), 2);
    assert_eq!(d2["combined"]["stats"], c["stats"]);
}

/// A wall-clock step of an hour either way in the middle of a recorded run (the
/// samples' timestamps jump, their intervals, measured on the monotonic clock,
/// do not): `report` reads one run, its duration within 15 % of the run's
/// `wall_secs`, and its time axis without the hour.
#[test]
fn a_wall_clock_step_leaves_one_run_of_its_own_length() {
    let s = Scratch::new("report-step");
    let f = s.path("s.jsonl");
    let sum = s.path("s.json");
    let w = workload().display().to_string();
    let o = run(Command::new(tracker())
        .args(["run", "-q", "-i", "0.2", "-o"])
        .arg(&f)
        .arg("--summary")
        .arg(&sum)
        .args(["--", &w, "burner", "1", "1500"]));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let wall = read_json(&sum)["wall_secs"].as_f64().expect("wall_secs");
    let text = std::fs::read_to_string(&f).unwrap();
    let lines: Vec<Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).expect("a sample"))
        .collect();
    assert!(lines.len() >= 6, "{} samples", lines.len());
    for step in [-3600.0, 3600.0] {
        let stepped: String = lines
            .iter()
            .enumerate()
            .map(|(i, v)| {
                let mut v = v.clone();
                if i >= 3 {
                    let t = v["timestamp_secs"].as_f64().unwrap();
                    v["timestamp_secs"] = serde_json::json!(t + step);
                }
                format!("{v}\n")
            })
            .collect();
        let g = s.path(&format!("stepped{step}.jsonl"));
        std::fs::write(&g, stepped).unwrap();
        let page = s.path(&format!("stepped{step}.html"));
        let o = run(Command::new(tracker())
            .arg("report")
            .arg(&g)
            .arg("-o")
            .arg(&page));
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(o.status.success(), "{err}");
        assert!(!err.contains("the time goes back"), "step {step}: {err}");
        let d = page_data(&std::fs::read_to_string(&page).unwrap());
        assert_eq!(d["runs"].as_array().unwrap().len(), 1, "step {step}: {err}");
        let dur = d["runs"][0]["stats"]["duration_secs"].as_f64().unwrap();
        assert!(
            (dur - wall).abs() <= 0.15 * wall,
            "step {step}: duration {dur} s against wall {wall} s"
        );
        let t = d["runs"][0]["t"].as_array().unwrap();
        let span = t.last().unwrap().as_f64().unwrap() - t[0].as_f64().unwrap();
        assert!(span < wall + 1.0, "step {step}: the axis spans {span} s");
    }
}

/// What the stand-in Keeper was asked, and how it answers.
#[derive(Clone, Copy)]
enum Keeper {
    Answer,
    Status500,
    Silent,
}

/// A Keeper on 127.0.0.1 answering like the real API (`/servers` a list of
/// servers with their cheapest on-demand price, `/server/{vendor}/{id}/prices` a
/// list of prices per region and allocation); it records the request lines and
/// the application header.
/// (request target, X-Application-ID) of each request, in order.
type Requests = Arc<Mutex<Vec<(String, String)>>>;

fn keeper(mode: Keeper) -> (String, Requests) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let url = format!("http://{}", l.local_addr().unwrap());
    let seen = Arc::new(Mutex::new(Vec::new()));
    let log = seen.clone();
    std::thread::spawn(move || {
        for conn in l.incoming() {
            let Ok(mut c) = conn else { continue };
            let mut r = BufReader::new(c.try_clone().unwrap());
            let mut first = String::new();
            let _ = r.read_line(&mut first);
            let mut app = String::new();
            loop {
                let mut h = String::new();
                if r.read_line(&mut h).unwrap_or(0) == 0 || h.trim().is_empty() {
                    break;
                }
                if let Some(v) = h.to_ascii_lowercase().strip_prefix("x-application-id:") {
                    app = v.trim().to_string();
                }
            }
            let target = first.split_whitespace().nth(1).unwrap_or("").to_string();
            log.lock().unwrap().push((target.clone(), app));
            let body = match mode {
                Keeper::Silent => {
                    std::thread::sleep(Duration::from_secs(5));
                    continue;
                }
                Keeper::Status500 => None,
                Keeper::Answer if target.starts_with("/servers?") => Some(
                    r#"[{"vendor_id":"aws","server_id":"t4g.small","name":"t4g.small","api_reference":"t4g.small","display_name":"t4g.small","description":"General purpose","family":"t4g","vcpus":2,"cpu_cores":2,"memory_amount":2048,"gpu_count":0,"gpu_memory_min":null,"gpu_memory_total":null,"storage_size":0,"score":1234.5,"price":0.0168,"min_price":0.0051,"min_price_spot":0.0051,"min_price_ondemand":0.0168,"score_per_price":73482.1,"vendor":{"vendor_id":"aws","name":"Amazon Web Services"}}]"#,
                ),
                Keeper::Answer if target == "/server/aws/m5.large/prices" => Some(
                    r#"[{"vendor_id":"aws","region_id":"eu-west-1","zone_id":"euw1-az1","server_id":"m5.large","operating_system":"Linux","allocation":"ondemand","unit":"hour","price":0.107,"price_upfront":0,"price_tiered":[],"currency":"USD","region":{},"zone":{}},{"vendor_id":"aws","region_id":"us-east-1","zone_id":"use1-az1","server_id":"m5.large","operating_system":"Linux","allocation":"spot","unit":"hour","price":0.035,"price_upfront":0,"price_tiered":[],"currency":"USD","region":{},"zone":{}},{"vendor_id":"aws","region_id":"us-east-1","zone_id":"use1-az1","server_id":"m5.large","operating_system":"Linux","allocation":"ondemand","unit":"hour","price":0.096,"price_upfront":0,"price_tiered":[],"currency":"USD","region":{},"zone":{}}]"#,
                ),
                Keeper::Answer => None,
            };
            let reply = match body {
                Some(b) => format!(
                    "HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: {}\r\nconnection: close\r\n\r\n{b}",
                    b.len()
                ),
                None => "HTTP/1.1 500 Internal Server Error\r\ncontent-length: 0\r\nconnection: close\r\n\r\n".to_string(),
            };
            let _ = c.write_all(reply.as_bytes());
        }
    });
    (url, seen)
}

/// A recorded run with a summary that names an AWS m5.large in us-east-1.
fn recorded_run(s: &Scratch) -> (std::path::PathBuf, std::path::PathBuf) {
    let (samples, summary) = (s.path("run.jsonl"), s.path("run.summary.json"));
    let o = run(Command::new(tracker())
        .args(["run", "-q", "-i", "0.3", "-o"])
        .arg(&samples)
        .arg("--summary")
        .arg(&summary)
        .args(["--", "sleep", "1"]));
    assert!(o.status.success());
    let mut sum = read_json(&summary);
    sum["cloud"] = serde_json::json!({
        "cloud_vendor_id": "aws", "cloud_account_id": null, "cloud_region_id": "us-east-1",
        "cloud_zone_id": null, "cloud_instance_type": "m5.large", "instance_id": null
    });
    std::fs::write(&summary, serde_json::to_string_pretty(&sum).unwrap()).unwrap();
    (samples, summary)
}

fn report_with_keeper(s: &Scratch, url: &str, name: &str) -> (Output, Value, f64) {
    let (samples, summary) = recorded_run(s);
    let page = s.path(name);
    let t0 = Instant::now();
    let o = run(Command::new(tracker())
        .env("TRACKER_KEEPER_URL", url)
        .arg("report")
        .arg(&samples)
        .arg(&summary)
        .arg("--recommend-server")
        .arg("-o")
        .arg(&page));
    let secs = t0.elapsed().as_secs_f64();
    let d = page_data(&std::fs::read_to_string(&page).unwrap());
    (o, d, secs)
}

#[test]
fn keeper_finds_the_cheapest_server_and_the_current_price() {
    let s = Scratch::new("report-keeper");
    let (url, seen) = keeper(Keeper::Answer);
    let (o, d, _) = report_with_keeper(&s, &url, "k.html");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let seen = seen.lock().unwrap().clone();
    // One run of `sleep 1`: 1 CPU, 128 MiB → 0.13 GB (rounded up).
    assert_eq!(
        seen[0],
        (
            "/servers?vcpus_min=1&memory_min=0.13&order_by=min_price_ondemand&order_dir=asc&limit=1"
                .to_string(),
            "resource-tracker".to_string()
        )
    );
    assert_eq!(seen[1].0, "/server/aws/m5.large/prices");
    let sv = &d["server"];
    assert_eq!(sv["server"]["server_id"], "t4g.small");
    assert_eq!(sv["server"]["memory_gib"], 2.0);
    assert_eq!(sv["server"]["price_usd_per_hour"], 0.0168);
    // The region's on-demand Linux price, not the spot one nor another region's.
    assert_eq!(sv["current_price_usd_per_hour"], 0.096);
    let dur = d["runs"][0]["stats"]["duration_secs"].as_f64().unwrap();
    let run_cost = sv["run_cost_usd"].as_f64().unwrap();
    assert!((run_cost - 0.0168 * dur / 3600.0).abs() < 1e-12);
    let want = ((0.096 - 0.0168) / 0.096 * 1e4_f64).round() / 100.0;
    assert_eq!(sv["savings_pct"].as_f64().unwrap(), want);
    assert!(sv["error"].is_null());
}

#[test]
fn keeper_failures_are_one_line_and_the_report_is_written() {
    let s = Scratch::new("report-keeper-fail");
    let (url, _) = keeper(Keeper::Status500);
    let (o, d, _) = report_with_keeper(&s, &url, "500.html");
    assert!(o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    let lines: Vec<&str> = err
        .lines()
        .filter(|l| l.contains("--recommend-server"))
        .collect();
    assert_eq!(lines.len(), 1, "{err}");
    assert!(lines[0].contains("answered 500"), "{err}");
    assert!(d["server"]["server"].is_null());
    assert!(d["server"]["error"].as_str().unwrap().contains("500"));

    let (url, _) = keeper(Keeper::Silent);
    let (o, d, secs) = report_with_keeper(&s, &url, "silent.html");
    assert!(o.status.success());
    assert!(secs < 5.0, "a silent Keeper held the report {secs:.1} s");
    assert!(
        d["server"]["error"]
            .as_str()
            .unwrap()
            .contains("no answer in time"),
        "{}",
        d["server"]
    );

    let (o, d, _) = report_with_keeper(&s, &tracker_tests::closed_url(), "closed.html");
    assert!(o.status.success());
    assert!(d["server"]["error"]
        .as_str()
        .unwrap()
        .contains("no connection"));
    // Without the flag, no request at all.
    let (url, seen) = keeper(Keeper::Answer);
    let (samples, _) = recorded_run(&s);
    let o = run(Command::new(tracker())
        .env("TRACKER_KEEPER_URL", &url)
        .arg("report")
        .arg(&samples)
        .arg("-o")
        .arg(s.path("none.html")));
    assert!(o.status.success());
    assert!(seen.lock().unwrap().is_empty());
}

/// `run --recommend-server` puts Keeper's answer into the summary.
#[test]
fn run_recommends_a_server_in_its_summary() {
    let s = Scratch::new("report-run-keeper");
    let (url, _) = keeper(Keeper::Answer);
    let o = run(Command::new(tracker())
        .env("TRACKER_KEEPER_URL", &url)
        .args(["run", "-q", "-i", "0.3", "--recommend-server", "--summary"])
        .arg(s.path("s.json"))
        .args(["--", "sleep", "0.5"]));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let sum = read_json(&s.path("s.json"));
    assert_eq!(
        sum["recommended_server"]["server"]["server_id"], "t4g.small",
        "{sum}"
    );
}

/// Bad input: a clear line, the documented exit code, and never a half-written
/// page.
#[test]
fn bad_input_is_named_and_leaves_no_half_page() {
    let s = Scratch::new("report-bad");
    let (samples, summary) = recorded_run(&s);
    let good = std::fs::read_to_string(&samples).unwrap();
    let rt = |args: &[&Path]| -> Output {
        let mut c = Command::new(tracker());
        c.arg("report");
        for a in args {
            c.arg(a);
        }
        run(&mut c)
    };
    let err = |o: &Output| String::from_utf8_lossy(&o.stderr).into_owned();

    // Empty: exit 1, no page.
    let empty = s.path("empty.jsonl");
    std::fs::write(&empty, "").unwrap();
    let out = s.path("empty.html");
    let o = rt(&[&empty, Path::new("-o"), &out]);
    assert_eq!(o.status.code(), Some(1), "{}", err(&o));
    assert!(err(&o).contains("no samples in"), "{}", err(&o));
    assert!(!out.exists());

    // Truncated mid-line, with CSV and garbage lines mixed in, a non-UTF-8 byte
    // and a line of 5 MiB: the rest is reported, the page says what it skipped.
    let mut mixed = good.clone().into_bytes();
    mixed.extend_from_slice(b"timestamp,process_cpu_usage\n1,2\n\xff\xfe garbage\n");
    mixed.extend(std::iter::repeat_n(b'x', 5 << 20));
    mixed.push(b'\n');
    let first = good.lines().next().unwrap();
    mixed.extend_from_slice(&first.as_bytes()[..first.len() / 2]);
    let mixed_p = s.path("mixed.jsonl");
    std::fs::write(&mixed_p, &mixed).unwrap();
    let out = s.path("mixed.html");
    let o = rt(&[&mixed_p, Path::new("-o"), &out]);
    assert!(o.status.success(), "{}", err(&o));
    assert!(
        err(&o).contains("5 line(s) could not be read"),
        "{}",
        err(&o)
    );
    let d = page_data(&std::fs::read_to_string(&out).unwrap());
    assert_eq!(d["runs"][0]["skipped"], 5);
    let whys: Vec<&str> = d["runs"][0]["skips"]
        .as_array()
        .unwrap()
        .iter()
        .map(|k| k["why"].as_str().unwrap())
        .collect();
    assert!(
        whys.iter().any(|w| w.contains("longer than 4 MiB")),
        "{whys:?}"
    );
    assert!(whys.iter().any(|w| w.contains("not JSON")), "{whys:?}");

    // A timestamp that parses but is no time (1e308): that line is skipped and
    // named, the others make the page.
    let mut lines: Vec<Value> = good
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let last = lines.len() - 1;
    lines[last]["timestamp_secs"] = serde_json::json!(1e308);
    let far = s.path("far.jsonl");
    std::fs::write(
        &far,
        lines.iter().map(|v| format!("{v}\n")).collect::<String>(),
    )
    .unwrap();
    let out = s.path("far.html");
    let o = rt(&[&far, Path::new("-o"), &out]);
    assert!(o.status.success(), "{}", err(&o));
    let d = page_data(&std::fs::read_to_string(&out).unwrap());
    assert_eq!(d["runs"][0]["skipped"], 1, "{}", err(&o));
    assert!(
        d["runs"][0]["skips"][0]["why"]
            .as_str()
            .is_some_and(|w| w.contains("is not a time")),
        "{}",
        d["runs"][0]["skips"]
    );
    assert!(
        err(&o).contains("1 line(s) could not be read"),
        "{}",
        err(&o)
    );

    // Figures no machine has (1e308 cores, negative memory) as JSON and as CSV:
    // those lines are skipped and named, and the advice is the other lines'.
    let mut lines: Vec<Value> = good
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    lines[1]["cpu"]["process_cores_used"] = serde_json::json!(1e308);
    lines[2]["process"]["memory_mib"] = serde_json::json!(-5.0);
    let huge = s.path("huge.jsonl");
    std::fs::write(
        &huge,
        lines.iter().map(|v| format!("{v}\n")).collect::<String>(),
    )
    .unwrap();
    let out = s.path("huge.html");
    let o = rt(&[&huge, Path::new("-o"), &out]);
    assert!(o.status.success(), "{}", err(&o));
    let d = page_data(&std::fs::read_to_string(&out).unwrap());
    assert_eq!(d["runs"][0]["skipped"], 2, "{}", err(&o));
    let whys = d["runs"][0]["skips"].to_string();
    assert!(
        whys.contains("process_cores_used 1e308 is beyond any machine")
            && whys.contains("process memory_mib -5 is not a measurement"),
        "{whys}"
    );
    let cpu = d["runs"][0]["recommendation"]["cpu"].as_u64().unwrap();
    assert!(cpu <= 8, "cpu={cpu} from a run on this host");
    let csv = s.path("huge.csv");
    std::fs::write(
        &csv,
        "timestamp,process_pid,process_cpu_usage,process_memory\n1,7,0.5,100\n2,7,1e308,100\n3,7,0.5,100\n",
    )
    .unwrap();
    let out = s.path("huge-csv.html");
    let o = rt(&[&csv, Path::new("-o"), &out]);
    assert!(o.status.success(), "{}", err(&o));
    let d = page_data(&std::fs::read_to_string(&out).unwrap());
    assert_eq!(d["runs"][0]["skipped"], 1, "{}", err(&o));
    assert_eq!(d["runs"][0]["recommendation"]["cpu"], 1, "{}", d["runs"][0]);

    // Events with a command name that is not UTF-8, and a CSV with a column this
    // version does not know: read.
    let ev = s.path("ev.jsonl");
    let t = good
        .lines()
        .next()
        .and_then(|l| serde_json::from_str::<Value>(l).ok())
        .unwrap()["timestamp_secs"]
        .as_f64()
        .unwrap();
    let mut evb = b"{\"kind\":\"fork\",\"pid\":9,\"ppid\":1,\"comm\":\"a".to_vec();
    evb.extend_from_slice(b"\xff\xfe");
    evb.extend_from_slice(
        format!("\",\"monotonic_secs\":5.0,\"timestamp_secs\":{t}}}\n").as_bytes(),
    );
    std::fs::write(&ev, &evb).unwrap();
    let out = s.path("ev.html");
    let o = rt(&[&samples, &ev, &summary, Path::new("-o"), &out]);
    assert!(o.status.success(), "{}", err(&o));
    let d = page_data(&std::fs::read_to_string(&out).unwrap());
    assert_eq!(d["runs"][0]["timeline"]["processes"], 1);
    assert!(d["runs"][0]["summary"]["host"].is_object());

    let csv = s.path("extra.csv");
    let o = run(Command::new(tracker())
        .args(["run", "-q", "-f", "csv", "-i", "0.3", "-o"])
        .arg(&csv)
        .args(["--", "sleep", "1"]));
    assert!(o.status.success());
    let text = std::fs::read_to_string(&csv).unwrap();
    let widened: String = text
        .lines()
        .enumerate()
        .map(|(i, l)| {
            if i == 0 {
                format!("{l},a_future_column\n")
            } else {
                format!("{l},7\n")
            }
        })
        .collect();
    std::fs::write(&csv, widened).unwrap();
    let out = s.path("csv.html");
    let o = rt(&[&csv, Path::new("-o"), &out]);
    assert!(o.status.success(), "{}", err(&o));
    let d = page_data(&std::fs::read_to_string(&out).unwrap());
    assert_eq!(d["runs"][0]["skipped"], 0);
    assert!(d["runs"][0]["samples"].as_u64().unwrap() >= 2);

    // A page that cannot be written whole: the device stays, one line, exit 1.
    let o = rt(&[&samples, Path::new("-o"), Path::new("/dev/full")]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        err(&o).contains("writing the report file /dev/full"),
        "{}",
        err(&o)
    );
    assert!(Path::new("/dev/full").exists());
    // A directory that does not exist: said before anything is read.
    let o = rt(&[&samples, Path::new("-o"), &s.path("no/such/dir/r.html")]);
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains("does not exist"), "{}", err(&o));
    // An input that does not exist, and no input at all.
    let o = rt(&[&s.path("missing.jsonl")]);
    assert_eq!(o.status.code(), Some(1));
    assert!(err(&o).contains("missing.jsonl"), "{}", err(&o));
    let o = rt(&[]);
    assert_eq!(o.status.code(), Some(2));
    assert!(!err(&o).contains("panicked"));
}

/// What the samples name as not exact is named on the page, from a live run and
/// from its CSV.
#[test]
fn degradations_reach_the_page() {
    if !require(ebpf_available(), "eBPF is not available") {
        return;
    }
    let s = Scratch::new("report-degraded");
    let (page, csv) = (s.path("d.html"), s.path("d.csv"));
    let o = run(Command::new(tracker())
        .args([
            "run",
            "-q",
            "-i",
            "0.3",
            "--max-tasks",
            "64",
            "-f",
            "csv",
            "-o",
        ])
        .arg(&csv)
        .arg("--report")
        .arg(&page)
        .args([
            "--",
            "sh",
            "-c",
            "for i in $(seq 100); do sleep 1 & done; wait",
        ]));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let d = page_data(&std::fs::read_to_string(&page).unwrap());
    let named = |d: &Value| {
        d["runs"][0]["cost"]["degraded"]
            .as_array()
            .unwrap()
            .iter()
            .any(|x| x.as_str().unwrap().starts_with("map_full"))
    };
    assert!(named(&d), "{}", d["runs"][0]["cost"]);
    assert!(d["runs"][0]["cost"]["untracked_tasks"].as_u64().unwrap() > 0);
    let o = run(Command::new(tracker())
        .arg("report")
        .arg(&csv)
        .arg("-o")
        .arg(s.path("csv.html")));
    assert!(o.status.success());
    let d = page_data(&std::fs::read_to_string(s.path("csv.html")).unwrap());
    assert!(named(&d), "{}", d["runs"][0]["cost"]);
}
