//! Batch uploads with the temporary credentials: one S3 client per credential set,
//! no SDK retries (the uploader keeps failed batches and retries them itself).

use std::time::Duration;

use aws_sdk_s3::{
    config::{
        retry::RetryConfig, timeout::TimeoutConfig, BehaviorVersion, Credentials as AwsCreds,
        Region, RequestChecksumCalculation,
    },
    error::SdkError,
    primitives::ByteStream,
    Client,
};

use aws_smithy_http_client::tls;

use super::api::Credentials;

/// Region when neither the credentials nor the bucket tell (the Python client's).
pub const DEFAULT_REGION: &str = "eu-central-1";

#[derive(Debug)]
pub enum PutError {
    /// 403 or an S3 credential error code: refresh the credentials, then retry.
    Auth(String),
    /// No answer (a time-out, a connection lost after sending): the object may
    /// have been stored all the same.
    NoAnswer(String),
    /// Anything else: retry later with the same object.
    Other(String),
}

impl std::fmt::Display for PutError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            PutError::Auth(s) | PutError::NoAnswer(s) | PutError::Other(s) => f.write_str(s),
        }
    }
}

const AUTH_CODES: [&str; 6] = [
    "ExpiredToken",
    "InvalidAccessKeyId",
    "InvalidToken",
    "SignatureDoesNotMatch",
    "TokenRefreshRequired",
    "AccessDenied",
];

pub fn client(c: &Credentials, region: &str, endpoint: Option<&str>, timeout: Duration) -> Client {
    // The expiry is ours to watch; the SDK gets none, so it never refuses on its own.
    let creds = AwsCreds::new(
        &c.access_key,
        &c.secret_key,
        Some(c.session_token.clone()),
        None,
        "sentinel",
    );
    let https = aws_smithy_http_client::Builder::new()
        .tls_provider(tls::Provider::Rustls(
            tls::rustls_provider::CryptoMode::Ring,
        ))
        .build_https();
    let mut b = aws_sdk_s3::Config::builder()
        .behavior_version(BehaviorVersion::latest())
        .http_client(https)
        .region(Region::new(region.to_string()))
        .credentials_provider(creds)
        .retry_config(RetryConfig::disabled())
        .request_checksum_calculation(RequestChecksumCalculation::WhenRequired)
        .timeout_config(
            TimeoutConfig::builder()
                .connect_timeout(timeout)
                .operation_attempt_timeout(timeout)
                .build(),
        );
    if let Some(e) = endpoint {
        b = b.endpoint_url(e).force_path_style(true);
    }
    Client::from_conf(b.build())
}

type HttpResponse = aws_sdk_s3::config::http::HttpResponse;

/// (status, S3 error code, one-line message).
fn describe<E: aws_sdk_s3::error::ProvideErrorMetadata + std::fmt::Debug>(
    e: &SdkError<E, HttpResponse>,
) -> (Option<u16>, Option<String>, String) {
    match e {
        SdkError::ServiceError(s) => {
            let status = s.raw().status().as_u16();
            let code = s.err().code().map(str::to_string);
            let msg = s
                .err()
                .message()
                .map(|m| format!(": {m}"))
                .unwrap_or_default();
            let c = code.as_deref().map(|c| format!(" {c}")).unwrap_or_default();
            (
                Some(status),
                code,
                format!("S3 answered HTTP {status}{c}{msg}"),
            )
        }
        SdkError::TimeoutError(_) => (None, None, "S3 request timed out".into()),
        SdkError::DispatchFailure(d) => (None, None, format!("S3 unreachable: {d:?}")),
        SdkError::ResponseError(_) => (None, None, "S3 answer unreadable".into()),
        other => (None, None, format!("S3 request failed: {other}")),
    }
}

pub async fn put(client: &Client, bucket: &str, key: &str, body: Vec<u8>) -> Result<(), PutError> {
    let r = client
        .put_object()
        .bucket(bucket)
        .key(key)
        .content_type("text/csv")
        .body(ByteStream::from(body))
        .send()
        .await;
    match r {
        Ok(_) => Ok(()),
        Err(e) => {
            let (status, code, msg) = describe(&e);
            let auth =
                status == Some(403) || code.as_deref().is_some_and(|c| AUTH_CODES.contains(&c));
            // Sent, maybe stored, and no answer: a time-out, an answer cut short.
            // Refused or never sent (a connection refused) stored nothing.
            let may_have_landed = match &e {
                SdkError::TimeoutError(_) | SdkError::ResponseError(_) => true,
                SdkError::DispatchFailure(d) => d.is_timeout() || d.is_io(),
                _ => false,
            };
            Err(if auth {
                PutError::Auth(msg)
            } else if may_have_landed {
                PutError::NoAnswer(msg)
            } else {
                PutError::Other(msg)
            })
        }
    }
}

/// Whether `key` holds an object of `len` bytes (a PUT of ours that got no answer
/// but was stored): Ok(false) when S3 says there is none, or one of another size.
pub async fn landed(client: &Client, bucket: &str, key: &str, len: usize) -> Result<bool, String> {
    match client.head_object().bucket(bucket).key(key).send().await {
        Ok(o) => Ok(o.content_length() == Some(len as i64)),
        Err(SdkError::ServiceError(s)) if s.raw().status().as_u16() == 404 => Ok(false),
        Err(e) => Err(describe(&e).2),
    }
}

/// The bucket's region from S3 itself (`x-amz-bucket-region`, also on a 301/403).
pub async fn bucket_region(client: &Client, bucket: &str) -> Option<String> {
    let header = |h: &HttpResponse| h.headers().get("x-amz-bucket-region").map(str::to_string);
    match client.head_bucket().bucket(bucket).send().await {
        Ok(o) => o.bucket_region().map(str::to_string),
        Err(SdkError::ServiceError(s)) => header(s.raw()),
        Err(_) => None,
    }
}
