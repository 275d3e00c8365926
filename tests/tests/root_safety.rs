//! A root tool that cannot be turned against its host. An unprivileged user (a real
//! process with uid 65534, `nobody`) plants links and files where the tracker, run
//! as root, will write: predictable scratch names in a shared directory, the paths
//! they give under sudo, a config file in their working directory. Nothing outside
//! the intended files may change.

use std::{
    os::unix::fs::{FileTypeExt, MetadataExt, PermissionsExt},
    path::{Path, PathBuf},
    process::{Command, Output, Stdio},
};

use tracker_tests::*;

const NOBODY: u32 = 65534;
const PRECIOUS: &str = "precious\n";

fn skip_unless_root() -> bool {
    !e2e::require(
        e2e::is_root() && e2e::have("setpriv"),
        "root and setpriv are needed to act as another user",
    )
}

/// Runs a shell script as the unprivileged user.
fn as_nobody(script: &str) {
    let o = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--",
            "sh",
            "-c",
            script,
        ])
        .output()
        .expect("setpriv");
    assert!(
        o.status.success(),
        "as nobody: {script}: {}",
        String::from_utf8_lossy(&o.stderr)
    );
}

/// A directory of the given mode and owner inside the scratch directory.
fn dir(s: &Scratch, name: &str, mode: u32, owner: u32) -> PathBuf {
    let d = s.path(name);
    std::fs::create_dir(&d).expect("mkdir");
    std::os::unix::fs::chown(&d, Some(owner), Some(owner)).expect("chown");
    std::fs::set_permissions(&d, std::fs::Permissions::from_mode(mode)).expect("chmod");
    d
}

/// A root-owned file the unprivileged user can read but not write.
fn victim(s: &Scratch) -> PathBuf {
    let d = dir(s, "root-only", 0o755, 0);
    let v = d.join("victim");
    std::fs::write(&v, PRECIOUS).expect("victim");
    v
}

fn assert_intact(v: &Path) {
    let m = std::fs::metadata(v).expect("victim is there");
    assert_eq!(std::fs::read_to_string(v).expect("read victim"), PRECIOUS);
    assert_eq!(
        (m.uid(), m.mode() & 0o777),
        (0, 0o644),
        "victim's owner and mode"
    );
}

fn tracker_cmd(cwd: &Path) -> Command {
    let mut c = Command::new(tracker());
    e2e::clean_env(&mut c);
    c.current_dir(cwd)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    c
}

fn one_line(o: &Output) -> String {
    let err = String::from_utf8_lossy(&o.stderr).into_owned();
    assert!(!err.contains("panicked"), "{err}");
    err
}

/// Scratch names with the tracker's pid in a world-writable sticky directory:
/// links planted for every pid the tracker may get never lead its spool file or
/// its unsent batches into the user's target.
#[test]
fn planted_scratch_names_are_never_followed() {
    if skip_unless_root() {
        return;
    }
    let s = Scratch::new("safe-spool");
    let v = victim(&s);
    let vdir = dir(&s, "root-dir", 0o755, 0);
    let shared = dir(&s, "shared", 0o1777, 0);
    let last: u32 = std::fs::read_to_string("/proc/sys/kernel/ns_last_pid")
        .expect("ns_last_pid")
        .trim()
        .parse()
        .expect("a pid");
    let (from, to) = (last + 1, last + 400);
    // One process plants them all, so the pids it would use stay in the window.
    as_nobody(&format!(
        "exec python3 -c 'import os\nfor i in range({from}, {to} + 1):\n    os.symlink(\"{v}\", \"{d}/resource-tracker-spool-%d\" % i)\n    os.symlink(\"{vd}\", \"{d}/resource-tracker-unsent-%d\" % i)'",
        v = v.display(),
        vd = vdir.display(),
        d = shared.display()
    ));
    let summary = s.path("summary.json");
    let dead = format!("http://127.0.0.1:{}", free_port());
    let o = tracker_cmd(&s.0)
        .env("SENTINEL_API_TOKEN", "t0ken")
        .env("SENTINEL_API_URL", &dead)
        .env("TRACKER_METADATA_URL", &dead)
        .env("TRACKER_METADATA_GCP_URL", &dead)
        .env("TRACKER_METADATA_ALIBABA_URL", &dead)
        .env("TRACKER_HTTP_TIMEOUT", "0.2")
        .env("TRACKER_UPLOAD_INTERVAL", "1")
        // A few rows fill memory: batches go through the spool file.
        .env("TRACKER_UPLOAD_MEMORY_LIMIT", "3000")
        .env("TRACKER_SPOOL_DIR", &shared)
        .args(["run", "-q", "--no-ebpf", "-i", "0.1", "--summary"])
        .arg(&summary)
        .args(["--", "sleep", "2.5"])
        .output()
        .expect("run the tracker");
    let err = one_line(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert_intact(&v);
    assert_eq!(std::fs::read_dir(&vdir).expect("root dir").count(), 0);
    let sum = read_json(&summary);
    let st = &sum["streaming"];
    assert!(st["spooled_batches"].as_u64().unwrap_or(0) > 0, "{st}");
    let kept = PathBuf::from(st["kept_dir"].as_str().expect("kept_dir"));
    let m = std::fs::symlink_metadata(&kept).expect("kept dir");
    assert!(
        m.is_dir() && kept.parent() == Some(shared.as_path()),
        "{}",
        kept.display()
    );
    assert_eq!((m.uid(), m.mode() & 0o777), (0, 0o700));
    assert!(std::fs::read_dir(&kept).expect("kept").count() > 0);
    // The run's pid was among the planted names, or the test proved nothing.
    let name = kept
        .file_name()
        .expect("name")
        .to_string_lossy()
        .into_owned();
    let pid: u32 = name
        .trim_start_matches("resource-tracker-unsent-")
        .split('-')
        .next()
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("pid in {name}"));
    assert!((from..=to).contains(&pid), "pid {pid} not in {from}..={to}");
}

/// Under sudo the outputs are opened as the user who ran it: a link they planted
/// in their own directory leads nowhere they could not write themselves, and what
/// the tracker creates is theirs.
#[test]
fn under_sudo_outputs_are_the_invoking_users() {
    if skip_unless_root() {
        return;
    }
    let s = Scratch::new("safe-sudo");
    let v = victim(&s);
    let home = dir(&s, "home", 0o755, NOBODY);
    as_nobody(&format!(
        "ln -s {} {}/out.jsonl",
        v.display(),
        home.display()
    ));
    let sudo = |c: &mut Command| {
        c.env("SUDO_UID", NOBODY.to_string())
            .env("SUDO_GID", NOBODY.to_string())
            .env("SUDO_USER", "nobody");
    };
    for flag in ["-o", "--summary", "--events"] {
        let mut c = tracker_cmd(&home);
        sudo(&mut c);
        let o = c
            .args(["run", "-q", flag, "out.jsonl", "--", "true"])
            .output()
            .expect("run");
        let err = one_line(&o);
        assert_eq!(o.status.code(), Some(1), "{flag}: {err}");
        assert!(
            err.contains("out.jsonl") && err.lines().count() == 1,
            "{flag}: {err}"
        );
        assert_intact(&v);
    }
    // The report is written at the end: the link is not followed, the command's
    // exit code stays, and the page goes to a kept file the line names.
    let mut c = tracker_cmd(&home);
    sudo(&mut c);
    let o = c
        .args(["run", "-q", "--report", "out.jsonl", "--", "true"])
        .output()
        .expect("run");
    let err = String::from_utf8_lossy(&o.stderr);
    assert_eq!(o.status.code(), Some(0), "--report: {err}");
    assert!(
        err.contains("out.jsonl") && err.contains("continued in"),
        "--report: {err}"
    );
    assert_intact(&v);
    let mut c = tracker_cmd(&home);
    sudo(&mut c);
    let o = c
        .args([
            "run",
            "-q",
            "-o",
            "samples.jsonl",
            "--summary",
            "s.json",
            "--",
            "true",
        ])
        .output()
        .expect("run");
    assert_eq!(o.status.code(), Some(0), "{}", one_line(&o));
    for f in ["samples.jsonl", "s.json"] {
        let m = std::fs::metadata(home.join(f)).expect(f);
        assert_eq!(
            (m.uid(), m.gid()),
            (NOBODY, NOBODY),
            "{f} belongs to the user"
        );
    }
    // --as-root, where the administrator allows it: the command and the files are
    // root's, and the user's link is still not followed (their directory is not
    // root's): being theirs, it cannot keep the command from running either, and
    // the samples go to a kept file.
    let _policy = AdminPolicy::allow_as_root();
    for (out, kept) in [("root.jsonl", false), ("out.jsonl", true)] {
        let mut c = tracker_cmd(&home);
        sudo(&mut c);
        let o = c
            .env("TMPDIR", &s.0)
            .args(["run", "-q", "--as-root", "-o", out, "--", "true"])
            .output()
            .expect("run");
        let err = one_line(&o);
        assert_eq!(o.status.code(), Some(0), "{out}: {err}");
        assert_eq!(
            err.contains("instead, and the command runs"),
            kept,
            "{out}: {err}"
        );
        assert_intact(&v);
    }
    let m = std::fs::metadata(home.join("root.jsonl")).expect("root.jsonl");
    assert_eq!(m.uid(), 0, "--as-root writes as root");
}

/// A sudoers rule for this binary grants tracking, not root: under sudo,
/// `--as-root` is refused (exit 2, one line, the command never started) unless
/// the administrator's own file allows it, and a policy file that is not root's
/// alone is not taken at its word. Root without sudo keeps `--as-root`.
#[test]
fn under_sudo_as_root_needs_the_administrators_word() {
    if skip_unless_root() {
        return;
    }
    let s = Scratch::new("safe-asroot");
    let marker = s.path("ran");
    let script = format!("id -u > {}", marker.display());
    let attempt = |sudo: bool| {
        let _ = std::fs::remove_file(&marker);
        let mut c = tracker_cmd(&s.0);
        if sudo {
            c.env("SUDO_UID", NOBODY.to_string())
                .env("SUDO_GID", NOBODY.to_string())
                .env("SUDO_USER", "nobody");
        }
        let o = c
            .args(["run", "-q", "--as-root", "--", "sh", "-c", &script])
            .output()
            .expect("run");
        let ran = std::fs::read_to_string(&marker).ok();
        (o, ran)
    };
    let refused = |what: &str, want: &str| {
        let (o, ran) = attempt(true);
        let err = one_line(&o);
        assert_eq!(o.status.code(), Some(2), "{what}: {err}");
        assert!(
            err.lines().count() == 1 && err.contains("--as-root") && err.contains(want),
            "{what}: {err}"
        );
        assert_eq!(ran, None, "{what}: the command ran");
    };
    let _ = std::fs::remove_file(AdminPolicy::PATH);
    refused("no policy", AdminPolicy::PATH);
    {
        let _p = AdminPolicy::set("[sudo]\nallow_as_root = false\n", 0o644);
        refused("allow_as_root = false", "allow_as_root = true");
    }
    {
        // Writable by others: its word is not taken, and nothing of it is echoed.
        let _p = AdminPolicy::set("[sudo]\nallow_as_root = true\nsecret = \"s3cr3t\"\n", 0o666);
        refused("a policy others can write", "only root may write");
        let (o, _) = attempt(true);
        assert!(!one_line(&o).contains("s3cr3t"));
    }
    {
        let _p = AdminPolicy::allow_as_root();
        let (o, ran) = attempt(true);
        assert_eq!(o.status.code(), Some(0), "allowed: {}", one_line(&o));
        assert_eq!(ran.as_deref(), Some("0\n"), "allowed: the command is root");
    }
    // Root without sudo: --as-root is what it always was.
    let (o, ran) = attempt(false);
    assert_eq!(o.status.code(), Some(0), "root: {}", one_line(&o));
    assert_eq!(ran.as_deref(), Some("0\n"));
}

/// `report` under sudo is made as the user who asked: a root-only recorded run is
/// not read into their page, and a page is not written where they could not write
/// it themselves (a root-owned directory, a root-owned file); what it writes is
/// theirs.
#[test]
fn under_sudo_a_report_reads_and_writes_as_the_user() {
    if skip_unless_root() {
        return;
    }
    let s = Scratch::new("safe-report");
    let home = dir(&s, "home", 0o755, NOBODY);
    let private = dir(&s, "private", 0o700, 0);
    // A recorded run of root's, and the same run the user may read.
    let o = tracker_cmd(&s.0)
        .args(["run", "-q", "-i", "0.1", "-o"])
        .arg(private.join("run.jsonl"))
        .args(["--", "sleep", "0.3"])
        .output()
        .expect("record a run");
    assert!(o.status.success(), "{}", one_line(&o));
    std::fs::copy(private.join("run.jsonl"), home.join("run.jsonl")).expect("copy");
    std::os::unix::fs::chown(home.join("run.jsonl"), Some(NOBODY), Some(NOBODY)).expect("chown");
    let v = victim(&s);
    let report = |input: &Path, out: &Path| {
        let mut c = tracker_cmd(&home);
        c.env("SUDO_UID", NOBODY.to_string())
            .env("SUDO_GID", NOBODY.to_string())
            .env("SUDO_USER", "nobody")
            .arg("report")
            .arg(input)
            .arg("-o")
            .arg(out);
        c.output().expect("report")
    };
    // Root's recorded run: not read.
    let o = report(&private.join("run.jsonl"), &home.join("x.html"));
    let err = one_line(&o);
    assert_eq!(o.status.code(), Some(1), "{err}");
    assert!(err.contains("run.jsonl"), "{err}");
    assert!(
        !home.join("x.html").exists(),
        "a page was made of root's run"
    );
    // Root's directory, root's file: not written.
    let o = report(&home.join("run.jsonl"), &private.join("new.html"));
    assert_ne!(o.status.code(), Some(0), "{}", one_line(&o));
    assert!(
        !private.join("new.html").exists(),
        "written in root's directory"
    );
    let o = report(&home.join("run.jsonl"), &v);
    assert_ne!(o.status.code(), Some(0), "{}", one_line(&o));
    assert_intact(&v);
    // The user's own: written, and theirs.
    let o = report(&home.join("run.jsonl"), &home.join("mine.html"));
    assert_eq!(o.status.code(), Some(0), "{}", one_line(&o));
    let m = std::fs::metadata(home.join("mine.html")).expect("mine.html");
    assert_eq!(
        (m.uid(), m.gid()),
        (NOBODY, NOBODY),
        "the page is the user's"
    );
}

/// Under sudo, the files the user names for the node agent and with `-c` are opened
/// with the user's rights: root's config is not read (none of its values in the
/// error), root's token is not sent to the user's listener, and the node agent's
/// output is the user's, never root's file or a file in root's directory.
#[test]
fn under_sudo_config_token_and_node_output_are_the_users() {
    if skip_unless_root() {
        return;
    }
    let s = Scratch::new("safe-node");
    let home = dir(&s, "home", 0o755, NOBODY);
    let private = dir(&s, "private", 0o755, 0);
    let secret = "SECRET-7f3a";
    // Root's own config, which the user cannot read: a wrong type would echo its
    // value, a right one would reach the summary.
    let conf = private.join("only.toml");
    std::fs::write(
        &conf,
        format!("[job]\nname = \"{secret}\"\ntags = \"{secret}\"\n"),
    )
    .expect("config");
    std::fs::set_permissions(&conf, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let token = private.join("token");
    std::fs::write(&token, format!("{secret}\n")).expect("token");
    std::fs::set_permissions(&token, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let sudo = |c: &mut Command| {
        c.env("SUDO_UID", NOBODY.to_string())
            .env("SUDO_GID", NOBODY.to_string())
            .env("SUDO_USER", "nobody");
    };
    let mut c = tracker_cmd(&home);
    sudo(&mut c);
    c.args(["run", "-q", "-c"])
        .arg(&conf)
        .arg("--summary")
        .arg(home.join("sum.json"))
        .args(["--", "true"]);
    let o = bounded(&mut c, 20);
    let err = one_line(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("only.toml") && !err.contains(secret), "{err}");
    assert!(
        !home.join("sum.json").exists(),
        "the run went on with root's config"
    );

    // A kernel BTF the user names (sudo's env_keep may pass the variable): refused
    // before anything starts, whoever's file it is: the BTF decides which kernel
    // addresses the programs read.
    let btf = private.join("btf");
    std::fs::write(&btf, b"\x9f\xeb\x01\x00 not BTF").expect("btf");
    std::fs::set_permissions(&btf, std::fs::Permissions::from_mode(0o600)).expect("chmod");
    let started = home.join("started");
    let mut c = tracker_cmd(&home);
    sudo(&mut c);
    c.env("TRACKER_KERNEL_BTF", &btf)
        .args(["run", "-q", "--", "touch"])
        .arg(&started);
    let o = bounded(&mut c, 20);
    let err = one_line(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.starts_with("resource-tracker: TRACKER_KERNEL_BTF: not taken from the environment")
            && err.lines().count() == 1,
        "{err}"
    );
    assert!(!started.exists(), "the command ran");

    // The kubelet's token: a listener of the user's never hears it.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("listen");
    listener.set_nonblocking(true).expect("nonblocking");
    let port = listener.local_addr().expect("addr").port();
    let mut c = tracker_cmd(&home);
    sudo(&mut c);
    c.args(["node", "--no-ebpf", "-i", "0.2", "--kubelet-url"])
        .arg(format!("http://127.0.0.1:{port}"))
        .arg("--kubelet-token-file")
        .arg(&token);
    let o = bounded(&mut c, 5);
    let err = one_line(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("--kubelet-token-file") && !err.contains(secret),
        "{err}"
    );
    let mut heard = Vec::new();
    while let Ok((mut conn, _)) = listener.accept() {
        use std::io::Read as _;
        conn.set_nonblocking(false).ok();
        conn.set_read_timeout(Some(std::time::Duration::from_millis(200)))
            .ok();
        let _ = conn.read_to_end(&mut heard);
    }
    assert!(
        !String::from_utf8_lossy(&heard).contains(secret),
        "root's token reached the user's listener"
    );

    // The node agent's output: never root's file, never in root's directory.
    let v = victim(&s);
    for out in [v.clone(), private.join("new.jsonl")] {
        let mut c = tracker_cmd(&home);
        sudo(&mut c);
        c.args(["node", "--no-ebpf", "-i", "0.2", "-o"]).arg(&out);
        let o = bounded(&mut c, 5);
        assert_ne!(
            o.status.code(),
            Some(0),
            "{}: {}",
            out.display(),
            one_line(&o)
        );
        assert!(
            one_line(&o).contains(&out.display().to_string()),
            "{}",
            one_line(&o)
        );
    }
    assert_intact(&v);
    assert!(
        !private.join("new.jsonl").exists(),
        "written in root's directory"
    );
    // The user's own: made, and theirs.
    let mine = home.join("node.jsonl");
    let mut c = tracker_cmd(&home);
    sudo(&mut c);
    c.args(["node", "--no-ebpf", "-i", "0.2", "-o"]).arg(&mine);
    let mut child = c.spawn().expect("node");
    let t0 = std::time::Instant::now();
    while !mine.exists() && t0.elapsed() < std::time::Duration::from_secs(10) {
        std::thread::sleep(std::time::Duration::from_millis(100));
    }
    std::thread::sleep(std::time::Duration::from_millis(500));
    // SAFETY: signalling the agent this test started.
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let st = child.wait().expect("wait");
    assert!(st.success(), "{st:?}");
    let m = std::fs::metadata(&mine).expect("node.jsonl");
    assert_eq!(
        (m.uid(), m.gid()),
        (NOBODY, NOBODY),
        "the output is the user's"
    );
}

/// A real user made for a test, with a home of its own in the scratch directory;
/// removed, with its sudoers rule if it got one, when the test ends, failed or not.
struct TestUser {
    name: String,
    uid: u32,
    gid: u32,
    home: PathBuf,
    rule: Option<PathBuf>,
}

impl Drop for TestUser {
    fn drop(&mut self) {
        if let Some(r) = &self.rule {
            let _ = std::fs::remove_file(r);
        }
        let _ = Command::new("userdel").arg(&self.name).status();
    }
}

fn test_user(s: &Scratch, prefix: &str) -> TestUser {
    std::fs::set_permissions(&s.0, std::fs::Permissions::from_mode(0o755)).expect("chmod");
    let name = format!("{prefix}{}", std::process::id() % 100000);
    let home = dir(s, "home", 0o755, 0);
    let st = Command::new("useradd")
        .args(["--no-create-home", "--shell", "/bin/sh", "--home-dir"])
        .arg(&home)
        .arg(&name)
        .status()
        .expect("useradd");
    assert!(st.success(), "useradd {name}");
    let id = |flag: &str| -> u32 {
        let o = Command::new("id")
            .arg(flag)
            .arg(&name)
            .output()
            .expect("id");
        String::from_utf8_lossy(&o.stdout)
            .trim()
            .parse()
            .expect("an id")
    };
    let (uid, gid) = (id("-u"), id("-g"));
    std::os::unix::fs::chown(&home, Some(uid), Some(gid)).expect("chown home");
    TestUser {
        name,
        uid,
        gid,
        home,
        rule: None,
    }
}

/// The binary where an administrator puts it: root's, in root's directory.
fn installed_binary(s: &Scratch) -> PathBuf {
    let bin = dir(s, "bin", 0o755, 0).join("resource-tracker");
    std::fs::copy(tracker(), &bin).expect("copy the binary");
    bin
}

/// `prefix` (`sudo -n BIN` or `BIN`) with `args`, as the user, in their home, with
/// `env` only besides PATH: bounded to 30 s.
fn as_user_cmd(u: &TestUser, prefix: &[&Path], args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut c = Command::new("setpriv");
    c.arg(format!("--reuid={}", u.uid))
        .arg(format!("--regid={}", u.gid))
        .args(["--init-groups", "--"])
        .args(prefix)
        .args(args)
        .current_dir(&u.home)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .envs(env.iter().copied())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    bounded(&mut c, 30)
}

/// `-o` of `run` and `node` on root's file and in root's directory, as the user
/// (`as_user`, uid `uid`): refused, or (someone else's file at the path) sent to a
/// kept file of the user's instead, said in one line; root's file intact and
/// nothing made in root's directory.
fn roots_files_not_written(
    as_user: &dyn Fn(&[&str]) -> Output,
    v: &Path,
    private: &Path,
    uid: u32,
) {
    for out in [show(v), show(&private.join("new.jsonl"))] {
        // Refused, or (someone else's file at the path) sent to a kept file of
        // the user's instead, said in one line.
        let o = as_user(&["run", "-q", "-o", &out, "--", "true"]);
        let err = one_line(&o);
        assert!(
            o.status.code() != Some(0) || err.contains("instead, and the command runs"),
            "run -o {out}: {err}"
        );
        if let Some(kept) = err
            .split_whitespace()
            .find(|w| w.ends_with("samples.jsonl"))
        {
            let k = std::fs::metadata(kept).expect("the kept file");
            assert_eq!(k.uid(), uid, "the kept file is the user's");
            let _ = std::fs::remove_dir_all(Path::new(kept).parent().expect("its dir"));
        }
        let o = as_user(&["node", "--no-ebpf", "-i", "0.2", "-o", &out]);
        assert_ne!(o.status.code(), Some(0), "node -o {out}: {}", one_line(&o));
    }
    assert_intact(v);
    assert!(
        !private.join("new.jsonl").exists(),
        "written in root's directory"
    );
}

/// A real user whose only grant is a sudoers rule for the binary, as an
/// administrator writes it: through real sudo, the command runs as the user,
/// `--as-root` is refused, a root-only file is neither read (`report`, `-c`) nor
/// written (`-o` of `run` and `node`), and what the user may write becomes theirs.
#[test]
fn a_sudoers_rule_for_the_binary_grants_tracking_not_root() {
    if skip_unless_root()
        || !e2e::require(
            e2e::have("sudo") && e2e::have("useradd"),
            "sudo and useradd",
        )
    {
        return;
    }
    let s = Scratch::new("safe-sudoers");
    let mut user = test_user(&s, "rtsudo");
    let (name, uid, gid, home) = (user.name.clone(), user.uid, user.gid, user.home.clone());
    let rule = PathBuf::from(format!("/etc/sudoers.d/{name}"));
    user.rule = Some(rule.clone());
    let bin = installed_binary(&s);
    std::fs::write(
        &rule,
        format!("{name} ALL=(root) NOPASSWD: {}\n", bin.display()),
    )
    .expect("rule");
    std::fs::set_permissions(&rule, std::fs::Permissions::from_mode(0o440)).expect("chmod rule");
    let private = dir(&s, "private", 0o700, 0);
    std::fs::write(private.join("only.toml"), "[job]\nname = \"SECRET-9b\"\n").expect("config");
    let v = victim(&s);
    let sudo = Path::new("sudo");
    let as_user = |args: &[&str]| as_user_cmd(&user, &[sudo, Path::new("-n"), &bin], args, &[]);
    // The command: the user, not root.
    let o = as_user(&["run", "-q", "--", "id", "-u"]);
    assert_eq!(o.status.code(), Some(0), "{}", one_line(&o));
    assert_eq!(
        String::from_utf8_lossy(&o.stdout).trim(),
        uid.to_string(),
        "the command's uid"
    );
    // --as-root: refused, the command never started.
    let o = as_user(&["run", "-q", "--as-root", "--", "id", "-u"]);
    assert_eq!(o.status.code(), Some(2), "{}", one_line(&o));
    assert!(
        o.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&o.stdout)
    );
    // Root's files: not read, not written, nothing of them shown.
    let conf = private.join("only.toml");
    let o = as_user(&["run", "-q", "-c", &show(&conf), "--", "true"]);
    assert_ne!(o.status.code(), Some(0), "{}", one_line(&o));
    assert!(!one_line(&o).contains("SECRET-9b"), "{}", one_line(&o));
    roots_files_not_written(&as_user, &v, &private, uid);
    // Attaching: root's process refused, the user's own tracked.
    let o = as_user(&["--pid", "1", "-q", "-i", "0.2"]);
    assert_eq!(o.status.code(), Some(2), "{}", one_line(&o));
    assert!(one_line(&o).contains("--pid 1"), "{}", one_line(&o));
    // The user's own process: attached (a tracker that attaches runs until it is
    // stopped, so it is stopped after a while; sudo passes the signal on).
    let mut theirs = Command::new("setpriv")
        .arg(format!("--reuid={uid}"))
        .arg(format!("--regid={gid}"))
        .args(["--init-groups", "--", "sleep", "30"])
        .spawn()
        .expect("the user's process");
    let err_file = s.path("attach.err");
    let mut attach = Command::new("setpriv")
        .arg(format!("--reuid={uid}"))
        .arg(format!("--regid={gid}"))
        .args(["--init-groups", "--", "sudo", "-n"])
        .arg(&bin)
        .args(["--pid", &theirs.id().to_string(), "-q", "-i", "0.2"])
        .current_dir(&home)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err_file).expect("attach.err"))
        .spawn()
        .expect("attach");
    std::thread::sleep(std::time::Duration::from_millis(1500));
    let early = attach.try_wait().expect("try_wait");
    // SAFETY: signalling the sudo this test started.
    unsafe { libc::kill(attach.id() as i32, libc::SIGTERM) };
    let t0 = std::time::Instant::now();
    while attach.try_wait().expect("try_wait").is_none() {
        if t0.elapsed() > std::time::Duration::from_secs(10) {
            let _ = attach.kill();
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    let _ = theirs.kill();
    let _ = theirs.wait();
    let err = std::fs::read_to_string(&err_file).unwrap_or_default();
    assert!(
        early.is_none(),
        "attaching to the user's own process ended: {early:?} {err}"
    );
    // The user's own output: made, and theirs.
    let mine = home.join("run.jsonl");
    let o = as_user(&[
        "run",
        "-q",
        "-i",
        "0.1",
        "-o",
        &show(&mine),
        "--",
        "sleep",
        "0.3",
    ]);
    assert_eq!(o.status.code(), Some(0), "{}", one_line(&o));
    let m = std::fs::metadata(&mine).expect("run.jsonl");
    assert_eq!((m.uid(), m.gid()), (uid, gid), "the output is the user's");
    drop(user);
    assert!(!rule.exists());
}

/// The sudoers table's twin for a capability grant (docs/deploy.md, "A capability
/// grant on the binary"): a real user runs a copy of the binary an administrator
/// gave `cap_bpf,cap_perfmon+ep`. It tracks with eBPF and counts every process; the
/// command has no capability; root's process and an engine setting from the
/// environment are refused (exit 2, one line, nothing made); root's files are
/// neither read nor written; the user's own process is attached to; what the
/// tracker writes is the user's.
#[test]
fn a_capability_grant_on_the_binary_grants_tracking_not_root() {
    if skip_unless_root()
        || !e2e::require(
            e2e::have("setcap") && e2e::have("useradd"),
            "setcap and useradd",
        )
    {
        return;
    }
    let s = Scratch::new("safe-setcap");
    let user = test_user(&s, "rtcap");
    let bin = installed_binary(&s);
    let st = Command::new("setcap")
        .arg("cap_bpf,cap_perfmon+ep")
        .arg(&bin)
        .status()
        .expect("setcap");
    assert!(st.success(), "setcap on {}", bin.display());
    let private = dir(&s, "private", 0o700, 0);
    std::fs::write(private.join("only.toml"), "[job]\nname = \"SECRET-9c\"\n").expect("config");
    let v = victim(&s);
    let as_user = |args: &[&str], env: &[(&str, &str)]| as_user_cmd(&user, &[&bin], args, env);
    // Tracked with eBPF, every process counted; the command as the user, with no
    // capability of the tracker's.
    let summary = user.home.join("s.json");
    let script = "grep CapEff /proc/self/status; id -u; for i in 1 2 3 4 5; do true & done; wait";
    let o = as_user(
        &[
            "run",
            "-q",
            "--summary",
            &show(&summary),
            "--",
            "sh",
            "-c",
            script,
        ],
        &[],
    );
    assert_eq!(o.status.code(), Some(0), "{}", one_line(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    assert!(
        out.contains("CapEff:\t0000000000000000"),
        "the command's capabilities: {out}"
    );
    assert!(
        out.contains(&format!("\n{}\n", user.uid)),
        "the command's uid: {out}"
    );
    let sum: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&summary).expect("s.json")).expect("json");
    assert_eq!(sum["backend"], "ebpf", "{sum}");
    // sh, grep, id and the five subshells.
    assert_eq!(sum["processes_spawned"], 8, "{sum}");
    let m = std::fs::metadata(&summary).expect("s.json");
    assert_eq!(
        (m.uid(), m.gid()),
        (user.uid, user.gid),
        "the summary is the user's"
    );
    // An engine setting from the environment: refused before anything is made.
    let made = user.home.join("btf.jsonl");
    let o = as_user(
        &["run", "-q", "-o", &show(&made), "--", "true"],
        &[("TRACKER_KERNEL_BTF", "/sys/kernel/btf/vmlinux")],
    );
    assert_eq!(o.status.code(), Some(2), "{}", one_line(&o));
    assert!(
        one_line(&o).contains("TRACKER_KERNEL_BTF"),
        "{}",
        one_line(&o)
    );
    assert_eq!(one_line(&o).lines().count(), 1, "{}", one_line(&o));
    assert!(!made.exists(), "made before the refusal");
    // Root's files: not read, not written, nothing of them shown.
    let o = as_user(
        &[
            "run",
            "-q",
            "-c",
            &show(&private.join("only.toml")),
            "--",
            "true",
        ],
        &[],
    );
    assert_ne!(o.status.code(), Some(0), "{}", one_line(&o));
    assert!(!one_line(&o).contains("SECRET-9c"), "{}", one_line(&o));
    roots_files_not_written(&|a: &[&str]| as_user(a, &[]), &v, &private, user.uid);
    // A recorded run, a report page and a kubelet token in root's directory: neither
    // read nor written, in one line.
    std::fs::write(private.join("run.jsonl"), "{}\n").expect("root's run");
    let page = show(&user.home.join("page.html"));
    let root_page = show(&private.join("page.html"));
    let token = private.join("token");
    std::fs::write(&token, "SECRET-tok-9c\n").expect("root's token");
    for args in [
        vec!["report", &show(&private.join("run.jsonl")), "-o", &page],
        vec!["run", "-q", "--report", &root_page, "--", "true"],
        vec![
            "node",
            "--no-ebpf",
            "-i",
            "0.2",
            "--kubelet-token-file",
            &show(&token),
        ],
    ] {
        let o = as_user(&args, &[]);
        assert_ne!(o.status.code(), Some(0), "{args:?}: {}", one_line(&o));
        assert!(
            one_line(&o).contains("Permission denied"),
            "{args:?}: {}",
            one_line(&o)
        );
        assert!(
            !one_line(&o).contains("SECRET"),
            "{args:?}: {}",
            one_line(&o)
        );
    }
    assert!(!user.home.join("page.html").exists() && !private.join("page.html").exists());
    // Attaching: root's process refused in one line, the user's own tracked.
    let o = as_user(&["--pid", "1", "-q", "-i", "0.2"], &[]);
    assert_eq!(o.status.code(), Some(2), "{}", one_line(&o));
    assert!(
        one_line(&o).contains("--pid 1: with the binary's capability grant"),
        "{}",
        one_line(&o)
    );
    let mut theirs = Command::new("setpriv")
        .arg(format!("--reuid={}", user.uid))
        .arg(format!("--regid={}", user.gid))
        .args(["--init-groups", "--", "sleep", "30"])
        .spawn()
        .expect("the user's process");
    // A tracker that attaches runs until it is stopped: stopped after a while.
    let attached = user.home.join("attach.json");
    let attach = Command::new("setpriv")
        .arg(format!("--reuid={}", user.uid))
        .arg(format!("--regid={}", user.gid))
        .args(["--init-groups", "--"])
        .arg(&bin)
        .args([
            "--pid",
            &theirs.id().to_string(),
            "-q",
            "-i",
            "0.2",
            "--summary",
        ])
        .arg(&attached)
        .current_dir(&user.home)
        .env_clear()
        .env("PATH", "/usr/bin:/bin")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("attach");
    std::thread::sleep(std::time::Duration::from_millis(1500));
    // SAFETY: signalling the tracker this test started.
    unsafe { libc::kill(attach.id() as i32, libc::SIGTERM) };
    let mut c = attach;
    let o = {
        let t0 = std::time::Instant::now();
        while c.try_wait().expect("try_wait").is_none() {
            if t0.elapsed() > std::time::Duration::from_secs(10) {
                let _ = c.kill();
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(50));
        }
        c.wait_with_output().expect("the attached tracker")
    };
    let _ = theirs.kill();
    let _ = theirs.wait();
    assert_eq!(o.status.code(), Some(0), "{}", one_line(&o));
    let sum: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&attached).expect("attach.json"))
            .expect("json");
    assert_eq!(sum["backend"], "ebpf", "{sum}");
}

/// A set-user-ID root copy of the binary, run by a user: refused in one line, exit
/// 2, before any setting is resolved or file read, for every subcommand; the
/// command never started and nothing made. It would be root's rights with the
/// user's environment, config and paths.
#[test]
fn a_set_user_id_root_binary_is_refused() {
    if skip_unless_root() {
        return;
    }
    let s = Scratch::new("safe-setuid");
    std::fs::set_permissions(&s.0, std::fs::Permissions::from_mode(0o777)).expect("chmod");
    let bin = installed_binary(&s);
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o4755)).expect("setuid");
    let started = s.path("started");
    let out = s.path("out.jsonl");
    let page = s.path("page.html");
    let (o_arg, s_arg, p_arg) = (show(&out), show(&started), show(&page));
    // A run, the same with a SUDO_UID the user set (real sudo makes the real uid
    // root), a report and the node agent: none gets past the first line.
    // Arguments and the environment besides PATH.
    type Case<'a> = (&'a [&'a str], &'a [(&'a str, &'a str)]);
    let cases: [Case; 4] = [
        (&["run", "-q", "-o", &o_arg, "--", "touch", &s_arg], &[]),
        (
            &["run", "-q", "-o", &o_arg, "--", "touch", &s_arg],
            &[("SUDO_UID", "65534"), ("SUDO_GID", "65534")],
        ),
        (&["report", "/etc/shadow", "-o", &p_arg], &[]),
        (&["node", "--no-ebpf", "-i", "0.2", "-o", &o_arg], &[]),
    ];
    for (args, env) in cases {
        let o = Command::new("setpriv")
            .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
            .arg(&bin)
            .args(args)
            .current_dir(&s.0)
            .env_clear()
            .env("PATH", "/usr/bin:/bin")
            .envs(env.iter().copied())
            .output()
            .expect("the set-user-ID binary");
        let err = one_line(&o);
        assert_eq!(o.status.code(), Some(2), "{args:?} {env:?}: {err}");
        assert!(
            err.contains("set-user-ID root") && err.lines().count() == 1,
            "{args:?} {env:?}: {err}"
        );
        assert!(
            !started.exists() && !out.exists() && !page.exists(),
            "{args:?} {env:?}: started or made: {err}"
        );
    }
}

/// As root without sudo, in a directory someone else owns: a planted link is not
/// followed and a file planted there is not taken over; the output goes to a kept
/// file instead, named in one line, and the command runs.
#[test]
fn as_root_a_users_directory_is_not_trusted() {
    if skip_unless_root() {
        return;
    }
    let s = Scratch::new("safe-root");
    let v = victim(&s);
    let theirs = dir(&s, "theirs", 0o755, NOBODY);
    as_nobody(&format!(
        "ln -s {v} {d}/link.json; echo mine > {d}/planted.json",
        v = v.display(),
        d = theirs.display()
    ));
    for name in ["link.json", "planted.json"] {
        let o = tracker_cmd(&s.0)
            .env("TMPDIR", &s.0)
            .args(["run", "-q", "--summary"])
            .arg(theirs.join(name))
            .args(["--", "true"])
            .output()
            .expect("run");
        let err = one_line(&o);
        assert_eq!(o.status.code(), Some(0), "{name}: {err}");
        assert!(
            err.contains(name) && err.contains("instead, and the command runs"),
            "{name}: {err}"
        );
        assert_eq!(err.lines().count(), 1, "{err}");
    }
    assert_intact(&v);
    assert_eq!(
        std::fs::read_to_string(theirs.join("planted.json")).expect("planted"),
        "mine\n"
    );
    // A new file there is fine: nobody could have prepared it.
    let o = tracker_cmd(&s.0)
        .args(["run", "-q", "--summary"])
        .arg(theirs.join("new.json"))
        .args(["--", "true"])
        .output()
        .expect("run");
    assert_eq!(o.status.code(), Some(0), "{}", one_line(&o));
}

/// As root, a config file that someone else controls is not read (it could name
/// any output): in the working directory it is ignored with a warning; named with
/// -c it is refused (exit 2), whether another user owns it or anyone can write it.
#[test]
fn as_root_a_config_file_others_can_change_is_not_read() {
    if skip_unless_root() {
        return;
    }
    let s = Scratch::new("safe-config");
    let v = victim(&s);
    let cwd = dir(&s, "project", 0o755, NOBODY);
    as_nobody(&format!(
        "printf '[tracker]\\noutput = \"{}\"\\n' > {}/resource-tracker.toml",
        v.display(),
        cwd.display()
    ));
    let o = tracker_cmd(&cwd)
        .args(["run", "--", "true"])
        .output()
        .expect("run");
    let err = one_line(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(
        err.contains("resource-tracker.toml") && err.contains("not owned by root"),
        "{err}"
    );
    assert_intact(&v);
    // Named explicitly: refused, the command not started.
    let o = tracker_cmd(&cwd)
        .args(["run", "-q", "-c", "resource-tracker.toml", "--", "touch"])
        .arg(s.path("started"))
        .output()
        .expect("run");
    let err = one_line(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("belongs to uid 65534"), "{err}");
    assert!(!s.path("started").exists());
    assert_intact(&v);
    // Root's own file that anyone can write: ignored in the working directory,
    // refused when named.
    let mine = dir(&s, "mine", 0o755, 0);
    let cfg = mine.join("resource-tracker.toml");
    std::fs::write(&cfg, format!("[tracker]\noutput = \"{}\"\n", v.display())).expect("cfg");
    std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o666)).expect("chmod");
    let o = tracker_cmd(&mine)
        .args(["run", "-q", "--", "true"])
        .output()
        .expect("run");
    let err = one_line(&o);
    assert_eq!(o.status.code(), Some(0), "{err}");
    assert!(err.contains("anyone can write it"), "{err}");
    assert_intact(&v);
    let o = tracker_cmd(&mine)
        .args(["run", "-q", "-c"])
        .arg(&cfg)
        .args(["--", "true"])
        .output()
        .expect("run");
    let err = one_line(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(
        err.contains("anyone can write it (mode 0666); not read as root"),
        "{err}"
    );
    assert_intact(&v);
    // Group-writable by a group other than root's: the same.
    std::os::unix::fs::chown(&cfg, Some(0), Some(NOBODY)).expect("chown");
    std::fs::set_permissions(&cfg, std::fs::Permissions::from_mode(0o664)).expect("chmod");
    let o = tracker_cmd(&mine)
        .args(["run", "-q", "-c"])
        .arg(&cfg)
        .args(["--", "true"])
        .output()
        .expect("run");
    assert_eq!(o.status.code(), Some(2), "{}", one_line(&o));
    assert_intact(&v);
}

/// TRACKER_SPOOL_DIR must name an existing directory, not a file or a link, and is
/// never created.
#[test]
fn spool_dir_is_checked_at_start() {
    let s = Scratch::new("safe-spooldir");
    let file = s.path("file");
    std::fs::write(&file, "x").expect("file");
    let link = s.path("link");
    std::os::unix::fs::symlink(&s.0, &link).expect("symlink");
    let missing = s.path("missing");
    for (p, needle) in [
        (&file, "not a directory"),
        (&link, "symbolic link"),
        (&missing, "No such file"),
    ] {
        let o = tracker_cmd(&s.0)
            .env("SENTINEL_API_TOKEN", "t0ken")
            .env("TRACKER_SPOOL_DIR", p)
            .args(["run", "--", "true"])
            .output()
            .expect("run");
        let err = one_line(&o);
        assert_eq!(o.status.code(), Some(2), "{err}");
        assert!(
            err.contains("TRACKER_SPOOL_DIR") && err.contains(needle) && err.lines().count() == 1,
            "{err}"
        );
    }
    assert!(!missing.exists());
    // Under sudo (a sudoers rule may keep the variable): a directory the user may
    // not write is refused before anything starts, and nothing is made in it.
    if !e2e::is_root() {
        return;
    }
    let home = dir(&s, "home", 0o755, NOBODY);
    let roots = dir(&s, "roots", 0o755, 0);
    for (p, ok) in [(&roots, false), (&home, true)] {
        let o = tracker_cmd(&home)
            .env("SUDO_UID", NOBODY.to_string())
            .env("SUDO_GID", NOBODY.to_string())
            .env("SUDO_USER", "nobody")
            .env("SENTINEL_API_TOKEN", "t0ken")
            .env("SENTINEL_API_URL", "http://127.0.0.1:9")
            .env("TRACKER_SPOOL_DIR", p)
            .args(["run", "-q", "--", "true"])
            .output()
            .expect("run");
        let err = one_line(&o);
        if ok {
            assert_ne!(o.status.code(), Some(2), "{err}");
        } else {
            assert_eq!(o.status.code(), Some(2), "{err}");
            assert!(
                err.contains("TRACKER_SPOOL_DIR") && err.contains("user nobody"),
                "{err}"
            );
        }
    }
    assert_eq!(
        std::fs::read_dir(&roots).expect("roots").count(),
        0,
        "the tracker made something in root's directory"
    );
}

/// Runs `c` and fails the test if it has not ended within `secs` (it is killed).
fn bounded(c: &mut Command, secs: u64) -> Output {
    let mut child = c.stdin(Stdio::null()).spawn().expect("spawn");
    let t0 = std::time::Instant::now();
    while child.try_wait().expect("wait").is_none() {
        if t0.elapsed() > std::time::Duration::from_secs(secs) {
            let _ = child.kill();
            let o = child.wait_with_output().expect("reap");
            panic!(
                "{c:?} still running after {secs} s: {}",
                String::from_utf8_lossy(&o.stderr)
            );
        }
        std::thread::sleep(std::time::Duration::from_millis(50));
    }
    child.wait_with_output().expect("output")
}

/// FIFOs another user planted in a shared directory (as /tmp) where root writes
/// or reads: nothing blocks, nothing is read or written through them, and they
/// cannot keep root's command from running. An output goes to a private file
/// instead (one line names both), with or without someone holding the other end,
/// and the command's exit code is the tracker's; a FIFO as the kernel's BTF costs
/// eBPF only.
#[test]
fn planted_fifos_never_block_root() {
    if skip_unless_root() {
        return;
    }
    let s = Scratch::new("safe-fifo");
    let shared = dir(&s, "tmp", 0o1777, 0);
    as_nobody(&format!(
        "cd {}; for f in o s e r c b ri ro no; do mkfifo $f.fifo; done",
        shared.display()
    ));
    let f = |n: &str| shared.join(format!("{n}.fifo"));
    let started = s.path("started");
    let kept_root = dir(&s, "kept", 0o700, 0);
    for (flag, n, kept_name) in [
        ("-o", "o", "samples.jsonl"),
        ("--summary", "s", "summary.json"),
        ("--events", "e", "events.jsonl"),
        ("--report", "r", "report.html"),
    ] {
        for reader in [false, true] {
            // Someone holding the read end open makes a write open succeed.
            let held = reader.then(|| {
                Command::new("setpriv")
                    .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
                    .args(["sh", "-c", &format!("exec sleep 20 < {}", f(n).display())])
                    .spawn()
                    .expect("reader")
            });
            std::thread::sleep(std::time::Duration::from_millis(200));
            let _ = std::fs::remove_file(&started);
            let o = bounded(
                tracker_cmd(&s.0)
                    .env("TMPDIR", &kept_root)
                    .args(["run", "-q", flag])
                    .arg(f(n))
                    .args(["--", "sh", "-c"])
                    .arg(format!("touch {}; exit 3", started.display())),
                20,
            );
            if let Some(mut h) = held {
                let _ = h.kill();
                let _ = h.wait();
            }
            let err = one_line(&o);
            assert_eq!(o.status.code(), Some(3), "{flag} (reader {reader}): {err}");
            assert!(
                err.contains(&*f(n).to_string_lossy()) && err.contains("FIFO"),
                "{flag}: {err}"
            );
            assert_eq!(err.lines().count(), 1, "{err}");
            assert!(
                started.exists(),
                "{flag} (reader {reader}): the command did not run"
            );
            // The line names the private file, which holds the output.
            let kept = err
                .split_whitespace()
                .find(|w| w.ends_with(kept_name))
                .map(PathBuf::from)
                .unwrap_or_else(|| panic!("{flag}: no kept file named: {err}"));
            assert!(kept.starts_with(&kept_root), "{flag}: {err}");
            let body = std::fs::read_to_string(&kept).expect("the kept file");
            if flag != "-o" {
                assert!(!body.is_empty(), "{flag}: {} is empty", kept.display());
            }
            let fifo = std::fs::symlink_metadata(f(n)).expect("the FIFO");
            assert!(fifo.file_type().is_fifo(), "{flag}: the FIFO was replaced");
        }
    }
    // A TMPDIR where nothing can be kept (missing, a file, read-only): the output
    // goes to /tmp instead, said in one line, and the command runs.
    let ro = dir(&s, "ro", 0o555, 0);
    let file = s.path("tmpfile");
    std::fs::write(&file, "x").expect("file");
    // Root writes through a mode; a read-only bind mount stops it. Unmounted when
    // the check ends, failed or not.
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let bound = Command::new("mount")
        .args(["--bind"])
        .arg(&ro)
        .arg(&ro)
        .status()
        .is_ok_and(|st| st.success());
    let _unmount = bound.then(|| Unmount(ro.clone()));
    let remounted = bound
        && Command::new("mount")
            .args(["-o", "remount,bind,ro"])
            .arg(&ro)
            .status()
            .is_ok_and(|st| st.success());
    assert!(remounted, "cannot make {} read-only", ro.display());
    for tmpdir in [s.path("missing"), file.clone(), ro.clone()] {
        let _ = std::fs::remove_file(&started);
        let o = bounded(
            tracker_cmd(&s.0)
                .env("TMPDIR", &tmpdir)
                .args(["run", "-q", "--summary"])
                .arg(f("s"))
                .args(["--", "sh", "-c"])
                .arg(format!("touch {}; exit 3", started.display())),
            20,
        );
        let err = one_line(&o);
        assert_eq!(
            o.status.code(),
            Some(3),
            "TMPDIR {}: {err}",
            tmpdir.display()
        );
        assert!(
            started.exists(),
            "TMPDIR {}: the command did not run",
            tmpdir.display()
        );
        assert!(
            err.contains(&*f("s").to_string_lossy())
                && err.contains("instead, and the command runs"),
            "TMPDIR {}: {err}",
            tmpdir.display()
        );
        let kept = err
            .split_whitespace()
            .find(|w| w.ends_with("summary.json"))
            .map(PathBuf::from)
            .unwrap_or_else(|| panic!("no kept file named: {err}"));
        assert!(kept.starts_with("/tmp"), "{err}");
        assert!(std::fs::metadata(&kept).is_ok_and(|m| m.len() > 0), "{err}");
        let _ = std::fs::remove_dir_all(kept.parent().expect("kept dir"));
    }
    // Inputs: refused in one line, never read.
    std::fs::write(s.path("x.jsonl"), "{}\n").expect("input");
    let cases: [(Vec<String>, i32); 4] = [
        (
            vec![
                "run".into(),
                "-c".into(),
                show(&f("c")),
                "--".into(),
                "true".into(),
            ],
            2,
        ),
        (vec!["report".into(), show(&f("ri"))], 1),
        (
            vec![
                "report".into(),
                "-o".into(),
                show(&f("ro")),
                show(&s.path("x.jsonl")),
            ],
            1,
        ),
        (vec!["node".into(), "-o".into(), show(&f("no"))], 1),
    ];
    for (args, code) in cases {
        let o = bounded(tracker_cmd(&s.0).args(&args), 20);
        let err = one_line(&o);
        assert_eq!(o.status.code(), Some(code), "{args:?}: {err}");
        assert!(err.contains("FIFO"), "{args:?}: {err}");
    }
    // The kernel's BTF: eBPF is given up, the command runs, its exit code stays.
    let o = bounded(
        tracker_cmd(&s.0)
            .env("TRACKER_KERNEL_BTF", f("b"))
            .args(["run", "-q", "--", "sh", "-c", "exit 3"]),
        20,
    );
    let err = one_line(&o);
    assert_eq!(o.status.code(), Some(3), "{err}");
    assert!(err.contains("b.fifo") && err.contains("FIFO"), "{err}");
}

/// Devices that never end, as inputs: every read is bounded, one line names the
/// file, and the command runs when the input only costs eBPF.
#[test]
fn endless_inputs_are_read_within_a_bound() {
    let s = Scratch::new("safe-zero");
    for (args, code, needle) in [
        (vec!["run", "-c", "/dev/zero", "--", "true"], 2, "/dev/zero"),
        (
            vec!["run", "-c", "/dev/urandom", "--", "true"],
            2,
            "/dev/urandom",
        ),
        (vec!["report", "/dev/zero"], 1, "/dev/zero"),
    ] {
        let t0 = std::time::Instant::now();
        let o = bounded(tracker_cmd(&s.0).args(&args), 30);
        let err = one_line(&o);
        assert_eq!(o.status.code(), Some(code), "{args:?}: {err}");
        assert!(err.contains(needle), "{args:?}: {err}");
        eprintln!("{args:?}: {:.2} s", t0.elapsed().as_secs_f64());
    }
    let o = bounded(
        tracker_cmd(&s.0)
            .env("TRACKER_KERNEL_BTF", "/dev/zero")
            .args(["run", "-q", "--", "sh", "-c", "exit 5"]),
        30,
    );
    let err = one_line(&o);
    assert_eq!(o.status.code(), Some(5), "{err}");
    // Without eBPF privileges the BTF is never read; with them, it is named.
    if e2e::is_root() {
        assert!(err.contains("/dev/zero"), "{err}");
    }
}

fn show(p: &Path) -> String {
    p.to_string_lossy().into_owned()
}
