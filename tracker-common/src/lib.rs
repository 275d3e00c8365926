//! The kernel ↔ user ABI of resource-tracker: map value layouts, event records and
//! the offsets table that user space fills from the running kernel's BTF.
//!
//! Everything here is `#[repr(C)]`, `Copy` and free of padding surprises, because the
//! same bytes are written by the BPF programs and read by the agent.
#![no_std]

/// Number of process trees one loaded object can follow. Slot 0 is never used, so a
/// zeroed value means "not tracked".
pub const MAX_TREES: u32 = 16;

/// Default capacity of the task map (threads of all tracked trees together).
pub const DEFAULT_MAX_TASKS: u32 = 65_536;

/// Ring buffer size in bytes (a power of two, multiple of the page size). Every
/// thread's exit is a record, so this holds ~4,300 of them between two drains.
pub const EVENTS_BYTES: u32 = 512 * 1024;

/// Per-task map value, keyed by the kernel tid (`task->pid`). An entry lives from
/// the task's fork (or registration) until it retires: swept once dead and off the
/// CPU, or at its RCU free.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskInfo {
    /// Thread-group id (the process id seen by user space).
    pub tgid: u32,
    /// Tree slot, 1..MAX_TREES.
    pub tree: u32,
    /// `TASK_FLAG_*` bits.
    pub flags: u32,
    /// For an entry user space registered (`task` 0): the low 32 bits of the task's
    /// start time in clock ticks since boot, as /proc/PID/stat's `starttime` gives it;
    /// the first program that meets the task checks it before taking the entry as
    /// that task's, so a pid reused between /proc and the registration is not
    /// mistaken for the member. 0: not checked.
    pub start_ticks: u32,
    /// Address of the `task_struct`: the identity of the member. Every program checks
    /// it before it takes an event as this member's (a tid is freed at the reap, and
    /// another task may get it while this entry waits to retire); the sweep reads a
    /// dead task's final figures through it, checked to still be the member's (see
    /// `at_exit`). 0 only for an entry user space registered, until a
    /// program meets the task (at its exec, fork or exit).
    pub task: u64,
    /// `bpf_ktime_get_ns()` at `sched_process_exit`, 0 before: the EXIT record
    /// carries it, so a process's end is its exit, not the later sweep.
    pub exit_ns: u64,
    /// `task->mm` after the member's last exec seen (0 before one; where
    /// `EngineMode::adopt` is on, its mm at its fork until then): an exec whose
    /// entry already holds the task's mm was handled (see the programs' `again_*`
    /// copies), and an exit with another mm follows an exec no copy saw.
    pub exec_mm: u64,
    /// The thread's figures and command at `sched_process_exit`, and for a
    /// process's last thread its exit code and parent. The final figures come
    /// later, read through `task` once it is dead and off the CPU, by the sweep or
    /// the free program; but the kernel now and then frees a task without running
    /// the free program (and counts no missed run), and its memory is another
    /// task's before the sweep comes. Such a member retires with these, short by
    /// its exit path only.
    pub at_exit: Figures,
    pub comm: [u8; 16],
    pub exit_code: u32,
    pub ppid: u32,
    /// `se.sum_exec_runtime` in the probe's last READING of this thread (0: none
    /// sent yet). A thread whose run time is still that, and that is not on a
    /// run queue, has not run since: its CPU, I/O and faults stand, and the probe
    /// sends its key in an IDLE record instead of reading it again.
    pub probe_runtime: u64,
}

/// Set at `sched_process_exit` when this thread was the last of its process.
pub const TASK_FLAG_GROUP_DEAD: u32 = 1;
/// Set at `sched_process_exit` for every thread: it is on its way out, and the
/// sweep can retire it once it is off the CPU, microseconds later.
pub const TASK_FLAG_EXITED: u32 = 2;
/// The tree's root, set by user space: its exit record wakes user space at once.
pub const TASK_FLAG_ROOT: u32 = 4;
/// Retired (its figures counted, its EXIT record sent) while its entry could not be
/// removed: whoever meets it next only removes it, reading nothing through it.
pub const TASK_FLAG_RETIRED: u32 = 8;
/// On a leader's entry: its process's end was counted at another thread's exit (the
/// last thread was not the leader), so the leader's own end is not counted again
/// where its exit was not seen (see `EngineMode::adopt`).
pub const TASK_FLAG_PROC_ENDED: u32 = 16;

/// Keys at or above this are never tids (pids stay below 2^22): an old leader that
/// a non-leader exec displaced waits here, keyed by its tgid, until it retires.
pub const GRAVEYARD_KEY: u32 = 1 << 31;

/// Keys the probe program takes per run, two per `u64` argument (the kernel passes at
/// most 12 arguments to a raw tracepoint's test run). The verifier's time grows with
/// it, at every start; the syscalls per sample shrink.
pub const PROBE_BATCH: usize = 16;

/// Defines `Figures` from one list, and what is done to each of its fields alike:
/// a new figure is one line here (plus where it is read), and every sum, floor and
/// difference over figures takes it.
macro_rules! figures {
    ($( $(#[doc = $doc:literal])* $name:ident ),* $(,)?) => {
        /// A thread's figures that only grow, as the kernel keeps them; in a tree's
        /// totals, the sum over its retired threads.
        #[repr(C)]
        #[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
        pub struct Figures {
            $( $(#[doc = $doc])* pub $name: u64, )*
        }

        impl Figures {
            pub fn add(&mut self, o: &Figures) {
                $( self.$name += o.$name; )*
            }

            /// Raises each figure to at least `floor`'s.
            pub fn at_least(&mut self, floor: &Figures) {
                $( self.$name = self.$name.max(floor.$name); )*
            }

            /// Each figure's growth since `before` (0 where it is lower).
            pub fn since(&self, before: &Figures) -> Figures {
                Figures { $( $name: self.$name.saturating_sub(before.$name), )* }
            }
        }
    };
}

figures! {
    /// Exact CPU time (`se.sum_exec_runtime`), final after the last context switch.
    cpu_ns,
    /// Tick-sampled user and system time; only used to split `cpu_ns`.
    utime_ns,
    stime_ns,
    /// Storage bytes read / written: the thread's own `task->ioac`, never
    /// `signal->ioac` (which also holds reaped children).
    read_bytes,
    write_bytes,
    /// Bytes passed to read/write-like system calls (`rchar`/`wchar`).
    rchar,
    wchar,
    /// Read-like and write-like system calls made (`syscr`/`syscw`).
    syscr,
    syscw,
}

/// Per-tree totals of every retired thread, kept per CPU and summed by user space.
/// Values only grow. The per-thread EXIT records carry the same figures one by
/// one; these totals stay exact when records are lost.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TreeStats {
    /// Σ of the retired threads' final figures.
    pub fig: Figures,
    /// Processes (not threads) that started in the tree.
    pub procs_spawned: u64,
    /// Processes whose last thread exited.
    pub procs_exited: u64,
    pub threads_spawned: u64,
    pub threads_exited: u64,
    /// Successful execve calls by tree members.
    pub execs: u64,
    /// Largest `signal->maxrss` of any exited process, in pages as the kernel keeps
    /// it (getrusage multiplies by PAGE_SIZE / 1024 for its KiB).
    pub max_rss_pages: u64,
    /// Events dropped because the ring buffer was full. Totals above stay exact.
    pub lost_events: u64,
    /// New tasks that could not be recorded because the task map was full.
    pub untracked_tasks: u64,
    /// Members whose task the kernel freed before their final figures were read
    /// (without running the free program, which would have read them): a read
    /// through the kept address would have been another task's. They retire with
    /// their figures at exit (`EVENT_FLAG_AT_EXIT`), or, when their exit was not
    /// seen either, count with their last reading.
    pub lost_exits: u64,
    /// Members whose fork no program saw (the kernel skipped every copy, see
    /// `EngineMode::adopt`), found at a later event by their ancestry and counted
    /// in `procs_spawned`/`threads_spawned` then.
    pub adopted: u64,
    /// Execs no program saw, found at the member's exit by its mm (counted in
    /// `execs` too; several unseen execs of one task count once).
    pub execs_unseen: u64,
    /// Process ends whose exit no program saw, counted when the sweep found the
    /// leader dead or at its free instead.
    pub exits_unseen: u64,
    /// Children of an exiting member beyond the bound the exit program looks at
    /// (`ADOPT_CHILDREN`): a child among them whose fork was skipped is not found.
    pub children_unchecked: u64,
}

/// How the life-cycle programs run, set by user space before loading (a read-only
/// global of the object).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct EngineMode {
    /// 1 where tracepoints run preemptible (6.19 on), the programs' second copies
    /// loaded: a task no program saw forked joins the tree at its first later
    /// event (exec, exit) when its process, parent or grandparent is a member, and
    /// a member's exit walks its children for any the tree does not know; a
    /// member whose exit no program saw counts its process's end at its free.
    pub adopt: u32,
    /// Tests only (0 in use): the fork programs ignore the fork of a child whose
    /// tid is a multiple of this, as if the kernel had skipped every copy.
    pub drop_forks_every: u32,
    /// Tests only: the exit programs ignore the exit of a thread whose tid is a
    /// multiple of this.
    pub drop_exits_every: u32,
    /// Tests only: the exec programs ignore the execs of a member other than the
    /// root whose tid is a multiple of this.
    pub drop_execs_every: u32,
}

/// The children an exiting member's exit program looks at for members whose fork
/// was skipped; more are counted in `TreeStats::children_unchecked`.
pub const ADOPT_CHILDREN: u32 = 32;
/// The generations above a task with no entry that its exec or exit looks at for
/// a member (its parent, grandparent and great-grandparent).
pub const ADOPT_DEPTH: u32 = 3;

pub const EVENT_FORK: u32 = 1;
pub const EVENT_EXEC: u32 = 2;
pub const EVENT_EXIT: u32 = 3;

/// EXIT record of the last thread of its process.
pub const EVENT_FLAG_GROUP_DEAD: u32 = 1;
/// EXIT record of an old leader that a non-leader exec displaced: its tid is now
/// another member's, whose reading stays.
pub const EVENT_FLAG_SHARED_TID: u32 = 2;
/// EXIT record whose figures are the thread's at `sched_process_exit`, its task
/// freed before the final ones could be read (see `TaskInfo::at_exit`).
pub const EVENT_FLAG_AT_EXIT: u32 = 8;
/// FORK record of a thread (not shown as a process event; it makes the thread a
/// member user space reads).
pub const EVENT_FLAG_THREAD: u32 = 4;
/// FORK record of a member found after its fork (see `EngineMode::adopt`): sent at
/// its first event the programs saw, or at its parent's exit.
pub const EVENT_FLAG_ADOPTED: u32 = 16;

/// A live member's figures now, sent by the probe program (see [`LiveReading`]).
pub const EVENT_READING: u32 = 4;

/// READING of a thread that has passed `sched_process_exit` but is still on a CPU.
pub const READING_FLAG_EXITED: u32 = 1;
/// READING of a leader that is a zombie (or dead): its process is no longer live,
/// as /proc/PID/stat would say `Z`.
pub const READING_FLAG_ZOMBIE: u32 = 2;
/// READING of a leader whose memory cgroup is the one user space named in the
/// probe's run (its `cgroup_subsys_state`, alive for the whole run).
pub const READING_FLAG_MEMCG_KNOWN: u32 = 4;
/// READING of a leader whose memory cgroup is another: `memcg_id` and `memcg_css`
/// say which.
pub const READING_FLAG_MEMCG_ID: u32 = 8;

/// Members of one probe run that have not run since their last READING (see
/// [`IdleBatch`]).
pub const EVENT_IDLE: u32 = 5;

/// The probe's arguments: keys two per argument in the first `PROBE_BATCH / 2`,
/// then the tree's memory cgroup's css, then this: non-zero to read every member
/// whole, idle or not (user space asks for it every few passes: a member's RSS
/// moves without it running, when the kernel reclaims its pages).
pub const PROBE_ARG_FULL: usize = PROBE_BATCH / 2 + 1;

/// The members of one probe run whose threads have not run since their last
/// READING (`TaskInfo::probe_runtime`): bit i of `mask` for the run's i-th key
/// (user space drains the ring after each run, so it knows the run's keys; `first`
/// is the run's first key, checked). User space takes their last reading again.
/// A bit mask, not the keys: the probe's stack and its members' together must
/// stay under 512 bytes, which 5.10 and 6.1 refused with the 64 bytes of keys.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct IdleBatch {
    /// `EVENT_IDLE`.
    pub kind: u32,
    pub mask: u32,
    pub first: u32,
    pub _pad: u32,
}

/// One member's figures, read by the probe program at user space's demand: what
/// /proc/PID/task/TID/schedstat, /proc/PID/task/TID/io and (for a leader)
/// /proc/PID/stat would show, from the same kernel fields, in one record.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct LiveReading {
    /// `EVENT_READING`.
    pub kind: u32,
    /// The member's key (its tid).
    pub tid: u32,
    /// Its tgid.
    pub pid: u32,
    /// `READING_FLAG_*` bits.
    pub flags: u32,
    /// Leader only: the process's resident pages as /proc/PID/stat counts them
    /// (file + anon + shmem of its mm); 0 for other threads.
    pub rss_pages: u64,
    /// CPU (`se.sum_exec_runtime`), tick times and I/O of this thread alone.
    pub fig: Figures,
    /// With `READING_FLAG_MEMCG_ID`: the id (its directory's inode) of the memory
    /// cgroup the leader is charged to, and that cgroup's memory
    /// `cgroup_subsys_state`, which user space names in later runs once the id is
    /// the tree's.
    pub memcg_id: u64,
    pub memcg_css: u64,
    /// Minor + major page faults of this thread (`min_flt + maj_flt`); 0 where the
    /// offsets are unknown (`Offsets::task_min_flt`). User space sums a process's
    /// threads: with its RSS, what says its PSS can have moved (engine/pss.rs).
    pub faults: u64,
}

/// One record of the ordered event stream (ring buffer). FORK is sent for new
/// processes, EXEC for each exec, EXIT for every thread when it retires (after its
/// final context switch) with that thread's final figures.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Event {
    pub kind: u32,
    pub tree: u32,
    /// Process id (tgid) the event is about.
    pub pid: u32,
    /// Thread id (EXIT), else the process id.
    pub tid: u32,
    /// Parent process id (the forker for FORK, `real_parent` otherwise).
    pub ppid: u32,
    /// EXIT: exit code as `wait` reports it. Otherwise 0.
    pub exit_code: u32,
    /// `EVENT_FLAG_*` bits.
    pub flags: u32,
    pub _pad: u32,
    /// `bpf_ktime_get_ns()` (CLOCK_MONOTONIC).
    pub ts_ns: u64,
    /// EXIT: the thread's final figures. Otherwise 0.
    pub fig: Figures,
    pub comm: [u8; 16],
}

/// Offsets of the task_struct fields the programs read, resolved at load time from the
/// running kernel's BTF, so one object works on every kernel with BTF.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Offsets {
    pub task_pid: u32,
    pub task_tgid: u32,
    pub task_real_parent: u32,
    pub task_comm: u32,
    pub task_exit_code: u32,
    pub task_sum_exec_runtime: u32,
    pub task_utime: u32,
    pub task_stime: u32,
    pub task_signal: u32,
    pub task_state: u32,
    /// `task->on_cpu` (SMP kernels), or `NO_FIELD`: cleared once a task has switched
    /// out, so a `TASK_DEAD` task with it clear has made its final switch.
    pub task_on_cpu: u32,
    pub task_group_leader: u32,
    /// `task->ioac.read_bytes`, or `NO_FIELD` without CONFIG_TASK_IO_ACCOUNTING.
    pub task_io_read_bytes: u32,
    pub task_io_write_bytes: u32,
    /// `task->ioac.rchar`, or `NO_FIELD` without CONFIG_TASK_XACCT.
    pub task_io_rchar: u32,
    pub task_io_wchar: u32,
    pub signal_maxrss: u32,
    /// 1 when `sched_process_exit` passes `group_dead` as its 2nd argument (6.16+).
    pub exit_has_group_dead: u32,
    pub signal_live: u32,
    /// `task->ioac.rchar` when rchar, wchar, read_bytes and write_bytes sit at +0, +8,
    /// +32 and +40 (CONFIG_TASK_XACCT and CONFIG_TASK_IO_ACCOUNTING both on, as in
    /// every major distribution), so one read takes all four; else `NO_FIELD`, and
    /// the programs report no I/O.
    pub task_io_block: u32,
    /// `task->exit_state` (`EXIT_ZOMBIE`/`EXIT_DEAD` bits).
    pub task_exit_state: u32,
    /// `task->mm`.
    pub task_mm: u32,
    /// `mm->rss_stat[0]`, or `NO_FIELD` where its layout is not understood (RSS is
    /// then read from /proc).
    pub mm_rss_stat: u32,
    /// Bytes from one `rss_stat` counter to the next (a `percpu_counter` since 6.2,
    /// an `atomic_long_t` before).
    pub rss_stride: u32,
    /// Offset of the counter's value in one element (`percpu_counter.count`).
    pub rss_count: u32,
    /// `task->start_boottime` (`real_start_time` before 5.5), or `NO_FIELD`: with
    /// `tick_ns`, the start time /proc/PID/stat shows, for registered entries.
    pub task_start_boottime: u32,
    /// Nanoseconds per clock tick of /proc's times (10,000,000 for USER_HZ 100).
    pub tick_ns: u32,
    /// `task->cgroups` (the css_set), `css_set.subsys`, `cgroup_subsys_state.cgroup`,
    /// `cgroup.kn` and `kernfs_node.id` (a cgroup's id, its directory's inode): the
    /// leader's memory cgroup, whose id the probe reports, and the node programs'
    /// v2 cgroup of a task. `memory_cgrp_id` is the memory controller's index in
    /// `subsys`, or `NO_FIELD` without one (the probe then reads no cgroup).
    pub task_cgroups: u32,
    pub css_set_subsys: u32,
    pub css_cgroup: u32,
    pub cgroup_kn: u32,
    pub kernfs_node_id: u32,
    pub memory_cgrp_id: u32,
    /// `task->children` and `task->sibling` (list heads): an exiting member's
    /// children, walked for those whose fork was skipped; `NO_FIELD` where either
    /// is missing (no walk).
    pub task_children: u32,
    pub task_sibling: u32,
    /// `task->min_flt`, where `maj_flt` follows it (one read takes both), else
    /// `NO_FIELD`.
    pub task_min_flt: u32,
}

/// `TASK_DEAD` in `task->__state`: set just before the final context switch.
pub const TASK_DEAD: u32 = 0x80;

/// Marks a field that the running kernel does not have.
pub const NO_FIELD: u32 = u32::MAX;

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all six are repr(C), Copy, made of integers (or of `Figures`, itself
    // only u64s), with explicit padding.
    unsafe impl aya::Pod for super::EngineMode {}
    unsafe impl aya::Pod for super::TaskInfo {}
    unsafe impl aya::Pod for super::TreeStats {}
    unsafe impl aya::Pod for super::Event {}
    unsafe impl aya::Pod for super::Offsets {}
    unsafe impl aya::Pod for super::LiveReading {}
}

/// The node agent's per-cgroup process life cycle, counted by the node programs
/// for every task on the host and keyed by the task's cgroup v2 id (one copy per
/// CPU; user space sums them).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeCounts {
    /// Processes (not threads) started by a task of the cgroup.
    pub spawned: u64,
    /// Processes whose last thread exited in the cgroup.
    pub exited: u64,
    pub execs: u64,
    /// Processes that exited with a non-zero status.
    pub nonzero_exits: u64,
    /// Processes ended by a signal.
    pub signal_kills: u64,
}

/// Cgroups the node programs can count at once.
pub const MAX_NODE_CGROUPS: u32 = 16_384;

#[cfg(feature = "user")]
// SAFETY: repr(C), Copy, only u64s, no padding.
unsafe impl aya::Pod for NodeCounts {}

/// Offsets the node programs read beside `Offsets` (whose cgroup fields they use
/// too), resolved from the running kernel's BTF by user space (a read-only global
/// of the node programs).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct NodeOffsets {
    /// `css_set.dfl_cgrp` (the v2 cgroup).
    pub css_set_dfl_cgrp: u32,
    /// 1 when `mark_victim` passes the victim's task (6.8+); 0: only its pid.
    pub mark_victim_has_task: u32,
}

/// Key of the node programs' CPU by command: a cgroup and a command name.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct CommandKey {
    pub cgroup_id: u64,
    pub comm: [u8; 16],
}

/// CPU of the threads freed under one command in one cgroup, and how many were
/// processes' leaders.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CommandCpu {
    pub cpu_ns: u64,
    pub processes: u64,
}

/// (cgroup, command) pairs the node programs can count at once.
pub const MAX_NODE_COMMANDS: u32 = 16_384;

/// A thread that exited, as the node programs saw it at `sched_process_exit`: what
/// it counts with should its free never reach the programs.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ExitedTask {
    pub key: CommandKey,
    /// `sum_exec_runtime` at the exit (short by the last stretch since the
    /// scheduler last brought it up to date, and by the rest of the exit path).
    pub cpu_ns: u64,
    /// `bpf_ktime_get_ns` (CLOCK_MONOTONIC) at the exit.
    pub at_ns: u64,
    /// The thread's id in the initial pid namespace.
    pub tid: u32,
    /// 1 for a process's leader.
    pub leader: u32,
}

/// Threads exited and not yet freed that the node programs can keep at once.
pub const MAX_NODE_EXITED: u32 = 16_384;

/// One OOM kill, as the node programs see it at `mark_victim`.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct OomVictim {
    /// The victim's cgroup v2 id; 0 when the kernel passes only a pid.
    pub cgroup_id: u64,
    pub pid: u32,
    pub _pad: u32,
    pub comm: [u8; 16],
}

#[cfg(feature = "user")]
// SAFETY: repr(C), Copy, integers and a byte array, explicit padding.
unsafe impl aya::Pod for NodeOffsets {}
#[cfg(feature = "user")]
// SAFETY: as above.
unsafe impl aya::Pod for OomVictim {}
#[cfg(feature = "user")]
// SAFETY: repr(C), Copy, a u64 and a byte array, no padding.
unsafe impl aya::Pod for CommandKey {}
#[cfg(feature = "user")]
// SAFETY: repr(C), Copy, only u64s.
unsafe impl aya::Pod for CommandCpu {}
#[cfg(feature = "user")]
// SAFETY: repr(C), Copy, a CommandKey and integers, no padding (48 bytes).
unsafe impl aya::Pod for ExitedTask {}
