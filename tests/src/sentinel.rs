//! Helpers for the Sentinel streaming tests: a real S3-compatible server (moto in
//! its SigV4-enforcing mode, with temporary credentials from its STS AssumeRole) and
//! the mock Sentinel API with its S3 fault proxy (src/bin/mock_sentinel.rs).
//!
//! ```text
//! let Some(moto) = Moto::start("bkt", 2) else { return };   // SKIPPED outside CI
//! let mock = MockSentinel::start(&Scenario::new(&moto).fault("s3_put", &["status:503"]));
//! // run the tracker with SENTINEL_API_URL=mock.api_url(), S3 endpoint mock.s3_url()
//! let objects = moto.dump("bkt", "runs/");
//! let records = mock.records();
//! ```
//!
//! # Mock config (written by [`MockSentinel::start`])
//! `api_addr_file`, `s3_addr_file` (the mock writes `127.0.0.1:PORT` there),
//! `record` (JSON lines), `token`, `upstream_s3`, `bucket`, `prefix`, `region`
//! (null: no `region` in upload_credentials), `credentials` (`[{access_key,
//! secret_key, session_token}]`), `issue` (see [`Issue`]; the k-th credential
//! issuance, register first then each refresh, uses `issue[k]`, the last repeating),
//! `faults` (`{register, refresh, finish, s3_put}`: lists of actions, one consumed per
//! request of that kind, then "ok"): `ok`; `status:NNN` (API: `{"detail": "..."}`;
//! S3: an XML `<Error>` with a code usual for NNN, 503 → SlowDown, 500 →
//! InternalError, 403 → AccessDenied), `status:NNN:TEXT` (API: TEXT as the detail;
//! S3: TEXT as the error code, e.g. `status:400:ExpiredToken`); `sleep:MS` (then as
//! `ok`; for S3 the PUT is still forwarded after the sleep, so it lands in moto even
//! when the client gave up); `close` (the connection is dropped unanswered; for S3
//! after reading the body unless the client waits for `100 Continue`); `malformed`
//! (API only: 200 with a body that is not JSON); `missing:FIELD` (API only; `a.b` for
//! a nested field); `bad_prefix` (register only). Malformed/missing/bad_prefix replies
//! are made after the request was processed as for `ok` (the run exists, the issuance
//! is used). A fault is taken before the token and the body are checked.
//!
//! The S3 relay forwards each request unchanged on a fresh upstream connection and
//! the answer unchanged except for moto's `Connection: close` header, which it drops
//! so that the client's connection stays open as with S3. It answers `Expect:
//! 100-continue` itself (boto3 sends it; aws-sdk-rust does not).
//!
//! # Recorded lines ([`MockSentinel::records`])
//! `{"t": arrival (unix secs), "answered": unix secs, "kind": register|refresh|finish|
//! s3_put|s3_other|other, "conn": connection number (1.., both listeners), "seq":
//! request number within the connection (1..), "method", "path", "headers":
//! {lowercase name: value, repeats joined with ", "}, "body": parsed JSON or null
//! (always null for S3), "body_text": the body when not JSON (API only), "raw_len":
//! body bytes as received (chunk framing included), "status": answered status, or null
//! for `close`, "action": the fault action used, "response": the answer's body (JSON
//! for 2xx API answers, text otherwise; for S3 only when status >= 300)}`.
//! For S3 the status is the upstream's (moto's), or the injected one.

use std::{
    io::{Read, Write},
    net::TcpStream,
    path::{Path, PathBuf},
    process::{Command, Stdio},
    time::{Duration, Instant},
};

use serde_json::{json, Value};

use crate::{
    e2e::{require, Bg},
    free_port, Scratch,
};

/// The workspace root (the tests crate's parent).
pub fn repo_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("tests crate has a parent")
        .to_path_buf()
}

/// target/moto, the venv scripts/setup.sh makes.
pub fn moto_venv() -> PathBuf {
    repo_root().join("target/moto")
}

/// The venv's python (runs tests/fixtures/moto_ctl.py).
pub fn moto_python() -> PathBuf {
    moto_venv().join("bin/python")
}

/// tests/fixtures/moto_ctl.py.
pub fn moto_ctl_script() -> PathBuf {
    repo_root().join("tests/fixtures/moto_ctl.py")
}

/// True when the moto venv is installed. Otherwise fails under CI and prints
/// SKIPPED (the caller then returns), like [`crate::e2e::require`].
pub fn moto_available() -> bool {
    let ok = moto_venv().join("bin/moto_server").is_file()
        && moto_python().is_file()
        && moto_venv().join(".installed").is_file();
    require(
        ok,
        &format!(
            "{} is missing: run `bash scripts/setup.sh`",
            moto_venv().display()
        ),
    )
}

/// The mock-sentinel binary built next to the running test.
pub fn mock_sentinel_bin() -> PathBuf {
    let p = crate::bin_dir().join("mock-sentinel");
    assert!(
        p.exists(),
        "{} is missing: run `cargo build -p tracker-tests` first",
        p.display()
    );
    p
}

/// Temporary credentials from moto's STS AssumeRole (role "uploader": PutObject,
/// GetObject, ListBucket, GetBucketLocation on the bucket only).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Creds {
    pub access_key: String,
    pub secret_key: String,
    pub session_token: String,
}

impl Creds {
    fn from_json(v: &Value) -> Creds {
        let s = |k: &str| {
            v[k].as_str()
                .unwrap_or_else(|| panic!("no {k} in {v}"))
                .to_string()
        };
        Creds {
            access_key: s("access_key"),
            secret_key: s("secret_key"),
            session_token: s("session_token"),
        }
    }

    pub fn to_json(&self) -> Value {
        json!({
            "access_key": self.access_key,
            "secret_key": self.secret_key,
            "session_token": self.session_token,
        })
    }

    /// The same credentials with a session token STS never issued.
    pub fn with_bad_token(&self) -> Creds {
        let mut c = self.clone();
        let keep = c.session_token.len().saturating_sub(8);
        c.session_token = format!("{}AAAABBBB", &c.session_token[..keep]);
        c
    }
}

/// The IAM user "admin" (policy: everything), for setup and for reading back.
#[derive(Clone, Debug)]
pub struct AdminKeys {
    pub access_key: String,
    pub secret_key: String,
}

/// One object read back from moto by [`Moto::dump`].
#[derive(Clone, Debug)]
pub struct S3Object {
    pub key: String,
    pub size: u64,
    pub content_encoding: Option<String>,
    pub content_type: Option<String>,
    /// The gunzipped content, or why it is not gzip text.
    pub text: Result<String, String>,
}

/// What `moto_ctl.py put` answered for one key.
#[derive(Clone, Debug)]
pub struct PutResult {
    pub key: String,
    pub ok: bool,
    /// HTTP status; None when no answer came (dropped connection, timeout).
    pub status: Option<u16>,
    /// S3 error code (`InvalidToken`, `SignatureDoesNotMatch`, …) or the botocore
    /// exception name when there was no answer.
    pub code: Option<String>,
}

/// How `moto_ctl.py put` sends a body.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PutMode {
    /// boto3 `put_object` (Content-Length body, payload hash signed).
    Sdk,
    /// Signed by hand, `Transfer-Encoding: chunked`, UNSIGNED-PAYLOAD.
    Chunked,
    /// Signed by hand, `Content-Encoding: aws-chunked`,
    /// STREAMING-UNSIGNED-PAYLOAD-TRAILER with a CRC32 trailer, Content-Length.
    AwsChunked,
}

impl PutMode {
    fn arg(self) -> &'static str {
        match self {
            PutMode::Sdk => "sdk",
            PutMode::Chunked => "chunked",
            PutMode::AwsChunked => "aws-chunked",
        }
    }
}

/// Removes what would send moto_ctl's or moto's requests elsewhere (AWS profile or
/// endpoint variables, HTTP proxies) from a command's environment.
fn isolate(cmd: &mut Command) -> &mut Command {
    for (k, _) in std::env::vars_os() {
        let k = k.to_string_lossy().into_owned();
        let lk = k.to_ascii_lowercase();
        if k.starts_with("AWS_") || lk.ends_with("_proxy") {
            cmd.env_remove(&k);
        }
    }
    cmd.env("AWS_CONFIG_FILE", "/dev/null")
        .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .env("NO_PROXY", "127.0.0.1,localhost")
        .env("PYTHONDONTWRITEBYTECODE", "1")
}

/// Runs `moto_ctl.py ARGS`; its stdout as JSON, or stderr as the error.
pub fn moto_ctl(args: &[&str]) -> Result<Value, String> {
    let mut cmd = Command::new(moto_python());
    cmd.arg(moto_ctl_script()).args(args).stdin(Stdio::null());
    isolate(&mut cmd);
    let o = cmd
        .output()
        .map_err(|e| format!("cannot run {}: {e}", moto_python().display()))?;
    let out = String::from_utf8_lossy(&o.stdout);
    let err = String::from_utf8_lossy(&o.stderr);
    if !o.status.success() {
        return Err(format!("moto_ctl {args:?}: {}\n{err}", o.status));
    }
    serde_json::from_str(out.trim()).map_err(|e| format!("moto_ctl {args:?}: {e}: {out}\n{err}"))
}

/// A moto server on 127.0.0.1 (S3, IAM, STS; SigV4 and IAM policies enforced after
/// `moto_ctl.py setup`), killed on drop.
pub struct Moto {
    bg: Bg,
    port: u16,
    pub bucket: String,
    pub region: String,
    pub admin: AdminKeys,
    /// `count` sets of temporary credentials from STS AssumeRole, distinct.
    pub credentials: Vec<Creds>,
    dir: Scratch,
}

impl Moto {
    /// Starts moto, creates `bucket` (us-east-1), the admin user, the upload role and
    /// `count` temporary credentials, and checks that moto enforces auth. None (after
    /// SKIPPED) when the venv is missing outside CI.
    pub fn start(bucket: &str, count: usize) -> Option<Moto> {
        Moto::start_in(bucket, count, "us-east-1")
    }

    /// As [`Moto::start`], with the bucket created in `region` and every setup request
    /// signed for it.
    pub fn start_in(bucket: &str, count: usize, region: &str) -> Option<Moto> {
        if !moto_available() {
            return None;
        }
        let k = moto_ctl(&["setup-actions"]).unwrap_or_else(|e| panic!("{e}"));
        let k = k
            .as_u64()
            .unwrap_or_else(|| panic!("setup-actions said {k}"));
        let dir = Scratch::new("moto");
        let mut last = String::new();
        // A free port is picked and released before moto binds it: retry on a race.
        for attempt in 0..3 {
            let port = free_port();
            let log = dir.path(&format!("moto-{attempt}.log"));
            let mut cmd = Command::new(moto_venv().join("bin/moto_server"));
            cmd.args(["-H", "127.0.0.1", "-p", &port.to_string()])
                .env("INITIAL_NO_AUTH_ACTION_COUNT", k.to_string())
                .current_dir(&dir.0)
                .stdin(Stdio::null())
                .stdout(std::fs::File::create(&log).expect("moto log"))
                .stderr(
                    std::fs::File::create(dir.path(&format!("moto-{attempt}.err")))
                        .expect("moto log"),
                );
            isolate(&mut cmd);
            let mut bg = Bg::spawn(&mut cmd, "moto_server");
            match wait_listening(&mut bg, port, Duration::from_secs(30)) {
                Ok(()) => {
                    let endpoint = format!("http://127.0.0.1:{port}");
                    let v = moto_ctl(&[
                        "setup",
                        "--endpoint",
                        &endpoint,
                        "--bucket",
                        bucket,
                        "--count",
                        &count.to_string(),
                        "--region",
                        region,
                    ])
                    .unwrap_or_else(|e| panic!("{e}\nmoto log:\n{}", read_logs(&dir)));
                    let admin = AdminKeys {
                        access_key: v["admin"]["access_key"].as_str().expect("admin key").into(),
                        secret_key: v["admin"]["secret_key"]
                            .as_str()
                            .expect("admin secret")
                            .into(),
                    };
                    let credentials = v["credentials"]
                        .as_array()
                        .expect("credentials")
                        .iter()
                        .map(Creds::from_json)
                        .collect();
                    return Some(Moto {
                        bg,
                        port,
                        bucket: bucket.to_string(),
                        region: region.to_string(),
                        admin,
                        credentials,
                        dir,
                    });
                }
                Err(e) => last = e,
            }
        }
        panic!("moto_server did not start: {last}\n{}", read_logs(&dir));
    }

    /// `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://127.0.0.1:{}", self.port)
    }

    pub fn pid(&self) -> i32 {
        self.bg.pid()
    }

    /// moto's request log so far (stdout and stderr of the server).
    pub fn log(&self) -> String {
        read_logs(&self.dir)
    }

    /// Every object under `prefix` in `bucket`, sorted by key, read with the admin's
    /// keys straight from moto.
    pub fn dump(&self, bucket: &str, prefix: &str) -> Vec<S3Object> {
        let v = moto_ctl(&[
            "dump",
            "--endpoint",
            &self.endpoint(),
            "--bucket",
            bucket,
            "--access-key",
            &self.admin.access_key,
            "--secret-key",
            &self.admin.secret_key,
            "--prefix",
            prefix,
            "--region",
            &self.region,
        ])
        .unwrap_or_else(|e| panic!("{e}"));
        v.as_array()
            .expect("dump is a list")
            .iter()
            .map(|o| S3Object {
                key: o["key"].as_str().expect("key").to_string(),
                size: o["size"].as_u64().expect("size"),
                content_encoding: o["content_encoding"].as_str().map(str::to_string),
                content_type: o["content_type"].as_str().map(str::to_string),
                text: match o["text"].as_str() {
                    Some(t) => Ok(t.to_string()),
                    None => Err(o["error"].as_str().unwrap_or("no text").to_string()),
                },
            })
            .collect()
    }

    /// `moto_ctl.py CMD` arguments for a request to this moto's bucket through
    /// `endpoint`, signed with `creds`.
    fn ctl_args<'a>(&'a self, cmd: &'a str, endpoint: &'a str, creds: &'a Creds) -> Vec<&'a str> {
        vec![
            cmd,
            "--endpoint",
            endpoint,
            "--bucket",
            &self.bucket,
            "--access-key",
            &creds.access_key,
            "--secret-key",
            &creds.secret_key,
            "--session-token",
            &creds.session_token,
            "--region",
            &self.region,
        ]
    }

    /// PUTs `body` (gzip-compressed when `gzip`, then with Content-Encoding gzip and
    /// Content-Type text/csv) to each key of this moto's bucket through `endpoint`
    /// (moto itself or a proxy), with one client, so several keys share a connection.
    pub fn put(
        &self,
        endpoint: &str,
        keys: &[&str],
        creds: &Creds,
        body: &str,
        gzip: bool,
        mode: PutMode,
    ) -> Vec<PutResult> {
        let mut args = self.ctl_args("put", endpoint, creds);
        args.extend(["--body", body, "--mode", mode.arg()]);
        if gzip {
            args.push("--gzip");
        }
        for k in keys {
            args.push("--key");
            args.push(k);
        }
        let v = moto_ctl(&args).unwrap_or_else(|e| panic!("{e}"));
        v["results"]
            .as_array()
            .expect("results")
            .iter()
            .map(|r| PutResult {
                key: r["key"].as_str().expect("key").to_string(),
                ok: r["ok"].as_bool().expect("ok"),
                status: r["status"].as_u64().map(|s| s as u16),
                code: r["code"].as_str().map(str::to_string),
            })
            .collect()
    }

    /// HEAD on this moto's bucket through `endpoint` with `creds`: (status, the
    /// `x-amz-bucket-region` header). moto sends the header only with a 200.
    pub fn head_bucket(&self, endpoint: &str, creds: &Creds) -> (Option<u16>, Option<String>) {
        let v = moto_ctl(&self.ctl_args("head-bucket", endpoint, creds))
            .unwrap_or_else(|e| panic!("{e}"));
        (
            v["status"].as_u64().map(|s| s as u16),
            v["region"].as_str().map(str::to_string),
        )
    }

    /// `moto_ctl.py check-auth` with `creds`: Err unless moto rejects a missing
    /// signature, an unknown key, a wrong secret, a wrong or missing session token and
    /// a request outside the role's policy, and accepts `creds`. Ok: the statuses and
    /// codes it saw (`{"no_credentials": [500, "500"], "wrong_session_token": [400,
    /// "InvalidToken"], …}`).
    pub fn check_auth(&self, creds: &Creds) -> Result<Value, String> {
        let endpoint = self.endpoint();
        let mut args = self.ctl_args("check-auth", &endpoint, creds);
        args.extend([
            "--admin-access-key",
            &self.admin.access_key,
            "--admin-secret-key",
            &self.admin.secret_key,
        ]);
        moto_ctl(&args).map(|v| v["results"].clone())
    }
}

fn read_logs(dir: &Scratch) -> String {
    let mut names: Vec<PathBuf> = std::fs::read_dir(&dir.0)
        .map(|d| d.flatten().map(|e| e.path()).collect())
        .unwrap_or_default();
    names.sort();
    names
        .iter()
        .filter(|p| p.extension().is_some_and(|e| e == "log" || e == "err"))
        .map(|p| std::fs::read_to_string(p).unwrap_or_default())
        .collect::<Vec<_>>()
        .join("\n")
}

fn wait_listening(bg: &mut Bg, port: u16, limit: Duration) -> Result<(), String> {
    let t0 = Instant::now();
    loop {
        if let Some(st) = bg.child.try_wait().expect("try_wait") {
            return Err(format!("moto_server exited: {st}"));
        }
        if TcpStream::connect(("127.0.0.1", port)).is_ok() {
            return Ok(());
        }
        if t0.elapsed() > limit {
            return Err(format!("port {port} not listening after {limit:?}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
}

// ---------------------------------------------------------------- the mock

/// One credential issuance of the mock (register is the first, each refresh the next).
#[derive(Clone, Debug)]
pub struct Issue {
    /// Index into the scenario's credentials.
    pub cred: usize,
    /// Seconds from the issuance to the expiry it states (may be ≤ 0).
    pub expires_in: f64,
    /// "expires_at" (the Python client's code) or "expiration" (its docstring).
    pub expiry_key: String,
    /// "z" (`…:05Z`), "offset" (`…:05+00:00`) or "fraction" (`…:05.123456Z`).
    pub expiry_style: String,
    /// Send a session token STS never issued (moto answers 400 InvalidToken).
    pub corrupt_token: bool,
    /// Fields of upload_credentials to leave out.
    pub omit: Vec<String>,
    /// Sent verbatim as the expiry instead of a computed one.
    pub expiry_raw: Option<Value>,
}

impl Default for Issue {
    fn default() -> Issue {
        Issue {
            cred: 0,
            expires_in: 3600.0,
            expiry_key: "expires_at".into(),
            expiry_style: "z".into(),
            corrupt_token: false,
            omit: Vec::new(),
            expiry_raw: None,
        }
    }
}

impl Issue {
    /// Credentials `cred`, expiring in `expires_in` seconds, otherwise the defaults.
    pub fn cred(cred: usize, expires_in: f64) -> Issue {
        Issue {
            cred,
            expires_in,
            ..Issue::default()
        }
    }

    pub fn to_json(&self) -> Value {
        json!({
            "cred": self.cred,
            "expires_in": self.expires_in,
            "expiry_key": self.expiry_key,
            "expiry_style": self.expiry_style,
            "corrupt_token": self.corrupt_token,
            "omit": self.omit,
            "expiry_raw": self.expiry_raw,
        })
    }

    /// What [`Issue::to_json`] wrote, as the mock reads it: absent fields are the
    /// defaults.
    pub fn from_json(v: &Value) -> Issue {
        let d = Issue::default();
        let s = |k: &str, d: String| v[k].as_str().map_or(d, str::to_string);
        Issue {
            cred: v["cred"].as_u64().map_or(d.cred, |c| c as usize),
            expires_in: v["expires_in"].as_f64().unwrap_or(d.expires_in),
            expiry_key: s("expiry_key", d.expiry_key),
            expiry_style: s("expiry_style", d.expiry_style),
            corrupt_token: v["corrupt_token"].as_bool().unwrap_or(d.corrupt_token),
            omit: v["omit"]
                .as_array()
                .map(|a| {
                    a.iter()
                        .filter_map(|x| Some(x.as_str()?.to_string()))
                        .collect()
                })
                .unwrap_or(d.omit),
            expiry_raw: Some(v["expiry_raw"].clone()).filter(|x| !x.is_null()),
        }
    }
}

/// What the mock is to do. [`Scenario::new`] takes moto's bucket, endpoint and
/// credentials; [`Scenario::offline`] needs no moto (API tests; S3 relays fail).
#[derive(Clone, Debug)]
pub struct Scenario {
    pub token: String,
    pub upstream_s3: String,
    pub bucket: String,
    pub prefix: String,
    pub region: Option<String>,
    pub credentials: Vec<Creds>,
    /// Empty: one default [`Issue`].
    pub issue: Vec<Issue>,
    /// (kind, actions): kind is register, refresh, finish or s3_put.
    pub faults: Vec<(String, Vec<String>)>,
}

/// The bearer token a default scenario expects.
pub const TOKEN: &str = "secret-token";

impl Scenario {
    /// Upstream, bucket and credentials from `moto`; token [`TOKEN`], prefix "runs",
    /// region "us-east-1" in upload_credentials, no faults.
    pub fn new(moto: &Moto) -> Scenario {
        Scenario {
            token: TOKEN.to_string(),
            upstream_s3: moto.endpoint(),
            bucket: moto.bucket.clone(),
            prefix: "runs".to_string(),
            region: Some(moto.region.clone()),
            credentials: moto.credentials.clone(),
            issue: Vec::new(),
            faults: Vec::new(),
        }
    }

    /// No moto: made-up credentials, an upstream that refuses connections.
    pub fn offline() -> Scenario {
        let creds = (0..3)
            .map(|i| Creds {
                access_key: format!("ASIAOFFLINE00000000{i}"),
                secret_key: format!("offline-secret-{i}"),
                session_token: format!("offline-session-token-{i}"),
            })
            .collect();
        Scenario {
            token: TOKEN.to_string(),
            upstream_s3: format!("http://127.0.0.1:{}", free_port()),
            bucket: "offline-bucket".to_string(),
            prefix: "runs".to_string(),
            region: Some("us-east-1".to_string()),
            credentials: creds,
            issue: Vec::new(),
            faults: Vec::new(),
        }
    }

    pub fn token(mut self, t: &str) -> Scenario {
        self.token = t.to_string();
        self
    }

    pub fn prefix(mut self, p: &str) -> Scenario {
        self.prefix = p.to_string();
        self
    }

    pub fn region(mut self, r: Option<&str>) -> Scenario {
        self.region = r.map(str::to_string);
        self
    }

    /// Appends one issuance.
    pub fn issue(mut self, i: Issue) -> Scenario {
        self.issue.push(i);
        self
    }

    /// Sets the fault list of `kind` (register, refresh, finish, s3_put).
    pub fn fault(mut self, kind: &str, actions: &[&str]) -> Scenario {
        assert!(
            ["register", "refresh", "finish", "s3_put"].contains(&kind),
            "unknown fault kind {kind}"
        );
        self.faults.retain(|(k, _)| k != kind);
        self.faults.push((
            kind.to_string(),
            actions.iter().map(|s| s.to_string()).collect(),
        ));
        self
    }

    /// The config file's content, given its three paths.
    pub fn config(&self, api_addr_file: &Path, s3_addr_file: &Path, record: &Path) -> Value {
        let mut faults = serde_json::Map::new();
        for (k, v) in &self.faults {
            faults.insert(k.clone(), json!(v));
        }
        json!({
            "api_addr_file": api_addr_file,
            "s3_addr_file": s3_addr_file,
            "record": record,
            "token": self.token,
            "upstream_s3": self.upstream_s3,
            "bucket": self.bucket,
            "prefix": self.prefix,
            "region": self.region,
            "credentials": self.credentials.iter().map(Creds::to_json).collect::<Vec<_>>(),
            "issue": self.issue.iter().map(Issue::to_json).collect::<Vec<_>>(),
            "faults": faults,
        })
    }
}

/// The mock Sentinel API and its S3 fault proxy, killed on drop.
pub struct MockSentinel {
    bg: Bg,
    api: String,
    s3: String,
    record: PathBuf,
    pub scenario: Scenario,
    dir: Scratch,
}

impl MockSentinel {
    /// Starts target/<profile>/mock-sentinel (next to the running test).
    pub fn start(sc: &Scenario) -> MockSentinel {
        MockSentinel::start_bin(&mock_sentinel_bin(), sc)
    }

    /// Starts the mock binary at `bin` (e.g. `env!("CARGO_BIN_EXE_mock-sentinel")`).
    pub fn start_bin(bin: &Path, sc: &Scenario) -> MockSentinel {
        let dir = Scratch::new("mock-sentinel");
        let (api_f, s3_f, record) = (
            dir.path("api.addr"),
            dir.path("s3.addr"),
            dir.path("record.jsonl"),
        );
        let cfg = dir.path("config.json");
        std::fs::write(&cfg, sc.config(&api_f, &s3_f, &record).to_string()).expect("write config");
        let err = dir.path("stderr");
        let mut bg = Bg::spawn(
            Command::new(bin)
                .arg(&cfg)
                .stdin(Stdio::null())
                .stdout(Stdio::null())
                .stderr(std::fs::File::create(&err).expect("stderr file")),
            "mock-sentinel",
        );
        let mut addr = |f: &Path| {
            bg.wait_addr_file(f).unwrap_or_else(|st| {
                panic!(
                    "mock-sentinel exited ({st}): {}",
                    std::fs::read_to_string(&err).unwrap_or_default()
                )
            })
        };
        let (api, s3) = (addr(&api_f), addr(&s3_f));
        MockSentinel {
            api,
            s3,
            bg,
            record,
            scenario: sc.clone(),
            dir,
        }
    }

    /// `http://127.0.0.1:PORT` of the API (SENTINEL_API_URL).
    pub fn api_url(&self) -> String {
        format!("http://{}", self.api)
    }

    /// `http://127.0.0.1:PORT` of the S3 proxy (the S3 endpoint for the client).
    pub fn s3_url(&self) -> String {
        format!("http://{}", self.s3)
    }

    /// `127.0.0.1:PORT` of the API.
    pub fn api_addr(&self) -> &str {
        &self.api
    }

    /// `127.0.0.1:PORT` of the S3 proxy.
    pub fn s3_addr(&self) -> &str {
        &self.s3
    }

    pub fn pid(&self) -> i32 {
        self.bg.pid()
    }

    /// The mock's stderr so far.
    pub fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.path("stderr")).unwrap_or_default()
    }

    /// Every recorded request so far, in the order answered.
    pub fn records(&self) -> Vec<Value> {
        std::fs::read_to_string(&self.record)
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("record line {l}: {e}")))
            .collect()
    }

    /// The records of one kind (register, refresh, finish, s3_put, s3_other, other).
    pub fn records_of(&self, kind: &str) -> Vec<Value> {
        self.records()
            .into_iter()
            .filter(|r| r["kind"] == kind)
            .collect()
    }

    /// Waits until at least `n` records of `kind` exist; returns them.
    pub fn wait_records(&self, kind: &str, n: usize, limit: Duration) -> Vec<Value> {
        let t0 = Instant::now();
        loop {
            let r = self.records_of(kind);
            if r.len() >= n {
                return r;
            }
            assert!(
                t0.elapsed() < limit,
                "{} {kind} records, wanted {n} within {limit:?}: {:#?}",
                r.len(),
                self.records()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// POST `body` (JSON) to the API with the scenario's token.
    pub fn post(&self, path: &str, body: &Value) -> HttpResponse {
        let auth = format!("Bearer {}", self.scenario.token);
        http_request(
            &self.api,
            "POST",
            path,
            &[
                ("Authorization", auth.as_str()),
                ("Content-Type", "application/json"),
                ("Accept", "application/json"),
            ],
            body.to_string().as_bytes(),
        )
    }
}

// ---------------------------------------------------------------- a small HTTP client

/// An HTTP answer.
#[derive(Clone, Debug)]
pub struct HttpResponse {
    /// 0 when the connection ended without an answer.
    pub status: u16,
    /// Lowercase names.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl HttpResponse {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON; panics with the text when it is not.
    pub fn json(&self) -> Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("status {}: not JSON ({e}): {}", self.status, self.text()))
    }
}

/// One request on a fresh connection (`Connection: close`, Content-Length body, 30 s
/// timeout). The answer is read to EOF; status 0 when none came.
pub fn http_request(
    addr: &str,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> HttpResponse {
    let mut s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let mut req = format!("{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n");
    for (k, v) in headers {
        req.push_str(&format!("{k}: {v}\r\n"));
    }
    req.push_str(&format!("Content-Length: {}\r\n\r\n", body.len()));
    let mut bytes = req.into_bytes();
    bytes.extend_from_slice(body);
    s.write_all(&bytes).expect("send request");
    let mut raw = Vec::new();
    let _ = s.read_to_end(&mut raw);
    parse_response(&raw)
}

fn parse_response(raw: &[u8]) -> HttpResponse {
    let mut hs = [httparse::EMPTY_HEADER; 64];
    let mut r = httparse::Response::new(&mut hs);
    let Ok(httparse::Status::Complete(end)) = r.parse(raw) else {
        return HttpResponse {
            status: 0,
            headers: Vec::new(),
            body: raw.to_vec(),
        };
    };
    let headers: Vec<(String, String)> = r
        .headers
        .iter()
        .map(|h| {
            let v = String::from_utf8_lossy(h.value).trim().to_string();
            (h.name.to_ascii_lowercase(), v)
        })
        .collect();
    let mut resp = HttpResponse {
        status: r.code.unwrap_or(0),
        headers,
        body: raw[end..].to_vec(),
    };
    if let Some(n) = resp.header("content-length").and_then(|v| v.parse().ok()) {
        resp.body.truncate(n);
    }
    resp
}

/// Unix seconds of an ISO-8601 date-time with a zone (`Z`, `+00:00`, `-05:30`,
/// fractional seconds allowed); None when it is not one.
pub fn parse_iso8601(s: &str) -> Option<f64> {
    let t = time::OffsetDateTime::parse(s, &time::format_description::well_known::Rfc3339).ok()?;
    Some(t.unix_timestamp() as f64 + f64::from(t.nanosecond()) / 1e9)
}
