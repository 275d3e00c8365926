//! What the HTML report shows, built from samples and process events as they
//! come (a live run or files read line by line), so that nothing is held twice:
//! per run a bounded set of chart points, the statistics over every sample, and
//! the tree's processes in a compact form.

use std::collections::HashMap;

use serde::Serialize;

use super::{
    sample::{sum_present, MemorySource, Sample},
    stats::{Recommendation, RunStatsOut, UsageAccum},
};

/// Chart points per run at most: past this, neighbouring points are averaged in
/// pairs (the statistics still see every sample).
const MAX_POINTS: usize = 4096;
/// Processes kept one by one; past this the timeline shows each command's
/// number of live processes over time instead of one bar per process.
pub const MAX_BARS: usize = 20_000;
/// Processes held in memory at all (20 bytes each); past this they are counted.
const MAX_PROCS: usize = 1_000_000;
/// Time buckets of a command's activity when the bars are not kept.
const ACTIVITY_BUCKETS: usize = 400;
/// Distinct command names; past it, new names are counted under "(other)".
const MAX_COMMANDS: usize = 4096;
/// Lines that could not be read, named one by one; the rest are counted.
const MAX_SKIPS_NAMED: usize = 20;

/// The chart columns, in the order of `RunData::series`.
pub const COLUMNS: [&str; 18] = [
    "proc_cpu",
    "sys_cpu",
    "proc_mem",
    "sys_mem",
    "proc_read",
    "proc_write",
    "sys_read",
    "sys_write",
    "disk_used_gb",
    "net_recv",
    "net_sent",
    "proc_gpu",
    "proc_vram",
    "proc_gpus",
    "sys_gpu",
    "sys_vram",
    "tracker_cpu",
    "live_procs",
];
const NCOL: usize = COLUMNS.len();

fn per_sec(b: Option<u64>, secs: f64) -> Option<f64> {
    b.filter(|_| secs > 0.0).map(|b| b as f64 / secs)
}

/// One sample's chart values.
fn values(s: &Sample) -> [Option<f64>; NCOL] {
    let dt = s.interval_secs;
    let p = s.process.as_ref();
    let (total, avail) = s.disk_space();
    let has_mounts = s.disk.iter().any(|d| !d.mounts.is_empty());
    let gpus = (!s.gpu.is_empty()).then(|| s.gpu_totals());
    [
        s.cpu.process_cores_used,
        s.cpu.utilization_pct,
        p.map(|p| p.memory_mib),
        s.memory.used_mib,
        p.and_then(|p| per_sec(Some(p.read_bytes), dt)),
        p.and_then(|p| per_sec(Some(p.write_bytes), dt)),
        per_sec(sum_present(s.disk.iter().map(|d| d.read_bytes)), dt),
        per_sec(sum_present(s.disk.iter().map(|d| d.write_bytes)), dt),
        has_mounts.then_some(total.saturating_sub(avail) as f64 / 1e9),
        per_sec(sum_present(s.network.iter().map(|n| n.rx_bytes)), dt),
        per_sec(sum_present(s.network.iter().map(|n| n.tx_bytes)), dt),
        p.and_then(|p| p.gpu_usage),
        p.and_then(|p| p.gpu_vram_mib),
        p.and_then(|p| p.gpu_utilized.map(|g| g as f64)),
        gpus.map(|(busy, _)| busy),
        gpus.map(|(_, vram)| vram),
        (dt > 0.0).then(|| s.tracker.cpu_secs / dt),
        p.map(|p| p.live_processes as f64),
    ]
}

/// Rounded for the page: 4 significant digits are more than a chart shows.
fn short(x: f64) -> f64 {
    if x == 0.0 || !x.is_finite() {
        return 0.0;
    }
    let mag = x.abs().log10().floor() as i32;
    let scale = 10f64.powi(3 - mag);
    (x * scale).round() / scale
}

/// The observer's own figures over the run.
#[derive(Clone, Debug, Default, Serialize)]
pub struct Cost {
    pub tracker_cpu_secs: f64,
    pub tracker_max_rss_mib: f64,
    pub tree_cpu_secs: f64,
    pub lost_events: u64,
    pub untracked_tasks: u64,
    /// What could not be measured exactly, as the samples named it.
    pub degraded: Vec<String>,
}

/// A line that could not be used.
#[derive(Clone, Debug, Serialize)]
pub struct Skip {
    pub line: u64,
    pub why: String,
}

/// One run's samples, as they arrive.
pub struct RunBuilder {
    name: String,
    source: String,
    backend: Option<String>,
    job_name: Option<String>,
    interval: Option<f64>,
    first_ts: Option<f64>,
    last_ts: f64,
    samples: u64,
    /// Samples averaged into one point.
    bucket: usize,
    acc: ([f64; NCOL], [u32; NCOL], f64, usize),
    t: Vec<f64>,
    cols: Vec<Vec<Option<f64>>>,
    usage: UsageAccum,
    /// The last sample's tree (its pid and cumulative CPU), by which a sample
    /// is known to continue the run whatever its timestamp says.
    tree: Option<(u32, f64)>,
    /// What a step of the wall clock moved the timestamps by, taken back out so
    /// that the run's time axis stays its own (`continues`).
    shift: f64,
    cost: Cost,
    skips: Vec<Skip>,
    skipped: u64,
    hosts: Vec<String>,
}

impl RunBuilder {
    pub fn new(name: &str, source: &str) -> RunBuilder {
        RunBuilder {
            name: name.to_string(),
            source: source.to_string(),
            backend: None,
            job_name: None,
            interval: None,
            first_ts: None,
            last_ts: 0.0,
            samples: 0,
            bucket: 1,
            acc: ([0.0; NCOL], [0; NCOL], 0.0, 0),
            t: Vec::new(),
            cols: vec![Vec::new(); NCOL],
            usage: UsageAccum::default(),
            tree: None,
            shift: 0.0,
            cost: Cost::default(),
            skips: Vec::new(),
            skipped: 0,
            hosts: Vec::new(),
        }
    }

    pub fn samples(&self) -> u64 {
        self.samples
    }

    pub fn name(&self) -> &str {
        self.job_name.as_deref().unwrap_or(&self.name)
    }

    /// Seconds of the first and the last sample.
    pub fn span(&self) -> Option<(f64, f64)> {
        self.first_ts.map(|f| (f, self.last_ts))
    }

    /// Whether `s` continues this run: the same tree, its cumulative CPU not
    /// gone back. Samples of one tracker run do, whatever the wall clock did
    /// between them; a second run appended to the file does not.
    pub fn continues(&self, s: &Sample) -> bool {
        match (self.tree, &s.process, s.tracked_pid) {
            (Some((pid, cpu)), Some(p), Some(now)) => now == pid && p.cpu_secs_total >= cpu - 1e-6,
            _ => false,
        }
    }

    /// A sample's time on the run's own axis: where it continues the run and
    /// its timestamp is more than a second from the last one's plus its
    /// interval (measured on the monotonic clock), the wall clock stepped, and
    /// the step is taken out from here on.
    fn on_own_axis(&mut self, s: &Sample) -> f64 {
        let ts = s.timestamp_secs + self.shift;
        if self.first_ts.is_some() && s.interval_secs > 0.0 && self.continues(s) {
            let expected = self.last_ts + s.interval_secs;
            if (ts - expected).abs() > 1.0 {
                self.shift += expected - ts;
                return expected;
            }
        }
        ts
    }

    pub fn add(&mut self, s: &Sample) {
        if !s.timestamp_secs.is_finite() {
            return;
        }
        let ts = self.on_own_axis(s);
        if let (Some(p), Some(pid)) = (&s.process, s.tracked_pid) {
            self.tree = Some((pid, p.cpu_secs_total));
        }
        self.samples += 1;
        self.first_ts.get_or_insert(ts);
        self.last_ts = ts;
        if self.interval.is_none() && s.interval_secs > 0.0 {
            self.interval = Some(s.interval_secs);
        }
        if let Some(p) = &s.process {
            if !p.backend.is_empty() {
                self.backend.get_or_insert_with(|| p.backend.to_string());
            }
            self.cost.tree_cpu_secs += p.utime_secs + p.stime_secs;
            self.cost.untracked_tasks = self.cost.untracked_tasks.max(p.untracked_tasks);
        }
        if let Some(j) = &s.job_name {
            self.job_name.get_or_insert_with(|| j.clone());
        }
        self.cost.tracker_cpu_secs += s.tracker.cpu_secs;
        self.cost.tracker_max_rss_mib = self.cost.tracker_max_rss_mib.max(s.tracker.rss_mib);
        self.cost.lost_events += s.tracker.lost_events;
        for d in &s.tracker.degraded {
            self.degraded(&format!("{}: {}", d.name, d.detail));
        }
        self.usage.add(s);
        let v = values(s);
        let (sum, n, t0, k) = &mut self.acc;
        if *k == 0 {
            *t0 = ts;
        }
        for (i, x) in v.iter().enumerate() {
            if let Some(x) = x.filter(|x| x.is_finite()) {
                sum[i] += x;
                n[i] += 1;
            }
        }
        *k += 1;
        if *k >= self.bucket {
            self.flush();
        }
    }

    /// A degradation a sample named (kept once each).
    /// Kept once per name (`name: detail`), with the latest detail (a count that
    /// grew).
    pub fn degraded(&mut self, what: &str) {
        let name = |d: &str| d.split(':').next().unwrap_or("").trim().to_string();
        let n = name(what);
        let full = self.cost.degraded.len() >= 32;
        match self.cost.degraded.iter_mut().find(|d| name(d) == n) {
            Some(d) => *d = what.to_string(),
            None if !full => self.cost.degraded.push(what.to_string()),
            None => {}
        }
    }

    /// The host a sample came from; more than one is said on the page.
    pub fn host(&mut self, h: &str) {
        if !self.hosts.iter().any(|x| x == h) && self.hosts.len() < 8 {
            self.hosts.push(h.to_string());
        }
    }

    pub fn backend(&mut self, b: &str) {
        self.backend.get_or_insert_with(|| b.to_string());
    }

    pub fn skip(&mut self, line: u64, why: impl Into<String>) {
        self.skipped += 1;
        if self.skips.len() < MAX_SKIPS_NAMED {
            self.skips.push(Skip {
                line,
                why: why.into(),
            });
        }
    }

    fn flush(&mut self) {
        let (sum, n, t0, k) = &mut self.acc;
        if *k == 0 {
            return;
        }
        self.t.push(*t0);
        for i in 0..NCOL {
            self.cols[i].push((n[i] > 0).then(|| sum[i] / f64::from(n[i])));
        }
        *sum = [0.0; NCOL];
        *n = [0; NCOL];
        *k = 0;
        if self.t.len() >= MAX_POINTS {
            self.halve();
        }
    }

    /// Averages neighbouring points in pairs (an odd last point stays as it is);
    /// later samples go two to a point.
    fn halve(&mut self) {
        let n = self.t.len();
        let t: Vec<f64> = (0..n.div_ceil(2)).map(|i| self.t[2 * i]).collect();
        for c in &mut self.cols {
            let merged: Vec<Option<f64>> = (0..n.div_ceil(2))
                .map(|i| match (c[2 * i], c.get(2 * i + 1).copied().flatten()) {
                    (Some(a), Some(b)) => Some((a + b) / 2.0),
                    (a, b) => a.or(b),
                })
                .collect();
            *c = merged;
        }
        self.t = t;
        self.bucket *= 2;
    }

    pub fn usage(&self) -> &UsageAccum {
        &self.usage
    }

    /// The charts' zero (unix seconds): the start of the first sample's interval.
    pub fn origin(&self) -> f64 {
        self.first_ts.unwrap_or(0.0) - self.interval.unwrap_or(0.0)
    }

    pub fn finish(mut self, timeline: Option<Timeline>) -> RunData {
        self.flush();
        let t0 = self.origin();
        let used: Vec<bool> = self
            .cols
            .iter()
            .map(|c| c.iter().any(|v| v.is_some()))
            .collect();
        let series = COLUMNS
            .iter()
            .zip(self.cols)
            .zip(used)
            .filter(|(_, u)| *u)
            .map(|((name, c), _)| {
                (
                    (*name).to_string(),
                    c.into_iter().map(|v| v.map(short)).collect(),
                )
            })
            .collect();
        RunData {
            name: self.job_name.unwrap_or(self.name),
            source: self.source,
            backend: self.backend,
            hosts: self.hosts,
            interval_secs: self.interval,
            start_secs: t0,
            end_secs: self.last_ts,
            summary: None,
            samples: self.samples,
            samples_per_point: self.bucket,
            t: self
                .t
                .iter()
                .map(|t| ((t - t0) * 1000.0).round() / 1000.0)
                .collect(),
            series,
            stats: self.usage.stats(),
            recommendation: self.usage.recommendation(),
            cost: self.cost,
            skipped: self.skipped,
            skips: self.skips,
            timeline,
        }
    }
}

/// One run as the page gets it.
#[derive(Debug, Serialize)]
pub struct RunData {
    pub name: String,
    pub source: String,
    pub backend: Option<String>,
    pub hosts: Vec<String>,
    pub interval_secs: Option<f64>,
    /// Unix seconds of the start of the first sample's interval, and of the last
    /// sample.
    pub start_secs: f64,
    pub end_secs: f64,
    pub samples: u64,
    pub samples_per_point: usize,
    /// The run's `--summary` object (host, cloud, exit code, …), when given.
    pub summary: Option<serde_json::Value>,
    /// Seconds since `start_secs`, one per point.
    pub t: Vec<f64>,
    /// Per column that has any value, one value per point.
    pub series: Vec<(String, Vec<Option<f64>>)>,
    pub stats: Option<RunStatsOut>,
    pub recommendation: Option<Recommendation>,
    pub cost: Cost,
    pub skipped: u64,
    pub skips: Vec<Skip>,
    pub timeline: Option<Timeline>,
}

/// A process of the tree, from its events.
#[derive(Clone, Copy, Debug)]
struct Proc {
    pid: u32,
    ppid: u32,
    /// Unix seconds; NaN while unknown.
    start: f64,
    end: f64,
    cpu: f32,
    exit: i32,
    comm: u32,
    exited: bool,
}

/// One process event, from a live run or an events file.
#[derive(Clone, Debug)]
pub struct ProcEventIn<'a> {
    pub kind: &'a str,
    pub pid: u32,
    pub ppid: u32,
    pub comm: &'a str,
    pub cpu_secs: Option<f64>,
    pub exit_code: Option<i32>,
    /// Unix seconds.
    pub timestamp_secs: f64,
}

/// The tree's processes from fork to exit, as events arrive.
#[derive(Default)]
pub struct TimelineBuilder {
    procs: Vec<Proc>,
    /// Index in `procs` of the live process with this pid.
    live: HashMap<u32, usize>,
    comms: Vec<String>,
    comm_ids: HashMap<String, u32>,
    /// Processes past MAX_PROCS: counted, not drawn.
    dropped: u64,
    first: Option<f64>,
    last: f64,
    events: u64,
}

impl TimelineBuilder {
    pub fn events(&self) -> u64 {
        self.events
    }

    /// Unix seconds of the first and last event.
    pub fn span(&self) -> Option<(f64, f64)> {
        self.first.map(|f| (f, self.last))
    }

    fn comm_id(&mut self, c: &str) -> u32 {
        if let Some(&id) = self.comm_ids.get(c) {
            return id;
        }
        let name = if self.comms.len() >= MAX_COMMANDS {
            "(other)"
        } else {
            c
        };
        if let Some(&id) = self.comm_ids.get(name) {
            return id;
        }
        let id = self.comms.len() as u32;
        self.comms.push(name.to_string());
        self.comm_ids.insert(name.to_string(), id);
        id
    }

    fn open(&mut self, pid: u32, ppid: u32, comm: &str, at: f64) -> Option<usize> {
        if self.procs.len() >= MAX_PROCS {
            self.dropped += 1;
            return None;
        }
        let comm = self.comm_id(comm);
        self.procs.push(Proc {
            pid,
            ppid,
            start: at,
            end: f64::NAN,
            cpu: 0.0,
            exit: 0,
            comm,
            exited: false,
        });
        let i = self.procs.len() - 1;
        self.live.insert(pid, i);
        Some(i)
    }

    pub fn add(&mut self, e: &ProcEventIn) {
        let at = e.timestamp_secs;
        if !at.is_finite() {
            return;
        }
        self.events += 1;
        self.first = Some(self.first.map_or(at, |f| f.min(at)));
        self.last = self.last.max(at);
        match e.kind {
            "fork" => {
                self.open(e.pid, e.ppid, e.comm, at);
            }
            "exec" => {
                // The root is seen first at its exec; a process that forked before
                // the run started is opened here too.
                let i = match self.live.get(&e.pid) {
                    Some(&i) => Some(i),
                    None => self.open(e.pid, e.ppid, e.comm, at),
                };
                if let Some(i) = i {
                    let c = self.comm_id(e.comm);
                    self.procs[i].comm = c;
                }
            }
            "exit" => {
                let i = match self.live.remove(&e.pid) {
                    Some(i) => Some(i),
                    // Forked before its events were seen: it lived at least until now.
                    None => self.open(e.pid, e.ppid, e.comm, f64::NAN).inspect(|_| {
                        self.live.remove(&e.pid);
                    }),
                };
                if let Some(i) = i {
                    let p = &mut self.procs[i];
                    p.end = at;
                    p.exited = true;
                    p.cpu = e.cpu_secs.unwrap_or(0.0) as f32;
                    p.exit = e.exit_code.unwrap_or(0);
                }
            }
            _ => {}
        }
    }

    /// The page's form: bars when there are few enough, else each command's live
    /// processes over time. Times are seconds since `origin` (the charts' zero,
    /// unix seconds); a process still running ends at `end`.
    pub fn finish(self, origin: f64, end: f64) -> Timeline {
        let end = end.max(self.last);
        let start = origin;
        let n = self.procs.len();
        let mut per_comm: Vec<(u64, f64)> = vec![(0, 0.0); self.comms.len()];
        for p in &self.procs {
            let c = &mut per_comm[p.comm as usize];
            c.0 += 1;
            c.1 += f64::from(p.cpu);
        }
        // Commands by CPU, most first: rows and colours follow this order.
        let mut order: Vec<usize> = (0..self.comms.len()).collect();
        order.sort_by(|&a, &b| per_comm[b].1.total_cmp(&per_comm[a].1));
        let mut rank = vec![0u32; self.comms.len()];
        for (r, &c) in order.iter().enumerate() {
            rank[c] = r as u32;
        }
        let commands: Vec<CommandRow> = order
            .iter()
            .map(|&c| CommandRow {
                comm: self.comms[c].clone(),
                processes: per_comm[c].0,
                cpu_secs: short(per_comm[c].1),
            })
            .collect();
        let rel = |t: f64| ((t - start) * 1e4).round() / 1e4;
        let still_running = self.procs.iter().filter(|p| !p.exited).count() as u64;
        if n <= MAX_BARS {
            let mut procs: Vec<&Proc> = self.procs.iter().collect();
            procs.sort_by(|a, b| {
                let sa = if a.start.is_nan() { start } else { a.start };
                let sb = if b.start.is_nan() { start } else { b.start };
                sa.total_cmp(&sb)
            });
            let bars = procs
                .iter()
                .map(|p| Bar {
                    pid: p.pid,
                    ppid: p.ppid,
                    start: rel(if p.start.is_nan() { start } else { p.start }),
                    end: rel(if p.exited { p.end } else { end }),
                    cpu: short(f64::from(p.cpu)),
                    exit: p.exited.then_some(p.exit),
                    cmd: rank[p.comm as usize],
                })
                .collect();
            Timeline {
                processes: n as u64 + self.dropped,
                still_running,
                span_secs: rel(end),
                commands,
                bars: Some(bars),
                activity: None,
                activity_start: None,
                bucket_secs: None,
            }
        } else {
            let first = self.first.map_or(start, |f| f.min(start));
            let span = (end - first).max(1e-3);
            let w = span / ACTIVITY_BUCKETS as f64;
            let mut act = vec![vec![0u32; ACTIVITY_BUCKETS]; self.comms.len()];
            for p in &self.procs {
                let s = if p.start.is_nan() { first } else { p.start };
                let e = if p.exited { p.end } else { end };
                let a = (((s - first) / w).floor().max(0.0) as usize).min(ACTIVITY_BUCKETS - 1);
                let b = (((e - first) / w).floor().max(0.0) as usize).min(ACTIVITY_BUCKETS - 1);
                for x in &mut act[p.comm as usize][a..=b.max(a)] {
                    *x += 1;
                }
            }
            Timeline {
                processes: n as u64 + self.dropped,
                still_running,
                span_secs: rel(end),
                commands,
                bars: None,
                activity: Some(order.iter().map(|&c| act[c].clone()).collect()),
                activity_start: Some(rel(first)),
                bucket_secs: Some(short(w)),
            }
        }
    }
}

#[derive(Debug, Serialize)]
pub struct CommandRow {
    pub comm: String,
    pub processes: u64,
    pub cpu_secs: f64,
}

/// One process: seconds since the timeline's start; `exit` null while it runs;
/// `cmd` indexes `commands`.
#[derive(Debug, Serialize)]
pub struct Bar {
    pub pid: u32,
    pub ppid: u32,
    pub start: f64,
    pub end: f64,
    pub cpu: f64,
    pub exit: Option<i32>,
    pub cmd: u32,
}

#[derive(Debug, Serialize)]
pub struct Timeline {
    pub processes: u64,
    pub still_running: u64,
    pub span_secs: f64,
    pub commands: Vec<CommandRow>,
    /// One per process, by start (up to MAX_BARS processes).
    pub bars: Option<Vec<Bar>>,
    /// Past MAX_BARS: per command (in `commands` order), live processes per bucket.
    pub activity: Option<Vec<Vec<u32>>>,
    /// Seconds (since the origin) of the first bucket's start.
    pub activity_start: Option<f64>,
    pub bucket_secs: Option<f64>,
}

/// Several runs of one job as one: what the Python package's report calls the
/// combined statistics.
#[derive(Debug, Serialize)]
pub struct Combined {
    pub runs: usize,
    /// What the combined runs' memory figures are.
    pub memory_source: Option<&'static str>,
    /// Runs left out because their memory was measured another way.
    pub memory_left_out: usize,
    pub stats: Option<RunStatsOut>,
    pub recommendation: Option<Recommendation>,
}

/// Whose words the page's hints use: the command line's flags, or the Python
/// package's arguments when the package made the page.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Hints {
    #[default]
    Cli,
    Python,
}

/// How a reported run stands: the Python package's words (Pending while the job
/// runs, then Finished, or Failed).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub enum RunStatus {
    Pending,
    Finished,
    Failed,
}

impl RunStatus {
    /// An ended run's status by its exit code: failed when the command exited non-zero
    /// or was killed (a code over 128); finished otherwise, a `--pid` run included.
    pub fn of_exit(exit_code: Option<i32>) -> RunStatus {
        match exit_code {
            Some(c) if c != 0 => RunStatus::Failed,
            _ => RunStatus::Finished,
        }
    }

    pub fn word(self) -> &'static str {
        match self {
            RunStatus::Pending => "Pending",
            RunStatus::Finished => "Finished",
            RunStatus::Failed => "Failed",
        }
    }
}

/// The runs combined: only those whose memory was measured as the first run's
/// (`UsageAccum::combine`); the others are counted in `memory_left_out`.
pub fn combine(runs: &[&UsageAccum]) -> Combined {
    let u = UsageAccum::combine(runs);
    let with_tree: Vec<&&UsageAccum> = runs.iter().filter(|r| r.has_tree()).collect();
    let runs = with_tree.iter().filter(|r| r.same_memory(&u)).count();
    Combined {
        runs,
        memory_source: u.memory_source().map(MemorySource::as_str),
        memory_left_out: with_tree.len() - runs,
        stats: u.stats(),
        recommendation: u.recommendation(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::sample::{CpuSample, ProcessSample};

    #[test]
    fn an_ended_runs_status_is_its_exit_code() {
        assert_eq!(RunStatus::of_exit(Some(0)), RunStatus::Finished);
        // A `--pid` run has no exit code of its own.
        assert_eq!(RunStatus::of_exit(None), RunStatus::Finished);
        assert_eq!(RunStatus::of_exit(Some(3)), RunStatus::Failed);
        assert_eq!(RunStatus::of_exit(Some(137)).word(), "Failed");
    }

    fn sample(ts: f64, cores: f64) -> Sample {
        Sample {
            timestamp_secs: ts,
            interval_secs: 1.0,
            cpu: CpuSample {
                process_cores_used: Some(cores),
                ..Default::default()
            },
            process: Some(ProcessSample {
                backend: "ebpf",
                utime_secs: cores,
                memory_mib: 10.0,
                memory_source: "pss",
                memory_rss_mib: 10.0,
                ..Default::default()
            }),
            ..Default::default()
        }
    }

    #[test]
    fn long_runs_are_averaged_into_bounded_points() {
        let mut r = RunBuilder::new("a", "a.jsonl");
        let n = 3 * MAX_POINTS as u64 + 7;
        for i in 0..n {
            r.add(&sample(1000.0 + i as f64, (i % 2) as f64));
        }
        assert_eq!(r.samples(), n);
        let d = r.finish(None);
        assert!(
            d.t.len() <= MAX_POINTS && d.t.len() >= MAX_POINTS / 4,
            "{}",
            d.t.len()
        );
        let (_, cpu) = d.series.iter().find(|(n, _)| n == "proc_cpu").unwrap();
        // Pairs of 0 and 1 average to 0.5 everywhere but a partial last bucket.
        assert!(cpu[..cpu.len() - 1].iter().all(|v| *v == Some(0.5)));
        assert_eq!(d.stats.unwrap().process_cpu_usage.unwrap().max, 1.0);
        assert_eq!(d.backend.as_deref(), Some("ebpf"));
        assert!((d.cost.tree_cpu_secs - (n / 2) as f64).abs() < 1e-9);
        // Columns without any value are left out.
        assert!(!d.series.iter().any(|(n, _)| n == "proc_gpu"));
    }

    fn ev<'a>(kind: &'a str, pid: u32, comm: &'a str, t: f64) -> ProcEventIn<'a> {
        ProcEventIn {
            kind,
            pid,
            ppid: 1,
            comm,
            cpu_secs: (kind == "exit").then_some(0.5),
            exit_code: (kind == "exit").then_some(256),
            timestamp_secs: t,
        }
    }

    #[test]
    fn processes_become_bars_from_fork_to_exit() {
        let mut t = TimelineBuilder::default();
        t.add(&ev("exec", 10, "sh", 100.0));
        t.add(&ev("fork", 11, "sh", 100.5));
        t.add(&ev("exec", 11, "true", 100.6));
        t.add(&ev("exit", 11, "true", 101.0));
        // An exit without a fork (forked before the events began).
        t.add(&ev("exit", 12, "cat", 101.5));
        let tl = t.finish(100.0, 103.0);
        let bars = tl.bars.unwrap();
        assert_eq!(bars.len(), 3);
        assert_eq!(tl.processes, 3);
        assert_eq!(tl.still_running, 1);
        let b11 = bars.iter().find(|b| b.pid == 11).unwrap();
        assert_eq!((b11.start, b11.end, b11.exit), (0.5, 1.0, Some(256)));
        assert_eq!(tl.commands[b11.cmd as usize].comm, "true");
        let b10 = bars.iter().find(|b| b.pid == 10).unwrap();
        assert_eq!((b10.end, b10.exit), (3.0, None));
        let b12 = bars.iter().find(|b| b.pid == 12).unwrap();
        assert_eq!(b12.start, 0.0);
    }

    #[test]
    fn thousands_of_processes_collapse_into_activity() {
        let mut t = TimelineBuilder::default();
        for i in 0..(MAX_BARS as u32 + 10) {
            let at = 100.0 + f64::from(i) * 0.001;
            t.add(&ev("fork", 1000 + i, "w", at));
            t.add(&ev("exit", 1000 + i, "w", at + 0.0005));
        }
        let tl = t.finish(100.0, 130.0);
        assert!(tl.bars.is_none());
        let act = tl.activity.unwrap();
        assert_eq!(act.len(), 1);
        assert_eq!(tl.processes, MAX_BARS as u64 + 10);
        assert!(act[0].iter().any(|&c| c > 0));
    }
}
