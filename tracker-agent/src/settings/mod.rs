//! Settings from four layers, highest first: command line, environment, the TOML
//! config file, built-in defaults. Resolved once, before anything starts, into
//! the one [`Settings`] the session runs on, so that every bad value stops the
//! tracker with one line naming it and nothing past here sees the CLI's types.

pub mod cli;
mod file;
pub mod values;

use std::{ffi::OsString, path::PathBuf, time::Duration};

use crate::{
    discovery::Endpoints,
    model::JobMeta,
    sink::{
        sentinel::{self, Secret},
        Format,
    },
};
use cli::{Cli, Command, Opts};
use values::{env_bool, env_seconds, env_var, seconds, url_setting, GetEnv};

/// What to track.
#[derive(Clone, Debug, PartialEq)]
pub enum Target {
    /// Start this command (argv) and track its tree.
    Command(Vec<OsString>),
    /// Track the running tree of this pid; `origin` names where the pid came from.
    Attach { pid: u32, origin: String },
    /// The host only, until a signal.
    Host,
}

/// How the process tree is read.
#[derive(Clone, Copy, Debug)]
pub struct EngineSettings {
    pub no_ebpf: bool,
    /// Capacity of the kernel task map.
    pub max_tasks: u32,
    /// Size of the kernel's event ring in bytes.
    pub ring_bytes: u32,
    pub bpf_stats: bool,
    /// Also read PSS (smaps_rollup).
    pub pss: bool,
}

/// Everything the session needs from the user, after precedence.
#[derive(Clone, Debug)]
pub struct Settings {
    pub target: Target,
    pub interval: f64,
    pub format: Format,
    pub output: Option<PathBuf>,
    pub quiet: bool,
    pub summary: Option<PathBuf>,
    pub events: Option<PathBuf>,
    pub meta: JobMeta,
    pub engine: EngineSettings,
    /// Under sudo, run the command as root instead of the invoking user.
    pub as_root: bool,
    /// Probe cloud metadata without a token (`--discover`).
    pub discover: bool,
    /// Identifying host fields go to Sentinel only when this is set.
    pub share_identity: bool,
    /// Streaming, when `SENTINEL_API_TOKEN` is set and not empty.
    pub sentinel: Option<sentinel::Config>,
    /// Cloud metadata services' base URLs (`TRACKER_METADATA_*_URL`).
    pub metadata: Endpoints,
    /// The config file that was read, if any.
    pub config_file: Option<PathBuf>,
}

fn sentinel_settings(
    get_env: GetEnv,
    upload_interval: f64,
) -> Result<Option<sentinel::Config>, String> {
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
        _ => sentinel::DEFAULT_API_URL.to_string(),
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
    let timeout = env_seconds(get_env, "TRACKER_HTTP_TIMEOUT", 0.1)?.unwrap_or(30.0);
    Ok(Some(sentinel::Config {
        timeout: Duration::from_secs_f64(timeout),
        token: Secret(token),
        api_url,
        s3_endpoint,
        memory_limit,
        spool_dir,
        upload_interval,
    }))
}

/// What to track, from the command, `--pid` or the file's `[job] pid`.
fn target(
    opts: &Opts,
    cmd: Vec<OsString>,
    file_pid: Option<i64>,
    cname: &str,
) -> Result<Target, String> {
    if !cmd.is_empty() {
        if opts.pid.is_some() {
            return Err("--pid and a command cannot be used together".into());
        }
        if file_pid.is_some() {
            log::info!("tracking the command; [job] pid of the config file is ignored");
        }
        return Ok(Target::Command(cmd));
    }
    let (p, origin) = match (opts.pid, file_pid) {
        (Some(p), _) => (p, "--pid".to_string()),
        (None, Some(p)) => (p, format!("[job] pid in {cname}")),
        (None, None) => return Ok(Target::Host),
    };
    let pid = u32::try_from(p)
        .ok()
        .filter(|&p| p > 0 && p <= i32::MAX as u32)
        .ok_or_else(|| format!("{origin}: '{p}' is not a valid process id"))?;
    Ok(Target::Attach { pid, origin })
}

/// The environment variables clap reads for flags (`env = …`), checked before
/// clap parses, so that a bad value is named by its variable, not by its flag.
pub fn check_flag_env(get_env: GetEnv) -> Result<(), String> {
    use clap::CommandFactory as _;
    let cmd = Cli::command();
    for arg in cmd.get_arguments() {
        if let Some(var) = arg.get_env().and_then(|v| v.to_str()) {
            env_var(get_env, var)?;
        }
    }
    Ok(())
}

/// Applies the layers. `get_env` is `std::env::var_os` outside tests; clap has
/// already applied the environment to the flags that name a variable (checked
/// first by [`check_flag_env`]).
pub fn resolve(cli: Cli, get_env: GetEnv) -> Result<Settings, String> {
    let (opts, cmd) = match cli.command {
        Some(Command::Run { opts, cmd }) => (opts, cmd),
        None => (cli.opts, cli.cmd),
    };
    let file = file::load(opts.config.as_deref())?;
    let (cfg, config_file) = match file {
        Some((c, p)) => (c, Some(p)),
        None => (file::FileConfig::default(), None),
    };
    let cname = config_file
        .as_ref()
        .map(|p| p.display().to_string())
        .unwrap_or_default();
    let tr = &cfg.tracker;
    let in_file = |key: &str| format!("config file {cname}: [tracker] {key}");

    cfg.job
        .check()
        .map_err(|(field, why)| format!("config file {cname}: [job] {field}: {why}"))?;
    let mut flags = opts.meta.clone();
    for t in &opts.tag {
        let (k, v) = values::parse_tag(t)?;
        flags.tags.insert(k, v);
    }
    let meta = flags.over(cfg.job.clone());

    let interval = match (&opts.interval, tr.interval_secs) {
        (Some(s), _) => seconds("--interval", s, 0.1)?,
        (None, Some(v)) => seconds(&in_file("interval_secs"), &v.to_string(), 0.1)?,
        (None, None) => 1.0,
    };
    let format = match (opts.format, &tr.format) {
        (Some(f), _) => f,
        (None, Some(s)) => match s.as_str() {
            "json" => Format::Json,
            "csv" => Format::Csv,
            other => {
                return Err(format!(
                    "{}: '{other}' is not json or csv",
                    in_file("format")
                ))
            }
        },
        (None, None) => Format::Json,
    };
    let upload_interval = match (
        env_seconds(get_env, "TRACKER_UPLOAD_INTERVAL", 1.0)?,
        tr.upload_interval_secs,
    ) {
        (Some(v), _) => v,
        (None, Some(v)) => seconds(&in_file("upload_interval_secs"), &v.to_string(), 1.0)?,
        (None, None) => 60.0,
    };
    let discover = opts.discover
        || env_bool(get_env, "TRACKER_DISCOVER")?
            .or(tr.discover)
            .unwrap_or(false);
    let share_identity = opts.share_identity
        || env_bool(get_env, "TRACKER_SHARE_IDENTITY")?
            .or(tr.share_identity)
            .unwrap_or(false);
    let sentinel = sentinel_settings(get_env, upload_interval)?;
    let metadata = values::endpoints(get_env)?;
    Ok(Settings {
        target: target(&opts, cmd, cfg.pid, &cname)?,
        interval,
        format,
        output: opts.output.clone().or(tr.output.clone()),
        quiet: opts.quiet || tr.quiet.unwrap_or(false),
        summary: opts.summary.clone(),
        events: opts.events.clone(),
        meta,
        engine: EngineSettings {
            no_ebpf: opts.no_ebpf,
            max_tasks: opts.max_tasks,
            ring_bytes: opts.event_ring_kib * 1024,
            bpf_stats: opts.bpf_stats,
            pss: opts.pss,
        },
        as_root: opts.as_root,
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

    use clap::{CommandFactory as _, Parser as _};

    use super::*;

    fn opts(args: &[&str]) -> Cli {
        let mut v = vec!["rt"];
        v.extend_from_slice(args);
        Cli::try_parse_from(v).expect("parse")
    }

    /// (field, variable, flag) of every metadata field, from its one definition.
    fn meta_fields() -> Vec<(String, String, String)> {
        Cli::command()
            .get_arguments()
            .filter_map(|a| {
                let var = a.get_env()?.to_str()?.to_string();
                Some((a.get_id().to_string(), var, format!("--{}", a.get_long()?)))
            })
            .filter(|(_, var, _)| var.starts_with("TRACKER_"))
            .collect()
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
    fn malformed_toml_names_file_line_column() {
        let p = tmp("bad", "[job]\nname = \"x\"\npid = = 3\n");
        let e = resolve(opts(&["-c", p.to_str().unwrap()]), &no_env).unwrap_err();
        assert!(e.contains("c.toml, line 3, column"), "{e}");
        assert!(!e.contains('\n'), "{e}");
    }

    #[test]
    fn wrong_type_is_an_error_with_position() {
        let p = tmp("type", "[job]\npid = \"abc\"\n");
        let e = resolve(opts(&["-c", p.to_str().unwrap()]), &no_env).unwrap_err();
        assert!(e.contains("line 2"), "{e}");
        let p = tmp("type2", "[tracker]\ninterval_secs = \"fast\"\n");
        let e = resolve(opts(&["-c", p.to_str().unwrap()]), &no_env).unwrap_err();
        assert!(e.contains("line 2"), "{e}");
        let p = tmp("type3", "job = 3\n");
        assert!(resolve(opts(&["-c", p.to_str().unwrap()]), &no_env).is_err());
    }

    #[test]
    fn explicit_missing_config_is_an_error() {
        let e = resolve(opts(&["-c", "/nonexistent/rt.toml"]), &no_env).unwrap_err();
        assert!(e.contains("/nonexistent/rt.toml"), "{e}");
    }

    #[test]
    fn bad_values_are_named() {
        let p = tmp("iv", "[tracker]\ninterval_secs = 0\n");
        let e = resolve(opts(&["-c", p.to_str().unwrap()]), &no_env).unwrap_err();
        assert!(e.contains("interval_secs"), "{e}");
        let p = tmp("fmt", "[tracker]\nformat = \"xml\"\n");
        let e = resolve(opts(&["-c", p.to_str().unwrap()]), &no_env).unwrap_err();
        assert!(e.contains("format") && e.contains("xml"), "{e}");
        let env = |k: &str| (k == "TRACKER_TEAM").then(|| OsString::from("a\nb"));
        let e = resolve(opts(&[]), &env).unwrap_err();
        assert!(e.contains("TRACKER_TEAM"), "{e}");
        let env = |k: &str| (k == "TRACKER_UPLOAD_INTERVAL").then(|| OsString::from("soon"));
        let e = resolve(opts(&[]), &env).unwrap_err();
        assert!(e.contains("TRACKER_UPLOAD_INTERVAL"), "{e}");
        {
            use std::os::unix::ffi::OsStringExt as _;
            let env = |k: &str| (k == "TRACKER_ENV").then(|| OsString::from_vec(vec![0xff, 0x41]));
            let e = resolve(opts(&[]), &env).unwrap_err();
            assert!(e.contains("TRACKER_ENV") && e.contains("UTF-8"), "{e}");
        }
        for bad in ["novalue", "=v"] {
            let e = resolve(opts(&["--tag", bad]), &no_env).unwrap_err();
            assert!(e.contains("--tag"), "{e}");
        }
    }

    /// Every metadata field, each layer: flag > environment > file > default.
    #[test]
    fn precedence_for_every_field() {
        let mut body = String::from("[job]\n");
        for (field, _, _) in meta_fields() {
            body.push_str(&format!("{field} = \"file-{field}\"\n"));
        }
        body.push_str("pid = 4242\ntags = { team = \"file\", only_file = \"1\" }\n");
        body.push_str("[tracker]\ninterval_secs = 7\nformat = \"csv\"\noutput = \"file.out\"\nquiet = true\nupload_interval_secs = 30\n");
        let p = tmp("prec", &body);
        let c = p.to_str().unwrap();
        let field_of = |s: &Settings, field: &str| {
            serde_json::to_value(&s.meta).unwrap()[field]
                .as_str()
                .map(str::to_string)
        };
        let fields = meta_fields();
        assert_eq!(fields.len(), 11, "{fields:?}");
        for (field, _var, flag) in &fields {
            // default only
            let s = resolve(opts(&["-c", "/dev/null"]), &no_env).unwrap();
            assert_eq!(field_of(&s, field), None, "{field}");
            // file
            let s = resolve(opts(&["-c", c]), &no_env).unwrap();
            assert_eq!(field_of(&s, field), Some(format!("file-{field}")));
            // flag beats file (the environment sits between them: clap reads it
            // for these flags; tests/tests/formats.rs checks all three layers)
            let s = resolve(opts(&["-c", c, flag, "cli"]), &no_env).unwrap();
            assert_eq!(field_of(&s, field).as_deref(), Some("cli"), "{flag}");
        }
        // The file's historical key for the job name.
        let p = tmp("name", "[job]\nname = \"n\"\n");
        let s = resolve(opts(&["-c", p.to_str().unwrap()]), &no_env).unwrap();
        assert_eq!(s.meta.job_name.as_deref(), Some("n"));
        let s = resolve(opts(&["-c", c]), &no_env).unwrap();
        assert_eq!(
            s.target,
            Target::Attach {
                pid: 4242,
                origin: format!("[job] pid in {c}")
            }
        );
        assert_eq!(s.interval, 7.0);
        assert_eq!(s.format, Format::Csv);
        assert_eq!(s.output, Some(PathBuf::from("file.out")));
        assert!(s.quiet);
        assert!(s.sentinel.is_none());
        assert_eq!(s.tags_sorted(), vec![("only_file", "1"), ("team", "file")]);
        let token = |k: &str| (k == "SENTINEL_API_TOKEN").then(|| OsString::from("t"));
        let upload = |s: Settings| s.sentinel.map(|c| c.upload_interval);
        assert_eq!(
            upload(resolve(opts(&["-c", c]), &token).unwrap()),
            Some(30.0)
        );
        let env = |k: &str| match k {
            "TRACKER_UPLOAD_INTERVAL" => Some(OsString::from("12")),
            _ => token(k),
        };
        let s = resolve(
            opts(&[
                "-c", c, "-p", "1", "-i", "0.5", "-f", "json", "-o", "cli.out", "--tag", "team=cli",
            ]),
            &env,
        )
        .unwrap();
        assert_eq!(
            s.target,
            Target::Attach {
                pid: 1,
                origin: "--pid".into()
            }
        );
        assert_eq!(s.interval, 0.5);
        assert_eq!(s.format, Format::Json);
        assert_eq!(s.output, Some(PathBuf::from("cli.out")));
        assert_eq!(s.tags_sorted(), vec![("only_file", "1"), ("team", "cli")]);
        assert_eq!(upload(s), Some(12.0));
        // defaults
        let s = resolve(opts(&["-c", "/dev/null"]), &token).unwrap();
        assert_eq!(
            (&s.target, s.interval, s.format, s.quiet),
            (&Target::Host, 1.0, Format::Json, false)
        );
        assert!(s.output.is_none() && s.meta.tags.is_empty());
        assert_eq!(upload(s), Some(60.0));
    }

    #[test]
    fn unknown_keys_only_warn() {
        let p = tmp(
            "unk",
            "[job]\nname = \"a\"\ncolour = \"red\"\n[extra]\nx = 1\n",
        );
        let s = resolve(opts(&["-c", p.to_str().unwrap()]), &no_env).unwrap();
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
        let st = resolve(o.clone(), &with(&[("SENTINEL_API_URL", "nonsense")])).unwrap();
        assert!(st.sentinel.is_none());
        let st = resolve(o.clone(), &with(&[("SENTINEL_API_TOKEN", " ")])).unwrap();
        assert!(st.sentinel.is_none());
        let st = resolve(
            o.clone(),
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
            let e = resolve(o.clone(), &env).unwrap_err();
            assert!(e.contains(needle) && !e.contains('\n'), "{e}");
        }
        // A token with a space is refused without being echoed.
        let e = resolve(o.clone(), &with(&[("SENTINEL_API_TOKEN", "sec ret")])).unwrap_err();
        assert!(
            e.contains("SENTINEL_API_TOKEN") && !e.contains("sec ret"),
            "{e}"
        );
        // Opt-ins: flag, variable, file.
        assert!(
            resolve(opts(&["--share-identity", "--", "true"]), &|_| None)
                .unwrap()
                .share_identity
        );
        assert!(
            resolve(o.clone(), &with(&[("TRACKER_DISCOVER", "yes")]))
                .unwrap()
                .discover
        );
    }
}
