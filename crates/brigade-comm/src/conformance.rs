//! The collective test suite, shared by every backend: `cargo test` runs it on `local` rank
//! threads, and `.ci/run` runs it under `mpirun` on the `mpi` backend
//! (`examples/mpi_conformance.rs`). Each check compares against a naive reference that every
//! rank computes on its own: an f64 sum, which results must match within f32 rounding, and —
//! for `local`, which promises it — the f32 sum in rank order, bit for bit (MPI libraries pick
//! their own reduction order).

use std::sync::atomic::{AtomicBool, Ordering};

/// Whether reductions must equal the rank-order f32 sum exactly (set by the local tests).
pub static EXACT_RANK_ORDER: AtomicBool = AtomicBool::new(false);

use crate::{chunk_range, Comm, ReduceOp};

/// Lengths that catch edge cases: empty, one element, primes, sizes not divisible by the
/// group, and sizes on both sides of the small/large algorithm switch.
pub const FIXED_LENGTHS: &[usize] =
    &[0, 1, 2, 3, 5, 7, 13, 31, 64, 127, 128, 129, 1000, 4099, 16384, 16385, 20011, 100_003];

/// The fixed lengths plus six drawn at random (the same on every rank: a fixed-seed LCG).
pub fn lengths() -> Vec<usize> {
    let mut x: u64 = 0x2545_f491_4f6c_dd1d;
    let mut v = FIXED_LENGTHS.to_vec();
    for i in 0..6 {
        x = x.wrapping_mul(6_364_136_223_846_793_005).wrapping_add(1_442_695_040_888_963_407);
        let max = if i < 3 { 300 } else { 60_000 };
        v.push((x >> 33) as usize % max);
    }
    v
}

/// The value rank `r` holds at index `i` of a buffer of `len` (reproducible on every rank).
pub fn value(r: usize, i: usize, len: usize) -> f32 {
    let h = (r as u64 * 7919 + i as u64 * 104_729 + len as u64 * 31).wrapping_mul(0x9e37_79b9) >> 7;
    (h % 20_011) as f32 / 1000.0 - 10.0
}

fn data(r: usize, len: usize) -> Vec<f32> {
    (0..len).map(|i| value(r, i, len)).collect()
}

/// Reference reduction of index i over ranks 0..size: (f32 in rank order, f64, Σ|x|).
fn reference(size: usize, i: usize, len: usize, op: ReduceOp) -> (f32, f64, f64) {
    let xs: Vec<f32> = (0..size).map(|r| value(r, i, len)).collect();
    let abs: f64 = xs.iter().map(|&x| x.abs() as f64).sum();
    match op {
        ReduceOp::Max => {
            let m = xs.iter().cloned().fold(f32::NEG_INFINITY, f32::max);
            (m, m as f64, abs)
        }
        ReduceOp::Sum | ReduceOp::Avg => {
            let mut s = xs[0];
            for &x in &xs[1..] {
                s += x;
            }
            let s64: f64 = xs.iter().map(|&x| x as f64).sum();
            if op == ReduceOp::Avg {
                (s * (1.0 / size as f32), s64 / size as f64, abs / size as f64)
            } else {
                (s, s64, abs)
            }
        }
    }
}

fn check_reduced(
    what: &str,
    got: &[f32],
    idx: impl Iterator<Item = usize>,
    size: usize,
    len: usize,
    op: ReduceOp,
) -> Result<(), String> {
    for (g, i) in got.iter().zip(idx) {
        let (exact, r64, abs) = reference(size, i, len, op);
        if EXACT_RANK_ORDER.load(Ordering::Relaxed) && g.to_bits() != exact.to_bits() {
            return Err(format!("{what} len {len} op {op:?}: [{i}] = {g}, rank-order f32 reference {exact}"));
        }
        let tol = 2.0 * size as f64 * f32::EPSILON as f64 * abs + 1e-30;
        if (*g as f64 - r64).abs() > tol {
            return Err(format!("{what} len {len}: [{i}] = {g}, f64 reference {r64}"));
        }
    }
    Ok(())
}

pub fn all_reduce(c: &Comm) -> Result<(), String> {
    let (r, n) = (c.rank(), c.size());
    for len in lengths() {
        for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max] {
            let mut buf = data(r, len);
            c.all_reduce(&mut buf, op).map_err(|e| e.to_string())?;
            check_reduced("all_reduce", &buf, 0..len, n, len, op)?;
        }
    }
    Ok(())
}

pub fn reduce_scatter(c: &Comm) -> Result<(), String> {
    let (r, n) = (c.rank(), c.size());
    for len in lengths() {
        for op in [ReduceOp::Sum, ReduceOp::Avg, ReduceOp::Max] {
            let input = data(r, len);
            let mine = chunk_range(len, n, r);
            let mut out = vec![0f32; mine.len()];
            c.reduce_scatter(&input, &mut out, op).map_err(|e| e.to_string())?;
            check_reduced("reduce_scatter", &out, mine, n, len, op)?;
        }
    }
    Ok(())
}

pub fn all_gather(c: &Comm) -> Result<(), String> {
    let (r, n) = (c.rank(), c.size());
    for len in lengths() {
        let mine = chunk_range(len, n, r);
        let input: Vec<f32> = mine.clone().map(|i| value(r, i, len)).collect();
        let mut out = vec![f32::NAN; len];
        c.all_gather(&input, &mut out).map_err(|e| e.to_string())?;
        for (i, &g) in out.iter().enumerate() {
            let owner = (0..n).find(|&q| chunk_range(len, n, q).contains(&i)).expect("chunks tile");
            if g.to_bits() != value(owner, i, len).to_bits() {
                return Err(format!("all_gather len {len}: [{i}] = {g}, rank {owner} holds {}", value(owner, i, len)));
            }
        }
    }
    Ok(())
}

pub fn broadcast(c: &Comm) -> Result<(), String> {
    let (r, n) = (c.rank(), c.size());
    for len in lengths() {
        for root in 0..n {
            let mut buf = data(r, len);
            c.broadcast(&mut buf, root).map_err(|e| e.to_string())?;
            if buf != data(root, len) {
                return Err(format!("broadcast len {len} from root {root}: rank {r} got other values"));
            }
        }
    }
    Ok(())
}

/// A ring of sends, then two tags received in the opposite order of sending.
pub fn point_to_point(c: &Comm) -> Result<(), String> {
    let (r, n) = (c.rank(), c.size());
    if n == 1 {
        return Ok(());
    }
    let (next, prev) = ((r + 1) % n, (r + n - 1) % n);
    for &len in &[0usize, 1, 1000, 100_003] {
        c.send(&data(r, len), next, 7).map_err(|e| e.to_string())?;
        let mut got = vec![0f32; len];
        c.recv(&mut got, prev, 7).map_err(|e| e.to_string())?;
        if got != data(prev, len) {
            return Err(format!("recv from {prev}, len {len}: wrong values"));
        }
    }
    c.send(&data(r, 5), next, 1).map_err(|e| e.to_string())?;
    c.send(&data(r, 9), next, 2).map_err(|e| e.to_string())?;
    let (mut a, mut b) = (vec![0f32; 9], vec![0f32; 5]);
    c.recv(&mut a, prev, 2).map_err(|e| e.to_string())?;
    c.recv(&mut b, prev, 1).map_err(|e| e.to_string())?;
    if a != data(prev, 9) || b != data(prev, 5) {
        return Err("tagged messages mixed up".into());
    }
    c.barrier().map_err(|e| e.to_string())
}

/// Async all-reduces overlapped with each other and with work, then waited in reverse order.
pub fn async_overlap(c: &Comm) -> Result<(), String> {
    let (r, n) = (c.rank(), c.size());
    let lens = [3usize, 20011, 100_003];
    let handles: Vec<_> = lens.iter().map(|&len| c.all_reduce_async(data(r, len), ReduceOp::Sum)).collect();
    let rs = c.reduce_scatter_async(data(r, 4099), ReduceOp::Sum);
    let ag_len = 1000;
    let ag = c.all_gather_async(chunk_range(ag_len, n, r).map(|i| value(r, i, ag_len)).collect(), ag_len);
    let busy: f64 = (0..200_000).map(|i| (i as f64).sqrt()).sum(); // work while they run
    std::hint::black_box(busy);
    let gathered = ag.wait().map_err(|e| e.to_string())?;
    if (0..ag_len)
        .any(|i| gathered[i] != value((0..n).find(|&q| chunk_range(ag_len, n, q).contains(&i)).unwrap(), i, ag_len))
    {
        return Err("async all_gather: wrong values".into());
    }
    let mine = rs.wait().map_err(|e| e.to_string())?;
    check_reduced("async reduce_scatter", &mine, chunk_range(4099, n, r), n, 4099, ReduceOp::Sum)?;
    for (h, &len) in handles.into_iter().zip(&lens).rev() {
        let buf = h.wait().map_err(|e| e.to_string())?;
        check_reduced("async all_reduce", &buf, 0..len, n, len, ReduceOp::Sum)?;
    }
    // a blocking call after async ones runs after them
    let mut buf = data(r, 7);
    c.all_reduce(&mut buf, ReduceOp::Sum).map_err(|e| e.to_string())?;
    check_reduced("all_reduce after async", &buf, 0..7, n, 7, ReduceOp::Sum)
}

/// Splits into two interleaved groups (by rank parity, keys reversed) and a second split by
/// halves; runs the suite's all-reduce on one while an async all-reduce runs on the other.
pub fn groups(c: &Comm) -> Result<(), String> {
    let (r, n) = (c.rank(), c.size());
    let parity = c.split((r % 2) as u32, (n - r) as u32).map_err(|e| e.to_string())?;
    let members: Vec<usize> = (0..n).filter(|q| q % 2 == r % 2).rev().collect();
    if parity.size() != members.len() || members[parity.rank()] != r {
        return Err(format!("split by parity: rank {r} got rank {} of {}", parity.rank(), parity.size()));
    }
    let halves = c.split((r < n / 2) as u32, r as u32).map_err(|e| e.to_string())?;
    // the same ranks use both groups at once: an async op on one, blocking ops on the other
    let len = 20011;
    let h = halves.all_reduce_async(data(r, len), ReduceOp::Sum);
    let mut buf: Vec<f32> = vec![r as f32; 5];
    parity.all_reduce(&mut buf, ReduceOp::Sum).map_err(|e| e.to_string())?;
    let want: f32 = members.iter().map(|&q| q as f32).sum();
    if buf.iter().any(|&x| x != want) {
        return Err(format!("all_reduce in parity group: got {buf:?}, want {want}"));
    }
    let got = h.wait().map_err(|e| e.to_string())?;
    let half: Vec<usize> = (0..n).filter(|&q| (q < n / 2) == (r < n / 2)).collect();
    for (i, &g) in got.iter().enumerate().step_by(97) {
        let want: f64 = half.iter().map(|&q| value(q, i, len) as f64).sum();
        if (g as f64 - want).abs() > 1e-3 {
            return Err(format!("all_reduce in halves group: [{i}] = {g}, want {want}"));
        }
    }
    all_reduce(&parity)?;
    broadcast(&halves)
}

/// How many elements rank `src` sends rank `dst` in round `k`: uneven, often zero, sometimes
/// large (the same rule on every rank).
pub fn a2a_count(src: usize, dst: usize, k: usize) -> usize {
    let h = ((src * 131 + dst * 31 + k * 7919) as u64).wrapping_mul(0x9e37_79b9_7f4a_7c15) >> 40;
    match k % 4 {
        0 => (h % 7) as usize,    // small, often zero
        1 => (h % 3000) as usize, // uneven
        2 => {
            if src == dst {
                0
            } else {
                1
            }
        } // nothing to oneself
        _ => (h % 40_000) as usize, // large
    }
}

/// Uneven all-to-alls (a mixture of experts' dispatch), rank r's piece for s holding
/// `value(r, i, s)`, and the counts exchange before them.
pub fn all_to_all_v(c: &Comm) -> Result<(), String> {
    let (r, n) = (c.rank(), c.size());
    for k in 0..8 {
        let send: Vec<usize> = (0..n).map(|s| a2a_count(r, s, k)).collect();
        let recv: Vec<usize> = (0..n).map(|s| a2a_count(s, r, k)).collect();
        if c.all_to_all_counts(&send).map_err(|e| e.to_string())? != recv {
            return Err(format!("all_to_all_counts round {k}: rank {r} learned other counts"));
        }
        let input: Vec<f32> = (0..n).flat_map(|s| (0..send[s]).map(move |i| value(r, i, s))).collect();
        let mut out = vec![f32::NAN; recv.iter().sum()];
        c.all_to_all_v(&input, &send, &mut out, &recv).map_err(|e| e.to_string())?;
        let want: Vec<f32> = (0..n).flat_map(|s| (0..recv[s]).map(move |i| value(s, i, r))).collect();
        if let Some(i) = out.iter().zip(&want).position(|(a, b)| a.to_bits() != b.to_bits()) {
            return Err(format!("all_to_all_v round {k}: rank {r}'s element {i} is {}, not {}", out[i], want[i]));
        }
    }
    Ok(())
}

/// Every check, in an order all ranks follow.
pub fn run_all(c: &Comm) -> Result<(), String> {
    all_to_all_v(c)?;
    all_reduce(c)?;
    reduce_scatter(c)?;
    all_gather(c)?;
    broadcast(c)?;
    point_to_point(c)?;
    async_overlap(c)?;
    groups(c)
}
