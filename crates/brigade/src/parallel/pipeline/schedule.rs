//! Pipeline schedules as data: a pure function turns (pp, micro-batches, schedule, virtual
//! stages) into each rank's list of actions; one executor runs any list and the simulator
//! (`simulate.rs`) checks every list.
//!
//! The model is cut into `pp · v` stages; stage `s` lives on rank `s % pp` as its chunk
//! `s / pp` (Megatron's interleaving; with v = 1 rank r holds stage r). A forward of stage s
//! needs stage s − 1's activation, a backward needs stage s + 1's gradient; when the two
//! stages are on different ranks the value travels by a send and a receive.

use super::plan::{Action, Plan};
use super::simulate::{simulate, Costs};
use crate::error::{Error, Result};
use crate::layout::Schedule;

/// The compute actions of a rank, in order, before the sends and receives are put in.
type Order = Vec<Action>;

/// The largest pipeline (stages pp·v) and micro-batch count a plan is built for.
pub const MAX_STAGES: usize = 4096;
pub const MAX_MICRO_BATCHES: usize = 1 << 16;

/// Builds every rank's list, refusing what a schedule cannot run with a line saying what would.
pub fn build(kind: Schedule, pp: usize, m: usize, v: usize) -> Result<Plan> {
    build_for(kind, pp, m, v, &Costs::UNIT)
}

/// `build` for actions that take `costs` (a stage's measured forward, input- and weight-
/// gradient times): ZB-H1's lists are the ones that run shortest on them; the other schedules'
/// lists do not depend on the costs.
pub fn build_for(kind: Schedule, pp: usize, m: usize, v: usize, costs: &Costs) -> Result<Plan> {
    if pp == 0 || m == 0 || v == 0 {
        return Err(Error::Layout(format!("pp={pp}, {m} micro-batches, v={v}: each must be at least 1")));
    }
    // every rank's list is built in memory: bound what is asked before building it
    if pp.checked_mul(v).is_none_or(|s| s > MAX_STAGES) || m > MAX_MICRO_BATCHES {
        return Err(Error::Layout(format!(
            "pp={pp} × v={v} stages and {m} micro-batches: brigade schedules at most {MAX_STAGES} stages (pp·v) and {MAX_MICRO_BATCHES} micro-batches; lower them"
        )));
    }
    if v > 1 && kind != Schedule::Interleaved {
        return Err(Error::Layout(format!(
            "v={v} model chunks per rank needs schedule=interleaved; {} runs one chunk per rank (v=1)",
            kind.name()
        )));
    }
    if kind == Schedule::Interleaved && !m.is_multiple_of(pp) {
        let (lo, hi) = (m / pp * pp, (m / pp + 1) * pp);
        let fits = if lo == 0 { format!("{hi}") } else { format!("{lo} or {hi}") };
        return Err(Error::Layout(format!(
            "schedule=interleaved sends micro-batches round the pipeline in groups of pp={pp}, so it needs a multiple of {pp} micro-batches, not {m}; use {fits}"
        )));
    }
    let orders: Vec<Order> = match kind {
        Schedule::GPipe => (0..pp).map(|_| gpipe(m)).collect(),
        Schedule::OneFOneB => (0..pp).map(|r| one_f_one_b(pp, m, r)).collect(),
        // one chunk per rank: interleaving is 1F1B
        Schedule::Interleaved if v == 1 => (0..pp).map(|r| one_f_one_b(pp, m, r)).collect(),
        Schedule::Interleaved => (0..pp).map(|r| interleaved(pp, m, v, r)).collect(),
        Schedule::ZeroBubble => zero_bubble_h1(pp, m, costs),
    };
    let ranks = orders.iter().enumerate().map(|(r, o)| with_transfers(o, r, pp, v)).collect();
    Ok(Plan { kind, pp, m, v, ranks })
}

fn gpipe(m: usize) -> Order {
    let f = (0..m).map(|mb| Action::Forward { mb, chunk: 0 });
    f.chain((0..m).map(|mb| Action::Backward { mb, chunk: 0 })).collect()
}

/// Rank r runs pp − 1 − r forwards ahead, then alternates, then drains its backwards.
fn one_f_one_b(pp: usize, m: usize, r: usize) -> Order {
    let warm = (pp - 1 - r).min(m);
    let mut o: Order = (0..warm).map(|mb| Action::Forward { mb, chunk: 0 }).collect();
    for i in 0..m - warm {
        o.push(Action::Forward { mb: warm + i, chunk: 0 });
        o.push(Action::Backward { mb: i, chunk: 0 });
    }
    o.extend((m - warm..m).map(|mb| Action::Backward { mb, chunk: 0 }));
    o
}

/// Megatron's interleaved 1F1B: forwards go through chunks in groups of pp micro-batches,
/// backwards through the chunks in reverse; rank r runs (pp − 1 − r)·2 + (v − 1)·pp forwards
/// ahead.
fn interleaved(pp: usize, m: usize, v: usize, r: usize) -> Order {
    let total = m * v;
    let at = |k: usize, forward: bool| {
        let group = k / pp % v;
        let chunk = if forward { group } else { v - 1 - group };
        (k / (pp * v) * pp + k % pp, chunk)
    };
    let warm = ((pp - 1 - r) * 2 + (v - 1) * pp).min(total);
    let mut o: Order = (0..warm).map(|k| at(k, true)).map(|(mb, chunk)| Action::Forward { mb, chunk }).collect();
    for i in 0..total - warm {
        let (mb, chunk) = at(warm + i, true);
        o.push(Action::Forward { mb, chunk });
        let (mb, chunk) = at(i, false);
        o.push(Action::Backward { mb, chunk });
    }
    o.extend((total - warm..total).map(|k| at(k, false)).map(|(mb, chunk)| Action::Backward { mb, chunk }));
    o
}

/// ZB-H1, found by running the pipeline with each rank's rule: the input gradient B first (it
/// is on the critical path); then a deferred W if more than k wait; else a forward while fewer
/// than pp micro-batches hold activations (1F1B's peak, on its first rank); else a W; else
/// wait. The rule runs in unit time steps (F = B = W = 1) and, second, in time on `costs`
/// (each rank acting when it is free and its inputs have come); of both for k = 0…pp, the
/// lists that run shortest on `costs` (on unit costs the unit-step lists, ties going to
/// them). (Measured bubble on unit costs: pp=4, m=8: 14.3%, against 1F1B's 27.3% and the
/// paper's hand-made ZB-H1, (pp−1)/(3m+pp−1) = 11.1%. On a weight gradient cheaper than the
/// input gradient — F = 1, B = 1.3, W = 0.8, pp=2, m=8 — the unit-step lists' 12.7% is 8.5%
/// for the lists chosen on those costs.) Every list is checked by the simulator, and in W
/// order as in B order the micro-batches go first to last: the gradients sum alike in any of
/// them.
fn zero_bubble_h1(pp: usize, m: usize, costs: &Costs) -> Vec<Order> {
    let mut best: Option<(f64, Vec<Order>)> = None;
    let unit = (0..=pp).map(|k| Some(zero_bubble_with(pp, m, k)));
    let timed = (0..=pp).map(|k| zero_bubble_timed(pp, m, k, costs));
    for orders in unit.chain(timed).flatten() {
        let ranks = orders.iter().enumerate().map(|(r, o)| with_transfers(o, r, pp, 1)).collect();
        let plan = Plan { kind: Schedule::ZeroBubble, pp, m, v: 1, ranks };
        let Ok(rep) = simulate(&plan, costs) else { continue };
        if best.as_ref().is_none_or(|(t, _)| rep.makespan < *t - 1e-9 * t.abs().max(1.0)) {
            best = Some((rep.makespan, orders));
        }
    }
    best.expect("the unit-step rule never deadlocks").1
}

/// The ZB-H1 rule run in time on `costs`: the rank that can start an action soonest acts (ties:
/// the lower rank), its values reaching the neighbour `costs.transfer` after. `None` if the
/// rule stalls.
fn zero_bubble_timed(pp: usize, m: usize, k: usize, costs: &Costs) -> Option<Vec<Order>> {
    let never = f64::INFINITY;
    let mut orders: Vec<Order> = vec![Vec::new(); pp];
    let (mut next_f, mut next_b, mut held) = (vec![0usize; pp], vec![0usize; pp], vec![0usize; pp]);
    let mut pending_w: Vec<std::collections::VecDeque<usize>> = vec![Default::default(); pp];
    let mut free = vec![0.0f64; pp];
    // when rank r has micro-batch mb's activation / gradient
    let mut act_at = vec![vec![never; m]; pp];
    let mut grad_at = vec![vec![never; m]; pp];
    act_at[0].iter_mut().for_each(|a| *a = 0.0);
    for _ in 0..3 * m * pp {
        // when each rank's next B and F can start (W's are always ready)
        let b_at = |r: usize, next_b: &[usize], next_f: &[usize]| match next_b[r] < next_f[r] {
            true if r == pp - 1 => 0.0,
            true => grad_at[r][next_b[r]],
            false => never,
        };
        let f_at = |r: usize, next_f: &[usize], held: &[usize]| match next_f[r] < m && held[r] < pp {
            true => act_at[r][next_f[r]],
            false => never,
        };
        let start = |r: usize| {
            let ready = if pending_w[r].is_empty() { never } else { 0.0 };
            free[r].max(ready.min(b_at(r, &next_b, &next_f)).min(f_at(r, &next_f, &held)))
        };
        let r = (0..pp).filter(|&r| orders[r].len() < 3 * m).min_by(|&a, &b| start(a).total_cmp(&start(b)))?;
        let now = start(r);
        if !now.is_finite() {
            return None;
        }
        let (b_ready, f_ready) = (b_at(r, &next_b, &next_f) <= now, f_at(r, &next_f, &held) <= now);
        if b_ready {
            let mb = next_b[r];
            orders[r].push(Action::BackwardInput { mb, chunk: 0 });
            pending_w[r].push_back(mb);
            next_b[r] += 1;
            free[r] = now + costs.backward_input;
            if r > 0 {
                grad_at[r - 1][mb] = free[r] + costs.transfer;
            }
        } else if !pending_w[r].is_empty() && (pending_w[r].len() > k || !f_ready) {
            let mb = pending_w[r].pop_front()?;
            orders[r].push(Action::BackwardWeight { mb, chunk: 0 });
            held[r] -= 1;
            free[r] = now + costs.backward_weight;
        } else {
            let mb = next_f[r];
            orders[r].push(Action::Forward { mb, chunk: 0 });
            held[r] += 1;
            next_f[r] += 1;
            free[r] = now + costs.forward;
            if r + 1 < pp {
                act_at[r + 1][mb] = free[r] + costs.transfer;
            }
        }
    }
    orders.iter().all(|o| o.len() == 3 * m).then_some(orders)
}

fn zero_bubble_with(pp: usize, m: usize, k: usize) -> Vec<Order> {
    let mut orders: Vec<Order> = vec![Vec::new(); pp];
    // per rank: next forward, next B, W's pending (B done, W not), activations held
    let mut next_f = vec![0usize; pp];
    let mut next_b = vec![0usize; pp];
    let mut pending_w: Vec<std::collections::VecDeque<usize>> = vec![Default::default(); pp];
    let mut held = vec![0usize; pp];
    // the step at which an activation / a gradient becomes available to rank r for a mb
    let mut act_at = vec![vec![None::<usize>; m]; pp];
    let mut grad_at = vec![vec![None::<usize>; m]; pp];
    act_at[0].iter_mut().for_each(|a| *a = Some(0));
    let mut t = 0;
    // (every step some rank can act, so this ends well before the bound; the bound keeps a
    // rule that stalls from looping: its incomplete lists fail the simulator)
    while orders.iter().map(|o| o.len()).sum::<usize>() < 3 * m * pp && t < 12 * (m + pp) {
        let mut produced: Vec<(bool, usize, usize)> = Vec::new(); // (is_grad, rank, mb)
        for r in 0..pp {
            let b_ready = next_b[r] < next_f[r] && (r == pp - 1 || grad_at[r][next_b[r]].is_some_and(|at| at <= t));
            let f_ready = next_f[r] < m && held[r] < pp && act_at[r][next_f[r]].is_some_and(|at| at <= t);
            if b_ready {
                let mb = next_b[r];
                orders[r].push(Action::BackwardInput { mb, chunk: 0 });
                pending_w[r].push_back(mb);
                next_b[r] += 1;
                if r > 0 {
                    produced.push((true, r - 1, mb));
                }
            } else if pending_w[r].len() > k || !f_ready {
                if let Some(mb) = pending_w[r].pop_front() {
                    orders[r].push(Action::BackwardWeight { mb, chunk: 0 });
                    held[r] -= 1;
                }
            } else {
                let mb = next_f[r];
                orders[r].push(Action::Forward { mb, chunk: 0 });
                held[r] += 1;
                next_f[r] += 1;
                if r + 1 < pp {
                    produced.push((false, r + 1, mb));
                }
            }
        }
        t += 1;
        for (is_grad, r, mb) in produced {
            let slot = if is_grad { &mut grad_at[r][mb] } else { &mut act_at[r][mb] };
            *slot = Some(t);
        }
    }
    orders
}

/// Puts the receive before each compute action that needs another rank's value, and the send
/// after each one that produces a value another rank needs.
fn with_transfers(order: &Order, r: usize, pp: usize, v: usize) -> Vec<Action> {
    let stages = pp * v;
    let stage = |chunk: usize| chunk * pp + r;
    let rank_of = |s: usize| s % pp;
    let mut out = Vec::with_capacity(order.len() * 3);
    for &a in order {
        match a {
            Action::Forward { mb, chunk } => {
                let s = stage(chunk);
                if s > 0 && rank_of(s - 1) != r {
                    out.push(Action::RecvActivation { mb, chunk, from: rank_of(s - 1) });
                }
                out.push(a);
                if s + 1 < stages && rank_of(s + 1) != r {
                    out.push(Action::SendActivation { mb, chunk, to: rank_of(s + 1) });
                }
            }
            Action::Backward { mb, chunk } | Action::BackwardInput { mb, chunk } => {
                let s = stage(chunk);
                if s + 1 < stages && rank_of(s + 1) != r {
                    out.push(Action::RecvGrad { mb, chunk, from: rank_of(s + 1) });
                }
                out.push(a);
                if s > 0 && rank_of(s - 1) != r {
                    out.push(Action::SendGrad { mb, chunk, to: rank_of(s - 1) });
                }
            }
            _ => out.push(a),
        }
    }
    out
}

/// The lists as a small text chart, a row per rank: `F3` forward of micro-batch 3, `B` backward,
/// `b`/`w` its input- and weight-gradient halves, `.1` the chunk when interleaved.
pub fn chart(plan: &Plan) -> String {
    let mut s = format!("schedule {} · pp={} · {} micro-batches · v={}\n", plan.kind.name(), plan.pp, plan.m, plan.v);
    for (r, list) in plan.ranks.iter().enumerate() {
        let cells: Vec<String> = list
            .iter()
            .filter_map(|a| {
                let (tag, mb, chunk) = match *a {
                    Action::Forward { mb, chunk } => ("F", mb, chunk),
                    Action::Backward { mb, chunk } => ("B", mb, chunk),
                    Action::BackwardInput { mb, chunk } => ("b", mb, chunk),
                    Action::BackwardWeight { mb, chunk } => ("w", mb, chunk),
                    _ => return None,
                };
                Some(if plan.v > 1 { format!("{tag}{mb}.{chunk}") } else { format!("{tag}{mb}") })
            })
            .collect();
        s += &format!("rank {r}: {}\n", cells.join(" "));
    }
    s
}
