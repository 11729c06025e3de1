//! Planted failures for the recovery tests: `BRIGADE_FAULT=POINT:STEP:RANK:ACTION` makes rank
//! RANK fail at POINT of step STEP — `forward` (a micro-batch's forward, after the first has
//! run), `backward` (the same, backward), `reduce` (the data-parallel gradient reduction, the
//! other ranks inside it), `writing` (a checkpoint half written: its weights file done),
//! `renamed` (right after a checkpoint's rename) — by `kill` (SIGKILL to the whole process),
//! `panic` (the rank's thread panics) or `hang` (the rank stops, forever). With
//! `BRIGADE_FAULT_ONCE=FILE` it fires only while FILE does not exist, creating it first, so a
//! restarted job runs clean. Read once per process; unset, every check is one load of a
//! cached `None`.

use std::sync::OnceLock;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Point {
    Forward,
    Backward,
    Reduce,
    Writing,
    Renamed,
}

#[derive(Debug)]
struct Fault {
    point: Point,
    step: usize,
    rank: usize,
    action: Action,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Action {
    Kill,
    Panic,
    Hang,
}

fn planted() -> Option<&'static Fault> {
    static FAULT: OnceLock<Option<Fault>> = OnceLock::new();
    FAULT.get_or_init(|| std::env::var("BRIGADE_FAULT").ok().map(|s| parse(&s))).as_ref()
}

fn parse(s: &str) -> Fault {
    let bad = || {
        panic!("BRIGADE_FAULT={s}: give POINT:STEP:RANK:ACTION (ACTION kill, panic or hang), e.g. backward:3:1:kill")
    };
    let f: Vec<&str> = s.split(':').collect();
    let [point, step, rank, action] = f[..] else { bad() };
    let point = match point {
        "forward" => Point::Forward,
        "backward" => Point::Backward,
        "reduce" => Point::Reduce,
        "writing" => Point::Writing,
        "renamed" => Point::Renamed,
        _ => bad(),
    };
    let action = match action {
        "kill" => Action::Kill,
        "panic" => Action::Panic,
        "hang" => Action::Hang,
        _ => bad(),
    };
    Fault { point, step: step.parse().unwrap_or_else(|_| bad()), rank: rank.parse().unwrap_or_else(|_| bad()), action }
}

/// Fails here if the planted fault names this point, step (1-based, the step being taken or
/// saved) and rank (of the world).
pub fn at(point: Point, step: usize, rank: usize) {
    let Some(f) = planted() else { return };
    if (f.point, f.step, f.rank) != (point, step, rank) {
        return;
    }
    if let Some(mark) = std::env::var_os("BRIGADE_FAULT_ONCE") {
        if std::path::Path::new(&mark).exists() {
            return;
        }
        let _ = std::fs::write(&mark, b"fired\n");
    }
    eprintln!("brigade: planted fault: {point:?} of step {step} on rank {rank}");
    if f.action == Action::Hang {
        loop {
            std::thread::sleep(std::time::Duration::from_secs(3600));
        }
    }
    if f.action == Action::Kill {
        // SAFETY: signals this very process, as an operator's kill -9 would
        unsafe {
            libc::kill(libc::getpid(), libc::SIGKILL);
        }
    }
    panic!("planted fault: {point:?} of step {step} on rank {rank}");
}
