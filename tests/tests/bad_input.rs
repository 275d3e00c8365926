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
    check(&["run", "--pid", "999999999", "--", "true"], 2, "--pid");
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
    // No command and no --pid is not an error: the tracker samples the
    // host until it is signalled (tests/tests/host_metrics.rs).
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

/// Like `check`, with a scratch working directory (no stray resource-tracker.toml),
/// the TRACKER_* variables of the caller removed and `env` set.
fn check_env(args: &[&str], env: &[(&str, &str)], code: i32, needles: &[&str]) -> String {
    let s = Scratch::new("badenv");
    let mut cmd = Command::new(tracker());
    cmd.current_dir(&s.0).args(args);
    e2e::clean_env(&mut cmd);
    for (k, v) in env {
        cmd.env(k, v);
    }
    let o = run(&mut cmd);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(code), "{args:?} {env:?}: {err}");
    assert!(!err.contains("panicked"), "{args:?}: {err}");
    for n in needles {
        assert!(err.contains(n), "{args:?} {env:?}: expected {n:?} in {err}");
    }
    assert_eq!(
        err.trim_end().lines().count(),
        1,
        "{args:?} {env:?}: one line, got {err}"
    );
    err
}

/// Config files, variables and flags that are wrong: exit 2 (argument or config
/// error) before anything starts, one line naming the file, line and column, or the
/// variable, or the flag.
#[test]
fn bad_config_env_and_flags() {
    let s = Scratch::new("badcfg");
    let cfg = |name: &str, body: &str| {
        let p = s.path(name);
        std::fs::write(&p, body).expect("write config");
        p.to_str().expect("utf-8").to_string()
    };
    // Malformed TOML: the error is on line 3, after `pid = ` (column 7).
    let bad = cfg("malformed.toml", "[job]\nname = \"x\"\npid = = 3\n");
    check_env(
        &["-c", &bad, "--", "true"],
        &[],
        2,
        &[&bad, "line 3", "column 7"],
    );
    // Right syntax, wrong type: line 2, where the value starts.
    let ty = cfg("type.toml", "[job]\npid = \"abc\"\n");
    check_env(
        &["-c", &ty, "--", "true"],
        &[],
        2,
        &[&ty, "line 2", "column 7", "\"abc\""],
    );
    let ty2 = cfg("type2.toml", "[tracker]\ninterval_secs = \"fast\"\n");
    check_env(&["-c", &ty2, "--", "true"], &[], 2, &[&ty2, "line 2"]);
    // The usage guide: a config file that does not exist is ignored; here with one
    // warning line that names it, and the run goes on.
    check_env(
        &["-q", "-c", "/nonexistent.toml", "--", "true"],
        &[],
        0,
        &["/nonexistent.toml", "not found"],
    );
    // Host-wide (no command): bad intervals are refused before sampling starts.
    check_env(&["--interval", "0"], &[], 2, &["--interval", "'0'"]);
    check_env(&["--interval", "-1"], &[], 2, &["--interval", "'-1'"]);
    check_env(&["--interval", "abc"], &[], 2, &["--interval", "'abc'"]);
    check_env(
        &["--tag", "novalue", "--", "true"],
        &[],
        2,
        &["--tag", "novalue"],
    );
    check_env(
        &["--", "true"],
        &[("TRACKER_TEAM", "ops\nrm -rf")],
        2,
        &["TRACKER_TEAM"],
    );
    check_env(
        &["--", "true"],
        &[("TRACKER_UPLOAD_INTERVAL", "soon")],
        2,
        &["TRACKER_UPLOAD_INTERVAL", "'soon'"],
    );
    // Not an argument error: the path is fine, the file cannot be created (exit 1).
    check_env(
        &["-o", "/proc/nope/x", "--", "true"],
        &[],
        1,
        &["/proc/nope/x"],
    );
}

/// An unknown key is a warning naming it; the run goes on.
#[test]
fn unknown_config_key_only_warns() {
    let s = Scratch::new("unkkey");
    let p = s.path("c.toml");
    std::fs::write(&p, "[job]\nname = \"a\"\ncolour = \"red\"\n").expect("write");
    let mut cmd = Command::new(tracker());
    cmd.current_dir(&s.0)
        .arg("-q")
        .arg("-c")
        .arg(&p)
        .args(["--", "true"]);
    e2e::clean_env(&mut cmd);
    let o = run(&mut cmd);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    let lines: Vec<&str> = err.lines().filter(|l| l.contains("colour")).collect();
    assert_eq!(lines.len(), 1, "one warning naming the key: {err}");
    assert!(lines[0].contains("WARN"), "{}", lines[0]);
}

/// The message part of the tracker's log lines (`[time LEVEL ] message`).
fn messages(stderr: &str) -> Vec<String> {
    stderr
        .lines()
        .map(|l| match l.split_once("] ") {
            Some((_, m)) if l.starts_with('[') => m.to_string(),
            _ => l.to_string(),
        })
        .collect()
}

/// Runs the tracker in a private mount namespace where /proc/meminfo is an empty file
/// and /proc/diskstats cannot be opened (a write-only sysfs attribute bound over
/// it: the kernel refuses to open those for reading, even for root), as on kernels
/// built without those files. Returns the samples and stderr.
fn run_with_broken_proc(secs: &str) -> (Vec<serde_json::Value>, String, serde_json::Value) {
    let s = Scratch::new(&format!("brokenproc{}", secs.replace('.', "")));
    let empty = s.path("empty");
    std::fs::write(&empty, "").expect("empty file");
    let (out, sum) = (s.path("out.jsonl"), s.path("s.json"));
    let script = format!(
        "mount --bind '{}' /proc/meminfo && mount --bind {UNREADABLE} /proc/diskstats && \
         exec '{}' -q -i 0.2 -o '{}' --summary '{}' -- sleep {secs}",
        empty.display(),
        tracker().display(),
        out.display(),
        sum.display()
    );
    let mut cmd = Command::new("unshare");
    cmd.current_dir(&s.0)
        .args(["-m", "--propagation", "private", "sh", "-c", &script]);
    e2e::clean_env(&mut cmd);
    let o = run(&mut cmd);
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(!err.contains("panicked"), "{err}");
    (read_jsonl(&out), err, read_json(&sum))
}

/// A write-only sysfs attribute present on every kernel with a platform bus.
const UNREADABLE: &str = "/sys/bus/platform/drivers_probe";

#[test]
fn missing_proc_files_degrade_with_one_warning_each() {
    let usable = e2e::is_root()
        && e2e::have("unshare")
        && std::path::Path::new(UNREADABLE).exists()
        && std::fs::File::open(UNREADABLE).is_err();
    if !e2e::require(
        usable,
        "needs root, unshare(1) and an unreadable /sys/bus/platform/drivers_probe",
    ) {
        return;
    }
    let (short, short_err, summary) = run_with_broken_proc("0.5");
    let (long, long_err, _) = run_with_broken_proc("2");
    assert!(long.len() >= 8, "{} samples", long.len());
    for x in short.iter().chain(&long) {
        // Every memory field is null: the file has no lines.
        for (k, v) in x["memory"].as_object().expect("memory") {
            assert!(v.is_null(), "memory.{k} = {v}");
        }
        // Disks are still listed (from /sys/block), with their mounts (statvfs), but
        // without I/O: no rate, no interval bytes, no total.
        let disks = x["disk"].as_array().expect("disk");
        for d in disks {
            for k in [
                "read_bytes_per_sec",
                "write_bytes_per_sec",
                "read_bytes",
                "write_bytes",
                "read_bytes_total",
                "write_bytes_total",
            ] {
                assert!(d[k].is_null(), "disk {k}: {d}");
            }
        }
        assert_eq!(
            disks.len(),
            e2e::listed_disks().len(),
            "disks still listed: {x}"
        );
        // The rest is filled.
        assert!(x["cpu"]["utilization_pct"].is_number(), "{x}");
        assert!(x["cpu"]["per_core_pct"].is_array(), "{x}");
        assert!(x["process"]["pid"].is_number(), "{x}");
        assert!(x["timestamp_secs"].is_number() && x["tracker"]["rss_mib"].is_number());
    }
    assert!(summary["host"]["host_memory_mib"].is_null(), "{summary}");
    assert!(summary["host"]["host_vcpus"].is_number(), "{summary}");
    // One warning per broken file or field for the whole run: the 2 s run (10
    // samples) says exactly what the 0.5 s run (3 samples) said, each line once.
    let (a, b) = (messages(&short_err), messages(&long_err));
    eprintln!("warnings:\n{}", b.join("\n"));
    let mut uniq = b.clone();
    uniq.sort();
    uniq.dedup();
    assert_eq!(uniq.len(), b.len(), "a warning repeated: {long_err}");
    assert_eq!(a, b, "the same warnings whatever the run length");
    let mem = b.iter().filter(|l| l.contains("/proc/meminfo")).count();
    let disk = b.iter().filter(|l| l.contains("/proc/diskstats")).count();
    assert!(mem >= 1, "meminfo named: {long_err}");
    assert_eq!(disk, 1, "diskstats named once: {long_err}");
    // At most one per meminfo field the sample uses (MemTotal, MemFree,
    // MemAvailable, Buffers, Cached, SReclaimable, Active, Inactive, SwapTotal,
    // SwapFree) plus one for the file.
    assert!(mem <= 11, "{mem} meminfo warnings: {long_err}");
    assert_eq!(b.len(), mem + disk, "nothing else warned: {long_err}");
}

/// Root whose capabilities were dropped (a container, a bounding set): eBPF is
/// refused in one line that says why and what is needed, and the run goes on with
/// procfs.
#[test]
fn root_without_bpf_capabilities_is_told_why() {
    if !e2e::require(
        e2e::is_root() && e2e::have("setpriv"),
        "root and setpriv are needed to drop capabilities",
    ) {
        return;
    }
    let s = Scratch::new("nocaps");
    let mut cmd = Command::new("setpriv");
    cmd.current_dir(&s.0)
        .args(["--bounding-set=-bpf,-perfmon,-sys_admin", "--"])
        .arg(tracker())
        .args(["run", "-q", "--summary", "s.json", "--", "true"]);
    e2e::clean_env(&mut cmd);
    let o = run(&mut cmd);
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert_eq!(err.lines().count(), 1, "{err}");
    assert!(
        err.contains("capabilities were dropped") && err.contains("CAP_BPF"),
        "{err}"
    );
    assert_eq!(read_json(&s.path("s.json"))["backend"], "procfs");
}

/// A config path with a line break: the warning about it stays one line, the
/// break shown escaped.
#[test]
fn a_config_path_with_a_newline_stays_one_line() {
    let s = Scratch::new("cfg-newline");
    let p = s.path("a\nb.toml");
    let o = run(Command::new(tracker())
        .current_dir(&s.0)
        .args(["run", "-q", "-c"])
        .arg(&p)
        .args(["--", "true"]));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(
        err.contains("a\\nb.toml") && err.contains("not found"),
        "{err}"
    );
    // An existing one with a bad value: the error is one line too.
    std::fs::write(&p, "[tracker]\ninterval_secs = 0\n").expect("config");
    let o = run(Command::new(tracker())
        .current_dir(&s.0)
        .args(["run", "-q", "-c"])
        .arg(&p)
        .args(["--", "true"]));
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert_eq!(err.trim_end().lines().count(), 1, "{err}");
    assert!(err.contains("a\\nb.toml"), "{err}");
}

/// A tracked process names itself: a command called with terminal control
/// sequences (ESC, BEL, a newline) reaches the summary's "top commands" escaped,
/// never raw, so it can neither clear the screen nor forge or erase a line.
#[test]
fn control_sequences_in_a_commands_name_reach_the_terminal_escaped() {
    let s = Scratch::new("comm-escape");
    // The name comes from the kernel's task on eBPF and from /proc on procfs.
    for backend in [&[][..], &["--no-ebpf"]] {
        let o = run(Command::new(tracker())
            .arg("run")
            .args(backend)
            .args(["-i", "0.1", "-o", "s.jsonl", "--", "sh", "-c"])
            // A shell under that name, busy for a few polls: procfs sees it too.
            .arg("n=\"$(printf 'a\\033[2Jb\\007c\\nd')\"; cp /bin/sh \"$n\" && \"./$n\" -c 'i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done'")
            .current_dir(&s.0));
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "{backend:?}: {err}");
        // Top commands come from exits the kernel programs hear (docs/schema.md).
        if backend.is_empty() {
            let tops = err
                .lines()
                .find(|l| l.contains("top commands by cpu"))
                .unwrap_or_else(|| panic!("no top commands line: {err}"));
            assert!(tops.contains("a\\u{1b}[2Jb\\u{7}c\\nd"), "{tops}");
        }
        assert!(
            !err.contains('\u{1b}') && !err.contains('\u{7}'),
            "{backend:?}: a control character reached the terminal: {err:?}"
        );
    }
}

/// A PID namespace of its own that still sees the host's /proc (`unshare --pid
/// --fork` without `--mount-proc`), as root, as root in a user namespace and as
/// the unprivileged user 65534 in one: every pid the tracker knows names another
/// process in that /proc (pid 2 is kthreadd), so the run is refused with one line
/// and exit 2 before the command starts, never reported as another process's
/// figures. With a /proc of its own the same run is tracked, the sleep's CPU and
/// processes its own, as root and as that user.
#[test]
fn a_pid_namespace_that_sees_the_hosts_proc_is_refused() {
    use std::os::unix::fs::PermissionsExt as _;
    if !e2e::require(
        e2e::is_root() && e2e::have("unshare") && e2e::have("setpriv"),
        "root, unshare and setpriv",
    ) {
        return;
    }
    let s = Scratch::new("pidns");
    let bin = tracker_for_any_user(&s);
    // The user writes its summary and the command's file here.
    std::fs::set_permissions(&s.0, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let userns: &[&str] = &["unshare", "--user", "--map-root-user", "--pid", "--fork"];
    let as_user = [AS_NOBODY, userns].concat();
    for pre in [&["unshare", "--pid", "--fork"][..], userns, &as_user] {
        let o = run(Command::new(pre[0])
            .args(&pre[1..])
            .arg(&bin)
            .args(["run", "-q", "--summary", "s.json", "--", "touch", "started"])
            .current_dir(&s.0));
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(2), "{pre:?}: {err}");
        assert!(err.contains("another PID namespace"), "{pre:?}: {err}");
        assert_eq!(err.trim_end().lines().count(), 1, "{pre:?}: {err}");
        assert!(!s.path("started").exists(), "{pre:?}: the command ran");
    }
    let own_proc = [userns, &["--mount-proc"]].concat();
    for pre in [
        &["unshare", "--pid", "--fork", "--mount-proc"][..],
        &[AS_NOBODY, &own_proc].concat(),
    ] {
        let _ = std::fs::remove_file(s.path("s.json"));
        let o = run(Command::new(pre[0])
            .args(&pre[1..])
            .arg(&bin)
            .args(["run", "-q", "--summary", "s.json", "--", "sleep", "2"])
            .current_dir(&s.0));
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(0), "{pre:?}: {err}");
        let sum = read_json(&s.path("s.json"));
        assert!(
            sum["cpu_total_secs"].as_f64().unwrap() <= 0.5,
            "{pre:?}: {sum}"
        );
        assert!(
            sum["processes_spawned"].as_u64().unwrap() <= 5,
            "{pre:?}: {sum}"
        );
    }
}
