//! /proc/self/mountinfo lines, for the disks' mounts and the cgroup hierarchies.
//!
//! Parsed here rather than with procfs-core's `MountInfos`: 5.7–6.3× the parse
//! (2.0–2.1× read and parse; 330 allocations against 63 for 21 mounts), mount
//! points left escaped, and one non-UTF-8 path fails the whole table where this
//! keeps every mount (docs/layout.md, "Parsers").

use super::files::unescape;

/// One mount; what only some readers need stays borrowed from the line.
pub struct MountLine<'a> {
    pub majmin: (u32, u32),
    /// The mount's root within its filesystem (a cgroup mount's: the cgroup it
    /// shows), as mountinfo escapes it.
    pub root: &'a [u8],
    pub mount_point: Vec<u8>,
    pub fstype: String,
    pub source: Vec<u8>,
    /// The super options (a v1 cgroup mount's controllers).
    pub super_options: &'a [u8],
}

impl MountLine<'_> {
    pub fn root_is_slash(&self) -> bool {
        self.root == b"/"
    }

    /// Preferred over `other` for the same device: the mount of the filesystem's
    /// root, then the shortest mount point.
    pub fn better_than(&self, other: &MountLine) -> bool {
        (!self.root_is_slash(), self.mount_point.len())
            < (!other.root_is_slash(), other.mount_point.len())
    }
}

/// `id parent maj:min root mount_point options [optional...] - fstype source super`.
pub fn parse_line(line: &[u8]) -> Option<MountLine<'_>> {
    let mut it = line.split(|&b| b == b' ');
    let majmin = std::str::from_utf8(it.nth(2)?).ok()?;
    let (maj, min) = majmin.split_once(':')?;
    let majmin = (maj.parse().ok()?, min.parse().ok()?);
    let root = it.next()?;
    let mount_point = unescape(it.next()?);
    it.next()?; // options
    while it.next()? != b"-" {}
    let fstype = String::from_utf8_lossy(it.next()?).into_owned();
    let source = unescape(it.next()?);
    let super_options = it.next().unwrap_or_default();
    Some(MountLine {
        majmin,
        root,
        mount_point,
        fstype,
        source,
        super_options,
    })
}

/// Every line of a mountinfo text that parses.
pub fn parse(text: &[u8]) -> impl Iterator<Item = MountLine<'_>> {
    text.split(|&b| b == b'\n').filter_map(parse_line)
}
