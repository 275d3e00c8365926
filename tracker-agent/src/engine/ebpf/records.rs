//! The event ring's records and their shown form.

use tracker_common::{
    Event, IdleBatch, LiveReading, EVENT_EXEC, EVENT_EXIT, EVENT_FLAG_THREAD, EVENT_FORK,
    EVENT_IDLE, EVENT_READING,
};

use crate::model::ProcEvent;

/// One ring-buffer record.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Record {
    Event(Event),
    Reading(LiveReading),
    Idle(IdleBatch),
}

/// Decodes one ring-buffer record by its leading kind; `None` for a record of the
/// wrong size or kind.
pub(super) fn decode(bytes: &[u8]) -> Option<Record> {
    let kind = u32::from_ne_bytes(bytes.get(..4)?.try_into().ok()?);
    match kind {
        EVENT_FORK | EVENT_EXEC | EVENT_EXIT if bytes.len() >= std::mem::size_of::<Event>() => {
            // SAFETY: Event is repr(C) plain data and the length was checked; the
            // read is unaligned-safe.
            let ev = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<Event>()) };
            Some(Record::Event(ev))
        }
        EVENT_READING if bytes.len() >= std::mem::size_of::<LiveReading>() => {
            // SAFETY: as above, for LiveReading.
            let r = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<LiveReading>()) };
            Some(Record::Reading(r))
        }
        EVENT_IDLE if bytes.len() >= std::mem::size_of::<IdleBatch>() => {
            // SAFETY: as above, for IdleBatch.
            let b = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast::<IdleBatch>()) };
            Some(Record::Idle(b))
        }
        _ => None,
    }
}

/// The shown form of a record; `cpu_ns` is the whole process's CPU for an exit.
pub(super) fn proc_event(ev: &Event, cpu_ns: Option<u64>) -> Option<ProcEvent> {
    let end = ev
        .comm
        .iter()
        .position(|&b| b == 0)
        .unwrap_or(ev.comm.len());
    let kind = match ev.kind {
        EVENT_FORK if ev.flags & EVENT_FLAG_THREAD != 0 => return None,
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
        timestamp_secs: 0.0,
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
        assert_eq!(decode(bytes_of(&ev)), Some(Record::Event(ev)));
        assert_eq!(decode(&bytes_of(&ev)[..8]), None);
        assert_eq!(decode(&[]), None);
        let bad = Event { kind: 99, ..ev };
        assert_eq!(decode(bytes_of(&bad)), None);
        let r = LiveReading {
            kind: EVENT_READING,
            tid: 7,
            pid: 6,
            rss_pages: 3,
            ..LiveReading::default()
        };
        // SAFETY: LiveReading is plain data; viewed as bytes for the decoder.
        let rb = unsafe {
            std::slice::from_raw_parts(
                (&r as *const LiveReading).cast::<u8>(),
                std::mem::size_of::<LiveReading>(),
            )
        };
        assert_eq!(decode(rb), Some(Record::Reading(r)));
        assert_eq!(decode(&rb[..20]), None);
        // A thread's birth is not a process event.
        let thread = Event {
            kind: EVENT_FORK,
            flags: EVENT_FLAG_THREAD,
            ..ev
        };
        assert!(proc_event(&thread, None).is_none());
        assert!(proc_event(&Event { flags: 0, ..thread }, None).is_some());
    }
}
