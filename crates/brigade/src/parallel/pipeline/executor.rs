//! Runs one rank's list of a plan for one optimizer step — every rank's, the single worker's
//! included (its plan is one stage, 1F1B over the micro-batches): forwards and backwards of
//! its model chunks on each micro-batch, activations and gradients sent to and received from
//! the neighbouring stages over the pipeline group, each micro-batch's stash kept only from
//! its forward to its backward (under full recompute only its input, the forward run again
//! just before the backward). A zero-bubble B computes the input gradient and keeps what the
//! weight matrices' gradients need for its W. Where each pass finds its parameters and puts
//! its gradients is the caller's [`ChunkStores`] (whole buffers, or a data-parallel rank's
//! reducing or sharded stores); the tied token table's two copies (first and last stage) are
//! summed by the caller.

use super::plan::{Action, Plan};
use crate::error::{Error, Result};
use crate::layout::Recompute;
use crate::models::units::{UnitStore, Whole};
use crate::models::{Activations, Gpt, Input, Output, Pass};
use crate::nn::context::Context;
use crate::nn::tp::Tp;
use crate::nn::{Deferred, Spare, WeightGrads};
use brigade_comm::Comm;
use std::collections::HashMap;
use std::time::Instant;

/// One chunk of the model this rank runs: its part, parameters and gradient buffer.
pub struct Chunk<'a> {
    pub part: &'a Gpt,
    pub params: &'a [f32],
    pub grads: &'a mut [f32],
}

/// Which pass of a micro-batch a store serves: a forward, or a backward (`last`: the chunk's
/// last backward of the step, after which its gradients are final).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    Forward,
    Backward { last: bool },
}

/// The passing of a pass to its store: `f` gets the chunk's part and the unit store to run on.
pub type OnStore<'f> = &'f mut dyn FnMut(&Gpt, &mut dyn UnitStore) -> Result<()>;

/// Where each of a rank's chunks finds its parameters and puts its gradients, pass by pass.
pub trait ChunkStores {
    /// Chunk `c`'s model part.
    fn part(&self, c: usize) -> &Gpt;
    /// Runs `f` on chunk `c`'s part and the store of its `stage` pass over micro-batch `mb`.
    fn with(&mut self, c: usize, mb: usize, stage: Stage, f: OnStore) -> Result<()>;
    /// Chunk `c`'s gradient buffer (a zero-bubble W adds the weight gradients into it).
    fn grads(&mut self, c: usize) -> &mut [f32];
    /// Chunk `c`'s gradients are final for the step (after its last backward or W).
    fn done(&mut self, _c: usize) -> Result<()> {
        Ok(())
    }
}

/// Whole buffers: each chunk's own parameters and gradient buffer.
impl ChunkStores for Vec<Chunk<'_>> {
    fn part(&self, c: usize) -> &Gpt {
        self[c].part
    }

    fn with(&mut self, c: usize, _mb: usize, stage: Stage, f: OnStore) -> Result<()> {
        let Chunk { part, params, grads } = &mut self[c];
        match stage {
            Stage::Forward => f(part, &mut Whole::reading(&part.units, params)),
            Stage::Backward { .. } => f(part, &mut Whole::new(&part.units, params, grads)),
        }
    }

    fn grads(&mut self, c: usize) -> &mut [f32] {
        self[c].grads
    }
}

/// The micro-batches of the step: every stage knows them (the data is a pure function of the
/// step), the first stage embeds the tokens and the last computes the loss.
pub struct MicroBatches<'a> {
    pub tokens: &'a [Vec<u32>],
    pub targets: &'a [Vec<i32>],
    /// Sequences per micro-batch and their length.
    pub b: usize,
    pub t: usize,
    /// 1 / the targets counted in the whole global batch.
    pub scale: f32,
    /// Each micro-batch's rows' positions in their packed documents (`--doc-mask`); empty:
    /// one document a sequence.
    pub positions: &'a [Vec<u32>],
}

impl MicroBatches<'_> {
    /// Micro-batch `mb`'s positions, if its documents are kept apart.
    fn docs(&self, mb: usize) -> Option<&[u32]> {
        self.positions.get(mb).map(Vec::as_slice)
    }
}

/// What one rank's run of its list did.
#[derive(Debug, Default)]
pub struct Ran {
    /// The sum of the token losses this rank computed (the last stage's; 0 elsewhere).
    pub loss: f64,
    /// The most micro-batch chunks holding their stash at once.
    pub peak: usize,
    /// The most bytes of stashed activations held at once.
    pub peak_bytes: usize,
    /// Every action with when it started and ended.
    pub spans: Vec<(Action, Instant, Instant)>,
}

impl Ran {
    /// Seconds in forwards and backwards.
    pub fn compute_s(&self) -> f64 {
        self.spans.iter().filter(|(a, ..)| a.is_compute()).map(|(_, s, e)| (*e - *s).as_secs_f64()).sum()
    }
}

fn comm_err(e: brigade_comm::CommError) -> Error {
    Error::Train(format!("pipeline communication failed: {e}"))
}

/// Message tags: the activation or gradient of a micro-batch for the stage that receives it
/// (its chunk on the receiving rank may differ from the sender's).
fn tag(mb: usize, to_stage: usize, stages: usize, grad: bool) -> u32 {
    ((mb * stages + to_stage) * 2 + usize::from(grad)) as u32
}

/// A micro-batch chunk between its forward and its backward: everything its backward needs,
/// or (full recompute) only its input, the forward's output kept until it is sent.
enum Stash {
    Kept(Box<Activations>),
    Input { input: Option<Vec<f32>>, output: Option<Vec<f32>> },
}

impl Stash {
    /// The forward's output, for the next stage (a copy of what a kept stash still needs; under
    /// recompute the only copy, no longer counted in `bytes`).
    fn take_output(&mut self, bytes: &mut usize) -> Vec<f32> {
        match self {
            Stash::Kept(acts) => acts.output().to_vec(),
            Stash::Input { output, .. } => {
                let out = output.take().expect("an output is read once");
                *bytes -= 4 * out.len();
                out
            }
        }
    }

    fn bytes(&self) -> usize {
        match self {
            Stash::Kept(a) => a.bytes(),
            Stash::Input { input, output } => {
                4 * (input.as_ref().map_or(0, Vec::len) + output.as_ref().map_or(0, Vec::len))
            }
        }
    }
}

/// What a rank's steps hand on to its next: the activations of the micro-batches in flight, and
/// the buffers a zero-bubble W gave back (its copies of inputs and output gradients, the LM
/// head's logits). Kept across steps, so a step's first micro-batches do not fault in fresh
/// pages for them (hundreds of MB a step on a pipeline stage).
#[derive(Default)]
pub struct Reuse {
    pub acts: Vec<Activations>,
    pub spare: Spare,
}

/// Refuses a plan whose micro-batches' message tags (one per micro-batch, receiving stage and
/// direction) would reach the tied table's, the highest MPI guarantees.
pub(crate) fn check_tags(plan: &Plan) -> Result<()> {
    let stages = plan.pp * plan.v;
    if tag(plan.m, 0, stages, false) > super::stages::FIRST_TIE_TAG {
        return Err(Error::Layout(format!(
            "{} micro-batches × {stages} pipeline stages need more message tags than MPI guarantees (32767); use fewer micro-batches a step (a larger --micro-batch)",
            plan.m
        )));
    }
    Ok(())
}

/// Runs this rank's list of `plan` over `pp` (the pipeline group), each pass on its store from
/// `chunks`, activations and buffers reused from `reuse` (and left there for the next step). Under full
/// recompute each chunk's forward keeps only its input and runs again before its backward;
/// under selective recompute the forwards keep no attention scores. `chunks.done(c)` hears as
/// soon as a chunk's gradients are final for the step, so that their data-parallel reduction
/// can run while the rest of the list does.
pub fn run_step(
    plan: &Plan,
    (pp, tp, cp, ep): (&Comm, &Tp, Option<Context>, Option<&Comm>),
    chunks: &mut dyn ChunkStores,
    data: &MicroBatches,
    recompute: Recompute,
    reuse: &mut Reuse,
) -> Result<Ran> {
    let Reuse { acts: pool, spare } = reuse;
    let rank = pp.rank();
    let (b, t) = (data.b, data.t);
    let stages = plan.pp * plan.v;
    check_tags(plan)?;
    let stage = |chunk: usize| chunk * plan.pp + rank;
    let width = tp.rows(b * t).len() * chunks.part(0).cfg.n_embd;
    let mut stash: HashMap<(usize, usize), Stash> = HashMap::new();
    // input gradients after a backward, until sent or read by the previous chunk on this rank
    let mut dinputs: HashMap<(usize, usize), Vec<f32>> = HashMap::new();
    let mut received: HashMap<(usize, usize, bool), Vec<f32>> = HashMap::new();
    // the weight-gradient halves a zero-bubble B left for its W
    let mut weights: HashMap<(usize, usize), Vec<Deferred>> = HashMap::new();
    let mut ran = Ran::default();
    let mut bytes = 0usize;
    // where each chunk's gradients become final: its last backward or weight-gradient action
    let mut last = vec![None; plan.v];
    for (i, a) in plan.ranks[rank].iter().enumerate() {
        if let Action::Backward { chunk, .. }
        | Action::BackwardInput { chunk, .. }
        | Action::BackwardWeight { chunk, .. } = *a
        {
            last[chunk] = Some(i);
        }
    }
    for (i, &a) in plan.ranks[rank].iter().enumerate() {
        let start = Instant::now();
        match a {
            Action::RecvActivation { mb, chunk, from } | Action::RecvGrad { mb, chunk, from } => {
                let grad = matches!(a, Action::RecvGrad { .. });
                let mut buf = vec![0f32; width];
                pp.recv(&mut buf, from, tag(mb, stage(chunk), stages, grad)).map_err(comm_err)?;
                received.insert((mb, chunk, grad), buf);
            }
            Action::SendActivation { mb, chunk, to } => {
                let out = stash.get_mut(&(mb, chunk)).expect("sent after its forward").take_output(&mut bytes);
                pp.send(&out, to, tag(mb, stage(chunk) + 1, stages, false)).map_err(comm_err)?;
            }
            Action::SendGrad { mb, chunk, to } => {
                let g = dinputs.remove(&(mb, chunk)).expect("sent after its backward");
                pp.send(&g, to, tag(mb, stage(chunk) - 1, stages, true)).map_err(comm_err)?;
            }
            Action::Forward { mb, chunk } => {
                let (has_embedding, has_head, vocab_rows) = {
                    let p = chunks.part(chunk);
                    (p.has_embedding, p.has_head, p.vocab.rows)
                };
                let input = if has_embedding {
                    None
                } else if let Some(h) = received.remove(&(mb, chunk, false)) {
                    Some(h)
                } else {
                    // the previous stage on this same rank (one rank, several chunks)
                    Some(stash.get_mut(&(mb, chunk - 1)).expect("the previous chunk ran first").take_output(&mut bytes))
                };
                let mut acts = pool.pop().unwrap_or_default();
                if has_head && acts.logits.capacity() == 0 {
                    // (a zero-bubble W took the last logits buffer; one comes back from it)
                    if let Some(buf) = spare.take(data.b * data.t * vocab_rows) {
                        acts.logits = buf;
                    }
                }
                acts.set_selective(recompute == Recompute::Selective);
                forward(chunks, (chunk, mb), (tp, cp, ep, data), input.as_deref(), &mut acts, &mut ran.loss)?;
                let s = if recompute == Recompute::Full {
                    let output = (!has_head).then(|| acts.output().to_vec());
                    pool.push(acts);
                    Stash::Input { input, output }
                } else {
                    Stash::Kept(Box::new(acts))
                };
                bytes += s.bytes();
                stash.insert((mb, chunk), s);
                ran.peak = ran.peak.max(stash.len());
                ran.peak_bytes = ran.peak_bytes.max(bytes);
            }
            Action::Backward { mb, chunk } | Action::BackwardInput { mb, chunk } => {
                // a zero-bubble B leaves the weight matrices' gradients for its W
                let dw = match a {
                    Action::BackwardInput { .. } => WeightGrads::later_with(std::mem::take(spare)),
                    _ => WeightGrads::Now,
                };
                let (has_embedding, has_head) = (chunks.part(chunk).has_embedding, chunks.part(chunk).has_head);
                let dy = if has_head {
                    None
                } else if let Some(g) = received.remove(&(mb, chunk, true)) {
                    Some(g)
                } else {
                    Some(dinputs.remove(&(mb, chunk + 1)).expect("the next chunk ran first"))
                };
                let s = stash.remove(&(mb, chunk)).expect("backward after its forward");
                bytes -= s.bytes();
                let mut acts = match s {
                    Stash::Kept(acts) => *acts,
                    Stash::Input { input, .. } => {
                        // full recompute: the forward again, from the stashed input
                        let mut acts = pool.pop().unwrap_or_default();
                        let mut unused = 0.0;
                        forward(chunks, (chunk, mb), (tp, cp, ep, data), input.as_deref(), &mut acts, &mut unused)?;
                        acts
                    }
                };
                let from = match &dy {
                    None => Output::Loss { targets: &data.targets[mb], scale: data.scale },
                    Some(g) => Output::Grad(g),
                };
                // a whole backward that is the chunk's last: its gradients are final as it ends
                let stage = Stage::Backward { last: matches!(a, Action::Backward { .. }) && last[chunk] == Some(i) };
                let mut dw = Some(dw);
                chunks.with(chunk, mb, stage, &mut |part, store| {
                    let sink = dw.take().expect("one backward per pass");
                    let mut pass = Pass::new(tp, store).deferring(sink).in_context(cp).with_experts(ep);
                    let r = part.backward(&mut pass, &data.tokens[mb], from, &mut acts);
                    dw = Some(pass.dw);
                    r
                })?;
                let dw = dw.expect("the backward gives the weight gradients back");
                if !has_embedding {
                    dinputs.insert((mb, chunk), acts.input_grad().to_vec());
                }
                pool.push(acts);
                let (later, kept) = dw.into_deferred();
                if let Some(kept) = kept {
                    // the list lent to the deferring B comes back
                    *spare = kept;
                }
                if !later.is_empty() {
                    bytes += later.iter().map(Deferred::bytes).sum::<usize>();
                    ran.peak_bytes = ran.peak_bytes.max(bytes);
                    weights.insert((mb, chunk), later);
                }
            }
            Action::BackwardWeight { mb, chunk } => {
                for d in weights.remove(&(mb, chunk)).unwrap_or_default() {
                    let unit = chunks.part(chunk).units[d.unit].clone();
                    d.run(&mut chunks.grads(chunk)[unit]);
                    bytes -= d.bytes();
                    d.into_buffers().into_iter().for_each(|b| spare.give(b));
                }
            }
        }
        ran.spans.push((a, start, Instant::now()));
        if let Some(c) = last.iter().position(|&l| l == Some(i)) {
            chunks.done(c)?;
        }
    }
    // every stash and every deferred weight gradient was taken back: the accounting closes
    debug_assert_eq!(bytes, 0, "rank {rank}: {bytes} stash bytes counted after the step");
    Ok(ran)
}

/// Chunk `c`'s forward of micro-batch `mb` from the tokens (first stage) or `input`, adding
/// the last stage's token losses to `loss`.
fn forward(
    chunks: &mut dyn ChunkStores,
    (c, mb): (usize, usize),
    (tp, cp, ep, data): (&Tp, Option<Context>, Option<&Comm>, &MicroBatches),
    input: Option<&[f32]>,
    acts: &mut Activations,
    loss: &mut f64,
) -> Result<()> {
    let input = match input {
        None => Input::Tokens(&data.tokens[mb]),
        Some(h) => Input::Hidden(h),
    };
    chunks.with(c, mb, Stage::Forward, &mut |part, store| {
        let mut pass = Pass::new(tp, store).with_docs(data.docs(mb)).in_context(cp).with_experts(ep);
        part.forward(&mut pass, input, (data.b, data.t), acts)?;
        if part.has_head {
            *loss += part.loss(tp, &data.targets[mb], acts)?.0;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::{check_tags, tag};
    use crate::layout::Schedule;
    use crate::parallel::pipeline::{build, stages::FIRST_TIE_TAG};

    /// The most micro-batches a plan may have is the most whose every tag stays below the tied
    /// table's; one more is refused with the way out.
    #[test]
    fn plans_whose_tags_would_reach_the_tied_tables_are_refused() {
        for pp in [2, 3, 4] {
            let most = (FIRST_TIE_TAG as usize + 1) / (2 * pp);
            let plan = build(Schedule::OneFOneB, pp, most, 1).unwrap();
            check_tags(&plan).unwrap();
            let highest = (0..most)
                .flat_map(|mb| (0..pp).flat_map(move |to| [false, true].map(|g| tag(mb, to, pp, g))))
                .max()
                .unwrap();
            assert!(highest < FIRST_TIE_TAG, "pp={pp}: tag {highest} of {most} micro-batches");
            let over = build(Schedule::OneFOneB, pp, most + 1, 1).unwrap();
            let err = check_tags(&over).unwrap_err().to_string();
            assert!(err.contains("a larger --micro-batch"), "pp={pp}: {err}");
        }
    }

    /// Every (micro-batch, receiving stage, activation or gradient) has its own tag.
    #[test]
    fn message_tags_are_distinct() {
        let stages = 6;
        let mut seen = std::collections::HashSet::new();
        for mb in 0..16 {
            for to in 0..stages {
                for grad in [false, true] {
                    assert!(seen.insert(tag(mb, to, stages, grad)), "tag of mb {mb} stage {to} grad {grad} repeats");
                }
            }
        }
        assert_eq!(tag(0, 0, stages, false), 0);
        assert_eq!(tag(1, 2, stages, true), ((stages + 2) * 2 + 1) as u32);
    }
}
