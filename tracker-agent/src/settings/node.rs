//! Settings of `resource-tracker node`, resolved once like the tracker's.

use std::{net::SocketAddr, path::PathBuf};

use super::{
    cli::NodeOpts,
    values::{env_bool, env_var, seconds, GetEnv},
};
use crate::{collect::Roots, discovery::kubelet::KubeletConfig};

/// Where a pod's service account credentials are mounted.
const SA_DIR: &str = "/var/run/secrets/kubernetes.io/serviceaccount";

#[derive(Clone, Debug)]
pub struct NodeSettings {
    pub listen: Option<SocketAddr>,
    pub interval: f64,
    pub output: Option<PathBuf>,
    /// The host's /proc and /sys.
    pub roots: Roots,
    pub include: Vec<String>,
    /// Names from the kubelet; None: containers keep their ids only.
    pub kubelet: Option<KubeletConfig>,
    pub no_ebpf: bool,
    /// cAdvisor's names for the series it also has, instead of our own.
    pub cadvisor_names: bool,
    /// Under sudo, the invoking user: the files they name (`-o`, the kubelet's
    /// token and CA) are opened with their rights.
    pub owner: Option<crate::fsafe::Owner>,
    /// OTLP export, from the OpenTelemetry variables (docs/otlp.md).
    pub otlp: Option<crate::sink::otlp::Config>,
}

/// The kubelet's URL: `--kubelet-url`, else the node's (HOST_IP, port 10250), else
/// none. The service account token goes with every request: never in clear but to
/// a loopback address.
fn kubelet_url(o: &NodeOpts, get_env: GetEnv) -> Result<Option<String>, String> {
    Ok(match (&o.kubelet_url, env_var(get_env, "HOST_IP")?) {
        (Some(u), _) => {
            let url = super::values::base_url(u)
                .map_err(|why| format!("--kubelet-url: '{}' {why}", u.escape_debug()))?;
            // The service account token goes with every request.
            let host = reqwest::Url::parse(&url)
                .ok()
                .and_then(|p| p.host_str().map(str::to_string));
            let loopback = matches!(host.as_deref(), Some("127.0.0.1" | "localhost" | "[::1]"));
            if url.starts_with("http://") && !loopback {
                return Err(format!(
                    "--kubelet-url: '{url}' would send the token in clear; use https:// (http:// only to a loopback address)"
                ));
            }
            Some(url)
        }
        (None, Some(ip)) if !ip.trim().is_empty() => {
            let ip = ip.trim();
            let host = if ip.contains(':') {
                format!("[{ip}]")
            } else {
                ip.to_string()
            };
            Some(format!("https://{host}:10250"))
        }
        _ => None,
    })
}

pub fn resolve(o: NodeOpts, get_env: GetEnv) -> Result<NodeSettings, String> {
    let listen = match &o.listen {
        Some(a) => Some(a.trim().parse::<SocketAddr>().map_err(|_| {
            format!("--listen: '{a}' is not an address:port (e.g. 0.0.0.0:9101 or [::]:9101)")
        })?),
        None => None,
    };
    let interval = match &o.interval {
        Some(s) => seconds("--interval", s, 0.1)?,
        None => 1.0,
    };
    let host_root = env_var(get_env, "HOST_ROOT")?.map(PathBuf::from);
    let under_root = |flag: &Option<PathBuf>, name: &str| -> Result<PathBuf, String> {
        let p = match (flag, &host_root) {
            (Some(p), _) => p.clone(),
            (None, Some(r)) => r.join(name),
            (None, None) => PathBuf::from("/").join(name),
        };
        if !p.is_dir() {
            return Err(format!(
                "--host-{name}: {} is not a directory (mount the host's /{name} there, or set HOST_ROOT)",
                p.display()
            ));
        }
        Ok(p)
    };
    // Only /sys is read (the cgroup hierarchies); /proc stays the agent's own.
    let roots = Roots {
        proc: PathBuf::from("/proc"),
        sys: under_root(&o.host_sys, "sys")?,
    };
    for p in &o.include {
        if p.is_empty() || p.starts_with('/') || p.split('/').any(|c| c.is_empty() || c == "..") {
            return Err(format!(
                "--include '{p}': a path below the cgroup root, like system.slice/*.service"
            ));
        }
    }
    let url = kubelet_url(&o, get_env)?;
    let present = |name: &str| {
        let p = PathBuf::from(SA_DIR).join(name);
        p.is_file().then_some(p)
    };
    let owner = crate::sudo::invoker()?.map(|r| r.owner());
    let kubelet = url.map(|url| KubeletConfig {
        url,
        token_file: o.kubelet_token_file.clone().or_else(|| present("token")),
        ca_file: o.kubelet_ca_file.clone().or_else(|| present("ca.crt")),
        insecure_tls: o.kubelet_insecure_tls,
        timeout: std::time::Duration::from_secs(5),
        reader: owner.clone(),
    });
    for (flag, f) in [
        ("--kubelet-token-file", &o.kubelet_token_file),
        ("--kubelet-ca-file", &o.kubelet_ca_file),
    ] {
        if let Some(f) = f {
            if let Err(e) = crate::fsafe::open_input_as(f, owner.as_ref()) {
                return Err(format!("{flag}: {}: {e}", f.display()));
            }
        }
    }
    // A CA that cannot be used would only show at the first request, as names
    // that never come: checked now.
    if let (Some(f), false) = (&o.kubelet_ca_file, o.kubelet_insecure_tls) {
        crate::discovery::kubelet::check_ca(f, owner.as_ref())
            .map_err(|e| format!("--kubelet-ca-file: {e}"))?;
    }
    Ok(NodeSettings {
        listen,
        interval,
        output: o.output,
        roots,
        include: o.include,
        kubelet,
        no_ebpf: o.no_ebpf,
        cadvisor_names: o.cadvisor_names
            || env_bool(get_env, "TRACKER_CADVISOR_NAMES")?.unwrap_or(false),
        owner,
        otlp: super::otlp::resolve(get_env, None)?,
    })
}
