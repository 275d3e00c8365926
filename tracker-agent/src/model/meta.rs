//! Job metadata: written into samples (`job_name`), the summary and Sentinel runs.

use std::collections::BTreeMap;

use clap::Args;
use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};

/// Each field is at once a flag, an environment variable (clap's `env`) and a key
/// of the config file's `[job]` section (serde), so a field is added here and
/// nowhere else. Precedence, field by field: flag, environment, file.
#[derive(Args, Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct JobMeta {
    /// Label written into every sample as job_name.
    #[arg(short = 'n', long, env = "TRACKER_JOB_NAME", value_name = "NAME", value_parser = meta_text, hide_env_values = true)]
    #[serde(alias = "name")]
    pub job_name: Option<String>,
    /// Project of the job.
    #[arg(long, env = "TRACKER_PROJECT_NAME", value_name = "NAME", value_parser = meta_text, hide_env_values = true)]
    pub project_name: Option<String>,
    /// Pipeline stage.
    #[arg(long, env = "TRACKER_STAGE_NAME", value_name = "NAME", value_parser = meta_text, hide_env_values = true)]
    pub stage_name: Option<String>,
    /// Task within the stage.
    #[arg(long, env = "TRACKER_TASK_NAME", value_name = "NAME", value_parser = meta_text, hide_env_values = true)]
    pub task_name: Option<String>,
    /// Owning team.
    #[arg(long, env = "TRACKER_TEAM", value_name = "NAME", value_parser = meta_text, hide_env_values = true)]
    pub team: Option<String>,
    /// Environment, e.g. prod or dev.
    #[arg(long, env = "TRACKER_ENV", value_name = "NAME", value_parser = meta_text, hide_env_values = true)]
    pub env: Option<String>,
    /// Language of the job.
    #[arg(long, env = "TRACKER_LANGUAGE", value_name = "NAME", value_parser = meta_text, hide_env_values = true)]
    pub language: Option<String>,
    /// Orchestrator, e.g. airflow.
    #[arg(long, env = "TRACKER_ORCHESTRATOR", value_name = "NAME", value_parser = meta_text, hide_env_values = true)]
    pub orchestrator: Option<String>,
    /// Executor, e.g. kubernetes.
    #[arg(long, env = "TRACKER_EXECUTOR", value_name = "NAME", value_parser = meta_text, hide_env_values = true)]
    pub executor: Option<String>,
    /// Run id in the orchestrator.
    #[arg(long, env = "TRACKER_EXTERNAL_RUN_ID", value_name = "ID", value_parser = meta_text, hide_env_values = true)]
    pub external_run_id: Option<String>,
    /// Container image of the job.
    #[arg(long, env = "TRACKER_CONTAINER_IMAGE", value_name = "IMAGE", value_parser = meta_text, hide_env_values = true)]
    pub container_image: Option<String>,
    /// From `--tag KEY=VALUE` and the file's `tags` table.
    #[arg(skip)]
    pub tags: BTreeMap<String, String>,
}

/// Metadata text: anything without control characters (it ends up in CSV cells
/// and HTTP bodies).
pub fn meta_text(v: &str) -> Result<String, String> {
    match v.chars().find(|c| c.is_control() && *c != '\t') {
        Some(c) => Err(format!("contains the control character U+{:04X}", c as u32)),
        None => Ok(v.to_string()),
    }
}

fn fields(m: &JobMeta) -> Map<String, Value> {
    match serde_json::to_value(m) {
        Ok(Value::Object(o)) => o,
        _ => Map::new(),
    }
}

impl JobMeta {
    /// Every field unset here taken from `lower`; tags merged key by key, ours
    /// winning. Field-generic through serde, so a new field needs nothing here.
    pub fn over(self, lower: JobMeta) -> JobMeta {
        let mut tags = lower.tags.clone();
        tags.extend(self.tags.clone());
        let mut hi = fields(&self);
        for (k, v) in fields(&lower) {
            if hi.get(&k).is_none_or(Value::is_null) {
                hi.insert(k, v);
            }
        }
        let mut merged: JobMeta = serde_json::from_value(Value::Object(hi)).unwrap_or(self);
        merged.tags = tags;
        merged
    }

    /// The fields that are set, by their serialised names, in their order; the
    /// tags are apart (`tags`). Field-generic through serde.
    pub fn set_fields(&self) -> Vec<(String, String)> {
        fields(self)
            .into_iter()
            .filter_map(|(k, v)| match v {
                Value::String(s) => Some((k, s)),
                _ => None,
            })
            .collect()
    }

    /// The first field (by its serialised name) whose text is not acceptable.
    pub fn check(&self) -> Result<(), (String, String)> {
        for (k, s) in self.set_fields() {
            meta_text(&s).map_err(|e| (k, e))?;
        }
        for (tk, tv) in &self.tags {
            meta_text(tk)
                .and_then(|_| meta_text(tv))
                .map_err(|e| (format!("tags.{tk}"), e))?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn over_takes_unset_fields_and_merges_tags() {
        let mut hi = JobMeta {
            team: Some("hi".into()),
            ..JobMeta::default()
        };
        hi.tags.insert("k".into(), "hi".into());
        let mut lo = JobMeta {
            team: Some("lo".into()),
            env: Some("lo".into()),
            ..JobMeta::default()
        };
        lo.tags.insert("k".into(), "lo".into());
        lo.tags.insert("only".into(), "lo".into());
        let m = hi.over(lo);
        assert_eq!(m.team.as_deref(), Some("hi"));
        assert_eq!(m.env.as_deref(), Some("lo"));
        assert_eq!(m.tags["k"], "hi");
        assert_eq!(m.tags["only"], "lo");
    }

    #[test]
    fn check_names_the_field() {
        let m = JobMeta {
            executor: Some("a\u{7}".into()),
            ..JobMeta::default()
        };
        let (field, why) = m.check().unwrap_err();
        assert_eq!(field, "executor");
        assert!(why.contains("U+0007"), "{why}");
    }
}
