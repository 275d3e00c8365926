//! `cargo xtask arm64`: the release aarch64 binary (target/dist) on Debian's arm64
//! kernel under qemu-system-aarch64 (TCG). The kernel, busybox and the arm64 C
//! library come from Debian with a private apt state (the host's sources and
//! packages are untouched) and are cached in target/arm64; an initramfs holds them
//! with the binary, and its /init (arm64_init.sh) tracks a swarm and an orphan, each
//! in a cgroup of its own, printing `GUEST` lines on the serial console.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{bail, Context as _};
use serde_json::Value;

use crate::{dist, root, sh};

const SUITE: &str = "bookworm";
const KERNEL_META: &str = "linux-image-cloud-arm64";
const INIT: &str = include_str!("arm64_init.sh");
/// Boot to power-off under TCG on 2 busy cores takes a few minutes.
const GUEST_LIMIT_SECS: u32 = 540;

fn dir() -> PathBuf {
    root().join("target/arm64")
}

fn apt(tool: &str) -> anyhow::Result<Command> {
    crate::kernels::private_apt(tool, &dir().join("apt"), SUITE, Some("arm64"))
}

/// Debian's arm64 packages unpacked into target/arm64/pkgs; the kernel image's path.
fn packages() -> anyhow::Result<PathBuf> {
    let pkgs = dir().join("pkgs");
    let kernel = |p: &Path| -> Option<PathBuf> {
        std::fs::read_dir(p.join("boot"))
            .ok()?
            .flatten()
            .map(|e| e.path())
            .find(|p| {
                p.file_name()
                    .is_some_and(|n| n.to_string_lossy().starts_with("vmlinuz-"))
            })
    };
    if pkgs.join(".complete").exists() {
        if let Some(k) = kernel(&pkgs) {
            return Ok(k);
        }
    }
    sh(apt("apt-get")?.arg("update"))?;
    let o = apt("apt-cache")?
        .args(["depends", KERNEL_META])
        .output()
        .context("apt-cache depends")?;
    let text = String::from_utf8_lossy(&o.stdout);
    let image = text
        .lines()
        .filter_map(|l| l.trim().strip_prefix("Depends: "))
        .find(|d| d.starts_with("linux-image-"))
        .with_context(|| format!("{KERNEL_META} names no kernel: {text}"))?
        .to_string();
    let debs = dir().join("debs");
    if debs.exists() {
        std::fs::remove_dir_all(&debs)?;
    }
    std::fs::create_dir_all(&debs)?;
    sh(apt("apt-get")?.current_dir(&debs).args([
        "download",
        &image,
        "busybox-static",
        "libc6",
        "libgcc-s1",
    ]))?;
    if pkgs.exists() {
        std::fs::remove_dir_all(&pkgs)?;
    }
    for e in std::fs::read_dir(&debs)?.flatten() {
        sh(Command::new("dpkg-deb").arg("-x").arg(e.path()).arg(&pkgs))?;
    }
    std::fs::write(pkgs.join(".complete"), &image)?;
    kernel(&pkgs).context("no vmlinuz in the kernel package")
}

/// A file of the unpacked arm64 C library, wherever Debian put it.
fn arm64_lib(pkgs: &Path, name: &str) -> anyhow::Result<PathBuf> {
    for d in [
        "lib/aarch64-linux-gnu",
        "usr/lib/aarch64-linux-gnu",
        "lib",
        "usr/lib",
    ] {
        let p = pkgs.join(d).join(name);
        if p.exists() {
            return Ok(p);
        }
    }
    bail!(
        "{name} is not in Debian's arm64 packages ({})",
        pkgs.display()
    )
}

fn needed(bin: &Path) -> anyhow::Result<Vec<String>> {
    let o = Command::new("readelf").arg("-d").arg(bin).output()?;
    let text = String::from_utf8_lossy(&o.stdout);
    Ok(text
        .lines()
        .filter(|l| l.contains("(NEEDED)"))
        .filter_map(|l| Some(l.split('[').nth(1)?.trim_end_matches(']').to_string()))
        .collect())
}

fn initramfs(pkgs: &Path, bin: &Path) -> anyhow::Result<PathBuf> {
    let tree = dir().join("initramfs");
    if tree.exists() {
        std::fs::remove_dir_all(&tree)?;
    }
    for d in ["bin", "lib/aarch64-linux-gnu", "proc", "sys", "dev", "tmp"] {
        std::fs::create_dir_all(tree.join(d))?;
    }
    let copy = |from: &Path, to: &str, mode: u32| -> anyhow::Result<()> {
        use std::os::unix::fs::PermissionsExt as _;
        let dest = tree.join(to);
        std::fs::copy(from, &dest).with_context(|| format!("copying {}", from.display()))?;
        std::fs::set_permissions(&dest, std::fs::Permissions::from_mode(mode))?;
        Ok(())
    };
    copy(&pkgs.join("bin/busybox"), "bin/busybox", 0o755)?;
    copy(bin, "resource-tracker", 0o755)?;
    copy(
        &arm64_lib(pkgs, "ld-linux-aarch64.so.1")?,
        "lib/ld-linux-aarch64.so.1",
        0o755,
    )?;
    for lib in needed(bin)? {
        if lib != "ld-linux-aarch64.so.1" {
            copy(
                &arm64_lib(pkgs, &lib)?,
                &format!("lib/aarch64-linux-gnu/{lib}"),
                0o644,
            )?;
        }
    }
    {
        use std::os::unix::fs::PermissionsExt as _;
        let init = tree.join("init");
        std::fs::write(&init, INIT)?;
        std::fs::set_permissions(&init, std::fs::Permissions::from_mode(0o755))?;
    }
    let out = dir().join("initramfs.cpio.gz");
    sh(Command::new("sh")
        .arg("-c")
        .arg("cd \"$1\" && find . | cpio -o -H newc --quiet | gzip -1 > \"$2\"")
        .arg("sh")
        .arg(&tree)
        .arg(&out))?;
    Ok(out)
}

fn summary_of(line: &str) -> anyhow::Result<(f64, Value)> {
    let usage = line
        .split_whitespace()
        .find_map(|w| w.strip_prefix("usage_usec="))
        .and_then(|v| v.parse::<f64>().ok())
        .with_context(|| format!("no usage_usec in {line}"))?;
    let json = line
        .split_once("summary=")
        .map(|(_, j)| j)
        .with_context(|| format!("no summary in {line}"))?;
    let v: Value = serde_json::from_str(json).with_context(|| format!("summary JSON in {line}"))?;
    Ok((usage / 1e6, v))
}

fn num(v: &Value, k: &str) -> f64 {
    v[k].as_f64().unwrap_or(f64::NAN)
}

/// The guest's swarm and orphan runs against their cgroups' CPU and their shapes'
/// counts: what failed.
fn judged(guest: &[&str]) -> anyhow::Result<Vec<String>> {
    let mut failures = Vec::new();
    for (name, check) in [("swarm", 0), ("orphan", 1)] {
        let line = guest
            .iter()
            .find(|l| l.starts_with(&format!("{name} rc=")))
            .with_context(|| format!("no {name} line"))?;
        if !line.starts_with(&format!("{name} rc=0 ")) {
            failures.push(format!("{name}: {line}"));
            continue;
        }
        let (cgroup_cpu, s) = summary_of(line)?;
        let cpu = num(&s, "cpu_total_secs");
        let spawned = num(&s, "processes_spawned");
        eprintln!(
            "xtask: arm64 {name}: backend {}, processes_spawned {spawned}, still_running {}, wall {:.2} s, CPU {cpu:.3} s, cgroup CPU {cgroup_cpu:.3} s, degraded {}",
            s["backend"], s["still_running"], num(&s, "wall_secs"), s["degraded"]
        );
        if s["backend"] != "ebpf" {
            failures.push(format!("{name}: backend {}", s["backend"]));
        }
        // The tree's CPU against the kernel's own count for its cgroup: the job's
        // first instructions ran before it moved itself in.
        if (cpu - cgroup_cpu).abs() > (0.1 * cgroup_cpu).max(0.05) {
            failures.push(format!(
                "{name}: CPU {cpu:.3} s, its cgroup {cgroup_cpu:.3} s"
            ));
        }
        let ok = match check {
            // sh and its 100 children.
            0 => spawned == 101.0,
            // sh, the subshell, and one or two of its commands (ash may exec the last
            // one in place of a fork); the orphan's second must be waited for.
            _ => (3.0..=4.0).contains(&spawned) && num(&s, "wall_secs") >= 1.0,
        };
        if !ok {
            failures.push(format!("{name}: out of bounds: {s}"));
        }
    }
    Ok(failures)
}

pub fn run() -> anyhow::Result<()> {
    let t0 = Instant::now();
    let bin = dist::dist_dir().join("resource-tracker-aarch64");
    if !bin.exists() {
        bail!(
            "{} is missing: run `cargo xtask wheel --release` first",
            bin.display()
        );
    }
    if Command::new("qemu-system-aarch64")
        .arg("--version")
        .output()
        .is_err()
    {
        bail!("qemu-system-aarch64 is missing (Debian's qemu-system-arm)");
    }
    let kernel = packages()?;
    let initrd = initramfs(&dir().join("pkgs"), &bin)?;
    let boot = Instant::now();
    let o = Command::new("timeout")
        .arg(GUEST_LIMIT_SECS.to_string())
        .args([
            "qemu-system-aarch64",
            "-M",
            "virt",
            "-cpu",
            "max",
            "-m",
            "1024",
        ])
        .args(["-smp", "2", "-nographic", "-no-reboot", "-kernel"])
        .arg(&kernel)
        .arg("-initrd")
        .arg(&initrd)
        .args(["-append", "console=ttyAMA0 panic=-1 quiet"])
        .output()
        .context("qemu-system-aarch64")?;
    let console = String::from_utf8_lossy(&o.stdout);
    let guest: Vec<&str> = console
        .lines()
        .filter_map(|l| l.trim_end_matches('\r').strip_prefix("GUEST "))
        .collect();
    for l in &guest {
        if !l.contains("summary=") {
            eprintln!("xtask: arm64 guest: {l}");
        }
    }
    if !guest.contains(&"done") {
        let tail: Vec<&str> = console.lines().rev().take(30).collect();
        bail!(
            "the guest did not finish ({}, {:.0} s); console tail:\n{}",
            o.status,
            boot.elapsed().as_secs_f64(),
            tail.into_iter().rev().collect::<Vec<_>>().join("\n")
        );
    }
    let failures = judged(&guest)?;
    if !failures.is_empty() {
        bail!("arm64 guest:\n{}", failures.join("\n"));
    }
    eprintln!(
        "xtask: arm64 passed (guest {:.0} s, all {:.0} s)",
        boot.elapsed().as_secs_f64(),
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
