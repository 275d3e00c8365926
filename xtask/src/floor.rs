//! The floor under a host sample: a loop that makes the kernel calls every host
//! sample needs and does nothing else (no parsing, no serialising), timed by the
//! scheduler's clock like the tracker. On a VM whose idle vCPUs come back with cold
//! caches, what a sample costs follows its kernel entries more than its
//! instructions (docs/cost.md), and this row says how much of that a machine
//! charges before any of the tracker's own work.

use std::{
    fs::File,
    io::Write as _,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    os::unix::fs::{FileExt as _, OpenOptionsExt as _},
    time::Duration,
};

use anyhow::{bail, Context as _};

/// The files a host sample reads each time, kept open as the tracker keeps them.
const FILES: [&str; 4] = [
    "/proc/stat",
    "/proc/meminfo",
    "/proc/diskstats",
    "/proc/self/net/dev",
];

/// What the calling thread has run, in ns.
fn thread_ns() -> anyhow::Result<u64> {
    const PATH: &str = "/proc/thread-self/schedstat";
    crate::measure::schedstat_ns(std::path::Path::new(PATH))
        .with_context(|| format!("no run time in {PATH}"))
}

/// `sys` returned -1: the error, named.
fn check(rc: i32, what: &str) -> anyhow::Result<()> {
    if rc < 0 {
        bail!("{what}: {}", std::io::Error::last_os_error());
    }
    Ok(())
}

/// ms of CPU per sample of the floor loop at `period`, over `samples` samples after
/// two that warm it up. Runs on a thread of its own, so that only the loop is timed.
pub fn per_sample_ms(period: Duration, samples: u32) -> anyhow::Result<f64> {
    std::thread::spawn(move || run(period, samples))
        .join()
        .map_err(|_| anyhow::anyhow!("the floor loop's thread panicked"))?
}

fn run(period: Duration, samples: u32) -> anyhow::Result<f64> {
    let files = FILES
        .iter()
        .map(|p| File::open(p).with_context(|| format!("opening {p}")))
        .collect::<anyhow::Result<Vec<_>>>()?;
    let out_path =
        std::env::temp_dir().join(format!("rt-bench-floor-{}.jsonl", std::process::id()));
    let mut out = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(&out_path)
        .with_context(|| format!("creating {}", out_path.display()))?;
    let ms = time_loop(files, &mut out, period, samples);
    let _ = std::fs::remove_file(&out_path);
    ms
}

fn time_loop(
    files: Vec<File>,
    out: &mut File,
    period: Duration,
    samples: u32,
) -> anyhow::Result<f64> {
    // SAFETY: plain system calls with valid arguments; each fd is owned at once.
    let (timer, ep) = unsafe {
        let t = libc::timerfd_create(libc::CLOCK_MONOTONIC, libc::TFD_CLOEXEC);
        check(t, "timerfd_create")?;
        let timer = OwnedFd::from_raw_fd(t);
        let e = libc::epoll_create1(libc::EPOLL_CLOEXEC);
        check(e, "epoll_create1")?;
        (timer, OwnedFd::from_raw_fd(e))
    };
    let ts = libc::timespec {
        tv_sec: period.as_secs() as libc::time_t,
        tv_nsec: period.subsec_nanos() as libc::c_long,
    };
    let spec = libc::itimerspec {
        it_interval: ts,
        it_value: ts,
    };
    let mut ev = libc::epoll_event {
        events: libc::EPOLLIN as u32,
        u64: 0,
    };
    // SAFETY: valid fds and pointers to initialised structs.
    unsafe {
        check(
            libc::timerfd_settime(timer.as_raw_fd(), 0, &spec, std::ptr::null_mut()),
            "timerfd_settime",
        )?;
        check(
            libc::epoll_ctl(
                ep.as_raw_fd(),
                libc::EPOLL_CTL_ADD,
                timer.as_raw_fd(),
                &mut ev,
            ),
            "epoll_ctl",
        )?;
    }
    // A sample line is ~3 KB of JSON.
    let line = [b'x'; 3200];
    let mut buf = vec![0u8; 64 * 1024];
    let root = c"/";
    let mut start = 0;
    for i in 0..samples + 2 {
        if i == 2 {
            start = thread_ns()?;
        }
        let mut got = libc::epoll_event { events: 0, u64: 0 };
        let mut ticks = [0u8; 8];
        // SAFETY: valid fds and buffers of the sizes given.
        unsafe {
            check(
                libc::epoll_wait(ep.as_raw_fd(), &mut got, 1, -1),
                "epoll_wait",
            )?;
            check(
                libc::read(timer.as_raw_fd(), ticks.as_mut_ptr().cast(), 8) as i32,
                "reading the timer",
            )?;
        }
        for f in &files {
            f.read_at(&mut buf, 0).context("pread")?;
        }
        let mut st = std::mem::MaybeUninit::<libc::statfs>::uninit();
        // SAFETY: a valid path and a buffer for one statfs.
        check(
            unsafe { libc::statfs(root.as_ptr(), st.as_mut_ptr()) },
            "statfs /",
        )?;
        out.write_all(&line).context("writing the line")?;
    }
    let ns = thread_ns()? - start;
    Ok(ns as f64 / 1e6 / f64::from(samples))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_floor_loop_times_its_own_samples() {
        let ms = per_sample_ms(Duration::from_millis(20), 5).unwrap();
        // Each sample reads four /proc files, makes a statfs and a 3 KB write: more
        // than a microsecond of CPU, far less than the 20 ms it waits between.
        assert!(ms > 0.001 && ms < 20.0, "{ms} ms per sample");
    }
}
