//! The attach's task walk: members user space registered from /proc (`--pid`, the
//! Python package) carry no task address, and a member no program meets (an idle
//! process never forks, execs or exits) could not be read by the probe, only from
//! /proc, three reads per thread every sample. One pass of the kernel's task
//! iterator at the attach gives each its address, checked as every program checks
//! a registered entry (`is_member`), and the probe reads it from then on.
//!
//! A tracing program (`iter/task`): unlike the raw tracepoints it needs the
//! kernel's BTF to load, and 5.8 or later; where it cannot load, the members stay
//! on /proc, as exact and dearer.

use core::ffi::c_void;

use super::{ids, is_member, TASKS};

/// Runs once for each task of the walk (threads included), then once with no task.
///
/// # Safety
/// Called by the kernel with its `struct bpf_iter__task` as the context.
#[no_mangle]
#[link_section = "iter/task"]
pub extern "C" fn claim_registered(ctx: *mut c_void) -> i32 {
    // `struct bpf_iter__task { meta; task; }`, one 8-byte pointer each.
    // SAFETY: a context load at a constant offset, which the verifier checks.
    let task = unsafe { *(ctx as *const *const u8).add(1) };
    if task.is_null() {
        return 0;
    }
    // SAFETY: the walk holds a reference on `task` while this runs.
    let (tid, tgid) = unsafe { ids(task) };
    let Some(p) = TASKS.get_ptr_mut(tid) else {
        return 0;
    };
    // SAFETY: a hash map value, valid while this program runs.
    let info = unsafe { &mut *p };
    // SAFETY: as above.
    if info.task != 0 || info.tgid != tgid || !unsafe { is_member(info, task) } {
        return 0;
    }
    info.task = task as u64;
    0
}
