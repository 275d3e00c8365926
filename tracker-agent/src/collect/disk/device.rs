//! What the disk collector keeps of a device and of a filesystem, shared by its
//! parts.

use std::ffi::CString;

use crate::model::sample::DiskSample;

/// /proc/diskstats counts 512-byte sectors whatever the device's sector size.
pub(super) const SECTOR: u64 = 512;

/// How deep a dm/md stack is followed (real stacks are 2–3 deep).
pub(super) const MAX_STACK: usize = 8;

pub(super) struct Disk {
    /// Static facts; counters, rates and mounts are filled per sample.
    pub(super) info: DiskSample,
    /// Bytes read, written in the previous reading.
    pub(super) prev: Option<(u64, u64)>,
    pub(super) cur: Option<(u64, u64)>,
}

/// A filesystem kept after de-duplication, with the disk it counts on.
pub(super) struct Mount {
    pub(super) disk: String,
    pub(super) mount_point: String,
    pub(super) path: CString,
    pub(super) filesystem: String,
}
