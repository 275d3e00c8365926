//! `sched_process_exit`: a member thread's exit, its figures at exit kept for
//! the probe's retirement once it is off the CPU.

use super::*;

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
pub(crate) fn on_exit(ctx: &RawTracePointContext) -> u32 {
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
