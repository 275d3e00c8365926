//! The files the collectors read: where /proc and /sys are, and files kept open
//! and re-read with `pread` at offset 0 (no path lookup, no open/close per sample),
//! with the few parsers several collectors share.

use std::{
    fs::File,
    io,
    os::unix::fs::FileExt,
    path::{Path, PathBuf},
};

/// Where /proc and /sys are; tests point these at trees they lay out.
#[derive(Clone, Debug)]
pub struct Roots {
    pub proc: PathBuf,
    pub sys: PathBuf,
}

impl Default for Roots {
    fn default() -> Self {
        Roots {
            proc: PathBuf::from("/proc"),
            sys: PathBuf::from("/sys"),
        }
    }
}

/// A file read every sample: opened once and re-read with `pread` at offset 0, which
/// makes procfs and sysfs generate fresh content (no path lookup, no open/close).
pub(crate) struct CachedFile {
    path: PathBuf,
    file: Option<File>,
    end: End,
}

/// How a read shows that the file's end was reached.
#[derive(Clone, Copy, Debug)]
pub(crate) enum End {
    /// Single-record files (/proc/stat, meminfo, sysfs attributes) are complete
    /// after a short read.
    Short,
    /// A seq_file of many records (mountinfo) fills at most its buffer per read, a
    /// page at first, and stops before a record that would overflow it: only a
    /// 0-byte read means the end.
    Zero,
    /// A seq_file whose records are each shorter than this many bytes (a line of
    /// /proc/net/dev or diskstats: under 512): a read that comes back with less than
    /// a page minus that had room for the next record, so there was none. That
    /// saves the read that would return 0, a system call per file and sample;
    /// hosts whose file is longer than that read on.
    LinesUnder(usize),
}

/// The smallest buffer a seq_file fills per read.
const SEQ_PAGE: usize = 4096;

impl CachedFile {
    /// A single-record file (sysfs attribute, /proc/stat, /proc/meminfo).
    pub(crate) fn whole(path: PathBuf) -> CachedFile {
        CachedFile {
            path,
            file: None,
            end: End::Short,
        }
    }

    /// A seq_file of many records.
    pub(crate) fn records(path: PathBuf) -> CachedFile {
        CachedFile {
            path,
            file: None,
            end: End::Zero,
        }
    }

    /// A seq_file of lines each shorter than `max` bytes.
    pub(crate) fn lines_under(path: PathBuf, max: usize) -> CachedFile {
        CachedFile {
            path,
            file: None,
            end: End::LinesUnder(max),
        }
    }

    pub(crate) fn path(&self) -> &Path {
        &self.path
    }

    /// The open file, once a read has opened it.
    pub(crate) fn file(&self) -> Option<&File> {
        self.file.as_ref()
    }

    /// Fresh content into `buf`.
    pub(crate) fn read(&mut self, buf: &mut Vec<u8>) -> io::Result<()> {
        if let Some(f) = &self.file {
            match pread_all(f, buf, self.end) {
                Ok(()) => return Ok(()),
                // The attribute has no value now (speed of a down link); a new fd
                // would say the same.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => return Err(e),
                // The node was removed (device gone or re-created): reopen below.
                Err(_) => self.file = None,
            }
        }
        let f = File::open(&self.path)?;
        let r = pread_all(&f, buf, self.end);
        self.file = Some(f);
        r
    }

    /// `read`, and when it fails a warning given once per `key` for the whole
    /// run, saying what the sample goes without (`lacking`); whether it read.
    pub(crate) fn read_or_warn(&mut self, buf: &mut Vec<u8>, key: &str, lacking: &str) -> bool {
        match self.read(buf) {
            Ok(()) => true,
            Err(e) => {
                crate::warn::warn_once(
                    key,
                    format_args!("cannot read {}: {e}; {lacking}", self.path.display()),
                );
                false
            }
        }
    }
}

/// Reads from offset 0 to the end into `buf` (keeping its capacity between calls).
pub(crate) fn pread_all(f: &File, buf: &mut Vec<u8>, end: End) -> io::Result<()> {
    let cap = buf.capacity().max(SEQ_PAGE);
    buf.clear();
    buf.resize(cap, 0);
    let mut len = 0;
    loop {
        // Room for a whole seq_file buffer at each read, so that a short read is
        // the file's doing, not the room's.
        if buf.len() - len < SEQ_PAGE {
            buf.resize((len * 2).max(len + SEQ_PAGE), 0);
        }
        let want = buf.len() - len;
        let n = match f.read_at(&mut buf[len..], len as u64) {
            Ok(n) => n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
            Err(e) => {
                buf.clear();
                return Err(e);
            }
        };
        len += n;
        let done = match end {
            End::Short => n < want,
            End::Zero => false,
            End::LinesUnder(max) => n < want && n + max <= SEQ_PAGE,
        };
        if n == 0 || done {
            break;
        }
    }
    buf.truncate(len);
    Ok(())
}

/// The number after `key` in a flat keyed file (`key value` lines: cgroups'
/// `cpu.stat`, `memory.stat`, `memory.events`, `memory.oom_control`).
pub(crate) fn keyed(text: &str, key: &str) -> Option<u64> {
    text.lines().find_map(|l| {
        let (k, v) = l.split_once(' ')?;
        (k == key).then(|| v.trim().parse().ok())?
    })
}

/// Undoes mountinfo's octal escapes (`\040` space, `\011` tab, `\012`, `\134`).
pub(crate) fn unescape(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'\\'
            && i + 3 < s.len()
            && s[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = s[i + 1..i + 4]
                .iter()
                .fold(0u32, |a, &c| a * 8 + u32::from(c - b'0'));
            out.push(v as u8);
            i += 4;
        } else {
            out.push(s[i]);
            i += 1;
        }
    }
    out
}

/// A small attribute read once (static device facts): trimmed, empty → None.
pub(crate) fn read_attr(path: &Path) -> Option<String> {
    let bytes = std::fs::read(path).ok()?;
    let s = String::from_utf8_lossy(&bytes);
    let s = s.trim();
    (!s.is_empty()).then(|| s.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collect::testroot;

    #[test]
    fn cached_file_rereads_and_reopens() {
        let t = testroot::TestRoot::new("cached");
        t.write("proc/x", "one\n");
        let mut f = CachedFile::whole(t.path("proc/x"));
        let mut buf = Vec::new();
        f.read(&mut buf).unwrap();
        assert_eq!(buf, b"one\n");
        // Rewritten in place: the cached fd sees the new content.
        t.write("proc/x", "two!\n");
        f.read(&mut buf).unwrap();
        assert_eq!(buf, b"two!\n");
        let big = "a".repeat(10_000);
        t.write("proc/y", &big);
        let mut g = CachedFile::records(t.path("proc/y"));
        g.read(&mut buf).unwrap();
        assert_eq!(buf.len(), 10_000);
        assert!(CachedFile::whole(t.path("proc/none"))
            .read(&mut buf)
            .is_err());
    }

    /// `read` gives all of `name`: compared with two whole reads around it that
    /// agree (kallsyms changes as BPF programs load, diskstats' counters grow a
    /// digit), tried again where they do not.
    fn reads_whole(name: &str, read: impl Fn() -> Vec<u8>) {
        for _ in 0..20 {
            let before = std::fs::read(name).unwrap();
            let got = read();
            if std::fs::read(name).unwrap() == before {
                assert_eq!(got.len(), before.len(), "{name}");
                return;
            }
        }
        panic!("{name} changed under every one of 20 reads");
    }

    #[test]
    fn pread_of_real_seq_files_is_complete() {
        // A seq_file returns at most a page per read: all of a 5 MB file must come.
        let whole = |name: &str, f: fn(PathBuf) -> CachedFile| {
            let name = name.to_string();
            move || {
                let mut buf = Vec::new();
                f(PathBuf::from(&name)).read(&mut buf).unwrap();
                buf
            }
        };
        if std::path::Path::new("/proc/kallsyms").exists() {
            reads_whole(
                "/proc/kallsyms",
                whole("/proc/kallsyms", CachedFile::records),
            );
            // Read to the end without the 0-byte read, where each read but the last
            // comes back nearly a page long: kallsyms' lines (a name under 512
            // bytes) stand in for net/dev's and diskstats' here, as they span many
            // pages.
            reads_whole(
                "/proc/kallsyms",
                whole("/proc/kallsyms", |p| CachedFile::lines_under(p, 1024)),
            );
        }
        for name in ["/proc/diskstats", "/proc/self/net/dev"] {
            reads_whole(name, whole(name, |p| CachedFile::lines_under(p, 512)));
        }
        let mut buf = Vec::new();
        let mut s = CachedFile::whole(PathBuf::from("/proc/stat"));
        s.read(&mut buf).unwrap();
        assert!(buf.ends_with(b"\n") && buf.starts_with(b"cpu "));
        s.read(&mut buf).unwrap();
        assert!(buf.ends_with(b"\n") && buf.starts_with(b"cpu "));
    }
}
