//! `sched_process_exec`: a member's exec, counted and shown.

use super::*;

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
pub(crate) fn on_exec(ctx: &RawTracePointContext) -> u32 {
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
