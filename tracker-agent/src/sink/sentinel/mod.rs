//! Streaming to Sentinel (docs/streaming.md): register the run, upload gzip CSV
//! batches to S3 with temporary credentials, finish the run. Everything runs on its
//! own thread with its own runtime, so sampling never waits on the network.

mod api;
mod queue;
mod s3;

use std::{
    path::PathBuf,
    sync::mpsc::Receiver,
    thread::JoinHandle,
    time::{Duration, Instant, SystemTime},
};

use aws_sdk_s3::primitives::{DateTime, DateTimeFormat};
use serde_json::{json, Map, Value};
use tokio::sync::mpsc;

use super::Sink;
use crate::model::{csv, Discovered, HostInfo, JobMeta, Sample, StreamReport, Summary};
use api::{Api, ApiError, Credentials, Registration};
use queue::Queue;

/// Refresh credentials when this little is left before they expire.
const REFRESH_BEFORE: Duration = Duration::from_secs(300);
/// Time allowed at the end for the last uploads and `finish`.
const FINISH_BUDGET: Duration = Duration::from_secs(30);
/// Largest CSV sent inline; a longer run with no upload flushes to S3 instead.
const INLINE_MAX: usize = 8 << 20;

/// The API token; never printed, not even by `{:?}`.
#[derive(Clone)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

pub const DEFAULT_API_URL: &str = "https://api.sentinel.sparecores.net";

/// How to reach Sentinel and how to hold batches meanwhile.
#[derive(Clone, Debug)]
pub struct Config {
    pub token: Secret,
    /// Base URL without a trailing slash (`SENTINEL_API_URL`).
    pub api_url: String,
    /// S3 endpoint for tests and private stores (`TRACKER_S3_ENDPOINT`, path-style).
    pub s3_endpoint: Option<String>,
    /// Bytes of pending batches kept in memory before they go to the spool file
    /// (`TRACKER_UPLOAD_MEMORY_LIMIT`).
    pub memory_limit: usize,
    /// Directory of the spool file (`TRACKER_SPOOL_DIR`, default the temp dir).
    pub spool_dir: PathBuf,
    /// Timeout of each API and S3 request (`TRACKER_HTTP_TIMEOUT`, seconds).
    pub timeout: Duration,
    /// Seconds between batch uploads (`TRACKER_UPLOAD_INTERVAL`).
    pub upload_interval: f64,
}

/// What the run registers with.
pub struct RunInfo {
    pub meta: JobMeta,
    pub command: Vec<String>,
    pub host: HostInfo,
    pub share_identity: bool,
}

enum Msg {
    Row(String),
    Finish { exit_code: i32 },
}

pub struct Streamer {
    tx: mpsc::UnboundedSender<Msg>,
    handle: Option<JoinHandle<StreamReport>>,
}

impl Streamer {
    /// Starts the streaming thread. It registers the run once discovery has
    /// answered on `found`; rows queue meanwhile.
    pub fn start(
        cfg: Config,
        run: RunInfo,
        found: Receiver<Discovered>,
    ) -> anyhow::Result<Streamer> {
        let (tx, rx) = mpsc::unbounded_channel();
        let handle = std::thread::Builder::new()
            .name("sentinel".into())
            .spawn(move || {
                let found = found.recv().unwrap_or_default();
                let rt = match tokio::runtime::Builder::new_current_thread()
                    .enable_all()
                    .build()
                {
                    Ok(rt) => rt,
                    Err(e) => {
                        log::warn!("Sentinel streaming off: starting its runtime: {e}");
                        return StreamReport::default();
                    }
                };
                let report = rt.block_on(run_stream(cfg, run, found, rx));
                // A DNS lookup still blocked in the pool must not hold up the exit.
                rt.shutdown_background();
                report
            })?;
        Ok(Streamer {
            tx,
            handle: Some(handle),
        })
    }
}

impl Sink for Streamer {
    /// Queues the sample's CSV row. Never blocks.
    fn write(&mut self, s: &Sample) -> anyhow::Result<()> {
        let _ = self.tx.send(Msg::Row(csv::row(s)));
        Ok(())
    }

    /// Flushes, sends `finish`, and waits for the thread (bounded by FINISH_BUDGET
    /// plus one request timeout); how it went goes into the summary.
    fn finish(&mut self, summary: &mut Summary) -> anyhow::Result<()> {
        let Some(handle) = self.handle.take() else {
            return Ok(());
        };
        let exit_code = summary.exit_code.unwrap_or(0);
        let _ = self.tx.send(Msg::Finish { exit_code });
        summary.streaming = Some(handle.join().unwrap_or_else(|_| StreamReport {
            last_error: Some("the streaming thread panicked".into()),
            ..StreamReport::default()
        }));
        Ok(())
    }
}

/// The `POST /runs` body: flat, nulls dropped; identifying fields only on opt-in.
fn registration_body(run: &RunInfo, found: &Discovered) -> Value {
    let cloud = found.cloud.as_ref();
    let mut m = Map::new();
    let mut merge = |v: Value| {
        if let Value::Object(o) = v {
            for (k, v) in o {
                if !v.is_null() {
                    m.insert(k, v);
                }
            }
        }
    };
    merge(serde_json::to_value(&run.meta).unwrap_or_default());
    merge(serde_json::to_value(&run.host).unwrap_or_default());
    if let Some(c) = cloud {
        merge(json!({
            "cloud_vendor_id": c.cloud_vendor_id,
            "cloud_region_id": c.cloud_region_id,
            "cloud_zone_id": c.cloud_zone_id,
            "cloud_instance_type": c.cloud_instance_type,
        }));
        if run.share_identity {
            merge(json!({ "cloud_account_id": c.cloud_account_id }));
        }
    }
    if let (true, Some(id)) = (run.share_identity, &found.identity) {
        merge(serde_json::to_value(id).unwrap_or_default());
    }
    if run.meta.tags.is_empty() {
        m.remove("tags");
    }
    if !run.command.is_empty() {
        // A JSON-encoded array as a string: an actual array is answered with 422.
        let c = serde_json::to_string(&run.command).unwrap_or_default();
        m.insert("command".into(), Value::String(c));
    }
    Value::Object(m)
}

fn iso_now() -> String {
    DateTime::from(SystemTime::now())
        .fmt(DateTimeFormat::DateTime)
        .unwrap_or_default()
}

struct Uploader {
    cfg: Config,
    api: Api,
    timeout: Duration,
    q: Queue,
    body: Value,
    reg: Option<Registration>,
    client: Option<aws_sdk_s3::Client>,
    force_refresh: bool,
    uploaded: Vec<String>,
    put_sent: bool,
    report: StreamReport,
    backoff: Duration,
    max_backoff: Duration,
    retry_at: Option<tokio::time::Instant>,
    /// Consecutive failures of the current episode (0: all well).
    failing: u64,
    /// The reason last warned about in this episode.
    warned: Option<String>,
    told_unregistered: bool,
}

impl Uploader {
    /// A failure: warned once per distinct reason within an episode (a retry that
    /// fails the same way again is logged at debug), then a retry is scheduled.
    fn fail(&mut self, what: &str, e: &str) {
        let e = self.api.redact(e);
        if self.failing == 0 || self.warned.as_deref() != Some(e.as_str()) {
            log::warn!("Sentinel: {what}: {e}; the data is kept and retried");
            self.warned = Some(e.clone());
        } else {
            log::debug!("Sentinel: {what} (failure {}): {e}", self.failing + 1);
        }
        self.schedule_retry(what, e);
    }

    /// Counts the failure, keeps its reason and schedules the next try with backoff.
    fn schedule_retry(&mut self, what: &str, e: String) {
        self.failing += 1;
        self.report.last_error = Some(format!("{what}: {e}"));
        self.retry_at = Some(tokio::time::Instant::now() + self.backoff);
        self.backoff = (self.backoff * 2).min(self.max_backoff);
    }

    fn recovered(&mut self) {
        if self.failing > 0 {
            log::warn!(
                "Sentinel: working again after {} failed attempts",
                self.failing
            );
        }
        self.failing = 0;
        self.warned = None;
        self.backoff = Duration::from_secs(1);
        self.retry_at = None;
    }

    fn creds(&self) -> Option<&Credentials> {
        self.reg.as_ref().map(|r| &r.credentials)
    }

    async fn register(&mut self) -> bool {
        if self.reg.is_some() {
            return true;
        }
        match self.api.register(&self.body).await {
            Ok(r) => {
                log::info!(
                    "Sentinel: run {} registered, uploading to s3://{}/{}",
                    r.run_id,
                    r.prefix.bucket,
                    r.prefix.key
                );
                self.report.run_id = Some(r.run_id.clone());
                self.reg = Some(r);
                self.client = None;
                true
            }
            Err(e) if !self.told_unregistered => {
                // The first time, say what it means for the run; retries that fail
                // the same way are then quiet (see `fail`).
                self.told_unregistered = true;
                let e = self.api.redact(&e.to_string());
                log::warn!(
                    "Sentinel API {}: registering the run failed: {e}; the run goes on locally and registration is retried",
                    self.cfg.api_url
                );
                self.warned = Some(e.clone());
                self.schedule_retry("registering the run", e);
                false
            }
            Err(e) => {
                self.fail("registering the run", &e.to_string());
                false
            }
        }
    }

    async fn refresh(&mut self) -> Result<(), ApiError> {
        let Some(run_id) = self.reg.as_ref().map(|r| r.run_id.clone()) else {
            return Ok(());
        };
        let c = self.api.refresh(&run_id).await?;
        if let Some(r) = self.reg.as_mut() {
            r.credentials = c;
        }
        self.client = None;
        self.force_refresh = false;
        self.report.credential_refreshes += 1;
        Ok(())
    }

    async fn client(&mut self) -> Option<aws_sdk_s3::Client> {
        if let Some(c) = &self.client {
            return Some(c.clone());
        }
        let r = self.reg.as_ref()?;
        let (creds, bucket) = (r.credentials.clone(), r.prefix.bucket.clone());
        let endpoint = self.cfg.s3_endpoint.as_deref();
        let region = match (&creds.region, endpoint) {
            (Some(r), _) => r.clone(),
            (None, Some(_)) => "us-east-1".to_string(),
            (None, None) => {
                let probe = s3::client(&creds, "us-east-1", None, self.timeout);
                s3::bucket_region(&probe, &bucket)
                    .await
                    .unwrap_or_else(|| s3::DEFAULT_REGION.to_string())
            }
        };
        let c = s3::client(&creds, &region, endpoint, self.timeout);
        self.client = Some(c.clone());
        Some(c)
    }

    /// Registers if needed, then uploads sealed batches oldest first until none is
    /// left or one fails (then a retry is scheduled).
    async fn work(&mut self) {
        if !self.register().await {
            return;
        }
        let mut auth_retried = false;
        loop {
            let batch = match self.q.front() {
                Ok(Some(b)) => b,
                Ok(None) => {
                    self.recovered();
                    return;
                }
                Err(e) => {
                    self.fail("reading the spool file", &e.to_string());
                    return;
                }
            };
            let due = self.creds().is_some_and(|c| {
                c.expires_at
                    .duration_since(SystemTime::now())
                    .map_or(true, |left| left <= REFRESH_BEFORE)
            });
            if due || self.force_refresh {
                if let Err(e) = self.refresh().await {
                    if self.force_refresh {
                        self.fail("refreshing the upload credentials", &e.to_string());
                        return;
                    }
                    // Still valid for a while: keep the old ones and try again later.
                    log::warn!("Sentinel: refreshing the upload credentials failed: {}; keeping the current ones", self.api.redact(&e.to_string()));
                    self.report.last_error = Some(format!("refresh: {e}"));
                }
            }
            let (seq, rows, gz) = batch;
            let Some(reg) = &self.reg else { return };
            let key = reg.prefix.object_key(seq);
            let uri = reg.prefix.uri(&key);
            let bucket = reg.prefix.bucket.clone();
            let Some(client) = self.client().await else {
                return;
            };
            self.put_sent = true;
            match s3::put(&client, &bucket, &key, gz).await {
                Ok(()) => {
                    log::debug!("Sentinel: uploaded {uri} ({rows} rows)");
                    self.uploaded.push(uri);
                    self.q.pop_front();
                    self.report.batches_uploaded += 1;
                    self.report.rows_uploaded += rows as u64;
                    self.recovered();
                    auth_retried = false;
                }
                Err(s3::PutError::Auth(m)) if !auth_retried => {
                    log::info!("Sentinel: {uri}: {m}; refreshing the credentials");
                    self.report.upload_failures += 1;
                    self.force_refresh = true;
                    auth_retried = true;
                }
                Err(e) => {
                    if matches!(e, s3::PutError::Auth(_)) {
                        self.force_refresh = true;
                    }
                    self.report.upload_failures += 1;
                    self.fail(&format!("uploading {uri}"), &e.to_string());
                    return;
                }
            }
        }
    }

    /// The end: last uploads, then `finish`. Batches that cannot be uploaded are
    /// written to disk.
    async fn finish(&mut self, exit_code: i32) {
        let deadline = tokio::time::Instant::now() + FINISH_BUDGET;
        if let Err(e) = self.q.seal() {
            self.report.last_error = Some(format!("sealing the last batch: {e}"));
        }
        if self.reg.is_none() {
            self.register().await;
        }
        let Some(run_id) = self.reg.as_ref().map(|r| r.run_id.clone()) else {
            log::warn!("Sentinel: the run was never registered; nothing was sent");
            self.keep();
            return;
        };
        // Inline only when no PUT was ever sent: one that timed out may still have
        // landed, and then its retry must overwrite it and `finish` must list it.
        let inline_csv = match self.put_sent {
            false => self.q.all_csv().ok().filter(|s| s.len() <= INLINE_MAX),
            true => None,
        };
        let inline = inline_csv.is_some();
        let status = if exit_code == 0 { "finished" } else { "failed" };
        let body = if let Some(csv) = inline_csv {
            json!({"exit_code": exit_code, "run_status": status, "data_source": "inline",
                   "data_csv": csv, "finished_at": iso_now()})
        } else {
            while self.q.sealed_len() > 0 && tokio::time::Instant::now() < deadline {
                if let Some(t) = self.retry_at {
                    tokio::time::sleep_until(t.min(deadline)).await;
                }
                self.work().await;
            }
            self.keep();
            json!({"exit_code": exit_code, "run_status": status, "data_source": "s3",
                   "data_uris": self.uploaded, "finished_at": iso_now()})
        };
        let mut backoff = Duration::from_secs(1);
        loop {
            match self.api.finish(&run_id, &body).await {
                Ok(stats) => {
                    log::info!("Sentinel: run {run_id} finished: {stats}");
                    self.report.finished = true;
                    self.report.data_source = Some(if inline { "inline" } else { "s3" });
                    if inline {
                        self.report.rows_uploaded = self.q.rows_waiting() as u64;
                    }
                    return;
                }
                Err(e) if e.retryable() && tokio::time::Instant::now() + backoff < deadline => {
                    log::debug!(
                        "Sentinel: finish failed ({}), retrying",
                        self.api.redact(&e.to_string())
                    );
                    tokio::time::sleep(backoff).await;
                    backoff *= 2;
                }
                Err(e) => {
                    let e = self.api.redact(&e.to_string());
                    log::warn!("Sentinel: finishing run {run_id} failed: {e}");
                    self.report.last_error = Some(format!("finish: {e}"));
                    if inline {
                        self.keep();
                    }
                    return;
                }
            }
        }
    }

    /// Batches not uploaded go to `<spool dir>/resource-tracker-unsent-<pid>/`.
    fn keep(&mut self) {
        let _ = self.q.seal();
        if self.q.sealed_len() == 0 {
            return;
        }
        let dir = self
            .cfg
            .spool_dir
            .join(format!("resource-tracker-unsent-{}", std::process::id()));
        match self.q.keep(&dir) {
            Ok(n) => {
                log::warn!(
                    "Sentinel: {n} batches were not uploaded; kept in {}",
                    dir.display()
                );
                self.report.kept_dir = Some(dir);
            }
            Err(e) => log::warn!(
                "Sentinel: keeping the batches that were not uploaded in {}: {e}",
                dir.display()
            ),
        }
    }
}

async fn run_stream(
    cfg: Config,
    run: RunInfo,
    found: Discovered,
    mut rx: mpsc::UnboundedReceiver<Msg>,
) -> StreamReport {
    let timeout = cfg.timeout;
    let api = match Api::new(&cfg.api_url, cfg.token.clone(), timeout) {
        Ok(a) => a,
        Err(e) => {
            log::warn!("Sentinel streaming off: {e}");
            return StreamReport::default();
        }
    };
    let period = Duration::from_secs_f64(cfg.upload_interval);
    let mut u = Uploader {
        q: Queue::new(csv::header() + "\n", cfg.memory_limit, &cfg.spool_dir),
        body: registration_body(&run, &found),
        report: StreamReport {
            api_url: cfg.api_url.clone(),
            ..StreamReport::default()
        },
        cfg,
        api,
        timeout,
        reg: None,
        client: None,
        force_refresh: false,
        uploaded: Vec::new(),
        put_sent: false,
        backoff: Duration::from_secs(1),
        max_backoff: period.clamp(Duration::from_secs(1), Duration::from_secs(60)),
        retry_at: None,
        failing: 0,
        warned: None,
        told_unregistered: false,
    };
    u.register().await;
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let started = Instant::now();
    let exit_code = loop {
        tokio::select! {
            m = rx.recv() => match m {
                Some(Msg::Row(r)) => {
                    u.report.rows += 1;
                    if let Err(e) = u.q.push(&r) {
                        u.report.last_error = Some(format!("spooling: {e}"));
                        log::warn!("Sentinel: spooling rows: {e}");
                    }
                }
                Some(Msg::Finish { exit_code }) => break exit_code,
                None => break 0,
            },
            _ = tick.tick() => {
                if let Err(e) = u.q.seal() {
                    log::warn!("Sentinel: sealing a batch: {e}");
                }
                if u.retry_at.is_none() {
                    u.work().await;
                }
            }
            _ = async { match u.retry_at { Some(t) => tokio::time::sleep_until(t).await, None => std::future::pending().await } } => {
                u.retry_at = None;
                u.work().await;
            }
        }
    };
    // Rows sent before Finish are already received (one channel, in order).
    while let Ok(Msg::Row(r)) = rx.try_recv() {
        u.report.rows += 1;
        let _ = u.q.push(&r);
    }
    log::debug!(
        "Sentinel: finishing after {:.1} s",
        started.elapsed().as_secs_f64()
    );
    u.finish(exit_code).await;
    u.report.spooled_batches = u.q.spooled;
    u.report
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::{CloudInfo, Identity};

    fn run(share: bool) -> RunInfo {
        let mut meta = JobMeta {
            job_name: Some("train".into()),
            ..JobMeta::default()
        };
        meta.tags.insert("k".into(), "v".into());
        RunInfo {
            meta,
            command: vec!["python".into(), "train.py".into()],
            host: HostInfo {
                host_vcpus: Some(2),
                ..HostInfo::default()
            },
            share_identity: share,
        }
    }

    #[test]
    fn registration_follows_the_protocol() {
        let cloud = CloudInfo {
            cloud_vendor_id: "aws".into(),
            cloud_account_id: Some("123".into()),
            cloud_region_id: Some("eu-west-1".into()),
            instance_id: Some("i-1".into()),
            ..CloudInfo::default()
        };
        let found = Discovered {
            cloud: Some(cloud.clone()),
            identity: Some(Identity {
                host_id: Some("i-1".into()),
                ..Identity::default()
            }),
        };
        let b = registration_body(&run(false), &found);
        assert_eq!(b["command"], json!("[\"python\",\"train.py\"]"));
        assert_eq!(b["job_name"], json!("train"));
        assert_eq!(b["tags"], json!({"k": "v"}));
        assert_eq!(b["host_vcpus"], json!(2));
        assert_eq!(b["cloud_vendor_id"], json!("aws"));
        let o = b.as_object().unwrap();
        assert!(o.values().all(|v| !v.is_null()), "{b}");
        for k in [
            "pid",
            "cloud_account_id",
            "host_id",
            "host_hostname",
            "host_ip",
            "cloud_zone_id",
        ] {
            assert!(!o.contains_key(k), "{k} in {b}");
        }
        let b = registration_body(&run(true), &found);
        assert_eq!(b["cloud_account_id"], json!("123"));
        assert_eq!(b["host_id"], json!("i-1"));
        let mut r = run(false);
        r.meta.tags.clear();
        r.command.clear();
        let b = registration_body(&r, &Discovered::default());
        assert!(b.get("tags").is_none() && b.get("command").is_none(), "{b}");
    }
}
