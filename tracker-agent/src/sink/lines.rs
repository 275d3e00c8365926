//! Samples as JSON lines or CSV (header first), to stderr or a file. Each line is
//! flushed so `tail -f` and pipes see samples as they are taken.

use std::{
    fs::File,
    io::{BufWriter, Write},
    path::{Path, PathBuf},
};

use anyhow::Context as _;

use super::{Format, Sink};
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
        let target = match path {
            Some(p) => Target::File(
                BufWriter::new(super::create(p, "output", owner)?),
                p.display().to_string(),
            ),
            None if quiet => Target::Null,
            None => Target::Stderr,
        };
        Ok(Lines {
            target,
            format,
            header_done: false,
            owner: owner.cloned(),
        })
    }
}

impl Sink for Lines {
    fn write(&mut self, s: &Sample) -> anyhow::Result<()> {
        if matches!(self.target, Target::Null) {
            return Ok(());
        }
        let mut text = String::new();
        match self.format {
            Format::Json => text.push_str(&serde_json::to_string(s)?),
            Format::Csv => {
                if !self.header_done {
                    text.push_str(&csv::header());
                    text.push('\n');
                    self.header_done = true;
                }
                text.push_str(&csv::row(s));
            }
        }
        text.push('\n');
        match &mut self.target {
            Target::Stderr => std::io::stderr()
                .lock()
                .write_all(text.as_bytes())
                .context("writing a sample to stderr")?,
            Target::File(w, name) => {
                w.write_all(text.as_bytes())
                    .and_then(|_| w.flush())
                    .with_context(|| format!("writing a sample to {name}"))?;
            }
            Target::Null => {}
        }
        Ok(())
    }

    fn finish(&mut self, _: &mut Summary) -> anyhow::Result<()> {
        Ok(())
    }

    fn fall_back(&mut self) -> Option<PathBuf> {
        let name = match self.format {
            Format::Json => "samples.jsonl",
            Format::Csv => "samples.csv",
        };
        let (f, path) = super::fallback_file(name, self.owner.as_ref()).ok()?;
        self.target = Target::File(BufWriter::new(f), path.display().to_string());
        self.header_done = false;
        Some(path)
    }
}
