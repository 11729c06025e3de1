//! Token and learned position embeddings. The token table may be a window of the vocabulary
//! (a rank's shard): tokens outside it contribute zero rows, summed across windows by the caller.

use super::docs::Docs;

/// `out[i,:] = wte[tokens[i] − lo,:]` for tokens in `lo..lo + rows`, else 0. Token ids are
/// checked against the vocabulary by the caller.
pub fn token_embedding_forward(out: &mut [f32], wte: &[f32], tokens: &[u32], lo: usize, c: usize) {
    assert_eq!(out.len(), tokens.len() * c);
    let rows = wte.len() / c;
    for (row, &tok) in out.chunks_exact_mut(c).zip(tokens) {
        match (tok as usize).checked_sub(lo).filter(|&r| r < rows) {
            Some(r) => row.copy_from_slice(&wte[r * c..][..c]),
            None => row.fill(0.0),
        }
    }
}

/// Accumulates `dwte[tokens[i] − lo] += dout[i]` for tokens in the window, serially so that
/// repeated tokens add in a fixed order.
pub fn token_embedding_backward(dwte: &mut [f32], dout: &[f32], tokens: &[u32], lo: usize, c: usize) {
    let rows = dwte.len() / c;
    for (row, &tok) in dout.chunks_exact(c).zip(tokens) {
        if let Some(r) = (tok as usize).checked_sub(lo).filter(|&r| r < rows) {
            for (e, &d) in dwte[r * c..][..c].iter_mut().zip(row) {
                *e += d;
            }
        }
    }
}

/// `out[i,:] = x[i,:] + wpe[pos(row0 + i),:]`: rows `row0..` of a `[b, t]` batch, at their
/// positions (`docs`: `(row0 + i) mod t`, or in their packed documents).
pub fn position_forward(out: &mut [f32], x: &[f32], wpe: &[f32], (row0, docs): (usize, Docs), t: usize, c: usize) {
    for (i, (o, x)) in out.chunks_exact_mut(c).zip(x.chunks_exact(c)).enumerate() {
        let p = &wpe[docs.pos(row0 + i, t) * c..][..c];
        for ((o, &x), &p) in o.iter_mut().zip(x).zip(p) {
            *o = x + p;
        }
    }
}

/// Accumulates `dwpe[pos(row0 + i)] += dout[i]`, serially.
pub fn position_backward(dwpe: &mut [f32], dout: &[f32], (row0, docs): (usize, Docs), t: usize, c: usize) {
    for (i, row) in dout.chunks_exact(c).enumerate() {
        for (p, &d) in dwpe[docs.pos(row0 + i, t) * c..][..c].iter_mut().zip(row) {
            *p += d;
        }
    }
}
