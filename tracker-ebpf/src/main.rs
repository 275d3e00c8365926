//! Kernel side of resource-tracker: follows fork/exec/exit for the tasks that descend
//! from a registered root, and retires each thread with its final CPU and I/O at its
//! final context switch, whenever (or whether) it is reaped and freed.
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
    EVENT_FLAG_GROUP_DEAD, EVENT_FLAG_SHARED_TID, EVENT_FORK, MAX_TREES, NO_FIELD, TASK_DEAD,
    TASK_FLAG_EXITED, TASK_FLAG_GROUP_DEAD, TASK_FLAG_ROOT,
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
    task_state: 0,
    task_group_leader: 0,
    task_io_read_bytes: NO_FIELD,
    task_io_write_bytes: NO_FIELD,
    task_io_rchar: NO_FIELD,
    task_io_wchar: NO_FIELD,
    signal_maxrss: 0,
    exit_has_group_dead: 0,
    switch_has_prev_state: 0,
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
    // SAFETY: OFFSETS is a static; the pointer read is to a valid, aligned reference.
    unsafe { &*core::ptr::read_volatile(&&OFFSETS) }
}

/// Reads a field of a kernel object. A missing field (`NO_FIELD`) or a failed read
/// yields the default.
///
/// # Safety
/// `base` must be a kernel pointer handed to the program (or read from such a
/// pointer); `bpf_probe_read_kernel` tolerates a bad one, so the worst case is a 0.
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
    // SAFETY: a per-CPU array slot, valid for the program's run on this CPU.
    Some(unsafe { &mut *p })
}

/// Sends one record. A full ring costs only the record: the totals in
/// `TREE_STATS` are kept apart from it.
///
/// # Safety
/// `task` must be the kernel task the record is about.
#[inline(always)]
unsafe fn emit(tree: u32, task: *const u8, ev: Event, wake: bool) {
    match EVENTS.reserve::<Event>(0) {
        Some(mut entry) => {
            let o = off();
            let mut ev = ev;
            ev.tree = tree;
            ev.ts_ns = bpf_ktime_get_ns();
            ev.comm = field(task, o.task_comm);
            entry.write(ev);
            // Wake user space only once a quarter of the ring is filled (it also
            // drains at every sample), or for a record it waits for. A wake-up per
            // event costs the host far more than the programs themselves.
            let flags = if wake || EVENTS.query(BPF_RB_AVAIL_DATA) >= WAKEUP_BYTES {
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
    // SAFETY: the value is read at once, before any other map operation.
    let Some(parent) = (unsafe { TASKS.get(cur) }) else {
        return 0;
    };
    let tree = parent.tree;
    let parent_tgid = parent.tgid;
    let parent_flags = parent.flags;
    let child: *const u8 = ctx.arg(1);
    let o = off();
    // SAFETY: `child` is the tracepoint's task argument.
    let (tid, tgid): (u32, u32) = unsafe { (field(child, o.task_pid), field(child, o.task_tgid)) };
    // A thread of the root is part of the root: any of them may be its last.
    let flags = if tid != tgid {
        parent_flags & TASK_FLAG_ROOT
    } else {
        0
    };
    let info = TaskInfo {
        tgid,
        tree,
        flags,
        _pad: 0,
        task: child as u64,
    };
    let Some(s) = stats(tree) else { return 0 };
    if TASKS.insert(tid, info, 0).is_err() {
        s.untracked_tasks += 1;
        return 0;
    }
    if tid == tgid {
        s.procs_spawned += 1;
        let ev = Event {
            kind: EVENT_FORK,
            pid: tgid,
            tid,
            ppid: parent_tgid,
            ..Event::default()
        };
        // SAFETY: `child` is the tracepoint's task argument.
        unsafe { emit(tree, child, ev, false) };
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
    // SAFETY: the map value is copied out at once.
    let Some(mut info) = (unsafe { TASKS.get(key) }).copied() else {
        return 0;
    };
    let task: *const u8 = ctx.arg(0);
    // The exec'ing thread is `task`: a root registered from user space learns its
    // identity here, and a moved entry takes the thread's.
    info.task = task as u64;
    let _ = TASKS.insert(cur, info, 0);
    if key != cur {
        let _ = TASKS.remove(key);
    }
    let o = off();
    // SAFETY: `task` is the tracepoint's task argument; its parent pointer is read
    // through the fault-tolerant helper.
    let ppid = unsafe {
        let parent: *const u8 = field::<u64>(task, o.task_real_parent) as *const u8;
        field::<u32>(parent, o.task_tgid)
    };
    if let Some(s) = stats(info.tree) {
        s.execs += 1;
    }
    let ev = Event {
        kind: EVENT_EXEC,
        pid: info.tgid,
        // The exec'ing thread's tid before the exec (the tgid from now on).
        tid: key,
        ppid,
        ..Event::default()
    };
    // SAFETY: `task` is the tracepoint's task argument.
    unsafe { emit(info.tree, task, ev, false) };
    0
}

/// sched_process_exit(p[, group_dead]): marks the thread as on its way out, counts
/// the process once when its last thread leaves, and notes its peak RSS while
/// `signal` is certainly valid.
#[btf_tracepoint(function = "sched_process_exit")]
pub fn sched_process_exit(ctx: BtfTracePointContext) -> u32 {
    let cur = bpf_get_current_pid_tgid() as u32;
    let Some(p) = TASKS.get_ptr_mut(cur) else {
        return 0;
    };
    // SAFETY: a hash map value, valid until removed; only this thread's own exit
    // and its final switch touch it, and they are ordered.
    let info = unsafe { &mut *p };
    info.flags |= TASK_FLAG_EXITED;
    let task: *const u8 = ctx.arg(0);
    let o = off();
    // SAFETY: `task` is the tracepoint's task argument (current).
    let signal: *const u8 = unsafe { field::<u64>(task, o.task_signal) as *const u8 };
    let group_dead = if o.exit_has_group_dead != 0 {
        ctx.arg::<u64>(1) & 0xff != 0
    } else {
        // Older kernels: `signal->live` was already decremented by this thread.
        // SAFETY: `signal` of the current, exiting task is still allocated.
        unsafe { field::<i32>(signal, o.signal_live) == 0 }
    };
    if !group_dead {
        return 0;
    }
    info.flags |= TASK_FLAG_GROUP_DEAD;
    // SAFETY: as above.
    let maxrss: u64 = unsafe { field(signal, o.signal_maxrss) };
    if let Some(s) = stats(info.tree) {
        s.procs_exited += 1;
        if maxrss > s.max_rss_kib {
            s.max_rss_kib = maxrss;
        }
    }
    0
}

/// sched_switch(preempt, prev, next[, prev_state]): a task switched out in
/// `TASK_DEAD` has made its final context switch, so its runtime, tick times and
/// I/O are final here, however late its parent (or a lazy init) reaps it and however
/// late RCU frees it. Every other switch of the host returns after one comparison.
#[btf_tracepoint(function = "sched_switch")]
pub fn sched_switch(ctx: BtfTracePointContext) -> u32 {
    let o = off();
    let prev: *const u8 = ctx.arg(1);
    let state = if o.switch_has_prev_state != 0 {
        ctx.arg::<u64>(3) as u32
    } else {
        // SAFETY: `prev` is the tracepoint's task argument.
        unsafe { field::<u32>(prev, o.task_state) }
    };
    if state & TASK_DEAD != 0 {
        // SAFETY: as above; `prev` is past its last instruction.
        unsafe { retire(prev, true) };
    }
    0
}

/// sched_process_free(p): the RCU callback that frees a task. A thread the
/// final-switch program missed (the map was updated in between, or that program is
/// not attached) retires here, later but as exactly; otherwise the entry is gone
/// already and this does nothing.
#[btf_tracepoint(function = "sched_process_free")]
pub fn sched_process_free(ctx: BtfTracePointContext) -> u32 {
    let task: *const u8 = ctx.arg(0);
    // SAFETY: `task` is the tracepoint's task argument.
    unsafe { retire(task, false) };
    0
}

/// Adds a dead member thread's final figures to its tree, sends its EXIT record,
/// and forgets it. `at_switch`: called at the final context switch (else at the
/// RCU free, seconds later, when the tid may belong to a new task).
///
/// # Safety
/// `task` must be a task_struct that has made its final context switch.
#[inline(always)]
unsafe fn retire(task: *const u8, at_switch: bool) {
    let o = off();
    let tid: u32 = field(task, o.task_pid);
    let Some(info) = TASKS.get(tid).copied() else {
        return;
    };
    // An entry registered from user space (identity 0) is taken at the final switch,
    // where the tid is still this task's; a late free acts only on its own entry.
    let own = info.task == task as u64 || (info.task == 0 && at_switch);
    // At its final switch, a task whose tid another thread of its process took (the
    // old leader, through an exec from a non-leader thread) still counts, but leaves
    // the entry alone. Anything else is not this task's entry.
    if !own && !(at_switch && info.tgid == field::<u32>(task, o.task_tgid)) {
        return;
    }
    let mut ev = Event {
        kind: EVENT_EXIT,
        pid: info.tgid,
        tid,
        cpu_ns: field(task, o.task_sum_exec_runtime),
        utime_ns: field(task, o.task_utime),
        stime_ns: field(task, o.task_stime),
        read_bytes: field(task, o.task_io_read_bytes),
        write_bytes: field(task, o.task_io_write_bytes),
        rchar: field(task, o.task_io_rchar),
        wchar: field(task, o.task_io_wchar),
        ..Event::default()
    };
    let Some(s) = stats(info.tree) else {
        return;
    };
    s.cpu_ns += ev.cpu_ns;
    s.utime_ns += ev.utime_ns;
    s.stime_ns += ev.stime_ns;
    s.read_bytes += ev.read_bytes;
    s.write_bytes += ev.write_bytes;
    s.rchar += ev.rchar;
    s.wchar += ev.wchar;
    s.threads_exited += 1;
    // Totals first, entry second: a reader that takes the totals and then lists the
    // map finds every thread in one or the other.
    if own {
        let _ = TASKS.remove(tid);
    } else {
        ev.flags = EVENT_FLAG_SHARED_TID;
    }
    let group_dead = own && info.flags & TASK_FLAG_GROUP_DEAD != 0;
    if group_dead {
        ev.flags = EVENT_FLAG_GROUP_DEAD;
        let leader: *const u8 = field::<u64>(task, o.task_group_leader) as *const u8;
        ev.exit_code = field(leader, o.task_exit_code);
        let parent: *const u8 = field::<u64>(leader, o.task_real_parent) as *const u8;
        ev.ppid = field(parent, o.task_tgid);
    }
    // The root's last thread is what user space waits for at the end.
    emit(
        info.tree,
        task,
        ev,
        group_dead && info.flags & TASK_FLAG_ROOT != 0,
    );
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[link_section = "license"]
#[no_mangle]
static LICENSE: [u8; 4] = *b"GPL\0";
