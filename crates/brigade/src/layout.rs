//! The one layout value: how a run splits its work over ranks — data × pipeline × context ×
//! tensor parallel degrees, the ZeRO stage, sequence parallelism, the pipeline's schedule, model
//! chunks per rank, the micro-batch, activation recompute, and how a context group splits a
//! sequence and exchanges its keys and values. Parsed once from the string `brigade train
//! --layout`, `bench parallel`, `bench plan --layout` and `plan --layout` take
//! (`dp=2,pp=2,cp=2,tp=2,zero=1,sp=1,schedule=zb,v=2,mb=1,recompute=selective,cp_comm=ring`),
//! checked here for what a layout alone can get wrong; the mesh, the trainer and the planner
//! read the same value. The mesh's axes ([`Axis`]) are named here too, so that a layout answers
//! its degree on each (`Layout::degree`); `ep=` parses, but only at 1 until training runs it.

use crate::error::{Error, Result};
use serde::Serialize;

/// An axis of the device mesh. The first four multiply into the ranks, outer to inner (the
/// order of the variants): pipeline stages outermost, then data replicas, then the context
/// (sequence) split, then tensor slices innermost, as Megatron-LM orders them (a
/// tensor-parallel group stays inside a node). The expert axis multiplies nothing: it is a
/// second factoring of the data × context ranks (Megatron-Core's expert grid), so `ep` divides
/// `dp · cp`. `parallel::mesh` builds the groups of these axes.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Axis {
    Pp,
    Dp,
    Cp,
    Tp,
    Ep,
}

impl Axis {
    /// Every axis, in the order of the variants.
    pub const ALL: [Axis; 5] = [Axis::Pp, Axis::Dp, Axis::Cp, Axis::Tp, Axis::Ep];
    /// The axes whose degrees multiply into the ranks, outer to inner.
    pub const RANKS: [Axis; 4] = [Axis::Pp, Axis::Dp, Axis::Cp, Axis::Tp];

    /// Its name in a layout string (`dp=2`).
    pub fn name(self) -> &'static str {
        match self {
            Axis::Pp => "pp",
            Axis::Dp => "dp",
            Axis::Cp => "cp",
            Axis::Tp => "tp",
            Axis::Ep => "ep",
        }
    }
}

/// Refuses a world of another size than the product of `degrees` (the rank axes, in the
/// order a message names them), saying what would fit.
pub(crate) fn check_world_of(degrees: &[(Axis, usize)], world: usize) -> Result<()> {
    let need: usize = degrees.iter().map(|&(_, d)| d).product();
    if need != world {
        let each: Vec<String> = degrees.iter().map(|(a, d)| format!("{}={d}", a.name())).collect();
        let names: Vec<&str> = degrees.iter().map(|(a, _)| a.name()).collect();
        return Err(Error::Layout(format!(
            "the layout {} needs {need} ranks but {world} were started; start {need} ranks or change the layout so that {} = {world}",
            each.join(" × "),
            names.join("·"),
        )));
    }
    Ok(())
}

/// The pipeline schedules `schedule=…` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
pub enum Schedule {
    /// All forwards, then all backwards (Huang et al. 2019).
    #[serde(rename = "gpipe")]
    GPipe,
    /// One forward, one backward (PipeDream-Flush): at most pp micro-batches in flight.
    #[serde(rename = "1f1b")]
    OneFOneB,
    /// 1F1B over v model chunks per rank (Narayanan et al. 2021): bubble (pp−1)/(v·m).
    #[serde(rename = "interleaved")]
    Interleaved,
    /// ZB-H1 (Qi et al. 2023): backward split into its input-gradient part B and its
    /// weight-gradient part W; W's wait to fill the bubbles, in-flight as in 1F1B.
    #[serde(rename = "zb")]
    ZeroBubble,
}

impl Schedule {
    pub const ALL: [Schedule; 4] = [Schedule::GPipe, Schedule::OneFOneB, Schedule::Interleaved, Schedule::ZeroBubble];

    pub fn parse(name: &str) -> Result<Schedule> {
        Schedule::ALL
            .into_iter()
            .find(|s| s.name() == name)
            .ok_or_else(|| Error::Layout(format!("schedule={name}: expected gpipe, 1f1b, interleaved or zb")))
    }

    pub fn name(&self) -> &'static str {
        match self {
            Schedule::GPipe => "gpipe",
            Schedule::OneFOneB => "1f1b",
            Schedule::Interleaved => "interleaved",
            Schedule::ZeroBubble => "zb",
        }
    }

    /// The schedule a pipeline of `v` chunks per rank runs when none is named: 1F1B, or
    /// interleaved 1F1B with several chunks.
    pub fn default_for(v: usize) -> Schedule {
        if v > 1 {
            Schedule::Interleaved
        } else {
            Schedule::OneFOneB
        }
    }
}

/// Activation recompute: none, the attention scores only (selective, Korthikanti et al.
/// 2022), or every layer's forward again before its backward (full).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, PartialOrd, Ord, Hash)]
#[serde(rename_all = "lowercase")]
pub enum Recompute {
    None,
    Selective,
    Full,
}

impl Recompute {
    pub const ALL: [Recompute; 3] = [Recompute::None, Recompute::Selective, Recompute::Full];

    pub fn parse(s: &str) -> Option<Recompute> {
        Recompute::ALL.into_iter().find(|r| r.name() == s)
    }

    pub fn name(&self) -> &'static str {
        match self {
            Recompute::None => "none",
            Recompute::Selective => "selective",
            Recompute::Full => "full",
        }
    }
}

/// How a context group exchanges keys and values: all-gathered before attention (what Llama 3
/// did; its backward reduce-scatters dK/dV), or passed round a ring while each block is
/// attended to (Ring Attention; dK/dV travel the ring back to their owner).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CpComm {
    AllGather,
    Ring,
}

impl CpComm {
    pub fn name(&self) -> &'static str {
        match self {
            CpComm::AllGather => "allgather",
            CpComm::Ring => "ring",
        }
    }
}

/// Which rows of a sequence each rank of a context group holds: `2·cp` equal chunks, rank r
/// chunks r and `2·cp − 1 − r` (zigzag: under the causal mask every rank has the same attention
/// work, as Megatron-Core splits), or `cp` chunks, rank r chunk r (contiguous: the last rank
/// does most of the work; kept for comparison).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum CpOrder {
    Zigzag,
    Contiguous,
}

impl CpOrder {
    pub fn name(&self) -> &'static str {
        match self {
            CpOrder::Zigzag => "zigzag",
            CpOrder::Contiguous => "contiguous",
        }
    }

    /// Equal chunks a sequence is cut into over `cp` ranks.
    pub fn chunks(&self, cp: usize) -> usize {
        match self {
            CpOrder::Zigzag => 2 * cp,
            CpOrder::Contiguous => cp,
        }
    }
}

/// A layout as written: the fields it names, the rest `None` (set to their defaults by
/// [`Spec::layout`], or searched by the planner).
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Spec {
    pub tp: Option<usize>,
    pub pp: Option<usize>,
    pub dp: Option<usize>,
    pub cp: Option<usize>,
    pub cp_comm: Option<CpComm>,
    pub cp_order: Option<CpOrder>,
    pub mb: Option<usize>,
    pub v: Option<usize>,
    pub recompute: Option<Recompute>,
    pub zero: Option<u8>,
    pub schedule: Option<Schedule>,
    /// Sequence parallelism beside tensor parallelism (`sp=1`); training only.
    pub sp: Option<bool>,
    /// Ranks a mixture's experts are spread over (expert parallelism), carved from dp × cp.
    pub ep: Option<usize>,
}

impl Spec {
    /// Parses `tp=8,pp=4,dp=32,mb=2,v=3,recompute=full,zero=1,schedule=zb,sp=1` (spaces
    /// around fields allowed, each field at most once).
    pub fn parse(s: &str) -> Result<Spec> {
        let mut f = Spec::default();
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
                "cp" => f.cp = Some(num()?),
                "cp_comm" => {
                    f.cp_comm = Some(match v {
                        "ring" => CpComm::Ring,
                        "allgather" | "all-gather" | "all_gather" => CpComm::AllGather,
                        _ => return Err(Error::Layout(format!("cp_comm={v}: expected ring or allgather"))),
                    })
                }
                "cp_order" => {
                    f.cp_order = Some(match v {
                        "zigzag" => CpOrder::Zigzag,
                        "contiguous" => CpOrder::Contiguous,
                        _ => return Err(Error::Layout(format!("cp_order={v}: expected zigzag or contiguous"))),
                    })
                }
                "ep" => f.ep = Some(num()?),
                "mb" => f.mb = Some(num()?),
                "v" => f.v = Some(num()?),
                "recompute" => {
                    f.recompute = Some(
                        Recompute::parse(v)
                            .ok_or_else(|| Error::Layout(format!("recompute={v}: expected none, selective or full")))?,
                    )
                }
                "schedule" => f.schedule = Some(Schedule::parse(v)?),
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
                        "unknown layout field '{k}'; known: tp, pp, dp, cp, cp_comm, cp_order, ep, mb, v, recompute, zero, schedule, sp"
                    )))
                }
            }
        }
        Ok(f)
    }

    /// The layout with every unnamed field at its default: degrees 1, one chunk per rank, no
    /// recompute, ZeRO-0, no sequence parallelism, the micro-batch left to the run's batch.
    pub fn layout(&self) -> Result<Layout> {
        let v = self.v.unwrap_or(1);
        let l = Layout {
            dp: self.dp.unwrap_or(1),
            pp: self.pp.unwrap_or(1),
            tp: self.tp.unwrap_or(1),
            cp: self.cp.unwrap_or(1),
            cp_comm: self.cp_comm.unwrap_or(CpComm::AllGather),
            cp_order: self.cp_order.unwrap_or(CpOrder::Zigzag),
            mb: self.mb,
            v,
            schedule: self.schedule.unwrap_or(Schedule::default_for(v)),
            recompute: self.recompute.unwrap_or(Recompute::None),
            zero: self.zero.unwrap_or(0),
            sp: self.sp.unwrap_or(false),
            ep: self.ep.unwrap_or(1),
        };
        let dp_cp = l.dp.saturating_mul(l.cp);
        if l.ep == 0 || !dp_cp.is_multiple_of(l.ep) {
            return Err(Error::Layout(format!(
                "ep={}: it must divide dp × cp = {dp_cp} (the expert groups are carved from the data × context ranks; ep adds no ranks)",
                l.ep
            )));
        }
        l.dp.checked_mul(l.pp).and_then(|x| x.checked_mul(l.tp)).and_then(|x| x.checked_mul(l.cp)).ok_or_else(
            || Error::Layout(format!("mesh dp={}, pp={}, cp={}, tp={} is too large", l.dp, l.pp, l.cp, l.tp)),
        )?;
        Ok(l)
    }
}

/// A whole layout. The single worker is `Layout::default()` (1 × 1 × 1).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
pub struct Layout {
    pub dp: usize,
    pub pp: usize,
    pub tp: usize,
    /// Ranks each sequence is split over (context parallelism), how they exchange keys and
    /// values, and which rows each holds.
    pub cp: usize,
    pub cp_comm: CpComm,
    pub cp_order: CpOrder,
    /// Sequences per micro-batch when the layout names them; unset, the run's micro-batch
    /// (see [`Layout::micro_batch`]).
    pub mb: Option<usize>,
    /// Model chunks per pipeline rank (interleaved schedules).
    pub v: usize,
    /// The pipeline's schedule (meaningless without a pipeline).
    pub schedule: Schedule,
    pub recompute: Recompute,
    /// ZeRO stage: 0 (replicated), 1 (optimizer state sharded), 2 (and gradients), 3 (and
    /// parameters).
    pub zero: u8,
    /// Sequence parallelism inside the tensor-parallel group.
    pub sp: bool,
    /// Ranks of dp × cp a mixture's experts are spread over (each holds experts / ep of them).
    pub ep: usize,
}

impl Default for Layout {
    fn default() -> Layout {
        Layout {
            dp: 1,
            pp: 1,
            tp: 1,
            cp: 1,
            cp_comm: CpComm::AllGather,
            cp_order: CpOrder::Zigzag,
            mb: None,
            v: 1,
            schedule: Schedule::OneFOneB,
            recompute: Recompute::None,
            zero: 0,
            sp: false,
            ep: 1,
        }
    }
}

impl Layout {
    /// Parses a layout string; unnamed fields take their defaults (see [`Spec::layout`]).
    pub fn parse(s: &str) -> Result<Layout> {
        Spec::parse(s)?.layout()
    }

    /// Ranks in the mesh: the product of the rank axes' degrees, dp · pp · cp · tp.
    pub fn world(&self) -> usize {
        Axis::RANKS.iter().map(|&a| self.degree(a)).product()
    }

    /// The layout's degree on `axis`.
    pub fn degree(&self, axis: Axis) -> usize {
        match axis {
            Axis::Pp => self.pp,
            Axis::Dp => self.dp,
            Axis::Cp => self.cp,
            Axis::Tp => self.tp,
            Axis::Ep => self.ep,
        }
    }

    /// Refuses sequences of `seq` tokens the context group cannot split into equal chunks
    /// (`cp_order`'s), naming the lengths near it that split.
    pub fn check_seq(&self, seq: usize) -> Result<()> {
        let k = self.cp_order.chunks(self.cp);
        if self.cp == 1 || seq.is_multiple_of(k) && seq >= k {
            return Ok(());
        }
        let lo = seq / k * k;
        let fits = if lo == 0 { format!("{k}") } else { format!("{lo} or {}", lo + k) };
        Err(Error::Layout(format!(
            "cp={} with cp_order={} cuts each sequence into {k} equal chunks, and a sequence of {seq} tokens does not split into them; use a sequence length that is a multiple of {k} (e.g. {fits}), or another cp",
            self.cp,
            self.cp_order.name()
        )))
    }

    /// The schedule's name, "none" without a pipeline.
    pub fn schedule_name(&self) -> &'static str {
        if self.pp == 1 {
            "none"
        } else {
            self.schedule.name()
        }
    }

    /// Whether a rank runs its micro-batches through the pipeline executor (a pipeline, model
    /// chunks, or recompute) rather than the data/tensor-parallel loop.
    pub fn runs_executor(&self) -> bool {
        self.pp > 1 || self.v > 1 || self.recompute != Recompute::None
    }

    /// Whether each rank holds only its expert group's block of a mixture's experts (ep > 1
    /// without ZeRO), their gradients summed over the ranks holding the same experts. Under
    /// ZeRO every rank keeps every expert's slot and ZeRO divides them over all dp × cp ranks.
    pub fn divides_experts(&self) -> bool {
        self.ep > 1 && self.zero == 0
    }

    /// The micro-batch rule: the layout's `mb`, else `micro_batch` (the run's
    /// `--micro-batch`), else the whole share of a dp replica; the global `batch` must split
    /// into dp replicas of whole micro-batches.
    pub fn micro_batch(&self, batch: usize, micro_batch: Option<usize>) -> Result<usize> {
        let dp = self.dp;
        let mb = self.mb.or(micro_batch).unwrap_or(batch / dp).max(1);
        if self.mb.or(micro_batch).is_none() && !batch.is_multiple_of(dp) {
            // no micro-batch given: each replica takes an equal share of the batch
            let (lo, hi) = (batch / dp * dp, (batch / dp + 1) * dp);
            let fits = if lo == 0 { format!("{hi}") } else { format!("{lo} or {hi}") };
            return Err(Error::Layout(format!(
                "the global batch of {batch} sequences does not split into dp={dp} equal shares; use a batch that is a multiple of {dp} (e.g. {fits})"
            )));
        }
        if !batch.is_multiple_of(dp * mb) {
            return Err(Error::Layout(format!(
                "the global batch of {batch} sequences does not split into dp={dp} shards of whole micro-batches of {mb}; make batch a multiple of dp × micro_batch = {}",
                dp * mb
            )));
        }
        Ok(mb)
    }

    /// Micro-batches per dp replica and step at micro-batch `mb`.
    pub fn micro_batches(&self, batch: usize, mb: usize) -> usize {
        batch / (self.dp * mb)
    }

    /// Refuses what training cannot run, whatever the model: a ZeRO stage past 3 (a layout
    /// built in code, not parsed), sequence parallelism without tensor parallelism, ZeRO-2/3
    /// beside a pipeline, model chunks or recompute.
    pub fn check_training(&self) -> Result<()> {
        if self.zero > 3 {
            return Err(Error::Layout(format!("zero={}: expected a ZeRO stage 0, 1, 2 or 3", self.zero)));
        }
        if self.sp && self.tp == 1 {
            return Err(Error::Layout(format!(
                "sp=1 splits the sequence across the tensor-parallel group, but the layout '{self}' has tp=1; add tp=2 or more, or drop sp"
            )));
        }
        if self.pp > 1 && self.zero >= 2 {
            return Err(Error::Layout(format!(
                "zero={} with pp={}: a pipeline keeps every micro-batch's gradients until the step ends, so ZeRO-2/3 would save nothing; use zero=1 (as Megatron-LM's distributed optimizer)",
                self.zero, self.pp
            )));
        }
        if self.runs_executor() && self.zero >= 2 {
            return Err(Error::Layout(format!("zero={} with v>1 or recompute: use zero=0 or 1 there", self.zero)));
        }
        Ok(())
    }

    /// Refuses a world of another size, saying what would fit.
    pub fn check_world(&self, world: usize) -> Result<()> {
        let cp = (self.cp > 1).then_some((Axis::Cp, self.cp));
        let axes: Vec<(Axis, usize)> =
            [Some((Axis::Dp, self.dp)), Some((Axis::Pp, self.pp)), cp, Some((Axis::Tp, self.tp))]
                .into_iter()
                .flatten()
                .collect();
        check_world_of(&axes, world)
    }
}

/// The fields that differ from the single worker's, in the syntax [`Layout::parse`] reads
/// (`dp=1` for the single worker itself).
impl std::fmt::Display for Layout {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        let d = Layout::default();
        let mut parts = Vec::new();
        for (name, x, base) in [
            ("dp", self.dp, 1),
            ("pp", self.pp, 1),
            ("cp", self.cp, 1),
            ("tp", self.tp, 1),
            ("ep", self.ep, 1),
            ("v", self.v, 1),
        ] {
            if x != base {
                parts.push(format!("{name}={x}"));
            }
        }
        if let Some(mb) = self.mb {
            parts.push(format!("mb={mb}"));
        }
        if self.zero != d.zero {
            parts.push(format!("zero={}", self.zero));
        }
        if self.sp {
            parts.push("sp=1".into());
        }
        if self.schedule != Schedule::default_for(self.v) {
            parts.push(format!("schedule={}", self.schedule.name()));
        }
        if self.recompute != d.recompute {
            parts.push(format!("recompute={}", self.recompute.name()));
        }
        if self.cp_comm != d.cp_comm {
            parts.push(format!("cp_comm={}", self.cp_comm.name()));
        }
        if self.cp_order != d.cp_order {
            parts.push(format!("cp_order={}", self.cp_order.name()));
        }
        if parts.is_empty() {
            parts.push("dp=1".into());
        }
        f.write_str(&parts.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The message for an unknown field lists every field the parser takes, and each field it
    /// lists parses.
    #[test]
    fn the_unknown_field_message_names_every_field_the_parser_takes() {
        let e = Spec::parse("foo=1").unwrap_err().to_string();
        let known: Vec<&str> = e.split("known: ").nth(1).expect("a list of fields").split(", ").collect();
        let fields = [
            ("tp", "2"),
            ("pp", "2"),
            ("dp", "2"),
            ("cp", "2"),
            ("cp_comm", "ring"),
            ("cp_order", "contiguous"),
            ("ep", "2"),
            ("mb", "2"),
            ("v", "2"),
            ("recompute", "full"),
            ("zero", "1"),
            ("schedule", "zb"),
            ("sp", "1"),
        ];
        assert_eq!(known, fields.map(|(k, _)| k), "{e}");
        for (k, v) in fields {
            assert!(Spec::parse(&format!("{k}={v}")).is_ok(), "{k}={v}");
        }
    }

    #[test]
    fn layout_fields_are_parsed_once() {
        let f = Spec::parse("tp=8, pp=4,zero=1,recompute=full,schedule=1f1b").unwrap();
        assert_eq!(
            (f.tp, f.pp, f.zero, f.recompute, f.schedule),
            (Some(8), Some(4), Some(1), Some(Recompute::Full), Some(Schedule::OneFOneB))
        );
        let e = Spec::parse("tp=2,pp=2,tp=4").unwrap_err().to_string();
        assert!(e.contains("'tp' is given twice"), "{e}");
        for bad in ["tp=0", "tp", "zero=4", "schedule=zb1", "dp=-1", "speed=11", "sp=2", "recompute=some"] {
            assert!(Spec::parse(bad).is_err(), "{bad} accepted");
        }
        assert!(Layout::parse("dp=18446744073709551615,tp=2").is_err(), "overflowing world accepted");
    }

    #[test]
    fn a_layout_answers_its_degree_on_every_axis() {
        let l = Layout::parse("dp=2,pp=3,tp=4,cp=1,ep=1").unwrap();
        let degrees: Vec<usize> = Axis::ALL.iter().map(|&a| l.degree(a)).collect();
        assert_eq!(degrees, [3, 2, 1, 4, 1], "pp, dp, cp, tp, ep");
        assert_eq!(l, Layout::parse("dp=2,pp=3,tp=4").unwrap(), "cp=1 and ep=1 are the defaults");
        assert_eq!(l.world(), 24);
        let c = Layout::parse("dp=2,cp=4,tp=2").unwrap();
        assert_eq!((c.degree(Axis::Cp), c.world()), (4, 16));
        // experts carved from dp × cp: no ranks added, and ep must divide them
        let e = Layout::parse("dp=4,ep=2").unwrap();
        assert_eq!((e.degree(Axis::Ep), e.world(), e.to_string()), (2, 4, "dp=4,ep=2".to_string()));
        let e = Layout::parse("dp=2,cp=2,ep=3").unwrap_err().to_string();
        assert!(e.contains("ep=3: it must divide dp × cp = 4"), "{e}");
        assert!(Layout::parse("ep=0").is_err());
        for bad in ["cp=0", "cp_comm=p2p", "cp_order=zagzig", "cp=two"] {
            assert!(Layout::parse(bad).is_err(), "{bad} accepted");
        }
        let e = Layout::parse("cp=2").unwrap().check_seq(10).unwrap_err().to_string();
        assert!(e.contains("cuts each sequence into 4 equal chunks") && e.contains("(e.g. 8 or 12)"), "{e}");
        assert!(Layout::parse("cp=2,cp_order=contiguous").unwrap().check_seq(10).is_ok());
        assert!(Layout::parse("cp=4").unwrap().check_seq(16).is_ok());
        assert!(Layout::parse("cp=4").unwrap().check_seq(4).unwrap_err().to_string().contains("(e.g. 8)"));
        let e = Layout::parse("dp=2,cp=2").unwrap().check_world(8).unwrap_err().to_string();
        assert!(e.contains("dp=2 × pp=1 × cp=2 × tp=1 needs 4 ranks"), "{e}");
        let e = Layout::parse("dp=2,tp=2").unwrap().check_world(8).unwrap_err().to_string();
        assert!(
            e.contains("the layout dp=2 × pp=1 × tp=2 needs 4 ranks but 8 were started; start 4 ranks or change the layout so that dp·pp·tp = 8"),
            "{e}"
        );
    }

    #[test]
    fn a_layout_prints_as_it_parses() {
        for s in [
            "dp=1",
            "dp=2,zero=1",
            "dp=2,pp=2,tp=2,mb=1,zero=1,sp=1",
            "pp=4,v=2",
            "pp=4,v=2,schedule=zb",
            "pp=2,schedule=gpipe,recompute=selective",
            "pp=2,v=3,recompute=full",
            "dp=2,cp=2,tp=2,sp=1",
            "cp=4,cp_comm=ring,cp_order=contiguous",
        ] {
            let l = Layout::parse(s).unwrap();
            assert_eq!(l.to_string(), s);
            assert_eq!(Layout::parse(&l.to_string()).unwrap(), l);
        }
        assert_eq!(Layout::parse("").unwrap(), Layout::default());
        assert_eq!(Layout::parse("pp=2,v=2").unwrap().schedule, Schedule::Interleaved);
        assert_eq!(Layout::parse("pp=2").unwrap().schedule, Schedule::OneFOneB);
    }

    #[test]
    fn the_micro_batch_rule() {
        let l = Layout::parse("dp=2").unwrap();
        assert_eq!(l.micro_batch(16, None).unwrap(), 8, "unset: the replica's share");
        assert_eq!(l.micro_batch(16, Some(4)).unwrap(), 4, "the run's micro-batch");
        let named = Layout::parse("dp=2,mb=2").unwrap();
        assert_eq!(named.micro_batch(16, Some(4)).unwrap(), 2, "the layout's mb wins");
        assert_eq!(named.micro_batches(16, 2), 4);
        let e = Layout::parse("dp=3").unwrap().micro_batch(16, None).unwrap_err().to_string();
        assert!(
            e.contains("does not split into dp=3 equal shares; use a batch that is a multiple of 3 (e.g. 15 or 18)"),
            "{e}"
        );
        let e = Layout::parse("dp=3").unwrap().micro_batch(2, None).unwrap_err().to_string();
        assert!(e.contains("(e.g. 3)"), "below one share each, one suggestion: {e}");
        let e = l.micro_batch(16, Some(3)).unwrap_err().to_string();
        assert!(e.contains("does not split into dp=2 shards of whole micro-batches of 3"), "{e}");
    }

    #[test]
    fn training_refuses_what_no_model_can_run() {
        assert!(Layout::parse("dp=2,sp=1").unwrap().check_training().unwrap_err().to_string().contains("has tp=1"));
        assert!(Layout::parse("pp=2,zero=2").unwrap().check_training().unwrap_err().to_string().contains("use zero=1"));
        assert!(Layout::parse("v=2,zero=3").unwrap().check_training().is_err());
        assert!(Layout::parse("recompute=full,zero=2").unwrap().check_training().is_err());
        assert!(Layout { zero: 4, ..Layout::default() }.check_training().is_err());
        for ok in ["dp=2,zero=3", "tp=2,sp=1", "pp=2,zero=1", "dp=2,pp=2,tp=2,v=2,recompute=selective"] {
            assert!(Layout::parse(ok).unwrap().check_training().is_ok(), "{ok}");
        }
        assert!(Layout::parse("dp=2,tp=2").unwrap().check_world(3).is_err());
        assert!(Layout::parse("dp=2,tp=2").unwrap().check_world(4).is_ok());
    }
}
