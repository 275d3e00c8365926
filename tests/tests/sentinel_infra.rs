//! Tests of the Sentinel test infrastructure itself: moto enforces SigV4 with real
//! temporary credentials, the mock API validates like the live one and injects its
//! faults in order, and the S3 proxy relays signed requests byte for byte.
//! The moto tests print SKIPPED (and pass) when target/moto is missing outside CI.

use std::{
    io::Write,
    time::{Duration, Instant},
};

use serde_json::{json, Value};
use tracker_tests::{e2e::unix_now, sentinel::*};

fn mock_bin() -> std::path::PathBuf {
    env!("CARGO_BIN_EXE_mock-sentinel").into()
}

fn gzip(b: &[u8]) -> Vec<u8> {
    let mut e = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    e.write_all(b).expect("gzip");
    e.finish().expect("gzip")
}

fn register_body() -> Value {
    json!({
        "project_name": "infra",
        "job_name": "test",
        "language": "rust",
        "command": "[\"python\", \"train.py\"]",
        "tags": ["team=ml", "env=ci"],
        "host_vcpus": 4,
        "host_memory_mib": 15_872.5,
        "host_cpu_model": "Test CPU",
        "cloud_vendor_id": "aws",
    })
}

/// The `loc` paths of a 422 answer's detail list.
fn locs(r: &HttpResponse) -> Vec<Value> {
    assert_eq!(r.status, 422, "{}", r.text());
    let v = r.json();
    v["detail"]
        .as_array()
        .unwrap_or_else(|| panic!("detail is not a list: {v}"))
        .iter()
        .map(|d| d["loc"].clone())
        .collect()
}

fn post_raw(
    mock: &MockSentinel,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> HttpResponse {
    http_request(mock.api_addr(), "POST", path, headers, body)
}

fn check_creds(c: &Value, want: &Creds, key: &str, expires_in: f64) {
    assert_eq!(c["access_key"], want.access_key.as_str(), "{c}");
    assert_eq!(c["secret_key"], want.secret_key.as_str(), "{c}");
    assert_eq!(c["session_token"], want.session_token.as_str(), "{c}");
    let exp = c[key].as_str().unwrap_or_else(|| panic!("no {key} in {c}"));
    let t = parse_iso8601(exp).unwrap_or_else(|| panic!("{key} {exp:?} does not parse"));
    let d = t - unix_now();
    assert!(
        (d - expires_in).abs() < 30.0,
        "{key} {exp} is {d:.0} s away, wanted {expires_in}"
    );
}

#[test]
fn iso8601_parser() {
    assert_eq!(parse_iso8601("1970-01-01T00:00:00Z"), Some(0.0));
    assert_eq!(
        parse_iso8601("2000-03-01T00:00:00+00:00"),
        Some(951_868_800.0)
    );
    assert_eq!(
        parse_iso8601("2000-03-01T01:30:00+01:30"),
        Some(951_868_800.0)
    );
    assert_eq!(
        parse_iso8601("2024-02-29T12:00:00.25Z"),
        Some(1_709_208_000.25)
    );
    assert_eq!(parse_iso8601("2024-02-29T12:00:00"), None);
    assert_eq!(parse_iso8601("not-a-date"), None);
}

#[test]
fn mock_register_validates_like_the_live_api() {
    let mock = MockSentinel::start_bin(&mock_bin(), &Scenario::offline());
    let sc = &mock.scenario;

    let r = mock.post("/runs", &register_body());
    assert_eq!(r.status, 200, "{}", r.text());
    let v = r.json();
    assert_eq!(v["run_id"], "run-1");
    assert_eq!(v["upload_uri_prefix"], "s3://offline-bucket/runs/run-1");
    check_creds(
        &v["upload_credentials"],
        &sc.credentials[0],
        "expires_at",
        3600.0,
    );
    assert_eq!(v["upload_credentials"]["region"], "us-east-1");

    // The command as an actual array, pid, run_id, an unknown key, a null: 422 each.
    let bad = |k: &str, val: Value| {
        let mut b = register_body();
        b[k] = val;
        mock.post("/runs", &b)
    };
    assert_eq!(
        locs(&bad("command", json!(["python", "train.py"]))),
        vec![json!(["body", "command"])]
    );
    assert_eq!(
        locs(&bad("command", json!("python train.py"))),
        vec![json!(["body", "command"])]
    );
    assert_eq!(
        locs(&bad("command", json!("[1, 2]"))),
        vec![json!(["body", "command"])]
    );
    assert_eq!(locs(&bad("pid", json!(1234))), vec![json!(["body", "pid"])]);
    for k in ["pid", "run_id"] {
        let r = bad(k, json!("x"));
        assert_eq!(
            r.json()["detail"][0]["type"],
            "extra_forbidden",
            "{k}: {}",
            r.text()
        );
    }
    assert_eq!(
        locs(&bad("run_id", json!("run-1"))),
        vec![json!(["body", "run_id"])]
    );
    assert_eq!(
        locs(&bad("hostname", json!("h"))),
        vec![json!(["body", "hostname"])]
    );
    assert_eq!(
        locs(&bad("team", Value::Null)),
        vec![json!(["body", "team"])]
    );
    assert_eq!(
        locs(&bad("host_vcpus", json!("4"))),
        vec![json!(["body", "host_vcpus"])]
    );
    assert_eq!(
        locs(&bad("tags", json!("a=b"))),
        vec![json!(["body", "tags"])]
    );
    // Tags as an object (the Python docs' form) are accepted too.
    assert_eq!(bad("tags", json!({"team": "ml"})).status, 200);

    // Not an object; not JSON; gzip; another media type.
    let auth = format!("Bearer {}", sc.token);
    let json_h = [
        ("Authorization", auth.as_str()),
        ("Content-Type", "application/json"),
    ];
    assert_eq!(post_raw(&mock, "/runs", &json_h, b"[1, 2]").status, 422);
    assert_eq!(post_raw(&mock, "/runs", &json_h, b"{not json").status, 422);
    assert_eq!(post_raw(&mock, "/runs", &json_h, b"").status, 422);
    let body = register_body().to_string();
    let gz_h = [
        ("Authorization", auth.as_str()),
        ("Content-Type", "application/json"),
        ("Content-Encoding", "gzip"),
    ];
    let r = post_raw(&mock, "/runs", &gz_h, &gzip(body.as_bytes()));
    assert_eq!(r.status, 422, "gzip body: {}", r.text());
    let text_h = [
        ("Authorization", auth.as_str()),
        ("Content-Type", "text/plain"),
    ];
    assert_eq!(
        post_raw(&mock, "/runs", &text_h, body.as_bytes()).status,
        422
    );
    // The same body with the right headers is fine.
    assert_eq!(
        post_raw(&mock, "/runs", &json_h, body.as_bytes()).status,
        200
    );

    // Tokens.
    let wrong = [
        ("Authorization", "Bearer nope"),
        ("Content-Type", "application/json"),
    ];
    let r = post_raw(&mock, "/runs", &wrong, body.as_bytes());
    assert_eq!(r.status, 401, "{}", r.text());
    assert!(r.json()["detail"].is_string(), "{}", r.text());
    let none = [("Content-Type", "application/json")];
    assert_eq!(post_raw(&mock, "/runs", &none, body.as_bytes()).status, 401);
    let basic = [
        ("Authorization", "secret-token"),
        ("Content-Type", "application/json"),
    ];
    assert_eq!(
        post_raw(&mock, "/runs", &basic, body.as_bytes()).status,
        401
    );

    // Unknown paths and methods.
    assert_eq!(post_raw(&mock, "/run", &json_h, b"{}").status, 404);
    assert_eq!(
        http_request(mock.api_addr(), "GET", "/runs", &json_h, b"").status,
        405
    );

    // Every request was recorded with its kind, status, headers and parsed body.
    let rec = mock.records();
    let first = &rec[0];
    assert_eq!(first["kind"], "register");
    assert_eq!(first["status"], 200);
    assert_eq!(first["action"], "ok");
    assert_eq!(first["headers"]["authorization"], "Bearer secret-token");
    assert_eq!(first["body"], register_body());
    assert!(first["t"]
        .as_f64()
        .is_some_and(|t| (t - unix_now()).abs() < 60.0));
    let pid = rec
        .iter()
        .find(|r| r["body"].get("pid").is_some())
        .expect("the pid request is recorded");
    assert_eq!(pid["status"], 422);
    let gz = rec
        .iter()
        .find(|r| r["headers"]["content-encoding"] == "gzip")
        .expect("the gzip request is recorded");
    assert_eq!(gz["body"], Value::Null);
    assert_eq!(gz["status"], 422);
    assert_eq!(rec.last().expect("records")["kind"], "other");
    let ok = rec
        .iter()
        .filter(|r| r["kind"] == "register" && r["status"] == 200)
        .count();
    assert_eq!(ok, 3, "{rec:#?}");
}

#[test]
fn mock_refresh_and_finish_validate() {
    let mock = MockSentinel::start_bin(
        &mock_bin(),
        &Scenario::offline()
            .issue(Issue::cred(0, 3600.0))
            .issue(Issue::cred(1, 900.0)),
    );
    let sc = mock.scenario.clone();
    let run = mock.post("/runs", &register_body()).json();
    let id = run["run_id"].as_str().expect("run_id").to_string();
    let prefix = run["upload_uri_prefix"]
        .as_str()
        .expect("prefix")
        .to_string();
    let auth = format!("Bearer {}", sc.token);

    // Refresh: unknown run 404; no body and `{}` are fine; anything else 422.
    assert_eq!(
        mock.post("/runs/run-99/refresh-credentials", &json!({}))
            .status,
        404
    );
    let r = post_raw(
        &mock,
        &format!("/runs/{id}/refresh-credentials"),
        &[("Authorization", auth.as_str())],
        b"",
    );
    assert_eq!(r.status, 200, "{}", r.text());
    check_creds(
        &r.json()["upload_credentials"],
        &sc.credentials[1],
        "expires_at",
        900.0,
    );
    let r = mock.post(&format!("/runs/{id}/refresh-credentials"), &json!({}));
    assert_eq!(r.status, 200, "{}", r.text());
    let r = mock.post(
        &format!("/runs/{id}/refresh-credentials"),
        &json!({"run_id": id}),
    );
    assert_eq!(r.status, 422, "{}", r.text());

    let finish = format!("/runs/{id}/finish");
    let csv = "timestamp,system_cpu_usage\n1.0,0.5\n2.0,0.25\n";
    let inline = json!({"exit_code": 0, "run_status": "finished", "data_source": "inline",
                        "data_csv": csv, "finished_at": "2026-01-01T00:00:00Z"});
    let with = |k: &str, v: Value| {
        let mut b = inline.clone();
        b[k] = v;
        b
    };
    assert_eq!(
        locs(&mock.post(&finish, &with("run_id", json!(id)))),
        vec![json!(["body", "run_id"])]
    );
    let b64 = "dGltZXN0YW1wLHN5c3RlbV9jcHVfdXNhZ2UKMS4wLDAuNQo=";
    assert_eq!(
        locs(&mock.post(&finish, &with("data_csv", json!(b64)))),
        vec![json!(["body", "data_csv"])]
    );
    assert_eq!(
        locs(&mock.post(&finish, &with("exit_code", json!("0")))),
        vec![json!(["body", "exit_code"])]
    );
    assert_eq!(
        locs(&mock.post(&finish, &with("exit_code", json!(0.5)))),
        vec![json!(["body", "exit_code"])]
    );
    assert_eq!(
        locs(&mock.post(&finish, &with("run_status", json!("ok")))),
        vec![json!(["body", "run_status"])]
    );
    assert_eq!(
        locs(&mock.post(&finish, &with("data_source", json!("gcs")))),
        vec![json!(["body", "data_source"])]
    );
    assert_eq!(
        locs(&mock.post(&finish, &with("finished_at", json!("yesterday")))),
        vec![json!(["body", "finished_at"])]
    );
    let s3_bad = json!({"exit_code": 0, "run_status": "finished", "data_source": "s3",
                        "data_uris": ["s3://offline-bucket/runs/run-2/000001"]});
    assert_eq!(
        locs(&mock.post(&finish, &s3_bad)),
        vec![json!(["body", "data_uris", "0"])]
    );
    let s3_none = json!({"exit_code": 0, "run_status": "finished", "data_source": "s3"});
    assert_eq!(
        locs(&mock.post(&finish, &s3_none)),
        vec![json!(["body", "data_uris"])]
    );
    let gz_h = [
        ("Authorization", auth.as_str()),
        ("Content-Type", "application/json"),
        ("Content-Encoding", "gzip"),
    ];
    let r = post_raw(&mock, &finish, &gz_h, &gzip(inline.to_string().as_bytes()));
    assert_eq!(r.status, 422, "gzip finish: {}", r.text());
    assert_eq!(mock.post("/runs/run-99/finish", &inline).status, 404);

    // A good inline finish counts the rows; a second finish is a conflict.
    let r = mock.post(&finish, &inline);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["samples"], 2);
    assert_eq!(mock.post(&finish, &inline).status, 409);
    assert_eq!(
        mock.post(&format!("/runs/{id}/refresh-credentials"), &json!({}))
            .status,
        409
    );

    // An s3 finish with URIs under the run's prefix.
    let run2 = mock.post("/runs", &register_body()).json();
    let id2 = run2["run_id"].as_str().expect("run_id");
    let p2 = run2["upload_uri_prefix"].as_str().expect("prefix");
    assert_ne!(p2, prefix);
    let ok = json!({"exit_code": 1, "run_status": "failed", "data_source": "s3",
                    "data_uris": [format!("{p2}/000001.csv.gz"), format!("{p2}/000002.csv.gz")]});
    let r = mock.post(&format!("/runs/{id2}/finish"), &ok);
    assert_eq!(r.status, 200, "{}", r.text());
    assert_eq!(r.json()["objects"], 2);
    // Issuances: register 0, two refreshes 1 (the last entry repeats), run-2 again 1.
    assert_eq!(
        run2["upload_credentials"]["access_key"],
        sc.credentials[1].access_key.as_str()
    );
}

#[test]
fn mock_faults_come_in_order() {
    let mock = MockSentinel::start_bin(
        &mock_bin(),
        &Scenario::offline()
            .fault(
                "register",
                &[
                    "status:500",
                    "close",
                    "malformed",
                    "missing:upload_credentials",
                    "bad_prefix",
                    "status:429",
                ],
            )
            .fault(
                "refresh",
                &["sleep:1500", "missing:upload_credentials.session_token"],
            )
            .fault("finish", &["status:503"]),
    );
    let body = register_body();
    let r = mock.post("/runs", &body);
    assert_eq!(r.status, 500);
    assert!(r.json()["detail"].is_string(), "{}", r.text());
    let r = mock.post("/runs", &body);
    assert_eq!(r.status, 0, "close: no answer, got {}", r.text());
    let r = mock.post("/runs", &body);
    assert_eq!(r.status, 200);
    assert!(
        serde_json::from_slice::<Value>(&r.body).is_err(),
        "malformed: {}",
        r.text()
    );
    let r = mock.post("/runs", &body).json();
    assert!(
        r.get("upload_credentials").is_none() && r["run_id"].is_string(),
        "{r}"
    );
    let r = mock.post("/runs", &body).json();
    assert_eq!(r["upload_uri_prefix"], "https://not-s3/x");
    assert_eq!(mock.post("/runs", &body).status, 429);
    let r = mock.post("/runs", &body);
    assert_eq!(r.status, 200, "then ok forever: {}", r.text());
    let id = r.json()["run_id"].as_str().expect("run_id").to_string();
    assert_eq!(mock.post("/runs", &body).status, 200);

    // A sleeping request does not hold up the others.
    let addr = mock.api_addr().to_string();
    let path = format!("/runs/{id}/refresh-credentials");
    let slow = std::thread::spawn(move || {
        let t0 = Instant::now();
        let r = http_request(
            &addr,
            "POST",
            &path,
            &[("Authorization", "Bearer secret-token")],
            b"",
        );
        (r.status, t0.elapsed())
    });
    std::thread::sleep(Duration::from_millis(200));
    let t0 = Instant::now();
    assert_eq!(mock.post("/runs", &body).status, 200);
    assert!(
        t0.elapsed() < Duration::from_millis(1000),
        "{:?}",
        t0.elapsed()
    );
    let (status, took) = slow.join().expect("slow thread");
    assert_eq!(status, 200);
    assert!(
        took >= Duration::from_millis(1400),
        "sleep:1500 answered after {took:?}"
    );
    let r = mock
        .post(&format!("/runs/{id}/refresh-credentials"), &json!({}))
        .json();
    assert!(
        r["upload_credentials"].get("session_token").is_none(),
        "{r}"
    );
    assert!(r["upload_credentials"]["access_key"].is_string(), "{r}");

    let fin = json!({"exit_code": 0, "run_status": "finished", "data_source": "inline",
                     "data_csv": "timestamp\n1\n"});
    assert_eq!(mock.post(&format!("/runs/{id}/finish"), &fin).status, 503);
    assert_eq!(mock.post(&format!("/runs/{id}/finish"), &fin).status, 200);

    let actions: Vec<(String, Value)> = mock
        .records_of("register")
        .iter()
        .map(|r| {
            (
                r["action"].as_str().expect("action").to_string(),
                r["status"].clone(),
            )
        })
        .collect();
    assert_eq!(
        actions,
        vec![
            ("status:500".into(), json!(500)),
            ("close".into(), Value::Null),
            ("malformed".into(), json!(200)),
            ("missing:upload_credentials".into(), json!(200)),
            ("bad_prefix".into(), json!(200)),
            ("status:429".into(), json!(429)),
            ("ok".into(), json!(200)),
            ("ok".into(), json!(200)),
            ("ok".into(), json!(200)),
        ]
    );
}

#[test]
fn mock_issuance_sequence() {
    let mock = MockSentinel::start_bin(
        &mock_bin(),
        &Scenario::offline()
            .region(None)
            .issue(Issue::cred(0, 3600.0))
            .issue(Issue {
                expiry_key: "expiration".into(),
                expiry_style: "offset".into(),
                ..Issue::cred(1, 250.0)
            })
            .issue(Issue {
                corrupt_token: true,
                expiry_style: "fraction".into(),
                ..Issue::cred(2, -10.0)
            })
            .issue(Issue {
                omit: vec!["secret_key".into()],
                expiry_raw: Some(json!("soon")),
                ..Issue::cred(0, 0.0)
            }),
    );
    let sc = mock.scenario.clone();
    let run = mock.post("/runs", &register_body()).json();
    let c = &run["upload_credentials"];
    check_creds(c, &sc.credentials[0], "expires_at", 3600.0);
    assert!(c.get("region").is_none(), "region null: none sent: {c}");
    let id = run["run_id"].as_str().expect("run_id");
    let refresh = || {
        let r = mock.post(&format!("/runs/{id}/refresh-credentials"), &json!({}));
        assert_eq!(r.status, 200, "{}", r.text());
        r.json()["upload_credentials"].clone()
    };
    let c = refresh();
    check_creds(&c, &sc.credentials[1], "expiration", 250.0);
    assert!(
        c["expiration"]
            .as_str()
            .expect("expiration")
            .ends_with("+00:00"),
        "{c}"
    );
    assert!(c.get("expires_at").is_none(), "{c}");
    let c = refresh();
    let tok = c["session_token"].as_str().expect("token");
    assert_ne!(tok, sc.credentials[2].session_token);
    assert_eq!(tok.len(), sc.credentials[2].session_token.len());
    assert_eq!(c["access_key"], sc.credentials[2].access_key.as_str());
    let exp = c["expires_at"].as_str().expect("expires_at");
    assert!(exp.contains('.') && exp.ends_with('Z'), "{exp}");
    assert!(
        parse_iso8601(exp).expect("parses") < unix_now(),
        "already expired: {exp}"
    );
    for _ in 0..2 {
        // The last entry repeats.
        let c = refresh();
        assert_eq!(c["expires_at"], "soon", "{c}");
        assert!(c.get("secret_key").is_none(), "{c}");
        assert_eq!(c["access_key"], sc.credentials[0].access_key.as_str());
    }
}

#[test]
fn moto_enforces_sigv4_with_temporary_credentials() {
    let Some(moto) = Moto::start("infra-auth", 2) else {
        return;
    };
    assert_eq!(moto.credentials.len(), 2);
    assert_ne!(moto.credentials[0], moto.credentials[1]);
    for c in &moto.credentials {
        assert!(c.access_key.starts_with("ASIA"), "temporary key: {c:?}");
    }
    let seen = moto
        .check_auth(&moto.credentials[1])
        .unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(seen["good"], Value::Null, "{seen}");
    assert_eq!(
        seen["wrong_session_token"],
        json!([400, "InvalidToken"]),
        "{seen}"
    );
    assert_eq!(
        seen["wrong_secret"],
        json!([403, "SignatureDoesNotMatch"]),
        "{seen}"
    );

    let c = &moto.credentials[0];
    let ep = moto.endpoint();
    let good = moto.put(
        &ep,
        &["runs/a/000001.csv.gz"],
        c,
        "timestamp,x\n1,2\n",
        true,
        PutMode::Sdk,
    );
    assert!(good[0].ok, "{good:?}");
    let bad = moto.put(
        &ep,
        &["runs/a/bad"],
        &c.with_bad_token(),
        "x",
        true,
        PutMode::Sdk,
    );
    assert!(
        !bad[0].ok,
        "a corrupted session token was accepted: {bad:?}"
    );
    assert_eq!(bad[0].status, Some(400), "{bad:?}");
    assert_eq!(bad[0].code.as_deref(), Some("InvalidToken"), "{bad:?}");
    let mut wrong = c.clone();
    wrong.secret_key.push('x');
    let bad = moto.put(&ep, &["runs/a/bad"], &wrong, "x", true, PutMode::Chunked);
    assert_eq!(bad[0].status, Some(403), "{bad:?}");
    // The role may write only to its bucket: a key elsewhere is refused.
    let other = moto_ctl(&[
        "put",
        "--endpoint",
        &ep,
        "--bucket",
        "some-other-bucket",
        "--key",
        "k",
        "--access-key",
        &c.access_key,
        "--secret-key",
        &c.secret_key,
        "--session-token",
        &c.session_token,
    ])
    .expect("put");
    assert_eq!(other["ok"], false, "{other}");

    let objs = moto.dump("infra-auth", "runs/");
    assert_eq!(objs.len(), 1, "{objs:?}");
    assert_eq!(objs[0].key, "runs/a/000001.csv.gz");
    assert_eq!(objs[0].content_encoding.as_deref(), Some("gzip"));
    assert_eq!(objs[0].text.as_deref(), Ok("timestamp,x\n1,2\n"));
}

#[test]
fn s3_proxy_relays_signed_requests() {
    let Some(moto) = Moto::start("infra-proxy", 1) else {
        return;
    };
    let mock = MockSentinel::start_bin(&mock_bin(), &Scenario::new(&moto));
    let c = &moto.credentials[0];
    let proxy = mock.s3_url();
    let csv = "timestamp,system_cpu_usage\n1.5,0.25\n2.5,0.5\n";

    // Three PUTs on one boto3 client: keep-alive through the proxy.
    let keys = [
        "runs/r/000001.csv.gz",
        "runs/r/000002.csv.gz",
        "runs/r/000003.csv.gz",
    ];
    let res = moto.put(&proxy, &keys, c, csv, true, PutMode::Sdk);
    assert!(res.iter().all(|r| r.ok), "{res:?}");
    let puts = mock.records_of("s3_put");
    assert_eq!(puts.len(), 3, "{puts:#?}");
    for (p, k) in puts.iter().zip(keys) {
        assert_eq!(p["path"], format!("/infra-proxy/{k}"));
        assert_eq!(p["status"], 200, "{p}");
        assert_eq!(p["action"], "ok");
        assert!(p["headers"]["authorization"]
            .as_str()
            .is_some_and(|a| a.starts_with("AWS4-HMAC-SHA256")));
        assert_eq!(
            p["headers"]["x-amz-security-token"],
            c.session_token.as_str()
        );
        assert_eq!(p["headers"]["host"], mock.s3_addr());
    }
    let conns: Vec<&Value> = puts.iter().map(|p| &p["conn"]).collect();
    assert!(
        conns.windows(2).all(|w| w[0] == w[1]),
        "one connection: {puts:#?}"
    );
    assert_eq!(puts[2]["seq"], 3);

    // A chunked body and an aws-chunked one (what SDKs send for streams).
    let r = moto.put(&proxy, &["runs/r/chunked"], c, csv, true, PutMode::Chunked);
    assert!(r[0].ok, "{r:?}");
    let r = moto.put(
        &proxy,
        &["runs/r/aws-chunked"],
        c,
        csv,
        true,
        PutMode::AwsChunked,
    );
    assert!(r[0].ok, "{r:?}");
    let puts = mock.records_of("s3_put");
    assert_eq!(
        puts[3]["headers"]["transfer-encoding"], "chunked",
        "{}",
        puts[3]
    );
    assert_eq!(
        puts[4]["headers"]["x-amz-content-sha256"],
        "STREAMING-UNSIGNED-PAYLOAD-TRAILER"
    );

    // moto's errors come back as they are: a corrupted token.
    let r = moto.put(
        &proxy,
        &["runs/r/bad"],
        &c.with_bad_token(),
        csv,
        true,
        PutMode::Sdk,
    );
    assert_eq!(
        (r[0].status, r[0].code.as_deref()),
        (Some(400), Some("InvalidToken")),
        "{r:?}"
    );
    let last = mock.records_of("s3_put").pop().expect("record");
    assert_eq!(last["status"], 400);
    assert!(
        last["response"]
            .as_str()
            .is_some_and(|s| s.contains("InvalidToken")),
        "{last}"
    );

    // Reads through the proxy (LIST, GET) relay bodies too: s3_other, never faulted.
    let via_proxy = moto_ctl(&[
        "dump",
        "--endpoint",
        &proxy,
        "--bucket",
        "infra-proxy",
        "--prefix",
        "runs/",
        "--access-key",
        &c.access_key,
        "--secret-key",
        &c.secret_key,
        "--session-token",
        &c.session_token,
    ])
    .expect("dump through the proxy");
    let objs = moto.dump("infra-proxy", "runs/");
    assert_eq!(objs.len(), 5, "{objs:?}");
    assert_eq!(via_proxy.as_array().map(Vec::len), Some(5), "{via_proxy}");
    for (o, p) in objs.iter().zip(via_proxy.as_array().expect("list")) {
        assert_eq!(o.text.as_deref(), Ok(csv), "{o:?}");
        assert_eq!(p["key"], o.key.as_str());
        assert_eq!(p["text"], csv);
    }
    // HEAD bucket (the Python client's region probe) through the proxy.
    let (status, region) = moto.head_bucket(&proxy, c);
    assert_eq!((status, region.as_deref()), (Some(200), Some("us-east-1")));
    let others = mock.records_of("s3_other");
    assert!(
        others
            .iter()
            .any(|r| r["method"] == "HEAD" && r["status"] == 200),
        "{others:#?}"
    );
    assert!(
        others
            .iter()
            .any(|r| r["method"] == "GET" && r["status"] == 200),
        "{others:#?}"
    );
    assert!(others.iter().all(|r| r["action"] == "ok"));
}

#[test]
fn s3_proxy_faults() {
    let Some(moto) = Moto::start("infra-faults", 1) else {
        return;
    };
    let mock = MockSentinel::start_bin(
        &mock_bin(),
        &Scenario::new(&moto).fault(
            "s3_put",
            &[
                "status:503",
                "close",
                "sleep:700",
                "status:400:ExpiredToken",
            ],
        ),
    );
    let c = &moto.credentials[0];
    let keys = ["runs/f/1", "runs/f/2", "runs/f/3", "runs/f/4", "runs/f/5"];
    let t0 = Instant::now();
    let res = moto.put(
        &mock.s3_url(),
        &keys,
        c,
        "timestamp\n1\n",
        true,
        PutMode::Sdk,
    );
    assert!(t0.elapsed() >= Duration::from_millis(700));
    assert_eq!(
        (res[0].ok, res[0].status, res[0].code.as_deref()),
        (false, Some(503), Some("SlowDown")),
        "{res:?}"
    );
    assert_eq!((res[1].ok, res[1].status), (false, None), "close: {res:?}");
    assert!(res[2].ok && res[4].ok, "{res:?}");
    let expired = (res[3].ok, res[3].status, res[3].code.as_deref());
    assert_eq!(expired, (false, Some(400), Some("ExpiredToken")), "{res:?}");
    let got: Vec<(Value, Value)> = mock
        .records_of("s3_put")
        .iter()
        .map(|r| (r["action"].clone(), r["status"].clone()))
        .collect();
    assert_eq!(
        got,
        vec![
            (json!("status:503"), json!(503)),
            (json!("close"), Value::Null),
            (json!("sleep:700"), json!(200)),
            (json!("status:400:ExpiredToken"), json!(400)),
            (json!("ok"), json!(200)),
        ]
    );
    // Nothing of the refused PUTs reached moto.
    let objs: Vec<String> = moto
        .dump("infra-faults", "runs/")
        .into_iter()
        .map(|o| o.key)
        .collect();
    assert_eq!(objs, vec!["runs/f/3", "runs/f/5"]);
}

#[test]
fn moto_bucket_in_another_region() {
    let Some(moto) = Moto::start_in("infra-region", 1, "eu-central-1") else {
        return;
    };
    let c = &moto.credentials[0];
    let (status, region) = moto.head_bucket(&moto.endpoint(), c);
    assert_eq!(
        (status, region.as_deref()),
        (Some(200), Some("eu-central-1"))
    );
    let r = moto.put(
        &moto.endpoint(),
        &["runs/x/1"],
        c,
        "timestamp\n1\n",
        true,
        PutMode::Sdk,
    );
    assert!(r[0].ok, "{r:?}");
    assert_eq!(moto.dump("infra-region", "").len(), 1);
}
