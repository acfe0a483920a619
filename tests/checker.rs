//! The history checker itself: it must flag what it is there to flag.

use harness::chaos::*;

fn ev(ns: i64, kind: &str, token: i64, worker: &str, pid: i32) -> Ev {
    Ev {
        ns,
        kind: kind.into(),
        token,
        worker: worker.into(),
        pid,
    }
}

fn history(events: Vec<Ev>, deaths: &[(i32, i64)], accepted: Vec<(i64, i64)>) -> History {
    History {
        events,
        deaths: deaths.iter().copied().collect(),
        accepted,
        rejected: vec![],
        marks: vec![],
        liveness_bound_ns: 5_000_000_000,
    }
}

#[test]
fn checker_accepts_a_clean_history() {
    let h = history(
        vec![ev(10, "start", 5, "a", 1), ev(30, "start", 9, "b", 2)],
        &[(1, 20), (2, 40)],
        vec![(5, 11), (9, 31)],
    );
    assert!(check(&h).violations.is_empty());
}

#[test]
fn checker_flags_overlap_decrease_and_stale_spawn() {
    let h = history(
        vec![ev(10, "start", 9, "a", 1), ev(15, "start", 5, "b", 2)],
        &[(1, 20), (2, 40)],
        vec![(9, 11), (5, 16)],
    );
    let v = check(&h).violations;
    assert!(
        v.iter().any(|s| s.starts_with("stale write accepted")),
        "{v:?}"
    );
    assert!(
        v.iter()
            .any(|s| s.starts_with("spawn token did not increase")),
        "{v:?}"
    );
    assert!(v.iter().any(|s| s.starts_with("overlap")), "{v:?}");
}

#[test]
fn frozen_overlap_is_allowed_only_without_late_accepted_writes() {
    let mut h = history(
        vec![ev(10, "start", 5, "a", 1), ev(30, "start", 9, "b", 2)],
        &[(1, 50), (2, 60)],
        vec![(5, 11), (9, 31)],
    );
    h.marks.push(Mark {
        name: "freeze".into(),
        begin_ns: 20,
        heal_ns: Some(45),
        deposed_worker: Some("a".into()),
        expect_liveness: false,
    });
    let r = check(&h);
    assert!(r.violations.is_empty(), "{:?}", r.violations);
    assert_eq!(r.fenced_overlaps, 1);
    h.accepted.push((5, 46));
    assert!(!check(&h).violations.is_empty());
}
