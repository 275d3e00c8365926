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
//!
//! No file the user names is opened so that it can block: every open is
//! `O_NONBLOCK` (a FIFO nobody reads or writes answers at once), and what it opened
//! must be a regular file unless the path names a device or a descriptor
//! (/dev/null, /dev/stdout, /proc/self/fd/N). Reads of such inputs are bounded.

use std::{
    ffi::CString,
    fs::File,
    io::{self, Read as _},
    os::{
        fd::{AsRawFd, FromRawFd, OwnedFd},
        unix::{
            ffi::OsStrExt,
            fs::{FileTypeExt as _, MetadataExt, OpenOptionsExt},
        },
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

pub fn euid() -> u32 {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() }
}

/// Whether the path names a device or a descriptor, which may be a terminal or a
/// pipe by the user's choice (`-o /dev/stdout | jq`, `<(…)`): under /dev, or a
/// process's `fd` directory in /proc.
fn names_a_device(path: &Path) -> bool {
    path.starts_with("/dev")
        || (path.starts_with("/proc") && path.components().any(|c| c.as_os_str() == "fd"))
}

/// What a file that is not a regular file is, in words.
fn kind_of(ft: std::fs::FileType) -> &'static str {
    if ft.is_fifo() {
        "a FIFO (named pipe)"
    } else if ft.is_socket() {
        "a socket"
    } else if ft.is_char_device() {
        "a character device"
    } else if ft.is_block_device() {
        "a block device"
    } else if ft.is_dir() {
        "a directory"
    } else {
        "not a regular file"
    }
}

/// A file opened with `O_NONBLOCK`: refused unless it is a regular file or the
/// path names a device; then made blocking again (a pipe to a slow reader is
/// waited for, not failed).
fn checked(f: File, path: &Path) -> io::Result<File> {
    let ft = f.metadata()?.file_type();
    if !ft.is_file() && !names_a_device(path) {
        return Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            format!("it is {}, not a regular file", kind_of(ft)),
        ));
    }
    // SAFETY: fcntl on a descriptor this function owns, with integer arguments.
    let ok = unsafe {
        let flags = libc::fcntl(f.as_raw_fd(), libc::F_GETFL);
        flags >= 0 && libc::fcntl(f.as_raw_fd(), libc::F_SETFL, flags & !libc::O_NONBLOCK) >= 0
    };
    if !ok {
        return Err(io::Error::last_os_error());
    }
    Ok(f)
}

/// What an existing path is when it is neither a regular file nor a device or
/// descriptor the user named (see `names_a_device`): a FIFO, a socket…; None
/// otherwise (a missing path included).
pub fn not_regular(path: &Path) -> Option<&'static str> {
    let ft = std::fs::metadata(path).ok()?.file_type();
    (!ft.is_file() && !names_a_device(path)).then(|| kind_of(ft))
}

/// Whether what stands at `path` was put there by someone other than the user
/// an output is written for (`owner`, else this process): a FIFO, a socket or a
/// device the path does not name as one, or anything (a link included) of
/// another user. A directory or the user's own file is the user's mistake.
pub fn someone_elses(path: &Path, owner: Option<&Owner>) -> bool {
    let Ok(m) = std::fs::symlink_metadata(path) else {
        return false;
    };
    let ft = m.file_type();
    if ft.is_dir() {
        return false;
    }
    let me = owner.map_or_else(euid, |o| o.uid);
    let odd = !ft.is_file() && !ft.is_symlink() && !names_a_device(path);
    odd || m.uid() != me
}

/// Whether this process may write `path` (a read-only mount says so even to root).
pub fn writable(path: &Path) -> io::Result<()> {
    let c = cstr(path)?;
    // SAFETY: a valid C string; faccessat only inspects the path.
    let r = unsafe { libc::faccessat(libc::AT_FDCWD, c.as_ptr(), libc::W_OK, libc::AT_EACCESS) };
    if r == 0 {
        Ok(())
    } else {
        Err(io::Error::last_os_error())
    }
}

/// Whether `owner` (the invoking user under sudo) may write in the directory
/// `path`. The kernel's own check with the file-system identity `as_user` sets:
/// faccessat2 with AT_EACCESS (5.8+), or, where there is none, a nameless file
/// made in it (glibc before 2.33 turns AT_EACCESS into a check of the real uid,
/// which is root's here).
pub fn writable_as(path: &Path, owner: &Owner) -> io::Result<()> {
    let c = cstr(path)?;
    as_user(owner, || {
        // SAFETY: a valid C string; faccessat2 only inspects the path.
        let r = unsafe {
            libc::syscall(
                libc::SYS_faccessat2,
                libc::AT_FDCWD,
                c.as_ptr(),
                libc::W_OK,
                libc::AT_EACCESS,
            )
        };
        if r == 0 {
            return Ok(());
        }
        let e = io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::ENOSYS) {
            return Err(e);
        }
        anonymous_file(path).map(drop)
    })
}

/// A write-only open of a FIFO that no one reads fails with ENXIO: said as such.
fn no_reader(e: io::Error) -> io::Error {
    if e.raw_os_error() == Some(libc::ENXIO) {
        io::Error::new(
            io::ErrorKind::InvalidInput,
            "it is a FIFO (named pipe) or a device with nothing behind it, not a regular file",
        )
    } else {
        e
    }
}

fn write_options(extra: i32) -> std::fs::OpenOptions {
    let mut o = File::options();
    o.write(true)
        .create(true)
        .mode(0o644)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC | extra);
    o
}

/// Opens (creates, or truncates) a file the user named, for writing; never blocks
/// on a FIFO or device (see the module's note).
pub fn create_output(path: &Path, owner: Option<&Owner>) -> io::Result<File> {
    let f = match owner {
        Some(o) => as_user(o, || write_options(0).open(path)),
        None if euid() == 0 => create_as_root(path),
        None => write_options(0).open(path),
    }
    .map_err(no_reader)?;
    let f = checked(f, path)?;
    if f.metadata()?.file_type().is_file() {
        f.set_len(0)?;
    }
    Ok(f)
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
        return write_options(0).open(path);
    }
    let f = write_options(libc::O_NOFOLLOW).open(path)?;
    let m = f.metadata()?;
    if m.uid() != 0 || !m.file_type().is_file() || m.nlink() != 1 {
        let what = if m.file_type().is_file() {
            "it"
        } else {
            kind_of(m.file_type())
        };
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{what} belongs to uid {} in a directory others can write; not written as root",
                m.uid()
            ),
        ));
    }
    Ok(f)
}

/// Opens a file the user named for reading: never blocks (a FIFO, a device), and
/// must be a regular file unless the path names a device.
pub fn open_input(path: &Path) -> io::Result<File> {
    let f = File::options()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)?;
    checked(f, path)
}

/// `open_input`, under sudo with the invoking user's rights (`owner`): a file
/// they could not read themselves is refused by the kernel, as it would be without
/// sudo.
pub fn open_input_as(path: &Path, owner: Option<&Owner>) -> io::Result<File> {
    match owner {
        Some(o) => as_user(o, || open_input(path)),
        None => open_input(path),
    }
}

/// `read_input` with `open_input_as`'s rights.
pub fn read_input_as(path: &Path, max: u64, owner: Option<&Owner>) -> io::Result<Vec<u8>> {
    read_bounded(open_input_as(path, owner)?, max)
}

/// Reads at most `max` bytes from `f`; more is an error that names the bound.
pub fn read_bounded(f: File, max: u64) -> io::Result<Vec<u8>> {
    let mut v = Vec::new();
    f.take(max + 1).read_to_end(&mut v)?;
    if v.len() as u64 > max {
        return Err(io::Error::new(
            io::ErrorKind::FileTooLarge,
            format!("longer than the {} KiB read of it", max >> 10),
        ));
    }
    Ok(v)
}

/// `open_input` and `read_bounded`.
pub fn read_input(path: &Path, max: u64) -> io::Result<Vec<u8>> {
    read_bounded(open_input(path)?, max)
}

/// As root: why a file others could have changed is not to be trusted (not root's
/// nor `invoker`'s, or writable by a group or by others), None when it can be.
/// A device the user named (/dev/null) holds nothing anyone wrote.
pub fn others_can_write(f: &File, invoker: Option<u32>) -> io::Result<Option<String>> {
    let m = f.metadata()?;
    let mode = m.mode() & 0o7777;
    Ok(if !m.file_type().is_file() {
        None
    } else if m.uid() != 0 && Some(m.uid()) != invoker {
        Some(format!("it belongs to uid {}", m.uid()))
    } else if mode & 0o002 != 0 {
        Some(format!("anyone can write it (mode {mode:04o})"))
    } else if mode & 0o020 != 0 && m.gid() != 0 {
        Some(format!("group {} can write it (mode {mode:04o})", m.gid()))
    } else {
        None
    })
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

/// The temp dir, always absolute: `TMPDIR` when it names an absolute path, else
/// /tmp (`TMPDIR=''` or a relative one would put kept files under whatever the
/// working directory is, and name them relative to it).
pub fn temp_dir() -> PathBuf {
    match std::env::var_os("TMPDIR").map(PathBuf::from) {
        Some(p) if p.is_absolute() => p,
        _ => PathBuf::from("/tmp"),
    }
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
    let (fd, m) = open_dir(&path)?;
    if m.uid() != euid() || m.mode() & 0o077 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!("{} is not the private directory just made", path.display()),
        ));
    }
    Ok((path, fd))
}

/// The directory `path`, made (mode 0700) where it is missing, held open: it must
/// be a directory, not a link, this user's, and writable by nobody else, so that
/// what is read from it was written by this user.
pub fn own_dir(path: &Path) -> io::Result<OwnedFd> {
    let c = cstr(path)?;
    // SAFETY: a valid C string.
    if unsafe { libc::mkdir(c.as_ptr(), 0o700) } != 0 {
        let e = io::Error::last_os_error();
        if e.kind() != io::ErrorKind::AlreadyExists {
            return Err(e);
        }
    }
    let (fd, m) = open_dir(path)?;
    if m.uid() != euid() || m.mode() & 0o022 != 0 {
        return Err(io::Error::new(
            io::ErrorKind::PermissionDenied,
            format!(
                "{} is not this user's alone (owner {}, mode {:o})",
                path.display(),
                m.uid(),
                m.mode() & 0o7777
            ),
        ));
    }
    Ok(fd)
}

/// Opens `name` in the directory open as `dir` for reading, never through a link.
pub fn open_in(dir: &OwnedFd, name: &str) -> io::Result<File> {
    open_at(
        dir,
        name,
        libc::O_RDONLY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
    )
}

/// Creates `name` in the directory open as `dir`: never an existing file, never
/// through a link. `read`: also open it for reading.
pub fn create_in(dir: &OwnedFd, name: &str, read: bool) -> io::Result<File> {
    let access = if read { libc::O_RDWR } else { libc::O_WRONLY };
    open_at(
        dir,
        name,
        access | libc::O_CREAT | libc::O_EXCL | libc::O_NOFOLLOW | libc::O_CLOEXEC,
    )
}

/// `openat(dir, name, flags)`, mode 0600 where it creates.
fn open_at(dir: &OwnedFd, name: &str, flags: libc::c_int) -> io::Result<File> {
    let c = CString::new(name)
        .map_err(|_| io::Error::new(io::ErrorKind::InvalidInput, "a NUL byte in the name"))?;
    // SAFETY: a valid directory descriptor and C string.
    let fd = unsafe { libc::openat(dir.as_raw_fd(), c.as_ptr(), flags, 0o600 as libc::c_uint) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: fd was just opened and is owned by nobody else.
    Ok(unsafe { File::from_raw_fd(fd) })
}

/// The directory `path`, held open, and what it is: never through a link, and
/// nothing but a directory.
fn open_dir(path: &Path) -> io::Result<(OwnedFd, std::fs::Metadata)> {
    let c = cstr(path)?;
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
    Ok((fd, m))
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

    /// A FIFO is refused at once, for writing and for reading; a device named
    /// under /dev is taken; an endless input is cut at its bound.
    #[test]
    fn nothing_blocks_and_reads_are_bounded() {
        let d = scratch("nonblock");
        let fifo = d.join("p");
        let c = cstr(&fifo).unwrap();
        // SAFETY: a valid C string.
        assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
        let e = create_output(&fifo, None).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::InvalidInput, "{e}");
        assert!(e.to_string().contains("FIFO"), "{e}");
        let e = open_input(&fifo).unwrap_err();
        assert!(e.to_string().contains("FIFO"), "{e}");
        assert_eq!(not_regular(&fifo), Some("a FIFO (named pipe)"));
        assert!(create_output(Path::new("/dev/null"), None).is_ok());
        assert_eq!(not_regular(Path::new("/dev/null")), None);
        let e = read_input(Path::new("/dev/zero"), 4096).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::FileTooLarge);
        let f = d.join("f");
        std::fs::write(&f, "old contents").unwrap();
        create_output(&f, None).unwrap().write_all(b"new").unwrap();
        assert_eq!(read_input(&f, 3).unwrap(), b"new");
        assert!(read_input(&f, 2).is_err());
    }
}
