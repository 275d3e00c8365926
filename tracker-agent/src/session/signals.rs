//! The command's life cycle around the tracker: forwarded signals, reaped children.

use tokio::sync::mpsc;

/// A child the reaper thread collected.
pub struct Reaped {
    pub pid: u32,
    pub status: i32,
    pub user_ns: u64,
    pub sys_ns: u64,
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

pub fn spawn_reaper(tx: mpsc::UnboundedSender<Reaped>) {
    std::thread::spawn(move || loop {
        let mut status = 0;
        // SAFETY: rusage is plain data filled by the kernel.
        let mut ru: libc::rusage = unsafe { std::mem::zeroed() };
        let pid = unsafe { libc::wait4(-1, &mut status, 0, &mut ru) };
        if pid < 0 {
            match std::io::Error::last_os_error().raw_os_error() {
                Some(libc::EINTR) => continue,
                _ => return, // ECHILD: nothing left to wait for
            }
        }
        let ns = |t: libc::timeval| t.tv_sec as u64 * 1_000_000_000 + t.tv_usec as u64 * 1000;
        let r = Reaped {
            pid: pid as u32,
            status,
            user_ns: ns(ru.ru_utime),
            sys_ns: ns(ru.ru_stime),
            maxrss_kib: ru.ru_maxrss.max(0) as u64,
        };
        if tx.send(r).is_err() {
            return;
        }
    });
}
