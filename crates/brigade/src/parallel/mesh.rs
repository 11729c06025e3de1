//! The device mesh: a world of `dp · pp · tp` ranks, each with coordinates and the three groups
//! it belongs to. Tensor-parallel ranks are adjacent (tp innermost, as Megatron-LM orders them,
//! so that a tensor-parallel group stays inside a node), then data-parallel, then pipeline
//! stages outermost: rank = (pp_rank · dp + dp_rank) · tp + tp_rank.

use crate::error::{Error, Result};
use crate::layout::Layout;
use brigade_comm::Comm;

/// The shape of a mesh, validated before any rank is started.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MeshShape {
    pub dp: usize,
    pub pp: usize,
    pub tp: usize,
}

/// A rank's place in the mesh.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Coords {
    pub dp: usize,
    pub pp: usize,
    pub tp: usize,
}

impl MeshShape {
    /// The mesh of a layout (its three degrees; the layout checked them already).
    pub fn of(l: &Layout) -> MeshShape {
        MeshShape { dp: l.dp, pp: l.pp, tp: l.tp }
    }

    pub fn new(dp: usize, pp: usize, tp: usize) -> Result<MeshShape> {
        if dp == 0 || pp == 0 || tp == 0 {
            return Err(Error::Layout(format!("mesh dp={dp}, pp={pp}, tp={tp}: every degree must be at least 1")));
        }
        dp.checked_mul(pp)
            .and_then(|x| x.checked_mul(tp))
            .ok_or_else(|| Error::Layout(format!("mesh dp={dp}, pp={pp}, tp={tp} is too large")))?;
        Ok(MeshShape { dp, pp, tp })
    }

    pub fn world(&self) -> usize {
        self.dp * self.pp * self.tp
    }

    /// Refuses a world of another size, saying what would fit (as `Layout::check_world`).
    pub fn check_world(&self, world: usize) -> Result<()> {
        Layout { dp: self.dp, pp: self.pp, tp: self.tp, ..Layout::default() }.check_world(world)
    }

    pub fn coords(&self, rank: usize) -> Coords {
        Coords { tp: rank % self.tp, dp: (rank / self.tp) % self.dp, pp: rank / (self.tp * self.dp) }
    }

    pub fn rank(&self, c: Coords) -> usize {
        (c.pp * self.dp + c.dp) * self.tp + c.tp
    }
}

/// One rank's view of the mesh: its coordinates and a communicator for each axis.
pub struct Mesh {
    pub shape: MeshShape,
    pub coords: Coords,
    /// Ranks with the same pipeline stage and tensor slice: they hold the same parameters.
    pub dp: Comm,
    /// Ranks with the same data shard and tensor slice: one per stage.
    pub pp: Comm,
    /// Ranks with the same data shard and stage: they split each layer's matrices.
    pub tp: Comm,
}

impl Mesh {
    /// The single worker: the 1×1×1 mesh on a one-rank world.
    pub fn solo() -> Result<Mesh> {
        Mesh::new(&brigade_comm::local::solo(), MeshShape { dp: 1, pp: 1, tp: 1 })
    }

    /// Splits `world` into the three groups; every rank of `world` must call it.
    pub fn new(world: &Comm, shape: MeshShape) -> Result<Mesh> {
        shape.check_world(world.size())?;
        let c = shape.coords(world.rank());
        let comm_err = |e: brigade_comm::CommError| Error::Train(format!("building the mesh: {e}"));
        // Each group is the set of ranks that agree on the other two coordinates; within it,
        // ranks are ordered by their own coordinate on the axis.
        let (dp, tp) = (shape.dp as u32, shape.tp as u32);
        let (cd, cp, ct) = (c.dp as u32, c.pp as u32, c.tp as u32);
        let dp_comm = world.split(cp * tp + ct, cd).map_err(comm_err)?;
        let pp_comm = world.split(cd * tp + ct, cp).map_err(comm_err)?;
        let tp_comm = world.split(cp * dp + cd, ct).map_err(comm_err)?;
        Ok(Mesh { shape, coords: c, dp: dp_comm, pp: pp_comm, tp: tp_comm })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn coordinates_are_tp_innermost_then_dp_then_pp() {
        let s = MeshShape::new(2, 2, 2).unwrap();
        // written out by hand: rank → (dp, pp, tp)
        let want = [(0, 0, 0), (0, 0, 1), (1, 0, 0), (1, 0, 1), (0, 1, 0), (0, 1, 1), (1, 1, 0), (1, 1, 1)];
        for (r, &(dp, pp, tp)) in want.iter().enumerate() {
            assert_eq!(s.coords(r), Coords { dp, pp, tp }, "rank {r}");
            assert_eq!(s.rank(s.coords(r)), r);
        }
        let s = MeshShape::new(3, 1, 4).unwrap();
        assert_eq!(s.coords(7), Coords { dp: 1, pp: 0, tp: 3 });
    }

    #[test]
    fn bad_shapes_are_refused_with_what_would_fit() {
        assert!(MeshShape::new(0, 1, 1).is_err());
        assert!(MeshShape::new(usize::MAX, 2, 2).is_err());
        let e = MeshShape::new(2, 1, 2).unwrap().check_world(8).unwrap_err().to_string();
        assert!(e.contains("needs 4 ranks but 8 were started"), "{e}");
    }

    #[test]
    fn each_group_holds_the_ranks_that_agree_on_the_other_axes() {
        for (dp, pp, tp) in [(1, 1, 1), (2, 1, 1), (1, 1, 2), (2, 1, 2), (2, 2, 2), (1, 2, 4), (4, 2, 1)] {
            let shape = MeshShape::new(dp, pp, tp).unwrap();
            let groups = brigade_comm::local::run(shape.world(), |world| {
                let m = Mesh::new(&world, shape)?;
                // every rank contributes its world rank; a group's all-gather lists its members
                let members = |c: &Comm| -> std::result::Result<Vec<usize>, brigade_comm::CommError> {
                    let mut all = vec![0f32; c.size()];
                    c.all_gather(&[world.rank() as f32], &mut all)?;
                    Ok(all.iter().map(|&x| x as usize).collect())
                };
                let (d, p, t) = (members(&m.dp).unwrap(), members(&m.pp).unwrap(), members(&m.tp).unwrap());
                Ok::<_, Error>((m.coords, m.dp.rank(), m.pp.rank(), m.tp.rank(), d, p, t))
            })
            .unwrap();
            for (r, (c, dr, pr, tr, d, p, t)) in groups.into_iter().enumerate() {
                assert_eq!(c, shape.coords(r));
                assert_eq!((dr, pr, tr), (c.dp, c.pp, c.tp), "a rank's place in each group is its coordinate");
                let along = |f: &dyn Fn(usize) -> Coords, n: usize| -> Vec<usize> {
                    (0..n).map(|i| shape.rank(f(i))).collect()
                };
                assert_eq!(d, along(&|i| Coords { dp: i, ..c }, dp), "dp group of rank {r} in {shape:?}");
                assert_eq!(p, along(&|i| Coords { pp: i, ..c }, pp), "pp group of rank {r}");
                assert_eq!(t, along(&|i| Coords { tp: i, ..c }, tp), "tp group of rank {r}");
                if tp > 1 {
                    assert_eq!(t.windows(2).map(|w| w[1] - w[0]).max(), Some(1), "tp ranks are adjacent");
                }
            }
        }
    }
}
