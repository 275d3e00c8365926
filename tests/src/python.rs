//! The Python package (python/): the wheel `cargo xtask test` builds with maturin
//! into target/wheels, fresh virtual environments it is installed into, and the
//! Python fixtures (tests/fixtures/python) run in them.

use std::{
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
    time::Duration,
};

use crate::{e2e::ci, Scratch};

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("repo root")
        .to_path_buf()
}

/// A fixture script of tests/fixtures/python.
pub fn fixture(name: &str) -> PathBuf {
    repo().join("tests/fixtures/python").join(name)
}

/// The virtual environment scripts/setup.sh makes with maturin, Metaflow and pandas.
pub fn py_build() -> PathBuf {
    repo().join("target/py-build")
}

/// The wheel built by `cargo xtask wheel` (run by `cargo xtask test`); None with a
/// SKIPPED line outside CI, a failure in CI.
pub fn wheel() -> Option<PathBuf> {
    let dir = repo().join("target/wheels");
    let found: Vec<PathBuf> = std::fs::read_dir(&dir)
        .map(|d| {
            d.flatten()
                .map(|e| e.path())
                .filter(|p| {
                    p.file_name().is_some_and(|n| {
                        let n = n.to_string_lossy();
                        n.starts_with("resource_tracker_ebpf-") && n.ends_with(".whl")
                    })
                })
                .collect()
        })
        .unwrap_or_default();
    match found.as_slice() {
        [w] => Some(w.clone()),
        [] => {
            let why = format!(
                "no resource_tracker_ebpf wheel in {} (cargo xtask wheel builds it; cargo xtask test does)",
                dir.display()
            );
            assert!(!ci(), "CI is set but {why}");
            eprintln!("SKIPPED: {why}");
            None
        }
        many => panic!("several wheels in {}: {many:?}", dir.display()),
    }
}

/// site-packages of a venv's python.
fn purelib(python: &Path) -> PathBuf {
    let o = Command::new(python)
        .args([
            "-c",
            "import sysconfig; print(sysconfig.get_paths()['purelib'])",
        ])
        .output()
        .unwrap_or_else(|e| panic!("{}: {e}", python.display()));
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
    PathBuf::from(String::from_utf8_lossy(&o.stdout).trim())
}

/// A fresh venv in `scratch` with the wheel installed by pip (no index: the wheel
/// has no dependencies). `with` names other venvs whose packages it may import
/// (a .pth file: Metaflow and pandas from py-build, resource-tracker 0.5.0 from
/// py-peers) without copying them.
pub fn fresh_venv(scratch: &Scratch, name: &str, wheel: &Path, with: &[PathBuf]) -> PathBuf {
    fresh_venv_of("python3", scratch, name, wheel, with)
}

/// The same from a given interpreter (the non-root test needs one that another user
/// can execute: a python3 under /root is not).
pub fn fresh_venv_of(
    base: &str,
    scratch: &Scratch,
    name: &str,
    wheel: &Path,
    with: &[PathBuf],
) -> PathBuf {
    let dir = scratch.path(name);
    let st = Command::new(base)
        .args(["-m", "venv"])
        .arg(&dir)
        .status()
        .expect("python3 -m venv");
    assert!(st.success(), "python3 -m venv {}", dir.display());
    let py = dir.join("bin/python");
    let o = Command::new(&py)
        .args([
            "-m",
            "pip",
            "install",
            "-q",
            "--disable-pip-version-check",
            "--no-index",
        ])
        .arg(wheel)
        .output()
        .expect("pip");
    assert!(
        o.status.success(),
        "pip install {}: {}",
        wheel.display(),
        String::from_utf8_lossy(&o.stderr)
    );
    if !with.is_empty() {
        let lines: Vec<String> = with
            .iter()
            .map(|v| purelib(&v.join("bin/python")).display().to_string())
            .collect();
        std::fs::write(
            purelib(&py).join("zz-test-extra.pth"),
            lines.join("\n") + "\n",
        )
        .expect("write .pth");
    }
    py
}

/// Runs a command, killing it after `secs` (a hung interpreter is a failure, not
/// a hung test).
pub fn output_within(cmd: &mut Command, secs: u64) -> Output {
    let child = cmd
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("{cmd:?}: {e}"));
    let pid = child.id();
    let (tx, rx) = std::sync::mpsc::channel();
    let waiter = std::thread::spawn(move || {
        let o = child.wait_with_output();
        let _ = tx.send(());
        o
    });
    if rx.recv_timeout(Duration::from_secs(secs)).is_err() {
        // SAFETY: kill of our own child, which the waiter thread has not reaped.
        unsafe { libc::kill(pid as i32, libc::SIGKILL) };
        let _ = waiter.join();
        panic!("{cmd:?} did not finish within {secs} s (killed)");
    }
    waiter.join().expect("waiter").expect("wait")
}

/// Runs a fixture with a venv's python (at most `secs` seconds); panics with its
/// stderr when it fails.
pub fn run_fixture(py: &Path, script: &str, args: &[&str], cwd: &Path) -> Output {
    run_fixture_env(py, script, args, cwd, &[])
}

/// The same with more environment variables.
pub fn run_fixture_env(
    py: &Path,
    script: &str,
    args: &[&str],
    cwd: &Path,
    env: &[(&str, &str)],
) -> Output {
    let o = output_within(
        Command::new(py)
            .arg(fixture(script))
            .args(args)
            .envs(env.iter().copied())
            .current_dir(cwd),
        240,
    );
    assert!(
        o.status.success(),
        "{script} {args:?} failed: {}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    o
}
