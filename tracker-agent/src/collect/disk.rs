//! Whole-disk block devices: static facts from /sys/block, I/O from
//! /proc/diskstats and the space of the filesystems mounted on them. Stacked
//! devices (dm, md) are not listed; their filesystems count on their first leaf
//! disk, so no device or filesystem is counted twice.

use std::{
    collections::{BTreeMap, HashMap},
    ffi::{CStr, CString, OsStr},
    fs,
    os::{
        fd::AsRawFd,
        unix::{ffi::OsStrExt, fs::FileTypeExt, fs::MetadataExt},
    },
    path::{Path, PathBuf},
    time::Instant,
};

use super::{read_attr, CachedFile, Roots};
use crate::{
    model::sample::{DiskSample, MountSample},
    warn::warn_once,
};

/// /proc/diskstats counts 512-byte sectors whatever the device's sector size.
const SECTOR: u64 = 512;

/// How deep a dm/md stack is followed (real stacks are 2–3 deep).
const MAX_STACK: usize = 8;

struct Disk {
    /// Static facts; counters, rates and mounts are filled per sample.
    info: DiskSample,
    /// Bytes read, written in the previous reading.
    prev: Option<(u64, u64)>,
    cur: Option<(u64, u64)>,
}

/// A filesystem kept after de-duplication, with the disk it counts on.
struct Mount {
    disk: String,
    mount_point: String,
    path: CString,
    filesystem: String,
}

pub struct DiskCollector {
    sys: PathBuf,
    stats: CachedFile,
    buf: Vec<u8>,
    mountinfo: CachedFile,
    mountinfo_buf: Vec<u8>,
    disks: BTreeMap<String, Disk>,
    /// Hash of the device names in diskstats: a change means devices came or went.
    names_hash: Option<u64>,
    scanned: bool,
    mounts: Vec<Mount>,
    prev_at: Option<Instant>,
}

impl DiskCollector {
    pub fn new(roots: &Roots) -> DiskCollector {
        DiskCollector {
            sys: roots.sys.clone(),
            stats: CachedFile::records(roots.proc.join("diskstats")),
            buf: Vec::new(),
            mountinfo: CachedFile::records(roots.proc.join("self/mountinfo")),
            mountinfo_buf: Vec::new(),
            disks: BTreeMap::new(),
            names_hash: None,
            scanned: false,
            mounts: Vec::new(),
            prev_at: None,
        }
    }

    /// Disks sorted by name, each with its mounts sorted by mount point.
    pub fn sample(&mut self) -> Vec<DiskSample> {
        let stats_ok = match self.stats.read(&mut self.buf) {
            Ok(()) => true,
            Err(e) => {
                warn_once(
                    "collect.disk.diskstats",
                    format!(
                        "cannot read {}: {e}; disk I/O counters and rates are null",
                        self.stats.path().display()
                    ),
                );
                false
            }
        };
        let now = Instant::now();
        let hash = stats_ok.then(|| names_hash(&self.buf));
        let changed = self.mounts_changed() || (hash.is_some() && hash != self.names_hash);
        if !self.scanned || changed {
            self.rescan();
            self.read_mounts();
            self.scanned = true;
        }
        if hash.is_some() {
            self.names_hash = hash;
        }

        for d in self.disks.values_mut() {
            d.cur = None;
        }
        if stats_ok {
            for line in self.buf.split(|&b| b == b'\n') {
                if let Some((name, rd, wr)) = parse_diskstats(line) {
                    if let Some(d) = self.disks.get_mut(name) {
                        d.cur = Some((rd.saturating_mul(SECTOR), wr.saturating_mul(SECTOR)));
                    }
                }
            }
        }
        let elapsed = self
            .prev_at
            .map(|t| now.duration_since(t).as_secs_f64())
            .filter(|&e| e > 0.0);
        self.prev_at = stats_ok.then_some(now);

        let mut out = Vec::with_capacity(self.disks.len());
        for (name, d) in &mut self.disks {
            let mut s = d.info.clone();
            for m in self.mounts.iter().filter(|m| m.disk == *name) {
                if let Some(ms) = mount_usage(m) {
                    s.mounts.push(ms);
                }
            }
            if let Some((rd, wr)) = d.cur {
                s.read_bytes_total = Some(rd);
                s.write_bytes_total = Some(wr);
                if let (Some((prd, pwr)), Some(e)) = (d.prev, elapsed) {
                    // A counter that went backwards gives 0, not a spike.
                    let (dr, dw) = (rd.saturating_sub(prd), wr.saturating_sub(pwr));
                    s.read_bytes = Some(dr);
                    s.write_bytes = Some(dw);
                    s.read_bytes_per_sec = Some(dr as f64 / e);
                    s.write_bytes_per_sec = Some(dw as f64 / e);
                }
            }
            d.prev = d.cur;
            out.push(s);
        }
        out
    }

    /// Whether the mount table changed since the last poll: the kernel flags
    /// POLLPRI|POLLERR on an open mountinfo then. Not pollable (a test tree's
    /// regular file, not yet open) → false.
    fn mounts_changed(&self) -> bool {
        let Some(f) = self.mountinfo.file() else {
            return false;
        };
        let mut p = libc::pollfd {
            fd: f.as_raw_fd(),
            events: libc::POLLPRI | libc::POLLERR,
            revents: 0,
        };
        // SAFETY: one valid pollfd, timeout 0.
        let n = unsafe { libc::poll(&mut p, 1, 0) };
        n > 0 && p.revents & (libc::POLLPRI | libc::POLLERR) != 0
    }

    /// Re-lists /sys/block: keeps known disks, probes new names, drops gone ones.
    fn rescan(&mut self) {
        let dir = self.sys.join("block");
        let entries = match fs::read_dir(&dir) {
            Ok(e) => e,
            Err(e) => {
                warn_once(
                    "collect.disk.block",
                    format!("cannot list {}: {e}; disk is empty", dir.display()),
                );
                self.disks.clear();
                return;
            }
        };
        let mut kept = BTreeMap::new();
        for name in entries.filter_map(|e| e.ok()?.file_name().into_string().ok()) {
            if ["loop", "ram", "zram"].iter().any(|p| name.starts_with(p)) {
                continue;
            }
            let disk = match self.disks.remove(&name) {
                Some(d) => Some(d),
                None => probe(&dir.join(&name), &name),
            };
            if let Some(d) = disk {
                kept.insert(name, d);
            }
        }
        self.disks = kept;
    }

    /// Re-reads the mount table and maps each filesystem to a listed disk.
    fn read_mounts(&mut self) {
        self.mounts.clear();
        if let Err(e) = self.mountinfo.read(&mut self.mountinfo_buf) {
            warn_once(
                "collect.disk.mountinfo",
                format!(
                    "cannot read {}: {e}; disk mounts are empty",
                    self.mountinfo.path().display()
                ),
            );
            return;
        }
        // One mount per device: bind mounts and btrfs subvolumes of the same
        // filesystem would count its space twice.
        let mut best: HashMap<(u32, u32), MountLine> = HashMap::new();
        for line in self.mountinfo_buf.split(|&b| b == b'\n') {
            let Some(m) = parse_mountinfo(line) else {
                continue;
            };
            let Some(dev) = device_of(&m) else { continue };
            match best.get(&dev) {
                Some(old) if !m.better_than(old) => {}
                _ => {
                    best.insert(dev, m);
                }
            }
        }
        for (dev, m) in best {
            let Some(disk) = leaf_disk(&self.sys, dev, &self.disks) else {
                continue;
            };
            let Ok(path) = CString::new(m.mount_point.clone()) else {
                continue;
            };
            self.mounts.push(Mount {
                disk,
                mount_point: String::from_utf8_lossy(&m.mount_point).into_owned(),
                path,
                filesystem: m.fstype,
            });
        }
        self.mounts
            .sort_by(|a, b| a.mount_point.cmp(&b.mount_point));
    }
}

/// Facts of a /sys/block entry; None when it is not a disk to list.
fn probe(dir: &Path, name: &str) -> Option<Disk> {
    let size: Option<u64> = read_attr(&dir.join("size")).and_then(|s| s.parse().ok());
    if size == Some(0) {
        return None; // empty drive, unconfigured dm/md/nbd
    }
    if size.is_none() {
        warn_once(
            "collect.disk.size",
            format!(
                "cannot read {}; capacity_bytes is null",
                dir.join("size").display()
            ),
        );
    }
    // Hidden: per-path nodes of NVMe multipath; the head device carries the I/O.
    if read_attr(&dir.join("hidden")).as_deref() == Some("1") || has_entries(&dir.join("slaves")) {
        return None;
    }
    let serial = ["device/serial", "serial", "device/wwid", "wwid"]
        .iter()
        .find_map(|f| read_attr(&dir.join(f)));
    let device_type = if name.starts_with("nvme") {
        Some("nvme".to_string())
    } else {
        match read_attr(&dir.join("queue/rotational")).as_deref() {
            Some("0") => Some("ssd".to_string()),
            Some("1") => Some("hdd".to_string()),
            _ => None,
        }
    };
    Some(Disk {
        info: DiskSample {
            device: name.to_string(),
            model: read_attr(&dir.join("device/model")),
            vendor: read_attr(&dir.join("device/vendor")),
            serial,
            device_type,
            capacity_bytes: size.map(|s| s.saturating_mul(SECTOR)),
            ..Default::default()
        },
        prev: None,
        cur: None,
    })
}

fn has_entries(dir: &Path) -> bool {
    fs::read_dir(dir).is_ok_and(|mut d| d.next().is_some())
}

/// Sorted entry names of a directory; empty when missing.
fn entry_names(dir: &Path) -> Vec<String> {
    let mut v: Vec<String> = fs::read_dir(dir)
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().into_string().ok())
                .collect()
        })
        .unwrap_or_default();
    v.sort();
    v
}

/// The disk of a resolved sysfs block directory: a partition's is the directory
/// above it.
fn whole_disk(p: &Path) -> Option<String> {
    let disk = if p.join("partition").exists() {
        p.parent()?
    } else {
        p
    };
    Some(disk.file_name()?.to_string_lossy().into_owned())
}

/// The listed disk a filesystem on device `dev` counts on: the device's whole
/// disk, or for a stacked device the first (sorted) listed leaf under it.
fn leaf_disk(sys: &Path, dev: (u32, u32), disks: &BTreeMap<String, Disk>) -> Option<String> {
    let p = fs::canonicalize(sys.join(format!("dev/block/{}:{}", dev.0, dev.1))).ok()?;
    let mut leaves = Vec::new();
    collect_leaves(sys, &whole_disk(&p)?, 0, &mut leaves);
    leaves.into_iter().filter(|l| disks.contains_key(l)).min()
}

fn collect_leaves(sys: &Path, name: &str, depth: usize, out: &mut Vec<String>) {
    let slaves = entry_names(&sys.join("block").join(name).join("slaves"));
    if slaves.is_empty() {
        out.push(name.to_string());
        return;
    }
    if depth >= MAX_STACK {
        return;
    }
    for s in slaves {
        // A slave may be a partition: class/block has every block device.
        if let Some(w) = fs::canonicalize(sys.join("class/block").join(&s))
            .ok()
            .and_then(|p| whole_disk(&p))
        {
            collect_leaves(sys, &w, depth + 1, out);
        }
    }
}

/// Name, sectors read, sectors written of one diskstats line.
fn parse_diskstats(line: &[u8]) -> Option<(&str, u64, u64)> {
    let mut it = std::str::from_utf8(line).ok()?.split_ascii_whitespace();
    let name = it.nth(2)?;
    let rd = it.nth(2)?.parse().ok()?; // column 5
    let wr = it.nth(3)?.parse().ok()?; // column 9
    Some((name, rd, wr))
}

/// FNV-1a over the device names of diskstats.
fn names_hash(buf: &[u8]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for line in buf.split(|&b| b == b'\n') {
        let name = line
            .split(|b| b.is_ascii_whitespace())
            .filter(|f| !f.is_empty())
            .nth(2)
            .unwrap_or_default();
        for &b in name.iter().chain(b"\n") {
            h = (h ^ u64::from(b)).wrapping_mul(0x0100_0000_01b3);
        }
    }
    h
}

struct MountLine {
    majmin: (u32, u32),
    root_is_slash: bool,
    mount_point: Vec<u8>,
    fstype: String,
    source: Vec<u8>,
}

impl MountLine {
    /// Preferred over `other` for the same device: the mount of the filesystem's
    /// root, then the shortest mount point.
    fn better_than(&self, other: &MountLine) -> bool {
        (!self.root_is_slash, self.mount_point.len())
            < (!other.root_is_slash, other.mount_point.len())
    }
}

/// `id parent maj:min root mount_point options [optional...] - fstype source super`.
fn parse_mountinfo(line: &[u8]) -> Option<MountLine> {
    let mut it = line.split(|&b| b == b' ');
    let majmin = std::str::from_utf8(it.nth(2)?).ok()?;
    let (maj, min) = majmin.split_once(':')?;
    let majmin = (maj.parse().ok()?, min.parse().ok()?);
    let root = it.next()?;
    let mount_point = unescape(it.next()?);
    it.next()?; // options
    while it.next()? != b"-" {}
    let fstype = String::from_utf8_lossy(it.next()?).into_owned();
    let source = unescape(it.next()?);
    Some(MountLine {
        majmin,
        root_is_slash: root == b"/",
        mount_point,
        fstype,
        source,
    })
}

/// Undoes mountinfo's octal escapes (`\040` space, `\011` tab, `\012`, `\134`).
fn unescape(s: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(s.len());
    let mut i = 0;
    while i < s.len() {
        if s[i] == b'\\'
            && i + 3 < s.len()
            && s[i + 1..i + 4].iter().all(|c| (b'0'..=b'7').contains(c))
        {
            let v = s[i + 1..i + 4]
                .iter()
                .fold(0u32, |a, &c| a * 8 + u32::from(c - b'0'));
            out.push(v as u8);
            i += 4;
        } else {
            out.push(s[i]);
            i += 1;
        }
    }
    out
}

/// The block device of a mount: its /dev source's device number (btrfs shows an
/// anonymous 0:N in mountinfo), else the mountinfo one; None for pseudo
/// filesystems (major 0 and no /dev source).
fn device_of(m: &MountLine) -> Option<(u32, u32)> {
    if m.source.starts_with(b"/dev/") {
        if let Ok(md) = fs::metadata(OsStr::from_bytes(&m.source)) {
            if md.file_type().is_block_device() {
                return Some((libc::major(md.rdev()), libc::minor(md.rdev())));
            }
        }
    }
    (m.majmin.0 != 0).then_some(m.majmin)
}

/// Space of one mount as df shows it; None (with a warning) when statvfs fails.
fn mount_usage(m: &Mount) -> Option<MountSample> {
    let st = match statvfs(&m.path) {
        Ok(st) => st,
        Err(e) => {
            warn_once(
                &format!("collect.disk.statvfs.{}", m.mount_point),
                format!("statvfs {}: {e}; mount left out", m.mount_point),
            );
            return None;
        }
    };
    #[allow(clippy::unnecessary_cast)] // the field types differ between targets
    let (blocks, bfree, bavail, frsize) = (
        st.f_blocks as u64,
        st.f_bfree as u64,
        st.f_bavail as u64,
        st.f_frsize as u64,
    );
    if blocks == 0 {
        return None; // nothing to report (autofs-like placeholders)
    }
    let used = blocks.saturating_sub(bfree).saturating_mul(frsize);
    let available = bavail.saturating_mul(frsize);
    let used_pct = if used + available == 0 {
        0.0
    } else {
        used as f64 / (used + available) as f64 * 100.0
    };
    Some(MountSample {
        mount_point: m.mount_point.clone(),
        filesystem: m.filesystem.clone(),
        total_bytes: blocks.saturating_mul(frsize),
        used_bytes: used,
        available_bytes: available,
        used_pct,
    })
}

fn statvfs(path: &CStr) -> std::io::Result<libc::statvfs> {
    // SAFETY: zeroed is a valid statvfs; path is NUL-terminated.
    let mut st: libc::statvfs = unsafe { std::mem::zeroed() };
    // SAFETY: valid path and out pointer.
    if unsafe { libc::statvfs(path.as_ptr(), &mut st) } != 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(st)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collect::testroot::TestRoot;

    const PCI: &str = "devices/pci0000:00/0000:00:02.0/virtio1/block";
    const SATA: &str = "devices/pci0000:00/0000:00:1f.2/ata1/host0/target0:0:0/0:0:0:0/block";

    /// A /sys/block entry `name` whose real directory is `{parent}/{name}`.
    fn block(t: &TestRoot, parent: &str, name: &str, majmin: &str, sectors: u64, rot: &str) {
        let d = format!("sys/{parent}/{name}");
        t.write(&format!("{d}/size"), &format!("{sectors}\n"));
        t.write(&format!("{d}/dev"), &format!("{majmin}\n"));
        t.write(&format!("{d}/queue/rotational"), &format!("{rot}\n"));
        t.mkdir(&format!("{d}/slaves"));
        t.symlink(&format!("sys/block/{name}"), &format!("../{parent}/{name}"));
        t.symlink(
            &format!("sys/class/block/{name}"),
            &format!("../../{parent}/{name}"),
        );
        t.symlink(
            &format!("sys/dev/block/{majmin}"),
            &format!("../../{parent}/{name}"),
        );
    }

    /// Partition `part` (number n) of disk `disk` living under `parent`.
    fn partition(t: &TestRoot, parent: &str, disk: &str, part: &str, n: u32, majmin: &str) {
        let d = format!("sys/{parent}/{disk}/{part}");
        t.write(&format!("{d}/partition"), &format!("{n}\n"));
        t.write(&format!("{d}/size"), "2048\n");
        t.write(&format!("{d}/dev"), &format!("{majmin}\n"));
        t.symlink(
            &format!("sys/class/block/{part}"),
            &format!("../../{parent}/{disk}/{part}"),
        );
        t.symlink(
            &format!("sys/dev/block/{majmin}"),
            &format!("../../{parent}/{disk}/{part}"),
        );
    }

    /// `slave` (a partition or disk name) under `dev`'s slaves/ directory.
    fn slave(t: &TestRoot, dev_dir: &str, slave: &str, slave_dir: &str) {
        t.symlink(
            &format!("sys/{dev_dir}/slaves/{slave}"),
            &format!("../../../../../{slave_dir}"),
        );
    }

    /// A tree with: vda (virtio, hdd) with / on it; sda (ssd) with partitions
    /// sda1 (/boot) and sda2 → dm-0 (LVM, /data and a bind mount of it);
    /// nvme0n1 unmounted; loop0, zram0, sr0 (size 0) not listed.
    fn layout(t: &TestRoot) -> std::path::PathBuf {
        block(t, PCI, "vda", "254:0", 536870912, "1");
        t.write(&format!("sys/{PCI}/vda/device/vendor"), "0x1af4\n");
        t.write(&format!("sys/{PCI}/vda/serial"), "overlayblk0\n");
        block(t, SATA, "sda", "8:0", 1000215216, "0");
        t.write(
            &format!("sys/{SATA}/sda/device/model"),
            "Samsung SSD 860  \n",
        );
        t.write(&format!("sys/{SATA}/sda/device/vendor"), "ATA     \n");
        t.write(&format!("sys/{SATA}/sda/device/serial"), "   \n");
        t.write(
            &format!("sys/{SATA}/sda/device/wwid"),
            "naa.5002538e40a1b2c3\n",
        );
        partition(t, SATA, "sda", "sda1", 1, "8:1");
        partition(t, SATA, "sda", "sda2", 2, "8:2");
        let nv = "devices/pci0000:00/0000:00:04.0/nvme/nvme0";
        block(t, nv, "nvme0n1", "259:0", 1953525168, "0");
        t.write(
            &format!("sys/{nv}/nvme0n1/device/model"),
            "WD_BLACK SN850X\n",
        );
        t.write(&format!("sys/{nv}/nvme0n1/device/serial"), "23096S801234\n");
        block(t, "devices/virtual/block", "dm-0", "253:0", 409600, "0");
        slave(
            t,
            "devices/virtual/block/dm-0",
            "sda2",
            &format!("{SATA}/sda/sda2"),
        );
        block(t, "devices/virtual/block", "loop0", "7:0", 1024, "1");
        block(t, "devices/virtual/block", "zram0", "252:0", 8192, "0");
        block(t, SATA, "sr0", "11:0", 0, "1");

        // Real directories to statvfs (the test tree's own filesystem).
        let mnt = t.path("mnt");
        for d in ["root", "boot", "data", "bind", "with space"] {
            std::fs::create_dir_all(mnt.join(d)).unwrap();
        }
        let m = mnt.display();
        t.write(
            "proc/self/mountinfo",
            &format!(
                "22 27 0:21 / /proc rw,relatime - proc proc rw\n\
                 25 24 0:23 / /dev/shm rw,relatime - tmpfs tmpfs rw,size=24684092k\n\
                 27 1 254:0 / {m}/root rw,relatime shared:1 - ext4 /dev/collect-test/vda rw\n\
                 28 27 8:1 / {m}/boot rw,relatime shared:2 - vfat /dev/collect-test/sda1 rw\n\
                 29 27 253:0 / {m}/data rw,relatime shared:3 - xfs /dev/collect-test/mapper/vg-data rw\n\
                 30 27 253:0 /sub {m}/bind rw,relatime shared:3 - xfs /dev/collect-test/mapper/vg-data rw\n\
                 31 27 7:0 / {m}/with\\040space rw - squashfs /dev/collect-test/loop0 ro\n\
                 garbage line\n\
                 32 27 0:40 / /run/user tmpfs\n",
            ),
        );
        t.write(
            "proc/diskstats",
            "   7       0 loop0 10 0 80 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n\
             \x20254       0 vda 292591 16783 39020458 605463 18722 61801 22427224 101828 0 42760 710210 17957 50 5731480 2908 269 11\n\
             \x20  8       0 sda 100 0 2000 10 50 0 4000 5 0 10 15 0 0 0 0 0 0\n\
             \x20  8       1 sda1 10 0 200 1 5 0 400 1 0 1 2 0 0 0 0 0 0\n\
             \x20  8       2 sda2 90 0 1800 9 45 0 3600 4 0 9 13 0 0 0 0 0 0\n\
             \x20259       0 nvme0n1 1 0 8 0 0 0 0 0 0 0 0\n\
             \x20253       0 dm-0 90 0 1800 9 45 0 3600 4 0 9 13 0 0 0 0 0 0\n\
             \x20252       0 zram0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n\
             \x20 11       0 sr0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0 0\n\
             \x20  1 bad\n",
        );
        mnt
    }

    #[test]
    fn disks_mounts_and_rates() {
        let t = TestRoot::new("disk");
        let mnt = layout(&t);
        let m = mnt.display().to_string();
        let mut c = DiskCollector::new(&t.roots());
        let first = c.sample();
        let names: Vec<_> = first.iter().map(|d| d.device.as_str()).collect();
        assert_eq!(names, ["nvme0n1", "sda", "vda"]);
        assert!(first.iter().all(|d| d.read_bytes_per_sec.is_none()));

        let nv = &first[0];
        assert_eq!(nv.device_type.as_deref(), Some("nvme"));
        assert_eq!(nv.model.as_deref(), Some("WD_BLACK SN850X"));
        assert_eq!(nv.serial.as_deref(), Some("23096S801234"));
        assert_eq!(nv.capacity_bytes, Some(1953525168 * 512));
        assert!(nv.mounts.is_empty());
        assert_eq!(
            (nv.read_bytes_total, nv.write_bytes_total),
            (Some(8 * 512), Some(0))
        );

        let sda = &first[1];
        assert_eq!(sda.device_type.as_deref(), Some("ssd"));
        assert_eq!(sda.model.as_deref(), Some("Samsung SSD 860"));
        assert_eq!(sda.vendor.as_deref(), Some("ATA"));
        // Blank serial falls through to the WWID.
        assert_eq!(sda.serial.as_deref(), Some("naa.5002538e40a1b2c3"));
        assert_eq!(sda.read_bytes_total, Some(2000 * 512));
        assert_eq!(sda.write_bytes_total, Some(4000 * 512));
        // The partition mount and the dm device's mount (its bind mount once).
        let mps: Vec<_> = sda.mounts.iter().map(|x| x.mount_point.clone()).collect();
        assert_eq!(mps, [format!("{m}/boot"), format!("{m}/data")]);
        assert_eq!(sda.mounts[0].filesystem, "vfat");
        assert_eq!(sda.mounts[1].filesystem, "xfs");
        let u = &sda.mounts[0];
        assert!(u.total_bytes > 0 && u.total_bytes >= u.used_bytes);
        let pct = u.used_bytes as f64 / (u.used_bytes + u.available_bytes) as f64 * 100.0;
        assert!((u.used_pct - pct).abs() < 1e-9);

        let vda = &first[2];
        assert_eq!(vda.device_type.as_deref(), Some("hdd"));
        assert_eq!(vda.vendor.as_deref(), Some("0x1af4"));
        assert!(vda.model.is_none());
        assert_eq!(vda.serial.as_deref(), Some("overlayblk0"));
        assert_eq!(vda.mounts.len(), 1);
        assert_eq!(vda.mounts[0].mount_point, format!("{m}/root"));
        assert_eq!(vda.read_bytes_total, Some(39020458 * 512));

        // Second reading: vda +1000 sectors read, +2000 written over a set 2 s.
        c.prev_at = Some(Instant::now() - std::time::Duration::from_secs(2));
        let stats = fs::read_to_string(t.path("proc/diskstats"))
            .unwrap()
            .replace(
                "vda 292591 16783 39020458 605463 18722 61801 22427224",
                "vda 292600 16783 39021458 605463 18730 61801 22429224",
            );
        t.write("proc/diskstats", &stats);
        let s = c.sample();
        let r = s[2].read_bytes_per_sec.unwrap();
        let w = s[2].write_bytes_per_sec.unwrap();
        assert!((r - 256_000.0).abs() < 500.0, "{r}");
        assert!((w - 512_000.0).abs() < 1000.0, "{w}");
        assert_eq!(s[1].read_bytes_per_sec, Some(0.0));
    }

    #[test]
    fn escaped_mount_point_and_bind_mounts() {
        let line = b"31 27 8:1 / /mnt/with\\040space\\011tab\\134 rw shared:5 master:2 - ext4 /dev/sda1 rw";
        let m = parse_mountinfo(line).unwrap();
        assert_eq!(m.mount_point, b"/mnt/with space\ttab\\");
        assert_eq!(m.majmin, (8, 1));
        assert_eq!(m.fstype, "ext4");
        assert_eq!(m.source, b"/dev/sda1");
        assert!(m.root_is_slash);
        assert!(parse_mountinfo(b"31 27 8:1 / /x rw").is_none());
        assert!(parse_mountinfo(b"31 27 x:1 / /x rw - ext4 /dev/sda1 rw").is_none());
        assert_eq!(unescape(b"a\\04"), b"a\\04");

        // A space in the mount point reaches statvfs unescaped.
        let t = TestRoot::new("diskesc");
        block(&t, PCI, "vda", "254:0", 1000, "1");
        let dir = t.path("mnt/with space");
        fs::create_dir_all(&dir).unwrap();
        let esc = t.path("mnt").display().to_string() + "/with\\040space";
        // The bind mount (root /x) comes first and has the shorter path: the
        // filesystem root's mount wins anyway.
        t.write(
            "proc/self/mountinfo",
            &format!(
                "40 1 254:0 /x / rw - ext4 /dev/collect-test/vda rw\n\
                 41 1 254:0 / {esc} rw - ext4 /dev/collect-test/vda rw\n"
            ),
        );
        t.write("proc/diskstats", " 254 0 vda 1 0 2 0 1 0 2 0 0 0 0\n");
        let s = DiskCollector::new(&t.roots()).sample();
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].mounts.len(), 1);
        assert_eq!(s[0].mounts[0].mount_point, dir.display().to_string());
    }

    #[test]
    fn missing_sources() {
        let t = TestRoot::new("disk2");
        let mut c = DiskCollector::new(&t.roots());
        assert!(c.sample().is_empty());
        // /sys/block without diskstats or mountinfo: listed, counters null, no mounts.
        block(&t, PCI, "vda", "254:0", 1000, "1");
        let mut c = DiskCollector::new(&t.roots());
        let s = c.sample();
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].read_bytes_total, None);
        assert!(s[0].read_bytes_per_sec.is_none() && s[0].mounts.is_empty());
        assert!(s[0].model.is_none() && s[0].serial.is_none());
        assert_eq!(s[0].capacity_bytes, Some(512_000));
        let s = c.sample();
        assert!(s[0].read_bytes_per_sec.is_none());
    }

    #[test]
    fn devices_appearing_and_vanishing() {
        let t = TestRoot::new("disk3");
        block(&t, PCI, "vda", "254:0", 1000, "1");
        t.write("proc/diskstats", " 254 0 vda 1 0 2 0 1 0 2 0 0 0 0\n");
        let mut c = DiskCollector::new(&t.roots());
        assert_eq!(c.sample().len(), 1);
        block(&t, SATA, "sdb", "8:16", 1000, "0");
        t.write(
            "proc/diskstats",
            " 254 0 vda 1 0 4 0 1 0 2 0 0 0 0\n   8 16 sdb 1 0 2 0 1 0 2 0 0 0 0\n",
        );
        let s = c.sample();
        assert_eq!(s.len(), 2);
        assert!(s[0].read_bytes_per_sec.is_none(), "new device: no rate");
        assert!(s[1].read_bytes_per_sec.is_some());
        t.remove("sys/block/vda");
        t.write("proc/diskstats", "   8 16 sdb 1 0 2 0 1 0 2 0 0 0 0\n");
        let s = c.sample();
        assert_eq!(s.len(), 1);
        assert_eq!(s[0].device, "sdb");
    }

    #[test]
    fn kernel_flags_mount_table_changes() {
        let mut c = DiskCollector::new(&Roots::default());
        c.sample();
        assert!(!c.mounts_changed());
        let dir = std::env::temp_dir().join(format!("collect-poll-{}", std::process::id()));
        fs::create_dir_all(&dir).unwrap();
        let target = CString::new(dir.as_os_str().as_bytes()).unwrap();
        // SAFETY: NUL-terminated strings; tmpfs needs no data.
        let r = unsafe {
            libc::mount(
                c"none".as_ptr(),
                target.as_ptr(),
                c"tmpfs".as_ptr(),
                0,
                std::ptr::null(),
            )
        };
        if r != 0 {
            eprintln!("mount refused (not root?): skipped");
            let _ = fs::remove_dir(&dir);
            return;
        }
        let changed = c.mounts_changed();
        // SAFETY: as above.
        unsafe { libc::umount(target.as_ptr()) };
        let _ = fs::remove_dir(&dir);
        assert!(changed);
        // Consumed by the poll; the umount is the next change.
        assert!(c.mounts_changed());
        assert!(!c.mounts_changed());
    }
}
