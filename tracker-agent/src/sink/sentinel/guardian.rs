//! The guardian: a small process that saves the rows of a tracker that was killed
//! (SIGKILL, the OOM killer) and finishes its run, so that a killed tracker loses
//! no row and leaves no run open on the server.
//!
//! The tracker journals every row, before it could be lost, to a file with no name
//! (a memfd: a crash leaves nothing behind, and a full or failing spool directory
//! does not stop it), along with what the guardian needs to carry on: the settings, the
//! registration, fresh credentials, and how far rows were uploaded or kept. The
//! guardian holds the same file and the read end of a pipe whose only writer is
//! the tracker. A clean end writes [`DONE`] on it; end of file without it means the
//! tracker died, and the guardian replays the journal and does what the tracker's
//! own end would have: upload the rows not yet sent (or keep them in a private
//! directory), then `finish` the run as failed.
//!
//! Journal records, one a line: `H <json>` the settings (first), `B <json>` the
//! registration body, `S <json>` the registration answer, `C <json>` credentials
//! from a refresh, `R<index>,<csv row>` a row, `U <index> <uri>` a batch uploaded
//! whose last row is `index`, `K <index> <dir>` rows kept up to `index`, `F` the run
//! finished, `P` a registration sent, `T <seq> <index>` a batch's PUT sent (it may
//! land even unanswered) whose last row is `index`, `D <dir>` the directory that batches go to
//! since the spool failed. Rows up to the highest `U`/`K` index are saved; the tracker then zeroes
//! their bytes (a punched hole), so the journal holds only rows not yet saved.

use std::{
    fs::File,
    io::{self, Read as _},
    os::{
        fd::{FromRawFd, OwnedFd},
        unix::{fs::FileExt as _, process::CommandExt as _},
    },
    path::PathBuf,
    process::{Command, Stdio},
    sync::Arc,
    time::Duration,
};

use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{
    config::{Config, Secret},
    journal::Journal,
};

/// What the tracker writes on the pipe at a clean end.
const DONE: u8 = b'D';
/// argv[0] of the guardian, and the variable that must come with it.
const NAME: &str = "resource-tracker-guardian";
const MARK: &str = "RESOURCE_TRACKER_GUARDIAN";
/// The exit code sent in `finish` for a run whose tracker was killed: the command's
/// own code is unknown (it may still run), and 128 + SIGKILL says what happened.
pub const KILLED_EXIT_CODE: i32 = 128 + libc::SIGKILL;

/// Whose the guardian becomes: the invoking user under sudo, as the command.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct Identity {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

/// The `H` record: the streaming settings, the token among them, so that nothing
/// secret goes through the guardian's argv or environment.
#[derive(Serialize, Deserialize)]
struct Header {
    token: String,
    api_url: String,
    s3_endpoint: Option<String>,
    memory_limit: usize,
    spool_dir: PathBuf,
    temp_dir: PathBuf,
    timeout_ms: u64,
    upload_interval: f64,
    run_as: Option<Identity>,
    tracker_pid: u32,
}

/// The tracker's handle on its guardian.
pub struct Guardian {
    /// The pipe's write end: closed by the tracker's death, or told [`DONE`].
    alive: Option<File>,
    pub journal: Arc<Journal>,
}

impl Guardian {
    /// Starts the guardian. Called before the tracker becomes a subreaper: the
    /// guardian is started through an intermediate process that exits at once, so
    /// it is not the tracker's child (not taken for an orphan of the tree, never
    /// reaped by the tracker's wait4).
    pub fn start(cfg: &Config, run_as: Option<Identity>) -> io::Result<Guardian> {
        let file = match memfd() {
            Ok(f) => f,
            Err(_) => crate::fsafe::anonymous_file(&cfg.spool_dir)?,
        };
        let header = Header {
            token: cfg.token.0.clone(),
            api_url: cfg.api_url.clone(),
            s3_endpoint: cfg.s3_endpoint.clone(),
            memory_limit: cfg.memory_limit,
            spool_dir: cfg.spool_dir.clone(),
            temp_dir: crate::fsafe::temp_dir(),
            timeout_ms: cfg.timeout.as_millis() as u64,
            upload_interval: cfg.upload_interval,
            run_as,
            tracker_pid: std::process::id(),
        };
        let h = serde_json::to_string(&header).map_err(io::Error::other)?;
        let rec = format!("H {h}\n");
        file.write_all_at(rec.as_bytes(), 0)?;
        let (read, write) = pipe()?;
        let mut cmd = Command::new("/proc/self/exe");
        cmd.arg0(NAME)
            .arg(std::process::id().to_string())
            .env_clear()
            .env(MARK, "1")
            .current_dir("/")
            .stdin(Stdio::from(read))
            .stdout(Stdio::from(file.try_clone()?))
            .stderr(Stdio::inherit());
        for v in ["RUST_LOG", "TMPDIR"] {
            if let Some(l) = std::env::var_os(v) {
                cmd.env(v, l);
            }
        }
        // SAFETY: runs between fork and exec in the child, where only
        // async-signal-safe calls may be made: fork and _exit are, and nothing is
        // allocated.
        unsafe {
            cmd.pre_exec(|| match libc::fork() {
                -1 => Err(io::Error::last_os_error()),
                0 => Ok(()),
                _ => libc::_exit(0),
            });
        }
        // The intermediate exits at once; waiting for it only reaps it.
        cmd.spawn()?.wait()?;
        Ok(Guardian {
            alive: Some(File::from(write)),
            journal: Arc::new(Journal::new(file, rec.len() as u64)),
        })
    }

    /// A clean end: the guardian exits without doing anything.
    pub fn done(&mut self) {
        if let Some(mut f) = self.alive.take() {
            let _ = io::Write::write_all(&mut f, &[DONE]);
        }
    }
}

/// A file in memory with no name anywhere. Through the system call: glibc's
/// wrapper came with 2.27, and the release binaries ask for nothing past 2.17
/// (manylinux2014); the kernel has had it since 3.17.
fn memfd() -> io::Result<File> {
    // SAFETY: a static NUL-terminated name and a flag.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_memfd_create,
            c"resource-tracker-journal".as_ptr(),
            libc::MFD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    let fd = i32::try_from(fd).map_err(|_| io::Error::other("memfd_create: no descriptor"))?;
    // SAFETY: fd was just opened and is owned by nobody else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

fn pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let mut fds = [0; 2];
    // SAFETY: fds has room for the two descriptors pipe2 returns.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: both were just opened and are owned by nobody else.
    Ok(unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) })
}

/// Whether this process was started as a guardian: its argv[0] and the variable
/// both say so.
pub fn is_guardian() -> bool {
    let arg0 = std::env::args_os().next();
    arg0.is_some_and(|a| a == NAME) && std::env::var_os(MARK).is_some_and(|v| v == "1")
}

/// What the journal says, replayed.
#[derive(Default)]
struct Replay {
    header: Option<Header>,
    body: Option<Value>,
    registration: Option<Value>,
    credentials: Option<Value>,
    uploaded: Vec<String>,
    saved_upto: u64,
    kept: Vec<String>,
    finished: bool,
    registering: bool,
    kept_dirs: Vec<PathBuf>,
    rows: Vec<(u64, String)>,
    /// The last `T`: the seq of the batch last put, and its last row's index.
    tried: Option<(u32, u64)>,
}

fn replay(text: &str) -> Replay {
    let mut r = Replay::default();
    // Zeroed bytes are rows already saved; a last line without its newline was
    // cut short by the kill.
    let text = text.replace('\0', "");
    let complete = match text.rfind('\n') {
        Some(i) => &text[..=i],
        None => "",
    };
    for line in complete.lines() {
        let (tag, rest) = line.split_at(line.len().min(1));
        match tag {
            "R" | "J" => {
                let Some((i, row)) = rest.split_once(',') else {
                    continue;
                };
                let row = match tag {
                    "R" => Some(row.to_string()),
                    _ => serde_json::from_str(row).ok(),
                };
                if let (Ok(i), Some(row)) = (i.parse(), row) {
                    r.rows.push((i, row));
                }
            }
            "H" => r.header = serde_json::from_str(rest.trim_start()).ok(),
            "B" => r.body = serde_json::from_str(rest.trim_start()).ok(),
            "S" => r.registration = serde_json::from_str(rest.trim_start()).ok(),
            "C" => r.credentials = serde_json::from_str(rest.trim_start()).ok(),
            "U" | "K" => {
                let mut p = rest.trim_start().splitn(2, ' ');
                let upto = p.next().and_then(|n| n.parse().ok()).unwrap_or(0);
                let what = serde_json::from_str(p.next().unwrap_or_default()).unwrap_or_default();
                r.saved_upto = r.saved_upto.max(upto);
                match tag {
                    "U" => r.uploaded.push(what),
                    _ => r.kept.push(what),
                }
            }
            "T" => {
                let mut p = rest.split_whitespace().map(str::parse::<u64>);
                if let (Some(Ok(seq)), Some(Ok(last))) = (p.next(), p.next()) {
                    r.tried = Some((seq as u32, last));
                }
            }
            "F" => r.finished = true,
            "P" => r.registering = true,
            "D" => {
                if let Ok(d) = serde_json::from_str::<String>(rest.trim_start()) {
                    r.kept_dirs.push(PathBuf::from(d));
                }
            }
            _ => {}
        }
    }
    let upto = r.saved_upto;
    r.rows.retain(|(i, _)| *i > upto);
    // A put whose rows are all saved since is settled.
    if r.tried.is_some_and(|(_, last)| last <= upto) {
        r.tried = None;
    }
    r
}

/// Becomes the invoking user, for good.
fn drop_to(id: &Identity) -> io::Result<()> {
    // SAFETY: plain system calls with valid arguments; the groups slice outlives
    // the call.
    let ok = unsafe {
        libc::setgroups(id.groups.len(), id.groups.as_ptr()) == 0
            && libc::setgid(id.gid) == 0
            && libc::setuid(id.uid) == 0
    };
    match ok {
        true => Ok(()),
        false => Err(io::Error::last_os_error()),
    }
}

fn say(msg: impl std::fmt::Display) {
    crate::warn::say(format_args!("guardian: {msg}"));
}

/// The guardian's life: wait for the tracker's end, and when it died, save its
/// rows and finish its run. Returns the exit code.
pub fn main() -> i32 {
    for s in [libc::SIGINT, libc::SIGHUP, libc::SIGTERM, libc::SIGPIPE] {
        // SAFETY: setting a signal to be ignored. A Ctrl-C or a hang-up reaches the
        // whole process group; the tracker ends on it, and only the pipe tells
        // whether it ended well.
        unsafe { libc::signal(s, libc::SIG_IGN) };
    }
    // SAFETY: a zeroed sigset_t made empty by sigemptyset; nothing is to be
    // blocked (the signals above are ignored, whatever the mask exec brought).
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        libc::sigprocmask(libc::SIG_SETMASK, &set, std::ptr::null_mut());
    }
    // SAFETY: descriptor 1 was set to the journal by the tracker; it is owned by
    // this function alone from here on.
    let journal = unsafe { File::from_raw_fd(1) };
    match journal.metadata() {
        Ok(m) if m.is_file() => {}
        _ => {
            say("started without a journal; this is the tracker's own helper, not a command");
            return 2;
        }
    }
    let first = read_header(&journal);
    let Some(header) = first else {
        say("the journal has no settings; nothing to guard");
        return 2;
    };
    if let Some(id) = &header.run_as {
        if let Err(e) = drop_to(id) {
            say(format_args!("dropping root for uid {}: {e}", id.uid));
            return 1;
        }
    }
    let mut b = [0u8; 1];
    let mut stdin = io::stdin().lock();
    loop {
        match stdin.read(&mut b) {
            Ok(1) if b[0] == DONE => return 0,
            Ok(0) => break,
            Ok(_) => {}
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => break,
        }
    }
    let mut text = Vec::new();
    if let Err(e) = (&journal).read_to_end(&mut text) {
        say(format_args!(
            "the tracker ended without finishing its run, and its journal cannot be read: {e}"
        ));
        return 1;
    }
    let r = replay(&String::from_utf8_lossy(&text));
    // Finished already, or nothing to save and no run to finish (the tracker ended
    // before its first row and registration: a command that could not start).
    if r.finished || (r.rows.is_empty() && r.registration.is_none()) {
        return 0;
    }
    save(header, r)
}

fn read_header(f: &File) -> Option<Header> {
    let mut buf = vec![0u8; 64 << 10];
    let mut n = 0;
    while n < buf.len() {
        match f.read_at(&mut buf[n..], n as u64) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(_) => return None,
        }
        if buf[..n].contains(&b'\n') {
            break;
        }
    }
    let line = buf[..n].split(|b| *b == b'\n').next()?;
    let json = std::str::from_utf8(line).ok()?.strip_prefix("H ")?;
    serde_json::from_str(json).ok()
}

/// Uploads or keeps what the killed tracker had not saved, and finishes the run.
fn save(h: Header, r: Replay) -> i32 {
    let tracker = h.tracker_pid;
    let cfg = Config {
        token: Secret(h.token),
        api_url: h.api_url,
        s3_endpoint: h.s3_endpoint,
        // The rows are in memory already: spilling them to the spool would only
        // copy them.
        memory_limit: h
            .memory_limit
            .max(2 * r.rows.iter().map(|(_, row)| row.len() + 1).sum::<usize>()),
        spool_dir: h.spool_dir,
        timeout: Duration::from_millis(h.timeout_ms.max(100)),
        upload_interval: h.upload_interval,
    };
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            say(format_args!("the tracker (pid {tracker}) ended without finishing its run; starting a runtime to save its rows: {e}"));
            return 1;
        }
    };
    let rows = r.rows.len();
    let external = r.body.as_ref().map(|b| b["external_run_id"].to_string());
    let in_flight = r.registering && r.registration.is_none();
    let kept_dirs = r.kept_dirs;
    let resume = super::upload::Resume {
        body: r.body,
        registration: r.registration,
        credentials: r.credentials,
        uploaded: r.uploaded,
        tried: r
            .tried
            .map(|(seq, last)| (seq, r.rows.iter().filter(|(i, _)| *i <= last).count())),
        rows: r.rows.into_iter().map(|(_, row)| row).collect(),
        temp_dir: h.temp_dir,
    };
    let report = rt.block_on(super::upload::resume(cfg, resume, KILLED_EXIT_CODE));
    rt.shutdown_background();
    let run = report.run_id.as_deref().unwrap_or("(never registered)");
    let fate = match (&report.kept_dir, report.finished) {
        (Some(d), true) => format!(
            "{} rows uploaded, {} kept in {}; run {run} finished as failed",
            report.rows_uploaded,
            report.rows_kept,
            d.display()
        ),
        (Some(d), false) => format!(
            "{} rows uploaded, {} kept in {}; run {run} could not be finished",
            report.rows_uploaded,
            report.rows_kept,
            d.display()
        ),
        (None, true) => format!(
            "{} rows uploaded; run {run} finished as failed",
            report.rows_uploaded
        ),
        (None, false) => format!(
            "run {run} could not be finished: {}",
            report.last_error.as_deref().unwrap_or("no answer")
        ),
    };
    say(format_args!(
        "the tracker (pid {tracker}) ended without finishing its run, with {rows} rows not yet sent: {fate}"
    ));
    if let (true, Some(x)) = (in_flight, external) {
        say(format_args!("the tracker's own registration got no answer before it ended; the server may hold a run with external_run_id {x} that stays unfinished"));
    }
    // Every row of the journal is now in S3, inline or kept by the guardian: the
    // tracker's copies of some in its kept directory would count them twice.
    if report.rows_not_sent == report.rows_kept {
        for d in kept_dirs {
            if let Err(e) = remove_kept(&d) {
                say(format_args!(
                    "{} holds copies of rows saved above; removing it: {e}",
                    d.display()
                ));
            }
        }
    }
    0
}

/// Removes a kept directory of the tracker: its `NNNN.csv.gz` files, then itself
/// (anything else in it stays, and so does the directory).
fn remove_kept(d: &std::path::Path) -> io::Result<()> {
    for e in std::fs::read_dir(d)? {
        let e = e?;
        let name = e.file_name();
        let n = name.to_string_lossy();
        let batch = n
            .strip_suffix(".csv.gz")
            .is_some_and(|s| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit()));
        if batch && e.file_type()?.is_file() {
            std::fs::remove_file(e.path())?;
        }
    }
    std::fs::remove_dir(d)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// What the tracker journals reads back: a row with a line break whole, rows
    /// uploaded gone (zeroed), the rest in order.
    #[test]
    fn journal_round_trip() {
        let file = memfd().unwrap();
        let j = Journal::new(file.try_clone().unwrap(), 0);
        let a = j.row("1,a").unwrap();
        let b = j.row("2,\"x\ny\"").unwrap();
        j.record('S', "{\"run_id\":\"r\"}");
        let c = j.row("3,c").unwrap();
        j.saved('U', b.index, "s3://b/k\n0001", &[a, b]);
        j.row("4,d").unwrap();
        let mut text = Vec::new();
        (&file).read_to_end(&mut text).unwrap();
        assert!(text.starts_with(&[0; 8]), "uploaded rows zeroed");
        let r = replay(&String::from_utf8_lossy(&text));
        let rows: Vec<_> = r.rows.iter().map(|(_, s)| s.as_str()).collect();
        assert_eq!(rows, ["3,c", "4,d"]);
        assert_eq!(r.uploaded, ["s3://b/k\n0001"]);
        assert_eq!((c.index, r.saved_upto), (3, 2));
        // Unzeroed, the row with a line break comes back whole.
        let r = replay("J2,\"2,\\\"x\\ny\\\"\"\n");
        assert_eq!(r.rows, [(2, "2,\"x\ny\"".to_string())]);
    }

    #[test]
    fn replay_skips_saved_rows_and_a_cut_line() {
        let mut j = String::from("H {}\nB {\"a\":1}\n");
        j += "R1,a\nR2,b\n";
        j += "S {\"run_id\":\"r\"}\n";
        j += "U 2 \"s3://b/p/0001.csv.gz\"\n";
        // Row 3 zeroed after an upload whose record was journaled first.
        j += "\0\0\0\0\0";
        j += "R4,d\nJ5,\"e\\nR8,\\u0000x\"\nU 3 \"s3://b/p/0002.csv.gz\"\nR6,f\nD \"/t/k\\nR9,x\"\nR7,cut";
        let r = replay(&j);
        assert_eq!(r.body, Some(serde_json::json!({"a": 1})));
        assert_eq!(r.registration.unwrap()["run_id"], "r");
        assert_eq!(r.uploaded, ["s3://b/p/0001.csv.gz", "s3://b/p/0002.csv.gz"]);
        assert_eq!(r.kept_dirs, [PathBuf::from("/t/k\nR9,x")]);
        assert_eq!(r.saved_upto, 3);
        let rows: Vec<_> = r.rows.iter().map(|(_, s)| s.as_str()).collect();
        assert_eq!(rows, ["d", "e\nR8,\0x", "f"]);
        assert!(!r.finished);
        assert!(replay("H {}\nF\n").finished);
    }
}
