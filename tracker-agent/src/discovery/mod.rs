//! Where the tracker runs: the cloud (from the vendors' metadata services) and, only
//! on opt-in, the identifying host fields.
//!
//! STUB: the interface is fixed; the bodies are being written.

use std::{ffi::OsString, time::Duration};

use serde::Serialize;

/// What the metadata service of the cloud said. Field names are the Sentinel API's.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct CloudInfo {
    pub cloud_vendor_id: String,
    /// Identifying: sent to Sentinel only with `--share-identity`.
    pub cloud_account_id: Option<String>,
    pub cloud_region_id: Option<String>,
    pub cloud_zone_id: Option<String>,
    pub cloud_instance_type: Option<String>,
    /// The instance's id (the host id on a cloud); identifying.
    pub instance_id: Option<String>,
}

/// Base URLs of the metadata services, overridable for tests.
#[derive(Clone, Debug)]
pub struct Endpoints {
    /// 169.254.169.254: AWS, Azure, Hetzner, UpCloud, OVH, Vultr.
    pub link_local: String,
    /// metadata.google.internal.
    pub gcp: String,
    /// 100.100.100.200.
    pub alibaba: String,
}

impl Endpoints {
    pub fn from_env(_get_env: &dyn Fn(&str) -> Option<OsString>) -> Result<Endpoints, String> {
        Ok(Endpoints {
            link_local: "http://169.254.169.254".into(),
            gcp: "http://metadata.google.internal".into(),
            alibaba: "http://100.100.100.200".into(),
        })
    }
}

/// Probes every vendor in parallel, each bounded by `timeout`.
pub async fn discover(_ep: &Endpoints, _timeout: Duration) -> Option<CloudInfo> {
    None
}

/// Timeout of each metadata request.
pub const TIMEOUT: Duration = Duration::from_secs(1);

/// Discovery on its own thread (own runtime), for callers without one.
pub fn spawn(ep: Endpoints) -> std::thread::JoinHandle<Option<CloudInfo>> {
    std::thread::spawn(move || {
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .ok()?;
        rt.block_on(discover(&ep, TIMEOUT))
    })
}

/// Identifying host fields (no network).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Identity {
    pub host_id: Option<String>,
    pub host_hostname: Option<String>,
    pub host_ip: Option<String>,
}

pub fn identity(cloud: Option<&CloudInfo>) -> Identity {
    Identity {
        host_id: cloud.and_then(|c| c.instance_id.clone()),
        ..Identity::default()
    }
}
