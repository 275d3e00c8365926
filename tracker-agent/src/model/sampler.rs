//! Turns consecutive engine readings into per-interval samples, and keeps the run
//! totals for the summary. Interval values are differences of cumulative counters,
//! so they add up to the run totals exactly.

use std::time::Instant;

use super::{
    degraded::Degradations,
    reading::{Backend, MemcgReading, OwnCost, Pressure, Reading, TreeTotals},
    sample::{CpuSample, MemorySource, ProcessSample, Sample, TrackerSample, TreeCompat},
    summary::RunStats,
};

const MIB: f64 = 1048576.0;

pub struct Sampler {
    /// Root pid and backend of the tracked tree; None for host-only sampling.
    tree: Option<(u32, Backend)>,
    job_name: Option<String>,
    prev: TreeTotals,
    prev_at: Instant,
    prev_self_cpu: f64,
    prev_bpf: Option<(u64, u64)>,
    /// The tree's cgroup's stall times at the previous sample (zero before the
    /// first: the cgroup was made for the command).
    prev_pressure: Pressure,
    /// Cumulative user/system split of cpu_ns, in ns.
    cum_user_ns: u64,
    cum_sys_ns: u64,
    /// Host steal only: `per_core_steal_time_pct` left empty (the Rust sibling's
    /// default).
    aggregate_steal: bool,
    /// Degradations the session knows of (eBPF unavailable), in every sample.
    degraded: Degradations,
    pub stats: RunStats,
}

impl Sampler {
    /// `own_cpu_secs`: the tracker's CPU so far, the origin of its per-sample cost.
    pub fn new(
        tree: Option<(u32, Backend)>,
        job_name: Option<String>,
        start: Instant,
        own_cpu_secs: f64,
    ) -> Self {
        Sampler {
            tree,
            job_name,
            prev: TreeTotals::default(),
            prev_at: start,
            prev_self_cpu: own_cpu_secs,
            prev_bpf: None,
            prev_pressure: Pressure::default(),
            cum_user_ns: 0,
            cum_sys_ns: 0,
            aggregate_steal: true,
            degraded: Degradations::default(),
            stats: RunStats::default(),
        }
    }

    /// Whether steal is given per core too (`false`) or for the host only.
    pub fn aggregate_steal(mut self, on: bool) -> Self {
        self.aggregate_steal = on;
        self
    }

    /// Names what the session knows is not exact, for every sample.
    pub fn degraded(mut self, d: Degradations) -> Self {
        self.degraded = d;
        self
    }

    /// Adds (or updates) a degradation the session learnt of mid-run.
    pub fn degrade(&mut self, name: &'static str, detail: String) {
        self.degraded.set(name, detail);
    }

    /// Sets the baseline without emitting. A tree the tracker started begins at zero
    /// (its first instructions belong to the first interval), so only an attached tree
    /// gets `tree`; the BPF counters always need one.
    pub fn baseline(&mut self, tree: Option<TreeTotals>, bpf: Option<(u64, u64)>) {
        if let Some(t) = tree {
            self.stats.origin = t.clone();
            self.prev = t;
        }
        self.prev_bpf = bpf;
    }

    /// The sample of the interval that ends with `r`.
    /// The tracker's own part of the interval that ends with `now`: its CPU, the
    /// BPF programs' run time, events lost, and what is no longer exact.
    fn tracker_sample(
        &mut self,
        now: &TreeTotals,
        own: &OwnCost,
        bpf: Option<(u64, u64)>,
    ) -> TrackerSample {
        let d_self = (own.cpu_secs - self.prev_self_cpu).max(0.0);
        self.prev_self_cpu = own.cpu_secs;
        let (bpf_time, bpf_count) = match (bpf, self.prev_bpf) {
            (Some((c, t)), Some((pc, pt))) => (
                Some(t.saturating_sub(pt) as f64 / 1e9),
                Some(c.saturating_sub(pc)),
            ),
            _ => (None, None),
        };
        TrackerSample {
            cpu_secs: d_self,
            rss_mib: own.rss_mib,
            bpf_run_time_secs: bpf_time,
            bpf_run_count: bpf_count,
            lost_events: now.lost_events.saturating_sub(self.prev.lost_events),
            lost_events_total: now.lost_events,
            degraded: if now.degraded.is_empty() {
                self.degraded.list().to_vec()
            } else {
                let mut d = self.degraded.clone();
                d.merge(&now.degraded);
                d.into_vec()
            },
        }
    }

    /// The host's CPU with the tree's share and its figures under the Rust
    /// sibling's names.
    fn cpu_sample(
        &self,
        mut cpu: CpuSample,
        process: Option<&ProcessSample>,
        now: &TreeTotals,
        cores: f64,
    ) -> CpuSample {
        if let Some(p) = process {
            cpu.process_cores_used = Some(cores);
            cpu.process_child_count =
                Some(now.live_procs.saturating_sub(u64::from(now.root_alive)));
            cpu.tree = TreeCompat::of(p);
        }
        if self.aggregate_steal {
            if let Some(v) = &mut cpu.per_core_steal_time_pct {
                v.clear();
            }
        }
        cpu
    }

    pub fn step(&mut self, r: Reading) -> Sample {
        let Reading {
            tree: now,
            host,
            stamp,
            bpf,
            own,
            memcg,
            cpu_cgroup,
            pressure,
        } = r;
        let at = stamp.at;
        let elapsed = at.duration_since(self.prev_at).as_secs_f64().max(1e-9);
        let (d_cpu, d_user, d_sys) = split_cpu(&now, &self.prev);
        self.cum_user_ns += d_user;
        self.cum_sys_ns += d_sys;

        let tracker = self.tracker_sample(&now, &own, bpf);
        let d_self = tracker.cpu_secs;
        let rss_mib = now.rss_bytes as f64 / MIB;
        let pss_mib = now.pss_bytes.map(|b| b as f64 / MIB);
        let (memory_mib, memory_source, memory_peak_mib) = tree_memory(memcg, rss_mib, pss_mib);
        let cores = d_cpu as f64 / 1e9 / elapsed;
        let mut process = self.tree.map(|(root, backend)| ProcessSample {
            pid: root,
            backend: backend.as_str(),
            utime_secs: d_user as f64 / 1e9,
            stime_secs: d_sys as f64 / 1e9,
            cpu_secs_total: now.fig.cpu_ns.saturating_sub(self.stats.origin.fig.cpu_ns) as f64
                / 1e9,
            cpu_source: if cpu_cgroup {
                "cgroup"
            } else {
                backend.as_str()
            },
            processes_spawned: now.procs_spawned.saturating_sub(self.prev.procs_spawned),
            processes_exited: now.procs_exited.saturating_sub(self.prev.procs_exited),
            live_processes: now.live_procs,
            live_threads: now.live_threads,
            memory_mib,
            memory_source: memory_source.as_str(),
            memory_peak_mib,
            memory_rss_mib: rss_mib,
            memory_pss_mib: pss_mib,
            max_process_rss_mib: now.max_rss_kib as f64 / 1024.0,
            root_alive: now.root_alive,
            untracked_tasks: now.untracked_tasks,
            gpu_usage: host.process_gpu.map(|g| g.gpu_usage),
            gpu_vram_mib: host.process_gpu.map(|g| g.gpu_vram_mib),
            gpu_utilized: host.process_gpu.map(|g| g.gpu_utilized),
            ..Default::default()
        });
        if let Some(p) = &mut process {
            p.set_interval(&now.fig.since(&self.prev.fig));
            memory_parts(p, memcg);
            if let Some(now) = &pressure {
                stalled(p, now, &self.prev_pressure);
            }
        }
        let cpu = self.cpu_sample(host.cpu, process.as_ref(), &now, cores);
        let sample = Sample {
            // Microsecond precision, like the other timestamps.
            timestamp_secs: (stamp.unix * 1e6).round() / 1e6,
            interval_secs: elapsed,
            job_name: self.job_name.clone(),
            cpu,
            memory: host.memory,
            network: host.network,
            disk: host.disk,
            gpu: host.gpu,
            tracked_pid: process.as_ref().map(|p| p.pid),
            process,
            tracker,
            actual_interval_ms: (elapsed * 1e3).round() as u64,
            version: env!("CARGO_PKG_VERSION"),
        };
        self.stats
            .add(&sample, &now, self.cum_user_ns, self.cum_sys_ns, d_self);
        if let Some(p) = pressure {
            self.prev_pressure = p;
            self.stats.pressure = Some(p);
        }
        self.prev = now;
        self.prev_at = at;
        if bpf.is_some() {
            self.prev_bpf = bpf;
        }
        sample
    }
}

/// The charge's parts where the memory cgroup gives them, MiB.
fn memory_parts(p: &mut ProcessSample, memcg: Option<MemcgReading>) {
    let Some((c, m)) = memcg.and_then(|m| Some((m.current, m.parts?))) else {
        return;
    };
    let mib = |b: u64| Some(b as f64 / MIB);
    p.memory_anon_mib = mib(m.anon);
    p.memory_page_cache_mib = mib(m.file);
    p.memory_active_page_cache_mib = mib(m.active_file);
    p.memory_working_set_mib = mib(c.saturating_sub(m.inactive_file));
    p.memory_kernel_mib = mib(c.saturating_sub(m.anon + m.file));
}

/// Seconds stalled in the interval, from the stall-time totals now and before.
fn stalled(p: &mut ProcessSample, now: &Pressure, prev: &Pressure) {
    let secs = |a: u64, b: u64| Some(a.saturating_sub(b) as f64 / 1e6);
    p.cpu_pressure_secs = secs(now.cpu_some_us, prev.cpu_some_us);
    p.cpu_pressure_full_secs = now
        .cpu_full_us
        .and_then(|n| secs(n, prev.cpu_full_us.unwrap_or(0)));
    p.memory_pressure_secs = secs(now.memory_some_us, prev.memory_some_us);
    p.memory_pressure_full_secs = secs(now.memory_full_us, prev.memory_full_us);
    p.io_pressure_secs = secs(now.io_some_us, prev.io_some_us);
    p.io_pressure_full_secs = secs(now.io_full_us, prev.io_full_us);
}

/// The interval's exact CPU (ns) and its user and system parts: split by the tick
/// ratio of the interval, or of the whole run when the interval saw no tick (short
/// tasks), or all to user as the kernel does.
fn split_cpu(now: &TreeTotals, prev: &TreeTotals) -> (u64, u64, u64) {
    let (now, prev) = (&now.fig, &prev.fig);
    let d_cpu = now.cpu_ns.saturating_sub(prev.cpu_ns);
    let d_user_t = now.utime_ns.saturating_sub(prev.utime_ns);
    let d_sys_t = now.stime_ns.saturating_sub(prev.stime_ns);
    let (u, s) = if d_user_t + d_sys_t > 0 {
        (d_user_t, d_sys_t)
    } else {
        (now.utime_ns, now.stime_ns)
    };
    let d_sys = if u + s > 0 {
        ((d_cpu as u128 * s as u128) / (u + s) as u128) as u64
    } else {
        0
    };
    (d_cpu, d_cpu - d_sys, d_sys)
}

/// The tree's memory (MiB), where it comes from, and its peak: the command's
/// cgroup where there is one, else Σ PSS, else Σ RSS.
fn tree_memory(
    memcg: Option<MemcgReading>,
    rss_mib: f64,
    pss_mib: Option<f64>,
) -> (f64, MemorySource, Option<f64>) {
    match (memcg, pss_mib) {
        (Some(m), _) => (
            m.current as f64 / MIB,
            MemorySource::Cgroup,
            m.peak.map(|p| p as f64 / MIB),
        ),
        (None, Some(p)) => (p, MemorySource::Pss, None),
        (None, None) => (rss_mib, MemorySource::Rss, None),
    }
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;
    use crate::model::{HostReading, OwnCost, Stamp};

    const S: u64 = 1_000_000_000;

    fn tree(cpu_ns: u64, user_t: u64, sys_t: u64, write: u64) -> TreeTotals {
        TreeTotals {
            fig: tracker_common::Figures {
                cpu_ns,
                utime_ns: user_t,
                stime_ns: sys_t,
                write_bytes: write,
                ..Default::default()
            },
            procs_spawned: cpu_ns / S,
            live_procs: 2,
            root_alive: true,
            ..TreeTotals::default()
        }
    }

    fn at(
        start: Instant,
        secs: f64,
        t: TreeTotals,
        own_cpu: f64,
        bpf: Option<(u64, u64)>,
    ) -> Reading {
        Reading {
            tree: t,
            host: HostReading::default(),
            stamp: Stamp {
                at: start + Duration::from_secs_f64(secs),
                unix: 1000.0 + secs,
            },
            bpf,
            own: OwnCost {
                cpu_secs: own_cpu,
                rss_mib: 8.0,
            },
            memcg: None,
            cpu_cgroup: false,
            pressure: None,
        }
    }

    #[test]
    fn intervals_are_differences_that_add_up_to_the_totals() {
        let start = Instant::now();
        let mut s = Sampler::new(Some((7, Backend::Ebpf)), Some("j".into()), start, 1.0);
        s.baseline(None, Some((10, 100)));
        let readings = [
            (1.0, tree(2 * S, 10, 0, 4096), 1.001, (20, 150)),
            (2.0, tree(3 * S, 10, 10, 4096), 1.003, (25, 190)),
            (4.0, tree(7 * S, 20, 10, 10_000), 1.004, (30, 200)),
        ];
        let mut sum = (0.0, 0.0, 0u64, 0u64);
        let mut samples = Vec::new();
        for (secs, t, own, bpf) in readings {
            let x = s.step(at(start, secs, t, own, Some(bpf)));
            let p = x.process.clone().unwrap();
            sum.0 += p.utime_secs;
            sum.1 += p.stime_secs;
            sum.2 += p.write_bytes;
            sum.3 += p.processes_spawned;
            samples.push(x);
        }
        // Every interval's CPU is split by its own tick ratio.
        let p0 = samples[0].process.as_ref().unwrap();
        assert_eq!((p0.utime_secs, p0.stime_secs), (2.0, 0.0));
        let p1 = samples[1].process.as_ref().unwrap();
        assert_eq!((p1.utime_secs, p1.stime_secs), (0.0, 1.0));
        let p2 = samples[2].process.as_ref().unwrap();
        assert_eq!((p2.utime_secs, p2.stime_secs), (4.0, 0.0));
        assert_eq!(sum, (6.0, 1.0, 10_000, 7));
        assert_eq!(p2.cpu_secs_total, 7.0);
        // Cores over the measured interval, not the nominal one.
        assert_eq!(samples[2].cpu.process_cores_used, Some(2.0));
        assert_eq!(samples[2].interval_secs, 2.0);
        assert_eq!(samples[2].cpu.process_child_count, Some(1));
        // The tracker's own cost per interval; the BPF programs' likewise.
        assert!((samples[1].tracker.cpu_secs - 0.002).abs() < 1e-9);
        assert_eq!(samples[0].tracker.bpf_run_count, Some(10));
        assert_eq!(samples[2].tracker.bpf_run_time_secs, Some(10e-9));
        assert_eq!(samples[2].timestamp_secs, 1004.0);
        assert_eq!(samples[2].job_name.as_deref(), Some("j"));
        // The run's statistics agree with the samples.
        assert_eq!(s.stats.samples, 3);
        assert_eq!(s.stats.peak_cores, 2.0);
        assert_eq!((s.stats.user_ns, s.stats.sys_ns), (6 * S, S));
    }

    #[test]
    fn an_interval_without_ticks_splits_like_the_run() {
        let start = Instant::now();
        let mut s = Sampler::new(Some((7, Backend::Procfs)), None, start, 0.0);
        s.baseline(None, None);
        s.step(at(start, 1.0, tree(4 * S, 30, 10, 0), 0.0, None));
        // No tick in this interval: the run's 3:1 ratio.
        let x = s.step(at(start, 2.0, tree(8 * S, 30, 10, 0), 0.0, None));
        let p = x.process.unwrap();
        assert_eq!((p.utime_secs, p.stime_secs), (3.0, 1.0));
        // No tick ever: all user, as the kernel reports such tasks.
        let mut s = Sampler::new(Some((7, Backend::Procfs)), None, start, 0.0);
        let x = s.step(at(start, 1.0, tree(S / 2, 0, 0, 0), 0.0, None));
        let p = x.process.unwrap();
        assert_eq!((p.utime_secs, p.stime_secs), (0.5, 0.0));
        assert_eq!(x.tracker.bpf_run_count, None);
    }

    /// The session's degradations and the engine's are in every sample from the one
    /// they appear in, each name once, and the run's statistics keep the last list.
    #[test]
    fn degradations_are_named_in_every_sample_from_then_on() {
        use crate::model::degraded::{EBPF_PID_NAMESPACE, MAP_FULL};
        let start = Instant::now();
        let mut fixed = Degradations::default();
        fixed.set(EBPF_PID_NAMESPACE, "procfs");
        let mut s = Sampler::new(Some((7, Backend::Procfs)), None, start, 0.0).degraded(fixed);
        let names = |x: &Sample| {
            x.tracker
                .degraded
                .iter()
                .map(|d| d.name)
                .collect::<Vec<_>>()
        };
        let x = s.step(at(start, 1.0, tree(S, 1, 0, 0), 0.0, None));
        assert_eq!(names(&x), [EBPF_PID_NAMESPACE]);
        let mut t = tree(2 * S, 2, 0, 0);
        t.degraded.set(MAP_FULL, "1 task");
        let x = s.step(at(start, 2.0, t.clone(), 0.0, None));
        assert_eq!(names(&x), [EBPF_PID_NAMESPACE, MAP_FULL]);
        t.degraded.set(MAP_FULL, "2 tasks");
        let x = s.step(at(start, 3.0, t, 0.0, None));
        assert_eq!(x.tracker.degraded[1].detail, "2 tasks");
        assert_eq!(s.stats.degraded, x.tracker.degraded);
        // An exact run names nothing.
        let mut e = Sampler::new(Some((7, Backend::Ebpf)), None, start, 0.0);
        assert!(e
            .step(at(start, 1.0, tree(S, 1, 0, 0), 0.0, None))
            .tracker
            .degraded
            .is_empty());
    }

    /// The memory figure comes from the best source the reading has, each sample
    /// names it, and the summary's peak follows the run's source: the cgroup's own
    /// peak (a member's RSS is not the cgroup's charge), or Σ PSS with the largest
    /// single member's RSS as a floor.
    #[test]
    fn memory_by_its_source() {
        use crate::model::reading::MemcgReading;
        use crate::model::{RunStats, Summary};
        const MIB: u64 = 1 << 20;
        let start = Instant::now();
        let mem = |rss: u64, pss: Option<u64>, max_rss: u64| TreeTotals {
            rss_bytes: rss * MIB,
            pss_bytes: pss.map(|p| p * MIB),
            max_rss_kib: max_rss * 1024,
            live_procs: 4,
            root_alive: true,
            ..TreeTotals::default()
        };
        let summary = |st: &RunStats| Summary::build(st, 1.0, Some(0), "ebpf", None, Vec::new());
        // 300 MiB shared by four processes: Σ RSS 1200, the cgroup 310 now, 320 at
        // its peak between samples.
        let mut s = Sampler::new(Some((7, Backend::Ebpf)), None, start, 0.0);
        let mut r = at(start, 1.0, mem(1200, None, 300), 0.0, None);
        r.memcg = Some(MemcgReading {
            current: 310 * MIB,
            peak: Some(320 * MIB),
            parts: Some(crate::model::reading::MemParts {
                anon: 200 * MIB,
                file: 100 * MIB,
                active_file: 40 * MIB,
                inactive_file: 60 * MIB,
            }),
        });
        let p = s.step(r).process.unwrap();
        assert_eq!((p.memory_source, p.memory_mib), ("cgroup", 310.0));
        // The charge's parts: 200 anonymous, 100 page cache (60 of it inactive),
        // 10 the kernel's; the working set is 310 − 60.
        assert_eq!(
            (
                p.memory_anon_mib,
                p.memory_page_cache_mib,
                p.memory_working_set_mib,
                p.memory_kernel_mib
            ),
            (Some(200.0), Some(100.0), Some(250.0), Some(10.0))
        );
        assert_eq!(p.memory_peak_mib, Some(320.0));
        assert_eq!(p.memory_rss_mib, 1200.0);
        let sum = summary(&s.stats);
        assert_eq!(sum.memory_source, Some("cgroup"));
        assert_eq!((sum.peak_memory_mib, sum.peak_rss_sum_mib), (320.0, 1200.0));
        let rec = s.stats.usage.recommendation().unwrap();
        // Built on the working set: 250 (more than the peak 320 less the cache
        // 100) × 1.2 = 300 → 320.
        assert_eq!(
            (rec.memory_source, rec.memory_basis),
            ("cgroup", "working_set")
        );
        assert_eq!((rec.memory_basis_mib, rec.memory_mib), (250.0, 320));

        // Σ PSS; a member that reached 350 MiB between samples is the floor.
        let mut s = Sampler::new(Some((7, Backend::Ebpf)), None, start, 0.0);
        let p = s
            .step(at(start, 1.0, mem(1200, Some(305), 350), 0.0, None))
            .process
            .unwrap();
        assert_eq!((p.memory_source, p.memory_mib), ("pss", 305.0));
        assert_eq!(p.memory_peak_mib, None);
        let sum = summary(&s.stats);
        assert_eq!(
            (sum.memory_source, sum.peak_memory_mib),
            (Some("pss"), 350.0)
        );
        // The advice and the statistics hold that peak too: 350 × 1.2 = 420 → 448.
        let rec = s.stats.usage.recommendation().unwrap();
        assert_eq!((rec.memory_source, rec.memory_mib), ("pss", 448));
        let st = s.stats.usage.stats().unwrap();
        assert_eq!(st.process_memory_mib.unwrap().max, 350.0);

        // No member's PSS could be read beside live RSS: Σ RSS, named.
        let mut s = Sampler::new(Some((7, Backend::Procfs)), None, start, 0.0);
        let p = s
            .step(at(start, 1.0, mem(1200, None, 300), 0.0, None))
            .process
            .unwrap();
        assert_eq!((p.memory_source, p.memory_mib), ("rss", 1200.0));
        assert_eq!(p.memory_pss_mib, None);
    }

    #[test]
    fn an_attached_tree_counts_from_its_baseline() {
        let start = Instant::now();
        let mut s = Sampler::new(Some((7, Backend::Ebpf)), None, start, 0.0);
        s.baseline(Some(tree(50 * S, 0, 0, 1 << 20)), None);
        let x = s.step(at(start, 1.0, tree(51 * S, 0, 0, 1 << 20), 0.0, None));
        let p = x.process.unwrap();
        assert_eq!(
            (p.cpu_secs_total, p.utime_secs, p.write_bytes),
            (1.0, 1.0, 0)
        );
        assert_eq!(s.stats.origin.fig.cpu_ns, 50 * S);
        // Host only: no process part, no tree figures in cpu.
        let mut h = Sampler::new(None, None, start, 0.0);
        let x = h.step(at(start, 1.0, TreeTotals::default(), 0.0, None));
        assert!(x.process.is_none() && x.cpu.process_cores_used.is_none());
    }
}
