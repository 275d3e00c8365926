//! The install step the README documents (`cargo xtask install`): the binary lands
//! where `sudo` finds it. sudo replaces PATH with its secure_path, which leaves out
//! target/ and a venv's bin/ but names /usr/local/bin.

use std::{
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
};

use tracker_tests::{
    e2e::{have, is_root, require},
    *,
};

/// The xtask binary that `cargo build --workspace` puts next to the tests.
fn xtask() -> PathBuf {
    let p = bin_dir().join("xtask");
    assert!(
        p.exists(),
        "{} is missing: run `cargo build --workspace` first (cargo xtask test does)",
        p.display()
    );
    p
}

fn install(prefix: &Path) -> std::process::Output {
    Command::new(xtask())
        .args(["install", "--binary"])
        .arg(tracker())
        .arg("--prefix")
        .arg(prefix)
        .output()
        .expect("xtask install")
}

#[test]
fn install_into_a_prefix_gives_an_executable_that_runs() {
    let s = Scratch::new("install-prefix");
    let prefix = s.path("usr");
    let o = install(&prefix);
    assert!(
        o.status.success(),
        "xtask install: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    let bin = prefix.join("bin/resource-tracker");
    let mode = std::fs::metadata(&bin)
        .expect("installed binary")
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o755, "{}", bin.display());
    let v = Command::new(&bin)
        .arg("--version")
        .output()
        .expect("--version");
    assert!(v.status.success());
    assert!(
        String::from_utf8_lossy(&v.stdout).starts_with("resource-tracker "),
        "{}",
        String::from_utf8_lossy(&v.stdout)
    );
    // Installing again over it (an upgrade) succeeds and leaves no temporary file.
    assert!(install(&prefix).status.success());
    let names: Vec<String> = std::fs::read_dir(prefix.join("bin"))
        .expect("bin")
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, ["resource-tracker"]);

    let o = Command::new(xtask())
        .args(["install", "--binary"])
        .arg(s.path("missing"))
        .arg("--prefix")
        .arg(&prefix)
        .output()
        .expect("xtask install");
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("missing"), "{err}");
}

/// Puts back whatever /usr/local/bin/resource-tracker was before the test.
struct Restore {
    dest: PathBuf,
    backup: Option<PathBuf>,
}

impl Drop for Restore {
    fn drop(&mut self) {
        match &self.backup {
            Some(b) => {
                let _ = std::fs::rename(b, &self.dest);
            }
            None => {
                let _ = std::fs::remove_file(&self.dest);
            }
        }
    }
}

#[test]
fn sudo_finds_the_installed_binary() {
    if !e2e::require(
        e2e::is_root() && e2e::have("sudo"),
        "root and sudo are needed to install into /usr/local/bin and run it under sudo",
    ) {
        return;
    }
    let dest = PathBuf::from("/usr/local/bin/resource-tracker");
    let backup = dest.with_file_name(".resource-tracker.install-test-backup");
    let restore = Restore {
        backup: dest
            .exists()
            .then(|| std::fs::rename(&dest, &backup).map(|_| backup.clone()))
            .transpose()
            .expect("moving the installed binary aside"),
        dest: dest.clone(),
    };
    let o = install(Path::new("/usr/local"));
    assert!(
        o.status.success(),
        "xtask install: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    assert!(dest.exists());

    let s = Scratch::new("install-sudo");
    let summary = s.path("s.json");
    // A PATH without /usr/local/bin: sudo's secure_path must be what finds it.
    let o = Command::new("sudo")
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .args(["resource-tracker", "run", "-q", "--summary"])
        .arg(&summary)
        .args(["--", "id", "-u"])
        .output()
        .expect("sudo");
    assert!(
        o.status.success(),
        "sudo resource-tracker run -- id: {}\n{}",
        o.status,
        String::from_utf8_lossy(&o.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "0");
    let sum: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&summary).expect("summary")).expect("json");
    assert!(
        sum["processes_spawned"].as_u64().is_some_and(|n| n >= 1),
        "{sum}"
    );
    drop(restore);
}

/// `scripts/setup.sh --run`, the set-up of the README's run command, asks for
/// nothing but what building and running the tracker needs (the nightly
/// toolchain's rust-src and bpf-linker, present here after the suite's own
/// set-up): no Debian package, no virtual environment, no peer. Run with
/// stand-ins for the tools the tests' set-up uses, which record any call.
#[test]
fn the_run_setup_installs_only_what_running_needs() {
    let s = Scratch::new("setup-run");
    let stubs = s.path("bin");
    std::fs::create_dir(&stubs).unwrap();
    let calls = s.path("calls");
    for tool in ["apt-get", "python3", "pip", "dpkg-deb"] {
        let p = stubs.join(tool);
        std::fs::write(
            &p,
            format!(
                "#!/bin/sh\necho {tool} \"$@\" >> '{}'\nexit 1\n",
                calls.display()
            ),
        )
        .unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    }
    let path = format!(
        "{}:{}",
        stubs.display(),
        std::env::var("PATH").unwrap_or_default()
    );
    // The sudo, jq and podman the full set-up would look for: hidden too.
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let o = Command::new("bash")
        .arg(repo.join("scripts/setup.sh"))
        .arg("--run")
        .env("PATH", &path)
        .output()
        .expect("setup.sh --run");
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(o.status.success(), "{err}");
    assert!(err.contains("what running needs"), "{err}");
    let called = std::fs::read_to_string(&calls).unwrap_or_default();
    assert!(called.is_empty(), "setup --run called: {called}");
}

/// The README's Python commands, as written: its first `sh` block after the
/// "## Python" heading, run by bash from the checkout with HOME a scratch
/// directory (so `~/rt` is made there; cargo's and rustup's homes stay where they
/// are): the package is built and installed into a new venv, and its example
/// tracks 303 processes and a 200 MiB array, as root on eBPF and then, from the
/// same venv, as a plain user on procfs (the grant's run is in python_package.rs).
#[test]
fn the_readmes_python_commands_install_the_package_and_run_its_example() {
    let repo = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let readme = std::fs::read_to_string(repo.join("README.md")).expect("README.md");
    let section = readme
        .split("\n## Python")
        .nth(1)
        .expect("a Python section in the README");
    let block = section
        .split("```sh\n")
        .nth(1)
        .and_then(|b| b.split("\n```").next())
        .expect("an sh block in the README's Python section");
    assert!(
        block.starts_with("cargo xtask pip-install --venv ~/rt\n"),
        "{block}"
    );
    let s = Scratch::new("readme-python");
    let home = |var: &str, under: &str| {
        std::env::var_os(var).unwrap_or_else(|| {
            Path::new(&std::env::var_os("HOME").expect("HOME"))
                .join(under)
                .into()
        })
    };
    let (cargo_home, rustup_home) = (home("CARGO_HOME", ".cargo"), home("RUSTUP_HOME", ".rustup"));
    // A user whose python3 is the system's, so that the venv's interpreter is one
    // user 65534 may run too (root's pyenv lives under a 0700 /root).
    let system_py = Path::new("/usr/bin/python3");
    let path_dir = s.path("path");
    std::fs::create_dir(&path_dir).unwrap();
    if system_py.exists() {
        std::os::unix::fs::symlink(system_py, path_dir.join("python3")).unwrap();
    }
    let path = std::env::join_paths(std::iter::once(path_dir.clone()).chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))
    .unwrap();
    let run = |cmd: &mut Command| {
        let t0 = std::time::Instant::now();
        let o = cmd
            .env("HOME", &s.0)
            .env("PATH", &path)
            .env("CARGO_HOME", &cargo_home)
            .env("RUSTUP_HOME", &rustup_home)
            .env_remove("VIRTUAL_ENV")
            .output()
            .expect("bash");
        let (out, err) = (
            String::from_utf8_lossy(&o.stdout).to_string(),
            String::from_utf8_lossy(&o.stderr).to_string(),
        );
        eprintln!(
            "the README's Python block: {:.0} s\n{out}",
            t0.elapsed().as_secs_f64()
        );
        assert!(o.status.success(), "{out}\n{err}");
        out
    };
    let out = run(Command::new("bash")
        .args(["-e", "-c", block])
        .current_dir(&repo));
    assert!(s.path("rt/bin/resource-tracker").exists(), "{out}");
    let want = if is_root() && ebpf_available() {
        "ebpf"
    } else {
        "procfs"
    };
    check_readme_example(&out, want);
    if !is_root()
        || !require(have("setpriv"), "setpriv is missing")
        || !require(system_py.exists(), "/usr/bin/python3 is missing")
    {
        return;
    }
    // The example again from the venv the block made, as user 65534.
    std::fs::set_permissions(&s.0, PermissionsExt::from_mode(0o755)).unwrap();
    let example = block
        .split_once("~/rt/bin/python - <<'PY'\n")
        .map(|(_, rest)| format!("~/rt/bin/python - <<'PY'\n{rest}\n"))
        .expect("the example's heredoc");
    let out = run(Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups"])
        .args(["bash", "-e", "-c", &example])
        .current_dir(&s.0));
    check_readme_example(&out, "procfs");
}

/// "ebpf 9 samples, 303 processes", then the memory stats and the @resources line.
fn check_readme_example(out: &str, backend: &str) {
    let first: Vec<&str> = out
        .lines()
        .next()
        .unwrap_or_default()
        .split_whitespace()
        .collect();
    assert_eq!(first.first().copied(), Some(backend), "{out}");
    if backend == "ebpf" {
        // sh, seq, 300 /bin/true and sleep: each counted by the kernel.
        assert_eq!(first.get(3).copied(), Some("303"), "processes: {out}");
    }
    assert!(out.contains("@resources(cpu=1, memory="), "{out}");
    let max: f64 = out
        .split("'max': ")
        .nth(1)
        .and_then(|v| v.split(['}', ',']).next())
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0.0);
    assert!(max >= 200.0, "the 200 MiB array: {out}");
}
