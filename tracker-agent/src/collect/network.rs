//! Per-interface traffic from /proc/net/dev plus link facts from
//! /sys/class/net/IF/. Loopback is left out.
//!
//! /proc/net/dev is parsed here rather than with procfs-core's
//! `InterfaceDeviceStatus`: 2.6–2.9× the parse, 1.35–1.42× read and parse, 20
//! allocations against none (docs/layout.md, "Parsers").

use std::{
    collections::BTreeMap,
    os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd},
    path::PathBuf,
    time::Instant,
};

use super::files::{read_attr, CachedFile, Roots};
use crate::{model::sample::NetworkSample, warn::warn_once};

/// ARPHRD_LOOPBACK in /sys/class/net/IF/type.
const ARPHRD_LOOPBACK: &str = "772";

struct Iface {
    /// Static facts, read when the interface is first seen.
    mac: Option<String>,
    driver: Option<String>,
    loopback: bool,
    operstate: CachedFile,
    mtu: CachedFile,
    speed: CachedFile,
    /// operstate, mtu and speed as last read; read again when the kernel says a
    /// link changed (`LinkWatch`).
    link: Option<(Option<String>, Option<u32>, i64)>,
    /// rx, tx bytes of the previous reading.
    prev: Option<(u64, u64)>,
    /// The reading that last listed it, to drop vanished interfaces.
    seen: u64,
}

/// The driver name ethtool reports (ETHTOOL_GDRVINFO): virtual interfaces (veth,
/// bridge, vxlan, tun) have no `device/driver` link in sysfs but answer this.
fn ethtool_driver(name: &str) -> Option<String> {
    #[repr(C)]
    struct DrvInfo {
        cmd: u32,
        driver: [u8; 32],
        rest: [u8; 32 * 4 + 12 + 5 * 4],
    }
    #[repr(C)]
    struct IfReq {
        name: [u8; libc::IFNAMSIZ],
        data: *mut DrvInfo,
        _pad: [u8; 16],
    }
    const ETHTOOL_GDRVINFO: u32 = 0x3;
    const SIOCETHTOOL: libc::c_ulong = 0x8946;
    let bytes = name.as_bytes();
    if bytes.len() >= libc::IFNAMSIZ {
        return None;
    }
    let mut info = DrvInfo {
        cmd: ETHTOOL_GDRVINFO,
        driver: [0; 32],
        rest: [0; 32 * 4 + 12 + 5 * 4],
    };
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        data: &mut info,
        _pad: [0; 16],
    };
    req.name[..bytes.len()].copy_from_slice(bytes);
    // SAFETY: a datagram socket only used for this ioctl and closed below; the
    // request points at live, correctly sized buffers.
    let ok = unsafe {
        let fd = libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0);
        if fd < 0 {
            return None;
        }
        let r = libc::ioctl(fd, SIOCETHTOOL as _, &mut req);
        libc::close(fd);
        r == 0
    };
    let end = info.driver.iter().position(|&b| b == 0).unwrap_or(32);
    let d = String::from_utf8_lossy(&info.driver[..end]).into_owned();
    (ok && !d.is_empty()).then_some(d)
}

impl Iface {
    /// `live`: the interface is one of this kernel's (not a test tree), so ethtool
    /// may be asked when sysfs has no driver link.
    fn new(dir: PathBuf, name: &str, live: bool) -> Iface {
        let driver = std::fs::read_link(dir.join("device/driver"))
            .ok()
            .and_then(|t| t.file_name().map(|n| n.to_string_lossy().into_owned()))
            .or_else(|| live.then(|| ethtool_driver(name)).flatten());
        Iface {
            mac: read_attr(&dir.join("address")),
            driver,
            loopback: read_attr(&dir.join("type")).as_deref() == Some(ARPHRD_LOOPBACK),
            operstate: CachedFile::whole(dir.join("operstate")),
            mtu: CachedFile::whole(dir.join("mtu")),
            speed: CachedFile::whole(dir.join("speed")),
            link: None,
            prev: None,
            seen: 0,
        }
    }
}

/// The kernel's link notifications (rtnetlink, `RTMGRP_LINK`): a link's state,
/// MTU or speed changes with an RTM_NEWLINK message, so the three attributes of
/// every interface are read again only in a sample after one came, or when the
/// socket overflowed. Reading them each sample was 3 sysfs reads per interface,
/// `speed` under the RTNL lock (docs/cost.md).
struct LinkWatch(OwnedFd);

impl LinkWatch {
    fn open() -> Option<LinkWatch> {
        // SAFETY: plain socket(2) with constant arguments.
        let fd = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_NONBLOCK | libc::SOCK_CLOEXEC,
                libc::NETLINK_ROUTE,
            )
        };
        if fd < 0 {
            return None;
        }
        // SAFETY: fd was just opened and is owned by nobody else.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        // SAFETY: an all-zero sockaddr_nl is valid; the fields are set below.
        let mut sa: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
        sa.nl_family = libc::AF_NETLINK as libc::sa_family_t;
        sa.nl_groups = libc::RTMGRP_LINK as u32;
        // SAFETY: a valid socket and a sockaddr_nl of the size given.
        let r = unsafe {
            libc::bind(
                fd.as_raw_fd(),
                (&sa as *const libc::sockaddr_nl).cast(),
                std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t,
            )
        };
        (r == 0).then_some(LinkWatch(fd))
    }

    /// Whether a link changed since the last call: messages drained, or the
    /// socket overflowed (something changed that was not kept).
    fn changed(&mut self) -> bool {
        let mut buf = [0u8; 8192];
        let mut any = false;
        loop {
            // SAFETY: a valid socket and buffer of the length given.
            let n = unsafe {
                libc::recv(
                    self.0.as_raw_fd(),
                    buf.as_mut_ptr().cast(),
                    buf.len(),
                    libc::MSG_DONTWAIT,
                )
            };
            if n > 0 {
                any = true;
                continue;
            }
            let e = std::io::Error::last_os_error();
            return match e.kind() {
                std::io::ErrorKind::WouldBlock => any,
                std::io::ErrorKind::Interrupted => continue,
                // ENOBUFS: messages were lost; read everything again.
                _ => true,
            };
        }
    }
}

pub struct NetworkCollector {
    class_net: PathBuf,
    dev: CachedFile,
    buf: Vec<u8>,
    attr: Vec<u8>,
    ifaces: BTreeMap<String, Iface>,
    prev_at: Option<Instant>,
    reading: u64,
    /// Reading the running kernel's /sys (not a test tree).
    live: bool,
    /// On the running kernel: the link notifications; None reads the attributes
    /// every sample (a test tree, or a socket that could not be had).
    watch: Option<LinkWatch>,
}

/// Interface name, rx bytes, tx bytes of one /proc/net/dev line.
fn parse_line(line: &str) -> Option<(&str, u64, u64)> {
    let (name, rest) = line.split_once(':')?;
    let mut it = rest.split_ascii_whitespace();
    let rx = it.next()?.parse().ok()?;
    let tx = it.nth(7)?.parse().ok()?;
    Some((name.trim(), rx, tx))
}

/// operstate, MTU and speed (Mbit/s, −1 for none) of an interface, from sysfs.
fn link_attrs(i: &mut Iface, buf: &mut Vec<u8>) -> (Option<String>, Option<u32>, i64) {
    let operstate = attr(&mut i.operstate, buf).map(str::to_string);
    if operstate.is_none() {
        warn_once(
            "collect.network.operstate",
            format!("cannot read {}", i.operstate.path().display()),
        );
    }
    let mtu = attr(&mut i.mtu, buf).and_then(|s| s.parse().ok());
    if mtu.is_none() {
        warn_once(
            "collect.network.mtu",
            format!("cannot read {}", i.mtu.path().display()),
        );
    }
    // EINVAL on virtual or down links, or -1: no speed.
    let speed_mbps = attr(&mut i.speed, buf)
        .and_then(|s| s.parse::<i64>().ok())
        .filter(|&s| s >= 0)
        .unwrap_or(-1);
    (operstate, mtu, speed_mbps)
}

/// A sysfs attribute, trimmed; None when unreadable.
fn attr<'a>(f: &mut CachedFile, buf: &'a mut Vec<u8>) -> Option<&'a str> {
    f.read(buf).ok()?;
    std::str::from_utf8(buf).ok().map(str::trim)
}

impl NetworkCollector {
    pub fn new(roots: &Roots) -> NetworkCollector {
        let live = roots.sys == std::path::Path::new("/sys");
        NetworkCollector {
            class_net: roots.sys.join("class/net"),
            live,
            // Opened before the first reading: a change after it is not missed.
            watch: live.then(LinkWatch::open).flatten(),
            dev: CachedFile::lines_under(roots.proc.join("net/dev"), 512),
            buf: Vec::new(),
            attr: Vec::new(),
            ifaces: BTreeMap::new(),
            prev_at: None,
            reading: 0,
        }
    }

    /// Non-loopback interfaces sorted by name; rates since the previous call.
    pub fn sample(&mut self) -> Vec<NetworkSample> {
        if !self
            .dev
            .read_or_warn(&mut self.buf, "collect.network.dev", "network is empty")
        {
            self.ifaces.clear();
            self.prev_at = None;
            return Vec::new();
        }
        let now = Instant::now();
        let elapsed = self
            .prev_at
            .map(|t| now.duration_since(t).as_secs_f64())
            .filter(|&e| e > 0.0);
        self.prev_at = Some(now);
        self.reading += 1;
        // Drained before the attributes are read: a change after this is read now
        // or at the next sample.
        let relink = self.watch.as_mut().is_none_or(LinkWatch::changed);
        let text = String::from_utf8_lossy(&self.buf);
        let mut out = Vec::with_capacity(self.ifaces.len());
        // Header lines have no ':'; malformed lines are skipped.
        for (name, rx, tx) in text.lines().filter_map(parse_line) {
            if name == "lo" || name.is_empty() || name.contains('/') {
                continue;
            }
            if !self.ifaces.contains_key(name) {
                let dir = self.class_net.join(name);
                self.ifaces
                    .insert(name.to_string(), Iface::new(dir, name, self.live));
            }
            let Some(i) = self.ifaces.get_mut(name) else {
                continue;
            };
            i.seen = self.reading;
            let prev = i.prev.replace((rx, tx));
            if i.loopback {
                continue;
            }
            // A counter that went backwards (driver reset) gives 0, not a spike.
            let rate =
                |now: u64, before: u64| elapsed.map(|e| now.saturating_sub(before) as f64 / e);
            if relink || i.link.is_none() {
                i.link = Some(link_attrs(i, &mut self.attr));
            }
            let (operstate, mtu, speed_mbps) = i.link.clone().unwrap_or((None, None, -1));
            out.push(NetworkSample {
                interface: name.to_string(),
                mac_address: i.mac.clone(),
                driver: i.driver.clone(),
                operstate,
                speed_mbps,
                mtu,
                rx_bytes_per_sec: prev.and_then(|p| rate(rx, p.0)),
                tx_bytes_per_sec: prev.and_then(|p| rate(tx, p.1)),
                rx_bytes: prev.and(elapsed).and(prev.map(|p| rx.saturating_sub(p.0))),
                tx_bytes: prev.and(elapsed).and(prev.map(|p| tx.saturating_sub(p.1))),
                rx_bytes_total: rx,
                tx_bytes_total: tx,
            });
        }
        let reading = self.reading;
        self.ifaces.retain(|_, i| i.seen == reading);
        out.sort_by(|a, b| a.interface.cmp(&b.interface));
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::collect::testroot::TestRoot;

    const DEV1: &str = "\
Inter-|   Receive                                                |  Transmit
 face |bytes    packets errs drop fifo frame compressed multicast|bytes    packets errs drop fifo colls carrier compressed
    lo:    6438      59    0    0    0     0          0         0     6438      59    0    0    0     0       0          0
  ifb0:       0       0    0    0    0     0          0         0        0       0    0    0    0     0       0          0
  eth0: 78340255    4418    0    0    0     0          0         0   268687    2799    0    0    0     0       0          0
";

    fn iface(t: &TestRoot, name: &str, mac: &str, ty: &str, speed: &str, driver: Option<&str>) {
        let d = format!("sys/class/net/{name}");
        t.write(&format!("{d}/address"), &format!("{mac}\n"));
        t.write(&format!("{d}/type"), &format!("{ty}\n"));
        t.write(&format!("{d}/operstate"), "up\n");
        t.write(&format!("{d}/mtu"), "1400\n");
        if !speed.is_empty() {
            t.write(&format!("{d}/speed"), &format!("{speed}\n"));
        }
        if let Some(drv) = driver {
            t.mkdir(&format!("sys/bus/virtio/drivers/{drv}"));
            t.symlink(
                &format!("{d}/device/driver"),
                &format!("../../../../bus/virtio/drivers/{drv}"),
            );
        }
    }

    #[test]
    fn rates_attributes_and_lifecycle() {
        let t = TestRoot::new("net");
        t.write("proc/net/dev", DEV1);
        iface(
            &t,
            "eth0",
            "02:fc:00:00:00:01",
            "1",
            "10000",
            Some("virtio_net"),
        );
        iface(&t, "ifb0", "5e:0e:8a:86:b6:c5", "1", "", None);
        iface(&t, "lo", "00:00:00:00:00:00", "772", "", None);
        let mut c = NetworkCollector::new(&t.roots());
        let first = c.sample();
        let names: Vec<_> = first.iter().map(|n| n.interface.as_str()).collect();
        assert_eq!(names, ["eth0", "ifb0"]);
        assert!(first[0].rx_bytes_per_sec.is_none());
        assert_eq!(first[0].rx_bytes_total, 78340255);
        assert_eq!(first[0].tx_bytes_total, 268687);

        // eth0 +1000 rx / +500 tx; a second loopback (type 772) and a new
        // interface appear; ifb0 vanishes; a malformed line.
        std::thread::sleep(std::time::Duration::from_millis(50));
        iface(&t, "veth1", "aa:bb:cc:dd:ee:ff", "1", "-1", None);
        iface(&t, "lo2", "00:00:00:00:00:00", "772", "", None);
        t.write(
            "proc/net/dev",
            "Inter-|   Receive |  Transmit\n face |bytes packets|bytes packets\n\
             \x20   lo:    7000      60    0    0    0     0          0         0     7000      60    0    0    0     0       0          0\n\
             \x20 eth0: 78341255    4420    0    0    0     0          0         0   269187    2800    0    0    0     0       0          0\n\
             \x20  lo2:    1 1 0 0 0 0 0 0 1 1 0 0 0 0 0 0\n\
             \x20veth1:    10 1 0 0 0 0 0 0 20 1 0 0 0 0 0 0\n\
             \x20 bad0: 12 x\n",
        );
        let s = c.sample();
        let names: Vec<_> = s.iter().map(|n| n.interface.as_str()).collect();
        assert_eq!(names, ["eth0", "veth1"]);
        let e = &s[0];
        let rx = e.rx_bytes_per_sec.unwrap();
        let tx = e.tx_bytes_per_sec.unwrap();
        // Rates use the measured elapsed time (≥ 50 ms, well under 10 s here).
        assert!(rx > 100.0 && rx <= 1000.0 / 0.05, "{rx}");
        assert!((rx / tx - 2.0).abs() < 1e-9);
        assert_eq!(e.mac_address.as_deref(), Some("02:fc:00:00:00:01"));
        assert_eq!(e.driver.as_deref(), Some("virtio_net"));
        assert_eq!(e.operstate.as_deref(), Some("up"));
        assert_eq!(e.mtu, Some(1400));
        assert_eq!(e.speed_mbps, 10000);
        let v = &s[1];
        assert!(v.rx_bytes_per_sec.is_none() && v.tx_bytes_per_sec.is_none());
        assert_eq!((v.rx_bytes_total, v.tx_bytes_total), (10, 20));
        assert_eq!(v.speed_mbps, -1);
        assert!(v.driver.is_none());
        assert!(c.ifaces.contains_key("veth1") && !c.ifaces.contains_key("ifb0"));

        // Exact rate: the elapsed time is set, not slept.
        c.prev_at = Some(Instant::now() - std::time::Duration::from_secs(1000));
        t.write(
            "proc/net/dev",
            "h\nh\n  eth0: 78351255 0 0 0 0 0 0 0 270187 0 0 0 0 0 0 0\n",
        );
        let s = c.sample();
        let rx = s[0].rx_bytes_per_sec.unwrap();
        assert!((rx - 10.0).abs() < 0.01, "{rx}");
        assert!((s[0].tx_bytes_per_sec.unwrap() - 1.0).abs() < 0.01);
    }

    #[test]
    fn missing_sources() {
        let t = TestRoot::new("net2");
        let mut c = NetworkCollector::new(&t.roots());
        assert!(c.sample().is_empty());
        // /proc/net/dev but no sysfs at all: attributes null, speed -1.
        t.write("proc/net/dev", DEV1);
        let s = c.sample();
        assert_eq!(s.len(), 2);
        assert!(s[0].mac_address.is_none() && s[0].operstate.is_none() && s[0].mtu.is_none());
        assert_eq!(s[0].speed_mbps, -1);
    }
}
