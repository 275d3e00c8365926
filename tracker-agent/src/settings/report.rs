//! Settings of `resource-tracker report`, resolved once like the tracker's.

use std::path::PathBuf;

use crate::model::report::{Hints, RunStatus};

use super::{
    cli::ReportOpts,
    values::{env_bool, env_var, url_setting, GetEnv},
};

/// Spare Cores' public server catalogue.
pub const DEFAULT_KEEPER_URL: &str = "https://keeper.sparecores.net";

#[derive(Clone, Debug)]
pub struct ReportSettings {
    pub inputs: Vec<PathBuf>,
    pub output: PathBuf,
    /// Keeper's base URL, when the cheapest fitting server is asked for.
    pub keeper: Option<String>,
    /// The page's title, when given.
    pub title: Option<String>,
    /// How the run stands, when given; else from its summary.
    pub status: Option<RunStatus>,
    /// Whose terms the page's hints use.
    pub hints: Hints,
}

/// Keeper's base URL: `TRACKER_KEEPER_URL`, else Spare Cores' own.
pub fn keeper_url(get_env: GetEnv) -> Result<String, String> {
    match env_var(get_env, "TRACKER_KEEPER_URL")? {
        Some(u) if !u.trim().is_empty() => url_setting("TRACKER_KEEPER_URL", &u),
        _ => Ok(DEFAULT_KEEPER_URL.to_string()),
    }
}

pub fn resolve(o: ReportOpts, get_env: GetEnv) -> Result<ReportSettings, String> {
    let output = o.output.unwrap_or_else(|| PathBuf::from("report.html"));
    for f in &o.files {
        if f == &output {
            return Err(format!(
                "-o {}: also given as an input; the report needs a file of its own",
                output.display()
            ));
        }
    }
    let ask = o.recommend_server || env_bool(get_env, "TRACKER_RECOMMEND_SERVER")?.unwrap_or(false);
    let status = match o.status.as_deref() {
        None => None,
        Some("pending") => Some(RunStatus::Pending),
        Some("finished") => Some(RunStatus::Finished),
        Some("failed") => Some(RunStatus::Failed),
        Some(other) => return Err(format!("--status {other}: not pending, finished or failed")),
    };
    let hints = match o.hints.as_str() {
        "cli" => Hints::Cli,
        "python" => Hints::Python,
        other => return Err(format!("--hints {other}: not cli or python")),
    };
    if o.title.as_deref().is_some_and(|t| t.trim().is_empty()) {
        return Err("--title: empty; leave it out for the run's file name".to_string());
    }
    Ok(ReportSettings {
        inputs: o.files,
        output,
        keeper: ask.then(|| keeper_url(get_env)).transpose()?,
        title: o.title,
        status,
        hints,
    })
}
