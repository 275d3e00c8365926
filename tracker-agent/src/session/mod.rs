//! A tracking session: everything between the settings and the exit code. It opens
//! the outputs, starts discovery once, picks the engine, starts or attaches to the
//! tree (or samples the host alone), runs the sampling loop and ends the run.
//! Whatever the way of running (a command, `--pid`, the host), the loop is the same.

mod end;
mod events;
mod launch;
pub mod node;
mod ready;
pub mod report;
mod signals;
mod told;
mod track;

use std::{path::PathBuf, sync::mpsc, time::Instant};

use crate::{
    collect::{
        gpu::GpuCollector,
        limits::{self, Limited, Limits},
        memcg::{self, Controller, TreeCgroup, TreeCpu},
        Roots, SystemCollector,
    },
    discovery,
    engine::{
        ebpf::{EbpfEngine, LoadArgs},
        procfs::ProcfsEngine,
        Engine,
    },
    model::{degraded::Degradations, Discovered},
    settings::{Settings, Target},
    sink::{
        self,
        jsonl::JsonLines,
        lines::Lines,
        report::{ReportSink, Timeline, TimelineFeed},
        sentinel::{
            guardian::{Guardian, Identity},
            RunInfo, Streamer,
        },
        summary::SummaryOut,
        Sink, Sinks,
    },
    warn::say,
};
use end::{Context, Outcome};
use events::EventLog;
use launch::LaunchError;

/// What a session starts with once the command is found and the pid checked.
enum Start {
    Command(PathBuf, Vec<std::ffi::OsString>),
    Attach(u32),
    Host,
}

/// `--report`'s path, checked at start as `-o`'s is: something of someone
/// else's there sends the page to a private file (see `sink::create_or_keep`);
/// the user's own mistake is refused.
fn report_destination(
    p: &std::path::Path,
    owner: Option<&crate::fsafe::Owner>,
) -> anyhow::Result<Option<(std::fs::File, PathBuf)>> {
    match report::check_destination("--report", p) {
        Ok(()) => Ok(None),
        Err(e) if crate::fsafe::someone_elses(p, owner) => {
            match sink::fallback_file("report.html", owner) {
                Ok((f, kept)) => {
                    say(format_args!(
                        "{e:#}; the report goes to {} instead, and the command runs",
                        kept.display()
                    ));
                    Ok(Some((f, kept)))
                }
                Err(k) => Err(anyhow::anyhow!("{e:#}; nor a private file instead: {k}")),
            }
        }
        Err(e) => Err(e),
    }
}

/// What `run` will do, checked before anything starts: the command found on PATH
/// (or the exit code of its refusal), a process that exists, or the host.
fn resolve_start(target: &Target) -> anyhow::Result<Result<Start, i32>> {
    // Every pid of a tree is read in /proc: one that shows another PID
    // namespace would make another process the tree (kthreadd for a command
    // that is pid 2 here).
    if !matches!(target, Target::Host) {
        if let Some(why) = crate::sys::proc_of_another_pid_ns() {
            say(format_args!(
                "{why}: no process of the tree can be told apart there; mount a /proc of this namespace (unshare --pid --fork --mount-proc) or run the tracker outside it"
            ));
            return Ok(Err(2));
        }
    }
    Ok(Ok(match target {
        Target::Command(argv) => {
            let Some(first) = argv.first() else {
                anyhow::bail!("no command to run");
            };
            match launch::resolve(first, std::env::var_os("PATH").as_deref()) {
                Ok(p) => Start::Command(p, argv.clone()),
                Err(e) => return Ok(Err(refused(e))),
            }
        }
        Target::Attach { pid, origin } => {
            if !std::path::Path::new(&format!("/proc/{pid}")).exists() {
                anyhow::bail!("{origin}: no process with id {pid}");
            }
            Start::Attach(*pid)
        }
        Target::Host => Start::Host,
    }))
}

/// The guardian of the Sentinel stream (see guardian.rs), as the invoking user
/// under sudo; a run without it goes on, said once.
fn start_guardian(
    cfg: &sink::sentinel::Config,
    run_as: Option<&crate::sudo::RunAs>,
) -> Option<Guardian> {
    let id = run_as.map(|r| Identity {
        uid: r.uid,
        gid: r.gid,
        groups: r.groups.clone(),
    });
    match Guardian::start(cfg, id) {
        Ok(g) => Some(g),
        Err(e) => {
            say(format_args!("Sentinel: the guardian could not start ({e}); the run goes on without it, and should the tracker be killed, rows not yet sent are only in the local outputs"));
            None
        }
    }
}

/// The report's name for this run: the job's name, else the command line, the pid
/// or "host".
fn report_name(st: &Settings) -> String {
    match (&st.meta.job_name, &st.target) {
        (Some(j), _) => j.clone(),
        (None, Target::Command(argv)) => argv
            .iter()
            .map(|a| a.to_string_lossy())
            .collect::<Vec<_>>()
            .join(" "),
        (None, Target::Attach { pid, .. }) => format!("pid {pid}"),
        (None, Target::Host) => "host".into(),
    }
}

/// The starter's pipe (`ready`) and the attached root's (`told`); only an
/// attached root tells the tracker anything of itself.
fn claim_pipes(st: &Settings) -> Result<(Option<ready::Ready>, Option<told::Told>), String> {
    let ready = st.ready_fd.map(ready::Ready::claim).transpose()?;
    let told = match st.root_children_fd {
        Some(fd) if !matches!(st.target, Target::Attach { .. }) => {
            return Err(format!(
                "TRACKER_ROOT_CHILDREN_FD={fd}: only a root the tracker attached to (--pid) tells its children's CPU"
            ));
        }
        Some(fd) => Some(told::Told::claim(fd)?),
        None => None,
    };
    Ok((ready, told))
}

/// Runs the whole session; returns the exit code the tracker should exit with.
pub fn run(st: Settings) -> anyhow::Result<i32> {
    if let Some(c) = &st.config_file {
        log::info!(
            "settings from config file {}",
            crate::warn::escaped(&c.display().to_string())
        );
    }
    // The starter's pipes first: nothing the session opens may take their
    // numbers, and no child started below may inherit them.
    let (ready, told) = match said(claim_pipes(&st)) {
        Ok(p) => p,
        Err(code) => return Ok(code),
    };
    // Everything that can fail on bad input fails here, before anything starts.
    let start = match resolve_start(&st.target)? {
        Ok(s) => s,
        Err(code) => return Ok(code),
    };
    let invoker = match said(sudo_checked(&st, &start)) {
        Ok(i) => i,
        Err(code) => return Ok(code),
    };
    // Under sudo the command and the files the user named are the invoking
    // user's; with --as-root both are root's (opened root-safe, see fsafe).
    let run_as = invoker.filter(|_| !st.as_root);
    let owner = run_as.as_ref().map(crate::sudo::RunAs::owner);
    let owner = owner.as_ref();
    let (outputs, events_file) = open_outputs(&st, owner)?;

    signals::block_signals();
    // Before the tracker becomes a subreaper (see Guardian::start).
    let guardian = guardian_for(&st, run_as.as_ref());
    let (found_rx, discovery) = discover(&st);
    let mut pre = match Prelaunch::for_start(&start, run_as.as_ref()) {
        Ok(p) => p,
        Err(code) => return Ok(code),
    };
    // Right after the command is forked (paused, at the nice value it was given),
    // as the Rust sibling does once its command starts: the programs' load and
    // every thread made from here on run reniced, the command never.
    renice_self(st.renice);
    let (engine, backend_reason, degraded) = engine_for(&st, &start);

    let (gpus, host, host_info) = host_collectors();

    let ebpf = matches!(engine, Some(Engine::Ebpf(_)));
    let stream = (found_rx, guardian);
    let (mut sinks, timeline) = open_sinks(&st, outputs, &host_info, stream, ebpf, owner)
        .inspect_err(|_| Prelaunch::abandon(pre.take()))?;

    let started = Instant::now();
    let Begun {
        root,
        command_root,
        engine,
        memcg,
        cpucg,
        limited,
    } = match begin(start, pre, engine, st.limits)? {
        Ok(b) => b,
        Err(code) => return Ok(code),
    };
    let backend = engine.as_ref().map(Engine::backend);
    let events = EventLog::new(event_sinks(
        events_file,
        owner,
        timeline,
        root,
        command_root,
    ));
    let tracked = track::Tracked {
        engine,
        root,
        command_root,
        events,
        host,
        gpus,
        degraded,
        memcg,
        cpucg,
        ready,
        told,
    };
    let ended = match track::run(tracked, &st, started, &mut sinks) {
        Ok(e) => e,
        Err(e) => return Ok(stay_with(command_root, e)),
    };
    let mut summary = end_summary(
        &st,
        ended,
        limited,
        started,
        (backend, backend_reason),
        host_info,
        discovery,
    );
    sinks.finish(&mut summary);
    Ok(summary.exit_code.unwrap_or(0))
}

/// Bad input found before anything started: said in one line, exit code 2.
fn said<T, E: std::fmt::Display>(r: Result<T, E>) -> Result<T, i32> {
    r.map_err(|e| {
        say(e);
        2
    })
}

/// The host's collectors, started before the command: GPUs are probed once
/// (NVML's initialisation is not the command's time), and the collectors' baseline
/// makes the first sample, one interval on, a rate. With the host's facts.
fn host_collectors() -> (GpuCollector, SystemCollector, crate::model::HostInfo) {
    let gpus = GpuCollector::new(&Roots::default());
    let host = SystemCollector::new(Roots::default());
    let mut host_info = host.host_info();
    gpus.host_fields(&mut host_info);
    (gpus, host, host_info)
}

/// Who ran sudo, if anyone, once what they asked for is allowed them; else why not
/// (exit 2). SUDO_UID and SUDO_GID are input like any other. A sudoers rule for
/// this binary grants tracking, not root, and so does a capability grant on it
/// (`sudo::capability_grant`): both are held to `tracking_only`. Under sudo the
/// command runs as root only where the administrator's own file allows it.
fn sudo_checked(st: &Settings, start: &Start) -> Result<Option<crate::sudo::RunAs>, String> {
    let invoker = crate::sudo::invoker()?;
    if let Some(inv) = &invoker {
        let who = format!("user {} (uid {})", crate::warn::escaped(&inv.user), inv.uid);
        tracking_only(
            st,
            start,
            inv.uid,
            &format!("under sudo only a process of {who}"),
        )?;
    } else if let Some(g) = crate::sudo::capability_grant() {
        let scope = format!(
            "with the binary's capability grant only a process of uid {}",
            g.uid
        );
        tracking_only(st, start, g.uid, &scope)?;
    }
    if st.as_root && invoker.is_some() {
        if let Some(why) = as_root_refused() {
            return Err(why);
        }
    }
    Ok(invoker)
}

/// What a grant of tracking to user `uid` (sudo's rule or the binary's
/// capabilities) does not allow: attaching to a process that is not wholly
/// theirs (the programs would read what the kernel shows only its owner: its
/// I/O, its memory maps), and the engine's settings from the environment, which
/// the user sets at will: a BTF of their own would choose the kernel addresses the
/// programs read. `scope` says who may be tracked.
fn tracking_only(st: &Settings, start: &Start, uid: u32, scope: &str) -> Result<(), String> {
    if let Start::Attach(pid) = start {
        if let Some(why) = not_owned_by(uid, *pid) {
            return Err(format!(
                "--pid {pid}: {scope} is tracked; this one is {why}"
            ));
        }
    }
    let k = &st.engine.knobs;
    let set = [
        ("TRACKER_KERNEL_BTF", k.kernel_btf.is_some()),
        ("TRACKER_SECOND_COPIES", k.second_copies.is_some()),
        ("TRACKER_TEST_DROP_FORKS", k.drop_forks_every != 0),
        ("TRACKER_TEST_DROP_EXITS", k.drop_exits_every != 0),
        ("TRACKER_TEST_DROP_EXECS", k.drop_execs_every != 0),
    ];
    if let Some((var, _)) = set.iter().find(|(_, on)| *on) {
        return Err(format!(
            "{var}: not taken from the environment of a tracker that tracks for uid {uid} \
             (sudo or the binary's capability grant): the engine's settings are root's; unset it"
        ));
    }
    Ok(())
}

/// Whose a process is, where not wholly `uid`'s (attaching reads what the kernel
/// shows a process's owner: its I/O, its memory maps); None when it is theirs.
/// Real, effective, saved and file-system uids all count: a set-uid program the
/// user started (passwd, su) is root's to read.
fn not_owned_by(uid: u32, pid: u32) -> Option<String> {
    let uids: Vec<u32> = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .ok()
        .and_then(|t| {
            t.lines().find_map(|l| l.strip_prefix("Uid:")).map(|u| {
                u.split_whitespace()
                    .filter_map(|x| x.parse::<u32>().ok())
                    .collect()
            })
        })
        .unwrap_or_default();
    if uids.len() == 4 && uids.iter().all(|&u| u == uid) {
        return None;
    }
    let owner = uids
        .iter()
        .copied()
        .find(|&u| u != uid)
        .or(uids.first().copied());
    Some(owner.map_or("gone".to_string(), |u| format!("uid {u}'s")))
}

/// The Sentinel stream's guardian, where there is a stream. As the init of a PID
/// namespace the tracker's death kills every process in it, a guardian too, and
/// orphans would come back to it: none then.
fn guardian_for(st: &Settings, run_as: Option<&crate::sudo::RunAs>) -> Option<Guardian> {
    let pid_one = std::process::id() == 1;
    st.sentinel
        .as_ref()
        .filter(|_| !pid_one)
        .and_then(|cfg| start_guardian(cfg, run_as))
}

/// Discovery runs once, beside the command, and never delays it; the streaming
/// thread waits for its answer (the receiver) before registering the run.
fn discover(
    st: &Settings,
) -> (
    mpsc::Receiver<Discovered>,
    Option<std::thread::JoinHandle<Discovered>>,
) {
    let (found_tx, found_rx) = mpsc::channel::<Discovered>();
    let discovery = (st.discover || st.sentinel.is_some()).then(|| {
        discovery::spawn(st.metadata.clone(), st.share_identity, move |f| {
            let _ = found_tx.send(f.clone());
        })
    });
    (found_rx, discovery)
}

/// The engine for `start` (none for the host alone), why it is not eBPF, and what
/// that costs. Without eBPF a command's orphans come back to the tracker, whose
/// wait4 gives their exact usage: it becomes their subreaper.
fn engine_for(st: &Settings, start: &Start) -> (Option<Engine>, Option<String>, Degradations) {
    let (engine, reason, degraded) = match start {
        Start::Host => (None, None, Degradations::default()),
        _ => load_engine(st),
    };
    if engine.is_none() && matches!(start, Start::Command(..)) {
        // SAFETY: prctl with integer arguments.
        unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) };
    }
    (engine, reason, degraded)
}

/// Why `--as-root` is refused under sudo, if it is: unless the administrator's
/// policy (`settings::admin::ADMIN_CONFIG`) allows it, the command would run as
/// root for a user whom sudo lets run this binary only.
fn as_root_refused() -> Option<String> {
    use crate::settings::admin;
    let path = std::path::Path::new(admin::ADMIN_CONFIG);
    match admin::sudo_policy(path) {
        Ok(p) if p.allow_as_root => None,
        Ok(_) => Some(format!(
            "--as-root under sudo: refused: it would run the command as root, which a \
             sudoers rule for this binary does not grant; an administrator allows it with \
             `allow_as_root = true` under [sudo] in {} (root's, writable by root only)",
            admin::ADMIN_CONFIG
        )),
        Err(e) => Some(format!("--as-root under sudo: refused: {e}")),
    }
}

/// The outputs opened before anything started.
struct Outputs {
    lines: Lines,
    summary: SummaryOut,
    report_kept: Option<(std::fs::File, std::path::PathBuf)>,
}

/// The files the user named, opened before anything starts (a path that cannot be
/// had is refused now, or kept elsewhere where it is someone else's): the samples,
/// the summary, the report's destination, and the events file.
fn open_outputs(
    st: &Settings,
    owner: Option<&crate::fsafe::Owner>,
) -> anyhow::Result<(Outputs, Option<std::fs::File>)> {
    let lines = Lines::open(st.output.as_deref(), st.quiet, st.format, owner)?;
    let summary = SummaryOut::open(!st.quiet, st.summary.as_deref(), owner)?;
    let events_file = st
        .events
        .as_deref()
        .map(|p| sink::create_or_keep(p, "events", "events.jsonl", owner).map(|(f, _)| f))
        .transpose()?;
    let report_kept = match &st.report {
        Some(p) => report_destination(p, owner)?,
        None => None,
    };
    let out = Outputs {
        lines,
        summary,
        report_kept,
    };
    Ok((out, events_file))
}

/// Where the process events go: the `--events` file, and the report's timeline
/// (with an attached tree's processes that were running before, from /proc).
fn event_sinks(
    file: Option<std::fs::File>,
    owner: Option<&crate::fsafe::Owner>,
    timeline: Option<TimelineFeed>,
    root: Option<u32>,
    command_root: Option<u32>,
) -> Sinks<crate::model::ProcEvent, ()> {
    let mut list: Vec<Box<dyn Sink<crate::model::ProcEvent, ()>>> = Vec::new();
    if let Some(f) = file {
        list.push(Box::new(JsonLines::buffered(
            f,
            "the events file".into(),
            "events.jsonl",
            owner.cloned(),
        )));
    }
    if let Some(t) = timeline.map(Timeline) {
        if let (Some(pid), None) = (root, command_root) {
            // The tracker itself is not of the tree (a process tracking itself
            // starts it as its child).
            let me = std::process::id();
            let pids = crate::engine::procfs::descendants_with_threads(pid)
                .into_iter()
                .map(|(tgid, _)| tgid)
                .filter(|p| *p != me);
            let running = crate::engine::procfs::names_and_parents(pids);
            t.seed(&running, crate::model::reading::unix_now());
        }
        list.push(Box::new(t));
    }
    Sinks::new(list)
}

/// Every sink of the run, in the order they finish (lines, Sentinel, OTLP, the
/// report, the summary), and the report's timeline feed, which comes from the eBPF
/// engine's events (`ebpf`).
fn open_sinks(
    st: &Settings,
    out: Outputs,
    host_info: &crate::model::HostInfo,
    (found_rx, guardian): (mpsc::Receiver<Discovered>, Option<Guardian>),
    ebpf: bool,
    owner: Option<&crate::fsafe::Owner>,
) -> anyhow::Result<(Sinks, Option<TimelineFeed>)> {
    let mut sinks: Vec<Box<dyn Sink>> = vec![Box::new(out.lines)];
    if let Some(cfg) = &st.sentinel {
        let run = run_info(st, host_info.clone());
        sinks.push(Box::new(Streamer::start(
            cfg.clone(),
            run,
            found_rx,
            guardian,
        )?));
    }
    if let Some(cfg) = &st.otlp {
        sinks.push(Box::new(sink::otlp::Exporter::start(
            cfg.clone(),
            &st.meta,
        )?));
    }
    let timeline: Option<TimelineFeed> = (st.report.is_some() && ebpf).then(Default::default);
    if let Some(p) = &st.report {
        let name = report_name(st);
        sinks.push(Box::new(
            ReportSink::new(p.clone(), owner.cloned(), &name, timeline.clone(), st.quiet)
                .kept_in(out.report_kept),
        ));
    }
    sinks.push(Box::new(out.summary));
    Ok((Sinks::new(sinks), timeline))
}

/// The run's end: the cgroups made for the command removed (a member still alive
/// goes back to the cgroup it started in), and the summary.
fn end_summary(
    st: &Settings,
    mut ended: track::Ended,
    limited: Option<Limited>,
    started: Instant,
    (backend, backend_reason): (Option<crate::model::reading::Backend>, Option<String>),
    host_info: crate::model::HostInfo,
    discovery: Option<std::thread::JoinHandle<Discovered>>,
) -> crate::model::Summary {
    // What the limits did, read before their cgroups go.
    let mut limits = limited.as_ref().map(Limited::outcome);
    drop(limited);
    if let Some(l) = &mut limits {
        l.escaped.clone_from(&ended.left_cgroup);
    }
    if let Some(mut cg) = ended.memcg.take() {
        cg.remove();
    }
    if let Some(mut cg) = ended.cpucg.take().and_then(|c| c.own) {
        cg.remove();
    }
    let outcome = Outcome {
        wall_secs: started.elapsed().as_secs_f64(),
        status: ended.status,
        backend,
        backend_reason,
        top: ended.top,
    };
    let context = Context {
        meta: &st.meta,
        host: host_info,
        found: discovery.and_then(|d| d.join().ok()),
        engine: ended.engine.as_ref(),
    };
    let mut summary = end::summary(&ended.sampler.stats, outcome, context);
    summary.set_limits(limits);
    if let Some(url) = &st.keeper {
        summary.recommended_server = report::advise(url, &summary);
    }
    summary
}

/// Sets the nice value of every thread of the tracker (None: left as it is). Done
/// once the command is forked, so that the command keeps the nice value it was
/// given (a process without privilege could not lower it again); threads started
/// later inherit it.
fn renice_self(v: Option<i32>) {
    let Some(v) = v else { return };
    let tids: Vec<libc::id_t> = match std::fs::read_dir("/proc/self/task") {
        Ok(d) => d
            .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
            .collect(),
        Err(e) => {
            say(format_args!(
                "--renice {v}: cannot list the tracker's threads: {e}"
            ));
            return;
        }
    };
    for tid in tids {
        // SAFETY: setpriority with integer arguments, on one of our own threads.
        if unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, v) } != 0 {
            let e = std::io::Error::last_os_error();
            let why = if e.kind() == std::io::ErrorKind::PermissionDenied {
                " (a lower nice value needs root or CAP_SYS_NICE)"
            } else {
                ""
            };
            say(format_args!(
                "--renice {v}: {e}{why}; the tracker keeps its priority"
            ));
            return;
        }
    }
}

/// Tracking failed after the command started: it is not abandoned. The tracker
/// says why, keeps forwarding signals, reaps it and exits as it did.
fn stay_with(command_root: Option<u32>, e: anyhow::Error) -> i32 {
    let Some(pid) = command_root else {
        say(format_args!("{e:#}"));
        return 1;
    };
    say(format_args!(
        "{e:#}; waiting for the command without tracking it"
    ));
    loop {
        let mut status = 0;
        // SAFETY: polling our own child.
        match unsafe { libc::waitpid(pid as i32, &mut status, libc::WNOHANG) } {
            0 => {}
            r if r == pid as i32 => return end::exit_code_of(status),
            _ => return 1,
        }
        if let Some((sig, from_tty)) =
            signals::wait_signal(Some(std::time::Duration::from_millis(100)))
        {
            if let end::OnSignal::Forward(root) = end::on_signal(Some(pid), from_tty) {
                end::forward(root, sig);
            }
        }
    }
}

/// What the run registers with Sentinel.
fn run_info(st: &Settings, host: crate::model::HostInfo) -> RunInfo {
    RunInfo {
        meta: st.meta.clone(),
        command: match &st.target {
            Target::Command(argv) => argv
                .iter()
                .map(|c| c.to_string_lossy().into_owned())
                .collect(),
            _ => Vec::new(),
        },
        host,
        share_identity: st.share_identity,
    }
}

/// The tree being tracked, once it runs.
struct Begun {
    root: Option<u32>,
    /// The root when it is the tracker's own command.
    command_root: Option<u32>,
    engine: Option<Engine>,
    memcg: Option<TreeCgroup>,
    cpucg: Option<TreeCpu>,
    limited: Option<Limited>,
}

/// Starts the command or attaches to the tree. `Ok(Err(code))`: the command could
/// not start.
fn begin(
    start: Start,
    pre: Option<Prelaunch>,
    engine: Option<Engine>,
    limits: Limits,
) -> anyhow::Result<Result<Begun, i32>> {
    let (root, command_root, engine, memcg, cpucg, limited) = match (start, pre) {
        (Start::Host, _) => (None, None, None, None, None, None),
        (Start::Command(..), None) => anyhow::bail!("the command was not forked before its start"),
        (Start::Command(..), Some(pre)) => match launch_command(pre, engine, limits)? {
            Ok(l) => (
                Some(l.pid),
                Some(l.pid),
                Some(l.engine),
                l.memcg,
                l.cpucg,
                l.limited,
            ),
            Err(code) => return Ok(Err(code)),
        },
        (Start::Attach(pid), _) => {
            let e = match engine {
                Some(Engine::Ebpf(mut e)) => {
                    e.register_root(pid, true)?;
                    Engine::Ebpf(e)
                }
                _ => {
                    let mut e = ProcfsEngine::new(pid, None);
                    e.listen_exits();
                    Engine::Procfs(Box::new(e))
                }
            };
            let (memcg, cpucg) = adopted_cgroups(pid);
            (Some(pid), None, Some(e), memcg, cpucg, None)
        }
    };
    Ok(Ok(Begun {
        root,
        command_root,
        engine,
        memcg,
        cpucg,
        limited,
    }))
}

/// The cgroups the attached root is in, where they may hold only its tree (a
/// container's, a systemd scope, a delegated subtree): the loop checks every
/// sample that they hold nothing else but this tracker, and takes the tree's CPU
/// and memory from them while they do. None for a hierarchy's root.
fn adopted_cgroups(pid: u32) -> (Option<TreeCgroup>, Option<TreeCpu>) {
    let roots = Roots::default();
    let memcg = TreeCgroup::adopt(&roots, pid, Controller::Memory)
        .map_err(|e| log::info!("no cgroup of pid {pid} to read its memory from: {e}"))
        .ok();
    let own = match &memcg {
        // A process is in one v2 cgroup: the memory one counts the CPU too.
        Some(m) if m.is_v2() => None,
        _ => match TreeCgroup::adopt(&roots, pid, Controller::Cpu) {
            Ok(cg) => Some(cg),
            Err(e) => {
                log::info!("no cgroup of pid {pid} to read its CPU from: {e}");
                return (memcg, None);
            }
        },
    };
    let cpu = TreeCpu {
        own,
        pre_join_ns: 0,
        adopted: true,
    };
    (memcg, Some(cpu))
}

/// A command that cannot run: said in one line, with a shell's exit code.
fn refused(e: LaunchError) -> i32 {
    say(&e);
    e.exit_code()
}

/// The eBPF engine unless told otherwise or unavailable (then procfs, said once),
/// and why eBPF is not used.
/// The eBPF engine, or None with the reason and what that costs in exactness
/// (nothing named for `--no-ebpf`: the user chose it).
fn load_engine(st: &Settings) -> (Option<Engine>, Option<String>, Degradations) {
    let e = &st.engine;
    if e.no_ebpf {
        return (None, Some("--no-ebpf".to_string()), Degradations::default());
    }
    let room =
        crate::model::reading::memory_room(&crate::collect::cgroup::own_memory(&Roots::default()));
    match EbpfEngine::load(LoadArgs {
        max_tasks: e.max_tasks,
        ring_bytes: e.ring_bytes,
        bpf_stats: e.bpf_stats,
        room,
        knobs: &e.knobs,
    }) {
        Ok(e) => {
            log::info!("eBPF engine loaded in {:.0} ms", e.load_ms);
            (
                Some(Engine::Ebpf(Box::new(e))),
                None,
                Degradations::default(),
            )
        }
        Err(e) => {
            say(format_args!(
                "eBPF unavailable: {e}; falling back to /proc polling (backend procfs)"
            ));
            if st.events.is_some() {
                say("--events: process events come from the eBPF engine; the file stays empty");
            }
            (None, Some(e.to_string()), e.degradations())
        }
    }
}

/// A cgroup for exactly the command's tree, joined by the paused command before it
/// execs. None where none can be made (no rights, a read-only cgroupfs, a full
/// hierarchy, no memory controller delegated): said once, and memory is Σ PSS.
fn tree_cgroup(pid: u32) -> Result<TreeCgroup, memcg::Unavailable> {
    // A cgroup the command cannot join is removed at once (dropped).
    TreeCgroup::make(&Roots::default()).and_then(|cg| cg.place(pid).map(|()| cg))
}

/// The command's CPU from a cgroup that holds exactly its tree: the scheduler's
/// own charge, whatever the programs or /proc could see of each member (a member
/// whose final figures were never read, threads that come and go). Joined by the
/// paused command; what it ran before the join is read then and added. None where
/// no cgroup can be made: the backend's figures, named in `cpu_source`.
fn cpu_cgroup(pid: u32, memcg: Option<&TreeCgroup>) -> Option<TreeCpu> {
    let own = match memcg {
        // A process is in one v2 cgroup: the memory one counts the CPU too.
        Some(m) if m.is_v2() => None,
        _ => match TreeCgroup::make_for(&Roots::default(), Controller::Cpu)
            .and_then(|cg| cg.place(pid).map(|()| cg))
        {
            Ok(cg) => Some(cg),
            Err(e) => {
                log::info!("no cgroup for the command's CPU ({e}): cpu_source is the backend");
                return None;
            }
        },
    };
    // The command is paused (blocked) until released: its figure holds still.
    Some(TreeCpu {
        own,
        pre_join_ns: memcg::ran_ns(pid),
        adopted: false,
    })
}

/// The command, started.
struct Launched {
    pid: u32,
    engine: Engine,
    memcg: Option<TreeCgroup>,
    cpucg: Option<TreeCpu>,
    limited: Option<Limited>,
}

/// Exit code of a command refused because its limits could not be put in place.
const LIMITS_REFUSED: i32 = 2;

/// The command forked and blocked before its exec, being placed in cgroups of its
/// own on another thread while the engine loads: a hierarchy's first
/// `cgroup.procs` write of a while waits for an RCU grace period (the kernel's
/// `cgroup_threadgroup_rwsem`; 14 ms of a 2-vCPU start by `perf sched timehist`,
/// against 15–20 ms of CPU for the eBPF load), so the two overlap.
struct Prelaunch {
    paused: launch::Paused,
    placing: std::thread::JoinHandle<Placed>,
}

/// The command's memory cgroup (or why none) and its CPU one.
type Placed = (Result<TreeCgroup, memcg::Unavailable>, Option<TreeCpu>);

impl Prelaunch {
    /// The command of `start`, forked paused and being placed; Err: the exit code
    /// of a command that cannot be forked, said why.
    fn for_start(
        start: &Start,
        run_as: Option<&crate::sudo::RunAs>,
    ) -> Result<Option<Prelaunch>, i32> {
        match start {
            Start::Command(path, argv) => match launch::spawn_paused(path, argv, run_as) {
                Ok(p) => Ok(Some(Prelaunch::place(p))),
                Err(e) => Err(refused(e)),
            },
            _ => Ok(None),
        }
    }

    fn place(paused: launch::Paused) -> Prelaunch {
        let pid = paused.pid;
        let placing = std::thread::spawn(move || {
            let memcg = tree_cgroup(pid);
            let cpucg = cpu_cgroup(pid, memcg.as_ref().ok());
            (memcg, cpucg)
        });
        Prelaunch { paused, placing }
    }

    /// The cgroups as placed; none where the placing thread died.
    fn placed(placing: std::thread::JoinHandle<Placed>) -> Placed {
        placing.join().unwrap_or_else(|_| {
            (
                Err(memcg::Unavailable(
                    "the thread making the command's cgroups failed".into(),
                )),
                None,
            )
        })
    }

    /// The run stopped before the command started: it exits without running, is
    /// reaped, and its cgroups go.
    fn abandon(pre: Option<Prelaunch>) {
        let Some(pre) = pre else {
            return;
        };
        let pid = pre.paused.pid;
        pre.paused.abort();
        let placed = Prelaunch::placed(pre.placing);
        // SAFETY: reaping our own child.
        unsafe { libc::waitpid(pid as i32, std::ptr::null_mut(), 0) };
        drop(placed);
    }
}

/// Registers the paused command with the engine (procfs when `engine` is None),
/// takes the cgroups of its own it was placed in, puts the limits asked for in
/// place, then lets it run. `Ok(Err(code))`: it could not start (or not under its
/// limits, which it never runs without), and the tracker exits with `code` after
/// saying why.
fn launch_command(
    pre: Prelaunch,
    engine: Option<Engine>,
    limits: Limits,
) -> anyhow::Result<Result<Launched, i32>> {
    let Prelaunch { paused, placing } = pre;
    let pid = paused.pid;
    let reap = || {
        // SAFETY: reaping our own child.
        unsafe { libc::waitpid(pid as i32, std::ptr::null_mut(), 0) };
    };
    let (memcg, cpucg) = Prelaunch::placed(placing);
    let engine = match engine {
        Some(Engine::Ebpf(mut e)) => {
            if let Err(err) = e.register_root(pid, false) {
                paused.abort();
                reap();
                return Err(err.context("registering the command with the eBPF engine"));
            }
            Engine::Ebpf(e)
        }
        _ => Engine::Procfs(Box::new(ProcfsEngine::new(pid, Some(std::process::id())))),
    };
    let memcg = match memcg {
        Ok(cg) => Some(cg),
        Err(e) if limits.memory_bytes.is_some() => {
            say(format_args!(
                "the command was not started: --memory needs a cgroup for it, and none can be made ({e})"
            ));
            paused.abort();
            reap();
            return Ok(Err(LIMITS_REFUSED));
        }
        Err(e) => {
            say(format_args!(
                "no cgroup for the command's memory ({e}); memory is the tree's Σ PSS (memory_source pss)"
            ));
            None
        }
    };
    let limited = if limits.any() {
        let own_cpu = cpucg.as_ref().and_then(|c| c.own.as_ref());
        match limits::apply(pid, limits, &Roots::default(), memcg.as_ref(), own_cpu) {
            Ok(l) => Some(l),
            Err(why) => {
                say(format_args!(
                    "the command was not started: it cannot run under its limits: {why}"
                ));
                paused.abort();
                reap();
                return Ok(Err(LIMITS_REFUSED));
            }
        }
    } else {
        None
    };
    if let Err(e) = paused.release() {
        let code = refused(e);
        reap();
        drop(limited);
        drop(cpucg);
        drop(memcg);
        return Ok(Err(code));
    }
    Ok(Ok(Launched {
        pid,
        engine,
        memcg,
        cpucg,
        limited,
    }))
}
