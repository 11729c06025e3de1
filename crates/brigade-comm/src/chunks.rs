//! How a buffer of `n` elements is split over `size` ranks for reduce-scatter and all-gather:
//! the first `n % size` ranks hold one element more.

use std::ops::Range;

pub fn chunk_range(n: usize, size: usize, rank: usize) -> Range<usize> {
    let base = n / size;
    let rem = n % size;
    let start = rank * base + rank.min(rem);
    start..start + base + usize::from(rank < rem)
}

#[cfg(test)]
mod tests {
    use super::chunk_range;

    #[test]
    fn chunks_tile_the_buffer() {
        for n in [0, 1, 2, 7, 8, 13, 100] {
            for size in 1..9 {
                let mut next = 0;
                for r in 0..size {
                    let c = chunk_range(n, size, r);
                    assert_eq!(c.start, next);
                    assert!(c.len() == n / size || c.len() == n / size + 1);
                    next = c.end;
                }
                assert_eq!(next, n);
            }
        }
    }
}
