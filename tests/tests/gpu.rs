//! GPU telemetry through the real NVML code path: a fake `libnvidia-ml.so.1` built
//! from tests/fixtures/fake_nvml.c with gcc and found by the tracker's dlopen through
//! LD_LIBRARY_PATH. The fake answers from a scenario file (FAKE_NVML_SCENARIO) that
//! it re-reads on every call, so the tracked command can put its own pid in it.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
};

use serde_json::Value;
use tracker_tests::{e2e::*, *};

const MIB: f64 = 1048576.0;

/// Two GPUs; the second does not support temperature and power.
const SCENARIO: &str = "\
gpus 2
driver 550.54.15
cuda 12040
name 0 NVIDIA Fake A100-SXM4-40GB
uuid 0 GPU-00000000-1111-2222-3333-444444444444
busid 0 00000000:3B:00.0
pcidev 0 20B010DE
util 0 40
mem 0 42949672960 10737418240
temp 0 55
power 0 123456
clock 0 1410
cores 0 6912
name 1 NVIDIA Fake A100-SXM4-40GB
uuid 1 GPU-55555555-6666-7777-8888-999999999999
busid 1 00000000:86:00.0
pcidev 1 20B010DE
util 1 0
mem 1 42949672960 1048576
temp 1 40
power 1 50000
clock 1 210
cores 1 6912
fail 1 temp 3
fail 1 power 3
";

fn gcc_ok() -> bool {
    require(
        have("gcc"),
        "gcc is not installed (the GPU tests build a fake libnvidia-ml.so.1)",
    )
}

fn gcc(src: &Path, out: &Path) {
    let o = run(Command::new("gcc")
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(out)
        .arg(src));
    assert!(
        o.status.success(),
        "gcc {}: {}",
        src.display(),
        String::from_utf8_lossy(&o.stderr)
    );
}

/// Builds the fake into `dir/lib/libnvidia-ml.so.1`; returns `dir/lib`.
fn fake_lib(dir: &Path) -> PathBuf {
    let lib = dir.join("lib");
    std::fs::create_dir_all(&lib).expect("lib dir");
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("fixtures/fake_nvml.c");
    gcc(&src, &lib.join("libnvidia-ml.so.1"));
    lib
}

/// The tracker with the fake library (or none) and a scenario.
fn tracker_with(
    dir: &Path,
    lib: &Path,
    scenario: &Path,
    args: &[&str],
    rust_log: Option<&str>,
) -> Output {
    let mut cmd = Command::new(tracker());
    cmd.current_dir(dir).args(args);
    clean_env(&mut cmd);
    cmd.env("LD_LIBRARY_PATH", lib)
        .env("FAKE_NVML_SCENARIO", scenario);
    if let Some(l) = rust_log {
        cmd.env("RUST_LOG", l);
    }
    let o = run(&mut cmd);
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(!err.contains("panicked"), "{args:?}: {err}");
    o
}

/// A command that appends its own pid (the tree's root) as a process of both GPUs
/// to the scenario, then sleeps (same pid: exec).
fn tree_cmd(scenario: &Path) -> String {
    format!(
        "echo \"proc 0 $$ 2147483648 30\" >> {s}; echo \"proc 1 $$ 1073741824 20\" >> {s}; exec sleep 1.5",
        s = scenario.display()
    )
}

fn f(v: &Value, ptr: &str) -> Option<f64> {
    v.pointer(ptr).and_then(Value::as_f64)
}

#[test]
fn every_field_aggregates_and_the_tree() {
    if !gcc_ok() {
        return;
    }
    let s = Scratch::new("gpu-fields");
    let lib = fake_lib(&s.0);
    let me = std::process::id();
    for backend in [&[][..], &["--no-ebpf"][..]] {
        if backend.is_empty() && !ebpf_available() {
            continue;
        }
        // A process outside the tree (this test) uses GPU 0 too: never attributed.
        let scen = s.path("scenario");
        std::fs::write(&scen, format!("{SCENARIO}proc 0 {me} 999 50\n")).expect("scenario");
        let out = s.path("out.jsonl");
        let sum = s.path("summary.json");
        let cmd = tree_cmd(&scen);
        let mut args = vec!["-q", "-i", "0.2", "-f", "json", "-o"];
        let (out_s, sum_s) = (out.to_string_lossy(), sum.to_string_lossy());
        args.extend([&*out_s, "--summary", &*sum_s]);
        args.extend(backend);
        args.extend(["--", "sh", "-c", &cmd]);
        let o = tracker_with(&s.0, &lib, &scen, &args, None);
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "{err}");
        let samples = read_jsonl(&out);
        assert!(samples.len() >= 5, "{} samples", samples.len());
        for smp in &samples {
            let g = smp["gpu"].as_array().expect("gpu array");
            assert_eq!(g.len(), 2, "{smp}");
            let g0 = &g[0];
            assert_eq!(g0["uuid"], "GPU-00000000-1111-2222-3333-444444444444");
            assert_eq!(g0["name"], "NVIDIA Fake A100-SXM4-40GB");
            assert_eq!(g0["device_type"], "GPU");
            assert_eq!(g0["host_id"], "00000000:3B:00.0");
            assert_eq!(g0["detail"]["pci_device_id"], "0x20b010de");
            assert_eq!(g0["detail"]["driver_version"], "550.54.15");
            assert_eq!(g0["detail"]["cuda_driver_version"], "12.4");
            assert_eq!(f(g0, "/utilization_pct"), Some(40.0));
            assert_eq!(g0["vram_total_bytes"], 42949672960u64);
            assert_eq!(g0["vram_used_bytes"], 10737418240u64);
            assert_eq!(f(g0, "/vram_used_pct"), Some(25.0));
            assert_eq!(f(g0, "/temperature_celsius"), Some(55.0));
            assert_eq!(f(g0, "/power_watts"), Some(123.456));
            assert_eq!(f(g0, "/frequency_mhz"), Some(1410.0));
            assert_eq!(g0["core_count"], 6912);
            // Unsupported calls: null, the rest still filled.
            let g1 = &g[1];
            assert!(g1["temperature_celsius"].is_null(), "{g1}");
            assert!(g1["power_watts"].is_null(), "{g1}");
            assert_eq!(f(g1, "/utilization_pct"), Some(0.0));
            assert_eq!(f(g1, "/frequency_mhz"), Some(210.0));
            assert_eq!(g1["vram_used_bytes"], 1048576);
            assert_eq!(g1["host_id"], "00000000:86:00.0");
        }
        // One warning per unsupported field and GPU for the whole run.
        assert_eq!(
            err.matches("temperature_celsius unavailable").count(),
            1,
            "{err}"
        );
        assert_eq!(err.matches("power_watts unavailable").count(), 1, "{err}");
        // The tree: 2048 + 1024 MiB, 30 % + 20 % → 0.5 GPUs on 2 GPUs; the outside
        // process (999 bytes, 50 % of GPU 0) is not in it.
        let with_tree: Vec<&Value> = samples
            .iter()
            .filter(|x| f(x, "/process/gpu_vram_mib").is_some_and(|v| v > 0.0))
            .collect();
        assert!(with_tree.len() >= 2, "{backend:?}: {samples:?}");
        for x in &with_tree[..with_tree.len() - 1] {
            assert_eq!(f(x, "/process/gpu_vram_mib"), Some(3072.0), "{x}");
            assert!(
                (f(x, "/process/gpu_usage").unwrap() - 0.5).abs() < 1e-9,
                "{x}"
            );
            assert_eq!(x["process"]["gpu_utilized"], 2, "{x}");
        }
        let summary = read_json(&sum);
        let h = &summary["host"];
        assert_eq!(h["host_gpu_model"], "NVIDIA Fake A100-SXM4-40GB");
        assert_eq!(h["host_gpu_count"], 2);
        assert_eq!(f(h, "/host_gpu_memory_mib"), Some(81920.0));
    }

    // CSV aggregates.
    let scen = s.path("scenario");
    std::fs::write(&scen, SCENARIO).expect("scenario");
    let out = s.path("out.csv");
    let cmd = tree_cmd(&scen);
    let out_s = out.to_string_lossy();
    let o = tracker_with(
        &s.0,
        &lib,
        &scen,
        &[
            "-q", "-i", "0.2", "-f", "csv", "-o", &out_s, "--", "sh", "-c", &cmd,
        ],
        None,
    );
    assert_eq!(
        o.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&o.stderr)
    );
    let text = std::fs::read_to_string(&out).expect("csv");
    let mut lines = text.lines();
    let header: Vec<&str> = lines.next().expect("header").split(',').collect();
    let col = |row: &[&str], name: &str| -> f64 {
        let i = header.iter().position(|h| *h == name).expect(name);
        row[i]
            .parse()
            .unwrap_or_else(|e| panic!("{name}={:?}: {e}", row[i]))
    };
    let rows: Vec<Vec<&str>> = lines.map(|l| l.split(',').collect()).collect();
    assert!(rows.len() >= 5);
    for r in &rows {
        assert_eq!(col(r, "system_gpu_usage"), 0.4);
        assert_eq!(
            col(r, "system_gpu_vram_mib"),
            (10737418240.0 + 1048576.0) / MIB
        );
        assert_eq!(col(r, "system_gpu_utilized"), 1.0);
    }
    let tree_rows: Vec<&Vec<&str>> = rows
        .iter()
        .filter(|r| col(r, "process_gpu_vram_mib") > 0.0)
        .collect();
    assert!(tree_rows.len() >= 2, "{text}");
    let r = tree_rows[0];
    assert_eq!(col(r, "process_gpu_usage"), 0.5);
    assert_eq!(col(r, "process_gpu_vram_mib"), 3072.0);
    assert_eq!(col(r, "process_gpu_utilized"), 2.0);
}

/// The host has a real NVIDIA library on the loader's path: the "missing" cases
/// cannot be staged with LD_LIBRARY_PATH alone.
fn real_nvml_installed() -> bool {
    let o = Command::new("ldconfig").arg("-p").output();
    let real = o.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains("libnvidia-ml.so.1"));
    if real {
        eprintln!("SKIPPED: a real libnvidia-ml.so.1 is installed");
    }
    real
}

fn no_driver_run(dir: &Path, lib: &Path, what: &str) {
    let scen = dir.join("scenario");
    std::fs::write(&scen, SCENARIO).expect("scenario");
    let out = dir.join(format!("{what}.jsonl"));
    let out_s = out.to_string_lossy();
    let args = [
        "-q", "-i", "0.2", "-f", "json", "-o", &out_s, "--", "sleep", "0.5",
    ];
    let o = tracker_with(dir, lib, &scen, &args, Some("info"));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{what}: {err}");
    assert_eq!(err.matches("no NVIDIA driver").count(), 1, "{what}: {err}");
    assert_eq!(
        err.lines()
            .filter(|l| l.to_lowercase().contains("nvml") || l.contains("NVIDIA"))
            .count(),
        1,
        "{what}: {err}"
    );
    let samples = read_jsonl(&out);
    assert!(!samples.is_empty());
    for smp in &samples {
        assert_eq!(smp["gpu"], serde_json::json!([]), "{what}");
        assert!(smp["process"]["gpu_usage"].is_null(), "{what}: {smp}");
    }
    // At the default level, nothing at all.
    let o = tracker_with(dir, lib, &scen, &args, None);
    assert_eq!(o.status.code(), Some(0));
    assert!(
        o.stderr.is_empty(),
        "{what}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

#[test]
fn missing_library() {
    if real_nvml_installed() {
        return;
    }
    let s = Scratch::new("gpu-missing");
    let empty = s.path("empty");
    std::fs::create_dir_all(&empty).expect("dir");
    no_driver_run(&s.0, &empty, "missing");
}

#[test]
fn library_that_is_not_nvml() {
    if !gcc_ok() || real_nvml_installed() {
        return;
    }
    let s = Scratch::new("gpu-notnvml");
    let lib = s.path("lib");
    std::fs::create_dir_all(&lib).expect("dir");
    let src = s.path("empty.c");
    std::fs::write(&src, "int not_nvml(void) { return 1; }\n").expect("src");
    gcc(&src, &lib.join("libnvidia-ml.so.1"));
    no_driver_run(&s.0, &lib, "not-nvml");
}

#[test]
fn gpu_lost_mid_run() {
    if !gcc_ok() {
        return;
    }
    let s = Scratch::new("gpu-lost");
    let lib = fake_lib(&s.0);
    let scen = s.path("scenario");
    // Start (4 calls per GPU) and the first readings pass; then every call fails.
    std::fs::write(&scen, format!("{SCENARIO}lost_after 40\n")).expect("scenario");
    let out = s.path("out.jsonl");
    let out_s = out.to_string_lossy();
    let args = [
        "-q",
        "-i",
        "0.1",
        "-f",
        "json",
        "-o",
        &out_s,
        "--",
        "sh",
        "-c",
        "sleep 1; exit 3",
    ];
    let o = tracker_with(&s.0, &lib, &scen, &args, None);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(3), "{err}");
    // One warning per GPU, not one per field or sample.
    assert_eq!(err.matches("is lost").count(), 2, "{err}");
    let samples = read_jsonl(&out);
    assert!(samples.len() >= 5, "{}", samples.len());
    assert!(
        f(&samples[0], "/gpu/0/utilization_pct").is_some(),
        "{}",
        samples[0]
    );
    let last = samples.last().expect("a sample");
    for g in last["gpu"].as_array().expect("gpu") {
        assert!(g["uuid"].is_string(), "{g}");
        for k in [
            "utilization_pct",
            "vram_used_bytes",
            "temperature_celsius",
            "power_watts",
            "frequency_mhz",
        ] {
            assert!(g[k].is_null(), "{k}: {g}");
        }
    }
    assert_eq!(f(last, "/process/gpu_usage"), Some(0.0));
}

/// A process list that grows between NVML's count call and its fill call (the
/// driver answers INSUFFICIENT_SIZE): the collector asks again, so the tree's VRAM
/// is still attributed and nothing is warned.
#[test]
fn process_list_growing_between_calls() {
    if !gcc_ok() {
        return;
    }
    let s = Scratch::new("gpu-grow");
    let lib = fake_lib(&s.0);
    let scen = s.path("scenario");
    std::fs::write(&scen, format!("{SCENARIO}grow_once 1\n")).expect("scenario");
    let out = s.path("out.jsonl");
    let out_s = out.to_string_lossy();
    let cmd = tree_cmd(&scen);
    let o = tracker_with(
        &s.0,
        &lib,
        &scen,
        &[
            "-q",
            "-i",
            "0.2",
            "-o",
            &out_s,
            "--no-ebpf",
            "--",
            "sh",
            "-c",
            &cmd,
        ],
        None,
    );
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        !err.contains("compute processes") && !err.contains("graphics processes"),
        "warned: {err}"
    );
    let samples = read_jsonl(&out);
    // Before the root has written itself into the scenario the tree holds nothing;
    // from then on 2 GiB + 1 GiB on the two GPUs, in every sample (a failed list
    // would show less, or warn above) but the final one, taken after it exited.
    let vram: Vec<f64> = samples[..samples.len() - 1]
        .iter()
        .filter_map(|x| f(x, "/process/gpu_vram_mib"))
        .collect();
    assert!(vram.contains(&3072.0), "{vram:?}");
    let first = vram.iter().position(|&v| v > 0.0).unwrap_or(0);
    assert!(vram[first..].iter().all(|&v| v == 3072.0), "{vram:?}");
}
