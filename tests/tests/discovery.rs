//! Cloud discovery against fake metadata services (`fake-metadata`, one per vendor):
//! `resource-tracker --discover` puts what it found into the summary's `cloud`
//! object; nothing found is `null`; the probe never delays the command; without
//! `--discover` (and no token) no metadata service is contacted; a bad endpoint
//! override is refused before anything runs. No root or eBPF needed.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::Duration,
};

use serde_json::{json, Value};
use tracker_tests::{
    closed_url,
    e2e::{clean_env, unix_now, Bg},
    read_json, run, tracker, Scratch,
};

/// A running fake-metadata, killed on drop.
struct Fake {
    _bg: Bg,
    url: String,
    log: PathBuf,
}

impl Fake {
    fn start(dir: &Path, vendor: &str, extra: &[&str]) -> Fake {
        let n = std::fs::read_dir(dir).map(|d| d.count()).unwrap_or(0);
        let addr_file = dir.join(format!("fake-{vendor}-{n}.addr"));
        let log = dir.join(format!("fake-{vendor}-{n}.log"));
        let bin = tracker().with_file_name("fake-metadata");
        assert!(
            bin.exists(),
            "{} is missing: run `cargo build -p tracker-tests` first",
            bin.display()
        );
        let mut cmd = Command::new(bin);
        cmd.args(["--vendor", vendor, "--addr-file"])
            .arg(&addr_file)
            .arg("--log")
            .arg(&log)
            .args(extra)
            .stdin(Stdio::null());
        let mut bg = Bg::spawn(&mut cmd, &format!("fake-metadata --vendor {vendor}"));
        let addr = bg
            .wait_addr_file(&addr_file)
            .unwrap_or_else(|st| panic!("fake-metadata --vendor {vendor} exited ({st})"));
        Fake {
            _bg: bg,
            url: format!("http://{addr}"),
            log,
        }
    }

    /// The requests it received, `METHOD URL` each.
    fn requests(&self) -> Vec<String> {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .map(str::to_string)
            .collect()
    }
}

/// Which endpoint variable a vendor's service is found at.
fn var_of(vendor: &str) -> &'static str {
    match vendor {
        "gcp" => "TRACKER_METADATA_GCP_URL",
        "alicloud" => "TRACKER_METADATA_ALIBABA_URL",
        _ => "TRACKER_METADATA_URL",
    }
}

/// The three endpoint variables: `url` for `var`, closed ports for the others.
fn endpoints(var: &str, url: &str) -> Vec<(&'static str, String)> {
    [
        "TRACKER_METADATA_URL",
        "TRACKER_METADATA_GCP_URL",
        "TRACKER_METADATA_ALIBABA_URL",
    ]
    .into_iter()
    .map(|v| {
        (
            v,
            if v == var {
                url.to_string()
            } else {
                closed_url()
            },
        )
    })
    .collect()
}

/// `resource-tracker -q --no-ebpf [--discover] --summary S.json -- CMD...`, in `dir`
/// with the caller's TRACKER_* and SENTINEL_* variables removed and `env` set.
fn tracker_run(
    dir: &Path,
    discover: bool,
    env: &[(&str, String)],
    cmd: &[&str],
) -> (Output, Option<Value>) {
    let summary = dir.join("summary.json");
    let _ = std::fs::remove_file(&summary);
    let mut c = Command::new(tracker());
    c.current_dir(dir).args(["-q", "--no-ebpf"]);
    if discover {
        c.arg("--discover");
    }
    c.arg("--summary").arg(&summary).arg("--").args(cmd);
    clean_env(&mut c);
    for (k, v) in env {
        c.env(k, v);
    }
    let o = run(&mut c);
    let s = std::fs::metadata(&summary)
        .is_ok_and(|m| m.len() > 0)
        .then(|| read_json(&summary));
    (o, s)
}

/// The summary's `cloud` object after `--discover -- true`.
fn discovered(dir: &Path, env: &[(&str, String)]) -> Value {
    let (o, s) = tracker_run(dir, true, env, &["true"]);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(err.is_empty(), "discovery must print nothing (-q): {err}");
    let s = s.expect("summary written");
    s.get("cloud")
        .cloned()
        .unwrap_or_else(|| panic!("no cloud key in the summary: {s}"))
}

fn expected(vendor: &str) -> Value {
    match vendor {
        "aws" => json!({
            "cloud_vendor_id": "aws",
            "cloud_account_id": "123456789012",
            "cloud_region_id": "eu-west-1",
            "cloud_zone_id": "eu-west-1b",
            "cloud_instance_type": "m5.large",
            "instance_id": "i-0123456789abcdef0",
        }),
        "gcp" => json!({
            "cloud_vendor_id": "gcp",
            "cloud_account_id": "spare-cores-demo",
            "cloud_region_id": "europe-west4",
            "cloud_zone_id": "europe-west4-b",
            "cloud_instance_type": "n2-standard-4",
            "instance_id": "4520031799277581759",
        }),
        "azure" => json!({
            "cloud_vendor_id": "azure",
            "cloud_account_id": "8d10da13-8125-4ba9-a717-bf7490507b3d",
            "cloud_region_id": "westeurope",
            "cloud_zone_id": "2",
            "cloud_instance_type": "Standard_D4s_v5",
            "instance_id": "02aab8a4-74ef-476e-8182-f6d2ba4166a6",
        }),
        // Hetzner's metadata has no server type; never the instance id there.
        "hcloud" => json!({
            "cloud_vendor_id": "hcloud",
            "cloud_account_id": null,
            "cloud_region_id": "eu-central",
            "cloud_zone_id": "fsn1-dc14",
            "cloud_instance_type": null,
            "instance_id": "42424242",
        }),
        "upcloud" => json!({
            "cloud_vendor_id": "upcloud",
            "cloud_account_id": null,
            "cloud_region_id": "fi-hel2",
            "cloud_zone_id": null,
            "cloud_instance_type": null,
            "instance_id": "00c78863-6ee1-4a93-a9e4-b3b2a3fb3cbb",
        }),
        "vultr" => json!({
            "cloud_vendor_id": "vultr",
            "cloud_account_id": null,
            "cloud_region_id": "ams",
            "cloud_zone_id": null,
            "cloud_instance_type": null,
            "instance_id": "a747bfc6-385a-4ba1-9e3a-5dc8b9e0a6a8",
        }),
        "alicloud" => json!({
            "cloud_vendor_id": "alicloud",
            "cloud_account_id": "1234567890123456",
            "cloud_region_id": "cn-hangzhou",
            "cloud_zone_id": "cn-hangzhou-i",
            "cloud_instance_type": "ecs.g7.xlarge",
            "instance_id": "i-bp1f2hbhdsd1bzh8zl3n",
        }),
        "ovh" => json!({
            "cloud_vendor_id": "ovh",
            "cloud_account_id": "5e1e2f3a4b5c4d6e8f7a9b0c1d2e3f4a",
            "cloud_region_id": "eu-west-par",
            "cloud_zone_id": "eu-west-par-a",
            "cloud_instance_type": "b3-8",
            "instance_id": "1b2c3d4e-5f60-4718-9a0b-1c2d3e4f5a6b",
        }),
        _ => unreachable!("{vendor}"),
    }
}

/// Checks the cloud found at a fake `vendor`; returns the requests the fake saw.
fn check_vendor(vendor: &str, extra: &[&str]) -> Vec<String> {
    let s = Scratch::new(&format!("disc-{vendor}{}", extra.len()));
    let fake = Fake::start(&s.0, vendor, extra);
    let cloud = discovered(&s.0, &endpoints(var_of(vendor), &fake.url));
    assert_eq!(
        cloud,
        expected(vendor),
        "{vendor} {extra:?}; the fake saw {:?}",
        fake.requests()
    );
    fake.requests()
}

#[test]
fn aws() {
    let reqs = check_vendor("aws", &[]);
    // IMDSv2: a token first, and no tokenless request that the fake refused.
    assert!(
        reqs.iter().any(|r| r == "PUT /latest/api/token"),
        "{reqs:?}"
    );
    assert!(
        reqs.iter()
            .any(|r| r == "GET /latest/dynamic/instance-identity/document"),
        "{reqs:?}"
    );
}

#[test]
fn aws_imdsv1_only() {
    check_vendor("aws", &["--imdsv1-only"]);
}

#[test]
fn gcp() {
    check_vendor("gcp", &[]);
}

#[test]
fn azure() {
    check_vendor("azure", &[]);
}

#[test]
fn hetzner() {
    check_vendor("hcloud", &[]);
}

#[test]
fn upcloud() {
    check_vendor("upcloud", &[]);
}

#[test]
fn vultr() {
    check_vendor("vultr", &[]);
}

#[test]
fn alibaba() {
    check_vendor("alicloud", &[]);
}

#[test]
fn alibaba_without_tokens() {
    check_vendor("alicloud", &["--imdsv1-only"]);
}

#[test]
fn ovh() {
    let reqs = check_vendor("ovh", &[]);
    // The AWS probe asked the same service and was told no (OpenStack's EC2
    // service has no token and no identity document).
    assert!(
        reqs.iter()
            .any(|r| r == "GET /latest/dynamic/instance-identity/document"),
        "{reqs:?}"
    );
}

/// A vendor's service must not be taken for another's: each fake, put at every
/// endpoint at once, is found as itself and only itself.
#[test]
fn every_fake_everywhere_is_itself() {
    let s = Scratch::new("disc-everywhere");
    for vendor in [
        "aws", "gcp", "azure", "hcloud", "upcloud", "vultr", "alicloud", "ovh",
    ] {
        let fake = Fake::start(&s.0, vendor, &[]);
        let env: Vec<(&str, String)> = [
            "TRACKER_METADATA_URL",
            "TRACKER_METADATA_GCP_URL",
            "TRACKER_METADATA_ALIBABA_URL",
        ]
        .into_iter()
        .map(|v| (v, fake.url.clone()))
        .collect();
        let cloud = discovered(&s.0, &env);
        assert_eq!(cloud, expected(vendor), "{vendor} at every endpoint");
    }
}

/// Every service silent: no cloud, and the command is not kept waiting for the
/// probe (it runs beside it).
#[test]
fn nothing_answers_and_nothing_waits() {
    let s = Scratch::new("disc-hang");
    let hang = Fake::start(&s.0, "aws", &["--hang"]);
    let env: Vec<(&str, String)> = [
        "TRACKER_METADATA_URL",
        "TRACKER_METADATA_GCP_URL",
        "TRACKER_METADATA_ALIBABA_URL",
    ]
    .into_iter()
    .map(|v| (v, hang.url.clone()))
    .collect();
    let stamp = s.path("started");
    let script = format!("date +%s.%N > '{}'", stamp.display());
    let t0 = unix_now();
    let (o, summary) = tracker_run(&s.0, true, &env, &["sh", "-c", &script]);
    let took = unix_now() - t0;
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(err.is_empty(), "{err}");
    let started: f64 = std::fs::read_to_string(&stamp)
        .expect("the command ran")
        .trim()
        .parse()
        .expect("a timestamp");
    assert!(
        started - t0 < 1.0,
        "the command started {:.3} s after the tracker (the probe's timeout is 1 s)",
        started - t0
    );
    let summary = summary.expect("summary written");
    assert_eq!(summary.get("cloud"), Some(&Value::Null), "{summary}");
    // The probe did try (and was left hanging), and gave up in bounded time.
    assert!(
        !hang.requests().is_empty(),
        "no request reached the silent service"
    );
    assert!(took < 5.0, "the run took {took:.1} s");
}

/// No `--discover` and no Sentinel token: no metadata service is contacted.
#[test]
fn no_discover_no_connection() {
    let s = Scratch::new("disc-off");
    let fake = Fake::start(&s.0, "aws", &[]);
    let env: Vec<(&str, String)> = [
        "TRACKER_METADATA_URL",
        "TRACKER_METADATA_GCP_URL",
        "TRACKER_METADATA_ALIBABA_URL",
    ]
    .into_iter()
    .map(|v| (v, fake.url.clone()))
    .collect();
    let (o, summary) = tracker_run(&s.0, false, &env, &["true"]);
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let summary = summary.expect("summary written");
    assert!(summary.get("cloud").is_none_or(Value::is_null), "{summary}");
    // Give a stray background probe the time it would need to arrive.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(fake.requests(), Vec::<String>::new());
    // The same fake, with --discover, is asked (the check above can fail).
    discovered(&s.0, &env);
    assert!(!fake.requests().is_empty());
}

/// A bad override: exit 2 with one line naming the variable, and the command does
/// not run.
#[test]
fn bad_endpoint_is_refused_before_the_command() {
    let s = Scratch::new("disc-bad");
    let marker = s.path("ran");
    let marker_s = marker.to_str().expect("utf-8 path");
    for (var, bad) in [
        ("TRACKER_METADATA_URL", "ftp://169.254.169.254"),
        ("TRACKER_METADATA_GCP_URL", "metadata.google.internal"),
        ("TRACKER_METADATA_ALIBABA_URL", "http://"),
    ] {
        let (o, _) = tracker_run(&s.0, true, &[(var, bad.to_string())], &["touch", marker_s]);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{var}={bad}: {err}");
        assert!(err.contains(var) && err.contains(bad), "{var}={bad}: {err}");
        assert!(!err.contains("panicked"), "{err}");
        assert_eq!(err.trim_end().lines().count(), 1, "one line: {err}");
        assert!(!marker.exists(), "{var}={bad}: the command ran");
    }
}
