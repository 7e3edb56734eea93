//! Hashing for affinity picks and for deriving independent random numbers.
//!
//! Consistent hashing for `sessionAffinity: ClientIP` comes in two forms that map a key to
//! an endpoint and move only the keys of an endpoint that leaves:
//!
//! - a ring (Karger et al., as in Envoy's `ring_hash` and ketama), built with every
//!   snapshot when [`BalancerConfig::session_affinity`](super::BalancerConfig) is on:
//!   O(log n) per pick, a binary search over a sorted array;
//! - rendezvous hashing (highest random weight, Thaler and Ravishankar), used when no ring
//!   was built: O(n) per pick, no memory.
//!
//! Both skip ejected endpoints by walking on (ring) or taking the next best score
//! (rendezvous), so a key moves only while its endpoint is out.
//!
//! This module works on endpoint keys ([`addr_key`]) and positions only, so it depends on
//! no other module of `endpoints`.

use std::net::SocketAddr;

/// The splitmix64 finalizer: a fast bijective mixer.
#[inline]
pub(crate) fn mix64(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

/// A stable hash of an address (same value in every process and Rust version).
pub(crate) fn addr_key(addr: &SocketAddr) -> u64 {
    let mut h = mix64(u64::from(addr.port()));
    match addr {
        SocketAddr::V4(v4) => h = mix64(h ^ u64::from(u32::from(*v4.ip()))),
        SocketAddr::V6(v6) => {
            let bits = u128::from(*v6.ip());
            h = mix64(h ^ (bits >> 64) as u64 ^ 0x6);
            h = mix64(h ^ bits as u64);
        }
    }
    h
}

/// A consistent-hash ring over one tier: sorted `(point, index into the tier)`.
#[derive(Debug, Default)]
pub(crate) struct Ring {
    points: Box<[(u64, u32)]>,
}

impl Ring {
    /// Builds the ring over a tier's endpoint keys, in position order: `vnodes(n)` points
    /// per endpoint. Cost: O(n log n), off the request path.
    pub(crate) fn build(keys: impl ExactSizeIterator<Item = u64>) -> Self {
        let per = vnodes(keys.len());
        let mut points = Vec::with_capacity(keys.len() * per);
        for (index, key) in keys.enumerate() {
            let index = u32::try_from(index).unwrap_or(u32::MAX);
            for v in 0..per as u64 {
                points.push((mix64(key ^ v.wrapping_mul(RING_SALT)), index));
            }
        }
        points.sort_unstable();
        Self {
            points: points.into_boxed_slice(),
        }
    }

    /// The tier index for `key`, skipping endpoints `usable` rejects (all rejected: the
    /// key's own endpoint). Cost: a binary search, plus one step per ejected point
    /// passed.
    pub(crate) fn lookup(&self, key: u64, usable: impl Fn(usize) -> bool) -> Option<usize> {
        let len = self.points.len();
        if len == 0 {
            return None;
        }
        let h = mix64(key);
        let start = self.points.partition_point(|&(p, _)| p < h) % len;
        let own = self.points[start].1 as usize;
        if usable(own) {
            return Some(own);
        }
        (1..len)
            .map(|i| self.points[(start + i) % len].1 as usize)
            .find(|&i| usable(i))
            .or(Some(own))
    }
}

/// Rendezvous hashing over a tier's `(endpoint key, usable)` pairs in position order: the
/// position of the usable endpoint with the highest score for `key` (none usable: the
/// highest overall). Cost: O(n) mixes, no allocation.
pub(crate) fn rendezvous(key: u64, candidates: impl Iterator<Item = (u64, bool)>) -> usize {
    let h = mix64(key);
    let mut best = (false, 0u64, 0usize);
    for (index, (endpoint_key, usable)) in candidates.enumerate() {
        let candidate = (usable, mix64(h ^ endpoint_key), index);
        if (candidate.0, candidate.1) > (best.0, best.1) || index == 0 {
            best = candidate;
        }
    }
    best.2
}

/// Points per endpoint: 100 for small sets, fewer for large ones so a ring stays near
/// 64 Ki points (about 1 MiB), never below 4.
fn vnodes(n: usize) -> usize {
    (RING_TARGET / n.max(1)).clamp(MIN_VNODES, MAX_VNODES)
}

const RING_SALT: u64 = 0x2545_f491_4f6c_dd1d;
const RING_TARGET: usize = 1 << 16;
const MIN_VNODES: usize = 4;
const MAX_VNODES: usize = 100;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addr_key_is_stable_and_spreads() {
        let a: SocketAddr = "10.0.0.1:80".parse().unwrap();
        let b: SocketAddr = "10.0.0.2:80".parse().unwrap();
        let c: SocketAddr = "[fd00::1]:80".parse().unwrap();
        assert_eq!(addr_key(&a), addr_key(&a));
        assert_ne!(addr_key(&a), addr_key(&b));
        assert_ne!(addr_key(&a), addr_key(&c));
    }

    #[test]
    fn vnode_counts() {
        assert_eq!(vnodes(2), 100);
        assert_eq!(vnodes(1024), 64);
        assert_eq!(vnodes(10_000), 6);
        assert_eq!(vnodes(1_000_000), 4);
    }
}
