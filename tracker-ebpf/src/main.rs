//! Kernel side of resource-tracker: follows fork/exec/exit and the scheduler for the
//! tasks that descend from a registered root, and keeps each tree's exact totals.
//!
//! Field offsets are not compiled in: user space reads them from the running kernel's
//! BTF and stores them in `OFFSETS` (a read-only global) before loading.
#![no_std]
#![no_main]

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_ktime_get_ns, bpf_probe_read_kernel},
    macros::{btf_tracepoint, map},
    maps::{HashMap, PerCpuArray, RingBuf},
    programs::BtfTracePointContext,
};
use tracker_common::{
    Event, Offsets, TaskInfo, TreeStats, DEFAULT_MAX_TASKS, EVENTS_BYTES, EVENT_EXEC, EVENT_EXIT,
    EVENT_FORK, MAX_TREES, NO_FIELD, TASK_FLAG_GROUP_DEAD,
};

#[no_mangle]
static OFFSETS: Offsets = Offsets {
    task_pid: 0,
    task_tgid: 0,
    task_real_parent: 0,
    task_comm: 0,
    task_exit_code: 0,
    task_sum_exec_runtime: 0,
    task_utime: 0,
    task_stime: 0,
    task_signal: 0,
    signal_maxrss: 0,
    signal_sum_sched_runtime: 0,
    signal_io_read_bytes: NO_FIELD,
    signal_io_write_bytes: NO_FIELD,
    exit_has_group_dead: 0,
    signal_live: 0,
};

const BPF_RB_NO_WAKEUP: u64 = 1;
const BPF_RB_FORCE_WAKEUP: u64 = 2;
const BPF_RB_AVAIL_DATA: u64 = 0;
const WAKEUP_BYTES: u64 = EVENTS_BYTES as u64 / 4;

/// tid → tree membership. Sized by user space (`set_max_entries`).
#[map]
static TASKS: HashMap<u32, TaskInfo> = HashMap::with_max_entries(DEFAULT_MAX_TASKS, 0);

/// Per-tree totals of exited members, one copy per CPU.
#[map]
static TREE_STATS: PerCpuArray<TreeStats> = PerCpuArray::with_max_entries(MAX_TREES, 0);

/// Ordered fork/exec/exit records for user space.
#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(EVENTS_BYTES, 0);

#[inline(always)]
fn off() -> &'static Offsets {
    // Read through a volatile pointer: the verifier-visible value is the one user space
    // wrote into .rodata, not the zero the compiler saw.
    unsafe { &*core::ptr::read_volatile(&&OFFSETS) }
}

#[inline(always)]
unsafe fn field<T: Copy + Default>(base: *const u8, offset: u32) -> T {
    if offset == NO_FIELD {
        return T::default();
    }
    bpf_probe_read_kernel(base.add(offset as usize) as *const T).unwrap_or_default()
}

#[inline(always)]
fn stats(tree: u32) -> Option<&'static mut TreeStats> {
    let p = TREE_STATS.get_ptr_mut(tree)?;
    Some(unsafe { &mut *p })
}

#[inline(always)]
unsafe fn emit(tree: u32, kind: u32, task: *const u8, pid: u32, ppid: u32, cpu_ns: u64, code: u32) {
    match EVENTS.reserve::<Event>(0) {
        Some(mut entry) => {
            let o = off();
            let comm: [u8; 16] = field(task, o.task_comm);
            entry.write(Event {
                kind,
                tree,
                pid,
                ppid,
                ts_ns: bpf_ktime_get_ns(),
                cpu_ns,
                exit_code: code,
                _pad: 0,
                comm,
            });
            // Wake user space only once a quarter of the ring is filled; it also
            // drains on a short timer. A wake-up per event costs the host far more
            // than the programs themselves (a context switch each).
            let flags = if EVENTS.query(BPF_RB_AVAIL_DATA) >= WAKEUP_BYTES {
                BPF_RB_FORCE_WAKEUP
            } else {
                BPF_RB_NO_WAKEUP
            };
            entry.submit(flags);
        }
        None => {
            if let Some(s) = stats(tree) {
                s.lost_events += 1;
            }
        }
    }
}

/// sched_process_fork(parent, child): the child joins the forker's tree, whatever
/// happens to its parent later (orphans stay in the tree).
#[btf_tracepoint(function = "sched_process_fork")]
pub fn sched_process_fork(ctx: BtfTracePointContext) -> u32 {
    let cur = bpf_get_current_pid_tgid() as u32;
    let Some(parent) = (unsafe { TASKS.get(cur) }) else {
        return 0;
    };
    let tree = parent.tree;
    let parent_tgid = parent.tgid;
    let child: *const u8 = ctx.arg(1);
    let o = off();
    let (tid, tgid): (u32, u32) = unsafe { (field(child, o.task_pid), field(child, o.task_tgid)) };
    let info = TaskInfo {
        tgid,
        tree,
        flags: 0,
        _pad: 0,
    };
    let Some(s) = stats(tree) else { return 0 };
    if TASKS.insert(tid, info, 0).is_err() {
        s.untracked_tasks += 1;
        return 0;
    }
    if tid == tgid {
        s.procs_spawned += 1;
        unsafe { emit(tree, EVENT_FORK, child, tgid, parent_tgid, 0, 0) };
    } else {
        s.threads_spawned += 1;
    }
    0
}

/// sched_process_exec(p, old_pid, bprm).
#[btf_tracepoint(function = "sched_process_exec")]
pub fn sched_process_exec(ctx: BtfTracePointContext) -> u32 {
    let cur = bpf_get_current_pid_tgid() as u32;
    let old: u32 = ctx.arg::<u64>(1) as u32;
    // A non-leader thread that execs takes over the leader's pid: move its entry.
    let key = if old != cur && old != 0 { old } else { cur };
    let Some(info) = (unsafe { TASKS.get(key) }).copied() else {
        return 0;
    };
    if key != cur {
        let _ = TASKS.insert(cur, info, 0);
        let _ = TASKS.remove(key);
    }
    let task: *const u8 = ctx.arg(0);
    let o = off();
    let ppid = unsafe {
        let parent: *const u8 = field::<u64>(task, o.task_real_parent) as *const u8;
        field::<u32>(parent, o.task_tgid)
    };
    if let Some(s) = stats(info.tree) {
        s.execs += 1;
    }
    unsafe { emit(info.tree, EVENT_EXEC, task, info.tgid, ppid, 0, 0) };
    0
}

/// sched_process_exit(p[, group_dead]): count the process once, when its last thread
/// leaves, and note its peak RSS while `signal` is certainly valid.
#[btf_tracepoint(function = "sched_process_exit")]
pub fn sched_process_exit(ctx: BtfTracePointContext) -> u32 {
    let cur = bpf_get_current_pid_tgid() as u32;
    let Some(p) = TASKS.get_ptr_mut(cur) else {
        return 0;
    };
    let info = unsafe { &mut *p };
    let task: *const u8 = ctx.arg(0);
    let o = off();
    let signal: *const u8 = unsafe { field::<u64>(task, o.task_signal) as *const u8 };
    let group_dead = if o.exit_has_group_dead != 0 {
        ctx.arg::<u64>(1) & 0xff != 0
    } else {
        // Older kernels: `signal->live` was already decremented by this thread.
        unsafe { field::<i32>(signal, o.signal_live) == 0 }
    };
    if !group_dead {
        return 0;
    }
    info.flags |= TASK_FLAG_GROUP_DEAD;
    let maxrss: u64 = unsafe { field(signal, o.signal_maxrss) };
    if let Some(s) = stats(info.tree) {
        s.procs_exited += 1;
        if maxrss > s.max_rss_kib {
            s.max_rss_kib = maxrss;
        }
    }
    0
}

/// sched_process_free(p): runs from the RCU callback that frees a task, which is
/// queued only once both the final context switch and the reaping have happened
/// (`rcu_users` starts at 2), so `sum_exec_runtime` is final here. Unlike a
/// `sched_switch` hook this costs nothing per context switch of the host.
#[btf_tracepoint(function = "sched_process_free")]
pub fn sched_process_free(ctx: BtfTracePointContext) -> u32 {
    let task: *const u8 = ctx.arg(0);
    unsafe { account_freed(task, off()) };
    0
}

#[inline(always)]
unsafe fn account_freed(task: *const u8, o: &Offsets) {
    let tid: u32 = field(task, o.task_pid);
    let Some(info) = TASKS.get(tid).copied() else {
        return;
    };
    let _ = TASKS.remove(tid);
    let runtime: u64 = field(task, o.task_sum_exec_runtime);
    let Some(s) = stats(info.tree) else { return };
    s.cpu_ns += runtime;
    s.utime_ns += field::<u64>(task, o.task_utime);
    s.stime_ns += field::<u64>(task, o.task_stime);
    s.threads_exited += 1;
    if tid == info.tgid {
        // The leader is freed last (it waits as a zombie until every thread is
        // released), so signal->{sum_sched_runtime,ioac} hold the whole process.
        let signal: *const u8 = field::<u64>(task, o.task_signal) as *const u8;
        s.read_bytes += field::<u64>(signal, o.signal_io_read_bytes);
        s.write_bytes += field::<u64>(signal, o.signal_io_write_bytes);
        let cpu: u64 = field(signal, o.signal_sum_sched_runtime);
        let parent: *const u8 = field::<u64>(task, o.task_real_parent) as *const u8;
        let ppid: u32 = field(parent, o.task_tgid);
        let code: u32 = field(task, o.task_exit_code);
        emit(info.tree, EVENT_EXIT, task, info.tgid, ppid, cpu, code);
    }
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[link_section = "license"]
#[no_mangle]
static LICENSE: [u8; 4] = *b"GPL\0";
