//! The floats of the paged KV cache (PagedAttention's layout): every block's keys and values,
//! layer by layer, as the model writes and reads them. Which block a sequence holds, and
//! which blocks are free or cached, is the scheduler's to know; here a block is only a
//! number. Each tensor-parallel rank holds a `KvStore` of its own key/value heads, indexed by
//! the block numbers rank 0 schedules.
//!
//! The cache holds f32 (the default: every bit as computed) or f16 (`--kv-cache-dtype f16`,
//! llama.cpp's default): each key and value rounded to the nearest half when written, half the
//! memory and half the bytes a decode step's attention reads. Attention converts the halves
//! back exactly, so an f16 cache gives what an f32 cache holding the same rounded numbers gives,
//! bit for bit — batch invariance and the parallel layouts' equalities hold for either.

use half::f16;

/// What one key or value number is held as.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum KvDtype {
    F32,
    F16,
}

impl KvDtype {
    /// Bytes a number takes.
    pub fn bytes(self) -> usize {
        match self {
            KvDtype::F32 => 4,
            KvDtype::F16 => 2,
        }
    }
}

impl std::fmt::Display for KvDtype {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str(match self {
            KvDtype::F32 => "f32",
            KvDtype::F16 => "f16",
        })
    }
}

/// The cache's numbers, `[block][layer][k|v][slot][width]`.
enum Data {
    F32(Vec<f32>),
    F16(Vec<f16>),
}

pub struct KvStore {
    pub block_size: usize,
    pub layers: usize,
    /// Numbers of one token's keys (= its values) in one layer.
    pub width: usize,
    blocks: usize,
    data: Data,
}

/// The cache's numbers as one type, for reading: slots of `T` (f32 or f16).
pub struct Slots<'a, T> {
    store: &'a KvStore,
    data: &'a [T],
}

impl<T> Slots<'_, T> {
    /// The key (kv = 0) or value (kv = 1) vector of `slot` in block `b`, layer `layer`.
    pub fn slot(&self, b: usize, layer: usize, kv: usize, slot: usize) -> &[T] {
        let o = self.store.offset(b, layer, kv, slot);
        &self.data[o..o + self.store.width]
    }
}

/// The cache read as its own type.
pub enum View<'a> {
    F32(Slots<'a, f32>),
    F16(Slots<'a, f16>),
}

impl KvStore {
    /// An f32 cache.
    pub fn new(blocks: usize, block_size: usize, layers: usize, width: usize) -> KvStore {
        KvStore::with_dtype(blocks, block_size, layers, width, KvDtype::F32)
    }

    /// A cache of `blocks` blocks of `block_size` tokens, holding `dtype`.
    pub fn with_dtype(blocks: usize, block_size: usize, layers: usize, width: usize, dtype: KvDtype) -> KvStore {
        assert!(blocks > 0 && block_size > 0);
        let n = blocks * layers * 2 * block_size * width;
        let data = match dtype {
            KvDtype::F32 => Data::F32(vec![0f32; n]),
            // zeroed as `vec![0u16; n]` allocates it (the allocator's zeroed pages, faulted in
            // as they are first written, as the f32 cache's): `vec![f16::ZERO; n]` would write
            // every element now, the whole --kv-cache-mib resident at start
            KvDtype::F16 => Data::F16(half::vec::HalfBitsVecExt::reinterpret_into(vec![0u16; n])),
        };
        KvStore { block_size, layers, width, blocks, data }
    }

    /// Blocks of `bytes` at most for a model of `layers` × `width`, numbers of `dtype`.
    pub fn blocks_for_bytes(bytes: usize, block_size: usize, layers: usize, width: usize, dtype: KvDtype) -> usize {
        bytes / (layers * 2 * block_size * width * dtype.bytes())
    }

    /// The blocks it holds.
    pub fn blocks(&self) -> usize {
        self.blocks
    }

    pub fn dtype(&self) -> KvDtype {
        match self.data {
            Data::F32(_) => KvDtype::F32,
            Data::F16(_) => KvDtype::F16,
        }
    }

    /// Copies the keys and values of the first `n` slots of block `src` into block `dst`, in
    /// every layer.
    pub fn copy_slots(&mut self, src: usize, dst: usize, n: usize) {
        assert!(n <= self.block_size && src != dst);
        for layer in 0..self.layers {
            for kv in 0..2 {
                let (from, to) = (self.offset(src, layer, kv, 0), self.offset(dst, layer, kv, 0));
                match &mut self.data {
                    Data::F32(d) => d.copy_within(from..from + n * self.width, to),
                    Data::F16(d) => d.copy_within(from..from + n * self.width, to),
                }
            }
        }
    }

    fn offset(&self, b: usize, layer: usize, kv: usize, slot: usize) -> usize {
        (((b * self.layers + layer) * 2 + kv) * self.block_size + slot) * self.width
    }

    /// Stores `x` (`width` numbers) as the key (kv = 0) or value (kv = 1) of `slot` in block
    /// `b`, layer `layer`: as they are in an f32 cache, each rounded to the nearest half in an
    /// f16 one.
    pub fn write(&mut self, b: usize, layer: usize, kv: usize, slot: usize, x: &[f32]) {
        assert_eq!(x.len(), self.width, "a key or value row of the cache's width");
        let o = self.offset(b, layer, kv, slot);
        match &mut self.data {
            Data::F32(d) => d[o..o + x.len()].copy_from_slice(x),
            Data::F16(d) => {
                use half::slice::HalfFloatSliceExt;
                d[o..o + x.len()].convert_from_f32_slice(x)
            }
        }
    }

    /// The key (kv = 0) or value (kv = 1) vector of `slot` in block `b`, layer `layer`, as
    /// f32 (an f16 cache's converted into `buf`).
    pub fn read<'a>(&'a self, b: usize, layer: usize, kv: usize, slot: usize, buf: &'a mut Vec<f32>) -> &'a [f32] {
        let o = self.offset(b, layer, kv, slot);
        match &self.data {
            Data::F32(d) => &d[o..o + self.width],
            Data::F16(d) => {
                buf.clear();
                buf.extend(d[o..o + self.width].iter().map(|h| h.to_f32()));
                buf
            }
        }
    }

    /// The cache as its own type, for attention's kernels.
    pub fn view(&self) -> View<'_> {
        match &self.data {
            Data::F32(d) => View::F32(Slots { store: self, data: d }),
            Data::F16(d) => View::F16(Slots { store: self, data: d }),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every slot read back as f32 (`read`, and `view`'s typed slots converted).
    fn read(kv: &KvStore, b: usize, l: usize, kvi: usize, s: usize) -> Vec<f32> {
        let mut buf = Vec::new();
        let r = kv.read(b, l, kvi, s, &mut buf).to_vec();
        let typed: Vec<f32> = match kv.view() {
            View::F32(v) => v.slot(b, l, kvi, s).to_vec(),
            View::F16(v) => v.slot(b, l, kvi, s).iter().map(|h| h.to_f32()).collect(),
        };
        let bits = |v: &[f32]| v.iter().map(|x| x.to_bits()).collect::<Vec<_>>();
        assert_eq!(bits(&r), bits(&typed), "read and view agree");
        r
    }

    #[test]
    fn sizes_and_slots_are_where_the_layout_says() {
        // a block of 4 tokens, 3 layers, width 5: 3 · 2 · 4 · 5 numbers = 480 bytes in f32
        assert_eq!(KvStore::blocks_for_bytes(3 * 480 + 479, 4, 3, 5, KvDtype::F32), 3);
        assert_eq!(KvStore::blocks_for_bytes(479, 4, 3, 5, KvDtype::F32), 0);
        assert_eq!(KvStore::blocks_for_bytes(3 * 240 + 239, 4, 3, 5, KvDtype::F16), 3);
        assert_eq!(KvStore::blocks_for_bytes(239, 4, 3, 5, KvDtype::F16), 0);
        for dtype in [KvDtype::F32, KvDtype::F16] {
            let mut kv = KvStore::with_dtype(3, 4, 3, 5, dtype);
            assert_eq!((kv.blocks(), kv.dtype()), (3, dtype));
            // every (block, layer, k|v, slot) has its own width-long vector, none overlapping
            // (integers below 2048: exact in f16 too)
            let mut n = 0f32;
            for b in 0..3 {
                for l in 0..3 {
                    for kvi in 0..2 {
                        for s in 0..4 {
                            let x: Vec<f32> = (0..5).map(|i| n + i as f32).collect();
                            kv.write(b, l, kvi, s, &x);
                            n += 5.0;
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
                            assert_eq!(read(&kv, b, l, kvi, s), want, "{dtype}: block {b} layer {l} kv {kvi} slot {s}");
                            n += 5.0;
                        }
                    }
                }
            }
        }
    }

    /// An f16 cache holds each number rounded to the nearest half (ties to even), overflow to
    /// infinity, NaN kept: what IEEE 754's conversion gives, checked against the bits written
    /// out by hand for a few and `half`'s scalar conversion for the rest.
    #[test]
    fn an_f16_cache_rounds_each_number_to_the_nearest_half() {
        let mut kv = KvStore::with_dtype(1, 1, 1, 8, KvDtype::F16);
        // 1 + 2⁻¹¹ is halfway between 1 and 1 + 2⁻¹⁰: ties to even gives 1; 1 + 3·2⁻¹¹ rounds up
        let x = [1.0 + 2f32.powi(-11), 1.0 + 3.0 * 2f32.powi(-11), 65504.0, 65520.0, -1e-8, 1.0 / 3.0, f32::NAN, -2.5];
        kv.write(0, 0, 0, 0, &x);
        let got = read(&kv, 0, 0, 0, 0);
        assert_eq!(got[0], 1.0);
        assert_eq!(got[1], 1.0 + 2.0 * 2f32.powi(-10));
        assert_eq!(got[2], 65504.0, "the largest half");
        assert_eq!(got[3], f32::INFINITY, "past the largest half's rounding range");
        assert_eq!(got[4].to_bits(), (-0.0f32).to_bits(), "below the smallest subnormal half");
        assert_eq!(got[5], 0.333_251_95, "1/3 to 11 significant bits");
        assert!(got[6].is_nan());
        assert_eq!(got[7], -2.5);
        let scalar: Vec<f32> = x.iter().map(|&v| f16::from_f32(v).to_f32()).collect();
        assert_eq!(format!("{got:?}"), format!("{scalar:?}"));
    }

    #[test]
    fn copied_slots_carry_keys_and_values_of_every_layer() {
        for dtype in [KvDtype::F32, KvDtype::F16] {
            let mut kv = KvStore::with_dtype(2, 4, 2, 3, dtype);
            for l in 0..2 {
                for kvi in 0..2 {
                    for s in 0..4 {
                        kv.write(0, l, kvi, s, &[(l * 100 + kvi * 10 + s) as f32; 3]);
                    }
                }
            }
            kv.copy_slots(0, 1, 3);
            for l in 0..2 {
                for kvi in 0..2 {
                    for s in 0..3 {
                        assert_eq!(read(&kv, 1, l, kvi, s), [(l * 100 + kvi * 10 + s) as f32; 3], "{dtype}");
                    }
                    assert_eq!(read(&kv, 1, l, kvi, 3), [0.0; 3], "{dtype}: only the first 3 slots are copied");
                }
            }
        }
    }

    /// A cache is the allocator's zeroed pages, none written until a key or value is: creating
    /// 256 MiB of either kind leaves this process's resident memory within 64 MiB of where it
    /// was (Linux: `/proc/self/statm`).
    #[test]
    fn a_new_cache_is_not_written_until_used() {
        let resident = || -> Option<usize> {
            let statm = std::fs::read_to_string("/proc/self/statm").ok()?;
            Some(statm.split_whitespace().nth(1)?.parse::<usize>().ok()? * 4096)
        };
        if resident().is_none() {
            println!("skipped: no /proc/self/statm here");
            return;
        }
        for dtype in [KvDtype::F32, KvDtype::F16] {
            // 256 MiB: 64 blocks of 16 tokens × 8 layers × keys and values × 2048 numbers (f32),
            // twice the blocks in f16
            let blocks = (256 << 20) / (16 * 8 * 2 * 2048 * dtype.bytes());
            let before = resident().unwrap();
            let mut kv = KvStore::with_dtype(blocks, 16, 8, 2048, dtype);
            let after = resident().unwrap();
            assert!(
                after < before + (64 << 20),
                "{dtype}: a new cache of 256 MiB made {} MiB resident",
                (after - before) >> 20
            );
            kv.write(blocks - 1, 7, 1, 15, &[1.5; 2048]);
            assert_eq!(read(&kv, blocks - 1, 7, 1, 15), [1.5; 2048]);
            assert_eq!(read(&kv, 0, 0, 0, 0), [0.0; 2048], "{dtype}: zeros where nothing was written");
        }
    }
}
