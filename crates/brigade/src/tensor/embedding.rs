//! Token + learned position embedding.

/// `out[b,t,:] = wte[tokens[b,t],:] + wpe[t,:]`. Token ids must be `< vocab` (checked by the
/// caller, which turns a bad id into an error).
pub fn embedding_forward(out: &mut [f32], wte: &[f32], wpe: &[f32], tokens: &[u32], t: usize, c: usize) {
    assert_eq!(out.len(), tokens.len() * c);
    for (i, (row, &tok)) in out.chunks_exact_mut(c).zip(tokens).enumerate() {
        let e = &wte[tok as usize * c..][..c];
        let p = &wpe[(i % t) * c..][..c];
        for ((o, &e), &p) in row.iter_mut().zip(e).zip(p) {
            *o = e + p;
        }
    }
}

/// Accumulates `dwte[tok] += dout[b,t]` and `dwpe[t] += dout[b,t]`, serially so that
/// repeated tokens add in a fixed order.
pub fn embedding_backward(dwte: &mut [f32], dwpe: &mut [f32], dout: &[f32], tokens: &[u32], t: usize, c: usize) {
    for (i, (row, &tok)) in dout.chunks_exact(c).zip(tokens).enumerate() {
        let e = &mut dwte[tok as usize * c..][..c];
        for (e, &d) in e.iter_mut().zip(row) {
            *e += d;
        }
        let p = &mut dwpe[(i % t) * c..][..c];
        for (p, &d) in p.iter_mut().zip(row) {
            *p += d;
        }
    }
}
