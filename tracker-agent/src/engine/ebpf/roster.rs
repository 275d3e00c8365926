//! The members user space reads, by their key in the task map, with how many of each
//! process's threads have not retired yet: a process's EXIT event waits for all of
//! them, since its threads retire in any order after its last one exits.

use std::collections::hash_map::Entry;

use tracker_common::{Event, LiveReading};

use crate::engine::ids::IdMap;

/// A member user space reads, by its key in the task map.
#[derive(Clone, Copy, Debug)]
pub(super) struct Member {
    pub tgid: u32,
    /// The reading pass that last got a READING record for it (or an IDLE one).
    pub read_in: u32,
    /// Its last READING, which an IDLE record says still holds.
    pub last: Option<LiveReading>,
}

/// A process whose last thread exited while others had not retired: its event and
/// the CPU of its threads retired so far.
#[derive(Clone, Copy, Debug)]
struct Pending {
    ev: Event,
    cpu_ns: u64,
}

#[derive(Debug, Default)]
pub(super) struct Roster {
    members: IdMap<Member>,
    /// tgid → members of that process in `members`.
    threads: IdMap<u32>,
    pending: IdMap<Pending>,
}

impl Roster {
    pub fn enrol(&mut self, key: u32, tgid: u32) {
        match self.members.entry(key) {
            Entry::Occupied(mut e) => {
                let old = std::mem::replace(&mut e.get_mut().tgid, tgid);
                if old != tgid {
                    Self::down(&mut self.threads, old);
                    *self.threads.entry(tgid).or_default() += 1;
                }
            }
            Entry::Vacant(e) => {
                e.insert(Member {
                    tgid,
                    read_in: 0,
                    last: None,
                });
                *self.threads.entry(tgid).or_default() += 1;
            }
        }
    }

    fn down(threads: &mut IdMap<u32>, tgid: u32) {
        if let Entry::Occupied(mut e) = threads.entry(tgid) {
            *e.get_mut() -= 1;
            if *e.get() == 0 {
                e.remove();
            }
        }
    }

    pub fn remove(&mut self, key: u32) -> Option<Member> {
        let m = self.members.remove(&key)?;
        Self::down(&mut self.threads, m.tgid);
        Some(m)
    }

    pub fn get_mut(&mut self, key: u32) -> Option<&mut Member> {
        self.members.get_mut(&key)
    }

    pub fn keys(&self) -> impl Iterator<Item = u32> + '_ {
        self.members.keys().copied()
    }

    pub fn iter(&self) -> impl Iterator<Item = (u32, &Member)> {
        self.members.iter().map(|(&k, m)| (k, m))
    }

    /// A retired thread of `ev.pid` (its entry already removed). `last` is the
    /// process's CPU when this record was its last thread's; the event then waits
    /// for the threads still to retire. Returns the process's event and whole CPU
    /// once every thread has retired.
    pub fn retired(&mut self, ev: &Event, last: Option<u64>) -> Option<(Event, u64)> {
        let pid = ev.pid;
        match (last, self.pending.get_mut(&pid)) {
            (Some(cpu_ns), _) => {
                if self.threads.contains_key(&pid) {
                    self.pending.insert(pid, Pending { ev: *ev, cpu_ns });
                    return None;
                }
                Some((*ev, cpu_ns))
            }
            (None, Some(p)) => {
                p.cpu_ns += ev.fig.cpu_ns;
                if self.threads.contains_key(&pid) {
                    return None;
                }
                let p = self.pending.remove(&pid)?;
                Some((p.ev, p.cpu_ns))
            }
            (None, None) => None,
        }
    }

    /// Whether `pid`'s last thread has exited and its event waits for others.
    pub fn is_pending(&self, pid: u32) -> bool {
        self.pending.contains_key(&pid)
    }

    /// Events still waiting (threads whose records were lost): at the end of a run.
    pub fn take_pending(&mut self) -> Vec<(Event, u64)> {
        self.pending
            .drain()
            .map(|(_, p)| (p.ev, p.cpu_ns))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::engine::ebpf::ledger::tests::exit;
    use tracker_common::EVENT_FLAG_GROUP_DEAD;

    /// The last thread to exit is not the last to retire: the process's event waits
    /// and carries every thread's CPU, whichever order they retire in.
    #[test]
    fn a_process_event_waits_for_every_thread() {
        let mut r = Roster::default();
        for k in [10, 11, 12] {
            r.enrol(k, 10);
        }
        // 12 exits last (group dead) but retires first.
        let last = exit(12, 10, 5, EVENT_FLAG_GROUP_DEAD);
        r.remove(12);
        assert_eq!(r.retired(&last, Some(5)), None);
        assert!(r.is_pending(10));
        r.remove(10);
        assert_eq!(r.retired(&exit(10, 10, 7, 0), None), None);
        r.remove(11);
        let (ev, cpu) = r.retired(&exit(11, 10, 9, 0), None).expect("event");
        assert_eq!((ev.tid, cpu), (12, 21));
        assert!(!r.is_pending(10) && r.take_pending().is_empty());
        // One thread: at once.
        r.enrol(20, 20);
        r.remove(20);
        assert_eq!(
            r.retired(&exit(20, 20, 3, EVENT_FLAG_GROUP_DEAD), Some(3)),
            Some((exit(20, 20, 3, EVENT_FLAG_GROUP_DEAD), 3))
        );
    }

    #[test]
    fn a_member_that_changes_process_moves_its_count() {
        let mut r = Roster::default();
        r.enrol(31, 30);
        r.enrol(31, 31);
        assert!(!r.threads.contains_key(&30));
        assert_eq!(r.threads[&31], 1);
        r.remove(31);
        assert!(r.threads.is_empty());
    }
}
