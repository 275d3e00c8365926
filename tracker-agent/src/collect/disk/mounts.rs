//! The space of a mounted filesystem (statvfs) and the device a mount is on.

use std::{
    ffi::{CStr, OsStr},
    fs,
    os::unix::{ffi::OsStrExt, fs::FileTypeExt, fs::MetadataExt},
};

use super::device::Mount;
use crate::{collect::mountinfo::MountLine, model::sample::MountSample, warn::warn_once};

/// The block device of a mount: its /dev source's device number (btrfs shows an
/// anonymous 0:N in mountinfo), else the mountinfo one; None for pseudo
/// filesystems (major 0 and no /dev source).
pub(super) fn device_of(m: &MountLine) -> Option<(u32, u32)> {
    if m.source.starts_with(b"/dev/") {
        if let Ok(md) = fs::metadata(OsStr::from_bytes(&m.source)) {
            if md.file_type().is_block_device() {
                return Some((libc::major(md.rdev()), libc::minor(md.rdev())));
            }
        }
    }
    (m.majmin.0 != 0).then_some(m.majmin)
}

/// Space of one mount as df shows it; None (with a warning) when statvfs fails.
pub(super) fn mount_usage(m: &Mount) -> Option<MountSample> {
    let st = match statvfs(&m.path) {
        Ok(st) => st,
        Err(e) => {
            warn_once(
                &format!("collect.disk.statvfs.{}", m.mount_point),
                format!("statvfs {}: {e}; mount left out", m.mount_point),
            );
            return None;
        }
    };
    #[allow(clippy::unnecessary_cast)] // the field types differ between targets
    let (blocks, bfree, bavail, frsize) = (
        st.f_blocks as u64,
        st.f_bfree as u64,
        st.f_bavail as u64,
        st.f_frsize as u64,
    );
    if blocks == 0 {
        return None; // nothing to report (autofs-like placeholders)
    }
    let used = blocks.saturating_sub(bfree).saturating_mul(frsize);
    let available = bavail.saturating_mul(frsize);
    let used_pct = if used + available == 0 {
        0.0
    } else {
        used as f64 / (used + available) as f64 * 100.0
    };
    Some(MountSample {
        mount_point: m.mount_point.clone(),
        filesystem: m.filesystem.clone(),
        total_bytes: blocks.saturating_mul(frsize),
        used_bytes: used,
        available_bytes: available,
        used_pct,
    })
}

pub(super) fn statvfs(path: &CStr) -> std::io::Result<libc::statvfs> {
    // SAFETY: zeroed is a valid statvfs; path is NUL-terminated.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid path and out pointer.
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st)
}
