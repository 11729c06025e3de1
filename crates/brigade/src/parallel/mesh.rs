//! The device mesh: a world of `pp · dp · cp · tp` ranks on named axes ([`Axis`]), each rank
//! with its coordinates and the groups it belongs to, asked for by axes. Tensor-parallel ranks
//! are adjacent (tp innermost, as Megatron-LM orders them, so that a tensor-parallel group
//! stays inside a node), then the context split, then data replicas, then pipeline stages
//! outermost: rank = ((pp_rank · dp + dp_rank) · cp + cp_rank) · tp + tp_rank — with cp = 1,
//! (pp_rank · dp + dp_rank) · tp + tp_rank.
//!
//! The expert axis multiplies no ranks: it is a second factoring of the data × context ranks
//! (Megatron-Core's expert grid). Number a rank's place among them `i = dp_rank · cp + cp_rank`;
//! its expert-parallel group is the `ep` consecutive indices `i` holding different experts
//! (its coordinate on [`Axis::Ep`] is `i mod ep`), and its expert-data group the
//! `dp · cp / ep` ranks holding the same experts (`i mod ep` equal), over which an expert's
//! gradients are summed.
//!
//! A group is the ranks that differ only on the axes asked for, ordered by those coordinates
//! (outer to inner): `mesh.group(&[Axis::Tp])`, or flattened, `mesh.group(&[Axis::Dp,
//! Axis::Cp])` — the ranks holding the same parameters and different tokens, over which
//! gradients are summed once sequences are split (torchtitan's `loss` mesh, picotron's
//! `cp_dp_group`, Megatron-Core's `create_pg(["dp", "cp"])`). Every group is split off the world
//! once, when the mesh is built.

use crate::error::{Error, Result};
pub use crate::layout::Axis;
use crate::layout::{check_world_of, Layout};
use brigade_comm::Comm;

/// The shape of a mesh: a degree per axis, validated before any rank is started.
#[derive(Clone, Copy, PartialEq, Eq)]
pub struct MeshShape {
    degrees: [usize; 5],
}

/// A rank's place in the mesh: a coordinate per axis (`coords[Axis::Dp]`). On the expert axis,
/// its place in its expert-parallel group.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Coords([usize; 5]);

impl std::ops::Index<Axis> for Coords {
    type Output = usize;
    fn index(&self, a: Axis) -> &usize {
        &self.0[a as usize]
    }
}

impl std::fmt::Debug for MeshShape {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        write!(f, "{self}")
    }
}

/// `pp=2 × dp=2 × cp=1 × tp=2 (ep=1)`.
impl std::fmt::Display for MeshShape {
    fn fmt(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        let each: Vec<String> = Axis::RANKS.iter().map(|&a| format!("{}={}", a.name(), self.degree(a))).collect();
        write!(f, "{} (ep={})", each.join(" × "), self.degree(Axis::Ep))
    }
}

impl MeshShape {
    /// The mesh of a layout (its degrees; the layout checked them already).
    pub fn of(l: &Layout) -> MeshShape {
        MeshShape { degrees: Axis::ALL.map(|a| l.degree(a)) }
    }

    /// The mesh with the named degrees, every other axis at 1:
    /// `MeshShape::new(&[(Axis::Dp, 2), (Axis::Tp, 4)])`.
    pub fn new(named: &[(Axis, usize)]) -> Result<MeshShape> {
        let mut degrees = [1; 5];
        for &(a, d) in named {
            degrees[a as usize] = d;
        }
        let s = MeshShape { degrees };
        if degrees.contains(&0) {
            return Err(Error::Layout(format!("mesh {s}: every degree must be at least 1")));
        }
        // (colours and keys of the groups are u32s)
        Axis::RANKS
            .iter()
            .try_fold(1usize, |n, &a| n.checked_mul(s.degree(a)))
            .filter(|&n| n <= u32::MAX as usize)
            .ok_or_else(|| Error::Layout(format!("mesh {s} is too large")))?;
        let (dp_cp, ep) = (s.degree(Axis::Dp) * s.degree(Axis::Cp), s.degree(Axis::Ep));
        if !dp_cp.is_multiple_of(ep) {
            return Err(Error::Layout(format!(
                "mesh {s}: ep={ep} must divide dp · cp = {dp_cp} (the expert groups are carved from the data × context ranks)"
            )));
        }
        Ok(s)
    }

    pub fn degree(&self, a: Axis) -> usize {
        self.degrees[a as usize]
    }

    /// Ranks in the mesh: the product of the rank axes' degrees (not ep's).
    pub fn world(&self) -> usize {
        Axis::RANKS.iter().map(|&a| self.degree(a)).product()
    }

    /// Refuses a world of another size, saying what would fit (as `Layout::check_world`; cp
    /// named only when it splits).
    pub fn check_world(&self, world: usize) -> Result<()> {
        let named =
            [Axis::Dp, Axis::Pp, Axis::Cp, Axis::Tp].into_iter().filter(|&a| a != Axis::Cp || self.degree(a) > 1);
        let degrees: Vec<(Axis, usize)> = named.map(|a| (a, self.degree(a))).collect();
        check_world_of(&degrees, world)
    }

    /// The ranks holding the same experts in each data × context group: dp · cp / ep.
    pub fn expert_data(&self) -> usize {
        self.degree(Axis::Dp) * self.degree(Axis::Cp) / self.degree(Axis::Ep)
    }

    pub fn coords(&self, rank: usize) -> Coords {
        let mut c = [0; 5];
        let mut rest = rank;
        for &a in Axis::RANKS.iter().rev() {
            c[a as usize] = rest % self.degree(a);
            rest /= self.degree(a);
        }
        let flat = c[Axis::Dp as usize] * self.degree(Axis::Cp) + c[Axis::Cp as usize];
        c[Axis::Ep as usize] = flat % self.degree(Axis::Ep);
        Coords(c)
    }

    pub fn rank(&self, c: Coords) -> usize {
        Axis::RANKS.iter().fold(0, |r, &a| r * self.degree(a) + c[a])
    }

    /// Where a rank of coordinates `c` sits on the grid that answers a group over `axes`, outer
    /// to inner: (coordinate, degree, whether the group spans it). Without the expert axis, the
    /// rank axes; with it, the expert grid pp × (dp · cp / ep) × ep × tp.
    fn grid(&self, c: Coords, axes: Grid) -> [(usize, usize, bool); 4] {
        let on = |a: Axis| match axes {
            Grid::Axes(mask) => mask & bit(a) != 0,
            Grid::ExpertData => false,
        };
        let (pp, tp) = ((c[Axis::Pp], self.degree(Axis::Pp)), (c[Axis::Tp], self.degree(Axis::Tp)));
        match axes {
            Grid::Axes(mask) if mask & bit(Axis::Ep) == 0 => Axis::RANKS.map(|a| (c[a], self.degree(a), on(a))),
            _ => {
                let flat = c[Axis::Dp] * self.degree(Axis::Cp) + c[Axis::Cp];
                let ep = self.degree(Axis::Ep);
                [
                    (pp.0, pp.1, on(Axis::Pp)),
                    (flat / ep, self.expert_data(), axes == Grid::ExpertData),
                    (flat % ep, ep, on(Axis::Ep)),
                    (tp.0, tp.1, on(Axis::Tp)),
                ]
            }
        }
    }

    /// The `world.split` arguments of a group: its colour numbers the coordinates the group
    /// does not span, its key (a rank's place in it) the ones it spans, each mixed-radix.
    fn color_key(&self, c: Coords, axes: Grid) -> (u32, u32) {
        let (mut color, mut key) = (0usize, 0usize);
        for (x, n, spans) in self.grid(c, axes) {
            let v = if spans { &mut key } else { &mut color };
            *v = *v * n + x;
        }
        (color as u32, key as u32)
    }
}

fn bit(a: Axis) -> u8 {
    1 << a as u8
}

fn mask(axes: &[Axis]) -> u8 {
    axes.iter().fold(0, |m, &a| m | bit(a))
}

/// A group as the grid sees it: the axes it spans, or the expert-data group (the data ×
/// context ranks holding the same experts: the expert grid's remaining factor).
#[derive(Clone, Copy, PartialEq, Eq)]
enum Grid {
    Axes(u8),
    ExpertData,
}

/// The groups a mesh builds: every non-empty set of the rank axes, and the expert axis alone
/// or with the pipeline and tensor axes (expert parallelism is a factoring of dp × cp, so it
/// does not mix with either of them).
fn built(m: u8) -> bool {
    let ranks = mask(&Axis::RANKS);
    let expert = mask(&[Axis::Ep, Axis::Pp, Axis::Tp]);
    m != 0 && (m & !ranks == 0 || (m & bit(Axis::Ep) != 0 && m & !expert == 0))
}

/// One rank's view of the mesh: its coordinates and a communicator for each group of axes.
pub struct Mesh {
    pub shape: MeshShape,
    pub coords: Coords,
    /// By the mask of the axes spanned (`None` for sets not built).
    groups: Vec<Option<Comm>>,
    expert_data: Comm,
}

impl Mesh {
    /// The single worker: the mesh of degree 1 on every axis, on a one-rank world.
    pub fn solo() -> Result<Mesh> {
        Mesh::new(&brigade_comm::local::solo(), MeshShape::new(&[])?)
    }

    /// Splits `world` into every group of axes; every rank of `world` must call it.
    pub fn new(world: &Comm, shape: MeshShape) -> Result<Mesh> {
        shape.check_world(world.size())?;
        let c = shape.coords(world.rank());
        let comm_err = |e: brigade_comm::CommError| Error::Train(format!("building the mesh: {e}"));
        let split = |axes: Grid| {
            let (color, key) = shape.color_key(c, axes);
            world.split(color, key).map_err(comm_err)
        };
        // the same sets in the same order on every rank
        let mut groups = Vec::with_capacity(32);
        for m in 0..32u8 {
            groups.push(if built(m) { Some(split(Grid::Axes(m))?) } else { None });
        }
        let expert_data = split(Grid::ExpertData)?;
        Ok(Mesh { shape, coords: c, groups, expert_data })
    }

    /// The group of ranks that differ from this one only on `axes` (in any order), ordered by
    /// their coordinates on them, outer to inner: `group(&[Axis::Tp])`, the data × context
    /// group `group(&[Axis::Dp, Axis::Cp])`. Any non-empty set of pp, dp, cp and tp; ep alone or
    /// with pp and tp.
    ///
    /// # Panics
    /// On a set the mesh does not build (empty, or ep with dp or cp: a programming error, not
    /// a user's).
    pub fn group(&self, axes: &[Axis]) -> &Comm {
        match self.groups.get(mask(axes) as usize) {
            Some(Some(g)) => g,
            _ => {
                panic!("the mesh builds no group over {axes:?}: ask for pp, dp, cp, tp, or ep alone or with pp and tp")
            }
        }
    }

    /// The expert-data group: the data × context ranks of this one's stage and tensor slice
    /// that hold the same experts (dp · cp / ep of them), ordered by their expert-grid place.
    pub fn expert_data(&self) -> &Comm {
        &self.expert_data
    }

    /// This rank's place in the world.
    pub fn rank(&self) -> usize {
        self.shape.rank(self.coords)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Axis::{Cp, Dp, Ep, Pp, Tp};

    fn shape(dp: usize, pp: usize, cp: usize, tp: usize, ep: usize) -> MeshShape {
        MeshShape::new(&[(Dp, dp), (Pp, pp), (Cp, cp), (Tp, tp), (Ep, ep)]).unwrap()
    }

    #[test]
    fn coordinates_are_tp_innermost_then_cp_then_dp_then_pp() {
        let s = shape(2, 2, 1, 2, 1);
        // written out by hand: rank → (dp, pp, tp), today's numbering with cp = 1
        let want = [(0, 0, 0), (0, 0, 1), (1, 0, 0), (1, 0, 1), (0, 1, 0), (0, 1, 1), (1, 1, 0), (1, 1, 1)];
        for (r, &(dp, pp, tp)) in want.iter().enumerate() {
            let c = s.coords(r);
            assert_eq!((c[Dp], c[Pp], c[Cp], c[Tp], c[Ep]), (dp, pp, 0, tp, 0), "rank {r}");
            assert_eq!(s.rank(c), r);
        }
        let c = shape(3, 1, 1, 4, 1).coords(7);
        assert_eq!((c[Dp], c[Pp], c[Tp]), (1, 0, 3));
        // cp between dp and tp: rank = ((pp·dp + d)·cp + c)·tp + t
        let s = shape(2, 2, 3, 2, 2);
        let (pp, dp, cp, tp) = (1, 1, 2, 1);
        let c = s.coords(((pp * 2 + dp) * 3 + cp) * 2 + tp);
        assert_eq!((c[Pp], c[Dp], c[Cp], c[Tp]), (pp, dp, cp, tp));
        assert_eq!(c[Ep], (dp * 3 + cp) % 2, "the expert coordinate: the dp × cp index mod ep");
        for r in 0..s.world() {
            assert_eq!(s.rank(s.coords(r)), r);
        }
    }

    #[test]
    fn bad_shapes_are_refused_with_what_would_fit() {
        assert!(MeshShape::new(&[(Dp, 0)]).is_err());
        assert!(MeshShape::new(&[(Dp, usize::MAX), (Pp, 2), (Tp, 2)]).is_err());
        let e = shape(2, 1, 1, 2, 1).check_world(8).unwrap_err().to_string();
        assert!(e.contains("needs 4 ranks but 8 were started"), "{e}");
        assert!(e.contains("dp·pp·tp = 8"), "cp named only when it splits: {e}");
        let e = shape(2, 1, 2, 1, 1).check_world(2).unwrap_err().to_string();
        assert!(e.contains("dp=2 × pp=1 × cp=2 × tp=1 needs 4 ranks"), "{e}");
        let e = MeshShape::new(&[(Dp, 2), (Cp, 3), (Ep, 4)]).unwrap_err().to_string();
        assert!(e.contains("ep=4 must divide dp · cp = 6"), "{e}");
        assert_eq!(MeshShape::of(&Layout::parse("dp=2,tp=4").unwrap()), MeshShape::new(&[(Tp, 4), (Dp, 2)]).unwrap());
    }

    /// Every rank's coordinates by nested loops, pp outermost and tp innermost: rank → [pp,
    /// dp, cp, tp] (independent of `coords`).
    fn enumerate(s: MeshShape) -> Vec<[usize; 4]> {
        let d = |a| s.degree(a);
        let mut out = Vec::new();
        for pp in 0..d(Pp) {
            for dp in 0..d(Dp) {
                for cp in 0..d(Cp) {
                    for tp in 0..d(Tp) {
                        out.push([pp, dp, cp, tp]);
                    }
                }
            }
        }
        out
    }

    /// Every non-empty set of the rank axes, and ep alone or with pp and tp.
    fn groups_asked() -> Vec<Vec<Axis>> {
        let mut sets = Vec::new();
        for m in 1..16u8 {
            sets.push(Axis::RANKS.into_iter().enumerate().filter(|(i, _)| m & (1 << i) != 0).map(|(_, a)| a).collect());
        }
        for extra in [vec![], vec![Pp], vec![Tp], vec![Tp, Pp]] {
            sets.push([vec![Ep], extra].concat());
        }
        sets
    }

    #[test]
    fn each_group_holds_the_ranks_that_differ_only_on_its_axes() {
        let shapes = [
            (1, 1, 1, 1, 1),
            (2, 1, 1, 1, 1),
            (1, 1, 1, 2, 1),
            (2, 1, 1, 2, 1),
            (2, 2, 1, 2, 1),
            (1, 2, 1, 4, 1),
            (4, 2, 1, 1, 1),
            // context and expert parallelism
            (1, 1, 2, 1, 1),
            (2, 1, 2, 1, 2),
            (2, 2, 2, 2, 4),
            (3, 1, 2, 2, 3),
            (2, 1, 3, 1, 6),
            (4, 1, 1, 2, 2),
            (1, 2, 4, 1, 2),
        ];
        for (dp, pp, cp, tp, ep) in shapes {
            let s = shape(dp, pp, cp, tp, ep);
            let table = enumerate(s);
            let asked = groups_asked();
            let got = brigade_comm::local::run(s.world(), |world| {
                let m = Mesh::new(&world, s)?;
                // every rank contributes its world rank; a group's all-gather lists its members
                let members = |c: &Comm| -> Vec<usize> {
                    let mut all = vec![0f32; c.size()];
                    c.all_gather(&[world.rank() as f32], &mut all).unwrap();
                    all.iter().map(|&x| x as usize).collect()
                };
                let mut out: Vec<(Vec<usize>, usize)> =
                    asked.iter().map(|a| (members(m.group(a)), m.group(a).rank())).collect();
                out.push((members(m.expert_data()), m.expert_data().rank()));
                Ok::<_, Error>((m.coords, m.rank(), out))
            })
            .unwrap();
            for (r, (c, rank, groups)) in got.into_iter().enumerate() {
                let me = table[r];
                assert_eq!([c[Pp], c[Dp], c[Cp], c[Tp]], me, "rank {r} of {s}");
                assert_eq!(rank, r);
                // i: the place among the data × context ranks, row-major
                let flat = |x: [usize; 4]| x[1] * cp + x[2];
                assert_eq!(c[Ep], flat(me) % ep, "rank {r} of {s}: its expert coordinate");
                let (groups, expert_data) = groups.split_at(groups.len() - 1);
                for (axes, (members, place)) in asked.iter().zip(groups) {
                    let want: Vec<usize> = if axes.contains(&Ep) {
                        // the same stage and slice unless asked, the same expert-data block
                        (0..table.len())
                            .filter(|&q| {
                                let x = table[q];
                                flat(x) / ep == flat(me) / ep
                                    && (axes.contains(&Pp) || x[0] == me[0])
                                    && (axes.contains(&Tp) || x[3] == me[3])
                            })
                            .collect()
                    } else {
                        (0..table.len())
                            .filter(|&q| {
                                Axis::RANKS.iter().enumerate().all(|(i, a)| axes.contains(a) || table[q][i] == me[i])
                            })
                            .collect()
                    };
                    assert_eq!(members, &want, "{axes:?} group of rank {r} in {s}");
                    assert_eq!(want[*place], r, "{axes:?}: a rank's place is its order in the group");
                    let size: usize = axes.iter().map(|&a| s.degree(a)).product();
                    assert_eq!(members.len(), size, "{axes:?} group of rank {r} in {s}");
                }
                let of = |axes: &[Axis]| &groups[asked.iter().position(|a| a == axes).unwrap()].0;
                let (ep_group, dp_cp) = (of(&[Ep]), of(&[Dp, Cp]));
                // the expert group: ep consecutive data × context places of this stage and slice
                let places: Vec<usize> = ep_group.iter().map(|&q| flat(table[q])).collect();
                assert_eq!(
                    places,
                    (flat(me) / ep * ep..flat(me) / ep * ep + ep).collect::<Vec<_>>(),
                    "rank {r} of {s}"
                );
                // the expert-data group: the rest of the data × context group, one per expert block
                let (members, place) = &expert_data[0];
                let want: Vec<usize> =
                    dp_cp.iter().copied().filter(|&q| flat(table[q]) % ep == flat(me) % ep).collect();
                assert_eq!(members, &want, "expert-data group of rank {r} in {s}");
                assert_eq!(members.len(), s.expert_data());
                assert_eq!(want[*place], r);
                assert_eq!(
                    ep_group.iter().filter(|q| members.contains(q)).collect::<Vec<_>>(),
                    [&r],
                    "they cross at the rank"
                );
                if tp > 1 {
                    let t = of(&[Tp]);
                    assert_eq!(t.windows(2).map(|w| w[1] - w[0]).max(), Some(1), "tp ranks are adjacent");
                }
            }
        }
    }

    #[test]
    #[should_panic(expected = "builds no group")]
    fn a_group_the_mesh_does_not_build_is_a_programming_error() {
        let m = Mesh::solo().unwrap();
        let _ = m.group(&[Dp, Ep]);
    }
}
