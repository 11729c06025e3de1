//! Which replica a request goes to: round robin, the least loaded, or cache-aware — the replica
//! whose cache most likely holds the request's prefix, unless that would unbalance the load
//! (SGLang's router: an approximate prefix tree per replica built from the router's own
//! history, weighed against each replica's requests in flight).
//!
//! The prefix tree is approximate the way the engine's own prefix cache is exact: a prompt's
//! text is cut into blocks of [`BLOCK`] bytes and each block hashed with all the blocks before
//! it, so that a replica's set of hashes holds every prefix routed to it at block granularity.
//! How many leading blocks of a new prompt are in a replica's set is how much of it that replica
//! has seen. Each set keeps its most recent [`CAP`] hashes (older ones are forgotten, as the
//! replica's cache evicts).

use std::collections::{HashSet, VecDeque};
use std::hash::{Hash, Hasher};

/// Bytes of prompt text per hashed block.
pub const BLOCK: usize = 64;
/// Hashes a replica's index remembers.
pub const CAP: usize = 1 << 18;
/// Cache-aware: the share of a prompt's blocks a replica must have seen to win on its cache.
pub const MATCH_THRESHOLD: f64 = 0.5;
/// Cache-aware: the load is unbalanced (and the least loaded replica wins) when the busiest
/// replica has this many more requests in flight than the idlest and twice as many.
pub const BALANCE_ABS: usize = 8;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Policy {
    RoundRobin,
    LeastLoaded,
    CacheAware,
}

impl Policy {
    pub fn parse(s: &str) -> Option<Policy> {
        match s {
            "round-robin" => Some(Policy::RoundRobin),
            "least-loaded" => Some(Policy::LeastLoaded),
            "cache-aware" => Some(Policy::CacheAware),
            _ => None,
        }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Policy::RoundRobin => "round-robin",
            Policy::LeastLoaded => "least-loaded",
            Policy::CacheAware => "cache-aware",
        }
    }
}

/// A prompt's chained block hashes: element i stands for its first (i + 1)·BLOCK bytes.
pub fn block_hashes(text: &[u8]) -> Vec<u64> {
    let mut h = 0u64;
    text.chunks(BLOCK)
        .filter(|c| c.len() == BLOCK)
        .map(|c| {
            let mut s = std::collections::hash_map::DefaultHasher::new();
            h.hash(&mut s);
            c.hash(&mut s);
            h = s.finish();
            h
        })
        .collect()
}

/// One replica's approximate prefix tree (see the module's note).
#[derive(Default)]
pub struct PrefixIndex {
    seen: HashSet<u64>,
    order: VecDeque<u64>,
}

impl PrefixIndex {
    /// Leading blocks of `hashes` this replica has been sent.
    pub fn matched(&self, hashes: &[u64]) -> usize {
        hashes.iter().take_while(|h| self.seen.contains(h)).count()
    }

    pub fn insert(&mut self, hashes: &[u64]) {
        for &h in hashes {
            if self.seen.insert(h) {
                self.order.push_back(h);
            }
        }
        while self.order.len() > CAP {
            if let Some(old) = self.order.pop_front() {
                self.seen.remove(&old);
            }
        }
    }

    pub fn len(&self) -> usize {
        self.seen.len()
    }

    pub fn is_empty(&self) -> bool {
        self.seen.is_empty()
    }
}

/// What the policy sees of a replica that may take the request.
#[derive(Clone, Copy, Debug)]
pub struct Candidate {
    pub index: usize,
    pub in_flight: usize,
    /// Leading blocks of the prompt the replica has seen, and the size of its index.
    pub matched: usize,
    pub indexed: usize,
}

/// The candidate a request of `blocks` hashed blocks goes to (`turn`: a counter for round robin
/// and ties); `None` when there is none.
pub fn choose(policy: Policy, c: &[Candidate], blocks: usize, turn: usize) -> Option<usize> {
    if c.is_empty() {
        return None;
    }
    let least = |c: &[Candidate]| {
        // ties go round robin, so that equal replicas share the work
        let min = c.iter().map(|x| x.in_flight).min().expect("non-empty");
        let tied: Vec<&Candidate> = c.iter().filter(|x| x.in_flight == min).collect();
        tied[turn % tied.len()].index
    };
    Some(match policy {
        Policy::RoundRobin => c[turn % c.len()].index,
        Policy::LeastLoaded => least(c),
        Policy::CacheAware => {
            let (lo, hi) = c.iter().fold((usize::MAX, 0), |(lo, hi), x| (lo.min(x.in_flight), hi.max(x.in_flight)));
            let best = c.iter().max_by_key(|x| (x.matched, std::cmp::Reverse(x.in_flight))).expect("non-empty");
            if hi - lo > BALANCE_ABS && hi > 2 * lo {
                least(c)
            } else if blocks > 0 && best.matched as f64 / blocks as f64 >= MATCH_THRESHOLD {
                best.index
            } else {
                // nobody holds much of it: the least loaded, then the one with the most room
                let min = c.iter().map(|x| x.in_flight).min().expect("non-empty");
                c.iter().filter(|x| x.in_flight == min).min_by_key(|x| x.indexed).expect("non-empty").index
            }
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cand(index: usize, in_flight: usize, matched: usize, indexed: usize) -> Candidate {
        Candidate { index, in_flight, matched, indexed }
    }

    #[test]
    fn prefixes_match_block_by_block() {
        let a = "s".repeat(3 * BLOCK) + "first question";
        let b = "s".repeat(3 * BLOCK) + "another question, longer than a block of sixty-four bytes, surely";
        let mut ix = PrefixIndex::default();
        ix.insert(&block_hashes(a.as_bytes()));
        assert_eq!(ix.matched(&block_hashes(b.as_bytes())), 3, "the shared three blocks");
        assert_eq!(ix.matched(&block_hashes(b"x")), 0);
        let c = "t".to_string() + &"s".repeat(3 * BLOCK);
        assert_eq!(ix.matched(&block_hashes(c.as_bytes())), 0, "a block is its whole prefix, not its text");
    }

    #[test]
    fn each_policy_picks_as_documented() {
        let c = [cand(0, 3, 0, 10), cand(1, 1, 4, 50), cand(2, 1, 0, 5)];
        assert_eq!(choose(Policy::RoundRobin, &c, 4, 4), Some(1));
        assert_eq!(choose(Policy::LeastLoaded, &c, 4, 0), Some(1));
        assert_eq!(choose(Policy::LeastLoaded, &c, 4, 1), Some(2), "ties go round robin");
        assert_eq!(choose(Policy::CacheAware, &c, 4, 0), Some(1), "the replica that saw the prefix");
        let c = [cand(0, 0, 0, 10), cand(1, 1, 1, 50), cand(2, 0, 0, 5)];
        assert_eq!(choose(Policy::CacheAware, &c, 4, 0), Some(2), "little matched: idlest, then emptiest");
        let c = [cand(0, 20, 4, 10), cand(1, 2, 0, 50)];
        assert_eq!(choose(Policy::CacheAware, &c, 4, 0), Some(1), "unbalanced: the least loaded");
        assert_eq!(choose(Policy::CacheAware, &[], 4, 0), None);
    }
}
