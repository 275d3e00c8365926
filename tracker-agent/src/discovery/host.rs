//! The identifying host fields, read locally: no network connection is made.

use std::{
    ffi::CStr,
    net::{IpAddr, Ipv4Addr, Ipv6Addr},
    path::Path,
};

/// The host's id: DMI product UUID or serial (root-only on most systems), else the
/// systemd machine id.
pub(super) fn host_id(dmi: &Path, machine_id: &Path) -> Option<String> {
    let read = |p: &Path| std::fs::read_to_string(p).ok();
    read(&dmi.join("product_uuid"))
        .as_deref()
        .and_then(dmi_value)
        .map(|u| u.to_ascii_lowercase())
        .or_else(|| {
            read(&dmi.join("product_serial"))
                .as_deref()
                .and_then(dmi_value)
        })
        .or_else(|| read(machine_id).as_deref().and_then(machine_id_value))
}

/// A DMI string, unless it is one of the firmware's placeholders.
pub(super) fn dmi_value(s: &str) -> Option<String> {
    const PLACEHOLDERS: [&str; 17] = [
        "not specified",
        "not applicable",
        "not available",
        "none",
        "n/a",
        "na",
        "unknown",
        "invalid",
        "default string",
        "to be filled by o.e.m.",
        "to be filled by oem",
        "system serial number",
        "system product name",
        "chassis serial number",
        "0123456789",
        "123456789",
        // A UUID many firmwares ship unchanged.
        "03000200-0400-0500-0006-000700080009",
    ];
    let s = s.trim();
    let lower = s.to_ascii_lowercase();
    let filler = s
        .chars()
        .all(|c| matches!(c, '0' | 'f' | 'F' | 'x' | 'X' | '-' | ' ' | '.'));
    if s.is_empty() || filler || PLACEHOLDERS.contains(&lower.as_str()) || s.len() > 255 {
        return None;
    }
    s.chars()
        .all(|c| c.is_ascii_graphic() || c == ' ')
        .then(|| s.to_string())
}

/// `/etc/machine-id`: 32 hex digits (`uninitialized` on a first boot).
pub(super) fn machine_id_value(s: &str) -> Option<String> {
    let s = s.trim();
    (s.len() == 32 && s.bytes().all(|b| b.is_ascii_hexdigit()) && s.bytes().any(|b| b != b'0'))
        .then(|| s.to_ascii_lowercase())
}

/// The kernel's node name (`uname -n`).
pub(super) fn hostname() -> Option<String> {
    // SAFETY: uname fills the zeroed struct; nodename is NUL-terminated on success.
    let from_uname = unsafe {
        let mut u: libc::utsname = std::mem::zeroed();
        (libc::uname(&mut u) == 0).then(|| {
            CStr::from_ptr(u.nodename.as_ptr())
                .to_string_lossy()
                .into_owned()
        })
    };
    from_uname
        .or_else(|| std::fs::read_to_string("/proc/sys/kernel/hostname").ok())
        .map(|s| s.trim().to_string())
        .filter(|s| !s.is_empty() && s != "(none)")
}

const RTF_UP: u32 = 0x0001;
const RTF_REJECT: u32 = 0x0200;

/// The interface of the IPv4 default route in `/proc/net/route` (lowest metric).
pub(super) fn default_iface_v4(route: &str) -> Option<String> {
    route
        .lines()
        .skip(1)
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // Iface Destination Gateway Flags RefCnt Use Metric Mask ...
            if f.len() < 8 || f[1] != "00000000" || f[7] != "00000000" {
                return None;
            }
            let flags = u32::from_str_radix(f[3], 16).ok()?;
            let metric: u64 = f[6].parse().ok()?;
            (flags & RTF_UP != 0 && flags & RTF_REJECT == 0).then(|| (metric, f[0]))
        })
        .min_by_key(|(metric, _)| *metric)
        .map(|(_, iface)| iface.to_string())
}

/// The interface of the IPv6 default route in `/proc/net/ipv6_route` (lowest
/// metric; the kernel's unreachable defaults on `lo` are not routes out).
pub(super) fn default_iface_v6(route: &str) -> Option<String> {
    route
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            // dest plen src plen next_hop metric refcnt use flags iface
            if f.len() < 10 || f[0].bytes().any(|b| b != b'0') || f[1] != "00" || f[9] == "lo" {
                return None;
            }
            let metric = u32::from_str_radix(f[5], 16).ok()?;
            let flags = u32::from_str_radix(f[8], 16).ok()?;
            (flags & RTF_UP != 0 && flags & RTF_REJECT == 0).then(|| (metric, f[9]))
        })
        .min_by_key(|(metric, _)| *metric)
        .map(|(_, iface)| iface.to_string())
}

/// An address worth reporting: not loopback, not link-local, not unspecified.
fn routable(ip: &IpAddr) -> bool {
    match ip {
        IpAddr::V4(a) => !a.is_loopback() && !a.is_link_local() && !a.is_unspecified(),
        IpAddr::V6(a) => {
            !a.is_loopback() && !a.is_unspecified() && (a.segments()[0] & 0xffc0) != 0xfe80
        }
    }
}

/// The IPv4 address of the IPv4 default route's interface, else an IPv6 address of
/// the IPv6 default route's interface (else of the IPv4 one's).
pub(super) fn pick_ip(
    v4_iface: Option<&str>,
    v6_iface: Option<&str>,
    addrs: &[(String, IpAddr)],
) -> Option<IpAddr> {
    let on = |iface: Option<&str>, v6: bool| {
        let iface = iface?;
        addrs
            .iter()
            .find(|(n, ip)| n == iface && ip.is_ipv6() == v6 && routable(ip))
            .map(|(_, ip)| *ip)
    };
    on(v4_iface, false)
        .or_else(|| on(v6_iface, true))
        .or_else(|| on(v4_iface, true))
}

/// Every interface address (`getifaddrs`), by interface name.
fn interface_addrs() -> Vec<(String, IpAddr)> {
    let mut out = Vec::new();
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs allocates a list that we walk read-only and free once.
    unsafe {
        if libc::getifaddrs(&mut head) != 0 {
            return out;
        }
        let mut cur = head;
        while !cur.is_null() {
            let ifa = &*cur;
            cur = ifa.ifa_next;
            if ifa.ifa_addr.is_null() || ifa.ifa_name.is_null() {
                continue;
            }
            let name = CStr::from_ptr(ifa.ifa_name).to_string_lossy().into_owned();
            let ip = match i32::from((*ifa.ifa_addr).sa_family) {
                libc::AF_INET => {
                    let sa = &*(ifa.ifa_addr as *const libc::sockaddr_in);
                    IpAddr::V4(Ipv4Addr::from(u32::from_be(sa.sin_addr.s_addr)))
                }
                libc::AF_INET6 => {
                    let sa = &*(ifa.ifa_addr as *const libc::sockaddr_in6);
                    IpAddr::V6(Ipv6Addr::from(sa.sin6_addr.s6_addr))
                }
                _ => continue,
            };
            out.push((name, ip));
        }
        libc::freeifaddrs(head);
    }
    out
}

/// The address of the interface that carries the default route.
pub(super) fn host_ip() -> Option<String> {
    let read = |p: &str| std::fs::read_to_string(p).unwrap_or_default();
    let v4 = default_iface_v4(&read("/proc/net/route"));
    let v6 = default_iface_v6(&read("/proc/net/ipv6_route"));
    if v4.is_none() && v6.is_none() {
        return None;
    }
    pick_ip(v4.as_deref(), v6.as_deref(), &interface_addrs()).map(|ip| ip.to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    const ROUTE: &str = "\
Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\t\tMTU\tWindow\tIRTT
wlan0\t00000000\t0101A8C0\t0003\t0\t0\t600\t00000000\t0\t0\t0
eth0\t00000000\t0100000A\t0003\t0\t0\t100\t00000000\t0\t0\t0
eth0\t0000000A\t00000000\t0001\t0\t0\t100\t00FFFFFF\t0\t0\t0
docker0\t000011AC\t00000000\t0001\t0\t0\t0\t0000FFFF\t0\t0\t0
";

    const ROUTE6: &str = "\
fe800000000000000000000000000000 40 00000000000000000000000000000000 00 00000000000000000000000000000000 00000100 00000001 00000000 00000001     eth0
00000000000000000000000000000000 00 00000000000000000000000000000000 00 fe80000000000000022a1afffeb1c2d3 00000400 00000003 00000000 00000003     ens5
00000000000000000000000000000000 00 00000000000000000000000000000000 00 00000000000000000000000000000000 ffffffff 00000001 00000000 00200200       lo
";

    #[test]
    fn default_routes() {
        assert_eq!(default_iface_v4(ROUTE).as_deref(), Some("eth0"));
        assert_eq!(default_iface_v6(ROUTE6).as_deref(), Some("ens5"));
        let only_lan = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\n\
                        eth0\t0000000A\t00000000\t0001\t0\t0\t0\t00FFFFFF\n";
        assert_eq!(default_iface_v4(only_lan), None);
        assert_eq!(default_iface_v4(""), None);
        // Only the kernel's unreachable default on lo.
        let lo = ROUTE6.lines().nth(2).unwrap();
        assert_eq!(default_iface_v6(lo), None);
        // A route that is not up does not count.
        let down = "Iface\tDestination\tGateway \tFlags\tRefCnt\tUse\tMetric\tMask\n\
                    eth1\t00000000\t0100000A\t0002\t0\t0\t0\t00000000\n";
        assert_eq!(default_iface_v4(down), None);
    }

    #[test]
    fn picks_the_default_route_address() {
        let ip = |s: &str| s.parse::<IpAddr>().unwrap();
        let addrs = vec![
            ("lo".to_string(), ip("127.0.0.1")),
            ("eth0".to_string(), ip("fe80::1")),
            ("eth0".to_string(), ip("2001:db8::5")),
            ("eth0".to_string(), ip("10.0.0.5")),
            ("docker0".to_string(), ip("172.17.0.1")),
        ];
        assert_eq!(pick_ip(Some("eth0"), None, &addrs), Some(ip("10.0.0.5")));
        assert_eq!(pick_ip(None, Some("eth0"), &addrs), Some(ip("2001:db8::5")));
        assert_eq!(pick_ip(Some("wlan0"), None, &addrs), None);
        let v6_only = vec![
            ("ens5".to_string(), ip("fe80::2")),
            ("ens5".to_string(), ip("2001:db8::9")),
        ];
        assert_eq!(
            pick_ip(None, Some("ens5"), &v6_only),
            Some(ip("2001:db8::9"))
        );
    }

    #[test]
    fn dmi_placeholders() {
        assert_eq!(dmi_value("Not Specified\n"), None);
        assert_eq!(dmi_value("To Be Filled By O.E.M."), None);
        assert_eq!(dmi_value("00000000-0000-0000-0000-000000000000"), None);
        assert_eq!(dmi_value("FFFFFFFF-FFFF-FFFF-FFFF-FFFFFFFFFFFF"), None);
        assert_eq!(dmi_value("0"), None);
        assert_eq!(dmi_value(""), None);
        assert_eq!(
            dmi_value("ec2a1b2c-3d4e-5f60-7182-93a4b5c6d7e8\n").as_deref(),
            Some("ec2a1b2c-3d4e-5f60-7182-93a4b5c6d7e8")
        );
        assert_eq!(dmi_value("PF2XYZ12").as_deref(), Some("PF2XYZ12"));
        assert_eq!(
            machine_id_value("0123456789abcdef0123456789ABCDEF\n").as_deref(),
            Some("0123456789abcdef0123456789abcdef")
        );
        assert_eq!(machine_id_value("uninitialized"), None);
        assert_eq!(machine_id_value(&"0".repeat(32)), None);
    }

    #[test]
    fn host_id_order() {
        let d = std::env::temp_dir().join(format!("rt-hostid-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&d);
        std::fs::create_dir_all(&d).unwrap();
        let mid = d.join("machine-id");
        std::fs::write(&mid, "0123456789abcdef0123456789abcdef\n").unwrap();
        assert_eq!(
            host_id(&d, &mid).as_deref(),
            Some("0123456789abcdef0123456789abcdef")
        );
        std::fs::write(d.join("product_serial"), "Not Specified\n").unwrap();
        assert_eq!(
            host_id(&d, &mid).as_deref(),
            Some("0123456789abcdef0123456789abcdef")
        );
        std::fs::write(d.join("product_serial"), "PF2XYZ12\n").unwrap();
        assert_eq!(host_id(&d, &mid).as_deref(), Some("PF2XYZ12"));
        std::fs::write(
            d.join("product_uuid"),
            "4C4C4544-0042-3510-8051-B3C04F4A4E32\n",
        )
        .unwrap();
        assert_eq!(
            host_id(&d, &mid).as_deref(),
            Some("4c4c4544-0042-3510-8051-b3c04f4a4e32")
        );
        std::fs::remove_dir_all(&d).unwrap();
    }

    #[test]
    fn this_host() {
        // Whatever this machine has: no panic, and the values are well-formed.
        if let Some(h) = hostname() {
            assert!(!h.is_empty());
        }
        if let Some(ip) = host_ip() {
            assert!(ip.parse::<IpAddr>().is_ok(), "{ip}");
        }
    }
}
