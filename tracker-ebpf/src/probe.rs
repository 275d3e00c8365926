//! The probe, run on demand (`BPF_PROG_TEST_RUN`): live members' readings for
//! user space, and the retirement of each dead thread with its final figures.

use super::*;

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
    let full: u64 = ctx.arg(9);
    // Straight-line, one call per slot and no branch between them: as a loop, the
    // verifier walked the loop's body once per slot and per combination of the
    // branches before (an empty slot, the idle bit), since it compares states at a
    // loop's head exactly: 16,039 of the probe's 18,627 instructions processed, and
    // 15 ms of every start on a 2-vCPU host (docs/engine.md, "Start-up").
    // `probe_member` returns 0 for an empty slot (key 0).
    macro_rules! slot {
        ($i:literal) => {{
            let pair = args[$i / 2];
            let key = if $i % 2 == 0 {
                pair as u32
            } else {
                (pair >> 32) as u32
            };
            // 1 where the member is idle.
            (probe_member(key, memcg_css, full) & 1) << $i
        }};
    }
    const _: () = assert!(PROBE_BATCH == 16, "one slot! per member of the batch");
    let mask: u32 = slot!(0)
        | slot!(1)
        | slot!(2)
        | slot!(3)
        | slot!(4)
        | slot!(5)
        | slot!(6)
        | slot!(7)
        | slot!(8)
        | slot!(9)
        | slot!(10)
        | slot!(11)
        | slot!(12)
        | slot!(13)
        | slot!(14)
        | slot!(15);
    if mask != 0 {
        // A full ring: the idle members are read from /proc this time.
        if let Some(mut entry) = EVENTS.reserve::<IdleBatch>(0) {
            entry.write(IdleBatch {
                kind: EVENT_IDLE,
                mask,
                first: args[0] as u32,
                _pad: 0,
            });
            entry.submit(BPF_RB_NO_WAKEUP);
        }
    }
    0
}

/// One member of the probe's batch, as a global function: the verifier checks it
/// once, for any key, where inlined it walked it again for each of the batch's
/// keys (38 ms of every start on a 2-vCPU host, against 3 ms; docs/engine.md,
/// "Start-up"). Exported by the link (build.rs), so that its BTF linkage is global.
/// 1 where the member has not run since its last READING (`full` 0 only).
#[no_mangle]
#[inline(never)]
pub extern "C" fn probe_member(key: u32, memcg_css: u64, full: u64) -> u32 {
    if key == 0 {
        return 0;
    }
    u32::from(probe_one(key, memcg_css, full))
}

/// Whether the member was idle: not read, its key for the IDLE record.
#[inline(always)]
pub(crate) fn probe_one(key: u32, memcg_css: u64, full: u64) -> bool {
    let Some(info) = held(key) else {
        return false;
    };
    if info.flags & TASK_FLAG_RETIRED != 0 {
        let _ = TASKS.remove(key);
        return false;
    }
    // A registered root before its exec: user space reads it from /proc.
    if info.task == 0 {
        return false;
    }
    let exited = info.flags & TASK_FLAG_EXITED != 0;
    // Where exits can go unseen (`adopting`), a member not marked exited may be dead.
    if (exited || adopting()) && sweep_one(key) {
        return false;
    }
    // A displaced old leader is dead: nothing to read until it retires.
    if key & GRAVEYARD_KEY != 0 {
        return false;
    }
    let task = info.task as *const u8;
    let o = off();
    // Idle: off the CPU (a running task's time since its last tick or switch is
    // not in `sum_exec_runtime` yet) with the run time the last READING said, so
    // it has not run since. CPU, I/O and faults are charged to the task that
    // runs, a fork, exec or exit needs it to run: two reads instead of some
    // fifteen, and no record of its own. What moves without it running (its RSS,
    // when the kernel reclaims pages) waits for the next `full` run.
    if full == 0 && !exited && info.probe_runtime != 0 {
        // SAFETY: reads through the fault-tolerant helper; a freed task's memory
        // reads as another value than the member's last run time, and is then read
        // whole and checked below.
        let runtime: u64 = unsafe { field(task, o.task_sum_exec_runtime) };
        // Without `on_cpu` (a kernel built without SMP), a task that is not
        // TASK_RUNNING (0) is off the CPU or about to leave it.
        // SAFETY: as above.
        let on_cpu: u32 = unsafe {
            if o.task_on_cpu == NO_FIELD {
                u32::from(field::<u32>(task, o.task_state) == 0)
            } else {
                field(task, o.task_on_cpu)
            }
        };
        // A leader's reading carries its process's RSS, which the process's
        // other threads move while the leader sleeps (a main thread in `join`):
        // a leader is idle only as its process's one live thread.
        // SAFETY: as above; `task->signal` lives as long as the task.
        let alone = key != info.tgid
            || unsafe {
                let signal = field::<u64>(task, o.task_signal) as *const u8;
                field::<i32>(signal, o.signal_live) == 1
            };
        if runtime == info.probe_runtime && on_cpu == 0 && alone {
            return true;
        }
    }
    // Reserved before the reads: if the entry is still there after them, a retirement
    // (which removes the entry first) sends its EXIT record after this reading, so
    // user space never takes a reading after the final figures.
    // A full ring: user space reads this member from /proc.
    let Some(mut entry) = EVENTS.reserve::<LiveReading>(0) else {
        return false;
    };
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
        return false;
    }
    match TASKS.get_ptr_mut(key) {
        // SAFETY: a map value's pointer, read and written at once.
        Some(now) if unsafe { (*now).task } == info.task => {
            let runtime = r.fig.cpu_ns;
            entry.write(r);
            // User space drains the ring right after the run: no wake-up.
            entry.submit(BPF_RB_NO_WAKEUP);
            // SAFETY: as above.
            unsafe { (*now).probe_runtime = runtime };
        }
        _ => entry.discard(BPF_RB_NO_WAKEUP),
    }
    false
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
pub(crate) unsafe fn memcg_of(task: *const u8, known: u64, r: &mut LiveReading) {
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
pub(crate) unsafe fn live_reading(task: *const u8, key: u32) -> LiveReading {
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
pub(crate) unsafe fn thread_faults(task: *const u8) -> u64 {
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
pub(crate) unsafe fn thread_figures(task: *const u8) -> Figures {
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
        syscr: io[2],
        syscw: io[3],
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
pub(crate) unsafe fn rss_pages(task: *const u8) -> u64 {
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
pub(crate) unsafe fn still_member(task: *const u8, key: u32, info: &Held) -> bool {
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
pub(crate) fn unread_entry(key: u32, info: &Held) -> Option<Held> {
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
/// its entry goes, counted; it keeps its last reading. A process's leader is freed
/// only once its whole process is gone (reaped after its last thread), so where no
/// other thread's exit counted the process's end, it is counted here: a swarm run
/// with every fifth exit ignored lost one process end to a leader the kernel also
/// freed without the free program. One whose exit was seen retires through the
/// sweep, with its figures at exit.
#[inline(always)]
pub(crate) fn drop_unexited(key: u32, info: &Held) {
    let Some(now) = unread_entry(key, info) else {
        return;
    };
    if now.flags & TASK_FLAG_EXITED != 0 {
        return;
    }
    if TASKS.remove(key).is_ok() {
        if let Some(s) = stats(now.tree) {
            s.lost_exits += 1;
            if adopting() && key == now.tgid && now.flags & TASK_FLAG_PROC_ENDED == 0 {
                s.procs_exited += 1;
                s.exits_unseen += 1;
            }
        }
    }
}

/// Retires `key` if it is dead and off the CPU; whether it did.
#[inline(always)]
pub(crate) fn sweep_one(key: u32) -> bool {
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
pub(crate) unsafe fn final_figures(task: *const u8, key: u32, info: &Held) -> Event {
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
pub(crate) unsafe fn process_ended_unseen(task: *const u8, key: u32, info: &Held) -> bool {
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
pub(crate) unsafe fn process_end(task: *const u8, is_leader: bool) -> (u32, u32) {
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
pub(crate) fn at_exit_record(key: u32) -> Option<Event> {
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
pub(crate) fn retire_displaced(tid: u32, old: Held) {
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
pub(crate) fn commit(key: u32, info: Held, mut ev: Event) -> bool {
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
