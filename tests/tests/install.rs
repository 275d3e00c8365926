//! The install step the README documents (`cargo xtask install`): the binary lands
//! where `sudo` finds it. sudo replaces PATH with its secure_path, which leaves out
//! target/ and a venv's bin/ but names /usr/local/bin.

use std::{
    os::unix::fs::PermissionsExt,
    path::{Path, PathBuf},
    process::Command,
};

use tracker_tests::*;

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
