//! Where the run happened: the cloud and, only on opt-in, the identifying host fields.

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

/// Identifying host fields.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Identity {
    pub host_id: Option<String>,
    pub host_hostname: Option<String>,
    pub host_ip: Option<String>,
}

/// What discovery found, once per run, for every part that needs it.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Discovered {
    pub cloud: Option<CloudInfo>,
    /// Read only when identifying fields may be shared.
    pub identity: Option<Identity>,
}
