//! What an attached root tells of itself (`TRACKER_ROOT_CHILDREN_FD`, set by the
//! Python package when it tracks its own interpreter): its reaped children's
//! account as it reads it itself, `getrusage(RUSAGE_CHILDREN)`: a line of user +
//! system time in nanoseconds, then optionally a space and `ru_maxrss` in KiB,
//! written before it starts the tracker and again before it asks it to stop.
//!
//! /proc/PID/stat gives another process's `cutime` and `cstime` in whole clock
//! ticks, each floored, so a job whose processes all end between two samples
//! (their CPU reaches the tracker only through the root's account) is off by up
//! to two ticks at each end: 20 ms on a 0.7 s job at USER_HZ 100. The root
//! itself reads the same account to the microsecond. And no file gives the
//! largest RSS of another process's reaped children: a child that peaks and
//! exits between two samples takes its high-water mark with it, except from its
//! parent's own `ru_maxrss`. Both lines are read while the root waits for the
//! tracker (in `start()` and `stop()`), so nothing is reaped between its
//! reading and the tracker's.

use std::{
    fs::File,
    io::{ErrorKind, Read},
    os::fd::RawFd,
};

use super::ready::{claim_pipe, nonblocking};

/// The most of the root's writing held or read at one time (bytes).
const MAX_HELD: usize = 4096;

/// One line of the root's: its reaped children's CPU (ns) and largest RSS (KiB).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Children {
    pub cpu_ns: u64,
    pub maxrss_kib: Option<u64>,
}

impl Children {
    fn parse(line: &str) -> Option<Children> {
        let mut it = line.split_ascii_whitespace();
        let cpu_ns = it.next()?.parse().ok()?;
        let maxrss_kib = match it.next() {
            Some(v) => Some(v.parse().ok()?),
            None => None,
        };
        it.next()
            .is_none()
            .then_some(Children { cpu_ns, maxrss_kib })
    }
}

/// The read end of the root's pipe, taken over at the start of the session.
#[derive(Debug)]
pub struct Told {
    pipe: File,
    /// A line not yet ended.
    partial: Vec<u8>,
    /// A line was not a number: said once.
    said: bool,
}

impl Told {
    /// Takes over `fd` (as `claim_pipe` does) and makes its reads not wait.
    pub fn claim(fd: RawFd) -> Result<Told, String> {
        let pipe = claim_pipe("TRACKER_ROOT_CHILDREN_FD", fd)?;
        nonblocking(&pipe, "TRACKER_ROOT_CHILDREN_FD")?;
        Ok(Told {
            pipe,
            partial: Vec::new(),
            said: false,
        })
    }

    /// The last whole line written since the last call; None when none was. A
    /// line that is not one is said once and left out: the tracker then keeps
    /// to what /proc gives.
    pub fn take(&mut self) -> Option<Children> {
        let mut buf = [0u8; 256];
        // Two lines of the root's are under a hundred bytes: a writer that sends
        // more (or never ends a line) is read no further and held no longer.
        while self.partial.len() < MAX_HELD {
            match self.pipe.read(&mut buf) {
                Ok(0) => break,
                Ok(n) => self.partial.extend_from_slice(&buf[..n]),
                Err(e) if e.kind() == ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break,
                Err(e) => {
                    log::debug!("TRACKER_ROOT_CHILDREN_FD: {e}");
                    break;
                }
            }
        }
        let Some(end) = self
            .partial
            .iter()
            .rposition(|&b| b == b'\n')
            .map(|e| e + 1)
        else {
            if self.partial.len() >= MAX_HELD {
                self.partial.clear();
            }
            return None;
        };
        let lines: Vec<u8> = self.partial.drain(..end).collect();
        let mut last = None;
        for line in lines.split(|&b| b == b'\n').filter(|l| !l.is_empty()) {
            match std::str::from_utf8(line).ok().and_then(Children::parse) {
                Some(c) => last = Some(c),
                None if !self.said => {
                    self.said = true;
                    log::warn!(
                        "TRACKER_ROOT_CHILDREN_FD: '{}' is not nanoseconds and optionally KiB; the root's children's account is taken from /proc alone",
                        crate::warn::escaped(&String::from_utf8_lossy(line))
                    );
                }
                None => {}
            }
        }
        last
    }
}

#[cfg(test)]
mod tests {
    use std::{io::Write, os::fd::FromRawFd};

    use super::{Children, Told};

    fn cpu(ns: u64) -> Option<Children> {
        Some(Children {
            cpu_ns: ns,
            maxrss_kib: None,
        })
    }

    fn pipe() -> (std::fs::File, i32) {
        let mut fds = [0; 2];
        // SAFETY: fds is a valid array of two.
        assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
        // SAFETY: the write end was just made and is owned here.
        (unsafe { std::fs::File::from_raw_fd(fds[1]) }, fds[0])
    }

    #[test]
    fn the_last_whole_line_is_taken_and_a_bad_one_left_out() {
        let (mut w, r) = pipe();
        let mut told = Told::claim(r).expect("a pipe is claimed");
        // Nothing written: no value, and no wait.
        assert_eq!(told.take(), None);
        w.write_all(b"1200000\n").unwrap();
        assert_eq!(told.take(), cpu(1_200_000));
        assert_eq!(told.take(), None);
        // A line in two writes counts once whole; the last of several counts.
        w.write_all(b"15\n20").unwrap();
        assert_eq!(told.take(), cpu(15));
        w.write_all(b"00\nten\n1 2 3\n").unwrap();
        assert_eq!(told.take(), cpu(2000));
        // The writer gone: what it wrote last stands, then nothing.
        w.write_all(b"3000 524288\n").unwrap();
        drop(w);
        assert_eq!(
            told.take(),
            Some(Children {
                cpu_ns: 3000,
                maxrss_kib: Some(524_288)
            })
        );
        assert_eq!(told.take(), None);
    }

    /// A writer that never ends a line, or sends without end, is read up to
    /// MAX_HELD at a time and never held past it.
    #[test]
    fn endless_writing_is_bounded() {
        let (mut w, r) = pipe();
        let mut told = Told::claim(r).expect("a pipe is claimed");
        w.write_all(&[b'7'; 20_000]).unwrap();
        for _ in 0..6 {
            assert_eq!(told.take(), None);
            assert!(told.partial.len() <= super::MAX_HELD);
        }
        w.write_all(b"\n42\n").unwrap();
        assert_eq!(told.take(), cpu(42));
    }

    #[test]
    fn what_is_not_a_pipe_is_refused_by_name() {
        let e = Told::claim(2).unwrap_err();
        assert!(e.contains("TRACKER_ROOT_CHILDREN_FD=2"), "{e}");
        assert!(Told::claim(1_000_000).unwrap_err().contains("not open"));
    }
}
