//! The node agent's programs: for every task on the host, the process life cycle
//! counted per cgroup (`bpf_get_current_cgroup_id`: the v2 cgroup of the task the
//! tracepoint runs in). One hash update per fork, exec and process exit, whatever
//! the number of containers.

use aya_ebpf::{
    bindings::BPF_NOEXIST,
    helpers::{bpf_get_current_cgroup_id, bpf_ktime_get_ns},
    macros::{map, raw_tracepoint},
    maps::{HashMap, PerCpuArray, PerCpuHashMap, RingBuf},
    programs::RawTracePointContext,
};
use tracker_common::{
    CommandCpu, CommandKey, ExitedTask, NodeCounts, NodeOffsets, OomVictim, MAX_NODE_CGROUPS,
    MAX_NODE_COMMANDS, MAX_NODE_EXITED,
};

use super::{cgroup_id, exit_group_dead, field, ids, off};

#[map]
static NODE_COUNTS: PerCpuHashMap<u64, NodeCounts> =
    PerCpuHashMap::with_max_entries(MAX_NODE_CGROUPS, 0);

#[no_mangle]
static NODE_OFFSETS: NodeOffsets = NodeOffsets {
    css_set_dfl_cgrp: 0,
    mark_victim_has_task: 0,
};

/// CPU of freed threads by (cgroup, command), one copy per CPU.
#[map]
static NODE_COMMANDS: PerCpuHashMap<CommandKey, CommandCpu> =
    PerCpuHashMap::with_max_entries(MAX_NODE_COMMANDS, 0);

/// Threads that exited and are not yet freed, by task address: what each would
/// count with should the kernel free it without running the free program (user
/// space takes an entry over once it is old). Whichever removes the entry, the
/// free or user space, counts it, so it counts once.
#[map]
static NODE_EXITED: HashMap<u64, ExitedTask> = HashMap::with_max_entries(MAX_NODE_EXITED, 0);

/// Per CPU: at 0 the counts the node programs could not keep (a full map or ring);
/// at 1 the threads the kernel freed without the free program that were counted
/// at the exit of the next task given their memory, with their figures as of their
/// own exit (user space names how many: their CPU is short by up to a tick).
#[map]
static NODE_LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(2, 0);

#[inline(always)]
fn add_one(slot: u32) {
    if let Some(p) = NODE_LOST.get_ptr_mut(slot) {
        // SAFETY: this CPU's slot, valid for the program's run.
        unsafe { *p += 1 };
    }
}

#[inline(always)]
fn lost() {
    add_one(0);
}

/// OOM victims for user space; rare, so small.
#[map]
static NODE_OOM: RingBuf = RingBuf::with_byte_size(16 * 1024, 0);

#[inline(always)]
fn node_off() -> &'static NodeOffsets {
    // SAFETY: as `off()`: the value user space wrote into .rodata, read volatile.
    unsafe { &*core::ptr::read_volatile(&&NODE_OFFSETS) }
}

/// The cgroup v2 id of `task`'s own cgroup (0 where a pointer on the way is bad).
///
/// # Safety
/// `task` is a tracepoint's task argument; the pointers on the way are read through
/// the fault-tolerant helper.
#[inline(always)]
unsafe fn task_cgroup_id(task: *const u8) -> u64 {
    let cset: *const u8 = field::<u64>(task, off().task_cgroups) as *const u8;
    let cgrp: *const u8 = field::<u64>(cset, node_off().css_set_dfl_cgrp) as *const u8;
    cgroup_id(cgrp)
}

#[inline(always)]
fn bump(f: impl FnOnce(&mut NodeCounts)) {
    // SAFETY: a helper without arguments.
    let id = unsafe { bpf_get_current_cgroup_id() };
    // A cgroup's first event on two CPUs at once: both may find no entry, and the
    // second insert then fails with EEXIST. Inserting zeros (which may fail for that
    // reason) and then adding to this CPU's copy counts both; a full map loses this
    // count only (counted); user space removes cgroups that are gone.
    if NODE_COUNTS.get_ptr_mut(&id).is_none() {
        zeroed_slot!(zeros: NodeCounts);
        let _ = NODE_COUNTS.insert(&id, &*zeros, BPF_NOEXIST as u64);
    }
    match NODE_COUNTS.get_ptr_mut(&id) {
        // SAFETY: this CPU's copy of a hash value, valid for the program's run.
        Some(p) => f(unsafe { &mut *p }),
        None => lost(),
    }
}

/// sched_process_fork(parent, child), run in the parent: the child starts in the
/// parent's cgroup.
#[raw_tracepoint(tracepoint = "sched_process_fork")]
pub fn node_fork(ctx: RawTracePointContext) -> u32 {
    let child: *const u8 = ctx.arg(1);
    // SAFETY: `child` is the tracepoint's task argument.
    let (tid, tgid) = unsafe { ids(child) };
    if tid == tgid {
        bump(|c| c.spawned += 1);
    }
    0
}

#[raw_tracepoint(tracepoint = "sched_process_exec")]
pub fn node_exec(_ctx: RawTracePointContext) -> u32 {
    bump(|c| c.execs += 1);
    0
}

/// sched_process_exit(p[, group_dead]), run in the exiting thread. Every thread
/// leaves what it would count with in `NODE_EXITED` (see `node_free`); a process
/// counts when its last thread leaves, with how it ended (`exit_code`: the signal
/// in the low 7 bits, else the status in bits 8–15).
#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn node_exit(ctx: RawTracePointContext) -> u32 {
    let task: *const u8 = ctx.arg(0);
    let o = off();
    // SAFETY: `task` is the tracepoint's task argument (current); the helpers take
    // no arguments.
    let exited = unsafe {
        let (pid, tgid) = ids(task);
        ExitedTask {
            key: CommandKey {
                // The exiting thread is current: the same id as the chain
                // `node_free` reads, for one helper call.
                cgroup_id: bpf_get_current_cgroup_id(),
                comm: field(task, o.task_comm),
            },
            cpu_ns: field(task, o.task_sum_exec_runtime),
            at_ns: bpf_ktime_get_ns(),
            tid: pid,
            leader: u32::from(pid == tgid),
        }
    };
    let addr = task as u64;
    if NODE_EXITED
        .insert(&addr, &exited, BPF_NOEXIST as u64)
        .is_err()
    {
        // An entry at this address is a task the kernel freed without the free
        // program: its memory is this task's now. It counts here, with its figures
        // at its exit, if user space has not taken it over meanwhile (whoever
        // removes the entry counts it), and this task's entry takes its place.
        // SAFETY: the value is copied out at once.
        if let Some(old) = unsafe { NODE_EXITED.get(&addr) }.copied() {
            if NODE_EXITED.remove(&addr).is_ok() {
                count_command(&old.key, old.cpu_ns, old.leader != 0);
                add_one(1);
            }
        }
        if NODE_EXITED
            .insert(&addr, &exited, BPF_NOEXIST as u64)
            .is_err()
        {
            lost();
        }
    }
    // SAFETY: as above.
    let (group_dead, _) = unsafe { exit_group_dead(&ctx, task) };
    if !group_dead {
        return 0;
    }
    // SAFETY: as above.
    let code: i32 = unsafe { field(task, o.task_exit_code) };
    bump(|c| {
        c.exited += 1;
        if code & 0x7f != 0 {
            c.signal_kills += 1;
        } else if (code >> 8) & 0xff != 0 {
            c.nonzero_exits += 1;
        }
    });
    0
}

/// sched_process_free(p): a thread's CPU is final only from its last context
/// switch on (at its exit it may still lack the last stretch: all of it, for a short
/// one), so it is added here, when the kernel frees the task, by the task's own
/// cgroup and command (the current task is another, this is an RCU callback). It
/// counts only a thread whose exit the programs saw, and only if its `NODE_EXITED`
/// entry is still there: the kernel sometimes frees a task without running this
/// program (docs/engine.md), and the entry's figures as of the exit then count at
/// the exit of the next task given its memory (`node_exit`), or in user space once
/// the thread is reaped and the entry old, whichever removes the entry first. A
/// zombie nobody reaps is not freed, and not counted.
#[raw_tracepoint(tracepoint = "sched_process_free")]
pub fn node_free(ctx: RawTracePointContext) -> u32 {
    let task: *const u8 = ctx.arg(0);
    if NODE_EXITED.remove(&(task as u64)).is_err() {
        return 0;
    }
    let o = off();
    // SAFETY: `task` is the tracepoint's task argument, valid for its whole run;
    // its css_set is released after this tracepoint. Pointers are read through the
    // fault-tolerant helper.
    let (key, cpu_ns, leader) = unsafe {
        let key = CommandKey {
            cgroup_id: task_cgroup_id(task),
            comm: field(task, o.task_comm),
        };
        let (pid, tgid) = ids(task);
        (
            key,
            field::<u64>(task, o.task_sum_exec_runtime),
            pid == tgid,
        )
    };
    count_command(&key, cpu_ns, leader);
    0
}

/// Adds a thread's CPU, and its process when it is the leader, to its command.
#[inline(always)]
fn count_command(key: &CommandKey, cpu_ns: u64, leader: bool) {
    // As in `bump`: zeros first (a concurrent first insert may win), then this
    // CPU's copy.
    if NODE_COMMANDS.get_ptr_mut(key).is_none() {
        zeroed_slot!(zeros: CommandCpu);
        let _ = NODE_COMMANDS.insert(key, &*zeros, BPF_NOEXIST as u64);
    }
    match NODE_COMMANDS.get_ptr_mut(key) {
        Some(p) => {
            // SAFETY: this CPU's copy of a hash value, valid for the program's run.
            let c = unsafe { &mut *p };
            c.cpu_ns += cpu_ns;
            c.processes += u64::from(leader);
        }
        None => lost(),
    }
}

/// mark_victim(task, uid) (6.8+; older kernels pass only the pid): the task the OOM
/// killer chose, with its command and its own cgroup (the current task may be
/// another's, the one whose allocation failed).
#[raw_tracepoint(tracepoint = "mark_victim")]
pub fn node_oom(ctx: RawTracePointContext) -> u32 {
    let n = node_off();
    let o = off();
    zeroed_slot!(v: OomVictim);
    if n.mark_victim_has_task != 0 {
        let task: *const u8 = ctx.arg(0);
        // SAFETY: `task` is the tracepoint's task argument; the chain of pointers is
        // read through the fault-tolerant helper, a bad one gives 0.
        unsafe {
            v.pid = field(task, o.task_tgid);
            v.comm = field(task, o.task_comm);
            v.cgroup_id = task_cgroup_id(task);
        }
    } else {
        v.pid = ctx.arg::<u64>(0) as u32;
    }
    match NODE_OOM.reserve::<OomVictim>(0) {
        Some(mut e) => {
            e.write(*v);
            e.submit(0);
        }
        None => lost(),
    }
    0
}
