//! Samples as JSON lines or CSV (header first), to stderr or a file. Each line is
//! flushed so `tail -f` and pipes see samples as they are taken.

use std::{
    fs::File,
    io::{BufWriter, Write},
    path::{Path, PathBuf},
};

use anyhow::Context as _;

use super::base::{create_or_keep, fallback_file, Format, Sink};
use crate::{
    fsafe::Owner,
    model::{csv, Sample, Summary},
};

enum Target {
    Stderr,
    File(BufWriter<File>, String),
    Null,
}

pub struct Lines {
    target: Target,
    format: Format,
    header_done: bool,
    owner: Option<Owner>,
    /// Where the samples went instead of a stderr that was closed at start.
    instead_of_stderr: Option<PathBuf>,
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
        let mut instead_of_stderr = None;
        let name = match format {
            Format::Json => "samples.jsonl",
            Format::Csv => "samples.csv",
        };
        let target = match path {
            Some(p) => {
                let (f, kept) = create_or_keep(p, "output", name, owner)?;
                let shown = kept.as_deref().unwrap_or(p).display().to_string();
                Target::File(BufWriter::new(f), shown)
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
                    instead_of_stderr = Some(p);
                    Target::File(BufWriter::new(f), shown)
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
            instead_of_stderr,
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
            Target::File(w, name) => {
                w.write_all(text)
                    .and_then(|_| w.flush())
                    .with_context(|| format!("writing a sample to {name}"))?;
            }
            Target::Null => {}
        }
        Ok(())
    }

    fn finish(&mut self, summary: &mut Summary) -> anyhow::Result<()> {
        summary.samples_kept_in = self.instead_of_stderr.clone();
        Ok(())
    }

    fn fall_back(&mut self) -> Option<PathBuf> {
        let name = match self.format {
            Format::Json => "samples.jsonl",
            Format::Csv => "samples.csv",
        };
        let (f, path) = fallback_file(name, self.owner.as_ref()).ok()?;
        self.target = Target::File(BufWriter::new(f), path.display().to_string());
        self.header_done = false;
        Some(path)
    }
}
