//! What streaming is configured with, what a run registers with, and what the
//! sink sends its streaming thread.

use std::{path::PathBuf, time::Duration};

use serde_json::{json, Map, Value};

use super::journal::RowAt;
use crate::model::{Discovered, HostInfo, JobMeta};

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

pub(super) enum Msg {
    /// A row, and where the guardian's journal holds it.
    Row(String, Option<RowAt>),
    Finish {
        exit_code: i32,
    },
}

/// The `POST /runs` body: flat, nulls dropped; identifying fields only on opt-in.
pub(super) fn registration_body(run: &RunInfo, found: &Discovered) -> Value {
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
    // A registration retried after a time-out may have created a run already; one
    // id across every try lets such runs be told apart from other runs.
    if run.meta.external_run_id.is_none() {
        m.insert("external_run_id".into(), Value::String(client_run_id()));
    }
    if !run.command.is_empty() {
        // A JSON-encoded array as a string: an actual array is answered with 422.
        let c = serde_json::to_string(&run.command).unwrap_or_default();
        m.insert("command".into(), Value::String(c));
    }
    Value::Object(m)
}

/// `rt-` and a random UUID from the kernel; the pid and time when it has none.
fn client_run_id() -> String {
    let uuid = std::fs::read_to_string("/proc/sys/kernel/random/uuid").unwrap_or_default();
    match uuid.trim() {
        "" => format!(
            "rt-{}-{}",
            std::process::id(),
            crate::model::reading::unix_now() as u64
        ),
        u => format!("rt-{u}"),
    }
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
