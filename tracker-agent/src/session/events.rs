//! Where the tree's process events go: the `--events` file and the top commands.

use std::{
    collections::HashMap,
    fs::File,
    io::{BufWriter, Write},
};

use crate::{
    engine::ProcEvent,
    fsafe::Owner,
    model::{report::ProcEventIn, TopCommand},
    sink::{self, report::TimelineFeed},
    warn::say,
};

/// Distinct command names counted; past it only the names already seen grow.
const MAX_COMMS: usize = 10_000;
/// Commands listed in the summary.
const TOP: usize = 5;

pub struct EventLog {
    file: Option<BufWriter<File>>,
    /// Whose a file kept instead is, under sudo.
    owner: Option<Owner>,
    /// Whether the file is already the one kept instead.
    kept: bool,
    /// Per command name: exited processes and their CPU (ns).
    tops: HashMap<String, (u64, u64)>,
    /// The report's process timeline, with `--report`.
    timeline: Option<TimelineFeed>,
    /// Unix time − CLOCK_MONOTONIC, read once: events carry both.
    offset: f64,
}

/// Unix seconds minus monotonic seconds, now.
fn clock_offset() -> f64 {
    let mut ts = libc::timespec {
        tv_sec: 0,
        tv_nsec: 0,
    };
    // SAFETY: a valid out pointer.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    let mono = ts.tv_sec as f64 + ts.tv_nsec as f64 / 1e9;
    crate::model::reading::unix_now() - mono
}

impl EventLog {
    pub fn new(
        file: Option<File>,
        owner: Option<Owner>,
        timeline: Option<TimelineFeed>,
    ) -> EventLog {
        EventLog {
            file: file.map(BufWriter::new),
            owner,
            kept: false,
            tops: HashMap::new(),
            timeline,
            offset: clock_offset(),
        }
    }

    pub fn show(&mut self, mut ev: ProcEvent) {
        ev.timestamp_secs = ((ev.monotonic_secs + self.offset) * 1e6).round() / 1e6;
        if let Some(t) = &self.timeline {
            if let Ok(mut t) = t.lock() {
                t.add(&ProcEventIn {
                    kind: ev.kind,
                    pid: ev.pid,
                    ppid: ev.ppid,
                    comm: &ev.comm,
                    cpu_secs: ev.cpu_secs,
                    exit_code: ev.exit_code,
                    timestamp_secs: ev.timestamp_secs,
                });
            }
        }
        if let Some(w) = self.file.as_mut() {
            if let Ok(mut line) = serde_json::to_string(&ev) {
                // One write of the whole line: a failure then leaves none of it in
                // the buffer, and the kept file gets it once.
                line.push('\n');
                if let Err(e) = w.write_all(line.as_bytes()) {
                    self.fail(e, &line);
                }
            }
        }
        if ev.kind == "exit" && (self.tops.len() < MAX_COMMS || self.tops.contains_key(&ev.comm)) {
            let e = self.tops.entry(ev.comm).or_default();
            e.0 += 1;
            e.1 += (ev.cpu_secs.unwrap_or(0.0) * 1e9) as u64;
        }
    }

    /// An attached tree's processes that were alive before tracking began: the
    /// timeline shows them from then on (the kernel sends no fork for them).
    pub fn seed_running(&mut self, pids: impl Iterator<Item = u32>) {
        let Some(t) = &self.timeline else { return };
        let Ok(mut t) = t.lock() else { return };
        let now = crate::model::reading::unix_now();
        let mut buf = String::new();
        for pid in pids {
            if crate::engine::procread::read_into(&format!("/proc/{pid}/stat"), &mut buf).is_none()
            {
                continue;
            }
            let comm = match (buf.find('('), buf.rfind(')')) {
                (Some(a), Some(b)) if a < b => buf[a + 1..b].to_string(),
                _ => continue,
            };
            let Some(st) = crate::engine::procread::parse_stat(&buf) else {
                continue;
            };
            t.add(&ProcEventIn {
                kind: "exec",
                pid,
                ppid: st.ppid,
                comm: &comm,
                cpu_secs: None,
                exit_code: None,
                timestamp_secs: now,
            });
        }
    }

    /// The file cannot be written: as the other outputs, the events go on in a
    /// file of their own in a private directory, named in one line (what the
    /// failed file still held unwritten first, then `line`, whole with its line
    /// break, or empty); where that fails too, the run goes on without them.
    fn fail(&mut self, e: std::io::Error, line: &str) {
        let unwritten = self.file.take().map(|w| {
            let (_, rest) = w.into_parts();
            rest.unwrap_or_default()
        });
        const STOPS: &str = "the command goes on; no more events are written";
        if self.kept {
            return say(format_args!("writing the events file: {e} ({STOPS})"));
        }
        let moved = sink::fallback_file("events.jsonl", self.owner.as_ref()).and_then(|(f, p)| {
            let mut w = BufWriter::new(f);
            w.write_all(&unwritten.unwrap_or_default())?;
            w.write_all(line.as_bytes())?;
            Ok((w, p))
        });
        match moved {
            Ok((w, p)) => {
                say(format_args!(
                    "writing the events file: {e}; continued in {}",
                    p.display()
                ));
                self.file = Some(w);
                self.kept = true;
            }
            Err(k) => say(format_args!(
                "writing the events file: {e}; nor a private file instead: {k} ({STOPS})"
            )),
        }
    }

    /// Flushes the file; the commands with the most CPU, most first.
    pub fn finish(mut self) -> Vec<TopCommand> {
        if let Some(Err(e)) = self.file.as_mut().map(|w| w.flush()) {
            self.fail(e, "");
            if let Some(Err(e)) = self.file.as_mut().map(|w| w.flush()) {
                self.fail(e, "");
            }
        }
        top_commands(self.tops)
    }
}

fn top_commands(tops: HashMap<String, (u64, u64)>) -> Vec<TopCommand> {
    let mut top: Vec<TopCommand> = tops
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
        let mut log = EventLog::new(None, None, None);
        for (c, cpu) in [("a", 1.0), ("b", 3.0), ("a", 1.5), ("c", 0.1), ("d", 0.2)] {
            log.show(exit(c, cpu));
        }
        log.show(ProcEvent {
            kind: "exec",
            ..exit("e", 9.0)
        });
        for (c, cpu) in [("f", 0.01), ("g", 0.02), ("h", 0.03)] {
            log.show(exit(c, cpu));
        }
        let top = log.finish();
        let names: Vec<(&str, u64)> = top.iter().map(|t| (t.comm.as_str(), t.processes)).collect();
        assert_eq!(names, [("b", 1), ("a", 2), ("d", 1), ("c", 1), ("h", 1)]);
        assert!((top[1].cpu_secs - 2.5).abs() < 1e-9);
    }
}
