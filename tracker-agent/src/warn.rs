//! Warnings that would otherwise repeat every sample (a /proc file missing on an
//! unusual kernel, say) are printed once per key for the whole run.

use std::{
    collections::HashSet,
    io::Write,
    sync::{
        atomic::{AtomicBool, Ordering},
        Mutex,
    },
};

static STDERR_CLOSED: AtomicBool = AtomicBool::new(false);

/// Run by the loader before `main`, hence before Rust's runtime reopens a closed
/// descriptor 0, 1 or 2 on /dev/null: after that, a closed stderr (`2>&-`) could
/// not be told from `2>/dev/null`.
#[used]
#[link_section = ".init_array"]
static NOTE_CLOSED_STDERR: extern "C" fn() = note_closed_stderr;

extern "C" fn note_closed_stderr() {
    // SAFETY: F_GETFD only asks whether descriptor 2 is open.
    if unsafe { libc::fcntl(2, libc::F_GETFD) } == -1 {
        STDERR_CLOSED.store(true, Ordering::Relaxed);
    }
}

/// Whether the tracker was started with its stderr closed.
pub fn stderr_was_closed() -> bool {
    STDERR_CLOSED.load(Ordering::Relaxed)
}

/// One line to the system log, for what has no other place to go (a closed
/// stderr); nothing when there is no syslog.
pub fn to_syslog(msg: &str) {
    let Ok(c) = std::ffi::CString::new(escaped(msg)) else {
        return;
    };
    // SAFETY: static NUL-terminated identity and format strings; `c` outlives the
    // call. LOG_NDELAY is not asked for: nothing is opened unless a line is sent.
    unsafe {
        libc::openlog(c"resource-tracker".as_ptr(), libc::LOG_PID, libc::LOG_USER);
        libc::syslog(libc::LOG_WARNING, c"%s".as_ptr(), c.as_ptr());
        libc::closelog();
    }
}

/// An error with its causes on one line ("error sending request: connection
/// refused"), each cause said once.
pub fn error_chain(e: &dyn std::error::Error) -> String {
    let mut s = e.to_string();
    let mut src = e.source();
    while let Some(c) = src {
        let t = c.to_string();
        if !s.contains(&t) {
            s.push_str(": ");
            s.push_str(&t);
        }
        src = c.source();
    }
    s
}

/// One line to the user on stderr; where stderr cannot take it (full, closed,
/// a reader gone), to the system log instead, so that a line saying where the
/// samples went is never lost with the stderr that failed. Never ends the run
/// (`eprintln!` would panic).
pub fn say(msg: impl std::fmt::Display) {
    let line = line(msg);
    let mut err = std::io::stderr().lock();
    if err
        .write_all(line.as_bytes())
        .and_then(|()| err.flush())
        .is_err()
    {
        to_syslog(line.trim_end());
    }
}

/// The line `say` writes: every message reaches the terminal escaped, whatever
/// its caller did, so that no name or value from outside can clear the screen or
/// forge a line.
fn line(msg: impl std::fmt::Display) -> String {
    format!("resource-tracker: {}\n", escaped(&msg.to_string()))
}

static SEEN: Mutex<Option<HashSet<String>>> = Mutex::new(None);

/// Logs `msg` as a warning the first time `key` is seen; returns whether it did.
pub fn warn_once(key: &str, msg: impl std::fmt::Display) -> bool {
    let mut g = match SEEN.lock() {
        Ok(g) => g,
        Err(p) => p.into_inner(),
    };
    let seen = g.get_or_insert_with(HashSet::new);
    if seen.contains(key) {
        return false;
    }
    seen.insert(key.to_string());
    log::warn!("{msg}");
    true
}

/// Text from outside (a path, a value) fit for one line: control characters are
/// shown escaped (`\n`, `\u{1b}`), so a name cannot split or forge a line.
pub fn escaped(s: &str) -> String {
    if !s.chars().any(char::is_control) {
        return s.to_string();
    }
    s.chars()
        .map(|c| match c {
            c if c.is_control() => c.escape_default().to_string(),
            c => c.to_string(),
        })
        .collect()
}

#[cfg(test)]
mod tests {
    #[test]
    fn escaped_keeps_one_line() {
        use super::escaped;
        assert_eq!(escaped("plain/path"), "plain/path");
        assert_eq!(escaped("a\nb\x1b[31m"), "a\\nb\\u{1b}[31m");
    }

    #[test]
    fn a_said_line_is_one_escaped_line_whatever_its_caller_gave() {
        assert_eq!(
            super::line(format_args!("host {}", "x\x1b[2J\x07\ny")),
            "resource-tracker: host x\\u{1b}[2J\\u{7}\\ny\n"
        );
        // What a caller escaped already is left as it is.
        let once = super::escaped("a\x1bb");
        assert_eq!(super::line(&once), format!("resource-tracker: {once}\n"));
    }

    #[test]
    fn once_per_key() {
        assert!(super::warn_once("t.a", "a"));
        assert!(!super::warn_once("t.a", "a"));
        assert!(super::warn_once("t.b", "b"));
    }
}
