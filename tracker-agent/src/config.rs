//! Settings from four layers, highest first: command line, environment, the TOML
//! config file, built-in defaults. Resolved once before anything starts, so that
//! every bad value stops the tracker with one line naming it.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
};

use serde::{Deserialize, Serialize};

use crate::cli::{parse_interval, Format, Opts};

/// Config file looked up in the working directory when `--config` is not given.
pub const DEFAULT_CONFIG: &str = "resource-tracker.toml";

/// Job metadata: written into samples (`job_name`), the summary and Sentinel runs.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct JobMeta {
    pub job_name: Option<String>,
    pub project_name: Option<String>,
    pub stage_name: Option<String>,
    pub task_name: Option<String>,
    pub team: Option<String>,
    pub env: Option<String>,
    pub language: Option<String>,
    pub orchestrator: Option<String>,
    pub executor: Option<String>,
    pub external_run_id: Option<String>,
    pub container_image: Option<String>,
    pub tags: BTreeMap<String, String>,
}

/// The eleven metadata fields: (field in `[job]` and JobMeta, variable, flag).
pub const META_FIELDS: [(&str, &str, &str); 11] = [
    ("name", "TRACKER_JOB_NAME", "--job-name"),
    ("project_name", "TRACKER_PROJECT_NAME", "--project-name"),
    ("stage_name", "TRACKER_STAGE_NAME", "--stage-name"),
    ("task_name", "TRACKER_TASK_NAME", "--task-name"),
    ("team", "TRACKER_TEAM", "--team"),
    ("env", "TRACKER_ENV", "--env"),
    ("language", "TRACKER_LANGUAGE", "--language"),
    ("orchestrator", "TRACKER_ORCHESTRATOR", "--orchestrator"),
    ("executor", "TRACKER_EXECUTOR", "--executor"),
    (
        "external_run_id",
        "TRACKER_EXTERNAL_RUN_ID",
        "--external-run-id",
    ),
    (
        "container_image",
        "TRACKER_CONTAINER_IMAGE",
        "--container-image",
    ),
];

impl JobMeta {
    fn slot(&mut self, field: &str) -> Option<&mut Option<String>> {
        Some(match field {
            "name" => &mut self.job_name,
            "project_name" => &mut self.project_name,
            "stage_name" => &mut self.stage_name,
            "task_name" => &mut self.task_name,
            "team" => &mut self.team,
            "env" => &mut self.env,
            "language" => &mut self.language,
            "orchestrator" => &mut self.orchestrator,
            "executor" => &mut self.executor,
            "external_run_id" => &mut self.external_run_id,
            "container_image" => &mut self.container_image,
            _ => return None,
        })
    }
}

/// Everything the session needs from the user, after precedence.
#[derive(Clone, Debug)]
pub struct Settings {
    pub pid: Option<i64>,
    pub interval: f64,
    pub format: Format,
    pub output: Option<PathBuf>,
    pub quiet: bool,
    pub meta: JobMeta,
    /// Seconds between Sentinel batch uploads (`TRACKER_UPLOAD_INTERVAL`).
    pub upload_interval: f64,
    /// Probe cloud metadata without a token (`--discover`).
    pub discover: bool,
    /// Identifying host fields go to Sentinel only when this is set.
    pub share_identity: bool,
    /// Streaming, when `SENTINEL_API_TOKEN` is set and not empty.
    pub sentinel: Option<SentinelSettings>,
    /// Cloud metadata services' base URLs (`TRACKER_METADATA_*_URL`).
    pub metadata: crate::discovery::Endpoints,
    /// The config file that was read, if any.
    pub config_file: Option<PathBuf>,
}

/// The API token; never printed, not even by `{:?}`.
#[derive(Clone)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}

pub const DEFAULT_API_URL: &str = "https://api.sentinel.sparecores.net";

#[derive(Clone, Debug)]
pub struct SentinelSettings {
    pub token: Secret,
    /// Base URL without a trailing slash (`SENTINEL_API_URL`).
    pub api_url: String,
    /// S3 endpoint for tests and private stores (`TRACKER_S3_ENDPOINT`, path-style).
    pub s3_endpoint: Option<String>,
    /// Bytes of pending batches kept in memory before they go to the spool file
    /// (`TRACKER_UPLOAD_MEMORY_LIMIT`).
    pub memory_limit: usize,
    /// Directory of the spool file (`TRACKER_SPOOL_DIR`, default the temp dir).
    pub spool_dir: PathBuf,
    /// Timeout of each API and S3 request (`TRACKER_HTTP_TIMEOUT`, seconds).
    pub timeout: std::time::Duration,
}

#[derive(Debug, Default, Deserialize)]
struct FileConfig {
    #[serde(default)]
    job: JobSection,
    #[serde(default)]
    tracker: TrackerSection,
}

#[derive(Debug, Default, Deserialize)]
struct JobSection {
    name: Option<String>,
    pid: Option<i64>,
    project_name: Option<String>,
    stage_name: Option<String>,
    task_name: Option<String>,
    team: Option<String>,
    env: Option<String>,
    language: Option<String>,
    orchestrator: Option<String>,
    executor: Option<String>,
    external_run_id: Option<String>,
    container_image: Option<String>,
    tags: Option<BTreeMap<String, String>>,
}

#[derive(Debug, Default, Deserialize)]
struct TrackerSection {
    interval_secs: Option<f64>,
    format: Option<String>,
    output: Option<PathBuf>,
    quiet: Option<bool>,
    upload_interval_secs: Option<f64>,
    discover: Option<bool>,
    share_identity: Option<bool>,
}

const JOB_KEYS: [&str; 13] = [
    "name",
    "pid",
    "project_name",
    "stage_name",
    "task_name",
    "team",
    "env",
    "language",
    "orchestrator",
    "executor",
    "external_run_id",
    "container_image",
    "tags",
];
const TRACKER_KEYS: [&str; 7] = [
    "interval_secs",
    "format",
    "output",
    "quiet",
    "upload_interval_secs",
    "discover",
    "share_identity",
];

/// 1-based line and column of a byte offset.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before
        .rfind('\n')
        .map_or(before.len(), |n| before.len() - n - 1)
        + 1;
    (line, col)
}

/// Reads and checks the config file. `explicit` is `--config`: missing is then an
/// error; the default file is silently skipped when absent.
fn load(explicit: Option<&Path>) -> Result<Option<(FileConfig, PathBuf)>, String> {
    let path = explicit.unwrap_or(Path::new(DEFAULT_CONFIG));
    let name = path.display();
    let text = match std::fs::read(path) {
        Ok(b) => String::from_utf8(b).map_err(|e| {
            format!(
                "config file {name}: not UTF-8 text (byte {})",
                e.utf8_error().valid_up_to()
            )
        })?,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && explicit.is_none() => {
            return Ok(None)
        }
        Err(e) => return Err(format!("config file {name}: {e}")),
    };
    let located = |e: toml::de::Error| -> String {
        let msg = e.message().trim().replace('\n', " ");
        match e.span() {
            Some(s) => {
                let (l, c) = line_col(&text, s.start);
                format!("config file {name}, line {l}, column {c}: {msg}")
            }
            None => format!("config file {name}: {msg}"),
        }
    };
    let table: toml::Table = toml::from_str(&text).map_err(located)?;
    for (section, v) in &table {
        let known: &[&str] = match section.as_str() {
            "job" => &JOB_KEYS,
            "tracker" => &TRACKER_KEYS,
            _ => {
                log::warn!("config file {name}: unknown section [{section}] ignored");
                continue;
            }
        };
        match v.as_table() {
            Some(t) => {
                for k in t.keys().filter(|k| !known.contains(&k.as_str())) {
                    log::warn!("config file {name}: unknown key `{k}` in [{section}] ignored");
                }
            }
            None => {
                return Err(format!(
                    "config file {name}: `{section}` must be a table ([{section}])"
                ))
            }
        }
    }
    let cfg: FileConfig = toml::from_str(&text).map_err(located)?;
    Ok(Some((cfg, path.to_path_buf())))
}

/// A metadata value from the environment or the command line: any text without
/// control characters (it ends up in CSV cells and HTTP bodies).
fn check_text(origin: &str, v: &str) -> Result<String, String> {
    if let Some(c) = v.chars().find(|c| c.is_control() && *c != '\t') {
        return Err(format!(
            "{origin}: contains the control character U+{:04X}",
            c as u32
        ));
    }
    Ok(v.to_string())
}

/// Reads a variable: unset or empty is None; non-UTF-8 is an error naming it.
fn env_var(
    get: &dyn Fn(&str) -> Option<std::ffi::OsString>,
    var: &str,
) -> Result<Option<String>, String> {
    match get(var) {
        None => Ok(None),
        Some(v) if v.is_empty() => Ok(None),
        Some(v) => match v.to_str() {
            Some(s) => check_text(&format!("environment variable {var}"), s).map(Some),
            None => Err(format!("environment variable {var}: not valid UTF-8")),
        },
    }
}

/// Parses one `--tag KEY=VALUE`.
pub fn parse_tag(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("--tag '{s}': expected KEY=VALUE"))?;
    let k = k.trim();
    if k.is_empty() {
        return Err(format!("--tag '{s}': the key before '=' is empty"));
    }
    let k = check_text("--tag", k)?;
    let v = check_text("--tag", v)?;
    Ok((k, v.to_string()))
}

/// A yes/no switch from the environment; unset or empty is `None`.
fn env_bool(
    get_env: &dyn Fn(&str) -> Option<std::ffi::OsString>,
    var: &str,
) -> Result<Option<bool>, String> {
    match env_var(get_env, var)?.as_deref().map(str::trim) {
        None | Some("") => Ok(None),
        Some(v) => match v.to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "on" => Ok(Some(true)),
            "0" | "false" | "no" | "off" => Ok(Some(false)),
            _ => Err(format!(
                "environment variable {var}: '{v}' is not one of 1/0, true/false, yes/no, on/off"
            )),
        },
    }
}

/// An http(s) base URL (a path prefix is allowed) without its trailing slashes.
pub fn base_url(s: &str) -> Result<String, &'static str> {
    let s = s.trim();
    let lower = s.to_ascii_lowercase();
    let Some(scheme_len) = ["http://", "https://"]
        .iter()
        .find(|p| lower.starts_with(*p))
        .map(|p| p.len())
    else {
        return Err("is not an http:// or https:// URL");
    };
    if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("contains spaces or control characters");
    }
    if s[scheme_len..].is_empty() || s[scheme_len..].starts_with('/') {
        return Err("has no host");
    }
    let url = reqwest::Url::parse(s).map_err(|_| "is not a valid URL")?;
    if url.host_str().is_none_or(str::is_empty) {
        return Err("has no host");
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err("must not have a query or fragment");
    }
    Ok(s.trim_end_matches('/').to_string())
}

fn url_setting(var: &str, v: &str) -> Result<String, String> {
    base_url(v).map_err(|why| format!("environment variable {var}: '{}' {why}", v.escape_debug()))
}

fn sentinel_settings(
    get_env: &dyn Fn(&str) -> Option<std::ffi::OsString>,
) -> Result<Option<SentinelSettings>, String> {
    // A token that is not UTF-8 must not be echoed back in the error.
    let token = match get_env("SENTINEL_API_TOKEN") {
        None => return Ok(None),
        Some(t) => t
            .into_string()
            .map_err(|_| "environment variable SENTINEL_API_TOKEN: not valid UTF-8".to_string())?,
    };
    let token = token.trim().to_string();
    if token.is_empty() {
        return Ok(None);
    }
    if token.chars().any(|c| c.is_control() || c == ' ') {
        return Err(
            "environment variable SENTINEL_API_TOKEN: contains spaces or control characters".into(),
        );
    }
    let api_url = match env_var(get_env, "SENTINEL_API_URL")? {
        Some(u) if !u.trim().is_empty() => url_setting("SENTINEL_API_URL", &u)?,
        _ => DEFAULT_API_URL.to_string(),
    };
    let s3_endpoint = match env_var(get_env, "TRACKER_S3_ENDPOINT")? {
        Some(u) if !u.trim().is_empty() => Some(url_setting("TRACKER_S3_ENDPOINT", &u)?),
        _ => None,
    };
    let memory_limit = match env_var(get_env, "TRACKER_UPLOAD_MEMORY_LIMIT")? {
        Some(v) if !v.trim().is_empty() => v.trim().parse::<usize>().map_err(|_| {
            format!(
                "environment variable TRACKER_UPLOAD_MEMORY_LIMIT: '{v}' is not a number of bytes"
            )
        })?,
        _ => 16 << 20,
    };
    let spool_dir = match env_var(get_env, "TRACKER_SPOOL_DIR")? {
        Some(v) if !v.trim().is_empty() => PathBuf::from(v),
        _ => std::env::temp_dir(),
    };
    let timeout = match env_var(get_env, "TRACKER_HTTP_TIMEOUT")? {
        Some(v) if !v.trim().is_empty() => env_secs("TRACKER_HTTP_TIMEOUT", &v, 0.1)?,
        _ => 30.0,
    };
    Ok(Some(SentinelSettings {
        timeout: std::time::Duration::from_secs_f64(timeout),
        token: Secret(token),
        api_url,
        s3_endpoint,
        memory_limit,
        spool_dir,
    }))
}

/// Seconds from the environment variable `var` (value `v`), at least `min`.
fn env_secs(var: &str, v: &str, min: f64) -> Result<f64, String> {
    let n: f64 = v
        .trim()
        .parse()
        .map_err(|_| format!("environment variable {var}: '{v}' is not a number of seconds"))?;
    positive_secs(&format!("environment variable {var}"), n, min)
}

fn positive_secs(origin: &str, v: f64, min: f64) -> Result<f64, String> {
    if !v.is_finite() || v <= 0.0 {
        return Err(format!(
            "{origin}: must be a positive number of seconds, got {v}"
        ));
    }
    if v < min {
        return Err(format!(
            "{origin}: the smallest value is {min} seconds, got {v}"
        ));
    }
    Ok(v)
}

/// Applies the layers. `get_env` is `std::env::var_os` outside tests.
pub fn resolve(
    opts: &Opts,
    get_env: &dyn Fn(&str) -> Option<std::ffi::OsString>,
) -> Result<Settings, String> {
    let file = load(opts.config.as_deref())?;
    let (cfg, config_file) = match file {
        Some((c, p)) => (c, Some(p)),
        None => (FileConfig::default(), None),
    };
    let cname = config_file
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_default();

    // Metadata: config < environment < flags, field by field.
    let mut meta = JobMeta::default();
    let cfg_values = [
        &cfg.job.name,
        &cfg.job.project_name,
        &cfg.job.stage_name,
        &cfg.job.task_name,
        &cfg.job.team,
        &cfg.job.env,
        &cfg.job.language,
        &cfg.job.orchestrator,
        &cfg.job.executor,
        &cfg.job.external_run_id,
        &cfg.job.container_image,
    ];
    let flag_values = opts.meta_flags();
    for (i, (field, var, flag)) in META_FIELDS.iter().enumerate() {
        let from_cfg = match cfg_values[i] {
            Some(v) => Some(check_text(
                &format!("config file {cname}: [job] {field}"),
                v,
            )?),
            None => None,
        };
        let from_env = env_var(get_env, var)?;
        let from_flag = match flag_values[i] {
            Some(v) => Some(check_text(flag, v)?),
            None => None,
        };
        if let Some(slot) = meta.slot(field) {
            *slot = from_flag.or(from_env).or(from_cfg);
        }
    }
    if let Some(t) = &cfg.job.tags {
        for (k, v) in t {
            let origin = format!("config file {cname}: [job] tags.{k}");
            meta.tags
                .insert(check_text(&origin, k)?, check_text(&origin, v)?);
        }
    }
    for t in &opts.tag {
        let (k, v) = parse_tag(t)?;
        meta.tags.insert(k, v);
    }

    let interval = match (&opts.interval, cfg.tracker.interval_secs) {
        (Some(s), _) => parse_interval(s)?,
        (None, Some(v)) => positive_secs(
            &format!("config file {cname}: [tracker] interval_secs"),
            v,
            0.1,
        )?,
        (None, None) => 1.0,
    };
    let format = match (opts.format, &cfg.tracker.format) {
        (Some(f), _) => f,
        (None, Some(s)) => match s.as_str() {
            "json" => Format::Json,
            "csv" => Format::Csv,
            other => {
                return Err(format!(
                    "config file {cname}: [tracker] format: '{other}' is not json or csv"
                ))
            }
        },
        (None, None) => Format::Json,
    };
    let output = opts.output.clone().or(cfg.tracker.output.clone());
    let quiet = opts.quiet || cfg.tracker.quiet.unwrap_or(false);
    let pid = opts.pid.or(cfg.job.pid);
    let upload_interval = match (
        env_var(get_env, "TRACKER_UPLOAD_INTERVAL")?,
        cfg.tracker.upload_interval_secs,
    ) {
        (Some(s), _) => env_secs("TRACKER_UPLOAD_INTERVAL", &s, 1.0)?,
        (None, Some(v)) => positive_secs(
            &format!("config file {cname}: [tracker] upload_interval_secs"),
            v,
            1.0,
        )?,
        (None, None) => 60.0,
    };
    let discover = opts.discover
        || env_bool(get_env, "TRACKER_DISCOVER")?
            .or(cfg.tracker.discover)
            .unwrap_or(false);
    let share_identity = opts.share_identity
        || env_bool(get_env, "TRACKER_SHARE_IDENTITY")?
            .or(cfg.tracker.share_identity)
            .unwrap_or(false);
    let sentinel = sentinel_settings(get_env)?;
    let metadata = crate::discovery::Endpoints::from_env(get_env)?;
    Ok(Settings {
        pid,
        interval,
        format,
        output,
        quiet,
        meta,
        upload_interval,
        discover,
        share_identity,
        sentinel,
        metadata,
        config_file,
    })
}

#[cfg(test)]
mod tests {
    use std::ffi::OsString;

    use clap::Parser as _;

    use super::*;
    use crate::cli::Cli;

    fn opts(args: &[&str]) -> Opts {
        let mut v = vec!["rt"];
        v.extend_from_slice(args);
        Cli::try_parse_from(v).expect("parse").opts
    }

    fn tmp(name: &str, body: &str) -> PathBuf {
        let dir = std::env::temp_dir().join(format!("rt-config-{}-{name}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("tmp dir");
        let p = dir.join("c.toml");
        std::fs::write(&p, body).expect("write");
        p
    }

    fn no_env(_: &str) -> Option<OsString> {
        None
    }

    #[test]
    fn line_and_column() {
        assert_eq!(line_col("ab\ncd", 0), (1, 1));
        assert_eq!(line_col("ab\ncd", 4), (2, 2));
    }

    #[test]
    fn malformed_toml_names_file_line_column() {
        let p = tmp("bad", "[job]\nname = \"x\"\npid = = 3\n");
        let e = resolve(&opts(&["-c", p.to_str().unwrap()]), &no_env).unwrap_err();
        assert!(e.contains("c.toml, line 3, column"), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }

    #[test]
    fn wrong_type_is_an_error_with_position() {
        let p = tmp("type", "[job]\npid = \"abc\"\n");
        let e = resolve(&opts(&["-c", p.to_str().unwrap()]), &no_env).unwrap_err();
        assert!(e.contains("line 2"), "{e}");
        let p = tmp("type2", "[tracker]\ninterval_secs = \"fast\"\n");
        let e = resolve(&opts(&["-c", p.to_str().unwrap()]), &no_env).unwrap_err();
        assert!(e.contains("line 2"), "{e}");
        let p = tmp("type3", "job = 3\n");
        assert!(resolve(&opts(&["-c", p.to_str().unwrap()]), &no_env).is_err());
    }

    #[test]
    fn explicit_missing_config_is_an_error() {
        let e = resolve(&opts(&["-c", "/nonexistent/rt.toml"]), &no_env).unwrap_err();
        assert!(e.contains("/nonexistent/rt.toml"), "{e}");
    }

    #[test]
    fn bad_values_are_named() {
        let p = tmp("iv", "[tracker]\ninterval_secs = 0\n");
        let e = resolve(&opts(&["-c", p.to_str().unwrap()]), &no_env).unwrap_err();
        assert!(e.contains("interval_secs"), "{e}");
        let p = tmp("fmt", "[tracker]\nformat = \"xml\"\n");
        let e = resolve(&opts(&["-c", p.to_str().unwrap()]), &no_env).unwrap_err();
        assert!(e.contains("format") && e.contains("xml"), "{e}");
        let env = |k: &str| (k == "TRACKER_TEAM").then(|| OsString::from("a\nb"));
        let e = resolve(&opts(&[]), &env).unwrap_err();
        assert!(e.contains("TRACKER_TEAM"), "{e}");
        let env = |k: &str| (k == "TRACKER_UPLOAD_INTERVAL").then(|| OsString::from("soon"));
        let e = resolve(&opts(&[]), &env).unwrap_err();
        assert!(e.contains("TRACKER_UPLOAD_INTERVAL"), "{e}");
        {
            use std::os::unix::ffi::OsStringExt as _;
            let env = |k: &str| (k == "TRACKER_ENV").then(|| OsString::from_vec(vec![0xff, 0x41]));
            let e = resolve(&opts(&[]), &env).unwrap_err();
            assert!(e.contains("TRACKER_ENV") && e.contains("UTF-8"), "{e}");
        }
        for bad in ["novalue", "=v"] {
            let e = resolve(&opts(&["--tag", bad]), &no_env).unwrap_err();
            assert!(e.contains("--tag"), "{e}");
        }
    }

    /// Every metadata field, each layer: flag > environment > file > default.
    #[test]
    fn precedence_for_every_field() {
        let mut body = String::from("[job]\n");
        for (field, _, _) in META_FIELDS {
            body.push_str(&format!("{field} = \"file-{field}\"\n"));
        }
        body.push_str("pid = 4242\ntags = { team = \"file\", only_file = \"1\" }\n");
        body.push_str("[tracker]\ninterval_secs = 7\nformat = \"csv\"\noutput = \"file.out\"\nquiet = true\nupload_interval_secs = 30\n");
        let p = tmp("prec", &body);
        let c = p.to_str().unwrap();
        for (i, (field, var, flag)) in META_FIELDS.iter().enumerate() {
            // default only
            let s = resolve(&opts(&["-c", "/dev/null"]), &no_env).unwrap();
            assert_eq!(s.meta.clone().slot(field).unwrap().clone(), None, "{field}");
            // file
            let s = resolve(&opts(&["-c", c]), &no_env).unwrap();
            assert_eq!(
                s.meta.clone().slot(field).unwrap().as_deref(),
                Some(format!("file-{field}").as_str())
            );
            // env beats file
            let env = |k: &str| (k == *var).then(|| OsString::from(format!("env-{i}")));
            let s = resolve(&opts(&["-c", c]), &env).unwrap();
            assert_eq!(
                s.meta.clone().slot(field).unwrap().as_deref(),
                Some(format!("env-{i}").as_str()),
                "{var}"
            );
            // flag beats env
            let s = resolve(&opts(&["-c", c, flag, "cli"]), &env).unwrap();
            assert_eq!(
                s.meta.clone().slot(field).unwrap().as_deref(),
                Some("cli"),
                "{flag}"
            );
        }
        let s = resolve(&opts(&["-c", c]), &no_env).unwrap();
        assert_eq!(s.pid, Some(4242));
        assert_eq!(s.interval, 7.0);
        assert_eq!(s.format, Format::Csv);
        assert_eq!(s.output, Some(PathBuf::from("file.out")));
        assert!(s.quiet);
        assert_eq!(s.upload_interval, 30.0);
        assert_eq!(s.tags_sorted(), vec![("only_file", "1"), ("team", "file")]);
        let env = |k: &str| (k == "TRACKER_UPLOAD_INTERVAL").then(|| OsString::from("12"));
        let s = resolve(
            &opts(&[
                "-c", c, "-p", "1", "-i", "0.5", "-f", "json", "-o", "cli.out", "--tag", "team=cli",
            ]),
            &env,
        )
        .unwrap();
        assert_eq!(s.pid, Some(1));
        assert_eq!(s.interval, 0.5);
        assert_eq!(s.format, Format::Json);
        assert_eq!(s.output, Some(PathBuf::from("cli.out")));
        assert_eq!(s.upload_interval, 12.0);
        assert_eq!(s.tags_sorted(), vec![("only_file", "1"), ("team", "cli")]);
        // defaults
        let s = resolve(&opts(&["-c", "/dev/null"]), &no_env).unwrap();
        assert_eq!(
            (s.pid, s.interval, s.format, s.quiet),
            (None, 1.0, Format::Json, false)
        );
        assert_eq!(s.upload_interval, 60.0);
        assert!(s.output.is_none() && s.meta.tags.is_empty());
    }

    #[test]
    fn unknown_keys_only_warn() {
        let p = tmp(
            "unk",
            "[job]\nname = \"a\"\ncolour = \"red\"\n[extra]\nx = 1\n",
        );
        let s = resolve(&opts(&["-c", p.to_str().unwrap()]), &no_env).unwrap();
        assert_eq!(s.meta.job_name.as_deref(), Some("a"));
    }

    impl Settings {
        fn tags_sorted(&self) -> Vec<(&str, &str)> {
            self.meta
                .tags
                .iter()
                .map(|(k, v)| (k.as_str(), v.as_str()))
                .collect()
        }
    }

    #[test]
    fn sentinel_settings_from_the_environment() {
        let with = |pairs: &'static [(&'static str, &'static str)]| {
            move |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| *n == k)
                    .map(|(_, v)| OsString::from(*v))
            }
        };
        let o = opts(&["--", "true"]);
        // No token, or an empty one: off, and the other variables are not even read.
        let st = resolve(&o, &with(&[("SENTINEL_API_URL", "nonsense")])).unwrap();
        assert!(st.sentinel.is_none());
        let st = resolve(&o, &with(&[("SENTINEL_API_TOKEN", " ")])).unwrap();
        assert!(st.sentinel.is_none());
        let st = resolve(
            &o,
            &with(&[
                ("SENTINEL_API_TOKEN", "tok"),
                ("SENTINEL_API_URL", "http://127.0.0.1:9/api/"),
                ("TRACKER_HTTP_TIMEOUT", "2.5"),
            ]),
        )
        .unwrap();
        let sc = st.sentinel.unwrap();
        assert_eq!(sc.api_url, "http://127.0.0.1:9/api");
        assert_eq!(sc.timeout, std::time::Duration::from_millis(2500));
        assert!(!format!("{sc:?}").contains("tok\""), "{sc:?}");
        for (pairs, needle) in [
            (
                &[("SENTINEL_API_TOKEN", "t"), ("SENTINEL_API_URL", "ftp://x")][..],
                "SENTINEL_API_URL",
            ),
            (
                &[
                    ("SENTINEL_API_TOKEN", "t"),
                    ("TRACKER_S3_ENDPOINT", "http://"),
                ][..],
                "TRACKER_S3_ENDPOINT",
            ),
            (
                &[("SENTINEL_API_TOKEN", "t"), ("TRACKER_HTTP_TIMEOUT", "-1")][..],
                "TRACKER_HTTP_TIMEOUT",
            ),
            (
                &[
                    ("SENTINEL_API_TOKEN", "t"),
                    ("TRACKER_UPLOAD_MEMORY_LIMIT", "lots"),
                ][..],
                "TRACKER_UPLOAD_MEMORY_LIMIT",
            ),
            (
                &[("TRACKER_SHARE_IDENTITY", "maybe")][..],
                "TRACKER_SHARE_IDENTITY",
            ),
            (
                &[("TRACKER_METADATA_URL", "169.254.169.254")][..],
                "TRACKER_METADATA_URL",
            ),
        ] {
            let pairs: Vec<(String, String)> = pairs
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect();
            let env = |k: &str| {
                pairs
                    .iter()
                    .find(|(n, _)| n == k)
                    .map(|(_, v)| OsString::from(v))
            };
            let e = resolve(&o, &env).unwrap_err();
            assert!(e.contains(needle) && !e.contains('\n'), "{e}");
        }
        // A token with a space is refused without being echoed.
        let e = resolve(&o, &with(&[("SENTINEL_API_TOKEN", "sec ret")])).unwrap_err();
        assert!(
            e.contains("SENTINEL_API_TOKEN") && !e.contains("sec ret"),
            "{e}"
        );
        // Opt-ins: flag, variable, file.
        assert!(
            resolve(&opts(&["--share-identity", "--", "true"]), &|_| None)
                .unwrap()
                .share_identity
        );
        assert!(
            resolve(&o, &with(&[("TRACKER_DISCOVER", "yes")]))
                .unwrap()
                .discover
        );
    }
}
