//! The event ring's records and their shown form.

use tracker_common::{Event, EVENT_EXEC, EVENT_EXIT, EVENT_FORK};

use crate::engine::ProcEvent;

/// Decodes one ring-buffer record; `None` for a record of the wrong size or kind.
pub(super) fn decode_event(bytes: &[u8]) -> Option<Event> {
    if bytes.len() < std::mem::size_of::<Event>() {
        return None;
    }
    // SAFETY: Event is repr(C) plain data and the length was checked; the read is
    // unaligned-safe.
    let ev: Event = unsafe { std::ptr::read_unaligned(bytes.as_ptr() as *const Event) };
    matches!(ev.kind, EVENT_FORK | EVENT_EXEC | EVENT_EXIT).then_some(ev)
}

/// The shown form of a record; `cpu_ns` is the whole process's CPU for an exit.
pub(super) fn proc_event(ev: &Event, cpu_ns: Option<u64>) -> Option<ProcEvent> {
    let end = ev
        .comm
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(ev.comm.len());
    let kind = match ev.kind {
        EVENT_FORK => "fork",
        EVENT_EXEC => "exec",
        EVENT_EXIT => "exit",
        _ => return None,
    };
    let exit = ev.kind == EVENT_EXIT;
    Some(ProcEvent {
        kind,
        pid: ev.pid,
        ppid: ev.ppid,
        comm: String::from_utf8_lossy(&ev.comm[..end]).into_owned(),
        cpu_secs: cpu_ns.map(|c| c as f64 / 1e9),
        exit_code: exit.then_some(ev.exit_code as i32),
        monotonic_secs: ev.ts_ns as f64 / 1e9,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::ebpf::ledger::tests::exit;
    use tracker_common::EVENT_FLAG_GROUP_DEAD;

    #[test]
    fn records_decode_by_size_and_kind() {
        fn bytes_of(ev: &Event) -> &[u8] {
            // SAFETY: Event is plain data; viewing it as bytes for the decoder.
            unsafe {
                std::slice::from_raw_parts(
                    (ev as *const Event).cast::<u8>(),
                    std::mem::size_of::<Event>(),
                )
            }
        }
        let ev = exit(5, 5, 1, EVENT_FLAG_GROUP_DEAD);
        assert_eq!(decode_event(bytes_of(&ev)), Some(ev));
        assert_eq!(decode_event(&bytes_of(&ev)[..8]), None);
        let bad = Event { kind: 99, ..ev };
        assert_eq!(decode_event(bytes_of(&bad)), None);
    }
}
