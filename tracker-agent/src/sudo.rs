//! Who ran `sudo resource-tracker`: the user whose rights bound what the tracker
//! does for them (the command, the outputs, the files they name), resolved from
//! SUDO_UID/SUDO_GID with that user's groups and home.

use std::ffi::CString;

use crate::fsafe::Owner;

/// The identity the command runs as, when the tracker drops root for it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct RunAs {
    pub uid: u32,
    pub gid: u32,
    pub groups: Vec<u32>,
    pub user: String,
    pub home: String,
}

impl RunAs {
    /// Makes this whole process the user's for good (groups, gid, uid): for a job
    /// that needs no privilege, so that under sudo every file it reads or writes
    /// is opened with the rights of the user who named it. Checked afterwards: a
    /// process that could still become root again is an error.
    pub fn become_for_good(&self) -> Result<(), String> {
        // SAFETY: plain system calls on this process with valid arguments; the
        // tracker has no other thread yet that could act on the old credentials.
        let failed = unsafe {
            libc::setgroups(self.groups.len(), self.groups.as_ptr()) != 0
                || libc::setgid(self.gid) != 0
                || libc::setuid(self.uid) != 0
        };
        if failed {
            return Err(format!(
                "cannot become user {} (uid {}): {}",
                self.user,
                self.uid,
                std::io::Error::last_os_error()
            ));
        }
        // SAFETY: setuid(0) only asks; on success the drop did not hold.
        if unsafe { libc::setuid(0) } == 0 {
            return Err(format!(
                "became user {} (uid {}) but could become root again",
                self.user, self.uid
            ));
        }
        Ok(())
    }

    /// Whose the tracker's outputs become.
    pub fn owner(&self) -> Owner {
        Owner {
            uid: self.uid,
            gid: self.gid,
            groups: self.groups.clone(),
        }
    }
}

/// Why this tracker does not run at all, when it is a set-user-ID root binary run
/// by a user (real uid not root, effective uid root): root's rights with that
/// user's environment, config and paths, which no check of the tracker's bounds.
/// Real sudo makes the real uid root too, so a SUDO_UID the user set cannot pass
/// this for sudo. Checked before any setting is resolved or file read.
pub fn set_user_id_root() -> Option<String> {
    // SAFETY: getuid and geteuid have no preconditions.
    let (uid, euid) = unsafe { (libc::getuid(), libc::geteuid()) };
    (euid == 0 && uid != 0).then(|| {
        format!(
            "the tracker runs as root for uid {uid} (a set-user-ID root binary?): not a way to \
             grant tracking; use a sudoers rule or `setcap cap_bpf,cap_perfmon+ep` on the \
             binary (docs/deploy.md)"
        )
    })
}

/// A user (not root) whose tracker holds the capabilities that load the BPF
/// programs without sudo: the binary's file capabilities (an administrator's
/// `setcap cap_bpf,cap_perfmon+ep`) or ambient ones. Like a sudoers rule, they
/// grant tracking and nothing more: the session attaches only to the user's own
/// processes and takes no engine setting from their environment. Everything else
/// the tracker does is the user's already (its uids are theirs).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Grant {
    pub uid: u32,
}

/// The capability grant this tracker runs with, if any.
pub fn capability_grant() -> Option<Grant> {
    // The effective uid: the one the kernel checks a process's files against
    // (/proc/PID/io is read with the file-system uid, which follows it).
    // SAFETY: geteuid has no preconditions.
    let uid = unsafe { libc::geteuid() };
    (uid != 0 && crate::sys::may_load_bpf()).then_some(Grant { uid })
}

/// The user who ran sudo: SUDO_UID/SUDO_GID (with that user's groups and home)
/// when the tracker is root. The command runs as them unless `--as-root`, and the
/// outputs they named are theirs.
pub fn invoker() -> Result<Option<RunAs>, String> {
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return Ok(None);
    }
    let Some(uid) = std::env::var_os("SUDO_UID") else {
        return Ok(None);
    };
    let uid: u32 = uid
        .to_str()
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| format!("SUDO_UID={uid:?} is not a number"))?;
    if uid == 0 {
        return Ok(None);
    }
    // (uid_t)-1 means "no change" to setuid and friends: never a user to become.
    if uid == u32::MAX {
        return Err(format!(
            "SUDO_UID={uid} is not a user id (it means \"none\" to the kernel)"
        ));
    }
    let gid_env = std::env::var_os("SUDO_GID");
    let mut pwbuf = vec![0u8; 16384];
    // SAFETY: passwd is plain data; getpwuid_r writes into the buffers we own.
    let mut pw: libc::passwd = unsafe { std::mem::zeroed() };
    let mut res: *mut libc::passwd = std::ptr::null_mut();
    let rc = unsafe {
        libc::getpwuid_r(
            uid,
            &mut pw,
            pwbuf.as_mut_ptr().cast(),
            pwbuf.len(),
            &mut res,
        )
    };
    let (user, home, pw_gid) = if rc == 0 && !res.is_null() {
        // SAFETY: on success the strings point into pwbuf.
        let cs = |p: *const libc::c_char| {
            unsafe { std::ffi::CStr::from_ptr(p) }
                .to_string_lossy()
                .into_owned()
        };
        (cs(pw.pw_name), cs(pw.pw_dir), Some(pw.pw_gid))
    } else {
        (
            std::env::var("SUDO_USER").unwrap_or_else(|_| uid.to_string()),
            "/".to_string(),
            None,
        )
    };
    let gid: u32 = match gid_env {
        Some(g) => g
            .to_str()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| format!("SUDO_GID={g:?} is not a number"))
            .and_then(|g: u32| match g {
                u32::MAX => Err(format!(
                    "SUDO_GID={g} is not a group id (it means \"none\" to the kernel)"
                )),
                g => Ok(g),
            })?,
        None => pw_gid
            .ok_or_else(|| format!("SUDO_UID={uid} has no passwd entry and SUDO_GID is unset"))?,
    };
    let mut groups = vec![gid];
    if res.is_null() {
        return Ok(Some(RunAs {
            uid,
            gid,
            groups,
            user,
            home,
        }));
    }
    let mut n: libc::c_int = 64;
    loop {
        let mut list = vec![0 as libc::gid_t; n as usize];
        let cuser =
            CString::new(user.clone()).map_err(|_| "user name has a NUL byte".to_string())?;
        // SAFETY: list has n entries; getgrouplist updates n.
        let r = unsafe { libc::getgrouplist(cuser.as_ptr(), gid, list.as_mut_ptr(), &mut n) };
        if r >= 0 {
            list.truncate(n as usize);
            groups = list;
            break;
        }
        if n > 65536 {
            break;
        }
        n *= 2;
    }
    Ok(Some(RunAs {
        uid,
        gid,
        groups,
        user,
        home,
    }))
}
