//! The guardian's journal, the tracker's side: every row and every step of the
//! stream appended to a file with no name that the guardian holds too (see
//! guardian.rs for the records), and rows zeroed once saved.

use std::{
    fs::File,
    io,
    os::{fd::AsRawFd, unix::fs::FileExt as _},
    sync::Mutex,
};

use serde_json::Value;

/// Bytes of rows not yet saved the journal holds at most (some 200,000 rows, days
/// of an unreachable S3 at one sample a second); past it rows are not journaled,
/// said once.
const JOURNAL_MAX: u64 = 64 << 20;

struct Inner {
    file: File,
    end: u64,
    /// Bytes appended and not yet zeroed.
    live: u64,
    next_row: u64,
    /// Why journaling stopped, once it has.
    failed: Option<String>,
}

/// The tracker's side of the journal; shared by the sampling and streaming threads.
pub struct Journal {
    inner: Mutex<Inner>,
}

/// Where a row sits in the journal, to be zeroed once it is saved.
#[derive(Clone, Copy, Debug)]
pub struct RowAt {
    pub index: u64,
    offset: u64,
    len: u64,
}

impl Journal {
    /// A journal over `file`, whose first `end` bytes (the header) are written.
    pub(super) fn new(file: File, end: u64) -> Journal {
        Journal {
            inner: Mutex::new(Inner {
                file,
                end,
                live: 0,
                next_row: 1,
                failed: None,
            }),
        }
    }

    /// Appends a record. Once rows could not be journaled they are not any more
    /// (the guardian would miss some); the other records are still tried, since a
    /// guardian that missed an upload would send its batch again under the same
    /// key.
    fn append(&self, rec: &[u8], row: bool) -> Option<u64> {
        let mut j = self.inner.lock().ok()?;
        if row && j.failed.is_some() {
            return None;
        }
        let at = j.end;
        let written = match row && j.live + rec.len() as u64 > JOURNAL_MAX {
            true => Err(io::Error::other(format!(
                "{} MiB of rows not yet sent",
                JOURNAL_MAX >> 20
            ))),
            false => j.file.write_all_at(rec, at),
        };
        match written {
            Ok(()) => {
                j.end += rec.len() as u64;
                j.live += rec.len() as u64;
                Some(at)
            }
            Err(e) if !row => {
                log::debug!("Sentinel: the guardian's journal: {e}");
                None
            }
            Err(e) => {
                // Rows from now on would be missing should the tracker be killed;
                // said once. The run itself goes on as before.
                log::warn!("Sentinel: the guardian's journal cannot be written ({e}); should the tracker be killed, rows from now on are only in the local outputs");
                // What was half written must not be read as a record.
                let _ = j.file.set_len(at);
                j.failed = Some(e.to_string());
                None
            }
        }
    }

    /// Journals a row; where it is.
    pub fn row(&self, row: &str) -> Option<RowAt> {
        let index = self.inner.lock().ok()?.next_row;
        // A quoted field may hold a line break (a job name), and zeroes mean
        // "saved": such a row goes as a JSON string.
        let rec = match row.contains(['\n', '\r', '\0']) {
            false => format!("R{index},{row}\n"),
            true => format!("J{index},{}\n", Value::from(row)),
        };
        let offset = self.append(rec.as_bytes(), true)?;
        if let Ok(mut j) = self.inner.lock() {
            j.next_row = index + 1;
        }
        Some(RowAt {
            index,
            offset,
            len: rec.len() as u64,
        })
    }

    pub fn record(&self, tag: char, body: &str) {
        self.append(format!("{tag} {body}\n").as_bytes(), false);
    }

    /// Rows up to `upto` are saved (`U`: uploaded to `what`; `K`: kept in `what`);
    /// their bytes are zeroed to give the space back.
    pub fn saved(&self, tag: char, upto: u64, what: &str, rows: &[RowAt]) {
        // A JSON string: a name with a line break cannot forge a record.
        let what = Value::from(what);
        if self
            .append(format!("{tag} {upto} {what}\n").as_bytes(), false)
            .is_none()
        {
            return;
        }
        let Ok(mut j) = self.inner.lock() else { return };
        let freed: u64 = rows.iter().map(|r| r.len).sum();
        j.live = j.live.saturating_sub(freed);
        // Holes over runs of adjacent rows, one call each.
        let mut run: Option<(u64, u64)> = None;
        let punch = |(off, len): (u64, u64)| {
            // SAFETY: fallocate on our own descriptor with integer arguments; a
            // file system without hole punching just keeps the bytes.
            unsafe {
                libc::fallocate(
                    j.file.as_raw_fd(),
                    libc::FALLOC_FL_PUNCH_HOLE | libc::FALLOC_FL_KEEP_SIZE,
                    off as libc::off_t,
                    len as libc::off_t,
                )
            };
        };
        for r in rows {
            run = match run {
                Some((o, l)) if o + l == r.offset => Some((o, l + r.len)),
                Some(prev) => {
                    punch(prev);
                    Some((r.offset, r.len))
                }
                None => Some((r.offset, r.len)),
            };
        }
        if let Some(r) = run {
            punch(r);
        }
    }
}
