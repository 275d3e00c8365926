//! The system's constants every layer reads: clock ticks and the page size; the
//! monotonic clock and a process's CPU clock (and, for tests, the thread's); the open-file limit; whether
//! /proc shows this process's own PID namespace; and whether its capabilities may load BPF.

/// `sysconf(name)`, or `default` where the system does not say.
fn sysconf(name: libc::c_int, default: u64) -> u64 {
    // SAFETY: sysconf has no preconditions.
    let v = unsafe { libc::sysconf(name) };
    u64::try_from(v).ok().filter(|&v| v > 0).unwrap_or(default)
}

/// Whether this process's effective capabilities let it load the BPF programs:
/// CAP_SYS_ADMIN, or CAP_BPF with CAP_PERFMON (`CapEff` in /proc/self/status).
pub fn may_load_bpf() -> bool {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let eff = status
        .lines()
        .find_map(|l| l.strip_prefix("CapEff:"))
        .and_then(|v| u64::from_str_radix(v.trim(), 16).ok())
        .unwrap_or(0);
    const CAP_SYS_ADMIN: u64 = 21;
    const CAP_PERFMON: u64 = 38;
    const CAP_BPF: u64 = 39;
    let has = |c: u64| eff & (1 << c) != 0;
    has(CAP_SYS_ADMIN) || (has(CAP_BPF) && has(CAP_PERFMON))
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
    clock_ns(libc::CLOCK_MONOTONIC)
}

/// The calling thread's CPU time so far, ns: what a test spins on to spend a
/// given CPU time whatever the machine's load or steal.
#[cfg(test)]
pub fn thread_cpu_ns() -> u64 {
    clock_ns(libc::CLOCK_THREAD_CPUTIME_ID)
}

/// Clock `id` now, ns, for the clocks every thread may read.
fn clock_ns(id: libc::clockid_t) -> u64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer for the call.
    unsafe { libc::clock_gettime(id, &mut ts) };
    ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64
}

/// The CPU time of process `pid` so far, ns: every thread's run time by the
/// scheduler's clock, live threads' and exited ones', as far as the kernel has
/// added it up (at the process's last switch or tick). Read through its process
/// CPU clock, which the kernel lets any process read, as it does
/// /proc/PID/schedstat: a system call without a file, a seq_file or formatting
/// (the schedstat read was the largest part of an attached procfs sample,
/// docs/cost.md). None once the pid names no process.
pub fn process_cpu_ns(pid: u32) -> Option<u64> {
    // The kernel's MAKE_PROCESS_CPUCLOCK(pid, CPUCLOCK_SCHED): !pid above three
    // bits that say "process" and "scheduler's clock" (2).
    let pid = libc::clockid_t::try_from(pid).ok()?;
    let id = (!pid << 3) | 2;
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out-pointer for the call; an id that names no process is
    // an error (EINVAL), not undefined behaviour.
    let rc = unsafe { libc::clock_gettime(id, &mut ts) };
    (rc == 0).then(|| ts.tv_sec as u64 * 1_000_000_000 + ts.tv_nsec as u64)
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

/// Hands back the pages of the program's own file that this process alone maps
/// (`MADV_PAGEOUT`): after start-up they are mostly code and data it ran once
/// (arguments, BTF, the BPF loader, ~3.5 MiB of the node agent's RSS), and the
/// pages a loop still uses fault back in at its next pass. Pages another process
/// maps are left alone by the kernel. Returns the bytes advised; 0 where the
/// kernel (before 5.4) or /proc cannot do it.
pub fn page_out_own_file() -> u64 {
    let (Ok(exe), Ok(maps)) = (
        std::fs::read_link("/proc/self/exe"),
        std::fs::read_to_string("/proc/self/maps"),
    ) else {
        return 0;
    };
    let Some(exe) = exe.to_str() else {
        return 0;
    };
    let mut advised = 0;
    for line in maps.lines() {
        // start-end perms offset dev inode path
        let mut f = line.splitn(6, ' ');
        let (Some(range), Some(perms)) = (f.next(), f.next()) else {
            continue;
        };
        let path = f.nth(3).map(str::trim_start);
        // Written pages are the process's own copies: not the file's.
        if path != Some(exe) || perms.contains('w') {
            continue;
        }
        let Some((a, b)) = range.split_once('-') else {
            continue;
        };
        let (Ok(a), Ok(b)) = (usize::from_str_radix(a, 16), usize::from_str_radix(b, 16)) else {
            continue;
        };
        // SAFETY: a range the kernel lists as this process's mapping of a file it
        // does not write; paging it out changes no content (it is read again from
        // the file when touched), only what is resident.
        if b > a && unsafe { libc::madvise(a as *mut libc::c_void, b - a, libc::MADV_PAGEOUT) } == 0
        {
            advised += (b - a) as u64;
        }
    }
    advised
}

/// Why /proc does not show this process's PID namespace, if it does not: a
/// /proc mounted for another namespace (the host's, seen from `unshare --pid`
/// without `--mount-proc`) names other processes by the numbers this process
/// knows, so every pid the tracker would read there is another process.
/// `/proc/self` is this process as /proc's namespace numbers it.
pub fn proc_of_another_pid_ns() -> Option<String> {
    let own = std::process::id();
    match std::fs::read_link("/proc/self") {
        Ok(p) => match p.to_str().and_then(|s| s.parse::<u32>().ok()) {
            Some(n) if n == own => None,
            Some(n) => Some(format!(
                "/proc shows another PID namespace than the tracker's (this process is pid {own} here and pid {n} in /proc)"
            )),
            None => Some(format!("/proc/self is {p:?}, not a pid")),
        },
        Err(e) => Some(format!(
            "/proc/self cannot be read ({e}): /proc is missing or shows another PID namespace than the tracker's"
        )),
    }
}

/// A PID namespace's inode that is the host's (`PROC_PID_INIT_INO`).
pub const INIT_PID_NS_INO: u64 = 0xEFFF_FFFC;

/// This process's PID namespace (its inode); None where it cannot be read.
pub fn pid_ns() -> Option<u64> {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata("/proc/self/ns/pid").ok().map(|m| m.ino())
}

#[cfg(test)]
mod tests {
    /// The test runs where /proc is its own namespace's.
    #[test]
    fn proc_is_this_namespaces_here() {
        assert_eq!(super::proc_of_another_pid_ns(), None);
    }
}
