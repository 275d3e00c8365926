//! `sched_process_free`: a task the kernel frees, retired there where the probe
//! has not yet.

use super::*;

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
pub(crate) fn on_free(ctx: &RawTracePointContext) -> u32 {
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
