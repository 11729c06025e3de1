//! The floats of the paged KV cache (PagedAttention's layout): every block's keys and values,
//! layer by layer, as the model writes and reads them. Which block a sequence holds, and
//! which blocks are free or cached, is the scheduler's to know; here a block is only a
//! number. Each tensor-parallel rank holds a `KvStore` of its own key/value heads, indexed by
//! the block numbers rank 0 schedules.

pub struct KvStore {
    pub block_size: usize,
    pub layers: usize,
    /// Floats of one token's keys (= its values) in one layer.
    pub width: usize,
    blocks: usize,
    /// `[block][layer][k|v][slot][width]`.
    data: Vec<f32>,
}

impl KvStore {
    pub fn new(blocks: usize, block_size: usize, layers: usize, width: usize) -> KvStore {
        assert!(blocks > 0 && block_size > 0);
        KvStore { block_size, layers, width, blocks, data: vec![0f32; blocks * layers * 2 * block_size * width] }
    }

    /// Blocks of `bytes` at most for a model of `layers` × `width`.
    pub fn blocks_for_bytes(bytes: usize, block_size: usize, layers: usize, width: usize) -> usize {
        bytes / (layers * 2 * block_size * width * 4)
    }

    /// The blocks it holds.
    pub fn blocks(&self) -> usize {
        self.blocks
    }

    /// Copies the keys and values of the first `n` slots of block `src` into block `dst`, in
    /// every layer.
    pub fn copy_slots(&mut self, src: usize, dst: usize, n: usize) {
        assert!(n <= self.block_size && src != dst);
        for layer in 0..self.layers {
            for kv in 0..2 {
                let (from, to) = (self.offset(src, layer, kv, 0), self.offset(dst, layer, kv, 0));
                self.data.copy_within(from..from + n * self.width, to);
            }
        }
    }

    fn offset(&self, b: usize, layer: usize, kv: usize, slot: usize) -> usize {
        (((b * self.layers + layer) * 2 + kv) * self.block_size + slot) * self.width
    }

    /// The key (kv = 0) or value (kv = 1) vector of `slot` in block `b`, layer `layer`.
    pub fn slot(&self, b: usize, layer: usize, kv: usize, slot: usize) -> &[f32] {
        let o = self.offset(b, layer, kv, slot);
        &self.data[o..o + self.width]
    }

    pub fn slot_mut(&mut self, b: usize, layer: usize, kv: usize, slot: usize) -> &mut [f32] {
        let o = self.offset(b, layer, kv, slot);
        &mut self.data[o..o + self.width]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_slots_are_where_the_layout_says() {
        // a block of 4 tokens, 3 layers, width 5: 3 · 2 · 4 · 5 floats = 480 bytes
        assert_eq!(KvStore::blocks_for_bytes(3 * 480 + 479, 4, 3, 5), 3);
        assert_eq!(KvStore::blocks_for_bytes(479, 4, 3, 5), 0);
        let mut kv = KvStore::new(3, 4, 3, 5);
        assert_eq!(kv.blocks(), 3);
        // every (block, layer, k|v, slot) has its own width-long vector, none overlapping
        let mut n = 0f32;
        for b in 0..3 {
            for l in 0..3 {
                for kvi in 0..2 {
                    for s in 0..4 {
                        kv.slot_mut(b, l, kvi, s).iter_mut().for_each(|x| {
                            *x = n;
                            n += 1.0;
                        });
                    }
                }
            }
        }
        let mut n = 0f32;
        for b in 0..3 {
            for l in 0..3 {
                for kvi in 0..2 {
                    for s in 0..4 {
                        let want: Vec<f32> = (0..5).map(|i| n + i as f32).collect();
                        assert_eq!(kv.slot(b, l, kvi, s), &want[..], "block {b} layer {l} kv {kvi} slot {s}");
                        n += 5.0;
                    }
                }
            }
        }
    }

    #[test]
    fn copied_slots_carry_keys_and_values_of_every_layer() {
        let mut kv = KvStore::new(2, 4, 2, 3);
        for l in 0..2 {
            for kvi in 0..2 {
                for s in 0..4 {
                    kv.slot_mut(0, l, kvi, s).fill((l * 100 + kvi * 10 + s) as f32);
                }
            }
        }
        kv.copy_slots(0, 1, 3);
        for l in 0..2 {
            for kvi in 0..2 {
                for s in 0..3 {
                    assert_eq!(kv.slot(1, l, kvi, s), kv.slot(0, l, kvi, s));
                }
                assert_eq!(kv.slot(1, l, kvi, 3), &[0.0; 3], "only the first 3 slots are copied");
            }
        }
    }
}
