//! The run summary: a few human lines on stderr and, with `--summary FILE`, the
//! same as one JSON object.

use std::{
    fs::File,
    io::Write,
    path::{Path, PathBuf},
};

use anyhow::Context as _;

use super::base::{create_or_keep, fallback_file, Sink};
use crate::{
    fsafe::Owner,
    model::{Sample, Summary},
    warn::escaped,
};

pub struct SummaryOut {
    terminal: bool,
    file: Option<(File, String)>,
    /// The file the user named, as made here: removed if it could not be
    /// written whole (no empty or cut summary is left behind).
    made: Option<PathBuf>,
    owner: Option<Owner>,
}

impl SummaryOut {
    /// Creates the file before anything starts, so an unwritable path fails early.
    pub fn open(
        terminal: bool,
        path: Option<&Path>,
        owner: Option<&Owner>,
    ) -> anyhow::Result<SummaryOut> {
        let mut made = None;
        let file = path
            .map(|p| {
                create_or_keep(p, "summary", "summary.json", owner).map(|(f, kept)| {
                    let shown = kept.as_deref().unwrap_or(p);
                    made = Some(shown.to_path_buf());
                    (f, shown.display().to_string())
                })
            })
            .transpose()?;
        Ok(SummaryOut {
            terminal,
            file,
            made,
            owner: owner.cloned(),
        })
    }
}

impl Sink for SummaryOut {
    fn write(&mut self, _: &Sample) -> anyhow::Result<()> {
        Ok(())
    }

    fn finish(&mut self, summary: &mut Summary) -> anyhow::Result<()> {
        if std::mem::take(&mut self.terminal) {
            // A closed stderr loses these lines, nothing else. Each line is
            // escaped once more at the terminal, whatever its fields were.
            let text: String = human(summary).lines().map(|l| escaped(l) + "\n").collect();
            let _ = std::io::stderr().lock().write_all(text.as_bytes());
        }
        if let Some((f, name)) = self.file.as_mut() {
            serde_json::to_writer_pretty(&mut *f, &*summary)
                .with_context(|| format!("writing summary file {name}"))?;
            writeln!(f).with_context(|| format!("writing summary file {name}"))?;
        }
        Ok(())
    }

    fn fall_back(&mut self) -> Option<PathBuf> {
        let (failed, _) = self.file.as_ref()?;
        if let Some(p) = self.made.take() {
            remove_if_same(&p, failed);
        }
        let (f, path) = fallback_file("summary.json", self.owner.as_ref()).ok()?;
        self.file = Some((f, path.display().to_string()));
        Some(path)
    }
}

/// Removes `path` where it still names the file `f` (not a file put there
/// since): a summary that could not be written whole.
fn remove_if_same(path: &Path, f: &File) {
    use std::os::unix::fs::MetadataExt as _;
    let (Ok(open), Ok(there)) = (f.metadata(), std::fs::symlink_metadata(path)) else {
        return;
    };
    if (open.dev(), open.ino()) == (there.dev(), there.ino()) {
        let _ = std::fs::remove_file(path);
    }
}

/// The human lines.
fn human(sum: &Summary) -> String {
    let mut s = String::new();
    if sum.backend == "none" {
        s.push_str(&format!(
            "resource-tracker: host-wide sampling for {:.3}s, {} samples  observer cpu {:.1} ms, rss {:.1} MiB\n",
            sum.wall_secs,
            sum.samples,
            sum.tracker_cpu_secs * 1e3,
            sum.tracker_max_rss_mib
        ));
        return s;
    }
    let code = sum.exit_code.map_or("-".to_string(), |c| c.to_string());
    s.push_str(&format!(
        "resource-tracker: wall {:.3}s  cpu {:.3}s (user {:.3}s, sys {:.3}s)  avg {:.2} / peak {:.2} cores\n",
        sum.wall_secs, sum.cpu_total_secs, sum.cpu_user_secs, sum.cpu_system_secs, sum.avg_cores, sum.peak_cores
    ));
    s.push_str(&format!(
        "resource-tracker: processes {} spawned, {} exited, {} still running  peak memory {:.1} MiB ({})  io {} read / {} written\n",
        sum.processes_spawned,
        sum.processes_exited,
        sum.still_running,
        sum.peak_memory_mib,
        sum.memory_source.unwrap_or("rss"),
        human_bytes(sum.read_bytes),
        human_bytes(sum.write_bytes)
    ));
    let bpf = sum
        .bpf_run_time_secs
        .map_or(String::new(), |t| format!(", bpf {:.1} ms", t * 1e3));
    s.push_str(&format!(
        "resource-tracker: exit code {code}  backend {}  lost events {}  observer cpu {:.1} ms{bpf}, rss {:.1} MiB\n",
        sum.backend,
        sum.lost_events,
        sum.tracker_cpu_secs * 1e3,
        sum.tracker_max_rss_mib
    ));
    // What is not exact comes before what is derived from it.
    for d in &sum.degraded {
        s.push_str(&format!(
            "resource-tracker: degraded: {}: {}\n",
            d.name,
            escaped(&d.detail)
        ));
    }
    if let Some(r) = &sum.recommendation {
        s.push_str(&recommendation_lines(r));
    }
    if let Some(l) = &sum.limits {
        s.push_str(&limits_line(l));
    }
    if let Some(p) = &sum.pressure {
        s.push_str(&pressure_line(p, sum.wall_secs));
    }
    if !sum.top_commands.is_empty() {
        let tops: Vec<String> = sum
            .top_commands
            .iter()
            // A command's name is the tracked tree's to choose: no control
            // sequence of it reaches the terminal.
            .map(|t| format!("{} ×{} {:.3}s", escaped(&t.comm), t.processes, t.cpu_secs))
            .collect();
        s.push_str(&format!(
            "resource-tracker: top commands by cpu: {}\n",
            tops.join(", ")
        ));
    }
    s
}

/// The recommendation's lines: what it is, on what it is built, and its price.
fn recommendation_lines(r: &crate::model::stats::Recommendation) -> String {
    let mut s = String::new();
    let gpu = match (r.gpu, r.vram_mib) {
        (0, _) => "no GPU".to_string(),
        (g, v) => format!("{g} GPU, {v} MiB VRAM"),
    };
    let reread = r.page_cache_reread_mib.unwrap_or(0.0);
    let basis = crate::model::stats::basis_words(r.memory_basis, reread);
    s.push_str(&format!(
        "resource-tracker: recommended {} CPU, {} MiB memory ({basis} {:.0} MiB ×{}), {gpu}; {} server; {}\n",
        r.cpu,
        r.memory_mib,
        r.memory_basis_mib,
        crate::model::stats::MEMORY_MARGIN,
        r.allocation,
        r.metaflow
    ));
    if reread >= 1.0 {
        s.push_str(&format!(
            "resource-tracker: the advice holds {reread:.0} MiB of page cache the tree read back beyond its working set: under a smaller limit those reads go to storage again ({} MiB runs it that way)\n",
            r.memory_without_reread_mib
        ));
    }
    if let Some(pc) = r.page_cache_peak_mib.filter(|pc| *pc >= 1.0) {
        s.push_str(&format!(
            "resource-tracker: page cache up to {pc:.0} MiB: the rest is left out of the memory advice, as a limit reclaims it before it fails\n"
        ));
    }
    if r.cpu_slowdown > 1.0 {
        s.push_str(&format!(
            "resource-tracker: at {} the run is predicted to take {:.2}× its measured time ({:.1} s); {} within 5 %\n",
            cpus(r.cpu),
            r.cpu_slowdown,
            r.predicted_duration_secs,
            keep_it(r.cpu_within_5pct)
        ));
    }
    s
}

/// The line that says how long the tree stalled; where it stalled on memory for
/// more than 1 % of the run, that its memory figures are lower than what it would
/// take to run unhindered.
fn pressure_line(p: &crate::model::summary::PressureReport, wall: f64) -> String {
    let mut s = format!(
        "resource-tracker: stalled: cpu {:.2} s, memory {:.2} s (all tasks {:.2} s), io {:.2} s (all tasks {:.2} s) of {wall:.2} s\n",
        p.cpu_secs, p.memory_secs, p.memory_full_secs, p.io_secs, p.io_full_secs
    );
    if p.memory_secs > 0.01 * wall {
        s.push_str(
            "resource-tracker: the tree stalled on memory: its memory figures, and the memory advice, are lower than what it would take to run unhindered\n",
        );
    }
    s
}

/// The line that says which limits the command ran under and what they did.
fn limits_line(l: &crate::model::summary::LimitsReport) -> String {
    let mut asked = Vec::new();
    if let Some(c) = l.cpus {
        asked.push(format!("--cpus {c}"));
    }
    if let Some(m) = l.memory_mib {
        asked.push(format!("--memory {m} MiB"));
    }
    let mut did = Vec::new();
    if let Some(k) = l.oom_kills {
        did.push(format!("{k} OOM kill{}", plural(k)));
    }
    if let (Some(secs), Some(n)) = (l.throttled_secs, l.throttled_periods) {
        did.push(format!("throttled {secs:.2} s in {n} periods"));
    }
    let did = if did.is_empty() {
        "what they did could not be read".to_string()
    } else {
        did.join(", ")
    };
    match &l.escaped {
        // Never a verdict for a job that did not run under them.
        Some(why) => format!(
            "resource-tracker: limits {} did not hold for the whole tree: {}; within them: {did}\n",
            asked.join(" "),
            escaped(why)
        ),
        None => format!("resource-tracker: limits {}: {did}\n", asked.join(" ")),
    }
}

/// "s" for a count other than one.
fn plural(n: u64) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// "1 CPU keeps it", "2 CPUs keep it".
fn keep_it(n: u64) -> String {
    match n {
        1 => "1 CPU keeps it".to_string(),
        n => format!("{n} CPUs keep it"),
    }
}

/// A count of CPUs in words: "1 CPU", "2 CPUs".
fn cpus(n: u64) -> String {
    format!("{n} CPU{}", plural(n))
}

fn human_bytes(b: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut i = 0;
    while v >= 1024.0 && i + 1 < UNITS.len() {
        v /= 1024.0;
        i += 1;
    }
    if i == 0 {
        format!("{b} B")
    } else {
        format!("{v:.1} {}", UNITS[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::model::summary::LimitsReport;

    /// Counts read as a person would write them.
    #[test]
    fn plural_forms() {
        let line = |kills| {
            limits_line(&LimitsReport {
                memory_mib: Some(64.0),
                oom_kills: Some(kills),
                ..Default::default()
            })
        };
        assert!(line(1).contains(": 1 OOM kill\n"), "{}", line(1));
        assert!(line(0).contains(": 0 OOM kills\n"), "{}", line(0));
        assert!(line(2).contains(": 2 OOM kills\n"), "{}", line(2));
        assert_eq!(
            (cpus(1), cpus(2)),
            ("1 CPU".to_string(), "2 CPUs".to_string())
        );
        assert_eq!(keep_it(1), "1 CPU keeps it");
        assert_eq!(keep_it(2), "2 CPUs keep it");
    }
}
