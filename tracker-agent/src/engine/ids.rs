//! Maps keyed by tid or tgid.

use std::{
    collections::HashMap as StdHashMap,
    hash::{BuildHasherDefault, Hasher},
};

/// Tids and tgids are small, distinct integers: hashing them as they are is enough
/// (SipHash showed in the per-sample profile).
#[derive(Default)]
pub(crate) struct IdHasher(u64);

impl Hasher for IdHasher {
    fn finish(&self) -> u64 {
        // Spread the low bits a little, so that consecutive pids fill buckets evenly.
        self.0.wrapping_mul(0x9E37_79B9_7F4A_7C15)
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = (self.0 << 8) | u64::from(b);
        }
    }
    fn write_u32(&mut self, n: u32) {
        self.0 = u64::from(n);
    }
    fn write_u64(&mut self, n: u64) {
        self.0 = n;
    }
}

pub(crate) type IdMap<V> = StdHashMap<u32, V, BuildHasherDefault<IdHasher>>;

pub(crate) type IdSet = std::collections::HashSet<u32, BuildHasherDefault<IdHasher>>;
