//! Process-tree engines: `ebpf` (exact, kernel-side accounting) and `procfs`
//! (polling fallback). Both produce cumulative [`TreeTotals`]; the sampler turns
//! differences of consecutive totals into per-interval values.

pub mod btf;
pub mod ebpf;
pub(crate) mod ids;
pub mod procfs;
pub mod procread;
pub mod pss;
pub mod taskstats;

use std::{collections::HashSet, time::Duration};

use self::{ebpf::EbpfEngine, procfs::ProcfsEngine};
use crate::model::{
    reading::{Backend, TreeTotals},
    ProcEvent,
};

/// The kernel's event ring of the eBPF engine.
pub type Ring = aya::maps::RingBuf<aya::maps::MapData>;

/// The engine a session reads its tree with.
pub enum Engine {
    Ebpf(Box<EbpfEngine>),
    Procfs(Box<ProcfsEngine>),
}

impl Engine {
    pub fn backend(&self) -> Backend {
        match self {
            Engine::Ebpf(_) => Backend::Ebpf,
            Engine::Procfs(_) => Backend::Procfs,
        }
    }

    /// The tree's totals now; process events met on the way go to `on_event`.
    pub fn read(
        &mut self,
        o: ReadOpts,
        ring: Option<&mut Ring>,
        on_event: &mut dyn FnMut(ProcEvent),
    ) -> anyhow::Result<TreeTotals> {
        match self {
            Engine::Ebpf(e) => e.read(o, ring, on_event),
            Engine::Procfs(e) => e.read(),
        }
    }

    /// Whether a process of the tree is still running (after the command's exit,
    /// the members it left).
    pub fn tree_alive(&mut self) -> bool {
        match self {
            Engine::Ebpf(e) => e.tree_alive(),
            Engine::Procfs(e) => e.tree_alive(),
        }
    }

    /// At the end of a run: events still held back.
    pub fn flush_events(&mut self, on_event: &mut dyn FnMut(ProcEvent)) {
        if let Engine::Ebpf(e) = self {
            e.flush_events(on_event);
        }
    }

    /// Takes what the ring holds between two samples.
    pub fn drain(&mut self, ring: &mut Ring, on_event: &mut dyn FnMut(ProcEvent)) {
        if let Engine::Ebpf(e) = self {
            e.drain(ring, on_event);
        }
    }

    /// Live processes of the tree (eBPF: the task map; procfs: the last walk).
    pub fn live_pids(&self) -> HashSet<u32> {
        match self {
            Engine::Ebpf(e) => e.live_pids(),
            Engine::Procfs(e) => e.live_pids().collect(),
        }
    }

    /// A live member's memory signature as the last reading read it (procfs: its
    /// stat; eBPF: the probe's figures, or its stat where the probe could not read
    /// it); None where this reading has none.
    pub fn mem_sig(&self, pid: u32) -> Option<procread::MemSig> {
        match self {
            Engine::Ebpf(e) => e.mem_sig(pid),
            Engine::Procfs(e) => e.mem_sig(pid),
        }
    }

    /// (run count, run time ns) of the BPF programs, when their statistics are on.
    pub fn bpf_stats(&self) -> Option<(u64, u64)> {
        match self {
            Engine::Ebpf(e) if e.stats_enabled() => {
                let v = e.prog_stats();
                Some(v.iter().fold((0, 0), |(c, t), (_, rc, rt)| {
                    (c + rc, t + rt.as_nanos() as u64)
                }))
            }
            _ => None,
        }
    }

    /// Members that have exited are retired by the sweep once off the CPU,
    /// microseconds later: wait for those, never for reapers or RCU.
    pub fn settle(&mut self) {
        if let Engine::Ebpf(e) = self {
            let waited = e.settle(Duration::from_millis(50));
            log::debug!("settled in {waited:?}");
        }
    }
}

/// Options that change what a reading costs.
#[derive(Clone, Copy, Debug, Default)]
pub struct ReadOpts {
    /// The id (directory inode) of the memory cgroup the tree should be wholly in:
    /// the eBPF backend then says whether every live process's leader is charged
    /// to it (`TreeTotals::memcg_inside`).
    pub memcg_id: Option<u64>,
    /// Read every member whole (the final sample): eBPF's probe then reads the
    /// members it would keep as idle too.
    pub whole: bool,
}
