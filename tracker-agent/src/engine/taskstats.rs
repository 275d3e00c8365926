//! Every task's exit on the host, from the kernel's taskstats (generic netlink),
//! for the procfs engine when it may listen (CAP_NET_ADMIN). The kernel sends a
//! task's record in `do_exit` before it drops the task's memory map, so the
//! record holds the map's high-water mark: a process that peaked and ended
//! between two polls keeps its peak here, where /proc has nothing left of it
//! (its zombie has no map, and its reaper's `cmaxrss` is the reaper's alone to
//! read).
//!
//! Written against libc rather than a crate: `linux-taskstats` copies a record
//! of its header's size out of a shorter one from an older kernel (a panic on
//! 5.10's), prints unknown attributes to stdout, and builds its bindings with
//! bindgen (libclang on every build machine); `taskstats` (0.1) has had no
//! release since 2020. What is needed is four messages' framing and three
//! fields of the record.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

use anyhow::{bail, Context};

/// One task's exit as the kernel recorded it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Exit {
    /// The task (thread) id; a process's leader's is its pid.
    pub tid: u32,
    /// Its process (records of version 12 on: kernel 5.19 and later).
    pub tgid: Option<u32>,
    /// Its process's parent (a thread's parent is its process's).
    pub ppid: u32,
    /// Its memory map's high-water mark of RSS (KiB).
    pub hiwater_rss_kib: u64,
}

const GENL_ID_CTRL: u16 = 0x10;
const CTRL_CMD_GETFAMILY: u8 = 3;
const CTRL_ATTR_FAMILY_ID: u16 = 1;
const CTRL_ATTR_FAMILY_NAME: u16 = 2;
const TASKSTATS_CMD_GET: u8 = 1;
const TASKSTATS_CMD_NEW: u8 = 2;
const TASKSTATS_TYPE_STATS: u16 = 3;
const TASKSTATS_TYPE_AGGR_PID: u16 = 4;
const TASKSTATS_CMD_ATTR_REGISTER_CPUMASK: u16 = 3;
const TASKSTATS_CMD_ATTR_DEREGISTER_CPUMASK: u16 = 4;
/// `struct taskstats` offsets (include/uapi/linux/taskstats.h): later versions
/// append, and these three have not moved since they came; `ac_tgid` came in
/// version 12.
const VERSION: usize = 0;
const AC_PID: usize = 128;
const AC_PPID: usize = 132;
const HIWATER_RSS: usize = 200;
const AC_TGID: usize = 368;
const TGID_VERSION: u16 = 12;
/// Where a record's parts lie in the datagram the socket filter sees: the
/// netlink header (16), the family header (4), AGGR_PID's header (4), the PID
/// attribute (8), STATS's header (4), then the record. A kernel that pads
/// STATS to 8 bytes (where unaligned access is slow) moves it: the filter then
/// finds another type at `STATS_TYPE` and passes the datagram whole.
const NL_TYPE: u32 = 4;
const STATS_TYPE: u32 = 34;
const STATS_AT: u32 = 36;
/// The most parents the filter names (two instructions each); a larger tree
/// is heard unfiltered.
pub const FILTER_PARENTS: usize = 256;
/// Room for a burst of exits between two drains: the buffer is charged by each
/// record's whole buffer (1.2–2.5 KB, twice that where a process of several
/// threads ends), so some 2,000 exits (the kernel doubles what is asked).
const RCVBUF: libc::c_int = 2 << 20;

/// A registered listener for every CPU's exits.
pub struct Exits {
    fd: OwnedFd,
    family: u16,
    /// Every possible CPU, as the register and deregister attributes take
    /// them (a C string).
    mask: Vec<u8>,
    buf: Vec<u8>,
    /// Records the kernel dropped because the socket's buffer was full.
    pub overflowed: bool,
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_ne_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_ne_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_ne_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// A classic BPF instruction.
fn op(code: u32, jt: u8, jf: u8, k: u32) -> libc::sock_filter {
    libc::sock_filter {
        code: code as u16,
        jt,
        jf,
        k,
    }
}

/// The socket filter that passes a record only where it can matter: its
/// high-water mark is above `above_kib` (the largest the tree has had, so the
/// only records that can move its peak), or its parent is one of `parents`
/// (the members: a child of theirs that ended unseen is a parent in turn, for
/// its own children's records). Anything that is not a record of this layout
/// passes. Loads are big-endian in classic BPF: the 16- and 32-bit figures
/// compare against their byte-swapped forms, and the high-water mark is put
/// together byte by byte (little-endian hosts only).
fn program(family: u16, above_kib: u64, parents: &[u32]) -> Vec<libc::sock_filter> {
    use libc::{
        BPF_ABS, BPF_ALU, BPF_B, BPF_H, BPF_JEQ, BPF_JGT, BPF_JMP, BPF_K, BPF_LD, BPF_LSH,
        BPF_MISC, BPF_OR, BPF_RET, BPF_TAX, BPF_W, BPF_X,
    };
    const PASS: u32 = u32::MAX;
    let be16 = |v: u16| u32::from(u16::from_be_bytes(v.to_ne_bytes()));
    let be32 = |v: u32| u32::from_be_bytes(v.to_ne_bytes());
    let hwm = STATS_AT + HIWATER_RSS as u32;
    let mut p = vec![
        op(BPF_LD | BPF_H | BPF_ABS, 0, 0, NL_TYPE),
        op(BPF_JMP | BPF_JEQ | BPF_K, 1, 0, be16(family)),
        op(BPF_RET | BPF_K, 0, 0, PASS),
        op(BPF_LD | BPF_H | BPF_ABS, 0, 0, STATS_TYPE),
        op(BPF_JMP | BPF_JEQ | BPF_K, 1, 0, be16(TASKSTATS_TYPE_STATS)),
        op(BPF_RET | BPF_K, 0, 0, PASS),
        // A mark of 4 TiB or more (its high half): passes.
        op(BPF_LD | BPF_W | BPF_ABS, 0, 0, hwm + 4),
        op(BPF_JMP | BPF_JEQ | BPF_K, 1, 0, 0),
        op(BPF_RET | BPF_K, 0, 0, PASS),
    ];
    // A = the low half, from its four bytes (most significant first).
    for (i, shift) in [(3u32, 24u32), (2, 16), (1, 8), (0, 0)] {
        p.push(op(BPF_LD | BPF_B | BPF_ABS, 0, 0, hwm + i));
        if shift > 0 {
            p.push(op(BPF_ALU | BPF_LSH | BPF_K, 0, 0, shift));
        }
        if i < 3 {
            p.push(op(BPF_ALU | BPF_OR | BPF_X, 0, 0, 0));
        }
        if i > 0 {
            p.push(op(BPF_MISC | BPF_TAX, 0, 0, 0));
        }
    }
    let above = u32::try_from(above_kib).unwrap_or(u32::MAX);
    p.push(op(BPF_JMP | BPF_JGT | BPF_K, 0, 1, above));
    p.push(op(BPF_RET | BPF_K, 0, 0, PASS));
    p.push(op(
        BPF_LD | BPF_W | BPF_ABS,
        0,
        0,
        STATS_AT + AC_PPID as u32,
    ));
    for &pid in parents {
        p.push(op(BPF_JMP | BPF_JEQ | BPF_K, 0, 1, be32(pid)));
        p.push(op(BPF_RET | BPF_K, 0, 0, PASS));
    }
    p.push(op(BPF_RET | BPF_K, 0, 0, 0));
    p
}

/// A generic netlink request: header, family header, one attribute.
fn request(family: u16, flags: u16, cmd: u8, attr: u16, value: &[u8]) -> Vec<u8> {
    let alen = 4 + value.len();
    let len = 16 + 4 + alen.next_multiple_of(4);
    let mut m = Vec::with_capacity(len);
    m.extend_from_slice(&(len as u32).to_ne_bytes());
    m.extend_from_slice(&family.to_ne_bytes());
    m.extend_from_slice(&flags.to_ne_bytes());
    m.extend_from_slice(&1u32.to_ne_bytes()); // seq
    m.extend_from_slice(&0u32.to_ne_bytes()); // the kernel fills the port
    m.extend_from_slice(&[cmd, 1, 0, 0]);
    m.extend_from_slice(&(alen as u16).to_ne_bytes());
    m.extend_from_slice(&attr.to_ne_bytes());
    m.extend_from_slice(value);
    m.resize(len, 0);
    m
}

/// The attributes of `b` (after their headers): (type, payload).
fn attrs(mut b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        let len = usize::from(u16_at(b, 0)?);
        let ty = u16_at(b, 2)? & 0x3fff;
        let payload = b.get(4..len)?;
        b = b.get(len.next_multiple_of(4)..).unwrap_or(&[]);
        Some((ty, payload))
    })
}

/// The netlink messages of one datagram: (type, body after the 16-byte header).
fn messages(mut b: &[u8]) -> impl Iterator<Item = (u16, &[u8])> {
    std::iter::from_fn(move || {
        let len = u32_at(b, 0)? as usize;
        let ty = u16_at(b, 4)?;
        let body = b.get(16..len)?;
        b = b.get(len.next_multiple_of(4)..).unwrap_or(&[]);
        Some((ty, body))
    })
}

/// The exit a `TASKSTATS_CMD_NEW` message's body holds: its per-task record.
pub fn parse_exit(body: &[u8]) -> Option<Exit> {
    if body.first() != Some(&TASKSTATS_CMD_NEW) {
        return None;
    }
    let (_, aggr) = attrs(body.get(4..)?).find(|(t, _)| *t == TASKSTATS_TYPE_AGGR_PID)?;
    let (_, st) = attrs(aggr).find(|(t, _)| *t == TASKSTATS_TYPE_STATS)?;
    let tgid = u16_at(st, VERSION)
        .filter(|&v| v >= TGID_VERSION)
        .and_then(|_| u32_at(st, AC_TGID));
    Some(Exit {
        tid: u32_at(st, AC_PID)?,
        tgid,
        ppid: u32_at(st, AC_PPID)?,
        hiwater_rss_kib: u64_at(st, HIWATER_RSS)?,
    })
}

impl Exits {
    /// Registers for the exits on every possible CPU; an error says why (no
    /// CAP_NET_ADMIN: "Operation not permitted").
    pub fn open() -> anyhow::Result<Exits> {
        // SAFETY: socket(2) with constant arguments; the result is checked.
        let raw = unsafe {
            libc::socket(
                libc::AF_NETLINK,
                libc::SOCK_RAW | libc::SOCK_CLOEXEC,
                libc::NETLINK_GENERIC,
            )
        };
        if raw < 0 {
            bail!(
                "a generic netlink socket: {}",
                std::io::Error::last_os_error()
            );
        }
        // SAFETY: `raw` is a socket this function just made and owns alone.
        let fd = unsafe { OwnedFd::from_raw_fd(raw) };
        let mut mask = std::fs::read_to_string("/sys/devices/system/cpu/possible")
            .context("/sys/devices/system/cpu/possible")?
            .trim()
            .as_bytes()
            .to_vec();
        mask.push(0);
        let mut ex = Exits {
            fd,
            family: 0,
            mask,
            buf: vec![0; 64 << 10],
            overflowed: false,
        };
        // A refusal leaves the default buffer (SO_RCVBUFFORCE needs
        // CAP_NET_ADMIN, which registering needs too).
        let _ = ex.set_option(libc::SO_RCVBUFFORCE, &RCVBUF);
        ex.family = ex.resolve().context("the TASKSTATS netlink family")?;
        ex.send(&request(
            ex.family,
            (libc::NLM_F_REQUEST | libc::NLM_F_ACK) as u16,
            TASKSTATS_CMD_GET,
            TASKSTATS_CMD_ATTR_REGISTER_CPUMASK,
            &ex.mask,
        ))?;
        ex.ack().context("registering for taskstats exits")?;
        Ok(ex)
    }

    /// A SOL_SOCKET option of the socket: `T` is the type the option `name`
    /// takes (an int, a `sock_fprog`); the kernel only reads it.
    fn set_option<T>(&self, name: libc::c_int, value: &T) -> std::io::Result<()> {
        // SAFETY: `value` is a live `T` of the size passed (a wrong type for
        // the option is refused with EINVAL or EFAULT, never written through);
        // the socket is ours.
        let rc = unsafe {
            libc::setsockopt(
                self.fd.as_raw_fd(),
                libc::SOL_SOCKET,
                name,
                (value as *const T).cast(),
                std::mem::size_of::<T>() as libc::socklen_t,
            )
        };
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    }

    fn send(&self, m: &[u8]) -> anyhow::Result<()> {
        // SAFETY: `m` is a live buffer of `m.len()` bytes; the socket is ours.
        let n = unsafe { libc::send(self.fd.as_raw_fd(), m.as_ptr().cast(), m.len(), 0) };
        if n < 0 {
            bail!("netlink send: {}", std::io::Error::last_os_error());
        }
        Ok(())
    }

    /// One datagram into `buf` (its length), or none: waiting at most 1 s
    /// where `wait`, else not at all.
    fn recv(&mut self, wait: bool) -> anyhow::Result<Option<usize>> {
        if wait {
            let mut p = libc::pollfd {
                fd: self.fd.as_raw_fd(),
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one pollfd that lives across the call.
            if unsafe { libc::poll(&mut p, 1, 1000) } <= 0 {
                bail!("no answer from the kernel within 1 s");
            }
        }
        loop {
            // SAFETY: all-zero is a valid sockaddr_nl.
            let mut from: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
            let mut len = std::mem::size_of::<libc::sockaddr_nl>() as libc::socklen_t;
            // SAFETY: `buf` is a live buffer of its length and `from` a live
            // sockaddr_nl of `len` bytes; the socket is ours.
            let n = unsafe {
                libc::recvfrom(
                    self.fd.as_raw_fd(),
                    self.buf.as_mut_ptr().cast(),
                    self.buf.len(),
                    libc::MSG_DONTWAIT,
                    (&raw mut from).cast(),
                    &mut len,
                )
            };
            // Only the kernel (port 0) speaks for exits: a datagram from a
            // process (which would need CAP_NET_ADMIN) is read and dropped.
            if n >= 0 && from.nl_pid != 0 {
                continue;
            }
            if n >= 0 {
                return Ok(Some(n as usize));
            }
            let e = std::io::Error::last_os_error();
            match e.raw_os_error() {
                Some(libc::EAGAIN) => return Ok(None),
                Some(libc::EINTR) => continue,
                // The kernel dropped records: said, and the socket reads on.
                Some(libc::ENOBUFS) => self.overflowed = true,
                _ => bail!("netlink recv: {e}"),
            }
        }
    }

    /// The family id of "TASKSTATS".
    fn resolve(&mut self) -> anyhow::Result<u16> {
        self.send(&request(
            GENL_ID_CTRL,
            libc::NLM_F_REQUEST as u16,
            CTRL_CMD_GETFAMILY,
            CTRL_ATTR_FAMILY_NAME,
            b"TASKSTATS\0",
        ))?;
        let n = self.recv(true)?.context("no answer")?;
        for (ty, body) in messages(&self.buf[..n]) {
            if ty == libc::NLMSG_ERROR as u16 {
                bail!("{}", nl_error(body));
            }
            if let Some(id) = attrs(body.get(4..).unwrap_or(&[]))
                .find(|(t, _)| *t == CTRL_ATTR_FAMILY_ID)
                .and_then(|(_, v)| u16_at(v, 0))
            {
                return Ok(id);
            }
        }
        bail!("the kernel's answer has no family id (CONFIG_TASKSTATS off?)")
    }

    /// The kernel's acknowledgement of the last request; an exit record
    /// already on the way is skipped.
    fn ack(&mut self) -> anyhow::Result<()> {
        for _ in 0..64 {
            let n = self.recv(true)?.context("no answer")?;
            for (ty, body) in messages(&self.buf[..n]) {
                if ty == libc::NLMSG_ERROR as u16 {
                    let code = u32_at(body, 0).map(|c| c as i32);
                    if code == Some(0) {
                        return Ok(());
                    }
                    bail!("{}", nl_error(body));
                }
            }
        }
        bail!("no acknowledgement among 64 answers")
    }

    /// Lets through only the records that can matter (`program`): those above
    /// `above_kib`, and those of children of `parents`; None (or more parents
    /// than `FILTER_PARENTS`): every record. Beside churn each record costs the
    /// tracker about a microsecond to receive (docs/cost.md); a filtered one is
    /// dropped in the kernel before it is copied.
    /// False where the kernel refused it (every record then comes).
    pub fn filter(&mut self, keep: Option<(u64, &[u32])>) -> bool {
        let prog = match keep {
            Some((above, parents))
                if parents.len() <= FILTER_PARENTS && cfg!(target_endian = "little") =>
            {
                program(self.family, above, parents)
            }
            _ => vec![op(libc::BPF_RET | libc::BPF_K, 0, 0, u32::MAX)],
        };
        let fprog = libc::sock_fprog {
            len: prog.len() as u16,
            filter: prog.as_ptr().cast_mut(),
        };
        // `fprog` points at `prog`, which lives across the call (the kernel
        // copies it).
        let Err(e) = self.set_option(libc::SO_ATTACH_FILTER, &fprog) else {
            return true;
        };
        // The old filter would stay, with its old parents: none at all.
        let _ = self.set_option(libc::SO_DETACH_FILTER, &0);
        log::debug!("taskstats: the socket filter: {e}; every record is received");
        false
    }

    /// Every exit the kernel has sent since the last drain, into `out`.
    pub fn drain(&mut self, out: &mut Vec<Exit>) {
        loop {
            match self.recv(false) {
                Ok(Some(n)) => {
                    let family = self.family;
                    out.extend(
                        messages(&self.buf[..n])
                            .filter(|(ty, _)| *ty == family)
                            .filter_map(|(_, body)| parse_exit(body)),
                    );
                }
                Ok(None) => return,
                Err(e) => {
                    log::warn!("taskstats: {e:#}; exits are no longer heard");
                    self.overflowed = true;
                    return;
                }
            }
        }
    }
}

/// What an NLMSG_ERROR body says.
fn nl_error(body: &[u8]) -> String {
    match u32_at(body, 0) {
        Some(c) => std::io::Error::from_raw_os_error((c as i32).wrapping_neg()).to_string(),
        None => "a truncated netlink error".to_string(),
    }
}

impl Drop for Exits {
    fn drop(&mut self) {
        // The kernel drops a closed socket's registration only when a send to
        // it fails: deregistered here, it sends nothing more.
        let _ = self.send(&request(
            self.family,
            libc::NLM_F_REQUEST as u16,
            TASKSTATS_CMD_GET,
            TASKSTATS_CMD_ATTR_DEREGISTER_CPUMASK,
            &self.mask,
        ));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A record as the kernel frames it: AGGR_PID { PID, STATS }.
    fn record(tid: u32, ppid: u32, hwm: u64, stats_len: usize) -> Vec<u8> {
        let mut st = vec![0u8; 416];
        st[VERSION..VERSION + 2].copy_from_slice(&13u16.to_ne_bytes());
        st[AC_TGID..AC_TGID + 4].copy_from_slice(&(tid + 1000).to_ne_bytes());
        st[AC_PID..AC_PID + 4].copy_from_slice(&tid.to_ne_bytes());
        st[AC_PPID..AC_PPID + 4].copy_from_slice(&ppid.to_ne_bytes());
        st[HIWATER_RSS..HIWATER_RSS + 8].copy_from_slice(&hwm.to_ne_bytes());
        st.truncate(stats_len);
        let mut inner = Vec::new();
        inner.extend_from_slice(&8u16.to_ne_bytes());
        inner.extend_from_slice(&1u16.to_ne_bytes());
        inner.extend_from_slice(&tid.to_ne_bytes());
        inner.extend_from_slice(&((4 + stats_len) as u16).to_ne_bytes());
        inner.extend_from_slice(&TASKSTATS_TYPE_STATS.to_ne_bytes());
        inner.extend_from_slice(&st);
        inner.resize(inner.len().next_multiple_of(4), 0);
        let mut body = vec![TASKSTATS_CMD_NEW, 1, 0, 0];
        body.extend_from_slice(&((4 + inner.len()) as u16).to_ne_bytes());
        body.extend_from_slice(&(TASKSTATS_TYPE_AGGR_PID | 0x8000).to_ne_bytes());
        body.extend_from_slice(&inner);
        body
    }

    #[test]
    fn a_record_gives_its_task_parent_and_high_water_mark() {
        assert_eq!(
            parse_exit(&record(41, 7, 512_000, 416)),
            Some(Exit {
                tid: 41,
                tgid: Some(1041),
                ppid: 7,
                hiwater_rss_kib: 512_000
            })
        );
        // Before version 12 a record has no process id.
        let mut old = record(41, 7, 512_000, 416);
        let v = old.len() - 416;
        old[v..v + 2].copy_from_slice(&11u16.to_ne_bytes());
        assert_eq!(parse_exit(&old).and_then(|e| e.tgid), None);
        // Version 12 cut before its process id: the rest still stands.
        assert_eq!(
            parse_exit(&record(41, 7, 512_000, 300)).map(|e| (e.tgid, e.hiwater_rss_kib)),
            Some((None, 512_000))
        );
        // A record cut short is no exit, never a panic.
        assert_eq!(parse_exit(&record(41, 7, 1, 120)), None);
        assert_eq!(parse_exit(&[]), None);
        let mut other = record(41, 7, 1, 416);
        other[0] = TASKSTATS_CMD_GET;
        assert_eq!(parse_exit(&other), None);
    }

    /// As root, a child's exit comes with its pid, its parent and at least
    /// the memory it touched.
    #[test]
    fn a_childs_exit_is_heard_with_its_peak() {
        let mut ex = match Exits::open() {
            Ok(ex) => ex,
            Err(e) => {
                // SAFETY: geteuid has no preconditions.
                assert_ne!(unsafe { libc::geteuid() }, 0, "as root: {e:#}");
                return;
            }
        };
        let mut child = std::process::Command::new("python3")
            .args(["-c", "b = bytearray(64 << 20)"])
            .spawn()
            .expect("python3");
        let pid = child.id();
        assert!(child.wait().expect("its exit").success());
        let me = std::process::id();
        let mut got = Vec::new();
        let t0 = std::time::Instant::now();
        while !got.iter().any(|e: &Exit| e.tid == pid) && t0.elapsed().as_secs() < 5 {
            ex.drain(&mut got);
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        let e = got.iter().find(|e| e.tid == pid).expect("the child's exit");
        assert_eq!(e.ppid, me, "{e:?}");
        assert!(e.tgid.is_none_or(|g| g == pid), "{e:?}");
        assert!(e.hiwater_rss_kib >= 64 << 10, "{e:?}");
        // Filtered: a small child of a parent not named is dropped in the
        // kernel; a large one, or a child of a parent named, comes.
        let child = |mib: u32| {
            let mut c = std::process::Command::new("python3")
                .args(["-c", &format!("b = bytearray({mib} << 20)")])
                .spawn()
                .expect("python3");
            let pid = c.id();
            assert!(c.wait().expect("its exit").success());
            pid
        };
        let heard = |ex: &mut Exits, pid: u32| {
            let mut got = Vec::new();
            let t0 = std::time::Instant::now();
            while t0.elapsed().as_millis() < 500 {
                ex.drain(&mut got);
                if got.iter().any(|e| e.tid == pid) {
                    return true;
                }
                std::thread::sleep(std::time::Duration::from_millis(10));
            }
            false
        };
        assert!(ex.filter(Some((48 << 10, &[1]))));
        let small = child(1);
        assert!(
            !heard(&mut ex, small),
            "a small child of an unnamed parent came"
        );
        let large = child(64);
        assert!(heard(&mut ex, large), "a large child was dropped");
        assert!(ex.filter(Some((48 << 10, &[7, me]))));
        let named = child(1);
        assert!(
            heard(&mut ex, named),
            "a child of a named parent was dropped"
        );
        assert!(ex.filter(None));
        let any = child(1);
        assert!(heard(&mut ex, any), "unfiltered, a child was dropped");
    }
}
