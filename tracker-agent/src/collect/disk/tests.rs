use std::os::unix::ffi::OsStrExt;

use super::*;
use crate::collect::files::unescape;
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
    let line =
        b"31 27 8:1 / /mnt/with\\040space\\011tab\\134 rw shared:5 master:2 - ext4 /dev/sda1 rw";
    let m = crate::collect::mountinfo::parse_line(line).unwrap();
    assert_eq!(m.mount_point, b"/mnt/with space\ttab\\");
    assert_eq!(m.majmin, (8, 1));
    assert_eq!(m.fstype, "ext4");
    assert_eq!(m.source, b"/dev/sda1");
    assert!(m.root_is_slash());
    assert!(crate::collect::mountinfo::parse_line(b"31 27 8:1 / /x rw").is_none());
    assert!(
        crate::collect::mountinfo::parse_line(b"31 27 x:1 / /x rw - ext4 /dev/sda1 rw").is_none()
    );
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
