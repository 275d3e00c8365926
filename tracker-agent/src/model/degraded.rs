//! Named degradations: a figure that can no longer be exact is said, by a short
//! stable name and one line of detail, in every sample from the moment it stopped
//! being exact (totals are cumulative, so it never becomes exact again) and in the
//! summary. The run goes on; the names are for scripts, the detail for people.
//! docs/bad-input.md lists them with what each costs.

use serde::Serialize;

/// The task map was full: forks it had no room for are not tracked.
pub const MAP_FULL: &str = "map_full";
/// The event ring was full: records were lost (totals come from kernel counters).
pub const RING_FULL: &str = "ring_full";
/// The kernel's BTF has no `task_struct.ioac` in the layout the programs read.
pub const NO_TASK_IO: &str = "no_task_io";
/// The kernel's BTF has no `task_struct.on_cpu`.
pub const NO_ON_CPU: &str = "no_on_cpu";
/// `sched_process_exit` passes no `group_dead`.
pub const NO_GROUP_DEAD: &str = "no_group_dead";
/// Running the probe program failed.
pub const PROBE_FAILED: &str = "probe_failed";
/// The kernel skipped runs of the programs (its recursion guard: the program was
/// already running on that CPU, preempted inside it).
pub const MISSED_RUNS: &str = "missed_runs";
/// Where tracepoints run preemptible, the kernel refused the programs' second
/// copies: the run goes on with the first.
pub const NO_SECOND_COPIES: &str = "no_second_copies";
/// Members whose task was freed before their final figures could be read.
pub const EXIT_UNREAD: &str = "exit_unread";
/// Members that had exited were still on a CPU when the final sample was due.
pub const SETTLE_TIMEOUT: &str = "settle_timeout";
/// Attached on procfs, the root's parent reaped it before its last figures were
/// read: its CPU since its last sighting is what the parent's account gained.
pub const ROOT_FROM_PARENT: &str = "root_from_parent";
/// Attached on procfs as root: the kernel dropped task exit records, so a
/// member that ended between two polls may be missing from the peak.
pub const EXITS_LOST: &str = "exits_lost";
/// Attached on procfs without CAP_NET_ADMIN: members' exits are not heard, and
/// the peak lacks what a member reached after its last poll.
pub const EXITS_UNHEARD: &str = "exits_unheard";
/// Σ PSS is the memory figure and some live members' smaps_rollup could not be
/// read (another user's processes): the figure is a lower bound.
pub const PSS_PARTIAL: &str = "pss_partial";

/// Under `--cpus`/`--memory`, a member left the cgroup that holds the limits:
/// they did not hold for it.
pub const LIMIT_ESCAPED: &str = "limit_escaped";

/// Sentinel's spool file failed (full, read-only): batches past the memory limit
/// went to kept files or memory instead.
pub const SPOOL_FAILED: &str = "spool_failed";

/// The event ring could not be read any more.
pub const RING_UNREAD: &str = "ring_unread";
/// Procfs instead of eBPF, by the reason eBPF could not load (not `--no-ebpf`,
/// which the user chose).
pub const EBPF_NO_BTF: &str = "ebpf_no_btf";
pub const EBPF_NO_PRIVILEGE: &str = "ebpf_no_privilege";
pub const EBPF_PID_NAMESPACE: &str = "ebpf_pid_namespace";
pub const EBPF_LOAD_FAILED: &str = "ebpf_load_failed";

/// Every name, for the documentation's check.
#[cfg(test)]
pub const ALL: [&str; 21] = [
    MAP_FULL,
    EXIT_UNREAD,
    RING_FULL,
    RING_UNREAD,
    PROBE_FAILED,
    MISSED_RUNS,
    NO_SECOND_COPIES,
    SETTLE_TIMEOUT,
    ROOT_FROM_PARENT,
    EXITS_LOST,
    EXITS_UNHEARD,
    PSS_PARTIAL,
    LIMIT_ESCAPED,
    NO_TASK_IO,
    NO_ON_CPU,
    NO_GROUP_DEAD,
    EBPF_NO_BTF,
    EBPF_NO_PRIVILEGE,
    EBPF_PID_NAMESPACE,
    EBPF_LOAD_FAILED,
    SPOOL_FAILED,
];

/// One named degradation.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Degradation {
    /// Short, stable, `snake_case`: what scripts match on.
    pub name: &'static str,
    /// One line: what is no longer exact, and why.
    pub detail: String,
}

/// The run's degradations, each name once, in the order they first happened.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Degradations(Vec<Degradation>);

impl Degradations {
    /// Adds `name`, or replaces its detail (a count that grew, say).
    pub fn set(&mut self, name: &'static str, detail: impl Into<String>) {
        let detail = detail.into();
        match self.0.iter_mut().find(|d| d.name == name) {
            Some(d) => d.detail = detail,
            None => self.0.push(Degradation { name, detail }),
        }
    }

    /// Adds every entry of `other` (theirs win for a name both have).
    pub fn merge(&mut self, other: &Degradations) {
        for d in &other.0 {
            self.set(d.name, d.detail.clone());
        }
    }

    pub fn has(&self, name: &str) -> bool {
        self.0.iter().any(|d| d.name == name)
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    pub fn list(&self) -> &[Degradation] {
        &self.0
    }

    pub fn into_vec(self) -> Vec<Degradation> {
        self.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_entry_per_name_latest_detail_first_order() {
        let mut d = Degradations::default();
        d.set(RING_FULL, "3 records lost");
        d.set(MAP_FULL, "1 task");
        d.set(RING_FULL, "5 records lost");
        let names: Vec<_> = d.list().iter().map(|x| x.name).collect();
        assert_eq!(names, [RING_FULL, MAP_FULL]);
        assert_eq!(d.list()[0].detail, "5 records lost");
        let mut e = Degradations::default();
        e.set(NO_TASK_IO, "x");
        e.merge(&d);
        assert_eq!(e.list().len(), 3);
        assert!(e.has(MAP_FULL) && !e.has(PROBE_FAILED));
    }

    /// docs/bad-input.md's "Degraded figures" table and docs/schema.md's list name
    /// every degradation, and nothing else.
    #[test]
    fn docs_name_every_degradation() {
        let doc = include_str!("../../../docs/bad-input.md");
        let start = doc.find("## Degraded figures").expect("section");
        let mut named = std::collections::BTreeSet::new();
        for line in doc[start..].lines().filter(|l| l.starts_with("| `")) {
            let first = line.split('|').nth(1).unwrap_or_default();
            named.extend(first.split('`').skip(1).step_by(2).map(str::to_string));
        }
        let all: std::collections::BTreeSet<String> = ALL.iter().map(|s| s.to_string()).collect();
        assert_eq!(named, all, "docs/bad-input.md, Degraded figures");
        let schema = include_str!("../../../docs/schema.md");
        let line = schema
            .lines()
            .find(|l| l.starts_with("| `tracker.degraded[].name`"))
            .expect("schema row");
        for n in ALL {
            assert!(line.contains(&format!("`{n}`")), "docs/schema.md lacks {n}");
        }
    }
}
