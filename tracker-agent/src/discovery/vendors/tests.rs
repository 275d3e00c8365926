//! Each vendor's probe against recorded answers.

use super::*;

#[test]
fn plain_values() {
    assert_eq!(plain(" m5.large\n").as_deref(), Some("m5.large"));
    assert_eq!(plain(""), None);
    assert_eq!(plain("two words"), None);
    assert_eq!(plain("<html>\n<body>404</body>"), None);
    assert_eq!(plain(&"x".repeat(256)), None);
}

#[test]
fn aws_document() {
    let doc = r#"{
  "accountId" : "123456789012",
  "architecture" : "x86_64",
  "availabilityZone" : "eu-west-1b",
  "billingProducts" : null,
  "imageId" : "ami-0a1b2c3d4e5f67890",
  "instanceId" : "i-0123456789abcdef0",
  "instanceType" : "m5.large",
  "pendingTime" : "2024-05-01T10:00:00Z",
  "privateIp" : "10.0.1.23",
  "region" : "eu-west-1",
  "version" : "2017-09-30"
}"#;
    let c = parse_aws_document(doc).unwrap();
    assert_eq!(
        c,
        CloudInfo {
            cloud_vendor_id: "aws".into(),
            cloud_account_id: Some("123456789012".into()),
            cloud_region_id: Some("eu-west-1".into()),
            cloud_zone_id: Some("eu-west-1b".into()),
            cloud_instance_type: Some("m5.large".into()),
            instance_id: Some("i-0123456789abcdef0".into()),
        }
    );
    assert!(parse_aws_document(r#"{"region":"eu-west-1","instanceId":"i-1"}"#).is_err());
    assert!(parse_aws_document("[1,2]").is_err());
    assert!(parse_aws_document("<html>404</html>").is_err());
    assert!(parse_aws_document(r#"{"region":5,"instanceId":[],"instanceType":{}}"#).is_err());
}

#[test]
fn gcp_paths() {
    assert_eq!(
        gcp_resource(
            "projects/123456789012/machineTypes/n2-standard-4",
            "machineTypes"
        )
        .as_deref(),
        Some("n2-standard-4")
    );
    assert_eq!(
        gcp_resource("projects/123456789012/zones/europe-west4-b\n", "zones").as_deref(),
        Some("europe-west4-b")
    );
    assert_eq!(
        gcp_resource("projects/1/zones/europe-west4-b", "machineTypes"),
        None
    );
    assert_eq!(gcp_resource("n2-standard-4", "machineTypes"), None);
    assert_eq!(
        gcp_resource("projects/1/machineTypes/", "machineTypes"),
        None
    );
    assert_eq!(
        gcp_region("europe-west4-b").as_deref(),
        Some("europe-west4")
    );
    assert_eq!(gcp_region("us-central1-a").as_deref(), Some("us-central1"));
    assert_eq!(gcp_region("zone"), None);
    assert_eq!(gcp_region("zone-"), None);
}

#[test]
fn azure_document() {
    let doc = r#"{"compute":{"azEnvironment":"AzurePublicCloud","location":"westeurope",
        "subscriptionId":"8d10da13-8125-4ba9-a717-bf7490507b3d","vmId":"02aab8a4-74ef-476e-8182-f6d2ba4166a6",
        "vmSize":"Standard_D2s_v3","zone":""},"network":{}}"#;
    let c = parse_azure(doc).unwrap();
    assert_eq!(c.cloud_vendor_id, "azure");
    assert_eq!(c.cloud_region_id.as_deref(), Some("westeurope"));
    assert_eq!(c.cloud_zone_id, None);
    assert_eq!(c.cloud_instance_type.as_deref(), Some("Standard_D2s_v3"));
    assert_eq!(
        c.cloud_account_id.as_deref(),
        Some("8d10da13-8125-4ba9-a717-bf7490507b3d")
    );
    assert_eq!(
        c.instance_id.as_deref(),
        Some("02aab8a4-74ef-476e-8182-f6d2ba4166a6")
    );
    assert!(parse_azure(r#"{"compute":{"location":"westeurope"}}"#).is_err());
    assert!(parse_azure(r#"{"error":"Bad request"}"#).is_err());
}

#[test]
fn hetzner_metadata() {
    let text = "availability-zone: fsn1-dc14\nhostname: build-01\ninstance-id: 42424242\n\
        local-ipv4: ''\npublic-ipv4: 203.0.113.7\nregion: eu-central\npublic-keys:\n\
        - ssh-ed25519 AAAA... region: nope\nvendor_data: \"#cloud-config\\nregion: x\\n\"\n";
    let c = parse_hetzner(text).unwrap();
    assert_eq!(
        c,
        CloudInfo {
            cloud_vendor_id: "hcloud".into(),
            cloud_account_id: None,
            cloud_region_id: Some("eu-central".into()),
            cloud_zone_id: Some("fsn1-dc14".into()),
            // Never the instance id.
            cloud_instance_type: None,
            instance_id: Some("42424242".into()),
        }
    );
    assert_eq!(
        parse_hetzner("instance-id: '7'\nregion: \"us-east\"\n")
            .unwrap()
            .cloud_region_id
            .as_deref(),
        Some("us-east")
    );
    assert!(parse_hetzner("region: eu-central\n").is_err());
    assert!(parse_hetzner("instance-id: i-abc\nregion: eu-central\n").is_err());
    assert!(parse_hetzner("<html><body>404 Not Found</body></html>").is_err());
    assert!(parse_hetzner("{\"instance-id\": 5}").is_err());
}

#[test]
fn upcloud_and_vultr() {
    let up = r#"{"cloud_name":"upcloud","instance_id":"00c78863-6ee1-4a93-a9e4-b3b2a3fb3cbb","region":"fi-hel2"}"#;
    let c = parse_upcloud(up).unwrap();
    assert_eq!(c.cloud_region_id.as_deref(), Some("fi-hel2"));
    assert_eq!(
        c.instance_id.as_deref(),
        Some("00c78863-6ee1-4a93-a9e4-b3b2a3fb3cbb")
    );
    assert!(parse_upcloud(r#"{"droplet_id":1234,"region":"ams3"}"#).is_err());

    let v = r#"{"hostname":"g","instance-v2-id":"a747bfc6-385a-4ba1-9e3a-5dc8b9e0a6a8","instanceid":"51367832","region":{"regioncode":"AMS"}}"#;
    let c = parse_vultr(v).unwrap();
    assert_eq!(c.cloud_region_id.as_deref(), Some("ams"));
    assert_eq!(
        c.instance_id.as_deref(),
        Some("a747bfc6-385a-4ba1-9e3a-5dc8b9e0a6a8")
    );
    let old = r#"{"instanceid":51367832,"region":{"regioncode":"EWR"}}"#;
    assert_eq!(
        parse_vultr(old).unwrap().instance_id.as_deref(),
        Some("51367832")
    );
    assert!(parse_vultr(r#"{"region":{"regioncode":"AMS"}}"#).is_err());
    assert!(parse_vultr(r#"{"instanceid":"1"}"#).is_err());
}

#[test]
fn ovh_network_and_zone() {
    let ovh = r#"{"links":[],"networks":[],"services":[{"type":"dns","address":"213.186.33.99"}]}"#;
    assert_eq!(is_ovh_network(ovh), Ok(true));
    let other = r#"{"links":[],"networks":[],"services":[{"type":"dns","address":"8.8.8.8"}]}"#;
    assert_eq!(is_ovh_network(other), Ok(false));
    assert!(is_ovh_network(r#"{"links":[]}"#).is_err());
    assert_eq!(ovh_placement(Some("nova")), (None, None));
    assert_eq!(ovh_placement(None), (None, None));
    assert_eq!(
        ovh_placement(Some("eu-west-par-a")),
        (Some("eu-west-par".into()), Some("eu-west-par-a".into()))
    );
    assert_eq!(ovh_placement(Some("GRA11")), (Some("GRA11".into()), None));
}

#[test]
fn tokens() {
    assert_eq!(
        token("AQAEAHk9u_token==\n").as_deref(),
        Some("AQAEAHk9u_token==")
    );
    assert_eq!(token(""), None);
    assert_eq!(token("a b"), None);
}
