//! The system's constants every layer reads: clock ticks and the page size; the
//! monotonic clock; and the open-file limit.

/// `sysconf(name)`, or `default` where the system does not say.
fn sysconf(name: libc::c_int, default: u64) -> u64 {
    // SAFETY: sysconf has no preconditions.
    let v = unsafe { libc::sysconf(name) };
    u64::try_from(v).ok().filter(|&v| v > 0).unwrap_or(default)
}

/// Clock ticks per second for /proc/PID/stat times.
pub fn clk_tck() -> u64 {
    sysconf(libc::_SC_CLK_TCK, 100)
}

/// Bytes per page.
pub fn page_size() -> u64 {
    sysconf(libc::_SC_PAGESIZE, 4096)
}

/// CLOCK_MONOTONIC now, ns: the clock of the kernel's `bpf_ktime_get_ns` and of
/// timerfd deadlines (an `Instant` reads it too, but keeps its value opaque).
pub fn monotonic_ns() -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer for the call.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// Raises this process's soft limit of open files to its hard limit (at most
/// 2^20) and returns the soft limit now in force (1024 where it cannot be read).
pub fn raise_open_files() -> u64 {
    let mut l = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: a valid out-pointer for the call.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut l) } != 0 {
        return 1024;
    }
    let want = l.rlim_max.min(1 << 20);
    if want > l.rlim_cur {
        let new = libc::rlimit {
            rlim_cur: want,
            rlim_max: l.rlim_max,
        };
        // SAFETY: a valid pointer to an initialised rlimit.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &new) } == 0 {
            return want;
        }
    }
    l.rlim_cur
}
