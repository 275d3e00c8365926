//! GPU collectors: NVIDIA through NVML (`nvml-wrapper`, which dlopens
//! `libnvidia-ml.so.1` at run time) and AMD through sysfs and DRM fdinfo. Both are
//! probed once at start; a host without GPUs ends up with no collector at all and
//! pays nothing per sample (not even the tree's pid list is asked for).
//!
//! Besides the per-device readings, each collector attributes GPU use to the
//! tracked tree: the VRAM its live processes hold and their share of each GPU's
//! engine time over the sampling window (see [`ProcessGpu`]).

pub mod amd;
pub mod nvidia;
mod pct;

use std::collections::{BTreeMap, HashSet};

use super::files::Roots;
use crate::model::sample::{GpuSample, HostInfo};
use crate::model::ProcessGpu;

/// All GPU sources of the host.
pub struct GpuCollector {
    nvidia: Option<nvidia::NvidiaCollector>,
    amd: Option<amd::AmdCollector>,
    /// The devices as seen at start (for the host fields).
    first: Vec<GpuSample>,
}

impl GpuCollector {
    /// Probes the drivers once; takes a first reading (baseline of the per-process
    /// counters, and the host fields).
    pub fn new(roots: &Roots) -> GpuCollector {
        let mut c = GpuCollector {
            nvidia: nvidia::NvidiaCollector::new(),
            amd: amd::AmdCollector::new(roots),
            first: Vec::new(),
        };
        c.first = c.sample(&HashSet::new()).0;
        c
    }

    /// Whether any GPU was found (the tree's pid list is only needed then).
    pub fn active(&self) -> bool {
        self.nvidia.as_ref().is_some_and(|n| n.device_count() > 0)
            || self.amd.as_ref().is_some_and(|a| a.device_count() > 0)
    }

    /// Every device's reading, and the GPU use of the processes in `tree_pids`.
    pub fn sample(&mut self, tree_pids: &HashSet<u32>) -> (Vec<GpuSample>, ProcessGpu) {
        let mut out = Vec::new();
        let mut tree = ProcessGpu::default();
        if let Some(n) = self.nvidia.as_mut() {
            tree.add(n.sample(tree_pids, &mut out));
        }
        if let Some(a) = self.amd.as_mut() {
            tree.add(a.sample(tree_pids, &mut out));
        }
        (out, tree)
    }

    /// The GPU use of each group of processes (the node agent's containers);
    /// NVIDIA only: NVML lists the processes of a GPU, while AMD's per-process
    /// figures would mean reading every process's fdinfo, a cost that grows with
    /// the node's processes.
    pub fn sample_groups(
        &mut self,
        group_of: &dyn Fn(u32) -> Option<String>,
    ) -> BTreeMap<String, ProcessGpu> {
        match self.nvidia.as_mut() {
            Some(n) => n.sample_groups(group_of),
            None => BTreeMap::new(),
        }
    }

    /// `host_gpu_model` (the most common name), `host_gpu_count` and
    /// `host_gpu_memory_mib` (Σ VRAM), from the reading at start; null without GPUs.
    pub fn host_fields(&self, h: &mut HostInfo) {
        if self.first.is_empty() {
            return;
        }
        let mut names: BTreeMap<&str, usize> = BTreeMap::new();
        for g in &self.first {
            if let Some(n) = g.name.as_deref() {
                *names.entry(n).or_default() += 1;
            }
        }
        // Most common; ties go to the first name in sort order (stable output).
        h.host_gpu_model = names
            .iter()
            .max_by(|a, b| a.1.cmp(b.1).then(b.0.cmp(a.0)))
            .map(|(n, _)| n.to_string());
        h.host_gpu_count = Some(self.first.len() as u64);
        let totals: Vec<u64> = self
            .first
            .iter()
            .filter_map(|g| g.vram_total_bytes)
            .collect();
        h.host_gpu_memory_mib =
            (!totals.is_empty()).then(|| totals.iter().sum::<u64>() as f64 / 1048576.0);
    }
}
