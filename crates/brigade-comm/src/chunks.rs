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

    /// Written out by hand from the rule, not computed by it.
    #[test]
    fn the_first_ranks_hold_the_remainder() {
        type Case = (usize, usize, &'static [(usize, usize)]);
        let cases: &[Case] = &[
            (10, 3, &[(0, 4), (4, 7), (7, 10)]),
            (11, 3, &[(0, 4), (4, 8), (8, 11)]),
            (12, 3, &[(0, 4), (4, 8), (8, 12)]),
            (7, 4, &[(0, 2), (2, 4), (4, 6), (6, 7)]),
            (5, 4, &[(0, 2), (2, 3), (3, 4), (4, 5)]),
            (2, 4, &[(0, 1), (1, 2), (2, 2), (2, 2)]),
            (0, 2, &[(0, 0), (0, 0)]),
            (9, 1, &[(0, 9)]),
        ];
        for &(n, size, want) in cases {
            let got: Vec<(usize, usize)> =
                (0..size).map(|r| chunk_range(n, size, r)).map(|c| (c.start, c.end)).collect();
            assert_eq!(got, want, "chunk_range({n}, {size}, ·)");
        }
    }

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
