//! Loading: checks, this kernel's offsets, the programs and their attachment.

use std::{fmt, path::Path, time::Instant};

use aya::{
    maps::{HashMap, MapData, PerCpuArray, RingBuf},
    programs::RawTracePoint,
    Ebpf, EbpfLoader,
};
use tracker_common::{TaskInfo, TreeStats};

use super::offsets_cache;
use crate::engine::btf::Btf;
use crate::model::degraded::{self, Degradations};

/// Run on demand (`BPF_PROG_TEST_RUN`), never attached.
pub(super) const PROBE: &str = "probe";

pub(super) static OBJECT: &[u8] = aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tracker"));

/// Attached for the tree's life cycle. Threads retire through `PROBE` at each sample
/// once dead and off the CPU, or at `sched_process_free` if that comes first.
/// (program, its second copy, tracepoint); the copies are attached only where
/// tracepoints run preemptible (`second_copies`).
pub(super) const TRACEPOINTS: [(&str, &str, &str); 4] = [
    ("sched_process_fork", "again_fork", "sched_process_fork"),
    ("sched_process_exec", "again_exec", "sched_process_exec"),
    ("sched_process_exit", "again_exit", "sched_process_exit"),
    ("sched_process_free", "again_free", "sched_process_free"),
];

/// The engine's knobs for tests and for kernels that keep their BTF elsewhere,
/// filled by the settings: `TRACKER_SECOND_COPIES` (0 or 1), `TRACKER_KERNEL_BTF`,
/// `TRACKER_TEST_DROP_FORKS`, `_EXITS`, `_EXECS` (N).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Knobs {
    /// Attach the life-cycle programs' second copies whatever the kernel's version.
    pub second_copies: Option<bool>,
    /// The BTF to read the offsets from instead of the running kernel's.
    pub kernel_btf: Option<std::path::PathBuf>,
    /// Ignore the forks, exits and execs of tids that are multiples of N (0: none),
    /// as the kernel's skips would: for tests only.
    pub drop_forks_every: u32,
    pub drop_exits_every: u32,
    pub drop_execs_every: u32,
}

/// Whether to attach the programs' second copies (see `again_fork` in
/// tracker-ebpf). From 6.19 the kernel runs tracepoints with preemption enabled
/// (SRCU-fast instead of preempt_disable) and BPF programs on them migrate-disabled
/// only: a task preempted inside a program makes the kernel skip that program for
/// the next task on the CPU. On 7.2 under qemu that lost 1 of 201 orphans in a
/// third of the runs. Before 6.19 a second copy would only cost every fork, exec
/// and exit of the host its run. The knob overrides the kernel's version, for tests.
fn second_copies(knobs: &Knobs) -> bool {
    knobs.second_copies.unwrap_or_else(|| {
        aya::util::KernelVersion::current()
            .is_ok_and(|v| v >= aya::util::KernelVersion::new(6, 19, 0))
    })
}

/// How the life-cycle programs run: where their copies are loaded (tracepoints
/// preemptible), a task whose fork every copy missed is looked for at its later
/// events (`EngineMode::adopt`).
fn engine_mode(copies: bool, knobs: &Knobs) -> tracker_common::EngineMode {
    tracker_common::EngineMode {
        adopt: u32::from(copies),
        drop_forks_every: knobs.drop_forks_every,
        drop_exits_every: knobs.drop_exits_every,
        drop_execs_every: knobs.drop_execs_every,
    }
}

/// Where the kernel's BTF is read: the knob's when set (a kernel that ships its
/// BTF elsewhere; the tests use it to hand over a BTF that lacks fields), else the
/// running kernel's own. It must describe the running kernel: the offsets the
/// programs read come from it.
fn btf_path(knobs: &Knobs) -> std::path::PathBuf {
    knobs
        .kernel_btf
        .clone()
        .unwrap_or_else(|| "/sys/kernel/btf/vmlinux".into())
}

/// What this kernel's layout keeps from being exact, by name. Each is a field or an
/// argument the programs do without: they read 0 there, so the figure it feeds is
/// flagged rather than silently wrong.
pub(super) fn offset_degradations(o: &tracker_common::Offsets) -> Degradations {
    use tracker_common::NO_FIELD;
    let mut d = Degradations::default();
    if o.task_io_block == NO_FIELD {
        d.set(
            degraded::NO_TASK_IO,
            "the kernel's BTF has no task_struct.ioac with rchar, wchar, read_bytes and write_bytes \
             in the expected layout (CONFIG_TASK_IO_ACCOUNTING or CONFIG_TASK_XACCT off?): \
             read_bytes, write_bytes, rchar and wchar count only members read from /proc",
        );
    }
    if o.task_on_cpu == NO_FIELD {
        d.set(
            degraded::NO_ON_CPU,
            "the kernel's BTF has no task_struct.on_cpu: a dead thread may be retired just before \
             its final context switch, without the CPU of its last time slice",
        );
    }
    if o.exit_has_group_dead == 0 {
        d.set(
            degraded::NO_GROUP_DEAD,
            "sched_process_exit passes no group_dead: a process's last thread is found from \
             signal->live, which two threads exiting at once can both read as 0 \
             (processes_exited may count that process twice)",
        );
    }
    d
}

/// Runs of the program behind `fd` that the kernel skipped because the program was
/// already running on that CPU (`bpf_prog_info.recursion_misses`, 5.12 and later;
/// 0 where the kernel does not count them). Where tracepoints can be preempted
/// (7.x), a task preempted inside a program makes the next task on that CPU skip
/// it: a fork, exec or exit not seen.
pub(crate) fn recursion_misses(fd: std::os::fd::BorrowedFd<'_>) -> u64 {
    use std::os::fd::AsRawFd as _;
    const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
    /// `recursion_misses` in `struct bpf_prog_info`.
    const AT: usize = 208;
    let mut info = [0u8; AT + 8];
    // union bpf_attr's `info`: bpf_fd, info_len, info (a pointer).
    let mut attr = [0u8; 16];
    attr[0..4].copy_from_slice(&(fd.as_raw_fd() as u32).to_ne_bytes());
    attr[4..8].copy_from_slice(&(info.len() as u32).to_ne_bytes());
    attr[8..16].copy_from_slice(&(info.as_mut_ptr() as u64).to_ne_bytes());
    // SAFETY: `attr` holds a valid descriptor, the length of `info` and its address;
    // the kernel writes at most that many bytes there and reads 16 bytes of `attr`.
    let r = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_OBJ_GET_INFO_BY_FD,
            attr.as_mut_ptr(),
            16u32,
        )
    };
    if r != 0 {
        return 0;
    }
    let mut b = [0u8; 8];
    b.copy_from_slice(&info[AT..AT + 8]);
    u64::from_ne_bytes(b)
}

/// The kernel's BTF is a few MiB; a file far past that is not one (and /dev/zero
/// never ends).
pub(super) const MAX_BTF: u64 = 64 << 20;

/// True when this process is in the host's PID namespace, where the kernel's pids and
/// /proc's agree. An unreadable namespace link (no /proc) counts as the host's.
pub(crate) fn in_host_pid_ns() -> bool {
    crate::sys::pid_ns().is_none_or(|ino| ino == crate::sys::INIT_PID_NS_INO)
}

/// Why the eBPF engine could not start; the agent then falls back to procfs.
#[derive(Debug)]
pub enum EbpfUnavailable {
    NoBtf(String),
    NoPrivilege(String),
    /// Pids in BPF are the host's; this process sees another namespace's.
    PidNamespace,
    Load(String),
    /// The tracker's memory cgroup leaves less than the programs' maps need: the
    /// kernel would let the maps be made and then kill the tracker (measured: 8
    /// and 9 MiB limits were killed, 3–7 MiB refused the maps, 10 MiB ran).
    NoMemory(String),
}

impl EbpfUnavailable {
    /// What a run on the procfs backend instead can no longer count exactly, by name.
    pub fn degradations(&self) -> Degradations {
        let name = match self {
            EbpfUnavailable::NoBtf(_) => degraded::EBPF_NO_BTF,
            EbpfUnavailable::NoPrivilege(_) => degraded::EBPF_NO_PRIVILEGE,
            EbpfUnavailable::PidNamespace => degraded::EBPF_PID_NAMESPACE,
            EbpfUnavailable::Load(_) | EbpfUnavailable::NoMemory(_) => degraded::EBPF_LOAD_FAILED,
        };
        let mut d = Degradations::default();
        d.set(
            name,
            format!(
                "eBPF unavailable: {self}; the procfs backend polls, so processes that start \
                 and end between two samples are missing from processes_spawned, \
                 processes_exited and peak memory (their CPU and I/O reach the totals through \
                 the process that reaps them)"
            ),
        );
        d
    }
}

impl fmt::Display for EbpfUnavailable {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EbpfUnavailable::NoBtf(s) => write!(f, "no usable kernel BTF ({s})"),
            EbpfUnavailable::NoPrivilege(s) => {
                write!(f, "not allowed to load BPF programs ({s}); CAP_BPF and CAP_PERFMON (or CAP_SYS_ADMIN) are needed")
            }
            EbpfUnavailable::PidNamespace => write!(
                f,
                "the tracker runs in a PID namespace other than the host's (the kernel programs see the host's pids, not this namespace's)"
            ),
            EbpfUnavailable::Load(s) => write!(f, "loading the BPF programs failed: {s}"),
            EbpfUnavailable::NoMemory(s) => write!(f, "{s}"),
        }
    }
}

/// aya's `EbpfLoader::new()` reads and parses the kernel's BTF (6 MB) even when
/// `.btf(None)` then drops it: 20–23 ms and a 9 MiB buffer at start-up here,
/// measured with strace and the load's own timings (aya issue #1172). The programs
/// are raw tracepoints and need none of it. On a thread with a file-system context
/// of its own, chrooted to a directory that has no `sys`, that read fails at once;
/// the thread ends with the loader and nothing else sees its root. Without
/// CAP_SYS_CHROOT the loader is made the ordinary way.
pub(super) fn loader_without_btf() -> EbpfLoader<'static> {
    std::thread::scope(|s| {
        s.spawn(|| {
            // SAFETY: unshare(CLONE_FS) gives this thread its own root and cwd, so
            // chroot changes nothing for the tracker's other threads.
            let alone = unsafe {
                libc::unshare(libc::CLONE_FS) == 0
                    && libc::chroot(c"/proc/sys/kernel/random".as_ptr()) == 0
            };
            if !alone {
                log::debug!("cannot isolate the BPF loader: aya reads the kernel's BTF");
            }
            EbpfLoader::new()
        })
        .join()
        .unwrap_or_else(|_| EbpfLoader::new())
    })
}

/// Root is no guarantee: a container or `capsh` may drop the capabilities, and the
/// kernel's EPERM on the first map would then say nothing of why.
pub(super) fn has_cap_bpf() -> Result<(), String> {
    if crate::sys::may_load_bpf() {
        return Ok(());
    }
    // SAFETY: geteuid has no preconditions.
    Err(match unsafe { libc::geteuid() } {
        0 => "root, but its capabilities were dropped".into(),
        // The user's way to eBPF without root: an administrator's grant
        // (docs/deploy.md, "A capability grant on the binary").
        _ => "not root: run it with sudo, or ask an administrator for `setcap \
              cap_bpf,cap_perfmon+ep` on this binary"
            .into(),
    })
}

/// This kernel's offsets from its BTF, what they leave inexact (said once), and when
/// the BTF had been read (since `t0`).
fn kernel_offsets(
    t0: Instant,
    knobs: &Knobs,
) -> Result<(tracker_common::Offsets, Degradations, std::time::Duration), EbpfUnavailable> {
    // The programs are plain raw tracepoints: the kernel's BTF is read only for
    // the offsets they use, once a boot (offsets_cache.rs) unless a test names
    // another BTF.
    let cache = (knobs.kernel_btf.is_none() && crate::fsafe::euid() == 0)
        .then(offsets_cache::name)
        .flatten();
    let dir = Path::new(offsets_cache::DIR);
    let kept = cache.as_deref().and_then(|n| offsets_cache::read(dir, n));
    let (mut offsets, t_read) = match kept {
        Some(o) => {
            log::debug!("kernel offsets from {}", dir.display());
            (o, t0.elapsed())
        }
        None => {
            let (o, t_read) = btf_offsets(t0, knobs)?;
            if let Some(n) = &cache {
                if let Err(e) = offsets_cache::write(dir, n, &o) {
                    log::debug!("kernel offsets not kept in {}: {e}", dir.display());
                }
            }
            (o, t_read)
        }
    };
    offsets.tick_ns = u32::try_from(1_000_000_000 / crate::sys::clk_tck()).unwrap_or(0);
    let degraded = offset_degradations(&offsets);
    for d in degraded.list() {
        crate::warn::say(format_args!("eBPF: {}: {}", d.name, d.detail));
    }
    Ok((offsets, degraded, t_read))
}

/// The offsets the kernel's BTF gives, and when it had been read.
fn btf_offsets(
    t0: Instant,
    knobs: &Knobs,
) -> Result<(tracker_common::Offsets, std::time::Duration), EbpfUnavailable> {
    let path = btf_path(knobs);
    // A BTF named by `TRACKER_KERNEL_BTF` is root's own choice: under sudo or a
    // capability grant the session refuses the variable (`tracking_only`), since
    // the BTF decides which kernel addresses the programs read.
    let data = crate::fsafe::read_input(&path, MAX_BTF)
        .map_err(|e| EbpfUnavailable::NoBtf(format!("{}: {e}", path.display())))?;
    let t_read = t0.elapsed();
    let btf = Btf::parse(&data)
        .map_err(|e| EbpfUnavailable::NoBtf(format!("{}: {e}", path.display())))?;
    let offsets = btf
        .offsets()
        .map_err(|e| EbpfUnavailable::NoBtf(e.to_string()))?;
    Ok((offsets, t_read))
}

/// The object's program `name`, as the raw tracepoint every program of it is.
pub(super) fn raw_tp<'a>(
    bpf: &'a mut Ebpf,
    name: &str,
) -> Result<&'a mut RawTracePoint, EbpfUnavailable> {
    bpf.program_mut(name)
        .ok_or_else(|| EbpfUnavailable::Load(format!("program {name} missing from object")))?
        .try_into()
        .map_err(|e: aya::programs::ProgramError| EbpfUnavailable::Load(format!("{name}: {e}")))
}

/// Loads (verifies) the programs `run` uses: the life-cycle programs, their second
/// copies where tracepoints are preemptible, and the probe. Their names.
/// A second copy the kernel refuses does not stop the run: it goes on with the
/// first copies, and the refusal is said once and named (`NO_SECOND_COPIES`).
fn verify_programs(
    bpf: &mut Ebpf,
    copies: bool,
    degraded: &mut Degradations,
) -> Result<Vec<&'static str>, EbpfUnavailable> {
    let names: Vec<&'static str> = TRACEPOINTS
        .iter()
        .flat_map(|&(first, again, _)| [Some(first), copies.then_some(again)])
        .flatten()
        .chain([PROBE])
        .collect();
    let mut loaded = Vec::with_capacity(names.len());
    for &name in &names {
        let t = Instant::now();
        let result = raw_tp(bpf, name)?.load();
        if result.is_ok() && log::log_enabled!(log::Level::Debug) {
            // Read by `cargo xtask bench --only-startup` (docs/benchmarks.md); the
            // fdinfo reads only when asked for, not at every start.
            let insns = raw_tp(bpf, name)?.fd().ok().and_then(verified_insns);
            log::debug!(
                "verified {name}: {:.2} ms, {} instructions processed",
                t.elapsed().as_secs_f64() * 1e3,
                insns.map_or_else(|| "?".to_string(), |n| n.to_string())
            );
        }
        match result {
            Ok(()) => loaded.push(name),
            Err(e) if TRACEPOINTS.iter().any(|t| t.1 == name) => {
                let detail = format!(
                    "the kernel refused the second copy {name} ({e}): where it skips a \
                     program's run, the event is seen only when the first copy runs, and a \
                     task whose fork neither saw is found again only at its later events"
                );
                crate::warn::warn_once("ebpf.copies", format_args!("{detail}"));
                degraded.set(degraded::NO_SECOND_COPIES, detail);
            }
            Err(e) => return Err(classify(format!("{name}: "), &e)),
        }
    }
    Ok(loaded)
}

/// The instructions the verifier processed for a loaded program (`verified_insns`
/// in its fdinfo, since 5.16): its work at every start, which a change to the
/// program's shape can multiply.
fn verified_insns(fd: &aya::programs::ProgramFd) -> Option<u64> {
    use std::os::fd::{AsFd, AsRawFd};
    let raw = fd.as_fd().as_raw_fd();
    let info = std::fs::read_to_string(format!("/proc/self/fdinfo/{raw}")).ok()?;
    info.lines()
        .find_map(|l| l.strip_prefix("verified_insns:"))
        .and_then(|v| v.trim().parse().ok())
}

/// Attaches the loaded life-cycle programs, the first copies first: a tracepoint
/// runs its programs in the order they were attached.
fn attach_programs(bpf: &mut Ebpf, loaded: &[&str]) -> Result<(), EbpfUnavailable> {
    for (first, again, tp) in TRACEPOINTS {
        for name in [first, again] {
            if !loaded.contains(&name) {
                continue;
            }
            raw_tp(bpf, name)?
                .attach(tp)
                .map_err(|e| classify(format!("attach {name}: "), &e))?;
        }
    }
    Ok(())
}

/// The attach's task walk (tracker-ebpf's `attach.rs`).
const CLAIM: &str = "claim_registered";

/// Runs the task walk once: every member registered from /proc that the walk
/// finds gets its task address, and the probe reads it from then on. Loaded here,
/// not with the others: only an attach needs it, and it needs the kernel's BTF.
/// An error says why the members stay on /proc.
pub(super) fn walk_tasks(bpf: &mut Ebpf) -> Result<(), String> {
    use std::io::Read;
    let btf = aya::Btf::from_sys_fs().map_err(|e| format!("the kernel's BTF: {e}"))?;
    let prog: &mut aya::programs::Iter = bpf
        .program_mut(CLAIM)
        .ok_or_else(|| format!("program {CLAIM} missing from object"))?
        .try_into()
        .map_err(|e: aya::programs::ProgramError| format!("{CLAIM}: {e}"))?;
    prog.load("task", &btf)
        .map_err(|e| format!("{CLAIM}: {}", crate::warn::error_chain(&e)))?;
    let id = prog.attach().map_err(|e| format!("{CLAIM}: attach: {e}"))?;
    let link = prog.take_link(id).map_err(|e| format!("{CLAIM}: {e}"))?;
    let mut walk = link
        .into_file()
        .map_err(|e| format!("{CLAIM}: the walk's file: {e}"))?;
    // The program writes nothing: one read runs the whole walk and returns 0.
    let mut buf = [0u8; 64];
    while walk
        .read(&mut buf)
        .map_err(|e| format!("{CLAIM}: the walk: {e}"))?
        > 0
    {}
    drop(walk);
    // The walk is done with; the program's memory goes back to the kernel.
    let _ = prog.unload();
    drop(btf);
    // Parsing the BTF left megabytes of freed heap behind, as at the load.
    // SAFETY: malloc_trim has no preconditions.
    unsafe { libc::malloc_trim(0) };
    Ok(())
}

/// The size of a ring buffer the object holds but a loader never reads: one page.
pub(super) const UNUSED_RING: u32 = 4096;

/// The kernel's BPF run-time statistics, on while the descriptor is held.
fn enable_stats() -> Option<std::os::fd::OwnedFd> {
    match aya::sys::enable_stats(aya::sys::Stats::RunTime) {
        Ok(fd) => Some(fd),
        Err(e) => {
            log::warn!("cannot enable BPF run-time statistics: {e}");
            None
        }
    }
}

/// The task map's size: `max_tasks`, or fewer where the host's tids cannot fill
/// that many. Its keys are tids, which stay below `kernel.pid_max`, and the tgids
/// of old leaders a non-leader exec displaced (`GRAVEYARD_KEY`). A displaced
/// leader's entry moves to the graveyard as the exec'ing thread's own entry
/// leaves its tid for the leader's, so the two never hold more entries than tids
/// in use, and the tasks outside the tree (init, the kernel's threads, the
/// tracker) always leave some of pid_max's tids to spare. The map is
/// preallocated (~180 bytes an entry, zeroed and charged to the memory cgroup at
/// every start) and its buckets are the size rounded up to a power of two: at the
/// kernel's default of 32,768 tids, pid_max itself keeps both at 32,768, where an
/// eighth more would make 36,864 entries in 65,536 buckets (docs/cost.md). Hosts
/// where something raised pid_max keep `max_tasks`.
pub(super) fn task_map_size(max_tasks: u32, pid_max: Option<u32>) -> u32 {
    match pid_max {
        Some(p) if p > 0 => max_tasks.min(p),
        _ => max_tasks,
    }
}

/// `kernel.pid_max`, if it can be read.
fn pid_max() -> Option<u32> {
    std::fs::read_to_string("/proc/sys/kernel/pid_max")
        .ok()?
        .trim()
        .parse()
        .ok()
}

/// What the load made: the programs, the run's maps, and what the kernel allowed.
pub(super) struct Loaded {
    pub stats_enabled: bool,
    pub degraded: Degradations,
    pub max_tasks: u32,
    pub bpf: Ebpf,
    pub tasks: HashMap<MapData, u32, TaskInfo>,
    pub stats: PerCpuArray<MapData, TreeStats>,
    pub ring: RingBuf<MapData>,
    /// The life-cycle programs' second copies are attached (6.19+).
    pub preemptible: bool,
    pub faults_in_kernel: bool,
    pub rss_in_kernel: bool,
    pub stats_fd: Option<std::os::fd::OwnedFd>,
    pub load_ms: f64,
}

/// What the engine is loaded with.
pub struct LoadArgs<'a> {
    /// Sizes the task map (`task_map_size`).
    pub max_tasks: u32,
    /// The event ring's size.
    pub ring_bytes: u32,
    /// Turn the kernel's BPF run-time statistics on.
    pub bpf_stats: bool,
    /// The tracker's memory cgroup's tightest level and the bytes it leaves, where
    /// one is limited.
    pub room: Option<(String, u64)>,
    pub knobs: &'a Knobs,
}

/// Loads and attaches everything.
pub(super) fn load(a: LoadArgs) -> Result<Loaded, EbpfUnavailable> {
    let LoadArgs {
        max_tasks,
        ring_bytes,
        bpf_stats,
        room,
        knobs,
    } = a;
    let t0 = Instant::now();
    can_load(ring_bytes, room)?;
    let (offsets, mut degraded, t_read) = kernel_offsets(t0, knobs)?;
    let t_parsed = t0.elapsed();
    log::debug!("kernel offsets: {offsets:?}");
    let rss_in_kernel = offsets.mm_rss_stat != tracker_common::NO_FIELD;
    let faults_in_kernel = offsets.task_min_flt != tracker_common::NO_FIELD;
    let max_tasks = task_map_size(max_tasks, pid_max());
    let mode = engine_mode(second_copies(knobs), knobs);
    let mut bpf = loader_without_btf()
        .btf(None)
        .override_global("OFFSETS", &offsets, true)
        .override_global("MODE", &mode, true)
        .map_max_entries("TASKS", max_tasks)
        .map_max_entries("EVENTS", ring_bytes)
        // The object also holds the node agent's maps, which `run` never uses:
        // at their full size the kernel preallocates them, 28 ms of a 2-vCPU
        // start (strace -T of BPF_MAP_CREATE, docs/cost.md).
        .map_max_entries("NODE_COUNTS", 1)
        .map_max_entries("NODE_COMMANDS", 1)
        .map_max_entries("NODE_EXITED", 1)
        .map_max_entries("NODE_OOM", UNUSED_RING)
        .load(OBJECT)
        .map_err(|e| classify(String::new(), &e))?;
    let t_maps = t0.elapsed();
    let names = verify_programs(&mut bpf, mode.adopt != 0, &mut degraded)?;
    let t_loaded = t0.elapsed();
    attach_programs(&mut bpf, &names)?;
    log::debug!(
        "eBPF load: BTF read {t_read:?}, parsed {:?}, maps made {:?}, programs verified {:?}, attached {:?}",
        t_parsed - t_read,
        t_maps - t_parsed,
        t_loaded - t_maps,
        t0.elapsed() - t_loaded
    );
    let (tasks, stats, ring) = run_maps(&mut bpf)?;
    let stats_fd = bpf_stats.then(enable_stats).flatten();
    let stats_enabled = stats_fd.is_some()
        || std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled")
            .is_ok_and(|s| s.trim() == "1");
    // Reading and parsing the BTF left megabytes of freed heap behind; hand them
    // back so the agent's RSS reflects what it keeps.
    // SAFETY: malloc_trim has no preconditions.
    unsafe { libc::malloc_trim(0) };
    Ok(Loaded {
        stats_enabled,
        degraded,
        max_tasks,
        bpf,
        tasks,
        stats,
        ring,
        preemptible: names.contains(&TRACEPOINTS[0].1),
        faults_in_kernel,
        rss_in_kernel,
        stats_fd,
        load_ms: t0.elapsed().as_secs_f64() * 1e3,
    })
}

/// Why the programs cannot be loaded here, before anything is: no privilege, a
/// memory cgroup too tight for the maps, or a PID namespace of the tracker's own.
fn can_load(ring_bytes: u32, room: Option<(String, u64)>) -> Result<(), EbpfUnavailable> {
    has_cap_bpf().map_err(EbpfUnavailable::NoPrivilege)?;
    // The maps and the load's own buffers: 8.3 MiB of kernel memory charged to the
    // cgroup with the default sizes (memory.kmem.max_usage_in_bytes), killed at
    // 9 MiB, ran at 10; 14 MiB leaves a margin, plus the ring.
    let need = (14 << 20) + u64::from(ring_bytes);
    if let Some((dir, free)) = room.filter(|(_, free)| *free < need) {
        return Err(EbpfUnavailable::NoMemory(format!(
            "the tracker's memory cgroup {} leaves {:.1} MiB, less than the {} MiB the BPF programs' maps need",
            crate::warn::escaped(&dir),
            free as f64 / 1048576.0,
            need >> 20
        )));
    }
    if !in_host_pid_ns() {
        return Err(EbpfUnavailable::PidNamespace);
    }
    Ok(())
}

/// The maps a run reads: the task map, the tree's per-CPU totals and the event ring.
#[allow(clippy::type_complexity)]
fn run_maps(
    bpf: &mut Ebpf,
) -> Result<
    (
        HashMap<MapData, u32, TaskInfo>,
        PerCpuArray<MapData, TreeStats>,
        RingBuf<MapData>,
    ),
    EbpfUnavailable,
> {
    let mut take = |name: &str| {
        bpf.take_map(name)
            .ok_or_else(|| EbpfUnavailable::Load(format!("map {name} missing from object")))
    };
    let tasks = HashMap::try_from(take("TASKS")?)
        .map_err(|e| EbpfUnavailable::Load(format!("TASKS: {e}")))?;
    let stats = PerCpuArray::try_from(take("TREE_STATS")?)
        .map_err(|e| EbpfUnavailable::Load(format!("TREE_STATS: {e}")))?;
    let ring = RingBuf::try_from(take("EVENTS")?)
        .map_err(|e| EbpfUnavailable::Load(format!("EVENTS: {e}")))?;
    Ok((tasks, stats, ring))
}

/// The error with its causes, as a privilege problem when the kernel said EPERM
/// (decided on the error's kind, not on its text).
pub(super) fn classify(what: String, e: &(dyn std::error::Error + 'static)) -> EbpfUnavailable {
    let msg = format!("{what}{}", crate::warn::error_chain(e));
    let eperm = std::iter::successors(e.source(), |c| c.source()).any(|c| {
        c.downcast_ref::<std::io::Error>()
            .is_some_and(|io| io.kind() == std::io::ErrorKind::PermissionDenied)
    });
    if eperm {
        EbpfUnavailable::NoPrivilege(msg)
    } else {
        EbpfUnavailable::Load(msg)
    }
}

#[cfg(test)]
mod tests {
    use super::task_map_size;

    #[test]
    fn the_task_map_is_never_larger_than_the_hosts_tids_can_fill() {
        // The kernel's default pid_max: one entry per tid, old leaders included.
        assert_eq!(task_map_size(65_536, Some(32_768)), 32_768);
        assert_eq!(task_map_size(65_536, Some(40_000)), 40_000);
        // A host that raised pid_max (systemd sets 4,194,304) keeps --max-tasks.
        assert_eq!(task_map_size(65_536, Some(4_194_304)), 65_536);
        // A smaller --max-tasks is kept as asked.
        assert_eq!(task_map_size(64, Some(32_768)), 64);
        // pid_max unreadable (or nonsense): as asked.
        assert_eq!(task_map_size(65_536, None), 65_536);
        assert_eq!(task_map_size(65_536, Some(0)), 65_536);
    }
}
