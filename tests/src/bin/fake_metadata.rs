//! A cloud vendor's instance metadata service, for the discovery tests.
//!
//! `fake-metadata --vendor NAME --addr-file PATH [--imdsv1-only] [--hang] [--log PATH]`
//!
//! Listens on 127.0.0.1:0, writes `127.0.0.1:PORT` into the address file once it
//! listens, and answers like that vendor's real service: its paths, the request
//! headers it requires, its response headers, its token protocol, and 404 for every
//! other path (so a fake AWS answers the Azure, Hetzner... probes like the real
//! one). NAME is a vendor id: aws, gcp, azure, hcloud, upcloud, vultr, alicloud, ovh.
//!
//! `--imdsv1-only`: AWS and Alibaba without the token service (the token PUT is
//! answered 404, GETs need no token). `--hang`: accept requests, never answer.
//! `--log PATH`: append `METHOD URL` for every request received.

use std::{
    collections::HashSet,
    fs::File,
    io::Write,
    net::{TcpListener, TcpStream},
    path::PathBuf,
    process::exit,
    sync::{Arc, Mutex},
    time::Duration,
};

use tracker_tests::http::{self, Conn, Head};

// What each fake says; tests/tests/discovery.rs expects exactly these.
const AWS_DOCUMENT: &str = r#"{
  "accountId" : "123456789012",
  "architecture" : "x86_64",
  "availabilityZone" : "eu-west-1b",
  "billingProducts" : null,
  "devpayProductCodes" : null,
  "marketplaceProductCodes" : null,
  "imageId" : "ami-0abcdef1234567890",
  "instanceId" : "i-0123456789abcdef0",
  "instanceType" : "m5.large",
  "kernelId" : null,
  "pendingTime" : "2024-05-01T10:00:00Z",
  "privateIp" : "172.31.20.5",
  "ramdiskId" : null,
  "region" : "eu-west-1",
  "version" : "2017-09-30"
}"#;

const AWS_META: &[(&str, &str)] = &[
    ("ami-id", "ami-0abcdef1234567890"),
    ("hostname", "ip-172-31-20-5.eu-west-1.compute.internal"),
    ("instance-id", "i-0123456789abcdef0"),
    ("instance-type", "m5.large"),
    ("local-ipv4", "172.31.20.5"),
    ("placement/availability-zone", "eu-west-1b"),
    ("placement/availability-zone-id", "euw1-az3"),
    ("placement/region", "eu-west-1"),
    ("services/domain", "amazonaws.com"),
    ("services/partition", "aws"),
];

const GCP_VALUES: &[(&str, &str)] = &[
    (
        "instance/hostname",
        "build-01.europe-west4-b.c.spare-cores-demo.internal",
    ),
    ("instance/id", "4520031799277581759"),
    (
        "instance/machine-type",
        "projects/123456789012/machineTypes/n2-standard-4",
    ),
    ("instance/name", "build-01"),
    (
        "instance/zone",
        "projects/123456789012/zones/europe-west4-b",
    ),
    ("project/numeric-project-id", "123456789012"),
    ("project/project-id", "spare-cores-demo"),
];

const AZURE_VERSIONS: &[&str] = &[
    "2017-04-02",
    "2018-10-01",
    "2019-06-01",
    "2020-09-01",
    "2021-01-01",
    "2021-02-01",
    "2021-05-01",
    "2021-10-01",
    "2021-12-13",
    "2023-07-01",
];

const AZURE_INSTANCE: &str = r#"{"compute":{"azEnvironment":"AzurePublicCloud","extendedLocation":{"name":"","type":""},"isHostCompatibilityLayerVm":"false","licenseType":"","location":"westeurope","name":"build-01","offer":"0001-com-ubuntu-server-jammy","osProfile":{"adminUsername":"azureuser","computerName":"build-01","disablePasswordAuthentication":"true"},"osType":"Linux","placementGroupId":"","plan":{"name":"","product":"","publisher":""},"platformFaultDomain":"0","platformUpdateDomain":"0","priority":"","provider":"Microsoft.Compute","publicKeys":[],"publisher":"canonical","resourceGroupName":"rg-build","resourceId":"/subscriptions/8d10da13-8125-4ba9-a717-bf7490507b3d/resourceGroups/rg-build/providers/Microsoft.Compute/virtualMachines/build-01","securityProfile":{"secureBootEnabled":"true","virtualTpmEnabled":"true"},"sku":"22_04-lts-gen2","storageProfile":{},"subscriptionId":"8d10da13-8125-4ba9-a717-bf7490507b3d","tags":"","tagsList":[],"userData":"","version":"22.04.202405010","vmId":"02aab8a4-74ef-476e-8182-f6d2ba4166a6","vmScaleSetName":"","vmSize":"Standard_D4s_v5","zone":"2"},"network":{"interface":[{"ipv4":{"ipAddress":[{"privateIpAddress":"10.0.0.4","publicIpAddress":""}],"subnet":[{"address":"10.0.0.0","prefix":"24"}]},"ipv6":{"ipAddress":[]},"macAddress":"000D3A2B3C4D"}]}}"#;

const HETZNER_METADATA: &str = "availability-zone: fsn1-dc14
hostname: build-01
instance-id: 42424242
local-ipv4: ''
public-ipv4: 203.0.113.7
region: eu-central
public-keys:
- ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIFakeKeyForTestsOnly tester@example
vendor_data: \"#cloud-config\\nbootcmd:\\n- [cloud-init-per, once, hc-net, sh, -c, 'true']\\n\"
";

const HETZNER_VALUES: &[(&str, &str)] = &[
    ("availability-zone", "fsn1-dc14"),
    ("hostname", "build-01"),
    ("instance-id", "42424242"),
    ("public-ipv4", "203.0.113.7"),
    ("region", "eu-central"),
];

const UPCLOUD_JSON: &str = r#"{"cloud_name":"upcloud","instance_id":"00c78863-6ee1-4a93-a9e4-b3b2a3fb3cbb","hostname":"build-01","platform":"servers","subplatform":"metadata (http://169.254.169.254)","public_keys":[],"region":"fi-hel2","network":{"interfaces":[{"index":1,"ip_addresses":[{"address":"94.237.0.10","dhcp":true,"dns":["94.237.127.9","94.237.40.9"],"family":"IPv4","floating":false,"gateway":"94.237.0.1","network":"94.237.0.0/22"}],"mac":"ee:1b:db:ca:6b:80","network_id":"03000000-0000-4000-8100-000000000000","type":"public"}],"dns":["94.237.127.9","94.237.40.9"]},"storage":{"disks":[{"id":"01a1b2c3-d4e5-4f60-8a9b-0c1d2e3f4a5b","serial":"01a1b2c3d4e54f608a9b","size":25600,"type":"disk","tier":"maxiops"}]},"tags":[],"user_data":"","vendor_data":""}"#;

const UPCLOUD_VALUES: &[(&str, &str)] = &[
    ("cloud_name", "upcloud"),
    ("hostname", "build-01"),
    ("instance_id", "00c78863-6ee1-4a93-a9e4-b3b2a3fb3cbb"),
    ("region", "fi-hel2"),
];

const VULTR_JSON: &str = r#"{"bgp":{"ipv4":{"my-address":"","my-asn":"","peer-address":"","peer-asn":""},"ipv6":{"my-address":"","my-asn":"","peer-address":"","peer-asn":""}},"hostname":"build-01","instance-v2-id":"a747bfc6-385a-4ba1-9e3a-5dc8b9e0a6a8","instanceid":"51367832","interfaces":[{"ipv4":{"additional":[],"address":"198.51.100.20","gateway":"198.51.100.1","netmask":"255.255.254.0"},"ipv6":{"additional":[],"address":"2001:db8:4000::1","network":"2001:db8:4000::","prefix":"64"},"mac":"56:00:04:aa:bb:cc","network-type":"public"}],"public-keys":[],"region":{"regioncode":"AMS"},"tags":[]}"#;

const VULTR_VALUES: &[(&str, &str)] = &[
    ("hostname", "build-01"),
    ("instance-v2-id", "a747bfc6-385a-4ba1-9e3a-5dc8b9e0a6a8"),
    ("instanceid", "51367832"),
    ("region/regioncode", "AMS"),
];

const ALIBABA_META: &[(&str, &str)] = &[
    ("hostname", "iZbp1f2hbhdsd1bzh8zl3nZ"),
    ("instance-id", "i-bp1f2hbhdsd1bzh8zl3n"),
    ("instance/instance-type", "ecs.g7.xlarge"),
    ("owner-account-id", "1234567890123456"),
    ("private-ipv4", "172.16.0.10"),
    ("region-id", "cn-hangzhou"),
    ("zone-id", "cn-hangzhou-i"),
];

const OVH_NETWORK: &str = r#"{"links": [{"id": "tap7c3a9b1e-2f", "vif_id": "7c3a9b1e-2f4d-4a8e-9b6c-1d2e3f4a5b6c", "type": "ovs", "mtu": 1500, "ethernet_mac_address": "fa:16:3e:12:34:56"}], "networks": [{"id": "network0", "type": "ipv4_dhcp", "link": "tap7c3a9b1e-2f", "network_id": "b9e8d7c6-5a4b-4c3d-8e2f-1a0b9c8d7e6f"}], "services": [{"type": "dns", "address": "213.186.33.99"}]}"#;

const OVH_META_DATA: &str = r#"{"uuid": "1b2c3d4e-5f60-4718-9a0b-1c2d3e4f5a6b", "meta": {}, "hostname": "build-01.novalocal", "name": "build-01", "launch_index": 0, "availability_zone": "eu-west-par-a", "project_id": "5e1e2f3a4b5c4d6e8f7a9b0c1d2e3f4a", "devices": [], "keys": [], "public_keys": {}}"#;

const OVH_EC2: &[(&str, &str)] = &[
    ("hostname", "build-01.novalocal"),
    ("instance-id", "i-0004a2b1"),
    ("instance-type", "b3-8"),
    ("local-ipv4", "51.75.0.20"),
    ("placement/availability-zone", "eu-west-par-a"),
];

/// One answer.
struct Reply {
    status: u16,
    headers: Vec<(&'static str, String)>,
    body: String,
}

impl Reply {
    fn new(status: u16, content_type: &str, body: impl Into<String>) -> Reply {
        Reply {
            status,
            headers: vec![("Content-Type", content_type.to_string())],
            body: body.into(),
        }
    }
    fn text(body: impl Into<String>) -> Reply {
        Reply::new(200, "text/plain", body)
    }
    fn json(status: u16, body: impl Into<String>) -> Reply {
        Reply::new(status, "application/json; charset=utf-8", body)
    }
    fn status(status: u16) -> Reply {
        let reason = http::reason(status);
        Reply::new(
            status,
            "text/html",
            format!(
                "<?xml version=\"1.0\" encoding=\"iso-8859-1\"?>\n<html><head><title>{status} - {reason}</title></head>\n<body><h1>{status} - {reason}</h1></body></html>\n"
            ),
        )
    }
    fn header(mut self, k: &'static str, v: &str) -> Reply {
        self.headers.push((k, v.to_string()));
        self
    }
}

/// A listing of the keys directly under `dir` (`a`, `b/`), like the EC2 service.
fn listing(keys: &[(&str, &str)], dir: &str) -> Option<String> {
    let mut out: Vec<String> = Vec::new();
    for (k, _) in keys {
        let Some(rest) = k.strip_prefix(dir) else {
            continue;
        };
        let item = match rest.split_once('/') {
            Some((d, _)) => format!("{d}/"),
            None => rest.to_string(),
        };
        if !out.contains(&item) {
            out.push(item);
        }
    }
    (!out.is_empty()).then(|| out.join("\n"))
}

/// A value or a directory listing of a flat key table.
fn lookup(keys: &[(&str, &str)], path: &str) -> Option<String> {
    if let Some((_, v)) = keys.iter().find(|(k, _)| *k == path) {
        return Some(v.to_string());
    }
    if path.is_empty() || path.ends_with('/') {
        return listing(keys, path);
    }
    None
}

fn is_get(r: &Head) -> bool {
    r.method == "GET" || r.method == "HEAD"
}

struct Fake {
    vendor: String,
    imdsv1_only: bool,
    tokens: HashSet<String>,
    issued: u64,
}

impl Fake {
    fn answer(&mut self, r: &Head) -> Reply {
        match self.vendor.as_str() {
            "aws" => self.aws(r),
            "gcp" => gcp(r),
            "azure" => azure(r),
            "hcloud" => hetzner(r),
            "upcloud" => upcloud(r),
            "vultr" => vultr(r),
            "alicloud" => self.alibaba(r),
            "ovh" => ovh(r),
            _ => Reply::status(404),
        }
    }

    fn new_token(&mut self) -> String {
        self.issued += 1;
        let t = format!(
            "AQAEAF{:08x}{:04x}Q2xvdWRGYWtlVG9rZW4tVGVzdHNPbmx5==",
            std::process::id(),
            self.issued
        );
        self.tokens.insert(t.clone());
        t
    }

    /// `PUT /latest/api/token` of AWS and Alibaba: the TTL header (1 to 21600 s)
    /// is required, and a request that came through a proxy is refused.
    fn token_put(&mut self, r: &Head, ttl_header: &str, echo_header: &'static str) -> Reply {
        if self.imdsv1_only {
            return Reply::status(404);
        }
        if r.header("X-Forwarded-For").is_some() {
            return Reply::status(403);
        }
        match r
            .header(ttl_header)
            .and_then(|v| v.trim().parse::<u32>().ok())
        {
            Some(ttl @ 1..=21600) => {
                let t = self.new_token();
                Reply::text(t).header(echo_header, &ttl.to_string())
            }
            _ => Reply::status(400),
        }
    }

    /// Whether a GET may be answered: a valid token, or none where v1 is allowed.
    /// `Err` is the refusal.
    fn token_check(&self, r: &Head, token_header: &str, missing: u16) -> Result<(), Reply> {
        match r.header(token_header) {
            Some(t) if self.tokens.contains(t.trim()) => Ok(()),
            Some(_) => Err(Reply::status(401)),
            None if self.imdsv1_only => Ok(()),
            None => Err(Reply::status(missing)),
        }
    }

    fn aws(&mut self, r: &Head) -> Reply {
        let reply = self.aws_inner(r);
        reply.header("Server", "EC2ws")
    }

    fn aws_inner(&mut self, r: &Head) -> Reply {
        if r.path() == "/latest/api/token" {
            return if r.method == "PUT" {
                self.token_put(
                    r,
                    "X-aws-ec2-metadata-token-ttl-seconds",
                    "X-Aws-Ec2-Metadata-Token-Ttl-Seconds",
                )
            } else {
                Reply::status(405)
            };
        }
        let Some(rest) = r.path().strip_prefix("/latest/") else {
            return Reply::status(404);
        };
        if !is_get(r) {
            return Reply::status(405);
        }
        // HttpTokens=required: no token, no answer, whatever the path.
        if let Err(refusal) = self.token_check(r, "X-aws-ec2-metadata-token", 401) {
            return refusal;
        }
        let found = if rest.is_empty() {
            Some("dynamic\nmeta-data\nuser-data".to_string())
        } else if let Some(m) = rest.strip_prefix("meta-data/") {
            lookup(AWS_META, m)
        } else {
            match rest {
                "dynamic/" => Some("instance-identity/".to_string()),
                "dynamic/instance-identity/" => Some("document\npkcs7\nsignature".to_string()),
                "dynamic/instance-identity/document" => Some(AWS_DOCUMENT.to_string()),
                _ => None,
            }
        };
        match found {
            Some(body) => Reply::text(body),
            None => Reply::status(404),
        }
    }

    fn alibaba(&mut self, r: &Head) -> Reply {
        if r.path() == "/latest/api/token" {
            return if r.method == "PUT" {
                self.token_put(
                    r,
                    "X-aliyun-ecs-metadata-token-ttl-seconds",
                    "X-Aliyun-Ecs-Metadata-Token-Ttl-Seconds",
                )
            } else {
                Reply::status(405)
            };
        }
        let Some(rest) = r.path().strip_prefix("/latest/") else {
            return Reply::status(404);
        };
        if !is_get(r) {
            return Reply::status(405);
        }
        // Hardened mode (tokens required) answers a tokenless request 403.
        if let Err(refusal) = self.token_check(r, "X-aliyun-ecs-metadata-token", 403) {
            return refusal;
        }
        let found = if rest.is_empty() {
            Some("dynamic/\nmeta-data/\nuser-data".to_string())
        } else {
            rest.strip_prefix("meta-data/")
                .and_then(|m| lookup(ALIBABA_META, m))
        };
        match found {
            Some(body) => Reply::text(body).header("Server", "Tengine"),
            None => Reply::status(404),
        }
    }
}

fn gcp(r: &Head) -> Reply {
    let reply = if r.header("X-Forwarded-For").is_some() {
        Reply::new(403, "text/html; charset=UTF-8", "<!DOCTYPE html>\n<html><body><p><b>403.</b> That's an error.</p><p>Your client does not have permission to get URL from this server. Request contains X-Forwarded-For header.</p></body></html>\n")
    } else if r.path().starts_with("/computeMetadata/")
        && r.header("Metadata-Flavor") != Some("Google")
    {
        Reply::new(
            403,
            "text/html; charset=UTF-8",
            format!("<!DOCTYPE html>\n<html><body><p><b>403.</b> That's an error.</p><p>Your client does not have permission to get URL <code>{}</code> from this server. Missing Metadata-Flavor:Google header.</p></body></html>\n", r.path()),
        )
    } else if !is_get(r) {
        Reply::status(405)
    } else if r.path() == "/" {
        Reply::new(200, "application/text", "computeMetadata/\n")
    } else {
        match r
            .path()
            .strip_prefix("/computeMetadata/v1/")
            .and_then(|p| lookup(GCP_VALUES, p))
        {
            Some(v) => Reply::new(200, "application/text", v),
            None => Reply::new(404, "text/html; charset=UTF-8", "<!DOCTYPE html>\n<html><body><p><b>404.</b> That's an error.</p><p>The requested URL was not found on this server.</p></body></html>\n"),
        }
    };
    reply
        .header("Metadata-Flavor", "Google")
        .header("Server", "Metadata Server for VM")
}

fn azure(r: &Head) -> Reply {
    if !r.path().starts_with("/metadata/") {
        return Reply::status(404);
    }
    if r.header("X-Forwarded-For").is_some() {
        return Reply::json(
            400,
            r#"{"error":"Bad request. X-Forwarded-For header is not allowed."}"#,
        );
    }
    if r.header("Metadata").map(|v| v.trim().to_ascii_lowercase()) != Some("true".into()) {
        return Reply::json(
            400,
            r#"{"error":"Bad request. Required metadata header not specified"}"#,
        );
    }
    if !is_get(r) {
        return Reply::json(405, r#"{"error":"Method not allowed"}"#);
    }
    let version = r
        .query()
        .split('&')
        .find_map(|kv| kv.strip_prefix("api-version="));
    match version {
        None => {
            return Reply::json(
                400,
                r#"{"error":"Bad request. api-version was not specified in the request. For more information refer to aka.ms/azureimds","newest-versions":["2023-07-01","2021-12-13","2021-11-15"]}"#,
            )
        }
        Some(v) if !AZURE_VERSIONS.contains(&v) => {
            return Reply::json(
                400,
                r#"{"error":"Bad request. api-version is invalid or was not specified in the request. For more information refer to aka.ms/azureimds","newest-versions":["2023-07-01","2021-12-13","2021-11-15"]}"#,
            )
        }
        Some(_) => {}
    }
    match r.path() {
        "/metadata/instance" | "/metadata/instance/" => Reply::json(200, AZURE_INSTANCE),
        _ => Reply::json(404, r#"{"error":"Not found"}"#),
    }
}

fn plain_get(r: &Head, found: Option<String>, content_type: &str) -> Reply {
    match found {
        Some(_) if !is_get(r) => Reply::status(405),
        Some(body) => Reply::new(200, content_type, body),
        None => Reply::status(404),
    }
}

fn hetzner(r: &Head) -> Reply {
    let found = match r.path() {
        "/hetzner/v1/metadata" => Some(HETZNER_METADATA.to_string()),
        p => p
            .strip_prefix("/hetzner/v1/metadata/")
            .and_then(|k| lookup(HETZNER_VALUES, k)),
    };
    plain_get(r, found, "text/plain; charset=utf-8")
}

fn upcloud(r: &Head) -> Reply {
    if r.path() == "/metadata/v1.json" {
        return plain_get(r, Some(UPCLOUD_JSON.to_string()), "application/json");
    }
    let found = r
        .path()
        .strip_prefix("/metadata/v1/")
        .and_then(|k| lookup(UPCLOUD_VALUES, k));
    plain_get(r, found, "text/plain; charset=utf-8")
}

fn vultr(r: &Head) -> Reply {
    if r.path() == "/v1.json" {
        return plain_get(r, Some(VULTR_JSON.to_string()), "application/json");
    }
    let found = r
        .path()
        .strip_prefix("/v1/")
        .and_then(|k| lookup(VULTR_VALUES, k));
    plain_get(r, found, "text/plain; charset=utf-8")
}

fn ovh(r: &Head) -> Reply {
    let found = match r.path() {
        "/openstack" | "/openstack/" => Some("2012-08-10\n2013-04-04\n2013-10-17\n2015-10-15\n2016-06-30\n2016-10-06\n2017-02-22\n2018-08-27\nlatest".to_string()),
        "/openstack/latest/" => Some("meta_data.json\npassword\nvendor_data.json\nnetwork_data.json\nvendor_data2.json".to_string()),
        "/openstack/latest/meta_data.json" => Some(OVH_META_DATA.to_string()),
        "/openstack/latest/network_data.json" => Some(OVH_NETWORK.to_string()),
        "/openstack/latest/vendor_data.json" | "/openstack/latest/vendor_data2.json" => {
            Some("{}".to_string())
        }
        // OpenStack's EC2-compatible service: no tokens, no identity document.
        "/latest/" => Some("meta-data/\nuser-data".to_string()),
        p => p
            .strip_prefix("/latest/meta-data/")
            .and_then(|k| lookup(OVH_EC2, k)),
    };
    let ty = if r.path().ends_with(".json") {
        "application/json"
    } else {
        "text/plain; charset=UTF-8"
    };
    plain_get(r, found, ty)
}

fn usage(why: &str) -> ! {
    eprintln!("fake-metadata: {why}");
    eprintln!(
        "usage: fake-metadata --vendor aws|gcp|azure|hcloud|upcloud|vultr|alicloud|ovh \
         --addr-file PATH [--imdsv1-only] [--hang] [--log PATH]"
    );
    exit(2);
}

fn main() {
    let mut vendor = None;
    let mut addr_file = None;
    let mut log_file: Option<PathBuf> = None;
    let (mut imdsv1_only, mut hang) = (false, false);
    let mut args = std::env::args_os().skip(1);
    while let Some(a) = args.next() {
        match a.to_str() {
            Some("--vendor") => vendor = args.next().and_then(|v| v.into_string().ok()),
            Some("--addr-file") => addr_file = args.next().map(PathBuf::from),
            Some("--log") => log_file = args.next().map(PathBuf::from),
            Some("--imdsv1-only") => imdsv1_only = true,
            Some("--hang") => hang = true,
            _ => usage(&format!("unknown argument {a:?}")),
        }
    }
    let vendor = vendor.unwrap_or_else(|| usage("--vendor is required"));
    if ![
        "aws", "gcp", "azure", "hcloud", "upcloud", "vultr", "alicloud", "ovh",
    ]
    .contains(&vendor.as_str())
    {
        usage(&format!("unknown vendor '{vendor}'"));
    }
    let addr_file = addr_file.unwrap_or_else(|| usage("--addr-file is required"));

    let listener = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| {
        eprintln!("fake-metadata: cannot listen: {e}");
        exit(1)
    });
    let addr = listener.local_addr().expect("local address");
    let log = log_file.map(|p| {
        std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&p)
            .unwrap_or_else(|e| {
                eprintln!("fake-metadata: {}: {e}", p.display());
                exit(1)
            })
    });
    // Written whole, then renamed: a reader never sees half an address.
    let tmp = addr_file.with_extension("tmp");
    if let Err(e) =
        std::fs::write(&tmp, addr.to_string()).and_then(|()| std::fs::rename(&tmp, &addr_file))
    {
        eprintln!("fake-metadata: {}: {e}", addr_file.display());
        exit(1);
    }

    let fake = Arc::new(Mutex::new(Fake {
        vendor,
        imdsv1_only,
        tokens: HashSet::new(),
        issued: 0,
    }));
    let log = Arc::new(Mutex::new(log));
    // A thread per connection (keep-alive honoured), like a real server: a client
    // that holds connections open never starves another.
    for conn in listener.incoming() {
        let Ok(conn) = conn else { continue };
        let (fake, log) = (fake.clone(), log.clone());
        std::thread::spawn(move || serve(conn, &fake, &log, hang));
    }
}

fn serve(conn: TcpStream, fake: &Mutex<Fake>, log: &Mutex<Option<File>>, hang: bool) {
    let mut c = Conn::new(conn);
    while let Ok(Some(req)) = c.read_request() {
        if c.read_body(&req).is_err() {
            return;
        }
        if let Some(f) = log.lock().unwrap().as_mut() {
            let _ = writeln!(f, "{} {}", req.method, req.target);
        }
        if hang {
            // Never answered; the connection stays open until we are killed.
            loop {
                std::thread::sleep(Duration::from_secs(3600));
            }
        }
        let reply = fake.lock().unwrap().answer(&req);
        let headers: Vec<(&str, &str)> = reply
            .headers
            .iter()
            .map(|(k, v)| (*k, v.as_str()))
            .collect();
        let close = req.closes();
        let mut out = http::response(reply.status, &headers, reply.body.as_bytes(), close);
        if req.method == "HEAD" {
            // The content-length a GET would get, without its body.
            out.truncate(out.len() - reply.body.len());
        }
        if c.write(&out).is_err() || close {
            return;
        }
    }
}
