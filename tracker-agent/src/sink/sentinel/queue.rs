//! Rows not yet uploaded: the open batch (CSV text) and sealed batches (gzip CSV,
//! header included, each a standalone object). Sealed batches stay in memory up to a
//! limit; past it they go to an unlinked spool file and come back in order. A spool
//! that fails (full, read-only, gone) loses nothing: batches then go to files kept
//! in a private directory under the temp dir, and failing that stay in memory.

use std::{
    collections::VecDeque,
    fs::File,
    io::{self, Read as _, Write as _},
    os::{fd::OwnedFd, unix::fs::FileExt as _},
    path::{Path, PathBuf},
};

use flate2::{read::GzDecoder, write::GzEncoder, Compression};

use crate::fsafe;

enum Stored {
    Mem(Vec<u8>),
    Spool {
        offset: u64,
        len: usize,
    },
    /// A file of its own in the kept directory.
    Kept(PathBuf),
}

pub struct Batch {
    pub seq: u32,
    pub rows: usize,
    data: Stored,
}

pub struct Queue {
    header: String,
    open: String,
    open_rows: usize,
    sealed: VecDeque<Batch>,
    next_seq: u32,
    /// Open text plus sealed batches held in memory.
    mem_bytes: usize,
    limit: usize,
    spool_dir: PathBuf,
    spool: Option<File>,
    spool_end: u64,
    /// Batches that went through the spool file.
    pub spooled: u64,
    /// Why the spool stopped taking batches, once it has.
    pub spool_failed: Option<String>,
    /// Where batches go when the spool has failed: a private directory made on
    /// first use under `kept_parent`; its files survive the tracker.
    kept_parent: PathBuf,
    kept_dir: Option<(PathBuf, OwnedFd)>,
    /// Why the kept directory stopped taking batches, once it has: they then stay
    /// in memory, past the limit.
    pub kept_failed: Option<String>,
}

fn gzip(parts: &[&str]) -> io::Result<Vec<u8>> {
    let mut e = GzEncoder::new(Vec::new(), Compression::default());
    for p in parts {
        e.write_all(p.as_bytes())?;
    }
    e.finish()
}

pub fn gunzip(b: &[u8]) -> io::Result<String> {
    let mut s = String::new();
    GzDecoder::new(b).read_to_string(&mut s)?;
    Ok(s)
}

/// Proves `dir` takes a spool file: one is made the way the queue makes it and a
/// block written through it (a stat says nothing of a read-only mount, /proc or a
/// full disk).
pub fn probe_spool(dir: &Path) -> io::Result<()> {
    let f = fsafe::anonymous_file(dir)?;
    f.write_all_at(&[0u8; 4096], 0)?;
    f.sync_data()
}

impl Queue {
    /// `header` ends with a newline.
    /// `kept_parent`: where batches go should the spool fail (the temp dir).
    pub fn new(header: String, limit: usize, spool_dir: &Path, kept_parent: &Path) -> Queue {
        Queue {
            header,
            open: String::new(),
            open_rows: 0,
            sealed: VecDeque::new(),
            next_seq: 1,
            mem_bytes: 0,
            limit: limit.max(1),
            spool_dir: spool_dir.to_path_buf(),
            spool: None,
            spool_end: 0,
            spooled: 0,
            spool_failed: None,
            kept_parent: kept_parent.to_path_buf(),
            kept_dir: None,
            kept_failed: None,
        }
    }

    /// Numbers batches from `seq` on (a guardian carrying on after the batches its
    /// tracker uploaded).
    pub fn start_at(&mut self, seq: u32) {
        self.next_seq = seq.max(1);
    }

    /// Adds one CSV row (without its newline). A large open batch is sealed early so
    /// that memory stays bounded whatever the upload interval.
    pub fn push(&mut self, row: &str) -> io::Result<()> {
        self.open.push_str(row);
        self.open.push('\n');
        self.open_rows += 1;
        self.mem_bytes += row.len() + 1;
        if self.open.len() >= (self.limit / 4).max(1) {
            self.seal()?;
        }
        Ok(())
    }

    /// Turns the open rows into the next batch.
    pub fn seal(&mut self) -> io::Result<()> {
        if self.open_rows == 0 {
            return Ok(());
        }
        let gz = gzip(&[&self.header, &self.open])?;
        self.mem_bytes -= self.open.len();
        let rows = std::mem::replace(&mut self.open_rows, 0);
        self.open.clear();
        // Sealed batches get three quarters of the limit, the open batch the rest.
        let data = if self.mem_bytes + gz.len() > self.limit - self.limit / 4 {
            self.spill(gz)
        } else {
            self.mem_bytes += gz.len();
            Stored::Mem(gz)
        };
        self.sealed.push_back(Batch {
            seq: self.next_seq,
            rows,
            data,
        });
        self.next_seq += 1;
        Ok(())
    }

    /// A batch past the memory limit: to the spool file, else to the kept
    /// directory, else into memory. Never lost; each failure is kept to be named.
    fn spill(&mut self, gz: Vec<u8>) -> Stored {
        if self.spool_failed.is_none() {
            match self.spool_out(&gz) {
                Ok(s) => return s,
                Err(e) => self.spool_failed = Some(e.to_string()),
            }
        }
        if self.kept_failed.is_none() {
            match self.keep_out(self.next_seq, &gz) {
                Ok(p) => return Stored::Kept(p),
                Err(e) => self.kept_failed = Some(e.to_string()),
            }
        }
        self.mem_bytes += gz.len();
        Stored::Mem(gz)
    }

    /// Writes one batch as `NNNN.csv.gz` in the kept directory, made on first use.
    fn keep_out(&mut self, seq: u32, gz: &[u8]) -> io::Result<PathBuf> {
        let (dir, fd) = match &self.kept_dir {
            Some(d) => d,
            None => {
                let prefix = format!("resource-tracker-unsent-{}-", std::process::id());
                let d = fsafe::private_dir(&self.kept_parent, &prefix).map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!("a kept directory in {}: {e}", self.kept_parent.display()),
                    )
                })?;
                self.kept_dir.insert(d)
            }
        };
        let name = format!("{seq:04}.csv.gz");
        let path = dir.join(&name);
        let written = fsafe::create_in(fd, &name, false).and_then(|mut f| f.write_all(gz));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&path);
            return Err(io::Error::new(e.kind(), format!("{}: {e}", path.display())));
        }
        Ok(path)
    }

    fn spool_out(&mut self, gz: &[u8]) -> io::Result<Stored> {
        let f = match &mut self.spool {
            Some(f) => f,
            None => {
                // No name: nothing to plant a link on, and a crash leaves nothing.
                let f = fsafe::anonymous_file(&self.spool_dir).map_err(|e| {
                    io::Error::new(
                        e.kind(),
                        format!("spool file in {}: {e}", self.spool_dir.display()),
                    )
                })?;
                self.spool.insert(f)
            }
        };
        f.write_all_at(gz, self.spool_end).map_err(|e| {
            io::Error::new(
                e.kind(),
                format!("spool file in {}: {e}", self.spool_dir.display()),
            )
        })?;
        let s = Stored::Spool {
            offset: self.spool_end,
            len: gz.len(),
        };
        self.spool_end += gz.len() as u64;
        self.spooled += 1;
        Ok(s)
    }

    fn bytes_of(&self, b: &Batch) -> io::Result<Vec<u8>> {
        match &b.data {
            Stored::Mem(v) => Ok(v.clone()),
            Stored::Spool { offset, len } => {
                let mut v = vec![0; *len];
                self.spool
                    .as_ref()
                    .ok_or_else(|| io::Error::other("spool file missing"))?
                    .read_exact_at(&mut v, *offset)?;
                Ok(v)
            }
            Stored::Kept(p) => std::fs::read(p),
        }
    }

    /// The oldest sealed batch: (seq, rows, gzip bytes).
    pub fn front(&self) -> io::Result<Option<(u32, usize, Vec<u8>)>> {
        match self.sealed.front() {
            Some(b) => Ok(Some((b.seq, b.rows, self.bytes_of(b)?))),
            None => Ok(None),
        }
    }

    /// Drops the oldest batch once it is uploaded.
    pub fn pop_front(&mut self) {
        if let Some(b) = self.sealed.pop_front() {
            match &b.data {
                Stored::Mem(v) => self.mem_bytes -= v.len(),
                Stored::Kept(p) => {
                    let _ = std::fs::remove_file(p);
                }
                Stored::Spool { .. } => {}
            }
        }
        let spool_used = self
            .sealed
            .iter()
            .any(|b| matches!(b.data, Stored::Spool { .. }));
        if !spool_used && self.spool_end > 0 {
            if let Some(f) = &self.spool {
                let _ = f.set_len(0);
            }
            self.spool_end = 0;
        }
    }

    /// The directory batches go to since the spool failed, once made.
    pub fn kept_dir(&self) -> Option<&Path> {
        self.kept_dir.as_ref().map(|(d, _)| d.as_path())
    }

    /// Forgets every batch (their rows reached Sentinel another way, inline):
    /// kept files and the kept directory go too.
    pub fn discard_all(&mut self) {
        let _ = self.seal();
        while !self.sealed.is_empty() {
            self.pop_front();
        }
        if let Some((d, _)) = self.kept_dir.take() {
            let _ = std::fs::remove_dir(d);
        }
    }

    pub fn sealed_len(&self) -> usize {
        self.sealed.len()
    }

    /// Rows not yet uploaded, sealed or not.
    pub fn rows_waiting(&self) -> usize {
        self.open_rows + self.sealed.iter().map(|b| b.rows).sum::<usize>()
    }

    #[cfg(test)]
    pub fn mem_bytes(&self) -> usize {
        self.mem_bytes
    }

    /// Every row waiting, in order, as one CSV of at most `max` bytes: whole rows
    /// only, the first that fit; and whether that is all of them.
    pub fn csv_upto(&self, max: usize) -> io::Result<(String, bool)> {
        let mut out = self.header.clone();
        let mut add = |text: &str| {
            for line in text.split_inclusive('\n') {
                if out.len() + line.len() > max {
                    return false;
                }
                out.push_str(line);
            }
            true
        };
        for b in &self.sealed {
            let text = gunzip(&self.bytes_of(b)?)?;
            if !add(text.strip_prefix(self.header.as_str()).unwrap_or(&text)) {
                return Ok((out, false));
            }
        }
        let complete = add(&self.open);
        Ok((out, complete))
    }

    /// Writes the batches that were never uploaded as standalone `NNNN.csv.gz`
    /// files in a new private directory `PREFIXxxxxxx` of `parent`, so nothing is
    /// lost; returns the directory and how many (none: no directory). All or
    /// nothing: on an error the new directory is removed and the queue is as it was.
    pub fn keep(&mut self, parent: &Path, prefix: &str) -> io::Result<Option<(PathBuf, usize)>> {
        self.seal()?;
        if self.sealed.is_empty() {
            return Ok(None);
        }
        let (dir, fd) = fsafe::private_dir(parent, prefix)?;
        let written = self.sealed.iter().try_for_each(|b| {
            fsafe::create_in(&fd, &format!("{:04}.csv.gz", b.seq), false)?
                .write_all(&self.bytes_of(b)?)
        });
        if let Err(e) = written {
            let _ = std::fs::remove_dir_all(&dir);
            return Err(e);
        }
        let n = self.sealed.len();
        while !self.sealed.is_empty() {
            self.pop_front();
        }
        if let Some((d, _)) = self.kept_dir.take() {
            let _ = std::fs::remove_dir(d);
        }
        Ok(Some((dir, n)))
    }

    /// The last resort when `keep` failed: every batch not yet in the kept
    /// directory is written there. Returns the directory (when it holds any) and
    /// the rows that could be written nowhere.
    pub fn keep_in_fallback(&mut self) -> (Option<PathBuf>, usize) {
        let _ = self.seal();
        let mut lost = 0;
        let mut kept = 0;
        while let Some(b) = self.sealed.pop_front() {
            let bytes = match &b.data {
                Stored::Kept(_) => {
                    kept += 1;
                    continue;
                }
                _ => self.bytes_of(&b),
            };
            if let Stored::Mem(v) = &b.data {
                self.mem_bytes -= v.len();
            }
            match bytes.and_then(|g| self.keep_out(b.seq, &g)) {
                Ok(_) => kept += 1,
                Err(e) => {
                    self.kept_failed.get_or_insert(e.to_string());
                    lost += b.rows;
                }
            }
        }
        let dir = self.kept_dir.as_ref().map(|(d, _)| d.clone());
        (dir.filter(|_| kept > 0), lost)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows_of(gz: &[u8]) -> Vec<String> {
        let t = gunzip(gz).unwrap();
        let mut l = t.lines().map(str::to_string).collect::<Vec<_>>();
        assert_eq!(l.remove(0), "h1,h2");
        l
    }

    fn tmpdir(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("rt-queue-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn batches_stand_alone_in_order() {
        let d = tmpdir("order");
        let mut q = Queue::new("h1,h2\n".into(), 1 << 20, &d, &d);
        q.seal().unwrap();
        assert_eq!(q.sealed_len(), 0, "no empty batch");
        q.push("1,a").unwrap();
        q.push("2,b").unwrap();
        q.seal().unwrap();
        q.push("3,c").unwrap();
        q.seal().unwrap();
        let (seq, rows, gz) = q.front().unwrap().unwrap();
        assert_eq!((seq, rows), (1, 2));
        assert_eq!(rows_of(&gz), ["1,a", "2,b"]);
        q.pop_front();
        let (seq, _, gz) = q.front().unwrap().unwrap();
        assert_eq!(seq, 2);
        assert_eq!(rows_of(&gz), ["3,c"]);
        q.pop_front();
        assert_eq!(q.mem_bytes(), 0);
        assert!(q.front().unwrap().is_none());
    }

    #[test]
    fn past_the_limit_batches_spool_and_come_back_in_order() {
        let d = tmpdir("spool");
        // Limit of 4 KiB: the open batch seals every 1 KiB and most batches spool.
        let mut q = Queue::new("h1,h2\n".into(), 4096, &d, &d);
        let mut expect = Vec::new();
        for i in 0..5000 {
            // Incompressible-ish rows so that gzip cannot hide the growth.
            let r = format!("{i},{:x}", (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
            q.push(&r).unwrap();
            expect.push(r);
            assert!(
                q.mem_bytes() <= 4096 + 64,
                "memory {} over the limit",
                q.mem_bytes()
            );
        }
        q.seal().unwrap();
        assert!(q.spooled > 10, "spooled {}", q.spooled);
        assert_eq!(q.rows_waiting(), 5000);
        // The spool file is unlinked.
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 0);
        let (all, complete) = q.csv_upto(usize::MAX).unwrap();
        assert!(complete);
        // Bounded: whole rows only, the first ones, and said to be partial.
        let max = all.len() / 3;
        let (part, complete) = q.csv_upto(max).unwrap();
        assert!(!complete && part.len() <= max && all.starts_with(&part));
        assert!(part.ends_with('\n') && part.lines().count() > 1);
        assert_eq!(all.lines().skip(1).collect::<Vec<_>>(), expect);
        let mut got = Vec::new();
        let mut last = 0;
        while let Some((seq, _, gz)) = q.front().unwrap() {
            assert_eq!(seq, last + 1);
            last = seq;
            got.extend(rows_of(&gz));
            q.pop_front();
        }
        assert_eq!(got, expect);
        assert_eq!(q.spool_end, 0, "spool truncated once empty");
    }

    #[test]
    fn keep_writes_what_was_not_uploaded() {
        let d = tmpdir("keep");
        let mut q = Queue::new("h1,h2\n".into(), 1 << 20, &d, &d);
        q.push("1,a").unwrap();
        q.seal().unwrap();
        q.push("2,b").unwrap();
        let (out, n) = q.keep(&d, "kept-").unwrap().unwrap();
        assert_eq!(n, 2);
        assert!(out.starts_with(&d), "{}", out.display());
        assert_eq!(
            rows_of(&std::fs::read(out.join("0001.csv.gz")).unwrap()),
            ["1,a"]
        );
        assert_eq!(
            rows_of(&std::fs::read(out.join("0002.csv.gz")).unwrap()),
            ["2,b"]
        );
        assert_eq!(q.rows_waiting(), 0);
    }

    /// A spool that cannot be written loses nothing: batches go to kept files and,
    /// when those fail too, stay in memory; all come back in order.
    #[test]
    fn a_failing_spool_keeps_every_batch() {
        let d = tmpdir("spoolfail");
        let gone = d.join("gone");
        for (kept_parent, in_files) in [(d.clone(), true), (gone.clone(), false)] {
            let mut q = Queue::new("h1,h2\n".into(), 256, &gone, &kept_parent);
            let mut expect = Vec::new();
            for i in 0..200 {
                let r = format!("{i},{:x}", (i as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15));
                q.push(&r).unwrap();
                expect.push(r);
            }
            q.seal().unwrap();
            assert!(q.spool_failed.is_some());
            assert_eq!(q.kept_failed.is_none(), in_files);
            assert_eq!(q.rows_waiting(), 200);
            let mut got = Vec::new();
            while let Some((_, _, gz)) = q.front().unwrap() {
                got.extend(rows_of(&gz));
                q.pop_front();
            }
            assert_eq!(got, expect);
        }
        // Uploaded batches leave no kept file behind.
        let left: Vec<_> = std::fs::read_dir(&d)
            .unwrap()
            .flatten()
            .flat_map(|e| std::fs::read_dir(e.path()).into_iter().flatten())
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    /// `keep` into a directory that cannot take the batches changes nothing, and
    /// `keep_in_fallback` then writes them to the kept directory.
    #[test]
    fn keep_is_all_or_nothing_then_falls_back() {
        let d = tmpdir("keepfail");
        let mut q = Queue::new("h1,h2\n".into(), 1 << 20, &d, &d);
        q.push("1,a").unwrap();
        q.seal().unwrap();
        q.push("2,b").unwrap();
        assert!(q.keep(&d.join("gone"), "kept-").is_err());
        assert_eq!(q.rows_waiting(), 2);
        let (dir, lost) = q.keep_in_fallback();
        let dir = dir.unwrap();
        assert_eq!(lost, 0);
        assert_eq!(
            rows_of(&std::fs::read(dir.join("0001.csv.gz")).unwrap()),
            ["1,a"]
        );
        assert_eq!(
            rows_of(&std::fs::read(dir.join("0002.csv.gz")).unwrap()),
            ["2,b"]
        );
    }
}
