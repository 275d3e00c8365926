//! `sched_process_fork`: a forked task joins its forker's tree (lineage, so an
//! orphan stays in), and the entries the other programs and user space add.

use super::*;

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
pub(crate) fn on_fork(ctx: &RawTracePointContext) -> u32 {
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
pub(crate) const ADDED: u32 = 0;
pub(crate) const ADD_EXISTS: u32 = 1;
pub(crate) const ADD_FAILED: u32 = 2;
/// In `add_child`'s `parent_flags`, above the task flags: the child was found after
/// its fork (`adopt`).
pub(crate) const ADOPTED_BIT: u64 = 1 << 32;
pub(crate) const BPF_ANY: u64 = 0;
pub(crate) const BPF_NOEXIST: u64 = 1;
pub(crate) const EEXIST: i32 = 17;

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
pub(crate) fn adopting() -> bool {
    mode().adopt != 0
}
