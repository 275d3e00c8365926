//! All host sources in one collector: per sample it only re-reads files it keeps
//! open.

use super::{cgroup, cpu, disk, files::Roots, host, memory, network};
use crate::model::{sample::HostInfo, HostReading};

/// All host sources. Per sample it only re-reads files it keeps open (no /proc/PID
/// scan, no directory listing unless the set of devices or mounts changed).
pub struct SystemCollector {
    cpu: cpu::CpuCollector,
    cgroup: cgroup::CgroupCpu,
    memory: memory::MemoryCollector,
    network: network::NetworkCollector,
    disk: disk::DiskCollector,
    host: HostInfo,
}

impl SystemCollector {
    /// Takes the baseline reading of every source, so that the first `sample`
    /// (one interval later) already has rates.
    pub fn new(roots: Roots) -> SystemCollector {
        let mut c = SystemCollector {
            cpu: cpu::CpuCollector::new(&roots),
            cgroup: cgroup::CgroupCpu::new(&roots),
            memory: memory::MemoryCollector::new(&roots),
            network: network::NetworkCollector::new(&roots),
            disk: disk::DiskCollector::new(&roots),
            host: HostInfo::default(),
        };
        let base = c.sample();
        c.host = host::host_info(&roots, &base.memory, &base.disk);
        c
    }

    /// Reads all sources; rates cover the time since the previous call.
    pub fn sample(&mut self) -> HostReading {
        let mut cpu = self.cpu.sample();
        let cg = self.cgroup.sample();
        cpu.cgroup_usage_secs = cg.usage_secs;
        cpu.cgroup_utilization_pct = cg.cores_used;
        HostReading {
            cpu,
            memory: self.memory.sample(),
            disk: self.disk.sample(),
            network: self.network.sample(),
            gpu: Vec::new(),
            process_gpu: None,
        }
    }

    /// Host facts read once, at `new`.
    pub fn host_info(&self) -> HostInfo {
        self.host.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The collector against this machine's own /proc and /sys.
    #[test]
    fn real_machine() {
        let mut c = SystemCollector::new(Roots::default());
        std::thread::sleep(std::time::Duration::from_millis(200));
        let r = c.sample();

        let meminfo = std::fs::read_to_string("/proc/meminfo").unwrap();
        let total_kb: f64 = meminfo
            .lines()
            .find_map(|l| l.strip_prefix("MemTotal:"))
            .and_then(|v| v.split_whitespace().next())
            .and_then(|v| v.parse().ok())
            .unwrap();
        assert_eq!(r.memory.total_mib, Some(total_kb / 1024.0));
        assert_eq!(c.host_info().host_memory_mib, Some(total_kb / 1024.0));

        let stat = std::fs::read_to_string("/proc/stat").unwrap();
        let cores = stat
            .lines()
            .filter(|l| l.starts_with("cpu") && !l.starts_with("cpu "))
            .count();
        let per_core = r.cpu.per_core_pct.as_ref().unwrap();
        assert_eq!(per_core.len(), cores);
        assert!(per_core.iter().all(|p| (0.0..=100.0).contains(p)));
        let util = r.cpu.utilization_pct.unwrap();
        assert!((0.0..=cores as f64).contains(&util));
        assert!(r.cpu.utime_secs.is_some() && r.cpu.process_count.is_some());

        // The disk holding / is listed (with size > 0, not loop/zram) with "/".
        let disks: Vec<String> = std::fs::read_dir("/sys/block")
            .unwrap()
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .filter(|n| !["loop", "ram", "zram"].iter().any(|p| n.starts_with(p)))
            .filter(|n| {
                std::fs::read_to_string(format!("/sys/block/{n}/size"))
                    .is_ok_and(|s| s.trim() != "0")
            })
            .collect();
        for d in &disks {
            if std::fs::read_dir(format!("/sys/block/{d}/slaves"))
                .is_ok_and(|mut s| s.next().is_none())
            {
                assert!(r.disk.iter().any(|x| &x.device == d), "{d} not listed");
            }
        }
        // / on a block device (not a container's overlay): listed on its disk.
        let mountinfo = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let slash_on_disk = mountinfo.lines().any(|l| {
            let f: Vec<&str> = l.split(' ').collect();
            let source = l.split(" - ").nth(1).and_then(|r| r.split(' ').nth(1));
            f.len() > 4
                && f[4] == "/"
                && (!f[2].starts_with("0:") || source.is_some_and(|s| s.starts_with("/dev/")))
        });
        let root = r
            .disk
            .iter()
            .find(|d| d.mounts.iter().any(|m| m.mount_point == "/"));
        if slash_on_disk {
            let root = root.unwrap_or_else(|| panic!("no disk with /: {:?}", r.disk));
            assert!(root.read_bytes_per_sec.is_some() && root.read_bytes_total > Some(0));
            let slash = root.mounts.iter().find(|m| m.mount_point == "/").unwrap();
            assert!(slash.total_bytes > 0 && slash.used_pct > 0.0 && slash.used_pct <= 100.0);
        }
        // Each filesystem at most once.
        let mut mps: Vec<_> = r.disk.iter().flat_map(|d| &d.mounts).collect();
        let n = mps.len();
        mps.dedup_by(|a, b| a.mount_point == b.mount_point);
        assert_eq!(mps.len(), n);
        let host = c.host_info();
        let cap: u64 = r.disk.iter().filter_map(|d| d.capacity_bytes).sum();
        assert_eq!(host.host_storage_gb, Some(cap as f64 / 1e9));
        assert!(host.host_vcpus.unwrap() >= 1);

        let dev = std::fs::read_to_string("/proc/net/dev").unwrap();
        if dev.contains("eth0:") {
            let eth0 = r.network.iter().find(|n| n.interface == "eth0").unwrap();
            assert!(eth0.rx_bytes_per_sec.is_some() && eth0.mtu.is_some());
            assert!(eth0.mac_address.is_some() && eth0.operstate.is_some());
        }
        assert!(r.network.iter().all(|n| n.interface != "lo"));
        eprintln!("{r:#?}\n{host:#?}");
    }
}
