//! Whatever fails in the tracker's output, the command it runs is never abandoned:
//! it runs to its end, its exit code is the tracker's, the failure is said in one
//! line, and what could not be written where asked is kept in a file the line names.
//! Full disks are real (a small tmpfs), closed pipes are real, a stopped command is
//! really stopped.

use std::{
    os::unix::fs::MetadataExt,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::Value;
use tracker_tests::*;

/// A tmpfs of `kib` KiB mounted on `dir`, unmounted when dropped.
struct SmallFs(PathBuf);

impl SmallFs {
    fn mount(dir: PathBuf, kib: u32) -> SmallFs {
        std::fs::create_dir_all(&dir).expect("mount point");
        let st = Command::new("mount")
            .args([
                "-t",
                "tmpfs",
                "-o",
                &format!("size={kib}k,mode=0755"),
                "tmpfs",
            ])
            .arg(&dir)
            .status()
            .expect("mount");
        assert!(st.success(), "mount a tmpfs on {}", dir.display());
        SmallFs(dir)
    }

    /// Fills it but for `left` bytes.
    fn fill(&self, left: u64) {
        let free = || {
            let out = Command::new("stat")
                .args(["-f", "-c", "%a %S"])
                .arg(&self.0)
                .output()
                .expect("stat -f");
            let t = String::from_utf8_lossy(&out.stdout).into_owned();
            let v: Vec<u64> = t
                .split_whitespace()
                .map(|x| x.parse().expect("n"))
                .collect();
            v[0] * v[1]
        };
        let n = free().saturating_sub(left);
        std::fs::write(self.0.join("filler"), vec![0u8; n as usize]).expect("filler");
        assert!(free() <= left, "left {} bytes", free());
    }
}

impl Drop for SmallFs {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(&self.0).status();
    }
}

fn skip_unless_root() -> bool {
    !e2e::require(e2e::is_root(), "root is needed to mount a small tmpfs")
}

/// The command: some processes, a marker file at its very end, exit code 7.
fn command(marker: &Path) -> Vec<String> {
    vec![
        "sh".into(),
        "-c".into(),
        format!(
            "for i in $(seq 300); do /bin/true; done; sleep 1.2; echo done > {}; exit 7",
            marker.display()
        ),
    ]
}

fn tracker_in(tmp: &Path) -> Command {
    let mut c = Command::new(tracker());
    e2e::clean_env(&mut c);
    c.env("TMPDIR", tmp).stdout(Stdio::null());
    c
}

/// The file named after "continued in" in the tracker's message for `what`.
fn continued_in(err: &str, what: &str) -> PathBuf {
    let line = err
        .lines()
        .find(|l| l.contains(what) && l.contains("No space left on device"))
        .unwrap_or_else(|| panic!("no line about {what}: {err}"));
    let (_, p) = line
        .split_once("; continued in ")
        .unwrap_or_else(|| panic!("no fallback named: {line}"));
    PathBuf::from(p.trim())
}

/// Samples, events and the summary to a full disk: the command runs to its end,
/// the tracker exits with its code, each failure is one line, and the samples, the
/// events and the summary are kept in private files under TMPDIR.
#[test]
fn a_full_disk_keeps_the_command_and_what_it_can() {
    if skip_unless_root() {
        return;
    }
    let s = Scratch::new("full-disk");
    let tmp = s.path("tmp");
    std::fs::create_dir(&tmp).expect("tmp");
    let fs = SmallFs::mount(s.path("disk"), 64);
    for (i, format) in ["json", "csv"].iter().enumerate() {
        fs.fill(600);
        let marker = s.path(&format!("marker-{i}"));
        let d = &fs.0;
        let o = tracker_in(&tmp)
            .args(["run", "-q", "-i", "0.1", "--format", format, "-o"])
            .arg(d.join("out"))
            .arg("--summary")
            .arg(d.join("summary.json"))
            .arg("--events")
            .arg(d.join("events.jsonl"))
            .arg("--")
            .args(command(&marker))
            .output()
            .expect("run the tracker");
        let err = String::from_utf8_lossy(&o.stderr).into_owned();
        assert!(!err.contains("panicked"), "{err}");
        assert_eq!(o.status.code(), Some(7), "{format}: {err}");
        assert_eq!(
            std::fs::read_to_string(&marker).ok().as_deref(),
            Some("done\n"),
            "the command ran to its end"
        );
        assert!(
            err.lines().all(|l| l.starts_with("resource-tracker: ")),
            "{err}"
        );
        let samples = continued_in(&err, "writing a sample");
        let summary = continued_in(&err, "writing summary file");
        let events = continued_in(&err, "writing the events file");
        for p in [&samples, &summary, &events] {
            assert!(p.starts_with(&tmp), "{} is under TMPDIR", p.display());
            let dm = std::fs::metadata(p.parent().expect("dir")).expect("kept dir");
            assert_eq!(dm.mode() & 0o777, 0o700, "{}", p.display());
        }
        let sum = read_json(&summary);
        assert_eq!(sum["exit_code"], 7);
        assert!(e2e::num(&sum, "/processes_spawned") >= 300.0, "{sum}");
        // Where the samples went is in the summary; the summary the full disk
        // could not take is not left behind empty or cut.
        assert_eq!(
            sum["samples_kept_in"].as_str(),
            samples.to_str(),
            "{format}: {sum}"
        );
        assert!(
            !d.join("summary.json").exists(),
            "{format}: a summary the disk could not take is left"
        );
        // The events go on in their kept file from the failure on: every line
        // whole in one of the two files, every process's exit once.
        let whole = |text: &str, what: &str| {
            for l in text.lines() {
                serde_json::from_str::<Value>(l)
                    .unwrap_or_else(|e| panic!("{format}: a cut line in {what} ({e}): {l:?}"));
            }
        };
        let exits = |text: &str| {
            text.lines()
                .filter_map(|l| serde_json::from_str::<Value>(l).ok())
                .filter(|v| v["kind"] == "exit")
                .map(|v| v["pid"].as_u64().unwrap_or(0))
                .collect::<Vec<u64>>()
        };
        let kept = std::fs::read_to_string(&events).expect("kept events");
        let first = std::fs::read_to_string(d.join("events.jsonl")).unwrap_or_default();
        whole(&first, "the events file asked for");
        whole(&kept, "the kept events file");
        let (a, b) = (exits(&first), exits(&kept));
        let mut all: Vec<u64> = a.iter().chain(&b).copied().collect();
        let n = all.len();
        all.sort_unstable();
        all.dedup();
        assert_eq!(all.len(), n, "{format}: an exit in both files");
        assert!(
            n >= 300,
            "exit events: {} in the file asked for, {} kept",
            a.len(),
            b.len()
        );
        if *format == "json" {
            let asked = std::fs::read_to_string(d.join("out")).unwrap_or_default();
            whole(&asked, "the samples file asked for");
        }
        let kept = std::fs::read_to_string(&samples).expect("kept samples");
        let rows: Vec<&str> = kept.lines().collect();
        assert!(rows.len() >= 3, "{kept}");
        match *format {
            "json" => {
                for r in &rows {
                    serde_json::from_str::<Value>(r).expect("a whole JSON line");
                }
            }
            _ => assert!(rows[0].starts_with("timestamp,"), "a header first: {kept}"),
        }
        std::fs::remove_dir_all(&tmp).expect("clean tmp");
        std::fs::create_dir(&tmp).expect("tmp");
        for f in ["out", "summary.json", "events.jsonl", "filler"] {
            let _ = std::fs::remove_file(d.join(f));
        }
    }
}

/// Samples on stderr, and stderr a file on a full disk: the samples go on in a
/// kept file, and the summary says which (`samples_kept_in`); the line that
/// names it, which the full stderr cannot take, goes to the system log.
#[test]
fn a_full_stderr_says_where_the_samples_went() {
    if skip_unless_root() {
        return;
    }
    let s = Scratch::new("full-stderr");
    let tmp = s.path("tmp");
    std::fs::create_dir(&tmp).expect("tmp");
    let fs = SmallFs::mount(s.path("disk"), 64);
    fs.fill(600);
    let marker = s.path("marker");
    let err = std::fs::File::create(fs.0.join("stderr")).expect("stderr file");
    let st = tracker_in(&tmp)
        .args(["run", "-i", "0.1", "--summary"])
        .arg(s.path("summary.json"))
        .arg("--")
        .args(command(&marker))
        .stderr(err)
        .status()
        .expect("run the tracker");
    assert_eq!(st.code(), Some(7), "{st:?}");
    let sum = read_json(&s.path("summary.json"));
    let kept = sum["samples_kept_in"]
        .as_str()
        .unwrap_or_else(|| panic!("samples_kept_in: {sum}"));
    assert!(Path::new(kept).starts_with(&tmp), "{kept}");
    let rows = std::fs::read_to_string(kept).expect("kept samples");
    assert!(rows.lines().count() >= 3, "{rows}");
    for r in rows.lines() {
        serde_json::from_str::<Value>(r).expect("a whole JSON line");
    }
}

/// Samples on stderr, and stderr a pipe its reader closed: no panic, the command
/// runs to its end and its exit code is the tracker's.
#[test]
fn a_closed_stderr_is_not_the_end() {
    let s = Scratch::new("closed-stderr");
    let marker = s.path("marker");
    let mut c = tracker_in(&s.0);
    c.args(["run", "-i", "0.1", "--summary"])
        .arg(s.path("summary.json"))
        .arg("--")
        .args(command(&marker))
        .stderr(Stdio::piped());
    let mut child = c.spawn().expect("run the tracker");
    // Read a little, then close the pipe as `| head -c 100` would.
    let mut err = child.stderr.take().expect("stderr");
    let mut first = [0u8; 100];
    std::io::Read::read_exact(&mut err, &mut first).expect("the first bytes");
    drop(err);
    let st = child.wait().expect("wait");
    assert_eq!(st.code(), Some(7), "{st:?}");
    assert_eq!(
        std::fs::read_to_string(&marker).ok().as_deref(),
        Some("done\n")
    );
    let sum = read_json(&s.path("summary.json"));
    assert_eq!(sum["exit_code"], 7);
}

/// A stopped command and a SIGTERM for the tracker: the command gets it, is
/// continued so that it can act on it, and the tracker ends with it at once.
#[test]
fn a_stopped_command_does_not_hold_the_tracker() {
    for backend in [&["--no-ebpf"][..], &[]] {
        if backend.is_empty() && !ebpf_available() {
            continue;
        }
        let s = Scratch::new("stopped");
        let mut c = tracker_in(&s.0);
        c.args(["run", "-q"])
            .args(backend)
            .args(["--", "sh", "-c", "kill -STOP $$; sleep 30"])
            .stderr(Stdio::null());
        let mut bg = e2e::Bg::spawn(&mut c, "tracker");
        // The command stops itself; wait until it has.
        let t0 = Instant::now();
        let stopped = loop {
            let kids =
                std::fs::read_to_string(format!("/proc/{p}/task/{p}/children", p = bg.pid()))
                    .unwrap_or_default();
            let state = kids.split_whitespace().next().and_then(|k| {
                let st = std::fs::read_to_string(format!("/proc/{k}/stat")).ok()?;
                st.rsplit_once(") ").map(|(_, r)| r.starts_with('T'))
            });
            if state == Some(true) {
                break true;
            }
            if t0.elapsed() > Duration::from_secs(10) {
                break false;
            }
            std::thread::sleep(Duration::from_millis(20));
        };
        assert!(stopped, "the command never stopped ({backend:?})");
        bg.signal(libc::SIGTERM);
        let st = bg.wait_for(Duration::from_secs(5));
        assert_eq!(st.code(), Some(128 + libc::SIGTERM), "{backend:?}");
    }
}

/// Started with stderr closed (`2>&-`), where the samples would go: the runtime
/// would have put /dev/null there. The samples are kept in a private file under
/// TMPDIR that the summary names, the command runs to its end and its exit code
/// is the tracker's.
#[test]
fn a_stderr_closed_at_start_keeps_the_samples() {
    let s = Scratch::new("stderr-closed");
    let marker = s.path("marker");
    let script = format!(
        "exec {} run -i 0.1 --summary {} -- {} 2>&-",
        tracker().display(),
        s.path("summary.json").display(),
        command(&marker)
            .iter()
            .map(|a| format!("'{}'", a.replace('\'', "'\\''")))
            .collect::<Vec<_>>()
            .join(" ")
    );
    let o = Command::new("sh")
        .args(["-c", &script])
        .env("TMPDIR", &s.0)
        .stdout(Stdio::null())
        .output()
        .expect("sh");
    assert_eq!(o.status.code(), Some(7), "{o:?}");
    assert_eq!(
        std::fs::read_to_string(&marker).ok().as_deref(),
        Some("done\n")
    );
    let sum = read_json(&s.path("summary.json"));
    let kept = PathBuf::from(sum["samples_kept_in"].as_str().expect("samples_kept_in"));
    assert!(kept.starts_with(&s.0), "{}", kept.display());
    let lines = read_jsonl(&kept);
    assert_eq!(
        Some(lines.len() as u64),
        sum["samples"].as_u64(),
        "every sample kept"
    );
    // Nothing degraded by the closed stderr. Members the kernel freed without
    // the free program (`exit_unread`, docs/engine.md) are the host's, not this.
    let degraded = &lines.last().expect("a sample")["tracker"]["degraded"];
    let other: Vec<&Value> = degraded
        .as_array()
        .expect("degraded is a list")
        .iter()
        .filter(|d| d["name"] != "exit_unread")
        .collect();
    assert!(other.is_empty(), "{degraded}");
    // With stderr open to /dev/null by choice, nothing is kept.
    let o = tracker_in(&s.0)
        .args(["run", "-i", "0.1", "--summary"])
        .arg(s.path("summary2.json"))
        .args(["--", "true"])
        .stderr(Stdio::null())
        .output()
        .expect("run");
    assert_eq!(o.status.code(), Some(0));
    assert!(read_json(&s.path("summary2.json"))["samples_kept_in"].is_null());
}

/// `TMPDIR=''` (or a relative TMPDIR): kept files go under /tmp and are named by
/// an absolute path, not one relative to the working directory.
#[test]
fn an_empty_tmpdir_keeps_files_under_tmp() {
    let s = Scratch::new("empty-tmpdir");
    for tmpdir in ["", "relative"] {
        let script = format!(
            "cd {} && TMPDIR='{tmpdir}' exec {} run -i 0.1 --summary {} -- true 2>&-",
            s.0.display(),
            tracker().display(),
            s.path("summary.json").display(),
        );
        let o = Command::new("sh")
            .args(["-c", &script])
            .stdout(Stdio::null())
            .output()
            .expect("sh");
        assert_eq!(o.status.code(), Some(0), "{o:?}");
        let sum = read_json(&s.path("summary.json"));
        let kept = PathBuf::from(sum["samples_kept_in"].as_str().expect("samples_kept_in"));
        assert!(
            kept.is_absolute() && kept.starts_with("/tmp") && kept.exists(),
            "TMPDIR={tmpdir:?}: {}",
            kept.display()
        );
        if let Some(d) = kept.parent() {
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// `--report` on a read-only mount is refused at start, as `-o` is (exit 1, one
/// line naming it), rather than found unwritable when the run ends.
#[test]
fn a_report_on_a_read_only_mount_is_refused_at_start() {
    if skip_unless_root() {
        return;
    }
    let s = Scratch::new("report-ro");
    let fs = SmallFs::mount(s.path("ro"), 64);
    let st = Command::new("mount")
        .args(["-o", "remount,ro"])
        .arg(&fs.0)
        .status()
        .expect("remount");
    assert!(st.success(), "remount read-only");
    let marker = s.path("started");
    for flag in ["--report", "-o"] {
        let o = tracker_in(&s.0)
            .args(["run", "-q", flag])
            .arg(fs.0.join("out"))
            .args(["--", "touch"])
            .arg(&marker)
            .stderr(Stdio::piped())
            .output()
            .expect("run");
        let err = String::from_utf8_lossy(&o.stderr);
        assert_eq!(o.status.code(), Some(1), "{flag}: {err}");
        assert_eq!(err.trim().lines().count(), 1, "{err}");
        assert!(err.contains(&*fs.0.join("out").to_string_lossy()), "{err}");
        assert!(!marker.exists(), "{flag}: the command started");
    }
}

/// A host-only tracker with `TRACKER_STOP_WITH_PARENT` whose starter is gone
/// before the tracker first looks (the starter leaves right after spawning it):
/// with `TRACKER_PARENT_PID` naming the starter, the tracker sees at its first
/// sample that the starter is gone and stops, its summary written. Without the
/// variable it would take the reaper that adopted it for its starter and run
/// for ever.
/// A host-only tracker started in the background by `sh`, which then leaves,
/// told to stop with the process `parent` names (a shell expression); its pid.
fn tracker_stopping_with(parent: &str, summary: &Path) -> i32 {
    let script = format!(
        "TRACKER_PARENT_PID={parent} TRACKER_STOP_WITH_PARENT=1 '{}' -q -i 0.2 --summary '{}' \
         </dev/null >/dev/null 2>&1 & echo $!",
        tracker().display(),
        summary.display()
    );
    let o = Command::new("sh")
        .args(["-c", &script])
        .output()
        .expect("sh");
    String::from_utf8_lossy(&o.stdout)
        .trim()
        .parse()
        .expect("the tracker's pid")
}

/// Whether `pid` runs (not a zombie).
fn alive(pid: i32) -> bool {
    std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|st| {
        !st.rsplit(')')
            .next()
            .unwrap_or("")
            .trim_start()
            .starts_with('Z')
    })
}

/// Waits up to 5 s for the tracker `pid` to end; kills it and fails otherwise.
fn gone_within_5s(pid: i32, after: &str) {
    let t0 = Instant::now();
    while alive(pid) {
        if t0.elapsed() > Duration::from_secs(5) {
            // SAFETY: kill takes a pid and a signal.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            panic!("the tracker {pid} still runs 5 s after {after}");
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn a_starter_gone_before_the_tracker_started_is_seen() {
    let tmp = Scratch::new("gone-starter");
    let pid = tracker_stopping_with("$$", &tmp.path("s.json"));
    gone_within_5s(pid, "its starter left");
    let sum = read_json(&tmp.path("s.json"));
    assert_eq!(sum["backend"], "none", "{sum}");

    // A starter that is alive but not the tracker's parent (a wrapper stands
    // between): the tracker runs while it lives and stops once it is gone.
    let mut starter = Command::new("sleep").arg("1.5").spawn().expect("sleep");
    let pid = tracker_stopping_with(&starter.id().to_string(), &tmp.path("s2.json"));
    std::thread::sleep(Duration::from_millis(800));
    let running = alive(pid);
    let _ = starter.wait();
    gone_within_5s(pid, "its starter ended");
    assert!(running, "the tracker stopped while its starter lived");
    assert_eq!(read_json(&tmp.path("s2.json"))["backend"], "none");
}
