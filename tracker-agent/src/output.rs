//! Sample sinks. JSON lines for now; each line is flushed so `tail -f` and pipes see
//! samples as they are taken.

use std::{
    fs::File,
    io::{BufWriter, Write},
    path::Path,
};

use anyhow::Context as _;

use crate::sample::Sample;

pub enum Sink {
    Stderr,
    File(BufWriter<File>, String),
    Null,
}

impl Sink {
    /// Opens the sink before anything starts, so an unwritable path fails early.
    pub fn open(path: Option<&Path>, quiet: bool) -> anyhow::Result<Sink> {
        match path {
            Some(p) => {
                let f = File::create(p)
                    .with_context(|| format!("cannot write output file {}", p.display()))?;
                Ok(Sink::File(BufWriter::new(f), p.display().to_string()))
            }
            None if quiet => Ok(Sink::Null),
            None => Ok(Sink::Stderr),
        }
    }

    pub fn write(&mut self, s: &Sample) -> anyhow::Result<()> {
        let line = serde_json::to_string(s)?;
        match self {
            Sink::Stderr => {
                let mut e = std::io::stderr().lock();
                writeln!(e, "{line}").context("writing a sample to stderr")?;
            }
            Sink::File(w, name) => {
                writeln!(w, "{line}").with_context(|| format!("writing a sample to {name}"))?;
                w.flush()
                    .with_context(|| format!("writing a sample to {name}"))?;
            }
            Sink::Null => {}
        }
        Ok(())
    }
}

/// Creates (truncates) a file the user asked for, naming it in the error.
pub fn create(path: &Path, what: &str) -> anyhow::Result<File> {
    File::create(path).with_context(|| format!("cannot write {what} file {}", path.display()))
}
