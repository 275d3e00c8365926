//! What users install: release wheels, bare binaries and Debian packages for x86_64
//! and aarch64 (target/dist), and `install` into a prefix where `sudo` finds the
//! binary.
//!
//! The release builds link against glibc 2.17 through zig (maturin `--zig`,
//! manylinux2014), so the wheels install on Amazon Linux 2, RHEL 8, Ubuntu 20.04 and
//! Debian 11. They use their own target directory (target/wheel-build): sharing
//! target/release with `cargo build --release`, whose linker and flags differ, made
//! each build throw away the other's tracker-agent.

use std::{
    path::{Path, PathBuf},
    process::Command,
    time::Instant,
};

use anyhow::{bail, Context as _};

use crate::{root, sh};

/// (Rust target, wheel/binary architecture, Debian architecture).
pub const TARGETS: [(&str, &str, &str); 2] = [
    ("x86_64-unknown-linux-gnu", "x86_64", "amd64"),
    ("aarch64-unknown-linux-gnu", "aarch64", "arm64"),
];

/// The newest glibc symbol version a release binary may ask for (manylinux2014).
pub const GLIBC_MAX: (u32, u32) = (2, 17);

pub fn dist_dir() -> PathBuf {
    root().join("target/dist")
}

/// Builds every target into target/dist and checks each binary's glibc needs and
/// each wheel's tag; fails on the first that does not hold.
pub fn build() -> anyhow::Result<PathBuf> {
    let dist = dist_dir();
    if dist.exists() {
        std::fs::remove_dir_all(&dist).with_context(|| format!("removing {}", dist.display()))?;
    }
    std::fs::create_dir_all(&dist).with_context(|| format!("creating {}", dist.display()))?;
    let venv = root().join("target/py-release");
    let target_dir = root().join("target/wheel-build");
    // maturin finds zig as `python3 -m ziglang` of the first python3 on PATH.
    let path = format!(
        "{}:{}",
        venv.join("bin").display(),
        std::env::var("PATH").unwrap_or_default()
    );
    for (triple, arch, deb_arch) in TARGETS {
        let t0 = Instant::now();
        sh(Command::new(venv.join("bin/maturin"))
            .current_dir(root().join("python"))
            .env("PATH", &path)
            .args(["build", "--quiet", "--release", "--zig"])
            .args(["--compatibility", "manylinux2014", "--target", triple])
            .arg("--target-dir")
            .arg(&target_dir)
            .arg("-o")
            .arg(&dist))?;
        let bin = target_dir.join(triple).join("release/resource-tracker");
        let max = glibc_max(&bin)?;
        if max > GLIBC_MAX {
            bail!(
                "{} asks for GLIBC_{}.{}, newer than the {}.{} of manylinux2014",
                bin.display(),
                max.0,
                max.1,
                GLIBC_MAX.0,
                GLIBC_MAX.1
            );
        }
        let wheel = wheel_of(&dist, arch)?;
        let name = wheel.file_name().unwrap_or_default().to_string_lossy();
        if !name.contains(&format!("manylinux_2_17_{arch}")) {
            bail!("{name}: not tagged manylinux_2_17_{arch}");
        }
        let out_bin = dist.join(format!("resource-tracker-{arch}"));
        std::fs::copy(&bin, &out_bin)
            .with_context(|| format!("copying {} to {}", bin.display(), out_bin.display()))?;
        let deb = build_deb(&bin, deb_arch, &dist)?;
        eprintln!(
            "xtask: {arch}: GLIBC_{}.{} at most; {name}; {}; {:.0} s",
            max.0,
            max.1,
            deb.display(),
            t0.elapsed().as_secs_f64()
        );
    }
    Ok(dist)
}

/// The one wheel for `arch` in `dir`.
pub fn wheel_of(dir: &Path, arch: &str) -> anyhow::Result<PathBuf> {
    let found: Vec<PathBuf> = std::fs::read_dir(dir)
        .with_context(|| format!("reading {}", dir.display()))?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name().is_some_and(|n| {
                let n = n.to_string_lossy();
                n.starts_with("resource_tracker_ebpf-") && n.ends_with(&format!("_{arch}.whl"))
            })
        })
        .collect();
    match found.as_slice() {
        [w] => Ok(w.clone()),
        other => bail!(
            "expected one {arch} wheel in {}, found {other:?}",
            dir.display()
        ),
    }
}

/// The newest GLIBC_x.y an ELF file's version-needs section names (readelf reads
/// every architecture's ELF, unlike the host's objdump).
pub fn glibc_max(bin: &Path) -> anyhow::Result<(u32, u32)> {
    let o = Command::new("readelf")
        .args(["-V", "-W"])
        .arg(bin)
        .output()
        .context("readelf (binutils)")?;
    if !o.status.success() {
        bail!(
            "readelf -V {}: {}",
            bin.display(),
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    let text = String::from_utf8_lossy(&o.stdout);
    let max = text
        .split_whitespace()
        .filter_map(|w| w.strip_prefix("GLIBC_"))
        .filter_map(|v| {
            let mut it = v.split('.').map(|n| n.parse::<u32>().ok());
            Some((it.next()??, it.next().flatten().unwrap_or(0)))
        })
        .max();
    max.with_context(|| format!("{}: no GLIBC_ symbol version", bin.display()))
}

/// A Debian package of the binary: /usr/bin/resource-tracker, which is on sudo's
/// secure_path, installable with `apt install ./resource-tracker_….deb`.
fn build_deb(bin: &Path, deb_arch: &str, dist: &Path) -> anyhow::Result<PathBuf> {
    let version = env!("CARGO_PKG_VERSION");
    let tree = root().join(format!("target/wheel-build/deb-{deb_arch}"));
    if tree.exists() {
        std::fs::remove_dir_all(&tree).with_context(|| format!("removing {}", tree.display()))?;
    }
    let usr_bin = tree.join("usr/bin");
    let debian = tree.join("DEBIAN");
    for d in [&usr_bin, &debian] {
        std::fs::create_dir_all(d).with_context(|| format!("creating {}", d.display()))?;
    }
    let dest = usr_bin.join("resource-tracker");
    std::fs::copy(bin, &dest).with_context(|| format!("copying {}", bin.display()))?;
    set_mode(&dest, 0o755)?;
    let kib = std::fs::metadata(&dest)?.len().div_ceil(1024);
    let control = format!(
        "Package: resource-tracker\n\
         Version: {version}\n\
         Architecture: {deb_arch}\n\
         Maintainer: resource-tracker developers <resource-tracker@localhost>\n\
         Installed-Size: {kib}\n\
         Depends: libc6 (>= 2.17)\n\
         Section: admin\n\
         Priority: optional\n\
         Description: eBPF-assisted Linux resource tracker\n \
         Tracks a whole process tree with the kernel's own accounting (eBPF, with a\n \
         procfs fallback): CPU, memory, disk, network and GPU, as JSON lines, CSV, a\n \
         summary or an HTML report.\n"
    );
    std::fs::write(debian.join("control"), control)?;
    let deb = dist.join(format!("resource-tracker_{version}_{deb_arch}.deb"));
    sh(Command::new("dpkg-deb")
        .args(["--root-owner-group", "-Zxz", "--build"])
        .arg(&tree)
        .arg(&deb))?;
    Ok(deb)
}

fn set_mode(p: &Path, mode: u32) -> anyhow::Result<()> {
    use std::os::unix::fs::PermissionsExt as _;
    std::fs::set_permissions(p, std::fs::Permissions::from_mode(mode))
        .with_context(|| format!("chmod {mode:o} {}", p.display()))
}

/// Copies `bin` to PREFIX/bin/resource-tracker (mode 755) through a temporary name
/// and a rename, so a tracker running from there keeps its file.
pub fn install(bin: &Path, prefix: &Path) -> anyhow::Result<PathBuf> {
    let dir = prefix.join("bin");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let dest = dir.join("resource-tracker");
    let tmp = dir.join(".resource-tracker.new");
    std::fs::copy(bin, &tmp)
        .with_context(|| format!("copying {} to {}", bin.display(), tmp.display()))?;
    set_mode(&tmp, 0o755)?;
    std::fs::rename(&tmp, &dest).with_context(|| format!("renaming to {}", dest.display()))?;
    Ok(dest)
}
