//! Evaluation of a run: held-out accuracy on the addition task, validation loss on text, and
//! the single-worker model it runs on (gathered from the ranks when the model is cut).

use super::addition::Addition;
use super::data::Dataset;
use super::trainer::Trainer;
use crate::error::Result;
use crate::models::{generate, Activations, Gpt, SampleOptions};
use crate::nn::tp::Tp;

#[derive(Clone, Debug)]
pub enum EvalReport {
    /// Exact-match accuracy on held-out problems, with a few (prompt, expected, model) rows.
    Addition { correct: usize, total: usize, examples: Vec<(String, String, String)> },
    /// Mean loss on the held-out tail of the text.
    Text { val_loss: f32 },
}

impl std::fmt::Display for EvalReport {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        match self {
            EvalReport::Addition { correct, total, .. } => {
                write!(f, "held-out accuracy {:.1}% ({correct}/{total})", 100.0 * *correct as f64 / *total as f64)
            }
            EvalReport::Text { val_loss } => write!(f, "validation loss {val_loss:.4}"),
        }
    }
}

impl Trainer {
    /// The full model's parameters gathered over the tensor-parallel group and the pipeline's
    /// stages (and under ZeRO-3 the data-parallel group; every member must call it); `None` when this rank holds the whole
    /// model already.
    pub fn full_params(&self) -> Result<Option<Vec<f32>>> {
        if self.holds_whole_model() {
            return Ok(None);
        }
        self.full_of_local(&self.local_params()?).map(Some)
    }

    /// `full_params` for the first rank of the mesh only (what evaluates and writes): every rank
    /// calls it; the first gets the whole model when it is cut across ranks, the others `None`,
    /// and only the ranks on the way to the first build a full copy.
    pub fn full_params_to_first(&self) -> Result<Option<Vec<f32>>> {
        if self.holds_whole_model() {
            return Ok(None);
        }
        let local = self.local_params()?;
        if self.mesh.coords[crate::parallel::Axis::Dp] != 0 && !self.layout.divides_experts() {
            return Ok(None);
        }
        self.full_to_first(&local)
    }

    /// Whether `params` is the whole model (not cut across a tensor-parallel group, not left in
    /// ZeRO-3 pieces).
    fn holds_whole_model(&self) -> bool {
        !self.layout.runs_executor()
            && !self.model.layout.is_sharded()
            && self.dpc.zero < 3
            && !self.layout.divides_experts()
    }

    /// The single-worker model and its parameters: this rank's own, or `full` from
    /// `full_params` when the model is cut across ranks.
    pub fn whole_model<'a>(&'a self, full: Option<&'a [f32]>) -> (&'a Gpt, &'a [f32]) {
        match full {
            Some(f) => (&self.full_model, f),
            None => {
                assert!(self.holds_whole_model(), "a model cut across ranks is evaluated from full_params");
                (&self.model, &self.params)
            }
        }
    }

    /// Held-out accuracy (addition) or validation loss (text) of a model this rank holds whole.
    pub fn evaluate(&mut self) -> EvalReport {
        self.evaluate_with(None)
    }

    /// `evaluate` of the full parameters from `full_params` (or this rank's, when `None`).
    pub fn evaluate_with(&mut self, full: Option<&[f32]>) -> EvalReport {
        // the activations are borrowed apart from the model they serve
        let mut acts = self.pool.acts.pop().unwrap_or_default();
        let report = self.evaluate_on(full, &mut acts);
        self.pool.acts.push(acts);
        report
    }

    fn evaluate_on(&self, full: Option<&[f32]>, acts: &mut Activations) -> EvalReport {
        let (model, params) = self.whole_model(full);
        match &self.data {
            Dataset::Addition(a) => {
                let a = *a;
                let problems = a.eval_set(1000);
                let answers = solve_addition(model, params, &a, &problems);
                let mut correct = 0;
                let mut examples = Vec::new();
                for (&(x, y), got) in problems.iter().zip(&answers) {
                    let ok = a.parse_answer(got) == Some(x + y);
                    correct += ok as usize;
                    if examples.len() < 8 {
                        let shown = a.parse_answer(got).map(|v| v.to_string()).unwrap_or_else(|| format!("{got:?}"));
                        examples.push((format!("{x}+{y}"), (x + y).to_string(), shown));
                    }
                }
                EvalReport::Addition { correct, total: problems.len(), examples }
            }
            Dataset::Text(_) | Dataset::Corpus(_) => {
                let t = self.seq;
                let n = 16;
                let (x, y, pos) = match &self.data {
                    Dataset::Text(d) => {
                        let (x, y) = d.val_batch(n, t);
                        (x, y, None)
                    }
                    Dataset::Corpus(c) => {
                        let b = c.val_batch(n, t);
                        (b.x, b.y, b.pos.filter(|_| self.cfg.doc_mask))
                    }
                    Dataset::Addition(_) => unreachable!("matched above"),
                };
                let mb = self.micro.min(n);
                let (mut sum, mut count) = (0f64, 0usize);
                for (k, (xm, ym)) in x.chunks(mb * t).zip(y.chunks(mb * t)).enumerate() {
                    let bm = xm.len() / t;
                    let pm = pos.as_deref().map(|p| &p[k * mb * t..][..xm.len()]);
                    model.logits_docs(params, xm, pm, (bm, t), acts);
                    let (s, c) = model.loss(&Tp::SOLO, ym, acts).expect("a single worker runs no collectives");
                    sum += s;
                    count += c;
                }
                EvalReport::Text { val_loss: (sum / count.max(1) as f64) as f32 }
            }
        }
    }

    /// What the model writes after the start of the validation text (sampled at temperature
    /// 0.8, top-k 40, seed 0; the prompt included), to show what it learned.
    pub fn sample_text(&self, full: Option<&[f32]>) -> Result<String> {
        let prompt = self.data_prompt();
        let opt =
            SampleOptions { max_new_tokens: 64, temperature: 0.8, top_k: 40, top_p: 1.0, seed: 0, stop: Vec::new() };
        let ids = self.tokenizer.encode(&prompt)?;
        let (model, params) = self.whole_model(full);
        let gen = generate(model, params, &[ids], &opt);
        Ok(format!("{prompt}{}", self.tokenizer.decode(&gen[0])))
    }

    /// The start of the validation text, used as a prompt to show what the model learned.
    pub fn data_prompt(&self) -> String {
        match &self.data {
            Dataset::Text(d) => self.tokenizer.decode(&d.tokens[d.split..(d.split + 8).min(d.tokens.len())]),
            Dataset::Corpus(c) => self.tokenizer.decode(&c.val_prompt(8)),
            Dataset::Addition(a) => a.prompt(482, 139),
        }
    }
}

/// Greedy answers of the model to addition problems, as text (reversed digits + newline).
pub fn solve_addition(model: &Gpt, params: &[f32], a: &Addition, problems: &[(u64, u64)]) -> Vec<String> {
    let prompts: Vec<Vec<u32>> =
        problems.iter().map(|&(x, y)| a.prompt(x, y).bytes().map(u32::from).collect()).collect();
    let opt = SampleOptions {
        max_new_tokens: a.digits + 2,
        temperature: 0.0,
        top_k: 0,
        top_p: 1.0,
        seed: 0,
        stop: vec![b'\n' as u32],
    };
    generate(model, params, &prompts, &opt)
        .iter()
        .map(|ids| ids.iter().map(|&i| i.min(255) as u8 as char).collect::<String>())
        .map(|s| match s.find('\n') {
            Some(k) => s[..=k].to_string(),
            None => s,
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evaluation_reports_read_as_the_cli_prints_them() {
        let a = EvalReport::Addition { correct: 999, total: 1000, examples: vec![] };
        assert_eq!(a.to_string(), "held-out accuracy 99.9% (999/1000)");
        assert_eq!(EvalReport::Text { val_loss: 1.23456 }.to_string(), "validation loss 1.2346");
    }
}
