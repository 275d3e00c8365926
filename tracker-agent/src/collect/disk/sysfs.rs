//! /sys/block: which entries are disks to list, their static facts, and the disk
//! a (possibly stacked, dm/md) device counts on.

use std::{collections::BTreeMap, fs, path::Path};

use super::device::{Disk, MAX_STACK, SECTOR};
use crate::{collect::files::read_attr, model::sample::DiskSample, warn::warn_once};

/// Facts of a /sys/block entry; None when it is not a disk to list.
pub(super) fn probe(dir: &Path, name: &str) -> Option<Disk> {
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

pub(super) fn has_entries(dir: &Path) -> bool {
    fs::read_dir(dir).is_ok_and(|mut d| d.next().is_some())
}

/// Sorted entry names of a directory; empty when missing.
pub(super) fn entry_names(dir: &Path) -> Vec<String> {
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
pub(super) fn whole_disk(p: &Path) -> Option<String> {
    let disk = if p.join("partition").exists() {
        p.parent()?
    } else {
        p
    };
    Some(disk.file_name()?.to_string_lossy().into_owned())
}

/// The listed disk a filesystem on device `dev` counts on: the device's whole
/// disk, or for a stacked device the first (sorted) listed leaf under it.
pub(super) fn leaf_disk(
    sys: &Path,
    dev: (u32, u32),
    disks: &BTreeMap<String, Disk>,
) -> Option<String> {
    let p = fs::canonicalize(sys.join(format!("dev/block/{}:{}", dev.0, dev.1))).ok()?;
    let mut leaves = Vec::new();
    collect_leaves(sys, &whole_disk(&p)?, 0, &mut leaves);
    leaves.into_iter().filter(|l| disks.contains_key(l)).min()
}

pub(super) fn collect_leaves(sys: &Path, name: &str, depth: usize, out: &mut Vec<String>) {
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
