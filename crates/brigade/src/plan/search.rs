//! Enumerates layouts (the fields the user did not fix), keeps those that fit, ranks by time.

use super::catalog::{Accelerator, ModelShape};
use super::cost::{estimate, memory_gib, Estimate, Training};
use crate::error::{Error, Result};
use crate::layout::{CpComm, CpOrder, Layout, Recompute, Schedule, Spec};

/// The divisors of `n`, ascending, in O(√n).
fn divisors(n: usize) -> Vec<usize> {
    let (mut lo, mut hi) = (Vec::new(), Vec::new());
    let mut d = 1;
    while d * d <= n {
        if n.is_multiple_of(d) {
            lo.push(d);
            if d * d != n {
                hi.push(n / d);
            }
        }
        d += 1;
    }
    lo.extend(hi.into_iter().rev());
    lo
}

/// Every valid layout of `gpus` GPUs that agrees with `fixed`, fitting in memory or not.
pub fn layouts(m: &ModelShape, gpus: usize, t: &Training, fixed: &Spec) -> Vec<Layout> {
    let mut out = Vec::new();
    for tp in divisors(gpus) {
        // heads (and key/value heads) are split over tensor-parallel ranks
        if fixed.tp.is_some_and(|x| x != tp)
            || !m.heads.is_multiple_of(tp)
            || (!m.kv_heads.is_multiple_of(tp) && tp % m.kv_heads != 0)
        {
            continue;
        }
        for pp in divisors(gpus / tp) {
            if fixed.pp.is_some_and(|x| x != pp) || pp > m.layers {
                continue;
            }
            for cp in divisors(gpus / (tp * pp)) {
                // a context split cuts each sequence into 2·cp chunks (zigzag) or cp (contiguous);
                // unasked, chunks of under 1024 tokens are not tried (too small to attend well)
                let order = fixed.cp_order.unwrap_or(CpOrder::Zigzag);
                let chunk = m.seq / order.chunks(cp).max(1);
                if fixed.cp.is_some_and(|x| x != cp)
                    || !m.seq.is_multiple_of(order.chunks(cp))
                    || (fixed.cp.is_none() && cp > 1 && chunk < 1024)
                {
                    continue;
                }
                let dp = gpus / (tp * pp * cp);
                if fixed.dp.is_some_and(|x| x != dp) || !t.global_batch.is_multiple_of(dp) {
                    continue;
                }
                for mb in divisors(t.global_batch / dp) {
                    if fixed.mb.is_some_and(|x| x != mb) || (fixed.mb.is_none() && mb > 16) {
                        continue;
                    }
                    let vs: Vec<usize> = match fixed.v {
                        Some(v) => vec![v],
                        None if pp == 1 => vec![1],
                        None => [1, 2, 3, 4, 6, 8].into_iter().filter(|&v| pp * v <= m.layers).collect(),
                    };
                    for v in vs {
                        for recompute in [Recompute::None, Recompute::Selective, Recompute::Full] {
                            if fixed.recompute.is_some_and(|x| x != recompute) {
                                continue;
                            }
                            for zero in 0..=3u8 {
                                if fixed.zero.is_some_and(|x| x != zero)
                                    || (dp == 1 && zero > 0 && fixed.zero.is_none())
                                {
                                    continue;
                                }
                                let plain = Schedule::default_for(v);
                                for schedule in [plain, Schedule::GPipe, Schedule::ZeroBubble] {
                                    let l = Layout {
                                        tp,
                                        pp,
                                        dp,
                                        mb: Some(mb),
                                        v,
                                        schedule,
                                        recompute,
                                        zero,
                                        sp: false,
                                        cp,
                                        cp_comm: fixed.cp_comm.unwrap_or(CpComm::AllGather),
                                        cp_order: order,
                                        ep: 1,
                                    };
                                    // GPipe only when asked for: it never beats 1F1B (same bubble, more
                                    // memory); ZB-H1 too, as the published runs and Megatron-LM have none
                                    let wanted = match fixed.schedule {
                                        // without a pipeline any schedule is trivially met, once
                                        Some(s) => (l.pp > 1 && schedule == s) || (l.pp == 1 && schedule == plain),
                                        None => schedule == plain,
                                    };
                                    if wanted && (schedule == plain || v == 1) {
                                        out.push(l);
                                    }
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    // a mixture's experts spread over ep ranks carved from data × context: every ep that
    // divides both them and the experts
    let eps = |l: &Layout| -> Vec<usize> {
        let experts = m.moe.map_or(1, |e| e.experts);
        divisors(l.dp * l.cp)
            .into_iter()
            .filter(|&ep| experts.is_multiple_of(ep) && fixed.ep.is_none_or(|x| x == ep))
            .collect()
    };
    out.into_iter().flat_map(|l| eps(&l).into_iter().map(move |ep| Layout { ep, ..l })).collect()
}

/// Every matching layout, fitting or not, fastest first (for judging a layout someone ran).
pub fn rank_all(m: &ModelShape, a: &Accelerator, gpus: usize, t: &Training, fixed: &Spec) -> Vec<Estimate> {
    let mut all: Vec<Estimate> = layouts(m, gpus, t, fixed).iter().map(|l| estimate(m, a, t, l)).collect();
    all.sort_by(|x, y| x.step_time_s.total_cmp(&y.step_time_s));
    all
}

/// The fitting layouts, fastest first. An error says why none qualifies.
pub fn search(m: &ModelShape, a: &Accelerator, gpus: usize, t: &Training, fixed: &Spec) -> Result<Vec<Estimate>> {
    let all = layouts(m, gpus, t, fixed);
    if all.is_empty() {
        return Err(Error::Config(format!(
            "no layout of {gpus} GPUs matches: tp must divide the {} heads and the GPU count, pp must divide gpus/tp, \
             cp must divide gpus/(tp·pp) and cut the sequence of {} into 2·cp chunks, dp = gpus/(tp·pp·cp) must divide \
             the global batch of {}, ep must divide dp·cp and the experts, and fixed fields must agree",
            m.heads, m.seq, t.global_batch
        )));
    }
    let mut fits: Vec<Estimate> = all.iter().map(|l| estimate(m, a, t, l)).filter(|e| e.fits).collect();
    if fits.is_empty() {
        let least = all.iter().map(|l| memory_gib(m, t, l)).fold(f64::INFINITY, f64::min);
        return Err(Error::Config(format!(
            "no layout fits in {:.0} GiB per GPU: the smallest needs {least:.1} GiB; add GPUs, allow recompute=full or zero=3, or pick a larger accelerator",
            a.hbm_gib
        )));
    }
    fits.sort_by(|x, y| x.step_time_s.total_cmp(&y.step_time_s));
    Ok(fits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn divisors_match_the_naive_count() {
        for n in (1..400).chain([720720, 1 << 20, 999_983]) {
            let naive: Vec<usize> = (1..=n).filter(|d| n % d == 0).collect();
            assert_eq!(divisors(n), naive, "divisors of {n}");
        }
    }
}
