//! OTLP/HTTP export of the samples' metrics (docs/otlp.md): protobuf, gzip, to
//! the endpoint the OpenTelemetry variables name. Requests are built on a thread
//! of their own, every export interval and at the end, so sampling never waits on
//! the collector; a collector that is down or slow gets retries with back-off from
//! a queue bounded in bytes, and what is never delivered is counted in the summary.
//!
//! The messages are opentelemetry-proto's (the opentelemetry-rust project's own);
//! the SDK's meters and readers are not used: the samples already are the
//! measurements, each with its time, and its periodic reader would resample them
//! on a clock of its own (the last cumulative value exported would then not be
//! the summary's).

use std::{
    collections::VecDeque,
    thread::JoinHandle,
    time::{Duration, Instant},
};

use opentelemetry_proto::tonic::{
    collector::metrics::v1::{ExportMetricsServiceRequest, ExportMetricsServiceResponse},
    common::v1::{any_value, AnyValue, InstrumentationScope, KeyValue},
    metrics::v1::{
        metric::Data, number_data_point::Value, AggregationTemporality, Gauge, Metric,
        NumberDataPoint, ResourceMetrics, ScopeMetrics, Sum,
    },
    resource::v1::Resource,
};
use prost::Message as _;
use tokio::sync::mpsc;

use super::base::Sink;
use crate::{
    model::{
        fields::Kind,
        node::NodeScan,
        otlp::{description, node_points, points, Attrs, Point, Totals},
        JobMeta, OtlpReport, Sample, Summary,
    },
    warn::say,
};

/// What the OpenTelemetry variables (or `--otlp-endpoint`) asked for.
#[derive(Clone, Debug)]
pub struct Config {
    /// The metrics URL, `/v1/metrics` included.
    pub endpoint: String,
    /// Sent to `endpoint` only (redirects are not followed); never logged.
    pub headers: Headers,
    pub timeout: Duration,
    pub interval: Duration,
    /// `OTEL_RESOURCE_ATTRIBUTES` and `OTEL_SERVICE_NAME`.
    pub resource: Vec<(String, String)>,
}

/// Header names and values; the values are secrets (tokens), so Debug shows the
/// names only.
#[derive(Clone, Default, PartialEq)]
pub struct Headers(pub Vec<(String, String)>);

impl std::fmt::Debug for Headers {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_list()
            .entries(self.0.iter().map(|(k, _)| format!("{k}: ***")))
            .finish()
    }
}

/// The most the queue of unsent requests holds (gzip'd bytes); past it the oldest
/// request is dropped and counted.
const QUEUE_BYTES: usize = 16 << 20;
/// Samples (or scans) in one request at most, however long the interval, and
/// points: a node's scan has every container's.
const MAX_BATCH: usize = 600;
const MAX_BATCH_POINTS: usize = 20_000;
/// How long the end may wait for the collector, all requests together.
const END_BUDGET: Duration = Duration::from_secs(5);
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// Points under one resource: the attributes it adds to the run's (a
/// container's on the node, the tracked pid), and the points.
type Group = (Attrs, Vec<Point>);
/// Points by the time of their sample, in ns.
type Batch = Vec<(u64, Vec<Point>)>;

enum Msg {
    /// One sample's (or scan's) time in ns, and its points.
    Points(u64, Vec<Group>),
    Finish,
}

pub struct Exporter {
    tx: mpsc::UnboundedSender<Msg>,
    handle: Option<JoinHandle<OtlpReport>>,
    totals: Totals,
    endpoint: String,
}

impl Exporter {
    /// Starts the export thread. The job's metadata goes into the resource beside
    /// the user's attributes, and the tracked pid once the first sample has it.
    pub fn start(cfg: Config, meta: &JobMeta) -> anyhow::Result<Exporter> {
        let resource = resource(&cfg, meta);
        let (tx, rx) = mpsc::unbounded_channel();
        let endpoint = cfg.endpoint.clone();
        let handle = std::thread::Builder::new()
            .name("otlp".into())
            .spawn(move || {
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        return OtlpReport {
                            endpoint: cfg.endpoint.clone(),
                            last_error: Some(format!("starting its runtime: {e}")),
                            ..OtlpReport::default()
                        }
                    }
                };
                let report = rt.block_on(run(cfg, resource, rx));
                rt.shutdown_background();
                report
            })?;
        Ok(Exporter {
            tx,
            handle: Some(handle),
            totals: Totals::default(),
            endpoint,
        })
    }
}

impl Sink for Exporter {
    /// The sample's points go to the export thread. Never blocks.
    fn write(&mut self, s: &Sample) -> anyhow::Result<()> {
        let pts = points(s, &mut self.totals);
        let ns = (s.timestamp_secs.max(0.0) * 1e9) as u64;
        let pid = s.tracked_pid.map(|p| ("process.pid", p.to_string()));
        let _ = self
            .tx
            .send(Msg::Points(ns, vec![(pid.into_iter().collect(), pts)]));
        Ok(())
    }

    fn finish(&mut self, summary: &mut Summary) -> anyhow::Result<()> {
        summary.otlp = self.end();
        Ok(())
    }
}

/// The node agent's scans: each container under a resource of its own.
impl Sink<NodeScan, ()> for Exporter {
    fn write(&mut self, scan: &NodeScan) -> anyhow::Result<()> {
        let ns = (crate::model::reading::unix_now() * 1e9) as u64;
        let pts = node_points(&scan.snapshot, &mut self.totals);
        let _ = self.tx.send(Msg::Points(ns, pts));
        Ok(())
    }

    fn finish(&mut self, _: &mut ()) -> anyhow::Result<()> {
        self.end();
        Ok(())
    }
}

impl Exporter {
    /// Sends what is left (within the end's budget) and says what was lost.
    fn end(&mut self) -> Option<OtlpReport> {
        let h = self.handle.take()?;
        let _ = self.tx.send(Msg::Finish);
        let report = h.join().unwrap_or_else(|_| OtlpReport {
            endpoint: self.endpoint.clone(),
            last_error: Some("the export thread panicked".into()),
            ..OtlpReport::default()
        });
        if report.points_dropped > 0 {
            say(format_args!(
                "OTLP: {} data point(s) not delivered to {} ({})",
                report.points_dropped,
                report.endpoint,
                report.last_error.as_deref().unwrap_or("queue full")
            ));
        }
        Some(report)
    }
}

fn kv(k: &str, v: &str) -> KeyValue {
    KeyValue {
        key: k.to_string(),
        value: Some(AnyValue {
            value: Some(any_value::Value::StringValue(v.to_string())),
        }),
        ..KeyValue::default()
    }
}

/// The resource: the user's attributes first (they win), then ours where the
/// user gave none of the same key.
fn resource(cfg: &Config, meta: &JobMeta) -> Resource {
    let mut attrs: Vec<(String, String)> = cfg.resource.clone();
    let mut ours = vec![
        ("service.name".to_string(), "resource-tracker".to_string()),
        (
            "resource_tracker.version".to_string(),
            env!("CARGO_PKG_VERSION").to_string(),
        ),
    ];
    for (k, v) in meta.set_fields() {
        ours.push((format!("resource_tracker.job.{k}"), v));
    }
    for (t, v) in &meta.tags {
        ours.push((format!("resource_tracker.tag.{t}"), v.clone()));
    }
    for (k, v) in ours {
        if !attrs.iter().any(|(a, _)| *a == k) {
            attrs.push((k, v));
        }
    }
    Resource {
        attributes: attrs.iter().map(|(k, v)| kv(k, v)).collect(),
        ..Resource::default()
    }
}

/// One request's metrics from a batch of samples: a metric per name, its points
/// in time order; sums cumulative from `start_ns`.
fn metrics(batch: &[(u64, Vec<Point>)], start_ns: u64) -> (Vec<Metric>, u64) {
    let mut out: Vec<Metric> = Vec::new();
    let mut n = 0;
    for (ns, pts) in batch {
        for p in pts {
            let dp = NumberDataPoint {
                attributes: p.attrs.iter().map(|(k, v)| kv(k, v)).collect(),
                start_time_unix_nano: if p.kind == Kind::Gauge { 0 } else { start_ns },
                time_unix_nano: *ns,
                value: Some(if p.int {
                    Value::AsInt(p.value.round() as i64)
                } else {
                    Value::AsDouble(p.value)
                }),
                ..NumberDataPoint::default()
            };
            n += 1;
            let m = match out.iter_mut().position(|m| m.name == p.name) {
                Some(i) => &mut out[i],
                None => {
                    let data = if p.kind == Kind::Gauge {
                        Data::Gauge(Gauge::default())
                    } else {
                        Data::Sum(Sum {
                            aggregation_temporality: AggregationTemporality::Cumulative as i32,
                            is_monotonic: true,
                            ..Sum::default()
                        })
                    };
                    out.push(Metric {
                        name: p.name.to_string(),
                        unit: p.unit.to_string(),
                        description: description(p.description),
                        data: Some(data),
                        ..Metric::default()
                    });
                    out.last_mut().expect("just pushed")
                }
            };
            match &mut m.data {
                Some(Data::Gauge(g)) => g.data_points.push(dp),
                Some(Data::Sum(s)) => s.data_points.push(dp),
                _ => {}
            }
        }
    }
    (out, n)
}

struct Pending {
    body: Vec<u8>,
    points: u64,
}

/// What one attempt came to.
enum Sent {
    Ok {
        rejected: u64,
    },
    /// Worth another try (no answer, 429, 502, 503, 504).
    Retry(String),
    /// Refused for good.
    Refused(String),
}

/// `data` as a gzip member, deflated by `z` (reset first). One compressor for
/// every request: a new one per request (flate2's `GzEncoder`) allocated and
/// zeroed its ~300 KiB of state each time, which with one request a sample took
/// more of the tracker's CPU than the rest of the export (perf, docs/otlp.md).
fn gzip(z: &mut flate2::Compress, data: &[u8]) -> std::io::Result<Vec<u8>> {
    // RFC 1952: magic, deflate, no flags, no time, no extra flags, unknown OS.
    let mut out = Vec::with_capacity(data.len() / 2 + 64);
    out.extend_from_slice(&[0x1f, 0x8b, 8, 0, 0, 0, 0, 0, 0, 0xff]);
    z.reset();
    loop {
        let done = z.total_in() as usize;
        out.reserve(4096);
        let st = z
            .compress_vec(&data[done..], &mut out, flate2::FlushCompress::Finish)
            .map_err(std::io::Error::other)?;
        if st == flate2::Status::StreamEnd {
            break;
        }
    }
    let mut crc = flate2::Crc::new();
    crc.update(data);
    out.extend_from_slice(&crc.sum().to_le_bytes());
    out.extend_from_slice(&(data.len() as u32).to_le_bytes());
    Ok(out)
}

struct State {
    cfg: Config,
    deflate: flate2::Compress,
    /// The endpoint, parsed once.
    url: Option<reqwest::Url>,
    client: Option<reqwest::Client>,
    resource: Resource,
    start_ns: Option<u64>,
    batch: Vec<(u64, Vec<Group>)>,
    batch_points: usize,
    queue: VecDeque<Pending>,
    queued_bytes: usize,
    report: OtlpReport,
    said_failing: bool,
    said_full: bool,
}

impl State {
    /// The batch as one gzip'd request at the end of the queue; the oldest
    /// requests dropped while the queue is over its bound.
    fn seal(&mut self) {
        if self.batch.is_empty() {
            return;
        }
        let start = self.start_ns.unwrap_or(0);
        // The batch's points by resource, each in time order.
        self.batch_points = 0;
        let mut by: Vec<(Attrs, Batch)> = Vec::new();
        for (ns, groups) in self.batch.drain(..) {
            for (extra, pts) in groups {
                match by.iter_mut().find(|(e, _)| *e == extra) {
                    Some((_, b)) => b.push((ns, pts)),
                    None => by.push((extra, vec![(ns, pts)])),
                }
            }
        }
        let mut n = 0;
        let mut resource_metrics = Vec::with_capacity(by.len());
        for (extra, b) in by {
            let (metrics, k) = metrics(&b, start);
            n += k;
            let mut resource = self.resource.clone();
            for (key, v) in &extra {
                resource.attributes.retain(|a| a.key != *key);
                resource.attributes.push(kv(key, v));
            }
            resource_metrics.push(ResourceMetrics {
                resource: Some(resource),
                scope_metrics: vec![ScopeMetrics {
                    scope: Some(InstrumentationScope {
                        name: "resource-tracker".into(),
                        version: env!("CARGO_PKG_VERSION").into(),
                        ..InstrumentationScope::default()
                    }),
                    metrics,
                    ..ScopeMetrics::default()
                }],
                ..ResourceMetrics::default()
            });
        }
        let req = ExportMetricsServiceRequest { resource_metrics };
        let body = match gzip(&mut self.deflate, &req.encode_to_vec()) {
            Ok(b) => b,
            Err(e) => {
                self.report.points_dropped += n;
                self.report.last_error = Some(format!("compressing a request: {e}"));
                return;
            }
        };
        self.queued_bytes += body.len();
        self.queue.push_back(Pending { body, points: n });
        while self.queued_bytes > QUEUE_BYTES && self.queue.len() > 1 {
            let Some(old) = self.queue.pop_front() else {
                break;
            };
            self.queued_bytes -= old.body.len();
            self.report.points_dropped += old.points;
            if !self.said_full {
                self.said_full = true;
                say(format_args!(
                    "OTLP: {} is behind: the oldest points are dropped (the queue holds {} MiB; counted in the summary)",
                    self.cfg.endpoint,
                    QUEUE_BYTES >> 20
                ));
            }
        }
    }

    async fn send(&mut self, timeout: Duration) -> Sent {
        let Some(client) = &self.client else {
            return Sent::Refused("no HTTP client".into());
        };
        let Some(head) = self.queue.front() else {
            return Sent::Ok { rejected: 0 };
        };
        let Some(url) = self.url.clone() else {
            return Sent::Refused(format!("{}: not a URL", self.cfg.endpoint));
        };
        let mut req = client
            .post(url)
            .timeout(timeout)
            .header("content-type", "application/x-protobuf")
            .header("content-encoding", "gzip")
            .body(head.body.clone());
        for (k, v) in &self.cfg.headers.0 {
            req = req.header(k.as_str(), v.as_str());
        }
        let resp = match req.send().await {
            Ok(r) => r,
            // reqwest's error names the URL, never a header.
            Err(e) => return Sent::Retry(format!("{}: {}", self.cfg.endpoint, short(&e))),
        };
        let status = resp.status();
        let body = resp.bytes().await.unwrap_or_default();
        if status.is_success() {
            let rejected = ExportMetricsServiceResponse::decode(body.as_ref())
                .ok()
                .and_then(|r| r.partial_success)
                .map_or(0, |p| p.rejected_data_points.max(0) as u64);
            return Sent::Ok { rejected };
        }
        let why = format!("{}: HTTP {}", self.cfg.endpoint, status.as_u16());
        match status.as_u16() {
            429 | 502 | 503 | 504 => Sent::Retry(why),
            _ => Sent::Refused(why),
        }
    }

    /// Sends the queue's head until it is empty or an attempt fails; whether one
    /// failed that is worth another try (the caller waits before it).
    async fn drain(&mut self, timeout: Duration) -> bool {
        while !self.queue.is_empty() {
            match self.send(timeout).await {
                Sent::Ok { rejected } => {
                    let Some(p) = self.queue.pop_front() else {
                        break;
                    };
                    self.queued_bytes -= p.body.len();
                    self.report.requests += 1;
                    self.report.points_exported += p.points;
                    self.report.points_rejected += rejected;
                }
                Sent::Refused(why) => {
                    let Some(p) = self.queue.pop_front() else {
                        break;
                    };
                    self.queued_bytes -= p.body.len();
                    self.report.points_dropped += p.points;
                    self.failing(&why, "its points are dropped");
                }
                Sent::Retry(why) => {
                    self.failing(&why, "retrying with back-off");
                    return true;
                }
            }
        }
        false
    }

    fn failing(&mut self, why: &str, then: &str) {
        if !self.said_failing {
            self.said_failing = true;
            say(format_args!(
                "OTLP: {why}; {then} (said once; counted in the summary)"
            ));
        }
        self.report.last_error = Some(why.to_string());
    }
}

fn short(e: &reqwest::Error) -> String {
    if e.is_timeout() {
        "no answer in time".into()
    } else if e.is_connect() {
        "cannot connect".into()
    } else {
        let mut s = e.to_string();
        s.truncate(200);
        s
    }
}

async fn run(cfg: Config, resource: Resource, mut rx: mpsc::UnboundedReceiver<Msg>) -> OtlpReport {
    let client = reqwest::Client::builder()
        // Headers carry tokens: they go to the configured endpoint and nowhere else.
        .redirect(reqwest::redirect::Policy::none())
        .build();
    let mut st = State {
        report: OtlpReport {
            endpoint: cfg.endpoint.clone(),
            ..OtlpReport::default()
        },
        client: client.ok(),
        deflate: flate2::Compress::new(flate2::Compression::fast(), false),
        url: reqwest::Url::parse(&cfg.endpoint).ok(),
        cfg,
        resource,
        start_ns: None,
        batch: Vec::new(),
        batch_points: 0,
        queue: VecDeque::new(),
        queued_bytes: 0,
        said_failing: false,
        said_full: false,
    };
    let interval = st.cfg.interval;
    let mut next = tokio::time::Instant::now() + interval;
    let mut backoff = Duration::from_secs(1);
    let mut retry_at: Option<tokio::time::Instant> = None;
    loop {
        let wake = retry_at.map_or(next, |r| r.min(next));
        tokio::select! {
            m = rx.recv() => match m {
                Some(Msg::Points(ns, groups)) => {
                    // Cumulative sums start at the first sample's time.
                    st.start_ns.get_or_insert(ns);
                    st.batch_points += groups.iter().map(|(_, p)| p.len()).sum::<usize>();
                    st.batch.push((ns, groups));
                    if st.batch.len() >= MAX_BATCH || st.batch_points >= MAX_BATCH_POINTS {
                        st.seal();
                    }
                }
                Some(Msg::Finish) | None => break,
            },
            () = tokio::time::sleep_until(wake) => {}
        }
        let now = tokio::time::Instant::now();
        if now >= next {
            st.seal();
            next = now + interval;
        }
        if !st.queue.is_empty() && retry_at.is_none_or(|r| now >= r) {
            if st.drain(st.cfg.timeout).await {
                retry_at = Some(tokio::time::Instant::now() + backoff);
                backoff = (backoff * 2).min(MAX_BACKOFF);
            } else {
                retry_at = None;
                backoff = Duration::from_secs(1);
            }
        }
    }
    // The end: what is left, within the budget.
    st.seal();
    let end = Instant::now() + END_BUDGET;
    let mut pause = Duration::from_millis(250);
    while !st.queue.is_empty() {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        if st.drain(st.cfg.timeout.min(left)).await {
            tokio::time::sleep(pause.min(end.saturating_duration_since(Instant::now()))).await;
            pause = (pause * 2).min(Duration::from_secs(2));
        }
    }
    let unsent: u64 = st.queue.iter().map(|p| p.points).sum();
    st.report.points_dropped += unsent;
    st.report
}

#[cfg(test)]
mod tests {
    use std::io::Read as _;

    use super::gzip;

    #[test]
    fn one_compressor_makes_whole_gzip_members_again_and_again() {
        let mut z = flate2::Compress::new(flate2::Compression::fast(), false);
        for data in [b"x".repeat(100_000), b"otlp".to_vec(), Vec::new()] {
            let gz = gzip(&mut z, &data).unwrap();
            let mut back = Vec::new();
            flate2::read::GzDecoder::new(&gz[..])
                .read_to_end(&mut back)
                .unwrap();
            assert_eq!(back, data);
        }
    }
}
