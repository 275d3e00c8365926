//! `resource-tracker node` against containers simulated with real cgroups, named as
//! the kubelet names them (both drivers), holding real workloads: what it exports
//! must equal each cgroup's own counters; a container that goes stops being
//! exported; an OOM kill is seen; bad input gets a line, never a crash.

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    path::Path,
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use tracker_tests::{
    containers::FakeContainer,
    e2e::{is_root, require, Bg},
    free_port, read_jsonl, tracker, workload, Scratch,
};

/// GET `path` from 127.0.0.1:port: (status code, body).
fn get(port: u16, path: &str, accept: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nAccept: {accept}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let code = out.split(' ').nth(1)?.parse().ok()?;
    let body = out.split_once("\r\n\r\n")?.1.to_string();
    Some((code, body))
}

fn agent(dir: &Path, port: u16, interval: &str) -> Bg {
    let mut c = Command::new(tracker());
    c.args([
        "node",
        "--listen",
        &format!("127.0.0.1:{port}"),
        "-i",
        interval,
        "-o",
    ])
    .arg(dir.join("node.jsonl"))
    .stdout(Stdio::null())
    .stderr(std::fs::File::create(dir.join("node.err")).unwrap());
    let bg = Bg::spawn(&mut c, "node agent");
    let t0 = Instant::now();
    while get(port, "/healthz", "*/*").map(|r| r.0) != Some(200) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the agent never answered /healthz"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    bg
}

/// The value of `metric` for the series whose labels contain `label`.
fn value(text: &str, metric: &str, label: &str) -> Option<f64> {
    text.lines()
        .filter(|l| l.starts_with(&format!("{metric}{{")) && l.contains(label))
        .find_map(|l| l.rsplit_once(' ')?.1.parse().ok())
}

const UID1: &str = "6a1f0c8e-2b3d-4e5f-9a0b-1c2d3e4f5a6b";
const UID2: &str = "7b2e1d9f-3c4e-4f6a-8b1c-2d3e4f5a6b7c";
const UID3: &str = "8c3f2e0a-4d5f-4a7b-9c2d-3e4f5a6b7c8d";

fn cid(n: u8) -> String {
    format!("{n:02x}").repeat(32)
}

#[test]
fn containers_are_the_kernels_figures() {
    if !require(is_root(), "the node tests make cgroups and need root") {
        return;
    }
    let s = Scratch::new("node");
    let port = free_port();
    let mut bg = agent(&s.0, port, "0.2");
    // Both drivers and every QoS class.
    let c1 = FakeContainer::new(&format!("kubepods/burstable/pod{UID1}/{}", cid(1)));
    let c2 = FakeContainer::new(&format!(
        "kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{}.slice/cri-containerd-{}.scope",
        UID2.replace('-', "_"),
        cid(2)
    ));
    let c3 = FakeContainer::new(&format!("kubepods/pod{UID3}/{}", cid(3)));
    // The OOM victim: 64 MiB asked for under a 32 MiB limit.
    let mem = c3
        .dir("memory")
        .cloned()
        .unwrap_or_else(|| c3.dirs[0].clone());
    let limit_file = if mem.join("memory.limit_in_bytes").exists() {
        "memory.limit_in_bytes"
    } else {
        "memory.max"
    };
    std::fs::write(mem.join(limit_file), "33554432").unwrap();
    let _ = std::fs::write(mem.join("memory.swappiness"), "0");
    std::thread::scope(|sc| {
        sc.spawn(|| c1.run(&["burner", "1", "1200"]));
        sc.spawn(|| c2.run(&["burner", "2", "600"]));
        sc.spawn(|| c3.run(&["memory", "64", "1", "200"]));
    });
    // Three more intervals, so that the last reading follows the workloads' end.
    std::thread::sleep(Duration::from_millis(700));
    let (code, text) = get(port, "/metrics", "*/*").expect("scrape");
    assert_eq!(code, 200);
    let (_, om) = get(
        port,
        "/metrics",
        "application/openmetrics-text;version=1.0.0",
    )
    .unwrap();
    assert!(om.ends_with("# EOF\n"), "OpenMetrics on request");
    for (c, id, uid, qos) in [
        (&c1, cid(1), UID1, "burstable"),
        (&c2, cid(2), UID2, "besteffort"),
        (&c3, cid(3), UID3, "guaranteed"),
    ] {
        let label = format!("pod_uid=\"{uid}\",container_id=\"{id}\",qos=\"{qos}\"");
        let got = value(
            &text,
            "resource_tracker_container_cpu_usage_seconds_total",
            &label,
        )
        .unwrap_or_else(|| panic!("no CPU series for {label}:\n{text}"));
        let truth = c.cpu_secs();
        assert!(
            (got - truth).abs() <= 0.01 * truth.max(0.01),
            "{qos}: exported {got} s, cgroup {truth} s"
        );
        eprintln!("{qos}: exported {got:.4} s, cgroup {truth:.4} s");
        assert!(value(
            &text,
            "resource_tracker_container_memory_working_set_bytes",
            &label
        )
        .is_some());
    }
    let label3 = format!("container_id=\"{}\"", cid(3));
    let kills = value(&text, "resource_tracker_container_oom_kills_total", &label3).unwrap_or(0.0);
    assert!(kills >= 1.0, "the OOM kill was not seen:\n{text}");
    // ... and, from eBPF, whom it killed.
    let victims = value(
        &text,
        "resource_tracker_container_oom_victims_total",
        &format!("{label3},qos=\"guaranteed\",namespace=\"\",pod=\"\",container=\"\",image=\"\",command=\"workload\""),
    )
    .unwrap_or(0.0);
    assert_eq!(victims, kills, "OOM victims by command:\n{text}");
    bg.signal(libc::SIGTERM);
    assert!(bg.wait_for(Duration::from_secs(5)).success());

    // The JSON lines: one per container per interval, adding up to the exported total.
    let lines = read_jsonl(&s.path("node.jsonl"));
    let id1 = cid(1);
    let mine: Vec<_> = lines
        .iter()
        .filter(|v| v["container_id"].as_str() == Some(id1.as_str()))
        .collect();
    assert!(mine.len() >= 5, "{} samples", mine.len());
    let first = mine[0];
    let last = mine[mine.len() - 1];
    let baseline = first["cpu_secs_total"].as_f64().unwrap() - first["cpu_secs"].as_f64().unwrap();
    let sum: f64 = mine.iter().map(|v| v["cpu_secs"].as_f64().unwrap()).sum();
    let total = last["cpu_secs_total"].as_f64().unwrap();
    assert!(
        (sum - (total - baseline)).abs() < 1e-6,
        "{sum} vs {total} − {baseline}"
    );
    assert!((total - c1.cpu_secs()).abs() <= 0.01 * c1.cpu_secs());
    assert_eq!(last["pod_uid"], UID1);
    assert_eq!(last["qos"], "burstable");
}

/// 500 containers that come and go: none is left in the export, and the agent's
/// memory does not grow with them.
#[test]
fn churn_leaves_no_series_and_no_memory() {
    if !require(is_root(), "the node tests make cgroups and need root") {
        return;
    }
    let s = Scratch::new("nodechurn");
    let port = free_port();
    let mut bg = agent(&s.0, port, "0.1");
    // Read from outside, not from the agent's own figure.
    let pid = bg.pid();
    let rss = |_: &str| -> Option<f64> {
        let s = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
        let kb: f64 = s
            .lines()
            .find_map(|l| l.strip_prefix("VmRSS:"))?
            .split_whitespace()
            .next()?
            .parse()
            .ok()?;
        Some(kb * 1024.0)
    };
    // This test's containers only (another agent's test may have some of its own).
    let ours = |text: &str| {
        text.lines()
            .filter(|l| {
                l.starts_with("resource_tracker_container_cpu_usage_seconds_total{")
                    && l.contains("-4000-8c4e-")
            })
            .count()
    };
    // The agent's inotify watches (fdinfo lists one line per watch): a removed
    // cgroup's own watch gets no event from the cgroup file system, so the agent
    // must drop it itself.
    let watches = || -> usize {
        let Ok(rd) = std::fs::read_dir(format!("/proc/{pid}/fdinfo")) else {
            return 0;
        };
        rd.flatten()
            .filter_map(|e| std::fs::read_to_string(e.path()).ok())
            .map(|t| t.lines().filter(|l| l.starts_with("inotify wd:")).count())
            .sum()
    };
    // Warm up with a first wave, then measure across the rest.
    let mut before = None;
    let mut watched = 0;
    let mut peak = 0usize;
    for wave in 0..10 {
        let batch: Vec<FakeContainer> = (0..50)
            .map(|i| {
                let uid = format!("{:08x}-0000-4000-8c4e-{:012x}", wave, i);
                FakeContainer::new(&format!(
                    "kubepods/besteffort/pod{uid}/{:064x}",
                    wave * 1000 + i
                ))
            })
            .collect();
        std::thread::sleep(Duration::from_millis(250));
        let (_, text) = get(port, "/metrics", "*/*").unwrap();
        peak = peak.max(ours(&text));
        drop(batch);
        if wave == 0 {
            std::thread::sleep(Duration::from_millis(300));
            before = get(port, "/metrics", "*/*").and_then(|(_, t)| rss(&t));
            watched = watches();
        }
    }
    std::thread::sleep(Duration::from_millis(400));
    let (_, text) = get(port, "/metrics", "*/*").unwrap();
    assert!(
        peak >= 40,
        "the containers were seen while they lived: {peak}"
    );
    assert_eq!(ours(&text), 0, "{text}");
    // 450 pods came and went after the first count; other tests' pods may add a few.
    let left = watches();
    assert!(
        watched > 0 && left <= watched + 25,
        "inotify watches {watched} after the first wave, {left} at the end"
    );
    let (b, a) = (before.unwrap(), rss(&text).unwrap());
    assert!(
        a <= b + 2.0 * 1048576.0,
        "agent RSS grew from {b} to {a} bytes"
    );
    eprintln!(
        "churn: peak {peak} series; agent RSS {:.1} → {:.1} MiB; watches {watched} → {left}",
        b / 1048576.0,
        a / 1048576.0
    );
    bg.signal(libc::SIGTERM);
    assert!(bg.wait_for(Duration::from_secs(5)).success());
}

/// The agent lists a pod's directory again only when its link count changes or a
/// container under it vanished (collect/containers.rs): a container added to a
/// pod, and one removed and another made at once (the count as it was), show in
/// the next scans, not at the every-30th-scan relisting (15 s here).
#[test]
fn a_container_replaced_within_an_interval_is_seen() {
    if !require(is_root(), "the node tests make cgroups and need root") {
        return;
    }
    let s = Scratch::new("nodereplace");
    let port = free_port();
    let mut bg = agent(&s.0, port, "0.5");
    const UID4: &str = "9d4a3f1b-5e6a-4b8c-8d3e-4f5a6b7c8d9e";
    let pod = format!("kubepods/burstable/pod{UID4}");
    // The pod made apart, so that removing a container removes its directory only.
    let _pod = FakeContainer::new(&pod);
    let shown = |id: &str| {
        get(port, "/metrics", "*/*")
            .is_some_and(|(_, t)| t.contains(&format!("container_id=\"{id}\"")))
    };
    let within = |what: &str, ok: &dyn Fn() -> bool| {
        let t0 = Instant::now();
        while !ok() {
            assert!(
                t0.elapsed() < Duration::from_secs(4),
                "{what}: not within 4 s\n{}",
                get(port, "/metrics", "*/*")
                    .map(|r| r.1)
                    .unwrap_or_default()
            );
            std::thread::sleep(Duration::from_millis(100));
        }
        t0.elapsed()
    };
    let a = FakeContainer::new(&format!("{pod}/{}", cid(7)));
    within("the first container", &|| shown(&cid(7)));
    let _b = FakeContainer::new(&format!("{pod}/{}", cid(8)));
    let added = within("a second one in the pod", &|| shown(&cid(8)));
    drop(a);
    let _c = FakeContainer::new(&format!("{pod}/{}", cid(9)));
    let replaced = within("a replacement", &|| shown(&cid(9)) && !shown(&cid(7)));
    eprintln!("added seen after {added:?}, replacement after {replaced:?}");
    bg.signal(libc::SIGTERM);
    assert!(bg.wait_for(Duration::from_secs(5)).success());
}

/// Bad input: one line each, never a panic; a busy port or a flood of idle
/// connections does not stop the sampling.
#[test]
fn bad_input_and_a_flood() {
    let s = Scratch::new("nodebad");
    for (args, needle) in [
        (vec!["node", "--listen", "nonsense"], "--listen"),
        (vec!["node", "--host-sys", "/nonexistent"], "/nonexistent"),
        (vec!["node", "-i", "0"], "--interval"),
        (vec!["node", "--include", "/abs"], "--include"),
        (
            vec!["node", "--kubelet-url", "http://10.0.0.1:10250"],
            "in clear",
        ),
        (vec!["node", "--kubelet-url", "ftp://x"], "--kubelet-url"),
        (
            vec![
                "node",
                "--kubelet-url",
                "https://x",
                "--kubelet-token-file",
                "/nonexistent",
            ],
            "/nonexistent",
        ),
    ] {
        let o = Command::new(tracker()).args(&args).output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains(needle) && err.trim().lines().count() == 1 && !err.contains("panicked"),
            "{args:?}: {err}"
        );
    }
    // A CA file that holds no certificate is refused at start, not at the first
    // request to the kubelet.
    std::fs::write(s.path("bad.pem"), "not a certificate\n").unwrap();
    for ca in [s.path("bad.pem"), "/dev/zero".into()] {
        let o = Command::new(tracker())
            .args(["node", "--kubelet-url", "https://x", "--kubelet-ca-file"])
            .arg(&ca)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{}: {err}", ca.display());
        assert!(
            err.contains("--kubelet-ca-file") && err.trim().lines().count() == 1,
            "{err}"
        );
    }
    if !require(is_root(), "the node tests need root") {
        return;
    }
    // The port is taken: an agent without its endpoint would look dead to its
    // probes; it ends at once, exit 1, in one line naming the address.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = taken.local_addr().unwrap().port();
    let _c = FakeContainer::new(&format!("kubepods/besteffort/pod{UID1}/{}", cid(9)));
    let mut c = Command::new(tracker());
    c.args([
        "node",
        "--listen",
        &format!("127.0.0.1:{port}"),
        "-i",
        "0.1",
        "-o",
    ])
    .arg(s.path("busy.jsonl"))
    .stderr(std::fs::File::create(s.path("busy.err")).unwrap());
    let mut bg = Bg::spawn(&mut c, "node agent");
    assert_eq!(bg.wait_for(Duration::from_secs(5)).code(), Some(1));
    let err = std::fs::read_to_string(s.path("busy.err")).unwrap();
    assert!(
        err.contains(&format!("127.0.0.1:{port}")) && err.trim().lines().count() == 1,
        "{err}"
    );
    drop(taken);

    // The output file on a full disk: one line names it and the private file the
    // scans go on in, which gets them; the endpoint is unaffected.
    let disk = s.path("disk");
    std::fs::create_dir(&disk).unwrap();
    let st = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=16k", "tmpfs"])
        .arg(&disk)
        .status()
        .expect("mount");
    assert!(st.success(), "mount a tmpfs on {}", disk.display());
    let tmp = s.path("tmp");
    std::fs::create_dir(&tmp).unwrap();
    let mut c = Command::new(tracker());
    c.args(["node", "--no-ebpf", "-i", "0.1", "-o"])
        .arg(disk.join("node.jsonl"))
        .env("TMPDIR", &tmp)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(s.path("full.err")).unwrap());
    let mut bg = Bg::spawn(&mut c, "node agent");
    {
        // What the disk has left is filled once the file exists.
        let t0 = Instant::now();
        while !disk.join("node.jsonl").exists() && t0.elapsed() < Duration::from_secs(5) {
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut f = std::fs::File::create(disk.join("filler")).unwrap();
        while f.write_all(&[0u8; 1024]).is_ok() {}
    }
    let t0 = Instant::now();
    let kept = loop {
        let err = std::fs::read_to_string(s.path("full.err")).unwrap_or_default();
        if let Some((_, p)) = err.lines().find_map(|l| l.split_once("; continued in ")) {
            break std::path::PathBuf::from(p.trim());
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "no fallback said: {err}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    std::thread::sleep(Duration::from_millis(500));
    bg.signal(libc::SIGTERM);
    assert_eq!(bg.wait_for(Duration::from_secs(5)).code(), Some(0));
    let err = std::fs::read_to_string(s.path("full.err")).unwrap();
    assert!(
        err.lines()
            .filter(|l| l.contains("node.jsonl"))
            .all(|l| l.contains("No space left on device")),
        "{err}"
    );
    assert!(kept.starts_with(&tmp), "{}", kept.display());
    assert!(
        !read_jsonl(&kept).is_empty(),
        "scans kept in {}",
        kept.display()
    );
    let _ = Command::new("umount").arg(&disk).status();

    // 40 idle connections that never send a request: /healthz answers within 2 s
    // all the while, sampling goes on, and the agent says where it serves and
    // when it stops.
    let port = free_port();
    let mut bg = agent(&s.0, port, "0.1");
    let idle: Vec<TcpStream> = (0..40)
        .filter_map(|_| TcpStream::connect(("127.0.0.1", port)).ok())
        .collect();
    assert_eq!(idle.len(), 40);
    let n0 = read_jsonl(&s.path("node.jsonl")).len();
    let mut worst = Duration::ZERO;
    for _ in 0..10 {
        let t0 = Instant::now();
        let (code, _) = get(port, "/healthz", "*/*").expect("/healthz under idle clients");
        assert_eq!(code, 200);
        worst = worst.max(t0.elapsed());
        std::thread::sleep(Duration::from_millis(300));
    }
    eprintln!("/healthz with 40 idle clients: slowest of 10 in {worst:?}");
    assert!(worst < Duration::from_secs(2), "/healthz took {worst:?}");
    assert!(
        read_jsonl(&s.path("node.jsonl")).len() > n0,
        "sampling stopped under the idle clients"
    );
    // A client that never sent anything has been closed by its read deadline.
    let mut first = &idle[0];
    first
        .set_read_timeout(Some(Duration::from_secs(5)))
        .unwrap();
    let mut b = [0u8; 1];
    assert_eq!(first.read(&mut b).ok(), Some(0), "an idle client is closed");
    drop(idle);
    assert_eq!(get(port, "/nope", "*/*").map(|r| r.0), Some(404));
    let mut raw = TcpStream::connect(("127.0.0.1", port)).unwrap();
    raw.write_all(b"POST /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut out = String::new();
    let _ = raw.read_to_string(&mut out);
    assert!(out.starts_with("HTTP/1.1 405"), "{out}");
    bg.signal(libc::SIGTERM);
    assert!(bg.wait_for(Duration::from_secs(5)).success());
    let err = std::fs::read_to_string(s.path("node.err")).unwrap();
    assert!(
        err.contains(&format!(
            "serving /metrics and /healthz on http://127.0.0.1:{port}"
        )) && err.contains("stopped by SIGTERM"),
        "{err}"
    );
}

/// A real Prometheus (Debian's package) with `config`, ready: it and its web port.
fn prometheus(s: &Scratch, config: &str) -> (Bg, u16) {
    let web = free_port();
    std::fs::write(s.path("prometheus.yml"), config).unwrap();
    let prom = Bg::spawn(
        Command::new("prometheus")
            .arg(format!(
                "--config.file={}",
                s.path("prometheus.yml").display()
            ))
            .arg(format!("--storage.tsdb.path={}", s.path("tsdb").display()))
            .arg(format!("--web.listen-address=127.0.0.1:{web}"))
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(s.path("prometheus.log")).unwrap()),
        "prometheus",
    );
    let t0 = Instant::now();
    while get(web, "/-/ready", "*/*").map(|r| r.0) != Some(200) {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "prometheus never got ready: {}",
            std::fs::read_to_string(s.path("prometheus.log")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(200));
    }
    (prom, web)
}

/// The result vector of an instant query, or None (said, with the targets).
fn prom_query(web: u16, q: &str) -> Option<Vec<serde_json::Value>> {
    let enc: String = q
        .bytes()
        .map(|b| match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' => (b as char).to_string(),
            _ => format!("%{b:02X}"),
        })
        .collect();
    let (_, body) = get(web, &format!("/api/v1/query?query={enc}"), "*/*")?;
    let v: serde_json::Value = serde_json::from_str(&body).ok()?;
    let got = v["data"]["result"]
        .as_array()
        .filter(|r| !r.is_empty())
        .cloned();
    if got.is_none() {
        let targets = get(web, "/api/v1/targets", "*/*").map(|t| t.1);
        eprintln!("prometheus answered {q}: {body}; targets: {targets:?}");
    }
    got
}

/// A real Prometheus (Debian's package) scrapes the agent; its HTTP API gives the
/// container's CPU rate while a burner runs and, once it is done, the cgroup's own
/// total. `promtool check metrics` accepts the exposition with containers in it.
#[test]
fn prometheus_scrapes_it() {
    if !require(is_root(), "the node tests make cgroups and need root")
        || !require(
            tracker_tests::e2e::have("prometheus") && tracker_tests::e2e::have("promtool"),
            "prometheus and promtool (Debian's prometheus package; scripts/setup.sh installs it) are missing",
        )
    {
        return;
    }
    let s = Scratch::new("nodeprom");
    let port = free_port();
    let mut bg = agent(&s.0, port, "0.5");
    let id = cid(7);
    let c = FakeContainer::new(&format!("kubepods/burstable/pod{UID2}/{id}"));
    let (mut prom, web) = prometheus(
        &s,
        &format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: node\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n"
        ),
    );
    let query = |q: &str| -> Option<f64> {
        prom_query(web, q)?[0]["value"][1]
            .as_str()
            .and_then(|x| x.parse().ok())
    };
    // Scraping before the burn starts (static targets reach the scraper within
    // its 5 s discovery update).
    let t0 = Instant::now();
    while query("up{job=\"node\"}") != Some(1.0) {
        assert!(
            t0.elapsed() < Duration::from_secs(20),
            "prometheus never scraped the agent"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    std::thread::scope(|sc| {
        let burn = sc.spawn(|| c.run(&["burner", "1", "6000"]));
        std::thread::sleep(Duration::from_millis(2500));
        let (_, text) = get(port, "/metrics", "*/*").unwrap();
        assert!(text.contains(&id));
        let mut check = Command::new("promtool")
            .args(["check", "metrics"])
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        check
            .stdin
            .take()
            .unwrap()
            .write_all(text.as_bytes())
            .unwrap();
        let out = check.wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "promtool check metrics: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        std::thread::sleep(Duration::from_millis(2500));
        let rate = query(&format!(
            "rate(resource_tracker_container_cpu_usage_seconds_total{{container_id=\"{id}\"}}[4s])"
        ))
        .expect("a rate from Prometheus");
        assert!(
            (0.3..=1.05).contains(&rate),
            "CPU rate {rate} for one burning thread"
        );
        eprintln!("prometheus: rate {rate:.3} cores while burning");
        burn.join().unwrap();
    });
    // Three scrapes after the end: Prometheus holds the cgroup's final total.
    std::thread::sleep(Duration::from_millis(3500));
    let total = query(&format!(
        "resource_tracker_container_cpu_usage_seconds_total{{container_id=\"{id}\"}}"
    ))
    .expect("a total");
    let truth = c.cpu_secs();
    assert!(
        (total - truth).abs() <= 0.01 * truth,
        "Prometheus {total} s, cgroup {truth} s"
    );
    eprintln!("prometheus: total {total:.4} s, cgroup {truth:.4} s");
    prom.signal(libc::SIGTERM);
    prom.wait_for(Duration::from_secs(10));
    bg.signal(libc::SIGTERM);
    assert!(bg.wait_for(Duration::from_secs(5)).success());
}

/// A stand-in kubelet answering `/pods` as the real one does (a PodList, the
/// bearer token required), or with `body` whatever the token.
fn kubelet(body: Option<&'static str>) -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    std::thread::spawn(move || {
        for s in l.incoming().flatten() {
            let mut c = tracker_tests::http::Conn::new(s);
            while let Ok(Some(h)) = c.read_request() {
                let list = format!(
                    r#"{{"kind":"PodList","apiVersion":"v1","metadata":{{}},"items":[{{"metadata":{{"name":"web-0","namespace":"shop","uid":"{UID1}"}},"spec":{{}},"status":{{"phase":"Running","containerStatuses":[{{"name":"app","image":"nginx:1.27","containerID":"containerd://{}","ready":true}}]}}}}]}}"#,
                    cid(4)
                );
                let (code, text) = match body {
                    Some(b) => (200, b.to_string()),
                    None if h.path() != "/pods" => (404, "404 page not found".into()),
                    None if h.header("authorization") != Some("Bearer tok") => {
                        (401, "Unauthorized".into())
                    }
                    None => (200, list),
                };
                let _ = c.write(&tracker_tests::http::response(
                    code,
                    &[("content-type", "application/json")],
                    text.as_bytes(),
                    false,
                ));
            }
        }
    });
    port
}

/// Names from the kubelet become the namespace, pod, container and image labels
/// (the token is sent, never shown); a kubelet answering garbage costs one line and
/// the containers keep their ids.
#[test]
fn names_from_a_kubelet() {
    if !require(is_root(), "the node tests make cgroups and need root") {
        return;
    }
    let s = Scratch::new("nodenames");
    std::fs::write(s.path("token"), "tok\n").unwrap();
    let c = FakeContainer::new(&format!("kubepods/burstable/pod{UID1}/{}", cid(4)));
    for (body, named) in [(None, true), (Some("<html>oops</html>"), false)] {
        let kport = kubelet(body);
        let port = free_port();
        let mut cmd = Command::new(tracker());
        cmd.args([
            "node",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "-i",
            "0.2",
        ])
        .args([
            "--kubelet-url",
            &format!("http://127.0.0.1:{kport}"),
            "--kubelet-token-file",
        ])
        .arg(s.path("token"))
        .stderr(std::fs::File::create(s.path("err")).unwrap());
        let mut bg = Bg::spawn(&mut cmd, "node agent");
        let t0 = Instant::now();
        let text = loop {
            let text = get(port, "/metrics", "*/*")
                .map(|r| r.1)
                .unwrap_or_default();
            if (named && text.contains("pod=\"web-0\""))
                || (!named && t0.elapsed() > Duration::from_secs(2))
            {
                break text;
            }
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "never named:\n{text}"
            );
            std::thread::sleep(Duration::from_millis(100));
        };
        let id = cid(4);
        let series = text
            .lines()
            .find(|l| {
                l.starts_with("resource_tracker_container_cpu_usage_seconds_total{")
                    && l.contains(&id)
            })
            .unwrap_or_else(|| panic!("no series for the container:\n{text}"))
            .to_string();
        if named {
            for want in [
                "namespace=\"shop\"",
                "pod=\"web-0\"",
                "container=\"app\"",
                "image=\"nginx:1.27\"",
                &format!("pod_uid=\"{UID1}\""),
            ] {
                assert!(series.contains(want), "{want} missing: {series}");
            }
        } else {
            assert!(
                series.contains("pod=\"\"") && series.contains(&format!("pod_uid=\"{UID1}\"")),
                "{series}"
            );
        }
        assert!(!text.contains("tok"), "the token is exported");
        bg.signal(libc::SIGTERM);
        assert!(bg.wait_for(Duration::from_secs(5)).success());
        let all = std::fs::read_to_string(s.path("err")).unwrap();
        assert!(!all.contains("tok"), "{all}");
        // Beside the lines that say where it serves and that it stopped.
        let err: String = all
            .lines()
            .filter(|l| !l.starts_with("resource-tracker: node: "))
            .map(|l| format!("{l}\n"))
            .collect();
        assert_eq!(all.lines().count() - err.lines().count(), 2, "{all}");
        if named {
            assert!(err.trim().is_empty(), "{err}");
        } else {
            assert!(
                err.contains("kubelet") && err.trim().lines().count() == 1,
                "{err}"
            );
        }
    }
    drop(c);
}

/// The process life cycle per container, from the node's BPF programs, exact:
/// a swarm's processes, a non-zero exit and a kill by signal, each in its own
/// container.
#[test]
fn process_life_cycle_per_container() {
    if !require(
        is_root() && std::path::Path::new("/sys/kernel/btf/vmlinux").exists(),
        "the node's BPF programs need root and kernel BTF",
    ) {
        return;
    }
    let s = Scratch::new("nodelife");
    let port = free_port();
    let mut bg = agent(&s.0, port, "0.2");
    let (_, text) = get(port, "/metrics", "*/*").unwrap();
    assert!(
        text.contains("resource_tracker_ebpf 1"),
        "eBPF did not load:\n{}",
        std::fs::read_to_string(s.path("node.err")).unwrap_or_default()
    );
    let swarm = FakeContainer::new(&format!("kubepods/besteffort/pod{UID2}/{}", cid(5)));
    let bad = FakeContainer::new(&format!("kubepods/besteffort/pod{UID3}/{}", cid(6)));
    // Let the agent match both before anything runs in them.
    std::thread::sleep(Duration::from_millis(500));
    // --pre: the CPU the joining process used before it joined (it is the swarm's
    // root, and its whole CPU counts for the cgroup it is freed in).
    let pre = s.path("pre");
    let st = Command::new(workload())
        .arg("incgroup")
        .arg(swarm.join_arg())
        .arg("--pre")
        .arg(&pre)
        .arg("--")
        .arg(workload())
        .args(["swarm", "300", "200", "4", "fork"])
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(st.success());
    let pre: Vec<f64> = std::fs::read_to_string(&pre)
        .unwrap()
        .split_whitespace()
        .map(|v| v.parse::<f64>().unwrap() / 1e9)
        .collect();
    let st = Command::new(workload())
        .arg("incgroup")
        .arg(bad.join_arg())
        .args(["--", "/bin/sh", "-c", "sleep 5 & kill -9 $!; wait; exit 3"])
        .status()
        .unwrap();
    assert_eq!(st.code(), Some(3));
    std::thread::sleep(Duration::from_millis(700));
    let (_, text) = get(port, "/metrics", "*/*").unwrap();
    let at = |metric: &str, id: &str| {
        value(&text, metric, &format!("container_id=\"{id}\"")).unwrap_or(-1.0)
    };
    let (a, b) = (cid(5), cid(6));
    // The swarm: its 300 children, and itself (exec'd into the container).
    assert_eq!(
        at("resource_tracker_container_processes_spawned_total", &a),
        300.0,
        "{text}"
    );
    assert_eq!(
        at("resource_tracker_container_processes_exited_total", &a),
        301.0
    );
    assert_eq!(at("resource_tracker_container_execs_total", &a), 1.0);
    assert_eq!(
        at("resource_tracker_container_nonzero_exits_total", &a),
        0.0
    );
    assert_eq!(at("resource_tracker_container_signal_kills_total", &a), 0.0);
    // The CPU of the swarm's processes by command, against the cgroup's: counted
    // when the kernel frees each task (an RCU callback, seconds later here).
    let t0 = Instant::now();
    let text = loop {
        let (_, t) = get(port, "/metrics", "*/*").unwrap();
        let n = value(
            &t,
            "resource_tracker_container_command_processes_total",
            &format!("container_id=\"{a}\""),
        );
        if n == Some(301.0) || t0.elapsed() > Duration::from_secs(20) {
            break t;
        }
        std::thread::sleep(Duration::from_millis(250));
    };
    let by_cmd = value(
        &text,
        "resource_tracker_container_command_cpu_seconds_total",
        &format!("container_id=\"{a}\""),
    )
    .unwrap_or(0.0);
    // The truth: the cgroup's, plus the root's CPU before it joined (known to
    // within the join itself). A thread the kernel freed without the free program
    // counts as of its exit, short by up to a scheduler tick (10 ms at HZ=100, the
    // coarsest) and its exit path: the agent names how many, the bound allows that.
    let (lo, hi) = (swarm.cpu_secs() + pre[0], swarm.cpu_secs() + pre[1]);
    let unread = text
        .lines()
        .find_map(|l| {
            l.strip_prefix("resource_tracker_freed_unread_total ")?
                .trim()
                .parse::<f64>()
                .ok()
        })
        .unwrap_or(-1.0);
    assert!(
        unread >= 0.0,
        "the agent names its threads freed unread:\n{text}"
    );
    assert!(
        by_cmd >= lo * 0.995 - unread * 0.011 && by_cmd <= hi * 1.005,
        "command CPU {by_cmd} s, cgroup + pre-join {lo}..{hi} s, {unread} freed unread:\n{text}"
    );
    let truth = lo;
    assert_eq!(
        value(
            &text,
            "resource_tracker_container_command_processes_total",
            &format!("container_id=\"{a}\"")
        ),
        Some(301.0)
    );
    eprintln!(
        "top command CPU {by_cmd:.6} s, cgroup {truth:.6} s after {:?}, {unread} freed unread",
        t0.elapsed()
    );
    // Nothing the programs counted was lost.
    assert!(
        text.contains("\nresource_tracker_lost_events_total 0"),
        "{text}"
    );
    // sh and its killed sleep.
    assert_eq!(
        at("resource_tracker_container_processes_spawned_total", &b),
        1.0
    );
    assert_eq!(
        at("resource_tracker_container_processes_exited_total", &b),
        2.0
    );
    assert_eq!(
        at("resource_tracker_container_nonzero_exits_total", &b),
        1.0
    );
    assert_eq!(at("resource_tracker_container_signal_kills_total", &b), 1.0);
    bg.signal(libc::SIGTERM);
    assert!(bg.wait_for(Duration::from_secs(5)).success());
    // The JSON lines add up to the same.
    let lines = read_jsonl(&s.path("node.jsonl"));
    let sum = |id: &str, k: &str| -> u64 {
        lines
            .iter()
            .filter(|v| v["container_id"].as_str() == Some(id))
            .filter_map(|v| v[k].as_u64())
            .sum()
    };
    assert_eq!(sum(&a, "processes_spawned"), 300);
    assert_eq!(sum(&a, "processes_exited"), 301);
    assert_eq!(sum(&b, "signal_kills"), 1);
}

/// GPU per container through the real NVML code path (the fake library of the GPU
/// tests): a process of the container listed on a GPU counts for that container.
#[test]
fn gpu_per_container() {
    if !require(is_root(), "the node tests make cgroups and need root")
        || !require(
            tracker_tests::e2e::have("gcc"),
            "gcc is missing (the fake libnvidia-ml.so.1)",
        )
    {
        return;
    }
    let s = Scratch::new("nodegpu");
    let lib = s.path("lib");
    std::fs::create_dir_all(&lib).unwrap();
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/fake_nvml.c");
    let st = Command::new("gcc")
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(lib.join("libnvidia-ml.so.1"))
        .arg(&src)
        .status()
        .unwrap();
    assert!(st.success());
    let c = FakeContainer::new(&format!("kubepods/burstable/pod{UID1}/{}", cid(8)));
    let mut sleeper = Bg::spawn(
        Command::new(workload())
            .arg("incgroup")
            .arg(c.join_arg())
            .args(["--", "/bin/sleep", "30"]),
        "a process in the container",
    );
    let scen = s.path("scenario");
    std::fs::write(
        &scen,
        format!(
            "gpus 1\ndriver 550.54.15\ncuda 12040\nname 0 NVIDIA Fake\nuuid 0 GPU-0\nbusid 0 00000000:3B:00.0\nutil 0 40\nmem 0 42949672960 10737418240\nproc 0 {} 2147483648 30\nproc 0 1 1048576 5\n",
            sleeper.pid()
        ),
    )
    .unwrap();
    let port = free_port();
    let mut agent = Bg::spawn(
        Command::new(tracker())
            .args([
                "node",
                "--no-ebpf",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "-i",
                "0.2",
            ])
            .env("LD_LIBRARY_PATH", &lib)
            .env("FAKE_NVML_SCENARIO", &scen)
            .stderr(std::fs::File::create(s.path("err")).unwrap()),
        "node agent",
    );
    let t0 = Instant::now();
    let label = format!("container_id=\"{}\"", cid(8));
    let text = loop {
        let text = get(port, "/metrics", "*/*")
            .map(|r| r.1)
            .unwrap_or_default();
        if value(
            &text,
            "resource_tracker_container_accelerator_memory_used_bytes",
            &label,
        )
        .is_some_and(|v| v > 0.0)
        {
            break text;
        }
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "no GPU for the container:\n{text}\n{}",
            std::fs::read_to_string(s.path("err")).unwrap_or_default()
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    assert_eq!(
        value(
            &text,
            "resource_tracker_container_accelerator_memory_used_bytes",
            &label
        ),
        Some(2147483648.0)
    );
    assert_eq!(
        value(&text, "resource_tracker_container_gpu_usage", &label),
        Some(0.3)
    );
    assert_eq!(
        value(&text, "resource_tracker_container_gpus_utilized", &label),
        Some(1.0)
    );
    // pid 1 is in no container: counted nowhere.
    assert!(!text.contains("1048576"), "{text}");
    agent.signal(libc::SIGTERM);
    assert!(agent.wait_for(Duration::from_secs(5)).success());
    sleeper.signal(libc::SIGKILL);
    sleeper.wait_for(Duration::from_secs(5));
}

/// The stall totals of a v2 `*.pressure` file, seconds: (some, full).
fn psi(dir: &Path, file: &str) -> (f64, f64) {
    let p = dir.join(file);
    let text = std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let total = |kind: &str| {
        text.lines()
            .find(|l| l.starts_with(kind))
            .and_then(|l| l.split_whitespace().find_map(|w| w.strip_prefix("total=")))
            .and_then(|v| v.parse::<f64>().ok())
            .unwrap_or_else(|| panic!("{}: no {kind}total in {text:?}", p.display()))
            / 1e6
    };
    (total("some "), total("full "))
}

/// A container's bytes read by device (named as in /dev), from the file the
/// agent reads: v1's BFQ or throttling counters, or v2's `io.stat`.
fn reads_by_device(c: &FakeContainer) -> std::collections::BTreeMap<String, u64> {
    let (text, v1) = match c.dir("blkio") {
        // BFQ's counters where it schedules a device the container used.
        Some(d) => (
            std::fs::read_to_string(d.join("blkio.bfq.io_service_bytes_recursive"))
                .ok()
                .filter(|t| t.contains(':'))
                .or_else(|| std::fs::read_to_string(d.join("blkio.throttle.io_service_bytes")).ok())
                .unwrap(),
            true,
        ),
        None => (
            std::fs::read_to_string(c.dirs[0].join("io.stat")).unwrap(),
            false,
        ),
    };
    let mut out = std::collections::BTreeMap::new();
    for l in text.lines() {
        let w: Vec<&str> = l.split_whitespace().collect();
        let n = match (v1, &w[..]) {
            (true, [_, "Read", n]) => n.parse().ok(),
            (false, [_, rest @ ..]) => rest
                .iter()
                .find_map(|kv| kv.strip_prefix("rbytes=")?.parse().ok()),
            _ => None,
        };
        if let Some(n) = n.filter(|&n: &u64| n > 0) {
            let uevent = std::fs::read_to_string(format!("/sys/dev/block/{}/uevent", w[0]))
                .unwrap_or_default();
            let name = uevent
                .lines()
                .find_map(|l| l.strip_prefix("DEVNAME="))
                .map_or(w[0].to_string(), |d| format!("/dev/{d}"));
            out.insert(name, n);
        }
    }
    out
}

/// Pressure per container is its v2 cgroup's own (on a hybrid host, the unified
/// tree's cgroup at the same path): three busy threads on two CPUs wait for a CPU;
/// a job holding 24 MiB and reading a 48 MiB file again and again under a 40 MiB
/// limit waits for memory (the file's pages read back) and for I/O. Each exported
/// total within 5 % of the kernel's, read once the job has ended and the agent has
/// read it again; its storage reads by device, as the kernel counts them; and the
/// default names are ours, cAdvisor's only on request.
#[test]
fn pressure_per_container_is_the_cgroups() {
    if !require(is_root(), "the node tests make cgroups and need root") {
        return;
    }
    let s = Scratch::new("node-psi");
    let file = s.path("data");
    {
        let mut f = std::fs::File::create(&file).unwrap();
        let block: Vec<u8> = (0..1u32 << 20).map(|i| ((i * 7) >> 5) as u8).collect();
        for _ in 0..48 {
            f.write_all(&block).unwrap();
        }
        f.sync_all().unwrap();
        use std::os::fd::AsRawFd as _;
        // SAFETY: an open descriptor; advice on the whole file.
        let rc = unsafe { libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED) };
        assert_eq!(rc, 0);
    }
    let port = free_port();
    let mut bg = agent(&s.0, port, "0.2");
    let busy = FakeContainer::new(&format!("kubepods/burstable/pod{UID1}/{}", cid(0x31)));
    let reader = FakeContainer::new(&format!("kubepods/burstable/pod{UID2}/{}", cid(0x32)));
    let mem = reader.dir("memory").unwrap_or(&reader.dirs[0]).clone();
    let limit_file = if mem.join("memory.limit_in_bytes").exists() {
        "memory.limit_in_bytes"
    } else {
        "memory.max"
    };
    std::fs::write(mem.join(limit_file), (40u64 << 20).to_string()).unwrap();
    // 24 MiB held while a 48 MiB file is read over and over: its pages are
    // reclaimed and read back, each a refault the kernel counts as a stall.
    let cat = format!(
        "{w} memory 24 1 3000 & for i in 1 2 3 4 5 6 7 8; do cat {f} > /dev/null; done; wait",
        w = workload().display(),
        f = file.display()
    );
    std::thread::scope(|sc| {
        sc.spawn(|| busy.run(&["burner", "3", "1500"]));
        sc.spawn(|| {
            let st = Command::new(workload())
                .arg("incgroup")
                .arg(reader.join_arg())
                .args(["--", "/bin/sh", "-c", &cat])
                .status()
                .unwrap();
            assert!(st.success(), "the reading job: {st}");
        });
    });
    // The stall totals are read at every 10th read of a container whose CPU
    // moved (docs/node.md): 13 intervals, and each container's final ones are in.
    std::thread::sleep(Duration::from_millis(2600));
    let (_, text) = get(port, "/metrics", "*/*").unwrap();
    let v2 = |c: &FakeContainer| {
        c.dir("unified")
            .cloned()
            .unwrap_or_else(|| c.dirs[0].clone())
    };
    let mut checked = 0;
    for (c, id, part, also_full) in [
        (&busy, cid(0x31), "cpu", false),
        (&reader, cid(0x32), "memory", true),
        (&reader, cid(0x32), "io", true),
    ] {
        let (some, full) = psi(&v2(c), &format!("{part}.pressure"));
        let label = format!("container_id=\"{id}\"");
        let metric = |kind: &str| {
            let name = format!("resource_tracker_container_pressure_{part}_{kind}_seconds_total");
            value(&text, &name, &label).unwrap_or_else(|| panic!("no {name} for {id}:\n{text}"))
        };
        let waiting = metric("waiting");
        eprintln!(
            "{part}: exported waiting {waiting:.4} s, cgroup some {some:.4} s; full {full:.4} s"
        );
        assert!(
            some > 0.001,
            "{part}: the job stalled {some} s only: no test"
        );
        assert!(
            (waiting - some).abs() <= 0.05 * some,
            "{part}: exported {waiting} s, cgroup some {some} s"
        );
        if also_full {
            let stalled = metric("stalled");
            assert!(
                (stalled - full).abs() <= 0.05 * full.max(0.001),
                "{part}: exported stalled {stalled} s, cgroup full {full} s"
            );
        }
        checked += 1;
    }
    assert_eq!(checked, 3);
    // The bytes read, by device, as the kernel's file the agent reads has them.
    let read = reads_by_device(&reader);
    assert!(read.values().sum::<u64>() >= 48 << 20, "{read:?}");
    for (device, bytes) in &read {
        let label = format!("container_id=\"{}\",qos=\"burstable\",namespace=\"\",pod=\"\",container=\"\",image=\"\",device=\"{device}\"", cid(0x32));
        let got = value(
            &text,
            "resource_tracker_container_fs_reads_bytes_total",
            &label,
        );
        assert_eq!(got, Some(*bytes as f64), "{device}: {text}");
    }
    assert!(
        !text.lines().any(|l| l.starts_with("container_")),
        "cAdvisor's names by default"
    );
    assert!(!text.contains("resource_tracker_degraded{"), "{text}");
    bg.signal(libc::SIGTERM);
    assert!(bg.wait_for(Duration::from_secs(5)).success());
    // On request (the flag, or its variable as here), cAdvisor's names for what
    // cAdvisor has, ours for the rest.
    let port = free_port();
    let mut c = Command::new(tracker());
    c.env("TRACKER_CADVISOR_NAMES", "1")
        .args([
            "node",
            "--listen",
            &format!("127.0.0.1:{port}"),
            "-i",
            "0.2",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    let mut bg = Bg::spawn(&mut c, "node agent");
    let t0 = Instant::now();
    let text = loop {
        let t = get(port, "/metrics", "*/*")
            .map(|r| r.1)
            .unwrap_or_default();
        if t.contains("container_cpu_usage_seconds_total{")
            || t0.elapsed() > Duration::from_secs(10)
        {
            break t;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let label = format!("container_id=\"{}\"", cid(0x31));
    assert!(
        value(&text, "container_cpu_usage_seconds_total", &label).is_some(),
        "{text}"
    );
    assert!(value(
        &text,
        "container_pressure_cpu_waiting_seconds_total",
        &label
    )
    .is_some());
    assert!(value(&text, "resource_tracker_container_oom_kills_total", &label).is_some());
    assert!(!text.contains("resource_tracker_container_cpu_usage_seconds_total"));
    bg.signal(libc::SIGTERM);
    assert!(bg.wait_for(Duration::from_secs(5)).success());
}

/// A host whose cgroups keep no pressure (here a v2 tree without `*.pressure`
/// files, as with PSI off): no pressure series, never zeros, and the reason in
/// `/healthz`, in `resource_tracker_degraded` and once in the log.
#[test]
fn no_pressure_files_no_pressure_series_and_the_reason() {
    let s = Scratch::new("node-nopsi");
    let cg = s.path("sys/fs/cgroup");
    let dir = cg.join(format!("kubepods/burstable/pod{UID1}/{}", cid(0x41)));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(cg.join("cgroup.controllers"), "cpu memory io pids\n").unwrap();
    for (f, v) in [
        (
            "cpu.stat",
            "usage_usec 1500000\nuser_usec 1000000\nsystem_usec 500000\n",
        ),
        ("memory.current", "1048576\n"),
        ("memory.stat", "inactive_file 0\n"),
        ("io.stat", ""),
        ("pids.current", "1\n"),
    ] {
        std::fs::write(dir.join(f), v).unwrap();
    }
    let port = free_port();
    let err = s.path("node.err");
    let mut c = Command::new(tracker());
    c.args([
        "node",
        "--no-ebpf",
        "--listen",
        &format!("127.0.0.1:{port}"),
        "-i",
        "0.2",
        "--host-sys",
    ])
    .arg(s.path("sys"))
    .stdout(Stdio::null())
    .stderr(std::fs::File::create(&err).unwrap());
    let mut bg = Bg::spawn(&mut c, "node agent");
    let t0 = Instant::now();
    let health = loop {
        let h = get(port, "/healthz", "*/*")
            .map(|r| r.1)
            .unwrap_or_default();
        if h.contains("degraded") || t0.elapsed() > Duration::from_secs(10) {
            break h;
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    std::thread::sleep(Duration::from_millis(500));
    let (_, text) = get(port, "/metrics", "*/*").unwrap();
    bg.signal(libc::SIGTERM);
    assert!(bg.wait_for(Duration::from_secs(5)).success());
    let label = format!("container_id=\"{}\"", cid(0x41));
    assert_eq!(
        value(
            &text,
            "resource_tracker_container_cpu_usage_seconds_total",
            &label
        ),
        Some(1.5),
        "{text}"
    );
    assert!(!text.contains("_pressure_"), "{text}");
    assert!(
        health.starts_with("ok\n") && health.contains("degraded: pressure: "),
        "{health:?}"
    );
    assert!(
        text.lines().any(|l| l
            .starts_with("resource_tracker_degraded{part=\"pressure\",reason=\"")
            && l.ends_with("\"} 1.0")),
        "{text}"
    );
    let log = std::fs::read_to_string(&err).unwrap();
    assert_eq!(log.matches("no pressure per container").count(), 1, "{log}");
}

/// A stand-in kubelet for the bundle's test: its `/pods` names pod `web-0`
/// (namespace `shop`) with containers `app` and `side`; its `/metrics/cadvisor`
/// serves what the kubelet's cAdvisor serves of them (each container's CPU, read
/// from its cgroup at each scrape, and the pod's own cgroup, `container=""`), with
/// cAdvisor's names and timestamps.
type CpuOf = Box<dyn Fn() -> f64 + Send + Sync>;

fn kubelet_with_cadvisor(pod: CpuOf, parts: [(&'static str, String, CpuOf); 2]) -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = l.local_addr().unwrap().port();
    let (pod, parts) = (std::sync::Arc::new(pod), std::sync::Arc::new(parts));
    std::thread::spawn(move || {
        // A thread per connection: the agent's client keeps its own open.
        for s in l.incoming().flatten() {
            let (pod, parts) = (pod.clone(), parts.clone());
            std::thread::spawn(move || serve_kubelet(s, &pod, &parts));
        }
    });
    port
}

/// One connection to the stand-in kubelet, until its client closes it.
fn serve_kubelet(s: std::net::TcpStream, pod: &CpuOf, parts: &[(&'static str, String, CpuOf); 2]) {
    {
        {
            let mut c = tracker_tests::http::Conn::new(s);
            while let Ok(Some(h)) = c.read_request() {
                let statuses: Vec<String> = parts
                    .iter()
                    .map(|(name, id, _)| {
                        format!(r#"{{"name":"{name}","image":"nginx:1.27","containerID":"containerd://{id}","ready":true}}"#)
                    })
                    .collect();
                let (ctype, text) = if h.path() == "/pods" {
                    (
                        "application/json",
                        format!(
                            r#"{{"kind":"PodList","apiVersion":"v1","metadata":{{}},"items":[{{"metadata":{{"name":"web-0","namespace":"shop","uid":"{UID1}"}},"spec":{{}},"status":{{"phase":"Running","containerStatuses":[{}]}}}}]}}"#,
                            statuses.join(",")
                        ),
                    )
                } else {
                    let ms = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .unwrap()
                        .as_millis();
                    let mut t = String::from("# HELP container_cpu_usage_seconds_total [STABLE] Cumulative cpu time consumed by the container in core-seconds\n# TYPE container_cpu_usage_seconds_total counter\n");
                    let pod_dir = format!("/kubepods/burstable/pod{UID1}");
                    t.push_str(&format!(
                        "container_cpu_usage_seconds_total{{container=\"\",cpu=\"total\",id=\"{pod_dir}\",image=\"\",name=\"\",namespace=\"shop\",pod=\"web-0\"}} {} {ms}\n",
                        pod()
                    ));
                    for (name, id, c) in parts {
                        t.push_str(&format!(
                            "container_cpu_usage_seconds_total{{container=\"{name}\",cpu=\"total\",id=\"{pod_dir}/{id}\",image=\"nginx:1.27\",name=\"{id}\",namespace=\"shop\",pod=\"web-0\"}} {} {ms}\n",
                            c()
                        ));
                    }
                    ("text/plain; version=0.0.4", t)
                };
                let _ = c.write(&tracker_tests::http::response(
                    200,
                    &[("content-type", ctype)],
                    text.as_bytes(),
                    false,
                ));
            }
        }
    }
}

/// The bundle's rules on a real Prometheus that scrapes the agent (as the
/// ServiceMonitor does: job `resource-tracker`) and, beside it, a kubelet's
/// cAdvisor serving the same containers (job `kubelet` with its `metrics_path`
/// label, as kube-prometheus scrapes it): the OOM alert fires within two evaluation intervals (1 s each) of
/// a kubelet-named container's OOM kill, and each job's `sum by (pod)` of the
/// containers' CPU is the cgroups' own, once — neither sees the other's series.
#[test]
fn the_bundles_alerts_fire_beside_the_kubelets_cadvisor() {
    if !require(is_root(), "the node tests make cgroups and need root")
        || !require(
            tracker_tests::e2e::have("prometheus"),
            "prometheus (Debian's package; scripts/setup.sh installs it) is missing",
        )
    {
        return;
    }
    let s = Scratch::new("nodebundle");
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    // The shipped rules as Prometheus loads them: the PrometheusRule's spec, as
    // deploy/validate.sh extracts it (it makes the virtual environment it runs in).
    let py = tracker_tests::deploy_python();
    let o = Command::new(&py)
        .arg(root.join("deploy/bundle-check.py"))
        .arg(root.join("deploy"))
        .arg(&s.0)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let pod = FakeContainer::new(&format!("kubepods/burstable/pod{UID1}"));
    let (a, b) = (cid(0x51), cid(0x52));
    let app = FakeContainer::new(&format!("kubepods/burstable/pod{UID1}/{a}"));
    let side = FakeContainer::new(&format!("kubepods/burstable/pod{UID1}/{b}"));
    let mem = side.dir("memory").unwrap_or(&side.dirs[0]).clone();
    let limit_file = if mem.join("memory.limit_in_bytes").exists() {
        "memory.limit_in_bytes"
    } else {
        "memory.max"
    };
    std::fs::write(mem.join(limit_file), (32u64 << 20).to_string()).unwrap();
    let _ = std::fs::write(mem.join("memory.swappiness"), "0");
    let kport = kubelet_with_cadvisor(
        Box::new(pod.cpu_reader()),
        [
            ("app", a.clone(), Box::new(app.cpu_reader())),
            ("side", b.clone(), Box::new(side.cpu_reader())),
        ],
    );
    std::fs::write(s.path("token"), "tok\n").unwrap();
    let port = free_port();
    let mut cmd = Command::new(tracker());
    cmd.args([
        "node",
        "--listen",
        &format!("127.0.0.1:{port}"),
        "-i",
        "0.2",
    ])
    .args([
        "--kubelet-url",
        &format!("http://127.0.0.1:{kport}"),
        "--kubelet-token-file",
    ])
    .arg(s.path("token"))
    .stdout(Stdio::null())
    .stderr(std::fs::File::create(s.path("node.err")).unwrap());
    let mut agent = Bg::spawn(&mut cmd, "node agent");
    let (mut prom, web) = prometheus(
        &s,
        &format!(
            "global:\n  scrape_interval: 500ms\n  scrape_timeout: 500ms\n  evaluation_interval: 1s\nrule_files:\n  - {}\nscrape_configs:\n  - job_name: resource-tracker\n    static_configs:\n      - targets: ['127.0.0.1:{port}']\n  - job_name: kubelet\n    metrics_path: /metrics/cadvisor\n    honor_timestamps: true\n    relabel_configs:\n      - source_labels: [__metrics_path__]\n        target_label: metrics_path\n    static_configs:\n      - targets: ['127.0.0.1:{kport}']\n",
            s.path("rules.yaml").display()
        ),
    );
    // Both jobs scraped, the agent's series named by the kubelet, before the kill.
    let t0 = Instant::now();
    let named = "resource_tracker_container_oom_kills_total{job=\"resource-tracker\",pod=\"web-0\",container=\"side\"}";
    while prom_query(web, named).is_none() || prom_query(web, "up{job=\"kubelet\"} == 1").is_none()
    {
        assert!(
            t0.elapsed() < Duration::from_secs(30),
            "never scraped, named"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    // CPU in both containers; then the side container's OOM kill: 64 MiB asked
    // for under its 32 MiB limit.
    app.run(&["burner", "1", "800"]);
    side.run(&["burner", "1", "300"]);
    side.run(&["memory", "64", "1", "200"]);
    let killed = Instant::now();
    let events = ["memory.oom_control", "memory.events"]
        .iter()
        .find_map(|f| std::fs::read_to_string(mem.join(f)).ok())
        .unwrap_or_default();
    let kills = events
        .lines()
        .find_map(|l| l.strip_prefix("oom_kill "))
        .and_then(|v| v.trim().parse::<u64>().ok());
    assert_eq!(
        kills,
        Some(1),
        "the kernel's count of OOM kills under 32 MiB: {events}"
    );
    let firing = |a: &serde_json::Value| {
        a["labels"]["alertname"] == "ResourceTrackerContainerOOMKilled"
            && a["labels"]["container"] == "side"
            && a["labels"]["pod"] == "web-0"
            && a["state"] == "firing"
    };
    let fired = loop {
        let alerts = get(web, "/api/v1/alerts", "*/*")
            .and_then(|(_, b)| serde_json::from_str::<serde_json::Value>(&b).ok())
            .map(|v| v["data"]["alerts"].clone())
            .unwrap_or_default();
        if alerts.as_array().is_some_and(|v| v.iter().any(firing)) {
            break killed.elapsed();
        }
        assert!(
            killed.elapsed() < Duration::from_secs(10),
            "the OOM alert never fired: {alerts}"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    eprintln!("bundle: the OOM alert fired {fired:?} after the kill");
    // Two evaluation intervals, and the 50 ms of the poll.
    assert!(
        fired <= Duration::from_millis(2050),
        "the OOM alert fired {fired:?} after the kill"
    );
    // Three scrapes after the end: each job holds the cgroups' final totals.
    std::thread::sleep(Duration::from_millis(1500));
    let truth = app.cpu_secs() + side.cpu_secs();
    assert!(truth > 0.9, "the containers used {truth} s");
    for (job, q) in [
        ("resource-tracker", "sum by (pod) (resource_tracker_container_cpu_usage_seconds_total{job=\"resource-tracker\",namespace=\"shop\"})".to_string()),
        // kube-prometheus's own selection of the kubelet's containers.
        ("kubelet", "sum by (pod) (container_cpu_usage_seconds_total{job=\"kubelet\",namespace=\"shop\",metrics_path=\"/metrics/cadvisor\",image!=\"\",container!=\"\"})".to_string()),
    ] {
        let r = prom_query(web, &q).unwrap_or_else(|| panic!("{job}: no answer to {q}"));
        assert_eq!(r.len(), 1, "{job}: one pod: {r:?}");
        assert_eq!(r[0]["metric"]["pod"], "web-0", "{job}: {r:?}");
        let got: f64 = r[0]["value"][1].as_str().and_then(|x| x.parse().ok()).unwrap();
        eprintln!("bundle: {job}: sum by (pod) {got:.4} s, cgroups {truth:.4} s");
        assert!((got - truth).abs() <= 0.01 * truth, "{job}: {got} s, the cgroups' {truth} s");
    }
    // Neither job's series under the other's names.
    for q in [
        "resource_tracker_container_cpu_usage_seconds_total{job!=\"resource-tracker\"}",
        "container_cpu_usage_seconds_total{job!=\"kubelet\"}",
    ] {
        assert!(prom_query(web, q).is_none(), "{q}");
    }
    prom.signal(libc::SIGTERM);
    prom.wait_for(Duration::from_secs(10));
    agent.signal(libc::SIGTERM);
    assert!(agent.wait_for(Duration::from_secs(5)).success());
}
