//! Starting the tracked command: fork, hold the child until the engine has registered
//! it (so not one instruction of `cmd` runs untracked), drop privileges under sudo,
//! then exec. Exec failures come back through a close-on-exec pipe, like a shell's.

use std::{
    ffi::{CString, OsStr, OsString},
    fmt,
    os::unix::ffi::{OsStrExt, OsStringExt},
    path::{Path, PathBuf},
};

use crate::sudo::RunAs;

#[derive(Debug)]
pub enum LaunchError {
    /// Like a shell: 127 for not found, 126 for found but not executable.
    NotExecutable {
        cmd: String,
        reason: String,
        code: i32,
    },
    Os(String),
}

impl fmt::Display for LaunchError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LaunchError::NotExecutable { cmd, reason, .. } => write!(f, "{cmd}: {reason}"),
            LaunchError::Os(s) => f.write_str(s),
        }
    }
}

impl LaunchError {
    pub fn exit_code(&self) -> i32 {
        match self {
            LaunchError::NotExecutable { code, .. } => *code,
            LaunchError::Os(_) => 125,
        }
    }
}

fn errno_text(e: i32) -> String {
    std::io::Error::from_raw_os_error(e)
        .to_string()
        .split(" (os error")
        .next()
        .unwrap_or("")
        .to_string()
}

fn is_executable(p: &Path) -> Result<(), i32> {
    let c = CString::new(p.as_os_str().as_bytes()).map_err(|_| libc::EINVAL)?;
    let meta = std::fs::metadata(p).map_err(|e| e.raw_os_error().unwrap_or(libc::ENOENT))?;
    if meta.is_dir() {
        return Err(libc::EISDIR);
    }
    // SAFETY: c is a valid NUL-terminated path.
    if unsafe { libc::access(c.as_ptr(), libc::X_OK) } != 0 {
        return Err(libc::EACCES);
    }
    Ok(())
}

/// Resolves `cmd` like execvp: a name with a slash as is, otherwise along PATH.
pub fn resolve(cmd: &OsStr, path_var: Option<&OsStr>) -> Result<PathBuf, LaunchError> {
    let shown = cmd.to_string_lossy().into_owned();
    let fail = |errno: i32| {
        let (reason, code) = match errno {
            libc::ENOENT => ("No such file or directory".to_string(), 127),
            e => (errno_text(e), 126),
        };
        LaunchError::NotExecutable {
            cmd: shown.clone(),
            reason,
            code,
        }
    };
    if cmd.is_empty() {
        return Err(LaunchError::NotExecutable {
            cmd: "''".into(),
            reason: "empty command".into(),
            code: 127,
        });
    }
    if cmd.as_bytes().contains(&b'/') {
        let p = PathBuf::from(cmd);
        return is_executable(&p).map(|_| p).map_err(fail);
    }
    let path = path_var
        .map(|p| p.to_os_string())
        .unwrap_or_else(|| "/usr/local/bin:/usr/bin:/bin".into());
    let mut first_err = None;
    for dir in std::env::split_paths(&path) {
        let cand = if dir.as_os_str().is_empty() {
            PathBuf::from(".").join(cmd)
        } else {
            dir.join(cmd)
        };
        match is_executable(&cand) {
            Ok(()) => return Ok(cand),
            Err(libc::ENOENT) | Err(libc::ENOTDIR) => {}
            Err(e) => {
                first_err.get_or_insert(e);
            }
        }
    }
    Err(match first_err {
        Some(e) => fail(e),
        None => LaunchError::NotExecutable {
            cmd: shown,
            reason: "command not found".into(),
            code: 127,
        },
    })
}

/// A forked child waiting for `release`.
pub struct Paused {
    pub pid: u32,
    go_w: libc::c_int,
    err_r: libc::c_int,
    cmd: String,
}

fn cstr(s: &OsStr) -> Result<CString, LaunchError> {
    CString::new(s.as_bytes())
        .map_err(|_| LaunchError::Os(format!("argument {s:?} contains a NUL byte")))
}

fn pipe_cloexec() -> Result<[libc::c_int; 2], LaunchError> {
    let mut fds = [0; 2];
    // SAFETY: fds has room for two descriptors.
    if unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) } != 0 {
        return Err(LaunchError::Os(format!(
            "pipe2: {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(fds)
}

/// Variables the tracker reads that the command's environment does not get.
pub const SECRET_VARS: [&str; 2] = ["SENTINEL_API_TOKEN", "SENTINEL_API_KEY"];

/// The tracker's own pipes' numbers: meaningless in the command (the fd is closed
/// on exec), and a tracker the command runs must not write into whatever pipe
/// has that number there.
const OWN_FD_VARS: [&str; 2] = ["TRACKER_READY_FD", "TRACKER_ROOT_CHILDREN_FD"];

/// Forks `argv` (argv[0] already resolved to `path`) and leaves it blocked before exec.
pub fn spawn_paused(
    path: &Path,
    argv: &[OsString],
    run_as: Option<&RunAs>,
) -> Result<Paused, LaunchError> {
    let c_path = cstr(path.as_os_str())?;
    let c_argv: Vec<CString> = argv.iter().map(|a| cstr(a)).collect::<Result<_, _>>()?;
    let mut argv_p: Vec<*const libc::c_char> = c_argv.iter().map(|c| c.as_ptr()).collect();
    argv_p.push(std::ptr::null());
    // The tracker's secrets are not the command's: a token handed to the tracker
    // must not reach whatever the tracked command runs.
    let mut env: Vec<(OsString, OsString)> = std::env::vars_os()
        .filter(|(k, _)| !SECRET_VARS.iter().chain(&OWN_FD_VARS).any(|s| k == s))
        .collect();
    if let Some(r) = run_as {
        for (k, v) in [("HOME", &r.home), ("USER", &r.user), ("LOGNAME", &r.user)] {
            env.retain(|(ek, _)| ek != k);
            env.push((k.into(), v.into()));
        }
    }
    let c_env: Vec<CString> = env
        .iter()
        .filter_map(|(k, v)| {
            let mut kv = k.clone().into_vec();
            kv.push(b'=');
            kv.extend_from_slice(v.as_bytes());
            CString::new(kv).ok()
        })
        .collect();
    let mut env_p: Vec<*const libc::c_char> = c_env.iter().map(|c| c.as_ptr()).collect();
    env_p.push(std::ptr::null());
    let groups: Vec<libc::gid_t> = run_as.map(|r| r.groups.clone()).unwrap_or_default();

    let go = pipe_cloexec()?;
    let err = pipe_cloexec()?;
    // SAFETY: after fork the child only calls async-signal-safe functions on data
    // prepared above, then execs or _exits.
    let pid = unsafe { libc::fork() };
    if pid < 0 {
        return Err(LaunchError::Os(format!(
            "fork: {}",
            std::io::Error::last_os_error()
        )));
    }
    if pid == 0 {
        unsafe {
            libc::close(go[1]);
            libc::close(err[0]);
            let mut b = 0u8;
            let n = libc::read(go[0], (&mut b as *mut u8).cast(), 1);
            if n != 1 {
                libc::_exit(125); // the tracker went away before releasing us
            }
            // Rust ignores SIGPIPE and the tracker blocks its forwarded signals;
            // neither must leak into the command.
            libc::signal(libc::SIGPIPE, libc::SIG_DFL);
            let mut empty: libc::sigset_t = std::mem::zeroed();
            libc::sigemptyset(&mut empty);
            libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut());
            // Capabilities the tracker was given to load BPF (ambient CAP_BPF,
            // CAP_PERFMON) are not passed on to the command.
            libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_CLEAR_ALL,
                0,
                0,
                0,
            );
            if let Some(r) = run_as {
                if libc::setgroups(groups.len(), groups.as_ptr()) != 0
                    || libc::setgid(r.gid) != 0
                    || libc::setuid(r.uid) != 0
                {
                    let e = *libc::__errno_location();
                    libc::write(err[1], (&e as *const i32).cast(), 4);
                    libc::_exit(126);
                }
            }
            libc::execve(c_path.as_ptr(), argv_p.as_ptr(), env_p.as_ptr());
            let e = *libc::__errno_location();
            libc::write(err[1], (&e as *const i32).cast(), 4);
            libc::_exit(127);
        }
    }
    // SAFETY: closing our copies of the child's ends.
    unsafe {
        libc::close(go[0]);
        libc::close(err[1]);
    }
    Ok(Paused {
        pid: pid as u32,
        go_w: go[1],
        err_r: err[0],
        cmd: argv[0].to_string_lossy().into_owned(),
    })
}

impl Paused {
    /// Lets the child exec and reports whether the exec succeeded.
    pub fn release(self) -> Result<u32, LaunchError> {
        let b = 1u8;
        // SAFETY: our own descriptors.
        unsafe {
            libc::write(self.go_w, (&b as *const u8).cast(), 1);
            libc::close(self.go_w);
        }
        let mut e = 0i32;
        let n = loop {
            let n = unsafe { libc::read(self.err_r, (&mut e as *mut i32).cast(), 4) };
            if n < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::EINTR) {
                continue;
            }
            break n;
        };
        unsafe { libc::close(self.err_r) };
        if n == 4 {
            let code = if e == libc::ENOENT { 127 } else { 126 };
            return Err(LaunchError::NotExecutable {
                cmd: self.cmd,
                reason: errno_text(e),
                code,
            });
        }
        Ok(self.pid)
    }

    /// Abandons the child (the engine failed): it exits with 125 without running cmd.
    pub fn abort(self) {
        // SAFETY: closing the release pipe makes the child's read return 0.
        unsafe {
            libc::close(self.go_w);
            libc::close(self.err_r);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_like_a_shell() {
        let sh = resolve(
            OsStr::new("sh"),
            Some(OsStr::new("/nonexistent:/bin:/usr/bin")),
        )
        .unwrap();
        assert!(sh.ends_with("sh"));
        let e = resolve(OsStr::new("no-such-cmd-xyz"), Some(OsStr::new("/bin"))).unwrap_err();
        assert_eq!(e.exit_code(), 127);
        assert!(e.to_string().contains("no-such-cmd-xyz"), "{e}");
        let f = std::env::temp_dir().join(format!("rt-noexec-{}", std::process::id()));
        std::fs::write(&f, "data").unwrap();
        let e = resolve(f.as_os_str(), None).unwrap_err();
        let _ = std::fs::remove_file(&f);
        assert_eq!(e.exit_code(), 126, "{e}");
        let e = resolve(OsStr::new("/etc"), None).unwrap_err();
        assert_eq!(e.exit_code(), 126, "{e}");
    }
}
