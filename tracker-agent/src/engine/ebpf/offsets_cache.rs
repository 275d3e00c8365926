//! The kernel offsets found in its BTF, kept for the rest of the boot. Reading
//! /sys/kernel/btf/vmlinux (~6 MB, a page per read) and parsing it is ~6 ms of
//! every start, and a kernel's layout cannot change before the next boot.
//!
//! A file per boot (its `boot_id`) and per tracker binary (the executable's
//! device, inode, size and modification time: another build may find offsets
//! otherwise), in a directory that is root's alone (`fsafe::own_dir`), read only
//! when it is that directory's regular file of exactly the struct's size.

use std::{
    io::{Read as _, Write as _},
    os::{fd::AsRawFd as _, unix::fs::MetadataExt as _},
    path::Path,
};

use tracker_common::Offsets;

use crate::fsafe;

/// Where the offsets are kept: /run is a tmpfs the boot empties.
pub const DIR: &str = "/run/resource-tracker";

/// The cache file's name for this boot and this binary.
pub fn name() -> Option<String> {
    let boot = std::fs::read_to_string("/proc/sys/kernel/random/boot_id").ok()?;
    let exe = std::fs::metadata("/proc/self/exe").ok()?;
    Some(format!(
        "offsets-{}-{:x}-{:x}-{:x}-{:x}.{:x}",
        boot.trim(),
        exe.dev(),
        exe.ino(),
        exe.size(),
        exe.mtime(),
        exe.mtime_nsec()
    ))
}

fn as_bytes(o: &Offsets) -> &[u8] {
    // SAFETY: Offsets is repr(C) and made only of u32s (no padding): every byte of
    // it is initialised, and the slice lives as long as the borrow.
    unsafe { std::slice::from_raw_parts((o as *const Offsets).cast::<u8>(), size_of::<Offsets>()) }
}

/// The offsets kept in `dir` under `name`, where there are some.
pub fn read(dir: &Path, name: &str) -> Option<Offsets> {
    let d = fsafe::own_dir(dir).ok()?;
    let f = fsafe::open_in(&d, name).ok()?;
    let m = f.metadata().ok()?;
    if !m.is_file() || m.uid() != fsafe::euid() || m.len() != size_of::<Offsets>() as u64 {
        return None;
    }
    let mut buf = Vec::with_capacity(size_of::<Offsets>());
    f.take(size_of::<Offsets>() as u64 + 1)
        .read_to_end(&mut buf)
        .ok()?;
    if buf.len() != size_of::<Offsets>() {
        return None;
    }
    // SAFETY: the buffer holds exactly size_of::<Offsets>() bytes, and any bytes
    // are a valid Offsets (u32s only); read_unaligned needs no alignment.
    Some(unsafe { std::ptr::read_unaligned(buf.as_ptr().cast::<Offsets>()) })
}

/// Keeps `o` in `dir` under `name`: written to a new file of its own, then
/// renamed into place, so a reader sees the whole file or none. Other files of
/// earlier binaries are removed.
pub fn write(dir: &Path, name: &str, o: &Offsets) -> std::io::Result<()> {
    let d = fsafe::own_dir(dir)?;
    let tmp = format!(".{name}.{}", std::process::id());
    let mut f = fsafe::create_in(&d, &tmp, false)?;
    let c = |s: &str| {
        std::ffi::CString::new(s)
            .map_err(|_| std::io::Error::from(std::io::ErrorKind::InvalidInput))
    };
    let (from, to) = (c(&tmp)?, c(name)?);
    let done = f.write_all(as_bytes(o)).and_then(|()| {
        // SAFETY: a valid directory descriptor and C strings.
        let r = unsafe { libc::renameat(d.as_raw_fd(), from.as_ptr(), d.as_raw_fd(), to.as_ptr()) };
        if r == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    });
    if done.is_err() {
        // SAFETY: as above.
        unsafe { libc::unlinkat(d.as_raw_fd(), from.as_ptr(), 0) };
    }
    done?;
    if let Ok(entries) = std::fs::read_dir(dir) {
        for e in entries.flatten() {
            let n = e.file_name();
            let n = n.to_string_lossy();
            if n.starts_with("offsets-") && n != name {
                if let Ok(old) = c(&n) {
                    // SAFETY: as above.
                    unsafe { libc::unlinkat(d.as_raw_fd(), old.as_ptr(), 0) };
                }
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    fn some() -> Offsets {
        Offsets {
            task_pid: 1,
            task_tgid: 2,
            tick_ns: 10_000_000,
            mm_rss_stat: tracker_common::NO_FIELD,
            ..Offsets::default()
        }
    }

    #[test]
    fn kept_and_read_back_and_refused_where_not_its_own() {
        let base = std::env::temp_dir().join(format!("rt-offsets-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        let dir = base.join("cache");
        std::fs::create_dir_all(&base).unwrap();
        assert_eq!(read(&dir, "offsets-a"), None);
        write(&dir, "offsets-a", &some()).unwrap();
        assert_eq!(read(&dir, "offsets-a"), Some(some()));
        assert_eq!(
            std::fs::metadata(&dir).unwrap().permissions().mode() & 0o777,
            0o700
        );
        // Another binary's file goes when this one's is kept.
        write(&dir, "offsets-b", &some()).unwrap();
        assert!(!dir.join("offsets-a").exists());
        // A file of another size, a link, a directory others may write: not read.
        std::fs::write(dir.join("offsets-c"), b"short").unwrap();
        assert_eq!(read(&dir, "offsets-c"), None);
        std::os::unix::fs::symlink(dir.join("offsets-b"), dir.join("offsets-d")).unwrap();
        assert_eq!(read(&dir, "offsets-d"), None);
        std::fs::set_permissions(&dir, std::fs::Permissions::from_mode(0o777)).unwrap();
        assert_eq!(read(&dir, "offsets-b"), None);
        assert!(write(&dir, "offsets-e", &some()).is_err());
        std::fs::remove_dir_all(&base).unwrap();
    }
}
