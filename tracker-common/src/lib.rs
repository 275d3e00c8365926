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

/// Ring buffer size in bytes (a power of two, multiple of the page size).
pub const EVENTS_BYTES: u32 = 256 * 1024;

/// Per-task map value, keyed by the kernel tid (`task->pid`).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TaskInfo {
    /// Thread-group id (the process id seen by user space).
    pub tgid: u32,
    /// Tree slot, 1..MAX_TREES.
    pub tree: u32,
    /// `TASK_FLAG_*` bits.
    pub flags: u32,
    pub _pad: u32,
}

/// Set at `sched_process_exit` when this thread was the last of its process.
pub const TASK_FLAG_GROUP_DEAD: u32 = 1;

/// Per-tree totals of everything that has exited, kept per CPU (no atomics needed)
/// and summed by user space. Values only grow, so sums of differences add up.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TreeStats {
    /// Exact CPU time of freed threads (`se.sum_exec_runtime` at `sched_process_free`,
    /// which only runs after the task's final context switch).
    pub cpu_ns: u64,
    /// Tick-sampled user time of exited threads; only used to split `cpu_ns`.
    pub utime_ns: u64,
    /// Tick-sampled system time of exited threads; only used to split `cpu_ns`.
    pub stime_ns: u64,
    /// Storage bytes read / written by exited processes (`signal->ioac` when the
    /// leader is freed), counted once per process, like /proc/PID/io.
    pub read_bytes: u64,
    pub write_bytes: u64,
    /// Processes (not threads) that started in the tree.
    pub procs_spawned: u64,
    /// Processes whose last thread exited.
    pub procs_exited: u64,
    pub threads_spawned: u64,
    pub threads_exited: u64,
    /// Successful execve calls by tree members.
    pub execs: u64,
    /// Largest `signal->maxrss` (KiB) of any exited process.
    pub max_rss_kib: u64,
    /// Events dropped because the ring buffer was full. Totals above stay exact.
    pub lost_events: u64,
    /// New tasks that could not be recorded because the task map was full.
    pub untracked_tasks: u64,
}

pub const EVENT_FORK: u32 = 1;
pub const EVENT_EXEC: u32 = 2;
pub const EVENT_EXIT: u32 = 3;

/// One record of the ordered event stream (ring buffer).
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Event {
    pub kind: u32,
    pub tree: u32,
    /// Process id (tgid) the event is about.
    pub pid: u32,
    /// Parent process id (the forker for FORK, `real_parent` otherwise).
    pub ppid: u32,
    /// `bpf_ktime_get_ns()` (CLOCK_MONOTONIC).
    pub ts_ns: u64,
    /// EXIT: CPU of the whole process in ns. Otherwise 0.
    pub cpu_ns: u64,
    /// EXIT: exit code as `wait` reports it. Otherwise 0.
    pub exit_code: u32,
    pub _pad: u32,
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
    pub signal_maxrss: u32,
    pub signal_sum_sched_runtime: u32,
    /// `signal->ioac.read_bytes`, or `NO_FIELD` without CONFIG_TASK_IO_ACCOUNTING.
    pub signal_io_read_bytes: u32,
    pub signal_io_write_bytes: u32,
    /// 1 when `sched_process_exit` passes `group_dead` as its 2nd argument (6.16+).
    pub exit_has_group_dead: u32,
    pub signal_live: u32,
}

/// Marks a field that the running kernel does not have.
pub const NO_FIELD: u32 = u32::MAX;

#[cfg(feature = "user")]
mod pod {
    // SAFETY: all four are repr(C), Copy, made of integers, with explicit padding.
    unsafe impl aya::Pod for super::TaskInfo {}
    unsafe impl aya::Pod for super::TreeStats {}
    unsafe impl aya::Pod for super::Event {}
    unsafe impl aya::Pod for super::Offsets {}
}
