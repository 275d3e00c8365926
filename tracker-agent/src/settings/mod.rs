//! Settings from four layers, highest first: command line, environment, the TOML
//! config file, built-in defaults. Resolved once, before anything starts, into
//! the one [`Settings`] the session runs on, so that every bad value stops the
//! tracker with one line naming it and nothing past here sees the CLI's types.

pub mod admin;
pub mod cli;
mod file;
pub mod node;
pub mod otlp;
pub mod report;
pub mod values;

use std::{ffi::OsString, path::PathBuf, time::Duration};

use crate::{
    collect::limits::Limits,
    discovery::Endpoints,
    engine::ebpf::Knobs,
    model::JobMeta,
    sink::{
        sentinel::{self, Secret},
        Format,
    },
};
use cli::{Cli, Command, Opts};
use values::{env_bool, env_fd, env_seconds, env_var, seconds, url_setting, GetEnv};

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
#[derive(Clone, Debug)]
pub struct EngineSettings {
    pub no_ebpf: bool,
    /// Capacity of the kernel task map.
    pub max_tasks: u32,
    /// Size of the kernel's event ring in bytes.
    pub ring_bytes: u32,
    pub bpf_stats: bool,
    /// Also read PSS (smaps_rollup).
    pub pss: bool,
    /// For tests and kernels that keep their BTF elsewhere.
    pub knobs: Knobs,
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
    /// OTLP export, when an OTLP endpoint is set (`--otlp-endpoint`, the
    /// OpenTelemetry variables).
    pub otlp: Option<crate::sink::otlp::Config>,
    /// Cloud metadata services' base URLs (`TRACKER_METADATA_*_URL`).
    pub metadata: Endpoints,
    /// The config file that was read, if any.
    pub config_file: Option<PathBuf>,
    /// Nice value for the tracker's own threads, set once the command has started.
    pub renice: Option<i32>,
    /// Host steal only (`cpu.per_core_steal_time_pct` empty), as the Rust sibling.
    pub aggregate_cpu_steal: bool,
    /// The HTML report to write at the end (`--report`).
    pub report: Option<PathBuf>,
    /// Keeper's base URL, when the cheapest fitting server is asked for.
    pub keeper: Option<String>,
    /// Attached or host-only: stop once the process that started the tracker is
    /// gone (`TRACKER_STOP_WITH_PARENT`, set by the Python package).
    pub stop_with_parent: bool,
    /// The pid of the process that started the tracker, as it said
    /// (`TRACKER_PARENT_PID`, set by the Python package): with
    /// `stop_with_parent`, a starter already gone when the tracker starts is
    /// told apart from the reaper that adopted it.
    pub parent_pid: Option<u32>,
    /// The write end of a pipe that gets one line once tracking is in place
    /// (`TRACKER_READY_FD`, set by the Python package, whose `start()` waits for it).
    pub ready_fd: Option<i32>,
    /// The read end of a pipe on which the attached root tells its reaped
    /// children's CPU (`TRACKER_ROOT_CHILDREN_FD`, set by the Python package when
    /// it tracks its own interpreter; session/told.rs).
    pub root_children_fd: Option<i32>,
    /// How long, once the command has exited, the run waits for the rest of its tree
    /// (members still running: a script's background job, a worker finishing).
    pub tail_timeout: Duration,
    /// The limits the command runs under (`--cpus`, `--memory`); none by default.
    pub limits: Limits,
}

/// The tail's default wait: members that finish within it after the command are
/// counted whole; a daemon that outlives it is `still_running`.
pub const DEFAULT_TAIL_SECS: f64 = 2.0;

fn sentinel_settings(
    get_env: GetEnv,
    upload_interval: f64,
) -> Result<Option<sentinel::Config>, String> {
    // SENTINEL_API_KEY is the streaming overview's name for the token; the token
    // wins when both are set. A token that is not UTF-8 or has spaces must not be
    // echoed back in the error.
    let (var, token) = match ["SENTINEL_API_TOKEN", "SENTINEL_API_KEY"]
        .into_iter()
        .find_map(|v| {
            get_env(v)
                .filter(|t| !t.to_string_lossy().trim().is_empty())
                .map(|t| (v, t))
        }) {
        None => return Ok(None),
        Some((var, t)) => (
            var,
            t.into_string()
                .map_err(|_| format!("environment variable {var}: not valid UTF-8"))?,
        ),
    };
    let token = token.trim().to_string();
    if token.is_empty() {
        return Ok(None);
    }
    if token.chars().any(|c| c.is_control() || c == ' ') {
        return Err(format!(
            "environment variable {var}: contains spaces or control characters"
        ));
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
        Some(v) if !v.trim().is_empty() => {
            let d = values::existing_dir("TRACKER_SPOOL_DIR", &v)?;
            // A variable a sudoers rule may keep: under sudo the tracker makes its
            // kept directory only where the invoking user could make it.
            if let Some(r) = crate::sudo::invoker()? {
                if let Err(e) = crate::fsafe::writable_as(&d, &r.owner()) {
                    return Err(format!(
                        "environment variable TRACKER_SPOOL_DIR: {}: user {} {}; under sudo the spool must be a directory the user may write",
                        d.display(),
                        crate::warn::escaped(&r.user),
                        values::cannot_write_in(&e)
                    ));
                }
            }
            if let Err(e) = sentinel::probe_spool(&d) {
                return Err(format!(
                    "environment variable TRACKER_SPOOL_DIR: {}: {}",
                    d.display(),
                    values::cannot_write_in(&e)
                ));
            }
            d
        }
        _ => crate::fsafe::temp_dir(),
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

/// Keeper's base URL, when the cheapest fitting server is asked for.
fn keeper_of(
    opts: &Opts,
    get_env: GetEnv,
    tr: &file::TrackerSection,
) -> Result<Option<String>, String> {
    let ask = switch(
        opts.recommend_server,
        get_env,
        "TRACKER_RECOMMEND_SERVER",
        tr.recommend_server,
    )?;
    ask.then(|| report::keeper_url(get_env)).transpose()
}

/// OTLP export: the flag, else the OpenTelemetry variables, else the file's key
/// (below the environment, as every key is).
fn otlp_of(
    get_env: GetEnv,
    flag: Option<&str>,
    tr: &file::TrackerSection,
    in_file: &dyn Fn(&str) -> String,
) -> Result<Option<crate::sink::otlp::Config>, String> {
    if let Some(f) = flag {
        return otlp::resolve(get_env, Some(f));
    }
    match (otlp::resolve(get_env, None)?, &tr.otlp_endpoint) {
        (None, Some(k)) => otlp::resolve(get_env, Some(k))
            .map_err(|e| e.replace("--otlp-endpoint", &in_file("otlp_endpoint"))),
        (from_env, _) => Ok(from_env),
    }
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
    let subs = cmd.get_subcommands().flat_map(|c| c.get_arguments());
    for arg in cmd.get_arguments().chain(subs) {
        if let Some(var) = arg.get_env().and_then(|v| v.to_str()) {
            env_var(get_env, var)?;
        }
    }
    Ok(())
}

/// What the tracker was asked to do.
pub enum Job {
    Track(Box<Settings>),
    Node(Box<node::NodeSettings>),
    Report(Box<report::ReportSettings>),
}

/// The settings of either way of running.
pub fn resolve_job(cli: Cli, get_env: GetEnv) -> Result<Job, String> {
    match cli.command {
        Some(Command::Node(opts)) => node::resolve(opts, get_env).map(|n| Job::Node(Box::new(n))),
        Some(Command::Report(opts)) => {
            report::resolve(opts, get_env).map(|r| Job::Report(Box::new(r)))
        }
        _ => resolve(cli, get_env).map(|s| Job::Track(Box::new(s))),
    }
}

/// The output format: the flag (which clap checks), else the config file's, else
/// JSON lines.
fn format_of(
    flag: Option<&str>,
    file: Option<&str>,
    in_file: &dyn Fn(&str) -> String,
) -> Result<Format, String> {
    match flag.or(file) {
        None | Some("json") => Ok(Format::Json),
        Some("csv") => Ok(Format::Csv),
        Some(other) => Err(format!(
            "{}: '{other}' is not json or csv",
            in_file("format")
        )),
    }
}

/// Where a setting is looked for, the first that has it winning: its flag, its
/// environment variable, its `[tracker]` key. Each gives text and where it came
/// from, and one parser checks it whichever it came from, naming that origin.
struct Layers<'a> {
    get_env: GetEnv<'a>,
    in_file: &'a dyn Fn(&str) -> String,
}

impl Layers<'_> {
    /// `flag` (its name and text), `var`, then `key` of the config file (its value
    /// as text), parsed by `parse(origin, text)`; None where none is set.
    fn pick<T>(
        &self,
        flag: (&str, Option<&str>),
        var: Option<&str>,
        key: (&str, Option<String>),
        parse: impl Fn(&str, &str) -> Result<T, String>,
    ) -> Result<Option<T>, String> {
        let env = match var {
            Some(v) => env_var(self.get_env, v)?.map(|t| (format!("environment variable {v}"), t)),
            None => None,
        };
        let found = match (flag, env, key) {
            ((name, Some(t)), _, _) => Some((name.to_string(), t.to_string())),
            (_, Some(e), _) => Some(e),
            (_, None, (k, Some(t))) => Some(((self.in_file)(k), t)),
            _ => None,
        };
        found.map(|(origin, t)| parse(&origin, &t)).transpose()
    }
}

/// Seconds between samples: the flag, the config file, else one.
fn interval_of(lay: &Layers, flag: Option<&str>, file: Option<f64>) -> Result<f64, String> {
    Ok(lay
        .pick(
            ("--interval", flag),
            None,
            ("interval_secs", file.map(|v| v.to_string())),
            |o, t| seconds(o, t, 0.1),
        )?
        .unwrap_or(1.0))
}

/// How long to follow members left after the root exits, seconds: the flag, the
/// environment, the config file, else the default.
fn tail_of(lay: &Layers, flag: Option<&str>, file: Option<f64>) -> Result<f64, String> {
    Ok(lay
        .pick(
            ("--tail-timeout", flag),
            Some("TRACKER_TAIL_TIMEOUT"),
            ("tail_timeout_secs", file.map(|v| format!("{v:?}"))),
            values::tail_secs,
        )?
        .unwrap_or(DEFAULT_TAIL_SECS))
}

const EVENTS_NEED_EBPF: &str =
    "--events: process events come from the eBPF engine; not with --no-ebpf";

/// Streaming, when a token is set: its upload interval from the environment, the
/// config file, else a minute.
fn streaming_of(lay: &Layers, file: Option<f64>) -> Result<Option<sentinel::Config>, String> {
    let upload_interval = lay
        .pick(
            ("", None),
            Some("TRACKER_UPLOAD_INTERVAL"),
            ("upload_interval_secs", file.map(|v| v.to_string())),
            |o, t| seconds(o, t, 1.0),
        )?
        .unwrap_or(60.0);
    sentinel_settings(lay.get_env, upload_interval)
}

/// The config file, if one is read, its path, and its name as messages show it.
fn config_of(opts: &Opts) -> Result<(file::FileConfig, Option<PathBuf>, String), String> {
    let (cfg, config_file) = match file::load(opts.config.as_deref())? {
        Some((c, p)) => (c, Some(p)),
        None => (file::FileConfig::default(), None),
    };
    let cname = config_file
        .as_ref()
        .map(|p| crate::warn::escaped(&p.display().to_string()))
        .unwrap_or_default();
    Ok((cfg, config_file, cname))
}

/// The job's metadata: the flags (and `--tag`s) over the config file's `[job]`.
fn meta_of(opts: &Opts, cfg: &file::FileConfig, cname: &str) -> Result<JobMeta, String> {
    cfg.job
        .check()
        .map_err(|(field, why)| format!("config file {cname}: [job] {field}: {why}"))?;
    let mut flags = opts.meta.clone();
    for t in &opts.tag {
        let (k, v) = values::parse_tag(t)?;
        flags.tags.insert(k, v);
    }
    Ok(flags.over(cfg.job.clone()))
}

/// An on/off setting: the flag turns it on, else the environment, else the
/// config file, else off.
fn switch(flag: bool, get_env: GetEnv, var: &str, file: Option<bool>) -> Result<bool, String> {
    Ok(flag || env_bool(get_env, var)?.or(file).unwrap_or(false))
}

/// The limits to run the command under: the flags, the environment, the config
/// file, else none; each within what the host has.
fn limits_of(lay: &Layers, opts: &Opts, tr: &file::TrackerSection) -> Result<Limits, String> {
    let (host_cpus, host_bytes) = values::host_size();
    let cpus = lay.pick(
        ("--cpus", opts.cpus.as_deref()),
        Some("TRACKER_CPUS"),
        ("cpus", tr.cpus.map(|v| format!("{v:?}"))),
        |o, t| values::cpus(o, t, host_cpus),
    )?;
    // A size in the file is MiB as a number or text with its unit; any other
    // value is named as it is written.
    let file_memory = tr.memory.as_ref().map(|v| match v {
        toml::Value::String(t) => t.clone(),
        toml::Value::Float(f) => format!("{f:?}"),
        toml::Value::Integer(i) => i.to_string(),
        toml::Value::Boolean(b) => b.to_string(),
        other => other.type_str().to_string(),
    });
    let memory_bytes = lay.pick(
        ("--memory", opts.memory.as_deref()),
        Some("TRACKER_MEMORY"),
        ("memory", file_memory),
        |o, t| values::memory(o, t, host_bytes),
    )?;
    Ok(Limits { cpus, memory_bytes })
}

/// The engine's knobs from the environment: `TRACKER_SECOND_COPIES` (0 or 1),
/// `TRACKER_KERNEL_BTF` (a path), `TRACKER_TEST_DROP_FORKS`, `_EXITS`, `_EXECS` (N);
/// other values leave a knob as it is.
fn knobs_of(get_env: GetEnv) -> Result<Knobs, String> {
    let every = |var: &str| -> Result<u32, String> {
        Ok(env_var(get_env, var)?
            .and_then(|v| v.trim().parse::<u32>().ok())
            .unwrap_or(0))
    };
    Ok(Knobs {
        second_copies: match env_var(get_env, "TRACKER_SECOND_COPIES")?.as_deref() {
            Some("1") => Some(true),
            Some("0") => Some(false),
            _ => None,
        },
        kernel_btf: get_env("TRACKER_KERNEL_BTF")
            .filter(|p| !p.is_empty())
            .map(PathBuf::from),
        drop_forks_every: every("TRACKER_TEST_DROP_FORKS")?,
        drop_exits_every: every("TRACKER_TEST_DROP_EXITS")?,
        drop_execs_every: every("TRACKER_TEST_DROP_EXECS")?,
    })
}

/// The tracker's nice value: the flag, the environment, the config file, or none.
fn renice_of(lay: &Layers, flag: Option<i32>, file: Option<i64>) -> Result<Option<i32>, String> {
    lay.pick(
        ("--renice", flag.map(|v| v.to_string()).as_deref()),
        Some("TRACKER_RENICE"),
        ("renice", file.map(|v| v.to_string())),
        values::nice,
    )
}

/// Applies the layers. `get_env` is `std::env::var_os` outside tests; clap has
/// already applied the environment to the flags that name a variable (checked
/// first by [`check_flag_env`]).
/// The starter's two pipes (`TRACKER_READY_FD`, `TRACKER_ROOT_CHILDREN_FD`),
/// never one descriptor for both: the ready line closes its pipe, and the number
/// would then name whatever the tracker opens next.
fn starter_pipes(get_env: GetEnv) -> Result<(Option<i32>, Option<i32>), String> {
    let ready = env_fd(get_env, "TRACKER_READY_FD")?;
    let children = env_fd(get_env, "TRACKER_ROOT_CHILDREN_FD")?;
    match (ready, children) {
        (Some(r), Some(c)) if r == c => Err(format!(
            "TRACKER_READY_FD and TRACKER_ROOT_CHILDREN_FD are both fd {r}: each needs a pipe of its own"
        )),
        _ => Ok((ready, children)),
    }
}

pub fn resolve(cli: Cli, get_env: GetEnv) -> Result<Settings, String> {
    let (opts, cmd) = match cli.command {
        Some(Command::Run { opts, cmd }) => (opts, cmd),
        Some(Command::Node(_) | Command::Report(_)) => {
            return Err("node and report settings are resolved by resolve_job".into())
        }
        None => (cli.opts, cli.cmd),
    };
    let (cfg, config_file, cname) = config_of(&opts)?;
    let tr = &cfg.tracker;
    let in_file = |key: &str| format!("config file {cname}: [tracker] {key}");
    let meta = meta_of(&opts, &cfg, &cname)?;

    let lay = Layers {
        get_env,
        in_file: &in_file,
    };
    let interval = interval_of(&lay, opts.interval.as_deref(), tr.interval_secs)?;
    let format = format_of(opts.format.as_deref(), tr.format.as_deref(), &in_file)?;
    let tail = tail_of(&lay, opts.tail_timeout.as_deref(), tr.tail_timeout_secs)?;
    let discover = switch(opts.discover, get_env, "TRACKER_DISCOVER", tr.discover)?;
    let share_identity = switch(
        opts.share_identity,
        get_env,
        "TRACKER_SHARE_IDENTITY",
        tr.share_identity,
    )?;
    let sentinel = streaming_of(&lay, tr.upload_interval_secs)?;
    let otlp = otlp_of(get_env, opts.otlp_endpoint.as_deref(), tr, &in_file)?;
    let output = opts.output.clone().or(tr.output.clone());
    let renice = renice_of(&lay, opts.renice, tr.renice)?;
    let aggregate_cpu_steal = match opts.aggregate_cpu_steal {
        Some(v) => v,
        None => env_bool(get_env, "TRACKER_AGGREGATE_CPU_STEAL")?
            .or(tr.aggregate_cpu_steal)
            .unwrap_or(true),
    };
    values::distinct_files(&[
        ("-o", output.as_deref()),
        ("--summary", opts.summary.as_deref()),
        ("--events", opts.events.as_deref()),
        ("--report", opts.report.as_deref()),
        ("the config file", config_file.as_deref()),
    ])?;
    let keeper = keeper_of(&opts, get_env, tr)?;
    if opts.events.is_some() && opts.no_ebpf {
        return Err(EVENTS_NEED_EBPF.into());
    }
    let target = target(&opts, cmd, cfg.pid, &cname)?;
    let limits = limits_of(&lay, &opts, tr)?;
    if limits.any() && !matches!(target, Target::Command(_)) {
        return Err(
            "--cpus and --memory limit a command the tracker starts (run -- CMD), not a running tree or the host"
                .into(),
        );
    }
    let (ready_fd, root_children_fd) = starter_pipes(get_env)?;
    Ok(Settings {
        target,
        limits,
        interval,
        format,
        output,
        quiet: switch(opts.quiet, get_env, "TRACKER_QUIET", tr.quiet)?,
        summary: opts.summary.clone(),
        events: opts.events.clone(),
        meta,
        engine: EngineSettings {
            no_ebpf: opts.no_ebpf,
            max_tasks: opts.max_tasks,
            ring_bytes: opts.event_ring_kib * 1024,
            bpf_stats: opts.bpf_stats,
            pss: opts.pss,
            knobs: knobs_of(get_env)?,
        },
        as_root: opts.as_root,
        discover,
        share_identity,
        sentinel,
        otlp,
        metadata: values::endpoints(get_env)?,
        config_file,
        renice,
        aggregate_cpu_steal,
        report: opts.report.clone(),
        keeper,
        stop_with_parent: env_bool(get_env, "TRACKER_STOP_WITH_PARENT")?.unwrap_or(false),
        parent_pid: values::env_pid(get_env, "TRACKER_PARENT_PID")?,
        ready_fd,
        root_children_fd,
        tail_timeout: Duration::from_secs_f64(tail),
    })
}

#[cfg(test)]
mod tests;
