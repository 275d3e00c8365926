//! Helpers for the host-metric, format and side-by-side end-to-end tests: running the
//! tracker host-wide until a signal, independent readings of /proc and /sys, a
//! network namespace with a veth pair, and guards that clean up on failure.

use std::{
    collections::BTreeMap,
    fs::File,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::{Duration, Instant, SystemTime, UNIX_EPOCH},
};

use serde_json::Value;

use crate::{read_jsonl, tracker};

/// True when CI is set: a missing tool or capability is then a failure.
pub fn ci() -> bool {
    std::env::var_os("CI").is_some()
}

/// Returns `ok`; when it is false, fails under CI and prints SKIPPED otherwise.
pub fn require(ok: bool, why: &str) -> bool {
    if !ok {
        assert!(!ci(), "CI is set but {why}");
        eprintln!("SKIPPED: {why}");
    }
    ok
}

/// True when root (network namespaces, mount namespaces).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// Whether `prog` is found on PATH.
pub fn have(prog: &str) -> bool {
    std::env::var_os("PATH").is_some_and(|p| {
        std::env::split_paths(&p).any(|d| {
            let f = d.join(prog);
            f.is_file()
                && std::fs::metadata(&f)
                    .map(|m| std::os::unix::fs::PermissionsExt::mode(&m.permissions()) & 0o111 != 0)
                    .unwrap_or(false)
        })
    })
}

/// Unix time now in seconds.
pub fn unix_now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .expect("clock after 1970")
        .as_secs_f64()
}

pub fn median(v: &[f64]) -> f64 {
    assert!(!v.is_empty(), "median of nothing");
    let mut s = v.to_vec();
    s.sort_by(f64::total_cmp);
    let n = s.len();
    if n % 2 == 1 {
        s[n / 2]
    } else {
        (s[n / 2 - 1] + s[n / 2]) / 2.0
    }
}

/// A number at `ptr` (JSON pointer) of `v`, or a panic naming it.
pub fn num(v: &Value, ptr: &str) -> f64 {
    v.pointer(ptr)
        .and_then(Value::as_f64)
        .unwrap_or_else(|| panic!("{ptr} is not a number in {v}"))
}

/// A child process killed and reaped on drop (a test that fails leaves nothing behind).
pub struct Bg {
    pub child: Child,
    what: String,
}

impl Bg {
    pub fn spawn(cmd: &mut Command, what: &str) -> Bg {
        let child = cmd
            .spawn()
            .unwrap_or_else(|e| panic!("cannot start {what} ({cmd:?}): {e}"));
        Bg {
            child,
            what: what.to_string(),
        }
    }

    pub fn pid(&self) -> i32 {
        self.child.id() as i32
    }

    pub fn signal(&self, sig: i32) {
        // SAFETY: signalling a child we started and have not reaped.
        unsafe { libc::kill(self.pid(), sig) };
    }

    /// Waits (up to 10 s) until the test server this child is writes its
    /// `HOST:PORT` into `file`; `Err(status)` when it exits first.
    pub fn wait_addr_file(&mut self, file: &Path) -> Result<String, std::process::ExitStatus> {
        let t0 = Instant::now();
        loop {
            if let Ok(a) = std::fs::read_to_string(file) {
                if a.contains(':') {
                    return Ok(a.trim().to_string());
                }
            }
            if let Some(st) = self.child.try_wait().expect("try_wait") {
                return Err(st);
            }
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "{} did not write {}",
                self.what,
                file.display()
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits up to `limit`; panics (after the kill in drop) when it does not end.
    pub fn wait_for(&mut self, limit: Duration) -> std::process::ExitStatus {
        let t0 = Instant::now();
        loop {
            if let Some(st) = self.child.try_wait().expect("try_wait") {
                return st;
            }
            assert!(
                t0.elapsed() < limit,
                "{} did not end within {limit:?}",
                self.what
            );
            std::thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for Bg {
    fn drop(&mut self) {
        if let Ok(None) = self.child.try_wait() {
            let _ = self.child.kill();
        }
        let _ = self.child.wait();
    }
}

/// Number of lines in a file (0 when missing).
/// A page's rendered DOM without its `<script>` elements: the report carries its
/// own code, whose strings (every hint, every card's title) would match otherwise.
pub fn shown_text(dom: &str) -> String {
    let mut out = String::with_capacity(dom.len());
    let mut rest = dom;
    while let Some(i) = rest.find("<script") {
        out.push_str(&rest[..i]);
        rest = rest[i..]
            .find("</script>")
            .map_or("", |j| &rest[i + j + "</script>".len()..]);
    }
    out.push_str(rest);
    out
}

pub fn line_count(p: &Path) -> usize {
    std::fs::read_to_string(p)
        .map(|s| s.lines().count())
        .unwrap_or(0)
}

/// Waits until `p` has at least `n` lines.
pub fn wait_lines(p: &Path, n: usize, limit: Duration) {
    let t0 = Instant::now();
    while line_count(p) < n {
        assert!(
            t0.elapsed() < limit,
            "{} has {} lines, wanted {n} within {limit:?}",
            p.display(),
            line_count(p)
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// The tracker sampling host-wide (no command, no --pid) until it is signalled.
pub struct HostTracker {
    pub bg: Bg,
    pub out: PathBuf,
    pub err: PathBuf,
    /// Unix time just before the spawn.
    pub spawned_at: f64,
}

/// What a host-wide run left behind.
pub struct HostRun {
    pub samples: Vec<Value>,
    pub stderr: String,
    pub code: Option<i32>,
}

impl HostTracker {
    /// `resource-tracker -q -o DIR/NAME.out ARGS`, run in `dir` (so no stray
    /// resource-tracker.toml is read) with the TRACKER_* variables removed.
    pub fn start(dir: &Path, name: &str, args: &[&str]) -> HostTracker {
        let out = dir.join(format!("{name}.out"));
        let err = dir.join(format!("{name}.err"));
        let mut cmd = Command::new(tracker());
        cmd.current_dir(dir)
            .args(["-q", "-o"])
            .arg(&out)
            .args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(File::create(&err).expect("stderr file"));
        clean_env(&mut cmd);
        let spawned_at = unix_now();
        let bg = Bg::spawn(&mut cmd, "resource-tracker");
        HostTracker {
            bg,
            out,
            err,
            spawned_at,
        }
    }

    /// Waits for the first `n` samples (JSON lines; for CSV count the header too).
    pub fn wait_samples(&self, n: usize, limit: Duration) {
        wait_lines(&self.out, n, limit);
    }

    /// SIGINT, then the exit; the final sample is then in the file.
    pub fn stop(mut self, sig: i32) -> (std::process::ExitStatus, String) {
        self.bg.signal(sig);
        let st = self.bg.wait_for(Duration::from_secs(20));
        let stderr = std::fs::read_to_string(&self.err).unwrap_or_default();
        (st, stderr)
    }

    /// Stops with SIGINT and reads JSON samples.
    pub fn finish_json(self) -> HostRun {
        let out = self.out.clone();
        let (st, stderr) = self.stop(libc::SIGINT);
        assert!(!stderr.contains("panicked"), "{stderr}");
        assert_eq!(st.code(), Some(0), "tracker exit: {st:?}; stderr: {stderr}");
        HostRun {
            samples: read_jsonl(&out),
            stderr,
            code: st.code(),
        }
    }
}

/// Removes the variables that would change the tracker's settings or logging.
pub fn clean_env(cmd: &mut Command) -> &mut Command {
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        if k.starts_with("TRACKER_")
            || k.starts_with("SENTINEL_")
            || k.starts_with("OTEL_")
            || k == "RUST_LOG"
        {
            cmd.env_remove(&k);
        }
    }
    cmd
}

/// /proc/meminfo values in kB, by key.
pub fn meminfo() -> BTreeMap<String, u64> {
    let s = std::fs::read_to_string("/proc/meminfo").expect("/proc/meminfo");
    s.lines()
        .filter_map(|l| {
            let (k, v) = l.split_once(':')?;
            let n = v.split_whitespace().next()?.parse().ok()?;
            Some((k.to_string(), n))
        })
        .collect()
}

/// The memory fields of a sample computed from one meminfo reading, in MiB, keyed
/// as in the sample (`free_mib`, …), by the test's own reading of docs/schema.md.
pub fn memory_view(m: &BTreeMap<String, u64>) -> BTreeMap<&'static str, f64> {
    let g = |k: &str| {
        *m.get(k)
            .unwrap_or_else(|| panic!("no {k} in /proc/meminfo")) as f64
    };
    let mib = |kb: f64| kb / 1024.0;
    let cached = g("Cached") + g("SReclaimable");
    let mut v = BTreeMap::new();
    v.insert("total_mib", mib(g("MemTotal")));
    v.insert("free_mib", mib(g("MemFree")));
    v.insert("available_mib", mib(g("MemAvailable")));
    v.insert("buffers_mib", mib(g("Buffers")));
    v.insert("cached_mib", mib(cached));
    v.insert("active_mib", mib(g("Active")));
    v.insert("inactive_mib", mib(g("Inactive")));
    v.insert(
        "used_mib",
        mib((g("MemTotal") - g("MemFree") - g("Buffers") - cached).max(0.0)),
    );
    v
}

/// One reading of the memory fields with its Unix time.
pub type MemReading = (f64, BTreeMap<&'static str, f64>);

/// Readings of /proc/meminfo taken by a background thread every few ms, with their
/// Unix time, to bracket what the tracker read at its timestamp.
pub struct MemWatch {
    stop: std::sync::Arc<std::sync::atomic::AtomicBool>,
    handle: Option<std::thread::JoinHandle<Vec<MemReading>>>,
}

impl MemWatch {
    pub fn start() -> MemWatch {
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let s = stop.clone();
        let handle = std::thread::spawn(move || {
            let mut v = Vec::new();
            loop {
                let m = memory_view(&meminfo());
                v.push((unix_now(), m));
                if s.load(std::sync::atomic::Ordering::Relaxed) {
                    return v;
                }
                std::thread::sleep(Duration::from_millis(5));
            }
        });
        MemWatch {
            stop,
            handle: Some(handle),
        }
    }

    pub fn finish(mut self) -> Vec<MemReading> {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        self.handle
            .take()
            .expect("handle")
            .join()
            .expect("meminfo thread")
    }
}

impl Drop for MemWatch {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(h) = self.handle.take() {
            let _ = h.join();
        }
    }
}

/// Runs a command, returning trimmed stdout; panics with stderr when it fails.
pub fn sh_out(cmd: &mut Command) -> String {
    let o = cmd
        .output()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    assert!(
        o.status.success(),
        "{cmd:?} failed: {}",
        String::from_utf8_lossy(&o.stderr)
    );
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

pub fn ip(args: &[&str]) -> Result<(), String> {
    let o = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| format!("ip: {e}"))?;
    if o.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr).trim()
        ))
    }
}

/// A network namespace with a veth pair: `host_if` in the root namespace
/// (10.213.X.1/30), `ns_if` inside (10.213.X.2/30), both up. Removed on drop.
pub struct NetNs {
    pub ns: String,
    pub host_if: String,
    pub ns_if: String,
    pub host_ip: String,
    pub ns_ip: String,
}

impl NetNs {
    /// None (after `require`) when this machine cannot make one outside CI.
    pub fn create(tag: &str) -> Option<NetNs> {
        if !require(is_root(), "network namespaces need root")
            || !require(have("ip"), "`ip` (iproute2) is not installed")
        {
            return None;
        }
        let pid = std::process::id();
        let x = pid % 250;
        let n = NetNs {
            ns: format!("rt-test-{tag}-{pid}"),
            // IFNAMSIZ is 16: "rtv" + up to 7 digits + tag letter + a/b.
            host_if: format!("rtv{pid}{tag}a").chars().take(15).collect(),
            ns_if: format!("rtv{pid}{tag}b").chars().take(15).collect(),
            host_ip: format!("10.213.{x}.1"),
            ns_ip: format!("10.213.{x}.2"),
        };
        // Leftovers of an earlier run killed before its drop.
        let _ = ip(&["link", "del", &n.host_if]);
        let _ = ip(&["netns", "del", &n.ns]);
        let steps: Vec<Vec<String>> = vec![
            vec!["netns".into(), "add".into(), n.ns.clone()],
            vec![
                "link".into(),
                "add".into(),
                n.host_if.clone(),
                "type".into(),
                "veth".into(),
                "peer".into(),
                "name".into(),
                n.ns_if.clone(),
            ],
            vec![
                "link".into(),
                "set".into(),
                n.ns_if.clone(),
                "netns".into(),
                n.ns.clone(),
            ],
            vec![
                "addr".into(),
                "add".into(),
                format!("{}/30", n.host_ip),
                "dev".into(),
                n.host_if.clone(),
            ],
            vec!["link".into(), "set".into(), n.host_if.clone(), "up".into()],
            vec![
                "-n".into(),
                n.ns.clone(),
                "addr".into(),
                "add".into(),
                format!("{}/30", n.ns_ip),
                "dev".into(),
                n.ns_if.clone(),
            ],
            vec![
                "-n".into(),
                n.ns.clone(),
                "link".into(),
                "set".into(),
                n.ns_if.clone(),
                "up".into(),
            ],
            vec![
                "-n".into(),
                n.ns.clone(),
                "link".into(),
                "set".into(),
                "lo".into(),
                "up".into(),
            ],
        ];
        for s in steps {
            let a: Vec<&str> = s.iter().map(String::as_str).collect();
            if let Err(e) = ip(&a) {
                // `n` is dropped here: what was made so far is removed.
                panic!("setting up the veth pair: {e}");
            }
        }
        // Carrier comes up asynchronously.
        let t0 = Instant::now();
        while n.sys("operstate").as_deref() != Some("up") {
            assert!(
                t0.elapsed() < Duration::from_secs(10),
                "{} not up: {:?}",
                n.host_if,
                n.sys("operstate")
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        Some(n)
    }

    /// `/sys/class/net/HOST_IF/ATTR`, trimmed; None when unreadable.
    pub fn sys(&self, attr: &str) -> Option<String> {
        std::fs::read_to_string(format!("/sys/class/net/{}/{attr}", self.host_if))
            .ok()
            .map(|s| s.trim().to_string())
    }

    pub fn tx_bytes(&self) -> u64 {
        self.sys("statistics/tx_bytes")
            .and_then(|s| s.parse().ok())
            .expect("tx_bytes")
    }

    /// A TCP sink inside the namespace: reads and discards, prints the byte count of
    /// each connection on its own line; "ready PORT" first.
    pub fn sink(&self) -> (Bg, u16) {
        let script = format!(
            r#"
import socket, sys
s = socket.socket()
s.bind(("{}", 0))
s.listen(4)
print("ready", s.getsockname()[1], flush=True)
while True:
    c, _ = s.accept()
    n = 0
    while True:
        b = c.recv(1 << 20)
        if not b:
            break
        n += len(b)
    c.close()
    print(n, flush=True)
"#,
            self.ns_ip
        );
        let mut bg = Bg::spawn(
            Command::new("ip")
                .args(["netns", "exec", &self.ns, "python3", "-c", &script])
                .stdout(Stdio::piped())
                .stderr(Stdio::inherit()),
            "python TCP sink",
        );
        let line = read_line(bg.child.stdout.as_mut().expect("stdout"));
        let port = line
            .strip_prefix("ready ")
            .and_then(|p| p.trim().parse().ok())
            .unwrap_or_else(|| panic!("sink said {line:?}"));
        (bg, port)
    }
}

/// One line from a pipe, byte by byte (no buffering past it).
pub fn read_line(r: &mut impl std::io::Read) -> String {
    let mut out = Vec::new();
    let mut b = [0u8; 1];
    while r.read(&mut b).unwrap_or(0) == 1 && b[0] != b'\n' {
        out.push(b[0]);
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// Sends `n` bytes to `addr` over one TCP connection, at most `rate` bytes/s when
/// given; returns when the peer has closed (so every byte was received).
pub fn send_tcp(addr: &str, n: usize, rate: Option<f64>) {
    use std::io::{Read, Write};
    let mut s = std::net::TcpStream::connect(addr).unwrap_or_else(|e| panic!("{addr}: {e}"));
    let chunk = vec![0x5au8; 64 * 1024];
    let t0 = Instant::now();
    let mut sent = 0;
    while sent < n {
        let k = chunk.len().min(n - sent);
        s.write_all(&chunk[..k]).expect("send");
        sent += k;
        if let Some(r) = rate {
            let due = Duration::from_secs_f64(sent as f64 / r);
            if let Some(w) = due.checked_sub(t0.elapsed()) {
                std::thread::sleep(w);
            }
        }
    }
    s.shutdown(std::net::Shutdown::Write).expect("shutdown");
    let mut rest = Vec::new();
    let _ = s.read_to_end(&mut rest);
}

impl Drop for NetNs {
    fn drop(&mut self) {
        // Deleting one end removes the pair; the namespace goes with its name.
        let _ = ip(&["link", "del", &self.host_if]);
        let _ = ip(&["netns", "del", &self.ns]);
    }
}

/// The whole disk under block device `maj:min` as /sys/block names it: a partition's
/// parent, a stacked device's first underlying disk (as docs/schema.md assigns mounts).
pub fn whole_disk(maj: u32, min: u32) -> Option<String> {
    let dev = std::fs::canonicalize(format!("/sys/dev/block/{maj}:{min}")).ok()?;
    let mut dev = if dev.join("partition").exists() {
        dev.parent()?.to_path_buf()
    } else {
        dev
    };
    // Stacked (dm, md): follow the first slave down to a real disk.
    for _ in 0..8 {
        let mut slaves: Vec<PathBuf> = std::fs::read_dir(dev.join("slaves"))
            .map(|d| d.filter_map(|e| e.ok()).map(|e| e.path()).collect())
            .unwrap_or_default();
        slaves.sort();
        match slaves.first() {
            Some(s) => {
                let s = std::fs::canonicalize(s).ok()?;
                dev = if s.join("partition").exists() {
                    s.parent()?.to_path_buf()
                } else {
                    s
                };
            }
            None => break,
        }
    }
    dev.file_name().map(|n| n.to_string_lossy().into_owned())
}

/// (major, minor) of the filesystem holding `p`.
pub fn dev_of(p: &Path) -> (u32, u32) {
    let m = std::fs::metadata(p).unwrap_or_else(|e| panic!("{}: {e}", p.display()));
    let d = std::os::unix::fs::MetadataExt::dev(&m);
    (libc::major(d), libc::minor(d))
}

/// Sectors written (×512 bytes) of a disk, from /proc/diskstats read by the test.
pub fn disk_written_bytes(disk: &str) -> u64 {
    let s = std::fs::read_to_string("/proc/diskstats").expect("/proc/diskstats");
    s.lines()
        .find_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.get(2) == Some(&disk)).then(|| f[9].parse::<u64>().expect("sectors") * 512)
        })
        .unwrap_or_else(|| panic!("{disk} not in /proc/diskstats"))
}

/// A directory on the root filesystem for files whose writes must reach the root
/// disk (temp_dir may be a tmpfs elsewhere); removed on drop.
pub struct RootScratch(pub PathBuf);

impl RootScratch {
    pub fn new(tag: &str) -> RootScratch {
        let root = dev_of(Path::new("/"));
        let name = format!("rt-test-{tag}-{}", std::process::id());
        let candidates = [
            std::env::temp_dir(),
            PathBuf::from("/var/tmp"),
            crate::bin_dir(),
            PathBuf::from("/"),
        ];
        for c in candidates {
            if c.is_dir() && dev_of(&c) == root {
                let d = c.join(&name);
                let _ = std::fs::remove_dir_all(&d);
                if std::fs::create_dir_all(&d).is_ok() {
                    return RootScratch(d);
                }
            }
        }
        panic!("no writable directory on the root filesystem");
    }
    pub fn path(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }
}

impl Drop for RootScratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The whole disks /sys/block lists that docs/schema.md says the tracker reports:
/// not loop, ram, zram, not empty (size 0), not stacked (dm, md). Name → bytes.
pub fn listed_disks() -> BTreeMap<String, u64> {
    let mut out = BTreeMap::new();
    for e in std::fs::read_dir("/sys/block")
        .expect("/sys/block")
        .flatten()
    {
        let name = e.file_name().to_string_lossy().into_owned();
        if ["loop", "ram", "zram", "dm-", "md"]
            .iter()
            .any(|p| name.starts_with(p))
        {
            continue;
        }
        let size: u64 = std::fs::read_to_string(e.path().join("size"))
            .ok()
            .and_then(|s| s.trim().parse().ok())
            .unwrap_or(0);
        if size > 0 {
            out.insert(name, size * 512);
        }
    }
    out
}

/// Path to the Python venv with resource-tracker 0.5.0 that scripts/setup.sh makes.
pub fn py_peers_python() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../target/py-peers/bin/python")
        .to_path_buf()
}

/// The string values of `key` in each object of `v`, in order.
pub fn names(v: &[Value], key: &str) -> Vec<String> {
    v.iter()
        .filter_map(|x| x[key].as_str().map(str::to_string))
        .collect()
}
