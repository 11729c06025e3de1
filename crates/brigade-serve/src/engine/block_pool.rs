//! The blocks of the paged KV cache as the scheduler sees them (PagedAttention's blocks,
//! vLLM's prefix caching): which block holds whose tokens, not the floats (those are the
//! model's `KvStore`, indexed by the same block numbers).
//!
//! Keys and values live in fixed-size blocks of `block_size` tokens; a sequence holds a block
//! table, so memory grows with its length instead of being reserved for the maximum. A full
//! block is keyed by (its parent's key, its tokens); a later sequence whose prompt starts with
//! the same tokens reuses it instead of computing it again. Blocks no sequence holds wait in a
//! free queue, oldest first, and keep their contents (and key) until they are taken for new
//! tokens: least recently used cached blocks are evicted first.
//!
//! Under context parallelism (`--cp N`) the blocks are striped over N ranks: block `b` lives on
//! rank `b % N`, and a sequence's `j`-th block is always taken from rank `j % N`'s blocks
//! (`allocate_at`), so a long prompt's keys and values spread evenly and a prefix hit finds a
//! block on the rank its place in the sequence asks for.

use std::collections::{BTreeMap, HashMap};

/// A block's identity in the prefix cache: its parent's key and its own tokens, hashed.
pub type BlockKey = [u8; 16];

fn key_of(parent: Option<&BlockKey>, tokens: &[u32]) -> BlockKey {
    let mut h = blake3::Hasher::new();
    h.update(parent.map_or(&[0u8; 16][..], |p| &p[..]));
    for t in tokens {
        h.update(&t.to_le_bytes());
    }
    h.finalize().as_bytes()[..16].try_into().unwrap()
}

/// What a cached block holds, to confirm a hit beyond its hash.
#[derive(Clone, Debug)]
struct Cached {
    key: BlockKey,
    parent: Option<BlockKey>,
    tokens: Vec<u32>,
}

/// The blocks' reference counts, their free queue and the prefix index.
pub struct BlockPool {
    pub block_size: usize,
    refs: Vec<u32>,
    cached: Vec<Option<Cached>>,
    by_key: HashMap<BlockKey, usize>,
    /// Blocks no sequence holds, by the time they were released (oldest first), a queue per
    /// shard (block `b` is shard `b % shards`).
    free: Vec<BTreeMap<u64, usize>>,
    stamp_of: Vec<Option<u64>>,
    clock: u64,
    pub hits: u64,
    pub lookups: u64,
}

impl BlockPool {
    pub fn new(blocks: usize, block_size: usize) -> BlockPool {
        BlockPool::striped(blocks, 1, block_size)
    }

    /// `blocks` blocks on each of `shards` ranks (block `b` on rank `b % shards`).
    pub fn striped(blocks: usize, shards: usize, block_size: usize) -> BlockPool {
        assert!(blocks > 0 && shards > 0 && block_size > 0);
        let blocks = blocks * shards;
        let mut c = BlockPool {
            block_size,
            refs: vec![0; blocks],
            cached: vec![None; blocks],
            by_key: HashMap::new(),
            free: vec![BTreeMap::new(); shards],
            stamp_of: vec![None; blocks],
            clock: 0,
            hits: 0,
            lookups: 0,
        };
        for b in 0..blocks {
            c.release_to_queue(b);
        }
        c
    }

    pub fn total_blocks(&self) -> usize {
        self.refs.len()
    }

    /// Blocks that can be taken now (free, cached or not).
    pub fn free_blocks(&self) -> usize {
        self.free.iter().map(BTreeMap::len).sum()
    }

    /// The ranks the blocks are striped over (1 but under context parallelism).
    pub fn shards(&self) -> usize {
        self.free.len()
    }

    pub fn used_blocks(&self) -> usize {
        self.total_blocks() - self.free_blocks()
    }

    fn release_to_queue(&mut self, b: usize) {
        self.clock += 1;
        let shards = self.free.len();
        self.free[b % shards].insert(self.clock, b);
        self.stamp_of[b] = Some(self.clock);
    }

    fn take_from_queue(&mut self, b: usize) {
        if let Some(s) = self.stamp_of[b].take() {
            let shards = self.free.len();
            self.free[b % shards].remove(&s);
        }
    }

    /// A block for new tokens: the least recently released one, its cached contents dropped
    /// (the first shard's: a sequence's first block).
    pub fn allocate(&mut self) -> Option<usize> {
        self.allocate_at(0)
    }

    /// A block for a sequence's `j`-th block: the least recently released one of shard
    /// `j % shards`, its cached contents dropped.
    pub fn allocate_at(&mut self, j: usize) -> Option<usize> {
        let shards = self.free.len();
        let (_, b) = self.free[j % shards].pop_first()?;
        self.stamp_of[b] = None;
        if let Some(c) = self.cached[b].take() {
            self.by_key.remove(&c.key);
        }
        self.refs[b] = 1;
        Some(b)
    }

    /// The cached blocks that hold `tokens`' leading full blocks, each taken (its count
    /// raised), and the last one's key. Stops at the first miss, and never covers the last
    /// token: a sequence must run at least one token to get its next-token logits.
    pub fn match_prefix_keyed(&mut self, tokens: &[u32]) -> (Vec<usize>, Option<BlockKey>) {
        let usable = tokens.len().saturating_sub(1) / self.block_size;
        let mut out = Vec::new();
        let mut parent: Option<BlockKey> = None;
        for i in 0..usable {
            let toks = &tokens[i * self.block_size..(i + 1) * self.block_size];
            let key = key_of(parent.as_ref(), toks);
            self.lookups += 1;
            let Some(&b) = self.by_key.get(&key) else { break };
            let c = self.cached[b].as_ref().expect("keyed blocks are cached");
            if c.tokens != toks || c.parent != parent {
                break;
            }
            self.hits += 1;
            if self.refs[b] == 0 {
                self.take_from_queue(b);
            }
            self.refs[b] += 1;
            out.push(b);
            parent = Some(key);
        }
        (out, parent)
    }

    /// `match_prefix_keyed` without the key.
    pub fn match_prefix(&mut self, tokens: &[u32]) -> Vec<usize> {
        self.match_prefix_keyed(tokens).0
    }

    /// Registers block `b`, now full with the keys and values of `tokens` after the blocks
    /// whose key is `parent`, for reuse. Returns its key (the next block's parent).
    pub fn publish(&mut self, b: usize, parent: Option<BlockKey>, tokens: &[u32]) -> BlockKey {
        assert_eq!(tokens.len(), self.block_size);
        let key = key_of(parent.as_ref(), tokens);
        if self.cached[b].is_none() && !self.by_key.contains_key(&key) {
            self.by_key.insert(key, b);
            self.cached[b] = Some(Cached { key, parent, tokens: tokens.to_vec() });
        }
        key
    }

    /// Takes one more hold on block `b`, which a sequence holds (to share it as it is).
    pub fn take(&mut self, b: usize) {
        if self.refs[b] == 0 {
            self.take_from_queue(b);
        }
        self.refs[b] += 1;
    }

    /// A sequence lets go of its blocks (given first to last); each goes back to the free
    /// queue when no one holds it. The tail is queued first, so it is evicted first and the
    /// head — the likelier shared prefix — stays cached longest (as vLLM does).
    pub fn release(&mut self, blocks: &[usize]) {
        for &b in blocks.iter().rev() {
            assert!(self.refs[b] > 0, "block {b} released twice");
            self.refs[b] -= 1;
            if self.refs[b] == 0 {
                self.release_to_queue(b);
            }
        }
    }

    /// Checks the bookkeeping: every block is either held (count > 0) or queued, never both.
    pub fn check(&self) {
        for b in 0..self.total_blocks() {
            assert_eq!(self.refs[b] == 0, self.stamp_of[b].is_some(), "block {b}");
        }
        assert_eq!(self.free_blocks(), self.refs.iter().filter(|&&r| r == 0).count());
        for (shard, q) in self.free.iter().enumerate() {
            assert!(q.values().all(|b| b % self.free.len() == shard), "a block queued on another shard");
        }
        for (k, &b) in &self.by_key {
            assert_eq!(self.cached[b].as_ref().map(|c| c.key), Some(*k));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::{Rng, SeedableRng};

    #[test]
    fn a_striped_pool_gives_each_place_in_a_sequence_its_ranks_blocks() {
        let mut kv = BlockPool::striped(3, 2, 4);
        assert_eq!((kv.total_blocks(), kv.shards(), kv.free_blocks()), (6, 2, 6));
        let even: Vec<usize> = [0, 2, 4].iter().map(|&j| kv.allocate_at(j).unwrap()).collect();
        assert!(even.iter().all(|b| b % 2 == 0), "{even:?}");
        assert_eq!(kv.allocate_at(6), None, "rank 0's blocks are all taken");
        let odd = kv.allocate_at(1).unwrap();
        assert_eq!(odd % 2, 1);
        assert_eq!(kv.free_blocks(), 2);
        kv.release(&even);
        kv.check();
        // released blocks go back to their own rank's queue, oldest first
        assert_eq!(kv.allocate_at(0), Some(even[2]), "the tail is queued first");
        kv.check();
    }

    #[test]
    fn prefixes_are_shared_and_evicted_oldest_first() {
        let mut kv = BlockPool::new(4, 2);
        let a = [1, 2, 3, 4, 5];
        // sequence A computes 3 blocks, publishes its 2 full ones
        let blocks: Vec<usize> = (0..3).map(|_| kv.allocate().unwrap()).collect();
        let k0 = kv.publish(blocks[0], None, &a[0..2]);
        kv.publish(blocks[1], Some(k0), &a[2..4]);
        // B shares the first two blocks while A runs: hits, counts raised
        assert_eq!(kv.match_prefix(&[1, 2, 3, 4, 9]), blocks[..2].to_vec());
        assert_eq!(kv.hits, 2);
        // a prompt equal to A's 4 tokens reuses only the first block (one token must run)
        assert_eq!(kv.match_prefix(&[1, 2, 3, 4]), blocks[..1].to_vec());
        // another first block does not match a later one with the same tokens
        assert_eq!(kv.match_prefix(&[3, 4, 1, 2, 0]), Vec::<usize>::new());
        // lookups: 2 blocks tried, 1 (one token must run), 1 (a miss ends the walk); 3 hits
        assert_eq!((kv.lookups, kv.hits), (4, 3));
        kv.release(&blocks);
        kv.release(&blocks[..2]);
        kv.release(&blocks[..1]);
        kv.check();
        assert_eq!(kv.free_blocks(), 4);
        // all released: cached blocks still hit
        assert_eq!(kv.match_prefix(&[1, 2, 3, 4, 0]), blocks[..2].to_vec());
        kv.release(&blocks[..2]);
        // taking all 4 blocks evicts the never-used one, then A's tail, then its head
        let order: Vec<usize> = (0..4).map(|_| kv.allocate().unwrap()).collect();
        assert_eq!(&order[..2], &[3, blocks[2]]);
        assert_eq!(kv.allocate(), None, "no block left");
        assert!(kv.match_prefix(&[1, 2, 3, 4, 0]).is_empty(), "evicted blocks no longer hit");
        kv.check();
    }

    #[test]
    fn blocks_are_counted_as_taken_and_given_back() {
        let mut kv = BlockPool::new(3, 4);
        assert_eq!((kv.total_blocks(), kv.free_blocks(), kv.used_blocks()), (3, 3, 0));
        let b = kv.allocate().unwrap();
        assert_eq!((kv.free_blocks(), kv.used_blocks()), (2, 1));
        kv.release(&[b]);
        assert_eq!(kv.used_blocks(), 0);
    }

    #[test]
    fn a_hash_that_names_other_tokens_is_not_a_hit() {
        // a collision planted by hand: the key of [7, 8] names a block that holds [1, 2]
        let mut kv = BlockPool::new(2, 2);
        let b = kv.allocate().unwrap();
        kv.publish(b, None, &[1, 2]);
        kv.by_key.insert(key_of(None, &[7, 8]), b);
        assert!(kv.match_prefix(&[7, 8, 0]).is_empty(), "a block was taken for tokens it does not hold");
        // and a block whose tokens match under another parent is not a hit either
        let c = kv.allocate().unwrap();
        kv.publish(c, Some([9; 16]), &[3, 4]);
        kv.by_key.insert(key_of(Some(&key_of(None, &[1, 2])), &[3, 4]), c);
        assert_eq!(kv.match_prefix(&[1, 2, 3, 4, 0]), vec![b]);
    }

    #[test]
    fn the_same_block_computed_twice_stays_findable_after_either_is_evicted() {
        // two sequences computed the same first block before either published it
        let mut kv = BlockPool::new(3, 2);
        let (a, b) = (kv.allocate().unwrap(), kv.allocate().unwrap());
        let ka = kv.publish(a, None, &[5, 6]);
        let kb = kv.publish(b, None, &[5, 6]);
        assert_eq!(ka, kb);
        kv.release(&[a]);
        kv.release(&[b]);
        // the first published copy is the cached one: a hit finds it
        assert_eq!(kv.match_prefix(&[5, 6, 0]), vec![a]);
        kv.release(&[a]);
        // the never-used block is taken, then the copy that was never cached: the cached copy
        // still hits
        assert_eq!((kv.allocate(), kv.allocate()), (Some(2), Some(b)));
        kv.check();
        assert_eq!(kv.match_prefix(&[5, 6, 0]), vec![a], "the cached copy was lost when the other was taken");
    }

    #[test]
    #[should_panic(expected = "block 0")]
    fn the_bookkeeping_check_sees_a_block_both_held_and_queued() {
        let mut kv = BlockPool::new(2, 2);
        kv.check();
        kv.refs[0] = 1; // held, yet still in the free queue
        kv.check();
    }

    #[test]
    #[should_panic(expected = "released twice")]
    fn a_block_released_twice_is_a_bug_caught() {
        let mut kv = BlockPool::new(2, 2);
        let b = kv.allocate().unwrap();
        kv.release(&[b]);
        kv.release(&[b]);
    }

    /// Random sequences against a plain model of who holds what: counts, the free queue and
    /// the prefix index stay consistent, no block is lost, and a hit always holds the tokens.
    #[test]
    fn random_use_keeps_every_block_accounted_for() {
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(5);
        let bs = 3;
        let mut kv = BlockPool::new(12, bs);
        let mut live: Vec<(Vec<u32>, Vec<usize>)> = Vec::new();
        let mut contents: HashMap<usize, Vec<u32>> = HashMap::new();
        for _ in 0..3000 {
            if rng.gen_bool(0.5) || live.is_empty() {
                let n = rng.gen_range(1..12);
                let toks: Vec<u32> = (0..n).map(|_| rng.gen_range(0..3)).collect();
                let mut blocks = kv.match_prefix(&toks);
                for (i, &b) in blocks.iter().enumerate() {
                    assert_eq!(contents[&b], toks[i * bs..(i + 1) * bs], "a hit holds other tokens");
                }
                let mut ok = true;
                while blocks.len() * bs < n {
                    match kv.allocate() {
                        Some(b) => blocks.push(b),
                        None => {
                            ok = false;
                            break;
                        }
                    }
                }
                if !ok {
                    kv.release(&blocks);
                    continue;
                }
                let mut parent = None;
                for (i, &b) in blocks.iter().enumerate().take(n / bs) {
                    contents.insert(b, toks[i * bs..(i + 1) * bs].to_vec());
                    parent = Some(kv.publish(b, parent, &toks[i * bs..(i + 1) * bs]));
                }
                live.push((toks, blocks));
            } else {
                let (_, blocks) = live.swap_remove(rng.gen_range(0..live.len()));
                kv.release(&blocks);
            }
            kv.check();
            let held: usize = live.iter().map(|(_, b)| b.len()).sum();
            assert!(kv.used_blocks() <= held);
        }
        for (_, b) in live.drain(..) {
            kv.release(&b);
        }
        assert_eq!(kv.free_blocks(), 12);
        assert!(kv.hits > 0);
    }
}
