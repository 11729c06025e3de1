//! Enumerates layouts (the fields the user did not fix), keeps those that fit, ranks by time.

use super::catalog::{Accelerator, ModelShape};
use super::cost::{estimate, memory_gib, Estimate, Layout, Recompute, Training};
use crate::error::{Error, Result};

/// Fields of a layout the user fixed (`--layout tp=8,pp=4`); `None` is searched.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Fixed {
    pub tp: Option<usize>,
    pub pp: Option<usize>,
    pub dp: Option<usize>,
    pub mb: Option<usize>,
    pub v: Option<usize>,
    pub recompute: Option<Recompute>,
    pub zero: Option<u8>,
    /// `gpipe`, `1f1b`, `zb` (v = 1) or `interleaved` (v > 1).
    pub schedule: Option<&'static str>,
    /// Sequence parallelism beside tensor parallelism (`sp=1`); training only.
    pub sp: Option<bool>,
}

impl Fixed {
    /// Parses `tp=8,pp=4,dp=32,mb=2,v=3,recompute=full,zero=1`.
    pub fn parse(s: &str) -> Result<Fixed> {
        let mut f = Fixed::default();
        let mut seen: Vec<&str> = Vec::new();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (k, v) = part
                .split_once('=')
                .ok_or_else(|| Error::Layout(format!("layout field '{part}' needs the form key=value")))?;
            let (k, v) = (k.trim(), v.trim());
            if seen.contains(&k) {
                return Err(Error::Layout(format!("layout field '{k}' is given twice; give each field once")));
            }
            seen.push(k);
            let num = || {
                v.parse::<usize>()
                    .ok()
                    .filter(|&n| n > 0)
                    .ok_or_else(|| Error::Layout(format!("layout field {k}={v}: expected a positive integer")))
            };
            match k {
                "tp" => f.tp = Some(num()?),
                "pp" => f.pp = Some(num()?),
                "dp" => f.dp = Some(num()?),
                "mb" => f.mb = Some(num()?),
                "v" => f.v = Some(num()?),
                "recompute" => {
                    f.recompute = Some(
                        Recompute::parse(v)
                            .ok_or_else(|| Error::Layout(format!("recompute={v}: expected none, selective or full")))?,
                    )
                }
                "schedule" => {
                    f.schedule = Some(match v {
                        "gpipe" => "gpipe",
                        "1f1b" => "1f1b",
                        "interleaved" => "interleaved",
                        "zb" => "zb",
                        _ => {
                            return Err(Error::Layout(format!("schedule={v}: expected gpipe, 1f1b, interleaved or zb")))
                        }
                    })
                }
                "sp" => {
                    f.sp = Some(match v {
                        "0" => false,
                        "1" => true,
                        _ => {
                            return Err(Error::Layout(format!(
                                "sp={v}: expected 0 or 1 (sequence parallelism off or on)"
                            )))
                        }
                    })
                }
                "zero" => {
                    f.zero = Some(
                        v.parse::<u8>()
                            .ok()
                            .filter(|&z| z <= 3)
                            .ok_or_else(|| Error::Layout(format!("zero={v}: expected a ZeRO stage 0, 1, 2 or 3")))?,
                    )
                }
                _ => {
                    return Err(Error::Layout(format!(
                        "unknown layout field '{k}'; known: tp, pp, dp, mb, v, recompute, zero, schedule, sp"
                    )))
                }
            }
        }
        Ok(f)
    }
}

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
pub fn layouts(m: &ModelShape, gpus: usize, t: &Training, fixed: &Fixed) -> Vec<Layout> {
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
            let dp = gpus / (tp * pp);
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
                            if fixed.zero.is_some_and(|x| x != zero) || (dp == 1 && zero > 0 && fixed.zero.is_none()) {
                                continue;
                            }
                            for (gpipe, zb) in [(false, false), (true, false), (false, true)] {
                                let l = Layout { tp, pp, dp, mb, v, recompute, zero, gpipe, zb };
                                // GPipe only when asked for: it never beats 1F1B (same bubble, more
                                // memory); ZB-H1 too, as the published runs and Megatron-LM have none
                                let wanted = match fixed.schedule {
                                    // without a pipeline any schedule is trivially met, once
                                    Some(s) => l.schedule() == s || (l.pp == 1 && !gpipe && !zb),
                                    None => !gpipe && !zb,
                                };
                                if wanted && ((!gpipe && !zb) || v == 1) {
                                    out.push(l);
                                }
                            }
                        }
                    }
                }
            }
        }
    }
    out
}

/// Every matching layout, fitting or not, fastest first (for judging a layout someone ran).
pub fn rank_all(m: &ModelShape, a: &Accelerator, gpus: usize, t: &Training, fixed: &Fixed) -> Vec<Estimate> {
    let mut all: Vec<Estimate> = layouts(m, gpus, t, fixed).iter().map(|l| estimate(m, a, t, l)).collect();
    all.sort_by(|x, y| x.step_time_s.total_cmp(&y.step_time_s));
    all
}

/// The fitting layouts, fastest first. An error says why none qualifies.
pub fn search(m: &ModelShape, a: &Accelerator, gpus: usize, t: &Training, fixed: &Fixed) -> Result<Vec<Estimate>> {
    let all = layouts(m, gpus, t, fixed);
    if all.is_empty() {
        return Err(Error::Config(format!(
            "no layout of {gpus} GPUs matches: tp must divide the {} heads and the GPU count, pp must divide gpus/tp, \
             dp = gpus/(tp·pp) must divide the global batch of {}, and fixed fields must agree",
            m.heads, t.global_batch
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

    #[test]
    fn layout_fields_are_parsed_once() {
        let f = Fixed::parse("tp=8, pp=4,zero=1,recompute=full,schedule=1f1b").unwrap();
        assert_eq!(
            (f.tp, f.pp, f.zero, f.recompute, f.schedule),
            (Some(8), Some(4), Some(1), Some(Recompute::Full), Some("1f1b"))
        );
        let e = Fixed::parse("tp=2,pp=2,tp=4").unwrap_err().to_string();
        assert!(e.contains("'tp' is given twice"), "{e}");
        for bad in ["tp=0", "tp", "zero=4", "schedule=zb1", "dp=-1", "speed=11"] {
            assert!(Fixed::parse(bad).is_err(), "{bad} accepted");
        }
    }
}
