//! Why a loss became non-finite, from what the run saw: the weights, the gradient norms, the
//! learning rate.

use super::trainer::Trainer;

impl Trainer {
    /// A non-finite loss, with what most likely caused it.
    pub(crate) fn explain_nonfinite_loss(&self, loss: f32, step: usize) -> String {
        // (under ZeRO-3 this rank holds only pieces: no parameter is named)
        let bad_param = match self.params.len() == self.parts.layout.total {
            true => self.parts.layout.specs.iter().find(|s| s.view.of(&self.params).iter().any(|v| !v.is_finite())),
            false => None,
        };
        let lr = self.cfg.lr;
        if self.grad_norms.is_empty() {
            // Nothing was updated in this process: the weights or the data are at fault.
            return match bad_param {
                Some(p) => format!("loss is {loss} at step {step}, before any update in this run: parameter '{}' holds non-finite values; the checkpoint is corrupt, resume from an earlier one", p.name),
                None => format!("loss is {loss} at step {step}, before any update in this run: the weights or the data overflow the forward pass (check the checkpoint and the data), not the learning rate"),
            };
        }
        let first = self.grad_norms[0];
        let last = self.grad_norms[self.grad_norms.len() - 1];
        let grew = !last.is_finite() || last > 100.0 * first.max(1e-12);
        let largest = self.params.iter().fold(0f32, |m, v| m.max(v.abs()));
        match bad_param {
            None if largest > 1e3 => format!("loss became {loss} at step {step}: the weights grew to {largest:.1e} (they start below 1): training diverged; lower --lr (now {lr:.2e})"),
            Some(p) => format!("loss became {loss} at step {step}: the weights overflowed during training ('{}' is no longer finite; gradient norm {first:.3e} at the first step, {last:.3e} at the last); lower --lr (now {lr:.2e})", p.name),
            None if grew => format!("loss became {loss} at step {step} after the gradient norm grew from {first:.3e} to {last:.3e}: training diverged; lower --lr (now {lr:.2e}) or set grad_clip (now {})", self.cfg.grad_clip),
            None => format!("loss became {loss} at step {step} with a steady gradient norm ({last:.3e}): an overflow in the activations, likely from the data of this step or too high a --lr (now {lr:.2e})"),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::train::{TrainConfig, Trainer};

    /// Each diagnosis of a non-finite loss, from the state that leads to it.
    #[test]
    fn a_nonfinite_loss_is_explained_by_what_the_run_saw() {
        let mut tr = Trainer::new(TrainConfig { n_embd: Some(16), n_head: Some(2), ..TrainConfig::default() }).unwrap();
        let says = |tr: &Trainer, needle: &str| {
            let m = tr.explain_nonfinite_loss(f32::NAN, 3);
            assert!(m.contains(needle), "expected '{needle}' in: {m}");
        };
        says(&tr, "before any update in this run: the weights or the data overflow");
        tr.grad_norms = vec![1.0, 2.0, 99.0];
        says(&tr, "with a steady gradient norm (9.900e1)");
        tr.grad_norms = vec![1.0, 100.0];
        says(&tr, "with a steady gradient norm (1.000e2)");
        tr.grad_norms = vec![2.0, 150.0];
        says(&tr, "with a steady gradient norm (1.500e2)");
        tr.grad_norms = vec![1.0, 2.0, 101.0];
        says(&tr, "after the gradient norm grew from 1.000e0 to 1.010e2");
        tr.grad_norms = vec![1.0, f32::INFINITY];
        says(&tr, "after the gradient norm grew");
        tr.grad_norms = vec![1.0, 1.0];
        tr.params[5] = 1000.0;
        says(&tr, "with a steady gradient norm");
        tr.params[5] = 1001.0;
        says(&tr, "the weights grew to 1.0e3");
        tr.params[5] = f32::NAN;
        says(&tr, "the weights overflowed during training ('wte.weight' is no longer finite");
        tr.grad_norms.clear();
        says(&tr, "before any update in this run: parameter 'wte.weight' holds non-finite values");
    }
}
