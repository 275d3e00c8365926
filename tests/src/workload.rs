//! Workload generator for the end-to-end tests and the benchmarks. Each mode prints
//! one JSON line on stdout saying exactly what it did (processes forked, …), so tests
//! compare the tracker with the workload's own count and the kernel's accounting.
//!
//! Modes:
//!   spin US                         busy-loop for US microseconds of wall time
//!   swarm N SPIN_US PAR fork|exec   N children, PAR at a time, each spinning SPIN_US
//!   burner THREADS MS               THREADS threads spinning MS milliseconds each
//!   orphans N MS                    N grandchildren orphaned (parent exits at once),
//!                                   each spinning MS ms; waits for them via a pipe
//!   tree DEPTH WIDTH SPIN_US        a full tree of processes, each spinning SPIN_US
//!   incgroup DIR [--pre F] -- CMD   join cgroup DIR (v1 or v2), then exec CMD; --pre
//!                                   writes the CPU ns used before joining to F
//!   pingpong ROUNDS                 two processes on CPU 0 bouncing a byte over pipes
//!   forkstorm N                     N fork+exec of /bin/true, one at a time
//!   sleepers N SECS                 N idle children sleeping SECS

use std::{
    ffi::CString,
    time::{Duration, Instant},
};

static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

/// Prints the mode's JSON line with its own wall time, which the benchmarks compare.
fn report(fields: String) {
    let secs = START.get().map_or(0.0, |s| s.elapsed().as_secs_f64());
    println!("{{{fields},\"elapsed_secs\":{secs:.6}}}");
}

fn spin(us: u64) {
    let end = Instant::now() + Duration::from_micros(us);
    let mut x = 0u64;
    while Instant::now() < end {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        std::hint::black_box(x);
    }
}

fn die(msg: &str) -> ! {
    eprintln!("workload: {msg}");
    std::process::exit(2)
}

fn arg<T: std::str::FromStr>(args: &[String], i: usize, name: &str) -> T {
    args.get(i)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| die(&format!("missing or bad {name}")))
}

fn fork() -> i32 {
    // SAFETY: the children only spin, exec or _exit.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        die(&format!("fork: {}", std::io::Error::last_os_error()));
    }
    pid
}

fn wait_one() -> Option<i32> {
    let mut st = 0;
    // SAFETY: plain wait.
    let r = unsafe { libc::waitpid(-1, &mut st, 0) };
    (r > 0).then_some(st)
}

fn self_exe() -> CString {
    let p = std::fs::read_link("/proc/self/exe")
        .unwrap_or_else(|e| die(&format!("/proc/self/exe: {e}")));
    CString::new(p.to_string_lossy().as_bytes()).unwrap_or_else(|_| die("exe path"))
}

fn exec(argv: &[CString]) -> ! {
    let mut p: Vec<*const libc::c_char> = argv.iter().map(|c| c.as_ptr()).collect();
    p.push(std::ptr::null());
    // SAFETY: NUL-terminated argv of valid C strings.
    unsafe {
        libc::execv(p[0], p.as_ptr());
        libc::_exit(127)
    }
}

fn swarm(n: u64, spin_us: u64, par: u64, mode: &str) {
    let exe = self_exe();
    let spin_arg = CString::new(spin_us.to_string()).unwrap_or_default();
    let (mut running, mut forked) = (0u64, 0u64);
    while forked < n {
        while running < par && forked < n {
            if fork() == 0 {
                if mode == "exec" {
                    exec(&[
                        exe.clone(),
                        CString::new("spin").unwrap_or_default(),
                        spin_arg.clone(),
                    ]);
                }
                spin(spin_us);
                // SAFETY: leave without running the parent's atexit handlers.
                unsafe { libc::_exit(0) };
            }
            running += 1;
            forked += 1;
        }
        if wait_one().is_some() {
            running -= 1;
        }
    }
    while wait_one().is_some() {}
    let execs = if mode == "exec" { n } else { 0 };
    report(format!(
        "\"mode\":\"swarm\",\"processes_forked\":{n},\"execs\":{execs}"
    ));
}

fn burner(threads: u64, ms: u64) {
    let hs: Vec<_> = (0..threads)
        .map(|_| std::thread::spawn(move || spin(ms * 1000)))
        .collect();
    for h in hs {
        let _ = h.join();
    }
    report(format!("\"mode\":\"burner\",\"threads\":{threads}"));
}

fn orphans(n: u64, ms: u64) {
    let mut fds = [0; 2];
    // SAFETY: fds has room for two descriptors.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        die("pipe");
    }
    for _ in 0..n {
        if fork() == 0 {
            // Middle: fork the grandchild and leave at once, orphaning it.
            if fork() == 0 {
                unsafe { libc::close(fds[0]) };
                spin(ms * 1000);
                unsafe { libc::_exit(0) };
            }
            unsafe { libc::_exit(0) };
        }
    }
    unsafe { libc::close(fds[1]) };
    while wait_one().is_some() {}
    // EOF once every grandchild has exited (they hold the write end).
    let mut b = [0u8; 1];
    while unsafe { libc::read(fds[0], b.as_mut_ptr().cast(), 1) } > 0 {}
    report(format!(
        "\"mode\":\"orphans\",\"processes_forked\":{}",
        2 * n
    ));
}

fn tree(depth: u64, width: u64, spin_us: u64) -> u64 {
    let mut forked = 0;
    if depth > 0 {
        for _ in 0..width {
            if fork() == 0 {
                let below = tree(depth - 1, width, spin_us);
                unsafe { libc::_exit(if below > 250 { 250 } else { below as i32 }) };
            }
            forked += 1;
        }
        let mut st = 0;
        while unsafe { libc::waitpid(-1, &mut st, 0) } > 0 {
            if libc::WIFEXITED(st) {
                forked += libc::WEXITSTATUS(st) as u64;
            }
        }
    }
    spin(spin_us);
    forked
}

fn incgroup(dir: &str, pre: Option<&str>, cmd: &[String]) -> ! {
    let me = std::process::id().to_string();
    // The CPU this process used before joining (its exec and start-up) is part of the
    // tree but not of the cgroup: report it for the truth.
    if let Some(pre) = pre {
        let ns = std::fs::read_to_string("/proc/self/schedstat")
            .ok()
            .and_then(|s| s.split_whitespace().next().map(str::to_string))
            .unwrap_or_else(|| die("/proc/self/schedstat"));
        std::fs::write(pre, ns).unwrap_or_else(|e| die(&format!("writing {pre}: {e}")));
    }
    std::fs::write(format!("{dir}/cgroup.procs"), &me)
        .unwrap_or_else(|e| die(&format!("joining {dir}: {e}")));
    let argv: Vec<CString> = cmd
        .iter()
        .map(|a| CString::new(a.as_bytes()).unwrap_or_default())
        .collect();
    if argv.is_empty() {
        die("incgroup: no command");
    }
    let path = if cmd[0].contains('/') {
        argv[0].clone()
    } else {
        CString::new(format!("/usr/bin/{}", cmd[0])).unwrap_or_default()
    };
    let mut all = vec![path];
    all.extend(argv[1..].iter().cloned());
    exec(&all)
}

/// Both processes on CPU 0, so every round is two context switches on one core
/// (cross-core wake-ups make the timing swing by 10x on a 2-vCPU VM).
fn pin_cpu0() {
    // SAFETY: cpu_set_t is plain data; sched_setaffinity on ourselves.
    unsafe {
        let mut set: libc::cpu_set_t = std::mem::zeroed();
        libc::CPU_SET(0, &mut set);
        libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &set);
    }
}

fn pingpong(rounds: u64) {
    pin_cpu0();
    let mut a = [0; 2];
    let mut b = [0; 2];
    unsafe {
        if libc::pipe(a.as_mut_ptr()) != 0 || libc::pipe(b.as_mut_ptr()) != 0 {
            die("pipe");
        }
    }
    let mut byte = [0u8; 1];
    if fork() == 0 {
        for _ in 0..rounds {
            unsafe {
                if libc::read(a[0], byte.as_mut_ptr().cast(), 1) != 1 {
                    libc::_exit(1);
                }
                libc::write(b[1], byte.as_ptr().cast(), 1);
            }
        }
        unsafe { libc::_exit(0) };
    }
    for _ in 0..rounds {
        unsafe {
            libc::write(a[1], byte.as_ptr().cast(), 1);
            if libc::read(b[0], byte.as_mut_ptr().cast(), 1) != 1 {
                die("pingpong read");
            }
        }
    }
    while wait_one().is_some() {}
    report(format!("\"mode\":\"pingpong\",\"rounds\":{rounds}"));
}

fn forkstorm(n: u64) {
    let t = CString::new("/bin/true").unwrap_or_default();
    for _ in 0..n {
        if fork() == 0 {
            exec(std::slice::from_ref(&t));
        }
        wait_one();
    }
    report(format!("\"mode\":\"forkstorm\",\"processes_forked\":{n}"));
}

fn sleepers(n: u64, secs: f64) {
    for _ in 0..n {
        if fork() == 0 {
            std::thread::sleep(Duration::from_secs_f64(secs));
            unsafe { libc::_exit(0) };
        }
    }
    while wait_one().is_some() {}
    report(format!("\"mode\":\"sleepers\",\"processes_forked\":{n}"));
}

fn main() {
    let _ = START.set(Instant::now());
    let args: Vec<String> = std::env::args().collect();
    match args.get(1).map(String::as_str) {
        Some("spin") => spin(arg(&args, 2, "microseconds")),
        Some("swarm") => {
            let mode: String = arg(&args, 5, "fork|exec");
            if mode != "fork" && mode != "exec" {
                die("swarm mode must be fork or exec");
            }
            swarm(arg(&args, 2, "count"), arg(&args, 3, "spin_us"), arg(&args, 4, "parallel"), &mode)
        }
        Some("burner") => burner(arg(&args, 2, "threads"), arg(&args, 3, "ms")),
        Some("orphans") => orphans(arg(&args, 2, "count"), arg(&args, 3, "ms")),
        Some("tree") => {
            let n = tree(arg(&args, 2, "depth"), arg(&args, 3, "width"), arg(&args, 4, "spin_us"));
            report(format!("\"mode\":\"tree\",\"processes_forked\":{n}"));
        }
        Some("incgroup") => {
            let dir: String = arg(&args, 2, "cgroup dir");
            let mut i = 3;
            let mut pre = None;
            if args.get(i).map(String::as_str) == Some("--pre") {
                pre = args.get(i + 1).cloned();
                i += 2;
            }
            if args.get(i).map(String::as_str) == Some("--") {
                i += 1;
            }
            incgroup(&dir, pre.as_deref(), args.get(i..).unwrap_or_default())
        }
        Some("pingpong") => pingpong(arg(&args, 2, "rounds")),
        Some("forkstorm") => forkstorm(arg(&args, 2, "count")),
        Some("sleepers") => sleepers(arg(&args, 2, "count"), arg(&args, 3, "seconds")),
        _ => die("usage: workload spin|swarm|burner|orphans|tree|incgroup|pingpong|forkstorm|sleepers ..."),
    }
}
