//! Where the tracker runs: the cloud (from the vendors' metadata services) and, only
//! on opt-in, the identifying host fields.
//!
//! Every vendor is probed at once; each request is bounded by the timeout, and a
//! vendor needs at most two rounds of requests (detection, then the details), so a
//! probe ends within twice the timeout, and within about one timeout when nothing
//! is there. Failures are logged at debug level only: a laptop prints nothing.
//! See docs/discovery.md.

mod host;
mod http;
mod vendors;

use std::{ffi::OsString, path::Path, time::Duration};

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

const ENDPOINT_VARS: [(&str, &str); 3] = [
    ("TRACKER_METADATA_URL", "http://169.254.169.254"),
    (
        "TRACKER_METADATA_GCP_URL",
        "http://metadata.google.internal",
    ),
    ("TRACKER_METADATA_ALIBABA_URL", "http://100.100.100.200"),
];

impl Endpoints {
    /// The defaults, or `TRACKER_METADATA_URL`, `TRACKER_METADATA_GCP_URL`,
    /// `TRACKER_METADATA_ALIBABA_URL` (unset or empty: the default). An override
    /// must be an http:// or https:// URL with a host; trailing slashes are dropped.
    pub fn from_env(get_env: &dyn Fn(&str) -> Option<OsString>) -> Result<Endpoints, String> {
        let [link_local, gcp, alibaba] = ENDPOINT_VARS.map(|(var, default)| match get_env(var) {
            None => Ok(default.to_string()),
            Some(v) => match v.to_str() {
                None => Err(format!("environment variable {var}: not valid UTF-8")),
                Some(s) if s.trim().is_empty() => Ok(default.to_string()),
                Some(s) => crate::config::base_url(s).map_err(|why| {
                    format!("environment variable {var}: '{}' {why}", s.escape_debug())
                }),
            },
        });
        Ok(Endpoints {
            link_local: link_local?,
            gcp: gcp?,
            alibaba: alibaba?,
        })
    }
}

/// Probes every vendor in parallel, each request bounded by `timeout`. When more
/// than one answers, the first in this order wins: aws, gcp, azure, hcloud,
/// upcloud, vultr, alicloud, ovh (the maintainers' Rust client's order).
pub async fn discover(ep: &Endpoints, timeout: Duration) -> Option<CloudInfo> {
    let h = match http::Http::new(timeout) {
        Ok(h) => h,
        Err(e) => {
            log::debug!("cloud discovery: {e}");
            return None;
        }
    };
    let all = async {
        let (aws, gcp, azure, hetzner, upcloud, vultr, alibaba, ovh) = tokio::join!(
            vendors::aws(&h, &ep.link_local),
            vendors::gcp(&h, &ep.gcp),
            vendors::azure(&h, &ep.link_local),
            vendors::hetzner(&h, &ep.link_local),
            vendors::upcloud(&h, &ep.link_local),
            vendors::vultr(&h, &ep.link_local),
            vendors::alibaba(&h, &ep.alibaba),
            vendors::ovh(&h, &ep.link_local),
        );
        [
            (vendors::AWS, aws),
            (vendors::GCP, gcp),
            (vendors::AZURE, azure),
            (vendors::HETZNER, hetzner),
            (vendors::UPCLOUD, upcloud),
            (vendors::VULTR, vultr),
            (vendors::ALIBABA, alibaba),
            (vendors::OVH, ovh),
        ]
    };
    // Two rounds of requests at most; this bound only guards against a bug.
    let Ok(results) = tokio::time::timeout(timeout * 3, all).await else {
        log::debug!("cloud discovery: no result within {:?}", timeout * 3);
        return None;
    };
    let mut found = Vec::new();
    for (vendor, r) in results {
        match r {
            Ok(c) => found.push(c),
            Err(why) => log::debug!("cloud discovery: not {vendor}: {why}"),
        }
    }
    if found.len() > 1 {
        let names: Vec<&str> = found.iter().map(|c| c.cloud_vendor_id.as_str()).collect();
        log::debug!(
            "cloud discovery: several metadata services answered ({}); taking {}",
            names.join(", "),
            names[0]
        );
    }
    let found = found.into_iter().next();
    match &found {
        Some(c) => log::debug!("cloud discovery: {c:?}"),
        None => log::debug!("cloud discovery: no cloud"),
    }
    found
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
        let found = rt.block_on(discover(&ep, TIMEOUT));
        // A name lookup (metadata.google.internal) runs on a blocking thread that
        // cannot be cancelled; do not wait for a slow resolver.
        rt.shutdown_background();
        found
    })
}

/// Identifying host fields (no network).
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct Identity {
    pub host_id: Option<String>,
    pub host_hostname: Option<String>,
    pub host_ip: Option<String>,
}

/// `host_id`: the cloud's instance id, else the DMI product UUID or serial (when
/// readable and not a placeholder), else `/etc/machine-id`. `host_hostname`: the
/// node name. `host_ip`: the address of the interface of the default route (IPv4,
/// else IPv6), from /proc/net and getifaddrs.
pub fn identity(cloud: Option<&CloudInfo>) -> Identity {
    Identity {
        host_id: cloud.and_then(|c| c.instance_id.clone()).or_else(|| {
            host::host_id(Path::new("/sys/class/dmi/id"), Path::new("/etc/machine-id"))
        }),
        host_hostname: host::hostname(),
        host_ip: host::host_ip(),
    }
}

#[cfg(test)]
mod tests {
    use std::{collections::HashMap, os::unix::ffi::OsStringExt};

    use super::*;

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let m: HashMap<String, OsString> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn endpoints_default_and_overrides() {
        let ep = Endpoints::from_env(&env(&[])).unwrap();
        assert_eq!(ep.link_local, "http://169.254.169.254");
        assert_eq!(ep.gcp, "http://metadata.google.internal");
        assert_eq!(ep.alibaba, "http://100.100.100.200");
        let ep = Endpoints::from_env(&env(&[
            ("TRACKER_METADATA_URL", "http://127.0.0.1:8080//"),
            ("TRACKER_METADATA_GCP_URL", "https://gcp.example/prefix/"),
            ("TRACKER_METADATA_ALIBABA_URL", "  "),
        ]))
        .unwrap();
        assert_eq!(ep.link_local, "http://127.0.0.1:8080");
        assert_eq!(ep.gcp, "https://gcp.example/prefix");
        assert_eq!(ep.alibaba, "http://100.100.100.200");
    }

    #[test]
    fn endpoints_rejected() {
        for (var, bad, why) in [
            (
                "TRACKER_METADATA_URL",
                "ftp://x",
                "is not an http:// or https:// URL",
            ),
            (
                "TRACKER_METADATA_URL",
                "169.254.169.254",
                "is not an http:// or https:// URL",
            ),
            ("TRACKER_METADATA_GCP_URL", "http://", "has no host"),
            ("TRACKER_METADATA_GCP_URL", "http:///x", "has no host"),
            (
                "TRACKER_METADATA_ALIBABA_URL",
                "http://a b",
                "contains spaces",
            ),
            ("TRACKER_METADATA_ALIBABA_URL", "http://h/?q=1", "query"),
            ("TRACKER_METADATA_URL", "http://h\nx", "contains spaces"),
        ] {
            let e = Endpoints::from_env(&env(&[(var, bad)])).unwrap_err();
            assert!(
                e.starts_with(&format!("environment variable {var}: '")),
                "{e}"
            );
            assert!(e.contains(why), "{bad}: {e}");
            assert_eq!(e.lines().count(), 1, "{e}");
        }
        let raw = OsString::from_vec(vec![b'h', 0xff]);
        let e = Endpoints::from_env(&move |k: &str| {
            (k == "TRACKER_METADATA_GCP_URL").then(|| raw.clone())
        })
        .unwrap_err();
        assert_eq!(
            e,
            "environment variable TRACKER_METADATA_GCP_URL: not valid UTF-8"
        );
    }

    #[test]
    fn nothing_listening_is_quick_and_none() {
        // Closed ports: every probe fails at once, well within the timeout.
        let closed = || {
            let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
            format!("http://{}", l.local_addr().unwrap())
        };
        let ep = Endpoints {
            link_local: closed(),
            gcp: closed(),
            alibaba: closed(),
        };
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let t0 = std::time::Instant::now();
        assert_eq!(rt.block_on(discover(&ep, Duration::from_secs(5))), None);
        assert!(t0.elapsed() < Duration::from_secs(4), "{:?}", t0.elapsed());
    }

    #[test]
    fn identity_prefers_the_instance_id() {
        let c = CloudInfo {
            cloud_vendor_id: "aws".into(),
            instance_id: Some("i-0123456789abcdef0".into()),
            ..CloudInfo::default()
        };
        assert_eq!(
            identity(Some(&c)).host_id.as_deref(),
            Some("i-0123456789abcdef0")
        );
        let _ = identity(None);
    }
}
