//! Where samples and the summary go. Each sink encodes its own format from the
//! model's types and knows nothing of the settings or of the other sinks.

pub mod lines;
pub mod sentinel;
pub mod summary;

use std::{fs::File, path::Path};

use anyhow::Context as _;

use crate::{
    fsafe::{self, Owner},
    model::{Sample, Summary},
};

pub trait Sink {
    /// One sample, as soon as it is taken.
    fn write(&mut self, s: &Sample) -> anyhow::Result<()>;
    /// The end of the run. Sinks finish in order, and one may add to the summary
    /// what only it knows (Sentinel: how streaming went) for the sinks after it.
    fn finish(&mut self, summary: &mut Summary) -> anyhow::Result<()>;
}

/// Encoding of the sample lines.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum Format {
    Json,
    Csv,
}

/// Creates (truncates) a file the user asked for, naming it in the error; under
/// sudo as `owner`, whose file it becomes.
pub fn create(path: &Path, what: &str, owner: Option<&Owner>) -> anyhow::Result<File> {
    fsafe::create_output(path, owner)
        .with_context(|| format!("cannot write {what} file {}", path.display()))
}
