//! `resource-tracker report FILE…`: recorded runs read line by line into the
//! report's model, and the page written once, whole. Also what `run --report`
//! and `--recommend-server` share with it.

use std::{
    io::{BufRead, BufReader, Read as _},
    path::Path,
};

use anyhow::{bail, Context as _};
use serde_json::Value;

use crate::{
    discovery::keeper,
    fsafe,
    model::{
        reading::unix_now,
        recorded::{self, CsvRows, JsonLine},
        report::{self, ProcEventIn, RunBuilder, RunStatus, TimelineBuilder},
        stats::{self, ServerAdvice},
        CloudInfo, Sample, Summary,
    },
    settings::report::ReportSettings,
    sink::report::{write_page, Page},
    warn::say,
};

/// A line longer than this is not a sample, an event or a CSV row.
const MAX_LINE: usize = 4 << 20;
/// A summary file (one pretty-printed JSON object) larger than this is not one.
const MAX_SUMMARY: u64 = 16 << 20;
/// A sample whose time is this far before the previous one starts a new run.
const BACKWARDS_SECS: f64 = 1.0;

/// The report's file can be written at the end: its directory exists. Checked
/// before anything starts, so that a typo does not cost the run its report.
pub fn check_destination(flag: &str, p: &Path) -> anyhow::Result<()> {
    let dir = match p.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    if !dir.is_dir() {
        bail!(
            "{flag} {}: the directory {} does not exist",
            p.display(),
            dir.display()
        );
    }
    if p.is_dir() {
        bail!("{flag} {}: is a directory", p.display());
    }
    if let Some(kind) = fsafe::not_regular(p) {
        bail!("{flag} {}: it is {kind}, not a regular file", p.display());
    }
    // Refused now, as -o is, rather than found at the end of the run.
    let target = if p.exists() { p } else { dir };
    if let Err(e) = fsafe::writable(target) {
        bail!("{flag} {}: cannot be written: {e}", p.display());
    }
    Ok(())
}

/// The host a summary names, in a few words.
fn host_of(summary: &Value) -> Option<String> {
    let h = summary.get("host")?;
    let vcpus = h.get("host_vcpus").and_then(Value::as_u64)?;
    let model = h
        .get("host_cpu_model")
        .and_then(Value::as_str)
        .unwrap_or("CPU");
    let mem = h
        .get("host_memory_mib")
        .and_then(Value::as_f64)
        .unwrap_or(0.0);
    Some(format!("{vcpus} × {model}, {:.1} GiB", mem / 1024.0))
}

fn cloud_of(summary: &Value) -> Option<CloudInfo> {
    let c = summary.get("cloud")?;
    let s = |k: &str| c.get(k).and_then(Value::as_str).map(str::to_string);
    Some(CloudInfo {
        cloud_vendor_id: s("cloud_vendor_id")?,
        cloud_region_id: s("cloud_region_id"),
        cloud_instance_type: s("cloud_instance_type"),
        ..Default::default()
    })
}

fn ask_keeper(
    url: &str,
    rec: Option<&crate::model::stats::Recommendation>,
    cloud: Option<&CloudInfo>,
    duration: f64,
) -> Option<ServerAdvice> {
    let Some(rec) = rec else {
        say("--recommend-server: no tracked process tree, so no recommendation to look up");
        return None;
    };
    let a = keeper::advise(url, rec, cloud, duration);
    if let Some(e) = &a.error {
        say(format_args!("--recommend-server: {e}"));
    }
    Some(a)
}

/// `--recommend-server` at the end of a run.
pub fn advise(url: &str, s: &Summary) -> Option<ServerAdvice> {
    let duration = s.stats.as_ref().map_or(s.wall_secs, |st| st.duration_secs);
    ask_keeper(url, s.recommendation.as_ref(), s.cloud.as_ref(), duration)
}

/// One run being read: its samples, the events and summary files after it.
struct Reading {
    run: RunBuilder,
    timeline: Option<TimelineBuilder>,
    summary: Option<Value>,
    /// Events without wall-clock time: monotonic seconds of the first one.
    unaligned: Vec<(String, f64, Vec<recorded::EventLine>)>,
}

impl Reading {
    fn new(name: &str, source: &str) -> Reading {
        Reading {
            run: RunBuilder::new(name, source),
            timeline: None,
            summary: None,
            unaligned: Vec::new(),
        }
    }

    fn event(&mut self, e: &recorded::EventLine, at: f64) {
        self.timeline
            .get_or_insert_with(TimelineBuilder::default)
            .add(&ProcEventIn {
                kind: &e.kind,
                pid: e.pid,
                ppid: e.ppid,
                comm: &e.comm,
                cpu_secs: e.cpu_secs,
                exit_code: e.exit_code,
                timestamp_secs: at,
            });
    }
}

/// Lines of a file, each at most MAX_LINE bytes (a longer one is reported, not
/// held), not necessarily UTF-8 (command names may not be).
struct Lines<R> {
    r: R,
    buf: Vec<u8>,
    n: u64,
    /// A line ran past MAX_SKIP without an end (/dev/zero): nothing more is read.
    ended: bool,
}

/// Seconds from 1970 past which a timestamp is not a time (the year 5138).
const MAX_TIMESTAMP: f64 = 1e11;

/// How far a line longer than MAX_LINE is skipped to find its end.
const MAX_SKIP: u64 = 64 << 20;

enum Line {
    Text(String),
    TooLong,
}

impl<R: BufRead> Lines<R> {
    fn next(&mut self) -> std::io::Result<Option<(u64, Line)>> {
        self.buf.clear();
        if self.ended {
            return Ok(None);
        }
        let mut long = false;
        let mut skipped = 0u64;
        loop {
            if skipped > MAX_SKIP {
                self.ended = true;
                break;
            }
            let chunk = self.r.fill_buf()?;
            if chunk.is_empty() {
                if self.buf.is_empty() && !long {
                    return Ok(None);
                }
                break;
            }
            let (take, done) = match chunk.iter().position(|&b| b == b'\n') {
                Some(i) => (i + 1, true),
                None => (chunk.len(), false),
            };
            if !long {
                if self.buf.len() + take > MAX_LINE {
                    long = true;
                    self.buf.clear();
                } else {
                    self.buf.extend_from_slice(&chunk[..take]);
                }
            }
            self.r.consume(take);
            if long {
                skipped += take as u64;
            }
            if done {
                break;
            }
        }
        self.n += 1;
        if long {
            return Ok(Some((self.n, Line::TooLong)));
        }
        while matches!(self.buf.last(), Some(b'\n' | b'\r')) {
            self.buf.pop();
        }
        Ok(Some((
            self.n,
            Line::Text(String::from_utf8_lossy(&self.buf).into_owned()),
        )))
    }
}

/// Everything read so far.
#[derive(Default)]
struct Inputs {
    runs: Vec<Reading>,
    notes: Vec<String>,
}

impl Inputs {
    /// The run an events or summary file belongs to: the last one read.
    fn last(&mut self, file: &str) -> &mut Reading {
        if self.runs.is_empty() {
            self.runs.push(Reading::new(file, file));
        }
        let n = self.runs.len();
        &mut self.runs[n - 1]
    }

    fn read(&mut self, path: &Path) -> anyhow::Result<()> {
        let name = path.display().to_string();
        if std::fs::metadata(path).is_ok_and(|m| m.is_dir()) {
            bail!("{name} is a directory");
        }
        let f = fsafe::open_input(path).with_context(|| format!("cannot read {name}"))?;
        let mut lines = Lines {
            r: BufReader::with_capacity(256 * 1024, f),
            buf: Vec::new(),
            n: 0,
            ended: false,
        };
        // The first line that is not blank tells the kind of file.
        let first = loop {
            match lines.next().with_context(|| format!("reading {name}"))? {
                None => {
                    self.notes.push(format!("{name}: empty, skipped"));
                    return Ok(());
                }
                Some((_, Line::Text(t))) if t.trim().is_empty() => continue,
                Some((n, l)) => break (n, l),
            }
        };
        match first {
            (n, Line::Text(t)) if t.trim_start().starts_with('{') => {
                if recorded::json_line(&t).is_err() && n == 1 {
                    // One JSON document over several lines: a summary file.
                    return self.read_document(path, &name);
                }
                self.read_json_lines(&name, (n, Line::Text(t)), lines)
            }
            (n, Line::Text(t)) => match CsvRows::new(&t) {
                Ok(rows) => self.read_csv(&name, rows, lines),
                Err(e) => {
                    self.notes
                        .push(format!("{name}: line {n}: {e}; file skipped"));
                    Ok(())
                }
            },
            (n, Line::TooLong) => {
                self.notes.push(format!(
                    "{name}: line {n} is longer than {} MiB; not a tracker's file, skipped",
                    MAX_LINE >> 20
                ));
                Ok(())
            }
        }
    }

    fn read_document(&mut self, path: &Path, name: &str) -> anyhow::Result<()> {
        let mut text = String::new();
        let f = fsafe::open_input(path).with_context(|| format!("cannot read {name}"))?;
        let read = f.take(MAX_SUMMARY + 1).read_to_string(&mut text);
        let v: Option<Value> = read
            .ok()
            .filter(|n| (*n as u64) <= MAX_SUMMARY)
            .and_then(|_| serde_json::from_str(&text).ok());
        match v {
            Some(v) if v.get("wall_secs").is_some() && v.get("backend").is_some() => {
                self.summary(name, v);
            }
            _ => self.notes.push(format!(
                "{name}: neither JSON lines nor a run summary (--summary file); skipped"
            )),
        }
        Ok(())
    }

    fn summary(&mut self, name: &str, v: Value) {
        let r = self.last(name);
        if let Some(h) = host_of(&v) {
            r.run.host(&h);
        }
        if r.summary.is_some() {
            self.notes.push(format!(
                "{name}: a second summary for one run; the first is kept"
            ));
        } else {
            r.summary = Some(v);
        }
    }

    fn sample(&mut self, name: &str, n: u64, s: &Sample, extra: recorded::Extra) {
        // 1e308 parses as a number but is no time: it would stretch the chart's
        // axis past any use and hide every other sample.
        if s.timestamp_secs.is_infinite() || s.timestamp_secs.abs() > MAX_TIMESTAMP {
            self.skip(
                name,
                n,
                &format!(
                    "timestamp_secs {} is not a time (more than {MAX_TIMESTAMP:e} s from 1970)",
                    s.timestamp_secs
                ),
            );
            return;
        }
        // Time going back starts another run, unless the sample continues the
        // last one (the same tree, its CPU not gone back): then the wall clock
        // stepped, and the run's own axis takes it out.
        let split = matches!(self.runs.last(), Some(r)
            if !r.run.continues(s)
                && r.run.span().is_some_and(|(_, last)| s.timestamp_secs < last - BACKWARDS_SECS));
        if split {
            self.notes.push(format!(
                "{name}: the time goes back at line {n}; read from there as another run"
            ));
            self.runs
                .push(Reading::new(&format!("{name} (from line {n})"), name));
        }
        let r = self.last(name);
        if let Some(b) = &extra.backend {
            r.run.backend(b);
        }
        for d in &extra.degraded {
            r.run.degraded(d);
        }
        r.run.add(s);
    }

    fn read_json_lines<R: BufRead>(
        &mut self,
        name: &str,
        first: (u64, Line),
        mut lines: Lines<R>,
    ) -> anyhow::Result<()> {
        let mut started = false;
        let mut next = Some(first);
        while let Some((n, line)) = next {
            match line {
                Line::TooLong => self.skip(name, n, "longer than 4 MiB"),
                Line::Text(t) if t.trim().is_empty() => {}
                Line::Text(t) => match recorded::json_line(&t) {
                    Ok(JsonLine::Sample(s, extra)) => {
                        if !started {
                            started = true;
                            // A samples file starts a run of its own.
                            if self.runs.last().is_some_and(|r| r.run.samples() > 0) {
                                self.runs.push(Reading::new(name, name));
                            }
                        }
                        self.sample(name, n, &s, extra);
                    }
                    Ok(JsonLine::Event(e)) => self.event(name, e),
                    Ok(JsonLine::Summary(v)) => self.summary(name, *v),
                    Err(why) => self.skip(name, n, &why),
                },
            }
            next = lines.next().with_context(|| format!("reading {name}"))?;
        }
        Ok(())
    }

    fn event(&mut self, name: &str, e: recorded::EventLine) {
        let r = self.last(name);
        match e.timestamp_secs {
            Some(at) => r.event(&e, at),
            None => match r.unaligned.iter_mut().find(|(f, _, _)| f == name) {
                Some((_, _, v)) => v.push(e),
                None => {
                    let m = e.monotonic_secs;
                    r.unaligned.push((name.to_string(), m, vec![e]));
                }
            },
        }
    }

    fn skip(&mut self, name: &str, n: u64, why: &str) {
        let r = self.last(name);
        r.run.skip(n, format!("{name}: {why}"));
    }

    fn read_csv<R: BufRead>(
        &mut self,
        name: &str,
        mut rows: CsvRows,
        mut lines: Lines<R>,
    ) -> anyhow::Result<()> {
        if self.runs.last().is_some_and(|r| r.run.samples() > 0) || self.runs.is_empty() {
            self.runs.push(Reading::new(name, name));
        }
        while let Some((n, line)) = lines.next().with_context(|| format!("reading {name}"))? {
            match line {
                Line::TooLong => self.skip(name, n, "longer than 4 MiB"),
                Line::Text(t) if t.trim().is_empty() => {}
                Line::Text(t) => match rows.row(&t) {
                    Ok(samples) => {
                        for (s, extra) in samples {
                            self.sample(name, n, &s, extra);
                        }
                    }
                    Err(why) => self.skip(name, n, &why),
                },
            }
        }
        if let Some(s) = rows.finish() {
            self.sample(name, 2, &s, recorded::Extra::default());
        }
        if rows.python {
            self.last(name)
                .run
                .backend("procfs (Python resource-tracker)");
        }
        Ok(())
    }
}

/// Each run read as it will be drawn (with its timeline and summary) and its
/// usage for the combined statistics; a run without samples is left out, noted.
fn runs_to_pages(
    runs: Vec<Reading>,
    notes: &mut Vec<String>,
) -> (Vec<report::RunData>, Vec<stats::UsageAccum>) {
    let mut data = Vec::new();
    let mut usages = Vec::new();
    for mut r in runs {
        if r.run.samples() == 0 {
            notes.push(format!(
                "{}: no samples{}; not in the report",
                r.run.name(),
                if r.timeline.is_some() || r.summary.is_some() {
                    " (its events or summary file has no samples file before it)"
                } else {
                    ""
                }
            ));
            continue;
        }
        let origin = r.run.origin();
        for (file, first_mono, events) in std::mem::take(&mut r.unaligned) {
            notes.push(format!(
                "{file}: events without wall-clock time; aligned with the run's start"
            ));
            for e in events {
                let at = origin + (e.monotonic_secs - first_mono);
                r.event(&e, at);
            }
        }
        let end = r.run.span().map_or(origin, |(_, e)| e);
        let timeline = r.timeline.map(|t| {
            if let Some((a, b)) = t.span() {
                if b < origin - 60.0 || a > end + 60.0 {
                    notes.push(format!(
                        "{}: its events lie outside the samples' time; drawn anyway",
                        r.run.name()
                    ));
                }
            }
            t.finish(origin, end)
        });
        usages.push(r.run.usage().clone());
        let mut d = r.run.finish(timeline);
        d.summary = r.summary;
        data.push(d);
    }
    (data, usages)
}

/// The page's title and the run's status: as given, else the runs' file names and
/// the first run's summary (how it ended).
fn title_and_status(st: &ReportSettings, data: &[report::RunData]) -> (String, Option<RunStatus>) {
    let title = match (&st.title, data) {
        (Some(t), _) => t.clone(),
        (None, [one]) => format!("resource-tracker report: {}", one.name),
        (None, _) => format!("resource-tracker report: {} runs", data.len()),
    };
    let status = st.status.or_else(|| {
        let sum = data.first()?.summary.as_ref()?;
        Some(RunStatus::of_exit(
            sum.get("exit_code")
                .and_then(|v| v.as_i64())
                .map(|c| i32::try_from(c).unwrap_or(1)),
        ))
    });
    (title, status)
}

/// The page from `st.inputs`, written to `st.output`; exit code 0, or 1 when
/// there was nothing to report.
pub fn run(st: ReportSettings) -> anyhow::Result<i32> {
    // A report needs no privilege: under sudo it is made as the user who asked,
    // so that it reads and writes only what they could themselves.
    match crate::sudo::invoker() {
        Ok(Some(user)) => {
            if let Err(e) = user.become_for_good() {
                say(format_args!(
                    "report under sudo: {e}; nothing was read or written"
                ));
                return Ok(2);
            }
        }
        Ok(None) => {}
        Err(e) => {
            say(e);
            return Ok(2);
        }
    }
    check_destination("-o", &st.output)?;
    let mut inputs = Inputs::default();
    for p in &st.inputs {
        inputs.read(p)?;
    }
    let Inputs { runs, mut notes } = inputs;
    let (data, usages) = runs_to_pages(runs, &mut notes);
    if data.is_empty() {
        for n in &notes {
            say(n);
        }
        let files: Vec<String> = st.inputs.iter().map(|p| p.display().to_string()).collect();
        bail!("no samples in {}; no report written", files.join(", "));
    }
    let combined = (data.len() > 1).then(|| report::combine(&usages.iter().collect::<Vec<_>>()));
    if let Some(c) = combined.as_ref().filter(|c| c.memory_left_out > 0) {
        notes.push(format!(
            "{} run(s) measured memory another way than the first run ({}) and are not combined with it",
            c.memory_left_out,
            c.memory_source.unwrap_or("rss")
        ));
    }
    let (rec, duration) = match &combined {
        Some(c) => (
            c.recommendation.clone(),
            c.stats.as_ref().map_or(0.0, |s| s.duration_secs),
        ),
        None => (
            data[0].recommendation.clone(),
            data[0].stats.as_ref().map_or(0.0, |s| s.duration_secs),
        ),
    };
    let server = st.keeper.as_deref().and_then(|url| {
        let cloud = data[0].summary.as_ref().and_then(cloud_of);
        ask_keeper(url, rec.as_ref(), cloud.as_ref(), duration)
    });
    let mut hosts: Vec<&str> = data
        .iter()
        .flat_map(|d| &d.hosts)
        .map(String::as_str)
        .collect();
    hosts.sort_unstable();
    hosts.dedup();
    if hosts.len() > 1 {
        notes.push(format!(
            "the runs come from different hosts ({}); their statistics are combined all the same",
            hosts.join("; ")
        ));
    }
    let skipped: u64 = data.iter().map(|d| d.skipped).sum();
    let (title, status) = title_and_status(&st, &data);
    let page = Page {
        title,
        status,
        version: env!("CARGO_PKG_VERSION"),
        generated_secs: unix_now(),
        runs: data,
        combined,
        server,
        notes: notes.clone(),
        hints: st.hints,
    };
    let size = write_page(&st.output, &page, None)?;
    for n in &notes {
        say(n);
    }
    if skipped > 0 {
        say(format_args!(
            "{skipped} line(s) could not be read; the report lists them"
        ));
    }
    say(format_args!(
        "report written to {} ({} KiB, {} run(s))",
        st.output.display(),
        size.div_ceil(1024),
        page.runs.len()
    ));
    Ok(0)
}
