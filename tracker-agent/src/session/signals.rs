//! The command's life cycle around the tracker: forwarded signals, reaped children.

use tokio::sync::mpsc;
use tracker_common::Figures;

use crate::engine::procread;

/// A child the reaper thread collected.
pub struct Reaped {
    pub pid: u32,
    pub status: i32,
    /// Its CPU and tick times (rusage); with `io_read`, its I/O too, read from
    /// its /proc/PID/io while a zombie: its own and its reaped children's, up to
    /// its exit, which rusage does not count.
    pub fig: Figures,
    pub io_read: bool,
    pub maxrss_kib: u64,
}

const FORWARDED: [libc::c_int; 3] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP];

fn forwarded_set() -> libc::sigset_t {
    // SAFETY: sigset_t is plain data initialised by sigemptyset.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for s in FORWARDED {
            libc::sigaddset(&mut set, s);
        }
        set
    }
}

/// Blocks the forwarded signals in this thread and every thread started after it;
/// one thread then takes them with sigwaitinfo, which also tells who sent them.
pub fn block_signals() {
    let set = forwarded_set();
    // SAFETY: valid set, no old mask wanted.
    unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
}

/// A forwarded signal taken within `timeout` (None: waits for one), and whether
/// the terminal sent it.
pub fn wait_signal(timeout: Option<std::time::Duration>) -> Option<(i32, bool)> {
    let set = forwarded_set();
    // SAFETY: siginfo_t is plain data filled by the kernel.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    let sig = match timeout {
        // SAFETY: valid set and out pointer.
        None => unsafe { libc::sigwaitinfo(&set, &mut info) },
        Some(t) => {
            let ts = libc::timespec {
                tv_sec: t.as_secs() as libc::time_t,
                tv_nsec: libc::c_long::from(t.subsec_nanos() as i32),
            };
            // SAFETY: valid set, out pointer and timespec.
            unsafe { libc::sigtimedwait(&set, &mut info, &ts) }
        }
    };
    // SI_KERNEL: sent by the terminal to the whole foreground group, so the
    // child has it already; anything sent with kill(2) must be forwarded.
    (sig > 0).then_some((sig, info.si_code == libc::SI_KERNEL))
}

pub fn spawn_signal_thread(tx: mpsc::UnboundedSender<(i32, bool)>) {
    std::thread::spawn(move || loop {
        if let Some(taken) = wait_signal(None) {
            if tx.send(taken).is_err() {
                return;
            }
        }
    });
}

/// A child that has exited, left a zombie (not reaped); None when there is none
/// to wait for, or on EINTR with `Some(None)`.
fn next_zombie() -> Option<Option<libc::pid_t>> {
    // SAFETY: siginfo_t is plain data filled by the kernel.
    let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
    // SAFETY: a valid out pointer; WNOWAIT leaves the child waitable.
    let rc = unsafe { libc::waitid(libc::P_ALL, 0, &mut info, libc::WEXITED | libc::WNOWAIT) };
    if rc < 0 {
        return match std::io::Error::last_os_error().raw_os_error() {
            Some(libc::EINTR) => Some(None),
            _ => None,
        };
    }
    // SAFETY: si_pid is set by waitid for the child it reports.
    Some(Some(unsafe { info.si_pid() }))
}

/// Reaps the tracker's children as they exit. With `read_io` (the procfs
/// backend, which sees a process's I/O only in /proc) each zombie's
/// /proc/PID/io is read before it is reaped: what it did after the last poll,
/// a job's whole read-back phase in one measured case, is otherwise lost.
pub fn spawn_reaper(tx: mpsc::UnboundedSender<Reaped>, read_io: bool) {
    std::thread::spawn(move || {
        let mut buf = String::new();
        loop {
            let (wanted, io) = if read_io {
                match next_zombie() {
                    Some(Some(pid)) => (pid, procread::io(pid as u32, &mut buf)),
                    Some(None) => continue,
                    None => return,
                }
            } else {
                (-1, None)
            };
            let mut status = 0;
            // SAFETY: rusage is plain data filled by the kernel.
            let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
            // SAFETY: valid out pointers.
            let pid = unsafe { libc::wait4(wanted, &mut status, 0, &mut ru) };
            if pid < 0 {
                match std::io::Error::last_os_error().raw_os_error() {
                    Some(libc::EINTR) => continue,
                    _ => return, // ECHILD: nothing left to wait for
                }
            }
            if !reaped(&tx, pid, status, &ru, io) {
                return;
            }
        }
    });
}

/// Sends one reap; false once nobody listens.
fn reaped(
    tx: &mpsc::UnboundedSender<Reaped>,
    pid: libc::pid_t,
    status: i32,
    ru: &libc::rusage,
    io: Option<Figures>,
) -> bool {
    let ns = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
    let (user_ns, sys_ns) = (ns(ru.ru_utime), ns(ru.ru_stime));
    let r = Reaped {
        pid: pid as u32,
        status,
        fig: Figures {
            cpu_ns: user_ns + sys_ns,
            utime_ns: user_ns,
            stime_ns: sys_ns,
            ..io.unwrap_or_default()
        },
        io_read: io.is_some(),
        maxrss_kib: ru.ru_maxrss.max(0) as u64,
    };
    tx.send(r).is_ok()
}
