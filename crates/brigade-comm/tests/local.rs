//! The conformance suite on rank threads for group sizes 1–8, and the failure cases: each
//! must produce an error on every rank, never a hang.

use brigade_comm::local::{run, run_with, LocalConfig};
use brigade_comm::{conformance, CommError, ReduceOp};
use std::time::{Duration, Instant};

#[test]
fn conformance_suite_on_1_to_8_ranks() {
    conformance::EXACT_RANK_ORDER.store(true, std::sync::atomic::Ordering::Relaxed);
    for n in 1..=8 {
        run(n, |c| conformance::run_all(&c)).unwrap_or_else(|e| panic!("{n} ranks: {e}"));
    }
}

#[test]
fn small_threshold_zero_forces_the_direct_algorithm_everywhere() {
    conformance::EXACT_RANK_ORDER.store(true, std::sync::atomic::Ordering::Relaxed);
    let cfg = LocalConfig { one_shot_max_bytes: 0, ..LocalConfig::default() };
    run_with(cfg, 3, |c| conformance::all_reduce(&c)).unwrap();
    let cfg = LocalConfig { one_shot_max_bytes: usize::MAX, ..LocalConfig::default() };
    run_with(cfg, 3, |c| conformance::all_reduce(&c)).unwrap();
}

#[test]
fn tracing_records_operation_bytes_and_algorithm() {
    let traces = run(2, |c| {
        c.enable_tracing(true);
        let mut small = vec![1.0f32; 4];
        let mut large = vec![1.0f32; 100_000];
        c.all_reduce(&mut small, ReduceOp::Sum)?;
        c.all_reduce(&mut large, ReduceOp::Sum)?;
        c.barrier()?;
        Ok::<_, CommError>(c.take_trace())
    })
    .unwrap();
    for t in traces {
        let summary: Vec<(&str, usize, &str)> = t.iter().map(|e| (e.op, e.bytes, e.algorithm)).collect();
        assert_eq!(
            summary,
            vec![("all_reduce", 16, "one_shot"), ("all_reduce", 400_000, "direct"), ("barrier", 0, "barrier")]
        );
        assert!(t.iter().all(|e| e.end >= e.start));
    }
}

fn short() -> LocalConfig {
    LocalConfig { timeout: Duration::from_millis(300), ..LocalConfig::default() }
}

/// For the ranks that all arrive but disagree: a timeout no loaded machine's scheduling reaches,
/// so the error is the disagreement, never a late thread's timeout.
fn patient() -> LocalConfig {
    LocalConfig { timeout: Duration::from_secs(30), ..LocalConfig::default() }
}

#[test]
fn mismatched_lengths_fail_on_every_rank() {
    let errs = run_with(patient(), 3, |c| {
        let mut buf = vec![0f32; if c.rank() == 1 { 11 } else { 10 }];
        Ok::<_, String>(c.all_reduce(&mut buf, ReduceOp::Sum).unwrap_err())
    })
    .unwrap();
    for e in errs {
        let msg = e.to_string();
        assert!(matches!(e, CommError::Mismatch { .. }), "{msg}");
        assert!(
            msg.contains(
                "ranks [0, 2] called all_reduce(sum) of 10 elements but rank 1 called all_reduce(sum) of 11 elements"
            ),
            "{msg}"
        );
    }
}

#[test]
fn mismatched_operations_fail_on_every_rank() {
    let errs = run_with(patient(), 2, |c| {
        let mut buf = vec![0f32; 100_000];
        let e = if c.rank() == 0 { c.all_reduce(&mut buf, ReduceOp::Sum) } else { c.broadcast(&mut buf, 0) };
        Ok::<_, String>(e.unwrap_err().to_string())
    })
    .unwrap();
    for msg in errs {
        assert!(
            msg.contains("rank 0 called all_reduce(sum)") && msg.contains("rank 1 called broadcast(root 0)"),
            "{msg}"
        );
    }
}

/// The same collective with another reduction (one rank sums, another takes the maximum)
/// fails on every rank, on the one-shot and the direct path and in a reduce-scatter, rather
/// than each rank reducing its own way and the replicas parting silently.
#[test]
fn mismatched_reductions_fail_on_every_rank() {
    for n in [16, 100_000] {
        let errs = run_with(patient(), 3, |c| {
            let op = if c.rank() == 2 { ReduceOp::Max } else { ReduceOp::Sum };
            let mut buf = vec![1f32; n];
            Ok::<_, String>(c.all_reduce(&mut buf, op).unwrap_err().to_string())
        })
        .unwrap();
        for msg in errs {
            assert!(
                msg.contains(&format!("ranks [0, 1] called all_reduce(sum) of {n} elements"))
                    && msg.contains(&format!("rank 2 called all_reduce(max) of {n} elements")),
                "{n}: {msg}"
            );
        }
    }
    let errs = run_with(patient(), 2, |c| {
        let op = if c.rank() == 0 { ReduceOp::Avg } else { ReduceOp::Sum };
        let mut out = vec![0f32; 8];
        Ok::<_, String>(c.reduce_scatter(&[1f32; 16], &mut out, op).unwrap_err().to_string())
    })
    .unwrap();
    for msg in errs {
        assert!(
            msg.contains("rank 0 called reduce_scatter(avg) of 16 elements")
                && msg.contains("rank 1 called reduce_scatter(sum) of 16 elements"),
            "{msg}"
        );
    }
}

#[test]
fn a_rank_that_never_arrives_is_named_after_the_timeout() {
    let out = run_with(short(), 3, |c| {
        if c.rank() == 2 {
            std::thread::sleep(Duration::from_millis(900)); // alive but late: not a failure
            return Ok::<_, String>(None);
        }
        let mut buf = vec![0f32; 8];
        let t0 = Instant::now();
        let e = c.all_reduce(&mut buf, ReduceOp::Sum).unwrap_err();
        Ok(Some((e, t0.elapsed())))
    })
    .unwrap();
    for (e, waited) in out.into_iter().flatten() {
        match &e {
            CommError::Timeout { op, missing, .. } => {
                assert_eq!(*op, "all_reduce");
                assert_eq!(missing, &vec![2]);
            }
            other => panic!("expected a timeout, got {other}"),
        }
        assert!(e.to_string().contains("ranks [2] of the group never arrived"), "{e}");
        assert!(waited >= Duration::from_millis(300));
    }
}

#[test]
fn a_failed_rank_fails_its_peers_promptly() {
    let cfg = LocalConfig { timeout: Duration::from_secs(60), ..LocalConfig::default() };
    let t0 = Instant::now();
    let err = run_with(cfg, 4, |c| {
        if c.rank() == 3 {
            std::thread::sleep(Duration::from_millis(50));
            return Err("out of memory (simulated)".to_string());
        }
        let mut buf = vec![1f32; 100_000];
        c.all_reduce(&mut buf, ReduceOp::Sum).map_err(|e| e.to_string())?;
        Ok(())
    })
    .unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(10), "peers waited {:?}", t0.elapsed());
    assert_eq!(err.failures[0], (3, "out of memory (simulated)".to_string()));
    assert_eq!(err.failures.len(), 4);
    for (r, m) in &err.failures[1..] {
        assert!(m.contains("all_reduce aborted: rank 3 failed"), "rank {r}: {m}");
    }
}

#[test]
fn a_panicking_rank_fails_pending_receives_and_later_calls() {
    let cfg = LocalConfig { timeout: Duration::from_secs(60), ..LocalConfig::default() };
    let t0 = Instant::now();
    let err = run_with(cfg, 2, |c| {
        if c.rank() == 0 {
            panic!("boom");
        }
        let mut buf = vec![0f32; 4];
        let first = c.recv(&mut buf, 0, 0).unwrap_err();
        let later = c.barrier().unwrap_err();
        Err::<(), _>(format!("{first} / {later}"))
    })
    .unwrap_err();
    assert!(t0.elapsed() < Duration::from_secs(10));
    assert_eq!(err.failures[0].0, 0);
    assert!(err.failures[0].1.contains("boom"));
    assert!(err.failures[1].1.contains("recv aborted: rank 0 failed"), "{}", err.failures[1].1);
    assert!(err.failures[1].1.contains("barrier aborted"), "{}", err.failures[1].1);
}

#[test]
fn bad_arguments_are_refused() {
    run(2, |c| {
        let e = c.reduce_scatter(&[0.0; 10], &mut [0.0; 4], ReduceOp::Sum).unwrap_err();
        assert!(e.to_string().contains("gets 5 of 10 elements"), "{e}");
        let e = c.send(&[1.0], 5, 0).unwrap_err();
        assert!(e.to_string().contains("peer 5"), "{e}");
        let e = c.broadcast(&mut [0.0], 2).unwrap_err();
        assert!(e.to_string().contains("root 2"), "{e}");
        Ok::<_, String>(())
    })
    .unwrap();
}

/// An all-to-all whose sizes disagree (rank 1 expects 4 elements from rank 0, which sends 5)
/// fails on every rank with the same message naming both; a rank that never comes is named
/// after the timeout; counts that do not add up to the buffers are refused at once.
#[test]
fn all_to_all_v_with_disagreeing_sizes_or_a_missing_rank_fails_on_every_rank() {
    let errs = run_with(patient(), 3, |c| {
        let (r, n) = (c.rank(), c.size());
        let send = vec![5usize; n];
        let mut recv = vec![5usize; n];
        if r == 1 {
            recv[0] = 4;
        }
        let input = vec![1f32; 5 * n];
        let mut out = vec![0f32; recv.iter().sum()];
        Ok::<_, String>(c.all_to_all_v(&input, &send, &mut out, &recv).unwrap_err())
    })
    .unwrap();
    for e in errs {
        assert!(matches!(e, CommError::Mismatch { .. }), "{e}");
        assert!(e.to_string().contains("rank 0 sends 5 elements to rank 1, which expects 4 from it"), "{e}");
    }
    let out = run_with(short(), 3, |c| {
        if c.rank() == 1 {
            std::thread::sleep(Duration::from_millis(900));
            return Ok::<_, String>(None);
        }
        let mut out = vec![0f32; 3];
        Ok(Some(c.all_to_all_v(&[1.0; 3], &[1; 3], &mut out, &[1; 3]).unwrap_err()))
    })
    .unwrap();
    for e in out.into_iter().flatten() {
        assert!(e.to_string().contains("ranks [1] of the group never arrived"), "{e}");
    }
    run(2, |c| {
        let mut out = vec![0f32; 2];
        let e = c.all_to_all_v(&[1.0; 3], &[1, 1], &mut out, &[1, 1]).unwrap_err().to_string();
        assert!(e.contains("counts sum to 2 sent and 2 received, but the input holds 3"), "{e}");
        let e = c.all_to_all_v(&[1.0; 2], &[1, 1, 0], &mut out, &[1, 1]).unwrap_err().to_string();
        assert!(e.contains("3 send and 2 receive counts for a group of 2"), "{e}");
        Ok::<_, String>(())
    })
    .unwrap();
}
