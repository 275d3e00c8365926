//! The decisions of a session's end: what a signal means, what the tracker exits
//! with, and what the summary says.

use crate::{
    engine::{procread, Engine},
    model::{
        reading::Backend, BpfProgram, Discovered, HostInfo, JobMeta, RunStats, Summary, TopCommand,
    },
};

/// What a signal sent to the tracker does.
#[derive(Debug, PartialEq, Eq)]
pub enum OnSignal {
    /// Pass it to the command (its root pid).
    Forward(u32),
    /// The terminal sent it to the whole foreground group: the command has it.
    Ignore,
    /// Nothing of ours runs: write the final sample and stop.
    Stop,
}

/// `command_root`: the root of a command the tracker started (None when attached
/// or host-only). `from_tty`: sent by the kernel for the terminal.
pub fn on_signal(command_root: Option<u32>, from_tty: bool) -> OnSignal {
    match command_root {
        Some(_) if from_tty => OnSignal::Ignore,
        Some(root) => OnSignal::Forward(root),
        None => OnSignal::Stop,
    }
}

/// Passes `sig` to the command's root, then SIGCONT if it is stopped: it would
/// otherwise hold the signal pending, and the tracker would wait on it for ever.
pub fn forward(root: u32, sig: i32) {
    // SAFETY: signalling the tracker's own child.
    unsafe { libc::kill(root as i32, sig) };
    let stopped = procread::stat(root, &mut String::new()).is_some_and(|st| st.state == b'T');
    if stopped {
        // SAFETY: as above.
        unsafe { libc::kill(root as i32, libc::SIGCONT) };
    }
}

/// A shell's exit code for a wait status: the code, or 128+N after signal N.
pub fn exit_code_of(status: i32) -> i32 {
    if libc::WIFEXITED(status) {
        libc::WEXITSTATUS(status)
    } else if libc::WIFSIGNALED(status) {
        128 + libc::WTERMSIG(status)
    } else {
        1
    }
}

/// How the run went, beside the samples' statistics.
pub struct Outcome {
    pub wall_secs: f64,
    /// The command's wait status; None when attached or host-only.
    pub status: Option<i32>,
    pub backend: Option<Backend>,
    /// Why eBPF is not the backend, when it is not.
    pub backend_reason: Option<String>,
    pub top: Vec<TopCommand>,
}

/// What else the summary carries.
pub struct Context<'a> {
    pub meta: &'a JobMeta,
    pub host: HostInfo,
    pub found: Option<Discovered>,
    pub engine: Option<&'a Engine>,
}

pub fn summary(stats: &RunStats, o: Outcome, c: Context) -> Summary {
    let mut s = Summary::build(
        stats,
        o.wall_secs,
        o.status.map(exit_code_of),
        o.backend.map_or("none", Backend::as_str),
        o.backend_reason,
        o.top,
    );
    s.job = c.meta.clone();
    s.host = c.host;
    s.cloud = c.found.and_then(|f| f.cloud);
    if let Some(Engine::Ebpf(e)) = c.engine {
        s.ebpf_load_ms = Some(e.load_ms);
        if e.stats_enabled() {
            s.bpf_programs = e
                .prog_stats()
                .into_iter()
                .map(|(name, run_count, t)| BpfProgram {
                    name,
                    run_count,
                    run_time_ns: t.as_nanos() as u64,
                })
                .collect();
        }
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn signals_go_to_the_command_unless_the_terminal_sent_them() {
        assert_eq!(on_signal(Some(42), false), OnSignal::Forward(42));
        assert_eq!(on_signal(Some(42), true), OnSignal::Ignore);
        assert_eq!(on_signal(None, false), OnSignal::Stop);
        assert_eq!(on_signal(None, true), OnSignal::Stop);
    }

    #[test]
    fn exit_codes_like_a_shell() {
        // Wait statuses as the kernel encodes them.
        assert_eq!(exit_code_of(0), 0);
        assert_eq!(exit_code_of(3 << 8), 3);
        assert_eq!(exit_code_of(libc::SIGKILL), 128 + 9);
        assert_eq!(exit_code_of(libc::SIGTERM | 0x80), 128 + 15); // core dumped
        assert_eq!(exit_code_of(0x137f), 1); // stopped: not an exit
    }

    #[test]
    fn the_summary_says_what_ran_and_how_it_ended() {
        let meta = JobMeta {
            job_name: Some("j".into()),
            ..JobMeta::default()
        };
        let found = Discovered {
            cloud: Some(crate::model::CloudInfo {
                cloud_vendor_id: "aws".into(),
                ..Default::default()
            }),
            identity: None,
        };
        let s = summary(
            &RunStats::default(),
            Outcome {
                wall_secs: 2.0,
                status: Some(7 << 8),
                backend: Some(Backend::Procfs),
                backend_reason: Some("--no-ebpf".into()),
                top: Vec::new(),
            },
            Context {
                meta: &meta,
                host: HostInfo::default(),
                found: Some(found),
                engine: None,
            },
        );
        assert_eq!(s.exit_code, Some(7));
        assert_eq!(s.backend, "procfs");
        assert_eq!(s.backend_reason.as_deref(), Some("--no-ebpf"));
        assert_eq!(s.job.job_name.as_deref(), Some("j"));
        assert_eq!(s.cloud.map(|c| c.cloud_vendor_id).as_deref(), Some("aws"));
        assert_eq!(s.ebpf_load_ms, None);
        let s = summary(
            &RunStats::default(),
            Outcome {
                wall_secs: 1.0,
                status: None,
                backend: None,
                backend_reason: None,
                top: Vec::new(),
            },
            Context {
                meta: &meta,
                host: HostInfo::default(),
                found: None,
                engine: None,
            },
        );
        assert_eq!((s.exit_code, s.backend), (None, "none"));
    }
}
