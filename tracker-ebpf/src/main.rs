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
//!
//! One file per program: fork.rs, exec.rs, exit.rs, free.rs, probe.rs (run on
//! demand), attach.rs (the attach's task walk) and node.rs (the node agent's);
//! this file holds the globals, the maps and the helpers they share.
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
mod exec;
mod exit;
mod fork;
mod free;
mod node;
mod probe;

use fork::*;
use probe::*;

use core::mem::{size_of, MaybeUninit};

use aya_ebpf::{
    helpers::{bpf_get_current_pid_tgid, bpf_get_current_task, bpf_ktime_get_ns, generated},
    macros::{map, raw_tracepoint},
    maps::{HashMap, PerCpuArray, RingBuf},
    programs::RawTracePointContext,
};
use tracker_common::{
    EngineMode, Event, Figures, IdleBatch, LiveReading, Offsets, TaskInfo, TreeStats,
    ADOPT_CHILDREN, ADOPT_DEPTH, DEFAULT_MAX_TASKS, EVENTS_BYTES, EVENT_EXEC, EVENT_EXIT,
    EVENT_FLAG_ADOPTED, EVENT_FLAG_AT_EXIT, EVENT_FLAG_GROUP_DEAD, EVENT_FLAG_SHARED_TID,
    EVENT_FLAG_THREAD, EVENT_FORK, EVENT_IDLE, EVENT_READING, GRAVEYARD_KEY, MAX_TREES, NO_FIELD,
    PROBE_BATCH, READING_FLAG_EXITED, READING_FLAG_MEMCG_ID, READING_FLAG_MEMCG_KNOWN,
    READING_FLAG_ZOMBIE, TASK_DEAD, TASK_FLAG_EXITED, TASK_FLAG_GROUP_DEAD, TASK_FLAG_PROC_ENDED,
    TASK_FLAG_RETIRED, TASK_FLAG_ROOT,
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
    probe_runtime: u64,
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
        probe_runtime: v.probe_runtime,
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

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}

#[link_section = "license"]
#[no_mangle]
static LICENSE: [u8; 4] = *b"GPL\0";
