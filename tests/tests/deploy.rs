//! The deployment: the manifests validate offline (and a broken one does not), and
//! the image, built offline from this build's binary, runs under podman with
//! exactly the DaemonSet's privileges and mounts (deploy/podman-run.sh): the node
//! agent serves the host's containers on /metrics, and the eBPF backend loads.

use std::{
    io::{Read as _, Write as _},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use tracker_tests::{
    containers::FakeContainer,
    e2e::{have, is_root, require},
    free_port, tracker, workload, Scratch,
};

fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

#[test]
fn manifests_validate_and_a_broken_one_does_not() {
    if !require(have("python3"), "python3 is missing") {
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
