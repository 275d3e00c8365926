//! The streaming thread: registers the run, uploads sealed batches with backoff,
//! refreshes credentials, and finishes the run.

use std::{
    collections::VecDeque,
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, Instant, SystemTime},
};

use aws_sdk_s3::primitives::{DateTime, DateTimeFormat};
use serde_json::{json, Value};
use tokio::sync::mpsc;

use super::{
    api::{self, Api, ApiError, Credentials, Registration},
    config::{registration_body, Config, Msg, RunInfo},
    journal::{Journal, RowAt},
    queue::Queue,
    s3,
};
use crate::model::{csv, Discovered, StreamReport};

/// Refresh credentials when this little is left before they expire.
const REFRESH_BEFORE: Duration = Duration::from_secs(300);
/// Time allowed at the end for the last uploads and `finish`.
const FINISH_BUDGET: Duration = Duration::from_secs(30);
/// Largest CSV sent inline; a longer run with no upload flushes to S3 instead.
const INLINE_MAX: usize = 8 << 20;

/// The command's end, told to the streaming thread the moment it comes: a request
/// in flight then (a registration allowed three request time-outs, which a hanging
/// API uses up) may run only until the end's budget is spent, so that the
/// tracker's exit waits no longer than that budget and one request time-out.
#[derive(Default)]
pub struct End {
    by: Mutex<Option<tokio::time::Instant>>,
    told: tokio::sync::Notify,
}

impl End {
    /// Called by the sink's `finish`, on the main thread: the end's deadline.
    pub fn now(&self) {
        let by = tokio::time::Instant::now() + FINISH_BUDGET;
        match self.by.lock() {
            Ok(mut g) => *g = Some(by),
            Err(p) => *p.into_inner() = Some(by),
        }
        self.told.notify_one();
    }

    fn by(&self) -> Option<tokio::time::Instant> {
        match self.by.lock() {
            Ok(g) => *g,
            Err(p) => *p.into_inner(),
        }
    }

    /// Ready once the end has come and its budget is spent.
    async fn spent(&self) {
        let by = match self.by() {
            Some(by) => by,
            None => {
                self.told.notified().await;
                self.by()
                    .unwrap_or_else(|| tokio::time::Instant::now() + FINISH_BUDGET)
            }
        };
        tokio::time::sleep_until(by).await;
    }
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
    /// The reason of the last refresh failure said while the current credentials
    /// still held: a reason is said once, not at every batch.
    refresh_warned: Option<String>,
    /// When the command ended (see `End`).
    end: Arc<End>,
    /// The front batch's PUT that got no answer and was not found stored since:
    /// (seq, key, bytes). It may still land, so its rows go inline only once S3
    /// says it holds no such object.
    maybe_landed: Option<(u32, String, usize)>,
    told_unregistered: bool,
    /// What the spool's failure costs, shared with the sampling thread, which names
    /// it in every sample from then on.
    degraded: Arc<Mutex<Option<String>>>,
    /// The last reason a row could not be queued, said once.
    said_push: Option<String>,
    /// When a refresh was last forced by a 403, and how long until the next may
    /// be: a 403 that refreshing does not cure is not refreshed at every retry.
    forced_at: Option<tokio::time::Instant>,
    forced_gap: Duration,
    /// The guardian's journal (the tracker only), and where each row not yet
    /// saved sits in it, one entry per row queued.
    journal: Option<Arc<Journal>>,
    pending: VecDeque<Option<RowAt>>,
    /// False when there is no registration body to register with (a guardian
    /// whose tracker died before it had one).
    may_register: bool,
    /// Whether the journal names the kept directory of a failed spool.
    kept_dir_told: bool,
}

/// Registration answers that could not be used after which registering stops:
/// each may have made a run on the server.
const MAX_UNUSABLE_REGISTRATIONS: u64 = 3;
/// The longest wait between refreshes forced by a persistent 403.
const MAX_FORCED_GAP: Duration = Duration::from_secs(300);

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

    /// Names a spool that failed, once per change: in a warning, in the report and
    /// for the samples.
    fn note_spool(&mut self) {
        if let (false, Some(j), Some(d)) = (self.kept_dir_told, &self.journal, self.q.kept_dir()) {
            // Its batches are in the journal too: a guardian that saves them
            // removes these copies, so that no row is kept twice.
            j.record('D', &Value::from(d.display().to_string()).to_string());
            self.kept_dir_told = true;
        }
        let Some(e) = &self.q.spool_failed else {
            return;
        };
        let detail = match &self.q.kept_failed {
            None => format!(
                "the spool failed ({e}); batches past the memory limit are kept in files under {}",
                crate::fsafe::temp_dir().display()
            ),
            Some(k) => format!(
                "the spool failed ({e}) and so did the kept directory ({k}); batches past the memory limit stay in memory"
            ),
        };
        if self.report.spool_failed.as_deref() == Some(detail.as_str()) {
            return;
        }
        log::warn!("Sentinel: {detail}");
        if let Ok(mut d) = self.degraded.lock() {
            *d = Some(detail.clone());
        }
        self.report.spool_failed = Some(detail);
    }

    /// Queues one row; a failure is said once per reason.
    fn push(&mut self, r: &str, at: Option<RowAt>) {
        self.report.rows += 1;
        if self.journal.is_some() {
            self.pending.push_back(at);
        }
        if let Err(e) = self.q.push(r) {
            let e = e.to_string();
            if self.said_push.as_deref() != Some(e.as_str()) {
                log::warn!("Sentinel: spooling rows: {e}");
            }
            self.report.last_error = Some(format!("spooling: {e}"));
            self.said_push = Some(e);
        }
        self.note_spool();
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

    /// Registrations that may have made a run on the server that stays
    /// unfinished, in words; None when there are none.
    fn maybe_unfinished(&self) -> Option<String> {
        let (t, u) = (
            self.report.registrations_timed_out,
            self.report.registrations_not_understood,
        );
        let what = match (t, u) {
            (0, 0) => return None,
            (t, 0) => format!("{t} registration(s) timed out"),
            (0, u) => format!("{u} registration answer(s) could not be used"),
            (t, u) => format!("{t} registration(s) timed out and {u} answer(s) could not be used"),
        };
        Some(format!(
            "{what}; the server may hold run(s) with external_run_id {} that stay unfinished",
            self.body["external_run_id"]
        ))
    }

    async fn register(&mut self) -> bool {
        if self.reg.is_some() {
            return true;
        }
        if self.report.registrations_not_understood >= MAX_UNUSABLE_REGISTRATIONS
            || !self.may_register
        {
            return false;
        }
        if let Some(j) = &self.journal {
            // From here the server may hold a run even if the answer never comes.
            j.record('P', "");
        }
        let attempt = tokio::select! {
            a = self.api.register(&self.body) => a,
            () = self.end.spent() => Err(ApiError::TimedOut(
                "POST /runs: no answer within the end's budget".into(),
            )),
        };
        match &attempt {
            Err(ApiError::TimedOut(_)) => self.report.registrations_timed_out += 1,
            Err(ApiError::Answer(_)) => {
                self.report.registrations_not_understood += 1;
                if self.report.registrations_not_understood == MAX_UNUSABLE_REGISTRATIONS {
                    log::warn!(
                        "Sentinel: {MAX_UNUSABLE_REGISTRATIONS} registration answers could not be used ({}); registering stops, and the rows are kept locally",
                        self.maybe_unfinished().unwrap_or_default()
                    );
                }
            }
            _ => {}
        }
        match attempt {
            Ok(r) => {
                if let Some(m) = self.maybe_unfinished() {
                    log::warn!("Sentinel: earlier, {m}");
                }
                log::info!(
                    "Sentinel: run {} registered, uploading to s3://{}/{}",
                    r.run_id,
                    r.prefix.bucket,
                    r.prefix.key
                );
                self.report.run_id = Some(r.run_id.clone());
                if let Some(j) = &self.journal {
                    j.record('S', &api::registration_json(&r).to_string());
                }
                self.reg = Some(r);
                self.client = None;
                true
            }
            Err(e) if !self.told_unregistered => {
                // The first time, say what it means for the run; retries that fail
                // the same way are then quiet (see `fail`).
                self.told_unregistered = true;
                let e = self.api.redact(&e.to_string());
                let then = if self.end.by().is_some() {
                    "its rows are kept locally"
                } else {
                    "the run goes on locally and registration is retried"
                };
                log::warn!(
                    "Sentinel API {}: registering the run failed: {e}; {then}",
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
        if let Some(j) = &self.journal {
            j.record('C', &api::credentials_json(&c).to_string());
        }
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

    /// Puts one batch; where S3 gave no answer, asks whether it landed all the same
    /// (it may have: those rows must then go nowhere else), and remembers a batch
    /// that may have landed.
    async fn put_checked(
        &mut self,
        client: &aws_sdk_s3::Client,
        bucket: &str,
        key: &str,
        gz: Vec<u8>,
        seq: u32,
        uri: &str,
    ) -> Result<(), s3::PutError> {
        let len = gz.len();
        match s3::put(client, bucket, key, gz).await {
            Err(s3::PutError::NoAnswer(m)) => match s3::landed(client, bucket, key, len).await {
                Ok(true) => {
                    log::debug!("Sentinel: {uri}: {m}; it was stored all the same");
                    self.maybe_landed = None;
                    Ok(())
                }
                Ok(false) => {
                    self.maybe_landed = Some((seq, key.to_string(), len));
                    Err(s3::PutError::Other(m))
                }
                Err(h) => {
                    self.maybe_landed = Some((seq, key.to_string(), len));
                    Err(s3::PutError::Other(format!(
                        "{m}; and asking whether it was stored: {h}"
                    )))
                }
            },
            other => other,
        }
    }

    /// Refreshes the upload credentials where they are due (or a 403 asked for it,
    /// no sooner than the doubling gap allows). False where the run's streaming
    /// failed for it (a forced refresh that did not work).
    async fn refresh_if_due(&mut self) -> bool {
        let due = self.creds().is_some_and(|c| {
            c.expires_at
                .duration_since(SystemTime::now())
                .map_or(true, |left| left <= REFRESH_BEFORE)
        });
        // A 403 that refreshing did not cure is refreshed again only after a
        // gap that doubles, up to MAX_FORCED_GAP.
        let forced_ok = self
            .forced_at
            .is_none_or(|t| t.elapsed() >= self.forced_gap);
        if due || (self.force_refresh && forced_ok) {
            if self.force_refresh {
                self.forced_at = Some(tokio::time::Instant::now());
                self.forced_gap = (self.forced_gap * 2)
                    .max(Duration::from_secs(2))
                    .min(MAX_FORCED_GAP);
            }
            if let Err(e) = self.refresh().await {
                if self.force_refresh {
                    self.fail("refreshing the upload credentials", &e.to_string());
                    return false;
                }
                // Still valid for a while: keep the old ones and try again later.
                let why = self.api.redact(&e.to_string());
                if self.refresh_warned.as_deref() != Some(why.as_str()) {
                    log::warn!("Sentinel: refreshing the upload credentials failed: {why}; keeping the current ones");
                } else {
                    log::debug!("Sentinel: refreshing the upload credentials failed again: {why}");
                }
                self.report.last_error = Some(format!("refresh: {why}"));
                self.refresh_warned = Some(why);
            }
        }
        true
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
            if !self.refresh_if_due().await {
                return;
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
            // From here the object may land, answered or not: a guardian that
            // takes over writes exactly these rows under this key, never others.
            if let (Some(j), Some(Some(last))) =
                (&self.journal, self.pending.get(rows.wrapping_sub(1)))
            {
                j.record('T', &format!("{seq} {}", last.index));
            }
            let put = self
                .put_checked(&client, &bucket, &key, gz, seq, &uri)
                .await;
            match put {
                Ok(()) => {
                    self.maybe_landed = None;
                    log::debug!("Sentinel: uploaded {uri} ({rows} rows)");
                    self.front_uploaded(rows, uri);
                    self.recovered();
                    auth_retried = false;
                    self.forced_gap = Duration::ZERO;
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

    /// The front batch (`rows` rows) is in S3 at `uri`: journaled, listed for
    /// `finish`, counted, and gone from the queue.
    fn front_uploaded(&mut self, rows: usize, uri: String) {
        self.saved('U', rows, &uri);
        self.uploaded.push(uri);
        self.q.pop_front();
        self.report.batches_uploaded += 1;
        self.report.rows_uploaded += rows as u64;
    }

    /// Before rows go inline: a PUT that got no answer may have landed since. S3
    /// holding it makes it uploaded (its rows are then not sent again); S3 that
    /// cannot say leaves it named, as the one place the rows may also be.
    async fn settle_maybe_landed(&mut self) {
        let Some((seq, key, len)) = self.maybe_landed.take() else {
            return;
        };
        if !matches!(self.q.front(), Ok(Some((s, _, _))) if s == seq) {
            return;
        }
        let Some(reg) = &self.reg else { return };
        let (bucket, uri) = (reg.prefix.bucket.clone(), reg.prefix.uri(&key));
        let Some(client) = self.client().await else {
            return;
        };
        match s3::landed(&client, &bucket, &key, len).await {
            Ok(true) => {
                let rows = self.q.front().ok().flatten().map_or(0, |b| b.1);
                log::debug!("Sentinel: {uri} was stored after all ({rows} rows)");
                self.front_uploaded(rows, uri);
            }
            Ok(false) => {}
            Err(e) => log::warn!(
                "Sentinel: {uri} got no answer and S3 cannot say whether it holds it ({e}); its rows go inline and may also be there"
            ),
        }
    }

    /// The end: last uploads, then `finish`. Batches that cannot be uploaded are
    /// written to disk.
    async fn finish(&mut self, exit_code: i32) {
        let deadline = self
            .end
            .by()
            .unwrap_or_else(|| tokio::time::Instant::now() + FINISH_BUDGET);
        if let Err(e) = self.q.seal() {
            self.report.last_error = Some(format!("sealing the last batch: {e}"));
        }
        // One more try at the end, within its budget; never after a try that
        // got no answer in time: the server may hold that run, and a registration
        // is not idempotent (another would be a second run, never finished).
        if self.reg.is_none() && self.report.registrations_timed_out == 0 {
            self.register().await;
        }
        let Some(run_id) = self.reg.as_ref().map(|r| r.run_id.clone()) else {
            match self.maybe_unfinished() {
                None => log::warn!("Sentinel: the run was never registered; nothing was sent"),
                Some(m) => {
                    log::warn!("Sentinel: the run was never registered ({m}); nothing was sent")
                }
            }
            self.keep();
            return;
        };
        // A short run goes inline at once. Otherwise the rest is uploaded, and when
        // no batch reached S3 after all, the rows go inline (an S3 object whose PUT
        // timed out but landed is then simply not listed): `finish` never claims
        // S3 data it does not list, which the API refuses.
        let mut status = if exit_code == 0 { "finished" } else { "failed" };
        let mut inline_csv = match self.put_sent {
            false => self
                .q
                .csv_upto(INLINE_MAX)
                .ok()
                .filter(|(_, all)| *all)
                .map(|(csv, _)| csv),
            true => None,
        };
        if inline_csv.is_none() {
            while self.q.sealed_len() > 0 && tokio::time::Instant::now() < deadline {
                if let Some(t) = self.retry_at {
                    tokio::time::sleep_until(t.min(deadline)).await;
                }
                self.work().await;
            }
            if self.uploaded.is_empty() {
                self.settle_maybe_landed().await;
            }
            if !self.uploaded.is_empty() && self.q.sealed_len() > 0 {
                // Some batches in S3, the rest only on this machine: the run on the
                // server is incomplete and says so.
                status = "failed";
                self.report.partial = true;
            } else if self.uploaded.is_empty() {
                if let Ok((csv, all)) = self.q.csv_upto(INLINE_MAX) {
                    if !all {
                        // What fits, and the run marked failed: its data is partial.
                        // Every row stays on disk (kept below) and is named.
                        status = "failed";
                        self.report.partial = true;
                    }
                    inline_csv = Some(csv);
                }
            }
            if inline_csv.is_none() || self.report.partial {
                self.keep();
            }
        }
        let inline = inline_csv.is_some();
        let inline_rows = Some(
            inline_csv
                .as_ref()
                .map_or(0, |c| c.lines().count().saturating_sub(1)),
        );
        let body = if let Some(csv) = inline_csv {
            json!({"exit_code": exit_code, "run_status": status, "data_source": "inline",
                   "data_csv": csv, "finished_at": iso_now()})
        } else {
            json!({"exit_code": exit_code, "run_status": status, "data_source": "s3",
                   "data_uris": self.uploaded, "finished_at": iso_now()})
        };
        self.send_finish(&run_id, &body, inline_rows.filter(|_| inline), deadline)
            .await;
    }

    /// Tells the API the run is over (`body`), retrying what may be retried within
    /// the `deadline`. `inline`: the rows sent in the body, where they were.
    async fn send_finish(
        &mut self,
        run_id: &str,
        body: &serde_json::Value,
        inline: Option<usize>,
        deadline: tokio::time::Instant,
    ) {
        let mut backoff = Duration::from_secs(1);
        loop {
            match self.api.finish(run_id, body).await {
                Ok(stats) => {
                    log::info!("Sentinel: run {run_id} finished: {stats}");
                    if let Some(j) = &self.journal {
                        j.record('F', "");
                    }
                    self.report.finished = true;
                    self.report.data_source = Some(if inline.is_some() { "inline" } else { "s3" });
                    if let Some(rows) = inline {
                        self.report.rows_uploaded += rows as u64;
                        if !self.report.partial {
                            // Kept copies of rows now on the server would count twice.
                            self.q.discard_all();
                        }
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
                    if inline.is_some() && !self.report.partial {
                        self.keep();
                    }
                    return;
                }
            }
        }
    }

    /// Batches not uploaded go to `<spool dir>/resource-tracker-unsent-<pid>-XXXXXX/`;
    /// where that cannot be written, to the kept directory under the temp dir. Rows
    /// that fit nowhere are counted and said.
    fn keep(&mut self) {
        let _ = self.q.seal();
        self.note_spool();
        if self.q.sealed_len() == 0 {
            return;
        }
        let waiting = self.q.rows_waiting() as u64;
        let prefix = format!("resource-tracker-unsent-{}-", std::process::id());
        match self.q.keep(&self.cfg.spool_dir, &prefix) {
            Ok(Some((dir, n))) => {
                log::warn!(
                    "Sentinel: {n} batches were not uploaded; kept in {}",
                    dir.display()
                );
                self.saved('K', self.pending.len(), &dir.display().to_string());
                self.report.rows_kept += waiting;
                self.report.kept_dir = Some(dir);
            }
            Ok(None) => {}
            Err(e) => {
                let (dir, lost) = self.q.keep_in_fallback();
                let spool = self.cfg.spool_dir.display();
                match &dir {
                    Some(d) => log::warn!(
                        "Sentinel: keeping the batches that were not uploaded in {spool}: {e}; kept in {} instead",
                        d.display()
                    ),
                    None => log::warn!(
                        "Sentinel: keeping the batches that were not uploaded in {spool}: {e}"
                    ),
                }
                if lost > 0 {
                    log::warn!(
                        "Sentinel: {lost} rows could be kept nowhere ({}); they are only in the local outputs",
                        self.q.kept_failed.as_deref().unwrap_or("no space")
                    );
                }
                self.report.rows_kept += waiting - lost as u64;
                if let Some(d) = &dir {
                    self.saved('K', self.pending.len(), &d.display().to_string());
                }
                self.report.kept_dir = dir;
            }
        }
    }
}

impl Uploader {
    fn new(
        cfg: Config,
        api: Api,
        body: Value,
        degraded: Arc<Mutex<Option<String>>>,
        journal: Option<Arc<Journal>>,
        kept_parent: PathBuf,
        end: Arc<End>,
    ) -> Uploader {
        let period = Duration::from_secs_f64(cfg.upload_interval);
        Uploader {
            q: Queue::new(
                csv::header() + "\n",
                cfg.memory_limit,
                &cfg.spool_dir,
                &kept_parent,
            ),
            body,
            report: StreamReport {
                api_url: cfg.api_url.clone(),
                ..StreamReport::default()
            },
            timeout: cfg.timeout,
            cfg,
            api,
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
            refresh_warned: None,
            end,
            maybe_landed: None,
            told_unregistered: false,
            degraded,
            said_push: None,
            forced_at: None,
            forced_gap: Duration::ZERO,
            journal,
            pending: VecDeque::new(),
            may_register: true,
            kept_dir_told: false,
        }
    }

    /// The oldest `rows` rows are saved (uploaded to, or kept in, `what`): the
    /// journal says so, and they leave it.
    fn saved(&mut self, tag: char, rows: usize, what: &str) {
        let Some(j) = &self.journal else { return };
        let done: Vec<Option<RowAt>> = self.pending.drain(..rows.min(self.pending.len())).collect();
        let done: Vec<RowAt> = done.into_iter().flatten().collect();
        if let Some(last) = done.last() {
            j.saved(tag, last.index, what, &done);
        }
    }

    /// The report's closing counts.
    fn close_report(&mut self) {
        self.note_spool();
        self.report.spooled_batches = self.q.spooled;
        self.report.rows_not_sent = self.report.rows.saturating_sub(self.report.rows_uploaded);
        if self.report.rows_not_sent > 0 && self.report.finished && !self.report.partial {
            // `finish` was accepted with fewer rows than the run produced.
            self.report.partial = true;
        }
    }
}

/// What a guardian found in the journal of a tracker that died.
pub struct Resume {
    pub body: Option<Value>,
    pub registration: Option<Value>,
    pub credentials: Option<Value>,
    /// Objects the tracker uploaded, in order.
    pub uploaded: Vec<String>,
    /// Rows it had not saved, in order.
    pub rows: Vec<String>,
    /// The batch the tracker was putting when it died (it may still land): its
    /// key's seq and how many of `rows` it held. The guardian puts exactly those
    /// rows under that key again, so a late landing writes the same rows.
    pub tried: Option<(u32, usize)>,
    /// The tracker's temp dir (the guardian has no environment).
    pub temp_dir: PathBuf,
}

/// The guardian's end of a killed tracker's stream: the tracker's own end, from
/// where the journal left it.
pub(super) async fn resume(cfg: Config, r: Resume, exit_code: i32) -> StreamReport {
    let api = match Api::new(&cfg.api_url, cfg.token.clone(), cfg.timeout) {
        Ok(a) => a,
        Err(e) => {
            return StreamReport {
                last_error: Some(e),
                ..StreamReport::default()
            }
        }
    };
    let may_register = r.body.is_some();
    let degraded = Arc::new(Mutex::new(None));
    // The guardian's end has its budget from now.
    let end = Arc::new(End::default());
    end.now();
    let mut u = Uploader::new(
        cfg,
        api,
        r.body.unwrap_or_default(),
        degraded,
        None,
        r.temp_dir,
        end,
    );
    u.may_register = may_register;
    let next = r.uploaded.len() as u32 + 1;
    u.q.start_at(r.tried.map_or(next, |(seq, _)| seq.max(next)));
    let mut reg = r
        .registration
        .and_then(|v| api::parse_registration(&v).ok());
    if let (Some(reg), Some(c)) = (
        reg.as_mut(),
        r.credentials.and_then(|c| api::parse_credentials(&c).ok()),
    ) {
        reg.credentials = c;
    }
    u.report.run_id = reg.as_ref().map(|r| r.run_id.clone());
    u.reg = reg;
    // A PUT the tracker sent may land: those rows never go inline.
    u.put_sent = !r.uploaded.is_empty() || r.tried.is_some();
    u.uploaded = r.uploaded;
    for (i, row) in r.rows.iter().enumerate() {
        u.push(row, None);
        if r.tried.is_some_and(|(_, n)| n == i + 1) {
            if let Err(e) = u.q.seal() {
                u.report.last_error = Some(format!("sealing the tracker's last batch: {e}"));
            }
        }
    }
    // The tracker's PUT of that batch may land: the same bytes, which S3 is asked
    // for before its rows could go inline (`settle_maybe_landed`).
    if let (Some((seq, _)), Some(reg), Ok(Some((front, _, gz)))) = (r.tried, &u.reg, u.q.front()) {
        if front == seq {
            u.maybe_landed = Some((seq, reg.prefix.object_key(seq), gz.len()));
        }
    }
    u.finish(exit_code).await;
    u.close_report();
    u.report
}

pub(super) async fn run_stream(
    cfg: Config,
    run: RunInfo,
    found: Discovered,
    mut rx: mpsc::UnboundedReceiver<Msg>,
    degraded: Arc<Mutex<Option<String>>>,
    journal: Option<Arc<Journal>>,
    end: Arc<End>,
) -> StreamReport {
    let api = match Api::new(&cfg.api_url, cfg.token.clone(), cfg.timeout) {
        Ok(a) => a,
        Err(e) => {
            log::warn!("Sentinel streaming off: {e}");
            return StreamReport::default();
        }
    };
    let period = Duration::from_secs_f64(cfg.upload_interval);
    let body = registration_body(&run, &found);
    if let Some(j) = &journal {
        j.record('B', &body.to_string());
    }
    let mut u = Uploader::new(
        cfg,
        api,
        body,
        degraded,
        journal,
        crate::fsafe::temp_dir(),
        end,
    );
    u.register().await;
    let mut tick = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let started = Instant::now();
    let exit_code = loop {
        tokio::select! {
            m = rx.recv() => match m {
                Some(Msg::Row(r, at)) => u.push(&r, at),
                Some(Msg::Finish { exit_code }) => break exit_code,
                None => break 0,
            },
            _ = tick.tick() => {
                if let Err(e) = u.q.seal() {
                    log::warn!("Sentinel: sealing a batch: {e}");
                }
                u.note_spool();
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
    while let Ok(Msg::Row(r, at)) = rx.try_recv() {
        u.push(&r, at);
    }
    log::debug!(
        "Sentinel: finishing after {:.1} s",
        started.elapsed().as_secs_f64()
    );
    u.finish(exit_code).await;
    u.close_report();
    u.report
}
