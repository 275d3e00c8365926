//! Workload generator for the end-to-end tests and the benchmarks. Each mode prints
//! one JSON line on stdout saying exactly what it did (processes forked, …), so tests
//! compare the tracker with the workload's own count and the kernel's accounting.
//!
//! Modes:
//!   spin US                         busy-loop for US microseconds of wall time
//!   swarm N SPIN_US PAR fork|exec   N children, PAR at a time, each spinning SPIN_US
//!   burner THREADS MS               THREADS threads spinning MS milliseconds each
//!   orphans N MS [HOLD_MS]          N grandchildren orphaned (parent exits at once),
//!                                   each spinning MS ms; waits for them via a pipe,
//!                                   then HOLD_MS more while they wait for init
//!   tree DEPTH WIDTH SPIN_US        a full tree of processes, each spinning SPIN_US
//!   incgroup DIR[:DIR…] [--pre F] -- CMD
//!                                   join the cgroups (v1 hierarchies or v2; the CPU one
//!                                   first in the list), then exec CMD; --pre writes the
//!                                   CPU ns used before and after joining it to F
//!   lazyreaper N MS DELAY_MS        a subreaper whose N orphaned grandchildren spin MS
//!                                   ms and wait DELAY_MS as zombies before it reaps them
//!   daemon MS                       a double-forked daemon spins MS ms, then sleeps
//!                                   (outliving this root, which exits); prints its pid
//!   threadexec US                   a non-leader thread spins US µs, then execs `spin US`
//!   vfork N US                      N children started by posix_spawn (CLONE_VFORK),
//!                                   each exec'ing `spin US`
//!   cloneparent N US                N children made with CLONE_PARENT (siblings of this
//!                                   root, reaped by its parent), each spinning US µs
//!   leaderexit THREADS MS           the main thread leaves (pthread_exit) while THREADS
//!                                   threads spin MS ms
//!   pingpong ROUNDS                 two processes on CPU 0 bouncing a byte over pipes
//!   forkstorm N                     N fork+exec of /bin/true, one at a time
//!   sleepers N SECS                 N idle children sleeping SECS
//!   shared MIB N MS fork|thread|exec|cow
//!                                   MIB MiB written once, then read (never written)
//!                                   by N forked children, N threads, or N exec'd
//!                                   children mapping it from an inherited memfd;
//!                                   all hold it MS ms: the group's peak is ~MIB;
//!                                   cow: N forked children read it, then write it
//!                                   a third of the way in (peak ~(N+1) × MIB)
//!   mapread FD MIB MS               map MIB MiB of descriptor FD shared, read every
//!                                   page, hold MS ms (the exec'd children above)

use std::{
    ffi::CString,
    time::{Duration, Instant},
};

static START: std::sync::OnceLock<Instant> = std::sync::OnceLock::new();

/// Prints the mode's JSON line with its own wall time, which the benchmarks compare,
/// and the Unix time it was printed at (just before the root exits).
fn report(fields: String) {
    let secs = START.get().map_or(0.0, |s| s.elapsed().as_secs_f64());
    let unix = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0.0, |d| d.as_secs_f64());
    // A reader that is gone (`burner | burner`, whose reader never reads) is
    // no failure of the workload's: println! would panic on the closed pipe.
    use std::io::Write as _;
    let _ = writeln!(
        std::io::stdout(),
        "{{{fields},\"elapsed_secs\":{secs:.6},\"unix_secs\":{unix:.6}}}"
    );
}

fn spin(us: u64) {
    let end = Instant::now() + Duration::from_micros(us);
    let mut x = 0u64;
    while Instant::now() < end {
        x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        std::hint::black_box(x);
    }
}

/// A fixed amount of CPU work on each of `threads` threads (`millions` of steps
/// each), not a fixed time: under a CPU quota it takes longer, which is what a
/// prediction of the time under fewer CPUs is checked against.
fn work(threads: u64, millions: u64) {
    let hs: Vec<_> = (0..threads)
        .map(|t| {
            std::thread::spawn(move || {
                let mut x = t;
                for _ in 0..millions * 1_000_000 {
                    x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                    std::hint::black_box(x);
                }
            })
        })
        .collect();
    for h in hs {
        let _ = h.join();
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

fn orphans(n: u64, ms: u64, hold_ms: u64) {
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
    // The orphans are zombies waiting for init now.
    std::thread::sleep(Duration::from_millis(hold_ms));
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

/// Lazy subreaper: the grandchildren are reparented here and left as zombies.
fn lazyreaper(n: u64, ms: u64, delay_ms: u64) {
    // SAFETY: prctl with integer arguments.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        die("PR_SET_CHILD_SUBREAPER");
    }
    for _ in 0..n {
        if fork() == 0 {
            if fork() == 0 {
                spin(ms * 1000);
                unsafe { libc::_exit(0) };
            }
            unsafe { libc::_exit(0) };
        }
    }
    std::thread::sleep(Duration::from_millis(delay_ms));
    let mut reaped = 0;
    while wait_one().is_some() {
        reaped += 1;
    }
    report(format!(
        "\"mode\":\"lazyreaper\",\"processes_forked\":{},\"reaped\":{reaped}",
        2 * n
    ));
}

/// A classic daemon: fork, setsid, fork again; the grandchild outlives this root.
fn daemon(ms: u64) {
    let mut fds = [0; 2];
    // SAFETY: fds has room for two descriptors.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        die("pipe");
    }
    if fork() == 0 {
        unsafe { libc::setsid() };
        if fork() == 0 {
            spin(ms * 1000);
            let me = std::process::id().to_ne_bytes();
            // SAFETY: plain descriptor calls; a daemon lets go of its caller's pipes.
            unsafe {
                libc::write(fds[1], me.as_ptr().cast(), 4);
                libc::close(fds[1]);
                let null = libc::open(c"/dev/null".as_ptr(), libc::O_RDWR);
                libc::dup2(null, 1);
                libc::dup2(null, 2);
            }
            std::thread::sleep(Duration::from_secs(60));
            unsafe { libc::_exit(0) };
        }
        unsafe { libc::_exit(0) };
    }
    unsafe { libc::close(fds[1]) };
    while wait_one().is_some() {}
    let mut b = [0u8; 4];
    if unsafe { libc::read(fds[0], b.as_mut_ptr().cast(), 4) } != 4 {
        die("daemon did not report");
    }
    report(format!(
        "\"mode\":\"daemon\",\"processes_forked\":2,\"daemon_pid\":{}",
        u32::from_ne_bytes(b)
    ));
}

fn threadexec(us: u64) {
    let exe = self_exe();
    let arg = CString::new(us.to_string()).unwrap_or_default();
    spin(us);
    std::thread::spawn(move || {
        spin(us);
        exec(&[exe, CString::new("spin").unwrap_or_default(), arg]);
    });
    std::thread::sleep(Duration::from_secs(60));
    die("exec from the thread did not happen");
}

fn vfork(n: u64, us: u64) {
    let exe = std::fs::read_link("/proc/self/exe").unwrap_or_else(|e| die(&format!("{e}")));
    for _ in 0..n {
        // std uses posix_spawn here, which glibc implements with CLONE_VFORK.
        let st = std::process::Command::new(&exe)
            .args(["spin", &us.to_string()])
            .status()
            .unwrap_or_else(|e| die(&format!("spawn: {e}")));
        if !st.success() {
            die("spin child failed");
        }
    }
    report(format!("\"mode\":\"vfork\",\"processes_forked\":{n}"));
}

fn cloneparent(n: u64, us: u64) {
    let mut fds = [0; 2];
    // SAFETY: fds has room for two descriptors.
    if unsafe { libc::pipe(fds.as_mut_ptr()) } != 0 {
        die("pipe");
    }
    for _ in 0..n {
        // SAFETY: a raw clone without a new stack behaves like fork; the child only
        // spins and leaves.
        let pid = unsafe {
            libc::syscall(
                libc::SYS_clone,
                (libc::CLONE_PARENT | libc::SIGCHLD) as libc::c_ulong,
                0usize,
                0usize,
                0usize,
                0usize,
            )
        };
        if pid < 0 {
            die(&format!("clone: {}", std::io::Error::last_os_error()));
        }
        if pid == 0 {
            unsafe { libc::close(fds[0]) };
            spin(us);
            unsafe { libc::_exit(0) };
        }
    }
    unsafe { libc::close(fds[1]) };
    // EOF once every sibling has exited (they hold the write end).
    let mut b = [0u8; 1];
    while unsafe { libc::read(fds[0], b.as_mut_ptr().cast(), 1) } > 0 {}
    report(format!("\"mode\":\"cloneparent\",\"processes_forked\":{n}"));
}

fn leaderexit(threads: u64, ms: u64) {
    for _ in 0..threads {
        std::thread::spawn(move || spin(ms * 1000));
    }
    report(format!("\"mode\":\"leaderexit\",\"threads\":{threads}"));
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    // SAFETY: the raw exit ends only this thread (pthread_exit would unwind through
    // Rust frames, which aborts); the other threads keep the process alive.
    unsafe { libc::syscall(libc::SYS_exit, 0) };
    die("exit returned")
}

fn thread_cpu_ns() -> u64 {
    std::fs::read_to_string("/proc/thread-self/schedstat")
        .ok()
        .and_then(|s| s.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| die("/proc/thread-self/schedstat"))
}

fn incgroup(dirs: &str, pre: Option<&str>, cmd: &[String]) -> ! {
    let me = std::process::id().to_string();
    let join = |dir: &str| {
        std::fs::write(format!("{dir}/cgroup.procs"), &me)
            .unwrap_or_else(|e| die(&format!("joining {dir}: {e}")))
    };
    // The first directory holds the CPU accounting: join it last, between two
    // readings of this thread's CPU. What ran before the first reading is outside
    // the group, what ran after the second inside; the join itself is in between,
    // so the truth is known to within that window, which --pre F reports as
    // "BEFORE AFTER" (ns).
    let mut all = dirs.split(':');
    let cpu_dir = all.next().unwrap_or_else(|| die("incgroup: no cgroup"));
    for dir in all {
        join(dir);
    }
    let before = thread_cpu_ns();
    join(cpu_dir);
    let after = thread_cpu_ns();
    if let Some(pre) = pre {
        std::fs::write(pre, format!("{before} {after}"))
            .unwrap_or_else(|e| die(&format!("writing {pre}: {e}")));
    }
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

/// `n` children at once, each with `mib` MiB of its own memory written (every
/// page), held `ms` milliseconds: the group's peak is n × mib.
fn memory(mib: usize, n: u64, ms: u64) {
    for _ in 0..n {
        if fork() == 0 {
            // This mode starts no thread, so the child may allocate after fork.
            let mut v = vec![0u8; mib << 20];
            for page in v.chunks_mut(4096) {
                page[0] = 1;
            }
            std::thread::sleep(Duration::from_millis(ms));
            std::hint::black_box(&v);
            unsafe { libc::_exit(0) };
        }
    }
    while wait_one().is_some() {}
    report(format!("\"mode\":\"memory\",\"processes_forked\":{n}"));
}

/// Reads one byte of every page of `len` bytes at `p`, so each is mapped.
fn touch_read(p: *const u8, len: usize) -> u64 {
    let mut sum = 0u64;
    for off in (0..len).step_by(4096) {
        // SAFETY: p..p+len is a readable mapping owned by the caller.
        sum = sum.wrapping_add(u64::from(unsafe { std::ptr::read_volatile(p.add(off)) }));
    }
    sum
}

fn shared(mib: usize, n: u64, ms: u64, how: &str) {
    let len = mib << 20;
    let hold = Duration::from_millis(ms);
    match how {
        "cow" => {
            // Forked children read the pages, then, a third of the way in, write
            // every one: each copy-on-write break leaves their RSS where it was and
            // makes the page theirs alone (Σ PSS and the charge grow by n copies).
            let mut v = vec![0u8; len];
            for page in v.chunks_mut(4096) {
                page[0] = 1;
            }
            for _ in 0..n {
                if fork() == 0 {
                    std::hint::black_box(touch_read(v.as_ptr(), len));
                    std::thread::sleep(hold / 3);
                    for page in v.chunks_mut(4096) {
                        page[0] = 2;
                    }
                    std::hint::black_box(&v);
                    std::thread::sleep(hold - hold / 3);
                    // SAFETY: the forked child leaves without the parent's handlers.
                    unsafe { libc::_exit(0) };
                }
            }
            std::thread::sleep(hold);
            while wait_one().is_some() {}
            std::hint::black_box(&v);
        }
        "fork" | "thread" => {
            let mut v = vec![0u8; len];
            for page in v.chunks_mut(4096) {
                page[0] = 1;
            }
            let v = std::sync::Arc::new(v);
            if how == "fork" {
                for _ in 0..n {
                    if fork() == 0 {
                        // This mode has started no thread: the child may run Rust code.
                        std::hint::black_box(touch_read(v.as_ptr(), len));
                        std::thread::sleep(hold);
                        unsafe { libc::_exit(0) };
                    }
                }
                std::thread::sleep(hold);
                while wait_one().is_some() {}
            } else {
                let hs: Vec<_> = (0..n)
                    .map(|_| {
                        let v = v.clone();
                        std::thread::spawn(move || {
                            std::hint::black_box(touch_read(v.as_ptr(), len));
                            std::thread::sleep(hold);
                        })
                    })
                    .collect();
                std::thread::sleep(hold);
                for h in hs {
                    let _ = h.join();
                }
            }
            std::hint::black_box(&v);
        }
        "exec" => shared_exec(mib, n, ms),
        _ => die("shared: fork, thread, exec or cow"),
    }
    report(format!("\"mode\":\"shared\",\"processes_forked\":{n}"));
}

/// `shared … exec`: `mib` MiB in a memfd that `n` exec'd children inherit and map
/// (`mapread`), held `ms` milliseconds.
fn shared_exec(mib: usize, n: u64, ms: u64) {
    // A memfd without CLOEXEC: the exec'd children inherit it.
    let name = CString::new("rt-shared").unwrap_or_default();
    // SAFETY: a valid name; flags 0.
    let fd = unsafe { libc::memfd_create(name.as_ptr(), 0) };
    if fd < 0 {
        die(&format!(
            "memfd_create: {}",
            std::io::Error::last_os_error()
        ));
    }
    let page = vec![1u8; 1 << 20];
    for _ in 0..mib {
        // SAFETY: writing our buffer to our descriptor.
        let w = unsafe { libc::write(fd, page.as_ptr().cast(), page.len()) };
        if w != page.len() as isize {
            die("writing the memfd");
        }
    }
    let exe = self_exe();
    let argv = [
        exe,
        CString::new("mapread").unwrap_or_default(),
        CString::new(fd.to_string()).unwrap_or_default(),
        CString::new(mib.to_string()).unwrap_or_default(),
        CString::new(ms.to_string()).unwrap_or_default(),
    ];
    for _ in 0..n {
        if fork() == 0 {
            exec(&argv);
        }
    }
    while wait_one().is_some() {}
}

fn mapread(fd: i32, mib: usize, ms: u64) {
    let len = mib << 20;
    // SAFETY: a shared read-only mapping of an inherited descriptor.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            len,
            libc::PROT_READ,
            libc::MAP_SHARED,
            fd,
            0,
        )
    };
    if p == libc::MAP_FAILED {
        die(&format!("mmap: {}", std::io::Error::last_os_error()));
    }
    std::hint::black_box(touch_read(p.cast(), len));
    std::thread::sleep(Duration::from_millis(ms));
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
        Some("work") => work(arg(&args, 2, "threads"), arg(&args, 3, "millions")),
        Some("orphans") => orphans(
            arg(&args, 2, "count"),
            arg(&args, 3, "ms"),
            args.get(4).and_then(|s| s.parse().ok()).unwrap_or(0),
        ),
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
        Some("lazyreaper") => lazyreaper(arg(&args, 2, "count"), arg(&args, 3, "ms"), arg(&args, 4, "delay_ms")),
        Some("daemon") => daemon(arg(&args, 2, "ms")),
        Some("threadexec") => threadexec(arg(&args, 2, "us")),
        Some("vfork") => vfork(arg(&args, 2, "count"), arg(&args, 3, "us")),
        Some("cloneparent") => cloneparent(arg(&args, 2, "count"), arg(&args, 3, "us")),
        Some("leaderexit") => leaderexit(arg(&args, 2, "threads"), arg(&args, 3, "ms")),
        Some("forkstorm") => forkstorm(arg(&args, 2, "count")),
        Some("sleepers") => sleepers(arg(&args, 2, "count"), arg(&args, 3, "seconds")),
        Some("memory") => memory(arg(&args, 2, "mib"), arg(&args, 3, "processes"), arg(&args, 4, "ms")),
        Some("shared") => {
            let how: String = arg(&args, 5, "fork|thread|exec|cow");
            shared(arg(&args, 2, "mib"), arg(&args, 3, "n"), arg(&args, 4, "ms"), &how)
        }
        Some("mapread") => mapread(arg(&args, 2, "fd"), arg(&args, 3, "mib"), arg(&args, 4, "ms")),
        _ => die("usage: workload spin|swarm|burner|work|orphans|tree|incgroup|pingpong|forkstorm|sleepers|memory|shared|mapread|lazyreaper|daemon|threadexec|vfork|cloneparent|leaderexit ..."),
    }
}
