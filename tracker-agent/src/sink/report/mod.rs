//! The HTML report: one self-contained page (uPlot and the page's script inlined,
//! the data as JSON), written whole or not at all.

use std::{
    io::Write as _,
    path::{Path, PathBuf},
    sync::{Arc, Mutex},
};

use anyhow::Context as _;
use serde::Serialize;

use super::base::{fallback_file, Sink};
use crate::{
    fsafe::{self, Owner},
    model::{
        reading::unix_now,
        report::{Combined, Hints, ProcEventIn, RunBuilder, RunData, RunStatus, TimelineBuilder},
        stats::ServerAdvice,
        ProcEvent, Sample, Summary,
    },
};

const UPLOT_JS: &str = include_str!("vendor/uPlot.iife.min.js");
const UPLOT_CSS: &str = include_str!("vendor/uPlot.min.css");
const UPLOT_LICENSE: &str = include_str!("vendor/uPlot.LICENSE");
const PAGE_JS: &str = include_str!("report.js");
const PAGE_CSS: &str = include_str!("report.css");

/// Everything the page shows.
#[derive(Serialize)]
pub struct Page {
    pub title: String,
    /// How the run stands, beside the title; none where it is not known.
    pub status: Option<RunStatus>,
    pub version: &'static str,
    pub generated_secs: f64,
    pub runs: Vec<RunData>,
    /// With several runs: their statistics and recommendation as one.
    pub combined: Option<Combined>,
    /// Keeper's answer, when asked.
    pub server: Option<ServerAdvice>,
    /// What the reader skipped or could not match, one line each.
    pub notes: Vec<String>,
    /// Whose terms the hints use (flags or the Python package's arguments).
    pub hints: Hints,
}

fn escape_html(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// `YYYY-MM-DD HH:MM UTC` of unix seconds.
fn utc(secs: f64) -> String {
    jiff::Timestamp::from_second(secs.max(0.0) as i64)
        .map(|t| t.strftime("%Y-%m-%d %H:%M UTC").to_string())
        .unwrap_or_default()
}

/// The page. JSON inside a script element must not contain `</script`; `<` only
/// occurs inside JSON strings, where `\u003c` means the same.
pub fn render(page: &Page) -> anyhow::Result<String> {
    let data = serde_json::to_string(page)
        .context("encoding the report's data")?
        .replace('<', "\\u003c");
    let licence = UPLOT_LICENSE.replace("*/", "* /");
    let mut html = String::with_capacity(data.len() + UPLOT_JS.len() + 16 * 1024);
    html.push_str("<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n");
    html.push_str(
        "<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\">\n<title>",
    );
    html.push_str(&escape_html(&page.title));
    html.push_str("</title>\n<style>\n");
    html.push_str(UPLOT_CSS);
    html.push('\n');
    html.push_str(PAGE_CSS);
    html.push_str("</style>\n</head>\n<body>\n<header><h1>");
    html.push_str(&escape_html(&page.title));
    if let Some(st) = page.status {
        html.push_str(" <span class=\"status status-");
        html.push_str(&st.word().to_ascii_lowercase());
        html.push_str("\">");
        html.push_str(st.word());
        html.push_str("</span>");
    }
    html.push_str("</h1><div class=\"sub\">resource-tracker ");
    html.push_str(page.version);
    html.push_str(" · generated ");
    html.push_str(&utc(page.generated_secs));
    html.push_str("</div></header>\n<main id=\"report\"></main>\n<div id=\"tip\"></div>\n");
    html.push_str("<footer>Charts drawn with uPlot (MIT licence, inlined). No request is made when this page opens.</footer>\n");
    html.push_str("<script id=\"report-data\" type=\"application/json\">");
    html.push_str(&data);
    html.push_str("</script>\n<script>\n/*\n");
    html.push_str(&licence);
    html.push_str("*/\n");
    html.push_str(UPLOT_JS);
    html.push_str("\n</script>\n<script>\n");
    html.push_str(PAGE_JS);
    html.push_str("</script>\n</body>\n</html>\n");
    Ok(html)
}

/// Writes the page whole: it is rendered in memory first, and a write that fails
/// half-way leaves no file behind.
pub fn write_page(path: &Path, page: &Page, owner: Option<&Owner>) -> anyhow::Result<u64> {
    let html = render(page)?;
    write_html(path, &html, owner)?;
    Ok(html.len() as u64)
}

fn write_html(path: &Path, html: &str, owner: Option<&Owner>) -> anyhow::Result<()> {
    let mut f = fsafe::create_output(path, owner)
        .with_context(|| format!("cannot write the report file {}", path.display()))?;
    let written = f.write_all(html.as_bytes()).and_then(|()| f.sync_data());
    if let Err(e) = written {
        // Only the regular file just written goes, and only while the name still
        // leads to it: never a device, never what a swapped name points to.
        use std::os::unix::fs::MetadataExt as _;
        if let (Ok(ours), Ok(named)) = (f.metadata(), std::fs::symlink_metadata(path)) {
            if ours.is_file() && (ours.dev(), ours.ino()) == (named.dev(), named.ino()) {
                let _ = f.set_len(0);
                let _ = std::fs::remove_file(path);
            }
        }
        return Err(e).with_context(|| format!("writing the report file {}", path.display()));
    }
    Ok(())
}

/// The process events the report's timeline is built from, shared by the
/// [`Timeline`] sink that fills it and the [`ReportSink`] that draws it.
pub type TimelineFeed = Arc<Mutex<TimelineBuilder>>;

/// The run's process events into the report's timeline.
pub struct Timeline(pub TimelineFeed);

impl Timeline {
    /// An attached tree's processes that were alive before tracking began, as
    /// (pid, parent, command name): the timeline shows them from `now` on (the
    /// kernel sends no fork for them).
    pub fn seed(&self, running: &[(u32, u32, String)], now: f64) {
        let Ok(mut t) = self.0.lock() else { return };
        for (pid, ppid, comm) in running {
            t.add(&ProcEventIn {
                kind: "exec",
                pid: *pid,
                ppid: *ppid,
                comm,
                cpu_secs: None,
                exit_code: None,
                timestamp_secs: now,
            });
        }
    }
}

impl Sink<ProcEvent, ()> for Timeline {
    fn write(&mut self, ev: &ProcEvent) -> anyhow::Result<()> {
        if let Ok(mut t) = self.0.lock() {
            t.add(&ev.as_in());
        }
        Ok(())
    }

    fn finish(&mut self, _: &mut ()) -> anyhow::Result<()> {
        Ok(())
    }
}

/// `run --report FILE`: the run's samples and the tree's processes, written as
/// the page at the end.
pub struct ReportSink {
    path: PathBuf,
    owner: Option<Owner>,
    run: Option<RunBuilder>,
    timeline: Option<TimelineFeed>,
    quiet: bool,
    /// The page, once rendered: a write that failed is tried again elsewhere.
    html: Option<String>,
    /// Where the page goes when `path` could not be written.
    kept: Option<(std::fs::File, PathBuf)>,
}

impl ReportSink {
    /// `timeline`: with the eBPF engine, the feed the events go to.
    pub fn new(
        path: PathBuf,
        owner: Option<Owner>,
        name: &str,
        timeline: Option<TimelineFeed>,
        quiet: bool,
    ) -> ReportSink {
        ReportSink {
            run: Some(RunBuilder::new(name, "this run")),
            path,
            owner,
            timeline,
            quiet,
            html: None,
            kept: None,
        }
    }
}

impl ReportSink {
    /// The page goes to `kept` (a private file) rather than the path asked for.
    pub fn kept_in(mut self, kept: Option<(std::fs::File, PathBuf)>) -> ReportSink {
        self.kept = kept;
        self
    }
}

impl Sink for ReportSink {
    fn write(&mut self, s: &Sample) -> anyhow::Result<()> {
        if let Some(r) = &mut self.run {
            r.add(s);
        }
        Ok(())
    }

    fn finish(&mut self, summary: &mut Summary) -> anyhow::Result<()> {
        if self.html.is_none() {
            let Some(mut run) = self.run.take() else {
                return Ok(());
            };
            run.backend(summary.backend);
            let origin = run.origin();
            let end = run.span().map_or(origin, |(_, e)| e);
            let timeline = self.timeline.take().and_then(|t| {
                let t = std::mem::take(&mut *t.lock().ok()?);
                (t.events() > 0).then(|| t.finish(origin, end))
            });
            let mut data = run.finish(timeline);
            data.summary = serde_json::to_value(&*summary).ok();
            let page = Page {
                title: format!("resource-tracker report: {}", data.name),
                status: Some(RunStatus::of_exit(summary.exit_code)),
                version: env!("CARGO_PKG_VERSION"),
                generated_secs: unix_now(),
                runs: vec![data],
                combined: None,
                server: summary.recommended_server.clone(),
                notes: Vec::new(),
                hints: Hints::Cli,
            };
            self.html = Some(render(&page)?);
        }
        let Some(html) = &self.html else {
            return Ok(());
        };
        let path = match &mut self.kept {
            Some((f, p)) => {
                f.write_all(html.as_bytes())
                    .with_context(|| format!("writing the report file {}", p.display()))?;
                p.clone()
            }
            None => {
                write_html(&self.path, html, self.owner.as_ref())?;
                self.path.clone()
            }
        };
        if !self.quiet {
            crate::warn::say(format_args!(
                "report written to {} ({} KiB)",
                path.display(),
                html.len().div_ceil(1024)
            ));
        }
        Ok(())
    }

    fn fall_back(&mut self) -> Option<PathBuf> {
        self.html.as_ref()?;
        let (f, p) = fallback_file("report.html", self.owner.as_ref()).ok()?;
        self.kept = Some((f, p.clone()));
        Some(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn dates_and_escapes() {
        assert_eq!(utc(0.0), "1970-01-01 00:00 UTC");
        assert_eq!(utc(1_795_478_400.0 + 3_661.0), "2026-11-24 01:01 UTC");
        assert_eq!(utc(951_782_400.0), "2000-02-29 00:00 UTC");
        let page = Page {
            title: "<b>x</b>".into(),
            status: Some(RunStatus::Failed),
            version: "0",
            generated_secs: 0.0,
            runs: vec![RunBuilder::new("</script><script>alert(1)</script>", "f").finish(None)],
            combined: None,
            server: None,
            notes: vec![],
            hints: Hints::Cli,
        };
        let html = render(&page).unwrap();
        assert!(!html.contains("</script><script>alert"));
        assert!(html
            .contains("&lt;b&gt;x&lt;/b&gt; <span class=\"status status-failed\">Failed</span>"));
        assert_eq!(html.matches("</script>").count(), 3);
    }
}
