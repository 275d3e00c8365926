//! CPU of the tracker's own cgroup (`cpu.cgroup_*`): inside a container, the CPU
//! the container uses and the cores its quota allows, which the host's /proc/stat
//! cannot tell. The cgroup is the one the tracker is in when it starts.
//!
//! cgroup v1's `cpuacct.usage` (ns) is preferred where the cpuacct controller is
//! mounted (a v1 or hybrid host, where v2 holds no controller), else v2's
//! `cpu.stat` `usage_usec`. The quota is `cpu.max` (v2) or
//! `cpu.cfs_quota_us`/`cpu.cfs_period_us` of the cpu controller (v1).

use std::{
    os::unix::ffi::OsStrExt as _,
    path::{Path, PathBuf},
    time::Instant,
};

use super::{
    files::{unescape, CachedFile, Roots},
    mountinfo::MountLine,
};

#[derive(Clone, Copy, Debug, PartialEq)]
enum Usage {
    /// `cpuacct.usage`: nanoseconds.
    V1,
    /// `cpu.stat`: `usage_usec` line.
    V2,
}

pub(super) fn mounts(text: &str) -> Vec<MountLine<'_>> {
    super::mountinfo::parse(text.as_bytes()).collect()
}

/// The directory of cgroup `path` in `m`, when `m` holds it.
fn dir_in(m: &MountLine, path: &str) -> Option<PathBuf> {
    let rel = if m.root_is_slash() {
        path
    } else {
        path.strip_prefix(std::str::from_utf8(&unescape(m.root)).ok()?)
            .filter(|r| r.is_empty() || r.starts_with('/'))?
    };
    let point = std::path::Path::new(std::ffi::OsStr::from_bytes(&m.mount_point));
    Some(point.join(rel.trim_start_matches('/')))
}

/// Where the tracker's cgroup keeps `controller` (v1) or, with `None`, its v2 dir.
pub(super) fn find(
    cgroups: &str,
    mounts: &[MountLine],
    controller: Option<&str>,
) -> Option<PathBuf> {
    for line in cgroups.lines() {
        let mut it = line.splitn(3, ':');
        let (_, ctrls, path) = (it.next()?, it.next()?, it.next()?);
        let wanted = match controller {
            Some(c) => ctrls.split(',').any(|x| x == c),
            None => ctrls.is_empty(),
        };
        if !wanted {
            continue;
        }
        // Several mounts may hold the hierarchy (a bind of the host's beside the
        // namespace's): the first that contains the path.
        return mounts
            .iter()
            .filter(|m| match controller {
                Some(c) => {
                    m.fstype == "cgroup"
                        && m.super_options
                            .split(|&b| b == b',')
                            .any(|o| o == c.as_bytes())
                }
                None => m.fstype == "cgroup2",
            })
            .find_map(|m| dir_in(m, path));
    }
    None
}

/// The levels of the tracker's own memory cgroup, its own first and then each
/// parent that keeps the same files (v2's `memory.max`, v1's
/// `memory.limit_in_bytes`), to the hierarchy's root. Empty where none is found.
pub fn own_memory(roots: &Roots) -> Vec<crate::model::reading::MemoryLevel> {
    let read = |p: &str| std::fs::read_to_string(roots.proc.join(p)).unwrap_or_default();
    let (cgroups, mountinfo) = (read("self/cgroup"), read("self/mountinfo"));
    let mounts = mounts(&mountinfo);
    let (mut dir, files) = match find(&cgroups, &mounts, Some("memory")) {
        Some(d) if d.join("memory.limit_in_bytes").exists() => (
            d,
            ["memory.limit_in_bytes", "memory.usage_in_bytes", "total_"],
        ),
        _ => match find(&cgroups, &mounts, None) {
            Some(d) => (d, ["memory.max", "memory.current", ""]),
            None => return Vec::new(),
        },
    };
    let number =
        |p: PathBuf| -> Option<u64> { std::fs::read_to_string(p).ok()?.trim().parse().ok() };
    let mut out = Vec::new();
    // Up to the hierarchy's root (every cgroup directory has cgroup.procs); a
    // level without the limit file (its controller not enabled there) is passed.
    while dir.join("cgroup.procs").exists() {
        if !dir.join(files[0]).exists() {
            match dir.parent() {
                Some(p) => dir = p.to_path_buf(),
                None => break,
            }
            continue;
        }
        // "max" (v2) or a page-rounded i64::MAX (v1): no limit.
        let limit = number(dir.join(files[0])).filter(|&l| l < 1 << 62);
        let stat = std::fs::read_to_string(dir.join("memory.stat")).unwrap_or_default();
        let file = ["active_file", "inactive_file"]
            .iter()
            .filter_map(|k| {
                let key = format!("{}{k} ", files[2]);
                stat.lines()
                    .find_map(|l| l.strip_prefix(key.as_str()))
                    .and_then(|v| v.trim().parse::<u64>().ok())
            })
            .sum();
        if let Some(usage) = number(dir.join(files[1])) {
            out.push(crate::model::reading::MemoryLevel {
                dir: dir.display().to_string(),
                limit,
                usage,
                file,
            });
        }
        match dir.parent() {
            Some(p) => dir = p.to_path_buf(),
            None => break,
        }
    }
    out
}

pub struct CgroupCpu {
    usage: Option<(CachedFile, Usage)>,
    buf: Vec<u8>,
    prev: Option<(u64, Instant)>,
    /// Cores online, capped by the quota.
    cores: f64,
}

/// The cgroup's CPU in one interval.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct CgroupReading {
    pub usage_secs: Option<f64>,
    /// Cores used over the interval, at most `cores`.
    pub cores_used: Option<f64>,
}

impl CgroupCpu {
    pub fn new(roots: &Roots) -> CgroupCpu {
        let read = |p: &str| std::fs::read_to_string(roots.proc.join(p)).unwrap_or_default();
        let (cgroups, mountinfo) = (read("self/cgroup"), read("self/mountinfo"));
        let mounts = mounts(&mountinfo);
        let v1 = find(&cgroups, &mounts, Some("cpuacct"))
            .map(|d| (d.join("cpuacct.usage"), Usage::V1))
            .filter(|(f, _)| f.exists());
        let v2 = find(&cgroups, &mounts, None);
        let usage = v1.or_else(|| v2.as_ref().map(|d| (d.join("cpu.stat"), Usage::V2)));
        // SAFETY: sysconf has no preconditions.
        let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1) as f64;
        let quota = match &v2 {
            Some(d) if usage.as_ref().is_some_and(|u| u.1 == Usage::V2) => v2_quota(d),
            _ => find(&cgroups, &mounts, Some("cpu")).and_then(|d| v1_quota(&d)),
        };
        if usage.is_none() {
            // Not a warning: a sandbox without cgroupfs (`ip netns exec` remounts
            // /sys) is common, and the null fields say it.
            log::info!(
                "the tracker's cgroup CPU accounting was not found (/proc/self/cgroup, /proc/self/mountinfo); cpu.cgroup_* are null"
            );
        }
        CgroupCpu {
            usage: usage.map(|(p, k)| (CachedFile::whole(p), k)),
            buf: Vec::new(),
            prev: None,
            cores: quota.map_or(online, |q| q.min(online)),
        }
    }

    fn read_ns(&mut self) -> Option<u64> {
        let (file, kind) = self.usage.as_mut()?;
        if !file.read_or_warn(
            &mut self.buf,
            "collect.cgroup.usage",
            "cpu.cgroup_* are null",
        ) {
            return None;
        }
        let text = String::from_utf8_lossy(&self.buf);
        match kind {
            Usage::V1 => text.trim().parse().ok(),
            Usage::V2 => text
                .lines()
                .find_map(|l| l.strip_prefix("usage_usec "))
                .and_then(|v| v.trim().parse::<u64>().ok())
                .map(|us| us.saturating_mul(1000)),
        }
    }

    /// The interval since the previous call (nothing on the first).
    pub fn sample(&mut self) -> CgroupReading {
        let now = Instant::now();
        let Some(ns) = self.read_ns() else {
            self.prev = None;
            return CgroupReading::default();
        };
        let out = match self.prev {
            Some((p, at)) => {
                let secs = ns.saturating_sub(p) as f64 / 1e9;
                let elapsed = now.duration_since(at).as_secs_f64().max(1e-9);
                CgroupReading {
                    usage_secs: Some(secs),
                    cores_used: Some((secs / elapsed).min(self.cores)),
                }
            }
            None => CgroupReading::default(),
        };
        self.prev = Some((ns, now));
        out
    }
}

/// `cpu.max`: `QUOTA PERIOD` or `max PERIOD`.
fn v2_quota(dir: &Path) -> Option<f64> {
    let s = std::fs::read_to_string(dir.join("cpu.max")).ok()?;
    let mut it = s.split_whitespace();
    let (q, p) = (
        it.next()?.parse::<f64>().ok()?,
        it.next()?.parse::<f64>().ok()?,
    );
    (q > 0.0 && p > 0.0).then(|| q / p)
}

/// `cpu.cfs_quota_us` (-1: none) over `cpu.cfs_period_us`.
fn v1_quota(dir: &Path) -> Option<f64> {
    let read = |f: &str| -> Option<f64> {
        std::fs::read_to_string(dir.join(f))
            .ok()?
            .trim()
            .parse()
            .ok()
    };
    let (q, p) = (read("cpu.cfs_quota_us")?, read("cpu.cfs_period_us")?);
    (q > 0.0 && p > 0.0).then(|| q / p)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collect::testroot::TestRoot;

    /// mountinfo with both hierarchies mounted under the test's tree; the v1 cpuacct
    /// mount is a container's view (its root is the container's cgroup).
    fn layout(t: &TestRoot, v1: bool) {
        let base = t.path("sys/fs/cgroup");
        // mountinfo escapes a space in the mount point; /proc/self/cgroup does not.
        let mut mi = format!(
            "30 25 0:26 / {}/uni\\040fied rw - cgroup2 cgroup2 rw\n",
            base.display()
        );
        let mut cg = "0::/job.slice/run x\n".to_string();
        if v1 {
            mi += &format!(
                "31 25 0:27 /docker/abc {} rw - cgroup cgroup rw,cpuacct\n\
                 32 25 0:28 / {} rw - cgroup cgroup rw,cpu\n",
                base.join("cpuacct").display(),
                base.join("cpu").display()
            );
            cg = format!("3:cpuacct:/docker/abc/inner\n2:cpu:/docker/abc\n{cg}");
            t.write("sys/fs/cgroup/cpuacct/inner/cpuacct.usage", "1000000000\n");
            t.write("sys/fs/cgroup/cpu/docker/abc/cpu.cfs_quota_us", "50000\n");
            t.write("sys/fs/cgroup/cpu/docker/abc/cpu.cfs_period_us", "100000\n");
        }
        t.write("proc/self/mountinfo", &mi);
        t.write("proc/self/cgroup", &cg);
        t.write(
            "sys/fs/cgroup/uni fied/job.slice/run x/cpu.stat",
            "usage_usec 2000000\nuser_usec 1\n",
        );
        t.write(
            "sys/fs/cgroup/uni fied/job.slice/run x/cpu.max",
            "max 100000\n",
        );
    }

    #[test]
    fn v1_is_preferred_and_its_quota_caps_the_cores() {
        let t = TestRoot::new("cgv1");
        layout(&t, true);
        let mut c = CgroupCpu::new(&t.roots());
        assert_eq!(c.cores, 0.5);
        assert_eq!(c.sample(), CgroupReading::default());
        t.write("sys/fs/cgroup/cpuacct/inner/cpuacct.usage", "1250000000\n");
        let r = c.sample();
        assert_eq!(r.usage_secs, Some(0.25));
        // However short the interval, never more cores than the quota.
        assert_eq!(r.cores_used, Some(0.5));
    }

    #[test]
    fn v2_with_an_escaped_path() {
        let t = TestRoot::new("cgv2");
        layout(&t, false);
        let mut c = CgroupCpu::new(&t.roots());
        assert!(c.cores >= 1.0);
        c.sample();
        std::thread::sleep(std::time::Duration::from_millis(100));
        t.write(
            "sys/fs/cgroup/uni fied/job.slice/run x/cpu.stat",
            "usage_usec 2010000\n",
        );
        let r = c.sample();
        assert_eq!(r.usage_secs, Some(0.01));
        let cores = r.cores_used.unwrap();
        assert!(cores > 0.0 && cores <= 0.1, "{cores}");
    }

    #[test]
    fn nothing_found_is_null() {
        let t = TestRoot::new("cgnone");
        let mut c = CgroupCpu::new(&t.roots());
        assert_eq!(c.sample(), CgroupReading::default());
        assert_eq!(c.sample(), CgroupReading::default());
    }

    #[test]
    fn this_machine_agrees_with_its_own_cgroup() {
        let mut c = CgroupCpu::new(&Roots::default());
        c.sample();
        // Spun by this thread's own CPU clock, not the wall's: on a loaded or
        // stolen-from machine 50 ms of wall time can hold far less CPU.
        let start = crate::sys::thread_cpu_ns();
        while crate::sys::thread_cpu_ns() < start + 50_000_000 {
            std::hint::black_box(0);
        }
        let r = c.sample();
        // This thread alone spent 50 ms of CPU inside its cgroup; a sandbox
        // without cgroupfs has no figure at all, never a wrong one.
        match (c.usage.is_some(), r.usage_secs) {
            (true, Some(u)) => assert!(u >= 0.049, "{r:?}"),
            (false, None) => {}
            other => panic!("{other:?}"),
        }
    }
}
