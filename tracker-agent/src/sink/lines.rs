//! Samples as JSON lines or CSV (header first), to stderr or a file. Each line is
//! flushed so `tail -f` and pipes see samples as they are taken.

use std::{
    fs::File,
    io::Write,
    path::{Path, PathBuf},
};

use anyhow::Context as _;

use super::base::{create_or_keep, fallback_file, whole_lines_only, Format, Sink};
use crate::{
    fsafe::Owner,
    model::{csv, Sample, Summary},
};

enum Target {
    Stderr,
    /// The file, how it is named, and the bytes of whole lines it holds.
    File(File, String, u64),
    Null,
}

pub struct Lines {
    target: Target,
    format: Format,
    header_done: bool,
    owner: Option<Owner>,
    /// Where the samples went instead of where they were asked to go (a
    /// stderr closed at start, a file or stderr that failed mid-run).
    kept_in: Option<PathBuf>,
    /// The line being written, kept between samples: serialised in place, it grew
    /// from nothing (~6 reallocations for 3 KB) and was copied once more.
    text: Vec<u8>,
}

impl Lines {
    /// Opens the sink before anything starts, so an unwritable path fails early.
    /// `quiet` silences the terminal only: a file the user named is still written.
    pub fn open(
        path: Option<&Path>,
        quiet: bool,
        format: Format,
        owner: Option<&Owner>,
    ) -> anyhow::Result<Lines> {
        let mut kept_in = None;
        let name = match format {
            Format::Json => "samples.jsonl",
            Format::Csv => "samples.csv",
        };
        let target = match path {
            Some(p) => {
                let (f, kept) = create_or_keep(p, "output", name, owner)?;
                let shown = kept.as_deref().unwrap_or(p).display().to_string();
                Target::File(f, shown, 0)
            }
            None if quiet => Target::Null,
            // Started with `2>&-`: the runtime put /dev/null there. The samples
            // go where a failing sink's go, and that is said where it can be
            // read: the system log now, the summary at the end.
            None if crate::warn::stderr_was_closed() => match fallback_file(name, owner) {
                Ok((f, p)) => {
                    crate::warn::to_syslog(&format!(
                        "stderr was closed at start; the samples go to {}",
                        p.display()
                    ));
                    let shown = p.display().to_string();
                    kept_in = Some(p);
                    Target::File(f, shown, 0)
                }
                Err(e) => {
                    crate::warn::to_syslog(&format!(
                        "stderr was closed at start, and no file could take the samples: {e}"
                    ));
                    Target::Null
                }
            },
            None => Target::Stderr,
        };
        Ok(Lines {
            target,
            format,
            header_done: false,
            owner: owner.cloned(),
            kept_in,
            text: Vec::new(),
        })
    }
}

impl Sink for Lines {
    fn write(&mut self, s: &Sample) -> anyhow::Result<()> {
        if matches!(self.target, Target::Null) {
            return Ok(());
        }
        let text = &mut self.text;
        text.clear();
        match self.format {
            Format::Json => serde_json::to_writer(&mut *text, s)?,
            Format::Csv => {
                if !self.header_done {
                    text.extend_from_slice(csv::header().as_bytes());
                    text.push(b'\n');
                    self.header_done = true;
                }
                text.extend_from_slice(csv::row(s).as_bytes());
            }
        }
        text.push(b'\n');
        match &mut self.target {
            Target::Stderr => std::io::stderr()
                .lock()
                .write_all(text)
                .context("writing a sample to stderr")?,
            Target::File(f, name, whole) => match f.write_all(text) {
                Ok(()) => *whole += text.len() as u64,
                Err(e) => {
                    // The sample goes whole to the file kept instead.
                    whole_lines_only(f, *whole);
                    return Err(e).with_context(|| format!("writing a sample to {name}"));
                }
            },
            Target::Null => {}
        }
        Ok(())
    }

    fn finish(&mut self, summary: &mut Summary) -> anyhow::Result<()> {
        summary.samples_kept_in = self.kept_in.clone();
        Ok(())
    }

    fn stopped(&mut self, summary: &mut Summary, lost: u64) {
        summary.samples_kept_in = self.kept_in.clone();
        summary.samples_lost = lost;
    }

    fn fall_back(&mut self) -> Option<PathBuf> {
        let name = match self.format {
            Format::Json => "samples.jsonl",
            Format::Csv => "samples.csv",
        };
        let (f, path) = fallback_file(name, self.owner.as_ref()).ok()?;
        self.target = Target::File(f, path.display().to_string(), 0);
        self.header_done = false;
        self.kept_in = Some(path.clone());
        Some(path)
    }
}
