//! The per-thread ledger: retired threads' final figures from their EXIT records,
//! and each live thread's last reading until its record arrives.

use tracker_common::{Event, Figures, EVENT_FLAG_GROUP_DEAD, EVENT_FLAG_SHARED_TID};

use crate::engine::ids::IdMap;

/// Retired threads' figures from their EXIT records, and each live thread's last
/// reading until its record arrives.
#[derive(Debug, Default)]
pub(super) struct Ledger {
    retired: Figures,
    /// Live readings carry no tick times (the split comes from /proc/PID/stat).
    live: IdMap<Figures>,
    /// CPU of a process's retired threads, until its last thread retires.
    proc_cpu: IdMap<u64>,
}

/// Bounds the per-process accumulators (a thread retiring after its process's last
/// record starts one that is never closed).
const MAX_PROC_CPU: usize = 100_000;

impl Ledger {
    /// Takes one EXIT record; returns the process's total CPU of the threads retired
    /// so far when it was the last to exit. `late`: a thread retiring after its
    /// process's last record, whose CPU the caller adds to that process.
    pub(super) fn retire(&mut self, ev: &Event, late: bool) -> Option<u64> {
        self.retired.add(&ev.fig);
        if ev.flags & EVENT_FLAG_SHARED_TID == 0 {
            self.live.remove(&ev.tid);
        }
        if late {
            return None;
        }
        if ev.flags & EVENT_FLAG_GROUP_DEAD != 0 {
            return Some(self.proc_cpu.remove(&ev.pid).unwrap_or(0) + ev.fig.cpu_ns);
        }
        if self.proc_cpu.len() < MAX_PROC_CPU || self.proc_cpu.contains_key(&ev.pid) {
            *self.proc_cpu.entry(ev.pid).or_default() += ev.fig.cpu_ns;
        }
        None
    }

    /// A live thread's latest reading, which replaces its previous one.
    pub(super) fn reading(&mut self, tid: u32, f: Figures) {
        self.live.insert(tid, f);
    }

    /// A non-leader thread exec'd and took the leader's tid: its reading moves with
    /// it, and replaces the old leader's, which retires on its own record.
    pub(super) fn exec(&mut self, ev: &Event) {
        if ev.tid != ev.pid {
            if let Some(f) = self.live.remove(&ev.tid) {
                self.live.insert(ev.pid, f);
            }
        }
    }

    /// Retired plus the last reading of every thread not retired yet.
    pub(super) fn total(&self) -> Figures {
        let mut t = self.retired;
        for f in self.live.values() {
            t.add(f);
        }
        t
    }
}

#[cfg(test)]
pub(super) mod tests {
    use super::*;
    use tracker_common::{EVENT_EXEC, EVENT_EXIT};

    fn reading(cpu_ns: u64) -> Figures {
        Figures {
            cpu_ns,
            ..Figures::default()
        }
    }

    pub(in crate::engine::ebpf) fn exit(tid: u32, pid: u32, cpu: u64, flags: u32) -> Event {
        Event {
            kind: EVENT_EXIT,
            pid,
            tid,
            fig: Figures {
                cpu_ns: cpu,
                write_bytes: cpu * 10,
                ..Figures::default()
            },
            flags,
            ..Event::default()
        }
    }

    /// A thread counts with its last live reading until its record, then with its
    /// final figures: once, whatever the order of readings and records.
    impl Ledger {
        fn retire_now(&mut self, ev: &Event) -> Option<u64> {
            self.retire(ev, false)
        }
    }

    #[test]
    fn ledger_counts_each_thread_once() {
        let mut l = Ledger::default();
        l.live.insert(11, reading(40));
        l.live.insert(12, reading(5));
        assert_eq!(l.total().cpu_ns, 45);
        // 11 retires with 50: its reading is replaced, not added.
        assert_eq!(l.retire_now(&exit(11, 10, 50, 0)), None);
        assert_eq!(l.total().cpu_ns, 55);
        assert_eq!(l.total().write_bytes, 500);
        // A thread that was never read (born and dead between two readings).
        assert_eq!(
            l.retire_now(&exit(13, 13, 7, EVENT_FLAG_GROUP_DEAD)),
            Some(7)
        );
        assert_eq!(l.total().cpu_ns, 62);
        // The process's last thread: the record carries its whole CPU.
        assert_eq!(
            l.retire_now(&exit(12, 10, 6, EVENT_FLAG_GROUP_DEAD)),
            Some(56)
        );
        assert_eq!(l.total().cpu_ns, 63);
        assert!(l.live.is_empty() && l.proc_cpu.is_empty());
    }

    /// An exec from a non-leader thread: the thread's reading follows it to the
    /// leader's tid and replaces the old leader's, which retires on its own.
    #[test]
    fn non_leader_exec_moves_the_reading() {
        let mut l = Ledger::default();
        l.live.insert(30, reading(100));
        l.live.insert(31, reading(40));
        // The old leader retires under the exec'ing thread's tid (tids swapped).
        l.retire_now(&exit(31, 30, 110, EVENT_FLAG_SHARED_TID));
        l.exec(&Event {
            kind: EVENT_EXEC,
            pid: 30,
            tid: 31,
            ..Event::default()
        });
        assert_eq!(l.total().cpu_ns, 150);
        assert_eq!(l.live.len(), 1);
    }

    /// A dead task whose tid another member took (a non-leader exec) counts, but the
    /// live member's reading stays.
    #[test]
    fn shared_tid_keeps_the_live_reading() {
        let mut l = Ledger::default();
        l.live.insert(20, reading(9));
        l.retire_now(&exit(20, 20, 3, EVENT_FLAG_SHARED_TID));
        assert_eq!(l.total().cpu_ns, 12);
        assert!(l.live.contains_key(&20));
    }
}
