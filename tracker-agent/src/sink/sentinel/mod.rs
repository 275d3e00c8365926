//! Streaming to Sentinel (docs/streaming.md): register the run, upload gzip CSV
//! batches to S3 with temporary credentials, finish the run. Everything runs on its
//! own thread with its own runtime, so sampling never waits on the network.

mod api;
mod config;
pub mod guardian;
mod journal;
mod queue;
mod s3;
mod upload;

use std::{
    sync::{mpsc::Receiver, Arc, Mutex},
    thread::JoinHandle,
};

use tokio::sync::mpsc;

use super::base::Sink;
use crate::model::{
    csv,
    degraded::{Degradation, SPOOL_FAILED},
    Discovered, Sample, StreamReport, Summary,
};
use config::Msg;
pub use config::{Config, RunInfo, Secret, DEFAULT_API_URL};
use guardian::Guardian;
pub use queue::probe_spool;
use upload::run_stream;

pub struct Streamer {
    tx: mpsc::UnboundedSender<Msg>,
    handle: Option<JoinHandle<StreamReport>>,
    /// Set by the streaming thread when the spool fails.
    degraded: Arc<Mutex<Option<String>>>,
    guardian: Option<Guardian>,
    /// Told when the command ended, at once (the thread may be waiting on a
    /// request then).
    end: Arc<upload::End>,
}

impl Streamer {
    /// Starts the streaming thread. It registers the run once discovery has
    /// answered on `found`; rows queue meanwhile. With a guardian, every row is
    /// journaled for it before it is queued.
    pub fn start(
        cfg: Config,
        run: RunInfo,
        found: Receiver<Discovered>,
        guardian: Option<Guardian>,
    ) -> anyhow::Result<Streamer> {
        let (tx, rx) = mpsc::unbounded_channel();
        let degraded = Arc::new(Mutex::new(None));
        let shared = degraded.clone();
        let journal = guardian.as_ref().map(|g| g.journal.clone());
        let end = Arc::new(upload::End::default());
        let end_ = end.clone();
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
                let report = rt.block_on(run_stream(cfg, run, found, rx, shared, journal, end_));
                // A DNS lookup still blocked in the pool must not hold up the exit.
                rt.shutdown_background();
                report
            })?;
        Ok(Streamer {
            tx,
            handle: Some(handle),
            degraded,
            guardian,
            end,
        })
    }
}

impl Sink for Streamer {
    /// Queues the sample's CSV row. Never blocks.
    fn write(&mut self, s: &Sample) -> anyhow::Result<()> {
        let row = csv::row(s);
        // Journaled first: from here on a killed tracker loses not this row.
        let at = self.guardian.as_ref().and_then(|g| g.journal.row(&row));
        let _ = self.tx.send(Msg::Row(row, at));
        Ok(())
    }

    /// Flushes, sends `finish`, and waits for the thread (bounded by FINISH_BUDGET
    /// plus one request timeout); how it went goes into the summary.
    fn finish(&mut self, summary: &mut Summary) -> anyhow::Result<()> {
        let Some(handle) = self.handle.take() else {
            return Ok(());
        };
        let exit_code = summary.exit_code.unwrap_or(0);
        self.end.now();
        let _ = self.tx.send(Msg::Finish { exit_code });
        let report = handle.join().unwrap_or_else(|_| StreamReport {
            last_error: Some("the streaming thread panicked".into()),
            ..StreamReport::default()
        });
        // The end was the tracker's own: what it could not send it kept.
        if let Some(g) = &mut self.guardian {
            g.done();
        }
        if let Some(detail) = &report.spool_failed {
            let d = Degradation {
                name: SPOOL_FAILED,
                detail: detail.clone(),
            };
            match summary.degraded.iter_mut().find(|x| x.name == SPOOL_FAILED) {
                Some(x) => *x = d,
                None => summary.degraded.push(d),
            }
        }
        summary.streaming = Some(report);
        Ok(())
    }

    fn degraded(&self) -> Option<(&'static str, String)> {
        let d = self.degraded.lock().ok()?.clone()?;
        Some((SPOOL_FAILED, d))
    }
}
