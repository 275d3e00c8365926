//! A small reader for the kernel's BTF (/sys/kernel/btf/vmlinux): just enough to find
//! struct member offsets and tracepoint prototypes, so the BPF programs carry no
//! offsets compiled for one kernel. aya-obj parses BTF too but keeps its type lookup
//! crate-private.

use std::{cell::RefCell, collections::HashMap, fmt};

use tracker_common::{Offsets, NO_FIELD};

#[derive(Debug)]
pub enum BtfError {
    Malformed(String),
    Missing(String),
}

impl fmt::Display for BtfError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BtfError::Malformed(what) => write!(f, "malformed BTF: {what}"),
            BtfError::Missing(what) => write!(f, "kernel BTF lacks {what}"),
        }
    }
}

impl std::error::Error for BtfError {}

const KIND_INT: u32 = 1;
const KIND_PTR: u32 = 2;
const KIND_ARRAY: u32 = 3;
const KIND_STRUCT: u32 = 4;
const KIND_UNION: u32 = 5;
const KIND_ENUM: u32 = 6;
const KIND_TYPEDEF: u32 = 8;
const KIND_VOLATILE: u32 = 9;
const KIND_CONST: u32 = 10;
const KIND_RESTRICT: u32 = 11;
const KIND_FUNC_PROTO: u32 = 13;
const KIND_VAR: u32 = 14;
const KIND_DATASEC: u32 = 15;
const KIND_DECL_TAG: u32 = 17;
const KIND_TYPE_TAG: u32 = 18;
const KIND_ENUM64: u32 = 19;

#[derive(Clone, Copy, Debug)]
struct Member {
    name: u32,
    ty: u32,
    /// Bit offset (bitfield size stripped).
    bit_offset: u32,
}

/// A type's fixed header, decoded where it is needed.
#[derive(Clone, Copy, Debug)]
struct Type {
    name: u32,
    kind: u32,
    kind_flag: bool,
    vlen: usize,
    /// `size` or `type`, depending on the kind.
    size_or_type: u32,
    /// Byte offset of what follows the header (members, parameters…).
    body: usize,
}

/// The kernel's BTF, indexed in one pass (where each type starts) and decoded
/// lazily: the agent needs a handful of its ~150,000 types. Decoding all of them,
/// with their members and a name index, took 33 ms of every start here.
pub struct Btf<'a> {
    tsec: &'a [u8],
    strings: &'a [u8],
    /// Byte offset of each type id's header in `tsec`; id 0 (void) has none.
    starts: Vec<u32>,
    /// Struct ids already looked up by name.
    found: RefCell<HashMap<String, u32>>,
}

fn u32_at(data: &[u8], at: usize) -> Result<u32, BtfError> {
    data.get(at..at + 4)
        .map(|b| u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
        .ok_or_else(|| BtfError::Malformed(format!("truncated at byte {at}")))
}

impl<'a> Btf<'a> {
    pub fn parse(data: &'a [u8]) -> Result<Self, BtfError> {
        if data.len() < 24 || data[0..2] != [0x9f, 0xeb] {
            return Err(BtfError::Malformed(
                "bad magic (not little-endian BTF)".into(),
            ));
        }
        let hdr_len = u32_at(data, 4)? as usize;
        let type_off = u32_at(data, 8)? as usize;
        let type_len = u32_at(data, 12)? as usize;
        let str_off = u32_at(data, 16)? as usize;
        let str_len = u32_at(data, 20)? as usize;
        let tstart = hdr_len + type_off;
        let sstart = hdr_len + str_off;
        let tsec = data
            .get(tstart..tstart + type_len)
            .ok_or_else(|| BtfError::Malformed("type section out of bounds".into()))?;
        let strings = data
            .get(sstart..sstart + str_len)
            .ok_or_else(|| BtfError::Malformed("string section out of bounds".into()))?;
        let mut starts = vec![0u32];
        let mut at = 0usize;
        while at < tsec.len() {
            starts.push(at as u32);
            let info = u32_at(tsec, at + 4)?;
            u32_at(tsec, at + 8)?;
            let vlen = (info & 0xffff) as usize;
            let kind = (info >> 24) & 0x1f;
            at += 12
                + match kind {
                    KIND_INT | KIND_VAR | KIND_DECL_TAG => 4,
                    KIND_ARRAY => 12,
                    KIND_STRUCT | KIND_UNION => 12 * vlen,
                    KIND_ENUM => 8 * vlen,
                    KIND_FUNC_PROTO => 8 * vlen,
                    KIND_DATASEC | KIND_ENUM64 => 12 * vlen,
                    0 | 7 | 12 | 16 | KIND_PTR | KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST
                    | KIND_RESTRICT | KIND_TYPE_TAG => 0,
                    other => {
                        return Err(BtfError::Malformed(format!(
                            "unknown kind {other} at type {}",
                            starts.len() - 1
                        )))
                    }
                };
        }
        if at != tsec.len() {
            return Err(BtfError::Malformed(
                "type section ends inside a type".into(),
            ));
        }
        Ok(Btf {
            tsec,
            strings,
            starts,
            found: RefCell::new(HashMap::new()),
        })
    }

    fn str_at(&self, off: u32) -> &'a [u8] {
        let Some(rest) = self.strings.get(off as usize..) else {
            return b"";
        };
        let end = rest.iter().position(|&b| b == 0).unwrap_or(rest.len());
        &rest[..end]
    }

    fn ty(&self, id: u32) -> Result<Type, BtfError> {
        let at = *self
            .starts
            .get(id as usize)
            .filter(|_| id != 0)
            .ok_or_else(|| BtfError::Malformed(format!("type id {id} out of range")))?
            as usize;
        let info = u32_at(self.tsec, at + 4)?;
        Ok(Type {
            name: u32_at(self.tsec, at)?,
            kind: (info >> 24) & 0x1f,
            kind_flag: info >> 31 != 0,
            vlen: (info & 0xffff) as usize,
            size_or_type: u32_at(self.tsec, at + 8)?,
            body: at + 12,
        })
    }

    /// Struct/union members, or a FUNC_PROTO's parameters (offset 0).
    fn members(&self, t: &Type) -> Result<Vec<Member>, BtfError> {
        let mut v = Vec::with_capacity(t.vlen);
        for i in 0..t.vlen {
            match t.kind {
                KIND_STRUCT | KIND_UNION => {
                    let at = t.body + 12 * i;
                    let off = u32_at(self.tsec, at + 8)?;
                    v.push(Member {
                        name: u32_at(self.tsec, at)?,
                        ty: u32_at(self.tsec, at + 4)?,
                        bit_offset: if t.kind_flag { off & 0x00ff_ffff } else { off },
                    });
                }
                KIND_FUNC_PROTO => {
                    let at = t.body + 8 * i;
                    v.push(Member {
                        name: u32_at(self.tsec, at)?,
                        ty: u32_at(self.tsec, at + 4)?,
                        bit_offset: 0,
                    });
                }
                _ => break,
            }
        }
        Ok(v)
    }

    /// The first type of `kind` called `name`.
    fn find(&self, name: &str, kind: u32) -> Result<Option<u32>, BtfError> {
        for id in 1..self.starts.len() as u32 {
            let t = self.ty(id)?;
            if t.kind == kind && t.name != 0 && self.str_at(t.name) == name.as_bytes() {
                return Ok(Some(id));
            }
        }
        Ok(None)
    }

    /// Follows typedef/const/volatile/restrict/type_tag to the underlying type.
    fn strip(&self, mut id: u32) -> Result<u32, BtfError> {
        for _ in 0..32 {
            let t = self.ty(id)?;
            match t.kind {
                KIND_TYPEDEF | KIND_VOLATILE | KIND_CONST | KIND_RESTRICT | KIND_TYPE_TAG => {
                    id = t.size_or_type
                }
                _ => return Ok(id),
            }
        }
        Err(BtfError::Malformed(format!("type chain too deep at {id}")))
    }

    fn find_struct(&self, name: &str) -> Result<u32, BtfError> {
        if let Some(&id) = self.found.borrow().get(name) {
            return Ok(id);
        }
        let id = self
            .find(name, KIND_STRUCT)?
            .ok_or_else(|| BtfError::Missing(format!("struct {name}")))?;
        self.found.borrow_mut().insert(name.to_string(), id);
        Ok(id)
    }

    /// Bit offset and type of member `name` in struct/union `id`, looking inside
    /// anonymous struct/union members (task_struct has several).
    fn member(&self, id: u32, name: &str) -> Result<Option<(u32, u32)>, BtfError> {
        let t = self.ty(self.strip(id)?)?;
        if t.kind != KIND_STRUCT && t.kind != KIND_UNION {
            return Ok(None);
        }
        for m in self.members(&t)? {
            if m.name == 0 {
                if let Some((off, ty)) = self.member(m.ty, name)? {
                    return Ok(Some((m.bit_offset + off, ty)));
                }
            } else if self.str_at(m.name) == name.as_bytes() {
                return Ok(Some((m.bit_offset, m.ty)));
            }
        }
        Ok(None)
    }

    /// Byte offset of a dotted member path, e.g. `("task_struct", "se.sum_exec_runtime")`.
    pub fn offset_of(&self, strukt: &str, path: &str) -> Result<Option<u32>, BtfError> {
        Ok(self.member_at(strukt, path)?.map(|(off, _)| off))
    }

    /// Byte offset and type id of a dotted member path.
    fn member_at(&self, strukt: &str, path: &str) -> Result<Option<(u32, u32)>, BtfError> {
        let mut id = self.find_struct(strukt)?;
        let mut bits = 0u32;
        for part in path.split('.') {
            match self.member(id, part)? {
                Some((off, ty)) => {
                    bits += off;
                    id = ty;
                }
                None => return Ok(None),
            }
        }
        if !bits.is_multiple_of(8) {
            return Err(BtfError::Malformed(format!(
                "{strukt}.{path} is a bitfield"
            )));
        }
        Ok(Some((bits / 8, id)))
    }

    /// Where `mm_struct.rss_stat`'s counters are: (offset of the first, bytes from
    /// one to the next, offset of the value in one), or `NO_FIELD`s. An array of
    /// `percpu_counter` since 6.2 (the value is its `count`), before that a
    /// `struct mm_rss_stat` holding an array of `atomic_long_t`.
    fn rss_layout(&self) -> Result<(u32, u32, u32), BtfError> {
        const NONE: (u32, u32, u32) = (NO_FIELD, 0, 0);
        let Some((mut off, mut id)) = self.member_at("mm_struct", "rss_stat")? else {
            return Ok(NONE);
        };
        let mut t = self.ty(self.strip(id)?)?;
        if t.kind == KIND_STRUCT {
            let Some((bits, ty)) = self.member(self.strip(id)?, "count")? else {
                return Ok(NONE);
            };
            off += bits / 8;
            id = ty;
            t = self.ty(self.strip(id)?)?;
        }
        // An array's body: element type, index type, element count.
        if t.kind != KIND_ARRAY || u32_at(self.tsec, t.body + 8)? < 4 {
            return Ok(NONE);
        }
        let elem_id = self.strip(u32_at(self.tsec, t.body)?)?;
        let elem = self.ty(elem_id)?;
        match elem.kind {
            KIND_STRUCT if self.str_at(elem.name) == b"percpu_counter" => {
                match self.member(elem_id, "count")? {
                    Some((bits, _)) if bits % 8 == 0 => Ok((off, elem.size_or_type, bits / 8)),
                    _ => Ok(NONE),
                }
            }
            // atomic_long_t: a struct of one `counter`.
            KIND_STRUCT if elem.size_or_type == 8 => Ok((off, 8, 0)),
            _ => Ok(NONE),
        }
    }

    fn required(&self, strukt: &str, path: &str) -> Result<u32, BtfError> {
        self.offset_of(strukt, path)?
            .ok_or_else(|| BtfError::Missing(format!("{strukt}.{path}")))
    }

    fn optional(&self, strukt: &str, path: &str) -> Result<u32, BtfError> {
        Ok(self.offset_of(strukt, path)?.unwrap_or(NO_FIELD))
    }

    /// Number of arguments a tracepoint passes to BTF programs (without the leading
    /// `void *__data`), read from the `btf_trace_<name>` typedef.
    pub fn tracepoint_args(&self, name: &str) -> Result<usize, BtfError> {
        let tname = format!("btf_trace_{name}");
        let id = self
            .find(&tname, KIND_TYPEDEF)?
            .ok_or_else(|| BtfError::Missing(format!("typedef {tname}")))?;
        let ptr = self.ty(self.strip(id)?)?;
        if ptr.kind != KIND_PTR {
            return Err(BtfError::Malformed(format!("{tname} is not a pointer")));
        }
        let proto = self.ty(self.strip(ptr.size_or_type)?)?;
        if proto.kind != KIND_FUNC_PROTO {
            return Err(BtfError::Malformed(format!(
                "{tname} is not a function pointer"
            )));
        }
        Ok(proto.vlen.saturating_sub(1))
    }

    /// Everything the BPF programs read, resolved for this kernel.
    pub fn offsets(&self) -> Result<Offsets, BtfError> {
        let t = "task_struct";
        let s = "signal_struct";
        let exit_args = self.tracepoint_args("sched_process_exit")?;
        let (mm_rss_stat, rss_stride, rss_count) = self.rss_layout()?;
        // The programs read utime and stime together, pid and tgid together, and
        // the four I/O counters.
        if self.required(t, "stime")? != self.required(t, "utime")? + 8 {
            return Err(BtfError::Missing(
                "task_struct.stime right after utime".into(),
            ));
        }
        if self.required(t, "tgid")? != self.required(t, "pid")? + 4 {
            return Err(BtfError::Missing("task_struct.tgid right after pid".into()));
        }
        let io = [
            self.optional(t, "ioac.rchar")?,
            self.optional(t, "ioac.wchar")?,
            self.optional(t, "ioac.read_bytes")?,
            self.optional(t, "ioac.write_bytes")?,
        ];
        let task_io_block = match io {
            [r, w, rb, wb] if r != NO_FIELD && w == r + 8 && rb == r + 32 && wb == r + 40 => r,
            _ => NO_FIELD,
        };
        let mut o = Offsets {
            task_pid: self.required(t, "pid")?,
            task_tgid: self.required(t, "tgid")?,
            task_real_parent: self.required(t, "real_parent")?,
            task_comm: self.required(t, "comm")?,
            task_exit_code: self.required(t, "exit_code")?,
            task_sum_exec_runtime: self.required(t, "se.sum_exec_runtime")?,
            task_utime: self.required(t, "utime")?,
            task_stime: self.required(t, "stime")?,
            task_signal: self.required(t, "signal")?,
            // `state` was renamed `__state` in 5.14.
            task_state: match self.offset_of(t, "__state")? {
                Some(o) => o,
                None => self.required(t, "state")?,
            },
            task_on_cpu: self.optional(t, "on_cpu")?,
            task_group_leader: self.required(t, "group_leader")?,
            task_io_read_bytes: self.optional(t, "ioac.read_bytes")?,
            task_io_write_bytes: self.optional(t, "ioac.write_bytes")?,
            task_io_rchar: self.optional(t, "ioac.rchar")?,
            task_io_wchar: self.optional(t, "ioac.wchar")?,
            signal_maxrss: self.required(s, "maxrss")?,
            exit_has_group_dead: u32::from(exit_args >= 2),
            signal_live: self.required(s, "live")?,
            task_io_block,
            task_exit_state: self.required(t, "exit_state")?,
            task_mm: self.required(t, "mm")?,
            mm_rss_stat,
            rss_stride,
            rss_count,
            // Renamed from `real_start_time` in 5.5.
            task_start_boottime: match self.offset_of(t, "start_boottime")? {
                Some(o) => o,
                None => self.optional(t, "real_start_time")?,
            },
            // Filled by the loader, which knows the tick.
            tick_ns: 0,
            task_cgroups: self.optional(t, "cgroups")?,
            css_set_subsys: self.optional("css_set", "subsys")?,
            css_cgroup: self.optional("cgroup_subsys_state", "cgroup")?,
            cgroup_kn: self.optional("cgroup", "kn")?,
            kernfs_node_id: self.optional("kernfs_node", "id")?,
            memory_cgrp_id: NO_FIELD,
            task_children: self.optional(t, "children")?,
            task_sibling: self.optional(t, "sibling")?,
            task_min_flt: match (self.offset_of(t, "min_flt")?, self.offset_of(t, "maj_flt")?) {
                (Some(min), Some(maj)) if maj == min + 8 => min,
                _ => NO_FIELD,
            },
        };
        let chain = [
            o.task_cgroups,
            o.css_set_subsys,
            o.css_cgroup,
            o.cgroup_kn,
            o.kernfs_node_id,
        ];
        if !chain.contains(&NO_FIELD) {
            o.memory_cgrp_id = self.memory_cgrp_id()?;
        }
        Ok(o)
    }

    /// The memory controller's index in `css_set.subsys` (`memory_cgrp_id` of
    /// `enum cgroup_subsys_id`, which depends on the controllers built in), or
    /// `NO_FIELD` where the kernel has no memory controller. `kernfs_node.id` must
    /// be the 64-bit id (5.5 and later; an `ino`/`generation` union before) for it
    /// to be the directory's inode.
    fn memory_cgrp_id(&self) -> Result<u32, BtfError> {
        let is_u64 = match self.member_at("kernfs_node", "id")? {
            Some((_, ty)) => {
                let t = self.ty(self.strip(ty)?)?;
                t.kind == KIND_INT && t.size_or_type == 8
            }
            None => false,
        };
        if !is_u64 {
            return Ok(NO_FIELD);
        }
        Ok(self
            .enum_value("cgroup_subsys_id", "memory_cgrp_id")?
            .and_then(|v| u32::try_from(v).ok())
            .unwrap_or(NO_FIELD))
    }

    /// The value of `name` in `enum kind_name`, None where either is missing.
    fn enum_value(&self, enum_name: &str, name: &str) -> Result<Option<i64>, BtfError> {
        let Some(id) = self.find(enum_name, KIND_ENUM)? else {
            return Ok(None);
        };
        let t = self.ty(id)?;
        for i in 0..t.vlen {
            let at = t.body + 8 * i;
            if self.str_at(u32_at(self.tsec, at)?) == name.as_bytes() {
                return Ok(Some(i64::from(u32_at(self.tsec, at + 4)? as i32)));
            }
        }
        Ok(None)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rejects_garbage() {
        assert!(matches!(
            Btf::parse(b"not btf at all, clearly"),
            Err(BtfError::Malformed(_))
        ));
        let mut hdr = vec![0x9f, 0xeb, 1, 0];
        hdr.extend_from_slice(&24u32.to_le_bytes());
        hdr.extend_from_slice(&0u32.to_le_bytes());
        hdr.extend_from_slice(&1000u32.to_le_bytes()); // type_len past the end
        hdr.extend_from_slice(&0u32.to_le_bytes());
        hdr.extend_from_slice(&0u32.to_le_bytes());
        assert!(matches!(Btf::parse(&hdr), Err(BtfError::Malformed(_))));
    }

    /// Reads this machine's kernel BTF; the offsets must agree with what the kernel
    /// exports elsewhere (the tracepoint format files carry no task offsets, so check
    /// internal consistency and the args the format files do show).
    #[test]
    fn running_kernel() {
        let path = std::path::Path::new("/sys/kernel/btf/vmlinux");
        if !path.exists() {
            assert!(
                std::env::var_os("CI").is_none(),
                "CI machine lacks {}",
                path.display()
            );
            return;
        }
        let data = std::fs::read(path).expect("read vmlinux BTF");
        let btf = Btf::parse(&data).expect("parse vmlinux BTF");
        let o = btf.offsets().expect("offsets");
        assert!(
            o.task_tgid == o.task_pid + 4,
            "pid and tgid are adjacent pid_t: {o:?}"
        );
        assert!(o.task_sum_exec_runtime > 0 && o.task_comm > o.task_pid);
        let fmt =
            std::fs::read_to_string("/sys/kernel/tracing/events/sched/sched_process_exit/format")
                .unwrap_or_default();
        if fmt.contains("group_dead") {
            assert_eq!(o.exit_has_group_dead, 1);
        }
        // Both I/O configs on here: one read takes the four counters.
        assert_eq!(o.task_io_block, o.task_io_rchar, "{o:?}");
        // 6.2+: an array of percpu_counter, whose `count` follows its raw spinlock.
        assert_ne!(o.mm_rss_stat, tracker_common::NO_FIELD, "{o:?}");
        assert!(o.rss_stride >= 16 && o.rss_count >= 4, "{o:?}");
        // Every SMP kernel has on_cpu, which the sweep relies on.
        assert_ne!(o.task_on_cpu, tracker_common::NO_FIELD);
        assert_eq!(btf.offset_of("task_struct", "no_such_field").unwrap(), None);
        // A lookup of a struct the kernel lacks names it.
        assert!(matches!(
            btf.offset_of("no_such_struct", "x"),
            Err(BtfError::Missing(m)) if m.contains("no_such_struct")
        ));
    }
}
