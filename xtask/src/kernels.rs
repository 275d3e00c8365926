//! `cargo xtask kernels [LINE…] [--timeout SECS]`: the engine and the node agent on
//! Debian's kernels under qemu (TCG). Each line's kernel package is fetched with
//! apt-get into target/kernels (a private apt state: the host's sources and
//! packages are not touched) and cached there; an initramfs holds busybox, the
//! release tracker, the workload generator and `kernel-checks` (tests/src/bin) with
//! their shared libraries; the guest's /init mounts cgroup v2 and a ram disk and runs
//! the checks, whose lines come back on the serial console. One line per kernel and
//! check; with no LINE (the whole matrix) docs/kernels.md is written from the
//! results. Exits non-zero when a check fails, a kernel cannot be fetched or a guest
//! does not finish within its bound (it is then killed).

use std::{
    fmt::Write as _,
    io::{BufRead as _, BufReader},
    path::{Path, PathBuf},
    process::{Command, Stdio},
    sync::mpsc,
    time::{Duration, Instant},
};

use anyhow::{bail, Context as _};

/// The kernel lines: (name, Debian suite whose linux-image-cloud-amd64 it is, the
/// distributions that ship that kernel).
pub const LINES: [(&str, &str, &str); 4] = [
    ("5.10", "bullseye", "Debian 11, Amazon Linux 2"),
    ("6.1", "bookworm", "Debian 12, Amazon Linux 2023"),
    ("6.12", "trixie", "Debian 13"),
    ("7.x", "sid", "Debian unstable"),
];

/// The host's own kernel: the checks run directly on it (it has no Debian package).
pub const HOST: &str = "host";

/// How long one guest may take, boot to power-off, unless --timeout says otherwise.
const GUEST_BOUND: Duration = Duration::from_secs(600);

/// One check's result in one guest.
pub struct Cell {
    pub check: String,
    pub ok: bool,
    pub figures: String,
}

/// One kernel line: what ran and what it said.
pub struct Outcome {
    pub line: String,
    /// The package's version and the guest's `uname -r`.
    pub package: String,
    pub release: String,
    pub cells: Vec<Cell>,
    /// Why the line has no (or incomplete) results: fetch, boot or time-out.
    pub error: Option<String>,
    pub boot_secs: f64,
    pub total_secs: f64,
}

impl Outcome {
    fn failed(&self) -> usize {
        self.cells.iter().filter(|c| !c.ok).count() + usize::from(self.error.is_some())
    }
}

fn dir() -> PathBuf {
    crate::root().join("target/kernels")
}

/// apt-get / apt-cache with a private state for `suite`: its own sources.list,
/// lists and cache under target/kernels/apt/SUITE.
fn apt(tool: &str, suite: &str) -> anyhow::Result<Command> {
    private_apt(tool, &dir().join("apt").join(suite), suite, None)
}

/// apt-get / apt-cache for Debian's `suite` with all of its state in `d` (its own
/// sources.list, lists and cache; the host's apt is left as it is); `arch` for
/// another architecture's packages.
pub(crate) fn private_apt(
    tool: &str,
    d: &Path,
    suite: &str,
    arch: Option<&str>,
) -> anyhow::Result<Command> {
    for sub in ["lists/partial", "cache/archives/partial"] {
        std::fs::create_dir_all(d.join(sub))
            .with_context(|| format!("creating {}", d.join(sub).display()))?;
    }
    let list = d.join("sources.list");
    let line = format!(
        "deb [signed-by=/usr/share/keyrings/debian-archive-keyring.gpg] http://deb.debian.org/debian {suite} main\n"
    );
    if std::fs::read_to_string(&list).ok().as_deref() != Some(line.as_str()) {
        std::fs::write(&list, line).with_context(|| format!("writing {}", list.display()))?;
    }
    let mut c = Command::new(tool);
    c.arg("-q")
        .arg(format!("-oDir::Etc::SourceList={}", list.display()))
        .arg("-oDir::Etc::SourceParts=/dev/null")
        .arg(format!("-oDir::State::Lists={}", d.join("lists").display()))
        .arg(format!("-oDir::Cache={}", d.join("cache").display()))
        .arg("-oAPT::Get::List-Cleanup=0")
        .arg("-oAcquire::Languages=none")
        .arg("-oAPT::Sandbox::User=root");
    if let Some(a) = arch {
        c.arg("-oDir::State::status=/dev/null")
            .arg(format!("-oAPT::Architecture={a}"))
            .arg(format!("-oAPT::Architectures={a}"));
    }
    Ok(c)
}

fn output(cmd: &mut Command) -> anyhow::Result<String> {
    let o = cmd
        .output()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    if !o.status.success() {
        let err = String::from_utf8_lossy(&o.stderr);
        let last = err
            .lines()
            .rev()
            .find(|l| !l.trim().is_empty())
            .unwrap_or("");
        bail!(
            "{} failed ({}): {last}",
            cmd.get_program().to_string_lossy(),
            o.status
        );
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

/// The fetched kernel of a line: its version, the kernel image, and brd.ko (the ram
/// disk the I/O checks write to).
struct Kernel {
    package: String,
    image: PathBuf,
    brd: PathBuf,
}

/// `Depends` names of `pkg` in `suite` with the version chosen, from apt-cache.
fn show(suite: &str, pkg: &str) -> anyhow::Result<(String, Vec<String>)> {
    let text = output(apt("apt-cache", suite)?.args(["show", "--no-all-versions", pkg]))
        .with_context(|| format!("{pkg} in {suite}"))?;
    let field = |k: &str| {
        text.lines()
            .find_map(|l| l.strip_prefix(k))
            .map(|v| v.trim().to_string())
    };
    let version = field("Version:").with_context(|| format!("{pkg} in {suite}: no Version"))?;
    let deps = field("Depends:")
        .unwrap_or_default()
        .split(',')
        .filter_map(|d| d.split_whitespace().next().map(String::from))
        .collect();
    Ok((version, deps))
}

/// Fetches (or finds in the cache) the cloud kernel of `suite`. The lists are
/// refreshed once a day; a cached kernel is used while its version is current.
fn fetch(line: &str, suite: &str) -> anyhow::Result<Kernel> {
    let ldir = dir().join(line.replace('.', "_"));
    let lists = dir().join("apt").join(suite).join("lists");
    let fresh = std::fs::read_dir(&lists)
        .ok()
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().ends_with("_Packages"))
        .filter_map(|e| e.metadata().ok()?.modified().ok())
        .any(|t| t.elapsed().is_ok_and(|a| a < Duration::from_secs(86400)));
    if !fresh {
        output(apt("apt-get", suite)?.arg("update"))
            .with_context(|| format!("apt-get update for {suite}"))?;
    }
    let (version, deps) = show(suite, "linux-image-cloud-amd64")?;
    let image_pkg = deps
        .iter()
        .find(|d| d.starts_with("linux-image-"))
        .with_context(|| {
            format!("linux-image-cloud-amd64 {version} in {suite} names no linux-image-*")
        })?
        .clone();
    let stamp = ldir.join(".package");
    let root = ldir.join("root");
    let want = format!("{image_pkg} {version}");
    if std::fs::read_to_string(&stamp).ok().as_deref() != Some(want.as_str()) {
        let _ = std::fs::remove_dir_all(&ldir);
        let debs = ldir.join("debs");
        std::fs::create_dir_all(&debs).with_context(|| format!("creating {}", debs.display()))?;
        // Newer kernels split the image package: the kernel and its modules are in
        // linux-binary-* and linux-modules-*.
        let (_, image_deps) = show(suite, &image_pkg)?;
        let mut pkgs = vec![image_pkg.clone()];
        pkgs.extend(
            image_deps
                .into_iter()
                .filter(|d| d.starts_with("linux-binary-") || d.starts_with("linux-modules-")),
        );
        output(
            apt("apt-get", suite)?
                .current_dir(&debs)
                .arg("download")
                .args(&pkgs),
        )
        .with_context(|| format!("fetching {} from {suite}", pkgs.join(" ")))?;
        for deb in std::fs::read_dir(&debs).with_context(|| format!("{}", debs.display()))? {
            let deb = deb?.path();
            output(Command::new("dpkg-deb").arg("-x").arg(&deb).arg(&root))
                .with_context(|| format!("unpacking {}", deb.display()))?;
        }
        std::fs::remove_dir_all(&debs).with_context(|| format!("removing {}", debs.display()))?;
        std::fs::write(&stamp, &want).with_context(|| format!("writing {}", stamp.display()))?;
    }
    let find = |under: &Path, pred: &dyn Fn(&str) -> bool| -> Option<PathBuf> {
        let mut stack = vec![under.to_path_buf()];
        while let Some(d) = stack.pop() {
            for e in std::fs::read_dir(&d).ok()?.flatten() {
                let p = e.path();
                let name = e.file_name().to_string_lossy().into_owned();
                if p.is_dir() && !p.is_symlink() {
                    stack.push(p);
                } else if pred(&name) {
                    return Some(p);
                }
            }
        }
        None
    };
    // boot/vmlinuz-VERSION, or (7.x) usr/lib/modules/VERSION/vmlinuz.
    let image = find(&root, &|n| n == "vmlinuz" || n.starts_with("vmlinuz-"))
        .with_context(|| format!("{want}: no vmlinuz in {}", root.display()))?;
    let brd = find(&root, &|n| n.starts_with("brd.ko"))
        .with_context(|| format!("{want}: no brd.ko in {}", root.display()))?;
    Ok(Kernel {
        package: want,
        image,
        brd,
    })
}

/// The shared libraries `bin` loads (ldd), the dynamic loader included.
fn libraries(bin: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let text =
        output(Command::new("ldd").arg(bin)).with_context(|| format!("ldd {}", bin.display()))?;
    Ok(text
        .lines()
        .filter_map(|l| {
            let p = l.split("=>").last()?.split_whitespace().next()?;
            p.starts_with('/').then(|| PathBuf::from(p))
        })
        .collect())
}

fn copy_into(stage: &Path, from: &Path, to: &str) -> anyhow::Result<()> {
    let dest = stage.join(to.trim_start_matches('/'));
    if let Some(p) = dest.parent() {
        std::fs::create_dir_all(p).with_context(|| format!("creating {}", p.display()))?;
    }
    std::fs::copy(from, &dest)
        .with_context(|| format!("copying {} to {}", from.display(), dest.display()))?;
    Ok(())
}

/// The guest's /init: mounts, the ram disk, cgroup v2 with the controllers the
/// truth reads, then the checks; power-off either way.
const INIT: &str = r#"#!/bin/sh
/bin/busybox mkdir -p /sbin /usr/bin /usr/sbin /proc /sys /dev /tmp /mnt/disk
/bin/busybox --install -s
export PATH=/bin:/sbin:/usr/bin:/usr/sbin
mount -t proc proc /proc
mount -t sysfs sys /sys
mount -t devtmpfs dev /dev
mount -t tmpfs tmp /tmp
mount -t cgroup2 cgroup2 /sys/fs/cgroup
echo "+cpu +io +memory +pids" > /sys/fs/cgroup/cgroup.subtree_control
ip link set lo up
insmod /brd.ko rd_nr=1 rd_size=131072 && mke2fs -q /dev/ram0 && mount -t ext4 /dev/ram0 /mnt/disk
chmod 1777 /mnt/disk /tmp
echo "RT-BOOTED	$(uname -r)	$(cut -d' ' -f1 /proc/uptime)"
cd /mnt/disk
TMPDIR=/mnt/disk /rt/kernel-checks $(cat /rt/only 2>/dev/null)
echo "RT-EXIT	$?"
poweroff -f
"#;

/// The initramfs for `k`: busybox, the three binaries and their libraries, brd.ko
/// (decompressed: busybox's insmod takes a plain module), /init.
fn initramfs(line: &str, k: &Kernel, bins: &Path, only: &[String]) -> anyhow::Result<PathBuf> {
    let ldir = dir().join(line.replace('.', "_"));
    let stage = ldir.join("initramfs");
    let _ = std::fs::remove_dir_all(&stage);
    let busybox = Path::new("/bin/busybox");
    copy_into(&stage, busybox, "/bin/busybox")?;
    std::os::unix::fs::symlink("busybox", stage.join("bin/sh"))
        .context("linking /bin/sh in the initramfs")?;
    for name in ["resource-tracker", "workload", "kernel-checks"] {
        let b = bins.join(name);
        copy_into(&stage, &b, &format!("/rt/{name}"))?;
        for lib in libraries(&b)? {
            copy_into(&stage, &lib, &lib.to_string_lossy())?;
        }
    }
    std::fs::write(stage.join("rt/only"), only.join(" ")).context("writing /rt/only")?;
    let brd = std::fs::read(&k.brd).with_context(|| format!("{}", k.brd.display()))?;
    let name = k.brd.to_string_lossy().into_owned();
    let plain = if name.ends_with(".xz") {
        output_bytes(Command::new("xz").arg("-dc").arg(&k.brd))?
    } else if name.ends_with(".zst") {
        output_bytes(Command::new("zstd").arg("-dc").arg(&k.brd))?
    } else {
        brd
    };
    std::fs::write(stage.join("brd.ko"), plain).context("writing brd.ko")?;
    let init = stage.join("init");
    std::fs::write(&init, INIT).context("writing /init")?;
    std::fs::set_permissions(&init, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .context("chmod /init")?;
    let cpio = ldir.join("initramfs.cpio");
    let out = std::fs::File::create(&cpio).with_context(|| format!("{}", cpio.display()))?;
    let st = Command::new("sh")
        .arg("-c")
        .arg("find . | cpio -o -H newc --quiet")
        .current_dir(&stage)
        .stdout(out)
        .status()
        .context("cpio")?;
    if !st.success() {
        bail!("cpio of {} failed: {st}", stage.display());
    }
    Ok(cpio)
}

fn output_bytes(cmd: &mut Command) -> anyhow::Result<Vec<u8>> {
    let o = cmd
        .output()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    if !o.status.success() {
        bail!("{cmd:?} failed: {}", o.status);
    }
    Ok(o.stdout)
}

/// The uncompressed kernel inside a bzImage, found at its compression's magic
/// (as scripts/extract-vmlinux does): it boots by PVH, twice as fast under TCG.
fn uncompressed(line: &str, image: &Path) -> anyhow::Result<PathBuf> {
    // Beside the unpacked package, not in it: the image is looked up there by name.
    let out = dir().join(line.replace('.', "_")).join("vmlinux");
    if out.exists() {
        return Ok(out);
    }
    let data = std::fs::read(image).with_context(|| format!("{}", image.display()))?;
    let tools: [(&[u8], &str, &[&str]); 3] = [
        (&[0x28, 0xb5, 0x2f, 0xfd], "zstd", &["-dcq"]),
        (&[0x02, 0x21, 0x4c, 0x18], "lz4", &["-dcq"]),
        (&[0xfd, b'7', b'z', b'X', b'Z', 0x00], "xz", &["-dcq"]),
    ];
    for (magic, tool, args) in tools {
        for at in data
            .windows(magic.len())
            .enumerate()
            .filter(|(_, w)| w == &magic)
            .map(|(i, _)| i)
        {
            let tmp = out.with_extension("part");
            std::fs::write(&tmp, &data[at..]).with_context(|| format!("{}", tmp.display()))?;
            let o = Command::new(tool).args(args).arg(&tmp).output();
            let _ = std::fs::remove_file(&tmp);
            // Trailing bytes after the stream make the tools complain; the ELF is whole.
            if let Ok(o) = o {
                if o.stdout.starts_with(b"\x7fELF") {
                    std::fs::write(&out, &o.stdout)
                        .with_context(|| format!("{}", out.display()))?;
                    return Ok(out);
                }
            }
        }
    }
    bail!(
        "{}: no zstd, lz4 or xz stream holding an ELF kernel",
        image.display()
    )
}

/// Boots `kernel` with `initrd` and collects the checks' lines; the guest is killed
/// past `bound`.
fn boot(kernel: &Path, initrd: &Path, bound: Duration, out: &mut Outcome) -> anyhow::Result<()> {
    let t0 = Instant::now();
    let child = Command::new("nice")
        .arg("qemu-system-x86_64")
        .args(["-accel", "tcg", "-cpu", "max", "-m", "512", "-smp", "2"])
        .args([
            "-nographic",
            "-nodefaults",
            "-no-reboot",
            "-serial",
            "stdio",
        ])
        .arg("-kernel")
        .arg(kernel)
        .arg("-initrd")
        .arg(initrd)
        .args(["-append", "console=ttyS0 panic=-1 quiet loglevel=3"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .context("cannot start qemu-system-x86_64 (scripts/setup.sh installs it)")?;
    collect(child, t0, bound, out)
}

/// Reads the checks' lines from `child` (the guest's console, or the checks run on
/// the host) until it ends; past `bound` it is killed and waited for.
fn collect(
    mut child: std::process::Child,
    t0: Instant,
    bound: Duration,
    out: &mut Outcome,
) -> anyhow::Result<()> {
    let stdout = child.stdout.take().context("the checks' stdout")?;
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        for l in BufReader::new(stdout).lines() {
            let Ok(l) = l else { break };
            if tx.send(l).is_err() {
                break;
            }
        }
    });
    let mut tail: Vec<String> = Vec::new();
    let mut done = false;
    loop {
        let left = bound.saturating_sub(t0.elapsed());
        match rx.recv_timeout(left.min(Duration::from_secs(1))) {
            Ok(l) => {
                let l = l.trim_end_matches('\r').to_string();
                let f: Vec<&str> = l.split('\t').collect();
                match f[..] {
                    ["RT-BOOTED", release, _] => {
                        out.release = release.to_string();
                        out.boot_secs = t0.elapsed().as_secs_f64();
                    }
                    ["RT-CHECK", check, status, figures] => {
                        let c = Cell {
                            check: check.to_string(),
                            ok: status == "ok",
                            figures: figures.to_string(),
                        };
                        println!(
                            "kernels: {:<5} {:<32} {:<4} {}",
                            out.line,
                            c.check,
                            if c.ok { "ok" } else { "FAIL" },
                            c.figures
                        );
                        out.cells.push(c);
                    }
                    ["RT-DONE", _] => done = true,
                    _ => {
                        tail.push(l);
                        if tail.len() > 20 {
                            tail.remove(0);
                        }
                    }
                }
            }
            Err(mpsc::RecvTimeoutError::Timeout) => {}
            Err(mpsc::RecvTimeoutError::Disconnected) => break,
        }
        if t0.elapsed() >= bound {
            let _ = child.kill();
            let _ = child.wait();
            out.total_secs = t0.elapsed().as_secs_f64();
            bail!(
                "{} did not finish within {} s (killed); last console lines: {}",
                if out.line == HOST {
                    "the host's checks"
                } else {
                    "guest"
                },
                bound.as_secs(),
                tail.join(" | ")
            );
        }
    }
    let st = child.wait().context("waiting for the checks")?;
    out.total_secs = t0.elapsed().as_secs_f64();
    if !done {
        let mut err = String::new();
        if let Some(mut e) = child.stderr.take() {
            let _ = std::io::Read::read_to_string(&mut e, &mut err);
        }
        bail!(
            "{} ended ({st}) before the checks finished; last console lines: {} {}",
            if out.line == HOST {
                "the host's checks"
            } else {
                "guest"
            },
            tail.join(" | "),
            err.trim()
        );
    }
    Ok(())
}

/// The checks on the host's own kernel, as root, in its own cgroups.
fn on_host(bins: &Path, bound: Duration, only: &[String], out: &mut Outcome) -> anyhow::Result<()> {
    out.release = output(Command::new("uname").arg("-r"))?.trim().to_string();
    out.package = "the host's kernel".into();
    let t0 = Instant::now();
    let child = Command::new(bins.join("kernel-checks"))
        .args(only)
        .current_dir(std::env::temp_dir())
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .with_context(|| format!("cannot start {}", bins.join("kernel-checks").display()))?;
    collect(child, t0, bound, out)
}

fn tool(name: &str) -> anyhow::Result<()> {
    let found = std::env::var_os("PATH")
        .is_some_and(|p| std::env::split_paths(&p).any(|d| d.join(name).is_file()));
    if !found {
        bail!("{name} is not installed (scripts/setup.sh installs it)");
    }
    Ok(())
}

/// Runs the matrix (or `lines`) and returns one outcome per line, in order.
pub fn measure(
    bins: &Path,
    lines: &[(&str, &str)],
    bound: Duration,
    only: &[String],
) -> Vec<Outcome> {
    let mut all = Vec::new();
    for &(line, suite) in lines {
        let t0 = Instant::now();
        let mut out = Outcome {
            line: line.to_string(),
            package: String::new(),
            release: String::new(),
            cells: Vec::new(),
            error: None,
            boot_secs: 0.0,
            total_secs: 0.0,
        };
        let r = if line == HOST {
            on_host(bins, bound, only, &mut out)
        } else {
            fetch(line, suite).and_then(|k| {
                out.package = k.package.clone();
                let initrd = initramfs(line, &k, bins, only)?;
                let kernel = uncompressed(line, &k.image)?;
                boot(&kernel, &initrd, bound, &mut out)
            })
        };
        if let Err(e) = r {
            let e = format!("{e:#}");
            println!("kernels: {line:<5} {:<32} FAIL {e}", "guest");
            out.error = Some(e);
        }
        // Worded so that no line but the last reads as a test count.
        println!(
            "kernels: {line:<5} {} ({}): {} of {} checks hold, {:.0} s (boot {:.1} s)",
            out.release,
            out.package,
            out.cells.iter().filter(|c| c.ok).count(),
            out.cells.len(),
            t0.elapsed().as_secs_f64(),
            out.boot_secs
        );
        out.total_secs = t0.elapsed().as_secs_f64();
        all.push(out);
    }
    all
}

/// The matrix: a row per check, a column per kernel line, and the kernels' names.
fn matrix(s: &mut String, outcomes: &[Outcome]) {
    let _ = writeln!(s, "## Matrix\n");
    let mut head = "| check |".to_string();
    let mut rule = "|---|".to_string();
    for o in outcomes {
        let _ = write!(head, " {} |", o.line);
        rule.push_str("---|");
    }
    let _ = writeln!(s, "{head}\n{rule}");
    let mut checks: Vec<&str> = Vec::new();
    for o in outcomes {
        for c in &o.cells {
            if !checks.contains(&c.check.as_str()) {
                checks.push(&c.check);
            }
        }
    }
    for check in &checks {
        let mut row = format!("| {check} |");
        for o in outcomes {
            let cell = o.cells.iter().find(|c| c.check == *check);
            row.push_str(match cell {
                Some(c) if c.ok => " ok |",
                Some(_) => " **FAIL** |",
                None => " – |",
            });
        }
        let _ = writeln!(s, "{row}");
    }
    let mut row = "| kernel |".to_string();
    for o in outcomes {
        let _ = write!(
            row,
            " {} |",
            if o.release.is_empty() {
                "–"
            } else {
                &o.release
            }
        );
    }
    let _ = writeln!(s, "{row}");
}

/// docs/kernels.md from the outcomes of the whole matrix.
pub fn render(outcomes: &[Outcome], wall_secs: f64) -> String {
    let mut s = String::new();
    let _ = writeln!(
        s,
        "# Kernels\n\n\
         Written by `cargo xtask kernels` (xtask/src/kernels.rs); do not edit by hand.\n\n\
         Each kernel is Debian's `linux-image-cloud-amd64` of its suite, booted under\n\
         `qemu-system-x86_64 -accel tcg` (2 vCPUs, 512 MiB) with an initramfs holding busybox,\n\
         the release tracker, the workload generator and `kernel-checks`\n\
         (tests/src/bin/kernel_checks.rs). The guest's /init mounts cgroup v2 and an ext4\n\
         ram disk (brd); every shape runs in a child cgroup that holds exactly the workload,\n\
         and the tracker's figures are compared with that cgroup's `cpu.stat` and `io.stat`.\n\
         The tracker runs in a cgroup that may have no children, so it cannot make one for\n\
         the command: the CPU checked is the backend's own sums (`cpu_source` ebpf or\n\
         procfs), what that kernel's programs or /proc give, not a cgroup's charge.\n\
         Bounds are the host's: CPU within 0.5 %, bytes within 1 %, counts exact; the procfs\n\
         fallback within the host's procfs bound (+2 % + 20 ms, −10 %). The truth is the\n\
         cgroup's plus the root's CPU before it joined, known to within the join's own\n\
         (`cgroup lo–hi`; a guest starved by its host can charge that one write tens of\n\
         ms), and an error is to the window's nearer end. Programs are seen\n\
         loaded and attached by listing the kernel's BPF programs and links (bpf(2)\n\
         `BPF_PROG_GET_NEXT_ID`, `BPF_LINK_GET_NEXT_ID`), not by the tracker's word. The\n\
         `again_*` rows are the second copies of the life-cycle programs (docs/engine.md):\n\
         `ok` is loaded and attached from 6.19 on, and not loaded before. Where the kernel\n\
         skipped every copy of a program for one event, a shape's `missed_runs` figures\n\
         give the runs skipped per copy and what was found again (members whose fork was\n\
         skipped, process ends and execs whose program was skipped): the counts stay exact\n\
         through them (docs/engine.md, \"A member whose event no copy saw\"). The node\n\
         agent keeps one copy: `node container processes` holds a 300-process fork\n\
         swarm's counts for its container exact, or short by no more than the runs the\n\
         kernel says it skipped of that program (`resource_tracker_skipped_runs_total`).\n"
    );
    matrix(&mut s, outcomes);
    for o in outcomes {
        let from = match LINES.iter().find(|l| l.0 == o.line) {
            Some((_, suite, who)) => format!(
                "{suite}: {who}; `{}`; boot to /init {:.1} s, all checks {:.0} s",
                o.package, o.boot_secs, o.total_secs
            ),
            None => format!(
                "the machine that ran the matrix, checks run directly on it; {:.0} s",
                o.total_secs
            ),
        };
        let _ = writeln!(s, "\n## {} — {}\n\n{from}.\n", o.line, o.release);
        if let Some(e) = &o.error {
            let _ = writeln!(s, "**Not run to the end:** {e}\n");
        }
        let _ = writeln!(s, "| check | result | figures |\n|---|---|---|");
        for c in &o.cells {
            let figures = c.figures.replace('|', "\\|");
            let _ = writeln!(
                s,
                "| {} | {} | {figures} |",
                c.check,
                if c.ok { "ok" } else { "**FAIL**" }
            );
        }
    }
    let _ = writeln!(
        s,
        "\n## Oldest kernel supported\n\n\
         5.10. The programs are raw tracepoints whose events go through a BPF ring buffer\n\
         (`BPF_MAP_TYPE_RINGBUF`, 5.8); the end of a thread is settled by running the\n\
         `probe` program through `BPF_PROG_TEST_RUN`, which raw tracepoints support from\n\
         5.10; the offsets the programs read come from the kernel's BTF\n\
         (/sys/kernel/btf/vmlinux, `CONFIG_DEBUG_INFO_BTF`, 5.4 and later in Debian's\n\
         kernels). On an older kernel, or one without BTF, the programs do not load and the\n\
         tracker says so and counts with procfs (the `procfs` rows above show that backend's\n\
         figures). Fields a kernel lacks are named, never read as a wrong figure: the\n\
         `degraded vs BTF` row compares the names a run gives with what that kernel's BTF has\n\
         (read by the check's own parser, not the tracker's).\n\n\
         The `host` column is the kernel of the machine that ran the matrix, with the same\n\
         checks run directly on it (its cgroups may be v1: the truth then comes from\n\
         `cpuacct.usage` and blkio, as in the test suite's harness).\n\n\
         ## Time\n\n\
         The whole matrix took {wall_secs:.0} s on this run (kernels cached; the first fetch\n\
         adds about 100 MB of packages). `cargo xtask test` runs it after the test suite, and\n\
         first builds the release tracker and the checks the guests run (not counted here)."
    );
    s
}

/// `docs`: write docs/kernels.md when the whole matrix ran (`cargo xtask kernels`;
/// `cargo xtask test` runs it without touching the docs).
pub fn run(args: &[String], docs: bool) -> anyhow::Result<()> {
    let mut bound = GUEST_BOUND;
    let mut picked = Vec::new();
    let mut only = Vec::new();
    let mut it = args.iter();
    while let Some(a) = it.next() {
        match a.as_str() {
            "--timeout" => {
                let v = it.next().context("--timeout needs seconds")?;
                let secs: u64 = v
                    .parse()
                    .with_context(|| format!("--timeout {v:?}: not a number of seconds"))?;
                bound = Duration::from_secs(secs);
            }
            "--only" => only.push(it.next().context("--only needs a check name")?.clone()),
            HOST => picked.push((HOST, "")),
            l => match LINES.iter().find(|x| x.0 == l) {
                Some(&(line, suite, _)) => picked.push((line, suite)),
                None => {
                    let mut known: Vec<&str> = LINES.iter().map(|x| x.0).collect();
                    known.push(HOST);
                    // One line, before anything is built or started.
                    eprintln!(
                        "kernels: unknown kernel line {l:?} (known: {})",
                        known.join(", ")
                    );
                    std::process::exit(2);
                }
            },
        }
    }
    // qemu, busybox and the unpackers are installed only for the matrix.
    std::env::set_var("TRACKER_SETUP_KERNELS", "1");
    crate::setup()?;
    for t in [
        "qemu-system-x86_64",
        "busybox",
        "cpio",
        "apt-get",
        "dpkg-deb",
        "ldd",
    ] {
        tool(t)?;
    }
    let bins = crate::build_release()?;
    let whole = docs && picked.is_empty() && only.is_empty();
    if picked.is_empty() {
        picked = LINES.iter().map(|&(l, s, _)| (l, s)).collect();
        picked.push((HOST, ""));
    }
    let t0 = Instant::now();
    let outcomes = measure(&bins, &picked, bound, &only);
    let wall = t0.elapsed().as_secs_f64();
    let failed: usize = outcomes.iter().map(Outcome::failed).sum();
    let passed: usize = outcomes
        .iter()
        .map(|o| o.cells.iter().filter(|c| c.ok).count())
        .sum();
    if whole {
        let doc = crate::root().join("docs/kernels.md");
        std::fs::write(&doc, render(&outcomes, wall))
            .with_context(|| format!("writing {}", doc.display()))?;
        println!("kernels: wrote {}", doc.display());
    }
    // Summed with the test binaries' lines by .ci/run.
    println!(
        "test result: {}. {passed} passed; {failed} failed; 0 ignored; 0 measured; 0 filtered out; finished in {wall:.2}s",
        if failed == 0 { "ok" } else { "FAILED" }
    );
    if failed > 0 {
        bail!("kernels: {failed} check(s) failed");
    }
    Ok(())
}
