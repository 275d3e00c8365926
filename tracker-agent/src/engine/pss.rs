//! Σ PSS of the tree's live members, the memory figure wherever no cgroup holds
//! exactly the tree (attached with `--pid`, the Python package), at a cost that
//! follows what changed rather than the size of the tree.
//!
//! A member's PSS moves only through its own page tables (a page mapped or
//! unmapped, a copy-on-write broken: each a page fault of its own, or a change of
//! its RSS) or through a page it shares changing its number of sharers. So a
//! member whose faults, RSS and start time are where they were when its
//! smaps_rollup was last read keeps that figure, unless a sharer moved:
//! - a member re-read whose shared pages changed (it broke, mapped or dropped a
//!   page someone else maps), or a member that joined or left the tree: every
//!   member is read again, as one settled pass;
//! - sharers outside the tree (libraries, files mapped by other processes): not
//!   seen, so each member's figure is read again once every `REFRESH_EVERY`
//!   samples, a few members each sample, in turn (a re-read whose shared pages
//!   changed brings a settled pass, as above). What they move in between is the
//!   remaining error: their share of the pages the tree maps with them changes by
//!   a fraction of a page per page mapped or unmapped there (docs/cost.md, "Σ
//!   PSS's refresh spread over the samples": 0.8–0.9 % of an idle tree's Σ PSS
//!   in a quiet hour here, 2.9–4.5 % on a busy one, and no larger over 360 s
//!   than over 10).
//!
//! A member that left its memory map between the engine's reading and its rollup
//! (exited, reaped) holds nothing: its pages are counted with the sharers left,
//! and a sample whose members have all gone so is 0. Only members this tracker
//! may not read (another user's) are short in the sum, which is then named a
//! lower bound (`pss_partial`); Σ RSS stands in only where none can be read.
//!
//! A stat (the engine's of this sample where it read one, else ~3 µs here) stands
//! in for a smaps_rollup (15 µs for an idle `sleep`, 56 µs for an idle Python, and
//! more with its mapped memory; docs/cost.md).

use std::collections::HashSet;

use super::ids::IdMap;
use super::procread::{self, FileCache, Kind, MemSig, Rollup, Stat, PF_EXITING};

/// Samples between two reads of an idle member's smaps_rollup, for what sharers
/// outside the tree moved: a rollup per member, it was 17 % of an attached eBPF
/// tracker's time on 300 idle members when all of them came every tenth sample
/// (docs/cost.md, "Σ PSS's periodic pass"), and 16 % of an attached procfs
/// sample at one member in sixty a sample. Spread over the samples, a member
/// every `REFRESH_EVERY / members` samples: no sample takes the whole tree's
/// page-table walks at once, and every stretch of samples its share. What the
/// sharers move was measured no larger over 360 s than over 10 (docs/cost.md).
const REFRESH_EVERY: usize = 120;

/// Passes of a settled read: each walks every member's page tables.
const PASSES: usize = 4;

#[derive(Clone, Copy)]
struct Entry {
    sig: MemSig,
    pss: u64,
    shared: u64,
}

impl Entry {
    /// A member whose rollup this tracker may not read: kept, counting nothing,
    /// until its signature moves.
    fn denied(sig: MemSig) -> Entry {
        Entry {
            sig,
            pss: 0,
            shared: 0,
        }
    }
}

/// How many smaps_rollup files the reads took, for the debug log and the tests.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct PssCounts {
    pub settled_passes: u64,
    pub rollups_read: u64,
    pub kept: u64,
}

#[derive(Default)]
pub struct PssSum {
    /// Keyed by pid, hashed as it is (`IdMap`): looked up for every member every
    /// sample.
    cache: IdMap<Entry>,
    /// Members whose figure is read again next, in turn (`REFRESH_EVERY`), and
    /// the refreshes owed: the live members' count each sample, one refresh for
    /// every `REFRESH_EVERY`.
    due: Vec<u32>,
    credit: usize,
    buf: String,
    /// Members whose smaps_rollup this tracker has no right to read, at the
    /// last `read`: Σ PSS is then short of their share (a lower bound).
    denied: Option<Denied>,
    /// The members' smaps_rollup and stat, held open: a settled pass of an idle
    /// tree of 300 took 1,800 syscalls (open, read, close of each), now 600.
    files: FileCache,
    pub counts: PssCounts,
}

/// Members of the last `read` whose smaps_rollup could not be read while they
/// lived: how many, and the first of them with the reason.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Denied {
    pub members: usize,
    pub pid: u32,
    pub why: String,
}

/// Why a member's smaps_rollup gave no figure.
enum Unread {
    /// Gone, exiting or past its memory map (`ESRCH`, no /proc entry, an empty
    /// file): its pages are the other sharers' now, and its share is no longer
    /// the tree's to count.
    Gone,
    /// Not this tracker's to read (another user's process: `EACCES`), or not a
    /// rollup it knows: the sum is short of its share.
    Denied(String),
}

/// Whether a smaps_rollup's error says its process has left its memory map:
/// no /proc entry any more (reaped), `ESRCH` (exited, or a file held across its
/// exec), or nothing to read.
fn gone(e: &std::io::Error) -> bool {
    matches!(
        e.kind(),
        std::io::ErrorKind::NotFound | std::io::ErrorKind::UnexpectedEof
    ) || e.raw_os_error() == Some(libc::ESRCH)
}

/// Whether a member is exiting or gone: its pages are on their way to the others.
fn exiting(st: Option<&Stat>) -> bool {
    st.is_none_or(|s| matches!(s.state, b'Z' | b'X' | b'x') || s.flags & PF_EXITING != 0)
}

impl PssSum {
    fn stat(&mut self, pid: u32) -> Option<Stat> {
        self.files.read(pid, pid, Kind::Stat, &mut self.buf)?;
        procread::parse_stat(&self.buf)
    }

    fn rollup(&mut self, pid: u32) -> Result<Rollup, Unread> {
        match self
            .files
            .read_or_why(pid, pid, Kind::Rollup, &mut self.buf)
        {
            Ok(()) => procread::parse_rollup(&self.buf)
                .ok_or_else(|| Unread::Denied("no Pss line in its smaps_rollup".into())),
            Err(e) if gone(&e) => Err(Unread::Gone),
            Err(e) => Err(Unread::Denied(e.to_string())),
        }
    }

    /// The members whose smaps_rollup could not be read at the last `read`,
    /// while they lived (None when every live member's was).
    pub fn denied(&self) -> Option<&Denied> {
        self.denied.as_ref()
    }

    fn deny(&mut self, pid: u32, why: String) {
        match &mut self.denied {
            Some(d) => d.members += 1,
            None => {
                self.denied = Some(Denied {
                    members: 1,
                    pid,
                    why,
                })
            }
        }
    }

    /// Σ PSS of `live` now; None when no live member's smaps_rollup could be read
    /// for want of the right to (`denied`): Σ RSS is then the figure. `known`:
    /// a member's signature as the engine read it this sample (read before any
    /// rollup here, so never newer than the figure kept beside it), else None and
    /// its stat is read here.
    pub fn read(
        &mut self,
        live: &HashSet<u32>,
        known: &dyn Fn(u32) -> Option<MemSig>,
    ) -> Option<u64> {
        self.denied = None;
        let same_members =
            live.len() == self.cache.len() && live.iter().all(|p| self.cache.contains_key(p));
        if !same_members {
            return self.settled(live, known);
        }
        let mut sum = 0;
        for &pid in live {
            let sig = match known(pid) {
                Some(sig) => Some(sig),
                None => self.stat(pid).map(|st| MemSig::of(&st)),
            };
            let Some(sig) = sig else {
                // Gone since the engine's reading: the next sample settles.
                self.cache.remove(&pid);
                continue;
            };
            let Some(e) = self.cache.get(&pid).copied() else {
                continue;
            };
            if e.sig == sig {
                self.counts.kept += 1;
                sum += e.pss;
                continue;
            }
            self.counts.rollups_read += 1;
            match self.rollup(pid) {
                Ok(r) if r.shared == e.shared => {
                    self.cache.insert(
                        pid,
                        Entry {
                            sig,
                            pss: r.pss,
                            shared: r.shared,
                        },
                    );
                    sum += r.pss;
                }
                // Its shared pages changed, and with them their sharers' PSS;
                // one that left gave its pages to them.
                Ok(_) | Err(Unread::Gone) => return self.settled(live, known),
                // Kept with nothing counted, so that it does not make every
                // sample a settled pass.
                Err(Unread::Denied(why)) => {
                    self.cache.insert(pid, Entry::denied(sig));
                    self.deny(pid, why);
                }
            }
        }
        self.refresh(live, known, sum)
    }

    /// Reads again the next members in turn whose figure was kept this sample
    /// (`REFRESH_EVERY`), into `sum`, Σ PSS of the members as kept or read.
    fn refresh(
        &mut self,
        live: &HashSet<u32>,
        known: &dyn Fn(u32) -> Option<MemSig>,
        mut sum: u64,
    ) -> Option<u64> {
        self.credit += live.len();
        while self.credit >= REFRESH_EVERY {
            self.credit -= REFRESH_EVERY;
            if self.due.is_empty() {
                self.due.extend(self.cache.keys().copied());
            }
            let Some(pid) = self.due.pop() else {
                break;
            };
            // Gone since it was queued (the next sample settles), or read already.
            let Some(e) = self.cache.get(&pid).copied() else {
                continue;
            };
            self.counts.rollups_read += 1;
            match self.rollup(pid) {
                Ok(r) if r.shared == e.shared => {
                    sum = sum.saturating_sub(e.pss) + r.pss;
                    self.cache.insert(pid, Entry { pss: r.pss, ..e });
                }
                // Its shared pages changed, and with them their sharers' PSS;
                // one that left gave its pages to them.
                Ok(_) | Err(Unread::Gone) => return self.settled(live, known),
                Err(Unread::Denied(why)) => {
                    sum = sum.saturating_sub(e.pss);
                    self.cache.insert(pid, Entry::denied(e.sig));
                    self.deny(pid, why);
                }
            }
        }
        Some(sum)
    }

    /// Σ PSS read one member after the other, each file right at its own moment, the
    /// sum not: a member that exits during the pass leaves the pages it shared to
    /// the others, read then with fewer sharers (a forked child's 75 MiB share of
    /// 300 MiB becomes 100 MiB in each of the three left); members that map a
    /// shared file while the pass runs make the ones read first count it with fewer
    /// sharers than the ones read last (three exec'd children mapping one 300 MiB
    /// memfd summed to 491 MiB). Either way a pass only overcounts, by what changed
    /// while it ran. So passes are taken until two in a row agree and no member read
    /// was exiting (at most `PASSES`), and the smallest sum counts, with its
    /// members' figures kept for the samples after. Where every member has a kept
    /// figure (the periodic pass, or a re-read member's shares moved), their
    /// sum stands for the pass before the first: an idle tree settles in one pass.
    fn settled(
        &mut self,
        live: &HashSet<u32>,
        known: &dyn Fn(u32) -> Option<MemSig>,
    ) -> Option<u64> {
        self.counts.settled_passes += 1;
        let mut best: Option<(u64, IdMap<Entry>)> = None;
        let mut prev: Option<u64> = live.iter().map(|p| self.cache.get(p).map(|e| e.pss)).sum();
        for _ in 0..PASSES {
            let mut sum = 0;
            let mut read = IdMap::with_capacity_and_hasher(live.len(), Default::default());
            let mut denied = None;
            for &pid in live {
                // The signature before the rollup: a fault in between makes the next
                // sample read it again, never keep a figure older than its signature.
                // The engine's of this sample where it has one (read before this
                // pass, and live then), else the stat's.
                let sig = match known(pid) {
                    Some(sig) => sig,
                    None => match self.stat(pid) {
                        Some(st) => MemSig::of(&st),
                        None => continue,
                    },
                };
                self.counts.rollups_read += 1;
                match self.rollup(pid) {
                    Ok(r) => {
                        sum += r.pss;
                        read.insert(
                            pid,
                            Entry {
                                sig,
                                pss: r.pss,
                                shared: r.shared,
                            },
                        );
                    }
                    // A member the engine read alive that has exited since (or is
                    // past its memory map) holds nothing: its pages are counted
                    // with the sharers left. Never a reason for Σ RSS, which
                    // would count the pages once per sharer.
                    Err(Unread::Gone) => {}
                    Err(Unread::Denied(why)) => {
                        read.insert(pid, Entry::denied(sig));
                        let d = denied.get_or_insert(Denied {
                            members: 0,
                            pid,
                            why,
                        });
                        d.members += 1;
                    }
                }
            }
            let readable = read.len() - denied.as_ref().map_or(0, |d| d.members);
            if readable == 0 && denied.is_some() {
                // No right to read any live member's: Σ RSS is the figure.
                self.cache.clear();
                self.denied = denied;
                return None;
            }
            self.denied = denied;
            // Exiting by the end of the pass: its shares moved while it ran, to
            // members read after it at a larger share, while its own reading
            // still counts them. Where the passes do not settle, its reading is
            // left out of the pass's figure (an exit storm under-counts for a
            // sample, never counts a page twice into the peak), and it is read
            // again at the next sample.
            let leaving: Vec<u32> = read
                .keys()
                .copied()
                .filter(|&p| exiting(self.stat(p).as_ref()))
                .collect();
            let settled = leaving.is_empty()
                && prev.is_some_and(|p| p.abs_diff(sum) <= (p / 100).max(1 << 20));
            let figure = sum
                - leaving
                    .iter()
                    .filter_map(|p| read.remove(p))
                    .map(|e| e.pss)
                    .sum::<u64>();
            if best.as_ref().is_none_or(|(b, _)| figure < *b) {
                best = Some((figure, read));
            }
            if settled {
                break;
            }
            prev = Some(sum);
        }
        // Every live member's files were read by this pass: those left are of
        // members that left.
        self.files.sweep();
        let (sum, cache) = best?;
        self.cache = cache;
        Some(sum)
    }
}

#[cfg(test)]
mod tests {
    use std::{
        collections::HashSet,
        path::PathBuf,
        process::{Child, Command},
    };

    use super::PssSum;
    use crate::engine::procread::MemSig;

    /// Sleeping processes whose every file-backed page is theirs alone: `sleep`,
    /// its libraries and the dynamic loader are private copies, and with no
    /// environment no locale file is mapped, so their Σ PSS does not move as other
    /// processes of the machine map or unmap the shared libc or the locale archive
    /// (which changes a shared page's share in each mapper).
    struct Sleepers {
        dir: PathBuf,
        loader: PathBuf,
        kids: Vec<Child>,
    }

    impl Sleepers {
        fn new(n: usize) -> Sleepers {
            let dir = std::env::temp_dir().join(format!(
                "rt-pss-{}-{:?}",
                std::process::id(),
                std::thread::current().id()
            ));
            let _ = std::fs::remove_dir_all(&dir);
            std::fs::create_dir(&dir).expect("scratch dir");
            let mut s = Sleepers {
                dir,
                loader: PathBuf::new(),
                kids: Vec::new(),
            };
            let sleep = ["/bin/sleep", "/usr/bin/sleep"]
                .into_iter()
                .find(|p| std::path::Path::new(p).exists())
                .expect("sleep");
            let ldd = Command::new("ldd").arg(sleep).output().expect("ldd");
            for l in String::from_utf8_lossy(&ldd.stdout).lines() {
                let Some(path) = l.split_whitespace().find(|w| w.starts_with('/')) else {
                    continue;
                };
                let name = path.rsplit('/').next().unwrap_or(path).to_string();
                std::fs::copy(path, s.dir.join(&name)).expect("a library's copy");
                if !l.contains("=>") {
                    s.loader = s.dir.join(name);
                }
            }
            std::fs::copy(sleep, s.dir.join("sleep")).expect("sleep's copy");
            assert!(s.loader.is_file(), "the dynamic loader in ldd's list");
            for _ in 0..n {
                s.add();
            }
            // Let each start and settle.
            std::thread::sleep(std::time::Duration::from_millis(200));
            s
        }

        fn add(&mut self) -> u32 {
            let kid = Command::new(&self.loader)
                .env_clear()
                .arg("--library-path")
                .arg(&self.dir)
                .arg(self.dir.join("sleep"))
                .arg("30")
                .spawn()
                .expect("sleep");
            let pid = kid.id();
            self.kids.push(kid);
            pid
        }

        fn pids(&self) -> HashSet<u32> {
            self.kids.iter().map(Child::id).collect()
        }
    }

    impl Drop for Sleepers {
        fn drop(&mut self) {
            for k in &mut self.kids {
                let _ = k.kill();
                let _ = k.wait();
            }
            let _ = std::fs::remove_dir_all(&self.dir);
        }
    }

    /// Idle members keep their figures; a member that maps and touches new pages
    /// is read again; one that joins makes a settled pass.
    #[test]
    fn only_what_moved_is_read_again() {
        let mut kids = Sleepers::new(3);
        let mut live = kids.pids();
        let mut p = PssSum::default();
        let first = p.read(&live, &|_| None).expect("Σ PSS of three sleeps");
        assert!(first > 0);
        let settled = p.counts.settled_passes;
        let again = p.read(&live, &|_| None).expect("again");
        assert_eq!(
            p.counts.settled_passes, settled,
            "nothing moved: no settled pass"
        );
        assert_eq!(p.counts.kept, 3);
        assert_eq!(again, first);
        // A fourth member: every member is read again.
        live.insert(kids.add());
        std::thread::sleep(std::time::Duration::from_millis(200));
        p.read(&live, &|_| None).expect("four");
        assert_eq!(p.counts.settled_passes, settled + 1);
    }

    /// The engine's signature, where it gives one, is what a member is compared
    /// by: kept while it stays, read again once it moves, whatever /proc says.
    /// The engine's signature of every member, as eBPF gives it: its faults
    /// are `faults`, which a test moves to say that the members ran.
    fn engine_sig(faults: &std::cell::Cell<u64>) -> impl Fn(u32) -> Option<MemSig> + '_ {
        move |_| {
            Some(MemSig {
                starttime: 0,
                rss_pages: 100,
                faults: faults.get(),
            })
        }
    }

    #[test]
    fn the_engines_signature_decides() {
        use std::cell::Cell;
        let kid = Sleepers::new(1);
        let live = kid.pids();
        let faults = Cell::new(1);
        let known = engine_sig(&faults);
        let mut p = PssSum::default();
        p.read(&live, &known).expect("settled");
        let read = p.counts.rollups_read;
        p.read(&live, &known).expect("kept");
        assert_eq!((p.counts.kept, p.counts.rollups_read), (1, read));
        faults.set(2);
        p.read(&live, &known).expect("read again");
        assert_eq!((p.counts.kept, p.counts.rollups_read), (1, read + 1));
    }

    /// An idle tree's members are each read again once every `REFRESH_EVERY`
    /// samples, in turn, and agree with the figures kept: no settled pass.
    #[test]
    fn an_idle_trees_members_are_read_again_in_turn() {
        let kids = Sleepers::new(3);
        let live = kids.pids();
        let mut p = PssSum::default();
        let first = p.read(&live, &|_| None).expect("settled");
        let after_first = p.counts.rollups_read;
        assert!(after_first >= 6, "a first settled pass reads twice");
        for i in 1..=super::REFRESH_EVERY {
            assert_eq!(p.read(&live, &|_| None), Some(first));
            // One rollup every REFRESH_EVERY / 3 samples.
            assert_eq!(
                p.counts.rollups_read,
                after_first + (3 * i / super::REFRESH_EVERY) as u64,
                "sample {i}"
            );
        }
        assert_eq!(p.counts.settled_passes, 1);
        assert_eq!(p.counts.rollups_read, after_first + 3);
    }

    /// Members the engine read alive that exited before their rollups (a zombie
    /// and a reaped one: `ESRCH`, no /proc entry) hold nothing: Σ PSS is that of
    /// the member left, and with none left it is 0, never None, which would make
    /// Σ RSS the sample's figure and count every shared page once per sharer
    /// (903 MiB for a 301 MiB tree of three, as the eBPF engine's last readings of
    /// exiting children carry their RSS).
    #[test]
    fn members_gone_since_the_engines_reading_are_no_reason_for_rss() {
        use std::cell::Cell;
        let mut kids = Sleepers::new(3);
        let live = kids.pids();
        // As on eBPF: the engine read every member this sample, and each ran
        // since the last (an exit runs), so each is read again.
        let faults = Cell::new(1);
        let known = engine_sig(&faults);
        let mut p = PssSum::default();
        let all = p.read(&live, &known).expect("Σ PSS of three sleeps");
        let left = kids.kids[0].id();
        // One zombie, one reaped.
        let zombie = kids.kids[1].id();
        let _ = kids.kids[1].kill();
        let _ = kids.kids[2].kill();
        let _ = kids.kids[2].wait();
        let t0 = std::time::Instant::now();
        while !std::fs::read_to_string(format!("/proc/{zombie}/stat")).is_ok_and(|s| {
            s.rsplit(')')
                .next()
                .is_some_and(|r| r.trim_start().starts_with('Z'))
        }) {
            assert!(t0.elapsed().as_secs() < 5, "pid {zombie} never a zombie");
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
        // What the one left holds now: the pages it shared are its own.
        let alone = PssSum::default()
            .read(&[left].into(), &known)
            .expect("the one left");
        faults.set(2);
        let now = p.read(&live, &known);
        assert_eq!(now, Some(alone), "three sleeps {all}, the one left {alone}");
        assert_eq!(p.denied(), None);
        let _ = kids.kids[0].kill();
        let _ = kids.kids[0].wait();
        faults.set(3);
        assert_eq!(p.read(&live, &known), Some(0), "none left");
        assert_eq!(p.denied(), None);
    }

    #[test]
    fn this_process_growing_is_seen_at_once() {
        let me: HashSet<u32> = [std::process::id()].into();
        let mut p = PssSum::default();
        let before = p.read(&me, &|_| None).expect("own PSS");
        let mut big = vec![0u8; 64 << 20];
        for i in (0..big.len()).step_by(4096) {
            big[i] = 1;
        }
        let after = p.read(&me, &|_| None).expect("own PSS again");
        // Other tests of this process allocate and free meanwhile.
        assert!(
            after >= before + (32 << 20),
            "64 MiB touched: {before} → {after}"
        );
        std::hint::black_box(&big);
    }
}
