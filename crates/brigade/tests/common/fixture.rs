//! Reading the safetensors fixtures other libraries wrote, and comparing against them.

use safetensors::SafeTensors;

/// Tensor `name` (f32) of a fixture.
pub fn f32s(st: &SafeTensors, name: &str) -> Vec<f32> {
    let t = st.tensor(name).unwrap_or_else(|_| panic!("fixture lacks {name}"));
    t.data().chunks_exact(4).map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]])).collect()
}

/// Token ids `name` (i64, `[rows, cols]`) of a fixture, with its two dimensions.
pub fn ids(st: &SafeTensors, name: &str) -> (Vec<u32>, usize, usize) {
    let t = st.tensor(name).unwrap_or_else(|_| panic!("fixture lacks {name}"));
    let v = t.data().chunks_exact(8).map(|c| i64::from_le_bytes(c.try_into().unwrap()) as u32).collect();
    (v, t.shape()[0], t.shape()[1])
}

/// max |a − b| / max |b|
pub fn rel_err(a: &[f32], b: &[f32]) -> f64 {
    assert_eq!(a.len(), b.len());
    let num = a.iter().zip(b).map(|(x, y)| (x - y).abs() as f64).fold(0.0, f64::max);
    let den = b.iter().map(|y| y.abs() as f64).fold(0.0, f64::max);
    num / den
}

/// Every parameter of `layout` has its gradient `grad.NAME` in the fixture, and the reverse;
/// each within 1e-4 (relative to its largest entry) of PyTorch's.
pub fn gradients_match(layout: &brigade::params::ParamLayout, grads: &[f32], st: &SafeTensors, what: &str) {
    let theirs: Vec<&str> = st.names().into_iter().filter_map(|n| n.strip_prefix("grad.")).collect();
    assert_eq!(theirs.len(), layout.specs.len(), "{what}: one gradient per parameter");
    for name in theirs {
        let spec = layout.get(name).unwrap_or_else(|| panic!("{what}: no parameter {name}"));
        let want = f32s(st, &format!("grad.{name}"));
        if want.iter().all(|&g| g == 0.0) {
            // (an expert no token chose) exactly zero on both sides
            assert!(spec.view.of(grads).iter().all(|&g| g == 0.0), "{what}: {name}'s gradient is PyTorch's zero");
            continue;
        }
        let e = rel_err(spec.view.of(grads), &want);
        assert!(e < 1e-4, "{what}: gradient of {name} differs from PyTorch by {e:.2e} (relative)");
    }
}
