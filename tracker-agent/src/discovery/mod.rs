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
pub mod keeper;
pub mod kubelet;
mod runtime;
mod vendors;

use std::{path::Path, time::Duration};

pub use crate::model::{CloudInfo, Discovered, Identity};
use runtime::on_own_runtime;

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

/// Discovery on its own thread (own runtime), started once per run. `on_found` gets
/// the result as soon as there is one (the streaming thread waits on it); the
/// handle gives it to the summary at the end. Identifying fields are read only
/// when they may be shared.
pub fn spawn(
    ep: Endpoints,
    identify: bool,
    on_found: impl FnOnce(&Discovered) + Send + 'static,
) -> std::thread::JoinHandle<Discovered> {
    std::thread::spawn(move || {
        let cloud = match on_own_runtime(discover(&ep, TIMEOUT)) {
            Ok(found) => found,
            Err(e) => {
                log::debug!("cloud discovery: starting its runtime: {e}");
                None
            }
        };
        let identity = identify.then(|| identity(cloud.as_ref()));
        let found = Discovered { cloud, identity };
        on_found(&found);
        found
    })
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
    use super::*;

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
