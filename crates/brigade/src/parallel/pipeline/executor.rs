//! Runs one rank's list of a pipeline plan for one optimizer step: forwards and backwards of
//! its model chunks on each micro-batch, activations and gradients sent to and received from
//! the neighbouring stages over the pipeline group, each micro-batch's stash kept only from
//! its forward to its backward. Gradients accumulate into each chunk's buffer; the tied token
//! table's two copies (first and last stage) are summed by the caller.

use super::schedule::{Action, Plan};
use crate::error::{Error, Result};
use crate::models::units::Whole;
use crate::models::{Activations, Gpt, Input, Output};
use crate::parallel::tensor::Tp;
use brigade_comm::Comm;
use std::collections::HashMap;

/// One chunk of the model this rank runs: its part, parameters and gradient buffer.
pub struct Chunk<'a> {
    pub part: &'a Gpt,
    pub params: &'a [f32],
    pub grads: &'a mut [f32],
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
}

fn comm_err(e: brigade_comm::CommError) -> Error {
    Error::Train(format!("pipeline communication failed: {e}"))
}

/// Message tags: the activation or gradient of a micro-batch for the stage that receives it
/// (its chunk on the receiving rank may differ from the sender's).
fn tag(mb: usize, to_stage: usize, stages: usize, grad: bool) -> u32 {
    ((mb * stages + to_stage) * 2 + usize::from(grad)) as u32
}

/// Runs this rank's list of `plan` over `pp` (the pipeline group); returns the sum of the
/// token losses this rank computed (the last stage's; 0 elsewhere) and its peak of
/// micro-batch chunks between forward and backward.
pub fn run_step(plan: &Plan, pp: &Comm, tp: &Tp, chunks: &mut [Chunk], data: &MicroBatches) -> Result<(f64, usize)> {
    let rank = pp.rank();
    let (b, t) = (data.b, data.t);
    let stages = plan.pp * plan.v;
    let stage = |chunk: usize| chunk * plan.pp + rank;
    let width = |c: &Chunk| tp.rows(b * t).len() * c.part.cfg.n_embd;
    let mut stash: HashMap<(usize, usize), Activations> = HashMap::new();
    let mut received: HashMap<(usize, usize, bool), Vec<f32>> = HashMap::new();
    let (mut loss, mut held, mut peak) = (0f64, 0usize, 0usize);
    for &a in &plan.ranks[rank] {
        match a {
            Action::RecvActivation { mb, chunk, from } | Action::RecvGrad { mb, chunk, from } => {
                let grad = matches!(a, Action::RecvGrad { .. });
                let mut buf = vec![0f32; width(&chunks[chunk])];
                pp.recv(&mut buf, from, tag(mb, stage(chunk), stages, grad)).map_err(comm_err)?;
                received.insert((mb, chunk, grad), buf);
            }
            Action::SendActivation { mb, chunk, to } => {
                let out = stash.get(&(mb, chunk)).expect("sent after its forward").output();
                pp.send(out, to, tag(mb, stage(chunk) + 1, stages, false)).map_err(comm_err)?;
            }
            Action::SendGrad { mb, chunk, to } => {
                let g = stash.get(&(mb, chunk)).expect("sent after its backward").input_grad();
                pp.send(g, to, tag(mb, stage(chunk) - 1, stages, true)).map_err(comm_err)?;
                stash.remove(&(mb, chunk));
            }
            Action::Forward { mb, chunk } => {
                let c = &chunks[chunk];
                let mut acts = Activations::default();
                let hidden;
                let input = if c.part.has_embedding {
                    Input::Tokens(&data.tokens[mb])
                } else if let Some(h) = received.remove(&(mb, chunk, false)) {
                    hidden = h;
                    Input::Hidden(&hidden)
                } else {
                    // the previous stage on this same rank (one rank, several chunks)
                    hidden = stash.get(&(mb, chunk - 1)).expect("the previous chunk ran first").output().to_vec();
                    Input::Hidden(&hidden)
                };
                let mut store = Whole::reading(&c.part.units, c.params);
                c.part.forward_part(tp, &mut store, input, b, t, &mut acts)?;
                if c.part.has_head {
                    loss += c.part.loss_tp(tp, &data.targets[mb], &mut acts)?.0;
                }
                stash.insert((mb, chunk), acts);
                held += 1;
                peak = peak.max(held);
            }
            Action::Backward { mb, chunk } | Action::BackwardInput { mb, chunk } => {
                // (the executor runs a zero-bubble B as the whole backward and its W as nothing:
                // the layers do not yet expose their weight-gradient half on its own)
                let dy;
                let from = if chunks[chunk].part.has_head {
                    Output::Loss { targets: &data.targets[mb], scale: data.scale }
                } else if let Some(g) = received.remove(&(mb, chunk, true)) {
                    dy = g;
                    Output::Grad(&dy)
                } else {
                    let next = stash.remove(&(mb, chunk + 1)).expect("the next chunk ran first");
                    dy = next.input_grad().to_vec();
                    Output::Grad(&dy)
                };
                let mut acts = stash.remove(&(mb, chunk)).expect("backward after its forward");
                let c = &mut chunks[chunk];
                let mut store = Whole::new(&c.part.units, c.params, c.grads);
                c.part.backward_part(tp, &mut store, &data.tokens[mb], from, &mut acts)?;
                held -= 1;
                // kept until its input gradient is sent, or read by the previous chunk on this rank
                if !c.part.has_embedding {
                    stash.insert((mb, chunk), acts);
                }
            }
            Action::BackwardWeight { .. } => {}
        }
    }
    Ok((loss, peak))
}
