//! The TOML config file: `[job]` (the job metadata and `pid`) and `[tracker]`.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use crate::model::JobMeta;

/// Looked up in the working directory when `--config` is not given.
pub const DEFAULT_CONFIG: &str = "resource-tracker.toml";

#[derive(Debug, Default, Deserialize)]
pub struct FileConfig {
    /// `[job]` but its `pid`.
    #[serde(default)]
    pub job: JobMeta,
    #[serde(default)]
    pub tracker: TrackerSection,
    /// `[job] pid`, read apart: `JobMeta` is the metadata only, and serde's
    /// `flatten` would hide unknown keys from the check below.
    #[serde(skip)]
    pub pid: Option<i64>,
}

#[derive(Default, Deserialize)]
struct PidOnly {
    #[serde(default)]
    job: PidSection,
}

#[derive(Default, Deserialize)]
struct PidSection {
    pid: Option<i64>,
}

#[derive(Debug, Default, Deserialize)]
pub struct TrackerSection {
    pub interval_secs: Option<f64>,
    pub format: Option<String>,
    pub output: Option<PathBuf>,
    pub quiet: Option<bool>,
    pub upload_interval_secs: Option<f64>,
    pub tail_timeout_secs: Option<f64>,
    /// A CPU limit for the command (`--cpus`).
    pub cpus: Option<f64>,
    /// A memory limit for the command (`--memory`): MiB as a number, or a size
    /// with its unit as text.
    pub memory: Option<toml::Value>,
    pub discover: Option<bool>,
    pub share_identity: Option<bool>,
    pub renice: Option<i64>,
    pub aggregate_cpu_steal: Option<bool>,
    pub recommend_server: Option<bool>,
    /// The OTLP collector's base URL (`--otlp-endpoint`).
    pub otlp_endpoint: Option<String>,
}

/// 1-based line and column of a byte offset.
fn line_col(text: &str, offset: usize) -> (usize, usize) {
    let before = &text[..offset.min(text.len())];
    let line = before.matches('\n').count() + 1;
    let col = before
        .rfind('\n')
        .map_or(before.len(), |n| before.len() - n - 1)
        + 1;
    (line, col)
}

/// A config file is a few lines; more is not one.
const MAX_CONFIG: u64 = 1 << 20;

/// As root, a config file found in the working directory (which may be anyone's)
/// counts only when root owns it (a link included). Any config file read as root,
/// named with `-c` or not, must also be one that no one else can change: see
/// `fsafe::others_can_write`.
fn trusted_as_root(path: &Path) -> bool {
    use std::os::unix::fs::MetadataExt as _;
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } != 0 {
        return true;
    }
    match (std::fs::symlink_metadata(path), std::fs::metadata(path)) {
        (Ok(link), Ok(file)) => link.uid() == 0 && file.uid() == 0,
        // Absent (or unreadable): nothing to trust; the load below says so.
        _ => true,
    }
}

/// Reads and checks the config file. The default file is silently skipped when
/// absent; one named with `--config` that does not exist is skipped with a warning
/// (the usage guide says it is ignored, and a typo should not cost the run). Any
/// other failure to read it, and every bad value, is an error. Unknown sections and
/// keys are warned about and ignored.
pub fn load(explicit: Option<&Path>) -> Result<Option<(FileConfig, PathBuf)>, String> {
    let path = explicit.unwrap_or(Path::new(DEFAULT_CONFIG));
    let name = crate::warn::escaped(&path.display().to_string());
    if explicit.is_none() && !trusted_as_root(path) {
        log::warn!("config file {name}: not owned by root; ignored while running as root");
        return Ok(None);
    }
    // Under sudo the file is read with the invoking user's rights, like every
    // file they name: a root-only one is refused, and nothing of it is shown.
    let owner = crate::sudo::invoker()?.map(|r| r.owner());
    let f = match crate::fsafe::open_input_as(path, owner.as_ref()) {
        Ok(f) => f,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            if explicit.is_some() {
                log::warn!("config file {name}: not found; going on without it");
            }
            return Ok(None);
        }
        Err(e) => return Err(format!("config file {name}: {e}")),
    };
    // SAFETY: geteuid has no preconditions.
    if unsafe { libc::geteuid() } == 0 {
        let invoker = std::env::var("SUDO_UID").ok().and_then(|u| u.parse().ok());
        match crate::fsafe::others_can_write(&f, invoker) {
            Ok(None) => {}
            Ok(Some(why)) if explicit.is_none() => {
                log::warn!("config file {name}: {why}; ignored while running as root");
                return Ok(None);
            }
            Ok(Some(why)) => {
                return Err(format!("config file {name}: {why}; not read as root"));
            }
            Err(e) => return Err(format!("config file {name}: {e}")),
        }
    }
    let text = match crate::fsafe::read_bounded(f, MAX_CONFIG) {
        Ok(b) => String::from_utf8(b).map_err(|e| {
            format!(
                "config file {name}: not UTF-8 text (byte {})",
                e.utf8_error().valid_up_to()
            )
        })?,
        Err(e) => return Err(format!("config file {name}: {e}")),
    };
    // The key a wrong value belongs to, as `[section] key` (serde's path).
    let located = |e: toml::de::Error, key: Option<String>| -> String {
        let msg = e.message().trim().replace('\n', " ");
        let key = key.map_or(String::new(), |k| format!(" ({k})"));
        match e.span() {
            Some(s) => {
                let (l, c) = line_col(&text, s.start);
                format!("config file {name}, line {l}, column {c}{key}: {msg}")
            }
            None => format!("config file {name}{key}: {msg}"),
        }
    };
    let with_key = |e: serde_path_to_error::Error<toml::de::Error>| {
        let path = e.path().to_string();
        let key = match path.split_once('.') {
            Some((section, k)) => format!("[{section}] {k}"),
            None if path != "." => path,
            None => String::new(),
        };
        located(e.into_inner(), Some(key).filter(|k| !k.is_empty()))
    };
    let de = toml::Deserializer::parse(&text).map_err(|e| located(e, None))?;
    let mut ignored = Vec::new();
    let mut note = |p: serde_ignored::Path| ignored.push(p.to_string());
    let de = serde_ignored::Deserializer::new(de, &mut note);
    let mut cfg: FileConfig = serde_path_to_error::deserialize(de).map_err(with_key)?;
    let de = toml::Deserializer::parse(&text).map_err(|e| located(e, None))?;
    cfg.pid = serde_path_to_error::deserialize::<_, PidOnly>(de)
        .map_err(with_key)?
        .job
        .pid;
    for key in ignored.iter().filter(|k| *k != "job.pid") {
        match key.split_once('.') {
            Some((section, k)) => {
                log::warn!("config file {name}: unknown key `{k}` in [{section}] ignored")
            }
            None => log::warn!("config file {name}: unknown section [{key}] ignored"),
        }
    }
    Ok(Some((cfg, path.to_path_buf())))
}

#[cfg(test)]
mod tests {
    #[test]
    fn line_and_column() {
        assert_eq!(super::line_col("ab\ncd", 0), (1, 1));
        assert_eq!(super::line_col("ab\ncd", 4), (2, 2));
    }
}
