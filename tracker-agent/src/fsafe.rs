//! Files the tracker creates while it may be root. A name someone else can reach
//! (a predictable path in a shared directory, a path the user typed under sudo) is
//! never followed into a file they could not write themselves:
//! - scratch files have no name (`O_TMPFILE`) or live in a directory of mode 0700
//!   made exclusively, and are created in it through its descriptor with
//!   `O_EXCL|O_NOFOLLOW`;
//! - a file the user named is opened, under sudo, with the invoking user's
//!   file-system identity (the kernel then checks their permissions, and the file is
//!   theirs); as root otherwise, a directory others can write gets `O_NOFOLLOW` and
//!   an existing file must be root's.

use std::{
    ffi::CString,
    fs::File,
    io,
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::{ffi::OsStrExt, fs::MetadataExt, fs::OpenOptionsExt},
    },
    path::{Path, PathBuf},
};

/// The invoking user under sudo, whose files the outputs become.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Owner {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
}

fn cstr(p: &Path) -> io::Result<CString> {
    CString::new(p.as_os_str().as_bytes())
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in the path"))
}

fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// Opens (creates, or truncates) a file the user named, for writing.
pub fn create_output(path: &Path, owner: Option<&Owner>) -> io::Result<File> {
    match owner {
        Some(o) => as_user(o, || {
            File::options()
                .write(true)
                .create(true)
                .truncate(true)
                .mode(0o644)
                .custom_flags(libc::O_CLOEXEC)
                .open(path)
        }),
        None if euid() == 0 => create_as_root(path),
        None => File::create(path),
    }
}

/// Root without sudo: an output in a directory that others can write is neither
/// followed nor taken over from someone else.
fn create_as_root(path: &Path) -> io::Result<File> {
    let dir = match path.parent() {
        Some(d) if !d.as_os_str().is_empty() => d,
        _ => Path::new("."),
    };
    let shared = std::fs::metadata(dir).is_ok_and(|m| {
        let mode = m.mode();
        m.uid() != 0 || mode & 0o002 != 0 || (mode & 0o020 != 0 && m.gid() != 0)
    });
    if !shared {
        return File::create(path);
    }
    let f = File::options()
        .write(true)
        .create(true)
        .mode(0o644)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path)?;
    let m = f.metadata()?;
    if m.uid() != 0 || !m.file_type().is_file() || m.nlink() != 1 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "it belongs to uid {} in a directory others can write; not written as root",
                m.uid()
            ),
        ));
    }
    f.set_len(0)?;
    Ok(f)
}

/// Runs `f` on a thread that carries `o`'s file-system identity. Raw system calls
/// change only the calling thread's credentials (glibc's wrappers would change every
/// thread's), and the thread ends with `f`.
fn as_user<T: Send>(o: &Owner, f: impl FnOnce() -> io::Result<T> + Send) -> io::Result<T> {
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: plain system calls on this thread's credentials; `groups`
            // outlives the call.
            let set = unsafe {
                if libc::syscall(libc::SYS_setgroups, o.groups.len(), o.groups.as_ptr()) != 0 {
                    return Err(io::Error::last_os_error());
                }
                libc::syscall(libc::SYS_setfsgid, o.gid);
                libc::syscall(libc::SYS_setfsuid, o.uid);
                // An invalid id changes nothing and returns the current one.
                (
                    libc::syscall(libc::SYS_setfsuid, u32::MAX),
                    libc::syscall(libc::SYS_setfsgid, u32::MAX),
                )
            };
            if set != (i64::from(o.uid), i64::from(o.gid)) {
                return Err(io::Error::new(
                    io::ErrorKind::PermissionDenied,
                    format!("cannot act as uid {} gid {}", o.uid, o.gid),
                ));
            }
            f()
        })
        .join()
        .unwrap_or_else(|_| Err(io::Error::other("the thread opening the file failed")))
    })
}

/// A file with no name in `dir` (`O_TMPFILE`), gone when closed. Where the file
/// system cannot do that, a file made in a private directory and unlinked at once.
pub fn anonymous_file(dir: &Path) -> io::Result<File> {
    let tmp = File::options()
        .read(true)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_TMPFILE | libc::O_CLOEXEC)
        .open(dir);
    match tmp {
        Ok(f) => Ok(f),
        Err(e)
            if e.raw_os_error() == Some(libc::EOPNOTSUPP)
                || e.raw_os_error() == Some(libc::EISDIR) =>
        {
            let (path, d) = private_dir(dir, "resource-tracker-")?;
            let f = create_in(&d, "spool", true);
            let _ = std::fs::remove_file(path.join("spool"));
            let _ = std::fs::remove_dir(&path);
            f
        }
        Err(e) => Err(e),
    }
}

/// A new directory `parent/PREFIXxxxxxx`, mode 0700, made exclusively (mkdtemp) and
/// held open: later files are made through the descriptor, not the name.
pub fn private_dir(parent: &Path, prefix: &str) -> io::Result<(PathBuf, OwnedFd)> {
    let template = parent.join(format!("{prefix}XXXXXX"));
    let mut buf = cstr(&template)?.into_bytes_with_nul();
    // SAFETY: buf is a NUL-terminated template that mkdtemp rewrites in place.
    let p = unsafe { libc::mkdtemp(buf.as_mut_ptr().cast()) };
    if p.is_null() {
        return Err(io::Error::last_os_error());
    }
    buf.pop();
    let path = PathBuf::from(std::ffi::OsStr::from_bytes(&buf));
    let c = cstr(&path)?;
    // SAFETY: c is a valid C string; the flags make open refuse anything but a
    // directory that is not a link.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_RDONLY | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just opened and is owned by nobody else.
    let fd = unsafe { OwnedFd::from_raw_fd(fd) };
    let m = File::from(fd.try_clone()?).metadata()?;
    if m.uid() != euid() || m.mode() & 0o077 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{} is not the private directory just made", path.display()),
        ));
    }
    Ok((path, fd))
}

/// Creates `name` in the directory open as `dir`: never an existing file, never
/// through a link. `read`: also open it for reading.
pub fn create_in(dir: &OwnedFd, name: &str, read: bool) -> io::Result<File> {
    let c = CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in the name"))?;
    let access = if read { libc::O_RDWR } else { libc::O_WRONLY };
    // SAFETY: a valid directory descriptor and C string.
    let fd = unsafe {
        libc::openat(
            dir.as_raw_fd(),
            c.as_ptr(),
            access | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
            0o600 as libc::c_uint,
        )
    };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just opened and is owned by nobody else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Seek, Write};

    use super::*;

    fn scratch(name: &str) -> PathBuf {
        let d = std::env::temp_dir().join(format!("rt-fsafe-{}-{name}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        d
    }

    #[test]
    fn anonymous_files_have_no_name() {
        let d = scratch("anon");
        let mut f = anonymous_file(&d).unwrap();
        f.write_all(b"abc").unwrap();
        f.rewind().unwrap();
        let mut s = String::new();
        f.read_to_string(&mut s).unwrap();
        assert_eq!(s, "abc");
        assert_eq!(std::fs::read_dir(&d).unwrap().count(), 0);
    }

    #[test]
    fn private_dirs_are_new_and_refuse_links_inside() {
        let d = scratch("priv");
        let (p1, fd) = private_dir(&d, "x-").unwrap();
        let (p2, _) = private_dir(&d, "x-").unwrap();
        assert_ne!(p1, p2);
        assert_eq!(std::fs::metadata(&p1).unwrap().mode() & 0o777, 0o700);
        let mut f = create_in(&fd, "a", false).unwrap();
        f.write_all(b"1").unwrap();
        assert_eq!(
            create_in(&fd, "a", false).unwrap_err().kind(),
            io::ErrorKind::AlreadyExists
        );
        std::os::unix::fs::symlink("/etc/hostname", p1.join("l")).unwrap();
        assert!(create_in(&fd, "l", false).is_err());
        assert_eq!(std::fs::read(p1.join("a")).unwrap(), b"1");
    }
}
