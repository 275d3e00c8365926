//! The system's constants every layer reads: clock ticks and the page size.

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
