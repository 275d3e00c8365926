//! `cargo xtask old-glibc`: the x86_64 release wheel (target/dist) installed with pip
//! into the Python of a Debian 11 root (glibc 2.31, older than this machine's) and
//! run there: the API tracks a swarm with procfs as user nobody and with eBPF as
//! root on the host kernel. The root is made once by debootstrap and kept in
//! target/old-glibc (about 3 minutes to make).

use std::{
    path::{Path, PathBuf},
    process::{Command, Output},
    time::Instant,
};

use anyhow::{bail, Context as _};

use crate::{dist, root, sh};

const SUITE: &str = "bullseye";
const MIRROR: &str = "http://deb.debian.org/debian";

/// Bind mounts under the root, taken down again whatever happens.
struct Mounts(Vec<PathBuf>);

impl Mounts {
    fn bind(&mut self, from: &str, to: PathBuf) -> anyhow::Result<()> {
        std::fs::create_dir_all(&to)?;
        sh(Command::new("mount").arg("--rbind").arg(from).arg(&to))?;
        // Unmounting below a recursive bind must not reach the host's own mounts.
        sh(Command::new("mount").arg("--make-rslave").arg(&to))?;
        self.0.push(to);
        Ok(())
    }
}

impl Drop for Mounts {
    fn drop(&mut self) {
        for m in self.0.iter().rev() {
            let _ = Command::new("umount").arg("-R").arg("-l").arg(m).status();
        }
    }
}

fn rootfs() -> anyhow::Result<PathBuf> {
    let base = root().join("target/old-glibc");
    let rootfs = base.join(SUITE);
    if rootfs.join(".complete").exists() {
        return Ok(rootfs);
    }
    if Command::new("debootstrap")
        .arg("--version")
        .output()
        .is_err()
    {
        sh(Command::new("apt-get").args(["install", "-y", "-qq", "debootstrap"]))?;
    }
    let tmp = base.join(format!("{SUITE}.partial"));
    if tmp.exists() {
        std::fs::remove_dir_all(&tmp).with_context(|| format!("removing {}", tmp.display()))?;
    }
    std::fs::create_dir_all(&base)?;
    let t0 = Instant::now();
    sh(Command::new("debootstrap")
        .args(["--variant=minbase", "--include=python3,python3-venv", SUITE])
        .arg(&tmp)
        .arg(MIRROR))?;
    std::fs::write(tmp.join(".complete"), "")?;
    std::fs::rename(&tmp, &rootfs)?;
    eprintln!(
        "xtask: {SUITE} root made in {:.0} s",
        t0.elapsed().as_secs_f64()
    );
    Ok(rootfs)
}

/// A command run inside the root with a clean environment.
fn chroot(rootfs: &Path, user: Option<&str>, args: &[&str]) -> anyhow::Result<Output> {
    let mut c = Command::new("chroot");
    if let Some(u) = user {
        c.arg(format!("--userspec={u}"));
    }
    c.arg(rootfs)
        .args(args)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .env("HOME", "/tmp")
        .env("LANG", "C.UTF-8");
    c.output().with_context(|| format!("chroot {args:?}"))
}

fn checked(what: &str, o: Output) -> anyhow::Result<String> {
    let out = String::from_utf8_lossy(&o.stdout).trim().to_string();
    if !o.status.success() {
        bail!(
            "{what}: {}\n{out}\n{}",
            o.status,
            String::from_utf8_lossy(&o.stderr).trim()
        );
    }
    Ok(out)
}

/// A binary built against this machine's glibc is what the wheel would carry
/// without zig: on the old root the dynamic loader refuses it, naming the missing
/// version.
fn host_build_refused(rootfs: &Path) -> anyhow::Result<()> {
    let host_build = ["release", "debug"]
        .iter()
        .map(|p| root().join("target").join(p).join("resource-tracker"))
        .find(|p| p.exists())
        .context(
            "no host build of resource-tracker in target/release or target/debug (cargo build)",
        )?;
    std::fs::copy(&host_build, rootfs.join("tmp/host-build"))?;
    let o = chroot(rootfs, None, &["/tmp/host-build", "--version"])?;
    let err = String::from_utf8_lossy(&o.stderr);
    if o.status.success() || !err.contains("GLIBC_") {
        bail!(
            "{} on {SUITE}: expected the loader's GLIBC refusal, got {}: {err}",
            host_build.display(),
            o.status
        );
    }
    eprintln!(
        "xtask: {SUITE}, {}: {} ({})",
        host_build.display(),
        err.lines().next().unwrap_or_default(),
        o.status
    );
    Ok(())
}

pub fn run() -> anyhow::Result<()> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        bail!("old-glibc needs root (debootstrap, chroot, mounts, eBPF)");
    }
    let t0 = Instant::now();
    let wheel = dist::wheel_of(&dist::dist_dir(), "x86_64")
        .context("no x86_64 release wheel: run `cargo xtask wheel --release` first")?;
    let rootfs = rootfs()?;
    let glibc = checked(
        "ldd --version",
        chroot(&rootfs, None, &["ldd", "--version"])?,
    )?;
    eprintln!(
        "xtask: {SUITE}: {}",
        glibc.lines().next().unwrap_or_default()
    );

    let mut mounts = Mounts(Vec::new());
    mounts.bind("/proc", rootfs.join("proc"))?;
    mounts.bind("/sys", rootfs.join("sys"))?;
    mounts.bind("/dev", rootfs.join("dev"))?;

    let name = wheel.file_name().context("wheel name")?.to_string_lossy();
    let inside_wheel = format!("/tmp/{name}");
    std::fs::copy(&wheel, rootfs.join(inside_wheel.trim_start_matches('/')))?;
    std::fs::copy(
        root().join("tests/fixtures/python/old_glibc.py"),
        rootfs.join("tmp/old_glibc.py"),
    )?;
    let venv = rootfs.join("opt/rt");
    if venv.exists() {
        std::fs::remove_dir_all(&venv)?;
    }
    checked(
        "python3 -m venv",
        chroot(&rootfs, None, &["python3", "-m", "venv", "/opt/rt"])?,
    )?;
    // The distribution's own pip (20.3.4 on bullseye) decides whether the tag fits.
    checked(
        "pip install",
        chroot(
            &rootfs,
            None,
            &[
                "/opt/rt/bin/pip",
                "install",
                "-q",
                "--disable-pip-version-check",
                "--no-index",
                &inside_wheel,
            ],
        )?,
    )?;
    let as_nobody = checked(
        "the API as nobody (procfs)",
        chroot(
            &rootfs,
            Some("65534:65534"),
            &["/opt/rt/bin/python", "/tmp/old_glibc.py", "procfs"],
        )?,
    )?;
    eprintln!("xtask: {SUITE}, nobody: {as_nobody}");
    let as_root = checked(
        "the API as root (eBPF)",
        chroot(
            &rootfs,
            None,
            &["/opt/rt/bin/python", "/tmp/old_glibc.py", "ebpf"],
        )?,
    )?;
    eprintln!("xtask: {SUITE}, root: {as_root}");

    host_build_refused(&rootfs)?;
    drop(mounts);
    eprintln!(
        "xtask: old-glibc passed in {:.0} s",
        t0.elapsed().as_secs_f64()
    );
    Ok(())
}
