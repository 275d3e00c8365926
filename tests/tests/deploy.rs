//! The deployment: the bundle validates offline (and a broken manifest, rule,
//! dashboard query or resource list does not), every metric its rules and
//! dashboard use is one the node agent serves, and the image, built offline from
//! this build's binary, runs under podman with exactly the DaemonSet's privileges
//! and mounts (deploy/podman-run.sh): the node agent serves the host's containers
//! on /metrics, and the eBPF backend loads.

use std::{
    collections::BTreeSet,
    io::{Read as _, Write as _},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::{Duration, Instant},
};

use tracker_tests::{
    containers::FakeContainer,
    e2e::{have, is_root, require, Bg},
    free_port, tracker, workload, Scratch,
};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn manifests_validate_and_a_broken_one_does_not() {
    if !validate_sh_can_run() {
        return;
    }
    let o = Command::new("bash")
        .arg(root().join("deploy/validate.sh"))
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    );
    let s = Scratch::new("kv");
    let ds = std::fs::read_to_string(root().join("deploy/daemonset.yaml")).unwrap();
    let broken = ds.replacen("containerPort: 9101", "containerPort: \"nine\"", 1);
    assert_ne!(broken, ds, "the DaemonSet has a containerPort to break");
    std::fs::write(s.path("daemonset.yaml"), broken).unwrap();
    let kv = root().join("target/kv/bin/kubernetes-validate");
    let o = Command::new(kv)
        .args(["--strict", "-k", "1.37.0"])
        .arg(s.path("daemonset.yaml"))
        .output()
        .unwrap();
    assert!(!o.status.success(), "a port that is not a number validated");
}

fn validate_sh_can_run() -> bool {
    require(
        have("python3") && have("promtool"),
        "python3 or promtool is missing (scripts/setup.sh installs Debian's prometheus)",
    )
}

/// deploy/ copied into `s`, so that a test can break one file of it.
fn bundle_copy(s: &Scratch) -> PathBuf {
    fn copy(from: &Path, to: &Path) {
        std::fs::create_dir_all(to).unwrap();
        for e in std::fs::read_dir(from).unwrap().flatten() {
            let (f, t) = (e.path(), to.join(e.file_name()));
            if f.is_dir() {
                copy(&f, &t);
            } else {
                std::fs::copy(&f, &t).unwrap();
            }
        }
    }
    let dir = s.path("deploy");
    copy(&root().join("deploy"), &dir);
    dir
}

/// Replaces each `from` in `dir/file` with `to`; the file must have one.
fn break_file(dir: &Path, file: &str, from: &str, to: &str) {
    let p = dir.join(file);
    let text = std::fs::read_to_string(&p).unwrap();
    assert!(text.contains(from), "{file} has no {from:?} to break");
    std::fs::write(&p, text.replace(from, to)).unwrap();
}

fn validate(dir: &Path) -> Output {
    Command::new("bash")
        .arg(root().join("deploy/validate.sh"))
        .arg(dir)
        .output()
        .unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// validate.sh fails each way the bundle can be broken, and says where.
#[test]
fn a_broken_rule_query_or_resource_list_fails_validation() {
    if !validate_sh_can_run() {
        return;
    }
    let s = Scratch::new("bundle");
    let ok = validate(&bundle_copy(&s));
    assert!(ok.status.success(), "the copy itself: {}", text(&ok));
    type Break = fn(&Path);
    // What breaks, how, and what the output then says.
    let cases: [(&str, Break, &[&str]); 6] = [
        (
            "a rule that does not parse",
            |d| break_file(d, "prometheusrule.yaml", "> 0.9", "> > 0.9"),
            &["\"ResourceTrackerContainerMemoryNearLimit\": could not parse expression"],
        ),
        (
            "an alert its unit test no longer sees fire",
            |d| break_file(d, "prometheusrule.yaml", "> 0.9", "> 0.99"),
            &["alertname: ResourceTrackerContainerMemoryNearLimit, time: 6m"],
        ),
        (
            "a dashboard query that does not parse",
            |d| {
                break_file(
                    d,
                    "dashboard.json",
                    "[$__rate_interval]))",
                    "[$__rate_interval])",
                )
            },
            &["\"dashboard:panel_", "could not parse expression"],
        ),
        (
            "a dashboard variable's selector that does not parse",
            |d| {
                break_file(
                    d,
                    "dashboard.json",
                    "label_values(resource_tracker_containers{",
                    "label_values(resource_tracker_containers{{",
                )
            },
            &["\"dashboard:variable_node\": could not parse expression"],
        ),
        (
            "a manifest the kustomization does not list",
            |d| {
                std::fs::write(
                    d.join("extra.yaml"),
                    "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: extra\n  namespace: resource-tracker\n",
                )
                .unwrap()
            },
            &["extra.yaml is beside it but not in its resources"],
        ),
        (
            "a resource listed that is not there",
            |d| std::fs::remove_file(d.join("service.yaml")).unwrap(),
            &["resource service.yaml does not exist"],
        ),
    ];
    for (what, brk, says) in cases {
        let s = Scratch::new("bundle-broken");
        let dir = bundle_copy(&s);
        brk(&dir);
        let o = validate(&dir);
        let out = text(&o);
        assert!(!o.status.success(), "{what} validated:\n{out}");
        for says in says {
            assert!(
                out.contains(says),
                "{what}: the output does not say {says:?}:\n{out}"
            );
        }
    }
}

/// The bundle's queries as deploy/bundle-check.py reads them (the rules by
/// PyYAML, the dashboard's targets and variables, Grafana's variables given
/// values): (where, query).
fn bundle_queries() -> Vec<(String, String)> {
    let s = Scratch::new("bundle-queries");
    let o = Command::new(tracker_tests::deploy_python())
        .arg(root().join("deploy/bundle-check.py"))
        .arg(root().join("deploy"))
        .arg(&s.0)
        .output()
        .unwrap();
    assert!(o.status.success(), "bundle-check.py: {}", text(&o));
    let q: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(s.path("queries.json")).unwrap()).unwrap();
    q.as_array()
        .expect("queries.json: a list")
        .iter()
        .map(|x| {
            let s = |k: &str| x[k].as_str().unwrap_or_default().to_string();
            (s("where"), s("expr"))
        })
        .collect()
}

/// A selector: its metric name and its equality matchers (label, value).
type Selector = (String, Vec<(String, String)>);

/// Each vector selector of a PromQL query (parsed by promql-parser; a query it
/// cannot parse panics).
pub fn selectors(query: &str) -> Vec<Selector> {
    use promql_parser::{label::MatchOp, parser::Expr};
    fn walk(e: &Expr, out: &mut Vec<Selector>) {
        let vs = match e {
            Expr::Aggregate(a) => {
                walk(&a.expr, out);
                return a.param.iter().for_each(|p| walk(p, out));
            }
            Expr::Unary(u) => return walk(&u.expr, out),
            Expr::Binary(b) => {
                walk(&b.lhs, out);
                return walk(&b.rhs, out);
            }
            Expr::Paren(p) => return walk(&p.expr, out),
            Expr::Subquery(s) => return walk(&s.expr, out),
            Expr::Call(c) => return c.args.args.iter().for_each(|a| walk(a, out)),
            Expr::VectorSelector(v) => v,
            Expr::MatrixSelector(m) => &m.vs,
            Expr::NumberLiteral(_) | Expr::StringLiteral(_) | Expr::Extension(_) => return,
        };
        let eq = vs
            .matchers
            .matchers
            .iter()
            .filter(|m| m.op == MatchOp::Equal && m.name != "__name__")
            .map(|m| (m.name.clone(), m.value.clone()))
            .collect();
        out.push((vs.name.clone().unwrap_or_default(), eq));
    }
    let e = promql_parser::parser::parse(query).unwrap_or_else(|e| panic!("{query}: {e}"));
    let mut out = Vec::new();
    walk(&e, &mut out);
    out
}

/// Every metric name the bundle's rules and dashboard use.
pub fn bundle_metric_names() -> BTreeSet<String> {
    bundle_queries()
        .iter()
        .flat_map(|(_, e)| selectors(e))
        .map(|(name, _)| name)
        .collect()
}

#[test]
fn selectors_see_through_promql() {
    let e = r#"topk(10, sum by (namespace, pod) (rate(a_total{job="x",pod=~".*"}[5m])))
        / on (pod) group_left (node) b{x="}{"} > bool 0.9 or vector(1) unless absent(up{job="y"}
        offset 5m) and ignoring(container) c:rec:sum * 1e3 + max without (id) (max_over_time(d[5m:1m]))
        + quantile(0.9, -e)"#;
    let got: Vec<_> = selectors(e).into_iter().map(|(n, _)| n).collect();
    assert_eq!(got, ["a_total", "b", "up", "c:rec:sum", "d", "e"]);
    // A query that is not PromQL is no query.
    assert!(std::panic::catch_unwind(|| selectors("absent(up) offset 5m")).is_err());
    assert_eq!(
        selectors(r#"x{a="}",b=~"c"}"#)[0].1,
        [("a".to_string(), "}".to_string())]
    );
}

/// Every selector names the job, so that none also matches the kubelet's
/// cAdvisor series (job="kubelet") and a sum() never counts a container twice.
#[test]
fn every_selector_of_the_bundle_names_the_job() {
    let queries = bundle_queries();
    assert!(queries.len() > 20, "{} queries", queries.len());
    for (file, e) in &queries {
        let sel = selectors(e);
        assert!(!sel.is_empty(), "{file}: no selector in {e}");
        for (name, matchers) in sel {
            assert!(!name.is_empty(), "{file}: a selector without a name in {e}");
            assert!(
                matchers
                    .iter()
                    .any(|(l, v)| l == "job" && v == "resource-tracker"),
                "{file}: {name}{matchers:?} does not select job=\"resource-tracker\" in {e}"
            );
        }
    }
}

/// The sample names of an exposition.
fn served_names(text: &str) -> BTreeSet<String> {
    text.lines()
        .filter(|l| !l.starts_with('#') && !l.is_empty())
        .filter_map(|l| l.split(['{', ' ']).next())
        .map(str::to_string)
        .collect()
}

/// Limits `c` to 32 MiB, so that 64 MiB in it is OOM-killed, and to 20 ms of CPU
/// per 100 ms, so that a burner in it is throttled.
fn limit(c: &FakeContainer) {
    let (mut memory, mut cpu) = (false, false);
    for d in &c.dirs {
        for f in ["memory.limit_in_bytes", "memory.max"] {
            if d.join(f).exists() {
                std::fs::write(d.join(f), "33554432").unwrap();
                memory = true;
            }
        }
        let _ = std::fs::write(d.join("memory.swappiness"), "0");
        for (f, v) in [("cpu.cfs_quota_us", "20000"), ("cpu.max", "20000 100000")] {
            if d.join(f).exists() {
                std::fs::write(d.join(f), v).unwrap();
                cpu = true;
            }
        }
    }
    assert!(memory && cpu, "no memory or CPU limit file in {:?}", c.dirs);
}

/// Whether this test's conditions explain that the agent does not serve `name`
/// (`text` its scrape, `ebpf` whether its BPF programs can load here). Each arm
/// says why; any other name must be served.
fn absence_explained(name: &str, text: &str, ebpf: bool) -> bool {
    match name {
        // Prometheus's own, never the agent's.
        "up" => true,
        // Served only while kernel.bpf_stats_enabled is 1 (the kernel's figure);
        // turning it on is host-wide, not for a test to do.
        "resource_tracker_agent_bpf_run_seconds_total" => {
            std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled")
                .map_or(true, |v| v.trim() != "1")
        }
        // The kernel counts a program's skipped runs from 6.19 on.
        "resource_tracker_skipped_runs_total" => {
            let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").unwrap_or_default();
            let mut n = release
                .split(|c: char| !c.is_ascii_digit())
                .filter_map(|n| n.parse::<u32>().ok());
            (n.next().unwrap_or(0), n.next().unwrap_or(0)) < (6, 19)
        }
        // One series per part the agent cannot measure: none where it measures
        // everything.
        "resource_tracker_degraded" => true,
        // Pressure, only where the agent says it cannot read it.
        n if n.starts_with("resource_tracker_container_pressure_") => {
            text.contains("resource_tracker_degraded{part=\"pressure\"")
        }
        // The BPF programs' counts, where they cannot load (never in CI, where
        // ebpf_available fails instead).
        "resource_tracker_container_processes_spawned_total"
        | "resource_tracker_container_execs_total"
        | "resource_tracker_container_nonzero_exits_total"
        | "resource_tracker_container_signal_kills_total"
        | "resource_tracker_container_oom_victims_total"
        | "resource_tracker_container_command_cpu_seconds_total" => !ebpf,
        _ => false,
    }
}

/// The node agent serves every metric the rules and the dashboard use, with a
/// container that has a memory limit (one it is OOM-killed under) and a CPU
/// quota it is throttled under, processes that ran and ended in it, and storage
/// I/O past the page cache.
#[test]
fn every_metric_the_bundle_uses_is_served() {
    if !require(
        is_root(),
        "the node agent's test makes cgroups and needs root",
    ) {
        return;
    }
    let ebpf = tracker_tests::ebpf_available();
    let s = Scratch::new("bundle-served");
    let port = free_port();
    let mut bg = Bg::spawn(
        Command::new(tracker())
            .args([
                "node",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "-i",
                "0.2",
            ])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(s.path("node.err")).unwrap()),
        "node agent",
    );
    let t0 = Instant::now();
    while get(port, "/healthz").map(|r| r.0) != Some(200) {
        assert!(
            t0.elapsed() < Duration::from_secs(10),
            "the agent never answered /healthz"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    let id = "cd".repeat(32);
    let c = FakeContainer::new(&format!(
        "kubepods/burstable/pod1e2d3c4b-5a69-4788-9a0b-c1d2e3f4a5b6/{id}"
    ));
    limit(&c);
    // Matched before anything runs in it: the BPF counts start then.
    std::thread::sleep(Duration::from_millis(600));
    assert!(c.run(&["burner", "1", "300"]).success());
    let _ = c.run(&["memory", "64", "1", "200"]);
    // Storage written and read past the page cache: its devices' series.
    let file = s.path("io");
    let dd = format!(
        "dd if=/dev/zero of={0} bs=1M count=4 oflag=direct 2>/dev/null && dd if={0} of=/dev/null bs=1M iflag=direct 2>/dev/null",
        file.display()
    );
    let st = Command::new(tracker_tests::workload())
        .arg("incgroup")
        .arg(c.join_arg())
        .args(["--", "/bin/sh", "-c", &dd])
        .status()
        .unwrap();
    assert!(st.success(), "dd in the container: {st}");
    let uses = bundle_metric_names();
    // The commands' CPU counts when the kernel frees each thread, and the OOM kill
    // when it is read: a scan or two after the processes end.
    let t0 = Instant::now();
    let (text, missing) = loop {
        let (code, text) = get(port, "/metrics").expect("a scrape");
        assert_eq!(code, 200);
        let served = served_names(&text);
        let missing: Vec<String> = uses
            .iter()
            .filter(|n| !served.contains(*n) && !absence_explained(n, &text, ebpf))
            .cloned()
            .collect();
        if missing.is_empty() || t0.elapsed() > Duration::from_secs(10) {
            break (text, missing);
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let served = served_names(&text);
    assert!(
        missing.is_empty(),
        "the bundle uses {missing:?}, which the agent does not serve here (eBPF {ebpf}); \
         it serves {served:?}\n{}",
        std::fs::read_to_string(s.path("node.err")).unwrap_or_default()
    );
    assert!(text.contains(&id), "the container is not on /metrics");
    let absent: Vec<_> = uses.iter().filter(|n| !served.contains(*n)).collect();
    eprintln!(
        "the bundle uses {} names; absent, and why is known: {absent:?}",
        uses.len()
    );
    bg.signal(libc::SIGTERM);
    assert!(bg.wait_for(Duration::from_secs(5)).success());
}

fn get(port: u16, path: &str) -> Option<(u16, String)> {
    let mut s = TcpStream::connect(("127.0.0.1", port)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(10))).ok()?;
    write!(
        s,
        "GET {path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    Some((
        out.split(' ').nth(1)?.parse().ok()?,
        out.split_once("\r\n\r\n")?.1.to_string(),
    ))
}

struct Container(String);
impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new("podman")
            .args([
                "--runtime=runc",
                "--cgroup-manager=cgroupfs",
                "rm",
                "-f",
                &self.0,
            ])
            .output();
    }
}

#[test]
fn the_image_runs_with_the_daemonsets_privileges() {
    if !require(is_root(), "podman tests need root")
        || !require(
            have("podman") && have("runc") && have("jq") && have("objcopy"),
            "podman, runc, jq or objcopy is missing (scripts/setup.sh installs them)",
        )
    {
        return;
    }
    let s = Scratch::new("image");
    // The image carries this build's binary, without its debug sections.
    let bin = s.path("resource-tracker");
    let st = Command::new("objcopy")
        .arg("--strip-debug")
        .arg(tracker())
        .arg(&bin)
        .status()
        .unwrap();
    assert!(st.success());
    let tag = format!("localhost/resource-tracker:test-{}", std::process::id());
    let o = Command::new("bash")
        .arg(root().join("deploy/build-image.sh"))
        .arg(&tag)
        .env("BIN", &bin)
        .env("STAGE", s.path("stage"))
        .output()
        .unwrap();
    assert!(
        o.status.success(),
        "build-image.sh: {}",
        String::from_utf8_lossy(&o.stderr)
    );

    // `run` inside the image: the eBPF backend loads with exactly these privileges.
    let o = Command::new("bash")
        .arg(root().join("deploy/podman-run.sh"))
        .arg(&tag)
        .args(["run", "--", "/usr/local/bin/resource-tracker", "--version"])
        .env("RT_PORT", "none")
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(
        err.contains("backend ebpf"),
        "not eBPF under the DaemonSet's privileges: {err}"
    );

    // The DaemonSet's own command: the host's containers on /metrics.
    let uid = "9d4f3a1b-5e6f-4b8c-9d0e-4f5a6b7c8d9e";
    let id = "ab".repeat(32);
    let c = FakeContainer::new(&format!("kubepods/burstable/pod{uid}/{id}"));
    let port = free_port();
    let name = format!("rt-test-{}", std::process::id());
    let _c = Container(name.clone());
    let o = Command::new("bash")
        .arg(root().join("deploy/podman-run.sh"))
        .arg(&tag)
        .env("RT_PORT", port.to_string())
        .env("PODMAN_OPTS", format!("-d --name {name}"))
        .stdout(Stdio::null())
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let join = c.join_arg();
    let exited = |text: &str| {
        text.lines()
            .find(|l| {
                l.starts_with("resource_tracker_container_processes_exited_total{")
                    && l.contains(&id)
            })
            .and_then(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
    };
    // Up, and the container matched, before anything runs in it.
    let wait_for = |what: &str, ok: &dyn Fn(&str) -> bool| {
        let t0 = Instant::now();
        loop {
            if let Some((200, text)) = get(port, "/metrics") {
                if ok(&text) {
                    return text;
                }
            }
            assert!(
                t0.elapsed() < Duration::from_secs(30),
                "{what} never showed on /metrics"
            );
            std::thread::sleep(Duration::from_millis(200));
        }
    };
    let text = wait_for("the container", &|t| t.contains(&id));
    assert!(text.contains(&format!("pod_uid=\"{uid}\"")), "{text}");
    // The node's BPF programs loaded under the DaemonSet's privileges.
    assert!(text.contains("resource_tracker_ebpf 1"), "{text}");
    let st = Command::new(workload())
        .args(["incgroup", &join, "--"])
        .arg(workload())
        .args(["burner", "1", "500"])
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(st.success());
    // ... and counted the burner that ran in the container.
    wait_for("the burner's exit", &|t| exited(t) == Some(1.0));
    assert_eq!(get(port, "/healthz").map(|r| r.0), Some(200));
    // Read-only mounts: the agent cannot change the host's cgroups.
    let o = Command::new("podman")
        .args(["--runtime=runc", "--cgroup-manager=cgroupfs", "logs", &name])
        .output()
        .unwrap();
    assert!(!String::from_utf8_lossy(&o.stderr).contains("panicked"));
    drop(_c);
    drop(c);
    let _ = Command::new("podman").args(["rmi", "-f", &tag]).output();
}
