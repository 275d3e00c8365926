//! A Sentinel-compatible API and an S3 fault proxy for the streaming tests.
//!
//! `mock-sentinel CONFIG.json`; the config and the recorded lines are described in
//! tests/src/sentinel.rs. Two listeners on 127.0.0.1 (ephemeral ports, written to
//! `api_addr_file` and `s3_addr_file`), one thread per connection, HTTP/1.1 with
//! keep-alive on tracker_tests::http, so that faults can drop a connection mid-request
//! and the S3 relay can forward every byte unchanged (SigV4 signs the Host header and
//! the body hash). The API answers like the live FastAPI service as far as
//! ../shared/docs/sentinel-protocol.md knows it: 401 for a bad token, 422 with a
//! `{"detail": [...]}` list for a body the schema refuses, 404 for an unknown run,
//! 409 for a second finish.

use std::{
    collections::{HashMap, VecDeque},
    fs::File,
    io::{self, Write},
    net::{TcpListener, TcpStream},
    path::PathBuf,
    sync::{Arc, Mutex},
    time::{Duration, SystemTime, UNIX_EPOCH},
};

use serde_json::{json, Map, Value};
use time::{
    format_description::{well_known::Rfc3339, BorrowedFormatItem},
    macros::format_description,
    OffsetDateTime,
};
use tracker_tests::{
    http::{self, Conn, Head},
    sentinel::Issue,
};

/// Keys a registration may carry (the protocol's list); anything else is refused.
const REGISTER_KEYS: &[&str] = &[
    "project_name",
    "job_name",
    "stage_name",
    "task_name",
    "team",
    "env",
    "language",
    "orchestrator",
    "executor",
    "external_run_id",
    "container_image",
    "command",
    "tags",
    "host_vcpus",
    "host_cpu_model",
    "host_memory_mib",
    "host_gpu_model",
    "host_gpu_count",
    "host_gpu_memory_mib",
    "host_storage_gb",
    "host_server_allocation",
    "host_id",
    "host_hostname",
    "host_ip",
    "cloud_vendor_id",
    "cloud_account_id",
    "cloud_region_id",
    "cloud_zone_id",
    "cloud_instance_type",
];
const REGISTER_INTS: &[&str] = &["host_vcpus", "host_gpu_count"];
const REGISTER_NUMBERS: &[&str] = &["host_memory_mib", "host_gpu_memory_mib", "host_storage_gb"];
const FINISH_KEYS: &[&str] = &[
    "exit_code",
    "run_status",
    "data_source",
    "data_uris",
    "data_csv",
    "finished_at",
];

// ---------------------------------------------------------------- configuration

struct Config {
    api_addr_file: PathBuf,
    s3_addr_file: PathBuf,
    record: PathBuf,
    token: String,
    upstream: String,
    bucket: String,
    prefix: String,
    region: Option<String>,
    credentials: Vec<Value>,
    issue: Vec<Issue>,
}

fn config_str(v: &Value, key: &str) -> Result<String, String> {
    v[key]
        .as_str()
        .map(str::to_string)
        .ok_or_else(|| format!("config: `{key}` must be a string"))
}

fn parse_config(v: &Value) -> Result<(Config, HashMap<String, VecDeque<String>>), String> {
    let upstream = config_str(v, "upstream_s3")?;
    let upstream = upstream
        .strip_prefix("http://")
        .ok_or("config: upstream_s3 must be http://HOST:PORT")?
        .trim_end_matches('/')
        .to_string();
    let mut issue: Vec<Issue> = v["issue"]
        .as_array()
        .map(|a| a.iter().map(Issue::from_json).collect())
        .unwrap_or_default();
    for (i, it) in issue.iter().enumerate() {
        if !["z", "offset", "fraction"].contains(&it.expiry_style.as_str()) {
            return Err(format!(
                "config: issue[{i}].expiry_style must be z|offset|fraction"
            ));
        }
    }
    if issue.is_empty() {
        issue.push(Issue::default());
    }
    let mut faults = HashMap::new();
    for kind in ["register", "refresh", "finish", "s3_put"] {
        let list: VecDeque<String> = v["faults"][kind]
            .as_array()
            .map(|a| {
                a.iter()
                    .filter_map(|x| x.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default();
        for a in &list {
            check_action(kind, a)?;
        }
        faults.insert(kind.to_string(), list);
    }
    let cfg = Config {
        api_addr_file: config_str(v, "api_addr_file")?.into(),
        s3_addr_file: config_str(v, "s3_addr_file")?.into(),
        record: config_str(v, "record")?.into(),
        token: v["token"].as_str().unwrap_or("secret-token").to_string(),
        upstream,
        bucket: config_str(v, "bucket")?,
        prefix: v["prefix"]
            .as_str()
            .unwrap_or("runs")
            .trim_matches('/')
            .to_string(),
        region: v["region"].as_str().map(str::to_string),
        credentials: v["credentials"].as_array().cloned().unwrap_or_default(),
        issue,
    };
    Ok((cfg, faults))
}

fn check_action(kind: &str, a: &str) -> Result<(), String> {
    let ok = match a.split_once(':') {
        None => {
            ["ok", "close"].contains(&a)
                || (kind != "s3_put" && a == "malformed")
                || (kind == "register" && a == "bad_prefix")
        }
        Some(("status", n)) => {
            let (n, extra) = n.split_once(':').unwrap_or((n, ""));
            n.parse::<u16>().is_ok_and(|n| (200..600).contains(&n))
                && (extra.is_empty()
                    || kind != "s3_put"
                    || extra.chars().all(|c| c.is_ascii_alphanumeric()))
        }
        Some(("sleep", n)) => n.parse::<u64>().is_ok(),
        Some(("missing", f)) => kind != "s3_put" && !f.is_empty(),
        _ => false,
    };
    if ok {
        Ok(())
    } else {
        Err(format!("config: unknown {kind} fault action {a:?}"))
    }
}

// ---------------------------------------------------------------- state

struct Run {
    finished: bool,
}

struct State {
    faults: HashMap<String, VecDeque<String>>,
    issued: usize,
    next_run: u64,
    runs: HashMap<String, Run>,
}

struct Mock {
    cfg: Config,
    /// Connections accepted so far (both listeners): each record names its own.
    conns: std::sync::atomic::AtomicU64,
    state: Mutex<State>,
    record: Mutex<File>,
}

impl Mock {
    fn take_fault(&self, kind: &str) -> String {
        let mut st = self.state.lock().expect("state");
        st.faults
            .get_mut(kind)
            .and_then(VecDeque::pop_front)
            .unwrap_or_else(|| "ok".to_string())
    }

    fn record(&self, mut line: Map<String, Value>) {
        line.insert("answered".into(), json!(now()));
        let mut s = Value::Object(line).to_string();
        s.push('\n');
        let mut f = self.record.lock().expect("record");
        // One write per line; the file is unbuffered, so a reader sees whole lines.
        if let Err(e) = f.write_all(s.as_bytes()) {
            eprintln!("mock-sentinel: cannot write the record: {e}");
        }
    }

    /// The next issuance of upload credentials.
    fn issue(&self) -> Result<Value, String> {
        let k = {
            let mut st = self.state.lock().expect("state");
            st.issued += 1;
            st.issued - 1
        };
        let is = &self.cfg.issue[k.min(self.cfg.issue.len() - 1)];
        let c = self
            .cfg
            .credentials
            .get(is.cred)
            .ok_or_else(|| format!("issuance {k}: no credentials[{}]", is.cred))?;
        let field = |f: &str| -> Result<String, String> {
            c[f].as_str()
                .map(str::to_string)
                .ok_or_else(|| format!("credentials[{}].{f} is not a string", is.cred))
        };
        let mut token = field("session_token")?;
        if is.corrupt_token {
            // Same length and alphabet, different bytes: STS never issued it.
            let keep = token.len().saturating_sub(8);
            token = format!("{}{}", &token[..keep], "AAAABBBB");
            if token == field("session_token")? {
                token = format!("{}{}", &token[..keep], "CCCCDDDD");
            }
        }
        let mut m = Map::new();
        m.insert("access_key".into(), json!(field("access_key")?));
        m.insert("secret_key".into(), json!(field("secret_key")?));
        m.insert("session_token".into(), json!(token));
        let expiry = match &is.expiry_raw {
            Some(v) => v.clone(),
            None => json!(iso8601(now() + is.expires_in, &is.expiry_style)),
        };
        m.insert(is.expiry_key.clone(), expiry);
        if let Some(r) = &self.cfg.region {
            m.insert("region".into(), json!(r));
        }
        for o in &is.omit {
            m.remove(o);
        }
        Ok(Value::Object(m))
    }

    fn run_prefix(&self, run_id: &str) -> String {
        if self.cfg.prefix.is_empty() {
            format!("s3://{}/{run_id}", self.cfg.bucket)
        } else {
            format!("s3://{}/{}/{run_id}", self.cfg.bucket, self.cfg.prefix)
        }
    }
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_secs_f64())
        .unwrap_or(0.0)
}

/// ISO-8601 UTC: `z` → `2026-01-02T03:04:05Z`, `offset` → `…05+00:00`,
/// `fraction` → `…05.123456Z`.
fn iso8601(t: f64, style: &str) -> String {
    let f: &[BorrowedFormatItem] = match style {
        "offset" => format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]+00:00"),
        "fraction" => {
            format_description!(
                "[year]-[month]-[day]T[hour]:[minute]:[second].[subsecond digits:6]Z"
            )
        }
        _ => format_description!("[year]-[month]-[day]T[hour]:[minute]:[second]Z"),
    };
    let t = OffsetDateTime::from_unix_timestamp_nanos((t * 1e9) as i128)
        .unwrap_or(OffsetDateTime::UNIX_EPOCH);
    t.format(f).unwrap_or_default()
}

/// Whether `s` is an ISO-8601 date-time as pydantic accepts it (with a zone).
fn is_iso8601(s: &str) -> bool {
    OffsetDateTime::parse(s, &Rfc3339).is_ok()
}

// ---------------------------------------------------------------- HTTP

fn headers_json(h: &Head) -> Value {
    let mut m = Map::new();
    for (k, v) in &h.headers {
        match m.get_mut(&k.to_ascii_lowercase()) {
            Some(Value::String(old)) => {
                old.push_str(", ");
                old.push_str(v);
            }
            _ => {
                m.insert(k.to_ascii_lowercase(), json!(v));
            }
        }
    }
    Value::Object(m)
}

fn response(code: u16, ctype: &str, body: &[u8], close: bool, extra: &[(&str, &str)]) -> Vec<u8> {
    let date = OffsetDateTime::now_utc()
        .format(format_description!(
            "[weekday repr:short], [day] [month repr:short] [year] [hour]:[minute]:[second] GMT"
        ))
        .unwrap_or_default();
    let mut headers = vec![
        ("date", date.as_str()),
        ("server", "mock-sentinel"),
        ("content-type", ctype),
    ];
    headers.extend_from_slice(extra);
    http::response(code, &headers, body, close)
}

// ---------------------------------------------------------------- the API

struct Reply {
    status: u16,
    body: Value,
    /// Replaces the JSON body verbatim (the `malformed` fault).
    raw: Option<Vec<u8>>,
    extra_headers: &'static [(&'static str, &'static str)],
}

impl Reply {
    fn json(status: u16, body: Value) -> Reply {
        Reply {
            status,
            body,
            raw: None,
            extra_headers: &[],
        }
    }
    fn detail(status: u16, msg: &str) -> Reply {
        Reply::json(status, json!({ "detail": msg }))
    }
}

/// One pydantic-style validation error.
fn verr(loc: &[&str], typ: &str, msg: &str, input: Value) -> Value {
    let mut l = vec![json!("body")];
    l.extend(loc.iter().map(|s| json!(s)));
    json!({"type": typ, "loc": l, "msg": msg, "input": input})
}

fn unprocessable(errors: Vec<Value>) -> Reply {
    Reply::json(422, json!({ "detail": errors }))
}

/// The JSON object body of a POST, or the 422 FastAPI answers instead.
fn json_object(h: &Head, body: &[u8], required: bool) -> Result<Map<String, Value>, Reply> {
    if body.is_empty() && !required {
        return Ok(Map::new());
    }
    let enc = h.header("content-encoding").unwrap_or("identity");
    if !enc.eq_ignore_ascii_case("identity") {
        // Starlette does not decode request bodies: gzip bytes are not JSON.
        return Err(unprocessable(vec![verr(
            &[],
            "json_invalid",
            &format!("JSON decode error (Content-Encoding {enc} is not decoded)"),
            json!({}),
        )]));
    }
    let ctype = h.header("content-type").unwrap_or("");
    let mime = ctype.split(';').next().unwrap_or("").trim();
    let json_ct = mime.eq_ignore_ascii_case("application/json")
        || (mime.starts_with("application/") && mime.ends_with("+json"));
    if !json_ct {
        // FastAPI reads a body with another media type as raw bytes: not an object.
        return Err(unprocessable(vec![verr(
            &[],
            "model_attributes_type",
            &format!("Input should be a valid dictionary or object to extract fields from (content-type {ctype:?})"),
            json!(String::from_utf8_lossy(body)),
        )]));
    }
    let v: Value = serde_json::from_slice(body).map_err(|e| {
        unprocessable(vec![verr(
            &[],
            "json_invalid",
            &format!("JSON decode error: {e}"),
            json!({}),
        )])
    })?;
    match v {
        Value::Object(m) => Ok(m),
        other => Err(unprocessable(vec![verr(
            &[],
            "model_attributes_type",
            "Input should be a valid dictionary or object to extract fields from",
            other,
        )])),
    }
}

fn validate_register(m: &Map<String, Value>) -> Vec<Value> {
    let mut errs = Vec::new();
    for (k, v) in m {
        if !REGISTER_KEYS.contains(&k.as_str()) {
            errs.push(verr(
                &[k],
                "extra_forbidden",
                "Extra inputs are not permitted",
                v.clone(),
            ));
            continue;
        }
        if v.is_null() {
            errs.push(verr(
                &[k],
                "null_value",
                "Null values are not accepted (drop the key)",
                Value::Null,
            ));
            continue;
        }
        let is_int = v.as_i64().is_some() || v.as_f64().is_some_and(|f| f.fract() == 0.0);
        if REGISTER_INTS.contains(&k.as_str()) {
            if !v.is_number() || !is_int {
                errs.push(verr(
                    &[k],
                    "int_type",
                    "Input should be a valid integer",
                    v.clone(),
                ));
            }
        } else if REGISTER_NUMBERS.contains(&k.as_str()) {
            if !v.is_number() {
                errs.push(verr(
                    &[k],
                    "float_type",
                    "Input should be a valid number",
                    v.clone(),
                ));
            }
        } else if k == "command" {
            match v.as_str() {
                None => errs.push(verr(
                    &[k],
                    "string_type",
                    "Input should be a valid string",
                    v.clone(),
                )),
                Some(s) => {
                    let ok = serde_json::from_str::<Value>(s).ok().is_some_and(|a| {
                        a.as_array().is_some_and(|a| a.iter().all(Value::is_string))
                    });
                    if !ok {
                        errs.push(verr(
                            &[k],
                            "value_error",
                            "Value error, command must be a JSON-encoded array of strings",
                            v.clone(),
                        ));
                    }
                }
            }
        } else if k == "tags" {
            let ok = match v {
                Value::Array(a) => a.iter().all(Value::is_string),
                Value::Object(o) => o.values().all(Value::is_string),
                _ => false,
            };
            if !ok {
                errs.push(verr(
                    &[k],
                    "value_error",
                    "Value error, tags must be a list of \"key=value\" strings or an object of strings",
                    v.clone(),
                ));
            }
        } else if !v.is_string() {
            errs.push(verr(
                &[k],
                "string_type",
                "Input should be a valid string",
                v.clone(),
            ));
        }
    }
    errs
}

/// `finish`'s data fields: S3 object URIs under the run's prefix, or inline CSV,
/// never both.
fn validate_data(m: &Map<String, Value>, run_prefix: &str) -> Vec<Value> {
    let mut errs = Vec::new();
    let want = format!("{run_prefix}/");
    match m.get("data_source").and_then(Value::as_str) {
        Some("s3") => {
            match m.get("data_uris").and_then(Value::as_array) {
                Some(a) if !a.is_empty() => {
                    for (i, u) in a.iter().enumerate() {
                        let ok = u
                            .as_str()
                            .is_some_and(|s| s.starts_with(&want) && s.len() > want.len());
                        if !ok {
                            errs.push(verr(
                                &["data_uris", &i.to_string()],
                                "value_error",
                                &format!(
                                    "Value error, every data URI must be an object under {want}"
                                ),
                                u.clone(),
                            ));
                        }
                    }
                }
                _ => errs.push(verr(
                    &["data_uris"],
                    "value_error",
                    "Value error, data_source s3 needs a non-empty data_uris list",
                    m.get("data_uris").cloned().unwrap_or(Value::Null),
                )),
            }
            if m.contains_key("data_csv") {
                errs.push(verr(
                    &["data_csv"],
                    "value_error",
                    "Value error, data_csv is for data_source inline",
                    Value::Null,
                ));
            }
        }
        Some("inline") => {
            match m.get("data_csv").and_then(Value::as_str) {
                Some(csv) => {
                    let first = csv.lines().next().unwrap_or("");
                    if !(first == "timestamp" || first.starts_with("timestamp,")) {
                        errs.push(verr(
                            &["data_csv"],
                            "value_error",
                            "Value error, data_csv must be CSV text whose header starts with timestamp",
                            json!(csv.chars().take(80).collect::<String>()),
                        ));
                    }
                }
                None => errs.push(verr(
                    &["data_csv"],
                    "value_error",
                    "Value error, data_source inline needs data_csv (a string)",
                    m.get("data_csv").cloned().unwrap_or(Value::Null),
                )),
            }
            if m.get("data_uris")
                .and_then(Value::as_array)
                .is_some_and(|a| !a.is_empty())
            {
                errs.push(verr(
                    &["data_uris"],
                    "value_error",
                    "Value error, data_uris is for data_source s3",
                    Value::Null,
                ));
            }
        }
        _ => errs.push(verr(
            &["data_source"],
            "enum",
            "Input should be 's3' or 'inline'",
            m.get("data_source").cloned().unwrap_or(Value::Null),
        )),
    }
    errs
}

fn validate_finish(m: &Map<String, Value>, run_prefix: &str) -> Vec<Value> {
    let mut errs = Vec::new();
    for (k, v) in m {
        if !FINISH_KEYS.contains(&k.as_str()) {
            errs.push(verr(
                &[k],
                "extra_forbidden",
                "Extra inputs are not permitted",
                v.clone(),
            ));
        } else if v.is_null() {
            errs.push(verr(
                &[k],
                "null_value",
                "Null values are not accepted (drop the key)",
                Value::Null,
            ));
        }
    }
    match m.get("exit_code") {
        None => errs.push(verr(
            &["exit_code"],
            "missing",
            "Field required",
            Value::Null,
        )),
        Some(v) if v.as_i64().is_none() && !v.is_null() => errs.push(verr(
            &["exit_code"],
            "int_type",
            "Input should be a valid integer",
            v.clone(),
        )),
        _ => {}
    }
    match m.get("run_status") {
        None => errs.push(verr(
            &["run_status"],
            "missing",
            "Field required",
            Value::Null,
        )),
        Some(v) if !matches!(v.as_str(), Some("finished" | "failed")) && !v.is_null() => {
            errs.push(verr(
                &["run_status"],
                "enum",
                "Input should be 'finished' or 'failed'",
                v.clone(),
            ))
        }
        _ => {}
    }
    if let Some(v) = m.get("finished_at") {
        if v.as_str().is_some_and(|s| !is_iso8601(s)) || (!v.is_string() && !v.is_null()) {
            errs.push(verr(
                &["finished_at"],
                "datetime_parsing",
                "Input should be a valid datetime",
                v.clone(),
            ));
        }
    }
    errs.extend(validate_data(m, run_prefix));
    errs
}

/// Removes a top-level field, or a nested one named with dots (`a.b`).
fn remove_path(v: &mut Value, path: &str) {
    let mut parts: Vec<&str> = path.split('.').collect();
    let last = parts.pop().unwrap_or("");
    let mut cur = v;
    for p in parts {
        match cur.get_mut(p) {
            Some(x) => cur = x,
            None => return,
        }
    }
    if let Some(o) = cur.as_object_mut() {
        o.remove(last);
    }
}

enum Route {
    Register,
    Refresh(String),
    Finish(String),
    Other,
}

fn route(method: &str, path: &str) -> (Route, bool) {
    let path = path.split('?').next().unwrap_or("");
    let segs: Vec<&str> = path.trim_start_matches('/').split('/').collect();
    let (r, known) = match segs.as_slice() {
        ["runs"] => (Route::Register, true),
        ["runs", id, "refresh-credentials"] if !id.is_empty() => {
            (Route::Refresh(id.to_string()), true)
        }
        ["runs", id, "finish"] if !id.is_empty() => (Route::Finish(id.to_string()), true),
        _ => (Route::Other, false),
    };
    if method == "POST" {
        (r, known)
    } else {
        (Route::Other, known)
    }
}

/// What the mock records of every request: its kind, its connection and place in
/// it, and its head.
fn base_record(kind: &str, (conn, seq): (u64, u64), h: &Head) -> Map<String, Value> {
    let mut rec = Map::new();
    rec.insert("kind".into(), json!(kind));
    rec.insert("conn".into(), json!(conn));
    rec.insert("seq".into(), json!(seq));
    rec.insert("method".into(), json!(h.method));
    rec.insert("path".into(), json!(h.target));
    rec.insert("headers".into(), headers_json(h));
    rec
}

/// What the mock records of one API request: its connection and place in it, the
/// request as it came, the fault it got, when it arrived.
fn api_record(
    kind: &str,
    (conn, seq): (u64, u64),
    h: &Head,
    body: &[u8],
    action: &str,
    arrived: f64,
) -> Map<String, Value> {
    let mut rec = base_record(kind, (conn, seq), h);
    let parsed: Value = serde_json::from_slice(body).unwrap_or(Value::Null);
    rec.insert("body".into(), parsed);
    if !body.is_empty() && serde_json::from_slice::<Value>(body).is_err() {
        rec.insert(
            "body_text".into(),
            json!(String::from_utf8_lossy(&body[..body.len().min(4096)])),
        );
    }
    rec.insert("raw_len".into(), json!(body.len()));
    rec.insert("action".into(), json!(action));
    rec.insert("t".into(), json!(arrived));
    rec
}

/// The reply of an injected fault: `NNN` or `NNN:DETAIL`.
fn injected(st: &str) -> Reply {
    let (code, detail) = st.split_once(':').unwrap_or((st, ""));
    let code: u16 = code.parse().unwrap_or(500);
    let detail = if detail.is_empty() {
        format!("injected fault: {} {}", code, http::reason(code))
    } else {
        detail.to_string()
    };
    Reply::detail(code, &detail)
}

fn handle_api_conn(mock: Arc<Mock>, s: TcpStream) {
    let conn = mock
        .conns
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        + 1;
    let mut seq = 0u64;
    let mut c = Conn::new(s);
    loop {
        let h = match c.read_request() {
            Ok(Some(h)) => h,
            Err(e) if e.kind() == io::ErrorKind::InvalidData => {
                let body = br#"{"detail":"Bad Request"}"#;
                let _ = c.write(&response(400, "application/json", body, true, &[]));
                break;
            }
            _ => break,
        };
        seq += 1;
        let arrived = now();
        let body = match c.read_body(&h) {
            Ok((_, b)) => b,
            Err(_) => break,
        };
        let (method, path) = (h.method.clone(), h.target.clone());
        let close_after = h.closes();
        let (rt, known) = route(&method, &path);
        let kind = match rt {
            Route::Register => "register",
            Route::Refresh(_) => "refresh",
            Route::Finish(_) => "finish",
            Route::Other => "other",
        };
        let action = if kind == "other" {
            "ok".to_string()
        } else {
            mock.take_fault(kind)
        };
        let mut rec = api_record(kind, (conn, seq), &h, &body, &action, arrived);

        if let Some(ms) = action.strip_prefix("sleep:") {
            std::thread::sleep(Duration::from_millis(ms.parse().unwrap_or(0)));
        }
        if action == "close" {
            rec.insert("status".into(), Value::Null);
            mock.record(rec);
            c.close();
            return;
        }
        let reply = if let Some(st) = action.strip_prefix("status:") {
            injected(st)
        } else if kind == "other" {
            if known {
                Reply::detail(405, "Method Not Allowed")
            } else {
                Reply::detail(404, "Not Found")
            }
        } else {
            api_reply(&mock, &rt, &h, &body, &action)
        };
        rec.insert("status".into(), json!(reply.status));
        let body_bytes = reply
            .raw
            .clone()
            .unwrap_or_else(|| reply.body.to_string().into_bytes());
        if reply.status >= 300 || reply.raw.is_some() {
            rec.insert(
                "response".into(),
                json!(String::from_utf8_lossy(&body_bytes)),
            );
        } else {
            rec.insert("response".into(), reply.body.clone());
        }
        mock.record(rec);
        let out = response(
            reply.status,
            "application/json",
            &body_bytes,
            close_after,
            reply.extra_headers,
        );
        if c.write(&out).is_err() || close_after {
            break;
        }
    }
    c.close();
}

/// POST /runs: a run registered, with its prefix and credentials.
fn register_reply(mock: &Mock, h: &Head, body: &[u8], action: &str) -> Reply {
    let m = match json_object(h, body, true) {
        Ok(m) => m,
        Err(r) => return r,
    };
    let errs = validate_register(&m);
    if !errs.is_empty() {
        return unprocessable(errs);
    }
    let creds = match mock.issue() {
        Ok(c) => c,
        Err(e) => return Reply::detail(500, &e),
    };
    let run_id = {
        let mut st = mock.state.lock().expect("state");
        st.next_run += 1;
        let id = format!("run-{}", st.next_run);
        st.runs.insert(id.clone(), Run { finished: false });
        id
    };
    let prefix = if action == "bad_prefix" {
        "https://not-s3/x".to_string()
    } else {
        mock.run_prefix(&run_id)
    };
    Reply::json(
        200,
        json!({"run_id": run_id, "upload_uri_prefix": prefix, "upload_credentials": creds}),
    )
}

/// POST /runs/{id}/finish: the run finished once, as the API checks its body.
fn finish_reply(mock: &Mock, id: &str, h: &Head, body: &[u8]) -> Reply {
    match mock.state.lock().expect("state").runs.get(id) {
        None => return Reply::detail(404, "Run not found"),
        Some(r) if r.finished => return Reply::detail(409, "Run already finished"),
        Some(_) => {}
    }
    let m = match json_object(h, body, true) {
        Ok(m) => m,
        Err(r) => return r,
    };
    let errs = validate_finish(&m, &mock.run_prefix(id));
    if !errs.is_empty() {
        return unprocessable(errs);
    }
    {
        let mut st = mock.state.lock().expect("state");
        match st.runs.get_mut(id) {
            Some(r) if !r.finished => r.finished = true,
            _ => return Reply::detail(409, "Run already finished"),
        }
    }
    let source = m["data_source"].as_str().unwrap_or("");
    let (samples, objects) = if source == "inline" {
        let csv = m["data_csv"].as_str().unwrap_or("");
        (
            json!(csv.lines().skip(1).filter(|l| !l.trim().is_empty()).count()),
            json!(0),
        )
    } else {
        (
            Value::Null,
            json!(m["data_uris"].as_array().map_or(0, Vec::len)),
        )
    };
    Reply::json(
        200,
        json!({
            "run_id": id,
            "run_status": m["run_status"],
            "exit_code": m["exit_code"],
            "data_source": source,
            "objects": objects,
            "samples": samples,
        }),
    )
}

fn api_reply(mock: &Mock, rt: &Route, h: &Head, body: &[u8], action: &str) -> Reply {
    let want = format!("Bearer {}", mock.cfg.token);
    match h.header("authorization") {
        Some(a) if a == want => {}
        Some(_) => return Reply::detail(401, "Invalid token"),
        None => {
            let mut r = Reply::detail(401, "Not authenticated");
            r.extra_headers = &[("www-authenticate", "Bearer")];
            return r;
        }
    }
    let mut reply = match rt {
        Route::Register => register_reply(mock, h, body, action),
        Route::Refresh(id) => {
            match mock.state.lock().expect("state").runs.get(id) {
                None => return Reply::detail(404, "Run not found"),
                Some(r) if r.finished => return Reply::detail(409, "Run already finished"),
                Some(_) => {}
            }
            let m = match json_object(h, body, false) {
                Ok(m) => m,
                Err(r) => return r,
            };
            if let Some((k, v)) = m.iter().next() {
                return unprocessable(vec![verr(
                    &[k],
                    "extra_forbidden",
                    "Extra inputs are not permitted",
                    v.clone(),
                )]);
            }
            match mock.issue() {
                Ok(c) => Reply::json(200, json!({ "upload_credentials": c })),
                Err(e) => Reply::detail(500, &e),
            }
        }
        Route::Finish(id) => finish_reply(mock, id, h, body),
        Route::Other => Reply::detail(404, "Not Found"),
    };
    if action == "malformed" {
        reply.raw = Some(b"<html><body>502 Bad Gateway</body></html> {not json".to_vec());
    } else if let Some(f) = action.strip_prefix("missing:") {
        remove_path(&mut reply.body, f);
    }
    reply
}

// ---------------------------------------------------------------- the S3 relay

/// An S3 error body; `code_name` (e.g. ExpiredToken) or one usual for the status.
fn s3_error(code: u16, code_name: &str) -> Vec<u8> {
    let (c, msg) = match (code, code_name) {
        (_, "ExpiredToken") => ("ExpiredToken", "The provided token has expired."),
        (_, "InvalidToken") => (
            "InvalidToken",
            "The provided token is malformed or otherwise invalid.",
        ),
        (_, "AccessDenied") => ("AccessDenied", "Access Denied"),
        (_, "SignatureDoesNotMatch") => (
            "SignatureDoesNotMatch",
            "The request signature we calculated does not match the signature you provided.",
        ),
        (_, c) if !c.is_empty() => (c, "injected fault"),
        (500, _) => (
            "InternalError",
            "We encountered an internal error. Please try again.",
        ),
        (503, _) => ("SlowDown", "Please reduce your request rate."),
        (403, _) => ("AccessDenied", "Access Denied"),
        (400, _) => ("BadRequest", "Bad Request"),
        (404, _) => ("NoSuchKey", "The specified key does not exist."),
        _ => ("InjectedFault", "injected fault"),
    };
    format!(
        "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n<Error><Code>{c}</Code><Message>{msg}</Message><RequestId>MOCKFAULT</RequestId></Error>"
    )
    .into_bytes()
}

/// What the mock records of one S3 request before its answer.
fn s3_record(kind: &str, (conn, seq): (u64, u64), h: &Head, action: &str) -> Map<String, Value> {
    let mut rec = base_record(kind, (conn, seq), h);
    rec.insert("body".into(), Value::Null);
    rec.insert("action".into(), json!(action));
    rec.insert("t".into(), json!(now()));
    rec
}

/// Answers an S3 request with an injected fault (`NNN` or `NNN:S3CODE`) and
/// records it; true when the connection is to be closed.
fn s3_fault(
    mock: &Mock,
    c: &mut Conn,
    h: &Head,
    st: &str,
    expect: bool,
    mut rec: Map<String, Value>,
) -> bool {
    let (code, code_name) = st.split_once(':').unwrap_or((st, ""));
    let code: u16 = code.parse().unwrap_or(503);
    // Without the 100 the client sends no body: answer and close.
    let mut close = expect || h.closes();
    if !expect {
        match c.read_body(h) {
            Ok((b, _)) => {
                rec.insert("raw_len".into(), json!(b.len()));
            }
            Err(_) => close = true,
        }
    }
    rec.insert("status".into(), json!(code));
    let body = s3_error(code, code_name);
    rec.insert("response".into(), json!(String::from_utf8_lossy(&body)));
    mock.record(rec);
    let out = response(
        code,
        "application/xml",
        &body,
        close,
        &[("x-amz-request-id", "MOCKFAULT")],
    );
    c.write(&out).is_err() || close
}

fn handle_s3_conn(mock: Arc<Mock>, s: TcpStream) {
    let conn = mock
        .conns
        .fetch_add(1, std::sync::atomic::Ordering::Relaxed)
        + 1;
    let mut seq = 0u64;
    let mut c = Conn::new(s);
    while let Ok(Some(h)) = c.read_request() {
        seq += 1;
        let kind = if h.method == "PUT" {
            "s3_put"
        } else {
            "s3_other"
        };
        let action = if kind == "s3_put" {
            mock.take_fault(kind)
        } else {
            "ok".to_string()
        };
        let expect = h.has_token("expect", "100-continue");
        let mut rec = s3_record(kind, (conn, seq), &h, &action);

        if let Some(ms) = action.strip_prefix("sleep:") {
            std::thread::sleep(Duration::from_millis(ms.parse().unwrap_or(0)));
        }
        if action == "close" {
            if !expect {
                if let Ok((b, _)) = c.read_body(&h) {
                    rec.insert("raw_len".into(), json!(b.len()));
                }
            }
            rec.insert("status".into(), Value::Null);
            mock.record(rec);
            c.close();
            return;
        }
        if let Some(st) = action.strip_prefix("status:") {
            if s3_fault(&mock, &mut c, &h, st, expect, rec) {
                break;
            }
            continue;
        }
        if expect && c.write(b"HTTP/1.1 100 Continue\r\n\r\n").is_err() {
            break;
        }
        let body = match c.read_body(&h) {
            Ok((b, _)) => b,
            Err(_) => break,
        };
        rec.insert("raw_len".into(), json!(body.len()));
        let (status, resp, upstream_close) = match forward(&mock.cfg.upstream, &h, &body) {
            Ok(x) => x,
            Err(e) => {
                rec.insert("status".into(), json!(502));
                rec.insert("response".into(), json!(format!("upstream: {e}")));
                mock.record(rec);
                let out = response(502, "application/xml", &s3_error(502, ""), true, &[]);
                let _ = c.write(&out);
                break;
            }
        };
        rec.insert("status".into(), json!(status));
        if status >= 300 {
            let tail = &resp[..resp.len().min(4096)];
            rec.insert("response".into(), json!(String::from_utf8_lossy(tail)));
        }
        mock.record(rec);
        let close = upstream_close || h.closes();
        if c.write(&resp).is_err() || close {
            break;
        }
    }
    c.close();
}

/// Sends the request unchanged on a fresh connection; returns the status, the whole
/// response as received (head and body) and whether the client connection must close
/// after it (the upstream ended its body by closing, or said so).
fn forward(upstream: &str, h: &Head, body: &[u8]) -> io::Result<(u16, Vec<u8>, bool)> {
    let s = TcpStream::connect(upstream)?;
    let mut up = Conn::new(s);
    let mut req = h.raw.clone();
    req.extend_from_slice(body);
    up.write(&req)?;
    loop {
        let rh = up.read_response()?;
        if (100..200).contains(&rh.status) {
            // The client already got our own 100 Continue.
            continue;
        }
        // Werkzeug (moto) ends every answer with `Connection: close`; S3 keeps
        // connections open. The relay has its own upstream connection per request, so
        // it drops that header and keeps the client's connection alive (response
        // headers are not signed) unless the body is delimited by the close.
        let mut out = format!("HTTP/1.{} {} {}\r\n", rh.minor, rh.status, rh.reason);
        for (k, v) in &rh.headers {
            if !(k.eq_ignore_ascii_case("connection") && v.eq_ignore_ascii_case("close")) {
                out.push_str(&format!("{k}: {v}\r\n"));
            }
        }
        out.push_str("\r\n");
        let mut out = out.into_bytes();
        let mut close = false;
        if h.method == "HEAD" || rh.status == 204 || rh.status == 304 {
        } else if rh.has_token("transfer-encoding", "chunked") || rh.content_length()?.is_some() {
            out.extend_from_slice(&up.read_body(&rh)?.0);
        } else {
            out = rh.raw.clone();
            out.extend_from_slice(&up.read_to_close()?);
            close = true;
        }
        up.close();
        return Ok((rh.status, out, close));
    }
}

// ---------------------------------------------------------------- main

fn serve(l: TcpListener, mock: Arc<Mock>, handler: fn(Arc<Mock>, TcpStream)) {
    for s in l.incoming() {
        match s {
            Ok(s) => {
                let m = mock.clone();
                std::thread::spawn(move || handler(m, s));
            }
            Err(e) => eprintln!("mock-sentinel: accept: {e}"),
        }
    }
}

fn main() {
    let path = std::env::args().nth(1).unwrap_or_else(|| {
        eprintln!("usage: mock-sentinel CONFIG.json");
        std::process::exit(2);
    });
    let fail = |msg: String| -> ! {
        eprintln!("mock-sentinel: {msg}");
        std::process::exit(1);
    };
    let text = std::fs::read_to_string(&path).unwrap_or_else(|e| fail(format!("{path}: {e}")));
    let v: Value = serde_json::from_str(&text).unwrap_or_else(|e| fail(format!("{path}: {e}")));
    let (cfg, faults) = parse_config(&v).unwrap_or_else(|e| fail(e));
    let record = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(&cfg.record)
        .unwrap_or_else(|e| fail(format!("{}: {e}", cfg.record.display())));
    // Bind both before announcing either, so a reader of one file can use both.
    let api = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| fail(format!("bind: {e}")));
    let s3 = TcpListener::bind("127.0.0.1:0").unwrap_or_else(|e| fail(format!("bind: {e}")));
    let mock = Arc::new(Mock {
        state: Mutex::new(State {
            faults,
            issued: 0,
            next_run: 0,
            runs: HashMap::new(),
        }),
        record: Mutex::new(record),
        conns: std::sync::atomic::AtomicU64::new(0),
        cfg,
    });
    for (l, f) in [
        (&s3, &mock.cfg.s3_addr_file),
        (&api, &mock.cfg.api_addr_file),
    ] {
        let addr = l
            .local_addr()
            .unwrap_or_else(|e| fail(format!("local_addr: {e}")));
        let tmp = f.with_extension("tmp");
        if let Err(e) =
            std::fs::write(&tmp, addr.to_string()).and_then(|_| std::fs::rename(&tmp, f))
        {
            fail(format!("{}: {e}", f.display()));
        }
    }
    let m = mock.clone();
    let t = std::thread::spawn(move || serve(s3, m, handle_s3_conn));
    serve(api, mock, handle_api_conn);
    let _ = t.join();
}
