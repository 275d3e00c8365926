//! Checks shared by every layer: each names where a bad value came from.

use std::{
    ffi::OsString,
    path::{Path, PathBuf},
};

use crate::{discovery::Endpoints, model::meta::meta_text};

pub type GetEnv<'a> = &'a dyn Fn(&str) -> Option<OsString>;

/// The longest duration accepted anywhere: a year. Longer ones are typing errors,
/// and past about 1.8e19 seconds a `Duration` cannot even hold them.
pub const MAX_SECS: f64 = 365.0 * 86400.0;

/// A number of seconds from `origin` (a flag, a variable or a file key), at least
/// `min` and at most a year.
pub fn seconds(origin: &str, text: &str, min: f64) -> Result<f64, String> {
    let v: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{origin}: '{text}' is not a number of seconds"))?;
    if !v.is_finite() || v <= 0.0 {
        return Err(format!(
            "{origin}: must be a positive number of seconds, got '{text}'"
        ));
    }
    if v < min {
        return Err(format!(
            "{origin}: the smallest value is {min} seconds, got '{text}'"
        ));
    }
    if v > MAX_SECS {
        return Err(format!(
            "{origin}: the largest value is {MAX_SECS} seconds (a year), got '{text}'"
        ));
    }
    Ok(v)
}

/// The longest wait for a tree's tail: a day.
pub const MAX_TAIL_SECS: f64 = 86_400.0;

/// A wait for the tree's tail from `origin`: 0 (none) up to a day.
pub fn tail_secs(origin: &str, text: &str) -> Result<f64, String> {
    let v: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{origin}: '{text}' is not a number of seconds"))?;
    if !v.is_finite() || v < 0.0 {
        return Err(format!(
            "{origin}: must be 0 or a positive number of seconds, got '{text}'"
        ));
    }
    if v > MAX_TAIL_SECS {
        return Err(format!(
            "{origin}: the largest value is {MAX_TAIL_SECS} seconds (a day), got '{text}'"
        ));
    }
    Ok(v)
}

/// The host's CPUs online and its memory in bytes, the most a limit may ask.
pub fn host_size() -> (f64, u64) {
    // SAFETY: sysconf has no memory preconditions.
    let (cpus, pages, page) = unsafe {
        (
            libc::sysconf(libc::_SC_NPROCESSORS_ONLN),
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    (
        cpus.max(1) as f64,
        (pages.max(0) as u64).saturating_mul(page.max(0) as u64),
    )
}

/// The smallest CPU quota the kernel takes is 1 ms a period; the period is 100 ms.
pub const MIN_CPUS: f64 = 0.01;

/// A CPU limit from `origin`: a number of CPUs, fractions allowed, from 0.01 up to
/// the host's `host_cpus`.
pub fn cpus(origin: &str, text: &str, host_cpus: f64) -> Result<f64, String> {
    let v: f64 = text
        .trim()
        .parse()
        .map_err(|_| format!("{origin}: '{text}' is not a number of CPUs"))?;
    if !v.is_finite() || v < MIN_CPUS {
        return Err(format!(
            "{origin}: must be at least {MIN_CPUS} CPUs, got '{text}'"
        ));
    }
    if v > host_cpus {
        return Err(format!(
            "{origin}: this host has {host_cpus} CPUs, got '{text}'"
        ));
    }
    Ok(v)
}

/// The smallest memory limit, MiB: below it a process cannot even start.
pub const MIN_MEMORY_MIB: u64 = 4;

/// A memory limit from `origin`, bytes: MiB as a bare number (as Metaflow's
/// `@resources(memory=…)`), else with a binary unit: K, M, G, T (also KiB, Ki,
/// KB …, any case); from 4 MiB up to the host's `host_bytes`.
pub fn memory(origin: &str, text: &str, host_bytes: u64) -> Result<u64, String> {
    let t = text.trim();
    let split = t
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(t.len());
    let (num, unit) = (&t[..split], t[split..].trim());
    let v: f64 = num.parse().map_err(|_| {
        format!("{origin}: '{text}' is not a size (MiB, or a number with K, M, G or T)")
    })?;
    let scale: u64 = match unit.to_ascii_lowercase().as_str() {
        "" | "m" | "mi" | "mb" | "mib" => 1 << 20,
        "b" => 1,
        "k" | "ki" | "kb" | "kib" => 1 << 10,
        "g" | "gi" | "gb" | "gib" => 1 << 30,
        "t" | "ti" | "tb" | "tib" => 1 << 40,
        _ => {
            return Err(format!(
                "{origin}: unknown unit '{unit}' in '{text}' (K, M, G or T; a bare number is MiB)"
            ))
        }
    };
    let bytes = v * scale as f64;
    if !bytes.is_finite() || bytes < (MIN_MEMORY_MIB << 20) as f64 {
        return Err(format!(
            "{origin}: must be at least {MIN_MEMORY_MIB} MiB, got '{text}'"
        ));
    }
    if bytes > host_bytes as f64 {
        return Err(format!(
            "{origin}: this host has {} MiB of memory, got '{text}'",
            host_bytes >> 20
        ));
    }
    Ok(bytes as u64)
}

/// A nice value (-20 to 19) from `origin`.
pub fn nice(origin: &str, text: &str) -> Result<i32, String> {
    match text.trim().parse::<i32>() {
        Ok(v) if (-20..=19).contains(&v) => Ok(v),
        Ok(_) => Err(format!(
            "{origin}: '{text}' is not a nice value from -20 to 19"
        )),
        Err(e)
            if matches!(
                e.kind(),
                std::num::IntErrorKind::PosOverflow | std::num::IntErrorKind::NegOverflow
            ) =>
        {
            Err(format!(
                "{origin}: '{text}' is out of range: a nice value is from -20 to 19"
            ))
        }
        Err(_) => Err(format!("{origin}: '{text}' is not a whole number")),
    }
}

/// Metadata text from `origin`.
pub fn text(origin: &str, v: &str) -> Result<String, String> {
    meta_text(v).map_err(|why| format!("{origin}: {why}"))
}

/// Reads a variable: unset or empty is None; non-UTF-8 is an error naming it.
pub fn env_var(get: GetEnv, var: &str) -> Result<Option<String>, String> {
    match get(var) {
        None => Ok(None),
        Some(v) if v.is_empty() => Ok(None),
        Some(v) => match v.to_str() {
            Some(s) => text(&format!("environment variable {var}"), s).map(Some),
            None => Err(format!("environment variable {var}: not valid UTF-8")),
        },
    }
}

/// A yes/no switch from the environment; unset or empty is `None`.
pub fn env_bool(get: GetEnv, var: &str) -> Result<Option<bool>, String> {
    match env_var(get, var)?.as_deref().map(str::trim) {
        None | Some("") => Ok(None),
        Some(v) => match v.to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "on" => Ok(Some(true)),
            "0" | "false" | "no" | "off" => Ok(Some(false)),
            _ => Err(format!(
                "environment variable {var}: '{v}' is not one of 1/0, true/false, yes/no, on/off"
            )),
        },
    }
}

/// A file descriptor's number from the environment; unset or empty is `None`.
/// Whether it is open, and what it is, the session checks when it takes it over.
pub fn env_fd(get: GetEnv, var: &str) -> Result<Option<i32>, String> {
    match env_var(get, var)?.as_deref().map(str::trim) {
        None | Some("") => Ok(None),
        Some(v) => v
            .parse::<i32>()
            .ok()
            .filter(|&n| n >= 0)
            .map(Some)
            .ok_or_else(|| {
                format!("environment variable {var}: '{v}' is not a file descriptor number")
            }),
    }
}

/// A process id from the environment variable `var`, when set.
pub fn env_pid(get: GetEnv, var: &str) -> Result<Option<u32>, String> {
    match env_var(get, var)?.as_deref().map(str::trim) {
        None | Some("") => Ok(None),
        Some(v) => v
            .parse::<u32>()
            .ok()
            .filter(|&n| n > 0 && n <= i32::MAX as u32)
            .map(Some)
            .ok_or_else(|| format!("environment variable {var}: '{v}' is not a process id")),
    }
}

/// Seconds from the environment variable `var`, when set.
pub fn env_seconds(get: GetEnv, var: &str, min: f64) -> Result<Option<f64>, String> {
    match env_var(get, var)? {
        Some(v) if !v.trim().is_empty() => {
            seconds(&format!("environment variable {var}"), &v, min).map(Some)
        }
        _ => Ok(None),
    }
}

/// Parses one `--tag KEY=VALUE`.
pub fn parse_tag(s: &str) -> Result<(String, String), String> {
    let (k, v) = s
        .split_once('=')
        .ok_or_else(|| format!("--tag '{s}': expected KEY=VALUE"))?;
    let k = k.trim();
    if k.is_empty() {
        return Err(format!("--tag '{s}': the key before '=' is empty"));
    }
    Ok((text("--tag", k)?, text("--tag", v)?))
}

/// An http(s) base URL (a path prefix is allowed) without its trailing slashes.
pub fn base_url(s: &str) -> Result<String, &'static str> {
    let s = s.trim();
    let lower = s.to_ascii_lowercase();
    let Some(scheme_len) = ["http://", "https://"]
        .iter()
        .find(|p| lower.starts_with(*p))
        .map(|p| p.len())
    else {
        return Err("is not an http:// or https:// URL");
    };
    if s.chars().any(|c| c.is_whitespace() || c.is_control()) {
        return Err("contains spaces or control characters");
    }
    if s[scheme_len..].is_empty() || s[scheme_len..].starts_with('/') {
        return Err("has no host");
    }
    let url = reqwest::Url::parse(s).map_err(|_| "is not a valid URL")?;
    if url.host_str().is_none_or(str::is_empty) {
        return Err("has no host");
    }
    if url.query().is_some() || url.fragment().is_some() {
        return Err("must not have a query or fragment");
    }
    // The API authenticates with the token; a password in the URL would end up in
    // messages and logs.
    if !url.username().is_empty() || url.password().is_some() {
        return Err("must not carry credentials (user:password@)");
    }
    Ok(s.trim_end_matches('/').to_string())
}

/// A base URL from the environment variable `var` (value `v`).
pub fn url_setting(var: &str, v: &str) -> Result<String, String> {
    url_of(&format!("environment variable {var}"), v)
}

/// A base URL from `origin` (a flag, a variable, a file's key); the error echoes
/// it without its credentials.
pub fn url_of(origin: &str, v: &str) -> Result<String, String> {
    base_url(v).map_err(|why| format!("{origin}: '{}' {why}", without_userinfo(v).escape_debug()))
}

/// `v` with whatever precedes an `@` in its authority shown as `***`.
fn without_userinfo(v: &str) -> String {
    let Some((scheme, rest)) = v.split_once("://") else {
        return v.to_string();
    };
    let end = rest.find('/').unwrap_or(rest.len());
    match rest[..end].rfind('@') {
        Some(at) => format!("{scheme}://***{}", &rest[at..]),
        None => v.to_string(),
    }
}

/// A directory named by the environment variable `var`: it must exist, and be a
/// directory itself rather than a link to one (the tracker, maybe root, makes its
/// private directories in it; it never creates the directory).
pub fn existing_dir(var: &str, v: &str) -> Result<PathBuf, String> {
    let p = PathBuf::from(v);
    let why = match std::fs::symlink_metadata(&p) {
        Ok(m) if m.is_dir() => return Ok(p),
        Ok(m) if m.file_type().is_symlink() => {
            "is a symbolic link; name the directory itself".to_string()
        }
        Ok(_) => "is not a directory".to_string(),
        Err(e) => e.to_string(),
    };
    Err(format!(
        "environment variable {var}: {}: {why}",
        p.display()
    ))
}

/// Why a file cannot be made in an existing directory, in words that fit it: a
/// file system that takes no new files (/proc, /sys) answers "not found".
pub fn cannot_write_in(e: &std::io::Error) -> String {
    use std::io::ErrorKind as K;
    match e.kind() {
        K::NotFound | K::Unsupported => {
            format!("no file can be made there (the file system takes none: {e})")
        }
        K::ReadOnlyFilesystem => "cannot write there: a read-only file system".into(),
        K::StorageFull | K::QuotaExceeded => format!("cannot write there: no space left ({e})"),
        K::PermissionDenied => format!("cannot write there: permission denied ({e})"),
        _ => format!("cannot write a file there: {e}"),
    }
}

/// Output files named by several flags must differ: two writers on one file
/// overwrite each other. Compared by name (made absolute) and, for files that
/// exist, by identity (a link or a second name for the same file). A terminal or
/// a pipe (`/dev/stderr`) may be shared.
pub fn distinct_files(named: &[(&str, Option<&Path>)]) -> Result<(), String> {
    use std::os::unix::fs::MetadataExt;
    // Each flag with its path made absolute and resolved as far as it exists and,
    // for an existing file, (device, inode).
    type Named<'a> = (&'a str, (PathBuf, Option<(u64, u64)>));
    let given: Vec<Named> = named
        .iter()
        .filter_map(|(flag, p)| {
            let p = (*p)?;
            let id = match std::fs::metadata(p) {
                Ok(m) if !m.is_file() => return None,
                Ok(m) => Some((m.dev(), m.ino())),
                Err(_) => None,
            };
            Some((*flag, (resolved(p), id)))
        })
        .collect();
    for (i, (a, ka)) in given.iter().enumerate() {
        for (b, kb) in &given[i + 1..] {
            if ka.0 == kb.0 || (ka.1.is_some() && ka.1 == kb.1) {
                return Err(format!(
                    "{a} and {b} name the same file {}; each needs its own",
                    ka.0.display()
                ));
            }
        }
    }
    Ok(())
}

/// A path made absolute with its links resolved: the file's own when it exists;
/// otherwise its directory's, and a dangling link followed to where it points, so
/// that two names of a file yet to be made compare equal.
fn resolved(p: &Path) -> PathBuf {
    let cwd = std::env::current_dir().unwrap_or_default();
    let mut p = cwd.join(p);
    // A bounded number of dangling links: a loop of them ends here.
    for _ in 0..8 {
        if let Ok(c) = std::fs::canonicalize(&p) {
            return c;
        }
        let (Some(dir), Some(name)) = (p.parent(), p.file_name()) else {
            break;
        };
        let dir = std::fs::canonicalize(dir).unwrap_or_else(|_| dir.to_path_buf());
        match std::fs::read_link(&p) {
            Ok(target) => p = dir.join(target),
            Err(_) => return dir.join(name).components().collect(),
        }
    }
    // `components` drops `.` parts: `./x` and `x` are one name.
    p.components().collect()
}

/// Variable and default of each metadata service.
const ENDPOINT_VARS: [(&str, &str); 3] = [
    ("TRACKER_METADATA_URL", "http://169.254.169.254"),
    (
        "TRACKER_METADATA_GCP_URL",
        "http://metadata.google.internal",
    ),
    ("TRACKER_METADATA_ALIBABA_URL", "http://100.100.100.200"),
];

/// The metadata services' base URLs: the defaults, or `TRACKER_METADATA_URL`,
/// `TRACKER_METADATA_GCP_URL`, `TRACKER_METADATA_ALIBABA_URL` (unset or empty: the
/// default). An override must be an http:// or https:// URL with a host.
pub fn endpoints(get: GetEnv) -> Result<Endpoints, String> {
    let [link_local, gcp, alibaba] = ENDPOINT_VARS.map(|(var, default)| match get(var) {
        None => Ok(default.to_string()),
        Some(v) => match v.to_str() {
            None => Err(format!("environment variable {var}: not valid UTF-8")),
            Some(s) if s.trim().is_empty() => Ok(default.to_string()),
            Some(s) => url_setting(var, s),
        },
    });
    Ok(Endpoints {
        link_local: link_local?,
        gcp: gcp?,
        alibaba: alibaba?,
    })
}

#[cfg(test)]
mod tests {
    use std::{collections::HashMap, os::unix::ffi::OsStringExt};

    use super::*;

    #[test]
    fn limits_check_their_values() {
        assert_eq!(cpus("--cpus", "1.5", 2.0), Ok(1.5));
        assert_eq!(cpus("--cpus", "2", 2.0), Ok(2.0));
        for (bad, why) in [
            ("0", "at least 0.01"),
            ("-1", "at least 0.01"),
            ("nan", "at least 0.01"),
            ("inf", "at least 0.01"),
            ("abc", "not a number of CPUs"),
            ("3", "this host has 2 CPUs"),
        ] {
            let e = cpus("--cpus", bad, 2.0).unwrap_err();
            assert!(e.starts_with("--cpus: ") && e.contains(why), "{bad}: {e}");
        }
        let host = 8u64 << 30;
        for (good, bytes) in [
            ("512", 512u64 << 20),
            ("512M", 512 << 20),
            ("512Mi", 512 << 20),
            ("1.5G", 3 << 29),
            ("1gib", 1 << 30),
            ("4096K", 4 << 20),
            ("8G", 8 << 30),
            ("4194304B", 4 << 20),
        ] {
            assert_eq!(memory("--memory", good, host), Ok(bytes), "{good}");
        }
        for (bad, why) in [
            ("3", "at least 4 MiB"),
            ("0", "at least 4 MiB"),
            ("1K", "at least 4 MiB"),
            ("9G", "this host has 8192 MiB"),
            ("512X", "unknown unit 'X'"),
            ("", "is not a size"),
            ("-5M", "is not a size"),
            ("G", "is not a size"),
            ("1e400", "unknown unit"),
        ] {
            let e = memory("--memory", bad, host).unwrap_err();
            assert!(e.starts_with("--memory: ") && e.contains(why), "{bad}: {e}");
        }
    }

    #[test]
    fn seconds_checks() {
        assert_eq!(seconds("--interval", "0.5", 0.1), Ok(0.5));
        for bad in ["0", "-1", "abc", "nan", "inf", "0.01", "", "1e19", "1e300"] {
            let e = seconds("--interval", bad, 0.1).unwrap_err();
            assert!(
                e.starts_with("--interval: ") && e.contains(&format!("'{bad}'")),
                "{e}"
            );
        }
    }

    fn env(pairs: &[(&str, &str)]) -> impl Fn(&str) -> Option<OsString> {
        let m: HashMap<String, OsString> = pairs
            .iter()
            .map(|(k, v)| (k.to_string(), OsString::from(v)))
            .collect();
        move |k| m.get(k).cloned()
    }

    #[test]
    fn a_ready_fd_is_a_number_or_an_error_naming_it() {
        let v = "TRACKER_READY_FD";
        assert_eq!(env_fd(&env(&[]), v), Ok(None));
        assert_eq!(env_fd(&env(&[(v, "")]), v), Ok(None));
        assert_eq!(env_fd(&env(&[(v, " 7 ")]), v), Ok(Some(7)));
        for bad in ["-1", "x", "7.5", "99999999999"] {
            let e = env_fd(&env(&[(v, bad)]), v).unwrap_err();
            assert!(e.contains(v) && e.contains(&format!("'{bad}'")), "{e}");
        }
    }

    #[test]
    fn endpoints_default_and_overrides() {
        let ep = endpoints(&env(&[])).unwrap();
        assert_eq!(ep.link_local, "http://169.254.169.254");
        assert_eq!(ep.gcp, "http://metadata.google.internal");
        assert_eq!(ep.alibaba, "http://100.100.100.200");
        let ep = endpoints(&env(&[
            ("TRACKER_METADATA_URL", "http://127.0.0.1:8080//"),
            ("TRACKER_METADATA_GCP_URL", "https://gcp.example/prefix/"),
            ("TRACKER_METADATA_ALIBABA_URL", "  "),
        ]))
        .unwrap();
        assert_eq!(ep.link_local, "http://127.0.0.1:8080");
        assert_eq!(ep.gcp, "https://gcp.example/prefix");
        assert_eq!(ep.alibaba, "http://100.100.100.200");
    }

    #[test]
    fn endpoints_rejected() {
        for (var, bad, why) in [
            (
                "TRACKER_METADATA_URL",
                "ftp://x",
                "is not an http:// or https:// URL",
            ),
            (
                "TRACKER_METADATA_URL",
                "169.254.169.254",
                "is not an http:// or https:// URL",
            ),
            ("TRACKER_METADATA_GCP_URL", "http://", "has no host"),
            ("TRACKER_METADATA_GCP_URL", "http:///x", "has no host"),
            (
                "TRACKER_METADATA_ALIBABA_URL",
                "http://a b",
                "contains spaces",
            ),
            ("TRACKER_METADATA_ALIBABA_URL", "http://h/?q=1", "query"),
            ("TRACKER_METADATA_URL", "http://h\nx", "contains spaces"),
        ] {
            let e = endpoints(&env(&[(var, bad)])).unwrap_err();
            assert!(
                e.starts_with(&format!("environment variable {var}: '")),
                "{e}"
            );
            assert!(e.contains(why), "{bad}: {e}");
            assert_eq!(e.lines().count(), 1, "{e}");
        }
        let e = url_setting("SENTINEL_API_URL", "https://u:s3cret@h.example/api").unwrap_err();
        assert_eq!(
            e,
            "environment variable SENTINEL_API_URL: 'https://***@h.example/api' must not carry credentials (user:password@)"
        );
        let raw = OsString::from_vec(vec![b'h', 0xff]);
        let e = endpoints(&move |k: &str| (k == "TRACKER_METADATA_GCP_URL").then(|| raw.clone()))
            .unwrap_err();
        assert_eq!(
            e,
            "environment variable TRACKER_METADATA_GCP_URL: not valid UTF-8"
        );
    }
}
