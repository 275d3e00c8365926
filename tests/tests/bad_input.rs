//! Bad input gets a one-line error naming the problem and a non-zero exit; never a
//! panic, and for `run` nothing is started.

use std::process::Command;

use tracker_tests::*;

fn check(args: &[&str], code: i32, needle: &str) {
    let o = run(Command::new(tracker()).args(args));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(code), "{args:?}: {err}");
    assert!(!err.contains("panicked"), "{args:?}: {err}");
    assert!(
        err.contains(needle),
        "{args:?}: expected {needle:?} in {err}"
    );
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "{args:?}: one line, got {err}"
    );
}

#[test]
fn bad_flags_and_values() {
    check(&["--bogus-flag"], 2, "--bogus-flag");
    check(&["run", "-i", "0", "--", "true"], 2, "--interval");
    check(&["run", "-i", "-3", "--", "true"], 2, "--interval");
    check(&["run", "-i", "soon", "--", "true"], 2, "'soon'");
    check(&["run", "--pid", "999999999", "--", "true"], 1, "--pid");
    check(&["--pid", "999999999"], 1, "no process with id 999999999");
    check(&["--pid", "-5"], 2, "'-5'");
    check(&["--pid", "abc"], 2, "'abc'");
    check(&["--format", "xml"], 2, "'xml'");
    check(
        &["run", "-o", "/nonexistent-dir/x.jsonl", "--", "true"],
        1,
        "/nonexistent-dir/x.jsonl",
    );
    check(
        &["run", "--summary", "/nonexistent-dir/s.json", "--", "true"],
        1,
        "/nonexistent-dir/s.json",
    );
    check(&[], 1, "nothing to track");
}

#[test]
fn command_that_cannot_run_is_like_a_shell() {
    let s = Scratch::new("badcmd");
    let marker = s.path("started");
    check(
        &["run", "--", "no-such-command-xyz"],
        127,
        "no-such-command-xyz",
    );
    let plain = s.path("plain.txt");
    std::fs::write(&plain, "not a program").expect("write");
    let plain = plain.to_str().expect("utf-8 path");
    check(&["run", "--", plain], 126, plain);
    // Executable bits but not a program: execve fails after the fork (ENOEXEC).
    std::fs::set_permissions(plain, std::os::unix::fs::PermissionsExt::from_mode(0o755))
        .expect("chmod");
    check(&["run", "--", plain], 126, "Exec format error");
    // Nothing started: the summary file was not even created for a command not found.
    let o = run(Command::new(tracker())
        .args(["run", "--summary"])
        .arg(&marker)
        .args(["--", "no-such-command-xyz"]));
    assert_eq!(o.status.code(), Some(127));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(err.lines().count(), 1, "one line: {err}");
    assert!(!marker.exists());
}
