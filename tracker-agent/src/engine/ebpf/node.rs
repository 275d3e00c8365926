//! The node agent's process life cycle per cgroup, from the node programs
//! (tracker-ebpf/src/node.rs): one program set for the whole host, attached to
//! fork, exec and exit, counting into a per-CPU hash keyed by cgroup v2 id. Only
//! these three are attached; the tree programs stay loaded and idle.

use std::collections::HashMap as StdHashMap;

use aya::{
    maps::{HashMap, MapData, PerCpuArray, PerCpuHashMap, RingBuf},
    Ebpf,
};
use tracker_common::{
    CommandCpu, CommandKey, ExitedTask, NodeCounts, NodeOffsets, Offsets, OomVictim, NO_FIELD,
};

use super::load::{classify, has_cap_bpf, loader_without_btf, raw_tp, EbpfUnavailable, OBJECT};
use crate::engine::btf::{Btf, BtfError};

const PROGRAMS: [(&str, &str); 4] = [
    ("node_fork", "sched_process_fork"),
    ("node_exec", "sched_process_exec"),
    ("node_exit", "sched_process_exit"),
    ("node_free", "sched_process_free"),
];

/// Scans a cgroup may stay unmatched by any tracked container before its counts
/// are dropped: a new container is matched at the first scan after it is made.
const UNMATCHED_SCANS: u32 = 3;

/// How often the exited threads the kernel has not freed are looked at.
const SWEEP_EVERY: std::time::Duration = std::time::Duration::from_secs(5);
/// An exited thread's entry is taken over once it is this old and its tid is gone
/// from /proc (reaped: the kernel frees it one RCU grace period later, milliseconds).
const REAPED_AFTER_NS: u64 = 5_000_000_000;
/// Where the agent cannot look tids up (another pid namespace): once this old.
const HELD_AFTER_NS: u64 = 600_000_000_000;

pub struct NodeLife {
    bpf: Ebpf,
    counts: PerCpuHashMap<MapData, u64, NodeCounts>,
    commands: PerCpuHashMap<MapData, CommandKey, CommandCpu>,
    exited: HashMap<MapData, u64, ExitedTask>,
    /// What the threads freed without the free program counted, as of their exit:
    /// CPU ns and processes by command.
    taken_over: StdHashMap<CommandKey, (u64, u64)>,
    /// Threads counted that way since the start.
    freed_unread: u64,
    last_sweep: std::time::Instant,
    host_pids: bool,
    lost: PerCpuArray<MapData, u64>,
    /// OOM victims (None where `mark_victim` could not be attached).
    oom: Option<RingBuf<MapData>>,
    unmatched: StdHashMap<u64, u32>,
}

/// One OOM kill: the victim's cgroup v2 id (0: unknown) and command.
#[derive(Clone, Debug, PartialEq)]
pub struct Victim {
    pub cgroup_id: u64,
    pub pid: u32,
    pub comm: String,
}

/// The node programs' offsets for this kernel. The cgroup fields they share with
/// the probe (`o`, from `Btf::offsets`) are optional there and required here.
fn node_offsets(btf: &Btf, o: &Offsets) -> Result<NodeOffsets, BtfError> {
    let shared = [
        (o.task_cgroups, "task_struct.cgroups"),
        (o.cgroup_kn, "cgroup.kn"),
        (o.kernfs_node_id, "kernfs_node.id"),
    ];
    if let Some((_, name)) = shared.iter().find(|(off, _)| *off == NO_FIELD) {
        return Err(BtfError::Missing((*name).to_string()));
    }
    Ok(NodeOffsets {
        css_set_dfl_cgrp: btf
            .offset_of("css_set", "dfl_cgrp")?
            .ok_or_else(|| BtfError::Missing("css_set.dfl_cgrp".into()))?,
        mark_victim_has_task: u32::from(btf.tracepoint_args("mark_victim").unwrap_or(1) >= 2),
    })
}

impl NodeLife {
    pub fn load() -> Result<NodeLife, EbpfUnavailable> {
        has_cap_bpf().map_err(EbpfUnavailable::NoPrivilege)?;
        let path = "/sys/kernel/btf/vmlinux";
        let data = crate::fsafe::read_input(std::path::Path::new(path), super::load::MAX_BTF)
            .map_err(|e| EbpfUnavailable::NoBtf(format!("{path}: {e}")))?;
        let (offsets, node) = Btf::parse(&data)
            .and_then(|b| {
                let o = b.offsets()?;
                let n = node_offsets(&b, &o)?;
                Ok((o, n))
            })
            .map_err(|e| EbpfUnavailable::NoBtf(format!("{path}: {e}")))?;
        drop(data);
        let mut bpf = loader_without_btf()
            .btf(None)
            .override_global("OFFSETS", &offsets, true)
            .override_global("NODE_OFFSETS", &node, true)
            // `run`'s task map and event ring are not the node agent's: made at
            // their smallest (the task map is preallocated at its full size).
            .map_max_entries("TASKS", 1)
            .map_max_entries("EVENTS", super::load::UNUSED_RING)
            .load(OBJECT)
            .map_err(|e| classify(String::new(), &e))?;
        for (name, tp) in PROGRAMS {
            let prog = raw_tp(&mut bpf, name)?;
            prog.load().map_err(|e| classify(format!("{name}: "), &e))?;
            prog.attach(tp)
                .map_err(|e| classify(format!("attach {name}: "), &e))?;
        }
        // OOM victims are a bonus: a kernel without the tracepoint keeps the counts.
        let oom = match attach_oom(&mut bpf) {
            Ok(()) => bpf
                .take_map("NODE_OOM")
                .and_then(|m| RingBuf::try_from(m).ok()),
            Err(e) => {
                log::warn!("eBPF: no OOM victims' commands ({e})");
                None
            }
        };
        let map = bpf
            .take_map("NODE_COUNTS")
            .ok_or_else(|| EbpfUnavailable::Load("map NODE_COUNTS missing".into()))?;
        let counts = PerCpuHashMap::try_from(map)
            .map_err(|e| EbpfUnavailable::Load(format!("NODE_COUNTS: {e}")))?;
        let map = bpf
            .take_map("NODE_COMMANDS")
            .ok_or_else(|| EbpfUnavailable::Load("map NODE_COMMANDS missing".into()))?;
        let commands = PerCpuHashMap::try_from(map)
            .map_err(|e| EbpfUnavailable::Load(format!("NODE_COMMANDS: {e}")))?;
        let map = bpf
            .take_map("NODE_EXITED")
            .ok_or_else(|| EbpfUnavailable::Load("map NODE_EXITED missing".into()))?;
        let exited = HashMap::try_from(map)
            .map_err(|e| EbpfUnavailable::Load(format!("NODE_EXITED: {e}")))?;
        let map = bpf
            .take_map("NODE_LOST")
            .ok_or_else(|| EbpfUnavailable::Load("map NODE_LOST missing".into()))?;
        let lost = PerCpuArray::try_from(map)
            .map_err(|e| EbpfUnavailable::Load(format!("NODE_LOST: {e}")))?;
        // SAFETY: malloc_trim has no preconditions; the BTF's freed heap goes back.
        unsafe { libc::malloc_trim(0) };
        Ok(NodeLife {
            bpf,
            counts,
            commands,
            exited,
            taken_over: StdHashMap::new(),
            freed_unread: 0,
            last_sweep: std::time::Instant::now(),
            host_pids: super::load::in_host_pid_ns(),
            lost,
            oom,
            unmatched: StdHashMap::new(),
        })
    }

    /// The CPU of ended processes by command, for each tracked cgroup: the `top`
    /// commands by CPU, (command, CPU seconds, processes). Call after [`read`]: the
    /// entries of cgroups it dropped go too.
    pub fn commands(
        &mut self,
        tracked: &dyn Fn(u64) -> bool,
        top: usize,
    ) -> StdHashMap<u64, Vec<(String, f64, u64)>> {
        if self.last_sweep.elapsed() >= SWEEP_EVERY {
            self.last_sweep = std::time::Instant::now();
            self.take_over_unfreed();
        }
        let mut sums: StdHashMap<CommandKey, (u64, u64)> = StdHashMap::new();
        let mut gone = Vec::new();
        for item in self.commands.iter() {
            let Ok((k, per_cpu)) = item else { continue };
            if !tracked(k.cgroup_id) {
                if !self.unmatched.contains_key(&k.cgroup_id) {
                    gone.push(k);
                }
                continue;
            }
            let s = sums.entry(k).or_default();
            for c in per_cpu.iter() {
                s.0 += c.cpu_ns;
                s.1 += c.processes;
            }
        }
        for k in gone {
            let _ = self.commands.remove(&k);
        }
        let unmatched = &self.unmatched;
        self.taken_over
            .retain(|k, _| tracked(k.cgroup_id) || unmatched.contains_key(&k.cgroup_id));
        for (k, v) in &self.taken_over {
            if tracked(k.cgroup_id) {
                let s = sums.entry(*k).or_default();
                s.0 += v.0;
                s.1 += v.1;
            }
        }
        let mut by: StdHashMap<u64, Vec<(String, f64, u64)>> = StdHashMap::new();
        for (k, (ns, n)) in sums {
            let end = k.comm.iter().position(|&b| b == 0).unwrap_or(k.comm.len());
            let comm = String::from_utf8_lossy(&k.comm[..end]).into_owned();
            by.entry(k.cgroup_id)
                .or_default()
                .push((comm, ns as f64 / 1e9, n));
        }
        for v in by.values_mut() {
            v.sort_by(|a, b| b.1.total_cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
            v.truncate(top);
        }
        by
    }

    /// Counts, with their figures as of their exit, the exited threads whose free
    /// the programs never saw: the kernel sometimes frees a task without running
    /// the free program (docs/engine.md). An entry is taken only by removing it,
    /// and the free and exit programs (the latter when the next task at the same
    /// address exits) count only by removing it, so each thread counts once.
    fn take_over_unfreed(&mut self) {
        let now = crate::sys::monotonic_ns();
        let old: Vec<(u64, ExitedTask)> = self
            .exited
            .iter()
            .filter_map(Result::ok)
            .filter(|(_, e)| {
                unfreed(e, now, self.host_pids, |tid| {
                    !std::path::Path::new(&format!("/proc/{tid}")).exists()
                })
            })
            .collect();
        let mut n = 0;
        for (addr, e) in old {
            if self.exited.remove(&addr).is_ok() {
                let t = self.taken_over.entry(e.key).or_default();
                t.0 += e.cpu_ns;
                t.1 += u64::from(e.leader);
                n += 1;
            }
        }
        self.freed_unread += n;
        if n > 0 {
            log::debug!(
                "{n} exited threads freed without the free program: counted as of their exit"
            );
        }
    }

    /// Exited threads the kernel freed without running the free program, since the
    /// start, counted in user space (taken over) or by the exit of the next task
    /// given their memory: each counts with its CPU as of its exit, short by at most
    /// one scheduler tick (`sum_exec_runtime` is brought up to date at ticks) and
    /// the exit path after the tracepoint (docs/engine.md).
    pub fn freed_unread(&self) -> u64 {
        let in_kernel: u64 = self.lost.get(&1, 0).map(|v| v.iter().sum()).unwrap_or(0);
        self.freed_unread + in_kernel
    }

    /// Counts the programs could not keep (a full map or ring) since the start, and
    /// their runs the kernel skipped (`recursion_misses`: where tracepoints are
    /// preemptible, 6.19 on, a task preempted inside a program makes the next task
    /// on that CPU skip it). A skipped run is one fork, exec or exit of some task
    /// of the host not counted, or a free counted later from the exit's figures
    /// (`take_over_unfreed`).
    pub fn lost(&self) -> u64 {
        let full: u64 = self.lost.get(&0, 0).map(|v| v.iter().sum()).unwrap_or(0);
        full + self.skipped().iter().map(|s| s.1).sum::<u64>()
    }

    /// The runs the kernel skipped since the start, per tracepoint: the bound on
    /// what each count of any one container may lack (a skipped fork is one
    /// `processes_spawned` short somewhere on the host, a skipped exit one
    /// `processes_exited`). Which container lost it the kernel does not say.
    pub fn skipped(&self) -> Vec<(&'static str, u64)> {
        use std::os::fd::AsFd as _;
        PROGRAMS
            .iter()
            .map(|(name, tp)| {
                let n = self
                    .bpf
                    .program(name)
                    .and_then(|p| p.fd().ok())
                    .map_or(0, |fd| super::load::recursion_misses(fd.as_fd()));
                (*tp, n)
            })
            .collect()
    }

    /// The programs' own run time so far; None unless the kernel's BPF statistics
    /// are on (`kernel.bpf_stats_enabled`).
    pub fn run_time(&self) -> Option<std::time::Duration> {
        if !std::fs::read_to_string("/proc/sys/kernel/bpf_stats_enabled")
            .is_ok_and(|s| s.trim() == "1")
        {
            return None;
        }
        let names: Vec<&str> = PROGRAMS.iter().map(|p| p.0).chain(["node_oom"]).collect();
        Some(
            self.bpf
                .programs()
                .filter(|(n, _)| names.contains(n))
                .filter_map(|(_, p)| p.info().ok())
                .map(|i| i.run_time())
                .sum(),
        )
    }

    /// The OOM kills since the previous call.
    pub fn victims(&mut self) -> Vec<Victim> {
        let mut out = Vec::new();
        let Some(ring) = self.oom.as_mut() else {
            return out;
        };
        while let Some(item) = ring.next() {
            if item.len() < std::mem::size_of::<OomVictim>() {
                continue;
            }
            // SAFETY: the record is an OomVictim written by the program (checked
            // size; read unaligned, the ring gives no alignment promise).
            let v: OomVictim = unsafe { std::ptr::read_unaligned(item.as_ptr().cast()) };
            let end = v.comm.iter().position(|&b| b == 0).unwrap_or(v.comm.len());
            out.push(Victim {
                cgroup_id: v.cgroup_id,
                pid: v.pid,
                comm: String::from_utf8_lossy(&v.comm[..end]).into_owned(),
            });
        }
        out
    }

    /// Every counted cgroup's totals (summed over CPUs). Cgroups no tracked
    /// container has matched for a few scans (host services, containers gone) are
    /// dropped from the kernel's map, which keeps it bounded.
    pub fn read(&mut self, tracked: &dyn Fn(u64) -> bool) -> StdHashMap<u64, NodeCounts> {
        let mut out = StdHashMap::new();
        let mut drop_keys = Vec::new();
        for item in self.counts.iter() {
            let Ok((id, per_cpu)) = item else { continue };
            let mut sum = NodeCounts::default();
            for c in per_cpu.iter() {
                sum.spawned += c.spawned;
                sum.exited += c.exited;
                sum.execs += c.execs;
                sum.nonzero_exits += c.nonzero_exits;
                sum.signal_kills += c.signal_kills;
            }
            if tracked(id) {
                self.unmatched.remove(&id);
                out.insert(id, sum);
            } else {
                let n = self.unmatched.entry(id).or_insert(0);
                *n += 1;
                if *n >= UNMATCHED_SCANS {
                    drop_keys.push(id);
                }
            }
        }
        for id in drop_keys {
            let _ = self.counts.remove(&id);
            self.unmatched.remove(&id);
        }
        out
    }
}

/// Whether an exited thread's entry is to be taken over at `now_ns`: it is old, and
/// its thread reaped where tids can be looked up (a zombie keeps its tid until it
/// is reaped, and is freed only then).
fn unfreed(e: &ExitedTask, now_ns: u64, host_pids: bool, reaped: impl Fn(u32) -> bool) -> bool {
    let age = now_ns.saturating_sub(e.at_ns);
    if host_pids {
        age >= REAPED_AFTER_NS && reaped(e.tid)
    } else {
        age >= HELD_AFTER_NS
    }
}

fn attach_oom(bpf: &mut Ebpf) -> Result<(), String> {
    let prog = raw_tp(bpf, "node_oom").map_err(|e| e.to_string())?;
    prog.load().map_err(|e| crate::warn::error_chain(&e))?;
    prog.attach("mark_victim")
        .map_err(|e| crate::warn::error_chain(&e))?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_exited_thread_is_taken_over_only_once_reaped_and_old() {
        let e = ExitedTask {
            at_ns: 1_000_000_000,
            tid: 42,
            ..Default::default()
        };
        let reaped = |tid: u32| tid == 42;
        let zombie = |_: u32| false;
        let at = |s: u64| e.at_ns + s * 1_000_000_000;
        // Freed within milliseconds of the reap, as a rule: not yet.
        assert!(!unfreed(&e, at(1), true, reaped));
        assert!(unfreed(&e, at(5), true, reaped));
        // A zombie is never freed while it stays one.
        assert!(!unfreed(&e, at(3600), true, zombie));
        // Tids of another pid namespace cannot be looked up: age alone, longer.
        assert!(!unfreed(&e, at(5), false, reaped));
        assert!(unfreed(&e, at(600), false, zombie));
        // A clock read before the exit (another CPU) is not an age.
        assert!(!unfreed(&e, 0, true, reaped));
    }
}
