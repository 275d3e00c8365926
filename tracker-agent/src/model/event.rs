//! The tree's process events, as the `--events` file and the report's timeline
//! show them, and the commands that used the most CPU among those that exited.

use std::collections::HashMap;

use serde::Serialize;

use super::{report::ProcEventIn, summary::TopCommand};

/// One process-lifecycle record, from the eBPF ring buffer.
#[derive(Clone, Debug, Serialize)]
pub struct ProcEvent {
    pub kind: &'static str,
    pub pid: u32,
    pub ppid: u32,
    pub comm: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cpu_secs: Option<f64>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<i32>,
    /// Seconds since boot (CLOCK_MONOTONIC).
    pub monotonic_secs: f64,
    /// The same moment in unix seconds (set where the events are shown).
    pub timestamp_secs: f64,
}

impl ProcEvent {
    /// As the report's timeline reads it.
    pub fn as_in(&self) -> ProcEventIn<'_> {
        ProcEventIn {
            kind: self.kind,
            pid: self.pid,
            ppid: self.ppid,
            comm: &self.comm,
            cpu_secs: self.cpu_secs,
            exit_code: self.exit_code,
            timestamp_secs: self.timestamp_secs,
        }
    }
}

/// Distinct command names counted; past it only the names already seen grow.
const MAX_COMMS: usize = 10_000;
/// Commands listed in the summary.
const TOP: usize = 5;

/// Per command name: exited processes and their CPU (ns).
#[derive(Default)]
pub struct TopCommands(HashMap<String, (u64, u64)>);

impl TopCommands {
    pub fn add(&mut self, ev: &ProcEvent) {
        if ev.kind == "exit" && (self.0.len() < MAX_COMMS || self.0.contains_key(&ev.comm)) {
            let e = self.0.entry(ev.comm.clone()).or_default();
            e.0 += 1;
            e.1 += (ev.cpu_secs.unwrap_or(0.0) * 1e9) as u64;
        }
    }

    /// The commands with the most CPU, most first.
    pub fn top(self) -> Vec<TopCommand> {
        let mut top: Vec<TopCommand> = self
            .0
            .into_iter()
            .map(|(comm, (n, ns))| TopCommand {
                comm,
                processes: n,
                cpu_secs: ns as f64 / 1e9,
            })
            .collect();
        top.sort_by(|a, b| b.cpu_secs.total_cmp(&a.cpu_secs));
        top.truncate(TOP);
        top
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exit(comm: &str, cpu: f64) -> ProcEvent {
        ProcEvent {
            kind: "exit",
            pid: 1,
            ppid: 0,
            comm: comm.into(),
            cpu_secs: Some(cpu),
            exit_code: Some(0),
            monotonic_secs: 0.0,
            timestamp_secs: 0.0,
        }
    }

    #[test]
    fn top_commands_by_cpu_of_exited_processes() {
        let mut tops = TopCommands::default();
        for (c, cpu) in [("a", 1.0), ("b", 3.0), ("a", 1.5), ("c", 0.1), ("d", 0.2)] {
            tops.add(&exit(c, cpu));
        }
        tops.add(&ProcEvent {
            kind: "exec",
            ..exit("e", 9.0)
        });
        for (c, cpu) in [("f", 0.01), ("g", 0.02), ("h", 0.03)] {
            tops.add(&exit(c, cpu));
        }
        let top = tops.top();
        let names: Vec<(&str, u64)> = top.iter().map(|t| (t.comm.as_str(), t.processes)).collect();
        assert_eq!(names, [("b", 1), ("a", 2), ("d", 1), ("c", 1), ("h", 1)]);
        assert!((top[1].cpu_secs - 2.5).abs() < 1e-9);
    }
}
