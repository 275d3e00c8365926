//! Kernel side of resource-tracker: follows fork/exec/exit for the tasks that descend
//! from a registered root, and retires each thread with its final CPU and I/O once
//! it is dead and off the CPU (swept by the probe, run on demand), whenever (or
//! whether) it is reaped and freed. The same probe reads live members' figures for
//! user space. Nothing runs on the host's context switches.
//!
//! Plain raw tracepoints: the programs only read their `u64` arguments and go
//! through `bpf_probe_read_kernel`, so loading needs no kernel BTF. The one
//! exception, the attach's task walk (`attach.rs`), is loaded only by `--pid`.
//!
//! Field offsets are not compiled in: user space reads them from the running kernel's
//! BTF and stores them in `OFFSETS` (a read-only global) before loading.
#![no_std]
#![no_main]

/// `zeroed_slot!(name: T)`: `name`, a `&mut T` to a slot of the calling function's
/// stack whose every byte is zero (see `clear`). A macro, so that the slot is the
/// caller's; `T` must be plain integers and arrays of them.
macro_rules! zeroed_slot {
    ($name:ident: $t:ty) => {
        let mut slot = core::mem::MaybeUninit::<$t>::uninit();
        // SAFETY: `clear` writes every byte of the slot, and the types this is used
        // for are plain integers and arrays of them, for which all zeros is a value.
        let $name = unsafe {
            $crate::clear(slot.as_mut_ptr());
            slot.assume_init_mut()
        };
    };
}

mod attach;
mod node;

use core::mem::{size_of, MaybeUninit};

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_get_current_task, bpf_ktime_get_ns, generated},
    macros::{map, raw_tracepoint},
    maps::{HashMap, PerCpuArray, RingBuf},
    programs::RawTracePointContext,
};
use tracker_common::{
    EngineMode, Event, Figures, LiveReading, Offsets, TaskInfo, TreeStats, ADOPT_CHILDREN,
    ADOPT_DEPTH, DEFAULT_MAX_TASKS, EVENTS_BYTES, EVENT_EXEC, EVENT_EXIT, EVENT_FLAG_ADOPTED,
    EVENT_FLAG_AT_EXIT, EVENT_FLAG_GROUP_DEAD, EVENT_FLAG_SHARED_TID, EVENT_FLAG_THREAD,
    EVENT_FORK, EVENT_READING, GRAVEYARD_KEY, MAX_TREES, NO_FIELD, PROBE_BATCH,
    READING_FLAG_EXITED, READING_FLAG_MEMCG_ID, READING_FLAG_MEMCG_KNOWN, READING_FLAG_ZOMBIE,
    TASK_DEAD, TASK_FLAG_EXITED, TASK_FLAG_GROUP_DEAD, TASK_FLAG_PROC_ENDED, TASK_FLAG_RETIRED,
    TASK_FLAG_ROOT,
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
    task_on_cpu: NO_FIELD,
    task_group_leader: 0,
    task_io_read_bytes: NO_FIELD,
    task_io_write_bytes: NO_FIELD,
    task_io_rchar: NO_FIELD,
    task_io_wchar: NO_FIELD,
    signal_maxrss: 0,
    exit_has_group_dead: 0,
    signal_live: 0,
    task_exit_state: 0,
    task_mm: 0,
    task_io_block: NO_FIELD,
    mm_rss_stat: NO_FIELD,
    rss_stride: 0,
    rss_count: 0,
    task_start_boottime: NO_FIELD,
    tick_ns: 0,
    task_cgroups: 0,
    css_set_subsys: 0,
    css_cgroup: 0,
    cgroup_kn: 0,
    kernfs_node_id: 0,
    memory_cgrp_id: NO_FIELD,
    task_children: NO_FIELD,
    task_sibling: NO_FIELD,
    task_min_flt: NO_FIELD,
};

/// How the programs run (see `EngineMode`), written by user space before loading.
#[no_mangle]
static MODE: EngineMode = EngineMode {
    adopt: 0,
    drop_forks_every: 0,
    drop_exits_every: 0,
    drop_execs_every: 0,
};

const BPF_RB_NO_WAKEUP: u64 = 1;
const BPF_RB_FORCE_WAKEUP: u64 = 2;
const BPF_RB_AVAIL_DATA: u64 = 0;
const WAKEUP_BYTES: u64 = EVENTS_BYTES as u64 / 4;

/// Set for good once an old leader waits in the graveyard (see `GRAVEYARD_KEY`):
/// until a non-leader thread of a member execs, the free program, which runs for
/// every task the host frees, looks up one key and not two.
static mut GRAVEYARD_USED: u32 = 0;

#[inline(always)]
fn graveyard_used() -> bool {
    // SAFETY: a plain load of the program's own global; a stale 0 is the race the
    // graveyard already has with a free that comes before the exec's insertion.
    unsafe { core::ptr::read_volatile(core::ptr::addr_of!(GRAVEYARD_USED)) != 0 }
}

/// tid → tree membership. Sized by user space (`set_max_entries`).
#[map]
pub(crate) static TASKS: HashMap<u32, TaskInfo> = HashMap::with_max_entries(DEFAULT_MAX_TASKS, 0);

/// Per-tree totals of exited members, one copy per CPU.
#[map]
static TREE_STATS: PerCpuArray<TreeStats> = PerCpuArray::with_max_entries(MAX_TREES, 0);

/// Ordered fork/exec/exit records for user space.
#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(EVENTS_BYTES, 0);

#[inline(always)]
fn mode() -> &'static EngineMode {
    // SAFETY: as `off()`: the value user space wrote into .rodata, read volatile.
    unsafe { &*core::ptr::read_volatile(&&MODE) }
}

/// Whether a test asked the programs to ignore the event of `tid` (`every` 0: never).
#[inline(always)]
fn dropped(tid: u32, every: u32) -> bool {
    every != 0 && tid % every == 0
}

#[inline(always)]
fn off() -> &'static Offsets {
    // Read through a volatile pointer: the verifier-visible value is the one user space
    // wrote into .rodata, not the zero the compiler saw.
    // SAFETY: OFFSETS is a static; the pointer read is to a valid, aligned reference.
    unsafe { &*core::ptr::read_volatile(&&OFFSETS) }
}

/// Reads a field of a kernel object. A missing field (`NO_FIELD`) or a failed read
/// yields zeros, the default of every `T` the programs read.
///
/// The helper's result is not looked at: it zeroes the destination when the read
/// fails (every kernel since 5.5, where it came), which is the default. A branch on
/// it, as `aya_ebpf::helpers::bpf_probe_read_kernel` makes, is two paths the
/// verifier walks for every read: with them, the probe's and the fork program's
/// took 4.2 and 2.4 ms at every start on a 2-vCPU host, against 1.7 and 1.2.
///
/// # Safety
/// `base` must be a kernel pointer handed to the program (or read from such a
/// pointer); `bpf_probe_read_kernel` tolerates a bad one, so the worst case is a 0.
/// All zeros must be `T::default()` (integers and arrays of them).
#[inline(always)]
unsafe fn field<T: Copy + Default>(base: *const u8, offset: u32) -> T {
    if offset == NO_FIELD {
        return T::default();
    }
    let mut v = MaybeUninit::<T>::uninit();
    // SAFETY: the helper writes all `size_of::<T>()` bytes of `v`: the kernel's, or
    // zeros when the read fails.
    unsafe {
        generated::bpf_probe_read_kernel(
            v.as_mut_ptr().cast(),
            size_of::<T>() as u32,
            base.add(offset as usize).cast(),
        );
        v.assume_init()
    }
}

/// A task's tid and tgid, in one read: the two are adjacent in every task_struct
/// (user space checks). The fork and free programs run for every task the host
/// makes and frees, and each helper call is a call and a return through the
/// kernel's mitigations.
///
/// # Safety
/// As `field`.
#[inline(always)]
pub(crate) unsafe fn ids(task: *const u8) -> (u32, u32) {
    let both: [u32; 2] = field(task, off().task_pid);
    (both[0], both[1])
}

/// Writes zeros over `*dst`, 8 bytes a store. A struct literal that leaves most
/// fields at their default becomes an LLVM `memset`, which the BPF backend here
/// emits as a call to a byte loop: for the fork's task entry and record, ~800
/// instructions run per fork and one verifier state per byte at every start.
/// Volatile stores are never merged into a `memset`; made where the value stays
/// (the ring, or the stack slot a map update reads), no copy of them is either.
///
/// # Safety
/// `dst` must be valid for writes of a `T`, aligned, and `T` plain integers and
/// arrays of them, for which all zeros is a value.
#[inline(always)]
pub(crate) unsafe fn clear<T>(dst: *mut T) {
    const { assert!(core::mem::size_of::<T>() % 8 == 0 && core::mem::align_of::<T>() >= 8) };
    let words = dst as *mut u64;
    let mut i = 0;
    while i < core::mem::size_of::<T>() / 8 {
        // SAFETY: within `*dst` (its size is a multiple of 8), aligned for u64.
        words.add(i).write_volatile(0);
        i += 1;
    }
}

/// At `sched_process_exit(p[, group_dead])`: whether `task` is its process's last
/// thread, and its `signal` (still allocated while the task exits).
///
/// # Safety
/// `task` must be the tracepoint's task argument (the current, exiting task).
#[inline(always)]
unsafe fn exit_group_dead(ctx: &RawTracePointContext, task: *const u8) -> (bool, *const u8) {
    let o = off();
    let signal: *const u8 = field::<u64>(task, o.task_signal) as *const u8;
    let dead = if o.exit_has_group_dead != 0 {
        ctx.arg::<u64>(1) & 0xff != 0
    } else {
        // Older kernels: `signal->live` was already decremented by this thread.
        field::<i32>(signal, o.signal_live) == 0
    };
    (dead, signal)
}

#[inline(always)]
fn stats(tree: u32) -> Option<&'static mut TreeStats> {
    let p = TREE_STATS.get_ptr_mut(tree)?;
    // SAFETY: a per-CPU array slot, valid for the program's run on this CPU.
    Some(unsafe { &mut *p })
}

/// The fields of an entry the programs act on, copied out of the map value: the
/// whole value is 120 bytes, and each copy is instructions the verifier walks once
/// per key of the probe's batch (5.10's gives up at a million).
#[derive(Clone, Copy)]
struct Held {
    tgid: u32,
    tree: u32,
    flags: u32,
    task: u64,
    exit_ns: u64,
}

#[inline(always)]
fn held(key: u32) -> Option<Held> {
    // SAFETY: the fields are copied out at once.
    unsafe { TASKS.get(key) }.map(|v| Held {
        tgid: v.tgid,
        tree: v.tree,
        flags: v.flags,
        task: v.task,
        exit_ns: v.exit_ns,
    })
}

/// The running task's address.
#[inline(always)]
fn current_task() -> *const u8 {
    // SAFETY: a helper without arguments.
    unsafe { bpf_get_current_task() as *const u8 }
}

/// Whether the entry `info` is `task`'s. A tid alone does not say: it is freed when
/// the member is reaped, while its entry waits seconds for the sweep or the free,
/// and another task (of the host or of the tree) may get it meanwhile. The entry's
/// task address does; an entry registered from user space has none yet and is
/// checked by its start time, then takes the address (`claim`).
///
/// # Safety
/// `task` must be a task the kernel handed to the program (or the current task).
#[inline(always)]
pub(crate) unsafe fn is_member(info: &TaskInfo, task: *const u8) -> bool {
    if info.task != 0 {
        return info.task == task as u64;
    }
    let o = off();
    if info.start_ticks == 0 || o.task_start_boottime == NO_FIELD || o.tick_ns == 0 {
        return true;
    }
    let start: u64 = field(task, o.task_start_boottime);
    (start / u64::from(o.tick_ns)) as u32 == info.start_ticks
}

/// What a FORK or EXEC record says besides the command, the tree and the time.
struct Ids {
    kind: u32,
    pid: u32,
    tid: u32,
    ppid: u32,
    flags: u32,
}

/// Sends a FORK or EXEC record, built where the ring holds it: the rest of the
/// record is zeros written in place, so that neither a copy of it nor a `memset`
/// sits on the program's stack (see `clear`). A full ring costs only the record:
/// the totals in `TREE_STATS` are kept apart from it.
///
/// # Safety
/// `task` must be the kernel task the record is about.
#[inline(always)]
unsafe fn emit(tree: u32, task: *const u8, ids: Ids) {
    let Some(mut entry) = EVENTS.reserve::<Event>(0) else {
        lost_record(tree);
        return;
    };
    let ev = entry.as_mut_ptr();
    clear(ev);
    (*ev).kind = ids.kind;
    (*ev).tree = tree;
    (*ev).pid = ids.pid;
    (*ev).tid = ids.tid;
    (*ev).ppid = ids.ppid;
    (*ev).flags = ids.flags;
    (*ev).ts_ns = bpf_ktime_get_ns();
    (*ev).comm = field(task, off().task_comm);
    entry.submit(wake_flags(false));
}

/// Sends a record whose every field is filled, reading nothing through a task.
#[inline(always)]
fn send(tree: u32, ev: Event, wake: bool) {
    match EVENTS.reserve::<Event>(0) {
        Some(mut entry) => {
            let mut ev = ev;
            ev.tree = tree;
            if ev.ts_ns == 0 {
                // SAFETY: a helper without arguments.
                ev.ts_ns = unsafe { bpf_ktime_get_ns() };
            }
            entry.write(ev);
            entry.submit(wake_flags(wake));
        }
        None => lost_record(tree),
    }
}

/// Wake user space only once a quarter of the ring is filled (it also drains at
/// every sample), or for a record it waits for. A wake-up per event costs the
/// host far more than the programs themselves.
#[inline(always)]
fn wake_flags(wake: bool) -> u64 {
    if wake || EVENTS.query(BPF_RB_AVAIL_DATA) >= WAKEUP_BYTES {
        BPF_RB_FORCE_WAKEUP
    } else {
        BPF_RB_NO_WAKEUP
    }
}

#[inline(always)]
fn lost_record(tree: u32) {
    if let Some(s) = stats(tree) {
        s.lost_events += 1;
    }
}

/// sched_process_fork(parent, child): the child joins the forker's tree, whatever
/// happens to its parent later (orphans stay in the tree).
#[raw_tracepoint(tracepoint = "sched_process_fork")]
pub fn sched_process_fork(ctx: RawTracePointContext) -> u32 {
    on_fork(&ctx)
}

/// A second copy of each life-cycle program, attached after the first where the
/// kernel runs tracepoints preemptible (6.19 on): a task preempted inside a
/// program makes the kernel skip that program for every other task on the CPU
/// until it resumes (`recursion_misses`), and the copy, a program of its own, is
/// then run instead. Both run for every event; each does what the event asks only
/// if the state shows no copy did it yet, so an event is seen once whether one
/// copy, the other or both ran. The two copies run one after the other in the
/// task that raised the event, never at once for the same event.
#[raw_tracepoint(tracepoint = "sched_process_fork")]
pub fn again_fork(ctx: RawTracePointContext) -> u32 {
    on_fork(&ctx)
}

#[inline(always)]
fn on_fork(ctx: &RawTracePointContext) -> u32 {
    let cur = bpf_get_current_pid_tgid() as u32;
    let Some(p) = TASKS.get_ptr_mut(cur) else {
        return 0;
    };
    // SAFETY: a hash map value, read and written at once; a concurrent removal
    // (the member's own retirement) cannot happen while the member forks.
    let parent = unsafe { &mut *p };
    let me = current_task();
    // SAFETY: `me` is the current task.
    if !unsafe { is_member(parent, me) } {
        return 0;
    }
    parent.task = me as u64;
    let tree = parent.tree;
    let parent_tgid = parent.tgid;
    let parent_flags = parent.flags;
    let child: *const u8 = ctx.arg(1);
    // SAFETY: `child` is the tracepoint's task argument.
    let (tid, tgid) = unsafe { ids(child) };
    if dropped(tid, mode().drop_forks_every) {
        return 0;
    }
    let ids = (u64::from(tid) << 32) | u64::from(tgid);
    let tree_parent = (u64::from(tree) << 32) | u64::from(parent_tgid);
    let parent_flags = u64::from(parent_flags);
    // Almost always the tid keys no entry: one insertion that fails if it does.
    if add_child(child as u64, ids, tree_parent, parent_flags, BPF_NOEXIST) != ADD_EXISTS {
        return 0;
    }
    // The child's tid may still key a dead member's entry (freed at its reap, the
    // entry waiting for its sweep or free): that member retires now, with figures
    // final since its exit, before the tid becomes the child's. An entry already
    // this child's and not exited means the other copy saw this fork (a dead
    // member's entry is marked exited, and would need this child's tid and
    // address both).
    if let Some(old) = held(tid) {
        if old.task == child as u64 && old.flags & TASK_FLAG_EXITED == 0 {
            return 0;
        }
        retire_displaced_key(tid);
    }
    add_child(child as u64, ids, tree_parent, parent_flags, BPF_ANY);
    0
}

/// `add_child`'s answers: the child joined; `BPF_NOEXIST` found the tid taken; the
/// map had no room (counted).
const ADDED: u32 = 0;
const ADD_EXISTS: u32 = 1;
const ADD_FAILED: u32 = 2;
/// In `add_child`'s `parent_flags`, above the task flags: the child was found after
/// its fork (`adopt`).
const ADOPTED_BIT: u64 = 1 << 32;
const BPF_ANY: u64 = 0;
const BPF_NOEXIST: u64 = 1;
const EEXIST: i32 = 17;

/// The forked `child` becomes a member of the tree: its entry, the count and the
/// FORK record. `ids`: tid << 32 | tgid; `tree_parent`: tree << 32 | the parent's
/// tgid; `parent_flags`: the parent's task flags, with `ADOPTED_BIT` for a child
/// found after its fork; `how`: the map update's flag. Nothing is counted or sent
/// when the insertion fails for `BPF_NOEXIST` (`ADD_EXISTS`). A global function, like
/// `retire_displaced_key`: each is checked once on its own, and neither's stack adds to the other's (the kernel allows 512 bytes
/// along a chain of calls; the fork program with both inlined needed 576).
/// Exported by the link (build.rs).
#[no_mangle]
#[inline(never)]
pub extern "C" fn add_child(
    child: u64,
    ids: u64,
    tree_parent: u64,
    parent_flags: u64,
    how: u64,
) -> u32 {
    let (tid, tgid) = ((ids >> 32) as u32, ids as u32);
    let (tree, parent_tgid) = ((tree_parent >> 32) as u32, tree_parent as u32);
    let adopted = parent_flags & ADOPTED_BIT != 0;
    let parent_flags = parent_flags as u32;
    // A thread of the root is part of the root: any of them may be its last.
    let flags = if tid != tgid {
        parent_flags & TASK_FLAG_ROOT
    } else {
        0
    };
    zeroed_slot!(info: TaskInfo);
    info.tgid = tgid;
    info.tree = tree;
    info.flags = flags;
    info.task = child;
    if adopting() && !adopted {
        // The mm it starts with: its exit tells by it an exec no program saw. (A
        // child found later has no mm of its fork to keep: at its exec the mm is
        // already the new one, which would pass for that exec handled.)
        // SAFETY: `child` is a task the kernel handed a program (see below).
        info.exec_mm = unsafe { field(child as *const u8, off().task_mm) };
    }
    let Some(s) = stats(tree) else {
        return ADD_FAILED;
    };
    if let Err(e) = TASKS.insert(tid, &*info, how) {
        if e == -EEXIST && how == BPF_NOEXIST {
            return ADD_EXISTS;
        }
        s.untracked_tasks += 1;
        return ADD_FAILED;
    }
    // Every new member is a record: user space reads the members it was told of,
    // never walking the task map (whose buckets it would scan each sample).
    let mut flags = if tid == tgid {
        s.procs_spawned += 1;
        0
    } else {
        s.threads_spawned += 1;
        EVENT_FLAG_THREAD
    };
    if adopted {
        s.adopted += 1;
        flags |= EVENT_FLAG_ADOPTED;
    }
    let ids = Ids {
        kind: EVENT_FORK,
        pid: tgid,
        tid,
        ppid: parent_tgid,
        flags,
    };
    // SAFETY: `child` is the address of a task the kernel handed a program (the
    // fork's child, or one found through such a task's links, inside the program's
    // RCU read section).
    unsafe { emit(tree, child as *const u8, ids) };
    ADDED
}

/// A task the kernel skipped every copy of the fork program for (6.19 on, each copy
/// held on the CPU by a task preempted inside it) has no entry, but it still meets
/// the later programs, and its ancestry says whose it is: a thread belongs to its
/// process, a process to the nearest member among its parent, grandparent and
/// great-grandparent. It joins that tree now, counted and recorded as forked
/// (`EVENT_FLAG_ADOPTED`); whether it did (`ADDED`). An orphan whose parent left
/// before it met a program is found by that parent's exit instead
/// (`adopt_children`). The tasks on the way are read inside the program's RCU
/// read section, which keeps them allocated, and an ancestor counts only when its
/// entry is its own (`is_member`). A global function, verified once on its own
/// (exported by the link, build.rs).
#[no_mangle]
#[inline(never)]
pub extern "C" fn adopt(task: u64) -> u32 {
    let t = task as *const u8;
    let o = off();
    // SAFETY: `task` is a task the kernel handed the calling program; every read
    // goes through the fault-tolerant helper.
    let (tid, tgid) = unsafe { ids(t) };
    if tid == 0 {
        return ADD_FAILED;
    }
    // SAFETY: as above.
    let mut up: u64 = unsafe {
        if tid != tgid {
            field(t, o.task_group_leader)
        } else {
            field(t, o.task_real_parent)
        }
    };
    let mut i = 0;
    while i < ADOPT_DEPTH {
        // SAFETY: as above.
        let (utid, utgid) = unsafe { ids(up as *const u8) };
        // The idle task and init are never members (the root is the tracker's child).
        if utid <= 1 {
            return ADD_FAILED;
        }
        if let Some(m) = TASKS.get_ptr(utid) {
            // SAFETY: a hash map value, read at once (not copied: the chain of calls
            // from the exit program through `add_child` has 512 bytes of stack);
            // `up` was read from a task's links, as above.
            let (member, tree, flags) = unsafe {
                let m = &*m;
                (
                    m.flags & TASK_FLAG_RETIRED == 0 && is_member(m, up as *const u8),
                    m.tree,
                    m.flags,
                )
            };
            if member {
                let ids = (u64::from(tid) << 32) | u64::from(tgid);
                let tree_parent = (u64::from(tree) << 32) | u64::from(utgid);
                return add_child(
                    task,
                    ids,
                    tree_parent,
                    u64::from(flags) | ADOPTED_BIT,
                    BPF_NOEXIST,
                );
            }
        }
        // SAFETY: as above.
        up = unsafe { field(up as *const u8, o.task_real_parent) };
        i += 1;
    }
    ADD_FAILED
}

/// At a member's exit: any of its children the tree does not know (their fork
/// skipped by the kernel) joins it now, before the exit hands them to a reaper
/// outside the tree. The list is walked inside the program's RCU read section,
/// which keeps a child released meanwhile allocated; a bounded walk, the rest
/// counted (`children_unchecked`). `tree_parent`: tree << 32 | the member's tgid.
/// A global function (exported by the link, build.rs).
#[no_mangle]
#[inline(never)]
pub extern "C" fn adopt_children(parent: u64, tree_parent: u64, parent_flags: u64) -> u32 {
    let o = off();
    if o.task_children == NO_FIELD || o.task_sibling == NO_FIELD {
        return 0;
    }
    let head = parent.wrapping_add(u64::from(o.task_children));
    // SAFETY: reads through the fault-tolerant helper of a task the kernel handed
    // the calling program, and of its children list.
    let mut node: u64 = unsafe { field(head as *const u8, 0) };
    let mut i = 0;
    while i < ADOPT_CHILDREN {
        if node == head || node == 0 {
            return 0;
        }
        let child = node.wrapping_sub(u64::from(o.task_sibling));
        // SAFETY: as above.
        let (tid, tgid) = unsafe { ids(child as *const u8) };
        // A child that has exited is a zombie here until its reap: a member's may
        // have retired already (its entry gone), and one no program saw would have
        // been found at its own exit.
        // SAFETY: as above.
        let alive = unsafe { field::<u32>(child as *const u8, o.task_exit_state) } == 0;
        if tid != 0 && alive && held(tid).is_none() {
            let ids = (u64::from(tid) << 32) | u64::from(tgid);
            add_child(
                child,
                ids,
                tree_parent,
                parent_flags | ADOPTED_BIT,
                BPF_NOEXIST,
            );
        }
        // SAFETY: as above.
        node = unsafe { field(node as *const u8, 0) };
        i += 1;
    }
    if node != head && node != 0 {
        if let Some(s) = stats((tree_parent >> 32) as u32) {
            s.children_unchecked += 1;
        }
    }
    0
}

/// Whether tasks no program saw forked are looked for (`EngineMode::adopt`).
#[inline(always)]
fn adopting() -> bool {
    mode().adopt != 0
}

/// sched_process_exec(p, old_pid, bprm).
#[raw_tracepoint(tracepoint = "sched_process_exec")]
pub fn sched_process_exec(ctx: RawTracePointContext) -> u32 {
    on_exec(&ctx)
}

/// See `again_fork`.
#[raw_tracepoint(tracepoint = "sched_process_exec")]
pub fn again_exec(ctx: RawTracePointContext) -> u32 {
    on_exec(&ctx)
}

#[inline(always)]
fn on_exec(ctx: &RawTracePointContext) -> u32 {
    let cur = bpf_get_current_pid_tgid() as u32;
    let old: u32 = ctx.arg::<u64>(1) as u32;
    // A non-leader thread that execs takes over the leader's pid: move its entry.
    let key = if old != cur && old != 0 { old } else { cur };
    let task: *const u8 = ctx.arg(0);
    let p = match TASKS.get_ptr_mut(key) {
        Some(p) => p,
        // A task whose fork no program saw: a member if its ancestry says so.
        None if key == cur && adopting() && adopt(task as u64) == ADDED => {
            match TASKS.get_ptr_mut(key) {
                Some(p) => p,
                None => return 0,
            }
        }
        None => return 0,
    };
    // SAFETY: a hash map value, valid while this program runs (a live member's
    // entry is removed only by its own later exit and retirement).
    let entry = unsafe { &mut *p };
    if entry.flags & TASK_FLAG_ROOT == 0 && dropped(key, mode().drop_execs_every) {
        return 0;
    }
    // SAFETY: `task` is the tracepoint's task argument.
    if !unsafe { is_member(entry, task) } {
        return 0;
    }
    // Every exec gives the task a new mm, allocated while the old one still lives:
    // an entry that already holds this mm was updated by the other copy for this
    // exec. (A non-leader's entry was moved away from `old`: nothing is found.)
    // SAFETY: `task` is the tracepoint's task argument.
    let mm: u64 = unsafe { field(task, off().task_mm) };
    if mm != 0 && entry.exec_mm == mm {
        return 0;
    }
    let (tree, tgid) = (entry.tree, entry.tgid);
    if key == cur {
        // In place: a replacing update would cost a second hash operation per exec
        // and hand the entry's element to whichever key comes next.
        entry.exec_mm = mm;
        // A root registered from user space learns its identity here.
        entry.task = task as u64;
    } else {
        move_exec_entry(key, cur, task as u64, mm);
    }
    let o = off();
    // SAFETY: `task` is the tracepoint's task argument; its parent pointer is read
    // through the fault-tolerant helper.
    let ppid = unsafe {
        let parent: *const u8 = field::<u64>(task, o.task_real_parent) as *const u8;
        field::<u32>(parent, o.task_tgid)
    };
    if let Some(s) = stats(tree) {
        s.execs += 1;
    }
    let ids = Ids {
        kind: EVENT_EXEC,
        pid: tgid,
        // The exec'ing thread's tid before the exec (the tgid from now on).
        tid: key,
        ppid,
        flags: 0,
    };
    // SAFETY: `task` is the tracepoint's task argument.
    unsafe { emit(tree, task, ids) };
    0
}

/// A non-leader thread exec'd and took its leader's tid: its entry moves from its
/// old tid `from` to the leader's `to`, and the old leader (dead) waits under a
/// key of its own until it retires. A global function, verified once on its own
/// (exported by the link, build.rs): the two entries it copies (240 bytes) stay
/// off the exec program's stack, which the verifier copies with every state it
/// keeps.
#[no_mangle]
#[inline(never)]
pub extern "C" fn move_exec_entry(from: u32, to: u32, task: u64, mm: u64) -> u32 {
    // SAFETY: the value is copied out at once.
    let Some(mut info) = (unsafe { TASKS.get(from) }).copied() else {
        return 0;
    };
    info.exec_mm = mm;
    info.task = task;
    // SAFETY: the value is copied out at once.
    if let Some(old) = unsafe { TASKS.get(to) }.copied() {
        if old.task != task {
            // SAFETY: a plain store to the program's own global.
            unsafe { core::ptr::write_volatile(core::ptr::addr_of_mut!(GRAVEYARD_USED), 1) };
            let _ = TASKS.insert(GRAVEYARD_KEY | to, old, 0);
        }
    }
    let _ = TASKS.remove(from);
    let _ = TASKS.insert(to, info, 0);
    0
}

/// sched_process_exit(p[, group_dead]): marks the thread as on its way out, counts
/// the process once when its last thread leaves, and notes its peak RSS while
/// `signal` is certainly valid.
#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn sched_process_exit(ctx: RawTracePointContext) -> u32 {
    on_exit(&ctx)
}

/// See `again_fork`.
#[raw_tracepoint(tracepoint = "sched_process_exit")]
pub fn again_exit(ctx: RawTracePointContext) -> u32 {
    on_exit(&ctx)
}

#[inline(always)]
fn on_exit(ctx: &RawTracePointContext) -> u32 {
    let cur = bpf_get_current_pid_tgid() as u32;
    if dropped(cur, mode().drop_exits_every) {
        return 0;
    }
    let task: *const u8 = ctx.arg(0);
    let p = match TASKS.get_ptr_mut(cur) {
        Some(p) => p,
        // A task whose fork no program saw: a member if its ancestry says so.
        None if adopting() && adopt(task as u64) == ADDED => match TASKS.get_ptr_mut(cur) {
            Some(p) => p,
            None => return 0,
        },
        None => return 0,
    };
    // SAFETY: a hash map value, valid until removed, which happens only after this
    // exit: the sweep takes exited entries only, and the free comes later still.
    let info = unsafe { &mut *p };
    // Another task with a dead member's tid (which waits to retire) is not the member.
    // SAFETY: `task` is the tracepoint's task argument.
    if !unsafe { is_member(info, task) } {
        return 0;
    }
    // A task exits once: marked, the other copy saw this exit.
    if info.flags & TASK_FLAG_EXITED != 0 {
        return 0;
    }
    info.flags |= TASK_FLAG_EXITED;
    // SAFETY: a helper without arguments.
    info.exit_ns = unsafe { bpf_ktime_get_ns() };
    // From here on the sweep reads this task's final figures through its address.
    info.task = task as u64;
    let o = off();
    // What the member retires with should its task be freed unread (see
    // `TaskInfo::at_exit`). SAFETY: `task` is the tracepoint's task argument (current).
    unsafe {
        info.at_exit = thread_figures(task);
        info.comm = field(task, o.task_comm);
    }
    let (tree, tgid, flags) = (info.tree, info.tgid, info.flags);
    if adopting() {
        let tree_parent = (u64::from(tree) << 32) | u64::from(tgid);
        adopt_children(task as u64, tree_parent, u64::from(flags));
        // Every exec gives the task a new mm, and from 6.16 its exit comes before
        // the mm is let go: another mm than the one its fork or last exec seen left
        // in the entry is an exec every copy missed (counted once, however many).
        // SAFETY: as above.
        let mm: u64 = unsafe { field(task, o.task_mm) };
        if mm != 0 && info.exec_mm != 0 && mm != info.exec_mm {
            info.exec_mm = mm;
            if let Some(s) = stats(tree) {
                s.execs += 1;
                s.execs_unseen += 1;
            }
        }
    }
    // SAFETY: as above.
    let (group_dead, signal) = unsafe { exit_group_dead(ctx, task) };
    if !group_dead {
        return 0;
    }
    if adopting() && cur != tgid {
        // The process ended at another thread than its leader: the leader's free
        // must not count that end again should its own exit have gone unseen.
        // SAFETY: as above; the leader lives while a thread of its process does.
        let leader: u64 = unsafe { field(task, o.task_group_leader) };
        if let Some(l) = TASKS.get_ptr_mut(tgid) {
            // SAFETY: a hash map value, written at once.
            let l = unsafe { &mut *l };
            if l.task == leader {
                l.flags |= TASK_FLAG_PROC_ENDED;
            }
        }
    }
    info.flags |= TASK_FLAG_GROUP_DEAD;
    // SAFETY: as above; the leader lives while a thread of its process does.
    (info.exit_code, info.ppid) = unsafe { process_end(task, cur == info.tgid) };
    // SAFETY: as above.
    let maxrss: u64 = unsafe { field(signal, o.signal_maxrss) };
    if let Some(s) = stats(info.tree) {
        s.procs_exited += 1;
        if maxrss > s.max_rss_pages {
            s.max_rss_pages = maxrss;
        }
    }
    0
}

/// sched_process_free(p): the RCU callback that frees a task, seconds after its exit
/// with a lazy RCU. A member the sweep has not retired yet retires here, and its
/// entry goes before the kernel frees the task. The kernel does not always run
/// this program (see `TaskInfo::at_exit`): reads through a kept address are
/// therefore also checked against the member's pid and tgid (`still_member`).
#[raw_tracepoint(tracepoint = "sched_process_free")]
pub fn sched_process_free(ctx: RawTracePointContext) -> u32 {
    on_free(&ctx)
}

/// See `again_fork`: a member the first copy retired has no entry left.
#[raw_tracepoint(tracepoint = "sched_process_free")]
pub fn again_free(ctx: RawTracePointContext) -> u32 {
    on_free(&ctx)
}

#[inline(always)]
fn on_free(ctx: &RawTracePointContext) -> u32 {
    let task: *const u8 = ctx.arg(0);
    // SAFETY: `task` is the tracepoint's task argument, valid for its whole run.
    let (tid, tgid) = unsafe { ids(task) };
    let mine = |key: u32| held(key).filter(|info| info.task == task as u64);
    let (key, info) = match mine(tid) {
        Some(info) => (tid, info),
        None if graveyard_used() => match mine(GRAVEYARD_KEY | tgid) {
            Some(info) => (GRAVEYARD_KEY | tgid, info),
            None => return 0,
        },
        None => return 0,
    };
    if info.flags & TASK_FLAG_RETIRED != 0 {
        let _ = TASKS.remove(key);
        return 0;
    }
    let mut info = info;
    // SAFETY: as above.
    if info.flags & TASK_FLAG_EXITED == 0 && unsafe { process_ended_unseen(task, key, &info) } {
        info.flags |= TASK_FLAG_GROUP_DEAD;
    }
    // SAFETY: as above.
    let ev = unsafe { final_figures(task, key, &info) };
    commit(key, info, ev);
    0
}

/// Reads, on user space's demand, the members named in the arguments (keys, two per
/// argument, 0 for none). One that is dead and off the CPU retires (its figures are
/// final from its last context switch on, whenever it is reaped or freed); any other
/// whose task the kernel has seen sends a READING record with its figures now, which
/// replaces ~3 /proc reads per thread. Never attached; run with
/// `BPF_PROG_TEST_RUN`, so it costs nothing on the host's hot paths.
///
/// It returns nothing: user space learns what became of each member from the ring
/// (READING, EXIT). A result that differed by path kept the verifier from merging
/// its states: 50 ms at every start against 14 ms without.
#[raw_tracepoint(tracepoint = "probe")]
pub fn probe(ctx: RawTracePointContext) -> u32 {
    // The verifier allows context reads at constant offsets only.
    let args: [u64; PROBE_BATCH / 2] = [
        ctx.arg(0),
        ctx.arg(1),
        ctx.arg(2),
        ctx.arg(3),
        ctx.arg(4),
        ctx.arg(5),
        ctx.arg(6),
        ctx.arg(7),
    ];
    // The tree's memory cgroup as user space last learned it (0: not yet).
    let memcg_css: u64 = ctx.arg(8);
    for i in 0..PROBE_BATCH {
        let pair = args[i / 2];
        let key = if i % 2 == 0 {
            pair as u32
        } else {
            (pair >> 32) as u32
        };
        if key == 0 {
            continue;
        }
        probe_member(key, memcg_css);
    }
    0
}

/// One member of the probe's batch, as a global function: the verifier checks it
/// once, for any key, where inlined it walked it again for each of the batch's
/// keys (38 ms of every start on a 2-vCPU host, against 3 ms; docs/engine.md,
/// "Start-up"). Exported by the link (build.rs), so that its BTF linkage is global.
#[no_mangle]
#[inline(never)]
pub extern "C" fn probe_member(key: u32, memcg_css: u64) -> u32 {
    probe_one(key, memcg_css);
    0
}

#[inline(always)]
fn probe_one(key: u32, memcg_css: u64) {
    let Some(info) = held(key) else {
        return;
    };
    if info.flags & TASK_FLAG_RETIRED != 0 {
        let _ = TASKS.remove(key);
        return;
    }
    // A registered root before its exec: user space reads it from /proc.
    if info.task == 0 {
        return;
    }
    let exited = info.flags & TASK_FLAG_EXITED != 0;
    // Where exits can go unseen (`adopting`), a member not marked exited may be dead.
    if (exited || adopting()) && sweep_one(key) {
        return;
    }
    // A displaced old leader is dead: nothing to read until it retires.
    if key & GRAVEYARD_KEY != 0 {
        return;
    }
    // Reserved before the reads: if the entry is still there after them, a retirement
    // (which removes the entry first) sends its EXIT record after this reading, so
    // user space never takes a reading after the final figures.
    // A full ring: user space reads this member from /proc.
    let Some(mut entry) = EVENTS.reserve::<LiveReading>(0) else {
        return;
    };
    let task = info.task as *const u8;
    let o = off();
    // SAFETY: reads through the fault-tolerant helper; they are kept only if the task
    // still is the member afterwards and the entry still there (the free, when it
    // runs, removes the entry first).
    let mut r = unsafe { live_reading(task, key) };
    r.pid = info.tgid;
    if exited {
        r.flags |= READING_FLAG_EXITED;
    }
    if key == info.tgid {
        // SAFETY: as above; the mm is read only while `task->mm` points to it, the
        // cgroup objects as `memcg_of` says.
        unsafe {
            let exit_state: u32 = field(task, o.task_exit_state);
            // EXIT_ZOMBIE | EXIT_DEAD, as get_task_state() reports them.
            if exit_state & 0x30 != 0 {
                r.flags |= READING_FLAG_ZOMBIE;
            }
            r.rss_pages = rss_pages(task);
            memcg_of(task, memcg_css, &mut r);
        }
    }
    // SAFETY: as above.
    if !unsafe { still_member(task, key, &info) } {
        entry.discard(BPF_RB_NO_WAKEUP);
        drop_unexited(key, &info);
        return;
    }
    // SAFETY: the value is read at once.
    match unsafe { TASKS.get(key) } {
        Some(now) if now.task == info.task => {
            entry.write(r);
            // User space drains the ring right after the run: no wake-up.
            entry.submit(BPF_RB_NO_WAKEUP);
        }
        _ => entry.discard(BPF_RB_NO_WAKEUP),
    }
}

/// The memory cgroup the leader `task` is charged to: known (the `cgroup_subsys_state`
/// user space named, two reads) or, for any other, its id and css (three more). User
/// space checks by this that the tree is still wholly in the cgroup it reads the
/// memory of, without listing the cgroup's processes at every sample. The objects
/// on the way are freed only after an RCU grace period, which the program's run is
/// inside of, and the reading is kept only if the task is still the member.
///
/// # Safety
/// As `field`.
#[inline(always)]
unsafe fn memcg_of(task: *const u8, known: u64, r: &mut LiveReading) {
    let o = off();
    if o.memory_cgrp_id == NO_FIELD {
        return;
    }
    let cset: u64 = field(task, o.task_cgroups);
    if cset == 0 {
        return;
    }
    let css: u64 = field(
        cset as *const u8,
        o.css_set_subsys
            .wrapping_add(o.memory_cgrp_id.wrapping_mul(8)),
    );
    if css == 0 {
        return;
    }
    if css == known {
        r.flags |= READING_FLAG_MEMCG_KNOWN;
        return;
    }
    let cgrp: u64 = field(css as *const u8, o.css_cgroup);
    let id = cgroup_id(cgrp as *const u8);
    if id == 0 {
        return;
    }
    r.memcg_id = id;
    r.memcg_css = css;
    r.flags |= READING_FLAG_MEMCG_ID;
}

/// A cgroup's id (`cgrp->kn->id`, its directory's inode); 0 where a pointer on the
/// way is bad.
///
/// # Safety
/// As `field`.
#[inline(always)]
pub(crate) unsafe fn cgroup_id(cgrp: *const u8) -> u64 {
    let o = off();
    let kn: *const u8 = field::<u64>(cgrp, o.cgroup_kn) as *const u8;
    field(kn, o.kernfs_node_id)
}

/// A thread's figures now, the same fields its EXIT record will carry.
///
/// # Safety
/// `task` must be a task_struct, or a freed one whose reads are then discarded.
#[inline(always)]
unsafe fn live_reading(task: *const u8, key: u32) -> LiveReading {
    LiveReading {
        kind: EVENT_READING,
        tid: key,
        pid: 0,
        flags: 0,
        rss_pages: 0,
        fig: thread_figures(task),
        memcg_id: 0,
        memcg_css: 0,
        faults: thread_faults(task),
    }
}

/// A thread's minor + major page faults, 0 where their offsets are unknown.
///
/// # Safety
/// As `thread_figures`.
#[inline(always)]
unsafe fn thread_faults(task: *const u8) -> u64 {
    let f: [u64; 2] = field(task, off().task_min_flt);
    f[0].wrapping_add(f[1])
}

/// A thread's CPU, tick times and I/O. Adjacent fields are read together: each
/// `bpf_probe_read_kernel` costs ~0.1 µs here, and 7 single reads per thread were
/// half of the probe's time.
///
/// # Safety
/// `task` must be a task_struct, or a freed one whose reads are then discarded.
#[inline(always)]
unsafe fn thread_figures(task: *const u8) -> Figures {
    let o = off();
    // utime and stime are adjacent u64s in every task_struct (user space checks).
    let times: [u64; 2] = field(task, o.task_utime);
    // rchar, wchar, syscr, syscw, read_bytes, write_bytes; zeros where a kernel lacks
    // one of the two configs.
    let io: [u64; 6] = field(task, o.task_io_block);
    Figures {
        cpu_ns: field(task, o.task_sum_exec_runtime),
        utime_ns: times[0],
        stime_ns: times[1],
        read_bytes: io[4],
        write_bytes: io[5],
        rchar: io[0],
        wchar: io[1],
    }
}

/// Resident pages of the task's mm as /proc/PID/stat counts them: `get_mm_rss()`,
/// the file, anon and shmem counters (`MM_FILEPAGES` 0, `MM_ANONPAGES` 1,
/// `MM_SHMEMPAGES` 3), each read without summing per-CPU deltas and clamped at 0,
/// as `get_mm_counter()` does. 0 without an mm, or when it changed during the reads
/// (exit or exec: the old mm may be freed, and /proc would read the new one).
///
/// # Safety
/// `task` must be a task_struct (reads go through the fault-tolerant helper).
#[inline(always)]
unsafe fn rss_pages(task: *const u8) -> u64 {
    let o = off();
    if o.mm_rss_stat == NO_FIELD {
        return 0;
    }
    let mm: u64 = field(task, o.task_mm);
    if mm == 0 {
        return 0;
    }
    let base = (mm as *const u8).add(o.mm_rss_stat as usize);
    let mut pages = 0u64;
    for member in [0u32, 1, 3] {
        let v: i64 = field(base, member * o.rss_stride + o.rss_count);
        pages += v.max(0) as u64;
    }
    // The mm is freed only after `task->mm` stops pointing to it (exit_mm, exec_mmap).
    if field::<u64>(task, o.task_mm) != mm {
        return 0;
    }
    pages
}

/// Whether the task at a kept address still is the member keyed `key`. The free
/// removes an entry before the kernel frees its task, but the kernel now and then
/// frees a task without running the free program, and the entry then outlives the
/// task: its memory may be another task's by now.
///
/// # Safety
/// `task` is read through the fault-tolerant helper.
#[inline(always)]
unsafe fn still_member(task: *const u8, key: u32, info: &Held) -> bool {
    let (tid, tgid) = ids(task);
    if tgid != info.tgid {
        return false;
    }
    // A displaced old leader is known by its process alone.
    key & GRAVEYARD_KEY != 0 || tid == key
}

/// The entry at `key` when it still is the one read (`info`) and its task fails
/// the identity check again: a member whose task was freed before its final
/// figures were read, its memory maybe another task's. Checked twice because the
/// probe runs preemptible (`BPF_PROG_TEST_RUN`): between its lookup and its reads
/// the entry may have retired and its preallocated element gone to another key (a
/// copy taken then is another member's), or the tid to a new member of the tree.
#[inline(always)]
fn unread_entry(key: u32, info: &Held) -> Option<Held> {
    let now = held(key)?;
    if now.task != info.task || now.tgid != info.tgid || now.task == 0 {
        return None;
    }
    // SAFETY: reads through the fault-tolerant helper.
    if unsafe { still_member(now.task as *const u8, key, &now) } {
        return None;
    }
    Some(now)
}

/// A member freed unread whose exit no program saw (the kernel skipped it too):
/// its entry goes, counted; it keeps its last reading. One whose exit was seen
/// retires through the sweep, with its figures at exit.
#[inline(always)]
fn drop_unexited(key: u32, info: &Held) {
    let Some(now) = unread_entry(key, info) else {
        return;
    };
    if now.flags & TASK_FLAG_EXITED != 0 {
        return;
    }
    if TASKS.remove(key).is_ok() {
        if let Some(s) = stats(now.tree) {
            s.lost_exits += 1;
        }
    }
}

/// Retires `key` if it is dead and off the CPU; whether it did.
#[inline(always)]
fn sweep_one(key: u32) -> bool {
    let Some(info) = held(key) else {
        return false;
    };
    if info.flags & TASK_FLAG_RETIRED != 0 {
        let _ = TASKS.remove(key);
        return true;
    }
    if info.task == 0 {
        return false;
    }
    let task = info.task as *const u8;
    let o = off();
    // An exit no program saw (every copy skipped, `adopting` only): the member is
    // found dead and off the CPU here as an exited one is; one still alive costs
    // this one read.
    let unseen_exit = info.flags & TASK_FLAG_EXITED == 0;
    // SAFETY: a read through the fault-tolerant helper, judged with the others below.
    if unseen_exit && (!adopting() || unsafe { field::<u32>(task, o.task_state) } & TASK_DEAD == 0)
    {
        return false;
    }
    // SAFETY: reads through the fault-tolerant helper. Whether the task was still
    // allocated while they ran is checked below: its entry leaves the map before
    // the kernel frees it, so an entry still there means the reads were valid.
    let (state, on_cpu, ev) = unsafe {
        (
            field::<u32>(task, o.task_state),
            field::<u32>(task, o.task_on_cpu),
            final_figures(task, key, &info),
        )
    };
    // One commit for both ends (the final figures, or those at exit of a task
    // freed unread): each path the verifier walks here is walked once per key of
    // the probe's batch, and 5.10's verifier gives up at a million instructions.
    // SAFETY: as above.
    let (info, ev, unread) = if unsafe { still_member(task, key, &info) } {
        if state & TASK_DEAD == 0 || on_cpu != 0 {
            return false;
        }
        // SAFETY: the value is copied out at once.
        match unsafe { TASKS.get(key) } {
            Some(now) if now.task == info.task => {}
            _ => return false,
        }
        let mut info = info;
        if unseen_exit {
            // SAFETY: as above.
            let ended = unsafe { process_ended_unseen(task, key, &info) };
            if ended {
                info.flags |= TASK_FLAG_GROUP_DEAD;
            }
        }
        (info, ev, false)
    } else if unseen_exit {
        // Its task is gone: the probe's reading path drops the entry, counted.
        return false;
    } else {
        match unread_entry(key, &info).and_then(|now| Some((now, at_exit_record(key)?))) {
            Some((now, ev)) => (now, ev, true),
            None => return true,
        }
    };
    if commit(key, info, ev) && unread {
        if let Some(s) = stats(info.tree) {
            s.lost_exits += 1;
        }
    }
    true
}

/// A dead member's EXIT record for `key`, every field read now: once its entry is
/// removed the kernel may free the task and give its memory to another, so nothing
/// is read through it after (a record read then named a host process's command and
/// parent).
///
/// # Safety
/// `task` must be a task_struct, or a freed one whose reads are then discarded.
#[inline(always)]
unsafe fn final_figures(task: *const u8, key: u32, info: &Held) -> Event {
    let o = off();
    // A graveyard entry's key is its process's; any other is the thread's tid
    // (checked against the task before its figures count).
    let graveyard = key & GRAVEYARD_KEY != 0;
    let mut ev = Event {
        kind: EVENT_EXIT,
        tid: if graveyard {
            field(task, o.task_pid)
        } else {
            key
        },
        fig: thread_figures(task),
        flags: if graveyard { EVENT_FLAG_SHARED_TID } else { 0 },
        comm: field(task, o.task_comm),
        ..Event::default()
    };
    if info.flags & TASK_FLAG_GROUP_DEAD != 0 {
        (ev.exit_code, ev.ppid) = process_end(task, !graveyard && key == info.tgid);
    }
    ev
}

/// A member whose exit no program saw (every copy skipped), found dead by the sweep
/// or freed: when it is its process's leader, every thread of the process has
/// passed its exit (`signal->live` 0, which a leader's free implies), and no other
/// thread's exit counted the process's end, the end is counted now; whether it was
/// (the caller then retires the leader as the process's last thread).
///
/// # Safety
/// `task` must be the member's task, allocated (checked by the caller).
#[inline(always)]
unsafe fn process_ended_unseen(task: *const u8, key: u32, info: &Held) -> bool {
    if !adopting()
        || key != info.tgid
        || info.flags & (TASK_FLAG_GROUP_DEAD | TASK_FLAG_PROC_ENDED) != 0
    {
        return false;
    }
    let o = off();
    let signal: *const u8 = field::<u64>(task, o.task_signal) as *const u8;
    if field::<i32>(signal, o.signal_live) != 0 {
        return false;
    }
    // Once: the entry is marked before it is counted, and a second retirement
    // finds it gone (`commit`).
    let Some(p) = TASKS.get_ptr_mut(key) else {
        return false;
    };
    let e = &mut *p;
    if e.task != info.task || e.flags & TASK_FLAG_PROC_ENDED != 0 {
        return false;
    }
    e.flags |= TASK_FLAG_PROC_ENDED;
    if let Some(s) = stats(info.tree) {
        s.procs_exited += 1;
        s.exits_unseen += 1;
    }
    true
}

/// A process's exit code and parent (its leader's), read through its last thread;
/// `is_leader`: that thread is the leader itself (its tid is the tgid), whose
/// pointer then need not be read.
///
/// # Safety
/// `task` must be a task_struct, or a freed one whose reads are then discarded.
#[inline(always)]
unsafe fn process_end(task: *const u8, is_leader: bool) -> (u32, u32) {
    let o = off();
    let leader: *const u8 = if is_leader {
        task
    } else {
        field::<u64>(task, o.task_group_leader) as *const u8
    };
    let parent: *const u8 = field::<u64>(leader, o.task_real_parent) as *const u8;
    (field(leader, o.task_exit_code), field(parent, o.task_tgid))
}

/// A dead member's EXIT record from what its exit left in its entry, for a task
/// freed before its final figures were read: nothing is read through it.
#[inline(always)]
fn at_exit_record(key: u32) -> Option<Event> {
    // SAFETY: the fields are copied out at once.
    let v = unsafe { TASKS.get(key) }?;
    let graveyard = key & GRAVEYARD_KEY != 0;
    Some(Event {
        kind: EVENT_EXIT,
        tid: if graveyard { v.tgid } else { key },
        fig: v.at_exit,
        flags: EVENT_FLAG_AT_EXIT | if graveyard { EVENT_FLAG_SHARED_TID } else { 0 },
        comm: v.comm,
        exit_code: v.exit_code,
        ppid: v.ppid,
        ..Event::default()
    })
}

/// The entry at `tid` retires before the tid becomes another task's. A global
/// function, verified once on its own: inlined into the fork program it was most
/// of that program's verification at every start, for a path a fork rarely takes.
/// Exported by the link (build.rs).
#[no_mangle]
#[inline(never)]
pub extern "C" fn retire_displaced_key(tid: u32) -> u32 {
    if let Some(old) = held(tid) {
        retire_displaced(tid, old);
    }
    0
}

/// A dead member whose tid a new member of the tree takes: retires at once. Its
/// pid was freed at its reap, after its exit; its task stays allocated while the
/// entry exists. An entry user space registered that no program ever met (its task
/// gone before the registration) has no figures to give and just goes.
#[inline(always)]
fn retire_displaced(tid: u32, old: Held) {
    if old.task == 0 || old.flags & TASK_FLAG_RETIRED != 0 {
        let _ = TASKS.remove(tid);
        return;
    }
    let task = old.task as *const u8;
    // SAFETY: reads through the fault-tolerant helper, kept only if the task still
    // is the member; `commit` removes the entry before it adds the figures, so a
    // retirement racing this one counts them once.
    let ev = unsafe { final_figures(task, tid, &old) };
    // SAFETY: as above.
    if unsafe { still_member(task, tid, &old) } {
        commit(tid, old, ev);
        return;
    }
    // Freed unread: with its figures at exit, or just gone where no exit was seen.
    let Some(now) = unread_entry(tid, &old) else {
        return;
    };
    let retired = match at_exit_record(tid) {
        Some(ev) if now.flags & TASK_FLAG_EXITED != 0 => commit(tid, now, ev),
        _ => TASKS.remove(tid).is_ok(),
    };
    if retired {
        if let Some(s) = stats(now.tree) {
            s.lost_exits += 1;
        }
    }
}

/// Takes the entry (whoever removes it first retires the task, so a task retires
/// once), adds the figures to the tree's totals and sends the EXIT record; whether
/// it did.
#[inline(always)]
fn commit(key: u32, info: Held, mut ev: Event) -> bool {
    // The figures were read while the entry was there and its task checked to be the
    // member's; a removal that succeeds here makes this the only retirement. From
    // here on nothing is read through the task.
    if TASKS.remove(key).is_err() {
        // Gone: another path retired it. Still there and ours: the removal itself
        // failed (the map's bucket busy on this CPU, in a program this one
        // interrupted). It retires now all the same, marked, so that whoever meets
        // the entry next only removes it.
        let Some(p) = TASKS.get_ptr_mut(key) else {
            return false;
        };
        // SAFETY: a hash map value, written at once.
        let e = unsafe { &mut *p };
        if e.task != info.task || e.flags & TASK_FLAG_RETIRED != 0 {
            return false;
        }
        e.flags |= TASK_FLAG_RETIRED;
    }
    let Some(s) = stats(info.tree) else {
        return false;
    };
    s.fig.add(&ev.fig);
    s.threads_exited += 1;
    ev.pid = info.tgid;
    ev.ts_ns = info.exit_ns;
    let group_dead = info.flags & TASK_FLAG_GROUP_DEAD != 0;
    if group_dead {
        ev.flags |= EVENT_FLAG_GROUP_DEAD;
    }
    // The root's last thread is what user space waits for at the end.
    send(
        info.tree,
        ev,
        group_dead && info.flags & TASK_FLAG_ROOT != 0,
    );
    true
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[link_section = "license"]
#[no_mangle]
static LICENSE: [u8; 4] = *b"GPL\0";
