//! NVIDIA GPUs through NVML. `nvml-wrapper` dlopens `libnvidia-ml.so.1` at run time
//! (no link-time dependency); without the driver the collector is absent.
//!
//! Static facts (uuid, name, PCI address, driver versions, core count) are read once
//! at start; each sample reads utilisation, memory, temperature, power and the
//! graphics clock, plus — only when a tree is tracked — the per-process lists.
//! A call that fails makes its field null (one warning per field and device for the
//! run); a GPU that is lost (`GpuLost`: fallen off the bus, driver reset) gets one
//! warning and null readings, never a panic.
//!
//! The tree's utilisation of a GPU comes from `nvmlDeviceGetProcessUtilization`,
//! asked for the samples newer than the last timestamp seen on that device. NVML
//! keeps per-process samples only for its own sampling window (a few seconds at
//! most, driver-dependent): per tree process the latest sample of the window counts,
//! and when NVML has none for the tree (idle, or a window that has moved on), the
//! tree's utilisation of that GPU is 0 — the collector never reports more than NVML
//! measured.

use std::{
    collections::{BTreeMap, HashMap, HashSet},
    ffi::CStr,
};

use nvml_wrapper::{
    cuda_driver_version_major, cuda_driver_version_minor,
    enum_wrappers::device::{Clock, TemperatureSensor},
    enums::device::UsedGpuMemory,
    error::NvmlError,
    struct_wrappers::device::ProcessInfo,
    Device, Nvml,
};

use super::pct::pct;
use crate::model::ProcessGpu;
use crate::{model::sample::GpuSample, warn::warn_once};

const LIB: &CStr = c"libnvidia-ml.so.1";

struct Dev {
    index: u32,
    /// How messages name the device: `GPU 0 (NAME, UUID)`.
    label: String,
    /// Identity fields, filled at start.
    base: GpuSample,
    /// Newest process-utilisation timestamp seen (µs, NVML's clock).
    last_ts: u64,
}

pub struct NvidiaCollector {
    nvml: Nvml,
    devs: Vec<Dev>,
}

/// Checks that the library can be loaded and is NVML before `nvml-wrapper` gets it:
/// the crate panics on drop when `nvmlShutdown` is missing.
fn probe_library() -> Result<(), String> {
    // SAFETY: dlopen/dlsym/dlclose with valid C strings; the handle is closed here.
    unsafe {
        let h = libc::dlopen(LIB.as_ptr(), libc::RTLD_LAZY | libc::RTLD_LOCAL);
        if h.is_null() {
            let e = libc::dlerror();
            let why = if e.is_null() {
                "not found".to_string()
            } else {
                CStr::from_ptr(e).to_string_lossy().into_owned()
            };
            return Err(format!("cannot load libnvidia-ml.so.1: {why}"));
        }
        let missing: Vec<&str> = [c"nvmlInit_v2", c"nvmlShutdown", c"nvmlDeviceGetCount_v2"]
            .iter()
            .filter(|s| libc::dlsym(h, s.as_ptr()).is_null())
            .map(|s| s.to_str().unwrap_or("?"))
            .collect();
        libc::dlclose(h);
        if missing.is_empty() {
            Ok(())
        } else {
            Err(format!(
                "libnvidia-ml.so.1 is not NVML (no {})",
                missing.join(", ")
            ))
        }
    }
}

impl NvidiaCollector {
    /// None (with one info line) when there is no usable NVIDIA driver.
    pub fn new() -> Option<NvidiaCollector> {
        if let Err(e) = probe_library() {
            log::info!("no NVIDIA driver: {e}");
            return None;
        }
        let nvml = match Nvml::init() {
            Ok(n) => n,
            Err(e) => {
                log::info!("no NVIDIA driver: NVML initialisation failed: {e}");
                return None;
            }
        };
        let count = match nvml.device_count() {
            Ok(c) => c,
            Err(e) => {
                log::warn!("NVIDIA driver present but the GPUs cannot be counted: {e}");
                return None;
            }
        };
        let driver = nvml.sys_driver_version().ok();
        let cuda = nvml.sys_cuda_driver_version().ok().map(|v| {
            format!(
                "{}.{}",
                cuda_driver_version_major(v),
                cuda_driver_version_minor(v)
            )
        });
        let mut devs = Vec::new();
        for index in 0..count {
            let d = match nvml.device_by_index(index) {
                Ok(d) => d,
                Err(e) => {
                    log::warn!("NVIDIA GPU {index}: no handle ({e}); not listed");
                    continue;
                }
            };
            let mut label = format!("GPU {index}");
            let mut base = GpuSample {
                device_type: "GPU".into(),
                ..Default::default()
            };
            base.name = get(&label, "name", d.name());
            base.uuid = get(&label, "uuid", d.uuid());
            label = format!(
                "NVIDIA GPU {index} ({}, {})",
                base.name.as_deref().unwrap_or("?"),
                base.uuid.as_deref().unwrap_or("no uuid")
            );
            if let Some(p) = get(&label, "pci_info", d.pci_info()) {
                base.host_id = Some(p.bus_id);
                base.detail
                    .insert("pci_device_id".into(), format!("0x{:08x}", p.pci_device_id));
            }
            if let Some(v) = &driver {
                base.detail.insert("driver_version".into(), v.clone());
            }
            if let Some(v) = &cuda {
                base.detail.insert("cuda_driver_version".into(), v.clone());
            }
            base.core_count = get(&label, "core_count", d.num_cores()).map(u64::from);
            devs.push(Dev {
                index,
                label,
                base,
                last_ts: 0,
            });
        }
        Some(NvidiaCollector { nvml, devs })
    }

    pub fn device_count(&self) -> usize {
        self.devs.len()
    }

    /// Appends one reading per device to `out`; returns the tree's use (zero when
    /// `tree` is empty: the per-process lists are then not asked for).
    pub fn sample(&mut self, tree: &HashSet<u32>, out: &mut Vec<GpuSample>) -> ProcessGpu {
        let mut use_ = ProcessGpu::default();
        for dev in &mut self.devs {
            let mut g = dev.base.clone();
            let d = match self.nvml.device_by_index(dev.index) {
                Ok(d) => d,
                Err(e) => {
                    failed(&dev.label, "handle", &e);
                    out.push(g);
                    continue;
                }
            };
            read_dynamic(&d, &dev.label, &mut g);
            out.push(g);
            if !tree.is_empty() {
                let by = group_use(&d, dev, &|pid| tree.contains(&pid).then_some(()));
                if let Some(u) = by.get(&()) {
                    use_.add_gpu(*u);
                }
            }
        }
        use_
    }

    /// Each group's use of every GPU (the node agent: a group is a container);
    /// `group_of` places a GPU process, None leaves it out.
    pub fn sample_groups(
        &mut self,
        group_of: &dyn Fn(u32) -> Option<String>,
    ) -> BTreeMap<String, ProcessGpu> {
        let mut out: BTreeMap<String, ProcessGpu> = BTreeMap::new();
        for dev in &mut self.devs {
            let Ok(d) = self.nvml.device_by_index(dev.index) else {
                continue;
            };
            for (k, u) in group_use(&d, dev, group_of) {
                out.entry(k).or_default().add_gpu(u);
            }
        }
        out
    }
}

impl ProcessGpu {
    /// Adds one GPU's share (`usage` in 0..1 of that GPU).
    fn add_gpu(&mut self, (usage, vram_bytes): (f64, u64)) {
        self.gpu_usage += usage;
        self.gpu_vram_mib += vram_bytes as f64 / 1048576.0;
        if usage > 0.0 {
            self.gpu_utilized += 1;
        }
    }
}

fn read_dynamic(d: &Device<'_>, label: &str, g: &mut GpuSample) {
    g.utilization_pct = get(label, "utilization_pct", d.utilization_rates()).map(|u| u.gpu as f64);
    if let Some(m) = get(label, "memory", d.memory_info()) {
        g.vram_total_bytes = Some(m.total);
        g.vram_used_bytes = Some(m.used);
        g.vram_used_pct = pct(m.used, m.total);
    }
    g.temperature_celsius = get(
        label,
        "temperature_celsius",
        d.temperature(TemperatureSensor::Gpu),
    )
    .map(f64::from);
    g.power_watts = get(label, "power_watts", d.power_usage()).map(|mw| mw as f64 / 1000.0);
    g.frequency_mhz = get(label, "frequency_mhz", d.clock_info(Clock::Graphics)).map(f64::from);
}

/// (utilisation fraction of this GPU, VRAM bytes) of each group's processes.
fn group_use<K: Ord + Clone>(
    d: &Device<'_>,
    dev: &mut Dev,
    group_of: &dyn Fn(u32) -> Option<K>,
) -> BTreeMap<K, (f64, u64)> {
    // A process may be in both lists (compute and graphics) with the same memory.
    let mut mem: HashMap<u32, (K, u64)> = HashMap::new();
    // A process that starts between NVML's count call and its fill call makes the
    // list too small (InsufficientSize): ask once more.
    let retry = |f: &dyn Fn() -> Result<Vec<ProcessInfo>, NvmlError>| match f() {
        Err(NvmlError::InsufficientSize(_)) => f(),
        r => r,
    };
    for (what, list) in [
        (
            "compute processes",
            retry(&|| d.running_compute_processes()),
        ),
        (
            "graphics processes",
            retry(&|| d.running_graphics_processes()),
        ),
    ] {
        let Some(list) = get(&dev.label, what, list) else {
            continue;
        };
        for p in list {
            let Some(k) = group_of(p.pid) else { continue };
            let b = match p.used_gpu_memory {
                UsedGpuMemory::Used(b) => b,
                UsedGpuMemory::Unavailable => 0,
            };
            let e = mem.entry(p.pid).or_insert((k, 0));
            e.1 = e.1.max(b);
        }
    }
    let mut out: BTreeMap<K, (f64, u64)> = BTreeMap::new();
    for (k, b) in mem.into_values() {
        out.entry(k).or_insert((0.0, 0)).1 += b;
    }

    // Latest sample per pid of a group in the window since the last call.
    let mut latest: BTreeMap<u32, (K, u64, u32)> = BTreeMap::new();
    match d.process_utilization_stats(dev.last_ts) {
        Ok(samples) => {
            for s in samples {
                dev.last_ts = dev.last_ts.max(s.timestamp);
                if let Some(k) = group_of(s.pid) {
                    let e = latest.entry(s.pid).or_insert((k, 0, 0));
                    if s.timestamp >= e.1 {
                        e.1 = s.timestamp;
                        e.2 = s.sm_util;
                    }
                }
            }
        }
        // No sample in the window: nothing measured, nothing reported.
        Err(NvmlError::NotFound) => {}
        Err(e) => failed(&dev.label, "process utilization", &e),
    }
    let mut sm: BTreeMap<K, u32> = BTreeMap::new();
    for (k, _, u) in latest.into_values() {
        *sm.entry(k).or_default() += u;
    }
    for (k, u) in sm {
        out.entry(k).or_insert((0.0, 0)).0 = (f64::from(u) / 100.0).min(1.0);
    }
    out
}

/// A reading: None on error, warned once per field and device.
fn get<T>(label: &str, field: &str, r: Result<T, NvmlError>) -> Option<T> {
    match r {
        Ok(v) => Some(v),
        Err(e) => {
            failed(label, field, &e);
            None
        }
    }
}

fn failed(label: &str, field: &str, e: &NvmlError) {
    if matches!(e, NvmlError::GpuLost) {
        warn_once(
            &format!("nvml.{label}.lost"),
            format!(
                "{label} is lost (fallen off the bus, or reset): its readings are null from now on"
            ),
        );
    } else {
        warn_once(
            &format!("nvml.{label}.{field}"),
            format!("{label}: {field} unavailable ({e}); reported as null"),
        );
    }
}
