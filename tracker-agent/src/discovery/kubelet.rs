//! Names of the node's pods and containers from the kubelet's `/pods` (the node's
//! own pod list, one request, no watch on the API server), for the node agent's
//! `namespace`, `pod`, `container` and `image`. A container whose names are not
//! known yet keeps its pod UID and container ID; a kubelet that is down, slow or
//! answers garbage costs a warning, never the sampling.

use std::{collections::HashMap, path::PathBuf, time::Duration};

use serde::Deserialize;

use crate::model::node::ContainerName;

/// Container id → names; pod UID → (namespace, pod) for cgroups of a pod whose
/// container is not listed (the sandbox).
#[derive(Clone, Debug, Default)]
pub struct Names {
    pub containers: HashMap<String, ContainerName>,
    pub pods: HashMap<String, (String, String)>,
}

impl Names {
    pub fn of(&self, pod_uid: Option<&str>, container_id: Option<&str>) -> Option<ContainerName> {
        if let Some(c) = container_id.and_then(|id| self.containers.get(id)) {
            return Some(c.clone());
        }
        let (ns, pod) = self.pods.get(pod_uid?)?;
        Some(ContainerName {
            namespace: ns.clone(),
            pod: pod.clone(),
            ..Default::default()
        })
    }
}

#[derive(Deserialize)]
struct PodList {
    #[serde(default)]
    items: Vec<Pod>,
}

#[derive(Deserialize)]
struct Pod {
    metadata: Meta,
    #[serde(default)]
    status: Status,
}

#[derive(Deserialize)]
struct Meta {
    #[serde(default)]
    name: String,
    #[serde(default)]
    namespace: String,
    #[serde(default)]
    uid: String,
}

#[derive(Default, Deserialize)]
#[serde(rename_all = "camelCase")]
struct Status {
    #[serde(default)]
    container_statuses: Vec<CStatus>,
    #[serde(default)]
    init_container_statuses: Vec<CStatus>,
    #[serde(default)]
    ephemeral_container_statuses: Vec<CStatus>,
}

#[derive(Deserialize)]
#[serde(rename_all = "camelCase")]
struct CStatus {
    #[serde(default)]
    name: String,
    #[serde(default)]
    image: String,
    /// `containerd://<id>`, `cri-o://<id>`, `docker://<id>`; absent before start.
    #[serde(default, rename = "containerID")]
    container_id: Option<String>,
}

/// The names in a `/pods` answer.
pub fn parse(body: &[u8]) -> Result<Names, String> {
    let list: PodList =
        serde_json::from_slice(body).map_err(|e| format!("not a pod list ({e})"))?;
    let mut n = Names::default();
    for p in list.items {
        let (ns, pod) = (p.metadata.namespace, p.metadata.name);
        if !p.metadata.uid.is_empty() {
            n.pods.insert(
                p.metadata.uid.to_ascii_lowercase(),
                (ns.clone(), pod.clone()),
            );
        }
        let s = p.status;
        for c in s
            .container_statuses
            .into_iter()
            .chain(s.init_container_statuses)
            .chain(s.ephemeral_container_statuses)
        {
            let Some(id) = c
                .container_id
                .as_deref()
                .and_then(|i| i.split_once("://"))
                .map(|(_, id)| id.to_ascii_lowercase())
            else {
                continue;
            };
            n.containers.insert(
                id,
                ContainerName {
                    namespace: ns.clone(),
                    pod: pod.clone(),
                    container: c.name,
                    image: c.image,
                },
            );
        }
    }
    Ok(n)
}

/// Where and how to ask.
#[derive(Clone, Debug)]
pub struct KubeletConfig {
    /// e.g. `https://10.0.0.5:10250`; `/pods` is appended.
    pub url: String,
    /// The service account token, read at each request (it is rotated).
    pub token_file: Option<PathBuf>,
    /// CA bundle for the kubelet's serving certificate.
    pub ca_file: Option<PathBuf>,
    /// Accept any certificate (kubelets often serve a self-signed one).
    pub insecure_tls: bool,
    pub timeout: Duration,
    /// Whose rights read the token and CA files: the invoking user under sudo (a
    /// file they could not read is not sent for them), root's otherwise.
    pub reader: Option<crate::fsafe::Owner>,
}

/// The largest `/pods` answer read (a node of 110 pods answers well under 5 MiB).
const MAX_BODY: usize = 32 << 20;

pub struct Kubelet {
    cfg: KubeletConfig,
    client: reqwest::Client,
}

/// A CA or token file is small; more is not one (and /dev/zero never ends).
const MAX_SECRET_FILE: u64 = 1 << 20;

/// The CA certificate in `ca`, read without blocking and within a bound.
fn ca_cert(
    ca: &std::path::Path,
    reader: Option<&crate::fsafe::Owner>,
) -> Result<reqwest::Certificate, String> {
    let pem = crate::fsafe::read_input_as(ca, MAX_SECRET_FILE, reader)
        .map_err(|e| format!("{}: {e}", ca.display()))?;
    reqwest::Certificate::from_pem(&pem)
        .map_err(|e| format!("{}: not a PEM certificate ({e})", ca.display()))
}

/// Whether `ca` holds a certificate the client can use (at least one PEM
/// certificate block, which `from_pem` alone does not insist on).
pub fn check_ca(ca: &std::path::Path, reader: Option<&crate::fsafe::Owner>) -> Result<(), String> {
    let cert = ca_cert(ca, reader)?;
    let pem = crate::fsafe::read_input_as(ca, MAX_SECRET_FILE, reader)
        .map_err(|e| format!("{}: {e}", ca.display()))?;
    match reqwest::Certificate::from_pem_bundle(&pem) {
        Ok(v) if !v.is_empty() => {}
        Ok(_) => return Err(format!("{}: no PEM certificate in it", ca.display())),
        Err(e) => return Err(format!("{}: not a PEM certificate ({e})", ca.display())),
    }
    reqwest::Client::builder()
        .add_root_certificate(cert)
        .build()
        .map(|_| ())
        .map_err(|e| format!("{}: {}", ca.display(), crate::warn::error_chain(&e)))
}

impl Kubelet {
    pub fn new(cfg: KubeletConfig) -> Result<Kubelet, String> {
        let mut b = reqwest::Client::builder()
            .no_proxy()
            .redirect(reqwest::redirect::Policy::none())
            .timeout(cfg.timeout)
            .user_agent(concat!("resource-tracker/", env!("CARGO_PKG_VERSION")));
        if cfg.insecure_tls {
            b = b.danger_accept_invalid_certs(true);
        } else if let Some(ca) = &cfg.ca_file {
            b = b.add_root_certificate(ca_cert(ca, cfg.reader.as_ref())?);
        }
        let client = b.build().map_err(|e| format!("HTTP client: {e}"))?;
        Ok(Kubelet { cfg, client })
    }

    /// One `/pods` request. The error never holds the token.
    pub async fn names(&self) -> Result<Names, String> {
        let url = format!("{}/pods", self.cfg.url.trim_end_matches('/'));
        let mut req = self.client.get(&url);
        if let Some(f) = &self.cfg.token_file {
            let token = crate::fsafe::read_input_as(f, MAX_SECRET_FILE, self.cfg.reader.as_ref())
                .map(|b| String::from_utf8_lossy(&b).into_owned())
                .map_err(|e| format!("token file {}: {e}", f.display()))?;
            req = req.bearer_auth(token.trim());
        }
        let mut resp = req
            .send()
            .await
            .map_err(|e| format!("{url}: {}", crate::warn::error_chain(&e)))?;
        if !resp.status().is_success() {
            return Err(format!("{url}: HTTP {}", resp.status().as_u16()));
        }
        let mut body = Vec::new();
        while let Some(chunk) = resp
            .chunk()
            .await
            .map_err(|e| format!("{url}: {}", crate::warn::error_chain(&e)))?
        {
            if body.len() + chunk.len() > MAX_BODY {
                return Err(format!("{url}: answer larger than {} MiB", MAX_BODY >> 20));
            }
            body.extend_from_slice(&chunk);
        }
        parse(&body).map_err(|e| format!("{url}: {e}"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_list_as_the_kubelet_writes_it() {
        let body = br#"{"kind":"PodList","apiVersion":"v1","metadata":{},"items":[
          {"metadata":{"name":"web-0","namespace":"shop","uid":"6A1F0C8E-2b3d-4e5f-9a0b-1c2d3e4f5a6b"},
           "spec":{"containers":[{"name":"app"}]},
           "status":{"phase":"Running",
             "initContainerStatuses":[{"name":"init","image":"busybox:1","containerID":"containerd://aa11"}],
             "containerStatuses":[{"name":"app","image":"nginx:1.27","imageID":"x","containerID":"containerd://BB22","ready":true},
                                  {"name":"waiting","image":"x:1"}]}},
          {"metadata":{"name":"pending","namespace":"shop","uid":"u2"},"status":{}}]}"#;
        let n = parse(body).unwrap();
        let app = n.of(None, Some("bb22")).unwrap();
        assert_eq!(
            (
                app.namespace.as_str(),
                app.pod.as_str(),
                app.container.as_str(),
                app.image.as_str()
            ),
            ("shop", "web-0", "app", "nginx:1.27")
        );
        assert_eq!(n.of(None, Some("aa11")).unwrap().container, "init");
        // The sandbox: the pod's names, no container name.
        let sandbox = n
            .of(Some("6a1f0c8e-2b3d-4e5f-9a0b-1c2d3e4f5a6b"), Some("cc33"))
            .unwrap();
        assert_eq!(
            (sandbox.pod.as_str(), sandbox.container.as_str()),
            ("web-0", "")
        );
        assert!(n.of(Some("nope"), None).is_none());
        assert!(parse(b"<html>").is_err());
        assert!(parse(b"{\"items\": 5}").is_err());
    }
}
