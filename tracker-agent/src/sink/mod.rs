//! Where samples and the summary go. Each sink encodes its own format from the
//! model's types and knows nothing of the settings or of the other sinks.

pub mod base;
pub mod jsonl;
pub mod lines;
pub mod otlp;
pub mod prometheus;
pub mod report;
pub mod sentinel;
pub mod summary;

pub use base::{create, create_or_keep, fallback_file, Format, Sink, Sinks};
