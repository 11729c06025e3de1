//! The per-rank allocator counts what each rank's threads allocate, wherever it is freed.

use brigade::alloc::{live_bytes, peak_bytes, reset_peak, set_rank, RankAlloc};

#[global_allocator]
static ALLOC: RankAlloc = RankAlloc;

const MB: usize = 1 << 20;

#[test]
fn each_rank_is_charged_for_its_own_allocations() {
    // rank 5: a 40 MB buffer, grown, shrunk and freed by another thread
    let (before5, before6) = std::thread::spawn(|| {
        set_rank(Some(5));
        reset_peak(5);
        let base = live_bytes(5).unwrap();
        let mut v: Vec<u8> = vec![1; 40 * MB];
        assert_eq!(live_bytes(5).unwrap() - base, 40 * MB);
        v.reserve_exact(60 * MB); // realloc to 100 MB
        assert_eq!(live_bytes(5).unwrap() - base, 100 * MB);
        v.truncate(10 * MB);
        v.shrink_to_fit();
        assert_eq!(live_bytes(5).unwrap() - base, 10 * MB);
        // rank 6's thread pool, started from a rank-6 thread, allocates for rank 6
        let six = std::thread::spawn(|| {
            set_rank(Some(6));
            reset_peak(6);
            let base6 = live_bytes(6).unwrap();
            let w = brigade::with_threads(2, || rayon::join(|| vec![0u8; 8 * MB], || vec![0u8; 8 * MB])).unwrap();
            // the two buffers, and the pool's own small bookkeeping
            let held = live_bytes(6).unwrap() - base6;
            assert!((16 * MB..17 * MB).contains(&held), "{held}");
            (w, base6)
        })
        .join()
        .unwrap();
        (v, base, six)
    })
    .join()
    .map(|(v, base, (w, base6))| {
        assert!(peak_bytes(5).unwrap() - base >= 100 * MB, "the peak saw the 100 MB");
        // freed here, on a thread of no rank: still rank 5's and 6's bytes that go
        drop(v);
        drop(w);
        (base, base6)
    })
    .unwrap();
    assert_eq!(live_bytes(5).unwrap(), before5);
    // (less whatever the pool's exiting threads still hold)
    assert!(live_bytes(6).unwrap() < before6 + MB);
}
