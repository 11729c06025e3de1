//! One rank's share of the model: without a pipeline, the whole model (cut for its
//! tensor-parallel slice); in a pipeline, its chunks — stages r, r + pp, … of the model split
//! by cost, a cut falling between blocks or between a block's attention and MLP halves — with
//! their parameters end to end in the rank's one flat buffer. GPT-2 ties the LM head to the
//! token table: the first stage (embedding) and the last (head) each hold a copy, and the two
//! copies' gradients are summed, as Megatron-LM does, so that they stay equal.

use super::partition::{gpt_slot_costs, partition};
use crate::error::{Error, Result};
use crate::models::gpt::slots;
use crate::models::{Gpt, GptConfig};
use crate::params::ParamLayout;
use brigade_comm::Comm;
use std::ops::Range;

/// Tag of the tied table's gradient between the first and the last stage (below MPI's
/// smallest allowed upper bound, above what the executor's micro-batch tags reach in practice).
const TIE_TAG: u32 = 32_767;

#[derive(Clone, Debug)]
pub struct RankModel {
    /// The model chunks this rank runs, in the order of their stages.
    pub chunks: Vec<Gpt>,
    /// Where each chunk's parameters lie in the rank's flat buffer.
    pub spans: Vec<Range<usize>>,
    /// Every chunk's parameters, end to end, named as in the whole model.
    pub layout: ParamLayout,
    /// Every chunk's units (embedding, blocks or block halves, final LayerNorm) in the flat
    /// buffer.
    pub units: Vec<Range<usize>>,
}

impl RankModel {
    /// The whole model (one chunk): the single worker, or a rank without a pipeline.
    pub fn whole(model: Gpt) -> RankModel {
        RankModel::of(vec![model])
    }

    /// Pipeline rank `pp_rank`'s chunks of `cfg` cut into `pp · v` stages balanced by cost
    /// at sequence length `seq`, each cut for tensor-parallel rank `tp_rank` of `tp`, holding
    /// expert rank `experts.0`'s block of a mixture's experts (`(0, 1)`: all of them).
    pub fn stage(
        cfg: GptConfig,
        tp: (usize, usize),
        (pp_rank, pp): (usize, usize),
        v: usize,
        seq: usize,
        experts: (usize, usize),
    ) -> Result<RankModel> {
        let cuts = stage_slots(&cfg, pp, v, seq)?;
        let chunks =
            (0..v).map(|c| Gpt::part_at(cfg, tp, cuts[c * pp + pp_rank].clone(), experts)).collect::<Result<_>>()?;
        Ok(RankModel::of(chunks))
    }

    fn of(chunks: Vec<Gpt>) -> RankModel {
        let mut layout = ParamLayout::default();
        let (mut spans, mut units) = (Vec::new(), Vec::new());
        for c in &chunks {
            let span = layout.append(&c.layout);
            units.extend(c.units.iter().map(|u| span.start + u.start..span.start + u.end));
            spans.push(span);
        }
        RankModel { chunks, spans, layout, units }
    }

    /// The first chunk: the whole model without a pipeline.
    pub fn first(&self) -> &Gpt {
        &self.chunks[0]
    }

    /// Where the token table lies in the flat buffer: the embedding's (`head: false`) or the
    /// last stage's copy for the LM head (`head: true`), if this rank holds it.
    pub fn table(&self, head: bool) -> Option<Range<usize>> {
        self.chunks.iter().zip(&self.spans).find_map(|(c, s)| {
            // an untied head (`lm_head`) is its own parameters: no copy of the table to keep
            let holds = if head { c.has_head && !c.has_embedding && c.cfg.tied() } else { c.has_embedding };
            // the part's layers address the table from the start of its unit
            let at = s.start + c.units[c.table_unit].start + c.wte.offset;
            holds.then_some(at..at + c.wte.len)
        })
    }

    /// The layout without the head's copy of the token table: every parameter of the model
    /// once, for the gradient norm.
    pub fn counted_layout(&self) -> ParamLayout {
        let mut l = self.layout.clone();
        if let Some(copy) = self.table(true) {
            l.specs.retain(|s| s.view.offset != copy.start);
        }
        l
    }

    /// Sums the gradients of the token table's two copies (held by the first and the last
    /// stage, over `pp`), so that both take the same step.
    pub fn tie_grads(&self, pp: &Comm, g: &mut [f32]) -> Result<()> {
        let err = |e| Error::Train(format!("summing the tied token table over the pipeline failed: {e}"));
        if !self.first().cfg.tied() {
            return Ok(());
        }
        match (self.table(false), self.table(true)) {
            (Some(e), Some(h)) => {
                let (lo, hi) = g.split_at_mut(h.start);
                for (a, b) in lo[e].iter_mut().zip(&mut hi[..h.len()]) {
                    *a += *b;
                    *b = *a;
                }
            }
            (Some(t), None) | (None, Some(t)) if pp.size() > 1 => {
                let peer = if self.table(false).is_some() { pp.size() - 1 } else { 0 };
                pp.send(&g[t.clone()], peer, TIE_TAG).map_err(err)?;
                let mut other = vec![0f32; t.len()];
                pp.recv(&mut other, peer, TIE_TAG).map_err(err)?;
                // a + b on one side, b + a on the other: the same float either way
                g[t].iter_mut().zip(&other).for_each(|(a, b)| *a += b);
            }
            _ => {}
        }
        Ok(())
    }

    /// A buffer of the whole model (in `full`'s layout) from this rank's, tensor by tensor by
    /// name (`local` in `self.layout.full()`), zeros where other stages' parameters go; the
    /// head's copy of the token table is left to the embedding's.
    pub fn place_in(&self, full: &ParamLayout, local: &[f32]) -> Vec<f32> {
        let mine = self.layout.full();
        let copy = self.table(true).map(|r| r.start);
        let mut out = vec![0f32; full.total];
        for (s, l) in mine.specs.iter().zip(&self.layout.specs) {
            if Some(l.view.offset) == copy {
                continue;
            }
            let to = full.get(&s.name).expect("every stage's tensor is the model's").view;
            to.of_mut(&mut out).copy_from_slice(s.view.of(local));
        }
        out
    }

    /// This rank's tensors (in `self.layout.full()`) picked by name from a buffer of the whole
    /// model in `full`'s layout.
    pub fn pick_from(&self, full: &ParamLayout, buf: &[f32]) -> Vec<f32> {
        let mine = self.layout.full();
        let mut out = vec![0f32; mine.total];
        for s in &mine.specs {
            let from = full.get(&s.name).expect("every stage's tensor is the model's").view;
            s.view.of_mut(&mut out).copy_from_slice(from.of(buf));
        }
        out
    }
}

/// The slots (`models::gpt::slots`: 0 the embedding, 2i + 1 and 2i + 2 block i's attention and
/// MLP halves, 2L + 1 the head) of each of the `pp · v` stages.
pub fn stage_slots(cfg: &GptConfig, pp: usize, v: usize, seq: usize) -> Result<Vec<Range<usize>>> {
    let stages = pp * v;
    let n = slots(cfg);
    if stages > n {
        return Err(Error::Layout(format!(
            "pp={pp} × v={v} = {stages} pipeline stages, but a model of {} layers splits into only {n} pieces (the embedding, each block's attention and MLP halves, the head); use pp·v ≤ {n}",
            cfg.n_layer
        )));
    }
    partition(&gpt_slot_costs(cfg, seq), stages)
}
