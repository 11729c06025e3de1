//! Runs a plan on paper: every rank's list in order, each compute action taking its cost,
//! each receive waiting for its send. It refuses a list that computes without its inputs,
//! leaves a send unreceived, or deadlocks, and reports the step's length, each rank's busy
//! time, the bubble and each rank's peak of micro-batches holding activations.

use super::plan::{Action, Plan};

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

pub fn simulate(plan: &Plan, costs: &Costs) -> Result<Report, String> {
    simulate_scaled(plan, costs, &[])
}

/// `simulate` with stage `s`'s compute actions taking `scale[s]` times `costs` (stages of
/// unequal work; an empty `scale`: every stage 1).
pub fn simulate_scaled(plan: &Plan, costs: &Costs, scale: &[f64]) -> Result<Report, String> {
    let (pp, v) = (plan.pp, plan.v);
    let k = |s: usize| scale.get(s).copied().unwrap_or(1.0);
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
    // transfers in flight, one slot per (is a gradient, micro-batch, receiving stage): the
    // sender, the receiver and when it can be received
    let slot = |grad: bool, mb: usize, s: usize| (grad as usize * plan.m + mb) * stages + s;
    let mut inflight: Vec<Option<(usize, usize, f64)>> = vec![None; 2 * plan.m * stages];
    // what each rank has: activations / gradients received or made locally, forwards done —
    // one flag per (micro-batch, chunk), at `mb * v + chunk` (`check_work` bounds both)
    let flags = vec![vec![false; plan.m * v]; pp];
    let (mut have_act, mut have_grad, mut done_f, mut done_b) = (flags.clone(), flags.clone(), flags.clone(), flags);
    let at = |mb: usize, chunk: usize| mb * v + chunk;
    loop {
        let mut progressed = false;
        for r in 0..pp {
            while let Some(&a) = plan.ranks[r].get(pc[r]) {
                let blocked = |why: String| Err::<Report, String>(format!("rank {r}, action {} ({a:?}): {why}", pc[r]));
                match a {
                    Action::Forward { mb, chunk } => {
                        let s = stage(r, chunk);
                        if s > 0 && !have_act[r][at(mb, chunk)] {
                            // the previous stage on this same rank hands its output over
                            let local = s % pp == 0 && chunk > 0 && done_f[r][at(mb, chunk - 1)];
                            if !(pp == 1 && local) {
                                return blocked("forward without the previous stage's activation".into());
                            }
                        }
                        done_f[r][at(mb, chunk)] = true;
                        clock[r] += costs.forward * k(s);
                        busy[r] += costs.forward * k(s);
                        held[r] += 1;
                        peak[r] = peak[r].max(held[r]);
                    }
                    Action::Backward { mb, chunk } | Action::BackwardInput { mb, chunk } => {
                        let s = stage(r, chunk);
                        if !done_f[r][at(mb, chunk)] {
                            return blocked("backward before its forward".into());
                        }
                        if s + 1 < stages && !have_grad[r][at(mb, chunk)] {
                            let local = pp == 1 && chunk + 1 < v && done_b[r][at(mb, chunk + 1)];
                            if !local {
                                return blocked("backward without the next stage's gradient".into());
                            }
                        }
                        done_b[r][at(mb, chunk)] = true;
                        let whole = matches!(a, Action::Backward { .. });
                        let c = k(s) * if whole { costs.backward } else { costs.backward_input };
                        clock[r] += c;
                        busy[r] += c;
                        if whole {
                            held[r] -= 1;
                        }
                    }
                    Action::BackwardWeight { mb, chunk } => {
                        if !done_b[r][at(mb, chunk)] {
                            return blocked("weight gradient before its input gradient".into());
                        }
                        let c = costs.backward_weight * k(stage(r, chunk));
                        clock[r] += c;
                        busy[r] += c;
                        held[r] -= 1;
                    }
                    Action::SendActivation { mb, chunk, to } => {
                        if !done_f[r][at(mb, chunk)] {
                            return blocked("sends an activation not yet computed".into());
                        }
                        let s = stage(r, chunk) + 1;
                        if s >= stages {
                            return blocked("sends an activation past the last stage".into());
                        }
                        if inflight[slot(false, mb, s)].replace((r, to, clock[r] + costs.transfer)).is_some() {
                            return blocked("sends the same activation twice".into());
                        }
                    }
                    Action::SendGrad { mb, chunk, to } => {
                        if !done_b[r][at(mb, chunk)] {
                            return blocked("sends a gradient not yet computed".into());
                        }
                        let s = stage(r, chunk);
                        if s == 0 {
                            return blocked("sends a gradient before the first stage".into());
                        }
                        if inflight[slot(true, mb, s - 1)].replace((r, to, clock[r] + costs.transfer)).is_some() {
                            return blocked("sends the same gradient twice".into());
                        }
                    }
                    Action::RecvActivation { mb, chunk, from } | Action::RecvGrad { mb, chunk, from } => {
                        let grad = matches!(a, Action::RecvGrad { .. });
                        let k = slot(grad, mb, stage(r, chunk));
                        let Some((_, _, ready)) = inflight[k].filter(|&(f, to, _)| (f, to) == (from, r)) else { break };
                        inflight[k] = None;
                        clock[r] = clock[r].max(ready);
                        let have = if grad { &mut have_grad[r] } else { &mut have_act[r] };
                        have[at(mb, chunk)] = true;
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
    if let Some((k, (from, to, _))) = inflight.iter().enumerate().find_map(|(k, t)| t.map(|t| (k, t))) {
        let (grad, mb, s) = (k / stages >= plan.m, k / stages % plan.m, k % stages);
        let what = if grad { "gradient" } else { "activation" };
        return Err(format!(
            "rank {from} sends the {what} of micro-batch {mb} for stage {s} to rank {to}, which never receives it"
        ));
    }
    let makespan = clock.iter().cloned().fold(0.0, f64::max);
    let bubble = 1.0 - busy.iter().sum::<f64>() / (pp as f64 * makespan);
    Ok(Report { makespan, busy, bubble, peak_activations: peak })
}

/// Every (micro-batch, chunk) of every rank is computed exactly once: one forward and one
/// whole backward, or its two halves; and no action names a micro-batch or chunk the plan
/// does not have.
fn check_work(plan: &Plan) -> Result<(), String> {
    let (m, v) = (plan.m, plan.v);
    for (r, list) in plan.ranks.iter().enumerate() {
        // forwards, whole backwards, input halves, weight halves of each (micro-batch, chunk)
        let mut count = vec![[0usize; 4]; m * v];
        for a in list {
            let (k, mb, chunk) = match *a {
                Action::Forward { mb, chunk } => (Some(0), mb, chunk),
                Action::Backward { mb, chunk } => (Some(1), mb, chunk),
                Action::BackwardInput { mb, chunk } => (Some(2), mb, chunk),
                Action::BackwardWeight { mb, chunk } => (Some(3), mb, chunk),
                Action::SendActivation { mb, chunk, .. }
                | Action::SendGrad { mb, chunk, .. }
                | Action::RecvActivation { mb, chunk, .. }
                | Action::RecvGrad { mb, chunk, .. } => (None, mb, chunk),
            };
            if mb >= m || chunk >= v {
                return Err(format!("rank {r}: {a:?} is outside the plan's {m} micro-batches and {v} chunks"));
            }
            if let Some(k) = k {
                count[mb * v + chunk][k] += 1;
            }
        }
        for mb in 0..m {
            for chunk in 0..v {
                let n = count[mb * v + chunk];
                let backward_once = (n[1] == 1 && n[2] + n[3] == 0) || (n[1] == 0 && n[2] == 1 && n[3] == 1);
                if n[0] != 1 || !backward_once {
                    return Err(format!(
                        "rank {r} computes micro-batch {mb} chunk {chunk} {} time(s) forward and {}/{}/{} backward (whole/input/weight)",
                        n[0], n[1], n[2], n[3]
                    ));
                }
            }
        }
    }
    Ok(())
}
