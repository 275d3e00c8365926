//! Command-line interface. Both `resource-tracker run [FLAGS] -- cmd` and the seed's
//! `resource-tracker [FLAGS] [--] cmd` are accepted.

use std::{ffi::OsString, path::PathBuf};

use clap::{Args, Parser, Subcommand};

use crate::model::JobMeta;

#[derive(Parser, Debug, Clone)]
#[command(
    name = "resource-tracker",
    version,
    about = "eBPF-assisted Linux resource tracker for hosts and process trees",
    args_conflicts_with_subcommands = true,
    after_help = "Examples:\n  sudo resource-tracker run -- make -j8\n  resource-tracker --pid 1234 --interval 5\n  resource-tracker --summary s.json -- python train.py"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Option<Command>,
    #[command(flatten)]
    pub opts: Opts,
    /// Command to run and track (after `--`).
    #[arg(trailing_var_arg = true, value_name = "CMD")]
    pub cmd: Vec<OsString>,
}

// Parsed once and moved: the size of the larger variant does not matter.
#[allow(clippy::large_enum_variant)]
#[derive(Subcommand, Debug, Clone)]
pub enum Command {
    /// Run a command and track its whole process tree.
    // `run` tracks the command it starts: `--pid` is refused there, so not offered.
    #[command(mut_arg("pid", |a| a.hide(true)))]
    Run {
        #[command(flatten)]
        opts: Opts,
        #[arg(trailing_var_arg = true, required = true, value_name = "CMD")]
        cmd: Vec<OsString>,
    },
    /// Track every container cgroup on the node (Kubernetes node agent) until
    /// SIGTERM/SIGINT, from the kernel's cgroup accounting.
    Node(NodeOpts),
    /// Write a self-contained HTML report (charts, statistics, recommendations and
    /// the process timeline) from recorded runs: samples as JSON lines or CSV (this
    /// tool's or the Python resource-tracker's), each optionally followed by its
    /// `--events` and `--summary` files.
    Report(ReportOpts),
}

#[derive(Args, Debug, Clone)]
pub struct ReportOpts {
    /// Samples files (JSON lines or CSV), one run each; an events or summary file
    /// belongs to the samples file before it.
    #[arg(required = true, value_name = "FILE")]
    pub files: Vec<PathBuf>,
    /// The HTML file to write [default: report.html].
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// Ask Spare Cores Keeper for the cheapest server that fits the recommendation
    /// (network; env TRACKER_RECOMMEND_SERVER, TRACKER_KEEPER_URL).
    #[arg(long)]
    pub recommend_server: bool,
    /// The page's title [default: "resource-tracker report: " and the run's file name].
    #[arg(long, value_name = "TEXT")]
    pub title: Option<String>,
    /// How the run stands, shown beside the title: pending (still running), finished
    /// or failed [default: from the run's summary file, finished or failed by its exit
    /// code; none without one].
    #[arg(long, value_parser = ["pending", "finished", "failed"])]
    pub status: Option<String>,
    /// Whose terms the page's hints use: cli (the tracker's flags) or python (the
    /// Python package's arguments; the package passes it).
    #[arg(long, value_parser = ["cli", "python"], default_value = "cli")]
    pub hints: String,
}

#[derive(Args, Debug, Clone)]
pub struct NodeOpts {
    /// Serve Prometheus /metrics and /healthz on ADDR (host:port, e.g. 0.0.0.0:9101);
    /// env TRACKER_LISTEN.
    #[arg(long, value_name = "ADDR", env = "TRACKER_LISTEN")]
    pub listen: Option<String>,
    /// Seconds between readings of the cgroups (fractions allowed, at least 0.1)
    /// [default: 1].
    #[arg(short = 'i', long, value_name = "SECS", allow_hyphen_values = true)]
    pub interval: Option<String>,
    /// Write one JSON line per container per interval to FILE.
    #[arg(short = 'o', long, value_name = "FILE")]
    pub output: Option<PathBuf>,
    /// The host's /sys, where it is mounted in the agent's container
    /// [default: $HOST_ROOT/sys, else /sys].
    #[arg(long, value_name = "DIR")]
    pub host_sys: Option<PathBuf>,
    /// Also track the cgroups whose path below the hierarchy root matches PATTERN
    /// (`*` within one path component, e.g. `system.slice/*.service`); repeatable.
    #[arg(long, value_name = "PATTERN")]
    pub include: Vec<String>,
    /// The kubelet whose /pods names the containers (namespace, pod, container,
    /// image) [default: https://$HOST_IP:10250 when HOST_IP is set]; env
    /// TRACKER_KUBELET_URL.
    #[arg(long, value_name = "URL", env = "TRACKER_KUBELET_URL")]
    pub kubelet_url: Option<String>,
    /// Bearer token file for the kubelet [default: the pod's service account token,
    /// when present].
    #[arg(long, value_name = "FILE")]
    pub kubelet_token_file: Option<PathBuf>,
    /// CA bundle for the kubelet's certificate [default: the service account's
    /// ca.crt, when present].
    #[arg(long, value_name = "FILE")]
    pub kubelet_ca_file: Option<PathBuf>,
    /// Accept any kubelet certificate (kubelets often serve a self-signed one).
    #[arg(long)]
    pub kubelet_insecure_tls: bool,
    /// Do not load the BPF programs that count each container's processes (the
    /// cgroup figures stay).
    #[arg(long)]
    pub no_ebpf: bool,
    /// Serve cAdvisor's names (`container_*`) for the series cAdvisor also has, for
    /// a Prometheus that scrapes no kubelet [default: `resource_tracker_container_*`,
    /// never the same series as the kubelet's]; env TRACKER_CADVISOR_NAMES.
    #[arg(long)]
    pub cadvisor_names: bool,
}

#[derive(Args, Debug, Clone)]
pub struct Opts {
    /// Root PID of a running process tree to track.
    #[arg(short = 'p', long, value_name = "PID", allow_negative_numbers = true)]
    pub pid: Option<i64>,
    /// Seconds between samples (fractions allowed, at least 0.1) [default: 1].
    #[arg(short = 'i', long, value_name = "SECS", allow_hyphen_values = true)]
    pub interval: Option<String>,
    /// TOML config file [default: resource-tracker.toml, skipped when absent].
    #[arg(short = 'c', long, value_name = "FILE")]
    pub config: Option<PathBuf>,
    /// Seconds to wait, once the command has exited, for the rest of its tree to
    /// finish (0: end with the command; at most 86400) [default: 2]; env
    /// TRACKER_TAIL_TIMEOUT, [tracker] tail_timeout_secs.
    #[arg(long, value_name = "SECS", allow_hyphen_values = true)]
    pub tail_timeout: Option<String>,
    /// Run the command under a CPU quota of N CPUs (fractions allowed), to try a
    /// recommendation before shipping it; env TRACKER_CPUS, [tracker] cpus.
    #[arg(long, value_name = "N", allow_hyphen_values = true)]
    pub cpus: Option<String>,
    /// Run the command under a memory limit of SIZE (MiB, or with K, M, G, T);
    /// env TRACKER_MEMORY, [tracker] memory.
    #[arg(long, value_name = "SIZE", allow_hyphen_values = true)]
    pub memory: Option<String>,
    /// Output format [default: json].
    #[arg(short = 'f', long, value_parser = ["json", "csv"])]
    pub format: Option<String>,
    /// Write samples to FILE instead of stderr.
    #[arg(short = 'o', long, value_name = "FILE", env = "TRACKER_OUTPUT")]
    pub output: Option<PathBuf>,
    /// No samples and no summary on the terminal; env TRACKER_QUIET, [tracker] quiet.
    #[arg(short = 'q', long)]
    pub quiet: bool,
    /// Nice value of the tracker itself, -20 to 19 (bare: 19); the command keeps its
    /// own. Env TRACKER_RENICE, [tracker] renice.
    #[arg(short = 'r', long, value_name = "VALUE", num_args = 0..=1, default_missing_value = "19",
          allow_negative_numbers = true, value_parser = clap::value_parser!(i32).range(-20..=19))]
    pub renice: Option<i32>,
    /// true: cpu.per_core_steal_time_pct is empty and only the host's steal is
    /// given [default: true]; env TRACKER_AGGREGATE_CPU_STEAL, [tracker]
    /// aggregate_cpu_steal.
    #[arg(long, value_name = "BOOL")]
    pub aggregate_cpu_steal: Option<bool>,
    #[command(flatten)]
    pub meta: JobMeta,
    /// Tag the run; repeatable.
    #[arg(long, value_name = "KEY=VALUE")]
    pub tag: Vec<String>,
    /// Write the run summary as one JSON object to FILE.
    #[arg(long, value_name = "FILE")]
    pub summary: Option<PathBuf>,
    /// Write every process fork/exec/exit of the tree as JSON lines to FILE (eBPF only).
    #[arg(long, value_name = "FILE")]
    pub events: Option<PathBuf>,
    /// Write a self-contained HTML report of the run to FILE at its end (charts,
    /// statistics, recommendations, and the process timeline with eBPF).
    #[arg(long, value_name = "FILE")]
    pub report: Option<PathBuf>,
    /// Ask Spare Cores Keeper for the cheapest server that fits the recommendation
    /// (in the summary and the report); env TRACKER_RECOMMEND_SERVER, [tracker]
    /// recommend_server.
    #[arg(long)]
    pub recommend_server: bool,
    /// Export the metrics over OTLP/HTTP (protobuf) to the collector at URL
    /// (its base; `/v1/metrics` is appended), as OTEL_EXPORTER_OTLP_ENDPOINT does;
    /// [tracker] otlp_endpoint. The other OTEL_* variables apply (docs/otlp.md).
    #[arg(long, value_name = "URL")]
    pub otlp_endpoint: Option<String>,
    /// Do not use eBPF; poll /proc instead.
    #[arg(long)]
    pub no_ebpf: bool,
    /// Under sudo, run the command as root instead of the invoking user, and write
    /// the output files as root.
    #[arg(long)]
    pub as_root: bool,
    /// Also report Σ PSS of the tree in every sample where a cgroup is the memory
    /// source (reads smaps_rollup; costs more). Without a cgroup it is the source.
    #[arg(long)]
    pub pss: bool,
    /// Enable the kernel's BPF run-time statistics to report the programs' own cost.
    #[arg(long)]
    pub bpf_stats: bool,
    /// Probe the cloud metadata services even without SENTINEL_API_TOKEN (the result
    /// goes into the summary); env TRACKER_DISCOVER, [tracker] discover.
    #[arg(long)]
    pub discover: bool,
    /// Send identifying host data (host id, hostname, IP, cloud account) to Sentinel;
    /// env TRACKER_SHARE_IDENTITY, [tracker] share_identity.
    #[arg(long)]
    pub share_identity: bool,
    /// Capacity of the kernel task map (threads of the tree alive at once), from 64
    /// to 4194304; never more than kernel.pid_max, which no tree can fill.
    #[arg(long, value_name = "N", default_value_t = tracker_common::DEFAULT_MAX_TASKS, allow_negative_numbers = true,
          value_parser = clap::value_parser!(u32).range(64..=4_194_304))]
    pub max_tasks: u32,
    /// Size of the kernel's event ring in KiB: a power of two from 4 to 262144. A
    /// ring too small for a burst of exits loses records (counted in lost_events),
    /// never totals.
    #[arg(long, value_name = "KIB", default_value_t = tracker_common::EVENTS_BYTES / 1024, value_parser = ring_kib, allow_negative_numbers = true)]
    pub event_ring_kib: u32,
}

fn ring_kib(s: &str) -> Result<u32, String> {
    let v: u32 = s
        .parse()
        .map_err(|_| format!("'{s}' is not a whole number of KiB"))?;
    if v.is_power_of_two() && (4..=262_144).contains(&v) {
        Ok(v)
    } else {
        Err(format!("{v} KiB is not a power of two from 4 to 262144"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Each flag's help says what that flag does: a word of its own subject is in
    /// it, and no two flags share a help line. A new flag needs its word here.
    #[test]
    fn every_flag_has_its_own_help() {
        use clap::CommandFactory as _;
        let subject = [
            ("pid", "PID"),
            ("interval", "between samples"),
            ("tail_timeout", "rest of its tree"),
            ("cpus", "CPU quota"),
            ("memory", "memory limit"),
            ("config", "config"),
            ("format", "format"),
            ("output", "samples to FILE"),
            ("quiet", "terminal"),
            ("renice", "Nice value"),
            ("aggregate_cpu_steal", "steal"),
            ("tag", "Tag"),
            ("summary", "summary"),
            ("events", "fork/exec/exit"),
            ("no_ebpf", "eBPF"),
            ("as_root", "root"),
            ("pss", "PSS"),
            ("bpf_stats", "statistics"),
            ("discover", "metadata"),
            ("share_identity", "identifying"),
            ("max_tasks", "task map"),
            ("event_ring_kib", "event ring"),
            ("report", "HTML report"),
            ("recommend_server", "Keeper"),
            ("otlp_endpoint", "OTLP"),
        ];
        // The job metadata flags come from one struct (a new field needs no entry
        // here): each needs a help line of its own, not a listed word.
        let meta: Vec<String> = JobMeta::augment_args(clap::Command::new("m"))
            .get_arguments()
            .map(|a| a.get_id().to_string())
            .collect();
        assert!(meta.len() >= 11, "{meta:?}");
        for cmd in [
            Cli::command(),
            Cli::command().find_subcommand("run").unwrap().clone(),
        ] {
            let mut seen = std::collections::HashSet::new();
            for a in cmd.get_arguments().filter(|a| a.get_long().is_some()) {
                let id = a.get_id().as_str();
                if ["help", "version"].contains(&id) {
                    continue;
                }
                let help = a.get_help().map(|h| h.to_string()).unwrap_or_default();
                if meta.iter().any(|m| m == id) {
                    assert!(help.len() > 8, "--{id}: {help:?}");
                    assert!(seen.insert(help.clone()), "--{id}: help shared: {help:?}");
                    continue;
                }
                let word = subject
                    .iter()
                    .find(|(f, _)| *f == id)
                    .map(|(_, w)| *w)
                    .unwrap_or_else(|| panic!("--{}: no subject word listed", id));
                assert!(
                    help.contains(word),
                    "--{id}: {help:?} does not say {word:?}"
                );
                assert!(seen.insert(help.clone()), "--{id}: help shared: {help:?}");
            }
            assert_eq!(seen.len(), subject.len() + meta.len());
        }
    }

    #[test]
    fn both_forms_parse() {
        let c = Cli::try_parse_from(["rt", "run", "-i", "0.5", "--", "sleep", "1"]).unwrap();
        assert!(matches!(c.command, Some(Command::Run { ref cmd, .. }) if cmd.len() == 2));
        let c = Cli::try_parse_from(["rt", "--interval", "2", "--", "ls", "-l"]).unwrap();
        assert_eq!(c.cmd, vec![OsString::from("ls"), OsString::from("-l")]);
        let c = Cli::try_parse_from(["rt", "timeout", "5s", "sha512sum", "/dev/zero"]).unwrap();
        assert_eq!(c.cmd.len(), 4);
        let c = Cli::try_parse_from(["rt", "-q", "ls", "-l", "--all"]).unwrap();
        assert_eq!(c.cmd.len(), 3);
        assert!(Cli::try_parse_from(["rt", "--bogus"]).is_err());
        assert!(Cli::try_parse_from(["rt", "run"]).is_err());
    }
}
