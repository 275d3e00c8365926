//! Limits for the command's tree (`run --cpus N --memory SIZE`), so that a
//! recommendation can be run before it is shipped: the memory limit goes on the
//! command's memory cgroup (v2 `memory.max`, v1 `memory.limit_in_bytes`, swap
//! held to the same where the kernel accounts it), the CPU quota on the v2 cgroup
//! the command is in where `cpu` is delegated to it (`cpu.max`), else on a v1
//! `cpu` cgroup made for it (`cpu.cfs_quota_us`). At the end, what the limits did:
//! the memory cgroup's own count of OOM kills and the time the quota throttled it.

use std::{
    io::{self, Write as _},
    os::unix::fs::OpenOptionsExt as _,
    path::{Path, PathBuf},
};

use super::{
    files::{keyed, Roots},
    memcg::{Controller, TreeCgroup},
};
use crate::model::summary::LimitsReport;

/// What the user asked for; filled by the settings.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Limits {
    pub cpus: Option<f64>,
    pub memory_bytes: Option<u64>,
}

impl Limits {
    pub fn any(&self) -> bool {
        self.cpus.is_some() || self.memory_bytes.is_some()
    }
}

/// The period a quota is a share of, µs (the kernel's default).
const PERIOD_US: u64 = 100_000;

/// The limits in place: where each one is, to read what it did at the end.
pub struct Limited {
    asked: Limits,
    /// The memory cgroup's directory and whether it is v2.
    memory: Option<(PathBuf, bool)>,
    /// The cgroup that holds the quota and whether it is v2.
    quota: Option<(PathBuf, bool)>,
    /// A v1 `cpu` cgroup made for the quota alone (removed when dropped).
    _own: Option<TreeCgroup>,
}

/// Why a limit could not be put in place: the command must not run then.
#[derive(Debug)]
pub enum LimitError {
    /// No cgroup of the command can take the limit (`limit`: which), and why.
    NoCgroup { limit: &'static str, why: String },
    /// The limit's file could not be written.
    Write {
        path: PathBuf,
        value: String,
        error: io::Error,
    },
}

impl std::fmt::Display for LimitError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            LimitError::NoCgroup { limit, why } => {
                write!(f, "no cgroup of the command takes a {limit} ({why})")
            }
            LimitError::Write { path, value, error } => {
                write!(f, "cannot write {value} to {}: {error}", path.display())
            }
        }
    }
}

/// Writes `value` to the cgroup file `dir/name`.
fn write(dir: &Path, name: &str, value: &str) -> Result<(), LimitError> {
    let path = dir.join(name);
    std::fs::OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&path)
        .and_then(|mut f| f.write_all(value.as_bytes()))
        .map_err(|error| LimitError::Write {
            path,
            value: value.to_string(),
            error,
        })
}

/// The quota line of a CPU limit: µs a period.
fn quota_us(cpus: f64) -> u64 {
    ((cpus * PERIOD_US as f64).round() as u64).max(1000)
}

/// Puts `asked` on the command (`pid`, paused) in `memory` (its memory cgroup)
/// and `cpu` (its CPU cgroup, where it has one of its own). An error says which
/// limit could not be put in place and why: the command must not run then.
pub fn apply(
    pid: u32,
    asked: Limits,
    roots: &Roots,
    memory: Option<&TreeCgroup>,
    cpu: Option<&TreeCgroup>,
) -> Result<Limited, LimitError> {
    let mut done = Limited {
        asked,
        memory: None,
        quota: None,
        _own: None,
    };
    if let Some(bytes) = asked.memory_bytes {
        let cg = memory.ok_or(LimitError::NoCgroup {
            limit: "memory limit",
            why: "none could be made for its memory".into(),
        })?;
        let (dir, v2) = (cg.dir(), cg.is_v2());
        let (limit, swap) = if v2 {
            ("memory.max", "memory.swap.max")
        } else {
            ("memory.limit_in_bytes", "memory.memsw.limit_in_bytes")
        };
        let text = bytes.to_string();
        write(dir, limit, &text)?;
        // Swap would let the job pass a limit it does not fit: held to none (v2)
        // or to the limit itself (v1's memory + swap), where the kernel keeps it.
        if dir.join(swap).exists() {
            write(dir, swap, if v2 { "0" } else { &text })?;
        }
        done.memory = Some((dir.to_path_buf(), v2));
    }
    if let Some(cpus) = asked.cpus {
        let q = quota_us(cpus);
        let v2_holder = [memory, cpu]
            .into_iter()
            .flatten()
            .find(|cg| cg.is_v2() && cg.dir().join("cpu.max").exists());
        match v2_holder {
            Some(cg) => {
                write(cg.dir(), "cpu.max", &format!("{q} {PERIOD_US}"))?;
                done.quota = Some((cg.dir().to_path_buf(), true));
            }
            None => {
                let cg = TreeCgroup::make_for(roots, Controller::Quota)
                    .and_then(|cg| cg.place(pid).map(|()| cg))
                    .map_err(|e| LimitError::NoCgroup {
                        limit: "CPU quota",
                        why: format!("v2 without `cpu` delegated, and v1: {e}"),
                    })?;
                write(cg.dir(), "cpu.cfs_period_us", &PERIOD_US.to_string())?;
                write(cg.dir(), "cpu.cfs_quota_us", &q.to_string())?;
                done.quota = Some((cg.dir().to_path_buf(), false));
                done._own = Some(cg);
            }
        }
    }
    Ok(done)
}

impl Limited {
    /// What the limits did, read before their cgroups are removed.
    pub fn outcome(&self) -> LimitsReport {
        let read = |dir: &Path, name: &str| std::fs::read_to_string(dir.join(name)).ok();
        let oom_kills = self.memory.as_ref().and_then(|(dir, v2)| {
            let (file, key) = if *v2 {
                ("memory.events", "oom_kill")
            } else {
                ("memory.oom_control", "oom_kill")
            };
            keyed(&read(dir, file)?, key)
        });
        let stat = self
            .quota
            .as_ref()
            .and_then(|(dir, v2)| Some((read(dir, "cpu.stat")?, *v2)));
        let (periods, throttled_secs) = match &stat {
            Some((text, v2)) => (
                keyed(text, "nr_throttled"),
                if *v2 {
                    keyed(text, "throttled_usec").map(|us| us as f64 / 1e6)
                } else {
                    keyed(text, "throttled_time").map(|ns| ns as f64 / 1e9)
                },
            ),
            None => (None, None),
        };
        LimitsReport {
            cpus: self.asked.cpus,
            memory_mib: self.asked.memory_bytes.map(|b| b as f64 / 1048576.0),
            oom_kills,
            throttled_periods: periods,
            throttled_secs,
            escaped: None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn quota_and_counters() {
        assert_eq!(quota_us(1.0), 100_000);
        assert_eq!(quota_us(0.5), 50_000);
        assert_eq!(quota_us(0.001), 1000);
        let events = "low 0\nhigh 0\nmax 3\noom 1\noom_kill 1\noom_group_kill 0\n";
        assert_eq!(keyed(events, "oom_kill"), Some(1));
        assert_eq!(keyed(events, "oom"), Some(1));
        let v1 = "oom_kill_disable 0\nunder_oom 0\noom_kill 2\n";
        assert_eq!(keyed(v1, "oom_kill"), Some(2));
        assert_eq!(keyed(v1, "none"), None);
    }
}
