//! The run's statistics and the resources it would need, by the rules of the
//! Python resource-tracker 0.5.0's `stats()`, `recommend_resources()` and server
//! allocation check (without its memory unit slip, which divides MiB by 1024 once
//! more and so recommends 128 MiB for any real job).

use std::collections::BTreeMap;

use serde::Serialize;

use super::sample::{MemorySource, NetworkSample, Sample};

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

/// The tree's use of CPU over time: seconds spent at each level of cores used
/// (per sample interval, to the hundredth of a core), which is what a prediction
/// under fewer CPUs needs, in memory bounded by the levels seen rather than by the
/// run's length.
#[derive(Clone, Debug, Default)]
struct CpuProfile {
    secs_at: BTreeMap<u32, f64>,
}

impl CpuProfile {
    fn add(&mut self, secs: f64, cores: Option<f64>) {
        let Some(c) = cores.filter(|c| c.is_finite() && *c >= 0.0) else {
            return;
        };
        if secs.is_finite() && secs > 0.0 {
            // Past any machine (recorded files are outside data) stays at the ceiling.
            let level = (c * 100.0).round().min(f64::from(u32::MAX)) as u32;
            *self.secs_at.entry(level).or_default() += secs;
        }
    }

    fn merge(&mut self, other: &CpuProfile) {
        for (level, secs) in &other.secs_at {
            *self.secs_at.entry(*level).or_default() += secs;
        }
    }

    /// The run's time under `cpus` CPUs ÷ its measured time: each interval's work
    /// (cores × seconds) done at no more than `cpus` cores, the rest of its time as
    /// it was. 1.0 when nothing was recorded.
    fn slowdown(&self, cpus: f64) -> f64 {
        let (mut was, mut would) = (0.0, 0.0);
        for (&level, &secs) in &self.secs_at {
            let cores = f64::from(level) / 100.0;
            was += secs;
            would += secs * (cores / cpus).max(1.0);
        }
        if was > 0.0 {
            would / was
        } else {
            1.0
        }
    }

    /// The most cores the tree used in any interval, rounded up to whole CPUs.
    fn peak_cpus(&self) -> u64 {
        self.secs_at
            .keys()
            .next_back()
            .map_or(1, |&l| (u64::from(l)).div_ceil(100).max(1))
    }

    /// The fewest whole CPUs that keep the predicted slowdown within `within`
    /// (1.05: 5 %), never more than the peak.
    fn cpus_within(&self, within: f64) -> u64 {
        let peak = self.peak_cpus();
        (1..peak)
            .find(|&n| self.slowdown(n as f64) <= within)
            .unwrap_or(peak)
    }
}

/// Accumulated over a run's samples.
#[derive(Clone, Debug, Default)]
pub struct UsageAccum {
    first_ts: Option<f64>,
    last_ts: f64,
    first_interval: f64,
    cpu: Column,
    cpu_profile: CpuProfile,
    memory: Column,
    /// The cgroup's own peak, when it is the source: between samples too.
    memory_peak: f64,
    /// The last sample's memory source; runs of different sources are not combined.
    memory_source: Option<MemorySource>,
    /// The charge less its inactive page cache, where the cgroup's parts are known.
    working_set: Column,
    /// Page cache charged to the cgroup.
    page_cache: Column,
    /// The highest working set: the samples' and, between them, the cgroup's peak
    /// so far less the most page cache a sample saw so far (a peak between samples
    /// is held without its parts; an early peak of anonymous memory stays in it
    /// when page cache grows later).
    working_set_peak: f64,
    /// What the tree read through system calls and what it read from storage,
    /// MiB, where the cgroup's parts are known (Σ `rchar_bytes`, Σ `read_bytes`):
    /// the difference is page cache it read back, and pipes and sockets, which
    /// the kernel counts alike.
    rchar: f64,
    storage_read: f64,
    /// The highest charge but its page cache: the samples' and, between them,
    /// the cgroup's peak so far less the most page cache seen so far.
    nonfile_peak: f64,
    /// Set by `combine`: the most page cache any run read back beyond its
    /// working set.
    reread_beyond: Option<f64>,
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
    /// The samples' intervals added up: each is measured on the monotonic
    /// clock, so a step of the wall clock (which moves the timestamps) leaves the
    /// duration as it was.
    elapsed: f64,
    /// Set by `combine`: the mean of the runs' durations.
    duration: Option<f64>,
}

impl Column {
    /// The runs' means as the values of one column: its mean is the mean of the
    /// means, its max the max of the maxes.
    fn of_runs<'a>(cols: impl Iterator<Item = &'a Column>) -> Column {
        let mut c = Column::default();
        for r in cols.filter(|r| r.n > 0) {
            c.max = if c.n == 0 { r.max } else { c.max.max(r.max) };
            c.n += 1;
            c.sum += r.mean();
        }
        c
    }
}

impl UsageAccum {
    /// Several runs of one job as one, by the Python package's rules across runs:
    /// mean of the means and of the durations, max of the maxes and of the sums.
    /// Only runs whose memory was measured the way the first run's was are
    /// combined (a cgroup's charge, Σ PSS and Σ RSS differ by up to several times
    /// on the same job): the caller says which were left out (`same_memory`).
    pub fn combine(runs: &[&UsageAccum]) -> UsageAccum {
        let runs: Vec<&UsageAccum> = runs
            .iter()
            .copied()
            .filter(|r| r.first_ts.is_some())
            .collect();
        let Some(first) = runs.first() else {
            return UsageAccum::default();
        };
        let runs: Vec<&UsageAccum> = runs
            .iter()
            .copied()
            .filter(|r| r.same_memory(first))
            .collect();
        let col = |f: fn(&UsageAccum) -> &Column| Column::of_runs(runs.iter().map(|r| f(r)));
        let durations: Vec<f64> = runs.iter().map(|r| r.duration_secs()).collect();
        UsageAccum {
            first_ts: first.first_ts,
            last_ts: first.last_ts,
            first_interval: first.first_interval,
            cpu: col(|r| &r.cpu),
            cpu_profile: runs.iter().fold(CpuProfile::default(), |mut p, r| {
                p.merge(&r.cpu_profile);
                p
            }),
            memory: col(|r| &r.memory),
            memory_peak: runs.iter().map(|r| r.memory_peak).fold(0.0, f64::max),
            memory_source: first.memory_source,
            // Every run's, or none: a run without the parts (recorded before
            // them) must not be left out of the advice.
            working_set: if runs.iter().all(|r| r.working_set.n > 0) {
                col(|r| &r.working_set)
            } else {
                Column::default()
            },
            page_cache: col(|r| &r.page_cache),
            working_set_peak: runs.iter().map(|r| r.working_set_peak).fold(0.0, f64::max),
            rchar: 0.0,
            storage_read: 0.0,
            nonfile_peak: runs.iter().map(|r| r.nonfile_peak).fold(0.0, f64::max),
            reread_beyond: Some(runs.iter().map(|r| r.reread_beyond()).fold(0.0, f64::max)),
            gpu: col(|r| &r.gpu),
            vram: col(|r| &r.vram),
            gpus: col(|r| &r.gpus),
            disk_used_gb: col(|r| &r.disk_used_gb),
            net_recv: runs.iter().map(|r| r.net_recv).max().unwrap_or(0),
            net_sent: runs.iter().map(|r| r.net_sent).max().unwrap_or(0),
            sys_cpu: col(|r| &r.sys_cpu),
            sys_memory: col(|r| &r.sys_memory),
            sys_gpu: col(|r| &r.sys_gpu),
            sys_vram: col(|r| &r.sys_vram),
            elapsed: 0.0,
            duration: Some(durations.iter().sum::<f64>() / durations.len() as f64),
        }
    }

    /// The run's duration: its samples' intervals added up; from the
    /// timestamps only for recordings whose samples carry no interval.
    fn duration_secs(&self) -> f64 {
        self.duration.unwrap_or_else(|| {
            if self.elapsed > 0.0 {
                return self.elapsed;
            }
            self.first_ts
                .map_or(0.0, |f| self.last_ts - f + self.first_interval)
        })
    }

    /// Whether `other`'s memory figures were measured the same way.
    pub fn same_memory(&self, other: &UsageAccum) -> bool {
        self.memory_source == other.memory_source
    }

    pub fn memory_source(&self) -> Option<MemorySource> {
        self.memory_source
    }

    /// Whether a sample of a tracked tree was added.
    pub fn has_tree(&self) -> bool {
        self.first_ts.is_some()
    }

    pub fn add(&mut self, s: &Sample) {
        let Some(p) = &s.process else { return };
        if self.first_ts.is_none() {
            self.first_ts = Some(s.timestamp_secs);
            self.first_interval = s.interval_secs;
        }
        self.last_ts = s.timestamp_secs;
        if s.interval_secs.is_finite() && s.interval_secs > 0.0 {
            self.elapsed += s.interval_secs;
        }
        self.cpu.add(s.cpu.process_cores_used);
        self.cpu_profile
            .add(s.interval_secs, s.cpu.process_cores_used);
        self.memory.add(Some(p.memory_mib));
        if let Some(peak) = p.memory_peak_mib {
            self.memory_peak = self.memory_peak.max(peak);
        }
        self.memory_source = MemorySource::named(p.memory_source);
        if let Some(ws) = p.memory_working_set_mib.filter(|w| w.is_finite()) {
            self.working_set.add(Some(ws));
            self.page_cache.add(p.memory_page_cache_mib);
            let peak = p.memory_peak_mib.unwrap_or(p.memory_mib);
            let between = peak - self.page_cache.max;
            self.working_set_peak = self.working_set_peak.max(ws).max(between);
            let nonfile = p.memory_mib - p.memory_page_cache_mib.unwrap_or(0.0);
            self.nonfile_peak = self.nonfile_peak.max(nonfile).max(between);
            self.rchar += p.rchar_bytes as f64 / 1048576.0;
            self.storage_read += p.read_bytes as f64 / 1048576.0;
        }
        // Σ PSS and Σ RSS are seen at samples only: the largest RSS a member
        // reached (between samples too, carried by every sample) is a floor of the
        // peak, for the statistics and the advice alike, whether the samples come
        // from the run or from its recorded file.
        if matches!(
            self.memory_source,
            Some(MemorySource::Pss | MemorySource::Rss)
        ) {
            self.floor_peak(p.max_process_rss_mib);
        }
        self.gpu.add(p.gpu_usage);
        self.vram.add(p.gpu_vram_mib);
        self.gpus.add(p.gpu_utilized.map(|g| g as f64));
        let (total, avail) = s.disk_space();
        self.disk_used_gb
            .add(Some(total.saturating_sub(avail) as f64 / 1e9));
        // Recorded files are outside data: a sum past u64 stays at its ceiling.
        let sum = |f: fn(&NetworkSample) -> Option<u64>| {
            s.network
                .iter()
                .filter_map(f)
                .fold(0u64, u64::saturating_add)
        };
        self.net_recv = self.net_recv.saturating_add(sum(|n| n.rx_bytes));
        self.net_sent = self.net_sent.saturating_add(sum(|n| n.tx_bytes));
        self.sys_cpu.add(s.cpu.utilization_pct);
        self.sys_memory.add(s.memory.unavailable_mib);
        if !s.gpu.is_empty() {
            let (busy, vram) = s.gpu_totals();
            self.sys_gpu.add(Some(busy));
            self.sys_vram.add(Some(vram));
        }
    }

    /// A peak the samples did not see (a member's largest RSS, reached between
    /// two samples): the statistics' maximum and the advice hold it too.
    fn floor_peak(&mut self, mib: f64) {
        if mib.is_finite() {
            self.memory_peak = self.memory_peak.max(mib);
        }
    }

    /// None without a tracked tree's sample.
    pub fn stats(&self) -> Option<RunStatsOut> {
        self.first_ts?;
        Some(RunStatsOut {
            duration_secs: round2(self.duration_secs()),
            process_cpu_usage: self.cpu.stat(),
            process_memory_mib: self.memory.stat().map(|m| MeanMax {
                max: round2(self.memory_max()),
                ..m
            }),
            process_memory_working_set_mib: self.working_set.stat().map(|m| MeanMax {
                max: round2(self.working_set_peak),
                ..m
            }),
            page_cache_reread_mib: (self.working_set.n > 0).then(|| round2(self.reread_beyond())),
            process_gpu_usage: self.gpu.stat(),
            process_gpu_vram_mib: self.vram.stat(),
            process_gpu_utilized: self.gpus.stat(),
            system_disk_space_used_gb: self.disk_used_gb.stat().map(|s| s.max),
            system_net_recv_bytes: self.net_recv,
            system_net_sent_bytes: self.net_sent,
        })
    }

    /// The highest memory the samples saw, or the cgroup's own peak between them.
    fn memory_max(&self) -> f64 {
        self.memory.max.max(self.memory_peak)
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
        // The seed's rule, never above the most the tree used at once.
        let cpu = (round_even(self.cpu.mean()).max(1.0) as u64).min(self.cpu_profile.peak_cpus());
        let memory = self.memory_basis();
        let memory_mib = round_memory(memory.peak_mib * MEMORY_MARGIN);
        let slowdown = self.cpu_profile.slowdown(cpu as f64);
        Some(Recommendation {
            memory_basis: memory.name,
            memory_basis_mib: round2(memory.peak_mib),
            page_cache_reread_mib: memory.page_cache_mib.map(|_| round2(memory.reread_mib)),
            memory_without_reread_mib: round_memory(memory.working_set_mib * MEMORY_MARGIN),
            page_cache_peak_mib: memory.page_cache_mib.map(round2),
            basis: memory.explain(memory_mib, cpu, slowdown),
            cpu,
            cpu_slowdown: round2(slowdown),
            predicted_duration_secs: round2(self.duration_secs() * slowdown),
            cpu_within_5pct: self.cpu_profile.cpus_within(1.05),
            memory_mib,
            gpu,
            vram_mib: vram,
            memory_source: self.memory_source.unwrap_or(MemorySource::Rss).as_str(),
            allocation: if shared { "shared" } else { "dedicated" },
            metaflow: metaflow(cpu, memory_mib, gpu),
        })
    }
}

/// The recommendation as Metaflow's decorator.
fn metaflow(cpu: u64, memory_mib: u64, gpu: u64) -> String {
    if gpu > 0 {
        format!("@resources(cpu={cpu}, memory={memory_mib}, gpu={gpu})")
    } else {
        format!("@resources(cpu={cpu}, memory={memory_mib})")
    }
}

impl Recommendation {
    /// The run ran under a memory limit of `limit_mib` and the OOM killer ended a
    /// member: what it would have reached is not known, so the advice is the
    /// limit + 100 MiB or × 1.2, whichever is more (as the Vertical Pod Autoscaler
    /// grows a pod the OOM killer ended), when that is above what was measured.
    pub fn after_oom_kill(&mut self, limit_mib: f64) {
        let need = round_memory((limit_mib + 100.0).max(limit_mib * 1.2));
        // Only a measured advice above it stands; one the floor made equal
        // (128 MiB after a kill under 10 MiB) would hide the kill.
        if need < self.memory_mib {
            return;
        }
        self.basis = format!(
            "memory {need} MiB: the OOM killer ended a member under the {limit_mib:.0} MiB limit, so what it needs is not known: the limit + 100 MiB or ×1.2, whichever is more; as measured under the limit: {}",
            self.basis
        );
        self.memory_mib = need;
        self.memory_basis = "oom_kill";
        self.memory_basis_mib = limit_mib;
        self.metaflow = metaflow(self.cpu, need, self.gpu);
    }
}

/// What the memory advice is built on: the name of the figure, its peak and the
/// page cache it leaves out (MiB).
struct MemoryBasis {
    name: &'static str,
    /// The working set and the page cache read back.
    peak_mib: f64,
    working_set_mib: f64,
    reread_mib: f64,
    page_cache_mib: Option<f64>,
}

/// The advice's margin over its basis, as the Python package's (×1.2).
pub const MEMORY_MARGIN: f64 = 1.2;

/// What a `memory_basis` is, in a line's few words: the summary's line names the
/// advice's basis by it. `MemoryBasis::what` is the sentence's word for a measured
/// one; after an OOM kill `Recommendation::after_oom_kill` writes its own sentence.
pub fn basis_words(name: &str, reread_mib: f64) -> &'static str {
    match name {
        "working_set" if reread_mib >= 1.0 => "working set + page cache read back",
        "working_set" => "working set peak",
        "oom_kill" => "an OOM kill under the limit",
        "cgroup" => "cgroup peak",
        "pss" => "pss peak",
        _ => "rss peak",
    }
}

impl UsageAccum {
    /// The working set where the cgroup's parts are known: page cache is what a
    /// limit reclaims before it fails, so an I/O job's charge (a GiB of cache for
    /// a GiB read) is not what it needs. Else the source's peak (Σ PSS and Σ RSS
    /// hold no page cache that is not mapped).
    fn memory_basis(&self) -> MemoryBasis {
        if self.working_set.n > 0 {
            let reread = self.reread_beyond();
            MemoryBasis {
                name: "working_set",
                peak_mib: self.working_set_peak + reread,
                working_set_mib: self.working_set_peak,
                reread_mib: reread,
                page_cache_mib: Some(self.page_cache.max),
            }
        } else {
            MemoryBasis {
                name: self.memory_source.unwrap_or(MemorySource::Rss).as_str(),
                peak_mib: self.memory_max(),
                working_set_mib: self.memory_max(),
                reread_mib: 0.0,
                page_cache_mib: None,
            }
        }
    }

    /// The page cache the tree read back beyond its working set, MiB. What it
    /// read without storage I/O, at most the most page cache it had, is page cache
    /// it read back; the kernel's active list (in the working set) holds what it
    /// read twice lately, and the rest is added to the charge but its page cache.
    /// Under a limit below it those reads go to storage again, and writes that
    /// waited for an fsync are pushed out early: a job that writes a file and
    /// reads it back took 1.5–2.2× its time under any limit short of its whole
    /// cache (docs/advice.md). Pipes and sockets count as reads alike, so a
    /// pipeline may be given more than it needs, never less.
    fn reread_beyond(&self) -> f64 {
        if let Some(r) = self.reread_beyond {
            return r;
        }
        let reread = (self.rchar - self.storage_read)
            .max(0.0)
            .min(self.page_cache.max);
        (self.nonfile_peak + reread - self.working_set_peak).max(0.0)
    }
}

impl MemoryBasis {
    /// The measured figure, in `explain`'s sentence.
    fn what(&self) -> &'static str {
        match self.name {
            "working_set" => "working set (the cgroup's charge less inactive page cache)",
            "cgroup" => "cgroup charge",
            "pss" => "Σ PSS",
            _ => "Σ RSS",
        }
    }

    /// One sentence: which figures the advice is built on, and its price.
    fn explain(&self, memory_mib: u64, cpu: u64, slowdown: f64) -> String {
        let what = self.what();
        let mut s = format!(
            "memory {memory_mib} MiB: peak {what} {:.0} MiB",
            self.working_set_mib
        );
        if self.reread_mib >= 1.0 {
            s.push_str(&format!(
                " + {:.0} MiB of page cache it read back beyond it (under a smaller limit those reads go to storage again; {} MiB runs it that way)",
                self.reread_mib,
                round_memory(self.working_set_mib * MEMORY_MARGIN)
            ));
        }
        s.push_str(&format!(" ×{MEMORY_MARGIN}, at least 128 MiB"));
        if let Some(pc) = self.page_cache_mib.filter(|pc| *pc >= 1.0) {
            s.push_str(&format!(
                "; of up to {pc:.0} MiB of page cache, the rest is left out: a limit reclaims it"
            ));
        }
        s.push_str(&format!("; cpu {cpu}: the mean of the cores used"));
        if slowdown > 1.0 {
            s.push_str(&format!(", at {slowdown:.2}× the measured time"));
        }
        s
    }
}

/// Rounded up to at least 128 MiB, in steps of an eighth of the power of two
/// below (… 256, 288, 320 … 512, 576 … 1024, 1152 …), whole GiB past 8 GiB: at
/// most 12.5 % more. The Python package's steps (128, 256, 512, 1024, 2048) asked
/// for up to twice as much: 1.2 × 312 MiB became 512 MiB.
pub fn round_memory(mib: f64) -> u64 {
    if mib.is_nan() || mib <= 128.0 {
        return 128;
    }
    let step = (2f64.powi(mib.log2().floor() as i32) / 8.0).min(1024.0);
    ((mib / step).ceil() * step) as u64
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
    /// The tree's memory by its source (`memory_source`); the max includes the
    /// cgroup's own peak between samples.
    pub process_memory_mib: Option<MeanMax>,
    /// The working set (charge less inactive page cache) where the cgroup's parts
    /// are known; its max includes a peak between samples (the cgroup's peak less
    /// the most page cache seen). Null otherwise.
    pub process_memory_working_set_mib: Option<MeanMax>,
    /// The page cache the tree read back (what it read without storage I/O, at
    /// most the most page cache it had); null unless the working set is known.
    pub page_cache_reread_mib: Option<f64>,
    pub process_gpu_usage: Option<MeanMax>,
    pub process_gpu_vram_mib: Option<MeanMax>,
    pub process_gpu_utilized: Option<MeanMax>,
    pub system_disk_space_used_gb: Option<f64>,
    pub system_net_recv_bytes: u64,
    pub system_net_sent_bytes: u64,
}

/// The resources the run needs.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Recommendation {
    /// max(1, round(mean cores)), at most the peak's whole CPUs.
    pub cpu: u64,
    /// The run's predicted time under `cpu` CPUs ÷ its measured time (1.0: no
    /// slower), from the sample intervals' cores.
    pub cpu_slowdown: f64,
    /// The run's measured duration × `cpu_slowdown`, s.
    pub predicted_duration_secs: f64,
    /// The fewest CPUs that keep the predicted slowdown within 5 %.
    pub cpu_within_5pct: u64,
    /// `memory_basis_mib` × 1.2, rounded up by `round_memory` (at least 128).
    pub memory_mib: u64,
    /// What the memory advice is built on: `working_set` where the cgroup's parts
    /// are known (page cache left out), else `memory_source`'s figure; `oom_kill`
    /// when the run's memory limit killed a member (`Recommendation::after_oom_kill`).
    pub memory_basis: &'static str,
    /// The basis's peak, MiB.
    pub memory_basis_mib: f64,
    /// The most page cache charged to the tree; null unless the basis is
    /// `working_set`.
    pub page_cache_peak_mib: Option<f64>,
    /// The page cache the tree read back, in the basis; null unless the basis is
    /// `working_set`.
    pub page_cache_reread_mib: Option<f64>,
    /// The least it runs in: the working set × 1.2, its re-reads left to storage.
    pub memory_without_reread_mib: u64,
    /// One sentence: the figures the advice is built on and its price.
    pub basis: String,
    /// max(1, round(peak GPUs)) when the tree used a GPU, else 0.
    pub gpu: u64,
    /// Peak VRAM × 1.2, rounded as memory; 0 without.
    pub vram_mib: u64,
    /// `cgroup`, `pss` or `rss`: what the memory figures are.
    pub memory_source: &'static str,
    /// `shared` when the system's mean use is well above the tree's (CPU, memory,
    /// GPU or VRAM), else `dedicated`.
    pub allocation: &'static str,
    /// The same as Metaflow's decorator.
    pub metaflow: String,
}

/// The cheapest server that fits the recommendation, from Spare Cores Keeper
/// (`--recommend-server`), and what the run would cost on it.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ServerAdvice {
    /// The catalogue's query, as sent.
    pub query: String,
    /// None when nothing fits or Keeper could not be asked.
    pub server: Option<ServerOffer>,
    /// Why there is no answer: one line.
    pub error: Option<String>,
    /// The run on the recommended server: its on-demand price × the run's duration.
    pub run_cost_usd: Option<f64>,
    /// The current server's on-demand price, when the cloud and instance type are
    /// known (discovery) and Keeper lists it.
    pub current_price_usd_per_hour: Option<f64>,
    pub current_run_cost_usd: Option<f64>,
    /// (current − recommended) ÷ current × 100.
    pub savings_pct: Option<f64>,
}

/// One server of Keeper's catalogue.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ServerOffer {
    pub vendor_id: String,
    pub server_id: String,
    pub name: String,
    pub vcpus: Option<f64>,
    pub memory_gib: Option<f64>,
    pub gpu_count: Option<f64>,
    pub gpu_memory_gib: Option<f64>,
    /// Cheapest on-demand price over its regions.
    pub price_usd_per_hour: f64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::sample::{CpuSample, MemorySample, ProcessSample};

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
                memory_mib: rss,
                memory_source: "rss",
                memory_rss_mib: rss,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    /// A step of the wall clock moves the samples' timestamps, not their
    /// intervals (the monotonic clock's): the duration, and the prediction made
    /// from it, are the intervals'.
    #[test]
    fn a_wall_clock_step_leaves_the_duration_as_measured() {
        for step in [-3600.0, 3600.0] {
            let mut u = UsageAccum::default();
            for i in 0..6 {
                let ts = 100.0 + i as f64 + if i >= 3 { step } else { 0.0 };
                u.add(&sample(ts, 1.0, 100.0, 1.1, 0));
            }
            let s = u.stats().unwrap();
            assert_eq!(s.duration_secs, 6.0, "step {step}");
            let r = u.recommendation().unwrap();
            assert!(
                r.predicted_duration_secs >= 6.0 && r.predicted_duration_secs < 7.0,
                "step {step}: {}",
                r.predicted_duration_secs
            );
        }
    }

    /// Hand-computed: cores 1.5, 2.5, 3.0 → mean 2.333…, max 3; RSS 900, 1000,
    /// 950 MiB → max 1000 × 1.2 = 1200 → 1280 MiB.
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
        assert_eq!((r.cpu, r.memory_mib, r.gpu, r.vram_mib), (2, 1280, 0, 0));
        assert_eq!(r.allocation, "dedicated");
        assert_eq!(r.metaflow, "@resources(cpu=2, memory=1280)");
        // The system far busier than the tree: shared.
        let mut u = UsageAccum::default();
        u.add(&sample(1.0, 0.5, 100.0, 1.5, 0));
        assert_eq!(u.recommendation().unwrap().allocation, "shared");
    }

    /// Two cores for 1 s, then one for 2 s (mean 1.33 → 1 CPU): the first second's
    /// work takes two at one CPU, so 4 s for 3 s measured, 1.33×; 2 CPUs run it as
    /// measured.
    #[test]
    fn cpu_advice_states_its_slowdown() {
        let mut u = UsageAccum::default();
        for (i, c) in [2.0, 1.0, 1.0].into_iter().enumerate() {
            u.add(&sample(100.0 + i as f64, c, 100.0, c, 0));
        }
        let r = u.recommendation().unwrap();
        assert_eq!(r.cpu, 1);
        assert_eq!(r.cpu_slowdown, 1.33);
        assert_eq!(r.predicted_duration_secs, 4.0);
        assert_eq!(r.cpu_within_5pct, 2);
        // A flat job: no slowdown, and the advice is its level.
        let mut u = UsageAccum::default();
        for i in 0..5 {
            u.add(&sample(100.0 + i as f64, 3.0, 100.0, 3.0, 0));
        }
        let r = u.recommendation().unwrap();
        assert_eq!((r.cpu, r.cpu_slowdown, r.cpu_within_5pct), (3, 1.0, 3));
        // A short burst: 4 cores for 1 s of 40 at 1 core. The mean (1.075) says 1
        // CPU at 1.075× (1.07 as Python rounds the binary value); 2 CPUs keep it
        // within 5 % (1.025×), fewer than the peak's 4.
        let mut u = UsageAccum::default();
        for i in 0..40 {
            let c = if i == 0 { 4.0 } else { 1.0 };
            u.add(&sample(100.0 + i as f64, c, 100.0, c, 0));
        }
        let r = u.recommendation().unwrap();
        assert_eq!((r.cpu, r.cpu_slowdown, r.cpu_within_5pct), (1, 1.07, 2));
        // Runs combine their time at each level: 1 s at two cores and 3 s at one
        // (means 1 and 1.33: 1 CPU), so (2 + 3) ÷ 4 at one CPU.
        let (mut a, mut b) = (UsageAccum::default(), UsageAccum::default());
        a.add(&sample(1.0, 1.0, 100.0, 1.0, 0));
        for (i, c) in [2.0, 1.0, 1.0].into_iter().enumerate() {
            b.add(&sample(1.0 + i as f64, c, 100.0, c, 0));
        }
        let r = UsageAccum::combine(&[&a, &b]).recommendation().unwrap();
        assert_eq!((r.cpu, r.cpu_slowdown), (1, 1.25));
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
            (129.0, 144),
            (1.2 * 312.0, 384),
            (896.0, 896),
            (2048.0, 2048),
            (2049.0, 2304),
            (3863.0, 4096),
            (4096.0, 4096),
            (9000.0, 9216),
            (f64::NAN, 128),
        ] {
            assert_eq!(round_memory(mib), want, "{mib}");
        }
    }

    /// Two runs: cores means 1 and 3 → 2; RSS peaks 1000 and 3000 → 3000 × 1.2 =
    /// 3600 → 3840 MiB; durations 3 and 1 → 2; received 30 and 10 → 30.
    #[test]
    fn runs_combine_by_mean_of_means_and_max_of_maxes() {
        let mut a = UsageAccum::default();
        for i in 0..3 {
            a.add(&sample(10.0 + i as f64, 1.0, 1000.0, 1.1, 10));
        }
        let mut b = UsageAccum::default();
        b.add(&sample(50.0, 3.0, 3000.0, 3.1, 10));
        let c = UsageAccum::combine(&[&a, &b, &UsageAccum::default()]);
        let s = c.stats().unwrap();
        assert_eq!(s.duration_secs, 2.0);
        assert_eq!(
            s.process_cpu_usage,
            Some(MeanMax {
                mean: 2.0,
                max: 3.0
            })
        );
        assert_eq!(s.system_net_recv_bytes, 30);
        let r = c.recommendation().unwrap();
        assert_eq!((r.cpu, r.memory_mib), (2, 3840));
        assert!(UsageAccum::combine(&[]).stats().is_none());
    }

    /// A run measured by Σ RSS (4× the memory of the same job in a cgroup) is never
    /// combined with runs measured by the cgroup: the first run's source decides.
    #[test]
    fn runs_of_another_memory_source_are_not_combined() {
        let run = |mib: f64, source: &'static str| {
            let mut u = UsageAccum::default();
            let mut s = sample(10.0, 1.0, mib, 1.1, 0);
            if let Some(p) = s.process.as_mut() {
                p.memory_source = source;
            }
            u.add(&s);
            u
        };
        let (now, before, rss) = (
            run(310.0, "cgroup"),
            run(300.0, "cgroup"),
            run(1200.0, "rss"),
        );
        let c = UsageAccum::combine(&[&now, &rss, &before]);
        let r = c.recommendation().unwrap();
        assert_eq!((r.memory_source, r.memory_mib), ("cgroup", 384));
        assert_eq!(c.stats().unwrap().process_memory_mib.unwrap().max, 310.0);
        let report = crate::model::report::combine(&[&now, &rss, &before]);
        assert_eq!((report.runs, report.memory_left_out), (2, 1));
    }

    /// A cgroup's charge of 1,100 MiB of which 1,000 is page cache (900 of it
    /// inactive): the advice is built on the working set, 200 MiB × 1.2 = 240
    /// MiB, with the page cache named. A charge peak of 400 MiB between two
    /// samples, before the cache grew, is held less the most cache seen by then
    /// (350 × 1.2 = 420 → 448 MiB).
    #[test]
    fn memory_advice_is_built_on_the_working_set() {
        let cg = |ts: f64, charge: f64, peak: f64, cache: f64, inactive: f64| {
            let mut s = sample(ts, 1.0, charge, 1.0, 0);
            let p = s.process.as_mut().unwrap();
            p.memory_source = "cgroup";
            p.memory_peak_mib = Some(peak);
            p.memory_page_cache_mib = Some(cache);
            p.memory_working_set_mib = Some(charge - inactive);
            s
        };
        let mut u = UsageAccum::default();
        u.add(&cg(1.0, 150.0, 150.0, 50.0, 40.0));
        u.add(&cg(2.0, 1100.0, 1100.0, 1000.0, 900.0));
        let r = u.recommendation().unwrap();
        assert_eq!((r.memory_basis, r.memory_basis_mib), ("working_set", 200.0));
        assert_eq!((r.memory_mib, r.page_cache_peak_mib), (240, Some(1000.0)));
        assert!(
            r.basis
                .contains("of up to 1000 MiB of page cache, the rest"),
            "{}",
            r.basis
        );
        assert_eq!(
            (r.page_cache_reread_mib, r.memory_without_reread_mib),
            (Some(0.0), 240)
        );
        let st = u.stats().unwrap();
        assert_eq!(st.process_memory_mib.unwrap().max, 1100.0);
        assert_eq!(st.process_memory_working_set_mib.unwrap().max, 200.0);
        // 700 MiB read without storage I/O (a file written, then read back): the
        // charge but its cache (100) + 700 = 800 MiB, 600 beyond the working set;
        // × 1.2 = 960 MiB; 240 runs it reading from storage.
        let mut u = UsageAccum::default();
        let mut s = cg(1.0, 1100.0, 1100.0, 1000.0, 900.0);
        s.process.as_mut().unwrap().rchar_bytes = 700 << 20;
        u.add(&s);
        let r = u.recommendation().unwrap();
        assert_eq!((r.memory_basis_mib, r.memory_mib), (800.0, 960));
        assert_eq!(
            (r.page_cache_reread_mib, r.memory_without_reread_mib),
            (Some(600.0), 240)
        );
        assert!(
            r.basis.contains("+ 600 MiB of page cache it read back"),
            "{}",
            r.basis
        );
        // Page cache the kernel keeps active is in the working set already: 700
        // read back, 750 active (working set 850): nothing beyond it.
        let mut u = UsageAccum::default();
        let mut a = cg(1.0, 1100.0, 1100.0, 1000.0, 250.0);
        a.process.as_mut().unwrap().rchar_bytes = 700 << 20;
        u.add(&a);
        assert_eq!(u.recommendation().unwrap().memory_basis_mib, 850.0);
        // Reads beyond the page cache it had (pipes) add at most that cache.
        s.process.as_mut().unwrap().rchar_bytes = 5000 << 20;
        let mut u = UsageAccum::default();
        u.add(&s);
        assert_eq!(u.recommendation().unwrap().memory_basis_mib, 1100.0);
        // Storage reads are not read back: 700 read, all of it from storage.
        s.process.as_mut().unwrap().read_bytes = 700 << 20;
        s.process.as_mut().unwrap().rchar_bytes = 700 << 20;
        let mut u = UsageAccum::default();
        u.add(&s);
        assert_eq!(u.recommendation().unwrap().memory_basis_mib, 200.0);
        // A peak between samples while the cache was small: 400 − 50.
        let mut u = UsageAccum::default();
        u.add(&cg(1.0, 150.0, 150.0, 50.0, 40.0));
        u.add(&cg(2.0, 150.0, 400.0, 50.0, 40.0));
        u.add(&cg(3.0, 1100.0, 1100.0, 1000.0, 900.0));
        let r = u.recommendation().unwrap();
        assert_eq!((r.memory_basis_mib, r.memory_mib), (350.0, 448));
        // Without the parts, the source's peak, as before.
        let mut u = UsageAccum::default();
        u.add(&sample(1.0, 1.0, 300.0, 1.0, 0));
        let r = u.recommendation().unwrap();
        assert_eq!(
            (r.memory_basis, r.memory_mib, r.page_cache_peak_mib),
            ("rss", 384, None)
        );
        // Runs combined: on the working set only where every run has it.
        let run = |with_parts: bool| {
            let mut u = UsageAccum::default();
            let mut s = cg(1.0, 1100.0, 1100.0, 1000.0, 900.0);
            if !with_parts {
                let p = s.process.as_mut().unwrap();
                (p.memory_working_set_mib, p.memory_page_cache_mib) = (None, None);
            }
            u.add(&s);
            u
        };
        let (a, b) = (run(true), run(false));
        let r = UsageAccum::combine(&[&a, &a]).recommendation().unwrap();
        assert_eq!((r.memory_basis, r.memory_mib), ("working_set", 240));
        let r = UsageAccum::combine(&[&a, &b]).recommendation().unwrap();
        assert_eq!((r.memory_basis, r.memory_mib), ("cgroup", 1408));
    }

    /// A run whose 64 MiB limit killed a member measured at most 64 MiB: the
    /// advice is the limit + 100 MiB (164 → 176), never the measured 128.
    #[test]
    fn an_oom_kill_under_a_limit_grows_the_advice_past_it() {
        let mut u = UsageAccum::default();
        u.add(&sample(1.0, 1.0, 64.0, 1.0, 0));
        let mut r = u.recommendation().unwrap();
        assert_eq!(r.memory_mib, 128);
        r.after_oom_kill(64.0);
        assert_eq!((r.memory_mib, r.memory_basis), (176, "oom_kill"));
        assert_eq!(r.metaflow, "@resources(cpu=1, memory=176)");
        assert!(
            r.basis.starts_with("memory 176 MiB: the OOM killer"),
            "{}",
            r.basis
        );
        // Past 500 MiB, × 1.2: 1000 → 1200 → 1280.
        r.after_oom_kill(1000.0);
        assert_eq!(r.memory_mib, 1280);
        // Never below what was measured.
        r.after_oom_kill(100.0);
        assert_eq!(r.memory_mib, 1280);
        // Under a limit so small that the advice's floor equals what the kill
        // asks (10 + 100 → 128): the basis names the kill all the same.
        let mut u = UsageAccum::default();
        u.add(&sample(1.0, 1.0, 10.0, 1.0, 0));
        let mut r = u.recommendation().unwrap();
        assert_eq!((r.memory_mib, r.memory_basis), (128, "rss"));
        r.after_oom_kill(10.0);
        assert_eq!(
            (r.memory_mib, r.memory_basis),
            (128, "oom_kill"),
            "{}",
            r.basis
        );
    }

    #[test]
    fn no_tree_no_stats() {
        let mut u = UsageAccum::default();
        u.add(&Sample::default());
        assert!(u.stats().is_none() && u.recommendation().is_none());
    }
}
