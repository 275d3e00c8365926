//! OTLP export from the OpenTelemetry variables (their meaning as the
//! OpenTelemetry SDKs read them), and `--otlp-endpoint`, which means what
//! `OTEL_EXPORTER_OTLP_ENDPOINT` means and wins over it.

use std::time::Duration;

use super::values::{env_var, url_of, GetEnv};
use crate::sink::otlp::{Config, Headers};

/// The SDKs' defaults: export every 60 s, wait 10 s for an answer.
const DEFAULT_INTERVAL_MS: u64 = 60_000;
const DEFAULT_TIMEOUT_MS: u64 = 10_000;

/// The export's settings; none when no endpoint is set.
pub fn resolve(get_env: GetEnv, flag: Option<&str>) -> Result<Option<Config>, String> {
    let signal = env_var(get_env, "OTEL_EXPORTER_OTLP_METRICS_ENDPOINT")?;
    let endpoint = match (flag, signal) {
        (Some(f), _) => with_path(f, "--otlp-endpoint")?,
        // The per-signal variable is the whole URL, as given.
        (None, Some(s)) if !s.trim().is_empty() => url_of(
            "environment variable OTEL_EXPORTER_OTLP_METRICS_ENDPOINT",
            s.trim(),
        )?,
        _ => match env_var(get_env, "OTEL_EXPORTER_OTLP_ENDPOINT")? {
            Some(b) if !b.trim().is_empty() => {
                with_path(&b, "environment variable OTEL_EXPORTER_OTLP_ENDPOINT")?
            }
            _ => return Ok(None),
        },
    };
    let protocol = first(
        get_env,
        &[
            "OTEL_EXPORTER_OTLP_METRICS_PROTOCOL",
            "OTEL_EXPORTER_OTLP_PROTOCOL",
        ],
    )?;
    if let Some((var, p)) = protocol {
        if p.trim() != "http/protobuf" {
            return Err(format!(
                "environment variable {var}: '{}' is not supported; this tracker exports \
                 http/protobuf (leave it unset or set http/protobuf)",
                p.trim().escape_debug()
            ));
        }
    }
    // Signal-specific headers add to and override the general ones, key by key.
    let mut headers = header_list(get_env, "OTEL_EXPORTER_OTLP_HEADERS")?;
    for (k, v) in header_list(get_env, "OTEL_EXPORTER_OTLP_METRICS_HEADERS")? {
        headers.retain(|(h, _)| !h.eq_ignore_ascii_case(&k));
        headers.push((k, v));
    }
    let timeout = millis(
        get_env,
        &[
            "OTEL_EXPORTER_OTLP_METRICS_TIMEOUT",
            "OTEL_EXPORTER_OTLP_TIMEOUT",
        ],
        DEFAULT_TIMEOUT_MS,
    )?;
    let interval = millis(
        get_env,
        &["OTEL_METRIC_EXPORT_INTERVAL"],
        DEFAULT_INTERVAL_MS,
    )?;
    let mut resource = pairs(get_env, "OTEL_RESOURCE_ATTRIBUTES", false)?;
    if let Some(name) = env_var(get_env, "OTEL_SERVICE_NAME")?.filter(|s| !s.trim().is_empty()) {
        resource.retain(|(k, _)| k != "service.name");
        resource.push(("service.name".into(), name.trim().to_string()));
    }
    Ok(Some(Config {
        endpoint,
        headers: Headers(headers),
        timeout: Duration::from_millis(timeout),
        interval: Duration::from_millis(interval),
        resource,
    }))
}

/// Headers from `var`, each a valid name and value. A value is a secret (a
/// token): never echoed.
fn header_list(get_env: GetEnv, var: &str) -> Result<Vec<(String, String)>, String> {
    let list = pairs(get_env, var, true)?;
    for (k, v) in &list {
        reqwest::header::HeaderName::from_bytes(k.as_bytes()).map_err(|_| {
            format!(
                "environment variable {var}: '{}' is not a header name",
                k.escape_debug()
            )
        })?;
        reqwest::header::HeaderValue::from_str(v).map_err(|_| {
            format!(
                "environment variable {var}: the value of '{}' is not a header value",
                k.escape_debug()
            )
        })?;
    }
    Ok(list)
}

/// The first of `vars` that is set, with its name.
fn first(get_env: GetEnv, vars: &[&'static str]) -> Result<Option<(&'static str, String)>, String> {
    for v in vars {
        if let Some(s) = env_var(get_env, v)?.filter(|s| !s.trim().is_empty()) {
            return Ok(Some((v, s)));
        }
    }
    Ok(None)
}

/// Milliseconds from the first of `vars` that is set (a whole positive number).
fn millis(get_env: GetEnv, vars: &[&'static str], default: u64) -> Result<u64, String> {
    match first(get_env, vars)? {
        None => Ok(default),
        Some((var, s)) => match s.trim().parse::<u64>() {
            Ok(n) if (1..=86_400_000).contains(&n) => Ok(n),
            _ => Err(format!(
                "environment variable {var}: '{}' is not a number of milliseconds from 1 to 86400000",
                s.trim().escape_debug()
            )),
        },
    }
}

/// The base endpoint `v` with the metrics path the OTLP/HTTP specification
/// appends to it.
fn with_path(v: &str, origin: &str) -> Result<String, String> {
    Ok(format!("{}/v1/metrics", url_of(origin, v.trim())?))
}

/// `key=value,key=value` (W3C Baggage without properties, values percent-encoded)
/// from `var`; every value kept as a secret where `secret` (headers carry tokens).
fn pairs(get_env: GetEnv, var: &str, secret: bool) -> Result<Vec<(String, String)>, String> {
    let Some(text) = env_var(get_env, var)? else {
        return Ok(Vec::new());
    };
    let mut out = Vec::new();
    for (i, item) in text.split(',').enumerate() {
        if item.trim().is_empty() {
            continue;
        }
        let Some((k, v)) = item.split_once('=') else {
            return Err(format!(
                "environment variable {var}: item {} has no '=' (key=value,key=value)",
                i + 1
            ));
        };
        let k = k.trim();
        if k.is_empty() {
            return Err(format!(
                "environment variable {var}: item {} has an empty key",
                i + 1
            ));
        }
        let v = percent_decode(v.trim()).ok_or_else(|| {
            let what = if secret {
                format!("the value of '{k}'")
            } else {
                format!("'{}'", v.trim())
            };
            format!("environment variable {var}: {what} is not percent-encoded UTF-8")
        })?;
        out.push((k.to_string(), v));
    }
    Ok(out)
}

/// `%XX` sequences decoded; None where one is broken or the result is not UTF-8.
fn percent_decode(s: &str) -> Option<String> {
    let b = s.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        if b[i] == b'%' {
            let hex = std::str::from_utf8(b.get(i + 1..i + 3)?).ok()?;
            out.push(u8::from_str_radix(hex, 16).ok()?);
            i += 3;
        } else {
            out.push(b[i]);
            i += 1;
        }
    }
    String::from_utf8(out).ok()
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;

    use super::*;

    fn with(vars: &'static [(&'static str, &'static str)]) -> impl Fn(&str) -> Option<OsString> {
        move |k| {
            vars.iter()
                .find(|(n, _)| *n == k)
                .map(|(_, v)| OsString::from(v))
        }
    }

    #[test]
    fn endpoints_headers_and_attributes() {
        assert!(resolve(&with(&[]), None).unwrap().is_none());
        let c = resolve(
            &with(&[
                ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://127.0.0.1:4318/"),
                (
                    "OTEL_EXPORTER_OTLP_HEADERS",
                    "a=1,Authorization=Bearer%20tok",
                ),
                ("OTEL_EXPORTER_OTLP_METRICS_HEADERS", "A=2"),
                ("OTEL_RESOURCE_ATTRIBUTES", "service.name=x,team=ml%2Cops"),
                ("OTEL_SERVICE_NAME", "train"),
                ("OTEL_METRIC_EXPORT_INTERVAL", "500"),
            ]),
            None,
        )
        .unwrap()
        .unwrap();
        assert_eq!(c.endpoint, "http://127.0.0.1:4318/v1/metrics");
        let h: Vec<_> = c
            .headers
            .0
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        assert_eq!(h, [("Authorization", "Bearer tok"), ("A", "2")]);
        assert_eq!(
            format!("{:?}", c.headers),
            r#"["Authorization: ***", "A: ***"]"#
        );
        assert_eq!(
            c.resource,
            [
                ("team".into(), "ml,ops".into()),
                ("service.name".into(), "train".into())
            ]
        );
        assert_eq!(c.interval, Duration::from_millis(500));
        assert_eq!(c.timeout, Duration::from_millis(10_000));
        // The signal's own variable is the whole URL; the flag wins over both.
        let c = resolve(
            &with(&[("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://h:1/m")]),
            None,
        );
        assert_eq!(c.unwrap().unwrap().endpoint, "http://h:1/m");
        let c = resolve(
            &with(&[("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "http://h:1/m")]),
            Some("http://f:2"),
        );
        assert_eq!(c.unwrap().unwrap().endpoint, "http://f:2/v1/metrics");
    }

    #[test]
    fn bad_values_name_their_variable_and_hide_secrets() {
        let err = |v| resolve(&with(v), None).unwrap_err();
        assert!(err(&[("OTEL_EXPORTER_OTLP_ENDPOINT", "localhost:4318")])
            .contains("OTEL_EXPORTER_OTLP_ENDPOINT"));
        let e = err(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://h"),
            ("OTEL_EXPORTER_OTLP_PROTOCOL", "grpc"),
        ]);
        assert!(
            e.contains("OTEL_EXPORTER_OTLP_PROTOCOL") && e.contains("grpc"),
            "{e}"
        );
        let e = err(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://h"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "tok"),
        ]);
        assert!(e.contains("item 1 has no '='") && !e.contains("tok"), "{e}");
        let e = err(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://h"),
            ("OTEL_EXPORTER_OTLP_HEADERS", "k=s3cr%zz"),
        ]);
        assert!(e.contains("the value of 'k'") && !e.contains("s3cr"), "{e}");
        let e = err(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://h"),
            ("OTEL_RESOURCE_ATTRIBUTES", "=v"),
        ]);
        assert!(
            e.contains("OTEL_RESOURCE_ATTRIBUTES") && e.contains("empty key"),
            "{e}"
        );
        let e = err(&[
            ("OTEL_EXPORTER_OTLP_ENDPOINT", "http://h"),
            ("OTEL_METRIC_EXPORT_INTERVAL", "0"),
        ]);
        assert!(e.contains("OTEL_METRIC_EXPORT_INTERVAL"), "{e}");
    }
}
