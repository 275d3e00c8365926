//! The Sentinel HTTP API: register, refresh credentials, finish
//! (docs/streaming.md, ../shared/docs/sentinel-protocol.md).

use std::time::{Duration, SystemTime};

use aws_sdk_s3::primitives::{DateTime, DateTimeFormat};
use serde_json::{Map, Value};

use super::config::Secret;

/// Why a call failed; callers branch on it (retry, refresh, give up).
#[derive(Debug)]
pub enum ApiError {
    /// No answer: connection refused, reset, timed out.
    Transport(String),
    /// No answer in time: the server may still have acted on the request.
    TimedOut(String),
    /// A non-2xx answer.
    Status { status: u16, body: String },
    /// A 2xx answer the client cannot use.
    Answer(String),
}

impl ApiError {
    /// Worth another try later: no answer, 5xx, 408, 429.
    pub fn retryable(&self) -> bool {
        match self {
            ApiError::Transport(_) | ApiError::TimedOut(_) => true,
            ApiError::Status { status, .. } => *status >= 500 || *status == 408 || *status == 429,
            ApiError::Answer(_) => false,
        }
    }
}

impl std::fmt::Display for ApiError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ApiError::Transport(e) | ApiError::TimedOut(e) => write!(f, "{e}"),
            ApiError::Status { status, body } => write!(f, "HTTP {status}: {body}"),
            ApiError::Answer(e) => write!(f, "{e}"),
        }
    }
}

/// Temporary upload credentials.
#[derive(Clone)]
pub struct Credentials {
    pub access_key: String,
    pub secret_key: String,
    pub session_token: String,
    pub expires_at: SystemTime,
    pub region: Option<String>,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("access_key", &self.access_key)
            .field("expires_at", &self.expires_at)
            .field("region", &self.region)
            .finish_non_exhaustive()
    }
}

/// `s3://bucket/prefix` split up.
#[derive(Clone, Debug, PartialEq)]
pub struct S3Prefix {
    pub bucket: String,
    /// Key prefix without leading or trailing `/` (may be empty).
    pub key: String,
}

impl S3Prefix {
    pub fn parse(s: &str) -> Result<S3Prefix, String> {
        let rest = s
            .strip_prefix("s3://")
            .ok_or_else(|| format!("upload_uri_prefix '{s}' does not start with s3://"))?;
        let (bucket, key) = rest.split_once('/').unwrap_or((rest, ""));
        if bucket.is_empty() || bucket.contains(char::is_whitespace) {
            return Err(format!("upload_uri_prefix '{s}' has no bucket name"));
        }
        Ok(S3Prefix {
            bucket: bucket.to_string(),
            key: key.trim_matches('/').to_string(),
        })
    }

    /// Object key of batch `seq` (the Python client's naming: 4 digits from 1).
    pub fn object_key(&self, seq: u32) -> String {
        if self.key.is_empty() {
            format!("{seq:04}.csv.gz")
        } else {
            format!("{}/{seq:04}.csv.gz", self.key)
        }
    }

    pub fn uri(&self, key: &str) -> String {
        format!("s3://{}/{key}", self.bucket)
    }
}

#[derive(Debug)]
pub struct Registration {
    pub run_id: String,
    pub prefix: S3Prefix,
    pub credentials: Credentials,
}

fn string_field(obj: &Map<String, Value>, key: &str, what: &str) -> Result<String, String> {
    match obj.get(key) {
        Some(Value::String(s)) if !s.is_empty() => Ok(s.clone()),
        Some(Value::String(_)) => Err(format!("{what}: `{key}` is empty")),
        Some(other) => Err(format!(
            "{what}: `{key}` is not a string but {}",
            kind(other)
        )),
        None => Err(format!("{what}: `{key}` is missing")),
    }
}

fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "an array",
        Value::Object(_) => "an object",
    }
}

/// ISO-8601 with `Z` or an offset, fractions allowed.
pub fn parse_expiry(s: &str) -> Result<SystemTime, String> {
    DateTime::from_str(s.trim(), DateTimeFormat::DateTimeWithOffset)
        .ok()
        .and_then(|d| SystemTime::try_from(d).ok())
        .ok_or_else(|| format!("expiry '{s}' is not an ISO-8601 timestamp"))
}

/// `upload_credentials` of an answer (`expires_at`, or `expiration` as the Python
/// docstring calls it).
pub fn parse_credentials(v: &Value) -> Result<Credentials, String> {
    const WHAT: &str = "upload_credentials";
    let obj = v
        .as_object()
        .ok_or_else(|| format!("{WHAT} is not an object but {}", kind(v)))?;
    let expiry = match (obj.get("expires_at"), obj.get("expiration")) {
        (Some(Value::String(s)), _) | (None, Some(Value::String(s))) => parse_expiry(s)?,
        (Some(other), _) | (None, Some(other)) => {
            return Err(format!(
                "{WHAT}: the expiry is not a string but {}",
                kind(other)
            ))
        }
        (None, None) => return Err(format!("{WHAT}: `expires_at` is missing")),
    };
    let region = match obj.get("region") {
        Some(Value::String(s)) if !s.trim().is_empty() => Some(s.trim().to_string()),
        _ => None,
    };
    Ok(Credentials {
        access_key: string_field(obj, "access_key", WHAT)?,
        secret_key: string_field(obj, "secret_key", WHAT)?,
        session_token: string_field(obj, "session_token", WHAT)?,
        expires_at: expiry,
        region,
    })
}

/// Credentials as the API gives them, to be read back by `parse_credentials`.
pub fn credentials_json(c: &Credentials) -> Value {
    let expiry = DateTime::from(c.expires_at)
        .fmt(DateTimeFormat::DateTime)
        .unwrap_or_default();
    serde_json::json!({
        "access_key": c.access_key,
        "secret_key": c.secret_key,
        "session_token": c.session_token,
        "expires_at": expiry,
        "region": c.region,
    })
}

/// A registration as the API answers it, to be read back by `parse_registration`.
pub fn registration_json(r: &Registration) -> Value {
    let prefix = match r.prefix.key.as_str() {
        "" => format!("s3://{}", r.prefix.bucket),
        k => format!("s3://{}/{k}", r.prefix.bucket),
    };
    serde_json::json!({
        "run_id": r.run_id,
        "upload_uri_prefix": prefix,
        "upload_credentials": credentials_json(&r.credentials),
    })
}

pub fn parse_registration(v: &Value) -> Result<Registration, String> {
    let obj = v
        .as_object()
        .ok_or_else(|| format!("the answer is not a JSON object but {}", kind(v)))?;
    let run_id = string_field(obj, "run_id", "the answer")?;
    let prefix = S3Prefix::parse(&string_field(obj, "upload_uri_prefix", "the answer")?)?;
    let credentials = parse_credentials(
        obj.get("upload_credentials")
            .ok_or("the answer: `upload_credentials` is missing")?,
    )?;
    Ok(Registration {
        run_id,
        prefix,
        credentials,
    })
}

/// How many request time-outs registration may take (see `Api::register`).
const REGISTER_TIMEOUT_FACTOR: u32 = 3;

pub struct Api {
    client: reqwest::Client,
    base: String,
    token: Secret,
    timeout: Duration,
}

impl Api {
    pub fn new(base: &str, token: Secret, timeout: Duration) -> Result<Api, String> {
        let client = reqwest::Client::builder()
            .timeout(timeout)
            .connect_timeout(timeout)
            .user_agent(concat!("resource-tracker/", env!("CARGO_PKG_VERSION")))
            // The token goes to the configured origin and nowhere else: a redirect
            // is an answer the client cannot use (reqwest drops the header on a hop
            // to another origin, but not on that origin's hop to itself).
            .redirect(reqwest::redirect::Policy::none())
            .build()
            .map_err(|e| format!("building the HTTP client: {e}"))?;
        Ok(Api {
            client,
            base: base.to_string(),
            token,
            timeout,
        })
    }

    /// Removes the token from text that may echo a request (error bodies).
    pub fn redact(&self, s: &str) -> String {
        redact(s, &self.token.0)
    }

    async fn post(&self, path: &str, body: Option<&Value>) -> Result<Value, ApiError> {
        self.post_within(path, body, self.timeout).await
    }

    async fn post_within(
        &self,
        path: &str,
        body: Option<&Value>,
        timeout: Duration,
    ) -> Result<Value, ApiError> {
        let url = format!("{}{path}", self.base);
        let mut req = self
            .client
            .post(&url)
            .timeout(timeout)
            .bearer_auth(&self.token.0)
            .header(reqwest::header::ACCEPT, "application/json");
        req = match body {
            Some(b) => req.json(b),
            None => req.header(reqwest::header::CONTENT_TYPE, "application/json"),
        };
        let resp = req.send().await.map_err(|e| {
            no_answer(
                &e,
                self.redact(&format!("POST {url}: {}", crate::warn::error_chain(&e))),
            )
        })?;
        let status = resp.status();
        if status.is_redirection() {
            let to = resp
                .headers()
                .get(reqwest::header::LOCATION)
                .and_then(|v| v.to_str().ok())
                .map_or_else(|| "no Location".to_string(), |l| clip(l, 120));
            return Err(ApiError::Answer(self.redact(&format!(
                "POST {url}: the API answered {} with a redirect to {to}; redirects are not \
                 followed, so that the token goes to {} only",
                status.as_u16(),
                self.base
            ))));
        }
        let text = read_bounded(resp, MAX_ANSWER).await.map_err(|e| match e {
            Body::TooLarge(n) => ApiError::Answer(format!(
                "POST {url}: the answer is larger than {n} bytes, more than any answer of the \
                 API; it was not read further"
            )),
            Body::Failed(e) => no_answer(
                &e,
                self.redact(&format!("POST {url}: reading the answer: {e}")),
            ),
        })?;
        if !status.is_success() {
            return Err(ApiError::Status {
                status: status.as_u16(),
                body: self.redact(&clip(&text, 300)),
            });
        }
        serde_json::from_str(&text).map_err(|e| {
            ApiError::Answer(format!(
                "POST {url}: the answer is not JSON ({e}): {}",
                self.redact(&clip(&text, 120))
            ))
        })
    }

    /// `POST /runs` is not idempotent: a request that times out may still create a
    /// run. It gets three times the time of the other requests, so that a slow
    /// answer is waited for rather than asked again.
    pub async fn register(&self, body: &Value) -> Result<Registration, ApiError> {
        let v = self
            .post_within("/runs", Some(body), self.timeout * REGISTER_TIMEOUT_FACTOR)
            .await?;
        parse_registration(&v).map_err(|e| ApiError::Answer(format!("POST /runs: {e}")))
    }

    pub async fn refresh(&self, run_id: &str) -> Result<Credentials, ApiError> {
        let path = format!("/runs/{run_id}/refresh-credentials");
        let v = self.post(&path, None).await?;
        let c = v.get("upload_credentials").ok_or_else(|| {
            ApiError::Answer(format!("POST {path}: `upload_credentials` is missing"))
        })?;
        parse_credentials(c).map_err(|e| ApiError::Answer(format!("POST {path}: {e}")))
    }

    pub async fn finish(&self, run_id: &str, body: &Value) -> Result<Value, ApiError> {
        self.post(&format!("/runs/{run_id}/finish"), Some(body))
            .await
    }
}

/// The most of an answer the client reads: the API's largest (a registration with
/// its credentials) is a few KiB. A body past this is refused unread, so an API
/// that floods cannot take the tracker's memory.
const MAX_ANSWER: usize = 1 << 20;

enum Body {
    /// Longer than the bound given (bytes).
    TooLarge(usize),
    Failed(reqwest::Error),
}

/// The answer's body as text, at most `max` bytes of it; read no further.
async fn read_bounded(mut resp: reqwest::Response, max: usize) -> Result<String, Body> {
    if resp.content_length().is_some_and(|n| n > max as u64) {
        return Err(Body::TooLarge(max));
    }
    let mut body = Vec::new();
    while let Some(chunk) = resp.chunk().await.map_err(Body::Failed)? {
        if body.len() + chunk.len() > max {
            return Err(Body::TooLarge(max));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(String::from_utf8_lossy(&body).into_owned())
}

/// A request that got no (whole) answer; a time-out kept apart, since the server
/// may still have acted on it.
fn no_answer(e: &reqwest::Error, msg: String) -> ApiError {
    match e.is_timeout() {
        true => ApiError::TimedOut(msg),
        false => ApiError::Transport(msg),
    }
}

/// Below this length a token is masked only where it stands alone (not inside a
/// longer word): a one-character token would otherwise star out that character
/// in every message ("h******p://").
const SHORT_TOKEN: usize = 8;

pub fn redact(s: &str, token: &str) -> String {
    if token.is_empty() {
        return s.to_string();
    }
    if token.len() >= SHORT_TOKEN {
        return s.replace(token, "***");
    }
    let word = |c: Option<char>| c.is_some_and(|c| c.is_alphanumeric() || c == '_' || c == '-');
    let mut out = String::with_capacity(s.len());
    let mut done = 0;
    for (i, _) in s.match_indices(token) {
        if i < done {
            continue;
        }
        let end = i + token.len();
        out.push_str(&s[done..i]);
        if word(s[..i].chars().last()) || word(s[end..].chars().next()) {
            out.push_str(token);
        } else {
            out.push_str("***");
        }
        done = end;
    }
    out.push_str(&s[done..]);
    out
}

/// One line of at most `n` characters.
pub fn clip(s: &str, n: usize) -> String {
    let one: String = s.split_whitespace().collect::<Vec<_>>().join(" ");
    if one.chars().count() <= n {
        one
    } else {
        one.chars().take(n).collect::<String>() + "…"
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn creds(extra: Value) -> Value {
        let mut v = json!({"access_key": "AK", "secret_key": "SK", "session_token": "ST"});
        for (k, x) in extra.as_object().unwrap() {
            v[k] = x.clone();
        }
        v
    }

    #[test]
    fn expiry_forms() {
        let z = parse_expiry("2026-11-21T10:00:00Z").unwrap();
        let off = parse_expiry("2026-11-21T12:00:00+02:00").unwrap();
        let frac = parse_expiry("2026-11-21T10:00:00.250000+00:00").unwrap();
        assert_eq!(z, off);
        assert_eq!(frac.duration_since(z).unwrap(), Duration::from_millis(250));
        assert!(parse_expiry("tomorrow").unwrap_err().contains("tomorrow"));
        assert!(parse_expiry("2026-13-01T00:00:00Z").is_err());
    }

    #[test]
    fn credentials_accept_both_expiry_names() {
        let a = parse_credentials(&creds(json!({"expires_at": "2030-01-01T00:00:00Z"}))).unwrap();
        let b = parse_credentials(&creds(
            json!({"expiration": "2030-01-01T00:00:00+00:00", "region": "eu-west-1"}),
        ))
        .unwrap();
        assert_eq!(a.expires_at, b.expires_at);
        assert_eq!(b.region.as_deref(), Some("eu-west-1"));
        assert_eq!(a.region, None);
    }

    #[test]
    fn credentials_name_what_is_wrong() {
        let mut v = creds(json!({"expires_at": "2030-01-01T00:00:00Z"}));
        v.as_object_mut().unwrap().remove("session_token");
        assert!(parse_credentials(&v).unwrap_err().contains("session_token"));
        let v = creds(json!({"expires_at": 5}));
        assert!(parse_credentials(&v).unwrap_err().contains("expiry"));
        let v = creds(json!({}));
        assert!(parse_credentials(&v).unwrap_err().contains("expires_at"));
        let v = creds(json!({"expires_at": "2030-01-01T00:00:00Z", "secret_key": 7}));
        assert!(parse_credentials(&v).unwrap_err().contains("secret_key"));
        assert!(parse_credentials(&json!([])).is_err());
        // Debug never shows the secret parts.
        let c = parse_credentials(&creds(json!({"expires_at": "2030-01-01T00:00:00Z"}))).unwrap();
        let d = format!("{c:?}");
        assert!(!d.contains("SK") && !d.contains("ST"), "{d}");
    }

    #[test]
    fn prefixes() {
        let p = S3Prefix::parse("s3://bucket/runs/r1/").unwrap();
        assert_eq!((p.bucket.as_str(), p.key.as_str()), ("bucket", "runs/r1"));
        assert_eq!(p.object_key(3), "runs/r1/0003.csv.gz");
        assert_eq!(p.uri(&p.object_key(12)), "s3://bucket/runs/r1/0012.csv.gz");
        assert_eq!(
            S3Prefix::parse("s3://b").unwrap().object_key(1),
            "0001.csv.gz"
        );
        assert!(S3Prefix::parse("https://x/y")
            .unwrap_err()
            .contains("s3://"));
        assert!(S3Prefix::parse("s3:///x").is_err());
    }

    #[test]
    fn registration_written_reads_back() {
        let v = json!({"run_id": "r1", "upload_uri_prefix": "s3://b/p/q",
            "upload_credentials": creds(json!({"expires_at": "2030-01-01T00:00:00Z", "region": "eu-west-1"}))});
        let r = parse_registration(&v).unwrap();
        let back = parse_registration(&registration_json(&r)).unwrap();
        assert_eq!(back.run_id, "r1");
        assert_eq!(back.prefix, r.prefix);
        assert_eq!(back.credentials.expires_at, r.credentials.expires_at);
        assert_eq!(back.credentials.session_token, "ST");
        assert_eq!(back.credentials.region.as_deref(), Some("eu-west-1"));
    }

    #[test]
    fn registration_answer() {
        let ok = json!({"run_id": "r1", "upload_uri_prefix": "s3://b/p",
            "upload_credentials": creds(json!({"expires_at": "2030-01-01T00:00:00Z"}))});
        let r = parse_registration(&ok).unwrap();
        assert_eq!(r.run_id, "r1");
        let mut bad = ok.clone();
        bad.as_object_mut().unwrap().remove("run_id");
        assert!(parse_registration(&bad).unwrap_err().contains("run_id"));
        let mut bad = ok.clone();
        bad["upload_uri_prefix"] = json!("gs://b/p");
        assert!(parse_registration(&bad).unwrap_err().contains("s3://"));
        assert!(parse_registration(&json!("x")).is_err());
    }

    #[test]
    fn redaction_and_clipping() {
        assert_eq!(redact("Bearer tok123 x", "tok123"), "Bearer *** x");
        // A short token is masked where it stands alone, not inside words.
        assert_eq!(
            redact("https://api.example: bad token h (h)", "h"),
            "https://api.example: bad token *** (***)"
        );
        assert_eq!(redact("hh h", "h"), "hh ***");
        assert_eq!(
            redact("a-long-token-here in x", "a-long-token-here"),
            "*** in x"
        );
        assert_eq!(clip("a\n b  c", 10), "a b c");
        assert_eq!(clip("abcdef", 3), "abc…");
    }
}
