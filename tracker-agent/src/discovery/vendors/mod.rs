//! One probe per cloud vendor. Each returns the vendor's `CloudInfo`, or why it is
//! not that vendor (for the debug log). The parsers are plain functions of the
//! answers' text so that they are tested on fixed text.
//!
//! Vendor ids are those of the maintainers' clients (Python `resource-tracker` 0.5.0
//! `cloud_info.py`: aws, gcp, azure, hcloud, upcloud; Rust `resource-tracker` 0.1.18
//! `collector/clouds`: also vultr, alicloud, ovh), which are Spare Cores' vendor ids.

use serde_json::Value;

use super::{
    http::{Failure, Http, Kind},
    CloudInfo,
};

pub(super) const AWS: &str = "aws";
pub(super) const GCP: &str = "gcp";
pub(super) const AZURE: &str = "azure";
pub(super) const HETZNER: &str = "hcloud";
pub(super) const UPCLOUD: &str = "upcloud";
pub(super) const VULTR: &str = "vultr";
pub(super) const ALIBABA: &str = "alicloud";
pub(super) const OVH: &str = "ovh";

type Outcome = Result<CloudInfo, String>;

/// A metadata value: one printable ASCII word (ids, types, regions), at most 255
/// characters. Anything else (an HTML page, a multi-line text) is not a value.
pub(super) fn plain(s: &str) -> Option<String> {
    let s = s.trim();
    (!s.is_empty() && s.len() <= 255 && s.bytes().all(|b| b.is_ascii_graphic()))
        .then(|| s.to_string())
}

/// The start of an unexpected answer, escaped to one line, for the debug log.
fn quote(s: &str) -> String {
    let s: String = s.trim().chars().take(60).collect();
    format!("'{}'", s.escape_debug())
}

fn need(v: Option<String>, what: &str) -> Result<String, String> {
    v.ok_or_else(|| format!("no {what} in the answer"))
}

/// A string field of a JSON answer (numbers are taken as their text).
fn json_text(doc: &Value, pointer: &str) -> Option<String> {
    match doc.pointer(pointer)? {
        Value::String(s) => plain(s),
        Value::Number(n) => plain(&n.to_string()),
        _ => None,
    }
}

fn json_object(body: &str) -> Result<Value, String> {
    match serde_json::from_str::<Value>(body) {
        Ok(v @ Value::Object(_)) => Ok(v),
        _ => Err(format!("answer is not a JSON object: {}", quote(body))),
    }
}

/// Whether a failed token request leaves the tokenless (v1) protocol worth a try,
/// as AWS's own SDKs decide: 403 (tokens disabled), 404 (no token service), 405
/// (a proxy refusing PUT), or connected but no answer (the hop limit drops the
/// token's answer on its way into a container, while GETs still come back).
fn v1_may_work(f: &Failure) -> bool {
    matches!(f.kind, Kind::Status(403..=405) | Kind::TimedOut)
}

/// A session token (AWS, Alibaba): printable ASCII, no spaces.
fn token(body: &str) -> Option<String> {
    let t = body.trim();
    (!t.is_empty() && t.len() <= 4096 && t.bytes().all(|b| b.is_ascii_graphic()))
        .then(|| t.to_string())
}

/// IMDSv2 / Alibaba hardened mode: a token from `PUT {base}/latest/api/token`, or
/// `None` to go on without one.
async fn session_token(h: &Http, base: &str, ttl_header: &str) -> Result<Option<String>, String> {
    match h
        .put(
            &format!("{base}/latest/api/token"),
            &[(ttl_header, "21600")],
        )
        .await
    {
        Ok(a) => token(&a.body)
            .map(Some)
            .ok_or_else(|| format!("token answer is not a token: {}", quote(&a.body))),
        Err(f) if v1_may_work(&f) => {
            log::debug!("cloud discovery: {f}; trying without a token");
            Ok(None)
        }
        Err(f) => Err(f.into()),
    }
}

// ---------------------------------------------------------------------------- AWS

/// AWS EC2: the instance identity document has all the fields at once.
pub(super) async fn aws(h: &Http, base: &str) -> Outcome {
    let token = session_token(h, base, "X-aws-ec2-metadata-token-ttl-seconds").await?;
    let headers: Vec<(&str, &str)> = token
        .as_deref()
        .map(|t| ("X-aws-ec2-metadata-token", t))
        .into_iter()
        .collect();
    let doc = h
        .get(
            &format!("{base}/latest/dynamic/instance-identity/document"),
            &headers,
        )
        .await?;
    parse_aws_document(&doc.body)
}

/// The identity document (JSON): `instanceId`, `instanceType`, `region` are
/// required (OpenStack's EC2-compatible service has no such document).
pub(super) fn parse_aws_document(body: &str) -> Outcome {
    let doc = json_object(body)?;
    Ok(CloudInfo {
        cloud_vendor_id: AWS.into(),
        cloud_account_id: json_text(&doc, "/accountId"),
        cloud_region_id: Some(need(json_text(&doc, "/region"), "region")?),
        cloud_zone_id: json_text(&doc, "/availabilityZone"),
        cloud_instance_type: Some(need(json_text(&doc, "/instanceType"), "instanceType")?),
        instance_id: Some(need(json_text(&doc, "/instanceId"), "instanceId")?),
    })
}

// ---------------------------------------------------------------------------- GCP

/// One GCP metadata value. The real server answers with `Metadata-Flavor: Google`;
/// any other web server is not GCP's.
async fn gcp_get(h: &Http, url: String) -> Result<String, String> {
    let a = h.get(&url, &[("Metadata-Flavor", "Google")]).await?;
    match a.headers.get("metadata-flavor").map(|v| v.to_str()) {
        Some(Ok("Google")) => Ok(a.body),
        _ => Err(format!(
            "GET {url}: no 'Metadata-Flavor: Google' in the answer"
        )),
    }
}

/// `projects/NUM/<kind>/NAME` → NAME.
pub(super) fn gcp_resource(s: &str, kind: &str) -> Option<String> {
    let parts: Vec<&str> = s.trim().split('/').collect();
    match parts.as_slice() {
        ["projects", project, k, name] if !project.is_empty() && *k == kind => plain(name),
        _ => None,
    }
}

/// A zone's region: the zone without its last `-x` (`europe-west4-b` → `europe-west4`).
pub(super) fn gcp_region(zone: &str) -> Option<String> {
    match zone.rsplit_once('-') {
        Some((region, z)) if !region.is_empty() && !z.is_empty() => Some(region.to_string()),
        _ => None,
    }
}

pub(super) async fn gcp(h: &Http, base: &str) -> Outcome {
    let v1 = format!("{base}/computeMetadata/v1");
    let machine = gcp_get(h, format!("{v1}/instance/machine-type")).await?;
    let instance_type = gcp_resource(&machine, "machineTypes").ok_or_else(|| {
        format!(
            "machine type {} is not projects/N/machineTypes/T",
            quote(&machine)
        )
    })?;
    let (zone, project, id) = tokio::join!(
        gcp_get(h, format!("{v1}/instance/zone")),
        gcp_get(h, format!("{v1}/project/project-id")),
        gcp_get(h, format!("{v1}/instance/id")),
    );
    let zone = zone?;
    let zone = gcp_resource(&zone, "zones")
        .ok_or_else(|| format!("zone {} is not projects/N/zones/Z", quote(&zone)))?;
    Ok(CloudInfo {
        cloud_vendor_id: GCP.into(),
        cloud_account_id: project.ok().as_deref().and_then(plain),
        cloud_region_id: gcp_region(&zone),
        cloud_zone_id: Some(zone),
        cloud_instance_type: Some(instance_type),
        instance_id: id.ok().as_deref().and_then(plain),
    })
}

// -------------------------------------------------------------------------- Azure

pub(super) async fn azure(h: &Http, base: &str) -> Outcome {
    let a = h
        .get(
            &format!("{base}/metadata/instance?api-version=2021-02-01"),
            &[("Metadata", "true")],
        )
        .await?;
    parse_azure(&a.body)
}

/// `compute.vmSize` and `compute.location` are required; `compute.zone` is empty
/// outside availability zones.
pub(super) fn parse_azure(body: &str) -> Outcome {
    let doc = json_object(body)?;
    Ok(CloudInfo {
        cloud_vendor_id: AZURE.into(),
        cloud_account_id: json_text(&doc, "/compute/subscriptionId"),
        cloud_region_id: Some(need(
            json_text(&doc, "/compute/location"),
            "compute.location",
        )?),
        cloud_zone_id: json_text(&doc, "/compute/zone"),
        cloud_instance_type: Some(need(json_text(&doc, "/compute/vmSize"), "compute.vmSize")?),
        instance_id: json_text(&doc, "/compute/vmId"),
    })
}

// ------------------------------------------------------------------------ Hetzner

pub(super) async fn hetzner(h: &Http, base: &str) -> Outcome {
    let a = h.get(&format!("{base}/hetzner/v1/metadata"), &[]).await?;
    parse_hetzner(&a.body)
}

/// The YAML mapping of `/hetzner/v1/metadata`; only its top-level `key: value` lines
/// are read. Hetzner's metadata has no server type: `cloud_instance_type` stays
/// `None` (the maintainers' clients put the instance id there, a known bug).
pub(super) fn parse_hetzner(text: &str) -> Outcome {
    let (mut id, mut region, mut zone) = (None, None, None);
    for line in text.lines() {
        if line.starts_with(char::is_whitespace) || line.starts_with('-') {
            continue;
        }
        let Some((key, value)) = line.split_once(':') else {
            continue;
        };
        let value = value.trim();
        let value = value
            .strip_prefix('"')
            .and_then(|v| v.strip_suffix('"'))
            .or_else(|| value.strip_prefix('\'').and_then(|v| v.strip_suffix('\'')))
            .unwrap_or(value);
        let slot = match key.trim() {
            "instance-id" => &mut id,
            "region" => &mut region,
            "availability-zone" => &mut zone,
            _ => continue,
        };
        if slot.is_none() {
            *slot = plain(value);
        }
    }
    let id = need(id, "instance-id").map_err(|e| format!("{e}: {}", quote(text)))?;
    if !id.bytes().all(|b| b.is_ascii_digit()) {
        return Err(format!("instance-id {} is not a number", quote(&id)));
    }
    Ok(CloudInfo {
        cloud_vendor_id: HETZNER.into(),
        cloud_account_id: None,
        cloud_region_id: Some(need(region, "region")?),
        cloud_zone_id: zone,
        cloud_instance_type: None,
        instance_id: Some(id),
    })
}

// ------------------------------------------------------------------------ UpCloud

pub(super) async fn upcloud(h: &Http, base: &str) -> Outcome {
    let a = h.get(&format!("{base}/metadata/v1.json"), &[]).await?;
    parse_upcloud(&a.body)
}

/// `cloud_name == "upcloud"` tells UpCloud apart (DigitalOcean serves the same
/// path). Its metadata has no plan (instance type).
pub(super) fn parse_upcloud(body: &str) -> Outcome {
    let doc = json_object(body)?;
    if doc.get("cloud_name").and_then(Value::as_str) != Some("upcloud") {
        return Err(format!("cloud_name is not \"upcloud\": {}", quote(body)));
    }
    Ok(CloudInfo {
        cloud_vendor_id: UPCLOUD.into(),
        cloud_account_id: None,
        cloud_region_id: json_text(&doc, "/region"),
        cloud_zone_id: None,
        cloud_instance_type: None,
        instance_id: json_text(&doc, "/instance_id"),
    })
}

// -------------------------------------------------------------------------- Vultr

pub(super) async fn vultr(h: &Http, base: &str) -> Outcome {
    let a = h.get(&format!("{base}/v1.json"), &[]).await?;
    parse_vultr(&a.body)
}

/// An instance id (`instance-v2-id`, the API's, else the older `instanceid`) and
/// `region.regioncode` are required. The region code is given upper case (`AMS`);
/// Vultr's API and Spare Cores use it lower case (`ams`). No plan in the metadata.
pub(super) fn parse_vultr(body: &str) -> Outcome {
    let doc = json_object(body)?;
    let id = json_text(&doc, "/instance-v2-id").or_else(|| json_text(&doc, "/instanceid"));
    let region = json_text(&doc, "/region/regioncode").map(|r| r.to_ascii_lowercase());
    Ok(CloudInfo {
        cloud_vendor_id: VULTR.into(),
        cloud_account_id: None,
        cloud_region_id: Some(need(region, "region.regioncode")?),
        cloud_zone_id: None,
        cloud_instance_type: None,
        instance_id: Some(need(id, "instance-v2-id or instanceid")?),
    })
}

// ------------------------------------------------------------------------ Alibaba

pub(super) async fn alibaba(h: &Http, base: &str) -> Outcome {
    let token = session_token(h, base, "X-aliyun-ecs-metadata-token-ttl-seconds").await?;
    let headers: Vec<(&str, &str)> = token
        .as_deref()
        .map(|t| ("X-aliyun-ecs-metadata-token", t))
        .into_iter()
        .collect();
    let value = |path: &'static str| {
        let url = format!("{base}/latest/meta-data/{path}");
        let headers = &headers;
        async move {
            let a = h.get(&url, headers).await?;
            plain(&a.body).ok_or_else(|| format!("GET {url}: not a value: {}", quote(&a.body)))
        }
    };
    let (ty, region, zone, id, owner) = tokio::join!(
        value("instance/instance-type"),
        value("region-id"),
        value("zone-id"),
        value("instance-id"),
        value("owner-account-id"),
    );
    Ok(CloudInfo {
        cloud_vendor_id: ALIBABA.into(),
        cloud_account_id: owner.ok(),
        cloud_region_id: Some(region?),
        cloud_zone_id: zone.ok(),
        cloud_instance_type: Some(ty?),
        instance_id: id.ok(),
    })
}

// ---------------------------------------------------------------------------- OVH

/// OVH's resolver (cdns.ovh.net), which OVH Public Cloud's OpenStack network data
/// names as the DNS service; other OpenStack clouds name their own.
const OVH_DNS: [&str; 2] = ["213.186.33.99", "2001:41d0:3:163::1"];

pub(super) async fn ovh(h: &Http, base: &str) -> Outcome {
    let nd = h
        .get(&format!("{base}/openstack/latest/network_data.json"), &[])
        .await?;
    if !is_ovh_network(&nd.body)? {
        return Err("OpenStack, but no OVH resolver among the DNS services".into());
    }
    let meta_data = format!("{base}/openstack/latest/meta_data.json");
    // The EC2-compatible service of OpenStack gives the flavor.
    let flavor = format!("{base}/latest/meta-data/instance-type");
    let (md, ty) = tokio::join!(h.get(&meta_data, &[]), h.get(&flavor, &[]));
    let md = match md {
        Ok(a) => json_object(&a.body).ok(),
        Err(f) => {
            log::debug!("cloud discovery: {f}");
            None
        }
    };
    let az = md.as_ref().and_then(|d| json_text(d, "/availability_zone"));
    let (region, zone) = ovh_placement(az.as_deref());
    Ok(CloudInfo {
        cloud_vendor_id: OVH.into(),
        cloud_account_id: md.as_ref().and_then(|d| json_text(d, "/project_id")),
        cloud_region_id: region,
        cloud_zone_id: zone,
        cloud_instance_type: ty.ok().and_then(|a| plain(&a.body)),
        instance_id: md.as_ref().and_then(|d| json_text(d, "/uuid")),
    })
}

/// OpenStack `network_data.json`: does a `dns` service name OVH's resolver?
pub(super) fn is_ovh_network(body: &str) -> Result<bool, String> {
    let doc = json_object(body)?;
    let services = doc
        .get("services")
        .and_then(Value::as_array)
        .ok_or_else(|| format!("no services list: {}", quote(body)))?;
    Ok(services.iter().any(|s| {
        s.get("type").and_then(Value::as_str) == Some("dns")
            && s.get("address")
                .and_then(Value::as_str)
                .is_some_and(|a| OVH_DNS.contains(&a))
    }))
}

/// Region and zone from OpenStack's `availability_zone`: `nova` (OpenStack's
/// default, what OVH's one-zone regions say) tells nothing; a three-zone region's
/// zone is `REGION-x` (`eu-west-par-a`); anything else is taken as the region.
pub(super) fn ovh_placement(az: Option<&str>) -> (Option<String>, Option<String>) {
    let Some(az) = az.filter(|a| !a.eq_ignore_ascii_case("nova")) else {
        return (None, None);
    };
    match az.rsplit_once('-') {
        Some((region, z))
            if !region.is_empty() && z.len() == 1 && z.bytes().all(|b| b.is_ascii_lowercase()) =>
        {
            (Some(region.to_string()), Some(az.to_string()))
        }
        _ => (Some(az.to_string()), None),
    }
}

#[cfg(test)]
mod tests;
