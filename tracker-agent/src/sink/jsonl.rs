//! A file of JSON lines other than the samples: the `--events` file of a run and
//! the node agent's `--output`. When the file fails (a full disk), the lines go on
//! in a private file that is named, as the samples' do.

use std::{fs::File, io::Write, path::PathBuf};

use anyhow::Context as _;
use serde::Serialize;

use super::base::{fallback_file, whole_lines_only, Sink};
use crate::{
    fsafe::Owner,
    model::{node::NodeScan, ProcEvent},
};

const KEEP_TEXT: usize = 64 * 1024;

pub struct JsonLines {
    file: Option<File>,
    /// Bytes of whole lines the file holds: after a failed write it is cut back
    /// to them, so that every line is whole in one file, never split between it
    /// and the one kept instead.
    on_disk: u64,
    /// Whole lines not written yet (at most `capacity`, then written).
    pending: Vec<u8>,
    /// How errors name it: "the events file".
    what: String,
    /// The name of the file kept instead.
    kept_name: &'static str,
    /// Whose a file kept instead is, under sudo.
    owner: Option<Owner>,
    /// Whether the file is already the one kept instead: a second failure stops.
    kept: bool,
    /// Bytes held before a write; 0 writes each call's lines straight through.
    capacity: usize,
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

    /// Every call's lines go to the file at once.
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
            file: Some(file),
            on_disk: 0,
            pending: Vec::new(),
            what,
            kept_name,
            owner,
            kept: false,
            capacity,
        }
    }

    /// The items as whole lines. A failure leaves none of this call's lines
    /// held (the call is tried again in the file kept instead) and the file
    /// with whole lines only.
    fn put<'a, T: Serialize + 'a>(
        &mut self,
        items: impl IntoIterator<Item = &'a T>,
    ) -> anyhow::Result<()> {
        if self.file.is_none() {
            return Ok(());
        }
        let before = self.pending.len();
        for item in items {
            serde_json::to_writer(&mut self.pending, item)?;
            self.pending.push(b'\n');
        }
        if self.pending.len() <= self.capacity {
            return Ok(());
        }
        let written = self.write_pending();
        if written.is_err() {
            self.pending.truncate(before);
        }
        written
    }

    /// Writes the lines held; on failure the file is cut back to its whole
    /// lines and they stay held, for the file kept instead.
    fn write_pending(&mut self) -> anyhow::Result<()> {
        let Some(f) = self.file.as_mut() else {
            return Ok(());
        };
        if self.pending.is_empty() {
            return Ok(());
        }
        match f.write_all(&self.pending) {
            Ok(()) => {
                self.on_disk += self.pending.len() as u64;
                self.pending.clear();
                if self.pending.capacity() > KEEP_TEXT {
                    self.pending = Vec::new();
                }
                Ok(())
            }
            Err(e) => {
                whole_lines_only(f, self.on_disk);
                Err(e).with_context(|| format!("writing {}", self.what))
            }
        }
    }
}

impl Drop for JsonLines {
    /// Lines still held when the sink goes without its `finish` (as a buffered
    /// writer's drop would): written if the file takes them.
    fn drop(&mut self) {
        let _ = self.write_pending();
    }
}

impl Sink<ProcEvent, ()> for JsonLines {
    fn write(&mut self, ev: &ProcEvent) -> anyhow::Result<()> {
        self.put([ev])
    }

    fn finish(&mut self, _: &mut ()) -> anyhow::Result<()> {
        self.write_pending()
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
        self.write_pending()
    }

    fn fall_back(&mut self) -> Option<PathBuf> {
        self.move_to_kept()
    }
}

impl JsonLines {
    /// The lines still held go on into the kept file (the failed file holds
    /// whole lines only); the failed call, tried again, then adds its own.
    fn move_to_kept(&mut self) -> Option<PathBuf> {
        self.file = None;
        if self.kept {
            return None;
        }
        let (f, p) = fallback_file(self.kept_name, self.owner.as_ref()).ok()?;
        self.file = Some(f);
        self.on_disk = 0;
        self.kept = true;
        Some(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_failed_write_leaves_whole_lines_only() {
        // /dev/full fails every write: nothing of the call is kept in the file
        // or held, and what was held stays for the kept file.
        let f = File::options()
            .write(true)
            .open("/dev/full")
            .expect("/dev/full");
        let mut j = JsonLines::with_capacity(f, "the test file".into(), "t.jsonl", None, 64);
        j.put(["a"].iter()).expect("held, not written");
        assert_eq!(j.pending, b"\"a\"\n");
        let big = "x".repeat(100);
        assert!(j.put([big.as_str()].iter()).is_err());
        assert_eq!(j.pending, b"\"a\"\n", "the failed call's line is not held");
    }
}
