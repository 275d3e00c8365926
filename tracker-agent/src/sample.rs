//! The one sample model. Every output (JSON lines now; CSV, Sentinel and the summary
//! later) is written from these types. Documented field by field in docs/schema.md.

use serde::Serialize;

#[derive(Clone, Debug, Serialize)]
pub struct Sample {
    /// Unix time of the reading, microsecond precision.
    pub timestamp_secs: f64,
    /// Measured length of the interval this sample covers.
    pub interval_secs: f64,
    pub job_name: Option<String>,
    pub cpu: CpuSample,
    /// The tracked process tree; null without `--pid` or a command.
    pub process: Option<ProcessSample>,
    pub tracker: TrackerSample,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct CpuSample {
    /// Cores used by the tracked tree over the interval (null without a tree).
    pub process_cores_used: Option<f64>,
    /// Live descendants of the root, the root excluded (null without a tree).
    pub process_child_count: Option<u64>,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct ProcessSample {
    pub pid: u32,
    /// `ebpf` or `procfs`.
    pub backend: &'static str,
    /// CPU of the whole tree in this interval, split into user and system time.
    pub utime_secs: f64,
    pub stime_secs: f64,
    /// CPU of the whole tree since tracking started (exited members included).
    pub cpu_secs_total: f64,
    pub processes_spawned: u64,
    pub processes_exited: u64,
    pub live_processes: u64,
    pub live_threads: u64,
    pub memory_rss_mib: f64,
    /// Only with `--pss` (reading smaps is expensive).
    pub memory_pss_mib: Option<f64>,
    /// Largest RSS of any single member so far.
    pub max_process_rss_mib: f64,
    /// Storage bytes read/written by the tree in this interval.
    pub read_bytes: u64,
    pub write_bytes: u64,
    pub root_alive: bool,
    /// New tasks the kernel could not record (task map full); 0 when exact.
    pub untracked_tasks: u64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct TrackerSample {
    /// The tracker's own CPU in this interval (user + system).
    pub cpu_secs: f64,
    pub rss_mib: f64,
    /// Run time of the BPF programs in this interval; null unless BPF statistics are on.
    pub bpf_run_time_secs: Option<f64>,
    pub bpf_run_count: Option<u64>,
    /// Events dropped by the ring buffer in this interval and in total (totals stay
    /// exact regardless: they are kept in kernel maps).
    pub lost_events: u64,
    pub lost_events_total: u64,
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;

    use serde_json::Value;

    use super::*;
    use crate::summary::{BpfProgram, RunStats, Summary, TopCommand};

    /// Dotted paths of every field of a JSON value (array items as `name[]`).
    fn paths(prefix: &str, v: &Value, out: &mut BTreeSet<String>) {
        match v {
            Value::Object(m) => {
                for (k, v) in m {
                    let p = if prefix.is_empty() {
                        k.clone()
                    } else {
                        format!("{prefix}.{k}")
                    };
                    out.insert(p.clone());
                    paths(&p, v, out);
                }
            }
            Value::Array(a) => {
                if let Some(first) = a.first() {
                    paths(&format!("{prefix}[]"), first, out);
                }
            }
            _ => {}
        }
    }

    /// Field names in the first column of the table under `## {section}`.
    fn documented(section: &str) -> BTreeSet<String> {
        let doc = include_str!("../../docs/schema.md");
        let start = doc.find(&format!("## {section}")).expect("section");
        let body = &doc[start + 3..];
        let end = body.find("\n## ").unwrap_or(body.len());
        body[..end]
            .lines()
            .filter_map(|l| l.strip_prefix("| `"))
            .filter_map(|l| l.split('`').next())
            .map(str::to_string)
            .collect()
    }

    #[test]
    fn schema_doc_matches_model() {
        let s = Sample {
            timestamp_secs: 1.0,
            interval_secs: 1.0,
            job_name: Some("j".into()),
            cpu: CpuSample {
                process_cores_used: Some(1.0),
                process_child_count: Some(1),
            },
            process: Some(ProcessSample {
                memory_pss_mib: Some(1.0),
                ..Default::default()
            }),
            tracker: TrackerSample {
                bpf_run_time_secs: Some(0.0),
                bpf_run_count: Some(0),
                ..Default::default()
            },
        };
        let mut got = BTreeSet::new();
        paths("", &serde_json::to_value(&s).unwrap(), &mut got);
        assert_eq!(
            got,
            documented("Sample"),
            "docs/schema.md (Sample) and sample.rs disagree"
        );

        let mut sum = Summary::build(
            &RunStats::default(),
            1.0,
            Some(0),
            "ebpf",
            None,
            vec![TopCommand {
                comm: "x".into(),
                processes: 1,
                cpu_secs: 0.0,
            }],
        );
        sum.bpf_programs.push(BpfProgram {
            name: "p".into(),
            run_count: 1,
            run_time_ns: 1,
        });
        let mut got = BTreeSet::new();
        paths("", &serde_json::to_value(&sum).unwrap(), &mut got);
        assert_eq!(
            got,
            documented("Run summary"),
            "docs/schema.md (Run summary) and summary.rs disagree"
        );
    }
}
