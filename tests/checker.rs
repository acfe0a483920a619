//! The history checker itself: it must flag what it is there to flag.

use harness::chaos::*;

fn ev(ns: i64, kind: &str, token: i64, worker: &str, pid: i32) -> Ev {
    slot_ev(ns, kind, token, worker, pid, 0)
}

fn slot_ev(ns: i64, kind: &str, token: i64, worker: &str, pid: i32, slot: u32) -> Ev {
    Ev {
        ns,
        kind: kind.into(),
        token,
        worker: worker.into(),
        pid,
        slot,
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
        slots: 1,
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

#[test]
fn with_slots_n_jobs_may_run_at_once_but_never_more() {
    // Two slots: a (slot 0) and b (slot 1) overlap, and c starts in a's slot once a is gone.
    // Tokens go down across slots, never within one.
    let events = vec![
        slot_ev(10, "start", 9, "a", 1, 0),
        slot_ev(12, "start", 5, "b", 2, 1),
        slot_ev(30, "start", 11, "c", 3, 0),
    ];
    let mut h = history(
        events,
        &[(1, 20), (2, 60), (3, 70)],
        vec![(9, 11), (5, 13), (11, 31), (5, 40)],
    );
    h.slots = 2;
    let r = check(&h);
    assert!(r.violations.is_empty(), "{:?}", r.violations);

    // A third job while both slots run is flagged; so is a token reused or a stale write
    // within a slot.
    h.events.push(slot_ev(40, "start", 12, "d", 4, 1));
    h.deaths.insert(4, 50);
    h.accepted.push((9, 45));
    let v = check(&h).violations;
    assert!(
        v.iter()
            .any(|s| s.starts_with("overlap: 3 jobs at once with 2 slots")),
        "{v:?}"
    );
    assert!(
        v.iter()
            .any(|s| s == "stale write accepted: token 9 after 11"),
        "{v:?}"
    );
    h.events.push(slot_ev(80, "start", 11, "c", 5, 0));
    let v = check(&h).violations;
    assert!(v.iter().any(|s| s.contains("spawned twice")), "{v:?}");

    // The same history with one slot is an overlap at once.
    h.slots = 1;
    let v = check(&h).violations;
    assert!(
        v.iter().any(|s| s.starts_with("overlap: token 9 (a)")),
        "{v:?}"
    );
}

#[test]
fn a_beat_of_an_old_token_after_a_newer_start_is_flagged_unless_its_worker_was_frozen() {
    let mut events = vec![ev(10, "start", 5, "a", 1), ev(30, "start", 9, "b", 2)];
    events.push(ev(32, "write", 9, "b", 2));
    events.push(ev(31, "write", 5, "a", 1));
    let mut h = history(events, &[(1, 29), (2, 60)], vec![(5, 11), (9, 32)]);
    let r = check(&h);
    assert_eq!(r.late_beats, 1);
    assert!(
        r.violations
            .iter()
            .any(|v| v.starts_with("beat after a newer token: token 5 (a)")),
        "{:?}",
        r.violations
    );
    h.marks.push(Mark {
        name: "freeze".into(),
        begin_ns: 20,
        heal_ns: Some(31),
        deposed_worker: Some("a".into()),
        expect_liveness: false,
    });
    let r = check(&h);
    assert_eq!((r.late_beats, r.late_beats_deposed), (1, 1));
    assert!(r.violations.is_empty(), "{:?}", r.violations);
}

#[test]
fn a_long_gap_is_attributed_to_a_cause_that_explains_its_end_or_to_none() {
    use harness::liveness::{gaps, Cause};
    let term = |s: i64, e: i64| Term {
        token: s,
        slot: 0,
        worker: "w".into(),
        start_ns: s,
        end_ns: e,
    };
    let terms = [term(0, 10), term(30, 40), term(80, 90)];
    let cut = Cause {
        name: "cut".into(),
        begin_ns: 5,
        explains_until_ns: 35,
    };
    let (g, longest) = gaps(&terms, std::slice::from_ref(&cut), 5, 90);
    assert_eq!(longest, 40e-9);
    assert_eq!(g.len(), 2);
    assert!(g[0].attributed && g[0].causes == ["cut"]);
    assert!(!g[1].attributed && g[1].causes.is_empty());
    // A leader change during the second gap explains it; one that only overlaps its start
    // does not explain its end.
    let change = |until| Cause {
        name: "etcd leader change".into(),
        begin_ns: 38,
        explains_until_ns: until,
    };
    let (g, _) = gaps(&terms, &[cut.clone(), change(85)], 5, 90);
    assert!(g[1].attributed && g[1].causes == ["etcd leader change"]);
    let (g, _) = gaps(&terms, &[cut, change(60)], 5, 90);
    assert!(!g[1].attributed && g[1].causes == ["etcd leader change"]);
}
