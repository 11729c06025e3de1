//! One rank's share of the model: without a pipeline, the whole model (cut for its
//! tensor-parallel slice); in a pipeline, its chunks — stages r, r + pp, … of the model split
//! by cost, a cut falling between blocks or between a block's attention and MLP halves — with
//! their parameters end to end in the rank's one flat buffer. GPT-2 ties the LM head to the
//! token table: the first stage (embedding) and the last (head) each hold a copy, and the two
//! copies' gradients are summed, as Megatron-LM does, so that they stay equal.

use super::partition::{gpt_slot_costs, partition, partition_ranks};
use super::schedule;
use super::simulate::{simulate_scaled, Costs};
use crate::error::{Error, Result};
use crate::layout::Schedule;
use crate::models::gpt::slots;
use crate::models::{Gpt, GptConfig};
use crate::params::ParamLayout;
use brigade_comm::Comm;
use std::ops::Range;

/// Tags of the tied table's gradient between the first and the last stage (MPI's smallest
/// allowed upper bound and the one below it; the executor refuses a step whose micro-batch
/// tags would reach them):
/// the head's whole copy, and the embedding's touched rows (their count, then indices and values).
const TIE_TAG: u32 = 32_767;
const TIE_ROWS_TAG: u32 = 32_766;
/// The lowest of the tags above: the executor's micro-batch tags stay below it.
pub(crate) const FIRST_TIE_TAG: u32 = TIE_ROWS_TAG;

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
                let embedding = self.table(false).is_some();
                let peer = if embedding { pp.size() - 1 } else { 0 };
                sum_table(pp, peer, embedding, &mut g[t], self.first().cfg.n_embd).map_err(err)?;
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

/// Sums the two copies of the token table's gradient `g` (rows of `width`) between the stage
/// holding the embedding (`embedding: true`) and the one holding the head, `peer`. The head's
/// copy is dense (every row has a logit); the embedding's is non-zero only in the rows the step's
/// tokens looked up. So the head sends its whole copy — early: the last stage ends its backward
/// before the first — and the embedding, when it reaches the sum, sends back only its
/// rows with a non-zero bit (their indices and values) and takes the head's copy straight into
/// its table. Both then hold `e + h` in those rows (one float addition, the same either way
/// round) and `h` in the rest, where `e` is zero. A table too tall for exact f32 indices, or
/// one not made of whole rows, is summed whole both ways.
pub fn sum_table(pp: &Comm, peer: usize, embedding: bool, g: &mut [f32], width: usize) -> brigade_comm::Result<()> {
    let rows = if width == 0 || !g.len().is_multiple_of(width) { 0 } else { g.len() / width };
    if rows == 0 || rows >= 1 << 24 {
        pp.send(g, peer, TIE_TAG)?;
        let mut other = vec![0f32; g.len()];
        pp.recv(&mut other, peer, TIE_TAG)?;
        // a + b on one side, b + a on the other: the same float either way
        g.iter_mut().zip(&other).for_each(|(a, b)| *a += b);
        return Ok(());
    }
    if embedding {
        // a row's bits or-ed together (which vectorises; `any` stops early but goes one float
        // at a time, and most rows are all zero)
        let touched: Vec<usize> =
            (0..rows).filter(|&r| g[r * width..(r + 1) * width].iter().fold(0, |a, x| a | x.to_bits()) != 0).collect();
        // indices below 2²⁴ are exact in f32
        let mut msg: Vec<f32> = touched.iter().map(|&r| r as f32).collect();
        touched.iter().for_each(|&r| msg.extend_from_slice(&g[r * width..(r + 1) * width]));
        pp.send(&[touched.len() as f32], peer, TIE_ROWS_TAG)?;
        pp.send(&msg, peer, TIE_ROWS_TAG)?;
        pp.recv(g, peer, TIE_TAG)?;
        add_rows(g, width, touched.iter().copied(), &msg[touched.len()..]);
    } else {
        pp.send(g, peer, TIE_TAG)?;
        let mut count = [0f32];
        pp.recv(&mut count, peer, TIE_ROWS_TAG)?;
        let n = count[0] as usize;
        let mut msg = vec![0f32; n * (1 + width)];
        pp.recv(&mut msg, peer, TIE_ROWS_TAG)?;
        let (index, values) = msg.split_at(n);
        add_rows(g, width, index.iter().map(|&r| r as usize), values);
    }
    Ok(())
}

/// `g[r] += values[i]` for the i-th row index r (rows of `width`).
fn add_rows(g: &mut [f32], width: usize, rows: impl Iterator<Item = usize>, values: &[f32]) {
    for (r, e) in rows.zip(values.chunks_exact(width)) {
        g[r * width..(r + 1) * width].iter_mut().zip(e).for_each(|(h, e)| *h += e);
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
    let costs = gpt_slot_costs(cfg, seq);
    if v == 1 {
        return partition(&costs, stages);
    }
    // the interleaved schedule (the one that runs v > 1) on paper, four micro-batches a rank:
    // a stage's forward and backward take its share of the cost
    let plan = schedule::build(Schedule::Interleaved, pp, PAPER_MICRO_BATCHES * pp, v)?;
    let step = |loads: &[f64]| simulate_scaled(&plan, &Costs::UNIT, loads).map_or(f64::INFINITY, |r| r.makespan);
    partition_ranks(&costs, pp, v, &step)
}

/// Micro-batches a rank in the step that `stage_slots` judges an interleaved cut by.
const PAPER_MICRO_BATCHES: usize = 4;

#[cfg(test)]
mod tests {
    use super::*;

    /// GPT-2 small on 2 ranks of 2 and 3 chunks: the cut's step on paper (the interleaved
    /// schedule, the stages' costs) is shorter than `partition`'s at v = 2 and never longer
    /// at v = 3, at 4 and 8 micro-batches a rank alike.
    #[test]
    fn interleaved_cuts_shorten_the_step_on_paper() {
        let cfg = GptConfig::preset("gpt2-small").unwrap();
        let costs = gpt_slot_costs(&cfg, 256);
        for (v, shorter) in [(2, true), (3, false)] {
            let got = stage_slots(&cfg, 2, v, 256).unwrap();
            let plain = partition(&costs, 2 * v).unwrap();
            for m in [8, 16] {
                let plan = schedule::build(Schedule::Interleaved, 2, m, v).unwrap();
                let step = |cut: &[Range<usize>]| {
                    let loads: Vec<f64> = cut.iter().map(|r| costs[r.clone()].iter().sum()).collect();
                    simulate_scaled(&plan, &Costs::UNIT, &loads).unwrap().makespan
                };
                let (a, b) = (step(&got), step(&plain));
                assert!(a <= b * (1.0 + 1e-9), "v={v} m={m}: {got:?} {a} > {plain:?} {b}");
                if shorter {
                    assert!(a < b * 0.97, "v={v} m={m}: {got:?} {a} not shorter than {plain:?} {b}");
                }
            }
        }
    }

    /// The embedding's copy: zero but in some rows — a row whose first values are zero and a
    /// later one is not, a row of only −0.0 — and the head's copy dense (some −0.0 too).
    fn copies(rows: usize, width: usize) -> (Vec<f32>, Vec<f32>) {
        let mut e = vec![0f32; rows * width];
        for (r, c, v) in [(1, 0, 0.25f32), (1, 3, -1.5), (4, width - 1, 3.0), (6, 1, -0.0), (9, 2, 1e-30)] {
            e[r * width + c] = v;
        }
        let h: Vec<f32> = (0..rows * width).map(|i| if i % 7 == 3 { -0.0 } else { (i as f32 * 0.37).sin() }).collect();
        (e, h)
    }

    fn exchange(e: &[f32], h: &[f32], width: usize) -> Vec<Vec<f32>> {
        brigade_comm::local::run(2, |c| {
            let embedding = c.rank() == 0;
            let mut g = if embedding { e.to_vec() } else { h.to_vec() };
            sum_table(&c, 1 - c.rank(), embedding, &mut g, width)?;
            Ok::<_, brigade_comm::CommError>(g)
        })
        .unwrap()
    }

    #[test]
    fn the_tied_table_sums_to_e_plus_h_on_both_stages_from_the_touched_rows() {
        let (rows, width) = (10, 5);
        let (e, h) = copies(rows, width);
        let got = exchange(&e, &h, width);
        assert_eq!(
            got[0].iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            got[1].iter().map(|x| x.to_bits()).collect::<Vec<_>>(),
            "both stages hold the same bits"
        );
        for (i, (&x, (a, b))) in got[0].iter().zip(e.iter().zip(&h)).enumerate() {
            assert_eq!(x, a + b, "element {i}: e + h");
            if (a + b) != 0.0 || a.to_bits() != 0 {
                assert_eq!(x.to_bits(), (a + b).to_bits(), "element {i}: the bits of e + h");
            }
        }
    }

    #[test]
    fn a_table_not_made_of_whole_rows_is_summed_whole() {
        let (e, h) = copies(10, 5);
        for width in [0, 3] {
            let got = exchange(&e, &h, width);
            for g in &got {
                let want: Vec<u32> = e.iter().zip(&h).map(|(a, b)| (a + b).to_bits()).collect();
                assert_eq!(g.iter().map(|x| x.to_bits()).collect::<Vec<_>>(), want, "width {width}");
            }
        }
    }
}
