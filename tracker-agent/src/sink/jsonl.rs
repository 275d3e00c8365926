//! A file of JSON lines other than the samples: the `--events` file of a run and
//! the node agent's `--output`. When the file fails (a full disk), the lines go on
//! in a private file that is named, as the samples' do.

use std::{
    fs::File,
    io::{BufWriter, Write},
    path::PathBuf,
};

use anyhow::Context as _;
use serde::Serialize;

use super::base::{fallback_file, Sink};
use crate::{
    fsafe::Owner,
    model::{node::NodeScan, ProcEvent},
};

const KEEP_TEXT: usize = 64 * 1024;

pub struct JsonLines {
    file: Option<BufWriter<File>>,
    /// How errors name it: "the events file".
    what: String,
    /// The name of the file kept instead.
    kept_name: &'static str,
    /// Whose a file kept instead is, under sudo.
    owner: Option<Owner>,
    /// Whether the file is already the one kept instead: a second failure stops.
    kept: bool,
    /// The buffer's size; 0 writes each call's lines straight through.
    capacity: usize,
    /// The call's lines, kept between calls so that they are not grown anew (up to
    /// `KEEP_TEXT`: a node scan of hundreds of containers gives its memory back).
    text: Vec<u8>,
}

impl JsonLines {
    /// Buffered, flushed at the end: events come by the thousand a second.
    pub fn buffered(
        file: File,
        what: String,
        kept_name: &'static str,
        owner: Option<Owner>,
    ) -> JsonLines {
        Self::with_capacity(file, what, kept_name, owner, 8 * 1024)
    }

    /// Every write goes to the file at once, so nothing written stays in a buffer
    /// that a failed flush would leave to be written twice.
    pub fn unbuffered(
        file: File,
        what: String,
        kept_name: &'static str,
        owner: Option<Owner>,
    ) -> JsonLines {
        Self::with_capacity(file, what, kept_name, owner, 0)
    }

    fn with_capacity(
        file: File,
        what: String,
        kept_name: &'static str,
        owner: Option<Owner>,
        capacity: usize,
    ) -> JsonLines {
        JsonLines {
            file: Some(BufWriter::with_capacity(capacity, file)),
            what,
            kept_name,
            owner,
            kept: false,
            capacity,
            text: Vec::new(),
        }
    }

    /// The items as lines in one write: a failure then leaves none of them in
    /// the buffer, and the kept file gets them once.
    fn put<'a, T: Serialize + 'a>(
        &mut self,
        items: impl IntoIterator<Item = &'a T>,
    ) -> anyhow::Result<()> {
        let Some(w) = self.file.as_mut() else {
            return Ok(());
        };
        let text = &mut self.text;
        text.clear();
        for item in items {
            serde_json::to_writer(&mut *text, item)?;
            text.push(b'\n');
        }
        let written = w
            .write_all(text)
            .with_context(|| format!("writing {}", self.what));
        if text.capacity() > KEEP_TEXT {
            *text = Vec::new();
        }
        written
    }

    fn flush(&mut self) -> anyhow::Result<()> {
        match self.file.as_mut() {
            Some(w) => w.flush().with_context(|| format!("writing {}", self.what)),
            None => Ok(()),
        }
    }
}

impl Sink<ProcEvent, ()> for JsonLines {
    fn write(&mut self, ev: &ProcEvent) -> anyhow::Result<()> {
        self.put([ev])
    }

    fn finish(&mut self, _: &mut ()) -> anyhow::Result<()> {
        self.flush()
    }

    fn fall_back(&mut self) -> Option<PathBuf> {
        self.move_to_kept()
    }
}

impl Sink<NodeScan, ()> for JsonLines {
    /// A scan's samples in one write: a reader of the file sees whole scans.
    fn write(&mut self, scan: &NodeScan) -> anyhow::Result<()> {
        self.put(&scan.samples)
    }

    fn finish(&mut self, _: &mut ()) -> anyhow::Result<()> {
        self.flush()
    }

    fn fall_back(&mut self) -> Option<PathBuf> {
        self.move_to_kept()
    }
}

impl JsonLines {
    /// What the failed file still held unwritten goes first into the kept file;
    /// the failed call, tried again, then adds its own.
    fn move_to_kept(&mut self) -> Option<PathBuf> {
        let unwritten = self.file.take().map(|w| {
            let (_, rest) = w.into_parts();
            rest.unwrap_or_default()
        });
        if self.kept {
            return None;
        }
        let (f, p) = fallback_file(self.kept_name, self.owner.as_ref()).ok()?;
        let mut w = BufWriter::with_capacity(self.capacity, f);
        w.write_all(&unwritten.unwrap_or_default()).ok()?;
        self.file = Some(w);
        self.kept = true;
        Some(p)
    }
}
