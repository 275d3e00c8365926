//! Project tasks: `cargo xtask setup | test | wheel [--release] | install [--prefix DIR] | old-glibc | arm64 | run -- ARGS | bench [--node] | soak | kernels`.
//!
//! Every task runs `scripts/setup.sh` first (idempotent, fast when all is present), so
//! each works on a fresh machine.

mod arm64;
mod attach_bench;
mod attach_exact;
mod bench;
mod benchdoc;
mod dist;
mod exact_bench;
mod floor;
#[cfg(test)]
mod glibc;
mod kernels;
#[cfg(test)]
mod layout;
mod measure;
mod node_bench;
mod old_glibc;
mod peers;
mod real_bench;
mod soak;
mod truth;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use anyhow::{bail, Context as _};

pub fn root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("workspace root")
        .to_path_buf()
}

pub fn sh(cmd: &mut Command) -> anyhow::Result<()> {
    eprintln!("xtask: {cmd:?}");
    let st = cmd
        .status()
        .with_context(|| format!("cannot start {cmd:?}"))?;
    if !st.success() {
        bail!("{cmd:?} failed with {st}");
    }
    Ok(())
}

fn cargo() -> Command {
    let mut c = Command::new(std::env::var("CARGO").unwrap_or_else(|_| "cargo".into()));
    c.current_dir(root());
    c
}

fn setup() -> anyhow::Result<()> {
    sh(Command::new("bash").arg(root().join("scripts/setup.sh")))
}

/// What building and running the tracker needs, and nothing the tests do.
fn setup_run() -> anyhow::Result<()> {
    sh(Command::new("bash")
        .arg(root().join("scripts/setup.sh"))
        .arg("--run"))
}

/// The tracker alone in release: what `cargo xtask run` and `install` need.
pub fn build_release_agent() -> anyhow::Result<PathBuf> {
    sh(cargo().args(["build", "--release", "-p", "tracker-agent"]))?;
    Ok(root().join("target/release"))
}

pub fn build_release() -> anyhow::Result<PathBuf> {
    sh(cargo().args([
        "build",
        "--release",
        "-p",
        "tracker-agent",
        "-p",
        "tracker-tests",
    ]))?;
    Ok(root().join("target/release"))
}

/// The Python wheel (python/, maturin bin bindings) into target/wheels for the
/// tests, built by the maturin of target/py-build (scripts/setup.sh) with the dev
/// profile: it reuses the test build's artefacts (the binary is stripped in the
/// wheel). What users install is dist::build's.
pub fn build_wheel() -> anyhow::Result<PathBuf> {
    let out = root().join("target/wheels");
    // One wheel at a time: the tests install the only one there.
    if out.exists() {
        std::fs::remove_dir_all(&out).with_context(|| format!("removing {}", out.display()))?;
    }
    let maturin = root().join("target/py-build/bin/maturin");
    let mut cmd = Command::new(&maturin);
    cmd.current_dir(root().join("python"))
        .args(["build", "--quiet", "--profile", "dev"])
        .arg("-o")
        .arg(&out);
    sh(&mut cmd)?;
    Ok(out)
}

/// The value after `name` in `args`, if `name` is there.
fn flag_value(args: &[String], name: &str) -> anyhow::Result<Option<String>> {
    match args.iter().position(|a| a == name) {
        None => Ok(None),
        Some(i) => match args.get(i + 1) {
            Some(v) if !v.starts_with("--") => Ok(Some(v.clone())),
            _ => bail!("{name} needs a value"),
        },
    }
}

/// An error ends the task in one line with its causes, whatever RUST_BACKTRACE says.
fn main() {
    if let Err(e) = run() {
        eprintln!("xtask: {e:#}");
        std::process::exit(1);
    }
}

/// `cargo xtask test`: the README's test command. Formatting, clippy, the build,
/// the whole suite, then the kernel matrix.
fn test() -> anyhow::Result<()> {
    setup()?;
    sh(cargo().args(["fmt", "--all", "--check"]))?;
    // The eBPF crate builds only for the BPF target (through tracker-agent's build.rs).
    sh(cargo().args([
        "clippy",
        "--workspace",
        "--exclude",
        "tracker-ebpf",
        "--all-targets",
        "--",
        "-D",
        "warnings",
    ]))?;
    // The end-to-end tests run the binaries of the same profile.
    sh(cargo().args(["build", "--workspace", "--exclude", "tracker-ebpf"]))?;
    // Built once here for every Python test (tests/tests/python_package.rs).
    build_wheel()?;
    let tests = sh(cargo().args([
        "test",
        "--workspace",
        "--exclude",
        "tracker-ebpf",
        "--",
        "--test-threads=1",
    ]));
    // The kernel matrix (docs/kernels.md) after the suite, whatever its
    // outcome: both results are wanted from one CI run.
    let matrix = kernels::run(&[], false);
    tests.and(matrix)
}

/// `cargo xtask install [--prefix DIR] [--binary FILE]`.
fn install(args: &[String]) -> anyhow::Result<()> {
    let prefix = flag_value(args, "--prefix")?.unwrap_or_else(|| "/usr/local".into());
    // `--binary` installs a given build (the install test's); otherwise the
    // release build `cargo xtask run` uses.
    let bin = match flag_value(args, "--binary")? {
        Some(b) => PathBuf::from(b),
        None => {
            setup_run()?;
            build_release_agent()?.join("resource-tracker")
        }
    };
    let dest = dist::install(&bin, Path::new(&prefix))?;
    eprintln!("xtask: installed {}", dest.display());
    Ok(())
}

/// `cargo xtask pip-install --venv DIR | --python PY`: the Python package, built
/// for this machine (release, its wheel in target/wheels-local), installed into a
/// virtual environment (made when missing) or an existing interpreter's.
fn pip_install(args: &[String]) -> anyhow::Result<()> {
    let py = match (flag_value(args, "--venv")?, flag_value(args, "--python")?) {
        (Some(_), Some(_)) => bail!("pip-install: --venv or --python, not both"),
        (Some(v), None) => {
            let py = Path::new(&v).join("bin/python");
            if !py.exists() {
                sh(Command::new("python3").args(["-m", "venv"]).arg(&v))?;
            }
            py
        }
        (None, Some(p)) => PathBuf::from(p),
        (None, None) => match std::env::var_os("VIRTUAL_ENV") {
            Some(v) => Path::new(&v).join("bin/python"),
            None => bail!(
                "pip-install: name the environment: --venv DIR (made when missing) or \
                 --python PATH (an interpreter, e.g. the one Metaflow runs)"
            ),
        },
    };
    if !py.exists() {
        bail!("pip-install: {} does not exist", py.display());
    }
    let t0 = std::time::Instant::now();
    sh(Command::new("bash")
        .arg(root().join("scripts/setup.sh"))
        .arg("--pip"))?;
    let out = root().join("target/wheels-local");
    if out.exists() {
        std::fs::remove_dir_all(&out).with_context(|| format!("removing {}", out.display()))?;
    }
    sh(Command::new(root().join("target/maturin/bin/maturin"))
        .current_dir(root().join("python"))
        .args(["build", "--quiet", "--release", "--strip", "-o"])
        .arg(&out))?;
    let wheel = std::fs::read_dir(&out)
        .with_context(|| format!("reading {}", out.display()))?
        .flatten()
        .map(|e| e.path())
        .find(|p| p.extension().is_some_and(|x| x == "whl"))
        .with_context(|| format!("maturin left no wheel in {}", out.display()))?;
    sh(Command::new(&py)
        .args(["-m", "pip", "install", "-q", "--disable-pip-version-check"])
        .args(["--force-reinstall", "--no-deps"])
        .arg(&wheel))?;
    eprintln!(
        "xtask: resource-tracker-ebpf installed for {} ({:.0} s; {})",
        py.display(),
        t0.elapsed().as_secs_f64(),
        wheel.display()
    );
    Ok(())
}

fn run() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match args.first().map(String::as_str) {
        Some("setup") => setup(),
        Some("test") => test(),
        Some("wheel") if args.iter().any(|a| a == "--release") => {
            sh(Command::new("bash")
                .arg(root().join("scripts/setup.sh"))
                .arg("--release"))?;
            let t0 = std::time::Instant::now();
            let out = dist::build()?;
            eprintln!(
                "xtask: wheels, binaries and Debian packages in {} ({:.0} s)",
                out.display(),
                t0.elapsed().as_secs_f64()
            );
            Ok(())
        }
        Some("wheel") => {
            setup()?;
            let out = build_wheel()?;
            eprintln!("xtask: wheel in {}", out.display());
            Ok(())
        }
        Some("arm64") => {
            setup()?;
            arm64::run()
        }
        Some("old-glibc") => {
            setup()?;
            old_glibc::run()
        }
        Some("install") => install(&args),
        Some("pip-install") => pip_install(&args),
        Some("run") => {
            setup_run()?;
            let dir = build_release_agent()?;
            let rest: Vec<&String> = args.iter().skip(1).skip_while(|a| *a == "--").collect();
            let st = Command::new(dir.join("resource-tracker"))
                .args(rest)
                .status()
                .context("resource-tracker")?;
            std::process::exit(st.code().unwrap_or(1));
        }
        Some("bench") if args.iter().any(|a| a == "--from-raw") => {
            // Renders runs measured before: nothing to set up or build.
            bench::run(&root().join("target/release"), &args[1..])
        }
        Some("bench") => {
            setup()?;
            let dir = build_release()?;
            bench::run(&dir, &args[1..])
        }
        Some("kernels") => kernels::run(&args[1..], true),
        Some("soak") => {
            setup()?;
            let dir = build_release()?;
            soak::run(&dir, &args[1..])
        }
        _ => bail!("usage: cargo xtask setup | test | wheel [--release] | install [--prefix DIR] [--binary FILE] | pip-install --venv DIR | --python PY | old-glibc | arm64 | run -- ARGS | bench [--quick] [--peers | --only-peers | --only-cost | --only-startup | --only-exact | --only-attach | --only-attach-exact [--runs N] [--workload NAME] [--conditions quiet|churn|both] | --only-real [--runs N] [--peer-runs N] [--workload NAME] [--skip NAME] [--conditions quiet|churn|both] [--from-raw FILE] | --node] | soak [--minutes N] | kernels [LINE…] [--timeout SECS] [--only CHECK]"),
    }
}
