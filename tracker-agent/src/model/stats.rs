//! The run's statistics and the resources it would need, by the rules of the
//! Python resource-tracker 0.5.0's `stats()`, `recommend_resources()` and server
//! allocation check (without its memory unit slip, which divides MiB by 1024 once
//! more and so recommends 128 MiB for any real job).

use serde::Serialize;

use super::sample::Sample;

/// Mean and maximum of one column over the samples that have it.
#[derive(Clone, Copy, Debug, Default)]
struct Column {
    n: u64,
    sum: f64,
    max: f64,
}

impl Column {
    fn add(&mut self, v: Option<f64>) {
        if let Some(v) = v.filter(|v| v.is_finite()) {
            self.max = if self.n == 0 { v } else { self.max.max(v) };
            self.n += 1;
            self.sum += v;
        }
    }

    fn mean(&self) -> f64 {
        if self.n == 0 {
            0.0
        } else {
            self.sum / self.n as f64
        }
    }

    fn stat(&self) -> Option<MeanMax> {
        (self.n > 0).then(|| MeanMax {
            mean: round2(self.mean()),
            max: round2(self.max),
        })
    }
}

/// Python's `round(x, 2)`: to the nearest, ties to even on the exact binary value
/// (which is what formatting does).
fn round2(x: f64) -> f64 {
    format!("{x:.2}").parse().unwrap_or(x)
}

/// Python's `round(x)`: ties to even.
fn round_even(x: f64) -> f64 {
    let r = x.round();
    if (x - x.trunc()).abs() == 0.5 {
        2.0 * (x / 2.0).round()
    } else {
        r
    }
}

/// Accumulated over a run's samples.
#[derive(Clone, Debug, Default)]
pub struct UsageAccum {
    first_ts: Option<f64>,
    last_ts: f64,
    first_interval: f64,
    cpu: Column,
    memory: Column,
    pss: bool,
    gpu: Column,
    vram: Column,
    gpus: Column,
    disk_used_gb: Column,
    net_recv: u64,
    net_sent: u64,
    sys_cpu: Column,
    sys_memory: Column,
    sys_gpu: Column,
    sys_vram: Column,
}

impl UsageAccum {
    pub fn add(&mut self, s: &Sample) {
        let Some(p) = &s.process else { return };
        if self.first_ts.is_none() {
            self.first_ts = Some(s.timestamp_secs);
            self.first_interval = s.interval_secs;
        }
        self.last_ts = s.timestamp_secs;
        self.cpu.add(s.cpu.process_cores_used);
        self.pss |= p.memory_pss_mib.is_some();
        self.memory
            .add(Some(p.memory_pss_mib.unwrap_or(p.memory_rss_mib)));
        self.gpu.add(p.gpu_usage);
        self.vram.add(p.gpu_vram_mib);
        self.gpus.add(p.gpu_utilized.map(|g| g as f64));
        let (total, avail) = s
            .disk
            .iter()
            .flat_map(|d| &d.mounts)
            .fold((0u64, 0u64), |(t, a), m| {
                (t + m.total_bytes, a + m.available_bytes)
            });
        self.disk_used_gb
            .add(Some(total.saturating_sub(avail) as f64 / 1e9));
        self.net_recv += s.network.iter().filter_map(|n| n.rx_bytes).sum::<u64>();
        self.net_sent += s.network.iter().filter_map(|n| n.tx_bytes).sum::<u64>();
        self.sys_cpu.add(s.cpu.utilization_pct);
        self.sys_memory.add(s.memory.unavailable_mib);
        if !s.gpu.is_empty() {
            self.sys_gpu.add(Some(
                s.gpu.iter().filter_map(|g| g.utilization_pct).sum::<f64>() / 100.0,
            ));
            self.sys_vram.add(Some(
                s.gpu
                    .iter()
                    .filter_map(|g| g.vram_used_bytes)
                    .map(|b| b as f64 / 1048576.0)
                    .sum(),
            ));
        }
    }

    /// None without a tracked tree's sample.
    pub fn stats(&self) -> Option<RunStatsOut> {
        let first = self.first_ts?;
        Some(RunStatsOut {
            duration_secs: round2(self.last_ts - first + self.first_interval),
            process_cpu_usage: self.cpu.stat(),
            process_memory_mib: self.memory.stat(),
            process_gpu_usage: self.gpu.stat(),
            process_gpu_vram_mib: self.vram.stat(),
            process_gpu_utilized: self.gpus.stat(),
            system_disk_space_used_gb: self.disk_used_gb.stat().map(|s| s.max),
            system_net_recv_bytes: self.net_recv,
            system_net_sent_bytes: self.net_sent,
        })
    }

    pub fn recommendation(&self) -> Option<Recommendation> {
        self.first_ts?;
        let gpu = if self.gpu.mean() > 0.0 {
            round_even(self.gpu.max).max(1.0) as u64
        } else {
            0
        };
        let vram = if self.vram.max > 0.0 {
            round_memory(self.vram.max * 1.2)
        } else {
            0
        };
        // The system's mean far above the tree's: something else uses the server.
        let checks = [
            (&self.sys_cpu, &self.cpu, 1.25, 0.25),
            (&self.sys_memory, &self.memory, 1.5, 512.0),
            (&self.sys_gpu, &self.gpu, 1.25, 0.2),
            (&self.sys_vram, &self.vram, 1.25, 512.0),
        ];
        let shared = checks.iter().any(|(sys, proc_, pct, abs)| {
            sys.n > 0 && proc_.n > 0 && {
                let (s, p) = (sys.mean(), proc_.mean());
                s > p * pct || s > p + abs
            }
        });
        let cpu = round_even(self.cpu.mean()).max(1.0) as u64;
        let memory_mib = round_memory(self.memory.max * 1.2);
        Some(Recommendation {
            cpu,
            memory_mib,
            gpu,
            vram_mib: vram,
            memory_source: if self.pss { "pss" } else { "rss" },
            allocation: if shared { "shared" } else { "dedicated" },
            metaflow: if gpu > 0 {
                format!("@resources(cpu={cpu}, memory={memory_mib}, gpu={gpu})")
            } else {
                format!("@resources(cpu={cpu}, memory={memory_mib})")
            },
        })
    }
}

/// 128, 256, 512, 1024, 2048 MiB, then whole GiB, rounded up.
pub fn round_memory(mib: f64) -> u64 {
    match mib {
        m if m <= 128.0 => 128,
        m if m <= 256.0 => 256,
        m if m <= 512.0 => 512,
        m if m <= 1024.0 => 1024,
        m if m <= 2048.0 => 2048,
        m => 1024 * (m / 1024.0).ceil() as u64,
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct MeanMax {
    pub mean: f64,
    pub max: f64,
}

/// The Python package's `stats()`, per column (rounded to 2 places).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct RunStatsOut {
    /// Last sample's time − first's + the first interval.
    pub duration_secs: f64,
    /// Cores.
    pub process_cpu_usage: Option<MeanMax>,
    /// PSS with `--pss`, else RSS.
    pub process_memory_mib: Option<MeanMax>,
    pub process_gpu_usage: Option<MeanMax>,
    pub process_gpu_vram_mib: Option<MeanMax>,
    pub process_gpu_utilized: Option<MeanMax>,
    pub system_disk_space_used_gb: Option<f64>,
    pub system_net_recv_bytes: u64,
    pub system_net_sent_bytes: u64,
}

/// The resources the run needs.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Recommendation {
    /// max(1, round(mean cores)).
    pub cpu: u64,
    /// The tree's peak memory × 1.2, rounded up to 128/256/512/1024/2048 MiB or whole GiB.
    pub memory_mib: u64,
    /// max(1, round(peak GPUs)) when the tree used a GPU, else 0.
    pub gpu: u64,
    /// Peak VRAM × 1.2, rounded as memory; 0 without.
    pub vram_mib: u64,
    /// `rss` or `pss` (with `--pss`): what the memory figures are.
    pub memory_source: &'static str,
    /// `shared` when the system's mean use is well above the tree's (CPU, memory,
    /// GPU or VRAM), else `dedicated`.
    pub allocation: &'static str,
    /// The same as Metaflow's decorator.
    pub metaflow: String,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::sample::{CpuSample, MemorySample, NetworkSample, ProcessSample};

    fn sample(ts: f64, cores: f64, rss: f64, sys_cores: f64, rx: u64) -> Sample {
        Sample {
            timestamp_secs: ts,
            interval_secs: 1.0,
            cpu: CpuSample {
                process_cores_used: Some(cores),
                utilization_pct: Some(sys_cores),
                ..Default::default()
            },
            memory: MemorySample {
                unavailable_mib: Some(rss + 100.0),
                ..Default::default()
            },
            network: vec![NetworkSample {
                rx_bytes: Some(rx),
                tx_bytes: Some(1),
                ..Default::default()
            }],
            process: Some(ProcessSample {
                memory_rss_mib: rss,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// Hand-computed: cores 1.5, 2.5, 3.0 → mean 2.333…, max 3; RSS 900, 1000,
    /// 950 MiB → max 1000 × 1.2 = 1200 → 2048 MiB.
    #[test]
    fn hand_computed() {
        let mut u = UsageAccum::default();
        for (i, (c, r)) in [(1.5, 900.0), (2.5, 1000.0), (3.0, 950.0)]
            .into_iter()
            .enumerate()
        {
            u.add(&sample(100.0 + i as f64, c, r, c + 0.1, 10));
        }
        let s = u.stats().unwrap();
        assert_eq!(s.duration_secs, 3.0);
        assert_eq!(
            s.process_cpu_usage,
            Some(MeanMax {
                mean: 2.33,
                max: 3.0
            })
        );
        assert_eq!(
            s.process_memory_mib,
            Some(MeanMax {
                mean: 950.0,
                max: 1000.0
            })
        );
        assert_eq!((s.system_net_recv_bytes, s.system_net_sent_bytes), (30, 3));
        assert_eq!(s.process_gpu_usage, None);
        let r = u.recommendation().unwrap();
        assert_eq!((r.cpu, r.memory_mib, r.gpu, r.vram_mib), (2, 2048, 0, 0));
        assert_eq!(r.allocation, "dedicated");
        assert_eq!(r.metaflow, "@resources(cpu=2, memory=2048)");
        // The system far busier than the tree: shared.
        let mut u = UsageAccum::default();
        u.add(&sample(1.0, 0.5, 100.0, 1.5, 0));
        assert_eq!(u.recommendation().unwrap().allocation, "shared");
    }

    #[test]
    fn python_rounding() {
        assert_eq!(round_even(2.5), 2.0);
        assert_eq!(round_even(3.5), 4.0);
        assert_eq!(round_even(0.4), 0.0);
        assert_eq!(round2(2.675), 2.67); // binary 2.67499…, as Python
        for (mib, want) in [
            (68.0, 128),
            (128.0, 128),
            (129.0, 256),
            (896.0, 1024),
            (2048.0, 2048),
            (2049.0, 3072),
            (3863.0, 4096),
            (4096.0, 4096),
        ] {
            assert_eq!(round_memory(mib), want, "{mib}");
        }
    }

    #[test]
    fn no_tree_no_stats() {
        let mut u = UsageAccum::default();
        u.add(&Sample::default());
        assert!(u.stats().is_none() && u.recommendation().is_none());
    }
}
