//! Runs a plan on paper: every rank's list in order, each compute action taking its cost,
//! each receive waiting for its send. It refuses a list that computes without its inputs,
//! leaves a send unreceived, or deadlocks, and reports the step's length, each rank's busy
//! time, the bubble and each rank's peak of micro-batches holding activations.

use super::plan::{Action, Plan};
use std::collections::HashMap;

/// Seconds (or any unit) per action.
#[derive(Clone, Copy, Debug)]
pub struct Costs {
    pub forward: f64,
    /// A whole backward; its halves for the zero-bubble schedules.
    pub backward: f64,
    pub backward_input: f64,
    pub backward_weight: f64,
    /// From a send to the matching receive being able to complete.
    pub transfer: f64,
}

impl Costs {
    /// The textbook unit: a forward 1, a backward 2 (its halves 1 and 1), transfers free.
    pub const UNIT: Costs =
        Costs { forward: 1.0, backward: 2.0, backward_input: 1.0, backward_weight: 1.0, transfer: 0.0 };

    /// `UNIT` for one of `v` chunks of a stage: a stage's work split evenly over its chunks.
    pub fn per_chunk(v: usize) -> Costs {
        let k = 1.0 / v as f64;
        Costs { forward: k, backward: 2.0 * k, backward_input: k, backward_weight: k, transfer: 0.0 }
    }
}

#[derive(Clone, Debug)]
pub struct Report {
    /// When the last rank finishes.
    pub makespan: f64,
    /// Each rank's time in compute.
    pub busy: Vec<f64>,
    /// The idle share of all ranks' time: 1 − Σ busy / (pp · makespan).
    pub bubble: f64,
    /// Each rank's most micro-batch chunks holding activations at once (a forward adds one,
    /// its whole backward or its weight-gradient half frees it).
    pub peak_activations: Vec<usize>,
}

/// The bubble a plan has on paper with balanced stages: each chunk's forward 1/v, its
/// backward 2/v (halves 1/v each), transfers free — (pp−1)/(v·m+pp−1) for GPipe, 1F1B and
/// interleaving; less for ZB-H1, whose weight-gradient halves fill the bubble.
pub fn bubble_theory(plan: &Plan) -> f64 {
    simulate(plan, &Costs::per_chunk(plan.v)).map_or(f64::NAN, |r| r.bubble)
}

/// A transfer in flight: (is a gradient, micro-batch, receiving stage, from, to).
type Key = (bool, usize, usize, usize, usize);

pub fn simulate(plan: &Plan, costs: &Costs) -> Result<Report, String> {
    let (pp, v) = (plan.pp, plan.v);
    if plan.ranks.len() != pp {
        return Err(format!("{} lists for pp={pp}", plan.ranks.len()));
    }
    check_work(plan)?;
    let stages = pp * v;
    let stage = |r: usize, chunk: usize| chunk * pp + r;
    let mut pc = vec![0usize; pp];
    let mut clock = vec![0f64; pp];
    let mut busy = vec![0f64; pp];
    let mut held = vec![0usize; pp];
    let mut peak = vec![0usize; pp];
    let mut inflight: HashMap<Key, f64> = HashMap::new();
    // what each rank has: activations / gradients received or made locally, forwards done
    let mut have_act: Vec<HashMap<(usize, usize), ()>> = vec![HashMap::new(); pp];
    let mut have_grad: Vec<HashMap<(usize, usize), ()>> = vec![HashMap::new(); pp];
    let mut done_f: Vec<HashMap<(usize, usize), ()>> = vec![HashMap::new(); pp];
    let mut done_b: Vec<HashMap<(usize, usize), ()>> = vec![HashMap::new(); pp];
    loop {
        let mut progressed = false;
        for r in 0..pp {
            while let Some(&a) = plan.ranks[r].get(pc[r]) {
                let blocked = |why: String| Err::<Report, String>(format!("rank {r}, action {} ({a:?}): {why}", pc[r]));
                match a {
                    Action::Forward { mb, chunk } => {
                        let s = stage(r, chunk);
                        if s > 0 && !have_act[r].contains_key(&(mb, chunk)) {
                            // the previous stage on this same rank hands its output over
                            let local = s % pp == 0 && done_f[r].contains_key(&(mb, chunk.wrapping_sub(1)));
                            if !(pp == 1 && local) {
                                return blocked("forward without the previous stage's activation".into());
                            }
                        }
                        done_f[r].insert((mb, chunk), ());
                        clock[r] += costs.forward;
                        busy[r] += costs.forward;
                        held[r] += 1;
                        peak[r] = peak[r].max(held[r]);
                    }
                    Action::Backward { mb, chunk } | Action::BackwardInput { mb, chunk } => {
                        let s = stage(r, chunk);
                        if !done_f[r].contains_key(&(mb, chunk)) {
                            return blocked("backward before its forward".into());
                        }
                        if s + 1 < stages && !have_grad[r].contains_key(&(mb, chunk)) {
                            let local = pp == 1 && done_b[r].contains_key(&(mb, chunk + 1));
                            if !local {
                                return blocked("backward without the next stage's gradient".into());
                            }
                        }
                        done_b[r].insert((mb, chunk), ());
                        let whole = matches!(a, Action::Backward { .. });
                        let c = if whole { costs.backward } else { costs.backward_input };
                        clock[r] += c;
                        busy[r] += c;
                        if whole {
                            held[r] -= 1;
                        }
                    }
                    Action::BackwardWeight { mb, chunk } => {
                        if !done_b[r].contains_key(&(mb, chunk)) {
                            return blocked("weight gradient before its input gradient".into());
                        }
                        clock[r] += costs.backward_weight;
                        busy[r] += costs.backward_weight;
                        held[r] -= 1;
                    }
                    Action::SendActivation { mb, chunk, to } => {
                        if !done_f[r].contains_key(&(mb, chunk)) {
                            return blocked("sends an activation not yet computed".into());
                        }
                        let key = (false, mb, stage(r, chunk) + 1, r, to);
                        if inflight.insert(key, clock[r] + costs.transfer).is_some() {
                            return blocked("sends the same activation twice".into());
                        }
                    }
                    Action::SendGrad { mb, chunk, to } => {
                        if !done_b[r].contains_key(&(mb, chunk)) {
                            return blocked("sends a gradient not yet computed".into());
                        }
                        let key = (true, mb, stage(r, chunk).wrapping_sub(1), r, to);
                        if inflight.insert(key, clock[r] + costs.transfer).is_some() {
                            return blocked("sends the same gradient twice".into());
                        }
                    }
                    Action::RecvActivation { mb, chunk, from } | Action::RecvGrad { mb, chunk, from } => {
                        let grad = matches!(a, Action::RecvGrad { .. });
                        let Some(at) = inflight.remove(&(grad, mb, stage(r, chunk), from, r)) else { break };
                        clock[r] = clock[r].max(at);
                        let have = if grad { &mut have_grad[r] } else { &mut have_act[r] };
                        have.insert((mb, chunk), ());
                    }
                }
                pc[r] += 1;
                progressed = true;
            }
        }
        if (0..pp).all(|r| pc[r] == plan.ranks[r].len()) {
            break;
        }
        if !progressed {
            let waiting: Vec<String> =
                (0..pp).filter_map(|r| plan.ranks[r].get(pc[r]).map(|a| format!("rank {r} waits at {a:?}"))).collect();
            return Err(format!("deadlock: {}", waiting.join("; ")));
        }
    }
    if let Some(((grad, mb, s, from, to), _)) = inflight.iter().next() {
        let what = if *grad { "gradient" } else { "activation" };
        return Err(format!(
            "rank {from} sends the {what} of micro-batch {mb} for stage {s} to rank {to}, which never receives it"
        ));
    }
    let makespan = clock.iter().cloned().fold(0.0, f64::max);
    let bubble = 1.0 - busy.iter().sum::<f64>() / (pp as f64 * makespan);
    Ok(Report { makespan, busy, bubble, peak_activations: peak })
}

/// Every (micro-batch, chunk) of every rank is computed exactly once: one forward and one
/// whole backward, or its two halves.
fn check_work(plan: &Plan) -> Result<(), String> {
    for (r, list) in plan.ranks.iter().enumerate() {
        let mut count: HashMap<(u8, usize, usize), usize> = HashMap::new();
        for a in list {
            let k = match *a {
                Action::Forward { mb, chunk } => (0, mb, chunk),
                Action::Backward { mb, chunk } => (1, mb, chunk),
                Action::BackwardInput { mb, chunk } => (2, mb, chunk),
                Action::BackwardWeight { mb, chunk } => (3, mb, chunk),
                _ => continue,
            };
            *count.entry(k).or_default() += 1;
        }
        for mb in 0..plan.m {
            for chunk in 0..plan.v {
                let n = |k: u8| count.get(&(k, mb, chunk)).copied().unwrap_or(0);
                let backward_once = (n(1) == 1 && n(2) + n(3) == 0) || (n(1) == 0 && n(2) == 1 && n(3) == 1);
                if n(0) != 1 || !backward_once {
                    return Err(format!(
                        "rank {r} computes micro-batch {mb} chunk {chunk} {} time(s) forward and {}/{}/{} backward (whole/input/weight)",
                        n(0),
                        n(1),
                        n(2),
                        n(3)
                    ));
                }
            }
        }
    }
    Ok(())
}
