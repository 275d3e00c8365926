//! Telling the process that started the tracker that tracking is in place
//! (`TRACKER_READY_FD`, set by the Python package): one line on a pipe once the
//! tree has been read for the first time (the eBPF programs attached and the
//! members listed, or procfs's first reading), then the pipe is closed. Its
//! `start()` returns then, so that nothing the job does after it is missed; were
//! the tracker to die first, the reader sees the pipe close without the line.

use std::{
    fs::File,
    io::Write,
    os::fd::{FromRawFd, RawFd},
};

/// The write end of the starter's pipe, taken over at the start of the session.
#[derive(Debug)]
pub struct Ready(File);

impl Ready {
    /// Takes over `fd` (`TRACKER_READY_FD`), as `claim_pipe` does, its writes
    /// made not to wait: a starter that filled the pipe and never reads it
    /// cannot hold the tracker.
    pub fn claim(fd: RawFd) -> Result<Ready, String> {
        let pipe = claim_pipe("TRACKER_READY_FD", fd)?;
        nonblocking(&pipe, "TRACKER_READY_FD")?;
        Ok(Ready(pipe))
    }

    /// Says that tracking is in place and closes the pipe. A starter that went
    /// away (EPIPE: Rust ignores SIGPIPE) or left its pipe full (EAGAIN)
    /// changes nothing for the run.
    pub fn signal(mut self) {
        if let Err(e) = self.0.write_all(b"ready\n") {
            log::debug!("TRACKER_READY_FD: the starter did not take the ready line: {e}");
        }
    }
}

/// Makes the I/O on a claimed pipe not wait (`var` names it in the error).
pub fn nonblocking(pipe: &File, var: &str) -> Result<(), String> {
    use std::os::fd::AsRawFd as _;
    let fd = pipe.as_raw_fd();
    // SAFETY: fcntl on a claimed, open fd reads its status flags.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFL) };
    // SAFETY: as above; only O_NONBLOCK is added.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFL, flags | libc::O_NONBLOCK) } < 0 {
        return Err(format!(
            "{var}={fd}: it cannot be made non-blocking ({})",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// Takes over the starter's pipe `fd`, named by the variable `var`: it must be
/// open and a pipe or a socket (never a file the tracker could write into or read
/// from by mistake), and is closed on exec from here on, so that the command and
/// the guardian do not hold the starter's pipe open.
pub fn claim_pipe(var: &str, fd: RawFd) -> Result<File, String> {
    let what = format!("{var}={fd}");
    if fd <= 2 {
        return Err(format!(
            "{what}: fd {fd} is standard input, output or error, not a pipe of its own"
        ));
    }
    // SAFETY: `stat` is plain integers, for which all zeroes is a value.
    let mut st: libc::stat = unsafe { std::mem::zeroed() };
    // SAFETY: fstat only writes into `st`, a valid out pointer; a closed fd is EBADF.
    if unsafe { libc::fstat(fd, &mut st) } != 0 {
        return Err(format!(
            "{what}: fd {fd} is not open ({})",
            std::io::Error::last_os_error()
        ));
    }
    let kind = st.st_mode & libc::S_IFMT;
    if kind != libc::S_IFIFO && kind != libc::S_IFSOCK {
        return Err(format!(
            "{what}: fd {fd} is not a pipe or a socket (mode {:o})",
            st.st_mode
        ));
    }
    // SAFETY: fcntl on an fd just checked open reads its flags.
    let flags = unsafe { libc::fcntl(fd, libc::F_GETFD) };
    // SAFETY: as above; only the close-on-exec flag is added.
    if flags < 0 || unsafe { libc::fcntl(fd, libc::F_SETFD, flags | libc::FD_CLOEXEC) } < 0 {
        return Err(format!(
            "{what}: fd {fd} cannot be made close-on-exec ({})",
            std::io::Error::last_os_error()
        ));
    }
    // SAFETY: the fd is open, inherited for this purpose and owned by nothing
    // else in this process (the settings only parsed its number).
    Ok(unsafe { File::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use std::{io::Read, os::fd::IntoRawFd};

    use super::Ready;

    fn pipe() -> (std::fs::File, i32) {
        let mut fds = [0; 2];
        // Close-on-exec from the start: a child another test spawns meanwhile must
        // not hold the write end open.
        // SAFETY: fds is a valid array of two.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: the read end was just made and is owned here.
        (
            unsafe { std::os::fd::FromRawFd::from_raw_fd(fds[0]) },
            fds[1],
        )
    }

    #[test]
    fn a_pipe_gets_one_line_then_its_end() {
        let (mut r, w) = pipe();
        // As inherited: without the flag, which the claim sets.
        // SAFETY: F_SETFD on an open fd only changes its flags.
        assert_eq!(unsafe { libc::fcntl(w, libc::F_SETFD, 0) }, 0);
        let ready = Ready::claim(w).expect("a pipe is claimed");
        // SAFETY: F_GETFD reads the flags of an open fd.
        let flags = unsafe { libc::fcntl(w, libc::F_GETFD) };
        assert_eq!(flags & libc::FD_CLOEXEC, libc::FD_CLOEXEC);
        ready.signal();
        let mut got = String::new();
        r.read_to_string(&mut got).expect("read to the end");
        assert_eq!(got, "ready\n");
    }

    #[test]
    fn what_is_not_a_pipe_is_refused_by_name() {
        assert!(Ready::claim(1).unwrap_err().contains("standard"));
        let file = tempfile_fd();
        let e = Ready::claim(file).unwrap_err();
        assert!(e.contains(&format!("TRACKER_READY_FD={file}")), "{e}");
        assert!(e.contains("not a pipe"), "{e}");
        // SAFETY: the file's fd is ours; closed once.
        unsafe { libc::close(file) };
        // A number far above anything open.
        assert!(Ready::claim(1_000_000).unwrap_err().contains("not open"));
        // A starter that went away: no panic, no error.
        let (r, w) = pipe();
        drop(r);
        Ready::claim(w).expect("a pipe").signal();
    }

    /// A starter that filled its pipe and never reads it: the line is dropped
    /// at once, the tracker not held.
    #[test]
    fn a_full_pipe_does_not_hold_the_tracker() {
        let (r, w) = pipe();
        // Fill it through a non-blocking write end.
        // SAFETY: F_SETFL on an open fd only changes its flags.
        assert_eq!(
            unsafe { libc::fcntl(w, libc::F_SETFL, libc::O_NONBLOCK) },
            0
        );
        let chunk = [0u8; 4096];
        // SAFETY: writes from a valid buffer to an open fd.
        while unsafe { libc::write(w, chunk.as_ptr().cast(), chunk.len()) } > 0 {}
        // As inherited: blocking again.
        // SAFETY: as above.
        assert_eq!(unsafe { libc::fcntl(w, libc::F_SETFL, 0) }, 0);
        let ready = Ready::claim(w).expect("a pipe");
        let (tx, rx) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            ready.signal();
            let _ = tx.send(());
        });
        assert!(
            rx.recv_timeout(std::time::Duration::from_secs(2)).is_ok(),
            "the ready line waited on a full pipe"
        );
        drop(r);
    }

    fn tempfile_fd() -> i32 {
        let p = std::env::temp_dir().join(format!("ready-{}", std::process::id()));
        let f = std::fs::File::create(&p).expect("a temporary file");
        let _ = std::fs::remove_file(&p);
        f.into_raw_fd()
    }
}
