//! AMD GPUs through the amdgpu driver's sysfs attributes and DRM fdinfo; no library.
//! (`libamdgpu_top` is not used: what it would give beyond these files is not in the
//! sample model, and its device listing panics where the driver directory is absent.)
//!
//! A card is `{sys}/class/drm/cardN` whose `device/driver` link ends in `amdgpu`;
//! nothing is listed unless `{sys}/bus/pci/drivers/amdgpu` exists. Per sample:
//! `gpu_busy_percent`, `mem_info_vram_total`/`_used`, the hwmon `temp1_input`
//! (m°C) and `power1_average` (else `power1_input`, µW), the `*` line of
//! `pp_dpm_sclk`. The tree's use comes from `{proc}/PID/fdinfo/FD` of the DRM files
//! its processes hold (only the tree's pids are read, never all of /proc): clients
//! (`drm-client-id`, shared by fds of one open file) count once, VRAM from
//! `drm-memory-vram`, utilisation = Δ(`drm-engine-gfx` + `drm-engine-compute` ns) ÷
//! elapsed ns, per card, at most 1. A client's first sighting is only a baseline
//! (its earlier engine time may predate the interval), so nothing is reported that
//! was not measured inside the interval.

use std::{
    collections::{HashMap, HashSet},
    path::{Path, PathBuf},
    time::Instant,
};

use super::pct::pct;
use crate::model::ProcessGpu;
use crate::{
    collect::files::{read_attr, CachedFile, Roots},
    model::sample::GpuSample,
    warn::warn_once,
};

struct Card {
    label: String,
    /// PCI address (`drm-pdev` of its clients).
    pdev: String,
    base: GpuSample,
    busy: Option<CachedFile>,
    vram_total: Option<CachedFile>,
    vram_used: Option<CachedFile>,
    temp: Option<CachedFile>,
    power: Option<CachedFile>,
    sclk: Option<CachedFile>,
}

pub struct AmdCollector {
    proc: PathBuf,
    cards: Vec<Card>,
    /// Engine ns per (card index, drm-client-id) at the previous sample.
    prev_engine: HashMap<(usize, u64), u64>,
    prev_at: Instant,
    buf: Vec<u8>,
}

/// One DRM client of an fdinfo file.
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct Client {
    pub pdev: Option<String>,
    pub id: u64,
    pub vram_bytes: u64,
    pub engine_ns: u64,
}

/// An amdgpu client from the text of `/proc/PID/fdinfo/FD`; None for anything else.
pub(crate) fn parse_fdinfo(s: &str) -> Option<Client> {
    let mut amd = false;
    let mut id = None;
    let mut c = Client::default();
    for l in s.lines() {
        let Some((k, v)) = l.split_once(':') else {
            continue;
        };
        let v = v.trim();
        match k.trim() {
            "drm-driver" => amd = v == "amdgpu",
            "drm-client-id" => id = v.parse().ok(),
            "drm-pdev" => c.pdev = Some(v.to_string()),
            "drm-memory-vram" => c.vram_bytes = with_unit(v),
            "drm-engine-gfx" | "drm-engine-compute" => {
                c.engine_ns += v
                    .split_whitespace()
                    .next()
                    .and_then(|n| n.parse::<u64>().ok())
                    .unwrap_or(0)
            }
            _ => {}
        }
    }
    c.id = id?;
    amd.then_some(c)
}

/// `N`, `N KiB`, `N MiB` → bytes.
fn with_unit(v: &str) -> u64 {
    let mut it = v.split_whitespace();
    let n: u64 = it.next().and_then(|n| n.parse().ok()).unwrap_or(0);
    let mult = match it.next() {
        Some("KiB") => 1024,
        Some("MiB") => 1 << 20,
        Some("GiB") => 1 << 30,
        _ => 1,
    };
    n.saturating_mul(mult)
}

/// The current level of `pp_dpm_sclk` (`1: 1800Mhz *`), in MHz.
pub(crate) fn parse_sclk(s: &str) -> Option<f64> {
    let l = s.lines().find(|l| l.trim_end().ends_with('*'))?;
    let f = l.split_whitespace().nth(1)?;
    let digits: String = f.chars().take_while(|c| c.is_ascii_digit()).collect();
    digits.parse().ok()
}

fn opt_file(p: PathBuf) -> Option<CachedFile> {
    p.exists().then(|| CachedFile::whole(p))
}

fn first_hwmon(dev: &Path) -> Option<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(dev.join("hwmon"))
        .ok()?
        .flatten()
        .map(|e| e.path())
        .filter(|p| {
            p.file_name()
                .is_some_and(|n| n.to_string_lossy().starts_with("hwmon"))
        })
        .collect();
    v.sort();
    v.into_iter().next()
}

impl AmdCollector {
    /// None when the amdgpu driver is not loaded (or lists no card).
    pub fn new(roots: &Roots) -> Option<AmdCollector> {
        if !roots.sys.join("bus/pci/drivers/amdgpu").exists() {
            return None;
        }
        let drm = roots.sys.join("class/drm");
        let mut names: Vec<(u32, String)> = std::fs::read_dir(&drm)
            .ok()?
            .flatten()
            .filter_map(|e| {
                let n = e.file_name().into_string().ok()?;
                let i = n.strip_prefix("card")?.parse().ok()?;
                Some((i, n))
            })
            .collect();
        names.sort();
        let mut cards = Vec::new();
        for (_, name) in names {
            let dev = drm.join(&name).join("device");
            let is_amd = std::fs::read_link(dev.join("driver"))
                .is_ok_and(|t| t.file_name().is_some_and(|n| n == "amdgpu"));
            if !is_amd {
                continue;
            }
            let pdev = std::fs::read_link(&dev)
                .ok()
                .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()))
                .unwrap_or_else(|| name.clone());
            let dev_id = read_attr(&dev.join("device"));
            let mut base = GpuSample {
                device_type: "GPU".into(),
                uuid: read_attr(&dev.join("unique_id")),
                name: read_attr(&dev.join("product_name"))
                    .or_else(|| dev_id.as_ref().map(|d| format!("AMD GPU {d}"))),
                host_id: Some(pdev.clone()),
                ..Default::default()
            };
            base.detail.insert("driver".into(), "amdgpu".into());
            if let Some(d) = dev_id {
                base.detail.insert("pci_device_id".into(), d);
            }
            if let Some(v) = read_attr(&dev.join("vbios_version")) {
                base.detail.insert("vbios_version".into(), v);
            }
            let hw = first_hwmon(&dev);
            let power = hw.as_ref().and_then(|h| {
                opt_file(h.join("power1_average")).or_else(|| opt_file(h.join("power1_input")))
            });
            cards.push(Card {
                label: format!("AMD GPU {name} ({pdev})"),
                pdev,
                base,
                busy: opt_file(dev.join("gpu_busy_percent")),
                vram_total: opt_file(dev.join("mem_info_vram_total")),
                vram_used: opt_file(dev.join("mem_info_vram_used")),
                temp: hw.as_ref().and_then(|h| opt_file(h.join("temp1_input"))),
                power,
                sclk: opt_file(dev.join("pp_dpm_sclk")),
            });
        }
        if cards.is_empty() {
            return None;
        }
        Some(AmdCollector {
            proc: roots.proc.clone(),
            cards,
            prev_engine: HashMap::new(),
            prev_at: Instant::now(),
            buf: Vec::new(),
        })
    }

    pub fn device_count(&self) -> usize {
        self.cards.len()
    }

    pub fn sample(&mut self, tree: &HashSet<u32>, out: &mut Vec<GpuSample>) -> ProcessGpu {
        for c in &mut self.cards {
            let mut g = c.base.clone();
            let buf = &mut self.buf;
            let mut num = |f: &mut Option<CachedFile>, field: &str| -> Option<f64> {
                let f = f.as_mut()?;
                match f.read(buf) {
                    Ok(()) => {
                        let v = String::from_utf8_lossy(buf).trim().parse::<f64>().ok();
                        if v.is_none() {
                            warn_once(
                                &format!("amdgpu.{}.{field}", c.label),
                                format!(
                                    "{}: {} is not a number; {field} is null",
                                    c.label,
                                    f.path().display()
                                ),
                            );
                        }
                        v
                    }
                    Err(e) => {
                        warn_once(
                            &format!("amdgpu.{}.{field}", c.label),
                            format!(
                                "{}: cannot read {}: {e}; {field} is null",
                                c.label,
                                f.path().display()
                            ),
                        );
                        None
                    }
                }
            };
            g.utilization_pct = num(&mut c.busy, "utilization_pct");
            g.vram_total_bytes = num(&mut c.vram_total, "vram_total_bytes").map(|v| v as u64);
            g.vram_used_bytes = num(&mut c.vram_used, "vram_used_bytes").map(|v| v as u64);
            g.temperature_celsius = num(&mut c.temp, "temperature_celsius").map(|v| v / 1000.0);
            g.power_watts = num(&mut c.power, "power_watts").map(|v| v / 1e6);
            if let (Some(u), Some(t)) = (g.vram_used_bytes, g.vram_total_bytes) {
                g.vram_used_pct = pct(u, t);
            }
            if let Some(f) = c.sclk.as_mut() {
                g.frequency_mhz = f
                    .read(&mut self.buf)
                    .ok()
                    .and_then(|()| parse_sclk(&String::from_utf8_lossy(&self.buf)));
            }
            out.push(g);
        }
        let now = Instant::now();
        let elapsed_ns = now.duration_since(self.prev_at).as_nanos().max(1) as f64;
        self.prev_at = now;
        if tree.is_empty() {
            self.prev_engine.clear();
            return ProcessGpu::default();
        }
        let clients = self.tree_clients(tree);
        let mut vram = vec![0u64; self.cards.len()];
        let mut busy_ns = vec![0u64; self.cards.len()];
        for (&(card, id), c) in &clients {
            vram[card] += c.vram_bytes;
            if let Some(&prev) = self.prev_engine.get(&(card, id)) {
                busy_ns[card] += c.engine_ns.saturating_sub(prev);
            }
        }
        self.prev_engine = clients.into_iter().map(|(k, c)| (k, c.engine_ns)).collect();
        let mut r = ProcessGpu::default();
        for card in 0..self.cards.len() {
            let u = (busy_ns[card] as f64 / elapsed_ns).min(1.0);
            r.gpu_usage += u;
            r.gpu_vram_mib += vram[card] as f64 / 1048576.0;
            if u > 0.0 {
                r.gpu_utilized += 1;
            }
        }
        r
    }

    /// The amdgpu clients of the tree's processes, by (card index, client id).
    fn tree_clients(&self, tree: &HashSet<u32>) -> HashMap<(usize, u64), Client> {
        let mut out = HashMap::new();
        for pid in tree {
            let dir = self.proc.join(pid.to_string());
            // Processes come and go between the pid list and this read: skip quietly.
            let Ok(fds) = std::fs::read_dir(dir.join("fd")) else {
                continue;
            };
            for fd in fds.flatten() {
                // Only DRM files: one readlink per fd, the fdinfo only for those.
                let is_drm =
                    std::fs::read_link(fd.path()).is_ok_and(|t| t.starts_with("/dev/dri/"));
                if !is_drm {
                    continue;
                }
                let Ok(text) = std::fs::read_to_string(dir.join("fdinfo").join(fd.file_name()))
                else {
                    continue;
                };
                let Some(c) = parse_fdinfo(&text) else {
                    continue;
                };
                let card = match &c.pdev {
                    Some(p) => self.cards.iter().position(|k| &k.pdev == p),
                    None if self.cards.len() == 1 => Some(0),
                    None => None,
                };
                if let Some(card) = card {
                    out.insert((card, c.id), c);
                }
            }
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collect::testroot::TestRoot;

    #[test]
    fn no_driver_no_devices() {
        let t = TestRoot::new("amd-none");
        t.mkdir("sys/class/drm/card0/device");
        assert!(AmdCollector::new(&t.roots()).is_none());
        // The driver directory but no amdgpu card.
        t.mkdir("sys/bus/pci/drivers/amdgpu");
        t.symlink(
            "sys/class/drm/card0/device/driver",
            "../../../bus/pci/drivers/i915",
        );
        assert!(AmdCollector::new(&t.roots()).is_none());
    }

    fn lay_card(t: &TestRoot) {
        t.mkdir("sys/bus/pci/drivers/amdgpu");
        t.mkdir("sys/devices/pci0000:00/0000:03:00.0/hwmon/hwmon4");
        t.symlink(
            "sys/class/drm/card1/device",
            "../../../devices/pci0000:00/0000:03:00.0",
        );
        // A connector is not a card.
        t.mkdir("sys/class/drm/card1-DP-1");
        let d = "sys/devices/pci0000:00/0000:03:00.0";
        t.symlink(&format!("{d}/driver"), "../../../bus/pci/drivers/amdgpu");
        t.write(&format!("{d}/device"), "0x744c\n");
        t.write(&format!("{d}/product_name"), "AMD Radeon RX 7900 XTX\n");
        t.write(&format!("{d}/unique_id"), "a1b2c3d4e5f60718\n");
        t.write(&format!("{d}/gpu_busy_percent"), "37\n");
        t.write(&format!("{d}/mem_info_vram_total"), "25753026560\n");
        t.write(&format!("{d}/mem_info_vram_used"), "6438256640\n");
        t.write(&format!("{d}/hwmon/hwmon4/temp1_input"), "45000\n");
        t.write(&format!("{d}/hwmon/hwmon4/power1_average"), "61000000\n");
        t.write(
            &format!("{d}/pp_dpm_sclk"),
            "0: 500Mhz \n1: 1800Mhz *\n2: 2500Mhz \n",
        );
    }

    #[test]
    fn card_fields() {
        let t = TestRoot::new("amd-card");
        lay_card(&t);
        let mut c = AmdCollector::new(&t.roots()).expect("one card");
        assert_eq!(c.device_count(), 1);
        let mut out = Vec::new();
        let u = c.sample(&HashSet::new(), &mut out);
        assert_eq!(u, ProcessGpu::default());
        let g = &out[0];
        assert_eq!(g.name.as_deref(), Some("AMD Radeon RX 7900 XTX"));
        assert_eq!(g.uuid.as_deref(), Some("a1b2c3d4e5f60718"));
        assert_eq!(g.host_id.as_deref(), Some("0000:03:00.0"));
        assert_eq!(g.device_type, "GPU");
        assert_eq!(
            g.detail.get("pci_device_id").map(String::as_str),
            Some("0x744c")
        );
        assert_eq!(g.utilization_pct, Some(37.0));
        assert_eq!(g.vram_total_bytes, Some(25753026560));
        assert_eq!(g.vram_used_bytes, Some(6438256640));
        assert!((g.vram_used_pct.unwrap() - 6438256640.0 / 25753026560.0 * 100.0).abs() < 1e-9);
        assert_eq!(g.temperature_celsius, Some(45.0));
        assert_eq!(g.power_watts, Some(61.0));
        assert_eq!(g.frequency_mhz, Some(1800.0));
        assert_eq!(g.core_count, None);
        // A reading that changes is re-read; one that stops being a number is null.
        t.write(
            "sys/devices/pci0000:00/0000:03:00.0/gpu_busy_percent",
            "80\n",
        );
        t.write(
            "sys/devices/pci0000:00/0000:03:00.0/hwmon/hwmon4/temp1_input",
            "n/a\n",
        );
        out.clear();
        c.sample(&HashSet::new(), &mut out);
        assert_eq!(out[0].utilization_pct, Some(80.0));
        assert_eq!(out[0].temperature_celsius, None);
        assert_eq!(out[0].power_watts, Some(61.0));
    }

    fn fdinfo(id: u64, vram_kib: u64, gfx_ns: u64) -> String {
        format!(
            "pos:\t0\nflags:\t02100002\nmnt_id:\t26\ndrm-driver:\tamdgpu\n\
             drm-pdev:\t0000:03:00.0\ndrm-client-id:\t{id}\ndrm-memory-vram:\t{vram_kib} KiB\n\
             drm-memory-gtt:\t2048 KiB\ndrm-engine-gfx:\t{gfx_ns} ns\ndrm-engine-compute:\t0 ns\n"
        )
    }

    #[test]
    fn fdinfo_parsing() {
        let c = parse_fdinfo(&fdinfo(7, 1024, 5000)).unwrap();
        assert_eq!(
            c,
            Client {
                pdev: Some("0000:03:00.0".into()),
                id: 7,
                vram_bytes: 1 << 20,
                engine_ns: 5000
            }
        );
        assert!(parse_fdinfo("drm-driver:\ti915\ndrm-client-id:\t3\n").is_none());
        assert!(parse_fdinfo("pos:\t0\nflags:\t0100002\n").is_none());
        assert_eq!(parse_sclk("0: 500Mhz *\n1: 900Mhz\n"), Some(500.0));
        assert_eq!(parse_sclk("0: 500Mhz\n"), None);
    }

    #[test]
    fn tree_use_from_fdinfo() {
        let t = TestRoot::new("amd-fdinfo");
        lay_card(&t);
        // Pid 100 (in the tree) holds client 7 through two fds, plus a plain file;
        // pid 200 (outside) holds client 9.
        for (pid, fd, target) in [
            (100, 3, "/dev/dri/renderD128"),
            (100, 4, "/dev/dri/renderD128"),
            (100, 5, "/home/x/data.bin"),
            (200, 3, "/dev/dri/renderD128"),
        ] {
            t.symlink(&format!("proc/{pid}/fd/{fd}"), target);
        }
        let write = |gfx7: u64, gfx9: u64| {
            t.write("proc/100/fdinfo/3", &fdinfo(7, 2048, gfx7));
            t.write("proc/100/fdinfo/4", &fdinfo(7, 2048, gfx7));
            t.write("proc/100/fdinfo/5", "pos:\t0\nflags:\t0100002\n");
            t.write("proc/200/fdinfo/3", &fdinfo(9, 4096, gfx9));
        };
        write(1_000_000_000, 0);
        let mut c = AmdCollector::new(&t.roots()).unwrap();
        let tree: HashSet<u32> = [100].into();
        let mut out = Vec::new();
        // First sighting: VRAM counts (once per client), engine time is a baseline.
        let u = c.sample(&tree, &mut out);
        assert_eq!(u.gpu_vram_mib, 2.0);
        assert_eq!(u.gpu_usage, 0.0);
        assert_eq!(u.gpu_utilized, 0);
        // 50 ms of gfx time over the next interval.
        std::thread::sleep(std::time::Duration::from_millis(100));
        write(1_050_000_000, 9_000_000_000);
        let t0 = Instant::now();
        let u = c.sample(&tree, &mut out);
        let max_elapsed = 0.100 + t0.elapsed().as_secs_f64() + 0.5;
        assert_eq!(u.gpu_vram_mib, 2.0);
        assert_eq!(u.gpu_utilized, 1);
        // 0.05 s busy over an elapsed of ≥ 0.1 s: at most 0.5, and not by much less.
        assert!(u.gpu_usage <= 0.5 + 1e-9, "{u:?}");
        assert!(u.gpu_usage >= 0.05 / max_elapsed, "{u:?}");
        // A pid that has gone is skipped.
        let tree: HashSet<u32> = [100, 4242].into();
        let u = c.sample(&tree, &mut out);
        assert_eq!(u.gpu_vram_mib, 2.0);
        assert_eq!(u.gpu_usage, 0.0);
    }
}
