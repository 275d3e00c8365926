//! Facts about the host, read once at start.

use super::files::Roots;
use crate::{
    model::sample::{DiskSample, HostInfo, MemorySample},
    warn::warn_once,
};

/// `memory` and `disks` are the baseline reading's, so nothing is read twice.
pub fn host_info(roots: &Roots, memory: &MemorySample, disks: &[DiskSample]) -> HostInfo {
    // SAFETY: sysconf has no preconditions.
    let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
    let cpuinfo = roots.proc.join("cpuinfo");
    let host_cpu_model = match std::fs::read(&cpuinfo) {
        Ok(b) => cpu_model(&String::from_utf8_lossy(&b)),
        Err(e) => {
            warn_once(
                "collect.host.cpuinfo",
                format!(
                    "cannot read {}: {e}; host_cpu_model is null",
                    cpuinfo.display()
                ),
            );
            None
        }
    };
    let capacities: Vec<u64> = disks.iter().filter_map(|d| d.capacity_bytes).collect();
    HostInfo {
        host_vcpus: u64::try_from(online).ok().filter(|&n| n > 0),
        host_cpu_model,
        host_memory_mib: memory.total_mib,
        host_storage_gb: (!capacities.is_empty())
            .then(|| capacities.iter().map(|&c| c as f64).sum::<f64>() / 1e9),
        ..Default::default()
    }
}

/// The first `model name` (x86, some others); None where absent (many ARM).
fn cpu_model(s: &str) -> Option<String> {
    s.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        let v = v.trim();
        (k.trim() == "model name" && !v.is_empty()).then(|| v.to_string())
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collect::testroot::TestRoot;

    #[test]
    fn model_memory_storage() {
        let t = TestRoot::new("host");
        t.write(
            "proc/cpuinfo",
            "processor\t: 0\nvendor_id\t: AuthenticAMD\ncpu family\t: 26\nmodel\t\t: 2\n\
             model name\t: AMD EPYC\nstepping\t: 1\n\nprocessor\t: 1\nmodel name\t: Other\n",
        );
        let mem = MemorySample {
            total_mib: Some(24105.55),
            ..Default::default()
        };
        let disks = [
            DiskSample {
                capacity_bytes: Some(274_877_906_944),
                ..Default::default()
            },
            DiskSample {
                capacity_bytes: Some(1_000_000_000),
                ..Default::default()
            },
            DiskSample::default(),
        ];
        let h = host_info(&t.roots(), &mem, &disks);
        assert_eq!(h.host_cpu_model.as_deref(), Some("AMD EPYC"));
        assert_eq!(h.host_memory_mib, Some(24105.55));
        assert!((h.host_storage_gb.unwrap() - 275.877906944).abs() < 1e-9);
        assert!(h.host_vcpus.unwrap() >= 1);
        assert!(h.host_gpu_model.is_none() && h.host_gpu_count.is_none());

        // ARM-style cpuinfo, no disks, no meminfo.
        t.write(
            "proc/cpuinfo",
            "processor\t: 0\nBogoMIPS\t: 50.00\nCPU implementer\t: 0x41\nCPU part\t: 0xd0c\n",
        );
        let h = host_info(&t.roots(), &MemorySample::default(), &[]);
        assert!(h.host_cpu_model.is_none() && h.host_storage_gb.is_none());
        assert!(h.host_memory_mib.is_none());
        t.remove("proc/cpuinfo");
        assert!(host_info(&t.roots(), &mem, &[]).host_cpu_model.is_none());
    }
}
