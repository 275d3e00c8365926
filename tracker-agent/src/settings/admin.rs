//! The administrator's word on what a run under sudo may do, in a file only root
//! can change: a sudoers rule for this binary grants tracking, and anything more
//! (the command run as root) only where this file says so.

use std::{
    io::Read as _,
    os::unix::fs::{MetadataExt as _, OpenOptionsExt as _},
    path::Path,
};

/// Where the administrator's policy lives. Fixed: a path a variable or a flag could
/// change would be the invoking user's to pick.
pub const ADMIN_CONFIG: &str = "/etc/resource-tracker.toml";

/// A policy file is a few lines.
const MAX_POLICY: u64 = 64 * 1024;

/// What the administrator allows under sudo (nothing, where the file is absent).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SudoPolicy {
    /// `[sudo] allow_as_root = true`: `--as-root` runs the command as root.
    pub allow_as_root: bool,
}

/// Reads `path` as the administrator's policy: a regular file (not a link) that
/// root owns and only root may write, in a directory that root owns and only root
/// may write. Absent: nothing allowed. Present but not so kept, or not TOML: an
/// error naming the file and why, with none of its content.
pub fn sudo_policy(path: &Path) -> Result<SudoPolicy, String> {
    let name = path.display();
    let f = match std::fs::File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
    {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(SudoPolicy::default()),
        Err(e) => return Err(format!("{name}: {e}")),
    };
    let m = f.metadata().map_err(|e| format!("{name}: {e}"))?;
    if !m.file_type().is_file() || m.uid() != 0 || m.mode() & 0o022 != 0 {
        return Err(format!(
            "{name}: not a regular file that root owns and only root may write; not read"
        ));
    }
    if let Some(dir) = path.parent() {
        let d = std::fs::metadata(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        if d.uid() != 0 || d.mode() & 0o022 != 0 {
            return Err(format!(
                "{name}: its directory {} is not root's alone; not read",
                dir.display()
            ));
        }
    }
    let mut text = String::new();
    f.take(MAX_POLICY + 1)
        .read_to_string(&mut text)
        .map_err(|e| format!("{name}: {e}"))?;
    if text.len() as u64 > MAX_POLICY {
        return Err(format!("{name}: longer than {MAX_POLICY} bytes; not read"));
    }
    parse(&text).map_err(|e| format!("{name}: {e}"))
}

fn parse(text: &str) -> Result<SudoPolicy, String> {
    let t: toml::Table = toml::from_str(text).map_err(|e| {
        // The parser's message may quote the file; only where it is kept.
        let at = e
            .span()
            .map(|s| format!(" at byte {}", s.start))
            .unwrap_or_default();
        format!("not TOML{at}")
    })?;
    let allow = match t.get("sudo").and_then(|s| s.get("allow_as_root")) {
        None => false,
        Some(toml::Value::Boolean(b)) => *b,
        Some(_) => return Err("[sudo] allow_as_root is not true or false".into()),
    };
    Ok(SudoPolicy {
        allow_as_root: allow,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn allows_only_what_it_says() {
        assert_eq!(parse(""), Ok(SudoPolicy::default()));
        assert_eq!(
            parse("[sudo]\nallow_as_root = true\n"),
            Ok(SudoPolicy {
                allow_as_root: true
            })
        );
        assert_eq!(
            parse("[sudo]\nallow_as_root = false\n"),
            Ok(SudoPolicy::default())
        );
        let e = parse("[sudo]\nallow_as_root = \"yes\"\n").unwrap_err();
        assert!(e.contains("allow_as_root"), "{e}");
        let e = parse("secret = \"s3cr3t\" oops").unwrap_err();
        assert!(!e.contains("s3cr3t"), "{e}");
    }

    #[test]
    fn absent_allows_nothing() {
        let p = Path::new("/nonexistent-rt-policy/resource-tracker.toml");
        assert_eq!(sudo_policy(p), Ok(SudoPolicy::default()));
    }
}
